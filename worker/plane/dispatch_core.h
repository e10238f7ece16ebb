/* The dispatcher's pure core: which process holds which work unit, the published policy versions, the
 * rollout processes' liveness and the weight broadcast's rendezvous. It is fed decoded-or-raw requests and the
 * time, and answers with packed replies; it opens no socket, starts no thread and reads no clock, so a test
 * drives it message by message with a clock of its own (tests/unit/test_dispatch.c). Not thread-safe: the shell
 * (dispatch.h, dispatcher.c) serialises every call. */
#ifndef GRPO_WORKER_PLANE_DISPATCH_CORE_H
#define GRPO_WORKER_PLANE_DISPATCH_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Floats per weights chunk at most: well inside GRPO_MAX_MESSAGE_BYTES with the envelope around it. */
#define DISPATCH_CHUNK_MAX_FLOATS ((size_t)12 << 20)

struct dispatch_options {
    const char *endpoint; /* bound here (ipc sockets mode 0600) */
    int units;            /* work units per step: the rollout ranks */
    int groups_in_step;   /* data.train_batch_size */
    int staleness;        /* 0 or 1 */
    int64_t start;        /* the step the trainers start from */
    /* the oldest version a step is generated with (version_floor_set; else start): below start only where a
     * survivor takes over a lost lead one-step-off, step start + 1 needing the version before start */
    bool version_floor_set;
    int64_t version_floor;
    int64_t total_steps; /* trainer.total_training_steps */
    int64_t start_epoch; /* data cursor of step start + 1 */
    int64_t start_cursor;
    size_t n_floats;     /* parameters of the policy */
    double lost_after_s; /* a rollout process silent this long is lost (two heartbeat intervals) */
    /* authentication (proto/plane_auth.h): every request must carry a good MAC of a rollout process's identity;
     * its world rank gives its slot, (rank - first_rollout_rank) / rollout_tp, and it speaks for that slot only */
    const uint8_t *run_key; /* PLANE_KEY_BYTES, copied; NULL: a core that refuses every request */
    uint64_t epoch;         /* the run key's epoch: a request of another epoch is refused before its MAC */
    int first_rollout_rank; /* the trainer ranks: rollout ranks come after them */
    int rollout_tp;         /* rollout ranks per work unit (a rollout TP group; 1 without) */
    double lease_floor_s;   /* the leases' floor (0: DISPATCH_LEASE_FLOOR_S; lower only in tests) */
    /* fully-async training (docs/training.md, dispatch_core_async_* below): a stream of units instead of steps. Unit
     * n of the stream (n = 0, 1, ...) is unit n % units of chunk n / units + 1; chunk j holds the j-th batch of
     * groups_in_step prompts of the data order from its start (epoch 0, index 0). */
    bool async;
    int64_t stream_next;                  /* the first stream unit to grant (a resumed run granted the ones before) */
    int unit_groups;                      /* groups per unit (groups_in_step / units) */
    int64_t max_groups;                   /* verl's max_required_samples: groups outstanding since a push, at most */
    int64_t outstanding;                  /* groups outstanding at the start (the units a resumed checkpoint holds) */
    int keep_versions;                    /* versions held for the rollout processes (0: 3) */
    const struct dispatch_replay *replay; /* a replayed schedule's units, in the order to grant them (copied) */
    int n_replay;
    /* the weight relay tree (worker/plane/relay.h): each version goes from here to at most relay_fanout processes,
     * and from each holder to at most relay_fanout more (0: off, every process fetches from here) */
    int relay_fanout;
};

/* One unit of a replayed schedule: granted with versions[0] once that version is published; its sequences
 * switch versions where tokens[phase * n_seq + s] says (the tokens sequence s holds once phase ends). */
struct dispatch_replay {
    int64_t chunk;
    int unit;
    int n_phases, n_seq;
    const int64_t *versions; /* (n_phases) */
    const int32_t *tokens;   /* (n_phases x n_seq) */
};

