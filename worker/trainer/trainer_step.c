/* The trainer's step: the rollouts of a step (generated here, or from the data plane through the source),
 * their metrics, old and reference log-probs, advantages, the update; and the supervised warm-start step
 * and validation. The run loop around it is trainer.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/config_key_names.h"
#include "common/log.h"
#include "step_metrics.h"
#include "trainer_internal.h"
#include "worker/watchdog/watchdog.h"
#include "worker/comm/comm.h"
#include "worker/model/fit.h"
#include "worker/model/lora.h"
#include "worker/step/audit.h"
#include "worker/gen/validate.h"
#include "worker/tokenizer/tokenizer.h"
#include "kernels/kernels.h"

/* Temperature of the trainer's log-probs: the rollout's, except that 0 (greedy rollout, argmax sampling) has
 * none; its log-probs are taken at temperature 1, as verl does and as the sampler records them. */
static float logprob_temperature(const struct grpo_config *c)
{
    return c->rollout_temperature > 0 ? (float)c->rollout_temperature : 1.0f;
}

/* The run must fit the model's positions and the machine's memory before a step allocates for it; -1 (logged)
 * if not. The answer is the same at every step (the machine's memory, not what is free at the moment). */
static int check_fit(const struct trainer *t)
{
    char err[1024];
    if (run_fit_check(&t->policy->cfg, t->cfg, 0, err, sizeof err) == 0)
        return 0;
    log_error("trainer", "%s", err);
    return -1;
}

/* Consecutive steps whose optimizer updates were all skipped (non-finite gradient norm): the run of the trainer
 * that last counted, up to the step it counted. */
static _Thread_local struct {
    const struct trainer *t;
    int64_t step;
    long long run;
} g_skipped;

/* Count step k (all of its optimizer steps skipped, or not); -1 (logged) when the run has had
 * trainer.max_consecutive_skipped_steps such steps in a row. */
static int count_skipped(const struct trainer *t, int64_t k, bool all_skipped, double grad_norm)
{
    if (g_skipped.t != t || g_skipped.step != k - 1)
        g_skipped.run = 0;
    g_skipped.t = t;
    g_skipped.step = k;
    g_skipped.run = all_skipped ? g_skipped.run + 1 : 0;
    const long long limit = t->cfg->trainer_max_consecutive_skipped_steps;
    if (limit <= 0 || g_skipped.run < limit)
        return 0;
    log_error("trainer",
              "step %lld: %lld consecutive steps skipped their optimizer step for a non-finite gradient norm "
              "(%g), " KEY_trainer_max_consecutive_skipped_steps
              " = %lld: the weights or the data have gone bad (NaN or "
              "infinite values); ending the run",
              (long long)k, g_skipped.run, grad_norm, limit);
    return -1;
}

void trainer_draw_prompts(struct trainer *t, const struct prompt_item **out, int *uids, int n)
{
    int *idx = xmalloc((size_t)n * sizeof(int));
    data_cursor_next(&t->cursor, idx);
    for (int i = 0; i < n; i++) {
        out[i] = &t->train.items[idx[i]];
        if (uids)
            uids[i] = idx[i];
    }
    t->st.epoch = t->cursor.epoch;
    t->st.cursor = t->cursor.index;
    free(idx);
}

/* Summary of values held across the DP ranks: over all of them (alone: of its finite values, as
 * metrics_set_stats). */
static struct metrics_summary summarize_dist(struct trainer *t, const double *v, size_t n)
{
    if (!t->lay.dp || t->lay.dp_size < 2)
        return metrics_summarize(v, n);
    double mine[4] = {0, -INFINITY, INFINITY, (double)n};
    for (size_t i = 0; i < n; i++) {
        mine[0] += v[i];
        mine[1] = fmax(mine[1], v[i]);
        mine[2] = fmin(mine[2], v[i]);
    }
    double *all = xmalloc((size_t)t->lay.dp_size * 4 * sizeof(double));
    comm_allgather(t->lay.dp, mine, all, 4, COMM_F64);
    double sum = 0, mx = -INFINITY, mn = INFINITY, k = 0;
    for (int r = 0; r < t->lay.dp_size; r++) {
        sum += all[4 * r];
        if (all[4 * r + 3] > 0) {
            mx = fmax(mx, all[4 * r + 1]);
            mn = fmin(mn, all[4 * r + 2]);
        }
        k += all[4 * r + 3];
    }
    free(all);
    return (struct metrics_summary){sum, mx, mn, (size_t)k};
}

/* Sums of n values over the DP ranks, in place: one all-reduce. */
static void sum_dist(struct trainer *t, double *v, int n)
{
    if (t->lay.dp && t->lay.dp_size > 1)
        comm_allreduce_sum(t->lay.dp, v, (size_t)n, COMM_F64);
}

/* Largest of a value over the DP ranks. */
static double max_dist(struct trainer *t, double v)
{
    if (!t->lay.dp || t->lay.dp_size < 2)
        return v;
    double *all = xmalloc((size_t)t->lay.dp_size * sizeof(double));
    comm_allgather(t->lay.dp, &v, all, 1, COMM_F64);
    for (int r = 0; r < t->lay.dp_size; r++)
        v = fmax(v, all[r]);
    free(all);
    return v;
}

/* sum_dist for the batch-wide statistics of the advantages and rollout correction (struct batch_reduce's form). */
static void dist_sum(void *ctx, double *v, int n) { sum_dist(ctx, v, n); }

/* The largest of each of n values over the DP ranks, in place. */
static void dist_max(void *ctx, double *v, int n)
{
    struct trainer *t = ctx;
    if (t->lay.dp && t->lay.dp_size > 1)
        comm_allreduce_max(t->lay.dp, v, (size_t)n, COMM_F64);
}

/* Rollout correction in decoupled mode (verl's compute_rollout_correction_and_add_to_batch), after the old log-probs:
 * each sequence's IS weights (seqs' is_w) and rejection (loss_mask: the model's tokens every rollout_rs option
 * keeps) when they apply (apply), and the rollout_corr/ metrics over the step's batch, every DP rank's, into m. The
 * sequences must all carry the sampler's and the trainer's log-probs (else nothing is measured). */
