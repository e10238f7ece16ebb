#include "model_io.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/json_file.h"
#include "common/check.h"
#include "common/fs.h"
#include "common/log.h"
#include "worker/model/arch.h"
#include "worker/formats/gguf.h"
#include "worker/formats/safetensors.h"

#define ERR(...) error_set(err, errlen, __VA_ARGS__)

static int json_int(json_t *root, const char *key, int def, int *out, const char *path, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (def == -999)
            return ERR("%s: missing required key '%s'", path, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return ERR("%s: '%s' must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < INT32_MIN || x > INT32_MAX) /* would wrap to some other, plausible size */
        return ERR("%s: '%s' = %lld is out of range (at most %d)", path, key, (long long)x, INT32_MAX);
    *out = (int)x;
    return 0;
}

static int json_num(json_t *root, const char *key, double def, float *out, const char *path, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = (float)def;
        return 0;
    }
    if (!json_is_number(v))
        return ERR("%s: '%s' must be a number", path, key);
    *out = (float)json_number_value(v);
    return 0;
}

static int json_flag(json_t *root, const char *key, int def, bool *out, const char *path, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return ERR("%s: '%s' must be true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

/* eos_token_id may be an int or a list (first entry is used). */
static int json_token_id(json_t *root, const char *key)
{
    json_t *v = json_object_get(root, key);
    if (json_is_array(v) && json_array_size(v) > 0)
        v = json_array_get(v, 0);
    return json_is_integer(v) ? (int)json_integer_value(v) : -1;
}

/* A rope_scaling (transformers 4) or rope_parameters (transformers 5) object into r. 0, or -1 with err naming
 * the type or the field. */
static int parse_rope_scaling(json_t *rs, const char *path, struct rope_scaling *r, char *err, size_t errlen)
{
    const char *rt = json_string_value(json_object_get(rs, "rope_type"));
    if (!rt)
        rt = json_string_value(json_object_get(rs, "type"));
    memset(r, 0, sizeof *r);
    if (!rt || strcmp(rt, "default") == 0)
        return 0;
    float f = 0, lo = 0, hi = 0;
    int orig = 0;
    if (strcmp(rt, "llama3") == 0) {
        r->kind = ROPE_LLAMA3;
        if (json_num(rs, "factor", -1, &f, path, err, errlen) ||
            json_num(rs, "low_freq_factor", -1, &lo, path, err, errlen) ||
            json_num(rs, "high_freq_factor", -1, &hi, path, err, errlen) ||
            json_int(rs, "original_max_position_embeddings", -1, &orig, path, err, errlen))
            return -1;
        if (!(f > 0) || !(lo > 0) || !(hi > lo) || orig < 1)
            return ERR("%s: rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                       "original_max_position_embeddings >= 1 (got %g, %g, %g, %d)",
                       path, (double)f, (double)lo, (double)hi, orig);
    } else if (strcmp(rt, "linear") == 0) {
        r->kind = ROPE_LINEAR;
        if (json_num(rs, "factor", -1, &f, path, err, errlen))
            return -1;
        if (!(f > 0))
            return ERR("%s: rope_scaling linear needs factor > 0 (got %g)", path, (double)f);
    } else {
        return ERR("%s: rope_scaling type '%s' is not supported (supported: default, llama3, linear)", path, rt);
    }
    r->factor = f;
    r->low_freq_factor = lo;
    r->high_freq_factor = hi;
    r->original_max_position_embeddings = orig;
    return 0;
}

/* The mixture-of-experts keys of config.json: Qwen3-MoE's num_experts (or num_local_experts), moe_intermediate_size and
 * norm_topk_prob (every layer sparse), Mixtral's num_local_experts with intermediate_size per expert (always
 * renormalised). */
static int parse_moe(json_t *root, const struct model_arch_info *fam, const char *path, struct model_config *c,
                     char *err, size_t errlen)
{
    if (json_int(root, "num_experts_per_tok", -999, &c->n_experts_per_tok, path, err, errlen))
        return -1;
    if (fam->arch == ARCH_MIXTRAL) {
        c->moe_intermediate = c->intermediate_size;
        c->norm_topk_prob = true;
        json_t *sw = json_object_get(root, "sliding_window");
        if (sw && !json_is_null(sw))
            return ERR("%s: sliding_window=%lld is not supported (null: full attention)", path,
                       (long long)json_integer_value(sw));
        return json_int(root, "num_local_experts", -999, &c->n_experts, path, err, errlen);
    }
    int step = 1;
    /* the Hub's Qwen3-MoE files say num_experts; transformers 5 writes num_local_experts */
    const char *ne = json_object_get(root, "num_experts") ? "num_experts" : "num_local_experts";
    if (json_int(root, ne, -999, &c->n_experts, path, err, errlen) ||
        json_int(root, "moe_intermediate_size", -999, &c->moe_intermediate, path, err, errlen) ||
        json_flag(root, "norm_topk_prob", 0, &c->norm_topk_prob, path, err, errlen) ||
        json_int(root, "decoder_sparse_step", 1, &step, path, err, errlen))
        return -1;
    json_t *dense = json_object_get(root, "mlp_only_layers");
    if (step != 1 || (json_is_array(dense) && json_array_size(dense) > 0))
        return ERR("%s: decoder_sparse_step %d and mlp_only_layers of %zu layers: only models whose every layer is "
                   "sparse (decoder_sparse_step 1, mlp_only_layers []) are supported",
                   path, step, json_is_array(dense) ? json_array_size(dense) : (size_t)0);
    return 0;
}

int model_config_from_hf_json(const char *path, struct model_config *c, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_file_load(path, &je);
    if (!root)
        return ERR("%s:%d: cannot read config.json: %s", path, je.line, je.text);
    int rc = -1;
    memset(c, 0, sizeof *c);
    const char *type = json_string_value(json_object_get(root, "model_type"));
    if (!type) {
        ERR("%s: missing 'model_type'", path);
        goto out;
    }
    const struct model_arch_info *fam = model_arch_by_model_type(type);
    if (!fam) {
        char names[128];
        model_arch_list(false, names, sizeof names);
        if (model_arch_is_moe(type))
            ERR("%s: model_type '%s' is a mixture-of-experts model: not supported yet (supported: the dense "
                "families %s)",
                path, type, names);
        else
            ERR("%s: model_type '%s' is not supported (supported: %s)", path, type, names);
        goto out;
    }
    c->arch = fam->arch;
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu") != 0) {
        ERR("%s: hidden_act '%s' is not supported (only silu)", path, act);
        goto out;
    }
    /* transformers 5 keeps RoPE settings in "rope_parameters"; older files use "rope_theta" + "rope_scaling" */
    json_t *rp = json_object_get(root, "rope_parameters");
    json_t *rs = json_object_get(root, "rope_scaling");
    if (json_is_object(rp) && (!rs || json_is_null(rs)))
        rs = rp;
    if (rs && !json_is_null(rs) && parse_rope_scaling(rs, path, &c->rope, err, errlen) != 0)
        goto out;
    json_t *mb = json_object_get(root, "mlp_bias");
    if (json_is_true(mb)) {
        ERR("%s: mlp_bias=true is not supported", path);
        goto out;
    }
    if (fam->has_sliding_window && json_is_true(json_object_get(root, "use_sliding_window"))) {
        ERR("%s: use_sliding_window=true is not supported", path);
        goto out;
    }
    if (json_int(root, "vocab_size", -999, &c->vocab_size, path, err, errlen) ||
        json_int(root, "hidden_size", -999, &c->hidden_size, path, err, errlen) ||
        json_int(root, "intermediate_size", -999, &c->intermediate_size, path, err, errlen) ||
        json_int(root, "num_hidden_layers", -999, &c->n_layers, path, err, errlen) ||
        json_int(root, "num_attention_heads", -999, &c->n_heads, path, err, errlen) ||
        json_int(root, "num_key_value_heads", c->n_heads, &c->n_kv_heads, path, err, errlen) ||
        json_int(root, "max_position_embeddings", 2048, &c->max_position_embeddings, path, err, errlen) ||
        json_num(json_is_object(rp) && json_object_get(rp, "rope_theta") ? rp : root, "rope_theta", 10000.0,
                 &c->rope_theta, path, err, errlen) ||
        json_num(root, "rms_norm_eps", 1e-6, &c->rms_norm_eps, path, err, errlen) ||
        json_flag(root, "tie_word_embeddings", 0, &c->tie_word_embeddings, path, err, errlen))
        goto out;
    if (c->n_heads <= 0) {
        ERR("%s: num_attention_heads must be positive", path);
        goto out;
    }
    if (json_int(root, "head_dim", c->hidden_size / c->n_heads, &c->head_dim, path, err, errlen))
        goto out;
    if (fam->qkv_bias_always)
        c->attention_bias = true; /* Qwen2 always has q/k/v bias */
    else if (json_flag(root, "attention_bias", 0, &c->attention_bias, path, err, errlen))
        goto out;
    c->qk_norm = fam->qk_norm; /* Qwen3 norms each head's q and k */
    if (fam->moe_block && parse_moe(root, fam, path, c, err, errlen) != 0)
        goto out;
    c->bos_token_id = json_token_id(root, "bos_token_id");
    c->eos_token_id = json_token_id(root, "eos_token_id");
    char why[256];
    if (model_config_check(c, why, sizeof why) != 0) {
        ERR("%s: %s", path, why);
        goto out;
    }
    rc = 0;
out:
    json_decref(root);
    return rc;
}

int model_config_write_hf_json(const struct model_config *c, const char *path, char *err, size_t errlen)
{
    const struct model_arch_info *fam = model_arch_info(c->arch);
    json_t *o = json_object();
    json_object_set_new(o, "architectures", json_pack("[s]", fam->hf_class));
    json_object_set_new(o, "model_type", json_string(fam->model_type));
    json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->n_layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->n_heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->n_kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
    json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    if (!fam->qkv_bias_always)
        json_object_set_new(o, "attention_bias", json_boolean(c->attention_bias));
    if (fam->has_mlp_bias)
        json_object_set_new(o, "mlp_bias", json_false());
    if (fam->has_sliding_window)
        json_object_set_new(o, "use_sliding_window", json_false());
    if (c->rope.kind == ROPE_DEFAULT) {
        json_object_set_new(o, "rope_scaling", json_null());
    } else {
        json_t *rs = json_object();
        json_object_set_new(rs, "rope_type", json_string(model_rope_name(c->rope.kind)));
        json_object_set_new(rs, "factor", json_real(c->rope.factor));
        if (c->rope.kind == ROPE_LLAMA3) {
            json_object_set_new(rs, "low_freq_factor", json_real(c->rope.low_freq_factor));
            json_object_set_new(rs, "high_freq_factor", json_real(c->rope.high_freq_factor));
            json_object_set_new(rs, "original_max_position_embeddings",
                                json_integer(c->rope.original_max_position_embeddings));
        }
        json_object_set_new(o, "rope_scaling", rs);
    }
    if (c->bos_token_id >= 0)
        json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
    if (c->eos_token_id >= 0)
        json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
    if (fam->arch == ARCH_MIXTRAL) {
        json_object_set_new(o, "num_local_experts", json_integer(c->n_experts));
        json_object_set_new(o, "num_experts_per_tok", json_integer(c->n_experts_per_tok));
        json_object_set_new(o, "sliding_window", json_null());
    } else if (fam->arch == ARCH_QWEN3_MOE) {
        json_object_set_new(o, "num_experts", json_integer(c->n_experts));
        json_object_set_new(o, "num_experts_per_tok", json_integer(c->n_experts_per_tok));
        json_object_set_new(o, "moe_intermediate_size", json_integer(c->moe_intermediate));
        json_object_set_new(o, "norm_topk_prob", json_boolean(c->norm_topk_prob));
        json_object_set_new(o, "decoder_sparse_step", json_integer(1));
        json_object_set_new(o, "mlp_only_layers", json_array());
    }
    json_object_set_new(o, "torch_dtype", json_string("float32"));
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    if (!text)
        return ERR("%s: cannot encode the config JSON", path);
    int rc = fs_write_atomic(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

/* A loaded tensor must be finite: NaN or infinite weights make every gradient non-finite, so every optimizer step
 * of a run would be skipped. 0, or -1 with err naming the file and the tensor. */
static int check_finite(const float *x, size_t n, const char *file, const char *tensor, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            size_t bad = 0;
            for (size_t j = i; j < n; j++)
                bad += !isfinite(x[j]);
            return ERR("%s: tensor '%s' holds %zu non-finite value(s) (the first, %g, at element %zu of %zu): corrupt "
                       "weights (a diverged run's checkpoint?) cannot be trained or sampled",
                       file, tensor, bad, (double)x[i], i, n);
        }
    return 0;
}

/* The layer index of a tensor name PREFIX<index>.<rest>, or -1. */
static int layer_of(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0)
        return -1;
    const char *p = name + n;
    long v = 0;
    if (*p < '0' || *p > '9')
        return -1;
    while (*p >= '0' && *p <= '9' && v < 100000000)
        v = v * 10 + (*p++ - '0');
    return *p == '.' ? (int)v : -1;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static struct model *load_hf(const char *dir, bool backbone, char *err, size_t errlen)
{
    char path[4096];
    struct model_config cfg = {0};
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (model_config_from_hf_json(path, &cfg, err, errlen) != 0)
        return NULL;
    if (backbone) /* a classification head replaces the LM head: none is read (lm_head is the embedding) */
        cfg.tie_word_embeddings = true;
    char why[512];
    if (model_config_check_fits(&cfg, why, sizeof why) != 0) {
        ERR("%s: %s", path, why);
        return NULL;
    }
    struct st_model *st = st_model_open(dir, err, errlen);
    if (!st)
        return NULL;
    struct model *m = model_create(&cfg);
    int n = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *refs = xcalloc((size_t)n, sizeof *refs);
    model_param_refs(m, &m->w, refs, n);
    for (int i = 0; i < n; i++) {
        const struct st_file *f;
        const struct st_tensor_info *t = st_model_find(st, refs[i].name, &f);
        if (!t) {
            snprintf(err, errlen, "%s: tensor '%s' is missing", dir, refs[i].name);
            goto fail;
        }
        bool ok = (int)t->n_dims == refs[i].n_dims && t->shape[0] == refs[i].shape[0] &&
                  (refs[i].n_dims == 1 || t->shape[1] == refs[i].shape[1]);
        if (!ok) {
            snprintf(err, errlen, "%s: tensor '%s' has shape [%lld, %lld], config.json implies [%lld, %lld]",
                     st_path(f), refs[i].name, (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0),
                     (long long)refs[i].shape[0], (long long)(refs[i].n_dims > 1 ? refs[i].shape[1] : 0));
            goto fail;
        }
        if (st_tensor_to_f32(f, t, refs[i].data, err, errlen) != 0 ||
            check_finite(refs[i].data, refs[i].numel, st_path(f), refs[i].name, err, errlen) != 0)
            goto fail;
    }
    /* a layer the configuration leaves out would be dropped silently */
    for (int i = 0; i < st_model_num_tensors(st); i++) {
        const struct st_file *f;
        const struct st_tensor_info *t = st_model_tensor(st, i, &f);
        int l = layer_of(t->name, "model.layers.");
        if (l >= cfg.n_layers) {
            snprintf(err, errlen,
                     "%s: num_hidden_layers is %d, but %s holds tensor '%s' of layer %d: the configuration must "
                     "describe every layer of the weights",
                     path, cfg.n_layers, st_path(f), t->name, l);
            goto fail;
        }
    }
    free(refs);
    st_model_close(st);
    return m;
fail:
    free(refs);
    st_model_close(st);
    model_free(m);
    return NULL;
}

struct model *model_load_hf(const char *dir, char *err, size_t errlen) { return load_hf(dir, false, err, errlen); }

struct model *model_load_hf_backbone(const char *dir, char *err, size_t errlen)
{
    return load_hf(dir, true, err, errlen);
}

/* GGUF tensor names of the HF parameters (llama.cpp's naming). */
static void gguf_name_of(const char *hf, char *out, size_t len)
{
    int l;
    char rest[96];
    static const char *const map[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    if (strcmp(hf, "model.embed_tokens.weight") == 0)
        snprintf(out, len, "token_embd.weight");
    else if (strcmp(hf, "model.norm.weight") == 0)
        snprintf(out, len, "output_norm.weight");
    else if (strcmp(hf, "lm_head.weight") == 0)
        snprintf(out, len, "output.weight");
    else if (sscanf(hf, "model.layers.%d.%95s", &l, rest) == 2) { // NOLINT(cert-err34-c): names from our own table
        snprintf(out, len, "?");
        for (size_t i = 0; i < sizeof map / sizeof *map; i++)
            if (strcmp(rest, map[i][0]) == 0)
                snprintf(out, len, "blk.%d.%s", l, map[i][1]);
    } else
        snprintf(out, len, "?");
}

/* llama.cpp stores each head's q/k rows interleaved (pairs), transformers in two halves; undo that. */
static void unpermute_rows(float *w, int n_heads, int head_dim, int cols)
{
    const size_t row = (size_t)cols, half = (size_t)head_dim / 2;
    float *tmp = xmalloc(((size_t)head_dim * row + 1) * sizeof(float));
    for (int h = 0; h < n_heads; h++) {
        float *blk = w + (size_t)h * head_dim * row;
        memcpy(tmp, blk, (size_t)head_dim * row * sizeof(float));
        for (size_t i = 0; i < half; i++)
            for (int s = 0; s < 2; s++)
                memcpy(blk + (s * half + i) * row, tmp + (2 * i + s) * row, row * sizeof(float));
    }
    free(tmp);
}

static int gguf_meta_int(const struct gguf_file *g, const char *arch, const char *key, int def, int *out, char *err,
                         size_t errlen)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int64_t v;
    if (gguf_get_int(g, k, &v) != 0) {
        if (def == -999)
            return ERR("%s: missing metadata key '%s'", gguf_path(g), k);
        v = def;
    }
    if (v < INT32_MIN || v > INT32_MAX) /* would wrap to some other, plausible size */
        return ERR("%s: metadata key '%s' = %lld is out of range (at most %d)", gguf_path(g), k, (long long)v,
                   INT32_MAX);
    *out = (int)v;
    return 0;
}

static float gguf_meta_float(const struct gguf_file *g, const char *arch, const char *key, double def)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    double v;
    return gguf_get_float(g, k, &v) == 0 ? (float)v : (float)def;
}

static int config_from_gguf(const struct gguf_file *g, struct model_config *c, char *err, size_t errlen)
{
    const char *path = gguf_path(g);
    const char *arch = gguf_get_str(g, "general.architecture");
    memset(c, 0, sizeof *c);
    if (!arch)
        return ERR("%s: missing 'general.architecture'", path);
    const struct model_arch_info *fam = model_arch_by_gguf_name(arch);
    if (!fam) {
        char names[128];
        return ERR("%s: architecture '%s' is not supported (supported: %s)", path, arch,
                   model_arch_list(true, names, sizeof names));
    }
    c->arch = fam->arch;
    char k[128];
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    const char *scaling = gguf_get_str(g, k);
    if (scaling && strcmp(scaling, "none") != 0)
        return ERR("%s: rope scaling '%s' is not supported", path, scaling);
    if (gguf_meta_int(g, arch, "embedding_length", -999, &c->hidden_size, err, errlen) ||
        gguf_meta_int(g, arch, "block_count", -999, &c->n_layers, err, errlen) ||
        gguf_meta_int(g, arch, "feed_forward_length", -999, &c->intermediate_size, err, errlen) ||
        gguf_meta_int(g, arch, "attention.head_count", -999, &c->n_heads, err, errlen) ||
        gguf_meta_int(g, arch, "context_length", 2048, &c->max_position_embeddings, err, errlen))
        return -1;
    if (gguf_meta_int(g, arch, "attention.head_count_kv", c->n_heads, &c->n_kv_heads, err, errlen))
        return -1;
    if (c->n_heads <= 0)
        return ERR("%s: attention.head_count must be positive", path);
    if (gguf_meta_int(g, arch, "attention.key_length", c->hidden_size / c->n_heads, &c->head_dim, err, errlen))
        return -1;
    c->rope_theta = gguf_meta_float(g, arch, "rope.freq_base", 10000.0);
    c->rms_norm_eps = gguf_meta_float(g, arch, "attention.layer_norm_rms_epsilon", 1e-6);
    const struct gguf_tensor_info *emb = gguf_find_tensor(g, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return ERR("%s: tensor 'token_embd.weight' is missing or not 2-D", path);
    if (emb->dims[1] > INT32_MAX)
        return ERR("%s: tensor 'token_embd.weight' has %llu rows, more than a vocabulary can have", path,
                   (unsigned long long)emb->dims[1]);
    c->vocab_size = (int)emb->dims[1];
    c->tie_word_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    c->attention_bias = gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    int64_t v;
    c->bos_token_id = gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v) == 0 ? (int)v : -1;
    c->eos_token_id = gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v) == 0 ? (int)v : -1;
    char why[256];
    if (model_config_check(c, why, sizeof why) != 0)
        return ERR("%s: %s", path, why);
    return 0;
}

struct model *model_load_gguf(const char *path, char *err, size_t errlen)
{
    struct gguf_file *g = gguf_open(path, err, errlen);
    if (!g)
        return NULL;
    struct model_config cfg = {0};
    char why[512];
    if (config_from_gguf(g, &cfg, err, errlen) != 0 ||
        (model_config_check_fits(&cfg, why, sizeof why) != 0 && ERR("%s: %s", path, why))) {
        gguf_close(g);
        return NULL;
    }
    struct model *m = model_create(&cfg);
    int n = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *refs = xcalloc((size_t)n, sizeof *refs);
    model_param_refs(m, &m->w, refs, n);
    for (int i = 0; i < n; i++) {
        char gname[128];
        gguf_name_of(refs[i].name, gname, sizeof gname);
        const struct gguf_tensor_info *t = gguf_find_tensor(g, gname);
        if (!t) {
            snprintf(err, errlen, "%s: tensor '%s' (for %s) is missing", path, gname, refs[i].name);
            goto fail;
        }
        /* ggml dims are reversed: dims[0] is the row length */
        uint64_t want0 = refs[i].n_dims == 2 ? (uint64_t)refs[i].shape[1] : (uint64_t)refs[i].shape[0];
        uint64_t want1 = refs[i].n_dims == 2 ? (uint64_t)refs[i].shape[0] : 1;
        if (t->n_elements != refs[i].numel || t->dims[0] != want0 || (t->n_dims > 1 && t->dims[1] != want1)) {
            snprintf(err, errlen, "%s: tensor '%s' has %llu elements, the metadata implies %zu", path, gname,
                     (unsigned long long)t->n_elements, refs[i].numel);
            goto fail;
        }
        if (gguf_tensor_to_f32(g, t, refs[i].data, err, errlen) != 0 ||
            check_finite(refs[i].data, refs[i].numel, path, gname, err, errlen) != 0)
            goto fail;
        const bool permuted = model_arch_info(cfg.arch)->gguf_qk_permuted;
        if (permuted && strstr(refs[i].name, "q_proj.weight"))
            unpermute_rows(refs[i].data, cfg.n_heads, cfg.head_dim, cfg.hidden_size);
        if (permuted && strstr(refs[i].name, "k_proj.weight"))
            unpermute_rows(refs[i].data, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_size);
    }
    /* a block the metadata leaves out would be dropped silently */
    for (int i = 0; i < gguf_num_tensors(g); i++) {
        const struct gguf_tensor_info *t = gguf_tensor(g, i);
        int l = layer_of(t->name, "blk.");
        if (l >= cfg.n_layers) {
            snprintf(err, errlen,
                     "%s: %s.block_count is %d, but the file holds tensor '%s' of block %d: the metadata must "
                     "describe every block of the weights",
                     path, gguf_get_str(g, "general.architecture"), cfg.n_layers, t->name, l);
            goto fail;
        }
    }
    free(refs);
    gguf_close(g);
    return m;
fail:
    free(refs);
    gguf_close(g);
    model_free(m);
    return NULL;
}

struct model *model_load(const char *path, char *err, size_t errlen)
{
    if (is_dir(path))
        return model_load_hf(path, err, errlen);
    size_t n = strlen(path);
    if (n > 5 && strcmp(path + n - 5, ".gguf") == 0)
        return model_load_gguf(path, err, errlen);
    snprintf(err, errlen, "%s: not a model directory (config.json + *.safetensors) nor a .gguf file", path);
    return NULL;
}

int model_save_hf(const struct model *m, const char *dir, int bf16, char *err, size_t errlen)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ERR("%s: cannot create directory: %s", dir, check_errno_text());
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (model_config_write_hf_json(&m->cfg, path, err, errlen) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *gen = json_object();
    if (m->cfg.bos_token_id >= 0)
        json_object_set_new(gen, "bos_token_id", json_integer(m->cfg.bos_token_id));
    if (m->cfg.eos_token_id >= 0)
        json_object_set_new(gen, "eos_token_id", json_integer(m->cfg.eos_token_id));
    char *text = json_dumps(gen, JSON_INDENT(2));
    json_decref(gen);
    if (!text)
        return ERR("%s: cannot encode the JSON", path);
    int rc = fs_write_atomic(path, text, strlen(text), err, errlen);
    free(text);
    if (rc != 0)
        return -1;
    int n = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *refs = xcalloc((size_t)n, sizeof *refs);
    struct st_write_tensor *ts = xcalloc((size_t)n, sizeof *ts);
    model_param_refs(m, &m->w, refs, n);
    for (int i = 0; i < n; i++)
        ts[i] = (struct st_write_tensor){refs[i].name, refs[i].shape, refs[i].n_dims, refs[i].data,
                                         bf16 ? ST_BF16 : ST_F32};
    const struct st_kv meta[] = {{"format", "pt"}};
    /* shards of 2 GB, as transformers' save_pretrained would for larger models */
    rc = st_write_sharded(dir, ts, (size_t)n, meta, 1, 2000000000ull, NULL, err, errlen);
    free(ts);
    free(refs);
    return rc;
}
