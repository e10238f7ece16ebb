/* Inside the split source (worker/split/): the state of a trainer rank fed by rollout ranks (struct trainer_rank)
 * and what its three rooms call of each other: the receive side of the data plane (split_receive.c), fully-async
 * training's stream at the trainers (split_async.c), and the source itself with the trainer role that runs it
 * (split_source.c). Not for other folders: the trainer role is run_trainer (worker/roles.h). */
#ifndef GRPO_WORKER_SPLIT_INTERNAL_H
#define GRPO_WORKER_SPLIT_INTERNAL_H

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "async_stream.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/log.h"
#include "proto/transport.h"
#include "worker/data/dataset.h"
#include "worker/metrics/metrics.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/plane/dataplane.h"
#include "worker/plane/dispatch.h"
#include "worker/plane/weight_sync.h"
#include "worker/plane/wire.h"
#include "worker/roles.h"
#include "worker/step/batch.h"
#include "worker/step/prompts.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/trainer_process.h"

/* A batch that arrived before its step (one-step-off: the rollout runs ahead). */
struct pending {
    struct wire_header h;
    struct step_batch b;
    uint8_t *raw; /* the message as it came (TP rank 0 of a TP group: its peers get a copy); NULL otherwise */
    size_t raw_len;
};

/* What the split source did for a step beside its rollouts, which it reports itself (split_metrics): the rollout
 * ranks' waiting, the data and weight planes (the dispatcher's figures on its rank), fully-async training's stream. */
struct split_figures {
    double rollout_idle;          /* the rollout ranks' waiting (for weights, for room to send), the largest */
    double rollout_peak_rss_gb;   /* the rollout ranks' peak resident memory, the largest */
    double rollout_wait_weights;  /* the part of rollout_idle spent waiting for weights (of the same rank) */
    int64_t staleness;            /* policy versions the step's rollouts lag behind (the largest) */
    double update_weights_s;      /* publishing and broadcasting the versions since the previous step */
    uint64_t refused, duplicates; /* batches refused on this rank's data socket; duplicate or stale ones */
    /* batches dropped so far, by reason: malformed or out of range, for a step beyond the window, not granted to
     * their sender, holding other prompts than their step draws */
    uint64_t drop_invalid, drop_future, drop_not_granted, drop_prompt;
    bool dispatched; /* this rank runs the dispatcher, which counted the figures below */
    int64_t live_processes, lost_processes, units_regranted; /* rollout processes, as the dispatcher sees them */
    int64_t weight_bytes;                                    /* weight bytes it served since the previous step */
    int64_t dispatch_refused;                                /* requests it refused so far */
    int64_t dispatch_old_epoch; /* of those, requests of another key epoch (another launch's keys) */
    int64_t dispatch_oversized, dispatch_superseded, dispatch_rate_limited; /* of those: by size, superseded, rate */
    int64_t replaced_processes; /* live rollout processes superseded by a newer one of their rank */
    uint64_t old_epoch;         /* batches refused on this rank's data socket for another key epoch */
    bool fully_async;           /* fully-async training (the stream's figures, fa) */
    struct fully_async_stats fa;
};

struct trainer_rank {
    struct role_env *env;
    struct trainer *t;
    struct dataplane_pull *pull;
    struct wire_limits lim;
    struct plane_verifier verifier; /* the run key and the counters each rollout process has used */
    struct wire_auth auth;          /* lim.auth: the last batch's sender, for its answer */
    struct pending *pend;
    int n_pend, cap_pend;
    struct dispatcher *disp; /* DP rank 0, TP rank 0 only */
    struct comm *mp;         /* the ranks holding this DP rank's batches (model copy, SP group, or both; NULL: this rank
                              * alone): its rank 0 pulls and shares */
    uint64_t refused, duplicates, stale;
    /* batches dropped, by reason: refused as malformed or out of range, for a step beyond the window, from a
     * process the unit was not granted to, holding other prompts than their step draws (refused, or dropped at
     * the step when they came ahead of it) */
    uint64_t drop_invalid, drop_future, drop_not_granted, drop_prompt;
    uint64_t old_epoch;  /* of the refused, batches of another key epoch (another launch's keys) */
    const int *cur_uids; /* the step next_batch waits for (cur_k): the prompts it draws at each group */
    int64_t cur_k;
    int64_t start;
    double sync_s_pending;  /* publishing time to report with the next step */
    int64_t bytes_reported; /* weight bytes the dispatcher had served at the previous step */
    double refused_logged_at;
    struct weight_sync_sender ws; /* the dispatcher's rank: the broadcast rounds (weight_sync=broadcast) */
    /* fully-async training (async_training.*): the stream's units at this trainer, the prompts of each chunk (drawn
     * from the data's start: the cursor before each, and its uids), what the units since the last step reported */
    struct astream *as;
    struct data_cursor acur;
    bool acur_open;
    int64_t chunks_drawn;
    int *chunk_uids;   /* (chunks_drawn x groups_in_step) */
    int64_t *chunk_at; /* (chunks_drawn x 2): the cursor's epoch and index before each chunk */
    int64_t published; /* the newest version published (-1: none) */
    bool draining;     /* a checkpoint holds the dispatcher's grants: lifted at the next push */
    double a_gen, a_reward, a_idle, a_wait_weights, a_peak_rss; /* the units' figures since the last step (sums) */
    struct split_figures fig;                                   /* the step made last */
    /* trainer.survive_trainer_loss (split_survive.c): the rollout ranks send each whole unit to DP rank 0, which
     * keeps the units of the last two steps (step k's in slot k % 2, astream_step_pack's message padded to 32-bit
     * words) and hands a step's to every trainer; each cuts its DP share */
    bool whole;
    struct survive *survive;
    uint8_t *kept[2];
    size_t kept_len[2];
    int64_t kept_step[2];
    int launch_dp;     /* this rank's DP rank at launch: its data endpoint (env->endpoints[launch_dp]) */
    bool lead_copy;    /* this rank is of the lead's model copy (DP rank 0) as it last took part; a rank of a copy
                        * that is DP rank 0 only since a loss takes the lead with its copy (take_lead) */
    int64_t run_start; /* the step this process started from (r->start moves when it takes over a lost lead) */
};

