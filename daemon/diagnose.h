/* Where a run's time goes, and what to do about it (grpoctl diagnose, the status page).
 *
 * One pure function: the per-rank ledger grpod keeps (each rank's role, its idle and busy seconds since its
 * first step, its last step's seconds per phase, its memory) and the leader's step metrics go in; findings come
 * out, worst first, each with its kind, a one-line sentence with the numbers, and the configuration key to turn.
 * No clock, no sockets: the unit tests feed it hand-made ledgers. */
#ifndef GRPO_DAEMON_DIAGNOSE_H
#define GRPO_DAEMON_DIAGNOSE_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/names.h"

#define DIAG_MAX_FINDINGS 8
#define DIAG_TEXT_MAX 512

enum diag_kind {
    DIAG_TOO_EARLY,         /* no step has finished: nothing to judge yet */
    DIAG_BALANCED,          /* no bottleneck found */
    DIAG_ROLLOUT_BOUND,     /* the trainers wait for rollouts */
    DIAG_TRAINER_BOUND,     /* the rollout ranks wait for the trainers */
    DIAG_WEIGHT_SYNC_BOUND, /* a large share of the step moves weights */
    DIAG_LONG_TAIL,         /* a step's generation waits for its slowest share */
    DIAG_STRAGGLER,         /* one rank is slower than its peers, step after step */
    DIAG_MEMORY_HEADROOM,   /* a host's memory is nearly all taken */
};

enum diag_severity { DIAG_INFO, DIAG_WARN };

/* One rank of the ledger. */
struct diag_rank {
    int rank;
    Grpo__Role role;
    bool live;                          /* heard from and not ended in failure or lost */
    const char *host;                   /* never NULL */
    double idle_s, busy_s;              /* since its first step, pauses left out */
    double phase_s[GRPO_NUM_PHASES];    /* its last whole step, by phase (0 where it spent none) */
    double peak_rss_gb, host_memory_gb; /* resident peak of the process, and its host's memory; NAN: unknown */
};

/* The run's step metrics (the lowest rank that reports each: the trainers' DP rank 0); NAN where not reported. */
struct diag_run {
    int64_t steps;           /* steps finished */
    double step_s;           /* timing_s/step */
    double wait_data_s;      /* timing_s/wait_data */
    double update_weights_s; /* timing_s/update_weights */
    double staleness;        /* training/staleness: 0 on-policy */
    double gen_wait_peers_s; /* colocated/gen_wait_peers_s */
    double gen_imbalance;    /* colocated/gen_imbalance */
    double units_stolen;     /* colocated/units_stolen */
};

struct diag_finding {
    enum diag_kind kind;
    enum diag_severity severity;
    double share;             /* of the run's time it costs (0..1): the order of the findings */
    char text[DIAG_TEXT_MAX]; /* what was found, with the numbers */
    char knob[DIAG_TEXT_MAX]; /* what to turn ("" for none) */
};

/* Judge the run: fills out[] (at most max, worst first) and returns how many; always at least one when max > 0
 * (DIAG_TOO_EARLY or DIAG_BALANCED when nothing else is found). */
int diagnose(const struct diag_rank *ranks, int n, const struct diag_run *run, struct diag_finding *out, int max);
/* The kind's name in the status reply and grpoctl's output ("rollout_bound", ...). */
const char *diag_kind_name(enum diag_kind k);
/* The severity's name ("info", "warn"). */
const char *diag_severity_name(enum diag_severity s);

#endif
