#!/usr/bin/env bash
# LoRA on the experts of a mixture of experts (target_modules=all-linear: the attention, each expert's gate_up_proj
# and down_proj, and the router, as PEFT's all-linear on transformers' fused experts) in GRPO runs on tiny random
# Qwen3-MoE and Mixtral models (mpirun --oversubscribe on 2 cores):
#  - a single-process run finishes, logs where the adapter sits, trains the experts' B (they leave zero) and saves the
#    adapter in PEFT's layout (target_parameters, gate_up_proj's doubled rank and alpha, the fused tensors' shapes);
#  - 1 rollout + 2 trainer ranks (the rollout rank gets the adapter alone and generates with it; the trainers
#    all-reduce the experts' adapter gradients with the rest) reproduce it: per-step losses, grad norms, entropies
#    and the final adapter within 1e-5;
#  - expert parallelism (EP 2, 2 colocated ranks: each holds the adapters of its own 2 experts; their gradients
#    stay on it, the attention's and router's are summed over DP) reproduces it too, and its checkpoint holds the
#    whole adapter in PEFT's layout (every expert's, gathered over EP), with the optimizer state to resume: EP 2's
#    step-1 checkpoint resumed in one process ends at the single-process adapter;
#  - on Qwen3-MoE, ZeRO-1 of the adapter under EP (EP 2 on 2 ranks: the attention's and router's adapter state
#    halved over DP, each rank its experts' whole; EP 2 x DP 2 on 4 ranks: the experts' halved too, over the 2 ranks
#    holding the same experts) reproduces one process, and EP 2 x DP 2's step-1 checkpoint (its moments gathered
#    whole) resumes in one process at the single-process adapter; so do split runs of 2 EP 2 trainer ranks and of 4
#    EP 2 x DP 2 trainer ranks with ZeRO-1, each with a rollout rank, which gets the whole adapter (every expert's,
#    gathered over EP) each version.
# usage: test_moe_lora.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-moe-lora
test_env
MPIRUN=(timeout "$(scaled 300)" mpirun --oversubscribe --bind-to none)
STEPS=3
common() {
    echo actor_rollout_ref.model.path="$TMP/$1" trainer.project_name=p trainer.experiment_name=e \
        trainer.total_training_steps=$STEPS trainer.val_before_train=true trainer.test_freq=-1 trainer.save_freq=1 \
        data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2 \
        data.max_response_length=12 actor_rollout_ref.actor.optim.lr=1e-3 data.synthetic.shots=0 data.synthetic.num_train=64 \
        data.synthetic.num_val=4 actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.optim.eps=1e-6 \
        actor_rollout_ref.model.lora_rank=2 actor_rollout_ref.model.lora_alpha=4 \
        actor_rollout_ref.model.target_modules=all-linear \
        custom_reward_function.path="$SCORER" custom_reward_function.name=byte_score
}
adapter() { echo "$TMP/$1/p/e/checkpoints/global_step_$STEPS/actor"; }

