#!/usr/bin/env bash
# Ulysses sequence parallelism (actor_rollout_ref.actor.ulysses_sequence_parallel_size) on colocated ranks
# reproduces the single-process run with long responses (mpirun --oversubscribe on 2 cores):
#  - a tiny Llama (4 query heads over 2 KV heads: split at SP 2) and Qwen2 (one KV head: replicated on every SP
#    rank) with a 4096-position window generate responses of 2,048 tokens (actor_rollout_ref.rollout.ignore_eos),
#    packed two to a micro-batch, so every slice boundary cuts through a sequence;
#  - SP2, SP2 x DP2 and SP4 give the single-process run's per-step losses, grad norms and entropies, and its
#    weights after two GRPO steps, within 1e-5 relative; the same with the token-budget micro-batches
#    (use_dynamic_bsz, ppo_max_token_len_per_gpu per GPU as verl means it: the SP group's budget is SP times it);
#  - split runs (a rollout rank feeding SP 2, SP 2 x DP 2 and SP 2 x PP 2 trainers: one data endpoint per DP rank,
#    its batches shared over the SP group and the pipeline stages) give the same;
#  - SP 2 x DP 2 with ZeRO-1 (the optimizer state over DP x SP) reproduces it too, and so does SP 2 x PP 2 (two
#    pipeline stages, each rank's token slice of the activation passed between the stages' same SP ranks), and SP 2
#    with gradient checkpointing and activation offload (each rank's slice of the layer inputs in host memory);
#  - SP 2 with LoRA (rank 8, all-linear), and SP 2 x DP 2 with LoRA and ZeRO-1, give the single-process LoRA run's
#    metrics and save the same PEFT adapter (config byte for byte, every float within 1e-5);
#  - SP 2 x TP 2 (4 colocated ranks, TP fastest): each TP rank's 2 query heads (and its KV head, or with Qwen2's
#    one KV head the copy the two TP ranks share) swapped over its 2 SP ranks, one query head a rank, the
#    vocab-parallel head on each rank's token slice: the same run, and the group's all-to-all bytes a step (the
#    traffic counters, perf/comm_bytes/cp) are the planner's for a TP rank's heads;
#  - SP 2 x TP 2 x PP 2 (8 colocated ranks, TP fastest, then SP, then PP) and SP 2 x TP 2 fed by a rollout rank
#    (split: the DP rank's batches shared over its TP x SP ranks; also with the token budget, and SP 2 x TP 2 x PP 2
#    split) give the same;
#  - heads that do not divide (under TP, a TP rank's heads) are refused naming the keys and the numbers; ranks that
#    do not fit the SP size are refused naming the key.
# usage: test_sp.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-sp
test_env
MPIRUN=(timeout "$(scaled 400)" mpirun --oversubscribe --bind-to none)
. "$(dirname "$0")/equiv_lib.sh"
LEN=2048
python3 - "$TOK/config.json" "$TMP/long-llama.json" "$TMP/long-qwen2.json" <<'PY'
import json, sys
c = dict(json.load(open(sys.argv[1])), max_position_embeddings=4096)
json.dump(c, open(sys.argv[2], "w"), indent=1)
json.dump(dict(c, model_type="qwen2", architectures=["Qwen2ForCausalLM"], num_key_value_heads=1,
               tie_word_embeddings=False), open(sys.argv[3], "w"), indent=1)
PY
tiny_model "$TMP/long-llama" 11 "$TMP/long-llama.json"
expect "tiny Llama with a 4096-position window initialised" $?
# seed 14: with seed 12 one token's probability ratio at step 2 sits on the clip bound to float32 rounding, so a
# sum in another order (SP 4, SP 2 x TP 2) clipped it where one process did not (pg_clipfrac one token apart, the
# grad norm 1e-3 off): a tie the comparison cannot see past, not a difference of the layouts
tiny_model "$TMP/long-qwen2" 14 "$TMP/long-qwen2.json"
expect "tiny Qwen2 (one KV head) with a 4096-position window initialised" $?

# NAME MODEL RANKS SP [more keys...]
sp() {
    local name=$1 model=$2 ranks=$3 size=$4
    shift 4
    # shellcheck disable=SC2046 # long's words are the keys
    "${MPIRUN[@]}" -np "$ranks" "$WORKER" $(long "$model") trainer.default_local_dir="$TMP/$name" \
        trainer.nnodes=1 trainer.n_gpus_per_node="$ranks" \
        actor_rollout_ref.actor.ulysses_sequence_parallel_size="$size" "$@" >"$TMP/$name.log" 2>&1
}

