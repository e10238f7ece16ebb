/* AdamW, clipping and schedules against hand-worked numbers (torch semantics). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/trainer/optim.h"

static void test_adamw_two_steps(void **state)
{
    (void)state;
    /* torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), p0 = 1, g = 0.5 then -0.25:
     * step 1: p = 1*(1-0.001) - 0.1 * (0.05/0.1) / (sqrt(0.00025/0.001) + 1e-8) = 0.999 - 0.1 = 0.899
     * step 2: m = 0.045 - 0.025 = 0.02, v = 0.00024975 + 0.0000625 = 0.00031225
     *         mhat = 0.02/0.19 = 0.105263, vhat = 0.00031225/0.001999 = 0.156203, sqrt = 0.395225
     *         p = 0.899 * 0.999 - 0.1 * 0.105263 / 0.395225 = 0.898101 - 0.026634 = 0.871467 */
    struct adamw *o = adamw_create(1, 0.9, 0.999, 1e-8, 0.01);
    float p = 1.0f, g = 0.5f;
    adamw_step(o, &p, &g, 0.1);
    assert_float_equal(p, 0.899, 1e-6);
    g = -0.25f;
    adamw_step(o, &p, &g, 0.1);
    assert_float_equal(p, 0.871467, 2e-6);
    assert_int_equal(o->t, 2);
    adamw_free(o);
}

/* An armed keep: the step copies the parameters and moments from before it (unaligned copies, a size that is no
 * multiple of the chunk or of 4), is bit for bit the step without one, and disarms; the next step copies nothing. */
static void test_adamw_keep(void **state)
{
    (void)state;
    const size_t n = 3 * 16384 + 7;
    struct adamw *a = adamw_create(n, 0.9, 0.999, 1e-8, 0.01), *b = adamw_create(n, 0.9, 0.999, 1e-8, 0.01);
    float *pa = malloc(n * sizeof(float)), *pb = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    float *kp = malloc((n + 1) * sizeof(float)), *km = malloc((n + 1) * sizeof(float));
    float *kv = malloc((n + 1) * sizeof(float));
    float *before = malloc(3 * n * sizeof(float));
    assert_non_null(pa), assert_non_null(pb), assert_non_null(g), assert_non_null(before);
    for (size_t i = 0; i < n; i++) {
        pa[i] = pb[i] = sinf((float)i * 0.37f);
        g[i] = cosf((float)i * 0.11f) * 0.3f;
    }
    for (int s = 0; s < 2; s++) { /* moments that are not zero */
        adamw_step(a, pa, g, 0.01);
        adamw_step(b, pb, g, 0.01);
    }
    for (size_t i = 0; i < n; i++)
        g[i] = sinf((float)i * 0.05f) * 0.2f;
    memcpy(before, pa, n * sizeof(float));
    memcpy(before + n, a->m, n * sizeof(float));
    memcpy(before + 2 * n, a->v, n * sizeof(float));
    /* the copy into kp + 1, km + 1, kv + 1: 4-byte but not 16-byte aligned destinations */
    struct adamw_keep k = {.p = kp + 1, .m = km + 1, .v = kv + 1, .armed = true};
    a->keep = &k;
    adamw_step(a, pa, g, 0.01);
    adamw_step(b, pb, g, 0.01);
    assert_true(k.kept);
    assert_false(k.armed);
    assert_null(a->keep);
    assert_memory_equal(k.p, before, n * sizeof(float));
    assert_memory_equal(k.m, before + n, n * sizeof(float));
    assert_memory_equal(k.v, before + 2 * n, n * sizeof(float));
    assert_memory_equal(pa, pb, n * sizeof(float));
    assert_memory_equal(a->m, b->m, n * sizeof(float));
    assert_memory_equal(a->v, b->v, n * sizeof(float));
    assert_int_equal(a->t, b->t);
    adamw_step(a, pa, g, 0.01); /* disarmed: the copy stays the one made */
    assert_memory_equal(k.p, before, n * sizeof(float));
    adamw_free(a), adamw_free(b);
    free(pa), free(pb), free(g), free(kp), free(km), free(kv), free(before);
}

static void test_clip(void **state)
{
    (void)state;
    float g[2] = {3, 4};
    assert_float_equal(grad_clip(g, 2, 1.0), 5.0, 1e-12);
    assert_float_equal(g[0], 0.6, 1e-6);
    assert_float_equal(g[1], 0.8, 1e-6);
    float h[2] = {0.3f, 0.4f};
    grad_clip(h, 2, 1.0); /* below the bound: untouched */
    assert_float_equal(h[1], 0.4, 0);
    float bad[2] = {NAN, 1};
    assert_false(isfinite(grad_clip(bad, 2, 1.0)));
    assert_float_equal(bad[1], 1.0, 0);
}

/* the schedule at step n (0-based) of the one given */
static double lr_of(enum lr_style style, double init, double min, int64_t warmup, int64_t decay, int64_t n)
{
    const struct lr_schedule s = {
        .style = style, .lr = 1.0, .init_lr = init, .min_lr = min, .warmup = warmup, .decay_steps = decay};
    return lr_at(&s, n);
}

static double wsd_of(enum lr_wsd_style style, int64_t n)
{
    /* peak 1, floor 0.2, no warm-up, the decay ends at step 10 and its last 4 steps anneal */
    const struct lr_schedule s = {
        .style = LR_WSD, .wsd_style = style, .lr = 1.0, .min_lr = 0.2, .decay_steps = 10, .wsd_steps = 4};
    return lr_at(&s, n);
}

