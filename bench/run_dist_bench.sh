#!/usr/bin/env bash
# Three layouts of the same GRPO run on this machine, in one run, on the demo model (the bundled
# SmolLM2-135M-Instruct) and the demo's task and settings:
#   hybrid   one process (all roles), OpenBLAS on every core;
#   sync     1 rollout + 1 trainer rank under mpirun, on-policy (rollout.mode=sync), one thread each;
#   async    1 rollout + 1 trainer rank, one-step-off (rollout.mode=async), one thread each;
#   async-dp2 1 rollout + 2 trainer ranks (data-parallel), one-step-off, one thread each (3 ranks on 2 cores).
# Per layout: mean step time and tokens/s over the steps after the first (the first loads and warms up),
# and each role's idle share (trainer/idle_ratio, rollouter/idle_ratio) from metrics.jsonl.
#
#   bench/run_dist_bench.sh                 # STEPS=4 steps per layout
#   STEPS=6 bench/run_dist_bench.sh
#
# Results: $OUT (default build/bench-results/dist-<time>/): one run directory and log per layout, and
# summary.md, the table docs/performance.md quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-4}"
OUT="${OUT:-build/bench-results/dist-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
. scripts/blas_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
hf="$(bench/demo_model_hf.sh)"
COMMON=(actor_rollout_ref.model.path="$hf" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
    trainer.test_freq=-1 trainer.save_freq=-1 trainer.project_name=bench)
cores="$(nproc --all)"  # not plain nproc: it follows OMP_NUM_THREADS

echo "[bench] hybrid: 1 process, $cores threads" >&2
OPENBLAS_NUM_THREADS="$cores" build/worker/grpo-worker "${COMMON[@]}" trainer.default_local_dir="$OUT/hybrid" \
    >"$OUT/hybrid.log" 2>&1
for layout in sync:1 async:1 async:2; do
    mode="${layout%:*}" trainers="${layout#*:}"
    name="$mode"; [ "$trainers" -gt 1 ] && name="$mode-dp$trainers"
    echo "[bench] $name: 1 rollout + $trainers trainer rank(s), 1 thread each" >&2
    OPENBLAS_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np $((trainers + 1)) build/worker/grpo-worker \
        "${COMMON[@]}" trainer.default_local_dir="$OUT/$name" placement.trainer_ranks="$trainers" \
        placement.rollout_ranks=1 actor_rollout_ref.rollout.mode="$mode" >"$OUT/$name.log" 2>&1
done

python3 - "$OUT" "$STEPS" "$(git rev-parse --short HEAD)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY' | tee "$OUT/summary.md"
import json, sys
out, steps, rev, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"Layouts of the demo run, steps 2..{steps} (commit {rev}, load {load})\n")
print("| layout | step time (s) | tokens/s | vs hybrid | trainer idle | rollout idle | gen (s) | update (s) |")
print("|---|---|---|---|---|---|---|---|")
base = None
for name in ("hybrid", "sync", "async", "async-dp2"):
    rows = [json.loads(l) for l in open(f"{out}/{name}/bench/demo/metrics.jsonl") if l.strip()]
    rows = [r for r in rows if r["step"] >= 2]
    mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
    st = mean("timing_s/step")
    tps = sum(r["perf/total_num_tokens"] for r in rows) / sum(r["timing_s/step"] for r in rows)  # whole run
    base = base or tps
    idle_t = f"{mean('trainer/idle_ratio'):.0%}" if "trainer/idle_ratio" in rows[0] else "-"
    idle_r = f"{mean('rollouter/idle_ratio'):.0%}" if "rollouter/idle_ratio" in rows[0] else "-"
    print(f"| {name} | {st:.1f} | {tps:.1f} | {tps / base:.2f}x | {idle_t} | {idle_r} | "
          f"{mean('timing_s/gen'):.1f} | {mean('timing_s/update_actor'):.1f} |")
PY
