# shellcheck shell=bash
# The control-plane tests' layer over tests/lib.sh (sourced by test_grpod_*.sh and the tests that run grpod with
# simulated workers): grpod on ipc in $TMP ($EP, exported as GRPOD_ENDPOINT) and start_sim.
# usage: . grpod_lib.sh   (grpod, grpoctl and the simulated worker: the build's, by name)
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh" grpod-test
GRPOD="$(prog grpod)" GRPOCTL="$(prog grpoctl)" SIM="$(prog sim-worker)"
EP="ipc://$TMP/ctl.sock"
export GRPOD_ENDPOINT="$EP"

# start_sim NAME RANK WORLD [args]: a simulated worker, log in $TMP/NAME.log; its pid in SIM_PID
start_sim() {
    local name="$1" rank="$2" world="$3"; shift 3
    "$SIM" grpod.endpoint="$EP" grpod.connect_timeout_s=20 --rank "$rank" --world "$world" \
        --state "$TMP/$name.state" "$@" >>"$TMP/$name.log" 2>&1 &
    SIM_PID=$!
    track "$SIM_PID"
}

# journal_state DIR: the run's state (a grpo.RunState number) as grpod's journal in DIR holds it: the last record of
# run.log (a registration or heartbeat made durable since run.json was written), else run.json's
journal_state() {
    if [ -s "$1/run.log" ]; then
        tail -n 1 "$1/run.log" | jq -e '.run.state'
    else
        jq -e '.run.state' "$1/run.json"
    fi
}
