#!/usr/bin/env bash
# What keeping freed big blocks in the process saves a CPU step (kernels/cpu/backend.c; docs/scaling.md, "Memory
# kept between the phases"): the demo model (134.5 M parameters) in one process, its default
# rollout.free_cache_engine=true (the gradients and training buffers freed before each generation, made again in the
# update), ROUNDS runs of each in turn:
#  - off: GRPO_CPU_KEEP_FREED=0, every freed big block unmapped (what glibc's free did), so the update maps and
#    faults its memory in again every step;
#  - on: the default, freed big blocks kept for the next allocation they fit.
# Each run's mean timing_s/step and timing_s/update_actor over the steps after the first, its minor page faults and
# its peak resident memory (GNU time), and on / off.
#
#   bench/run_alloc_bench.sh                 # STEPS=4 ROUNDS=2
#
# Results: $OUT (default build/bench-results/alloc-<time>/): the runs, their logs and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-4}" ROUNDS="${ROUNDS:-2}"
OUT="${OUT:-$PWD/build/bench-results/alloc-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
[ -x /usr/bin/time ] || { echo "[bench] needs GNU time (/usr/bin/time: apt-get install time)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
. scripts/blas_env.sh
MODEL="$(bench/demo_model_hf.sh)"
run() { # NAME KEEP
    local name=$1
    GRPO_CPU_KEEP_FREED=$2 /usr/bin/time -f "%R %M" -o "$OUT/$name.time" build/worker/grpo-worker \
        actor_rollout_ref.model.path="$MODEL" trainer.project_name=p trainer.experiment_name=e \
        trainer.total_training_steps="$STEPS" trainer.val_before_train=false trainer.test_freq=-1 \
        trainer.save_freq=-1 data.train_batch_size=4 actor_rollout_ref.rollout.n=2 data.max_response_length=32 \
        data.synthetic.num_val=8 trainer.default_local_dir="$OUT/$name" >"$OUT/$name.log" 2>&1
    rm -rf "$OUT/$name/p/e/checkpoints" # the final checkpoint: 1.6 GB a run, read by nothing here
}
for r in $(seq 1 "$ROUNDS"); do
    echo "[bench] round $r: off, then on" >&2
    run "off$r" 0
    run "on$r" 1
done
python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/summary.md"
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def of(name):
    rs = [json.loads(l) for l in open(f"{out}/{name}/p/e/metrics.jsonl")]
    later = [r for r in rs if r["step"] > 1]
    mean = lambda k: sum(r[k] for r in later) / len(later)
    faults, rss = open(f"{out}/{name}.time").read().split()[-2:]
    return mean("timing_s/step"), mean("timing_s/update_actor"), int(faults), int(rss) / 1e6
print("| run | step (s) | update (s) | minor page faults (run) | peak RSS (GB) |")
print("|---|---|---|---|---|")
tot = {"off": [0, 0], "on": [0, 0]}
for r in range(1, rounds + 1):
    for k in ("off", "on"):
        s, u, f, m = of(f"{k}{r}")
        tot[k][0] += s
        tot[k][1] += u
        print(f"| {k}{r} | {s:.3f} | {u:.3f} | {f} | {m:.2f} |")
print()
print(f"on / off: step {tot['on'][0] / tot['off'][0]:.3f}, update {tot['on'][1] / tot['off'][1]:.3f} "
      f"(the means over {rounds} round(s), steps 2 on)")
PY
