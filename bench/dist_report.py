#!/usr/bin/env python3
"""The table of bench/run_dist_bench.sh and bench/run_longtail_bench.sh: one row per layout (a run directory
OUT/NAME/bench/demo/metrics.jsonl), over the steps after the first (the first loads and warms up).

    dist_report.py OUT COMMIT LOAD_BEFORE LOAD_AFTER NAME...   [--longtail]

Per layout: mean step time; tokens/s of the whole job (every token of those steps over their wall time); idle per
rank: perf/idle_ratio's largest and mean over the trainer (colocated: every) rank, and the rollout rank's
rollouter/idle_ratio, each the mean over the steps; generation (the slowest engine) and update seconds; for
colocated runs the long tail of generation: colocated/gen_wait_peers_s (the longest any rank waited for the slowest
engine), colocated/gen_imbalance, colocated/units_stolen. With --longtail also the response lengths (min, max,
mean over those steps' sequences), which show how skewed the prompt set is."""
import json
import os
import sys


def rows_of(out, name):
    path = f"{out}/{name}/bench/demo/metrics.jsonl"
    try:
        rows = [json.loads(line) for line in open(path) if line.strip()]
    except OSError as e:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {name}: no metrics ({e}); see {out}/{name}.log")
    rows = [r for r in rows if r["step"] >= 2 and "timing_s/step" in r]
    if not rows:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {name}: no step after the first in {path}; see {out}/{name}.log")
    return rows


def pct(rows, key):
    if key not in rows[0]:
        return "-"
    return f"{sum(r[key] for r in rows) / len(rows):.1%}"


def main():
    args = [a for a in sys.argv[1:] if a != "--longtail"]
    longtail = "--longtail" in sys.argv
    out, rev, load0, load1, names = args[0], args[1], args[2], args[3], args[4:]
    runs = {n: rows_of(out, n) for n in names}
    first = min(r["step"] for r in runs[names[0]])
    last = max(r["step"] for r in runs[names[0]])
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"Steps {first}..{last} of each run (commit {rev}; CPU {cpu}; load average {load0} before, "
          f"{load1} after)\n")
    print("| layout | step time (s) | tokens/s | vs first row | idle max (trainer/hybrid ranks) | idle mean | "
          "rollout rank idle | gen (s) | update (s) | gen wait for peers (s) | gen imbalance | units stolen |"
          + (" response length min / max / mean |" if longtail else ""))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if longtail else ""))
    base = None
    for name in names:
        rows = runs[name]
        mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
        tps = sum(r["perf/total_num_tokens"] for r in rows) / sum(r["timing_s/step"] for r in rows)
        base = base or tps
        colo = "colocated/units" in rows[0]
        extra = (f"{mean('colocated/gen_wait_peers_s'):.2f} | {mean('colocated/gen_imbalance'):.2f} | "
                 f"{sum(r['colocated/units_stolen'] for r in rows):.0f} of "
                 f"{sum(r['colocated/units'] for r in rows):.0f}") if colo else "- | - | -"
        line = (f"| {name} | {mean('timing_s/step'):.2f} | {tps:.1f} | {tps / base:.2f}x | "
                f"{pct(rows, 'perf/idle_ratio/max')} | {pct(rows, 'perf/idle_ratio/mean')} | "
                f"{pct(rows, 'rollouter/idle_ratio')} | {mean('timing_s/gen'):.2f} | {mean('timing_s/update_actor'):.2f} | "
                f"{extra} |")
        if longtail:
            n = sum(1 for _ in rows)
            line += (f" {min(r['response_length/min'] for r in rows):.0f} / "
                     f"{max(r['response_length/max'] for r in rows):.0f} / "
                     f"{sum(r['response_length/mean'] for r in rows) / n:.1f} |")
        print(line)


if __name__ == "__main__":
    main()
