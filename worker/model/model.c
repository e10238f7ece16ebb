/* Llama / Qwen2 on the CPU: parameter layout, packed training forward and
 * backward (optionally with per-layer recomputation), KV-cache steps. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "worker/comm/comm.h"
#include "kernels/kernels.h"
#include "fit.h"
#include "model_internal.h"
#include "sampler.h"

/* Tokens per chunk of the LM head: bounds the live logits to chunk x V floats. */
#define LMHEAD_CHUNK 64

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
    rope_default_freqs(inv_freq, c->head_dim, c->rope_theta);
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

const char *model_arch_name(enum model_arch a)
{
    return a == ARCH_QWEN3 ? "qwen3" : a == ARCH_QWEN2 ? "qwen2" : "llama";
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

/* Lay this shard's parameter tensors out in p->mem (already allocated, or NULL to only count). */
static size_t layout(const struct model_config *c, const struct model_shard *sh, struct model_params *p)
{
    size_t off = 0;
    const size_t D = (size_t)c->hidden_size, F = (size_t)sh->inter, V = (size_t)(sh->vocab_hi - sh->vocab_lo);
    const size_t QD = (size_t)sh->n_heads * c->head_dim, KD = (size_t)sh->n_kv_heads * c->head_dim;
#define TAKE(ptr, n)                                                                                                   \
    do {                                                                                                               \
        if (p->mem)                                                                                                    \
            (ptr) = p->mem + off;                                                                                      \
        off += (n);                                                                                                    \
    } while (0)
    if (sh->has_embed)
        TAKE(p->embed, V * D);
    for (int l = sh->layer_lo; l < sh->layer_hi; l++) {
        struct layer_params *L = &p->layers[l];
        TAKE(L->attn_norm, D);
        TAKE(L->wq, QD * D);
        TAKE(L->wk, KD * D);
        TAKE(L->wv, KD * D);
        if (c->attention_bias) {
            TAKE(L->bq, QD);
            TAKE(L->bk, KD);
            TAKE(L->bv, KD);
        }
        if (c->qk_norm) {
            TAKE(L->q_norm, (size_t)c->head_dim);
            TAKE(L->k_norm, (size_t)c->head_dim);
        }
        TAKE(L->wo, D * QD);
        TAKE(L->mlp_norm, D);
        TAKE(L->w_gate, F * D);
        TAKE(L->w_up, F * D);
        TAKE(L->w_down, D * F);
    }
    if (sh->has_head) {
        TAKE(p->final_norm, D);
        if (c->tie_word_embeddings && sh->has_embed) {
            p->lm_head = p->embed;
        } else { /* untied, or the last stage's copy of the tied embedding */
            TAKE(p->lm_head, V * D);
        }
    }
#undef TAKE
    return off;
}

/* The shard of TP rank r of tp at stage s of pp (sizes only). */
struct model_shard model_shard_of(const struct model_config *c, int r, int tp, int s, int pp)
{
    struct model_shard sh = {.tp_rank = r, .tp_size = tp, .pp_rank = s, .pp_size = pp};
    sh.layer_lo = (int)((int64_t)c->n_layers * s / pp);
    sh.layer_hi = (int)((int64_t)c->n_layers * (s + 1) / pp);
    sh.has_embed = s == 0;
    sh.has_head = s == pp - 1;
    sh.n_heads = c->n_heads / tp;
    sh.head_lo = r * sh.n_heads;
    sh.inter = c->intermediate_size / tp;
    sh.inter_lo = r * sh.inter;
    if (c->n_kv_heads >= tp) {
        sh.n_kv_heads = c->n_kv_heads / tp;
        sh.kv_lo = r * sh.n_kv_heads;
        sh.kv_share = 1;
    } else { /* fewer KV heads than ranks: each is held by tp / Hkv neighbouring ranks */
        sh.kv_share = tp / (c->n_kv_heads > 0 ? c->n_kv_heads : 1);
        sh.n_kv_heads = 1;
        sh.kv_lo = r / sh.kv_share;
    }
    sh.vocab_lo = (int)((int64_t)c->vocab_size * r / tp);
    sh.vocab_hi = (int)((int64_t)c->vocab_size * (r + 1) / tp);
    return sh;
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

static void params_view(const struct model_config *c, const struct model_shard *sh, float *mem, struct model_params *p)
{
    memset(p, 0, sizeof *p);
    p->layers = xcalloc((size_t)(c->n_layers > 0 ? c->n_layers : 1), sizeof *p->layers);
    struct model_params counter = {.layers = p->layers};
    p->n_floats = layout(c, sh, &counter);
    p->mem = mem;
    if (mem)
        layout(c, sh, p);
}

static void params_alloc(const struct model_config *c, const struct model_shard *sh, struct model_params *p)
{
    params_view(c, sh, NULL, p);
    p->mem = xcalloc(p->n_floats ? p->n_floats : 1, sizeof(float));
    layout(c, sh, p);
}

static void params_free(struct model_params *p)
{
    free(p->mem);
    free(p->layers);
    memset(p, 0, sizeof *p);
}

int model_refs_over(const struct model_config *c, const struct model_shard *sh, float *mem, struct param_ref *refs,
                    int max)
{
    struct model view = {.cfg = *c, .sh = *sh};
    params_view(c, sh, mem, &view.w);
    int n = model_param_refs(&view, &view.w, refs, max);
    free(view.w.layers);
    return n;
}

size_t model_shard_floats(const struct model_config *c, const struct model_shard *sh)
{
    struct model_params p;
    params_view(c, sh, NULL, &p);
    free(p.layers);
    return p.n_floats;
}

size_t model_whole_floats(const struct model_config *c)
{
    struct model_shard sh = model_shard_of(c, 0, 1, 0, 1);
    return model_shard_floats(c, &sh);
}

struct model *model_create_shard(const struct model_config *c, const struct model_layout *lay)
{
    const struct model_layout whole = {0, 1, 0, 1, NULL, NULL, NULL};
    const struct model_layout *L = lay ? lay : &whole;
    char why[256];
    if (model_shard_check(c, L->tp_size, "the TP size", why, sizeof why) != 0 ||
        model_stage_check(c, L->pp_size, "the PP size", why, sizeof why) != 0)
        check_failf(__FILE__, __LINE__, "model_create_shard: %s", why);
    if (L->tp_rank < 0 || L->tp_rank >= L->tp_size || L->pp_rank < 0 || L->pp_rank >= L->pp_size ||
        (L->tp_size > 1 && !L->tp) || (L->pp_size > 1 && (!L->pp || !L->mp)))
        check_failf(__FILE__, __LINE__, "model_create_shard: TP rank %d of %d, stage %d of %d, or a missing group",
                    L->tp_rank, L->tp_size, L->pp_rank, L->pp_size);
    struct model *m = xcalloc(1, sizeof *m);
    m->cfg = *c;
    m->sh = model_shard_of(c, L->tp_rank, L->tp_size, L->pp_rank, L->pp_size);
    m->sh.tp = L->tp_size > 1 ? L->tp : NULL;
    m->sh.pp = L->pp_size > 1 ? L->pp : NULL;
    m->sh.mp = L->pp_size > 1 ? L->mp : m->sh.tp;
    params_alloc(c, &m->sh, &m->w);
    m->rope_freqs = xcalloc((size_t)(c->head_dim / 2 > 0 ? c->head_dim / 2 : 1), sizeof(double));
    model_rope_freqs(c, m->rope_freqs);
    return m;
}

struct model *model_create(const struct model_config *c) { return model_create_shard(c, NULL); }

struct model *model_clone(const struct model *m)
{
    const struct model_layout lay = {m->sh.tp_rank, m->sh.tp_size, m->sh.pp_rank, m->sh.pp_size,
                                     m->sh.tp,      m->sh.pp,      m->sh.mp};
    struct model *r = model_create_shard(&m->cfg, &lay);
    memcpy(r->w.mem, m->w.mem, m->w.n_floats * sizeof(float));
    return r;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    free(m->rope_freqs);
    params_free(&m->w);
    if (m->grad) {
        params_free(m->grad);
        free(m->grad);
    }
    free(m);
}

void model_init_random(struct model *m, uint64_t seed, double std)
{
    int n = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *refs = xcalloc((size_t)(n > 0 ? n : 1), sizeof *refs);
    model_param_refs(m, &m->w, refs, n);
    struct rng r;
    rng_seed(&r, seed, 0x1417);
    for (int i = 0; i < n; i++) {
        const char *name = refs[i].name;
        bool norm = strstr(name, "norm") != NULL, bias = strstr(name, "bias") != NULL; // NOLINT: name is an array
        for (size_t j = 0; j < refs[i].numel; j += 2) {
            /* Box-Muller: two normals from two uniforms */
            double u1 = rng_uniform(&r), u2 = rng_uniform(&r);
            double rad = sqrt(-2.0 * log(u1 > 0 ? u1 : 1e-300));
            float z[2] = {(float)(rad * cos(2 * M_PI * u2) * std), (float)(rad * sin(2 * M_PI * u2) * std)};
            for (size_t k = 0; k < 2 && j + k < refs[i].numel; k++)
                refs[i].data[j + k] = norm ? 1.0f : (bias ? 0.0f : z[k]);
        }
    }
    free(refs);
}

void model_alloc_grads(struct model *m)
{
    if (m->grad)
        return;
    m->grad = xcalloc(1, sizeof *m->grad);
    params_alloc(&m->cfg, &m->sh, m->grad);
}

void model_zero_grads(struct model *m)
{
    if (m->grad)
        memset(m->grad->mem, 0, m->grad->n_floats * sizeof(float));
}

size_t model_num_params(const struct model *m) { return m->w.n_floats; }

/* Where a part sits in its whole tensor (see struct param_ref). */
struct part {
    int split;
    int64_t at, full0, full1;
    bool owner;
};

static void add_ref(struct param_ref *refs, int max, int *n, const char *name, float *data, int n_dims, int64_t d0,
                    int64_t d1, struct part pt)
{
    if (refs && *n < max) {
        struct param_ref *r = &refs[*n];
        snprintf(r->name, sizeof r->name, "%s", name);
        r->data = data;
        r->n_dims = n_dims;
        r->shape[0] = d0;
        r->shape[1] = n_dims > 1 ? d1 : 1;
        r->numel = (size_t)d0 * (size_t)(n_dims > 1 ? d1 : 1);
        r->split = pt.split;
        r->at = pt.at;
        r->full[0] = pt.full0;
        r->full[1] = n_dims > 1 ? pt.full1 : 1;
        r->owner = pt.owner;
    }
    (*n)++;
}

int model_param_refs(const struct model *m, const struct model_params *p, struct param_ref *refs, int max)
{
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    const int64_t D = c->hidden_size, F = sh->inter, V = sh->vocab_hi - sh->vocab_lo, hd = c->head_dim;
    const int64_t QD = (int64_t)sh->n_heads * hd, KD = (int64_t)sh->n_kv_heads * hd;
    const int64_t FQ = (int64_t)c->n_heads * hd, FK = (int64_t)c->n_kv_heads * hd, FF = c->intermediate_size;
    const bool first = sh->tp_rank == 0, kv_owner = sh->tp_rank % sh->kv_share == 0;
    const struct part whole = {0, 0, D, 0, first}, vocab = {1, sh->vocab_lo, c->vocab_size, D, true};
    const struct part head_norm = {0, 0, hd, 0, first}; /* Qwen3's q/k norms: whole on every TP rank */
    const struct part q_rows = {1, sh->head_lo * hd, FQ, D, true}, kv_rows = {1, sh->kv_lo * hd, FK, D, kv_owner};
    const struct part o_cols = {2, sh->head_lo * hd, D, FQ, true};
    const struct part f_rows = {1, sh->inter_lo, FF, D, true}, f_cols = {2, sh->inter_lo, D, FF, true};
    int n = 0;
    char name[96];
    if (sh->has_embed)
        add_ref(refs, max, &n, "model.embed_tokens.weight", p->embed, 2, V, D, vocab);
    for (int l = sh->layer_lo; l < sh->layer_hi; l++) {
        const struct layer_params *L = &p->layers[l];
#define REF(suffix, ptr, nd, a, b, pt)                                                                                 \
    do {                                                                                                               \
        snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);                                                  \
        add_ref(refs, max, &n, name, ptr, nd, a, b, pt);                                                               \
    } while (0)
        REF("input_layernorm.weight", L->attn_norm, 1, D, 0, whole);
        REF("self_attn.q_proj.weight", L->wq, 2, QD, D, q_rows);
        REF("self_attn.k_proj.weight", L->wk, 2, KD, D, kv_rows);
        REF("self_attn.v_proj.weight", L->wv, 2, KD, D, kv_rows);
        if (c->attention_bias) {
            REF("self_attn.q_proj.bias", L->bq, 1, QD, 0, q_rows);
            REF("self_attn.k_proj.bias", L->bk, 1, KD, 0, kv_rows);
            REF("self_attn.v_proj.bias", L->bv, 1, KD, 0, kv_rows);
        }
        if (c->qk_norm) {
            REF("self_attn.q_norm.weight", L->q_norm, 1, hd, 0, head_norm);
            REF("self_attn.k_norm.weight", L->k_norm, 1, hd, 0, head_norm);
        }
        REF("self_attn.o_proj.weight", L->wo, 2, D, QD, o_cols);
        REF("post_attention_layernorm.weight", L->mlp_norm, 1, D, 0, whole);
        REF("mlp.gate_proj.weight", L->w_gate, 2, F, D, f_rows);
        REF("mlp.up_proj.weight", L->w_up, 2, F, D, f_rows);
        REF("mlp.down_proj.weight", L->w_down, 2, D, F, f_cols);
#undef REF
    }
    if (sh->has_head) {
        add_ref(refs, max, &n, "model.norm.weight", p->final_norm, 1, D, 0, whole);
        if (!c->tie_word_embeddings) {
            add_ref(refs, max, &n, "lm_head.weight", p->lm_head, 2, V, D, vocab);
        } else if (!sh->has_embed) { /* the last stage's copy of the tied embedding: the first stage's counts */
            struct part copy = vocab;
            copy.owner = false;
            add_ref(refs, max, &n, "model.embed_tokens.weight", p->lm_head, 2, V, D, copy);
        }
    }
    return n;
}

/* ---------------------------------------------------------------- training */

/* Activations of one layer (all (N, .) row-major). */
struct layer_acts {
    float *x;                               /* (N, D) layer input (kept even with checkpointing) */
    float *xn1, *rstd1;                     /* (N, D), (N) */
    float *q, *k, *v;                       /* (N, QD), (N, KD), (N, KD), after RoPE for q and k */
    float *q_pre, *k_pre, *rstd_q, *rstd_k; /* Qwen3: q and k before their norms, and the norms' rstd */
    float *att, *lse;                       /* (N, QD), (N, Hq) */
    float *xmid;                            /* (N, D) after the attention residual */
    float *xn2, *rstd2;
    float *g, *u, *a; /* (N, F) gate, up, silu(gate)*up */
};

struct model_acts {
    struct packed_batch b;
    int32_t *ids, *targets, *pos, *cu; /* owned copies */
    float temperature;
    bool ckpt;
    int n_layers;
    struct layer_acts *layers; /* n_layers; with ckpt only .x is filled */
    struct layer_acts scratch; /* ckpt: recomputation space */
    float *xf, *hn, *rstdf;    /* final residual, normed (N, D), (N) */
};

static void layer_acts_alloc(const struct model *m, int N, struct layer_acts *a, bool full)
{
    const struct model_config *c = &m->cfg;
    /* an empty batch still gets valid buffers */
    const size_t n = (size_t)(N > 0 ? N : 1), D = (size_t)c->hidden_size, F = (size_t)m->sh.inter;
    const size_t QD = (size_t)m->sh.n_heads * c->head_dim, KD = (size_t)m->sh.n_kv_heads * c->head_dim;
    if (!a->x)
        a->x = xmalloc(n * D * sizeof(float));
    if (!full)
        return;
    a->xn1 = xmalloc(n * D * sizeof(float));
    a->rstd1 = xmalloc(n * sizeof(float));
    a->q = xmalloc(n * QD * sizeof(float));
    a->k = xmalloc(n * KD * sizeof(float));
    a->v = xmalloc(n * KD * sizeof(float));
    a->att = xmalloc(n * QD * sizeof(float));
    if (c->qk_norm) {
        a->q_pre = xmalloc(n * QD * sizeof(float));
        a->k_pre = xmalloc(n * KD * sizeof(float));
        a->rstd_q = xmalloc(n * (size_t)m->sh.n_heads * sizeof(float));
        a->rstd_k = xmalloc(n * (size_t)m->sh.n_kv_heads * sizeof(float));
    }
    a->lse = xmalloc(n * (size_t)m->sh.n_heads * sizeof(float));
    a->xmid = xmalloc(n * D * sizeof(float));
    a->xn2 = xmalloc(n * D * sizeof(float));
    a->rstd2 = xmalloc(n * sizeof(float));
    a->g = xmalloc(n * F * sizeof(float));
    a->u = xmalloc(n * F * sizeof(float));
    a->a = xmalloc(n * F * sizeof(float));
}

static void layer_acts_free(struct layer_acts *a, bool keep_x)
{
    float **f[] = {&a->xn1,   &a->rstd1, &a->q, &a->k, &a->v,     &a->att,   &a->lse,    &a->xmid,  &a->xn2,
                   &a->rstd2, &a->g,     &a->u, &a->a, &a->q_pre, &a->k_pre, &a->rstd_q, &a->rstd_k};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        free(*f[i]);
        *f[i] = NULL;
    }
    if (!keep_x) {
        free(a->x);
        a->x = NULL;
    }
}

