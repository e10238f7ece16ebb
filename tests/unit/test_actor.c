/* The GRPO update on a tiny model: the gradient of the full objective (clipped
 * ratio, KL loss, entropy bonus, each aggregation mode) against central finite
 * differences, and invariance of the accumulated gradient to micro-batching. */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/model/model_io.h"
#include "worker/trainer/actor.h"

#define NSEQ 5

struct fixture {
    struct model *m;
    struct rollout_seq seqs[NSEQ];
    int32_t prompts[NSEQ][6];
    int idx[NSEQ];
};

/* shared: the sequences of a group (two of them, i / 2) have the same prompt, the first pair through one
 * pointer and the second through equal copies */
static struct fixture *setup_fixture_prompts(bool shared)
{
    struct fixture *f = calloc(1, sizeof *f);
    char err[512];
    f->m = model_load("tests/fixtures/models/tiny-qwen2-untied", err, sizeof err);
    if (!f->m)
        fail_msg("%s", err);
    srand(5);
    const int V = f->m->cfg.vocab_size;
    for (int i = 0; i < NSEQ; i++) {
        struct rollout_seq *s = &f->seqs[i];
        s->group = i / 2;
        s->gidx = i;
        s->prompt_len = 2 + (shared ? s->group : i) % 4;
        for (int t = 0; t < s->prompt_len; t++)
            f->prompts[i][t] = shared && i % 2 ? f->prompts[i - 1][t] : rand() % V;
        s->prompt = shared && i == 1 ? f->prompts[0] : f->prompts[i];
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
    /* make old and reference policies differ from the current one, so ratios and KL are not trivial;
     * shifts stay inside the clip range so the finite differences see a smooth objective */
    for (int i = 0; i < NSEQ; i++)
        for (int t = 0; t < f->seqs[i].resp_len; t++) {
            f->seqs[i].old_logp[t] += 0.05f * (float)((i + t) % 3 - 1);
            f->seqs[i].ref_logp[t] -= 0.3f * (float)((i * t) % 2);
        }
    return f;
}

static struct fixture *setup_fixture(void) { return setup_fixture_prompts(false); }

static void free_fixture(struct fixture *f)
{
    rollout_seqs_free(f->seqs, NSEQ);
    model_free(f->m);
    free(f);
}

static struct update_params params(enum loss_agg agg)
{
    struct update_params p = {
        .loss = {0.2, 0.28, 3.0, true, KL_K3, 0.1, 0.05},
        .agg = agg,
        .max_response_length = 6,
        .mini_batch_seqs = NSEQ,
        .ppo_epochs = 1,
        .temperature = 0.9f,
        .bt = {NSEQ, 0, false},
    };
    return p;
}

static double objective(struct fixture *f, const struct update_params *p)
{
    /* loss only: accumulate into scratch grads and read the loss total */
    struct policy_loss_stats ls = {0};
    model_zero_grads(f->m);
    actor_accumulate_grads(f->m, f->seqs, f->idx, NSEQ, p, &ls, NULL, NULL);
    return ls.loss;
}

/* The objective's gradient against central finite differences; share: a group's prompt packed once. */
static void check_objective_fd(bool share)
{
    for (int agg = AGG_TOKEN_MEAN; agg <= AGG_SEQ_MEAN_TOKEN_SUM_NORM; agg++) {
        struct fixture *f = setup_fixture_prompts(share);
        struct update_params p = params((enum loss_agg)agg);
        p.bt.share_prompts = share;
        model_alloc_grads(f->m);
        objective(f, &p);
        float *g = malloc(f->m->grad->n_floats * sizeof(float));
        memcpy(g, f->m->grad->mem, f->m->grad->n_floats * sizeof(float));
        int checked = 0;
        for (size_t j = 0; j < f->m->w.n_floats; j += 997) {
            float keep = f->m->w.mem[j];
            const float h = 2e-3f;
            f->m->w.mem[j] = keep + h;
            double lp = objective(f, &p);
            f->m->w.mem[j] = keep - h;
            double lm = objective(f, &p);
            f->m->w.mem[j] = keep;
            double fd = (lp - lm) / (2 * h);
            if (fabs(fd - g[j]) > 2e-4 + 2e-2 * fabs(fd))
                fail_msg("agg %d param %zu: analytic %g, finite difference %g", agg, j, g[j], fd);
            checked++;
        }
        assert_true(checked > 10);
        free(g);
        free_fixture(f);
    }
}

static void test_objective_finite_differences(void **state)
{
    (void)state;
    check_objective_fd(false);
}

static void test_shared_prompt_objective_finite_differences(void **state)
{
    (void)state;
    check_objective_fd(true);
}

/* Shared-prompt packing against whole sequences: the same log-probs, loss and gradient, with each shared prompt's
 * rows (less its last token) forwarded once. */
static void test_shared_prompt_packing_matches_whole(void **state)
{
    (void)state;
    struct fixture *f = setup_fixture_prompts(true);
    model_alloc_grads(f->m);
    const size_t n = f->m->grad->n_floats;
    /* the packing: groups {0,1} and {2,3} share, 4 is alone */
    struct micro_batch whole, shared;
    micro_batch_build(&whole, f->seqs, f->idx, NSEQ, false);
    micro_batch_build(&shared, f->seqs, f->idx, NSEQ, true);
    assert_int_equal(whole.n_shared, 0);
    assert_int_equal(shared.n_shared, 2);
    assert_int_equal(shared.pb.B, NSEQ + 2);
    assert_int_equal(shared.pb.N, whole.pb.N - (f->seqs[1].prompt_len - 1) - (f->seqs[3].prompt_len - 1));
    assert_null(whole.pb.prefix_of);
    for (int i = 0; i < NSEQ; i++) /* each response token's target sits where resp_at says */
        for (int t = 0; t < f->seqs[i].resp_len; t++) {
            assert_int_equal(shared.targets[shared.resp_at[i] + t], f->seqs[i].resp[t]);
            assert_int_equal(shared.pos[shared.resp_at[i] + t], f->seqs[i].prompt_len - 1 + t);
        }
    micro_batch_free(&whole);
    micro_batch_free(&shared);

    for (int pass = 0; pass < 2; pass++) { /* old log-probs: whole, then shared */
        struct batching bt = {NSEQ, 0, pass == 1};
        float *keep[NSEQ];
        for (int i = 0; i < NSEQ; i++) {
            keep[i] = f->seqs[i].old_logp;
            f->seqs[i].old_logp = NULL;
        }
        actor_compute_logp(f->m, f->seqs, f->idx, NSEQ, &bt, 0.9f, 0);
        for (int i = 0; i < NSEQ; i++) {
            for (int t = 0; pass == 1 && t < f->seqs[i].resp_len; t++)
                if (fabsf(f->seqs[i].old_logp[t] - keep[i][t]) > 1e-5f)
                    fail_msg("seq %d token %d: shared log-prob %.7g, whole %.7g", i, t, f->seqs[i].old_logp[t],
                             keep[i][t]);
            free(pass == 1 ? f->seqs[i].old_logp : keep[i]);
            if (pass == 1)
                f->seqs[i].old_logp = keep[i];
        }
    }
    struct update_params p = params(AGG_TOKEN_MEAN);
    p.bt = (struct batching){2, 0, false}; /* pairs: each micro-batch one group */
    const double loss_whole = objective(f, &p);
    float *ref = malloc(n * sizeof(float));
    memcpy(ref, f->m->grad->mem, n * sizeof(float));
    p.bt.share_prompts = true;
    const double loss_shared = objective(f, &p);
    assert_true(fabs(loss_shared - loss_whole) <= 1e-6 * fabs(loss_whole) + 1e-9);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)f->m->grad->mem[i] - ref[i]));
        scale = fmax(scale, fabs((double)ref[i]));
    }
    if (worst > 1e-5 * scale)
        fail_msg("shared-prompt packing: gradient differs by %g (scale %g)", worst, scale);
    free(ref);
    free_fixture(f);
}

