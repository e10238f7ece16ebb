/* Expert-parallel dispatch and combine: see moe_ep.h. Slots leave in the routing's expert order, so the slots for
 * EP rank p (experts [p El, (p + 1) El)) are one block; a rank receives from each peer its slots expert by expert,
 * and runs each of its experts over all the slots it got (from every peer) as one GEMM through the back-end's
 * grouped-expert kernel, with unit weights (the weighting stays where the token lives).
 *
 * The permuted rows live in the model's context memory (K): host memory on the CPU, device memory on a GPU, where
 * the row moves around the all-to-alls are the back-end's (k_moe_gather and the like) and only the counts come to
 * the host. A GPU's rows go over the EP group as they are where its back-end carries device memory (NCCL), and
 * through pinned host memory where it does not (MPI), as ring attention's K/V ring does. */
#include "moe_ep.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "worker/comm/comm.h"

struct moe_ep {
    int P, El, R;      /* EP ranks, experts per rank, slots received */
    struct kctx *K;    /* the context whose memory the buffers below are (the first forward's model's) */
    bool dev;          /* K's memory is a device's: the local run's order, offs and pos are uploaded */
    size_t *sc, *rc;   /* (P) floats sent to and received from each peer in the dispatch */
    int32_t *recv_cnt; /* (P, El) slots each peer sent for each of this rank's experts */
    int32_t *offs_h;   /* (P El + 1) the routing's offsets on the host (device path) */
    int32_t *h_order;  /* (R) and (El + 1), (R): the local run's order, offs and pos made on the host (device) */
    int32_t *h_offs, *h_pos;
    float *xr, *dyr;   /* (R, D) received inputs and the outputs' gradients */
    float *yr;         /* (G, R, D) the experts' outputs: one block, or in batch-invariant mode one a group */
    int G;             /* the groups yr has room for */
    float *dxr;        /* (R, D) the inputs' gradients, sent back */
    float *wt1, *dwt1; /* (R) unit weights, and the unused weight gradients of the local run */
    struct kmoe loc;   /* the local run: R slots, k 1, El experts */
    size_t cap;        /* R the buffers hold */
    float *hs, *hr;    /* host staging of a device path over a group without device memory (MPI) */
    size_t hcap;       /* floats each of hs, hr holds */
    bool pinned;       /* hs, hr from the context's host_alloc (page-locked), else malloc */
    float *ysg;        /* batch-invariant mode: the groups' outputs back home, struct kmoe's ys_groups */
    size_t ysg_cap;    /* floats ysg holds */
};

struct moe_ep *moe_ep_create(void) { return xcalloc(1, sizeof(struct moe_ep)); }

/* Memory of the state's context: plain host memory on the CPU (as before the device path), K's otherwise. */
static void *ep_alloc(struct moe_ep *s, size_t bytes, const char *what)
{
    return s->dev ? k_alloc(s->K, bytes, KMEM_ACTS, what) : xmalloc(bytes);
}

static void ep_free(struct moe_ep *s, void *p, size_t bytes)
{
    if (s->dev && p)
        k_free(s->K, p, bytes, KMEM_ACTS);
    else if (!s->dev)
        free(p);
}

static void local_free(struct moe_ep *s, int D, int F)
{
    struct kmoe *q = &s->loc;
    const size_t n = s->cap, d = (size_t)D, f = (size_t)F, fl = sizeof(float), i4 = sizeof(int32_t);
    if (!n)
        return;
    ep_free(s, s->xr, n * d * fl), ep_free(s, s->yr, (size_t)s->G * n * d * fl), ep_free(s, s->dyr, n * d * fl);
    ep_free(s, s->dxr, n * d * fl), ep_free(s, s->wt1, n * fl), ep_free(s, s->dwt1, n * fl);
    ep_free(s, q->order, n * i4), ep_free(s, q->pos, n * i4), ep_free(s, q->xs, n * d * fl);
    ep_free(s, q->ys, n * d * fl), ep_free(s, q->g, n * f * fl), ep_free(s, q->u, n * f * fl);
    ep_free(s, q->a, n * f * fl), ep_free(s, q->bwd_d, 2 * n * d * fl), ep_free(s, q->bwd_f, 3 * n * f * fl);
    free(s->h_order), free(s->h_pos);
    s->h_order = s->h_pos = NULL;
    s->cap = 0;
}

