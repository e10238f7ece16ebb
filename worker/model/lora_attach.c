/* LoRA adapters on a model: attached (the base frozen, the adapter installed as the model's projection hook),
 * the low-rank terms' forward and backward on the projections, the router and the experts (the hook's entries), the
 * trainable buffer, and the adapter merged into the base weights. */
#include "lora_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model_internal.h"

#define ERR(...) error_set(err, errlen, __VA_ARGS__)

/* The adapter as the model's projection hook (struct model_hook): its terms on the projections, the router and the
 * experts, its gradients made before a backward, and its release with the model. */
static const struct model_hook g_lora_hook;
static void merged_free(struct lora *a);

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
    if (split && m->cfg.n_experts && (c->targets & LORA_MLP || c->router))
        return ERR("LoRA on the experts or the router of a mixture-of-experts model (%d experts) with training tensor "
                   "or pipeline parallelism (TP %d, PP %d): not available yet; list the attention projections "
                   "(target_modules=[q_proj,k_proj,v_proj,o_proj]), or set TP and PP to 1",
                   m->cfg.n_experts, m->sh.tp_size, m->sh.pp_size);
    if (c->rank < 1 || !(c->alpha > 0) || !(c->targets & LORA_ALL_LINEAR || (c->router && m->cfg.n_experts)) ||
        (c->targets & ~LORA_ALL_LINEAR))
        return ERR("LoRA needs a rank >= 1 (got %d), alpha > 0 (got %g) and at least one target projection", c->rank,
                   c->alpha);
    if (m->cfg.n_experts && (c->targets & LORA_MLP || c->router)) { /* a mixture of experts: its MLPs are the experts */
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
    if (m->cfg.n_experts && (a->cfg.targets & LORA_MLP))
        a->moe = xcalloc((size_t)a->n_layers, sizeof *a->moe);
    m->lora = a;
    model_set_hook(m, &g_lora_hook);
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
    merged_free(a);
    free(a->moe);
    free(a->w);
    free(a->g);
    free(a);
    m->lora = NULL;
    model_set_hook(m, NULL);
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

/* ------------------------------------------------------------------ batch-invariant mode's merged weights */

static void add_scaled_product(float *W, const float *A, const float *B, int dout, int din, int r, float scale);
static float *de_interleave(const float *B, int O, int R, int E, int e);

/* A weight with the adapter merged, and the A and B it was merged from. Slots of a layer: its projections, then
 * the router, the experts' gate, up and down (struct model_hook's moe_merged). */
struct lora_merged {
    float *W, *ab;
};
enum { MERGED_SLOTS = PROJ_KINDS + 4 };

static void merged_free(struct lora *a)
{
    for (int i = 0; a->bi && i < a->n_layers * MERGED_SLOTS; i++)
        free(a->bi[i].W), free(a->bi[i].ab);
    free(a->bi);
    a->bi = NULL;
}

/* Slot's merged weight, or NULL when it is out of date: then the base (nw floats) is copied into *c's W and A and B
 * are remembered, and the caller adds the adapter. Compared bit for bit with the A and B it was made from (an
 * optimizer step or a new version changes them). Host memory: the CPU's. */
static const float *merged_slot(struct lora *a, int l, int slot, const float *A, size_t na, const float *B, size_t nb,
                                const float *base, size_t nw, struct lora_merged **c)
{
    const size_t fs = sizeof(float);
    if (!a->bi)
        a->bi = xcalloc((size_t)a->n_layers * MERGED_SLOTS, sizeof *a->bi);
    struct lora_merged *m = *c = &a->bi[(size_t)l * MERGED_SLOTS + slot];
    if (m->W && memcmp(m->ab, A, na * fs) == 0 && memcmp(m->ab + na, B, nb * fs) == 0)
        return m->W;
    if (!m->W)
        m->W = xmalloc(nw * fs), m->ab = xmalloc((na + nb) * fs);
    memcpy(m->ab, A, na * fs);
    memcpy(m->ab + na, B, nb * fs);
    memcpy(m->W, base, nw * fs);
    return NULL;
}

static const float *base_weight(const struct layer_params *L, enum proj_kind p)
{
    const float *const w[PROJ_KINDS] = {L->wq, L->wk, L->wv, L->wo, L->w_gate, L->w_up, L->w_down};
    return w[p];
}

/* W + s B A of projection p of layer l, each entry as lora_merged_weights makes it (add_scaled_product), so that
 * the trainer's forward and a rollout given the merged weights multiply by the same W. */
static const float *lora_proj_merged(const struct model *m, int l, enum proj_kind p)
{
    struct lora *a = m->lora;
    if (!a || a->bypass || !a->w[l].A[p] || (m->cfg.n_experts && (LORA_MLP & (1u << p))))
        return NULL;
    int din, dout;
    model_proj_dims(m, p, &din, &dout);
    const int r = a->cfg.rank;
    const float *A = a->w[l].A[p], *B = a->w[l].B[p];
    struct lora_merged *c;
    if (!merged_slot(a, l, p, A, (size_t)r * din, B, (size_t)dout * r, base_weight(&m->w.layers[l], p),
                     (size_t)dout * din, &c))
        add_scaled_product(c->W, A, B, dout, din, r, a->scale);
    return c->W;
}

/* The experts' adapter of layer l (which 1 and 2: gate_up_proj's gate and up rows; 3: down) added to W, this
 * shard's experts' weights of that projection, expert by expert; ad is the adapter in a->mem's layout. */
static void add_expert_terms(const struct model *m, int l, int which, const float *ad, float *W)
{
    const struct lora *a = m->lora;
    const struct lora_layer *Lw = &a->w[l];
    const int El = m->sh.n_experts, D = m->cfg.hidden_size, F = m->cfg.moe_intermediate, r = a->cfg.rank;
    const size_t fd = (size_t)F * (size_t)D;
    for (int e = 0; e < El; e++) {
        if (which < 3) { /* gate rows of expert e's B first, then up's */
            const int R = 2 * r;
            float *Be = de_interleave(ad + (Lw->Bgu - a->mem), 2 * F, R, El, e);
            const float *A = ad + (Lw->Agu - a->mem) + (size_t)e * R * D;
            add_scaled_product(W + e * fd, A, Be + (which == 2 ? (size_t)F * R : 0), F, D, R, a->scale);
            free(Be);
        } else {
            float *Be = de_interleave(ad + (Lw->Bd - a->mem), D, r, El, e);
            add_scaled_product(W + e * fd, ad + (Lw->Ad - a->mem) + (size_t)e * r * F, Be, D, F, r, a->scale);
            free(Be);
        }
    }
}

/* A mixture of experts' router (which 0) or experts' gate, up or down (1, 2, 3) of layer l merged, as the
 * projections' are; NULL where it has no adapter. */
static const float *lora_moe_merged(const struct model *m, int l, int which)
{
    struct lora *a = m->lora;
    if (!a || a->bypass)
        return NULL;
    const struct lora_layer *Lw = &a->w[l];
    const struct layer_params *L = &m->w.layers[l];
    const size_t r = (size_t)a->cfg.rank, El = (size_t)m->sh.n_experts, D = (size_t)m->cfg.hidden_size;
    const size_t F = (size_t)m->cfg.moe_intermediate, E = (size_t)m->cfg.n_experts;
    const float *A = which == 0 ? Lw->Ar : which < 3 ? Lw->Agu : Lw->Ad;
    const float *B = which == 0 ? Lw->Br : which < 3 ? Lw->Bgu : Lw->Bd;
    const float *base = which == 0 ? L->router : which == 1 ? L->w_gate : which == 2 ? L->w_up : L->w_down;
    if (!A)
        return NULL;
    const size_t na = which == 0 ? r * D : which < 3 ? El * 2 * r * D : El * r * F;
    const size_t nb = which == 0 ? E * r : which < 3 ? 2 * F * 2 * r * El : D * r * El;
    struct lora_merged *c;
    if (merged_slot(a, l, PROJ_KINDS + which, A, na, B, nb, base, which ? El * F * D : E * D, &c))
        return c->W;
    if (which == 0)
        add_scaled_product(c->W, A, B, (int)E, (int)D, (int)r, a->scale);
    else
        add_expert_terms(m, l, which, a->mem, c->W);
    return c->W;
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
    .proj_merged = lora_proj_merged,
    .moe_merged = lora_moe_merged,
    .experts = lora_moe,
    .make_grads = lora_make_grads,
    .release = lora_detach,
};

const char *lora_moe_text(const struct model *m, char *buf, size_t len)
{
    const struct lora *a = m->lora;
    if (len)
        buf[0] = 0;
    if (!a || !m->cfg.n_experts || !(a->cfg.targets & LORA_MLP || a->cfg.router))
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

/* ------------------------------------------------------------------ merging */

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
    lora_host_refs(m, &host, &refs);
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
            if (!(m->cfg.n_experts && (LORA_MLP & (1u << p))))
                add_scaled_product(w + (ws[p] - m->w.mem), A, B, dout, din, a->cfg.rank, a->scale);
        }
    const int D = m->cfg.hidden_size, r = a->cfg.rank;
    for (int l = 0; l < a->n_layers && m->cfg.n_experts; l++) {
        const struct lora_layer *Lw = &a->w[l];
        const struct layer_params *L = &m->w.layers[l];
        if (Lw->Ar)
            add_scaled_product(w + (L->router - m->w.mem), host + (Lw->Ar - a->mem), host + (Lw->Br - a->mem),
                               m->cfg.n_experts, D, r, a->scale);
        if (Lw->Agu) {
            add_expert_terms(m, l, 1, host, w + (L->w_gate - m->w.mem));
            add_expert_terms(m, l, 2, host, w + (L->w_up - m->w.mem));
        }
        if (Lw->Ad)
            add_expert_terms(m, l, 3, host, w + (L->w_down - m->w.mem));
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
