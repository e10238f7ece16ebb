/* GPU kernels against their CPU references, and the NCCL back-end against the
 * MPI one (--nccl, under mpirun). Exit 77 (skipped) without a visible GPU.
 *
 * Two layers: the raw kernels of kernels/cuda (their own launchers), then every op of the CUDA back-end's table
 * (kops_cuda, through a kctx_create("cuda") context) against the CPU back-end's (kctx_cpu) on random inputs:
 * fp32 within ~1e-5 of the result's scale (5e-5 for attention's and the LM head's gradients, sums of many terms),
 * BF16 GEMMs within 1e-2; attention on packed sequences of unequal lengths with GQA, the KV-cache attention on both
 * of its paths, the LM head with a chunk smaller than N and over a vocabulary shard (lo > 0) with a reduce, AdamW
 * over 3 steps; the backward ops that must be deterministic run twice and must give the same bits; sampling (the
 * sample op and sample_rows_cuda): greedy equal to the CPU's argmax, sampled tokens equal to sample_row's for the
 * same uniforms; the mixture-of-experts ops (routing, experts forward and backward) against the CPU's; a BF16
 * context's attention (tensor cores) against a float64 reference within BF16's bound (t_attention_bf16).
 * GRPO_GPU_TEST_SMALL=1 runs small shapes only (for compute-sanitizer).
 *
 * Bounds by operation: element-wise kernels written to round as the CPU does (RoPE, SwiGLU) within a few float ulps
 * of a scale that accounts for cancellation; copies and order-preserving sums (embedding, AdamW) exactly; reductions
 * summed in another order (RMSNorm's dw) within 1e-5 of the sum of the terms' magnitudes. RMSNorm's dw and the
 * embedding backward are also run twice and must give the same bits. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/check_cuda.h"
#include "common/check_mpi.h"
#include "common/log.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "worker/comm/comm.h"
#include "worker/comm/comm_nccl.h"
#include "worker/model/ring_attn.h"
#include "worker/model/sampler.h"
#include "worker/trainer/optim.h"
#include "../test_util.h"

/* The CUDA back-end's table (kernels/cuda/backend.c). Naming it here also links backend.c's object into this
 * program: kernels.c has weak stand-ins for kops_cuda_open & co. that a static archive would otherwise keep. */
extern const struct kops kops_cuda;

static void *to_dev_bytes(const void *h, size_t bytes)
{
    void *d;
    CHECK_CUDA(cudaMalloc(&d, bytes));
    CHECK_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static float *to_dev(const float *h, size_t n) { return to_dev_bytes(h, n * sizeof *h); }

static void from_dev(void *h, const void *d, size_t bytes)
{
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* A fixed pseudo-random stream (xorshift64*), so failures reproduce. */
static uint64_t rng = 0x9e3779b97f4a7c15u;

static float urand(float lo, float hi)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return lo + (hi - lo) * (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1u << 24);
}

static float *rand_vec(size_t n, float lo, float hi)
{
    float *v = xmalloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = urand(lo, hi);
    return v;
}

static float *copy_vec(const float *src, size_t n)
{
    float *v = xmalloc((n ? n : 1) * sizeof *v); // NOLINT(clang-analyzer-optin.portability.UnixAPI): no wrap
    memcpy(v, src, n * sizeof *v);
    return v;
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]) / (1e-3 + fabs((double)b[i])));
    return m;
}

/* max |got - want| / scale, the scale of each element chosen by the caller (its magnitude, or that of the terms
 * summed into it, so cancellation does not inflate the error). */
static double max_scaled(const float *got, const float *want, const double *scale, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i])) {
            if (!isnan(got[i]) || !isnan(want[i]))
                return INFINITY;
            continue;
        }
        double d = fabs((double)got[i] - want[i]);
        if (d > 0)
            m = fmax(m, d / fmax(scale[i], DBL_MIN));
    }
    return m;
}

/* Elements whose bits differ. */
static size_t count_diff(const float *a, const float *b, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += memcmp(&a[i], &b[i], sizeof *a) != 0;
    return k;
}

static int test_rmsnorm(int N, int D)
{
    size_t nd = (size_t)N * D;
    float *x = rand_vec(nd, -0.5f, 0.5f), *dy = rand_vec(nd, -0.5f, 0.5f), *w = rand_vec(D, 1.0f, 2.0f);
    float *dx0 = rand_vec(nd, -0.1f, 0.1f), *dw0 = rand_vec(D, -0.1f, 0.1f); /* backward accumulates into these */
    float *y = xmalloc(nd * sizeof *y), *r = xmalloc(N * sizeof *r), *gy = xmalloc(nd * sizeof *gy);
    float *gr = xmalloc(N * sizeof *gr), *dx = copy_vec(dx0, nd), *dw = copy_vec(dw0, D);
    float *gdx = xmalloc(nd * sizeof *gdx), *gdw = xmalloc(D * sizeof *gdw);
    float *gdx2 = xmalloc(nd * sizeof *gdx2), *gdw2 = xmalloc(D * sizeof *gdw2);
    rmsnorm_forward(y, r, x, w, N, D, 1e-5f);
    rmsnorm_backward(dx, dw, dy, x, w, r, N, D);

    float *dX = to_dev(x, nd), *dW = to_dev(w, D), *dDY = to_dev(dy, nd), *dY, *dR, *dDX, *dDW;
    CHECK_CUDA(cudaMalloc((void **)&dY, nd * sizeof *dY));
    CHECK_CUDA(cudaMalloc((void **)&dR, N * sizeof *dR));
    CHECK_CUDA(rmsnorm_forward_cuda(dY, dR, dX, dW, N, D, 1e-5f, 0));
    from_dev(gy, dY, nd * sizeof *gy);
    from_dev(gr, dR, N * sizeof *gr);
    /* the backward gets the CPU's rstd, so it is checked on its own */
    CHECK_CUDA(cudaMemcpy(dR, r, N * sizeof *r, cudaMemcpyHostToDevice));
    size_t scratch_bytes = rmsnorm_backward_cuda_scratch_bytes(N, D);
    void *scratch;
    CHECK_CUDA(cudaMalloc(&scratch, scratch_bytes));
    int bad_api = rmsnorm_backward_cuda(NULL, NULL, dDY, dX, dW, dR, N, D, NULL, 0) != cudaErrorInvalidValue;
    for (int run = 0; run < 2; run++) {
        dDX = to_dev(dx0, nd);
        dDW = to_dev(dw0, D);
        CHECK_CUDA(cudaMemset(scratch, 0xff, scratch_bytes)); /* stale scratch must not matter */
        CHECK_CUDA(rmsnorm_backward_cuda(dDX, dDW, dDY, dX, dW, dR, N, D, scratch, 0));
        from_dev(run ? gdx2 : gdx, dDX, nd * sizeof *gdx);
        from_dev(run ? gdw2 : gdw, dDW, D * sizeof *gdw);
        cudaFree(dDX), cudaFree(dDW);
    }

    double *scale = xmalloc(D * sizeof *scale); /* what dw's sum could lose to rounding: its terms' magnitudes */
    for (int j = 0; j < D; j++)
        scale[j] = fabs((double)dw0[j]);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++)
            scale[j] += fabs((double)dy[(size_t)i * D + j] * x[(size_t)i * D + j] * r[i]);
    double ey = max_rel(gy, y, nd), er = max_rel(gr, r, N), edx = max_rel(gdx, dx, nd);
    double edw = max_scaled(gdw, dw, scale, D);
    size_t nondet = count_diff(gdw, gdw2, D) + count_diff(gdx, gdx2, nd);
    int bad = bad_api || !(ey < 1e-4 && er < 1e-5 && edx < 1e-3 && edw < 1e-5) || nondet;
    printf("rmsnorm N=%d D=%d: y %.2e rstd %.2e dx %.2e dw %.2e (of the terms' sum), %zu bits differ run to run%s%s\n",
           N, D, ey, er, edx, edw, nondet, bad_api ? ", NULL scratch accepted" : "", bad ? "  FAIL" : "");
    cudaFree(dX), cudaFree(dW), cudaFree(dDY), cudaFree(dY), cudaFree(dR), cudaFree(scratch);
    free(x), free(dy), free(w), free(dx0), free(dw0), free(y), free(r), free(gy), free(gr), free(dx), free(dw);
    free(gdx), free(gdw), free(gdx2), free(gdw2), free(scale);
    return bad;
}

static int test_rope(int N, int H, int hd, float theta)
{
    size_t n = (size_t)N * H * hd;
    int half = hd / 2;
    int32_t *pos = xmalloc(N * sizeof *pos);
    for (int t = 0; t < N; t++) /* large positions too: angles up to ~3e4 rad are where float angles fail */
        pos[t] = t == 0 ? 0 : (int32_t)urand(0.0f, 32768.0f);
    double *freq = xmalloc((half > 0 ? half : 1) * sizeof *freq);
    rope_default_freqs(freq, hd, theta);
    int32_t *dpos = to_dev_bytes(pos, N * sizeof *pos);
    double *dfreq = to_dev_bytes(freq, half * sizeof *freq);
    int bad = 0;
    double err[2];
    for (int dir = 0; dir < 2; dir++) { /* forward, then backward on fresh data */
        float *x = rand_vec(n, -2.0f, 2.0f), *want = copy_vec(x, n), *got = xmalloc(n * sizeof *got);
        float *dx = to_dev(x, n);
        if (dir == 0) {
            rope_forward_freqs(want, pos, N, H, hd, freq);
            CHECK_CUDA(rope_forward_cuda(dx, dpos, N, H, hd, dfreq, 0));
        } else {
            rope_backward_freqs(want, pos, N, H, hd, freq);
            CHECK_CUDA(rope_backward_cuda(dx, dpos, N, H, hd, dfreq, 0));
        }
        from_dev(got, dx, n * sizeof *got);
        /* each output is x1 c -/+ x2 s with |c|, |s| <= 1: a cos/sin an ulp apart moves it by ulps of |x1| + |x2| */
        double *scale = xmalloc(n * sizeof *scale);
        for (size_t p = 0; p < n / (hd ? hd : 1); p++)
            for (int i = 0; i < half; i++) {
                size_t a = p * hd + i, b = a + half;
                scale[a] = scale[b] = FLT_EPSILON * (fabs((double)x[a]) + fabs((double)x[b]));
            }
        err[dir] = max_scaled(got, want, scale, n);
        bad |= !(err[dir] <= 4.0);
        cudaFree(dx);
        free(x), free(want), free(got), free(scale);
    }
    bad |= rope_forward_cuda(NULL, dpos, N, H, 3, dfreq, 0) != cudaErrorInvalidValue; /* odd head_dim */
    printf("rope N=%d H=%d hd=%d: forward %.2f backward %.2f ulps of |x1|+|x2|%s\n", N, H, hd, err[0], err[1],
           bad ? "  FAIL" : "");
    cudaFree(dpos), cudaFree(dfreq);
    free(pos), free(freq);
    return bad;
}

/* glibc's sigmoid, for the error scales (the CPU kernel's own exponential is within ~2 ulp of it). */
static double sigmoid_ref(float g) { return 1.0f / (1.0f + expf(-g)); }

static int test_swiglu(size_t n)
{
    if (n == 0)
        return 0;
    float *gate = rand_vec(n, -10.0f, 10.0f), *up = rand_vec(n, -2.0f, 2.0f), *dout = rand_vec(n, -1.0f, 1.0f);
    static const float edge[] = {0.0f, -1.2785f, -88.5f, -89.0f, -100.0f, 88.5f, 100.0f, 1e-30f};
    for (size_t k = 0; k < sizeof edge / sizeof *edge && k < n; k++) /* zero, silu' = 0, exp overflow, saturation */
        gate[(k * 7919) % n] = edge[k];
    float *dgate0 = rand_vec(n, -0.5f, 0.5f), *dup0 = rand_vec(n, -0.5f, 0.5f);
    float *out = xmalloc(n * sizeof *out), *dgate = copy_vec(dgate0, n), *dup = copy_vec(dup0, n);
    float *got = xmalloc(n * sizeof *got), *got_alias = xmalloc(n * sizeof *got), *gdgate = xmalloc(n * sizeof *got);
    float *gdup = xmalloc(n * sizeof *got);
    swiglu_forward(out, gate, up, n);
    swiglu_backward(dgate, dup, dout, gate, up, n);

    float *dG = to_dev(gate, n), *dU = to_dev(up, n), *dD = to_dev(dout, n), *dO, *dDG = to_dev(dgate0, n);
    float *dDU = to_dev(dup0, n), *dAlias = to_dev(gate, n);
    CHECK_CUDA(cudaMalloc((void **)&dO, n * sizeof *dO));
    CHECK_CUDA(swiglu_forward_cuda(dO, dG, dU, n, 0));
    CHECK_CUDA(swiglu_forward_cuda(dAlias, dAlias, dU, n, 0)); /* out aliasing gate */
    CHECK_CUDA(swiglu_backward_cuda(dDG, dDU, dD, dG, dU, n, 0));
    from_dev(got, dO, n * sizeof *got);
    from_dev(got_alias, dAlias, n * sizeof *got);
    from_dev(gdgate, dDG, n * sizeof *got);
    from_dev(gdup, dDU, n * sizeof *got);

    double *sout = xmalloc(n * sizeof *sout), *sdg = xmalloc(n * sizeof *sdg), *sdu = xmalloc(n * sizeof *sdu);
    for (size_t i = 0; i < n; i++) {
        double g = gate[i], s = sigmoid_ref(gate[i]), d = dout[i];
        /* plus a floor far below anything that matters: where the sigmoid underflows (g < -88) the CPU's clamped
         * exponential leaves ~1e-37 and the GPU 0 */
        sout[i] = FLT_EPSILON * fabs(g * s * up[i]) + 1e-30;
        /* the sum s + g s (1 - s) and the += cancel: scale by the magnitudes of what is summed */
        sdg[i] = FLT_EPSILON * (fabs((double)dgate0[i]) + fabs(d * up[i]) * (s + fabs(g * s * (1 - s))));
        sdu[i] = FLT_EPSILON * (fabs((double)dup0[i]) + fabs(d * g * s));
    }
    double eo = max_scaled(got, out, sout, n), ea = max_scaled(got_alias, out, sout, n);
    double eg = max_scaled(gdgate, dgate, sdg, n), eu = max_scaled(gdup, dup, sdu, n);
    size_t exact = n - count_diff(got, out, n);
    int bad = !(eo <= 4 && ea <= 4 && eg <= 8 && eu <= 4);
    printf("swiglu n=%zu: out %.2f (aliased %.2f) dgate %.2f dup %.2f ulps of the terms; %zu/%zu outputs exact%s\n", n,
           eo, ea, eg, eu, exact, n, bad ? "  FAIL" : "");
    cudaFree(dG), cudaFree(dU), cudaFree(dD), cudaFree(dO), cudaFree(dDG), cudaFree(dDU), cudaFree(dAlias);
    free(gate), free(up), free(dout), free(dgate0), free(dup0), free(out), free(dgate), free(dup), free(got);
    free(got_alias), free(gdgate), free(gdup), free(sout), free(sdg), free(sdu);
    return bad;
}

/* ids: N tokens drawn from [0, V) (repeat: one id for all), the shard [lo, hi). */
static int test_embedding(int N, int D, int V, int lo, int hi, int repeat)
{
    size_t nd = (size_t)N * D, td = (size_t)(hi - lo) * D;
    int32_t *ids = xmalloc(N * sizeof *ids);
    for (int i = 0; i < N; i++)
        ids[i] = repeat >= 0 ? repeat : (int32_t)urand(0.0f, (float)V) % V;
    const struct vocab_shard vs = {.lo = lo, .hi = hi, .V = V};
    float *table = rand_vec(td, -1.0f, 1.0f), *dout = rand_vec(nd, -1.0f, 1.0f), *dtable0 = rand_vec(td, -1.0f, 1.0f);
    float *out = xmalloc(nd * sizeof *out), *dtable = copy_vec(dtable0, td), *got = xmalloc(nd * sizeof *got);
    float *gdt[2] = {xmalloc(td * sizeof(float)), xmalloc(td * sizeof(float))};
    embedding_forward_shard(out, ids, table, N, D, &vs);
    embedding_backward_shard(dtable, dout, ids, N, D, &vs);

    int32_t *dIds = to_dev_bytes(ids, N * sizeof *ids);
    float *dTable = to_dev(table, td), *dDout = to_dev(dout, nd), *dOut;
    CHECK_CUDA(cudaMalloc((void **)&dOut, nd * sizeof *dOut));
    CHECK_CUDA(cudaMemset(dOut, 0xff, nd * sizeof *dOut)); /* every row must be written, the zero ones too */
    CHECK_CUDA(embedding_forward_cuda(dOut, dIds, dTable, N, D, lo, hi, 0));
    from_dev(got, dOut, nd * sizeof *got);
    for (int run = 0; run < 2; run++) {
        float *dDt = to_dev(dtable0, td);
        CHECK_CUDA(embedding_backward_cuda(dDt, dDout, dIds, N, D, lo, hi, 0));
        from_dev(gdt[run], dDt, td * sizeof(float));
        cudaFree(dDt);
    }
    /* the same additions in the same (token) order as the CPU: equal bits, not just close */
    size_t dfwd = count_diff(got, out, nd), dbwd = count_diff(gdt[0], dtable, td),
           nondet = count_diff(gdt[0], gdt[1], td);
    int bad = dfwd || dbwd || nondet;
    printf("embedding N=%d D=%d shard [%d, %d) of %d%s: %zu forward, %zu backward elements differ from the CPU, %zu "
           "run to run%s\n",
           N, D, lo, hi, V, repeat >= 0 ? " (one id)" : "", dfwd, dbwd, nondet, bad ? "  FAIL" : "");
    cudaFree(dIds), cudaFree(dTable), cudaFree(dDout), cudaFree(dOut);
    free(ids), free(table), free(dout), free(dtable0), free(out), free(dtable), free(got), free(gdt[0]), free(gdt[1]);
    return bad;
}

