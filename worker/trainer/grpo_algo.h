/* GRPO's arithmetic, with verl's names and semantics: advantage estimators,
 * KL estimators, the clipped policy loss with dual clip, and loss aggregation.
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

enum adv_estimator { ADV_GRPO, ADV_RLOO, ADV_REINFORCE_PP };
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

/* Outcome advantages for GRPO / RLOO from one score per response. group[i] is the prompt index of response i
 * (responses of one prompt share it). GRPO: (r - mean) / (std + eps) with the unbiased std (torch.std), or
 * r - mean without the std (Dr.GRPO); a group of one gets mean 0, std 1. RLOO: r_i - mean of the others.
 * adv: (n) per response. */
void outcome_advantages(enum adv_estimator est, bool norm_by_std, const double *scores, const int *group, int n,
                        double *adv);

/* REINFORCE++ (verl's compute_reinforce_plus_plus_outcome_advantage with its response_mask): per-token returns
 * (gamma = 1) of token rewards, whitened over the model's tokens of the batch (masked mean and unbiased variance, as
 * verl's masked_whiten). token_rewards, mask and adv are packed: response i has len[i] tokens starting at off[i].
 * mask (NULL: every token is the model's): 1 on the model's tokens, 0 on tokens put in the response from outside,
 * which get advantage 0 and end the return that runs back past them, as verl's running return is reset by the mask
 * (the tokens before one do not see the rewards after it). */
void reinforce_pp_advantages(const double *token_rewards, const uint8_t *mask, const int *off, const int *len, int n,
                             double *adv);

/* Every response token's advantage under estimator est from the token rewards of n responses (packed like
 * reinforce_pp_advantages: response i has len[i] tokens from off[i], its outcome reward at its last token and any
 * in-reward KL on its model's tokens). scores (n) gets each response's summed reward (verl's token_level_rewards.sum).
 * GRPO and RLOO: outcome_advantages of the scores, each response's on its model's tokens (mask 1, or every token
 * with mask NULL) and 0 on the others (verl: scores x response_mask); REINFORCE++: reinforce_pp_advantages. */
void token_advantages(enum adv_estimator est, bool norm_by_std, const double *token_rewards, const uint8_t *mask,
                      const int *off, const int *len, const int *group, int n, double *scores, double *adv);

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

struct policy_loss_params {
    double clip_low, clip_high; /* ratio clipped to [1 - clip_low, 1 + clip_high] */
    double clip_c;              /* dual-clip bound for negative advantages (> 1) */
    bool use_kl_loss;
    enum kl_type kl_type;
    double kl_coef;
    double entropy_coeff;
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
 * and its dL/dlogp and dL/dentropy are 0. */
void policy_loss_tokens(const struct policy_loss_params *p, int n, const float *logp, const float *old_logp,
                        const float *ref_logp, const float *entropy, const double *adv, const double *w,
                        const uint8_t *mask, struct policy_loss_stats *stats, float *dlogp, float *dentropy);

#endif
