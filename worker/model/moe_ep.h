/* Expert parallelism: a mixture-of-experts layer whose experts are split over the EP group (struct model_shard's
 * ep, expert_lo, n_experts). Each rank routes its own tokens over every expert (the router is whole), sends each
 * routed slot's input to the rank holding its expert (dispatch, one all-to-all), runs its experts there as one GEMM
 * per expert, and sends the outputs back (combine, a second all-to-all), where they are weighted and summed as in
 * one process. The backward mirrors it: the outputs' gradients go out like the dispatch, the inputs' gradients
 * come back like the combine. The rows live in the model's context memory: host memory on the CPU, device memory
 * on a GPU (moved by the back-end's kernel ops, sent over NCCL, or through pinned host memory over MPI; tested
 * under the CUDA emulator, tests/cuemu, not yet run on a device). */
#ifndef GRPO_WORKER_MOE_EP_H
#define GRPO_WORKER_MOE_EP_H

#include "kernels/kernels.h"
#include "model.h"

/* What one layer's forward keeps for its backward: the slots this rank received and its experts' activations. */
struct moe_ep;

struct moe_ep *moe_ep_create(void);
void moe_ep_free(struct moe_ep *s);

/* out (N, D) = sum over each token's chosen experts of wt x expert(x), r routed over all E experts on this rank's
 * N tokens (r->xs, r->ys, r->pos its buffers: the slots' inputs sent and outputs received, in expert order), the
 * experts run on the ranks holding them, multiplying by W (this rank's experts' gate, up and down: L's, or in
 * batch-invariant mode the hook's merged, model_expert_weights). Collective over m->sh.ep. */
void moe_ep_forward(struct moe_ep *s, const struct model *m, const struct layer_params *L, const float *const W[3],
                    struct kmoe *r, const float *x, float *out);
/* Generation with the experts held whole over the TP group (struct model_shard's experts_over_tp): every TP rank
 * holds every token, so nothing is dispatched: this rank runs its experts on the slots routed to them (one GEMM per
 * expert, as above), and out (N, D) gets those slots' weighted sum, its part of the layer's output, which the TP
 * group sums after it as it sums experts split over their rows. No collective. */
void moe_tp_forward(struct moe_ep *s, const struct model *m, const float *const W[3], struct kmoe *r, const float *x,
                    float *out);
/* Its backward from dy (N, D): dx (N, D, zeroed by the caller) gets the experts' input gradient, dwt (N k) the
 * routing weights', G (NULL: none) this rank's experts' weight gradients, accumulated. scratch holds 2 N k D
 * floats. Collective over m->sh.ep. */
void moe_ep_backward(struct moe_ep *s, const struct model *m, const struct layer_params *L,
                     const struct layer_params *G, const struct kmoe *r, const float *dy, float *dx, float *dwt,
                     float *scratch);

#endif
