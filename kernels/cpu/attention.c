/* Causal grouped-query attention on the CPU. Work is done per (sequence, query head) in blocks of
 * ATTN_BLOCK query rows: the block's scores against all keys it may see are one sgemm, the masked
 * softmax is done in place, and the output is a second sgemm. Scratch is ATTN_BLOCK x (longest
 * sequence) floats; backward recomputes the probabilities from the saved log-sum-exp. */
#include <cblas.h>
#include <math.h>

#include "common/check.h"
#include "cpu_kernels.h"

#define ATTN_BLOCK 64

static int imin(int a, int b) { return a < b ? a : b; }

/* sum of x[0..n) in double, in 8 interleaved partial sums (a fixed order the compiler can run as SIMD lanes) */
static double row_sum(const float *x, int n)
{
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += x[j + l];
    for (; j < n; j++)
        acc[j & 7] += x[j];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

static void check_heads(const char *who, int Hq, int Hkv, int hd)
{
    if (Hq <= 0 || Hkv <= 0 || hd <= 0 || Hq % Hkv != 0)
        check_failf(__FILE__, __LINE__, "%s: bad head layout Hq=%d Hkv=%d hd=%d (need Hq %% Hkv == 0)", who, Hq, Hkv,
                    hd);
}

/* Longest sequence; fails when an offset is negative or offsets decrease. */
static int max_seqlen(const char *who, const int32_t *cu, int B)
{
    int m = 0;
    for (int b = 0; b < B; b++) {
        int L = cu[b + 1] - cu[b];
        if (L < 0 || cu[b] < 0)
            check_failf(__FILE__, __LINE__, "%s: cu_seqlens[%d], [%d] = %d, %d is not a valid range", who, b, b + 1,
                        (int)cu[b], (int)cu[b + 1]);
        if (L > m)
            m = L;
    }
    return m;
}

/* One query head over one sequence. Query row i (0..Tq-1) sits at position q_off + i and sees keys
 * 0..q_off+i. q and out rows are ldq floats apart, k and v rows ldk apart, lse entries ld_lse apart
 * (lse may be NULL). S: scratch of ATTN_BLOCK * (q_off + Tq) floats. */
static void head_forward(float *out, float *lse, int ld_lse, const float *q, int ldq, const float *k, const float *v,
                         int ldk, int Tq, int q_off, int hd, float scale, float *S)
{
    for (int r0 = 0; r0 < Tq; r0 += ATTN_BLOCK) {
        int nb = imin(ATTN_BLOCK, Tq - r0), nk = q_off + r0 + nb;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, nk, hd, scale, q + (size_t)r0 * ldq, ldq, k, ldk, 0.0f,
                    S, nk);
        for (int i = 0; i < nb; i++) {
            float *si = S + (size_t)i * nk;
            int last = q_off + r0 + i;
            float m = si[0];
            for (int j = 1; j <= last; j++)
                m = si[j] > m ? si[j] : m;
            vec_exp_shifted(si, si, (size_t)last + 1, m);
            double sum = row_sum(si, last + 1);
            float inv = (float)(1.0 / sum);
            for (int j = 0; j <= last; j++)
                si[j] *= inv;
            for (int j = last + 1; j < nk; j++)
                si[j] = 0.0f;
            if (lse)
                lse[(size_t)(r0 + i) * ld_lse] = (float)(m + log(sum));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, hd, nk, 1.0f, S, nk, v, ldk, 0.0f,
                    out + (size_t)r0 * ldq, ldq);
    }
}

#define MULTI_TARGET __attribute__((target_clones("avx512f", "avx2", "default")))

/* One query row (a decode step) of one head against keys 0..nk-1: the scores as dot products in 8 interleaved
 * partial sums and the output as a weighted sum of v's rows, in loops the compiler runs as SIMD lanes. sgemm on a
 * 1 x nk x hd product spent more in packing its operands than in the products: 18% of a decode step at batch 32
 * went to OpenBLAS for these (perf, docs/performance.md). S: nk floats. */
