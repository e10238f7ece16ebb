/* Inside the model, for its own files: the parameter layout of any shard (model_params.c, read by shard.c and
 * lora.c), the TP group's sum, and what a model keeps from batch to batch (struct model_work). */
#ifndef GRPO_WORKER_MODEL_INTERNAL_H
#define GRPO_WORKER_MODEL_INTERNAL_H

#include "kernels/kernels.h"
#include "model.h"

/* The shard of TP rank r of tp at pipeline stage s of pp (sizes, no group). */
struct model_shard model_shard_of(const struct model_config *c, int r, int tp, int s, int pp);
/* Shard sh (whole layers) as EP rank r of ep: its experts. */
void model_shard_set_ep(struct model_shard *sh, const struct model_config *c, int r, int ep);
/* Shard sh (TP rank of tp_size) with its experts held whole over the TP group: E / TP of them, unsplit. */
void model_shard_set_experts_over_tp(struct model_shard *sh, const struct model_config *c);
/* The shard of rank r of m's model-copy group (mp): TP rank r % TP, EP rank (r / TP) % EP of stage r / (TP x EP). */
struct model_shard model_shard_of_mp(const struct model *m, int r);
/* model_param_refs of shard sh laid out over mem (NULL: only count; mem holds the shard's n_floats). */
int model_refs_over(const struct model_config *c, const struct model_shard *sh, float *mem, struct param_ref *refs,
                    int max);

/* The input and output sizes of projection p on shard sh (its rows of column-parallel q/k/v/gate/up, its columns
 * of row-parallel o/down). */
void model_shard_proj_dims(const struct model_config *c, const struct model_shard *sh, enum proj_kind p, int *din,
                           int *dout);
/* The whole tensor named like part among w[0..nw) (refs in layout order: the search starts at *hint, which moves
 * past the match); a missing one is a failed check. */
const struct param_ref *model_whole_ref(const struct param_ref *w, int nw, const struct param_ref *part, int *hint);
/* Copy between a part p (its data at part) and its place in the whole tensor at whole (laid out full[0] x
 * full[1]), both in K's memory: into the whole when to_whole, else out of it. */
void model_part_copy(struct kctx *K, const struct param_ref *p, float *part, float *whole, bool to_whole);

/* Parameter floats of shard sh. */
size_t model_shard_floats(const struct model_config *c, const struct model_shard *sh);
/* Parameters of shard sh laid out in a new zeroed allocation of K's memory of kind (weights or gradients), and
 * freed. */
void model_params_alloc(struct kctx *K, enum kmem_kind kind, const struct model_config *c, const struct model_shard *sh,
                        struct model_params *p);
void model_params_free(struct kctx *K, enum kmem_kind kind, struct model_params *p);

/* Sum a partial result over the TP group, in place (the row-parallel outputs, the column-parallel input
 * gradients, the vocab-parallel embedding); nothing without TP. */
void model_tp_sum(const struct model *m, float *buf, size_t n);
/* The TP sum after a row-parallel projection (o_proj, down_proj, the experts): in batch-invariant mode the ranks'
 * partials in the fixed tree of model_proj_forward's groups, else model_tp_sum. */
void model_tp_sum_rowpar(const struct model *m, float *buf, size_t n);
/* A mixture of experts' struct kmoe bi_groups for this rank's experts: in batch-invariant mode on the CPU the fixed
 * groups of moe_intermediate_size (as o_proj's and down_proj's) over the TP size, else 0. */
int model_bi_expert_groups(const struct model *m);

/* Before a backward: the gradients it accumulates into made where they are not yet, the base's (unless frozen)
 * and the hook's. */
void model_backward_grads(struct model *m);

/* The arena of model_step's buffers, and a host buffer of at least bytes for its inputs (both kept from step to
 * step). */
struct karena *model_step_arena(struct model *m);
void *model_host_inputs(struct model *m, size_t bytes);

/* A decode step recorded as a graph (k_graph_begin; model_step.c), launched again while the step's shape, the
 * arena it was recorded over and the context's memory (k_graph_epoch) are what they were then. g NULL: that step
 * could not be recorded, and runs eagerly. */
struct step_graph {
    struct kgraph *g;
    int B, rows;
    const void *base;
    uint64_t epoch;
    unsigned long long used; /* the decode step it was last launched at: the least recent is replaced */
};
enum { STEP_GRAPHS = 8 };
/* The graphs kept freed (model_work_free, model_release_buffers' MODEL_BUF_GEN). */
void model_step_graphs_free(struct model *m);

/* What a model keeps from batch to batch: the pool of activation objects, the backward arena, the generation
 * step's arena, a host buffer of its inputs and its graphs. */
struct model_work {
    struct model_acts *pool;
    struct karena bwd, step;
    struct karena sp;       /* sequence parallelism: the all-to-all's staging buffer */
    struct karena sph;      /* its host staging, on a GPU whose SP group has no device memory (MPI) */
    struct ring_attn *ring; /* context parallelism: the ring of the batch the layers run now */
    const int32_t *cprow;   /* and the batch row of each of its rows (-1: the ring's padding) */
    void *hin;              /* model_host_inputs */
    size_t hin_cap;
    struct step_graph graphs[STEP_GRAPHS];
    struct step_graph warm;     /* the last eager decode step's shape (its g NULL): the next of that shape records */
    unsigned long long decodes; /* decode steps taken */
    unsigned told;              /* the reasons for eager decode steps logged already (one bit each) */
    struct moe_ep *moe_tp;      /* experts held whole over TP: the decode step's local run (model_moe_generate) */
};

/* m's work, made on first use (model_acts.c), and freed with everything it holds. */
struct model_work *model_work_of(struct model *m);
void model_work_free(struct model *m);

/* n floats (at least one) of an arena. */
static inline float *take_f(struct karena *ar, size_t n) { return karena_take(ar, (n ? n : 1) * sizeof(float)); }

#endif
