/* Causal GQA attention over packed sequences: forward and lse against a naive double-precision
 * reference (masking across sequence boundaries, an empty sequence, sequences longer than one
 * query block), backward against central finite differences, and the KV-cache variant against
 * the rows of the full forward (prefill, partial and token-by-token), and over a cache of BF16-rounded values (a BF16
 * context's) against the double reference of those values, and shared-prompt packing (prefix_of) against
 * the same sequences packed whole, forward and backward, and against finite differences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels.h"

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/pool.h"
#include "test_kernel_util.h"
#include "../test_util.h"

struct problem {
    int B, Hq, Hkv, hd, N;
    const int32_t *cu;
    const int32_t *prefix; /* prefix_of, NULL unless a test sets it */
    float *q, *k, *v, *g;  /* g: weights of the loss sum(out * g) */
};

static void problem_init(struct problem *p, const int32_t *cu, int B, int Hq, int Hkv, int hd, uint64_t seed)
{
    p->B = B, p->Hq = Hq, p->Hkv = Hkv, p->hd = hd, p->cu = cu, p->N = cu[B], p->prefix = NULL;
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
    attention_forward(out, lse, p->q, p->k, p->v, p->cu, p->prefix, p->B, p->Hq, p->Hkv, p->hd);
    naive_attention(rout, rlse, p);
    for (size_t i = 0; i < nq; i++)
        if (fabs(out[i] - rout[i]) > 2e-5)
            fail_msg("out[%zu] = %.7g, reference %.7g", i, out[i], rout[i]);
    for (size_t i = 0; i < nl; i++)
        if (fabs(lse[i] - rlse[i]) > 2e-5 * (1 + fabs(rlse[i])))
            fail_msg("lse[%zu] = %.7g, reference %.7g", i, lse[i], rlse[i]);
    /* lse may be NULL when no backward follows */
    float *out2 = tk_alloc(nq);
    attention_forward(out2, NULL, p->q, p->k, p->v, p->cu, p->prefix, p->B, p->Hq, p->Hkv, p->hd);
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
    attention_forward(a, NULL, p.q, p.k, p.v, p.cu, NULL, p.B, 4, 2, 8);
    /* change keys and values of the last sequence (rows 4..8): rows 0..3 must not move */
    for (size_t i = 4 * row_kv; i < 9 * row_kv; i++)
        p.k[i] += 1.0f, p.v[i] -= 3.0f;
    attention_forward(b, NULL, p.q, p.k, p.v, p.cu, NULL, p.B, 4, 2, 8);
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
    attention_forward(out, NULL, p->q, p->k, p->v, p->cu, p->prefix, p->B, p->Hq, p->Hkv, p->hd);
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
    attention_forward(out, lse, p->q, p->k, p->v, p->cu, p->prefix, p->B, p->Hq, p->Hkv, p->hd);
    attention_backward(dq, dk, dv, p->g, out, lse, p->q, p->k, p->v, p->cu, p->prefix, p->B, p->Hq, p->Hkv, p->hd);
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
    attention_forward(full, NULL, p.q, p.k, p.v, cu, NULL, 1, Hq, Hkv, hd);
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
    check_cached(9, 9, 3, 8, 44);    /* SmolLM2's layout: three query heads to a kv head, decoded together */
    check_cached(5, 24, 2, 4, 45);   /* more query heads to a kv head than one decode pass takes (8 + 4, twice) */
}

/* The CPU's BF16 KV cache (kv_store with bf16, what a BF16 context's kv_store op does): a cache filled one token at a
 * time as generation fills it holds the nearest BF16 value of each key and value, bit for bit, and attention_cached
 * over it (the prefill of every row, and each decode step over the positions so far) matches the double reference
 * of those rounded values; that reference is not the unrounded one's (the rounding happened). */
