/* The hybrid role's step sources, the ones that generate in the trainer's own processes: one process alone
 * (local_source.c: draw, generate and score step k here) and colocated ranks (hybrid_role.c: every rank makes its
 * share of the step). The trainer library (worker/trainer/) knows neither; each is a struct trainer_source. */
#ifndef GRPO_WORKER_HYBRID_SOURCE_H
#define GRPO_WORKER_HYBRID_SOURCE_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/trainer/trainer.h"

struct grpo_config;
struct metrics;

/* DAPO's dynamic sampling (algorithm.filter_groups) in a generating source: what its step took. */
struct hybrid_dapo {
    bool filtered;      /* on */
    double gen_batches; /* batches of data.train_batch_size prompts generated for the step */
    int kept_groups;    /* groups kept (scores not all equal), at most data.train_batch_size */
};
/* DAPO's metrics of the step (train/num_gen_batches, train/num_kept_groups) when it was on: a generating source's
 * first (hybrid_role.c). */
void hybrid_dapo_metrics(struct metrics *m, const struct hybrid_dapo *d);

/* The one-process source's state: the trainer it draws for (set once the trainer exists: local_source_ready). */
struct local_source {
    struct trainer *t;
    const struct grpo_config *cfg;
    struct hybrid_dapo dapo; /* the step it made last */
};

/* The one-process source of ls (zeroed and given cfg here), to create its trainer with. */
struct trainer_source local_source(struct local_source *ls, const struct grpo_config *cfg);
/* run_trainer_process's on_created for the one-process source: ud is its struct local_source. */
void local_source_ready(void *ud, struct trainer *t);
/* A trainer alone in this process fed by the one-process source (the source goes with trainer_free): model,
 * reference, tokenizer, data, scorers, run directory, and resume from a checkpoint when trainer.resume_mode asks.
 * NULL with err on failure. */
struct trainer *local_trainer_create(const struct grpo_config *cfg, const struct trainer_hooks *hooks, char *err,
                                     size_t errlen);

#endif
