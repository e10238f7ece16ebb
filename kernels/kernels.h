/* The kernel interface: every op the model, the optimizer and generation run, behind a context that says where
 * they run (the CPU, or a CUDA device with its stream and library handles). The back-ends implement one table of
 * ops each: kernels/cpu/ (the reference, fp32 or BF16 GEMMs) and kernels/cuda/ (cuBLAS and our kernels). Callers
 * never branch on the back-end; the pointers they pass are the context's memory (k_alloc), host memory for the
 * CPU and device memory for CUDA.
 *
 * Shapes and semantics of each op are those of the CPU kernels (kernels/cpu/cpu_kernels.h): backward ops
 * ACCUMULATE (+=) into gradients. Scalars and the small index arrays (ids, positions, sequence offsets) are
 * context memory too; host-side reductions (struct vocab_shard) are called with host buffers.
 *
 * This header includes no back-end: each back-end registers itself (struct kbackend, listed by the build in
 * kbackends[]), and the host's helpers that run beside the ops (threads, the host's products, sampling a row) are
 * the host back-end's registered table (struct khost, the khost_* calls below). */
#ifndef GRPO_KERNELS_H
#define GRPO_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kdevice { KDEV_CPU, KDEV_CUDA };
/* Precision of the matrix products: fp32, or BF16 inputs with fp32 accumulation (weights and activations kept in
 * fp32, rounded to BF16 for the product: mixed precision with fp32 master weights). */
enum kmatmul { KMM_F32, KMM_BF16 };

struct kctx;

/* A vocabulary shard: rows [lo, hi) of a V-row table (vocab-parallel embedding and LM head under tensor
 * parallelism). reduce(ud, buf, n, max) combines n doubles in place over every shard of the vocabulary: their
 * maximum (max true) or their sum. The whole vocabulary is lo 0, hi V, reduce NULL. */
struct vocab_shard {
    int lo, hi, V;
    void (*reduce)(void *ud, double *buf, int n, bool max);
    void *ud;
    /* NULL, or (N, hi - lo) floats (CPU): the LM head's forward leaves its scaled logits there, and the backward
     * over the same rows turns them into its logit gradients in place instead of recomputing the product (one
     * GEMM of four); one backward per forward */
    float *keep;
    /* the forward's entropy output gets sum_j p_j^2 (the sum of the squared probabilities over the vocabulary,
     * verl's sum_pi_squared) instead of the entropy; the backward takes no dentropy then */
    bool sum_pi_sq;
    /* batch-invariant mode under TP (NULL: none): gather's all (shards x n) gets every rank's n floats of mine, in
     * rank order; shard r holds rows [V r / shards, V (r + 1) / shards) */
    void (*gather)(void *ud, const float *mine, float *all, size_t n);
    int shards;
};

/* Mixture-of-experts routing and expert buffers of one layer for N tokens, E experts, k of them per token, hidden D,
 * expert intermediate F. Every array is the context's memory (kmoe_take fills them from an arena) unless said. */
struct kmoe {
    int N, E, k, D, F;
    bool norm_topk;   /* the k chosen probabilities renormalised to sum to 1 (Mixtral; Qwen3-MoE's norm_topk_prob) */
    float *probs;     /* (N, E) softmax of the router's logits over every expert */
    float *pmean;     /* (E) probs averaged over the tokens (the load-balancing loss reads it) */
    int32_t *idx;     /* (N, k) each token's experts, the most probable first */
    float *wt;        /* (N, k) their weights */
    int32_t *order;   /* (N k) the slots t k + j sorted by expert, stably: expert e's are [offs[e], offs[e + 1]) */
    int32_t *offs;    /* (E + 1) */
    int32_t *pos;     /* (N k) slot -> its row in the permuted buffers */
    float *xs, *ys;   /* (N k, D) the slots' inputs and their expert's outputs, in expert order */
    float *g, *u, *a; /* (N k, F) gate, up and silu(gate) up of each slot, in expert order */
    float *bwd_d;     /* (2 N k, D) backward scratch (kmoe_take with bwd) */
    float *bwd_f;     /* (3 N k, F) */
    /* routing replay: ref (host memory, (N, k), or NULL) holds experts chosen elsewhere for each token (the rollout's
     * choice); the route counts the tokens whose own top-k set differs from ref's (n_differ, of n_compared), and with
     * replay routes each token to ref's experts instead (their weights still the router's probabilities) */
    const int32_t *ref;
    bool replay;
    int n_differ, n_compared;
    /* LoRA on the experts (NULL: none; the CPU back-end only): each expert's token group also runs its own
     * low-rank path, struct kmoe_lora */
    const struct kmoe_lora *lora;
    /* batch-invariant mode (docs/training.md; the CPU back-end): 0 or 1, off; g > 1, the down projections' F
     * columns cut into g fixed groups, each group's product a partial of its own (group 0 in ys, the others in
     * ys_groups, (g - 1) N k D floats the back-end provides), each group's partials combined over a token's slots
     * alone and the g results summed in a fixed pairwise tree, as the row-parallel projections' groups
     * (worker/model/model_proj.c): a TP rank's g groups are a subtree of the whole model's, so the TP ranks' sum
     * has the same bits whatever the TP size. ys then holds the groups' tree for the backward.
     * bi_apart (expert parallelism's run of a rank's experts, whose groups go back to the tokens' ranks): the
     * experts' op leaves the groups apart, y holding bi_groups (N, D) blocks, group j's results at y + j N D, no
     * tree (ys still the tree). The combine op (moe_combine) with bi_groups > 1 combines group 0 from ys (r->ys)
     * and the others from ys_groups, (g - 1) (N k D + N D) floats the caller provides then, as the experts' op. */
    int bi_groups;
    bool bi_apart;
    float *ys_groups;
};

/* The experts' LoRA adapters of one layer over r's E experts, in PEFT's layout of transformers' fused experts (its
 * target_parameters): A (E R, Din), expert e's rows e R .. e R + R - 1; B (Dout, R E), expert e's (o, j) at column
 * j E + e. Gate and up share one adapter (gate_up_proj: Dout 2F, gate rows first): t = xs Agu_e^T (n, Rgu), then
 * gate += s t Bgu_e[:F]^T and up += s t Bgu_e[F:]^T; down: ys += s (a Ad_e^T) Bd_e^T. NULL: that projection has none.
 * The g* gradients (same layouts; NULL: none wanted) accumulate. */
