/* The per-token response mask (struct rollout_seq.mask, verl's response_mask) from the batch to the loss: the tokens
 * put in a response from outside (mask 0: a tool's answer, a template's turn markers) get advantage 0, weight 0 and
 * no gradient, and count in no denominator. Checked against hand-worked values (advantages, each loss_agg_mode's
 * loss and dL/dlogp), a plain-Python transcription of verl's REINFORCE++ (its text below), and on a tiny model: an
 * all-ones mask is bit-identical to none, a mask with zeros gives the gradient of the unmasked update whose masked
 * advantages are 0 and whose denominators are rescaled by hand, whatever the masked tokens' log-probs and
 * advantages hold, and the gradient of its own loss (finite differences). */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../test_util.h"
#include "worker/model/model_io.h"
#include "worker/step/audit.h"
#include "worker/step/batch.h"
#include "worker/trainer/actor.h"
#include "worker/trainer/grpo_algo.h"

static uint8_t *copy_mask(const uint8_t *m, int n)
{
    uint8_t *c = malloc((size_t)n);
    memcpy(c, m, (size_t)n);
    return c;
}

/* ------------------------------------------------------------------ advantages */

/* Four responses, packed: A (5 tokens, mask 1 1 0 0 1, score 1), B (3, mask 0 1 1, score 0), C (4, no mask, score
 * 0.5) of group 0, and D (3, mask 1 0 1, score 0.7) alone in group 1; each score at its response's last token. */
static const int OFF[4] = {0, 5, 8, 12}, LEN[4] = {5, 3, 4, 3}, GROUP[4] = {0, 0, 0, 1};
static const uint8_t MASK[15] = {1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1};
static const double SCORE[4] = {1, 0, 0.5, 0.7};

static void outcome_rewards(double *r)
{
    memset(r, 0, 15 * sizeof *r);
    for (int i = 0; i < 4; i++)
        r[OFF[i] + LEN[i] - 1] = SCORE[i];
}

static const struct adv_params GRPO_STD = {.est = ADV_GRPO, .norm_by_std = true, .gamma = 1};
static const struct adv_params GRPO_DR = {.est = ADV_GRPO, .norm_by_std = false, .gamma = 1};
static const struct adv_params RLOO = {.est = ADV_RLOO, .norm_by_std = true, .gamma = 1};

static void test_outcome_advantages(void **state)
{
    (void)state;
    double r[15], adv[15], scores[4];
    outcome_rewards(r);
    /* group 0: scores 1, 0, 0.5: mean 0.5, unbiased std sqrt((0.25 + 0.25 + 0) / 2) = 0.5; group 1 alone: mean 0,
     * std 1. GRPO: A (1 - 0.5) / (0.5 + 1e-6), B -0.5 / (0.5 + 1e-6), C 0, D 0.7 / (1 + 1e-6), each on its model's
     * tokens, 0 on the others */
    const double a = 0.5 / (0.5 + 1e-6), d = 0.7 / (1 + 1e-6);
    const double want[15] = {a, a, 0, 0, a, 0, -a, -a, 0, 0, 0, 0, d, 0, d};
    token_advantages(&GRPO_STD, r, MASK, OFF, LEN, GROUP, 4, scores, adv);
    for (int k = 0; k < 15; k++)
        assert_float_equal(adv[k], want[k], 1e-12);
    for (int i = 0; i < 4; i++)
        assert_float_equal(scores[i], SCORE[i], 0);
    for (int k = 0; k < 15; k++) /* exactly 0, not a tiny number */
        if (!MASK[k])
            assert_true(adv[k] == 0.0);
    /* Dr.GRPO (no std): 0.5, -0.5, 0, 0.7 */
    const double want_dr[15] = {0.5, 0.5, 0, 0, 0.5, 0, -0.5, -0.5, 0, 0, 0, 0, 0.7, 0, 0.7};
    token_advantages(&GRPO_DR, r, MASK, OFF, LEN, GROUP, 4, scores, adv);
    for (int k = 0; k < 15; k++)
        assert_float_equal(adv[k], want_dr[k], 1e-12);
    /* RLOO: A 1 - (0 + 0.5) / 2 = 0.75, B 0 - 0.75 = -0.75, C 0.5 - 0.5 = 0, D alone 0.7 */
    const double want_rloo[15] = {0.75, 0.75, 0, 0, 0.75, 0, -0.75, -0.75, 0, 0, 0, 0, 0.7, 0, 0.7};
    token_advantages(&RLOO, r, MASK, OFF, LEN, GROUP, 4, scores, adv);
    for (int k = 0; k < 15; k++)
        assert_float_equal(adv[k], want_rloo[k], 1e-12);
    /* no mask: every token holds its response's advantage */
    token_advantages(&GRPO_STD, r, NULL, OFF, LEN, GROUP, 4, scores, adv);
    const double per_seq[4] = {a, -a, 0, d};
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < LEN[i]; t++)
            assert_float_equal(adv[OFF[i] + t], per_seq[i], 1e-12);
}

