/* The GRPO run loop in one process (all roles): for each step draw prompts,
 * generate n responses each, score them, recompute old log-probs, compute
 * reference log-probs, advantages, then the PPO/GRPO update; validate, log
 * metrics, checkpoint. Resuming from a checkpoint continues bit-identically. */
#ifndef GRPO_WORKER_TRAINER_H
#define GRPO_WORKER_TRAINER_H

#include <stddef.h>
#include <stdint.h>

struct grpo_config;
struct metrics;
struct trainer;

/* What a safe point asks the trainer to do. */
enum trainer_action { TRAINER_CONTINUE = 0, TRAINER_CHECKPOINT = 1, TRAINER_STOP = 2 };

/* Optional callbacks, e.g. the control-plane client. All may be NULL. */
struct trainer_hooks {
    void *ctx;
    /* entering a phase of a step ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "validate",
     * "checkpoint") */
    void (*phase)(void *ctx, int64_t step, const char *phase);
    /* after each step (and after validation at step 0) with its metrics */
    void (*step_done)(void *ctx, int64_t step, int64_t total_steps, const struct metrics *m);
    /* at each safe point (between generation rounds and after each step); may block while paused; returns an
     * enum trainer_action, possibly OR'ed (TRAINER_CHECKPOINT | TRAINER_STOP) */
    int (*safe_point)(void *ctx, int64_t step);
};

/* Set up a run from the configuration: model, reference, tokenizer, data, scorers, run directory, and resume
 * from a checkpoint when trainer.resume_mode asks. NULL with err on failure. */
struct trainer *trainer_create(const struct grpo_config *cfg, const struct trainer_hooks *hooks, char *err,
                               size_t errlen);
/* Run to trainer.total_training_steps (or a stop request). 0 when finished or stopped cleanly, -1 on error. */
int trainer_run(struct trainer *t);
void trainer_free(struct trainer *t);

/* Write a checkpoint of the current step now (at a safe point); 0 or -1 (logged). */
int trainer_save_checkpoint(struct trainer *t);

/* Current progress (for status reporting). */
int64_t trainer_step(const struct trainer *t);
int64_t trainer_total_steps(const struct trainer *t);
/* Run directory (metrics.jsonl, tensorboard/, checkpoints/, charts). */
const char *trainer_run_dir(const struct trainer *t);
/* The policy's parameters (for equivalence tests). */
const float *trainer_params(const struct trainer *t, size_t *n);

#endif
