/* BF16 linear layer (kernels/cpu/linear_bf16.c): the rounding to BF16 (nearest even) against an independent
 * rounding in double; forward and backward against a reference computed in double on BF16-rounded inputs (tight:
 * only the fp32 accumulation differs) and against fp32 inputs (the BF16 bound); += semantics, bias, N = 1, odd
 * shapes, and the BF16 CPU context. The products are skipped (cmocka skip) on a CPU without a BF16 GEMM. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_bf16.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "test_kernel_util.h"

/* x rounded to 8 significant bits, ties to even, in double (frexp: x = m 2^e, 0.5 <= |m| < 1; nearbyint rounds
 * ties to even in the default rounding mode): an independent statement of what BF16 keeps of a normal float. */
static float ref_bf16(float x)
{
    if (x == 0.0f || !isfinite(x))
        return x;
    int e;
    double m = frexp((double)x, &e);
    return (float)ldexp(nearbyint(m * 256.0) / 256.0, e);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_round_nearest_even(void **state)
{
    (void)state;
    /* 1 + 2^-8 is half way between 1 and 1 + 2^-7: to the even one, 1; 1 + 3 * 2^-8 half way between 1 + 2^-7
     * (odd) and 1 + 2^-6: up; just above half way: up */
    const float in[] = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.5f, 0.0f, -0.0f};
    const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xc020, 0x0000, 0x8000};
    uint16_t out[7];
    bf16_round(out, in, 7);
    for (int i = 0; i < 7; i++)
        assert_int_equal(out[i], want[i]);
    /* the largest float rounds up to infinity; infinities and NaN stay what they are */
    const float special[] = {bits_f32(0x7f7fffffu), INFINITY, -INFINITY, NAN};
    uint16_t so[4];
    bf16_round(so, special, 4);
    assert_int_equal(so[0], 0x7f80);
    assert_int_equal(so[1], 0x7f80);
    assert_int_equal(so[2], 0xff80);
    assert_true(isnan(bf16_to_f32(so[3])));
    /* many values (several lengths: the vector loop and its tail) against the independent rounding */
    uint64_t s = 11;
    for (size_t n = 1; n < 200; n += 37) {
        float *x = tk_alloc(n);
        uint16_t *h = calloc(n, sizeof *h);
        tk_fill(x, n, &s, -300, 300);
        bf16_round(h, x, n);
        for (size_t i = 0; i < n; i++)
            assert_true(bf16_to_f32(h[i]) == ref_bf16(x[i]));
        free(x), free(h);
    }
}

static void test_round_transpose(void **state)
{
    (void)state;
    const int rows = 37, cols = 21;
    uint64_t s = 5;
    float *x = tk_alloc((size_t)rows * cols);
    uint16_t *t = calloc((size_t)rows * cols, sizeof *t);
    tk_fill(x, (size_t)rows * cols, &s, -4, 4);
    bf16_round_transpose(t, x, rows, cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            assert_true(bf16_to_f32(t[(size_t)c * rows + r]) == ref_bf16(x[(size_t)r * cols + c]));
    free(x), free(t);
}

/* C (M, N) = A (M, K) B (K, N) given as element functions, in double, from rounded (bf16) or exact (fp32)
 * inputs; also sum |a b| per element (the scale an error of the accumulation is measured against). */
struct mat {
    const float *p;
    int ld;
    bool trans; /* element (i, k) is p[k * ld + i] */
};
static float at(struct mat m, int i, int k) { return m.trans ? m.p[(size_t)k * m.ld + i] : m.p[(size_t)i * m.ld + k]; }

static void ref_gemm(double *C, double *absC, struct mat A, struct mat B, int M, int N, int K, bool bf16)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double c = 0, a = 0;
            for (int k = 0; k < K; k++) {
                float x = at(A, i, k), y = at(B, k, j);
                if (bf16)
                    x = ref_bf16(x), y = ref_bf16(y);
                c += (double)x * y;
                a += fabs((double)x * y);
            }
            C[(size_t)i * N + j] = c;
            absC[(size_t)i * N + j] = a;
        }
}

