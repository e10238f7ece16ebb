// RoPE on the GPU, HF rotate_half convention (pairs (i, i + hd/2)), in place. One block per token: its threads
// first compute the token's hd/2 angles in double and round cos/sin to float once, as rope_apply does on the CPU
// (pos * inv_freq reaches ~3e4 rad, where float angles lose ~1e-3 rad), then rotate every head with those floats.
// The products and sums use the _rn intrinsics so nvcc does not fuse them into FMAs: the CPU build does not either,
// so the outputs match the CPU's bit for bit unless a cos/sin rounds differently (CUDA's are within 2 ulp in double,
// glibc's within 1; they disagree after rounding to float only near a float midpoint, rarely).
#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;

__global__ void rope_kernel(float *x, const int32_t *pos, int H, int hd, const double *inv_freq, bool inverse)
{
    extern __shared__ float cos_sin[]; // hd/2 cosines, then hd/2 sines
    const int half = hd / 2;
    float *c = cos_sin, *s = cos_sin + half;
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double sa, ca;
        sincos((double)pos[t] * inv_freq[i], &sa, &ca);
        c[i] = (float)ca;
        // the inverse rotation turns by -angle; negating before or after rounding gives the same float
        s[i] = inverse ? -(float)sa : (float)sa;
    }
    __syncthreads();
    float *xt = x + (size_t)t * H * hd;
    for (int k = threadIdx.x; k < H * half; k += blockDim.x) {
        int h = k / half, i = k - h * half;
        float *xh = xt + (size_t)h * hd;
        float x1 = xh[i], x2 = xh[i + half];
        xh[i] = __fsub_rn(__fmul_rn(x1, c[i]), __fmul_rn(x2, s[i]));
        xh[i + half] = __fadd_rn(__fmul_rn(x2, c[i]), __fmul_rn(x1, s[i]));
    }
}

cudaError_t rope_launch(float *x, const int32_t *pos, int N, int H, int hd, const double *inv_freq, bool inverse,
                        cudaStream_t stream)
{
    if (hd < 0 || hd % 2 != 0) // the CPU path aborts on an odd head_dim
        return cudaErrorInvalidValue;
    if (N <= 0 || H <= 0 || hd == 0)
        return cudaSuccess;
    rope_kernel<<<N, kThreads, sizeof(float) * (size_t)hd, stream>>>(x, pos, H, hd, inv_freq, inverse);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t rope_forward_cuda(float *x, const int32_t *pos, int N, int H, int hd, const double *inv_freq,
                                         cudaStream_t stream)
{
    return rope_launch(x, pos, N, H, hd, inv_freq, false, stream);
}

extern "C" cudaError_t rope_backward_cuda(float *dx, const int32_t *pos, int N, int H, int hd, const double *inv_freq,
                                          cudaStream_t stream)
{
    // forward is an orthogonal rotation R per pair; dL/dx = R^T dL/dy = the rotation by -angle
    return rope_launch(dx, pos, N, H, hd, inv_freq, true, stream);
}
