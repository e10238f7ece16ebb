#include "zero1.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "worker/model/lora.h"

/* ZeRO-1 under expert parallelism: class 0 the dense parameters (sharded over DP), class 1 this rank's experts
 * (over edp). Each class is a list of spans of the parameter buffer, packed back to back in its order. */
struct zero1_ep {
    struct comm *group[2]; /* dp, edp (NULL: a group of one) */
    /* sequence or context parallelism: the dense class is sharded over DP x SP (group[0]); the experts' gradients are
     * first summed over the SP group (sp, else NULL), and every SP rank keeps the same expert block */
    struct comm *sp;
    bool sp_lead; /* SP rank 0: the one whose expert block counts in the norm */
    int n_span[2];
    size_t *at[2], *len[2]; /* the spans: floats [at, at + len) of the parameter buffer */
    size_t tot[2];          /* the class's floats */
    size_t per[2];          /* block per rank: ceil(tot / group size) */
    size_t lo[2], hi[2];    /* this rank's block of the packed class */
    float *pack[2];         /* per x group size floats: the packed class (the context's memory) */
    float *pblock;          /* the two blocks' parameters, back to back (what AdamW steps; the context's memory) */
    /* parameters not counted in the norm (in order): the last stage's copy of a tied embedding, and under TP the
     * parts every TP rank holds whole (norms, the router, shared KV heads) on all TP ranks but their owner */
    int n_skip;
    size_t *skip_at, *skip_len;
};

static size_t ep_k(const struct zero1_ep *e, int c) { return e->hi[c] - e->lo[c]; }

static void ep_add_span(struct zero1_ep *e, int c, size_t at, size_t len)
{
    if (!len)
        return;
    e->at[c] = xrealloc(e->at[c], (size_t)(e->n_span[c] + 1) * sizeof(size_t));
    e->len[c] = xrealloc(e->len[c], (size_t)(e->n_span[c] + 1) * sizeof(size_t));
    e->at[c][e->n_span[c]] = at;
    e->len[c][e->n_span[c]] = len;
    e->n_span[c]++;
    e->tot[c] += len;
}

static size_t ep_group_size(const struct zero1_ep *e, int c)
{
    return e->group[c] ? (size_t)comm_size(e->group[c]) : 1;
}

/* src's spans of class c into pack (per[c] x the group's size floats of K's memory, like src), zeros past them */
static void ep_pack(struct kctx *K, const struct zero1_ep *e, int c, const float *src, float *pack)
{
    size_t off = 0;
    for (int i = 0; i < e->n_span[c]; i++) {
        k_copy(K, pack + off, src + e->at[c][i], e->len[c][i] * sizeof(float));
        off += e->len[c][i];
    }
    k_zero(K, pack + off, (e->per[c] * ep_group_size(e, c) - off) * sizeof(float));
}

/* packed class c (from) back into dst's spans */
static void ep_unpack(struct kctx *K, const struct zero1_ep *e, int c, const float *from, float *dst)
{
    size_t off = 0;
    for (int i = 0; i < e->n_span[c]; i++) {
        k_copy(K, dst + e->at[c][i], from + off, e->len[c][i] * sizeof(float));
        off += e->len[c][i];
    }
}

/* Every rank's block of class c into dst's spans, from this rank's block (k floats at mine); stage holds per[c]
 * and pack the packed class, all of K's memory. */
static void ep_gather(struct kctx *K, const struct zero1_ep *e, int c, const float *mine, float *stage, float *pack,
                      float *dst)
{
    if (!e->group[c]) { /* the block is the whole class */
        ep_unpack(K, e, c, mine, dst);
        return;
    }
    const size_t k = ep_k(e, c);
    k_copy(K, stage, mine, k * sizeof(float));
    k_zero(K, stage + k, (e->per[c] - k) * sizeof(float));
    comm_allgather(e->group[c], stage, pack, e->per[c], COMM_F32);
    ep_unpack(K, e, c, pack, dst);
}

