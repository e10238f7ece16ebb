#!/usr/bin/env bash
# A rollout rank stalled (SIGSTOP) while the trainers finish misses their last word: the trainers' dispatcher tells
# every rollout process the end, waits 3 heartbeats + 2 s for those it has not told, and closes. Continued (SIGCONT)
# after that, the rank must end as finished at once, not ask a closed dispatcher for a minute and then fail the
# job whose training finished:
#  - under mpirun alone: the rank had been told every step was granted, and the dispatcher's socket is gone;
#  - under grpod: the run is finished when the trainer is (grpod sees the stopped rank as lost meanwhile: a
#    same-host pid in state T), and the rank, going on, hears so. (A rank only slow, not lost, is covered by
#    daemon_core's test_split_trainers_finished_end_run: the run finishes when every rank that trains has.)
# Both jobs exit 0 with every step trained. The trainer's update runs 1,000 PPO epochs (about 2 s) so that the stop
# lands between the rollout rank's last word and the trainers' end.
# usage: test_end_stall.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/grpod_lib.sh"
WORKER="$(prog grpo-worker)" MODEL_TOOL="$(prog grpo-model)"
test_env
# rank_pid RANK MPIRUN_PID: the pid of a rank (mpirun starts the local ranks as its children)
rank_pid() {
    local p
    for p in $(pgrep -P "$2"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
    done
}
stopped() { [ "$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)" = T ]; }
tiny_model "$TMP/tiny"
expect "tiny model initialised" $?
STEPS=3
tiny_run COMMON "$TMP" $STEPS # (each run names its own trainer.default_local_dir)
COMMON+=(placement.trainer_ranks=1 placement.rollout_ranks=2 actor_rollout_ref.actor.ppo_epochs=1000)

# stall NAME LINGER [keys...]: a 1-trainer, 2-rollout run; rank 1 stopped once it has been told every step is
# granted, continued LINGER s after the trainers' dispatcher has closed (its log line); the job's exit status
stall() {
    local name=$1 linger=$2
    shift 2
    mpirun --oversubscribe --bind-to none -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/$name" "$@" \
        >"$TMP/$name.log" 2>&1 &
    local mp=$!
    track "$mp"
    wait_for 120 grep -q "\[rank 1\] rollout: every step to $STEPS is granted" "$TMP/$name.log"
    expect "$name: rollout rank 1 is told every step is granted" $?
    local r1
    r1="$(rank_pid 1 "$mp")"
    [ -n "$r1" ] && kill -STOP "$r1"
    wait_for 10 stopped "$r1"
    expect "$name: rank 1 ($r1) stopped before the trainers end" $?
    wait_for 60 grep -q "\[rank 0\] worker: run finished at step $STEPS" "$TMP/$name.log"
    expect "$name: the trainer finishes every step while rank 1 is stopped" $?
    wait_for 60 grep -q "\[rank 0\] dispatch: closed: " "$TMP/$name.log"
    expect "$name: the trainers' dispatcher closes while rank 1 is stopped" $?
    # the stall's length is what is tested: past rank 1's request timeout (5 s), so that going on it finds its
    # request unanswered and the dispatcher gone, not an answer already in its socket
    sleep "$((linger + 2))" # sleep-ok: the stall's length
    [ -z "${BEFORE_CONT:-}" ] || "$BEFORE_CONT"
    kill -CONT "$r1"
    local t0=$SECONDS
    wait_for 30 sh -c "! kill -0 $mp"
    expect "$name: the job ends within 30 s of rank 1 going on ($((SECONDS - t0)) s)" $?
    wait "$mp"
}

# ---- mpirun alone: the trainers' dispatcher waits 3 x 1 s + 2 s (the default heartbeat)
stall alone 5
rc=$?
[ "$rc" -eq 0 ]; expect "alone: mpirun exits 0 (got $rc)" $?
says "$TMP/alone.log" "[rank 1] rollout: finished: the trainers' dispatcher closed after every step to $STEPS was granted"
expect "alone: rank 1 ends as finished, saying the dispatcher closed after every step was granted" $?
! grep -q "the trainers are gone\|worker: rank [0-9] failed" "$TMP/alone.log"; expect "alone: no rank failed" $?

# ---- under grpod (heartbeats of 0.2 s: the dispatcher waits 2.6 s)
# while rank 1 is still stopped, grpod already says the run is finished (its trainer is)
finished_while_stopped() {
    state_is finished
    chk=$?; expect "grpod: the run is finished while rank 1 is stopped ($(status_field .state): $(status_field .reason))" $chk
    [ "$(status_field .reason)" = "training finished at step $STEPS" ]; expect "grpod: its reason names the last step" $?
}
start_grpod g placement.trainer_ranks=1 placement.rollout_ranks=2 || fail "grpod starts"
BEFORE_CONT=finished_while_stopped stall grpod 3 grpod.endpoint="$EP" grpod.connect_timeout_s=30
rc=$?
[ "$rc" -eq 0 ]; expect "grpod: mpirun exits 0 (got $rc)" $?
grep -q "\[rank 1\] rollout: finished: the \(run finished while this rank was away\|trainers' dispatcher closed\)" \
    "$TMP/grpod.log"
expect "grpod: rank 1 ends as finished" $?
! grep -q "the trainers are gone\|worker: rank [0-9] failed" "$TMP/grpod.log"; expect "grpod: no rank failed" $?
state_is finished; expect "grpod: the run stays finished" $?
stop_grpod
finish
