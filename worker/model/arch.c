#include "worker/model/arch.h"

#include <stdio.h>
#include <string.h>

static const struct model_arch_info families[] = {
    {.arch = ARCH_LLAMA,
     .model_type = "llama",
     .hf_class = "LlamaForCausalLM",
     .gguf_name = "llama",
     .has_mlp_bias = true,
     .gguf_qk_permuted = true},
    {.arch = ARCH_QWEN2,
     .model_type = "qwen2",
     .hf_class = "Qwen2ForCausalLM",
     .gguf_name = "qwen2",
     .qkv_bias_always = true,
     .has_sliding_window = true},
    {.arch = ARCH_QWEN3,
     .model_type = "qwen3",
     .hf_class = "Qwen3ForCausalLM",
     .gguf_name = NULL,
     .qk_norm = true,
     .has_sliding_window = true},
    {.arch = ARCH_QWEN3_MOE,
     .model_type = "qwen3_moe",
     .hf_class = "Qwen3MoeForCausalLM",
     .gguf_name = NULL,
     .qk_norm = true,
     .has_sliding_window = true,
     .moe_block = "mlp",
     .moe_router = "gate",
     .moe_gate = "gate_proj",
     .moe_up = "up_proj",
     .moe_down = "down_proj"},
    {.arch = ARCH_MIXTRAL,
     .model_type = "mixtral",
     .hf_class = "MixtralForCausalLM",
     .gguf_name = NULL,
     .moe_block = "block_sparse_moe",
     .moe_router = "gate",
     .moe_gate = "w1",
     .moe_up = "w3",
     .moe_down = "w2"},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

/* Mixture-of-experts families not implemented: recognised to be refused in plain words (Qwen2-MoE has shared
 * experts). */
static const char *const moe_types[] = {"qwen2_moe"};

const struct model_arch_info *model_arch_info(enum model_arch a)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (families[i].arch == a)
            return &families[i];
    return &families[0];
}

const struct model_arch_info *model_arch_by_model_type(const char *name)
{
    for (size_t i = 0; name && i < N_FAMILIES; i++)
        if (strcmp(families[i].model_type, name) == 0)
            return &families[i];
    return NULL;
}

const struct model_arch_info *model_arch_by_gguf_name(const char *name)
{
    for (size_t i = 0; name && i < N_FAMILIES; i++)
        if (families[i].gguf_name && strcmp(families[i].gguf_name, name) == 0)
            return &families[i];
    return NULL;
}

bool model_arch_is_moe(const char *model_type)
{
    for (size_t i = 0; model_type && i < sizeof moe_types / sizeof moe_types[0]; i++)
        if (strcmp(moe_types[i], model_type) == 0)
            return true;
    return false;
}

const char *model_arch_list(bool gguf, char *out, size_t len)
{
    size_t k = 0;
    if (len)
        out[0] = '\0';
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const char *name = gguf ? families[i].gguf_name : families[i].model_type;
        if (!name || k >= len)
            continue;
        int n = snprintf(out + k, len - k, "%s%s", k ? ", " : "", name);
        k += n > 0 ? (size_t)n : 0;
    }
    return out;
}

const char *model_arch_name(enum model_arch a) { return model_arch_info(a)->model_type; }
