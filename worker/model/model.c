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
#include "lora.h"
#include "ring_attn.h"
#include "model_internal.h"
#include "moe_ep.h"
#include "sampler.h"

/* Tokens per chunk of the LM head: bounds the live logits (and their exponentials) to 2 x chunk x V floats, at
 * most 128 MB, and at most 256 tokens. Each chunk's product reads (and OpenBLAS packs) the whole head again, so
 * bigger chunks are faster: 256 tokens instead of 64 made SmolLM2's forward+backward 9% (fp32) and 12% (BF16)
 * faster (bench/model_bench, one thread). */
static int lmhead_chunk(int V)
{
    const int fit = (int)((1u << 24) / (unsigned)(V > 0 ? V : 1));
    return fit > 256 ? 256 : fit < 16 ? 16 : fit;
}
#define LMHEAD_CHUNK lmhead_chunk(m->cfg.vocab_size)
/* Largest logits buffer a forward keeps for its backward (PyTorch keeps all of them); above it the backward
 * recomputes the head's product chunk by chunk. 1024 rows of a 49152-token vocabulary: 201 MB. */
#define LMHEAD_KEEP_BYTES ((size_t)256 << 20)

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

struct model_shard model_shard_of_mp(const struct model *m, int r)
{
    const struct model_shard *sh = &m->sh;
    const int T = sh->tp_size, E = sh->ep_size > 1 ? sh->ep_size : 1; /* r = (stage x EP + EP rank) x TP + TP rank */
    struct model_shard s = model_shard_of(&m->cfg, r % T, T, r / (T * E), sh->pp_size);
    if (E > 1)
        model_shard_set_ep(&s, &m->cfg, (r / T) % E, E);
    return s;
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

void model_set_sp(struct model *m, struct comm *sp)
{
    m->sh.sp = sp && comm_size(sp) > 1 ? sp : NULL;
    m->sh.sp_rank = m->sh.sp ? comm_rank(sp) : 0;
    m->sh.sp_size = m->sh.sp ? comm_size(sp) : 1;
    m->sh.ring = false;
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

void model_set_cp(struct model *m, struct comm *cp)
{
    model_set_sp(m, cp);
    m->sh.ring = m->sh.sp != NULL;
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

static void params_alloc(struct kctx *K, enum kmem_kind kind, const struct model_config *c,
                         const struct model_shard *sh, struct model_params *p)
{
    params_view(c, sh, NULL, p);
    p->mem = k_calloc(K, (p->n_floats ? p->n_floats : 1) * sizeof(float), kind,
                      kind == KMEM_GRADS ? "the gradients" : "the weights");
    layout(c, sh, p);
}

static void params_free(struct kctx *K, enum kmem_kind kind, struct model_params *p)
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

void model_set_layer_grads_hook(struct model *m, void (*fn)(void *ud, int layer), void *ud)
{
    m->layer_grads_hook = fn;
    m->layer_grads_ud = ud;
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

static void work_free(struct model *m);

struct model *model_create_shard(const struct model_config *c, const struct model_layout *lay)
{
    return model_create_on(c, lay, NULL);
}

struct model *model_create_on(const struct model_config *c, const struct model_layout *lay, struct kctx *K)
{
    const struct model_layout whole = {0, 1, 0, 1, NULL, NULL, NULL, 0, 1, NULL};
    const struct model_layout *L = lay ? lay : &whole;
    const int ep = L->ep_size > 1 ? L->ep_size : 1;
    char why[256];
    if (model_shard_check(c, L->tp_size, "the TP size", why, sizeof why) != 0 ||
        model_stage_check(c, L->pp_size, "the PP size", why, sizeof why) != 0 ||
        model_ep_check(c, ep, L->tp_size, L->pp_size, "the EP size", why, sizeof why) != 0)
        check_failf(__FILE__, __LINE__, "model_create_shard: %s", why);
    if (ep > 1 && (L->ep_rank < 0 || L->ep_rank >= ep || !L->ep || (L->tp_size > 1 && !L->mp)))
        check_failf(__FILE__, __LINE__, "model_create_shard: EP rank %d of %d, or a missing group", L->ep_rank, ep);
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
    if (ep > 1) { /* the EP group holds one model copy between its ranks */
        model_shard_set_ep(&m->sh, c, L->ep_rank, ep);
        m->sh.ep = L->ep;
        /* the model copy: the EP group, or with TP or PP the EP x TP ranks of every stage (L->mp) */
        m->sh.mp = L->tp_size > 1 || L->pp_size > 1 ? L->mp : L->ep;
    }
    m->K = K ? K : kctx_cpu();
    if (ep > 1 && !k_has_moe_ep(m->K))
        check_failf(__FILE__, __LINE__,
                    "model_create: expert parallelism: the %s back-end has no row moves for its dispatch and combine",
                    m->K->ops->name);
    if (c->n_experts && !k_has_moe(m->K))
        check_failf(__FILE__, __LINE__,
                    "model_create: the %s back-end has no mixture-of-experts kernels yet (a %d-expert model runs on "
                    "the CPU)",
                    m->K->ops->name, c->n_experts);
    m->moe_aux_scale = 1.0f;
    params_alloc(m->K, KMEM_WEIGHTS, c, &m->sh, &m->w);
    const size_t nf = (size_t)(c->head_dim / 2 > 0 ? c->head_dim / 2 : 1);
    double *freqs = xcalloc(nf, sizeof(double));
    model_rope_freqs(c, freqs);
    m->rope_freqs = k_alloc(m->K, nf * sizeof(double), KMEM_WEIGHTS, "the RoPE frequencies");
    k_to_device(m->K, m->rope_freqs, freqs, nf * sizeof(double));
    free(freqs);
    return m;
}

struct model *model_create(const struct model_config *c) { return model_create_shard(c, NULL); }

struct model *model_clone(const struct model *m)
{
    const struct model_layout lay = {m->sh.tp_rank, m->sh.tp_size, m->sh.pp_rank, m->sh.pp_size, m->sh.tp,
                                     m->sh.pp,      m->sh.mp,      m->sh.ep_rank, m->sh.ep_size, m->sh.ep};
    struct model *r = model_create_on(&m->cfg, &lay, m->K);
    k_copy(m->K, r->w.mem, m->w.mem, m->w.n_floats * sizeof(float));
    r->moe_aux_coef = m->moe_aux_coef, r->moe_aux_scale = m->moe_aux_scale;
    r->moe_replay = m->moe_replay;
    model_set_sp(r, m->sh.sp);
    r->sh.ring = m->sh.ring; /* context parallelism: the same ring */
    return r;
}

/* n bytes of src, memory of context from, into dst, memory of context to. */
static void copy_between(struct kctx *to, void *dst, struct kctx *from, const void *src, size_t n)
{
    if (from->device == KDEV_CPU) {
        k_to_device(to, dst, src, n);
    } else if (to->device == KDEV_CPU) {
        k_to_host(from, dst, src, n);
    } else { /* device to device: through the host */
        void *h = xmalloc(n ? n : 1);
        k_to_host(from, h, src, n);
        k_to_device(to, dst, h, n);
        free(h);
    }
}

struct model *model_copy_to(const struct model *m, struct kctx *K)
{
    const struct model_layout lay = {m->sh.tp_rank, m->sh.tp_size, m->sh.pp_rank, m->sh.pp_size, m->sh.tp,
                                     m->sh.pp,      m->sh.mp,      m->sh.ep_rank, m->sh.ep_size, m->sh.ep};
    struct model *r = model_create_on(&m->cfg, &lay, K);
    copy_between(r->K, r->w.mem, m->K, m->w.mem, m->w.n_floats * sizeof(float));
    r->moe_aux_coef = m->moe_aux_coef, r->moe_aux_scale = m->moe_aux_scale;
    r->moe_replay = m->moe_replay;
    return r;
}

void model_weights_to_host(const struct model *m, float *dst)
{
    copy_between(kctx_cpu(), dst, m->K, m->w.mem, m->w.n_floats * sizeof(float));
}

void model_weights_from_host(struct model *m, const float *src)
{
    copy_between(m->K, m->w.mem, kctx_cpu(), src, m->w.n_floats * sizeof(float));
}

bool model_set_activation_offload(struct model *m, bool on)
{
    const bool was = m->offload_acts;
    m->offload_acts = on;
    return was;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    work_free(m);
    lora_detach(m);
    free(m->moe_tokens);
    k_free(m->K, m->rope_freqs, (size_t)(m->cfg.head_dim / 2 > 0 ? m->cfg.head_dim / 2 : 1) * sizeof(double),
           KMEM_WEIGHTS);
    params_free(m->K, KMEM_WEIGHTS, &m->w);
    if (m->grad) {
        params_free(m->K, KMEM_GRADS, m->grad);
        free(m->grad);
    }
    free(m);
}

void model_init_random(struct model *m, uint64_t seed, double std)
{
    /* drawn in host memory, then moved to the model's context */
    float *host = xcalloc(m->w.n_floats ? m->w.n_floats : 1, sizeof(float));
    int n = model_refs_over(&m->cfg, &m->sh, host, NULL, 0);
    struct param_ref *refs = xcalloc((size_t)(n > 0 ? n : 1), sizeof *refs);
    model_refs_over(&m->cfg, &m->sh, host, refs, n);
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
    model_weights_from_host(m, host);
    free(host);
    free(refs);
}

void model_alloc_grads(struct model *m)
{
    if (m->grad)
        return;
    m->grad = xcalloc(1, sizeof *m->grad);
    params_alloc(m->K, KMEM_GRADS, &m->cfg, &m->sh, m->grad);
}

void model_free_grads(struct model *m)
{
    if (!m->grad)
        return;
    params_free(m->K, KMEM_GRADS, m->grad);
    free(m->grad);
    m->grad = NULL;
}

void model_zero_grads(struct model *m)
{
    if (m->grad)
        k_zero(m->K, m->grad->mem, m->grad->n_floats * sizeof(float));
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

/* ---------------------------------------------------------------- projections */

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

/* The weight and bias of projection p in params P (weights or gradients). */
static float *proj_weight(const struct layer_params *P, enum proj_kind p, float **bias)
{
    if (!P) { /* no such parameters (a model without gradients) */
        *bias = NULL;
        return NULL;
    }
    float *const w[PROJ_KINDS] = {P->wq, P->wk, P->wv, P->wo, P->w_gate, P->w_up, P->w_down};
    float *const b[PROJ_KINDS] = {P->bq, P->bk, P->bv, NULL, NULL, NULL, NULL};
    *bias = b[p];
    return w[p];
}

void model_proj_forward(const struct model *m, int l, enum proj_kind p, float *y, const float *x, int N)
{
    int din, dout;
    float *b;
    const float *W = proj_weight(&m->w.layers[l], p, &b);
    model_proj_dims(m, p, &din, &dout);
    k_linear_forward(m->K, y, x, W, b, N, din, dout);
    lora_proj_forward(m, l, p, y, x, N);
}

void model_proj_backward(struct model *m, int l, enum proj_kind p, float *dx, const float *dy, const float *x, int N)
{
    int din, dout;
    float *b, *dW = NULL, *db = NULL;
    const float *W = proj_weight(&m->w.layers[l], p, &b);
    if (!m->lora) /* with an adapter the base is frozen */
        dW = proj_weight(&m->grad->layers[l], p, &db);
    model_proj_dims(m, p, &din, &dout);
    k_linear_backward(m->K, dx, dW, db, dy, x, W, N, din, dout);
    lora_proj_backward(m, l, p, dx, dy, x, N);
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
    float *rlog;      /* mixture of experts: (N, E) the router's logits */
    struct kmoe moe;  /* its routing and the experts' activations */
    /* sequence parallelism: every token's q, k, v and attention output for this rank's heads, (Nf, hq hd) and
     * (Nf, hk hd); lse is then (Nf, hq) */
    float *qf, *kf, *vf, *attf;
    struct moe_ep *ep; /* expert parallelism: the slots this rank's experts ran (moe_ep.h); NULL without */
};

/* The saved activations of one forward: every buffer is taken from the object's arena, in the order of
 * acts_take, so a batch of a shape seen before allocates nothing. Released objects wait in the model's pool. */
struct model_acts {
    struct model *m;
    struct packed_batch b;
    int32_t *ids, *targets, *pos, *cu; /* the batch, in the context's memory */
    float temperature;
    bool ckpt;
    int t0, Nf; /* sequence parallelism: this rank's rows start at t0 of the whole batch's Nf (0, N without) */
    struct ring_attn *ra;      /* context parallelism: this batch's ring; else NULL */
    int32_t *cprow;            /* context parallelism: the batch row of each of this rank's rows (-1: padding) */
    struct layer_acts *layers; /* n_layers; with ckpt only .x is filled */
    struct layer_acts scratch; /* ckpt: recomputation space */
    struct moe_ep **ep;        /* expert parallelism: n_layers + 1 states (the last the scratch's); NULL without */
    bool offload;              /* ckpt with m->offload_acts: layers[l].x are host_arena's, xdev the device's */
    struct karena host_arena;  /* offloaded layer inputs */
    float *xdev[2];            /* offload: the device's layer input and output (N, D), in turn */
    float *xf, *hn, *rstdf;    /* final residual, normed (N, D), (N) */
    float *logp, *entropy;     /* (N), or (nk) with kept rows: the last stage's outputs */
    /* the LM head on the rows a caller reads (packed_batch.logp_from): nk of them (-1: every row) */
    int nk;
    int32_t *krange; /* host (2B): each sequence's kept rows [krange[2b], krange[2b + 1]) */
    int krange_cap;  /* of krange, in sequences */
    int32_t *prefix; /* host (B): packed_batch.prefix_of's copy, NULL without one */
    int prefix_cap;
    uint16_t *routes; /* host (N, n_layers x k): packed_batch.routes' copy, NULL without one */
    size_t routes_cap;
    float *hk;    /* (nk, D) the kept rows' normed states */
    float *zkeep; /* (head rows, this shard's vocabulary): the head's logits for its backward (vocab_shard.keep) */
    int32_t *tk;  /* (nk) their targets */
    void *hbuf;   /* host (nk 4-byte cells): gathers and scatters of per-row values */
    size_t hbuf_cap;
    struct karena arena;
    struct model_acts *next; /* in the pool */
};

/* Buffers of one backward (the model's backward arena, taken again for every batch). */
struct bwd_bufs {
    float *dx, *dh, *scratch_out;   /* (N, D) */
    float *da, *dg, *du;            /* (N, F) */
    float *dxn;                     /* (N, D) */
    float *datt, *dq, *dk, *dv;     /* (N, QD), (N, QD), (N, KD), (N, KD) */
    float *dq_pre, *dk_pre;         /* Qwen3 */
    float *dlogp, *dentropy;        /* (N) */
    float *dhk;                     /* (nk, D) the kept rows' dL/dh (logp_from) */
    float *drlog, *dwt;             /* mixture of experts: (N, E), (N, k) */
    float *dattf, *dqf, *dkf, *dvf; /* sequence parallelism: as layer_acts' qf ... */
    float *moe_d, *moe_f;           /* the experts' backward scratch (struct kmoe's bwd_d, bwd_f) */
};

/* What a model keeps from batch to batch: the pool of activation objects, the backward arena, the generation
 * step's arena and a host buffer of positions. */
struct model_work {
    struct model_acts *pool;
    struct karena bwd, step;
    struct karena sp;       /* sequence parallelism: the all-to-all's staging buffer */
    struct karena sph;      /* its host staging, on a GPU whose SP group has no device memory (MPI) */
    struct ring_attn *ring; /* context parallelism: the ring of the batch the layers run now */
    const int32_t *cprow;   /* and the batch row of each of its rows (-1: the ring's padding) */
    int32_t *hpos;
    size_t hpos_cap;
};

static struct model_work *work_of(struct model *m)
{
    if (!m->work) {
        m->work = xcalloc(1, sizeof *m->work);
        karena_init(&m->work->bwd, m->K, KMEM_ACTS, "backward buffers");
        karena_init(&m->work->step, m->K, KMEM_ACTS, "generation step buffers");
        karena_init(&m->work->sp, m->K, KMEM_ACTS, "sequence-parallel all-to-all buffer");
        karena_init_host(&m->work->sph, m->K, "sequence-parallel all-to-all host staging");
    }
    return m->work;
}

static void acts_destroy(struct model_acts *A)
{
    if (A->ra)
        ring_attn_free(A->ra);
    free(A->ra);
    free(A->cprow);
    karena_release(&A->arena);
    karena_release(&A->host_arena);
    free(A->krange);
    free(A->prefix);
    free(A->routes);
    free(A->hbuf);
    free(A->layers);
    for (int l = 0; A->ep && l <= A->m->cfg.n_layers; l++)
        moe_ep_free(A->ep[l]);
    free(A->ep);
    free(A);
}

static void work_free(struct model *m)
{
    struct model_work *w = m->work;
    if (!w)
        return;
    while (w->pool) {
        struct model_acts *A = w->pool;
        w->pool = A->next;
        acts_destroy(A);
    }
    karena_release(&w->bwd);
    karena_release(&w->step);
    karena_release(&w->sp);
    karena_release(&w->sph);
    free(w->hpos);
    free(w);
    m->work = NULL;
}

void model_release_buffers(struct model *m, int which)
{
    struct model_work *w = m->work;
    if (!w)
        return;
    if (which & MODEL_BUF_TRAIN) {
        while (w->pool) {
            struct model_acts *A = w->pool;
            w->pool = A->next;
            acts_destroy(A);
        }
        karena_release(&w->bwd);
        karena_release(&w->sp);
        karena_release(&w->sph);
    }
    if (which & MODEL_BUF_GEN)
        karena_release(&w->step);
}

struct karena *model_step_arena(struct model *m) { return &work_of(m)->step; }

int32_t *model_host_pos(struct model *m, size_t n)
{
    struct model_work *w = work_of(m);
    if (n > w->hpos_cap) {
        free(w->hpos);
        w->hpos_cap = n > 256 ? n : 256;
        w->hpos = xmalloc(w->hpos_cap * sizeof *w->hpos);
    }
    return w->hpos;
}

static float *take_f(struct karena *ar, size_t n) { return karena_take(ar, (n ? n : 1) * sizeof(float)); }

/* The routing of N tokens through m's experts (no buffers yet). */
static struct kmoe moe_shape(const struct model *m, int N)
{
    const struct model_config *c = &m->cfg;
    return (struct kmoe){.N = N,
                         .E = c->n_experts,
                         .k = c->n_experts_per_tok,
                         .D = c->hidden_size,
                         .F = m->sh.moe_inter,
                         .norm_topk = c->norm_topk_prob};
}

/* One layer's activations from the arena: all of them, or only the input x. */
/* Sequence parallelism's split: rank r of S holds tokens [sp_lo(N, S, r), sp_lo(N, S, r + 1)) and attends with
 * sp_hq query heads and sp_hk KV heads, peer j's KV heads starting at sp_kv_lo(m, j) (with fewer KV heads than
 * ranks, the one its query heads read, replicated). */
static int sp_lo(int N, int S, int r) { return (int)((int64_t)N * r / S); }
static int sp_hq(const struct model *m) { return m->sh.n_heads / m->sh.sp_size; }
static int sp_hk(const struct model *m)
{
    return m->sh.n_kv_heads >= m->sh.sp_size ? m->sh.n_kv_heads / m->sh.sp_size : 1;
}
static int sp_kv_lo(const struct model *m, int j)
{
    const int S = m->sh.sp_size, Hq = m->sh.n_heads, Hkv = m->sh.n_kv_heads;
    return Hkv >= S ? j * (Hkv / S) : j * (Hq / S) / (Hq / Hkv);
}

static void layer_acts_take(const struct model *m, int N, int Nf, struct layer_acts *a, bool full,
                            const struct layer_acts *tok, struct karena *ar)
{
    const struct model_config *c = &m->cfg;
    const size_t n = (size_t)(N > 0 ? N : 1), D = (size_t)c->hidden_size, F = (size_t)m->sh.inter;
    const size_t QD = (size_t)m->sh.n_heads * c->head_dim, KD = (size_t)m->sh.n_kv_heads * c->head_dim;
    memset(a, 0, sizeof *a);
    a->x = take_f(ar, n * D);
    if (!full)
        return;
    a->xn1 = take_f(ar, n * D);
    a->rstd1 = take_f(ar, n);
    if (tok) { /* sequence parallelism: this rank's tokens' q, k, v and attention output, shared by the layers */
        a->q = tok->q, a->k = tok->k, a->v = tok->v, a->att = tok->att;
    } else {
        a->q = take_f(ar, n * QD);
        a->k = take_f(ar, n * KD);
        a->v = take_f(ar, n * KD);
        a->att = take_f(ar, n * QD);
    }
    if (c->qk_norm) {
        a->q_pre = take_f(ar, n * QD);
        a->k_pre = take_f(ar, n * KD);
        a->rstd_q = take_f(ar, n * (size_t)m->sh.n_heads);
        a->rstd_k = take_f(ar, n * (size_t)m->sh.n_kv_heads);
    }
    if (m->sh.sp && !m->sh.ring) {
        const size_t nf = (size_t)(Nf > 0 ? Nf : 1), hd = (size_t)c->head_dim;
        const size_t hq = (size_t)sp_hq(m), hk = (size_t)sp_hk(m);
        a->qf = take_f(ar, nf * hq * hd);
        a->kf = take_f(ar, nf * hk * hd);
        a->vf = take_f(ar, nf * hk * hd);
        a->attf = take_f(ar, nf * hq * hd);
        a->lse = take_f(ar, nf * hq);
    } else {
        a->lse = take_f(ar, n * (size_t)m->sh.n_heads);
    }
    a->xmid = take_f(ar, n * D);
    a->xn2 = take_f(ar, n * D);
    a->rstd2 = take_f(ar, n);
    if (c->n_experts) {
        a->rlog = take_f(ar, n * (size_t)c->n_experts);
        a->moe = moe_shape(m, N);
        kmoe_take(ar, &a->moe, false);
        return;
    }
    a->g = take_f(ar, n * F);
    a->u = take_f(ar, n * F);
    a->a = take_f(ar, n * F);
}

/* Every buffer of a forward over N tokens of B sequences, in order (a counting arena sizes the plan); the layer
 * inputs from har (ar itself, or the host arena when offloading). */
static void acts_take(const struct model *m, struct model_acts *A, int N, int B, struct karena *ar, struct karena *har)
{
    const size_t n = (size_t)(N > 0 ? N : 1), nD = n * (size_t)m->cfg.hidden_size;
    const struct model_shard *sh = &m->sh;
    A->ids = karena_take(ar, n * sizeof(int32_t));
    A->targets = karena_take(ar, n * sizeof(int32_t));
    A->pos = karena_take(ar, n * sizeof(int32_t));
    A->cu = karena_take(ar, (size_t)(B + 1) * sizeof(int32_t));
    /* sequence parallelism: a layer's backward reads attention's inputs and output for every token of its heads (qf,
     * kf, vf, attf); this rank's tokens' q, k, v (all-to-all sources) and output (brought back again in the
     * backward) are one set for every layer, so the layers keep 1/SP of what one process keeps */
    struct layer_acts tok = {0};
    if (sh->sp && !sh->ring) {
        const size_t QD = (size_t)sh->n_heads * m->cfg.head_dim, KD = (size_t)sh->n_kv_heads * m->cfg.head_dim;
        tok.q = take_f(ar, n * QD);
        tok.k = take_f(ar, n * KD);
        tok.v = take_f(ar, n * KD);
        tok.att = take_f(ar, n * QD);
    }
    const struct layer_acts *shared = sh->sp && !sh->ring ? &tok : NULL;
    if (A->ckpt)
        layer_acts_take(m, N, A->Nf, &A->scratch, true, shared, ar);
    else
        memset(&A->scratch, 0, sizeof A->scratch);
    A->xdev[0] = A->offload ? take_f(ar, nD) : NULL;
    A->xdev[1] = A->offload ? take_f(ar, nD) : NULL;
    for (int l = sh->layer_lo; l < sh->layer_hi; l++)
        layer_acts_take(m, N, A->Nf, &A->layers[l], !A->ckpt, shared, har);
    if (A->ep) { /* host state of its own, kept from batch to batch */
        for (int l = sh->layer_lo; l < sh->layer_hi; l++)
            A->layers[l].ep = A->ep[l];
        A->scratch.ep = A->ep[m->cfg.n_layers];
    }
    A->xf = take_f(ar, nD);
    A->hn = A->rstdf = A->logp = A->entropy = NULL;
    A->hk = NULL;
    A->tk = NULL;
    A->zkeep = NULL;
    if (sh->has_head) {
        const size_t rows = A->nk >= 0 ? (size_t)(A->nk > 0 ? A->nk : 1) : n; /* the rows the head runs on */
        A->hn = take_f(ar, nD);
        A->rstdf = take_f(ar, n);
        A->logp = take_f(ar, rows);
        A->entropy = take_f(ar, rows);
        if (A->nk >= 0) {
            A->hk = take_f(ar, rows * (size_t)m->cfg.hidden_size);
            A->tk = karena_take(ar, rows * sizeof(int32_t));
        }
        /* on the CPU, the head's logits kept for the backward up to LMHEAD_KEEP_BYTES (the CUDA head recomputes) */
        const size_t zbytes = rows * (size_t)(sh->vocab_hi - sh->vocab_lo) * sizeof(float);
        if (m->K->device == KDEV_CPU && zbytes <= LMHEAD_KEEP_BYTES)
            A->zkeep = karena_take(ar, zbytes);
    }
}

/* An activation object for N tokens of B sequences: from the pool, its arena grown when the plan needs it. */
static struct model_acts *acts_get(struct model *m, int N, int B, bool ckpt, int nk, int t0, int Nf)
{
    struct model_work *w = work_of(m);
    struct model_acts *A = w->pool;
    if (A) {
        w->pool = A->next;
    } else {
        A = xcalloc(1, sizeof *A);
        A->m = m;
        A->layers = xcalloc((size_t)(m->cfg.n_layers > 0 ? m->cfg.n_layers : 1), sizeof *A->layers);
        karena_init(&A->arena, m->K, KMEM_ACTS, "activations");
        karena_init_host(&A->host_arena, m->K, "offloaded activations");
        if (m->sh.ep) {
            A->ep = xcalloc((size_t)m->cfg.n_layers + 1, sizeof *A->ep);
            for (int l = 0; l <= m->cfg.n_layers; l++)
                A->ep[l] = moe_ep_create();
        }
    }
    A->ckpt = ckpt;
    A->nk = nk;
    A->t0 = t0, A->Nf = Nf;
    A->offload = ckpt && m->offload_acts;
    struct karena plan, hplan;
    karena_init_counter(&plan);
    karena_init_counter(&hplan);
    acts_take(m, A, N, B, &plan, A->offload ? &hplan : &plan);
    karena_reserve(&A->arena, plan.used, 0);
    if (A->offload)
        karena_reserve(&A->host_arena, hplan.used, 0);
    acts_take(m, A, N, B, &A->arena, A->offload ? &A->host_arena : &A->arena);
    return A;
}

static void bwd_take(const struct model *m, int N, int Nf, int nk, struct bwd_bufs *d, bool ckpt, struct karena *ar)
{
    const struct model_config *c = &m->cfg;
    const size_t n = (size_t)(N > 0 ? N : 1), D = (size_t)c->hidden_size, F = (size_t)m->sh.inter;
    const size_t QD = (size_t)m->sh.n_heads * c->head_dim, KD = (size_t)m->sh.n_kv_heads * c->head_dim;
    memset(d, 0, sizeof *d);
    d->dx = take_f(ar, n * D);
    if (m->sh.has_head) {
        d->dh = take_f(ar, n * D);
        d->dlogp = take_f(ar, n);
        d->dentropy = take_f(ar, n);
        if (nk >= 0)
            d->dhk = take_f(ar, (size_t)(nk > 0 ? nk : 1) * D);
    }
    if (ckpt)
        d->scratch_out = take_f(ar, n * D);
    if (c->n_experts) {
        const size_t nk = n * (size_t)c->n_experts_per_tok;
        d->drlog = take_f(ar, n * (size_t)c->n_experts);
        d->dwt = take_f(ar, nk);
        d->moe_d = take_f(ar, 2 * nk * D);
        d->moe_f = take_f(ar, 3 * nk * (size_t)c->moe_intermediate);
    } else {
        d->da = take_f(ar, n * F);
        d->dg = take_f(ar, n * F);
        d->du = take_f(ar, n * F);
    }
    d->dxn = take_f(ar, n * D);
    d->datt = take_f(ar, n * QD);
    d->dq = take_f(ar, n * QD);
    d->dk = take_f(ar, n * KD);
    d->dv = take_f(ar, n * KD);
    if (c->qk_norm) {
        d->dq_pre = take_f(ar, n * QD);
        d->dk_pre = take_f(ar, n * KD);
    }
    if (m->sh.sp && !m->sh.ring) {
        const size_t nf = (size_t)(Nf > 0 ? Nf : 1), hd = (size_t)c->head_dim;
        const size_t hq = (size_t)sp_hq(m), hk = (size_t)sp_hk(m);
        d->dattf = take_f(ar, nf * hq * hd);
        d->dqf = take_f(ar, nf * hq * hd);
        d->dkf = take_f(ar, nf * hk * hd);
        d->dvf = take_f(ar, nf * hk * hd);
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

/* Layer l's experts of every token of b (b->routes), as the route takes them: host (N, k). */
static int32_t *moe_layer_routes(const struct model *m, int l, const struct packed_batch *b)
{
    const int k = m->cfg.n_experts_per_tok, L = m->cfg.n_layers;
    int32_t *ref = xmalloc((size_t)(b->N > 0 ? b->N : 1) * k * sizeof *ref);
    for (int t = 0; t < b->N; t++)
        for (int j = 0; j < k; j++)
            ref[(size_t)t * k + j] = b->routes[((size_t)t * L + l) * k + j];
    return ref;
}

/* One decoder layer: a->x in, returns the output in out (N, D). */
/* Rows of a (rows, w) block at src (a row every ss floats) into dst (a row every ds floats), copied or added. */
static void copy_rows(struct kctx *K, float *dst, size_t ds, const float *src, size_t ss, int rows, int w, bool add)
{
    if (K->device == KDEV_CPU) {
        for (int r = 0; r < rows; r++) {
            float *y = dst + (size_t)r * ds;
            const float *x = src + (size_t)r * ss;
            if (add)
                for (int i = 0; i < w; i++)
                    y[i] += x[i];
            else
                memcpy(y, x, (size_t)w * sizeof(float));
        }
        return;
    }
    if (!add) { /* one strided copy where the back-end has one */
        k_copy_rows(K, dst, ds * sizeof(float), src, ss * sizeof(float), (size_t)w * sizeof(float), (size_t)rows);
        return;
    }
    for (int r = 0; r < rows; r++)
        k_add(K, dst + (size_t)r * ds, src + (size_t)r * ss, (size_t)w);
}

/* The all-to-all's staging buffer of n floats (the model's, reused). */
static float *sp_stage(const struct model *m, size_t n)
{
    struct karena *ar = &((struct model *)m)->work->sp;
    karena_reset(ar);
    karena_reserve(ar, (n ? n : 1) * sizeof(float), 1);
    return take_f(ar, n);
}

/* The swap's all-to-all over the SP group: as it is where the group carries the context's memory (the CPU's, or a
 * GPU's over NCCL); from a GPU over MPI through pinned host memory (down, across, up, the upload finished before
 * the staging is reused), as ring attention's ring goes. */
static void sp_alltoallv(const struct model *m, const float *send, const size_t *sc, float *recv, const size_t *rc)
{
    struct kctx *K = m->K;
    if (K->device == KDEV_CPU || comm_caps(m->sh.sp)->device_memory) {
        comm_alltoallv(m->sh.sp, send, sc, recv, rc, COMM_F32);
        return;
    }
    size_t ns = 0, nr = 0;
    for (int j = 0; j < m->sh.sp_size; j++)
        ns += sc[j], nr += rc[j];
    struct karena *ar = &m->work->sph;
    karena_reset(ar);
    karena_reserve(ar, ((ns ? ns : 1) + (nr ? nr : 1)) * sizeof(float), 2);
    float *hs = karena_take(ar, (ns ? ns : 1) * sizeof(float)), *hr = karena_take(ar, (nr ? nr : 1) * sizeof(float));
    k_to_host(K, hs, send, ns * sizeof(float));
    comm_alltoallv(m->sh.sp, hs, sc, hr, rc, COMM_F32);
    k_to_device(K, recv, hr, nr * sizeof(float));
    k_sync(K);
}

/* Sequence parallelism's swap before attention: this rank's n tokens of C columns (src, (n, C)) to every token
 * (Nf) of its heads (dst, (Nf, w)): peer j receives columns [j w, (j + 1) w), or with kv those of its KV heads. */
static void sp_to_heads(const struct model *m, float *dst, const float *src, int n, int Nf, int C, int w, bool kv)
{
    const int S = m->sh.sp_size, hd = m->cfg.head_dim;
    float *stage = sp_stage(m, (size_t)n * w * S);
    size_t sc[S], rc[S];
    for (int j = 0; j < S; j++) {
        const size_t col = kv ? (size_t)sp_kv_lo(m, j) * hd : (size_t)j * w;
        copy_rows(m->K, stage + (size_t)j * n * w, (size_t)w, src + col, (size_t)C, n, w, false);
        sc[j] = (size_t)n * w;
        rc[j] = (size_t)(sp_lo(Nf, S, j + 1) - sp_lo(Nf, S, j)) * w;
    }
    sp_alltoallv(m, stage, sc, dst, rc);
}

/* Its reverse after attention: every token of this rank's heads (src, (Nf, w)) back to the ranks holding the
 * tokens, this rank's into its columns of dst (n, C); with kv, added (a replicated KV head's gradients sum over
 * the ranks that read it; dst zeroed by the caller). */
static void sp_to_tokens(const struct model *m, float *dst, const float *src, int n, int Nf, int C, int w, bool kv)
{
    const int S = m->sh.sp_size, hd = m->cfg.head_dim;
    float *stage = sp_stage(m, (size_t)n * w * S);
    size_t sc[S], rc[S];
    for (int j = 0; j < S; j++) {
        sc[j] = (size_t)(sp_lo(Nf, S, j + 1) - sp_lo(Nf, S, j)) * w;
        rc[j] = (size_t)n * w;
    }
    sp_alltoallv(m, src, sc, stage, rc);
    for (int j = 0; j < S; j++) {
        const size_t col = kv ? (size_t)sp_kv_lo(m, j) * hd : (size_t)j * w;
        copy_rows(m->K, dst + col, (size_t)C, stage + (size_t)j * n * w, (size_t)w, n, w, kv);
    }
}

static void layer_forward(const struct model *m, int l, const struct packed_batch *b, int Nf, struct layer_acts *a,
                          float *out)
{
    const struct model_config *c = &m->cfg;
    const struct layer_params *L = &m->w.layers[l];
    struct kctx *K = m->K;
    const int N = b->N, D = c->hidden_size, F = m->sh.inter, hd = c->head_dim, Hq = m->sh.n_heads;
    const int Hkv = m->sh.n_kv_heads, QD = Hq * hd, KD = Hkv * hd;
    k_rmsnorm_forward(K, a->xn1, a->rstd1, a->x, L->attn_norm, N, D, c->rms_norm_eps);
    model_proj_forward(m, l, PROJ_Q, a->q, a->xn1, N);
    model_proj_forward(m, l, PROJ_K, a->k, a->xn1, N);
    model_proj_forward(m, l, PROJ_V, a->v, a->xn1, N);
    if (L->q_norm) { /* Qwen3: each head's q and k RMS-normed before RoPE */
        k_copy(K, a->q_pre, a->q, (size_t)N * QD * sizeof(float));
        k_copy(K, a->k_pre, a->k, (size_t)N * KD * sizeof(float));
        k_rmsnorm_forward(K, a->q, a->rstd_q, a->q_pre, L->q_norm, N * Hq, hd, c->rms_norm_eps);
        k_rmsnorm_forward(K, a->k, a->rstd_k, a->k_pre, L->k_norm, N * Hkv, hd, c->rms_norm_eps);
    }
    k_rope_forward(K, a->q, b->pos, N, Hq, hd, m->rope_freqs);
    k_rope_forward(K, a->k, b->pos, N, Hkv, hd, m->rope_freqs);
    if (m->sh.ring) { /* context parallelism: every head, the keys and values passed around the ring */
        ring_attn_forward(m->work->ring, a->att, a->lse, a->q, a->k, a->v);
    } else if (m->sh.sp) { /* every token of this rank's heads, attention over the whole sequences, and back */
        const int hq = sp_hq(m), hk = sp_hk(m);
        sp_to_heads(m, a->qf, a->q, N, Nf, QD, hq * hd, false);
        sp_to_heads(m, a->kf, a->k, N, Nf, KD, hk * hd, true);
        sp_to_heads(m, a->vf, a->v, N, Nf, KD, hk * hd, true);
        k_attention_forward(K, a->attf, a->lse, a->qf, a->kf, a->vf, b->cu_seqlens, b->prefix_of, b->B, hq, hk, hd);
        sp_to_tokens(m, a->att, a->attf, N, Nf, QD, hq * hd, false);
    } else {
        k_attention_forward(K, a->att, a->lse, a->q, a->k, a->v, b->cu_seqlens, b->prefix_of, b->B, Hq, Hkv, hd);
    }
    model_proj_forward(m, l, PROJ_O, a->xmid, a->att, N);
    model_tp_sum(m, a->xmid, (size_t)N * D);
    k_add(K, a->xmid, a->x, (size_t)N * D);
    k_rmsnorm_forward(K, a->xn2, a->rstd2, a->xmid, L->mlp_norm, N, D, c->rms_norm_eps);
    if (L->router) { /* mixture of experts: route, then each expert's tokens through it */
        k_linear_forward(K, a->rlog, a->xn2, L->router, NULL, N, D, c->n_experts);
        lora_router_forward(m, l, a->rlog, a->xn2, N);
        int32_t *ref = b->routes ? moe_layer_routes(m, l, b) : NULL;
        a->moe.ref = ref;
        a->moe.replay = ref && m->moe_replay;
        k_moe_route(K, &a->moe, a->rlog);
        a->moe.ref = NULL;
        free(ref);
        a->moe.lora = lora_moe(m, l, (size_t)N * c->n_experts_per_tok); /* LoRA on the experts, or NULL */
        if (m->sh.ep)                                                   /* the experts on the ranks holding them */
            moe_ep_forward(a->ep, m, L, &a->moe, a->xn2, out);
        else
            k_moe_experts_forward(K, out, a->xn2, L->w_gate, L->w_up, L->w_down, &a->moe);
        model_tp_sum(m, out, (size_t)N * D); /* under TP each rank's rows of every expert gave a part */
        k_add(K, out, a->xmid, (size_t)N * D);
        return;
    }
    model_proj_forward(m, l, PROJ_GATE, a->g, a->xn2, N);
    model_proj_forward(m, l, PROJ_UP, a->u, a->xn2, N);
    k_swiglu_forward(K, a->a, a->g, a->u, (size_t)N * F);
    model_proj_forward(m, l, PROJ_DOWN, out, a->a, N);
    model_tp_sum(m, out, (size_t)N * D);
    k_add(K, out, a->xmid, (size_t)N * D);
}

/* A layer's routing r over the whole micro-batch into g (2 E + 3): per expert the slots routed to it (g[e]) and
 * the sum of every token's router probability for it (g[E + e]), then the tokens (g[2 E]) and those whose own
 * top-k differed from the rollout's (g[2 E + 1], of g[2 E + 2]). Under sequence or context parallelism each rank
 * of the group holds a slice of the tokens: summed over the group (every rank calls it), the ring's padding rows
 * (context parallelism, model_work.cprow -1) left out, so that every rank has the whole model's figures. */
static void moe_group_routing(const struct model *m, const struct kmoe *r, double *g)
{
    const int E = r->E, k = r->k, N = r->N;
    const int32_t *rowof = m->sh.ring ? m->work->cprow : NULL;
    if (!rowof) {
        int32_t offs[E + 1];
        float pmean[E];
        k_to_host(m->K, offs, r->offs, sizeof offs);
        k_to_host(m->K, pmean, r->pmean, sizeof pmean);
        for (int e = 0; e < E; e++)
            g[e] = offs[e + 1] - offs[e], g[E + e] = (double)pmean[e] * N;
        g[2 * E] = N, g[2 * E + 1] = r->n_differ, g[2 * E + 2] = r->n_compared;
    } else { /* the real rows' routing (idx, replayed or not) and probabilities; the padding's top-k against the
              * first k experts it was given to replay (model_forward_stage) taken back out of the differing */
        int32_t *idx = xmalloc((size_t)(N > 0 ? N : 1) * k * sizeof *idx);
        float *p = xmalloc((size_t)(N > 0 ? N : 1) * E * sizeof *p);
        k_to_host(m->K, idx, r->idx, (size_t)N * k * sizeof *idx);
        k_to_host(m->K, p, r->probs, (size_t)N * E * sizeof *p);
        int32_t *id = xmalloc((size_t)(k > 0 ? k : 1) * sizeof *id); /* a padding row's top k */
        memset(g, 0, (2 * (size_t)E + 3) * sizeof *g);
        int pad = 0, pad_differ = 0;
        for (int t = 0; t < N; t++) {
            const float *pt = p + (size_t)t * E;
            if (rowof[t] < 0) {
                pad++;
                if (r->n_compared > 0) { /* compared with the rollout's: the kernel's top-k: the larger first, a tie to
                                            the lower expert */
                    kmoe_topk(pt, E, k, id);
                    bool same = true;
                    for (int j = 0; j < k; j++)
                        same &= id[j] < k;
                    pad_differ += !same;
                }
                continue;
            }
            for (int j = 0; j < k; j++)
                g[idx[(size_t)t * k + j]]++;
            for (int e = 0; e < E; e++)
                g[E + e] += pt[e];
            g[2 * E]++;
        }
        g[2 * E + 1] = r->n_differ - pad_differ;
        g[2 * E + 2] = r->n_compared > 0 ? r->n_compared - pad : 0;
        free(idx), free(p), free(id);
    }
    if (m->sh.sp)
        comm_allreduce_sum(m->sh.sp, g, 2 * (size_t)E + 3, COMM_F64);
}

/* A layer's routing, counted for model_moe_stats: its tokens per expert and its load-balancing loss, over the whole
 * micro-batch (under sequence or context parallelism every rank of the group counts the same, the group's). */
static void moe_count(struct model *m, int l, const struct kmoe *r)
{
    const int E = r->E;
    if (!m->moe_tokens)
        m->moe_tokens = xcalloc((size_t)m->cfg.n_layers * E, sizeof *m->moe_tokens);
    double g[2 * E + 3];
    moe_group_routing(m, r, g);
    const double n = g[2 * E];
    double aux = 0;
    for (int e = 0; e < E; e++) {
        m->moe_tokens[(size_t)l * E + e] += g[e];
        aux += (n ? g[E + e] / n : 0) * g[e];
    }
    m->moe_aux_sum += n ? aux * E / ((double)r->k * n) : 0;
    m->moe_aux_n++;
    m->moe_route_differ += g[2 * E + 1];
    m->moe_route_compared += g[2 * E + 2];
}

void model_moe_route_stats(struct model *m, double *differ, double *compared)
{
    *differ = m->moe_route_differ;
    *compared = m->moe_route_compared;
    m->moe_route_differ = m->moe_route_compared = 0;
}

int model_moe_stats(struct model *m, double *tokens, double *aux_mean)
{
    const int n = m->moe_aux_n, E = m->cfg.n_experts;
    if (tokens && E) {
        for (size_t i = 0; i < (size_t)m->cfg.n_layers * E; i++)
            tokens[i] = m->moe_tokens ? m->moe_tokens[i] : 0;
    }
    if (aux_mean)
        *aux_mean = n ? m->moe_aux_sum / n : 0;
    if (m->moe_tokens)
        memset(m->moe_tokens, 0, (size_t)m->cfg.n_layers * E * sizeof *m->moe_tokens);
    m->moe_aux_sum = 0;
    m->moe_aux_n = 0;
    return n;
}

/* Backward of one layer: d->dx (N, D) holds dL/d(output) on entry and dL/d(input) on exit. */
static void layer_backward(struct model *m, int l, const struct packed_batch *b, int Nf, const struct layer_acts *a,
                           const struct bwd_bufs *d)
{
    const struct model_config *c = &m->cfg;
    const struct layer_params *L = &m->w.layers[l];
    /* the norms' weight gradients: a sink that nothing reads when the base is frozen (LoRA) */
    float *const sink = m->lora ? m->lora->sink : NULL;
    const struct layer_params *G = m->lora ? NULL : &m->grad->layers[l];
    struct kctx *K = m->K;
    const int N = b->N, D = c->hidden_size, F = m->sh.inter, hd = c->head_dim, Hq = m->sh.n_heads;
    const int Hkv = m->sh.n_kv_heads, QD = Hq * hd, KD = Hkv * hd;
    const size_t nD = (size_t)N * D, nF = (size_t)N * F, fs = sizeof(float);
    float *dx = d->dx;
    if (L->router) { /* mixture of experts: out = xmid + sum over the chosen experts of wt x expert(xn2) */
        struct kmoe r = a->moe;
        r.bwd_d = d->moe_d, r.bwd_f = d->moe_f;
        r.lora = lora_moe(m, l, (size_t)N * r.k);
        const int E = r.E;
        k_zero(K, d->dxn, nD * fs);
        if (m->sh.ep)
            moe_ep_backward(a->ep, m, L, G, &r, dx, d->dxn, d->dwt, d->moe_d);
        else
            k_moe_experts_backward(K, d->dxn, G ? G->w_gate : NULL, G ? G->w_up : NULL, G ? G->w_down : NULL, d->dwt,
                                   dx, L->w_gate, L->w_up, L->w_down, &r);
        /* under TP the experts' input gradient and the routing weights' (dy . the expert's output) are each rank's
         * part: summed, the router's backward below runs the same on every TP rank (its weight gradient the same
         * on each, counted once), and its part of dxn is added after the sum, not TP times */
        model_tp_sum(m, d->dxn, nD);
        model_tp_sum(m, d->dwt, (size_t)N * r.k);
        /* the load-balancing loss coef scale E / k sum_e pmean_e count_e / N: d/dp[t][e] = coef scale E count_e /
         * (k N^2) for every token t; under sequence or context parallelism count_e and N the whole micro-batch's
         * (summed over the group: every rank of it takes part, one with no token too) */
        float dp_col[E];
        const bool aux = m->moe_aux_coef != 0 && (m->sh.sp ? Nf > 0 : N > 0);
        if (aux) {
            double g[2 * E + 3];
            moe_group_routing(m, &r, g);
            const double n = g[2 * E];
            for (int e = 0; e < E; e++)
                dp_col[e] = n > 0
                                ? (float)((double)m->moe_aux_coef * m->moe_aux_scale * E * g[e] / ((double)r.k * n * n))
                                : 0.0f;
        }
        k_moe_route_backward(K, d->drlog, &r, d->dwt, aux ? dp_col : NULL);
        if (m->sh.ring) /* context parallelism: the ring's padding rows feed no loss, the load-balancing one either */
            for (int t = 0; t < N; t++)
                if (m->work->cprow[t] < 0)
                    k_zero(K, d->drlog + (size_t)t * E, (size_t)E * sizeof(float));
        k_linear_backward(K, d->dxn, G ? G->router : NULL, NULL, d->drlog, a->xn2, L->router, N, D, E);
        lora_router_backward(m, l, d->dxn, d->drlog, a->xn2, N);
    } else {
        k_zero(K, d->da, nF * fs), k_zero(K, d->dg, nF * fs), k_zero(K, d->du, nF * fs), k_zero(K, d->dxn, nD * fs);
        /* MLP: out = xmid + down(silu(gate(xn2)) * up(xn2)) */
        model_proj_backward(m, l, PROJ_DOWN, d->da, dx, a->a, N);
        k_swiglu_backward(K, d->dg, d->du, d->da, a->g, a->u, nF);
        model_proj_backward(m, l, PROJ_GATE, d->dxn, d->dg, a->xn2, N);
        model_proj_backward(m, l, PROJ_UP, d->dxn, d->du, a->xn2, N);
        model_tp_sum(m, d->dxn, nD);
    }
    /* dx now dL/dxmid */
    k_rmsnorm_backward(K, dx, G ? G->mlp_norm : sink, d->dxn, a->xmid, L->mlp_norm, a->rstd2, N, D);
    /* attention: xmid = x + o(attn(rope(q(xn1)), rope(k(xn1)), v(xn1))) */
    k_zero(K, d->datt, (size_t)N * QD * fs), k_zero(K, d->dq, (size_t)N * QD * fs);
    k_zero(K, d->dk, (size_t)N * KD * fs), k_zero(K, d->dv, (size_t)N * KD * fs);
    if (m->sh.sp &&
        !m->sh.ring) /* this layer's attention output of this rank's tokens again (the layers share its buffer) */
        sp_to_tokens(m, a->att, a->attf, N, Nf, QD, sp_hq(m) * hd, false);
    model_proj_backward(m, l, PROJ_O, d->datt, dx, a->att, N);
    if (m->sh.ring) { /* context parallelism: the visiting keys' and values' gradients come home */
        ring_attn_backward(m->work->ring, d->dq, d->dk, d->dv, d->datt, a->att, a->lse, a->q, a->k, a->v);
    } else if (m->sh.sp) { /* the output's gradient to every token of this rank's heads, and q's, k's, v's back */
        const int hq = sp_hq(m), hk = sp_hk(m);
        sp_to_heads(m, d->dattf, d->datt, N, Nf, QD, hq * hd, false);
        k_zero(K, d->dqf, (size_t)Nf * hq * hd * fs), k_zero(K, d->dkf, (size_t)Nf * hk * hd * fs);
        k_zero(K, d->dvf, (size_t)Nf * hk * hd * fs);
        k_attention_backward(K, d->dqf, d->dkf, d->dvf, d->dattf, a->attf, a->lse, a->qf, a->kf, a->vf, b->cu_seqlens,
                             b->prefix_of, b->B, hq, hk, hd);
        sp_to_tokens(m, d->dq, d->dqf, N, Nf, QD, hq * hd, false);
        sp_to_tokens(m, d->dk, d->dkf, N, Nf, KD, hk * hd, true);
        sp_to_tokens(m, d->dv, d->dvf, N, Nf, KD, hk * hd, true);
    } else {
        k_attention_backward(K, d->dq, d->dk, d->dv, d->datt, a->att, a->lse, a->q, a->k, a->v, b->cu_seqlens,
                             b->prefix_of, b->B, Hq, Hkv, hd);
    }
    k_rope_backward(K, d->dq, b->pos, N, Hq, hd, m->rope_freqs);
    k_rope_backward(K, d->dk, b->pos, N, Hkv, hd, m->rope_freqs);
    float *dq = d->dq, *dk = d->dk;
    if (L->q_norm) { /* through the per-head norms */
        k_zero(K, d->dq_pre, (size_t)N * QD * fs), k_zero(K, d->dk_pre, (size_t)N * KD * fs);
        k_rmsnorm_backward(K, d->dq_pre, G ? G->q_norm : sink, d->dq, a->q_pre, L->q_norm, a->rstd_q, N * Hq, hd);
        k_rmsnorm_backward(K, d->dk_pre, G ? G->k_norm : sink, d->dk, a->k_pre, L->k_norm, a->rstd_k, N * Hkv, hd);
        dq = d->dq_pre, dk = d->dk_pre;
    }
    k_zero(K, d->dxn, nD * fs);
    model_proj_backward(m, l, PROJ_Q, d->dxn, dq, a->xn1, N);
    model_proj_backward(m, l, PROJ_K, d->dxn, dk, a->xn1, N);
    model_proj_backward(m, l, PROJ_V, d->dxn, d->dv, a->xn1, N);
    model_tp_sum(m, d->dxn, nD);
    k_rmsnorm_backward(K, dx, G ? G->attn_norm : sink, d->dxn, a->x, L->attn_norm, a->rstd1, N, D); /* dx now dL/dx */
}

/* Rows of b whose log-probs are read (logp_from), checked against the sequences' bounds; -1: every row. */
static int kept_rows(const struct packed_batch *b, int t0, int t1)
{
    if (!b->logp_from)
        return -1;
    int nk = 0;
    for (int s = 0; s < b->B; s++) {
        const int lo = b->logp_from[s], hi = b->cu_seqlens[s + 1];
        if (lo < b->cu_seqlens[s] || lo > hi)
            check_failf(__FILE__, __LINE__, "packed batch: sequence %d keeps rows from %d, outside its rows %d..%d", s,
                        lo, b->cu_seqlens[s], hi);
        const int a = lo > t0 ? lo : t0, z = hi < t1 ? hi : t1; /* within this rank's rows [t0, t1) */
        nk += z > a ? z - a : 0;
    }
    return nk;
}

/* A host array of per-sequence int32 entries (per entries each) grown to hold B sequences; contents not kept. */
static void grow_host_i32(int32_t **a, int *cap, int B, int per)
{
    if (B > *cap) {
        free(*a);
        *cap = B > 16 ? B : 16;
        *a = xmalloc((size_t)*cap * (size_t)per * sizeof(int32_t));
    }
}

/* The head's vocabulary shard for the activations A: keeping its logits for the backward where A has room. */
static struct vocab_shard acts_vocab(const struct model *m, const struct model_acts *A)
{
    struct vocab_shard vs = vocab_of(m);
    vs.keep = A->zkeep;
    vs.sum_pi_sq = m->head_sum_pi_sq;
    return vs;
}

/* The host buffer of n 4-byte cells (floats, or int32 targets), grown only. */
static void *acts_host_buf(struct model_acts *A, size_t n)
{
    if (n > A->hbuf_cap) {
        free(A->hbuf);
        A->hbuf_cap = n > 256 ? n : 256;
        A->hbuf = xmalloc(A->hbuf_cap * sizeof(float));
    }
    return A->hbuf;
}

/* The kept rows' values of host row values (N 4-byte cells: floats or int32 targets) into the host buffer (nk), or
 * back (zeros elsewhere). */
static void *gather_kept(struct model_acts *A, const void *rows)
{
    char *h = acts_host_buf(A, (size_t)(A->nk > 0 ? A->nk : 1));
    const char *src = rows;
    for (int s = 0, r = 0; s < A->b.B; s++) {
        const int lo = A->krange[2 * s], hi = A->krange[2 * s + 1];
        memcpy(h + (size_t)r * 4, src + (size_t)lo * 4, (size_t)(hi - lo) * 4);
        r += hi - lo;
    }
    return h;
}

static void scatter_kept(const struct model_acts *A, float *rows, const float *kept)
{
    memset(rows, 0, (size_t)A->b.N * sizeof(float));
    for (int s = 0, r = 0; s < A->b.B; s++) {
        const int lo = A->krange[2 * s], hi = A->krange[2 * s + 1];
        memcpy(rows + lo, kept + r, (size_t)(hi - lo) * sizeof(float));
        r += hi - lo;
    }
}

/* Rows of dst (N, D) and of the kept rows' buffer (nk, D), one way or the other, in the context's memory. */
static void copy_kept_states(struct kctx *K, const struct model_acts *A, float *rows, float *kept, int D, bool in)
{
    for (int s = 0, r = 0; s < A->b.B; s++) {
        const int lo = A->krange[2 * s], hi = A->krange[2 * s + 1];
        const size_t bytes = (size_t)(hi - lo) * D * sizeof(float);
        if (in)
            k_copy(K, kept + (size_t)r * D, rows + (size_t)lo * D, bytes);
        else
            k_copy(K, rows + (size_t)lo * D, kept + (size_t)r * D, bytes);
        r += hi - lo;
    }
}

/* The LM head on the kept rows of the normed final states: their log-probs (and entropies) to the host rows. */
static void head_forward_kept(struct model *m, struct model_acts *A, const int32_t *targets,
                              const struct vocab_shard *vs, float *logp, float *entropy)
{
    struct kctx *K = m->K;
    const int D = m->cfg.hidden_size;
    const size_t nk = (size_t)A->nk;
    copy_kept_states(K, A, A->hn, A->hk, D, true);
    k_to_device(K, A->tk, gather_kept(A, targets), nk * sizeof(int32_t));
    k_lmhead_forward(K, A->logp, entropy ? A->entropy : NULL, A->hk, m->w.lm_head, A->tk, A->nk, D, vs, A->temperature,
                     LMHEAD_CHUNK);
    float *h = acts_host_buf(A, nk ? nk : 1);
    k_to_host(K, h, A->logp, nk * sizeof(float));
    scatter_kept(A, logp, h);
    if (entropy) {
        k_to_host(K, h, A->entropy, nk * sizeof(float));
        scatter_kept(A, entropy, h);
    }
}

/* Sequence parallelism: host rows [t0, t0 + n) of v (Nf) from each rank, every row on every rank. */
static void sp_share_rows(struct comm *sp, float *v, int Nf, int t0, int n)
{
    memset(v, 0, (size_t)t0 * sizeof(float));
    memset(v + t0 + n, 0, (size_t)(Nf - t0 - n) * sizeof(float));
    comm_allreduce_sum(sp, v, (size_t)Nf, COMM_F32);
}

/* Context parallelism: the ring of the whole batch b over m's group, cut as Megatron cuts packed sequences: each
 * sequence padded to a multiple of 2C by a sequence of its own (token 0 at positions 0...; read by no one) is one
 * segment, of which rank r holds chunks r and 2C-1-r, so every rank has the same causal work. This rank's ids,
 * targets and positions (3 x n, host) into *local, and the batch row of each of its n rows (-1: padding) into
 * *rowof. */
static struct ring_attn *cp_plan(const struct model *m, const struct packed_batch *b, int32_t **local, int32_t **rowof)
{
    if (b->prefix_of)
        check_failf(__FILE__, __LINE__,
                    "model_forward_stage: context parallelism runs without shared-prompt packing (prefix_of)");
    const int C2 = 2 * m->sh.sp_size;
    int L = 0, B = 0, S = 0;
    for (int s = 0; s < b->B; s++) {
        const int ls = b->cu_seqlens[s + 1] - b->cu_seqlens[s], ps = (ls + C2 - 1) / C2 * C2;
        L += ps, B += ls > 0 ? 1 + (ps > ls) : 0, S += ls > 0;
    }
    const int Lr = L > 0 ? L : C2; /* an empty batch: one padding sequence */
    int32_t *cu = xmalloc((size_t)(B + 2) * sizeof *cu), *seg = xmalloc((size_t)(S + 2) * sizeof *seg);
    int32_t *whole = xcalloc(3 * (size_t)Lr, sizeof *whole), *orig = xmalloc((size_t)Lr * sizeof *orig);
    int off = 0, bi = 0, si = 0;
    cu[0] = seg[0] = 0;
    for (int s = 0; s < b->B; s++) {
        const int lo = b->cu_seqlens[s], ls = b->cu_seqlens[s + 1] - lo, ps = (ls + C2 - 1) / C2 * C2;
        if (ls <= 0)
            continue;
        for (int j = 0; j < ps; j++) {
            const bool real = j < ls;
            whole[off + j] = real ? b->ids[lo + j] : 0;
            whole[(size_t)Lr + off + j] = real ? b->targets[lo + j] : 0;
            whole[2 * (size_t)Lr + off + j] = real ? b->pos[lo + j] : j - ls;
            orig[off + j] = real ? lo + j : -1;
        }
        cu[++bi] = off + ls;
        if (ps > ls)
            cu[++bi] = off + ps;
        seg[++si] = off += ps;
    }
    if (L == 0) {
        for (int j = 0; j < Lr; j++)
            whole[2 * (size_t)Lr + j] = j, orig[j] = -1;
        cu[++bi] = seg[++si] = Lr;
    }
    struct ring_attn *ra = xcalloc(1, sizeof *ra);
    char why[256];
    if (ring_attn_plan(ra, m->K, m->sh.sp, Lr, cu, bi, seg, si, m->sh.n_heads, m->sh.n_kv_heads, m->cfg.head_dim, why,
                       sizeof why) != 0)
        check_failf(__FILE__, __LINE__, "model_forward_stage: context parallelism: %s", why);
    const int n = ra->n;
    *local = xmalloc(3 * (size_t)n * sizeof **local);
    for (int k = 0; k < 3; k++)
        ring_attn_take_i32(ra, *local + (size_t)k * n, whole + (size_t)k * Lr);
    *rowof = xmalloc((size_t)(n > 0 ? n : 1) * sizeof **rowof);
    ring_attn_take_i32(ra, *rowof, orig);
    free(cu), free(seg), free(whole), free(orig);
    return ra;
}

int model_stage_rows(const struct model *m, const struct packed_batch *b)
{
    const struct model_shard *sh = &m->sh;
    if (!sh->sp)
        return b->N;
    if (!sh->ring)
        return sp_lo(b->N, sh->sp_size, sh->sp_rank + 1) - sp_lo(b->N, sh->sp_size, sh->sp_rank);
    const int C2 = 2 * sh->sp_size; /* cp_plan's padded ring: each sequence to a multiple of 2C, C2 when empty */
    int L = 0;
    for (int s = 0; s < b->B; s++) {
        const int ls = b->cu_seqlens[s + 1] - b->cu_seqlens[s];
        L += (ls + C2 - 1) / C2 * C2;
    }
    return (L > 0 ? L : C2) / sh->sp_size;
}

/* Context parallelism: this rank's host values (n, at batch rows rowof) into their rows of v (the whole batch's)
 * on every rank (summed over the group, zeros elsewhere); the rows a caller does not read (logp_from) stay 0. */
static void cp_share_rows(const struct model *m, const int32_t *rowof, int n, const struct packed_batch *b, float *v,
                          const float *mine)
{
    memset(v, 0, (size_t)b->N * sizeof *v);
    for (int i = 0; i < n; i++)
        if (rowof[i] >= 0)
            v[rowof[i]] = mine[i];
    comm_allreduce_sum(m->sh.sp, v, (size_t)b->N, COMM_F32);
    if (b->logp_from)
        for (int s = 0; s < b->B; s++)
            memset(v + b->cu_seqlens[s], 0, (size_t)(b->logp_from[s] - b->cu_seqlens[s]) * sizeof *v);
}

/* Context parallelism: this rank's n rows (batch rows rowof; -1: padding, 0) of a whole batch's host values. */
static void cp_take_rows(const int32_t *rowof, int n, float *dst, const float *src)
{
    for (int i = 0; i < n; i++)
        dst[i] = rowof[i] >= 0 ? src[rowof[i]] : 0.0f;
}

struct model_acts *model_forward_stage(struct model *m, const struct packed_batch *b, float temperature,
                                       bool checkpointing, const float *x_in, float *y_out, float *logp, float *entropy)
{
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    struct kctx *K = m->K;
    /* this rank's rows [t0, t0 + N) of the batch's Nf: all of them without sequence parallelism */
    /* (context parallelism: this rank's n rows of the ring instead, cpl their ids, targets and positions) */
    int32_t *cpl = NULL, *rowof = NULL;
    struct ring_attn *ra = sh->ring ? cp_plan(m, b, &cpl, &rowof) : NULL;
    const int Nf = b->N, t0 = sh->sp && !ra ? sp_lo(Nf, sh->sp_size, sh->sp_rank) : 0;
    const int N = ra ? ra->n : sh->sp ? sp_lo(Nf, sh->sp_size, sh->sp_rank + 1) - t0 : Nf;
    const int D = c->hidden_size, lo = sh->layer_lo, hi = sh->layer_hi;
    const size_t nD = (size_t)N * D;
    if (!sh->has_embed && !x_in)
        check_failf(__FILE__, __LINE__, "model_forward_stage: stage %d needs the previous stage's output", sh->pp_rank);
    if (!sh->has_head && !y_out)
        check_failf(__FILE__, __LINE__, "model_forward_stage: stage %d needs somewhere to put its output", sh->pp_rank);
    const int nk = sh->has_head && !ra ? kept_rows(b, t0, t0 + N) : -1;
    struct model_acts *A = acts_get(m, N, b->B, checkpointing, nk, t0, Nf);
    if (A->ra)
        ring_attn_free(A->ra);
    free(A->ra);
    free(A->cprow);
    A->ra = ra, A->cprow = rowof;
    m->work->ring = ra;
    m->work->cprow = rowof;
    if (nk >= 0) { /* the kept rows' ranges (within this rank's rows, from its first), on the host for the backward */
        grow_host_i32(&A->krange, &A->krange_cap, b->B, 2);
        for (int s = 0; s < b->B; s++) {
            const int klo = b->logp_from[s] > t0 ? b->logp_from[s] : t0;
            const int khi = b->cu_seqlens[s + 1] < t0 + N ? b->cu_seqlens[s + 1] : t0 + N;
            A->krange[2 * s] = klo - t0;
            A->krange[2 * s + 1] = khi > klo ? khi - t0 : klo - t0;
        }
    }
    k_to_device(K, A->ids, ra ? cpl : b->ids + t0, (size_t)N * sizeof(int32_t));
    k_to_device(K, A->targets, ra ? cpl + N : b->targets + t0, (size_t)N * sizeof(int32_t));
    k_to_device(K, A->pos, ra ? cpl + 2 * (size_t)N : b->pos + t0, (size_t)N * sizeof(int32_t));
    free(cpl);
    k_to_device(K, A->cu, b->cu_seqlens, (size_t)(b->B + 1) * sizeof(int32_t));
    A->b = (struct packed_batch){N, b->B, A->ids, A->targets, A->pos, A->cu, NULL, NULL, NULL};
    if (b->prefix_of) { /* read on the host by the attention (the rows it names are checked there) */
        grow_host_i32(&A->prefix, &A->prefix_cap, b->B, 1);
        memcpy(A->prefix, b->prefix_of, (size_t)b->B * sizeof(int32_t));
        A->b.prefix_of = A->prefix;
    }
    if (b->routes && c->n_experts) { /* the rollout's experts, kept for a recomputing backward */
        const size_t n = (size_t)N * c->n_layers * c->n_experts_per_tok;
        if (n > A->routes_cap) {
            free(A->routes);
            A->routes = xmalloc(n * sizeof *A->routes);
            A->routes_cap = n;
        }
        const size_t w = (size_t)c->n_layers * c->n_experts_per_tok;
        if (ra) { /* context parallelism: each row's own; the ring's padding rows the first k experts (counted in
                   * no metric, moe_group_routing) */
            for (int i = 0; i < N; i++)
                for (size_t j = 0; j < w; j++)
                    A->routes[(size_t)i * w + j] =
                        rowof[i] >= 0 ? b->routes[(size_t)rowof[i] * w + j] : (uint16_t)(j % c->n_experts_per_tok);
        } else { /* this rank's rows [t0, t0 + N) (all of them without sequence parallelism) */
            memcpy(A->routes, b->routes + (size_t)t0 * w, n * sizeof *A->routes);
        }
        A->b.routes = A->routes;
    }
    A->temperature = temperature;

    const struct vocab_shard vs = acts_vocab(m, A);
    /* the stage's input: layer lo's (on the device while offloading), or the output itself */
    float *x0 = lo == hi ? A->xf : A->offload ? A->xdev[0] : A->layers[lo].x;
    if (sh->has_embed) {
        k_embedding_forward(K, x0, A->ids, m->w.embed, N, D, &vs);
        model_tp_sum(m, x0, nD);
    } else {
        k_to_device(K, x0, x_in, nD * sizeof(float));
    }
    /* the routing counted on every rank of a sequence- or context-parallel group (it sums over it), or none */
    const bool count = sh->sp ? Nf > 0 : N > 0;
    for (int l = lo; l < hi; l++) {
        struct layer_acts *a = &A->layers[l];
        if (A->offload) { /* keep the input in host memory; compute from and into the device's pair */
            float *in = A->xdev[(l - lo) & 1], *out = l + 1 < hi ? A->xdev[(l - lo + 1) & 1] : A->xf;
            k_to_host(K, a->x, in, nD * sizeof(float));
            A->scratch.x = in;
            layer_forward(m, l, &A->b, Nf, &A->scratch, out);
            if (A->scratch.rlog && count) /* an empty micro-batch (expert parallelism's padding) routed nothing */
                moe_count(m, l, &A->scratch.moe);
            continue;
        }
        float *out = l + 1 < hi ? A->layers[l + 1].x : A->xf;
        if (checkpointing) {
            A->scratch.x = a->x;
            layer_forward(m, l, &A->b, Nf, &A->scratch, out);
        } else {
            layer_forward(m, l, &A->b, Nf, a, out);
        }
        const struct layer_acts *ran = checkpointing ? &A->scratch : a;
        if (ran->rlog && count)
            moe_count(m, l, &ran->moe);
    }
    if (sh->has_head) {
        k_rmsnorm_forward(K, A->hn, A->rstdf, A->xf, m->w.final_norm, N, D, c->rms_norm_eps);
        if (ra) { /* context parallelism: every row here, then every rank's rows to every rank */
            k_lmhead_forward(K, A->logp, entropy ? A->entropy : NULL, A->hn, m->w.lm_head, A->targets, N, D, &vs,
                             temperature, LMHEAD_CHUNK);
            float *h = acts_host_buf(A, (size_t)N);
            k_to_host(K, h, A->logp, (size_t)N * sizeof(float));
            cp_share_rows(m, rowof, N, b, logp, h);
            if (entropy) {
                k_to_host(K, h, A->entropy, (size_t)N * sizeof(float));
                cp_share_rows(m, rowof, N, b, entropy, h);
            }
        } else if (A->nk >= 0) {
            head_forward_kept(m, A, b->targets + t0, &vs, logp + t0, entropy ? entropy + t0 : NULL);
        } else {
            k_lmhead_forward(K, A->logp, entropy ? A->entropy : NULL, A->hn, m->w.lm_head, A->targets, N, D, &vs,
                             temperature, LMHEAD_CHUNK);
            k_to_host(K, logp + t0, A->logp, (size_t)N * sizeof(float));
            if (entropy)
                k_to_host(K, entropy + t0, A->entropy, (size_t)N * sizeof(float));
        }
        if (sh->sp && !ra) { /* every rank's rows to every rank: zeros elsewhere, summed */
            sp_share_rows(sh->sp, logp, Nf, t0, N);
            if (entropy)
                sp_share_rows(sh->sp, entropy, Nf, t0, N);
        }
    } else {
        k_to_host(K, y_out, A->xf, nD * sizeof(float));
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
    struct model_work *w = work_of(A->m);
    karena_reset(&A->arena);
    karena_reset(&A->host_arena);
    A->next = w->pool;
    w->pool = A;
}

void model_backward_stage(struct model *m, struct model_acts *A, const float *dlogp, const float *dentropy,
                          const float *dy, float *dx_out)
{
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    struct kctx *K = m->K;
    const int N = A->b.N, D = c->hidden_size;
    const size_t nD = (size_t)N * D;
    if (!sh->has_head && !dy)
        check_failf(__FILE__, __LINE__, "model_backward_stage: stage %d needs the next stage's gradient", sh->pp_rank);
    if (!sh->has_embed && !dx_out)
        check_failf(__FILE__, __LINE__, "model_backward_stage: stage %d needs somewhere to put its input gradient",
                    sh->pp_rank);
    if (m->lora)
        model_trainable(m); /* the adapter's gradients; the frozen base has none */
    else
        model_alloc_grads(m);
    struct model_params *G = m->lora ? NULL : m->grad;
    struct karena *ar = &work_of(m)->bwd;
    struct karena plan;
    struct bwd_bufs d;
    m->work->ring = A->ra; /* context parallelism: the batch's ring */
    m->work->cprow = A->cprow;
    karena_init_counter(&plan);
    bwd_take(m, N, A->Nf, sh->has_head ? A->nk : -1, &d, A->ckpt, &plan);
    karena_reserve(ar, plan.used, 0);
    bwd_take(m, N, A->Nf, sh->has_head ? A->nk : -1, &d, A->ckpt, ar);
    const struct vocab_shard vs = acts_vocab(m, A);
    k_zero(K, d.dx, nD * sizeof(float));
    if (sh->has_head) {
        k_zero(K, d.dh, nD * sizeof(float));
        if (A->nk >= 0) { /* the kept rows alone: the others' dlogp and dentropy are 0 */
            const size_t nk = (size_t)A->nk;
            k_to_device(K, d.dlogp, gather_kept(A, dlogp + A->t0), nk * sizeof(float));
            if (dentropy)
                k_to_device(K, d.dentropy, gather_kept(A, dentropy + A->t0), nk * sizeof(float));
            k_zero(K, d.dhk, nk * D * sizeof(float));
            k_lmhead_backward(K, d.dhk, G ? G->lm_head : NULL, d.dlogp, dentropy ? d.dentropy : NULL, A->hk,
                              m->w.lm_head, A->tk, A->nk, D, &vs, A->temperature, LMHEAD_CHUNK);
            copy_kept_states(K, A, d.dh, d.dhk, D, false);
        } else if (A->ra) { /* context parallelism: this rank's rows of the whole batch's */
            float *h = acts_host_buf(A, (size_t)N);
            cp_take_rows(A->cprow, N, h, dlogp);
            k_to_device(K, d.dlogp, h, (size_t)N * sizeof(float));
            if (dentropy) {
                cp_take_rows(A->cprow, N, h, dentropy);
                k_to_device(K, d.dentropy, h, (size_t)N * sizeof(float));
            }
            k_lmhead_backward(K, d.dh, G ? G->lm_head : NULL, d.dlogp, dentropy ? d.dentropy : NULL, A->hn,
                              m->w.lm_head, A->targets, N, D, &vs, A->temperature, LMHEAD_CHUNK);
        } else {
            k_to_device(K, d.dlogp, dlogp + A->t0, (size_t)N * sizeof(float));
            if (dentropy)
                k_to_device(K, d.dentropy, dentropy + A->t0, (size_t)N * sizeof(float));
            k_lmhead_backward(K, d.dh, G ? G->lm_head : NULL, d.dlogp, dentropy ? d.dentropy : NULL, A->hn,
                              m->w.lm_head, A->targets, N, D, &vs, A->temperature, LMHEAD_CHUNK);
        }
        model_tp_sum(m, d.dh, nD); /* each rank's vocabulary rows gave their part of dL/dh */
        k_rmsnorm_backward(K, d.dx, G ? G->final_norm : m->lora->sink, d.dh, A->xf, m->w.final_norm, A->rstdf, N, D);
    } else {
        k_to_device(K, d.dx, dy, nD * sizeof(float));
    }
    for (int l = sh->layer_hi - 1; l >= sh->layer_lo; l--) {
        struct layer_acts *a = &A->layers[l];
        if (A->ckpt) {
            /* recompute this layer's activations from its saved input (back from host memory when offloaded) */
            if (A->offload)
                k_to_device(K, A->xdev[0], a->x, nD * sizeof(float));
            A->scratch.x = A->offload ? A->xdev[0] : a->x;
            layer_forward(m, l, &A->b, A->Nf, &A->scratch, d.scratch_out);
            layer_backward(m, l, &A->b, A->Nf, &A->scratch, &d);
        } else {
            layer_backward(m, l, &A->b, A->Nf, a, &d);
        }
        if (m->layer_grads_hook)
            m->layer_grads_hook(m->layer_grads_ud, l);
    }
    if (sh->has_embed) {
        if (G) /* a frozen embedding (LoRA) needs no gradient */
            k_embedding_backward(K, G->embed, d.dx, A->ids, N, D, &vs);
    } else
        k_to_host(K, dx_out, d.dx, nD * sizeof(float));
    karena_reset(ar);
    model_acts_free(A);
}

void model_backward(struct model *m, struct model_acts *A, const float *dlogp, const float *dentropy)
{
    model_backward_stage(m, A, dlogp, dentropy, NULL, NULL);
}
