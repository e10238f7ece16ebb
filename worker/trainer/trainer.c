#include "trainer.h"

#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "actor.h"
#include "checkpoint.h"
#include "common/check.h"
#include "common/fs.h"
#include "common/config.h"
#include "common/log.h"
#include "prompts.h"
#include "worker/comm/comm.h"
#include "worker/rollout/audit.h"
#include "worker/rollout/batch.h"
#include "worker/rollout/validate.h"
#include "worker/data/dataset.h"
#include "worker/metrics/metrics.h"
#include "worker/model/generate.h"
#include "worker/model/model_io.h"
#include "worker/rewards/reward.h"
#include "worker/tokenizer/tokenizer.h"

struct trainer {
    const struct grpo_config *cfg;
    struct trainer_hooks hooks;
    struct model *policy, *ref;
    struct tokenizer *tok;
    struct adamw *opt;
    struct reward_fn *reward;
    struct prompt_set train, val;
    struct run_state st;
    struct data_cursor cursor; /* position in the training prompts */
    bool cursor_open;
    int64_t saved_step; /* step of the newest checkpoint written by this process (-1: none) */
    char run_dir[2048], ckpt_root[2100];
    struct metrics_logger logger; /* JSONL, TensorBoard, console, SVG chart (with the run's history) */
    bool logger_open;
    struct rollout_ctx rc;     /* generation and scoring with the policy (hybrid steps, validation) */
    struct trainer_layout lay; /* this rank in the trainers' DP group */
    struct trainer_source src; /* where each step's rollouts come from */
    double iter_t0;            /* start of this loop iteration: the step time includes the safe point's work */
    int64_t warmup;
    double peak_flops; /* measured sgemm FLOP/s x threads, the MFU denominator */
    struct policy_loss_params loss;
    enum loss_agg agg;
    enum adv_estimator est;
    enum kl_type kl_reward_type;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void phase(struct trainer *t, const char *name)
{
    if (t->hooks.phase)
        t->hooks.phase(t->hooks.ctx, t->st.global_step + 1, name);
}

static int safe_point(struct trainer *t)
{
    return t->hooks.safe_point ? t->hooks.safe_point(t->hooks.ctx, t->st.global_step) : TRAINER_CONTINUE;
}

/* Seeds of step k's random draws: a pure function of the base seed and k, so a resumed run draws the same. */
static uint64_t step_seed(uint64_t seed, int64_t step, uint64_t salt) { return rollout_step_seed(seed, step, salt); }

/* FLOPs of one token's forward through the model's matrix products at context length ctx (attention
 * included); backward is twice the forward. */
static double flops_per_token(const struct model_config *c, double ctx)
{
    const double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    const double QD = (double)c->n_heads * c->head_dim, KD = (double)c->n_kv_heads * c->head_dim;
    const double per_layer = 2 * (D * QD + 2 * D * KD + QD * D + 3 * D * F) + 4 * QD * ctx / 2; /* causal half */
    return c->n_layers * per_layer + 2 * V * D;
}

/* Achievable sgemm FLOP/s of this process (all its OpenBLAS threads), measured once: MFU's denominator. */
static double measure_peak_flops(void)
{
    const int n = 384;
    float *a = xcalloc((size_t)n * n, sizeof(float)), *b = xcalloc((size_t)n * n, sizeof(float)),
          *c = xcalloc((size_t)n * n, sizeof(float));
    for (int i = 0; i < n * n; i++)
        a[i] = b[i] = (float)(i % 7) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n); /* warm */
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        double dt = now_s() - t0;
        if (dt > 0 && 2.0 * n * n * n / dt > best)
            best = 2.0 * n * n * n / dt;
    }
    free(a), free(b), free(c);
    return best > 0 ? best : 1e9;
}

static int64_t compute_total_steps(const struct grpo_config *cfg, int n_train)
{
    if (cfg->trainer_total_training_steps > 0)
        return cfg->trainer_total_training_steps;
    int64_t per_epoch = n_train / cfg->data_train_batch_size;
    return per_epoch * cfg->trainer_total_epochs;
}

/* ------------------------------------------------------------------ rollouts */

/* The next train_batch_size prompts (verl's sampler with drop_last); the cursor is part of the run state. */
static void draw_prompts(struct trainer *t, const struct prompt_item **out, int *uids, int n)
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

/* Statistics of values held across the DP ranks: PREFIX/mean|max|min over all of them. */
static void set_stats_dist(struct trainer *t, struct metrics *m, const char *prefix, const double *v, size_t n)
{
    if (!t->lay.dp || t->lay.dp_size < 2) {
        metrics_set_stats(m, prefix, v, n);
        return;
    }
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
    metrics_set_stats3(m, prefix, sum, mx, mn, (size_t)k);
}

