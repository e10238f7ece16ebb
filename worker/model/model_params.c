/* The parameters' layout: which tensors a shard holds (model_shard_of: its heads, rows, vocabulary, layers and
 * experts under TP, PP and EP), where each sits in the shard's one buffer, their spans (a layer's, its experts'),
 * their Hugging Face names with their place in the whole tensors (model_param_refs), and the projections' sizes. */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model_internal.h"

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
        if (c->n_experts) { /* the router, then every expert's gate, up and down, expert after expert */
            const size_t E = (size_t)c->n_experts, El = (size_t)sh->n_experts, Fe = (size_t)sh->moe_inter;
            TAKE(L->router, E * D);
            TAKE(L->w_gate, El * Fe * D); /* this rank's experts only under EP, its rows of them under TP */
            TAKE(L->w_up, El * Fe * D);
            TAKE(L->w_down, El * D * Fe);
        } else {
            TAKE(L->w_gate, F * D);
            TAKE(L->w_up, F * D);
            TAKE(L->w_down, D * F);
        }
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
    sh.ep_size = 1;
    sh.n_experts = c->n_experts;
    sh.moe_inter = c->moe_intermediate / tp;
    sh.moe_inter_lo = r * sh.moe_inter;
    return sh;
}

void model_shard_set_ep(struct model_shard *sh, const struct model_config *c, int r, int ep)
{
    sh->ep_rank = r;
    sh->ep_size = ep;
    sh->n_experts = c->n_experts / ep;
    sh->expert_lo = r * sh->n_experts;
}

void model_shard_set_experts_over_tp(struct model_shard *sh, const struct model_config *c)
{
    sh->experts_over_tp = true;
    sh->n_experts = c->n_experts / sh->tp_size;
    sh->expert_lo = sh->tp_rank * sh->n_experts;
    sh->moe_inter = c->moe_intermediate;
    sh->moe_inter_lo = 0;
}