void model_tp_sum(const struct model *m, float *buf, size_t n)
{
    if (m->sh.tp)
        comm_allreduce_sum(m->sh.tp, buf, n, COMM_F32);
}

static void tp_reduce(void *ud, double *buf, int n, bool max)
{
    struct comm *tp = ud;
    if (max)
        comm_allreduce_max(tp, buf, (size_t)n, COMM_F64);
    else
        comm_allreduce_sum(tp, buf, (size_t)n, COMM_F64);
}

/* This rank's vocabulary rows, with the TP group's reductions. */
static struct vocab_shard vocab_of(const struct model *m)
{
    return (struct vocab_shard){.lo = m->sh.vocab_lo,
                                .hi = m->sh.vocab_hi,
                                .V = m->cfg.vocab_size,
                                .reduce = m->sh.tp ? tp_reduce : NULL,
                                .ud = m->sh.tp};
}

/* One decoder layer: a->x in, returns the output in out (N, D). */
static void layer_forward(const struct model *m, int l, const struct packed_batch *b, struct layer_acts *a, float *out)
{
    const struct model_config *c = &m->cfg;
    const struct layer_params *L = &m->w.layers[l];
    const int N = b->N, D = c->hidden_size, F = m->sh.inter, hd = c->head_dim, Hq = m->sh.n_heads;
    const int Hkv = m->sh.n_kv_heads, QD = Hq * hd, KD = Hkv * hd;
    rmsnorm_forward(a->xn1, a->rstd1, a->x, L->attn_norm, N, D, c->rms_norm_eps);
    linear_forward(a->q, a->xn1, L->wq, L->bq, N, D, QD);
    linear_forward(a->k, a->xn1, L->wk, L->bk, N, D, KD);
    linear_forward(a->v, a->xn1, L->wv, L->bv, N, D, KD);
    if (L->q_norm) { /* Qwen3: each head's q and k RMS-normed before RoPE */
        memcpy(a->q_pre, a->q, (size_t)N * QD * sizeof(float));
        memcpy(a->k_pre, a->k, (size_t)N * KD * sizeof(float));
        rmsnorm_forward(a->q, a->rstd_q, a->q_pre, L->q_norm, N * Hq, hd, c->rms_norm_eps);
        rmsnorm_forward(a->k, a->rstd_k, a->k_pre, L->k_norm, N * Hkv, hd, c->rms_norm_eps);
    }
    rope_forward_freqs(a->q, b->pos, N, Hq, hd, m->rope_freqs);
    rope_forward_freqs(a->k, b->pos, N, Hkv, hd, m->rope_freqs);
    attention_forward(a->att, a->lse, a->q, a->k, a->v, b->cu_seqlens, b->B, Hq, Hkv, hd);
    linear_forward(a->xmid, a->att, L->wo, NULL, N, QD, D);
    model_tp_sum(m, a->xmid, (size_t)N * D);
    vec_add_inplace(a->xmid, a->x, (size_t)N * D);
    rmsnorm_forward(a->xn2, a->rstd2, a->xmid, L->mlp_norm, N, D, c->rms_norm_eps);
    linear_forward(a->g, a->xn2, L->w_gate, NULL, N, D, F);
    linear_forward(a->u, a->xn2, L->w_up, NULL, N, D, F);
    swiglu_forward(a->a, a->g, a->u, (size_t)N * F);
    linear_forward(out, a->a, L->w_down, NULL, N, F, D);
    model_tp_sum(m, out, (size_t)N * D);
    vec_add_inplace(out, a->xmid, (size_t)N * D);
}

