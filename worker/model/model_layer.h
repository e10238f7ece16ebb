/* Inside the model: one decoder layer's training forward and backward (model_layer.c). */
#ifndef GRPO_WORKER_MODEL_LAYER_H
#define GRPO_WORKER_MODEL_LAYER_H

#include "model.h"
#include "model_acts.h"

/* Layer l forward over b (this rank's rows; Nf the whole batch's): a->x in, the output in out (N, D), a's other
 * activations filled. */
void model_layer_forward(const struct model *m, int l, const struct packed_batch *b, int Nf, struct layer_acts *a,
                         float *out);
/* Its backward: d->dx (N, D) holds dL/d(output) on entry and dL/d(input) on exit; the parameters' gradients
 * accumulated. */
void model_layer_backward(struct model *m, int l, const struct packed_batch *b, int Nf, const struct layer_acts *a,
                          const struct bwd_bufs *d);

#endif