struct kmoe_lora {
    const float *Agu, *Bgu; /* (E Rgu, D), (2F, Rgu E) */
    const float *Ad, *Bd;   /* (E Rd, F), (D, Rd E) */
    float *gAgu, *gBgu, *gAd, *gBd;
    int Rgu, Rd;
    float scale;
    float *tmp; /* scratch of kmoe_lora_scratch floats */
};

/* The floats of struct kmoe_lora's scratch for N k slots. */
static inline size_t kmoe_lora_scratch(size_t nk, int D, int F, int Rgu, int Rd)
{
    const size_t R = (size_t)(Rgu > Rd ? Rgu : Rd), W = (size_t)(F > D ? F : D);
    const size_t bgu = 2 * (size_t)F * (size_t)Rgu, bd = (size_t)D * (size_t)Rd;
    return nk * (2 * R + W) + 2 * (bgu > bd ? bgu : bd);
}

/* The router's top k of one token's E probabilities p into id[0..k), the largest first, a tie to the lower expert
 * (torch.topk's order on the CPU): what the host's routing chooses, and what its checks recompute. */
static inline void kmoe_topk(const float *p, int E, int k, int32_t *id)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken |= id[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        id[j] = best;
    }
}

/* One back-end: what a context runs. Every op gets the context first. */
struct kops {
    const char *name; /* "cpu", "cuda" */
    /* memory of the context: alloc returns NULL when it cannot */
    void *(*alloc)(struct kctx *K, size_t bytes);
    void (*free)(struct kctx *K, void *p);
    void (*to_device)(struct kctx *K, void *dst, const void *src, size_t bytes);
    void (*to_host)(struct kctx *K, void *dst, const void *src, size_t bytes);
    void (*copy)(struct kctx *K, void *dst, const void *src, size_t bytes);
    void (*zero)(struct kctx *K, void *p, size_t bytes);
    /* rows blocks of `bytes` each, the rows dpitch and spitch bytes apart, within the context's memory (NULL: a
     * copy per row) */
    void (*copy_rows)(struct kctx *K, void *dst, size_t dpitch, const void *src, size_t spitch, size_t bytes,
                      size_t rows);
    void (*sync)(struct kctx *K);
    /* host memory the context copies to and from at full speed: pinned (page-locked) on a GPU, plain on the CPU;
     * host_alloc returns NULL when it cannot (activation offload's arena) */
    void *(*host_alloc)(struct kctx *K, size_t bytes);
    void (*host_free)(struct kctx *K, void *p);
    /* bytes freed and kept for reuse rather than given back (the CPU's big blocks; NULL: none, or counted in
     * kmem_stats.reserved by the back-end itself) */
    size_t (*cached)(struct kctx *K);
    /* a copy to host memory beside the context's work (k_to_host_behind below; NULL: a back-end whose copies are
     * the host's own, k_to_host then) and the wait for those copies (host: the host waits too, else only the
     * context's later work) */
    void (*to_host_behind)(struct kctx *K, void *dst, const void *src, size_t bytes);
    void (*behind_wait)(struct kctx *K, bool host);

