/* Throughput of the CUDA back-end's heavy ops on one GPU, as table rows for scripts/gpu_check.sh:
 *   gpu_bench            GEMMs (linear forward + backward, fp32 and BF16) and attention (forward + backward, fp32
 *                        SIMT and BF16 tensor cores) in TFLOP/s and MFU against the H200's BF16 dense peak;
 *                        KV-cache decode attention in bytes/s
 *                        against the H200's HBM bandwidth
 *                        MoE layer (routing and experts, BF16) and ring attention's block in TFLOP/s
 *   gpu_bench --nccl     (under mpirun, one rank per GPU) NCCL all-reduce bus bandwidth
 *   gpu_bench --small    small shapes (a smoke run)
 * Each row: "ROW|what|shape|ms per call|value unit|% of peak". Exit 77 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/check_cuda.h"
#include "common/check_mpi.h"
#include "common/clock.h"
#include "kernels/kernels.h"
#include "worker/comm/comm_nccl.h"
#include "worker/comm/comm.h"

/* Names kops_cuda so that kernels/cuda/backend.c is linked in (kernels.c has weak stand-ins for its entry points). */
extern const struct kops kops_cuda;

/* H200 SXM: dense BF16 tensor-core peak 989 TFLOP/s (1979 with sparsity); HBM3e 4.8 TB/s. */
#define PEAK_BF16_TFLOPS 989.0
#define PEAK_HBM_TBS 4.8

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float urand(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* n random floats in [-a, a] in K's memory (filled on the host in pieces) */
static float *dev_rand(struct kctx *K, size_t n, float a)
{
    float *d = k_alloc(K, n * sizeof(float), KMEM_OTHER, "bench buffer");
    if (a == 0.0f) {
        k_zero(K, d, n * sizeof(float));
        return d;
    }
    enum { PIECE = 1 << 20 };
    float *h = xmalloc(PIECE * sizeof *h);
    for (size_t off = 0; off < n; off += PIECE) {
        size_t m = n - off < PIECE ? n - off : PIECE;
        for (size_t i = 0; i < m; i++)
            h[i] = a * urand();
        k_to_device(K, d + off, h, m * sizeof *h);
    }
    k_sync(K);
    free(h);
    return d;
}

static void row(const char *what, const char *shape, double ms, double value, const char *unit, double pct)
{
    printf("ROW|%s|%s|%.3f|%.1f %s|%.1f%%\n", what, shape, ms, value, unit, pct);
    fflush(stdout);
}

static void bench_linear(enum kmatmul mm, int N, int Din, int Dout, int iters)
{
    char why[256];
    struct kctx *K = kctx_create("cuda", mm, why, sizeof why);
    if (!K)
        check_failf(__FILE__, __LINE__, "%s", why);
    size_t nx = (size_t)N * Din, nw = (size_t)Dout * Din, ny = (size_t)N * Dout;
    float *x = dev_rand(K, nx, 1), *W = dev_rand(K, nw, 0.02f), *dy = dev_rand(K, ny, 1);
    float *y = dev_rand(K, ny, 0), *dx = dev_rand(K, nx, 0), *dW = dev_rand(K, nw, 0);
    for (int i = 0; i < 2; i++) { /* warm up: workspaces, cuBLAS heuristics */
        k_linear_forward(K, y, x, W, NULL, N, Din, Dout);
        k_linear_backward(K, dx, dW, NULL, dy, x, W, N, Din, Dout);
    }
    k_sync(K);
    double t0 = clock_now_s();
    for (int i = 0; i < iters; i++) {
        k_linear_forward(K, y, x, W, NULL, N, Din, Dout);
        k_linear_backward(K, dx, dW, NULL, dy, x, W, N, Din, Dout);
    }
    k_sync(K);
    double s = (clock_now_s() - t0) / iters, flops = 6.0 * N * Din * Dout; /* forward 2NDD', backward 4NDD' */
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d Din=%d Dout=%d", N, Din, Dout);
    double tf = flops / s / 1e12;
    row(mm == KMM_BF16 ? "linear fwd+bwd, BF16 GEMMs" : "linear fwd+bwd, fp32 GEMMs", shape, s * 1e3, tf, "TFLOP/s",
        100.0 * tf / PEAK_BF16_TFLOPS);
    k_free(K, x, nx * 4, KMEM_OTHER), k_free(K, W, nw * 4, KMEM_OTHER), k_free(K, dy, ny * 4, KMEM_OTHER);
    k_free(K, y, ny * 4, KMEM_OTHER), k_free(K, dx, nx * 4, KMEM_OTHER), k_free(K, dW, nw * 4, KMEM_OTHER);
    kctx_free(K);
}

/* Attention forward and backward over B sequences of L rows: a fp32 context runs the FP32 SIMT flash kernels, a BF16
 * one the tensor-core path (batched GEMMs over materialised scores, kernels/cuda/attention_tc.cu). */
static void bench_attention(enum kmatmul mm, int B, int L, int Hq, int Hkv, int hd, int iters)
{
    char why[256];
    struct kctx *K = kctx_create("cuda", mm, why, sizeof why);
    if (!K)
        check_failf(__FILE__, __LINE__, "%s", why);
    int N = B * L;
    size_t nq = (size_t)N * Hq * hd, nk = (size_t)N * Hkv * hd;
    int32_t *cu_h = xmalloc((size_t)(B + 1) * sizeof *cu_h);
    for (int b = 0; b <= B; b++)
        cu_h[b] = b * L;
    int32_t *cu = k_alloc(K, (size_t)(B + 1) * sizeof *cu, KMEM_OTHER, "cu_seqlens");
    k_to_device(K, cu, cu_h, (size_t)(B + 1) * sizeof *cu);
    float *q = dev_rand(K, nq, 1), *k = dev_rand(K, nk, 1), *v = dev_rand(K, nk, 1), *dout = dev_rand(K, nq, 1);
    float *out = dev_rand(K, nq, 0), *lse = dev_rand(K, (size_t)N * Hq, 0), *dq = dev_rand(K, nq, 0);
    float *dk = dev_rand(K, nk, 0), *dv = dev_rand(K, nk, 0);
    k_attention_forward(K, out, lse, q, k, v, cu, NULL, B, Hq, Hkv, hd);
    k_attention_backward(K, dq, dk, dv, dout, out, lse, q, k, v, cu, NULL, B, Hq, Hkv, hd);
    k_sync(K);
    /* causal: each query row sees (i + 1) keys; 2 products of 2 hd flops per (row, key) forward, 5 backward */
    double pairs = (double)B * Hq * ((double)L * (L + 1) / 2.0), ffw = 4.0 * hd * pairs, fbw = 10.0 * hd * pairs;
    double t0 = clock_now_s();
    for (int i = 0; i < iters; i++)
        k_attention_forward(K, out, lse, q, k, v, cu, NULL, B, Hq, Hkv, hd);
    k_sync(K);
    double sf = (clock_now_s() - t0) / iters;
    t0 = clock_now_s();
    for (int i = 0; i < iters; i++)
        k_attention_backward(K, dq, dk, dv, dout, out, lse, q, k, v, cu, NULL, B, Hq, Hkv, hd);
    k_sync(K);
    double sb = (clock_now_s() - t0) / iters;
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d L=%d Hq=%d Hkv=%d hd=%d", B, L, Hq, Hkv, hd);
    double tf = ffw / sf / 1e12, tb = fbw / sb / 1e12, tt = (ffw + fbw) / (sf + sb) / 1e12;
    const bool bf16 = mm == KMM_BF16;
    row(bf16 ? "attention fwd (BF16 tensor cores)" : "attention fwd (fp32 SIMT)", shape, sf * 1e3, tf, "TFLOP/s",
        100.0 * tf / PEAK_BF16_TFLOPS);
    row(bf16 ? "attention bwd (BF16 tensor cores)" : "attention bwd (fp32 SIMT)", shape, sb * 1e3, tb, "TFLOP/s",
        100.0 * tb / PEAK_BF16_TFLOPS);
    row(bf16 ? "attention fwd+bwd (BF16)" : "attention fwd+bwd", shape, (sf + sb) * 1e3, tt, "TFLOP/s",
        100.0 * tt / PEAK_BF16_TFLOPS);
    k_free(K, cu, (size_t)(B + 1) * 4, KMEM_OTHER), k_free(K, q, nq * 4, KMEM_OTHER);
    k_free(K, k, nk * 4, KMEM_OTHER), k_free(K, v, nk * 4, KMEM_OTHER), k_free(K, dout, nq * 4, KMEM_OTHER);
    k_free(K, out, nq * 4, KMEM_OTHER), k_free(K, lse, (size_t)N * Hq * 4, KMEM_OTHER);
    k_free(K, dq, nq * 4, KMEM_OTHER), k_free(K, dk, nk * 4, KMEM_OTHER), k_free(K, dv, nk * 4, KMEM_OTHER);
    free(cu_h);
    kctx_free(K);
}

/* A mixture-of-experts layer's experts (routing, gather, the per-expert GEMMs, combine) forward and backward on
 * random logits: TFLOP/s of the expert products (3 of 2 N k D F flops forward, twice that backward). */
static void bench_moe(enum kmatmul mm, int N, int E, int k, int D, int F, int iters)
{
    char why[256];
    struct kctx *K = kctx_create("cuda", mm, why, sizeof why);
    if (!K)
        check_failf(__FILE__, __LINE__, "%s", why);
    const size_t nw = (size_t)E * F * D, nx = (size_t)N * D, nk = (size_t)N * k;
    float *lg = dev_rand(K, (size_t)N * E, 2), *x = dev_rand(K, nx, 1), *dy = dev_rand(K, nx, 1);
    float *Wg = dev_rand(K, nw, 0.05f), *Wu = dev_rand(K, nw, 0.05f), *Wd = dev_rand(K, nw, 0.05f);
    float *dWg = dev_rand(K, nw, 0), *dWu = dev_rand(K, nw, 0), *dWd = dev_rand(K, nw, 0);
    float *y = dev_rand(K, nx, 0), *dx = dev_rand(K, nx, 0), *dwt = dev_rand(K, nk, 0);
    struct kmoe r = {.N = N, .E = E, .k = k, .D = D, .F = F, .norm_topk = true};
    struct karena plan, ar;
    karena_init_counter(&plan);
    kmoe_take(&plan, &r, true);
    karena_init(&ar, K, KMEM_ACTS, "moe bench");
    karena_reserve(&ar, plan.used, 0);
    kmoe_take(&ar, &r, true);
    k_moe_route(K, &r, lg); /* warm-up */
    k_moe_experts_forward(K, y, x, Wg, Wu, Wd, &r);
    k_moe_experts_backward(K, dx, dWg, dWu, dWd, dwt, dy, Wg, Wu, Wd, &r);
    k_sync(K);
    double t0 = clock_now_s();
    for (int i = 0; i < iters; i++) {
        k_moe_route(K, &r, lg);
        k_moe_experts_forward(K, y, x, Wg, Wu, Wd, &r);
    }
    k_sync(K);
    const double sf = (clock_now_s() - t0) / iters;
    t0 = clock_now_s();
    for (int i = 0; i < iters; i++)
        k_moe_experts_backward(K, dx, dWg, dWu, dWd, dwt, dy, Wg, Wu, Wd, &r);
    k_sync(K);
    const double sb = (clock_now_s() - t0) / iters, ff = 6.0 * nk * D * F, fb = 2.0 * ff;
    char shape[96], what[64];
    snprintf(shape, sizeof shape, "N=%d E=%d k=%d D=%d F=%d", N, E, k, D, F);
    snprintf(what, sizeof what, "MoE route+experts fwd (%s)", mm == KMM_BF16 ? "BF16" : "fp32");
    row(what, shape, sf * 1e3, ff / sf / 1e12, "TFLOP/s", 100.0 * ff / sf / 1e12 / PEAK_BF16_TFLOPS);
    snprintf(what, sizeof what, "MoE experts bwd (%s)", mm == KMM_BF16 ? "BF16" : "fp32");
    row(what, shape, sb * 1e3, fb / sb / 1e12, "TFLOP/s", 100.0 * fb / sb / 1e12 / PEAK_BF16_TFLOPS);
    karena_release(&ar);
    k_free(K, lg, (size_t)N * E * 4, KMEM_OTHER), k_free(K, x, nx * 4, KMEM_OTHER), k_free(K, dy, nx * 4, KMEM_OTHER);
    k_free(K, Wg, nw * 4, KMEM_OTHER), k_free(K, Wu, nw * 4, KMEM_OTHER), k_free(K, Wd, nw * 4, KMEM_OTHER);
    k_free(K, dWg, nw * 4, KMEM_OTHER), k_free(K, dWu, nw * 4, KMEM_OTHER), k_free(K, dWd, nw * 4, KMEM_OTHER);
    k_free(K, y, nx * 4, KMEM_OTHER), k_free(K, dx, nx * 4, KMEM_OTHER), k_free(K, dwt, nk * 4, KMEM_OTHER);
    kctx_free(K);
}

/* Ring attention's visiting block (context parallelism): nq queries against nk keys of one sequence, no causal
 * cut, forward and backward (the simple first kernels: one warp per row and head). */
static void bench_block(int nq, int nk, int Hq, int Hkv, int hd, int iters)
{
    char why[256];
    struct kctx *K = kctx_create("cuda", KMM_F32, why, sizeof why);
    if (!K)
        check_failf(__FILE__, __LINE__, "%s", why);
    const size_t qn = (size_t)nq * Hq * hd, kn = (size_t)nk * Hkv * hd, ln = (size_t)nq * Hq;
    float *q = dev_rand(K, qn, 1), *k = dev_rand(K, kn, 1), *v = dev_rand(K, kn, 1), *dout = dev_rand(K, qn, 1);
    float *po = dev_rand(K, qn, 0), *plse = dev_rand(K, ln, 0), *drow = dev_rand(K, ln, 0);
    float *dq = dev_rand(K, qn, 0), *dk = dev_rand(K, kn, 0), *dv = dev_rand(K, kn, 0);
    const size_t ns = (size_t)(nq > nk ? nq : nk);
    int32_t *seq = k_calloc(K, ns * 4, KMEM_OTHER, "sequence ids"); /* one sequence: every id 0 */
    k_attention_block_forward(K, po, plse, q, k, v, seq, seq, nq, nk, Hq, Hkv, hd);
    k_attention_drow(K, drow, dout, po, nq, Hq, hd);
    k_attention_block_backward(K, dq, dk, dv, dout, plse, drow, q, k, v, seq, seq, nq, nk, Hq, Hkv, hd);
    k_sync(K);
    const double pairs = (double)nq * nk * Hq, ff = 4.0 * hd * pairs, fb = 10.0 * hd * pairs;
    double t0 = clock_now_s();
    for (int i = 0; i < iters; i++)
        k_attention_block_forward(K, po, plse, q, k, v, seq, seq, nq, nk, Hq, Hkv, hd);
    k_sync(K);
    const double sf = (clock_now_s() - t0) / iters;
    t0 = clock_now_s();
    for (int i = 0; i < iters; i++)
        k_attention_block_backward(K, dq, dk, dv, dout, plse, drow, q, k, v, seq, seq, nq, nk, Hq, Hkv, hd);
    k_sync(K);
    const double sb = (clock_now_s() - t0) / iters;
    char shape[96];
    snprintf(shape, sizeof shape, "nq=%d nk=%d Hq=%d Hkv=%d hd=%d", nq, nk, Hq, Hkv, hd);
    row("ring block fwd (fp32, first version)", shape, sf * 1e3, ff / sf / 1e12, "TFLOP/s",
        100.0 * ff / sf / 1e12 / PEAK_BF16_TFLOPS);
    row("ring block bwd (fp32, first version)", shape, sb * 1e3, fb / sb / 1e12, "TFLOP/s",
        100.0 * fb / sb / 1e12 / PEAK_BF16_TFLOPS);
    k_free(K, q, qn * 4, KMEM_OTHER), k_free(K, k, kn * 4, KMEM_OTHER), k_free(K, v, kn * 4, KMEM_OTHER);
    k_free(K, dout, qn * 4, KMEM_OTHER), k_free(K, po, qn * 4, KMEM_OTHER), k_free(K, plse, ln * 4, KMEM_OTHER);
    k_free(K, drow, ln * 4, KMEM_OTHER), k_free(K, dq, qn * 4, KMEM_OTHER), k_free(K, dk, kn * 4, KMEM_OTHER);
    k_free(K, dv, kn * 4, KMEM_OTHER), k_free(K, seq, ns * 4, KMEM_OTHER);
    kctx_free(K);
}

static void bench_decode(int Tk, int Hq, int Hkv, int hd, int iters)
{
    char why[256];
    struct kctx *K = kctx_create("cuda", KMM_F32, why, sizeof why);
    if (!K)
        check_failf(__FILE__, __LINE__, "%s", why);
    size_t nq = (size_t)Hq * hd, nk = (size_t)Tk * Hkv * hd;
    float *q = dev_rand(K, nq, 1), *kc = dev_rand(K, nk, 1), *vc = dev_rand(K, nk, 1), *out = dev_rand(K, nq, 0);
    for (int i = 0; i < 3; i++)
        k_attention_cached(K, out, q, kc, vc, 1, Tk, Hq, Hkv, hd);
    k_sync(K);
    double t0 = clock_now_s();
    for (int i = 0; i < iters; i++)
        k_attention_cached(K, out, q, kc, vc, 1, Tk, Hq, Hkv, hd);
    k_sync(K);
    double s = (clock_now_s() - t0) / iters,
           bytes = 2.0 * (double)nk * sizeof(float); /* the K and V caches, read once */
    char shape[96];
    snprintf(shape, sizeof shape, "Tq=1 Tk=%d Hq=%d Hkv=%d hd=%d", Tk, Hq, Hkv, hd);
    double tbs = bytes / s / 1e12;
    row("attention_cached decode (fp32 KV)", shape, s * 1e3, tbs * 1e3, "GB/s", 100.0 * tbs / PEAK_HBM_TBS);
    k_free(K, q, nq * 4, KMEM_OTHER), k_free(K, kc, nk * 4, KMEM_OTHER), k_free(K, vc, nk * 4, KMEM_OTHER);
    k_free(K, out, nq * 4, KMEM_OTHER);
    kctx_free(K);
}

static int bench_nccl(int argc, char **argv, int small)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    int ndev = 0;
    CHECK_CUDA(cudaGetDeviceCount(&ndev));
    int r = comm_rank(world), n = comm_size(world);
    CHECK_CUDA(cudaSetDevice(r % ndev));
    struct comm *nc = comm_nccl_from(world, r % ndev);
    size_t count = small ? (size_t)1 << 20 : (size_t)1 << 26; /* 4 MiB or 256 MiB of floats */
    float *d = NULL;
    CHECK_CUDA(cudaMalloc((void **)&d, count * sizeof *d));
    CHECK_CUDA(cudaMemset(d, 0, count * sizeof *d));
    for (int i = 0; i < 3; i++)
        comm_allreduce_sum(nc, d, count, COMM_F32);
    const int iters = small ? 5 : 20;
    comm_barrier(world);
    double t0 = clock_now_s();
    for (int i = 0; i < iters; i++)
        comm_allreduce_sum(nc, d, count, COMM_F32); /* blocking: the back-end synchronises its stream */
    double s = (clock_now_s() - t0) / iters;
    comm_allreduce_sum(world, &s, 1, COMM_F64);
    s /= n;
    double bytes = (double)count * sizeof *d, busbw = bytes / s * 2.0 * (n - 1) / n / 1e9;
    if (r == 0) {
        char shape[64];
        snprintf(shape, sizeof shape, "np=%d, %.0f MiB fp32", n, bytes / (1 << 20));
        /* NVLink 4 on H200: 450 GB/s each way per GPU */
        row("NCCL all-reduce bus bandwidth", shape, s * 1e3, busbw, "GB/s", 100.0 * busbw / 450.0);
    }
    cudaFree(d);
    comm_free(nc);
    comm_free(world);
    MPI_Finalize();
    return 0;
}

