/* Ring attention for context parallelism: see ring_attn.h. Step s of the ring brings rank r the K/V of rank
 * j = r - s (mod C), that is of each segment's chunks j and 2C-1-j. Since every chunk is wholly before or after
 * another of its segment, the visiting blocks need no causal cut inside, only the sequences of a packed segment:
 *   s = 0      own keys: causal over the local chunks (the kernel's attention, with the local runs of one sequence
 *              as its sequences: the local rows are in the order of their positions);
 *   j < r      per segment, chunk j is before both local chunks and chunk 2C-1-j after both: the segment's 2c local
 *              queries against its visiting front chunk (c keys);
 *   j > r      chunk j and chunk 2C-1-j are before the local back chunk and after the local front chunk: the c back
 *              queries against both visiting chunks (2c keys).
 * Each rank thus scores 2c^2 pairs of a segment per visiting step and 2c^2 + c at its own step: the same work on
 * every rank. */
#include "ring_attn.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"

/* query rows per block of the visiting steps' products (a thread's scratch: two blocks of 2c floats a row) */
enum { RING_BLOCK = 64 };

static int fail(char *why, size_t len, const char *msg)
{
    if (why && len)
        snprintf(why, len, "%s", msg);
    return -1;
}

/* The row's token at local row i of rank `owner` (the holder of each segment's chunks owner and 2C-1-owner). */
static int row_of(const struct ring_attn *ra, int owner, int i) { return ra->rows[(size_t)owner * ra->n + i]; }

int ring_attn_row(const struct ring_attn *ra, int i) { return row_of(ra, ra->rank, i); }

/* Segment g: its first token in the row, its chunk length and its first local row (the same on every rank). */
static int seg_chunk(const struct ring_attn *ra, int g) { return (ra->seg_off[g + 1] - ra->seg_off[g]) / (2 * ra->C); }

void ring_attn_take(const struct ring_attn *ra, float *dst, const float *src, int width)
{
    for (int i = 0; i < ra->n; i++)
        memcpy(dst + (size_t)i * width, src + (size_t)ring_attn_row(ra, i) * width, sizeof(float) * (size_t)width);
}

void ring_attn_take_i32(const struct ring_attn *ra, int32_t *dst, const int32_t *src)
{
    for (int i = 0; i < ra->n; i++)
        dst[i] = src[ring_attn_row(ra, i)];
}

double ring_attn_bytes(int C, int c, int Hkv, int hd, int backward)
{
    const double pair = 2.0 * (2.0 * c) * Hkv * hd * sizeof(float); /* K and V of two chunks */
    return C <= 1 ? 0.0 : (backward ? 2.0 : 1.0) * (C - 1) * pair;
}

/* The device path's buffers in ra->K's memory (ring_attn.h): the ring, a step's partial output and its lse, the
 * backward's dout . out, the local runs of one sequence and every rank's rows' sequences; host staging for a ring
 * over an MPI group. */
static void plan_device(struct ring_attn *ra)
{
    struct kctx *K = ra->K;
    const int n = ra->n, C = ra->C;
    const size_t kv = (size_t)n * ra->Hkv * ra->hd, f = sizeof(float), i4 = sizeof(int32_t);
    ra->dev = true;
    for (int b = 0; b < 2 && C > 1; b++) {
        ra->ring[b] = k_calloc(K, 4 * kv * f, KMEM_ACTS, "ring attention's K/V ring");
        if (ra->cp && !comm_caps(ra->cp)->device_memory)
            ra->stage[b] = xcalloc(4 * kv, f);
    }
    ra->po = k_alloc(K, (size_t)n * ra->Hq * ra->hd * f, KMEM_ACTS, "ring attention's partial output");
    ra->plse = k_alloc(K, (size_t)n * ra->Hq * f, KMEM_ACTS, "ring attention's partial log-sum-exp");
    ra->d_drow = k_alloc(K, (size_t)n * ra->Hq * f, KMEM_ACTS, "ring attention's dout . out");
    ra->d_cu_diag = k_alloc(K, (size_t)(ra->nb_diag + 1) * i4, KMEM_ACTS, "ring attention's sequence offsets");
    k_to_device(K, ra->d_cu_diag, ra->cu_diag, (size_t)(ra->nb_diag + 1) * i4);
    int32_t *seq = xmalloc((size_t)C * n * i4);
    for (int o = 0; o < C; o++)
        for (int r = 0; r < n; r++)
            seq[(size_t)o * n + r] = ra->first[row_of(ra, o, r)];
    ra->d_seq = k_alloc(K, (size_t)C * n * i4, KMEM_ACTS, "ring attention's row sequences");
    k_to_device(K, ra->d_seq, seq, (size_t)C * n * i4);
    k_sync(K); /* seq is freed: the copy must have left it */
    free(seq);
}

