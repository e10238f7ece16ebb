/* One decoder layer's training forward and backward over a packed batch: the attention block (in one process,
 * with Ulysses' swap of tokens for heads around it, or over context parallelism's ring), the dense MLP or the
 * expert block (model_moe.h), the residuals and the norms. The projections go through model_proj_forward and
 * model_proj_backward, which add the projection hook's terms. */
#include "model_layer.h"

#include "kernels/kernels.h"
#include "model_moe.h"
#include "model_seq.h"
#include "ring_attn.h"

/* Attention over a's q, k, v into a->att and a->lse: in one process, over the whole sequences for this rank's
 * heads (Ulysses: every token of them swapped in, and the output back), or around the ring (context parallelism:
 * every head, the keys and values passed around). */
static void layer_attention_forward(const struct model *m, const struct packed_batch *b, int Nf, struct layer_acts *a)
{
    struct kctx *K = m->K;
    const int N = b->N, hd = m->cfg.head_dim, Hq = m->sh.n_heads, Hkv = m->sh.n_kv_heads;
    const int QD = Hq * hd, KD = Hkv * hd;
    if (m->sh.ring) { /* context parallelism: every head, the keys and values passed around the ring */
        ring_attn_forward(m->work->ring, a->att, a->lse, a->q, a->k, a->v);
    } else if (m->sh.sp) { /* every token of this rank's heads, attention over the whole sequences, and back */
        const int hq = sp_hq(m), hk = sp_hk(m);
        model_sp_to_heads(m, a->qf, a->q, N, Nf, QD, hq * hd, false);
        model_sp_to_heads(m, a->kf, a->k, N, Nf, KD, hk * hd, true);
        model_sp_to_heads(m, a->vf, a->v, N, Nf, KD, hk * hd, true);
        k_attention_forward(K, a->attf, a->lse, a->qf, a->kf, a->vf, b->cu_seqlens, b->prefix_of, b->B, hq, hk, hd);
        model_sp_to_tokens(m, a->att, a->attf, N, Nf, QD, hq * hd, false);
    } else {
        k_attention_forward(K, a->att, a->lse, a->q, a->k, a->v, b->cu_seqlens, b->prefix_of, b->B, Hq, Hkv, hd);
    }
}

/* Its backward from d->datt: d->dq, d->dk, d->dv (zeroed by the caller) get q's, k's and v's gradients. */
static void layer_attention_backward(const struct model *m, const struct packed_batch *b, int Nf,
                                     const struct layer_acts *a, const struct bwd_bufs *d)
{
    struct kctx *K = m->K;
    const int N = b->N, hd = m->cfg.head_dim, Hq = m->sh.n_heads, Hkv = m->sh.n_kv_heads;
    const int QD = Hq * hd, KD = Hkv * hd;
    const size_t fs = sizeof(float);
    if (m->sh.ring) { /* context parallelism: the visiting keys' and values' gradients come home */
        ring_attn_backward(m->work->ring, d->dq, d->dk, d->dv, d->datt, a->att, a->lse, a->q, a->k, a->v);
    } else if (m->sh.sp) { /* the output's gradient to every token of this rank's heads, and q's, k's, v's back */
        const int hq = sp_hq(m), hk = sp_hk(m);
        model_sp_to_heads(m, d->dattf, d->datt, N, Nf, QD, hq * hd, false);
        k_zero(K, d->dqf, (size_t)Nf * hq * hd * fs), k_zero(K, d->dkf, (size_t)Nf * hk * hd * fs);
        k_zero(K, d->dvf, (size_t)Nf * hk * hd * fs);
        k_attention_backward(K, d->dqf, d->dkf, d->dvf, d->dattf, a->attf, a->lse, a->qf, a->kf, a->vf, b->cu_seqlens,
                             b->prefix_of, b->B, hq, hk, hd);
        model_sp_to_tokens(m, d->dq, d->dqf, N, Nf, QD, hq * hd, false);
        model_sp_to_tokens(m, d->dk, d->dkf, N, Nf, KD, hk * hd, true);
        model_sp_to_tokens(m, d->dv, d->dvf, N, Nf, KD, hk * hd, true);
    } else {
        k_attention_backward(K, d->dq, d->dk, d->dv, d->datt, a->att, a->lse, a->q, a->k, a->v, b->cu_seqlens,
                             b->prefix_of, b->B, Hq, Hkv, hd);
    }
}

/* The dense MLP: out (N, D) = down(silu(gate(xn2)) * up(xn2)), a TP rank's part. */
static void layer_mlp_forward(const struct model *m, int l, int N, struct layer_acts *a, float *out)
{
    model_proj_forward(m, l, PROJ_GATE, a->g, a->xn2, N);
    model_proj_forward(m, l, PROJ_UP, a->u, a->xn2, N);
    k_swiglu_forward(m->K, a->a, a->g, a->u, (size_t)N * m->sh.inter);
    model_proj_forward(m, l, PROJ_DOWN, out, a->a, N);
}

