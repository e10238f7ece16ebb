/* Batched generation with continuous batching: each prompt is prefilled once
 * and its KV cache copied to its n samples; finished sequences free their slot
 * for the next prompt at once. Every sampled token's log-probability is kept. */
#ifndef GRPO_WORKER_GENERATE_H
#define GRPO_WORKER_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "sampler.h"

struct gen_params {
    struct sampler_params sampling;
    int max_new_tokens;
    int n_samples;           /* responses per prompt */
    int max_batch;           /* concurrent sequences (decode batch) */
    const int32_t *stop_ids; /* end of sequence tokens */
    int n_stop;
    uint64_t seed;
    uint64_t first_stream; /* RNG stream of the first sample (a rollout rank's share of a step); 0 otherwise */
    size_t kv_budget;      /* bytes the KV cache may take (0: no bound): fewer concurrent sequences if need be, at
                              least one group's */
    bool record_routes;    /* mixture of experts: keep the experts each token was routed to (gen_output.routes) */
    /* Generation in phases (fully-async training's partial rollout: continued with newer weights). */
    bool resume;         /* out[] holds an earlier call's state (its tokens, log-probs, lengths, stopped): finished
                            sequences stay, a sequence with tokens is prefilled with its prompt and tokens and decodes on
                            (its RNG stream advanced past its draws), a group none of whose samples has a token starts as
                            new; not with record_routes */
    const int *pause_at; /* (n_prompts x n_samples) or NULL: a sequence that holds pause_at[i] tokens (>= 0) stops
                            there unfinished (0: its group is not started) */
    bool (*should_pause)(void *ud); /* asked after each decode step: true stops every sequence where it is */
    void *pause_ud;
};

/* One generated response. */
struct gen_output {
    int32_t *tokens; /* (len) */
    float *logps;    /* (len) log-prob of each sampled token */
    int len;
    bool stopped; /* ended on a stop token (included in tokens) rather than the length limit */
    /* with record_routes on a mixture of experts: (prompt_len + len - 1, n_layers x k) the experts of every token
     * that went through the model (the prompt's, then each sampled token fed back), else NULL */
    uint16_t *routes;
    /* multi-turn generation (worker/gen/multi_turn.h): (len) 1 for a token the model sampled, 0 for one an
     * environment put in (its log-prob is 0); NULL from model_generate() (every token sampled) */
    uint8_t *mask;
};

/* Generate n_samples responses for each of n_prompts prompts into out[p * n_samples + s] (caller frees with
 * gen_output_free). Sample s of prompt p draws from its own RNG stream (seed, first_stream + p * n_samples + s): the
 * same settings give bit-identical results, and a different max_batch changes only GEMM rounding. Optional progress
 * callback after each decode step. */
void model_generate(struct model *m, const int32_t *const *prompts, const int *prompt_lens, int n_prompts,
                    const struct gen_params *gp, struct gen_output *out);
/* model_generate(), in phases: returns the sequences left unfinished (paused by pause_at or should_pause; 0: every one
 * ended on a stop token or the length limit). A later call with gp->resume continues them. Given the same state and
 * pauses, the same tokens come out, bit for bit. */
int model_generate_phase(struct model *m, const int32_t *const *prompts, const int *prompt_lens, int n_prompts,
                         const struct gen_params *gp, struct gen_output *out);
/* Whether sequence o, of at most max_new_tokens, is finished. */
bool model_gen_output_finished(const struct gen_output *o, int max_new_tokens);
void model_gen_output_free(struct gen_output *o);

#endif
