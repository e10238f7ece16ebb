// AdamW on the GPU in FP32, torch.optim.AdamW semantics, element-wise. The step's scalars (bias corrections, decay,
// step size) are computed on the host in double and rounded to float exactly as adamw_step (worker/trainer/optim.c)
// does, and the update uses the CPU's order of operations with _rn intrinsics (which nvcc never fuses into FMAs; the
// CPU's C17 build does not fuse either). Division and sqrt are IEEE-rounded on both, so params, m and v match the
// CPU's bit for bit; a CPU build that contracts multiply-adds (-ffp-contract=fast with FMA) would differ by an ulp
// or so per step.
#include <math.h>

#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192; // then a grid-stride loop

struct adamw_scalars {
    float b1, one_minus_b1, b2, one_minus_b2, decay, step, eps, inv_sqrt_bc2;
};

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, adamw_scalars k)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = __fadd_rn(__fmul_rn(k.b1, m[i]), __fmul_rn(k.one_minus_b1, gi));
        float vi = __fadd_rn(__fmul_rn(k.b2, v[i]), __fmul_rn(__fmul_rn(k.one_minus_b2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        // torch: p *= 1 - lr*wd; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
        float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), k.inv_sqrt_bc2), k.eps);
        p[i] = __fsub_rn(__fmul_rn(p[i], k.decay), __fdiv_rn(__fmul_rn(k.step, mi), denom));
    }
}

} // namespace

extern "C" cudaError_t adamw_step_cuda(float *params, const float *grads, float *m, float *v, size_t n, double lr,
                                       double beta1, double beta2, double eps, double weight_decay, int64_t t,
                                       cudaStream_t stream)
{
    if (t < 1) // the bias corrections divide by 1 - beta^t
        return cudaErrorInvalidValue;
    if (n == 0)
        return cudaSuccess;
    const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    // volatile keeps the host compiler (g++ contracts by default, and aarch64 hosts have FMA) from fusing this
    // product into 1.0 - lr*wd: the CPU's C17 build rounds it first
    volatile double lr_wd = lr * weight_decay;
    adamw_scalars k;
    k.b1 = (float)beta1;
    k.b2 = (float)beta2;
    k.one_minus_b1 = 1.0f - k.b1;
    k.one_minus_b2 = 1.0f - k.b2;
    k.decay = (float)(1.0 - lr_wd);
    k.step = (float)(lr / bc1);
    k.eps = (float)eps;
    k.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    size_t blocks = (n + kThreads - 1) / kThreads;
    adamw_kernel<<<(unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks), kThreads, 0, stream>>>(params, grads, m, v, n,
                                                                                                 k);
    return cudaGetLastError();
}
