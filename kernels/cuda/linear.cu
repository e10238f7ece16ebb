// Helpers of the GEMM ops (the products themselves are cuBLAS calls in backend.c): rounding to BF16 for the mixed
// precision products, the bias broadcast, and the bias gradient (column sums) in a fixed order without atomics.
#include <cuda_bf16.h>

#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192; // then a grid-stride loop
// Rows per partial column sum: fixed, so the order of additions (hence every bit) depends on N and D only.
constexpr int kSliceRows = 32;

unsigned grid_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16_rn(x[i]);
}

__global__ void bias_add_kernel(float *y, const float *b, size_t n, int D)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], b[i % (size_t)D]);
}

// Block (s, cb): column j = cb * 256 + thread, rows [s * kSliceRows, ...) in order, into partial row s.
__global__ void colsum_partial_kernel(float *partial, const float *x, int N, int D)
{
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= D)
        return;
    int lo = blockIdx.x * kSliceRows, hi = min(N, lo + kSliceRows);
    float acc = 0.0f;
    for (int i = lo; i < hi; i++)
        acc = __fadd_rn(acc, x[(size_t)i * D + j]);
    partial[(size_t)blockIdx.x * D + j] = acc;
}

__global__ void colsum_final_kernel(float *out, const float *partial, int slices, int D)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= D)
        return;
    float acc = 0.0f;
    for (int s = 0; s < slices; s++)
        acc = __fadd_rn(acc, partial[(size_t)s * D + j]);
    out[j] = __fadd_rn(out[j], acc);
}

} // namespace

extern "C" cudaError_t f32_to_bf16_cuda(void *dst, const float *x, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    f32_to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16 *>(dst), x, n);
    return cudaGetLastError();
}

extern "C" cudaError_t bias_add_cuda(float *y, const float *b, int N, int D, cudaStream_t stream)
{
    if (N <= 0 || D <= 0)
        return cudaSuccess;
    size_t n = (size_t)N * D;
    bias_add_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, b, n, D);
    return cudaGetLastError();
}

extern "C" size_t colsum_add_cuda_scratch_bytes(int N, int D)
{
    if (N <= 0 || D <= 0)
        return 0;
    return (size_t)((N + kSliceRows - 1) / kSliceRows) * (size_t)D * sizeof(float);
}

extern "C" cudaError_t colsum_add_cuda(float *out, const float *x, int N, int D, void *scratch, cudaStream_t stream)
{
    if (N <= 0 || D <= 0)
        return cudaSuccess;
    if (!scratch)
        return cudaErrorInvalidValue;
    int slices = (N + kSliceRows - 1) / kSliceRows, col_blocks = (D + kThreads - 1) / kThreads;
    if (col_blocks > 65535)
        return cudaErrorInvalidValue;
    float *partial = static_cast<float *>(scratch);
    colsum_partial_kernel<<<dim3(slices, col_blocks), kThreads, 0, stream>>>(partial, x, N, D);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    colsum_final_kernel<<<col_blocks, kThreads, 0, stream>>>(out, partial, slices, D);
    return cudaGetLastError();
}
