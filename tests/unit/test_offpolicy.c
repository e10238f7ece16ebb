/* verl v0.9's loss modes, advantage estimators and rollout correction against hand-worked cases (the numbers worked
 * on paper in the comments, from verl's formulas in core_algos.py and rollout_corr_helper.py), and each loss's
 * dL/dlogp against central differences where verl's loss has no stop-gradient (its analytic form otherwise). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/trainer/grpo_algo.h"
#include "worker/trainer/rollout_corr.h"

/* ------------------------------------------------------------------ advantage estimators */

/* Group 0: scores 1, 0, 0.5 (lengths 2, 1, 1); group 1: a lone 0.7 (length 2); each score at its last token. */
static const int OFF[4] = {0, 2, 3, 4}, LEN[4] = {2, 1, 1, 2}, GROUP[4] = {0, 0, 0, 1};
static const double R[6] = {0, 1, 0, 0.5, 0, 0.7};

static void run_est(enum adv_estimator est, bool norm, const uint8_t *mask, double *adv)
{
    double scores[4];
    const struct adv_params p = {.est = est, .norm_by_std = norm, .gamma = 1.0};
    token_advantages(&p, R, mask, OFF, LEN, GROUP, 4, scores, adv);
    assert_float_equal(scores[0], 1.0, 0);
    assert_float_equal(scores[3], 0.7, 0);
}

static void test_estimators(void **state)
{
    (void)state;
    double a[6];
    /* rloo: 1 - 0.25 = 0.75, 0 - 0.75, 0.5 - 0.5; the lone response keeps 0.7; rloo_vectorized gives it 0 */
    run_est(ADV_RLOO, true, NULL, a);
    assert_float_equal(a[0], 0.75, 1e-15);
    assert_float_equal(a[2], -0.75, 1e-15);
    assert_float_equal(a[4], 0.7, 1e-15);
    run_est(ADV_RLOO_VECTORIZED, true, NULL, a);
    assert_float_equal(a[1], 0.75, 1e-15);
    assert_float_equal(a[3], 0.0, 1e-15);
    assert_float_equal(a[5], 0.0, 0);
    /* grpo_passk: the best (1) gets 1 - 0.5 over (std 0.5 + 1e-6), the others 0; the lone response 0 */
    run_est(ADV_GRPO_PASSK, true, NULL, a);
    assert_float_equal(a[0], 0.5 / (0.5 + 1e-6), 1e-12);
    assert_float_equal(a[1], 0.5 / (0.5 + 1e-6), 1e-12);
    assert_float_equal(a[2], 0.0, 0);
    assert_float_equal(a[3], 0.0, 0);
    assert_float_equal(a[4], 0.0, 0);
    run_est(ADV_GRPO_PASSK, false, NULL, a);
    assert_float_equal(a[0], 0.5, 1e-15);
    /* opo: group 0's baseline (2 x 1 + 1 x 0 + 1 x 0.5) / 4 = 0.625: 0.375, -0.625, -0.125; lone: 0.7 */
    run_est(ADV_OPO, true, NULL, a);
    assert_float_equal(a[0], 0.375, 1e-15);
    assert_float_equal(a[2], -0.625, 1e-15);
    assert_float_equal(a[3], -0.125, 1e-15);
    assert_float_equal(a[5], 0.7, 1e-15);
    /* gpg: alpha = 4 responses / 3 with a non-zero score; group mean 0.5: 4/3 x 0.5, 4/3 x -0.5, 0; lone 4/3 x 0.7 */
    run_est(ADV_GPG, true, NULL, a);
    assert_float_equal(a[0], 4.0 / 3 * 0.5, 1e-15);
    assert_float_equal(a[2], -4.0 / 3 * 0.5, 1e-15);
    assert_float_equal(a[3], 0.0, 1e-15);
    assert_float_equal(a[4], 4.0 / 3 * 0.7, 1e-15);
    /* reinforce_plus_plus_baseline: r - group mean on every token: 0.5 0.5 | -0.5 | 0 | 0.7 0.7, whitened over the
     * six: mean 1.9 / (6 + 1e-8), unbiased variance of the six about it */
    run_est(ADV_REINFORCE_PP_BASELINE, true, NULL, a);
    const double v[6] = {0.5, 0.5, -0.5, 0, 0.7, 0.7};
    const double mean = 1.9 / (6 + 1e-8);
    double ss = 0;
    for (int k = 0; k < 6; k++)
        ss += (v[k] - mean) * (v[k] - mean);
    const double sd = sqrt(ss / (6 + 1e-8) * 6 / 5 + 1e-8);
    for (int k = 0; k < 6; k++)
        assert_float_equal(a[k], (v[k] - mean) / sd, 1e-12);
    /* with a mask (the first response's first token not trained): opo's lengths are the masked tokens (1, 1, 1:
     * baseline 0.5), and the masked token gets 0 */
    const uint8_t mask[6] = {0, 1, 1, 1, 1, 1};
    run_est(ADV_OPO, true, mask, a);
    assert_float_equal(a[0], 0.0, 0);
    assert_float_equal(a[1], 0.5, 1e-15);
    assert_float_equal(a[2], -0.5, 1e-15);
    /* remax: the reward-to-go of the masked rewards less each response's greedy baseline */
    const double base[4] = {0.25, 0.25, 0.25, 1.0};
    double scores[4];
    const struct adv_params rm = {.est = ADV_REMAX, .gamma = 1.0, .baseline = base};
    token_advantages(&rm, R, NULL, OFF, LEN, GROUP, 4, scores, a);
    assert_float_equal(a[0], 0.75, 1e-15);
    assert_float_equal(a[1], 0.75, 1e-15);
    assert_float_equal(a[2], -0.25, 1e-15);
    assert_float_equal(a[5], -0.3, 1e-15);
    assert_int_equal(adv_estimator_from_name("grpo_vectorized"), ADV_GRPO);
    assert_int_equal(adv_estimator_from_name("gae"), -1);
}

