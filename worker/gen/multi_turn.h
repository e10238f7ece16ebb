/* Multi-turn generation: continuous batching of trajectories whose model turns alternate with answers from a turn
 * environment (worker/gen/turn_env.h). Token in, token out: the tokens a model turn samples are kept exactly as
 * sampled (mask 1, with their log-probs) and the environment's tokens are appended after them (mask 0, log-prob
 * 0); nothing is decoded and encoded again.
 *
 * A trajectory keeps its KV cache across turns: after an answer only the tokens not yet in the cache (the turn's
 * stop token and the answer) are prefilled, batched with the other trajectories' decode steps. A trajectory waiting
 * for its answer keeps its cache slot while there is other work; when nothing can run and a group waits for slots,
 * waiting trajectories give their slots up (evicted, counted) and are prefilled again from their tokens when their
 * answer comes. Sample s of prompt p draws from RNG stream first_stream + p * n + s, as single-turn generation
 * does, so a trajectory whose first turn ends it gets the tokens model_generate() gives. */
#ifndef GRPO_WORKER_GEN_MULTI_TURN_H
#define GRPO_WORKER_GEN_MULTI_TURN_H

#include "worker/gen/turn_env.h"
#include "worker/model/model_generate.h"

/* What one call measured. */
struct multi_turn_stats {
    long long resumed_turns;    /* turns resumed after an answer with the cache kept */
    long long resume_tokens;    /* tokens prefilled for them (the stop token and the answer) */
    long long evictions;        /* caches given up while waiting */
    long long recompute_tokens; /* tokens prefilled again after an eviction */
    double env_wait_s;          /* seconds generation waited on the environment with nothing else to run */
};

/* Like model_generate(): n_samples trajectories per prompt into out[p * n + s] (out[i].mask set), each trajectory's
 * environment summary into sums[i]. messages[p], extra[p] and agent[p] (each may be NULL) are what the
 * environment's begin gets. gp->max_new_tokens bounds each trajectory's whole response (model and answer tokens);
 * gp->record_routes is not supported. The model may be split over a TP group (no PP) when every rank's env
 * answers alike in the same order (the rollout TP group's: worker/rollout/rollout_env.h); the order in which a real
 * environment's answers come is not the same on every rank. */
void gen_generate_multi_turn(struct model *m, struct turn_env *env, const int32_t *const *prompts,
                             const int *prompt_lens, const char *const *messages, const char *const *extra,
                             const char *const *agent, int n_prompts, const struct gen_params *gp,
                             struct gen_output *out, struct turn_summary *sums, struct multi_turn_stats *st);

/* The same in phases (fully-async training's partial rollout): begin sets it up (the arrays it is given are the
 * caller's and must live until end); each phase runs with the weights the model holds then, every trajectory's
 * cache recomputed from its tokens when it is not the first, until every trajectory is done (returns 0) or
 * should_pause(ud) says so after a model step, or, with pause_at (total entries, -1: none), until each trajectory
 * holds pause_at[i] tokens (an answer the trajectory would append past it is held for the next phase). Returns the
 * trajectories left; their turns with the environment go on between phases. */
struct mt_run;
struct mt_run *gen_multi_turn_begin(struct model *m, struct turn_env *env, const int32_t *const *prompts,
                                    const int *prompt_lens, const char *const *messages, const char *const *extra,
                                    const char *const *agent, int n_prompts, const struct gen_params *gp,
                                    struct gen_output *out, struct turn_summary *sums, struct multi_turn_stats *st);
int gen_multi_turn_phase(struct mt_run *g, const int *pause_at, bool (*should_pause)(void *ud), void *ud);
void gen_multi_turn_end(struct mt_run *g);

void gen_turn_summary_free(struct turn_summary *s);

#endif
