/* GRPO arithmetic against hand-worked cases (numbers worked on paper in the
 * comments) and the loss gradient against finite differences. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "worker/trainer/grpo_algo.h"

static void test_names(void **state)
{
    (void)state;
    assert_int_equal(adv_estimator_from_name("grpo"), ADV_GRPO);
    assert_int_equal(adv_estimator_from_name("reinforce_plus_plus"), ADV_REINFORCE_PP);
    assert_int_equal(adv_estimator_from_name("gae"), -1);
    assert_int_equal(kl_type_from_name("low_var_kl"), KL_K3);
    assert_int_equal(kl_type_from_name("k2"), KL_K2);
    assert_int_equal(kl_type_from_name("mse"), KL_K2);
    assert_int_equal(loss_agg_from_name("seq-mean-token-sum-norm"), AGG_SEQ_MEAN_TOKEN_SUM_NORM);
    assert_int_equal(loss_agg_from_name("mean"), -1);
}

static void test_grpo_advantages(void **state)
{
    (void)state;
    /* group 0: scores 1,0,1,1 -> mean 0.75, unbiased std sqrt((3*0.0625 + 0.5625)/3) = 0.5
     * group 1: 0.2, 0.2 -> std 0 -> (r - mean)/(0 + 1e-6) = 0
     * group 2: a lone response 0.7 -> mean 0, std 1 -> 0.7 / (1 + 1e-6) */
    const double s[7] = {1, 0, 1, 1, 0.2, 0.2, 0.7};
    const int g[7] = {0, 0, 0, 0, 1, 1, 2};
    double a[7];
    outcome_advantages(ADV_GRPO, true, s, g, 7, a);
    assert_float_equal(a[0], 0.25 / (0.5 + 1e-6), 1e-12);
    assert_float_equal(a[1], -0.75 / (0.5 + 1e-6), 1e-12);
    assert_float_equal(a[4], 0.0, 1e-12);
    assert_float_equal(a[6], 0.7 / (1 + 1e-6), 1e-12);
    /* Dr.GRPO: no division by the std */
    outcome_advantages(ADV_GRPO, false, s, g, 7, a);
    assert_float_equal(a[0], 0.25, 1e-12);
    assert_float_equal(a[1], -0.75, 1e-12);
    assert_float_equal(a[6], 0.7, 1e-12);
    /* RLOO: r_i minus the mean of the others: 1 - 2/3, 0 - 1 */
    outcome_advantages(ADV_RLOO, true, s, g, 7, a);
    assert_float_equal(a[0], 1.0 / 3.0, 1e-12);
    assert_float_equal(a[1], -1.0, 1e-12);
    assert_float_equal(a[6], 0.7, 1e-12);
}

static void test_reinforce_pp(void **state)
{
    (void)state;
    /* token rewards: seq0 [0, 1], seq1 [0.5] -> returns [1, 1], [0.5]; mean 5/6 and unbiased var
     * ((1/6)^2 * 2 + (1/3)^2) / 2 = 1/12, verl's masked means dividing by the count + 1e-8 -> whitened 0.57735,
     * -1.1547 */
    const double r[3] = {0, 1, 0.5};
    const int off[2] = {0, 2}, len[2] = {2, 1};
    double a[3];
    reinforce_pp_advantages(r, NULL, off, len, 2, 1.0, NULL, a);
    const double mean = 2.5 / (3 + 1e-8);
    const double var = ((1 - mean) * (1 - mean) * 2 + (0.5 - mean) * (0.5 - mean)) / (3 + 1e-8) * 3 / 2;
    const double sd = sqrt(var + 1e-8);
    assert_float_equal(a[0], (1 - mean) / sd, 1e-12);
    assert_float_equal(a[1], (1 - mean) / sd, 1e-12);
    assert_float_equal(a[2], (0.5 - mean) / sd, 1e-12);
    assert_float_equal(a[0], (1 - 5.0 / 6) / sqrt(1.0 / 12 + 1e-8), 1e-7);
    /* gamma 0.5: returns [0.5, 1], [0.5]: mean 2/3, var ((1/6)^2 * 2 + (1/3)^2) / 2 = 1/12 again */
    reinforce_pp_advantages(r, NULL, off, len, 2, 0.5, NULL, a);
    assert_float_equal(a[0], (0.5 - 2.0 / 3) / sqrt(1.0 / 12 + 1e-8), 1e-7);
    assert_float_equal(a[1], (1 - 2.0 / 3) / sqrt(1.0 / 12 + 1e-8), 1e-7);
}