static void free_device(struct ring_attn *ra)
{
    struct kctx *K = ra->K;
    const size_t kv = (size_t)ra->n * ra->Hkv * ra->hd, f = sizeof(float), i4 = sizeof(int32_t);
    for (int b = 0; b < 2; b++) {
        if (ra->ring[b])
            k_free(K, ra->ring[b], 4 * kv * f, KMEM_ACTS);
        free(ra->stage[b]);
        ra->ring[b] = NULL;
    }
    k_free(K, ra->po, (size_t)ra->n * ra->Hq * ra->hd * f, KMEM_ACTS);
    k_free(K, ra->plse, (size_t)ra->n * ra->Hq * f, KMEM_ACTS);
    k_free(K, ra->d_drow, (size_t)ra->n * ra->Hq * f, KMEM_ACTS);
    k_free(K, ra->d_cu_diag, (size_t)(ra->nb_diag + 1) * i4, KMEM_ACTS);
    k_free(K, ra->d_seq, (size_t)ra->C * ra->n * i4, KMEM_ACTS);
    ra->po = ra->plse = NULL;
}

int ring_attn_plan(struct ring_attn *ra, struct kctx *K, struct comm *cp, int L, const int32_t *cu_seqlens, int B,
                   const int32_t *segments, int S, int Hq, int Hkv, int hd, char *why, size_t len)
{
    char msg[256];
    memset(ra, 0, sizeof *ra);
    const int C = cp ? comm_size(cp) : 1;
    const bool dev = K->device != KDEV_CPU;
    if (dev && !k_has_attention_block(K)) {
        snprintf(msg, sizeof msg, "ring attention: the %s back-end has no attention_block ops for its visiting blocks",
                 K->ops->name);
        return fail(why, len, msg);
    }
    if (!dev && cp && comm_caps(cp)->device_memory)
        return fail(why, len, "ring attention needs an MPI (host memory) group for its K/V ring, not a device group");
    if (Hq <= 0 || Hkv <= 0 || hd <= 0 || Hq % Hkv != 0) {
        snprintf(msg, sizeof msg,
                 "ring attention: %d query heads over %d KV heads of %d: the query heads must be a multiple of the KV "
                 "heads",
                 Hq, Hkv, hd);
        return fail(why, len, msg);
    }
    if (!segments && (L <= 0 || L % (2 * C) != 0)) {
        snprintf(msg, sizeof msg,
                 "ring attention: a row of %d tokens cannot be cut into 2 x context parallel size = %d equal chunks "
                 "(pad the row to a multiple of %d)",
                 L, 2 * C, 2 * C);
        return fail(why, len, msg);
    }
    if (B < 1 || !cu_seqlens || cu_seqlens[0] != 0 || cu_seqlens[B] != L) {
        snprintf(msg, sizeof msg,
                 "ring attention: the sequence offsets must run from 0 to the row length %d (got %d sequences, %d to "
                 "%d)",
                 L, B, cu_seqlens && B >= 0 ? (int)cu_seqlens[0] : -1, cu_seqlens && B >= 0 ? (int)cu_seqlens[B] : -1);
        return fail(why, len, msg);
    }
    for (int b = 0; b < B; b++)
        if (cu_seqlens[b + 1] < cu_seqlens[b]) {
            snprintf(msg, sizeof msg, "ring attention: cu_seqlens[%d] = %d is below cu_seqlens[%d] = %d", b + 1,
                     (int)cu_seqlens[b + 1], b, (int)cu_seqlens[b]);
            return fail(why, len, msg);
        }
    const int32_t whole[2] = {0, L};
    if (!segments)
        segments = whole, S = 1;
    if (S < 1 || segments[0] != 0 || segments[S] != L) {
        snprintf(msg, sizeof msg, "ring attention: the %d segments must run from 0 to the row length %d (got %d to %d)",
                 S, L, S >= 0 ? (int)segments[0] : -1, S >= 0 ? (int)segments[S] : -1);
        return fail(why, len, msg);
    }
    for (int g = 0; g < S; g++) {
        const int sl = segments[g + 1] - segments[g];
        if (sl <= 0 || sl % (2 * C) != 0) {
            snprintf(msg, sizeof msg,
                     "ring attention: segment %d of %d tokens (from token %d) is not a positive multiple of 2 x "
                     "context parallel size = %d (pad it)",
                     g, sl, (int)segments[g], 2 * C);
            return fail(why, len, msg);
        }
    }
    int32_t *first = xmalloc(sizeof(int32_t) * (size_t)L);
    for (int b = 0; b < B; b++)
        for (int t = cu_seqlens[b]; t < cu_seqlens[b + 1]; t++)
            first[t] = cu_seqlens[b];
    for (int g = 1; g < S; g++)
        if (first[segments[g]] != segments[g]) {
            snprintf(msg, sizeof msg,
                     "ring attention: segment %d starts at token %d, inside a sequence (from token %d): segments "
                     "must hold whole sequences",
                     g, (int)segments[g], (int)first[segments[g]]);
            free(first);
            return fail(why, len, msg);
        }
    ra->K = K, ra->cp = cp && C > 1 ? cp : NULL, ra->C = C, ra->rank = cp ? comm_rank(cp) : 0;
    ra->L = L, ra->n = L / C, ra->c = L / (2 * C), ra->Hq = Hq, ra->Hkv = Hkv, ra->hd = hd, ra->first = first;
    ra->S = S;
    ra->seg_off = xmalloc(sizeof(int32_t) * (size_t)(S + 1));
    ra->seg_loc = xmalloc(sizeof(int32_t) * (size_t)(S + 1));
    ra->seg_loc[0] = 0;
    for (int g = 0; g <= S; g++)
        ra->seg_off[g] = segments[g];
    for (int g = 0; g < S; g++)
        ra->seg_loc[g + 1] = ra->seg_loc[g] + 2 * seg_chunk(ra, g);
    /* every rank's local rows: per segment, its front chunk then its back chunk */
    ra->rows = xmalloc(sizeof(int32_t) * (size_t)L);
    for (int o = 0; o < C; o++)
        for (int g = 0; g < S; g++) {
            const int cg = seg_chunk(ra, g), off = ra->seg_off[g];
            int32_t *r = ra->rows + (size_t)o * ra->n + ra->seg_loc[g];
            for (int t = 0; t < cg; t++)
                r[t] = off + o * cg + t, r[cg + t] = off + (2 * C - 1 - o) * cg + t;
        }
    /* the local rows' runs of one sequence: the sequences of the first step's causal kernel call */
    const int n = ra->n;
    ra->cu_diag = xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    ra->cu_diag[0] = 0;
    for (int i = 1; i <= n; i++)
        if (i == n || ra->first[ring_attn_row(ra, i)] != ra->first[ring_attn_row(ra, i - 1)])
            ra->cu_diag[++ra->nb_diag] = i;
    const size_t kv = (size_t)n * Hkv * hd;
    if (dev) { /* the ring in the device's memory (plan_device) */
        plan_device(ra);
        return 0;
    }
    for (int b = 0; b < 2 && C > 1; b++) /* a group of one has no ring */
        ra->ring[b] = xcalloc(4 * kv, sizeof(float));
    ra->po = xmalloc(sizeof(float) * (size_t)n * Hq * hd);
    ra->plse = xmalloc(sizeof(float) * (size_t)n * Hq);
    ra->drow = xmalloc(sizeof(double) * (size_t)n * Hq);
    return 0;
}

