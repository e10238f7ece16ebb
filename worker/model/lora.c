/* LoRA adapters: layout, PEFT's initialisation, the projections' delta forward and backward, the trainable
 * buffer, and PEFT's files (adapter_config.json, adapter_model.safetensors). */
#include "lora.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/json_file.h"
#include "common/check.h"
#include "common/config.h"
#include "common/fs.h"
#include "kernels/kernels.h"
#include "model_internal.h"
#include "sampler.h"
#include "worker/comm/comm.h"
#include "worker/formats/safetensors.h"

#define ERR(...) error_set(err, errlen, __VA_ARGS__)

static const char *const g_proj_names[PROJ_KINDS] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                     "gate_proj", "up_proj", "down_proj"};

const char *lora_proj_name(enum proj_kind p) { return g_proj_names[p]; }

const char *lora_proj_module(enum proj_kind p) { return p <= PROJ_O ? "self_attn" : "mlp"; }

const char *lora_targets_text(unsigned targets, char *buf, size_t len)
{
    if (len)
        buf[0] = 0;
    if ((targets & LORA_ALL_LINEAR) == LORA_ALL_LINEAR) {
        snprintf(buf, len, "all-linear");
        return buf;
    }
    size_t at = 0;
    for (int p = 0; p < PROJ_KINDS; p++)
        if (targets & (1u << p) && at < len) {
            int k = snprintf(buf + at, len - at, "%s%s", at ? ", " : "", g_proj_names[p]);
            at += k > 0 ? (size_t)k : 0;
        }
    return buf;
}

/* ------------------------------------------------------------------ layout */

static const unsigned g_mlp = 1u << PROJ_GATE | 1u << PROJ_UP | 1u << PROJ_DOWN;

/* A matrix of n floats at base + *off (NULL when only counting). */
static float *take(float *base, size_t *off, size_t n)
{
    float *p = base ? base + *off : NULL;
    *off += n;
    return p;
}

/* The adapter's layout on shard sh of a model of mc: the layers of its stage, each projection's A (r, Din) and B
 * (Dout, r) with the shard's Din and Dout (model_shard_proj_dims: a column-parallel projection's rows of B, a
 * row-parallel one's columns of A; the other matrix whole), the experts' adapters of its experts. lay's matrices
 * are pointed into base (lay NULL: only count); returns the floats. */
static size_t layout_over(const struct model_config *mc, const struct model_shard *sh, const struct lora_config *c,
                          float *base, struct lora_layer *lay)
{
    size_t off = 0;
    const size_t r = (size_t)c->rank;
    const bool moe = mc->n_experts > 0;
    const size_t El = (size_t)sh->n_experts, E = (size_t)mc->n_experts, D = (size_t)mc->hidden_size;
    const size_t F = (size_t)mc->moe_intermediate;
    for (int l = sh->layer_lo; l < sh->layer_hi; l++) {
        struct lora_layer z = {0}, *L = lay ? &lay[l] : &z;
        if (moe && (c->targets & (1u << PROJ_GATE))) { /* gate and up: one adapter of rank 2r (gate_up_proj) */
            L->Agu = take(base, &off, El * 2 * r * D);
            L->Bgu = take(base, &off, 2 * F * 2 * r * El);
        }
        if (moe && (c->targets & (1u << PROJ_DOWN))) {
            L->Ad = take(base, &off, El * r * F);
            L->Bd = take(base, &off, D * r * El);
        }
        if (moe && c->router) {
            L->Ar = take(base, &off, r * D);
            L->Br = take(base, &off, E * r);
        }
        for (int p = 0; p < PROJ_KINDS; p++) {
            if (!(c->targets & (1u << p)) || (moe && (g_mlp & (1u << p))))
                continue;
            int din, dout;
            model_shard_proj_dims(mc, sh, (enum proj_kind)p, &din, &dout);
            if (lay) {
                lay[l].A[p] = base + off;
                lay[l].B[p] = base + off + r * (size_t)din;
            }
            off += r * (size_t)din + (size_t)dout * r;
        }
    }
    return off;
}

static size_t lora_layout(const struct model *m, const struct lora_config *c, float *base, struct lora_layer *lay)
{
    return layout_over(&m->cfg, &m->sh, c, base, lay);
}

/* The whole model's shard: every layer, row, column and expert (the whole adapter's layout, PEFT's). */
static struct model_shard whole_shard(const struct model_config *mc) { return model_shard_of(mc, 0, 1, 0, 1); }

/* The adapter as the model's projection hook (struct model_hook): its terms on the projections, the router and the
 * experts, its gradients made before a backward, and its release with the model. */
static const struct model_hook g_lora_hook;

