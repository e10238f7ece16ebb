#!/usr/bin/env bash
# Split runs with trainer.device=cuda under mpirun (2 trainer ranks in data parallelism + 1 rollout rank, every
# rank on a GPU of the node) against the one-process run on the same device, on a tiny random model:
#  - each rank says which GPU it took; the trainers say how their gradients are summed: over NCCL when each has a
#    GPU of its own, else over MPI through pinned host memory (a machine with one GPU: the three ranks share it);
#  - on-policy, the per-step losses, gradient norms and entropies agree with the one-process run (fp32 bounds of
#    cuBLAS: 1e-3 relative; 1e-5 on the CPU), and so do the final weights;
#  - the DP replicas' checksums (read back from device memory) are compared every step and never differ;
#  - the weights reach the rollout rank from the trainers' GPU memory every step (bytes and chunks logged);
#  - ZeRO-1 (use_distributed_optimizer), TP 2, PP 2 and rollout TP 2 give the same run, or, where ranks share a GPU,
#    are refused by name; LoRA split matches LoRA in one process, and resumes from its checkpoint;
#  - the weight broadcast (weight_sync=broadcast) carries every version, over NCCL where each rank has a GPU;
#  - one-step-off (rollout.mode=async): the rollout rank generates on its GPU while the trainers train;
#  - 2 colocated ranks (no rollout split) give the one-process run too.
# Skipped (77) without a CUDA device.
# GRPO_TEST_DEVICE=cpu runs the same script with trainer.device=cpu (its own plumbing, on a machine without a GPU).
# usage: test_gpu_dist.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/gpu_lib.sh" grpo-gpu-dist
. "$(dirname "$0")/../mpi/dist_lib.sh" grpo-gpu-dist
STEPS=3
TOL=1e-3
[ "$DEV" = cuda ] || TOL=1e-5
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=4 actor_rollout_ref.rollout.update_weights_bucket_megabytes=1
    actor_rollout_ref.actor.use_kl_loss=true trainer.device=$DEV
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score)
SPLIT=(placement.trainer_ranks=2 placement.rollout_ranks=1)
weights() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }
# same_metrics DIR [BASE]: DIR's per-step metrics against BASE's (the one-process run's), within $TOL
same_metrics() { gpu_same_metrics "$TMP/${2:-one}/p/e/metrics.jsonl" "$TMP/$1/p/e/metrics.jsonl" "$TOL" split; }
# shared_gpu: on cuda, whether the trainers share a GPU (the split run summed over MPI: no NCCL there)
shared_gpu() {
    [ "$DEV" = cuda ] && grep -q "gradients summed over MPI through pinned host memory" "$TMP/split.log"
}
# gpus: the GPUs of the node, as the split run's ranks said
gpus() { grep -o "of the [0-9]* GPU(s)" "$TMP/split.log" | head -1 | grep -o "[0-9]*"; }
# matches_one DIR LABEL: DIR's run against the one-process run, per step and in its final weights
matches_one() {
    same_metrics "$1"
    expect "$2per-step losses, grad norms and entropies match the one-process run within $TOL" $?
    "$COMPARE" "$(weights one)" "$(weights "$1")" "$TOL" >"$TMP/cmp-$1.txt" 2>&1
    local rc=$?
    expect "$2the final weights match the one-process run within $TOL ($(cat "$TMP/cmp-$1.txt"))" $rc
}

timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/one" >"$TMP/one.log" 2>&1
expect "the one-process $DEV run finishes" $?
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" "${SPLIT[@]}" trainer.default_local_dir="$TMP/split" \
    trainer.log_level=debug >"$TMP/split.log" 2>&1
expect "2 trainer + 1 rollout ranks on $DEV finish" $?
if [ "$DEV" = cuda ]; then
    grep -q "rank 2: cuda:[0-9]* of the [0-9]* GPU(s) of its node" "$TMP/split.log"
    rc=$?; expect "each rank says which GPU it took ($(grep -o 'rank [0-9]: cuda:[0-9]*' "$TMP/split.log" | tr '\n' ' '))" $rc
    grep -Eq "2 DP ranks on GPUs: gradients summed over (NCCL|MPI through pinned host memory)" "$TMP/split.log"
    rc=$?; expect "the trainers say how they sum gradients: $(grep -o 'gradients summed over [A-Z]*' "$TMP/split.log" | head -1)" $rc
    grep -q "kernels: cuda" "$TMP/split.log"
    expect "the ranks run on cuda" $?
