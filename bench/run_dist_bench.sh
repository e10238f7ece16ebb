#!/usr/bin/env bash
# The layouts issue 25 names, of the same GRPO run on this machine, in one run, on the demo model (the bundled
# SmolLM2-135M-Instruct) and the demo's task and settings:
#   one        one process (all roles), OpenBLAS on every core: the baseline;
#   colocated  2 hybrid ranks (trainer.nnodes=1 trainer.n_gpus_per_node=2, no rollout split): each generates its
#              share of the step, then both train data-parallel; one thread each;
#   split-sync 2 trainer ranks + 1 rollout rank (rollout.nnodes=1 rollout.n_gpus_per_node=1), on-policy
#              (actor_rollout_ref.rollout.mode=sync), one thread each (3 ranks on the cores);
#   split-async the same, one-step-off (rollout.mode=async).
# Per layout, over the steps after the first (the first loads and warms up): the mean step time, tokens/s of the
# whole job (every token of the step over the step's wall time), and idle per rank: the trainers' (colocated: every
# rank's) perf/idle_ratio, largest and mean over the ranks (waiting for data outside collectives, and every second
# inside one, i.e. waiting for peers), and the rollout rank's rollouter/idle_ratio; then where a step's time goes.
#
#   bench/run_dist_bench.sh                 # STEPS=4 steps per layout
#   STEPS=6 bench/run_dist_bench.sh
#   LAYOUTS="one colocated" bench/run_dist_bench.sh
#
# Results: $OUT (default build/bench-results/dist-<time>/): one run directory and log per layout, and
# summary.md, the table docs/results/performance.md quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-4}"
LAYOUTS="${LAYOUTS:-one colocated split-sync split-async}"
OUT="${OUT:-build/bench-results/dist-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
. scripts/blas_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
hf="$(bench/demo_model_hf.sh)"
COMMON=(actor_rollout_ref.model.path="$hf" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
    trainer.test_freq=-1 trainer.save_freq=-1 trainer.project_name=bench data.synthetic.num_val=16)
TRAINERS=(trainer.nnodes=1 trainer.n_gpus_per_node=2)
ROLLOUT=(rollout.nnodes=1 rollout.n_gpus_per_node=1)
cores="$(nproc --all)" # not plain nproc: it follows OMP_NUM_THREADS
load0="$(cut -d' ' -f1-3 /proc/loadavg)"
MPIRUN=(mpirun --oversubscribe --bind-to none)

for name in $LAYOUTS; do
    run=(trainer.default_local_dir="$OUT/$name")
    case "$name" in
    one)
        echo "[bench] one: 1 process, $cores threads" >&2
        OPENBLAS_NUM_THREADS="$cores" build/worker/grpo-worker "${COMMON[@]}" "${run[@]}" >"$OUT/$name.log" 2>&1 ;;
    colocated)
        echo "[bench] colocated: 2 hybrid ranks, 1 thread each" >&2
        OPENBLAS_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 build/worker/grpo-worker "${COMMON[@]}" "${run[@]}" \
            "${TRAINERS[@]}" >"$OUT/$name.log" 2>&1 ;;
    split-sync | split-async)
        echo "[bench] $name: 2 trainer ranks + 1 rollout rank, 1 thread each" >&2
        OPENBLAS_NUM_THREADS=1 "${MPIRUN[@]}" -np 3 build/worker/grpo-worker "${COMMON[@]}" "${run[@]}" \
            "${TRAINERS[@]}" "${ROLLOUT[@]}" actor_rollout_ref.rollout.mode="${name#split-}" >"$OUT/$name.log" 2>&1 ;;
    *) echo "run_dist_bench: unknown layout '$name' (one, colocated, split-sync, split-async)" >&2; exit 2 ;;
    esac
done

python3 bench/dist_report.py "$OUT" "$(git rev-parse --short HEAD)" "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    $LAYOUTS | tee "$OUT/summary.md"
