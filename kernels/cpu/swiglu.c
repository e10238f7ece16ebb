/* SwiGLU. The sigmoid's exponential is computed inline (Cody-Waite reduction and a degree-7 polynomial, as
 * vexp.c, about 2 ulp) so that the loops run as SIMD code: with expf() per element they were scalar. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTI_TARGET __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MULTI_TARGET
#endif

/* exp(y) for any float y: below -87 it is 0 (smaller than FLT_MIN), above 88 it is clamped to exp(88) (the
 * sigmoid only needs 1 / (1 + exp(-g)) -> 0 there) */
static inline float exp_clamped(float y)
{
    const float lo = -87.0f, hi = 88.0f, magic = 12582912.0f; /* 1.5 * 2^23: rounds to nearest */
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
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y < lo ? 0.0f : p * scale;
}

static inline float sigmoidf(float g) { return 1.0f / (1.0f + exp_clamped(-g)); }

MULTI_TARGET
void swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

MULTI_TARGET
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], sg = sigmoidf(g);
        float silu = g * sg;
        /* silu'(g) = s + g s (1 - s) */
        dgate[i] += dout[i] * up[i] * (sg + g * sg * (1.0f - sg));
        dup[i] += dout[i] * silu;
    }
}
