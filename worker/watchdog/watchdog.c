/* The progress watchdog; see watchdog.h. */
#include "watchdog.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config_key_names.h"
#include "common/log.h"
#include "proto/hang.h"
#include "worker/flight/flight.h"

#define INTERVALS 64        /* step intervals kept for the median */
#define AUTO_FLOOR_S 300.0  /* the automatic timeout's least: minutes, not a slow step */
#define AUTO_FACTOR 10.0    /* ... and ten median steps */
#define AUTO_FIRST_S 1800.0 /* before any step is timed: start-up, warm-up and a first validation included */
#define POLL_S 0.25
#define STACK_MAX 16384

static struct watchdog_options g_o;
static char g_dump_dir[2048];
static pthread_t g_thread;
static bool g_started;
static _Atomic bool g_quit;
static _Atomic bool g_lead; /* this rank leads: world rank 0, or the survivor that took a lost lead's place */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* the fields below */
static double g_last_step_at;                            /* monotonic; 0: none yet */
static int64_t g_last_step = -1;
static double g_intervals[INTERVALS];
static int g_nintervals, g_next;
static int64_t g_ckpt_step = -1;
static char g_ckpt_dir[2048];

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double watchdog_timeout_for(double timeout_s, const double *intervals, int n)
{
    if (timeout_s > 0)
        return timeout_s;
    if (n <= 0)
        return AUTO_FIRST_S;
    double v[INTERVALS];
    n = n < INTERVALS ? n : INTERVALS;
    memcpy(v, intervals, (size_t)n * sizeof *v);
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    const double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    return fmax(AUTO_FLOOR_S, AUTO_FACTOR * med);
}

void watchdog_step_done(int64_t step)
{
    const double now = clock_now_s();
    pthread_mutex_lock(&g_mu);
    if (g_last_step_at > 0 && step > g_last_step) { /* the first step's time includes the start-up: not timed */
        g_intervals[g_next] = (now - g_last_step_at) / (double)(step - g_last_step);
        g_next = (g_next + 1) % INTERVALS;
        g_nintervals += g_nintervals < INTERVALS;
    }
    g_last_step_at = now;
    g_last_step = step;
    pthread_mutex_unlock(&g_mu);
}

void watchdog_checkpoint_saved(int64_t step, const char *dir)
{
    pthread_mutex_lock(&g_mu);
    g_ckpt_step = step;
    snprintf(g_ckpt_dir, sizeof g_ckpt_dir, "%s", dir ? dir : "");
    pthread_mutex_unlock(&g_mu);
}

/* ---- the lead's verdict from the ranks' dumps ---- */

/* One rank's dump, read back for the verdict: its strings live in the JSON kept beside it. */
struct dumped {
    json_t *open, *last; /* the wait under way and the newest finished one (borrowed from lines) */
    json_t *lines;       /* every record */
    const char *phase, *host;
    int layer;
    bool backward, ok;
};

static const char *str_of(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static Grpo__Phase phase_of(const char *name)
{
    for (int p = 0; p < GRPO_NUM_PHASES; p++)
        if (strcmp(core_phase_name((Grpo__Phase)p), name) == 0)
            return (Grpo__Phase)p;
    return GRPO__PHASE__PHASE_IDLE;
}

static void wait_of(json_t *e, struct hang_wait *w)
{
    *w = (struct hang_wait){.kind = str_of(e, "kind"),
                            .op = str_of(e, "op"),
                            .group = str_of(e, "group"),
                            .members = str_of(e, "members"),
                            .group_size = (int)json_integer_value(json_object_get(e, "group_size")),
                            .seq = (uint64_t)json_integer_value(json_object_get(e, "seq")),
                            .peer = (int)json_integer_value(json_object_get(e, "peer")),
                            .phase = phase_of(str_of(e, "phase")),
                            .layer = (int)json_integer_value(json_object_get(e, "layer")),
                            .backward = strcmp(str_of(e, "pass"), "backward") == 0,
                            .seconds = json_number_value(json_object_get(e, "seconds"))};
}

/* Rank r's dump at path, if it was written in this stall (its reason the watchdog's, its time since since_wall). */
static bool read_dump(const char *path, double since_wall, struct dumped *d)
{
    memset(d, 0, sizeof *d);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char *line = NULL;
    size_t cap = 0;
    bool first = true, fresh = false;
    d->lines = json_array();
    while (getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o)
            continue;
        if (first) {
            first = false;
            fresh = strncmp(str_of(o, "reason"), "watchdog", 8) == 0 &&
                    json_number_value(json_object_get(o, "time")) >= since_wall;
            json_array_append_new(d->lines, o); /* kept: the phase's text lives in it */
            d->phase = str_of(o, "phase");
            d->host = str_of(o, "host");
            d->layer = json_is_integer(json_object_get(o, "layer"))
                           ? (int)json_integer_value(json_object_get(o, "layer"))
                           : -1;
            d->backward = strcmp(str_of(o, "pass"), "backward") == 0;
            continue;
        }
        json_array_append_new(d->lines, o);
        if (json_is_true(json_object_get(o, "open")))
            d->open = o;
        else
            d->last = o;
    }
    free(line);
    fclose(f);
    d->ok = fresh;
    return fresh;
}