static void stage_free(struct moe_ep *s)
{
    if (s->pinned) {
        s->K->ops->host_free(s->K, s->hs);
        s->K->ops->host_free(s->K, s->hr);
    } else {
        free(s->hs), free(s->hr);
    }
    s->hs = s->hr = NULL;
    s->hcap = 0;
}

void moe_ep_free(struct moe_ep *s)
{
    if (!s)
        return;
    local_free(s, s->loc.D, s->loc.F);
    stage_free(s);
    ep_free(s, s->ysg, s->ysg_cap * sizeof(float));
    ep_free(s, s->loc.offs, (size_t)(s->El + 1) * sizeof(int32_t));
    free(s->sc), free(s->rc), free(s->recv_cnt), free(s->offs_h), free(s->h_offs);
    free(s);
}

/* Buffers for R received slots, the outputs in G groups (kept when large enough). */
static void local_reserve(struct moe_ep *s, int R, int D, int F, int G)
{
    const size_t n = (size_t)(R > 0 ? R : 1);
    if (n <= s->cap && s->loc.D == D && s->loc.F == F && G <= s->G)
        return;
    G = G > s->G ? G : s->G; /* the mode's forwards and the others alternate: room for the most groups kept */
    local_free(s, s->loc.D, s->loc.F);
    const size_t d = (size_t)D, f = (size_t)F, fl = sizeof(float), i4 = sizeof(int32_t);
    const char *what = "expert parallelism's received slots";
    struct kmoe *q = &s->loc;
    s->xr = ep_alloc(s, n * d * fl, what);
    s->yr = ep_alloc(s, (size_t)G * n * d * fl, what);
    s->G = G;
    s->dyr = ep_alloc(s, n * d * fl, what);
    s->dxr = ep_alloc(s, n * d * fl, what);
    s->wt1 = ep_alloc(s, n * fl, what);
    s->dwt1 = ep_alloc(s, n * fl, what);
    float *one = s->dev ? xmalloc(n * fl) : s->wt1;
    for (size_t i = 0; i < n; i++)
        one[i] = 1.0f;
    if (s->dev) {
        k_to_device(s->K, s->wt1, one, n * fl);
        k_sync(s->K);
        free(one);
        s->h_order = xmalloc(n * i4);
        s->h_pos = xmalloc(n * i4);
    }
    q->order = ep_alloc(s, n * i4, what);
    q->pos = ep_alloc(s, n * i4, what);
    q->xs = ep_alloc(s, n * d * fl, what);
    q->ys = ep_alloc(s, n * d * fl, what);
    q->g = ep_alloc(s, n * f * fl, what);
    q->u = ep_alloc(s, n * f * fl, what);
    q->a = ep_alloc(s, n * f * fl, what);
    q->bwd_d = ep_alloc(s, 2 * n * d * fl, what);
    q->bwd_f = ep_alloc(s, 3 * n * f * fl, what);
    q->D = D, q->F = F;
    s->cap = n;
}

/* The host staging for n floats each way (a device path over a group without device memory). */
static void stage_reserve(struct moe_ep *s, size_t n)
{
    if (n <= s->hcap)
        return;
    stage_free(s);
    const size_t bytes = n * sizeof(float);
    s->hs = s->K->ops->host_alloc(s->K, bytes);
    s->hr = s->hs ? s->K->ops->host_alloc(s->K, bytes) : NULL;
    s->pinned = s->hs && s->hr;
    if (!s->pinned) { /* no page-locked memory: plain host memory, slower copies */
        if (s->hs)
            s->K->ops->host_free(s->K, s->hs);
        s->hs = xmalloc(bytes), s->hr = xmalloc(bytes);
    }
    s->hcap = n;
}

