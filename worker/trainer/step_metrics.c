/* The metrics of a GRPO step, derived from what its phases found (struct step_result). */
#include "step_metrics.h"

#include <stdio.h>

#include "worker/model/model.h"

/* FLOPs of one token's forward through the model's matrix products at context length ctx (attention
 * included); backward is twice the forward. */
static double flops_per_token(const struct model_config *c, double ctx)
{
    const double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    const double QD = (double)c->n_heads * c->head_dim, KD = (double)c->n_kv_heads * c->head_dim;
    const double per_layer = 2 * (D * QD + 2 * D * KD + QD * D + 3 * D * F) + 4 * QD * ctx / 2; /* causal half */
    return c->n_layers * per_layer + 2 * V * D;
}

/* critic/, response_length/, prompt_length/: the rollouts' scores and lengths. */
static void rollout_metrics(struct metrics *m, const struct step_rollouts *ro)
{
    metrics_set_summary(m, "critic/score", &ro->score);
    if (ro->acc_n > 0)
        metrics_set(m, "critic/acc/mean", ro->acc_sum / ro->acc_n);
    metrics_set_summary(m, "response_length", &ro->response_length);
    metrics_set(m, "response_length/clip_ratio", ro->n_seq ? ro->clipped / ro->n_seq : 0);
    metrics_set(m, "prompt_length/mean", ro->n_seq ? ro->prompt_tokens / ro->n_seq : 0);
    if (!ro->multi_turn)
        return;
    const double n = ro->n_seq ? ro->n_seq : 1;
    metrics_set_summary(m, "num_turns", &ro->num_turns);
    metrics_set(m, "multi_turn/tool_calls/mean", ro->tool_calls / n);
    metrics_set(m, "multi_turn/tool_errors/mean", ro->tool_errors / n);
    metrics_set(m, "multi_turn/tool_call_rate", ro->with_calls / n);
    metrics_set(m, "multi_turn/tokenization_mismatch", ro->mismatch);
    metrics_set(m, "response_length/model_tokens/mean", ro->model_tokens / n);
    metrics_set(m, "response_length/tool_tokens/mean", ro->tool_tokens / n);
    metrics_set(m, "timing_s/tool", ro->tool_s);
    metrics_set(m, "multi_turn/template_errors", ro->template_errors);
    metrics_set(m, "multi_turn/prefill_tokens_per_turn",
                ro->resumed_turns ? ro->prefill_tokens / ro->resumed_turns : 0);
    metrics_set(m, "multi_turn/evictions", ro->evictions);
}

static void advantage_metrics(struct metrics *m, const struct step_advantages *a)
{
    if (a->kl_penalty_measured)
        metrics_set(m, "actor/reward_kl_penalty", a->kl_penalty);
    metrics_set_summary(m, "critic/advantages", &a->advantages);
    metrics_set_summary(m, "critic/rewards", &a->rewards);
    for (int k = 0; k < a->n_parts; k++) { /* verl's gdpo/<key>/ figures */
        static const char *const stat[4] = {"mean", "std", "max", "min"};
        const double v[4] = {a->part_mean[k], a->part_std[k], a->part_max[k], a->part_min[k]};
        for (int j = 0; j < 4; j++) {
            char name[160];
            snprintf(name, sizeof name, "gdpo/%s/%s", a->part_name[k], stat[j]);
            metrics_set(m, name, v[j]);
        }
    }
}

static void update_metrics(struct metrics *m, const struct step_update *u)
{
    metrics_set(m, "actor/pg_loss", u->stats.pg_loss);
    metrics_set(m, "actor/kl_loss", u->stats.kl_loss);
    metrics_set(m, "actor/entropy", u->stats.entropy);
    metrics_set(m, "actor/pg_clipfrac", u->stats.pg_clipfrac);
    metrics_set(m, "actor/pg_clipfrac_lower", u->stats.pg_clipfrac_lower);
    metrics_set(m, "actor/ppo_kl", u->stats.ppo_kl);
    metrics_set(m, "actor/grad_norm", u->stats.grad_norm);
    metrics_set(m, "actor/lr", u->lr);
    if (u->moe_experts) {
        metrics_set(m, "actor/moe/aux_loss", u->moe_aux_loss);
        metrics_set(m, "actor/moe/load_imbalance", u->moe_imbalance);
        metrics_set(m, "actor/moe/load_imbalance_max", u->moe_imbalance_max);
        metrics_set(m, "actor/moe/tokens_per_expert/max", u->moe_tokens_max);
        metrics_set(m, "actor/moe/tokens_per_expert/min", u->moe_tokens_min);
        metrics_set(m, "actor/moe/tokens_per_expert/mean", u->moe_tokens_mean);
    }
}

