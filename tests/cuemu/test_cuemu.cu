// The emulator itself (tests/cuemu/README.md), against host loops and hand-worked values:
//  - what kernels rely on: thread, block and grid indices; __syncthreads and its _or/_count forms; the warp
//    shuffles and ballots; dynamic shared memory; template and function-pointer launches;
//  - a race (a read of shared memory before the barrier that orders it) gives a result that changes with
//    CUEMU_ORDER, which is how the gpu suite's second pass finds races;
//  - refusals, as error codes with a message: a host pointer as a kernel argument, block and grid limits, dynamic
//    shared memory past 48 KiB without the attribute, copies in the wrong direction or past an allocation, memory
//    past CUEMU_DEVICE_MEMORY;
//  - faults that stop the process, each in a child that must die with the right message: divergent __syncthreads,
//    a write past the end of device memory and of dynamic shared memory, a shuffle naming a lane that left, host
//    code reading device memory;
//  - cublasGemmEx in every transpose against a host loop, and its argument checks; cublasGemmStridedBatchedEx on
//    interleaved BF16 entries against a loop per entry, and its refusals; BF16 rounding; CUB's sort;
//  - stream capture: a captured kernel, copy, set and GEMM run nothing until the graph launches, then give what
//    eager work gives, each launch once more, a launch counted once; and the calls CUDA refuses during a capture
//    are refused with CUDA's errors and invalidate it (cudaMalloc, a synchronous cudaMemcpy, a synchronisation of
//    the capturing stream, the end in another thread), those it allows are not (relaxed mode, a non-blocking
//    stream beside the legacy one).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cub/device/device_segmented_radix_sort.cuh>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <thread>

namespace
{

int failures = 0;

void expect(bool ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok)
        failures++;
}

// ---- kernels ----

__global__ void index_kernel(int *out)
{
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + t] = (int)(b * 1000 + t);
}

// a block sum through shared memory, then every thread writes it
__global__ void block_sum_kernel(float *out, const float *x, int n)
{
    __shared__ float part[1024];
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        v += x[i];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    out[threadIdx.x] = part[0];
}

// the same sum with the first barrier missing: which partial sums are in place when thread 0 starts adding
// depends on the order threads run in
__global__ void racy_sum_kernel(float *out, const float *x)
{
    __shared__ float part[256];
    part[threadIdx.x] = x[threadIdx.x];
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int i = 0; i < 256; i++)
            s += part[i];
        out[0] = s;
    }
}

__global__ void warp_kernel(int *sum, unsigned *ballot, int *scan, int *bcast, int *down)
{
    int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    int v = lane + 1;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    sum[threadIdx.x] = v;
    ballot[threadIdx.x] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    int s = lane + 1; // inclusive scan with __shfl_up_sync
    for (int o = 1; o < 32; o <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, s, (unsigned)o);
        if (lane >= o)
            s += t;
    }
    scan[threadIdx.x] = s;
    bcast[threadIdx.x] = __shfl_sync(0xffffffffu, lane * 10 + w, 5);
    down[threadIdx.x] = __shfl_down_sync(0xffffffffu, lane, 3u);
}

__global__ void vote_kernel(int *out)
{
    int any = __syncthreads_or(threadIdx.x == 77);
    int count = __syncthreads_count(threadIdx.x % 4 == 0);
    int all = __syncthreads_and(threadIdx.x < 1000);
    if (threadIdx.x == 0) {
        out[0] = any;
        out[1] = count;
        out[2] = all;
    }
}

__global__ void smem_kernel(float *out, int n)
{
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        buf[i] = (float)(i * 2 + blockIdx.x);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        out[(size_t)blockIdx.x * n + i] = buf[n - 1 - i];
}

template <int K> __global__ void scale_kernel(float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] *= (float)K;
}

template <class... P> void launch_through(void (*kernel)(P...), int n, P... args)
{
    kernel<<<(n + 127) / 128, 128>>>(args...);
}