static void test_kl_estimators(void **state)
{
    (void)state;
    double d;
    /* logp -1, ref -1.5 */
    assert_float_equal(kl_estimate(KL_K1, -1, -1.5, &d), 0.5, 1e-12);
    assert_float_equal(d, 1.0, 1e-12);
    assert_float_equal(kl_estimate(KL_ABS, -1, -1.5, &d), 0.5, 1e-12);
    assert_float_equal(d, 1.0, 1e-12);
    assert_float_equal(kl_estimate(KL_ABS, -2, -1.5, &d), 0.5, 1e-12);
    assert_float_equal(d, -1.0, 1e-12);
    assert_float_equal(kl_estimate(KL_K2, -1, -1.5, &d), 0.125, 1e-12);
    assert_float_equal(d, 0.5, 1e-12);
    /* k3: kl = ref - logp = -0.5; exp(-0.5) + 0.5 - 1 = 0.1065307; d/dlogp = 1 - exp(-0.5) = 0.3934693 */
    assert_float_equal(kl_estimate(KL_K3, -1, -1.5, &d), 0.10653066, 1e-8);
    assert_float_equal(d, 0.39346934, 1e-8);
    /* k3 is clamped at 10 (exp(ref - logp) huge): no gradient there */
    assert_float_equal(kl_estimate(KL_K3, -30, -1, &d), 10.0, 1e-12);
    assert_float_equal(d, 0.0, 1e-12);
    /* equal policies: every estimator is 0 */
    for (int t = KL_K1; t <= KL_K3; t++)
        assert_float_equal(kl_estimate((enum kl_type)t, -0.3, -0.3, &d), 0.0, 1e-12);
}

static void test_token_weights(void **state)
{
    (void)state;
    const int len[2] = {2, 3};
    double w[5];
    loss_token_weights(AGG_TOKEN_MEAN, len, NULL, 2, 4, w);
    for (int i = 0; i < 5; i++)
        assert_float_equal(w[i], 0.2, 1e-15);
    loss_token_weights(AGG_SEQ_MEAN_TOKEN_SUM, len, NULL, 2, 4, w);
    assert_float_equal(w[0], 0.5, 1e-15);
    assert_float_equal(w[4], 0.5, 1e-15);
    loss_token_weights(AGG_SEQ_MEAN_TOKEN_MEAN, len, NULL, 2, 4, w);
    assert_float_equal(w[1], 0.25, 1e-15);
    assert_float_equal(w[2], 1.0 / 6, 1e-15);
    loss_token_weights(AGG_SEQ_MEAN_TOKEN_SUM_NORM, len, NULL, 2, 4, w);
    assert_float_equal(w[3], 1.0 / 8, 1e-15);
}

static const struct policy_loss_params P = {
    .clip_low = 0.2, .clip_high = 0.28, .clip_c = 3.0, .use_kl_loss = false, .kl_type = KL_K3};

/* One token: returns its loss and writes dL/dlogp. */
static double one(const struct policy_loss_params *p, float logp, float old, double A, struct policy_loss_stats *st,
                  float *d)
{
    const float ref = -1.0f, ent = 0.0f;
    const double w = 1.0;
    *st = (struct policy_loss_stats){0};
    policy_loss_tokens(p, 1, &logp, &old, &ref, &ent, &A, &w, NULL, st, d, NULL);
    return st->loss;
}

