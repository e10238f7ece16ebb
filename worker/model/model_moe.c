/* The expert block of a mixture-of-experts layer in the training forward and backward: the router (with the
 * projection hook's term), the routing (its own top-k, or the rollout's replayed), the experts run here or, under
 * expert parallelism, on the ranks holding them (moe_ep.h: the layer above never sees the dispatch), and the
 * load-balancing loss's gradient; each layer's tokens per expert and load-balancing loss counted over the whole
 * micro-batch (summed over a sequence- or context-parallel group, the ring's padding left out), and the
 * statistics the trainer reads. */
#include "model_moe.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "moe_ep.h"
#include "worker/comm/comm.h"

struct moe_ep *model_moe_state_new(void) { return moe_ep_create(); }

void model_moe_state_free(struct moe_ep *s) { moe_ep_free(s); }

/* The routing of N tokens through m's experts (no buffers yet). */
static struct kmoe moe_shape(const struct model *m, int N)
{
    const struct model_config *c = &m->cfg;
    return (struct kmoe){.N = N,
                         .E = c->n_experts,
                         .k = c->n_experts_per_tok,
                         .D = c->hidden_size,
                         .F = m->sh.moe_inter,
                         .norm_topk = c->norm_topk_prob};
}

void model_moe_take(const struct model *m, int N, struct moe_acts *s, struct karena *ar)
{
    const size_t n = (size_t)(N > 0 ? N : 1);
    s->rlog = take_f(ar, n * (size_t)m->cfg.n_experts);
    s->r = moe_shape(m, N);
    kmoe_take(ar, &s->r, false);
}

void model_moe_grads_take(const struct model *m, int N, struct moe_grads *d, struct karena *ar)
{
    const struct model_config *c = &m->cfg;
    const size_t n = (size_t)(N > 0 ? N : 1), D = (size_t)c->hidden_size;
    const size_t nk = n * (size_t)c->n_experts_per_tok;
    d->drlog = take_f(ar, n * (size_t)c->n_experts);
    d->dwt = take_f(ar, nk);
    d->moe_d = take_f(ar, 2 * nk * D);
    d->moe_f = take_f(ar, 3 * nk * (size_t)c->moe_intermediate);
}

/* Layer l's experts of every token of b (b->routes), as the route takes them: host (N, k). */
static int32_t *moe_layer_routes(const struct model *m, int l, const struct packed_batch *b)
{
    const int k = m->cfg.n_experts_per_tok, L = m->cfg.n_layers;
    int32_t *ref = xmalloc((size_t)(b->N > 0 ? b->N : 1) * k * sizeof *ref);
    for (int t = 0; t < b->N; t++)
        for (int j = 0; j < k; j++)
            ref[(size_t)t * k + j] = b->routes[((size_t)t * L + l) * k + j];
    return ref;
}

/* A layer's routing r over the whole micro-batch into g (2 E + 3): per expert the slots routed to it (g[e]) and
 * the sum of every token's router probability for it (g[E + e]), then the tokens (g[2 E]) and those whose own
 * top-k differed from the rollout's (g[2 E + 1], of g[2 E + 2]). Under sequence or context parallelism each rank
 * of the group holds a slice of the tokens: summed over the group (every rank calls it), the ring's padding rows
 * (context parallelism, model_work.cprow -1) left out, so that every rank has the whole model's figures. */
