/* Inside the model: the expert block of a mixture-of-experts layer (model_moe.c). A layer hands it its normed
 * input and gets the experts' weighted output (a TP rank's part); whether the experts run here or over the EP group
 * (moe_ep.h) is the block's own business. */
#ifndef GRPO_WORKER_MODEL_MOE_H
#define GRPO_WORKER_MODEL_MOE_H

#include "kernels/kernels.h"
#include "model.h"
#include "model_internal.h"

struct moe_ep;

/* What a layer's expert block keeps from its forward for its backward. */
struct moe_acts {
    float *rlog;       /* (N, E) the router's logits */
    struct kmoe r;     /* the routing and the experts' activations */
    struct moe_ep *ep; /* expert parallelism: the slots this rank's experts ran; NULL without */
};

/* The block's backward buffers (the backward arena's). */
struct moe_grads {
    float *drlog, *dwt;   /* (N, E), (N, k) */
    float *moe_d, *moe_f; /* the experts' backward scratch (struct kmoe's bwd_d, bwd_f) */
};

/* The state of one layer's dispatch under expert parallelism, kept from batch to batch by an activation object. */
struct moe_ep *model_moe_state_new(void);
void model_moe_state_free(struct moe_ep *s);
/* s's buffers for N tokens, and the backward's, from an arena (in order: a counting arena plans). */
void model_moe_take(const struct model *m, int N, struct moe_acts *s, struct karena *ar);
void model_moe_grads_take(const struct model *m, int N, struct moe_grads *d, struct karena *ar);

/* Layer l's block forward over b's N tokens (x (N, D) normed): routed (by b->routes when the model replays them),
 * out (N, D) the sum over each token's chosen experts of its weight x expert(x); under TP this rank's part, which
 * the layer sums over the TP group. Counted for model_moe_stats by model_moe_count. */
void model_moe_forward(const struct model *m, int l, const struct packed_batch *b, struct moe_acts *s, const float *x,
                       float *out);
/* Its backward from dy (N, D): dx (N, D) gets dL/dx (summed over TP; the router's part added), the experts' and
 * the router's weight gradients accumulated unless the base is frozen, and the load-balancing loss's gradient with
 * them; Nf the whole batch's rows (sequence parallelism). */
void model_moe_backward(struct model *m, int l, int Nf, const struct moe_acts *s, const float *x, const float *dy,
                        float *dx, const struct moe_grads *d);
/* A generation step's expert block (worker/model/model_step.c), r routed: out (N, D) the sum over each token's
 * experts of its weight x expert(x), this rank's part under TP (its rows of every expert, or with the experts held
 * whole over TP its experts'). */
void model_moe_generate(struct model *m, const float *const W[3], struct kmoe *r, const float *x, float *out);
/* A layer's routing, counted for model_moe_stats: its tokens per expert and its load-balancing loss over the whole
 * micro-batch (summed over a sequence- or context-parallel group). */
void model_moe_count(struct model *m, int l, const struct kmoe *r);

#endif
