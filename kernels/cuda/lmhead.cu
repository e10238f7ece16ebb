// LM-head log-probabilities on the GPU, the per-row part: the chunk's logits (c, Vl) come from a cuBLAS GEMM in
// backend.c; these kernels take each row's maximum, sum of exponentials, entropy term and target logit (the
// statistics kernels/cpu/logprob.c combines over vocabulary shards, in the same layout), finish logp and entropy,
// and turn a logit row into its gradient for the backward. One block per row, block reductions in a fixed tree
// (sums in double, as the CPU), so results are the same bits every run.
#include <math.h>

#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;

__device__ float block_max(float v, float *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    return sh[0];
}

// Sums of two doubles over the block (fixed tree); results to every thread.
__device__ void block_sum2(double &a, double &b, double *sa, double *sb)
{
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            sa[threadIdx.x] += sa[threadIdx.x + s];
            sb[threadIdx.x] += sb[threadIdx.x + s];
        }
        __syncthreads();
    }
    a = sa[0];
    b = sb[0];
}

__global__ void rowmax_kernel(double *st, const float *z, int Vl)
{
    __shared__ float sh[kThreads];
    const float *zi = z + (size_t)blockIdx.x * Vl;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x)
        m = fmaxf(m, zi[j]);
    m = block_max(m, sh);
    if (threadIdx.x == 0)
        st[blockIdx.x] = m;
}

__global__ void rowsums_kernel(double *st, const float *z, const int32_t *targets, int c, int Vl, int lo)
{
    __shared__ double sa[kThreads], sb[kThreads];
    const int i = blockIdx.x;
    const float *zi = z + (size_t)i * Vl;
    const float m = (float)st[i];
    double sum = 0.0, sz = 0.0;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        const float d = zi[j] - m, e = expf(d);
        sum += e;
        sz += (double)e * d;
    }
    block_sum2(sum, sz, sa, sb);
    if (threadIdx.x == 0) {
        const int t = targets[i] - lo;
        st[c + i] = sum;
        st[2 * c + i] = sz;
        st[3 * c + i] = t >= 0 && t < Vl ? (double)zi[t] : 0.0;
    }
}

// st[4c + i] = sum_j exp(z_ij - M_i)^2 (verl's sum_pi_squared, before dividing by the squared sum)
__global__ void rowsq_kernel(double *st, const float *z, int c, int Vl)
{
    __shared__ double sa[kThreads], sb[kThreads];
    const int i = blockIdx.x;
    const float *zi = z + (size_t)i * Vl;
    const float m = (float)st[i];
    double s2 = 0.0, unused = 0.0;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        const float e = expf(zi[j] - m);
        s2 += (double)e * e;
    }
    block_sum2(s2, unused, sa, sb);
    if (threadIdx.x == 0)
        st[4 * c + i] = s2;
}

__global__ void finalize_kernel(float *logp, float *entropy, const double *st, int c, int sq)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= c)
        return;
    const double logsum = log(st[c + i]); // >= 1 element is exp(0): the sum is >= 1 (without a shard's reduce)
    logp[i] = (float)(st[3 * c + i] - (st[i] + logsum));
    if (entropy && sq) // sum p^2 = sum exp(z - M)^2 / (sum exp(z - M))^2
        entropy[i] = (float)(st[4 * c + i] / (st[c + i] * st[c + i]));
    else if (entropy) // H = -sum p (z - lse) = log(sum) - sum p (z - M)
        entropy[i] = (float)(logsum - st[2 * c + i] / st[c + i]);
}

// dlogp/dz_j = 1[j = t] - p_j, dH/dz_j = -p_j (log p_j + H), dz/d(h W^T) = 1/temperature (the CPU's formulas)
__global__ void dlogits_kernel(float *z, const double *st, const float *dlogp, const float *dentropy,
                               const int32_t *targets, int c, int Vl, int lo, double inv_t)
{
    const int i = blockIdx.x;
    float *zi = z + (size_t)i * Vl;
    const double gl = dlogp[i], ge = dentropy ? dentropy[i] : 0.0;
    const double logsum = log(st[c + i]);
    const double lse = st[i] + logsum, H = logsum - st[2 * c + i] / st[c + i];
    const float m = (float)st[i], pscale = (float)(1.0 / st[c + i]);
    const float a = (float)(-gl * inv_t), b = (float)(-ge * inv_t), lse_f = (float)lse, Hf = (float)H;
    const float gt = (float)(gl * inv_t);
    const int t = targets[i] - lo;
    for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
        const float zj = zi[j], p = expf(zj - m) * pscale;
        float g = a * p + b * p * (zj - lse_f + Hf);
        if (j == t)
            g += gt;
        zi[j] = g;
    }
}

} // namespace

extern "C" cudaError_t lmhead_rowmax_cuda(double *st, const float *z, int c, int Vl, cudaStream_t stream)
{
    if (c <= 0)
        return cudaSuccess;
    rowmax_kernel<<<c, kThreads, 0, stream>>>(st, z, Vl);
    return cudaGetLastError();
}

extern "C" cudaError_t lmhead_rowsums_cuda(double *st, const float *z, const int32_t *targets, int c, int Vl, int lo,
                                           cudaStream_t stream)
{
    if (c <= 0)
        return cudaSuccess;
    rowsums_kernel<<<c, kThreads, 0, stream>>>(st, z, targets, c, Vl, lo);
    return cudaGetLastError();
}

extern "C" cudaError_t lmhead_rowsq_cuda(double *st, const float *z, int c, int Vl, cudaStream_t stream)
{
    if (c <= 0)
        return cudaSuccess;
    rowsq_kernel<<<c, kThreads, 0, stream>>>(st, z, c, Vl);
    return cudaGetLastError();
}

extern "C" cudaError_t lmhead_finalize_cuda(float *logp, float *entropy, const double *st, int c, bool sum_pi_sq,
                                            cudaStream_t stream)
{
    if (c <= 0)
        return cudaSuccess;
    finalize_kernel<<<(c + kThreads - 1) / kThreads, kThreads, 0, stream>>>(logp, entropy, st, c, sum_pi_sq ? 1 : 0);
    return cudaGetLastError();
}

extern "C" cudaError_t lmhead_dlogits_cuda(float *z, const double *st, const float *dlogp, const float *dentropy,
                                           const int32_t *targets, int c, int Vl, int lo, float temperature,
                                           cudaStream_t stream)
{
    if (c <= 0)
        return cudaSuccess;
    dlogits_kernel<<<c, kThreads, 0, stream>>>(z, st, dlogp, dentropy, targets, c, Vl, lo, 1.0 / temperature);
    return cudaGetLastError();
}