static void test_micro_batching_invariance(void **state)
{
    (void)state;
    struct fixture *f = setup_fixture();
    model_alloc_grads(f->m);
    const size_t n = f->m->grad->n_floats;
    struct update_params p = params(AGG_SEQ_MEAN_TOKEN_MEAN);
    objective(f, &p); /* everything in one micro-batch */
    float *ref = malloc(n * sizeof(float));
    memcpy(ref, f->m->grad->mem, n * sizeof(float));
    const struct batching splits[3] = {
        {1, 0, false}, {2, 0, false}, {0, 9, false}}; /* one by one, pairs, 9-token budget */
    for (int s = 0; s < 3; s++) {
        p.bt = splits[s];
        objective(f, &p);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < n; i++) {
            worst = fmax(worst, fabs((double)f->m->grad->mem[i] - ref[i]));
            scale = fmax(scale, fabs((double)ref[i]));
        }
        if (worst > 1e-5 * scale)
            fail_msg("split %d: gradient differs by %g (scale %g)", s, worst, scale);
    }
    free(ref);
    free_fixture(f);
}

/* The on-policy shortcut (old log-probs from the update's own forward) equals a separate old-policy pass. */
static void test_old_logp_from_current_forward(void **state)
{
    (void)state;
    struct fixture *f = setup_fixture();
    model_alloc_grads(f->m);
    const size_t n = f->m->grad->n_floats;
    struct update_params p = params(AGG_TOKEN_MEAN);
    p.bt = (struct batching){2, 0, false};
    actor_compute_logp(f->m, f->seqs, f->idx, NSEQ, &p.bt, p.temperature, 0); /* exact old log-probs */
    double loss_a = objective(f, &p);
    float *ga = malloc(n * sizeof(float));
    memcpy(ga, f->m->grad->mem, n * sizeof(float));
    for (int i = 0; i < NSEQ; i++) {
        free(f->seqs[i].old_logp);
        f->seqs[i].old_logp = NULL;
    }
    p.old_from_current = true;
    double loss_b = objective(f, &p);
    assert_true(loss_a == loss_b);
    assert_memory_equal(ga, f->m->grad->mem, n * sizeof(float));
    for (int i = 0; i < NSEQ; i++)
        assert_non_null(f->seqs[i].old_logp);
    free(ga);
    free_fixture(f);
}

