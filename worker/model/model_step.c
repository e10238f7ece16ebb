/* Inference with a KV cache: prefill and decode are the same step, with
 * ntok[b] new tokens for sequence b (a prompt, or one sampled token). */
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model.h"
#include "model_internal.h"
#include "worker/comm/comm.h"

struct kv_cache *kv_cache_create(const struct model *m, int cap)
{
    const struct model_config *c = &m->cfg;
    const size_t KD = (size_t)m->sh.n_kv_heads * c->head_dim;
    struct kv_cache *kc = xcalloc(1, sizeof *kc);
    kc->cap = cap;
    kc->k = xcalloc((size_t)c->n_layers, sizeof(float *));
    kc->v = xcalloc((size_t)c->n_layers, sizeof(float *));
    for (int l = m->sh.layer_lo; l < m->sh.layer_hi; l++) { /* this stage's layers */
        kc->k[l] = xmalloc((size_t)cap * KD * sizeof(float));
        kc->v[l] = xmalloc((size_t)cap * KD * sizeof(float));
    }
    kc->n_layers = c->n_layers;
    return kc;
}

void kv_cache_free(struct kv_cache *kc)
{
    if (!kc)
        return;
    for (int l = 0; l < kc->n_layers; l++) {
        free(kc->k[l]);
        free(kc->v[l]);
    }
    free(kc->k);
    free(kc->v);
    free(kc);
}

void kv_cache_copy(const struct model *m, struct kv_cache *dst, const struct kv_cache *src)
{
    const size_t KD = (size_t)m->sh.n_kv_heads * m->cfg.head_dim;
    if (dst->cap < src->len)
        check_failf(__FILE__, __LINE__, "kv_cache_copy: destination holds %d tokens, source has %d", dst->cap,
                    src->len);
    for (int l = m->sh.layer_lo; l < m->sh.layer_hi; l++) {
        memcpy(dst->k[l], src->k[l], (size_t)src->len * KD * sizeof(float));
        memcpy(dst->v[l], src->v[l], (size_t)src->len * KD * sizeof(float));
    }
    dst->len = src->len;
}

/* logits (rows, V) of the normed hidden states h (rows, D): each TP rank computes its vocabulary rows, and the
 * ranks' columns are gathered (sampling needs every logit; the training log-probs never gather them). */
static void head_logits(const struct model *m, float *logits, const float *h, int rows)
{
    const int D = m->cfg.hidden_size, V = m->cfg.vocab_size, tp = m->sh.tp_size;
    if (tp == 1) {
        linear_forward(logits, h, m->w.lm_head, NULL, rows, D, V);
        return;
    }
    const int per = (V + tp - 1) / tp, Vl = m->sh.vocab_hi - m->sh.vocab_lo;
    float *part = xcalloc((size_t)rows * per, sizeof(float)), *all = xmalloc((size_t)tp * rows * per * sizeof(float));
    float *mine = xmalloc((size_t)rows * Vl * sizeof(float));
    linear_forward(mine, h, m->w.lm_head, NULL, rows, D, Vl);
    for (int i = 0; i < rows; i++)
        memcpy(part + (size_t)i * per, mine + (size_t)i * Vl, (size_t)Vl * sizeof(float));
    comm_allgather(m->sh.tp, part, all, (size_t)rows * per, COMM_F32);
    for (int r = 0; r < tp; r++) {
        const struct model_shard sh = model_shard_of(&m->cfg, r, tp, 0, 1);
        const int lo = sh.vocab_lo, hi = sh.vocab_hi;
        const float *src = all + (size_t)r * rows * per;
        for (int i = 0; i < rows; i++)
            memcpy(logits + (size_t)i * V + lo, src + (size_t)i * per, (size_t)(hi - lo) * sizeof(float));
    }
    free(part), free(all), free(mine);
}

void model_step(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids, float *logits,
                bool all_logits)
{
    model_step_hidden(m, caches, B, ntok, ids, logits, all_logits, NULL);
}