/* got[i] - base[i] against the reference: |d - ref| <= tol * scale + 1e-30 */
static void expect_close(const char *what, const float *got, const float *base, const double *ref, const double *scale,
                         size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (base ? base[i] : 0.0);
        if (fabs(d - ref[i]) > tol * scale[i] + 1e-30)
            fail_msg("%s[%zu]: %.9g, reference %.9g (scale %.3g, tolerance %.1e)", what, i, d, ref[i], scale[i], tol);
    }
}

static void skip_without_bf16(void)
{
    if (!cpu_bf16_gemm_available()) {
        printf("# skipped: %s\n", cpu_bf16_gemm_name());
        skip();
    }
}

static const int shapes[][3] = {
    /* N, Din, Dout */
    {1, 7, 5}, {1, 576, 192}, {3, 17, 33}, {37, 129, 65}, {64, 576, 192}, {5, 1, 3}, {16, 32, 48},
};

static void test_forward(void **state)
{
    (void)state;
    skip_without_bf16();
    uint64_t s = 21;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int N = shapes[t][0], Din = shapes[t][1], Dout = shapes[t][2];
        float *x = tk_alloc((size_t)N * Din), *W = tk_alloc((size_t)Dout * Din), *b = tk_alloc((size_t)Dout);
        float *y = tk_alloc((size_t)N * Dout), *yb = tk_alloc((size_t)N * Dout);
        double *r = calloc((size_t)N * Dout, sizeof *r), *a = calloc((size_t)N * Dout, sizeof *a);
        tk_fill(x, (size_t)N * Din, &s, -2, 2);
        tk_fill(W, (size_t)Dout * Din, &s, -0.5f, 0.5f);
        tk_fill(b, (size_t)Dout, &s, -1, 1);
        tk_set(y, (size_t)N * Dout, 123.0f); /* forward overwrites */
        linear_forward_bf16(y, x, W, NULL, N, Din, Dout);
        struct mat A = {x, Din, false}, B = {W, Din, true};
        ref_gemm(r, a, A, B, N, Dout, Din, true);
        expect_close("y (bf16 inputs)", y, NULL, r, a, (size_t)N * Dout, 1e-5);
        ref_gemm(r, a, A, B, N, Dout, Din, false);
        expect_close("y (fp32 inputs)", y, NULL, r, a, (size_t)N * Dout, 1e-2);
        /* bias: added in fp32 after the product */
        linear_forward_bf16(yb, x, W, b, N, Din, Dout);
        for (int i = 0; i < N; i++)
            for (int o = 0; o < Dout; o++)
                assert_float_equal(yb[(size_t)i * Dout + o], y[(size_t)i * Dout + o] + b[o], 1e-6);
        free(x), free(W), free(b), free(y), free(yb), free(r), free(a);
    }
}

