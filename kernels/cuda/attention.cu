// Causal grouped-query attention on the GPU, flash style in FP32: no T x T matrix is ever stored.
//
// Forward: one block per (query tile of 64 rows, query head, sequence) walks the key tiles up to the diagonal with
// an online softmax (running max and sum per row), keeping the output rows in registers; it writes out and the
// log-sum-exp of the scaled scores. Backward recomputes the probabilities from lse, in two kernels and without
// atomics: dk/dv with one block per (key tile, KV head, sequence) that loops over the query heads of its group and
// the query tiles in a fixed order, dq with one block per (query tile, query head, sequence) that loops over the
// key tiles. Every output element is written by exactly one thread, summed in an order fixed by the shapes, so two
// runs give the same bits. Decode (attention_cached with few query rows) splits the keys over blocks and merges the
// partial softmaxes in split order.
//
// Layout (as the CPU's): q, out (N, Hq, hd); k, v (N, Hkv, hd); lse (N, Hq); query head h uses KV head
// h / (Hq / Hkv); scale 1/sqrt(hd). Tiles are SIMT FP32 (no tensor cores): simple, and as exact as the CPU's sgemm.
// A BF16 context's attention_forward and attention_backward run on tensor cores instead (attention_tc.cu); the
// cached and decode paths here serve both precisions.
//
// The KV cache of generation (the cached and batched decode paths) is fp32, or BF16 in a BF16 context (kernels.h,
// k_kv_elem_bytes): the kernels that read it are templated on its element type KV, widen each element to fp32 as
// they load it and compute in fp32 as before; with KV = float they are the fp32 kernels, the same bits.
#include <cuda_bf16.h>
#include <math.h>

#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256; // 16 x 16: tx = thread % 16 picks columns, ty = thread / 16 rows
constexpr int kTile = 64;     // query rows per forward block; keys per tile
constexpr int kSub = 32;      // backward: query rows per inner tile (dk/dv) and per dq block
constexpr int kMaxHd = 256;
constexpr int kDecodeThreads = 128; // 4 warps
constexpr int kDecodeSplit = 256;   // keys per decode block
constexpr int kDecodeMaxRows = 8;   // attention_cached uses the decode kernel up to this many query rows

