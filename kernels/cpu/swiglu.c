/* SwiGLU. The sigmoid's exponential is computed inline (Cody-Waite reduction and a degree-7 polynomial, as
 * vexp.c, about 2 ulp) so that the loops run as SIMD code: with expf() per element they were scalar. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "fast_exp.h"
#include "isa_variants.h"

static inline float sigmoidf(float g) { return 1.0f / (1.0f + exp_clamped(-g)); }

static inline __attribute__((always_inline)) void swiglu_forward_body(float *out, const float *gate, const float *up,
                                                                      size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

CPU_ISA_VARIANTS(, swiglu_forward, (float *out, const float *gate, const float *up, size_t n), (out, gate, up, n))

static inline __attribute__((always_inline)) void swiglu_backward_body(float *dgate, float *dup, const float *dout,
                                                                       const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], sg = sigmoidf(g);
        float silu = g * sg;
        /* silu'(g) = s + g s (1 - s) */
        dgate[i] += dout[i] * up[i] * (sg + g * sg * (1.0f - sg));
        dup[i] += dout[i] * silu;
    }
}

CPU_ISA_VARIANTS(, swiglu_backward,
                 (float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n),
                 (dgate, dup, dout, gate, up, n))
