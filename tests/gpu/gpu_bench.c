/* Throughput of the CUDA back-end's heavy ops on one GPU, as table rows for scripts/gpu_check.sh:
 *   gpu_bench            GEMMs (linear forward + backward, fp32 and BF16) and attention (forward + backward) in
 *                        TFLOP/s and MFU against the H200's BF16 dense peak; KV-cache decode attention in bytes/s
 *                        against the H200's HBM bandwidth
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

static void bench_attention(int B, int L, int Hq, int Hkv, int hd, int iters)
{
    char why[256];
    struct kctx *K = kctx_create("cuda", KMM_F32, why, sizeof why);
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
    row("attention fwd (fp32 SIMT)", shape, sf * 1e3, tf, "TFLOP/s", 100.0 * tf / PEAK_BF16_TFLOPS);
    row("attention bwd (fp32 SIMT)", shape, sb * 1e3, tb, "TFLOP/s", 100.0 * tb / PEAK_BF16_TFLOPS);
    row("attention fwd+bwd", shape, (sf + sb) * 1e3, tt, "TFLOP/s", 100.0 * tt / PEAK_BF16_TFLOPS);
    k_free(K, cu, (size_t)(B + 1) * 4, KMEM_OTHER), k_free(K, q, nq * 4, KMEM_OTHER);
    k_free(K, k, nk * 4, KMEM_OTHER), k_free(K, v, nk * 4, KMEM_OTHER), k_free(K, dout, nq * 4, KMEM_OTHER);
    k_free(K, out, nq * 4, KMEM_OTHER), k_free(K, lse, (size_t)N * Hq * 4, KMEM_OTHER);
    k_free(K, dq, nq * 4, KMEM_OTHER), k_free(K, dk, nk * 4, KMEM_OTHER), k_free(K, dv, nk * 4, KMEM_OTHER);
    free(cu_h);
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
        bench_attention(2, 256, 4, 2, 64, 2);
        bench_decode(1024, 8, 2, 128, 5);
        return 0;
    }
    bench_linear(KMM_F32, 8192, 4096, 4096, 5);
    bench_linear(KMM_BF16, 8192, 4096, 4096, 10);
    bench_linear(KMM_BF16, 16384, 4096, 14336, 3); /* an MLP up-projection of an 8B model */
    bench_attention(4, 2048, 32, 8, 128, 3);
    bench_decode(8192, 32, 8, 128, 50);
    bench_decode(32768, 32, 8, 128, 20);
    return 0;
}
