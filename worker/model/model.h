/* Llama / Qwen2 / Qwen3 decoder-only transformer on a kernel context (kernels.h: the CPU in fp32 or BF16, or a
 * GPU): parameters in one allocation, packed (padding-free) forward and backward for training, and a
 * KV-cache step for generation.
 *
 * Shapes: D hidden, F intermediate, V vocab, Hq query heads, Hkv key/value
 * heads, hd head dim, N packed tokens, B sequences. */
#ifndef GRPO_WORKER_MODEL_H
#define GRPO_WORKER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/model/arch.h"

/* RoPE frequencies: the default theta^(-2i/hd), Llama 3's remap (low frequencies divided by factor, high ones
 * kept, a smooth blend between; transformers' "llama3" rope_type), or all divided by factor ("linear"). */
enum rope_kind { ROPE_DEFAULT, ROPE_LLAMA3, ROPE_LINEAR };
struct rope_scaling {
    enum rope_kind kind;
    double factor, low_freq_factor, high_freq_factor;
    int original_max_position_embeddings;
};

struct model_config {
    enum model_arch arch;
    int vocab_size;        /* V */
    int hidden_size;       /* D */
    int intermediate_size; /* F */
    int n_layers;
    int n_heads;    /* Hq */
    int n_kv_heads; /* Hkv */
    int head_dim;   /* hd */
    float rope_theta;
    float rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias; /* q/k/v bias (Qwen2) */
    bool qk_norm;        /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    struct rope_scaling rope;
    int max_position_embeddings;
    int bos_token_id, eos_token_id; /* -1 if unknown */
    /* mixture of experts (Qwen3-MoE, Mixtral): every layer's MLP is n_experts SwiGLU experts of moe_intermediate
     * rows, n_experts_per_tok chosen per token by a softmax router (n_experts 0: a dense MLP of intermediate_size) */
    int n_experts, n_experts_per_tok, moe_intermediate;
    bool norm_topk_prob; /* the chosen experts' probabilities renormalised to sum to 1 (always for Mixtral) */
};

/* Weights of one decoder layer; pointers into the model's single buffer. */
struct layer_params {
    float *attn_norm;       /* (D) input_layernorm */
    float *wq, *wk, *wv;    /* (Hq*hd, D), (Hkv*hd, D), (Hkv*hd, D) */
    float *bq, *bk, *bv;    /* (Hq*hd), (Hkv*hd), (Hkv*hd) or NULL */
    float *q_norm, *k_norm; /* (hd) Qwen3's per-head RMSNorm weights, or NULL */
    float *wo;              /* (D, Hq*hd) */
    float *mlp_norm;        /* (D) post_attention_layernorm */
    float *w_gate, *w_up;   /* (F, D) */
    float *w_down;          /* (D, F) */
    /* mixture of experts: w_gate and w_up hold (E, Fe, D), w_down (E, D, Fe), expert after expert */
    float *router; /* (E, D) the router's weight, or NULL (dense) */
};

/* The linear projections of a decoder layer (LoRA's target_modules name them q_proj ... down_proj). */
enum proj_kind { PROJ_Q, PROJ_K, PROJ_V, PROJ_O, PROJ_GATE, PROJ_UP, PROJ_DOWN, PROJ_KINDS };

/* All parameters (or all gradients: same layout) in one allocation. */
struct model_params {
    float *mem; /* the single buffer, n_floats long */
    size_t n_floats;
    float *embed; /* (V, D) */
    struct layer_params *layers;
    float *final_norm; /* (D) */
    float *lm_head;    /* (V, D); == embed when tied */
};

/* One named parameter tensor, in Hugging Face naming: this process's part of it under tensor parallelism. */
struct param_ref {
    char name[96];
    float *data;
    int n_dims;
    int64_t shape[2]; /* of the part held here */
    size_t numel;
    /* where the part sits in the whole tensor: split 0 whole (replicated on every TP rank), 1 rows
     * [at, at + shape[0]) of full, 2 columns [at, at + shape[1]) of full */
    int split;
    int64_t at;
    int64_t full[2];
    bool owner; /* this rank counts the part (a gradient norm): a replicated part counts on one rank only */
};

