#include "grpo_algo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "rollout_corr.h"

static const struct {
    const char *name;
    enum adv_estimator est;
} g_estimators[] = {
    {"grpo", ADV_GRPO},
    {"grpo_vectorized", ADV_GRPO}, /* verl's vectorised GRPO: the same numbers */
    {"rloo", ADV_RLOO},
    {"rloo_vectorized", ADV_RLOO_VECTORIZED},
    {"reinforce_plus_plus", ADV_REINFORCE_PP},
    {"reinforce_plus_plus_baseline", ADV_REINFORCE_PP_BASELINE},
    {"remax", ADV_REMAX},
    {"opo", ADV_OPO},
    {"grpo_passk", ADV_GRPO_PASSK},
    {"gpg", ADV_GPG},
    {"optimal_token_baseline", ADV_OPTIMAL_TOKEN_BASELINE},
    {"tir_optimal_token_baseline", ADV_TIR_OPTIMAL_TOKEN_BASELINE},
    {"gdpo", ADV_GDPO},
};

int adv_estimator_from_name(const char *s)
{
    for (size_t i = 0; i < sizeof g_estimators / sizeof *g_estimators; i++)
        if (strcmp(s, g_estimators[i].name) == 0)
            return (int)g_estimators[i].est;
    return -1;
}

int kl_type_from_name(const char *s)
{
    if (strcmp(s, "kl") == 0 || strcmp(s, "k1") == 0)
        return KL_K1;
    if (strcmp(s, "abs") == 0)
        return KL_ABS;
    if (strcmp(s, "mse") == 0 || strcmp(s, "k2") == 0)
        return KL_K2;
    if (strcmp(s, "low_var_kl") == 0 || strcmp(s, "k3") == 0)
        return KL_K3;
    return -1;
}