    void (*rmsnorm_forward)(struct kctx *K, float *y, float *rstd, const float *x, const float *w, int N, int D,
                            float eps);
    void (*rmsnorm_backward)(struct kctx *K, float *dx, float *dw, const float *dy, const float *x, const float *w,
                             const float *rstd, int N, int D);
    void (*embedding_forward)(struct kctx *K, float *out, const int32_t *ids, const float *table, int N, int D,
                              const struct vocab_shard *vs);
    void (*embedding_backward)(struct kctx *K, float *dtable, const float *dout, const int32_t *ids, int N, int D,
                               const struct vocab_shard *vs);
    void (*linear_forward)(struct kctx *K, float *y, const float *x, const float *W, const float *b, int N, int Din,
                           int Dout);
    void (*linear_backward)(struct kctx *K, float *dx, float *dW, float *db, const float *dy, const float *x,
                            const float *W, int N, int Din, int Dout);
    /* batch-invariant mode's product of a block of columns: x's rows ldx floats apart, W's ldw, no bias (NULL: the
     * back-end has none) */
    void (*linear_forward_ld)(struct kctx *K, float *y, const float *x, int ldx, const float *W, int ldw, int N,
                              int Din, int Dout);
    void (*rope_forward)(struct kctx *K, float *x, const int32_t *pos, int N, int H, int hd, const double *inv_freq);
    void (*rope_backward)(struct kctx *K, float *dx, const int32_t *pos, int N, int H, int hd, const double *inv_freq);
    /* prefix_of: NULL or (B) host entries, as in kernels/cpu/cpu_kernels.h (shared-prompt packing) */
    void (*attention_forward)(struct kctx *K, float *out, float *lse, const float *q, const float *k, const float *v,
                              const int32_t *cu_seqlens, const int32_t *prefix_of, int B, int Hq, int Hkv, int hd);
    void (*attention_backward)(struct kctx *K, float *dq, float *dk, float *dv, const float *dout, const float *out,
                               const float *lse, const float *q, const float *k, const float *v,
                               const int32_t *cu_seqlens, const int32_t *prefix_of, int B, int Hq, int Hkv, int hd);
    /* the KV cache (k_kv_elem_bytes, k_kv_store): its element's bytes in K, and n fp32 values stored into it */
    size_t (*kv_elem_bytes)(const struct kctx *K);
    void (*kv_store)(struct kctx *K, void *cache, size_t at, const float *x, size_t n);
    void (*attention_cached)(struct kctx *K, float *out, const float *q, const void *kcache, const void *vcache, int Tq,
                             int Tk, int Hq, int Hkv, int hd);
    /* batched decode (NULL in a back-end without it; k_attention_decode_batched) */
    void (*attention_decode_batched)(struct kctx *K, float *out, const float *q, const float *k, const float *v,
                                     void *const *kc, void *const *vc, const int32_t *len, int B, int Hq, int Hkv,
                                     int hd);
    /* batch-invariant mode's attention of chosen query rows (context parallelism's, over the whole row's keys): see
     * attention_rows in kernels/cpu/cpu_kernels.h; kfirst, klast (n) host int32. NULL in a back-end without it */
    void (*attention_rows)(struct kctx *K, float *out, float *lse, const float *q, const float *k, const float *v,
                           const int32_t *kfirst, const int32_t *klast, int n, int Hq, int Hkv, int hd);
    /* ring attention's blocks (context parallelism), NULL in a back-end without them: see attention_block_forward in
     * kernels/cpu/cpu_kernels.h; qseq (nq) and kseq (nk) are int32 context memory, drow (nq, Hq) floats */
    void (*attention_block_forward)(struct kctx *K, float *po, float *plse, const float *q, const float *k,
                                    const float *v, const int32_t *qseq, const int32_t *kseq, int nq, int nk, int Hq,
                                    int Hkv, int hd);
    void (*attention_block_backward)(struct kctx *K, float *dq, float *dk, float *dv, const float *dout,
                                     const float *lse, const float *drow, const float *q, const float *k,
                                     const float *v, const int32_t *qseq, const int32_t *kseq, int nq, int nk, int Hq,
                                     int Hkv, int hd);
    void (*attention_merge)(struct kctx *K, float *out, float *lse, const float *po, const float *plse, int n, int Hq,
                            int hd);
    void (*attention_drow)(struct kctx *K, float *drow, const float *dout, const float *out, int n, int Hq, int hd);
    void (*swiglu_forward)(struct kctx *K, float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_backward)(struct kctx *K, float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n);
    void (*add)(struct kctx *K, float *y, const float *x, size_t n);
    void (*axpy)(struct kctx *K, float *y, float a, const float *x, size_t n);
    /* x[i] = x[i] * a rounded once to float (a double coefficient, as a gradient clip's) */
    void (*scale)(struct kctx *K, float *x, double a, size_t n);
    /* sum of x[i]^2 in double (a gradient norm's part) */
    double (*sumsq)(struct kctx *K, const float *x, size_t n);
    void (*lmhead_forward)(struct kctx *K, float *logp, float *entropy, const float *h, const float *W,
                           const int32_t *targets, int N, int D, const struct vocab_shard *vs, float temperature,
                           int chunk);
    void (*lmhead_backward)(struct kctx *K, float *dh, float *dW, const float *dlogp, const float *dentropy,
                            const float *h, const float *W, const int32_t *targets, int N, int D,
                            const struct vocab_shard *vs, float temperature, int chunk);
    /* tokens[b] and logps[b] (HOST arrays) sampled from row b of logits (B, V) with uniforms[b] (HOST), as
     * sample_row does */
    void (*sample)(struct kctx *K, int32_t *tokens, float *logps, const float *logits, int B, int V, float temperature,
                   float top_p, int top_k, const double *uniforms);
    /* mixture of experts (NULL in a back-end without them): routing from the router's logits (N, E) into r; its
     * backward: dlogits (N, E) = d/dlogits of the loss given dwt (N, k), plus dp_col (E, HOST, or NULL) added to
     * every token's dL/dprobs (the load-balancing loss); the experts: y (N, D) = sum over each token's slots of
     * wt x expert(x) with Wg, Wu (E, F, D) and Wd (E, D, F), every expert's tokens as one product; and their
     * backward: dx (N, D) and dWg, dWu, dWd accumulated (the weight gradients may be NULL), dwt (N, k) written */
    void (*moe_route)(struct kctx *K, struct kmoe *r, const float *logits);
    void (*moe_route_backward)(struct kctx *K, float *dlogits, const struct kmoe *r, const float *dwt,
                               const float *dp_col);
    void (*moe_experts_forward)(struct kctx *K, float *y, const float *x, const float *Wg, const float *Wu,
                                const float *Wd, struct kmoe *r);
    void (*moe_experts_backward)(struct kctx *K, float *dx, float *dWg, float *dWu, float *dWd, float *dwt,
                                 const float *dy, const float *Wg, const float *Wu, const float *Wd,
                                 const struct kmoe *r);
    /* expert parallelism's row moves around its all-to-alls (worker/model/moe_ep.c), the same as the experts' ops
     * make inside (NULL in a back-end without them): gather xs[j] = x[order[j] / k] and pos[order[j]] = j; combine
     * y[t] = sum over t's slots s, in order, of wt[s] ys[pos[s]]; slot_grad dys[j] = wt[s] dy[s / k] and dwt[s] =
     * dy[s / k] . r->ys[j] (s = order[j]); scatter dx[t] += dxs[pos[s]] over t's slots. r's N, k, D, order, pos and
     * wt; every pointer K's memory. */
    void (*moe_gather)(struct kctx *K, float *xs, const float *x, struct kmoe *r);
    void (*moe_combine)(struct kctx *K, float *y, const float *ys, const struct kmoe *r);
    void (*moe_slot_grad)(struct kctx *K, float *dys, float *dwt, const float *dy, const struct kmoe *r);
    void (*moe_scatter)(struct kctx *K, float *dx, const float *dxs, const struct kmoe *r);
    /* AdamW (torch semantics) at step t >= 1: p = p (1 - lr wd) - lr / (1 - b1^t) m / (sqrt(v / (1 - b2^t)) + eps) */
    void (*adamw)(struct kctx *K, float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t t);
    /* Kept weights (k_weights_changed below; NULL in a back-end that rounds nothing per call): k_alloc names each
     * weights buffer (weights_note) and k_free forgets it; weights_changed marks p's buffer's copy stale;
     * weights_check counts the copies marked fresh that differ from a rounding of their buffer now. */
    void (*weights_note)(struct kctx *K, const void *p, size_t bytes);
    void (*weights_forget)(struct kctx *K, const void *p);
    void (*weights_changed)(struct kctx *K, const void *p);
    int (*weights_check)(struct kctx *K);
    /* Graphs (k_graph_begin below; NULL in a back-end without them) */
    bool (*graph_begin)(struct kctx *K, char *why, size_t len);
    struct kgraph *(*graph_end)(struct kctx *K, char *why, size_t len);
    void (*graph_launch)(struct kctx *K, struct kgraph *g);
    void (*graph_free)(struct kctx *K, struct kgraph *g);
    uint64_t (*graph_epoch)(struct kctx *K);
};

