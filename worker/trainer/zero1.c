#include "zero1.h"

#include <math.h>
#include <string.h>

#include "common/check.h"

struct zero1 *zero1_create(struct comm *dp, size_t n)
{
    struct zero1 *z = xcalloc(1, sizeof *z);
    const size_t D = (size_t)comm_size(dp), r = (size_t)comm_rank(dp);
    z->dp = dp;
    z->n = n;
    z->per = (n + D - 1) / D;
    z->lo = r * z->per < n ? r * z->per : n;
    z->hi = z->lo + z->per < n ? z->lo + z->per : n;
    z->grad = xcalloc(z->per + 1, sizeof(float)); /* + 1: never a zero-byte allocation */
    if (z->per * D != n)
        z->pad = xcalloc(z->per * D, sizeof(float));
    return z;
}

void zero1_free(struct zero1 *z)
{
    if (!z)
        return;
    free(z->grad);
    free(z->pad);
    free(z);
}

void zero1_reduce_scatter(struct zero1 *z, const float *grads)
{
    const float *send = grads;
    if (z->pad) { /* the blocks must be equal: zeros past the end */
        memcpy(z->pad, grads, z->n * sizeof(float));
        memset(z->pad + z->n, 0, (z->per * (size_t)comm_size(z->dp) - z->n) * sizeof(float));
        send = z->pad;
    }
    comm_reduce_scatter_sum(z->dp, send, z->grad, z->per, COMM_F32);
}

double zero1_clip(struct zero1 *z, double max_norm, const struct model *m)
{
    /* a LoRA adapter (whole models only) is all owned; a shard counts each parameter on one rank */
    double s = 0;
    if (m->lora)
        for (size_t i = 0; i < z->hi - z->lo; i++)
            s += (double)z->grad[i] * z->grad[i];
    else
        s = model_owned_sq(m, z->grad, z->lo, z->hi);
    comm_allreduce_sum(z->dp, &s, 1, COMM_F64);
    if (m->sh.mp) /* the other TP and PP ranks' parts of the parameters */
        comm_allreduce_sum(m->sh.mp, &s, 1, COMM_F64);
    const double norm = sqrt(s);
    grad_scale_to(z->grad, z->hi - z->lo, norm, max_norm);
    return norm;
}

/* Every rank's block of src (a whole n-float buffer whose block [lo, hi) is this rank's) into dst. */
static void gather_blocks(struct zero1 *z, const float *src, float *dst)
{
    const size_t k = z->hi - z->lo;
    memcpy(z->grad, src + z->lo, k * sizeof(float)); /* the send block may not alias the result */
    memset(z->grad + k, 0, (z->per - k) * sizeof(float));
    float *recv = z->pad ? z->pad : dst;
    comm_allgather(z->dp, z->grad, recv, z->per, COMM_F32);
    if (z->pad)
        memcpy(dst, z->pad, z->n * sizeof(float));
}

void zero1_allgather(struct zero1 *z, float *params) { gather_blocks(z, params, params); }

struct adamw *zero1_shard(const struct zero1 *z, const struct adamw *whole)
{
    struct adamw *o = adamw_create(z->hi - z->lo, whole->beta1, whole->beta2, whole->eps, whole->weight_decay);
    memcpy(o->m, whole->m + z->lo, o->n * sizeof(float));
    memcpy(o->v, whole->v + z->lo, o->n * sizeof(float));
    o->t = whole->t;
    return o;
}

struct adamw *zero1_gather(struct zero1 *z, const struct adamw *block)
{
    struct adamw *o = adamw_create(z->n, block->beta1, block->beta2, block->eps, block->weight_decay);
    o->t = block->t;
    /* the block sits at [lo, hi) of a whole buffer for gather_blocks */
    memcpy(o->m + z->lo, block->m, block->n * sizeof(float));
    memcpy(o->v + z->lo, block->v, block->n * sizeof(float));
    gather_blocks(z, o->m, o->m);
    gather_blocks(z, o->v, o->v);
    return o;
}