struct model_shard model_shard_of_mp(const struct model *m, int r)
{
    const struct model_shard *sh = &m->sh;
    const int T = sh->tp_size, E = sh->ep_size > 1 ? sh->ep_size : 1; /* r = (stage x EP + EP rank) x TP + TP rank */
    struct model_shard s = model_shard_of(&m->cfg, r % T, T, r / (T * E), sh->pp_size);
    if (E > 1)
        model_shard_set_ep(&s, &m->cfg, (r / T) % E, E);
    if (sh->experts_over_tp)
        model_shard_set_experts_over_tp(&s, &m->cfg);
    return s;
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

void model_params_alloc(struct kctx *K, enum kmem_kind kind, const struct model_config *c, const struct model_shard *sh,
                        struct model_params *p)
{
    params_view(c, sh, NULL, p);
    p->mem = k_calloc(K, (p->n_floats ? p->n_floats : 1) * sizeof(float), kind,
                      kind == KMEM_GRADS ? "the gradients" : "the weights");
    layout(c, sh, p);
}

void model_params_free(struct kctx *K, enum kmem_kind kind, struct model_params *p)
{
    k_free(K, p->mem, (p->n_floats ? p->n_floats : 1) * sizeof(float), kind);
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

void model_expert_span(const struct model *m, int l, size_t *lo, size_t *hi)
{
    const struct layer_params *L = &m->w.layers[l];
    *lo = *hi = 0;
    if (!L->router)
        return;
    *lo = (size_t)(L->w_gate - m->w.mem);
    *hi = *lo + 3 * (size_t)m->sh.n_experts * (size_t)m->sh.moe_inter * (size_t)m->cfg.hidden_size;
}

void model_layer_span(const struct model *m, int l, size_t *lo, size_t *hi)
{
    const struct model_shard *sh = &m->sh;
    if (l < sh->layer_lo || l >= sh->layer_hi)
        check_failf(__FILE__, __LINE__, "model_layer_span: layer %d is not in this shard (%d..%d)", l, sh->layer_lo,
                    sh->layer_hi - 1);
    /* layout(): each layer's tensors in one run, from its attention norm to the next layer's (or the final norm) */
    *lo = (size_t)(m->w.layers[l].attn_norm - m->w.mem);
    *hi = l + 1 < sh->layer_hi ? (size_t)(m->w.layers[l + 1].attn_norm - m->w.mem)
          : sh->has_head       ? (size_t)(m->w.final_norm - m->w.mem)
                               : m->w.n_floats;
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
    /* under EP everything but the experts is whole on every EP rank: counted on the first */
    const bool ep0 = sh->ep_rank == 0;
    const bool first = sh->tp_rank == 0 && ep0, kv_owner = sh->tp_rank % sh->kv_share == 0 && ep0;
    const struct part whole = {0, 0, D, 0, first}, vocab = {1, sh->vocab_lo, c->vocab_size, D, ep0};
    const struct part head_norm = {0, 0, hd, 0, first}; /* Qwen3's q/k norms: whole on every TP rank */
    const struct part q_rows = {1, sh->head_lo * hd, FQ, D, ep0}, kv_rows = {1, sh->kv_lo * hd, FK, D, kv_owner};
    const struct part o_cols = {2, sh->head_lo * hd, D, FQ, ep0};
    const struct part f_rows = {1, sh->inter_lo, FF, D, ep0}, f_cols = {2, sh->inter_lo, D, FF, ep0};
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
        if (c->n_experts) { /* under EP this rank's experts, named by their global index; under TP its rows of each */
            const struct model_arch_info *fam = model_arch_info(c->arch);
            const int64_t E = c->n_experts, El = sh->n_experts, Fe = sh->moe_inter, FE = c->moe_intermediate;
            /* the router: whole and the same on every TP rank, counted on the first; each EP rank owns its experts'
             * parts */
            const struct part router = {0, 0, E, D, first};
            const struct part ew = {1, sh->moe_inter_lo, FE, D, true}, dw = {2, sh->moe_inter_lo, D, FE, true};
            char sfx[64];
            snprintf(sfx, sizeof sfx, "%s.%s.weight", fam->moe_block, fam->moe_router);
            REF(sfx, L->router, 2, E, D, router);
            for (int64_t e = 0; e < El; e++) {
                const size_t off = (size_t)(e * Fe * D);
                const int g = sh->expert_lo + (int)e;
                snprintf(sfx, sizeof sfx, "%s.experts.%d.%s.weight", fam->moe_block, g, fam->moe_gate);
                REF(sfx, L->w_gate ? L->w_gate + off : NULL, 2, Fe, D, ew);
                snprintf(sfx, sizeof sfx, "%s.experts.%d.%s.weight", fam->moe_block, g, fam->moe_up);
                REF(sfx, L->w_up ? L->w_up + off : NULL, 2, Fe, D, ew);
                snprintf(sfx, sizeof sfx, "%s.experts.%d.%s.weight", fam->moe_block, g, fam->moe_down);
                REF(sfx, L->w_down ? L->w_down + off : NULL, 2, D, Fe, dw);
            }
        } else {
            REF("mlp.gate_proj.weight", L->w_gate, 2, F, D, f_rows);
            REF("mlp.up_proj.weight", L->w_up, 2, F, D, f_rows);
            REF("mlp.down_proj.weight", L->w_down, 2, D, F, f_cols);
        }
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

void model_shard_proj_dims(const struct model_config *c, const struct model_shard *sh, enum proj_kind p, int *din,
                           int *dout)
{
    const int D = c->hidden_size, F = sh->inter, QD = sh->n_heads * c->head_dim, KD = sh->n_kv_heads * c->head_dim;
    static const int in_is[PROJ_KINDS] = {0, 0, 0, 1, 0, 0, 2}, out_is[PROJ_KINDS] = {1, 3, 3, 0, 2, 2, 0};
    const int dims[4] = {D, QD, F, KD};
    *din = dims[in_is[p]];
    *dout = dims[out_is[p]];
}

void model_proj_dims(const struct model *m, enum proj_kind p, int *din, int *dout)
{
    model_shard_proj_dims(&m->cfg, &m->sh, p, din, dout);
}