/* Hand-worked values of verl's FSDP schedules and Megatron's OptimizerParamScheduler (its formulas, worked here by
 * hand; the first update is step 0, as verl steps the scheduler after each update). */
static void test_schedules(void **state)
{
    (void)state;
    /* warm-up 4 steps from 0: 0, 0.25, 0.5, 0.75 of lr, then lr */
    assert_float_equal(lr_of(LR_CONSTANT, 0, 0, 4, 10, 0), 0.0, 1e-12);
    assert_float_equal(lr_of(LR_CONSTANT, 0, 0, 4, 10, 2), 0.5, 1e-12);
    assert_float_equal(lr_of(LR_CONSTANT, 0, 0, 4, 10, 7), 1.0, 1e-12);
    /* constant ignores the decay's end (Megatron returns lr before it looks at lr_decay_steps) */
    assert_float_equal(lr_of(LR_CONSTANT, 0, 0.1, 4, 10, 50), 1.0, 1e-12);
    /* warm-up from 0.2 over 4 steps: 0.2 + 0.8 * 1/4 = 0.4 at step 1, 0.2 + 0.8 * 3/4 = 0.8 at step 3 */
    assert_float_equal(lr_of(LR_CONSTANT, 0.2, 0, 4, 10, 1), 0.4, 1e-12);
    assert_float_equal(lr_of(LR_COSINE, 0.2, 0.1, 4, 10, 3), 0.8, 1e-12);
    /* cosine from step 4 to 10 with floor 0.1: halfway (step 7) -> 0.1 + 0.9 * 0.5 = 0.55; end -> 0.1 */
    assert_float_equal(lr_of(LR_COSINE, 0, 0.1, 4, 10, 4), 1.0, 1e-12);
    assert_float_equal(lr_of(LR_COSINE, 0, 0.1, 4, 10, 7), 0.55, 1e-12);
    assert_float_equal(lr_of(LR_COSINE, 0, 0.1, 4, 10, 10), 0.1, 1e-12);
    /* a quarter of the way (step 2 of 0..8, no warm-up): 0.1 + 0.9 * (1 + cos(pi/4)) / 2 = 0.86819805... */
    assert_float_equal(lr_of(LR_COSINE, 0, 0.1, 0, 8, 2), 0.8681980515339464, 1e-12);
    /* past the decay's end: the floor */
    assert_float_equal(lr_of(LR_COSINE, 0, 0.1, 4, 10, 11), 0.1, 1e-12);
    /* linear from step 4 (lr) to 10 (0.1): step 6 is a third of the way: 1 - 0.9 / 3 = 0.7 */
    assert_float_equal(lr_of(LR_LINEAR, 0, 0.1, 4, 10, 6), 0.7, 1e-12);
    assert_float_equal(lr_of(LR_LINEAR, 0, 0.1, 4, 10, 10), 0.1, 1e-12);
    assert_float_equal(lr_of(LR_LINEAR, 0, 0.1, 4, 10, 12), 0.1, 1e-12);
    /* inverse square root after a 4-step warm-up: sqrt(4 / 16) = 0.5 at step 16, sqrt(4 / 100) = 0.2 at 100, the
     * floor 0.25 there; past the decay's end (200): the floor */
    assert_float_equal(lr_of(LR_INV_SQRT, 0, 0, 4, 200, 16), 0.5, 1e-12);
    assert_float_equal(lr_of(LR_INV_SQRT, 0, 0, 4, 200, 100), 0.2, 1e-12);
    assert_float_equal(lr_of(LR_INV_SQRT, 0, 0.25, 4, 200, 100), 0.25, 1e-12);
    assert_float_equal(lr_of(LR_INV_SQRT, 0, 0.01, 4, 200, 201), 0.01, 1e-12);
    /* WSD: lr through step 6 (10 - 4), then the anneal: at step 8 it is halfway (r = 0.5) */
    assert_float_equal(wsd_of(LR_WSD_LINEAR, 6), 1.0, 1e-12);
    assert_float_equal(wsd_of(LR_WSD_LINEAR, 8), 0.2 + 0.8 * 0.5, 1e-12);
    assert_float_equal(wsd_of(LR_WSD_COSINE, 7), 0.2 + 0.8 * 0.5 * (1 + cos(M_PI / 4)), 1e-12);
    assert_float_equal(wsd_of(LR_WSD_MINUS_SQRT, 7), 0.2 + 0.8 * 0.5, 1e-12); /* 1 - sqrt(1/4) */
    assert_float_equal(wsd_of(LR_WSD_EXPONENTIAL, 8), 0.2 + 0.8 * (2 * sqrt(0.5) - 1), 1e-12);
    assert_float_equal(wsd_of(LR_WSD_EXPONENTIAL, 10), 0.2, 1e-12); /* 2 * 0.5 - 1 = 0 */
    /* the names: verl's and Megatron's spellings */
    assert_int_equal(lr_style_named("inverse-square-root"), LR_INV_SQRT);
    assert_int_equal(lr_style_named("inverse_square_root"), LR_INV_SQRT);
    assert_int_equal(lr_style_named("WSD"), LR_WSD);
    assert_int_equal(lr_style_named("polynomial"), -1);
    assert_int_equal(lr_wsd_style_named("minus_sqrt"), LR_WSD_MINUS_SQRT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_two_steps),
        cmocka_unit_test(test_adamw_keep),
        cmocka_unit_test(test_clip),
        cmocka_unit_test(test_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
