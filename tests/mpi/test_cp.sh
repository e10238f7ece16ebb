#!/usr/bin/env bash
# Context parallelism (actor_rollout_ref.actor.megatron.context_parallel_size: ring attention over load-balanced
# chunks) reproduces the single-process run with long responses (mpirun --oversubscribe):
#  - a tiny Llama (4 query heads over 2 KV heads) with a 4096-position window generates responses of 2,048 tokens
#    (actor_rollout_ref.rollout.ignore_eos), packed two to a micro-batch; each sequence (prompt and response) is
#    padded to a multiple of 2 x CP and cut into 2 x CP chunks, rank r holding chunks r and 2 x CP - 1 - r;
#  - CP2, CP2 x DP2 and CP2 x PP2 (two pipeline stages, each rank's ring chunks of the activation passed between
#    the stages' same CP ranks) colocated, and CP2 and CP2 x DP2 fed by a rollout rank (split), give the single-process run's per-step
#    losses, grad norms and entropies, and its weights after two GRPO steps, within 1e-5 relative; the same with
#    the token-budget micro-batches (use_dynamic_bsz: ppo_max_token_len_per_gpu per GPU, CP times it a group);
#  - CP2 with LoRA (rank 8, all-linear), gradient checkpointing and activation offload gives the single-process LoRA
#    run's metrics and saves the same PEFT adapter (config byte for byte, every float within 1e-5);
#  - CP 2 x TP 2 (4 colocated ranks, TP fastest): the ring over each TP rank's 2 query heads and its KV head, the
#    vocab-parallel head on each rank's chunks: the same run; and so do CP 2 x TP 2 x PP 2 (8 colocated ranks, TP
#    fastest, then CP, then PP; also with the token budget), and CP 2 x TP 2 and CP 2 x TP 2 x PP 2 fed by a rollout
#    rank (split: the DP rank's batches shared over its TP x CP x PP ranks);
#  - context_parallel_size with ulysses_sequence_parallel_size, or a GPU, is refused naming the keys.
# usage: test_cp.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-cp
test_env
MPIRUN=(timeout "$(scaled 400)" mpirun --oversubscribe --bind-to none)
. "$(dirname "$0")/equiv_lib.sh"
LEN=2048
python3 - "$TOK/config.json" "$TMP/long-llama.json" <<'PY'
import json, sys
json.dump(dict(json.load(open(sys.argv[1])), max_position_embeddings=4096), open(sys.argv[2], "w"), indent=1)
PY
tiny_model "$TMP/long-llama" 11 "$TMP/long-llama.json"
expect "tiny Llama with a 4096-position window initialised" $?

# NAME RANKS CP [more keys...]
cp() {
    local name=$1 ranks=$2 size=$3
    shift 3
    # shellcheck disable=SC2046 # long's words are the keys
    "${MPIRUN[@]}" -np "$ranks" "$WORKER" $(long llama) trainer.default_local_dir="$TMP/$name" \
        trainer.nnodes=1 trainer.n_gpus_per_node="$ranks" \
        actor_rollout_ref.actor.megatron.context_parallel_size="$size" "$@" >"$TMP/$name.log" 2>&1
}

# shellcheck disable=SC2046
"$WORKER" $(long llama) trainer.default_local_dir="$TMP/one-llama" >"$TMP/one-llama.log" 2>&1
expect "llama: single-process run finishes" $?
python3 - "$TMP/one-llama/p/e/metrics.jsonl" $LEN <<'PY'
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1]))]
assert len(r) == 2 and all(x["response_length/min"] == int(sys.argv[2]) for x in r), r
assert all(x["actor/grad_norm"] > 0 and x["actor/pg_loss"] != 0 for x in r), r
PY
expect "llama: every response is $LEN tokens, and the policy loss and its gradient are not zero" $?