/* REINFORCE++ with a mask, against verl v0.9's compute_reinforce_plus_plus_outcome_advantage (gamma 1) and
 * masked_whiten transcribed on padded rows in plain Python (numbers below to 12 places):
 *
 *   rows = [  # (token rewards, response_mask), padded with mask 0 to 5
 *       ([-0.1, -0.2, 0.0, 0.0, 1.0], [1, 1, 0, 0, 1]),
 *       ([0.0, -0.1, 0.5, 0.0, 0.0], [0, 1, 1, 0, 0]),
 *       ([0.1, -0.5, 0.0, 0.0, 0.0], [1, 1, 0, 0, 0]),
 *       ([0.0, 0.8, 0.0, 0.0, 0.0], [1, 0, 0, 0, 0]),
 *   ]
 *   ret = [[0.0] * 5 for _ in rows]
 *   for b, (r, m) in enumerate(rows):
 *       run = 0.0
 *       for t in reversed(range(5)):
 *           new = r[t] + run
 *           ret[b][t] = new * m[t]
 *           run = new * m[t] + run * (1 - m[t])
 *   vals = [ret[b][t] for b, (r, m) in enumerate(rows) for t in range(5) if m[t]]
 *   n = len(vals)
 *   mean = sum(vals) / (n + 1e-8)
 *   var = sum((v - mean) ** 2 for v in vals) / (n + 1e-8) * n / (n - 1)
 *   for b, (r, m) in enumerate(rows):
 *       print([round((ret[b][t] - mean) / (var + 1e-8) ** 0.5 * m[t], 12) for t in range(5)])
 *
 * By hand: a masked token is skipped, its reward dropped and the running return carried past it, so the returns of
 * the model's tokens are 0.7 0.8 | 1.0 (A: its first two tokens see the outcome past the masked ones), 0.4 0.5
 * (B), -0.4 -0.5 (C), 0 (D: its reward sits on a masked last token and is dropped); mean 2.5 / 8, unbiased
 * variance of the eight about it. (verl v0.7 and v0.8 reset the return at a masked token instead.) */
