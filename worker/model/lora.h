/* LoRA adapters on a model's linear projections, in PEFT's layout and numerics.
 *
 * A targeted projection p of layer l computes y = x W^T (+ b) + s (x A^T) B^T with A (r, Din), B (Dout, r) and
 * s = alpha / r (PEFT's scale; not rsLoRA). The base weights stay frozen: with an adapter attached the model's
 * backward accumulates into the adapter's gradients only (no gradient buffer for the base exists), and the
 * optimizer covers the adapter alone (model_trainable). Every A and B sits in one buffer of the model's context
 * (KMEM_WEIGHTS), their gradients in a second one of the same layout (KMEM_GRADS).
 *
 * The reference policy is the base model: the same model with the adapter bypassed (lora_set_bypass), so the base
 * weights are held once.
 *
 * On disk an adapter is PEFT's: adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha,
 * target_modules, ...) and adapter_model.safetensors holding
 * base_model.model.model.layers.{l}.self_attn.q_proj.lora_A.weight (r, Din) and ...lora_B.weight (Dout, r) for
 * each targeted projection (q/k/v/o_proj under self_attn, gate/up/down_proj under mlp). On a mixture of experts
 * the MLP targets are the experts' (struct lora_layer) and all-linear adds the router's, named as PEFT names its
 * target_parameters on transformers' fused experts (lora_refs).
 *
 * Under training tensor and pipeline parallelism the adapters are sharded like the projections they wrap: a
 * column-parallel projection (q/k/v/gate/up, W split by rows) has its B split by the same rows and its A whole on
 * every TP rank; a row-parallel one (o/down, W split by columns) its A split by the same columns and its B whole.
 * The forward adds s (x A^T) B^T to each rank's part (a row-parallel rank's partial output, summed with the rest by
 * the TP all-reduce that follows). The gradients of the whole matrices are partial sums on each TP rank, summed
 * over the TP group (lora_sync_grads), so that the replicated parts step alike everywhere. A stage holds its layers'
 * adapters. EP ranks hold their experts' adapters. On disk, in checkpoints and in weight syncs the adapter is
 * always the whole one (lora_mp_gather, lora_mp_slice); a new one is drawn whole and sliced, the same adapter
 * whatever the layout. Not yet: EP with TP or PP, or the experts' or router's adapters under TP or PP. */
#ifndef GRPO_WORKER_LORA_H
#define GRPO_WORKER_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

#define LORA_ALL_LINEAR ((1u << PROJ_KINDS) - 1u)

struct lora_config {
    int rank;         /* r >= 1 */
    double alpha;     /* scale = alpha / r */
    unsigned targets; /* bit 1 << p for each enum proj_kind that gets an adapter */
    bool router;      /* a mixture of experts: the router (mlp.gate) too, as PEFT's all-linear does */
};

/* One layer's adapter matrices (NULL where the projection is not a target). On a mixture of experts the MLP
 * targets are the experts' (PEFT's target_parameters on transformers' fused experts, struct kmoe_lora's layout):
 * gate_proj and up_proj together one adapter of rank 2r on gate_up_proj, down_proj one of rank r. */
struct lora_layer {
    float *A[PROJ_KINDS]; /* (r, Din) */
    float *B[PROJ_KINDS]; /* (Dout, r) */
    float *Agu, *Bgu;     /* experts: (El 2r, D), (2F, 2r El) */
    float *Ad, *Bd;       /* experts: (El r, F), (D, r El) */
    float *Ar, *Br;       /* the router: (r, D), (E, r) */
};

struct lora {
    struct lora_config cfg;
    float scale; /* alpha / r */
    bool bypass; /* run as the base model (reference log-probs) */
    int n_layers;
    size_t n;                 /* floats of every A and B */
    float *mem;               /* the adapter (n floats, context memory) */
    float *grad;              /* its gradients (same layout), NULL until model_trainable */
    struct lora_layer *w, *g; /* (n_layers) pointers into mem and grad */
    float *scratch;           /* per-projection products: (N, r) x 2 and (N, Dout) */
    size_t scratch_cap;       /* floats */
    struct kmoe_lora *moe;    /* (n_layers) the experts' adapters as the MoE kernels take them; NULL without */
    struct lora_merged *bi; /* batch-invariant mode's merged weights, per layer its projections', router's and experts',
                               made when first asked for (lora_attach.c); NULL until then */
    char base[4096];        /* the base model's path or name (adapter_config.json's base_model_name_or_path) */
};

/* "q_proj" ... "down_proj", and its module ("self_attn" or "mlp"). */
const char *lora_proj_name(enum proj_kind p);
const char *lora_proj_module(enum proj_kind p);
/* The targets as PEFT lists them: "q_proj, v_proj" (all seven: "all-linear"). Returns buf. */
const char *lora_targets_text(unsigned targets, char *buf, size_t len);

/* Attach a zeroed adapter to m (a whole model or a shard: its part of the adapter; at most one adapter): m's base
 * frozen (model_freeze) and the adapter installed as its projection hook. 0, or -1 with err. */
int lora_attach(struct model *m, const struct lora_config *c, char *err, size_t errlen);
/* The adapter the configuration asks for (actor_rollout_ref.model.lora_rank, lora_alpha, target_modules), new and
 * initialised from data.seed, or loaded from actor_rollout_ref.model.lora_adapter_path; base_path is the base
 * model's (for adapter_config.json). 0 (also when LoRA is off: nothing attached), or -1 with err. */
struct grpo_config;
int lora_attach_config(struct model *m, const struct grpo_config *cfg, const char *base_path, char *err, size_t errlen);
/* PEFT's initialisation, reproducible from seed: A kaiming-uniform (bound 1 / sqrt(Din), torch's
 * kaiming_uniform_ with a = sqrt(5)), B zero: the model starts as the base. */
