/* Validation: generate on the held-out prompts (greedy, or actor_rollout_ref.rollout.val_kwargs), score, and
 * report per data_source with verl's names: val-core/DS/reward/mean@N (and best@N when N > 1), the
 * exact-answer accuracy val-core/DS/acc/mean@N (when the scorer knows it), and timing_s/testing. */
#ifndef GRPO_WORKER_GEN_VALIDATE_H
#define GRPO_WORKER_GEN_VALIDATE_H

#include <stdint.h>

#include "worker/gen/generate.h"

struct metrics;

/* Validate the policy of rc on val with the given seed (sampling draws); metrics into m. */
void rollout_validate(const struct rollout_ctx *rc, const struct prompt_set *val, uint64_t seed, struct metrics *m);

#endif