/* What a context's products rounded (the CUDA back-end; the CPU's counts nothing): bytes of fp32 read to make BF16
 * operands of activations (x, dy; attention's q, k, v, dout) and of weights per call, and the refreshes of kept
 * weight copies (each reads its buffer's fp32 bytes once). In BF16, a decode step that rounds no weight reads each
 * parameter once, 2 bytes. attn_products: the batched GEMMs (one per product, tile of a sequence's query rows, and
 * call, over the KV heads) that ran attention_forward's and attention_backward's products on tensor cores. */
struct kgemm_stats {
    unsigned long long round_bytes_act, round_bytes_weights; /* per call */
    unsigned long long kept_refreshes, kept_refresh_bytes;   /* kept copies made again after a change */
    unsigned long long attn_products;
};

/* Bytes a context has handed out (k_alloc, less k_free) and the most it ever had: weights, gradients, optimizer
 * state, activations and KV caches, each counted in its own line, and the arena reservations. */
enum kmem_kind { KMEM_WEIGHTS, KMEM_GRADS, KMEM_OPTIM, KMEM_ACTS, KMEM_KV, KMEM_OTHER, KMEM_KINDS };
struct kmem_stats {
    size_t in_use[KMEM_KINDS], peak[KMEM_KINDS];
    size_t allocated, max_allocated; /* all kinds: torch's memory_allocated / max_memory_allocated */
    size_t reserved, max_reserved;   /* what the back-end holds from its device (>= allocated) */
    unsigned long long allocs;       /* k_alloc calls: a steady training step makes none */
    size_t host, max_host;           /* host memory of offloaded activations (karena_init_host), not the above */
};

struct kctx {
    const struct kops *ops;
    enum kdevice device;
    int device_index;
    enum kmatmul matmul;
    void *stream; /* cudaStream_t */
    void *blas;   /* cublasHandle_t */
    void *impl;   /* the back-end's own state */
    struct kmem_stats mem;
    struct kgemm_stats gemm;
    /* fp32 products may use TF32 tensor cores (torch.set_float32_matmul_precision("high");
     * actor_rollout_ref.model.fp32_matmul_precision): inputs rounded to TF32's 10-bit mantissa, fp32 accumulation.
     * The CUDA back-end only; false (fp32 means fp32) unless set. */
    bool tf32;
};

/* Batch-invariant mode (docs/training.md, "Batch-invariant mode"; actor_rollout_ref.model.batch_invariant): the CPU
 * back-end's forward kernels (products, attention, the LM head's log-probs, the sampler's log-prob) take paths whose
 * per-row reductions run in one fixed order whatever the batch's rows, positions and padding, so that generation's
 * log-probs are the trainer's bit for bit. Process-wide; the CUDA back-end does not read it. */
void k_set_batch_invariant(bool on);
bool k_batch_invariant(void);

/* The process's CPU context (fp32 GEMMs): what a model gets unless it is given another. */
struct kctx *kctx_cpu(void);
/* A context for device ("cpu", "cuda", "cuda:N") with GEMMs in matmul precision. NULL with why filled when the
 * device is unknown or absent (a CUDA device in a build without CUDA, or on a machine without one), or when the
 * back-end cannot run that precision. */
struct kctx *kctx_create(const char *device, enum kmatmul matmul, char *why, size_t len);
void kctx_free(struct kctx *K);
/* "cpu, fp32 GEMMs (OpenBLAS SkylakeX kernels)", "cuda:0 (NVIDIA H200), BF16 GEMMs": for logs. Returns buf. */
const char *kctx_describe(const struct kctx *K, char *buf, size_t len);
/* Whether a CUDA device can be used here (built with CUDA and one present). */
bool kctx_cuda_available(void);
/* CUDA devices visible to this process (0 in a build without CUDA, or without a driver). */
int kctx_cuda_devices(void);
/* The memory of K's device in bytes (a GPU's total); 0 for the CPU (no fixed budget). */
size_t kctx_device_bytes(struct kctx *K);

/* Memory of K, counted under kind. Running out is a fatal error naming what was asked for, its bytes, what is in
 * use, and the knob that lowers it (what: "activations of 4096 tokens"). */
void *k_alloc(struct kctx *K, size_t bytes, enum kmem_kind kind, const char *what);
/* Like k_alloc, zeroed. */
void *k_calloc(struct kctx *K, size_t bytes, enum kmem_kind kind, const char *what);
void k_free(struct kctx *K, void *p, size_t bytes, enum kmem_kind kind);
static inline void k_to_device(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    K->ops->to_device(K, dst, src, bytes);
}
static inline void k_to_host(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    K->ops->to_host(K, dst, src, bytes);
}
/* bytes of K's memory at src, as it is once the work submitted to K so far has run, copied to host memory at dst
 * beside K's later work (on a GPU: on a copy stream of its own, so the copy overlaps the compute that follows; best
 * into K's pinned host memory, its ops' host_alloc). Until k_behind_wait(K, true) the host must not read dst; until
 * k_behind_wait(K, false) or (true) K's work must not change src. Where the back-end has no such copies, k_to_host. */
static inline void k_to_host_behind(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    if (K->ops->to_host_behind)
        K->ops->to_host_behind(K, dst, src, bytes);
    else
        K->ops->to_host(K, dst, src, bytes);
}
/* K's work submitted from now on runs after every k_to_host_behind copy made so far; host: and the host returns once
 * they are done (their host memory may be read, or freed). */
