# shellcheck shell=bash
# The trainer-loss survival tests' layer (tests/ft/test_survive*.sh), sourced after tests/lib.sh. It gives:
#   survive_start       skip (77) without Open MPI 5 with ULFM (OMPI5_PREFIX its prefix); the test environment, on
#                       this build's programs; the tiny model in $TMP/tiny (a check)
#   keys NAME           the keys of a tiny run of $STEPS steps (6 prompts x 4 responses, 2 optimizer steps a step,
#                       a checkpoint every $SAVE_FREQ steps) whose results go to $TMP/NAME
#   survive_keys NP     NP colocated plain-DP ranks with trainer.survive_trainer_loss on; with SPARES=N the last N
#                       of them are spares (trainer.survive_spare_ranks), DP is NP - N; TRAINERS=T: T trainer
#                       ranks (a split run's, placement.trainer_ranks=T)
#   MPIRUN              scripts/mpirun_ft with the launch's options
#   final NAME [STEP]   the run's checkpoint of STEP (default $STEPS), actor/
#   start_held NAME NP SPEC [KEYS...]  NP ranks in the background with GRPO_TEST_KILL_AT=SPEC (worker/survive/
#                       survive.h), a hold file $TMP/hold-NAME; JOB its mpirun, log $TMP/NAME.log
#   kill_held NAME WHAT the next held rank SIGKILLed (its FILE.held removed first, so the next victim writes its
#                       own): a check; KILL_T0 the kill's time
#   kill_twice NAME FIRST SECOND  two held ranks killed in turn (kill_held), T_FIRST the first kill's time, then
#                       the job waited for (its status)
#   survived NAME STEP RANK LEFT [T0]  the checks that rank RANK's loss was found in step STEP and survived there
#                       by LEFT DP ranks (the log's words), and how long after the kill (at T0, default KILL_T0) the
#                       redone step completed
#   same_as NAME REF WHAT  the final weights equal those of the run REF (WHAT, as the check names it) within 1e-5,
#                       and the audit files hold every group of every step exactly rollout.n times
#   same_as_one NAME    same_as the one-process run ($TMP/one)
#   metrics_once NAME   the run's metrics.jsonl holds each step 1..$STEPS exactly once, in order (a redone step's
#                       line once), each line a training step's (it has actor/pg_loss)
STEPS=${STEPS:-5}
SAVE_FREQ=${SAVE_FREQ:--1}
# 6 prompts x 4 responses a step (a multiple of 2, 3 and 4 DP ranks' sequences), 2 optimizer steps a step; eps
# 1e-6 as the equivalence tests (tests/mpi/equiv_lib.sh says why)
keys() {
    echo actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e \
        trainer.total_training_steps="$STEPS" trainer.val_before_train=false trainer.test_freq=-1 \
        trainer.save_freq="$SAVE_FREQ" data.train_batch_size=6 actor_rollout_ref.rollout.n=4 \
        actor_rollout_ref.actor.ppo_mini_batch_size=3 data.max_response_length=12 \
        actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.eps=1e-6 data.synthetic.shots=0 data.synthetic.num_train=64 \
        data.synthetic.num_val=4 custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score \
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 actor_rollout_ref.actor.use_kl_loss=true \
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 trainer.default_local_dir="$TMP/$1" \
        trainer.rollout_data_dir="$TMP/$1/audit"
}
survive_start() {
    if ! OMPI5_PREFIX="$("$SRC_ROOT/scripts/ompi5_env.sh" --no-install 2>"$TMP/env.err")"; then
        cat "$TMP/env.err"
        echo "SKIP: no Open MPI 5 with ULFM here (scripts/ompi5_env.sh installs it)"
        exit 77
    fi
    test_env
    export GRPO_FT_BUILD="$BUILD_ROOT"
    tiny_model "$TMP/tiny"
    expect "tiny model initialised" $?
}
survive_keys() {
    echo trainer.nnodes=1 trainer.n_gpus_per_node="${TRAINERS:-$(($1 - ${SPARES:-0}))}" trainer.survive_trainer_loss=true \
        trainer.survive_spare_ranks="${SPARES:-0}"
}
MPIRUN=("$SRC_ROOT/scripts/mpirun_ft" --oversubscribe --bind-to none)
final() { echo "$TMP/$1/p/e/checkpoints/global_step_${2:-$STEPS}/actor"; }

start_held() {
    local name="$1" np="$2" spec="$3"
    shift 3
    HOLD="$TMP/hold-$name"
    touch "$HOLD"
    # shellcheck disable=SC2046 # keys' words are the keys
    GRPO_TEST_KILL_AT="$spec" GRPO_TEST_HOLD_FILE="$HOLD" timeout "$(scaled 240)" "${MPIRUN[@]}" \
        -x GRPO_TEST_KILL_AT -x GRPO_TEST_HOLD_FILE -np "$np" grpo-worker $(keys "$name") $(survive_keys "$np") \
        "$@" >"$TMP/$name.log" 2>&1 &
    JOB=$!
    track "$JOB"
}