static size_t sum_counts(const size_t *c, int P)
{
    size_t n = 0;
    for (int p = 0; p < P; p++)
        n += c[p];
    return n;
}

/* One all-to-all of rows in the context's memory: as they are on the CPU or over a group that carries device
 * memory; else through the host staging (down, across, up; the upload finished before the staging is reused). */
static void ep_alltoallv(struct moe_ep *s, struct comm *ep, const float *send, const size_t *sc, float *recv,
                         const size_t *rc)
{
    if (!s->dev || comm_caps(ep)->device_memory) {
        comm_alltoallv(ep, send, sc, recv, rc, COMM_F32);
        return;
    }
    const size_t ns = sum_counts(sc, s->P), nr = sum_counts(rc, s->P);
    stage_reserve(s, ns > nr ? ns : nr);
    k_to_host(s->K, s->hs, send, ns * sizeof(float));
    comm_alltoallv(ep, s->hs, sc, s->hr, rc, COMM_F32);
    k_to_device(s->K, recv, s->hr, nr * sizeof(float));
    k_sync(s->K);
}

/* The groups' outputs' home buffer, struct kmoe's ys_groups for n floats. */
static float *groups_reserve(struct moe_ep *s, size_t n)
{
    n = n ? n : 1;
    if (n > s->ysg_cap) {
        ep_free(s, s->ysg, s->ysg_cap * sizeof(float));
        s->ysg = ep_alloc(s, n * sizeof(float), "expert parallelism's batch-invariant groups");
        s->ysg_cap = n;
    }
    return s->ysg;
}

/* The experts' outputs back into this rank's slots, in the order they left, and combined there, weighted in slot
 * order as one process sums them. In batch-invariant mode (G groups) each group's outputs come back on their own
 * (one all-to-all a group: G times the bytes), and the combine op combines each group over a token's slots alone
 * and sums the groups in the fixed tree, the bits of the experts' op without expert parallelism. */
static void combine_home(struct moe_ep *s, const struct model *m, struct kmoe *r, float *out)
{
    const int G = s->loc.bi_groups;
    if (G <= 1) {
        ep_alltoallv(s, m->sh.ep, s->yr, s->rc, r->ys, s->sc);
        k_moe_combine(m->K, out, r->ys, r);
        return;
    }
    const size_t d = (size_t)r->D, nkd = (size_t)r->N * (size_t)r->k * d, rd = (size_t)s->R * d;
    r->ys_groups = groups_reserve(s, (size_t)(G - 1) * (nkd + (size_t)r->N * d));
    for (int j = 0; j < G; j++)
        ep_alltoallv(s, m->sh.ep, s->yr + (size_t)j * rd, s->rc, j ? r->ys_groups + (size_t)(j - 1) * nkd : r->ys,
                     s->sc);
    k_moe_combine(m->K, out, r->ys, r);
}

/* The local run of R slots over this rank's El experts (k 1, unit weights), its buffers reserved (the outputs in G
 * groups: batch-invariant mode's); its order, offs and pos are the caller's to fill. */
static struct kmoe *local_run(struct moe_ep *s, int R, int El, int D, int F, int G)
{
    local_reserve(s, R, D, F, G);
    s->R = R;
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
                       .bwd_f = q->bwd_f,
                       .bi_groups = G > 1 ? G : 0,
                       .bi_apart = G > 1};
    return q;
}

/* s bound to m's context (the first forward's) and shaped for P ranks of El experts each (the routing's P El). */
static void ep_shape(struct moe_ep *s, const struct model *m, int P, int El)
{
    const size_t i4 = sizeof(int32_t);
    if (!s->K) {
        s->K = m->K;
        s->dev = m->K->device != KDEV_CPU;
    } else if (s->K != m->K) {
        check_failf(__FILE__, __LINE__, "expert parallelism: a layer's state moved between contexts");
    }
    if (s->P != P || s->El != El) {
        ep_free(s, s->loc.offs, (size_t)(s->El + 1) * i4);
        free(s->sc), free(s->rc), free(s->recv_cnt), free(s->offs_h), free(s->h_offs);
        s->P = P, s->El = El;
        s->sc = xmalloc((size_t)P * sizeof(size_t));
        s->rc = xmalloc((size_t)P * sizeof(size_t));
        s->recv_cnt = xmalloc((size_t)P * El * i4);
        s->offs_h = xmalloc(((size_t)P * El + 1) * i4);
        s->h_offs = xmalloc((size_t)(El + 1) * i4);
        s->loc.offs = ep_alloc(s, (size_t)(El + 1) * i4, "expert parallelism's offsets");
    }
}

