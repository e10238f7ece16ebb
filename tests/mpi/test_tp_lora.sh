#!/usr/bin/env bash
# LoRA under training tensor and pipeline parallelism reproduces the single-process LoRA run (mpirun
# --oversubscribe on 2 cores). The adapter (rank 8 on every projection, all-linear) is sharded like the projections
# it wraps: a column-parallel projection's B by rows with its A whole on every TP rank, a row-parallel one's A by
# columns with its B whole; the whole matrices' gradients are summed over TP; a stage holds its layers' adapters:
#  - tiny Llama (4 query heads over 2 KV heads) under TP2, PP2, TP2 x PP2 and DP2 x TP2 fed by a rollout rank, and
#    DP2 x TP2 with ZeRO-1 (the norm counting each adapter float once); tiny Qwen2 (one KV head, replicated on both
#    TP ranks: the B of k and v summed over them) under TP2: per-step losses, grad norms and entropies of the
#    one-process run within 1e-5 relative, and the PEFT adapter saved after two steps (gathered whole) the
#    one-process adapter within 1e-5 of its largest value (equiv_lib.sh's same_adapter: the tolerance of the
#    other equivalence tests; summation order differs under TP; AdamW's eps 1e-4, see below);
#  - colocated TP2: generating in place as one TP2 engine (each rank's adapter parts in its shard's products), and
#    with rollout TP 1 (each rank merges its adapter parts into its weights' parts, gathered whole), and SP 2 x TP 2
#    and CP 2 x TP 2 on 4 colocated ranks: the same run;
#  - a checkpoint written under TP2 resumes under TP2, and one written by one process under TP2 x PP2, each ending
#    at the one-process adapter;
#  - LoRA with expert parallelism and training TP is refused, naming the keys.
# usage: test_tp_lora.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-tp-lora
test_env
MPIRUN=(timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none)
. "$(dirname "$0")/equiv_lib.sh"
# AdamW's eps 1e-4 here (equiv_lib.sh's 1e-6 for whole models): an adapter's gradients are small (A's is
# proportional to B, which starts at zero and moves by about lr a step), and a component below eps moves its weight
# by about lr x g / eps, so float32 rounding of the partial sums summed over TP is amplified by lr / eps. Measured
# after two steps (worst difference from one process's adapter, Qwen2 TP2 / Llama TP2): eps 1e-6 4.2e-6 (3.3e-5 of
# the largest value, in one element of a q_proj lora_A) / 5.8e-7; 1e-5 6.2e-7 / 1.8e-7; 1e-4 1.1e-7 / 6.8e-8.
LORA="$LORA actor_rollout_ref.actor.optim.eps=1e-4"

# split run: NAME MODEL TRAINERS TP PP [more keys...] (one rollout rank)
split() {
    local name=$1 model=$2 trainers=$3 tp=$4 pp=$5
    shift 5
    # shellcheck disable=SC2046,SC2086 # common's and LORA's words are the keys
    "${MPIRUN[@]}" -np $((trainers + 1)) "$WORKER" $(common "$model") $LORA trainer.default_local_dir="$TMP/$name" \
        placement.trainer_ranks="$trainers" placement.rollout_ranks=1 \
        actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$tp" \
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$pp" "$@" >"$TMP/$name.log" 2>&1
}
# colocated run: NAME MODEL RANKS TP PP [more keys...]
colo() {
    local name=$1 model=$2 ranks=$3 tp=$4 pp=$5
    shift 5
    # shellcheck disable=SC2046,SC2086
    "${MPIRUN[@]}" -np "$ranks" "$WORKER" $(common "$model") $LORA trainer.default_local_dir="$TMP/$name" \
        trainer.nnodes=1 trainer.n_gpus_per_node="$ranks" \
        actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$tp" \
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$pp" "$@" >"$TMP/$name.log" 2>&1
}

for model in llama qwen2; do
    # shellcheck disable=SC2046,SC2086
    "$WORKER" $(common $model) $LORA trainer.default_local_dir="$TMP/one-$model" >"$TMP/one-$model.log" 2>&1
    expect "$model: single-process LoRA run finishes" $?
done

layouts=("tp2-llama llama 2 2 1" "pp2-llama llama 2 1 2" "tp2pp2-llama llama 4 2 2" "dp2tp2-llama llama 4 2 1"
    "zero-dp2tp2-llama llama 4 2 1 actor_rollout_ref.actor.megatron.use_distributed_optimizer=true"
    "tp2-qwen2 qwen2 2 2 1")