/* timing_s/<phase> for the phases of the step, gen to update_actor (verl's names: core_phase_name's), and
 * timing_s/step. */
static void timing_metrics(struct metrics *m, const struct step_result *r)
{
    for (int p = GRPO__PHASE__PHASE_GEN; p <= GRPO__PHASE__PHASE_UPDATE_ACTOR; p++) {
        char name[64];
        snprintf(name, sizeof name, "timing_s/%s", core_phase_name((Grpo__Phase)p));
        metrics_set(m, name, r->phase_s[p]);
    }
    metrics_set(m, "timing_s/step", r->step_s);
    if (r->dp || r->source.split)
        metrics_set(m, "timing_s/grad_allreduce", r->update.stats.allreduce_s);
    if (r->survive)
        metrics_set(m, "timing_s/keep_step_start", r->keep_s);
}

/* Rollouts from rollout ranks: the trainer's waiting for them, the traffic between the trainers (the rollout ranks'
 * waiting is the source's to report). */
static void split_metrics(struct metrics *m, const struct step_result *r)
{
    const struct step_timing *tm = &r->source;
    const struct step_update *u = &r->update;
    metrics_set(m, "timing_s/wait_data", tm->wait_data);
    metrics_set(m, "perf/comm_bytes/dp", u->dp_bytes);
    if (r->tp) /* activations and their gradients over TP (this rank's, float32) */
        metrics_set(m, "perf/comm_bytes/tp", u->tp_bytes);
    if (r->pp) { /* this stage's sends to its neighbours (float32), and the schedule's idle share */
        metrics_set(m, "perf/comm_bytes/pp", u->pp_bytes);
        metrics_set(m, "perf/pp_bubble", u->pp_schedule_s > 0 ? u->pp_wait_s / u->pp_schedule_s : 0);
    }
    metrics_set(m, "trainer/idle_ratio", r->step_s > 0 ? tm->wait_data / r->step_s : 0);
}

/* The step's peaks of the policy's context (verl's names: what torch.cuda reports; the CPU back-end counts the
 * same buffers), by kind. */
static void memory_metrics(struct metrics *m, const struct kmem_stats *mem)
{
    static const char *const kind[KMEM_KINDS] = {"weights",     "gradients", "optimizer",
                                                 "activations", "kv_cache",  "other"};
    metrics_set(m, "perf/max_memory_allocated_gb", (double)mem->max_allocated / 1e9);
    metrics_set(m, "perf/max_memory_reserved_gb", (double)mem->max_reserved / 1e9);
    for (int k = 0; k < KMEM_KINDS; k++) {
        char name[64];
        snprintf(name, sizeof name, "perf/max_memory_gb/%s", kind[k]);
        metrics_set(m, name, (double)mem->peak[k] / 1e9);
    }
}

