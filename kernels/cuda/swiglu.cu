// SwiGLU on the GPU, element-wise with a grid-stride loop. Every product, sum and quotient uses an _rn intrinsic
// (nvcc would otherwise fuse multiply-adds, which the CPU build does not), and exp is taken in double and rounded
// once, so the sigmoid is the correctly rounded one but in rare cases (CUDA's float expf is off by up to 2 ulp,
// which silu'(g) = s + g s (1 - s) magnifies near its zero, g ~ -1.28). The CPU's swiglu.c now uses its own
// polynomial exponential (~2 ulp, clamped at exp(88)), so the two agree within a few ulps, not bit for bit; where
// the sigmoid underflows (g < -88) the GPU gives 0 and the CPU ~1e-38.
#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;
// enough blocks to fill any current GPU; the grid-stride loop covers the rest (element-wise: order is irrelevant)
constexpr size_t kMaxBlocks = 8192;

__device__ float sigmoid_cpu(float g)
{
    // exp(-g) overflows float to inf for g < -88, giving 0, as on the CPU
    float e = (float)exp(-(double)g);
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
}

__global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = up[i]; // both read before out[i] is written: out may alias either
        out[i] = __fmul_rn(__fmul_rn(g, sigmoid_cpu(g)), u);
    }
}

__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                       size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], sg = sigmoid_cpu(g), d = dout[i];
        float silu = __fmul_rn(g, sg);
        // silu'(g) = s + g s (1 - s)
        float dsilu = __fadd_rn(sg, __fmul_rn(silu, __fsub_rn(1.0f, sg)));
        dgate[i] = __fadd_rn(dgate[i], __fmul_rn(__fmul_rn(d, up[i]), dsilu));
        dup[i] = __fadd_rn(dup[i], __fmul_rn(d, silu));
    }
}

unsigned grid_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

} // namespace

extern "C" cudaError_t swiglu_forward_cuda(float *out, const float *gate, const float *up, size_t n,
                                           cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    swiglu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, gate, up, n);
    return cudaGetLastError();
}

extern "C" cudaError_t swiglu_backward_cuda(float *dgate, float *dup, const float *dout, const float *gate,
                                            const float *up, size_t n, cudaStream_t stream)
{
    if (n == 0)
        return cudaSuccess;
    swiglu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dgate, dup, dout, gate, up, n);
    return cudaGetLastError();
}