/* Sum of a value over the DP ranks. */
static double sum_dist(struct trainer *t, double v)
{
    if (t->lay.dp && t->lay.dp_size > 1)
        comm_allreduce_sum(t->lay.dp, &v, 1, COMM_F64);
    return v;
}

/* Advantages of every response token (and the in-reward KL, when on). */
static void compute_advantages(struct trainer *t, struct step_batch *b, struct metrics *m)
{
    const struct grpo_config *c = t->cfg;
    const int n = b->n_seq;
    double *scalar = xmalloc((size_t)(n ? n : 1) * sizeof(double));
    int *group = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int *off = xmalloc((size_t)(n ? n : 1) * sizeof(int)), *len = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    int total = 0;
    for (int i = 0; i < n; i++) {
        off[i] = total;
        len[i] = b->seqs[i].resp_len;
        total += len[i];
        group[i] = b->seqs[i].group;
    }
    double *tok_r = xcalloc((size_t)(total ? total : 1), sizeof(double));
    double kl_sum = 0;
    for (int i = 0; i < n; i++) {
        const struct rollout_seq *s = &b->seqs[i];
        double sum = 0;
        for (int k = 0; k < s->resp_len; k++) {
            double r = k == s->resp_len - 1 ? s->score : 0.0;
            if (c->alg_use_kl_in_reward) {
                double d, kl = kl_estimate(t->kl_reward_type, s->old_logp[k], s->ref_logp[k], &d);
                r -= c->alg_kl_ctrl_kl_coef * kl;
                kl_sum += kl;
            }
            tok_r[off[i] + k] = r;
            sum += r;
        }
        scalar[i] = sum;
    }
    if (c->alg_use_kl_in_reward && total)
        metrics_set(m, "actor/reward_kl_penalty", kl_sum / total);
    double *tok_adv = xcalloc((size_t)(total ? total : 1), sizeof(double));
    if (t->est == ADV_REINFORCE_PP) {
        reinforce_pp_advantages(tok_r, off, len, n, tok_adv);
    } else {
        double *adv = xmalloc((size_t)(n ? n : 1) * sizeof(double));
        outcome_advantages(t->est, c->alg_norm_adv_by_std_in_grpo, scalar, group, n, adv);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < len[i]; k++)
                tok_adv[off[i] + k] = adv[i];
        free(adv);
    }
    for (int i = 0; i < n; i++) {
        b->seqs[i].adv = xmalloc((size_t)(len[i] ? len[i] : 1) * sizeof(double));
        memcpy(b->seqs[i].adv, tok_adv + off[i], (size_t)len[i] * sizeof(double));
    }
    set_stats_dist(t, m, "critic/advantages", tok_adv, (size_t)total);
    set_stats_dist(t, m, "critic/rewards", scalar, (size_t)n);
    free(scalar), free(group), free(off), free(len), free(tok_r), free(tok_adv);
}

/* -------------------------------------------------------------------- steps */

/* Supervised warm-start step: maximise the log-likelihood of reference answers (synthetic tasks). */
static int sft_step(struct trainer *t, int64_t k, struct metrics *m)
{
    const struct grpo_config *c = t->cfg;
    const int B = (int)c->data_train_batch_size;
    const struct prompt_item **prompts = xmalloc((size_t)B * sizeof *prompts);
    draw_prompts(t, prompts, NULL, B);
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
        log_error("trainer", "trainer.sft_warmup_steps needs reference answers; this dataset has none");
        return -1;
    }
    /* maximise mean token log-likelihood: dL/dlogp = -1/T over the answer tokens */
    model_alloc_grads(t->policy);
    model_zero_grads(t->policy);
    long long T = 0;
    double nll = 0;
    for (int i = 0; i < n; i++)
        T += seqs[i].resp_len;
    int **groups, *counts;
    int nb = split_micro_batches(seqs, idx, n, (int)c->actor_ppo_micro_batch_size_per_gpu, 0, &groups, &counts);
    for (int g = 0; g < nb; g++) {
        struct micro_batch mb;
        micro_batch_build(&mb, seqs, groups[g], counts[g]);
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
    double norm = grad_clip(t->policy->grad->mem, t->policy->grad->n_floats, c->actor_grad_clip);
    if (isfinite(norm))
        adamw_step(t->opt, t->policy->w.mem, t->policy->grad->mem, c->trainer_sft_warmup_lr);
    metrics_set(m, "sft/nll", nll / (double)T);
    metrics_set(m, "sft/grad_norm", norm);
    metrics_set(m, "sft/step", (double)k);
    rollout_seqs_free(seqs, n);
    free(seqs), free(idx);
    return 0;
}

/* Validation: greedy (or val_kwargs) generation on the held-out prompts, scored per data_source. */
static void validate(struct trainer *t, struct metrics *m)
{
    if (t->val.n == 0)
        return;
    phase(t, "validate");
    rollout_validate(&t->rc, &t->val, step_seed(t->st.seed, t->st.global_step, 0x7a1), m);
}

