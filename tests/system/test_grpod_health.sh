#!/usr/bin/env bash
# Health and durability: a worker killed with SIGKILL is detected and named;
# grpod killed with SIGKILL and restarted recovers the run, its step, its pause
# and its workers, and training goes on; with grpod.on_worker_lost=fail the run fails.
set -u
. "$(dirname "$0")/grpod_lib.sh"
step() { status_field .step; }

start_grpod g1
start_sim w0 0 2 --steps 100000 --step-ms 40 --host hostA
W0=$SIM_PID
start_sim w1 1 2 --steps 100000 --step-ms 40 --host hostB
W1=$SIM_PID
wait_for 15 state_is running; expect "two hybrid ranks run" $?

# ---- a worker killed with SIGKILL
kill -9 "$W1"
wait_for 10 state_is waiting; expect "run waits when a worker is lost" $?
reason="$(status_field .reason)"
case "$reason" in *"rank 1 on host hostB lost"*) r=0 ;; *) r=1 ;; esac
expect "reason names rank and host: $reason" $r
[ "$(status_field '.workers[1].state')" = lost ]; expect "worker 1 is marked lost" $?
has "$TMP/g1.state/events.log" "rank 1 on host hostB (pid $W1) lost: no heartbeat"; expect "event log records the loss" $?
"$GRPOCTL" metrics | grep -q 'grpod_workers{state="lost"} 1'; expect "metrics count the lost worker" $?
# the rank comes back (a relaunched process) and the run goes on
start_sim w1b 1 2 --steps 100000 --step-ms 40 --host hostB
W1=$SIM_PID
wait_for 15 state_is running; expect "run runs again when the rank re-registers" $?

# ---- grpod killed with SIGKILL and restarted
wait_for 10 step_at_least 3
run_id="$(status_field .run_id)"
before="$(step)"
stop_grpod KILL
# killed at any moment, the state file is the old one or the new one, whole
jq -e '.run.id' "$TMP/g1.state/run.json" >/dev/null; expect "state file whole after kill -9" $?
start_grpod g1
expect "grpod restarts on the same state directory" $?
[ "$(status_field .run_id)" = "$run_id" ]; expect "same run after restart" $?
after="$(step)"
[ "$after" -ge "$before" ]; expect "step survives the restart ($before -> $after)" $?
[ "$(status_field '.workers | length')" = 2 ]; expect "both workers known after restart" $?
wait_for 10 field_is '[.workers[].state] | unique | join(",")' running
expect "workers reconnect" $?
wait_for 10 step_at_least $((after + 5)); expect "training goes on after the restart" $?
has "$TMP/g1.log" "recovered run $run_id"; expect "grpod logs the recovery" $?

# ---- a pause survives a grpod restart
"$GRPOCTL" pause --wait="$(scaled 20)" >/dev/null; expect "pause" $?
stop_grpod KILL
start_grpod g1
wait_for 10 state_is paused; expect "still paused after a grpod restart" $?
p1="$(step)"
"$GRPOCTL" resume --wait="$(scaled 20)" >/dev/null; expect "resume after the restart" $?
wait_for 10 has_lines "$TMP/w0.log" "resumed at step" 1 && wait_for 10 has_lines "$TMP/w1b.log" "resumed at step" 1
expect "both workers say they resumed" $?
paused_in_place "$TMP/w0.log" && paused_in_place "$TMP/w1b.log"; expect "workers stayed paused (no step in between)" $?
wait_for 10 step_at_least $((p1 + 3)); expect "training goes on after resume" $?

# ---- grpod down for a while: workers keep training, reconnect with backoff
n0=$(lines_with "$TMP/w0.log" "no heartbeat answer") n1=$(lines_with "$TMP/w1b.log" "no heartbeat answer")
stop_grpod KILL
wait_for 10 has_lines "$TMP/w0.log" "no heartbeat answer" $((n0 + 1)) &&
    wait_for 10 has_lines "$TMP/w1b.log" "no heartbeat answer" $((n1 + 1))
expect "both workers notice grpod is gone" $?
start_grpod g1
wait_for 10 field_is '[.workers[].state] | unique | join(",")' running
expect "workers reconnect after grpod was gone" $?
"$GRPOCTL" stop --wait="$(scaled 30)" >/dev/null; expect "stop after all that" $?
wait "$W0" "$W1"; expect "workers end cleanly on stop" $?

# ---- on_worker_lost=fail
stop_grpod
start_grpod g2 grpod.on_worker_lost=fail
start_sim f0 0 2 --steps 100000 --step-ms 40 --host hostC
F0=$SIM_PID
start_sim f1 1 2 --steps 100000 --step-ms 40 --host hostD
wait_for 15 state_is running
kill -9 "$SIM_PID"
wait_for 10 state_is failed; expect "run fails when a worker is lost (fail policy)" $?
case "$(status_field .reason)" in "rank 1 on host hostD lost: no heartbeat for"*) r=0 ;; *) r=1 ;; esac
expect "failure reason names rank and host" $r
wait_for 10 sh -c "! kill -0 $F0 2>/dev/null"; expect "the surviving worker is told to stop" $?
[ -f "$TMP/f0.state.ckpt" ]; expect "it checkpointed before ending" $?
finish
