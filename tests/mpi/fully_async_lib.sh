# shellcheck shell=bash
# What test_fully_async.sh and test_fully_async_dp.sh check alike, over the caller's run NAME [overrides...]
# (its log in $TMP/NAME.log, its run in $TMP/NAME), $ASYNC (the fully-async keys) and $COMPARE. $WHO names the
# layout in the checks' names ("" or "DP 2 ").
# usage: . fully_async_lib.sh (after dist_lib.sh)

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
