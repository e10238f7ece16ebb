#include "actor.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/log.h"
#include "zero1.h"

static void free_groups(int **groups, int *counts, int k)
{
    for (int b = 0; b < k; b++)
        free(groups[b]);
    free(groups);
    free(counts);
}

int actor_compute_logp(struct model *m, struct rollout_seq *seqs, const int *idx, int n, const struct batching *bt,
                       float temperature, int which)
{
    int **groups, *counts;
    int k = split_micro_batches(seqs, idx, n, bt->micro_seqs, bt->micro_tokens, &groups, &counts);
    for (int b = 0; b < k; b++) {
        struct micro_batch mb;
        micro_batch_build(&mb, seqs, groups[b], counts[b]);
        float *logp = xmalloc((size_t)(mb.pb.N ? mb.pb.N : 1) * sizeof(float));
        /* no backward follows: keep only layer inputs (checkpointing) to bound memory */
        model_acts_free(model_forward(m, &mb.pb, temperature, true, logp, NULL));
        for (int i = 0; i < mb.n_seq; i++) {
            struct rollout_seq *s = &seqs[mb.seq[i]];
            float **dst = which == 0 ? &s->old_logp : &s->ref_logp;
            if (!*dst)
                *dst = xmalloc((size_t)(s->resp_len ? s->resp_len : 1) * sizeof(float));
            memcpy(*dst, logp + mb.resp_at[i], (size_t)s->resp_len * sizeof(float));
        }
        free(logp);
        micro_batch_free(&mb);
    }
    free_groups(groups, counts, k);
    return k;
}

void actor_accumulate_grads(struct model *m, struct rollout_seq *seqs, const int *idx, int n,
                            const struct update_params *p, struct policy_loss_stats *ls, long long *tokens_forward)
{
    /* weights of every response token in this mini-batch's loss */
    int *len = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int *woff = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int total = 0;
    for (int i = 0; i < n; i++) {
        len[i] = seqs[idx[i]].resp_len;
        woff[i] = total;
        total += len[i];
    }
    double *w = xmalloc((size_t)(total ? total : 1) * sizeof(double));
    int64_t counts_all[2] = {n, total}; /* sequences and response tokens of the mini-batch over all ranks */
    if (p->dp)
        comm_allreduce_sum(p->dp, counts_all, 2, COMM_I64);
    loss_token_weights_dist(p->agg, len, n, counts_all[0], counts_all[1], p->max_response_length, w);
    model_alloc_grads(m);
    int **groups, *counts;
    int k = split_micro_batches(seqs, idx, n, p->bt.micro_seqs, p->bt.micro_tokens, &groups, &counts);
    for (int b = 0; b < k; b++) {
        struct micro_batch mb;
        micro_batch_build(&mb, seqs, groups[b], counts[b]);
        const size_t N = (size_t)(mb.pb.N ? mb.pb.N : 1);
        float *logp = xmalloc(N * sizeof(float)), *ent = xmalloc(N * sizeof(float));
        float *dlogp = xcalloc(N, sizeof(float)), *dent = xcalloc(N, sizeof(float));
        struct model_acts *acts = model_forward(m, &mb.pb, p->temperature, p->checkpointing, logp, ent);
        for (int i = 0; i < mb.n_seq; i++) {
            const struct rollout_seq *s = &seqs[mb.seq[i]];
            int j = 0; /* position of this sequence in the mini-batch (its token weights) */
            while (idx[j] != mb.seq[i])
                j++;
            const int at = mb.resp_at[i];
            if (p->old_from_current) {
                struct rollout_seq *ws = &seqs[mb.seq[i]];
                if (!ws->old_logp)
                    ws->old_logp = xmalloc((size_t)(ws->resp_len ? ws->resp_len : 1) * sizeof(float));
                memcpy(ws->old_logp, logp + at, (size_t)ws->resp_len * sizeof(float));
            }
            policy_loss_tokens(&p->loss, s->resp_len, logp + at, s->old_logp, s->ref_logp ? s->ref_logp : s->old_logp,
                               ent + at, s->adv, w + woff[j], ls, dlogp + at, dent + at);
        }
        model_backward(m, acts, dlogp, dent);
        if (tokens_forward)
            *tokens_forward += mb.pb.N;
        free(logp), free(ent), free(dlogp), free(dent);
        micro_batch_free(&mb);
    }
    free_groups(groups, counts, k);
    free(w), free(len), free(woff);
}

