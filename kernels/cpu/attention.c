/* Causal grouped-query attention on the CPU. Work is done per (sequence, query head) in blocks of
 * ATTN_BLOCK query rows: the block's scores against all keys it may see are one sgemm, the masked
 * softmax is done in place, and the output is a second sgemm. Scratch is ATTN_BLOCK x (longest
 * sequence) floats; backward recomputes the probabilities from the saved log-sum-exp. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "common/check.h"
#include "cpu_bf16.h"
#include "cpu_kernels.h"
#include "isa_variants.h"
#include "pool.h"

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

/* One query row (a decode step) of one head against keys 0..nk-1: the scores as dot products in 8 interleaved
 * partial sums and the output as a weighted sum of v's rows, in loops the compiler runs as SIMD lanes. sgemm on a
 * 1 x nk x hd product spent more in packing its operands than in the products: 18% of a decode step at batch 32
 * went to OpenBLAS for these (perf, docs/results/performance.md). S: nk floats. lse (NULL: not wanted) gets the
 * row's log-sum-exp. In batch-invariant mode every query row, of a decode step, a prefill or a training forward,
 * goes through here: its bits depend on its own query and keys only. */
static inline __attribute__((always_inline)) void head_decode_body(float *out, float *lse, const float *q,
                                                                   const float *k, const float *v, int ldk, int nk,
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
    const double sum = row_sum(S, nk);
    const float inv = (float)(1.0 / sum);
    if (lse)
        *lse = (float)(m + log(sum));
    for (int d = 0; d < hd; d++)
        out[d] = 0.0f;
    for (int j = 0; j < nk; j++) {
        const float p = S[j] * inv, *vj = v + (size_t)j * ldk;
        for (int d = 0; d < hd; d++)
            out[d] += p * vj[d];
    }
}

CPU_ISA_VARIANTS(static, head_decode,
                 (float *out, float *lse, const float *q, const float *k, const float *v, int ldk, int nk, int hd,
                  float scale, float *S),
                 (out, lse, q, k, v, ldk, nk, hd, scale, S))

/* One query head over one sequence. Query row i (0..Tq-1) sits at position q_off + i and sees keys
 * 0..q_off+i. q and out rows are ldq floats apart, k and v rows ldk apart, lse entries ld_lse apart
 * (lse may be NULL). S: scratch of ATTN_BLOCK * (q_off + Tq) floats. */
