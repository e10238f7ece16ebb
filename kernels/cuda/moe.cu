// Mixture of experts on the GPU: the row moves around the per-expert products (which the back-end runs through its
// linear op, one cuBLAS GEMM per expert and projection): gathering the slots' inputs in expert order, combining the
// experts' outputs per token, the slots' gradients, and scattering the inputs' gradients back. Each output row is
// summed in slot order by one thread per element: no atomics, so the sums are deterministic. Written against
// kernels/cpu/moe.c; NOT YET RUN on a GPU (compiled only).
#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;

// xs[j] = x[order[j] / k]: one block per slot row
__global__ void gather_kernel(float *xs, const float *x, const int32_t *order, int k, int D)
{
    const int j = blockIdx.x;
    const float *src = x + (size_t)(order[j] / k) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        xs[(size_t)j * D + i] = src[i];
}

// y[t] = sum over t's slots s (in order) of wt[s] ys[pos[s]]: one block per token
__global__ void combine_kernel(float *y, const float *ys, const float *wt, const int32_t *pos, int k, int D)
{
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
        for (int s = t * k; s < (t + 1) * k; s++)
            acc = __fadd_rn(acc, __fmul_rn(wt[s], ys[(size_t)pos[s] * D + i]));
        y[(size_t)t * D + i] = acc;
    }
}

// slot row j (slot s = order[j] of token t): dys[j] = wt[s] dy[t], dwt[s] = dy[t] . ys[j] (in double, a block's
// tree reduction): one block per slot row
__global__ void slot_grad_kernel(float *dys, float *dwt, const float *dy, const float *ys, const float *wt,
                                 const int32_t *order, int k, int D)
{
    __shared__ double part[kThreads];
    const int j = blockIdx.x, s = order[j];
    const float *dyt = dy + (size_t)(s / k) * D;
    double acc = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        dys[(size_t)j * D + i] = __fmul_rn(wt[s], dyt[i]);
        acc += (double)dyt[i] * ys[(size_t)j * D + i];
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        dwt[s] = (float)part[0];
}

// dx[t] += sum over t's slots s of dxs[pos[s]]: one block per token
__global__ void scatter_kernel(float *dx, const float *dxs, const int32_t *pos, int k, int D)
{
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = dx[(size_t)t * D + i];
        for (int s = t * k; s < (t + 1) * k; s++)
            acc = __fadd_rn(acc, dxs[(size_t)pos[s] * D + i]);
        dx[(size_t)t * D + i] = acc;
    }
}

} // namespace

extern "C" cudaError_t moe_gather_cuda(float *xs, const float *x, const int32_t *order, int nk, int k, int D,
                                       cudaStream_t stream)
{
    if (nk == 0)
        return cudaSuccess;
    gather_kernel<<<nk, kThreads, 0, stream>>>(xs, x, order, k, D);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_combine_cuda(float *y, const float *ys, const float *wt, const int32_t *pos, int N, int k,
                                        int D, cudaStream_t stream)
{
    if (N == 0)
        return cudaSuccess;
    combine_kernel<<<N, kThreads, 0, stream>>>(y, ys, wt, pos, k, D);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_slot_grad_cuda(float *dys, float *dwt, const float *dy, const float *ys, const float *wt,
                                          const int32_t *order, int nk, int k, int D, cudaStream_t stream)
{
    if (nk == 0)
        return cudaSuccess;
    slot_grad_kernel<<<nk, kThreads, 0, stream>>>(dys, dwt, dy, ys, wt, order, k, D);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_scatter_cuda(float *dx, const float *dxs, const int32_t *pos, int N, int k, int D,
                                        cudaStream_t stream)
{
    if (N == 0)
        return cudaSuccess;
    scatter_kernel<<<N, kThreads, 0, stream>>>(dx, dxs, pos, k, D);
    return cudaGetLastError();
}