static inline void k_behind_wait(struct kctx *K, bool host)
{
    if (K->ops->behind_wait)
        K->ops->behind_wait(K, host);
}
static inline void k_copy(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    K->ops->copy(K, dst, src, bytes);
}
static inline void k_zero(struct kctx *K, void *p, size_t bytes) { K->ops->zero(K, p, bytes); }
/* rows blocks of bytes, dpitch and spitch bytes apart, copied within K's memory: one call where the back-end can */
static inline void k_copy_rows(struct kctx *K, void *dst, size_t dpitch, const void *src, size_t spitch, size_t bytes,
                               size_t rows)
{
    if (K->ops->copy_rows) {
        K->ops->copy_rows(K, dst, dpitch, src, spitch, bytes, rows);
        return;
    }
    for (size_t r = 0; r < rows; r++)
        K->ops->copy(K, (char *)dst + r * dpitch, (const char *)src + r * spitch, bytes);
}
static inline void k_sync(struct kctx *K) { K->ops->sync(K); }

/* BF16 weights kept (issue 43 item 3): in a BF16 context the CUDA back-end keeps a BF16 copy of each weights buffer
 * (k_alloc'd as KMEM_WEIGHTS) that a product reads, made once after each change rather than at every product
 * (which moved about 8 bytes per parameter per decode step instead of 2); fp32 masters stay for the update. The
 * back-end's own ops that write into a weights buffer (AdamW, copies, to_device, zero, add, axpy, scale) mark its
 * copy stale themselves; whatever else writes there (a collective: ZeRO-1's all-gather of the parameters) says so
 * with k_weights_changed(K, p) for any p inside the buffer. GRPO_CHECK_KEPT_WEIGHTS=1 (on by default under
 * tests/cuemu) compares the copy with a fresh rounding at every use and ends the process, naming the product, when
 * a change went unsaid. */
static inline void k_weights_changed(struct kctx *K, const void *p)
{
    if (K->ops->weights_changed)
        K->ops->weights_changed(K, p);
}
/* How many kept copies marked fresh differ from a rounding of their buffer now (a change not said): 0 when all is
 * well, and in a back-end that keeps none. */
static inline int k_weights_check(struct kctx *K) { return K->ops->weights_check ? K->ops->weights_check(K) : 0; }

/* Graphs (issue 43 item 4; CUDA graphs on the CUDA back-end, none on the CPU's): K's ops between k_graph_begin and
 * k_graph_end are recorded, not run, into a graph that k_graph_launch then runs as one launch, as often as wanted,
 * on the memory as it is at each launch (the same pointers, sizes and scalars as recorded). Between the two, no op
 * may need the host to wait on the device: whatever cannot be recorded (a host read or sync, an allocation or free,
 * a workspace that must grow, a kept BF16 weight copy to be made) ends the recording there, failed: the ops from
 * there on run, the ones before were dropped, and k_graph_end returns NULL with why, so the caller runs the whole
 * sequence again. k_graph_begin returns false (why filled) where K has no graphs. */
struct kgraph;
static inline bool k_has_graphs(const struct kctx *K) { return K->ops->graph_begin != NULL; }
bool k_graph_begin(struct kctx *K, char *why, size_t len);
static inline struct kgraph *k_graph_end(struct kctx *K, char *why, size_t len)
{
    return K->ops->graph_end(K, why, len);
}
static inline void k_graph_launch(struct kctx *K, struct kgraph *g) { K->ops->graph_launch(K, g); }
static inline void k_graph_free(struct kctx *K, struct kgraph *g)
{
    if (g)
        K->ops->graph_free(K, g);
}
/* Changes whenever memory a recorded graph may read is no longer what it was recorded with: a workspace of the
 * back-end made again, a kept BF16 weight copy made, refreshed, gone stale or freed, any k_free. A graph recorded
 * at one value is valid to launch while the value is the same (and the memory its caller gave it is live). */
static inline uint64_t k_graph_epoch(struct kctx *K) { return K->ops->graph_epoch ? K->ops->graph_epoch(K) : 0; }
/* Zero the peaks (a new step's maxima). */
void kmem_reset_peaks(struct kctx *K);

/* An arena: one reservation of context memory from which a batch's buffers are taken in order and given back all
 * at once. It grows only when a batch needs more than it holds (a new, larger batch shape), so a training step
 * mallocs nothing once the first step of its shape has run. */
struct karena {
    struct kctx *K;
    enum kmem_kind kind;
    const char *what;
    char *base;
    size_t cap, used, peak;
    bool host; /* the context's host memory (karena_init_host), counted in K->mem.host */
};
void karena_init(struct karena *a, struct kctx *K, enum kmem_kind kind, const char *what);
/* An arena of K's host memory (pinned on a GPU): what activation offload keeps off the device. */
void karena_init_host(struct karena *a, struct kctx *K, const char *what);
/* An arena that only counts: takes return NULL and add up, so a plan is the same sequence of takes as its use. */
void karena_init_counter(struct karena *a);
/* Make room for bytes (taken with karena_take in up to `pieces` pieces, each rounded up to 64 bytes); only while
 * nothing is taken. */
void karena_reserve(struct karena *a, size_t bytes, size_t pieces);
/* bytes of the arena, 64-byte aligned; more than was reserved is a fatal error (a wrong plan). */
void *karena_take(struct karena *a, size_t bytes);
/* n floats taken and zeroed. */
float *karena_floats0(struct karena *a, size_t n);
void karena_reset(struct karena *a);
void karena_release(struct karena *a);
/* Bytes a piece of `bytes` takes (rounded up to the alignment): for plans. */
size_t karena_piece(size_t bytes);