static void head_forward(float *out, float *lse, int ld_lse, const float *q, int ldq, const float *k, const float *v,
                         int ldk, int Tq, int q_off, int hd, float scale, float *S)
{
    if (k_batch_invariant()) { /* one row at a time, as a decode step takes it */
        for (int i = 0; i < Tq; i++)
            head_decode(out + (size_t)i * ldq, lse ? lse + (size_t)i * ld_lse : NULL, q + (size_t)i * ldq, k, v, ldk,
                        q_off + i + 1, hd, scale, S);
        return;
    }
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

/* Checks prefix_of (NULL, or B entries of -1 or an earlier-or-later sequence that has no prefix itself) and
 * returns the most keys one query row of the batch sees. */
static int max_keys(const char *who, const int32_t *cu, const int32_t *prefix_of, int B)
{
    int m = 0;
    max_seqlen(who, cu, B);
    for (int b = 0; b < B; b++) {
        int L = cu[b + 1] - cu[b], p = prefix_of ? prefix_of[b] : -1;
        if (p != -1 && (p < 0 || p >= B || p == b || prefix_of[p] != -1))
            check_failf(__FILE__, __LINE__,
                        "%s: prefix_of[%d] = %d is not a sequence of the batch without a prefix of its own (B = %d)",
                        who, b, (int)p, B);
        if (p >= 0)
            L += cu[p + 1] - cu[p];
        if (L > m)
            m = L;
    }
    return m;
}

/* Shared-prefix packing (prefix_of[b] = p >= 0): sequence b's rows sit after all of sequence p's rows, which
 * every row of b sees. Row j of the keys b sees is row gathered_row(j) of the batch: p's rows, then b's own. */
static size_t gathered_row(const int32_t *cu, int b, int p, int j)
{
    const int plen = cu[p + 1] - cu[p];
    return (size_t)(j < plen ? cu[p] + j : cu[b] + j - plen);
}

/* The keys and values kv head kh's queries of sequence b see: rows of k and v (ldk apart) without a prefix, else
 * gathered into Kc, Vc (plen + L rows of hd) so that head_forward and head_backward see one sequence whose first
 * plen rows have no queries. Sets *kb, *vb, *ld; returns plen (0 without a prefix). */
static int head_keys(const float **kb, const float **vb, int *ld, float *Kc, float *Vc, const float *k, const float *v,
                     const int32_t *cu, int b, int p, int ldk, int kh, int hd)
{
    const size_t ko = (size_t)cu[b] * ldk + (size_t)kh * hd;
    *kb = k + ko, *vb = v + ko, *ld = ldk;
    if (p < 0)
        return 0;
    const int plen = cu[p + 1] - cu[p], L = cu[b + 1] - cu[b];
    for (int j = 0; j < plen + L; j++) {
        const size_t src = gathered_row(cu, b, p, j) * ldk + (size_t)kh * hd;
        memcpy(Kc + (size_t)j * hd, k + src, (size_t)hd * sizeof(float));
        memcpy(Vc + (size_t)j * hd, v + src, (size_t)hd * sizeof(float));
    }
    *kb = Kc, *vb = Vc, *ld = hd;
    return plen;
}

/* The heads and sequences of a call as units of work on the pool's threads (kernels/cpu/pool.c): each part takes
 * the next unit until none is left, with its own scratch. A unit is computed whole by one thread with the same
 * single-threaded sgemm calls in the same order, so the bits do not depend on the number of threads. */
struct attn_job {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *o, *lse_in; /* lse: the forward's output, lse_in: the backward's input */
    const int32_t *cu, *prefix_of;
    const int32_t *kfirst, *klast; /* attention_rows' key ranges */
    int B, Hq, Hkv, hd, maxK, units;
    _Atomic int next;
};

/* A job's shared fields; the outputs and the per-call inputs are set by the caller. */
static void job_init(struct attn_job *j, const float *q, const float *k, const float *v, const int32_t *cu,
                     const int32_t *prefix_of, int B, int Hq, int Hkv, int hd, int maxK, int units)
{
    memset(j, 0, sizeof *j);
    j->q = q, j->k = k, j->v = v, j->cu = cu, j->prefix_of = prefix_of;
    j->B = B, j->Hq = Hq, j->Hkv = Hkv, j->hd = hd, j->maxK = maxK, j->units = units;
    j->next = 0;
}

/* Units are worth splitting from this many multiply-adds of the whole call on (waking a helper costs more). */
enum { ATTN_SPLIT_MIN_MACS = 1 << 18 };

static int attn_parts(double macs, int units)
{
    int parts = cpu_pool_threads();
    parts = parts < units ? parts : units;
    return macs < ATTN_SPLIT_MIN_MACS || parts < 1 ? 1 : parts;
}

/* forward: unit (sequence b, kv head kh) = b * Hkv + kh */
static void forward_part(void *arg, int part, int parts)
{
    (void)part, (void)parts;
    struct attn_job *j = arg;
    const int group = j->Hq / j->Hkv, ldq = j->Hq * j->hd, ldk = j->Hkv * j->hd, hd = j->hd;
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *S = xmalloc(sizeof(float) * (size_t)imin(ATTN_BLOCK, j->maxK) * j->maxK);
    float *Kc = NULL, *Vc = NULL;
    if (j->prefix_of)
        Kc = xmalloc(sizeof(float) * 2 * (size_t)j->maxK * hd), Vc = Kc + (size_t)j->maxK * hd;
    for (int u; (u = j->next++) < j->units;) {
        const int b = u / j->Hkv, kh = u % j->Hkv;
        const size_t s0 = (size_t)j->cu[b];
        const int L = j->cu[b + 1] - j->cu[b], p = j->prefix_of ? j->prefix_of[b] : -1;
        if (L == 0)
            continue;
        const float *kb, *vb;
        int ld;
        const int off = head_keys(&kb, &vb, &ld, Kc, Vc, j->k, j->v, j->cu, b, p, ldk, kh, hd);
        for (int h = kh * group; h < (kh + 1) * group; h++)
            head_forward(j->out + s0 * ldq + (size_t)h * hd, j->lse ? j->lse + s0 * j->Hq + h : NULL, j->Hq,
                         j->q + s0 * ldq + (size_t)h * hd, ldq, kb, vb, ld, L, off, hd, scale, S);
    }
    free(S);
    free(Kc);
}

/* multiply-adds of a forward over the batch (the two products of every query row against the keys it sees) */
static double attn_macs(const int32_t *cu, int B, int Hq, int hd, int maxK)
{
    return 2.0 * (double)cu[B] * maxK * Hq * hd;
}

void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const int32_t *cu_seqlens, const int32_t *prefix_of, int B, int Hq, int Hkv, int hd)
{
    check_heads("attention_forward", Hq, Hkv, hd);
    int maxK = max_keys("attention_forward", cu_seqlens, prefix_of, B);
    if (maxK == 0)
        return;
    struct attn_job j;
    job_init(&j, q, k, v, cu_seqlens, prefix_of, B, Hq, Hkv, hd, maxK, B * Hkv);
    j.out = out, j.lse = lse;
    cpu_run_parts(attn_parts(attn_macs(cu_seqlens, B, Hq, hd, maxK), j.units), forward_part, &j);
}

