#!/usr/bin/env bash
# grpoctl stop --wait with a lost worker (SIGSTOPped past grpod.heartbeat_timeout_s): grpod ends the stop once
# no worker is left running, the lost one included, so a plain "the run is finished" is no proof that every
# worker checkpointed. grpoctl must exit 1 naming the lost rank; the live one still checkpoints and exits 0.
# With every worker alive the same stop --wait exits 0.
# Usage: test_stop_lost.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
worker_state() { status_field ".workers[$1].state"; }
worker_is() { [ "$(worker_state "$1")" = "$2" ]; }

# ---- rank 1 frozen: lost; stop --wait must not say all is well
start_grpod g1
start_sim w0 0 2 --steps 100000 --step-ms 40 --host hostA
W0=$SIM_PID
start_sim w1 1 2 --steps 100000 --step-ms 40 --host hostB
W1=$SIM_PID
wait_for 15 state_is running; expect "two workers run" $?
kill -STOP "$W1"
wait_for 10 worker_is 1 lost; expect "the frozen worker is marked lost (heartbeat timeout 3 s)" $?
"$GRPOCTL" stop --wait="$(scaled 5)" >"$TMP/stop1.out" 2>"$TMP/stop1.err"
rc=$?
[ "$rc" -eq 1 ]; expect "stop --wait exits 1 when a worker is lost (exit $rc)" $?
has "$TMP/stop1.err" "rank 1 on host hostB is lost"; expect "the message names the lost rank and its host" $?
has "$TMP/stop1.err" "wrote no checkpoint"; expect "the message says it wrote no checkpoint" $?
wait "$W0"; expect "the live worker stops and exits 0" $?
has "$TMP/w0.log" "checkpoint at step"; expect "the live worker wrote its checkpoint" $?
kill -CONT "$W1"; kill -9 "$W1" 2>/dev/null; wait "$W1" 2>/dev/null
stop_grpod

# ---- everyone alive: stop --wait succeeds
start_grpod g2
start_sim v0 0 2 --steps 100000 --step-ms 40 --host hostA
V0=$SIM_PID
start_sim v1 1 2 --steps 100000 --step-ms 40 --host hostB
V1=$SIM_PID
wait_for 15 state_is running; expect "two workers run again" $?
"$GRPOCTL" stop --wait="$(scaled 20)" >"$TMP/stop2.out" 2>"$TMP/stop2.err"
expect "stop --wait exits 0 when every worker checkpoints" $?
wait "$V0"; expect "rank 0 exits 0" $?
wait "$V1"; expect "rank 1 exits 0" $?

finish "$TMP"/stop*.out "$TMP"/stop*.err "$TMP"/*.log