/* What the dispatcher has done so far (for the metrics). */
struct dispatch_stats {
    int64_t granted;       /* units granted */
    int64_t regranted;     /* of those, units granted to another process than the first (holder lost, lease over) */
    int64_t expired;       /* of those, units granted again because their lease was over (the holder alive) */
    int64_t lost;          /* rollout processes declared lost */
    int64_t refused;       /* requests refused (malformed, unauthenticated, of another key epoch, replayed, speaking for
                              another, over their size or their process's rate, superseded) */
    int64_t old_epoch;     /* of those, requests of another key epoch (another launch's: a replay across a relaunch) */
    int64_t oversized;     /* of those, requests refused by their size, before any MAC (over the socket's bound, or over
                              their kind's: DISPATCH_MAX_*_REQUEST_BYTES) */
    int64_t superseded;    /* of those, requests of a process a newer one of its rank replaced (or of an older
                              generation than the rank's current process) */
    int64_t second;        /* of those, requests of a second process of a live process's rank and generation */
    int64_t rate_limited;  /* of those, requests over their process's budget (DISPATCH_RATE_PER_S) */
    int64_t replaced;      /* live processes superseded by a newer process of their rank */
    int64_t macs;          /* MACs computed over requests (each request that reached its MAC, good or not) */
    int64_t mac_bytes;     /* the bytes those MACs covered */
    int64_t redone;        /* units granted again because the trainers dropped what was delivered */
    int64_t delivered;     /* units whose holder said it delivered them (its next ask names them; not fully-async) */
    int64_t bytes;         /* weight bytes served in chunks */
    int64_t broadcasts;    /* versions broadcast whole (weight_sync=broadcast) */
    int64_t relayed;       /* relay asks answered with a holder (the relay tree) */
    int64_t relay_direct;  /* relay asks answered "fetch it here" (the tree's first level, or no holder with room) */
    int64_t relay_failed;  /* asks that named a relay that failed them (a wrong digest, silent, gone) */
    int64_t relays_barred; /* relays never named again since */
    int live;              /* rollout processes alive now */
};

/* A grant's lease: a unit not delivered this long after its grant may be granted again to a process with nothing
 * else to do, DISPATCH_LEASE_FACTOR times the longest a unit has taken in the run so far, never less than the
 * floor. Its holder asking again gets it again; a lost holder's units go at once (lost_after_s). */
#define DISPATCH_LEASE_FLOOR_S 60.0
#define DISPATCH_LEASE_FACTOR 4.0

/* The most bytes a request of each kind may hold, checked before its MAC is computed (a legitimate one holds about
 * 150): a flood, with a key or without, costs the dispatcher a bounded MAC per message. Bigger requests are refused
 * by their size; the socket drops anything over GRPO_MAX_DISPATCH_REQUEST_BYTES unread. */
#define DISPATCH_MAX_WORK_REQUEST_BYTES 512
#define DISPATCH_MAX_WEIGHTS_REQUEST_BYTES 512

/* Each authenticated process's request budget: DISPATCH_RATE_PER_S on average, in bursts of DISPATCH_RATE_BURST
 * (a token bucket per identity, charged once a request's MAC is good). A rollout process asks a few dozen times a
 * second at most (asks 50 ms apart while it waits, a ping per heartbeat, weight chunks one at a time); past its
 * budget a request is refused at once with Reply.retry, and the client asks again shortly. */
#define DISPATCH_RATE_PER_S 500.0
#define DISPATCH_RATE_BURST 1000.0

/* A work request's answer (Grpo__WorkGrant.kind). */
enum work_kind { WORK_WAIT = 0, WORK_UNIT = 1, WORK_END = 2 };

struct dispatch_core;

/* A core for the options (endpoint unused) at time now; NULL with err when they make no dispatcher. */
struct dispatch_core *dispatch_core_create(const struct dispatch_options *o, double now, char *err, size_t errlen);
void dispatch_core_free(struct dispatch_core *d);
/* Parameters of the policy (a version's floats). */
size_t dispatch_core_floats(const struct dispatch_core *d);
/* One request as received (n bytes) at time now: the packed reply (malloc'd, *len bytes; authenticated for the
 * asker when its request was). Garbage, a request of another key epoch, one without a good MAC, a replayed one, one for
 * another process's rank or worker id, or of another kind get an error reply and count as refused. */
uint8_t *dispatch_core_handle(struct dispatch_core *d, const void *msg, size_t n, double now, size_t *len);
/* The clock moved to now: processes silent past lost_after_s are lost and their units granted again. The shell
 * calls it only when it has handled every request that arrived (its socket is empty), so that a process is judged
 * by the pings it sent, never by how late a busy dispatcher got to them. */