void ring_attn_free(struct ring_attn *ra)
{
    if (ra->dev)
        free_device(ra);
    free(ra->first);
    free(ra->rows);
    free(ra->seg_off);
    free(ra->seg_loc);
    free(ra->cu_diag);
    free(ra->ring[0]);
    free(ra->ring[1]);
    free(ra->po);
    free(ra->plse);
    free(ra->drow);
    memset(ra, 0, sizeof *ra);
}

/* Whether the token at row position gk is a key the query at gq sees: one of its sequence's up to itself. */
static int visible(const struct ring_attn *ra, int gq, int gk) { return ra->first[gq] <= gk && gk <= gq; }

/* A visiting step's block of segment g: queries local rows [q0, q1), keys visiting rows [k0, k0 + nk) (see the
 * top), the visitor the owner j of those keys. */
struct block {
    int j, q0, q1, k0, nk;
};
static struct block step_block(const struct ring_attn *ra, int s, int g)
{
    const int j = (ra->rank - s + ra->C) % ra->C, cg = seg_chunk(ra, g), loc = ra->seg_loc[g];
    return j < ra->rank ? (struct block){j, loc, loc + 2 * cg, loc, cg}
                        : (struct block){j, loc + cg, loc + 2 * cg, loc, 2 * cg};
}

