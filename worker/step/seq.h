/* A step's rollouts: n responses for each prompt, with everything the update
 * needs per response token (old and reference log-probs, advantages), and the
 * batching of sequences into packed micro-batches. */
#ifndef GRPO_WORKER_STEP_SEQ_H
#define GRPO_WORKER_STEP_SEQ_H

#include <stdbool.h>
#include <stdint.h>

#include "worker/model/model.h"

struct rollout_seq {
    int group;             /* index of the sequence's group in its batch (struct step_batch) */
    int gidx;              /* position in the whole step: group_in_step * n + sample (mini-batch membership) */
    const int32_t *prompt; /* prompt ids (owned by the batch's prompt store) */
    int prompt_len;
    int32_t *resp; /* response ids (owned) */
    int resp_len;
    bool stopped;     /* ended on a stop token */
    float *gen_logp;  /* (resp_len) log-probs recorded by the sampler */
    float *old_logp;  /* (resp_len) recomputed by the trainer before the update */
    float *ref_logp;  /* (resp_len) under the frozen reference policy */
    double *adv;      /* (resp_len) advantage of each response token */
    double score;     /* reward (after any penalties) */
    double raw_score; /* reward from the scorer */
    double acc;       /* exact-answer accuracy, 1 or 0 (reward_accuracy); NaN when unknown */
    /* algorithm.adv_estimator=remax: the reward of the greedy response to the same prompt (verl's reward_baselines),
     * scored as the sampled ones (the score with its penalties) */
    double reward_baseline;
    /* algorithm.adv_estimator=gdpo: the scorer's reward components (algorithm.gdpo_reward_keys' order, the reward
     * function's reward_num_parts of them: n_parts), else NULL and 0 */
    double *reward_parts;
    int n_parts;
    /* actor_rollout_ref.actor.calculate_sum_pi_squared: (resp_len) each token's sum of squared probabilities over the
     * vocabulary under the old policy (the old-log-prob pass), else NULL */
    float *sum_pi_sq;
    /* mixture of experts, when the rollout records them: (rollout_seq_tokens, routes_w) the experts each input token
     * was routed to in generation (routes_w = n_layers x k per token, layer after layer), or NULL */
    uint16_t *routes;
    int routes_w;
    /* multi-turn rollouts (worker/gen/multi_turn.h), else 0 and NULL */
    uint8_t *mask; /* (resp_len) 1 where the model generated the token (loss, KL, entropy, advantage), 0 for a token put
                      in the response from outside (a tool's answer, a template's turn markers); NULL: every token is
                      the model's (single-turn) */
    /* rollout correction (algorithm.rollout_correction, decoupled mode), set by the trainer after the old log-probs,
     * else NULL: */
    uint8_t *loss_mask; /* (resp_len) the tokens the loss trains on: the model's (mask) that rejection sampling kept */
    float *is_w;        /* (resp_len) the importance-sampling weight of each token (0 on the others) */
    int num_turns;      /* verl's num_turns: tool turns + model turns + 1 */
    int tool_calls;     /* tool calls run */
    int tool_errors;    /* of them, answered with an error */
    float tool_seconds; /* wall time of its tool calls */
    bool tokens_mismatch; /* its tokens differ from the template's rendering of its messages (sanity check) */
    int template_errors;  /* answers the chat template could not render */
    int resumed_turns;    /* turns generation resumed after an answer */
    int prefill_tokens;   /* tokens prefilled for them (the KV cache kept: the stop token and the answer) */
    int evictions;        /* times its KV cache was given up while it waited */
    char *messages_json;  /* the conversation, for the audit files (NULL: not kept) */
    /* fully-async training with partial rollout: (resp_len) the policy version that sampled each token, else NULL
     * (every token is the unit's version, version_first) */
    int64_t *versions;
    int64_t version_first; /* fully-async training: the version its unit started with */
};

/* Free the per-sequence arrays of n sequences. */
void rollout_seqs_free(struct rollout_seq *s, int n);

/* Whether response token t of s is the model's own (trained on): its mask's 1, or every token without a mask. */
static inline bool rollout_seq_model_token(const struct rollout_seq *s, int t) { return !s->mask || s->mask[t]; }
/* The model's own tokens of s's response (resp_len without a mask). */
int rollout_seq_model_tokens(const struct rollout_seq *s);
/* The tokens the loss and the advantages take (verl's response_mask after rollout rejection sampling): loss_mask
 * where rejection ran, else mask (NULL: every token). */
static inline const uint8_t *rollout_seq_loss_mask(const struct rollout_seq *s)
{
    return s->loss_mask ? s->loss_mask : s->mask;
}
static inline bool rollout_seq_loss_token(const struct rollout_seq *s, int t)
{
    const uint8_t *m = rollout_seq_loss_mask(s);
    return !m || m[t];
}
int rollout_seq_loss_tokens(const struct rollout_seq *s);

/* Packed micro-batch of whole sequences (prompt + response, no padding). */
struct micro_batch {
    int n_seq;
    const int *seq; /* indices into the step's sequences */
    struct packed_batch pb;
    int32_t *ids, *targets, *pos, *cu, *from, *prefix; /* owned storage of pb (per packed segment) */
    uint16_t *routes; /* pb.routes when every sequence carries its routes (of one width), else NULL */
    int32_t *resp_at; /* (n_seq) packed index of each sequence's first response-token prediction */
    int n_shared;     /* prompts packed once for several of its sequences (share) */
};

/* Build a packed batch of the given sequences: inputs are prompt+response minus the last token, targets the
 * next tokens; response token t of sequence i is predicted at row resp_at[i] + t. With share, sequences of one
 * group with the same prompt (two or more in the list) get that prompt packed once, less its last token: a
 * segment that each of them continues (packed_batch.prefix_of) with the last prompt token and its response. The
 * log-probs and gradients are those of the whole sequences; the prompt's rows are forwarded once, not n times. */
void micro_batch_build(struct micro_batch *mb, const struct rollout_seq *seqs, const int *idx, int n, bool share);
/* (The rollout's experts travel with the rows, packed_batch.routes, when every sequence has them.) */
void micro_batch_free(struct micro_batch *mb);

/* Split sequence indices idx[0..n) into micro-batches: fixed count per micro-batch (max_seqs > 0), or packed to
 * a token budget (max_tokens > 0, use_dynamic_bsz): balanced bins by longest-first placement, as few as fit.
 * With share (shared-prompt packing) the budget counts a prompt once for the sequences of its group that it
 * places together, and keeps them together where they fit. Returns the number of micro-batches; groups[k]
 * (malloc'd) lists the indices of micro-batch k, counts[k] its size. A sequence longer than the budget gets a
 * micro-batch of its own. */
int split_micro_batches(const struct rollout_seq *seqs, const int *idx, int n, int max_seqs, int max_tokens, bool share,
                        int ***groups, int **counts);

/* Tokens (prompt + response) of a sequence as the packed forward sees them. */
int rollout_seq_tokens(const struct rollout_seq *s);

#endif
