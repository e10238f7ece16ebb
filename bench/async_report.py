#!/usr/bin/env python3
"""The table of bench/run_async_bench.sh: one row per layout (OUT/NAME/bench/demo/metrics.jsonl), over the steps
after the first (the first loads and warms up).

    async_report.py OUT COMMIT LOAD_BEFORE LOAD_AFTER NAME...

Per layout: mean step time; tokens/s of the whole job (every token of those steps over their wall time) and its ratio
to the first layout's; idle per rank over those steps: the trainer's wait for samples over its time
(timing_s/wait_data over timing_s/step, summed) and the rollout rank's wait for weights, grants or room over that wait
plus its generation and scoring (timing_s/rollout_wait_* over those and timing_s/gen, timing_s/reward, summed: the
per-step rollouter/idle_ratio's mean is biased where units do not line up with steps); the mean trajectory staleness (training/off_policy/trajectory_staleness/mean in pushes; one-step
-off's training/staleness) and the share of trajectories continued across a push (fully_async/partial/partial_ratio);
the whole run's wall time (OUT/wall.txt: start-up included)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_report import rows_of  # noqa: E402 (the same rows: steps after the first)


def main():
    out, rev, load0, load1, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
    wall = {}
    try:
        for line in open(f"{out}/wall.txt"):
            n, s = line.split()
            wall[n] = float(s)
    except OSError:
        pass
    runs = {n: rows_of(out, n) for n in names}
    first = min(r["step"] for r in runs[names[0]])
    last = max(r["step"] for r in runs[names[0]])
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"Steps {first}..{last} of each run (commit {rev}; CPU {cpu}; load average {load0} before, "
          f"{load1} after)\n")
    print("| layout | step time (s) | tokens/s | vs first row | trainer idle | rollout rank idle | staleness (mean) | "
          "trajectories continued | run wall time (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = None
    for name in names:
        rows = runs[name]
        mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
        tps = sum(r["perf/total_num_tokens"] for r in rows) / sum(r["timing_s/step"] for r in rows)
        base = base or tps
        fa = "fully_async/partial/partial_ratio" in rows[0]
        stale = mean("training/off_policy/trajectory_staleness/mean") if fa else mean("training/staleness")
        cont = f"{mean('fully_async/partial/partial_ratio'):.1%}" if fa else "-"
        w = f"{wall[name]:.1f}" if name in wall else "-"
        # idle over the whole job (the sums' ratio: a per-step ratio's mean is biased where units do not line up
        # with steps): the trainer's wait for samples over its time; the rollout rank's wait (for weights, grants,
        # room) over its wait plus its generation and scoring
        tot = lambda k: sum(r.get(k, 0.0) for r in rows)
        t_idle = tot("timing_s/wait_data") / tot("timing_s/step")
        r_wait = tot("timing_s/rollout_wait_weights") + tot("timing_s/rollout_wait_send")
        r_busy = tot("timing_s/gen") + tot("timing_s/reward")
        r_idle = r_wait / (r_wait + r_busy) if r_wait + r_busy > 0 else 0.0
        print(f"| {name} | {mean('timing_s/step'):.2f} | {tps:.1f} | {tps / base:.2f}x | "
              f"{t_idle:.1%} | {r_idle:.1%} | {stale:.2f} | {cont} | {w} |")


main()