/* Counts what step s scores (whatever the step, by the mask): unmasked pairs, and chunk blocks with one. A query
 * at gq sees the keys [first[gq], gq] of the row, so of a visiting chunk [g0, g0 + c) it sees an interval. */
static void count_step(struct ring_attn *ra, int s)
{
    const int j = (ra->rank - s + ra->C) % ra->C;
    for (int g = 0; g < ra->S; g++) { /* a sequence lies in one segment */
        const int c = seg_chunk(ra, g), loc = ra->seg_loc[g];
        const int g0[2] = {ra->seg_off[g] + j * c, ra->seg_off[g] + (2 * ra->C - 1 - j) * c};
        int hit[2][2] = {{0, 0}, {0, 0}};
        for (int i = 0; i < 2 * c; i++) {
            const int gq = ring_attn_row(ra, loc + i), f = ra->first[gq];
            for (int ch = 0; ch < 2; ch++) {
                const int lo = f > g0[ch] ? f : g0[ch], hi = gq + 1 < g0[ch] + c ? gq + 1 : g0[ch] + c;
                if (hi > lo)
                    ra->stats.scores += (unsigned long long)(hi - lo), hit[i >= c][ch] = 1;
            }
        }
        ra->stats.blocks += (unsigned long long)(hit[0][0] + hit[0][1] + hit[1][0] + hit[1][1]);
    }
}

static double dot(const float *a, const float *b, int n)
{
    double s = 0;
    for (int d = 0; d < n; d++)
        s += (double)a[d] * b[d];
    return s;
}

static int imin(int a, int b) { return a < b ? a : b; }

/* multiply-adds of a visiting step's forward: 2c^2 pairs per segment of chunk c, two products of hd per head */
static double step_macs(const struct ring_attn *ra)
{
    double pairs = 0;
    for (int g = 0; g < ra->S; g++)
        pairs += 2.0 * seg_chunk(ra, g) * seg_chunk(ra, g);
    return 2.0 * pairs * ra->Hq * ra->hd;
}

/* S (nb, nk) = scale q k^T for query rows [i0, i0 + nb) of head h against the visiting rows [k0, k0 + nk) */
static void block_scores(const struct ring_attn *ra, struct block b, int i0, int nb, int h, const float *q,
                         const float *kk, float *S)
{
    const int hd = ra->hd, ldq = ra->Hq * hd, ldk = ra->Hkv * hd, kh = h / (ra->Hq / ra->Hkv);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, b.nk, hd, (float)(1.0 / sqrt((double)hd)),
                q + (size_t)i0 * ldq + (size_t)h * hd, ldq, kk + (size_t)b.k0 * ldk + (size_t)kh * hd, ldk, 0.0f, S,
                b.nk);
}

/* Partial attention of step b's queries of head h against the visiting keys kk, vv (rows of Hkv hd), in blocks of
 * RING_BLOCK rows: the scores as one product, the softmax over the keys each query sees (its own sequence's), the
 * output as a second product. po and plse of those rows (plse -inf and po 0 where a query sees none of the keys).
 * S: RING_BLOCK x b.nk floats. */
static void head_block_forward(struct ring_attn *ra, struct block b, int h, const float *q, const float *kk,
                               const float *vv, float *S)
{
    const int Hq = ra->Hq, hd = ra->hd, ldq = Hq * hd, ldk = ra->Hkv * hd;
    {
        const size_t ko = (size_t)(h / (Hq / ra->Hkv)) * hd;
        for (int i0 = b.q0; i0 < b.q1; i0 += RING_BLOCK) {
            const int nb = imin(RING_BLOCK, b.q1 - i0);
            block_scores(ra, b, i0, nb, h, q, kk, S);
            for (int i = 0; i < nb; i++) {
                const int gq = ring_attn_row(ra, i0 + i);
                float *si = S + (size_t)i * b.nk;
                float m = -INFINITY;
                for (int t = 0; t < b.nk; t++) {
                    if (!visible(ra, gq, row_of(ra, b.j, b.k0 + t)))
                        si[t] = -INFINITY;
                    m = si[t] > m ? si[t] : m;
                }
                if (m == -INFINITY) { /* none of its sequence's keys here */
                    memset(si, 0, sizeof(float) * (size_t)b.nk);
                    ra->plse[(size_t)(i0 + i) * Hq + h] = -INFINITY;
                    continue;
                }
                khost_exp_shifted(si, si, (size_t)b.nk, m); /* the masked -inf become 0 */
                double sum = 0;
                for (int t = 0; t < b.nk; t++)
                    sum += si[t];
                const float inv = (float)(1.0 / sum);
                for (int t = 0; t < b.nk; t++)
                    si[t] *= inv;
                /* sum >= 1: the maximum contributes exp(0) */
                ra->plse[(size_t)(i0 + i) * Hq + h] = (float)(m + log(sum)); // cppcheck-suppress invalidFunctionArg
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, hd, b.nk, 1.0f, S, b.nk,
                        vv + (size_t)b.k0 * ldk + ko, ldk, 0.0f, ra->po + (size_t)i0 * ldq + (size_t)h * hd, ldq);
        }
    }
}