/* The squares of this rank's dense block that fall in the skipped spans (counted on another TP rank or stage). */
static double ep_skipped_sq(const struct zero1 *z)
{
    const struct zero1_ep *e = z->ep;
    double s = 0;
    size_t off = 0; /* the span's place in the packed dense class */
    for (int i = 0; e->n_skip && i < e->n_span[0]; off += e->len[0][i], i++) {
        /* the span's floats in this rank's block, then in each skipped span, as parameter indices */
        const size_t a = off > e->lo[0] ? off : e->lo[0],
                     b = off + e->len[0][i] < e->hi[0] ? off + e->len[0][i] : e->hi[0];
        if (a >= b)
            continue;
        const size_t pa = e->at[0][i] + (a - off), pb = e->at[0][i] + (b - off);
        for (int j = 0; j < e->n_skip; j++) {
            const size_t fa = pa > e->skip_at[j] ? pa : e->skip_at[j],
                         fb = pb < e->skip_at[j] + e->skip_len[j] ? pb : e->skip_at[j] + e->skip_len[j];
            if (fa < fb) /* back to the block's index: packed (fa - at + off) - lo */
                s += k_sumsq(z->K, z->grad + (fa - e->at[0][i] + off - e->lo[0]), fb - fa);
        }
    }
    return s;
}

struct zero1 *zero1_create_ep(struct kctx *K, struct comm *dp, struct comm *edp, const struct model *m)
{
    struct zero1 *z = xcalloc(1, sizeof *z);
    struct zero1_ep *e = xcalloc(1, sizeof *e);
    z->K = K;
    z->dp = dp;
    /* a LoRA adapter (whole models: no TP or PP) is sharded the same way, its experts' adapters the second class */
    z->n = m->lora ? m->lora->n : m->w.n_floats;
    z->ep = e;
    e->group[0] = dp;
    e->group[1] = edp && comm_size(edp) > 1 ? edp : NULL;
    e->sp = m->sh.sp;
    e->sp_lead = !m->sh.sp || m->sh.sp_rank == 0;
    size_t at = 0; /* the dense floats from here up to the next layer's experts */
    for (int l = m->sh.layer_lo; l < m->sh.layer_hi; l++) {
        size_t lo, hi;
        trainable_expert_span(m, l, &lo, &hi);
        if (hi == lo)
            continue;
        ep_add_span(e, 0, at, lo - at);
        ep_add_span(e, 1, lo, hi - lo);
        at = hi;
    }
    ep_add_span(e, 0, at, z->n - at);
    if (!m->lora) /* an adapter's every float counts: each EP rank's experts, the rest disjoint over DP */
        e->n_skip = model_tp_unowned_spans(m, &e->skip_at, &e->skip_len);
    for (int c = 0; c < 2; c++) {
        const size_t G = e->group[c] ? (size_t)comm_size(e->group[c]) : 1,
                     r = e->group[c] ? (size_t)comm_rank(e->group[c]) : 0;
        e->per[c] = (e->tot[c] + G - 1) / G;
        e->lo[c] = r * e->per[c] < e->tot[c] ? r * e->per[c] : e->tot[c];
        e->hi[c] = e->lo[c] + e->per[c] < e->tot[c] ? e->lo[c] + e->per[c] : e->tot[c];
        e->pack[c] = k_calloc(K, (e->per[c] * G + 1) * sizeof(float), KMEM_GRADS, "ZeRO-1's packed class (EP)");
    }
    /* the dense block's reduce-scatter writes per[0] floats, the experts' per[1] after the dense block's k */
    z->per = e->per[0] + e->per[1];
    z->grad = k_calloc(K, (z->per + 1) * sizeof(float), KMEM_GRADS, "ZeRO-1's blocks of the summed gradients");
    e->pblock = k_calloc(K, (ep_k(e, 0) + ep_k(e, 1) + 1) * sizeof(float), KMEM_WEIGHTS,
                         "ZeRO-1's block of the parameters (EP)");
    return z;
}

