/* Inference with a KV cache: prefill and decode are the same step, with
 * ntok[b] new tokens for sequence b (a prompt, or one sampled token).
 *
 * A decode step (one new token per sequence, the batched attention) is replayed as a graph where the back-end has
 * them (CUDA graphs; issue 43 item 4): its inputs (positions, ids, the caches' table) go to the device in one copy,
 * then one launch runs every layer and the logits. A graph is recorded at the second eager step of a shape (B
 * sequences, the same rows of logits, over the same arena and the same context memory: the first one grows what it
 * needs) and launched while that shape lasts; a new shape runs eagerly, then records. model_set_decode_graphs(false)
 * (actor_rollout_ref.rollout.enforce_eager=true) runs every step eagerly. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "model.h"
#include "model_internal.h"
#include "model_moe.h"
#include "worker/comm/comm.h"

struct kv_slab {
    struct kctx *K;
    int n_slots;
    size_t bytes;
    char *mem;              /* n_slots x this stage's layers x (k, v) x (cap, KD) elements of k_kv_elem_bytes */
    struct kv_cache *slots; /* n_slots */
    void **ptrs;            /* each slot's k[] and v[] (n_layers each) */
};

size_t kv_slot_bytes(const struct model *m, int cap)
{
    const size_t KD = (size_t)m->sh.n_kv_heads * m->cfg.head_dim, nl = (size_t)(m->sh.layer_hi - m->sh.layer_lo);
    return nl * 2 * (size_t)(cap > 0 ? cap : 1) * KD * k_kv_elem_bytes(m->K);
}

size_t kv_slots_fit(const struct model *m, size_t budget, int cap)
{
    const size_t fit = budget / kv_slot_bytes(m, cap);
    struct comm *copy = m->sh.ep ? NULL : m->sh.mp ? m->sh.mp : m->sh.tp ? m->sh.tp : m->sh.pp;
    if (!copy)
        return fit;
    int64_t neg = -(int64_t)(fit < (size_t)INT64_MAX ? fit : (size_t)INT64_MAX); /* the least as the most of -fit */
    comm_allreduce_max(copy, &neg, 1, COMM_I64);
    return (size_t)-neg;
}

struct kv_slab *kv_slab_create(const struct model *m, int n_slots, int cap)
{
    const struct model_config *c = &m->cfg;
    const size_t KD = (size_t)m->sh.n_kv_heads * c->head_dim, nl = (size_t)(m->sh.layer_hi - m->sh.layer_lo);
    const size_t per = (size_t)(cap > 0 ? cap : 1) * KD * k_kv_elem_bytes(m->K); /* bytes of a layer's k (or v) */
    const size_t L = (size_t)c->n_layers;
    if (n_slots < 1)
        check_failf(__FILE__, __LINE__, "kv_slab_create: %d slots", n_slots);
    struct kv_slab *s = xcalloc(1, sizeof *s);
    s->K = m->K;
    s->n_slots = n_slots;
    s->bytes = (size_t)n_slots * nl * 2 * per;
    char what[96];
    snprintf(what, sizeof what, "the KV cache of %d sequences of %d tokens", n_slots, cap);
    s->mem = k_alloc(m->K, s->bytes ? s->bytes : 1, KMEM_KV, what);
    s->slots = xcalloc((size_t)n_slots, sizeof *s->slots);
    s->ptrs = xcalloc((size_t)n_slots * 2 * L, sizeof *s->ptrs);
    for (int i = 0; i < n_slots; i++) {
        struct kv_cache *kc = &s->slots[i];
        kc->cap = cap;
        kc->n_layers = c->n_layers;
        kc->k = s->ptrs + (size_t)i * 2 * L;
        kc->v = kc->k + L;
        for (int l = m->sh.layer_lo; l < m->sh.layer_hi; l++) { /* this stage's layers */
            char *base = s->mem + (((size_t)i * nl + (size_t)(l - m->sh.layer_lo)) * 2) * per;
            kc->k[l] = base;
            kc->v[l] = base + per;
        }
    }
    return s;
}

struct kv_cache *kv_slab_slot(struct kv_slab *s, int i)
{
    if (i < 0 || i >= s->n_slots)
        check_failf(__FILE__, __LINE__, "kv_slab_slot: slot %d of %d", i, s->n_slots);
    return &s->slots[i];
}

