"""check_offpolicy.py RUN_DIR AUDIT_DIR STEPS [key=value ...]: recompute, in float64 from a run's rollout audit files
(trainer.rollout_data_dir), what verl v0.9 computes for the keys given (the run's own overrides; the rest at their
defaults) and compare with what the run wrote:

  - rollout correction (algorithm.rollout_correction.*, decoupled mode): every token's IS weight (TIS or IcePop,
    token or sequence level, batch-normalised), the rejection mask of the rollout_rs options, and every
    rollout_corr/ metric of metrics.jsonl, from the audit's old and rollout log-probs (rollout_corr_helper.py's
    formulas, transcribed here on per-sequence lists);
  - the advantages of algorithm.adv_estimator on every token (core_algos.py's estimators), from the rewards, the
    groups and the response masks narrowed by the rejection; remax's from each line's reward_baseline, the optimal
    token baselines' from its old log-probs, sum_pi_squared and IS weights, gdpo's from its reward components (the
    fields algorithm.gdpo_reward_keys names), and gdpo's gdpo/<key>/ metrics;
  - actor/pg_loss of a step that makes one optimizer step (one mini-batch, ppo_epochs 1), for
    actor_rollout_ref.actor.policy_loss.loss_mode: the loss at the old policy (ratio 1, the current log-probs equal
    to the old ones within the trainer's rounding), aggregated by loss_agg_mode (or the mode's own), with the IS
    weights; clip_cov's share of cut tokens when every candidate is cut (clip_cov_ratio large); bypass mode's loss
    against the rollout log-probs.

check_pg_loss=0 skips the loss; require_mixed=1 fails unless the rejection both rejected and kept tokens;
require_holes=1 fails unless a response of a group of several has a token out of the loss before one in it (where
the optimal token baseline's two forms differ) and a group's single longest response lost its baseline past the
second-longest's length (handle_zero_tail).

Exit 1 naming the first difference. Written from verl's code, not from this project's C."""
import json
import math
import sys

run_dir, audit_dir, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
kv = dict(a.lstrip("+").split("=", 1) for a in sys.argv[4:])


def get(key, default):
    v = kv.get(key, default)
    return None if v in (None, "null", "None", "") else v


EST = get("algorithm.adv_estimator", "grpo")
NORM = get("algorithm.norm_adv_by_std_in_grpo", "true") == "true"
GAMMA = float(get("algorithm.gamma", "1.0"))
MODE = get("actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla")
AGG = get("actor_rollout_ref.actor.loss_agg_mode", "token-mean")
CLIP = float(get("actor_rollout_ref.actor.clip_ratio", "0.2"))
CLIP_LO = float(get("actor_rollout_ref.actor.clip_ratio_low", CLIP))
CLIP_HI = float(get("actor_rollout_ref.actor.clip_ratio_high", CLIP))
TAU_POS = float(get("actor_rollout_ref.actor.tau_pos", "1.0"))
TAU_NEG = float(get("actor_rollout_ref.actor.tau_neg", "1.05"))
CC_RATIO = float(get("actor_rollout_ref.actor.policy_loss.clip_cov_ratio", "0.0002"))
CC_LB = float(get("actor_rollout_ref.actor.policy_loss.clip_cov_lb", "1.0"))
CC_UB = float(get("actor_rollout_ref.actor.policy_loss.clip_cov_ub", "5.0"))
MAXLEN = int(get("actor_rollout_ref.actor.loss_scale_factor", None) or get("data.max_response_length", "24"))
RC = "algorithm.rollout_correction."
IS = get(RC + "rollout_is", None)
IS_T = get(RC + "rollout_is_threshold", "2.0")
IS_NORM = get(RC + "rollout_is_batch_normalize", "false") == "true"
RS = get(RC + "rollout_rs", None)
RS_T = get(RC + "rollout_rs_threshold", None)
BYPASS = get(RC + "bypass_mode", "false") == "true"
GDPO_KEYS = [k.strip().strip("'\"") for k in (get("algorithm.gdpo_reward_keys", "") or "").strip("[]").split(",")
             if k.strip()]
