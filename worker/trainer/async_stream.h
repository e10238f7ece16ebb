/* Fully-async training, the trainer's side of the stream (docs/training.md, "Fully-async training"): the work units
 * that reached the trainer, in the order they came; which of them step k takes and which it drops for staleness;
 * the schedule each run writes (RUN_DIR/async_schedule.jsonl) and a replay of one; the state a checkpoint keeps.
 * It opens no socket and knows no dispatcher: trainer_role.c feeds it the arrivals and tells the dispatcher what
 * it took, so a test drives it alone (tests/unit/test_async_stream.c). */
#ifndef GRPO_WORKER_TRAINER_ASYNC_STREAM_H
#define GRPO_WORKER_TRAINER_ASYNC_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/plane/dispatch_core.h"
#include "worker/plane/wire.h"
#include "worker/step/batch.h"
#include "worker/trainer/trainer.h"

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

/* Step k's units: taken in arrival order (a replay: in its schedule's), each dropped when it is more than
 * ceil(staleness_threshold) pushes stale, until `units` are taken. 1: out holds the step's groups, in stream order,
 * numbered for the step, and fa its figures; 0: more units must arrive first; -1 with err: a replay that does not
 * go as its schedule says. *taken and *dropped get the groups this call took and dropped (for the dispatcher). */
int astream_take(struct astream *a, int64_t k, struct step_batch *out, struct fully_async_stats *fa, int *taken,
                 int *dropped, char *err, size_t errlen);

/* The state a checkpoint keeps (malloc'd, *len bytes): the units held (as the wire carries them), the counters, the
 * replay's place and stream_next (the dispatcher's next unit). */
uint8_t *astream_state(const struct astream *a, int64_t stream_next, size_t *len);
/* Back from a checkpoint's state: the units held (checked against lim), the counters, the replay's place;
 * *stream_next. 0, or -1 with err. */
int astream_restore(struct astream *a, const uint8_t *blob, size_t len, const struct wire_limits *lim,
                    int64_t *stream_next, char *err, size_t errlen);

#endif