static void rollout_correction(struct trainer *t, struct step_batch *b, bool apply, struct rc_metrics *m)
{
    const int n = b->n_seq;
    int missing = 0;
    for (int i = 0; i < n; i++)
        missing |= !b->seqs[i].gen_logp || !b->seqs[i].old_logp;
    if (t->lay.dp && t->lay.dp_size > 1)
        comm_allreduce_max(t->lay.dp, &missing, 1, COMM_I32);
    if (missing)
        return;
    int *len = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    const float **lp = xmalloc((size_t)(n ? n : 1) * sizeof *lp), **ro = xmalloc((size_t)(n ? n : 1) * sizeof *ro);
    const uint8_t **mk = xmalloc((size_t)(n ? n : 1) * sizeof *mk);
    float **w = xcalloc((size_t)(n ? n : 1), sizeof *w);
    uint8_t **keep = xcalloc((size_t)(n ? n : 1), sizeof *keep);
    for (int i = 0; i < n; i++) {
        struct rollout_seq *q = &b->seqs[i];
        len[i] = q->resp_len, lp[i] = q->old_logp, ro[i] = q->gen_logp, mk[i] = q->mask;
        const size_t L = (size_t)(q->resp_len ? q->resp_len : 1);
        if (apply && t->corr.is != RC_OFF)
            w[i] = q->is_w = xrealloc(q->is_w, L * sizeof(float));
        if (apply && t->corr.n_rs)
            keep[i] = q->loss_mask = xrealloc(q->loss_mask, L);
    }
    const struct rc_reduce red = {dist_sum, dist_max, t};
    m->n = 0;
    rollout_corr_compute(&t->corr, n, len, lp, ro, mk, &red, true, w, keep, m);
    free(len), free(lp), free(ro), free(mk), free(w), free(keep);
}

/* gdpo/<key>/ figures of the step's n responses' components (n x t->gdpo_n) over every DP rank: mean, population
 * std (numpy's), max and min, as verl logs them. */
static void gdpo_figures(struct trainer *t, const double *parts, int n, struct step_advantages *out)
{
    const int K = t->gdpo_n;
    out->n_parts = K;
    double *col = xmalloc((size_t)(n ? n : 1) * sizeof(double));
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < n; i++)
            col[i] = parts[(size_t)i * K + k];
        const struct metrics_summary s = summarize_dist(t, col, (size_t)n);
        const double mean = s.n ? s.sum / (double)s.n : 0.0;
        double ss = 0;
        for (int i = 0; i < n; i++)
            ss += (col[i] - mean) * (col[i] - mean);
        sum_dist(t, &ss, 1);
        out->part_name[k] = t->gdpo_keys[k];
        out->part_mean[k] = mean;
        out->part_std[k] = s.n ? sqrt(ss / (double)s.n) : 0.0;
        out->part_max[k] = s.n ? s.max : 0.0;
        out->part_min[k] = s.n ? s.min : 0.0;
    }
    free(col);
}

/* Phase adv: the advantages of every response token (and the in-reward KL, when on). A sequence's outcome reward sits
 * at its last token; the tokens that are not the model's (its mask's 0) get advantage 0 and no in-reward KL, and
 * the advantages' and KL's figures are over the model's tokens, as verl's with its response_mask. Its seconds. */
static double advantages(struct trainer *t, struct step_batch *b, struct step_advantages *out)
{
    trainer_phase(t, GRPO__PHASE__PHASE_ADV);
    const double t0 = clock_now_s();
    const struct grpo_config *c = t->cfg;
    const int n = b->n_seq;
    double *scalar = xmalloc((size_t)(n ? n : 1) * sizeof(double));
    int *group = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int *off = xmalloc((size_t)(n ? n : 1) * sizeof(int)), *len = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    /* response tokens; the model's among them (the in-reward KL's); those the loss takes (the model's that rollout
     * rejection sampling kept: the advantages' and their figures') */
    int total = 0, own = 0, trained = 0;
    bool masked = false;
    for (int i = 0; i < n; i++) {
        off[i] = total;
        len[i] = b->seqs[i].resp_len;
        total += len[i];
        own += rollout_seq_model_tokens(&b->seqs[i]);
        trained += rollout_seq_loss_tokens(&b->seqs[i]);
        masked |= rollout_seq_loss_mask(&b->seqs[i]) != NULL;
        group[i] = b->seqs[i].group;
    }
    uint8_t *mask = masked ? xmalloc((size_t)(total ? total : 1)) : NULL; /* packed; NULL: every token trained */
    for (int i = 0; masked && i < n; i++)
        for (int k = 0; k < len[i]; k++)
            mask[off[i] + k] = rollout_seq_loss_token(&b->seqs[i], k);
    double *tok_r = xcalloc((size_t)(total ? total : 1), sizeof(double));
    double kl_sum = 0;
    for (int i = 0; i < n; i++) {
        const struct rollout_seq *s = &b->seqs[i];
        for (int k = 0; k < s->resp_len; k++) {
            double r = k == s->resp_len - 1 ? s->score : 0.0;
            if (c->alg_use_kl_in_reward && rollout_seq_model_token(s, k)) {
                double d, kl = kl_estimate(t->kl_reward_type, s->old_logp[k], s->ref_logp[k], &d);
                r -= c->alg_kl_ctrl_kl_coef * kl;
                kl_sum += kl;
            }
            tok_r[off[i] + k] = r;
        }
    }
    out->kl_penalty_measured = c->alg_use_kl_in_reward && own;
    out->kl_penalty = own ? kl_sum / own : 0;
    double *tok_adv = xcalloc((size_t)(total ? total : 1), sizeof(double));
    const struct batch_reduce red = {dist_sum, t};
    struct adv_params ap = {.est = t->est,
                            .norm_by_std = c->alg_norm_adv_by_std_in_grpo,
                            .gamma = c->alg_gamma,
                            .red = t->lay.dp && t->lay.dp_size > 1 ? &red : NULL};
    double *base = NULL, *olp = NULL, *spp = NULL, *isw = NULL, *parts = NULL;
    if (t->est == ADV_REMAX) { /* each response's greedy baseline, generated and scored with it */
        base = xmalloc((size_t)(n ? n : 1) * sizeof(double));
        for (int i = 0; i < n; i++)
            base[i] = b->seqs[i].reward_baseline;
        ap.baseline = base;
    }
    if (t->est == ADV_OPTIMAL_TOKEN_BASELINE || t->est == ADV_TIR_OPTIMAL_TOKEN_BASELINE) {
        /* the old-log-prob pass's log-probs and sum_pi_sq (config_validate makes it take them), and decoupled
         * rollout correction's IS weights where it has them */
        olp = xcalloc((size_t)(total ? total : 1), sizeof(double));
        spp = xcalloc((size_t)(total ? total : 1), sizeof(double));
        bool weighted = false;
        for (int i = 0; i < n; i++)
            weighted |= b->seqs[i].is_w != NULL;
        isw = weighted ? xcalloc((size_t)(total ? total : 1), sizeof(double)) : NULL;
        for (int i = 0; i < n; i++) {
            const struct rollout_seq *s = &b->seqs[i];
            if (!s->old_logp || !s->sum_pi_sq)
                check_failf(__FILE__, __LINE__, "%s: a response without its old log-probs and sum_pi_sq",
                            c->alg_adv_estimator);
            for (int k = 0; k < len[i]; k++) {
                olp[off[i] + k] = s->old_logp[k];
                spp[off[i] + k] = s->sum_pi_sq[k];
                if (isw)
                    isw[off[i] + k] = s->is_w ? s->is_w[k] : 1.0;
            }
        }
        ap.old_logp = olp, ap.sum_pi_sq = spp, ap.is_w = isw;
    }
    if (t->est == ADV_GDPO) { /* the scorer's components of each response (wire.c checks their count) */
        parts = xcalloc((size_t)(n ? n : 1) * (size_t)(t->gdpo_n ? t->gdpo_n : 1), sizeof(double));
        for (int i = 0; i < n; i++)
            if (b->seqs[i].reward_parts && b->seqs[i].n_parts == t->gdpo_n)
                memcpy(parts + (size_t)i * t->gdpo_n, b->seqs[i].reward_parts, (size_t)t->gdpo_n * sizeof(double));
        ap.n_parts = t->gdpo_n, ap.parts = parts, ap.part_weights = t->gdpo_w;
        gdpo_figures(t, parts, n, out);
    }
    token_advantages(&ap, tok_r, mask, off, len, group, n, scalar, tok_adv);
    free(base), free(olp), free(spp), free(isw), free(parts);
    for (int i = 0; i < n; i++) {
        b->seqs[i].adv = xmalloc((size_t)(len[i] ? len[i] : 1) * sizeof(double));
        memcpy(b->seqs[i].adv, tok_adv + off[i], (size_t)len[i] * sizeof(double));
    }
    if (mask) { /* the model's tokens' advantages, in order (verl's masked_select) */
        int w = 0;
        for (int k = 0; k < total; k++)
            if (mask[k])
                tok_adv[w++] = tok_adv[k];
    }
    out->advantages = summarize_dist(t, tok_adv, (size_t)trained);
    out->rewards = summarize_dist(t, scalar, (size_t)n);
    free(scalar), free(group), free(off), free(len), free(tok_r), free(tok_adv), free(mask);
    return clock_now_s() - t0;
}

