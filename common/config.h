/* One configuration system for every binary: typed keys with defaults and
 * one-line descriptions (config_keys.def), loaded from YAML, overridden by
 * verl-style `a.b.c=value` arguments, printed with --print-config.
 *
 * Errors name the key and where it came from (file and line, or the command
 * line) and suggest the closest known key for a typo. */
#ifndef GRPO_COMMON_CONFIG_H
#define GRPO_COMMON_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/config_key_names.h" /* KEY_field: a key's dotted name, for messages */

#define CFG_FLIST_MAX 8

enum cfg_type { CFG_INT, CFG_FLOAT, CFG_BOOL, CFG_STR, CFG_ENUM, CFG_FLIST };

struct cfg_flist {
    int n;
    double v[CFG_FLIST_MAX];
};

/* The effective configuration; one field per key of config_keys.def. */
struct grpo_config {
#define CFG_FIELD_INT long long
#define CFG_FIELD_FLOAT double
#define CFG_FIELD_BOOL bool
#define CFG_FIELD_STR char *
#define CFG_FIELD_ENUM char *
#define CFG_FIELD_FLIST struct cfg_flist
#define X(field, name, type, def, lo, hi, choices, help) CFG_FIELD_##type field;
#include "config_keys.def"
#undef X
    /* where each key's value came from: "default", "FILE:LINE" or "command line" */
    char **origin;
    /* verl keys accepted with no effect here, as "name=value (why)" (config_verl_class) */
    char **noted;
    int n_noted;
};

/* verl keys that are not ours: accepted and noted (they steer only verl's Python machinery), or refused (they ask
 * for a feature we do not have yet); *why says which reason or which feature. VERL_UNKNOWN: not a verl key we
 * know of (an unknown key, with a suggestion). */
enum verl_class { VERL_UNKNOWN, VERL_NOTED, VERL_REFUSED };
enum verl_class config_verl_class(const char *name, const char *value, const char **why);
/* Why value of our key name is refused where verl knows it (algorithm.adv_estimator=gae, ...); NULL otherwise. */
const char *config_verl_value_refused(const char *name, const char *value);
/* The table behind it (docs/verl.md; tests walk it): pattern (a name or a prefix ending in ".*"), the values
 * accepted (NULL: any), why they change nothing, and the feature other values ask for (either may be NULL). */
/* trainer.device as the ranks use it: "cpu" or "cuda"; auto (grpo-worker resolves it at start-up) counts as cpu
 * for code that builds a trainer or rollout from a configuration it did not resolve. */
const char *config_device(const struct grpo_config *c);
/* Whether key `name` was given (its value does not come from the built-in default). */
bool config_is_set(const struct grpo_config *c, const char *name);
/* The PPO clip bounds: clip_ratio_low/high, each falling back to actor_rollout_ref.actor.clip_ratio when it is
 * not given (verl's fallback). */
double config_clip_low(const struct grpo_config *c);
double config_clip_high(const struct grpo_config *c);
/* Steps of the run: trainer.total_training_steps when given (or -1 not given with trainer.total_epochs given:
 * verl's null), else total_epochs x (n_train / data.train_batch_size), as verl derives them. */
long long config_total_steps(const struct grpo_config *c, long long n_train);
/* Prompts drawn per generation round: data.gen_batch_size when given (DAPO), else data.train_batch_size. */
int config_gen_batch_size(const struct grpo_config *c);
/* Generation records a mixture of experts' routing and sends it with the sequences (rollout
 * enable_rollout_routing_replay, or actor router_replay.mode R3, which needs it). */
bool config_records_routes(const struct grpo_config *c);
/* actor_rollout_ref.rollout.expert_parallel_size > 1: generation holds the experts whole over each engine's TP
 * group (struct model_layout's experts_over_tp) */
bool config_rollout_experts_over_tp(const struct grpo_config *c);
/* Generation rounds per step: 1 without algorithm.filter_groups.enable, else max_num_gen_batches (0: 1000). */
int config_filter_rounds(const struct grpo_config *c);

/* Our key that verl's name `name` means (actor_rollout_ref.model.lora.rank: actor_rollout_ref.model.lora_rank), or
 * NULL. config_find follows it. */
const char *config_verl_alias(const char *name);
int config_verl_alias_count(void);
void config_verl_alias_entry(int i, const char **verl, const char **ours);
int config_verl_count(void);
void config_verl_entry(int i, const char **pattern, const char **ok, const char **noted, const char **refused);

