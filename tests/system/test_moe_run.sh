#!/usr/bin/env bash
# Mixture-of-experts models train (issue 30, first slice): two GRPO steps in one process on a tiny random
# Qwen3-MoE model and on a tiny Mixtral, logging the router's load (actor/moe/...); the load-balancing loss's
# coefficient (Megatron's key under verl's override_transformer_config) changes the update's gradient; the
# checkpoint keeps the Hugging Face per-expert layout and loads again.
# Usage: test_moe_run.sh   (from the source root; python3 writes the configs; the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-moe-run
export OPENBLAS_NUM_THREADS=1

# run MODEL NAME COEF: two steps, metrics in $TMP/NAME/grpo/demo/metrics.jsonl
run() {
    (cd "$TMP" && timeout "$(scaled 300)" "$WORKER" actor_rollout_ref.model.path="$1" trainer.default_local_dir="$TMP/$2" \
        trainer.total_training_steps=2 trainer.test_freq=-1 trainer.val_before_train=false data.synthetic.shots=0 data.synthetic.num_val=4 \
        actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff="$3") >"$TMP/$2.log" 2>&1
}

# metric FILE STEP KEY: the value logged
metric() {
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d["step"] == int(sys.argv[2]): print(d.get(sys.argv[3], "absent"))' "$@"
}

for kind in qwen3_moe mixtral; do
    tiny_moe_model "$TMP/$kind" $kind 11
    expect "$kind: tiny model written" $?
    run "$TMP/$kind" "$kind-aux" 0.5
    expect "$kind: two GRPO steps with the load-balancing loss" $?
    m="$TMP/$kind-aux/grpo/demo/metrics.jsonl"
    steps_logged "$m" 2
    expect "$kind: two steps logged" $?
    for key in actor/moe/aux_loss actor/moe/load_imbalance actor/moe/load_imbalance_max \
        actor/moe/tokens_per_expert/max actor/moe/tokens_per_expert/min actor/moe/tokens_per_expert/mean; do
        v=$(metric "$m" 2 $key)
        python3 -c 'import sys; v = float(sys.argv[1]); sys.exit(0 if v > 0 else 1)' "$v" 2>/dev/null
        expect "$kind: $key logged ($v)" $?
    done
    imb=$(metric "$m" 1 actor/moe/load_imbalance)
    python3 -c 'import sys; v = float(sys.argv[1]); sys.exit(0 if 1 <= v <= 2 else 1)' "$imb"
    expect "$kind: load imbalance between 1 and E / k ($imb)" $?
    run "$TMP/$kind" "$kind-noaux" 0
    expect "$kind: two GRPO steps without it" $?
    a=$(metric "$m" 1 actor/grad_norm)
    b=$(metric "$TMP/$kind-noaux/grpo/demo/metrics.jsonl" 1 actor/grad_norm)
    [ "$a" != "$b" ] && [ "$b" != absent ]
    expect "$kind: the coefficient changes the first update's gradient ($a against $b)" $?
    ck="$TMP/$kind-aux/grpo/demo/checkpoints/global_step_2/actor"
    "$MODEL_TOOL" info "$ck" >"$TMP/$kind-info.log" 2>&1
    expect "$kind: the checkpoint loads again" $?
    has "$TMP/$kind-info.log" "experts             4 of 32 rows each, 2 per token (chosen probabilities renormalised)"
    expect "$kind: grpo-model info names the experts" $?
    grep -q "\"model_type\": \"$kind\"" "$ck/config.json"
    expect "$kind: the checkpoint's config.json names $kind" $?
done
python3 - "$TMP/qwen3_moe-aux/grpo/demo/checkpoints/global_step_2/actor/model.safetensors" \
    "$TMP/mixtral-aux/grpo/demo/checkpoints/global_step_2/actor/model.safetensors" <<'PY'
import json, struct, sys
for path, name in zip(sys.argv[1:], ("mlp.experts.3.down_proj.weight", "block_sparse_moe.experts.3.w2.weight")):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        keys = json.loads(f.read(n))
    assert f"model.layers.1.{name}" in keys, (path, sorted(keys)[:8])
PY
expect "checkpoints keep the per-expert tensors of the Hugging Face layout" $?
# BF16 GEMMs (the policy moved to a BF16 context keeps the load-balancing loss): the fp32 run's gradient norms
(cd "$TMP" && timeout "$(scaled 300)" "$WORKER" actor_rollout_ref.model.path="$TMP/mixtral" trainer.default_local_dir="$TMP/bf16" \
    trainer.total_training_steps=2 trainer.test_freq=-1 trainer.val_before_train=false data.synthetic.shots=0 data.synthetic.num_val=4 \
    actor_rollout_ref.actor.dtype=bfloat16 actor_rollout_ref.rollout.dtype=bfloat16 \
    actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.5) >"$TMP/bf16.log" 2>&1
expect "mixtral: two GRPO steps with BF16 GEMMs" $?
a=$(metric "$TMP/mixtral-aux/grpo/demo/metrics.jsonl" 1 actor/grad_norm)
b=$(metric "$TMP/bf16/grpo/demo/metrics.jsonl" 1 actor/grad_norm)
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 0.03 * a else 1)' "$a" "$b"
expect "mixtral: BF16's first gradient norm within 3% of fp32's, load-balancing loss included ($b against $a)" $?
# data parallelism: two colocated ranks (DP 2) give the one-process run's losses, gradient norms and routing
(cd "$TMP" && timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none -np 2 "$WORKER" \
    actor_rollout_ref.model.path="$TMP/qwen3_moe" trainer.default_local_dir="$TMP/dp2" trainer.total_training_steps=2 \
    trainer.test_freq=-1 trainer.val_before_train=false data.synthetic.shots=0 data.synthetic.num_val=4 \
    actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.5) >"$TMP/dp2.log" 2>&1
expect "qwen3_moe: two GRPO steps under DP 2" $?
python3 - "$TMP/qwen3_moe-aux/grpo/demo/metrics.jsonl" "$TMP/dp2/grpo/demo/metrics.jsonl" <<'PY'
import json, sys
one, two = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(one) == len(two) == 2
for a, b in zip(one, two):
    for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe/aux_loss", "actor/moe/load_imbalance",
              "actor/moe/tokens_per_expert/max", "actor/moe/tokens_per_expert/min"):
        assert abs(a[k] - b[k]) <= 1e-6 * max(1.0, abs(a[k])), (a["step"], k, a[k], b[k])
PY
expect "qwen3_moe: DP 2 matches the one-process run (losses, grad norms, routing)" $?
(cd "$TMP" && timeout "$(scaled 120)" "$WORKER" actor_rollout_ref.model.path="$TMP/mixtral" trainer.default_local_dir="$TMP/lora" \
    trainer.total_training_steps=1 actor_rollout_ref.model.lora_rank=4 \
    actor_rollout_ref.model.target_modules=[q_proj,gate_proj]) >"$TMP/lora.out" 2>&1
rc=$?
[ "$rc" -eq 1 ] || [ "$rc" -eq 2 ]
expect "LoRA on a MoE model's expert gate_proj without up_proj is an error exit ($rc)" $?
has "$TMP/lora.out" "LoRA target_modules: gate_proj without up_proj on a mixture-of-experts model (4 experts): the experts' gate and up projections are one fused parameter"
expect "LoRA on a MoE model's gate_proj alone refused by name (PEFT fuses gate_up_proj)" $?
finish "$TMP"/*.log
