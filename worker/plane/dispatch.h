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
 * Grants survive a lost answer: each ask names the unit the process last got
 * (and has delivered), so a process that asks again while it holds a unit it
 * never heard of is granted that unit again. A grant also has a lease (a
 * multiple of the longest unit so far, with a floor, dispatch_core.h): a unit
 * still not delivered past it goes to a process with nothing else to do too,
 * and the trainers keep whichever copy comes first.
 *
 * Versions: step k is generated with policy version max(start, k-1-s), s the
 * staleness (0 on-policy, 1 one-step-off); the dispatcher keeps the newest s+1
 * versions, which are every version an unfinished step can need.
 *
 * Three parts: the pure core (dispatch_core.h: the state, fed requests and the time, answering with packed
 * replies; no sockets, threads or clock), the shell that runs it (dispatcher.c: one REP socket, one thread, a
 * mutex around the core, the clock), and the rollout process's client (work_client.c). */
#ifndef GRPO_WORKER_PLANE_DISPATCH_H
#define GRPO_WORKER_PLANE_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/plane/dispatch_core.h"

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
/* ... and a rollout rank no process has served yet is waited for until unseen_s from the call (0: not at all): one
 * still loading when the trainers finish must be told the end too, or it waits for a dispatcher that is gone. */
void dispatcher_close(struct dispatcher *d, double linger_s, double unseen_s);

/* What the dispatcher has done so far (for the metrics). */
void dispatcher_stats(struct dispatcher *d, struct dispatch_stats *st);
/* dispatch_core_granted and dispatch_core_regrant under the dispatcher's lock. */
bool dispatcher_granted(struct dispatcher *d, int64_t step, int unit, int slot);
void dispatcher_regrant(struct dispatcher *d, int64_t step, int unit, const char *why);

/* Fully-async training: dispatch_core_async_* under the dispatcher's lock. */
bool dispatcher_async_granted(struct dispatcher *d, int64_t chunk, int unit, int slot);
void dispatcher_async_received(struct dispatcher *d, int64_t chunk, int unit);
void dispatcher_async_taken(struct dispatcher *d, int groups, bool dropped);
void dispatcher_async_hold(struct dispatcher *d, bool hold);
int dispatcher_async_in_flight(struct dispatcher *d);
int64_t dispatcher_async_next(struct dispatcher *d);
int64_t dispatcher_async_window(struct dispatcher *d);

/* ---- the weight broadcast (actor_rollout_ref.rollout.weight_sync=broadcast) ----
 * The launch's rollout processes (one per work unit) and this rank share a broadcast group on the collective
 * plane. A rollout process that needs a version asks to take it in a broadcast; once every one of them has asked
 * for the same held version, the trainer's thread begins the round (dispatcher_round_begin), they are told to
 * join, and it broadcasts. A version not every process asks for within the rendezvous is fetched in chunks
 * instead, and a lost process or a failed round turns the broadcast off for the rest of the run: a process that
 * replaces a lost one was not in the group, and fetches. */
/* How long a version waits for every rollout process to ask for it: one-step-off they ask as they finish their
 * units, so this is the spread of their finishing times the broadcast waits out. */
#define DISPATCH_RENDEZVOUS_S 60.0
/* Answer broadcast asks from now on; rendezvous_s: how long a version waits for every process to ask. */
void dispatcher_broadcast_on(struct dispatcher *d, double rendezvous_s);
/* If every rollout process has asked for the same held version, not yet broadcast: its round begins (the askers
 * are told to join), with *v the version and *w its weights (dispatcher_publish is not called until
 * dispatcher_round_end). */
bool dispatcher_round_begin(struct dispatcher *d, int64_t *v, const float **w);
/* The round is over: every byte arrived (ok), or the group is given up and the broadcast is off. */
void dispatcher_round_end(struct dispatcher *d, bool ok);
/* Whether the newest version still waits for its round (broadcast on, the run going, a step to come needs it):
 * the trainer waits for it before it trains on, so that the rollout processes are not left waiting. Once the
 * trainer has waited waited_s > the rendezvous, the version is fetched instead and this says false. */
bool dispatcher_round_due(struct dispatcher *d, double waited_s);

/* ---- the rollout process's side ---- */

struct work_grant {
    enum work_kind kind;
    int64_t step;
    int unit, units;
    int64_t version;                   /* policy version to generate with */
    int64_t start, total_steps;        /* the trainers' first step and the run's last */
    int64_t start_epoch, start_cursor; /* data cursor of step start + 1 */
    size_t n_floats;
    char reason[256];
    int64_t latest_version; /* the newest version published (since 1.13; -1: none yet or not said) */
    /* fully-async training, a replayed unit: its versions phase by phase, and each sequence's tokens once each phase
     * ends (phases x sequences; malloc'd, work_grant_release) */
    int n_phases, n_replay_tokens;
    int64_t *replay_versions;
    int32_t *replay_tokens;
};

