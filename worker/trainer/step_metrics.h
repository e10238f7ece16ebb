/* What the phases of one GRPO step found (trainer_step.c fills a struct step_result, phase by phase), and the
 * step's metrics derived from it: every metric of the step, verl's names, is set here and nowhere in the phases.
 * Figures that live on several ranks are in the result already combined over them (the phases do the
 * collectives); deriving the metrics moves nothing between ranks. docs/metrics.md lists the names. */
#ifndef GRPO_WORKER_TRAINER_STEP_METRICS_H
#define GRPO_WORKER_TRAINER_STEP_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "actor.h"
#include "common/config.h"
#include "kernels/kernels.h"
#include "trainer.h"
#include "worker/metrics/metrics.h"

struct model_config;

/* The step's rollouts as they came in, over every DP rank. */
struct step_rollouts {
    struct metrics_summary score, response_length;
    double acc_sum, acc_n; /* exact-answer accuracy: summed over the responses whose scorer knows it; their count */
    double n_seq;          /* sequences */
    double clipped;        /* sequences cut at data.max_response_length */
    double prompt_tokens, tokens; /* prompt tokens; prompt and response tokens */
    /* multi-turn rollouts (sums over the step's sequences) */
    bool multi_turn;
    struct metrics_summary num_turns;
    double tool_calls, tool_errors, with_calls; /* calls; of them errors; trajectories with a call */
    double tool_s;                              /* wall time of the calls, summed */
    double model_tokens, tool_tokens;           /* response tokens the model sampled; put in by tools/template */
    double mismatch;                            /* trajectories whose tokens failed the sanity check */
    double template_errors;                     /* answers the template could not render */
    double resumed_turns, prefill_tokens;       /* turns resumed after an answer; tokens prefilled for them */
    double evictions;                           /* KV caches given up while waiting */
};

/* The advantages (and the in-reward KL, when on) of the step's response tokens. */
struct step_advantages {
    bool kl_penalty_measured;                   /* algorithm.use_kl_in_reward, with response tokens on this rank */
    double kl_penalty;                          /* this rank's mean in-reward KL per response token */
    struct metrics_summary advantages, rewards; /* per token; per sequence (summed over its tokens) */
    /* gdpo: each reward component's name and its mean, population std, max and min over the step's responses */
    int n_parts;
    const char *part_name[CFG_GDPO_MAX_KEYS];
    double part_mean[CFG_GDPO_MAX_KEYS], part_std[CFG_GDPO_MAX_KEYS], part_max[CFG_GDPO_MAX_KEYS],
        part_min[CFG_GDPO_MAX_KEYS];
};

/* The actor's update. */
struct step_update {
    double lr;
    struct update_stats stats; /* the losses, the gradient norm and the time in the all-reduce, from actor_update */
    double forward_rows;       /* rows the update's forward ran, over every DP rank */
    double dp_bytes;           /* the update's gradient (and ZeRO-1 weight) traffic over DP, ring-model bytes */
    double tp_bytes, pp_bytes; /* this rank's activation traffic over TP (every pass), sends to its PP neighbours */
    double ep_bytes;           /* what its expert all-to-alls sent to the other EP ranks (every pass) */
    double cp_bytes; /* what its SP or CP group sent in Ulysses' all-to-alls or around the ring (every pass), summed
                      * over the group */
    double pp_wait_s, pp_schedule_s; /* pipeline: stages waiting for their neighbours, of the schedule's time
                                      * (summed over the stages) */
    /* a mixture of experts' routing in the update's forwards, over the DP ranks (moe_experts 0: a dense model):
     * the load-balancing loss per layer and forward (without its coefficient), max over mean tokens per expert
     * (the mean over layers and the worst layer), and tokens per expert per layer (the most, least and mean) */
    int moe_experts;
    double moe_aux_loss, moe_imbalance, moe_imbalance_max, moe_tokens_max, moe_tokens_min, moe_tokens_mean;
};

/* The rollout-vs-trainer log-prob gap: the sampler's log-probs against the trainer's old log-probs, over every
 * DP rank. */
struct step_gap {
    double sum, n, max;
    /* mixture of experts with the rollout's routes: token-layers of the old-log-prob forwards whose own top-k differed
     * from the rollout's, of those compared (0: no routes), and whether they were replayed */
    double route_differ, route_compared;
    bool replay;
};

/* What the step held: memory, the data's epoch. */
struct step_resources {
    double rss_gb;             /* this process now */
    double peak_rss_gb;        /* the largest peak of every trainer rank */
    double optimizer_state_gb; /* AdamW's two moments on this rank */
    struct kmem_stats mem;     /* the policy's context: its step's peaks by kind */
    int64_t epoch;
    double update_max_allocated_gb;         /* the policy's context at its peak after generation (the update's part) */
    double update_kv_gb;                    /* of which KV caches (0 when generation gave them back) */
    int ranks;                              /* trainer (or colocated) ranks the idle ratios are over (0: one process) */
    double idle_ratio_max, idle_ratio_mean; /* the step's idle share per rank (outside and inside collectives) */
};

/* Everything one GRPO step's metrics are made of. */
struct step_result {
    struct step_timing source;        /* the rollouts' timings, from the step's source */
    const struct trainer_source *src; /* the step's source: its own metrics (trainer_source.metrics) */
    double phase_s[GRPO_NUM_PHASES];  /* seconds in each phase (gen and reward: where the rollouts were made) */
    double step_s;                    /* the whole step */
    struct step_rollouts rollouts;
    struct step_advantages adv;
    struct step_update update;
    struct step_gap gap;
    struct step_resources res;
    struct rc_metrics *rc; /* rollout_corr/: rollout correction's metrics, over every DP rank (n 0: none) */
    /* the run's shape */
    const struct model_config *model; /* the policy's (its FLOPs per token) */
    bool tp, pp;                      /* the trainer runs tensor-, pipeline-parallel */
    bool ep;                          /* expert-parallel */
    bool cp;                          /* sequences shared over an SP or CP group */
    bool dp;                          /* more than one DP rank (the gradients all-reduced) */
    bool survive;                     /* trainer.survive_trainer_loss: each step's start kept */
    double keep_s;                    /* keeping it (in step_s) */
    int devices;                      /* ranks of the run (throughput per device) */
    double peak_flops;                /* the MFU denominator (0: not known, no MFU) */
};

/* Set every metric of the step from r into m, in the order verl's trainer logs them (the source's own first, and
 * its late ones after the trainer's timings: trainer_source.metrics). */
void step_metrics(struct metrics *m, const struct step_result *r);

/* One supervised warm-start step (trainer.sft_warmup_steps). */
struct sft_result {
    double nll;       /* mean negative log-likelihood per reference-answer token */
    double grad_norm; /* before clipping */
    int64_t step;
};
/* The warm-start step's metrics: sft/nll, sft/grad_norm, sft/step. */
void sft_metrics(struct metrics *m, const struct sft_result *r);

#endif