void kv_slab_free(struct kv_slab *s)
{
    if (!s)
        return;
    k_free(s->K, s->mem, s->bytes ? s->bytes : 1, KMEM_KV);
    free(s->slots);
    free(s->ptrs);
    free(s);
}

struct kv_cache *kv_cache_create(const struct model *m, int cap)
{
    struct kv_slab *s = kv_slab_create(m, 1, cap);
    s->slots[0].own = s;
    return &s->slots[0];
}

void kv_cache_free(struct kv_cache *kc)
{
    if (kc && kc->own)
        kv_slab_free(kc->own);
}

void kv_cache_copy(const struct model *m, struct kv_cache *dst, const struct kv_cache *src)
{
    const size_t KD = (size_t)m->sh.n_kv_heads * m->cfg.head_dim, eb = k_kv_elem_bytes(m->K);
    if (dst->cap < src->len)
        check_failf(__FILE__, __LINE__, "kv_cache_copy: destination holds %d tokens, source has %d", dst->cap,
                    src->len);
    for (int l = m->sh.layer_lo; l < m->sh.layer_hi; l++) {
        k_copy(m->K, dst->k[l], src->k[l], (size_t)src->len * KD * eb);
        k_copy(m->K, dst->v[l], src->v[l], (size_t)src->len * KD * eb);
    }
    dst->len = src->len;
}

/* Buffers of one step over N new tokens of B sequences (rows of logits), in order: a counting arena plans. */
struct step_bufs {
    void *in; /* the inputs, copied in one call: the caches' table (kvtab), then the positions and the ids */
    int32_t *pos, *ids;
    float *x, *xn, *q, *att, *k, *v, *g, *u, *tmp, *hid;
    float *lg, *part, *all, *mine; /* logits (rows, V); under TP this rank's columns and the gathered ones */
    float *rlog;                   /* mixture of experts: (N, E) the router's logits */
    struct kmoe moe;               /* and the routing */
    void *kvtab;                   /* a batched decode step's caches: (layers x B) k, then v, pointers, B lengths */
};

/* The batched decode's table: 2 x (this stage's layers) x B cache pointers, then B int32 lengths. */
static size_t kvtab_bytes(const struct model *m, int B)
{
    const size_t nl = (size_t)(m->sh.layer_hi - m->sh.layer_lo);
    return 2 * nl * (size_t)B * sizeof(void *) + (size_t)B * sizeof(int32_t);
}

/* The inputs' bytes: the table, then N positions and N ids. */
static size_t inputs_bytes(const struct model *m, int N, int B)
{
    return kvtab_bytes(m, B) + 2 * (size_t)N * sizeof(int32_t);
}

static bool g_decode_graphs = true;

void model_set_decode_graphs(bool on) { g_decode_graphs = on; }

/* Whether this step decodes every sequence's one new token through the back-end's batched op. */
static bool decode_batched(const struct model *m, int B, const int *ntok)
{
    if (m->decode_per_sequence || !k_has_decode_batched(m->K) || B < 1)
        return false;
    for (int b = 0; b < B; b++)
        if (ntok[b] != 1)
            return false;
    return true;
}

/* The step's inputs in one copy (t->in): the positions, the ids (when given) and, for the batched decode (kvtab),
 * the table's k and v pointers of every layer and the lengths before the step. One call, as a graph's step must
 * have them on the device before its launch. */
