/* GRPO's arithmetic, with verl's names and semantics: advantage estimators,
 * KL estimators, the policy losses of verl's registry (the clipped loss with dual
 * clip and the other loss modes), and loss aggregation.
 *
 * The loss of a mini-batch is written as a weighted sum over its response
 * tokens, L = sum_t w_t * l_t, with weights fixed by the aggregation mode over
 * the WHOLE mini-batch. Splitting the mini-batch into micro-batches and
 * accumulating gradients then gives exactly the mini-batch gradient, however
 * it is split (verl instead rescales per micro-batch, which ties the result to
 * the split). */
#ifndef GRPO_WORKER_GRPO_ALGO_H
#define GRPO_WORKER_GRPO_ALGO_H

#include <stdbool.h>
#include <stdint.h>

/* verl's algorithm.adv_estimator values that run here (grpo_vectorized is ADV_GRPO: the same numbers) */
enum adv_estimator {
    ADV_GRPO,
    ADV_RLOO,
    ADV_REINFORCE_PP,
    ADV_REINFORCE_PP_BASELINE,
    ADV_REMAX,
    ADV_OPO,
    ADV_GRPO_PASSK,
    ADV_GPG,
    ADV_RLOO_VECTORIZED,
    ADV_OPTIMAL_TOKEN_BASELINE,
    ADV_TIR_OPTIMAL_TOKEN_BASELINE,
    ADV_GDPO,
};
enum kl_type { KL_K1, KL_ABS, KL_K2, KL_K3 };
enum loss_agg {
    AGG_TOKEN_MEAN,
    AGG_SEQ_MEAN_TOKEN_SUM,
    AGG_SEQ_MEAN_TOKEN_MEAN,
    AGG_SEQ_MEAN_TOKEN_SUM_NORM,
};

/* Config names to enums; -1 when unknown. kl: "kl"/"k1", "abs", "mse"/"k2", "low_var_kl"/"k3". */
int adv_estimator_from_name(const char *s);
int kl_type_from_name(const char *s);
int loss_agg_from_name(const char *s);

/* Outcome advantages of the estimators whose statistics are each group's (one score per response): group[i] is
 * the prompt index of response i (responses of one prompt share it). GRPO: (r - mean) / (std + eps) with the
 * unbiased std (torch.std), or r - mean without the std (Dr.GRPO); a group of one gets mean 0, std 1. RLOO:
 * r_i - mean of the others (a group of one keeps r); rloo_vectorized the same, but 0 for a group of one. grpo_passk:
 * the group's best response (the first of equal best) gets r_max - r_second, divided by (std + eps) with
 * norm_by_std, every other 0 (a group of one is an error in verl: here 0). adv: (n) per response. */
void outcome_advantages(enum adv_estimator est, bool norm_by_std, const double *scores, const int *group, int n,
                        double *adv);

/* Sums of n doubles over the data-parallel ranks, in place (sum NULL: one rank holds the whole batch): the
 * batch-wide statistics of an estimator (REINFORCE++'s whitening, GPG's share of non-zero scores) are then those of
 * the whole step's batch, as verl computes them on its driver. */
struct batch_reduce {
    void (*sum)(void *ctx, double *v, int n);
    void *ctx;
};

/* REINFORCE++ (verl v0.9's compute_reinforce_plus_plus_outcome_advantage with its response_mask): per-token
 * discounted returns G_t = r_t + gamma G_{t+1} over the model's tokens, whitened over the model's tokens of the
 * batch (verl's masked_whiten: masked mean and unbiased variance, each mean's count + 1e-8, then / sqrt(var + 1e-8)).
 * token_rewards, mask and adv are packed: response i has len[i] tokens starting at off[i]. mask (NULL: every token
 * is the model's): 1 on the model's tokens, 0 on tokens put in the response from outside, which are skipped: their
 * reward is not added, the running return passes them unchanged, and their advantage is 0. red (may be NULL) sums
 * the whitening's statistics over the DP ranks. */
void reinforce_pp_advantages(const double *token_rewards, const uint8_t *mask, const int *off, const int *len, int n,
                             double gamma, const struct batch_reduce *red, double *adv);

/* What an estimator takes besides the rewards. */
struct adv_params {
    enum adv_estimator est;
    bool norm_by_std;               /* algorithm.norm_adv_by_std_in_grpo (grpo, grpo_passk) */
    double gamma;                   /* algorithm.gamma (reinforce_plus_plus) */
    const double *baseline;         /* remax: (n) each response's greedy baseline reward (verl's reward_baselines) */
    const struct batch_reduce *red; /* batch-wide sums over DP ranks (NULL: one rank) */
    /* optimal_token_baseline, tir_optimal_token_baseline: packed like the token rewards, each token's old log-prob,
     * the sum of its squared probabilities over the vocabulary (verl's sum_pi_squared) and rollout correction's IS
     * weight (NULL: none, verl's rollout_is_weights) */
    const double *old_logp, *sum_pi_sq, *is_w;
    /* gdpo: each response's n_parts reward components (n x n_parts, row-major, algorithm.gdpo_reward_keys' order)
     * and their weights (algorithm.gdpo_reward_weights; NULL: 1 each) */
    int n_parts;
    const double *parts, *part_weights;
};