struct comm;

/* This process's share of the model under tensor and pipeline parallelism, Megatron's layout. TP: q/k/v/gate/up
 * are split by rows (column-parallel), o/down by columns (row-parallel, their outputs summed over the TP group),
 * the embedding and the LM head by vocabulary rows; the norms are whole on every rank. With fewer KV heads than
 * TP ranks each KV head is held by TP / Hkv neighbouring ranks (kv_share) and their gradients are summed. PP:
 * stage s holds layers [L s / PP, L (s + 1) / PP); the first stage the embedding, the last the final norm and the
 * LM head (with tied embeddings, a copy of the embedding whose gradient is summed with the first stage's). */
struct model_shard {
    int tp_rank, tp_size; /* 0, 1: the whole model */
    int pp_rank, pp_size; /* 0, 1: every layer here */
    struct comm *tp;      /* the TP group; NULL when tp_size is 1 */
    struct comm *pp;      /* the pipeline group (the stages of this TP rank); NULL when pp_size is 1 */
    struct comm *mp;      /* every TP x PP rank of one model copy, ranked pp x TP + tp; NULL when both are 1 */
    int n_heads, n_kv_heads, inter; /* this rank's query heads, KV heads, intermediate rows */
    int head_lo, kv_lo, inter_lo;   /* the first of each in the whole model */
    int vocab_lo, vocab_hi;         /* this rank's vocabulary rows [lo, hi) */
    int kv_share;                   /* TP ranks holding the same KV heads (1: split) */
    int layer_lo, layer_hi;         /* this stage's decoder layers [lo, hi) */
    bool has_embed, has_head;       /* first stage: the embedding; last stage: the final norm and the LM head */
    /* Ulysses sequence parallelism (model_set_sp): the sp_size ranks of sp share each packed batch; this rank runs
     * tokens [N sp_rank / sp_size, N (sp_rank + 1) / sp_size) through the embedding, norms, MLP and LM head, and
     * around attention an all-to-all swaps its token slice for every token of its share of the heads */
    struct comm *sp; /* NULL: no sequence parallelism */
    int sp_rank, sp_size;
    /* expert parallelism (PP 1): this rank holds experts [expert_lo, expert_lo + n_experts) of every MoE layer,
     * everything else as TP cuts it; tokens reach their experts over ep, the EP ranks of this TP rank (moe_ep.h).
     * mp is then the ranks whose parts make one model copy: the EP group, or with TP the EP x TP ranks (ranked
     * ep x TP + tp) */
    int ep_rank, ep_size; /* 0, 1: every expert here */
    int expert_lo, n_experts;
    /* under TP each expert is split like the dense MLP (Megatron's expert TP = TP): this rank holds intermediate
     * rows [moe_inter_lo, moe_inter_lo + moe_inter) of every expert's gate and up, the same columns of its down */
    int moe_inter, moe_inter_lo;
    /* generation with the experts held whole over the TP group (model_layout's experts_over_tp; vLLM's expert
     * parallelism inside one engine, verl's rollout.expert_parallel_size): TP rank r holds experts [expert_lo,
     * expert_lo + n_experts) = [r E / T, (r + 1) E / T), each unsplit (moe_inter the whole intermediate); every TP
     * rank holds every token, runs its experts on those routed to them, and the TP group sums the parts */
    bool experts_over_tp;
    struct comm *ep; /* NULL when ep_size is 1 */
    /* context parallelism (model_set_cp): sp is then a ring-attention group; this rank runs the load-balanced
     * chunks r and 2 sp_size - 1 - r of each batch's row (ring_attn_row) and attends over the ring, every head */
    bool ring;
};

/* Where a shard sits: its TP rank and size, its stage and stages, and the groups (NULL where the size is 1; mp
 * NULL means the TP group when PP is 1). */