static void check_cached_bf16(int T, int Hq, int Hkv, int hd, uint64_t seed)
{
    int32_t cu[2] = {0, T};
    struct problem p, r;
    problem_init(&p, cu, 1, Hq, Hkv, hd, seed);
    const size_t row = (size_t)Hq * hd, KD = (size_t)Hkv * hd, nq = (size_t)T * row, nk = (size_t)T * KD;
    r = p;
    r.k = tk_alloc(nk), r.v = tk_alloc(nk);
    for (size_t i = 0; i < nk; i++)
        r.k[i] = test_bf16_nearest(p.k[i]), r.v[i] = test_bf16_nearest(p.v[i]);
    double *want = calloc(nq, sizeof(double)), *raw = calloc(nq, sizeof(double)),
           *lse = calloc((size_t)T * Hq, sizeof(double));
    naive_attention(want, lse, &r);
    naive_attention(raw, lse, &p);
    float *kc = tk_alloc(nk), *vc = tk_alloc(nk), *got = tk_alloc(nq), *pre = tk_alloc(nq);
    for (int t = 0; t < T; t++) { /* a decode step per token: its row appended, then attended */
        kv_store(kc + (size_t)t * KD, p.k + (size_t)t * KD, KD, true);
        kv_store(vc + (size_t)t * KD, p.v + (size_t)t * KD, KD, true);
        attention_cached(got + (size_t)t * row, p.q + (size_t)t * row, kc, vc, 1, t + 1, Hq, Hkv, hd);
    }
    assert_memory_equal(kc, r.k, nk * sizeof(float));
    assert_memory_equal(vc, r.v, nk * sizeof(float));
    attention_cached(pre, p.q, kc, vc, T, T, Hq, Hkv, hd);
    double rounded = 0;
    for (size_t i = 0; i < nq; i++) {
        if (fabs(got[i] - want[i]) > 2e-5)
            fail_msg("T=%d decode: element %zu: %.7g, reference %.7g", T, i, got[i], want[i]);
        if (fabs(pre[i] - want[i]) > 2e-5)
            fail_msg("T=%d prefill: element %zu: %.7g, reference %.7g", T, i, pre[i], want[i]);
        rounded = fmax(rounded, fabs(want[i] - raw[i]));
    }
    if (!(rounded > 1e-4))
        fail_msg("T=%d: the rounded cache's reference is within %.2g of the unrounded one's", T, rounded);
    kv_store(kc, p.k, nk, false); /* without bf16, the values themselves */
    assert_memory_equal(kc, p.k, nk * sizeof(float));
    free(want), free(raw), free(lse), free(kc), free(vc), free(got), free(pre), free(r.k), free(r.v);
    problem_free(&p);
}

static void test_cached_bf16_cache_matches_naive(void **state)
{
    (void)state;
    check_cached_bf16(7, 4, 2, 8, 51);
    check_cached_bf16(150, 4, 2, 16, 52); /* prefill rows over several query blocks */
    check_cached_bf16(9, 9, 3, 64, 53);   /* SmolLM2's heads */
}

/* The kv_store op through the contexts: 4-byte elements on the CPU; the fp32 context copies the bits; a BF16 context
 * (where this CPU has BF16 products) stores the nearest BF16 values, except in batch-invariant mode, whose forward
 * runs in fp32 so that generation's log-probs are the trainer's bit for bit. */
static void test_kv_store_op(void **state)
{
    (void)state;
    enum { n = 1000, at = 24 };
    float *x = tk_alloc(n), *c = tk_alloc(n + at), *r = tk_alloc(n);
    uint64_t seed = 61;
    tk_fill(x, n, &seed, -3, 3);
    for (int i = 0; i < n; i++)
        r[i] = test_bf16_nearest(x[i]);
    struct kctx *K = kctx_cpu();
    assert_int_equal(k_kv_elem_bytes(K), sizeof(float));
    k_kv_store(K, c, at, x, n);
    assert_memory_equal(c + at, x, n * sizeof(float));
    char why[256];
    struct kctx *B = kctx_create("cpu", KMM_BF16, why, sizeof why);
    if (!B) {
        print_message("the BF16 context's kv_store: skipped (%s)\n", why);
        free(x), free(c), free(r);
        return;
    }
    assert_int_equal(k_kv_elem_bytes(B), sizeof(float));
    k_kv_store(B, c, at, x, n);
    assert_memory_equal(c + at, r, n * sizeof(float));
    k_set_batch_invariant(true);
    k_kv_store(B, c, at, x, n);
    k_set_batch_invariant(false);
    assert_memory_equal(c + at, x, n * sizeof(float));
    kctx_free(B);
    free(x), free(c), free(r);
}

/* Shared-prompt packing: a prompt of P rows packed once, two continuations that see it (prefix_of), and a
 * sequence of its own, against the same thing packed whole: [prompt, c1] [prompt, c2] [u]. The outputs and lse
 * must be those of the whole sequences' rows, dq too, and the prompt's dk, dv the sum of its two copies'. */