fi
grep -q "weights identical on 2 DP ranks" "$TMP/split.log"
expect "the replicas' checksums are compared every step" $?
! grep -q "weights differ" "$TMP/split.log"
expect "and never differ" $?
grep -q "policy version 1: [0-9]* bytes in [0-9]* chunk" "$TMP/split.log"
expect "weight sync from the trainers reaches the rollout rank" $?
matches_one split ""

# Colocated DP 2 (no rollout split: both ranks generate their share on their GPU, then train together): the same
# run as one process.
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" trainer.nnodes=1 trainer.n_gpus_per_node=2 \
    trainer.default_local_dir="$TMP/colo" >"$TMP/colo.log" 2>&1
expect "2 colocated ranks on $DEV finish" $?
grep -q "2 colocated ranks: training DP 2" "$TMP/colo.log"; expect "colocated: both ranks generate and train" $?
matches_one colo "colocated DP 2: "

# ZeRO-1: each trainer keeps its block of AdamW's state in its GPU's memory, the gradients reduce-scattered and the
# weights all-gathered over NCCL, the checkpoint's moments gathered to the host; the same run as above. Where the
# trainers share a GPU (NCCL needs one per rank: a one-GPU machine) it is refused by name instead.
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" "${SPLIT[@]}" trainer.default_local_dir="$TMP/zero" \
    actor_rollout_ref.actor.megatron.use_distributed_optimizer=true >"$TMP/zero.log" 2>&1
rc=$?
if shared_gpu; then
    [ $rc -ne 0 ] && grep -q "ZeRO-1 on GPUs runs over NCCL, which needs a GPU per trainer rank" "$TMP/zero.log"
    expect "ZeRO-1 where the trainers share a GPU: refused by name" $?
else
    expect "ZeRO-1 over 2 trainers on $DEV finishes" $rc
    grep -q "ZeRO-1: DP rank 1 keeps the optimizer state of parameters" "$TMP/zero.log"
    expect "each trainer keeps its block of the optimizer state" $?
    matches_one zero "ZeRO-1: "
fi

# TP 2 and PP 2 over the two trainers: the policy's TP, PP and TP x PP collectives over NCCL twins of those groups
# (activations, their gradients, the stages' hand-offs in device memory), the checkpoint and the published weights
# gathered through the host; the same run as above. Refused by name where the trainers share a GPU.
for layout in "tp2 2 1" "pp2 1 2"; do
    set -- $layout
    timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" "${SPLIT[@]}" trainer.default_local_dir="$TMP/$1" \
        actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$2" \
        actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$3" >"$TMP/$1.log" 2>&1
    rc=$?
    if shared_gpu; then
        [ $rc -ne 0 ] && grep -q "TP and PP on GPUs run over NCCL, which needs a GPU per trainer rank" "$TMP/$1.log"
        expect "$1 where the trainers share a GPU: refused by name" $?
        continue
    fi
    expect "$1 over 2 trainers on $DEV finishes" $rc
    if [ "$DEV" = cuda ]; then
        grep -q "on GPUs: activations, gradients and stage hand-offs over NCCL" "$TMP/$1.log"
        expect "$1: the model's groups run over NCCL" $?
    fi
    matches_one "$1" "$1: "
done

# Rollout TP 2: one trainer and one rollout TP group of 2 ranks, whose TP collectives run over an NCCL twin of the
# group (a lost peer ends the group only); the weights resharded through the host. Refused by name where the node
# has fewer GPUs than ranks.
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" placement.trainer_ranks=1 placement.rollout_ranks=2 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 trainer.default_local_dir="$TMP/rtp" >"$TMP/rtp.log" 2>&1
rc=$?
if [ "$DEV" = cuda ] && [ "$(gpus)" -lt 3 ]; then
    [ $rc -ne 0 ] && grep -q "TP collectives run over NCCL, which needs a GPU per rank" "$TMP/rtp.log"
    expect "rollout TP 2 with fewer GPUs than ranks: refused by name" $?
