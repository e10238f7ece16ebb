/* Prompt datasets: JSONL files (our layout and verl's parquet-exported one),
 * the built-in synthetic tasks (arithmetic, countdown) generated from a seed,
 * and the seeded per-epoch prompt order that makes resume exact.
 *
 *   struct dataset train, val;
 *   char err[512];
 *   if (dataset_from_config(cfg, &train, &val, err, sizeof err) < 0) { log_error("data", "%s", err); exit(2); }
 *   struct data_cursor cur;
 *   data_cursor_init(&cur, train.n, cfg->data_train_batch_size, cfg->data_shuffle, cfg->data_seed, err, sizeof err);
 *   data_cursor_seek(&cur, saved_epoch, saved_index);       (on resume)
 *   data_cursor_next(&cur, idx);                             (batch_size sample indices)
 *
 * A sample's prompt is a list of chat messages; the trainer renders it with
 * the tokenizer's chat template (dataset_render_prompt). A JSONL `prompt`
 * string becomes one user message. Formats and the synthetic prompts'
 * wording: docs/rewards.md. */
#ifndef GRPO_WORKER_DATASET_H
#define GRPO_WORKER_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct grpo_config;
struct tokenizer;

struct prompt_message {
    char *role; /* "system", "user", "assistant", ... */
    char *content;
};

struct prompt_sample {
    char *data_source;  /* selects the reward scorer */
    char *ground_truth; /* text; a JSON number as written, an object/array as compact JSON */
    int n_messages;
    struct prompt_message *messages;
    char *extra_info_json; /* compact JSON object text, or NULL */
    char *agent_name;      /* verl's agent_name column (single_turn_agent, tool_agent), or NULL: the default */
    int line;              /* 1-based line of the JSONL file; 0 for generated samples */
};

struct dataset {
    int n;
    struct prompt_sample *samples;
    /* the columns that hold the prompt and the scorer's name (verl's data.prompt_key, data.reward_fn_key);
     * NULL: "prompt" (else "messages") and "data_source" */
    const char *prompt_key, *source_key;
};

/* Release every string and the array; the dataset is left empty. */
void dataset_free(struct dataset *d);

/* ---- JSONL ---- */

/* Append the samples of a JSONL file to d (initialise d to {0} first). Each
 * non-blank line is one JSON object with:
 *   prompt        string (one user message) or list of {"role", "content"} (verl layout);
 *   messages      list of {"role", "content"}, used when prompt is absent;
 *   ground_truth  string, number, object or array; or reward_model.ground_truth (verl layout);
 *   data_source   string; default_data_source when absent (NULL: required);
 *   extra_info    object, optional, kept as JSON text.
 * Other keys are ignored. Returns 0, or -1 with err "PATH:LINE: what is wrong"
 * (d then holds the samples read before the error; free it). A file with no
 * samples is an error. */
int dataset_load_jsonl(const char *path, const char *default_data_source, struct dataset *d, char *err, size_t errlen);

/* ---- synthetic tasks ---- */

/* SYNTH_TOOL_ARITHMETIC: arithmetic for a tool agent (agent_name tool_agent): a system message, two worked
 * examples that call the calculator in the hermes format, then the question; scored as arithmetic */
enum synth_task { SYNTH_ARITHMETIC = 0, SYNTH_COUNTDOWN = 1, SYNTH_TOOL_ARITHMETIC = 2 };

/* The difficulty knobs. */
struct synth_opts {
    enum synth_task task;
    /* arithmetic: num_operands operands of min_digits..max_digits digits joined by operators
     * drawn from ops (any of "+-*"); negative results are redrawn unless allow_negative. */
    int min_digits, max_digits, num_operands;
    char ops[8];
    bool allow_negative;
    int shots; /* arithmetic: worked examples (0..SYNTH_MAX_SHOTS) before the question, as earlier chat turns */
    /* countdown: min_numbers..max_numbers numbers in 1..max_number; the target, 1..max_target,
     * is the value of a random equation that uses each number once (so every task is solvable). */
    int min_numbers, max_numbers, max_number, max_target;
};

enum { SYNTH_MAX_SHOTS = 2 };

/* Defaults: arithmetic with two operands of 1-2 digits, + and -, no negative results;
 * countdown with 3-4 numbers in 1..99 and targets in 1..100 (TinyZero's Countdown-Tasks-3to4). */