void moe_ep_forward(struct moe_ep *s, const struct model *m, const struct layer_params *L, const float *const W[3],
                    struct kmoe *r, const float *x, float *out)
{
    const struct model_shard *sh = &m->sh;
    const int P = sh->ep_size, El = sh->n_experts, D = r->D, F = r->F;
    const size_t d = (size_t)D, i4 = sizeof(int32_t);
    if (!k_has_moe_ep(m->K))
        check_failf(__FILE__, __LINE__, "expert parallelism: the %s back-end has no row moves for its dispatch",
                    m->K->ops->name);
    if (m->K->device != KDEV_CPU && r->lora) /* lora.c refuses it first: LoRA on the experts is the CPU's */
        check_failf(__FILE__, __LINE__, "expert parallelism: LoRA on the experts runs on the CPU back-end only");
    ep_shape(s, m, P, El);
    /* the routing's offsets where the host reads them */
    const int32_t *offs = r->offs;
    if (s->dev) {
        k_to_host(m->K, s->offs_h, r->offs, ((size_t)P * El + 1) * i4);
        offs = s->offs_h;
    }
    /* the slots' inputs in expert order: the block for peer p is experts [p El, (p + 1) El) */
    k_moe_gather(m->K, r->xs, x, r);
    /* how many slots go to each of the peer's experts: El counts to each peer (host memory: over MPI) */
    int32_t *cnt = xmalloc((size_t)P * El * i4);
    size_t *ce = xmalloc((size_t)P * sizeof(size_t));
    for (int e = 0; e < P * El; e++)
        cnt[e] = offs[e + 1] - offs[e];
    for (int p = 0; p < P; p++)
        ce[p] = (size_t)El;
    comm_alltoallv(sh->ep, cnt, ce, s->recv_cnt, ce, COMM_I32);
    int R = 0;
    for (int p = 0; p < P; p++) {
        size_t in = 0;
        for (int e = 0; e < El; e++)
            in += (size_t)s->recv_cnt[p * El + e];
        s->sc[p] = (size_t)(offs[(p + 1) * El] - offs[p * El]) * d;
        s->rc[p] = in * d;
        R += (int)in;
    }
    const int G = r->bi_groups > 1 ? r->bi_groups : 1; /* batch-invariant mode's groups: each sent back apart */
    struct kmoe *q = local_run(s, R, El, D, F, G);
    ep_alltoallv(s, sh->ep, r->xs, s->sc, s->xr, s->rc); /* dispatch */
    /* the received slots sorted by this rank's expert (then by peer, then in the sender's order) */
    int32_t *lo = s->dev ? s->h_offs : q->offs, *ord = s->dev ? s->h_order : q->order;
    lo[0] = 0;
    for (int e = 0; e < El; e++) {
        int n = 0;
        for (int p = 0; p < P; p++)
            n += s->recv_cnt[p * El + e];
        lo[e + 1] = lo[e] + n;
    }
    int32_t *fill = xmalloc((size_t)(El > 0 ? El : 1) * i4);
    memcpy(fill, lo, (size_t)El * i4);
    int row = 0;
    for (int p = 0; p < P; p++)
        for (int e = 0; e < El; e++)
            for (int i = 0; i < s->recv_cnt[p * El + e]; i++)
                ord[fill[e]++] = row++;
    free(fill);
    if (s->dev) { /* the CPU's experts op makes pos itself; the device's reads it, and order and offs, from K */
        for (int j = 0; j < R; j++)
            s->h_pos[ord[j]] = j;
        k_to_device(m->K, q->offs, lo, (size_t)(El + 1) * i4);
        k_to_device(m->K, q->order, ord, (size_t)R * i4);
        k_to_device(m->K, q->pos, s->h_pos, (size_t)R * i4);
    }
    /* the projection hook's terms on the experts (LoRA's): this rank's experts', on the slots it received */
    q->lora = r->lora ? model_expert_terms(m, (int)(L - m->w.layers), (size_t)R) : NULL;
    k_moe_experts_forward(m->K, s->yr, s->xr, W[0], W[1], W[2], q); /* unit weights: yr = ys */
    combine_home(s, m, r, out);
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
    /* y_t = sum_s w_s ys_s: the slots' output gradients and weights' */
    k_moe_slot_grad(m->K, dys, dwt, dy, r);
    ep_alltoallv(s, sh->ep, dys, s->sc, s->dyr, s->rc); /* the outputs' gradients, like the dispatch */
    k_zero(m->K, s->dxr, (size_t)(s->R > 0 ? s->R : 1) * d * sizeof(float));
    s->loc.lora = r->lora ? model_expert_terms(m, (int)(L - m->w.layers), (size_t)s->R) : NULL;
    k_moe_experts_backward(m->K, s->dxr, G ? G->w_gate : NULL, G ? G->w_up : NULL, G ? G->w_down : NULL, s->dwt1,
                           s->dyr, L->w_gate, L->w_up, L->w_down, &s->loc);
    ep_alltoallv(s, sh->ep, s->dxr, s->rc, dxs, s->sc); /* the inputs' gradients, like the combine */
    k_moe_scatter(m->K, dx, dxs, r);
}