/* Its backward from dy: d->dxn gets dL/dxn2, summed over TP. */
static void layer_mlp_backward(struct model *m, int l, int N, const struct layer_acts *a, const float *dy,
                               const struct bwd_bufs *d)
{
    struct kctx *K = m->K;
    const size_t nD = (size_t)N * m->cfg.hidden_size, nF = (size_t)N * m->sh.inter, fs = sizeof(float);
    k_zero(K, d->da, nF * fs), k_zero(K, d->dg, nF * fs), k_zero(K, d->du, nF * fs), k_zero(K, d->dxn, nD * fs);
    model_proj_backward(m, l, PROJ_DOWN, d->da, dy, a->a, N);
    k_swiglu_backward(K, d->dg, d->du, d->da, a->g, a->u, nF);
    model_proj_backward(m, l, PROJ_GATE, d->dxn, d->dg, a->xn2, N);
    model_proj_backward(m, l, PROJ_UP, d->dxn, d->du, a->xn2, N);
    model_tp_sum(m, d->dxn, nD);
}

void model_layer_forward(const struct model *m, int l, const struct packed_batch *b, int Nf, struct layer_acts *a,
                         float *out)
{
    const struct model_config *c = &m->cfg;
    const struct layer_params *L = &m->w.layers[l];
    struct kctx *K = m->K;
    const int N = b->N, D = c->hidden_size, hd = c->head_dim, Hq = m->sh.n_heads;
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
    layer_attention_forward(m, b, Nf, a);
    model_proj_forward(m, l, PROJ_O, a->xmid, a->att, N);
    model_tp_sum_rowpar(m, a->xmid, (size_t)N * D);
    k_add(K, a->xmid, a->x, (size_t)N * D);
    k_rmsnorm_forward(K, a->xn2, a->rstd2, a->xmid, L->mlp_norm, N, D, c->rms_norm_eps);
    if (L->router) /* mixture of experts: route, then each expert's tokens through it */
        model_moe_forward(m, l, b, &a->moe, a->xn2, out);
    else
        layer_mlp_forward(m, l, N, a, out);
    model_tp_sum_rowpar(m, out, (size_t)N * D); /* under TP each rank's rows of the MLP (of every expert) gave a part */
    k_add(K, out, a->xmid, (size_t)N * D);
}

void model_layer_backward(struct model *m, int l, const struct packed_batch *b, int Nf, const struct layer_acts *a,
                          const struct bwd_bufs *d)
{
    const struct model_config *c = &m->cfg;
    const struct layer_params *L = &m->w.layers[l];
    /* the norms' weight gradients: a sink that nothing reads when the base is frozen */
    float *const sink = m->frozen ? m->sink : NULL;
    const struct layer_params *G = m->frozen ? NULL : &m->grad->layers[l];
    struct kctx *K = m->K;
    const int N = b->N, D = c->hidden_size, hd = c->head_dim, Hq = m->sh.n_heads;
    const int Hkv = m->sh.n_kv_heads, QD = Hq * hd, KD = Hkv * hd;
    const size_t nD = (size_t)N * D, fs = sizeof(float);
    float *dx = d->dx;
    if (L->router) /* mixture of experts: out = xmid + sum over the chosen experts of wt x expert(xn2) */
        model_moe_backward(m, l, Nf, &a->moe, a->xn2, dx, d->dxn, &d->moe);
    else /* MLP: out = xmid + down(silu(gate(xn2)) * up(xn2)) */
        layer_mlp_backward(m, l, N, a, dx, d);
    /* dx now dL/dxmid */
    k_rmsnorm_backward(K, dx, G ? G->mlp_norm : sink, d->dxn, a->xmid, L->mlp_norm, a->rstd2, N, D);
    /* attention: xmid = x + o(attn(rope(q(xn1)), rope(k(xn1)), v(xn1))) */
    k_zero(K, d->datt, (size_t)N * QD * fs), k_zero(K, d->dq, (size_t)N * QD * fs);
    k_zero(K, d->dk, (size_t)N * KD * fs), k_zero(K, d->dv, (size_t)N * KD * fs);
    if (m->sh.sp &&
        !m->sh.ring) /* this layer's attention output of this rank's tokens again (the layers share its buffer) */
        model_sp_to_tokens(m, a->att, a->attf, N, Nf, QD, sp_hq(m) * hd, false);
    model_proj_backward(m, l, PROJ_O, d->datt, dx, a->att, N);
    layer_attention_backward(m, b, Nf, a, d);
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