/* -------------------------------------------------------------------- steps */

/* Supervised warm-start step: maximise the log-likelihood of reference answers (synthetic tasks). */
int trainer_sft_step(struct trainer *t, int64_t k, struct metrics *m)
{
    const struct grpo_config *c = t->cfg;
    const int B = (int)c->data_train_batch_size;
    if (check_fit(t) != 0)
        return -1;
    const struct prompt_item **prompts = xmalloc((size_t)B * sizeof *prompts);
    trainer_draw_prompts(t, prompts, NULL, B);
    struct rollout_seq *seqs = xcalloc((size_t)B, sizeof *seqs);
    int *idx = xmalloc((size_t)B * sizeof(int));
    int n = 0;
    for (int i = 0; i < B; i++) {
        if (!prompts[i]->answer_ids)
            continue;
        struct rollout_seq *s = &seqs[n];
        s->prompt = prompts[i]->ids;
        s->prompt_len = prompts[i]->len;
        s->resp_len = prompts[i]->answer_len;
        s->resp = xmalloc((size_t)s->resp_len * sizeof(int32_t));
        memcpy(s->resp, prompts[i]->answer_ids, (size_t)s->resp_len * sizeof(int32_t));
        idx[n] = n;
        n++;
    }
    free(prompts);
    if (n == 0) {
        free(seqs), free(idx);
        log_error("trainer", KEY_trainer_sft_warmup_steps " needs reference answers; this dataset has none");
        return -1;
    }
    /* maximise mean token log-likelihood: dL/dlogp = -1/T over the answer tokens */
    const struct trainable tr = model_trainable(t->policy);
    model_trainable_zero_grads(t->policy);
    long long T = 0;
    double nll = 0;
    for (int i = 0; i < n; i++)
        T += seqs[i].resp_len;
    int **groups, *counts;
    int nb = split_micro_batches(seqs, idx, n, t->micro_actor, 0, false, &groups, &counts);
    for (int g = 0; g < nb; g++) {
        struct micro_batch mb;
        micro_batch_build(&mb, seqs, groups[g], counts[g], false); /* one answer per prompt: nothing shared */
        float *logp = xmalloc((size_t)mb.pb.N * sizeof(float)), *dl = xcalloc((size_t)mb.pb.N, sizeof(float));
        struct model_acts *acts = model_forward(t->policy, &mb.pb, 1.0f, false, logp, NULL);
        for (int i = 0; i < mb.n_seq; i++)
            for (int q = 0; q < seqs[mb.seq[i]].resp_len; q++) {
                dl[mb.resp_at[i] + q] = (float)(-1.0 / (double)T);
                nll -= logp[mb.resp_at[i] + q];
            }
        model_backward(t->policy, acts, dl, NULL);
        free(logp), free(dl);
        micro_batch_free(&mb);
        free(groups[g]);
    }
    free(groups), free(counts);
    struct kctx *K = t->policy->K; /* the gradients are its memory (a GPU's with trainer.device=cuda) */
    double norm = K->device == KDEV_CPU ? grad_clip(tr.grads, tr.n, c->actor_grad_clip)
                                        : grad_clip_on(K, tr.grads, tr.n, c->actor_grad_clip);
    if (isfinite(norm))
        adamw_step(t->opt, tr.params, tr.grads, c->trainer_sft_warmup_lr);
    else
        log_warn("trainer", "gradient norm is %g: supervised optimizer step skipped", norm);
    sft_metrics(m, &(struct sft_result){.nll = nll / (double)T, .grad_norm = norm, .step = k});
    rollout_seqs_free(seqs, n);
    free(seqs), free(idx);
    return count_skipped(t, k, !isfinite(norm), norm);
}

/* Validation: greedy (or val_kwargs) generation on the held-out prompts, scored per data_source. */
void trainer_validate(struct trainer *t, struct metrics *m)
{
    if (t->val.n == 0)
        return;
    if (check_fit(t) != 0) { /* the next step fails with the same reason */
        log_error("trainer", "validation skipped");
        return;
    }
    trainer_phase(t, GRPO__PHASE__PHASE_VALIDATE);
    const uint64_t seed = trainer_step_seed(t->st.seed, t->st.global_step, 0x7a1);
    /* trainer.validation_data_dir: written by the lead (a TP or PP group validates together) */
    const char *dump = trainer_is_lead(t) ? t->cfg->trainer_validation_data_dir : NULL;
    if (t->src.validate) {
        t->src.validate(t->src.ctx, seed, m);
    } else if (t->policy->sh.ep) { /* EP: DP rank 0 validates with the whole model its EP group gathers */
        struct model *whole = t->policy->sh.ep_rank == 0 ? model_create(&t->policy->cfg) : NULL;
        const struct model *p = t->policy;
        float *host = NULL; /* the weights, from a GPU through the host */
        if (p->K->device != KDEV_CPU) {
            host = xmalloc(p->w.n_floats * sizeof(float));
            k_to_host(p->K, host, p->w.mem, p->w.n_floats * sizeof(float));
        }
        model_shard_gather(p, host ? host : p->w.mem, whole ? whole->w.mem : NULL, 0);
        free(host);
        if (whole) {
            struct gen_ctx rc = t->rc;
            rc.policy = whole;
            gen_validate(&rc, &t->val, seed, t->st.global_step, dump, m);
            model_free(whole);
        }
    } else {
        gen_validate(&t->rc, &t->val, seed, t->st.global_step, dump, m);
    }
}

