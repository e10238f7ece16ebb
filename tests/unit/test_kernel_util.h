/* Shared helpers for the kernel tests (test_kernel_*.c): random fills, weighted sums and a central
 * finite-difference gradient check. Include after <cmocka.h>. */
#ifndef GRPO_TEST_KERNEL_UTIL_H
#define GRPO_TEST_KERNEL_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Deterministic uniform in [lo, hi): a small LCG so results do not depend on the C library's rand(). */
static inline float tk_uniform(uint64_t *s, float lo, float hi)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
}

static inline void tk_fill(float *x, size_t n, uint64_t *s, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = tk_uniform(s, lo, hi);
}

static inline void tk_set(float *x, size_t n, float value)
{
    for (size_t i = 0; i < n; i++)
        x[i] = value;
}

/* sum(y * g), accumulated in double */
static inline double tk_dot(const float *y, const float *g, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)y[i] * g[i];
    return s;
}

static inline float *tk_alloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p)
        fail_msg("out of memory");
    return p;
}

/* Central finite differences of loss(ctx) with respect to each of param[idx[k]] (all n elements when idx is
 * NULL, else the nidx listed ones), against analytic[i] - base (base: what the gradient buffer held before
 * the backward call, which checks that backward accumulates). Fails when
 * |fd - a| > tol * (|fd| + mean |a|), i.e. relative to the element and to the gradient's typical size,
 * and when the analytic gradient is identically zero (a check that could not fail). */
static inline void tk_fd_check(const char *name, float *param, size_t n, const size_t *idx, size_t nidx,
                               const float *analytic, float base, double (*loss)(void *), void *ctx, float h,
                               double tol)
{
    size_t count = idx ? nidx : n;
    double mean = 0.0;
    for (size_t k = 0; k < count; k++)
        mean += fabs((double)analytic[idx ? idx[k] : k] - base);
    mean /= (double)count;
    if (!(mean > 0.0))
        fail_msg("%s: analytic gradient is zero everywhere checked", name);
    for (size_t k = 0; k < count; k++) {
        size_t i = idx ? idx[k] : k;
        float keep = param[i];
        param[i] = keep + h;
        double lp = loss(ctx);
        param[i] = keep - h;
        double lm = loss(ctx);
        param[i] = keep;
        /* divide by the step actually taken in float */
        double fd = (lp - lm) / ((double)(keep + h) - (double)(keep - h));
        double a = (double)analytic[i] - base;
        if (!(fabs(fd - a) <= tol * (fabs(fd) + mean)))
            fail_msg("%s[%zu]: analytic %.7g, finite difference %.7g (mean |grad| %.3g)", name, i, a, fd, mean);
    }
}

#endif