__device__ __forceinline__ float max16(float v)
{
    // the 16 lanes of a half warp hold one row (tx = 0..15); xor 8, 4, 2, 1 stays inside it
    for (int o = 8; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float sum16(float v)
{
    for (int o = 8; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// An element of q, k or v (fp32), or of a BF16 KV cache, as fp32.
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// An fp32 value as a KV cache of element type KV stores it: itself, or rounded to BF16 (nearest even).
template <typename KV> __device__ __forceinline__ KV kv_from(float x);
template <> __device__ __forceinline__ float kv_from<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 kv_from<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// rows [r0, r0 + rows) of a (len, ld_g) matrix at g into shared s (rows x lds) as fp32, zeros past len
template <typename T>
__device__ __forceinline__ void load_rows(float *s, int lds, const T *g, size_t ld_g, int r0, int rows, int len, int hd)
{
    for (int idx = threadIdx.x; idx < rows * hd; idx += blockDim.x) {
        int r = idx / hd, d = idx - r * hd;
        s[r * lds + d] = r0 + r < len ? to_f32(g[(size_t)(r0 + r) * ld_g + d]) : 0.0f;
    }
}

// Forward. Sequence b: rows [s0, s0 + Lq) of q and [s0, s0 + Lk) of k, v (packed: cu_seqlens, Lq = Lk; cached:
// cu == NULL, one sequence of Lq queries and Lk keys, k and v a KV cache of element type KV). Query row i sits at
// position Lk - Lq + i and sees keys up to it. lse may be NULL.
template <int HDM, typename KV>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_kernel(float *out, float *lse, const float *q, const KV *k, const KV *v, const int32_t *cu, int Lq0,
                    int Lk0, int Hq, int Hkv, int hd, float scale)
{
    constexpr int ND = HDM / 16;
    extern __shared__ float smem[];
    const int ld = hd + 1; // odd stride: the rows a warp reads fall in distinct banks
    float *Qs = smem, *KVs = Qs + kTile * ld, *Ps = KVs + kTile * ld;
    constexpr int ldp = kTile + 1;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kTile;
    int s0 = 0, Lq = Lq0, Lk = Lk0;
    if (cu) {
        s0 = cu[b];
        Lq = Lk = cu[b + 1] - s0;
    }
    if (q0 >= Lq) // the whole block leaves together
        return;
    const int q_off = Lk - Lq, kh = h / (Hq / Hkv);
    const size_t ldq = (size_t)Hq * hd, ldk = (size_t)Hkv * hd;
    const float *qb = q + (size_t)s0 * ldq + (size_t)h * hd;
    const KV *kb = k + (size_t)s0 * ldk + (size_t)kh * hd, *vb = v + (size_t)s0 * ldk + (size_t)kh * hd;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

    load_rows(Qs, ld, qb, ldq, q0, kTile, Lq, hd);
    float m[4], l[4], acc[4][ND];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int c = 0; c < ND; c++)
            acc[i][c] = 0.0f;
    }
    const int kend = min(Lk, q_off + q0 + kTile); // keys the tile's last row may see
    for (int k0 = 0; k0 < kend; k0 += kTile) {
        __syncthreads(); // the previous tile's readers of KVs and Ps are done
        load_rows(KVs, ld, kb, ldk, k0, kTile, Lk, hd);
        __syncthreads();
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                s[i][j] = 0.0f;
        for (int d = 0; d < hd; d++) {
            float qv[4], kv[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                qv[i] = Qs[(ty + 16 * i) * ld + d];
#pragma unroll
            for (int j = 0; j < 4; j++)
                kv[j] = KVs[(tx + 16 * j) * ld + d];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    s[i][j] += qv[i] * kv[j];
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = q0 + ty + 16 * i, qpos = q_off + row;
            float rmax = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int col = k0 + tx + 16 * j;
                s[i][j] = row < Lq && col <= qpos ? s[i][j] * scale : -INFINITY;
                rmax = fmaxf(rmax, s[i][j]);
            }
            rmax = max16(rmax);
            const float mnew = fmaxf(m[i], rmax);
            const float muse = mnew == -INFINITY ? 0.0f : mnew; // a row with nothing visible yet stays empty
            const float alpha = expf(m[i] - muse);
            float rsum = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float p = expf(s[i][j] - muse);
                rsum += p;
                Ps[(ty + 16 * i) * ldp + tx + 16 * j] = p;
            }
            rsum = sum16(rsum);
            l[i] = l[i] * alpha + rsum;
            m[i] = mnew;
#pragma unroll
            for (int c = 0; c < ND; c++)
                acc[i][c] *= alpha;
        }
        __syncthreads(); // scores done with K: the buffer takes V
        load_rows(KVs, ld, vb, ldk, k0, kTile, Lk, hd);
        __syncthreads();
        for (int j = 0; j < kTile; j++) {
            float p[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                p[i] = Ps[(ty + 16 * i) * ldp + j];
#pragma unroll
            for (int c = 0; c < ND; c++) {
                const int d = tx + 16 * c;
                if (d < hd) {
                    const float vv = KVs[j * ld + d];
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        acc[i][c] += p[i] * vv;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int row = q0 + ty + 16 * i;
        if (row >= Lq)
            continue;
        const float inv = 1.0f / l[i]; // l >= 1: the row's maximum contributes exp(0)
        float *o = out + (size_t)(s0 + row) * ldq + (size_t)h * hd;
#pragma unroll
        for (int c = 0; c < ND; c++) {
            const int d = tx + 16 * c;
            if (d < hd)
                o[d] = acc[i][c] * inv;
        }
        if (lse && tx == 0)
            lse[(size_t)(s0 + row) * Hq + h] = m[i] + logf(l[i]);
    }
}

// D[r] = dout_r . out_r over hd, in double (as the CPU), one warp per (token, head) row.
__global__ void attn_bwd_dot_kernel(float *D, const float *dout, const float *out, size_t rows, int hd)
{
    const size_t r = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (r >= rows) // whole warps leave together
        return;
    const float *a = dout + r * hd, *o = out + r * hd;
    double acc = 0.0;
    for (int d = lane; d < hd; d += 32)
        acc += (double)a[d] * o[d];
    for (int off = 16; off > 0; off >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0)
        D[r] = (float)acc;
}

// dk, dv += for the keys [k0, k0 + 64) of KV head kh in sequence b: over the query heads kh * group + g
// (g = 0, 1, ...) and their query rows from the key tile's diagonal on, 32 at a time.
//   P_ij = exp(scale q_i.k_j - lse_i), dS_ij = P_ij (dout_i.v_j - D_i), dv_j += sum_i P_ij dout_i,
//   dk_j += scale sum_i dS_ij q_i.
template <int HDM>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dkdv_kernel(float *dk, float *dv, const float *dout, const float *lse, const float *Dd, const float *q,
                         const float *k, const float *v, const int32_t *cu, int Hq, int Hkv, int hd, float scale)
{
    constexpr int ND = HDM / 16;
    extern __shared__ float smem[];
    const int ld = hd + 1;
    constexpr int ldp = kSub + 1;
    float *Ks = smem, *Vs = Ks + kTile * ld, *Qs = Vs + kTile * ld, *dOs = Qs + kSub * ld;
    float *Ps = dOs + kSub * ld, *dSs = Ps + kTile * ldp, *lse_s = dSs + kTile * ldp, *D_s = lse_s + kSub;
    const int b = blockIdx.z, kh = blockIdx.y, k0 = blockIdx.x * kTile;
    const int s0 = cu[b], L = cu[b + 1] - s0;
    if (k0 >= L)
        return;
    const int group = Hq / Hkv;
    const size_t ldq = (size_t)Hq * hd, ldk = (size_t)Hkv * hd;
    const float *kb = k + (size_t)s0 * ldk + (size_t)kh * hd, *vb = v + (size_t)s0 * ldk + (size_t)kh * hd;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

    load_rows(Ks, ld, kb, ldk, k0, kTile, L, hd);
    load_rows(Vs, ld, vb, ldk, k0, kTile, L, hd);
    float gk[4][ND], gv[4][ND];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int c = 0; c < ND; c++)
            gk[a][c] = gv[a][c] = 0.0f;

    for (int g = 0; g < group; g++) {
        const int h = kh * group + g;
        const float *qb = q + (size_t)s0 * ldq + (size_t)h * hd, *ob = dout + (size_t)s0 * ldq + (size_t)h * hd;
        for (int i0 = (k0 / kSub) * kSub; i0 < L; i0 += kSub) {
            __syncthreads(); // the previous tile's readers are done
            load_rows(Qs, ld, qb, ldq, i0, kSub, L, hd);
            load_rows(dOs, ld, ob, ldq, i0, kSub, L, hd);
            for (int r = threadIdx.x; r < kSub; r += blockDim.x) {
                const bool in = i0 + r < L;
                lse_s[r] = in ? lse[(size_t)(s0 + i0 + r) * Hq + h] : 0.0f;
                D_s[r] = in ? Dd[(size_t)(s0 + i0 + r) * Hq + h] : 0.0f;
            }
            __syncthreads();
            // key rows ty + 16a (a < 4), query columns tx + 16c (c < 2)
            float sd[4][2], pd[4][2];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int c = 0; c < 2; c++)
                    sd[a][c] = pd[a][c] = 0.0f;
            for (int d = 0; d < hd; d++) {
                float kv[4], vv[4], qv[2], ov[2];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    kv[a] = Ks[(ty + 16 * a) * ld + d];
                    vv[a] = Vs[(ty + 16 * a) * ld + d];
                }
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    qv[c] = Qs[(tx + 16 * c) * ld + d];
                    ov[c] = dOs[(tx + 16 * c) * ld + d];
                }
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int c = 0; c < 2; c++) {
                        sd[a][c] += kv[a] * qv[c];
                        pd[a][c] += vv[a] * ov[c];
                    }
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int jr = ty + 16 * a, ic = tx + 16 * c, j = k0 + jr, i = i0 + ic;
                    const bool vis = i < L && j <= i;
                    const float p = vis ? expf(sd[a][c] * scale - lse_s[ic]) : 0.0f;
                    Ps[jr * ldp + ic] = p;
                    dSs[jr * ldp + ic] = p * (pd[a][c] - D_s[ic]);
                }
            __syncthreads();
            for (int i = 0; i < kSub; i++) {
                float p[4], ds[4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    p[a] = Ps[(ty + 16 * a) * ldp + i];
                    ds[a] = dSs[(ty + 16 * a) * ldp + i];
                }
#pragma unroll
                for (int c = 0; c < ND; c++) {
                    const int d = tx + 16 * c;
                    if (d < hd) {
                        const float ov = dOs[i * ld + d], qv = Qs[i * ld + d];
#pragma unroll
                        for (int a = 0; a < 4; a++) {
                            gv[a][c] += p[a] * ov;
                            gk[a][c] += ds[a] * qv;
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int j = k0 + ty + 16 * a;
        if (j >= L)
            continue;
        float *dkr = dk + (size_t)(s0 + j) * ldk + (size_t)kh * hd,
              *dvr = dv + (size_t)(s0 + j) * ldk + (size_t)kh * hd;
#pragma unroll
        for (int c = 0; c < ND; c++) {
            const int d = tx + 16 * c;
            if (d < hd) {
                dkr[d] += scale * gk[a][c];
                dvr[d] += gv[a][c];
            }
        }
    }
}

// dq += scale sum_j dS_ij k_j for the query rows [q0, q0 + 32) of head h in sequence b, over the key tiles up to
// the diagonal in order.
template <int HDM>
__global__ void __launch_bounds__(kThreads)
    attn_bwd_dq_kernel(float *dq, const float *dout, const float *lse, const float *Dd, const float *q, const float *k,
                       const float *v, const int32_t *cu, int Hq, int Hkv, int hd, float scale)
{
    constexpr int ND = HDM / 16;
    extern __shared__ float smem[];
    const int ld = hd + 1;
    constexpr int ldp = kTile + 1;
    float *Qs = smem, *dOs = Qs + kSub * ld, *Ks = dOs + kSub * ld, *Vs = Ks + kTile * ld;
    float *dSs = Vs + kTile * ld, *lse_s = dSs + kSub * ldp, *D_s = lse_s + kSub;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * kSub;
    const int s0 = cu[b], L = cu[b + 1] - s0;
    if (q0 >= L)
        return;
    const int kh = h / (Hq / Hkv);
    const size_t ldq = (size_t)Hq * hd, ldk = (size_t)Hkv * hd;
    const float *qb = q + (size_t)s0 * ldq + (size_t)h * hd, *ob = dout + (size_t)s0 * ldq + (size_t)h * hd;
    const float *kb = k + (size_t)s0 * ldk + (size_t)kh * hd, *vb = v + (size_t)s0 * ldk + (size_t)kh * hd;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;

    load_rows(Qs, ld, qb, ldq, q0, kSub, L, hd);
    load_rows(dOs, ld, ob, ldq, q0, kSub, L, hd);
    for (int r = threadIdx.x; r < kSub; r += blockDim.x) {
        const bool in = q0 + r < L;
        lse_s[r] = in ? lse[(size_t)(s0 + q0 + r) * Hq + h] : 0.0f;
        D_s[r] = in ? Dd[(size_t)(s0 + q0 + r) * Hq + h] : 0.0f;
    }
    float gq[2][ND];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int c = 0; c < ND; c++)
            gq[a][c] = 0.0f;
    const int kend = min(L, q0 + kSub);
    for (int k0 = 0; k0 < kend; k0 += kTile) {
        __syncthreads();
        load_rows(Ks, ld, kb, ldk, k0, kTile, L, hd);
        load_rows(Vs, ld, vb, ldk, k0, kTile, L, hd);
        __syncthreads();
        // query rows ty + 16a (a < 2), key columns tx + 16c (c < 4)
        float sd[2][4], pd[2][4];
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int c = 0; c < 4; c++)
                sd[a][c] = pd[a][c] = 0.0f;
        for (int d = 0; d < hd; d++) {
            float qv[2], ov[2], kv[4], vv[4];
#pragma unroll
            for (int a = 0; a < 2; a++) {
                qv[a] = Qs[(ty + 16 * a) * ld + d];
                ov[a] = dOs[(ty + 16 * a) * ld + d];
            }
#pragma unroll
            for (int c = 0; c < 4; c++) {
                kv[c] = Ks[(tx + 16 * c) * ld + d];
                vv[c] = Vs[(tx + 16 * c) * ld + d];
            }
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    sd[a][c] += qv[a] * kv[c];
                    pd[a][c] += ov[a] * vv[c];
                }
        }
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int ir = ty + 16 * a, jc = tx + 16 * c, i = q0 + ir, j = k0 + jc;
                const bool vis = i < L && j <= i;
                const float p = vis ? expf(sd[a][c] * scale - lse_s[ir]) : 0.0f;
                dSs[ir * ldp + jc] = p * (pd[a][c] - D_s[ir]);
            }
        __syncthreads();
        for (int j = 0; j < kTile; j++) {
            float ds[2];
#pragma unroll
            for (int a = 0; a < 2; a++)
                ds[a] = dSs[(ty + 16 * a) * ldp + j];
#pragma unroll
            for (int c = 0; c < ND; c++) {
                const int d = tx + 16 * c;
                if (d < hd) {
                    const float kv = Ks[j * ld + d];
#pragma unroll
                    for (int a = 0; a < 2; a++)
                        gq[a][c] += ds[a] * kv;
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 2; a++) {
        const int i = q0 + ty + 16 * a;
        if (i >= L)
            continue;
        float *r = dq + (size_t)(s0 + i) * ldq + (size_t)h * hd;
#pragma unroll
        for (int c = 0; c < ND; c++) {
            const int d = tx + 16 * c;
            if (d < hd)
                r[d] += scale * gq[a][c];
        }
    }
}

// A decode warp's query row: lane's share of q (d = lane + 32 t), and its accumulators zeroed.
template <int HDM>
__device__ __forceinline__ void decode_load_q(float *qv, float *acc, const float *qr, int lane, int hd)
{
#pragma unroll
    for (int t = 0; t < HDM / 32; t++) {
        const int d = lane + 32 * t;
        qv[t] = d < hd ? qr[d] : 0.0f;
        acc[t] = 0.0f;
    }
}

// One key (kr) and value (vr) row, fp32 or a BF16 cache's, into a warp's online softmax: the score summed over the
// lanes, the running maximum m and sum l, and the lane's accumulated values rescaled and added to.
template <int HDM, typename T>
__device__ __forceinline__ void decode_key(float *acc, float &m, float &l, const float *qv, const T *kr, const T *vr,
                                           int lane, int hd, float scale)
{
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < HDM / 32; t++) {
        const int d = lane + 32 * t;
        if (d < hd)
            s += qv[t] * to_f32(kr[d]);
    }
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    s *= scale;
    const float mnew = fmaxf(m, s), alpha = expf(m - mnew), p = expf(s - mnew);
    l = l * alpha + p;
#pragma unroll
    for (int t = 0; t < HDM / 32; t++) {
        const int d = lane + 32 * t;
        acc[t] = acc[t] * alpha + (d < hd ? p * to_f32(vr[d]) : 0.0f);
    }
    m = mnew;
}

// A decode block's warps hand over their softmax states (m, l and the lane's values) in shared memory; returns the
// largest maximum M (-INFINITY when no warp saw a key).
template <int HDM>
__device__ __forceinline__ float decode_warps_meet(float *wm, float *wl, float (*wacc)[HDM], const float *acc, float m,
                                                   float l, int lane, int warp)
{
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < HDM / 32; t++)
        wacc[warp][lane + 32 * t] = acc[t];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < kDecodeThreads / 32; w++)
        M = fmaxf(M, wm[w]);
    return M;
}

// Decode, pass 1: block (split sp, head h, query row i) runs an online softmax over the keys
// [sp * kDecodeSplit, ...) that row i sees (positions up to Tk - Tq + i), one key per warp at a time, and writes
// its partial (hd accumulated values, then the maximum and the sum of exponentials) to part. kc, vc: a KV cache of
// element type KV.
template <int HDM, typename KV>
__global__ void __launch_bounds__(kDecodeThreads)
    attn_decode_partial_kernel(float *part, const float *q, const KV *kc, const KV *vc, int Tq, int Tk, int Hq, int Hkv,
                               int hd, float scale, int splits)
{
    constexpr int NL = HDM / 32, NW = kDecodeThreads / 32;
    __shared__ float wm[NW], wl[NW], wacc[NW][HDM];
    const int sp = blockIdx.x, h = blockIdx.y, i = blockIdx.z;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, kh = h / (Hq / Hkv);
    const int nvis = Tk - Tq + i + 1;
    const int j0 = sp * kDecodeSplit, j1 = min(nvis, j0 + kDecodeSplit);
    const size_t ldk = (size_t)Hkv * hd;
    float qv[NL], acc[NL];
    decode_load_q<HDM>(qv, acc, q + ((size_t)i * Hq + h) * hd, lane, hd);
    float m = -INFINITY, l = 0.0f;
    for (int j = j0 + warp; j < j1; j += NW)
        decode_key<HDM>(acc, m, l, qv, kc + (size_t)j * ldk + (size_t)kh * hd, vc + (size_t)j * ldk + (size_t)kh * hd,
                        lane, hd, scale);
    const float M = decode_warps_meet<HDM>(wm, wl, wacc, acc, m, l, lane, warp);
    float *dst = part + (((size_t)i * Hq + h) * splits + sp) * (size_t)(hd + 2);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < NW; w++)
                a += wacc[w][d] * expf(wm[w] - M);
        dst[d] = a;
    }
    if (threadIdx.x == 0) {
        float Ls = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < NW; w++)
                Ls += wl[w] * expf(wm[w] - M);
        dst[hd] = M;
        dst[hd + 1] = Ls;
    }
}