size_t zero1_block_floats(const struct zero1 *z) { return z->ep ? ep_k(z->ep, 0) + ep_k(z->ep, 1) : z->hi - z->lo; }

struct zero1 *zero1_create(struct kctx *K, struct comm *dp, size_t n)
{
    struct zero1 *z = xcalloc(1, sizeof *z);
    const size_t D = (size_t)comm_size(dp), r = (size_t)comm_rank(dp);
    z->K = K;
    z->dp = dp;
    z->n = n;
    z->per = (n + D - 1) / D;
    z->lo = r * z->per < n ? r * z->per : n;
    z->hi = z->lo + z->per < n ? z->lo + z->per : n;
    /* + 1: never a zero-byte allocation */
    z->grad = k_calloc(K, (z->per + 1) * sizeof(float), KMEM_GRADS, "ZeRO-1's block of the summed gradients");
    if (z->per * D != n)
        z->pad = k_calloc(K, z->per * D * sizeof(float), KMEM_GRADS, "ZeRO-1's padded gradient buffer");
    return z;
}

void zero1_free(struct zero1 *z)
{
    if (!z)
        return;
    k_free(z->K, z->grad, (z->per + 1) * sizeof(float), KMEM_GRADS);
    if (z->ep) {
        struct zero1_ep *e = z->ep;
        for (int c = 0; c < 2; c++) {
            k_free(z->K, e->pack[c], (e->per[c] * ep_group_size(e, c) + 1) * sizeof(float), KMEM_GRADS);
            free(e->at[c]), free(e->len[c]);
        }
        k_free(z->K, e->pblock, (ep_k(e, 0) + ep_k(e, 1) + 1) * sizeof(float), KMEM_WEIGHTS);
        free(z->ep->skip_at), free(z->ep->skip_len);
        free(z->ep);
    }
    if (z->pad)
        k_free(z->K, z->pad, z->per * (size_t)comm_size(z->dp) * sizeof(float), KMEM_GRADS);
    free(z);
}

void zero1_reduce_scatter(struct zero1 *z, const float *grads)
{
    if (z->ep) {
        struct zero1_ep *e = z->ep;
        float *dst[2] = {z->grad, z->grad + ep_k(e, 0)};
        for (int c = 0; c < 2; c++) {
            ep_pack(z->K, e, c, grads, e->pack[c]);
            if (c == 1 && e->sp) /* each SP rank's tokens gave a part of the experts' gradients */
                comm_allreduce_sum(e->sp, e->pack[1], e->tot[1], COMM_F32);
            if (e->group[c])
                comm_reduce_scatter_sum(e->group[c], e->pack[c], dst[c], e->per[c], COMM_F32);
            else
                k_copy(z->K, dst[c], e->pack[c], e->tot[c] * sizeof(float));
        }
        return;
    }
    const float *send = grads;
    if (z->pad) { /* the blocks must be equal: zeros past the end */
        k_copy(z->K, z->pad, grads, z->n * sizeof(float));
        k_zero(z->K, z->pad + z->n, (z->per * (size_t)comm_size(z->dp) - z->n) * sizeof(float));
        send = z->pad;
    }
    comm_reduce_scatter_sum(z->dp, send, z->grad, z->per, COMM_F32);
}