struct model_layout {
    int tp_rank, tp_size, pp_rank, pp_size;
    struct comm *tp, *pp, *mp;
    int ep_rank, ep_size; /* 0 and 0 or 1: no expert parallelism */
    struct comm *ep;
    bool experts_over_tp; /* a mixture of experts' experts held whole over the TP group (model_shard's); generation
                             only */
};

struct kctx;
struct kmoe_lora;
struct model_work;
struct lora;
struct model;

/* A projection hook: what an adapter adds to the model's linear maps (LoRA's: lora.c installs it with
 * model_set_hook). The model calls it after each base product and knows nothing of what it holds; an entry may be
 * NULL. */
struct model_hook {
    /* y += the hook's term of projection p of layer l on x (N rows); its backward: dx += its input gradient, and
     * the hook's own gradients accumulated when it has them */
    void (*proj_forward)(const struct model *m, int l, enum proj_kind p, float *y, const float *x, int N);
    void (*proj_backward)(const struct model *m, int l, enum proj_kind p, float *dx, const float *dy, const float *x,
                          int N);
    /* the same on a mixture of experts' router logits (N, E) */
    void (*router_forward)(const struct model *m, int l, float *y, const float *x, int N);
    void (*router_backward)(const struct model *m, int l, float *dx, const float *dy, const float *x, int N);
    /* batch-invariant mode (CPU): projection p's weight with the hook's term folded in, the bits a rollout given the
     * merged weights computes with, or NULL when p has no term; model_proj_forward then takes it for the base's and
     * adds no proj_forward term (NULL entry: the terms are added) */
    const float *(*proj_merged)(const struct model *m, int l, enum proj_kind p);
    /* the same for a mixture of experts' router (which 0) and its experts' gate, up and down weights (1, 2, 3: every
     * expert of the shard); the router's and the experts' terms are then not added */
    const float *(*moe_merged)(const struct model *m, int l, int which);
    /* the experts' terms of layer l as the MoE kernels take them (struct kmoe's lora) for a run of nk slots, or NULL */
    const struct kmoe_lora *(*experts)(const struct model *m, int l, size_t nk);
    /* before a backward: the hook's gradients made (zeroed) where they are not yet */
    void (*make_grads)(struct model *m);
    /* by model_free: the hook's state freed */
    void (*release)(struct model *m);
};

struct model {
    struct model_config cfg;
    struct kctx *K;     /* where the model runs: its weights, gradients and activations are K's memory */
    double *rope_freqs; /* (head_dim / 2) RoPE frequencies, scaled as cfg.rope says (K's memory) */
    struct model_shard sh;
    struct model_params w;
    struct model_params *grad;     /* NULL until model_alloc_grads */
    struct model_work *work;       /* arenas and pools reused from batch to batch (model_acts.c) */
    const struct model_hook *hook; /* model_set_hook: an adapter's terms on the projections; NULL: none */
    bool frozen;                   /* model_freeze: the base weights take no gradients */
    float *sink;                   /* frozen: where the norms' weight gradients land, unread (K's memory) */
    struct lora *lora;             /* the LoRA adapter whose hook is installed (lora.h), for LoRA's files and the
                                      trainer: the model's own code never reads it; NULL: none */
    bool offload_acts;             /* with checkpointing: the layer inputs kept for the backward in host memory (pinned
                                      on a GPU), one layer's back on the device at a time (enable_activation_offload) */
    /* model_set_layer_grads_hook: called after each layer's backward (NULL: none) */
    void (*layer_grads_hook)(void *ud, int layer);
    void *layer_grads_ud;
    /* mixture of experts: the router's load-balancing loss, coef x the sum over layers of E / k x sum_e (mean
     * router probability of e) x (tokens routed to e / tokens) (Megatron's switch loss, 1 when balanced), times
     * moe_aux_scale (the trainer's share of a micro-batch), added to every training backward's loss; and what the
     * training forwards routed since model_moe_stats last took it */
    float moe_aux_coef, moe_aux_scale;
    double *moe_tokens; /* (n_layers, E) tokens routed to each expert */
    double moe_aux_sum; /* sum of the layers' aux (without coef) over forwards */
    int moe_aux_n;      /* layer forwards counted in moe_aux_sum */
    /* routing replay (verl's router_replay R3): a training forward over a batch that carries the rollout's experts
     * (packed_batch.routes) routes every token by them instead of its own top-k; the expert weights stay the
     * router's probabilities, so the router still learns */
    bool moe_replay;
    /* a training forward's entropy output gets each row's sum of squared probabilities over the vocabulary instead
     * (verl's sum_pi_squared, at the forward's temperature): for a forward no backward follows */
    bool head_sum_pi_sq;
    double moe_route_differ, moe_route_compared; /* token-layers whose own top-k differed from the rollout's, of */
    uint16_t *const *moe_record;                 /* model_step_record_routes' destinations, or NULL */
    /* decode steps (one new token per sequence) take the back-end's batched KV append and attention where it has
     * them (k_has_decode_batched): one call per layer instead of three per sequence; false only to compare */
    bool decode_per_sequence;
};

