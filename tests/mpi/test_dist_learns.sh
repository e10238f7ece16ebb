#!/usr/bin/env bash
# One-step-off training learns, as the single-process trainer-learns test does: a tiny model warm-started on
# single-digit sums in one process (trainer.sft_warmup_steps), then 40 GRPO steps with 1 rollout + 1 trainer
# rank in rollout.mode=async. The validation reward (greedy, the 100 sums) must rise by at least 0.10 over
# the GRPO steps, with staleness 1 logged.
# usage: test_dist_learns.sh (the build's programs by name, tests/lib.sh)
set -u
. "$(dirname "$0")/../lib.sh" grpo-learns
test_env

python3 - "$TMP" <<'PY'
import json, sys
d = sys.argv[1]
c = json.load(open("tests/fixtures/tokenizers/bytes-chatml/config.json"))
c.update(hidden_size=128, intermediate_size=256, head_dim=32)
json.dump(c, open(f"{d}/config.json", "w"))
with open(f"{d}/sums.jsonl", "w") as f:
    for a in range(10):
        for b in range(10):
            f.write(json.dumps({"prompt": f"What is {a} + {b}? Answer with just the number, written after ####, "
                                          "like this: #### <number>", "ground_truth": str(a + b),
                                "data_source": "arithmetic"}) + "\n")
PY
"$MODEL_TOOL" init "$TMP/config.json" "$TMP/tiny" --tokenizer-from "$TOK" --seed 4 --std 0.05 >"$TMP/init.log" 2>&1
expect "tiny model (hidden 128) initialised" $?
TASK=(data.train_files="$TMP/sums.jsonl" data.val_files="$TMP/sums.jsonl" data.train_batch_size=16
    data.val_batch_size=100 data.max_response_length=10 actor_rollout_ref.rollout.n=8
    actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64
    trainer.project_name=p)
"$WORKER" "${TASK[@]}" actor_rollout_ref.model.path="$TMP/tiny" trainer.default_local_dir="$TMP/sft" \
    trainer.experiment_name=sft trainer.sft_warmup_steps=100 trainer.sft_warmup_lr=1e-3 \
    trainer.total_training_steps=1 trainer.save_freq=100 trainer.val_before_train=false >"$TMP/sft.log" 2>&1
expect "supervised warm-start in one process" $?
warm="$TMP/sft/p/sft/checkpoints/global_step_100/actor"
timeout "$(scaled 580)" mpirun --oversubscribe --bind-to none -np 2 "$WORKER" "${TASK[@]}" actor_rollout_ref.model.path="$warm" \
    trainer.default_local_dir="$TMP/grpo" trainer.experiment_name=async trainer.total_training_steps=40 \
    trainer.test_freq=20 actor_rollout_ref.actor.optim.lr=3e-4 trainer.nnodes=1 trainer.n_gpus_per_node=1 \
    rollout.nnodes=1 rollout.n_gpus_per_node=1 actor_rollout_ref.rollout.mode=async >"$TMP/grpo.log" 2>&1
expect "40 one-step-off GRPO steps with 1 rollout + 1 trainer rank" $?
python3 - "$TMP/grpo/p/async/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
val = {r["step"]: r["val-core/arithmetic/reward/mean@1"] for r in rows if "val-core/arithmetic/reward/mean@1" in r}
stale = [r["training/staleness"] for r in rows if r["step"] >= 2]
print("validation reward by step:", val, "staleness after step 1:", set(stale))
assert set(stale) == {1}, stale
rise = max(val[20], val[40]) - val[0]
assert rise >= 0.10, f"validation reward rose by {rise:.3f} only"
print(f"rise {rise:.3f}")
PY
expect "one-step-off GRPO raises the validation reward by at least 0.10" $?
finish "$TMP/grpo.log"
