#!/usr/bin/env bash
# Model-parallel trainer ranks reproduce the single-process run (mpirun --oversubscribe on 2 cores):
#  - tiny Llama (tied head, 4 query heads over 2 KV heads), tiny Qwen2 (untied head, q/k/v biases, one KV
#    head, replicated on both TP ranks) under TP2, PP2, TP2 x PP2, DP2 x TP2, ZeRO-1 over DP2 x TP2, and (Llama)
#    DP2 x TP2 x PP2 on 8 trainer ranks, and tiny Qwen3 (per-head q/k norms, head_dim 24, Llama 3's RoPE remap)
#    under TP2 x PP2: per-step losses, grad norms and entropies, and the weights after two GRPO steps, within
#    1e-5 relative;
#  - a change of layout on resume: a checkpoint written by one process resumes under TP2 x PP2, one written
#    under TP2 x PP2 resumes under DP2, and both end at the single-process weights;
#  - perf/comm_bytes/tp and perf/comm_bytes/pp equal the analytic counts: per token, 2L + 1 all-reduces of D
#    floats per pass over TP (old log-probs, reference, update forward and backward), plus the replicated KV
#    heads' gradient sum per optimizer step; the first stage sends D floats per token per forward pass, plus the
#    tied embedding's gradient once per optimizer step; the pipeline bubble is measured;
#  - rollout TP groups (actor_rollout_ref.rollout.tensor_model_parallel_size 2) fed by TP2 trainers: the weights
#    are resharded from the trainers' layout to the groups', logged with bytes and time, and the run reproduces
#    one process's;
#  - validation generates through the TP and PP groups to the same greedy rewards;
#  - layouts that cannot work are errors naming the key and the numbers.
# usage: test_tp.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-tp
test_env
MPIRUN=(timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none)

. "$(dirname "$0")/equiv_lib.sh"
# split run: NAME MODEL TRAINERS TP PP [more keys...] (ROLLOUTS rollout ranks, default 1)
split() {
    local name=$1 model=$2 trainers=$3 tp=$4 pp=$5 rollouts=${ROLLOUTS:-1}
    shift 5
    # shellcheck disable=SC2046 # common's words are the keys
    "${MPIRUN[@]}" -np $((trainers + rollouts)) "$WORKER" $(common "$model") trainer.default_local_dir="$TMP/$name" \
        placement.trainer_ranks="$trainers" placement.rollout_ranks="$rollouts" \
        actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$tp" \
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$pp" "$@" >"$TMP/$name.log" 2>&1
}

for model in llama qwen2 qwen3; do
    # shellcheck disable=SC2046
    "$WORKER" $(common $model) trainer.default_local_dir="$TMP/one-$model" >"$TMP/one-$model.log" 2>&1
    expect "$model: single-process run finishes" $?
    layouts=("tp2 2 2 1" "pp2 2 1 2" "tp2pp2 4 2 2" "dp2tp2 4 2 1"
        "zero-dp2tp2 4 2 1 actor_rollout_ref.actor.megatron.use_distributed_optimizer=true")
    [ $model = llama ] && layouts+=("dp2tp2pp2 8 2 2")
    [ $model = qwen3 ] && layouts=("tp2pp2 4 2 2")
    for layout in "${layouts[@]}"; do
        set -- $layout
        name=$1-$model
        split "$name" $model "$2" "$3" "$4" "${@:5}"
        expect "$model $1: run finishes ($2 trainer ranks, TP $3, PP $4)" $?
        out=$(same_metrics "one-$model" "$name" 2>&1)
        expect "$model $1: per-step losses, grad norms and entropies match one process ($out)" $?
        out=$(same_weights "one-$model" "$name")
        expect "$model $1: weights after $STEPS steps match one process within 1e-5 ($out)" $?
    done