void model_step_hidden(struct model *m, struct kv_cache **caches, int B, const int *ntok, const int32_t *ids,
                       float *logits, bool all_logits, float *hidden_last)
{
    const struct model_config *c = &m->cfg;
    const int D = c->hidden_size, F = m->sh.inter, hd = c->head_dim, Hq = m->sh.n_heads, Hkv = m->sh.n_kv_heads;
    const int QD = Hq * hd, KD = Hkv * hd;
    int N = 0;
    for (int b = 0; b < B; b++) {
        if (caches[b]->len + ntok[b] > caches[b]->cap)
            check_failf(__FILE__, __LINE__, "KV cache of sequence %d full: %d + %d tokens > capacity %d", b,
                        caches[b]->len, ntok[b], caches[b]->cap);
        N += ntok[b];
    }
    if (N == 0)
        return; /* every sequence asked for zero new tokens */
    const size_t nD = (size_t)N * D;
    int32_t *pos = xmalloc((size_t)(N ? N : 1) * sizeof *pos);
    for (int b = 0, i = 0; b < B; b++)
        for (int j = 0; j < ntok[b]; j++)
            pos[i++] = caches[b]->len + j;
    float *x = xmalloc(nD * sizeof(float)), *xn = xmalloc(nD * sizeof(float));
    float *q = xmalloc((size_t)N * QD * sizeof(float)), *att = xmalloc((size_t)N * QD * sizeof(float));
    float *k = xmalloc((size_t)N * KD * sizeof(float)), *v = xmalloc((size_t)N * KD * sizeof(float));
    float *g = xmalloc((size_t)N * F * sizeof(float)), *u = xmalloc((size_t)N * F * sizeof(float));
    float *tmp = xmalloc(nD * sizeof(float));
    const struct vocab_shard vs = {.lo = m->sh.vocab_lo, .hi = m->sh.vocab_hi, .V = c->vocab_size};
    const struct model_shard *sh = &m->sh;
    if (sh->has_embed) {
        embedding_forward_shard(x, ids, m->w.embed, N, D, &vs);
        model_tp_sum(m, x, nD);
    } else { /* the previous stage's output */
        comm_recv(sh->pp, x, nD, COMM_F32, sh->pp_rank - 1);
    }
    for (int l = sh->layer_lo; l < sh->layer_hi; l++) {
        const struct layer_params *L = &m->w.layers[l];
        rmsnorm_forward(xn, NULL, x, L->attn_norm, N, D, c->rms_norm_eps);
        linear_forward(q, xn, L->wq, L->bq, N, D, QD);
        linear_forward(k, xn, L->wk, L->bk, N, D, KD);
        linear_forward(v, xn, L->wv, L->bv, N, D, KD);
        if (L->q_norm) { /* Qwen3: each head's q and k RMS-normed before RoPE (in place: row by row) */
            rmsnorm_forward(q, NULL, q, L->q_norm, N * Hq, hd, c->rms_norm_eps);
            rmsnorm_forward(k, NULL, k, L->k_norm, N * Hkv, hd, c->rms_norm_eps);
        }
        rope_forward_freqs(q, pos, N, Hq, hd, m->rope_freqs);
        rope_forward_freqs(k, pos, N, Hkv, hd, m->rope_freqs);
        for (int b = 0, off = 0; b < B; off += ntok[b], b++) {
            struct kv_cache *kc = caches[b];
            memcpy(kc->k[l] + (size_t)kc->len * KD, k + (size_t)off * KD, (size_t)ntok[b] * KD * sizeof(float));
            memcpy(kc->v[l] + (size_t)kc->len * KD, v + (size_t)off * KD, (size_t)ntok[b] * KD * sizeof(float));
            attention_cached(att + (size_t)off * QD, q + (size_t)off * QD, kc->k[l], kc->v[l], ntok[b],
                             kc->len + ntok[b], Hq, Hkv, hd);
        }
        linear_forward(tmp, att, L->wo, NULL, N, QD, D);
        model_tp_sum(m, tmp, nD);
        vec_add_inplace(x, tmp, nD);
        rmsnorm_forward(xn, NULL, x, L->mlp_norm, N, D, c->rms_norm_eps);
        linear_forward(g, xn, L->w_gate, NULL, N, D, F);
        linear_forward(u, xn, L->w_up, NULL, N, D, F);
        swiglu_forward(g, g, u, (size_t)N * F);
        linear_forward(tmp, g, L->w_down, NULL, N, F, D);
        model_tp_sum(m, tmp, nD);
        vec_add_inplace(x, tmp, nD);
    }
    for (int b = 0; b < B; b++)
        caches[b]->len += ntok[b];
    if (!sh->has_head)
        comm_send(sh->pp, x, nD, COMM_F32, sh->pp_rank + 1);
    if (hidden_last && sh->has_head) { /* each sequence's last new token, through the final norm */
        for (int b = 0, off = 0; b < B; off += ntok[b], b++)
            memcpy(tmp + (size_t)b * D, x + (size_t)(off + ntok[b] - 1) * D, (size_t)D * sizeof(float));
        rmsnorm_forward(hidden_last, NULL, tmp, m->w.final_norm, B, D, c->rms_norm_eps);
    }
    if (logits && sh->has_head) {
        if (all_logits) {
            rmsnorm_forward(xn, NULL, x, m->w.final_norm, N, D, c->rms_norm_eps);
            head_logits(m, logits, xn, N);
        } else {
            /* only each sequence's last new token needs logits */
            for (int b = 0, off = 0; b < B; off += ntok[b], b++)
                memcpy(tmp + (size_t)b * D, x + (size_t)(off + ntok[b] - 1) * D, (size_t)D * sizeof(float));
            rmsnorm_forward(xn, NULL, tmp, m->w.final_norm, B, D, c->rms_norm_eps);
            head_logits(m, logits, xn, B);
        }
    }
    if (logits && sh->pp) /* the last stage's logits to every stage: they sample the same tokens */
        comm_broadcast(sh->pp, logits, (size_t)(all_logits ? N : B) * c->vocab_size, COMM_F32, sh->pp_size - 1);
    free(pos), free(x), free(xn), free(q), free(att), free(k), free(v), free(g), free(u), free(tmp);
}

void model_logits(struct model *m, const int32_t *ids, int T, float *logits)
{
    struct kv_cache *kc = kv_cache_create(m, T);
    model_step(m, &kc, 1, &T, ids, logits, true);
    kv_cache_free(kc);
}