/* The optimal token baseline on the same four responses: each token's pi = exp(old_logp) and sum_pi_sq give its
 * w = 1 - 2 pi + sum_pi_sq: 0.5 and 1 on the first response's two tokens, 0.75 on the second's, 0.25 on the third's
 * (the lone fourth: 0.5 each). */
static const double PI[6] = {0.5, 0.25, 0.5, 0.75, 0.5, 0.5}, SPP[6] = {0.5, 0.5, 0.75, 0.75, 0.5, 0.5};

static void run_otb(enum adv_estimator est, const uint8_t *mask, const double *is_w, double *adv)
{
    double old[6], scores[4];
    for (int k = 0; k < 6; k++)
        old[k] = log(PI[k]);
    const struct adv_params p = {.est = est, .old_logp = old, .sum_pi_sq = SPP, .is_w = is_w};
    token_advantages(&p, R, mask, OFF, LEN, GROUP, 4, scores, adv);
    assert_float_equal(scores[0], 1.0, 0);
}

static void test_optimal_token_baseline(void **state)
{
    (void)state;
    double a[6];
    /* group 0's returns G: 1 1 | 0 | 0.5, cumulative W: 0.5 1.5 | 0.75 | 0.25. Position 0: B = (1 x 0.5 + 0 x 0.75 +
     * 0.5 x 0.25) / (1.5 + 1e-8) = 0.625 / 1.5; position 1 the first response's alone, but it is the single longest
     * (2 tokens, the others 1): handle_zero_tail gives it no baseline from position 1. The lone response: B = 0. */
    for (int tir = 0; tir < 2; tir++) {
        run_otb(tir ? ADV_TIR_OPTIMAL_TOKEN_BASELINE : ADV_OPTIMAL_TOKEN_BASELINE, NULL, NULL, a);
        const double b0 = 0.625 / (1.5 + 1e-8);
        assert_float_equal(a[0], 1 - b0, 1e-15);
        assert_float_equal(a[1], 1.0, 0);
        assert_float_equal(a[2], -b0, 1e-15);
        assert_float_equal(a[3], 0.5 - b0, 1e-15);
        assert_float_equal(a[4], 0.7, 1e-15);
        assert_float_equal(a[5], 0.7, 1e-15);
    }
    /* an IS weight of 2 on the second response's token scales its w by 4: 3; position 0's B = 0.625 / 3.75 */
    const double isw[6] = {1, 1, 2, 1, 1, 1};
    run_otb(ADV_OPTIMAL_TOKEN_BASELINE, NULL, isw, a);
    assert_float_equal(a[2], -0.625 / (3.75 + 1e-8), 1e-15);
    assert_float_equal(a[0], 1 - 0.625 / (3.75 + 1e-8), 1e-15);
    /* the first response's first token masked out: its W is 0 there, 1 on its second token, and every response has
     * one masked token (no zero tail). By position: position 0 holds the second and third responses, B = (0 x 0.75
     * + 0.5 x 0.25) / 1; position 1 the first's second token alone, B = 1 x 1 / (1 + 1e-8). The multi-turn form
     * counts masked tokens: the first's second token is its position 0, with the other two: B = (1 x 1 + 0 + 0.5 x
     * 0.25) / (2 + 1e-8). The masked-out token gets 0. */
    const uint8_t mask[6] = {0, 1, 1, 1, 1, 1};
    run_otb(ADV_OPTIMAL_TOKEN_BASELINE, mask, NULL, a);
    assert_float_equal(a[0], 0.0, 0);
    assert_float_equal(a[1], 1 - 1 / (1 + 1e-8), 1e-15);
    assert_float_equal(a[2], -0.125 / (1 + 1e-8), 1e-15);
    assert_float_equal(a[3], 0.5 - 0.125 / (1 + 1e-8), 1e-15);
    run_otb(ADV_TIR_OPTIMAL_TOKEN_BASELINE, mask, NULL, a);
    const double bt = 1.125 / (2 + 1e-8);
    assert_float_equal(a[0], 0.0, 0);
    assert_float_equal(a[1], 1 - bt, 1e-15);
    assert_float_equal(a[2], -bt, 1e-15);
    assert_float_equal(a[3], 0.5 - bt, 1e-15);
    assert_float_equal(a[4], 0.7, 1e-15);
    /* a response of the group with no masked token: the multi-turn form leaves it out of the group (the other two
     * then share position 0), the other counts it nowhere either (its W is 0 where it is masked) */
    const uint8_t none[6] = {1, 1, 0, 1, 1, 1};
    run_otb(ADV_TIR_OPTIMAL_TOKEN_BASELINE, none, NULL, a);
    assert_float_equal(a[2], 0.0, 0);
    assert_float_equal(a[0], 1 - (0.5 + 0.125) / (0.75 + 1e-8), 1e-15);
    assert_float_equal(a[1], 1.0, 0); /* the single longest, past the second-longest's 1 token */
    assert_int_equal(adv_estimator_from_name("optimal_token_baseline"), ADV_OPTIMAL_TOKEN_BASELINE);
    assert_int_equal(adv_estimator_from_name("tir_optimal_token_baseline"), ADV_TIR_OPTIMAL_TOKEN_BASELINE);
}

/* GDPO: two components, A = the scores 1, 0, 0.5 | 0.7 and B = 0, 1, 1 | 0, weights 1 and 0.5: each component's
 * GRPO advantage apart (group 0: A's mean 0.5 and std 0.5, B's mean 2/3 and std sqrt(1/3); the lone response: mean 0,
 * std 1), summed with the weights on every token, whitened over the six tokens. */