/* ---- the ops: see kernels/cpu/cpu_kernels.h for each one's shapes ---- */
static inline void k_rmsnorm_forward(struct kctx *K, float *y, float *rstd, const float *x, const float *w, int N,
                                     int D, float eps)
{
    K->ops->rmsnorm_forward(K, y, rstd, x, w, N, D, eps);
}
static inline void k_rmsnorm_backward(struct kctx *K, float *dx, float *dw, const float *dy, const float *x,
                                      const float *w, const float *rstd, int N, int D)
{
    K->ops->rmsnorm_backward(K, dx, dw, dy, x, w, rstd, N, D);
}
static inline void k_embedding_forward(struct kctx *K, float *out, const int32_t *ids, const float *table, int N, int D,
                                       const struct vocab_shard *vs)
{
    K->ops->embedding_forward(K, out, ids, table, N, D, vs);
}
static inline void k_embedding_backward(struct kctx *K, float *dtable, const float *dout, const int32_t *ids, int N,
                                        int D, const struct vocab_shard *vs)
{
    K->ops->embedding_backward(K, dtable, dout, ids, N, D, vs);
}
static inline void k_linear_forward(struct kctx *K, float *y, const float *x, const float *W, const float *b, int N,
                                    int Din, int Dout)
{
    K->ops->linear_forward(K, y, x, W, b, N, Din, Dout);
}
static inline void k_linear_forward_ld(struct kctx *K, float *y, const float *x, int ldx, const float *W, int ldw,
                                       int N, int Din, int Dout)
{
    K->ops->linear_forward_ld(K, y, x, ldx, W, ldw, N, Din, Dout);
}
static inline void k_linear_backward(struct kctx *K, float *dx, float *dW, float *db, const float *dy, const float *x,
                                     const float *W, int N, int Din, int Dout)
{
    K->ops->linear_backward(K, dx, dW, db, dy, x, W, N, Din, Dout);
}
static inline void k_rope_forward(struct kctx *K, float *x, const int32_t *pos, int N, int H, int hd,
                                  const double *inv_freq)
{
    K->ops->rope_forward(K, x, pos, N, H, hd, inv_freq);
}
static inline void k_rope_backward(struct kctx *K, float *dx, const int32_t *pos, int N, int H, int hd,
                                   const double *inv_freq)
{
    K->ops->rope_backward(K, dx, pos, N, H, hd, inv_freq);
}
static inline void k_attention_forward(struct kctx *K, float *out, float *lse, const float *q, const float *k,
                                       const float *v, const int32_t *cu_seqlens, const int32_t *prefix_of, int B,
                                       int Hq, int Hkv, int hd)
{
    K->ops->attention_forward(K, out, lse, q, k, v, cu_seqlens, prefix_of, B, Hq, Hkv, hd);
}
static inline void k_attention_backward(struct kctx *K, float *dq, float *dk, float *dv, const float *dout,
                                        const float *out, const float *lse, const float *q, const float *k,
                                        const float *v, const int32_t *cu_seqlens, const int32_t *prefix_of, int B,
                                        int Hq, int Hkv, int hd)
{
    K->ops->attention_backward(K, dq, dk, dv, dout, out, lse, q, k, v, cu_seqlens, prefix_of, B, Hq, Hkv, hd);
}
/* The KV cache of generation (issue 43 item 4): K's memory of elements k_kv_elem_bytes(K) bytes each, written only
 * through k_kv_store and read only by the two ops below. The CUDA back-end's BF16 context (KMM_BF16) holds BF16, 2
 * bytes an element: half the memory, and half the bytes a decode step's attention reads (at long contexts and large
 * batches a large share of the step's bytes); the fp32 context holds fp32. The CPU back-end holds fp32 in either
 * context, and its BF16 context stores values rounded to BF16 (kernels/cpu/backend.c says why): the same numbers as the
 * GPU's. Either way an appended key or value is rounded to the cache's precision once (round to nearest even) and
 * attention reads it back into fp32 arithmetic. */
static inline size_t k_kv_elem_bytes(const struct kctx *K) { return K->ops->kv_elem_bytes(K); }
/* Elements [at, at + n) of cache (K's memory) = the n fp32 values of x (K's memory), in the cache's precision. */
static inline void k_kv_store(struct kctx *K, void *cache, size_t at, const float *x, size_t n)
{
    K->ops->kv_store(K, cache, at, x, n);
}
/* Attention of Tq new query rows over a cache of Tk positions (attention_cached in kernels/cpu/cpu_kernels.h); kcache
 * and vcache are caches of K (k_kv_elem_bytes). */
static inline void k_attention_cached(struct kctx *K, float *out, const float *q, const void *kcache,
                                      const void *vcache, int Tq, int Tk, int Hq, int Hkv, int hd)
{
    K->ops->attention_cached(K, out, q, kcache, vcache, Tq, Tk, Hq, Hkv, hd);
}
/* A decode step of B sequences with one new token each, in one call (issue 43 item 4: the per-sequence path is 4
 * launches per sequence per layer on a GPU): sequence b's new K and V rows (k, v row b: Hkv * hd fp32) are appended
 * to its caches kc[b], vc[b] ((cap, Hkv * hd) elements of K's KV cache) at position len[b], as k_kv_store stores them,
 * and its query row q[b] (Hq * hd) attends over the len[b] + 1 keys into out[b], the new one as the cache holds it.
 * kc, vc (B pointers) and len (B) are K's memory. Whether K has it: */
