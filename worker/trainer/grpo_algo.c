#include "grpo_algo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

int adv_estimator_from_name(const char *s)
{
    if (strcmp(s, "grpo") == 0)
        return ADV_GRPO;
    if (strcmp(s, "rloo") == 0)
        return ADV_RLOO;
    if (strcmp(s, "reinforce_plus_plus") == 0)
        return ADV_REINFORCE_PP;
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
        int cnt = 0;
        for (int j = 0; j < n; j++)
            if (group[j] == group[i]) {
                sum += scores[j];
                cnt++;
            }
        double mean = sum / cnt;
        for (int j = 0; j < n; j++)
            if (group[j] == group[i])
                sumsq += (scores[j] - mean) * (scores[j] - mean);
        if (cnt == 1) { /* verl: a lone response has mean 0 and std 1 (RLOO leaves it as is) */
            adv[i] = (est == ADV_GRPO && norm_by_std) ? scores[i] / (1.0 + eps) : scores[i];
            continue;
        }
        if (est == ADV_RLOO) {
            adv[i] = scores[i] - (sum - scores[i]) / (cnt - 1);
        } else {
            double std = sqrt(sumsq / (cnt - 1));
            adv[i] = norm_by_std ? (scores[i] - mean) / (std + eps) : scores[i] - mean;
        }
    }
}

/* Whether packed token k is the model's (mask NULL: every token). */
static bool model_token(const uint8_t *mask, int k) { return !mask || mask[k]; }

void reinforce_pp_advantages(const double *token_rewards, const uint8_t *mask, const int *off, const int *len, int n,
                             double *adv)
{
    long long count = 0;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        double ret = 0;
        for (int t = len[i] - 1; t >= 0; t--) {
            ret += token_rewards[off[i] + t];
            adv[off[i] + t] = ret;
            if (!model_token(mask, off[i] + t)) /* verl: running_return * response_mask */
                ret = 0;
        }
        for (int t = 0; t < len[i]; t++)
            if (model_token(mask, off[i] + t)) {
                sum += adv[off[i] + t];
                count++;
            }
    }
    for (int i = 0; i < n; i++) /* the tokens put in from outside: advantage 0 */
        for (int t = 0; t < len[i]; t++)
            if (!model_token(mask, off[i] + t))
                adv[off[i] + t] = 0;
    if (count == 0)
        return;
    double mean = sum / (double)count, var = 0;
    for (int i = 0; i < n; i++)
        for (int t = 0; t < len[i]; t++)
            if (model_token(mask, off[i] + t))
                var += (adv[off[i] + t] - mean) * (adv[off[i] + t] - mean);
    var = count > 1 ? var / (double)(count - 1) : 0; /* unbiased, as masked_var */
    double inv = 1.0 / sqrt(var + 1e-8);
    for (int i = 0; i < n; i++)
        for (int t = 0; t < len[i]; t++)
            if (model_token(mask, off[i] + t))
                adv[off[i] + t] = (adv[off[i] + t] - mean) * inv;
}

void token_advantages(enum adv_estimator est, bool norm_by_std, const double *token_rewards, const uint8_t *mask,
                      const int *off, const int *len, const int *group, int n, double *scores, double *adv)
{
    for (int i = 0; i < n; i++) {
        double sum = 0;
        for (int t = 0; t < len[i]; t++)
            sum += token_rewards[off[i] + t];
        scores[i] = sum;
    }
    if (est == ADV_REINFORCE_PP) {
        reinforce_pp_advantages(token_rewards, mask, off, len, n, adv);
        return;
    }
    double *a = xmalloc((size_t)(n ? n : 1) * sizeof(double));
    outcome_advantages(est, norm_by_std, scores, group, n, a);
    for (int i = 0; i < n; i++)
        for (int t = 0; t < len[i]; t++)
            adv[off[i] + t] = model_token(mask, off[i] + t) ? a[i] : 0.0;
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

void policy_loss_tokens(const struct policy_loss_params *p, int n, const float *logp, const float *old_logp,
                        const float *ref_logp, const float *entropy, const double *adv, const double *w,
                        const uint8_t *mask, struct policy_loss_stats *st, float *dlogp, float *dentropy)
{
    for (int i = 0; i < n; i++) {
        if (mask && !mask[i]) { /* not the model's token: no loss, no statistic, no gradient */
            dlogp[i] = 0.0f;
            if (dentropy)
                dentropy[i] = 0.0f;
            continue;
        }
        const double A = adv[i];
        double nkl = (double)logp[i] - old_logp[i], dnkl = 1.0;
        if (nkl > 20 || nkl < -20) { /* torch.clamp: no gradient outside */
            nkl = nkl > 20 ? 20 : -20;
            dnkl = 0;
        }
        const double ratio = exp(nkl), dratio = ratio * dnkl;
        const double lo = 1 - p->clip_low, hi = 1 + p->clip_high;
        const double l1 = -A * ratio;
        const double clipped = ratio < lo ? lo : (ratio > hi ? hi : ratio);
        const double l2 = -A * clipped;
        const double dl2 = (ratio < lo || ratio > hi) ? 0.0 : -A * dratio;
        double loss, dloss;
        /* max(l1, l2): the clipped branch only where it is strictly larger */
        if (l2 > l1) {
            loss = l2;
            dloss = dl2;
        } else {
            loss = l1;
            dloss = -A * dratio;
        }
        const bool clipfrac = l2 > l1;
        bool lower = false;
        if (A < 0) { /* dual clip: min(l3, max(l1, l2)) */
            const double l3 = -A * p->clip_c;
            if (loss > l3) {
                loss = l3;
                dloss = 0;
                lower = true;
            }
        }
        double dtotal = w[i] * dloss;
        st->pg_loss += w[i] * loss;
        double total = w[i] * loss;
        if (p->use_kl_loss) {
            double dkl;
            double kl = kl_estimate(p->kl_type, logp[i], ref_logp[i], &dkl);
            st->kl_loss += w[i] * kl;
            total += p->kl_coef * w[i] * kl;
            dtotal += p->kl_coef * w[i] * dkl;
        }
        const double ent = entropy ? entropy[i] : 0.0;
        st->entropy += w[i] * ent;
        total -= p->entropy_coeff * w[i] * ent;
        st->loss += total;
        st->pg_clipfrac += clipfrac;
        st->pg_clipfrac_lower += lower;
        st->ppo_kl += -nkl;
        st->tokens++;
        dlogp[i] = (float)dtotal;
        if (dentropy)
            dentropy[i] = (float)(-p->entropy_coeff * w[i]);
    }
}