static void test_gdpo(void **state)
{
    (void)state;
    const double parts[8] = {1, 0, 0, 1, 0.5, 1, 0.7, 0}, wts[2] = {1, 0.5};
    double a[6], scores[4];
    const struct adv_params p = {
        .est = ADV_GDPO, .norm_by_std = true, .n_parts = 2, .parts = parts, .part_weights = wts};
    token_advantages(&p, R, NULL, OFF, LEN, GROUP, 4, scores, a);
    const double sa = 0.5 + 1e-6, sb = sqrt(1.0 / 3) + 1e-6;
    const double r[4] = {0.5 / sa + 0.5 * (-2.0 / 3) / sb, -0.5 / sa + 0.5 * (1.0 / 3) / sb, 0.5 * (1.0 / 3) / sb,
                         0.7 / (1 + 1e-6)};
    const double v[6] = {r[0], r[0], r[1], r[2], r[3], r[3]};
    double sum = 0, ss = 0;
    for (int k = 0; k < 6; k++)
        sum += v[k];
    const double mean = sum / (6 + 1e-8);
    for (int k = 0; k < 6; k++)
        ss += (v[k] - mean) * (v[k] - mean);
    const double sd = sqrt(ss / (6 + 1e-8) * 6 / 5 + 1e-8);
    for (int k = 0; k < 6; k++)
        assert_float_equal(a[k], (v[k] - mean) / sd, 1e-12);
    /* without the std (norm_adv_by_std_in_grpo false) and without weights: r - mean per component, summed */
    const struct adv_params q = {.est = ADV_GDPO, .n_parts = 2, .parts = parts};
    token_advantages(&q, R, NULL, OFF, LEN, GROUP, 4, scores, a);
    const double u[6] = {0.5 - 2.0 / 3, 0.5 - 2.0 / 3, -0.5 + 1.0 / 3, 1.0 / 3, 0.7, 0.7};
    sum = ss = 0;
    for (int k = 0; k < 6; k++)
        sum += u[k];
    const double m2 = sum / (6 + 1e-8);
    for (int k = 0; k < 6; k++)
        ss += (u[k] - m2) * (u[k] - m2);
    const double sd2 = sqrt(ss / (6 + 1e-8) * 6 / 5 + 1e-8);
    for (int k = 0; k < 6; k++)
        assert_float_equal(a[k], (u[k] - m2) / sd2, 1e-12);
    assert_int_equal(adv_estimator_from_name("gdpo"), ADV_GDPO);
}

/* ------------------------------------------------------------------ loss modes: one token */

static struct policy_loss_params base_params(enum loss_mode m)
{
    return (struct policy_loss_params){.clip_low = 0.2,
                                       .clip_high = 0.28,
                                       .clip_c = 3.0,
                                       .kl_type = KL_K3,
                                       .mode = m,
                                       .tau_pos = 1.0,
                                       .tau_neg = 1.05,
                                       .clip_cov_ratio = 0.0002,
                                       .clip_cov_lb = 1.0,
                                       .clip_cov_ub = 5.0,
                                       .kl_cov_ratio = 0.0002,
                                       .ppo_kl_coef = 0.1,
                                       .dro_beta = 0.5};
}

/* One token of weight 1: its loss, dL/dlogp and statistics. */
static double one(enum loss_mode m, float logp, float old, double A, float *d, struct policy_loss_stats *st)
{
    const struct policy_loss_params p = base_params(m);
    const float ref = -1.0f, ent = 0.0f;
    const double w = 1.0;
    *st = (struct policy_loss_stats){0};
    policy_loss_tokens(&p, 1, &logp, &old, &ref, &ent, &A, &w, NULL, st, d, NULL);
    return st->loss;
}