/* Gradients of step b's block for the query heads of KV head kh, as head_backward in kernels/cpu/attention.c
 * computes them: P recomputed from the whole attention's lse, drow holding dout . out of the whole attention;
 * dS = P (dout v^T - drow); dq of the local queries += scale dS k, dkk of the visiting keys += scale dS^T q,
 * dvv += P^T dout. P, dP: RING_BLOCK x b.nk floats each. */
static void kv_block_backward(struct ring_attn *ra, struct block b, int kh, float *dq, float *dkk, float *dvv,
                              const float *dout, const float *lse, const float *q, const float *kk, const float *vv,
                              float *P, float *dP)
{
    const int Hq = ra->Hq, hd = ra->hd, ldq = Hq * hd, ldk = ra->Hkv * hd, group = Hq / ra->Hkv;
    const float scale = (float)(1.0 / sqrt((double)hd));
    for (int h = kh * group; h < (kh + 1) * group; h++) {
        const size_t ko = (size_t)b.k0 * ldk + (size_t)(h / (Hq / ra->Hkv)) * hd;
        for (int i0 = b.q0; i0 < b.q1; i0 += RING_BLOCK) {
            const int nb = imin(RING_BLOCK, b.q1 - i0);
            const size_t qo = (size_t)i0 * ldq + (size_t)h * hd;
            block_scores(ra, b, i0, nb, h, q, kk, P);
            for (int i = 0; i < nb; i++) {
                const int gq = ring_attn_row(ra, i0 + i);
                float *pi = P + (size_t)i * b.nk;
                for (int t = 0; t < b.nk; t++)
                    if (!visible(ra, gq, row_of(ra, b.j, b.k0 + t)))
                        pi[t] = -INFINITY;
                /* the scores are the forward's, so s - lse <= 0 up to rounding; the masked -inf become 0 */
                khost_exp_shifted(pi, pi, (size_t)b.nk, lse[(size_t)(i0 + i) * Hq + h]);
            }
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b.nk, hd, nb, 1.0f, P, b.nk, dout + qo, ldq, 1.0f,
                        dvv + ko, ldk);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, b.nk, hd, 1.0f, dout + qo, ldq, vv + ko, ldk, 0.0f,
                        dP, b.nk);
            for (int i = 0; i < nb; i++) {
                const float Di = (float)ra->drow[(size_t)(i0 + i) * Hq + h];
                float *pi = P + (size_t)i * b.nk, *dpi = dP + (size_t)i * b.nk;
                for (int t = 0; t < b.nk; t++)
                    dpi[t] = pi[t] * (dpi[t] - Di);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, hd, b.nk, scale, dP, b.nk, kk + ko, ldk, 1.0f,
                        dq + qo, ldq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b.nk, hd, nb, scale, dP, b.nk, q + qo, ldq, 1.0f,
                        dkk + ko, ldk);
        }
    }
}

/* A visiting step's blocks as units of work on the CPU kernels' threads (kernels/cpu/pool.h): forward a
 * (segment, query head), backward a (segment, KV head), whose gradients of the visiting keys no other unit touches.
 * Each part takes the next unit until none is left, with its own scratch; a unit is computed whole by one thread
 * in a fixed order, so the bits do not depend on the number of threads. */
struct ring_job {
    struct ring_attn *ra;
    int s, units, per_seg; /* the step; units = segments x per_seg */
    const float *q, *kk, *vv, *dout, *lse;
    float *dq, *dkk, *dvv;
    _Atomic int next;
};

static void forward_part(void *arg, int part, int parts)
{
    (void)part, (void)parts;
    struct ring_job *j = arg;
    float *S = xmalloc(sizeof(float) * RING_BLOCK * (size_t)j->ra->n);
    for (int u; (u = j->next++) < j->units;)
        head_block_forward(j->ra, step_block(j->ra, j->s, u / j->per_seg), u % j->per_seg, j->q, j->kk, j->vv, S);
    free(S);
}

