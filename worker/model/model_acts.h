/* Inside the model: the activations a training forward keeps for its backward and the backward's buffers
 * (model_acts.c), read by the layers (model_layer.c) and the stage's forward and backward (model_train.c). */
#ifndef GRPO_WORKER_MODEL_ACTS_H
#define GRPO_WORKER_MODEL_ACTS_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "model.h"
#include "model_internal.h"
#include "model_moe.h"

/* Largest logits buffer a forward keeps for its backward (PyTorch keeps all of them); above it the backward
 * recomputes the head's product chunk by chunk. 1024 rows of a 49152-token vocabulary: 201 MB. */
#define LMHEAD_KEEP_BYTES ((size_t)256 << 20)

/* Activations of one layer (all (N, .) row-major). */
struct layer_acts {
    float *x;                               /* (N, D) layer input (kept even with checkpointing) */
    float *xn1, *rstd1;                     /* (N, D), (N) */
    float *q, *k, *v;                       /* (N, QD), (N, KD), (N, KD), after RoPE for q and k */
    float *q_pre, *k_pre, *rstd_q, *rstd_k; /* Qwen3: q and k before their norms, and the norms' rstd */
    float *att, *lse;                       /* (N, QD), (N, Hq) */
    float *xmid;                            /* (N, D) after the attention residual */
    float *xn2, *rstd2;
    float *g, *u, *a;    /* (N, F) gate, up, silu(gate)*up */
    struct moe_acts moe; /* mixture of experts: the router's logits, the routing, the experts' activations */
    /* sequence parallelism: every token's q, k, v and attention output for this rank's heads, (Nf, hq hd) and
     * (Nf, hk hd); lse is then (Nf, hq) */
    float *qf, *kf, *vf, *attf;
};

/* The saved activations of one forward: every buffer is taken from the object's arena, in the order of
 * acts_take, so a batch of a shape seen before allocates nothing. Released objects wait in the model's pool. */
struct model_acts {
    struct model *m;
    struct packed_batch b;
    int32_t *ids, *targets, *pos, *cu; /* the batch, in the context's memory */
    float temperature;
    bool ckpt;
    int t0, Nf; /* sequence parallelism: this rank's rows start at t0 of the whole batch's Nf (0, N without) */
    struct ring_attn *ra;      /* context parallelism: this batch's ring; else NULL */
    int32_t *cprow;            /* context parallelism: the batch row of each of this rank's rows (-1: padding) */
    struct layer_acts *layers; /* n_layers; with ckpt only .x is filled */
    struct layer_acts scratch; /* ckpt: recomputation space */
    struct moe_ep **ep;        /* expert parallelism: n_layers + 1 dispatch states (the last the scratch's) */
    bool offload;              /* ckpt with m->offload_acts: layers[l].x are host_arena's, xdev the device's */
    struct karena host_arena;  /* offloaded layer inputs */
    float *xdev[2];            /* offload: the device's layer input and output (N, D), in turn */
    float *xf, *hn, *rstdf;    /* final residual, normed (N, D), (N) */
    float *logp, *entropy;     /* (N), or (nk) with kept rows: the last stage's outputs */
    /* the LM head on the rows a caller reads (packed_batch.logp_from): nk of them (-1: every row) */
    int nk;
    int32_t *krange; /* host (2B): each sequence's kept rows [krange[2b], krange[2b + 1]) */
    int krange_cap;  /* of krange, in sequences */
    int32_t *prefix; /* host (B): packed_batch.prefix_of's copy, NULL without one */
    int prefix_cap;
    uint16_t *routes; /* host (N, n_layers x k): packed_batch.routes' copy, NULL without one */
    size_t routes_cap;
    float *hk;    /* (nk, D) the kept rows' normed states */
    float *zkeep; /* (head rows, this shard's vocabulary): the head's logits for its backward (vocab_shard.keep) */
    int32_t *tk;  /* (nk) their targets */
    void *hbuf;   /* host (nk 4-byte cells): gathers and scatters of per-row values */
    size_t hbuf_cap;
    struct karena arena;
    struct model_acts *next; /* in the pool */
};

/* Buffers of one backward (the model's backward arena, taken again for every batch). */
struct bwd_bufs {
    float *dx, *dh, *scratch_out;   /* (N, D) */
    float *da, *dg, *du;            /* (N, F) */
    float *dxn;                     /* (N, D) */
    float *datt, *dq, *dk, *dv;     /* (N, QD), (N, QD), (N, KD), (N, KD) */
    float *dq_pre, *dk_pre;         /* Qwen3 */
    float *dlogp, *dentropy;        /* (N) */
    float *dhk;                     /* (nk, D) the kept rows' dL/dh (logp_from) */
    float *dattf, *dqf, *dkf, *dvf; /* sequence parallelism: as layer_acts' qf ... */
    struct moe_grads moe;           /* mixture of experts: the expert block's */
};

/* An activation object for N tokens (this rank's) of B sequences, from m's pool, its arena grown when the plan
 * needs it: every layer's activations (with ckpt only the layer inputs, and one layer's recomputation space), the
 * head's nk kept rows (-1: every row); t0 and Nf: this rank's first row and the whole batch's rows (sequence
 * parallelism; 0 and N without). */
struct model_acts *model_acts_get(struct model *m, int N, int B, bool ckpt, int nk, int t0, int Nf);
/* The backward's buffers for N tokens (Nf and nk as model_acts_get's) from ar, in order (a counting arena plans). */
void model_bwd_take(const struct model *m, int N, int Nf, int nk, struct bwd_bufs *d, bool ckpt, struct karena *ar);

#endif
