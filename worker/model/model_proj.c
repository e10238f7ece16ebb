/* The linear maps of a decoder layer: the base product y = x W^T + b of the shard's part of a projection's weight
 * (and a mixture of experts' router), its backward (no weight gradient while the base is frozen), and after each
 * the projection hook's term (struct model_hook: an adapter's, which the model knows nothing of); the hook's terms
 * on the experts; the TP group's sum of partial results. Every projection of the training forward and backward and
 * of the generation step goes through here. */
#include "model.h"

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

void model_proj_forward(const struct model *m, int l, enum proj_kind p, float *y, const float *x, int N)
{
    int din, dout;
    float *b;
    const float *W = proj_weight(&m->w.layers[l], p, &b);
    model_proj_dims(m, p, &din, &dout);
    k_linear_forward(m->K, y, x, W, b, N, din, dout);
    if (m->hook && m->hook->proj_forward)
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

void model_router_forward(const struct model *m, int l, float *y, const float *x, int N)
{
    k_linear_forward(m->K, y, x, m->w.layers[l].router, NULL, N, m->cfg.hidden_size, m->cfg.n_experts);
    if (m->hook && m->hook->router_forward)
        m->hook->router_forward(m, l, y, x, N);
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