static void moe_group_routing(const struct model *m, const struct kmoe *r, double *g)
{
    const int E = r->E, k = r->k, N = r->N;
    const int32_t *rowof = m->sh.ring ? m->work->cprow : NULL;
    if (!rowof) {
        int32_t offs[E + 1];
        float pmean[E];
        k_to_host(m->K, offs, r->offs, sizeof offs);
        k_to_host(m->K, pmean, r->pmean, sizeof pmean);
        for (int e = 0; e < E; e++)
            g[e] = offs[e + 1] - offs[e], g[E + e] = (double)pmean[e] * N;
        g[2 * E] = N, g[2 * E + 1] = r->n_differ, g[2 * E + 2] = r->n_compared;
    } else { /* the real rows' routing (idx, replayed or not) and probabilities; the padding's top-k against the
              * first k experts it was given to replay (model_forward_stage) taken back out of the differing */
        int32_t *idx = xmalloc((size_t)(N > 0 ? N : 1) * k * sizeof *idx);
        float *p = xmalloc((size_t)(N > 0 ? N : 1) * E * sizeof *p);
        k_to_host(m->K, idx, r->idx, (size_t)N * k * sizeof *idx);
        k_to_host(m->K, p, r->probs, (size_t)N * E * sizeof *p);
        int32_t *id = xmalloc((size_t)(k > 0 ? k : 1) * sizeof *id); /* a padding row's top k */
        memset(g, 0, (2 * (size_t)E + 3) * sizeof *g);
        int pad = 0, pad_differ = 0;
        for (int t = 0; t < N; t++) {
            const float *pt = p + (size_t)t * E;
            if (rowof[t] < 0) {
                pad++;
                if (r->n_compared > 0) { /* compared with the rollout's: the kernel's top-k: the larger first, a tie to
                                            the lower expert */
                    kmoe_topk(pt, E, k, id);
                    bool same = true;
                    for (int j = 0; j < k; j++)
                        same &= id[j] < k;
                    pad_differ += !same;
                }
                continue;
            }
            for (int j = 0; j < k; j++)
                g[idx[(size_t)t * k + j]]++;
            for (int e = 0; e < E; e++)
                g[E + e] += pt[e];
            g[2 * E]++;
        }
        g[2 * E + 1] = r->n_differ - pad_differ;
        g[2 * E + 2] = r->n_compared > 0 ? r->n_compared - pad : 0;
        free(idx), free(p), free(id);
    }
    if (m->sh.sp)
        comm_allreduce_sum(m->sh.sp, g, 2 * (size_t)E + 3, COMM_F64);
}

void model_moe_generate(struct model *m, const float *const W[3], struct kmoe *r, const float *x, float *out)
{
    if (!m->sh.experts_over_tp) {
        k_moe_experts_forward(m->K, out, x, W[0], W[1], W[2], r);
        return;
    }
    struct model_work *w = model_work_of(m);
    if (!w->moe_tp)
        w->moe_tp = moe_ep_create();
    moe_tp_forward(w->moe_tp, m, W, r, x, out);
}

void model_moe_forward(const struct model *m, int l, const struct packed_batch *b, struct moe_acts *s, const float *x,
                       float *out)
{
    if (m->sh.experts_over_tp)
        check_failf(__FILE__, __LINE__, "experts held whole over TP generate only (model_step); this model trains");
    const struct model_config *c = &m->cfg;
    const struct layer_params *L = &m->w.layers[l];
    struct kctx *K = m->K;
    const int N = b->N;
    model_router_forward(m, l, s->rlog, x, N);
    int32_t *ref = b->routes ? moe_layer_routes(m, l, b) : NULL;
    s->r.ref = ref;
    s->r.replay = ref && m->moe_replay;
    k_moe_route(K, &s->r, s->rlog);
    s->r.ref = NULL;
    free(ref);
    const float *W[3] = {L->w_gate, L->w_up, L->w_down};
    const bool merged = model_expert_weights(m, l, W); /* batch-invariant mode: the hook's terms in W */
    s->r.lora = merged ? NULL : model_expert_terms(m, l, (size_t)N * c->n_experts_per_tok); /* the hook's, or NULL */
    s->r.bi_groups = model_bi_expert_groups(m); /* under expert parallelism sent back group by group */
    if (m->sh.ep)                               /* the experts on the ranks holding them */
        moe_ep_forward(s->ep, m, L, W, &s->r, x, out);
    else
        k_moe_experts_forward(K, out, x, W[0], W[1], W[2], &s->r);
}