/* Install hook h (NULL: none): from now on the projections, the router and the experts add its terms. */
void model_set_hook(struct model *m, const struct model_hook *h);
/* Freeze the base weights (on) or train them again: frozen, the backward accumulates into no gradient of theirs
 * (none is made: model_alloc_grads is not called) and the norms' weight gradients land in a sink that nothing
 * reads; the hook's gradients (make_grads) are what it computes. */
void model_freeze(struct model *m, bool on);

/* Token-layers of the training forwards since the last call whose own top-k experts differed from the batch's
 * recorded ones (packed_batch.routes) into *differ, of *compared; then forgotten. */
void model_moe_route_stats(struct model *m, double *differ, double *compared);
/* From now on each model_step writes the experts it routes each new token to (n_layers x k uint16 per token, layer
 * after layer, the most probable first) at dst[b] + j n_layers k for the j-th new token of sequence b; dst NULL
 * stops. The layers of other pipeline stages are left as they are. */
void model_step_record_routes(struct model *m, uint16_t *const *dst);

/* What the training forwards routed since the last call, then forgotten: per-layer tokens per expert into tokens
 * (n_layers x E, may be NULL) and the mean load-balancing loss per layer and forward (without the coefficient).
 * Returns the forwards' layer count (0: none, or a dense model). */
int model_moe_stats(struct model *m, double *tokens, double *aux_mean);

/* fn(ud, l) after the backward of layer l has queued its parameters' gradients (the top layer first, the
 * embedding's and the head's gradients still to come): what starts a bucket's all-reduce while the backward goes
 * on below. fn NULL: none. */
void model_set_layer_grads_hook(struct model *m, void (*fn)(void *ud, int layer), void *ud);
/* Layer l's parameters (and gradients) in the shard's memory: floats [*lo, *hi) of w.mem (grad->mem). */
void model_layer_span(const struct model *m, int l, size_t *lo, size_t *hi);
/* Layer l's experts (this rank's under EP: their gate, up and down weights, back to back): floats [*lo, *hi) of
 * w.mem; an empty span for a dense layer. */
void model_expert_span(const struct model *m, int l, size_t *lo, size_t *hi);

/* The RoPE frequencies of c (head_dim / 2 of them) into inv_freq. */
void model_rope_freqs(const struct model_config *c, double *inv_freq);
/* The RoPE variant's name: "default", "llama3", "linear". */
const char *model_rope_name(enum rope_kind k);
/* Check a configuration; 0 or -1 with why filled (names the unsupported field). */
int model_config_check(const struct model_config *c, char *why, size_t len);
/* The model's weights fit in this machine's memory (checked before a model is made; a configuration alone, as
 * the planner reads it, may describe a model of any size). 0, or -1 with why naming the sizes and bytes. */
