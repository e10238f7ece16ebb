/* ZeRO-1 over the trainers' DP group (actor_rollout_ref.actor.megatron.use_distributed_optimizer): each DP
 * rank keeps the AdamW state of one contiguous block of the parameters. An optimizer step reduce-scatters the
 * gradients (each rank gets the sum of its block), clips by the global norm (the blocks' sums of squares
 * all-reduced), updates its block, and all-gathers the blocks into every rank's parameters. The result is the
 * data-parallel all-reduce's up to summation order, with 1/DP of the optimizer state per rank.
 *
 * Checkpoints stay layout-free: the moments are gathered whole for DP rank 0 to write, and a rank takes its
 * block of them when it resumes, whatever the DP size that wrote them.
 *
 * The buffers are the policy's context's memory (a GPU's with trainer.device=cuda, where the DP group is its NCCL
 * twin: the reduce-scatter and the all-gather run in device memory); the gathered checkpoint state is host
 * memory.
 *
 * With expert parallelism (zero1_create_ep) the parameters are two classes: the dense ones (every DP rank holds
 * them, their gradients sum over DP) and this rank's experts (their gradients sum over edp, the ranks holding the
 * same experts). Each class is packed (its spans of the parameter buffer back to back) and sharded over its own
 * group: a rank keeps a block of the dense parameters (1/DP of them) and a block of its experts (1/EDP), its AdamW
 * state the two blocks back to back; the norm counts every parameter once (with TP, what every TP rank holds whole
 * on one of them). A LoRA adapter under EP is split the same way: its experts' adapters the second class. */
#ifndef GRPO_WORKER_TRAINER_ZERO1_H
#define GRPO_WORKER_TRAINER_ZERO1_H

#include <stddef.h>

#include "optim.h"
#include "worker/comm/comm.h"
#include "worker/model/model.h"

struct zero1 {
    struct kctx *K; /* where grad, pad, the block of AdamW's state and the parameters live */
    struct comm *dp;
    size_t n;      /* all parameters */
    size_t per;    /* block per rank: ceil(n / DP) */
    size_t lo, hi; /* this rank's block [lo, hi) */
    float *grad;   /* per floats: this rank's block of the summed gradient */
    float *pad;    /* per * DP floats when DP does not divide n (NULL otherwise) */
    /* expert parallelism (zero1_create_ep; else ep NULL): lo, hi, per and pad unused */
    struct zero1_ep *ep;
};

struct zero1 *zero1_create(struct kctx *K, struct comm *dp, size_t n);
/* ZeRO-1 under expert parallelism: m's dense parameters sharded over dp, its experts (model_expert_span) over edp
 * (NULL: a group of one, each rank keeps all of its experts' state), in K's memory (on a GPU, dp and edp NCCL twins:
 * the packed classes are device memory; the state is sharded from and gathered to host memory). With PP each stage
 * shards its own parameters (the norm summed over the stages, a tied embedding's copy counted once). */
struct zero1 *zero1_create_ep(struct kctx *K, struct comm *dp, struct comm *edp, const struct model *m);
/* The floats of this rank's block(s): its AdamW state's size. */
size_t zero1_block_floats(const struct zero1 *z);
void zero1_free(struct zero1 *z);
/* The gradients grads[0..n) summed over DP: this rank's block into z->grad. */
void zero1_reduce_scatter(struct zero1 *z, const float *grads);
/* The global gradient norm (over every block, and over m's TP x PP group: each parameter counted once); the block is
 * clipped to max_norm as grad_clip does. */
double zero1_clip(struct zero1 *z, double max_norm, const struct model *m);
/* Every rank's block of params into params[0..n) (after each updated its own). */
void zero1_allgather(struct zero1 *z, float *params);
/* One AdamW step of this rank's block(s) of params[0..n) by z->grad, then zero1_allgather. */
void zero1_step(struct zero1 *z, struct adamw *opt, float *params, double lr);
/* This rank's block of a whole optimizer state (a new adamw over zero1_block_floats parameters, in z->K's memory; whole
 * may be there or in host memory). */
struct adamw *zero1_shard(const struct zero1 *z, const struct adamw *whole);
/* The whole optimizer state from every rank's block (a new adamw over n in host memory; every rank calls it). */
struct adamw *zero1_gather(struct zero1 *z, const struct adamw *block);

#endif
