/* Llama / Qwen2 decoder-only transformer on the CPU (fp32): parameters in one
 * allocation, packed (padding-free) forward and backward for training, and a
 * KV-cache step for generation.
 *
 * Shapes: D hidden, F intermediate, V vocab, Hq query heads, Hkv key/value
 * heads, hd head dim, N packed tokens, B sequences. */
#ifndef GRPO_WORKER_MODEL_H
#define GRPO_WORKER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum model_arch { ARCH_LLAMA, ARCH_QWEN2 };

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
    int max_position_embeddings;
    int bos_token_id, eos_token_id; /* -1 if unknown */
};

/* Weights of one decoder layer; pointers into the model's single buffer. */
struct layer_params {
    float *attn_norm;     /* (D) input_layernorm */
    float *wq, *wk, *wv;  /* (Hq*hd, D), (Hkv*hd, D), (Hkv*hd, D) */
    float *bq, *bk, *bv;  /* (Hq*hd), (Hkv*hd), (Hkv*hd) or NULL */
    float *wo;            /* (D, Hq*hd) */
    float *mlp_norm;      /* (D) post_attention_layernorm */
    float *w_gate, *w_up; /* (F, D) */
    float *w_down;        /* (D, F) */
};

/* All parameters (or all gradients: same layout) in one allocation. */
struct model_params {
    float *mem; /* the single buffer, n_floats long */
    size_t n_floats;
    float *embed; /* (V, D) */
    struct layer_params *layers;
    float *final_norm; /* (D) */
    float *lm_head;    /* (V, D); == embed when tied */
};

/* One named parameter tensor, in Hugging Face naming. */
struct param_ref {
    char name[96];
    float *data;
    int n_dims;
    int64_t shape[2];
    size_t numel;
};

struct model {
    struct model_config cfg;
    struct model_params w;
    struct model_params *grad; /* NULL until model_alloc_grads */
};

/* Check a configuration; 0 or -1 with why filled (names the unsupported field). */
int model_config_check(const struct model_config *c, char *why, size_t len);
/* The model's weights fit in this machine's memory (checked before a model is made; a configuration alone, as
 * the planner reads it, may describe a model of any size). 0, or -1 with why naming the sizes and bytes. */
int model_config_check_fits(const struct model_config *c, char *why, size_t len);
/* Allocate parameters (zeroed) for a checked config. */
struct model *model_create(const struct model_config *c);
void model_free(struct model *m);
/* Random weights: normal(0, std) matrices and embeddings, unit norm weights, zero biases; reproducible from seed. */
void model_init_random(struct model *m, uint64_t seed, double std);
/* Allocate zeroed gradients with the parameters' layout. */
void model_alloc_grads(struct model *m);
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
/* Free saved activations without a backward (inference-only log-probs). */
void model_acts_free(struct model_acts *a);

/* ---- generation ---- */

/* Key/value cache of one sequence. */
struct kv_cache {
    int len, cap; /* tokens stored, capacity */
    int n_layers;
    float **k, **v; /* per layer: (cap, Hkv*hd) */
};

struct kv_cache *kv_cache_create(const struct model *m, int cap);
void kv_cache_free(struct kv_cache *c);
/* Copy src's contents into dst (same model; dst->cap >= src->len): shares a prompt's prefill. */
void kv_cache_copy(const struct model *m, struct kv_cache *dst, const struct kv_cache *src);

/* Run ntok[b] new tokens of each of B sequences (ids packed end to end) through the model,
 * appending their keys and values to caches[b]. logits gets (sum ntok, V) for every new token
 * when all_logits, else (B, V) for each sequence's last new token. logits may be NULL. */
void model_step(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids, float *logits,
                bool all_logits);

/* Logits of every position of one sequence (T, V), via model_step on a fresh cache. */
void model_logits(struct model *m, const int32_t *ids, int T, float *logits);

#endif