int model_config_check_fits(const struct model_config *c, char *why, size_t len);
/* Allocate parameters (zeroed) for a checked config. */
struct model *model_create(const struct model_config *c);
/* Whether the model splits over tp_size TP ranks: 0, or -1 with why naming `key` (the TP size's config key),
 * the model's numbers and the rule (heads, intermediate size and the experts' moe_intermediate_size divisible by
 * TP; KV heads divisible by TP, or TP by KV heads; at least TP vocabulary rows). */
int model_shard_check(const struct model_config *c, int tp_size, const char *key, char *why, size_t len);
/* Whether attention's heads split over sp_size Ulysses ranks under tp_size TP ranks (1: none): the query heads
 * of a TP rank (heads / tp_size) divisible by sp_size, and its KV heads divisible by it or it by them (then each
 * KV head is replicated on sp_size / its KV heads ranks); a dense model (no experts). 0, or -1 with why naming key
 * (and tp_key, the TP size's key, where TP is above 1) and the numbers. */
int model_sp_check(const struct model_config *c, int sp_size, int tp_size, const char *key, const char *tp_key,
                   char *why, size_t len);
/* Run m's training forwards and backwards sequence-parallel over sp (checked with model_sp_check; NULL or a
 * group of one: off). Every rank of sp passes the same whole packed batch to model_forward and gets every row's
 * log-probs (summed over sp); the backward reads the rows of its slice from the whole dL/dlogp, and each rank's
 * gradients are its tokens' part: their sum over sp is the whole batch's gradient (with a LoRA adapter, the
 * adapter's: its low-rank products run on the rank's tokens like the base projections). With activation offload
 * the layer inputs kept in host memory are the rank's slice. With TP, sp holds ranks of one TP rank, which swap
 * slices of that rank's heads; with PP each stage's group holds the same slices. On the CPU. */
void model_set_sp(struct model *m, struct comm *sp);
/* Whether the experts split over ep_size EP ranks: 0, or -1 with why naming key (the EP size's config key) and the
 * numbers (a mixture-of-experts model whose expert count EP divides; each EP rank's experts split over its TP
 * group by their intermediate rows; with PP each stage's layers split over the EP group of its stage; the CPU
 * back-end). */
int model_ep_check(const struct model_config *c, int ep_size, int tp_size, int pp_size, const char *key, char *why,
                   size_t len);
/* Whether m's training can run context-parallel over cp ranks (key names the setting in the error): a dense model
 * whose query heads are a multiple of its KV heads. */
int model_cp_check(const struct model_config *c, int cp, const char *key, char *why, size_t len);
/* Run m's training forwards and backwards context-parallel over cp (Megatron's CP; NULL or a group of one: off):
 * as model_set_sp (every rank of cp passes the same whole packed batch, gets every row's log-probs and computes its
 * tokens' part of the gradients), but each rank holds the load-balanced chunks r and 2C - 1 - r of the batch's row
 * (padded to a multiple of 2C with a sequence of its own) and each layer's attention runs over the ring
 * (ring_attn_forward / backward) with every head (of its TP rank: with TP, cp holds ranks of one TP rank). CPU
 * only; no shared-prompt packing (packed_batch.prefix_of). */
void model_set_cp(struct model *m, struct comm *cp);
/* Whether the layers split into pp_size stages (at least one layer each): 0, or -1 with why naming key. */
int model_stage_check(const struct model_config *c, int pp_size, const char *key, char *why, size_t len);
/* The shard of a model at lay (checked with model_shard_check and model_stage_check; lay NULL: the whole
 * model), zeroed. */
struct model *model_create_shard(const struct model_config *c, const struct model_layout *lay);
/* The same on context K (kernels/kernels.h; NULL: the CPU). */
struct model *model_create_on(const struct model_config *c, const struct model_layout *lay, struct kctx *K);
/* A new shard like m (same rank and group) holding the same weights (no gradients) and load-balancing settings. */
struct model *model_clone(const struct model *m);
/* The same on context K: a model loaded on the CPU moved to a GPU, or back. */
struct model *model_copy_to(const struct model *m, struct kctx *K);
/* This shard's weights (w.n_floats) to or from host memory, whatever the model's context. */
void model_weights_to_host(const struct model *m, float *dst);
void model_weights_from_host(struct model *m, const float *src);
/* This shard's part of a buffer laid out as the whole model's parameters (whole: model_create's n_floats) into
 * local (m->w.n_floats). */
