/* Bucketed DP gradient all-reduce during the backward: see grad_reduce.h. */
#include "grad_reduce.h"

#include <stdbool.h>
#include <stdlib.h>

#include "common/check.h"
#include "kernels/kernels.h"

struct bucket {
    int low_layer; /* the bucket starts once this layer's backward is queued */
    size_t lo, hi; /* floats [lo, hi) of the gradient */
};

struct grad_reducer {
    struct model *m;
    struct comm *c;
    int nb;
    struct bucket *b;              /* in the backward's order: the top layers first */
    size_t rest_lo[2], rest_hi[2]; /* what no layer holds: before the first layer, after the last */
    struct comm_req **req;         /* nb + 2 */
    int started;                   /* buckets started in this mini-batch */
    size_t largest;
};

struct grad_reducer *grad_reducer_create(struct model *m, struct comm *c, size_t bucket_size)
{
    const struct model_shard *sh = &m->sh;
    if (m->lora || sh->tp_size > 1 || sh->pp_size > 1)
        check_failf(__FILE__, __LINE__, "grad_reducer_create: whole models only (no TP, PP or LoRA)");
    if (bucket_size == 0) {
        bucket_size = (size_t)40000000;
        if ((size_t)comm_size(c) * 1000000 > bucket_size)
            bucket_size = (size_t)comm_size(c) * 1000000;
    }
    struct grad_reducer *r = xcalloc(1, sizeof *r);
    r->m = m;
    r->c = c;
    const int L = sh->layer_hi - sh->layer_lo;
    r->b = xcalloc((size_t)(L ? L : 1), sizeof *r->b);
    r->req = xcalloc((size_t)L + 2, sizeof *r->req);
    size_t first_lo = 0, last_hi = 0;
    for (int l = sh->layer_hi - 1; l >= sh->layer_lo; l--) {
        size_t lo, hi;
        model_layer_span(m, l, &lo, &hi);
        if (l == sh->layer_hi - 1)
            last_hi = hi;
        first_lo = lo;
        struct bucket *cur = r->nb ? &r->b[r->nb - 1] : NULL;
        if (!cur || cur->hi - cur->lo >= bucket_size) /* a new bucket under a full one */
            cur = &r->b[r->nb++], cur->hi = hi;
        cur->lo = lo; /* layers are laid out in order: the bucket grows down to this one */
        cur->low_layer = l;
    }
    for (int i = 0; i < r->nb; i++)
        if (r->b[i].hi - r->b[i].lo > r->largest)
            r->largest = r->b[i].hi - r->b[i].lo;
    r->rest_lo[0] = 0, r->rest_hi[0] = L ? first_lo : m->w.n_floats;
    r->rest_lo[1] = L ? last_hi : m->w.n_floats, r->rest_hi[1] = m->w.n_floats;
    return r;
}

/* The sum of the gradient's floats [lo, hi), started behind the backward's queued work. */
static struct comm_req *sum_range(struct grad_reducer *r, size_t lo, size_t hi)
{
    return comm_iallreduce_sum(r->c, r->m->grad->mem + lo, hi - lo, COMM_F32, r->m->K->stream);
}

static void start(struct grad_reducer *r, int i) { r->req[i] = sum_range(r, r->b[i].lo, r->b[i].hi); }

/* model_set_layer_grads_hook: the buckets whose lowest layer this is start; the others in flight progress. */
static void layer_done(void *ud, int layer)
{
    struct grad_reducer *r = ud;
    for (int i = 0; i < r->started; i++)
        comm_test(r->req[i]);
    while (r->started < r->nb && r->b[r->started].low_layer == layer)
        start(r, r->started++);
}

void grad_reducer_arm(struct grad_reducer *r) { model_set_layer_grads_hook(r->m, layer_done, r); }

void grad_reducer_finish(struct grad_reducer *r)
{
    model_set_layer_grads_hook(r->m, NULL, NULL);
    model_alloc_grads(r->m); /* a rank that had nothing to compute still sums (its zeros) */
    while (r->started < r->nb)
        start(r, r->started++);
    int n = r->nb;
    for (int k = 0; k < 2; k++)
        if (r->rest_hi[k] > r->rest_lo[k])
            r->req[n++] = sum_range(r, r->rest_lo[k], r->rest_hi[k]);
    for (int i = 0; i < n; i++)
        comm_wait(r->req[i]);
    r->started = 0;
}

int grad_reducer_buckets(const struct grad_reducer *r) { return r->nb; }
size_t grad_reducer_largest(const struct grad_reducer *r) { return r->largest; }

void grad_reducer_free(struct grad_reducer *r)
{
    if (!r)
        return;
    free(r->b);
    free(r->req);
    free(r);
}