/* ------------------------------------------------------------ a GRPO step's phases */

/* What a step's rollouts are, over every DP rank: scores, accuracy, lengths (verl's critic/ and
 * response_length/ metrics). */
static void measure_rollouts(struct trainer *t, const struct step_batch *b, struct step_rollouts *out)
{
    const struct grpo_config *c = t->cfg;
    double *v = xmalloc((size_t)(b->n_seq ? b->n_seq : 1) * sizeof(double));
    for (int i = 0; i < b->n_seq; i++)
        v[i] = b->seqs[i].score;
    out->score = summarize_dist(t, v, (size_t)b->n_seq);
    /* exact-answer accuracy apart from format credit, over the responses whose scorer knows it */
    double acc[2] = {0, 0};
    for (int i = 0; i < b->n_seq; i++)
        if (isfinite(b->seqs[i].acc)) {
            acc[0] += b->seqs[i].acc;
            acc[1] += 1;
        }
    sum_dist(t, acc, 2);
    out->acc_sum = acc[0];
    out->acc_n = acc[1];
    long long tokens = 0;
    int clipped = 0;
    for (int i = 0; i < b->n_seq; i++) {
        v[i] = b->seqs[i].resp_len;
        clipped += !b->seqs[i].stopped && b->seqs[i].resp_len >= c->data_max_response_length;
        tokens += b->seqs[i].prompt_len + b->seqs[i].resp_len;
    }
    out->response_length = summarize_dist(t, v, (size_t)b->n_seq);
    double plen = 0;
    for (int i = 0; i < b->n_seq; i++)
        plen += b->seqs[i].prompt_len;
    double all[4] = {b->n_seq, clipped, plen, (double)tokens}; /* over the whole step */
    sum_dist(t, all, 4);
    out->n_seq = all[0];
    out->clipped = all[1];
    out->prompt_tokens = all[2];
    out->tokens = (double)(long long)all[3];
    out->multi_turn = gen_multi_turn(c);
    if (out->multi_turn) {
        double mt[11] = {0};
        for (int i = 0; i < b->n_seq; i++) {
            const struct rollout_seq *s = &b->seqs[i];
            v[i] = s->num_turns;
            mt[0] += s->tool_calls, mt[1] += s->tool_errors, mt[2] += s->tool_calls > 0, mt[3] += s->tool_seconds;
            mt[6] += s->tokens_mismatch;
            mt[7] += s->template_errors, mt[8] += s->resumed_turns, mt[9] += s->prefill_tokens, mt[10] += s->evictions;
            for (int k = 0; k < s->resp_len; k++)
                mt[s->mask && !s->mask[k] ? 5 : 4] += 1;
        }
        out->num_turns = summarize_dist(t, v, (size_t)b->n_seq);
        sum_dist(t, mt, 11);
        out->tool_calls = mt[0], out->tool_errors = mt[1], out->with_calls = mt[2], out->tool_s = mt[3];
        out->model_tokens = mt[4], out->tool_tokens = mt[5], out->mismatch = mt[6];
        out->template_errors = mt[7], out->resumed_turns = mt[8], out->prefill_tokens = mt[9], out->evictions = mt[10];
    }
    free(v);
}

/* One optimizer step for the step's n_all sequences, and no in-reward KL: the update's own forward gives the
 * old log-probs exactly (no phase old_log_prob). */
static bool one_update(const struct grpo_config *c, double n_all)
{
    const int mini_seqs = (int)(c->actor_ppo_mini_batch_size * c->rollout_n);
    return c->actor_ppo_epochs == 1 && n_all <= mini_seqs && !c->alg_use_kl_in_reward;
}

/* use_dynamic_bsz: a micro-batch's tokens, ppo_max_token_len_per_gpu as verl means it: per GPU, so the SP ranks
 * sharing a micro-batch (each running 1/SP of its tokens) take SP times as many; 0: batches by count */
static int token_budget(const struct trainer *t)
{
    const struct grpo_config *c = t->cfg;
    return c->actor_use_dynamic_bsz ? (int)(c->actor_ppo_max_token_len_per_gpu * t->lay.cp_size) : 0;
}

/* Whether the sampler's log-probs are the old policy's (no old-log-prob pass): rollout correction's bypass mode, or
 * use_rollout_log_probs (exact in batch-invariant mode) where the pass is not needed for sum_pi_sq. */
static bool sampler_is_old(const struct trainer *t)
{
    const struct grpo_config *c = t->cfg;
    return t->corr.bypass || (c->actor_use_rollout_log_probs && !c->actor_calculate_sum_pi_squared);
}

/* Phase old_log_prob: the policy's log-probs of the responses before the update (in rollout correction's bypass mode
 * the sampler's, as verl's apply_bypass_mode, and with use_rollout_log_probs: no pass). Its seconds. */
static double old_log_probs(struct trainer *t, struct step_batch *b, const int *idx)
{
    const struct grpo_config *c = t->cfg;
    if (sampler_is_old(t)) {
        int missing = 0;
        for (int i = 0; i < b->n_seq; i++) {
            struct rollout_seq *q = &b->seqs[i];
            if (!q->gen_logp) {
                missing = 1;
                continue;
            }
            q->old_logp = xrealloc(q->old_logp, (size_t)(q->resp_len ? q->resp_len : 1) * sizeof(float));
            memcpy(q->old_logp, q->gen_logp, (size_t)q->resp_len * sizeof(float));
        }
        if (!missing)
            return 0;
        log_warn("trainer", "%s: a response came without the sampler's log-probs; recomputing the old ones",
                 t->corr.bypass ? "bypass mode" : "use_rollout_log_probs");
    }
    const struct batching bt = {t->micro_old, token_budget(t), t->share_prompts};
    const double t0 = clock_now_s();
    trainer_phase(t, GRPO__PHASE__PHASE_OLD_LOG_PROB);
    actor_compute_logp(t->policy, b->seqs, idx, b->n_seq, &bt, logprob_temperature(c),
                       c->actor_calculate_sum_pi_squared ? ACTOR_LOGP_OLD_SUM_PI_SQ : ACTOR_LOGP_OLD);
    return clock_now_s() - t0;
}