static void check_prefix_packing(int P, int L1, int L2, int Lu, int Hq, int Hkv, int hd, uint64_t seed)
{
    const int32_t cu[5] = {0, P, P + L1, P + L1 + L2, P + L1 + L2 + Lu}, pre[4] = {-1, 0, 0, -1};
    const int32_t cw[4] = {0, P + L1, 2 * P + L1 + L2, 2 * P + L1 + L2 + Lu};
    struct problem p, w;
    problem_init(&p, cu, 4, Hq, Hkv, hd, seed);
    p.prefix = pre;
    problem_init(&w, cw, 3, Hq, Hkv, hd, seed + 1);
    /* row r of the whole layout is row map[r] of the packed one */
    const int NW = cw[3];
    int *map = malloc(sizeof(int) * (size_t)NW);
    for (int r = 0; r < NW; r++)
        map[r] = r < P + L1 ? r : r < 2 * P + L1 ? r - P - L1 : r - P;
    const size_t rq = (size_t)Hq * hd, rk = (size_t)Hkv * hd;
    for (int r = 0; r < NW; r++) {
        memcpy(w.q + r * rq, p.q + map[r] * rq, rq * sizeof(float));
        /* the prompt's second copy has no loss of its own: the packed prompt's outputs count once */
        if (r >= P + L1 && r < 2 * P + L1)
            memset(w.g + r * rq, 0, rq * sizeof(float));
        else
            memcpy(w.g + r * rq, p.g + map[r] * rq, rq * sizeof(float));
        memcpy(w.k + r * rk, p.k + map[r] * rk, rk * sizeof(float));
        memcpy(w.v + r * rk, p.v + map[r] * rk, rk * sizeof(float));
    }
    float *po = tk_alloc((size_t)p.N * rq), *pl = tk_alloc((size_t)p.N * Hq);
    float *wo = tk_alloc((size_t)NW * rq), *wl = tk_alloc((size_t)NW * Hq);
    float *pdq = tk_alloc((size_t)p.N * rq), *pdk = tk_alloc((size_t)p.N * rk), *pdv = tk_alloc((size_t)p.N * rk);
    float *wdq = tk_alloc((size_t)NW * rq), *wdk = tk_alloc((size_t)NW * rk), *wdv = tk_alloc((size_t)NW * rk);
    tk_set(pdq, (size_t)p.N * rq, 0), tk_set(pdk, (size_t)p.N * rk, 0), tk_set(pdv, (size_t)p.N * rk, 0);
    tk_set(wdq, (size_t)NW * rq, 0), tk_set(wdk, (size_t)NW * rk, 0), tk_set(wdv, (size_t)NW * rk, 0);
    attention_forward(po, pl, p.q, p.k, p.v, cu, pre, 4, Hq, Hkv, hd);
    attention_backward(pdq, pdk, pdv, p.g, po, pl, p.q, p.k, p.v, cu, pre, 4, Hq, Hkv, hd);
    attention_forward(wo, wl, w.q, w.k, w.v, cw, NULL, 3, Hq, Hkv, hd);
    attention_backward(wdq, wdk, wdv, w.g, wo, wl, w.q, w.k, w.v, cw, NULL, 3, Hq, Hkv, hd);
    for (int r = 0; r < NW; r++) {
        const bool second_copy = r >= P + L1 && r < 2 * P + L1; /* the prompt again: only its gradients count */
        for (size_t e = 0; e < rq && !second_copy; e++) {
            if (fabsf(po[map[r] * rq + e] - wo[r * rq + e]) > 1e-6f)
                fail_msg("P=%d: out row %d elem %zu: packed %.7g, whole %.7g", P, r, e, po[map[r] * rq + e],
                         wo[r * rq + e]);
            if (fabsf(pdq[map[r] * rq + e] - wdq[r * rq + e]) > 1e-5f)
                fail_msg("P=%d: dq row %d elem %zu: packed %.7g, whole %.7g", P, r, e, pdq[map[r] * rq + e],
                         wdq[r * rq + e]);
        }
        for (int h = 0; h < Hq && !second_copy; h++)
            assert_true(fabsf(pl[map[r] * Hq + h] - wl[r * Hq + h]) <= 1e-6f);
    }
    for (int r = 0; r < p.N; r++) /* the packed row's gradient: its one whole row, or the prompt's two copies */
        for (size_t e = 0; e < rk; e++) {
            int w0 = r < P + L1 ? r : r + P; /* the prompt's first copy and c1, or c2 and u after the second copy */
            double ek = wdk[w0 * rk + e], ev = wdv[w0 * rk + e];
            if (r < P)
                ek += wdk[(P + L1 + r) * rk + e], ev += wdv[(P + L1 + r) * rk + e];
            if (fabs(pdk[r * rk + e] - ek) > 1e-5 || fabs(pdv[r * rk + e] - ev) > 1e-5)
                fail_msg("P=%d: dk/dv row %d elem %zu: packed %.7g/%.7g, whole %.7g/%.7g", P, r, e, pdk[r * rk + e],
                         pdv[r * rk + e], ek, ev);
        }
    free(map), free(po), free(pl), free(wo), free(wl);
    free(pdq), free(pdk), free(pdv), free(wdq), free(wdk), free(wdv);
    problem_free(&p);
    problem_free(&w);
}