// Decode, pass 2: out row (i, h) = the splits' partials merged in split order.
__global__ void attn_decode_merge_kernel(float *out, const float *part, int Hq, int hd, int splits)
{
    const int h = blockIdx.x, i = blockIdx.y;
    const float *src = part + ((size_t)i * Hq + h) * splits * (size_t)(hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++)
        M = fmaxf(M, src[(size_t)s * (hd + 2) + hd]);
    // split 0 holds key 0, which every row sees: M is finite
    float L = 0.0f;
    for (int s = 0; s < splits; s++) {
        const float *p = src + (size_t)s * (hd + 2);
        if (p[hd + 1] > 0.0f)
            L += p[hd + 1] * expf(p[hd] - M);
    }
    float *o = out + ((size_t)i * Hq + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float *p = src + (size_t)s * (hd + 2);
            if (p[hd + 1] > 0.0f)
                a += p[d] * expf(p[hd] - M);
        }
        o[d] = a / L;
    }
}

// Batched decode: block (query head h, sequence b) of a step in which every sequence has one new token. The first
// query head of each KV group appends the sequence's new key and value rows (k, v row b) to its caches kc[b] and
// vc[b] (element type KV) at position len[b]; every block attends its query row over the len[b] cached keys and the
// new one, which it takes from k and v as the cache stores it (kv_from), not from the cache (no block reads what
// another writes). One key per warp at a time with an online softmax, the warps merged in order: for up to
// kDecodeSplit keys the same arithmetic, in the same order, as attention_cached's split-key pass and merge, so the
// same bits.
template <int HDM, typename KV>
__global__ void __launch_bounds__(kDecodeThreads)
    attn_decode_batched_kernel(float *out, const float *q, const float *knew, const float *vnew, void *const *kc,
                               void *const *vc, const int32_t *len, int Hq, int Hkv, int hd, float scale)
{
    constexpr int NL = HDM / 32, NW = kDecodeThreads / 32;
    __shared__ float wm[NW], wl[NW], wacc[NW][HDM], kn[HDM], vn[HDM];
    const int h = blockIdx.x, b = blockIdx.y;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, group = Hq / Hkv, kh = h / group;
    const int T = len[b];
    const size_t ldk = (size_t)Hkv * hd, at = (size_t)kh * hd;
    const float *knb = knew + (size_t)b * ldk + at, *vnb = vnew + (size_t)b * ldk + at;
    KV *kb = static_cast<KV *>(kc[b]), *vb = static_cast<KV *>(vc[b]);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) { // the new row in the cache's precision, for every warp
        const KV kd = kv_from<KV>(knb[d]), vd = kv_from<KV>(vnb[d]);
        kn[d] = to_f32(kd);
        vn[d] = to_f32(vd);
        if (h % group == 0) {
            kb[(size_t)T * ldk + at + d] = kd;
            vb[(size_t)T * ldk + at + d] = vd;
        }
    }
    __syncthreads();
    float qv[NL], acc[NL];
    decode_load_q<HDM>(qv, acc, q + ((size_t)b * Hq + h) * hd, lane, hd);
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j <= T; j += NW) {
        if (j < T)
            decode_key<HDM>(acc, m, l, qv, kb + (size_t)j * ldk + at, vb + (size_t)j * ldk + at, lane, hd, scale);
        else
            decode_key<HDM>(acc, m, l, qv, kn, vn, lane, hd, scale);
    }
    const float M = decode_warps_meet<HDM>(wm, wl, wacc, acc, m, l, lane, warp);
    // M is finite: key 0 (the new one when T = 0) is seen by warp 0
    float Ls = 0.0f;
    for (int w = 0; w < NW; w++)
        Ls += wl[w] * expf(wm[w] - M);
    // (the merge of one split scales its sum and values by expf(M - M) = 1: the same bits)
    float *o = out + ((size_t)b * Hq + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < NW; w++)
            a += wacc[w][d] * expf(wm[w] - M);
        o[d] = a / Ls;
    }
}