/* Step k's rollouts in this process (hybrid role): draw, generate, score, and with DAPO's dynamic sampling draw
 * again until enough groups carry a learning signal. */
static int hybrid_batch(void *ctx, int64_t k, struct step_batch *b, struct step_timing *tm, struct metrics *m)
{
    struct trainer *t = ctx;
    const struct grpo_config *c = t->cfg;
    const int B = (int)c->data_train_batch_size, n = (int)c->rollout_n;
    const struct prompt_item **prompts = xmalloc((size_t)B * sizeof *prompts);
    int *uids = xmalloc((size_t)B * sizeof(int));
    struct sampler_params sp = {(float)c->rollout_temperature, (float)c->rollout_top_p, (int)c->rollout_top_k};
    int rounds = c->alg_filter_groups_enable ? (int)c->alg_filter_groups_max_num_gen_batches : 1;
    int drawn = 0;
    for (int r = 0; r < rounds; r++) {
        phase(t, "gen");
        draw_prompts(t, prompts, uids, B);
        drawn += B;
        rollout_generate_and_score(&t->rc, prompts, uids, B, 0, &sp, n, step_seed(t->st.seed, k, (uint64_t)r), b,
                                   &tm->gen, &tm->reward);
        if (!c->alg_filter_groups_enable)
            break;
        step_batch_filter_groups(b);
        if (b->n_groups >= B)
            break;
    }
    free(prompts);
    free(uids);
    if (c->alg_filter_groups_enable) {
        step_batch_truncate_groups(b, B);
        metrics_set(m, "train/num_gen_batches", (double)drawn / B);
        metrics_set(m, "train/num_kept_groups", b->n_groups);
    }
    for (int i = 0; i < b->n_seq; i++) /* after filtering, positions in this batch are the step's order */
        b->seqs[i].gidx = i;
    return 0;
}

/* The trainer's part of step k on this rank's share b of the step's rollouts (all of them on one rank):
 * metrics of the rollouts, old and reference log-probs, advantages, the update (gradients summed over the DP
 * group), the audit dump. */
static int train_batch(struct trainer *t, int64_t k, struct step_batch *b, const struct step_timing *tm, double t_step,
                       struct metrics *m)
{
    const struct grpo_config *c = t->cfg;
    const int n = (int)c->rollout_n;
    /* scores and lengths: verl's critic/ and response_length/ metrics */
    double *v = xmalloc((size_t)(b->n_seq ? b->n_seq : 1) * sizeof(double));
    long long tokens = 0;
    int clipped = 0;
    for (int i = 0; i < b->n_seq; i++)
        v[i] = b->seqs[i].score;
    set_stats_dist(t, m, "critic/score", v, (size_t)b->n_seq);
    for (int i = 0; i < b->n_seq; i++) {
        v[i] = b->seqs[i].resp_len;
        clipped += !b->seqs[i].stopped && b->seqs[i].resp_len >= c->data_max_response_length;
        tokens += b->seqs[i].prompt_len + b->seqs[i].resp_len;
    }
    set_stats_dist(t, m, "response_length", v, (size_t)b->n_seq);
    const double n_all = sum_dist(t, b->n_seq);
    metrics_set(m, "response_length/clip_ratio", n_all ? sum_dist(t, clipped) / n_all : 0);
    double plen = 0;
    for (int i = 0; i < b->n_seq; i++)
        plen += b->seqs[i].prompt_len;
    metrics_set(m, "prompt_length/mean", n_all ? sum_dist(t, plen) / n_all : 0);
    free(v);
    const long long tokens_all = (long long)sum_dist(t, (double)tokens);

    int *idx = xmalloc((size_t)(b->n_seq ? b->n_seq : 1) * sizeof(int));
    for (int i = 0; i < b->n_seq; i++)
        idx[i] = i;
    const struct batching lp_bt = {(int)c->rollout_log_prob_micro_batch_size_per_gpu,
                                   c->actor_use_dynamic_bsz ? (int)c->actor_ppo_max_token_len_per_gpu : 0};
    const struct batching ref_bt = {(int)c->ref_log_prob_micro_batch_size_per_gpu, lp_bt.micro_tokens};
    /* one optimizer step per training step: the update's own forward gives the old log-probs exactly */
    const int mini_seqs = (int)(c->actor_ppo_mini_batch_size * n);
    const bool on_policy = c->actor_ppo_epochs == 1 && n_all <= mini_seqs && !c->alg_use_kl_in_reward;
    double t0 = rollout_now_s(), t_old = 0, t_ref = 0;
    if (!on_policy) {
        phase(t, "old_log_prob");
        actor_compute_logp(t->policy, b->seqs, idx, b->n_seq, &lp_bt, (float)c->rollout_temperature, 0);
        t_old = rollout_now_s() - t0;
    }
    if (c->actor_use_kl_loss || c->alg_use_kl_in_reward) {
        phase(t, "ref");
        t0 = rollout_now_s();
        actor_compute_logp(t->ref, b->seqs, idx, b->n_seq, &ref_bt, (float)c->rollout_temperature, 1);
        t_ref = rollout_now_s() - t0;
    }
    phase(t, "adv");
    t0 = rollout_now_s();
    compute_advantages(t, b, m);
    double t_adv = rollout_now_s() - t0;