void moe_tp_forward(struct moe_ep *s, const struct model *m, const float *const W[3], struct kmoe *r, const float *x,
                    float *out)
{
    const struct model_shard *sh = &m->sh;
    const int T = sh->tp_size, El = sh->n_experts, lo = sh->expert_lo, D = r->D, F = r->F;
    const size_t d = (size_t)D, i4 = sizeof(int32_t);
    if (!k_has_moe_ep(m->K))
        check_failf(__FILE__, __LINE__, "experts over TP: the %s back-end has no row moves", m->K->ops->name);
    if (r->lora || r->bi_groups > 1) /* the configuration refuses both with it */
        check_failf(__FILE__, __LINE__, "experts over TP: no adapter terms on the experts, no batch-invariant groups");
    ep_shape(s, m, T, El); /* the routing's offsets: T El + 1 of them */
    const int32_t *offs = r->offs;
    if (s->dev) {
        k_to_host(m->K, s->offs_h, r->offs, ((size_t)T * El + 1) * i4);
        offs = s->offs_h;
    }
    k_moe_gather(m->K, r->xs, x, r); /* every slot's input, in expert order: this rank's experts' are one block */
    const int a = offs[lo], R = offs[lo + El] - a;
    struct kmoe *q = local_run(s, R, El, D, F, 1);
    int32_t *h = s->dev ? s->h_offs : q->offs, *ord = s->dev ? s->h_order : q->order;
    for (int e = 0; e <= El; e++)
        h[e] = offs[lo + e] - a;
    for (int j = 0; j < R; j++)
        ord[j] = j;
    if (s->dev) {
        k_to_device(m->K, q->offs, h, (size_t)(El + 1) * i4);
        k_to_device(m->K, q->order, ord, (size_t)R * i4);
        k_to_device(m->K, q->pos, ord, (size_t)R * i4); /* identity: the slots are in their experts' order */
    }
    k_moe_experts_forward(m->K, s->yr, r->xs + (size_t)a * d, W[0], W[1], W[2], q); /* unit weights: yr = ys */
    /* the other ranks' experts' slots give 0 here: the TP group's sum adds their outputs */
    k_zero(m->K, r->ys, (size_t)r->N * r->k * d * sizeof(float));
    if (R > 0)
        k_copy(m->K, r->ys + (size_t)a * d, s->yr, (size_t)R * d * sizeof(float));
    k_moe_combine(m->K, out, r->ys, r);
}
