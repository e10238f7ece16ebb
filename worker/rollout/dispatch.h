/* Rollout work and weights between the trainers and the rollout ranks, over
 * nanomsg, so that a lost rollout rank costs nothing.
 *
 * Each step's prompts are cut into fixed work units, one per rollout rank
 * (unit u holds groups [B*u/U, B*(u+1)/U)). A unit's groups come out the same
 * whichever process generates them: every group has its own RNG stream, and a
 * unit's groups are split over the trainers by the same token balance. So a
 * unit can be granted again to another process, and the trainers keep the
 * first copy of each (step, unit) that arrives.
 *
 * The dispatcher lives on trainer DP rank 0, in a thread of its own with one
 * REP socket. It grants units, serves the published policy versions in chunks,
 * and watches the rollout processes: each pings every heartbeat interval (also
 * while it generates), and one silent for two intervals is lost. Its unfinished
 * units go to the other rollout processes, ahead of their own next step; a
 * process that takes over the lost rank's place (grpo-worker --replace-rank)
 * gets that rank's units again from the next step on.
 *
 * Versions: step k is generated with policy version max(start, k-1-s), s the
 * staleness (0 on-policy, 1 one-step-off); the dispatcher keeps the newest s+1
 * versions, which are every version an unfinished step can need. */
#ifndef GRPO_WORKER_ROLLOUT_DISPATCH_H
#define GRPO_WORKER_ROLLOUT_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct dispatch_options {
    const char *endpoint; /* bound here (ipc sockets mode 0600) */
    const char *secret;   /* every request must carry it (NULL or "": not checked) */
    int units;            /* work units per step: the rollout ranks */
    int groups_in_step;   /* data.train_batch_size */
    int staleness;        /* 0 or 1 */
    int64_t start;        /* the step the trainers start from */
    int64_t total_steps;  /* trainer.total_training_steps */
    int64_t start_epoch;  /* data cursor of step start + 1 */
    int64_t start_cursor;
    size_t n_floats;     /* parameters of the policy */
    double lost_after_s; /* a rollout process silent this long is lost (two heartbeat intervals) */
};

struct dispatcher;

/* Bind and start the dispatcher's thread. NULL with err on failure. */
struct dispatcher *dispatcher_open(const struct dispatch_options *o, char *err, size_t errlen);
/* Publish policy version v (the weights after v steps): w[0..n_floats) is copied. Steps up to v are trained,
 * and the steps that version opens can be granted. */
void dispatcher_publish(struct dispatcher *d, int64_t version, const float *w);
/* The run ends after step `after` (stopped or finished): every request and ping is answered "end" from now.
 * The first call's word stands. */
void dispatcher_end(struct dispatcher *d, int64_t after, const char *why);
/* Wait (at most linger_s) until every live rollout process has heard the end, then stop and free. */
void dispatcher_close(struct dispatcher *d, double linger_s);

/* What the dispatcher has done so far (for the metrics). */
struct dispatch_stats {
    int64_t granted;   /* units granted */
    int64_t regranted; /* of those, units granted again after their holder was lost */
    int64_t lost;      /* rollout processes declared lost */
    int64_t refused;   /* requests refused (malformed, wrong secret) */
    int64_t bytes;     /* weight bytes served */
    int live;          /* rollout processes alive now */
};
void dispatcher_stats(struct dispatcher *d, struct dispatch_stats *st);

/* ---- the rollout process's side ---- */

enum work_kind { WORK_WAIT = 0, WORK_UNIT = 1, WORK_END = 2 };

struct work_grant {
    enum work_kind kind;
    int64_t step;
    int unit, units;
    int64_t version;                   /* policy version to generate with */
    int64_t start, total_steps;        /* the trainers' first step and the run's last */
    int64_t start_epoch, start_cursor; /* data cursor of step start + 1 */
    size_t n_floats;
    char reason[256];
};

struct work_client;

/* Connect to the dispatcher as the process serving rollout rank `rank`, and start pinging every ping_s
 * seconds. NULL with err on failure. */
struct work_client *work_client_open(const char *endpoint, const char *secret, int rank, double ping_s, char *err,
                                     size_t errlen);
/* Ask for work: 0 with *g (a unit, wait, or end), or -1 with err when the dispatcher has not answered in
 * timeout_ms. */
int work_client_next(struct work_client *c, struct work_grant *g, int timeout_ms, char *err, size_t errlen);
/* Fetch policy version `version` into w[0..n) in chunks of at most chunk_bytes; *bytes and *chunks get what
 * moved. 0, or -1 with err (version gone, count mismatch, no answer). */
int work_client_weights(struct work_client *c, int64_t version, float *w, size_t n, size_t chunk_bytes, size_t *bytes,
                        int *chunks, char *err, size_t errlen);
/* Call fn(ud) after each chunk work_client_weights receives (a rollout TP group's first rank tells its peers it
 * is alive while it downloads). */
void work_client_on_chunk(struct work_client *c, void (*fn)(void *ud), void *ud);
/* True once a ping has been answered "end". */
bool work_client_ended(struct work_client *c);
void work_client_close(struct work_client *c);

/* Groups [lo, hi) of unit u of U in a step of B groups. */
void dispatch_unit_range(int B, int U, int u, int *lo, int *hi);

#endif