int lora_attach(struct model *m, const struct lora_config *c, char *err, size_t errlen)
{
    if (m->lora)
        return ERR("the model has a LoRA adapter already");
    const bool split = m->sh.tp_size > 1 || m->sh.pp_size > 1;
    if (split && m->sh.ep)
        return ERR("LoRA with expert parallelism (EP rank %d of %d) and training tensor or pipeline parallelism (TP "
                   "rank %d of %d, stage %d of %d): not available yet; LoRA runs under EP with TP and PP 1, or under "
                   "TP and PP without EP",
                   m->sh.ep_rank, m->sh.ep_size, m->sh.tp_rank, m->sh.tp_size, m->sh.pp_rank, m->sh.pp_size);
    if (split && m->cfg.n_experts && (c->targets & g_mlp || c->router))
        return ERR("LoRA on the experts or the router of a mixture-of-experts model (%d experts) with training tensor "
                   "or pipeline parallelism (TP %d, PP %d): not available yet; list the attention projections "
                   "(target_modules=[q_proj,k_proj,v_proj,o_proj]), or set TP and PP to 1",
                   m->cfg.n_experts, m->sh.tp_size, m->sh.pp_size);
    if (c->rank < 1 || !(c->alpha > 0) || !(c->targets & LORA_ALL_LINEAR || (c->router && m->cfg.n_experts)) ||
        (c->targets & ~LORA_ALL_LINEAR))
        return ERR("LoRA needs a rank >= 1 (got %d), alpha > 0 (got %g) and at least one target projection", c->rank,
                   c->alpha);
    if (m->cfg.n_experts && (c->targets & g_mlp || c->router)) { /* a mixture of experts: its MLPs are the experts */
        const bool gate = c->targets & (1u << PROJ_GATE), up = c->targets & (1u << PROJ_UP);
        if (gate != up)
            return ERR("LoRA target_modules: %s without %s on a mixture-of-experts model (%d experts): the experts' "
                       "gate and up projections are one fused parameter (gate_up_proj, as in transformers and PEFT); "
                       "target both or neither",
                       gate ? "gate_proj" : "up_proj", gate ? "up_proj" : "gate_proj", m->cfg.n_experts);
        if (m->K->device != KDEV_CPU)
            return ERR("LoRA on the experts or the router of a mixture-of-experts model runs on the CPU back-end for "
                       "now (this is %s); list the attention projections: target_modules=[q_proj,k_proj,v_proj,o_proj]",
                       m->K->ops->name);
    }
    struct lora *a = xcalloc(1, sizeof *a);
    a->cfg = *c;
    a->scale = (float)(c->alpha / c->rank);
    a->n_layers = m->cfg.n_layers;
    a->w = xcalloc((size_t)a->n_layers, sizeof *a->w);
    a->g = xcalloc((size_t)a->n_layers, sizeof *a->g);
    a->n = lora_layout(m, &a->cfg, NULL, NULL);
    a->mem = k_calloc(m->K, a->n * sizeof(float), KMEM_WEIGHTS, "the LoRA adapter");
    lora_layout(m, &a->cfg, a->mem, a->w);
    model_freeze(m, true); /* the base's weights take no gradients */
    if (!m->cfg.n_experts)
        a->cfg.router = false;
    if (m->cfg.n_experts && (a->cfg.targets & g_mlp))
        a->moe = xcalloc((size_t)a->n_layers, sizeof *a->moe);
    m->lora = a;
    model_set_hook(m, &g_lora_hook);
    return 0;
}

