/* The mixture-of-experts layers' routing as the training forward counts it: the rollout's recorded experts for
 * a replay, each layer's tokens per expert and load-balancing loss over the whole micro-batch (summed over a
 * sequence- or context-parallel group, the ring's padding left out), and the statistics the trainer reads. */
#include "model_moe.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "worker/comm/comm.h"

/* Layer l's experts of every token of b (b->routes), as the route takes them: host (N, k). */
int32_t *model_moe_layer_routes(const struct model *m, int l, const struct packed_batch *b)
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
void model_moe_group_routing(const struct model *m, const struct kmoe *r, double *g)
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

/* A layer's routing, counted for model_moe_stats: its tokens per expert and its load-balancing loss, over the whole
 * micro-batch (under sequence or context parallelism every rank of the group counts the same, the group's). */
void model_moe_count(struct model *m, int l, const struct kmoe *r)
{
    const int E = r->E;
    if (!m->moe_tokens)
        m->moe_tokens = xcalloc((size_t)m->cfg.n_layers * E, sizeof *m->moe_tokens);
    double g[2 * E + 3];
    model_moe_group_routing(m, r, g);
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