static void test_token_modes(void **state)
{
    (void)state;
    struct policy_loss_stats st;
    float d;
    const double r = exp(0.2); /* logp -1.0 against old -1.2 */
    /* gpg: -A logp; d -A */
    assert_float_equal(one(LOSS_GPG, -1.0f, -1.2f, 0.5, &d, &st), 0.5, 1e-7);
    assert_float_equal(d, -0.5, 1e-7);
    /* dro: -(logp A - beta/2 (log r)^2) = -(-0.5 - 0.25 x 0.04) = 0.51; d = -(A - beta log r) = -(0.5 - 0.1) */
    assert_float_equal(one(LOSS_DRO, -1.0f, -1.2f, 0.5, &d, &st), 0.51, 1e-6);
    assert_float_equal(d, -0.4, 1e-6);
    /* cispo: -sg(clip(r, 0.8, 1.28)) A logp: r = 1.2214 inside: 1.2214 x 0.5 x 1 = 0.6107; d = -r A */
    assert_float_equal(one(LOSS_CISPO, -1.0f, -1.2f, 0.5, &d, &st), r * 0.5, 1e-6);
    assert_float_equal(d, -r * 0.5, 1e-6);
    assert_float_equal(st.pg_clipfrac, 0, 0);
    /* ... r = e^0.4 = 1.49 clipped to 1.28: loss 1.28 x 0.5 x 0.8 = 0.512; clipfrac 1 */
    assert_float_equal(one(LOSS_CISPO, -0.8f, -1.2f, 0.5, &d, &st), 1.28 * 0.5 * 0.8, 1e-6);
    assert_float_equal(d, -1.28 * 0.5, 1e-6);
    assert_float_equal(st.pg_clipfrac, 1, 0);
    /* sapo: A > 0, tau 1: -A sigmoid(r - 1) 4; d = -A 4 s (1 - s) r */
    const double s1 = 1 / (1 + exp(-(r - 1)));
    assert_float_equal(one(LOSS_SAPO, -1.0f, -1.2f, 0.5, &d, &st), -0.5 * s1 * 4, 1e-6);
    assert_float_equal(d, -0.5 * 4 * s1 * (1 - s1) * r, 1e-6);
    /* A < 0: tau_neg 1.05: -A sigmoid(1.05 (r - 1)) 4 / 1.05 */
    const double s2 = 1 / (1 + exp(-1.05 * (r - 1)));
    assert_float_equal(one(LOSS_SAPO, -1.0f, -1.2f, -0.5, &d, &st), 0.5 * s2 * 4 / 1.05, 1e-6);
    /* dppo_tv: p = e^-1 = 0.3679, p_old = e^-1.2 = 0.3012: p - p_old = 0.0667 <= 0.28 kept (A > 0): -A min(r, 3) logp
     * = 0.5 x 1.2214; d = -A r */
    assert_float_equal(one(LOSS_DPPO_TV, -1.0f, -1.2f, 0.5, &d, &st), 0.5 * r, 1e-6);
    assert_float_equal(d, -0.5 * r, 1e-6);
    /* p = e^-0.1 = 0.905 against e^-1.2: moved up by 0.604 > 0.28 with A > 0: masked (loss 0, d 0, clipfrac 1) */
    assert_float_equal(one(LOSS_DPPO_TV, -0.1f, -1.2f, 0.5, &d, &st), 0.0, 0);
    assert_float_equal(d, 0.0, 0);
    assert_float_equal(st.pg_clipfrac, 1, 0);
    /* ... with A < 0 the bound is p - p_old >= -0.2: kept; r = e^1.1 = 3.004 > clip_c 3: truncated at 3, and counted
     * in pg_clipfrac_lower: loss -A 3 logp = 0.5 x 3 x -0.1 */
    assert_float_equal(one(LOSS_DPPO_TV, -0.1f, -1.2f, -0.5, &d, &st), 0.5 * 3 * -0.1, 1e-6);
    assert_float_equal(d, 1.5, 1e-6);
    assert_float_equal(st.pg_clipfrac_lower, 1, 0);
    /* dppo_kl: binary KL(p_old || p) = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)) at
     * p_old = e^-1.2, p = e^-1: 0.3012 x -0.2 + 0.6988 log(0.6988 / 0.6321) = 0.00994 <= 0.28: kept */
    assert_float_equal(one(LOSS_DPPO_KL, -1.0f, -1.2f, 0.5, &d, &st), 0.5 * r, 1e-6);
    /* p = e^-0.1: KL 0.3012 x -1.1 + 0.6988 log(0.6988 / 0.0952) = 1.061 > 0.28 and p moved up with A > 0: masked */
    assert_float_equal(one(LOSS_DPPO_KL, -0.1f, -1.2f, 0.5, &d, &st), 0.0, 0);
    /* ... the same move with A < 0 is kept (only moves down are bounded there) */
    assert_float_equal(one(LOSS_DPPO_KL, -0.1f, -1.2f, -0.5, &d, &st), 0.5 * 3 * -0.1, 1e-6);
    /* kl_cov (a micro-batch of one token: it is the one chosen): -A r + 0.1 |log r|; ppo_kl reports |log r| */
    assert_float_equal(one(LOSS_KL_COV, -1.0f, -1.2f, 0.5, &d, &st), -0.5 * r + 0.1 * 0.2, 1e-6);
    assert_float_equal(d, -0.5 * r + 0.1, 1e-6);
    assert_float_equal(st.ppo_kl, 0.2, 1e-6);
    /* gspo on one token: the sequence ratio is the token's: -A exp(0.2) inside the clip range */
    assert_float_equal(one(LOSS_GSPO, -1.0f, -1.2f, 0.5, &d, &st), -0.5 * r, 1e-6);
    assert_float_equal(d, -0.5 * r, 1e-6);
    assert_int_equal(loss_mode_from_name("dppo_kl"), LOSS_DPPO_KL);
    assert_int_equal(loss_mode_from_name("bypass_mode"), -1);
    assert_int_equal(loss_mode_agg(LOSS_GSPO), AGG_SEQ_MEAN_TOKEN_MEAN);
    assert_int_equal(loss_mode_agg(LOSS_VANILLA), -1);
}

/* ------------------------------------------------------------------ loss modes: sequences of a micro-batch */

/* Two sequences of 3 tokens. */
static const float LP[6] = {-1.0f, -2.0f, -0.5f, -1.5f, -0.3f, -2.5f};
static const float OLD[6] = {-1.1f, -1.75f, -0.5f, -1.2f, -0.35f, -2.0f};
static const double ADV[6] = {1.0, 1.0, 1.0, -0.5, -0.5, -0.5};

static double seqs_loss(const struct policy_loss_params *p, const float *lp, const double *w, const float *isw,
                        const uint8_t *mask, float *d, struct policy_loss_stats *st)
{
    const float ref[6] = {0}, ent[6] = {0};
    struct pl_seq s[2];
    for (int i = 0; i < 2; i++)
        s[i] = (struct pl_seq){.len = 3,
                               .logp = lp + 3 * i,
                               .old_logp = OLD + 3 * i,
                               .ref_logp = ref,
                               .entropy = ent,
                               .rollout_logp = OLD + 3 * i,
                               .adv = ADV + 3 * i,
                               .w = w + 3 * i,
                               .mask = mask ? mask + 3 * i : NULL,
                               .is_w = isw ? isw + 3 * i : NULL,
                               .dlogp = d + 3 * i};
    *st = (struct policy_loss_stats){0};
    policy_loss_seqs(p, s, 2, 7, st, NULL);
    return st->loss;
}