void dispatch_core_tick(struct dispatch_core *d, double now);
/* Publishing version v: the n_floats buffer to fill (the oldest snapshot, marked empty meanwhile), or NULL when
 * v is held already (a version never changes). dispatch_core_publish_end(v) makes it held and moves the window. */
float *dispatch_core_publish_begin(struct dispatch_core *d, int64_t version);
void dispatch_core_publish_end(struct dispatch_core *d, int64_t version);
/* With the relay tree on: the digest of the version being published (RELAY_DIGEST_BYTES), for the caller to fill
 * (relay_digest) between publish_begin and publish_end; NULL when the tree is off. */
uint8_t *dispatch_core_publish_digest(struct dispatch_core *d);
/* The run ends after step `after`; the first call's word stands. */
void dispatch_core_end(struct dispatch_core *d, int64_t after, const char *why);
void dispatch_core_stats(const struct dispatch_core *d, struct dispatch_stats *st);
/* True when the run has not ended or every live process has said it heard the end (a request with end_heard,
 * which it sends once the end has reached it: being sent the end is not enough, as an answer sent while the
 * socket closes can be lost, and the process would then find the dispatcher gone). */
bool dispatch_core_all_heard(const struct dispatch_core *d);
/* How many rollout ranks no process has served yet (one still starting when the trainers finished: it must be
 * told the end too, or it waits for a dispatcher that is gone and fails the job). */
int dispatch_core_unseen(const struct dispatch_core *d);
/* The weight broadcast (dispatch.h says how its rounds go). */
void dispatch_core_broadcast_on(struct dispatch_core *d, double rendezvous_s);
bool dispatch_core_round_begin(struct dispatch_core *d, int64_t *v, const float **w);
void dispatch_core_round_end(struct dispatch_core *d, bool ok);
bool dispatch_core_round_due(struct dispatch_core *d, double waited_s);

/* Whether the process serving rollout rank `slot` has been granted unit `unit` of `step` (a step of the window:
 * not yet trained). The trainers keep a batch only from a process the unit was granted to. */
bool dispatch_core_granted(const struct dispatch_core *d, int64_t step, int unit, int slot);
/* The trainers dropped what was delivered for unit `unit` of `step` (why: for the log): it is granted again. */
void dispatch_core_regrant(struct dispatch_core *d, int64_t step, int unit, const char *why);

/* ---- fully-async training (options.async) ----
 * Units are granted in stream order (a lost or expired holder's first) to whichever process asks, each with the
 * newest version published (a replay: the recorded one, once published); verl's bound: a new unit only while the
 * groups granted since the last push, plus those outstanding at it, stay within max_groups. */
/* Whether the process serving rollout rank `slot` has been granted unit `unit` of chunk `chunk`, which the trainer
 * does not have yet (the trainer keeps a batch only from such a process). */
bool dispatch_core_async_granted(const struct dispatch_core *d, int64_t chunk, int unit, int slot);
/* The trainer has unit `unit` of chunk `chunk` (its first copy): it is no longer in flight, and another copy is no
 * longer its grantee's (the trainer keeps the first). */
void dispatch_core_async_received(struct dispatch_core *d, int64_t chunk, int unit);
/* The trainer took (trained on, or dropped for staleness: dropped) a unit of `groups` groups. A dropped unit no
 * longer counts towards the bound: one more is granted in its place. */
void dispatch_core_async_taken(struct dispatch_core *d, int groups, bool dropped);
/* Hold new grants (a checkpoint drains the stream): only units granted already are granted again. */
void dispatch_core_async_hold(struct dispatch_core *d, bool hold);
/* Units granted that the trainer does not have yet. */
int dispatch_core_async_in_flight(const struct dispatch_core *d);
/* The next stream unit a live run grants (stream_next's successor: a checkpoint records it), and the groups counted
 * towards the bound since the last push. */
int64_t dispatch_core_async_next(const struct dispatch_core *d);
int64_t dispatch_core_async_window(const struct dispatch_core *d);

/* Groups [lo, hi) of unit u of U in a step of B groups. */
void dispatch_unit_range(int B, int U, int u, int *lo, int *hi);

#endif
