/* Rollout correction (verl v0.9's algorithm.rollout_correction, rollout_corr_helper.py): importance-sampling weights
 * and rejection sampling for the gap between the policy that sampled the rollouts (the sampler's log-probs) and the
 * trainer's, and the rollout_corr/ metrics that measure that gap.
 *
 * The log ratio of a token is log pi_train - log pi_rollout: the trainer's old log-probs in decoupled mode, its
 * current ones (per micro-batch, inside the loss) in bypass mode. Only the model's tokens (the response mask's 1s)
 * count anywhere. Weights and masks carry no gradient. */
#ifndef GRPO_WORKER_ROLLOUT_CORR_H
#define GRPO_WORKER_ROLLOUT_CORR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/rollout_corr_spec.h"
#include "grpo_algo.h"

/* Named values of the rollout_corr/ metrics (names without the prefix, in verl's order: IS, RS, off-policy). */
#define RC_METRICS_MAX 224
struct rc_metrics {
    int n;
    char name[RC_METRICS_MAX][48];
    double v[RC_METRICS_MAX];
};

/* Reductions over the DP ranks for the batch-wide figures (sum and max in place; NULL members: one rank). */
struct rc_reduce {
    void (*sum)(void *ctx, double *v, int n);
    void (*max)(void *ctx, double *v, int n);
    void *ctx;
};

/* n sequences: len[i] response tokens, logp[i] the trainer's log-probs (old or current), rollout[i] the sampler's,
 * mask[i] the model's tokens (NULL entry: all of them). Computes, as verl's compute_rollout_correction_and_rejection
 * _mask: the IS weights into is_w[i] (len[i] floats, 0 on tokens not the model's; is_w may be NULL, or the IS level
 * off), normalised to mean 1 over the batch when batch_normalize (and normalize is true); the rejection into keep[i]
 * (len[i] bytes: 1 where the model's token passes every rollout_rs option; keep may be NULL); and the metrics into
 * m (may be NULL), over the whole batch across red's ranks. */
void rollout_corr_compute(const struct rollout_corr *rc, int n, const int *len, const float *const *logp,
                          const float *const *rollout, const uint8_t *const *mask, const struct rc_reduce *red,
                          bool normalize, float *const *is_w, uint8_t *const *keep, struct rc_metrics *m);

#endif