/* Phase ref: the reference model's log-probs of the responses (the KL loss's, the in-reward KL's). Its seconds. */
static double ref_log_probs(struct trainer *t, struct step_batch *b, const int *idx)
{
    const struct grpo_config *c = t->cfg;
    const struct batching bt = {t->micro_ref, token_budget(t), t->share_prompts};
    trainer_phase(t, GRPO__PHASE__PHASE_REF);
    const double t0 = clock_now_s();
    /* with LoRA the reference is the base model: the policy with its adapter bypassed (no second copy) */
    struct model *ref = t->ref ? t->ref : t->policy;
    lora_set_bypass(ref, !t->ref);
    /* the reference routes by its own router, and its forwards count in no routing metric */
    const bool replay = ref->moe_replay;
    double differ, compared;
    model_moe_route_stats(ref, &differ, &compared);
    ref->moe_replay = false;
    actor_compute_logp(ref, b->seqs, idx, b->n_seq, &bt, logprob_temperature(c), ACTOR_LOGP_REF);
    ref->moe_replay = replay;
    double d2, c2;
    model_moe_route_stats(ref, &d2, &c2);
    ref->moe_route_differ = differ, ref->moe_route_compared = compared;
    lora_set_bypass(ref, false);
    return clock_now_s() - t0;
}

/* A mixture of experts' routing in the update's forwards, over the DP ranks: per layer the tokens each expert got,
 * their imbalance (max over mean) and the load-balancing loss. */
static void moe_measure(struct trainer *t, struct step_update *out)
{
    const int E = t->policy->cfg.n_experts, L = t->policy->cfg.n_layers;
    out->moe_experts = 0;
    if (!E)
        return;
    double *tok = xcalloc((size_t)L * E + 2, sizeof *tok), aux = 0;
    int n = model_moe_stats(t->policy, tok, &aux);
    if (t->lay.pp) { /* each stage routed its own layers: their counts, and the mean over every stage's layers */
        tok[(size_t)L * E] = aux * n;
        tok[(size_t)L * E + 1] = n;
        comm_allreduce_sum(t->lay.pp, tok, (size_t)L * E + 2, COMM_F64);
        n = (int)tok[(size_t)L * E + 1];
        aux = n ? tok[(size_t)L * E] / n : 0;
    }
    tok[(size_t)L * E] = aux;
    sum_dist(t, tok, L * E + 1);
    const int ranks = t->lay.dp_size > 0 ? t->lay.dp_size : 1;
    double imb_sum = 0, imb_max = 0, tmax = 0, tmin = -1, tsum = 0;
    int layers = 0;
    for (int l = 0; l < L; l++) {
        double mx = 0, sum = 0, mn = -1;
        for (int e = 0; e < E; e++) {
            const double v = tok[(size_t)l * E + e];
            mx = v > mx ? v : mx, mn = mn < 0 || v < mn ? v : mn, sum += v;
        }
        if (sum <= 0)
            continue; /* a layer of another stage */
        const double imb = mx / (sum / E);
        imb_sum += imb, imb_max = imb > imb_max ? imb : imb_max;
        tmax = mx > tmax ? mx : tmax, tmin = tmin < 0 || mn < tmin ? mn : tmin, tsum += sum;
        layers++;
    }
    if (n > 0 && layers > 0) {
        out->moe_experts = E;
        out->moe_aux_loss = tok[(size_t)L * E] / ranks;
        out->moe_imbalance = imb_sum / layers;
        out->moe_imbalance_max = imb_max;
        out->moe_tokens_max = tmax;
        out->moe_tokens_min = tmin;
        out->moe_tokens_mean = tsum / ((double)layers * E);
    }
    free(tok);
}

/* Bypass mode's rollout_corr/ metrics: each micro-batch's (summed on the pipeline's last stage, in acc) averaged over
 * the update's micro-batches on every DP rank, as verl averages the loss's metrics, into m. The names are the
 * configuration's, the same on every rank (an empty micro-batch adds none). */
static void bypass_metrics(struct trainer *t, const struct rc_accum *acc, struct rc_metrics *m)
{
    struct rc_metrics names = {0};
    const int nseq = 0;
    rollout_corr_compute(&t->corr, nseq, NULL, NULL, NULL, NULL, NULL, false, NULL, NULL, &names);
    double *v = xcalloc((size_t)names.n + 1, sizeof(double));
    for (int j = 0; j < names.n; j++)
        for (int k = 0; k < acc->m.n; k++)
            if (strcmp(acc->m.name[k], names.name[j]) == 0)
                v[j] = acc->m.v[k];
    v[names.n] = acc->count;
    if (t->lay.pp)
        comm_allreduce_sum(t->lay.pp, v, (size_t)names.n + 1, COMM_F64);
    sum_dist(t, v, names.n + 1);
    m->n = 0;
    if (v[names.n] > 0)
        for (int j = 0; j < names.n; j++) {
            memcpy(m->name[m->n], names.name[j], sizeof m->name[0]);
            m->v[m->n++] = v[j] / v[names.n];
        }
    free(v);
}

/* test.block_at=dp_barrier, trainers_barrier, in_dp_collective only: entering the update of step k, rank
 * test.block_rank makes a collective hang on purpose (for the tests of grpoctl diagnose's mismatch and stuck
 * verdicts); nothing in any other run. */
static void test_collective_hang(struct trainer *t, int64_t k)
{
    struct comm *dp = t->lay.dp_size > 1 ? t->lay.dp : NULL, *all = trainer_all_group(t);
    if (watchdog_test_here(WATCHDOG_AT_DP_BARRIER, k, "enters a barrier of its DP group that no other rank enters")) {
        if (!dp)
            check_failf(__FILE__, __LINE__, KEY_test_block_at "=dp_barrier: this rank has no DP group");
        comm_barrier(dp); /* the others enter the update's first collective of dp: the two never meet */
        check_failf(__FILE__, __LINE__, KEY_test_block_at "=dp_barrier: the barrier no other rank entered completed");
    }
    if (watchdog_test_here(WATCHDOG_AT_TRAINERS_BARRIER, k,
                           "enters a barrier of the trainers' group that no other rank enters")) {
        if (!all || all == t->lay.dp)
            check_failf(__FILE__, __LINE__, KEY_test_block_at "=trainers_barrier: no trainers' group beside DP");
        comm_barrier(all); /* the others wait in dp's collective for this rank, this rank here for them */
        check_failf(__FILE__, __LINE__,
                    KEY_test_block_at "=trainers_barrier: the barrier no other rank entered completed");
    }
    if (watchdog_test_here(WATCHDOG_AT_IN_DP_COLLECTIVE, k,
                           "freezes inside the update's first collective of its DP group")) {
        if (!dp)
            check_failf(__FILE__, __LINE__, KEY_test_block_at "=in_dp_collective: this rank has no DP group");
        comm_test_freeze(dp);
    }
}

/* Phase update_actor of step k: the PPO/GRPO update over the step's n_all sequences (gradients summed over the
 * DP group; on_policy: the update's own forward gives the old log-probs), and the traffic it made over DP. Its
 * seconds. */
