/* Rollout audit files (trainer.rollout_data_dir): one JSON line per sequence of a step, with the prompt and
 * response (text and ids), scores, advantage, and the rollout, old and reference log-probs. DP rank 0 writes
 * STEP.jsonl, DP rank r > 0 its own share in STEP.dpR.jsonl; "uid" is the group's position in the step, so a
 * step's files together hold every uid exactly rollout.n times. */
#ifndef GRPO_WORKER_STEP_AUDIT_H
#define GRPO_WORKER_STEP_AUDIT_H

#include <stdint.h>

#include "worker/step/batch.h"

/* Write b (n responses per prompt) as step's file under dir; nothing when dir is NULL or empty. A failed write
 * is logged once and reported to metrics_output_failed(): the trainer then stops the run with the reason. */
void rollout_audit_write(const char *dir, int64_t step, int dp_rank, int n, const struct step_batch *b);

#endif
