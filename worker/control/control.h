/* The worker's side of the control plane: register with grpod, heartbeat,
 * obey pause / resume / stop / checkpoint at safe points.
 *
 * control_open() registers (retrying with backoff until grpod.connect_timeout_s)
 * and starts a background thread that owns the socket from then on: every
 * heartbeat_interval_s it sends the latest snapshot (step, phase, per-phase
 * timings, idle and busy time, metrics) that the trainer updates through the
 * control_set_* calls, which only take a mutex and never block on the network.
 * The thread keeps heartbeating while the trainer is busy in a long phase or
 * held in control_wait_resume(), reconnects with backoff when grpod restarts,
 * and registers again (same run, same rank) when grpod asks it to.
 *
 * Commands arrive as levels (pause wanted, stop wanted, checkpoint count), so
 * a lost message or a grpod restart cannot lose one. The trainer asks at its
 * safe points (after a generation batch, after an optimizer step):
 *
 *     switch (control_poll(ctl)) {
 *     case CONTROL_NONE: break;                                // carry on
 *     case CONTROL_CHECKPOINT: save(step); control_checkpoint_done(ctl, step); break;
 *     case CONTROL_PAUSE:                                      // hold; heartbeats go on
 *         ... control_wait_resume(ctl) returns CONTROL_RESUME, CONTROL_CHECKPOINT or CONTROL_STOP
 *     case CONTROL_STOP: save(step); control_checkpoint_done(ctl, step);
 *                        control_finish(ctl, CONTROL_END_STOPPED, NULL); ... end the loop
 *     }
 *
 * or lets control_safe_point() run exactly that with a save callback.
 *
 * A NULL struct control * is valid in every call and means "no grpod": the
 * setters do nothing, control_poll returns CONTROL_NONE. control_open gives
 * NULL (and returns 0) when the endpoint is empty, so a trainer runs alone or
 * under grpod with the same code. */
#ifndef GRPO_WORKER_CONTROL_CONTROL_H
#define GRPO_WORKER_CONTROL_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/names.h" /* Grpo__Phase: the phases of a step, and their names */

struct grpo_config;
struct control;

enum control_role {
    CONTROL_ROLE_UNASSIGNED = 0,
    CONTROL_ROLE_ROLLOUT = 1,
    CONTROL_ROLE_TRAINER = 2,
    CONTROL_ROLE_HYBRID = 3, /* rollout and trainer in one process */
    CONTROL_ROLE_SPARE = 4,  /* waits to take a lost trainer's place (trainer.survive_spare_ranks) */
    CONTROL_ROLE_IDLE = 5,   /* left its model copy (TP/PP), which lost a rank; waits until the run ends */
};

enum control_command {
    CONTROL_NONE = 0,
    CONTROL_PAUSE = 1,      /* hold at this safe point: call control_wait_resume() */
    CONTROL_RESUME = 2,     /* (from control_wait_resume) carry on */
    CONTROL_STOP = 3,       /* checkpoint, control_finish(CONTROL_END_STOPPED), end */
    CONTROL_CHECKPOINT = 4, /* write a checkpoint now, then control_checkpoint_done() */
};

/* How a worker ends (control_finish). */
enum control_end {
    CONTROL_END_FINISHED = 0, /* trained every step */
    CONTROL_END_STOPPED = 1,  /* ended on a stop command, after its checkpoint */
    CONTROL_END_FAILED = 2,   /* gave up; the error text says why */
};

struct control_options {
    const char *endpoint;             /* grpod.endpoint; NULL or "": no grpod (control_open gives NULL) */
    const char *secret_file;          /* grpod.secret_file; tcp:// endpoints need it */
    int rank, world_size;             /* this process in the job (MPI rank and size) */
    const char *host;                 /* NULL: gethostname() */
    const char *capabilities;         /* comma-separated: "rollout,trainer" (the default) */
    const char *devices;              /* comma-separated: "cpu" (the default), "cuda:0 NVIDIA H200" */
    uint64_t config_digest;           /* control_config_digest() of the run's configuration; grpod checks all ranks
                                         agree (0: not checked) */
    const struct grpo_config *config; /* sent to grpod as text (the first rank's defines the run); NULL: not sent */
    int64_t start_step;               /* steps already done (a resumed run); 0 for a fresh one */
    double connect_timeout_s;         /* how long to retry the first registration, and to keep retrying the end
                                         message while grpod is unreachable (control_finish); 0: forever */
    /* grpod says a peer this worker depends on is lost (a trainer of the same DP group): called from the
     * heartbeat thread with the reason; it should end the process (NULL: the reason is only logged) */
    void (*on_abort)(const char *reason);
    int world_hosts; /* how many hosts the MPI world spans (Register.world_hosts; 0: not counted) */
    /* every world rank's host name (Register.world_host_names), world_host_stride bytes each; NULL: not sent */
    const char *world_host_names;
    int world_host_stride;
    bool replaces;   /* take the place of rank `rank`, lost, in the run grpod runs (grpo-worker --replace-rank) */
    uint64_t launch; /* names this launch (Register.launch: world rank 0's random number, the same on every rank of
                        the job); a launch grpod has not seen gets fresh data-plane keys. 0: unknown */
    /* test only (test.delay_phase, test.delay_s): sleep this long each time the worker enters this phase
     * (GRPO__PHASE__PHASE_IDLE: never) */
    Grpo__Phase delay_phase;
    double delay_s;
};