int lora_attach_config(struct model *m, const struct grpo_config *cfg, const char *base_path, char *err, size_t errlen)
{
    if (cfg->arr_model_lora_adapter_path[0]) {
        if (lora_load(m, cfg->arr_model_lora_adapter_path, err, errlen) != 0)
            return -1;
    } else if (cfg->arr_model_lora_rank > 0) {
        struct lora_config c = {.rank = (int)cfg->arr_model_lora_rank, .alpha = cfg->arr_model_lora_alpha};
        char why[256];
        if (config_lora_targets(cfg->arr_model_target_modules, &c.targets, why, sizeof why) != 0)
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

void lora_detach(struct model *m)
{
    struct lora *a = m ? m->lora : NULL;
    if (!a)
        return;
    k_free(m->K, a->mem, a->n * sizeof(float), KMEM_WEIGHTS);
    if (a->grad)
        k_free(m->K, a->grad, a->n * sizeof(float), KMEM_GRADS);
    if (a->scratch)
        k_free(m->K, a->scratch, a->scratch_cap * sizeof(float), KMEM_ACTS);
    model_freeze(m, false);
    free(a->moe);
    free(a->w);
    free(a->g);
    free(a);
    m->lora = NULL;
    model_set_hook(m, NULL);
}

void lora_init(struct model *m, uint64_t seed)
{
    struct lora *a = m->lora;
    if (!a)
        return;
    /* the whole adapter is drawn, in its own order, and this rank keeps its part (its stage's layers, its rows or
     * columns under TP, its experts under EP): the same adapter whatever the layout */
    const struct model_config *mc = &m->cfg;
    const struct model_shard one = whole_shard(mc);
    const size_t nw = layout_over(mc, &one, &a->cfg, NULL, NULL);
    float *whole = xcalloc(nw ? nw : 1, sizeof(float));
    struct lora_layer *wl = xcalloc((size_t)mc->n_layers, sizeof *wl);
    layout_over(mc, &one, &a->cfg, whole, wl);
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

void lora_set_bypass(struct model *m, bool bypass)
{
    if (m->lora)
        m->lora->bypass = bypass;
}

/* ------------------------------------------------------------------ the delta */

/* At least n floats of scratch (kept between calls; grown when a longer batch needs more). */
static float *scratch(const struct model *m, size_t n)
{
    struct lora *a = m->lora;
    if (n > a->scratch_cap) {
        if (a->scratch)
            k_free(m->K, a->scratch, a->scratch_cap * sizeof(float), KMEM_ACTS);
        a->scratch_cap = n + n / 2;
        a->scratch = k_alloc(m->K, a->scratch_cap * sizeof(float), KMEM_ACTS, "LoRA products");
    }
    return a->scratch;
}

/* y += s (x A^T) B^T with A (r, din), B (dout, r). */
static void lowrank_forward(const struct model *m, const float *A, const float *B, float *y, const float *x, int N,
                            int din, int dout)
{
    const struct lora *a = m->lora;
    const int r = a->cfg.rank;
    float *t = scratch(m, (size_t)N * ((size_t)r + (size_t)dout)), *u = t + (size_t)N * r;
    k_linear_forward(m->K, t, x, A, NULL, N, din, r);  /* t (N, r) = x A^T */
    k_linear_forward(m->K, u, t, B, NULL, N, r, dout); /* u (N, Dout) = t B^T */
    k_axpy(m->K, y, a->scale, u, (size_t)N * dout);
}

/* Its backward: dx += s (dy B) A; gB += s dy^T (x A^T), gA += s (dy B)^T x (when gA and gB are not NULL). */
static void lowrank_backward(const struct model *m, const float *A, const float *B, float *gA, float *gB, float *dx,
                             const float *dy, const float *x, int N, int din, int dout)
{
    const struct lora *a = m->lora;
    const int r = a->cfg.rank;
    const size_t nr = (size_t)N * r;
    float *t = scratch(m, 2 * nr), *dt = t + nr;
    k_linear_forward(m->K, t, x, A, NULL, N, din, r); /* recomputed: t = x A^T */
    k_scale(m->K, t, a->scale, nr);                   /* s t */
    k_zero(m->K, dt, nr * sizeof(float));
    k_linear_backward(m->K, dt, gB, NULL, dy, t, B, N, r, dout); /* dt = dy B; dB += dy^T s t */
    k_scale(m->K, dt, a->scale, nr);                             /* d(x A^T) = s dy B */
    k_linear_backward(m->K, dx, gA, NULL, dt, x, A, N, din, r);  /* dx += dt A; dA += dt^T x */
}

static void lora_proj_forward(const struct model *m, int l, enum proj_kind p, float *y, const float *x, int N)
{
    const struct lora *a = m->lora;
    if (!a || a->bypass || N <= 0 || !a->w[l].A[p])
        return;
    int din, dout;
    model_proj_dims(m, p, &din, &dout);
    lowrank_forward(m, a->w[l].A[p], a->w[l].B[p], y, x, N, din, dout);
}

static void lora_proj_backward(const struct model *m, int l, enum proj_kind p, float *dx, const float *dy,
                               const float *x, int N)
{
    const struct lora *a = m->lora;
    if (!a || a->bypass || N <= 0 || !a->w[l].A[p])
        return;
    int din, dout;
    model_proj_dims(m, p, &din, &dout);
    lowrank_backward(m, a->w[l].A[p], a->w[l].B[p], a->grad ? a->g[l].A[p] : NULL, a->grad ? a->g[l].B[p] : NULL, dx,
                     dy, x, N, din, dout);
}

static void lora_router_forward(const struct model *m, int l, float *y, const float *x, int N)
{
    const struct lora *a = m->lora;
    if (!a || a->bypass || N <= 0 || !a->w[l].Ar)
        return;
    lowrank_forward(m, a->w[l].Ar, a->w[l].Br, y, x, N, m->cfg.hidden_size, m->cfg.n_experts);
}

static void lora_router_backward(const struct model *m, int l, float *dx, const float *dy, const float *x, int N)
{
    const struct lora *a = m->lora;
    if (!a || a->bypass || N <= 0 || !a->w[l].Ar)
        return;
    lowrank_backward(m, a->w[l].Ar, a->w[l].Br, a->grad ? a->g[l].Ar : NULL, a->grad ? a->g[l].Br : NULL, dx, dy, x, N,
                     m->cfg.hidden_size, m->cfg.n_experts);
}

static const struct kmoe_lora *lora_moe(const struct model *m, int l, size_t nk)
{
    struct lora *a = m->lora;
    if (!a || a->bypass || !a->moe)
        return NULL;
    const struct lora_layer *w = &a->w[l], *g = a->grad ? &a->g[l] : NULL;
    const int r = a->cfg.rank;
    struct kmoe_lora *L = &a->moe[l];
    *L = (struct kmoe_lora){.Agu = w->Agu,
                            .Bgu = w->Bgu,
                            .Ad = w->Ad,
                            .Bd = w->Bd,
                            .gAgu = g ? g->Agu : NULL,
                            .gBgu = g ? g->Bgu : NULL,
                            .gAd = g ? g->Ad : NULL,
                            .gBd = g ? g->Bd : NULL,
                            .Rgu = w->Agu ? 2 * r : 0,
                            .Rd = w->Ad ? r : 0,
                            .scale = a->scale};
    L->tmp = scratch(m, kmoe_lora_scratch(nk ? nk : 1, m->cfg.hidden_size, m->cfg.moe_intermediate, L->Rgu, L->Rd));
    return L;
}

static void lora_make_grads(struct model *m) { model_trainable(m); }

static const struct model_hook g_lora_hook = {
    .proj_forward = lora_proj_forward,
    .proj_backward = lora_proj_backward,
    .router_forward = lora_router_forward,
    .router_backward = lora_router_backward,
    .experts = lora_moe,
    .make_grads = lora_make_grads,
    .release = lora_detach,
};

const char *lora_moe_text(const struct model *m, char *buf, size_t len)
{
    const struct lora *a = m->lora;
    if (len)
        buf[0] = 0;
    if (!a || !m->cfg.n_experts || !(a->cfg.targets & g_mlp || a->cfg.router))
        return buf;
    const bool gu = a->cfg.targets & (1u << PROJ_GATE), dn = a->cfg.targets & (1u << PROJ_DOWN);
    if (gu || dn)
        snprintf(buf, len, " (the MLP's on each of the %d experts%s%s)", m->cfg.n_experts,
                 gu ? ", gate and up as one gate_up_proj adapter of rank 2r" : "",
                 a->cfg.router ? "; and the router" : "");
    else
        snprintf(buf, len, " (and the router)");
    return buf;
}

bool lora_names_all_linear(const char *list) { return list && strstr(list, "all-linear") != NULL; }

/* ------------------------------------------------------------------ the trainable buffer */

struct trainable model_trainable(struct model *m)
{
    struct lora *a = m->lora;
    if (!a) {
        model_alloc_grads(m);
        return (struct trainable){m->w.mem, m->grad->mem, m->w.n_floats};
    }
    if (!a->grad) {
        a->grad = k_calloc(m->K, (a->n ? a->n : 1) * sizeof(float), KMEM_GRADS, "the LoRA adapter's gradients");
        lora_layout(m, &a->cfg, a->grad, a->g);
    }
    return (struct trainable){a->mem, a->grad, a->n};
}

void model_trainable_zero_grads(struct model *m)
{
    struct trainable tr = model_trainable(m);
    k_zero(m->K, tr.grads, tr.n * sizeof(float));
}

/* ------------------------------------------------------------------ PEFT's files */

/* The named tensors of an adapter laid out for shard sh over buf (never NULL), each with its place in the whole
 * adapter's tensor: a column-parallel projection's B split by rows as its weight is (its A whole on every TP rank),
 * a row-parallel one's A by columns (its B whole); a part whole on several ranks is owned by the first of them
 * (TP rank 0; with replicated KV heads, the first rank holding them; the dense parts under EP: EP rank 0). */
static int refs_over(const struct model_config *mc, const struct model_shard *sh, const struct lora_config *c,
                     const float *buf, struct param_ref *refs, int max)
{
    struct lora_layer *lay = xcalloc((size_t)mc->n_layers, sizeof *lay);
    layout_over(mc, sh, c, (float *)buf, lay);
    const struct model_shard one = whole_shard(mc);
    const int64_t r = c->rank, hd = mc->head_dim;
    const bool ep0 = sh->ep_rank == 0, first = sh->tp_rank == 0 && ep0;
    const bool kv_owner = sh->tp_rank % (sh->kv_share > 0 ? sh->kv_share : 1) == 0 && ep0;
    int n = 0;
    for (int l = sh->layer_lo; l < sh->layer_hi; l++)
        for (int p = 0; p < PROJ_KINDS; p++) {
            if (!lay[l].A[p])
                continue;
            int din, dout, fin, fout;
            model_shard_proj_dims(mc, sh, (enum proj_kind)p, &din, &dout);
            model_shard_proj_dims(mc, &one, (enum proj_kind)p, &fin, &fout);
            const bool row = p == PROJ_O || p == PROJ_DOWN, kv = p == PROJ_K || p == PROJ_V;
            const int64_t at = p == PROJ_Q || p == PROJ_O ? (int64_t)sh->head_lo * hd
                               : kv                       ? (int64_t)sh->kv_lo * hd
                                                          : (int64_t)sh->inter_lo;
            for (int ab = 0; ab < 2; ab++, n++) {
                if (!refs || n >= max)
                    continue;
                struct param_ref *f = &refs[n];
                memset(f, 0, sizeof *f);
                snprintf(f->name, sizeof f->name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                         lora_proj_module((enum proj_kind)p), g_proj_names[p], ab ? 'B' : 'A');
                f->data = ab ? lay[l].B[p] : lay[l].A[p];
                f->n_dims = 2;
                f->shape[0] = ab ? dout : r;
                f->shape[1] = ab ? r : din;
                f->full[0] = ab ? fout : r;
                f->full[1] = ab ? r : fin;
                f->numel = (size_t)f->shape[0] * (size_t)f->shape[1];
                const bool whole = row ? ab == 1 : ab == 0; /* the matrix on the unsplit side */
                f->split = whole ? 0 : row ? 2 : 1;
                f->at = whole ? 0 : at;
                f->owner = whole ? first : kv ? kv_owner : ep0;
            }
        }
    /* a mixture of experts: the experts' adapters (PEFT's ParamWrapper on transformers' fused parameters: with both,
     * gate_up_proj's is the inner one, under base_layer) and the router's */
    const int64_t El = sh->n_experts, E = mc->n_experts, D = mc->hidden_size, F = mc->moe_intermediate;
    for (int l = sh->layer_lo; l < sh->layer_hi && E; l++) {
        const struct lora_layer *L = &lay[l];
        const bool both = L->Agu && L->Ad;
        const struct {
            const float *A, *B;
            const char *module;
            int64_t ra, din, dout, rb;
            bool owner;
        } ms[] = {
            {L->Agu, L->Bgu, both ? "mlp.experts.base_layer" : "mlp.experts", El * 2 * r, D, 2 * F, 2 * r * El, true},
            {L->Ad, L->Bd, "mlp.experts", El * r, F, D, r * El, true},
            {L->Ar, L->Br, "mlp.gate", r, D, E, r, first}};
        for (size_t k = 0; k < sizeof ms / sizeof *ms; k++) {
            if (!ms[k].A)
                continue;
            for (int ab = 0; ab < 2; ab++, n++) {
                if (!refs || n >= max)
                    continue;
                struct param_ref *f = &refs[n];
                memset(f, 0, sizeof *f);
                snprintf(f->name, sizeof f->name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l, ms[k].module,
                         ab ? 'B' : 'A');
                f->data = (float *)(ab ? ms[k].B : ms[k].A);
                f->n_dims = 2;
                f->shape[0] = f->full[0] = ab ? ms[k].dout : ms[k].ra;
                f->shape[1] = f->full[1] = ab ? ms[k].rb : ms[k].din;
                f->numel = (size_t)f->shape[0] * (size_t)f->shape[1];
                f->owner = ms[k].owner;
            }
        }
    }
    free(lay);
    return n;
}

int lora_refs(const struct model *m, const float *buf, struct param_ref *refs, int max)
{
    const struct lora *a = m->lora;
    return a ? refs_over(&m->cfg, &m->sh, &a->cfg, buf, refs, max) : 0;
}

/* The named tensors of a buffer laid out as shard sh's adapter (refs_over), allocated; the count in *n. */
static struct param_ref *refs_alloc(const struct model_config *mc, const struct model_shard *sh,
                                    const struct lora_config *c, const float *buf, int *n)
{
    *n = refs_over(mc, sh, c, buf, NULL, 0);
    struct param_ref *r = xcalloc((size_t)(*n ? *n : 1), sizeof *r);
    refs_over(mc, sh, c, buf, r, *n);
    return r;
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
        if (a->cfg.targets & (1u << p) && !(moe && (g_mlp & (1u << p))))
            json_array_append_new(tm, json_string(g_proj_names[p]));
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

/* The adapter (or its gradients' layout) on the host, with its named tensors over that copy. The caller frees
 * *host and *refs. Returns the count. */
static int host_refs(const struct model *m, float **host, struct param_ref **refs)
{
    const struct lora *a = m->lora;
    if (!a)
        check_failf(__FILE__, __LINE__, "host_refs: the model has no LoRA adapter");
    *host = xmalloc((a->n ? a->n : 1) * sizeof(float));
    k_to_host(m->K, *host, a->mem, a->n * sizeof(float));
    const int n = lora_refs(m, *host, NULL, 0);
    *refs = xcalloc((size_t)(n ? n : 1), sizeof **refs);
    lora_refs(m, *host, *refs, n);
    return n;
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
    const int n = host_refs(m, &host, &refs);
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
    const struct model_shard one = whole_shard(&m->cfg);
    const size_t nw = layout_over(&m->cfg, &one, have, NULL, NULL);
    float *whole = xcalloc(nw ? nw : 1, sizeof(float));
    int n;
    struct param_ref *refs = refs_alloc(&m->cfg, &one, have, whole, &n);
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

/* W (Dout, Din) += s B (Dout, r) A (r, Din), each entry summed in double (as fp32 as PEFT's merge). */
static void add_scaled_product(float *W, const float *A, const float *B, int dout, int din, int r, float scale)
{
    for (int o = 0; o < dout; o++)
        for (int i = 0; i < din; i++) {
            double s = 0;
            for (int k = 0; k < r; k++)
                s += (double)B[(size_t)o * r + k] * A[(size_t)k * din + i];
            W[(size_t)o * din + i] += (float)(scale * s);
        }
}

/* Expert e's B (O, R) out of PEFT's (O, R E) with its columns interleaved (j E + e); the caller frees it. */
static float *de_interleave(const float *B, int O, int R, int E, int e)
{
    float *out = xmalloc((size_t)O * (size_t)R * sizeof(float));
    for (int o = 0; o < O; o++)
        for (int j = 0; j < R; j++)
            out[(size_t)o * R + j] = B[((size_t)o * R + j) * E + e];
    return out;
}

/* Add every adapted projection's scale * B A to its weight in w, a host copy of m's own parameters (m->w.mem's
 * layout). */
static void add_adapters(const struct model *m, float *w)
{
    const struct lora *a = m->lora;
    float *host;
    struct param_ref *refs;
    host_refs(m, &host, &refs);
    free(refs);
    for (int l = 0; l < a->n_layers; l++)
        for (int p = 0; p < PROJ_KINDS; p++) {
            if (!a->w[l].A[p])
                continue;
            int din, dout;
            model_proj_dims(m, (enum proj_kind)p, &din, &dout);
            const struct layer_params *L = &m->w.layers[l];
            const float *const ws[PROJ_KINDS] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
            const float *A = host + (a->w[l].A[p] - a->mem), *B = host + (a->w[l].B[p] - a->mem);
            if (!(m->cfg.n_experts && (g_mlp & (1u << p))))
                add_scaled_product(w + (ws[p] - m->w.mem), A, B, dout, din, a->cfg.rank, a->scale);
        }
    const int El = m->sh.n_experts, D = m->cfg.hidden_size, F = m->cfg.moe_intermediate, r = a->cfg.rank;
    const size_t fd = (size_t)F * (size_t)D;
    for (int l = 0; l < a->n_layers && m->cfg.n_experts; l++) {
        const struct lora_layer *Lw = &a->w[l];
        const struct layer_params *L = &m->w.layers[l];
        if (Lw->Ar)
            add_scaled_product(w + (L->router - m->w.mem), host + (Lw->Ar - a->mem), host + (Lw->Br - a->mem),
                               m->cfg.n_experts, D, r, a->scale);
        for (int e = 0; e < El; e++) {
            if (Lw->Agu) { /* gate rows of expert e's B first, then up's */
                const int R = 2 * r;
                float *Be = de_interleave(host + (Lw->Bgu - a->mem), 2 * F, R, El, e);
                const float *A = host + (Lw->Agu - a->mem) + (size_t)e * R * D;
                add_scaled_product(w + (L->w_gate - m->w.mem) + e * fd, A, Be, F, D, R, a->scale);
                add_scaled_product(w + (L->w_up - m->w.mem) + e * fd, A, Be + (size_t)F * R, F, D, R, a->scale);
                free(Be);
            }
            if (Lw->Ad) {
                float *Be = de_interleave(host + (Lw->Bd - a->mem), D, r, El, e);
                const float *A = host + (Lw->Ad - a->mem) + (size_t)e * r * F;
                add_scaled_product(w + (L->w_down - m->w.mem) + e * fd, A, Be, D, F, r, a->scale);
                free(Be);
            }
        }
    }
    free(host);
}

void lora_merge(struct model *m)
{
    if (!m->lora)
        return;
    const size_t bytes = m->w.n_floats * sizeof(float);
    float *w = xmalloc(bytes);
    k_to_host(m->K, w, m->w.mem, bytes);
    add_adapters(m, w);
    k_to_device(m->K, m->w.mem, w, bytes);
    free(w);
    lora_detach(m);
}

void lora_merged_weights(const struct model *m, float *out)
{
    k_to_host(m->K, out, m->w.mem, m->w.n_floats * sizeof(float));
    if (m->lora && !m->lora->bypass)
        add_adapters(m, out);
}

/* ------------------------------------------------------------------ expert parallelism */

void lora_expert_span(const struct model *m, int l, size_t *lo, size_t *hi)
{
    const struct lora *a = m->lora;
    *lo = *hi = 0;
    if (!a || !a->moe)
        return;
    const struct lora_layer *L = &a->w[l];
    const size_t r = (size_t)a->cfg.rank, El = (size_t)m->sh.n_experts, D = (size_t)m->cfg.hidden_size;
    const size_t F = (size_t)m->cfg.moe_intermediate;
    *lo = (size_t)((L->Agu ? L->Agu : L->Ad) - a->mem);
    *hi = L->Ad ? (size_t)(L->Bd - a->mem) + D * r * El : (size_t)(L->Bgu - a->mem) + 2 * F * 2 * r * El;
}

void trainable_expert_span(const struct model *m, int l, size_t *lo, size_t *hi)
{
    if (m->lora)
        lora_expert_span(m, l, lo, hi);
    else
        model_expert_span(m, l, lo, hi);
}

double lora_owned_sq(const struct model *m, const float *g)
{
    const struct lora *a = m->lora;
    double s = 0;
    size_t at = 0;
    for (int l = 0; l <= a->n_layers; l++) {
        size_t lo = a->n, hi = a->n; /* past the last layer: the rest */
        if (l < a->n_layers)
            lora_expert_span(m, l, &lo, &hi);
        if (hi == lo && l < a->n_layers)
            continue;
        if (m->sh.ep_rank == 0) /* the dense parts are the same on every EP rank: counted once */
            s += k_sumsq(m->K, g + at, lo - at);
        s += k_sumsq(m->K, g + lo, hi - lo);
        at = hi;
    }
    return s;
}

/* Copy between an EP rank's adapter buffer (local, its layout; its experts from lo) and the whole adapter's (E
 * experts): its experts' rows of A and interleaved columns of B, and with dense the rest (the attention's and the
 * router's adapters). to_whole: local into whole; else whole into local. */
static void ep_copy(const struct model *m, float *local, float *whole, int lo, bool to_whole, bool dense)
{
    const struct lora *a = m->lora;
    const int n_layers = m->cfg.n_layers, El = m->sh.n_experts, E = m->cfg.n_experts, r = a->cfg.rank;
    const int D = m->cfg.hidden_size, F = m->cfg.moe_intermediate;
    struct lora_layer *ll = xcalloc((size_t)n_layers, sizeof *ll), *wl = xcalloc((size_t)n_layers, sizeof *wl);
    const struct model_shard one = whole_shard(&m->cfg);
    layout_over(&m->cfg, &m->sh, &a->cfg, local, ll);
    layout_over(&m->cfg, &one, &a->cfg, whole, wl);
#define CP(dst_w, src_l, n)                                                                                            \
    do {                                                                                                               \
        if (to_whole)                                                                                                  \
            memcpy(dst_w, src_l, (size_t)(n) * sizeof(float));                                                         \
        else                                                                                                           \
            memcpy(src_l, dst_w, (size_t)(n) * sizeof(float));                                                         \
    } while (0)
    for (int l = 0; l < n_layers; l++) {
        const struct lora_layer *L = &ll[l], *W = &wl[l];
        if (dense) {
            for (int p = 0; p < PROJ_KINDS; p++) {
                if (!L->A[p])
                    continue;
                int din, dout;
                model_proj_dims(m, (enum proj_kind)p, &din, &dout);
                CP(W->A[p], L->A[p], (size_t)r * din);
                CP(W->B[p], L->B[p], (size_t)dout * r);
            }
            if (L->Ar) {
                CP(W->Ar, L->Ar, (size_t)r * D);
                CP(W->Br, L->Br, (size_t)E * r);
            }
        }
        const struct {
            float *Al, *Bl, *Aw, *Bw;
            int R, din, dout;
        } xs[] = {{L->Agu, L->Bgu, W->Agu, W->Bgu, 2 * r, D, 2 * F}, {L->Ad, L->Bd, W->Ad, W->Bd, r, F, D}};
        for (int k = 0; k < 2; k++) {
            if (!xs[k].Al)
                continue;
            const size_t R = (size_t)xs[k].R;
            CP(xs[k].Aw + (size_t)lo * R * xs[k].din, xs[k].Al, (size_t)El * R * xs[k].din);
            for (int o = 0; o < xs[k].dout; o++)
                for (size_t j = 0; j < R; j++)
                    for (int e = 0; e < El; e++) {
                        float *w = xs[k].Bw + ((size_t)o * R + j) * E + lo + e;
                        float *x = xs[k].Bl + ((size_t)o * R + j) * El + e;
                        if (to_whole)
                            *w = *x;
                        else
                            *x = *w;
                    }
        }
    }
#undef CP
    free(ll);
    free(wl);
}

size_t lora_whole_floats(const struct model *m)
{
    const struct model_shard one = whole_shard(&m->cfg);
    return m->lora ? layout_over(&m->cfg, &one, &m->lora->cfg, NULL, NULL) : 0;
}

/* Tensor and pipeline parallelism: every rank's part (its layout, at all + r per for mp rank r) placed into the
 * whole adapter, each part by the rank that owns it. */
static void mp_place(const struct model *m, const float *all, size_t per, float *whole)
{
    const struct lora *a = m->lora;
    const struct model_shard one = whole_shard(&m->cfg);
    int nw;
    struct param_ref *w = refs_alloc(&m->cfg, &one, &a->cfg, whole, &nw);
    for (int r = 0; r < m->sh.tp_size * m->sh.pp_size; r++) { /* mp rank r: TP rank r % TP of stage r / TP */
        const struct model_shard sh = model_shard_of_mp(m, r);
        int n, hint = 0;
        struct param_ref *l = refs_alloc(&m->cfg, &sh, &a->cfg, all + (size_t)r * per, &n);
        for (int i = 0; i < n; i++)
            if (l[i].owner)
                model_part_copy(kctx_cpu(), &l[i], l[i].data, model_whole_ref(w, nw, &l[i], &hint)->data, true);
        free(l);
    }
    free(w);
}

void lora_mp_gather(const struct model *m, const float *local, float *whole)
{
    const struct lora *a = m->lora;
    if (!m->sh.mp && !m->sh.ep) {
        if (whole)
            memcpy(whole, local, a->n * sizeof(float));
        return;
    }
    if (m->sh.ep) { /* every EP rank's experts (TP and PP are 1: lora_attach) */
        const int P = m->sh.ep_size;
        float *all = xmalloc((a->n ? a->n : 1) * (size_t)P * sizeof(float));
        comm_allgather(m->sh.ep, local, all, a->n, COMM_F32);
        for (int p = 0; p < P && whole; p++)
            ep_copy(m, all + (size_t)p * a->n, whole, p * m->sh.n_experts, true, p == 0);
        free(all);
        return;
    }
    const int n_mp = m->sh.tp_size * m->sh.pp_size;
    size_t per = 1; /* the largest part: stages differ */
    for (int r = 0; r < n_mp; r++) {
        const struct model_shard sh = model_shard_of_mp(m, r);
        const size_t k = layout_over(&m->cfg, &sh, &a->cfg, NULL, NULL);
        per = k > per ? k : per;
    }
    float *send = xcalloc(per, sizeof(float)), *all = xmalloc((size_t)n_mp * per * sizeof(float));
    memcpy(send, local, a->n * sizeof(float));
    comm_allgather(m->sh.mp, send, all, per, COMM_F32);
    if (whole)
        mp_place(m, all, per, whole);
    free(send);
    free(all);
}

void lora_mp_slice(const struct model *m, const float *whole, float *local)
{
    const struct lora *a = m->lora;
    if (m->sh.ep) {
        ep_copy(m, local, (float *)whole, m->sh.expert_lo, false, true);
        return;
    }
    if (!m->sh.mp) {
        memcpy(local, whole, a->n * sizeof(float));
        return;
    }
    const struct model_shard one = whole_shard(&m->cfg);
    int nw, n, hint = 0;
    struct param_ref *w = refs_alloc(&m->cfg, &one, &a->cfg, whole, &nw);
    struct param_ref *l = refs_alloc(&m->cfg, &m->sh, &a->cfg, local, &n);
    for (int i = 0; i < n; i++)
        model_part_copy(kctx_cpu(), &l[i], l[i].data, model_whole_ref(w, nw, &l[i], &hint)->data, false);
    free(l);
    free(w);
}

/* ------------------------------------------------------------------ tensor and pipeline parallelism */

void lora_sync_grads(struct model *m)
{
    struct lora *a = m->lora;
    if (!a || !a->grad || !m->sh.tp)
        return;
    const int r = a->cfg.rank;
    const bool kv_shared = m->sh.kv_share > 1;
    /* per adapted projection of this stage: the matrix every TP rank holds whole (a column-parallel projection's
     * A, a row-parallel one's B), a partial sum on each; and with replicated KV heads, k's and v's B rows placed at
     * their rows of the whole B, so that the sum gives each KV head the sum over the ranks that share it */
    struct span {
        float *g;
        size_t n, at; /* floats of g, and where they go in the block */
        size_t block; /* the block's floats in the sum */
    };
    struct span *sp = xcalloc(2 * (size_t)(m->sh.layer_hi - m->sh.layer_lo) * PROJ_KINDS + 1, sizeof *sp);
    int ns = 0;
    size_t total = 0;
    for (int l = m->sh.layer_lo; l < m->sh.layer_hi; l++)
        for (int p = 0; p < PROJ_KINDS; p++) {
            if (!a->g[l].A[p])
                continue;
            int din, dout;
            model_proj_dims(m, (enum proj_kind)p, &din, &dout);
            const bool row = p == PROJ_O || p == PROJ_DOWN, kv = p == PROJ_K || p == PROJ_V;
            if (row)
                sp[ns++] = (struct span){a->g[l].B[p], (size_t)dout * r, 0, (size_t)dout * r};
            else
                sp[ns++] = (struct span){a->g[l].A[p], (size_t)r * din, 0, (size_t)r * din};
            if (kv && kv_shared) {
                const size_t full = (size_t)m->cfg.n_kv_heads * m->cfg.head_dim;
                const size_t at = (size_t)m->sh.kv_lo * m->cfg.head_dim * r;
                sp[ns++] = (struct span){a->g[l].B[p], (size_t)dout * r, at, full * r};
            }
        }
    for (int i = 0; i < ns; i++)
        total += sp[i].block;
    const size_t bytes = (total ? total : 1) * sizeof(float);
    float *buf = k_calloc(m->K, bytes, KMEM_OTHER, "the LoRA gradients summed over TP");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            comm_allreduce_sum(m->sh.tp, buf, total, COMM_F32);
        size_t off = 0;
        for (int i = 0; i < ns; i++) {
            float *b = buf + off + sp[i].at;
            k_copy(m->K, pass ? sp[i].g : b, pass ? b : sp[i].g, sp[i].n * sizeof(float));
            off += sp[i].block;
        }
    }
    k_free(m->K, buf, bytes, KMEM_OTHER);
    free(sp);
}

double lora_owned_sq_range(const struct model *m, const float *buf, size_t lo, size_t hi)
{
    const struct lora *a = m->lora;
    int n;
    struct param_ref *r = refs_alloc(&m->cfg, &m->sh, &a->cfg, a->mem, &n);
    double s = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].owner)
            continue;
        size_t x = (size_t)(r[i].data - a->mem), y = x + r[i].numel;
        x = x > lo ? x : lo;
        y = y < hi ? y : hi;
        if (x < y)
            s += k_sumsq(m->K, buf + (x - lo), y - x);
    }
    free(r);
    return s;
}