static int test_adamw(size_t n)
{
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, lrs[] = {1e-3, 2e-3, 5e-4};
    float *p = rand_vec(n, -1.0f, 1.0f), *got = xmalloc(n * sizeof *got);
    float *dP = to_dev(p, n), *dM, *dV, *dG;
    CHECK_CUDA(cudaMalloc((void **)&dM, n * sizeof *dM));
    CHECK_CUDA(cudaMalloc((void **)&dV, n * sizeof *dV));
    CHECK_CUDA(cudaMalloc((void **)&dG, n * sizeof *dG));
    CHECK_CUDA(cudaMemset(dM, 0, n * sizeof *dM));
    CHECK_CUDA(cudaMemset(dV, 0, n * sizeof *dV));
    struct adamw *o = adamw_create(n, b1, b2, eps, wd);
    size_t diff = 0;
    for (int s = 0; s < 3; s++) { /* several steps: the bias corrections change with t */
        float *g = rand_vec(n, -1.0f, 1.0f);
        for (size_t i = 0; i < n; i += 5)
            g[i] *= 1e-4f; /* small gradients too, where eps matters */
        CHECK_CUDA(cudaMemcpy(dG, g, n * sizeof *g, cudaMemcpyHostToDevice));
        adamw_step(o, p, g, lrs[s]);
        CHECK_CUDA(adamw_step_cuda(dP, dG, dM, dV, n, lrs[s], b1, b2, eps, wd, o->t, 0));
        free(g);
    }
    /* the CPU's scalars and order of operations, IEEE division and sqrt, no fused multiply-adds: equal bits */
    from_dev(got, dP, n * sizeof *got);
    diff += count_diff(got, p, n);
    from_dev(got, dM, n * sizeof *got);
    diff += count_diff(got, o->m, n);
    from_dev(got, dV, n * sizeof *got);
    diff += count_diff(got, o->v, n);
    int bad = diff != 0 || adamw_step_cuda(dP, dG, dM, dV, n, 1e-3, b1, b2, eps, wd, 0, 0) != cudaErrorInvalidValue;
    printf("adamw n=%zu, 3 steps: %zu elements of params, m, v differ from the CPU%s\n", n, diff, bad ? "  FAIL" : "");
    cudaFree(dP), cudaFree(dM), cudaFree(dV), cudaFree(dG);
    adamw_free(o);
    free(p), free(got);
    return bad;
}

/* Empty inputs launch nothing (a grid of 0 blocks would be a launch error) and succeed, as the CPU loops do. */
static int test_empty(void)
{
    int bad = rmsnorm_forward_cuda(NULL, NULL, NULL, NULL, 0, 8, 1e-5f, 0) != cudaSuccess;
    bad |= rmsnorm_backward_cuda(NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, NULL, 0) != cudaSuccess;
    bad |= rmsnorm_backward_cuda_scratch_bytes(0, 8) != 0;
    bad |= rope_forward_cuda(NULL, NULL, 0, 2, 8, NULL, 0) != cudaSuccess;
    bad |= rope_backward_cuda(NULL, NULL, 0, 2, 8, NULL, 0) != cudaSuccess;
    bad |= swiglu_forward_cuda(NULL, NULL, NULL, 0, 0) != cudaSuccess;
    bad |= swiglu_backward_cuda(NULL, NULL, NULL, NULL, NULL, 0, 0) != cudaSuccess;
    bad |= embedding_forward_cuda(NULL, NULL, NULL, 0, 8, 0, 10, 0) != cudaSuccess;
    bad |= embedding_backward_cuda(NULL, NULL, NULL, 0, 8, 0, 10, 0) != cudaSuccess;
    bad |= adamw_step_cuda(NULL, NULL, NULL, NULL, 0, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 0) != cudaSuccess;
    printf("empty inputs: %s\n", bad ? "FAIL" : "nothing launched, success");
    return bad;
}

static int test_kernels(void)
{
    static const int rms[][2] = {{1, 7}, {1, 576}, {37, 576}, {33, 1001}, {300, 64}, {65, 3}};
    static const int rope[][3] = {{1, 1, 2}, {5, 3, 64}, {17, 2, 6}, {64, 4, 128}, {3, 7, 130}};
    static const size_t sw[] = {1, 7, 1000, 100003};
    /* N, D, V, lo, hi, one id (-1: random ids); V small so ids repeat, N > 256 so the scans take several chunks */
    static const int emb[][6] = {{1, 5, 10, 0, 10, -1},        {37, 96, 50, 0, 50, -1}, {300, 257, 40, 10, 25, -1},
                                 {600, 33, 1000, 0, 1000, -1}, {600, 64, 10, 0, 10, 3}, {299, 1, 7, 3, 4, -1},
                                 {50, 16, 30, 20, 30, 5}};
    static const size_t aw[] = {1, 7, 1000, 100003};
    int bad = test_empty();
    for (size_t k = 0; k < sizeof rms / sizeof *rms; k++)
        bad += test_rmsnorm(rms[k][0], rms[k][1]);
    for (size_t k = 0; k < sizeof rope / sizeof *rope; k++)
        bad += test_rope(rope[k][0], rope[k][1], rope[k][2], k % 2 ? 1e6f : 1e4f);
    for (size_t k = 0; k < sizeof sw / sizeof *sw; k++)
        bad += test_swiglu(sw[k]);
    for (size_t k = 0; k < sizeof emb / sizeof *emb; k++)
        bad += test_embedding(emb[k][0], emb[k][1], emb[k][2], emb[k][3], emb[k][4], emb[k][5]);
    for (size_t k = 0; k < sizeof aw / sizeof *aw; k++)
        bad += test_adamw(aw[k]);
    printf("%d failed\n", bad);
    return bad ? 1 : 0;
}

/* ---- the CUDA back-end's ops (kops_cuda) against the CPU back-end's ---- */

static int small_shapes(void)
{
    const char *e = getenv("GRPO_GPU_TEST_SMALL");
    return e && *e && strcmp(e, "0") != 0;
}

/* host data in context memory of K */
static void *kput(struct kctx *K, const void *h, size_t bytes)
{
    void *d = k_alloc(K, bytes ? bytes : 1, KMEM_OTHER, "test buffer");
    k_to_device(K, d, h, bytes);
    return d;
}
static float *kputf(struct kctx *K, const float *h, size_t n) { return kput(K, h, n * sizeof(float)); }
static void kget(struct kctx *K, void *h, const void *d, size_t bytes) { k_to_host(K, h, d, bytes); }
static void kdrop(struct kctx *K, void *d, size_t bytes) { k_free(K, d, bytes ? bytes : 1, KMEM_OTHER); }

/* max |got - want| over the scale of what was computed: max |want - init| (init: what an accumulating op started
 * from, or NULL for 0). Inf when any element is NaN on one side only. */
static double err_of(const float *got, const float *want, const float *init, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(want[i]))
            return INFINITY;
        d = fmax(d, fabs((double)got[i] - want[i]));
        s = fmax(s, fabs((double)want[i] - (init ? init[i] : 0.0f)));
    }
    return d / fmax(s, 1e-30);
}

static int report(const char *what, double err, double bound)
{
    int bad = !(err <= bound);
    printf("  %-44s %.2e (bound %.0e)%s\n", what, err, bound, bad ? "  FAIL" : "");
    return bad;
}

static int report_bits(const char *what, size_t ndiff)
{
    printf("  %-44s %zu elements differ run to run%s\n", what, ndiff, ndiff ? "  FAIL" : "");
    return ndiff != 0;
}

static int report_equal(const char *what, size_t ndiff)
{
    printf("  %-44s %zu elements differ%s\n", what, ndiff, ndiff ? "  FAIL" : "");
    return ndiff != 0;
}

static int t_memory(struct kctx *G)
{
    enum { n = 1000 };
    unsigned char h[n], back[n];
    for (int i = 0; i < n; i++)
        h[i] = (unsigned char)(i * 7 + 3);
    unsigned char *a = kput(G, h, n), *b = k_alloc(G, n, KMEM_OTHER, "test copy");
    k_copy(G, b, a, n);
    k_zero(G, b + 100, 50);
    k_sync(G);
    kget(G, back, b, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad |= back[i] != (i >= 100 && i < 150 ? 0 : h[i]);
    /* copy_rows (Ulysses' column slices): 9 rows of 7 bytes, 40 bytes apart in a, 11 apart in b from byte 500 */
    k_copy_rows(G, b + 500, 11, a + 3, 40, 7, 9);
    kget(G, back, b, n);
    for (int r = 0; r < 9; r++)
        for (int i = 0; i < 11; i++)
            bad |= back[500 + r * 11 + i] != (i < 7 ? h[3 + r * 40 + i] : h[500 + r * 11 + i]);
    void *huge = G->ops->alloc(G, (size_t)1 << 50); /* 1 PiB: NULL, not a crash */
    bad |= huge != NULL;
    bad |= G->mem.reserved < G->mem.allocated || G->mem.max_reserved < G->mem.reserved;
    kdrop(G, a, n);
    kdrop(G, b, n);
    printf("  memory: alloc, to_device, copy, zero, copy_rows, to_host, sync; 1 PiB alloc gives NULL; reserved %zu >= "
           "allocated %zu%s\n",
           G->mem.reserved, G->mem.allocated, bad ? "  FAIL" : "");
    return bad;
}

static int t_rmsnorm(struct kctx *G, struct kctx *C, int N, int D)
{
    size_t nd = (size_t)N * D;
    float *x = rand_vec(nd, -1, 1), *w = rand_vec(D, 0.5f, 1.5f), *dy = rand_vec(nd, -1, 1);
    float *dx0 = rand_vec(nd, -0.1f, 0.1f), *dw0 = rand_vec(D, -0.1f, 0.1f);
    float *y = xmalloc(nd * 4), *r = xmalloc(N * 4), *dx = copy_vec(dx0, nd), *dw = copy_vec(dw0, D);
    k_rmsnorm_forward(C, y, r, x, w, N, D, 1e-6f);
    k_rmsnorm_backward(C, dx, dw, dy, x, w, r, N, D);
    float *gx = kputf(G, x, nd), *gw = kputf(G, w, D), *gdy = kputf(G, dy, nd), *gy = kputf(G, x, nd);
    float *gr = kputf(G, r, N), *gy_h = xmalloc(nd * 4), *gr_h = xmalloc(N * 4);
    k_rmsnorm_forward(G, gy, gr, gx, gw, N, D, 1e-6f);
    kget(G, gy_h, gy, nd * 4);
    kget(G, gr_h, gr, N * 4);
    float *out[2][2];
    for (int run = 0; run < 2; run++) {
        float *gdx = kputf(G, dx0, nd), *gdw = kputf(G, dw0, D);
        k_rmsnorm_backward(G, gdx, gdw, gdy, gx, gw, gr, N, D);
        out[run][0] = xmalloc(nd * 4);
        out[run][1] = xmalloc(D * 4);
        kget(G, out[run][0], gdx, nd * 4);
        kget(G, out[run][1], gdw, D * 4);
        kdrop(G, gdx, nd * 4);
        kdrop(G, gdw, D * 4);
    }
    char name[64];
    snprintf(name, sizeof name, "rmsnorm N=%d D=%d: y", N, D);
    int bad = report(name, err_of(gy_h, y, NULL, nd), 1e-5);
    bad += report("  rstd", err_of(gr_h, r, NULL, N), 1e-5);
    bad += report("  dx", err_of(out[0][0], dx, dx0, nd), 1e-5);
    bad += report("  dw", err_of(out[0][1], dw, dw0, D), 1e-5);
    bad += report_bits("  backward", count_diff(out[0][0], out[1][0], nd) + count_diff(out[0][1], out[1][1], D));
    kdrop(G, gx, nd * 4), kdrop(G, gw, D * 4), kdrop(G, gdy, nd * 4), kdrop(G, gy, nd * 4), kdrop(G, gr, N * 4);
    free(x), free(w), free(dy), free(dx0), free(dw0), free(y), free(r), free(dx), free(dw), free(gy_h), free(gr_h);
    for (int run = 0; run < 2; run++)
        free(out[run][0]), free(out[run][1]);
    return bad;
}

static int t_embedding(struct kctx *G, struct kctx *C, int N, int D, int V, int lo, int hi)
{
    const struct vocab_shard vs = {.lo = lo, .hi = hi, .V = V};
    size_t nd = (size_t)N * D, td = (size_t)(hi - lo) * D;
    int32_t *ids = xmalloc(N * sizeof *ids);
    for (int i = 0; i < N; i++)
        ids[i] = (int32_t)urand(0.0f, (float)V) % V;
    float *table = rand_vec(td, -1, 1), *dout = rand_vec(nd, -1, 1), *dt0 = rand_vec(td, -1, 1);
    float *out = xmalloc(nd * 4), *dt = copy_vec(dt0, td), *gout = xmalloc(nd * 4);
    float *gdt[2] = {xmalloc(td * 4), xmalloc(td * 4)};
    k_embedding_forward(C, out, ids, table, N, D, &vs);
    k_embedding_backward(C, dt, dout, ids, N, D, &vs);
    int32_t *gids = kput(G, ids, N * sizeof *ids);
    float *gtable = kputf(G, table, td), *gdout = kputf(G, dout, nd), *go = kputf(G, out, nd);
    k_zero(G, go, nd * 4);
    k_embedding_forward(G, go, gids, gtable, N, D, &vs);
    kget(G, gout, go, nd * 4);
    for (int run = 0; run < 2; run++) {
        float *g = kputf(G, dt0, td);
        k_embedding_backward(G, g, gdout, gids, N, D, &vs);
        kget(G, gdt[run], g, td * 4);
        kdrop(G, g, td * 4);
    }
    size_t df = count_diff(gout, out, nd), db = count_diff(gdt[0], dt, td);
    int bad = df || db;
    printf("  embedding N=%d D=%d shard [%d, %d) of %d: %zu forward, %zu backward elements differ from the CPU%s\n", N,
           D, lo, hi, V, df, db, bad ? "  FAIL" : "");
    bad += report_bits("  backward", count_diff(gdt[0], gdt[1], td));
    kdrop(G, gids, N * 4), kdrop(G, gtable, td * 4), kdrop(G, gdout, nd * 4), kdrop(G, go, nd * 4);
    free(ids), free(table), free(dout), free(dt0), free(out), free(dt), free(gout), free(gdt[0]), free(gdt[1]);
    return bad;
}

/* G's linear ops (fp32 or BF16 GEMMs) against the CPU's fp32. */
/* Whether the int arrays got (device, n) and want (host) agree exactly; prints what differs. */
static int same_ints(struct kctx *G, const char *what, const int32_t *got, const int32_t *want, size_t n)
{
    int32_t *h = xmalloc((n + 1) * sizeof *h);
    kget(G, h, got, n * sizeof *h);
    size_t diff = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (h[i] != want[i]) {
            diff++;
            first = first < n ? first : i;
        }
    if (diff)
        printf("  %-44s %zu of %zu differ (first at %zu: %d, CPU %d)  FAIL\n", what, diff, n, first, (int)h[first],
               (int)want[first]);
    else
        printf("  %-44s all %zu equal\n", what, n);
    free(h);
    return diff != 0;
}

/* The direct per-token reference of a routed layer, in double on the host: each token t through each of its k
 * experts e = idx[t k + j] with weight w = wt[t k + j], y_t = sum_j w Wd_e (silu(Wg_e x_t) * (Wu_e x_t)), with no
 * permutation and no grouping by expert; its backward from dy: dx, dWg, dWu, dWd accumulated (from 0 here) and
 * dwt[t k + j] = dy_t . expert_e(x_t). Wg, Wu (E, F, D), Wd (E, D, F). */
static void moe_direct(const float *x, const float *Wg, const float *Wu, const float *Wd, const int32_t *idx,
                       const float *wt, const float *dy, int N, int k, int D, int F, float *y, float *dx, float *dWg,
                       float *dWu, float *dWd, float *dwt)
{
    double *g = xmalloc((size_t)F * sizeof *g), *u = xmalloc((size_t)F * sizeof *u), *a = xmalloc((size_t)F * 8);
    double *da = xmalloc((size_t)F * sizeof *da), *yt = xmalloc((size_t)D * 8), *dxt = xmalloc((size_t)D * 8);
    for (int t = 0; t < N; t++) {
        const float *xt = x + (size_t)t * D, *dyt = dy + (size_t)t * D;
        for (int i = 0; i < D; i++)
            yt[i] = 0, dxt[i] = 0;
        for (int j = 0; j < k; j++) {
            const int e = idx[(size_t)t * k + j];
            const double w = wt[(size_t)t * k + j];
            const float *wg = Wg + (size_t)e * F * D, *wu = Wu + (size_t)e * F * D, *wd = Wd + (size_t)e * D * F;
            for (int f = 0; f < F; f++) {
                double sg = 0, su = 0;
                for (int i = 0; i < D; i++)
                    sg += (double)wg[(size_t)f * D + i] * xt[i], su += (double)wu[(size_t)f * D + i] * xt[i];
                g[f] = sg, u[f] = su, a[f] = sg / (1.0 + exp(-sg)) * su;
            }
            double dot = 0; /* dy_t . the expert's output */
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int f = 0; f < F; f++)
                    o += (double)wd[(size_t)i * F + f] * a[f];
                yt[i] += w * o;
                dot += (double)dyt[i] * o;
            }
            dwt[(size_t)t * k + j] = (float)dot;
            for (int f = 0; f < F; f++) { /* da = Wd^T (w dy); through SwiGLU; dx += Wg^T dg + Wu^T du */
                double s = 0;
                for (int i = 0; i < D; i++) {
                    s += (double)wd[(size_t)i * F + f] * w * dyt[i];
                    dWd[(size_t)e * D * F + (size_t)i * F + f] += (float)(w * dyt[i] * a[f]);
                }
                da[f] = s;
                const double sig = 1.0 / (1.0 + exp(-g[f])), silu = g[f] * sig;
                const double dg = s * u[f] * sig * (1.0 + g[f] * (1.0 - sig)), du = s * silu;
                for (int i = 0; i < D; i++) {
                    dxt[i] += (double)wg[(size_t)f * D + i] * dg + (double)wu[(size_t)f * D + i] * du;
                    dWg[(size_t)e * F * D + (size_t)f * D + i] += (float)(dg * xt[i]);
                    dWu[(size_t)e * F * D + (size_t)f * D + i] += (float)(du * xt[i]);
                }
            }
        }
        for (int i = 0; i < D; i++)
            y[(size_t)t * D + i] = (float)yt[i], dx[(size_t)t * D + i] = (float)dxt[i];
    }
    free(g), free(u), free(a), free(da), free(yt), free(dxt);
}

