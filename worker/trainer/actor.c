#include "actor.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "worker/model/lora.h"
#include "grad_reduce.h"
#include "zero1.h"

static void free_groups(int **groups, int *counts, int k)
{
    for (int b = 0; b < k; b++)
        free(groups[b]);
    free(groups);
    free(counts);
}

/* Pipeline point-to-point, timed (the bubble: a stage waiting for its neighbours). */
static void pp_recv(const struct model *m, float *buf, size_t n, int peer, double *wait)
{
    const double t0 = clock_now_s();
    comm_recv(m->sh.pp, buf, n, COMM_F32, peer);
    *wait += clock_now_s() - t0;
}

static void pp_send(const struct model *m, const float *buf, size_t n, int peer, double *wait)
{
    const double t0 = clock_now_s();
    comm_send(m->sh.pp, buf, n, COMM_F32, peer);
    *wait += clock_now_s() - t0;
}

static void pp_sendrecv(const struct model *m, const float *out, size_t n_out, float *in, size_t n_in, int peer,
                        double *wait)
{
    const double t0 = clock_now_s();
    comm_sendrecv(m->sh.pp, out, n_out, peer, in, n_in, peer, COMM_F32);
    *wait += clock_now_s() - t0;
}

/* q's response log-probs (logp: from its first response token on) kept as its old (which 0) or reference (which 1)
 * log-probs, allocated on first use. */
static void keep_logp(struct rollout_seq *q, const float *logp, int which)
{
    float **dst = which == ACTOR_LOGP_REF ? &q->ref_logp : which == ACTOR_LOGP_OLD ? &q->old_logp : &q->sum_pi_sq;
    if (!*dst)
        *dst = xmalloc((size_t)(q->resp_len ? q->resp_len : 1) * sizeof(float));
    memcpy(*dst, logp, (size_t)q->resp_len * sizeof(float));
}

/* The loss statistics summed over c, in place. */
static void loss_stats_sum(struct comm *c, struct policy_loss_stats *s)
{
    double v[8] = {s->pg_loss,           s->kl_loss, s->entropy, s->pg_clipfrac,
                   s->pg_clipfrac_lower, s->ppo_kl,  s->loss,    (double)s->tokens};
    comm_allreduce_sum(c, v, 8, COMM_F64);
    *s = (struct policy_loss_stats){v[0], v[1], v[2], v[3], v[4], v[5], v[6], (long long)v[7]};
}

/* Expert parallelism: every rank of the EP group runs as many micro-batches as the one with the most (each layer's
 * all-to-alls need them all), the others padded with empty ones. Returns the count, groups and counts grown. */
static int ep_pad_micro_batches(const struct model *m, int ***groups, int **counts, int k)
{
    if (!m->sh.ep)
        return k;
    int most = k;
    comm_allreduce_max(m->sh.ep, &most, 1, COMM_I32);
    if (most == k)
        return k;
    log_debug("trainer", "EP rank %d: %d micro-batch(es), padded to the EP group's %d with empty ones", m->sh.ep_rank,
              k, most);
    *groups = xrealloc(*groups, (size_t)most * sizeof **groups);
    *counts = xrealloc(*counts, (size_t)most * sizeof **counts);
    for (int b = k; b < most; b++)
        (*groups)[b] = NULL, (*counts)[b] = 0;
    return most;
}

