/* Does a run fit the model and the machine? Checked before anything large is allocated, so that an absurd
 * (but in-range) size is an error naming the key, the bytes needed and the bytes there are, instead of an
 * allocation failure or a machine driven into swap. */
#ifndef GRPO_WORKER_MODEL_FIT_H
#define GRPO_WORKER_MODEL_FIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct grpo_config;

/* Memory this process can have: the machine's physical memory (sysconf), or the cgroup's limit when lower.
 * Constant for the life of the process, so a check against it gives the same answer at every step. */
uint64_t machine_memory_bytes(void);

/* Bytes of the weights of a model of configuration c (the tied LM head counted once); computed in floating
 * point, so absurd sizes give a huge number rather than an overflow. */
double model_weight_bytes(const struct model_config *c);

/* What a training run with configuration cfg on model m holds at once, at least: the weights, their gradients,
 * AdamW's two moments and (with a KL term) the reference's weights, plus the KV caches and logits of the largest
 * generation batch (training rollouts or validation). */
struct run_footprint {
    double state_bytes; /* weights, gradients, optimizer state, reference */
    double gen_bytes;   /* KV caches and logits of the larger generation batch */
    int gen_seqs;       /* sequences decoded together in that batch */
    int seq_tokens;     /* data.max_prompt_length + data.max_response_length */
    bool gen_is_val;    /* the larger batch is validation's */
};
void run_footprint(const struct model_config *m, const struct grpo_config *cfg, struct run_footprint *fp);

/* 0 if a run of cfg fits model m and mem_bytes of memory (0: machine_memory_bytes()); else -1 with err naming
 * the key(s) at fault: a prompt plus response longer than max_position_embeddings, or a footprint larger than
 * the memory (with the bytes needed and the bytes available). */
int run_fit_check(const struct model_config *m, const struct grpo_config *cfg, uint64_t mem_bytes, char *err,
                  size_t errlen);

#endif
