/* LoRA adapters (lora.h: what one is) laid out: where each layer's A and B (and the experts' and the router's)
 * sit in the adapter's one buffer on a shard, their PEFT names with their place in the whole adapter's tensors, the
 * whole adapter's size, a layer's experts' span, and the projections' names. */
#include "lora_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model_internal.h"

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
size_t lora_layout_over(const struct model_config *mc, const struct model_shard *sh, const struct lora_config *c,
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
            if (!(c->targets & (1u << p)) || (moe && (LORA_MLP & (1u << p))))
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

size_t lora_layout(const struct model *m, const struct lora_config *c, float *base, struct lora_layer *lay)
{
    return lora_layout_over(&m->cfg, &m->sh, c, base, lay);
}

/* The whole model's shard: every layer, row, column and expert (the whole adapter's layout, PEFT's). */
struct model_shard lora_whole_shard(const struct model_config *mc) { return model_shard_of(mc, 0, 1, 0, 1); }

/* The named tensors of an adapter laid out for shard sh over buf (never NULL), each with its place in the whole
 * adapter's tensor: a column-parallel projection's B split by rows as its weight is (its A whole on every TP rank),
 * a row-parallel one's A by columns (its B whole); a part whole on several ranks is owned by the first of them
 * (TP rank 0; with replicated KV heads, the first rank holding them; the dense parts under EP: EP rank 0). */
static int refs_over(const struct model_config *mc, const struct model_shard *sh, const struct lora_config *c,
                     const float *buf, struct param_ref *refs, int max)
{
    struct lora_layer *lay = xcalloc((size_t)mc->n_layers, sizeof *lay);
    lora_layout_over(mc, sh, c, (float *)buf, lay);
    const struct model_shard one = lora_whole_shard(mc);
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
struct param_ref *lora_refs_alloc(const struct model_config *mc, const struct model_shard *sh,
                                  const struct lora_config *c, const float *buf, int *n)
{
    *n = refs_over(mc, sh, c, buf, NULL, 0);
    struct param_ref *r = xcalloc((size_t)(*n ? *n : 1), sizeof *r);
    refs_over(mc, sh, c, buf, r, *n);
    return r;
}

/* The adapter (or its gradients' layout) on the host, with its named tensors over that copy. The caller frees
 * *host and *refs. Returns the count. */
int lora_host_refs(const struct model *m, float **host, struct param_ref **refs)
{
    const struct lora *a = m->lora;
    if (!a)
        check_failf(__FILE__, __LINE__, "lora_host_refs: the model has no LoRA adapter");
    *host = xmalloc((a->n ? a->n : 1) * sizeof(float));
    k_to_host(m->K, *host, a->mem, a->n * sizeof(float));
    const int n = lora_refs(m, *host, NULL, 0);
    *refs = xcalloc((size_t)(n ? n : 1), sizeof **refs);
    lora_refs(m, *host, *refs, n);
    return n;
}

size_t lora_whole_floats(const struct model *m)
{
    const struct model_shard one = lora_whole_shard(&m->cfg);
    return m->lora ? lora_layout_over(&m->cfg, &one, &m->lora->cfg, NULL, NULL) : 0;
}

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
