/* Fully-async training, the trainer's side of the stream (docs/training.md, "Fully-async training"): the work units
 * that reached the trainer, in the order they came; which of them step k takes and which it drops for staleness;
 * the schedule each run writes (RUN_DIR/async_schedule.jsonl) and a replay of one; the state a checkpoint keeps.
 * It opens no socket and knows no dispatcher: split_async.c feeds it the arrivals and tells the dispatcher what
 * it took. Trainer rank 0 holds it; with more trainer ranks, the units each step takes go from rank 0 to the others
 * (astream_step_pack), and every rank makes its DP rank's share of them (astream_step_batch). */
#ifndef GRPO_WORKER_SPLIT_ASYNC_STREAM_H
#define GRPO_WORKER_SPLIT_ASYNC_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/plane/dispatch_core.h"
#include "worker/plane/wire.h"
#include "worker/step/batch.h"
#include "worker/trainer/trainer.h"

/* Fully-async training's figures of a step (verl's fully_async/ and training/off_policy/ metrics): staleness is in
 * pushes (parameter versions), counts are prompts (samples) or responses (trajectories), cumulative where verl's
 * are. */
struct fully_async_stats {
    int64_t current_param_version;
    int64_t total_generated_samples, stale_samples_processed, stale_trajectory_processed, dropped_stale_samples;
    int64_t dropped_units;                       /* this step's */
    int64_t total_partial_num, max_partial_span; /* this step's trajectories */
    double partial_ratio;
    double staleness_mean, staleness_min, staleness_max; /* trajectory_staleness: less the newest token's */
    double worst_mean, worst_min, worst_max;             /* trajectory_staleness_worst: less the oldest token's */
    double spans_mean, spans_min, spans_max;             /* trajectory_spans: versions a trajectory went through */
    double total_wait_time;                              /* this step's wait for its units */
    int64_t required_samples, max_required_samples;      /* verl's static figures */
    double staleness_threshold;
    int64_t buffered_samples; /* prompts arrived and not yet trained (the queue) */
};

struct astream_options {
    int push_every;             /* async_training.trigger_parameter_sync_step */
    int units;                  /* work units a chunk (the rollout ranks) */
    int unit_groups;            /* groups a unit */
    int n;                      /* responses a prompt */
    double staleness_threshold; /* async_training.staleness_threshold: units more than its ceiling stale drop */
    int64_t max_required;       /* verl's max_required_samples (for the metrics) */
};

struct astream;

struct astream *astream_create(const struct astream_options *o);
void astream_free(struct astream *a);

/* Replay the schedule at path (an earlier run's async_schedule.jsonl): steps take exactly its units, in its order.
 * 0, or -1 with err naming the file and line. */
int astream_load_replay(struct astream *a, const char *path, char *err, size_t errlen);
/* The replayed units still to be granted (not taken, dropped or held): *n of them, in stream order (the order the
 * recorded run granted them), pointing into a. */
struct dispatch_replay *astream_replay_pending(const struct astream *a, int *n);
bool astream_replaying(const struct astream *a);

/* Write the schedule to path: lines of steps up to keep_step that are there already stay (a resumed run), the
 * others go. 0, or -1 with err. */
int astream_open_schedule(struct astream *a, const char *path, int64_t keep_step, char *err, size_t errlen);

/* Whether unit `unit` of chunk `chunk` reached the trainer already (held, taken or dropped): a second copy is not
 * kept. */
bool astream_have(const struct astream *a, int64_t chunk, int unit);
/* A unit arrived, checked (wire_unpack_batch): its header and groups (b's contents move into the stream). */
void astream_arrive(struct astream *a, const struct wire_header *h, struct step_batch *b);
/* Units held (arrived, not yet taken). */
int astream_held(const struct astream *a);

/* The units a step took, in stream order (chunk, unit): their headers and groups. */
struct astream_step {
    int n;
    struct wire_header *h; /* (n) */
    struct step_batch *b;  /* (n) */
};
void astream_step_free(struct astream_step *s);

/* Step k's units: taken in arrival order (a replay: in its schedule's), each dropped when it is more than
 * ceil(staleness_threshold) pushes stale, until `units` are taken. 1: out holds the step's units (the stream's
 * groups move into it), and fa its figures; 0: more units must arrive first; -1 with err: a replay that does not
 * go as its schedule says. *taken and *dropped get the groups this call took and dropped (for the dispatcher). */
int astream_take(struct astream *a, int64_t k, struct astream_step *out, struct fully_async_stats *fa, int *taken,
                 int *dropped, char *err, size_t errlen);

/* A step's units as one message (malloc'd, *len bytes): each as the wire carries it, unauthenticated (it goes over
 * MPI only, from trainer rank 0 to the others). */
uint8_t *astream_step_pack(const struct astream_step *s, size_t *len);
/* Back from astream_step_pack's message, each unit checked against lim (any version; addressed to DP rank 0, which
 * the rollout ranks send every unit to). 0, or -1 with err. */
int astream_step_unpack(const uint8_t *msg, size_t len, const struct wire_limits *lim, struct astream_step *s,
                        char *err, size_t errlen);
/* Trainer DP rank dp's share of the step's groups (of dp_size ranks) into out: the i-th unit's groups numbered
 * i x groups_a_unit on in the step (so which unit came first changes nothing), each unit cut over the DP ranks by
 * tokens as the rollout ranks cut theirs in the on-policy split layout (step_batch_balance), sorted by position.
 * s's batches move into out (s is freed). */
void astream_step_batch(struct astream_step *s, int n, int dp, int dp_size, bool shared_prompts,
                        struct step_batch *out);

/* The state a checkpoint keeps (malloc'd, *len bytes): the units held (as the wire carries them), the counters, the
 * replay's place and stream_next (the dispatcher's next unit). */
uint8_t *astream_state(const struct astream *a, int64_t stream_next, size_t *len);
/* Back from a checkpoint's state: the units held (checked against lim), the counters, the replay's place;
 * *stream_next. 0, or -1 with err. */
int astream_restore(struct astream *a, const uint8_t *blob, size_t len, const struct wire_limits *lim,
                    int64_t *stream_next, char *err, size_t errlen);

#endif
