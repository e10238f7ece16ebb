/* Rollout audit files (trainer.rollout_data_dir): one JSON line per sequence of a step, with the prompt and
 * response (text and ids), scores, advantage (its first model token's), the rollout, old and reference log-probs,
 * and, where some of the response was put in from outside (a tool's answer), "response_mask": 1 for each of the
 * model's tokens, 0 for the others, one per response id; "advantages" (every token's), and with rollout correction
 * "rollout_is_weights" and "rollout_rs_mask" (1: the loss trains on the token); with remax "reward_baseline" (the
 * greedy response's reward), with calculate_sum_pi_squared "sum_pi_squared" (every token's), with gdpo each reward
 * component under its key, in fully-async training each token's policy version. One file a step,
 * STEP.jsonl, as verl writes: with several DP ranks each makes its lines (rollout_audit_text) and DP rank 0
 * writes them all, in DP rank order (rollout_audit_save); "group" is the group's position in the step, so a
 * step's file holds every group exactly rollout.n times, and "uid" the prompt's index in the dataset. */
#ifndef GRPO_WORKER_STEP_AUDIT_H
#define GRPO_WORKER_STEP_AUDIT_H

#include <jansson.h>
#include <stdint.h>

#include "worker/step/batch.h"

#include <stdbool.h>
#include <stddef.h>

/* What the lines hold besides the rest: the sequences' reward_baseline (remax), and the names of their reward
 * components (gdpo; NULL: none), each written as a field of its own as verl's dump writes the reward function's
 * extra entries (a name the line holds already is left out). */
struct audit_extras {
    bool reward_baseline;
    const char *const *part_names;
    /* fully-async training: "policy_version" (the newest version among its tokens, verl's trajectory version),
     * "policy_versions" (each token's; where its unit sits in the stream: RUN_DIR/async_schedule.jsonl) */
    bool versions;
};
/* A JSON string of text; bytes that are not UTF-8 (a response cut inside a character, or a byte-level model's stray
 * bytes) become U+FFFD, as Hugging Face's decode does, instead of losing the field. */
json_t *audit_json_text(const char *text);
/* b's lines (n responses per prompt), each ending in a newline, malloc'd; *len their bytes. x may be NULL. */
char *rollout_audit_text(int64_t step, int n, const struct step_batch *b, const struct audit_extras *x, size_t *len);
/* DIR/STEP.jsonl made of parts[0..nparts) (lens[p] bytes each), in order; nothing when dir is NULL or empty. A
 * failed write is logged once and reported to metrics_output_failed(): the trainer then stops the run with it. */
void rollout_audit_save(const char *dir, int64_t step, char *const *parts, const size_t *lens, int nparts);

#endif