int actor_compute_logp(struct model *m, struct rollout_seq *seqs, const int *idx, int n, const struct batching *bt,
                       float temperature, int which)
{
    const struct model_shard *sh = &m->sh;
    int **groups, *counts;
    int k = split_micro_batches(seqs, idx, n, bt->micro_seqs, bt->micro_tokens, bt->share_prompts, &groups, &counts);
    k = ep_pad_micro_batches(m, &groups, &counts, k);
    struct micro_batch *mbs = xcalloc((size_t)(k ? k : 1), sizeof *mbs);
    float **logps = xcalloc((size_t)(k ? k : 1), sizeof *logps);
    const bool spp = which == ACTOR_LOGP_OLD_SUM_PI_SQ; /* the head's entropy output gives sum_pi_sq */
    float **sq = xcalloc((size_t)(k ? k : 1), sizeof *sq);
    const bool head_was = m->head_sum_pi_sq;
    m->head_sum_pi_sq = spp;
    double wait = 0;
    for (int b = 0; b < k; b++) {
        /* pipelined: each stage passes a micro-batch on and starts the next; no backward follows */
        struct micro_batch *mb = &mbs[b];
        micro_batch_build(mb, seqs, groups[b], counts[b], bt->share_prompts);
        const size_t N = (size_t)(mb->pb.N ? mb->pb.N : 1);
        /* between stages: this rank's rows (its SP slice or CP chunks), to the same CP rank of the next stage */
        const size_t nD = (size_t)model_stage_rows(m, &mb->pb) * (size_t)m->cfg.hidden_size;
        logps[b] = xcalloc(N, sizeof(float));
        sq[b] = spp ? xcalloc(N, sizeof(float)) : NULL;
        float *x = sh->has_embed ? NULL : xmalloc((nD ? nD : 1) * sizeof(float));
        float *y = sh->has_head ? NULL : xmalloc((nD ? nD : 1) * sizeof(float));
        if (x)
            pp_recv(m, x, nD, sh->pp_rank - 1, &wait);
        /* keep only layer inputs (checkpointing) to bound memory, on the device: no backward needs them offloaded */
        const bool offload = model_set_activation_offload(m, false);
        model_acts_free(model_forward_stage(m, &mb->pb, temperature, true, x, y, logps[b], sq[b]));
        model_set_activation_offload(m, offload);
        if (y)
            pp_send(m, y, nD, sh->pp_rank + 1, &wait);
        free(x), free(y);
    }
    for (int b = 0; b < k; b++) {
        struct micro_batch *mb = &mbs[b];
        if (sh->pp) /* the last stage's log-probs to every stage */
            comm_broadcast(sh->pp, logps[b], (size_t)mb->pb.N, COMM_F32, sh->pp_size - 1);
        if (sh->pp && sq[b])
            comm_broadcast(sh->pp, sq[b], (size_t)mb->pb.N, COMM_F32, sh->pp_size - 1);
        for (int i = 0; i < mb->n_seq; i++) {
            keep_logp(&seqs[mb->seq[i]], logps[b] + mb->resp_at[i], spp ? ACTOR_LOGP_OLD : which);
            if (sq[b])
                keep_logp(&seqs[mb->seq[i]], sq[b] + mb->resp_at[i], ACTOR_LOGP_OLD_SUM_PI_SQ);
        }
        free(logps[b]), free(sq[b]);
        micro_batch_free(mb);
    }
    free(logps), free(sq);
    free(mbs);
    m->head_sum_pi_sq = head_was;
    free_groups(groups, counts, k);
    return k;
}

/* One micro-batch's state through the pipeline schedule. */
struct mb_state {
    struct micro_batch mb;
    int rows; /* this rank's rows of it (model_stage_rows): what passes between stages, times D */
    struct model_acts *acts;
    float *logp, *ent, *dlogp, *dent; /* (N); the loss's inputs and gradients on the last stage */
    struct grad_reducer *overlap;     /* the mini-batch's last micro-batch: its backward starts the DP buckets */
};

/* What every micro-batch's loss needs: the mini-batch's sequences and their token weights. */
struct loss_ctx {
    struct rollout_seq *seqs;
    const int *idx;
    const double *w;
    const double *w_pg; /* the policy-gradient term's weights where the loss mode aggregates it its own way */
    const int *woff;
    const struct update_params *p;
    struct policy_loss_stats *ls;
};

/* A micro-batch's seed for clip_cov's draw: the step's, the update's pass, its first sequence's place in the step. */
static uint64_t mb_seed(const struct update_params *p, const struct rollout_seq *first)
{
    uint64_t z = p->seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(p->epoch + 1)) ^
                 (0xbf58476d1ce4e5b9ULL * (uint64_t)(first ? first->gidx + 1 : 0));
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 29);
}