static void test_reinforce_pp_masked(void **state)
{
    (void)state;
    const int off[4] = {0, 5, 8, 10}, len[4] = {5, 3, 2, 2};
    const double r[12] = {-0.1, -0.2, 0, 0, 1.0, 0, -0.1, 0.5, 0.1, -0.5, 0, 0.8};
    const uint8_t mask[12] = {1, 1, 0, 0, 1, 0, 1, 1, 1, 1, 1, 0};
    const double want[12] = {
        0.696171074244,  0.875828125481,  0, 0, 1.235142227954, 0, 0.157199920534, 0.336856971771, -1.28005648936,
        -1.459713540597, -0.561428284413, 0};
    double adv[12];
    reinforce_pp_advantages(r, mask, off, len, 4, 1.0, NULL, adv);
    for (int k = 0; k < 12; k++)
        assert_float_equal(adv[k], want[k], 1e-11);
    for (int k = 0; k < 12; k++)
        if (!mask[k])
            assert_true(adv[k] == 0.0);
    /* the whitening's figures by hand */
    const double vals[8] = {0.7, 0.8, 1.0, 0.4, 0.5, -0.4, -0.5, 0.0};
    const double mean = 2.5 / (8 + 1e-8);
    double ss = 0;
    for (int k = 0; k < 8; k++)
        ss += (vals[k] - mean) * (vals[k] - mean);
    const double sd = sqrt(ss / (8 + 1e-8) * 8 / 7 + 1e-8);
    assert_float_equal(adv[4], (1.0 - mean) / sd, 1e-12);
    /* token_advantages for REINFORCE++ is this, and sums the rewards */
    double adv2[12], scores[4];
    const int group[4] = {0, 0, 1, 1};
    const struct adv_params rpp = {.est = ADV_REINFORCE_PP, .norm_by_std = true, .gamma = 1};
    token_advantages(&rpp, r, mask, off, len, group, 4, scores, adv2);
    assert_memory_equal(adv, adv2, sizeof adv);
    assert_float_equal(scores[0], 0.7, 1e-15);
    assert_float_equal(scores[3], 0.8, 1e-15);
}

/* ------------------------------------------------------------------ loss and dL/dlogp */

/* Two sequences: S1 (4 tokens, mask 1 0 0 1, advantages 2, 7, -7, 2) and S2 (3 tokens, no mask, advantage -1). The
 * model's tokens have logp = old (ratio 1: loss -A per token, dL/dlogp = -A w); the masked ones a ratio of e^4 and
 * a reference far off, which would clip and move ppo_kl if they counted. 5 of the model's tokens, 7 in all. */
static const int LLEN[2] = {4, 3};
static const uint8_t LMASK[7] = {1, 0, 0, 1, 1, 1, 1};
static const double LADV[7] = {2, 7, -7, 2, -1, -1, -1};
static const float LOGP[7] = {-1.0f, -1.0f, -1.0f, -0.5f, -2.0f, -0.3f, -1.2f};
static const float OLD[7] = {-1.0f, -5.0f, -5.0f, -0.5f, -2.0f, -0.3f, -1.2f};
static const float REF[7] = {-1.5f, -9.0f, 3.0f, -0.7f, -2.5f, -0.1f, -1.0f};
static const float ENT[7] = {1.5f, 9.0f, 9.0f, 0.5f, 2.0f, 1.0f, 0.25f};