double zero1_clip(struct zero1 *z, double max_norm, const struct model *m)
{
    if (z->ep) { /* the dense blocks are disjoint over DP, the experts' over edp and EP: DP holds each once (with SP
                  * the dense blocks disjoint over DP x SP, the experts' counted on SP rank 0) */
        const size_t k = zero1_block_floats(z), k0 = ep_k(z->ep, 0);
        double s = k_sumsq(z->K, z->grad, k0) - ep_skipped_sq(z);
        if (z->ep->sp_lead)
            s += k_sumsq(z->K, z->grad + k0, k - k0);
        comm_allreduce_sum(z->dp, &s, 1, COMM_F64);
        if (m->sh.tp) /* the other TP ranks' rows and columns (what all of them hold whole skipped but on one) */
            comm_allreduce_sum(m->sh.tp, &s, 1, COMM_F64);
        if (m->sh.pp) /* the other stages' layers */
            comm_allreduce_sum(m->sh.pp, &s, 1, COMM_F64);
        const double norm = sqrt(s);
        grad_scale_to_on(z->K, z->grad, k, norm, max_norm);
        return norm;
    }
    /* a shard counts each parameter (or with LoRA each part of the adapter) on one rank; a whole adapter is all
     * owned */
    double s = m->lora
                   ? (m->sh.mp ? lora_owned_sq_range(m, z->grad, z->lo, z->hi) : k_sumsq(z->K, z->grad, z->hi - z->lo))
                   : model_owned_sq(m, z->grad, z->lo, z->hi);
    comm_allreduce_sum(z->dp, &s, 1, COMM_F64);
    if (m->sh.mp) /* the other TP and PP ranks' parts of the parameters */
        comm_allreduce_sum(m->sh.mp, &s, 1, COMM_F64);
    const double norm = sqrt(s);
    grad_scale_to_on(z->K, z->grad, z->hi - z->lo, norm, max_norm);
    return norm;
}

/* Every rank's block of src (a whole n-float buffer of K's memory whose block [lo, hi) is this rank's) into dst;
 * stage (per floats) and pad (per * DP floats, or NULL where DP divides n) of the same memory. */
static void gather_blocks(struct zero1 *z, struct kctx *K, float *stage, float *pad, const float *src, float *dst)
{
    const size_t k = z->hi - z->lo;
    k_copy(K, stage, src + z->lo, k * sizeof(float)); /* the send block may not alias the result */
    k_zero(K, stage + k, (z->per - k) * sizeof(float));
    float *recv = pad ? pad : dst;
    comm_allgather(z->dp, stage, recv, z->per, COMM_F32);
    if (pad)
        k_copy(K, dst, pad, z->n * sizeof(float));
}

void zero1_allgather(struct zero1 *z, float *params)
{
    if (z->ep) { /* the blocks' parameters are in pblock (zero1_step) */
        struct zero1_ep *e = z->ep;
        ep_gather(z->K, e, 0, e->pblock, z->grad, e->pack[0], params);
        ep_gather(z->K, e, 1, e->pblock + ep_k(e, 0), z->grad, e->pack[1], params);
        k_weights_changed(z->K, params);
        return;
    }
    gather_blocks(z, z->K, z->grad, z->pad, params, params);
    k_weights_changed(z->K, params); /* the all-gather wrote them: a kept BF16 copy is made again (kernels.h) */
}

void zero1_step(struct zero1 *z, struct adamw *opt, float *params, double lr)
{
    if (!z->ep) {
        adamw_step(opt, params + z->lo, z->grad, lr);
        zero1_allgather(z, params);
        return;
    }
    struct zero1_ep *e = z->ep;
    for (int c = 0, off = 0; c < 2; off += (int)ep_k(e, c), c++) {
        ep_pack(z->K, e, c, params, e->pack[c]);
        k_copy(z->K, e->pblock + off, e->pack[c] + e->lo[c], ep_k(e, c) * sizeof(float));
    }
    adamw_step(opt, e->pblock, z->grad, lr);
    zero1_allgather(z, params);
}

/* bytes from src (of srcK's memory) to dst (of dstK's): the same context, or host and device either way */
static void copy_across(struct kctx *dstK, void *dst, struct kctx *srcK, const void *src, size_t bytes)
{
    if (dstK == srcK)
        k_copy(dstK, dst, src, bytes);
    else if (dstK->device == KDEV_CPU && srcK->device == KDEV_CPU) /* two CPU contexts (fp32, BF16): one memory */
        memcpy(dst, src, bytes);
    else if (srcK->device == KDEV_CPU)
        k_to_device(dstK, dst, src, bytes);
    else if (dstK->device == KDEV_CPU)
        k_to_host(srcK, dst, src, bytes);
    else
        check_failf(__FILE__, __LINE__, "ZeRO-1: the optimizer state cannot move between two devices");
}

