/* LoRA adapters as PEFT makes them: its initialisation (drawn whole, a shard keeping its part), its files
 * (adapter_config.json, read refusing what is not a plain LoRA, and written; adapter_model.safetensors, the whole
 * adapter, saved and loaded into a shard's part), and the adapter a run's configuration asks for (new, or loaded). */
#include "lora_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/json_file.h"
#include "kernels/kernels.h"
#include "model_internal.h"
#include "sampler.h"
#include "worker/formats/safetensors.h"

#define ERR(...) error_set(err, errlen, __VA_ARGS__)

void lora_init(struct model *m, uint64_t seed)
{
    struct lora *a = m->lora;
    if (!a)
        return;
    /* the whole adapter is drawn, in its own order, and this rank keeps its part (its stage's layers, its rows or
     * columns under TP, its experts under EP): the same adapter whatever the layout */
    const struct model_config *mc = &m->cfg;
    const struct model_shard one = lora_whole_shard(mc);
    const size_t nw = lora_layout_over(mc, &one, &a->cfg, NULL, NULL);
    float *whole = xcalloc(nw ? nw : 1, sizeof(float));
    struct lora_layer *wl = xcalloc((size_t)mc->n_layers, sizeof *wl);
    lora_layout_over(mc, &one, &a->cfg, whole, wl);
    struct rng r;
    rng_seed(&r, seed, 0x10a);
    for (int l = 0; l < mc->n_layers; l++)
        for (int p = 0; p < PROJ_KINDS; p++) {
            if (!wl[l].A[p])
                continue;
            int din, dout;
            model_shard_proj_dims(mc, &one, (enum proj_kind)p, &din, &dout);
            /* torch's kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / 6), bound gain sqrt(3 / fan_in) = 1/sqrt(Din) */
            const double bound = 1.0 / sqrt((double)din);
            float *A = wl[l].A[p];
            for (size_t i = 0; i < (size_t)a->cfg.rank * (size_t)din; i++)
                A[i] = (float)((2.0 * rng_uniform(&r) - 1.0) * bound);
        }
    /* the experts' and the router's A: PEFT's one Linear of (rows, Din) each, the same bound, expert after expert */
    const size_t rk = (size_t)a->cfg.rank, D = (size_t)mc->hidden_size, F = (size_t)mc->moe_intermediate;
    const int E = mc->n_experts;
    for (int l = 0; l < mc->n_layers; l++) {
        const struct lora_layer *L = &wl[l];
        const struct {
            float *A;
            int blocks; /* experts (1: the router) */
            size_t rows, din;
        } as[] = {{L->Agu, E, 2 * rk, D}, {L->Ad, E, rk, F}, {L->Ar, 1, rk, D}};
        for (size_t k = 0; k < sizeof as / sizeof *as; k++) {
            if (!as[k].A)
                continue;
            const double bound = 1.0 / sqrt((double)as[k].din);
            const size_t n = (size_t)as[k].blocks * as[k].rows * as[k].din;
            for (size_t i = 0; i < n; i++)
                as[k].A[i] = (float)((2.0 * rng_uniform(&r) - 1.0) * bound);
        }
    }
    float *host = xcalloc(a->n ? a->n : 1, sizeof(float));
    lora_mp_slice(m, whole, host);
    k_to_device(m->K, a->mem, host, a->n * sizeof(float));
    free(host);
    free(wl);
    free(whole);
}

int lora_attach_config(struct model *m, const struct grpo_config *cfg, const char *base_path, char *err, size_t errlen)
{
    if (cfg->arr_model_lora_adapter_path[0]) {
        if (lora_load(m, cfg->arr_model_lora_adapter_path, err, errlen) != 0)
            return -1;
    } else if (cfg->arr_model_lora_rank > 0) {
        struct lora_config c = {.rank = (int)cfg->arr_model_lora_rank, .alpha = cfg->arr_model_lora_alpha};
        char why[512];
        if (config_lora_mask(cfg, &c.targets, why, sizeof why) != 0)
            return ERR("%s", why);
        c.router = lora_names_all_linear(cfg->arr_model_target_modules);
        if (lora_attach(m, &c, err, errlen) != 0)
            return -1;
        lora_init(m, (uint64_t)cfg->data_seed);
    } else {
        return 0;
    }
    snprintf(m->lora->base, sizeof m->lora->base, "%s", base_path ? base_path : "");
    return 0;
}

