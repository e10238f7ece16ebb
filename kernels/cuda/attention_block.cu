// Ring attention's blocks on the GPU (context parallelism; see attention_block_forward in kernels/cpu/cpu_kernels.h
// for the semantics): the local queries against a visiting block of keys with no causal cut, a query seeing the
// keys of its own sequence only; the log-sum-exp merge of such a partial into the running output; the backward of
// a block given the whole attention's lse; and dout . out per row and head.
//
// Simple and exact before fast: one warp per (query row, head), the warp's lanes over the head dimension, the keys
// walked in order with an online softmax; the backward's dk/dv with one warp per (key row, KV head) walking the
// query heads of its group and the query rows in order, dq with one warp per (query row, head) walking the keys.
// Every output element is written by one lane, summed in an order fixed by the shapes: no atomics, the same bits
// every run. NOT YET RUN on a GPU (compiled only): tests/gpu/test_gpu_kernels.c's t_block checks it against the CPU
// when scripts/gpu_check.sh runs on a device.
#include <math.h>

#include "cuda_kernels.h"

namespace
{

constexpr int kWarps = 4;  // warps per block
constexpr int kMaxPer = 8; // head-dimension elements per lane: hd <= 256

__device__ __forceinline__ double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// q_i . k_t over hd (lanes hold elements lane, lane + 32, ...), in double, the same on every lane
__device__ __forceinline__ double dot_rows(const float *a, const float *b, int hd, int lane)
{
    double s = 0;
    for (int d = lane; d < hd; d += 32)
        s += (double)a[d] * b[d];
    return warp_sum(s);
}

__global__ void block_forward_kernel(float *po, float *plse, const float *q, const float *k, const float *v,
                                     const int32_t *qseq, const int32_t *kseq, int nq, int nk, int Hq, int Hkv, int hd,
                                     float scale)
{
    const int w = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= nq * Hq)
        return;
    const int i = w / Hq, h = w % Hq, kh = h / (Hq / Hkv), sq = qseq[i];
    const float *qi = q + ((size_t)i * Hq + h) * hd;
    float acc[kMaxPer];
#pragma unroll
    for (int j = 0; j < kMaxPer; j++)
        acc[j] = 0.0f;
    float m = -INFINITY;
    double l = 0;
    for (int t = 0; t < nk; t++) {
        if (kseq[t] != sq)
            continue;
        const size_t ko = ((size_t)t * Hkv + kh) * hd;
        const float s = (float)(scale * dot_rows(qi, k + ko, hd, lane));
        const float mn = s > m ? s : m;
        const float corr = expf(m - mn), p = expf(s - mn); // m = -inf the first time: corr 0
        l = l * corr + p;
#pragma unroll
        for (int j = 0; j < kMaxPer; j++) {
            const int d = lane + 32 * j;
            if (d < hd)
                acc[j] = acc[j] * corr + p * v[ko + d];
        }
        m = mn;
    }
    float *o = po + ((size_t)i * Hq + h) * hd;
    const bool none = m == -INFINITY;
#pragma unroll
    for (int j = 0; j < kMaxPer; j++) {
        const int d = lane + 32 * j;
        if (d < hd)
            o[d] = none ? 0.0f : (float)(acc[j] / l);
    }
    if (lane == 0)
        plse[(size_t)i * Hq + h] = none ? -INFINITY : (float)(m + log(l));
}

__global__ void merge_kernel(float *out, float *lse, const float *po, const float *plse, int n, int Hq, int hd)
{
    const int w = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= n * Hq)
        return;
    const size_t e = (size_t)w;
    const double l1 = lse[e], l2 = plse[e];
    if (l2 == -INFINITY)
        return;
    const double mx = l1 > l2 ? l1 : l2, lt = mx + log(exp(l1 - mx) + exp(l2 - mx));
    const double w1 = exp(l1 - lt), w2 = exp(l2 - lt);
    for (int d = lane; d < hd; d += 32)
        out[e * hd + d] = (float)(w1 * out[e * hd + d] + w2 * po[e * hd + d]);
    __syncwarp();
    if (lane == 0)
        lse[e] = (float)lt;
}

__global__ void drow_kernel(float *drow, const float *dout, const float *out, int n, int Hq, int hd)
{
    const int w = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= n * Hq)
        return;
    const double s = dot_rows(dout + (size_t)w * hd, out + (size_t)w * hd, hd, lane);
    if (lane == 0)
        drow[w] = (float)s;
}

// dq of query row i, head h += scale sum_t dS_it k_t, dS = P (dout v^T - drow), P = exp(s - lse)
__global__ void block_dq_kernel(float *dq, const float *dout, const float *lse, const float *drow, const float *q,
                                const float *k, const float *v, const int32_t *qseq, const int32_t *kseq, int nq,
                                int nk, int Hq, int Hkv, int hd, float scale)
{
    const int w = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= nq * Hq)
        return;
    const int i = w / Hq, h = w % Hq, kh = h / (Hq / Hkv), sq = qseq[i];
    const size_t qo = ((size_t)i * Hq + h) * hd;
    const float L = lse[w], Di = drow[w];
    float acc[kMaxPer];
