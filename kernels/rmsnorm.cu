// RMSNorm on the GPU: one block per row, a block-wide sum of squares.
#include "kernels_cuda.h"

namespace {

constexpr int kThreads = 256;

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

__global__ void rmsnorm_backward_kernel(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                        const float *rstd, int D)
{
    __shared__ float shared[32];
    size_t off = (size_t)blockIdx.x * D;
    float r = rstd[blockIdx.x];
    float dot = 0.0f;
    for (int j = threadIdx.x; j < D; j += blockDim.x)
        dot += dy[off + j] * w[j] * x[off + j];
    float c = block_sum(dot, shared) * r * r * r / D;
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        dx[off + j] += dy[off + j] * w[j] * r - c * x[off + j];
        atomicAdd(&dw[j], dy[off + j] * x[off + j] * r);
    }
}

} // namespace

extern "C" cudaError_t rmsnorm_forward_cuda(float *y, float *rstd, const float *x, const float *w, int N, int D,
                                            float eps, cudaStream_t stream)
{
    rmsnorm_forward_kernel<<<N, kThreads, 0, stream>>>(y, rstd, x, w, D, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t rmsnorm_backward_cuda(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                             const float *rstd, int N, int D, cudaStream_t stream)
{
    rmsnorm_backward_kernel<<<N, kThreads, 0, stream>>>(dx, dw, dy, x, w, rstd, D);
    return cudaGetLastError();
}