template <int HDM, typename KV>
cudaError_t decode_batched_launch(float *out, const float *q, const float *k, const float *v, void *const *kc,
                                  void *const *vc, const int32_t *len, int B, int Hq, int Hkv, int hd,
                                  cudaStream_t stream)
{
    const float scale = (float)(1.0 / sqrt((double)hd));
    attn_decode_batched_kernel<HDM, KV>
        <<<dim3((unsigned)Hq, (unsigned)B), kDecodeThreads, 0, stream>>>(out, q, k, v, kc, vc, len, Hq, Hkv, hd, scale);
    return cudaGetLastError();
}

int hd_class(int hd) { return hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 256; }

size_t fwd_smem(int hd) { return sizeof(float) * ((size_t)2 * kTile * (hd + 1) + (size_t)kTile * (kTile + 1)); }
size_t dkdv_smem(int hd)
{
    return sizeof(float) *
           ((size_t)2 * kTile * (hd + 1) + (size_t)2 * kSub * (hd + 1) + (size_t)2 * kTile * (kSub + 1) + 2 * kSub);
}
size_t dq_smem(int hd)
{
    return sizeof(float) *
           ((size_t)2 * kSub * (hd + 1) + (size_t)2 * kTile * (hd + 1) + (size_t)kSub * (kTile + 1) + 2 * kSub);
}

