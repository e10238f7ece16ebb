/* A step's batch: its sequences in whole groups, each group's prompt and dataset index, and the decoded
 * responses; the batch owns them. Generated in one process (worker/gen/generate.h) or received from rollout
 * ranks (worker/plane/wire.h), trained on by the trainer. */
#ifndef GRPO_WORKER_STEP_BATCH_H
#define GRPO_WORKER_STEP_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/step/prompts.h"
#include "worker/step/seq.h"

/* A step's sequences, whole groups only. Sequence i belongs to group seqs[i].group (0..n_groups-1); the group's
 * prompt is group_prompt[g], its dataset index group_uid[g]. */
struct step_batch {
    struct rollout_seq *seqs;
    int n_seq, cap;
    int n_groups;
    const struct prompt_item **group_prompt; /* (n_groups) */
    int *group_uid;                          /* (n_groups) dataset index of the prompt (verl's uid) */
    char **resp_text;                        /* (n_seq) decoded responses */
};

/* Make room for `more` sequences and groups. */
void step_batch_reserve(struct step_batch *b, int more);
/* Keep the groups g with keep[g] (in their order, renumbered from 0) and free the others. */
void step_batch_keep_groups(struct step_batch *b, const bool *keep);
/* Token balance over n_dp trainer DP ranks (verl's sequence balancing): each group, largest first, to the rank
 * with the fewest tokens so far; dp_of_group[g] gets its rank. A group weighs the rows the update forwards for it:
 * with shared_prompts (actor_rollout_ref.actor.shared_prompt_packing in effect) its prompt once, else once per
 * sequence. Depends on the groups alone (ties: the lower group, the lower rank), so every rank that holds the same
 * batch computes the same. */
void step_batch_balance(const struct step_batch *b, int n_dp, bool shared_prompts, int *dp_of_group);
/* Keep DP rank dp's share of b under step_batch_balance over dp_size ranks (dp_size 1: all of it). */
void step_batch_keep_dp_share(struct step_batch *b, int dp, int dp_size, bool shared_prompts);
/* Which per-response value decides a group's learning signal (algorithm.filter_groups.metric). */
enum step_filter_metric {
    STEP_FILTER_SCORE,     /* seq_final_reward, seq_reward: the score with the overlong penalty */
    STEP_FILTER_RAW_SCORE, /* score: the scorer's value before the overlong penalty */
    STEP_FILTER_ACC,       /* acc: exact-answer accuracy (the score where a scorer does not know it) */
};
enum step_filter_metric step_filter_metric_from_name(const char *name);
/* Drop groups whose metric is the same for every response (no learning signal): DAPO's dynamic sampling. */
void step_batch_filter_groups(struct step_batch *b, enum step_filter_metric metric);
/* Keep only the first `groups` groups. */
void step_batch_truncate_groups(struct step_batch *b, int groups);
/* Move every group and sequence of src to the end of dst (src is left empty). */
void step_batch_append(struct step_batch *dst, struct step_batch *src);
void step_batch_free(struct step_batch *b);

/* Seeds of step k's random draws: a pure function of the base seed and k, so a resumed run draws the same. */
uint64_t rollout_step_seed(uint64_t seed, int64_t step, uint64_t salt);

#endif