static void test_backward(void **state)
{
    (void)state;
    skip_without_bf16();
    uint64_t s = 33;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int N = shapes[t][0], Din = shapes[t][1], Dout = shapes[t][2];
        const size_t nx = (size_t)N * Din, nw = (size_t)Dout * Din, ny = (size_t)N * Dout;
        float *x = tk_alloc(nx), *W = tk_alloc(nw), *dy = tk_alloc(ny);
        float *dx = tk_alloc(nx), *dW = tk_alloc(nw), *db = tk_alloc((size_t)Dout);
        float *dx0 = tk_alloc(nx), *dW0 = tk_alloc(nw), *db0 = tk_alloc((size_t)Dout);
        tk_fill(x, nx, &s, -2, 2);
        tk_fill(W, nw, &s, -0.5f, 0.5f);
        tk_fill(dy, ny, &s, -1, 1);
        /* gradients already hold something: backward adds to it */
        tk_fill(dx0, nx, &s, -1, 1);
        tk_fill(dW0, nw, &s, -1, 1);
        tk_fill(db0, (size_t)Dout, &s, -1, 1);
        memcpy(dx, dx0, nx * sizeof(float)), memcpy(dW, dW0, nw * sizeof(float));
        memcpy(db, db0, (size_t)Dout * sizeof(float));
        linear_backward_bf16(dx, dW, db, dy, x, W, N, Din, Dout);

        double *r = calloc(nx > nw ? nx : nw, sizeof *r), *a = calloc(nx > nw ? nx : nw, sizeof *a);
        /* dx (N, Din) = dy (N, Dout) W (Dout, Din) */
        struct mat DY = {dy, Dout, false}, WM = {W, Din, false};
        ref_gemm(r, a, DY, WM, N, Din, Dout, true);
        for (size_t i = 0; i < nx; i++) /* the sum with the old value is one more fp32 rounding */
            a[i] += fabs(dx0[i]);
        expect_close("dx (bf16 inputs)", dx, dx0, r, a, nx, 1e-5);
        ref_gemm(r, a, DY, WM, N, Din, Dout, false);
        expect_close("dx (fp32 inputs)", dx, dx0, r, a, nx, 1e-2);
        /* dW (Dout, Din) = dy^T (Dout, N) x (N, Din) */
        struct mat DYT = {dy, Dout, true}, X = {x, Din, false};
        ref_gemm(r, a, DYT, X, Dout, Din, N, true);
        for (size_t i = 0; i < nw; i++)
            a[i] += fabs(dW0[i]);
        expect_close("dW (bf16 inputs)", dW, dW0, r, a, nw, 1e-5);
        ref_gemm(r, a, DYT, X, Dout, Din, N, false);
        expect_close("dW (fp32 inputs)", dW, dW0, r, a, nw, 1e-2);
        /* db += the column sums of dy, in fp32 (no rounding to BF16) */
        for (int o = 0; o < Dout; o++) {
            double sum = 0;
            for (int i = 0; i < N; i++)
                sum += dy[(size_t)i * Dout + o];
            assert_float_equal(db[o] - db0[o], sum, 1e-5 * (N + 1));
        }
        /* each output alone, the others NULL: the same values */
        float *dx2 = tk_alloc(nx), *dW2 = tk_alloc(nw);
        memcpy(dx2, dx0, nx * sizeof(float)), memcpy(dW2, dW0, nw * sizeof(float));
        linear_backward_bf16(dx2, NULL, NULL, dy, x, W, N, Din, Dout);
        linear_backward_bf16(NULL, dW2, NULL, dy, x, W, N, Din, Dout);
        assert_memory_equal(dx2, dx, nx * sizeof(float));
        assert_memory_equal(dW2, dW, nw * sizeof(float));
        free(dx2), free(dW2);
        free(x), free(W), free(dy), free(dx), free(dW), free(db), free(dx0), free(dW0), free(db0), free(r), free(a);
    }
}

/* Inputs already BF16 (their low 16 bits zero) and small integers: every product and sum is exact, so the BF16
 * layer must give exactly what the fp32 layer gives. */
static void test_exact_on_bf16_values(void **state)
{
    (void)state;
    skip_without_bf16();
    enum { N = 9, DIN = 40, DOUT = 24 };
    float x[N * DIN], W[DOUT * DIN], dy[N * DOUT], y32[N * DOUT], y16[N * DOUT];
    float dx32[N * DIN] = {0}, dx16[N * DIN] = {0}, dW32[DOUT * DIN] = {0}, dW16[DOUT * DIN] = {0};
    for (int i = 0; i < N * DIN; i++)
        x[i] = (float)((i * 7) % 11 - 5);
    for (int i = 0; i < DOUT * DIN; i++)
        W[i] = (float)((i * 5) % 9 - 4) * 0.5f;
    for (int i = 0; i < N * DOUT; i++)
        dy[i] = (float)((i * 3) % 7 - 3) * 0.25f;
    linear_forward(y32, x, W, NULL, N, DIN, DOUT);
    linear_forward_bf16(y16, x, W, NULL, N, DIN, DOUT);
    assert_memory_equal(y32, y16, sizeof y32);
    linear_backward(dx32, dW32, NULL, dy, x, W, N, DIN, DOUT);
    linear_backward_bf16(dx16, dW16, NULL, dy, x, W, N, DIN, DOUT);
    assert_memory_equal(dx32, dx16, sizeof dx32);
    assert_memory_equal(dW32, dW16, sizeof dW32);
}

