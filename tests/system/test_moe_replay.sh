#!/usr/bin/env bash
# Routing replay (issue 30 item 5): generation records the experts of every token and the sequence carries them to
# the trainer (one process, colocated ranks, and over the data plane of a split run); the trainer counts the
# token-layers whose own routing differs (training/rollout_routing_mismatch) and with
# actor_rollout_ref.actor.router_replay.mode=R3 routes by the rollout's. Same weights and precision: nothing
# differs and replay changes nothing. One step off (rollout.mode=async) the rollout's router is one update old:
# tokens route differently, and replay takes the routing part out of the rollout-vs-trainer log-prob gap.
# Usage: test_moe_replay.sh   (from the source root; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-moe-replay
export OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe --bind-to none)
COMMON=(trainer.test_freq=-1 trainer.val_before_train=false data.synthetic.shots=0 data.synthetic.num_val=4 data.train_batch_size=4
    actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 data.max_response_length=12)

# metrics FILE KEY...: per step, the values of KEY... (absent: None), as JSON lines
metrics() {
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    print(json.dumps([d.get(k) for k in sys.argv[2:]]))' "$@"
}

tiny_moe_model "$TMP/qwen3_moe" qwen3_moe
expect "tiny Qwen3-MoE model written" $?
tiny_model "$TMP/dense"
expect "tiny dense model written" $?

# one process, three steps: routes recorded only, then replayed
for mode in record R3; do
    extra=(actor_rollout_ref.rollout.enable_rollout_routing_replay=true)
    [ $mode = R3 ] && extra=(actor_rollout_ref.actor.router_replay.mode=R3)
    (cd "$TMP" && timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" actor_rollout_ref.model.path="$TMP/qwen3_moe" \
        trainer.default_local_dir="$TMP/one-$mode" trainer.total_training_steps=3 "${extra[@]}") \
        >"$TMP/one-$mode.log" 2>&1
    expect "one process, $mode: three steps" $?
done
python3 - "$TMP/one-record/grpo/demo/metrics.jsonl" "$TMP/one-R3/grpo/demo/metrics.jsonl" <<'PY'
import json, sys
rec, r3 = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(rec) == len(r3) == 3
for a, b in zip(rec, r3):
    assert a["training/rollout_routing_mismatch"] == 0 and b["training/rollout_routing_mismatch"] == 0, (a, b)
    assert a["training/rollout_routing_replay"] == 0 and b["training/rollout_routing_replay"] == 1, (a, b)
    assert a["training/rollout_probs_diff_max"] < 1e-4, a
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe/load_imbalance"):
        assert abs(a[k] - b[k]) <= 1e-6 * max(1.0, abs(a[k])), (a["step"], k, a[k], b[k])
PY
expect "one process: the recorded routes are the trainer's own (no mismatch), and R3 changes nothing" $?

# colocated ranks: DP 2 with ZeRO-1 (the routes travel in the engines' all-gather), and PP 2 (each stage replays its
# layers' routes)
for lay in dp2 pp2; do
    extra=(actor_rollout_ref.actor.megatron.use_distributed_optimizer=true)
    [ $lay = pp2 ] && extra=(actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2)
    (cd "$TMP" && timeout "$(scaled 300)" "${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" \
        actor_rollout_ref.model.path="$TMP/qwen3_moe" trainer.default_local_dir="$TMP/$lay" \
        trainer.total_training_steps=3 actor_rollout_ref.actor.router_replay.mode=R3 "${extra[@]}") \
        >"$TMP/$lay.log" 2>&1
    expect "colocated $lay with R3: three steps" $?
    python3 - "$TMP/one-R3/grpo/demo/metrics.jsonl" "$TMP/$lay/grpo/demo/metrics.jsonl" <<'PY'
import json, sys
one, two = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(one) == len(two) == 3
for a, b in zip(one, two):
    assert b["training/rollout_routing_mismatch"] == 0 and b["training/rollout_routing_replay"] == 1, b
    for k in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean"):
        assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])), (a["step"], k, a[k], b[k])
PY
    expect "colocated $lay with R3 matches the one-process run (losses, grad norms), routes compared" $?
done

# split, one step off: the rollout's weights are one update older than the trainer's
for mode in record R3; do
    extra=(actor_rollout_ref.rollout.enable_rollout_routing_replay=true)
    [ $mode = R3 ] && extra+=(actor_rollout_ref.actor.router_replay.mode=R3)
    (cd "$TMP" && timeout "$(scaled 300)" "${MPIRUN[@]}" -np 2 "$WORKER" "${COMMON[@]}" \
        actor_rollout_ref.model.path="$TMP/qwen3_moe" trainer.default_local_dir="$TMP/async-$mode" \
        trainer.total_training_steps=3 placement.trainer_ranks=1 placement.rollout_ranks=1 \
        actor_rollout_ref.rollout.mode=async actor_rollout_ref.actor.optim.lr=1e-3 "${extra[@]}") \
        >"$TMP/async-$mode.log" 2>&1
    expect "split one-step-off, $mode: three steps" $?
done
python3 - "$TMP/async-record/grpo/demo/metrics.jsonl" "$TMP/async-R3/grpo/demo/metrics.jsonl" <<'PY'
import json, sys
rec, r3 = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(rec) == len(r3) == 3
k = "training/rollout_routing_mismatch"
assert rec[0][k] == 0 and r3[0][k] == 0, (rec[0], r3[0])
# step 2: the same rollouts (made with the first weights) and the same trainer weights in both runs
a, b = rec[1], r3[1]
print("step 2: mismatch %g; gap mean %.3g max %.3g without replay, mean %.3g max %.3g with" % (
    a[k], a["training/rollout_probs_diff_mean"], a["training/rollout_probs_diff_max"],
    b["training/rollout_probs_diff_mean"], b["training/rollout_probs_diff_max"]))