/* A key that must be absent, null, false, empty or equal to `off` (a string) for a plain LoRA. */
static int off_or_absent(json_t *root, const char *key, const char *off, const char *path, char *err, size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || json_is_false(v) || (json_is_object(v) && json_object_size(v) == 0) ||
        (json_is_array(v) && json_array_size(v) == 0) ||
        (off && json_is_string(v) && strcmp(json_string_value(v), off) == 0))
        return 0;
    return ERR("%s: %s is set; only plain LoRA adapters load here (no rsLoRA, DoRA, biases, per-layer patterns or "
               "extra trained modules)",
               path, key);
}

/* A pattern object (rank_pattern, alpha_pattern): empty, or PEFT's one entry for the fused gate_up_proj of
 * transformers' experts with the value want (twice r or alpha: the two projections' adapters side by side). */
static int fused_pattern(json_t *root, const char *key, double want, bool gate_up, const char *path, char *err,
                         size_t errlen)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0))
        return gate_up ? ERR("%s: target_parameters names gate_up_proj but %s has no entry for it (PEFT writes "
                             "twice the rank and alpha there)",
                             path, key)
                       : 0;
    const char *k;
    json_t *e;
    if (gate_up && json_is_object(v) && json_object_size(v) == 1)
        json_object_foreach(v, k, e) if (strstr(k, "gate_up_proj") && json_is_number(e) &&
                                         json_number_value(e) == want) return 0;
    return ERR("%s: %s is set; only PEFT's own entry for the experts' fused gate_up_proj (%g) loads here (no per-layer "
               "ranks or alphas)",
               path, key, want);
}

/* target_parameters: PEFT's names for the parameters of transformers' fused experts and router (gate_up_proj,
 * down_proj, gate.weight), into c's targets. */
static int read_target_parameters(json_t *root, const char *path, struct lora_config *c, char *err, size_t errlen)
{
    json_t *tp = json_object_get(root, "target_parameters");
    bool gate_up = false;
    if (tp && !json_is_null(tp)) {
        if (!json_is_array(tp))
            return ERR("%s: target_parameters must be a list", path);
        size_t i;
        json_t *e;
        json_array_foreach(tp, i, e)
        {
            const char *name = json_is_string(e) ? json_string_value(e) : "?";
            const size_t n = strlen(name);
#define ENDS(s) (n >= strlen(s) && strcmp(name + n - strlen(s), s) == 0)
            if (ENDS("gate_up_proj"))
                c->targets |= 1u << PROJ_GATE | 1u << PROJ_UP, gate_up = true;
            else if (ENDS("down_proj"))
                c->targets |= 1u << PROJ_DOWN;
            else if (ENDS("gate.weight"))
                c->router = true;
            else
                return ERR("%s: target_parameters names %s; only the experts' gate_up_proj and down_proj and the "
                           "router's gate.weight load here",
                           path, name);
#undef ENDS
        }
    }
    if (!c->targets && !c->router)
        return ERR("%s: target_modules and target_parameters name nothing to adapt", path);
    if (fused_pattern(root, "rank_pattern", 2.0 * c->rank, gate_up, path, err, errlen) != 0 ||
        fused_pattern(root, "alpha_pattern", 2.0 * c->alpha, gate_up, path, err, errlen) != 0)
        return -1;
    return 0;
}

