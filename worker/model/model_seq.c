/* Sequence and context parallelism's data movement: Ulysses' all-to-all swaps of a rank's token slice for every
 * token of its share of the heads (and back), the rows of per-token results shared over the group, and context
 * parallelism's ring of a packed batch (each sequence padded and cut into load-balanced chunks) with the rows
 * each rank holds. */
#include "model_seq.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "ring_attn.h"
#include "worker/comm/comm.h"

/* Rows of a (rows, w) block at src (a row every ss floats) into dst (a row every ds floats), copied or added. */
static void copy_rows(struct kctx *K, float *dst, size_t ds, const float *src, size_t ss, int rows, int w, bool add)
{
    if (K->device == KDEV_CPU) {
        for (int r = 0; r < rows; r++) {
            float *y = dst + (size_t)r * ds;
            const float *x = src + (size_t)r * ss;
            if (add)
                for (int i = 0; i < w; i++)
                    y[i] += x[i];
            else
                memcpy(y, x, (size_t)w * sizeof(float));
        }
        return;
    }
    if (!add) { /* one strided copy where the back-end has one */
        k_copy_rows(K, dst, ds * sizeof(float), src, ss * sizeof(float), (size_t)w * sizeof(float), (size_t)rows);
        return;
    }
    for (int r = 0; r < rows; r++)
        k_add(K, dst + (size_t)r * ds, src + (size_t)r * ss, (size_t)w);
}

/* The all-to-all's staging buffer of n floats (the model's, reused). */
static float *sp_stage(const struct model *m, size_t n)
{
    struct karena *ar = &((struct model *)m)->work->sp;
    karena_reset(ar);
    karena_reserve(ar, (n ? n : 1) * sizeof(float), 1);
    return take_f(ar, n);
}

/* The swap's all-to-all over the SP group: as it is where the group carries the context's memory (the CPU's, or a
 * GPU's over NCCL); from a GPU over MPI through pinned host memory (down, across, up, the upload finished before
 * the staging is reused), as ring attention's ring goes. */
static void sp_alltoallv(const struct model *m, const float *send, const size_t *sc, float *recv, const size_t *rc)
{
    struct kctx *K = m->K;
    if (K->device == KDEV_CPU || comm_caps(m->sh.sp)->device_memory) {
        comm_alltoallv(m->sh.sp, send, sc, recv, rc, COMM_F32);
        return;
    }
    size_t ns = 0, nr = 0;
    for (int j = 0; j < m->sh.sp_size; j++)
        ns += sc[j], nr += rc[j];
    struct karena *ar = &m->work->sph;
    karena_reset(ar);
    karena_reserve(ar, ((ns ? ns : 1) + (nr ? nr : 1)) * sizeof(float), 2);
    float *hs = karena_take(ar, (ns ? ns : 1) * sizeof(float)), *hr = karena_take(ar, (nr ? nr : 1) * sizeof(float));
    k_to_host(K, hs, send, ns * sizeof(float));
    comm_alltoallv(m->sh.sp, hs, sc, hr, rc, COMM_F32);
    k_to_device(K, recv, hr, nr * sizeof(float));
    k_sync(K);
}

/* Sequence parallelism's swap before attention: this rank's n tokens of C columns (src, (n, C)) to every token
 * (Nf) of its heads (dst, (Nf, w)): peer j receives columns [j w, (j + 1) w), or with kv those of its KV heads. */
void model_sp_to_heads(const struct model *m, float *dst, const float *src, int n, int Nf, int C, int w, bool kv)
{
    const int S = m->sh.sp_size, hd = m->cfg.head_dim;
    float *stage = sp_stage(m, (size_t)n * w * S);
    size_t sc[S], rc[S];
    for (int j = 0; j < S; j++) {
        const size_t col = kv ? (size_t)sp_kv_lo(m, j) * hd : (size_t)j * w;
        copy_rows(m->K, stage + (size_t)j * n * w, (size_t)w, src + col, (size_t)C, n, w, false);
        sc[j] = (size_t)n * w;
        rc[j] = (size_t)(sp_lo(Nf, S, j + 1) - sp_lo(Nf, S, j)) * w;
    }
    sp_alltoallv(m, stage, sc, dst, rc);
}

/* Its reverse after attention: every token of this rank's heads (src, (Nf, w)) back to the ranks holding the
 * tokens, this rank's into its columns of dst (n, C); with kv, added (a replicated KV head's gradients sum over
 * the ranks that read it; dst zeroed by the caller). */
void model_sp_to_tokens(const struct model *m, float *dst, const float *src, int n, int Nf, int C, int w, bool kv)
{
    const int S = m->sh.sp_size, hd = m->cfg.head_dim;
    float *stage = sp_stage(m, (size_t)n * w * S);
    size_t sc[S], rc[S];
    for (int j = 0; j < S; j++) {
        sc[j] = (size_t)(sp_lo(Nf, S, j + 1) - sp_lo(Nf, S, j)) * w;
        rc[j] = (size_t)n * w;
    }
    sp_alltoallv(m, src, sc, stage, rc);
    for (int j = 0; j < S; j++) {
        const size_t col = kv ? (size_t)sp_kv_lo(m, j) * hd : (size_t)j * w;
        copy_rows(m->K, dst + col, (size_t)C, stage + (size_t)j * n * w, (size_t)w, n, w, kv);
    }
}

/* Sequence parallelism: host rows [t0, t0 + n) of v (Nf) from each rank, every row on every rank. */
void model_sp_share_rows(struct comm *sp, float *v, int Nf, int t0, int n)
{
    memset(v, 0, (size_t)t0 * sizeof(float));
    memset(v + t0 + n, 0, (size_t)(Nf - t0 - n) * sizeof(float));
    comm_allreduce_sum(sp, v, (size_t)Nf, COMM_F32);
}