static inline bool k_has_decode_batched(const struct kctx *K) { return K->ops->attention_decode_batched != NULL; }
static inline void k_attention_decode_batched(struct kctx *K, float *out, const float *q, const float *k,
                                              const float *v, void *const *kc, void *const *vc, const int32_t *len,
                                              int B, int Hq, int Hkv, int hd)
{
    K->ops->attention_decode_batched(K, out, q, k, v, kc, vc, len, B, Hq, Hkv, hd);
}
static inline void k_attention_rows(struct kctx *K, float *out, float *lse, const float *q, const float *k,
                                    const float *v, const int32_t *kfirst, const int32_t *klast, int n, int Hq, int Hkv,
                                    int hd)
{
    K->ops->attention_rows(K, out, lse, q, k, v, kfirst, klast, n, Hq, Hkv, hd);
}
/* Whether K's back-end has ring attention's blocks. */
static inline bool k_has_attention_block(const struct kctx *K) { return K->ops->attention_block_forward != NULL; }
static inline void k_attention_block_forward(struct kctx *K, float *po, float *plse, const float *q, const float *k,
                                             const float *v, const int32_t *qseq, const int32_t *kseq, int nq, int nk,
                                             int Hq, int Hkv, int hd)
{
    K->ops->attention_block_forward(K, po, plse, q, k, v, qseq, kseq, nq, nk, Hq, Hkv, hd);
}
static inline void k_attention_block_backward(struct kctx *K, float *dq, float *dk, float *dv, const float *dout,
                                              const float *lse, const float *drow, const float *q, const float *k,
                                              const float *v, const int32_t *qseq, const int32_t *kseq, int nq, int nk,
                                              int Hq, int Hkv, int hd)
{
    K->ops->attention_block_backward(K, dq, dk, dv, dout, lse, drow, q, k, v, qseq, kseq, nq, nk, Hq, Hkv, hd);
}
static inline void k_attention_merge(struct kctx *K, float *out, float *lse, const float *po, const float *plse, int n,
                                     int Hq, int hd)
{
    K->ops->attention_merge(K, out, lse, po, plse, n, Hq, hd);
}
static inline void k_attention_drow(struct kctx *K, float *drow, const float *dout, const float *out, int n, int Hq,
                                    int hd)
{
    K->ops->attention_drow(K, drow, dout, out, n, Hq, hd);
}
static inline void k_swiglu_forward(struct kctx *K, float *out, const float *gate, const float *up, size_t n)
{
    K->ops->swiglu_forward(K, out, gate, up, n);
}
static inline void k_swiglu_backward(struct kctx *K, float *dgate, float *dup, const float *dout, const float *gate,
                                     const float *up, size_t n)
{
    K->ops->swiglu_backward(K, dgate, dup, dout, gate, up, n);
}
static inline void k_add(struct kctx *K, float *y, const float *x, size_t n) { K->ops->add(K, y, x, n); }
static inline void k_axpy(struct kctx *K, float *y, float a, const float *x, size_t n) { K->ops->axpy(K, y, a, x, n); }
static inline void k_scale(struct kctx *K, float *x, double a, size_t n) { K->ops->scale(K, x, a, n); }
static inline double k_sumsq(struct kctx *K, const float *x, size_t n) { return K->ops->sumsq(K, x, n); }
/* Whether K's back-end runs mixture-of-experts layers; with k_has_moe_ep, split over expert-parallel ranks too. */
static inline bool k_has_moe(const struct kctx *K) { return K->ops->moe_route != NULL; }
static inline bool k_has_moe_ep(const struct kctx *K) { return K->ops->moe_gather != NULL; }
static inline void k_moe_gather(struct kctx *K, float *xs, const float *x, struct kmoe *r)
{
    K->ops->moe_gather(K, xs, x, r);
}
static inline void k_moe_combine(struct kctx *K, float *y, const float *ys, const struct kmoe *r)
{
    K->ops->moe_combine(K, y, ys, r);
}
static inline void k_moe_slot_grad(struct kctx *K, float *dys, float *dwt, const float *dy, const struct kmoe *r)
{
    K->ops->moe_slot_grad(K, dys, dwt, dy, r);
}
static inline void k_moe_scatter(struct kctx *K, float *dx, const float *dxs, const struct kmoe *r)
{
    K->ops->moe_scatter(K, dx, dxs, r);
}
/* r's buffers for r->N, E, k, D, F from ar (bwd: the backward's scratch too; a counting arena sizes them). */
void kmoe_take(struct karena *ar, struct kmoe *r, bool bwd);
/* A back-end's additions to one expert's products (NULL, or a NULL member: none), called on expert e's rows
 * [lo, lo + n) at their place in the products: after gate and up (gate_up: before SwiGLU), after down; in the
 * backward after down's backward (da written, before SwiGLU's), and after SwiGLU's (dg, du written, before gate's and
 * up's backward add into dxs). The CPU back-end's LoRA on the experts (struct kmoe_lora) is one. */
struct kmoe_expert_hooks {
    void (*gate_up_forward)(struct kctx *K, const struct kmoe *r, int e, int lo, int n);
    void (*down_forward)(struct kctx *K, const struct kmoe *r, int e, int lo, int n);
    void (*down_backward)(struct kctx *K, const struct kmoe *r, int e, int lo, int n, float *da, const float *dys);
    void (*gate_up_backward)(struct kctx *K, const struct kmoe *r, int e, int lo, int n, float *dxs, const float *dg,
                             const float *du);
};
/* The experts' products of a routed layer, the part every back-end shares: for each expert e, its rows
 * [offs[e], offs[e + 1]) of r->xs through gate and up (linear), SwiGLU and down, one product per expert and
 * projection (K's linear op: fp32 or BF16 GEMMs), into r->g, u, a and ys. offs: HOST memory (E + 1), r->offs or its
 * copy. The gather before and the combine after are the back-end's. */
void kmoe_products_forward(struct kctx *K, const int32_t *offs, const float *Wg, const float *Wu, const float *Wd,
                           struct kmoe *r, const struct kmoe_expert_hooks *hooks);
/* Their backward from the slots' output gradients dys (r->bwd_d's first N k rows, the back-end's slot_grad):
 * dxs (r->bwd_d's second half) written, dWg, dWu, dWd accumulated (each may be NULL); r->bwd_f is scratch. */
void kmoe_products_backward(struct kctx *K, const int32_t *offs, float *dWg, float *dWu, float *dWd, const float *Wg,
                            const float *Wu, const float *Wd, const struct kmoe *r,
                            const struct kmoe_expert_hooks *hooks);