/* Expert parallelism's row moves (kops moe_gather, moe_combine, moe_slot_grad, moe_scatter: the moves around its
 * all-to-alls) through G against C, on r's routing (rc on C, rg on G: the same slots): gather exactly (rows and pos),
 * the others to 1e-6 (the same sums in the same order). */
static int t_moe_moves(struct kctx *G, struct kctx *C, struct kmoe *rc, struct kmoe *rg, const float *x,
                       const float *gx)
{
    const int N = rc->N, k = rc->k, D = rc->D;
    const size_t nk = (size_t)N * k, nx = (size_t)N * D, ns = nk * D;
    float *ys = rand_vec(ns, -1, 1), *dy = rand_vec(nx, -1, 1), *dxs = rand_vec(ns, -1, 1), *dx0 = rand_vec(nx, -1, 1);
    float *xs = xmalloc(ns * 4), *y = xmalloc(nx * 4), *dys = xmalloc(ns * 4), *dwt = xmalloc(nk * 4);
    float *dx = xmalloc(nx * 4), *h = xmalloc((ns > nx ? ns : nx) * 4);
    memcpy(dx, dx0, nx * 4);
    memcpy(rc->ys, ys, ns * 4); /* slot_grad reads r->ys */
    k_to_device(G, rg->ys, ys, ns * 4);
    float *gxs = kputf(G, ys, ns), *gy = kputf(G, dy, nx), *gdy = kputf(G, dy, nx), *gys = kputf(G, ys, ns);
    float *gdys = kputf(G, ys, ns), *gdwt = kputf(G, dwt, nk), *gdxs = kputf(G, dxs, ns), *gdx = kputf(G, dx0, nx);
    k_moe_gather(C, xs, x, rc);
    k_moe_gather(G, gxs, gx, rg);
    k_moe_combine(C, y, ys, rc);
    k_moe_combine(G, gy, gys, rg);
    k_moe_slot_grad(C, dys, dwt, dy, rc);
    k_moe_slot_grad(G, gdys, gdwt, gdy, rg);
    k_moe_scatter(C, dx, dxs, rc);
    k_moe_scatter(G, gdx, gdxs, rg);
    kget(G, h, gxs, ns * 4);
    int bad = report("  EP rows: gather (xs)", err_of(h, xs, NULL, ns), 0);
    bad += same_ints(G, "  EP rows: gather's slot rows (pos)", rg->pos, rc->pos, nk);
    kget(G, h, gy, nx * 4);
    bad += report("  EP rows: combine (y)", err_of(h, y, NULL, nx), 1e-6);
    kget(G, h, gdys, ns * 4);
    bad += report("  EP rows: slot gradients (dys)", err_of(h, dys, NULL, ns), 1e-6);
    kget(G, h, gdwt, nk * 4);
    bad += report("  EP rows: routing weights' gradients", err_of(h, dwt, NULL, nk), 1e-6);
    kget(G, h, gdx, nx * 4);
    bad += report("  EP rows: scatter (dx +=)", err_of(h, dx, dx0, nx), 1e-6);
    kdrop(G, gxs, ns * 4), kdrop(G, gy, nx * 4), kdrop(G, gdy, nx * 4), kdrop(G, gys, ns * 4);
    kdrop(G, gdys, ns * 4), kdrop(G, gdwt, nk * 4), kdrop(G, gdxs, ns * 4), kdrop(G, gdx, nx * 4);
    free(ys), free(dy), free(dxs), free(dx0), free(xs), free(y), free(dys), free(dwt), free(dx), free(h);
    return bad;
}

/* Mixture of experts: routing (its arrays: the experts and the sort exactly, the probabilities and weights to the
 * bound), the experts' forward and backward and the routing's backward (with a load-balancing term) through the
 * CUDA table against the CPU's fp32, on random logits, inputs and weights. ref_mode 1: a reference choice of the
 * experts (t + j) mod E for token t, unlike most tokens' own: the count of tokens that differ must match the
 * CPU's (and not be 0); ref_mode 2: the reference replayed, so the routes must match with it.
 * G's GEMMs are fp32 (bound 1e-5: sums in another order) or BF16 (bound 2e-2: operands rounded to 8 bits). */
static int t_moe(struct kctx *G, struct kctx *C, int N, int E, int k, int D, int F, bool norm, int ref_mode,
                 double bound)
{
    const size_t nl = (size_t)N * E, nx = (size_t)N * D, nw = (size_t)E * F * D, nk = (size_t)N * k;
    float *lg = rand_vec(nl, -2, 2), *x = rand_vec(nx, -1, 1), *Wg = rand_vec(nw, -0.5f, 0.5f);
    float *Wu = rand_vec(nw, -0.5f, 0.5f), *Wd = rand_vec(nw, -0.5f, 0.5f), *dy = rand_vec(nx, -1, 1);
    float *dp = rand_vec((size_t)E, -1, 1), *zx = calloc(nx, 4), *zw = calloc(nw, 4);
    float *y = xmalloc(nx * 4), *dx = calloc(nx, 4), *dWg = calloc(nw, 4), *dWu = calloc(nw, 4), *dWd = calloc(nw, 4);
    float *dwt = xmalloc(nk * 4), *dl = xmalloc(nl * 4), *h = xmalloc((nw > nx ? nw : nx) * 4 + nl * 4 + nk * 4);
    int32_t *ref = NULL;
    if (ref_mode) { /* experts (t + j) mod E: a valid set of k distinct experts, often not the router's */
        ref = xmalloc(nk * sizeof *ref);
        for (int t = 0; t < N; t++)
            for (int j = 0; j < k; j++)
                ref[(size_t)t * k + j] = (t + j) % E;
    }
    struct kmoe rc = {.N = N, .E = E, .k = k, .D = D, .F = F, .norm_topk = norm}, rg;
    rc.ref = ref, rc.replay = ref_mode == 2;
    rg = rc;
    struct karena plan, ac, ag;
    karena_init_counter(&plan);
    kmoe_take(&plan, &rc, true);
    karena_init(&ac, C, KMEM_ACTS, "moe test (CPU)");
    karena_reserve(&ac, plan.used, 0);
    kmoe_take(&ac, &rc, true);
    karena_init(&ag, G, KMEM_ACTS, "moe test (GPU)");
    karena_reserve(&ag, plan.used, 0);
    kmoe_take(&ag, &rg, true);
    k_moe_route(C, &rc, lg);
    k_moe_experts_forward(C, y, x, Wg, Wu, Wd, &rc);
    k_moe_experts_backward(C, dx, dWg, dWu, dWd, dwt, dy, Wg, Wu, Wd, &rc);
    k_moe_route_backward(C, dl, &rc, dwt, dp);
    float *gl = kputf(G, lg, nl), *gx = kputf(G, x, nx), *gWg = kputf(G, Wg, nw), *gWu = kputf(G, Wu, nw);
    float *gWd = kputf(G, Wd, nw), *gdy = kputf(G, dy, nx), *gy = kputf(G, zx, nx), *gdx = kputf(G, zx, nx);
    float *gdWg = kputf(G, zw, nw), *gdWu = kputf(G, zw, nw), *gdWd = kputf(G, zw, nw);
    float *gdwt = kputf(G, dwt, nk), *gdl = kputf(G, dl, nl);
    k_moe_route(G, &rg, gl);
    k_moe_experts_forward(G, gy, gx, gWg, gWu, gWd, &rg);
    k_moe_experts_backward(G, gdx, gdWg, gdWu, gdWd, gdwt, gdy, gWg, gWu, gWd, &rg);
    k_moe_route_backward(G, gdl, &rg, gdwt, dp);
    char name[128];
    snprintf(name, sizeof name, "moe %s N=%d E=%d k=%d D=%d F=%d%s%s: probs", G->matmul == KMM_BF16 ? "BF16" : "fp32",
             N, E, k, D, F, norm ? " renormalised" : "",
             ref_mode == 2 ? " replayed"
             : ref_mode    ? " against a reference"
                           : "");
    /* the routing: exact experts and sort (a flip would be a near-tie within an ulp of expf: none in these draws) */
    kget(G, h, rg.probs, nl * 4);
    int bad = report(name, err_of(h, rc.probs, NULL, nl), 1e-6);
    kget(G, h, rg.pmean, (size_t)E * 4);
    bad += report("  mean probs", err_of(h, rc.pmean, NULL, (size_t)E), 1e-5);
    kget(G, h, rg.wt, nk * 4);
    bad += report("  routing weights", err_of(h, rc.wt, NULL, nk), 1e-6);
    bad += same_ints(G, "  experts (idx)", rg.idx, rc.idx, nk);
    bad += same_ints(G, "  offsets", rg.offs, rc.offs, (size_t)E + 1);
    bad += same_ints(G, "  slot order", rg.order, rc.order, nk);
    bad += same_ints(G, "  slot rows (pos)", rg.pos, rc.pos, nk);
    if (ref_mode) {
        const int b = rg.n_differ != rc.n_differ || rg.n_compared != rc.n_compared || rc.n_differ == 0;
        printf("  %-44s %d of %d (CPU %d of %d)%s\n", "  tokens routed unlike the reference", rg.n_differ,
               rg.n_compared, rc.n_differ, rc.n_compared, b ? "  FAIL" : "");
        bad += b;
    }
    kget(G, h, gy, nx * 4);
    bad += report("  y", err_of(h, y, NULL, nx), bound);
    kget(G, h, gdx, nx * 4);
    bad += report("  dx", err_of(h, dx, NULL, nx), bound);
    kget(G, h, gdWg, nw * 4);
    bad += report("  dW gate", err_of(h, dWg, NULL, nw), bound);
    kget(G, h, gdWu, nw * 4);
    bad += report("  dW up", err_of(h, dWu, NULL, nw), bound);
    kget(G, h, gdWd, nw * 4);
    bad += report("  dW down", err_of(h, dWd, NULL, nw), bound);
    kget(G, h, gdwt, nk * 4);
    bad += report("  d routing weights", err_of(h, dwt, NULL, nk), bound);
    kget(G, h, gdl, nl * 4);
    bad += report("  d router logits", err_of(h, dl, NULL, nl), bound);
    /* the direct per-token reference (no permutation, no grouping): the GPU's and the CPU's y, dx, dwt and weight
     * gradients against it (fp32: 1e-5 of the scale, sums of D and F terms in float against double) */
    {
        float *ry = xmalloc(nx * 4), *rdx = xmalloc(nx * 4), *rdwt = xmalloc(nk * 4);
        float *rdWg = calloc(nw, 4), *rdWu = calloc(nw, 4), *rdWd = calloc(nw, 4);
        moe_direct(x, Wg, Wu, Wd, rc.idx, rc.wt, dy, N, k, D, F, ry, rdx, rdWg, rdWu, rdWd, rdwt);
        const double db = bound > 1e-5 ? bound : 1e-5;
        bad += report("  y: CPU against the per-token reference", err_of(y, ry, NULL, nx), db);
        bad += report("  dx: CPU against the per-token reference", err_of(dx, rdx, NULL, nx), db);
        kget(G, h, gy, nx * 4);
        bad += report("  y against the per-token reference", err_of(h, ry, NULL, nx), db);
        kget(G, h, gdx, nx * 4);
        bad += report("  dx against the per-token reference", err_of(h, rdx, NULL, nx), db);
        kget(G, h, gdwt, nk * 4);
        bad += report("  d routing weights against the reference", err_of(h, rdwt, NULL, nk), db);
        kget(G, h, gdWg, nw * 4);
        bad += report("  dW gate against the per-token reference", err_of(h, rdWg, NULL, nw), db);
        kget(G, h, gdWu, nw * 4);
        bad += report("  dW up against the per-token reference", err_of(h, rdWu, NULL, nw), db);
        kget(G, h, gdWd, nw * 4);
        bad += report("  dW down against the per-token reference", err_of(h, rdWd, NULL, nw), db);
        free(ry), free(rdx), free(rdwt), free(rdWg), free(rdWu), free(rdWd);
    }
    bad += t_moe_moves(G, C, &rc, &rg, x, gx);
    kdrop(G, gl, nl * 4), kdrop(G, gx, nx * 4), kdrop(G, gWg, nw * 4), kdrop(G, gWu, nw * 4), kdrop(G, gWd, nw * 4);
    kdrop(G, gdy, nx * 4), kdrop(G, gy, nx * 4), kdrop(G, gdx, nx * 4), kdrop(G, gdWg, nw * 4);
    kdrop(G, gdWu, nw * 4), kdrop(G, gdWd, nw * 4), kdrop(G, gdwt, nk * 4), kdrop(G, gdl, nl * 4);
    karena_release(&ac);
    karena_release(&ag);
    free(lg), free(x), free(Wg), free(Wu), free(Wd), free(dy), free(dp), free(zx), free(zw), free(y), free(dx);
    free(dWg), free(dWu), free(dWd), free(dwt), free(dl), free(h), free(ref);
    return bad;
}

/* dst = src with -inf entries as 0, and how many entries are -inf in exactly one of a and b. */
static size_t finite_part(float *fa, float *fb, const float *a, const float *b, size_t n)
{
    size_t odd = 0;
    for (size_t i = 0; i < n; i++) {
        const bool ia = isinf(a[i]) && a[i] < 0, ib = isinf(b[i]) && b[i] < 0;
        odd += ia != ib;
        fa[i] = ia ? 0.0f : a[i];
        fb[i] = ib ? 0.0f : b[i];
    }
    return odd;
}

/* Ring attention's blocks (context parallelism) through the CUDA table against the CPU's, on random inputs: nq
 * queries against nk keys of nseq sequences (random ids, some queries of a sequence no key holds: -inf), the
 * merge into a random running output, dout . out, and the block's backward accumulated onto random gradients with
 * the merged lse. fp32 throughout (bound 1e-5: sums in another order). */
static int t_block(struct kctx *G, struct kctx *C, int nq, int nk, int Hq, int Hkv, int hd, int nseq)
{
    const size_t qn = (size_t)nq * Hq * hd, kn = (size_t)nk * Hkv * hd, ln = (size_t)nq * Hq;
    int32_t *qs = xmalloc((size_t)nq * 4), *ks = xmalloc((size_t)nk * 4);
    for (int i = 0; i < nq; i++)
        qs[i] = (int32_t)(urand(0, (float)nseq + 1) * 0.999f); /* id nseq: no key of it */
    for (int t = 0; t < nk; t++)
        ks[t] = (int32_t)(urand(0, (float)nseq) * 0.999f);
    float *q = rand_vec(qn, -1, 1), *k = rand_vec(kn, -1, 1), *v = rand_vec(kn, -1, 1), *dout = rand_vec(qn, -1, 1);
    float *out = rand_vec(qn, -1, 1), *lse = rand_vec(ln, 0, 2), *dq = rand_vec(qn, -0.1f, 0.1f);
    float *dk = rand_vec(kn, -0.1f, 0.1f), *dv = rand_vec(kn, -0.1f, 0.1f);
    float *po = xmalloc(qn * 4), *plse = xmalloc(ln * 4), *drow = xmalloc(ln * 4);
    float *gq = kputf(G, q, qn), *gk = kputf(G, k, kn), *gv = kputf(G, v, kn), *gdout = kputf(G, dout, qn);
    float *gout = kputf(G, out, qn), *glse = kputf(G, lse, ln), *gdq = kputf(G, dq, qn), *gdk = kputf(G, dk, kn);
    float *gdv = kputf(G, dv, kn), *gpo = kputf(G, po, qn), *gplse = kputf(G, plse, ln), *gdrow = kputf(G, drow, ln);
    int32_t *gqs = kput(G, qs, (size_t)nq * 4), *gks = kput(G, ks, (size_t)nk * 4);
    float *dq0 = copy_vec(dq, qn), *dk0 = copy_vec(dk, kn), *dv0 = copy_vec(dv, kn);
    k_attention_block_forward(C, po, plse, q, k, v, qs, ks, nq, nk, Hq, Hkv, hd);
    k_attention_merge(C, out, lse, po, plse, nq, Hq, hd);
    k_attention_drow(C, drow, dout, out, nq, Hq, hd);
    k_attention_block_backward(C, dq, dk, dv, dout, lse, drow, q, k, v, qs, ks, nq, nk, Hq, Hkv, hd);
    k_attention_block_forward(G, gpo, gplse, gq, gk, gv, gqs, gks, nq, nk, Hq, Hkv, hd);
    k_attention_merge(G, gout, glse, gpo, gplse, nq, Hq, hd);
    k_attention_drow(G, gdrow, gdout, gout, nq, Hq, hd);
    k_attention_block_backward(G, gdq, gdk, gdv, gdout, glse, gdrow, gq, gk, gv, gqs, gks, nq, nk, Hq, Hkv, hd);
    float *h = xmalloc((qn > kn ? qn : kn) * 4), *fa = xmalloc(ln * 4), *fb = xmalloc(ln * 4);
    char name[128];
    snprintf(name, sizeof name, "ring block nq=%d nk=%d Hq=%d Hkv=%d hd=%d seqs=%d: po", nq, nk, Hq, Hkv, hd, nseq);
    kget(G, h, gpo, qn * 4);
    int bad = report(name, err_of(h, po, NULL, qn), 1e-5);
    kget(G, h, gplse, ln * 4);
    size_t odd = finite_part(fa, fb, h, plse, ln);
    bad += report("  plse (finite entries)", err_of(fa, fb, NULL, ln), 1e-5);
    printf("  %-44s %zu differ%s\n", "  plse -inf (queries that see no key)", odd, odd ? "  FAIL" : "");
    bad += odd != 0;
    kget(G, h, gout, qn * 4);
    bad += report("  merged out", err_of(h, out, NULL, qn), 1e-5);
    kget(G, h, glse, ln * 4);
    bad += report("  merged lse", err_of(h, lse, NULL, ln), 1e-5);
    kget(G, h, gdrow, ln * 4);
    bad += report("  dout . out", err_of(h, drow, NULL, ln), 1e-5);
    kget(G, h, gdq, qn * 4);
    bad += report("  dq", err_of(h, dq, dq0, qn), 1e-5);
    kget(G, h, gdk, kn * 4);
    bad += report("  dk", err_of(h, dk, dk0, kn), 1e-5);
    kget(G, h, gdv, kn * 4);
    bad += report("  dv", err_of(h, dv, dv0, kn), 1e-5);
    kdrop(G, gq, qn * 4), kdrop(G, gk, kn * 4), kdrop(G, gv, kn * 4), kdrop(G, gdout, qn * 4), kdrop(G, gout, qn * 4);
    kdrop(G, glse, ln * 4), kdrop(G, gdq, qn * 4), kdrop(G, gdk, kn * 4), kdrop(G, gdv, kn * 4);
    kdrop(G, gpo, qn * 4), kdrop(G, gplse, ln * 4), kdrop(G, gdrow, ln * 4), kdrop(G, gqs, (size_t)nq * 4);
    kdrop(G, gks, (size_t)nk * 4);
    free(qs), free(ks), free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(po), free(plse), free(drow), free(dq0), free(dk0), free(dv0), free(h), free(fa), free(fb);
    return bad;
}