GDPO_W = [float(w) for w in (get("algorithm.gdpo_reward_weights", "") or "").strip("[]").split(",") if w.strip()]
LOSS_TYPE = get(RC + "loss_type", "ppo_clip")
SAFETY = 20.0


def fail(msg):
    sys.exit(msg)


def close(a, b, rel, ab=0.0):
    return abs(a - b) <= ab + rel * max(abs(a), abs(b))


def clamp(x, lo, hi):
    return max(lo, min(hi, x))


# ------------------------------------------------------------------ rollout_corr_helper.py on lists of sequences
def mmean_seq(vals, mask):  # verl_F.masked_mean(values, mask, axis=-1)
    return sum(v for v, m in zip(vals, mask) if m) / (sum(mask) + 1e-8)


def rollout_correction(old, roll, mask):
    """IS weights (None when off), the rejection's kept mask (None when off), and the metrics, verl's order."""
    n = len(old)
    T = sum(sum(m) for m in mask)
    lr = [[o - r for o, r in zip(old[i], roll[i])] for i in range(n)]

    def tmean(vals):  # masked_mean over the batch's tokens
        return sum(v for i in range(n) for v, m in zip(vals[i], mask[i]) if m) / (T + 1e-8)

    metrics = {}
    weights = None
    if IS is not None:
        spec = str(IS_T)
        if "_" in spec:
            lo, up = (float(x) for x in spec.split("_", 1))
        else:
            lo, up = None, float(spec)
        icepop = lo is not None
        if IS == "token":
            lr_for_metrics = lr
            raw = [[math.exp(clamp(x, -SAFETY, SAFETY)) for x in row] for row in lr]
        else:
            lr_for_metrics = [sum(x for x, m in zip(lr[i], mask[i]) if m) for i in range(n)]
            raw = [[math.exp(clamp(lr_for_metrics[i], -SAFETY, SAFETY))] * len(lr[i]) for i in range(n)]
        raw = [[w * m for w, m in zip(raw[i], mask[i])] for i in range(n)]
        if not icepop:
            w = [[min(x, up) for x in row] for row in raw]
        else:
            w = [[x if lo <= x <= up else 0.0 for x in row] for row in raw]
        lo_m = 1.0 / up if lo is None else lo
        if IS == "sequence":
            metrics["rollout_is_max"] = math.exp(min(max(lr_for_metrics), SAFETY))
            metrics["rollout_is_min"] = math.exp(min(lr_for_metrics))
            metrics["rollout_is_mean"] = tmean(w)
            metrics["rollout_is_ratio_fraction_high"] = sum(x > math.log(up) for x in lr_for_metrics) / n
            metrics["rollout_is_ratio_fraction_low"] = sum(x < math.log(lo_m) for x in lr_for_metrics) / n
        else:
            metrics["rollout_is_mean"] = tmean(w)
            metrics["rollout_is_ratio_fraction_high"] = tmean([[float(x > up) for x in row] for row in raw])
            metrics["rollout_is_ratio_fraction_low"] = tmean([[float(x < lo_m) for x in row] for row in raw])
            vals = [x for i in range(n) for x, m in zip(w[i], mask[i]) if m]
            metrics["rollout_is_max"] = max(vals)
            metrics["rollout_is_min"] = min(vals)
        wc = [[clamp(x, 0.0, up) for x in row] for row in w]
        if T > 1:
            e1 = tmean(wc)
            e2 = tmean([[x * x for x in row] for row in wc])
            metrics["rollout_is_std"] = math.sqrt(max(e2 - e1 * e1, 0.0))
        else:
            metrics["rollout_is_std"] = 0.0
        me = tmean(wc)
        metrics["rollout_is_eff_sample_size"] = 1.0 / tmean([[(x / (me + 1e-8)) ** 2 for x in row] for row in wc])
        sm = [mmean_seq(w[i], mask[i]) for i in range(n)]
        mean_sm = sum(sm) / n
        metrics["rollout_is_seq_mean"] = mean_sm
        metrics["rollout_is_seq_std"] = math.sqrt(sum((x - mean_sm) ** 2 for x in sm) / (n - 1)) if n > 1 else 0.0
        metrics["rollout_is_seq_max"] = max(sm)
        metrics["rollout_is_seq_min"] = min(sm)
        metrics["rollout_is_seq_max_deviation"] = max(abs(x - 1.0) for x in sm)
        raw_sm = [mmean_seq(raw[i], mask[i]) for i in range(n)]
        metrics["rollout_is_seq_fraction_high"] = sum(x > up for x in raw_sm) / n
        metrics["rollout_is_seq_fraction_low"] = sum(x < lo_m for x in raw_sm) / n
        if icepop:
            metrics["rollout_is_oob_ratio"] = tmean([[float(x < lo or x > up) for x in row] for row in raw])
        if IS_NORM:
            if IS == "token":
                mean = sum(x for i in range(n) for x, m in zip(w[i], mask[i]) if m) / T
            else:
                valid = [i for i in range(n) if sum(mask[i]) > 0]
                mean = sum(sm[i] for i in valid) / len(valid)
            if mean > 1e-8:
                w = [[x / mean for x in row] for row in w]
                metrics["rollout_is_batch_norm_factor"] = mean
            else:
                metrics["rollout_is_batch_norm_factor"] = 1.0
        weights = w
    keep = None
    if RS is not None:
        opts = []
        for o in (x.strip() for x in RS.split(",")):
            if o and o not in opts:
                opts.append(o)
        specs = [x.strip() for x in str(RS_T).split(",") if x.strip()]
        if len(specs) == 1:
            specs = specs * len(opts)
        lrs = [[clamp(x, -SAFETY, SAFETY) for x in row] for row in lr]
        k1 = [[-x for x in row] for row in lrs]
        k2 = [[0.5 * x * x for x in row] for row in lrs]
        k3 = [[math.exp(x) - 1.0 - x for x in row] for row in lrs]
        combined = [[1.0] * len(row) for row in lr]
        valid = [sum(m) > 0 for m in mask]
        for opt, spec in zip(opts, specs):
            is_k1 = opt.endswith("k1")
            if is_k1:
                if "_" in spec:
                    lo, up = (float(x) for x in spec.split("_", 1))
                else:
                    up = float(spec)
                    lo = float(str(1.0 / up))
                lol, upl = math.log(lo), math.log(up)
            else:
                up = float(spec)
            stat = {"1": k1, "2": k2, "3": k3}[opt[-1]]
            if opt.startswith("token"):
                tok = stat
                keep_t = [[(lol <= v <= upl) if is_k1 else v <= up for v in row] for row in tok]
                seqv = [mmean_seq(tok[i], mask[i]) for i in range(n)]
                level = "token"
            else:
                if opt.startswith("seq_sum"):
                    seqv = [sum(v for v, m in zip(stat[i], mask[i]) if m) for i in range(n)]
                elif opt.startswith("seq_mean"):
                    seqv = [mmean_seq(stat[i], mask[i]) for i in range(n)]
                else:
                    seqv = [max([v for v, m in zip(stat[i], mask[i]) if m] or [0.0]) for i in range(n)]
                sk = [(lol <= v <= upl) if is_k1 else v <= up for v in seqv]
                keep_t = [[sk[i]] * len(lr[i]) for i in range(n)]
                tok = [[seqv[i]] * len(lr[i]) for i in range(n)]
                level = "sequence"
            thr_up = upl if is_k1 else up
            thr_lo = lol if is_k1 else 0.0
            p = "rollout_rs_" + opt
            sv = [seqv[i] for i in range(n) if valid[i]]
            metrics[p + "_mean"] = tmean(tok)
            tv = [v for i in range(n) for v, m in zip(tok[i], mask[i]) if m]
            if level == "sequence" and sv:
                metrics[p + "_max"], metrics[p + "_min"] = max(sv), min(sv)
                metrics[p + "_fraction_high"] = sum(v > thr_up for v in sv) / len(sv)
                metrics[p + "_fraction_low"] = sum(v < thr_lo for v in sv) / len(sv) if is_k1 else 0.0
            else:
                metrics[p + "_max"], metrics[p + "_min"] = max(tv), min(tv)
                metrics[p + "_fraction_high"] = tmean([[float(v > thr_up) for v in row] for row in tok])
                metrics[p + "_fraction_low"] = (
                    tmean([[float(v < thr_lo) for v in row] for row in tok]) if is_k1 else 0.0)
            if T > 1:
                c = [[clamp(v, thr_lo if is_k1 else 0.0, thr_up) for v in row] for row in tok]
                e1, e2 = tmean(c), tmean([[x * x for x in row] for row in c])
                metrics[p + "_std"] = math.sqrt(max(e2 - e1 * e1, 0.0))
            else:
                metrics[p + "_std"] = 0.0
            msv = sum(sv) / len(sv)
            metrics[p + "_seq_mean"] = msv
            metrics[p + "_seq_std"] = math.sqrt(sum((v - msv) ** 2 for v in sv) / (len(sv) - 1)) if len(sv) > 1 else 0.0
            metrics[p + "_seq_max"], metrics[p + "_seq_min"] = max(sv), min(sv)
            metrics[p + "_seq_max_deviation"] = max(abs(v) for v in sv)
            metrics[p + "_seq_fraction_high"] = sum(v > thr_up for v in sv) / len(sv)
            if is_k1:
                metrics[p + "_seq_fraction_low"] = sum(v < thr_lo for v in sv) / len(sv)
            combined = [[c * float(k) for c, k in zip(combined[i], keep_t[i])] for i in range(n)]
            metrics[p + "_masked_fraction"] = tmean([[1.0 - float(k) for k in row] for row in keep_t])
            seq_kept = [all(k or not m for k, m in zip(keep_t[i], mask[i])) for i in range(n)]
            metrics[p + "_seq_masked_fraction"] = sum(
                (not seq_kept[i]) for i in range(n) if valid[i]) / max(sum(valid), 1)
        metrics["rollout_rs_masked_fraction"] = tmean([[1.0 - c for c in row] for row in combined])
        has = [any(m and c < 0.5 for c, m in zip(combined[i], mask[i])) for i in range(n)]
        metrics["rollout_rs_seq_masked_fraction"] = sum(has) / n
        keep = [[int(m and c > 0.5) for c, m in zip(combined[i], mask[i])] for i in range(n)]
    # compute_offpolicy_metrics
    mtr = [mmean_seq(old[i], mask[i]) for i in range(n)]
    mro = [mmean_seq(roll[i], mask[i]) for i in range(n)]
    metrics["training_ppl"] = sum(math.exp(-x) for x in mtr) / n
    metrics["training_log_ppl"] = sum(-x for x in mtr) / n
    metrics["kl"] = tmean([[r - o for o, r in zip(old[i], roll[i])] for i in range(n)])
    metrics["k3_kl"] = tmean([[math.exp(x) - x - 1 for x in row] for row in lr])
    metrics["rollout_ppl"] = sum(math.exp(-x) for x in mro) / n
    metrics["rollout_log_ppl"] = sum(-x for x in mro) / n
    lpd = [mro[i] - mtr[i] for i in range(n)]
    metrics["log_ppl_diff"] = sum(lpd) / n
    metrics["log_ppl_abs_diff"] = sum(abs(x) for x in lpd) / n
    metrics["log_ppl_diff_max"] = max(lpd)
    metrics["log_ppl_diff_min"] = min(lpd)
    metrics["ppl_ratio"] = sum(math.exp(x) for x in lpd) / n
    metrics["chi2_token"] = tmean([[math.exp(clamp(x, -SAFETY, SAFETY)) ** 2 for x in row] for row in lr]) - 1.0
    sums = [sum(x for x, m in zip(lr[i], mask[i]) if m) for i in range(n)]
    metrics["chi2_seq"] = sum(math.exp(2.0 * clamp(s, -SAFETY, SAFETY)) for s in sums) / n - 1.0
    return weights, keep, metrics


