# Shared helpers of the control-plane system tests (sourced by test_grpod_*.sh).
# Usage: source grpod_lib.sh GRPOD GRPOCTL SIM_WORKER
GRPOD="$1"
GRPOCTL="$2"
SIM="$3"
TMP="$(mktemp -d /tmp/grpod-test.XXXXXX)"
EP="ipc://$TMP/ctl.sock"
export GRPOD_ENDPOINT="$EP"
PIDS=()
fails=0

cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    if [ "$fails" -ne 0 ]; then
        for f in "$TMP"/*.log; do [ -f "$f" ] && { echo "---- $f (tail)"; tail -n 30 "$f"; }; done
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

expect() { # expect NAME STATUS
    if [ "$2" -eq 0 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
has() { grep -qF -- "$2" "$1"; }

# start_grpod NAME [key=value ...]: grpod with its state in $TMP/NAME.state, log in $TMP/NAME.log
start_grpod() {
    local name="$1"; shift
    "$GRPOD" grpod.endpoint="$EP" grpod.state_dir="$TMP/$name.state" grpod.http_listen=127.0.0.1:0 \
        grpod.heartbeat_interval_s=0.2 grpod.heartbeat_timeout_s=3 "$@" >>"$TMP/$name.log" 2>&1 &
    GRPOD_PID=$!
    PIDS+=("$GRPOD_PID")
    wait_for 10 "$GRPOCTL" status >/dev/null
}

# start_sim NAME RANK WORLD [args]: a simulated worker, log in $TMP/NAME.log; its pid in SIM_PID
start_sim() {
    local name="$1" rank="$2" world="$3"; shift 3
    "$SIM" grpod.endpoint="$EP" grpod.connect_timeout_s=20 --rank "$rank" --world "$world" \
        --state "$TMP/$name.state" "$@" >>"$TMP/$name.log" 2>&1 &
    SIM_PID=$!
    PIDS+=("$SIM_PID")
}

# wait_for SECONDS CMD...: run CMD until it succeeds (0) or time runs out (1)
wait_for() {
    local until=$(( $(date +%s%N) / 1000000 + $1 * 1000 )); shift
    while :; do
        "$@" 2>/dev/null && return 0
        [ $(( $(date +%s%N) / 1000000 )) -ge "$until" ] && return 1
        sleep 0.1
    done
}

# status_field EXPR: a jq expression over `grpoctl status --json`
status_field() { "$GRPOCTL" status --json 2>/dev/null | jq -r "$1"; }
# state_is STATE: the run is in STATE
state_is() { [ "$(status_field .state)" = "$1" ]; }