done
grep -q "synchronous sends (GRPO_COMM_SYNC_SENDS=1)" "$TMP/pp2-llama.log"
expect "the stages' sends ran synchronous, as NCCL's (the 1F1B schedule does not lean on MPI's buffering)" $?
grep -q "TP rank 1 of 2, stage 0 of 1: .*heads 2..3, vocabulary 129..258" "$TMP/tp2-llama.log"
expect "TP rank 1 holds query heads 2..3 and vocabulary rows 129..258" $?
grep -q "TP rank 1 of 2, stage 1 of 2: .*(layers 1..1, heads 2..3" "$TMP/tp2pp2-llama.log"
expect "TP2 x PP2: the second stage holds layer 1" $?
grep -q "rank 3 of 5: trainer, dp 1 of 2, tp 1 of 2" "$TMP/dp2tp2-llama.log"
expect "DP2 x TP2: rank 3 is DP rank 1, TP rank 1 (TP fastest)" $?
grep -q "rank 6 of 9: trainer, dp 1 of 2, tp 0 of 2, pp 1 of 2" "$TMP/dp2tp2pp2-llama.log"
expect "DP2 x TP2 x PP2: rank 6 is stage 1, DP rank 1, TP rank 0 (PP slowest)" $?
grep -q "ZeRO-1: DP rank 1 keeps the optimizer state of parameters" "$TMP/zero-dp2tp2-llama.log"
expect "ZeRO-1 over DP2 x TP2: each DP rank keeps its block of its shard's optimizer state" $?

# layout change on resume: one process's step-1 checkpoint under TP2 x PP2, TP2 x PP2's under DP2
split resume-tp2pp2 llama 4 2 2 trainer.resume_mode=resume_path trainer.resume_from_path="$(ckpt one-llama 1)"
expect "a single-process checkpoint resumes under TP2 x PP2" $?
out=$(same_weights one-llama resume-tp2pp2)
expect "... and ends at the single-process weights ($out)" $?
split resume-dp2 llama 2 1 1 trainer.resume_mode=resume_path trainer.resume_from_path="$(ckpt tp2pp2-llama 1)"
expect "a TP2 x PP2 checkpoint resumes under DP2" $?
out=$(same_weights one-llama resume-dp2)
expect "... and ends at the single-process weights ($out)" $?
out=$(same_metrics one-llama resume-dp2 2 2>&1)
expect "... with step 2's metrics ($out)" $?

# TP bytes: the analytic count against the metric (float32 all-reduces, ring 2(n-1)/n = 1 at TP 2)
python3 - "$TMP/tp2-llama/p/e/metrics.jsonl" "$TMP/tp2-qwen2/p/e/metrics.jsonl" "$TOK/config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[3]))
D, L, hd = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["hidden_size"] // cfg["num_attention_heads"]
for path, kv_sync in ((sys.argv[1], False), (sys.argv[2], True)):
    for r in map(json.loads, open(path)):
        if r["step"] < 1:  # the validation before training
            continue
        # the rows each forward runs (a group's shared prompt once per micro-batch, each sequence's last token
        # only a target): the same micro-batches, so the same rows, in the old, reference and update passes
        tokens = r["perf/forward_tokens/update"]
        assert tokens < r["perf/total_num_tokens"] - 4 * 4, "no prompt was shared"
        passes = 4  # old log-probs, reference, update forward, update backward
        want = 4 * D * tokens * passes * (2 * L + 1)
        if kv_sync:  # one KV head of both k and v (weights and biases) per layer, twice (two optimizer steps)
            want += 2 * 4 * L * 2 * 1 * hd * (D + 1)
        got = r["perf/comm_bytes/tp"]
        assert got == want, (path, r["step"], got, want)
print("perf/comm_bytes/tp equals the analytic count")
PY
expect "TP bytes per step equal 2L+1 all-reduces of D floats per token per pass (+ the KV gradient sum)" $?
python3 - "$TMP/pp2-llama/p/e/metrics.jsonl" "$TMP/pp2-qwen2/p/e/metrics.jsonl" "$TOK/config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[3]))
D, V = cfg["hidden_size"], cfg["vocab_size"]
for path, tied in ((sys.argv[1], True), (sys.argv[2], False)):
    for r in map(json.loads, open(path)):
        if r["step"] < 1:
            continue
        tokens = r["perf/forward_tokens/update"]
        want = 4 * D * tokens * 3  # the first stage's output, in the old, reference and update forwards
        if tied:  # its embedding gradient to the last stage's copy, per optimizer step (two)
            want += 2 * 4 * V * D
        got = r["perf/comm_bytes/pp"]
        assert got == want, (path, r["step"], got, want)
        assert 0 < r["perf/pp_bubble"] < 1, r["perf/pp_bubble"]