static double update_actor(struct trainer *t, int64_t k, struct step_batch *b, const int *idx, bool on_policy,
                           double n_all, struct step_update *out, struct rc_metrics *rc)
{
    trainer_phase(t, GRPO__PHASE__PHASE_UPDATE_ACTOR);
    watchdog_test_point(WATCHDOG_AT_UPDATE, k); /* test.block_at=update_actor only */
    test_collective_hang(t, k);
    const double t0 = clock_now_s();
    const struct grpo_config *c = t->cfg;
    const double lr = lr_at(&t->lr, k - 1);
    struct update_params up = {
        .loss = t->loss,
        .agg = t->agg,
        .max_response_length =
            (int)(c->actor_loss_scale_factor > 0 ? c->actor_loss_scale_factor : c->data_max_response_length),
        .mini_batch_seqs = (int)(c->actor_ppo_mini_batch_size * c->rollout_n), /* sequences per optimizer step */
        .old_from_current = on_policy,
        .ppo_epochs = (int)c->actor_ppo_epochs,
        .grad_clip = c->actor_grad_clip,
        .lr = lr,
        .checkpointing = c->arr_model_enable_gradient_checkpointing,
        .temperature = logprob_temperature(c),
        .bt = {t->micro_actor, token_budget(t), t->share_prompts},
        .dp = t->lay.dp_size > 1 ? t->lay.dp : NULL,
        .grads = t->grads_dev ? t->grads_dev : t->lay.grads, /* on GPUs of their own: the NCCL twin */
        .dp_dev = t->dp_dev,
        .edp = t->edp_dev ? t->edp_dev : t->lay.edp,
        .dp_stage = t->host_params,
        .overlap = t->overlap,
        .zero = t->zero,
        .n_total = (int)n_all,
        .seed = trainer_step_seed(t->st.seed, k, 0xc1c0),
        .rc_acc = rc ? xcalloc(1, sizeof(struct rc_accum)) : NULL,
    };
    out->lr = lr;
    /* the gradient (and ZeRO-1 weight) traffic of the update over DP, in the planner's ring-model bytes */
    struct comm_traffic before = {0}, after = {0}, dev_before = {0}, dev_after = {0};
    struct comm *gg = up.grads ? up.grads : up.dp; /* the group the gradients sum over */
    if (gg)
        comm_traffic(gg, &before);
    if (up.dp_dev)
        comm_traffic(up.dp_dev, &dev_before);
    model_moe_stats(t->policy, NULL, NULL); /* the routing of the update's forwards alone */
    if (n_all > 0)
        actor_update(t->policy, t->opt, b->seqs, idx, b->n_seq, &up, &out->stats);
    if (rc)
        bypass_metrics(t, up.rc_acc, rc);
    free(up.rc_acc);
    moe_measure(t, out);
    if (gg)
        comm_traffic(gg, &after);
    if (up.dp_dev)
        comm_traffic(up.dp_dev, &dev_after);
    out->dp_bytes = 0;
    for (int op = COMM_OP_ALLREDUCE; op <= COMM_OP_REDUCE_SCATTER; op++)
        out->dp_bytes += after.sent_f32[op] - before.sent_f32[op] + dev_after.sent_f32[op] - dev_before.sent_f32[op];
    return clock_now_s() - t0;
}

/* The traffic of the model's groups so far (on GPUs the NCCL twins of lay.tp and lay.pp, which count what they
 * carry; zero without them). */
static void model_traffic_now(const struct trainer *t, struct comm_traffic *tp, struct comm_traffic *pp,
                              struct comm_traffic *ep, struct comm_traffic *cp)
{
    *tp = (struct comm_traffic){0};
    *pp = (struct comm_traffic){0};
    *ep = (struct comm_traffic){0};
    *cp = (struct comm_traffic){0};
    if (t->policy->sh.ep)
        comm_traffic(t->policy->sh.ep, ep);
    if (t->policy->sh.sp) /* Ulysses' all-to-alls, or the ring's sends (the reference runs over the same group) */
        comm_traffic(t->policy->sh.sp, cp);
    if (t->policy->sh.tp)
        comm_traffic(t->policy->sh.tp, tp);
    if (t->policy->sh.pp)
        comm_traffic(t->policy->sh.pp, pp);
}

/* The activation traffic of the model's groups since model_traffic_now gave tp_before and pp_before: over TP
 * every pass (old and reference log-probs, the update), over PP this stage's sends. */
static void model_traffic_since(const struct trainer *t, const struct comm_traffic *tp_before,
                                const struct comm_traffic *pp_before, const struct comm_traffic *ep_before,
                                const struct comm_traffic *cp_before, struct step_update *u)
{
    struct comm_traffic tp_after, pp_after, ep_after, cp_after;
    model_traffic_now(t, &tp_after, &pp_after, &ep_after, &cp_after);
    u->ep_bytes = ep_after.sent_f32[COMM_OP_ALLTOALL] - ep_before->sent_f32[COMM_OP_ALLTOALL];
    u->cp_bytes = 0;
    if (t->policy->sh.sp) { /* summed over the group: a Ulysses rank's share depends on where its slice falls */
        const int op = t->policy->sh.ring ? COMM_OP_SEND : COMM_OP_ALLTOALL;
        u->cp_bytes = cp_after.sent_f32[op] - cp_before->sent_f32[op];
        comm_allreduce_sum(t->policy->sh.sp, &u->cp_bytes, 1, COMM_F64);
    }
    u->tp_bytes = 0;
    for (int op = COMM_OP_ALLREDUCE; op <= COMM_OP_REDUCE_SCATTER; op++)
        u->tp_bytes += tp_after.sent_f32[op] - tp_before->sent_f32[op];
    u->pp_bytes = pp_after.sent_f32[COMM_OP_SEND] - pp_before->sent_f32[COMM_OP_SEND];
}

/* The rollout-vs-trainer log-prob gap: the sampler's log-probs against the trainer's old log-probs, over the model's
 * tokens (a token put in the response from outside has no sampler's log-prob). */
static void measure_gap(struct trainer *t, const struct step_batch *b, struct step_gap *out)
{
    double gap = 0, gap_max = 0, gap_n = 0;
    for (int i = 0; i < b->n_seq; i++)
        for (int q = 0; b->seqs[i].old_logp && b->seqs[i].gen_logp && q < b->seqs[i].resp_len; q++) {
            if (!rollout_seq_model_token(&b->seqs[i], q))
                continue;
            double d = fabs((double)b->seqs[i].gen_logp[q] - b->seqs[i].old_logp[q]);
            gap += d;
            gap_max = fmax(gap_max, d);
            gap_n++;
        }
    double sums[4] = {gap, gap_n, out->route_differ, out->route_compared};
    if (t->lay.pp) /* each stage compared its own layers */
        comm_allreduce_sum(t->lay.pp, sums + 2, 2, COMM_F64);
    sum_dist(t, sums, 4);
    out->sum = sums[0];
    out->n = sums[1];
    out->route_differ = sums[2], out->route_compared = sums[3];
    out->replay = t->policy->moe_replay;
    out->max = max_dist(t, gap_max);
}