static inline void k_moe_route(struct kctx *K, struct kmoe *r, const float *logits) { K->ops->moe_route(K, r, logits); }
static inline void k_moe_route_backward(struct kctx *K, float *dlogits, const struct kmoe *r, const float *dwt,
                                        const float *dp_col)
{
    K->ops->moe_route_backward(K, dlogits, r, dwt, dp_col);
}
static inline void k_moe_experts_forward(struct kctx *K, float *y, const float *x, const float *Wg, const float *Wu,
                                         const float *Wd, struct kmoe *r)
{
    K->ops->moe_experts_forward(K, y, x, Wg, Wu, Wd, r);
}
static inline void k_moe_experts_backward(struct kctx *K, float *dx, float *dWg, float *dWu, float *dWd, float *dwt,
                                          const float *dy, const float *Wg, const float *Wu, const float *Wd,
                                          const struct kmoe *r)
{
    K->ops->moe_experts_backward(K, dx, dWg, dWu, dWd, dwt, dy, Wg, Wu, Wd, r);
}
static inline void k_lmhead_forward(struct kctx *K, float *logp, float *entropy, const float *h, const float *W,
                                    const int32_t *targets, int N, int D, const struct vocab_shard *vs,
                                    float temperature, int chunk)
{
    K->ops->lmhead_forward(K, logp, entropy, h, W, targets, N, D, vs, temperature, chunk);
}
static inline void k_lmhead_backward(struct kctx *K, float *dh, float *dW, const float *dlogp, const float *dentropy,
                                     const float *h, const float *W, const int32_t *targets, int N, int D,
                                     const struct vocab_shard *vs, float temperature, int chunk)
{
    K->ops->lmhead_backward(K, dh, dW, dlogp, dentropy, h, W, targets, N, D, vs, temperature, chunk);
}
static inline void k_sample(struct kctx *K, int32_t *tokens, float *logps, const float *logits, int B, int V,
                            float temperature, float top_p, int top_k, const double *uniforms)
{
    K->ops->sample(K, tokens, logps, logits, B, V, temperature, top_p, top_k, uniforms);
}
static inline void k_adamw(struct kctx *K, float *p, const float *g, float *m, float *v, size_t n, double lr,
                           double beta1, double beta2, double eps, double weight_decay, int64_t t)
{
    K->ops->adamw(K, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
}

/* ---- back-ends ---- */
/* The host's helpers beside the ops, the host back-end's (the CPU's, kernels/cpu/register.c): the khost_* calls. */
struct khost {
    void (*set_threads)(int threads);
    int (*threads)(void);
    void (*run_parts)(int parts, void (*fn)(void *arg, int part, int parts), void *arg);
    void (*sgemm)(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                  float beta, float *C, int ldc);
    const char *(*blas_kernels)(char *buf, size_t len);
    const char *(*blas_kernels_better)(void);
    bool (*bf16_gemm_available)(void);
    const char *(*bf16_gemm_name)(void);
    void (*rope_default_freqs)(double *inv_freq, int hd, float theta);
    int (*sample_row)(const float *logits, int V, float temperature, float top_p, int top_k, double u, float *logp);
    void (*exp_shifted)(float *out, const float *x, size_t n, float shift);
};

/* A back-end as it registers itself: the build lists its back-ends in kbackends[] (kernels/meson.build generates
 * the list, the host's first, NULL-terminated), and the interface finds a device's there by name. */
struct kbackend {
    const char *name;       /* the device's name: "cpu", "cuda" */
    enum kdevice device;    /* K->device of its contexts */
    const struct kops *ops; /* its table (open may set another) */
    /* how many of its devices this process can use; NULL: one, addressed without an index ("cpu") */
    int (*devices)(void);
    /* make K (ops, device, device_index and matmul set) a context of device index: 0, or -1 with why; NULL: nothing
     * to do. close undoes it (NULL: nothing). */
    int (*open)(struct kctx *K, int index, char *why, size_t len);
    void (*close)(struct kctx *K);
    size_t (*device_bytes)(struct kctx *K); /* NULL: no fixed budget */
    /* what runs K's products ("OpenBLAS SkylakeX kernels"), for kctx_describe; NULL: nothing said */
    const char *(*gemm_name)(const struct kctx *K, char *buf, size_t len);
    const struct khost *host; /* the host back-end's helpers; NULL in a device's */
};
extern const struct kbackend *const kbackends[];
/* The registered back-end named name ("cpu", "cuda"), or NULL when this build has none. */
const struct kbackend *kbackend_find(const char *name);
/* The host back-end's helpers (kbackends[0]'s). */
static inline const struct khost *khost(void) { return kbackends[0]->host; }

/* The host back-end's threads (the trainer's trainer.num_threads, grpo-model's --threads): products and kernels split
 * into this many parts on its helper threads; khost_threads: how many parts a product should have. */
static inline void khost_set_threads(int threads) { khost()->set_threads(threads); }
static inline int khost_threads(void) { return khost()->threads(); }
/* fn(arg, i, parts) for i in [0, parts) on the host's helper threads, returning when all are done. */
static inline void khost_run_parts(int parts, void (*fn)(void *arg, int part, int parts), void *arg)
{
    khost()->run_parts(parts, fn, arg);
}
/* C (M, N) = alpha op(A) op(B) + beta C on host memory, as cblas_sgemm row-major, over the host's threads. */
static inline void khost_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda,
                               const float *B, int ldb, float beta, float *C, int ldc)
{
    khost()->sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
/* Which BLAS kernels run, and why (into buf, returned); the better kernels a user's OPENBLAS_CORETYPE passes over,
 * or NULL. */
static inline const char *khost_blas_kernels(char *buf, size_t len) { return khost()->blas_kernels(buf, len); }
static inline const char *khost_blas_kernels_better(void) { return khost()->blas_kernels_better(); }
/* Whether the host runs BF16 matrix products, and what runs them (or why none). */
static inline bool khost_bf16_gemm_available(void) { return khost()->bf16_gemm_available(); }
static inline const char *khost_bf16_gemm_name(void) { return khost()->bf16_gemm_name(); }
/* inv_freq[i] = theta^(-2i/hd), i < hd / 2 (RoPE's default frequencies). */
static inline void khost_rope_default_freqs(double *inv_freq, int hd, float theta)
{
    khost()->rope_default_freqs(inv_freq, hd, theta);
}
/* One token from host logits (V), as the CPU kernels' sample_row (kernels/cpu/cpu_kernels.h). */
static inline int khost_sample_row(const float *logits, int V, float temperature, float top_p, int top_k, double u,
                                   float *logp)
{
    return khost()->sample_row(logits, V, temperature, top_p, top_k, u, logp);
}
/* out[j] = exp(x[j] - shift) for x[j] <= shift on host memory (softmax rows). */
static inline void khost_exp_shifted(float *out, const float *x, size_t n, float shift)
{
    khost()->exp_shifted(out, x, n, shift);
}

#endif