static void test_sequence_modes(void **state)
{
    (void)state;
    const double w[6] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5}; /* 1 / sequences on each token */
    float d[6];
    struct policy_loss_stats st;
    /* geo_mean, sequence 0 (A = 1 > 0): log ratios 0.1, -0.25, 0, clamped to [-0.2, 0.28] and taken
     * min(x, clamp(x)): 0.1, -0.25, 0 (a positive advantage's ratio is bounded above only): mean -0.15/3; sequence 1
     * (A = -0.5): -0.3, 0.05, -0.5, sign -1: -min(-x, -clamp(x)) = max(x, clamp(x)): -0.2, 0.05, -0.2; mean
     * -0.35/3. loss = 0.5 (-1 e^(-0.15/3)) + 0.5 (0.5 e^(-0.35/3)) */
    struct policy_loss_params p = base_params(LOSS_GEO_MEAN);
    const double r0 = exp(-0.15 / (3 + 1e-8)), r1 = exp(-0.35 / (3 + 1e-8));
    const double want = 0.5 * (-3 / (3 + 1e-8)) * r0 + 0.5 * (1.5 / (3 + 1e-8)) * r1;
    assert_float_equal(seqs_loss(&p, LP, w, NULL, NULL, d, &st), want, 1e-6);
    assert_float_equal(st.pg_loss, want, 1e-6);
    /* dL/dlogp: through the tokens the min took unclamped: sequence 0's three, sequence 1's token 1 */
    assert_float_equal(d[0], 0.5 * -1 * r0 / 3, 1e-6);
    assert_float_equal(d[1], 0.5 * -1 * r0 / 3, 1e-6);
    assert_float_equal(d[2], 0.5 * -1 * r0 / 3, 1e-6);
    assert_float_equal(d[3], 0.0, 0);
    assert_float_equal(d[4], 0.5 * 0.5 * r1 / 3, 1e-6);
    assert_float_equal(d[5], 0.0, 0);
    /* clipped: sequence 0's token 1 (A > 0: pg_clipfrac), sequence 1's tokens 0 and 2 (A < 0: _lower) */
    assert_float_equal(st.pg_clipfrac, 1, 0);
    assert_float_equal(st.pg_clipfrac_lower, 2, 0);
    /* with IS weights the sequence takes their geometric mean */
    const float isw[6] = {1.0f, 2.0f, 0.5f, 1.0f, 1.0f, 1.0f};
    const double g0 = exp((log(1.0 + 1e-10) + log(2.0 + 1e-10) + log(0.5 + 1e-10)) / (3 + 1e-8)); /* about 1 */
    assert_float_equal(seqs_loss(&p, LP, w, isw, NULL, d, &st),
                       0.5 * (-3 / (3 + 1e-8)) * r0 * g0 + 0.5 * (1.5 / (3 + 1e-8)) * r1, 1e-6);
    /* gspo: each sequence's ratio exp(mean log ratio): e^-0.05 = 0.951 (seq 0, inside [0.8, 1.28]) and
     * e^(-0.75/3) = 0.7788 (seq 1, below 0.8 with A < 0: max(0.5 x 0.7788, 0.5 x 0.8) = 0.4, clipped, no gradient) */
    p = base_params(LOSS_GSPO);
    const double g = exp(-0.15 / 3);
    seqs_loss(&p, LP, w, NULL, NULL, d, &st);
    assert_float_equal(st.pg_loss, 3 * 0.5 * -g + 3 * 0.5 * 0.5 * 0.8, 1e-6);
    assert_float_equal(d[1], 0.5 * -g, 1e-6); /* sg(s) + logp - sg(logp): each token's own gradient */
    assert_float_equal(d[4], 0.0, 0);
    assert_float_equal(st.pg_clipfrac, 3, 0);
    /* IS weights multiply each token's term (vanilla): token 1 of sequence 0 (ratio e^-0.25 = 0.7788 below 0.8, with
     * A > 0 the unclipped branch is the larger loss) */
    p = base_params(LOSS_VANILLA);
    seqs_loss(&p, LP, w, isw, NULL, d, &st);
    assert_float_equal(d[1], 0.5 * 2.0 * -exp(-0.25), 1e-6);
    /* a token outside the mask has no loss and no gradient */
    const uint8_t mask[6] = {1, 0, 1, 1, 1, 1};
    seqs_loss(&p, LP, w, NULL, mask, d, &st);
    assert_float_equal(d[1], 0.0, 0);
    assert_int_equal(st.tokens, 5);
}

/* clip_cov and kl_cov choose their tokens by covariance over the micro-batch. */
static void test_covariance_modes(void **state)
{
    (void)state;
    const double w[6] = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
    float d[6];
    struct policy_loss_stats st;
    /* mean A = 0.25, mean logp = -7.8/6 = -1.3: cov = (A - 0.25)(logp + 1.3): 0.225, -0.525, 0.6 | 0.15, -0.75,
     * 0.9. kl_cov_ratio 0.34: int(6 x 0.34) = 2 tokens of largest covariance: sequence 1's token 2 (0.9) and
     * sequence 0's token 2 (0.6) get the |log r| penalty (their log ratios: 0 and -0.5) */
    struct policy_loss_params p = base_params(LOSS_KL_COV);
    p.kl_cov_ratio = 0.34;
    seqs_loss(&p, LP, w, NULL, NULL, d, &st);
    double want = 0;
    for (int k = 0; k < 6; k++)
        want += 0.5 * -ADV[k] * exp((double)LP[k] - OLD[k]);
    want += 0.5 * 0.1 * 0.5; /* token 5's |log r| = 0.5 (token 2's is 0) */
    assert_float_equal(st.pg_loss, want, 1e-6);
    assert_float_equal(d[5], 0.5 * (0.5 * exp(-0.5) - 0.1), 1e-6);
    assert_float_equal(d[0], 0.5 * -1.0 * exp(0.1), 1e-6);
    /* clip_cov: candidates (lb 0.1, ub 0.8), not clipped by the ratio already: tokens 0 (0.225), 2 (0.6), 3 (0.15),
     * token 5 (0.9) is above ub; sequence 1's token 0 (ratio e^-0.3 = 0.74 < 0.8 with A < 0) is clipped already.
     * So 0, 2 remain; clip_cov_ratio 1: all of them cut (loss 0, no gradient), counted in pg_clipfrac */
    p = base_params(LOSS_CLIP_COV);
    p.clip_cov_ratio = 1.0, p.clip_cov_lb = 0.1, p.clip_cov_ub = 0.8;
    seqs_loss(&p, LP, w, NULL, NULL, d, &st);
    assert_float_equal(st.pg_clipfrac, 2, 0);
    assert_float_equal(d[0], 0.0, 0);
    assert_float_equal(d[2], 0.0, 0);
    assert_float_equal(d[1], 0.5 * -1.0 * exp(-0.25), 1e-6);
    /* ratio 1 / 6: int(1) = 1 of the two, drawn at random: exactly one cut */
    p.clip_cov_ratio = 1.0 / 6 + 1e-9;
    seqs_loss(&p, LP, w, NULL, NULL, d, &st);
    assert_float_equal(st.pg_clipfrac, 1, 0);
    assert_true((d[0] == 0.0f) != (d[2] == 0.0f));
}

/* Bypass mode: the rollout's log-probs are the old ones; REINFORCE with the IS weights of the current policy, and
 * the rejection narrows the policy-gradient term's tokens. */