BSZ="actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2200"
for model in llama qwen2; do
    # shellcheck disable=SC2046
    "$WORKER" $(long $model) trainer.default_local_dir="$TMP/one-$model" >"$TMP/one-$model.log" 2>&1
    expect "$model: single-process run finishes" $?
    python3 - "$TMP/one-$model/p/e/metrics.jsonl" $LEN <<'PY'
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1]))]
assert len(r) == 2 and all(x["response_length/min"] == int(sys.argv[2]) for x in r), r
assert all(x["actor/grad_norm"] > 0 and x["actor/pg_loss"] != 0 for x in r), r
PY
    expect "$model: every response is $LEN tokens, and the policy loss and its gradient are not zero" $?
done
# one process with the token budget: 2200 tokens hold one response (and its prompt) a micro-batch
# shellcheck disable=SC2046
GRPO_LOG_LEVEL=debug "$WORKER" $(long llama) trainer.default_local_dir="$TMP/one-bsz" $BSZ >"$TMP/one-bsz.log" 2>&1
expect "llama: single-process run with use_dynamic_bsz finishes" $?
has "$TMP/one-bsz.log" "update: 2 sequence(s) of this rank's mini-batch in 2 micro-batch(es)"
expect "one-bsz: ppo_max_token_len_per_gpu=2200 gives one response a micro-batch" $?

sp sp2-llama llama 2 2
expect "sp2-llama: 2 colocated ranks, SP 2, finish" $?
has "$TMP/sp2-llama.log" "sequence parallelism (Ulysses) over 2 ranks: each runs 1/2 of every micro-batch's tokens and attends with 2 of the 4 query heads"
expect "sp2-llama: the split is logged" $?
equivalent sp2-llama one-llama
# four ranks generate as two engines of rollout TP 2 (a step's two prompts, one each)
RTP2=actor_rollout_ref.rollout.tensor_model_parallel_size=2
sp sp2dp2-llama llama 4 2 $RTP2
expect "sp2dp2-llama: 4 colocated ranks, SP 2 x DP 2, finish" $?
has "$TMP/sp2dp2-llama.log" "training DP 2 x SP 2 x TP 1 x PP 1"
expect "sp2dp2-llama: DP 2 x SP 2 logged" $?
equivalent sp2dp2-llama one-llama
# SP 2 x PP 2: both stages' SP pairs hold the same token slices; each rank's slice of the activation (and of its
# gradient) passes to the same SP rank of the other stage, the loss on the last stage's slices
PP2=actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
sp sp2pp2-llama llama 4 2 $PP2 $RTP2
expect "sp2pp2-llama: 4 colocated ranks, SP 2 x PP 2, finish" $?
has "$TMP/sp2pp2-llama.log" "training DP 1 x SP 2 x TP 1 x PP 2"
expect "sp2pp2-llama: SP 2 x PP 2 logged" $?
equivalent sp2pp2-llama one-llama
# with gradient checkpointing and the layer inputs (each rank's token slice) offloaded to host memory
OFFLOAD="actor_rollout_ref.model.enable_gradient_checkpointing=true actor_rollout_ref.model.enable_activation_offload=true"
# shellcheck disable=SC2086 # OFFLOAD's words are keys
sp sp2-qwen2 qwen2 2 2 $OFFLOAD
expect "sp2-qwen2: SP 2 with the KV head replicated, checkpointing and activation offload, finishes" $?
equivalent sp2-qwen2 one-qwen2
sp sp4-qwen2 qwen2 4 4 $RTP2
expect "sp4-qwen2: SP 4 (one query head a rank) finishes" $?
equivalent sp4-qwen2 one-qwen2
# SP 2 x TP 2: each TP rank's heads split over its SP ranks
TP2=actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
sp sp2tp2-llama llama 4 2 $TP2 $RTP2
expect "sp2tp2-llama: 4 colocated ranks, SP 2 x TP 2, finish" $?
has "$TMP/sp2tp2-llama.log" "training DP 1 x SP 2 x TP 2 x PP 1"
expect "sp2tp2-llama: SP 2 x TP 2 logged" $?
has "$TMP/sp2tp2-llama.log" "attends with 1 of the 2 query heads (its TP rank's, of 4 over TP 2)"
expect "sp2tp2-llama: each rank attends with one of its TP rank's 2 heads" $?
equivalent sp2tp2-llama one-llama
# the group's all-to-all bytes a step (perf/comm_bytes/cp, from the traffic counters) are the planner's
# (plan_sp_alltoall_bytes with the TP size): 2 layers; a TP rank's 2 query heads and 1 KV head of 16 make 1 query
# head and the (replicated) KV head a rank at SP 2, so per row and layer the group sends SP x (SP - 1) / SP x 16 x 4
# bytes x (2 + 2) in each of the 3 forwards (old and reference log-probs, the update's) and x (3 + 2) in the backward
out=$(python3 - "$TMP/sp2tp2-llama/p/e/metrics.jsonl" 2>&1 <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1]))]
assert len(rows) == 2, rows
for r in rows:
    want = 2 * 1 * 16 * 4 * (3 * (2 + 2) + (3 + 2)) * r["perf/forward_tokens/update"]
    assert r["perf/comm_bytes/cp"] == want, (r["step"], r["perf/comm_bytes/cp"], want)
    print(f"step {r['step']}: {r['perf/comm_bytes/cp']:.0f} bytes over {r['perf/forward_tokens/update']:.0f} rows")
