#include <math.h>

#include "cpu_kernels.h"

static inline float sigmoidf(float g)
{
    /* expf(-g) overflows to inf for g < -88, giving 0: the right limit */
    return 1.0f / (1.0f + expf(-g));
}

void swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = gate[i] * sigmoidf(gate[i]) * up[i];
}

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