int loss_agg_from_name(const char *s)
{
    static const char *const names[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                        "seq-mean-token-sum-norm"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

void outcome_advantages(enum adv_estimator est, bool norm_by_std, const double *scores, const int *group, int n,
                        double *adv)
{
    const double eps = 1e-6;
    for (int i = 0; i < n; i++) {
        /* statistics of i's group (O(n^2) over a batch of a few hundred responses: negligible) */
        double sum = 0, sumsq = 0;
        int cnt = 0, best = -1, second = -1;
        for (int j = 0; j < n; j++)
            if (group[j] == group[i]) {
                sum += scores[j];
                cnt++;
                /* torch.topk(rewards, 2): the largest first (the first of equals), then the next */
                if (best < 0 || scores[j] > scores[best]) {
                    second = best;
                    best = j;
                } else if (second < 0 || scores[j] > scores[second]) {
                    second = j;
                }
            }
        double mean = sum / cnt;
        for (int j = 0; j < n; j++)
            if (group[j] == group[i])
                sumsq += (scores[j] - mean) * (scores[j] - mean);
        const double std = cnt > 1 ? sqrt(sumsq / (cnt - 1)) : 1.0;
        if (est == ADV_GRPO_PASSK) { /* only the group's best response: r_max - r_second (verl refuses a group of 1) */
            double a = 0;
            if (cnt > 1 && i == best) {
                a = scores[best] - scores[second];
                if (norm_by_std)
                    a /= std + eps;
            }
            adv[i] = a;
            continue;
        }
        if (cnt == 1) { /* verl: a lone response has mean 0 and std 1 (RLOO leaves it as is; vectorised RLOO: 0) */
            adv[i] = est == ADV_RLOO_VECTORIZED         ? 0.0
                     : (est == ADV_GRPO && norm_by_std) ? scores[i] / (1.0 + eps)
                                                        : scores[i];
            continue;
        }
        if (est == ADV_RLOO || est == ADV_RLOO_VECTORIZED)
            adv[i] = scores[i] - (sum - scores[i]) / (cnt - 1);
        else
            adv[i] = norm_by_std ? (scores[i] - mean) / (std + eps) : scores[i] - mean;
    }
}

/* Whether packed token k is the model's (mask NULL: every token). */
static bool model_token(const uint8_t *mask, int k) { return !mask || mask[k]; }

/* verl's masked_whiten over the tokens of mask (NULL: all) of the packed adv, in place, its statistics summed over
 * red's ranks: mean = sum / (count + 1e-8), var = sum of squared deviations / (count + 1e-8) x count / (count - 1),
 * (x - mean) / sqrt(var + 1e-8); the other tokens get 0. */
static void masked_whiten(double *adv, const uint8_t *mask, const int *off, const int *len, int n,
                          const struct batch_reduce *red)
{
    double s[2] = {0, 0}; /* sum, count */
    for (int i = 0; i < n; i++)
        for (int t = 0; t < len[i]; t++)
            if (model_token(mask, off[i] + t)) {
                s[0] += adv[off[i] + t];
                s[1] += 1;
            }
    if (red && red->sum)
        red->sum(red->ctx, s, 2);
    const double mean = s[0] / (s[1] + 1e-8);
    double v = 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < len[i]; t++)
            if (model_token(mask, off[i] + t))
                v += (adv[off[i] + t] - mean) * (adv[off[i] + t] - mean);
    if (red && red->sum)
        red->sum(red->ctx, &v, 1);
    /* unbiased (verl raises for a count of 1; here the variance is then 0) */
    const double var = s[1] > 1 ? v / (s[1] + 1e-8) * s[1] / (s[1] - 1) : 0.0;
    const double inv = 1.0 / sqrt(var + 1e-8);
    for (int i = 0; i < n; i++)
        for (int t = 0; t < len[i]; t++)
            adv[off[i] + t] = model_token(mask, off[i] + t) ? (adv[off[i] + t] - mean) * inv : 0.0;
}

void reinforce_pp_advantages(const double *token_rewards, const uint8_t *mask, const int *off, const int *len, int n,
                             double gamma, const struct batch_reduce *red, double *adv)
{
    for (int i = 0; i < n; i++) {
        double ret = 0;
        for (int t = len[i] - 1; t >= 0; t--) {
            if (!model_token(mask, off[i] + t)) { /* skipped: the return passes it unchanged */
                adv[off[i] + t] = 0;
                continue;
            }
            ret = token_rewards[off[i] + t] + gamma * ret;
            adv[off[i] + t] = ret;
        }
    }
    masked_whiten(adv, mask, off, len, n, red);
}

/* Whether response i is the first of its group (the group's statistics are taken once, from it). */
static bool group_leader(const int *group, int i)
{
    for (int j = 0; j < i; j++)
        if (group[j] == group[i])
            return false;
    return true;
}

/* The optimal token baseline (verl v0.9's compute_optimal_token_baseline_advantage, or with tir its multi-turn
 * form compute_multi_turn_optimal_token_baseline_advantage), handle_zero_tail on as verl calls them. */
static void otb_advantages(const struct adv_params *p, bool tir, const double *token_rewards, const uint8_t *mask,
                           const int *off, const int *len, const int *group, int n, double *adv)
{
    int total = 0, longest = 0;
    for (int i = 0; i < n; i++) {
        total = off[i] + len[i] > total ? off[i] + len[i] : total;
        longest = len[i] > longest ? len[i] : longest;
    }
    double *G = xmalloc((size_t)(total ? total : 1) * sizeof(double)); /* reward-to-go */
    double *W = xmalloc((size_t)(total ? total : 1) * sizeof(double)); /* cumulative path variance */
    double *B = xcalloc((size_t)(total ? total : 1), sizeof(double));  /* baseline */
    int *pos = xmalloc((size_t)(total ? total : 1) * sizeof(int));     /* the position a token is baselined at */
    int *own = xmalloc((size_t)(n ? n : 1) * sizeof(int));             /* masked tokens of each response */
    for (int i = 0; i < n; i++) {
        double ret = 0, cum = 0;
        for (int t = len[i] - 1; t >= 0; t--) {
            const int k = off[i] + t;
            ret += model_token(mask, k) ? token_rewards[k] : 0.0;
            G[k] = ret;
        }
        own[i] = 0;
        for (int t = 0; t < len[i]; t++) {
            const int k = off[i] + t;
            double w = 1.0 - 2.0 * exp(p->old_logp[k]) + p->sum_pi_sq[k];
            if (p->is_w)
                w *= p->is_w[k] * p->is_w[k];
            pos[k] = tir ? own[i] : t;
            if (model_token(mask, k)) {
                cum += w;
                own[i]++;
            }
            W[k] = cum;
        }
    }
    double *num = xmalloc((size_t)(longest ? longest : 1) * sizeof(double));
    double *den = xmalloc((size_t)(longest ? longest : 1) * sizeof(double));
    int *mem = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) {
        if (!group_leader(group, i))
            continue;
        int N = 0;
        for (int j = i; j < n; j++) /* the multi-turn form leaves out a response without a masked token */
            if (group[j] == group[i] && (!tir || own[j] > 0))
                mem[N++] = j;
        if (N < 2) /* a lone response: no baseline */
            continue;
        for (int q = 0; q < longest; q++)
            num[q] = den[q] = 0;
        for (int a = 0; a < N; a++) {
            const int j = mem[a];
            for (int t = 0; t < len[j]; t++) {
                const int k = off[j] + t;
                if (model_token(mask, k)) {
                    num[pos[k]] += G[k] * W[k];
                    den[pos[k]] += W[k];
                }
            }
        }
        /* handle_zero_tail: the single longest response, longer than the second, gets no baseline past its length */
        int l1 = -1, l2 = -1, at = -1, ties = 0;
        for (int a = 0; a < N; a++) {
            const int L = own[mem[a]];
            if (L > l1) {
                l2 = l1, l1 = L, at = mem[a], ties = 1;
            } else if (L == l1) {
                l2 = L, ties++;
            } else if (L > l2) {
                l2 = L;
            }
        }
        for (int a = 0; a < N; a++) {
            const int j = mem[a];
            for (int t = 0; t < len[j]; t++) {
                const int k = off[j] + t;
                const bool tail = ties == 1 && l1 > l2 && j == at && pos[k] >= l2;
                B[k] = tail ? 0.0 : num[pos[k]] / (den[pos[k]] + 1e-8);
            }
        }
    }
    for (int k = 0; k < total; k++)
        adv[k] = model_token(mask, k) ? G[k] - B[k] : 0.0;
    free(G), free(W), free(B), free(pos), free(own), free(num), free(den), free(mem);
}

