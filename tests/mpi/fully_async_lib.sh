# shellcheck shell=bash
# What test_fully_async.sh and test_fully_async_dp.sh run and check alike: TRAINERS trainer ranks and 2 rollout
# ranks on the tiny model. $WHO names the layout in the checks' names ("" or "DP 2 ").
# usage: . fully_async_lib.sh TRAINERS (after dist_lib.sh)
FA_TRAINERS="$1"
# shellcheck disable=SC2034 # CHECK: the tests run it
CHECK="$(dirname "${BASH_SOURCE[0]}")/check_fully_async.py"
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.val_before_train=false trainer.test_freq=-1 actor_rollout_ref.rollout.n=4
    actor_rollout_ref.actor.ppo_mini_batch_size=2 data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3
    data.synthetic.shots=0 data.synthetic.num_train=64 data.synthetic.num_val=4 actor_rollout_ref.rollout.update_weights_bucket_megabytes=1
    actor_rollout_ref.actor.use_kl_loss=true custom_reward_function.path="$SCORER"
    custom_reward_function.name=byte_score placement.trainer_ranks="$FA_TRAINERS" placement.rollout_ranks=2)
ASYNC=(data.train_batch_size=0 async_training.require_batches=2)
export GRPO_TEST_DECODE_SLEEP_S=0 GRPO_TEST_HOLD_UNIT=

# run NAME [overrides...]: TRAINERS + 2 ranks, log in $TMP/NAME.log, audit files in $TMP/NAME/audit
run() {
    local name="$1"; shift
    timeout 300 "${MPIRUN[@]}" -np $((FA_TRAINERS + 2)) -x GRPO_TEST_DECODE_SLEEP_S -x GRPO_TEST_HOLD_UNIT "$WORKER" \
        "${COMMON[@]}" trainer.default_local_dir="$TMP/$name" trainer.rollout_data_dir="$TMP/$name/audit" "$@" \
        >>"$TMP/$name.log" 2>&1
}

# weights NAME STEP: a run's checkpointed actor at STEP
weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$2/actor"; }

# same_steps A B KEY...: metrics.jsonl of runs A and B, 4 steps each, equal in KEY... step by step, and B's stream
# on policy: staleness 0, nothing dropped, a push every step
same_steps() {
    python3 - "$TMP/$1/p/e/metrics.jsonl" "$TMP/$2/p/e/metrics.jsonl" "${@:3}" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
b = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    for k in sys.argv[3:]:
        assert x[k] == y[k], (x["step"], k, x[k], y[k])
    assert y["training/off_policy/trajectory_staleness/max"] == 0 and y["fully_async/count/dropped_stale_samples"] == 0
    assert y["fully_async/count/current_param_version"] == y["step"] - 1, y
print("%s equal step by step; staleness 0" % ", ".join(sys.argv[3:]))
PY
}

# onpolicy_pair: the on-policy split run (rollout.mode=sync) and the fully-async run with staleness 0 and a push every
# step, 4 steps each ($TMP/sync, $TMP/async0)
onpolicy_pair() {
    run sync data.train_batch_size=4 trainer.total_training_steps=4
    expect "${WHO}on-policy split run (rollout.mode=sync) finishes" $?
    run async0 "${ASYNC[@]}" async_training.staleness_threshold=0 async_training.trigger_parameter_sync_step=1 \
        trainer.total_training_steps=4
    expect "${WHO}fully-async run, staleness 0, trigger 1 finishes" $?
}

# onpolicy_same KEY...: the pair's weights bit-identical, their metrics KEY... equal step by step (same_steps)
onpolicy_same() {
    "$COMPARE" "$(weights sync 4)" "$(weights async0 4)" 0 >"$TMP/cmp0.txt" 2>&1
    local rc=$?
    expect "${WHO}staleness 0 + trigger 1: weights bit-identical to the on-policy run ($(cat "$TMP/cmp0.txt"))" $rc
    same_steps sync async0 "$@"
    expect "${WHO}staleness 0 + trigger 1: $* equal step by step, staleness 0 every step" $?
}

# replay_same NAME STEPS OVERRIDES...: the replay of run NAME's schedule (STEPS steps, the same OVERRIDES) ends with
# bit-identical weights and writes the same schedule
replay_same() {
    local name="$1" steps="$2"; shift 2
    run "${name}replay" "$@" async_training.replay_schedule="$TMP/$name/p/e/async_schedule.jsonl"
    expect "the replay of its schedule finishes" $?
    "$COMPARE" "$(weights "$name" "$steps")" "$(weights "${name}replay" "$steps")" 0 >"$TMP/cmp-$name.txt" 2>&1
    local rc=$?
    expect "replay: weights bit-identical to the ${WHO}recorded run ($(cat "$TMP/cmp-$name.txt"))" $rc
    cmp -s "$TMP/$name/p/e/async_schedule.jsonl" "$TMP/${name}replay/p/e/async_schedule.jsonl"
    expect "replay: the same schedule (units, order, versions, switches)" $?
}

# resume_same: a run with partial rollout on a slow engine ended at step 4 (its checkpoint drains the stream into
# async_state.bin) and launched again to step 8 resumes its stream; the replay of its schedule in one go ends
# bit-identical
resume_same() {
    local res=("${ASYNC[@]}" async_training.staleness_threshold=1 async_training.trigger_parameter_sync_step=1
        data.max_response_length=160)
    GRPO_TEST_DECODE_SLEEP_S=0.002 run res "${res[@]}" trainer.total_training_steps=4
    expect "a ${WHO}fully-async run of 4 steps finishes" $?
    [ -s "$TMP/res/p/e/checkpoints/global_step_4/async_state.bin" ] &&
        grep -q async_state.bin "$TMP/res/p/e/checkpoints/global_step_4/state.json"
    expect "its checkpoint holds the stream's state, listed in state.json" $?
    GRPO_TEST_DECODE_SLEEP_S=0.002 run res "${res[@]}" trainer.total_training_steps=8
    expect "launched again to step 8, it resumes and finishes" $?
    grep -q "fully-async stream resumed from .*global_step_4/async_state.bin" "$TMP/res.log"
    expect "the stream resumes from the checkpoint's state" $?
    run resreplay "${res[@]}" trainer.total_training_steps=8 \
        async_training.replay_schedule="$TMP/res/p/e/async_schedule.jsonl"
    expect "the replay of the resumed run's schedule, in one go, finishes" $?
    "$COMPARE" "$(weights res 8)" "$(weights resreplay 8)" 0 >"$TMP/cmp-res.txt" 2>&1
    local rc=$?
    expect "end + relaunch: weights bit-identical to the replay in one go ($(cat "$TMP/cmp-res.txt"))" $rc
}