#pragma unroll
    for (int j = 0; j < kMaxPer; j++)
        acc[j] = 0.0f;
    for (int t = 0; t < nk; t++) {
        if (kseq[t] != sq)
            continue;
        const size_t ko = ((size_t)t * Hkv + kh) * hd;
        const float s = (float)(scale * dot_rows(q + qo, k + ko, hd, lane));
        const float p = expf(s - L), dp = (float)dot_rows(dout + qo, v + ko, hd, lane);
        const float ds = p * (dp - Di);
#pragma unroll
        for (int j = 0; j < kMaxPer; j++) {
            const int d = lane + 32 * j;
            if (d < hd)
                acc[j] += ds * k[ko + d];
        }
    }
#pragma unroll
    for (int j = 0; j < kMaxPer; j++) {
        const int d = lane + 32 * j;
        if (d < hd)
            dq[qo + d] += scale * acc[j];
    }
}

// dk, dv of key row t, KV head kh: over the query heads of the group and the query rows in order
__global__ void block_dkv_kernel(float *dk, float *dv, const float *dout, const float *lse, const float *drow,
                                 const float *q, const float *k, const float *v, const int32_t *qseq,
                                 const int32_t *kseq, int nq, int nk, int Hq, int Hkv, int hd, float scale)
{
    const int w = blockIdx.x * kWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (w >= nk * Hkv)
        return;
    const int t = w / Hkv, kh = w % Hkv, group = Hq / Hkv, sk = kseq[t];
    const size_t ko = ((size_t)t * Hkv + kh) * hd;
    float ak[kMaxPer], av[kMaxPer];
#pragma unroll
    for (int j = 0; j < kMaxPer; j++)
        ak[j] = av[j] = 0.0f;
    for (int h = kh * group; h < (kh + 1) * group; h++)
        for (int i = 0; i < nq; i++) {
            if (qseq[i] != sk)
                continue;
            const size_t qo = ((size_t)i * Hq + h) * hd, e = (size_t)i * Hq + h;
            const float s = (float)(scale * dot_rows(q + qo, k + ko, hd, lane));
            const float p = expf(s - lse[e]), dp = (float)dot_rows(dout + qo, v + ko, hd, lane);
            const float ds = p * (dp - drow[e]);
#pragma unroll
            for (int j = 0; j < kMaxPer; j++) {
                const int d = lane + 32 * j;
                if (d < hd) {
                    av[j] += p * dout[qo + d];
                    ak[j] += ds * q[qo + d];
                }
            }
        }
#pragma unroll
    for (int j = 0; j < kMaxPer; j++) {
        const int d = lane + 32 * j;
        if (d < hd) {
            dv[ko + d] += av[j];
            dk[ko + d] += scale * ak[j];
        }
    }
}

int warps_grid(long long warps) { return (int)((warps + kWarps - 1) / kWarps); }

} // namespace

extern "C" cudaError_t attention_block_forward_cuda(float *po, float *plse, const float *q, const float *k,
                                                    const float *v, const int32_t *qseq, const int32_t *kseq, int nq,
                                                    int nk, int Hq, int Hkv, int hd, cudaStream_t stream)
{
    if (nq <= 0 || Hq <= 0)
        return cudaSuccess;
    if (hd <= 0 || hd > 32 * kMaxPer || Hkv <= 0 || Hq % Hkv != 0)
        return cudaErrorInvalidValue;
    block_forward_kernel<<<warps_grid((long long)nq * Hq), 32 * kWarps, 0, stream>>>(
        po, plse, q, k, v, qseq, kseq, nq, nk, Hq, Hkv, hd, (float)(1.0 / sqrt((double)hd)));
    return cudaGetLastError();
}

extern "C" cudaError_t attention_block_backward_cuda(float *dq, float *dk, float *dv, const float *dout,
                                                     const float *lse, const float *drow, const float *q,
                                                     const float *k, const float *v, const int32_t *qseq,
                                                     const int32_t *kseq, int nq, int nk, int Hq, int Hkv, int hd,
                                                     cudaStream_t stream)
{
    if (nq <= 0 || nk <= 0 || Hq <= 0)
        return cudaSuccess;
    if (hd <= 0 || hd > 32 * kMaxPer || Hkv <= 0 || Hq % Hkv != 0)
        return cudaErrorInvalidValue;
    const float scale = (float)(1.0 / sqrt((double)hd));
    block_dq_kernel<<<warps_grid((long long)nq * Hq), 32 * kWarps, 0, stream>>>(dq, dout, lse, drow, q, k, v, qseq,
                                                                                kseq, nq, nk, Hq, Hkv, hd, scale);
    block_dkv_kernel<<<warps_grid((long long)nk * Hkv), 32 * kWarps, 0, stream>>>(
        dk, dv, dout, lse, drow, q, k, v, qseq, kseq, nq, nk, Hq, Hkv, hd, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t attention_merge_cuda(float *out, float *lse, const float *po, const float *plse, int n, int Hq,
                                            int hd, cudaStream_t stream)
{
    if (n <= 0 || Hq <= 0)
        return cudaSuccess;
    merge_kernel<<<warps_grid((long long)n * Hq), 32 * kWarps, 0, stream>>>(out, lse, po, plse, n, Hq, hd);
    return cudaGetLastError();
}

extern "C" cudaError_t attention_drow_cuda(float *drow, const float *dout, const float *out, int n, int Hq, int hd,
                                           cudaStream_t stream)
{
    if (n <= 0 || Hq <= 0)
        return cudaSuccess;
    drow_kernel<<<warps_grid((long long)n * Hq), 32 * kWarps, 0, stream>>>(drow, dout, out, n, Hq, hd);
    return cudaGetLastError();
}