void token_advantages(const struct adv_params *p, const double *token_rewards, const uint8_t *mask, const int *off,
                      const int *len, const int *group, int n, double *scores, double *adv)
{
    for (int i = 0; i < n; i++) {
        double sum = 0;
        for (int t = 0; t < len[i]; t++)
            sum += token_rewards[off[i] + t];
        scores[i] = sum;
    }
    switch (p->est) {
    case ADV_REINFORCE_PP: reinforce_pp_advantages(token_rewards, mask, off, len, n, p->gamma, p->red, adv); return;
    case ADV_REMAX: /* reward-to-go of the masked token rewards, less the greedy baseline, on the masked tokens */
        for (int i = 0; i < n; i++) {
            double ret = 0;
            for (int t = len[i] - 1; t >= 0; t--) {
                const bool m = model_token(mask, off[i] + t);
                ret += m ? token_rewards[off[i] + t] : 0.0;
                adv[off[i] + t] = m ? ret - p->baseline[i] : 0.0;
            }
        }
        return;
    case ADV_OPTIMAL_TOKEN_BASELINE:
    case ADV_TIR_OPTIMAL_TOKEN_BASELINE:
        otb_advantages(p, p->est == ADV_TIR_OPTIMAL_TOKEN_BASELINE, token_rewards, mask, off, len, group, n, adv);
        return;
    default: break;
    }
    double *a = xmalloc((size_t)(n ? n : 1) * sizeof(double));
    if (p->est == ADV_REINFORCE_PP_BASELINE || p->est == ADV_OPO || p->est == ADV_GPG) {
        double alpha = 1.0;
        if (p->est == ADV_GPG) { /* responses over those with a non-zero score, over the whole batch */
            double c[2] = {(double)n, 0};
            for (int i = 0; i < n; i++)
                c[1] += scores[i] != 0.0;
            if (p->red && p->red->sum)
                p->red->sum(p->red->ctx, c, 2);
            alpha = c[0] / (c[1] > 1 ? c[1] : 1);
        }
        for (int i = 0; i < n; i++) {
            double sum = 0, wsum = 0, wr = 0;
            int cnt = 0;
            for (int j = 0; j < n; j++)
                if (group[j] == group[i]) {
                    int own = 0; /* OPO's length: the response's masked tokens */
                    for (int t = 0; t < len[j]; t++)
                        own += model_token(mask, off[j] + t);
                    sum += scores[j];
                    wsum += own, wr += own * scores[j];
                    cnt++;
                }
            double base = cnt > 1 ? sum / cnt : 0.0; /* a group of one: baseline 0 */
            if (p->est == ADV_OPO)
                base = cnt > 1 ? wr / wsum : 0.0;
            a[i] = (p->est == ADV_GPG ? alpha : 1.0) * (scores[i] - base);
        }
    } else if (p->est == ADV_GDPO) { /* each component's GRPO advantage apart, weighted and summed */
        double *col = xmalloc((size_t)(n ? n : 1) * sizeof(double)),
               *ak = xmalloc((size_t)(n ? n : 1) * sizeof(double));
        for (int i = 0; i < n; i++)
            a[i] = 0;
        for (int k = 0; k < p->n_parts; k++) {
            for (int i = 0; i < n; i++)
                col[i] = p->parts[(size_t)i * p->n_parts + k];
            outcome_advantages(ADV_GRPO, p->norm_by_std, col, group, n, ak);
            const double wk = p->part_weights ? p->part_weights[k] : 1.0;
            for (int i = 0; i < n; i++)
                a[i] += wk * ak[i];
        }
        free(col), free(ak);
    } else {
        outcome_advantages(p->est, p->norm_by_std, scores, group, n, a);
    }
    for (int i = 0; i < n; i++)
        for (int t = 0; t < len[i]; t++)
            adv[off[i] + t] = model_token(mask, off[i] + t) ? a[i] : 0.0;
    if (p->est == ADV_REINFORCE_PP_BASELINE || p->est == ADV_GDPO)
        masked_whiten(adv, mask, off, len, n, p->red);
    free(a);
}