/* Add m's values into the accumulator (by name: the names are the configuration's). */
static void rc_accumulate(struct rc_accum *acc, const struct rc_metrics *m)
{
    for (int k = 0; k < m->n; k++) {
        int j = 0;
        while (j < acc->m.n && strcmp(acc->m.name[j], m->name[k]) != 0)
            j++;
        if (j == acc->m.n) {
            if (acc->m.n == RC_METRICS_MAX)
                continue;
            memcpy(acc->m.name[acc->m.n], m->name[k], sizeof acc->m.name[0]);
            acc->m.v[acc->m.n++] = 0;
        }
        acc->m.v[j] += m->v[k];
    }
    acc->count += 1;
}

/* The last stage: the policy loss of micro-batch s's sequences, its gradient into dlogp and dent. */
static void mb_loss(const struct loss_ctx *L, struct mb_state *s)
{
    const struct update_params *p = L->p;
    const int n = s->mb.n_seq;
    struct pl_seq *ps = xcalloc((size_t)(n ? n : 1), sizeof *ps);
    for (int i = 0; i < n; i++) {
        struct rollout_seq *q = &L->seqs[s->mb.seq[i]];
        int j = 0; /* position of this sequence in the mini-batch (its token weights) */
        while (L->idx[j] != s->mb.seq[i])
            j++;
        const int at = s->mb.resp_at[i];
        if (p->old_from_current)
            keep_logp(q, s->logp + at, 0);
        ps[i] = (struct pl_seq){.len = q->resp_len,
                                .logp = s->logp + at,
                                .old_logp = q->old_logp,
                                .ref_logp = q->ref_logp ? q->ref_logp : q->old_logp,
                                .entropy = s->ent + at,
                                .rollout_logp = q->gen_logp ? q->gen_logp : q->old_logp,
                                .adv = q->adv,
                                .w = L->w + L->woff[j],
                                .w_pg = L->w_pg ? L->w_pg + L->woff[j] : NULL,
                                .mask = rollout_seq_loss_mask(q),
                                .is_w = q->is_w,
                                .dlogp = s->dlogp + at,
                                .dentropy = s->dent + at};
    }
    struct rc_metrics *m = p->rc_acc && n ? xcalloc(1, sizeof *m) : NULL;
    policy_loss_seqs(&p->loss, ps, n, mb_seed(p, n ? &L->seqs[s->mb.seq[0]] : NULL), L->ls, m);
    if (m)
        rc_accumulate(p->rc_acc, m);
    free(m);
    free(ps);
}

static void mb_forward(struct model *m, const struct loss_ctx *L, struct mb_state *s, const float *x, float *y)
{
    s->acts = model_forward_stage(m, &s->mb.pb, L->p->temperature, L->p->checkpointing, x, y, s->logp, s->ent);
    if (m->sh.has_head)
        mb_loss(L, s);
}

static void mb_backward(struct model *m, struct mb_state *s, const float *dy, float *dx)
{
    if (s->overlap)
        grad_reducer_arm(s->overlap);
    model_backward_stage(m, s->acts, s->dlogp, s->dent, dy, dx);
    s->acts = NULL;
}

/* 1F1B over the stages (Megatron's non-interleaved schedule): stage s runs min(PP - s - 1, M) forwards, then
 * alternates one forward and one backward, then the remaining backwards. In the steady state a stage's send
 * and its receive from the same neighbour go together (comm_sendrecv), so neighbouring stages never wait on
 * each other's sends. With one stage it is forward, backward, micro-batch by micro-batch. */