// Opt a kernel in to `bytes` of dynamic shared memory (beyond the default 48 KiB) and launch it.
template <typename Kernel, typename... Args>
cudaError_t launch_smem(Kernel kernel, dim3 grid, size_t bytes, cudaStream_t stream, Args... args)
{
    cudaError_t rc = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (rc != cudaSuccess)
        return rc;
    kernel<<<grid, kThreads, bytes, stream>>>(args...);
    return cudaGetLastError();
}

template <int HDM, typename KV>
cudaError_t fwd_launch(float *out, float *lse, const float *q, const KV *k, const KV *v, const int32_t *cu, int Lq,
                       int Lk, int B, int max_len, int Hq, int Hkv, int hd, cudaStream_t stream)
{
    dim3 grid((unsigned)((max_len + kTile - 1) / kTile), (unsigned)Hq, (unsigned)B);
    float scale = (float)(1.0 / sqrt((double)hd));
    return launch_smem(attn_fwd_kernel<HDM, KV>, grid, fwd_smem(hd), stream, out, lse, q, k, v, cu, Lq, Lk, Hq, Hkv, hd,
                       scale);
}

template <int HDM>
cudaError_t bwd_launch(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *D,
                       const float *q, const float *k, const float *v, const int32_t *cu, int B, int max_len, int Hq,
                       int Hkv, int hd, cudaStream_t stream)
{
    float scale = (float)(1.0 / sqrt((double)hd));
    dim3 gkv((unsigned)((max_len + kTile - 1) / kTile), (unsigned)Hkv, (unsigned)B);
    cudaError_t rc = launch_smem(attn_bwd_dkdv_kernel<HDM>, gkv, dkdv_smem(hd), stream, dk, dv, dout, lse, D, q, k, v,
                                 cu, Hq, Hkv, hd, scale);
    if (rc != cudaSuccess)
        return rc;
    dim3 gq((unsigned)((max_len + kSub - 1) / kSub), (unsigned)Hq, (unsigned)B);
    return launch_smem(attn_bwd_dq_kernel<HDM>, gq, dq_smem(hd), stream, dq, dout, lse, D, q, k, v, cu, Hq, Hkv, hd,
                       scale);
}