static void test_bypass(void **state)
{
    (void)state;
    struct rollout_corr rc;
    char err[256];
    assert_int_equal(
        rollout_corr_parse("token", "1.1", false, "token_k1", "0.9_1.1", true, "reinforce", &rc, err, sizeof err), 0);
    struct policy_loss_params p = base_params(LOSS_VANILLA);
    p.bypass = &rc;
    p.agg = AGG_TOKEN_MEAN;
    const double w[6] = {1, 1, 1, 1, 1, 1};
    float d[6];
    struct policy_loss_stats st;
    seqs_loss(&p, LP, w, NULL, NULL, d, &st);
    /* log ratios 0.1, -0.25, 0, -0.3, 0.05, -0.5: token_k1 keeps -log r within [log 0.9, log 1.1], log r within
     * [-0.0953, 0.1054]: tokens 0, 2 and 4; IS weights min(e^lr, 1.1): 1.1, 1 and e^0.05; loss -A logp w */
    assert_float_equal(d[0], -1.1, 1e-6);
    assert_float_equal(d[1], 0.0, 0);
    assert_float_equal(d[2], -1.0, 1e-6);
    assert_float_equal(d[3], 0.0, 0);
    assert_float_equal(d[4], 0.5 * exp(0.05), 1e-6);
    assert_float_equal(st.pg_loss, 1.1 + 0.5 + 0.5 * -0.3 * exp(0.05), 1e-6);
    assert_int_equal(st.tokens, 3);
    /* ppo_clip: the clipped loss against the rollout's log-probs, no IS weights */
    assert_int_equal(rollout_corr_parse("null", "2.0", false, "null", "null", true, "ppo_clip", &rc, err, sizeof err),
                     0);
    seqs_loss(&p, LP, w, NULL, NULL, d, &st);
    assert_float_equal(d[0], -exp(0.1), 1e-6);
}

/* dL/dlogp against central differences, for the modes whose verl loss has no stop-gradient. */
static void test_finite_differences(void **state)
{
    (void)state;
    const enum loss_mode modes[] = {LOSS_VANILLA,  LOSS_SAPO,   LOSS_GPG,     LOSS_DRO,
                                    LOSS_GEO_MEAN, LOSS_KL_COV, LOSS_CLIP_COV};
    const double w[6] = {0.3, 0.3, 0.3, 0.2, 0.2, 0.2};
    srand(5);
    for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
        struct policy_loss_params p = base_params(modes[m]);
        p.use_kl_loss = true, p.kl_coef = 0.05;
        for (int trial = 0; trial < 50; trial++) {
            float lp[6];
            for (int k = 0; k < 6; k++)
                lp[k] = OLD[k] + 0.5f * ((float)rand() / (float)RAND_MAX - 0.5f);
            float d[6], dd[6];
            struct policy_loss_stats st;
            seqs_loss(&p, lp, w, NULL, NULL, d, &st);
            for (int k = 0; k < 6; k++) {
                const float h = 1e-3f;
                float a[6], b[6];
                memcpy(a, lp, sizeof a);
                memcpy(b, lp, sizeof b);
                a[k] += h, b[k] -= h;
                /* kinks (the clip bounds) have no derivative: skip the token when one is within reach */
                const double lr = (double)lp[k] - OLD[k];
                if (fabs(exp(lr) - 0.8) < 2e-3 || fabs(exp(lr) - 1.28) < 2e-3 || fabs(lr + 0.2) < 2e-3 ||
                    fabs(lr - 0.28) < 2e-3 || fabs(lr) < 2e-3)
                    continue;
                const double fa = seqs_loss(&p, a, w, NULL, NULL, dd, &st),
                             fb = seqs_loss(&p, b, w, NULL, NULL, dd, &st);
                const double fd = (fa - fb) / (double)(a[k] - b[k]);
                if (fabs(fd - d[k]) > 2e-3 * (1 + fabs(fd)))
                    fail_msg("mode %d trial %d token %d: analytic %g, finite differences %g", (int)modes[m], trial, k,
                             d[k], fd);
            }
        }
    }
}

/* ------------------------------------------------------------------ rollout correction */

/* Two sequences: log ratios (old - rollout) 0.1, -0.2, 0.05 and -0.3, 0.4 (mask 1 1), a third token of sequence 1
 * not the model's. */
static const float RC_OLD[6] = {-1.0f, -2.0f, -0.5f, -1.5f, -0.6f, -3.0f};
static const float RC_ROLL[6] = {-1.1f, -1.8f, -0.55f, -1.2f, -1.0f, -1.0f};
static const uint8_t RC_MASK1[3] = {1, 1, 0};

static void rc_run(const struct rollout_corr *rc, float *w, uint8_t *keep, struct rc_metrics *m)
{
    const int len[2] = {3, 3};
    const float *lp[2] = {RC_OLD, RC_OLD + 3}, *ro[2] = {RC_ROLL, RC_ROLL + 3};
    const uint8_t *mk[2] = {NULL, RC_MASK1};
    float *wv[2] = {w, w ? w + 3 : NULL};
    uint8_t *kv[2] = {keep, keep ? keep + 3 : NULL};
    m->n = 0;
    rollout_corr_compute(rc, 2, len, lp, ro, mk, NULL, true, w ? wv : NULL, keep ? kv : NULL, m);
}

static double metric(const struct rc_metrics *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->name[i], name) == 0)
            return m->v[i];
    fail_msg("no metric %s", name);
    return NAN;
}

static bool has_metric(const struct rc_metrics *m, const char *name)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->name[i], name) == 0)
            return true;
    return false;
}

