/* The linear maps of a decoder layer: the base product y = x W^T + b of the shard's part of a projection's weight
 * (and a mixture of experts' router), its backward (no weight gradient while the base is frozen), and after each
 * the projection hook's term (struct model_hook: an adapter's, which the model knows nothing of); the hook's terms
 * on the experts; the TP group's sum of partial results. Every projection of the training forward and backward and
 * of the generation step goes through here. */
#include "model.h"

#include <stdlib.h>

#include "common/check.h"
#include "common/config_key_names.h"
#include "kernels/kernels.h"
#include "model_internal.h"
#include "worker/comm/comm.h"

/* The weight and bias of projection p in params P (weights or gradients). */
static float *proj_weight(const struct layer_params *P, enum proj_kind p, float **bias)
{
    if (!P) { /* no such parameters (a model without gradients) */
        *bias = NULL;
        return NULL;
    }
    float *const w[PROJ_KINDS] = {P->wq, P->wk, P->wv, P->wo, P->w_gate, P->w_up, P->w_down};
    float *const b[PROJ_KINDS] = {P->bq, P->bk, P->bv, NULL, NULL, NULL, NULL};
    *bias = b[p];
    return w[p];
}

/* Batch-invariant mode's fixed groups of a row-parallel projection's inputs (o_proj's and down_proj's columns):
 * the largest power of two up to 8 dividing the whole model's columns (heads x head_dim, intermediate_size).
 * Each group's product is one partial, the partials are summed in a fixed pairwise tree, and a TP rank's groups
 * are a subtree of it: the sum's bits are the same whatever the TP size (a power of two dividing the groups). */
static int pow2_groups(int cols)
{
    int g = 8;
    while (g > 1 && cols % g != 0)
        g /= 2;
    return g;
}

static int bi_groups(const struct model *m, enum proj_kind p)
{
    return pow2_groups(p == PROJ_O ? m->cfg.n_heads * m->cfg.head_dim : m->cfg.intermediate_size);
}

/* The groups of a TP rank (G / tp), or a failure naming the TP size that does not divide them. */
static int rank_groups(const struct model *m, int G, const char *what)
{
    const int tp = m->sh.tp_size;
    if (G % tp != 0)
        check_failf(__FILE__, __LINE__,
                    "batch-invariant mode (" KEY_arr_model_batch_invariant "): tensor parallel size %d does not "
                    "divide the %d fixed groups of the model's %s columns; use a TP size dividing %d",
                    tp, G, what, G);
    return G / tp;
}

/* The pairwise tree over n (a power of two) buffers of len floats, n apart by stride, into the first: (0+1)+(2+3)... */
static void tree_sum(struct kctx *K, float *first, size_t stride, int n, size_t len)
{
    for (int w = 1; w < n; w *= 2)
        for (int j = 0; j + w < n; j += 2 * w)
            k_add(K, first + (size_t)j * stride, first + (size_t)(j + w) * stride, len);
}

/* per thread, growing only: the partials */
static _Thread_local float *tl_part;
static _Thread_local size_t tl_part_n;

static float *part_floats(size_t n)
{
    if (n > tl_part_n) {
        free(tl_part);
        tl_part = xmalloc(n * sizeof(float));
        tl_part_n = n;
    }
    return tl_part;
}

static bool bi_rowpar(const struct model *m, enum proj_kind p)
{
    return (p == PROJ_O || p == PROJ_DOWN) && k_batch_invariant() && m->K->device == KDEV_CPU &&
           m->K->ops->linear_forward_ld;
}

/* y (N, dout) = this rank's subtree of the groups' partials of x W^T (din columns, no bias). */
static void rowpar_forward(const struct model *m, enum proj_kind p, float *y, const float *x, const float *W, int N,
                           int din, int dout)
{
    const int g = rank_groups(m, bi_groups(m, p), p == PROJ_O ? "o_proj" : "down_proj"), kc = din / g;
    const size_t len = (size_t)N * dout;
    if (N <= 0 || dout <= 0)
        return;
    if (g == 1) {
        k_linear_forward_ld(m->K, y, x, din, W, din, N, din, dout);
        return;
    }
    float *part = part_floats((size_t)g * len);
    for (int j = 0; j < g; j++)
        k_linear_forward_ld(m->K, part + (size_t)j * len, x + (size_t)j * kc, din, W + (size_t)j * kc, din, N, kc,
                            dout);
    tree_sum(m->K, part, len, g, len);
    k_copy(m->K, y, part, len * sizeof(float));
}

