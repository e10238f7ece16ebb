/* Small helpers the C benchmarks share (header-only, so a benchmark still builds alone with `cc FILE.c`). */
#ifndef GRPO_BENCH_UTIL_H
#define GRPO_BENCH_UTIL_H

#include <stddef.h>
#include <time.h>

/* Monotonic seconds. */
static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* x[0..n) uniform in [-0.5, 0.5), reproducible from seed (a 32-bit LCG). */
static inline void bench_fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) * (1.0 / 16777216.0) - 0.5);
    }
}

#endif