/* The step's rollouts, decoded, to trainer.rollout_data_dir: one file a step, as verl writes. Each DP rank
 * makes its lines; DP rank 0 gathers them (their lengths all-gathered, then each rank's bytes sent to it in
 * 8-byte words) and writes the file in DP rank order. */
static void audit(struct trainer *t, int64_t k, struct step_batch *b)
{
    const char *dir = t->cfg->trainer_rollout_data_dir;
    if (!dir || !*dir)
        return;
    for (int i = 0; i < b->n_seq; i++)
        if (!b->resp_text[i])
            b->resp_text[i] = tokenizer_decode(t->tok, b->seqs[i].resp, (size_t)b->seqs[i].resp_len, true);
    if (t->lay.tp_rank != 0 || t->lay.cp_rank != 0) /* the TP and CP ranks of a DP rank hold the same sequences */
        return;
    size_t len;
    const struct audit_extras x = {.reward_baseline = t->est == ADV_REMAX,
                                   .part_names = t->gdpo_n ? (const char *const *)t->gdpo_keys : NULL,
                                   .versions = t->cfg->async_enable};
    char *mine = rollout_audit_text(k, (int)t->cfg->rollout_n, b, &x, &len);
    struct comm *dp = t->lay.dp && comm_size(t->lay.dp) > 1 ? t->lay.dp : NULL;
    if (!dp) {
        rollout_audit_save(dir, k, &mine, &len, 1);
        free(mine);
        return;
    }
    const int size = comm_size(dp), me = comm_rank(dp);
    int64_t *lens = xcalloc((size_t)size, sizeof *lens), l = (int64_t)len;
    comm_allgather(dp, &l, lens, 1, COMM_I64);
    if (me != 0) {
        const size_t words = (len + 7) / 8;
        if (words) {
            int64_t *buf = xcalloc(words, sizeof *buf);
            memcpy(buf, mine, len);
            comm_send(dp, buf, words, COMM_I64, 0);
            free(buf);
        }
    } else {
        char **parts = xcalloc((size_t)size, sizeof *parts);
        size_t *plen = xcalloc((size_t)size, sizeof *plen);
        parts[0] = mine, plen[0] = len;
        for (int r = 1; r < size; r++) {
            const size_t words = ((size_t)lens[r] + 7) / 8;
            parts[r] = xcalloc(words ? words : 1, sizeof(int64_t));
            plen[r] = (size_t)lens[r];
            if (words)
                comm_recv(dp, parts[r], words, COMM_I64, r);
        }
        rollout_audit_save(dir, k, parts, plen, size);
        for (int r = 1; r < size; r++)
            free(parts[r]);
        free(parts), free(plen);
    }
    free(lens);
    free(mine);
}

/* After the step's clock stops: the figures of the update summed over the ranks (the pipeline's waiting with
 * rollout ranks, the forward rows), and what the step held: memory (the policy context's peaks restart for the
 * next step), the data's epoch. */
static void measure_end(struct trainer *t, struct step_result *r)
{
    if (r->source.split && t->lay.pp) {
        double b[2] = {r->update.stats.pp_wait_s, r->update.stats.pp_schedule_s};
        comm_allreduce_sum(t->lay.pp, b, 2, COMM_F64);
        r->update.pp_wait_s = b[0];
        r->update.pp_schedule_s = b[1];
    }
    double fwd_rows = (double)r->update.stats.tokens_forward;
    sum_dist(t, &fwd_rows, 1);
    r->update.forward_rows = fwd_rows;
    r->res.rss_gb = proc_rss_gb();
    /* the trainers' largest peak (every DP, TP and PP rank): the leader's alone would hide an imbalance */
    double peak = proc_peak_rss_gb();
    if (t->lay.all && comm_size(t->lay.all) > 1)
        comm_allreduce_max(t->lay.all, &peak, 1, COMM_F64);
    r->res.peak_rss_gb = peak;
    r->res.epoch = t->st.epoch;
    /* idle on each rank: waiting for data outside collectives, and every second inside one (waiting for peers) */
    if (t->lay.all && comm_size(t->lay.all) > 1) {
        const double idle = r->source.wait_data - r->source.wait_meet + comm_wait_seconds() - t->wait_t0;
        double v[2] = {r->step_s > 0 ? idle / r->step_s : 0, 0};
        v[1] = v[0];
        comm_allreduce_max(t->lay.all, &v[0], 1, COMM_F64);
        comm_allreduce_sum(t->lay.all, &v[1], 1, COMM_F64);
        r->res.idle_ratio_max = v[0];
        r->res.idle_ratio_mean = v[1] / comm_size(t->lay.all);
        r->res.ranks = comm_size(t->lay.all);
    }
    /* AdamW's two FP32 moments on this rank: all of them, or its ZeRO-1 block */
    r->res.optimizer_state_gb = 2.0 * sizeof(float) * (double)t->opt->n / 1e9;
    r->res.mem = t->policy->K->mem;
    r->res.update_max_allocated_gb = (double)r->res.mem.max_allocated / 1e9;
    r->res.update_kv_gb = (double)r->res.mem.peak[KMEM_KV] / 1e9;
    if (t->gen_mem_set) { /* the step's peaks: the larger of generation's and the update's */
        const struct kmem_stats *g = &t->gen_mem;
        struct kmem_stats *s = &r->res.mem;
        for (int i = 0; i < KMEM_KINDS; i++)
            s->peak[i] = g->peak[i] > s->peak[i] ? g->peak[i] : s->peak[i];
        s->max_allocated = g->max_allocated > s->max_allocated ? g->max_allocated : s->max_allocated;
        s->max_reserved = g->max_reserved > s->max_reserved ? g->max_reserved : s->max_reserved;
        t->gen_mem_set = false;
    }
    kmem_reset_peaks(t->policy->K);
}

/* The trainer's part of step k on this rank's share b of the step's rollouts (all of them on one rank), begun at
 * t_step: its phases one after the other, each filling its part of the step's result, then the metrics made of
 * it (step_metrics.c). 0, or -1 when too many steps in a row skipped their update. */