static void backward_part(void *arg, int part, int parts)
{
    (void)part, (void)parts;
    struct ring_job *j = arg;
    float *P = xmalloc(sizeof(float) * 2 * RING_BLOCK * (size_t)j->ra->n);
    for (int u; (u = j->next++) < j->units;)
        kv_block_backward(j->ra, step_block(j->ra, j->s, u / j->per_seg), u % j->per_seg, j->dq, j->dkk, j->dvv,
                          j->dout, j->lse, j->q, j->kk, j->vv, P, P + (size_t)RING_BLOCK * j->ra->n);
    free(P);
}

/* Parts for a step of `macs` multiply-adds over `units` units: the CPU kernels' threads, one below 2^18 (waking a
 * helper costs more), as the kernel's attention splits its work. */
static int step_parts(double macs, int units)
{
    const int t = khost_threads(), p = t < units ? t : units;
    return macs < (double)(1 << 18) || p < 1 ? 1 : p;
}

/* out, lse of rows [q0, q1) merged with the step's partial po, plse by log-sum-exp. */
static void merge(struct ring_attn *ra, int q0, int q1, float *out, float *lse)
{
    const int Hq = ra->Hq, hd = ra->hd;
    for (int i = q0; i < q1; i++)
        for (int h = 0; h < Hq; h++) {
            const size_t e = (size_t)i * Hq + h;
            const double l1 = lse[e], l2 = ra->plse[e];
            if (l2 == -INFINITY)
                continue;
            const double m = l1 > l2 ? l1 : l2, l = m + log(exp(l1 - m) + exp(l2 - m));
            const double w1 = exp(l1 - l), w2 = exp(l2 - l);
            float *o = out + e * hd;
            const float *p = ra->po + e * hd;
            for (int d = 0; d < hd; d++)
                o[d] = (float)(w1 * o[d] + w2 * p[d]);
            lse[e] = (float)l;
        }
}

/* Send `count` floats from send to the next rank while receiving as many from the previous one into recv. */
static void ring_pass(struct ring_attn *ra, const float *send, float *recv, size_t count)
{
    const int next = (ra->rank + 1) % ra->C, prev = (ra->rank - 1 + ra->C) % ra->C;
    if (ra->stage[0]) { /* device memory over an MPI group: through the host */
        k_to_host(ra->K, ra->stage[0], send, count * sizeof(float));
        comm_sendrecv(ra->cp, ra->stage[0], count, next, ra->stage[1], count, prev, COMM_F32);
        k_to_device(ra->K, recv, ra->stage[1], count * sizeof(float));
    } else {
        comm_sendrecv(ra->cp, send, count, next, recv, count, prev, COMM_F32);
    }
    ra->stats.sent_bytes += (double)count * sizeof(float);
}

/* The device path's forward and backward (ring_attn.h): the same steps and blocks as the CPU's below, each block
 * and merge one op of the kernel interface on K's memory. */
static void forward_device(struct ring_attn *ra, float *out, float *lse, const float *q, const float *k, const float *v)
{
    struct kctx *K = ra->K;
    const int Hq = ra->Hq, hd = ra->hd, n = ra->n;
    const size_t kv = (size_t)n * ra->Hkv * hd, ldq = (size_t)Hq * hd, ldk = (size_t)ra->Hkv * hd;
    k_attention_forward(K, out, lse, q, k, v, ra->d_cu_diag, NULL, ra->nb_diag, Hq, ra->Hkv, hd);
    count_step(ra, 0);
    int cur = 0;
    if (ra->C > 1) {
        k_copy(K, ra->ring[0], k, sizeof(float) * kv);
        k_copy(K, ra->ring[0] + kv, v, sizeof(float) * kv);
    }
    for (int s = 1; s < ra->C; s++) {
        ring_pass(ra, ra->ring[cur], ra->ring[cur ^ 1], 2 * kv);
        cur ^= 1;
        const float *kk = ra->ring[cur], *vv = ra->ring[cur] + kv;
        for (int g = 0; g < ra->S; g++) {
            const struct block b = step_block(ra, s, g);
            const int nq = b.q1 - b.q0;
            k_attention_block_forward(K, ra->po + b.q0 * ldq, ra->plse + (size_t)b.q0 * Hq, q + b.q0 * ldq,
                                      kk + b.k0 * ldk, vv + b.k0 * ldk, ra->d_seq + (size_t)ra->rank * n + b.q0,
                                      ra->d_seq + (size_t)b.j * n + b.k0, nq, b.nk, Hq, ra->Hkv, hd);
            k_attention_merge(K, out + b.q0 * ldq, lse + (size_t)b.q0 * Hq, ra->po + b.q0 * ldq,
                              ra->plse + (size_t)b.q0 * Hq, nq, Hq, hd);
        }
        count_step(ra, s);
    }
}

