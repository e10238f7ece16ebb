/* grpod's core: the registry of workers, the run state machine and the
 * handling of every control request. No sockets, no event loop, no files:
 * grpod.c feeds it bytes and clock ticks and persists what it marks dirty,
 * which is what lets the unit tests and the fuzzer drive it directly.
 *
 * Run states: WAITING (for workers) -> RUNNING -> PAUSING -> PAUSED ->
 * RUNNING ... -> STOPPING -> FINISHED, or FAILED, each with a reason. A lost
 * worker sends the run to WAITING (grpod.on_worker_lost=wait) or FAILED.
 *
 * Health: a worker silent for two heartbeat intervals is suspect (shown, no consequence); silent for
 * grpod.heartbeat_timeout_s it is lost. Silence is counted in grpod's own running time: a pause of grpod's
 * loop (core_tick called late, settings.tick_s) is not held against the workers. */
#ifndef GRPO_DAEMON_CORE_H
#define GRPO_DAEMON_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/placement.h"
#include "proto/names.h"
#include "proto/protocol.h"

#define CORE_MAX_WORKERS 16384
#define CORE_MAX_METRICS 128
#define CORE_MAX_DEVICES 16
#define CORE_HISTORY 512
#define CORE_EVENTS 64
#define CORE_TIMELINE 256 /* phase changes kept per worker for the status page */
#define CORE_NAME_MAX 64
#define CORE_HOST_MAX 256
#define CORE_REASON_MAX 512
#define CORE_CONFIG_MAX (64 * 1024) /* a rank's configuration text (Register.run_config), bytes */
#define CORE_RETIRED 16             /* launches of a run remembered as over */
#define CORE_FLIGHT_RECENT 16       /* finished waits kept per worker (Heartbeat.recent_waits) */
#define CORE_FLIGHT_TRACE 4096      /* records of a worker's trace (Heartbeat.trace) */
#define CORE_STACKS_MAX 16384       /* bytes of a worker's native stack (Heartbeat.stacks) */

/* How the run is laid out and how health is judged (from the placement.* and grpod.* keys). */
struct core_settings {
    /* the layout (placement_spec_from_config of grpod's keys, as every grpo-worker reads its own; rank counts both
     * 0: every rank is hybrid). grpod's own when it was given a layout key (also when a count or size is set): the
     * ranks must agree with it. Else the first rank's configuration (Register.run_config) lays the run out */
    struct placement_spec place;
    bool own_placement;
    /* the other keys that shape the run grpod was given (config_run_text with CONFIG_TEXT_GIVEN |
     * CONFIG_TEXT_NO_COUNTS): every rank's configuration must have these values. NULL or "": none */
    const char *own_config;
    double heartbeat_interval_s;
    double heartbeat_timeout_s;
    /* how often the shell calls core_tick (grpod: 0.25 s). A call later than 4 ticks says grpod's loop did not run
     * (a loaded host, a stopped process): that time is not counted as any worker's silence. 0: the core does not
     * judge its own pauses (every gap between calls counts) */
    double tick_s;
    bool fail_on_lost;         /* grpod.on_worker_lost=fail */
    double hang_wait_s;        /* grpod.hang_wait_s: a wait this long in one place is a hang (proto/hang.h); 0: 60 */
    const char *data_endpoint; /* grpod.data_endpoint; "" for the default */
    const char *http_url;      /* shown in status; may be NULL */
};

struct core_metric {
    char name[CORE_NAME_MAX];
    double value;
};

/* One wait of a worker's flight recorder (1.15, grpo.FlightEntry), as grpod keeps it. */
struct core_flight {
    uint64_t id, seq, bytes;
    char kind[16], op[32], group[32], members[128];
    int32_t group_size, peer, layer;
    Grpo__Phase phase;
    bool backward, open, failed;
    double began, seconds; /* unix seconds (the worker's clock); how long it took, or had waited when heard */
};

