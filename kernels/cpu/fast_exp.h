/* exp(y) in plain float arithmetic that vectorises (vexp.c's softmax rows, swiglu.c's sigmoid):
 * exp(y) = 2^n exp(r), n = y / ln 2 rounded to nearest by adding and removing 1.5 * 2^23 (roundf is a libm call
 * in every clone), r = y - n ln 2 in two parts (Cody-Waite: |r| <= ln2 / 2, float precision kept), exp(r) from
 * its Taylor polynomial to r^7/7! (error < 2e-8 on the interval), 2^n built in the exponent bits. Below -87 the
 * result is 0 (smaller than FLT_MIN); above 88 it is clamped to exp(88). */
#ifndef GRPO_KERNELS_CPU_FAST_EXP_H
#define GRPO_KERNELS_CPU_FAST_EXP_H

#include <stdint.h>
#include <string.h>

static inline float exp_clamped(float y)
{
    const float lo = -87.0f, hi = 88.0f, magic = 12582912.0f; /* 1.5 * 2^23 */
    float yc = y < lo ? lo : y > hi ? hi : y;
    float n = (yc * 1.44269504088896341f + magic) - magic;
    float r = yc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9841270e-4f;
    p = p * r + 1.3888889e-3f;
    p = p * r + 8.3333333e-3f;
    p = p * r + 4.1666667e-2f;
    p = p * r + 1.6666667e-1f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* unsigned: n + 127 < 0 for a NaN y (p is NaN) */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y < lo ? 0.0f : p * scale;
}

#endif
