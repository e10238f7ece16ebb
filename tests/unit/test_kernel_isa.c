/* The ISA variants of our loop kernels (kernels/cpu/isa_variants.h) follow cpu_isa(), and each variant computes the
 * same bits. The reference: the same formulas written as plain scalar code in this file, compiled for baseline
 * x86-64. The build is ISO C (c17), where GCC fuses no a*b+c on its own (-ffp-contract=off), and without
 * -ffast-math nothing is reordered: so the baseline, AVX2 and AVX-512 variants must all equal the reference exactly.
 * That is what makes GRPO_CPU_ISA=avx2 with OPENBLAS_CORETYPE=Haswell compute here what an AVX2 CPU computes (the
 * few-row products, whose lanes differ by ISA, are checked in test_kernel_linear). A build flag that fused or
 * reordered (contraction, fast-math) would fail here. Before cpu_isa() chose the variants, GCC's target_clones chose
 * from the CPU alone, and only the variant this CPU gets could be tested. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/fast_exp.h"
#include "test_kernel_util.h"

enum { N = 4099, HD = 64, TK = 37, HQ = 2 };

static float ref_sigmoid(float g) { return 1.0f / (1.0f + exp_clamped(-g)); }

/* bits of a and b differ in how many of n elements; the most ulps apart */
static size_t count_diff(const float *a, const float *b, size_t n, int32_t *max_ulp)
{
    size_t d = 0;
    *max_ulp = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t ia, ib;
        memcpy(&ia, &a[i], 4);
        memcpy(&ib, &b[i], 4);
        if (ia != ib) {
            d++;
            int32_t u = abs(ia - ib);
            *max_ulp = u > *max_ulp ? u : *max_ulp;
        }
    }
    return d;
}

/* the reference of one decode row of attention (attention.c's head_decode, scalar) */
static void ref_decode(float *out, const float *q, const float *k, const float *v, int ldk, int nk, int hd, float scale)
{
    float S[TK] = {0};
    for (int j = 0; j < nk; j++) {
        float acc[8] = {0};
        int d = 0;
        for (; d + 8 <= hd; d += 8)
            for (int l = 0; l < 8; l++)
                acc[l] += q[d + l] * k[(size_t)j * ldk + d + l];
        for (; d < hd; d++)
            acc[d & 7] += q[d] * k[(size_t)j * ldk + d];
        S[j] = scale * (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])));
    }
    float m = S[0];
    for (int j = 1; j < nk; j++)
        m = S[j] > m ? S[j] : m;
    double acc[8] = {0};
    for (int j = 0; j < nk; j++) {
        S[j] = exp_clamped(S[j] - m);
        acc[j & 7] += S[j];
    }
    const double sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    const float inv = (float)(1.0 / sum);
    for (int d = 0; d < hd; d++)
        out[d] = 0.0f;
    for (int j = 0; j < nk; j++)
        for (int d = 0; d < hd; d++)
            out[d] += S[j] * inv * v[(size_t)j * ldk + d];
}

struct outputs {
    float exp[N], fwd[N], dgate[N], dup[N], attn[HQ * HD];
};

static struct {
    float x[N], gate[N], up[N], dout[N], q[HQ * HD], k[TK * HD], v[TK * HD];
} in;

static void run_kernels(struct outputs *o)
{
    vec_exp_shifted(o->exp, in.x, N, 3.0f);
    swiglu_forward(o->fwd, in.gate, in.up, N);
    memset(o->dgate, 0, sizeof o->dgate);
    memset(o->dup, 0, sizeof o->dup);
    swiglu_backward(o->dgate, o->dup, in.dout, in.gate, in.up, N);
    attention_cached(o->attn, in.q, in.k, in.v, 1, TK, HQ, 1, HD);
}

static void run_reference(struct outputs *o)
{
    for (size_t i = 0; i < N; i++) {
        o->exp[i] = exp_clamped(in.x[i] - 3.0f);
        const float g = in.gate[i], sg = ref_sigmoid(g), silu = g * sg;
        o->fwd[i] = g * sg * in.up[i];
        o->dgate[i] = 0.0f + in.dout[i] * in.up[i] * (sg + g * sg * (1.0f - sg));
        o->dup[i] = 0.0f + in.dout[i] * silu;
    }
    const float scale = (float)(1.0 / sqrt((double)HD));
    for (int h = 0; h < HQ; h++)
        ref_decode(o->attn + h * HD, in.q + h * HD, in.k, in.v, HD, TK, HD, scale);
}

static int setup(void **state)
{
    (void)state;
    uint64_t s = 12345;
    tk_fill(in.x, N, &s, -20.0f, 3.0f);
    tk_fill(in.gate, N, &s, -6.0f, 6.0f);
    tk_fill(in.up, N, &s, -2.0f, 2.0f);
    tk_fill(in.dout, N, &s, -1.0f, 1.0f);
    tk_fill(in.q, HQ * HD, &s, -1.0f, 1.0f);
    tk_fill(in.k, TK * HD, &s, -1.0f, 1.0f);
    tk_fill(in.v, TK * HD, &s, -1.0f, 1.0f);
    return 0;
}

static const char *const names[] = {"vec_exp_shifted", "swiglu_forward", "swiglu_backward dgate", "swiglu_backward dup",
                                    "attention_cached (decode)"};

static void outputs_parts(struct outputs *o, float *p[5], size_t n[5])
{
    p[0] = o->exp, p[1] = o->fwd, p[2] = o->dgate, p[3] = o->dup, p[4] = o->attn;
    n[0] = n[1] = n[2] = n[3] = N, n[4] = HQ * HD;
}

/* An ISA this CPU runs: its variants against the reference, bit for bit. */
static void check_isa(enum cpu_isa isa)
{
    if (!cpu_force_isa(isa)) {
        print_message("%s: this CPU cannot run it, not checked\n", cpu_isa_name(isa));
        return;
    }
    assert_int_equal(cpu_isa(), isa);
    static struct outputs got, ref;
    run_kernels(&got);
    run_reference(&ref);
    cpu_force_isa(CPU_ISA_AUTO);
    float *pg[5], *pr[5];
    size_t n[5];
    outputs_parts(&got, pg, n);
    outputs_parts(&ref, pr, n);
    for (int t = 0; t < 5; t++) {
        int32_t ulp;
        const size_t d = count_diff(pg[t], pr[t], n[t], &ulp);
        print_message("%s, %s: %zu of %zu elements differ from the reference (at most %d ulp)\n", cpu_isa_name(isa),
                      names[t], d, n[t], (int)ulp);
        if (d != 0)
            fail_msg("%s: %s differs from the scalar reference in %zu of %zu elements (at most %d ulp): the variant "
                     "fuses or reorders arithmetic, so runs on CPUs of different ISAs part",
                     cpu_isa_name(isa), names[t], d, n[t], (int)ulp);
    }
}

static void test_baseline(void **state)
{
    (void)state;
    check_isa(CPU_ISA_NONE);
}

static void test_avx2(void **state)
{
    (void)state;
    check_isa(CPU_ISA_AVX2);
}

static void test_avx512(void **state)
{
    (void)state;
    check_isa(CPU_ISA_AVX512);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_baseline),
        cmocka_unit_test(test_avx2),
        cmocka_unit_test(test_avx512),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