/* Context parallelism: the ring of the whole batch b over m's group, cut as Megatron cuts packed sequences: each
 * sequence padded to a multiple of 2C by a sequence of its own (token 0 at positions 0...; read by no one) is one
 * segment, of which rank r holds chunks r and 2C-1-r, so every rank has the same causal work. This rank's ids,
 * targets and positions (3 x n, host) into *local, and the batch row of each of its n rows (-1: padding) into
 * *rowof. */
struct ring_attn *model_cp_plan(const struct model *m, const struct packed_batch *b, int32_t **local, int32_t **rowof)
{
    if (b->prefix_of)
        check_failf(__FILE__, __LINE__,
                    "model_forward_stage: context parallelism runs without shared-prompt packing (prefix_of)");
    const int C2 = 2 * m->sh.sp_size;
    int L = 0, B = 0, S = 0;
    for (int s = 0; s < b->B; s++) {
        const int ls = b->cu_seqlens[s + 1] - b->cu_seqlens[s], ps = (ls + C2 - 1) / C2 * C2;
        L += ps, B += ls > 0 ? 1 + (ps > ls) : 0, S += ls > 0;
    }
    const int Lr = L > 0 ? L : C2; /* an empty batch: one padding sequence */
    int32_t *cu = xmalloc((size_t)(B + 2) * sizeof *cu), *seg = xmalloc((size_t)(S + 2) * sizeof *seg);
    int32_t *whole = xcalloc(3 * (size_t)Lr, sizeof *whole), *orig = xmalloc((size_t)Lr * sizeof *orig);
    int off = 0, bi = 0, si = 0;
    cu[0] = seg[0] = 0;
    for (int s = 0; s < b->B; s++) {
        const int lo = b->cu_seqlens[s], ls = b->cu_seqlens[s + 1] - lo, ps = (ls + C2 - 1) / C2 * C2;
        if (ls <= 0)
            continue;
        for (int j = 0; j < ps; j++) {
            const bool real = j < ls;
            whole[off + j] = real ? b->ids[lo + j] : 0;
            whole[(size_t)Lr + off + j] = real ? b->targets[lo + j] : 0;
            whole[2 * (size_t)Lr + off + j] = real ? b->pos[lo + j] : j - ls;
            orig[off + j] = real ? lo + j : -1;
        }
        cu[++bi] = off + ls;
        if (ps > ls)
            cu[++bi] = off + ps;
        seg[++si] = off += ps;
    }
    if (L == 0) {
        for (int j = 0; j < Lr; j++)
            whole[2 * (size_t)Lr + j] = j, orig[j] = -1;
        cu[++bi] = seg[++si] = Lr;
    }
    struct ring_attn *ra = xcalloc(1, sizeof *ra);
    char why[256];
    if (ring_attn_plan(ra, m->K, m->sh.sp, Lr, cu, bi, seg, si, m->sh.n_heads, m->sh.n_kv_heads, m->cfg.head_dim, why,
                       sizeof why) != 0)
        check_failf(__FILE__, __LINE__, "model_forward_stage: context parallelism: %s", why);
    const int n = ra->n;
    *local = xmalloc(3 * (size_t)n * sizeof **local);
    for (int k = 0; k < 3; k++)
        ring_attn_take_i32(ra, *local + (size_t)k * n, whole + (size_t)k * Lr);
    *rowof = xmalloc((size_t)(n > 0 ? n : 1) * sizeof **rowof);
    ring_attn_take_i32(ra, *rowof, orig);
    free(cu), free(seg), free(whole), free(orig);
    return ra;
}

int model_stage_rows(const struct model *m, const struct packed_batch *b)
{
    const struct model_shard *sh = &m->sh;
    if (!sh->sp)
        return b->N;
    if (!sh->ring)
        return sp_lo(b->N, sh->sp_size, sh->sp_rank + 1) - sp_lo(b->N, sh->sp_size, sh->sp_rank);
    const int C2 = 2 * sh->sp_size; /* model_cp_plan's padded ring: each sequence to a multiple of 2C, C2 when empty */
    int L = 0;
    for (int s = 0; s < b->B; s++) {
        const int ls = b->cu_seqlens[s + 1] - b->cu_seqlens[s];
        L += (ls + C2 - 1) / C2 * C2;
    }
    return (L > 0 ? L : C2) / sh->sp_size;
}

/* Context parallelism: this rank's host values (n, at batch rows rowof) into their rows of v (the whole batch's)
 * on every rank (summed over the group, zeros elsewhere); the rows a caller does not read (logp_from) stay 0. */
void model_cp_share_rows(const struct model *m, const int32_t *rowof, int n, const struct packed_batch *b, float *v,
                         const float *mine)
{
    memset(v, 0, (size_t)b->N * sizeof *v);
    for (int i = 0; i < n; i++)
        if (rowof[i] >= 0)
            v[rowof[i]] = mine[i];
    comm_allreduce_sum(m->sh.sp, v, (size_t)b->N, COMM_F32);
    if (b->logp_from)
        for (int s = 0; s < b->B; s++)
            memset(v + b->cu_seqlens[s], 0, (size_t)(b->logp_from[s] - b->cu_seqlens[s]) * sizeof *v);
}

/* Context parallelism: this rank's n rows (batch rows rowof; -1: padding, 0) of a whole batch's host values. */
void model_cp_take_rows(const int32_t *rowof, int n, float *dst, const float *src)
{
    for (int i = 0; i < n; i++)
        dst[i] = rowof[i] >= 0 ? src[rowof[i]] : 0.0f;
}
