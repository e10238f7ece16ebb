/* Vectorisable exp for softmax rows: out[j] = exp(x[j] - shift) for x <= shift.
 *
 * exp(y) = 2^n * exp(r) with n = round(y / ln 2), r = y - n ln 2 (Cody-Waite, |r| <= ln2 / 2), exp(r) from
 * its Taylor polynomial to degree 7 (relative error about 2e-7, a couple of ulp), 2^n built in the exponent
 * bits. Plain loops over float arrays that
 * the compiler turns into SIMD code (built with -O3; AVX2 and AVX-512 variants, chosen by cpu_isa()), about
 * ten times faster than calling exp() per element, which dominated the LM head of a 49k vocabulary. */
#include <stdint.h>
#include <string.h>

#include "cpu_kernels.h"
#include "fast_exp.h"
#include "isa_variants.h"

static inline __attribute__((always_inline)) void vec_exp_shifted_body(float *out, const float *x, size_t n,
                                                                       float shift)
{
    for (size_t j = 0; j < n; j++)
        out[j] = exp_clamped(x[j] - shift);
}

CPU_ISA_VARIANTS(, vec_exp_shifted, (float *out, const float *x, size_t n, float shift), (out, x, n, shift))