static void test_rollout_is(void **state)
{
    (void)state;
    struct rollout_corr rc;
    char err[256];
    struct rc_metrics m;
    float w[6];
    /* token TIS at 1.1: e^0.1 = 1.105 -> 1.1, e^-0.2, e^0.05 | e^-0.3, min(e^0.4, 1.1) = 1.1, 0 (not the model's) */
    assert_int_equal(rollout_corr_parse("token", "1.1", false, "null", "null", false, "ppo_clip", &rc, err, sizeof err),
                     0);
    rc_run(&rc, w, NULL, &m);
    const double lr[5] = {0.1, -0.2, 0.05, -0.3, 0.4};
    const float want[6] = {1.1f, (float)exp(-0.2), (float)exp(0.05), (float)exp(-0.3), 1.1f, 0.0f};
    for (int k = 0; k < 6; k++)
        assert_float_equal(w[k], want[k], 1e-6);
    /* metrics: mean over the 5 model tokens (count + 1e-8); 2 of 5 above 1.1, none below 1/1.1 = 0.909 except
     * e^-0.2 = 0.8187 and e^-0.3 = 0.7408 */
    const double sumw = 1.1 + exp(-0.2) + exp(0.05) + exp(-0.3) + 1.1;
    assert_float_equal(metric(&m, "rollout_is_mean"), sumw / (5 + 1e-8), 1e-6);
    assert_float_equal(metric(&m, "rollout_is_ratio_fraction_high"), 2 / (5 + 1e-8), 1e-12);
    assert_float_equal(metric(&m, "rollout_is_ratio_fraction_low"), 2 / (5 + 1e-8), 1e-12);
    assert_float_equal(metric(&m, "rollout_is_max"), 1.1, 1e-6);
    assert_float_equal(metric(&m, "rollout_is_min"), exp(-0.3), 1e-6);
    /* per-sequence means of the weights: (1.1 + e^-0.2 + e^0.05) / 3, (e^-0.3 + 1.1) / 2 */
    const double sm0 = (1.1 + exp(-0.2) + exp(0.05)) / (3 + 1e-8), sm1 = (exp(-0.3) + 1.1) / (2 + 1e-8);
    assert_float_equal(metric(&m, "rollout_is_seq_mean"), (sm0 + sm1) / 2, 1e-6);
    assert_float_equal(metric(&m, "rollout_is_seq_std"), fabs(sm0 - sm1) / sqrt(2.0), 1e-6);
    assert_float_equal(metric(&m, "rollout_is_seq_max_deviation"), fmax(fabs(sm0 - 1), fabs(sm1 - 1)), 1e-6);
    /* ESS: 1 / mean((w / mean w)^2) */
    double s2 = 0;
    for (int k = 0; k < 5; k++)
        s2 += (double)want[k] * want[k];
    const double mw = sumw / (5 + 1e-8);
    assert_float_equal(metric(&m, "rollout_is_eff_sample_size"), 1 / (s2 / ((mw + 1e-8) * (mw + 1e-8)) / (5 + 1e-8)),
                       1e-6);
    assert_false(has_metric(&m, "rollout_is_oob_ratio"));
    /* off-policy metrics: kl = mean(rollout - old) = -(0.05) / 5 */
    double sl = 0, k3 = 0;
    for (int k = 0; k < 5; k++)
        sl += lr[k], k3 += exp(lr[k]) - lr[k] - 1;
    assert_float_equal(metric(&m, "kl"), -sl / (5 + 1e-8), 1e-6);
    assert_float_equal(metric(&m, "k3_kl"), k3 / (5 + 1e-8), 1e-6);
    assert_float_equal(metric(&m, "chi2_seq"), (exp(2 * -0.05) + exp(2 * 0.1)) / 2 - 1, 1e-5);
    /* IcePop 0.8_1.1: weights outside [0.8, 1.1] are 0: e^0.1, e^-0.3 and e^0.4 */
    assert_int_equal(
        rollout_corr_parse("token", "0.8_1.1", false, "null", "null", false, "ppo_clip", &rc, err, sizeof err), 0);
    rc_run(&rc, w, NULL, &m);
    assert_float_equal(w[0], 0.0, 0);
    assert_float_equal(w[1], exp(-0.2), 1e-6);
    assert_float_equal(w[3], 0.0, 0);
    assert_float_equal(w[4], 0.0, 0);
    assert_float_equal(metric(&m, "rollout_is_oob_ratio"), 3 / (5 + 1e-8), 1e-12);
    assert_float_equal(metric(&m, "rollout_is_ratio_fraction_low"), 1 / (5 + 1e-8), 1e-12); /* e^-0.3 < 0.8 */
    /* sequence level: exp of each sequence's summed log ratio, -0.05 and 0.1, truncated at 2; batch-normalised to
     * mean 1 over the sequences: factor (e^-0.05 x 3/(3+1e-8) + e^0.1 x 2/(2+1e-8)) / 2 */
    assert_int_equal(rollout_corr_parse("sequence", "2", true, "null", "null", false, "ppo_clip", &rc, err, sizeof err),
                     0);
    rc_run(&rc, w, NULL, &m);
    const double f = (exp(-0.05) * 3 / (3 + 1e-8) + exp(0.1) * 2 / (2 + 1e-8)) / 2;
    assert_float_equal(metric(&m, "rollout_is_batch_norm_factor"), f, 1e-6);
    assert_float_equal(w[0], exp(-0.05) / f, 1e-6);
    assert_float_equal(w[4], exp(0.1) / f, 1e-6);
    assert_float_equal(w[5], 0.0, 0);
    assert_float_equal(metric(&m, "rollout_is_max"), exp(0.1), 1e-6);
    assert_float_equal(metric(&m, "rollout_is_min"), exp(-0.05), 1e-6);
    /* the mean is of the weights before normalising, over the tokens */
    assert_float_equal(metric(&m, "rollout_is_mean"), (3 * exp(-0.05) + 2 * exp(0.1)) / (5 + 1e-8), 1e-6);
}