static void test_policy_loss_hand_worked(void **state)
{
    (void)state;
    struct policy_loss_stats st;
    float d;
    /* ratio exp(0.2) = 1.2214 > 1.28? no: inside [0.8, 1.28]: unclipped, loss -A*ratio, d = -A*ratio */
    assert_float_equal(one(&P, -1.0f, -1.2f, 1.0, &st, &d), -exp(0.2f), 1e-6);
    assert_float_equal(d, -exp(0.2f), 1e-6);
    assert_float_equal(st.pg_clipfrac, 0, 0);
    /* ratio exp(0.4) = 1.4918 > 1.28 with A > 0: clipped to -1.28, no gradient, clipfrac 1 */
    assert_float_equal(one(&P, -0.8f, -1.2f, 1.0, &st, &d), -1.28, 1e-6);
    assert_float_equal(d, 0.0, 0);
    assert_float_equal(st.pg_clipfrac, 1, 0);
    /* same ratio, A < 0: max(1.4918, 1.28) = unclipped 1.4918, gradient -A*ratio */
    assert_float_equal(one(&P, -0.8f, -1.2f, -1.0, &st, &d), exp(0.4f), 1e-6);
    assert_float_equal(d, exp(0.4f), 1e-5);
    /* ratio e^2 = 7.389 with A = -1: dual clip at clip_c = 3, no gradient, lower clipfrac 1 */
    assert_float_equal(one(&P, 0.0f, -2.0f, -1.0, &st, &d), 3.0, 1e-9);
    assert_float_equal(d, 0.0, 0);
    assert_float_equal(st.pg_clipfrac_lower, 1, 0);
    /* ratio exp(-0.5) = 0.6065 < 0.8 with A = -1: clipped branch -A*0.8 = 0.8 > 0.6065: loss 0.8, no gradient */
    assert_float_equal(one(&P, -1.5f, -1.0f, -1.0, &st, &d), 0.8, 1e-6);
    assert_float_equal(d, 0.0, 0);
    /* ppo_kl = old - new */
    one(&P, -1.5f, -1.0f, -1.0, &st, &d);
    assert_float_equal(st.ppo_kl, 0.5, 1e-6);
    /* KL loss and entropy bonus: loss = pg + coef*kl - ent_coef*entropy */
    struct policy_loss_params q = P;
    q.use_kl_loss = true;
    q.kl_type = KL_K2;
    q.kl_coef = 0.1;
    q.entropy_coeff = 0.01;
    float logp = -1.5f, old = -1.5f, ref = -1.0f, ent = 2.0f, dl, de;
    double A = 0.5, w = 0.5;
    st = (struct policy_loss_stats){0};
    policy_loss_tokens(&q, 1, &logp, &old, &ref, &ent, &A, &w, NULL, &st, &dl, &de);
    /* pg = -0.5 * 1 = -0.5; k2 = 0.5 * 0.25 = 0.125; loss = 0.5 * (-0.5 + 0.1*0.125 - 0.01*2) */
    assert_float_equal(st.loss, 0.5 * (-0.5 + 0.0125 - 0.02), 1e-7);
    assert_float_equal(st.kl_loss, 0.5 * 0.125, 1e-7);
    assert_float_equal(st.entropy, 1.0, 1e-7);
    /* dL/dlogp = w * (-A*ratio + coef * (logp - ref)) = 0.5 * (-0.5 - 0.05) */
    assert_float_equal(dl, 0.5 * (-0.5 - 0.05), 1e-6);
    assert_float_equal(de, -0.005, 1e-9);
}

/* dL/dlogp against central differences on random tokens away from the clip boundaries. */
static void test_policy_loss_finite_differences(void **state)
{
    (void)state;
    srand(11);
    for (int kt = KL_K1; kt <= KL_K3; kt++) {
        struct policy_loss_params q = {.clip_low = 0.2,
                                       .clip_high = 0.28,
                                       .clip_c = 3.0,
                                       .use_kl_loss = true,
                                       .kl_type = (enum kl_type)kt,
                                       .kl_coef = 0.05,
                                       .entropy_coeff = 0.01};
        for (int trial = 0; trial < 200; trial++) {
            float logp = -3.0f * (float)rand() / RAND_MAX, old = logp + 0.6f * ((float)rand() / RAND_MAX - 0.5f);
            float ref = logp + ((float)rand() / RAND_MAX - 0.5f), ent = 1.0f;
            double A = 2.0 * rand() / RAND_MAX - 1.0, w = 0.3;
            double ratio = exp((double)logp - old);
            if (fabs(ratio - 0.8) < 0.01 || fabs(ratio - 1.28) < 0.01 || fabs(ratio * -A - 3 * -A) < 0.01 ||
                fabs(logp - ref) < 1e-3)
                continue; /* kinks: no derivative */
            struct policy_loss_stats st = {0};
            float d;
            policy_loss_tokens(&q, 1, &logp, &old, &ref, &ent, &A, &w, NULL, &st, &d, NULL);
            const float h = 1e-3f;
            float lp = logp + h, lm = logp - h;
            struct policy_loss_stats sp = {0}, sm = {0};
            float dd;
            policy_loss_tokens(&q, 1, &lp, &old, &ref, &ent, &A, &w, NULL, &sp, &dd, NULL);
            policy_loss_tokens(&q, 1, &lm, &old, &ref, &ent, &A, &w, NULL, &sm, &dd, NULL);
            double fd = (sp.loss - sm.loss) / (double)(lp - lm);
            if (fabs(fd - d) > 1e-3 * (1 + fabs(fd)))
                fail_msg("kl %d trial %d: analytic %g, fd %g (ratio %g, A %g)", kt, trial, d, fd, ratio, A);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_grpo_advantages),
        cmocka_unit_test(test_reinforce_pp),
        cmocka_unit_test(test_kl_estimators),
        cmocka_unit_test(test_token_weights),
        cmocka_unit_test(test_policy_loss_hand_worked),
        cmocka_unit_test(test_policy_loss_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