/* perf/: tokens, throughput, MFU, memory; training/epoch. */
static void perf_metrics(struct metrics *m, const struct step_result *r)
{
    const double tokens = r->rollouts.tokens, n_seq = r->rollouts.n_seq;
    metrics_set(m, "perf/total_num_tokens", tokens);
    /* the rows the update's forward ran, over the DP ranks: fewer than the sequences' tokens with shared prompts */
    metrics_set(m, "perf/forward_tokens/update", r->update.forward_rows);
    /* verl: tokens / (step time x devices) */
    const int devices = r->devices > 0 ? r->devices : 1;
    metrics_set(m, "perf/throughput", r->step_s > 0 ? tokens / r->step_s / devices : 0);
    const double ctx = n_seq ? tokens / n_seq : 0;
    const double flops = 3.0 * flops_per_token(r->model, ctx) * (double)r->update.stats.tokens_forward;
    const double t_update = r->phase_s[GRPO__PHASE__PHASE_UPDATE_ACTOR];
    if (r->peak_flops > 0) /* the CPU's measured sgemm rate, or a GPU's BF16 peak (0: a GPU not known) */
        metrics_set(m, "perf/mfu/actor", t_update > 0 ? flops / t_update / r->peak_flops : 0);
    metrics_set(m, "perf/cpu_memory_used_gb", r->res.rss_gb);
    metrics_set(m, r->source.split ? "perf/cpu_memory_peak_gb/trainer" : "perf/cpu_memory_peak_gb", r->res.peak_rss_gb);
    metrics_set(m, "training/epoch", (double)r->res.epoch);
    if (r->res.ranks > 1) { /* every trainer rank's idle share: the largest, and the mean */
        metrics_set(m, "perf/idle_ratio/max", r->res.idle_ratio_max);
        metrics_set(m, "perf/idle_ratio/mean", r->res.idle_ratio_mean);
    }
    metrics_set(m, "perf/optimizer_state_gb", r->res.optimizer_state_gb);
    memory_metrics(m, &r->res.mem);
    if (r->source.gen_here) { /* each phase's peak: what generation held, and what the update did after it */
        metrics_set(m, "perf/max_memory_allocated_gb/gen", r->source.gen_max_allocated_gb);
        metrics_set(m, "perf/max_memory_gb/gen/gradients", r->source.gen_grads_gb);
        metrics_set(m, "perf/max_memory_allocated_gb/update", r->res.update_max_allocated_gb);
        metrics_set(m, "perf/max_memory_gb/update/kv_cache", r->res.update_kv_gb);
    }
}

/* The source's own metrics of the step (trainer_source.metrics), at `at` among the step's. */
static void source_metrics(struct metrics *m, const struct step_result *r, enum source_metrics_at at)
{
    if (r->src && r->src->metrics)
        r->src->metrics(r->src->ctx, at, &r->source, r->step_s, m);
}

void step_metrics(struct metrics *m, const struct step_result *r)
{
    source_metrics(m, r, SOURCE_METRICS_FIRST);
    rollout_metrics(m, &r->rollouts);
    advantage_metrics(m, &r->adv);
    metrics_set(m, "training/rollout_probs_diff_mean", r->gap.n ? r->gap.sum / r->gap.n : 0);
    metrics_set(m, "training/rollout_probs_diff_max", r->gap.max);
    if (r->gap.route_compared > 0) {
        metrics_set(m, "training/rollout_routing_mismatch", r->gap.route_differ / r->gap.route_compared);
        metrics_set(m, "training/rollout_routing_replay", r->gap.replay ? 1 : 0);
    }
    for (int i = 0; r->rc && i < r->rc->n; i++) { /* verl's rollout_corr/ names */
        char name[64];
        snprintf(name, sizeof name, "rollout_corr/%s", r->rc->name[i]);
        metrics_set(m, name, r->rc->v[i]);
    }
    update_metrics(m, &r->update);
    timing_metrics(m, r);
    if (r->source.split)
        split_metrics(m, r);
    source_metrics(m, r, SOURCE_METRICS_LATE);
    if (r->ep) /* the routed slots and their outputs (and gradients) sent to the other EP ranks (float32) */
        metrics_set(m, "perf/comm_bytes/ep", r->update.ep_bytes);
    if (r->cp) /* Ulysses' all-to-alls or the ring's K/V (and their gradients), float32, over the whole group */
        metrics_set(m, "perf/comm_bytes/cp", r->update.cp_bytes);
    perf_metrics(m, r);
}

void sft_metrics(struct metrics *m, const struct sft_result *r)
{
    metrics_set(m, "sft/nll", r->nll);
    metrics_set(m, "sft/grad_norm", r->grad_norm);
    metrics_set(m, "sft/step", (double)r->step);
}
