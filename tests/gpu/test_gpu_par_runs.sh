#!/usr/bin/env bash
# Whole GRPO runs with expert, sequence and context parallelism on trainer.device=cuda (2 colocated ranks under
# mpirun, every rank on a GPU of the node, or both on one) against the one-process run on the same device, on tiny
# random models:
#  - EP 2 on a Qwen3-MoE shape (4 experts, top 2, the load-balancing loss on): the experts split over the 2 ranks,
#    the permuted token rows dispatched and combined from device memory (worker/model/moe_ep.c);
#  - Ulysses SP 2 and ring CP 2 on a dense shape: each rank a slice (or the load-balanced chunks) of every
#    micro-batch's tokens, the all-to-all or the K/V ring from device memory;
#  - CP 2 and EP 2 with ZeRO-1 over the groups' NCCL twins (where the ranks share one GPU: refused naming the key);
#  - EP 2 with LoRA on the attention projections, the adapter gathered over EP into the checkpoint;
#  each: per-step losses, grad norms and entropies, and the final weights, agree with the one-process run (fp32
#  bounds of cuBLAS: 1e-3 relative; 1e-5 on the CPU); the ranks say which group carries the rows (NCCL where each
#  has a GPU of its own, else MPI through pinned host memory).
# Skipped (77) without a CUDA device.
# GRPO_TEST_DEVICE=cpu runs the same script with trainer.device=cpu (its own plumbing, on a machine without a GPU).
# usage: test_gpu_par_runs.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/gpu_lib.sh" grpo-gpu-par
. "$(dirname "$0")/../mpi/dist_lib.sh" grpo-gpu-par
STEPS=3
TOL=1e-3
[ "$DEV" = cuda ] || TOL=1e-5
tiny_moe_model "$TMP/moe" qwen3_moe
expect "tiny Qwen3-MoE model initialised" $?
COMMON=(trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=4 actor_rollout_ref.actor.use_kl_loss=true trainer.device=$DEV
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score)
AUX=actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.5
weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }
# same_metrics DIR BASE: DIR's per-step metrics against BASE's (the one-process run's), within $TOL
same_metrics() { gpu_same_metrics "$TMP/$2/p/e/metrics.jsonl" "$TMP/$1/p/e/metrics.jsonl" "$TOL"; }
# matches DIR BASE LABEL: DIR's run against BASE's, per step and in its final weights
matches() {
    same_metrics "$1" "$2"
    expect "$3per-step losses, grad norms and entropies match the one-process run within $TOL" $?
    "$COMPARE" "$(weights "$2")" "$(weights "$1")" "$TOL" >"$TMP/cmp-$1.txt" 2>&1
    local rc=$?
    expect "$3the final weights match the one-process run within $TOL ($(cat "$TMP/cmp-$1.txt"))" $rc
}
# colo NAME MODEL [keys...]: 2 colocated ranks
colo() {
    local name=$1 model=$2
    shift 2
    timeout "$(scaled 300)" "${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" actor_rollout_ref.model.path="$model" \
        trainer.nnodes=1 trainer.n_gpus_per_node=2 trainer.default_local_dir="$TMP/$name" "$@" >"$TMP/$name.log" 2>&1
}

timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" actor_rollout_ref.model.path="$TMP/tiny" trainer.default_local_dir="$TMP/one" \
    >"$TMP/one.log" 2>&1
expect "the one-process $DEV run (dense) finishes" $?
timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" actor_rollout_ref.model.path="$TMP/moe" $AUX \
    trainer.default_local_dir="$TMP/one-moe" >"$TMP/one-moe.log" 2>&1
expect "the one-process $DEV run (Qwen3-MoE) finishes" $?

colo ep2 "$TMP/moe" $AUX actor_rollout_ref.actor.megatron.expert_model_parallel_size=2
expect "EP 2 on $DEV finishes" $?
grep -q "EP rank 1 of 2: experts 2..3 of 4" "$TMP/ep2.log"
expect "EP 2: each rank holds half of the experts" $?
if [ "$DEV" = cuda ]; then
    grep -q "kernels: cuda" "$TMP/ep2.log"
    expect "EP 2: the ranks run on cuda" $?
    grep -Eq "EP 2 on GPUs(: the experts' dispatch and combine over NCCL| that trainer ranks share: the experts' all-to-alls over MPI)" "$TMP/ep2.log"
    chk=$?; expect "EP 2: the ranks say which group carries the rows ($(grep -o 'EP 2 on GPUs[^(]*' "$TMP/ep2.log" | head -1))" $chk
fi
matches ep2 one-moe "EP 2: "

colo sp2 "$TMP/tiny" actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
expect "Ulysses SP 2 on $DEV finishes" $?
grep -q "sequence parallelism (Ulysses) over 2 ranks" "$TMP/sp2.log"
expect "SP 2: each rank runs half of every micro-batch's tokens" $?
if [ "$DEV" = cuda ]; then
    grep -Eq "ulysses_sequence_parallel_size=2 on GPUs: its all-to-all over (NCCL|MPI)" "$TMP/sp2.log"
    expect "SP 2: the ranks say which group carries the rows" $?
