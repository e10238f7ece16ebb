/* Rollout batches on the wire: a rollout rank's groups for one trainer DP rank
 * packed as a protobuf grpo.RolloutBatch in an Envelope, and the trainer's
 * checked decoding of it. A trainer never trusts what arrives on its data
 * socket: every field is checked against the run (step window, group and
 * sample indices, token ids against the vocabulary, lengths, prompt ids against
 * its own copy of the prompt, finite log-probs and rewards, a response mask of the response's length holding only 0
 * and 1 and at least one 1, a policy version its step can be generated with,
 * finite non-negative timing and memory figures), and a batch that
 * fails any check is refused whole with a reason. */
#ifndef GRPO_WORKER_PLANE_WIRE_H
#define GRPO_WORKER_PLANE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "proto/plane_auth.h"
#include "worker/step/batch.h"

struct wire_header {
    int64_t step;           /* training step the batch belongs to (1-based) */
    int from_rank;          /* sender's world rank */
    int to_dp;              /* receiving trainer DP rank */
    uint64_t seq_no;        /* per sender, from 1 */
    int64_t policy_version; /* weights version that generated it (steps trained into the weights) */
    int groups_in_step;     /* prompts of the whole step */
    int n;                  /* responses per prompt */
    double gen_s, reward_s; /* the sender's generation and scoring time for this step */
    double idle_s;          /* the sender's waiting since its previous step */
    double peak_rss_gb;     /* the sender's peak resident memory */
    double wait_weights_s;  /* the part of idle_s spent waiting for weights (the rest: waiting to send) */
    int unit, units;        /* the step's work unit it carries, of units (worker/rollout/dispatch.h) */
};

/* Pack the groups groups[0..n_groups) of b (each with all its sequences) into an Envelope authenticated with the
 * sending process's credentials (proto/plane_auth.h; NULL: none, for messages that never leave MPI, as the
 * colocated ranks' over their collective). Caller frees. */
uint8_t *wire_pack_batch(const struct wire_header *h, const struct step_batch *b, const int *groups, int n_groups,
                         struct plane_cred *cred, size_t *len);

/* A batch's authentication as the receiver checks it: the verifier (the run key and the counters seen), and
 * what wire_unpack_batch found: the sender's identity and counter once its MAC is good (verified, also when the
 * batch is refused for its content), so that the answer is authenticated for it. */
struct wire_auth {
    struct plane_verifier *v;
    struct plane_id who;
    uint64_t counter;
    bool verified;
    bool old_epoch; /* refused as a batch of another key epoch (another launch's) */
};

/* The largest timing (seconds) or memory figure (GB) a batch may report: a year. */
#define WIRE_MAX_FIGURE 3.2e7

/* What the receiving trainer accepts. */
struct wire_limits {
    const struct prompt_set *prompts; /* the run's training prompts: uid indexes them */
    int vocab_size;
    int max_response_length;
    int groups_in_step;     /* data.train_batch_size */
    int n;                  /* rollout.n */
    int units;              /* work units per step (the rollout ranks) */
    int world_size;         /* from_rank must be below it */
    int dp_rank;            /* to_dp must equal it */
    struct wire_auth *auth; /* every batch must carry a good MAC of the rank it names (NULL: not checked, for
                               batches that came over MPI only) */
    /* a mixture of experts' recorded routing (Sequence.routed_experts): every sequence carries routes_layers x
     * routes_k experts below routes_experts per input token, distinct within a layer; routes_layers 0: none may */
    int routes_layers, routes_k, routes_experts;
    /* algorithm.adv_estimator=gdpo: every sequence carries this many reward components (reward_parts, the
     * configuration's config_gdpo_parts); 0: none may */
    int reward_parts;
    /* fully-async training: step is the stream's chunk, a batch's version (and its tokens', Sequence.token_versions)
     * is any published one, at most max_version */
    bool async;
    int64_t max_version;
};

/* The routing every sequence must carry for model c when generation records it (recorded), none otherwise. */
void wire_limits_set_routes(struct wire_limits *lim, const struct model_config *c, bool recorded);

/* Decode and check one message: 0 with *h filled and the batch's groups appended to b (sequences own their
 * arrays; resp_text entries are NULL), or -1 with why naming the field that was wrong (b unchanged). */
int wire_unpack_batch(const uint8_t *buf, size_t len, const struct wire_limits *lim, struct wire_header *h,
                      struct step_batch *b, char *why, size_t whylen);

#endif