print("perf/comm_bytes/pp equals the analytic count")
PY
expect "PP bytes per step: D floats per token per forward from the first stage (+ the tied embedding's gradient)" $?

# rollout TP groups: TP2 trainers, two rollout ranks as one TP2 group (4 ranks); two groups of 2 (6 ranks)
for groups in 1 2; do
    ROLLOUTS=$((2 * groups)) split rtp-$groups llama 2 2 1 actor_rollout_ref.rollout.tensor_model_parallel_size=2
    expect "rollout TP2, $groups group(s), fed by TP2 trainers: the run finishes" $?
    out=$(same_metrics one-llama rtp-$groups 2>&1)
    expect "... per-step losses and grad norms match one process ($out)" $?
    out=$(same_weights one-llama rtp-$groups)
    expect "... weights match one process within 1e-5 ($out)" $?
    grep -q "policy version 1: 362496 bytes in 1 chunk(s) in [0-9.]*s; resharded to 2 TP ranks: 182016 bytes to the peers in" \
        "$TMP/rtp-$groups.log"
    expect "... each version is resharded to the group's TP ranks, with bytes and time logged" $?
done
[ "$(grep -c 'generated here' "$TMP/rtp-2.log")" -eq 4 ] && grep -q "dispatching 2 work unit(s) per step" "$TMP/rtp-2.log"
expect "two rollout TP groups take a work unit each" $?

# the planner's TP and PP bytes, given the step's tokens, against the measured ones
for model in llama qwen2; do
    for layout in tp2 pp2; do
        tokens=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][-1]; print(int(r['perf/forward_tokens/update']))" \
            "$TMP/$layout-$model/p/e/metrics.jsonl")
        "$MODEL_TOOL" plan "$TMP/$model" --cpu --nodes 1 --gpus-per-node 2 --prompts 4 --n 4 --micro-batch 2 \
            --mini-batches 2 --no-recompute --step-tokens "$tokens" --all --bytes >"$TMP/plan-$layout-$model.txt" 2>&1
        python3 - "$TMP/plan-$layout-$model.txt" "$TMP/$layout-$model/p/e/metrics.jsonl" "$layout" <<'PY'
import json, re, sys
plan, layout = open(sys.argv[1]).read(), sys.argv[3]
tp, pp = (2, 1) if layout == "tp2" else (1, 2)
m = re.search(rf"bytes tp={tp} pp={pp} dp=1 zero1=0: tp (\d+) pp (\d+) dp", plan)
assert m, plan
last = [json.loads(l) for l in open(sys.argv[2])][-1]
got = last["perf/comm_bytes/tp"] if tp > 1 else last["perf/comm_bytes/pp"]
want = float(m.group(1) if tp > 1 else m.group(2))
assert got == want, (layout, got, want)
print(layout, "planned", want, "= measured")
PY
        expect "$model $layout: grpo-model plan's bytes per step equal the measured ones" $?
    done
done

# layouts that cannot work
split bad-heads llama 3 3 1
[ $? -ne 0 ] && grep -q "num_attention_heads (4) is not divisible by actor_rollout_ref.actor.megatron.tensor_model_parallel_size (3)" "$TMP/bad-heads.log"
expect "TP 3 with 4 heads is refused, naming the key and the numbers" $?
split bad-ranks llama 3 2 1
[ $? -ne 0 ] && grep -q "3 trainer ranks are not a multiple of actor_rollout_ref.actor.megatron.tensor_model_parallel_size 2" "$TMP/bad-ranks.log"
expect "3 trainer ranks with TP 2 are refused" $?
ROLLOUTS=3 split bad-rtp llama 1 1 1 actor_rollout_ref.rollout.tensor_model_parallel_size=2
[ $? -ne 0 ] && grep -q "3 rollout ranks are not a multiple of actor_rollout_ref.rollout.tensor_model_parallel_size 2" "$TMP/bad-rtp.log"
expect "3 rollout ranks in rollout TP groups of 2 are refused" $?
split bad-pp llama 3 1 3
[ $? -ne 0 ] && grep -q "pipeline_model_parallel_size (3) must be between 1 and num_hidden_layers (2)" "$TMP/bad-pp.log"
expect "PP 3 over 2 layers is refused" $?

finish
