#!/usr/bin/env bash
# Batch-invariant mode's cost and use_rollout_log_probs' gain, in one run on this machine: one process on the demo
# model and task, two mini-batches a step (so the old log-probs take a pass of their own), three configurations
# run one after the other, ROUNDS times in turn:
#   default   actor_rollout_ref.model.batch_invariant=false (the old-log-prob pass runs; its log-probs differ from
#             the rollout's by rounding)
#   mode      batch_invariant=true (the pass runs; its log-probs are the rollout's bit for bit)
#   mode+skip batch_invariant=true, actor.use_rollout_log_probs=true (no pass: the rollout's log-probs are the old
#             ones, exactly)
# Per configuration, over steps 2..STEPS of every round: the mean step time and its phases (generation, old log-probs,
# update); the ratios mode / default (the mode's cost) and mode+skip / default (the speed-up). Nothing is asserted.
#
#   bench/run_batch_invariant_bench.sh              # STEPS=4 ROUNDS=1
#   STEPS=6 ROUNDS=2 RESPONSE=128 bench/run_batch_invariant_bench.sh
#
# Results: $OUT (default build/bench-results/batch-invariant-<time>/): the run directories and logs, and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-4}"
ROUNDS="${ROUNDS:-1}"
RESPONSE="${RESPONSE:-64}"
OUT="${OUT:-build/bench-results/batch-invariant-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
. scripts/blas_env.sh
hf="$(bench/demo_model_hf.sh)"
COMMON=(actor_rollout_ref.model.path="$hf" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
    trainer.test_freq=-1 trainer.save_freq=-1 trainer.project_name=bench data.train_batch_size=4
    actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length="$RESPONSE")
for round in $(seq 1 "$ROUNDS"); do
    for v in "default:false:false" "mode:true:false" "mode+skip:true:true"; do
        IFS=: read -r name bi skip <<<"$v"
        echo "[bench] round $round: $name" >&2
        build/worker/grpo-worker "${COMMON[@]}" trainer.default_local_dir="$OUT/$name-$round" \
            trainer.experiment_name=e actor_rollout_ref.model.batch_invariant="$bi" \
            actor_rollout_ref.actor.use_rollout_log_probs="$skip" >"$OUT/$name-$round.log" 2>&1
        rm -rf "$OUT/$name-$round/bench/e/checkpoints" # the final checkpoint: 1.5 GB a run, never read here
    done
done
python3 - "$OUT" "$STEPS" "$ROUNDS" "$RESPONSE" "$(git rev-parse --short HEAD)" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)" <<'PY' | tee "$OUT/summary.md"
import json, sys
out, steps, rounds, resp, rev, load, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
print(f"Batch-invariant mode, one process, demo model, 4 prompts x 8 responses of up to {resp} tokens, 2 mini-batches;")
print(f"steps 2..{steps} of {rounds} round(s) (commit {rev}, {cpu.strip()}, load at the end {load})\n")
print("| configuration | step (s) | generation (s) | old log-probs (s) | update (s) | rollout_probs_diff_max |")
print("|---|---|---|---|---|---|")
res = {}
for name in ("default", "mode", "mode+skip"):
    rows = []
    for r in range(1, rounds + 1):
        rows += [json.loads(l) for l in open(f"{out}/{name}-{r}/bench/e/metrics.jsonl") if l.strip()]
    rows = [x for x in rows if x["step"] >= 2]
    mean = lambda k: sum(x.get(k, 0.0) for x in rows) / len(rows)
    res[name] = mean("timing_s/step")
    dmax = max(x.get("training/rollout_probs_diff_max", 0.0) for x in rows)
    print(f"| {name} | {res[name]:.2f} | {mean('timing_s/gen'):.2f} | {mean('timing_s/old_log_prob'):.2f} | "
          f"{mean('timing_s/update_actor'):.2f} | {dmax:.3g} |")
d = res["default"]
print(f"\nmode / default: {res['mode'] / d:.3f} (the mode's cost: {res['mode'] / d - 1:+.1%} of the step); "
      f"mode+skip / default: {res['mode+skip'] / d:.3f} (step x{d / res['mode+skip']:.2f})")
PY