/* Free a grant's replay arrays. */
void work_grant_release(struct work_grant *g);

struct work_client;
struct Grpo__WorkGrant;

/* A WorkGrant as it came off the wire, as a struct work_grant (the reason truncated to fit). */
void work_grant_of(const struct Grpo__WorkGrant *x, struct work_grant *g);

struct plane_cred;
/* Connect to the dispatcher as the process serving rollout rank `rank` (every request authenticated with cred,
 * which the caller keeps; every answer must be authenticated for it), and start pinging every ping_s seconds.
 * NULL with err on failure. */
struct work_client *work_client_open(const char *endpoint, struct plane_cred *cred, int rank, double ping_s, char *err,
                                     size_t errlen);
/* Reach the dispatcher at endpoint too, once it moves there (the endpoint a trainer binds when it takes the lead of
 * a split run whose lead was lost: placement_lead_endpoint); asks and pings go to whichever endpoint listens. 0,
 * or -1 with err. */
int work_client_also(struct work_client *c, const char *endpoint, char *err, size_t errlen);
/* Ask for work: 0 with *g (a unit, wait, or end), or -1 with err when the dispatcher has not answered in
 * timeout_ms. Asking says the unit granted before is finished and delivered: call it once the last unit is sent.
 * Asking again after no answer is safe: a unit granted meanwhile comes again. */
int work_client_next(struct work_client *c, struct work_grant *g, int timeout_ms, char *err, size_t errlen);
/* Fetch policy version `version` into w[0..n) in chunks of at most chunk_bytes; *bytes and *chunks get what
 * moved. 0, or -1 with err (version gone, count mismatch, no answer). */
int work_client_weights(struct work_client *c, int64_t version, float *w, size_t n, size_t chunk_bytes, size_t *bytes,
                        int *chunks, char *err, size_t errlen);
enum work_broadcast { WB_WAIT = 1, WB_JOIN = 2, WB_FETCH = 3 };
/* Ask to take held version `version` in the trainers' broadcast: 0 with *answer (wait and ask again, join the
 * broadcast now, or fetch it), or -1 with err (version gone, no answer). */
int work_client_broadcast_ask(struct work_client *c, int64_t version, enum work_broadcast *answer, char *err,
                              size_t errlen);
/* The relay tree (worker/plane/relay.h): where to take a version from. */
struct relay_plan {
    bool relays;        /* false: the dispatcher relays nothing (the tree off, or a 1.16 dispatcher): fetch it there */
    uint8_t digest[32]; /* the version's BLAKE2b-256 digest (RELAY_DIGEST_BYTES), from an authenticated answer */
    uint8_t token[16];  /* the version's relay token (RELAY_TOKEN_BYTES): a relay serves it to requests with it */
    bool wait;          /* every holder is busy: ask again shortly */
    char endpoint[256]; /* the holder to fetch it from ("": from the dispatcher) */
    int rank;           /* that holder's rollout rank */
};
/* Ask where to take version `version` from (bad_rank >= 0: that rollout rank's relay failed this process, which then
 * takes it from the dispatcher), or with holds_at say this process holds it and serves it there. 0 with *p, or -1
 * with err (version gone, no answer). */
int work_client_relay_ask(struct work_client *c, int64_t version, int bad_rank, const char *holds_at,
                          struct relay_plan *p, char *err, size_t errlen);
/* Call fn(ud) after each chunk work_client_weights receives (a rollout TP group's first rank tells its peers it
 * is alive while it downloads). */
void work_client_on_chunk(struct work_client *c, void (*fn)(void *ud), void *ud);
/* True once the end has been heard (a ping's answer, or a work request's). From then on every request says so
 * (end_heard), which lets the dispatcher close. */
bool work_client_ended(struct work_client *c);
/* Once the end has been heard: true, with *g the end as the dispatcher said it (its step, the run's last step, why;
 * g's replay arrays released first). False before. */
bool work_client_end(struct work_client *c, struct work_grant *g);
/* The newest policy version the dispatcher has said it published (pings and grants; -1: not heard yet). */
int64_t work_client_latest(struct work_client *c);
void work_client_close(struct work_client *c);
/* The dispatcher as the flight recorder's group ("dispatcher", its endpoint): a rollout rank's wait for a grant is
 * recorded against it (worker/flight). */
uint16_t work_client_group(const struct work_client *c);

#endif