void model_shard_slice(const struct model *m, const float *whole, float *local);
/* The whole model's buffer from every TP x PP rank's local buffer (collective over m->sh.mp; every rank of it
 * gets the whole). */
void model_shard_assemble(const struct model *m, const float *local, float *whole);
/* The same into root's whole buffer only (mp rank root; the others send their part and may pass NULL): no
 * rank but the root holds more than its part. */
void model_shard_gather(const struct model *m, const float *local, float *whole, int root);
/* Run m's TP, PP and TP x PP collectives over these groups from now on (their NCCL twins on GPUs: the same ranks
 * in the same order); a group m does not use (NULL in m) stays unused. */
void model_set_groups(struct model *m, struct comm *tp, struct comm *pp, struct comm *mp);
/* Parameter floats of the whole model (model_create's n_floats). */
size_t model_whole_floats(const struct model_config *c);
/* Sum the gradients of parameters held twice: over the TP ranks that hold the same KV heads, and between the
 * first and last stages for tied embeddings (a no-op otherwise): once per optimizer step, before the
 * data-parallel reduction. */
void model_shard_sync_grads(struct model *m);
/* Sum of squares of buf[i - lo] for parameters i in [lo, hi) of this shard's buffer that this rank owns (a
 * replicated part counts on one rank), in double: summed over m->sh.mp, a whole-model norm. */
double model_owned_sq(const struct model *m, const float *buf, size_t lo, size_t hi);
/* The spans of this shard's parameters (float offsets of w.mem, in order; *at and *len allocated, the count
 * returned) that a norm summed over its TP and PP ranks skips on this rank with expert parallelism left aside (each
 * EP rank counting its own experts and, ZeRO-1 having split them over DP, its block of the rest): the parts
 * replicated over TP on every TP rank but their owner, and the last stage's copy of a tied embedding. */
int model_tp_unowned_spans(const struct model *m, size_t **at, size_t **len);
void model_free(struct model *m);
/* Set m->offload_acts (it acts on forwards with checkpointing that a backward follows); returns the old value. */
bool model_set_activation_offload(struct model *m, bool on);
/* Random weights: normal(0, std) matrices and embeddings, unit norm weights, zero biases; reproducible from seed. */
void model_init_random(struct model *m, uint64_t seed, double std);
/* Allocate zeroed gradients with the parameters' layout. */
void model_alloc_grads(struct model *m);
/* Free the gradients (model_alloc_grads makes them again, zeroed, when a step needs them): what a rank that also
 * generates gives back to generation between updates. */
void model_free_grads(struct model *m);
/* Give back the buffers one kind of pass keeps from batch to batch (they are taken again on the next pass):
 * MODEL_BUF_TRAIN the forward's activations and the backward's buffers, MODEL_BUF_GEN the decode step's. */
enum { MODEL_BUF_TRAIN = 1, MODEL_BUF_GEN = 2 };
void model_release_buffers(struct model *m, int which);
/* Bytes of one sequence's KV cache of cap positions on this rank (its layers, its KV heads), in the elements of the
 * model's context (k_kv_elem_bytes: BF16 on a GPU's BF16 context). */
size_t kv_slot_bytes(const struct model *m, int cap);
/* How many slots of cap tokens a KV budget of `budget` bytes holds on every rank of m's model copy: the least over
 * its TP x PP ranks (collective over them; their devices' free memory and their shards' layers may differ, and they
 * must admit the same sequences), this rank's alone with expert parallelism or no split. */