static void backward_device(struct ring_attn *ra, float *dq, float *dk, float *dv, const float *dout, const float *out,
                            const float *lse, const float *q, const float *k, const float *v)
{
    struct kctx *K = ra->K;
    const int n = ra->n, Hq = ra->Hq, hd = ra->hd;
    const size_t kv = (size_t)n * ra->Hkv * hd, ldq = (size_t)Hq * hd, ldk = (size_t)ra->Hkv * hd;
    k_attention_backward(K, dq, dk, dv, dout, out, lse, q, k, v, ra->d_cu_diag, NULL, ra->nb_diag, Hq, ra->Hkv, hd);
    if (ra->C == 1)
        return;
    k_attention_drow(K, ra->d_drow, dout, out, n, Hq, hd);
    k_copy(K, ra->ring[0], k, sizeof(float) * kv);
    k_copy(K, ra->ring[0] + kv, v, sizeof(float) * kv);
    int cur = 0;
    for (int s = 1; s < ra->C; s++) {
        const int both = s > 1;
        ring_pass(ra, ra->ring[cur], ra->ring[cur ^ 1], (both ? 4 : 2) * kv);
        cur ^= 1;
        float *buf = ra->ring[cur];
        if (!both)
            k_zero(K, buf + 2 * kv, sizeof(float) * 2 * kv);
        for (int g = 0; g < ra->S; g++) {
            const struct block b = step_block(ra, s, g);
            k_attention_block_backward(K, dq + b.q0 * ldq, buf + 2 * kv + b.k0 * ldk, buf + 3 * kv + b.k0 * ldk,
                                       dout + b.q0 * ldq, lse + (size_t)b.q0 * Hq, ra->d_drow + (size_t)b.q0 * Hq,
                                       q + b.q0 * ldq, buf + b.k0 * ldk, buf + kv + b.k0 * ldk,
                                       ra->d_seq + (size_t)ra->rank * n + b.q0, ra->d_seq + (size_t)b.j * n + b.k0,
                                       b.q1 - b.q0, b.nk, Hq, ra->Hkv, hd);
        }
    }
    ring_pass(ra, ra->ring[cur] + 2 * kv, ra->ring[cur ^ 1] + 2 * kv, 2 * kv);
    const float *home = ra->ring[cur ^ 1] + 2 * kv;
    k_add(K, dk, home, kv);
    k_add(K, dv, home + kv, kv);
}

/* src (n, width) of every rank, gathered in rank order (all: C n width), into dst (L, width) in the row's order. */
static void gather_row(struct ring_attn *ra, float *dst, float *all, const float *src, size_t width)
{
    comm_allgather(ra->cp, src, all, (size_t)ra->n * width, COMM_F32);
    for (int o = 0; o < ra->C; o++)
        for (int i = 0; i < ra->n; i++)
            memcpy(dst + (size_t)row_of(ra, o, i) * width, all + ((size_t)o * ra->n + i) * width,
                   width * sizeof(float));
    ra->stats.sent_bytes += (double)(ra->C - 1) * (double)ra->n * (double)width * sizeof(float);
}

/* Batch-invariant mode (docs/training.md): the whole row's keys and values gathered, and each local query row's
 * attention over its sequence's keys up to it in the decode kernel's one fixed order (attention_rows), as a
 * rollout's decode step and a one-process forward compute that row: no blocks merged by log-sum-exp. */
static void forward_whole_keys(struct ring_attn *ra, float *out, float *lse, const float *q, const float *k,
                               const float *v)
{
    const int n = ra->n;
    const size_t KD = (size_t)ra->Hkv * ra->hd, wk = (size_t)ra->L * KD;
    float *kw = xmalloc(sizeof(float) * (2 * wk + (size_t)n * KD * ra->C)), *vw = kw + wk, *all = vw + wk;
    gather_row(ra, kw, all, k, KD);
    gather_row(ra, vw, all, v, KD);
    int32_t *kfirst = xmalloc(sizeof(int32_t) * 2 * (size_t)n), *klast = kfirst + n;
    for (int i = 0; i < n; i++)
        klast[i] = ring_attn_row(ra, i), kfirst[i] = ra->first[klast[i]];
    k_attention_rows(ra->K, out, lse, q, kw, vw, kfirst, klast, n, ra->Hq, ra->Hkv, ra->hd);
    for (int s = 0; s < ra->C; s++)
        count_step(ra, s);
    free(kfirst);
    free(kw);
}