template <int HDM, typename KV>
cudaError_t decode_launch(float *out, const float *q, const KV *kc, const KV *vc, int Tq, int Tk, int Hq, int Hkv,
                          int hd, float *part, cudaStream_t stream)
{
    const int splits = (Tk + kDecodeSplit - 1) / kDecodeSplit;
    float scale = (float)(1.0 / sqrt((double)hd));
    attn_decode_partial_kernel<HDM, KV>
        <<<dim3((unsigned)splits, (unsigned)Hq, (unsigned)Tq), kDecodeThreads, 0, stream>>>(part, q, kc, vc, Tq, Tk, Hq,
                                                                                            Hkv, hd, scale, splits);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    attn_decode_merge_kernel<<<dim3((unsigned)Hq, (unsigned)Tq), kDecodeThreads, 0, stream>>>(out, part, Hq, hd,
                                                                                              splits);
    return cudaGetLastError();
}

// KV-cache attention of one sequence over a cache of element type KV: the split-key decode kernels for up to
// kDecodeMaxRows query rows (part: their partials), else the tiled forward.
template <int HDM, typename KV>
cudaError_t cached_launch(float *out, const float *q, const KV *kc, const KV *vc, int Tq, int Tk, int Hq, int Hkv,
                          int hd, float *part, cudaStream_t stream)
{
    if (Tq <= kDecodeMaxRows)
        return decode_launch<HDM>(out, q, kc, vc, Tq, Tk, Hq, Hkv, hd, part, stream);
    return fwd_launch<HDM>(out, nullptr, q, kc, vc, nullptr, Tq, Tk, 1, Tq, Hq, Hkv, hd, stream);
}

