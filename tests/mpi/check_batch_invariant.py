"""check_batch_invariant.py on|onpol|off|skip RUN_DIR AUDIT_DIR STEPS [REF_RUN_DIR]: a run's rollout log-probs against the
trainer's old log-probs, from its audit files (trainer.rollout_data_dir), and its metrics.jsonl's mismatch metrics
against the same figures recomputed here in float64 from those files.

  on:   batch-invariant mode: every response token's old log-prob equals the sampler's bit for bit (both are float32,
        printed round-trip), and training/rollout_probs_diff_max and _mean, rollout_corr/kl, k3_kl, log_ppl_diff,
        log_ppl_abs_diff are exactly 0, as recomputed (chi2_token is verl's T / (T + 1e-8) - 1 of ratios all 1); the old-log-prob pass ran (timing_s/old_log_prob
        > 0).
  onpol: as on, for a step of one optimizer step (on policy): the update's forward gives the old log-probs, no pass.
  off:  the mode off: some token differs, and training/rollout_probs_diff_max is the largest |difference| recomputed
        here, training/rollout_probs_diff_mean their mean, both nonzero.
  skip: use_rollout_log_probs=true in the mode: no old-log-prob pass (timing_s/old_log_prob 0), and every metric that
        is not a time (losses, gradient norms, advantages, the mismatch metrics) is REF_RUN_DIR's (the same run with
        the pass) bit for bit (actor/, training/, rollout_corr/, critic/: the losses, gradient norms, advantages and
        mismatch metrics): skipping the pass changed nothing.
"""
import json
import sys

mode, run_dir, audit_dir, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ref_dir = sys.argv[5] if len(sys.argv) > 5 else None


def fail(msg):
    print("FAIL", msg)
    sys.exit(1)


def metrics_of(d):
    out = {}
    for line in open(f"{d}/metrics.jsonl"):
        if line.strip():
            r = json.loads(line)
            out[r["step"]] = r
    return out


# what the update computes (not times, memory or the machine's load)
COMPARED = ("actor/", "training/", "rollout_corr/", "critic/", "response_length/", "prompt_length/")
metrics = metrics_of(run_dir)
ref = metrics_of(ref_dir) if ref_dir else None
tokens = differ = 0
for k in range(1, steps + 1):
    m = metrics.get(k)
    if m is None:
        fail(f"step {k}: no metrics")
    rows = [json.loads(l) for l in open(f"{audit_dir}/{k}.jsonl") if l.strip()]
    if not rows:
        fail(f"step {k}: no audit rows")
    gaps = []
    for i, r in enumerate(rows):
        old, roll = r["old_log_probs"], r["rollout_log_probs"]
        mask = r.get("response_mask", [1] * len(r["response_ids"]))
        if len(old) != len(roll) or len(old) != len(r["response_ids"]):
            fail(f"step {k} row {i}: {len(old)} old and {len(roll)} rollout log-probs for {len(r['response_ids'])} tokens")
        for t, (a, b) in enumerate(zip(old, roll)):
            if not mask[t]:
                continue
            tokens += 1
            gaps.append(abs(float(b) - float(a)))
            if a != b:
                differ += 1
                if mode in ("on", "onpol", "skip"):
                    fail(f"step {k} row {i} token {t}: old log-prob {a!r} != rollout log-prob {b!r}")
    gmax = max(gaps) if gaps else 0.0
    gmean = sum(gaps) / len(gaps) if gaps else 0.0
    got_max, got_mean = m["training/rollout_probs_diff_max"], m["training/rollout_probs_diff_mean"]
    if mode in ("on", "onpol", "skip"):
        for key in ("training/rollout_probs_diff_max", "training/rollout_probs_diff_mean", "rollout_corr/kl",
                    "rollout_corr/k3_kl", "rollout_corr/log_ppl_diff", "rollout_corr/log_ppl_abs_diff"):
            if key not in m:
                fail(f"step {k}: no {key} in metrics.jsonl")
            if m[key] != 0:
                fail(f"step {k}: {key} = {m[key]!r}, not exactly 0")
        if gmax != 0:
            fail(f"step {k}: recomputed gap {gmax}")
        # verl's masked mean divides by the tokens + 1e-8: every ratio 1 gives T / (T + 1e-8) - 1, not 0
        want = len(gaps) / (len(gaps) + 1e-8) - 1.0
        if abs(m["rollout_corr/chi2_token"] - want) > 1e-15:
            fail(f"step {k}: rollout_corr/chi2_token {m['rollout_corr/chi2_token']!r}, want {want!r} (every ratio 1)")
    else:
        if not (abs(got_max - gmax) <= 1e-12 * max(1.0, gmax)):
            fail(f"step {k}: training/rollout_probs_diff_max {got_max!r}, recomputed {gmax!r}")
        if not (abs(got_mean - gmean) <= 1e-9 * max(gmean, 1e-30)):
            fail(f"step {k}: training/rollout_probs_diff_mean {got_mean!r}, recomputed {gmean!r}")
        if gmax == 0 or m["rollout_corr/kl"] == 0:
            fail(f"step {k}: no difference with the mode off (diff_max {gmax}, kl {m['rollout_corr/kl']})")
    t_old = m.get("timing_s/old_log_prob", 0)
    if mode == "skip":
        if t_old != 0:
            fail(f"step {k}: timing_s/old_log_prob {t_old}: the pass ran")
        rm = ref.get(k) if ref else None
        if rm is None:
            fail(f"step {k}: no reference metrics")
        if rm.get("timing_s/old_log_prob", 0) <= 0:
            fail(f"step {k}: the reference run had no old-log-prob pass")
        compared = 0
        for key, v in rm.items():
            if not key.startswith(COMPARED) or not isinstance(v, (int, float)):
                continue
            if key not in m or m[key] != v:
                fail(f"step {k}: {key} = {m.get(key)!r} without the pass, {v!r} with it")
            compared += 1
        if compared < 20:
            fail(f"step {k}: only {compared} metrics compared")
    elif mode == "on" and t_old <= 0:
        fail(f"step {k}: no old-log-prob pass (timing_s/old_log_prob {t_old})")
    elif mode == "onpol" and t_old != 0:
        fail(f"step {k}: an old-log-prob pass on policy (timing_s/old_log_prob {t_old})")
print(f"{mode}: {steps} steps, {tokens} response tokens, {differ} differ")