static int t_linear(struct kctx *G, struct kctx *C, int N, int Din, int Dout, double bound)
{
    size_t nx = (size_t)N * Din, ny = (size_t)N * Dout, nw = (size_t)Dout * Din;
    float *x = rand_vec(nx, -1, 1), *W = rand_vec(nw, -0.5f, 0.5f), *b = rand_vec(Dout, -1, 1);
    float *dy = rand_vec(ny, -1, 1), *dx0 = rand_vec(nx, -1, 1), *dW0 = rand_vec(nw, -1, 1);
    float *db0 = rand_vec(Dout, -1, 1);
    float *y = xmalloc(ny * 4), *yn = xmalloc(ny * 4), *dx = copy_vec(dx0, nx), *dW = copy_vec(dW0, nw);
    float *db = copy_vec(db0, Dout), *dW2 = copy_vec(dW0, nw);
    k_linear_forward(C, y, x, W, b, N, Din, Dout);
    k_linear_forward(C, yn, x, W, NULL, N, Din, Dout);
    k_linear_backward(C, dx, dW, db, dy, x, W, N, Din, Dout);
    k_linear_backward(C, NULL, dW2, NULL, dy, x, W, N, Din, Dout);
    float *gx = kputf(G, x, nx), *gW = kputf(G, W, nw), *gb = kputf(G, b, Dout), *gdy = kputf(G, dy, ny);
    float *gy = kputf(G, y, ny), *h = xmalloc((nx > nw ? (nx > ny ? nx : ny) : (nw > ny ? nw : ny)) * 4);
    char name[96];
    snprintf(name, sizeof name, "linear %s N=%d Din=%d Dout=%d: y", G->matmul == KMM_BF16 ? "BF16" : "fp32", N, Din,
             Dout);
    k_linear_forward(G, gy, gx, gW, gb, N, Din, Dout);
    kget(G, h, gy, ny * 4);
    int bad = report(name, err_of(h, y, NULL, ny), bound);
    k_linear_forward(G, gy, gx, gW, NULL, N, Din, Dout);
    kget(G, h, gy, ny * 4);
    bad += report("  y without bias", err_of(h, yn, NULL, ny), bound);
    float *res[2][3];
    for (int run = 0; run < 2; run++) {
        float *gdx = kputf(G, dx0, nx), *gdW = kputf(G, dW0, nw), *gdb = kputf(G, db0, Dout);
        k_linear_backward(G, gdx, gdW, gdb, gdy, gx, gW, N, Din, Dout);
        res[run][0] = xmalloc(nx * 4), res[run][1] = xmalloc(nw * 4), res[run][2] = xmalloc(Dout * 4);
        kget(G, res[run][0], gdx, nx * 4);
        kget(G, res[run][1], gdW, nw * 4);
        kget(G, res[run][2], gdb, Dout * 4);
        kdrop(G, gdx, nx * 4), kdrop(G, gdW, nw * 4), kdrop(G, gdb, Dout * 4);
    }
    bad += report("  dx", err_of(res[0][0], dx, dx0, nx), bound);
    bad += report("  dW", err_of(res[0][1], dW, dW0, nw), bound);
    bad += report("  db", err_of(res[0][2], db, db0, Dout), 1e-5); /* column sums: fp32 in both precisions */
    bad += report_bits("  backward", count_diff(res[0][0], res[1][0], nx) + count_diff(res[0][1], res[1][1], nw) +
                                         count_diff(res[0][2], res[1][2], Dout));
    float *gdW = kputf(G, dW0, nw);
    k_linear_backward(G, NULL, gdW, NULL, gdy, gx, gW, N, Din, Dout);
    kget(G, h, gdW, nw * 4);
    bad += report("  dW alone (dx, db NULL)", err_of(h, dW2, dW0, nw), bound);
    kdrop(G, gdW, nw * 4);
    kdrop(G, gx, nx * 4), kdrop(G, gW, nw * 4), kdrop(G, gb, Dout * 4), kdrop(G, gdy, ny * 4), kdrop(G, gy, ny * 4);
    for (int run = 0; run < 2; run++)
        free(res[run][0]), free(res[run][1]), free(res[run][2]);
    free(x), free(W), free(b), free(dy), free(dx0), free(dW0), free(db0), free(y), free(yn), free(dx), free(dW);
    free(db), free(dW2), free(h);
    return bad;
}

static int t_rope(struct kctx *G, struct kctx *C, int N, int H, int hd)
{
    size_t n = (size_t)N * H * hd;
    int32_t *pos = xmalloc(N * sizeof *pos);
    for (int i = 0; i < N; i++)
        pos[i] = (int32_t)urand(0.0f, 8192.0f);
    double *freq = xmalloc((size_t)(hd / 2) * sizeof *freq);
    rope_default_freqs(freq, hd, 1e6f);
    float *x = rand_vec(n, -1, 1), *fw = copy_vec(x, n), *bw = copy_vec(x, n), *got = xmalloc(n * 4);
    k_rope_forward(C, fw, pos, N, H, hd, freq);
    k_rope_backward(C, bw, pos, N, H, hd, freq);
    int32_t *gpos = kput(G, pos, N * sizeof *pos);
    double *gfreq = kput(G, freq, (size_t)(hd / 2) * sizeof *freq); /* a device array for the CUDA back-end */
    float *gx = kputf(G, x, n);
    k_rope_forward(G, gx, gpos, N, H, hd, gfreq);
    kget(G, got, gx, n * 4);
    char name[64];
    snprintf(name, sizeof name, "rope N=%d H=%d hd=%d: forward", N, H, hd);
    int bad = report(name, err_of(got, fw, NULL, n), 1e-5);
    k_to_device(G, gx, x, n * 4);
    k_rope_backward(G, gx, gpos, N, H, hd, gfreq);
    kget(G, got, gx, n * 4);
    bad += report("  backward", err_of(got, bw, NULL, n), 1e-5);
    kdrop(G, gpos, N * 4), kdrop(G, gfreq, (size_t)(hd / 2) * 8), kdrop(G, gx, n * 4);
    free(pos), free(freq), free(x), free(fw), free(bw), free(got);
    return bad;
}

static int t_attention(struct kctx *G, struct kctx *C, int B, const int *lens, int Hq, int Hkv, int hd, float qmag)
{
    int32_t *cu = xmalloc((size_t)(B + 1) * sizeof *cu);
    cu[0] = 0;
    for (int b = 0; b < B; b++)
        cu[b + 1] = cu[b] + lens[b];
    const int N = cu[B];
    size_t nq = (size_t)N * Hq * hd, nk = (size_t)N * Hkv * hd, nl = (size_t)N * Hq;
    float *q = rand_vec(nq, -qmag, qmag), *k = rand_vec(nk, -1, 1), *v = rand_vec(nk, -1, 1);
    float *dout = rand_vec(nq, -1, 1), *dq0 = rand_vec(nq, -0.1f, 0.1f), *dk0 = rand_vec(nk, -0.1f, 0.1f);
    float *dv0 = rand_vec(nk, -0.1f, 0.1f);
    float *out = xmalloc(nq * 4), *lse = xmalloc(nl * 4), *dq = copy_vec(dq0, nq), *dk = copy_vec(dk0, nk);
    float *dv = copy_vec(dv0, nk);
    k_attention_forward(C, out, lse, q, k, v, cu, NULL, B, Hq, Hkv, hd);
    k_attention_backward(C, dq, dk, dv, dout, out, lse, q, k, v, cu, NULL, B, Hq, Hkv, hd);

    int32_t *gcu = kput(G, cu, (size_t)(B + 1) * sizeof *cu);
    float *gq = kputf(G, q, nq), *gk = kputf(G, k, nk), *gv = kputf(G, v, nk), *gdo = kputf(G, dout, nq);
    float *gout = kputf(G, out, nq), *glse = kputf(G, lse, nl);
    k_zero(G, gout, nq * 4);
    k_zero(G, glse, nl * 4);
    k_attention_forward(G, gout, glse, gq, gk, gv, gcu, NULL, B, Hq, Hkv, hd);
    float *hout = xmalloc(nq * 4), *hlse = xmalloc(nl * 4);
    kget(G, hout, gout, nq * 4);
    kget(G, hlse, glse, nl * 4);
    char name[96];
    snprintf(name, sizeof name, "attention B=%d N=%d Hq=%d Hkv=%d hd=%d: out", B, N, Hq, Hkv, hd);
    int bad = report(name, err_of(hout, out, NULL, nq), 1e-5);
    bad += report("  lse", err_of(hlse, lse, NULL, nl), 1e-5);
    float *res[2][3];
    for (int run = 0; run < 2; run++) { /* from the GPU's own out and lse, as the model runs it */
        float *gdq = kputf(G, dq0, nq), *gdk = kputf(G, dk0, nk), *gdv = kputf(G, dv0, nk);
        k_attention_backward(G, gdq, gdk, gdv, gdo, gout, glse, gq, gk, gv, gcu, NULL, B, Hq, Hkv, hd);
        res[run][0] = xmalloc(nq * 4), res[run][1] = xmalloc(nk * 4), res[run][2] = xmalloc(nk * 4);
        kget(G, res[run][0], gdq, nq * 4);
        kget(G, res[run][1], gdk, nk * 4);
        kget(G, res[run][2], gdv, nk * 4);
        kdrop(G, gdq, nq * 4), kdrop(G, gdk, nk * 4), kdrop(G, gdv, nk * 4);
    }
    bad += report("  dq", err_of(res[0][0], dq, dq0, nq), 5e-5);
    bad += report("  dk", err_of(res[0][1], dk, dk0, nk), 5e-5);
    bad += report("  dv", err_of(res[0][2], dv, dv0, nk), 5e-5);
    bad += report_bits("  backward", count_diff(res[0][0], res[1][0], nq) + count_diff(res[0][1], res[1][1], nk) +
                                         count_diff(res[0][2], res[1][2], nk));
    kdrop(G, gcu, (size_t)(B + 1) * 4), kdrop(G, gq, nq * 4), kdrop(G, gk, nk * 4), kdrop(G, gv, nk * 4);
    kdrop(G, gdo, nq * 4), kdrop(G, gout, nq * 4), kdrop(G, glse, nl * 4);
    for (int run = 0; run < 2; run++)
        free(res[run][0]), free(res[run][1]), free(res[run][2]);
    free(cu), free(q), free(k), free(v), free(dout), free(dq0), free(dk0), free(dv0), free(out), free(lse), free(dq);
    free(dk), free(dv), free(hout), free(hlse);
    return bad;
}

static float *bf16_copy(const float *x, size_t n)
{
    float *y = xmalloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = test_bf16_round(x[i]);
    return y;
}

/* The bound of the BF16 attention's elements (t_attention_bf16): |got - want| <= 1.25 u mag + 2^-22 |want|, in
 * units of u mag + 2^-22 |want| / 1.25 (0 where both are 0: got must be want). Returns the largest ratio (inf on a
 * NaN), the largest |got - want| in *abs_err. */
static double bf16_ratio(const float *got, const double *want, const double *mag, size_t n, double *abs_err)
{
    const double u = 1.0 / 256;
    double r = 0;
    *abs_err = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]), tol = u * mag[i] + ldexp(fabs(want[i]), -22) / 1.25;
        if (isnan(got[i]))
            return INFINITY;
        *abs_err = fmax(*abs_err, d);
        if (d > 0)
            r = fmax(r, tol > 0 ? d / tol : INFINITY);
    }
    return r;
}

static int report_bf16(const char *what, double ratio, double abs_err)
{
    int bad = !(ratio <= 1.25);
    printf("  %-44s %.2f of u sum|terms| (bound 1.25), max abs error %.1e%s\n", what, ratio, abs_err,
           bad ? "  FAIL" : "");
    return bad;
}

/* BF16 attention on tensor cores (issue 43 item 5): in a BF16 context attention_forward and attention_backward run
 * their products as batched cuBLAS GEMMs with BF16 inputs and fp32 sums. Against a float64 reference on the host from
 * the same BF16-rounded q, k, v and, for the products, dout (D = dout . out stays fp32, as the op's): the sequences
 * at rows first.. (rows before them belong to none and stay untouched), the backward given the reference's out and
 * lse so that each op answers for its own roundings.
 *
 * The bound. The path rounds, besides its inputs, one intermediate per product chain: P (before O = P V and
 * dV = P^T dO) and dS (before dQ = dS K and dK = dS^T Q). Each output element is a sum of terms t x with t (a P or a
 * dS entry) off by a relative u = 2^-8 at most (BF16's unit roundoff: 8 significant bits, rounded to nearest), so its
 * error is at most u sum |t x|, which the reference sums as mag: sum_j P_ij |v_j| for out, sum_i P_ij |dout_i| for
 * dv, scale sum P_ij (|dP_ij| + |D_i|) |k_j| or |q_i| for dq and dk (dS bounded through its factors, so that
 * cancellation in dP - D leaves the scale above fp32's errors). The fp32 steps around it (score sums, exp, the
 * normaliser, the gradients' accumulation into their random initial values) add a few 2^-24 of the same scales:
 * 1.25 u mag + 2^-22 |want| holds them. A wrong key, head or mask gives errors of the order of mag, far past it.
 * lse goes through no BF16 rounding of its own: within 1e-5 of its scale.
 *
 * That the products did run on tensor cores, and did not fall back to the fp32 kernels (whose results pass the bound
 * too): the context counts its batched GEMMs (kgemm_stats.attn_products), 2 per tile of a sequence's query rows
 * forward and 5 backward. The backward runs twice and must give the same bits. */