// The two by head size class.
template <typename KV>
cudaError_t cached_dispatch(float *out, const float *q, const KV *kc, const KV *vc, int Tq, int Tk, int Hq, int Hkv,
                            int hd, float *part, cudaStream_t stream)
{
    switch (hd_class(hd)) {
    case 32: return cached_launch<32>(out, q, kc, vc, Tq, Tk, Hq, Hkv, hd, part, stream);
    case 64: return cached_launch<64>(out, q, kc, vc, Tq, Tk, Hq, Hkv, hd, part, stream);
    case 128: return cached_launch<128>(out, q, kc, vc, Tq, Tk, Hq, Hkv, hd, part, stream);
    default: return cached_launch<256>(out, q, kc, vc, Tq, Tk, Hq, Hkv, hd, part, stream);
    }
}

template <typename KV>
cudaError_t decode_batched_dispatch(float *out, const float *q, const float *k, const float *v, void *const *kc,
                                    void *const *vc, const int32_t *len, int B, int Hq, int Hkv, int hd,
                                    cudaStream_t stream)
{
    switch (hd_class(hd)) {
    case 32: return decode_batched_launch<32, KV>(out, q, k, v, kc, vc, len, B, Hq, Hkv, hd, stream);
    case 64: return decode_batched_launch<64, KV>(out, q, k, v, kc, vc, len, B, Hq, Hkv, hd, stream);
    case 128: return decode_batched_launch<128, KV>(out, q, k, v, kc, vc, len, B, Hq, Hkv, hd, stream);
    default: return decode_batched_launch<256, KV>(out, q, k, v, kc, vc, len, B, Hq, Hkv, hd, stream);
    }
}

bool bad_heads(int Hq, int Hkv, int hd) { return Hq <= 0 || Hkv <= 0 || hd <= 0 || hd > kMaxHd || Hq % Hkv != 0; }

} // namespace

extern "C" size_t attention_smem_bytes(int hd, int backward)
{
    if (!backward)
        return fwd_smem(hd);
    return dkdv_smem(hd) > dq_smem(hd) ? dkdv_smem(hd) : dq_smem(hd);
}