static void test_dynamic_batches_respect_budget(void **state)
{
    (void)state;
    struct rollout_seq s[6] = {0};
    int lens[6] = {10, 3, 7, 7, 2, 12}, idx[6] = {0, 1, 2, 3, 4, 5};
    for (int i = 0; i < 6; i++) {
        s[i].prompt_len = 1;
        s[i].resp_len = lens[i]; /* tokens = prompt + resp - 1 = lens[i] */
    }
    int **groups, *counts;
    int k = split_micro_batches(s, idx, 6, 0, 14, false, &groups, &counts);
    int seen[6] = {0};
    for (int b = 0; b < k; b++) {
        int tokens = 0;
        for (int j = 0; j < counts[b]; j++) {
            tokens += lens[groups[b][j]];
            seen[groups[b][j]]++;
            if (j)
                assert_true(groups[b][j] > groups[b][j - 1]);
        }
        assert_true(tokens <= 14);
        free(groups[b]);
    }
    for (int i = 0; i < 6; i++)
        assert_int_equal(seen[i], 1);
    assert_int_equal(k, 3); /* 41 tokens in bins of 14: three suffice */
    free(groups), free(counts);
    /* fixed size: 6 sequences in micro-batches of 4 -> 4 + 2 */
    k = split_micro_batches(s, idx, 6, 4, 0, false, &groups, &counts);
    assert_int_equal(k, 2);
    assert_int_equal(counts[0], 4);
    assert_int_equal(counts[1], 2);
    for (int b = 0; b < k; b++)
        free(groups[b]);
    free(groups), free(counts);
}

/* Token-budget packing with shared prompts: a group's sequences stay together while they fit, the budget counts
 * the prompt once, and the packed micro-batches (micro_batch_build) keep to it. */
static void test_dynamic_batches_share_prompts(void **state)
{
    (void)state;
    enum { NS = 7 };
    static const int group[NS] = {0, 0, 0, 0, 1, 1, 2}, plen[3] = {10, 6, 4}, rlen[NS] = {3, 5, 2, 4, 7, 1, 9};
    int32_t prompts[3][10], resp[NS][9];
    struct rollout_seq s[NS] = {0};
    int idx[NS];
    for (int g = 0; g < 3; g++)
        for (int t = 0; t < 10; t++)
            prompts[g][t] = 3 * g + t;
    for (int i = 0; i < NS; i++) {
        for (int t = 0; t < 9; t++)
            resp[i][t] = 40 + i + t;
        s[i] = (struct rollout_seq){.group = group[i], .prompt = prompts[group[i]], .prompt_len = plen[group[i]]};
        s[i].resp = resp[i], s[i].resp_len = rlen[i];
        idx[i] = i;
    }
    int **groups, *counts;
    /* rows: group 0 9 + 3 + 5 + 2 + 4 = 23, group 1 5 + 7 + 1 = 13, group 2 3 + 9 = 12: three bins of 24 */
    int k = split_micro_batches(s, idx, NS, 0, 24, true, &groups, &counts);
    assert_int_equal(k, 3);
    int bin_of[NS];
    for (int b = 0; b < k; b++) {
        struct micro_batch mb;
        micro_batch_build(&mb, s, groups[b], counts[b], true);
        assert_true(mb.pb.N <= 24);
        for (int j = 0; j < counts[b]; j++)
            bin_of[groups[b][j]] = b;
        micro_batch_free(&mb);
        free(groups[b]);
    }
    free(groups), free(counts);
    for (int i = 1; i < NS; i++)
        if (group[i] == group[i - 1])
            assert_int_equal(bin_of[i], bin_of[i - 1]);
    /* a budget of 16: group 0 splits (9 + 3 + 5 = 17 > 16: 12 | 16 with the prompt again), each part within it */
    k = split_micro_batches(s, idx, NS, 0, 16, true, &groups, &counts);
    for (int b = 0; b < k; b++) {
        struct micro_batch mb;
        micro_batch_build(&mb, s, groups[b], counts[b], true);
        assert_true(mb.pb.N <= 16);
        micro_batch_free(&mb);
        free(groups[b]);
    }
    free(groups), free(counts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_objective_finite_differences),
        cmocka_unit_test(test_shared_prompt_objective_finite_differences),
        cmocka_unit_test(test_shared_prompt_packing_matches_whole),
        cmocka_unit_test(test_micro_batching_invariance),
        cmocka_unit_test(test_old_logp_from_current_forward),
        cmocka_unit_test(test_dynamic_batches_respect_budget),
        cmocka_unit_test(test_dynamic_batches_share_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
