#!/usr/bin/env bash
# LoRA across ranks on a tiny model under mpirun (2 cores, oversubscribed):
#  - 1 rollout + 2 trainer ranks (data parallel: only the adapter's gradients are all-reduced) reproduce the
#    single-process LoRA run: per-step losses and grad norms, and the final adapter, within 1e-5;
#  - weight sync sends the adapter alone (its bytes, not the model's), and the rollout rank loads the base itself;
#  - ZeRO-1 over the 2 trainers splits the adapter's optimizer state and gives the same adapter;
#  - one-step-off (rollout.mode=async) runs with the adapter;
#  - rollout TP 2 (split: 1 trainer + 2 rollout ranks as one TP group; colocated: 2 ranks, DP 2 generating as one
#    TP-2 engine; split also with weight_sync=broadcast) generates with the adapter merged into each TP shard and
#    reproduces the single-process run too;
#  - target_modules=all-linear with exclude_modules (verl's, PEFT's) adapts the projections left, as the explicit list;
#  - (LoRA under training tensor and pipeline parallelism: test_tp_lora.sh.)
# usage: test_dist_lora.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/dist_lib.sh" grpo-dist-lora
STEPS=3
COMMON=(actor_rollout_ref.model.path="$TMP/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps="$STEPS" trainer.val_before_train=false trainer.test_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-2 data.synthetic.shots=0 data.synthetic.num_train=64
    data.synthetic.num_val=4 actor_rollout_ref.actor.use_kl_loss=true
    actor_rollout_ref.model.lora_rank=4 actor_rollout_ref.model.lora_alpha=8
    "actor_rollout_ref.model.target_modules=[q_proj,v_proj,o_proj,down_proj]"
    custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score)
adapter() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }

"$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/one" >"$TMP/one.log" 2>&1
expect "single-process LoRA run finishes" $?
grep -q "LoRA: rank 4, alpha 8 (scale 2) on q_proj, v_proj, o_proj, down_proj" "$TMP/one.log"
expect "the adapter is logged with its rank, alpha and targets" $?

timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/split" \
    placement.trainer_ranks=2 placement.rollout_ranks=1 trainer.log_level=debug >"$TMP/split.log" 2>&1
expect "LoRA with 1 rollout + 2 trainer ranks finishes" $?
grep -q "weights identical on 2 DP ranks" "$TMP/split.log"; expect "the DP replicas' adapters are compared" $?
! grep -q "weights differ" "$TMP/split.log"; expect "the replicas never differ" $?

timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/zero" \
    placement.trainer_ranks=2 placement.rollout_ranks=1 \
    actor_rollout_ref.actor.megatron.use_distributed_optimizer=true >"$TMP/zero.log" 2>&1
expect "LoRA with ZeRO-1 over 2 trainer ranks finishes" $?

# verl's exclude_modules (PEFT's): all-linear without k_proj, gate_proj and up_proj is the explicit list of the other
# runs, on trainers and rollout rank alike
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/exclude" \
    placement.trainer_ranks=2 placement.rollout_ranks=1 actor_rollout_ref.model.target_modules=all-linear \
    "actor_rollout_ref.model.exclude_modules=[k_proj,gate_proj,up_proj]" >"$TMP/exclude.log" 2>&1
expect "LoRA with exclude_modules (1 rollout + 2 trainer ranks) finishes" $?
grep -q "LoRA: rank 4, alpha 8 (scale 2) on q_proj, v_proj, o_proj, down_proj" "$TMP/exclude.log"
expect "exclude_modules: the adapter's targets are all-linear's but the excluded" $?

RTP=actor_rollout_ref.rollout.tensor_model_parallel_size
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/rtp-split" \
    placement.trainer_ranks=1 placement.rollout_ranks=2 $RTP=2 >"$TMP/rtp-split.log" 2>&1
expect "LoRA with 1 trainer + 2 rollout ranks in one TP-2 group finishes" $?
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/rtp-bcast" \
    placement.trainer_ranks=1 placement.rollout_ranks=2 $RTP=2 actor_rollout_ref.rollout.weight_sync=broadcast \
    >"$TMP/rtp-bcast.log" 2>&1
expect "the same with the adapter broadcast to the TP group's head (weight_sync=broadcast) finishes" $?
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/rtp-colo" \
    trainer.nnodes=1 trainer.n_gpus_per_node=2 $RTP=2 >"$TMP/rtp-colo.log" 2>&1
expect "LoRA on 2 colocated ranks (DP 2) generating with rollout TP 2 finishes" $?
grep -q "resharded to 2 TP ranks" "$TMP/rtp-split.log" && grep -q "bytes in the trainers' broadcast.*resharded to 2 TP" \
    "$TMP/rtp-bcast.log" && grep -q "weights resharded into the generation layout (TP 2" "$TMP/rtp-colo.log"
