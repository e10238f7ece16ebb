/* LoRA adapters under tensor, pipeline and expert parallelism: a rank's parts of the whole adapter gathered whole
 * over its model copy and sliced back out of it, the gradients of the matrices every TP rank holds whole summed over
 * TP, and norms that count each float once. */
#include "lora_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model_internal.h"
#include "worker/comm/comm.h"

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
    const struct model_shard one = lora_whole_shard(&m->cfg);
    lora_layout_over(&m->cfg, &m->sh, &a->cfg, local, ll);
    lora_layout_over(&m->cfg, &one, &a->cfg, whole, wl);
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

/* Tensor and pipeline parallelism: every rank's part (its layout, at all + r per for mp rank r) placed into the
 * whole adapter, each part by the rank that owns it. */
static void mp_place(const struct model *m, const float *all, size_t per, float *whole)
{
    const struct lora *a = m->lora;
    const struct model_shard one = lora_whole_shard(&m->cfg);
    int nw;
    struct param_ref *w = lora_refs_alloc(&m->cfg, &one, &a->cfg, whole, &nw);
    for (int r = 0; r < m->sh.tp_size * m->sh.pp_size; r++) { /* mp rank r: TP rank r % TP of stage r / TP */
        const struct model_shard sh = model_shard_of_mp(m, r);
        int n, hint = 0;
        struct param_ref *l = lora_refs_alloc(&m->cfg, &sh, &a->cfg, all + (size_t)r * per, &n);
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
        const size_t k = lora_layout_over(&m->cfg, &sh, &a->cfg, NULL, NULL);
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
    const struct model_shard one = lora_whole_shard(&m->cfg);
    int nw, n, hint = 0;
    struct param_ref *w = lora_refs_alloc(&m->cfg, &one, &a->cfg, whole, &nw);
    struct param_ref *l = lora_refs_alloc(&m->cfg, &m->sh, &a->cfg, local, &n);
    for (int i = 0; i < n; i++)
        model_part_copy(kctx_cpu(), &l[i], l[i].data, model_whole_ref(w, nw, &l[i], &hint)->data, false);
    free(l);
    free(w);
}

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
    struct param_ref *r = lora_refs_alloc(&m->cfg, &m->sh, &a->cfg, a->mem, &n);
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
