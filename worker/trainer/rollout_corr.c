#include "rollout_corr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

/* verl's bound on log ratios before exp() */
#define SAFETY_BOUND 20.0

/* ------------------------------------------------------------------ the computation */

static double clampd(double x, double lo, double hi) { return x < lo ? lo : (x > hi ? hi : x); }

/* The options' per-token statistic from a log ratio (clamped to +-20 as verl's log_ratio_safe). */
static double rs_token_stat(enum rc_rs_stat s, double lr)
{
    const double l = clampd(lr, -SAFETY_BOUND, SAFETY_BOUND);
    switch (s) {
    case RS_TOKEN_K1:
    case RS_SEQ_SUM_K1:
    case RS_SEQ_MEAN_K1: return -l;
    case RS_TOKEN_K2:
    case RS_SEQ_SUM_K2:
    case RS_SEQ_MEAN_K2:
    case RS_SEQ_MAX_K2: return 0.5 * l * l;
    default: return exp(l) - 1.0 - l;
    }
}

static bool rs_is_token(enum rc_rs_stat s) { return s <= RS_TOKEN_K3; }

/* Sum slots (reduced over the ranks) and max slots; the RS options' take blocks of their own. */
enum {
    S_SEQS,
    S_TOK,
    S_EXP_NEG_MTR,
    S_NEG_MTR,
    S_KL,
    S_K3,
    S_EXP_NEG_MRO,
    S_NEG_MRO,
    S_LPD,
    S_ABS_LPD,
    S_EXP_LPD,
    S_RHO2,
    S_RHO2_SEQ,
    S_W,
    S_W2,
    S_HIGH,
    S_LOW,
    S_OOB,
    S_SM,
    S_SEQ_HIGH,
    S_SEQ_LOW,
    S_SM_VALID,
    S_VALID,
    S_REJ_TOK,
    S_REJ_SEQ,
    S_RS0
};
enum { RSS_STAT, RSS_HIGH, RSS_LOW, RSS_C, RSS_C2, RSS_SEQV, RSS_SEQ_HIGH, RSS_SEQ_LOW, RSS_REJ, RSS_REJ_SEQ, RSS_N };
#define NSUM (S_RS0 + RSS_N * RS_NSTATS)
enum { X_LPD, X_NLPD, X_W, X_NW, X_L, X_NL, X_SM, X_NSM, X_SMDEV, X_RS0 };
enum { RSX_TOK, RSX_NTOK, RSX_SEQ, RSX_NSEQ, RSX_ABS, RSX_N };
#define NMAX (X_RS0 + RSX_N * RS_NSTATS)

static void put(struct rc_metrics *m, const char *name, double v)
{
    if (!m || m->n >= RC_METRICS_MAX)
        return;
    snprintf(m->name[m->n], sizeof m->name[0], "%s", name);
    m->v[m->n++] = v;
}

static void put_rs(struct rc_metrics *m, enum rc_rs_stat s, const char *what, double v)
{
    char name[48];
    snprintf(name, sizeof name, "rollout_rs_%s_%s", rc_rs_names[s], what);
    put(m, name, v);
}

