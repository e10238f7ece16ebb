#!/usr/bin/env bash
# A run that ends while grpod is down (issue 40 item 6): grpod killed with SIGKILL mid-run, the workers finish
# meanwhile, grpod restarted on the same state directory recovers the run as running with the workers
# reconnecting. The workers kept their end message (retried with backoff while grpod was unreachable, up to
# grpod.connect_timeout_s), so the restarted grpod hears it and says the run finished, not that it waits for
# lost workers.
set -u
. "$(dirname "$0")/grpod_lib.sh"

start_grpod g1
start_sim w0 0 2 --steps 40 --step-ms 100 --host hostA
W0=$SIM_PID
start_sim w1 1 2 --steps 40 --step-ms 100 --host hostB
W1=$SIM_PID
wait_for 15 state_is running; expect "two hybrid ranks run" $?
wait_for 15 step_at_least 4; expect "the run reaches step 4" $?
run_id="$(status_field .run_id)"
stop_grpod KILL
# the event: each worker trained its last step and has waited for grpod to hear its end
wait_for 30 has "$TMP/w0.log" "has not acknowledged that this worker ended" &&
    wait_for 30 has "$TMP/w1.log" "has not acknowledged that this worker ended"
expect "both workers finish while grpod is down" $?
[ -f "$TMP/w0.state" ] && [ -f "$TMP/w1.state" ]; expect "both wrote their final state" $?
[ "$(journal_state "$TMP/g1.state")" = 1 ]; expect "the journal still says running (RUN_RUNNING)" $?

start_grpod g1; expect "grpod restarts on the same state directory" $?
[ "$(status_field .run_id)" = "$run_id" ]; expect "same run after restart" $?
wait_for 15 state_is finished; expect "the restarted grpod learns the run finished" $?
reason="$(status_field .reason)"
case "$reason" in "training finished at step 40"*) r=0 ;; *) r=1 ;; esac
expect "the reason says so: $reason" $r
[ "$(status_field '[.workers[].state] | unique | join(",")')" = finished ]; expect "both workers finished" $?
wait "$W0"; expect "worker 0 ends 0" $?
wait "$W1"; expect "worker 1 ends 0" $?
has "$TMP/w0.log" "grpod acknowledged that this worker ended" &&
    has "$TMP/w1.log" "grpod acknowledged that this worker ended"
expect "both workers heard grpod acknowledge their end" $?
! has "$TMP/w0.log" "leaving anyway" && ! has "$TMP/w1.log" "leaving anyway"
expect "no worker left unheard" $?
has "$TMP/g1.state/events.log" "rank 0 on host hostA finished at step 40"; expect "the event log records the end" $?
# the journal says finished too: a second restart does not bring the run back as running
stop_grpod KILL
start_grpod g1
state_is finished; expect "still finished after another restart" $?

# ---- the same with a split run (1 trainer, 2 rollout ranks): no rollout rank is taken for lost
stop_grpod
start_grpod g3 placement.trainer_ranks=1 placement.rollout_ranks=2
start_sim s0 0 3 --steps 40 --step-ms 100 --host hostA
S0=$SIM_PID
start_sim s1 1 3 --steps 40 --step-ms 100 --host hostB --caps rollout
S1=$SIM_PID
start_sim s2 2 3 --steps 40 --step-ms 100 --host hostC --caps rollout
S2=$SIM_PID
wait_for 15 state_is running && wait_for 15 step_at_least 4; expect "a split run runs" $?
stop_grpod KILL
wait_for 30 has "$TMP/s0.log" "has not acknowledged that this worker ended" &&
    wait_for 30 has "$TMP/s1.log" "has not acknowledged that this worker ended" &&
    wait_for 30 has "$TMP/s2.log" "has not acknowledged that this worker ended"
expect "the split run's ranks finish while grpod is down" $?
start_grpod g3 placement.trainer_ranks=1 placement.rollout_ranks=2
wait_for 15 state_is finished; expect "the restarted grpod says the split run finished" $?
"$GRPOCTL" status >"$TMP/status3" 2>&1
has "$TMP/status3" "training finished at step 40" && ! has "$TMP/status3" "replace-rank"
expect "grpoctl status says finished and advises no replacement" $?
wait "$S0" && wait "$S1" && wait "$S2"; expect "the split run's ranks end 0" $?

# ---- grpod never comes back within grpod.connect_timeout_s: the worker does not linger past it
stop_grpod
start_grpod g2
start_sim x0 0 1 --steps 30 --step-ms 100 --host hostC grpod.connect_timeout_s=7
X0=$SIM_PID
wait_for 15 step_at_least 2; expect "a one-rank run runs" $?
stop_grpod KILL
wait_for 60 sh -c "! kill -0 $X0 2>/dev/null"; expect "the worker leaves once grpod.connect_timeout_s has passed" $?
has "$TMP/x0.log" "retrying for up to 7 s" && has "$TMP/x0.log" "leaving anyway"; expect "and says so" $?
finish