__global__ void divergent_kernel(int *out)
{
    if (threadIdx.x < 16)
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void overrun_kernel(float *y, int n)
{
    y[n + threadIdx.x * 64] = 1.0f; // thread 0 writes one past the end; later threads well past it
}

__global__ void smem_overrun_kernel(int n)
{
    extern __shared__ float buf[];
    buf[n + 8] = 1.0f; // 32 bytes past the end: in the guard page
}

__global__ void left_lane_kernel(int *out)
{
    if (threadIdx.x % 32 == 7)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

// ---- helpers ----

template <class T> T *dev(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        exit(1);
    }
    return (T *)p;
}

template <class T> void up(T *d, const T *h, size_t n) { cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice); }
template <class T> void down(T *h, const T *d, size_t n) { cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost); }

// run f in a child; true when it died by a signal and its stderr holds want
template <class F> bool dies_saying(F f, const char *want)
{
    char path[] = "/tmp/cuemu-death-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return false;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 2);
        signal(SIGABRT, SIG_DFL);
        f();
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    char buf[8192] = {0};
    lseek(fd, 0, SEEK_SET);
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    unlink(path);
    if (got < 0)
        got = 0;
    buf[got] = 0;
    bool ok = WIFSIGNALED(st) && strstr(buf, want) != NULL;
    if (!ok)
        fprintf(stderr, "  the child (status 0x%x) said: %s\n", st, buf);
    return ok;
}

void test_indices()
{
    dim3 grid(3, 2, 2), block(4, 3, 2);
    int nt = 24, nb = 12;
    int *d = dev<int>((size_t)nt * nb);
    index_kernel<<<grid, block>>>(d);
    expect(cudaGetLastError() == cudaSuccess, "a 3-D grid of 3-D blocks launches");
    int h[288];
    down(h, d, 288);
    bool ok = true;
    for (int b = 0; b < nb; b++)
        for (int t = 0; t < nt; t++)
            ok &= h[b * nt + t] == b * 1000 + t;
    expect(ok, "threadIdx, blockIdx, blockDim and gridDim are CUDA's (x fastest)");
    cudaFree(d);
}

void test_block_sum()
{
    const int n = 1000;
    float h[n], out[256];
    double want = 0;
    for (int i = 0; i < n; i++) {
        h[i] = (float)((i * 37) % 101) - 50.0f;
        want += h[i];
    }
    float *x = dev<float>(n), *y = dev<float>(256);
    up(x, h, n);
    block_sum_kernel<<<1, 256>>>(y, x, n);
    down(out, y, 256);
    bool ok = true;
    for (int i = 0; i < 256; i++)
        ok &= out[i] == (float)want;
    expect(ok, "a shared-memory tree sum behind __syncthreads gives every thread the sum");
    cudaFree(x);
    cudaFree(y);
}

void test_race_shows()
{
    float h[256], r[3];
    for (int i = 0; i < 256; i++)
        h[i] = 1.0f;
    float *x = dev<float>(256), *y = dev<float>(1);
    up(x, h, 256);
    const char *orders[3] = {"forward", "reverse", "random"};
    for (int i = 0; i < 3; i++) {
        setenv("CUEMU_ORDER", orders[i], 1);
        cudaMemset(y, 0, sizeof(float));
        racy_sum_kernel<<<1, 256>>>(y, x);
        down(&r[i], y, 1);
    }
    unsetenv("CUEMU_ORDER");
    printf("     racy sum of 256 ones: forward %g, reverse %g, random %g\n", r[0], r[1], r[2]);
    expect(r[0] != r[1], "a missing __syncthreads gives a different result in forward and reverse order");
    cudaFree(x);
    cudaFree(y);
}