void rollout_corr_compute(const struct rollout_corr *rc, int n, const int *len, const float *const *logp,
                          const float *const *rollout, const uint8_t *const *mask, const struct rc_reduce *red,
                          bool normalize, float *const *is_w, uint8_t *const *keep, struct rc_metrics *m)
{
    double S[NSUM] = {0}, X[NMAX], V[1 + RS_NSTATS] = {0};
    for (int k = 0; k < NMAX; k++)
        X[k] = -INFINITY;
    const double up = rc->is_upper, lo_m = rc->is_lower > 0 ? rc->is_lower : (up > 0 ? 1.0 / up : 0);
    const bool icepop = rc->is_lower > 0;
    /* per sequence: its model tokens, summed log ratio; the IS sequence weights, raw and applied; the RS options'
     * sequence statistics and whether each kept it */
    int *cnt = xcalloc((size_t)(n ? n : 1), sizeof(int));
    double *lsum = xcalloc((size_t)(n ? n : 1), sizeof(double));
    double *sm = xcalloc((size_t)(n ? n : 1), sizeof(double));
    double *seqv = xcalloc((size_t)(n ? n : 1) * RS_NSTATS, sizeof(double));
    for (int i = 0; i < n; i++) {
        const uint8_t *mk = mask ? mask[i] : NULL;
        double sl = 0, sr = 0;
        int c = 0;
        for (int t = 0; t < len[i]; t++)
            if (!mk || mk[t]) {
                const double lr = (double)logp[i][t] - rollout[i][t];
                sl += logp[i][t], sr += rollout[i][t];
                lsum[i] += lr;
                c++;
                S[S_KL] += (double)rollout[i][t] - logp[i][t];
                S[S_K3] += exp(lr) - lr - 1.0;
                S[S_RHO2] += exp(2.0 * clampd(lr, -SAFETY_BOUND, SAFETY_BOUND));
            }
        cnt[i] = c;
        const double mtr = sl / (c + 1e-8), mro = sr / (c + 1e-8), lpd = mro - mtr;
        S[S_SEQS] += 1, S[S_TOK] += c;
        S[S_EXP_NEG_MTR] += exp(-mtr), S[S_NEG_MTR] += -mtr;
        S[S_EXP_NEG_MRO] += exp(-mro), S[S_NEG_MRO] += -mro;
        S[S_LPD] += lpd, S[S_ABS_LPD] += fabs(lpd), S[S_EXP_LPD] += exp(lpd);
        X[X_LPD] = fmax(X[X_LPD], lpd), X[X_NLPD] = fmax(X[X_NLPD], -lpd);
        S[S_RHO2_SEQ] += exp(2.0 * clampd(lsum[i], -SAFETY_BOUND, SAFETY_BOUND));
        S[S_VALID] += c > 0;
    }
    /* importance sampling: raw weights, the applied ones (TIS: truncated at the upper bound; IcePop: 0 outside
     * [lower, upper]), written where asked */
    if (rc->is != RC_OFF) {
        for (int i = 0; i < n; i++) {
            const uint8_t *mk = mask ? mask[i] : NULL;
            double raw_seq = 0, w_seq = 0, wsum = 0, rawsum = 0;
            if (rc->is == RC_SEQUENCE) {
                raw_seq = exp(clampd(lsum[i], -SAFETY_BOUND, SAFETY_BOUND));
                w_seq = icepop ? (raw_seq >= rc->is_lower && raw_seq <= up ? raw_seq : 0.0) : fmin(raw_seq, up);
                X[X_L] = fmax(X[X_L], lsum[i]), X[X_NL] = fmax(X[X_NL], -lsum[i]);
                S[S_HIGH] += lsum[i] > log(up);
                S[S_LOW] += lsum[i] < log(lo_m);
            }
            for (int t = 0; t < len[i]; t++) {
                double raw = 0, w = 0;
                if (!mk || mk[t]) {
                    if (rc->is == RC_TOKEN) {
                        raw = exp(clampd((double)logp[i][t] - rollout[i][t], -SAFETY_BOUND, SAFETY_BOUND));
                        w = icepop ? (raw >= rc->is_lower && raw <= up ? raw : 0.0) : fmin(raw, up);
                        S[S_HIGH] += raw > up;
                        S[S_LOW] += raw < lo_m;
                        X[X_W] = fmax(X[X_W], w), X[X_NW] = fmax(X[X_NW], -w);
                    } else {
                        raw = raw_seq, w = w_seq;
                    }
                    S[S_W] += w, S[S_W2] += w * w; /* w is within [0, upper]: the clamp of std and ESS is a no-op */
                    S[S_OOB] += raw < rc->is_lower || raw > up;
                    wsum += w, rawsum += raw;
                }
                if (is_w && is_w[i])
                    is_w[i][t] = (float)w;
            }
            sm[i] = wsum / (cnt[i] + 1e-8);
            const double raw_sm = rawsum / (cnt[i] + 1e-8);
            S[S_SM] += sm[i];
            X[X_SM] = fmax(X[X_SM], sm[i]), X[X_NSM] = fmax(X[X_NSM], -sm[i]);
            X[X_SMDEV] = fmax(X[X_SMDEV], fabs(sm[i] - 1.0));
            S[S_SEQ_HIGH] += raw_sm > up;
            S[S_SEQ_LOW] += raw_sm < lo_m;
            if (cnt[i] > 0)
                S[S_SM_VALID] += sm[i];
        }
    }
    /* rejection sampling, option by option; a token is kept when every option keeps it */
    for (int i = 0; keep && i < n; i++)
        for (int t = 0; keep[i] && t < len[i]; t++)
            keep[i][t] = !mask || !mask[i] || mask[i][t];
    for (int j = 0; j < rc->n_rs; j++) {
        const struct rc_rs *o = &rc->rs[j];
        const bool k1 = rc_rs_is_k1(o->stat), tok = rs_is_token(o->stat);
        const double lol = k1 ? log(o->lower) : 0, upl = k1 ? log(o->upper) : o->upper;
        double *s = S + S_RS0 + RSS_N * o->stat, *x = X + X_RS0 + RSX_N * o->stat;
        for (int i = 0; i < n; i++) {
            const uint8_t *mk = mask ? mask[i] : NULL;
            double acc = 0, mx = -INFINITY;
            for (int t = 0; t < len[i]; t++)
                if (!mk || mk[t]) {
                    const double v = rs_token_stat(o->stat, (double)logp[i][t] - rollout[i][t]);
                    acc += v, mx = fmax(mx, v);
                }
            double sv; /* the sequence's value: its statistic, or its tokens' masked mean */
            if (o->stat == RS_SEQ_MAX_K2 || o->stat == RS_SEQ_MAX_K3)
                sv = cnt[i] ? mx : 0.0;
            else if (o->stat >= RS_SEQ_SUM_K1 && o->stat <= RS_SEQ_SUM_K3)
                sv = acc;
            else
                sv = acc / (cnt[i] + 1e-8);
            seqv[(size_t)i * RS_NSTATS + o->stat] = sv;
            bool seq_rejected = false;
            const bool seq_keep = k1 ? sv >= lol && sv <= upl : sv <= upl;
            for (int t = 0; t < len[i]; t++) {
                if (mk && !mk[t])
                    continue;
                const double v = tok ? rs_token_stat(o->stat, (double)logp[i][t] - rollout[i][t]) : sv;
                const bool kt = tok ? (k1 ? v >= lol && v <= upl : v <= upl) : seq_keep;
                s[RSS_STAT] += v;
                x[RSX_TOK] = fmax(x[RSX_TOK], v), x[RSX_NTOK] = fmax(x[RSX_NTOK], -v);
                s[RSS_HIGH] += v > upl;
                s[RSS_LOW] += k1 && v < lol;
                const double c = clampd(v, k1 ? lol : 0.0, upl);
                s[RSS_C] += c, s[RSS_C2] += c * c;
                s[RSS_REJ] += !kt;
                seq_rejected |= !kt;
                if (!kt && keep && keep[i])
                    keep[i][t] = 0;
            }
            if (cnt[i] > 0) {
                s[RSS_SEQV] += sv;
                x[RSX_SEQ] = fmax(x[RSX_SEQ], sv), x[RSX_NSEQ] = fmax(x[RSX_NSEQ], -sv);
                x[RSX_ABS] = fmax(x[RSX_ABS], fabs(sv));
                s[RSS_SEQ_HIGH] += sv > upl;
                s[RSS_SEQ_LOW] += k1 && sv < lol;
                s[RSS_REJ_SEQ] += seq_rejected;
            }
        }
    }
    if (rc->n_rs) /* the options together */
        for (int i = 0; i < n; i++) {
            const uint8_t *mk = mask ? mask[i] : NULL;
            bool any = false;
            for (int t = 0; t < len[i]; t++) {
                if (mk && !mk[t])
                    continue;
                bool kt = true;
                for (int j = 0; j < rc->n_rs; j++) {
                    const struct rc_rs *o = &rc->rs[j];
                    const bool k1 = rc_rs_is_k1(o->stat);
                    const double lol = k1 ? log(o->lower) : 0, upl = k1 ? log(o->upper) : o->upper;
                    const double v = rs_is_token(o->stat) ? rs_token_stat(o->stat, (double)logp[i][t] - rollout[i][t])
                                                          : seqv[(size_t)i * RS_NSTATS + o->stat];
                    kt &= k1 ? v >= lol && v <= upl : v <= upl;
                }
                S[S_REJ_TOK] += !kt;
                any |= !kt;
            }
            S[S_REJ_SEQ] += any;
        }
    if (red && red->sum)
        red->sum(red->ctx, S, NSUM);
    if (red && red->max)
        red->max(red->ctx, X, NMAX);
    /* second pass: the spread of the sequence values about the batch's means (torch.std, unbiased) */
    const double seqs = S[S_SEQS], T = S[S_TOK], valid = S[S_VALID];
    const double sm_mean = seqs > 0 ? S[S_SM] / seqs : 0;
    for (int i = 0; i < n; i++) {
        if (rc->is != RC_OFF)
            V[0] += (sm[i] - sm_mean) * (sm[i] - sm_mean);
        for (int j = 0; j < rc->n_rs; j++) {
            const enum rc_rs_stat st = rc->rs[j].stat;
            const double mean = valid > 0 ? S[S_RS0 + RSS_N * st + RSS_SEQV] / valid : 0;
            const double d = seqv[(size_t)i * RS_NSTATS + st] - mean;
            if (cnt[i] > 0)
                V[1 + st] += d * d;
        }
    }
    if (red && red->sum)
        red->sum(red->ctx, V, 1 + RS_NSTATS);
    const double Te = T + 1e-8;
    if (rc->is != RC_OFF) {
        if (rc->is == RC_SEQUENCE) {
            put(m, "rollout_is_max", exp(fmin(X[X_L], SAFETY_BOUND)));
            put(m, "rollout_is_min", exp(-X[X_NL]));
            put(m, "rollout_is_mean", S[S_W] / Te);
            put(m, "rollout_is_ratio_fraction_high", seqs > 0 ? S[S_HIGH] / seqs : NAN);
            put(m, "rollout_is_ratio_fraction_low", seqs > 0 ? S[S_LOW] / seqs : NAN);
        } else {
            put(m, "rollout_is_mean", S[S_W] / Te);
            put(m, "rollout_is_ratio_fraction_high", S[S_HIGH] / Te);
            put(m, "rollout_is_ratio_fraction_low", S[S_LOW] / Te);
            put(m, "rollout_is_max", X[X_W]);
            put(m, "rollout_is_min", -X[X_NW]);
        }
        const double e1 = S[S_W] / Te, e2 = S[S_W2] / Te;
        put(m, "rollout_is_std", T > 1 ? sqrt(fmax(e2 - e1 * e1, 0.0)) : 0.0);
        put(m, "rollout_is_eff_sample_size", 1.0 / (S[S_W2] / ((e1 + 1e-8) * (e1 + 1e-8)) / Te));
        put(m, "rollout_is_seq_mean", sm_mean);
        put(m, "rollout_is_seq_std", seqs > 1 ? sqrt(V[0] / (seqs - 1)) : 0.0);
        put(m, "rollout_is_seq_max", X[X_SM]);
        put(m, "rollout_is_seq_min", -X[X_NSM]);
        put(m, "rollout_is_seq_max_deviation", X[X_SMDEV]);
        put(m, "rollout_is_seq_fraction_high", seqs > 0 ? S[S_SEQ_HIGH] / seqs : NAN);
        put(m, "rollout_is_seq_fraction_low", seqs > 0 ? S[S_SEQ_LOW] / seqs : NAN);
        if (icepop)
            put(m, "rollout_is_oob_ratio", S[S_OOB] / Te);
        if (rc->batch_normalize && normalize) { /* to mean 1 over the batch (every rank's), as verl on its driver */
            const double mean = rc->is == RC_TOKEN ? (T > 0 ? S[S_W] / T : 0) : (valid > 0 ? S[S_SM_VALID] / valid : 0);
            const bool div = mean > 1e-8;
            for (int i = 0; div && is_w && i < n; i++)
                for (int t = 0; is_w[i] && t < len[i]; t++)
                    is_w[i][t] = (float)((double)is_w[i][t] / mean);
            put(m, "rollout_is_batch_norm_factor", div ? mean : 1.0);
        }
    }
    for (int j = 0; j < rc->n_rs; j++) {
        const enum rc_rs_stat st = rc->rs[j].stat;
        const bool k1 = rc_rs_is_k1(st), tok = rs_is_token(st);
        const double *s = S + S_RS0 + RSS_N * st, *x = X + X_RS0 + RSX_N * st;
        const bool by_seq = !tok && valid > 0;
        put_rs(m, st, "mean", s[RSS_STAT] / Te);
        put_rs(m, st, "max", by_seq ? x[RSX_SEQ] : x[RSX_TOK]);
        put_rs(m, st, "min", by_seq ? -x[RSX_NSEQ] : -x[RSX_NTOK]);
        put_rs(m, st, "fraction_high", by_seq ? s[RSS_SEQ_HIGH] / valid : s[RSS_HIGH] / Te);
        put_rs(m, st, "fraction_low", !k1 ? 0.0 : by_seq ? s[RSS_SEQ_LOW] / valid : s[RSS_LOW] / Te);
        const double e1 = s[RSS_C] / Te, e2 = s[RSS_C2] / Te;
        put_rs(m, st, "std", T > 1 ? sqrt(fmax(e2 - e1 * e1, 0.0)) : 0.0);
        if (valid > 0) {
            put_rs(m, st, "seq_mean", s[RSS_SEQV] / valid);
            put_rs(m, st, "seq_std", valid > 1 ? sqrt(V[1 + st] / (valid - 1)) : 0.0);
            put_rs(m, st, "seq_max", x[RSX_SEQ]);
            put_rs(m, st, "seq_min", -x[RSX_NSEQ]);
            put_rs(m, st, "seq_max_deviation", x[RSX_ABS]);
            put_rs(m, st, "seq_fraction_high", s[RSS_SEQ_HIGH] / valid);
            if (k1)
                put_rs(m, st, "seq_fraction_low", s[RSS_SEQ_LOW] / valid);
        } else {
            /* no sequence with a model token: zeros (verl then reports seq_fraction_low for every option; here,
             * as in the other case, for the k1 options alone, so that the names are the configuration's) */
            static const char *const zero[] = {"seq_mean",          "seq_std",           "seq_max",         "seq_min",
                                               "seq_max_deviation", "seq_fraction_high", "seq_fraction_low"};
            for (size_t z = 0; z < sizeof zero / sizeof *zero - (k1 ? 0 : 1); z++)
                put_rs(m, st, zero[z], 0.0);
        }
        put_rs(m, st, "masked_fraction", s[RSS_REJ] / Te);
        put_rs(m, st, "seq_masked_fraction", valid > 0 ? s[RSS_REJ_SEQ] / valid : 0.0);
    }
    if (rc->n_rs) {
        put(m, "rollout_rs_masked_fraction", S[S_REJ_TOK] / Te);
        put(m, "rollout_rs_seq_masked_fraction", seqs > 0 ? S[S_REJ_SEQ] / seqs : NAN);
    }
    /* the off-policy diagnostics (compute_offpolicy_metrics): per-sequence means over the model's tokens, each
     * sequence's count + 1e-8 */
    put(m, "training_ppl", S[S_EXP_NEG_MTR] / seqs);
    put(m, "training_log_ppl", S[S_NEG_MTR] / seqs);
    put(m, "kl", S[S_KL] / Te);
    put(m, "k3_kl", S[S_K3] / Te);
    put(m, "rollout_ppl", S[S_EXP_NEG_MRO] / seqs);
    put(m, "rollout_log_ppl", S[S_NEG_MRO] / seqs);
    put(m, "log_ppl_diff", S[S_LPD] / seqs);
    put(m, "log_ppl_abs_diff", S[S_ABS_LPD] / seqs);
    put(m, "log_ppl_diff_max", X[X_LPD]);
    put(m, "log_ppl_diff_min", -X[X_NLPD]);
    put(m, "ppl_ratio", S[S_EXP_LPD] / seqs);
    put(m, "chi2_token", S[S_RHO2] / Te - 1.0);
    put(m, "chi2_seq", S[S_RHO2_SEQ] / seqs - 1.0);
    free(cnt), free(lsum), free(sm), free(seqv);
}