double kl_estimate(enum kl_type t, double logp, double ref_logp, double *dkl_dlogp)
{
    double d = logp - ref_logp;
    switch (t) {
    case KL_K1: *dkl_dlogp = 1.0; return d;
    case KL_ABS: *dkl_dlogp = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0); return fabs(d);
    case KL_K2: *dkl_dlogp = d; return 0.5 * d * d;
    case KL_K3: {
        /* kl = ref - logp clamped to [-20, 20]; k3 = exp(kl) - kl - 1 clamped to [-10, 10] */
        double kl = -d, dkl = -1.0;
        if (kl > 20 || kl < -20) {
            kl = kl > 20 ? 20 : -20;
            dkl = 0;
        }
        double v = exp(kl) - kl - 1, dv = (exp(kl) - 1) * dkl;
        if (v > 10 || v < -10) {
            v = v > 10 ? 10 : -10;
            dv = 0;
        }
        *dkl_dlogp = dv;
        return v;
    }
    }
    *dkl_dlogp = 0;
    return 0;
}

/* The model's tokens among the len tokens of mask (all of them without one). */
static int model_tokens(const uint8_t *mask, int len)
{
    if (!mask)
        return len;
    int k = 0;
    for (int t = 0; t < len; t++)
        k += mask[t] != 0;
    return k;
}

void loss_token_weights(enum loss_agg mode, const int *len, const uint8_t *mask, int n, int max_response_length,
                        double *w)
{
    long long total = 0;
    for (int i = 0, off = 0; i < n; off += len[i++])
        total += model_tokens(mask ? mask + off : NULL, len[i]);
    loss_token_weights_dist(mode, len, mask, n, n, total, max_response_length, w);
}

void loss_token_weights_dist(enum loss_agg mode, const int *len, const uint8_t *mask, int n, long long n_all,
                             long long tokens_all, int max_response_length, double *w)
{
    const double N = (double)n_all;
    int off = 0;
    for (int i = 0; i < n; i++) {
        const int own = model_tokens(mask ? mask + off : NULL, len[i]);
        double wi = 0;
        switch (mode) {
        case AGG_TOKEN_MEAN: wi = tokens_all ? 1.0 / (double)tokens_all : 0; break;
        case AGG_SEQ_MEAN_TOKEN_SUM: wi = 1.0 / N; break;
        case AGG_SEQ_MEAN_TOKEN_MEAN: wi = own ? 1.0 / (N * own) : 0; break;
        case AGG_SEQ_MEAN_TOKEN_SUM_NORM: wi = 1.0 / (N * max_response_length); break;
        }
        for (int t = 0; t < len[i]; t++)
            w[off + t] = !mask || mask[off + t] ? wi : 0.0;
        off += len[i];
    }
}