for kind in qwen3_moe mixtral; do
    tiny_moe_model "$TMP/$kind" $kind 11
    expect "$kind: tiny model written" $?
    # shellcheck disable=SC2046 # common's words are the keys
    "$WORKER" $(common $kind) trainer.default_local_dir="$TMP/one-$kind" >"$TMP/one-$kind.log" 2>&1
    expect "$kind: single-process GRPO run with LoRA on the experts finishes" $?
    grep -q "LoRA: rank 2, alpha 4 (scale 2) on all-linear (the MLP's on each of the 4 experts, gate and up as one \
gate_up_proj adapter of rank 2r; and the router)" "$TMP/one-$kind.log"
    expect "$kind: the adapter is logged with the experts and the router" $?
    # shellcheck disable=SC2046
    "${MPIRUN[@]}" -np 3 "$WORKER" $(common $kind) trainer.default_local_dir="$TMP/split-$kind" \
        placement.trainer_ranks=2 placement.rollout_ranks=1 >"$TMP/split-$kind.log" 2>&1
    expect "$kind: 1 rollout + 2 trainer ranks finish" $?
    # shellcheck disable=SC2046
    "${MPIRUN[@]}" -np 2 "$WORKER" $(common $kind) trainer.default_local_dir="$TMP/ep2-$kind" trainer.nnodes=1 \
        trainer.n_gpus_per_node=2 actor_rollout_ref.actor.megatron.expert_model_parallel_size=2 >"$TMP/ep2-$kind.log" 2>&1
    expect "$kind: EP 2 on 2 colocated ranks finishes" $?
    grep -q "EP rank 1 of 2: experts 2..3 of 4" "$TMP/ep2-$kind.log"
    expect "$kind: EP rank 1 holds experts 2 and 3" $?
    # shellcheck disable=SC2046
    "$WORKER" $(common $kind) trainer.default_local_dir="$TMP/resumed-$kind" trainer.resume_mode=resume_path \
        trainer.resume_from_path="$TMP/ep2-$kind/p/e/checkpoints/global_step_1" >"$TMP/resumed-$kind.log" 2>&1
    expect "$kind: EP 2's step-1 checkpoint resumes in one process" $?
    runs=(split ep2 resumed)
    if [ "$kind" = qwen3_moe ]; then # ZeRO-1 of the adapter under EP; EP in a split run
        runs+=(ep2-zero1 ep2dp2-zero1 resumed-zero1 ep2split ep2dp2-zero1-split)
        for layout in "ep2-zero1 2" "ep2dp2-zero1 4"; do
            # shellcheck disable=SC2086 # the layout's words
            set -- $layout
            # shellcheck disable=SC2046
            "${MPIRUN[@]}" -np "$2" "$WORKER" $(common $kind) trainer.default_local_dir="$TMP/$1-$kind" \
                trainer.nnodes=1 trainer.n_gpus_per_node="$2" actor_rollout_ref.actor.megatron.expert_model_parallel_size=2 \
                actor_rollout_ref.actor.megatron.use_distributed_optimizer=true >"$TMP/$1-$kind.log" 2>&1
            expect "$kind: EP 2 with ZeRO-1 on $2 colocated ranks finishes" $?
        done
        grep -Eq "ZeRO-1 with EP: DP rank 3 keeps the optimizer state of [0-9]+ of this EP rank's [0-9]+ parameters \(dense ones over DP, experts over the 2 DP ranks" \
            "$TMP/ep2dp2-zero1-$kind.log"
        expect "$kind: EP 2 x DP 2 with ZeRO-1: a rank keeps a block of the adapter's dense and experts' state" $?
        # shellcheck disable=SC2046
        "$WORKER" $(common $kind) trainer.default_local_dir="$TMP/resumed-zero1-$kind" trainer.resume_mode=resume_path \
            trainer.resume_from_path="$TMP/ep2dp2-zero1-$kind/p/e/checkpoints/global_step_1" \
            >"$TMP/resumed-zero1-$kind.log" 2>&1
        expect "$kind: EP 2 x DP 2 with ZeRO-1: its step-1 checkpoint resumes in one process" $?
        # shellcheck disable=SC2046
        "${MPIRUN[@]}" -np 3 "$WORKER" $(common $kind) trainer.default_local_dir="$TMP/ep2split-$kind" \
            placement.trainer_ranks=2 placement.rollout_ranks=1 \
            actor_rollout_ref.actor.megatron.expert_model_parallel_size=2 >"$TMP/ep2split-$kind.log" 2>&1
        expect "$kind: 2 EP 2 trainer ranks and a rollout rank finish" $?
        # shellcheck disable=SC2046
        "${MPIRUN[@]}" -np 5 "$WORKER" $(common $kind) trainer.default_local_dir="$TMP/ep2dp2-zero1-split-$kind" \
            placement.trainer_ranks=4 placement.rollout_ranks=1 \
            actor_rollout_ref.actor.megatron.expert_model_parallel_size=2 \
            actor_rollout_ref.actor.megatron.use_distributed_optimizer=true >"$TMP/ep2dp2-zero1-split-$kind.log" 2>&1
        expect "$kind: 4 EP 2 x DP 2 trainer ranks with ZeRO-1 and a rollout rank finish" $?
    fi
    python3 - "$TMP" "$kind" "$STEPS" "${runs[@]}" <<'PY'