static void run_1f1b(struct model *m, const struct loss_ctx *L, struct mb_state *mbs, int M, double *wait)
{
    const struct model_shard *sh = &m->sh;
    const int P = sh->pp_size, st = sh->pp_rank, D = m->cfg.hidden_size;
    const bool first = sh->has_embed, last = sh->has_head;
    int maxN = 1;
    for (int i = 0; i < M; i++)
        maxN = mbs[i].rows > maxN ? mbs[i].rows : maxN;
    const size_t cap = (size_t)maxN * D;
    float *x = xmalloc(cap * sizeof(float)), *y = xmalloc(cap * sizeof(float));
    float *g = xmalloc(cap * sizeof(float)), *dx = xmalloc(cap * sizeof(float));
#define ND(i) ((size_t)mbs[i].rows * D)
    int W = P - st - 1;
    W = W < M ? W : M;
    const int R = M - W;
    for (int i = 0; i < W; i++) { /* warm-up: forwards only */
        if (!first)
            pp_recv(m, x, ND(i), st - 1, wait);
        mb_forward(m, L, &mbs[i], x, y);
        if (!last)
            pp_send(m, y, ND(i), st + 1, wait);
    }
    if (R > 0 && !first)
        pp_recv(m, x, ND(W), st - 1, wait);
    for (int j = 0; j < R; j++) { /* steady state: forward W + j, backward j */
        const int i = W + j;
        mb_forward(m, L, &mbs[i], x, y);
        if (!last)
            pp_sendrecv(m, y, ND(i), g, ND(j), st + 1, wait);
        mb_backward(m, &mbs[j], g, dx);
        if (!first) {
            if (j == R - 1)
                pp_send(m, dx, ND(j), st - 1, wait);
            else /* this input gradient back, the next micro-batch's input in */
                pp_sendrecv(m, dx, ND(j), x, ND(i + 1), st - 1, wait);
        }
    }
    for (int i = R; i < M; i++) { /* cool-down: the remaining backwards */
        if (!last)
            pp_recv(m, g, ND(i), st + 1, wait);
        mb_backward(m, &mbs[i], g, dx);
        if (!first)
            pp_send(m, dx, ND(i), st - 1, wait);
    }
#undef ND
    free(x), free(y), free(g), free(dx);
}