# (counted against the trainer's own top-k; with replay a later layer's own choice is made on the replayed input)
assert a[k] > 0 and b[k] > 0, (a[k], b[k])
assert b["training/rollout_probs_diff_mean"] < a["training/rollout_probs_diff_mean"], (a, b)
PY
expect "split one-step-off: routes differ over the data plane, and R3 shrinks the log-prob gap" $?

# the same split run with two pipeline stages of trainers: each stage compares its own layers, summed
(cd "$TMP" && timeout "$(scaled 300)" "${MPIRUN[@]}" -np 3 "$WORKER" "${COMMON[@]}" \
    actor_rollout_ref.model.path="$TMP/qwen3_moe" trainer.default_local_dir="$TMP/async-pp2" \
    trainer.total_training_steps=2 placement.trainer_ranks=2 placement.rollout_ranks=1 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2 actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.rollout.enable_rollout_routing_replay=true) \
    >"$TMP/async-pp2.log" 2>&1
expect "split one-step-off, PP 2 trainers: two steps" $?
python3 - "$TMP/async-record/grpo/demo/metrics.jsonl" "$TMP/async-pp2/grpo/demo/metrics.jsonl" <<'PY'
import json, sys
one, pp = ([json.loads(l) for l in open(p)][:2] for p in sys.argv[1:])
for a, b in zip(one, pp):
    for k in ("training/rollout_routing_mismatch", "training/rollout_probs_diff_mean"):
        assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])), (a["step"], k, a[k], b[k])
PY
expect "PP 2: the routing mismatch over both stages' layers, and the gap, as without PP" $?

# LoRA on the attention projections of a MoE model with R3: two steps, the checkpoint in PEFT's layout
(cd "$TMP" && timeout "$(scaled 300)" "$WORKER" "${COMMON[@]}" actor_rollout_ref.model.path="$TMP/qwen3_moe" \
    trainer.default_local_dir="$TMP/lora" trainer.total_training_steps=2 actor_rollout_ref.model.lora_rank=4 \
    actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj] \
    actor_rollout_ref.model.lora_alpha=8 actor_rollout_ref.actor.optim.lr=1e-2 \
    actor_rollout_ref.actor.router_replay.mode=R3) >"$TMP/lora.log" 2>&1
expect "LoRA on the attention of a MoE model with R3: two steps" $?
python3 - "$TMP/lora/grpo/demo" <<'PY'
import json, struct, sys
d = sys.argv[1] + "/checkpoints/global_step_2/actor"
cfg = json.load(open(d + "/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"], cfg
with open(d + "/adapter_model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    keys = sorted(k for k in json.loads(f.read(n)) if k != "__metadata__")
assert len(keys) == 2 * 4 * 2 and "base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight" in keys, keys
assert not any("expert" in k or "mlp" in k for k in keys), keys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert len(rows) == 2 and rows[0]["actor/grad_norm"] > 0 and rows[0]["training/rollout_routing_replay"] == 1, rows
PY
expect "LoRA on a MoE model: the adapter alone, the attention projections, in PEFT's layout" $?
"$MODEL_TOOL" info "$TMP/lora/grpo/demo/checkpoints/global_step_2/actor" >"$TMP/lora-info.log" 2>&1
expect "grpo-model reads the MoE adapter checkpoint" $?

# refused by name (docs/training.md's model table)
refused() { # NAME TEXT ARGS...: the run is an error exit whose message holds TEXT
    local name="$1" text="$2"
    shift 2
    (cd "$TMP" && timeout "$(scaled 120)" "$WORKER" "${COMMON[@]}" trainer.default_local_dir="$TMP/refused" \
        trainer.total_training_steps=1 "$@") >"$TMP/$name.out" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && has "$TMP/$name.out" "$text"
}
m=actor_rollout_ref.model.path="$TMP/qwen3_moe"
# a MoE model on CUDA is not refused for its experts (the CUDA MoE kernels are written and compiled; the gpu suite
# checks them on a device): without a usable GPU here the run stops at the device instead
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    refused cuda "trainer.device=cuda" "$m" trainer.device=cuda && ! has "$TMP/cuda.out" "trains on the CPU only"
    expect "MoE on trainer.device=cuda is not refused for its experts (no usable GPU here: the device is named)" $?
fi
refused lora-up "LoRA target_modules: up_proj without gate_proj on a mixture-of-experts model (4 experts)" \
    "$m" actor_rollout_ref.model.lora_rank=4 "actor_rollout_ref.model.target_modules=[q_proj,up_proj]"
expect "LoRA on the experts' up_proj alone (PEFT fuses gate_up_proj) on a MoE model refused by name" $?
(cd "$TMP" && timeout "$(scaled 120)" "$WORKER" "${COMMON[@]}" actor_rollout_ref.model.path="$TMP/dense" \
    trainer.default_local_dir="$TMP/dense-run" trainer.total_training_steps=1 \
    actor_rollout_ref.actor.router_replay.mode=R3) >"$TMP/dense.out" 2>&1
[ $? -ne 0 ] && has "$TMP/dense.out" "actor_rollout_ref.actor.router_replay.mode=R3: routing replay needs a mixture-of-experts model"
expect "R3 on a dense model refused by name" $?
(cd "$TMP" && timeout "$(scaled 60)" "$WORKER" "${COMMON[@]}" actor_rollout_ref.model.path="$TMP/qwen3_moe" \
    actor_rollout_ref.actor.router_replay.mode=R2 --print-config) >"$TMP/r2.out" 2>&1
[ $? -ne 0 ] && has "$TMP/r2.out" "router_replay.mode"
expect "R2 refused, naming the key" $?
finish "$TMP"/*.log