PY
)
expect "sp2tp2-llama: the all-to-all bytes a step are the planner's with the TP factor (${out//$'\n'/; })" $?
sp sp2tp2-qwen2 qwen2 4 2 $TP2 $RTP2
expect "sp2tp2-qwen2: SP 2 x TP 2 with the one KV head shared by the TP ranks and replicated over SP finishes" $?
equivalent sp2tp2-qwen2 one-qwen2
# SP 2 x TP 2 x PP 2 (8 colocated ranks, Megatron's order: TP fastest, then SP, then PP): each stage's SP x TP
# group as above, each rank's token slice of its TP rank's activation passed to the same (SP, TP) rank of the other
# stage; the 8 ranks generate as two engines of rollout TP 4
sp sp2tp2pp2-llama llama 8 2 $TP2 $PP2 actor_rollout_ref.rollout.tensor_model_parallel_size=4
expect "sp2tp2pp2-llama: 8 colocated ranks, SP 2 x TP 2 x PP 2, finish" $?
has "$TMP/sp2tp2pp2-llama.log" "training DP 1 x SP 2 x TP 2 x PP 2"
expect "sp2tp2pp2-llama: SP 2 x TP 2 x PP 2 logged" $?
equivalent sp2tp2pp2-llama one-llama
# shellcheck disable=SC2086 # BSZ's words are keys
GRPO_LOG_LEVEL=debug sp sp2-bsz llama 2 2 $BSZ
expect "sp2-bsz: SP 2 with use_dynamic_bsz finishes" $?
has "$TMP/sp2-bsz.log" "update: 2 sequence(s) of this rank's mini-batch in 1 micro-batch(es)"
expect "sp2-bsz: the SP group's budget is 2 x 2200 tokens, both responses in one micro-batch (verl's per-GPU meaning)" $?
equivalent sp2-bsz one-bsz

# LoRA (rank 8 on every projection): each rank's adapters run on its token slice, their gradients summed over the
# SP group (and DP); the saved adapter is the one process's PEFT files
# shellcheck disable=SC2046,SC2086 # long's and LORA's words are keys
"$WORKER" $(long llama) trainer.default_local_dir="$TMP/one-lora" $LORA >"$TMP/one-lora.log" 2>&1
expect "llama: single-process LoRA run finishes" $?
# shellcheck disable=SC2086
sp sp2-lora llama 2 2 $LORA
expect "sp2-lora: SP 2 with LoRA finishes" $?
has "$TMP/sp2-lora.log" "LoRA: rank 8, alpha 16 (scale 2) on all-linear"
expect "sp2-lora: the adapter is logged" $?
equivalent_lora sp2-lora one-lora
# the adapter's gradients summed over DP x SP (4 ranks), its optimizer state sharded over them by ZeRO-1
# shellcheck disable=SC2086
sp zero-sp2dp2-lora llama 4 2 $RTP2 $LORA actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
expect "zero-sp2dp2-lora: SP 2 x DP 2 with LoRA and ZeRO-1 finishes" $?
# the adapter: 2 layers x (q, o: 8 x 64 + 64 x 8; k, v: 8 x 64 + 32 x 8; gate, up, down: 8 x 64 + 128 x 8) floats
has "$TMP/zero-sp2dp2-lora.log" "ZeRO-1: DP x CP rank 3 keeps the optimizer state of parameters 12288..16384"
expect "zero-sp2dp2-lora: each of the 4 ranks keeps a quarter of the adapter's optimizer state (16384 floats)" $?
equivalent_lora zero-sp2dp2-lora one-lora

