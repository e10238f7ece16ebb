/* Expert-parallel dispatch and combine: see moe_ep.h. Slots leave in the routing's expert order, so the slots for
 * EP rank p (experts [p El, (p + 1) El)) are one block; a rank receives from each peer its slots expert by expert,
 * and runs each of its experts over all the slots it got (from every peer) as one GEMM through the back-end's
 * grouped-expert kernel, with unit weights (the weighting stays where the token lives). */
#include "moe_ep.h"

#include "lora.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/cpu/cpu_kernels.h"
#include "worker/comm/comm.h"

struct moe_ep {
    int P, El, R;         /* EP ranks, experts per rank, slots received */
    size_t *sc, *rc;      /* (P) floats sent to and received from each peer in the dispatch */
    int32_t *recv_cnt;    /* (P, El) slots each peer sent for each of this rank's experts */
    float *xr, *yr, *dyr; /* (R, D) received inputs, the experts' outputs, and the outputs' gradients */
    float *dxr;           /* (R, D) the inputs' gradients, sent back */
    float *wt1, *dwt1;    /* (R) unit weights, and the unused weight gradients of the local run */
    struct kmoe loc;      /* the local run: R slots, k 1, El experts */
    size_t cap;           /* R the buffers hold */
};

struct moe_ep *moe_ep_create(void) { return xcalloc(1, sizeof(struct moe_ep)); }

static void local_free(struct moe_ep *s)
{
    struct kmoe *q = &s->loc;
    free(s->xr), free(s->yr), free(s->dyr), free(s->dxr), free(s->wt1), free(s->dwt1);
    free(q->order), free(q->pos), free(q->xs), free(q->ys), free(q->g), free(q->u), free(q->a);
    free(q->bwd_d), free(q->bwd_f);
}

void moe_ep_free(struct moe_ep *s)
{
    if (!s)
        return;
    local_free(s);
    free(s->loc.offs);
    free(s->sc), free(s->rc), free(s->recv_cnt);
    free(s);
}

/* Buffers for R received slots (kept when large enough). */
static void local_reserve(struct moe_ep *s, int R, int D, int F)
{
    const size_t n = (size_t)(R > 0 ? R : 1);
    if (n <= s->cap)
        return;
    local_free(s);
    const size_t d = (size_t)D, f = (size_t)F;
    struct kmoe *q = &s->loc;
    s->xr = xmalloc(n * d * sizeof(float));
    s->yr = xmalloc(n * d * sizeof(float));
    s->dyr = xmalloc(n * d * sizeof(float));
    s->dxr = xmalloc(n * d * sizeof(float));
    s->wt1 = xmalloc(n * sizeof(float));
    s->dwt1 = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        s->wt1[i] = 1.0f;
    q->order = xmalloc(n * sizeof(int32_t));
    q->pos = xmalloc(n * sizeof(int32_t));
    q->xs = xmalloc(n * d * sizeof(float));
    q->ys = xmalloc(n * d * sizeof(float));
    q->g = xmalloc(n * f * sizeof(float));
    q->u = xmalloc(n * f * sizeof(float));
    q->a = xmalloc(n * f * sizeof(float));
    q->bwd_d = xmalloc(2 * n * d * sizeof(float));
    q->bwd_f = xmalloc(3 * n * f * sizeof(float));
    s->cap = n;
}