/* Backward of one layer: dx (N, D) holds dL/d(output) on entry and dL/d(input) on exit. */
static void layer_backward(struct model *m, int l, const struct packed_batch *b, const struct layer_acts *a, float *dx)
{
    const struct model_config *c = &m->cfg;
    const struct layer_params *L = &m->w.layers[l];
    struct layer_params *G = &m->grad->layers[l];
    const int N = b->N, D = c->hidden_size, F = m->sh.inter, hd = c->head_dim, Hq = m->sh.n_heads;
    const int Hkv = m->sh.n_kv_heads, QD = Hq * hd, KD = Hkv * hd;
    const size_t nD = (size_t)N * D, nF = (size_t)N * F;
    const size_t cF = nF ? nF : 1, cD = nD ? nD : 1; /* an empty batch still gets valid buffers */
    float *da = xcalloc(cF, sizeof(float)), *dg = xcalloc(cF, sizeof(float)), *du = xcalloc(cF, sizeof(float));
    float *dxn = xcalloc(cD, sizeof(float));
    /* MLP: out = xmid + down(silu(gate(xn2)) * up(xn2)) */
    linear_backward(da, G->w_down, NULL, dx, a->a, L->w_down, N, F, D);
    swiglu_backward(dg, du, da, a->g, a->u, nF);
    linear_backward(dxn, G->w_gate, NULL, dg, a->xn2, L->w_gate, N, D, F);
    linear_backward(dxn, G->w_up, NULL, du, a->xn2, L->w_up, N, D, F);
    model_tp_sum(m, dxn, nD);
    rmsnorm_backward(dx, G->mlp_norm, dxn, a->xmid, L->mlp_norm, a->rstd2, N, D); /* dx now dL/dxmid */
    free(da), free(dg), free(du);
    /* attention: xmid = x + o(attn(rope(q(xn1)), rope(k(xn1)), v(xn1))) */
    float *datt = xcalloc((size_t)N * QD, sizeof(float));
    float *dq = xcalloc((size_t)N * QD, sizeof(float));
    float *dk = xcalloc((size_t)N * KD, sizeof(float)), *dv = xcalloc((size_t)N * KD, sizeof(float));
    linear_backward(datt, G->wo, NULL, dx, a->att, L->wo, N, QD, D);
    attention_backward(dq, dk, dv, datt, a->att, a->lse, a->q, a->k, a->v, b->cu_seqlens, b->B, Hq, Hkv, hd);
    rope_backward_freqs(dq, b->pos, N, Hq, hd, m->rope_freqs);
    rope_backward_freqs(dk, b->pos, N, Hkv, hd, m->rope_freqs);
    if (L->q_norm) { /* through the per-head norms */
        float *dq_pre = xcalloc((size_t)N * QD + 1, sizeof(float)),
              *dk_pre = xcalloc((size_t)N * KD + 1, sizeof(float));
        rmsnorm_backward(dq_pre, G->q_norm, dq, a->q_pre, L->q_norm, a->rstd_q, N * Hq, hd);
        rmsnorm_backward(dk_pre, G->k_norm, dk, a->k_pre, L->k_norm, a->rstd_k, N * Hkv, hd);
        memcpy(dq, dq_pre, (size_t)N * QD * sizeof(float));
        memcpy(dk, dk_pre, (size_t)N * KD * sizeof(float));
        free(dq_pre), free(dk_pre);
    }
    memset(dxn, 0, nD * sizeof(float));
    linear_backward(dxn, G->wq, G->bq, dq, a->xn1, L->wq, N, D, QD);
    linear_backward(dxn, G->wk, G->bk, dk, a->xn1, L->wk, N, D, KD);
    linear_backward(dxn, G->wv, G->bv, dv, a->xn1, L->wv, N, D, KD);
    model_tp_sum(m, dxn, nD);
    rmsnorm_backward(dx, G->attn_norm, dxn, a->x, L->attn_norm, a->rstd1, N, D); /* dx now dL/dx */
    free(datt), free(dq), free(dk), free(dv), free(dxn);
}