fi
matches sp2 one "SP 2: "

colo cp2 "$TMP/tiny" actor_rollout_ref.actor.megatron.context_parallel_size=2
expect "ring CP 2 on $DEV finishes" $?
grep -q "context parallelism over 2 ranks" "$TMP/cp2.log"
expect "CP 2: each rank holds chunks r and 3-r of every row" $?
if [ "$DEV" = cuda ]; then
    grep -Eq "context_parallel_size=2 on GPUs: its K/V ring over (NCCL|MPI)" "$TMP/cp2.log"
    expect "CP 2: the ranks say which group carries the ring" $?
fi
matches cp2 one "CP 2: "

# ZeRO-1 over DP x CP, and under EP (the dense parameters' state over DP, the experts' over the ranks holding the
# same ones): on GPUs of their own over the groups' NCCL twins (the same run as without it); where the two ranks
# share one GPU, NCCL cannot, and the run is refused naming the key
# the devices CUDA sees (CUDA_VISIBLE_DEVICES applies; nvidia-smi lists every GPU of the node)
GPUS=1
[ "$DEV" = cuda ] && "$PROBE" --probe 2 >/dev/null 2>&1 && GPUS=2
# zero1 NAME BASE LABEL GROUP MODEL [keys...]: NAME with ZeRO-1 against BASE, each rank saying it keeps its block
zero1() {
    local name=$1 base=$2 label=$3 group=$4 model=$5
    shift 5
    colo "$name" "$model" actor_rollout_ref.actor.megatron.use_distributed_optimizer=true "$@"
    local rc=$?
    if [ "$DEV" = cuda ] && [ "${GPUS:-0}" -lt 2 ]; then
        [ $rc -ne 0 ] && says "$TMP/$name.log" "use_distributed_optimizer=true with trainer.device=cuda: ZeRO-1 on GPUs runs over NCCL" &&
            grep -q "2 $group ranks share fewer GPUs" "$TMP/$name.log"
        expect "$label with ZeRO-1 on one shared GPU is refused naming the key and $group" $?
        return
    fi
    expect "$label with ZeRO-1 on $DEV finishes" $rc
    grep -q "rank 1 keeps the optimizer state" "$TMP/$name.log"
    expect "$label with ZeRO-1: each rank keeps its block of the optimizer state" $?
    matches "$name" "$base" "$label with ZeRO-1: "
}
zero1 cp2-zero1 one "CP 2" "DP x CP" "$TMP/tiny" actor_rollout_ref.actor.megatron.context_parallel_size=2
zero1 ep2-zero1 one-moe "EP 2" "DP" "$TMP/moe" $AUX actor_rollout_ref.actor.megatron.expert_model_parallel_size=2

# EP 2 with LoRA on the attention projections (LoRA on the experts and the router is the CPU back-end's): each rank
# trains the same attention adapter, the checkpoint holds the whole adapter; against one process with the same LoRA
LORA=(actor_rollout_ref.model.lora_rank=2 actor_rollout_ref.model.lora_alpha=4
    "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj]" actor_rollout_ref.actor.optim.eps=1e-6)
timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" actor_rollout_ref.model.path="$TMP/moe" $AUX "${LORA[@]}" \
    trainer.default_local_dir="$TMP/one-moe-lora" >"$TMP/one-moe-lora.log" 2>&1
expect "the one-process $DEV run with LoRA (Qwen3-MoE) finishes" $?
colo ep2-lora "$TMP/moe" $AUX "${LORA[@]}" actor_rollout_ref.actor.megatron.expert_model_parallel_size=2
expect "EP 2 with LoRA on $DEV finishes" $?
same_metrics ep2-lora one-moe-lora
expect "EP 2 with LoRA: per-step losses, grad norms and entropies match the one-process run within $TOL" $?
python3 - "$(weights one-moe-lora)" "$(weights ep2-lora)" "$TOL" <<'PY'
import array, json, struct, sys
def adapter(d):
    data = open(f"{d}/adapter_model.safetensors", "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    return {k: array.array("f", data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}
one, two, tol = adapter(sys.argv[1]), adapter(sys.argv[2]), float(sys.argv[3])
assert sorted(one) == sorted(two) and one, (sorted(one), sorted(two))
top = max(max(abs(x) for x in v) for v in one.values())
worst = max(max(abs(a - b) for a, b in zip(one[k], two[k])) for k in one)
assert worst <= tol * top, f"the adapters differ by {worst:.3g} (bound {tol:g} x {top:.3g})"
print(f"{len(one)} adapter tensors, max |a-b| {worst:.3g} of max |a| {top:.3g}")
PY
expect "EP 2 with LoRA: the final adapter matches the one-process run within $TOL" $?

finish
