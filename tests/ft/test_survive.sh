#!/usr/bin/env bash
# Trainer-loss survival (trainer.survive_trainer_loss; docs/operations.md, "Open MPI 5 with fault tolerance (ULFM)")
# on 3 colocated plain-DP ranks of this build (against Open MPI 5) under scripts/mpirun_ft:
#  - undisturbed with the key on: the weights after 5 steps equal one process's within 1e-5;
#  - rank 2 SIGKILLed at step 3, its generation done (its peers waiting for it: GRPO_TEST_KILL_AT=gen:3:2, a hold
#    the test waits on, not a sleep), and rank 1 SIGKILLed in step 2's gradient all-reduce (its buckets started,
#    its peers waiting on them: allreduce:2:1): the run finishes (mpirun exits 0), rank 0 says "rank R lost at step
#    K; 2 DP ranks go on, step K redone" and how long after the loss the redone step completed, the weights equal
#    one process's within 1e-5 relative (every DP layout reproduces it, so the survivors' DP 2 from step K on does
#    too), and the audit files hold every group of every step exactly rollout.n times (the redone step's file is the
#    one written);
#  - the lead rank (0) lost: not covered yet, the run ends with an error saying so;
#  - refused by name: with TP 2, and under Open MPI 5's mpirun without --with-ft ulfm.
# Skipped (77) without Open MPI 5 (scripts/ompi5_env.sh --no-install).
set -u
. "$(dirname "$0")/../lib.sh" grpo-ft-survive
if ! prefix="$("$SRC_ROOT/scripts/ompi5_env.sh" --no-install 2>"$TMP/env.err")"; then
    cat "$TMP/env.err"
    echo "SKIP: no Open MPI 5 with ULFM here (scripts/ompi5_env.sh installs it)"
    exit 77
fi
test_env
export GRPO_FT_BUILD="$BUILD_ROOT"
tiny_model "$TMP/tiny"
expect "tiny model initialised" $?

STEPS=5
# 6 prompts x 4 responses a step (a multiple of 3 and of 2 DP ranks), 2 optimizer steps a step; eps 1e-6 as the
# equivalence tests (tests/mpi/equiv_lib.sh says why)
keys() { # NAME: the keys of a run whose results go to $TMP/NAME
    echo actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e \
        trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1 \
        data.train_batch_size=6 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=3 \
        data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.eps=1e-6 \
        data.synthetic.num_train=64 data.synthetic.num_val=4 custom_reward_function.path="$SCORER" \
        custom_reward_function.name=byte_score actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
        actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 trainer.default_local_dir="$TMP/$1" \
        trainer.rollout_data_dir="$TMP/$1/audit"
}
MPIRUN=("$SRC_ROOT/scripts/mpirun_ft" --oversubscribe --bind-to none)
SURVIVE=(trainer.nnodes=1 trainer.n_gpus_per_node=3 trainer.survive_trainer_loss=true)
final() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }

# shellcheck disable=SC2046 # keys' words are the keys
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 1 grpo-worker $(keys one) >"$TMP/one.log" 2>&1
expect "one process: $STEPS steps" $?

# shellcheck disable=SC2046
timeout "$(scaled 180)" "${MPIRUN[@]}" -np 3 grpo-worker $(keys whole) "${SURVIVE[@]}" >"$TMP/whole.log" 2>&1
expect "3 colocated ranks with the key on, undisturbed: $STEPS steps" $?
says "$TMP/whole.log" "trainer-loss survival on (trainer.survive_trainer_loss)"
expect "rank 0 says survival is on" $?
out=$("$COMPARE" "$(final one)" "$(final whole)" 1e-5 2>&1)
expect "undisturbed: weights equal one process's within 1e-5 ($out)" $?