extern "C" cudaError_t attention_forward_cuda(float *out, float *lse, const float *q, const float *k, const float *v,
                                              const int32_t *cu_seqlens, int B, int max_len, int Hq, int Hkv, int hd,
                                              cudaStream_t stream)
{
    if (bad_heads(Hq, Hkv, hd) || B < 0 || B > 65535 || Hq > 65535)
        return cudaErrorInvalidValue;
    if (B == 0 || max_len <= 0)
        return cudaSuccess;
    switch (hd_class(hd)) {
    case 32: return fwd_launch<32>(out, lse, q, k, v, cu_seqlens, 0, 0, B, max_len, Hq, Hkv, hd, stream);
    case 64: return fwd_launch<64>(out, lse, q, k, v, cu_seqlens, 0, 0, B, max_len, Hq, Hkv, hd, stream);
    case 128: return fwd_launch<128>(out, lse, q, k, v, cu_seqlens, 0, 0, B, max_len, Hq, Hkv, hd, stream);
    default: return fwd_launch<256>(out, lse, q, k, v, cu_seqlens, 0, 0, B, max_len, Hq, Hkv, hd, stream);
    }
}

extern "C" size_t attention_backward_cuda_scratch_bytes(int N, int Hq)
{
    if (N <= 0 || Hq <= 0)
        return 0;
    return sizeof(float) * (size_t)N * (size_t)Hq;
}

extern "C" cudaError_t attention_backward_cuda(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                               const float *lse, const float *q, const float *k, const float *v,
                                               const int32_t *cu_seqlens, int B, int N, int max_len, int Hq, int Hkv,
                                               int hd, void *scratch, cudaStream_t stream)
{
    if (bad_heads(Hq, Hkv, hd) || B < 0 || B > 65535 || Hq > 65535)
        return cudaErrorInvalidValue;
    if (B == 0 || max_len <= 0 || N <= 0)
        return cudaSuccess;
    if (!scratch)
        return cudaErrorInvalidValue;
    float *D = static_cast<float *>(scratch);
    const size_t rows = (size_t)N * Hq;
    attn_bwd_dot_kernel<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, stream>>>(D, dout, out, rows, hd);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    switch (hd_class(hd)) {
    case 32: return bwd_launch<32>(dq, dk, dv, dout, lse, D, q, k, v, cu_seqlens, B, max_len, Hq, Hkv, hd, stream);
    case 64: return bwd_launch<64>(dq, dk, dv, dout, lse, D, q, k, v, cu_seqlens, B, max_len, Hq, Hkv, hd, stream);
    case 128: return bwd_launch<128>(dq, dk, dv, dout, lse, D, q, k, v, cu_seqlens, B, max_len, Hq, Hkv, hd, stream);
    default: return bwd_launch<256>(dq, dk, dv, dout, lse, D, q, k, v, cu_seqlens, B, max_len, Hq, Hkv, hd, stream);
    }
}

extern "C" size_t attention_cached_cuda_scratch_bytes(int Tq, int Tk, int Hq, int hd)
{
    if (Tq <= 0 || Tq > kDecodeMaxRows || Tk <= 0 || Hq <= 0 || hd <= 0)
        return 0;
    const size_t splits = (size_t)(Tk + kDecodeSplit - 1) / kDecodeSplit;
    return sizeof(float) * (size_t)Tq * (size_t)Hq * splits * (size_t)(hd + 2);
}

extern "C" cudaError_t attention_cached_cuda(float *out, const float *q, const void *kcache, const void *vcache,
                                             int kv_bf16, int Tq, int Tk, int Hq, int Hkv, int hd, void *scratch,
                                             cudaStream_t stream)
{
    if (bad_heads(Hq, Hkv, hd) || Tq < 0 || Tq > Tk || Hq > 65535)
        return cudaErrorInvalidValue;
    if (Tq == 0)
        return cudaSuccess;
    if (Tq <= kDecodeMaxRows && !scratch)
        return cudaErrorInvalidValue;
    float *part = static_cast<float *>(scratch);
    if (kv_bf16)
        return cached_dispatch(out, q, static_cast<const __nv_bfloat16 *>(kcache),
                               static_cast<const __nv_bfloat16 *>(vcache), Tq, Tk, Hq, Hkv, hd, part, stream);
    return cached_dispatch(out, q, static_cast<const float *>(kcache), static_cast<const float *>(vcache), Tq, Tk, Hq,
                           Hkv, hd, part, stream);
}

extern "C" cudaError_t attention_decode_batched_cuda(float *out, const float *q, const float *k, const float *v,
                                                     void *const *kc, void *const *vc, int kv_bf16, const int32_t *len,
                                                     int B, int Hq, int Hkv, int hd, cudaStream_t stream)
{
    if (bad_heads(Hq, Hkv, hd) || B < 0 || B > 65535)
        return cudaErrorInvalidValue;
    if (B == 0)
        return cudaSuccess;
    if (kv_bf16)
        return decode_batched_dispatch<__nv_bfloat16>(out, q, k, v, kc, vc, len, B, Hq, Hkv, hd, stream);
    return decode_batched_dispatch<float>(out, q, k, v, kc, vc, len, B, Hq, Hkv, hd, stream);
}
