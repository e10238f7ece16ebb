// Attention in a BF16 context on tensor cores (issue 43 item 5): the kernels around the matrix products, which are
// cuBLAS batched BF16 GEMMs with fp32 accumulation (backend.c, cuda_attention_forward and _backward). Per sequence
// and tile of query rows the scores of every head are materialised in fp32, as the CPU's blocks materialise them.
//
// Layouts. q, out, dout (N, Hq, hd) and k, v (N, Hkv, hd) as everywhere (kernels/cpu/cpu_kernels.h). The query-side
// operands of the products (q and dout rounded to BF16, out and dq before they are scattered back) are "grouped":
// [kh][t][gi][hd] for query head h = kh * group + gi, so that for one KV head the rows of all its query heads over a
// run of tokens are one matrix of hd columns (row (t - t0) * group + gi): a tile of a sequence's query rows is one
// GEMM operand per KV head, and one strided batched GEMM over the KV heads covers every head (GQA without copies of
// K and V). The scores S (Hkv, R, nk) of a tile [i0, i1) of a sequence's rows hold, per KV head, its R =
// (i1 - i0) group rows against the nk = i1 keys they may see: row r is query row i0 + r / group of head
// kh * group + r % group. Masked entries (key j > query row i) are read but never used: their probabilities are 0.
#include <math.h>

#include <cuda_bf16.h>

#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / 32; // softmax: one warp per score row
constexpr size_t kMaxBlocks = 8192;          // then a grid-stride loop
// A tile's scores take 12 bytes per (row, key) in the backward (S and dP in fp32, P and dS in BF16), 6 in the
// forward: its query rows are as many as fit kScoreBudget for every head, at most kMaxRows (a longer tile saves
// launches but computes more of the masked half), at least kMinRows.
constexpr size_t kScoreBytes = 12;
constexpr size_t kScoreBudget = (size_t)256 << 20;
constexpr int kMaxRows = 512, kMinRows = 16;

unsigned grid_for(size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// the element (t, h, d) of an (N, Hq, hd) array in the grouped layout (N rows per KV head)
__device__ __forceinline__ size_t grouped(size_t t, int h, int d, size_t N, int group, int hd)
{
    const int kh = h / group, gi = h - kh * group;
    return (((size_t)kh * N + t) * group + gi) * hd + d;
}

// rows [t0, N) of x (N, Hq, hd) rounded to BF16 into dst, grouped
__global__ void group_bf16_kernel(__nv_bfloat16 *dst, const float *x, size_t t0, size_t n, size_t N, int Hq, int group,
                                  int hd)
{
    const size_t row = (size_t)Hq * hd;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = t0 + e / row, rem = e % row;
        const int h = (int)(rem / hd), d = (int)(rem % hd);
        dst[grouped(t, h, d, N, group, hd)] = __float2bfloat16_rn(x[t * row + rem]);
    }
}

// rows [t0, N) of y (N, Hq, hd) = (add: +=) those of xg, grouped
__global__ void ungroup_kernel(float *y, const float *xg, size_t t0, size_t n, size_t N, int Hq, int group, int hd,
                               bool add)
{
    const size_t row = (size_t)Hq * hd;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t t = t0 + e / row, rem = e % row;
        const int h = (int)(rem / hd), d = (int)(rem % hd);
        const float x = xg[grouped(t, h, d, N, group, hd)];
        y[t * row + rem] = add ? __fadd_rn(y[t * row + rem], x) : x;
    }
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One warp per score row (kh, r) of a tile: the causal softmax of its visible keys 0..i (every row sees key 0, so
// its maximum is finite) into P (BF16, 0 past the diagonal), and lse (NULL: not wanted) of its token and head.
__global__ void softmax_kernel(__nv_bfloat16 *P, float *lse, const float *S, int rows, int R, int nk, int i0, int group,
                               int Hq, size_t s0)
{
    const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) // the whole warp leaves
        return;
    const int kh = row / R, r = row - kh * R, i = i0 + r / group, h = kh * group + r % group;
    const float *s = S + (size_t)row * nk;
    __nv_bfloat16 *p = P + (size_t)row * nk;
    float m = -INFINITY;
    for (int j = lane; j <= i; j += 32)
        m = fmaxf(m, s[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j <= i; j += 32)
        sum += expf(s[j] - m);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int j = lane; j < nk; j += 32)
        p[j] = __float2bfloat16_rn(j <= i ? expf(s[j] - m) * inv : 0.0f);
    if (lse && lane == 0)
        lse[(s0 + i) * Hq + h] = m + logf(sum);
}