# killed POINT STEP RANK: a run of 3 ranks whose rank RANK holds at POINT of step STEP and is SIGKILLed there
killed() {
    local name="$1-$2-$3" hold="$TMP/hold-$1"
    touch "$hold"
    # shellcheck disable=SC2046
    GRPO_TEST_KILL_AT="$1:$2:$3" GRPO_TEST_HOLD_FILE="$hold" timeout "$(scaled 180)" "${MPIRUN[@]}" \
        -x GRPO_TEST_KILL_AT -x GRPO_TEST_HOLD_FILE -np 3 grpo-worker $(keys "$name") "${SURVIVE[@]}" \
        >"$TMP/$name.log" 2>&1 &
    local job=$!
    track "$job"
    held_or_ended() { [ -s "$hold.held" ] || ! kill -0 "$job" 2>/dev/null; }
    wait_for 120 held_or_ended
    [ -s "$hold.held" ]
    expect "$name: rank $3 holds at $1 of step $2" $?
    local victim t0
    victim="$(cat "$hold.held")"
    t0="$(date -u +%s.%N)"
    kill -9 "$victim"
    expect "$name: rank $3 (pid $victim) SIGKILLed" $?
    wait "$job"
    expect "$name: the run finishes without rank $3 (mpirun exits 0)" $?
    says "$TMP/$name.log" "rank $3 lost at step $2; 2 DP ranks go on, step $2 redone"
    expect "$name: the log names the lost rank, the shrink and the redone step" $?
    grep -Eq "\[rank [0-9]\] survive: step $2: .*(a peer is lost|revoked by a survivor)" "$TMP/$name.log"
    expect "$name: the survivors found the loss in a collective of step $2" $?
    local line took
    line="$(grep -aF "survive: step $2 (redone) completed" "$TMP/$name.log")"
    # the kill to the redone step's end, from the line's UTC time stamp
    took="$(python3 -c 'import sys, datetime
t = datetime.datetime.strptime(sys.argv[1][:23], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
print(f"{t.timestamp() - float(sys.argv[2]):.2f}")' "$line" "$t0" 2>/dev/null)"
    [ -n "$line" ]
    expect "$name: step $2 redone and completed ${took:-?} s after the kill (${line#*completed })" $?
    out=$("$COMPARE" "$(final one)" "$(final "$name")" 1e-5 2>&1)
    expect "$name: weights equal one process's within 1e-5 ($out)" $?
    out=$(python3 "$SRC_ROOT/tests/mpi/check_audit.py" "$TMP/$name/audit" 4 6 $STEPS 2>&1)
    expect "$name: audit: every group of every step trained exactly once ($out)" $?
    rm -f "$hold"
}
killed gen 3 2
killed allreduce 2 1

# the lead lost: not covered yet, named
touch "$TMP/hold-lead"
# shellcheck disable=SC2046
GRPO_TEST_KILL_AT=gen:2:0 GRPO_TEST_HOLD_FILE="$TMP/hold-lead" timeout "$(scaled 180)" "${MPIRUN[@]}" \
    -x GRPO_TEST_KILL_AT -x GRPO_TEST_HOLD_FILE -np 3 grpo-worker $(keys lead) "${SURVIVE[@]}" >"$TMP/lead.log" 2>&1 &
job=$!
track "$job"
lead_held() { [ -s "$TMP/hold-lead.held" ] || ! kill -0 "$job" 2>/dev/null; }
wait_for 120 lead_held
kill -9 "$(cat "$TMP/hold-lead.held" 2>/dev/null)" 2>/dev/null
expect "lead: rank 0 SIGKILLed at step 2" $?
wait "$job"
[ $? -ne 0 ]
expect "lead: the run ends with an error" $?
says "$TMP/lead.log" "rank 0 lost at step 2: rank 0 is the lead"
expect "lead: the survivors say the lead's loss is not covered yet" $?
rm -f "$TMP/hold-lead"

# refused by name
# shellcheck disable=SC2046
timeout "$(scaled 120)" "${MPIRUN[@]}" -np 2 grpo-worker $(keys tp) trainer.nnodes=1 trainer.n_gpus_per_node=2 \
    trainer.survive_trainer_loss=true actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    >"$TMP/tp.log" 2>&1
[ $? -ne 0 ] && says "$TMP/tp.log" \
    "trainer.survive_trainer_loss with actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 is not covered yet"
expect "TP 2 with the key: refused, naming the key and TP" $?
# shellcheck disable=SC2046
OPAL_PREFIX="$prefix" timeout "$(scaled 120)" "$prefix/bin/mpirun" --oversubscribe -np 2 "$WORKER" $(keys noft) \
    trainer.nnodes=1 trainer.n_gpus_per_node=2 trainer.survive_trainer_loss=true >"$TMP/noft.log" 2>&1
[ $? -ne 0 ] && says "$TMP/noft.log" "trainer.survive_trainer_loss: this launch did not turn MPI's fault tolerance on"
expect "without mpirun --with-ft ulfm: refused, naming the key and the launch" $?
finish