static int32_t *dup_i32(const int32_t *src, size_t n)
{
    int32_t *d = xmalloc((n ? n : 1) * sizeof *d);
    memcpy(d, src, n * sizeof *d);
    return d;
}

struct model_acts *model_forward_stage(struct model *m, const struct packed_batch *b, float temperature,
                                       bool checkpointing, const float *x_in, float *y_out, float *logp, float *entropy)
{
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    const int N = b->N, D = c->hidden_size, lo = sh->layer_lo, hi = sh->layer_hi;
    const size_t nD = (size_t)N * D;
    struct model_acts *A = xcalloc(1, sizeof *A);
    A->ids = dup_i32(b->ids, (size_t)N);
    A->targets = dup_i32(b->targets, (size_t)N);
    A->pos = dup_i32(b->pos, (size_t)N);
    A->cu = dup_i32(b->cu_seqlens, (size_t)b->B + 1);
    A->b = (struct packed_batch){N, b->B, A->ids, A->targets, A->pos, A->cu};
    A->temperature = temperature;
    A->ckpt = checkpointing;
    A->n_layers = c->n_layers;
    A->layers = xcalloc((size_t)(c->n_layers > 0 ? c->n_layers : 1), sizeof *A->layers);
    if (checkpointing)
        layer_acts_alloc(m, N, &A->scratch, true);
    A->xf = xcalloc(nD ? nD : 1, sizeof(float));
    if (sh->has_head) {
        A->hn = xcalloc(nD ? nD : 1, sizeof(float));
        A->rstdf = xmalloc((size_t)(N ? N : 1) * sizeof(float));
    }

    const struct vocab_shard vs = vocab_of(m);
    float *x0 = A->xf; /* the stage's input: layer lo's, or the output itself when the stage has no layer */
    if (lo < hi) {
        layer_acts_alloc(m, N, &A->layers[lo], false);
        x0 = A->layers[lo].x;
    }
    if (sh->has_embed) {
        embedding_forward_shard(x0, A->ids, m->w.embed, N, D, &vs);
        model_tp_sum(m, x0, nD);
    } else {
        if (!x_in)
            check_failf(__FILE__, __LINE__, "model_forward_stage: stage %d needs the previous stage's output",
                        sh->pp_rank);
        memcpy(x0, x_in, nD * sizeof(float));
    }
    for (int l = lo; l < hi; l++) {
        struct layer_acts *a = &A->layers[l];
        float *out;
        if (l + 1 < hi) {
            layer_acts_alloc(m, N, &A->layers[l + 1], false);
            out = A->layers[l + 1].x;
        } else {
            out = A->xf;
        }
        if (checkpointing) {
            float *keep = A->scratch.x;
            A->scratch.x = a->x;
            layer_forward(m, l, &A->b, &A->scratch, out);
            A->scratch.x = keep;
        } else {
            layer_acts_alloc(m, N, a, true);
            layer_forward(m, l, &A->b, a, out);
        }
    }
    if (sh->has_head) {
        rmsnorm_forward(A->hn, A->rstdf, A->xf, m->w.final_norm, N, D, c->rms_norm_eps);
        lmhead_logprob_forward_shard(logp, entropy, A->hn, m->w.lm_head, A->targets, N, D, &vs, temperature,
                                     LMHEAD_CHUNK);
    } else {
        if (!y_out)
            check_failf(__FILE__, __LINE__, "model_forward_stage: stage %d needs somewhere to put its output",
                        sh->pp_rank);
        memcpy(y_out, A->xf, nD * sizeof(float));
    }
    return A;
}

