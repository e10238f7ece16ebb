#!/usr/bin/env bash
# Fully-async training (async_training.*, docs/training.md "Fully-async training") with two trainer ranks (data
# parallelism, DP 2) and two rollout ranks, on a tiny model under mpirun (4 ranks on 2 cores, oversubscribed). The
# rollout ranks send every unit whole to trainer rank 0, whose stream decides which step takes it; rank 0 sends the
# step's units to the other trainer rank, and each DP rank trains its token-balanced share of every unit:
#  - staleness_threshold 0 with trigger_parameter_sync_step 1 ends with weights bit-identical to the on-policy split
#    run with the same two trainer ranks (rollout.mode=sync), with the same losses, grad norms and scores step by step;
#  - partial rollout with a slow engine (GRPO_TEST_DECODE_SLEEP_S), staleness 1: check_fully_async.py recomputes the
#    staleness, partial and drop accounting in float64 from the audit files (both DP ranks' sequences) and the
#    schedule; the replay of its schedule ends bit-identical, with the same schedule;
#  - a run ended at step 4 (its checkpoint drains the stream into async_state.bin) and launched again to step 8 ends
#    bit-identical to the replay of its schedule in one go;
#  - the two trainer ranks as one model copy instead, tensor parallel (TP 2), pipeline parallel (PP 2), Ulysses
#    sequence parallel (SP 2) or ring-attention context parallel (CP 2), and as two DP ranks splitting a mixture of
#    experts' experts (EP 2): staleness 0 + trigger 1 ends bit-identical to the on-policy split run of the same
#    layout (every rank of a DP rank gets its share from rank 0; the model copy's peers give their parts of each push).
# usage: test_fully_async_dp.sh (the build's programs by name, tests/lib.sh)
set -u
# shellcheck disable=SC2034 # MODEL_TOOL: dist_lib.sh's tiny_model makes the model with it
. "$(dirname "$0")/dist_lib.sh" grpo-fully-async-dp
# shellcheck disable=SC2034 # WHO: fully_async_lib.sh names the layout with it
WHO="DP 2 "
. "$(dirname "$0")/fully_async_lib.sh" 2

# ---- on-policy equivalence: staleness 0, a push every step, DP 2
onpolicy_pair
grep -q "DP rank 1 of 2" "$TMP/async0.log"
expect "the fully-async run trains on 2 DP ranks" $?
onpolicy_same actor/pg_loss actor/kl_loss actor/grad_norm actor/entropy critic/score/mean critic/advantages/mean \
    response_length/mean
python3 "$CHECK" "$TMP/async0/p/e" "$TMP/async0/audit" 1 0 4 >"$TMP/check0.txt" 2>&1
rc=$?; expect "float64 check of the on-policy stream, both DP ranks' sequences ($(tail -1 "$TMP/check0.txt"))" $rc

# ---- partial rollout, a push every step, staleness 1; then its replay
LIVE=("${ASYNC[@]}" async_training.staleness_threshold=1 async_training.trigger_parameter_sync_step=1
    data.max_response_length=160 trainer.total_training_steps=6)
GRPO_TEST_DECODE_SLEEP_S=0.002 run partial "${LIVE[@]}"
expect "DP 2 fully-async run with partial rollout (slow engine) finishes" $?
python3 "$CHECK" "$TMP/partial/p/e" "$TMP/partial/audit" 1 1 4 --partial >"$TMP/check1.txt" 2>&1
rc=$?; expect "float64 check, partial rollout seen ($(tail -1 "$TMP/check1.txt"))" $rc
replay_same partial 6 "${LIVE[@]}"

# ---- a run ended at step 4 and launched again to step 8 resumes its stream; the replay in one go agrees
resume_same

# ---- the trainers' other layouts: staleness 0 + trigger 1 against the on-policy run of the same layout (3 steps)
tiny_moe_model "$TMP/moe" qwen3_moe
expect "tiny mixture of experts initialised" $?
MEG=actor_rollout_ref.actor.megatron
for layout in "TP 2|$TMP/tiny|$MEG.tensor_model_parallel_size=2" "PP 2|$TMP/tiny|$MEG.pipeline_model_parallel_size=2" \
    "SP 2|$TMP/tiny|actor_rollout_ref.actor.ulysses_sequence_parallel_size=2" \
    "CP 2|$TMP/tiny|$MEG.context_parallel_size=2" "EP 2|$TMP/moe|$MEG.expert_model_parallel_size=2"; do
    IFS='|' read -r what model key <<<"$layout"
    name="lay${what// /}"
    run "$name-sync" actor_rollout_ref.model.path="$model" "$key" data.train_batch_size=4 trainer.total_training_steps=3
    expect "$what: on-policy split run finishes" $?
    run "$name-async" actor_rollout_ref.model.path="$model" "$key" "${ASYNC[@]}" async_training.staleness_threshold=0 \
        async_training.trigger_parameter_sync_step=1 trainer.total_training_steps=3
    expect "$what: fully-async run, staleness 0, trigger 1 finishes" $?
    "$COMPARE" "$(weights "$name-sync" 3)" "$(weights "$name-async" 3)" 0 >"$TMP/cmp-$name.txt" 2>&1
    rc=$?; expect "$what: weights bit-identical to the on-policy run of the same layout ($(cat "$TMP/cmp-$name.txt"))" $rc
done
finish