static void inputs_upload(struct model *m, struct kv_cache **caches, int B, const int *ntok, int N, const int32_t *ids,
                          bool kvtab, const struct step_bufs *t)
{
    const int lo = m->sh.layer_lo, nl = m->sh.layer_hi - lo;
    const size_t tab = kvtab_bytes(m, B);
    char *h = model_host_inputs(m, inputs_bytes(m, N, B));
    void **kp = (void **)(void *)h, **vp = kp + (size_t)nl * B;
    int32_t *len = (int32_t *)(void *)(h + 2 * (size_t)nl * B * sizeof(void *));
    int32_t *pos = (int32_t *)(void *)(h + tab), *hid = pos + N;
    for (int l = 0; kvtab && l < nl; l++)
        for (int b = 0; b < B; b++) {
            kp[(size_t)l * B + b] = caches[b]->k[lo + l];
            vp[(size_t)l * B + b] = caches[b]->v[lo + l];
        }
    for (int b = 0; kvtab && b < B; b++)
        len[b] = caches[b]->len;
    for (int b = 0, i = 0; b < B; b++)
        for (int j = 0; j < ntok[b]; j++)
            pos[i++] = caches[b]->len + j;
    if (ids)
        memcpy(hid, ids, (size_t)N * sizeof(int32_t));
    const size_t from = kvtab ? 0 : tab, to = tab + (ids ? 2 : 1) * (size_t)N * sizeof(int32_t);
    k_to_device(m->K, (char *)t->in + from, h + from, to - from);
}

static void step_take(const struct model *m, int N, int B, int rows, struct step_bufs *t, struct karena *ar)
{
    const struct model_config *c = &m->cfg;
    const size_t n = (size_t)N, D = (size_t)c->hidden_size, F = (size_t)m->sh.inter, V = (size_t)c->vocab_size;
    const size_t QD = (size_t)m->sh.n_heads * c->head_dim, KD = (size_t)m->sh.n_kv_heads * c->head_dim;
    const int tp = m->sh.tp_size;
    const size_t per = (size_t)((c->vocab_size + tp - 1) / tp), Vl = (size_t)(m->sh.vocab_hi - m->sh.vocab_lo);
    memset(t, 0, sizeof *t);
    t->in = karena_take(ar, inputs_bytes(m, N, B));
    if (t->in) {
        t->kvtab = t->in;
        t->pos = (int32_t *)(void *)((char *)t->in + kvtab_bytes(m, B));
        t->ids = t->pos + N;
    }
    t->x = karena_take(ar, n * D * sizeof(float));
    t->xn = karena_take(ar, n * D * sizeof(float));
    t->q = karena_take(ar, n * QD * sizeof(float));
    t->att = karena_take(ar, n * QD * sizeof(float));
    t->k = karena_take(ar, n * KD * sizeof(float));
    t->v = karena_take(ar, n * KD * sizeof(float));
    if (c->n_experts) {
        t->rlog = karena_take(ar, n * (size_t)c->n_experts * sizeof(float));
        t->moe = (struct kmoe){.N = N,
                               .E = c->n_experts,
                               .k = c->n_experts_per_tok,
                               .D = c->hidden_size,
                               .F = m->sh.moe_inter,
                               .norm_topk = c->norm_topk_prob};
        kmoe_take(ar, &t->moe, false);
    } else {
        t->g = karena_take(ar, n * F * sizeof(float));
        t->u = karena_take(ar, n * F * sizeof(float));
    }
    t->tmp = karena_take(ar, n * D * sizeof(float));
    t->hid = karena_take(ar, (size_t)B * D * sizeof(float));
    if (rows == 0)
        return;
    t->lg = karena_take(ar, (size_t)rows * V * sizeof(float)); /* every stage: the last one broadcasts them */
    if (m->sh.has_head && tp > 1) {
        t->part = karena_take(ar, (size_t)rows * per * sizeof(float));
        t->all = karena_take(ar, (size_t)tp * rows * per * sizeof(float));
        t->mine = karena_take(ar, (size_t)rows * Vl * sizeof(float));
    }
}

/* logits (rows, V) of the normed hidden states h (rows, D): each TP rank computes its vocabulary rows, and the
 * ranks' columns are gathered (sampling needs every logit; the training log-probs never gather them). */