static int t_attention_bf16(struct kctx *G, int B, const int *lens, int first, int Hq, int Hkv, int hd, float qmag)
{
    int32_t *cu = xmalloc((size_t)(B + 1) * sizeof *cu);
    cu[0] = first;
    long long tiles = 0;
    for (int b = 0; b < B; b++) {
        cu[b + 1] = cu[b] + lens[b];
        if (lens[b] > 0) {
            const int rows = attention_tc_tile_rows(lens[b], Hq);
            tiles += (lens[b] + rows - 1) / rows;
        }
    }
    const int N = cu[B], g = Hq / Hkv;
    const size_t nq = (size_t)N * Hq * hd, nk = (size_t)N * Hkv * hd, nl = (size_t)N * Hq;
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *q = rand_vec(nq, -qmag, qmag), *k = rand_vec(nk, -1, 1), *v = rand_vec(nk, -1, 1);
    float *dout = rand_vec(nq, -1, 1), *dq0 = rand_vec(nq, -0.1f, 0.1f), *dk0 = rand_vec(nk, -0.1f, 0.1f);
    float *dv0 = rand_vec(nk, -0.1f, 0.1f);
    float *qr = bf16_copy(q, nq), *kr = bf16_copy(k, nk), *vr = bf16_copy(v, nk), *dor = bf16_copy(dout, nq);
    double *o = xcalloc(nq, sizeof *o), *mo = xcalloc(nq, sizeof *mo), *lse = xcalloc(nl, sizeof *lse);
    double *s = xmalloc((size_t)N * sizeof *s);
    /* forward: s_ij = scale q_i . k_j (j <= i), lse_i, out_i = sum_j P_ij v_j */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < lens[b]; i++) {
                const size_t row = (size_t)cu[b] + i, kh = (size_t)(h / g);
                const float *qi = qr + (row * Hq + h) * hd;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *kj = kr + (((size_t)cu[b] + j) * Hkv + kh) * hd;
                    double dot = 0;
                    for (int d = 0; d < hd; d++)
                        dot += (double)qi[d] * kj[d];
                    s[j] = scale * dot;
                    m = fmax(m, s[j]);
                }
                for (int j = 0; j <= i; j++)
                    sum += exp(s[j] - m);
                const double l = m + log(sum);
                lse[row * Hq + h] = l;
                for (int j = 0; j <= i; j++) {
                    const double p = exp(s[j] - l);
                    const float *vj = vr + (((size_t)cu[b] + j) * Hkv + kh) * hd;
                    for (int d = 0; d < hd; d++) {
                        o[(row * Hq + h) * hd + d] += p * vj[d];
                        mo[(row * Hq + h) * hd + d] += p * fabs(vj[d]);
                    }
                }
            }
    float *of = xmalloc(nq * sizeof *of), *lsef = xmalloc(nl * sizeof *lsef);
    for (size_t i = 0; i < nq; i++)
        of[i] = (float)o[i];
    for (size_t i = 0; i < nl; i++)
        lsef[i] = (float)lse[i];
    /* backward from out = of and lse = lsef: P_ij = exp(s_ij - lse_i), dP_ij = dout_i . v_j (BF16 dout),
     * D_i = dout_i . out_i (fp32 dout), dS = P (dP - D) */
    double *wq = xmalloc(nq * sizeof *wq), *wk = xmalloc(nk * sizeof *wk), *wv = xmalloc(nk * sizeof *wv);
    double *mq = xcalloc(nq, sizeof *mq), *mk = xcalloc(nk, sizeof *mk), *mv = xcalloc(nk, sizeof *mv);
    for (size_t i = 0; i < nq; i++)
        wq[i] = dq0[i];
    for (size_t i = 0; i < nk; i++)
        wk[i] = dk0[i], wv[i] = dv0[i];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < lens[b]; i++) {
                const size_t row = (size_t)cu[b] + i, kh = (size_t)(h / g), qo = (row * Hq + h) * hd;
                double D = 0;
                for (int d = 0; d < hd; d++)
                    D += (double)dout[qo + d] * of[qo + d];
                for (int j = 0; j <= i; j++) {
                    const size_t ko = (((size_t)cu[b] + j) * Hkv + kh) * hd;
                    double dot = 0, dp = 0;
                    for (int d = 0; d < hd; d++) {
                        dot += (double)qr[qo + d] * kr[ko + d];
                        dp += (double)dor[qo + d] * vr[ko + d];
                    }
                    const double p = exp(scale * dot - lsef[row * Hq + h]), ds = p * (dp - D);
                    const double a = p * (fabs(dp) + fabs(D));
                    for (int d = 0; d < hd; d++) {
                        wq[qo + d] += scale * ds * kr[ko + d];
                        mq[qo + d] += scale * a * fabs(kr[ko + d]);
                        wk[ko + d] += scale * ds * qr[qo + d];
                        mk[ko + d] += scale * a * fabs(qr[qo + d]);
                        wv[ko + d] += p * dor[qo + d];
                        mv[ko + d] += p * fabs(dor[qo + d]);
                    }
                }
            }

    int32_t *gcu = kput(G, cu, (size_t)(B + 1) * sizeof *cu);
    float *gq = kputf(G, q, nq), *gk = kputf(G, k, nk), *gv = kputf(G, v, nk), *gdo = kputf(G, dout, nq);
    float *gout = kputf(G, of, nq), *glse = kputf(G, lsef, nl);
    k_zero(G, gout, nq * 4);
    k_zero(G, glse, nl * 4);
    const unsigned long long p0 = G->gemm.attn_products;
    k_attention_forward(G, gout, glse, gq, gk, gv, gcu, NULL, B, Hq, Hkv, hd);
    const unsigned long long p1 = G->gemm.attn_products;
    float *hout = xmalloc(nq * 4), *hlse = xmalloc(nl * 4);
    kget(G, hout, gout, nq * 4);
    kget(G, hlse, glse, nl * 4);
    char name[96];
    double abs_err, ratio = bf16_ratio(hout, o, mo, nq, &abs_err);
    snprintf(name, sizeof name, "attention BF16 B=%d N=%d Hq=%d Hkv=%d hd=%d: out", B, N, Hq, Hkv, hd);
    int bad = report_bf16(name, ratio, abs_err);
    bad += report("  lse", err_of(hlse, lsef, NULL, nl), 1e-5);
    k_to_device(G, gout, of, nq * 4);
    k_to_device(G, glse, lsef, nl * 4);
    float *res[2][3];
    unsigned long long pb[2];
    for (int run = 0; run < 2; run++) {
        float *gdq = kputf(G, dq0, nq), *gdk = kputf(G, dk0, nk), *gdv = kputf(G, dv0, nk);
        const unsigned long long b0 = G->gemm.attn_products;
        k_attention_backward(G, gdq, gdk, gdv, gdo, gout, glse, gq, gk, gv, gcu, NULL, B, Hq, Hkv, hd);
        pb[run] = G->gemm.attn_products - b0;
        res[run][0] = copy_vec(dq0, nq), res[run][1] = copy_vec(dk0, nk), res[run][2] = copy_vec(dv0, nk);
        kget(G, res[run][0], gdq, nq * 4);
        kget(G, res[run][1], gdk, nk * 4);
        kget(G, res[run][2], gdv, nk * 4);
        kdrop(G, gdq, nq * 4), kdrop(G, gdk, nk * 4), kdrop(G, gdv, nk * 4);
    }
    ratio = bf16_ratio(res[0][0], wq, mq, nq, &abs_err);
    bad += report_bf16("  dq", ratio, abs_err);
    ratio = bf16_ratio(res[0][1], wk, mk, nk, &abs_err);
    bad += report_bf16("  dk", ratio, abs_err);
    ratio = bf16_ratio(res[0][2], wv, mv, nk, &abs_err);
    bad += report_bf16("  dv", ratio, abs_err);
    bad += report_bits("  backward", count_diff(res[0][0], res[1][0], nq) + count_diff(res[0][1], res[1][1], nk) +
                                         count_diff(res[0][2], res[1][2], nk));
    const bool on_tc = tiles > 0 && p1 - p0 == 2ull * tiles && pb[0] == 5ull * tiles && pb[1] == pb[0];
    printf("  %-44s %llu forward, %llu backward (want %lld, %lld)%s\n", "  batched GEMMs", p1 - p0, pb[0], 2 * tiles,
           5 * tiles, on_tc ? "" : "  FAIL");
    bad += !on_tc;
    kdrop(G, gcu, (size_t)(B + 1) * 4), kdrop(G, gq, nq * 4), kdrop(G, gk, nk * 4), kdrop(G, gv, nk * 4);
    kdrop(G, gdo, nq * 4), kdrop(G, gout, nq * 4), kdrop(G, glse, nl * 4);
    for (int run = 0; run < 2; run++)
        free(res[run][0]), free(res[run][1]), free(res[run][2]);
    free(cu), free(q), free(k), free(v), free(dout), free(dq0), free(dk0), free(dv0), free(qr), free(kr), free(vr);
    free(dor), free(o), free(mo), free(lse), free(s), free(of), free(lsef), free(wq), free(wk), free(wv), free(mq);
    free(mk), free(mv), free(hout), free(hlse);
    return bad;
}

static int t_cached(struct kctx *G, struct kctx *C, int Tq, int Tk, int Hq, int Hkv, int hd)
{
    size_t nq = (size_t)Tq * Hq * hd, nk = (size_t)Tk * Hkv * hd;
    float *q = rand_vec(nq, -2, 2), *k = rand_vec(nk, -1, 1), *v = rand_vec(nk, -1, 1);
    float *out = xmalloc(nq * 4), *got = xmalloc(nq * 4), *got2 = xmalloc(nq * 4);
    k_attention_cached(C, out, q, k, v, Tq, Tk, Hq, Hkv, hd);
    float *gq = kputf(G, q, nq), *gk = kputf(G, k, nk), *gv = kputf(G, v, nk), *go = kputf(G, out, nq);
    k_zero(G, go, nq * 4);
    k_attention_cached(G, go, gq, gk, gv, Tq, Tk, Hq, Hkv, hd);
    kget(G, got, go, nq * 4);
    k_attention_cached(G, go, gq, gk, gv, Tq, Tk, Hq, Hkv, hd);
    kget(G, got2, go, nq * 4);
    char name[96];
    snprintf(name, sizeof name, "attention_cached Tq=%d Tk=%d Hq=%d Hkv=%d hd=%d", Tq, Tk, Hq, Hkv, hd);
    int bad = report(name, err_of(got, out, NULL, nq), 1e-5);
    bad += report_bits("  out", count_diff(got, got2, nq));
    kdrop(G, gq, nq * 4), kdrop(G, gk, nk * 4), kdrop(G, gv, nk * 4), kdrop(G, go, nq * 4);
    free(q), free(k), free(v), free(out), free(got), free(got2);
    return bad;
}

/* attention_decode_batched: B sequences with cached lengths lens[b] (capacity cap each), one new token each. Against
 * the CPU: each sequence's new K and V rows appended by hand, then attention_cached over len + 1 keys; and the GPU's
 * caches after the call hold the new rows at their positions, the other rows untouched. */
static int t_decode_batched(struct kctx *G, struct kctx *C, int B, const int *lens, int cap, int Hq, int Hkv, int hd)
{
    const size_t QD = (size_t)Hq * hd, KD = (size_t)Hkv * hd, nc = (size_t)cap * KD;
    float *q = rand_vec((size_t)B * QD, -2, 2), *k = rand_vec((size_t)B * KD, -1, 1),
          *v = rand_vec((size_t)B * KD, -1, 1);
    float *want = xmalloc((size_t)B * QD * 4), *got = xmalloc((size_t)B * QD * 4), *h = xmalloc(nc * 4);
    float *hk[8], *hv[8], *gk[8], *gv[8];
    void *tk[8], *tv[8]; /* the tables of cache pointers */
    int32_t len[8];
    for (int b = 0; b < B; b++) {
        hk[b] = rand_vec(nc, -1, 1), hv[b] = rand_vec(nc, -1, 1);
        gk[b] = kputf(G, hk[b], nc), gv[b] = kputf(G, hv[b], nc);
        memcpy(hk[b] + (size_t)lens[b] * KD, k + (size_t)b * KD, KD * 4); /* the CPU's append, by hand */
        memcpy(hv[b] + (size_t)lens[b] * KD, v + (size_t)b * KD, KD * 4);
        k_attention_cached(C, want + (size_t)b * QD, q + (size_t)b * QD, hk[b], hv[b], 1, lens[b] + 1, Hq, Hkv, hd);
        len[b] = lens[b];
        tk[b] = gk[b], tv[b] = gv[b];
    }
    void **tab = kput(G, tk, (size_t)B * sizeof(void *)), **tabv = kput(G, tv, (size_t)B * sizeof(void *));
    int32_t *glen = kput(G, len, (size_t)B * sizeof(int32_t));
    float *gq = kputf(G, q, (size_t)B * QD), *gkn = kputf(G, k, (size_t)B * KD), *gvn = kputf(G, v, (size_t)B * KD);
    float *go = kputf(G, want, (size_t)B * QD);
    k_attention_decode_batched(G, go, gq, gkn, gvn, tab, tabv, glen, B, Hq, Hkv, hd);
    kget(G, got, go, (size_t)B * QD * 4);
    char name[96];
    snprintf(name, sizeof name, "attention_decode_batched B=%d Hq=%d Hkv=%d hd=%d", B, Hq, Hkv, hd);
    int bad = report(name, err_of(got, want, NULL, (size_t)B * QD), 1e-5);
    size_t differ = 0; /* the caches: the new rows appended, nothing else written */
    for (int b = 0; b < B; b++) {
        kget(G, h, gk[b], nc * 4);
        differ += count_diff(h, hk[b], nc);
        kget(G, h, gv[b], nc * 4);
        differ += count_diff(h, hv[b], nc);
        kdrop(G, gk[b], nc * 4), kdrop(G, gv[b], nc * 4);
        free(hk[b]), free(hv[b]);
    }
    bad += report_equal("  the caches after the append", differ);
    kdrop(G, tab, (size_t)B * sizeof(void *)), kdrop(G, tabv, (size_t)B * sizeof(void *));
    kdrop(G, glen, (size_t)B * 4), kdrop(G, gq, (size_t)B * QD * 4), kdrop(G, gkn, (size_t)B * KD * 4);
    kdrop(G, gvn, (size_t)B * KD * 4), kdrop(G, go, (size_t)B * QD * 4);
    free(q), free(k), free(v), free(want), free(got), free(h);
    return bad;
}

/* ---- the KV cache in the context's precision (issue 43 item 4): BF16 in a BF16 context, fp32 in an fp32 one ---- */

/* What a cache of K holds for x: x, or with a BF16 cache the nearest BF16 value of each. */
static float *kv_expect(const struct kctx *K, const float *x, size_t n)
{
    float *r = copy_vec(x, n);
    if (K->matmul == KMM_BF16)
        for (size_t i = 0; i < n; i++)
            r[i] = test_bf16_nearest(x[i]);
    return r;
}

/* A KV cache of K of n elements holding h, stored through k_kv_store. */
static void *kv_put(struct kctx *K, const float *h, size_t n)
{
    void *c = k_alloc(K, n * k_kv_elem_bytes(K), KMEM_KV, "test KV cache");
    float *x = kputf(K, h, n);
    k_kv_store(K, c, 0, x, n);
    kdrop(K, x, n * 4);
    return c;
}

/* K's cache of n elements to the host as fp32 (a BF16 element is the upper half of its fp32 pattern). */
static void kv_get(struct kctx *K, float *h, const void *c, size_t n)
{
    const size_t eb = k_kv_elem_bytes(K);
    if (eb == sizeof(float)) {
        kget(K, h, c, n * eb);
        return;
    }
    uint16_t *b = xmalloc(n * eb);
    kget(K, b, c, n * eb);
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)b[i] << 16;
        memcpy(&h[i], &u, sizeof u);
    }
    free(b);
}

/* attention_cached's rows in double: query row i of q (Tq, Hq, hd) over the keys and values 0 .. Tk - Tq + i of
 * k, v (Tk, Hkv, hd), query head h on KV head h / (Hq / Hkv). */
static void ref_cached(double *out, const float *q, const float *k, const float *v, int Tq, int Tk, int Hq, int Hkv,
                       int hd)
{
    const int group = Hq / Hkv;
    const double scale = 1.0 / sqrt((double)hd);
    double *sc = xmalloc((size_t)Tk * sizeof *sc);
    for (int i = 0; i < Tq; i++)
        for (int h = 0; h < Hq; h++) {
            const float *qi = q + ((size_t)i * Hq + h) * hd;
            const int n = Tk - Tq + i + 1;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                const float *kj = k + ((size_t)j * Hkv + h / group) * hd;
                double d = 0;
                for (int e = 0; e < hd; e++)
                    d += (double)qi[e] * kj[e];
                sc[j] = d * scale;
                m = fmax(m, sc[j]);
            }
            for (int j = 0; j < n; j++)
                sum += exp(sc[j] - m);
            double *o = out + ((size_t)i * Hq + h) * hd;
            for (int e = 0; e < hd; e++)
                o[e] = 0;
            for (int j = 0; j < n; j++) {
                const double p = exp(sc[j] - m) / sum;
                const float *vj = v + ((size_t)j * Hkv + h / group) * hd;
                for (int e = 0; e < hd; e++)
                    o[e] += p * vj[e];
            }
        }
    free(sc);
}

/* max |got - want| over max |want|, want in double. */
static double err_of64(const float *got, const double *want, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]))
            return INFINITY;
        d = fmax(d, fabs(got[i] - want[i]));
        s = fmax(s, fabs(want[i]));
    }
    return d / fmax(s, 1e-30);
}

/* attention_cached over caches of K filled by k_kv_store: the cache holds what kv_expect says, bit for bit, and the
 * output is the double reference's from those values within 2e-5 of its scale; with a BF16 cache also farther than
 * that from the reference of the unrounded values (the cache did round). C16 (NULL: none on this host): the CPU
 * back-end's BF16 context, whose cache must hold the same values and whose output must agree within 1e-5. */
static int t_kv_cached(struct kctx *G, struct kctx *C16, int Tq, int Tk, int Hq, int Hkv, int hd)
{
    const bool bf16 = G->matmul == KMM_BF16;
    const size_t nq = (size_t)Tq * Hq * hd, nk = (size_t)Tk * Hkv * hd;
    float *q = rand_vec(nq, -2, 2), *k = rand_vec(nk, -2, 2), *v = rand_vec(nk, -1, 1);
    float *ke = kv_expect(G, k, nk), *ve = kv_expect(G, v, nk), *back = xmalloc(nk * 4), *got = xmalloc(nq * 4);
    double *want = xmalloc(nq * sizeof *want), *raw = xmalloc(nq * sizeof *raw);
    ref_cached(want, q, ke, ve, Tq, Tk, Hq, Hkv, hd);
    ref_cached(raw, q, k, v, Tq, Tk, Hq, Hkv, hd);
    void *gk = kv_put(G, k, nk), *gv = kv_put(G, v, nk);
    kv_get(G, back, gk, nk);
    size_t differ = count_diff(back, ke, nk);
    kv_get(G, back, gv, nk);
    differ += count_diff(back, ve, nk);
    float *gq = kputf(G, q, nq), *go = kputf(G, q, nq);
    k_attention_cached(G, go, gq, gk, gv, Tq, Tk, Hq, Hkv, hd);
    kget(G, got, go, nq * 4);
    char name[96];
    snprintf(name, sizeof name, "%s KV cache: attention_cached Tq=%d Tk=%d Hq=%d Hkv=%d hd=%d", bf16 ? "BF16" : "fp32",
             Tq, Tk, Hq, Hkv, hd);
    int bad = report(name, err_of64(got, want, nq), 2e-5);
    bad += report_equal(bf16 ? "  stored: each the nearest BF16 value" : "  stored: the fp32 values", differ);
    if (bf16) {
        const double e = err_of64(got, raw, nq);
        printf("  %-44s %.2e (over 2e-5: the cache rounded)%s\n", "  against the unrounded keys and values", e,
               e > 2e-5 ? "" : "  FAIL");
        bad += !(e > 2e-5);
    }
    if (C16) {
        void *ck = kv_put(C16, k, nk), *cv = kv_put(C16, v, nk);
        float *co = xmalloc(nq * 4);
        k_attention_cached(C16, co, q, ck, cv, Tq, Tk, Hq, Hkv, hd);
        kv_get(C16, back, ck, nk);
        differ = count_diff(back, ke, nk);
        kv_get(C16, back, cv, nk);
        differ += count_diff(back, ve, nk);
        bad += report("  the CPU's BF16 context: out", err_of(got, co, NULL, nq), 1e-5);
        bad += report_equal("  the CPU's BF16 context: stored", differ);
        k_free(C16, ck, nk * k_kv_elem_bytes(C16), KMEM_KV), k_free(C16, cv, nk * k_kv_elem_bytes(C16), KMEM_KV);
        free(co);
    }
    k_free(G, gk, nk * k_kv_elem_bytes(G), KMEM_KV), k_free(G, gv, nk * k_kv_elem_bytes(G), KMEM_KV);
    kdrop(G, gq, nq * 4), kdrop(G, go, nq * 4);
    free(q), free(k), free(v), free(ke), free(ve), free(back), free(got), free(want), free(raw);
    return bad;
}

/* attention_decode_batched over caches of K (capacity cap, cached lengths lens[b]) filled by k_kv_store: each
 * sequence's output against the double reference over what its cache holds and its new row as the cache stores it
 * (kv_expect), within 2e-5; the caches after the call hold exactly that new row at position lens[b] and nothing
 * else changed. */