int loss_mode_from_name(const char *s)
{
    static const char *const names[] = {"vanilla",  "gspo", "sapo",  "gpg",     "clip_cov", "kl_cov",
                                        "geo_mean", "dro",  "cispo", "dppo_tv", "dppo_kl"};
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

int loss_mode_agg(enum loss_mode m)
{
    switch (m) {
    case LOSS_GSPO:
    case LOSS_SAPO: return AGG_SEQ_MEAN_TOKEN_MEAN;
    case LOSS_GEO_MEAN: return AGG_SEQ_MEAN_TOKEN_SUM; /* 1 / sequences on each of a sequence's tokens */
    default: return -1;
    }
}

/* The policy-gradient term of one token. */
struct pg_term {
    double loss, d;   /* its value and d/dlogp */
    bool clip, lower; /* counts in actor/pg_clipfrac, actor/pg_clipfrac_lower */
    double kl;        /* its part of actor/ppo_kl */
};

/* What a token's term needs beyond its log-probs and advantage: gspo's sequence log ratio, clip_cov's correction (0:
 * the token was chosen), kl_cov's choice. */
struct pg_ctx {
    double seq_lr;
    bool corr0, sel;
};

/* torch.clamp(x, -20, 20) of a log ratio: the value, and whether the gradient passes */
static double clamp20(double nkl, double *dn)
{
    *dn = 1.0;
    if (nkl > 20 || nkl < -20) {
        *dn = 0;
        return nkl > 20 ? 20 : -20;
    }
    return nkl;
}

#define PG_REINFORCE (-1) /* bypass mode's REINFORCE: -A logp (its IS weight applied by the caller) */

static void pg_token(const struct policy_loss_params *p, int mode, double x, double o, double A, const struct pg_ctx *c,
                     struct pg_term *r)
{
    const double lo = 1 - p->clip_low, hi = 1 + p->clip_high;
    *r = (struct pg_term){0};
    double dn;
    switch (mode) {
    case LOSS_VANILLA: {
        const double nkl = clamp20(x - o, &dn);
        const double ratio = exp(nkl), dratio = ratio * dn;
        const double l1 = -A * ratio;
        const double clipped = ratio < lo ? lo : (ratio > hi ? hi : ratio);
        const double l2 = -A * clipped;
        const double dl2 = (ratio < lo || ratio > hi) ? 0.0 : -A * dratio;
        /* max(l1, l2): the clipped branch only where it is strictly larger */
        if (l2 > l1) {
            r->loss = l2;
            r->d = dl2;
        } else {
            r->loss = l1;
            r->d = -A * dratio;
        }
        r->clip = l2 > l1;
        if (A < 0) { /* dual clip: min(l3, max(l1, l2)) */
            const double l3 = -A * p->clip_c;
            if (r->loss > l3) {
                r->loss = l3;
                r->d = 0;
                r->lower = true;
            }
        }
        r->kl = -nkl;
        return;
    }
    case LOSS_GSPO: { /* exp(min(s, 10)) with s the sequence's mean log ratio; d/dlogp of the token's own part */
        const double lv = c->seq_lr < 10 ? c->seq_lr : 10, ds = c->seq_lr <= 10 ? 1.0 : 0.0;
        const double sr = exp(lv), dsr = sr * ds;
        const double l1 = -A * sr, cl = sr < lo ? lo : (sr > hi ? hi : sr), l2 = -A * cl;
        if (l2 > l1) {
            r->loss = l2;
            r->d = (sr < lo || sr > hi) ? 0.0 : -A * dsr;
        } else {
            r->loss = l1;
            r->d = -A * dsr;
        }
        r->clip = l2 > l1;
        r->kl = -(x - o);
        return;
    }
    case LOSS_SAPO: { /* -A sigmoid(tau (r - 1)) 4 / tau, tau_pos where A > 0 */
        const double nkl = clamp20(x - o, &dn), ratio = exp(nkl);
        const double tau = A > 0 ? p->tau_pos : p->tau_neg;
        const double sig = 1.0 / (1.0 + exp(-tau * (ratio - 1.0)));
        r->loss = -A * sig * 4.0 / tau;
        r->d = -A * 4.0 * sig * (1.0 - sig) * ratio * dn;
        r->kl = -nkl;
        return;
    }
    case LOSS_GPG:
    case PG_REINFORCE:
        r->loss = -A * x;
        r->d = -A;
        r->kl = mode == PG_REINFORCE ? -(x - o) : 0.0; /* gpg reports no ppo_kl in verl */
        return;
    case LOSS_CLIP_COV: { /* the clipped loss without dual clip or clamp, 0 on the chosen tokens */
        const double nkl = x - o, ratio = exp(nkl);
        const double l1 = -A * ratio, cl = ratio < lo ? lo : (ratio > hi ? hi : ratio), l2 = -A * cl;
        const double corr = c->corr0 ? 0.0 : 1.0;
        r->loss = (l2 > l1 ? l2 : l1) * corr;
        r->d = (l2 > l1 ? 0.0 : -A * ratio) * corr;
        r->clip = c->corr0;
        r->kl = -nkl;
        return;
    }
    case LOSS_KL_COV: { /* -A r, plus ppo_kl_coef |log r| on the chosen tokens */
        const double nkl = x - o, ratio = exp(nkl);
        r->loss = -A * ratio;
        r->d = -A * ratio;
        if (c->sel) {
            r->loss += p->ppo_kl_coef * fabs(nkl);
            r->d += p->ppo_kl_coef * (nkl > 0 ? 1.0 : (nkl < 0 ? -1.0 : 0.0));
        }
        r->kl = fabs(nkl); /* verl's kl_cov reports mean |log r| as actor/ppo_kl */
        return;
    }
    case LOSS_DRO: { /* -(logp A - beta / 2 (log r)^2) */
        const double nkl = x - o;
        r->loss = -(x * A - 0.5 * p->dro_beta * nkl * nkl);
        r->d = -(A - p->dro_beta * nkl);
        r->kl = -nkl;
        return;
    }
    case LOSS_CISPO: { /* -sg(clip(r)) A logp */
        const double nkl = clamp20(x - o, &dn), ratio = exp(nkl);
        const double cl = ratio < lo ? lo : (ratio > hi ? hi : ratio);
        r->loss = -cl * A * x;
        r->d = -cl * A;
        r->clip = ratio != cl;
        r->kl = -nkl;
        return;
    }
    case LOSS_DPPO_TV:
    case LOSS_DPPO_KL: { /* -A sg(min(r, clip_ratio_c)) logp on the tokens the divergence bound keeps */
        const double nkl = clamp20(x - o, &dn), ratio = exp(nkl);
        const double tr = ratio < p->clip_c ? ratio : p->clip_c;
        const double pr = exp(x), po = exp(o);
        bool valid;
        if (mode == LOSS_DPPO_TV) {
            valid = A > 0 ? pr - po <= p->clip_high : pr - po >= -p->clip_low;
        } else {
            const double bkl = po * (o - x) + (1.0 - po) * log((1.0 - po + 1e-8) / (1.0 - pr + 1e-8));
            valid = A > 0 ? (bkl <= p->clip_high || pr <= po) : (bkl <= p->clip_low || pr >= po);
        }
        r->loss = valid ? -A * tr * x : 0.0;
        r->d = valid ? -A * tr : 0.0;
        r->clip = !valid;
        r->lower = ratio > p->clip_c && valid;
        r->kl = -nkl;
        return;
    }
    default: return;
    }
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A packed token of the micro-batch (sequence, position) and a key to order by. */
struct tok_ref {
    int seq, t;
    double key;
};

static int by_key_desc(const void *a, const void *b)
{
    const struct tok_ref *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return x->seq != y->seq ? x->seq - y->seq : x->t - y->t; /* the first of equals first */
}

void policy_loss_seqs(const struct policy_loss_params *p, const struct pl_seq *s, int n, uint64_t seed,
                      struct policy_loss_stats *st, struct rc_metrics *rcm)
{
    const bool bypass = p->bypass != NULL;
    const int mode = bypass ? (p->bypass->reinforce ? PG_REINFORCE : LOSS_VANILLA) : (int)p->mode;
    /* the tokens the policy-gradient term takes: the sequence's mask, narrowed by bypass mode's rejection */
    uint8_t **pgm = xcalloc((size_t)(n ? n : 1), sizeof *pgm);
    float **bw = NULL; /* bypass mode's IS weights */
    if (bypass) {
        const int *lens = NULL;
        int *lv = xmalloc((size_t)(n ? n : 1) * sizeof(int));
        const float **lp = xmalloc((size_t)(n ? n : 1) * sizeof *lp), **ro = xmalloc((size_t)(n ? n : 1) * sizeof *ro);
        const uint8_t **mk = xmalloc((size_t)(n ? n : 1) * sizeof *mk);
        if (p->bypass->is != RC_OFF)
            bw = xcalloc((size_t)(n ? n : 1), sizeof *bw);
        for (int i = 0; i < n; i++) {
            lv[i] = s[i].len, lp[i] = s[i].logp, ro[i] = s[i].rollout_logp, mk[i] = s[i].mask;
            pgm[i] = xmalloc((size_t)(s[i].len ? s[i].len : 1));
            if (bw)
                bw[i] = xmalloc((size_t)(s[i].len ? s[i].len : 1) * sizeof(float));
        }
        lens = lv;
        rollout_corr_compute(p->bypass, n, lens, lp, ro, mk, NULL, false, bw, pgm, rcm);
        free(lv), free(lp), free(ro), free(mk);
    } else {
        for (int i = 0; i < n; i++) {
            pgm[i] = xmalloc((size_t)(s[i].len ? s[i].len : 1));
            for (int t = 0; t < s[i].len; t++)
                pgm[i][t] = !s[i].mask || s[i].mask[t];
        }
    }
    /* the micro-batch's choices: clip_cov's corrections, kl_cov's penalised tokens */
    uint8_t **pick = NULL;
    if (mode == LOSS_CLIP_COV || mode == LOSS_KL_COV) {
        pick = xcalloc((size_t)(n ? n : 1), sizeof *pick);
        long long T = 0;
        double sa = 0, sx = 0;
        for (int i = 0; i < n; i++) {
            pick[i] = xcalloc((size_t)(s[i].len ? s[i].len : 1), 1);
            for (int t = 0; t < s[i].len; t++)
                if (pgm[i][t]) {
                    T++;
                    sa += s[i].adv[t];
                    sx += s[i].logp[t];
                }
        }
        struct tok_ref *c = xmalloc((size_t)(T ? T : 1) * sizeof *c);
        int nc = 0;
        if (mode == LOSS_CLIP_COV) { /* masked means (count + 1e-8); candidates within (lb, ub), not clipped already */
            const double ma = sa / ((double)T + 1e-8), mx = sx / ((double)T + 1e-8);
            const double lo = 1 - p->clip_low, hi = 1 + p->clip_high;
            for (int i = 0; i < n; i++)
                for (int t = 0; t < s[i].len; t++) {
                    if (!pgm[i][t])
                        continue;
                    const double A = s[i].adv[t], ratio = exp((double)s[i].logp[t] - s[i].old_logp[t]);
                    const double cl = ratio < lo ? lo : (ratio > hi ? hi : ratio);
                    if (-A * cl > -A * ratio)
                        continue; /* clipped by the ratio already */
                    const double cov = (A - ma) * ((double)s[i].logp[t] - mx);
                    if (cov < p->clip_cov_ub && cov > p->clip_cov_lb)
                        c[nc++] = (struct tok_ref){i, t, 0};
                }
            long long num = (long long)(p->clip_cov_ratio * (double)T);
            num = num > 1 ? num : 1;
            const int k = (long long)nc < num ? nc : (int)num;
            uint64_t rng = seed;
            for (int j = 0; j < k; j++) { /* a uniform random choice of k of them (verl: torch.randperm) */
                const int r = j + (int)(splitmix64(&rng) % (uint64_t)(nc - j));
                const struct tok_ref tmp = c[j];
                c[j] = c[r], c[r] = tmp;
                pick[c[j].seq][c[j].t] = 1;
            }
        } else if (T > 0) { /* plain means; the largest covariances, max(1, int(N kl_cov_ratio)) of them */
            const double ma = sa / (double)T, mx = sx / (double)T;
            for (int i = 0; i < n; i++)
                for (int t = 0; t < s[i].len; t++)
                    if (pgm[i][t])
                        c[nc++] = (struct tok_ref){i, t, (s[i].adv[t] - ma) * ((double)s[i].logp[t] - mx)};
            qsort(c, (size_t)nc, sizeof *c, by_key_desc);
            long long k = (long long)((double)T * p->kl_cov_ratio);
            k = k > 1 ? k : 1;
            k = k < nc ? k : nc;
            for (long long j = 0; j < k; j++)
                pick[c[j].seq][c[j].t] = 1;
        }
        free(c);
    }
    for (int i = 0; i < n; i++) {
        const struct pl_seq *q = &s[i];
        const double *wpg = q->w_pg ? q->w_pg : q->w;
        /* per sequence: its tokens in the policy-gradient term, before and after bypass mode's rejection */
        int own = 0, own_pg = 0, first = -1;
        double seq_lr = 0;
        for (int t = 0; t < q->len; t++) {
            own += !q->mask || q->mask[t];
            if (pgm[i][t]) {
                own_pg++;
                seq_lr += (double)q->logp[t] - q->old_logp[t];
                first = first < 0 ? t : first;
            }
        }
        /* bypass mode: seq-mean-token-mean counts the tokens rejection kept (the other modes' denominators do not
         * move: verl's global token and sequence counts are taken before the loss) */
        const double wscale = bypass && p->agg == AGG_SEQ_MEAN_TOKEN_MEAN && own_pg ? (double)own / own_pg : 1.0;
        const struct pg_ctx ctx0 = {.seq_lr = seq_lr / (own_pg > 1 ? own_pg : 1)};
        /* geo_mean: one term per sequence, -mean(A) exp(mean of the sign-clipped log ratios) */
        double geo_coef = 0;
        if (mode == LOSS_GEO_MEAN && own_pg) {
            double msum = 0, asum = 0, lis = 0;
            for (int t = 0; t < q->len; t++)
                if (pgm[i][t]) {
                    const double nkl = (double)q->logp[t] - q->old_logp[t], A = q->adv[t];
                    const double sg = A > 0 ? 1.0 : (A < 0 ? -1.0 : 0.0);
                    const double xc = nkl < -p->clip_low ? -p->clip_low : (nkl > p->clip_high ? p->clip_high : nkl);
                    msum += sg * fmin(sg * nkl, sg * xc);
                    asum += A;
                    if (q->is_w)
                        lis += log((double)q->is_w[t] + 1e-10);
                }
            const double L = (double)own_pg + 1e-8;
            const double ratio = exp(msum / L), abar = asum / L, sis = q->is_w ? exp(lis / L) : 1.0;
            const double w = wpg[first];
            st->pg_loss += w * -abar * ratio * sis;
            st->loss += w * -abar * ratio * sis;
            geo_coef = w * -abar * ratio * sis / L; /* times d(clipped log ratio)/dlogp of each token */
        }
        for (int t = 0; t < q->len; t++) {
            if (q->mask && !q->mask[t]) { /* not trained on: no loss, no statistic, no gradient */
                q->dlogp[t] = 0.0f;
                if (q->dentropy)
                    q->dentropy[t] = 0.0f;
                continue;
            }
            double total = 0, dtotal = 0;
            if (pgm[i][t]) {
                const double x = q->logp[t], A = q->adv[t];
                const double o = bypass ? q->rollout_logp[t] : q->old_logp[t];
                if (mode == LOSS_GEO_MEAN) {
                    const double nkl = x - o, sg = A > 0 ? 1.0 : (A < 0 ? -1.0 : 0.0);
                    const double xc = nkl < -p->clip_low ? -p->clip_low : (nkl > p->clip_high ? p->clip_high : nkl);
                    /* min(sg nkl, sg clamp(nkl)): through nkl where it is the smaller or they tie inside the bounds */
                    const double dm = sg != 0 && sg * nkl <= sg * xc ? 1.0 : 0.0; /* a tie is inside the bounds */
                    dtotal += geo_coef * dm;
                    st->pg_clipfrac += nkl != xc && A > 0;
                    st->pg_clipfrac_lower += nkl != xc && A < 0;
                    st->ppo_kl += -nkl;
                } else {
                    struct pg_ctx ctx = ctx0;
                    ctx.corr0 = pick && mode == LOSS_CLIP_COV && pick[i][t];
                    ctx.sel = pick && mode == LOSS_KL_COV && pick[i][t];
                    struct pg_term r;
                    pg_token(p, mode, x, o, A, &ctx, &r);
                    const double isw = bypass ? (bw ? bw[i][t] : 1.0) : (q->is_w ? q->is_w[t] : 1.0);
                    const double w = wpg[t] * wscale * isw;
                    st->pg_loss += w * r.loss;
                    total += w * r.loss;
                    dtotal += w * r.d;
                    st->pg_clipfrac += r.clip;
                    st->pg_clipfrac_lower += r.lower;
                    st->ppo_kl += r.kl;
                }
                st->tokens++;
            }
            if (p->use_kl_loss) {
                double dkl;
                const double kl = kl_estimate(p->kl_type, q->logp[t], q->ref_logp[t], &dkl);
                st->kl_loss += q->w[t] * kl;
                total += p->kl_coef * q->w[t] * kl;
                dtotal += p->kl_coef * q->w[t] * dkl;
            }
            const double ent = q->entropy ? q->entropy[t] : 0.0;
            st->entropy += q->w[t] * ent;
            total -= p->entropy_coeff * q->w[t] * ent;
            st->loss += total;
            q->dlogp[t] = (float)dtotal;
            if (q->dentropy)
                q->dentropy[t] = (float)(-p->entropy_coeff * q->w[t]);
        }
    }
    for (int i = 0; i < n; i++) {
        free(pgm[i]);
        if (bw)
            free(bw[i]);
        if (pick)
            free(pick[i]);
    }
    free(pgm), free(bw), free(pick);
}

void policy_loss_tokens(const struct policy_loss_params *p, int n, const float *logp, const float *old_logp,
                        const float *ref_logp, const float *entropy, const double *adv, const double *w,
                        const uint8_t *mask, struct policy_loss_stats *st, float *dlogp, float *dentropy)
{
    const struct pl_seq q = {.len = n,
                             .logp = logp,
                             .old_logp = old_logp,
                             .ref_logp = ref_logp,
                             .entropy = entropy,
                             .rollout_logp = old_logp,
                             .adv = adv,
                             .w = w,
                             .mask = mask,
                             .dlogp = dlogp,
                             .dentropy = dentropy};
    policy_loss_seqs(p, &q, 1, 0, st, NULL);
}