static void head_logits(const struct model *m, const struct step_bufs *t, const float *h, int rows)
{
    struct kctx *K = m->K;
    const int D = m->cfg.hidden_size, V = m->cfg.vocab_size, tp = m->sh.tp_size;
    if (tp == 1) {
        k_linear_forward(K, t->lg, h, m->w.lm_head, NULL, rows, D, V);
        return;
    }
    const int per = (V + tp - 1) / tp, Vl = m->sh.vocab_hi - m->sh.vocab_lo;
    k_zero(K, t->part, (size_t)rows * per * sizeof(float));
    k_linear_forward(K, t->mine, h, m->w.lm_head, NULL, rows, D, Vl);
    for (int i = 0; i < rows; i++)
        k_copy(K, t->part + (size_t)i * per, t->mine + (size_t)i * Vl, (size_t)Vl * sizeof(float));
    comm_allgather(m->sh.tp, t->part, t->all, (size_t)rows * per, COMM_F32);
    for (int r = 0; r < tp; r++) {
        const struct model_shard sh = model_shard_of(&m->cfg, r, tp, 0, 1);
        const int lo = sh.vocab_lo, hi = sh.vocab_hi;
        const float *src = t->all + (size_t)r * rows * per;
        for (int i = 0; i < rows; i++)
            k_copy(K, t->lg + (size_t)i * V + lo, src + (size_t)i * per, (size_t)(hi - lo) * sizeof(float));
    }
}

void model_step(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids, float *logits,
                bool all_logits)
{
    model_step_hidden(m, caches, B, ntok, ids, logits, all_logits, NULL);
}

/* Each sequence's last new token's row of x: x itself when every sequence has one new token (a decode step), else
 * copied into out (B, D). */
static const float *last_rows(struct kctx *K, float *out, const float *x, int B, const int *ntok, int D)
{
    int N = 0;
    for (int b = 0; b < B; b++)
        N += ntok[b];
    if (N == B)
        return x;
    for (int b = 0, off = 0; b < B; off += ntok[b], b++)
        k_copy(K, out + (size_t)b * D, x + (size_t)(off + ntok[b] - 1) * D, (size_t)D * sizeof(float));
    return out;
}

void model_step_record_routes(struct model *m, uint16_t *const *dst) { m->moe_record = dst; }

/* Layer l's experts of each new token into model_step_record_routes' destinations. */
static void record_routes(const struct model *m, int l, const struct kmoe *r, int B, const int *ntok)
{
    const int k = r->k, L = m->cfg.n_layers;
    int32_t *idx = xmalloc((size_t)r->N * k * sizeof *idx);
    k_to_host(m->K, idx, r->idx, (size_t)r->N * k * sizeof *idx);
    for (int b = 0, off = 0; b < B; off += ntok[b], b++)
        for (int j = 0; j < ntok[b]; j++)
            for (int i = 0; i < k; i++)
                m->moe_record[b][((size_t)j * L + l) * k + i] = (uint16_t)idx[(size_t)(off + j) * k + i];
    free(idx);
}

/* What a step runs on the device once its inputs are there: the embedding (or the previous stage's output), the
 * layers, and the wanted rows of logits (hidden_last: each sequence's last hidden state, to the host). A decode
 * step's graph records this; it changes nothing on the host but what record_routes writes, so it may run again. */