int lora_read_config(const char *dir, struct lora_config *c, char *base, size_t base_len, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_error_t je;
    json_t *root = json_file_load(path, &je);
    if (!root)
        return ERR("%s: %s (line %d)", path, je.text, je.line);
    int rc = -1;
    json_t *type = json_object_get(root, "peft_type"), *r = json_object_get(root, "r");
    json_t *alpha = json_object_get(root, "lora_alpha"), *tm = json_object_get(root, "target_modules");
    if (!json_is_string(type) || strcmp(json_string_value(type), "LORA") != 0) {
        ERR("%s: peft_type is %s, not LORA", path, json_is_string(type) ? json_string_value(type) : "missing");
        goto out;
    }
    if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > 65536) {
        ERR("%s: r must be an integer between 1 and 65536", path);
        goto out;
    }
    if (!json_is_number(alpha) || !(json_number_value(alpha) > 0)) {
        ERR("%s: lora_alpha must be a positive number", path);
        goto out;
    }
    static const char *const off_keys[] = {
        "use_rslora",       "use_dora",        "fan_in_fan_out",      "modules_to_save",
        "lora_bias",        "exclude_modules", "layers_to_transform", "trainable_token_indices",
        "layer_replication"};
    for (size_t i = 0; i < sizeof off_keys / sizeof *off_keys; i++)
        if (off_or_absent(root, off_keys[i], NULL, path, err, errlen) != 0)
            goto out;
    if (off_or_absent(root, "bias", "none", path, err, errlen) != 0)
        goto out;
    char list[512] = "";
    json_t *tp = json_object_get(root, "target_parameters");
    if ((json_is_array(tm) && json_array_size(tm) == 0) && json_is_array(tp) && json_array_size(tp) > 0) {
        /* only the experts (target_parameters, read below): the mask is filled there */
        snprintf(list, sizeof list, "q_proj");
    } else if (json_is_string(tm)) {
        snprintf(list, sizeof list, "%s", json_string_value(tm));
    } else if (json_is_array(tm)) {
        size_t i;
        json_t *e;
        json_array_foreach(tm, i, e)
        {
            /* peft matches by suffix and writes "all-linear" out as module paths: model.layers.0.mlp.gate_proj
             * (a layer missing one is caught by lora_load: its tensors are missing) */
            const char *name = json_is_string(e) ? json_string_value(e) : "?", *dot = strrchr(name, '.');
            const size_t at = strlen(list);
            snprintf(list + at, sizeof list - at, "%s%s", at ? "," : "", dot ? dot + 1 : name);
        }
    }
    char why[256];
    if (config_lora_targets(list, &c->targets, why, sizeof why) != 0) {
        ERR("%s: %s", path, why);
        goto out;
    }
    if (json_is_array(tm) && json_array_size(tm) == 0)
        c->targets = 0;
    c->rank = (int)json_integer_value(r);
    c->alpha = json_number_value(alpha);
    c->router = false;
    if (read_target_parameters(root, path, c, err, errlen) != 0)
        goto out;
    json_t *bm = json_object_get(root, "base_model_name_or_path");
    if (base && base_len)
        snprintf(base, base_len, "%s", json_is_string(bm) ? json_string_value(bm) : "");
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* A number as PEFT writes it: an integer when it is one. */
static json_t *json_num(double v)
{
    return v == floor(v) && fabs(v) < 1e9 ? json_integer((json_int_t)v) : json_real(v);
}

