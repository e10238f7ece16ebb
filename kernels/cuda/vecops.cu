// Element-wise vector ops and the deterministic sum of squares (a gradient norm's part) on the GPU.
#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192;
// Blocks of the sum of squares' first pass: at most this many, fixed by n alone (not by the device), so the
// order of additions, hence the result's bits, depends on n only.
constexpr int kSumsqBlocks = 1024;

unsigned grid_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__global__ void add_kernel(float *y, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void axpy_kernel(float *y, float a, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], __fmul_rn(a, x[i]));
}

// x * a in double, rounded once to float, as the CPU's (float)(x * a) with a double a
__global__ void scale_kernel(float *x, double a, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __double2float_rn(__dmul_rn((double)x[i], a));
}

// Tree sum of the block's values in shared memory (blockDim.x == kThreads, a power of two); returns the total
// to thread 0.
__device__ double block_sum_double(double v, double *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

__global__ void sumsq_partial_kernel(double *partial, const float *x, size_t n)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        double xi = x[i];
        acc += xi * xi;
    }
    double total = block_sum_double(acc, sh);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = total;
}

__global__ void sumsq_final_kernel(double *result, const double *partial, int blocks)
{
    __shared__ double sh[kThreads];
    double acc = 0.0;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x)
        acc += partial[b];
    double total = block_sum_double(acc, sh);
    if (threadIdx.x == 0)
        *result = total;
}

} // namespace

extern "C" cudaError_t vec_add_cuda(float *y, const float *x, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    add_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t vec_axpy_cuda(float *y, float a, const float *x, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    axpy_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, a, x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t vec_scale_cuda(float *x, double a, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, a, n);
    return cudaGetLastError();
}

extern "C" size_t sumsq_cuda_scratch_bytes(void) { return sizeof(double) * kSumsqBlocks; }

extern "C" cudaError_t sumsq_cuda(double *result, const float *x, size_t n, void *scratch, cudaStream_t stream)
{
    if (!scratch || !result)
        return cudaErrorInvalidValue;
    double *partial = static_cast<double *>(scratch);
    size_t want = (n + kThreads - 1) / kThreads;
    int blocks = (int)(want < (size_t)kSumsqBlocks ? want : (size_t)kSumsqBlocks);
    if (blocks > 0) {
        sumsq_partial_kernel<<<blocks, kThreads, 0, stream>>>(partial, x, n);
        cudaError_t rc = cudaGetLastError();
        if (rc != cudaSuccess)
            return rc;
    }
    sumsq_final_kernel<<<1, kThreads, 0, stream>>>(result, partial, blocks);
    return cudaGetLastError();
}