# split runs: a rollout rank generates, SP rank 0 of each DP rank pulls its batches and shares them with its SP peers
split() { # NAME TRAINERS [more keys...]
    local name=$1 trainers=$2
    shift 2
    # shellcheck disable=SC2046
    "${MPIRUN[@]}" -np $((trainers + 1)) "$WORKER" $(long llama) trainer.default_local_dir="$TMP/$name" \
        placement.trainer_ranks="$trainers" placement.rollout_ranks=1 \
        actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 "$@" >"$TMP/$name.log" 2>&1
}
split split-sp2 2
expect "split-sp2: 2 SP trainer ranks and a rollout rank finish" $?
has "$TMP/split-sp2.log" "rollout rank 0 of 1 (on-policy), 1 trainer endpoint(s)"
expect "split-sp2: one data endpoint for the SP group" $?
equivalent split-sp2 one-llama
split split-sp2dp2 4
expect "split-sp2dp2: 4 trainer ranks (SP 2 x DP 2) and a rollout rank finish" $?
equivalent split-sp2dp2 one-llama
# SP 2 x PP 2 split: the first stage's SP rank 0 pulls and shares the batches with the three other ranks; the stages
# of SP rank 0 assemble the weights the rollout rank generates with
split split-sp2pp2 4 $PP2
expect "split-sp2pp2: 4 trainer ranks (SP 2 x PP 2) and a rollout rank finish" $?
equivalent split-sp2pp2 one-llama
# SP 2 x TP 2 split: TP rank 0 of SP rank 0 pulls and shares the batches with the three other ranks of its DP rank
# (TP x SP); the TP ranks of SP rank 0 assemble the weights the rollout rank generates with
split split-sp2tp2 4 $TP2
expect "split-sp2tp2: 4 trainer ranks (SP 2 x TP 2) and a rollout rank finish" $?
has "$TMP/split-sp2tp2.log" "attends with 1 of the 2 query heads (its TP rank's, of 4 over TP 2)"
expect "split-sp2tp2: each trainer rank attends with one of its TP rank's 2 heads" $?
equivalent split-sp2tp2 one-llama
# the same with the token budget: the SP group's 2 x 2200 tokens hold both responses (the TP ranks share them)
# shellcheck disable=SC2086 # BSZ's words are keys
GRPO_LOG_LEVEL=debug split split-sp2tp2-bsz 4 $TP2 $BSZ
expect "split-sp2tp2-bsz: SP 2 x TP 2 split with use_dynamic_bsz finishes" $?
has "$TMP/split-sp2tp2-bsz.log" "update: 2 sequence(s) of this rank's mini-batch in 1 micro-batch(es)"
expect "split-sp2tp2-bsz: both responses in one micro-batch of the SP group's budget" $?
equivalent split-sp2tp2-bsz one-bsz
# SP 2 x TP 2 x PP 2 split (8 trainer ranks): the first stage's TP rank 0 of SP rank 0 shares the batches with the
# seven other ranks; the first stage's and the last's TP ranks of SP rank 0 assemble the weights
split split-sp2tp2pp2 8 $TP2 $PP2
expect "split-sp2tp2pp2: 8 trainer ranks (SP 2 x TP 2 x PP 2) and a rollout rank finish" $?
equivalent split-sp2tp2pp2 one-llama

# ZeRO-1 shards the optimizer state over DP x SP (4 ranks here), whose gradients add up: the same run
sp zero-sp2dp2 llama 4 2 $RTP2 actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
expect "zero-sp2dp2: SP 2 x DP 2 with ZeRO-1 finishes" $?
has "$TMP/zero-sp2dp2.log" "ZeRO-1: DP x CP rank 3 keeps the optimizer state of parameters"
expect "zero-sp2dp2: each of the 4 ranks keeps a quarter of the optimizer state" $?
equivalent zero-sp2dp2 one-llama

# refusals, each naming the keys and numbers
refused() { # NAME RANKS SP TEXT [keys...]: the run ends with an error saying TEXT
    local name=$1 ranks=$2 size=$3 text=$4
    shift 4
    sp "$name" llama "$ranks" "$size" "$@"
    local rc=$?
    [ $rc -ne 0 ] && says "$TMP/$name.log" "$text"
}
refused bad-heads 3 3 "num_attention_heads (4) is not divisible by actor_rollout_ref.actor.ulysses_sequence_parallel_size (3)" \
    data.train_batch_size=3
expect "SP 3 over 4 heads is refused naming the key and the numbers" $?
refused bad-ranks 3 2 "3 hybrid ranks are not a multiple of actor_rollout_ref.actor.megatron.tensor_model_parallel_size 1 x actor_rollout_ref.actor.megatron.pipeline_model_parallel_size 1 x actor_rollout_ref.actor.ulysses_sequence_parallel_size 2"
expect "3 ranks under SP 2 are refused naming the key" $?
# under TP the TP rank's heads split over SP: 4 heads over TP 2 leave 2 a TP rank, not divisible by SP 4 (8 ranks
# generate as two engines of rollout TP 4; the trainer refuses before any)
refused bad-tp-heads 8 4 "num_attention_heads (4) over actor_rollout_ref.actor.megatron.tensor_model_parallel_size (2) leaves 2 query heads a TP rank, not divisible by actor_rollout_ref.actor.ulysses_sequence_parallel_size (4)" \
    $TP2 actor_rollout_ref.rollout.tensor_model_parallel_size=4
expect "SP 4 x TP 2 over 4 heads is refused naming both keys and the numbers" $?
finish "$TMP"/*.log
