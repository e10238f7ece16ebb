#!/usr/bin/env bash
# SIGTERM and SIGINT (Slurm's time limit and preemption, systemctl stop, ^C) stop a one-process run cleanly: a
# checkpoint at the next safe point, exit 0, and a resume carries on from it. Under grpod the worker also asks
# grpod to stop the run, which ends "finished" with the signal in its event log; a paused run stops the same way.
# The same signal twice within a second (coreutils timeout, a signal to the process group) is one request; a
# third, or a second one two seconds later, ends the process at once. A checkpoint whose state.json was edited
# (global_step 1e12) is refused at resume with an error naming the file and its directory.
# Usage: test_sigterm.sh (from the source root; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
WORKER="$(prog grpo-worker)" MODEL_TOOL="$(prog grpo-model)" SCORER="$(prog test-scorer)"
export OPENBLAS_NUM_THREADS=1

tiny_model "$TMP/tiny"
expect "tiny model initialised" $?

# start NAME [overrides...]: a long run in the background (pid in WPID), log in $TMP/NAME.log
start() {
    local name="$1"; shift
    local keys
    tiny_run keys "$TMP/$name" 100000
    "$WORKER" "${keys[@]}" "$@" >>"$TMP/$name.log" 2>&1 &
    WPID=$!
    track "$WPID"
}
# run_steps NAME N: run NAME logged N steps
run_steps() { steps_logged "$TMP/$1/p/e/metrics.jsonl" "$2"; }
# ended PID: the process has ended within 30 s (else it is killed, so that a failing test fails fast)
ended() { wait_for 30 sh -c "! kill -0 $1" || { kill -9 "$1" 2>/dev/null; return 1; }; }
ckpt_step() { cat "$TMP/$1/p/e/checkpoints/latest_checkpointed_iteration.txt" 2>/dev/null; }

# ---- one process, no grpod: SIGTERM
start term
wait_for 60 run_steps term 2; expect "the run trains" $?
kill -TERM "$WPID"
ended "$WPID"; expect "SIGTERM ends the run within seconds" $?
wait "$WPID"; rc=$?
[ "$rc" -eq 0 ]; expect "exit status 0 after SIGTERM (got $rc)" $?
s="$(ckpt_step term)"
[ -n "$s" ] && [ "$s" -ge 2 ]; expect "a checkpoint at the step it stopped at (step $s)" $?
has "$TMP/term.log" "SIGTERM received"; expect "the log says the signal came" $?
has "$TMP/term.log" "SIGTERM: stopping at step $s, after a checkpoint"; expect "the log says where it stops" $?
has "$TMP/term.log" "run stopped at step $s"; expect "the run reports stopped, not finished" $?
# the resume carries on from the checkpoint
tiny_run keys "$TMP/term" $((s + 2))
"$WORKER" "${keys[@]}" >"$TMP/term2.log" 2>&1
expect "the relaunch finishes" $?
has "$TMP/term2.log" "at step $s"; expect "the relaunch resumes from step $s" $?
# a doctored state.json: refused at resume, naming the file and the directory, exit status 1 (no crash)
e=$((s + 2))
sed -i "s/\"global_step\": $e,/\"global_step\": 1000000000000,/" "$TMP/term/p/e/checkpoints/global_step_$e/state.json"
tiny_run keys "$TMP/term" $((s + 4))
"$WORKER" "${keys[@]}" >"$TMP/term3.log" 2>&1
rc=$?
[ "$rc" -ge 1 ] && [ "$rc" -lt 128 ]; expect "a doctored state.json: exit status $rc (an error, not a crash)" $?
has "$TMP/term3.log" "global_step_$e/state.json says global_step 1000000000000, but the directory it sits in is global_step_$e"
expect "the error names the file, its value and the directory" $?

# ---- coreutils timeout (not --foreground): SIGTERM to the worker and to its process group, two at once; the
# same delivery when timeout's time runs out (SIGALRM) and when timeout itself is signalled, as here, so that
# the signal comes after a step whatever the machine's load. (The kernel may merge the two into one pending
# signal; when it does not, the second must not end the run: the stalled runs below make that certain.)
tiny_run keys "$TMP/tmo" 100000
timeout --preserve-status -s TERM "$(scaled 600)" "$WORKER" "${keys[@]}" >>"$TMP/tmo.log" 2>&1 &
TPID=$! # timeout's own
track "$TPID"
wait_for 60 run_steps tmo 1; expect "the run under timeout trains" $?
kill -TERM "$TPID"
ended "$TPID"; expect "timeout's two SIGTERMs end the run within seconds" $?
wait "$TPID"; rc=$?
[ "$rc" -eq 0 ]; expect "under timeout: exit status 0 (got $rc)" $?
[ -n "$(ckpt_step tmo)" ]; chk=$?; expect "under timeout: a checkpoint at the step it stopped at ($(ckpt_step tmo))" $chk
! has "$TMP/tmo.log" "ending now"; expect "under timeout: nothing ends without a checkpoint" $?