MULTI_TARGET static void head_decode(float *out, const float *q, const float *k, const float *v, int ldk, int nk,
                                     int hd, float scale, float *S)
{
    for (int j = 0; j < nk; j++) {
        const float *kj = k + (size_t)j * ldk;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int d = 0;
        for (; d + 8 <= hd; d += 8)
            for (int l = 0; l < 8; l++)
                acc[l] += q[d + l] * kj[d + l];
        for (; d < hd; d++)
            acc[d & 7] += q[d] * kj[d];
        S[j] = scale * (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])));
    }
    float m = S[0];
    for (int j = 1; j < nk; j++)
        m = S[j] > m ? S[j] : m;
    vec_exp_shifted(S, S, (size_t)nk, m);
    const float inv = (float)(1.0 / row_sum(S, nk));
    for (int d = 0; d < hd; d++)
        out[d] = 0.0f;
    for (int j = 0; j < nk; j++) {
        const float p = S[j] * inv, *vj = v + (size_t)j * ldk;
        for (int d = 0; d < hd; d++)
            out[d] += p * vj[d];
    }
}

void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const int32_t *cu_seqlens, int B, int Hq, int Hkv, int hd)
{
    check_heads("attention_forward", Hq, Hkv, hd);
    int maxL = max_seqlen("attention_forward", cu_seqlens, B);
    if (maxL == 0)
        return;
    float *S = xmalloc(sizeof(float) * (size_t)imin(ATTN_BLOCK, maxL) * maxL);
    int group = Hq / Hkv, ldq = Hq * hd, ldk = Hkv * hd;
    float scale = (float)(1.0 / sqrt((double)hd));
    for (int b = 0; b < B; b++) {
        size_t s0 = (size_t)cu_seqlens[b];
        int L = cu_seqlens[b + 1] - cu_seqlens[b];
        if (L == 0)
            continue;
        for (int h = 0; h < Hq; h++) {
            int kh = h / group;
            head_forward(out + s0 * ldq + (size_t)h * hd, lse ? lse + s0 * Hq + h : NULL, Hq,
                         q + s0 * ldq + (size_t)h * hd, ldq, k + s0 * ldk + (size_t)kh * hd,
                         v + s0 * ldk + (size_t)kh * hd, ldk, L, 0, hd, scale, S);
        }
    }
    free(S);
}

/* Backward of one query head over one sequence (q_off = 0); strides as in head_forward.
 * P, dP: scratch of ATTN_BLOCK * T floats each. With P_ij = exp(s_ij - lse_i) and
 * D_i = dout_i . out_i:  dS_ij = P_ij (dout_i . v_j - D_i);  dq_i += scale sum_j dS_ij k_j;
 * dk_j += scale sum_i dS_ij q_i;  dv_j += sum_i P_ij dout_i. */