void test_warp()
{
    int *sum = dev<int>(64), *scan = dev<int>(64), *bc = dev<int>(64), *dn = dev<int>(64);
    unsigned *bal = dev<unsigned>(64);
    warp_kernel<<<1, 64>>>(sum, bal, scan, bc, dn);
    int hs[64], hsc[64], hb[64], hd[64];
    unsigned hbal[64];
    down(hs, sum, 64);
    down(hsc, scan, 64);
    down(hb, bc, 64);
    down(hd, dn, 64);
    down(hbal, bal, 64);
    unsigned want_bal = 0;
    for (int l = 0; l < 32; l += 3)
        want_bal |= 1u << l;
    bool s_ok = true, sc_ok = true, b_ok = true, d_ok = true, bal_ok = true;
    for (int t = 0; t < 64; t++) {
        int lane = t % 32, w = t / 32;
        s_ok &= hs[t] == 528; // 1 + ... + 32
        sc_ok &= hsc[t] == (lane + 1) * (lane + 2) / 2;
        b_ok &= hb[t] == 50 + w;
        d_ok &= hd[t] == (lane + 3 < 32 ? lane + 3 : lane);
        bal_ok &= hbal[t] == want_bal;
    }
    expect(s_ok, "__shfl_xor_sync butterfly sums a warp");
    expect(sc_ok, "__shfl_up_sync gives an inclusive scan");
    expect(b_ok, "__shfl_sync broadcasts lane 5 within each warp");
    expect(d_ok, "__shfl_down_sync reads lane + 3, its own value past the warp's end");
    expect(bal_ok, "__ballot_sync sets the bits of the lanes whose predicate holds");
    int *v = dev<int>(3), hv[3];
    vote_kernel<<<1, 1000>>>(v);
    down(hv, v, 3);
    expect(hv[0] == 1 && hv[1] == 250 && hv[2] == 1, "__syncthreads_or, _count and _and over 1000 threads");
    cudaFree(sum);
    cudaFree(scan);
    cudaFree(bc);
    cudaFree(dn);
    cudaFree(bal);
    cudaFree(v);
}

void test_smem_and_templates()
{
    const int n = 300;
    float *y = dev<float>(2 * n), h[2 * n];
    smem_kernel<<<2, 64, n * sizeof(float)>>>(y, n);
    expect(cudaGetLastError() == cudaSuccess, "a launch with dynamic shared memory");
    down(h, y, 2 * n);
    bool ok = true;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < n; i++)
            ok &= h[b * n + i] == (float)((n - 1 - i) * 2 + b);
    expect(ok, "extern __shared__ is the launch's dynamic shared memory, per block");
    for (int i = 0; i < 2 * n; i++)
        h[i] = 1.0f;
    up(y, h, 2 * n);
    scale_kernel<3><<<(2 * n + 127) / 128, 128>>>(y, 2 * n);
    launch_through(scale_kernel<5>, 2 * n, y, 2 * n);
    down(h, y, 2 * n);
    ok = true;
    for (int i = 0; i < 2 * n; i++)
        ok &= h[i] == 15.0f;
    expect(ok, "a template kernel, and one launched through a function pointer");
    cudaFree(y);
}