static int t_kv_decode_batched(struct kctx *G, int B, const int *lens, int cap, int Hq, int Hkv, int hd)
{
    const bool bf16 = G->matmul == KMM_BF16;
    const size_t QD = (size_t)Hq * hd, KD = (size_t)Hkv * hd, nc = (size_t)cap * KD, eb = k_kv_elem_bytes(G);
    float *q = rand_vec((size_t)B * QD, -2, 2), *k = rand_vec((size_t)B * KD, -2, 2);
    float *v = rand_vec((size_t)B * KD, -1, 1), *got = xmalloc((size_t)B * QD * 4), *back = xmalloc(nc * 4);
    double *want = xmalloc((size_t)B * QD * sizeof *want);
    float *ek[8], *ev[8];
    void *gk[8], *gv[8];
    int32_t len[8];
    for (int b = 0; b < B; b++) {
        float *hk = rand_vec(nc, -2, 2), *hv = rand_vec(nc, -1, 1);
        gk[b] = kv_put(G, hk, nc), gv[b] = kv_put(G, hv, nc);
        memcpy(hk + (size_t)lens[b] * KD, k + (size_t)b * KD, KD * 4); /* the append, by hand */
        memcpy(hv + (size_t)lens[b] * KD, v + (size_t)b * KD, KD * 4);
        ek[b] = kv_expect(G, hk, nc), ev[b] = kv_expect(G, hv, nc);
        ref_cached(want + (size_t)b * QD, q + (size_t)b * QD, ek[b], ev[b], 1, lens[b] + 1, Hq, Hkv, hd);
        len[b] = lens[b];
        free(hk), free(hv);
    }
    void **tab = kput(G, gk, (size_t)B * sizeof(void *)), **tabv = kput(G, gv, (size_t)B * sizeof(void *));
    int32_t *glen = kput(G, len, (size_t)B * sizeof(int32_t));
    float *gq = kputf(G, q, (size_t)B * QD), *gkn = kputf(G, k, (size_t)B * KD), *gvn = kputf(G, v, (size_t)B * KD);
    float *go = kputf(G, q, (size_t)B * QD);
    k_attention_decode_batched(G, go, gq, gkn, gvn, tab, tabv, glen, B, Hq, Hkv, hd);
    kget(G, got, go, (size_t)B * QD * 4);
    char name[96];
    snprintf(name, sizeof name, "%s KV cache: attention_decode_batched B=%d Hq=%d Hkv=%d hd=%d", bf16 ? "BF16" : "fp32",
             B, Hq, Hkv, hd);
    int bad = report(name, err_of64(got, want, (size_t)B * QD), 2e-5);
    size_t differ = 0;
    for (int b = 0; b < B; b++) {
        kv_get(G, back, gk[b], nc);
        differ += count_diff(back, ek[b], nc);
        kv_get(G, back, gv[b], nc);
        differ += count_diff(back, ev[b], nc);
        k_free(G, gk[b], nc * eb, KMEM_KV), k_free(G, gv[b], nc * eb, KMEM_KV);
        free(ek[b]), free(ev[b]);
    }
    bad += report_equal("  the caches after the append", differ);
    kdrop(G, tab, (size_t)B * sizeof(void *)), kdrop(G, tabv, (size_t)B * sizeof(void *));
    kdrop(G, glen, (size_t)B * 4), kdrop(G, gq, (size_t)B * QD * 4), kdrop(G, gkn, (size_t)B * KD * 4);
    kdrop(G, gvn, (size_t)B * KD * 4), kdrop(G, go, (size_t)B * QD * 4);
    free(q), free(k), free(v), free(got), free(back), free(want);
    return bad;
}

static int t_vec(struct kctx *G, struct kctx *C, size_t n)
{
    float *a = rand_vec(n, -6, 6), *b = rand_vec(n, -2, 2), *d = rand_vec(n, -1, 1), *g0 = rand_vec(n, -0.5f, 0.5f);
    float *u0 = rand_vec(n, -0.5f, 0.5f), *got = xmalloc(n * 4), *want = xmalloc(n * 4);
    float *dg = copy_vec(g0, n), *du = copy_vec(u0, n);
    float *ga = kputf(G, a, n), *gb = kputf(G, b, n), *gd = kputf(G, d, n), *gy = kputf(G, a, n);
    char name[64];
    int bad = 0;
    /* swiglu */
    k_swiglu_forward(C, want, a, b, n);
    k_swiglu_forward(G, gy, ga, gb, n);
    kget(G, got, gy, n * 4);
    snprintf(name, sizeof name, "swiglu n=%zu: out", n);
    bad += report(name, err_of(got, want, NULL, n), 1e-5);
    k_swiglu_backward(C, dg, du, d, a, b, n);
    float *gdg = kputf(G, g0, n), *gdu = kputf(G, u0, n), *h2 = xmalloc(n * 4);
    k_swiglu_backward(G, gdg, gdu, gd, ga, gb, n);
    kget(G, got, gdg, n * 4);
    kget(G, h2, gdu, n * 4);
    bad += report("  dgate", err_of(got, dg, g0, n), 1e-5);
    bad += report("  dup", err_of(h2, du, u0, n), 1e-5);
    /* add, axpy, scale: the same roundings as the CPU's loops */
    memcpy(want, a, n * 4);
    k_add(C, want, b, n);
    k_axpy(C, want, 0.37f, d, n);
    k_scale(C, want, -1.0 / 1.7, n); /* a coefficient no float holds: one rounding, as the CPU's double product */
    k_to_device(G, gy, a, n * 4);
    k_add(G, gy, gb, n);
    k_axpy(G, gy, 0.37f, gd, n);
    k_scale(G, gy, -1.0 / 1.7, n);
    kget(G, got, gy, n * 4);
    size_t diff = count_diff(got, want, n);
    printf("  add, axpy, scale n=%zu: %zu elements differ from the CPU%s\n", n, diff, diff ? "  FAIL" : "");
    bad += diff != 0;
    /* sumsq in double: the orders differ (the CPU adds one by one, ~n eps at worst) */
    double sc = k_sumsq(C, a, n), sg = k_sumsq(G, ga, n), sg2 = k_sumsq(G, ga, n);
    bad += report("  sumsq (relative)", fabs(sg - sc) / sc, 1e-10);
    printf("  %-44s %s\n", "  sumsq run to run", memcmp(&sg, &sg2, sizeof sg) ? "differs  FAIL" : "same bits");
    bad += memcmp(&sg, &sg2, sizeof sg) != 0;
    bad += k_sumsq(G, ga, 0) != 0.0;
    kdrop(G, ga, n * 4), kdrop(G, gb, n * 4), kdrop(G, gd, n * 4), kdrop(G, gy, n * 4), kdrop(G, gdg, n * 4);
    kdrop(G, gdu, n * 4);
    free(a), free(b), free(d), free(g0), free(u0), free(got), free(want), free(dg), free(du), free(h2);
    return bad;
}

/* A stand-in for the other shards of the vocabulary: it logs its calls and folds in fixed values, the same on the
 * CPU and the GPU, so both must call it alike and finish from its results alike. */
struct fake_shards {
    int calls;
    int n[256];
    bool max[256];
};

static void fake_reduce(void *ud, double *buf, int n, bool max)
{
    struct fake_shards *f = ud;
    if (f->calls < 256) {
        f->n[f->calls] = n;
        f->max[f->calls] = max;
    }
    f->calls++;
    for (int i = 0; i < n; i++)
        buf[i] = max ? fmax(buf[i], 0.25 + 0.01 * (i % 5)) : buf[i] + 0.5 + 0.001 * (i % 7);
}

static int t_lmhead(struct kctx *G, struct kctx *C, int N, int D, int V, int lo, int hi, int chunk, float temp,
                    bool reduce, bool with_entropy, double bound)
{
    struct fake_shards fc = {0}, fg = {0};
    struct vocab_shard vc = {.lo = lo, .hi = hi, .V = V}, vg = vc;
    if (reduce) {
        vc.reduce = vg.reduce = fake_reduce;
        vc.ud = &fc;
        vg.ud = &fg;
    }
    const int Vl = hi - lo;
    size_t nh = (size_t)N * D, nw = (size_t)Vl * D;
    int32_t *tg = xmalloc(N * sizeof *tg);
    for (int i = 0; i < N; i++) /* targets in and out of the shard */
        tg[i] = (int32_t)urand(0.0f, (float)V) % V;
    float *h = rand_vec(nh, -0.5f, 0.5f), *W = rand_vec(nw, -0.5f, 0.5f), *dlp = rand_vec(N, -1, 1);
    float *dent = rand_vec(N, -1, 1), *dh0 = rand_vec(nh, -1e-2f, 1e-2f), *dW0 = rand_vec(nw, -1e-3f, 1e-3f);
    float *lp = xmalloc(N * 4), *ent = xmalloc(N * 4), *dh = copy_vec(dh0, nh), *dW = copy_vec(dW0, nw);
    k_lmhead_forward(C, lp, with_entropy ? ent : NULL, h, W, tg, N, D, &vc, temp, chunk);
    k_lmhead_backward(C, dh, dW, dlp, with_entropy ? dent : NULL, h, W, tg, N, D, &vc, temp, chunk);

    int32_t *gtg = kput(G, tg, N * sizeof *tg);
    float *gh = kputf(G, h, nh), *gW = kputf(G, W, nw), *gdlp = kputf(G, dlp, N), *gdent = kputf(G, dent, N);
    float *glp = kputf(G, lp, N), *gent = kputf(G, ent, N);
    float *hlp = xmalloc(N * 4), *hent = xmalloc(N * 4);
    k_lmhead_forward(G, glp, with_entropy ? gent : NULL, gh, gW, gtg, N, D, &vg, temp, chunk);
    kget(G, hlp, glp, N * 4);
    kget(G, hent, gent, N * 4);
    char name[128];
    snprintf(name, sizeof name, "lmhead %sN=%d D=%d V=%d [%d, %d) chunk=%d T=%.2f%s: logp",
             G->matmul == KMM_BF16 ? "BF16 " : "", N, D, V, lo, hi, chunk, (double)temp, reduce ? " reduce" : "");
    int bad = report(name, err_of(hlp, lp, NULL, N), bound);
    if (with_entropy)
        bad += report("  entropy", err_of(hent, ent, NULL, N), bound);
    float *res[2][2];
    for (int run = 0; run < 2; run++) {
        float *gdh = kputf(G, dh0, nh), *gdW = kputf(G, dW0, nw);
        k_lmhead_backward(G, gdh, gdW, gdlp, with_entropy ? gdent : NULL, gh, gW, gtg, N, D, &vg, temp, chunk);
        // NOLINTNEXTLINE(clang-analyzer-optin.portability.UnixAPI): the analyzer's wrapped size; nh, nw are small
        res[run][0] = xmalloc(nh * 4), res[run][1] = xmalloc(nw * 4);
        kget(G, res[run][0], gdh, nh * 4);
        kget(G, res[run][1], gdW, nw * 4);
        kdrop(G, gdh, nh * 4), kdrop(G, gdW, nw * 4);
    }
    bad += report("  dh", err_of(res[0][0], dh, dh0, nh), bound * 5);
    bad += report("  dW", err_of(res[0][1], dW, dW0, nw), bound * 5);
    bad += report_bits("  backward", count_diff(res[0][0], res[1][0], nh) + count_diff(res[0][1], res[1][1], nw));
    if (reduce) { /* the GPU ran forward + 2 backwards, the CPU forward + 1: compare the CPU's calls with the GPU's */
        int same = fg.calls == fc.calls + fc.calls / 2;
        for (int i = 0; same && i < fc.calls && i < 256; i++)
            same = fg.n[i] == fc.n[i] && fg.max[i] == fc.max[i];
        printf("  %-44s %d calls on the CPU, %d on the GPU (for 1 + 2 passes)%s\n", "  reduce calls", fc.calls,
               fg.calls, same ? ", same order" : "  FAIL");
        bad += !same;
    }
    kdrop(G, gtg, N * 4), kdrop(G, gh, nh * 4), kdrop(G, gW, nw * 4), kdrop(G, gdlp, N * 4);
    kdrop(G, gdent, N * 4), kdrop(G, glp, N * 4), kdrop(G, gent, N * 4);
    for (int run = 0; run < 2; run++)
        free(res[run][0]), free(res[run][1]);
    free(tg), free(h), free(W), free(dlp), free(dent), free(dh0), free(dW0), free(lp), free(ent), free(dh), free(dW);
    free(hlp), free(hent);
    return bad;
}

/* The forward with vocab_shard.sum_pi_sq: the entropy output gets sum_j p_j^2 (verl's sum_pi_squared), on the GPU as
 * on the CPU; the log-probs as without it, the shards' statistics reduced in the same calls. */
static int t_lmhead_sum_pi_sq(struct kctx *G, struct kctx *C, int N, int D, int V, int lo, int hi, int chunk,
                              float temp, bool reduce, double bound)
{
    struct fake_shards fc = {0}, fg = {0};
    struct vocab_shard vc = {.lo = lo, .hi = hi, .V = V, .sum_pi_sq = true}, vg = vc;
    if (reduce) {
        vc.reduce = vg.reduce = fake_reduce;
        vc.ud = &fc;
        vg.ud = &fg;
    }
    const size_t nh = (size_t)N * D, nw = (size_t)(hi - lo) * D;
    int32_t *tg = xmalloc(N * sizeof *tg);
    for (int i = 0; i < N; i++)
        tg[i] = (int32_t)urand(0.0f, (float)V) % V;
    float *h = rand_vec(nh, -0.5f, 0.5f), *W = rand_vec(nw, -0.5f, 0.5f);
    float *lp = xmalloc(N * 4), *sq = xmalloc(N * 4), *hlp = xmalloc(N * 4), *hsq = xmalloc(N * 4);
    k_lmhead_forward(C, lp, sq, h, W, tg, N, D, &vc, temp, chunk);
    int32_t *gtg = kput(G, tg, N * sizeof *tg);
    float *gh = kputf(G, h, nh), *gW = kputf(G, W, nw), *glp = kputf(G, lp, N), *gsq = kputf(G, sq, N);
    k_lmhead_forward(G, glp, gsq, gh, gW, gtg, N, D, &vg, temp, chunk);
    kget(G, hlp, glp, N * 4);
    kget(G, hsq, gsq, N * 4);
    char name[128];
    snprintf(name, sizeof name, "lmhead sum_pi_sq N=%d V=%d [%d, %d) chunk=%d T=%.2f%s: logp", N, V, lo, hi, chunk,
             (double)temp, reduce ? " reduce" : "");
    int bad = report(name, err_of(hlp, lp, NULL, N), bound);
    bad += report("  sum_pi_sq", err_of(hsq, sq, NULL, N), bound);
    if (reduce && fg.calls != fc.calls) {
        printf("  reduce calls: %d on the CPU, %d on the GPU  FAIL\n", fc.calls, fg.calls);
        bad++;
    }
    kdrop(G, gtg, N * 4), kdrop(G, gh, nh * 4), kdrop(G, gW, nw * 4), kdrop(G, glp, N * 4), kdrop(G, gsq, N * 4);
    free(tg), free(h), free(W), free(lp), free(sq), free(hlp), free(hsq);
    return bad;
}

static int t_adamw_kops(struct kctx *G, struct kctx *C, size_t n)
{
    float *p = rand_vec(n, -1, 1), *m = xcalloc(n, 4), *v = xcalloc(n, 4), *got = xmalloc(n * 4);
    float *gp = kputf(G, p, n), *gm = kputf(G, m, n), *gv = kputf(G, v, n), *gg = kputf(G, p, n);
    const double lrs[] = {1e-3, 2e-3, 5e-4};
    for (int t = 1; t <= 3; t++) {
        float *g = rand_vec(n, -1, 1);
        k_to_device(G, gg, g, n * 4);
        k_adamw(C, p, g, m, v, n, lrs[t - 1], 0.9, 0.999, 1e-8, 0.01, t);
        k_adamw(G, gp, gg, gm, gv, n, lrs[t - 1], 0.9, 0.999, 1e-8, 0.01, t);
        free(g);
    }
    kget(G, got, gp, n * 4);
    double e = err_of(got, p, NULL, n);
    size_t diff = count_diff(got, p, n);
    kget(G, got, gm, n * 4);
    e = fmax(e, err_of(got, m, NULL, n));
    diff += count_diff(got, m, n);
    kget(G, got, gv, n * 4);
    e = fmax(e, err_of(got, v, NULL, n));
    diff += count_diff(got, v, n);
    char name[64];
    snprintf(name, sizeof name, "adamw n=%zu, 3 steps: p, m, v", n);
    int bad = report(name, e, 1e-6);
    printf("  %-44s %zu elements not bit-equal to the CPU's\n", "", diff);
    kdrop(G, gp, n * 4), kdrop(G, gm, n * 4), kdrop(G, gv, n * 4), kdrop(G, gg, n * 4);
    free(p), free(m), free(v), free(got);
    return bad;
}

/* The survival key's copy of the step's start on a GPU (trainer_snapshot_take): the weights and both moments copied
 * into pinned host memory beside the device's work (adamw_keep_issue, k_to_host_behind), and the step's AdamW
 * waiting for the copies (adamw_keep.behind). The copies must hold the state from before the step, bit for bit:
 * issued before the step, or by the step itself. The emulator runs such a copy as late as a GPU may (tests/cuemu,
 * CUEMU_DEFER_COPIES): at the first wait for it; so there the same copies made with no wait in the update (a
 * control) must hold the changed state, which shows that a missing wait is seen. */