/* Repeated calls with shapes that come and go (the primitive cache and the grow-only buffers) give the same
 * results as the first call of each shape. */
static void test_repeated_shapes(void **state)
{
    (void)state;
    skip_without_bf16();
    uint64_t s = 77;
    const int sz[][3] = {{8, 64, 32}, {200, 96, 160}, {8, 64, 32}, {1, 96, 160}, {200, 96, 160}};
    float *first[2] = {NULL, NULL};
    for (int round = 0; round < 5; round++) {
        const int N = sz[round][0], Din = sz[round][1], Dout = sz[round][2];
        uint64_t s0 = s + (uint64_t)N;
        float *x = tk_alloc((size_t)N * Din), *W = tk_alloc((size_t)Dout * Din), *y = tk_alloc((size_t)N * Dout);
        tk_fill(x, (size_t)N * Din, &s0, -1, 1);
        tk_fill(W, (size_t)Dout * Din, &s0, -1, 1);
        linear_forward_bf16(y, x, W, NULL, N, Din, Dout);
        int slot = N == 8 ? 0 : N == 200 ? 1 : -1;
        if (slot >= 0 && !first[slot])
            first[slot] = y;
        else {
            if (slot >= 0)
                assert_memory_equal(first[slot], y, (size_t)N * Dout * sizeof(float));
            free(y);
        }
        free(x), free(W);
    }
    free(first[0]), free(first[1]);
}

/* The BF16 CPU context: made where the GEMM runs (its description names it), refused with a reason elsewhere. */
static void test_context(void **state)
{
    (void)state;
    char why[256] = "", desc[256];
    struct kctx *K = kctx_create("cpu", KMM_BF16, why, sizeof why);
    if (cpu_bf16_gemm_available()) {
        assert_non_null(K);
        kctx_describe(K, desc, sizeof desc);
        assert_non_null(strstr(desc, cpu_bf16_gemm_name()));
        /* the context's linear op is the BF16 one for more rows than a decode step's; those stay fp32 */
        enum { ROWS = SKINNY_MAX_ROWS + 1 };
        float x[ROWS * 3], y[ROWS];
        const float W[3] = {1, 1, 1};
        for (int i = 0; i < ROWS; i++)
            x[3 * i] = 1.0f + 0x1p-9f, x[3 * i + 1] = 2, x[3 * i + 2] = 3;
        k_linear_forward(K, y, x, W, NULL, ROWS, 3, 1);
        for (int i = 0; i < ROWS; i++)
            assert_true(y[i] == 6.0f); /* 1 + 2^-9 rounds to 1 in BF16 */
        k_linear_forward(K, y, x, W, NULL, 1, 3, 1);
        assert_true(y[0] == 6.0f + 0x1p-9f || !skinny_wanted(1, 3)); /* fp32 where the few-row kernel runs */
        kctx_free(K);
    } else {
        assert_null(K);
        assert_true(why[0] != '\0');
    }
}

/* The LM head with BF16 products (lmhead_logprob_*_shard_bf16) against a reference in double on BF16-rounded h and
 * W: log-probs and entropies tight (only the fp32 accumulation differs); dh and dW within the BF16 rounding of the
 * logits' gradients (2^-8 of sum |dz w| per element, as torch's autocast backward also rounds them); against the fp32
 * head within the BF16 bound; and the kept logits give the backward the same bits as recomputing them. */
struct head_ref {
    double *logp, *ent, *dh, *dW, *sdh, *sdW;
};