void test_refusals()
{
    float host[4] = {0};
    float *d = dev<float>(4);
    scale_kernel<2><<<1, 4>>>(host, 4);
    expect(cudaGetLastError() == cudaErrorInvalidValue, "a host pointer as a kernel argument is refused");
    scale_kernel<2><<<1, 2048>>>(d, 4);
    expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "a block of 2048 threads is refused");
    scale_kernel<2><<<dim3(1, 70000), 32>>>(d, 4);
    expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "a grid with y = 70000 is refused");
    smem_kernel<<<1, 32, 64 * 1024>>>(d, 4);
    expect(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB of dynamic shared memory without the opt-in");
    expect(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess,
           "cudaFuncSetAttribute raises the limit");
    smem_kernel<<<1, 32, 64 * 1024>>>(d, 4);
    expect(cudaGetLastError() == cudaSuccess, "and then 64 KiB launches");
    expect(cudaMemcpy(d, host, sizeof host, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
           "a copy whose kind has the direction backwards is refused");
    expect(cudaMemcpy(d, host, 2 * sizeof host, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
           "a copy past the end of the allocation is refused");
    (void)cudaGetLastError();
    setenv("CUEMU_DEVICE_MEMORY", "1048576", 1);
    void *big = NULL;
    expect(cudaMalloc(&big, 2 << 20) == cudaErrorMemoryAllocation && big == NULL,
           "cudaMalloc past CUEMU_DEVICE_MEMORY fails with out of memory");
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    expect(total == 1048576 && free_b == total - 4 * sizeof(float), "cudaMemGetInfo counts what is allocated");
    unsetenv("CUEMU_DEVICE_MEMORY");
    (void)cudaGetLastError();
    struct cudaPointerAttributes a;
    cudaPointerGetAttributes(&a, d + 2);
    bool dev_ok = a.type == cudaMemoryTypeDevice;
    cudaPointerGetAttributes(&a, host);
    expect(dev_ok && a.type == cudaMemoryTypeUnregistered, "cudaPointerGetAttributes tells device from host memory");
    cudaFree(d);
}

void test_faults()
{
    expect(dies_saying(
               [] {
                   int *o = dev<int>(64);
                   divergent_kernel<<<1, 64>>>(o);
               },
               "no barrier can open"),
           "a __syncthreads that half the block skips stops the process, saying so");
    expect(dies_saying(
               [] {
                   float *y = dev<float>(100);
                   overrun_kernel<<<1, 32>>>(y, 100);
               },
               "past the end of the device allocation of 400 bytes"),
           "a write past the end of device memory stops the process at the access, naming the allocation");
    expect(dies_saying(
               [] {
                   float *y = dev<float>(8);
                   cudaMemset(y, 0, 8 * sizeof(float));
                   printf("%g\n", (double)y[3]); // host code reading device memory
               },
               "host code touched device memory"),
           "host code reading device memory stops the process, as on a GPU");
    expect(dies_saying([] { smem_overrun_kernel<<<1, 1, 4096>>>(1024); }, "dynamic shared memory"),
           "a write past dynamic shared memory stops the process");
    expect(dies_saying(
               [] {
                   int *o = dev<int>(32);
                   left_lane_kernel<<<1, 32>>>(o);
               },
               "which has exited"),
           "a shuffle whose mask names a lane that returned stops the process");
}

void test_cublas()
{
    cublasHandle_t h;
    cublasCreate(&h);
    const int m = 5, n = 4, k = 3;
    // op(A) (m, k), op(B) (k, n), column-major; A stored (k, m) when transposed
    float A[32], B[32], C[40], ref[40];
    for (int i = 0; i < 32; i++) {
        A[i] = (float)(i % 7) - 3.0f;
        B[i] = (float)(i % 5) * 0.5f - 1.0f;
    }
    float *dA = dev<float>(32), *dB = dev<float>(32), *dC = dev<float>(40);
    up(dA, A, 32);
    up(dB, B, 32);
    bool ok = true;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = ta ? k + 1 : m + 1, ldb = tb ? n : k, ldc = m + 2;
            for (int i = 0; i < 40; i++)
                C[i] = (float)i;
            up(dC, C, 40);
            float alpha = 2.0f, beta = 0.5f;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    float s = 0.0f;
                    for (int p = 0; p < k; p++)
                        s += (ta ? A[i * lda + p] : A[p * lda + i]) * (tb ? B[p * ldb + j] : B[j * ldb + p]);
                    ref[j * ldc + i] = alpha * s + beta * C[j * ldc + i];
                }
            cublasStatus_t st = cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                             &alpha, dA, CUDA_R_32F, lda, dB, CUDA_R_32F, ldb, &beta, dC, CUDA_R_32F,
                                             ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            float got[40];
            down(got, dC, 40);
            ok &= st == CUBLAS_STATUS_SUCCESS;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++)
                    ok &= got[j * ldc + i] == ref[j * ldc + i]; // small integers and halves: exact
            for (int j = 0; j < n; j++)
                for (int i = m; i < ldc; i++)
                    ok &= got[j * ldc + i] == C[j * ldc + i]; // the padding rows untouched
        }
    expect(ok, "cublasGemmEx in all four transposes matches a host loop, padding untouched");
    float one = 1.0f, zero = 0.0f;
    expect(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, m - 1, dB, CUDA_R_32F, k, &zero, dC,
                        CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
           "cublasGemmEx refuses lda below the rows of A");
    expect(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_32F, m, dB, CUDA_R_32F, k, &zero, dC,
                        CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
           "cublasGemmEx refuses a host matrix");
    cublasDestroy(h);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
}

