/* The model families this trainer implements, in one table: each family's names
 * in the files that describe a model (transformers' config.json "model_type"
 * and "architectures", GGUF's general.architecture) and the properties that
 * set it apart (a fixed q/k/v bias, per-head q/k norms, the keys its
 * config.json carries, llama.cpp's q/k row order). */
#ifndef GRPO_WORKER_MODEL_ARCH_H
#define GRPO_WORKER_MODEL_ARCH_H

#include <stdbool.h>
#include <stddef.h>

enum model_arch { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_QWEN3_MOE, ARCH_MIXTRAL };

struct model_arch_info {
    enum model_arch arch;
    const char *model_type;  /* config.json "model_type", also the family's name: "llama", "qwen2", "qwen3" */
    const char *hf_class;    /* config.json "architectures"[0]: "LlamaForCausalLM"... */
    const char *gguf_name;   /* GGUF general.architecture, or NULL when a GGUF file of the family is not read */
    bool qkv_bias_always;    /* q/k/v bias whatever config.json says (Qwen2) */
    bool qk_norm;            /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    bool has_sliding_window; /* its config.json has use_sliding_window (written false; true is refused) */
    bool has_mlp_bias;       /* its config.json has mlp_bias (written false) */
    bool gguf_qk_permuted;   /* llama.cpp stores q/k rows of each head interleaved, to be undone */
    /* mixture of experts: the MLP's tensor names under model.layers.N. (NULL: a dense MLP): the block, its router,
     * and each expert's gate, up and down projections */
    const char *moe_block, *moe_router, *moe_gate, *moe_up, *moe_down;
};

/* The family a, which must be one of enum model_arch. */
const struct model_arch_info *model_arch_info(enum model_arch a);
/* The family whose config.json model_type is name, or NULL. */
const struct model_arch_info *model_arch_by_model_type(const char *name);
/* The family whose GGUF general.architecture is name, or NULL (also for a family with no GGUF import). */
const struct model_arch_info *model_arch_by_gguf_name(const char *name);
/* Whether a model_type names a mixture-of-experts family that is refused (known, not supported). */
bool model_arch_is_moe(const char *model_type);
/* The names a lookup accepts, ", "-separated, into out: config.json model_types (gguf false) or GGUF
 * architectures (gguf true). Returns out. */
const char *model_arch_list(bool gguf, char *out, size_t len);
/* The family's name: "llama", "qwen2", "qwen3". */
const char *model_arch_name(enum model_arch a);

#endif