    phase(t, "update_actor");
    t0 = rollout_now_s();
    const double lr = lr_at(strcmp(c->actor_optim_warmup_style, "cosine") == 0 ? LR_COSINE : LR_CONSTANT,
                            c->actor_optim_lr, k - 1, t->warmup, t->st.total_steps, c->actor_optim_min_lr_ratio);
    struct update_params up = {
        .loss = t->loss,
        .agg = t->agg,
        .max_response_length = (int)c->data_max_response_length,
        .mini_batch_seqs = mini_seqs,
        .old_from_current = on_policy,
        .ppo_epochs = (int)c->actor_ppo_epochs,
        .grad_clip = c->actor_grad_clip,
        .lr = lr,
        .checkpointing = c->arr_model_enable_gradient_checkpointing,
        .temperature = (float)c->rollout_temperature,
        .bt = {(int)c->actor_ppo_micro_batch_size_per_gpu,
               c->actor_use_dynamic_bsz ? (int)c->actor_ppo_max_token_len_per_gpu : 0},
        .dp = t->lay.dp_size > 1 ? t->lay.dp : NULL,
        .n_total = (int)n_all,
    };
    struct update_stats us = {0};
    if (n_all > 0)
        actor_update(t->policy, t->opt, b->seqs, idx, b->n_seq, &up, &us);
    double t_update = rollout_now_s() - t0;
    /* rollout-vs-trainer log-prob gap: the sampler's log-probs against the trainer's old log-probs */
    double gap = 0, gap_max = 0, gap_n = 0;
    for (int i = 0; i < b->n_seq; i++)
        for (int q = 0; b->seqs[i].old_logp && b->seqs[i].gen_logp && q < b->seqs[i].resp_len; q++) {
            double d = fabs((double)b->seqs[i].gen_logp[q] - b->seqs[i].old_logp[q]);
            gap += d;
            gap_max = fmax(gap_max, d);
            gap_n++;
        }
    gap = sum_dist(t, gap);
    gap_n = sum_dist(t, gap_n);
    if (t->lay.dp && t->lay.dp_size > 1) {
        double *all = xmalloc((size_t)t->lay.dp_size * sizeof(double));
        comm_allgather(t->lay.dp, &gap_max, all, 1, COMM_F64);
        for (int r = 0; r < t->lay.dp_size; r++)
            gap_max = fmax(gap_max, all[r]);
        free(all);
    }
    metrics_set(m, "training/rollout_probs_diff_mean", gap_n ? gap / gap_n : 0);
    metrics_set(m, "training/rollout_probs_diff_max", gap_max);
    for (int i = 0; i < b->n_seq; i++)
        if (!b->resp_text[i])
            b->resp_text[i] = tokenizer_decode(t->tok, b->seqs[i].resp, (size_t)b->seqs[i].resp_len, true);
    rollout_audit_write(c->trainer_rollout_data_dir, k, t->lay.dp_rank, n, b);