import array, json, struct, sys
tmp, kind, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rows(run):
    return [json.loads(l) for l in open(f"{tmp}/{run}-{kind}/p/e/metrics.jsonl") if l.strip()]
def adapter(run):
    d = f"{tmp}/{run}-{kind}/p/e/checkpoints/global_step_{steps}/actor"
    data = open(f"{d}/adapter_model.safetensors", "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    out = {k: (v["shape"], array.array("f", data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]))
           for k, v in head.items() if k != "__metadata__"}
    return json.load(open(f"{d}/adapter_config.json")), out
cfg, A = adapter("one")
assert sorted(cfg["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj"], cfg["target_modules"]
assert sorted(cfg["target_parameters"]) == ["down_proj", "gate.weight", "gate_up_proj"], cfg["target_parameters"]
assert cfg["rank_pattern"] == {r".*\.gate_up_proj": 4} and cfg["alpha_pattern"] == {r".*\.gate_up_proj": 8}, cfg
E, D = 4, 64
F = 32
p = "base_model.model.model.layers.1.mlp."
want = {p + "experts.base_layer.lora_A.weight": [E * 4, D], p + "experts.base_layer.lora_B.weight": [2 * F, 4 * E],
        p + "experts.lora_A.weight": [E * 2, F], p + "experts.lora_B.weight": [D, 2 * E],
        p + "gate.lora_A.weight": [2, D], p + "gate.lora_B.weight": [E, 2]}
for k, shape in want.items():
    assert k in A and A[k][0] == shape, (k, A.get(k, [None])[0], shape)
for k in want:
    if ".lora_B." in k:
        assert any(x != 0 for x in A[k][1]), f"{k} is still zero: the experts' adapter did not train"
one, split = rows("one"), rows("split")
assert len(one) == len(split) == steps + 1, (len(one), len(split))  # step 0: the validation before training
for a, b in zip(one, split):
    for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
              "response_length/mean"):
        if k not in a:
            continue
        rel = abs(a[k] - b[k]) / max(abs(a[k]), 1e-2 if k == "actor/pg_loss" else 1e-3)
        assert rel <= 1e-5, f"step {a['step']} {k}: one process {a[k]}, split {b[k]}"
scale = max(abs(x) for k in A for x in A[k][1])
for run in sys.argv[4:]:
    if run != "split" and not run.startswith("resumed"):  # the same metrics as one process (split's: above)
        assert len(rows(run)) == len(one), (run, len(rows(run)))
        vals = 0
        for a, b in zip(one, rows(run)):
            for k in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean",
                      "response_length/mean", "val-core/arithmetic/reward/mean@1"):
                if k not in a:
                    continue
                vals += k.startswith("val-")
                rel = abs(a[k] - b[k]) / max(abs(a[k]), 1e-2 if k == "actor/pg_loss" else 1e-3)
                assert rel <= 1e-5, f"step {a['step']} {k}: one process {a[k]}, {run} {b[k]}"
        assert vals == 2, vals  # the validation before training and after the last step
    c, S = adapter(run)
    assert sorted(S) == sorted(A) and all(S[k][0] == A[k][0] for k in A), run
    assert c["target_parameters"] == cfg["target_parameters"], (run, c["target_parameters"])
    worst = max(abs(x - y) for k in A for x, y in zip(A[k][1], S[k][1]))
    assert worst <= 1e-5 * scale, f"{run}: adapter differs by {worst} (scale {scale})"
    print(f"{kind}: {run} agrees with one process (worst {worst:.1e} of {scale:.2f})")
print(f"{kind}: {len(A)} adapter tensors in PEFT's layout")
PY
    expect "$kind: PEFT's layout with the experts trained; ${runs[*]} reproduce one process" $?
done
finish "$TMP"/*.log