expect "the rollout-TP runs reshard the merged weights into 2 TP shards" $?

# the adapter's floats: 2 layers x (q: 4x64 + 64x4, v: 4x64 + 32x4, o: 4x64 + 64x4, down: 4x128 + 64x4)
python3 - "$TMP" "$STEPS" <<'PY'
import json, struct, sys, array
tmp, steps = sys.argv[1], int(sys.argv[2])
def rows(run):
    return [json.loads(l) for l in open(f"{tmp}/{run}/p/e/metrics.jsonl") if l.strip()]
def adapter(run):
    path = f"{tmp}/{run}/p/e/checkpoints/global_step_{steps}/actor/adapter_model.safetensors"
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = array.array("f", data[8 + n + a:8 + n + b])
    return out
RUNS = (("split", "split"), ("zero", "ZeRO-1"), ("rtp-split", "split rollout TP 2"),
        ("rtp-bcast", "split rollout TP 2, broadcast"), ("rtp-colo", "colocated rollout TP 2"),
        ("exclude", "split, all-linear with exclude_modules"))
one, split, zero = rows("one"), rows("split"), rows("zero")
assert all(len(rows(run)) == steps for run, _ in RUNS) and len(one) == steps
for run, name in RUNS:
    for a, other in zip(one, rows(run)):
        for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"):
            rel = abs(a[k] - other[k]) / max(abs(a[k]), 1e-3)
            assert rel <= 1e-5, f"step {a['step']} {k}: single process {a[k]}, {name} {other[k]}"
floats = 2 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4 + 4 * 64 + 64 * 4 + 4 * 128 + 64 * 4)
for b in split[1:]:
    assert b["perf/update_weights_bytes"] > 0 and b["perf/update_weights_bytes"] % (4 * floats) == 0, b
# the optimizer state covers the adapter only (and half of it per rank with ZeRO-1)
assert abs(split[0]["perf/optimizer_state_gb"] - 8 * floats / 1e9) < 1e-12, split[0]["perf/optimizer_state_gb"]
assert abs(zero[0]["perf/optimizer_state_gb"] - 8 * floats / 2 / 1e9) < 1e-12, zero[0]["perf/optimizer_state_gb"]
A = adapter("one")
assert sum(len(v) for v in A.values()) == floats
moved = sum(1 for k in A if ".lora_B." in k for x in A[k] if x != 0)
assert moved > 0, "B is still zero: the adapter did not train"
for other, name in ((adapter(run), name) for run, name in RUNS):
    assert sorted(A) == sorted(other), name
    worst = max(abs(x - y) for k in A for x, y in zip(A[k], other[k]))
    scale = max(abs(x) for k in A for x in A[k])
    assert worst <= 1e-5 * scale, f"{name}: adapter differs by {worst} (scale {scale})"
print(f"LoRA across ranks agrees with one process; {floats} adapter floats per weight sync")
PY
expect "DP, ZeRO-1 and rollout-TP LoRA runs reproduce the single-process one; sync and optimizer state are the adapter's" $?
for run in split rtp-split; do
    grep -q "policy version 1: $((4 * 2 * (4 * 64 + 64 * 4 + 4 * 64 + 32 * 4 + 4 * 64 + 64 * 4 + 4 * 128 + 64 * 4))) bytes" \
        "$TMP/$run.log"
    expect "$run: the rollout rank (the TP group's head) receives the adapter's bytes" $?
done
[ -f "$(adapter split)/adapter_config.json" ] && [ ! -f "$(adapter split)/model.safetensors" ]
expect "the checkpoint holds the adapter alone (PEFT's layout)" $?

# one-step-off: the rollout rank generates step k + 1 with the adapter of step k - 1
timeout "$(scaled 300)" "${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/async" \
    placement.trainer_ranks=1 placement.rollout_ranks=1 actor_rollout_ref.rollout.mode=async >"$TMP/async.log" 2>&1
expect "one-step-off LoRA run finishes" $?
python3 -c "import json, sys; r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]; \
assert [x['training/staleness'] for x in r] == [0, 1, 1], r" "$TMP/async/p/e/metrics.jsonl"
expect "one-step-off LoRA: staleness 1 after the first step" $?

finish "$TMP"/one.log "$TMP"/exclude.log "$TMP"/split.log "$TMP"/zero.log "$TMP"/async.log "$TMP"/rtp-split.log "$TMP"/rtp-bcast.log "$TMP"/rtp-colo.log