// cublasGemmStridedBatchedEx against a triple loop per entry, in double from the BF16 values: entries interleaved as
// attention's heads are (A's entries hd apart in rows of H hd, C's columns likewise), in all four transposes with
// beta 1, the elements between C's entries untouched; then its refusals.
void test_cublas_batched()
{
    cublasHandle_t h;
    cublasCreate(&h);
    const int m = 5, n = 3, k = 4, batch = 3, d = 8, H = batch * d; // each operand's entries d apart in rows of H
    const int na = 40 * H, nc = 16 * H;
    __nv_bfloat16 A[40 * H], B[40 * H];
    float Av[40 * H], Bv[40 * H], C0[16 * H];
    for (int i = 0; i < na; i++) {
        A[i] = __float2bfloat16_rn((float)((i * 7) % 13 - 6) * 0.375f);
        B[i] = __float2bfloat16_rn((float)((i * 5) % 11 - 5) * 1.25f + 1.0f / 64);
        Av[i] = __bfloat162float(A[i]);
        Bv[i] = __bfloat162float(B[i]);
    }
    for (int i = 0; i < nc; i++)
        C0[i] = (float)(i % 9) - 4.0f;
    __nv_bfloat16 *dA = dev<__nv_bfloat16>(na), *dB = dev<__nv_bfloat16>(na);
    float *dC = dev<float>(nc);
    up(dA, A, na);
    up(dB, B, na);
    bool ok = true;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            up(dC, C0, nc);
            const float alpha = 0.5f, beta = 1.0f;
            cublasStatus_t st = cublasGemmStridedBatchedEx(
                h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, H,
                d, dB, CUDA_R_16BF, H, d, &beta, dC, CUDA_R_32F, H, d, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            float got[16 * H], want[16 * H];
            down(got, dC, nc);
            memcpy(want, C0, sizeof want);
            for (int e = 0; e < batch; e++) // entry e's op(A) (m, k), op(B) (k, n), C (m, n): column-major, ld H
                for (int j = 0; j < n; j++)
                    for (int i = 0; i < m; i++) {
                        double s = 0.0;
                        for (int p = 0; p < k; p++)
                            s += (double)Av[e * d + (ta ? i * H + p : p * H + i)] *
                                 Bv[e * d + (tb ? p * H + j : j * H + p)];
                        float *w = &want[e * d + j * H + i];
                        *w = (float)(alpha * s + (double)beta * *w);
                    }
            ok &= st == CUBLAS_STATUS_SUCCESS && memcmp(got, want, sizeof got) == 0;
        }
    expect(ok, "cublasGemmStridedBatchedEx on interleaved BF16 entries matches a loop per entry, the rest untouched");
    float one = 1.0f, zero = 0.0f;
    expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, H, d, dB,
                                      CUDA_R_16BF, H, d, &zero, dC, CUDA_R_32F, H, m - 1, batch, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
           "cublasGemmStridedBatchedEx refuses batch entries of C that share an element");
    expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, H, na, dB,
                                      CUDA_R_16BF, H, d, &zero, dC, CUDA_R_32F, H, d, 2, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
           "cublasGemmStridedBatchedEx refuses an entry past the end of A's memory");
    expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, H, d, dB, CUDA_R_32F,
                                      H, d, &zero, dC, CUDA_R_32F, H, d, batch, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
           "cublasGemmStridedBatchedEx refuses A and B of different types");
    expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, H, d, dB,
                                      CUDA_R_16BF, H, d, &zero, dC, CUDA_R_32F, H, d, -1, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
           "cublasGemmStridedBatchedEx refuses a negative batch count");
    cublasDestroy(h);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
}