/* Wait (at most grace seconds) for every watched rank's dump of this stall, then judge them and log the verdict.
 * out: the first finding's text (the job's end names it). */
static void lead_verdict(double since_wall, double grace, double min_wait, char *out, size_t len)
{
    const int n = g_o.watched > 0 ? g_o.watched : 1;
    struct dumped *d = xcalloc((size_t)n, sizeof *d);
    char path[2200];
    const double until = clock_now_s() + grace;
    int have = 0;
    for (;;) {
        have = 0;
        for (int r = 0; r < n; r++) {
            if (!d[r].ok) {
                json_decref(d[r].lines);
                snprintf(path, sizeof path, "%s/rank-%d.jsonl", g_dump_dir, r);
                read_dump(path, since_wall, &d[r]);
            }
            have += d[r].ok;
        }
        if (have == n || clock_now_s() >= until || atomic_load(&g_quit))
            break;
        clock_sleep_s(0.2);
    }
    struct hang_rank *ranks = xcalloc((size_t)n, sizeof *ranks);
    struct hang_wait *last = xcalloc((size_t)n, sizeof *last);
    for (int r = 0; r < n; r++) {
        ranks[r] =
            (struct hang_rank){.rank = r, .presence = d[r].ok ? HANG_LIVE : HANG_UNKNOWN, .host = "", .layer = -1};
        if (!d[r].ok)
            continue;
        ranks[r].phase = phase_of(d[r].phase ? d[r].phase : "");
        ranks[r].layer = d[r].layer;
        ranks[r].backward = d[r].backward;
        ranks[r].host = d[r].host ? d[r].host : "";
        if (d[r].open) {
            ranks[r].waiting = true;
            wait_of(d[r].open, &ranks[r].wait);
        }
        if (d[r].last) {
            wait_of(d[r].last, &last[r]);
            ranks[r].last = &last[r];
        }
    }
    struct hang_finding f[HANG_MAX_FINDINGS];
    const struct hang_run run = {.min_wait_s = min_wait};
    const int nf = hang_analyse(ranks, n, &run, f, HANG_MAX_FINDINGS);
    log_error("watchdog", "the verdict on the %d of %d trainer ranks' dumps found in %s:", have, n, g_dump_dir);
    for (int i = 0; i < nf; i++)
        log_error("watchdog", "hang (%s): %s", hang_kind_name(f[i].kind), f[i].text);
    snprintf(out, len, "%s", nf ? f[0].text : "");
    for (int r = 0; r < n; r++)
        json_decref(d[r].lines);
    free(d);
    free(ranks);
    free(last);
}

/* ---- the thread ---- */

static void fire(double idle, double limit)
{
    char reason[160];
    snprintf(reason, sizeof reason, "watchdog: no step completed for %.0f s", idle);
    const double since_wall = clock_wall_s() - idle;
    flight_dump(reason, false);
    char *stack = xmalloc(STACK_MAX);
    if (flight_stack_capture(stack, STACK_MAX, 2.0) == 0)
        flight_save_text("stacks", stack);
    free(stack);
    struct flight_entry cur;
    char where[1024];
    if (flight_current(&cur))
        flight_entry_text(&cur, clock_now_s(), where, sizeof where);
    else
        snprintf(where, sizeof where, "no wait (a computation, or a wait the flight recorder does not see)");
    log_error("watchdog",
              "no step completed for %.0f s (" KEY_trainer_hang_timeout_s " %.0f s): rank %d is in %s; its flight "
              "recorder and native stack are in %s",
              idle, limit, g_o.rank, where, g_dump_dir[0] ? g_dump_dir : "(no run directory: the log only)");
    pthread_mutex_lock(&g_mu);
    const int64_t ckpt = g_ckpt_step;
    char ckpt_dir[2048];
    snprintf(ckpt_dir, sizeof ckpt_dir, "%s", g_ckpt_dir);
    pthread_mutex_unlock(&g_mu);
    const double grace = fmin(30.0, fmax(2.0, limit / 4));
    char verdict[HANG_TEXT_MAX] = "";
    if (atomic_load(&g_lead) && g_dump_dir[0])
        lead_verdict(since_wall, grace, limit / 2, verdict, sizeof verdict);
    if (!g_o.stop) {
        log_warn("watchdog", KEY_trainer_hang_action " wait: waiting on (this stall is dumped once)");
        return;
    }
    if (!atomic_load(&g_lead)) { /* the lead ends the job once it has named the stuck rank; unless it cannot */
        const double until = clock_now_s() + 2 * grace + 10;
        while (clock_now_s() < until && !atomic_load(&g_quit))
            clock_sleep_s(POLL_S);
        if (atomic_load(&g_quit))
            return;
        log_error("watchdog", "the lead did not end the job within %.0f s: rank %d ends it", 2 * grace + 10, g_o.rank);
    }
    char kept[2300];
    if (ckpt >= 0)
        snprintf(kept, sizeof kept,
                 "the newest checkpoint already written is step %lld in %s (the steps after it are "
                 "lost; a relaunch resumes from it)",
                 (long long)ckpt, ckpt_dir);
    else
        snprintf(kept, sizeof kept, "no checkpoint was written in this run (a relaunch starts over)");
    log_error("watchdog", KEY_trainer_hang_action " stop: ending the job, exit status %d: %s; %s", WATCHDOG_EXIT,
              verdict[0] ? verdict : "no step completed", kept);
    if (g_o.on_stop) {
        char why[HANG_TEXT_MAX + 200];
        snprintf(why, sizeof why, "watchdog: no step completed for %.0f s (" KEY_trainer_hang_timeout_s "): %s", idle,
                 verdict[0] ? verdict : "see the ranks' logs and RUN_DIR/flight");
        g_o.on_stop(g_o.on_stop_ud, why);
    }
    if (g_o.end_job)
        g_o.end_job(WATCHDOG_EXIT);
    _exit(WATCHDOG_EXIT);
}