static int train_batch(struct trainer *t, int64_t k, struct step_batch *b, const struct step_timing *tm, double t_step,
                       struct metrics *m)
{
    const struct grpo_config *c = t->cfg;
    struct step_result r = {.source = *tm,
                            .src = &t->src,
                            .model = &t->policy->cfg,
                            .tp = t->lay.tp != NULL,
                            .pp = t->lay.pp != NULL,
                            .ep = t->lay.ep != NULL,
                            .cp = t->policy->sh.sp != NULL,
                            .devices = t->lay.devices,
                            .dp = t->lay.dp_size > 1,
                            .survive = t->rec.point != NULL,
                            .keep_s = t->keep_s,
                            .peak_flops = t->peak_flops};
    r.phase_s[GRPO__PHASE__PHASE_GEN] = tm->gen;
    r.phase_s[GRPO__PHASE__PHASE_REWARD] = tm->reward;
    struct comm_traffic tp0, pp0, ep0, cp0;
    model_traffic_now(t, &tp0, &pp0, &ep0, &cp0);
    int *idx = xmalloc((size_t)(b->n_seq ? b->n_seq : 1) * sizeof(int)); /* every sequence of b */
    for (int i = 0; i < b->n_seq; i++)
        idx[i] = i;

    measure_rollouts(t, b, &r.rollouts);
    /* the update's forward is the old policy unless the old log-probs are needed before it (rollout correction's
     * weights and rejection) or are the sampler's (bypass mode) */
    const bool on_policy = one_update(c, r.rollouts.n_seq) && !sampler_is_old(t) && !rollout_corr_active(&t->corr) &&
                           !c->actor_calculate_sum_pi_squared; /* sum_pi_sq comes from the old-log-prob pass */
    r.rc = xcalloc(1, sizeof *r.rc);
    /* the rollout's routes against the policy's own routing where the old log-probs are taken (the old-log-prob
     * pass, or on policy the update's forwards, all before its one optimizer step) */
    model_moe_route_stats(t->policy, &r.gap.route_differ, &r.gap.route_compared);
    if (!on_policy) {
        r.phase_s[GRPO__PHASE__PHASE_OLD_LOG_PROB] = old_log_probs(t, b, idx);
        comm_test_hold("logprob"); /* tests: a rank dies in the forwards, its old log-probs taken, the ref's not */
        model_moe_route_stats(t->policy, &r.gap.route_differ, &r.gap.route_compared);
    }
    if (c->actor_use_kl_loss || c->alg_use_kl_in_reward)
        r.phase_s[GRPO__PHASE__PHASE_REF] = ref_log_probs(t, b, idx);
    const double t_adv = clock_now_s();
    if (!t->corr.bypass && rollout_corr_active(&t->corr)) /* before the advantages: rejection narrows their mask */
        rollout_correction(t, b, true, r.rc);
    advantages(t, b, &r.adv);
    r.phase_s[GRPO__PHASE__PHASE_ADV] = clock_now_s() - t_adv;
    /* batch-invariant mode: the update's forwards give no log-prob that is compared with the sampler's unless they
     * are the old policy's (on policy) or bypass mode's current policy against the sampler, so the others take the
     * faster kernels (the process does nothing else meanwhile: generation and training are its phases in turn) */
    const bool invariant = k_batch_invariant();
    if (invariant && !on_policy && !t->corr.bypass)
        k_set_batch_invariant(false);
    r.phase_s[GRPO__PHASE__PHASE_UPDATE_ACTOR] =
        update_actor(t, k, b, idx, on_policy, r.rollouts.n_seq, &r.update, t->corr.bypass ? r.rc : NULL);
    k_set_batch_invariant(invariant);
    model_traffic_since(t, &tp0, &pp0, &ep0, &cp0, &r.update);
    if (on_policy)
        model_moe_route_stats(t->policy, &r.gap.route_differ, &r.gap.route_compared);
    measure_gap(t, b, &r.gap);
    if (!t->corr.bypass && !rollout_corr_active(&t->corr)) /* metrics alone (verl's whenever rollout log-probs exist) */
        rollout_correction(t, b, false, r.rc);
    audit(t, k, b);
    r.step_s = clock_now_s() - t_step;
    measure_end(t, &r);
    free(idx);

    step_metrics(m, &r);
    free(r.rc);
    if (r.update.stats.optimizer_steps == 0) /* nothing to train on: neither a skip nor an update */
        return 0;
    return count_skipped(t, k, r.update.stats.skipped_steps == r.update.stats.optimizer_steps,
                         r.update.stats.grad_norm);
}

/* For the tests only: GRPO_TEST_UPDATE_SLEEP_S=S makes each step's update S seconds longer (a slow trainer, so
 * that rollout ranks wait for it to take their batches: tests/mpi/test_dist_grpod.sh). */
static void test_slow_update(void)
{
    static double sleep_s = -1;
    clock_test_sleep("GRPO_TEST_UPDATE_SLEEP_S", &sleep_s);
}

/* One GRPO step: the source's batch (local generation, or batches from the rollout ranks), then the update. */
int trainer_grpo_step(struct trainer *t, struct metrics *m)
{
    const int64_t k = t->st.global_step + 1;
    double t_step = t->iter_t0 > 0 ? t->iter_t0 : clock_now_s();
    struct step_timing tm = {0};
    struct step_batch b = {0};
    if (check_fit(t) != 0)
        return -1;
    const bool give_back = t->src.generates && t->cfg->rollout_free_cache_engine;
    if (give_back) { /* generation gets the training phase's memory: the gradients and activation buffers */
        model_free_grads(t->policy);
        model_release_buffers(t->policy, MODEL_BUF_TRAIN);
        if (t->ref)
            model_release_buffers(t->ref, MODEL_BUF_TRAIN);
    }
    /* trainer.survive_trainer_loss on a GPU: the step's start copied out beside generation (not before those frees,
     * each of which would wait for it) */
    trainer_keep_issue(t);
    if (t->src.generates) /* generation's peaks from here */
        kmem_reset_peaks(t->policy->K);
    int rc = t->src.next_batch(t->src.ctx, k, &b, &tm);
    if (give_back) /* and the update gets generation's (the KV caches went with each generation call) */
        model_release_buffers(t->policy, MODEL_BUF_GEN);
    if (t->src.generates) { /* the generation phase's peak, apart from the update's */
        struct kmem_stats *mem = &t->policy->K->mem;
        tm.gen_here = true;
        tm.gen_max_allocated_gb = (double)mem->max_allocated / 1e9;
        tm.gen_grads_gb = (double)mem->peak[KMEM_GRADS] / 1e9;
        t->gen_mem = *mem; /* merged into the step's peaks at its end (measure_end) */
        t->gen_mem_set = true;
        kmem_reset_peaks(t->policy->K);
    }
    if (rc == 0) {
        const double t_meet = clock_now_s();
        trainer_meet(t); /* waiting for the other DP ranks' data is waiting for data */
        tm.wait_meet = clock_now_s() - t_meet;
        tm.wait_data += tm.wait_meet;
        test_slow_update();
        rc = train_batch(t, k, &b, &tm, t_step, m);
    }
    step_batch_free(&b);
    return rc;
}
