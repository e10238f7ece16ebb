/* GPU kernels against their CPU references, and the NCCL back-end against the
 * MPI one (--nccl, under mpirun). Exit 77 (skipped) without a visible GPU.
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
#include "worker/comm/comm.h"
#include "worker/trainer/optim.h"

static int have_gpu(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

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
    float *v = xmalloc(n * sizeof *v);
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

/* The CPU's sigmoid, for the error scales. */
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
        sout[i] = FLT_EPSILON * fabs(g * s * up[i]);
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

static int test_nccl(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
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
    cudaFree(d);
    comm_free(nc);
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
    struct comm *nc = comm_nccl_from(world, comm_rank(world) % ndev);
    comm_set_deadline(nc, 2.0);
    float *d = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d, 1024 * sizeof(float)));
    if (comm_rank(world) == 0) {
        comm_allreduce_sum(nc, d, 1024, COMM_F32); /* never completes: rank 1 is not there */
        printf("the all-reduce returned without its peer\n");
    } else {
        sleep(30); /* rank 0 must have ended the job long before */
    }
    cudaFree(d);
    comm_free(nc);
    comm_free(world);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv)
{
    if (!have_gpu()) {
        printf("no CUDA device visible: skipped\n");
        return 77;
    }
    if (argc > 1 && strcmp(argv[1], "--nccl") == 0)
        return test_nccl(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--nccl-deadline") == 0)
        return test_nccl_deadline(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--probe") == 0) /* a device is visible */
        return 0;
    return test_kernels();
}