static void step_layers(struct model *m, struct kv_cache **caches, int B, const int *ntok, int N, int rows,
                        bool all_logits, bool batched, float *hidden_last, struct step_bufs *t)
{
    const struct model_config *c = &m->cfg;
    struct kctx *K = m->K;
    const int D = c->hidden_size, F = m->sh.inter, hd = c->head_dim, Hq = m->sh.n_heads, Hkv = m->sh.n_kv_heads;
    const int QD = Hq * hd, KD = Hkv * hd;
    const size_t nD = (size_t)N * D;
    const struct vocab_shard vs = {.lo = m->sh.vocab_lo, .hi = m->sh.vocab_hi, .V = c->vocab_size};
    const struct model_shard *sh = &m->sh;
    if (sh->has_embed) {
        k_embedding_forward(K, t->x, t->ids, m->w.embed, N, D, &vs);
        model_tp_sum(m, t->x, nD);
    } else { /* the previous stage's output */
        comm_recv(sh->pp, t->x, nD, COMM_F32, sh->pp_rank - 1);
    }
    for (int l = sh->layer_lo; l < sh->layer_hi; l++) {
        const struct layer_params *L = &m->w.layers[l];
        k_rmsnorm_forward(K, t->xn, NULL, t->x, L->attn_norm, N, D, c->rms_norm_eps);
        model_proj_forward(m, l, PROJ_Q, t->q, t->xn, N);
        model_proj_forward(m, l, PROJ_K, t->k, t->xn, N);
        model_proj_forward(m, l, PROJ_V, t->v, t->xn, N);
        if (L->q_norm) { /* Qwen3: each head's q and k RMS-normed before RoPE (in place: row by row) */
            k_rmsnorm_forward(K, t->q, NULL, t->q, L->q_norm, N * Hq, hd, c->rms_norm_eps);
            k_rmsnorm_forward(K, t->k, NULL, t->k, L->k_norm, N * Hkv, hd, c->rms_norm_eps);
        }
        k_rope_forward(K, t->q, t->pos, N, Hq, hd, m->rope_freqs);
        k_rope_forward(K, t->k, t->pos, N, Hkv, hd, m->rope_freqs);
        if (batched) { /* one call: every sequence's new K and V appended, and attended */
            const size_t nl = (size_t)(sh->layer_hi - sh->layer_lo), at = (size_t)(l - sh->layer_lo) * B;
            void *const *kp = (void *const *)t->kvtab;
            const int32_t *lens = (const int32_t *)((const char *)t->kvtab + 2 * nl * B * sizeof(void *));
            k_attention_decode_batched(K, t->att, t->q, t->k, t->v, kp + at, kp + nl * B + at, lens, B, Hq, Hkv, hd);
        }
        for (int b = 0, off = 0; !batched && b < B; off += ntok[b], b++) {
            struct kv_cache *kc = caches[b];
            const size_t at = (size_t)kc->len * KD, n = (size_t)ntok[b] * KD;
            k_kv_store(K, kc->k[l], at, t->k + (size_t)off * KD, n);
            k_kv_store(K, kc->v[l], at, t->v + (size_t)off * KD, n);
            k_attention_cached(K, t->att + (size_t)off * QD, t->q + (size_t)off * QD, kc->k[l], kc->v[l], ntok[b],
                               kc->len + ntok[b], Hq, Hkv, hd);
        }
        model_proj_forward(m, l, PROJ_O, t->tmp, t->att, N);
        model_tp_sum_rowpar(m, t->tmp, nD);
        k_add(K, t->x, t->tmp, nD);
        k_rmsnorm_forward(K, t->xn, NULL, t->x, L->mlp_norm, N, D, c->rms_norm_eps);
        if (L->router) { /* mixture of experts: the same routing and grouped products as the training forward */
            model_router_forward(m, l, t->rlog, t->xn, N);
            k_moe_route(K, &t->moe, t->rlog);
            if (m->moe_record)
                record_routes(m, l, &t->moe, B, ntok);
            const float *W[3] = {L->w_gate, L->w_up, L->w_down};
            const bool merged = model_expert_weights(m, l, W); /* batch-invariant mode: the hook's terms in W */
            t->moe.lora = merged ? NULL : model_expert_terms(m, l, (size_t)N * c->n_experts_per_tok);
            t->moe.bi_groups = model_bi_expert_groups(m);
            model_moe_generate(m, W, &t->moe, t->xn, t->tmp);
            model_tp_sum_rowpar(m, t->tmp, nD); /* under TP each rank's rows of every expert (or its experts) gave a
                                                 * part */
            k_add(K, t->x, t->tmp, nD);
            continue;
        }
        model_proj_forward(m, l, PROJ_GATE, t->g, t->xn, N);
        model_proj_forward(m, l, PROJ_UP, t->u, t->xn, N);
        k_swiglu_forward(K, t->g, t->g, t->u, (size_t)N * F);
        model_proj_forward(m, l, PROJ_DOWN, t->tmp, t->g, N);
        model_tp_sum_rowpar(m, t->tmp, nD);
        k_add(K, t->x, t->tmp, nD);
    }
    if (!sh->has_head)
        comm_send(sh->pp, t->x, nD, COMM_F32, sh->pp_rank + 1);
    if (hidden_last && sh->has_head) { /* each sequence's last new token, through the final norm */
        const float *last = last_rows(K, t->tmp, t->x, B, ntok, D);
        k_rmsnorm_forward(K, t->hid, NULL, last, m->w.final_norm, B, D, c->rms_norm_eps);
        k_to_host(K, hidden_last, t->hid, (size_t)B * D * sizeof(float));
    }
    if (rows && sh->has_head) {
        if (all_logits) {
            k_rmsnorm_forward(K, t->xn, NULL, t->x, m->w.final_norm, N, D, c->rms_norm_eps);
        } else { /* only each sequence's last new token needs logits */
            const float *last = last_rows(K, t->tmp, t->x, B, ntok, D);
            k_rmsnorm_forward(K, t->xn, NULL, last, m->w.final_norm, B, D, c->rms_norm_eps);
        }
        head_logits(m, t, t->xn, rows);
    }
    if (rows && sh->pp) /* the last stage's logits to every stage: they sample the same tokens */
        comm_broadcast(sh->pp, t->lg, (size_t)rows * c->vocab_size, COMM_F32, sh->pp_size - 1);
}

