/* The progress watchdog (trainer.hang_timeout_s, trainer.hang_action): a thread on every trainer rank that sees
 * no step completed for the timeout, dumps this rank's flight recorder and native stack into RUN_DIR/flight, logs
 * where this rank is, and acts. The lead rank (world rank 0) then reads every rank's dump from that directory and
 * runs the hang verdict (proto/hang.h) on them: its log names the stuck rank and its wait. With trainer.hang_action
 * stop the lead names the newest checkpoint already written and ends the whole job, exit status 3 (a rank stuck in
 * a collective cannot join a new checkpoint: the steps after that one are lost); the other ranks end it themselves
 * when the lead does not within a grace period. With wait, they dump and log once per stall and wait on.
 *
 * It runs with and without grpod: it reads no control plane, only the steps the trainer completes
 * (watchdog_step_done) and whether the run is held on purpose (options.held: a pause under grpod).
 *
 * The test-only blocking points (test.block_at, test.block_rank, test.block_step) live here too: a rank made to
 * hang on purpose, for the tests of the watchdog and of grpoctl diagnose. */
#ifndef GRPO_WORKER_WATCHDOG_WATCHDOG_H
#define GRPO_WORKER_WATCHDOG_WATCHDOG_H

#include <stdbool.h>
#include <stdint.h>

/* Exit status of a job the watchdog ends. */
#define WATCHDOG_EXIT 3

struct watchdog_options {
    double timeout_s;       /* trainer.hang_timeout_s: > 0 seconds; < 0 from the observed step time; 0 off */
    bool stop;              /* trainer.hang_action=stop */
    int rank;               /* this process's world rank */
    int watched;            /* ranks 0..watched-1 run a watchdog (the trainer ranks): the lead reads their dumps */
    const char *dump_dir;   /* RUN_DIR/flight (flight_set_dump_dir's) */
    bool (*held)(void *ud); /* true while no step is expected (a pause); NULL: never */
    void *held_ud;
    void (*end_job)(int code); /* ends every rank of the job (comm_end_job) */
    /* called with why just before the job is ended (under grpod: tell it); NULL: none */
    void (*on_stop)(void *ud, const char *why);
    void *on_stop_ud;
};

/* Start the thread (nothing with timeout_s 0). 0, or -1 (logged). */
int watchdog_start(const struct watchdog_options *o);
/* The trainer completed step `step` (any thread; cheap). */
void watchdog_step_done(int64_t step);
/* A checkpoint of `step` is on disk in dir (the newest is the one a stop names): each one written, and the one the run
 * resumed from. */
void watchdog_checkpoint_saved(int64_t step, const char *dir);
/* Stop the thread (the run is over): no dump after this. */
void watchdog_stop(void);
/* This rank leads from now on (trainer.survive_trainer_loss: the lead was lost, this survivor took its place): it
 * judges the dumps and ends the job on a stall. */
void watchdog_set_lead(void);
/* The timeout for these step intervals (seconds, n of them): timeout_s when > 0, else max(300, 10 x the median),
 * 1800 with none. For the tests. */
double watchdog_timeout_for(double timeout_s, const double *intervals, int n);

/* ---- test only: a rank blocked for ever on purpose ---- */
enum watchdog_point {
    WATCHDOG_AT_REGISTER,   /* before registering with grpod */
    WATCHDOG_AT_UPDATE,     /* entering the update of a step */
    WATCHDOG_AT_CKPT_WRITE, /* inside the checkpoint write of a step (its flight record open) */
    /* entering the update of a step, the trainer (watchdog_test_here) makes a collective hang: */
    WATCHDOG_AT_DP_BARRIER,       /* a barrier of its DP group that no other rank enters (a mismatch in one group) */
    WATCHDOG_AT_TRAINERS_BARRIER, /* a barrier of the trainers' group that no other rank enters (across groups) */
    WATCHDOG_AT_IN_DP_COLLECTIVE, /* it freezes inside the update's first DP collective, which every rank enters */
};
/* test.block_at (its name: "none", "register", "update_actor", "checkpoint_write", "dp_barrier",
 * "trainers_barrier", "in_dp_collective"), test.block_rank, test.block_step for world rank `rank`. */
void watchdog_test_setup(const char *at, int block_rank, int64_t block_step, int rank);
/* Block here for ever when the setup names this point, this rank and (but for registering) this step. */
void watchdog_test_point(enum watchdog_point p, int64_t step);
/* True (and logged: what, a sentence of what this rank does there) when the setup names this point, this rank and
 * this step: the caller makes the hang. */
bool watchdog_test_here(enum watchdog_point p, int64_t step, const char *what);

#endif