void lora_init(struct model *m, uint64_t seed);
/* Run as the base model (bypass true) or with the adapter again. No-op without an adapter. */
void lora_set_bypass(struct model *m, bool bypass);

/* The adapter is the model's projection hook (struct model_hook, installed by lora_attach): targeted projection p
 * of layer l adds s (x A^T) B^T to the base's y, and in the backward dx += s (dy B) A and, once the gradients exist,
 * dB += s dy^T (x A^T), dA += s (dy B)^T x; the router's likewise, and the experts' terms go to the MoE kernels
 * (struct kmoe_lora). Nothing while bypassed. On a TP shard with this rank's parts (dx, and the whole matrix's
 * gradient, partial: summed over TP by the model's all-reduce and by lora_sync_grads). */

/* On a mixture of experts, where the adapter sits: " (the MLP's on each of the 4 experts, gate and up as one
 * gate_up_proj adapter of rank 2r; and the router)"; "" otherwise. Returns buf. */
const char *lora_moe_text(const struct model *m, char *buf, size_t len);
/* Whether a target_modules list says all-linear (on a mixture of experts the router is adapted then too). */
bool lora_names_all_linear(const char *list);

/* What the optimizer trains: the adapter when one is attached, else every parameter of the shard. The gradients
 * are allocated (zeroed) on first use. */
struct trainable {
    float *params, *grads;
    size_t n;
};
struct trainable model_trainable(struct model *m);
void model_trainable_zero_grads(struct model *m);

/* Named adapter tensors (PEFT names, A and B of each targeted projection, layer by layer) over buf (the adapter or
 * its gradients' layout; a shard's parts, each with its place in the whole tensor and whether this rank owns it, as
 * struct param_ref says). Returns the count; refs may be NULL to count. */
int lora_refs(const struct model *m, const float *buf, struct param_ref *refs, int max);

/* PEFT's adapter_config.json of dir: rank, alpha and targets (and the base model's name, may be NULL). 0, or -1
 * with err naming the file and field (a non-LoRA adapter, rsLoRA, DoRA, biases or modules other than the
 * projections are refused). */
int lora_read_config(const char *dir, struct lora_config *c, char *base, size_t base_len, char *err, size_t errlen);
/* Save m's adapter (a whole model's) into dir (created): adapter_config.json (base_model_name_or_path = base, or the
 * adapter's own when base is NULL) and adapter_model.safetensors, each atomically. 0, or -1 with err. */
int lora_save(const struct model *m, const char *dir, const char *base, char *err, size_t errlen);
/* Load the adapter in dir into m (a shard: its part): attached first when m has none, else its rank and targets
 * must match. 0, or -1 with err. */
int lora_load(struct model *m, const char *dir, char *err, size_t errlen);
/* Merge the adapter into the base weights (W += s B A) and detach it: m is then a plain model, saved with
 * model_save_hf as a merged export. */
void lora_merge(struct model *m);
/* m's weights (a whole model, or a shard's part: each adapter's part merged into its weight's part, the same
 * floats as the whole model's there) with its adapter merged (W + s B A; the base alone while bypassed or without
 * an adapter) into out, host memory of m's weights' layout (w.n_floats); m is unchanged. The rollout TP's engines
 * generate with these, sharded like any weights. */
void lora_merged_weights(const struct model *m, float *out);
/* Expert parallelism (m holds experts [expert_lo, expert_lo + n_experts) of each layer, so its adapter holds
 * theirs; everything else is whole on every EP rank):
 * lora_expert_span: layer l's experts' adapter floats [lo, hi) in the adapter's buffer (lo == hi: none);
 * lora_owned_sq: the sum of squares of g (the adapter's layout, m's context's memory) counting the dense parts on EP
 * rank 0 only (summed over the EP group it is the whole adapter's). */
void lora_expert_span(const struct model *m, int l, size_t *lo, size_t *hi);
/* Layer l's experts' floats [lo, hi) in model_trainable's buffer: the adapter's with LoRA, else the weights'. */
void trainable_expert_span(const struct model *m, int l, size_t *lo, size_t *hi);
double lora_owned_sq(const struct model *m, const float *g);
/* The sum of squares of buf[i - lo] (m's context's memory) for the floats i in [lo, hi) of m's adapter buffer that
 * this rank owns (struct param_ref's owner: a part whole on several TP or EP ranks counts on one), in double: summed
 * over m's model copy (sh.mp), the whole adapter's. */
double lora_owned_sq_range(const struct model *m, const float *buf, size_t lo, size_t hi);
/* Training TP: the adapter gradients' partial sums summed over the TP group, in place (the whole matrices: a
 * column-parallel projection's A, a row-parallel one's B; with replicated KV heads, k's and v's B over the ranks
 * that share them); once per optimizer step, before the data-parallel sum. Nothing without TP. */
void lora_sync_grads(struct model *m);
/* The floats of the whole adapter (every layer, row, column and expert: PEFT's, one process's layout). */
size_t lora_whole_floats(const struct model *m);
/* Collective over m's model copy (its EP group, or its TP x PP ranks, sh.mp): every rank's local (its adapter's
 * layout, host memory) into whole (the whole adapter's layout; NULL: this rank only sends); a whole model's is a
 * copy. */
void lora_mp_gather(const struct model *m, const float *local, float *whole);
/* This rank's part of a whole adapter (host memory) into local (its layout, host memory). */
void lora_mp_slice(const struct model *m, const float *whole, float *local);

/* Free m's adapter (model_free calls it). */
void lora_detach(struct model *m);

#endif