size_t kv_slots_fit(const struct model *m, size_t budget, int cap);
void model_zero_grads(struct model *m);
/* Number of parameter floats (tied head counted once). */
size_t model_num_params(const struct model *m);
/* Named parameter tensors of p (weights or grads), HF names, lm_head omitted when tied.
 * Returns the count; refs (may be NULL to count) gets up to max entries. */
int model_param_refs(const struct model *m, const struct model_params *p, struct param_ref *refs, int max);

/* ---- training forward/backward over packed sequences ---- */

/* A packed batch: B sequences laid end to end, no padding. */
struct packed_batch {
    int N, B;
    const int32_t *ids;        /* (N) input tokens */
    const int32_t *targets;    /* (N) next tokens whose log-prob is wanted (any value where unused) */
    const int32_t *pos;        /* (N) position of each token within its sequence */
    const int32_t *cu_seqlens; /* (B+1) */
    /* (B) or NULL: the caller reads logp and entropy only on rows [logp_from[b], cu_seqlens[b + 1]) of each
     * sequence b (a response's predictions, after the prompt), and the LM head runs on those rows alone; the other
     * rows' logp and entropy are 0, and their dlogp and dentropy must be 0. NULL: every row. */
    const int32_t *logp_from;
    /* (B) or NULL: shared-prompt packing. prefix_of[b] = p >= 0: sequence b continues sequence p (a prompt packed
     * once for its group's responses); every row of b sees all of p's rows before its own, causally, and b's
     * positions go on from p's. p has no prefix itself. -1 or NULL: a whole sequence. CPU only for now. */
    const int32_t *prefix_of;
    /* (N, n_layers x k) host memory, or NULL: mixture of experts: the experts each token was routed to when it was
     * generated (the rollout's choice, model_step_record_routes), layer after layer. The forward counts the tokens
     * whose own choice differs (model_moe_route_stats) and, when the model replays (moe_replay), routes by them. */
    const uint16_t *routes;
};

/* Saved activations of one forward, reused by the backward. */
struct model_acts;

/* Forward: logp[i] = log p(targets[i] | ids[..i]) under softmax(logits / temperature), and the
 * entropy of that distribution (entropy may be NULL). With checkpointing only each layer's
 * input is kept and the rest is recomputed in the backward (identical gradients). */
struct model_acts *model_forward(struct model *m, const struct packed_batch *b, float temperature, bool checkpointing,
                                 float *logp, float *entropy);
/* Backward from dL/dlogp (N) and dL/dentropy (N, or NULL): accumulates into m->grad. Frees acts. */
void model_backward(struct model *m, struct model_acts *acts, const float *dlogp, const float *dentropy);
/* One pipeline stage's forward: the first stage embeds b->ids, the others start from x_in (N, D), the previous
 * stage's output; the last stage writes logp and entropy, the others their output to y_out (N, D). */
struct model_acts *model_forward_stage(struct model *m, const struct packed_batch *b, float temperature,
                                       bool checkpointing, const float *x_in, float *y_out, float *logp,
                                       float *entropy);
/* The rows of batch b this rank runs in model_forward_stage (its x_in, y_out, dy and dx are this many rows of D):
 * b->N, or under sequence parallelism this rank's slice of them, under context parallelism its two chunks of the
 * padded ring. The same on every pipeline stage of a CP (and TP) coordinate. */
int model_stage_rows(const struct model *m, const struct packed_batch *b);
/* Its backward: the last stage from dlogp and dentropy, the others from dy (N, D), the next stage's input
 * gradient; every stage but the first writes its input gradient to dx (N, D). Frees acts. */
void model_backward_stage(struct model *m, struct model_acts *acts, const float *dlogp, const float *dentropy,
                          const float *dy, float *dx);
/* Projection p of layer l on this shard: y (N, Dout) = x (N, Din) W^T + b, and its backward (dx, and the
 * weight's gradients, accumulated unless frozen), each with the hook's term after the base's. Every projection of
 * the training forward and backward and of model_step goes through these two. */