int model_bi_expert_groups(const struct model *m)
{
    if (!k_batch_invariant() || m->K->device != KDEV_CPU || !m->K->ops->linear_forward_ld || !m->cfg.n_experts)
        return 0;
    return rank_groups(m, pow2_groups(m->cfg.moe_intermediate), "experts' down_proj");
}

/* Batch-invariant mode on the CPU: the hook's merged weight of projection p (struct model_hook), or NULL. */
static const float *bi_merged(const struct model *m, int l, enum proj_kind p)
{
    if (!k_batch_invariant() || m->K->device != KDEV_CPU || !m->hook || !m->hook->proj_merged)
        return NULL;
    return m->hook->proj_merged(m, l, p);
}

void model_proj_forward(const struct model *m, int l, enum proj_kind p, float *y, const float *x, int N)
{
    int din, dout;
    float *b;
    const float *W = proj_weight(&m->w.layers[l], p, &b), *merged = bi_merged(m, l, p);
    model_proj_dims(m, p, &din, &dout);
    if (merged) /* the adapter in the weight, as a rollout given the merged weights has it */
        W = merged;
    if (bi_rowpar(m, p) && !b)
        rowpar_forward(m, p, y, x, W, N, din, dout);
    else
        k_linear_forward(m->K, y, x, W, b, N, din, dout);
    if (!merged && m->hook && m->hook->proj_forward)
        m->hook->proj_forward(m, l, p, y, x, N);
}

void model_proj_backward(struct model *m, int l, enum proj_kind p, float *dx, const float *dy, const float *x, int N)
{
    int din, dout;
    float *b, *dW = NULL, *db = NULL;
    const float *W = proj_weight(&m->w.layers[l], p, &b);
    if (!m->frozen)
        dW = proj_weight(&m->grad->layers[l], p, &db);
    model_proj_dims(m, p, &din, &dout);
    k_linear_backward(m->K, dx, dW, db, dy, x, W, N, din, dout);
    if (m->hook && m->hook->proj_backward)
        m->hook->proj_backward(m, l, p, dx, dy, x, N);
}

/* Batch-invariant mode on the CPU with a hook that merges a mixture of experts' weights (under expert parallelism
 * this rank's experts'). */
static bool bi_moe_merges(const struct model *m)
{
    return k_batch_invariant() && m->K->device == KDEV_CPU && m->hook && m->hook->moe_merged;
}

void model_router_forward(const struct model *m, int l, float *y, const float *x, int N)
{
    const float *merged = bi_moe_merges(m) ? m->hook->moe_merged(m, l, 0) : NULL;
    k_linear_forward(m->K, y, x, merged ? merged : m->w.layers[l].router, NULL, N, m->cfg.hidden_size,
                     m->cfg.n_experts);
    if (!merged && m->hook && m->hook->router_forward)
        m->hook->router_forward(m, l, y, x, N);
}

bool model_expert_weights(const struct model *m, int l, const float *W[3])
{
    if (!bi_moe_merges(m))
        return false;
    for (int i = 0; i < 3; i++) {
        const float *merged = m->hook->moe_merged(m, l, i + 1);
        W[i] = merged ? merged : W[i];
    }
    return true;
}

void model_router_backward(struct model *m, int l, float *dx, const float *dy, const float *x, int N)
{
    float *dW = m->frozen ? NULL : m->grad->layers[l].router;
    k_linear_backward(m->K, dx, dW, NULL, dy, x, m->w.layers[l].router, N, m->cfg.hidden_size, m->cfg.n_experts);
    if (m->hook && m->hook->router_backward)
        m->hook->router_backward(m, l, dx, dy, x, N);
}

const struct kmoe_lora *model_expert_terms(const struct model *m, int l, size_t nk)
{
    return m->hook && m->hook->experts ? m->hook->experts(m, l, nk) : NULL;
}

void model_tp_sum(const struct model *m, float *buf, size_t n)
{
    if (m->sh.tp)
        comm_allreduce_sum(m->sh.tp, buf, n, COMM_F32);
}

void model_tp_sum_rowpar(const struct model *m, float *buf, size_t n)
{
    if (!m->sh.tp)
        return;
    const int tp = m->sh.tp_size;
    if (!k_batch_invariant() || m->K->device != KDEV_CPU || tp <= 2) { /* two ranks: a + b, either way the same */
        comm_allreduce_sum(m->sh.tp, buf, n, COMM_F32);
        return;
    }
    /* every rank's subtree, then the top of the tree in rank order, the same on every rank */
    float *all = xmalloc((size_t)tp * n * sizeof(float));
    comm_allgather(m->sh.tp, buf, all, n, COMM_F32);
    tree_sum(m->K, all, n, tp, n);
    k_copy(m->K, buf, all, n * sizeof(float));
    free(all);
}