/* ---- decode steps as graphs ---- */

/* One line per model and reason (a bit of told) on why its decode steps run eagerly. */
static void tell_once(struct model *m, unsigned bit, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void tell_once(struct model *m, unsigned bit, const char *fmt, ...)
{
    struct model_work *w = model_work_of(m);
    if (w->told & bit)
        return;
    w->told |= bit;
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(LOG_INFO, "model", fmt, ap);
    va_end(ap);
}

/* Why m's decode steps cannot be graphs (NULL: they can): what needs the host or a communicator between layers. */
static const char *graph_blocker(const struct model *m)
{
    if (m->sh.tp)
        return "tensor parallelism (each layer's all-reduce goes through the communicator)";
    if (m->sh.pp)
        return "pipeline parallelism (each stage sends and receives between its layers)";
    if (m->cfg.n_experts)
        return "a mixture of experts (the routing sizes the experts' products on the host)";
    if (m->hook)
        return "an adapter's terms on the projections (a LoRA hook)";
    return NULL;
}

enum step_how { STEP_EAGER, STEP_RECORD, STEP_REPLAY };

/* How a decode step of B sequences and rows of logits runs: replayed (*g its graph) while its shape, the step
 * arena and the context's memory are what the graph was recorded with; recorded when the eager step before had
 * the same; else eagerly. Graphs recorded at another k_graph_epoch are freed: memory they read may be gone. */
static enum step_how graph_how(struct model *m, int B, int rows, struct kgraph **g)
{
    struct model_work *w = model_work_of(m);
    const void *base = w->step.base;
    const uint64_t epoch = k_graph_epoch(m->K);
    w->decodes++;
    *g = NULL;
    for (int i = 0; i < STEP_GRAPHS; i++) {
        struct step_graph *s = &w->graphs[i];
        if (s->used && s->epoch != epoch) {
            k_graph_free(m->K, s->g);
            memset(s, 0, sizeof *s);
        }
        if (s->used && s->B == B && s->rows == rows && s->base == base) {
            s->used = w->decodes;
            *g = s->g;
            return s->g ? STEP_REPLAY : STEP_EAGER; /* no graph: that shape could not be recorded */
        }
    }
    const struct step_graph *k = &w->warm;
    return k->used && k->B == B && k->rows == rows && k->base == base && k->epoch == epoch ? STEP_RECORD : STEP_EAGER;
}

/* Keep g (NULL: the shape could not be recorded) for decode steps of B sequences and rows of logits, in place of
 * the least recently launched one. */
static void graph_keep(struct model *m, int B, int rows, struct kgraph *g)
{
    struct model_work *w = model_work_of(m);
    struct step_graph *s = &w->graphs[0];
    for (int i = 1; i < STEP_GRAPHS && s->used; i++)
        if (!w->graphs[i].used || w->graphs[i].used < s->used)
            s = &w->graphs[i];
    k_graph_free(m->K, s->g);
    *s = (struct step_graph){g, B, rows, w->step.base, k_graph_epoch(m->K), w->decodes};
}

void model_step_graphs_free(struct model *m)
{
    struct model_work *w = m->work;
    if (!w)
        return;
    for (int i = 0; i < STEP_GRAPHS; i++)
        k_graph_free(m->K, w->graphs[i].g);
    memset(w->graphs, 0, sizeof w->graphs);
    memset(&w->warm, 0, sizeof w->warm);
}

/* The step: logits wanted (rows of all_logits ? N : B) are left in the step arena, in the context's memory, on
 * every stage; returned (NULL when not wanted). */
static const float *step(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids,
                         bool want_logits, bool all_logits, float *hidden_last)
{
    struct kctx *K = m->K;
    if (m->sh.ep_size > 1) /* each rank's own decode steps would need every other rank at each one */
        check_failf(__FILE__, __LINE__,
                    "model_step: an expert-parallel shard does not generate; generate with a whole "
                    "copy of the model");
    int N = 0;
    for (int b = 0; b < B; b++) {
        if (caches[b]->len + ntok[b] > caches[b]->cap)
            check_failf(__FILE__, __LINE__, "KV cache of sequence %d full: %d + %d tokens > capacity %d", b,
                        caches[b]->len, ntok[b], caches[b]->cap);
        N += ntok[b];
    }
    if (N == 0)
        return NULL; /* every sequence asked for zero new tokens */
    const int rows = want_logits ? (all_logits ? N : B) : 0;
    struct karena *ar = model_step_arena(m), plan;
    struct step_bufs t;
    karena_init_counter(&plan);
    step_take(m, N, B, rows, &t, &plan);
    karena_reserve(ar, plan.used, 0);
    step_take(m, N, B, rows, &t, ar);
    const bool batched = decode_batched(m, B, ntok);
    inputs_upload(m, caches, B, ntok, N, m->sh.has_embed ? ids : NULL, batched, &t);
    /* a decode step: replayed, recorded or run eagerly (the top of this file) */
    const bool graphs = batched && !hidden_last && g_decode_graphs && k_has_graphs(K);
    const char *blocked = graphs ? graph_blocker(m) : NULL;
    if (blocked)
        tell_once(m, 1, "decode steps run eagerly, not as graphs: %s", blocked);
    struct kgraph *g = NULL;
    enum step_how how = graphs && !blocked ? graph_how(m, B, rows, &g) : STEP_EAGER;
    if (how == STEP_RECORD) {
        char why[256];
        if (!k_graph_begin(K, why, sizeof why)) {
            tell_once(m, 2, "decode steps run eagerly, not as graphs: %s", why);
            how = STEP_EAGER;
        } else {
            step_layers(m, caches, B, ntok, N, rows, all_logits, batched, hidden_last, &t);
            g = k_graph_end(K, why, sizeof why);
            graph_keep(m, B, rows, g);
            if (g) {
                how = STEP_REPLAY;
            } else { /* what was recorded did not run: the step runs again, eagerly, and so will its shape */
                tell_once(m, 4,
                          "a decode step of %d sequences could not be recorded as a graph (%s); steps of that "
                          "shape run eagerly",
                          B, why);
                how = STEP_EAGER;
            }
        }
    }
    if (how == STEP_REPLAY) {
        k_graph_launch(K, g);
    } else {
        step_layers(m, caches, B, ntok, N, rows, all_logits, batched, hidden_last, &t);
        if (graphs && !blocked) { /* the next step of this shape records (what this one grew stays) */
            struct model_work *w = model_work_of(m);
            w->warm = (struct step_graph){NULL, B, rows, ar->base, k_graph_epoch(K), w->decodes};
        }
    }
    for (int b = 0; b < B; b++)
        caches[b]->len += ntok[b];
    karena_reset(ar); /* the logits stay readable until the next step takes the arena */
    return t.lg;
}

void model_step_hidden(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids,
                       float *logits, bool all_logits, float *hidden_last)
{
    const float *lg = step(m, caches, B, ntok, ids, logits != NULL, all_logits, hidden_last);
    if (lg) {
        int N = 0;
        for (int b = 0; b < B; b++)
            N += ntok[b];
        k_to_host(m->K, logits, lg, (size_t)(all_logits ? N : B) * m->cfg.vocab_size * sizeof(float));
    }
}

const float *model_step_logits(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids)
{
    return step(m, caches, B, ntok, ids, true, false, NULL);
}

void model_logits(struct model *m, const int32_t *ids, int T, float *logits)
{
    struct kv_cache *kc = kv_cache_create(m, T);
    model_step(m, &kc, 1, &T, ids, logits, true);
    kv_cache_free(kc);
}