struct core_worker {
    int rank, pid;
    char host[CORE_HOST_MAX];
    char devices[CORE_MAX_DEVICES][128];
    int ndevices;
    char capabilities[256]; /* comma-separated */
    Grpo__Role role;
    int dp_rank, dp_size, tp_rank, tp_size, pp_rank, pp_size;
    uint64_t incarnation;
    Grpo__WorkerState state;
    double last_seen;  /* monotonic seconds */
    double stall_seen; /* core.stalled_s when last heard: grpod's pauses since do not count as silence */
    bool suspect;      /* silent for two heartbeat intervals, not lost yet (shown as WORKER_SUSPECT) */
    bool survived;     /* lost, and the others went on without it (Heartbeat.survived; its error the reason) */
    uint64_t hb_seq;   /* the newest heartbeat's Heartbeat.seq and sent_s (0: none, or an older worker) */
    double hb_sent;
    double registered_at; /* unix seconds */
    int64_t step, total_steps;
    Grpo__Phase phase;
    double idle_s, busy_s;              /* cumulative, as reported */
    double idle_fraction;               /* smoothed over recent heartbeats */
    double run_idle_s, run_busy_s;      /* the ledger of grpoctl diagnose: between heartbeats that both said running */
    double peak_rss_gb, host_memory_gb; /* as reported; 0: unknown */
    double timings[GRPO_NUM_PHASES];
    struct core_metric metrics[CORE_MAX_METRICS];
    int nmetrics;
    uint64_t checkpoint_seq_done;
    int64_t checkpoint_step;
    char error[CORE_REASON_MAX];
    struct {
        double start; /* unix seconds, the worker's clock */
        Grpo__Phase phase;
    } timeline[CORE_TIMELINE]; /* oldest first */
    int ntimeline;
    /* the flight recorder (1.15): the wait the newest heartbeat said the worker was in (waiting), when grpod heard
     * it (monotonic: an open wait has lasted wait.seconds + the time since), and its last finished waits */
    struct core_flight wait;
    bool waiting;
    int layer; /* the model layer the newest heartbeat said the main thread was in (-1: none), and its pass */
    bool backward;
    double wait_heard;
    struct core_flight recent[CORE_FLIGHT_RECENT]; /* oldest first */
    int nrecent;
    /* grpoctl trace / stacks: requests made (HeartbeatAck levels) and answered, the newest answer (heap, NULL:
     * none; freed by core_worker_release) and when it came (monotonic) */
    uint64_t trace_seq, trace_done, stacks_seq, stacks_done;
    struct core_flight *trace;
    int ntrace;
    double trace_at;
    char *stacks;
    double stacks_at;
};
/* Free what a worker holds besides itself (its trace and stacks). */
void core_worker_release(struct core_worker *w);
/* A kept wait as the protocol's FlightEntry (its strings point into f). */
void core_flight_proto(const struct core_flight *f, Grpo__FlightEntry *e);

struct core_history_point {
    int64_t step;
    double reward, throughput, time;
};

struct core_event {
    double time;
    char text[CORE_REASON_MAX];
};

struct core_run {
    char id[CORE_NAME_MAX];
    Grpo__RunState state;
    char reason[CORE_REASON_MAX];
    int64_t step, total_steps;
    Grpo__Phase phase;
    uint64_t config_digest;
    uint8_t plane_key[32]; /* the data-plane key of the run's current launch (proto/plane_auth.h): trainers get it,
                              every other process its own key derived from it; journaled (run.json is mode 0600) */
    uint64_t plane_epoch;  /* its key epoch: 1 for a run's first launch, one more for each launch after */
    uint64_t launch;       /* the current launch (Register.launch; 0: none known yet) */
    uint64_t retired[CORE_RETIRED]; /* launches before it, newest last: a registration of one is refused */
    int nretired;
    char *config; /* the run's configuration text, its first rank's (Register.run_config); NULL: none sent */
    int world;    /* expected workers; 0 until the first registration says */
    bool pause, stop;
    double pause_asked; /* when the run began pausing (unix seconds; not journaled: a restart counts from itself) */
    /* who asked for the stop, for the run's end: a worker on a signal (CommandRequest.requester: "SIGTERM on rank
     * 0 (host H) from its launcher, mpirun (pid N)"), else "operator", with grpoctl's --reason in parentheses */
    char stop_by[CORE_REASON_MAX / 2];
    uint64_t checkpoint_seq;      /* checkpoint requests so far */
    uint64_t checkpoint_seq_done; /* requests every worker has written */
    int64_t checkpoint_step;      /* newest checkpoint every worker has, -1: none */
    double started;               /* unix seconds */
    char abort[CORE_REASON_MAX];  /* a trainer of a split run is lost: the other ranks are told to end ("": no) */
    double abort_at;              /* when (unix seconds): ranks that registered later are not told */
    bool across_hosts;            /* a rank said its MPI world spans hosts (Register.world_hosts > 1): with no
                                     grpod.data_endpoint, the data plane goes over TCP */
    struct core_history_point history[CORE_HISTORY];
    int nhistory; /* oldest first; shifts when full */
};