# ---- a step that cannot end (a scorer that stalls while $TMP/stall exists): a second SIGTERM 2 s after the
# first ends the process at once; two at once and a third ends it too
touch "$TMP/stall"
export GRPO_TEST_STALL_FILE="$TMP/stall"
stalled() {
    rm -f "$TMP/stall.stalled"
    start "$1" custom_reward_function.path="$SCORER" custom_reward_function.name=stall_score
    wait_for 60 test -e "$TMP/stall.stalled"
}
stalled late; expect "the stalling run's scorer stalls" $?
kill -TERM "$WPID"
sleep 2 # sleep-ok: a second signal 2 s after the first is what is tested
kill -0 "$WPID"; expect "one SIGTERM: the run waits for its step" $?
kill -TERM "$WPID"
wait_for 5 sh -c "! kill -0 $WPID"; expect "a second SIGTERM 2 s later ends the process at once" $?
wait "$WPID"; rc=$?
[ "$rc" -eq 143 ]; expect "exit status 143 (got $rc)" $?
has "$TMP/late.log" "SIGTERM received after SIGTERM: ending now, without a checkpoint"; expect "the log says so" $?
stalled third; expect "the stalling run's scorer stalls again" $?
kill -TERM "$WPID"
sleep 0.3 # sleep-ok: signals within a second of each other are what is tested
kill -TERM "$WPID"
sleep 0.3 # sleep-ok: signals within a second of each other are what is tested
kill -0 "$WPID"; expect "two SIGTERMs within a second: the run waits for its step" $?
kill -TERM "$WPID"
wait_for 5 sh -c "! kill -0 $WPID"; expect "a third SIGTERM ends the process at once" $?
wait "$WPID"; rc=$?
[ "$rc" -eq 143 ]; expect "exit status 143 after the third (got $rc)" $?
rm -f "$TMP/stall"

# ---- SIGINT (^C) likewise
start int
wait_for 60 run_steps int 1; expect "second run trains" $?
kill -INT "$WPID"
ended "$WPID"; expect "SIGINT ends the run within seconds" $?
wait "$WPID"; rc=$?
[ "$rc" -eq 0 ]; expect "exit status 0 after SIGINT (got $rc)" $?
[ -n "$(ckpt_step int)" ]; expect "SIGINT checkpoints too" $?

# ---- under grpod: the run is stopped for every rank, and grpod says so
start_grpod g
start ctl grpod.endpoint="$EP" grpod.connect_timeout_s=20
wait_for 60 step_at_least 2; expect "worker under grpod trains" $?
kill -TERM "$WPID"
ended "$WPID"; wait "$WPID"; rc=$?
[ "$rc" -eq 0 ]; expect "under grpod: exit status 0 after SIGTERM (got $rc)" $?
s="$(ckpt_step ctl)"
[ -n "$s" ]; expect "under grpod: checkpoint written (step $s)" $?
wait_for 10 state_is finished; rc=$?
expect "grpod: the run is finished ($(status_field .reason))" $rc
has "$TMP/g.state/events.log" "stop requested by SIGTERM on rank 0"; expect "grpod's event log names the signal" $?
[ "$(status_field '.workers[0].state')" = stopped ]; expect "grpod: the worker stopped" $?
[ "$(status_field '.workers[0].checkpoint_step')" = "$s" ]; expect "grpod: its checkpoint is step $s" $?
stop_grpod

# ---- under grpod, paused: the signal ends the pause with a checkpoint
start_grpod g2
start paused grpod.endpoint="$EP" grpod.connect_timeout_s=20
wait_for 60 step_at_least 1; expect "third worker trains" $?
"$GRPOCTL" pause --wait="$(scaled 30)" >/dev/null 2>&1; expect "paused" $?
p="$(status_field .step)"
kill -TERM "$WPID"
ended "$WPID"; wait "$WPID"; rc=$?
[ "$rc" -eq 0 ]; expect "paused: exit status 0 after SIGTERM (got $rc)" $?
[ "$(ckpt_step paused)" = "$p" ]; expect "paused: checkpoint at the paused step $p" $?

finish
