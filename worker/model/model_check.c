/* The checks a configuration and a layout pass before a model is made: the model's sizes and RoPE (and its
 * frequencies), whether its weights fit the machine, and whether it splits over TP, PP, EP, Ulysses SP and CP
 * ranks. Each refusal names the key and the numbers; nothing here allocates a model. */
#include "model.h"

#include <math.h>
#include <stdio.h>

#include "fit.h"
#include "kernels/kernels.h"

int model_config_check(const struct model_config *c, char *why, size_t len)
{
    if (c->vocab_size < 2 || c->hidden_size < 1 || c->intermediate_size < 1 || c->n_layers < 1 || c->n_heads < 1 ||
        c->n_kv_heads < 1 || c->head_dim < 2) {
        snprintf(why, len, "sizes must be positive (vocab %d, hidden %d, intermediate %d, layers %d, heads %d/%d)",
                 c->vocab_size, c->hidden_size, c->intermediate_size, c->n_layers, c->n_heads, c->n_kv_heads);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        snprintf(why, len, "num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", c->n_heads,
                 c->n_kv_heads);
        return -1;
    }
    if (c->head_dim % 2 != 0) {
        snprintf(why, len, "head_dim (%d) must be even for rotary embeddings", c->head_dim);
        return -1;
    }
    if (!(c->rope_theta > 0) || !(c->rms_norm_eps > 0)) {
        snprintf(why, len, "rope_theta (%g) and rms_norm_eps (%g) must be positive", c->rope_theta, c->rms_norm_eps);
        return -1;
    }
    if (c->n_experts != 0 && (c->n_experts < 1 || c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts ||
                              c->moe_intermediate < 1)) {
        snprintf(why, len,
                 "mixture of experts: num_experts (%d) and moe_intermediate_size (%d) must be positive and "
                 "num_experts_per_tok (%d) between 1 and num_experts",
                 c->n_experts, c->moe_intermediate, c->n_experts_per_tok);
        return -1;
    }
    if (c->max_position_embeddings < 1) {
        snprintf(why, len, "max_position_embeddings (%d) must be positive: it bounds a prompt plus its response",
                 c->max_position_embeddings);
        return -1;
    }
    return 0;
}

void model_rope_freqs(const struct model_config *c, double *inv_freq)
{
    const int half = c->head_dim / 2;
    khost_rope_default_freqs(inv_freq, c->head_dim, c->rope_theta);
    const struct rope_scaling *r = &c->rope;
    if (r->kind == ROPE_LINEAR) {
        for (int i = 0; i < half; i++)
            inv_freq[i] /= r->factor;
    } else if (r->kind == ROPE_LLAMA3) {
        /* transformers' _compute_llama3_parameters: wavelengths longer than original / low_freq_factor are
         * stretched by factor, shorter than original / high_freq_factor kept, and those between blended */
        const double old = r->original_max_position_embeddings;
        const double low_wl = old / r->low_freq_factor, high_wl = old / r->high_freq_factor;
        for (int i = 0; i < half; i++) {
            const double f = inv_freq[i], wl = 2 * M_PI / f;
            if (wl > low_wl) {
                inv_freq[i] = f / r->factor;
            } else if (wl >= high_wl) {
                const double smooth = (old / wl - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor);
                inv_freq[i] = (1 - smooth) * f / r->factor + smooth * f;
            }
        }
    }
}

const char *model_rope_name(enum rope_kind k)
{
    return k == ROPE_LLAMA3 ? "llama3" : k == ROPE_LINEAR ? "linear" : "default";
}

int model_config_check_fits(const struct model_config *c, char *why, size_t len)
{
    /* before anything is allocated: absurd but in-range sizes would otherwise fail inside calloc */
    const double need = model_weight_bytes(c);
    const uint64_t mem = machine_memory_bytes();
    if (need > (double)mem) {
        snprintf(why, len,
                 "the weights need %.0f bytes (hidden_size %d, intermediate_size %d, num_hidden_layers %d, "
                 "vocab_size %d, num_attention_heads %d x head_dim %d), more than the machine's memory, %llu bytes",
                 need, c->hidden_size, c->intermediate_size, c->n_layers, c->vocab_size, c->n_heads, c->head_dim,
                 (unsigned long long)mem);
        return -1;
    }
    return 0;
}

int model_ep_check(const struct model_config *c, int ep, int tp, int pp, const char *key, char *why, size_t len)
{
    if (ep <= 1)
        return 0;
    if (!c->n_experts) {
        snprintf(why, len, "%s (%d): the model is dense (no experts to split); set it to 1", key, ep);
        return -1;
    }
    if (c->n_experts % ep != 0) {
        snprintf(why, len, "%s (%d) does not divide the model's num_experts (%d): each EP rank holds E / EP experts",
                 key, ep, c->n_experts);
        return -1;
    }
    (void)tp; /* EP x TP: each EP rank's experts split over its TP group, tokens dispatched within a TP rank */
    (void)pp; /* each pipeline stage's MoE layers dispatch over the EP group of its stage */
    return 0;
}