static int t_keep_beside(struct kctx *G, size_t n)
{
    float *p = rand_vec(n, -1, 1), *m = rand_vec(n, -0.1f, 0.1f), *v = rand_vec(n, 0, 0.01f), *g = rand_vec(n, -1, 1);
    float *gp = kputf(G, p, n), *gg = kputf(G, g, n);
    struct adamw *o = adamw_create_on(G, n, 0.9, 0.999, 1e-8, 0.01);
    k_to_device(G, o->m, m, n * 4);
    k_to_device(G, o->v, v, n * 4);
    o->t = 4;
    float *hp = G->ops->host_alloc(G, n * 4), *hm = G->ops->host_alloc(G, n * 4), *hv = G->ops->host_alloc(G, n * 4);
    int bad = 0;
    const char *how[] = {"issued before the update", "issued by the update", "control (no wait)"};
    for (int r = 0; r < 3; r++) {
        struct adamw_keep keep = {.p = hp, .m = hm, .v = hv, .beside = true};
        o->keep = &keep;
        if (r == 0)
            adamw_keep_issue(o, gp);
        if (r < 2) {
            adamw_step(o, gp, gg, 1e-3);
            bad += o->keep != NULL || keep.behind != NULL || keep.beside || !keep.kept;
        } else { /* the copies issued, then the update without waiting for them */
            adamw_keep_issue(o, gp);
            o->keep = NULL;
            k_adamw(G, gp, gg, o->m, o->v, n, 1e-3, 0.9, 0.999, 1e-8, 0.01, ++o->t);
        }
        k_behind_wait(G, true);
        const size_t diff = count_diff(hp, p, n) + count_diff(hm, m, n) + count_diff(hv, v, n);
        char what[96];
        snprintf(what, sizeof what, "keep beside, %s", how[r]);
        if (r < 2) {
            bad += report_equal(what, diff);
        } else {
#ifdef GRPO_CUEMU
            printf("  %-44s %zu of %zu floats are the changed state's%s\n", what, diff, 3 * n,
                   diff == 0 ? "  FAIL (the emulator ran the copy before the update)" : "");
            bad += diff == 0;
#else
            printf("  %-44s %zu of %zu floats are the changed state's (a race on a GPU)\n", what, diff, 3 * n);
#endif
        }
        /* the next round's "before": the state now */
        kget(G, p, gp, n * 4);
        kget(G, m, o->m, n * 4);
        kget(G, v, o->v, n * 4);
    }
    G->ops->host_free(G, hp), G->ops->host_free(G, hm), G->ops->host_free(G, hv);
    adamw_free(o);
    kdrop(G, gp, n * 4), kdrop(G, gg, n * 4);
    free(p), free(m), free(v), free(g);
    return bad;
}

/* Empty shapes launch nothing and succeed, as the CPU loops do. */
static int t_empty_ops(struct kctx *G)
{
    int32_t cu[3] = {0, 0, 0};
    int32_t *gcu = kput(G, cu, sizeof cu);
    float *buf = k_alloc(G, 64, KMEM_OTHER, "test");
    const struct vocab_shard vs = {.lo = 0, .hi = 10, .V = 10};
    k_linear_forward(G, buf, buf, buf, NULL, 0, 4, 4);
    k_linear_backward(G, buf, buf, buf, buf, buf, buf, 0, 4, 4);
    k_attention_forward(G, buf, buf, buf, buf, buf, gcu, NULL, 2, 2, 1, 8);
    k_attention_backward(G, buf, buf, buf, buf, buf, buf, buf, buf, buf, gcu, NULL, 2, 2, 1, 8);
    k_attention_cached(G, buf, buf, buf, buf, 0, 5, 2, 1, 8);
    k_lmhead_forward(G, buf, buf, buf, buf, gcu, 0, 4, &vs, 1.0f, 4);
    k_lmhead_backward(G, buf, buf, buf, buf, buf, buf, gcu, 0, 4, &vs, 1.0f, 4);
    k_embedding_forward(G, buf, gcu, buf, 0, 4, &vs);
    k_rmsnorm_forward(G, buf, buf, buf, buf, 0, 4, 1e-6f);
    k_rmsnorm_backward(G, buf, buf, buf, buf, buf, buf, 0, 4);
    k_swiglu_forward(G, buf, buf, buf, 0);
    k_add(G, buf, buf, 0);
    k_sync(G);
    kdrop(G, gcu, sizeof cu);
    kdrop(G, buf, 64);
    printf("  empty shapes: nothing launched, no error\n");
    return 0;
}

/* GPU sampling against the CPU's (sample_row): the same uniforms, drawn as sample_token draws them (each row's rng
 * stream, first draw); through the back-end's sample op (host tokens and logps) and sample_rows_cuda (device). */
static int t_sample(struct kctx *G, struct kctx *C, int B, int V, float temperature, float top_p, int top_k)
{
    float *logits = xmalloc((size_t)B * V * 4);
    for (size_t i = 0; i < (size_t)B * V; i++)
        logits[i] = urand(-4.0f, 4.0f);
    for (int r = 0; r < B; r++) /* a tie for the maximum: the lower index wins */
        if (r % 2 == 0 && V > 1) {
            int a = (r * 131) % V, b = (a + 1 + r) % V;
            logits[(size_t)r * V + a] = logits[(size_t)r * V + b] = 5.0f;
        }
    int32_t *want = xmalloc(B * sizeof *want), *got = xmalloc(B * sizeof *got), *got2 = xmalloc(B * sizeof *got2);
    float *want_lp = xmalloc(B * 4), *got_lp = xmalloc(B * 4), *got2_lp = xmalloc(B * 4);
    double *u = xmalloc(B * sizeof *u);
    for (int r = 0; r < B; r++) {
        struct rng rg;
        rng_seed(&rg, 1234, (uint64_t)r);
        u[r] = rng_uniform(&rg);
    }
    k_sample(C, want, want_lp, logits, B, V, temperature, top_p, top_k, u);
    float *gl = kputf(G, logits, (size_t)B * V);
    k_sample(G, got, got_lp, gl, B, V, temperature, top_p, top_k, u);
    /* the launcher on its own, uniforms from device memory */
    size_t scratch_bytes = sample_rows_cuda_scratch_bytes(B, V);
    void *scratch = k_alloc(G, scratch_bytes, KMEM_OTHER, "sampling scratch");
    double *gu = kput(G, u, B * sizeof *u);
    float *glp = k_alloc(G, B * 4, KMEM_OTHER, "logps");
    int32_t *gt = k_alloc(G, B * 4, KMEM_OTHER, "tokens");
    CHECK_CUDA(sample_rows_cuda(gt, glp, gl, B, V, temperature, top_p, top_k, gu, scratch, scratch_bytes,
                                (cudaStream_t)G->stream));
    kget(G, got2, gt, B * 4);
    kget(G, got2_lp, glp, B * 4);
    int mismatch = 0, raw = 0;
    double elp = 0;
    for (int r = 0; r < B; r++) {
        mismatch += got[r] != want[r];
        raw += got2[r] != got[r] || memcmp(&got2_lp[r], &got_lp[r], sizeof(float)) != 0;
        if (got[r] == want[r])
            elp = fmax(elp, fabs((double)got_lp[r] - want_lp[r]));
    }
    /* greedy must be exact; sampling may differ only where a cumulative sum lands within rounding of u */
    int bad = temperature > 0 ? mismatch > 1 : mismatch != 0;
    bad |= !(elp <= 1e-5) || raw != 0;
    printf("  sample B=%d V=%d T=%.2f top_p=%.2f top_k=%d: %d of %d tokens differ from the CPU's, logp %.1e%s%s\n", B,
           V, (double)temperature, (double)top_p, top_k, mismatch, B, elp, raw ? ", sample_rows_cuda differs" : "",
           bad ? "  FAIL" : "");
    kdrop(G, scratch, scratch_bytes), kdrop(G, gl, (size_t)B * V * 4), kdrop(G, glp, B * 4), kdrop(G, gt, B * 4);
    kdrop(G, gu, B * sizeof *u);
    free(logits), free(want), free(got), free(got2), free(want_lp), free(got_lp), free(got2_lp), free(u);
    return bad;
}

/* Kept BF16 weights (kernels.h, k_weights_changed): in a BF16 context a product whose W lies in a weights buffer
 * reads a BF16 copy made once per change. Its results equal a product that rounds W per call (the same buffer's
 * values in a plain allocation), bit for bit; a run of products rounds the weights once (a decode step then reads
 * 2 bytes per parameter, no rounding); the back-end's own writes (AdamW, axpy, to_device) make the copy again at
 * the next product; a write behind its back is seen by k_weights_check, and k_weights_changed mends it. */
static int t_kept_weights(struct kctx *G16, int N, int Din, int Dout)
{
    const size_t nx = (size_t)N * Din, ny = (size_t)N * Dout, nw = (size_t)Dout * Din;
    float *x = rand_vec(nx, -1, 1), *W = rand_vec(nw + 8, -0.5f, 0.5f), *g = rand_vec(nw + 8, -1, 1);
    float *y = xmalloc(ny * 4), *y0 = xmalloc(ny * 4);
    /* W at offset 8 in the buffer: a product's weight is any slice of a kept buffer */
    float *kw = k_alloc(G16, (nw + 8) * 4, KMEM_WEIGHTS, "test weights"), *gx = kputf(G16, x, nx);
    float *gy = kputf(G16, y, ny), *plain = kputf(G16, W + 8, nw), *gg = kputf(G16, g, nw + 8);
    float *gm = kputf(G16, g, nw + 8), *gv = kputf(G16, g, nw + 8);
    k_to_device(G16, kw, W, (nw + 8) * 4);
    int bad = 0;
    char name[96];
    /* same_as_plain: one product through the kept copy and one rounding W per call, compared bit for bit */
#define SAME_AS_PLAIN(what)                                                                                            \
    do {                                                                                                               \
        k_copy(G16, plain, kw + 8, nw * 4);                                                                            \
        k_linear_forward(G16, gy, gx, plain, NULL, N, Din, Dout);                                                      \
        kget(G16, y0, gy, ny * 4);                                                                                     \
        k_linear_forward(G16, gy, gx, kw + 8, NULL, N, Din, Dout);                                                     \
        kget(G16, y, gy, ny * 4);                                                                                      \
        snprintf(name, sizeof name, "kept BF16 weights %s (N=%d %dx%d)", what, N, Dout, Din);                          \
        bad += report_equal(name, count_diff(y, y0, ny));                                                              \
    } while (0)
    const struct kgemm_stats s0 = G16->gemm;
    SAME_AS_PLAIN("equal per-call rounding");
    for (int i = 0; i < 3; i++) /* a decode step's products: no rounding of the weights */
        k_linear_forward(G16, gy, gx, kw + 8, NULL, N, Din, Dout);
    const struct kgemm_stats s1 = G16->gemm;
    const unsigned long long refreshes = s1.kept_refreshes - s0.kept_refreshes;
    const double per_call = (double)(s1.round_bytes_weights - s0.round_bytes_weights) / (double)nw;
    const int counted = refreshes != 1 || s1.kept_refresh_bytes - s0.kept_refresh_bytes != (nw + 8) * 4;
    printf("  %-44s %llu refresh(es) of %zu bytes for 5 products; %.1f bytes per parameter rounded per call "
           "(the plain product's 4)%s\n",
           "kept weights: rounding counted", refreshes, (size_t)(s1.kept_refresh_bytes - s0.kept_refresh_bytes),
           per_call, counted || per_call != 4.0 ? "  FAIL" : "");
    bad += counted || per_call != 4.0;
    k_adamw(G16, kw, gg, gm, gv, nw + 8, 1e-2, 0.9, 0.999, 1e-8, 0.0, 1);
    SAME_AS_PLAIN("after AdamW");
    k_axpy(G16, kw + 8, 0.5f, gg, nw);
    SAME_AS_PLAIN("after axpy");
    k_to_device(G16, kw, W, 4 * 4); /* a few floats of the buffer, before the slice */
    SAME_AS_PLAIN("after to_device");
    /* behind the back-end's back: a write it cannot see (a collective's, say) */
    for (size_t i = 0; i < nw + 8; i++)
        W[i] = -W[i];
    CHECK_CUDA(cudaMemcpy(kw, W, (nw + 8) * 4, cudaMemcpyHostToDevice));
    const int unsaid = k_weights_check(G16);
    k_weights_changed(G16, kw + nw / 2);
    const int said = k_weights_check(G16);
    printf("  %-44s %d stale copy seen before k_weights_changed, %d after%s\n", "kept weights: a write unsaid", unsaid,
           said, unsaid != 1 || said != 0 ? "  FAIL" : "");
    bad += unsaid != 1 || said != 0;
    SAME_AS_PLAIN("after k_weights_changed");
#undef SAME_AS_PLAIN
    k_free(G16, kw, (nw + 8) * 4, KMEM_WEIGHTS);
    kdrop(G16, gx, nx * 4), kdrop(G16, gy, ny * 4), kdrop(G16, plain, nw * 4), kdrop(G16, gg, (nw + 8) * 4);
    kdrop(G16, gm, (nw + 8) * 4), kdrop(G16, gv, (nw + 8) * 4);
    free(x), free(W), free(g), free(y), free(y0);
    return bad;
}

/* x rounded to TF32 (10 mantissa bits, to nearest, ties away from zero), as cvt.rna.tf32.f32 */
static float tf32_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u)
        u = (u + 0x1000u) & ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}

/* fp32_matmul_precision=high (K->tf32): the products take TF32 inputs. Against a double reference of the inputs
 * rounded to TF32, and of the inputs as they are: the TF32 product is near the first (fp32 accumulation) and
 * differs from the fp32 product. */
static int t_tf32(struct kctx *G, int N, int Din, int Dout)
{
    const size_t nx = (size_t)N * Din, ny = (size_t)N * Dout, nw = (size_t)Dout * Din;
    float *x = rand_vec(nx, -1, 1), *W = rand_vec(nw, -0.5f, 0.5f), *y = xmalloc(ny * 4), *yf = xmalloc(ny * 4);
    float *ref = xmalloc(ny * 4), *ref32 = xmalloc(ny * 4);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < Dout; o++) {
            double a = 0, b = 0;
            for (int k = 0; k < Din; k++) {
                a += (double)tf32_of(x[(size_t)i * Din + k]) * tf32_of(W[(size_t)o * Din + k]);
                b += (double)x[(size_t)i * Din + k] * W[(size_t)o * Din + k];
            }
            ref[(size_t)i * Dout + o] = (float)a, ref32[(size_t)i * Dout + o] = (float)b;
        }
    float *gx = kputf(G, x, nx), *gw = kputf(G, W, nw), *gy = kputf(G, y, ny);
    const bool was = G->tf32;
    G->tf32 = true;
    k_linear_forward(G, gy, gx, gw, NULL, N, Din, Dout);
    kget(G, y, gy, ny * 4);
    G->tf32 = false;
    k_linear_forward(G, gy, gx, gw, NULL, N, Din, Dout);
    kget(G, yf, gy, ny * 4);
    G->tf32 = was;
    char name[96];
    snprintf(name, sizeof name, "TF32 linear N=%d %dx%d: y vs TF32 inputs", N, Dout, Din);
    int bad = report(name, err_of(y, ref, NULL, ny), 1e-5);
    bad += report("  fp32 y vs fp32 inputs", err_of(yf, ref32, NULL, ny), 1e-5);
    const size_t differ = count_diff(y, yf, ny);
    printf("  %-44s %zu of %zu outputs differ (TF32 rounding is in effect)%s\n", "  TF32 vs fp32", differ, ny,
           differ == 0 ? "  FAIL" : "");
    bad += differ == 0;
    kdrop(G, gx, nx * 4), kdrop(G, gw, nw * 4), kdrop(G, gy, ny * 4);
    free(x), free(W), free(y), free(yf), free(ref), free(ref32);
    return bad;
}