void moe_ep_forward(struct moe_ep *s, const struct model *m, const struct layer_params *L, struct kmoe *r,
                    const float *x, float *out)
{
    const struct model_shard *sh = &m->sh;
    const int P = sh->ep_size, El = sh->n_experts, N = r->N, k = r->k, D = r->D, F = r->F;
    const size_t d = (size_t)D;
    if (m->K->device != KDEV_CPU)
        check_failf(__FILE__, __LINE__,
                    "expert parallelism runs on the CPU back-end for now (its dispatch and combine have no device "
                    "path yet; the CUDA back-end's MoE kernels await a device check: scripts/gpu_check.sh)");
    if (s->P != P || s->El != El) {
        free(s->sc), free(s->rc), free(s->recv_cnt), free(s->loc.offs);
        s->P = P, s->El = El;
        s->sc = xmalloc((size_t)P * sizeof(size_t));
        s->rc = xmalloc((size_t)P * sizeof(size_t));
        s->recv_cnt = xmalloc((size_t)P * El * sizeof(int32_t));
        s->loc.offs = xmalloc((size_t)(El + 1) * sizeof(int32_t));
    }
    /* the slots' inputs in expert order: the block for peer p is experts [p El, (p + 1) El) */
    for (int j = 0; j < N * k; j++)
        memcpy(r->xs + j * d, x + (size_t)(r->order[j] / k) * d, d * sizeof(float));
    for (int j = 0; j < N * k; j++)
        r->pos[r->order[j]] = j;
    /* how many slots go to each of the peer's experts: El counts to each peer */
    int32_t *cnt = xmalloc((size_t)P * El * sizeof(int32_t));
    size_t *ce = xmalloc((size_t)P * sizeof(size_t));
    for (int e = 0; e < P * El; e++)
        cnt[e] = r->offs[e + 1] - r->offs[e];
    for (int p = 0; p < P; p++)
        ce[p] = (size_t)El;
    comm_alltoallv(sh->ep, cnt, ce, s->recv_cnt, ce, COMM_I32);
    int R = 0;
    for (int p = 0; p < P; p++) {
        size_t in = 0;
        for (int e = 0; e < El; e++)
            in += (size_t)s->recv_cnt[p * El + e];
        s->sc[p] = (size_t)(r->offs[(p + 1) * El] - r->offs[p * El]) * d;
        s->rc[p] = in * d;
        R += (int)in;
    }
    local_reserve(s, R, D, F);
    s->R = R;
    comm_alltoallv(sh->ep, r->xs, s->sc, s->xr, s->rc, COMM_F32); /* dispatch */
    /* the received slots sorted by this rank's expert (then by peer, then in the sender's order) */
    struct kmoe *q = &s->loc;
    *q = (struct kmoe){.N = R,
                       .E = El,
                       .k = 1,
                       .D = D,
                       .F = F,
                       .wt = s->wt1,
                       .order = q->order,
                       .offs = q->offs,
                       .pos = q->pos,
                       .xs = q->xs,
                       .ys = q->ys,
                       .g = q->g,
                       .u = q->u,
                       .a = q->a,
                       .bwd_d = q->bwd_d,
                       .bwd_f = q->bwd_f};
    q->offs[0] = 0;
    for (int e = 0; e < El; e++) {
        int n = 0;
        for (int p = 0; p < P; p++)
            n += s->recv_cnt[p * El + e];
        q->offs[e + 1] = q->offs[e] + n;
    }
    int32_t *fill = xmalloc((size_t)(El > 0 ? El : 1) * sizeof(int32_t));
    memcpy(fill, q->offs, (size_t)El * sizeof(int32_t));
    int row = 0;
    for (int p = 0; p < P; p++)
        for (int e = 0; e < El; e++)
            for (int i = 0; i < s->recv_cnt[p * El + e]; i++)
                q->order[fill[e]++] = row++;
    free(fill);
    /* LoRA on the experts: this rank's experts' adapters, on the slots it received */
    q->lora = r->lora ? lora_moe(m, (int)(L - m->w.layers), (size_t)R) : NULL;
    k_moe_experts_forward(m->K, s->yr, s->xr, L->w_gate, L->w_up, L->w_down, q); /* unit weights: yr = ys */
    /* combine: the outputs back into this rank's slots, in the order they left */
    comm_alltoallv(sh->ep, s->yr, s->rc, r->ys, s->sc, COMM_F32);
    for (int t = 0; t < N; t++) { /* weighted in slot order, as one process sums them */
        float *yt = out + (size_t)t * d;
        memset(yt, 0, d * sizeof(float));
        for (int sl = t * k; sl < (t + 1) * k; sl++) {
            const float w = r->wt[sl], *ys = r->ys + (size_t)r->pos[sl] * d;
            for (int i = 0; i < D; i++)
                yt[i] += w * ys[i];
        }
    }
    free(cnt), free(ce);
}

void moe_ep_backward(struct moe_ep *s, const struct model *m, const struct layer_params *L,
                     const struct layer_params *G, const struct kmoe *r, const float *dy, float *dx, float *dwt,
                     float *scratch)
{
    const struct model_shard *sh = &m->sh;
    const int N = r->N, k = r->k, D = r->D;
    const size_t d = (size_t)D, nk = (size_t)N * k;
    float *dys = scratch, *dxs = scratch + nk * d;
    cpu_moe_slot_grad(r, dy, dys, dwt); /* y_t = sum_s w_s ys_s: the slots' output gradients and weights' */
    comm_alltoallv(sh->ep, dys, s->sc, s->dyr, s->rc, COMM_F32); /* the outputs' gradients, like the dispatch */
    memset(s->dxr, 0, (size_t)(s->R > 0 ? s->R : 1) * d * sizeof(float));
    s->loc.lora = r->lora ? lora_moe(m, (int)(L - m->w.layers), (size_t)s->R) : NULL;
    k_moe_experts_backward(m->K, s->dxr, G ? G->w_gate : NULL, G ? G->w_up : NULL, G ? G->w_down : NULL, s->dwt1,
                           s->dyr, L->w_gate, L->w_up, L->w_down, &s->loc);
    comm_alltoallv(sh->ep, s->dxr, s->rc, dxs, s->sc, COMM_F32); /* the inputs' gradients, like the combine */
    for (int j = 0; j < N * k; j++) {
        float *o = dx + (size_t)(r->order[j] / k) * d;
        const float *g = dxs + j * d;
        for (int i = 0; i < D; i++)
            o[i] += g[i];
    }
}