static void test_loss_aggregation_masked(void **state)
{
    (void)state;
    const struct policy_loss_params P = {.clip_low = 0.2, .clip_high = 0.28, .clip_c = 3.0, .kl_type = KL_K3};
    /* by hand, per mode (max_response_length 8): the model tokens' weights w1 (S1) and w2 (S2), the loss
     * sum w (-A) = w1 * (-4) + w2 * 3, and dL/dlogp = -A w: -2 w1 on S1's model tokens, w2 on S2's
     *   token-mean:              w = 1/5 (5 model tokens, not 7)      loss -0.2
     *   seq-mean-token-sum:      w = 1/2                              loss -0.5
     *   seq-mean-token-mean:     w1 = 1/(2*2) (S1's 2 model tokens), w2 = 1/(2*3)   loss -1 + 0.5 = -0.5
     *   seq-mean-token-sum-norm: w = 1/(2*8)                          loss -1/16 */
    const double w1[4] = {0.2, 0.5, 0.25, 1.0 / 16}, w2[4] = {0.2, 0.5, 1.0 / 6, 1.0 / 16};
    const double loss[4] = {-0.2, -0.5, -0.5, -1.0 / 16};
    for (int mode = AGG_TOKEN_MEAN; mode <= AGG_SEQ_MEAN_TOKEN_SUM_NORM; mode++) {
        double w[7];
        loss_token_weights((enum loss_agg)mode, LLEN, LMASK, 2, 8, w);
        const double ww[7] = {w1[mode], 0, 0, w1[mode], w2[mode], w2[mode], w2[mode]};
        for (int k = 0; k < 7; k++)
            assert_float_equal(w[k], ww[k], 1e-15);
        struct policy_loss_stats st = {0};
        float d[7], de[7];
        policy_loss_tokens(&P, 7, LOGP, OLD, REF, ENT, LADV, w, LMASK, &st, d, de);
        assert_float_equal(st.loss, loss[mode], 1e-12);
        assert_float_equal(st.pg_loss, loss[mode], 1e-12);
        const double want_d[7] = {-2 * w1[mode], 0, 0, -2 * w1[mode], w2[mode], w2[mode], w2[mode]};
        for (int k = 0; k < 7; k++)
            assert_float_equal(d[k], want_d[k], 1e-7);
        assert_true(d[1] == 0.0f && d[2] == 0.0f && de[1] == 0.0f && de[2] == 0.0f);
        assert_int_equal(st.tokens, 5);
        assert_float_equal(st.pg_clipfrac, 0, 0); /* the masked tokens' ratio e^4 would clip */
        assert_float_equal(st.ppo_kl, 0, 0);      /* and add -4 each */
        /* the loss does not move with a masked token's log-prob (its finite difference is exactly 0) */
        float lp[7];
        memcpy(lp, LOGP, sizeof lp);
        lp[2] += 0.25f;
        struct policy_loss_stats st2 = {0};
        policy_loss_tokens(&P, 7, lp, OLD, REF, ENT, LADV, w, LMASK, &st2, d, de);
        assert_true(st2.loss == st.loss);
    }
    /* with the KL loss and the entropy bonus: the masked tokens add nothing to any term, the same sums as the model's
     * five tokens alone, in order, with their weights */
    const struct policy_loss_params Q = {.clip_low = 0.2,
                                         .clip_high = 0.28,
                                         .clip_c = 3.0,
                                         .use_kl_loss = true,
                                         .kl_type = KL_K3,
                                         .kl_coef = 0.1,
                                         .entropy_coeff = 0.05};
    double w[7];
    loss_token_weights(AGG_SEQ_MEAN_TOKEN_MEAN, LLEN, LMASK, 2, 8, w);
    struct policy_loss_stats st = {0}, alone = {0};
    float d[7], de[7], d5[5], de5[5];
    policy_loss_tokens(&Q, 7, LOGP, OLD, REF, ENT, LADV, w, LMASK, &st, d, de);
    static const int keep[5] = {0, 3, 4, 5, 6};
    float lp5[5], old5[5], ref5[5], ent5[5];
    double adv5[5], w5[5];
    for (int j = 0; j < 5; j++) {
        lp5[j] = LOGP[keep[j]], old5[j] = OLD[keep[j]], ref5[j] = REF[keep[j]], ent5[j] = ENT[keep[j]];
        adv5[j] = LADV[keep[j]], w5[j] = w[keep[j]];
    }
    policy_loss_tokens(&Q, 5, lp5, old5, ref5, ent5, adv5, w5, NULL, &alone, d5, de5);
    assert_memory_equal(&st, &alone, sizeof st);
    for (int j = 0; j < 5; j++)
        assert_true(d[keep[j]] == d5[j] && de[keep[j]] == de5[j]);
    assert_true(d[1] == 0.0f && d[2] == 0.0f && de[1] == 0.0f && de[2] == 0.0f);
    /* an all-ones mask is no mask, bit for bit */
    const uint8_t ones[7] = {1, 1, 1, 1, 1, 1, 1};
    double wa[7], wn[7];
    for (int mode = AGG_TOKEN_MEAN; mode <= AGG_SEQ_MEAN_TOKEN_SUM_NORM; mode++) {
        loss_token_weights((enum loss_agg)mode, LLEN, ones, 2, 8, wa);
        loss_token_weights((enum loss_agg)mode, LLEN, NULL, 2, 8, wn);
        assert_memory_equal(wa, wn, sizeof wa);
    }
}

