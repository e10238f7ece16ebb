#!/usr/bin/env bash
# No false "lost" under load (issue 40 item 9). A worker is suspect after two heartbeat intervals of silence (0.4 s
# here) and lost only after grpod.heartbeat_timeout_s (3 s) of silence in grpod's own running time, every role alike:
#  - a rollout rank stopped (SIGSTOP) past two intervals, and continued (SIGCONT) well before the timeout, is suspect
#    (grpoctl workers, metrics), never lost, and running again; the journal says it was heard again, with the
#    worker's own account of the gap (its heartbeat count and clock);
#  - grpod itself stopped for 4 s, past the timeout: the first tick after it finds every worker silent for 4 s, but
#    that time is grpod's, not theirs: nobody is lost, and the run goes on;
#  - a rollout rank killed (SIGKILL) is still lost, once silent for the timeout (found at a 0.25 s tick).
# Before, a rollout rank was lost after two intervals, and grpod's own pause counted as every worker's silence.
set -u
. "$(dirname "$0")/grpod_lib.sh"
worker_state() { status_field ".workers[] | select(.rank == $1) | .state"; }
worker_is() { [ "$(worker_state "$1")" = "$2" ]; }
EVENTS="$TMP/g1.state/events.log"
PLACE=(placement.trainer_ranks=1 placement.rollout_ranks=1)

start_grpod g1 "${PLACE[@]}"
start_sim w0 0 2 --steps 100000 --step-ms 40 --host hostA "${PLACE[@]}"
W0=$SIM_PID
start_sim w1 1 2 --steps 100000 --step-ms 40 --host hostB "${PLACE[@]}"
W1=$SIM_PID
wait_for 15 state_is running; expect "a trainer and a rollout rank run" $?
[ "$(status_field '.workers[] | select(.rank == 1) | .role')" = rollout ]; expect "rank 1 is the rollout rank" $?

# ---- a rollout rank stalled for less than the timeout: suspect, not lost
# seen suspect in grpoctl workers (the wait's own poll) and in the metrics, then continued at once
suspect_row() { "$GRPOCTL" workers >"$TMP/workers.txt" && grep -Eq '^1 +hostB .* suspect ' "$TMP/workers.txt"; }
kill -STOP "$W1"
t0=$(date +%s%N)
wait_for 10 suspect_row; rc=$?
"$GRPOCTL" metrics >"$TMP/metrics-stalled.txt" 2>&1
kill -CONT "$W1"
stalled_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
expect "the stopped rollout rank is shown suspect by grpoctl workers" $rc
has "$TMP/metrics-stalled.txt" 'grpod_workers{state="suspect"} 1' &&
    has "$TMP/metrics-stalled.txt" 'grpod_workers{state="lost"} 0'
expect "metrics: 1 worker suspect, none lost" $?
[ "$stalled_ms" -lt 3000 ]; expect "it was stopped ${stalled_ms} ms, under the 3 s timeout" $?
wait_for 10 worker_is 1 running; expect "continued, it is running again" $?
wait_for 10 has "$EVENTS" "rank 1 on host hostB heard again after"; expect "the journal says it was heard again" $?
grep "rank 1 on host hostB heard again after" "$EVENTS" | grep -q "(was suspect, not lost): .*by its own clock"
rc=$?; expect "... with the worker's own account of the gap: $(grep -o 'rank 1 on host hostB heard again.*' "$EVENTS" | head -1)" $rc
has "$EVENTS" "rank 1 on host hostB (pid $W1) suspect: no heartbeat for"; expect "the journal says it was suspect" $?
! has "$EVENTS" "(pid $W1) lost"; expect "it was never lost" $?
state_is running && [ "$(status_field .reason)" = "" ]; expect "the run ran on, its reason untouched" $?

# ---- grpod itself stalled past the timeout: nobody lost
before="$(status_field .step)"
losses="$(lines_with "$EVENTS" ") lost: ")"
kill -STOP "$GRPOD_PID"
sleep 4 # sleep-ok: the stall's length is what is tested (past the 3 s heartbeat timeout)
kill -CONT "$GRPOD_PID"
# the first tick after the stall is where the workers would have been taken for lost
wait_for 10 has "$EVENTS" "grpod's own loop did not run for"
rc=$?; expect "grpod notes its own pause: $(grep -o "grpod's own loop did not run for [0-9.]* s" "$EVENTS" | head -1)" $rc
wait_for 10 step_at_least $((before + 3)); expect "training goes on after grpod's pause" $?
wait_for 10 field_is '[.workers[].state] | unique | join(",")' running; expect "both workers are running" $?
[ "$(lines_with "$EVENTS" ") lost: ")" = "$losses" ]
rc=$?; expect "no worker was lost for grpod's own pause$(grep -F ") lost: " "$EVENTS" | tail -n +$((losses + 1)) | sed 's/^/; /')" $rc
"$GRPOCTL" metrics >"$TMP/metrics-after.txt" 2>&1
has "$TMP/metrics-after.txt" "grpod_worker_losses_total 0"; expect "metrics: no loss" $?
awk '$1 == "grpod_loop_stall_seconds_total" { exit !($2 >= 3) }' "$TMP/metrics-after.txt"
rc=$?; expect "metrics: grpod_loop_stall_seconds_total $(awk '$1 == "grpod_loop_stall_seconds_total" { print $2 }' "$TMP/metrics-after.txt")" $rc

# the alerting rules (deploy/examples/grpod-alerts.yaml) use names grpod exports
missing=""
for n in $(grep -o 'grpod_[a-z_]*' "$SRC_ROOT/deploy/examples/grpod-alerts.yaml" | sort -u); do
    grep -q "^$n[{ ]" "$TMP/metrics-after.txt" || missing+=" $n"
done
[ -z "$missing" ]; expect "the alerting rules' metrics are grpod's (missing:${missing:- none})" $?

# ---- a rollout rank killed: lost once silent for the 3 s timeout
kill -9 "$W1"
wait_for 10 worker_is 1 lost; expect "the killed rollout rank is marked lost" $?
said="$(grep -o "rank 1 on host hostB (pid $W1) lost: no heartbeat for .*" "$EVENTS" | head -1)"
# the silence that counted: the wall's, less any pause of grpod's own loop
wall="$(echo "$said" | sed -n 's/.*no heartbeat for \([0-9.]*\) s.*/\1/p')"
own="$(echo "$said" | sed -n 's/.*(\([0-9.]*\) s of it grpod itself did not run).*/\1/p')"
counted="$(awk -v w="$wall" -v o="${own:-0}" 'BEGIN { print w - o }')"
awk -v s="$counted" 'BEGIN { exit !(s + 0 >= 3 && s + 0 <= 4.05) }'
expect "lost after the 3 s timeout, found at a tick at most 1 s later (${said:-nothing said}; counted ${counted:-?} s)" $?
status_field .reason | grep -q "every rollout rank is lost (rank 1 on host hostB): no rollout rank is left"
rc=$?; expect "grpoctl status says no rollout rank is left: $(status_field .reason)" $rc
"$GRPOCTL" metrics | grep -q 'grpod_workers{state="lost"} 1'; expect "metrics count the lost worker" $?
"$GRPOCTL" stop --wait="$(scaled 20)" >/dev/null; expect "stop" $?
wait "$W0"; expect "the trainer ends cleanly" $?
finish
