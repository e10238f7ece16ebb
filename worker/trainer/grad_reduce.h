/* Data parallelism's gradient sum overlapped with the backward (Megatron's overlap_grad_reduce).
 *
 * The layers' gradients are grouped, from the top layer down, into buckets of whole layers holding at least
 * bucket_size parameters. During the backward of a mini-batch's last micro-batch (when the gradients are final), a
 * bucket's all-reduce starts as soon as the backward has passed its lowest layer, and runs while the layers below
 * are computed. After the backward the rest (the embedding, the final norm, the head) is summed and everything is
 * waited for. The sums are those of one all-reduce over the whole gradient, element by element, so the update is
 * the same. Every DP rank starts the same buckets in the same order, including a rank with nothing to compute in
 * a mini-batch (it starts them all after its empty backward). */
#ifndef GRPO_WORKER_TRAINER_GRAD_REDUCE_H
#define GRPO_WORKER_TRAINER_GRAD_REDUCE_H

#include <stddef.h>

#include "worker/comm/comm.h"
#include "worker/model/model.h"

struct grad_reducer;

/* Buckets over m's layers (whole models: no TP or PP, no LoRA) summed over c (gradients in m's memory: an NCCL
 * group's for a GPU's). bucket_size 0: Megatron's default, max(40e6, 1e6 x DP). */
struct grad_reducer *grad_reducer_create(struct model *m, struct comm *c, size_t bucket_size);
/* Before the backward of the mini-batch's last micro-batch: its layers start their buckets as they finish. */
void grad_reducer_arm(struct grad_reducer *r);
/* After the mini-batch's backward: the buckets not started yet and the rest, then the wait for all of them. */
void grad_reducer_finish(struct grad_reducer *r);
int grad_reducer_buckets(const struct grad_reducer *r);
/* The largest bucket, in parameters. */
size_t grad_reducer_largest(const struct grad_reducer *r);
void grad_reducer_free(struct grad_reducer *r);

#endif