void model_proj_forward(const struct model *m, int l, enum proj_kind p, float *y, const float *x, int N);
void model_proj_backward(struct model *m, int l, enum proj_kind p, float *dx, const float *dy, const float *x, int N);
/* Din and Dout of projection p on this shard. */
void model_proj_dims(const struct model *m, enum proj_kind p, int *din, int *dout);
/* A mixture of experts' router of layer l: logits y (N, E) = x (N, D) R^T, and its backward; with the hook's term. */
void model_router_forward(const struct model *m, int l, float *y, const float *x, int N);
void model_router_backward(struct model *m, int l, float *dx, const float *dy, const float *x, int N);
/* The hook's terms on layer l's experts for a run of nk slots (struct kmoe's lora), or NULL. */
const struct kmoe_lora *model_expert_terms(const struct model *m, int l, size_t nk);
/* The experts' weights of layer l a forward multiplies by (W: gate, up, down, the base's on entry): in
 * batch-invariant mode on the CPU (under expert parallelism this rank's experts'), those the hook merged its terms
 * into (struct model_hook's moe_merged), and true: the hook's terms are then not to be added; else false, W
 * unchanged. */
bool model_expert_weights(const struct model *m, int l, const float *W[3]);

/* Free saved activations without a backward (inference-only log-probs). */
void model_acts_free(struct model_acts *a);

/* ---- generation ---- */

/* Key/value cache of one sequence: a slot of a slab. Its elements are the context's KV cache's (k_kv_elem_bytes),
 * written with k_kv_store and read by the attention ops only. */
struct kv_slab;
struct kv_cache {
    int len, cap; /* tokens stored, capacity */
    int n_layers;
    void **k, **v;       /* per layer: (cap, Hkv*hd) in the slab; NULL for the layers of other pipeline stages */
    struct kv_slab *own; /* the one-slot slab of kv_cache_create, freed with it; NULL for a slab's slot */
};

/* The KV caches of n_slots sequences of up to cap tokens each, in one allocation of the model's context:
 * generation takes its slots from one slab and refills finished ones. */
struct kv_slab *kv_slab_create(const struct model *m, int n_slots, int cap);
/* Slot i (0 <= i < n_slots), emptied (len 0) by the caller when it is reused. */
struct kv_cache *kv_slab_slot(struct kv_slab *s, int i);
void kv_slab_free(struct kv_slab *s);

/* A one-slot slab. */
struct kv_cache *kv_cache_create(const struct model *m, int cap);
void kv_cache_free(struct kv_cache *c);
/* Copy src's contents into dst (same model; dst->cap >= src->len): shares a prompt's prefill. */
void kv_cache_copy(const struct model *m, struct kv_cache *dst, const struct kv_cache *src);

/* Run ntok[b] new tokens of each of B sequences (ids packed end to end) through the model,
 * appending their keys and values to caches[b]. logits gets (sum ntok, V) for every new token
 * when all_logits, else (B, V) for each sequence's last new token. logits may be NULL. Collective over the
 * model's TP and PP groups: every rank gets the whole logits. */
void model_step(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids, float *logits,
                bool all_logits);

/* model_step that also writes, when hidden_last is not NULL, each sequence's last new token's hidden state after
 * the final norm (B, D): a sequence-classification head (a reward model's score) reads it. */
void model_step_hidden(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids,
                       float *logits, bool all_logits, float *hidden_last);

/* model_step whose logits (B, V: each sequence's last new token) stay in the model's context (device memory on a
 * GPU), on every rank of the model's groups: generation samples from them there. Valid until the next step. */
const float *model_step_logits(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids);

/* Logits of every position of one sequence (T, V), via model_step on a fresh cache. */
void model_logits(struct model *m, const int32_t *ids, int T, float *logits);

/* Decode steps (one new token per sequence) replayed as graphs where the context has them (CUDA graphs: one launch
 * a step instead of one per kernel; model_step.c), on by default; off (actor_rollout_ref.rollout.enforce_eager), every
 * step runs eagerly. Process-wide; the same tokens and log-probs either way, bit for bit. */
void model_set_decode_graphs(bool on);

#endif
