# shellcheck shell=bash
# The equivalence tests' common part (sourced after tests/lib.sh, with $MODEL_TOOL, $SCORER and $COMPARE set):
# tiny Llama, Qwen2 and Qwen3 models in $TMP/llama, $TMP/qwen2, $TMP/qwen3; `common MODEL` the keys of a
# two-step run of one; `ckpt RUN STEP`; `same_metrics A B [FROM]` (per-step losses, grad norms, entropies,
# scores and validation of run B against run A within 1e-5 relative); `same_weights A B` (the actor's weights
# after $STEPS steps within 1e-5).
python3 - "$TOK/config.json" "$TMP/qwen2-config.json" "$TMP/qwen3-config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
q2 = dict(c, model_type="qwen2", architectures=["Qwen2ForCausalLM"], num_key_value_heads=1, tie_word_embeddings=False)
json.dump(q2, open(sys.argv[2], "w"), indent=1)
# Qwen3 with Llama 3's RoPE remap: per-head q/k norms, head_dim 24 (not hidden / heads = 16)
q3 = dict(c, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=24,
          rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                            original_max_position_embeddings=16))
json.dump(q3, open(sys.argv[3], "w"), indent=1)
PY
tiny_model "$TMP/llama"
expect "tiny Llama initialised" $?
tiny_model "$TMP/qwen2" 12 "$TMP/qwen2-config.json"
expect "tiny Qwen2 initialised" $?
tiny_model "$TMP/qwen3" 13 "$TMP/qwen3-config.json"
expect "tiny Qwen3 (Llama 3 RoPE) initialised" $?

STEPS=2
# AdamW's eps is 1e-6 here, not 1e-8: a gradient component far below eps moves its weight by lr x g / eps, so
# float32 rounding (partial sums added in another order over TP) in components near 1e-8 would move weights by a
# percent of lr; with eps 1e-6 the worst weight difference after two steps is about 2e-6 (measured), with 1e-8
# about 2e-5, in a handful of near-zero-gradient weights. The losses and grad norms agree either way.
common() {
    echo actor_rollout_ref.model.path="$TMP/$1" trainer.project_name=p trainer.experiment_name=e \
        trainer.total_training_steps=$STEPS trainer.val_before_train=true trainer.test_freq=-1 trainer.save_freq=1 \
        data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 \
        data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64 \
        data.synthetic.num_val=4 data.val_batch_size=2 custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score \
        actor_rollout_ref.actor.optim.eps=1e-6 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
        actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
}
ckpt() { echo "$TMP/$1/p/e/checkpoints/global_step_$2"; }
# per-step metrics of run B against run A (1e-5 relative), from step FROM on
same_metrics() {
    python3 - "$TMP/$1/p/e/metrics.jsonl" "$TMP/$2/p/e/metrics.jsonl" "${3:-1}" <<'PY'
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if r["step"] >= int(sys.argv[3])}
b = {r["step"]: r for r in map(json.loads, open(sys.argv[2])) if r["step"] >= int(sys.argv[3])}
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
worst = 0
# relative to the value, or to a floor near the scale of the terms it sums: the policy loss is a mean of
# advantage-weighted ratios (advantages of order 1) that cancel to about 1e-3, so its floor is 1e-2
floor = {"actor/pg_loss": 1e-2}
for s in a:
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
              "response_length/mean", "perf/total_num_tokens"):
        x, y = a[s][k], b[s][k]
        rel = abs(x - y) / max(abs(x), floor.get(k, 1e-3))
        worst = max(worst, rel)
        if rel > 1e-5:
            sys.exit(f"step {s} {k}: {x} against {y} (relative {rel:.2e})")
# validation (greedy, generated through the TP and PP groups) at step 0 and at the last step
for s in (0, max(a)):
    ra = [r for r in map(json.loads, open(sys.argv[1])) if r["step"] == s]
    rb = [r for r in map(json.loads, open(sys.argv[2])) if r["step"] == s]
    if ra and rb and "val-core/arithmetic/reward/mean@1" in ra[0]:
        x, y = ra[0]["val-core/arithmetic/reward/mean@1"], rb[0].get("val-core/arithmetic/reward/mean@1")
        if x != y:
            sys.exit(f"step {s} validation reward: {x} against {y}")