static void test_prefix_packing_matches_whole_sequences(void **state)
{
    (void)state;
    check_prefix_packing(9, 5, 3, 4, 4, 2, 8, 51);
    check_prefix_packing(70, 66, 1, 2, 2, 1, 16, 52); /* a long prompt; a continuation crossing a query block */
    check_prefix_packing(3, 0, 4, 0, 4, 4, 4, 53);    /* an empty continuation and an empty sequence */
}

static void test_prefix_packing_backward_fd(void **state)
{
    (void)state;
    static const int32_t cu[5] = {0, 6, 9, 13, 15}, pre[4] = {-1, 0, 0, -1};
    struct problem p;
    problem_init(&p, cu, 4, 4, 2, 8, 54);
    p.prefix = pre;
    run_fd(&p, 0, 5e-3f, 3e-3);
    problem_free(&p);
}

/* Split over the pool's threads (units of a sequence, or a prefix's family, and a kv head): the same bits at 1, 2
 * and 3 threads, forward, backward and cached, with prefixes whose sequences are not next to each other; and the
 * forward of the same rows as whole sequences against the naive reference at each count. */
static void test_threads_same_bits(void **state)
{
    (void)state;
    static const int32_t cu[6] = {0, 40, 75, 140, 170, 230}, pre[5] = {-1, 0, -1, 0, 2};
    struct problem p;
    problem_init(&p, cu, 5, 4, 2, 16, 55);
    p.prefix = pre;
    const size_t nq = (size_t)p.N * p.Hq * p.hd, nk = (size_t)p.N * p.Hkv * p.hd, nl = (size_t)p.N * p.Hq;
    float *o[3], *l[3], *dq[3], *dk[3], *dv[3], *co[3];
    const int before = cpu_pool_threads();
    for (int t = 0; t < 3; t++) {
        cpu_set_threads(t + 1);
        p.prefix = NULL; /* the naive reference packs whole sequences */
        check_against_naive(&p);
        p.prefix = pre;
        o[t] = tk_alloc(nq), l[t] = tk_alloc(nl), dq[t] = tk_alloc(nq), dk[t] = tk_alloc(nk), dv[t] = tk_alloc(nk);
        co[t] = tk_alloc(nq);
        tk_set(dq[t], nq, 0.25f), tk_set(dk[t], nk, 0.5f), tk_set(dv[t], nk, -0.5f);
        attention_forward(o[t], l[t], p.q, p.k, p.v, cu, pre, 5, p.Hq, p.Hkv, p.hd);
        attention_backward(dq[t], dk[t], dv[t], p.g, o[t], l[t], p.q, p.k, p.v, cu, pre, 5, p.Hq, p.Hkv, p.hd);
        /* cached: the last sequence's 60 rows as a prefill over its own keys */
        attention_cached(co[t], p.q + (size_t)170 * p.Hq * p.hd, p.k + (size_t)170 * p.Hkv * p.hd,
                         p.v + (size_t)170 * p.Hkv * p.hd, 60, 60, p.Hq, p.Hkv, p.hd);
        if (t > 0) {
            assert_memory_equal(o[t], o[0], nq * sizeof(float));
            assert_memory_equal(l[t], l[0], nl * sizeof(float));
            assert_memory_equal(dq[t], dq[0], nq * sizeof(float));
            assert_memory_equal(dk[t], dk[0], nk * sizeof(float));
            assert_memory_equal(dv[t], dv[0], nk * sizeof(float));
            assert_memory_equal(co[t], co[0], (size_t)60 * p.Hq * p.hd * sizeof(float));
        }
    }
    cpu_set_threads(before);
    for (int t = 0; t < 3; t++)
        free(o[t]), free(l[t]), free(dq[t]), free(dk[t]), free(dv[t]), free(co[t]);
    problem_free(&p);
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
        cmocka_unit_test(test_cached_bf16_cache_matches_naive),
        cmocka_unit_test(test_kv_store_op),
        cmocka_unit_test(test_prefix_packing_matches_whole_sequences),
        cmocka_unit_test(test_prefix_packing_backward_fd),
        cmocka_unit_test(test_threads_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