/* ------------------------------------------------------------------ the update on a tiny model */

#define NSEQ 5

struct fixture {
    struct model *m;
    struct rollout_seq seqs[NSEQ];
    int32_t prompts[NSEQ][6];
    int idx[NSEQ];
};

/* Five sequences of 1, 4, 2, 5 and 3 response tokens (test_actor.c's), the second, fourth and fifth with masks. */
static const uint8_t M1[4] = {1, 0, 0, 1}, M3[5] = {0, 1, 1, 0, 1}, M4[3] = {1, 1, 0};

static struct fixture *setup(void)
{
    struct fixture *f = calloc(1, sizeof *f);
    char err[512];
    f->m = model_load(TEST_MODELS_FIXTURE "tiny-qwen2-untied", err, sizeof err);
    if (!f->m) {
        fail_msg("%s", err);
        abort(); /* not reached: fail_msg ends the test (the analyzer does not know it) */
    }
    srand(5);
    const int V = f->m->cfg.vocab_size;
    for (int i = 0; i < NSEQ; i++) {
        struct rollout_seq *s = &f->seqs[i];
        s->group = i / 2;
        s->gidx = i;
        s->prompt_len = 2 + i % 4;
        for (int t = 0; t < s->prompt_len; t++)
            f->prompts[i][t] = rand() % V;
        s->prompt = f->prompts[i];
        s->resp_len = 1 + (i * 3) % 5;
        s->resp = malloc(sizeof(int32_t) * (size_t)s->resp_len);
        s->adv = malloc(sizeof(double) * (size_t)s->resp_len);
        for (int t = 0; t < s->resp_len; t++) {
            s->resp[t] = rand() % V;
            s->adv[t] = (i % 3 == 0 ? -1.0 : 1.0) * (0.5 + 0.1 * t);
        }
        f->idx[i] = i;
    }
    struct batching bt = {2, 0, false};
    actor_compute_logp(f->m, f->seqs, f->idx, NSEQ, &bt, 0.9f, 0);
    actor_compute_logp(f->m, f->seqs, f->idx, NSEQ, &bt, 0.9f, 1);
    for (int i = 0; i < NSEQ; i++) /* old and reference policies apart from the current one, inside the clip range */
        for (int t = 0; t < f->seqs[i].resp_len; t++) {
            f->seqs[i].old_logp[t] += 0.05f * (float)((i + t) % 3 - 1);
            f->seqs[i].ref_logp[t] -= 0.3f * (float)((i * t) % 2);
        }
    model_alloc_grads(f->m);
    return f;
}

static void set_masks(struct fixture *f)
{
    f->seqs[1].mask = copy_mask(M1, 4);
    f->seqs[3].mask = copy_mask(M3, 5);
    f->seqs[4].mask = copy_mask(M4, 3);
}

static void free_fixture(struct fixture *f)
{
    rollout_seqs_free(f->seqs, NSEQ);
    model_free(f->m);
    free(f);
}

static struct update_params params(enum loss_agg agg, bool kl_and_entropy)
{
    struct update_params p = {
        .loss = {0.2, 0.28, 3.0, kl_and_entropy, KL_K3, kl_and_entropy ? 0.1 : 0, kl_and_entropy ? 0.05 : 0},
        .agg = agg,
        .max_response_length = 6,
        .mini_batch_seqs = NSEQ,
        .ppo_epochs = 1,
        .temperature = 0.9f,
        .bt = {2, 0, false},
    };
    return p;
}

/* The mini-batch's loss; its gradient in f->m->grad (copied to g when not NULL), its statistics in *st (when not
 * NULL). */
static double objective_stats(struct fixture *f, const struct update_params *p, float *g, struct policy_loss_stats *st)
{
    struct policy_loss_stats ls = {0};
    model_zero_grads(f->m);
    actor_accumulate_grads(f->m, f->seqs, f->idx, NSEQ, p, &ls, NULL, NULL);
    if (g)
        memcpy(g, f->m->grad->mem, f->m->grad->n_floats * sizeof(float));
    if (st)
        *st = ls;
    return ls.loss;
}

