/* Causal GQA attention over packed sequences: forward and lse against a naive double-precision
 * reference (masking across sequence boundaries, an empty sequence, sequences longer than one
 * query block), backward against central finite differences, and the KV-cache variant against
 * the rows of the full forward (prefill, partial and token-by-token). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "test_kernel_util.h"

struct problem {
    int B, Hq, Hkv, hd, N;
    const int32_t *cu;
    float *q, *k, *v, *g; /* g: weights of the loss sum(out * g) */
};

static void problem_init(struct problem *p, const int32_t *cu, int B, int Hq, int Hkv, int hd, uint64_t seed)
{
    p->B = B, p->Hq = Hq, p->Hkv = Hkv, p->hd = hd, p->cu = cu, p->N = cu[B];
    size_t nq = (size_t)p->N * Hq * hd, nk = (size_t)p->N * Hkv * hd;
    p->q = tk_alloc(nq), p->k = tk_alloc(nk), p->v = tk_alloc(nk), p->g = tk_alloc(nq);
    uint64_t s = seed;
    tk_fill(p->q, nq, &s, -2, 2);
    tk_fill(p->k, nk, &s, -2, 2);
    tk_fill(p->v, nk, &s, -1, 1);
    tk_fill(p->g, nq, &s, -1, 1);
}

static void problem_free(struct problem *p) { free(p->q), free(p->k), free(p->v), free(p->g); }

/* Naive O(N^2) reference in double: out (N, Hq, hd), lse (N, Hq). */
static void naive_attention(double *out, double *lse, const struct problem *p)
{
    int Hq = p->Hq, Hkv = p->Hkv, hd = p->hd, group = Hq / Hkv;
    double scale = 1.0 / sqrt((double)hd);
    double *sc = calloc((size_t)p->N, sizeof(double));
    for (int b = 0; b < p->B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = p->cu[b]; i < p->cu[b + 1]; i++) {
                const float *qi = p->q + ((size_t)i * Hq + h) * hd;
                double m = -INFINITY;
                for (int j = p->cu[b]; j <= i; j++) {
                    const float *kj = p->k + ((size_t)j * Hkv + h / group) * hd;
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (double)qi[e] * kj[e];
                    sc[j] = d * scale;
                    m = sc[j] > m ? sc[j] : m;
                }
                double sum = 0;
                for (int j = p->cu[b]; j <= i; j++)
                    sum += exp(sc[j] - m);
                lse[(size_t)i * Hq + h] = m + log(sum);
                double *oi = out + ((size_t)i * Hq + h) * hd;
                for (int e = 0; e < hd; e++)
                    oi[e] = 0;
                for (int j = p->cu[b]; j <= i; j++) {
                    double pj = exp(sc[j] - m) / sum;
                    const float *vj = p->v + ((size_t)j * Hkv + h / group) * hd;
                    for (int e = 0; e < hd; e++)
                        oi[e] += pj * vj[e];
                }
            }
    free(sc);
}

static void check_against_naive(const struct problem *p)
{
    size_t nq = (size_t)p->N * p->Hq * p->hd, nl = (size_t)p->N * p->Hq;
    float *out = tk_alloc(nq), *lse = tk_alloc(nl);
    double *rout = calloc(nq, sizeof(double)), *rlse = calloc(nl, sizeof(double));
    attention_forward(out, lse, p->q, p->k, p->v, p->cu, p->B, p->Hq, p->Hkv, p->hd);
    naive_attention(rout, rlse, p);
    for (size_t i = 0; i < nq; i++)
        if (fabs(out[i] - rout[i]) > 2e-5)
            fail_msg("out[%zu] = %.7g, reference %.7g", i, out[i], rout[i]);
    for (size_t i = 0; i < nl; i++)
        if (fabs(lse[i] - rlse[i]) > 2e-5 * (1 + fabs(rlse[i])))
            fail_msg("lse[%zu] = %.7g, reference %.7g", i, lse[i], rlse[i]);
    /* lse may be NULL when no backward follows */
    float *out2 = tk_alloc(nq);
    attention_forward(out2, NULL, p->q, p->k, p->v, p->cu, p->B, p->Hq, p->Hkv, p->hd);
    for (size_t i = 0; i < nq; i++)
        assert_float_equal(out2[i], out[i], 0.0);
    free(out), free(out2), free(lse), free(rout), free(rlse);
}

