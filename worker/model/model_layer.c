/* One decoder layer's training forward and backward over a packed batch: the attention block (in one process,
 * Ulysses' swap around it, or context parallelism's ring), the dense MLP or the experts, the residuals and norms.
 * */
#include "model_layer.h"

#include <stdlib.h>

#include "kernels/kernels.h"
#include "lora.h"
#include "model_moe.h"
#include "model_seq.h"
#include "moe_ep.h"
#include "ring_attn.h"

/* One decoder layer: a->x in, returns the output in out (N, D). */
void model_layer_forward(const struct model *m, int l, const struct packed_batch *b, int Nf, struct layer_acts *a,
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
        model_sp_to_heads(m, a->qf, a->q, N, Nf, QD, hq * hd, false);
        model_sp_to_heads(m, a->kf, a->k, N, Nf, KD, hk * hd, true);
        model_sp_to_heads(m, a->vf, a->v, N, Nf, KD, hk * hd, true);
        k_attention_forward(K, a->attf, a->lse, a->qf, a->kf, a->vf, b->cu_seqlens, b->prefix_of, b->B, hq, hk, hd);
        model_sp_to_tokens(m, a->att, a->attf, N, Nf, QD, hq * hd, false);
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
        int32_t *ref = b->routes ? model_moe_layer_routes(m, l, b) : NULL;
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

/* Backward of one layer: d->dx (N, D) holds dL/d(output) on entry and dL/d(input) on exit. */
void model_layer_backward(struct model *m, int l, const struct packed_batch *b, int Nf, const struct layer_acts *a,
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
            model_moe_group_routing(m, &r, g);
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
        model_sp_to_tokens(m, a->att, a->attf, N, Nf, QD, sp_hq(m) * hd, false);
    model_proj_backward(m, l, PROJ_O, d->datt, dx, a->att, N);
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