/* The lead of a split run under trainer.survive_trainer_loss: DP rank 0's rank 0 of its model copy (TP, PP and SP
 * rank 0), which pulls the whole units, runs the dispatcher and hands each step's units to every trainer. */
bool split_is_lead(const struct trainer_rank *r);

/* split_receive.c: the data plane's receive side */
/* Count a refused batch and log it at a bounded rate. */
void split_drop_refused(struct trainer_rank *r, const char *why);
/* The rollout rank (the dispatcher's slot) of world rank `from`, or -1. */
int split_slot_of(const struct trainer_rank *r, int from);
/* Append a batch to the pending list (it owns the batch from here on). */
void split_keep_pending(struct trainer_rank *r, const struct pending *p);
/* One message off the socket, unpacked under r->lim: 1 (with *rc), 0 when none came, -1 on a socket error. */
int split_receive_batch(struct trainer_rank *r, int timeout_ms, struct pending *p, int *rc, void **buf, size_t *len,
                        char *err, size_t errlen);
/* One batch of step k (or later) off the socket into pending: 1 kept, 0 none or dropped, -1 on a socket error. */
int split_receive_one(struct trainer_rank *r, int64_t k, int timeout_ms);
/* msg (len bytes) grown to whole 32-bit words and 4 bytes more, zeroed: what split_share_msg broadcasts. */
uint8_t *split_pad_words(uint8_t *msg, size_t len);
/* Trainer rank 0 hands a message to the other trainers: *n its length there (-1: it has none, its source failed),
 * then its bytes (msg on rank 0, padded by split_pad_words); the others hold for a pause while they wait. The
 * message (msg on rank 0, a buffer of its own the caller frees on the others), or NULL where *n is not a length. */
uint8_t *split_share_msg(struct trainer_rank *r, uint8_t *msg, int64_t *n);
/* Whether the update packs a group's shared prompt once (the rows step_batch_balance weighs), as the rollout ranks
 * reckon it when they cut a unit over the DP ranks. */
bool split_packs_shared_prompts(const struct trainer_rank *r);
/* A polled collective's wait: hold for a pause (control_hold_while_waiting). */
void split_hold_while_waiting(void *ud, bool done);
/* Step k's messages from the model copy's rank 0 to its other ranks. 0, or -1. */
int split_share_step(struct trainer_rank *r, int64_t k);
/* Distinct units of step k held. */
int split_units_held(const struct trainer_rank *r, int64_t k);
/* Every DP rank keeps the copies DP rank 0 kept of step k's units. 0, or -1 on a socket error. */
int split_choose_senders(struct trainer_rank *r, int64_t k);
/* Drop step k's pending batches that hold other prompts than step k draws (uids). */
void split_drop_other_prompts(struct trainer_rank *r, int64_t k, const int *uids);

/* split_survive.c: a split run that survives a lost trainer */
/* DP rank 0 (the lead) holds step k's units already: a step redone after a loss (it pulls none again). */
bool split_kept_step(const struct trainer_rank *r, int64_t k);
/* Step k's units from the lead to every trainer (the lead's from the data plane, kept for a redo), each trainer's DP
 * share of each unit into its pending list. 0, or -1 (a message that does not unpack, logged). */
int split_whole_step(struct trainer_rank *r, int64_t k);
/* The survive object of a split run's trainer (trainer.survive_trainer_loss; NULL without). */
struct survive *split_survive_create(struct trainer_rank *r);

/* split_source.c */
/* The data plane's and the dispatcher's counters, and the weight sync's time, into the step's figures (r->fig). */
void split_plane_counters(struct trainer_rank *r);

/* split_async.c: fully-async training */
/* Step k's batch from the stream (trainer rank 0 takes it and sends it to the other trainer ranks). 0, or -1. */
int split_async_next_batch(struct trainer_rank *r, int64_t k, struct step_batch *b, struct step_timing *tm);
/* trainer_source.checkpoint_state: the stream drained, its state for the checkpoint. 0, or -1. */
int split_async_checkpoint_state(void *ctx, int64_t step, uint8_t **blob, size_t *len);
/* The stream and the dispatcher's stream options, once the trainer exists. 0, or -1 with err. */
int split_async_setup(struct trainer_rank *r, struct trainer *t, struct dispatch_options *o, char *err, size_t errlen);

#endif