static double objective(struct fixture *f, const struct update_params *p, float *g)
{
    return objective_stats(f, p, g, NULL);
}

/* An all-ones mask trains exactly as none: the same loss and gradient, bit for bit, in every mode. */
static void test_update_all_ones_is_none(void **state)
{
    (void)state;
    struct fixture *f = setup();
    const size_t n = f->m->grad->n_floats;
    float *g0 = malloc(n * sizeof(float)), *g1 = malloc(n * sizeof(float));
    for (int agg = AGG_TOKEN_MEAN; agg <= AGG_SEQ_MEAN_TOKEN_SUM_NORM; agg++) {
        const struct update_params p = params((enum loss_agg)agg, true);
        const double l0 = objective(f, &p, g0);
        for (int i = 0; i < NSEQ; i++) {
            f->seqs[i].mask = malloc((size_t)f->seqs[i].resp_len);
            memset(f->seqs[i].mask, 1, (size_t)f->seqs[i].resp_len);
        }
        const double l1 = objective(f, &p, g1);
        assert_true(l0 == l1);
        assert_memory_equal(g0, g1, n * sizeof(float));
        for (int i = 0; i < NSEQ; i++) {
            free(f->seqs[i].mask);
            f->seqs[i].mask = NULL;
        }
    }
    free(g0), free(g1);
    free_fixture(f);
}

/* The masked update against the unmasked one over the same sequences, with the masked tokens' advantages set to 0
 * and the denominators put right by hand (KL and entropy off, so that the loss is -A x the clipped ratio, linear in
 * the advantage): the model's tokens' advantages times the masked weight over the unmasked one, T / M for token-mean
 * (T = 15 response tokens, M = 10 of the model's) and, for seq-mean-token-mean, each sequence's length over its model
 * tokens (4 / 2, 5 / 3, 3 / 2); the sequence means and the fixed horizon do not count tokens. */
static void test_update_masked_matches_rescaled(void **state)
{
    (void)state;
    struct fixture *f = setup();
    const size_t n = f->m->grad->n_floats;
    float *gm = malloc(n * sizeof(float)), *gr = malloc(n * sizeof(float));
    double *keep[NSEQ];
    for (int agg = AGG_TOKEN_MEAN; agg <= AGG_SEQ_MEAN_TOKEN_SUM_NORM; agg++) {
        const struct update_params p = params((enum loss_agg)agg, false);
        set_masks(f);
        const double lm = objective(f, &p, gm);
        for (int i = 0; i < NSEQ; i++) {
            struct rollout_seq *s = &f->seqs[i];
            const int own = rollout_seq_model_tokens(s);
            static const int owns[NSEQ] = {1, 2, 2, 3, 2};
            assert_int_equal(own, owns[i]);
            const double scale = agg == AGG_TOKEN_MEAN            ? 15.0 / 10.0
                                 : agg == AGG_SEQ_MEAN_TOKEN_MEAN ? (double)s->resp_len / own
                                                                  : 1.0;
            keep[i] = malloc(sizeof(double) * (size_t)s->resp_len);
            memcpy(keep[i], s->adv, sizeof(double) * (size_t)s->resp_len);
            for (int t = 0; t < s->resp_len; t++)
                s->adv[t] = rollout_seq_model_token(s, t) ? s->adv[t] * scale : 0.0;
            free(s->mask);
            s->mask = NULL;
        }
        const double lr = objective(f, &p, gr);
        if (fabs(lm - lr) > 1e-12 * (1 + fabs(lr)))
            fail_msg("agg %d: masked loss %.17g, rescaled unmasked loss %.17g", agg, lm, lr);
        double worst = 0, scale = 0;
        for (size_t j = 0; j < n; j++) {
            worst = fmax(worst, fabs((double)gm[j] - gr[j]));
            scale = fmax(scale, fabs((double)gr[j]));
        }
        if (!(scale > 0) || worst > 1e-5 * scale)
            fail_msg("agg %d: gradient differs by %g (scale %g)", agg, worst, scale);
        for (int i = 0; i < NSEQ; i++) {
            memcpy(f->seqs[i].adv, keep[i], sizeof(double) * (size_t)f->seqs[i].resp_len);
            free(keep[i]);
        }
    }
    free(gm), free(gr);
    free_fixture(f);
}