static void head_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                          int ld_lse, const float *q, int ldq, const float *k, const float *v, int ldk, int T, int hd,
                          float scale, float *P, float *dP)
{
    for (int r0 = 0; r0 < T; r0 += ATTN_BLOCK) {
        int nb = imin(ATTN_BLOCK, T - r0), nk = r0 + nb;
        const float *qb = q + (size_t)r0 * ldq, *dob = dout + (size_t)r0 * ldq, *ob = out + (size_t)r0 * ldq;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, nk, hd, scale, qb, ldq, k, ldk, 0.0f, P, nk);
        for (int i = 0; i < nb; i++) {
            float *pi = P + (size_t)i * nk;
            int last = r0 + i;
            float l = lse[(size_t)(r0 + i) * ld_lse];
            /* the scores are those of the forward (same products), so s - lse <= 0 up to rounding */
            vec_exp_shifted(pi, pi, (size_t)last + 1, l);
            for (int j = last + 1; j < nk; j++)
                pi[j] = 0.0f;
        }
        /* dv (nk, hd) += P^T (nk, nb) dout_blk (nb, hd) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, nb, 1.0f, P, nk, dob, ldq, 1.0f, dv, ldk);
        /* dP (nb, nk) = dout_blk v^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, nk, hd, 1.0f, dob, ldq, v, ldk, 0.0f, dP, nk);
        for (int i = 0; i < nb; i++) {
            const float *doi = dob + (size_t)i * ldq, *oi = ob + (size_t)i * ldq;
            double Di = 0.0;
            for (int d = 0; d < hd; d++)
                Di += (double)doi[d] * oi[d];
            float Dif = (float)Di;
            float *pi = P + (size_t)i * nk, *dpi = dP + (size_t)i * nk;
            for (int j = 0; j < nk; j++) /* masked P are 0, so masked dS are 0 */
                dpi[j] = pi[j] * (dpi[j] - Dif);
        }
        /* dq_blk (nb, hd) += scale dS (nb, nk) k (nk, hd);  dk (nk, hd) += scale dS^T q_blk */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, hd, nk, scale, dP, nk, k, ldk, 1.0f,
                    dq + (size_t)r0 * ldq, ldq);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, nb, scale, dP, nk, qb, ldq, 1.0f, dk, ldk);
    }
}

void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, const int32_t *cu_seqlens, int B, int Hq,
                        int Hkv, int hd)
{
    check_heads("attention_backward", Hq, Hkv, hd);
    int maxL = max_seqlen("attention_backward", cu_seqlens, B);
    if (maxL == 0)
        return;
    size_t scratch = (size_t)imin(ATTN_BLOCK, maxL) * maxL;
    float *P = xmalloc(sizeof(float) * scratch), *dP = xmalloc(sizeof(float) * scratch);
    int group = Hq / Hkv, ldq = Hq * hd, ldk = Hkv * hd;
    float scale = (float)(1.0 / sqrt((double)hd));
    for (int b = 0; b < B; b++) {
        size_t s0 = (size_t)cu_seqlens[b];
        int L = cu_seqlens[b + 1] - cu_seqlens[b];
        if (L == 0)
            continue;
        for (int h = 0; h < Hq; h++) {
            size_t qo = s0 * ldq + (size_t)h * hd, ko = s0 * ldk + (size_t)(h / group) * hd;
            head_backward(dq + qo, dk + ko, dv + ko, dout + qo, out + qo, lse + s0 * Hq + h, Hq, q + qo, ldq, k + ko,
                          v + ko, ldk, L, hd, scale, P, dP);
        }
    }
    free(P);
    free(dP);
}

void attention_cached(float *out, const float *q, const float *kcache, const float *vcache, int Tq, int Tk, int Hq,
                      int Hkv, int hd)
{
    check_heads("attention_cached", Hq, Hkv, hd);
    if (Tq < 0 || Tq > Tk)
        check_failf(__FILE__, __LINE__, "attention_cached: Tq=%d queries but Tk=%d cached positions", Tq, Tk);
    if (Tq == 0)
        return;
    float *S = xmalloc(sizeof(float) * (size_t)imin(ATTN_BLOCK, Tq) * Tk);
    int group = Hq / Hkv, ldq = Hq * hd, ldk = Hkv * hd;
    float scale = (float)(1.0 / sqrt((double)hd));
    for (int h = 0; h < Hq; h++) {
        size_t ko = (size_t)(h / group) * hd;
        if (Tq == 1) /* a decode step */
            head_decode(out + (size_t)h * hd, q + (size_t)h * hd, kcache + ko, vcache + ko, ldk, Tk, hd, scale, S);
        else
            head_forward(out + (size_t)h * hd, NULL, 0, q + (size_t)h * hd, ldq, kcache + ko, vcache + ko, ldk, Tq,
                         Tk - Tq, hd, scale, S);
    }
    free(S);
}