void synth_default_opts(enum synth_task task, struct synth_opts *o);
/* "arithmetic" / "countdown" -> task; -1 when unknown. */
int synth_task_from_name(const char *name);
/* The data_source of the task's samples ("arithmetic" or "countdown"), which selects its scorer. */
const char *synth_task_name(enum synth_task task);

/* Generate num_train training and num_val validation samples from seed. Same
 * seed and options, same samples, on every machine (integer-only generation
 * with our own PRNG). The two sets come from different streams of the seed
 * and no validation prompt appears in the training set; validation prompts
 * are distinct from each other. Either count may be 0 (train or val may then
 * be NULL). 0, or -1 with err (bad options, too few distinct prompts). */
int synth_generate(const struct synth_opts *o, uint64_t seed, int num_train, int num_val, struct dataset *train,
                   struct dataset *val, char *err, size_t errlen);

/* The prompt text of one arithmetic question ("What is 37 + 48? ...") and of a countdown task;
 * the generator uses these, tests and tools may too. Return malloc'd strings. */
char *synth_arithmetic_prompt(const char *expression);
char *synth_countdown_prompt(const int64_t *numbers, int n, int64_t target);

/* ---- from the configuration ---- */

/* data.train_files / data.val_files (one path, or several separated by commas), else the
 * synthetic task (data.synthetic.task, num_train, num_val, data.seed, default options).
 * A path ending in .parquet (verl's layout) is converted once by scripts/parquet_to_jsonl.py
 * into a cached JSONL copy, which is then loaded; errors name the parquet file (docs/rewards.md).
 * JSONL samples without data_source are an error. A JSONL training set without
 * data.val_files gives an empty validation set. 0, or -1 with err. */
int dataset_from_config(const struct grpo_config *cfg, struct dataset *train, struct dataset *val, char *err,
                        size_t errlen);

/* ---- prompt order ---- */

/* A small deterministic PRNG (splitmix64), the same on every machine. */
struct data_rng {
    uint64_t state;
};
/* Seed a stream: different (seed, stream) pairs give independent sequences. */
void data_rng_seed(struct data_rng *g, uint64_t seed, uint64_t stream);
uint64_t data_rng_next(struct data_rng *g);
/* Uniform integer in [0, bound) without modulo bias (bound > 0). */
uint64_t data_rng_below(struct data_rng *g, uint64_t bound);

/* The order of epoch `epoch`: a permutation of 0..n-1 that depends only on (n, seed, epoch). */
void dataset_order(int n, uint64_t seed, long epoch, int *out_perm);

/* Position in the training prompts, verl's sampler with drop_last: each epoch
 * yields n / batch_size batches in that epoch's order (shuffled or not); the
 * tail that does not fill a batch is skipped. (epoch, index) is the whole state:
 * save it in the checkpoint and seek to it on resume. */
struct data_cursor {
    int n, batch_size;
    bool shuffle;
    uint64_t seed;
    long epoch; /* current epoch */
    int index;  /* position of the next batch's first sample in the epoch's order */
    int *perm;  /* the epoch's order (identity when not shuffling) */
};
/* 0, or -1 with err when n < batch_size (no complete batch). */
int data_cursor_init(struct data_cursor *c, int n, int batch_size, bool shuffle, uint64_t seed, char *err,
                     size_t errlen);
void data_cursor_free(struct data_cursor *c);
/* Batches per epoch (n / batch_size). */
int data_cursor_batches_per_epoch(const struct data_cursor *c);
/* Continue at (epoch, index) as saved; an index past the last full batch moves to the next epoch. */
void data_cursor_seek(struct data_cursor *c, long epoch, int index);
/* Write the next batch_size sample indices to out and advance (rolling over into the next epoch).
 * Returns the epoch the batch belongs to. */
long data_cursor_next(struct data_cursor *c, int *out);

/* ---- rendering ---- */

/* The prompt as text for the model: the sample's messages through the tokenizer's chat template
 * with the generation prompt appended (malloc'd; encode with tokenizer_encode), or NULL with err. */
char *dataset_render_prompt(const struct tokenizer *t, const struct prompt_sample *s, char *err, size_t errlen);

#endif