/* Request counters, exported as Prometheus counters. */
struct core_counters {
    uint64_t requests[32]; /* by Envelope body case */
    uint64_t malformed, bad_version, auth_failed, invalid, refused, unexpected;
    uint64_t replayed;        /* tcp: a sealed request whose session used its counter already */
    uint64_t unknown_session; /* tcp: a sealed request of a session grpod does not know (restarted, forgotten) */
    uint64_t suspects;        /* times a worker became suspect */
    uint64_t losses;          /* times a worker was marked lost */
    /* connections closed after GRPOD_MAX_FAILED_ATTEMPTS failed requests (each answered after
     * GRPOD_FAILED_ATTEMPT_DELAY_S): on the tcp endpoints (grpod's count), on HTTP (http.c's) */
    uint64_t closed_failing_tcp, closed_failing_http;
    /* the journal (grpod.c counts them): state files written (each the whole run, durably), records appended to
     * run.log (a registration each), their bytes, and the bytes appended to events.log */
    uint64_t journal_saves, journal_records, journal_bytes, journal_event_bytes;
    uint64_t registrations_repeated; /* a process's registration asked again before its first heartbeat */
    double journal_seconds;          /* spent writing state files whole (building the text, writing, syncing) */
};

/* Failed attempts on one connection of grpod's tcp endpoints (authentication failed, a request that cannot be
 * read) or its HTTP page (a request refused: not found, a method it does not serve) before grpod closes it, and
 * how long each one's answer waits: guessing costs a connection per three guesses and a second per guess. */
#define GRPOD_MAX_FAILED_ATTEMPTS 3
#define GRPOD_FAILED_ATTEMPT_DELAY_S 1.0
#define GRPOD_STR_(x) #x
#define GRPOD_STR(x) GRPOD_STR_(x)

typedef void (*core_event_fn)(void *ud, double time, const char *text);

struct ctl_server;

struct core {
    struct core_settings set;
    struct core_run run;
    struct placement_spec place;  /* the run's layout: grpod's own numbers, or its configuration's */
    struct core_worker **workers; /* [nworkers] by rank; NULL: that rank has not registered in this run */
    int nworkers;
    char **rank_hosts; /* [nworkers]: each rank's host as a registration's world_host_names said (1.16); NULL: none */
    struct core_event events[CORE_EVENTS];
    int nevents;
    struct core_counters counters;
    double start_mono, start_wall;
    double last_tick; /* monotonic seconds of the last core_tick (ticked: there was one) */
    bool ticked;
    double stalled_s;     /* seconds grpod's loop did not run, in all (settings.tick_s) */
    uint64_t evaluations; /* times the run's state was judged from every worker's (for the tests) */
    /* The journal's records (core_save_record): the last record's number (the state file says the last it holds),
     * the rank whose registration alone is what must be made durable now (-1: none; then the whole state is), and
     * the events added since the journal's last write. */
    uint64_t journal_seq;
    int record_rank;
    int events_new, history_new;
    bool dirty;        /* something worth journaling changed */
    bool dirty_urgent; /* ... that must be durable before the reply goes out */
    core_event_fn on_event;
    void *event_ud;
    uint64_t rng;
    struct ctl_server *ctl; /* tcp endpoints' sessions (proto/ctl_auth.h), made at the first tcp request */
    double drop_window;     /* rate limit of "dropped a request" log lines */
    int drop_logged;
    uint64_t drop_suppressed;
};

/* Take text (config_run_text's form) as the run's configuration: its first rank's, or the journal's. Unless
 * grpod has placement keys of its own, the run's layout follows it. 0, or -1 with why (text that does not
 * read; the run is then left as it was). */
int core_set_run_config(struct core *c, const char *text, char *why, size_t whylen);
/* The layout part of grpod's settings from its configuration (the run's keys it was given), read by
 * placement_spec_from_config as grpo-worker reads it: set->own_placement when any layout key was given
 * (placement_keys_given).
 * 0, or -1 with why. */