int model_shard_check(const struct model_config *c, int tp, const char *key, char *why, size_t len)
{
    if (tp < 1) {
        snprintf(why, len, "%s (%d) must be >= 1", key, tp);
        return -1;
    }
    if (c->n_heads % tp != 0) {
        snprintf(why, len, "num_attention_heads (%d) is not divisible by %s (%d)", c->n_heads, key, tp);
        return -1;
    }
    if (c->n_kv_heads % tp != 0 && tp % c->n_kv_heads != 0) {
        snprintf(why, len,
                 "num_key_value_heads (%d) and %s (%d): one must divide the other (KV heads are split over the TP "
                 "ranks, or each is replicated on TP / KV heads of them)",
                 c->n_kv_heads, key, tp);
        return -1;
    }
    if (c->n_experts && c->moe_intermediate % tp != 0) { /* each expert split by rows like the dense MLP */
        snprintf(why, len, "moe_intermediate_size (%d) is not divisible by %s (%d): each expert splits over TP",
                 c->moe_intermediate, key, tp);
        return -1;
    }
    if (c->intermediate_size % tp != 0) {
        snprintf(why, len, "intermediate_size (%d) is not divisible by %s (%d)", c->intermediate_size, key, tp);
        return -1;
    }
    if (c->vocab_size < tp) {
        snprintf(why, len, "vocab_size (%d) is smaller than %s (%d)", c->vocab_size, key, tp);
        return -1;
    }
    return 0;
}

int model_stage_check(const struct model_config *c, int pp, const char *key, char *why, size_t len)
{
    if (pp < 1 || pp > c->n_layers) {
        snprintf(why, len, "%s (%d) must be between 1 and num_hidden_layers (%d): every stage holds a layer", key, pp,
                 c->n_layers);
        return -1;
    }
    return 0;
}

int model_sp_check(const struct model_config *c, int sp, int tp, const char *key, const char *tp_key, char *why,
                   size_t len)
{
    if (sp < 1) {
        snprintf(why, len, "%s (%d) must be at least 1", key, sp);
        return -1;
    }
    if (sp == 1)
        return 0;
    if (tp < 1)
        tp = 1;
    if (tp == 1) {
        if (c->n_heads % sp != 0) {
            snprintf(why, len,
                     "num_attention_heads (%d) is not divisible by %s (%d): each rank attends with a share of the "
                     "heads",
                     c->n_heads, key, sp);
            return -1;
        }
        if (c->n_kv_heads % sp != 0 && sp % c->n_kv_heads != 0) {
            snprintf(why, len,
                     "num_key_value_heads (%d) and %s (%d) do not divide one another: KV heads are split over the "
                     "ranks, or each replicated on %s / num_key_value_heads of them",
                     c->n_kv_heads, key, sp, key);
            return -1;
        }
        return 0;
    }
    /* with TP each rank holds heads / TP query heads and its KV heads (one, shared, when there are fewer KV heads
     * than TP ranks): the all-to-all swaps those, so it is they that split over the SP ranks */
    const int hq = c->n_heads / tp, hkv = c->n_kv_heads >= tp ? c->n_kv_heads / tp : 1;
    if (c->n_heads % tp != 0 || hq % sp != 0) {
        snprintf(why, len,
                 "num_attention_heads (%d) over %s (%d) leaves %d query heads a TP rank, not divisible by %s (%d): "
                 "each SP rank attends with a share of its TP rank's heads",
                 c->n_heads, tp_key, tp, hq, key, sp);
        return -1;
    }
    if (hkv % sp != 0 && sp % hkv != 0) {
        snprintf(why, len,
                 "num_key_value_heads (%d) over %s (%d) leaves %d KV heads a TP rank, which %s (%d) does not divide "
                 "nor is divided by: a TP rank's KV heads are split over the SP ranks, or each replicated on "
                 "several of them",
                 c->n_kv_heads, tp_key, tp, hkv, key, sp);
        return -1;
    }
    return 0;
}

int model_cp_check(const struct model_config *c, int cp, const char *key, char *why, size_t len)
{
    if (cp < 1) {
        snprintf(why, len, "%s (%d) must be at least 1", key, cp);
        return -1;
    }
    if (cp == 1)
        return 0;
    if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads != 0) {
        snprintf(why, len, "%s (%d): num_attention_heads (%d) is not a multiple of num_key_value_heads (%d)", key, cp,
                 c->n_heads, c->n_kv_heads);
        return -1;
    }
    return 0;
}
