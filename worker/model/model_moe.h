/* Inside the model: the mixture-of-experts layers' routing as the training forward counts it (model_moe.c). */
#ifndef GRPO_WORKER_MODEL_MOE_H
#define GRPO_WORKER_MODEL_MOE_H

#include <stdint.h>

#include "kernels/kernels.h"
#include "model.h"
#include "model_internal.h"

/* Layer l's experts of every token of b (b->routes), as the route takes them: host (N, k). */
int32_t *model_moe_layer_routes(const struct model *m, int l, const struct packed_batch *b);
/* A layer's routing r over the whole micro-batch into g (2 E + 3): per expert the slots routed to it (g[e]) and
 * the sum of every token's router probability for it (g[E + e]), then the tokens (g[2 E]) and those whose own
 * top-k differed from the rollout's (g[2 E + 1], of g[2 E + 2]); summed over a sequence- or context-parallel group
 * (every rank calls it). */
void model_moe_group_routing(const struct model *m, const struct kmoe *r, double *g);
/* A layer's routing, counted for model_moe_stats. */
void model_moe_count(struct model *m, int l, const struct kmoe *r);

#endif