void actor_accumulate_grads(struct model *m, struct rollout_seq *seqs, const int *idx, int n,
                            const struct update_params *p, struct policy_loss_stats *ls, long long *tokens_forward,
                            double *pp_wait)
{
    /* weights of every response token in this mini-batch's loss: 0 on the tokens that are not the model's (their
     * masks, packed, where a sequence has one), which no denominator counts */
    int *len = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int *woff = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int total = 0, own = 0;
    bool masked = false;
    for (int i = 0; i < n; i++) {
        len[i] = seqs[idx[i]].resp_len;
        woff[i] = total;
        total += len[i];
        own += rollout_seq_loss_tokens(&seqs[idx[i]]);
        masked |= rollout_seq_loss_mask(&seqs[idx[i]]) != NULL;
    }
    uint8_t *mask = masked ? xmalloc((size_t)(total ? total : 1)) : NULL;
    for (int i = 0; masked && i < n; i++)
        for (int t = 0; t < len[i]; t++)
            mask[woff[i] + t] = rollout_seq_loss_token(&seqs[idx[i]], t);
    double *w = xmalloc((size_t)(total ? total : 1) * sizeof(double));
    const int agg_pg = loss_mode_agg(p->loss.mode); /* gspo, sapo, geo_mean: their own aggregation of the pg term */
    double *w_pg = agg_pg >= 0 && !p->loss.bypass ? xmalloc((size_t)(total ? total : 1) * sizeof(double)) : NULL;
    int **groups, *counts;
    const int k_own =
        split_micro_batches(seqs, idx, n, p->bt.micro_seqs, p->bt.micro_tokens, p->bt.share_prompts, &groups, &counts);
    /* sequences, the model's response tokens and micro-batches of the mini-batch over all ranks */
    int64_t counts_all[3] = {n, own, k_own};
    if (p->dp)
        comm_allreduce_sum(p->dp, counts_all, 3, COMM_I64);
    loss_token_weights_dist(p->agg, len, mask, n, counts_all[0], counts_all[1], p->max_response_length, w);
    if (w_pg)
        loss_token_weights_dist((enum loss_agg)agg_pg, len, mask, n, counts_all[0], counts_all[1],
                                p->max_response_length, w_pg);
    free(mask);
    model_trainable(m);
    const int k = ep_pad_micro_batches(m, &groups, &counts, k_own);
    log_debug("trainer", "update: %d sequence(s) of this rank's mini-batch in %d micro-batch(es)", n, k);
    struct mb_state *mbs = xcalloc((size_t)(k ? k : 1), sizeof *mbs);
    for (int b = 0; b < k; b++) {
        micro_batch_build(&mbs[b].mb, seqs, groups[b], counts[b], p->bt.share_prompts);
        mbs[b].rows = model_stage_rows(m, &mbs[b].mb.pb);
        const size_t N = (size_t)(mbs[b].mb.pb.N ? mbs[b].mb.pb.N : 1);
        mbs[b].logp = xcalloc(N, sizeof(float));
        mbs[b].ent = xcalloc(N, sizeof(float));
        mbs[b].dlogp = xcalloc(N, sizeof(float));
        mbs[b].dent = xcalloc(N, sizeof(float));
        if (tokens_forward)
            *tokens_forward += mbs[b].mb.pb.N;
    }
    if (k > 0)
        mbs[k - 1].overlap = p->overlap;
    struct policy_loss_stats mine = {0};
    const struct loss_ctx L = {seqs, idx, w, w_pg, woff, p, m->sh.pp ? &mine : ls};
    double wait = 0;
    /* a mixture of experts' load-balancing loss: each micro-batch's divided by the mini-batch's micro-batches over
     * every DP rank (Megatron's scaling, the mean of the per-micro-batch losses, where every rank runs as many; a
     * rank may hold more of a mini-batch's sequences than another, and one process then weights each micro-batch
     * the same way) */
    m->moe_aux_scale = (float)(1.0 / (double)(counts_all[2] > 0 ? counts_all[2] : 1));
    run_1f1b(m, &L, mbs, k, &wait);
    if (pp_wait)
        *pp_wait += wait;
    if (m->sh.pp) {
        /* the loss lives on the last stage: its statistics, and the old log-probs taken from this forward, to
         * every stage */
        loss_stats_sum(m->sh.pp, &mine);
        ls->pg_loss += mine.pg_loss, ls->kl_loss += mine.kl_loss, ls->entropy += mine.entropy;
        ls->pg_clipfrac += mine.pg_clipfrac, ls->pg_clipfrac_lower += mine.pg_clipfrac_lower;
        ls->ppo_kl += mine.ppo_kl, ls->loss += mine.loss, ls->tokens += mine.tokens;
        for (int b = 0; p->old_from_current && b < k; b++) {
            comm_broadcast(m->sh.pp, mbs[b].logp, (size_t)mbs[b].mb.pb.N, COMM_F32, m->sh.pp_size - 1);
            for (int i = 0; i < mbs[b].mb.n_seq; i++)
                keep_logp(&seqs[mbs[b].mb.seq[i]], mbs[b].logp + mbs[b].mb.resp_at[i], 0);
        }
    }
    for (int b = 0; b < k; b++) {
        free(mbs[b].logp), free(mbs[b].ent), free(mbs[b].dlogp), free(mbs[b].dent);
        micro_batch_free(&mbs[b].mb);
    }
    free(mbs);
    free_groups(groups, counts, k);
    free(w), free(w_pg), free(len), free(woff);
}

/* Clip the gradients to max_norm by the global norm over the model copy's TP x PP ranks (each parameter counted
 * once); returns it. */