void test_bf16_and_sort()
{
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1); 1 + 3 * 2^-8 rounds up to 1 + 2^-6
    float a = 1.0f + 1.0f / 256, b = 1.0f + 3.0f / 256;
    expect(__bfloat162float(__float2bfloat16_rn(a)) == 1.0f &&
               __bfloat162float(__float2bfloat16_rn(b)) == 1.0f + 1.0f / 64 && __float2bfloat16_rn(-2.0f).__x == 0xc000,
           "BF16 rounds to nearest even");
    float nan = NAN;
    expect(__bfloat162float(__float2bfloat16_rn(nan)) != __bfloat162float(__float2bfloat16_rn(nan)),
           "BF16 keeps a NaN a NaN");
    uint64_t keys[7] = {5, 9, 1, 7, 7, 3, 2}, out[7];
    int offs[3] = {0, 4, 7};
    uint64_t *dk = dev<uint64_t>(7), *dout = dev<uint64_t>(7);
    int *doffs = dev<int>(3);
    up(dk, keys, 7);
    up(doffs, offs, 3);
    size_t temp_bytes = 0;
    cub::DeviceSegmentedRadixSort::SortKeysDescending(nullptr, temp_bytes, (const uint64_t *)dk, dout, 7, 2, doffs,
                                                      doffs + 1);
    void *temp = dev<char>(temp_bytes);
    cudaError_t rc = cub::DeviceSegmentedRadixSort::SortKeysDescending(temp, temp_bytes, (const uint64_t *)dk, dout, 7,
                                                                       2, doffs, doffs + 1);
    down(out, dout, 7);
    uint64_t want[7] = {9, 7, 5, 1, 7, 3, 2};
    expect(rc == cudaSuccess && memcmp(out, want, sizeof want) == 0, "CUB's segmented sort, descending per segment");
}

// a captured sequence: y = 3 (x + y) through a copy, a set, a kernel and a GEMM, against the same done eagerly
void captured_work(cudaStream_t s, cublasHandle_t h, float *x, float *y, float *t, int n)
{
    const float one = 1.0f, three = 3.0f;
    cudaMemcpyAsync(t, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s);
    cudaMemsetAsync(y + n, 0, sizeof(float), s); // the pad element: set on every run
    scale_kernel<2><<<1, 64, 0, s>>>(t, n);      // t = 2 x
    // y (1 x n row) = 3 (y + t / 2): C = alpha A B + beta C with A = 1 x 1, B = t (1 x n)
    const float half3 = 1.5f;
    cublasSetStream(h, s);
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, n, 1, &half3, &t[n], CUDA_R_32F, 1, t, CUDA_R_32F, 1, &three, y,
                 CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    (void)one;
}