/* Clip the gradients to max_norm by the global norm over the model copy's TP x PP ranks (each parameter counted
 * once); returns it. */
static double mp_clip(struct model *m, double max_norm)
{
    if (!m->sh.mp)
        return grad_clip(m->grad->mem, m->grad->n_floats, max_norm);
    double s = model_owned_sq(m, m->grad->mem, 0, m->grad->n_floats);
    comm_allreduce_sum(m->sh.mp, &s, 1, COMM_F64);
    const double norm = sqrt(s);
    grad_scale_to(m->grad->mem, m->grad->n_floats, norm, max_norm);
    return norm;
}

/* One optimizer step over the mini-batch idx[0..n). */
static void update_mini_batch(struct model *m, struct adamw *opt, struct rollout_seq *seqs, const int *idx, int n,
                              const struct update_params *p, struct update_stats *st)
{
    struct policy_loss_stats ls = {0};
    model_alloc_grads(m);
    model_zero_grads(m);
    actor_accumulate_grads(m, seqs, idx, n, p, &ls, &st->tokens_forward);
    model_shard_sync_grads(m); /* replicated KV heads, the tied embedding's copy: their gradients summed */
    if (p->dp) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (p->zero)
            zero1_reduce_scatter(p->zero, m->grad->mem);
        else
            comm_allreduce_sum(p->dp, m->grad->mem, m->grad->n_floats, COMM_F32);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        st->allreduce_s += (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        double sums[8] = {ls.pg_loss,           ls.kl_loss, ls.entropy, ls.pg_clipfrac,
                          ls.pg_clipfrac_lower, ls.ppo_kl,  ls.loss,    (double)ls.tokens};
        comm_allreduce_sum(p->dp, sums, 8, COMM_F64);
        ls = (struct policy_loss_stats){sums[0], sums[1], sums[2], sums[3],
                                        sums[4], sums[5], sums[6], (long long)sums[7]};
    }
    double norm = p->zero ? zero1_clip(p->zero, p->grad_clip, m) : mp_clip(m, p->grad_clip);
    if (isfinite(norm) && p->zero) { /* every rank has the same norm: they step, or skip, together */
        adamw_step(opt, m->w.mem + p->zero->lo, p->zero->grad, p->lr);
        zero1_allgather(p->zero, m->w.mem);
    } else if (isfinite(norm)) {
        adamw_step(opt, m->w.mem, m->grad->mem, p->lr);
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
    model_alloc_grads(m);
    const int total = p->n_total > 0 ? p->n_total : n;
    const int per = p->mini_batch_seqs > 0 ? p->mini_batch_seqs : total;
    int *sel = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    for (int e = 0; e < p->ppo_epochs; e++)
        for (int start = 0; start < total; start += per) {
            int k = 0; /* this rank's members of the mini-batch, in idx order */
            for (int i = 0; i < n; i++)
                if (seqs[idx[i]].gidx >= start && seqs[idx[i]].gidx < start + per)
                    sel[k++] = idx[i];
            update_mini_batch(m, opt, seqs, sel, k, p, st);
        }
    free(sel);
    if (st->optimizer_steps) {
        double k = st->optimizer_steps;
        st->pg_loss /= k, st->kl_loss /= k, st->entropy /= k, st->pg_clipfrac /= k;
        st->pg_clipfrac_lower /= k, st->ppo_kl /= k, st->grad_norm /= k;
    }
}