/* With the KL loss and the entropy bonus on: what a masked token's advantage, old and reference log-probs hold
 * changes nothing (the same loss, statistics and gradient, bit for bit; 10 tokens counted of 15), and the gradient is
 * that of the masked loss (central finite differences), in every mode. */
static void test_update_masked_tokens_do_not_count(void **state)
{
    (void)state;
    struct fixture *f = setup();
    set_masks(f);
    const size_t n = f->m->grad->n_floats;
    float *g0 = malloc(n * sizeof(float)), *g1 = malloc(n * sizeof(float));
    for (int agg = AGG_TOKEN_MEAN; agg <= AGG_SEQ_MEAN_TOKEN_SUM_NORM; agg++) {
        const struct update_params p = params((enum loss_agg)agg, true);
        struct policy_loss_stats s0, s1;
        const double l0 = objective_stats(f, &p, g0, &s0);
        assert_int_equal(s0.tokens, 10);
        for (int i = 0; i < NSEQ; i++)
            for (int t = 0; t < f->seqs[i].resp_len; t++)
                if (!rollout_seq_model_token(&f->seqs[i], t)) {
                    f->seqs[i].adv[t] += 9.0 * (t % 2 ? 1 : -1);
                    f->seqs[i].old_logp[t] -= 3.0f;
                    f->seqs[i].ref_logp[t] += 2.0f;
                }
        const double l1 = objective_stats(f, &p, g1, &s1);
        assert_true(l0 == l1);
        assert_memory_equal(&s0, &s1, sizeof s0);
        assert_memory_equal(g0, g1, n * sizeof(float));
        int checked = 0;
        for (size_t j = 0; j < f->m->w.n_floats; j += 997) {
            const float w = f->m->w.mem[j], h = 2e-3f;
            f->m->w.mem[j] = w + h;
            const double lp = objective(f, &p, NULL);
            f->m->w.mem[j] = w - h;
            const double lo = objective(f, &p, NULL);
            f->m->w.mem[j] = w;
            const double fd = (lp - lo) / (2 * h);
            if (fabs(fd - g0[j]) > 2e-4 + 2e-2 * fabs(fd))
                fail_msg("agg %d param %zu: analytic %g, finite difference %g", agg, j, g0[j], fd);
            checked++;
        }
        assert_true(checked > 10);
    }
    free(g0), free(g1);
    free_fixture(f);
}

/* ------------------------------------------------------------------ batch operations and the audit line */

/* A batch of three groups of two one-token-prompt sequences; sequence i masked (mask i % 2, 1) when i is odd. */
static void make_batch(struct step_batch *b, struct prompt_item *items)
{
    memset(b, 0, sizeof *b);
    step_batch_reserve(b, 6);
    for (int g = 0; g < 3; g++) {
        b->group_prompt[g] = &items[g];
        b->group_uid[g] = g;
    }
    b->n_groups = 3;
    for (int i = 0; i < 6; i++) {
        struct rollout_seq *s = &b->seqs[i];
        memset(s, 0, sizeof *s);
        s->group = i / 2, s->gidx = i;
        s->prompt = items[i / 2].ids, s->prompt_len = 1;
        s->resp_len = 3;
        s->resp = calloc(3, sizeof *s->resp);
        s->gen_logp = calloc(3, sizeof *s->gen_logp);
        s->old_logp = calloc(3, sizeof *s->old_logp);
        s->adv = calloc(3, sizeof *s->adv);
        s->score = i == 2 ? 1 : 0; /* group 1 alone varies */
        if (i % 2)
            s->mask = copy_mask((const uint8_t[]){0, 1, 1}, 3);
        b->resp_text[b->n_seq++] = NULL;
    }
}