/* What grpod assigned at registration. */
struct control_assignment {
    enum control_role role;
    int dp_rank, dp_size, tp_rank, tp_size, pp_rank, pp_size;
    int world_size;
    char run_id[64];
    int64_t resume_step;          /* newest checkpoint step every worker has, -1: none */
    uint64_t config_digest;       /* the run's */
    char data_pull_endpoint[256]; /* trainer DP heads: bind a PULL socket here */
    char data_push_endpoint[256]; /* rollout: this rank's trainer endpoint */
    int n_trainer_endpoints;      /* rollout: every trainer DP rank's endpoint */
    char trainer_endpoints[64][256];
    char dispatch_endpoint[256]; /* rollout: the trainers' dispatcher (work units and weights) */
    double heartbeat_interval_s;
    uint64_t incarnation; /* this registration's: with the rank and the pid, the data-plane identity */
    bool has_plane_key;   /* grpod handed out this process's data-plane key (1.8) */
    uint8_t plane_key[32];
    bool has_plane_run_key; /* trainer ranks: the run's data-plane key */
    uint8_t plane_run_key[32];
    uint64_t plane_epoch; /* the keys' epoch (1.12; 0: an older grpod) */
};

/* Digest of the configuration every rank of a run must share: all keys but grpod.* (how a host
 * reaches grpod may differ between hosts) and trainer.log_level. grpod refuses a rank whose
 * digest differs from the first rank's. */
uint64_t control_config_digest(const struct grpo_config *cfg);
/* Fill options from the configuration (grpod.* keys, config digest) for this rank. */
void control_options_from_config(struct control_options *o, const struct grpo_config *cfg, int rank, int world_size);
/* grpo-worker --replace-rank: ask grpod (cfg's grpod.endpoint and grpod.secret_file) for the configuration of the
 * run it runs and take it into cfg: the keys that shape the run get the run's values, grpod.* keys stay cfg's. A
 * key cfg was given (a file or the command line) with a value other than the run's is refused, naming it.
 * 0, or -1 with err (grpod unreachable or without a run, or the keys that differ). */
int control_adopt_run_config(struct grpo_config *cfg, char *err, size_t errlen);
/* Register with grpod and start heartbeating. 0 with *out set (NULL when the endpoint is empty),
 * or -1 with err: grpod unreachable within connect_timeout_s, or the registration was refused
 * (placement, configuration digest, protocol version: err says which). */
int control_open(const struct control_options *o, struct control **out, struct control_assignment *a, char *err,
                 size_t errlen);

/* Enter a phase (GRPO__PHASE__PHASE_IDLE: waiting, which counts as idle time); the time spent in the previous
 * one is accounted to it. */
void control_set_phase(struct control *c, Grpo__Phase phase);
/* Steps completed so far and the total; completing a step closes its per-phase timings. */
void control_set_step(struct control *c, int64_t step, int64_t total_steps);
/* Set one metric of the snapshot (verl names: "critic/score/mean", "perf/throughput", ...). */
void control_set_metric(struct control *c, const char *name, double value);

/* At a safe point: the command to obey now, CONTROL_NONE most of the time. Never blocks.
 * Priority: STOP, then CHECKPOINT (each request is returned once), then PAUSE. STOP also once the process has
 * received SIGTERM or SIGINT (control_stop_signal), except on a rollout rank: its end is the trainers'. */
enum control_command control_poll(struct control *c);
/* Hold (reported as paused) until grpod resumes the run: returns CONTROL_RESUME, or
 * CONTROL_CHECKPOINT (write one, report it, call this again) or CONTROL_STOP (also on SIGTERM or SIGINT, as
 * control_poll). */
enum control_command control_wait_resume(struct control *c);
/* While waiting for peers inside a collective (done false), call now and then: while grpod wants the run
 * paused the worker reports itself paused (its peers hold it there) and this waits a moment; once the
 * collective completes (done true) it reports running again. Checkpoint and stop requests stay for the next
 * safe point. */
