#!/usr/bin/env bash
# The DP gradient all-reduce overlapped with the backward against one all-reduce after it, in one run on this
# machine: 2 data-parallel trainer ranks + 1 rollout rank (on-policy) on the demo model and task, one thread each,
# actor_rollout_ref.actor.megatron.override_ddp_config.overlap_grad_reduce true (bucket_size BUCKET, default
# 10000000 parameters: several buckets on the 135M model) and false. Per run, over the steps after the first: the
# all-reduce time the update waited for (timing_s/grad_allreduce: with overlap, only the part the backward did
# not hide), the update's time and the step's.
#
#   bench/run_overlap_bench.sh              # STEPS=3
#   STEPS=4 BUCKET=40000000 bench/run_overlap_bench.sh
#
# Results: $OUT (default build/bench-results/overlap-<time>/): the run directories and logs, and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-3}"
BUCKET="${BUCKET:-10000000}"
OUT="${OUT:-build/bench-results/overlap-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
. scripts/blas_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
hf="$(bench/demo_model_hf.sh)"
COMMON=(actor_rollout_ref.model.path="$hf" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
    trainer.test_freq=-1 trainer.save_freq=-1 trainer.project_name=bench placement.trainer_ranks=2
    placement.rollout_ranks=1 +actor_rollout_ref.actor.megatron.override_ddp_config.bucket_size="$BUCKET")
for v in on:true off:false; do
    echo "[bench] overlap_grad_reduce=${v#*:}" >&2
    mpirun --oversubscribe --bind-to none -np 3 build/worker/grpo-worker "${COMMON[@]}" \
        trainer.default_local_dir="$OUT/${v%%:*}" \
        +actor_rollout_ref.actor.megatron.override_ddp_config.overlap_grad_reduce="${v#*:}" >"$OUT/${v%%:*}.log" 2>&1
done
python3 - "$OUT" "$STEPS" "$BUCKET" "$(git rev-parse --short HEAD)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY' | tee "$OUT/summary.md"
import json, sys
out, steps, bucket, rev, load = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
print(f"DP gradient all-reduce, 2 trainer ranks, steps 2..{steps} (bucket_size {bucket}; commit {rev}, load {load})\n")
print("| overlap_grad_reduce | all-reduce waited (s) | update (s) | step (s) |")
print("|---|---|---|---|")
res = {}
for name in ("on", "off"):
    rows = [json.loads(l) for l in open(f"{out}/{name}/bench/demo/metrics.jsonl") if l.strip()]
    rows = [r for r in rows if r["step"] >= 2]
    mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
    res[name] = (mean("timing_s/grad_allreduce"), mean("timing_s/update_actor"), mean("timing_s/step"))
    print(f"| {name} | {res[name][0]:.3f} | {res[name][1]:.2f} | {res[name][2]:.2f} |")
on, off = res["on"], res["off"]
print(f"\nwaited for the all-reduce: {on[0]:.3f} s with overlap, {off[0]:.3f} s without "
      f"({(off[0] - on[0]) / off[0]:.0%} hidden); update x{off[1] / on[1]:.2f}")
PY
