/* Why a run stands still: the hang verdict of grpoctl diagnose, the status page and the workers' watchdog.
 *
 * One pure function: each rank's state as its flight recorder tells it (the wait it is in now, its newest finished
 * wait, its phase), whether it registered, and how long the run has waited; verdicts come out, worst first, each
 * with its kind, the rank it blames and a sentence for people:
 *
 *   laggard      "rank 5 has not entered all-reduce #1234 of dp (ranks 0-4,6-7 waiting there 95 s); rank 5 is in
 *                 phase update_actor, in no wait"
 *   mismatch     the ranks of one group wait in different collectives, or at different numbers of the same one
 *   io           a rank stuck in a checkpoint's files, and who waits for it
 *   grant        a rollout rank waiting for a work grant that does not come
 *   unregistered start-up waits for a rank that never registered, named with its host
 *   pause        a pause asked for has waited that long for ranks that do not reach a safe point: each named with
 *                where it is (listed first: it answers why the pause does not complete; what follows says why)
 *   stuck        a long wait that fits none of these (every member waits in the same collective: the collective
 *                 itself does not complete)
 *   none         no rank has waited min_wait_s in one place
 *
 * grpod feeds it from its registry (the heartbeats' current_wait and recent_waits); the workers' watchdog
 * (worker/watchdog) from the ranks' dumps in RUN_DIR/flight. No clock, no sockets: the unit tests feed it
 * hand-made ranks. It lives in proto/ because both grpod and the workers run it. */
#ifndef GRPO_PROTO_HANG_H
#define GRPO_PROTO_HANG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/names.h"

#define HANG_MAX_FINDINGS 8
#define HANG_TEXT_MAX 640

/* One wait of a flight recorder (grpo.FlightEntry's fields); the strings are never NULL. */
struct hang_wait {
    const char *kind;    /* "collective", "p2p", "plane", "io" */
    const char *op;      /* "all-reduce", "checkpoint write", "work request", ... */
    const char *group;   /* "dp", "tp", "trainers", "dispatcher", "checkpoint" */
    const char *members; /* the group's world ranks as ranges ("0-4,6-7"), a plane's endpoint, an I/O's path */
    int group_size;
    uint64_t seq; /* the operation's number in its group (an I/O's step); 0: none */
    int peer;     /* -1: none */
    Grpo__Phase phase;
    int layer; /* -1: none */
    bool backward;
    double seconds; /* how long it took, or (open) has lasted so far */
};

enum hang_presence {
    HANG_LIVE,         /* heard from, at work */
    HANG_UNREGISTERED, /* the run expects it; it never registered */
    HANG_GONE,         /* lost, failed or ended */
    HANG_UNKNOWN,      /* nothing known of it (the watchdog found no dump of it) */
};

struct hang_rank {
    int rank;
    enum hang_presence presence;
    const char *host; /* never NULL; "" unknown */
    Grpo__Role role;
    Grpo__Phase phase; /* where it is now */
    int layer;         /* ... the model layer (-1: none) */
    bool backward;
    bool waiting; /* wait: the wait it is in now */
    struct hang_wait wait;
    const struct hang_wait *last; /* its newest finished wait; NULL: none */
    bool held;                    /* paused: held at a safe point, or where it waits on a paused peer (its wait is
                                     on purpose, and judged no hang) */
};

struct hang_run {
    double min_wait_s; /* a wait this long in one place, or a start-up this long short of ranks, is a hang */
    /* how long start-up has waited for the unregistered ranks (since the first registration); 0: it does not */
    double waiting_for_ranks_s;
    /* how long a pause asked for has waited for the ranks that are not held; 0: the run is not pausing */
    double pausing_s;
};

enum hang_kind {
    HANG_NONE,
    HANG_UNREGISTERED_RANK,
    HANG_IO,
    HANG_MISMATCH,
    HANG_LAGGARD,
    HANG_GRANT,
    HANG_STUCK,
    HANG_PAUSE
};

struct hang_finding {
    enum hang_kind kind;
    int rank;    /* the rank it blames (the laggard, the rank in I/O, the unregistered one); -1: none */
    double wait; /* the longest wait behind it, seconds */
    char text[HANG_TEXT_MAX];
};

/* Judge the ranks: fills out[] (at most max, worst first) and returns how many; always at least one when max > 0
 * (HANG_NONE when no rank has waited min_wait_s). */
int hang_analyse(const struct hang_rank *ranks, int n, const struct hang_run *run, struct hang_finding *out, int max);
/* "none", "unregistered", "io", "mismatch", "laggard", "grant", "stuck", "pause" */
const char *hang_kind_name(enum hang_kind k);
/* A wait for people: "all-reduce #1234 of dp (ranks 0-4,6-7)", "checkpoint write of step 40 in /runs/x",
 * "work request to dispatcher at tcp://h:1", with ", layer 12 backward" when where is true. */
void hang_wait_text(const struct hang_wait *w, bool where, char *out, size_t len);
/* Ranges of world ranks ("0-4,6-7") into out[] (at most max, sorted); the count, or -1 when the text is not whole
 * ranges (cut with "...", not numbers). */
int hang_parse_ranks(const char *text, int *out, int max);

/* n ranks, sorted, as ranges ("0-4,6-7"), cut with "..." when out is too short */
void hang_ranks_text(const int *sorted, int n, char *out, size_t len);

#endif