/* Static description of one key. */
struct cfg_key_info {
    const char *name;
    enum cfg_type type;
    const char *def;
    double min, max;
    const char *choices; /* '|'-separated, ENUM only */
    const char *help;
    size_t offset; /* of the field in struct grpo_config */
};

/* Error text of a failed load or override, ready to print. */
struct cfg_error {
    char msg[1024];
};

/* Number of keys and their table, in definition order. */
int config_num_keys(void);
const struct cfg_key_info *config_key(int i);
/* Look a key up by its dotted name; NULL if unknown. */
const struct cfg_key_info *config_find(const char *name);
/* Closest known key to a misspelt name (edit distance), or NULL if none is close. */
const char *config_suggest(const char *name);

/* Fill every key with its default. */
void config_init(struct grpo_config *c);
/* Release the strings owned by the configuration. */
void config_free(struct grpo_config *c);
/* Set one key from text; origin is recorded for --print-config. Returns 0 or -1 with err. */
int config_set(struct grpo_config *c, const char *name, const char *value, const char *origin, struct cfg_error *err);
/* Hydra's --config-name / --config-path options (verl's launch scripts give them): verl's own trainer configs are
 * noted, the fully-async trainer's turns async_training.enable on, any other is refused. 0, or -1 (err). */
int config_hydra_option(struct grpo_config *c, const char *option, const char *value, struct cfg_error *err);
/* Whether name is a key whose value is a map of free names (data.apply_chat_template_kwargs), or one of its
 * entries (data.apply_chat_template_kwargs.NAME): config_set takes both. */
bool config_is_map_key(const char *name);
/* Load a YAML file of nested mappings (verl layout). Returns 0 or -1 with err. */
int config_load_yaml(struct grpo_config *c, const char *path, struct cfg_error *err);
/* Apply one command-line override in Hydra's forms: `a.b.c=value`, `+a.b.c=value`, `++a.b.c=value`, and `~a.b.c`
 * (or `~a.b.c=value`) to put a key back to its default; a value may keep one level of quotes ('error') as a
 * shell leaves them, and `null` is the default. Returns 0 or -1 with err. */
int config_apply_override(struct grpo_config *c, const char *arg, struct cfg_error *err);
/* trainer.logger's sinks as CFG_LOG_* bits; skipped (may be NULL) gets the verl sinks that need a remote service
 * ("wandb, mlflow"), which are left out with a notice. 0, or -1 with err for an unknown sink. */
enum { CFG_LOG_CONSOLE = 1, CFG_LOG_TENSORBOARD = 2, CFG_LOG_FILE = 4 };
int config_logger_sinks(const struct grpo_config *c, unsigned *sinks, char *skipped, size_t skipped_len,
                        struct cfg_error *err);
/* LoRA's target_modules ("all-linear", "[q_proj,v_proj]", "q_proj, v_proj", quoted or not) as bits in the order
 * q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (the model's enum proj_kind). 0, or -1 with why
 * naming the entry that is none of them. */
int config_lora_targets(const char *list, unsigned *mask, char *why, size_t len);
/* A new adapter's projections: target_modules without exclude_modules (the same names; a name there that is none
 * of them is refused, and so is an exclusion that leaves nothing). 0, or -1 with why naming the key. */
int config_lora_mask(const struct grpo_config *c, unsigned *mask, char *why, size_t len);
/* The items of a list value: verl's list form ['a', "b"] or [a, b], or comma-separated, each item's quotes and
 * spaces dropped (an empty item skipped). The count, with up to max items copied into items (malloc'd, the caller
 * frees them); more than max: -1, nothing kept. */
#define CFG_GDPO_MAX_KEYS 8
int config_list_items(const char *list, char **items, int max);
/* algorithm.gdpo_reward_keys (into keys, up to CFG_GDPO_MAX_KEYS, malloc'd) and gdpo_reward_weights (weights, 1 each
 * when not given): the number of keys, or -1 with why (too many, weights that are not numbers or not one per key). */