void ring_attn_forward(struct ring_attn *ra, float *out, float *lse, const float *q, const float *k, const float *v)
{
    if (ra->dev) {
        forward_device(ra, out, lse, q, k, v);
        return;
    }
    if (ra->C > 1 && k_batch_invariant()) {
        forward_whole_keys(ra, out, lse, q, k, v);
        return;
    }
    const size_t kv = (size_t)ra->n * ra->Hkv * ra->hd;
    k_attention_forward(ra->K, out, lse, q, k, v, ra->cu_diag, NULL, ra->nb_diag, ra->Hq, ra->Hkv, ra->hd);
    count_step(ra, 0);
    int cur = 0;
    if (ra->C > 1) {
        memcpy(ra->ring[0], k, sizeof(float) * kv);
        memcpy(ra->ring[0] + kv, v, sizeof(float) * kv);
    }
    for (int s = 1; s < ra->C; s++) {
        ring_pass(ra, ra->ring[cur], ra->ring[cur ^ 1], 2 * kv);
        cur ^= 1;
        struct ring_job j = {.ra = ra, .s = s, .units = ra->S * ra->Hq, .per_seg = ra->Hq, .q = q};
        j.kk = ra->ring[cur], j.vv = ra->ring[cur] + kv, j.next = 0;
        khost_run_parts(step_parts(step_macs(ra), j.units), forward_part, &j);
        for (int g = 0; g < ra->S; g++) {
            const struct block b = step_block(ra, s, g);
            merge(ra, b.q0, b.q1, out, lse);
        }
        count_step(ra, s);
    }
}

void ring_attn_backward(struct ring_attn *ra, float *dq, float *dk, float *dv, const float *dout, const float *out,
                        const float *lse, const float *q, const float *k, const float *v)
{
    if (ra->dev) {
        backward_device(ra, dq, dk, dv, dout, out, lse, q, k, v);
        return;
    }
    const int n = ra->n, Hq = ra->Hq, hd = ra->hd;
    const size_t kv = (size_t)n * ra->Hkv * hd;
    k_attention_backward(ra->K, dq, dk, dv, dout, out, lse, q, k, v, ra->cu_diag, NULL, ra->nb_diag, Hq, ra->Hkv, hd);
    if (ra->C == 1)
        return;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hq; h++) {
            const size_t o = (size_t)i * Hq * hd + (size_t)h * hd;
            ra->drow[(size_t)i * Hq + h] = dot(dout + o, out + o, hd);
        }
    /* the ring buffers: [K | V | dK | dV] of the visiting chunks; the gradients start at the first visit (s = 1)
     * and go home after the last */
    memcpy(ra->ring[0], k, sizeof(float) * kv);
    memcpy(ra->ring[0] + kv, v, sizeof(float) * kv);
    int cur = 0;
    for (int s = 1; s < ra->C; s++) {
        const int both = s > 1; /* the K/V and the gradients gathered so far */
        ring_pass(ra, ra->ring[cur], ra->ring[cur ^ 1], (both ? 4 : 2) * kv);
        cur ^= 1;
        float *buf = ra->ring[cur];
        if (!both)
            memset(buf + 2 * kv, 0, sizeof(float) * 2 * kv);
        struct ring_job j = {.ra = ra, .s = s, .units = ra->S * ra->Hkv, .per_seg = ra->Hkv, .q = q, .dout = dout};
        j.lse = lse, j.dq = dq, j.kk = buf, j.vv = buf + kv, j.dkk = buf + 2 * kv, j.dvv = buf + 3 * kv, j.next = 0;
        khost_run_parts(step_parts(2 * step_macs(ra), j.units), backward_part, &j);
    }
    /* the last visitor's gradients to their owner, the next rank; ours from the previous */
    ring_pass(ra, ra->ring[cur] + 2 * kv, ra->ring[cur ^ 1] + 2 * kv, 2 * kv);
    const float *home = ra->ring[cur ^ 1] + 2 * kv;
    for (size_t e = 0; e < kv; e++)
        dk[e] += home[e], dv[e] += home[kv + e];
}