static void lmhead_reference(struct head_ref *r, const float *h, const float *W, const int32_t *tg, const float *gl,
                             const float *ge, int N, int D, int V, double temp)
{
    double *z = calloc((size_t)V, sizeof *z), *dz = calloc((size_t)V, sizeof *dz);
    memset(r->dW, 0, sizeof(double) * (size_t)V * D);
    memset(r->sdW, 0, sizeof(double) * (size_t)V * D);
    for (int i = 0; i < N; i++) {
        double m = -INFINITY;
        for (int v = 0; v < V; v++) {
            double a = 0;
            for (int d = 0; d < D; d++)
                a += (double)ref_bf16(h[(size_t)i * D + d]) * ref_bf16(W[(size_t)v * D + d]);
            z[v] = a / temp;
            m = z[v] > m ? z[v] : m;
        }
        double sum = 0, spz = 0;
        for (int v = 0; v < V; v++)
            sum += exp(z[v] - m);
        const double lse = m + log(sum);
        for (int v = 0; v < V; v++)
            spz += exp(z[v] - lse) * (z[v] - lse);
        r->logp[i] = z[tg[i]] - lse;
        r->ent[i] = -spz;
        /* dL/dz_v = gl (1[v = t] - p_v) + ge (-p_v (log p_v + H)), then / temp for d(h W^T) */
        for (int v = 0; v < V; v++) {
            const double p = exp(z[v] - lse);
            dz[v] = (gl[i] * ((v == tg[i]) - p) - ge[i] * p * ((z[v] - lse) + r->ent[i])) / temp;
        }
        for (int d = 0; d < D; d++) {
            double a = 0, sa = 0;
            for (int v = 0; v < V; v++) {
                const double t = dz[v] * ref_bf16(W[(size_t)v * D + d]);
                a += t, sa += fabs(t);
            }
            r->dh[(size_t)i * D + d] = a, r->sdh[(size_t)i * D + d] = sa;
        }
        for (int v = 0; v < V; v++)
            for (int d = 0; d < D; d++) {
                const double t = dz[v] * ref_bf16(h[(size_t)i * D + d]);
                r->dW[(size_t)v * D + d] += t, r->sdW[(size_t)v * D + d] += fabs(t);
            }
    }
    free(z), free(dz);
}

