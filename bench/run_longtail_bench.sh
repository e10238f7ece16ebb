#!/usr/bin/env bash
# The long tail of generation on colocated ranks, with and without work stealing (issue 25, item 3): colocated DP2
# (2 hybrid ranks, trainer.nnodes=1 trainer.n_gpus_per_node=2, one thread each) on the demo model, on a prompt set
# whose response lengths are skewed, once with placement.colocated_steal=true (the default: an engine that has
# finished its own work units takes the unstarted units of the engine with the most left) and once with false.
#
# The prompt set (written to $OUT/longtail.jsonl): blocks of four prompts, two that make the model write until
# data.max_response_length ("long") and two it answers in a few tokens ("short"), in the file's order
# (data.shuffle=false). A step draws one block (data.train_batch_size=4); with 4 work units of one group each, the
# first engine's own units are the two long groups and the second's the two short ones: the worst case, which
# stealing is for. The sampling temperature is 0.3: at 1.0 the demo model rambles on some samples of the short
# prompts too, and a group takes as long as its longest response. Without it the second engine waits for the first's two long groups; with it, the second takes
# the first's second long group once its short ones are done.
#
#   bench/run_longtail_bench.sh            # STEPS=4, LEN=96 (data.max_response_length)
#   SURVIVE=1 bench/run_longtail_bench.sh  # on build-ft's worker under scripts/mpirun_ft: stealing with the key off
#                                          # (the shared table), with trainer.survive_trainer_loss=true (each host's
#                                          # lock-free ledger), and the key on without stealing
#
# Results: $OUT (default build/bench-results/longtail-<time>/): steal/ and nosteal/ run directories, their logs,
# and summary.md: step time, per-rank idle, the wait for the slowest engine, units stolen, and the response
# lengths (min / max / mean) that show the skew.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-4}"
LEN="${LEN:-96}"
OUT="${OUT:-build/bench-results/longtail-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
. scripts/blas_env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
hf="$(bench/demo_model_hf.sh)"

python3 - "$OUT/longtail.jsonl" "$STEPS" <<'PY'
import json, sys
long = ["Write a long story about a cat who sails around the world. Describe every port, the weather and the food.",
        "Explain in detail how a steam engine works, step by step, with its history and its uses."]
short = ["What is 2 + 2? Reply with just the number.", "What is the capital of France? One word."]
with open(sys.argv[1], "w") as f:
    for step in range(int(sys.argv[2]) + 1):
        for p, gt in [(long[0], "0"), (long[1], "0"), (short[0], "4"), (short[1], "Paris")]:
            f.write(json.dumps({"data_source": "arithmetic", "prompt": p, "ground_truth": gt}) + "\n")
PY

COMMON=(actor_rollout_ref.model.path="$hf" trainer.total_training_steps="$STEPS" trainer.val_before_train=false
    trainer.test_freq=-1 trainer.save_freq=-1 trainer.project_name=bench data.synthetic.num_val=8
    data.train_files="$OUT/longtail.jsonl" data.shuffle=false data.train_batch_size=4 data.max_response_length="$LEN"
    actor_rollout_ref.rollout.temperature=0.3 placement.colocated_units=4 trainer.nnodes=1 trainer.n_gpus_per_node=2)
load0="$(cut -d' ' -f1-3 /proc/loadavg)"
# run NAME STEAL [KEYS...]: one colocated DP2 run
run() {
    local name="$1" steal="$2"
    shift 2
    echo "[bench] $name: colocated DP2, placement.colocated_steal=$steal $*" >&2
    "${LAUNCH[@]}" -np 2 "$WORKER" "${COMMON[@]}" placement.colocated_steal="$steal" "$@" \
        trainer.default_local_dir="$OUT/$name" >"$OUT/$name.log" 2>&1
}
if [ "${SURVIVE:-0}" = 1 ]; then
    LAUNCH=(scripts/mpirun_ft --oversubscribe --bind-to none) WORKER=grpo-worker # build-ft's (scripts/mpirun_ft)
    run steal true
    run steal-key true trainer.survive_trainer_loss=true
    run nosteal-key false trainer.survive_trainer_loss=true
    NAMES=(steal steal-key nosteal-key)
else
    LAUNCH=(mpirun --oversubscribe --bind-to none) WORKER=build/worker/grpo-worker
    run steal true
    run nosteal false
    NAMES=(steal nosteal)
fi

python3 bench/dist_report.py "$OUT" "$(git rev-parse --short HEAD)" "$load0" "$(cut -d' ' -f1-3 /proc/loadavg)" \
    "${NAMES[@]}" --longtail | tee "$OUT/summary.md"