void test_capture()
{
    const int n = 48;
    cudaStream_t s;
    cudaStreamCreate(&s); // blocking, as the back-end's stream
    cublasHandle_t h;
    cublasCreate(&h);
    float *x = dev<float>(n), *y = dev<float>(n + 1), *t = dev<float>(n + 1), *ye = dev<float>(n + 1);
    float hx[n], hy[n + 1], ht1 = 1.0f, got[n + 1], want[n + 1];
    for (int i = 0; i < n; i++)
        hx[i] = (float)(i % 7) - 2.5f, hy[i] = (float)(i % 5);
    hy[n] = 9.0f;
    up(x, hx, n);
    up(y, hy, n + 1);
    up(ye, hy, n + 1);
    up(t + n, &ht1, 1); // A: the 1 x 1 factor, left alone by the sequence
    // eager, twice, for what each graph launch must give
    captured_work(s, h, x, ye, t, n);
    cudaStreamSynchronize(s);
    float once[n + 1];
    down(once, ye, n + 1);
    captured_work(s, h, x, ye, t, n);
    cudaStreamSynchronize(s);
    down(want, ye, n + 1);

    const unsigned long long w0 = cuemu_work_count();
    expect(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "a blocking stream captures");
    enum cudaStreamCaptureStatus st;
    expect(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusActive,
           "cudaStreamIsCapturing says it does");
    expect(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaErrorIllegalState,
           "a second capture on the same stream is refused");
    captured_work(s, h, x, y, t, n);
    cudaGraph_t g = NULL;
    expect(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "the capture ends with a graph");
    expect(cuemu_work_count() == w0, "a capture launches nothing");
    down(got, y, n + 1);
    expect(memcmp(got, hy, sizeof got) == 0, "and runs nothing: y is as it was");
    cudaGraphExec_t ge = NULL;
    expect(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess && ge, "the graph instantiates");
    cudaGraphDestroy(g); // the executable keeps its work
    const unsigned long long w1 = cuemu_work_count();
    expect(cudaGraphLaunch(ge, s) == cudaSuccess, "the graph launches");
    expect(cuemu_work_count() == w1 + 1, "a graph's launch counts once, however much it runs");
    cudaStreamSynchronize(s);
    down(got, y, n + 1);
    expect(memcmp(got, once, sizeof got) == 0, "its copy, set, kernel and GEMM give what the eager calls gave");
    cudaGraphLaunch(ge, s);
    cudaStreamSynchronize(s);
    down(got, y, n + 1);
    expect(memcmp(got, want, sizeof got) == 0, "a second launch runs it all again, on the data as it is then");
    cudaGraphExecDestroy(ge);

    // what CUDA refuses during a capture, and what invalidates it
    void *p = NULL;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    expect(cudaMalloc(&p, 256) == cudaErrorStreamCaptureUnsupported && !p,
           "cudaMalloc in the capturing thread is refused (cudaErrorStreamCaptureUnsupported)");
    expect(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusInvalidated,
           "and invalidates the capture");
    scale_kernel<2><<<1, 64, 0, s>>>(t, n);
    expect(cudaGetLastError() == cudaErrorStreamCaptureInvalidated, "work on an invalidated capture is refused");
    expect(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g,
           "its end gives no graph (cudaErrorStreamCaptureInvalidated)");
    expect(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone, "and the stream is free");

    float hv = 0.0f;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    expect(cudaMemcpy(&hv, x, sizeof hv, cudaMemcpyDeviceToHost) == cudaErrorStreamCaptureImplicit,
           "a synchronous cudaMemcpy while a blocking stream captures is refused (cudaErrorStreamCaptureImplicit)");
    expect(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g, "and invalidates the capture");

    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaMemcpyAsync(&hv, x, sizeof hv, cudaMemcpyDeviceToHost, s);
    expect(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported,
           "a host read's cudaStreamSynchronize of the capturing stream is refused");
    expect(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g, "and invalidates the capture");
    expect(hv == 0.0f, "the recorded copy never ran");

    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaError_t other = cudaSuccess;
    std::thread([&] { other = cudaStreamEndCapture(s, &g); }).join();
    expect(other == cudaErrorStreamCaptureWrongThread,
           "a thread-local capture ended in another thread is refused (cudaErrorStreamCaptureWrongThread)");
    std::thread([&] { other = cudaMalloc(&p, 256); }).join();
    expect(other == cudaSuccess && p, "cudaMalloc in another thread is not refused by a thread-local capture");
    expect(cudaFree(p) == cudaErrorStreamCaptureUnsupported, "cudaFree in the capturing thread is refused");
    expect(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g, "and invalidates the capture");
    cudaFree(p);

    p = NULL;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    expect(cudaMalloc(&p, 256) == cudaSuccess && p, "cudaMalloc during a relaxed-mode capture is allowed");
    expect(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "and the capture stands");
    cudaGraphDestroy(g);
    cudaFree(p);

    cudaStream_t nb;
    cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
    cudaStreamBeginCapture(nb, cudaStreamCaptureModeThreadLocal);
    expect(cudaMemcpy(&hv, x, sizeof hv, cudaMemcpyDeviceToHost) == cudaSuccess && hv == hx[0],
           "the legacy stream works beside a capturing non-blocking stream");
    expect(cudaStreamEndCapture(nb, &g) == cudaSuccess && g, "and that capture stands");
    cudaGraphDestroy(g);
    cudaStreamDestroy(nb);
    expect(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported,
           "the legacy stream cannot capture");
    expect(cudaStreamEndCapture(s, &g) == cudaErrorIllegalState, "a capture that never began cannot end");
    (void)cudaGetLastError();
    cublasDestroy(h);
    cudaStreamDestroy(s);
    cudaFree(x);
    cudaFree(y);
    cudaFree(t);
    cudaFree(ye);
}

} // namespace

int main()
{
    test_indices();
    test_block_sum();
    test_race_shows();
    test_warp();
    test_smem_and_templates();
    test_refusals();
    test_faults();
    test_cublas();
    test_cublas_batched();
    test_bf16_and_sort();
    test_capture();
    printf("%d failed\n", failures);
    return failures ? 1 : 0;
}