static void test_batch_operations_move_masks(void **state)
{
    (void)state;
    int32_t ids[3] = {1, 2, 3};
    struct prompt_item items[3];
    for (int g = 0; g < 3; g++)
        items[g] = (struct prompt_item){.data_source = "x", .ids = &ids[g], .len = 1, .text = "p"};
    struct step_batch b, c;
    make_batch(&b, items);
    const uint8_t *m3 = b.seqs[3].mask;
    step_batch_truncate_groups(&b, 2); /* drops group 2, and frees sequence 5's mask with it */
    assert_int_equal(b.n_seq, 4);
    assert_ptr_equal(b.seqs[3].mask, m3);
    make_batch(&c, items);
    const uint8_t *c1 = c.seqs[1].mask;
    step_batch_append(&b, &c); /* c's sequences 4..9 of b, their masks moved */
    assert_int_equal(b.n_seq, 10);
    assert_ptr_equal(b.seqs[5].mask, c1);
    assert_null(b.seqs[4].mask);
    step_batch_filter_groups(&b, STEP_FILTER_SCORE); /* only groups 1 and 3 vary (sequence 2 of each batch) */
    assert_int_equal(b.n_seq, 4);
    for (int i = 0; i < 4; i++)
        if (i % 2)
            assert_memory_equal(b.seqs[i].mask, ((const uint8_t[]){0, 1, 1}), 3);
        else
            assert_null(b.seqs[i].mask);
    step_batch_free(&b);
}

/* The audit line: a masked sequence's "response_mask", one per response id, and its advantage is its first model
 * token's; a sequence without a mask has no "response_mask". */
static void test_audit_line(void **state)
{
    (void)state;
    int32_t ids[3] = {1, 2, 3};
    struct prompt_item items[3];
    for (int g = 0; g < 3; g++)
        items[g] = (struct prompt_item){.data_source = "x", .ids = &ids[g], .len = 1, .text = "p"};
    struct step_batch b;
    make_batch(&b, items);
    for (int i = 0; i < 2; i++) {
        b.resp_text[i] = strdup("r");
        for (int t = 0; t < 3; t++) /* 0 on a masked token, as the trainer writes it */
            b.seqs[i].adv[t] = rollout_seq_model_token(&b.seqs[i], t) ? 0.5 + i : 0.0;
    }
    b.n_seq = 2; /* the first group only */
    size_t len;
    char *text = rollout_audit_text(7, 2, &b, NULL, &len);
    b.n_seq = 6;
    char *nl = strchr(text, '\n');
    assert_non_null(nl);
    json_error_t je;
    json_t *first = json_loadb(text, (size_t)(nl - text), 0, &je),
           *second = json_loads(nl + 1, JSON_DISABLE_EOF_CHECK, &je);
    assert_non_null(first);
    assert_non_null(second);
    assert_null(json_object_get(first, "response_mask"));
    assert_float_equal(json_real_value(json_object_get(first, "advantage")), 0.5, 0);
    json_t *mk = json_object_get(second, "response_mask");
    assert_true(json_is_array(mk));
    assert_int_equal(json_array_size(mk), 3);
    for (int t = 0; t < 3; t++)
        assert_int_equal(json_integer_value(json_array_get(mk, (size_t)t)), t ? 1 : 0);
    assert_float_equal(json_real_value(json_object_get(second, "advantage")), 1.5, 0);
    json_decref(first), json_decref(second);
    free(text);
    step_batch_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outcome_advantages),
        cmocka_unit_test(test_reinforce_pp_masked),
        cmocka_unit_test(test_loss_aggregation_masked),
        cmocka_unit_test(test_update_all_ones_is_none),
        cmocka_unit_test(test_update_masked_matches_rescaled),
        cmocka_unit_test(test_update_masked_tokens_do_not_count),
        cmocka_unit_test(test_batch_operations_move_masks),
        cmocka_unit_test(test_audit_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