# ------------------------------------------------------------------ core_algos.py's estimators
def masked_whiten(vals, mask):
    flat = [v for row, mr in zip(vals, mask) for v, m in zip(row, mr) if m]
    cnt = len(flat)
    mean = sum(flat) / (cnt + 1e-8)
    var = sum((v - mean) ** 2 for v in flat) / (cnt + 1e-8) * cnt / (cnt - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) if m else 0.0 for v, m in zip(row, mr)] for row, mr in zip(vals, mask)]


def std(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def returns_to_go(rewards, mask):  # (token_level_rewards * response_mask) flipped, cumsum, flipped
    out = []
    for r, m in zip(rewards, mask):
        run, row = 0.0, [0.0] * len(r)
        for t in reversed(range(len(r))):
            run += r[t] * m[t]
            row[t] = run
        out.append(row)
    return out


def optimal_token_baseline(rewards, groups, mask, old, spp, isw, tir):
    """compute_optimal_token_baseline_advantage (tir: its multi-turn form), handle_zero_tail True."""
    n = len(rewards)
    G = returns_to_go(rewards, mask)
    W = []
    for i in range(n):
        w = [1 - 2 * math.exp(old[i][t]) + spp[i][t] for t in range(len(old[i]))]
        if isw is not None:
            w = [x * isw[i][t] ** 2 for t, x in enumerate(w)]
        cum, row = 0.0, []
        for t, x in enumerate(w):
            cum += x * mask[i][t]
            row.append(cum)
        W.append(row)
    L = [sum(m) for m in mask]
    if tir:  # each response's masked tokens, compacted
        Gc = [[G[i][t] for t in range(len(G[i])) if mask[i][t]] for i in range(n)]
        Wc = [[W[i][t] for t in range(len(W[i])) if mask[i][t]] for i in range(n)]
    by = {}
    for i, g in enumerate(groups):
        if not tir or L[i] > 0:
            by.setdefault(g, []).append(i)
    base = [[0.0] * (L[i] if tir else len(G[i])) for i in range(n)]
    for idx in by.values():
        if len(idx) == 1:
            continue
        P = max(len(base[i]) for i in idx)
        num, den = [0.0] * P, [0.0] * P
        for i in idx:
            for t in range(len(base[i])):
                if tir:
                    num[t] += Gc[i][t] * Wc[i][t]
                    den[t] += Wc[i][t]
                elif mask[i][t]:
                    num[t] += G[i][t] * W[i][t]
                    den[t] += W[i][t]
        for i in idx:
            base[i] = [num[t] / (den[t] + 1e-8) for t in range(len(base[i]))]
        lens = sorted(L[i] for i in idx)
        top = [i for i in idx if L[i] == lens[-1]]
        if len(top) == 1 and lens[-1] > lens[-2]:
            base[top[0]] = [0.0 if t >= lens[-2] else b for t, b in enumerate(base[top[0]])]
            checked["zero_tails"] += 1
        for i in idx:
            first_in = [t for t in range(len(mask[i])) if mask[i][t]]
            checked["holes"] += bool(first_in) and 0 in mask[i][:first_in[-1]]
    out = []
    for i in range(n):
        if tir:
            vals = iter(Gc[i][k] - base[i][k] for k in range(L[i]))
            out.append([next(vals) if m else 0.0 for m in mask[i]])
        else:
            out.append([(G[i][t] - base[i][t]) * mask[i][t] for t in range(len(G[i]))])
    return out


def grpo_scalar(scores, groups):
    by = {}
    for i, g in enumerate(groups):
        by.setdefault(g, []).append(i)
    a = [0.0] * len(scores)
    for idx in by.values():
        s = [scores[i] for i in idx]
        mean, sd = (0.0, 1.0) if len(idx) == 1 else (sum(s) / len(s), std(s))
        for i in idx:
            a[i] = (scores[i] - mean) / (sd + 1e-6) if NORM else scores[i] - mean
    return a


def advantages(rewards, groups, mask, rows=None, isw=None):
    n = len(rewards)
    if EST == "remax":
        G = returns_to_go(rewards, mask)
        return [[(g - r["reward_baseline"]) * m for g, m in zip(G[i], mask[i])] for i, r in enumerate(rows)]
    if EST in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        return optimal_token_baseline(rewards, groups, mask, [r["old_log_probs"] for r in rows],
                                      [r["sum_pi_squared"] for r in rows], isw, EST.startswith("tir"))
    if EST == "gdpo":
        if not GDPO_KEYS:
            fail("gdpo needs algorithm.gdpo_reward_keys")
        total = [0.0] * n
        for k, key in enumerate(GDPO_KEYS):
            a = grpo_scalar([r[key] for r in rows], groups)
            w = GDPO_W[k] if GDPO_W else 1.0
            total = [x + w * y for x, y in zip(total, a)]
        return masked_whiten([[total[i] * m for m in mask[i]] for i in range(n)], mask)
    scores = [sum(r) for r in rewards]
    by = {}
    for i, g in enumerate(groups):
        by.setdefault(g, []).append(i)
    if EST in ("reinforce_plus_plus",):
        ret = []
        for i in range(n):
            run, row = 0.0, [0.0] * len(rewards[i])
            for t in reversed(range(len(row))):
                new = rewards[i][t] + GAMMA * run
                row[t] = new * mask[i][t]
                run = new * mask[i][t] + run * (1 - mask[i][t])
            ret.append(row)
        return masked_whiten(ret, mask)
    a = [0.0] * n
    for g, idx in by.items():
        s = [scores[i] for i in idx]
        k = len(idx)
        for i in idx:
            if EST in ("grpo", "grpo_vectorized"):
                mean, sd = (0.0, 1.0) if k == 1 else (sum(s) / k, std(s))
                a[i] = (scores[i] - mean) / (sd + 1e-6) if NORM else scores[i] - mean
            elif EST == "rloo":
                a[i] = scores[i] * k / (k - 1) - sum(s) / k * k / (k - 1) if k > 1 else scores[i]
            elif EST == "rloo_vectorized":
                a[i] = (k * scores[i] - sum(s)) / max(k - 1, 1) * (k > 1)
            elif EST == "reinforce_plus_plus_baseline":
                a[i] = scores[i] - (sum(s) / k if k > 1 else 0.0)
            elif EST == "opo":
                lens = [sum(mask[j]) for j in idx]
                a[i] = scores[i] - (sum(L * x for L, x in zip(lens, s)) / sum(lens) if k > 1 else 0.0)
            elif EST == "gpg":
                alpha = n / max(sum(x != 0 for x in scores), 1)
                a[i] = alpha * (scores[i] - (sum(s) / k if k > 1 else 0.0))
            elif EST == "grpo_passk":
                order = sorted(idx, key=lambda j: -scores[j])
                best, second = order[0], order[1]
                adv = scores[best] - scores[second]
                if NORM:
                    adv /= std(s) + 1e-6
                a[i] = adv if i == best else 0.0
            else:
                fail(f"no check for estimator {EST}")
    out = [[a[i] * m for m in mask[i]] for i in range(n)]
    if EST == "reinforce_plus_plus_baseline":
        out = masked_whiten(out, mask)
    return out


# ------------------------------------------------------------------ the policy losses at ratio 1 (core_algos.py)
def token_weights(mode, mask):
    n = len(mask)
    T = sum(sum(m) for m in mask)
    if mode == "token-mean":
        return [[m / T if T else 0.0 for m in row] for row in mask]
    if mode == "seq-mean-token-sum":
        return [[m / n for m in row] for row in mask]
    if mode == "seq-mean-token-mean":
        return [[m / (n * sum(row)) if sum(row) else 0.0 for m in row] for row in mask]
    return [[m / (n * MAXLEN) for m in row] for row in mask]


def pg_loss_at_ratio_one(adv, logp, mask, isw, rollout):
    n = len(adv)
    if MODE == "geo_mean":
        total = 0.0
        for i in range(n):
            L = sum(mask[i])
            abar = sum(a * m for a, m in zip(adv[i], mask[i])) / (L + 1e-8)
            sis = 1.0
            if isw is not None:
                sis = math.exp(sum(math.log(w + 1e-10) * m for w, m in zip(isw[i], mask[i])) / (L + 1e-8))
            total += -abar * 1.0 * sis / n
        return total, 0.0, abs(total)
    agg = {"gspo": "seq-mean-token-mean", "sapo": "seq-mean-token-mean"}.get(MODE, AGG)
    w = token_weights(agg, mask)
    total, scale, cut, T = 0.0, 0.0, 0, sum(sum(m) for m in mask)
    if MODE == "clip_cov":  # every candidate cut (clip_cov_ratio large enough), over the one micro-batch
        ma = sum(a for i in range(n) for a, m in zip(adv[i], mask[i]) if m) / (T + 1e-8)
        mx = sum(x for i in range(n) for x, m in zip(logp[i], mask[i]) if m) / (T + 1e-8)
        cand = [[m and CC_LB < (a - ma) * (x - mx) < CC_UB for a, x, m in zip(adv[i], logp[i], mask[i])]
                for i in range(n)]
        ncand = sum(sum(c) for c in cand)
        if max(int(CC_RATIO * T), 1) < ncand:
            fail("clip_cov_ratio must cut every candidate for this check")
    for i in range(n):
        for t, m in enumerate(mask[i]):
            if not m:
                continue
            A, x = adv[i][t], logp[i][t]
            if BYPASS:
                pg = -A * x if LOSS_TYPE == "reinforce" else -A
            elif MODE in ("vanilla", "gspo", "kl_cov"):
                pg = -A
            elif MODE == "sapo":
                tau = TAU_POS if A > 0 else TAU_NEG
                pg = -A * 0.5 * 4.0 / tau  # sigmoid(0) = 1/2
            elif MODE in ("gpg", "cispo", "dppo_tv", "dppo_kl", "dro"):
                pg = -A * x
            elif MODE == "clip_cov":
                pg = 0.0 if cand[i][t] else -A
                cut += cand[i][t]
            else:
                fail(f"no check for loss mode {MODE}")
            if isw is not None and not (BYPASS and LOSS_TYPE == "ppo_clip"):
                pg *= isw[i][t]
            total += w[i][t] * pg
            scale += abs(w[i][t] * pg)
    return total, cut / T if T else 0.0, scale


# ------------------------------------------------------------------ the run
metrics = {}
for line in open(f"{run_dir}/metrics.jsonl"):
    if line.strip():
        r = json.loads(line)
        metrics[r["step"]] = r
checked = {"weights": 0, "rejected": 0, "kept": 0, "metrics": 0, "advantages": 0, "zero_tails": 0, "holes": 0}
for k in range(1, steps + 1):
    rows = [json.loads(l) for l in open(f"{audit_dir}/{k}.jsonl") if l.strip()]
    m = metrics.get(k)
    if m is None:
        fail(f"step {k}: no metrics")
    old = [r["old_log_probs"] for r in rows]
    roll = [r["rollout_log_probs"] for r in rows]
    mask = [r.get("response_mask", [1] * len(r["response_ids"])) for r in rows]
    n = len(rows)
    # rollout correction: decoupled mode's weights, rejection and metrics from the old log-probs
    if not BYPASS:
        w, keep, rc = rollout_correction(old, roll, mask)
        got = {key[len("rollout_corr/"):]: v for key, v in m.items() if key.startswith("rollout_corr/")}
        if set(got) != set(rc):
            fail(f"step {k}: rollout_corr/ metrics {sorted(set(got) ^ set(rc))} on one side only")
        for key, want in rc.items():
            # the one-pass std of verl (E[w^2] - E[w]^2) cancels to the rounding of its terms
            rel, ab = (1e-4, 1e-12) if key.endswith("_std") and not key.endswith("seq_std") else (1e-9, 1e-12)
            if not close(got[key], want, rel, ab):
                fail(f"step {k}: rollout_corr/{key} = {got[key]!r}, float64 recomputation {want!r}")
            checked["metrics"] += 1
        for i, r in enumerate(rows):
            if w is not None:
                aw = r.get("rollout_is_weights")
                if aw is None:
                    fail(f"step {k} line {i}: no rollout_is_weights in the audit")
                for t, (x, y) in enumerate(zip(aw, w[i])):
                    if not close(x, y, 2e-7, 1e-30):  # the audit holds float32 weights
                        fail(f"step {k} line {i} token {t}: IS weight {x!r}, recomputed {y!r}")
                    checked["weights"] += 1
            if keep is not None:
                if r.get("rollout_rs_mask") != keep[i]:
                    fail(f"step {k} line {i}: rollout_rs_mask {r.get('rollout_rs_mask')}, recomputed {keep[i]}")
                checked["rejected"] += sum(mask[i]) - sum(keep[i])
                checked["kept"] += sum(keep[i])
        loss_mask = keep if keep is not None else mask
    else:
        w, loss_mask = None, mask
    # advantages, on the tokens the loss takes
    rewards = []
    for r in rows:
        row = [0.0] * len(r["response_ids"])
        row[-1] = r["reward"]
        rewards.append(row)
    # the optimal token baseline takes the IS weights as the trainer keeps them (float32, checked above against the
    # float64 recomputation), as verl's batch holds them
    aw = [r["rollout_is_weights"] for r in rows] if w is not None else None
    adv = advantages(rewards, [r["group"] for r in rows], loss_mask, rows, aw)
    for i, r in enumerate(rows):  # the old policy's sum of squared probabilities: between pi_t^2 and 1
        for t, (x, o) in enumerate(zip(r.get("sum_pi_squared", []), old[i])):
            if not (math.exp(o) ** 2 * (1 - 1e-5) <= x <= 1 + 1e-6):
                fail(f"step {k} line {i} token {t}: sum_pi_squared {x} outside [pi^2 = {math.exp(o) ** 2}, 1]")
    for key in GDPO_KEYS if EST == "gdpo" else []:  # gdpo/<key>/: mean, numpy's std, max, min over the step
        vals = [r[key] for r in rows]
        mean = sum(vals) / n
        want = {"mean": mean, "std": math.sqrt(sum((v - mean) ** 2 for v in vals) / n), "max": max(vals),
                "min": min(vals)}
        for stat, v in want.items():
            if not close(m[f"gdpo/{key}/{stat}"], v, 1e-9, 1e-12):
                fail(f"step {k}: gdpo/{key}/{stat} {m[f'gdpo/{key}/{stat}']}, recomputed {v}")
            checked["metrics"] += 1
    for i, r in enumerate(rows):
        for t, (x, y) in enumerate(zip(r["advantages"], adv[i])):
            if not close(x, y, 1e-9, 1e-11):
                fail(f"step {k} line {i} token {t}: advantage {x!r}, recomputed {y!r} ({EST})")
            checked["advantages"] += 1
    flat = [a for i in range(n) for a, lm in zip(adv[i], loss_mask[i]) if lm]
    if flat and not close(m["critic/advantages/mean"], sum(flat) / len(flat), 1e-9, 1e-11):
        fail(f"step {k}: critic/advantages/mean {m['critic/advantages/mean']}, recomputed {sum(flat) / len(flat)}")
    # the loss of the step's one update, at ratio 1
    if kv.get("check_pg_loss", "1") == "1":
        logp = roll if BYPASS else old
        want, cutfrac, scale = pg_loss_at_ratio_one(adv, logp, loss_mask, w, roll)
        got = m["actor/pg_loss"]
        # the terms cancel (advantages of both signs): the trainer's rounding, and in bypass mode its current
        # log-probs and IS weights (the rollout's within 1e-6), count against the sum of their sizes
        if abs(got - want) > 1e-5 * max(scale, 1e-2):
            fail(f"step {k}: actor/pg_loss {got!r}, recomputed at ratio 1 {want!r} ({MODE}, {AGG})")
        if MODE == "clip_cov" and not close(m["actor/pg_clipfrac"], cutfrac, 1e-9, 1e-12):
            fail(f"step {k}: actor/pg_clipfrac {m['actor/pg_clipfrac']}, recomputed {cutfrac}")
print(f"{steps} step(s) agree with the float64 recomputation: {checked}")
if IS is not None and not BYPASS and checked["weights"] == 0:
    fail("no IS weight was checked")
if kv.get("require_holes") == "1" and (checked["holes"] == 0 or checked["zero_tails"] == 0):
    fail(f"the optimal token baseline's masks are too plain here ({checked['holes']} responses with a hole, "
         f"{checked['zero_tails']} zero tails)")
if kv.get("require_mixed") == "1" and RS is not None and not BYPASS and (checked["rejected"] == 0 or checked["kept"] == 0):
    fail(f"the rejection is vacuous here (rejected {checked['rejected']}, kept {checked['kept']}): pick thresholds "
         "that reject some tokens and keep others")