struct grpo_config;
int core_settings_place(struct core_settings *set, const struct grpo_config *cfg, char *why, size_t whylen);
/* Set up an empty core with a fresh run in WAITING. now is the monotonic clock. */
void core_init(struct core *c, const struct core_settings *set, double now);
/* Free what the core holds. */
void core_deinit(struct core *c);
/* Forget every worker (a new run, or a journal being loaded). */
void core_free_workers(struct core *c);
/* Be told of every event (state changes, workers lost, commands) as it happens. */
void core_set_event_hook(struct core *c, core_event_fn fn, void *ud);

/* Handle one request's bytes and return the packed reply (never NULL; caller frees).
 * secret: the shared secret of a tcp:// endpoint, whose every request must come sealed in a session that proved
 * it by challenge-response (proto/ctl_auth.h; an AuthHello is answered with a challenge), or NULL for none (ipc). */
uint8_t *core_handle(struct core *c, const uint8_t *buf, size_t len, const char *secret, double now, size_t *reply_len);
/* core_handle that also says whether the request was authenticated (a sealed request of a session that proved
 * secret; any well-formed one when secret is NULL): grpod's tcp endpoints keep only connections that authenticate. */
uint8_t *core_handle_auth(struct core *c, const uint8_t *buf, size_t len, const char *secret, double now,
                          size_t *reply_len, bool *authenticated);
/* Health check: mark workers suspect (two heartbeat intervals of silence) or lost (grpod.heartbeat_timeout_s), and
 * re-evaluate the run. Call every settings.tick_s: a call much later says grpod's loop did not run, and that time is
 * not counted as silence. */
void core_tick(struct core *c, double now);
/* The state grpod shows for a worker: WORKER_SUSPECT while it is suspect, else its state. */
Grpo__WorkerState core_worker_shown_state(const struct core_worker *w);

/* Build the Status message of the run (allocations in arena, see arena.h). */
struct arena;
Grpo__Status *core_status(const struct core *c, double now, struct arena *a);
/* core_status listing at most max_workers workers (< 0: all): those starting, suspect, lost, failed or reconnecting
 * first, then the lowest ranks, in rank order; *registered (when not NULL) gets how many are registered. */
Grpo__Status *core_status_some(const struct core *c, double now, struct arena *a, int max_workers, int *registered);
/* grpoctl diagnose's verdict on the run from the workers' ledger (diagnose.h): fills out[] (at most max, worst
 * first) and returns how many. */
struct diag_finding;
int core_diagnose(const struct core *c, struct diag_finding *out, int max);
/* The hang verdict on the run (proto/hang.h) from the workers' flight recorders: fills out[] (at most max, worst
 * first) and returns how many (HANG_NONE alone when there is none). now: the monotonic clock. */
struct hang_finding;
int core_hang(const struct core *c, double now, struct hang_finding *out, int max);
/* Prometheus text exposition of the run, the workers and the request counters. Caller frees. */
char *core_metrics_text(const struct core *c, double now);

/* Journal form of the run (state file): a JSON text. Caller frees. */
char *core_save_json(const struct core *c);
/* The journal's record of one registration or heartbeat (c->record_rank's worker), one line of JSON: the worker, the
 * run's state, reason, step and the other scalars they change, the events and history points added since the
 * journal's last write. Durable, it
 * stands for the whole state until the next core_save_json (which holds it: the records' numbers say so). Caller
 * frees. */
char *core_save_record(struct core *c);
/* Apply a record after core_load_json (one not newer than what the state file holds is skipped). 0, or -1 with err
 * (a torn last line: the caller stops there). */
int core_apply_record(struct core *c, const char *line, double now, char *err, size_t errlen);
/* Restore a run saved by core_save_json; workers come back RECONNECTING with a fresh grace period.
 * 0, or -1 with err (the core is then left as core_init made it). */
int core_load_json(struct core *c, const char *text, double now, char *err, size_t errlen);
/* Replace the event ring (journal replay). */
void core_add_event_record(struct core *c, double time, const char *text);
/* Append a point of the run's history (the oldest dropped when it is full). */
void core_add_history_point(struct core *c, const struct core_history_point *pt);

#endif