struct adamw *zero1_shard(const struct zero1 *z, const struct adamw *whole)
{
    struct adamw *o =
        adamw_create_on(z->K, zero1_block_floats(z), whole->beta1, whole->beta2, whole->eps, whole->weight_decay);
    if (z->ep) { /* the whole state packed in host memory, each class's block copied into the context's */
        const struct zero1_ep *e = z->ep;
        struct kctx *H = kctx_cpu();
        const size_t cap = e->per[0] * ep_group_size(e, 0) > e->per[1] * ep_group_size(e, 1)
                               ? e->per[0] * ep_group_size(e, 0)
                               : e->per[1] * ep_group_size(e, 1);
        float *host = xmalloc(z->n * sizeof(float) + 1), *pack = xmalloc((cap + 1) * sizeof(float));
        const float *src[2] = {whole->m, whole->v};
        float *dst[2] = {o->m, o->v};
        for (int i = 0; i < 2; i++) {
            copy_across(H, host, whole->K, src[i], z->n * sizeof(float));
            for (int c = 0, off = 0; c < 2; off += (int)ep_k(e, c), c++) {
                ep_pack(H, e, c, host, pack);
                copy_across(z->K, dst[i] + off, H, pack + e->lo[c], ep_k(e, c) * sizeof(float));
            }
        }
        free(host), free(pack);
        o->t = whole->t;
        return o;
    }
    copy_across(z->K, o->m, whole->K, whole->m + z->lo, o->n * sizeof(float));
    copy_across(z->K, o->v, whole->K, whole->v + z->lo, o->n * sizeof(float));
    o->t = whole->t;
    return o;
}

struct adamw *zero1_gather(struct zero1 *z, const struct adamw *block)
{
    struct adamw *o = adamw_create(z->n, block->beta1, block->beta2, block->eps, block->weight_decay);
    o->t = block->t;
    struct kctx *H = o->K; /* host memory: what a checkpoint is written from */
    if (z->ep) {           /* over host memory: the block copied out of the context's, each class gathered */
        const struct zero1_ep *e = z->ep;
        const size_t k = zero1_block_floats(z);
        float *stage = xcalloc(z->per + 1, sizeof(float)), *mine = xcalloc(k + 1, sizeof(float));
        float *pack[2] = {xcalloc(e->per[0] * ep_group_size(e, 0) + 1, sizeof(float)),
                          xcalloc(e->per[1] * ep_group_size(e, 1) + 1, sizeof(float))};
        const float *src[2] = {block->m, block->v};
        float *dst[2] = {o->m, o->v};
        for (int i = 0; i < 2; i++) {
            copy_across(H, mine, block->K, src[i], k * sizeof(float));
            ep_gather(H, e, 0, mine, stage, pack[0], dst[i]);
            ep_gather(H, e, 1, mine + ep_k(e, 0), stage, pack[1], dst[i]);
        }
        free(stage), free(mine), free(pack[0]), free(pack[1]);
        return o;
    }
    /* the block sits at [lo, hi) of a whole buffer for gather_blocks */
    copy_across(H, o->m + z->lo, block->K, block->m, block->n * sizeof(float));
    copy_across(H, o->v + z->lo, block->K, block->v, block->n * sizeof(float));
    const size_t D = (size_t)comm_size(z->dp);
    float *stage = xcalloc(z->per + 1, sizeof(float)), *pad = z->pad ? xcalloc(z->per * D, sizeof(float)) : NULL;
    gather_blocks(z, H, stage, pad, o->m, o->m);
    gather_blocks(z, H, stage, pad, o->v, o->v);
    free(stage);
    free(pad);
    return o;
}