/* lengths 1, 0 (empty), 3, 5 */
static const int32_t cu_small[5] = {0, 1, 1, 4, 9};

static void test_forward_packed_gqa_matches_naive(void **state)
{
    (void)state;
    struct problem p;
    problem_init(&p, cu_small, 4, 4, 2, 8, 21);
    check_against_naive(&p);
    problem_free(&p);
}

static void test_forward_long_sequences_matches_naive(void **state)
{
    (void)state;
    /* 150 and 70 tokens: several query blocks, partial last block; multi-query (Hkv = 1) */
    static const int32_t cu[3] = {0, 150, 220};
    struct problem p;
    problem_init(&p, cu, 2, 4, 1, 16, 22);
    check_against_naive(&p);
    problem_free(&p);
}

static void test_no_leak_across_sequences(void **state)
{
    (void)state;
    struct problem p;
    problem_init(&p, cu_small, 4, 4, 2, 8, 23);
    size_t nq = (size_t)p.N * 4 * 8, row_kv = 2 * 8;
    float *a = tk_alloc(nq), *b = tk_alloc(nq);
    attention_forward(a, NULL, p.q, p.k, p.v, p.cu, p.B, 4, 2, 8);
    /* change keys and values of the last sequence (rows 4..8): rows 0..3 must not move */
    for (size_t i = 4 * row_kv; i < 9 * row_kv; i++)
        p.k[i] += 1.0f, p.v[i] -= 3.0f;
    attention_forward(b, NULL, p.q, p.k, p.v, p.cu, p.B, 4, 2, 8);
    for (size_t i = 0; i < 4 * 4 * 8; i++)
        assert_float_equal(a[i], b[i], 0.0);
    /* and row 4 (first token of the last sequence) attends only to itself: out = its own v */
    for (int h = 0; h < 4; h++)
        for (int e = 0; e < 8; e++)
            assert_float_equal(b[(4 * 4 + h) * 8 + e], p.v[(4 * 2 + h / 2) * 8 + e], 1e-6);
    free(a), free(b);
    problem_free(&p);
}

static double loss(void *ctx)
{
    struct problem *p = ctx;
    size_t nq = (size_t)p->N * p->Hq * p->hd;
    float *out = tk_alloc(nq);
    attention_forward(out, NULL, p->q, p->k, p->v, p->cu, p->B, p->Hq, p->Hkv, p->hd);
    double l = tk_dot(out, p->g, nq);
    free(out);
    return l;
}

/* Finite differences for dq, dk, dv; nsample > 0 checks that many random elements of each. */
static void run_fd(struct problem *p, size_t nsample, float h, double tol)
{
    size_t nq = (size_t)p->N * p->Hq * p->hd, nk = (size_t)p->N * p->Hkv * p->hd;
    float *out = tk_alloc(nq), *lse = tk_alloc((size_t)p->N * p->Hq);
    float *dq = tk_alloc(nq), *dk = tk_alloc(nk), *dv = tk_alloc(nk);
    const float base = 0.125f;
    tk_set(dq, nq, base), tk_set(dk, nk, base), tk_set(dv, nk, base);
    attention_forward(out, lse, p->q, p->k, p->v, p->cu, p->B, p->Hq, p->Hkv, p->hd);
    attention_backward(dq, dk, dv, p->g, out, lse, p->q, p->k, p->v, p->cu, p->B, p->Hq, p->Hkv, p->hd);
    size_t *iq = NULL, *ik = NULL;
    if (nsample) {
        uint64_t s = 77;
        iq = malloc(nsample * sizeof *iq), ik = malloc(nsample * sizeof *ik);
        for (size_t i = 0; i < nsample; i++) {
            iq[i] = (size_t)(tk_uniform(&s, 0, 1) * nq) % nq;
            ik[i] = (size_t)(tk_uniform(&s, 0, 1) * nk) % nk;
        }
    }
    tk_fd_check("dq", p->q, nq, iq, nsample, dq, base, loss, p, h, tol);
    tk_fd_check("dk", p->k, nk, ik, nsample, dk, base, loss, p, h, tol);
    tk_fd_check("dv", p->v, nk, ik, nsample, dv, base, loss, p, h, tol);
    free(iq), free(ik), free(out), free(lse), free(dq), free(dk), free(dv);
}

