#include "zero1.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"

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
    if (z->pad)
        k_free(z->K, z->pad, z->per * (size_t)comm_size(z->dp) * sizeof(float), KMEM_GRADS);
    free(z);
}

void zero1_reduce_scatter(struct zero1 *z, const float *grads)
{
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
    /* a LoRA adapter (whole models only) is all owned; a shard counts each parameter on one rank */
    double s = m->lora ? k_sumsq(z->K, z->grad, z->hi - z->lo) : model_owned_sq(m, z->grad, z->lo, z->hi);
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

void zero1_allgather(struct zero1 *z, float *params) { gather_blocks(z, z->K, z->grad, z->pad, params, params); }

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
    struct adamw *o = adamw_create_on(z->K, z->hi - z->lo, whole->beta1, whole->beta2, whole->eps, whole->weight_decay);
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