void control_hold_while_waiting(struct control *c, bool done);
/* control_hold_while_waiting as a comm_broadcast_polled callback: ctl is the struct control * (may be NULL). */
void control_wait_poll(void *ctl, bool done);
/* True while grpod wants the run paused (any thread may ask; false without grpod). */
bool control_pause_wanted(struct control *c);
/* grpod said the run finished (a heartbeat's answer, or its refusal to take this rank back: the run is over).
 * A rank that was away (frozen, cut off) while the run ended has nothing left to do. false without grpod. */
bool control_run_finished(struct control *c);
/* Under grpod: true while grpod cannot be reached (this rank is cut off, or grpod is down: nothing is known) or
 * says the run goes on (no stop, not over, this rank still its); false once it says otherwise, and without grpod.
 * A rollout rank that hears nothing from the trainers waits on while this holds: grpod ends it when a trainer is
 * lost, and a cut of its host's link is no reason to end. */
bool control_run_goes_on(struct control *c);
/* A checkpoint of `step` steps is on disk. */
void control_checkpoint_done(struct control *c, int64_t step);
/* trainer.survive_trainer_loss: the run went on without these ranks (their launch ranks, as registered), reason
 * "survived: DP 3 -> 2 at step 4"; every heartbeat from now on says so (Heartbeat.survived), and grpod shows them as
 * lost with that reason instead of ending the run. At most 16 in all. */
void control_set_survived(struct control *c, const int *ranks, int n, const char *reason);
/* After a loss survived: this rank's DP rank and size in the re-formed layout, in every heartbeat from now on
 * (Heartbeat.layout_dp_*); a spare that joined trains from now on, and grpod shows it so. */
void control_set_layout(struct control *c, int dp_rank, int dp_size);
/* After a loss survived by TP or PP model copies: this rank's copy lost a rank and left, and the rank waits, training
 * nothing, until the run ends (why: where it was and what its copy lost); every heartbeat from now on says so
 * (Heartbeat.left_copy), and grpod shows it idle. */
void control_set_left(struct control *c, const char *why);
/* A replica's word that the writer (its DP rank 0) wrote the checkpoint of `step` for it: every request this
 * rank has heard of is answered (grpod counts a request done at the slowest rank, and the writer's own count
 * bounds it). */
void control_checkpoint_held(struct control *c, int64_t step);
/* Run control_poll's answer to completion at a safe point: save(ud, step) writes a checkpoint
 * (returns 0 on success). Returns true to go on training, false to end (stopped: the final
 * checkpoint is written and reported; call control_finish(c, CONTROL_END_STOPPED, NULL)). */
bool control_safe_point(struct control *c, int64_t step, int (*save)(void *ud, int64_t step), void *ud);
/* Tell grpod how this worker ends and wait until it has heard: a few seconds while grpod answers; while it is
 * unreachable the message is kept and retried with backoff for up to connect_timeout_s (a grpod restarted meanwhile
 * learns the run ended), or a few seconds when a stop signal came. */
void control_finish(struct control *c, enum control_end end, const char *error);
/* From any thread, when the process is about to end the job itself (the progress watchdog): report this worker
 * failed with error and wait at most wait_s for grpod to hear it (never longer: the caller ends the job next). */
void control_fail_now(struct control *c, const char *error, double wait_s);
/* Stop the heartbeat thread, close the socket, free. */
void control_close(struct control *c);

/* SIGTERM and SIGINT: Slurm (time limit, preemption), systemd and a terminal end a process with them. A
 * worker takes the first as a stop request: the trainer checkpoints at its next safe point and the process
 * exits 0; under grpod the worker (a trainer or hybrid rank) also asks grpod to stop the run, as grpoctl stop
 * does, so that every rank ends. The same signal again within a second is the same request (timeout and
 * signals to the process group deliver two); any later or other signal, or a third, ends the process at once,
 * without a checkpoint (exit status 128 + the signal's number), with a log line.
 *
 * Block both signals in the calling thread, and so in every thread it starts afterwards, and take them in a
 * thread of their own (so no other thread's system call is interrupted by them). Call once, early in main,
 * before any other thread exists. 0, or -1 (logged: the signals keep their default action). */
int control_catch_stop_signals(void);
/* The first SIGTERM or SIGINT taken since control_catch_stop_signals (the signal's number), or 0. */
int control_stop_signal(void);
/* Where the first stop signal came from, to follow its name in a message: " from its launcher, mpirun (pid N)",
 * " from pid N (bash)"; "" before any, or when the sender is unknown. */
const char *control_stop_signal_from(void);
/* "SIGTERM", "SIGINT", or "signal N". */
const char *control_signal_name(int sig);

/* "none", "pause", "resume", "stop", "checkpoint". */
const char *control_command_name(enum control_command cmd);
/* "unassigned", "rollout", "trainer", "hybrid". */
const char *control_role_name(enum control_role role);

#endif