static void test_backward_fd_packed_gqa(void **state)
{
    (void)state;
    struct problem p;
    problem_init(&p, cu_small, 4, 4, 2, 8, 31);
    run_fd(&p, 0, 5e-3f, 3e-3);
    problem_free(&p);
}

static void test_backward_fd_long_sequence(void **state)
{
    (void)state;
    /* 130 + 7 tokens: the first crosses two query-block boundaries */
    static const int32_t cu[3] = {0, 130, 137};
    struct problem p;
    problem_init(&p, cu, 2, 2, 1, 4, 32);
    run_fd(&p, 80, 5e-3f, 5e-3);
    problem_free(&p);
}

/* attention_cached on a single sequence of T tokens must reproduce rows of attention_forward. */
static void check_cached(int T, int Hq, int Hkv, int hd, uint64_t seed)
{
    int32_t cu[2] = {0, T};
    struct problem p;
    problem_init(&p, cu, 1, Hq, Hkv, hd, seed);
    size_t row = (size_t)Hq * hd, nq = (size_t)T * row;
    float *full = tk_alloc(nq), *got = tk_alloc(nq);
    attention_forward(full, NULL, p.q, p.k, p.v, cu, 1, Hq, Hkv, hd);
    /* prefill (Tq = Tk = T), the last third, and token-by-token decoding with a growing cache */
    int tqs[2] = {T, T / 3 > 0 ? T / 3 : 1};
    for (int c = 0; c < 2; c++) {
        int Tq = tqs[c];
        attention_cached(got, p.q + (size_t)(T - Tq) * row, p.k, p.v, Tq, T, Hq, Hkv, hd);
        for (size_t i = 0; i < (size_t)Tq * row; i++)
            if (fabsf(got[i] - full[(size_t)(T - Tq) * row + i]) > 1e-5f)
                fail_msg("T=%d Tq=%d: element %zu: cached %.7g, full %.7g", T, Tq, i, got[i],
                         full[(size_t)(T - Tq) * row + i]);
    }
    for (int t = 0; t < T; t++)
        attention_cached(got + (size_t)t * row, p.q + (size_t)t * row, p.k, p.v, 1, t + 1, Hq, Hkv, hd);
    for (size_t i = 0; i < nq; i++)
        if (fabsf(got[i] - full[i]) > 1e-5f)
            fail_msg("T=%d decode: element %zu: cached %.7g, full %.7g", T, i, got[i], full[i]);
    free(full), free(got);
    problem_free(&p);
}

static void test_cached_matches_full_forward(void **state)
{
    (void)state;
    check_cached(7, 4, 2, 8, 41);
    check_cached(1, 2, 2, 4, 42);
    check_cached(150, 4, 2, 16, 43); /* offsets that cross query blocks */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_packed_gqa_matches_naive),
        cmocka_unit_test(test_forward_long_sequences_matches_naive),
        cmocka_unit_test(test_no_leak_across_sequences),
        cmocka_unit_test(test_backward_fd_packed_gqa),
        cmocka_unit_test(test_backward_fd_long_sequence),
        cmocka_unit_test(test_cached_matches_full_forward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
