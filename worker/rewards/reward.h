/* Reward scoring of finished responses, verl style: each sample's data_source
 * string picks a scorer, the scorer turns (response text, ground truth) into a
 * double (usually 0 or 1). Built-in rule scorers cover gsm8k, the synthetic
 * arithmetic and countdown tasks and MATH-style \boxed answers; a custom
 * scorer can be loaded from a shared library (custom_reward_function.path /
 * .name). See docs/rewards.md for every scorer and the accepted answer forms.
 *
 *   char err[512];
 *   struct reward_fn *r = reward_create(cfg, err, sizeof err);
 *   if (!r) { log_error("reward", "%s", err); exit(2); }
 *   reward_score_batch(r, items, n, scores, reasons);   (reasons may be NULL)
 *   reward_free(r);
 *
 * Isolation: a custom scorer always runs in a forked child process, fed the
 * batch and streaming one result per sample back over a pipe. A sample whose
 * scorer crashes (any signal), exits, or runs past the per-sample timeout gets
 * reward 0 and a logged reason ("sample 17 (data_source countdown): scorer
 * killed by SIGSEGV"); the remaining samples go on in a fresh child. Built-in
 * scorers are bounded and run in-process unless reward_set_isolate_builtin()
 * asks for the same isolation. */
#ifndef GRPO_WORKER_REWARD_H
#define GRPO_WORKER_REWARD_H

#include <stdbool.h>
#include <stddef.h>

struct grpo_config;
struct reward_fn;

/* One response to score. data_source and solution_str must not be NULL;
 * ground_truth NULL is passed on as ""; extra_info_json NULL as "{}". */
struct reward_item {
    const char *data_source;     /* selects the scorer, e.g. "openai/gsm8k", "arithmetic", "countdown" */
    const char *solution_str;    /* the generated response text (without the prompt) */
    const char *ground_truth;    /* the sample's reference answer, as text (JSON text for countdown) */
    const char *extra_info_json; /* the sample's extra_info object as JSON text, or NULL */
};

/* The custom scorer's C signature (custom_reward_function.name, default
 * "compute_score"). Every argument is a NUL-terminated UTF-8 string, never
 * NULL (extra_info_json is "{}" when the sample has none). The return value is
 * the reward; NaN or infinity counts as a failed sample (reward 0). */
typedef double (*reward_custom_fn)(const char *data_source, const char *solution_str, const char *ground_truth,
                                   const char *extra_info_json);

/* Per-sample time limit of isolated scoring when none is set (seconds). */
#define REWARD_DEFAULT_TIMEOUT_S 5.0
/* Longest reason text kept for a failed sample (bytes, with the NUL). */
#define REWARD_REASON_MAX 200

/* Build the scorer set from the configuration: built-in scorers by data_source,
 * or, when custom_reward_function.path is set, the custom scorer (dlopen +
 * dlsym, checked here so a wrong path or symbol fails before training).
 * Returns NULL with err ("custom_reward_function.path: cannot load '...': ...")
 * on failure; with algorithm.adv_estimator=gdpo also when the scorer is not a Python one (its reward components are
 * entries of the dict it returns). cfg may be NULL: built-in scorers only. */
struct reward_fn *reward_create(const struct grpo_config *cfg, char *err, size_t errlen);
/* Same without a configuration: path NULL or "" means built-ins only; name NULL means "compute_score". */
struct reward_fn *reward_create_custom(const char *path, const char *name, char *err, size_t errlen);
void reward_free(struct reward_fn *r);

/* Per-sample time limit of isolated scoring (default REWARD_DEFAULT_TIMEOUT_S; > 0). */
void reward_set_timeout(struct reward_fn *r, double seconds);
/* Run the built-in scorers in the forked child too (default false: in-process). */
void reward_set_isolate_builtin(struct reward_fn *r, bool isolate);
/* Whether a custom scorer is loaded. */
bool reward_is_custom(const struct reward_fn *r);
/* Whether this reward function can score samples of data_source: always true
 * with a custom scorer, otherwise whether a built-in scorer serves it. Lets the
 * trainer reject a dataset up front instead of scoring it 0 forever. */
bool reward_supports(const struct reward_fn *r, const char *data_source);

/* Score n items into scores[0..n-1]. Never fails: a sample that cannot be
 * scored (unknown data_source, malformed ground truth, crashed or hung or
 * non-finite custom scorer) gets 0, a warning in the log, and, when reasons is
 * not NULL, reasons[i] = a malloc'd text the caller frees; reasons[i] is NULL
 * for every sample scored normally (a wrong answer is not a failure). */
void reward_score_batch(struct reward_fn *r, const struct reward_item *items, int n, double *scores, char **reasons);
/* The same, and with algorithm.adv_estimator=gdpo each item's reward components (algorithm.gdpo_reward_keys: entries
 * of the dict a Python scorer returns) into parts (n x reward_num_parts, row-major; NULL: not wanted). An item whose
 * dict lacks one fails (reward 0, every component 0). */
void reward_score_batch_parts(struct reward_fn *r, const struct reward_item *items, int n, double *scores,
                              char **reasons, double *parts);
/* The components reward_score_batch_parts gives (0 but with gdpo; a NULL r: 0) and the name of component k. */
int reward_num_parts(const struct reward_fn *r);
const char *reward_part_name(const struct reward_fn *r, int k);
/* One item; why (may be NULL) receives the failure reason or "". */
double reward_score_one(struct reward_fn *r, const struct reward_item *item, char *why, size_t whylen);

/* Exact-answer accuracy of one item, apart from format credit (reward_builtin_accuracy: 1 or 0), for the
 * val-core/DS/acc and critic/acc metrics; NaN when it is unknown (a custom scorer, or a data_source without a
 * built-in scorer). Pure and bounded: runs in-process. */
double reward_accuracy(const struct reward_fn *r, const struct reward_item *item);

/* Samples that failed (reward 0 with a reason) since reward_create. */
long reward_num_failures(const struct reward_fn *r);

/* DAPO's soft overlong penalty (reward_model.overlong_buffer.*): 0 for responses
 * up to max_response_length - buffer_len tokens, then falling linearly to
 * -penalty_factor at max_response_length. Add it to the score. */
double reward_overlong_penalty(int response_length, int max_response_length, int buffer_len, double penalty_factor);

#endif