struct model_acts *model_forward(struct model *m, const struct packed_batch *b, float temperature, bool checkpointing,
                                 float *logp, float *entropy)
{
    if (m->sh.pp_size > 1)
        check_failf(__FILE__, __LINE__, "model_forward: a pipeline stage runs model_forward_stage");
    return model_forward_stage(m, b, temperature, checkpointing, NULL, NULL, logp, entropy);
}

void model_acts_free(struct model_acts *A)
{
    if (!A)
        return;
    for (int l = 0; A->layers && l < A->n_layers; l++)
        layer_acts_free(&A->layers[l], false);
    free(A->layers);
    layer_acts_free(&A->scratch, false);
    free(A->ids), free(A->targets), free(A->pos), free(A->cu);
    free(A->xf), free(A->hn), free(A->rstdf);
    free(A);
}

void model_backward_stage(struct model *m, struct model_acts *A, const float *dlogp, const float *dentropy,
                          const float *dy, float *dx_out)
{
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    const int N = A->b.N, D = c->hidden_size;
    const size_t nD = (size_t)N * D;
    model_alloc_grads(m);
    const struct vocab_shard vs = vocab_of(m);
    float *dx = xcalloc(nD ? nD : 1, sizeof(float));
    if (sh->has_head) {
        float *dh = xcalloc(nD ? nD : 1, sizeof(float));
        lmhead_logprob_backward_shard(dh, m->grad->lm_head, dlogp, dentropy, A->hn, m->w.lm_head, A->targets, N, D, &vs,
                                      A->temperature, LMHEAD_CHUNK);
        model_tp_sum(m, dh, nD); /* each rank's vocabulary rows gave their part of dL/dh */
        rmsnorm_backward(dx, m->grad->final_norm, dh, A->xf, m->w.final_norm, A->rstdf, N, D);
        free(dh);
    } else {
        if (!dy)
            check_failf(__FILE__, __LINE__, "model_backward_stage: stage %d needs the next stage's gradient",
                        sh->pp_rank);
        memcpy(dx, dy, nD * sizeof(float));
    }
    float *scratch_out = A->ckpt ? xmalloc((nD ? nD : 1) * sizeof(float)) : NULL;
    for (int l = sh->layer_hi - 1; l >= sh->layer_lo; l--) {
        struct layer_acts *a = &A->layers[l];
        if (A->ckpt) {
            /* recompute this layer's activations from its saved input */
            float *keep = A->scratch.x;
            A->scratch.x = a->x;
            layer_forward(m, l, &A->b, &A->scratch, scratch_out);
            layer_backward(m, l, &A->b, &A->scratch, dx);
            A->scratch.x = keep;
        } else {
            layer_backward(m, l, &A->b, a, dx);
        }
        layer_acts_free(a, false); /* this layer's memory is no longer needed */
    }
    if (sh->has_embed)
        embedding_backward_shard(m->grad->embed, dx, A->ids, N, D, &vs);
    else if (dx_out)
        memcpy(dx_out, dx, nD * sizeof(float));
    else
        check_failf(__FILE__, __LINE__, "model_backward_stage: stage %d needs somewhere to put its input gradient",
                    sh->pp_rank);
    free(dx);
    free(scratch_out);
    model_acts_free(A);
}

void model_backward(struct model *m, struct model_acts *A, const float *dlogp, const float *dentropy)
{
    model_backward_stage(m, A, dlogp, dentropy, NULL, NULL);
}