static int write_config(const struct lora *a, bool moe, const char *path, const char *base, char *err, size_t errlen)
{
    json_t *o = json_object();
    json_t *tm = json_array(), *tp = json_array();
    for (int p = 0; p < PROJ_KINDS; p++)
        if (a->cfg.targets & (1u << p) && !(moe && (LORA_MLP & (1u << p))))
            json_array_append_new(tm, json_string(lora_proj_name((enum proj_kind)p)));
    /* a mixture of experts: PEFT's target_parameters on transformers' fused experts, gate_up_proj's rank and alpha
     * twice r and alpha (the same scale) */
    const bool gate_up = moe && (a->cfg.targets & (1u << PROJ_GATE));
    if (moe && (a->cfg.targets & (1u << PROJ_DOWN)))
        json_array_append_new(tp, json_string("down_proj"));
    if (gate_up)
        json_array_append_new(tp, json_string("gate_up_proj"));
    if (moe && a->cfg.router)
        json_array_append_new(tp, json_string("gate.weight"));
    json_t *rp = json_object(), *ap = json_object();
    if (gate_up) {
        json_object_set_new(rp, ".*\\.gate_up_proj", json_integer(2 * a->cfg.rank));
        json_object_set_new(ap, ".*\\.gate_up_proj", json_num(2 * a->cfg.alpha));
    }
    const double al = a->cfg.alpha;
    json_object_set_new(o, "alpha_pattern", ap);
    json_object_set_new(o, "base_model_name_or_path", json_string(base ? base : ""));
    json_object_set_new(o, "bias", json_string("none"));
    json_object_set_new(o, "fan_in_fan_out", json_false());
    json_object_set_new(o, "inference_mode", json_true());
    json_object_set_new(o, "init_lora_weights", json_true());
    json_object_set_new(o, "layers_pattern", json_null());
    json_object_set_new(o, "layers_to_transform", json_null());
    json_object_set_new(o, "lora_alpha", json_num(al));
    json_object_set_new(o, "lora_dropout", json_real(0.0));
    json_object_set_new(o, "modules_to_save", json_null());
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "r", json_integer(a->cfg.rank));
    json_object_set_new(o, "rank_pattern", rp);
    json_object_set_new(o, "revision", json_null());
    json_object_set_new(o, "target_modules", tm);
    json_object_set_new(o, "target_parameters", tp);
    json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(o, "use_dora", json_false());
    json_object_set_new(o, "use_rslora", json_false());
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    int rc = fs_write_atomic(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

int lora_save(const struct model *m, const char *dir, const char *base, char *err, size_t errlen)
{
    if (!m->lora)
        return ERR("the model has no LoRA adapter to save");
    if (m->sh.mp || m->sh.ep)
        return ERR("lora_save: the model is a shard (TP %d, PP %d, EP %d): gather its whole adapter first "
                   "(lora_mp_gather)",
                   m->sh.tp_size, m->sh.pp_size, m->sh.ep_size);
    if (fs_mkdir_p(dir) != 0)
        return ERR("%s: cannot create directory: %s", dir, check_errno_text());
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (write_config(m->lora, m->cfg.n_experts > 0, path, base ? base : m->lora->base, err, errlen) != 0)
        return -1;
    float *host;
    struct param_ref *refs;
    const int n = lora_host_refs(m, &host, &refs);
    struct st_write_tensor *ts = xcalloc((size_t)(n ? n : 1), sizeof *ts);
    for (int i = 0; i < n; i++)
        ts[i] = (struct st_write_tensor){refs[i].name, refs[i].shape, 2, refs[i].data, ST_F32};
    const struct st_kv meta[] = {{"format", "pt"}};
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int rc = st_write(path, ts, (size_t)n, meta, 1, err, errlen);
    free(ts);
    free(refs);
    free(host);
    return rc;
}

int lora_load(struct model *m, const char *dir, char *err, size_t errlen)
{
    struct lora_config c = {0};
    char base[4096];
    if (lora_read_config(dir, &c, base, sizeof base, err, errlen) != 0)
        return -1;
    if (!m->lora) {
        if (lora_attach(m, &c, err, errlen) != 0)
            return -1;
        snprintf(m->lora->base, sizeof m->lora->base, "%s", base);
    }
    if (!m->lora)
        return ERR("%s: no adapter attached", dir);
    const struct lora_config *have = &m->lora->cfg;
    if (have->rank != c.rank || have->targets != c.targets || have->router != (c.router && m->cfg.n_experts)) {
        char a[128], b[128];
        return ERR("%s: rank %d on %s, but the model's adapter has rank %d on %s", dir, c.rank,
                   lora_targets_text(c.targets, a, sizeof a), have->rank,
                   lora_targets_text(have->targets, b, sizeof b));
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    struct st_file *f = st_open(path, err, errlen);
    if (!f)
        return -1;
    /* the file holds the whole adapter: read whole, then this rank's part of it (a shard's rows, columns, layers or
     * experts) */
    const struct model_shard one = lora_whole_shard(&m->cfg);
    const size_t nw = lora_layout_over(&m->cfg, &one, have, NULL, NULL);
    float *whole = xcalloc(nw ? nw : 1, sizeof(float));
    int n;
    struct param_ref *refs = lora_refs_alloc(&m->cfg, &one, have, whole, &n);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const struct st_tensor_info *t = st_find(f, refs[i].name);
        if (!t)
            rc = ERR("%s: tensor %s is missing", path, refs[i].name);
        else if (t->n_dims != 2 || t->shape[0] != refs[i].shape[0] || t->shape[1] != refs[i].shape[1])
            rc = ERR("%s: %s has shape [%lld, %lld], expected [%lld, %lld]", path, refs[i].name, (long long)t->shape[0],
                     (long long)(t->n_dims > 1 ? t->shape[1] : 1), (long long)refs[i].shape[0],
                     (long long)refs[i].shape[1]);
        else
            rc = st_tensor_to_f32(f, t, refs[i].data, err, errlen);
    }
    if (rc == 0 && st_num_tensors(f) != n) /* a tensor of a layer or module this model has not */
        for (int j = 0; j < st_num_tensors(f) && rc == 0; j++) {
            bool known = false;
            for (int i = 0; i < n && !known; i++)
                known = strcmp(st_tensor(f, j)->name, refs[i].name) == 0;
            if (!known)
                rc = ERR("%s: tensor %s matches no projection of this model", path, st_tensor(f, j)->name);
        }
    if (rc == 0) {
        m->lora->cfg.alpha = c.alpha;
        m->lora->scale = (float)(c.alpha / c.rank);
        float *host = xmalloc((m->lora->n ? m->lora->n : 1) * sizeof(float));
        lora_mp_slice(m, whole, host);
        k_to_device(m->K, m->lora->mem, host, m->lora->n * sizeof(float));
        free(host);
    }
    st_close(f);
    free(refs);
    free(whole);
    return rc;
}