static void *watch(void *arg)
{
    (void)arg;
    double progress = clock_now_s(), seen_step_at = 0;
    bool fired = false;
    while (!atomic_load(&g_quit)) {
        clock_sleep_s(POLL_S);
        const double now = clock_now_s();
        if (g_o.held && g_o.held(g_o.held_ud)) { /* paused on purpose: no step is due */
            progress = now;
            fired = false;
            continue;
        }
        pthread_mutex_lock(&g_mu);
        const double at = g_last_step_at;
        const double limit = watchdog_timeout_for(g_o.timeout_s, g_intervals, g_nintervals);
        pthread_mutex_unlock(&g_mu);
        if (at > seen_step_at) {
            seen_step_at = at;
            progress = at > progress ? at : progress;
            fired = false;
        }
        if (!fired && now - progress >= limit && !atomic_load(&g_quit)) {
            fired = true;
            fire(now - progress, limit);
        }
    }
    return NULL;
}

int watchdog_start(const struct watchdog_options *o)
{
    if (o->timeout_s == 0 || g_started)
        return 0;
    g_o = *o;
    snprintf(g_dump_dir, sizeof g_dump_dir, "%s", o->dump_dir ? o->dump_dir : "");
    g_o.dump_dir = g_dump_dir;
    atomic_store(&g_lead, o->rank == 0);
    atomic_store(&g_quit, false);
    const int rc = pthread_create(&g_thread, NULL, watch, NULL);
    if (rc != 0) {
        log_warn("watchdog", "cannot start the progress watchdog: %s", strerror(rc));
        return -1;
    }
    g_started = true;
    if (o->timeout_s > 0)
        log_info("watchdog", "on: no step completed for %.0f s ends in a dump%s", o->timeout_s,
                 o->stop ? " and the job's end" : "");
    else
        log_info("watchdog",
                 "on: no step completed for max(%.0f s, %.0fx the median step) (%.0f s before the first "
                 "step) ends in a dump%s",
                 AUTO_FLOOR_S, AUTO_FACTOR, AUTO_FIRST_S, o->stop ? " and the job's end" : "");
    return 0;
}

void watchdog_set_lead(void) { atomic_store(&g_lead, true); }

void watchdog_stop(void)
{
    if (!g_started)
        return;
    atomic_store(&g_quit, true);
    pthread_join(g_thread, NULL);
    g_started = false;
}

/* ---- test only ---- */

static int g_block_point = -1, g_block_rank = -1, g_rank = -1;
static int64_t g_block_step;

void watchdog_test_setup(const char *at, int block_rank, int64_t block_step, int rank)
{
    static const char *const names[] = {"register",   "update_actor",     "checkpoint_write",
                                        "dp_barrier", "trainers_barrier", "in_dp_collective"};
    g_block_point = -1;
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (at && strcmp(at, names[i]) == 0)
            g_block_point = i;
    g_block_rank = block_rank;
    g_block_step = block_step;
    g_rank = rank;
}

void watchdog_test_point(enum watchdog_point p, int64_t step)
{
    if ((int)p != g_block_point || g_rank != g_block_rank || (p != WATCHDOG_AT_REGISTER && step != g_block_step))
        return;
    log_warn("watchdog", KEY_test_block_at ": rank %d blocks here for ever (step %lld): a hang made on purpose", g_rank,
             (long long)step);
    for (;;)
        clock_sleep_s(3600);
}

bool watchdog_test_here(enum watchdog_point p, int64_t step, const char *what)
{
    if ((int)p != g_block_point || g_rank != g_block_rank || step != g_block_step)
        return false;
    log_warn("watchdog", KEY_test_block_at ": rank %d %s (step %lld): a hang made on purpose", g_rank, what,
             (long long)step);
    return true;
}
