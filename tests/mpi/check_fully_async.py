#!/usr/bin/env python3
"""Recompute a fully-async run's staleness and drop accounting in float64 from its audit files and its schedule,
and compare with its metrics (docs/training.md, "Fully-async training").

    check_fully_async.py RUN_DIR AUDIT_DIR PUSH_EVERY STALENESS_THRESHOLD N [--partial] [--dropped]

RUN_DIR holds metrics.jsonl and async_schedule.jsonl; AUDIT_DIR the audit files (STEP.jsonl). N is rollout.n.
Checked, step by step:
  - the schedule: each unit's staleness is the trainer's parameter version ((step - 1) // PUSH_EVERY) less its newest
    token's ((version) // PUSH_EVERY); a unit is dropped exactly when that exceeds ceil(STALENESS_THRESHOLD); a step
    takes data.train_batch_size / G units, G the groups of a unit;
  - the audit: every response's policy_versions (one a token, non-decreasing) against its unit's schedule entry (the
    step's groups are its taken units in stream order, G groups each): the tokens held at each phase's end equal the
    entry's; policy_version is the newest;
  - the metrics: training/off_policy/trajectory_staleness/{mean,max,min}, trajectory_staleness_worst/*,
    trajectory_spans/*, fully_async/partial/{total_partial_num,partial_ratio,max_partial_span},
    fully_async/count/{current_param_version,stale_trajectory_processed,stale_samples_processed,
    dropped_stale_samples}, recomputed within 1e-12.
--partial: some trajectory must span two versions or more; --dropped: some unit must have been dropped.
"""
import json
import math
import os
import sys


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = {a for a in sys.argv[1:] if a.startswith("--")}
    run, audit, T, s, n = args[0], args[1], int(args[2]), float(args[3]), int(args[4])
    bound = math.ceil(s)
    metrics = {}
    for line in open(os.path.join(run, "metrics.jsonl")):
        if line.strip():
            m = json.loads(line)
            metrics[m["step"]] = m
    sched = [json.loads(l) for l in open(os.path.join(run, "async_schedule.jsonl")) if l.strip()]
    by_step = {}
    for e in sched:
        by_step.setdefault(e["step"], []).append(e)
    stale_traj = stale_samples = dropped = 0
    any_partial = any_dropped = False
    steps = sorted(k for k in metrics if k > 0)
    assert steps, "no step in metrics.jsonl"
    for k in steps:
        P = (k - 1) // T
        entries = by_step.get(k, [])
        taken = []
        for e in entries:
            st = P - max(e["versions"]) // T
            assert e["staleness"] == st, (k, e["chunk"], e["unit"], e["staleness"], st)
            assert e["dropped"] == (st > bound), (k, e, bound)
            assert e["versions"] == sorted(set(e["versions"])), e["versions"]
            if e["dropped"]:
                any_dropped = True
            else:
                taken.append(e)
        lines = [json.loads(l) for l in open(os.path.join(audit, f"{k}.jsonl")) if l.strip()]
        groups = max(l["group"] for l in lines) + 1
        assert groups % len(taken) == 0, (k, groups, len(taken))
        G = groups // len(taken)
        for e in entries:
            if e["dropped"]:
                dropped += G
        taken.sort(key=lambda e: (e["chunk"], e["unit"]))
        st_all, wo_all, sp_all = [], [], []
        partial = max_span = 0
        per_seq = {}
        for l in lines:
            v = l["policy_versions"]
            assert len(v) == len(l["response_ids"]), (k, l["group"])
            assert all(a <= b for a, b in zip(v, v[1:])), (k, l["group"], v)
            assert l["policy_version"] == v[-1], (k, l["policy_version"], v[-1])
            lo, hi = v[0] // T, v[-1] // T
            st_all.append(float(P - hi))
            wo_all.append(float(P - lo))
            sp_all.append(float(hi - lo + 1))
            partial += hi != lo
            max_span = max(max_span, hi - lo)
            any_partial |= v[0] != v[-1]
            i, g = divmod(l["group"], G)
            per_seq.setdefault(i, []).append((g, l, v))
        for i, e in enumerate(taken):  # the unit's sequences against its schedule entry
            seqs = per_seq[i]
            assert len(seqs) == G * n, (k, i, len(seqs))
            # the tokens each sequence of the unit holds once each phase ends (sequences of a group in sample order:
            # their versions' counts are compared as a multiset within the group, the audit's order being the step's)
            for g in range(G):
                have = sorted(tuple(sum(1 for t in v if t <= ver) for ver in e["versions"])
                              for gg, l, v in seqs if gg == g)
                want = sorted(tuple(e["tokens"][p * G * n + g * n + smp] for p in range(len(e["versions"])))
                              for smp in range(n))
                assert have == want, (k, e["chunk"], e["unit"], g, have, want)
            if P - max(e["versions"]) // T >= 1:
                stale_samples += G
        stale_traj += sum(1 for x in st_all if x >= 1)
        m = metrics[k]
        nt = float(len(st_all))
        want = {
            "training/off_policy/trajectory_staleness/mean": sum(st_all) / nt,
            "training/off_policy/trajectory_staleness/max": max(st_all),
            "training/off_policy/trajectory_staleness/min": min(st_all),
            "training/off_policy/trajectory_staleness_worst/mean": sum(wo_all) / nt,
            "training/off_policy/trajectory_staleness_worst/max": max(wo_all),
            "training/off_policy/trajectory_staleness_worst/min": min(wo_all),
            "training/off_policy/trajectory_spans/mean": sum(sp_all) / nt,
            "training/off_policy/trajectory_spans/max": max(sp_all),
            "training/off_policy/trajectory_spans/min": min(sp_all),
            "fully_async/partial/total_partial_num": float(partial),
            "fully_async/partial/partial_ratio": partial / nt,
            "fully_async/partial/max_partial_span": float(max_span),
            "fully_async/count/current_param_version": float(P),
            "fully_async/count/stale_trajectory_processed": float(stale_traj),
            "fully_async/count/stale_samples_processed": float(stale_samples),
            "fully_async/count/dropped_stale_samples": float(dropped),
        }
        for key, x in want.items():
            got = m[key]
            if abs(got - x) > 1e-12 * max(1.0, abs(x)):
                sys.exit(f"step {k} {key}: metrics {got}, recomputed {x}")
        assert m["fully_async/count/total_generated_samples"] >= sum(
            G for kk in steps if kk <= k for _ in by_step.get(kk, [])), (k, m["fully_async/count/total_generated_samples"])
    if "--partial" in flags and not any_partial:
        sys.exit("no trajectory spans two versions (partial rollout never happened)")
    if "--dropped" in flags and not any_dropped:
        sys.exit("no unit was dropped")
    print(f"{len(steps)} steps: staleness, partial and drop accounting recomputed in float64 agree "
          f"({stale_traj} stale trajectories, {dropped} dropped prompts, partial rollout seen: {any_partial})")


main()