    metrics_set(m, "actor/pg_loss", us.pg_loss);
    metrics_set(m, "actor/kl_loss", us.kl_loss);
    metrics_set(m, "actor/entropy", us.entropy);
    metrics_set(m, "actor/pg_clipfrac", us.pg_clipfrac);
    metrics_set(m, "actor/pg_clipfrac_lower", us.pg_clipfrac_lower);
    metrics_set(m, "actor/ppo_kl", us.ppo_kl);
    metrics_set(m, "actor/grad_norm", us.grad_norm);
    metrics_set(m, "actor/lr", lr);
    const double step_time = rollout_now_s() - t_step;
    metrics_set(m, "timing_s/gen", tm->gen);
    metrics_set(m, "timing_s/reward", tm->reward);
    metrics_set(m, "timing_s/old_log_prob", t_old);
    metrics_set(m, "timing_s/ref", t_ref);
    metrics_set(m, "timing_s/adv", t_adv);
    metrics_set(m, "timing_s/update_actor", t_update);
    metrics_set(m, "timing_s/step", step_time);
    if (tm->split) {
        metrics_set(m, "timing_s/wait_data", tm->wait_data);
        metrics_set(m, "trainer/idle_ratio", step_time > 0 ? tm->wait_data / step_time : 0);
        const double busy = tm->gen + tm->reward;
        metrics_set(m, "perf/cpu_memory_peak_gb/rollout", tm->rollout_peak_rss_gb);
        metrics_set(m, "rollouter/idle_ratio",
                    busy + tm->rollout_idle > 0 ? tm->rollout_idle / (busy + tm->rollout_idle) : 0);
    }
    metrics_set(m, "perf/total_num_tokens", (double)tokens_all);
    /* verl: tokens / (step time x devices) */
    const int devices = t->lay.devices > 0 ? t->lay.devices : 1;
    metrics_set(m, "perf/throughput", step_time > 0 ? (double)tokens_all / step_time / devices : 0);
    double ctx = n_all ? (double)tokens_all / n_all : 0;
    double flops = 3.0 * flops_per_token(&t->policy->cfg, ctx) * (double)us.tokens_forward;
    metrics_set(m, "perf/mfu/actor", t_update > 0 ? flops / t_update / t->peak_flops : 0);
    metrics_set(m, "perf/cpu_memory_used_gb", proc_rss_gb());
    /* the trainers' largest peak: DP rank 0's alone would hide an imbalance */
    double peak = proc_peak_rss_gb();
    if (t->lay.dp && t->lay.dp_size > 1) {
        double *all = xmalloc((size_t)t->lay.dp_size * sizeof(double));
        comm_allgather(t->lay.dp, &peak, all, 1, COMM_F64);
        for (int r = 0; r < t->lay.dp_size; r++)
            peak = fmax(peak, all[r]);
        free(all);
    }
    metrics_set(m, tm->split ? "perf/cpu_memory_peak_gb/trainer" : "perf/cpu_memory_peak_gb", peak);
    metrics_set(m, "training/epoch", (double)t->st.epoch);
    free(idx);
    return 0;
}

/* One GRPO step: the source's batch (local generation, or batches from the rollout ranks), then the update. */
static int grpo_step(struct trainer *t, struct metrics *m)
{
    const int64_t k = t->st.global_step + 1;
    double t_step = t->iter_t0 > 0 ? t->iter_t0 : rollout_now_s();
    struct step_timing tm = {0};
    struct step_batch b = {0};
    int rc = t->src.next_batch(t->src.ctx, k, &b, &tm, m);
    if (rc == 0)
        rc = train_batch(t, k, &b, &tm, t_step, m);
    step_batch_free(&b);
    return rc;
}

/* ------------------------------------------------------------- life cycle */

int trainer_save_checkpoint(struct trainer *t)
{
    if (t->lay.dp_rank != 0)
        return 0; /* DP rank 0 writes for every replica: the weights and optimizer state are the same */
    phase(t, "checkpoint");
    char err[1024];
    double t0 = now_s();
    if (checkpoint_save(t->ckpt_root, t->policy, t->opt, t->tok, &t->st, (int)t->cfg->trainer_max_actor_ckpt_to_keep,
                        err, sizeof err) != 0) {
        log_error("checkpoint", "%s", err);
        return -1;
    }
    t->saved_step = t->st.global_step;
    if (t->logger_open)
        metrics_logger_sync(&t->logger); /* metrics up to this checkpoint are durable too */
    log_info("checkpoint", "step %lld saved in %.1fs under %s", (long long)t->st.global_step, now_s() - t0,
             t->ckpt_root);
    return 0;
}

/* End of the supervised warm-start: GRPO starts from here, so this is the reference policy (KL is measured
 * against it) and the optimizer starts afresh. The reference is kept in RUN_DIR/reference for resumes. */
static int finish_warm_start(struct trainer *t)
{
    char dir[2300], err[1024];
    snprintf(dir, sizeof dir, "%s/reference", t->run_dir);
    if (t->ref)
        memcpy(t->ref->w.mem, t->policy->w.mem, t->policy->w.n_floats * sizeof(float));
    if (model_save_hf(t->policy, dir, 0, err, sizeof err) != 0) {
        log_error("trainer", "saving the warm-started reference: %s", err);
        return -1;
    }
    memset(t->opt->m, 0, t->opt->n * sizeof(float));
    memset(t->opt->v, 0, t->opt->n * sizeof(float));
    t->opt->t = 0;
    log_info("trainer", "supervised warm-start done at step %lld: reference policy saved in %s, GRPO starts",
             (long long)t->st.global_step, dir);
    return 0;
}

static void log_step(struct trainer *t, int64_t step, struct metrics *m)
{
    if (t->logger_open)
        metrics_logger_log(&t->logger, step, m); /* also redraws the run's SVG chart */
    if (t->hooks.step_done)
        t->hooks.step_done(t->hooks.ctx, step, t->st.total_steps, m);
}

