// RMSNorm on the GPU: one block per row, a block-wide sum of squares. The backward's dw, a sum over the rows, is
// reduced in two passes through a scratch buffer in an order fixed by N and D alone (no atomics), so repeated runs
// give bit-identical weight gradients.
#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;
// Rows per partial sum of dw. Fixed, not derived from the device (SM count), so the summation order, hence every
// bit of dw, depends on N and D only. 32 rows give N/32 x D/256 blocks in pass 1 (hundreds for N ~ 4k) and a
// scratch of 1/32 of dy, and leave pass 2 N/32 sequential adds per column.
constexpr int kDwRows = 32;

int dw_slices(int N) { return (N + kDwRows - 1) / kDwRows; }

__device__ float block_sum(float v, float *shared)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        shared[warp] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0)
        shared[0] = v;
    __syncthreads();
    float total = shared[0];
    __syncthreads();
    return total;
}

__global__ void rmsnorm_forward_kernel(float *y, float *rstd, const float *x, const float *w, int D, float eps)
{
    __shared__ float shared[32];
    const float *xi = x + (size_t)blockIdx.x * D;
    float *yi = y + (size_t)blockIdx.x * D;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x)
        ss += xi[j] * xi[j];
    float r = rsqrtf(block_sum(ss, shared) / D + eps);
    if (threadIdx.x == 0 && rstd)
        rstd[blockIdx.x] = r;
    for (int j = threadIdx.x; j < D; j += blockDim.x)
        yi[j] = xi[j] * r * w[j];
}

// dx for one row per block; the block-wide dot product has a fixed shape, so dx is deterministic too.
__global__ void rmsnorm_backward_dx_kernel(float *dx, const float *dy, const float *x, const float *w,
                                           const float *rstd, int D)
{
    __shared__ float shared[32];
    size_t off = (size_t)blockIdx.x * D;
    float r = rstd[blockIdx.x];
    float dot = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x)
        dot += dy[off + j] * w[j] * x[off + j];
    float c = block_sum(dot, shared) * r * r * r / D;
    for (int j = threadIdx.x; j < D; j += blockDim.x)
        dx[off + j] += dy[off + j] * w[j] * r - c * x[off + j];
}

// Pass 1: block (s, c) sums dy * x * rstd over rows [s * kDwRows, (s + 1) * kDwRows) for its 256 columns, one
// column per thread, rows in order, into partial row s (consecutive threads read consecutive columns: coalesced).
__global__ void rmsnorm_dw_partial_kernel(float *partial, const float *dy, const float *x, const float *rstd, int N,
                                          int D)
{
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= D)
        return;
    int lo = blockIdx.x * kDwRows, hi = min(N, lo + kDwRows);
    float acc = 0.0f;
    for (int i = lo; i < hi; i++) {
        size_t off = (size_t)i * D + j;
        acc += dy[off] * x[off] * rstd[i];
    }
    partial[(size_t)blockIdx.x * D + j] = acc;
}

// Pass 2: dw[j] += the partials of column j, summed in slice order.
__global__ void rmsnorm_dw_sum_kernel(float *dw, const float *partial, int slices, int D)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D)
        return;
    float acc = 0.0f;
    for (int s = 0; s < slices; s++)
        acc += partial[(size_t)s * D + j];
    dw[j] += acc;
}

} // namespace

extern "C" cudaError_t rmsnorm_forward_cuda(float *y, float *rstd, const float *x, const float *w, int N, int D,
                                            float eps, cudaStream_t stream)
{
    if (N <= 0) // a grid of 0 blocks is a launch error; there is nothing to do
        return cudaSuccess;
    rmsnorm_forward_kernel<<<N, kThreads, 0, stream>>>(y, rstd, x, w, D, eps);
    return cudaGetLastError();
}

extern "C" size_t rmsnorm_backward_cuda_scratch_bytes(int N, int D)
{
    if (N <= 0 || D <= 0)
        return 0;
    return (size_t)dw_slices(N) * (size_t)D * sizeof(float);
}

extern "C" cudaError_t rmsnorm_backward_cuda(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                             const float *rstd, int N, int D, void *scratch, cudaStream_t stream)
{
    if (N <= 0 || D <= 0)
        return cudaSuccess;
    if (!scratch)
        return cudaErrorInvalidValue;
    rmsnorm_backward_dx_kernel<<<N, kThreads, 0, stream>>>(dx, dy, x, w, rstd, D);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    int slices = dw_slices(N), col_blocks = (D + kThreads - 1) / kThreads;
    float *partial = static_cast<float *>(scratch);
    // slices on x (up to 2^31 - 1 blocks), column blocks on y (up to 65535, D < 16.7M)
    rmsnorm_dw_partial_kernel<<<dim3(slices, col_blocks), kThreads, 0, stream>>>(partial, dy, x, rstd, N, D);
    rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    rmsnorm_dw_sum_kernel<<<col_blocks, kThreads, 0, stream>>>(dw, partial, slices, D);
    return cudaGetLastError();
}
