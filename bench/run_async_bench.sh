#!/usr/bin/env bash
# Fully-async training against one-step-off and on-policy, in one run, on the demo model (the bundled
# SmolLM2-135M-Instruct) with the demo's task and settings (4 prompts x 8 responses a step, 24 tokens at most), one
# trainer rank and one rollout rank (the two cores), one thread each:
#   on-policy     actor_rollout_ref.rollout.mode=sync: step k is generated with the weights after step k-1;
#   one-step-off  rollout.mode=async: the rollout of step k+1 overlaps the training of step k;
#   fully-async   async_training.staleness_threshold=1, trigger_parameter_sync_step=1, partial rollout: the rollout
#                 rank streams up to (1+1) x 4 prompts a push, a push every step;
#   fully-async-t2  staleness_threshold=0.5, a push every 2 steps (require_batches 1), partial rollout.
# Per layout, over the steps after the first (the first loads and warms up): the mean step time, tokens/s of the
# whole job (every token of those steps over their wall time), and idle per rank: the trainer's
# (trainer/idle_ratio: waiting for samples over the step) and the rollout rank's (rollouter/idle_ratio: waiting for
# weights or for room, over its time), the means over the steps; the mean trajectory staleness (in pushes) and the
# share of trajectories continued across a push.
#
#   bench/run_async_bench.sh                          # STEPS=8 steps per layout
#   STEPS=12 LAYOUTS="on-policy fully-async" bench/run_async_bench.sh
#
# Results: $OUT (default build/bench-results/async-<time>/): one run directory and log per layout, and summary.md,
# the table docs/results/performance.md quotes.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-8}"
LAYOUTS="${LAYOUTS:-on-policy one-step-off fully-async fully-async-t2}"
OUT="${OUT:-build/bench-results/async-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
. scripts/blas_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
hf="$(bench/demo_model_hf.sh)"
COMMON=(actor_rollout_ref.model.path="$hf" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
    trainer.test_freq=-1 trainer.save_freq=-1 trainer.project_name=bench data.synthetic.num_val=16
    placement.trainer_ranks=1 placement.rollout_ranks=1)
FA=(data.train_batch_size=0 async_training.require_batches=1 async_training.partial_rollout=true)
load0="$(cut -d' ' -f1-3 /proc/loadavg)"
MPIRUN=(mpirun --oversubscribe --bind-to none)

for name in $LAYOUTS; do
    case "$name" in
    on-policy) extra=(actor_rollout_ref.rollout.mode=sync) ;;
    one-step-off) extra=(actor_rollout_ref.rollout.mode=async) ;;
    fully-async) extra=("${FA[@]}" async_training.staleness_threshold=1 async_training.trigger_parameter_sync_step=1) ;;
    fully-async-t2)
        extra=("${FA[@]}" async_training.staleness_threshold=0.5 async_training.trigger_parameter_sync_step=2) ;;
    *) echo "run_async_bench: unknown layout '$name' (on-policy, one-step-off, fully-async, fully-async-t2)" >&2
       exit 2 ;;
    esac
    echo "[bench] $name: 1 trainer rank + 1 rollout rank, 1 thread each" >&2
    t0=$(date +%s%N)
    rc=0
    "${MPIRUN[@]}" -np 2 build/worker/grpo-worker "${COMMON[@]}" trainer.default_local_dir="$OUT/$name" \
        "${extra[@]}" >"$OUT/$name.log" 2>&1 || rc=$?
    # a run that fails after its steps (a loaded machine can starve a rank's pings) still has its metrics
    [ "$rc" -eq 0 ] || echo "[bench] $name: mpirun exit $rc (see $OUT/$name.log)" >&2
    echo "$name $((($(date +%s%N) - t0) / 1000000))e-3" >>"$OUT/wall.txt"
done

# shellcheck disable=SC2086 # LAYOUTS: words
python3 bench/async_report.py "$OUT" "$(git rev-parse --short HEAD)" "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    $LAYOUTS | tee "$OUT/summary.md"