void model_moe_backward(struct model *m, int l, int Nf, const struct moe_acts *s, const float *x, const float *dy,
                        float *dx, const struct moe_grads *d)
{
    const struct layer_params *L = &m->w.layers[l];
    const struct layer_params *G = m->frozen ? NULL : &m->grad->layers[l];
    struct kctx *K = m->K;
    const int N = s->r.N;
    const size_t nD = (size_t)N * m->cfg.hidden_size;
    struct kmoe r = s->r;
    r.bwd_d = d->moe_d, r.bwd_f = d->moe_f;
    r.lora = model_expert_terms(m, l, (size_t)N * r.k);
    const int E = r.E;
    k_zero(K, dx, nD * sizeof(float));
    if (m->sh.ep)
        moe_ep_backward(s->ep, m, L, G, &r, dy, dx, d->dwt, d->moe_d);
    else
        k_moe_experts_backward(K, dx, G ? G->w_gate : NULL, G ? G->w_up : NULL, G ? G->w_down : NULL, d->dwt, dy,
                               L->w_gate, L->w_up, L->w_down, &r);
    /* under TP the experts' input gradient and the routing weights' (dy . the expert's output) are each rank's
     * part: summed, the router's backward below runs the same on every TP rank (its weight gradient the same on
     * each, counted once), and its part of dx is added after the sum, not TP times */
    model_tp_sum(m, dx, nD);
    model_tp_sum(m, d->dwt, (size_t)N * r.k);
    /* the load-balancing loss coef scale E / k sum_e pmean_e count_e / N: d/dp[t][e] = coef scale E count_e /
     * (k N^2) for every token t; under sequence or context parallelism count_e and N the whole micro-batch's
     * (summed over the group: every rank of it takes part, one with no token too) */
    float dp_col[E];
    const bool aux = m->moe_aux_coef != 0 && (m->sh.sp ? Nf > 0 : N > 0);
    if (aux) {
        double g[2 * E + 3];
        moe_group_routing(m, &r, g);
        const double n = g[2 * E];
        for (int e = 0; e < E; e++)
            dp_col[e] =
                n > 0 ? (float)((double)m->moe_aux_coef * m->moe_aux_scale * E * g[e] / ((double)r.k * n * n)) : 0.0f;
    }
    k_moe_route_backward(K, d->drlog, &r, d->dwt, aux ? dp_col : NULL);
    if (m->sh.ring) /* context parallelism: the ring's padding rows feed no loss, the load-balancing one either */
        for (int t = 0; t < N; t++)
            if (m->work->cprow[t] < 0)
                k_zero(K, d->drlog + (size_t)t * E, (size_t)E * sizeof(float));
    model_router_backward(m, l, dx, d->drlog, x, N);
}

/* A layer's routing, counted for model_moe_stats: its tokens per expert and its load-balancing loss, over the whole
 * micro-batch (under sequence or context parallelism every rank of the group counts the same, the group's). */
void model_moe_count(struct model *m, int l, const struct kmoe *r)
{
    const int E = r->E;
    if (!m->moe_tokens)
        m->moe_tokens = xcalloc((size_t)m->cfg.n_layers * E, sizeof *m->moe_tokens);
    double g[2 * E + 3];
    moe_group_routing(m, r, g);
    const double n = g[2 * E];
    double aux = 0;
    for (int e = 0; e < E; e++) {
        m->moe_tokens[(size_t)l * E + e] += g[e];
        aux += (n ? g[E + e] / n : 0) * g[e];
    }
    m->moe_aux_sum += n ? aux * E / ((double)r->k * n) : 0;
    m->moe_aux_n++;
    m->moe_route_differ += g[2 * E + 1];
    m->moe_route_compared += g[2 * E + 2];
}

void model_moe_route_stats(struct model *m, double *differ, double *compared)
{
    *differ = m->moe_route_differ;
    *compared = m->moe_route_compared;
    m->moe_route_differ = m->moe_route_compared = 0;
}

int model_moe_stats(struct model *m, double *tokens, double *aux_mean)
{
    const int n = m->moe_aux_n, E = m->cfg.n_experts;
    if (tokens && E) {
        for (size_t i = 0; i < (size_t)m->cfg.n_layers * E; i++)
            tokens[i] = m->moe_tokens ? m->moe_tokens[i] : 0;
    }
    if (aux_mean)
        *aux_mean = n ? m->moe_aux_sum / n : 0;
    if (m->moe_tokens)
        memset(m->moe_tokens, 0, (size_t)m->cfg.n_layers * E * sizeof *m->moe_tokens);
    m->moe_aux_sum = 0;
    m->moe_aux_n = 0;
    return n;
}