static void test_rollout_rs(void **state)
{
    (void)state;
    struct rollout_corr rc;
    char err[256];
    struct rc_metrics m;
    uint8_t keep[6];
    /* token_k1 with ratio bounds 0.9_1.2 keeps -log r within [log 0.9, log 1.2] = [-0.105, 0.182], i.e. log r in
     * [-0.182, 0.105]: tokens 0 (0.1) and 2 (0.05); seq_mean_k3 at 0.01: k3 = r - 1 - log r per token, sequence 0's
     * mean (0.00517 + 0.01873 + 0.00127) / 3 = 0.0084 kept, sequence 1's (0.04082 + 0.09182) / 2 = 0.0663 rejected */
    assert_int_equal(rollout_corr_parse("null", "2.0", false, "token_k1, seq_mean_k3", "0.9_1.2,0.01", false,
                                        "ppo_clip", &rc, err, sizeof err),
                     0);
    rc_run(&rc, NULL, keep, &m);
    const uint8_t want[6] = {1, 0, 1, 0, 0, 0};
    assert_memory_equal(keep, want, 6);
    /* per option: token_k1 rejects 3 of 5 model tokens, sequences with one rejected: both; seq_mean_k3 rejects
     * sequence 1 (2 tokens) */
    assert_float_equal(metric(&m, "rollout_rs_token_k1_masked_fraction"), 3 / (5 + 1e-8), 1e-12);
    assert_float_equal(metric(&m, "rollout_rs_token_k1_seq_masked_fraction"), 1.0, 0);
    assert_float_equal(metric(&m, "rollout_rs_seq_mean_k3_masked_fraction"), 2 / (5 + 1e-8), 1e-12);
    assert_float_equal(metric(&m, "rollout_rs_seq_mean_k3_seq_masked_fraction"), 0.5, 0);
    assert_float_equal(metric(&m, "rollout_rs_masked_fraction"), 3 / (5 + 1e-8), 1e-12);
    assert_float_equal(metric(&m, "rollout_rs_seq_masked_fraction"), 1.0, 0);
    const double k3[5] = {exp(0.1) - 1.1, exp(-0.2) - 0.8, exp(0.05) - 1.05, exp(-0.3) - 0.7, exp(0.4) - 1.4};
    const double q0 = (k3[0] + k3[1] + k3[2]) / (3 + 1e-8), q1 = (k3[3] + k3[4]) / (2 + 1e-8);
    assert_float_equal(metric(&m, "rollout_rs_seq_mean_k3_seq_mean"), (q0 + q1) / 2, 1e-7);
    assert_float_equal(metric(&m, "rollout_rs_seq_mean_k3_max"), q1, 1e-7);
    assert_float_equal(metric(&m, "rollout_rs_seq_mean_k3_fraction_high"), 0.5, 0);
    assert_float_equal(metric(&m, "rollout_rs_seq_mean_k3_mean"), (3 * q0 + 2 * q1) / (5 + 1e-8), 1e-7);
    /* the k1 option's fractions are on -log r against log 1.2 and log 0.9 */
    assert_float_equal(metric(&m, "rollout_rs_token_k1_fraction_high"), 2 / (5 + 1e-8), 1e-12); /* 0.2, 0.3 */
    assert_float_equal(metric(&m, "rollout_rs_token_k1_fraction_low"), 1 / (5 + 1e-8), 1e-12);  /* -(0.4) */
    assert_true(has_metric(&m, "rollout_rs_token_k1_seq_fraction_low"));
    assert_false(has_metric(&m, "rollout_rs_seq_mean_k3_seq_fraction_low"));
    /* seq_max_k2 at 0.03 (sequence maxima 0.02 and 0.08) and seq_sum_k1 with one upper bound 1.2 (lower 1/1.2) */
    assert_int_equal(
        rollout_corr_parse("null", "2.0", false, "seq_max_k2", "0.03", false, "ppo_clip", &rc, err, sizeof err), 0);
    rc_run(&rc, NULL, keep, &m);
    const uint8_t want2[6] = {1, 1, 1, 0, 0, 0};
    assert_memory_equal(keep, want2, 6);
    assert_int_equal(
        rollout_corr_parse("null", "2.0", false, "seq_sum_k1", "1.2", false, "ppo_clip", &rc, err, sizeof err), 0);
    assert_float_equal(rc.rs[0].lower, 1 / 1.2, 1e-15);
}

static void test_rollout_corr_parse(void **state)
{
    (void)state;
    struct rollout_corr rc;
    char err[512];
#define REFUSED(is, ist, rs, rst, lt, needle)                                                                          \
    do {                                                                                                               \
        assert_int_equal(rollout_corr_parse(is, ist, false, rs, rst, false, lt, &rc, err, sizeof err), -1);            \
        if (!strstr(err, needle))                                                                                      \
            fail_msg("'%s' lacks '%s'", err, needle);                                                                  \
    } while (0)
    REFUSED("geometric", "2", "null", "null", "ppo_clip", "rollout_rs=seq_mean_k1");
    REFUSED("token", "0", "null", "null", "ppo_clip", "must be positive");
    REFUSED("token", "2_1", "null", "null", "ppo_clip", "lower bound must be <= the upper bound");
    REFUSED("token", "two", "null", "null", "ppo_clip", "Invalid rollout_is_threshold");
    REFUSED("null", "2", "geometric", "1.01", "ppo_clip", "Invalid rollout_rs option 'geometric'");
    REFUSED("null", "2", "token_k2", "null", "ppo_clip", "must be explicitly provided");
    REFUSED("null", "2", "token_k2", "0.5_2", "ppo_clip", "single upper bound");
    REFUSED("null", "2", "token_k2,seq_sum_k3", "1,2,3", "ppo_clip", "exactly 2 thresholds");
    REFUSED("null", "2", "token_k1", "2_0.5", "ppo_clip", "lower <= upper");
    REFUSED("null", "2", "null", "null", "ppo", "loss_type");
    /* duplicates dropped, thresholds per option */
    assert_int_equal(rollout_corr_parse("sequence", "0.5_2.0", true, "token_k3,token_k3,seq_max_k2", "0.1, 0.2", true,
                                        "reinforce", &rc, err, sizeof err),
                     0);
    assert_int_equal(rc.n_rs, 2);
    assert_float_equal(rc.rs[1].upper, 0.2, 0);
    assert_float_equal(rc.is_lower, 0.5, 0);
    assert_true(rc.bypass && rc.reinforce && rc.batch_normalize);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_estimators),
        cmocka_unit_test(test_optimal_token_baseline),
        cmocka_unit_test(test_gdpo),
        cmocka_unit_test(test_token_modes),
        cmocka_unit_test(test_sequence_modes),
        cmocka_unit_test(test_covariance_modes),
        cmocka_unit_test(test_bypass),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_rollout_is),
        cmocka_unit_test(test_rollout_rs),
        cmocka_unit_test(test_rollout_corr_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
