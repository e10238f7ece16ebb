/* The trainer's two model passes over a step's rollouts: log-probs without
 * gradients (old policy, reference policy), and the PPO/GRPO update over
 * mini-batches and micro-batches with gradient accumulation. */
#ifndef GRPO_WORKER_ACTOR_H
#define GRPO_WORKER_ACTOR_H

#include <stdbool.h>

#include "grpo_algo.h"
#include "rollout_corr.h"
#include "worker/comm/comm.h"
#include "optim.h"
#include "worker/step/seq.h"
#include "worker/model/model.h"

struct zero1;

struct batching {
    int micro_seqs;     /* sequences per micro-batch (fixed mode) */
    int micro_tokens;   /* token budget per micro-batch (dynamic mode); 0: fixed mode */
    bool share_prompts; /* a group's prompt packed once per micro-batch (micro_batch_build's share) */
};

/* Log-probs of every response token of the sequences idx[0..n) under m, written to seqs[i].old_logp (which =
 * ACTOR_LOGP_OLD) or seqs[i].ref_logp (ACTOR_LOGP_REF); ACTOR_LOGP_OLD_SUM_PI_SQ: the old ones and each token's sum
 * of squared probabilities over the vocabulary, seqs[i].sum_pi_sq (verl's sum_pi_squared). Returns the number of
 * micro-batches run. */
enum { ACTOR_LOGP_OLD = 0, ACTOR_LOGP_REF = 1, ACTOR_LOGP_OLD_SUM_PI_SQ = 2 };
int actor_compute_logp(struct model *m, struct rollout_seq *seqs, const int *idx, int n, const struct batching *bt,
                       float temperature, int which);

struct update_params {
    struct policy_loss_params loss;
    enum loss_agg agg;
    int max_response_length; /* horizon of seq-mean-token-sum-norm */
    int mini_batch_seqs;     /* sequences per optimizer step (ppo_mini_batch_size x n) */
    int ppo_epochs;
    double grad_clip;
    double lr;
    bool checkpointing;
    float temperature;
    struct batching bt;
    /* on-policy shortcut: with one optimizer step per training step, the policy at the update's forward IS the
     * old policy, so old log-probs are taken from that forward (ratio exactly 1) instead of a separate pass */
    bool old_from_current;
    /* data parallelism: this rank holds a share of the step's sequences. Gradients, loss statistics and the token
     * counts that weight the loss are summed over dp, and mini-batch j holds the sequences whose gidx falls in
     * [j * mini_batch_seqs, (j + 1) * mini_batch_seqs) on every rank, as in one process. NULL: one rank. */
    struct comm *dp;
    /* sequence parallelism: the group the gradients sum over, DP x SP (each SP rank's are its tokens' part; on GPUs
     * of their own its NCCL twin); NULL: dp */
    struct comm *grads;
    /* gradients in GPU memory (trainer.device=cuda): dp_dev, dp's NCCL twin, sums them in place; without one (DP
     * ranks sharing a GPU) they are staged through dp_stage (host memory, the trainable parameters' size) and
     * summed over dp. Both NULL on the CPU. */
    struct comm *dp_dev;
    float *dp_stage;
    /* expert parallelism (m->sh.ep): the experts' gradients are summed over edp, the ranks holding the same experts,
     * the rest over dp; NULL: each expert is held once (or no EP) */
    struct comm *edp;
    /* overlap_grad_reduce (grad_reduce.h): the DP sum started bucket by bucket during the last micro-batch's
     * backward, instead of one all-reduce after it; NULL: that one all-reduce */
    struct grad_reducer *overlap;
    int n_total; /* sequences of the step over all ranks (0: n) */
    /* ZeRO-1 over dp (NULL: the gradients are all-reduced and every rank steps the whole optimizer): the
     * gradients are reduce-scattered, opt covers this rank's block, and the parameters are all-gathered */
    struct zero1 *zero;
    /* the step's seed and the update's pass (ppo_epochs): clip_cov's random choice in a micro-batch is drawn from
     * them and the micro-batch's first sequence */
    uint64_t seed;
    int epoch;
    /* bypass mode: each micro-batch's rollout_corr/ metrics summed here (count: the micro-batches; on the pipeline's
     * last stage), NULL: not wanted */
    struct rc_accum *rc_acc;
};

struct rc_accum {
    struct rc_metrics m;
    double count;
};

/* Averages over the optimizer steps of one update (verl's actor/ metrics). */
struct update_stats {
    double pg_loss, kl_loss, entropy, pg_clipfrac, pg_clipfrac_lower, ppo_kl, grad_norm;
    int optimizer_steps, skipped_steps; /* skipped: non-finite gradient norm */
    long long tokens_trained;           /* the model's response tokens (mask 1) x epochs */
    long long tokens_forward;           /* all tokens through forward+backward */
    double allreduce_s;                 /* waiting in the DP gradient all-reduce (0 on one rank) */
    double pp_wait_s, pp_schedule_s;    /* pipeline: this stage waiting for its neighbours, of its schedule's time */
};

/* Add the gradient of the mini-batch loss over idx[0..n) (token weights over the whole mini-batch) to m->grad,
 * micro-batch by micro-batch (on a pipeline stage, the 1F1B schedule over the stages); loss terms accumulate
 * into ls (on every stage). No optimizer step. pp_wait (may be NULL) accumulates the seconds this stage waited
 * for its neighbours. */
void actor_accumulate_grads(struct model *m, struct rollout_seq *seqs, const int *idx, int n,
                            const struct update_params *p, struct policy_loss_stats *ls, long long *tokens_forward,
                            double *pp_wait);

/* Run ppo_epochs passes over the sequences idx[0..n), each split into mini-batches (one optimizer step each)
 * and micro-batches (gradient accumulation). seqs must carry old_logp, ref_logp (when the KL loss is on) and adv;
 * a sequence's mask keeps the tokens that are not the model's out of the loss, its statistics and its gradient. */
void actor_update(struct model *m, struct adamw *opt, struct rollout_seq *seqs, const int *idx, int n,
                  const struct update_params *p, struct update_stats *st);

#endif