static void test_lmhead(void **state)
{
    (void)state;
    skip_without_bf16();
    enum { N = 7, D = 40, V = 301 };
    const float temp = 0.7f;
    uint64_t s = 33;
    float *h = tk_alloc(N * D), *W = tk_alloc((size_t)V * D), *gl = tk_alloc(N), *ge = tk_alloc(N);
    tk_fill(h, N * D, &s, -1, 1);
    tk_fill(W, (size_t)V * D, &s, -0.5f, 0.5f);
    tk_fill(gl, N, &s, -1, 1);
    tk_fill(ge, N, &s, -1, 1);
    int32_t tg[N];
    for (int i = 0; i < N; i++)
        tg[i] = (int32_t)((i * 97 + 13) % V);
    struct head_ref r;
    double *all = calloc(2 * (size_t)N + 2 * (size_t)N * D + 2 * (size_t)V * D, sizeof(double));
    r.logp = all, r.ent = all + N, r.dh = all + 2 * N, r.sdh = r.dh + N * D, r.dW = r.sdh + N * D,
    r.sdW = r.dW + (size_t)V * D;
    lmhead_reference(&r, h, W, tg, gl, ge, N, D, V, temp);
    float lp[N], en[N], lp32[N], en32[N];
    float *dh = tk_alloc(N * D), *dW = tk_alloc((size_t)V * D), *dh2 = tk_alloc(N * D), *dW2 = tk_alloc((size_t)V * D);
    float *keep = tk_alloc((size_t)N * V);
    const struct vocab_shard whole = {.lo = 0, .hi = V, .V = V};
    lmhead_logprob_forward(lp32, en32, h, W, tg, N, D, V, temp, N);
    const int chunks[] = {1, 3, N};
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        lmhead_logprob_forward_shard_bf16(lp, en, h, W, tg, N, D, &whole, temp, chunks[c]);
        for (int i = 0; i < N; i++) {
            if (fabs(lp[i] - r.logp[i]) > 1e-4 || fabs(en[i] - r.ent[i]) > 1e-4)
                fail_msg("chunk %d: logp[%d] %.7g entropy %.7g, reference on BF16 inputs %.7g %.7g", chunks[c], i,
                         (double)lp[i], (double)en[i], r.logp[i], r.ent[i]);
            if (fabs(lp[i] - lp32[i]) > 0.05 || fabs(en[i] - en32[i]) > 0.05) /* the BF16 bound against fp32 */
                fail_msg("chunk %d: logp[%d] %.7g entropy %.7g, fp32 head %.7g %.7g", chunks[c], i, (double)lp[i],
                         (double)en[i], (double)lp32[i], (double)en32[i]);
        }
        tk_set(dh, N * D, 0.5f); /* += semantics */
        tk_set(dW, (size_t)V * D, -0.25f);
        lmhead_logprob_backward_shard_bf16(dh, dW, gl, ge, h, W, tg, N, D, &whole, temp, chunks[c]);
        for (int i = 0; i < N * D; i++)
            if (fabs((dh[i] - 0.5) - r.dh[i]) > 0x1p-8 * r.sdh[i] + 1e-6)
                fail_msg("chunk %d: dh[%d] %.7g, reference %.7g (scale %.3g)", chunks[c], i, dh[i] - 0.5, r.dh[i],
                         r.sdh[i]);
        for (int i = 0; i < V * D; i++)
            if (fabs((dW[i] + 0.25) - r.dW[i]) > 0x1p-8 * r.sdW[i] + 1e-6)
                fail_msg("chunk %d: dW[%d] %.7g, reference %.7g (scale %.3g)", chunks[c], i, dW[i] + 0.25, r.dW[i],
                         r.sdW[i]);
        /* the forward's logits kept: the backward's gradients bit for bit */
        const struct vocab_shard kept = {.lo = 0, .hi = V, .V = V, .keep = keep};
        lmhead_logprob_forward_shard_bf16(lp, en, h, W, tg, N, D, &kept, temp, chunks[c]);
        tk_set(dh2, N * D, 0.5f);
        tk_set(dW2, (size_t)V * D, -0.25f);
        lmhead_logprob_backward_shard_bf16(dh2, dW2, gl, ge, h, W, tg, N, D, &kept, temp, chunks[c]);
        assert_memory_equal(dh, dh2, sizeof(float) * N * D);
        assert_memory_equal(dW, dW2, sizeof(float) * V * D);
    }
    /* the BF16 context runs this head */
    char why[256];
    struct kctx *K = kctx_create("cpu", KMM_BF16, why, sizeof why);
    assert_non_null(K);
    float lpk[N];
    k_lmhead_forward(K, lpk, NULL, h, W, tg, N, D, &whole, temp, 2);
    lmhead_logprob_forward_shard_bf16(lp, NULL, h, W, tg, N, D, &whole, temp, 2);
    assert_memory_equal(lpk, lp, sizeof lp);
    kctx_free(K);
    free(h), free(W), free(gl), free(ge), free(dh), free(dW), free(dh2), free(dW2), free(keep), free(all);
}

int main(void)
{
    struct bf16_cpu f = cpu_bf16_features();
    printf("# BF16 GEMM: %s (CPU: AVX512-BF16 %s, AMX-BF16 %s)\n", cpu_bf16_gemm_name(), f.avx512_bf16 ? "yes" : "no",
           f.amx_bf16 ? "yes" : "no");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_nearest_even),
        cmocka_unit_test(test_round_transpose),
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_backward),
        cmocka_unit_test(test_exact_on_bf16_values),
        cmocka_unit_test(test_repeated_shapes),
        cmocka_unit_test(test_context),
        cmocka_unit_test(test_lmhead),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