else
    expect "rollout TP 2 on $DEV finishes" $rc
    grep -q "resharded to 2 TP ranks" "$TMP/rtp.log"
    expect "rollout TP 2: each version resharded to the group" $?
    matches_one rtp "rollout TP 2: "
fi

# LoRA: the adapter trained on the devices, its gradients over NCCL, each version (the adapter alone) published from
# a host copy and loaded into the rollout rank's GPU, checkpoints saved and read through the host; the split run
# against the one-process LoRA run.
LORA=(actor_rollout_ref.model.lora_rank=4 actor_rollout_ref.model.lora_alpha=8)
timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" "${LORA[@]}" trainer.default_local_dir="$TMP/one-lora" >"$TMP/one-lora.log" 2>&1
expect "the one-process LoRA run on $DEV finishes" $?
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" "${SPLIT[@]}" "${LORA[@]}" trainer.log_level=debug \
    trainer.default_local_dir="$TMP/lora" >"$TMP/lora.log" 2>&1
expect "LoRA with 2 trainer + 1 rollout ranks on $DEV finishes" $?
grep -q "weights identical on 2 DP ranks" "$TMP/lora.log" && ! grep -q "weights differ" "$TMP/lora.log"
expect "LoRA: the replicas' adapters are compared and never differ" $?
[ -f "$(weights lora)/adapter_model.safetensors" ]
expect "LoRA: the checkpoint holds the adapter" $?
same_metrics lora one-lora
expect "LoRA: per-step losses, grad norms and entropies match the one-process LoRA run within $TOL" $?
timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" "${LORA[@]}" trainer.default_local_dir="$TMP/one-lora" \
    trainer.total_training_steps=$((STEPS + 1)) >"$TMP/one-lora-resume.log" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "resumed from .*global_step_$STEPS" "$TMP/one-lora-resume.log"
expect "LoRA: a run resumes from its checkpoint on $DEV (the adapter and AdamW's state read back)" $?

# The weight broadcast (weight_sync=broadcast): each version from trainer rank 0 to the rollout rank in one
# broadcast, over NCCL through a device bucket where each rank has a GPU of its own (else over MPI from host
# memory); the same floats as fetching them, so the final weights are those of the split run.
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" "${SPLIT[@]}" trainer.default_local_dir="$TMP/bcast" \
    actor_rollout_ref.rollout.weight_sync=broadcast trainer.log_level=debug >"$TMP/bcast.log" 2>&1
expect "weight_sync=broadcast on $DEV finishes" $?
want_be=mpi
[ "$DEV" = cuda ] && [ "$(gpus)" -ge 3 ] && want_be=nccl
n="$(grep -c "broadcast to 1 rollout process(es) over $want_be: [0-9]* bytes" "$TMP/bcast.log")"
[ "$n" -eq "$STEPS" ]; expect "every version a step needs went in a broadcast over $want_be ($n of $STEPS)" $?
! grep -q "in [0-9]* chunk(s)" "$TMP/bcast.log"; expect "no version was fetched in chunks" $?
if [ "$DEV" = cuda ]; then
    "$COMPARE" "$(weights split)" "$(weights bcast)" "$TOL" >"$TMP/cmp-bcast.txt" 2>&1
else
    "$COMPARE" "$(weights split)" "$(weights bcast)" 0 >"$TMP/cmp-bcast.txt" 2>&1
fi
rc=$?; expect "broadcast: the final weights are the fetching run's ($(cat "$TMP/cmp-bcast.txt"))" $rc

timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" "${SPLIT[@]}" trainer.default_local_dir="$TMP/async" \
    actor_rollout_ref.rollout.mode=async >"$TMP/async.log" 2>&1
expect "one-step-off on $DEV finishes" $?
python3 - "$TMP/async/p/e/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert len(rows) == 3 and all(r["training/staleness"] == 1 for r in rows[1:]), [r.get("training/staleness") for r in rows]
PY
expect "its steps train on rollouts one version behind" $?

finish
