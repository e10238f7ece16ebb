/* The training forward and backward of a packed batch on one pipeline stage: the embedding (or the previous
 * stage's output), the stage's layers (recomputed in the backward under checkpointing, their inputs offloaded to
 * host memory on request), the final norm and the LM head on the rows a caller reads, and the per-row log-probs
 * and entropies shared over a sequence- or context-parallel group. */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model_acts.h"
#include "model_layer.h"
#include "model_moe.h"
#include "model_seq.h"
#include "ring_attn.h"
#include "worker/comm/comm.h"
#include "worker/flight/flight.h"

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

static void tp_reduce(void *ud, double *buf, int n, bool max)
{
    struct comm *tp = ud;
    if (max)
        comm_allreduce_max(tp, buf, (size_t)n, COMM_F64);
    else
        comm_allreduce_sum(tp, buf, (size_t)n, COMM_F64);
}

static void tp_gather(void *ud, const float *mine, float *all, size_t n) { comm_allgather(ud, mine, all, n, COMM_F32); }

/* This rank's vocabulary rows, with the TP group's reductions (and batch-invariant mode's gather). */
static struct vocab_shard vocab_of(const struct model *m)
{
    return (struct vocab_shard){.lo = m->sh.vocab_lo,
                                .hi = m->sh.vocab_hi,
                                .V = m->cfg.vocab_size,
                                .reduce = m->sh.tp ? tp_reduce : NULL,
                                .ud = m->sh.tp,
                                .gather = m->sh.tp ? tp_gather : NULL,
                                .shards = m->sh.tp ? m->sh.tp_size : 1};
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

struct model_acts *model_forward_stage(struct model *m, const struct packed_batch *b, float temperature,
                                       bool checkpointing, const float *x_in, float *y_out, float *logp, float *entropy)
{
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    struct kctx *K = m->K;
    /* this rank's rows [t0, t0 + N) of the batch's Nf: all of them without sequence parallelism */
    /* (context parallelism: this rank's n rows of the ring instead, cpl their ids, targets and positions) */
    int32_t *cpl = NULL, *rowof = NULL;
    struct ring_attn *ra = sh->ring ? model_cp_plan(m, b, &cpl, &rowof) : NULL;
    const int Nf = b->N, t0 = sh->sp && !ra ? sp_lo(Nf, sh->sp_size, sh->sp_rank) : 0;
    const int N = ra ? ra->n : sh->sp ? sp_lo(Nf, sh->sp_size, sh->sp_rank + 1) - t0 : Nf;
    const int D = c->hidden_size, lo = sh->layer_lo, hi = sh->layer_hi;
    const size_t nD = (size_t)N * D;
    if (!sh->has_embed && !x_in)
        check_failf(__FILE__, __LINE__, "model_forward_stage: stage %d needs the previous stage's output", sh->pp_rank);
    if (!sh->has_head && !y_out)
        check_failf(__FILE__, __LINE__, "model_forward_stage: stage %d needs somewhere to put its output", sh->pp_rank);
    const int nk = sh->has_head && !ra ? kept_rows(b, t0, t0 + N) : -1;
    struct model_acts *A = model_acts_get(m, N, b->B, checkpointing, nk, t0, Nf);
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
                   * no metric: model_moe.c's routing counts) */
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
        flight_set_layer(l, false); /* the flight recorder's records of the layer's collectives say where */
        if (A->offload) {           /* keep the input in host memory; compute from and into the device's pair */
            float *in = A->xdev[(l - lo) & 1], *out = l + 1 < hi ? A->xdev[(l - lo + 1) & 1] : A->xf;
            k_to_host(K, a->x, in, nD * sizeof(float));
            A->scratch.x = in;
            model_layer_forward(m, l, &A->b, Nf, &A->scratch, out);
            if (A->scratch.moe.rlog && count) /* an empty micro-batch (expert parallelism's padding) routed nothing */
                model_moe_count(m, l, &A->scratch.moe.r);
            continue;
        }
        float *out = l + 1 < hi ? A->layers[l + 1].x : A->xf;
        if (checkpointing) {
            A->scratch.x = a->x;
            model_layer_forward(m, l, &A->b, Nf, &A->scratch, out);
        } else {
            model_layer_forward(m, l, &A->b, Nf, a, out);
        }
        const struct layer_acts *ran = checkpointing ? &A->scratch : a;
        if (ran->moe.rlog && count)
            model_moe_count(m, l, &ran->moe.r);
    }
    flight_set_layer(-1, false);
    if (sh->has_head) {
        k_rmsnorm_forward(K, A->hn, A->rstdf, A->xf, m->w.final_norm, N, D, c->rms_norm_eps);
        if (ra) { /* context parallelism: every row here, then every rank's rows to every rank */
            k_lmhead_forward(K, A->logp, entropy ? A->entropy : NULL, A->hn, m->w.lm_head, A->targets, N, D, &vs,
                             temperature, LMHEAD_CHUNK);
            float *h = acts_host_buf(A, (size_t)N);
            k_to_host(K, h, A->logp, (size_t)N * sizeof(float));
            model_cp_share_rows(m, rowof, N, b, logp, h);
            if (entropy) {
                k_to_host(K, h, A->entropy, (size_t)N * sizeof(float));
                model_cp_share_rows(m, rowof, N, b, entropy, h);
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
            model_sp_share_rows(sh->sp, logp, Nf, t0, N);
            if (entropy)
                model_sp_share_rows(sh->sp, entropy, Nf, t0, N);
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
    model_backward_grads(m); /* the base's, or with the base frozen the hook's alone */
    struct model_params *G = m->frozen ? NULL : m->grad;
    struct karena *ar = &model_work_of(m)->bwd;
    struct karena plan;
    struct bwd_bufs d;
    m->work->ring = A->ra; /* context parallelism: the batch's ring */
    m->work->cprow = A->cprow;
    karena_init_counter(&plan);
    model_bwd_take(m, N, A->Nf, sh->has_head ? A->nk : -1, &d, A->ckpt, &plan);
    karena_reserve(ar, plan.used, 0);
    model_bwd_take(m, N, A->Nf, sh->has_head ? A->nk : -1, &d, A->ckpt, ar);
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
            model_cp_take_rows(A->cprow, N, h, dlogp);
            k_to_device(K, d.dlogp, h, (size_t)N * sizeof(float));
            if (dentropy) {
                model_cp_take_rows(A->cprow, N, h, dentropy);
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
        k_rmsnorm_backward(K, d.dx, G ? G->final_norm : m->sink, d.dh, A->xf, m->w.final_norm, A->rstdf, N, D);
    } else {
        k_to_device(K, d.dx, dy, nD * sizeof(float));
    }
    for (int l = sh->layer_hi - 1; l >= sh->layer_lo; l--) {
        struct layer_acts *a = &A->layers[l];
        flight_set_layer(l, true);
        if (A->ckpt) {
            /* recompute this layer's activations from its saved input (back from host memory when offloaded) */
            if (A->offload)
                k_to_device(K, A->xdev[0], a->x, nD * sizeof(float));
            A->scratch.x = A->offload ? A->xdev[0] : a->x;
            model_layer_forward(m, l, &A->b, A->Nf, &A->scratch, d.scratch_out);
            model_layer_backward(m, l, &A->b, A->Nf, &A->scratch, &d);
        } else {
            model_layer_backward(m, l, &A->b, A->Nf, a, &d);
        }
        if (m->layer_grads_hook)
            m->layer_grads_hook(m->layer_grads_ud, l);
    }
    flight_set_layer(-1, false);
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