cp cp2-llama 2 2
expect "cp2-llama: 2 colocated ranks, CP 2, finish" $?
has "$TMP/cp2-llama.log" "context parallelism over 2 ranks: each holds chunks r and 3-r of every micro-batch's row cut into 4, and attends over the ring with all 4 query heads"
expect "cp2-llama: the ring's chunks are logged" $?
equivalent cp2-llama one-llama
# four ranks generate as two engines of rollout TP 2 (a step's two prompts, one each)
cp cp2dp2-llama 4 2 actor_rollout_ref.rollout.tensor_model_parallel_size=2
expect "cp2dp2-llama: 4 colocated ranks, CP 2 x DP 2, finish" $?
has "$TMP/cp2dp2-llama.log" "training DP 2 x CP 2 x TP 1 x PP 1"
expect "cp2dp2-llama: DP 2 x CP 2 logged" $?
equivalent cp2dp2-llama one-llama
# CP 2 x PP 2: both stages cut each micro-batch into the same ring chunks; each rank's chunks of the activation (and
# of its gradient) pass to the same CP rank of the other stage
cp cp2pp2-llama 4 2 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
expect "cp2pp2-llama: 4 colocated ranks, CP 2 x PP 2, finish" $?
has "$TMP/cp2pp2-llama.log" "training DP 1 x CP 2 x TP 1 x PP 2"
expect "cp2pp2-llama: CP 2 x PP 2 logged" $?
equivalent cp2pp2-llama one-llama
# CP 2 x TP 2: the ring runs over each TP rank's heads
TP2=actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
cp cp2tp2-llama 4 2 $TP2 actor_rollout_ref.rollout.tensor_model_parallel_size=2
expect "cp2tp2-llama: 4 colocated ranks, CP 2 x TP 2, finish" $?
has "$TMP/cp2tp2-llama.log" "training DP 1 x CP 2 x TP 2 x PP 1"
expect "cp2tp2-llama: CP 2 x TP 2 logged" $?
has "$TMP/cp2tp2-llama.log" "attends over the ring with all 2 query heads (its TP rank's, of 4 over TP 2)"
expect "cp2tp2-llama: each rank attends over the ring with its TP rank's 2 heads" $?
equivalent cp2tp2-llama one-llama
# CP 2 x TP 2 x PP 2 (8 colocated ranks, TP fastest, then CP, then PP): the ring over each TP rank's heads on both
# stages, each rank's chunks of its activation passed to the same (CP, TP) rank of the other stage; the 8 ranks
# generate as two engines of rollout TP 4
cp cp2tp2pp2-llama 8 2 $TP2 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4
expect "cp2tp2pp2-llama: 8 colocated ranks, CP 2 x TP 2 x PP 2, finish" $?
has "$TMP/cp2tp2pp2-llama.log" "training DP 1 x CP 2 x TP 2 x PP 2"
expect "cp2tp2pp2-llama: CP 2 x TP 2 x PP 2 logged" $?
equivalent cp2tp2pp2-llama one-llama
# ZeRO-1 over the two ranks of one CP group (DP 1): the optimizer state halved, the same run
cp zero-cp2 2 2 actor_rollout_ref.actor.megatron.use_distributed_optimizer=true
expect "zero-cp2: CP 2 with ZeRO-1 finishes" $?
has "$TMP/zero-cp2.log" "ZeRO-1: DP x CP rank 1 keeps the optimizer state of parameters"
expect "zero-cp2: each CP rank keeps half of the optimizer state" $?
equivalent zero-cp2 one-llama

# LoRA (rank 8 on every projection) with gradient checkpointing and the layer inputs (each rank's chunks)
# offloaded to host memory: the adapters' gradients summed over the CP group; the one process's PEFT adapter
# shellcheck disable=SC2046,SC2086 # long's and LORA's words are keys
"$WORKER" $(long llama) trainer.default_local_dir="$TMP/one-lora" $LORA >"$TMP/one-lora.log" 2>&1
expect "llama: single-process LoRA run finishes" $?
# shellcheck disable=SC2086
cp cp2-lora 2 2 $LORA actor_rollout_ref.model.enable_gradient_checkpointing=true \
    actor_rollout_ref.model.enable_activation_offload=true
expect "cp2-lora: CP 2 with LoRA, checkpointing and activation offload, finishes" $?
equivalent_lora cp2-lora one-lora

# the token budget: 2200 tokens a GPU hold one response a micro-batch in one process, both over a CP 2 group
BSZ="actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2200"
# shellcheck disable=SC2046,SC2086 # long's and BSZ's words are keys
GRPO_LOG_LEVEL=debug "$WORKER" $(long llama) trainer.default_local_dir="$TMP/one-bsz" $BSZ >"$TMP/one-bsz.log" 2>&1
expect "llama: single-process run with use_dynamic_bsz finishes" $?
has "$TMP/one-bsz.log" "update: 2 sequence(s) of this rank's mini-batch in 2 micro-batch(es)"
expect "one-bsz: ppo_max_token_len_per_gpu=2200 gives one response a micro-batch" $?
# shellcheck disable=SC2086 # BSZ's words are keys
GRPO_LOG_LEVEL=debug cp cp2-bsz 2 2 $BSZ
expect "cp2-bsz: CP 2 with use_dynamic_bsz finishes" $?
has "$TMP/cp2-bsz.log" "update: 2 sequence(s) of this rank's mini-batch in 1 micro-batch(es)"
expect "cp2-bsz: the CP group's budget is 2 x 2200 tokens, both responses in one micro-batch (per GPU, as verl means it)" $?
equivalent cp2-bsz one-bsz
# the token budget with CP 2 x TP 2 x PP 2 (8 ranks): the same micro-batches on every stage and TP rank
# shellcheck disable=SC2086 # BSZ's words are keys
GRPO_LOG_LEVEL=debug cp cp2tp2pp2-bsz 8 2 $TP2 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 $BSZ
expect "cp2tp2pp2-bsz: CP 2 x TP 2 x PP 2 with use_dynamic_bsz finishes" $?
has "$TMP/cp2tp2pp2-bsz.log" "update: 2 sequence(s) of this rank's mini-batch in 1 micro-batch(es)"
expect "cp2tp2pp2-bsz: both responses in one micro-batch of the CP group's budget" $?
equivalent cp2tp2pp2-bsz one-bsz