# kill_twice NAME FIRST SECOND: the two held victims of NAME's run (start_held with two holds) SIGKILLed in turn
# (kill_held), the first kill's time in T_FIRST; then the job waited for: its status
kill_twice() {
    kill_held "$1" "$2"
    T_FIRST="$KILL_T0"
    kill_held "$1" "$3"
    wait "$JOB"
}
held_or_ended() { [ -s "$HOLD.held" ] || ! kill -0 "$JOB" 2>/dev/null; }
kill_held() {
    wait_for 150 held_or_ended
    local victim
    victim="$(cat "$HOLD.held" 2>/dev/null)"
    [ -n "$victim" ]
    expect "$1: $2 holds" $?
    rm -f "$HOLD.held"
    KILL_T0="$(date -u +%s.%N)"
    [ -n "$victim" ] && kill -9 "$victim"
    expect "$1: $2 (pid ${victim:-none}) SIGKILLed" $?
}

survived() {
    local name="$1" step="$2" rank="$3" left="$4" line took
    says "$TMP/$name.log" "rank $rank lost at step $step; $left DP ranks go on, step $step redone"
    expect "$name: the log names lost rank $rank, the shrink to $left and the redone step $step" $?
    grep -Eq "\[rank [0-9]\] survive: step $step: .*(a peer is lost|revoked by a survivor)" "$TMP/$name.log"
    expect "$name: the survivors found the loss in a collective of step $step" $?
    # the redone step ends after the loss is found (the caller may come here as soon as it is): waited for
    redone() { grep -aqF "survive: step $step (redone) completed" "$TMP/$name.log"; }
    wait_for 120 redone
    line="$(grep -aF "survive: step $step (redone) completed" "$TMP/$name.log" | tail -n 1)"
    # the kill to the redone step's end, from the line's UTC time stamp
    took="$(python3 -c 'import sys, datetime
t = datetime.datetime.strptime(sys.argv[1][:23], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
print(f"{t.timestamp() - float(sys.argv[2]):.2f}")' "$line" "${5:-$KILL_T0}" 2>/dev/null)"
    [ -n "$line" ]
    expect "$name: step $step redone and completed ${took:-?} s after the kill (${line#*completed })" $?
}

same_as() {
    local out
    out=$("$COMPARE" "$(final "$2")" "$(final "$1")" 1e-5 2>&1)
    expect "$1: weights equal $3's within 1e-5 ($out)" $?
    out=$(python3 "$SRC_ROOT/tests/mpi/check_audit.py" "$TMP/$1/audit" 4 6 "$STEPS" 2>&1)
    expect "$1: audit: every group of every step trained exactly once ($out)" $?
}
same_as_one() { same_as "$1" one "one process"; }

metrics_once() {
    local out
    out=$(python3 -c 'import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
got = [r["step"] for r in steps]
want = list(range(1, int(sys.argv[2]) + 1))
if got != want:
    sys.exit(f"steps {got}, want {want}")
if any("actor/pg_loss" not in r for r in steps):
    sys.exit("a line without actor/pg_loss")
print(f"steps {got[0]}..{got[-1]} once each")' "$TMP/$1/p/e/metrics.jsonl" "$STEPS" 2>&1)
    expect "$1: metrics.jsonl holds each step once ($out)" $?
}

# checkpoints_as_one NAME: the run's step 2 and 4 checkpoints equal one process's within 1e-5
checkpoints_as_one() {
    local out k
    for k in 2 4; do
        out=$("$COMPARE" "$(final one $k)" "$(final "$1" $k)" 1e-5 2>&1)
        expect "$1: the checkpoint of step $k equals one process's within 1e-5 ($out)" $?
    done
}

# grpod_saw_survival NAME RANK WHY OTHERS: under grpod (lib.sh's grpod helpers, KILL_T0 the kill's time) the lost
# launch rank RANK shows state lost and its reason WHY, the run stays running past grpod's heartbeat timeout with a
# reason naming the loss, the other ranks' states joined by commas are OTHERS, and grpod's events say the loss was
# survived, none telling the ranks to end
grpod_saw_survival() {
    local name="$1" r="$2" why="$3" others="$4"
    lost_told() { field_is ".workers[] | select(.rank == $r) | .error" "$why"; }
    wait_for 20 lost_told
    st=$?; expect "$name: grpod shows rank $r's reason: $(status_field ".workers[] | select(.rank == $r) | .error")" "$st"
    field_is ".workers[] | select(.rank == $r) | .state" lost
    st=$?; expect "$name: rank $r is lost ($(status_field ".workers[] | select(.rank == $r) | .state"))" "$st"
    # the lost rank's heartbeats stopped at the kill: by now grpod.heartbeat_timeout_s (3 s) has passed without it
    # calling the run's end (the lead, held, heartbeats on)
    past_timeout() { python3 -c 'import sys, time; sys.exit(time.time() < float(sys.argv[1]) + 4)' "$KILL_T0"; }
    wait_for 30 past_timeout
    state_is running
    st=$?; expect "$name: the run is running 4 s after the kill ($(status_field .state): $(status_field .reason))" "$st"
    status_field .reason | grep -qF "rank $r on host" && status_field .reason | grep -qF "$why"
    expect "$name: the run's reason names the loss of rank $r" $?
    [ "$(status_field "[.workers[] | select(.rank != $r) | .state] | join(\",\")")" = "$others" ]
    st=$?; expect "$name: the other ranks $others ($(status_field '[.workers[] | .state] | join(",")'))" "$st"
    status_field '.events[].text' >"$TMP/events.txt"
    grep -qF "lost: $why" "$TMP/events.txt" && ! grep -q "told to end" "$TMP/events.txt"
    expect "$name: grpod's events say the loss was survived, none tells the ranks to end" $?
}
