#!/usr/bin/env bash
# The flight recorder's cost (trainer.flight_recorder.size 256, the default, against 0: off), in one run on this
# machine, two ways:
#  - end to end: RUNS tiny runs each way, alternated (on, off, on, off, ...: a machine's drift hits both alike),
#    2 colocated ranks under mpirun, one thread each; per run the mean timing_s/step over its steps after the
#    first; the median run each way and their ratio;
#  - by its parts: the waits one step records (the workers' "waits recorded" line over the steps) times the
#    nanoseconds one record costs (build/bench/flight_bench), over the step's time: the cost the recorder adds,
#    which a loaded machine's noise in the end-to-end ratio can hide.
#
#   bench/run_flight_bench.sh                 # RUNS=3 STEPS=40
#   RUNS=5 STEPS=80 bench/run_flight_bench.sh
#
# Results: $OUT (default build/bench-results/flight-<time>/): the run directories and logs, and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-3}"
STEPS="${STEPS:-40}"
BUILD="${BUILD:-build}"
OUT="${OUT:-$BUILD/bench-results/flight-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TOK=tests/fixtures/tokenizers/bytes-chatml
"$BUILD/worker/grpo-model" init "$TOK/config.json" "$OUT/tiny" --tokenizer-from "$TOK" --seed 11 --std 0.1 \
    >"$OUT/init.log" 2>&1
COMMON=(actor_rollout_ref.model.path="$OUT/tiny" trainer.project_name=p trainer.experiment_name=e
    trainer.total_training_steps="$STEPS" trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=-1
    data.train_batch_size=4 actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=2
    data.max_response_length=12 data.synthetic.num_train=64 data.synthetic.num_val=2 trainer.nnodes=1
    trainer.n_gpus_per_node=2)
for i in $(seq "$RUNS"); do
    for v in on:256 off:0; do
        name="${v%%:*}-$i"
        echo "[bench] run $i, flight recorder ${v%%:*} (trainer.flight_recorder.size ${v#*:})" >&2
        mpirun --oversubscribe --bind-to none -np 2 "$BUILD/worker/grpo-worker" "${COMMON[@]}" \
            trainer.default_local_dir="$OUT/$name" trainer.flight_recorder.size="${v#*:}" >"$OUT/$name.log" 2>&1
    done
done
"$BUILD/bench/flight_bench" >"$OUT/flight_bench.txt"
python3 - "$OUT" "$RUNS" "$STEPS" "$(git rev-parse --short HEAD)" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY' | tee "$OUT/summary.md"
import json, re, statistics, sys
out, runs, steps, rev, load = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
def step_mean(name):
    rows = [json.loads(l) for l in open(f"{out}/{name}/p/e/metrics.jsonl") if l.strip()]
    rows = [r["timing_s/step"] for r in rows if r["step"] >= 2]
    return sum(rows) / len(rows)
on = [step_mean(f"on-{i}") for i in range(1, runs + 1)]
off = [step_mean(f"off-{i}") for i in range(1, runs + 1)]
recorded = []
for i in range(1, runs + 1):
    recorded += [int(m) for m in re.findall(r"\[rank \d+\] flight: (\d+) waits recorded", open(f"{out}/on-{i}.log").read())]
per_step = max(recorded) / steps if recorded else 0.0
bench = open(f"{out}/flight_bench.txt").read()
ns = float(re.search(r"ns_per_record ([0-9.]+)", bench).group(1))
med_on, med_off = statistics.median(on), statistics.median(off)
spread = (max(off) - min(off)) / med_off
parts = per_step * ns * 1e-9 / med_off
print(f"Flight recorder cost: {runs} tiny runs each way, alternated, 2 colocated ranks, {steps} steps, "
      f"timing_s/step over steps 2..{steps} (commit {rev}, load {load})\n")
print("| recorder | step time per run (s) | median (s) |")
print("|---|---|---|")
print(f"| on (size 256) | {', '.join(f'{x:.4f}' for x in on)} | {med_on:.4f} |")
print(f"| off (size 0) | {', '.join(f'{x:.4f}' for x in off)} | {med_off:.4f} |")
print(f"\nend to end: on / off = {med_on / med_off:.4f} (the off runs spread {spread:.1%} among themselves)")
print(f"by its parts: {per_step:.0f} waits recorded a step x {ns:.1f} ns a record = {per_step * ns / 1e3:.1f} us "
      f"a step, {parts:.4%} of the step")
print(f"\n{bench.splitlines()[0]}")
PY
