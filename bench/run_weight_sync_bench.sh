#!/usr/bin/env bash
# The weight sync of a split run, both ways, in one run on this machine: the demo model (the bundled
# SmolLM2-135M-Instruct, 538 MB of FP32 weights) and the demo's task, 1 trainer + 2 rollout ranks on-policy,
# one thread each:
#   fetch      each rollout process downloads each policy version from the trainers' dispatcher over nanomsg
#              (actor_rollout_ref.rollout.weight_sync=fetch, the default);
#   broadcast  trainer rank 0 sends it to both in one broadcast over the collective plane (MPI here).
# Per way: the seconds a rollout process spends taking a version (its "policy version N: ... s" lines, versions
# after the first), the rollout ranks' wait for weights per step (timing_s/rollout_wait_weights), the step time,
# and broadcast / fetch ratios. The weights are bit-identical either way (tests/mpi/test_dist_bcast.sh).
#
#   bench/run_weight_sync_bench.sh            # STEPS=3
#   STEPS=4 BUCKET_MB=64 bench/run_weight_sync_bench.sh
#
# Results: $OUT (default build/bench-results/wsync-<time>/): the runs' directories and logs, and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-3}"
BUCKET_MB="${BUCKET_MB:-48}"
OUT="${OUT:-build/bench-results/wsync-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
. scripts/blas_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
hf="$(bench/demo_model_hf.sh)"
COMMON=(actor_rollout_ref.model.path="$hf" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
    trainer.test_freq=-1 trainer.save_freq=-1 trainer.project_name=bench trainer.log_level=debug
    placement.trainer_ranks=1 placement.rollout_ranks=2 actor_rollout_ref.rollout.mode=sync
    actor_rollout_ref.rollout.update_weights_bucket_megabytes="$BUCKET_MB")
for way in fetch broadcast; do
    echo "[bench] $way: 1 trainer + 2 rollout ranks, one thread each" >&2
    mpirun --oversubscribe --bind-to none -np 3 build/worker/grpo-worker "${COMMON[@]}" \
        actor_rollout_ref.rollout.weight_sync="$way" trainer.default_local_dir="$OUT/$way" >"$OUT/$way.log" 2>&1
done

python3 - "$OUT" "$(git rev-parse --short HEAD)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY' | tee "$OUT/summary.md"
import json, re, sys
out, rev, load = sys.argv[1:4]
print(f"Weight sync of the demo model, 1 trainer + 2 rollout ranks on-policy (commit {rev}, load {load})\n")
print("| way | versions taken | bytes each | s per version (rollout) | MB/s | rollout wait for weights (s/step) | step (s) |")
print("|---|---|---|---|---|---|---|")
res = {}
for way in ("fetch", "broadcast"):
    log = open(f"{out}/{way}.log").read()
    takes = [(int(v), int(b), float(s)) for v, b, s in
             re.findall(r"rollout: policy version (\d+): (\d+) bytes [^,]*, ([0-9.]+)s", log)]
    takes = [t for t in takes if t[0] >= 1]  # the first version arrives while the ranks start
    rows = [json.loads(l) for l in open(f"{out}/{way}/bench/demo/metrics.jsonl") if l.strip()][1:]
    mean = lambda xs: sum(xs) / len(xs)
    s = mean([t[2] for t in takes])
    wait = mean([r["timing_s/rollout_wait_weights"] for r in rows])
    step = mean([r["timing_s/step"] for r in rows])
    res[way] = (s, wait, step)
    print(f"| {way} | {len(takes)} | {takes[0][1]} | {s:.3f} | {takes[0][1] / s / 1e6:.0f} | {wait:.3f} | {step:.2f} |")
f, b = res["fetch"], res["broadcast"]
print(f"\nbroadcast / fetch: {f[0] / b[0]:.2f}x faster per version on a rollout rank, "
      f"wait for weights {f[1] / max(b[1], 1e-9):.2f}x shorter, step time ratio {b[2] / f[2]:.3f}")
PY