int main(int argc, char **argv)
{
    int small = 0, nccl = 0;
    for (int i = 1; i < argc; i++) {
        small |= strcmp(argv[i], "--small") == 0;
        nccl |= strcmp(argv[i], "--nccl") == 0;
    }
    if (!kctx_cuda_available()) {
        printf("no CUDA device visible: skipped\n");
        return 77;
    }
    if (nccl)
        return bench_nccl(argc, argv, small);
    (void)kops_cuda.name;
    if (small) {
        bench_linear(KMM_F32, 512, 512, 512, 3);
        bench_linear(KMM_BF16, 512, 512, 512, 3);
        bench_attention(KMM_F32, 2, 256, 4, 2, 64, 2);
        bench_attention(KMM_BF16, 2, 256, 4, 2, 64, 2);
        bench_decode(1024, 8, 2, 128, 5);
        bench_moe(KMM_BF16, 256, 8, 2, 256, 128, 2);
        bench_block(256, 256, 4, 2, 64, 2);
        return 0;
    }
    bench_linear(KMM_F32, 8192, 4096, 4096, 5);
    bench_linear(KMM_BF16, 8192, 4096, 4096, 10);
    bench_linear(KMM_BF16, 16384, 4096, 14336, 3); /* an MLP up-projection of an 8B model */
    bench_attention(KMM_F32, 4, 2048, 32, 8, 128, 3);
    bench_attention(KMM_BF16, 4, 2048, 32, 8, 128, 3);
    bench_decode(8192, 32, 8, 128, 50);
    bench_decode(32768, 32, 8, 128, 20);
    /* a Qwen3-30B-A3B MoE layer (128 experts, 8 per token, hidden 2048, expert intermediate 768), 4,096 tokens */
    bench_moe(KMM_BF16, 4096, 128, 8, 2048, 768, 3);
    bench_block(2048, 2048, 32, 8, 128, 2); /* 2,048 queries against 2,048 keys, an 8B model's heads */
    return 0;
}