# split runs: a rollout rank generates, CP rank 0 of each DP rank pulls its batches and shares them with its CP peers
split() { # NAME TRAINERS [more keys...]
    local name=$1 trainers=$2
    shift 2
    # shellcheck disable=SC2046
    "${MPIRUN[@]}" -np $((trainers + 1)) "$WORKER" $(long llama) trainer.default_local_dir="$TMP/$name" \
        placement.trainer_ranks="$trainers" placement.rollout_ranks=1 \
        actor_rollout_ref.actor.megatron.context_parallel_size=2 "$@" >"$TMP/$name.log" 2>&1
}
split split-cp2 2
expect "split-cp2: 2 CP trainer ranks and a rollout rank finish" $?
has "$TMP/split-cp2.log" "rollout rank 0 of 1 (on-policy), 1 trainer endpoint(s)"
expect "split-cp2: one data endpoint for the CP group" $?
equivalent split-cp2 one-llama
split split-cp2dp2 4
expect "split-cp2dp2: 4 trainer ranks (CP 2 x DP 2) and a rollout rank finish" $?
equivalent split-cp2dp2 one-llama
# CP 2 x TP 2 split: TP rank 0 of CP rank 0 pulls and shares the batches with the three other ranks of its DP rank
# (TP x CP); the TP ranks of CP rank 0 assemble the weights the rollout rank generates with
split split-cp2tp2 4 $TP2
expect "split-cp2tp2: 4 trainer ranks (CP 2 x TP 2) and a rollout rank finish" $?
has "$TMP/split-cp2tp2.log" "attends over the ring with all 2 query heads (its TP rank's, of 4 over TP 2)"
expect "split-cp2tp2: each trainer rank attends over the ring with its TP rank's 2 heads" $?
equivalent split-cp2tp2 one-llama
# CP 2 x TP 2 x PP 2 split (8 trainer ranks): the batches shared over the DP rank's TP x CP x PP ranks
split split-cp2tp2pp2 8 $TP2 actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2
expect "split-cp2tp2pp2: 8 trainer ranks (CP 2 x TP 2 x PP 2) and a rollout rank finish" $?
equivalent split-cp2tp2pp2 one-llama

# refusals, each naming the keys
refused() { # NAME RANKS CP TEXT [keys...]: the run ends with an error saying TEXT
    local name=$1 ranks=$2 size=$3 text=$4
    shift 4
    cp "$name" "$ranks" "$size" "$@"
    local rc=$?
    [ $rc -ne 0 ] && says "$TMP/$name.log" "$text"
}
refused bad-both 4 2 "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 and actor_rollout_ref.actor.megatron.context_parallel_size=2: Ulysses sequence parallelism and context parallelism share one dimension" \
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
expect "CP with Ulysses SP is refused naming both keys" $?
# CP on a GPU is not refused for being CP (its device path is written and compiled; tests/gpu/test_gpu_parallel.c
# checks it on a device): without a usable GPU here the run stops at the device instead
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    cp bad-cuda 2 2 trainer.device=cuda
    rc=$?
    [ $rc -ne 0 ] && says "$TMP/bad-cuda.log" "trainer.device=cuda" &&
        ! grep -q "context_parallel_size=2 with trainer.device=cuda" "$TMP/bad-cuda.log"
    expect "CP with trainer.device=cuda is not refused as CP (no usable GPU here: the device is named)" $?
fi
refused bad-ranks 3 2 "3 hybrid ranks are not a multiple of actor_rollout_ref.actor.megatron.tensor_model_parallel_size 1 x actor_rollout_ref.actor.megatron.pipeline_model_parallel_size 1 x actor_rollout_ref.actor.megatron.context_parallel_size 2"
expect "3 ranks under CP 2 are refused naming the key" $?
finish "$TMP"/*.log