int config_gdpo_keys(const struct grpo_config *c, char **keys, double *weights, char *why, size_t whylen);
/* The reward components each response carries: with algorithm.adv_estimator=gdpo its keys' count, else 0. */
int config_gdpo_parts(const struct grpo_config *c);
/* Put a key back to its default (Hydra's ~key); a noted verl key is forgotten. 0, or -1 with err (unknown). */
int config_reset(struct grpo_config *c, const char *name, struct cfg_error *err);
/* Values derived from others, once every source is read (config_from_args calls it before config_validate):
 * fully-async training (async_training.enable) is on when any async_training.* key is given, and then
 * data.train_batch_size 0 (verl's fully-async value) is async_training.require_batches x ppo_mini_batch_size and
 * data.gen_batch_size 1 (verl's, one sample at a time) is the default. 0, or -1 with err (a batch size that
 * disagrees). */
int config_resolve(struct grpo_config *c, struct cfg_error *err);
/* Check relations between keys (for example clip bounds, batch divisibility). 0 or -1 with err. */
int config_validate(const struct grpo_config *c, struct cfg_error *err);

/* The micro-batches whose size verl also takes as a global, deprecated key (actor.ppo_micro_batch_size,
 * rollout.log_prob_micro_batch_size, ref.log_prob_micro_batch_size). */
enum cfg_micro { CFG_MICRO_ACTOR, CFG_MICRO_OLD_LOGP, CFG_MICRO_REF };
/* A trainer rank's micro-batch (sequences) of kind `which` with dp_size data-parallel ranks: the _per_gpu key, or
 * the global key divided by dp_size (rounded down, as verl divides it). *global_key is set to the global key's
 * name when that one was used (else NULL), for the deprecation notice. > 0, or -1 with why when the global one
 * is smaller than the DP size. */
int config_micro_batch(const struct grpo_config *c, enum cfg_micro which, int dp_size, const char **global_key,
                       char *why, size_t whylen);
/* Print the effective configuration as nested YAML, each value followed by its origin. */
void config_print(const struct grpo_config *c, FILE *out);
/* Print the reference table of every key as Markdown (docs/configuration.md). */
void config_print_reference(FILE *out);
/* Render one key's current value as text (YAML scalar or flow list). */
void config_value_text(const struct grpo_config *c, const struct cfg_key_info *k, char *buf, size_t len);
/* 64-bit FNV-1a digest of the effective values (not origins) of the keys that shape the run: equal
 * configs, equal digest. Operational keys (grpod.*, trainer.log_level) are left out, since hosts and
 * restarts may differ in them. */
uint64_t config_digest(const struct grpo_config *c);

/* The run's configuration as text (common/config_text.c), which the ranks send grpod and grpod hands a
 * replacement rank: one `name=value` line per key config_digest covers, in table order; strings as they are,
 * with a backslash and control characters escaped (\\, \n, \xHH). */
/* Whether a key shapes the run (config_digest covers it): every key but grpod.* and a few operational ones. */
bool config_key_shapes_run(const char *name);
/* Whether a key's value was given (a file or the command line), not its default. */
bool config_given(const struct grpo_config *c, const char *name);
enum {
    CONFIG_TEXT_GIVEN = 1,    /* only the keys given (config_given) */
    CONFIG_TEXT_NO_COUNTS = 2 /* without the rank counts (placement.*_ranks, verl's nnodes x n_gpus_per_node) */
};
/* The text of c's keys that shape the run (flags: CONFIG_TEXT_*). Caller frees. */
char *config_run_text(const struct grpo_config *c, unsigned flags);
/* Set the keys of a run text (at most max bytes) in c, each with origin; keys it lacks keep their values. 0, or
 * -1 with why naming origin, the line and what is wrong (not name=value, not a key that shapes the run, a bad
 * value). */
int config_apply_run_text(struct grpo_config *c, const char *text, size_t max, const char *origin, char *why,
                          size_t whylen);
/* Compare two run texts key by key (only_a: only the keys of a). Returns how many keys differ, and lists the
 * first `show` of them in out as "name (A_NAME: value, B_NAME: value), ...", then "and N more". */
int config_text_diff(const char *a, const char *a_name, const char *b, const char *b_name, bool only_a, int show,
                     char *out, size_t outlen);

/* Command-line handling shared by every binary: consumes `--config FILE`,
 * `--print-config`, `--config-reference` and `a.b=v` overrides from argv,
 * leaving other arguments in place (argc updated). Returns 0 to go on, 1 when
 * the request was fully handled (something was printed), -1 on error (printed). */
int config_from_args(struct grpo_config *c, int *argc, char **argv);

#endif