static double mp_clip(struct model *m, double max_norm)
{
    if (m->lora && m->sh.ep) { /* LoRA under EP: each rank's experts' adapters, the rest counted once */
        const struct trainable tr = model_trainable(m);
        double s = lora_owned_sq(m, tr.grads);
        comm_allreduce_sum(m->sh.ep, &s, 1, COMM_F64);
        const double norm = sqrt(s);
        grad_scale_to_on(m->K, tr.grads, tr.n, norm, max_norm);
        return norm;
    }
    if (m->lora && m->sh.mp) { /* LoRA under TP or PP: each rank's parts of the adapter, the whole ones once */
        const struct trainable tr = model_trainable(m);
        double s = lora_owned_sq_range(m, tr.grads, 0, tr.n);
        comm_allreduce_sum(m->sh.mp, &s, 1, COMM_F64);
        const double norm = sqrt(s);
        grad_scale_to_on(m->K, tr.grads, tr.n, norm, max_norm);
        return norm;
    }
    if (!m->sh.mp) { /* whole models, and LoRA on them */
        const struct trainable tr = model_trainable(m);
        return grad_clip_on(m->K, tr.grads, tr.n, max_norm);
    }
    double s = model_owned_sq(m, m->grad->mem, 0, m->grad->n_floats);
    comm_allreduce_sum(m->sh.mp, &s, 1, COMM_F64);
    const double norm = sqrt(s);
    grad_scale_to_on(m->K, m->grad->mem, m->grad->n_floats, norm, max_norm);
    return norm;
}

/* n gradients at g (m's context) summed over group in place: as they are on the CPU or over a group that carries
 * device memory (NCCL); from a GPU over MPI through stage (host, n floats). */
static void group_sum(struct model *m, struct comm *group, float *g, size_t n, float *stage)
{
    if (m->K->device == KDEV_CPU || comm_caps(group)->device_memory) {
        comm_allreduce_sum(group, g, n, COMM_F32);
        return;
    }
    k_to_host(m->K, stage, g, n * sizeof(float));
    comm_allreduce_sum(group, stage, n, COMM_F32);
    k_to_device(m->K, g, stage, n * sizeof(float));
}

/* The gradients g (n floats of m's context) summed over the DP group, in place: over the NCCL twin (which waits
 * for the device's queued work first) or the MPI group, or, on a GPU without a twin, through the host buffer. */
static void dp_sum_grads(struct model *m, const struct update_params *p, float *g, size_t n)
{
    if (p->grads) { /* DP x SP (on a GPU: its NCCL twin, or the MPI group through the host buffer) */
        group_sum(m, p->grads, g, n, p->dp_stage);
    } else if (m->K->device != KDEV_CPU && !p->dp_dev) {
        k_to_host(m->K, p->dp_stage, g, n * sizeof(float));
        comm_allreduce_sum(p->dp, p->dp_stage, n, COMM_F32);
        k_to_device(m->K, g, p->dp_stage, n * sizeof(float));
    } else {
        comm_allreduce_sum(p->dp_dev ? p->dp_dev : p->dp, g, n, COMM_F32);
    }
}

/* Expert parallelism: each layer's experts' gradients summed over the ranks holding the same experts (edp), the
 * rest of the gradients over DP; with sequence or context parallelism each rank's tokens gave a part, summed over
 * the group too (the rest over DP x SP at once). */
static void ep_sum_grads(struct model *m, const struct update_params *p)
{
    const struct trainable tr = model_trainable(m); /* with LoRA the adapter: its experts' spans the same way */
    float *g = tr.grads, *stage = p->dp_stage;      /* on a GPU: the host buffer for the groups without device memory */
    struct comm *dense = p->grads ? p->grads : p->dp_dev ? p->dp_dev : p->dp; /* DP x SP, or DP */
    size_t at = 0; /* the dense floats from here up to the next layer's experts */
    for (int l = m->sh.layer_lo; l < m->sh.layer_hi; l++) {
        size_t lo, hi;
        trainable_expert_span(m, l, &lo, &hi);
        if (hi == lo)
            continue;
        group_sum(m, dense, g + at, lo - at, stage ? stage + at : NULL);
        if (p->edp)
            group_sum(m, p->edp, g + lo, hi - lo, stage ? stage + lo : NULL);
        if (m->sh.sp)
            group_sum(m, m->sh.sp, g + lo, hi - lo, stage ? stage + lo : NULL);
        at = hi;
    }
    group_sum(m, dense, g + at, tr.n - at, stage ? stage + at : NULL);
}