// One block per score row (kh, r) of a tile in the backward: P = exp(S - lse) (0 past the diagonal) and
// dS = P (dP - D), both rounded to BF16 for the products that follow.
__global__ void dsoft_kernel(__nv_bfloat16 *P, __nv_bfloat16 *dS, const float *S, const float *dP, const float *lse,
                             const float *D, int R, int nk, int i0, int group, int Hq, size_t s0)
{
    const size_t row = blockIdx.x;
    const int kh = (int)(row / R), r = (int)(row % R), i = i0 + r / group, h = kh * group + r % group;
    const float l = lse[(s0 + i) * Hq + h], Di = D[(s0 + i) * Hq + h];
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        const size_t e = row * nk + j;
        const float p = j <= i ? expf(S[e] - l) : 0.0f;
        P[e] = __float2bfloat16_rn(p);
        dS[e] = __float2bfloat16_rn(p * (dP[e] - Di));
    }
}

} // namespace

extern "C" int attention_tc_tile_rows(int L, int Hq)
{
    if (L <= 0 || Hq <= 0)
        return 0;
    size_t rows = kScoreBudget / (kScoreBytes * (size_t)Hq * (size_t)L);
    rows = rows > (size_t)kMaxRows ? (size_t)kMaxRows : rows < (size_t)kMinRows ? (size_t)kMinRows : rows;
    return rows < (size_t)L ? (int)rows : L;
}

extern "C" cudaError_t attention_tc_group_cuda(void *dst, const float *x, int t0, int N, int Hq, int Hkv, int hd,
                                               cudaStream_t stream)
{
    const size_t n = (size_t)(N - t0) * Hq * hd;
    if (n == 0)
        return cudaSuccess;
    group_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16 *>(dst), x, (size_t)t0, n,
                                                            (size_t)N, Hq, Hq / Hkv, hd);
    return cudaGetLastError();
}

extern "C" cudaError_t attention_tc_ungroup_cuda(float *y, const float *xg, int t0, int N, int Hq, int Hkv, int hd,
                                                 int add, cudaStream_t stream)
{
    const size_t n = (size_t)(N - t0) * Hq * hd;
    if (n == 0)
        return cudaSuccess;
    ungroup_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, xg, (size_t)t0, n, (size_t)N, Hq, Hq / Hkv, hd, add != 0);
    return cudaGetLastError();
}

extern "C" cudaError_t attention_tc_softmax_cuda(void *P, float *lse, const float *S, int s0, int i0, int i1, int Hq,
                                                 int Hkv, cudaStream_t stream)
{
    const int group = Hq / Hkv, R = (i1 - i0) * group, rows = Hkv * R;
    if (rows <= 0)
        return cudaSuccess;
    softmax_kernel<<<(unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock), kThreads, 0, stream>>>(
        static_cast<__nv_bfloat16 *>(P), lse, S, rows, R, i1, i0, group, Hq, (size_t)s0);
    return cudaGetLastError();
}

extern "C" cudaError_t attention_tc_dsoft_cuda(void *P, void *dS, const float *S, const float *dP, const float *lse,
                                               const float *D, int s0, int i0, int i1, int Hq, int Hkv,
                                               cudaStream_t stream)
{
    const int group = Hq / Hkv, R = (i1 - i0) * group, rows = Hkv * R;
    if (rows <= 0)
        return cudaSuccess;
    dsoft_kernel<<<(unsigned)rows, kThreads, 0, stream>>>(static_cast<__nv_bfloat16 *>(P),
                                                          static_cast<__nv_bfloat16 *>(dS), S, dP, lse, D, R, i1, i0,
                                                          group, Hq, (size_t)s0);
    return cudaGetLastError();
}