print(f"worst relative difference {worst:.1e}")
PY
}
same_weights() { "$COMPARE" "$(ckpt "$1" $STEPS)/actor" "$(ckpt "$2" $STEPS)/actor" 1e-5 2>&1; }

# The long-response runs (test_sp.sh, test_cp.sh; $LEN set): `long MODEL` the keys of a run of $TMP/long-MODEL,
# and `equivalent NAME ONE` both comparisons of run NAME against the one-process run ONE.
# long: two steps of 2 prompts x 2 responses of LEN tokens, a mini-batch of 2 responses, micro-batches of 2
long() {
    echo actor_rollout_ref.model.path="$TMP/long-$1" trainer.project_name=p trainer.experiment_name=e \
        trainer.total_training_steps=$STEPS trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=1 \
        data.train_batch_size=2 actor_rollout_ref.rollout.n=2 actor_rollout_ref.actor.ppo_mini_batch_size=1 \
        data.max_response_length=$LEN actor_rollout_ref.rollout.ignore_eos=true actor_rollout_ref.actor.optim.lr=1e-3 \
        data.synthetic.shots=0 data.synthetic.num_train=64 data.synthetic.num_val=2 data.val_batch_size=2 custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score \
        actor_rollout_ref.actor.optim.eps=1e-6 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
        actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2
}
equivalent() { # NAME ONE: the run against one process's
    local out
    out=$(same_metrics "$2" "$1" 2>&1)
    expect "$1: per-step losses, grad norms and entropies match one process ($out)" $?
    out=$(same_weights "$2" "$1")
    expect "$1: weights after $STEPS steps match one process within 1e-5 ($out)" $?
}

# LoRA runs: `LORA` the keys of a rank-8 adapter on every projection (all-linear); `same_adapter A B` the saved
# adapter of run B (PEFT's adapter_config.json and adapter_model.safetensors) against run A's after $STEPS steps:
# the same config file byte for byte, the same tensors (names, shapes) and every float within 1e-5 of the largest;
# `equivalent_lora NAME ONE` the per-step metrics and the adapter against the one-process LoRA run ONE.
LORA="actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.model.lora_alpha=16 actor_rollout_ref.model.target_modules=all-linear"
same_adapter() {
    python3 - "$(ckpt "$1" $STEPS)/actor" "$(ckpt "$2" $STEPS)/actor" <<'PY'
import array, json, struct, sys
def read(d):
    data = open(f"{d}/adapter_model.safetensors", "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    out = {}
    for k, v in head.items():
        if k != "__metadata__":
            a, b = v["data_offsets"]
            assert v["dtype"] == "F32", (k, v["dtype"])
            out[k] = (tuple(v["shape"]), array.array("f", data[8 + n + a:8 + n + b]))
    return out, open(f"{d}/adapter_config.json", "rb").read()
(a, ca), (b, cb) = read(sys.argv[1]), read(sys.argv[2])
if ca != cb:
    sys.exit("adapter_config.json differs")
if {k: v[0] for k, v in a.items()} != {k: v[0] for k, v in b.items()}:
    sys.exit(f"tensors differ: {sorted(set(a) ^ set(b))[:4]} or their shapes")
if not any(x != 0 for k in a if ".lora_B." in k for x in a[k][1]):
    sys.exit("every lora_B is still zero: the adapter did not train")
scale = max(abs(x) for v in a.values() for x in v[1])
worst, at = max((abs(x - y), k) for k in a for x, y in zip(a[k][1], b[k][1]))
if not worst <= 1e-5 * scale:
    sys.exit(f"{at}: differs by {worst:.3g} (largest value {scale:.3g})")
print(f"{len(a)} tensors, {sum(len(v[1]) for v in a.values())} floats; worst difference {worst / scale:.1e} relative")
PY
}
equivalent_lora() { # NAME ONE: the LoRA run against one process's
    local out
    out=$(same_metrics "$2" "$1" 2>&1)
    expect "$1: per-step losses, grad norms and entropies match one process ($out)" $?
    out=$(same_adapter "$2" "$1" 2>&1)
    expect "$1: the saved adapter after $STEPS steps is one process's PEFT files within 1e-5 ($out)" $?
}