/* Every response token's advantage under p->est from the token rewards of n responses (packed like
 * reinforce_pp_advantages: response i has len[i] tokens from off[i], its outcome reward at its last token and any
 * in-reward KL on its model's tokens). scores (n) gets each response's summed reward (verl's
 * token_level_rewards.sum). mask (NULL: every token) marks the tokens trained on: the outcome estimators put each
 * response's advantage on them and 0 elsewhere (verl: scalar x response_mask). Per estimator, as verl v0.9:
 *  - grpo, rloo, rloo_vectorized, grpo_passk: outcome_advantages of the scores;
 *  - reinforce_plus_plus: reinforce_pp_advantages;
 *  - reinforce_plus_plus_baseline: r - group mean (a group of one: r), on the masked tokens, whitened over them;
 *  - remax: the reward-to-go of the masked token rewards minus the response's baseline;
 *  - opo: r - the group's length-weighted mean reward (sum len_j r_j / sum len_j, len the masked tokens; a group
 *    of one: r);
 *  - gpg: alpha (r - group mean) with alpha = responses / max(responses with a non-zero score, 1) over the batch
 *    (f_norm 1);
 *  - optimal_token_baseline: G_t - B_t, G_t the reward-to-go of the masked token rewards and B_t the group's
 *    baseline at response position t: sum_j G_jt W_jt / (sum_j W_jt + 1e-8) over the group's responses masked at t,
 *    W_t = the cumulative sum over the masked tokens up to t of w = (1 - 2 exp(old_logp) + sum_pi_sq) x is_w^2; a
 *    group of one: B = 0; the group's single longest response (longer than every other) gets B = 0 from the
 *    second-longest's length on (verl's handle_zero_tail, lengths counted in masked tokens);
 *  - tir_optimal_token_baseline: the same with positions counted over each response's masked tokens alone (its
 *    k-th masked token meets the others' k-th), responses without a masked token left out of their group;
 *  - gdpo: sum_k weight_k x grpo advantage of component k (outcome_advantages with norm_by_std), on the masked
 *    tokens, whitened over the batch's masked tokens (masked_whiten). */
void token_advantages(const struct adv_params *p, const double *token_rewards, const uint8_t *mask, const int *off,
                      const int *len, const int *group, int n, double *scores, double *adv);

/* KL estimate between the policy and the reference from their log-probs, and its derivative w.r.t. logp
 * (clamped regions have zero derivative, as with torch.clamp). */
double kl_estimate(enum kl_type t, double logp, double ref_logp, double *dkl_dlogp);

/* Weight of each response token in the mini-batch loss for an aggregation mode, as verl's agg_loss with its
 * response_mask. len: response lengths of the mini-batch's n sequences; mask (NULL: every token is the model's)
 * and w are packed like len: a token of mask 0 gets weight 0 and counts in no mode's token count (token-mean's
 * denominator, a sequence's own tokens under seq-mean-token-mean). max_response_length is the horizon of
 * seq-mean-token-sum-norm (Dr.GRPO). */
void loss_token_weights(enum loss_agg mode, const int *len, const uint8_t *mask, int n, int max_response_length,
                        double *w);
/* The same for this rank's n sequences of a mini-batch that holds n_all sequences and tokens_all of the model's
 * response tokens over all data-parallel ranks, so the loss does not depend on how the batch was split. */
void loss_token_weights_dist(enum loss_agg mode, const int *len, const uint8_t *mask, int n, long long n_all,
                             long long tokens_all, int max_response_length, double *w);

/* actor_rollout_ref.actor.policy_loss.loss_mode: verl's policy-loss registry */
enum loss_mode {
    LOSS_VANILLA,
    LOSS_GSPO,
    LOSS_SAPO,
    LOSS_GPG,
    LOSS_CLIP_COV,
    LOSS_KL_COV,
    LOSS_GEO_MEAN,
    LOSS_DRO,
    LOSS_CISPO,
    LOSS_DPPO_TV,
    LOSS_DPPO_KL,
};
int loss_mode_from_name(const char *s);
/* The aggregation of the policy-gradient term a loss mode imposes whatever loss_agg_mode says (-1: none): gspo and
 * sapo aggregate seq-mean-token-mean (their KL and entropy terms keep loss_agg_mode), as verl's. geo_mean's loss is
 * one term per sequence (policy_loss_seqs), weighted by its token weights' first. */