/* Backward of one query head over one sequence; strides as in head_forward, and query row i (0..T-1) sits at
 * position q_off + i (keys 0..q_off+T-1; dk, dv cover them all). P, dP: scratch of ATTN_BLOCK * (q_off + T)
 * floats each. With P_ij = exp(s_ij - lse_i) and D_i = dout_i . out_i:  dS_ij = P_ij (dout_i . v_j - D_i);
 * dq_i += scale sum_j dS_ij k_j;  dk_j += scale sum_i dS_ij q_i;  dv_j += sum_i P_ij dout_i. */
static void head_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                          int ld_lse, const float *q, int ldq, const float *k, const float *v, int ldk, int T,
                          int q_off, int hd, float scale, float *P, float *dP)
{
    for (int r0 = 0; r0 < T; r0 += ATTN_BLOCK) {
        int nb = imin(ATTN_BLOCK, T - r0), nk = q_off + r0 + nb;
        const float *qb = q + (size_t)r0 * ldq, *dob = dout + (size_t)r0 * ldq, *ob = out + (size_t)r0 * ldq;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, nk, hd, scale, qb, ldq, k, ldk, 0.0f, P, nk);
        for (int i = 0; i < nb; i++) {
            float *pi = P + (size_t)i * nk;
            int last = q_off + r0 + i;
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

/* backward: unit (family r, kv head kh) = r * Hkv + kh, where family r is sequence r and, with prefix_of, the
 * sequences whose prefix it is: their gradients meet in r's rows of dk and dv, so one thread does them, in the
 * order of the sequences as a serial loop would. Units of sequences that have a prefix themselves are empty. */
static void backward_part(void *arg, int part, int parts)
{
    (void)part, (void)parts;
    struct attn_job *j = arg;
    const int group = j->Hq / j->Hkv, ldq = j->Hq * j->hd, ldk = j->Hkv * j->hd, hd = j->hd, maxK = j->maxK;
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int32_t *cu = j->cu, *prefix_of = j->prefix_of;
    size_t scratch = (size_t)imin(ATTN_BLOCK, maxK) * maxK, kv = (size_t)maxK * hd;
    float *P = xmalloc(sizeof(float) * scratch), *dP = xmalloc(sizeof(float) * scratch);
    /* prefixed sequences: their gathered keys and values, and the gradients of those rows, added back after */
    float *Kc = NULL, *Vc = NULL, *dKc = NULL, *dVc = NULL;
    if (prefix_of)
        Kc = xmalloc(sizeof(float) * 4 * kv), Vc = Kc + kv, dKc = Kc + 2 * kv, dVc = Kc + 3 * kv;
    for (int u; (u = j->next++) < j->units;) {
        const int r = u / j->Hkv, kh = u % j->Hkv;
        if (prefix_of && prefix_of[r] != -1)
            continue;
        for (int b = 0; b < j->B; b++) {
            const int p = prefix_of ? prefix_of[b] : -1;
            if (b != r && p != r)
                continue;
            size_t s0 = (size_t)cu[b];
            int L = cu[b + 1] - cu[b];
            if (L == 0)
                continue;
            const size_t ko = s0 * ldk + (size_t)kh * hd;
            const float *kb, *vb;
            float *dkb = j->dk + ko, *dvb = j->dv + ko;
            int ld;
            const int off = head_keys(&kb, &vb, &ld, Kc, Vc, j->k, j->v, cu, b, p, ldk, kh, hd);
            if (p >= 0) { /* the gathered rows' gradients, added back below */
                memset(dKc, 0, sizeof(float) * (size_t)(off + L) * hd);
                memset(dVc, 0, sizeof(float) * (size_t)(off + L) * hd);
                dkb = dKc, dvb = dVc;
            }
            for (int h = kh * group; h < (kh + 1) * group; h++) {
                size_t qo = s0 * ldq + (size_t)h * hd;
                head_backward(j->dq + qo, dkb, dvb, j->dout + qo, j->o + qo, j->lse_in + s0 * j->Hq + h, j->Hq,
                              j->q + qo, ldq, kb, vb, ld, L, off, hd, scale, P, dP);
            }
            for (int jr = 0; p >= 0 && jr < off + L; jr++) { /* the gathered rows' gradients back where they belong */
                const size_t dst = gathered_row(cu, b, p, jr) * ldk + (size_t)kh * hd;
                for (int d = 0; d < hd; d++) {
                    j->dk[dst + d] += dKc[(size_t)jr * hd + d];
                    j->dv[dst + d] += dVc[(size_t)jr * hd + d];
                }
            }
        }
    }
    free(P);
    free(dP);
    free(Kc);
}

void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, const int32_t *cu_seqlens,
                        const int32_t *prefix_of, int B, int Hq, int Hkv, int hd)
{
    check_heads("attention_backward", Hq, Hkv, hd);
    int maxK = max_keys("attention_backward", cu_seqlens, prefix_of, B);
    if (maxK == 0)
        return;
    struct attn_job j;
    job_init(&j, q, k, v, cu_seqlens, prefix_of, B, Hq, Hkv, hd, maxK, B * Hkv);
    j.dq = dq, j.dk = dk, j.dv = dv, j.dout = dout, j.o = out, j.lse_in = lse;
    cpu_run_parts(attn_parts(2 * attn_macs(cu_seqlens, B, Hq, hd, maxK), j.units), backward_part, &j);
}

/* cached: unit = query head h */
static void cached_part(void *arg, int part, int parts)
{
    (void)part, (void)parts;
    struct attn_job *j = arg;
    const int Tq = j->B, Tk = j->maxK, group = j->Hq / j->Hkv, ldq = j->Hq * j->hd, ldk = j->Hkv * j->hd, hd = j->hd;
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *S = xmalloc(sizeof(float) * (size_t)imin(ATTN_BLOCK, Tq) * Tk);
    for (int h; (h = j->next++) < j->units;) {
        size_t ko = (size_t)(h / group) * hd;
        if (Tq == 1) /* a decode step */
            head_decode(j->out + (size_t)h * hd, NULL, j->q + (size_t)h * hd, j->k + ko, j->v + ko, ldk, Tk, hd, scale,
                        S);
        else
            head_forward(j->out + (size_t)h * hd, NULL, 0, j->q + (size_t)h * hd, ldq, j->k + ko, j->v + ko, ldk, Tq,
                         Tk - Tq, hd, scale, S);
    }
    free(S);
}

void attention_cached(float *out, const float *q, const float *kcache, const float *vcache, int Tq, int Tk, int Hq,
                      int Hkv, int hd)
{
    check_heads("attention_cached", Hq, Hkv, hd);
    if (Tq < 0 || Tq > Tk)
        check_failf(__FILE__, __LINE__, "attention_cached: Tq=%d queries but Tk=%d cached positions", Tq, Tk);
    if (Tq == 0)
        return;
    /* B carries Tq and maxK carries Tk here */
    struct attn_job j;
    job_init(&j, q, kcache, vcache, NULL, NULL, Tq, Hq, Hkv, hd, Tk, Hq);
    j.out = out;
    cpu_run_parts(attn_parts(2.0 * Tq * Tk * Hq * hd, Hq), cached_part, &j);
}

void kv_store(float *cache, const float *x, size_t n, bool bf16)
{
    if (!bf16) {
        memcpy(cache, x, n * sizeof *x);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const uint32_t u = (uint32_t)f32_to_bf16(x[i]) << 16;
        memcpy(&cache[i], &u, sizeof u);
    }
}

/* rows: unit = query head h, over every row (B of them) */
static void rows_part(void *arg, int part, int parts)
{
    (void)part, (void)parts;
    struct attn_job *j = arg;
    const int group = j->Hq / j->Hkv, ldq = j->Hq * j->hd, ldk = j->Hkv * j->hd, hd = j->hd;
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *S = xmalloc(sizeof(float) * (size_t)j->maxK);
    for (int h; (h = j->next++) < j->units;) {
        const size_t kh = (size_t)(h / group) * hd;
        for (int i = 0; i < j->B; i++) {
            const size_t ko = (size_t)j->kfirst[i] * ldk + kh, qo = (size_t)i * ldq + (size_t)h * hd;
            head_decode(j->out + qo, j->lse + (size_t)i * j->Hq + h, j->q + qo, j->k + ko, j->v + ko, ldk,
                        j->klast[i] - j->kfirst[i] + 1, hd, scale, S);
        }
    }
    free(S);
}

void attention_rows(float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *kfirst,
                    const int32_t *klast, int n, int Hq, int Hkv, int hd)
{
    check_heads("attention_rows", Hq, Hkv, hd);
    int maxK = 1;
    double macs = 0;
    for (int i = 0; i < n; i++) {
        const int nk = klast[i] - kfirst[i] + 1;
        if (kfirst[i] < 0 || nk < 1)
            check_failf(__FILE__, __LINE__, "attention_rows: row %d's keys %d .. %d are not a range", i, (int)kfirst[i],
                        (int)klast[i]);
        maxK = nk > maxK ? nk : maxK;
        macs += 2.0 * nk * Hq * hd;
    }
    if (n <= 0)
        return;
    struct attn_job j;
    job_init(&j, q, k, v, NULL, NULL, n, Hq, Hkv, hd, maxK, Hq);
    j.out = out, j.lse = lse, j.kfirst = kfirst, j.klast = klast;
    cpu_run_parts(attn_parts(macs, Hq), rows_part, &j);
}
