/* Validation: generate on the held-out prompts (greedy, or actor_rollout_ref.rollout.val_kwargs), score, and
 * report per data_source with verl's names: val-core/DS/reward/mean@N (and best@N when N > 1), the
 * exact-answer accuracy val-core/DS/acc/mean@N (when the scorer knows it), and timing_s/testing. Several ranks
 * can share the generation (gen_validate_part) and one report it (gen_validate_report). */
#ifndef GRPO_WORKER_GEN_VALIDATE_H
#define GRPO_WORKER_GEN_VALIDATE_H

#include <stdint.h>

#include "worker/gen/generate.h"

struct metrics;

/* One validation response: its prompt (index in the validation set), sample, score and accuracy (NaN: unknown). */
struct val_score {
    double prompt, sample, raw_score, acc; /* doubles: an array of them travels as float64 */
};

/* Validate the policy of rc on val with the given seed (sampling draws); metrics into m. With dump_dir (NULL or
 * empty: none), the responses into dump_dir/STEP.jsonl (gen_validate_dump). */
void gen_validate(const struct gen_ctx *rc, const struct prompt_set *val, uint64_t seed, int64_t step,
                  const char *dump_dir, struct metrics *m);

/* Part `part` of `parts` of validation: the chunks of data.val_batch_size prompts whose index is part mod parts,
 * generated and scored as one process would (the same seeds). Its responses' scores into *out (the caller
 * frees), and with texts (NULL: not wanted) their texts into *texts (malloc'd, each too); returns their count. */
int gen_validate_part(const struct gen_ctx *rc, const struct prompt_set *val, uint64_t seed, int part, int parts,
                      struct val_score **out, char ***texts);
/* trainer.validation_data_dir (verl's _dump_generations): DIR/STEP.jsonl, a line for each validation response in
 * the order one process makes them (by prompt, then sample): "input" (the prompt as rendered), "output" (the
 * response), "gts" (the ground truth), "score", "step", and "acc" where the scorer knows it, "data_source".
 * texts[i] is s[i]'s response. Nothing when dir is NULL or empty; a failed write stops the run as a rollout
 * audit's does (metrics_output_failed). */
void gen_validate_dump(const char *dir, int64_t step, const struct prompt_set *val, const struct val_score *s,
                       char *const *texts, int n);
/* Responses per validation prompt (1 greedy, val_kwargs.n when sampling). */
int gen_validate_n(const struct grpo_config *c);
/* The metrics of every part's scores together (s is sorted in place), with validation's seconds. */
void gen_validate_report(const struct grpo_config *c, const struct prompt_set *val, struct val_score *s, int n_s,
                         double seconds, struct metrics *m);

#endif