int loss_mode_agg(enum loss_mode m);

struct rollout_corr;

struct policy_loss_params {
    double clip_low, clip_high; /* ratio clipped to [1 - clip_low, 1 + clip_high] */
    double clip_c;              /* dual-clip bound for negative advantages (> 1); dppo: the truncation of the ratio */
    bool use_kl_loss;
    enum kl_type kl_type;
    double kl_coef;
    double entropy_coeff;
    enum loss_mode mode;                             /* LOSS_VANILLA (0) unless set */
    double tau_pos, tau_neg;                         /* sapo's gate temperatures (actor.tau_pos, tau_neg) */
    double clip_cov_ratio, clip_cov_lb, clip_cov_ub; /* clip_cov (policy_loss.clip_cov_*) */
    double kl_cov_ratio, ppo_kl_coef;                /* kl_cov (policy_loss.kl_cov_ratio, ppo_kl_coef) */
    double dro_beta;                                 /* dro (policy_loss.dro_beta, > 0) */
    /* rollout correction's bypass mode (verl's loss_mode bypass_mode; NULL: off): the old log-probs are the
     * rollout's, each micro-batch's IS weights and rejection are taken from the current log-probs against them, and
     * the loss is the clipped one against the rollout (loss_type ppo_clip) or REINFORCE with the IS weights */
    const struct rollout_corr *bypass;
    enum loss_agg agg; /* bypass mode: seq-mean-token-mean's per-sequence count is the tokens rejection kept */
};

/* Sums over tokens, weighted by w, for metrics (verl's names in comments). */
struct policy_loss_stats {
    double pg_loss;           /* actor/pg_loss */
    double kl_loss;           /* actor/kl_loss */
    double entropy;           /* actor/entropy (aggregated like the loss) */
    double pg_clipfrac;       /* actor/pg_clipfrac (token mean) */
    double pg_clipfrac_lower; /* actor/pg_clipfrac_lower (token mean) */
    double ppo_kl;            /* actor/ppo_kl = mean(old_logp - logp) (token mean) */
    double loss;              /* total: pg + kl_coef * kl - entropy_coeff * entropy */
    long long tokens;         /* tokens accumulated */
};

/* Per-token loss terms for n tokens: given the current log-prob, old log-prob, reference log-prob, entropy,
 * advantage and weight of each token, accumulate into stats and write dL/dlogp and dL/dentropy. A token of mask 0
 * (mask NULL: none) is not the model's: it adds nothing to the loss or to any statistic (its token count included),
 * and its dL/dlogp and dL/dentropy are 0. The n tokens are one sequence and one micro-batch (policy_loss_seqs with
 * one sequence, w its policy-gradient weights too). */
void policy_loss_tokens(const struct policy_loss_params *p, int n, const float *logp, const float *old_logp,
                        const float *ref_logp, const float *entropy, const double *adv, const double *w,
                        const uint8_t *mask, struct policy_loss_stats *stats, float *dlogp, float *dentropy);

/* One sequence of a micro-batch, as the loss sees it. */
struct pl_seq {
    int len;
    const float *logp, *old_logp, *ref_logp, *entropy; /* (len); ref_logp only with the KL loss, entropy may be NULL */
    const float *rollout_logp;                         /* the sampler's (bypass mode) */
    const double *adv;
    const double *w;     /* the KL and entropy terms' weights (loss_token_weights), 0 on the tokens not trained on */
    const double *w_pg;  /* the policy-gradient term's (loss_mode_agg's aggregation; NULL: w) */
    const uint8_t *mask; /* the tokens trained on (NULL: all) */
    const float *is_w;   /* rollout correction's IS weight of each token (decoupled mode; NULL: none) */
    float *dlogp, *dentropy; /* (len) out; dentropy may be NULL */
};

/* The loss of a micro-batch's n sequences under p->mode, as verl's policy loss of that name computes it on a
 * micro-batch: each token's policy-gradient term times its IS weight (where given) times w_pg, plus the KL and
 * entropy terms times w. Sequence-level modes (gspo, geo_mean) take each sequence's tokens together; clip_cov and
 * kl_cov choose their tokens by covariance over the micro-batch's tokens trained on (clip_cov's random choice from
 * seed). In bypass mode each sequence's mask is narrowed by rejection sampling first; rc (may be NULL) then gets the
 * micro-batch's rollout_corr/ metrics (rollout_corr_compute's). Accumulates into st, writes dlogp and dentropy. */
struct rc_metrics;
void policy_loss_seqs(const struct policy_loss_params *p, const struct pl_seq *s, int n, uint64_t seed,
                      struct policy_loss_stats *st, struct rc_metrics *rc);

#endif