static int test_kops(void)
{
    char why[256];
    struct kctx *G = kctx_create("cuda", KMM_F32, why, sizeof why), *C = kctx_cpu();
    if (!G || G->ops != &kops_cuda) {
        printf("kctx_create(\"cuda\"): %s  FAIL\n", G ? "not the CUDA back-end's table" : why);
        return 1;
    }
    struct kctx *G16 = kctx_create("cuda", KMM_BF16, why, sizeof why);
    if (!G16) {
        printf("kctx_create(\"cuda\", BF16): %s  FAIL\n", why);
        kctx_free(G);
        return 1;
    }
    const int small = small_shapes();
    char desc[128];
    printf("kops_cuda against kops_cpu on %s%s\n", kctx_describe(G, desc, sizeof desc), small ? " (small shapes)" : "");
    int bad = t_memory(G) + t_empty_ops(G) + t_empty_ops(G16);
    bad += t_rmsnorm(G, C, 37, 576) + t_rmsnorm(G, C, 5, 33);
    bad += t_embedding(G, C, 300, 64, 50, 0, 50) + t_embedding(G, C, 257, 40, 100, 30, 70);
    bad += t_linear(G, C, 37, 96, 80, 1e-5) + t_linear(G, C, 3, 5, 7, 1e-5);
    bad += t_linear(G16, C, 37, 96, 80, 1e-2);
    bad += t_kept_weights(G16, 5, 96, 80) + t_tf32(G, 9, 64, 40);
    if (!small)
        bad += t_linear(G, C, 300, 512, 384, 1e-5) + t_linear(G16, C, 300, 512, 384, 1e-2);
    bad += t_moe(G, C, 37, 4, 2, 64, 48, false, 0, 1e-5) + t_moe(G, C, 5, 8, 3, 16, 24, true, 0, 1e-5);
    bad += t_moe(G, C, 40, 8, 2, 32, 24, true, 1, 1e-5) + t_moe(G, C, 40, 8, 2, 32, 24, false, 2, 1e-5);
    bad += t_moe(G16, C, 37, 4, 2, 64, 48, true, 0, 2e-2);
    if (!small) /* more slots than a block of the sort walks at once, 64 experts (Qwen3-MoE's count per layer) */
        bad += t_moe(G, C, 300, 8, 2, 256, 384, true, 0, 1e-5) + t_moe(G, C, 700, 64, 8, 64, 32, true, 0, 1e-5) +
               t_moe(G16, C, 300, 8, 2, 256, 384, true, 0, 2e-2);
    bad += t_rope(G, C, 17, 3, 64) + t_rope(G, C, 5, 2, 6);
    {
        static const int l1[] = {1, 70, 0, 130, 64}, l2[] = {37, 100}, l3[] = {200}, l4[] = {5, 3};
        bad += t_attention(G, C, 5, l1, 4, 2, 64, 1.0f);
        bad += t_attention(G, C, 2, l2, 6, 2, 24, 2.0f);
        bad += t_attention(G, C, 2, l4, 2, 2, 8, 1.0f);
        if (!small) {
            bad += t_attention(G, C, 1, l3, 2, 1, 128, 1.0f);
            static const int l5[] = {300, 129, 257};
            bad += t_attention(G, C, 3, l5, 8, 2, 128, 1.5f);
            bad += t_attention(G, C, 1, l1 + 1, 2, 1, 256, 1.0f);
        }
    }
    {
        /* BF16 attention on tensor cores: GQA 3 and 2, head sizes 64, 40 and 128, an empty sequence, rows before the
         * first sequence, and (not small) a sequence longer than a tile of query rows (512) */
        static const int b1[] = {1, 70, 0, 130}, b2[] = {37, 100, 5}, b3[] = {600, 45};
        bad += t_attention_bf16(G16, 4, b1, 0, 6, 2, 64, 1.0f);
        bad += t_attention_bf16(G16, 3, b2, 3, 4, 2, 40, 2.0f);
        if (!small)
            bad += t_attention_bf16(G16, 2, b3, 0, 2, 1, 128, 1.5f);
    }
    /* ring attention's blocks: GQA, a head size not a multiple of 32, the largest (256), one sequence */
    bad += t_block(G, C, 40, 56, 4, 2, 64, 3) + t_block(G, C, 17, 9, 2, 1, 40, 2) + t_block(G, C, 8, 12, 2, 2, 256, 1);
    if (!small)
        bad += t_block(G, C, 512, 1024, 8, 2, 128, 4);
    /* Ulysses: after the all-to-all a rank runs the kernel's attention over its slice of the heads for the whole
     * sequence: a slice's shapes (SP 4 of 8 query and 4 KV heads; SP 2 of 4 over 2) on long packed rows */
    if (!small) {
        static const int u1[] = {2048}, u2[] = {1500, 548, 1};
        bad += t_attention(G, C, 1, u1, 2, 1, 64, 1.0f) + t_attention(G, C, 3, u2, 2, 1, 128, 1.0f);
    }
    bad += t_cached(G, C, 1, 1, 2, 1, 64) + t_cached(G, C, 1, 300, 4, 2, 64) + t_cached(G, C, 4, 600, 4, 1, 128);
    bad += t_cached(G, C, 70, 150, 4, 2, 32);
    {
        static const int lens3[] = {0, 5, 300}, lens2[] = {17, 1};
        bad += t_decode_batched(G, C, 3, lens3, 320, 4, 2, 64) + t_decode_batched(G, C, 2, lens2, 32, 3, 3, 40);
    }
    if (!small)
        bad += t_cached(G, C, 1, 2000, 8, 2, 128) + t_cached(G, C, 100, 400, 2, 1, 128);
    {
        /* the KV cache: 2-byte BF16 elements in the BF16 context, fp32 in the fp32 one; each context's decode paths
         * (split keys, several rows, the tiled kernel past 8 rows, batched) against double references of what its
         * cache holds, and the BF16 context against the CPU's BF16 context where this CPU has one */
        const size_t e32 = k_kv_elem_bytes(G), e16 = k_kv_elem_bytes(G16);
        printf("KV cache elements: %zu bytes in the fp32 context, %zu in the BF16 context\n", e32, e16);
        bad += e32 != 4 || e16 != 2;
        char w16[256];
        struct kctx *C16 = kctx_create("cpu", KMM_BF16, w16, sizeof w16);
        if (!C16)
            printf("the BF16 KV cache against the CPU's BF16 context: skipped (%s)\n", w16);
        static const int lens3[] = {0, 5, 300}, lens2[] = {17, 1};
        struct kctx *ctx[2] = {G, G16};
        for (int i = 0; i < 2; i++) {
            struct kctx *X = ctx[i], *cpu16 = X == G16 ? C16 : NULL;
            bad += t_kv_cached(X, cpu16, 1, 300, 4, 2, 64) + t_kv_cached(X, cpu16, 4, 600, 4, 1, 128);
            bad += t_kv_cached(X, cpu16, 70, 150, 4, 2, 32);
            bad += t_kv_decode_batched(X, 3, lens3, 320, 4, 2, 64) + t_kv_decode_batched(X, 2, lens2, 32, 3, 3, 40);
        }
        if (C16)
            kctx_free(C16);
    }
    bad += t_vec(G, C, 1000) + t_vec(G, C, 7);
    if (!small)
        bad += t_vec(G, C, 1000003);
    bad += t_lmhead(G, C, 37, 64, 1000, 0, 1000, 16, 0.7f, false, true, 1e-5);
    bad += t_lmhead(G, C, 37, 64, 1000, 300, 1000, 10, 1.0f, true, true, 1e-5);
    bad += t_lmhead(G, C, 20, 32, 500, 0, 500, 64, 1.3f, false, false, 1e-5);
    bad += t_lmhead(G16, C, 37, 64, 1000, 0, 1000, 16, 0.7f, false, true, 2e-2);
    bad += t_lmhead_sum_pi_sq(G, C, 37, 64, 1000, 0, 1000, 16, 0.7f, false, 1e-5);
    bad += t_lmhead_sum_pi_sq(G, C, 37, 64, 1000, 300, 1000, 10, 1.0f, true, 1e-5);
    {
        /* the BF16 head against the CPU's BF16 head (the same rounded inputs, fp32 sums in another order), where
         * this CPU has BF16 instructions */
        char w16[256];
        struct kctx *C16 = kctx_create("cpu", KMM_BF16, w16, sizeof w16);
        if (C16) {
            bad += t_lmhead(G16, C16, 37, 64, 1000, 0, 1000, 16, 0.7f, false, true, 1e-3);
            kctx_free(C16);
        } else {
            printf("BF16 head against the CPU's BF16 head: skipped (%s)\n", w16);
        }
    }
    if (!small)
        bad += t_lmhead(G, C, 300, 256, 5000, 1000, 4000, 128, 0.9f, true, true, 1e-5);
    bad += t_adamw_kops(G, C, 1000) + t_adamw_kops(G, C, 7);
    bad += t_keep_beside(G, 4099);
    if (!small)
        bad += t_adamw_kops(G, C, 100003);
    const int sv = small ? 1000 : 32000;
    bad += t_sample(G, C, 8, sv, 0.0f, 1.0f, 0) + t_sample(G, C, 8, sv, 0.0f, 0.5f, 20);
    bad += t_sample(G, C, 8, sv, 1.0f, 1.0f, 0) + t_sample(G, C, 8, sv, 0.8f, 0.9f, 50);
    bad += t_sample(G, C, 8, sv, 0.7f, 1.0f, 40) + t_sample(G, C, 8, sv, 1.2f, 0.95f, 0);
    bad += t_sample(G, C, 3, 1, 1.0f, 0.9f, 0) + t_sample(G, C, 5, 700, 1.0f, 0.3f, 0);
    printf("memory: %zu bytes allocated now, %zu at most; %zu reserved at most\n", G->mem.allocated,
           G->mem.max_allocated, G->mem.max_reserved);
    kctx_free(G16);
    kctx_free(G);
    printf("kops: %d failed\n", bad);
    return bad;
}

/* Every rank leaves with 77 (skipped): mpirun passes it on. */
static int nccl_skip(struct comm *world, int ndev)
{
    if (comm_rank(world) == 0)
        printf("NCCL over %d ranks needs a GPU each (%d visible): skipped\n", comm_size(world), ndev);
    comm_free(world);
    MPI_Finalize();
    return 77;
}

static int test_nccl(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    if (ndev < comm_size(world)) /* NCCL refuses two ranks on one GPU */
        return nccl_skip(world, ndev);
    struct comm *nc = comm_nccl_from(world, comm_rank(world) % ndev);
    enum { N = 1 << 16 };
    static float h[N], want[N];
    int r = comm_rank(world), s = comm_size(world);
    for (int i = 0; i < N; i++) {
        h[i] = (float)(r + i % 13);
        want[i] = h[i];
    }
    comm_allreduce_sum(world, want, N, COMM_F32); /* the MPI back-end is the reference */
    float *d = to_dev(h, N);
    comm_allreduce_sum(nc, d, N, COMM_F32);
    CHECK_CUDA(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    int bad = memcmp(h, want, sizeof h) != 0;
    comm_allreduce_sum(world, &bad, 1, COMM_I32);
    if (r == 0)
        printf("nccl allreduce over %d ranks: %s\n", s, bad ? "MISMATCH" : "equal to MPI");
    /* what Ulysses (all-to-all of uneven slices) and the ring (send-receive) move on device memory */
    size_t *sc = xmalloc((size_t)s * sizeof *sc), *rcn = xmalloc((size_t)s * sizeof *rcn), tot_s = 0, tot_r = 0;
    for (int p = 0; p < s; p++) {
        sc[p] = 100 + 7 * (size_t)r + 3 * (size_t)p; /* rank r sends 100 + 7r + 3p to p */
        rcn[p] = 100 + 7 * (size_t)p + 3 * (size_t)r;
        tot_s += sc[p], tot_r += rcn[p];
    }
    float *hs = xmalloc(tot_s * 4), *hr = xmalloc(tot_r * 4), *hw = xmalloc(tot_r * 4);
    for (size_t i = 0; i < tot_s; i++)
        hs[i] = (float)(r * 100000 + (int)i);
    comm_alltoallv(world, hs, sc, hw, rcn, COMM_F32);
    float *ds = to_dev(hs, tot_s), *dr;
    CHECK_CUDA(cudaMalloc((void **)&dr, tot_r * 4));
    comm_alltoallv(nc, ds, sc, dr, rcn, COMM_F32);
    from_dev(hr, dr, tot_r * 4);
    int bad2 = memcmp(hr, hw, tot_r * 4) != 0;
    /* the ring's step: as many elements on every rank, within every rank's buffers (tot_s, tot_r >= 100 s) */
    const int next = (r + 1) % s, prev = (r - 1 + s) % s;
    const size_t ring_n = 100 * (size_t)s;
    comm_sendrecv(world, hs, ring_n, next, hw, ring_n, prev, COMM_F32);
    comm_sendrecv(nc, ds, ring_n, next, dr, ring_n, prev, COMM_F32);
    from_dev(hr, dr, ring_n * 4);
    bad2 += memcmp(hr, hw, ring_n * 4) != 0;
    comm_allreduce_sum(world, &bad2, 1, COMM_I32);
    if (r == 0)
        printf("nccl all-to-all (uneven) and send-receive on device memory over %d ranks: %s\n", s,
               bad2 ? "MISMATCH" : "equal to MPI");
    bad += bad2;
    cudaFree(ds), cudaFree(dr);
    free(sc), free(rcn), free(hs), free(hr), free(hw);
    cudaFree(d);
    comm_free(nc);
    comm_free(world);
    MPI_Finalize();
    return bad ? 1 : 0;
}

/* One ring-attention case of the --ring mode: a row of L tokens (cu: B sequences) over the world, on the CUDA
 * context G against the CPU path; 0 when every rank's output, lse, dq, dk, dv agree within 1e-5. */
static int ring_case(struct comm *world, struct kctx *G, int L, const int32_t *cu, int B, int Hq, int Hkv, int hd)
{
    struct kctx *C = kctx_cpu();
    struct ring_attn rc, rg;
    char why[256];
    if (ring_attn_plan(&rc, C, world, L, cu, B, NULL, 0, Hq, Hkv, hd, why, sizeof why) != 0 ||
        ring_attn_plan(&rg, G, world, L, cu, B, NULL, 0, Hq, Hkv, hd, why, sizeof why) != 0) {
        printf("ring attention L=%d: not planned: %s  FAIL\n", L, why);
        return 1;
    }
    const int n = rc.n, ldq = Hq * hd, ldk = Hkv * hd, r = comm_rank(world);
    const size_t qn = (size_t)n * ldq, kn = (size_t)n * ldk, ln = (size_t)n * Hq;
    rng = 0x1234567u + (uint64_t)L; /* the same whole row on every rank */
    float *q = rand_vec((size_t)L * ldq, -2, 2), *k = rand_vec((size_t)L * ldk, -1, 1);
    float *v = rand_vec((size_t)L * ldk, -1, 1), *dout = rand_vec((size_t)L * ldq, -1, 1);
    float *lq = xmalloc(qn * 4), *lk = xmalloc(kn * 4), *lv = xmalloc(kn * 4), *lg = xmalloc(qn * 4);
    ring_attn_take(&rc, lq, q, ldq), ring_attn_take(&rc, lk, k, ldk), ring_attn_take(&rc, lv, v, ldk);
    ring_attn_take(&rc, lg, dout, ldq);
    float *out = xmalloc(qn * 4), *lse = xmalloc(ln * 4), *dq = calloc(qn, 4), *dk = calloc(kn, 4);
    float *dv = calloc(kn, 4);
    ring_attn_forward(&rc, out, lse, lq, lk, lv);
    ring_attn_backward(&rc, dq, dk, dv, lg, out, lse, lq, lk, lv);
    float *gq = kputf(G, lq, qn), *gk = kputf(G, lk, kn), *gv = kputf(G, lv, kn), *gg = kputf(G, lg, qn);
    float *gout = kputf(G, out, qn), *glse = kputf(G, lse, ln), *gdq = kputf(G, dq, qn);
    float *gdk = kputf(G, dk, kn), *gdv = kputf(G, dv, kn);
    k_zero(G, gdq, qn * 4), k_zero(G, gdk, kn * 4), k_zero(G, gdv, kn * 4);
    ring_attn_forward(&rg, gout, glse, gq, gk, gv);
    ring_attn_backward(&rg, gdq, gdk, gdv, gg, gout, glse, gq, gk, gv);
    float *h = xmalloc((qn > kn ? qn : kn) * 4);
    double e[5];
    kget(G, h, gout, qn * 4), e[0] = err_of(h, out, NULL, qn);
    kget(G, h, glse, ln * 4), e[1] = err_of(h, lse, NULL, ln);
    kget(G, h, gdq, qn * 4), e[2] = err_of(h, dq, NULL, qn);
    kget(G, h, gdk, kn * 4), e[3] = err_of(h, dk, NULL, kn);
    kget(G, h, gdv, kn * 4), e[4] = err_of(h, dv, NULL, kn);
    int bad = 0;
    for (int i = 0; i < 5; i++)
        bad |= !(e[i] <= 1e-5);
    bad |= rg.stats.sent_bytes != rc.stats.sent_bytes;
    printf("  rank %d: ring attention C=%d L=%d B=%d Hq=%d Hkv=%d hd=%d on CUDA against the CPU path: out %.1e lse "
           "%.1e dq %.1e dk %.1e dv %.1e (bound 1e-5), %.0f bytes sent (CPU %.0f)%s\n",
           r, comm_size(world), L, B, Hq, Hkv, hd, e[0], e[1], e[2], e[3], e[4], rg.stats.sent_bytes,
           rc.stats.sent_bytes, bad ? "  FAIL" : "");
    kdrop(G, gq, qn * 4), kdrop(G, gk, kn * 4), kdrop(G, gv, kn * 4), kdrop(G, gg, qn * 4), kdrop(G, gout, qn * 4);
    kdrop(G, glse, ln * 4), kdrop(G, gdq, qn * 4), kdrop(G, gdk, kn * 4), kdrop(G, gdv, kn * 4);
    ring_attn_free(&rc), ring_attn_free(&rg);
    free(q), free(k), free(v), free(dout), free(lq), free(lk), free(lv), free(lg), free(out), free(lse), free(dq);
    free(dk), free(dv), free(h);
    return bad;
}

/* --ring (under mpirun, np >= 1): ring attention for context parallelism with its device path (ring_attn.h: the
 * CUDA back-end's block ops, the ring staged through host buffers over the MPI world) against the CPU path, every
 * rank on a CUDA context (ranks may share one GPU). Long packed rows of at least 2,048 tokens. */
static int test_ring(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    char dev[32], why[256];
    snprintf(dev, sizeof dev, "cuda:%d", comm_rank(world) % ndev);
    struct kctx *G = kctx_create(dev, KMM_F32, why, sizeof why);
    int bad = !G;
    if (G) {
        const int C2 = 2 * comm_size(world), L1 = 2048 / C2 * C2, L2 = 64 * C2;
        const int32_t one[2] = {0, L1}, packed[4] = {0, L1 / 3, L1 / 3 + 1, L1}, small[3] = {0, 5, L2};
        bad += ring_case(world, G, L1, one, 1, 4, 2, 64);
        bad += ring_case(world, G, L1, packed, 3, 2, 1, 128);
        bad += ring_case(world, G, L2, small, 2, 3, 3, 40);
        kctx_free(G);
    } else {
        printf("rank %d: %s: %s  FAIL\n", comm_rank(world), dev, why);
    }
    comm_allreduce_sum(world, &bad, 1, COMM_I32);
    if (comm_rank(world) == 0)
        printf("ring attention on CUDA over %d ranks: %d failure(s)\n", comm_size(world), bad);
    comm_free(world);
    MPI_Finalize();
    return bad ? 1 : 0;
}

/* --nccl-deadline (np 2): rank 1 never joins the all-reduce; rank 0, with a deadline of 2 s, must end the run
 * naming the collective instead of waiting for ever (test_nccl_deadline.sh reads its message). */
static int test_nccl_deadline(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    if (ndev < comm_size(world)) /* NCCL refuses two ranks on one GPU */
        return nccl_skip(world, ndev);
    struct comm *nc = comm_nccl_from(world, comm_rank(world) % ndev);
    comm_set_deadline(nc, 2.0);
    float *d = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d, 1024 * sizeof(float)));
    if (comm_rank(world) == 0) {
        comm_allreduce_sum(nc, d, 1024, COMM_F32); /* never completes: rank 1 is not there */
        printf("the all-reduce returned without its peer\n");
    } else {
        sleep(30); /* sleep-ok: a peer that never comes; rank 0 must have ended the job long before */
    }
    cudaFree(d);
    comm_free(nc);
    comm_free(world);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv)
{
    if (!kctx_cuda_available()) { /* asks the CUDA back-end first: nothing else of CUDA runs without a device */
        printf("no CUDA device visible: skipped\n");
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], "--nccl") == 0)
        return test_nccl(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--ring") == 0)
        return test_ring(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--nccl-deadline") == 0)
        return test_nccl_deadline(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--probe") == 0) { /* a device is visible (--probe N: N of them) */
        int n = 0;
        CHECK_CUDA(cudaGetDeviceCount(&n));
        return n >= (argc > 2 ? atoi(argv[2]) : 1) ? 0 : 77;
    }
    if (argc > 1 && strcmp(argv[1], "--kops") == 0) /* the back-end's ops only */
        return test_kops() ? 1 : 0;
    int bad = test_kernels();
    bad += test_kops();
    return bad ? 1 : 0;
}