/* One optimizer step over the mini-batch idx[0..n). */
static void update_mini_batch(struct model *m, struct adamw *opt, struct rollout_seq *seqs, const int *idx, int n,
                              const struct update_params *p, struct update_stats *st)
{
    struct policy_loss_stats ls = {0};
    const struct trainable tr = model_trainable(m); /* the adapter with LoRA, else every parameter */
    model_trainable_zero_grads(m);
    const double t0 = clock_now_s();
    actor_accumulate_grads(m, seqs, idx, n, p, &ls, &st->tokens_forward, &st->pp_wait_s);
    st->pp_schedule_s += clock_now_s() - t0;
    if (!m->lora)
        model_shard_sync_grads(m); /* replicated KV heads, the tied embedding's copy: their gradients summed */
    else
        lora_sync_grads(m); /* under TP: the adapter's matrices every TP rank holds whole, their partial sums */
    if (p->dp || p->grads) {
        const double t0 = clock_now_s();
        if (p->zero)
            zero1_reduce_scatter(p->zero, tr.grads);
        else if (p->overlap) /* the buckets the backward started, and the rest */
            grad_reducer_finish(p->overlap);
        else if (m->sh.ep)
            ep_sum_grads(m, p);
        else
            dp_sum_grads(m, p, tr.grads, tr.n);
        st->allreduce_s += clock_now_s() - t0;
        if (p->dp) /* the SP ranks of a DP rank computed the same loss */
            loss_stats_sum(p->dp, &ls);
    }
    double norm = p->zero ? zero1_clip(p->zero, p->grad_clip, m) : mp_clip(m, p->grad_clip);
    if (isfinite(norm) && p->zero) { /* every rank has the same norm: they step, or skip, together */
        comm_test_hold("optim");     /* tests: a rank dies in its optimizer step, its block of the gradients summed */
        zero1_step(p->zero, opt, tr.params, p->lr);
    } else if (isfinite(norm)) {
        comm_test_hold("optim"); /* tests: a rank dies in its optimizer step, its gradients summed */
        adamw_step(opt, tr.params, tr.grads, p->lr);
    } else {
        log_warn("trainer", "gradient norm is %g: optimizer step skipped", norm);
        st->skipped_steps++;
    }
    double tokens = ls.tokens ? (double)ls.tokens : 1.0;
    st->pg_loss += ls.pg_loss;
    st->kl_loss += ls.kl_loss;
    st->entropy += ls.entropy;
    st->pg_clipfrac += ls.pg_clipfrac / tokens;
    st->pg_clipfrac_lower += ls.pg_clipfrac_lower / tokens;
    st->ppo_kl += ls.ppo_kl / tokens;
    st->grad_norm += norm;
    st->optimizer_steps++;
    st->tokens_trained += ls.tokens;
}

void actor_update(struct model *m, struct adamw *opt, struct rollout_seq *seqs, const int *idx, int n,
                  const struct update_params *p, struct update_stats *st)
{
    memset(st, 0, sizeof *st);
    model_trainable(m);
    const int total = p->n_total > 0 ? p->n_total : n;
    const int per = p->mini_batch_seqs > 0 ? p->mini_batch_seqs : total;
    int *sel = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    struct update_params q = *p;
    for (int e = 0; e < p->ppo_epochs; e++)
        for (int start = 0; start < total; start += per) {
            int k = 0; /* this rank's members of the mini-batch, in idx order */
            for (int i = 0; i < n; i++)
                if (seqs[idx[i]].gidx >= start && seqs[idx[i]].gidx < start + per)
                    sel[k++] = idx[i];
            q.epoch = e;
            update_mini_batch(m, opt, seqs, sel, k, &q, st);
        }
    free(sel);
    if (st->optimizer_steps) {
        double k = st->optimizer_steps;
        st->pg_loss /= k, st->kl_loss /= k, st->entropy /= k, st->pg_clipfrac /= k;
        st->pg_clipfrac_lower /= k, st->ppo_kl /= k, st->grad_norm /= k;
    }
}