/* FNV-1a of the parameters' bytes. */
static uint64_t params_checksum(const struct model *p)
{
    const unsigned char *b = (const unsigned char *)p->w.mem;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < p->w.n_floats * sizeof(float); i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Every DP rank must hold the same weights after a step; -1 (logged) if any differs. */
static int check_replicas(struct trainer *t, int64_t k)
{
    if (!t->lay.dp || t->lay.dp_size < 2)
        return 0;
    int64_t mine = (int64_t)params_checksum(t->policy);
    int64_t *all = xmalloc((size_t)t->lay.dp_size * sizeof *all);
    comm_allgather(t->lay.dp, &mine, all, 1, COMM_I64);
    int bad = 0;
    for (int r = 0; r < t->lay.dp_size; r++)
        bad += all[r] != all[0];
    if (bad)
        log_error("trainer", "step %lld: weights differ between DP ranks (checksum %016llx here, %016llx on DP rank 0)",
                  (long long)k, (unsigned long long)mine, (unsigned long long)all[0]);
    else
        log_debug("trainer", "step %lld: weights identical on %d DP ranks (checksum %016llx)", (long long)k,
                  t->lay.dp_size, (unsigned long long)mine);
    free(all);
    return bad ? -1 : 0;
}

/* While a DP rank waits for DP rank 0's decision: hold here if the run is paused, so every rank reports it. */
static void answer_control(void *ud) { safe_point(ud); }

/* The safe point's decision, DP rank 0's for every DP rank. */
static int decide(struct trainer *t)
{
    int act = t->lay.dp_rank == 0 ? safe_point(t) : TRAINER_CONTINUE;
    if (t->lay.dp && t->lay.dp_size > 1) /* stop and checkpoint follow DP rank 0 */
        comm_broadcast_polled(t->lay.dp, &act, 1, COMM_I32, 0,
                              t->lay.dp_rank && t->hooks.safe_point ? answer_control : NULL, t);
    return act;
}

int trainer_run(struct trainer *t)
{
    const struct grpo_config *c = t->cfg;
    const bool writer = t->lay.dp_rank == 0;
    struct metrics m;
    metrics_init(&m);
    int rc = 0;
    if (t->st.global_step == 0 && c->trainer_val_before_train && writer) {
        validate(t, &m);
        log_step(t, 0, &m);
        metrics_clear(&m);
    }
    while (t->st.global_step < t->st.total_steps) {
        t->iter_t0 = rollout_now_s();
        int act = decide(t);
        /* a stop checkpoints too, unless this step is already saved */
        if ((act & (TRAINER_CHECKPOINT | TRAINER_STOP)) && t->saved_step != t->st.global_step && writer)
            trainer_save_checkpoint(t);
        if (t->src.between_steps && t->src.between_steps(t->src.ctx, t->st.global_step, act & TRAINER_STOP) != 0) {
            rc = -1;
            break;
        }
        if (act & TRAINER_STOP) {
            log_info("trainer", "stop requested at step %lld: checkpoint written, ending",
                     (long long)t->st.global_step);
            break;
        }
        const int64_t k = t->st.global_step + 1;
        metrics_clear(&m);
        int r = k <= c->trainer_sft_warmup_steps ? sft_step(t, k, &m) : grpo_step(t, &m);
        if (r == 0)
            r = check_replicas(t, k);
        if (r != 0) {
            rc = -1;
            break;
        }
        t->st.global_step = k;
        if (k == c->trainer_sft_warmup_steps && writer && finish_warm_start(t) != 0) {
            rc = -1;
            break;
        }
        /* validate on test_freq, at the last step, and where the warm-start hands over to GRPO */
        if (writer && ((c->trainer_test_freq > 0 && k % c->trainer_test_freq == 0) || k == t->st.total_steps ||
                       k == c->trainer_sft_warmup_steps))
            validate(t, &m);
        log_step(t, k, &m);
        if (writer && ((c->trainer_save_freq > 0 && k % c->trainer_save_freq == 0) || k == t->st.total_steps))
            if (trainer_save_checkpoint(t) != 0) {
                rc = -1;
                break;
            }
    }
    if (rc == 0 && t->st.global_step >= t->st.total_steps && t->src.between_steps)
        rc = t->src.between_steps(t->src.ctx, t->st.global_step, true);
    metrics_free(&m);
    if (t->logger_open)
        metrics_logger_sync(&t->logger);
    return rc;
}

/* The bundled SmolLM2-135M-Instruct: its converted HF directory in the cache if present, else the GGUF.
 * On failure out holds the cache directory. */
int trainer_bundled_model_path(char *out, size_t len)
{
    const char *cache = getenv("GRPO_CACHE");
    char dir[2048];
    if (cache && *cache)
        snprintf(dir, sizeof dir, "%s", cache);
    else
        snprintf(dir, sizeof dir, "%s/.cache/grpo", getenv("HOME") ? getenv("HOME") : ".");
    snprintf(out, len, "%s/SmolLM2-135M-Instruct/config.json", dir);
    if (access(out, R_OK) == 0) {
        snprintf(out, len, "%s/SmolLM2-135M-Instruct", dir);
        return 0;
    }
    snprintf(out, len, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    if (access(out, R_OK) == 0)
        return 0;
    snprintf(out, len, "%s", dir);
    return -1;
}

struct trainer *trainer_create(const struct grpo_config *cfg, const struct trainer_hooks *hooks, char *err,
                               size_t errlen)
{
    return trainer_create_dist(cfg, hooks, NULL, NULL, err, errlen);
}

struct trainer *trainer_create_dist(const struct grpo_config *cfg, const struct trainer_hooks *hooks,
                                    const struct trainer_layout *lay, const struct trainer_source *src, char *err,
                                    size_t errlen)
{
    struct trainer *t = xcalloc(1, sizeof *t);
    t->cfg = cfg;
    t->saved_step = -1;
    if (hooks)
        t->hooks = *hooks;
    t->lay = lay ? *lay : (struct trainer_layout){.dp_size = 1};
    if (t->lay.dp_size < 1)
        t->lay.dp_size = 1;
    t->src = src && src->next_batch ? *src : (struct trainer_source){.ctx = t, .next_batch = hybrid_batch};
    t->est = (enum adv_estimator)adv_estimator_from_name(cfg->alg_adv_estimator);
    t->agg = (enum loss_agg)loss_agg_from_name(cfg->actor_loss_agg_mode);
    t->kl_reward_type = (enum kl_type)kl_type_from_name(cfg->alg_kl_penalty);
    t->loss = (struct policy_loss_params){
        .clip_low = cfg->actor_clip_ratio_low,
        .clip_high = cfg->actor_clip_ratio_high,
        .clip_c = cfg->actor_clip_ratio_c,
        .use_kl_loss = cfg->actor_use_kl_loss,
        .kl_type = (enum kl_type)kl_type_from_name(cfg->actor_kl_loss_type),
        .kl_coef = cfg->actor_kl_loss_coef,
        .entropy_coeff = cfg->actor_entropy_coeff,
    };
    if (cfg->trainer_num_threads > 0)
        openblas_set_num_threads((int)cfg->trainer_num_threads);

    /* model, reference, tokenizer */
    char bundled[4096];
    const char *model_path = cfg->arr_model_path;
    if (!model_path || !*model_path) {
        if (trainer_bundled_model_path(bundled, sizeof bundled) != 0) {
            error_set(err, errlen,
                      "actor_rollout_ref.model.path is empty and the bundled model is not in %s "
                      "(fetch it with scripts/fetch_model.sh)",
                      bundled);
            goto fail;
        }
        model_path = bundled;
    }
    log_info("trainer", "loading %s", model_path);
    t->policy = model_load(model_path, err, errlen);
    if (!t->policy)
        goto fail;
    if (cfg->actor_use_kl_loss || cfg->alg_use_kl_in_reward) {
        t->ref = model_create(&t->policy->cfg);
        memcpy(t->ref->w.mem, t->policy->w.mem, t->policy->w.n_floats * sizeof(float));
    }
    t->tok = prompt_load_tokenizer(model_path, err, errlen);
    if (!t->tok)
        goto fail;

    /* data and scorers */
    if (prompt_sets_load(cfg, t->tok, &t->train, &t->val, err, errlen) != 0)
        goto fail;
    t->reward = reward_create(cfg, err, errlen);
    if (!t->reward)
        goto fail;
    rollout_ctx_init(&t->rc, cfg, t->policy, t->tok, t->reward);
    for (int i = 0; i < t->train.n; i++)
        if (!reward_supports(t->reward, t->train.items[i].data_source)) {
            error_set(err, errlen, "%s: no scorer for data_source '%s' (see docs/rewards.md)", t->train.name,
                      t->train.items[i].data_source);
            goto fail;
        }

    if (data_cursor_init(&t->cursor, t->train.n, (int)cfg->data_train_batch_size, cfg->data_shuffle,
                         (uint64_t)cfg->data_seed, err, errlen) != 0)
        goto fail;
    t->cursor_open = true;
    t->opt = adamw_create(t->policy->w.n_floats, cfg->actor_optim_betas.v[0], cfg->actor_optim_betas.v[1],
                          cfg->actor_optim_eps, cfg->actor_optim_weight_decay);
    t->st.seed = (uint64_t)cfg->data_seed;
    t->st.config_digest = config_digest(cfg);
    t->st.total_steps = compute_total_steps(cfg, t->train.n) + cfg->trainer_sft_warmup_steps;
    int64_t grpo_steps = t->st.total_steps - cfg->trainer_sft_warmup_steps;
    t->warmup = cfg->actor_optim_lr_warmup_steps >= 0 ? cfg->actor_optim_lr_warmup_steps
                                                      : (int64_t)(cfg->actor_optim_lr_warmup_steps_ratio * grpo_steps);
    t->peak_flops = measure_peak_flops();

    /* run directory and resume */
    snprintf(t->run_dir, sizeof t->run_dir, "%s/%s/%s", cfg->trainer_default_local_dir, cfg->trainer_project_name,
             cfg->trainer_experiment_name);
    snprintf(t->ckpt_root, sizeof t->ckpt_root, "%s/checkpoints", t->run_dir);
    if (fs_mkdir_p(t->run_dir) != 0) {
        error_set(err, errlen, "%s: cannot create run directory: %s", t->run_dir, check_errno_text());
        goto fail;
    }
    char resume[4096] = "";
    if (strcmp(cfg->trainer_resume_mode, "resume_path") == 0)
        snprintf(resume, sizeof resume, "%s", cfg->trainer_resume_from_path);
    else if (strcmp(cfg->trainer_resume_mode, "auto") == 0 &&
             checkpoint_find_latest(t->ckpt_root, resume, sizeof resume) != 0)
        resume[0] = 0;
    if (resume[0]) {
        struct run_state st;
        if (checkpoint_load(resume, t->policy, t->opt, &st, err, errlen) != 0)
            goto fail;
        if (st.config_digest != t->st.config_digest)
            log_warn("trainer", "resuming %s with a configuration that differs from the one it was written with",
                     resume);
        t->st.global_step = st.global_step;
        t->st.epoch = st.epoch;
        t->st.cursor = st.cursor;
        t->st.seed = st.seed;
        data_cursor_seek(&t->cursor, (long)st.epoch, (int)st.cursor);
        if (t->ref && cfg->trainer_sft_warmup_steps > 0 && st.global_step >= cfg->trainer_sft_warmup_steps) {
            char refdir[2300];
            snprintf(refdir, sizeof refdir, "%s/reference", t->run_dir);
            struct model *r = model_load_hf(refdir, err, errlen);
            if (!r)
                goto fail;
            model_free(t->ref);
            t->ref = r;
        }
        log_info("trainer", "resumed from %s at step %lld", resume, (long long)st.global_step);
    }
    /* steps logged after the checkpoint we resume from are forgotten: they are redone */
    if (t->lay.dp_rank == 0 &&
        metrics_logger_open(&t->logger, t->run_dir, METRICS_SINK_ALL, (long)t->st.total_steps,
                            resume[0] ? (long)t->st.global_step : -1, cfg->trainer_experiment_name) != 0) {
        error_set(err, errlen, "%s: cannot open the metrics files", t->run_dir);
        goto fail;
    }
    t->logger_open = t->lay.dp_rank == 0;
    log_info("trainer",
             "run %s: %d train / %d val prompts, %lld steps (%lld done), batch %lld prompts x %lld responses, "
             "%zu parameters",
             t->run_dir, t->train.n, t->val.n, (long long)t->st.total_steps, (long long)t->st.global_step,
             cfg->data_train_batch_size, cfg->rollout_n, model_num_params(t->policy));
    return t;
fail:
    trainer_free(t);
    return NULL;
}

void trainer_free(struct trainer *t)
{
    if (!t)
        return;
    if (t->logger_open)
        metrics_logger_close(&t->logger);
    model_free(t->policy);
    model_free(t->ref);
    if (t->tok)
        tokenizer_free(t->tok);
    adamw_free(t->opt);
    if (t->reward)
        reward_free(t->reward);
    if (t->cursor_open)
        data_cursor_free(&t->cursor);
    prompt_set_free(&t->train);
    prompt_set_free(&t->val);
    free(t);
}

int64_t trainer_step(const struct trainer *t) { return t->st.global_step; }
struct model *trainer_policy(struct trainer *t) { return t->policy; }
const struct prompt_set *trainer_prompts(const struct trainer *t) { return &t->train; }

void trainer_cursor(const struct trainer *t, int64_t *epoch, int64_t *index)
{
    *epoch = t->st.epoch;
    *index = t->st.cursor;
}

void trainer_advance_cursor(struct trainer *t, int *uids)
{
    const int B = (int)t->cfg->data_train_batch_size;
    const struct prompt_item **p = xmalloc((size_t)B * sizeof *p);
    draw_prompts(t, p, uids, B);
    free(p);
}
int64_t trainer_total_steps(const struct trainer *t) { return t->st.total_steps; }
const char *trainer_run_dir(const struct trainer *t) { return t->run_dir; }

const float *trainer_params(const struct trainer *t, size_t *n)
{
    *n = t->policy->w.n_floats;
    return t->policy->w.mem;
}
