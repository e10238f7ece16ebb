/* Token sampling: temperature, top-k, top-p (nucleus) and greedy, from a
 * counter-free RNG state per sequence so results do not depend on batching. */
#ifndef GRPO_WORKER_SAMPLER_H
#define GRPO_WORKER_SAMPLER_H

#include <stdint.h>

/* xoshiro256** state. */
struct rng {
    uint64_t s[4];
};

/* Seed from a 64-bit seed and a stream number (e.g. prompt and sample index): distinct streams never overlap
 * in practice. */
void rng_seed(struct rng *r, uint64_t seed, uint64_t stream);
uint64_t rng_next(struct rng *r);
/* Uniform in [0, 1). */
double rng_uniform(struct rng *r);

struct sampler_params {
    float temperature; /* 0: greedy */
    float top_p;       /* 1: off */
    int top_k;         /* <= 0: off */
};

/* Scratch for sampling over a vocabulary of V (sorting space). */
struct sampler_scratch;
struct sampler_scratch *sampler_scratch_create(int V);
void sampler_scratch_free(struct sampler_scratch *s);

/* Pick a token from logits (V). *logp gets its log-probability under softmax(logits / temperature)
 * (temperature 1 when greedy), before top-k/top-p truncation: the distribution the trainer recomputes. */
int sample_token(const float *logits, int V, const struct sampler_params *p, struct rng *r, struct sampler_scratch *s,
                 float *logp);

#endif
