/* The activation arenas: what a training forward keeps for its backward (struct model_acts, from a pool, every
 * buffer taken from one arena in a fixed order, so a batch of a shape seen before allocates nothing; the layer
 * inputs in host memory when offloading), the backward's buffers, and what the model keeps from batch to batch
 * (struct model_work: the pool, the backward's, the generation step's and the all-to-all's arenas). */
#include "model_acts.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model_seq.h"
#include "model_moe.h"
#include "ring_attn.h"

struct model_work *model_work_of(struct model *m)
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
        model_moe_state_free(A->ep[l]);
    free(A->ep);
    free(A);
}

void model_work_free(struct model *m)
{
    struct model_work *w = m->work;
    if (!w)
        return;
    while (w->pool) {
        struct model_acts *A = w->pool;
        w->pool = A->next;
        acts_destroy(A);
    }
    model_step_graphs_free(m); /* before the arena they read */
    model_moe_state_free(w->moe_tp);
    karena_release(&w->bwd);
    karena_release(&w->step);
    karena_release(&w->sp);
    karena_release(&w->sph);
    free(w->hin);
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
    if (which & MODEL_BUF_GEN) {
        model_step_graphs_free(m);
        karena_release(&w->step);
    }
}

struct karena *model_step_arena(struct model *m) { return &model_work_of(m)->step; }

void *model_host_inputs(struct model *m, size_t bytes)
{
    struct model_work *w = model_work_of(m);
    if (bytes > w->hin_cap) {
        free(w->hin);
        w->hin_cap = bytes > 4096 ? bytes : 4096;
        w->hin = xmalloc(w->hin_cap);
    }
    return w->hin;
}

/* One layer's activations from the arena: all of them, or only the input x. */
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
        model_moe_take(m, N, &a->moe, ar);
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
            A->layers[l].moe.ep = A->ep[l];
        A->scratch.moe.ep = A->ep[m->cfg.n_layers];
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
struct model_acts *model_acts_get(struct model *m, int N, int B, bool ckpt, int nk, int t0, int Nf)
{
    struct model_work *w = model_work_of(m);
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
                A->ep[l] = model_moe_state_new();
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

void model_bwd_take(const struct model *m, int N, int Nf, int nk, struct bwd_bufs *d, bool ckpt, struct karena *ar)
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
        model_moe_grads_take(m, N, &d->moe, ar);
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

void model_acts_free(struct model_acts *A)
{
    if (!A)
        return;
    struct model_work *w = model_work_of(A->m);
    karena_reset(&A->arena);
    karena_reset(&A->host_arena);
    A->next = w->pool;
    w->pool = A;
}