for layout in "${layouts[@]}"; do
    set -- $layout
    split "$@"
    expect "$1: LoRA run finishes ($3 trainer ranks, TP $4, PP $5)" $?
    equivalent_lora "$1" "one-$2"
done
has "$TMP/tp2-llama.log" "LoRA: rank 8, alpha 16 (scale 2) on all-linear"
expect "tp2-llama: the adapter is logged" $?
python3 - "$TMP/tp2-llama/p/e/metrics.jsonl" "$TMP/one-llama/p/e/metrics.jsonl" <<'PY'
import json, sys
tp, one = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
# the optimizer state of a TP rank's part of the adapter: less than the whole adapter's, more than half of it (the
# whole matrices are on both ranks)
for a, b in zip(tp, one):
    if a["step"] >= 1:
        x, y = a["perf/optimizer_state_gb"], b["perf/optimizer_state_gb"]
        assert y / 2 < x < y, (x, y)
print("a TP rank's optimizer state is its part of the adapter's")
PY
expect "tp2-llama: each TP rank keeps the optimizer state of its part of the adapter" $?
grep -q "ZeRO-1: DP rank 1 keeps the optimizer state" "$TMP/zero-dp2tp2-llama.log"
expect "zero-dp2tp2-llama: ZeRO-1 splits each TP rank's adapter state over DP" $?

# colocated: TP2 generating as one TP2 engine (the layouts agree: no resharding), and with whole layers per rank
colo colo-tp2-llama llama 2 2 1 actor_rollout_ref.rollout.tensor_model_parallel_size=2
expect "colo-tp2-llama: 2 colocated ranks, TP 2, generating in place as one TP2 engine, finish" $?
equivalent_lora colo-tp2-llama one-llama
colo colo-tp2-rtp1-llama llama 2 2 1
expect "colo-tp2-rtp1-llama: 2 colocated ranks, TP 2, each generating with whole layers, finish" $?
equivalent_lora colo-tp2-rtp1-llama one-llama
has "$TMP/colo-tp2-rtp1-llama.log" "weights resharded into the generation layout (TP 1, whole layers)"
expect "colo-tp2-rtp1-llama: the merged weights are gathered into the generation layout" $?
# with Ulysses SP 2 and with CP 2 under TP 2 (4 colocated ranks): each rank's adapter parts on its tokens
colo sp2tp2-llama llama 4 2 1 actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
expect "sp2tp2-llama: 4 colocated ranks, SP 2 x TP 2, finish" $?
equivalent_lora sp2tp2-llama one-llama
colo cp2tp2-llama llama 4 2 1 actor_rollout_ref.actor.megatron.context_parallel_size=2
expect "cp2tp2-llama: 4 colocated ranks, CP 2 x TP 2, finish" $?
equivalent_lora cp2tp2-llama one-llama

# resume: TP2's step-1 checkpoint under TP2; one process's under TP2 x PP2
split resume-tp2-llama llama 2 2 1 trainer.resume_mode=resume_path trainer.resume_from_path="$(ckpt tp2-llama 1)"
expect "a TP2 LoRA checkpoint resumes under TP2" $?
out=$(same_adapter one-llama resume-tp2-llama 2>&1)
expect "... and ends at the one-process adapter ($out)" $?
out=$(same_metrics one-llama resume-tp2-llama 2 2>&1)
expect "... with step 2's metrics ($out)" $?
has "$TMP/resume-tp2-llama.log" "resumed from"
expect "... from step 1" $?
split resume-tp2pp2-llama llama 4 2 2 trainer.resume_mode=resume_path trainer.resume_from_path="$(ckpt one-llama 1)"
expect "a one-process LoRA checkpoint resumes under TP2 x PP2" $?
out=$(same_adapter one-llama resume-tp2pp2-llama 2>&1)
expect "... and ends at the one-process adapter ($out)" $?

# LoRA with EP and training TP: refused by name (the configuration alone says it)
# shellcheck disable=SC2046,SC2086
"$WORKER" $(common llama) $LORA actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=2 --print-config >"$TMP/bad-ep.log" 2>&1
[ $? -ne 0 ] && has "$TMP/bad-ep.log" "LoRA with expert parallelism and training tensor or pipeline parallelism"
expect "LoRA with EP and training TP is refused, naming the combination" $?

finish "$TMP"/*.log
