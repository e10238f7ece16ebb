/* Registry of workers, run state machine, request handling. See core.h. */
#include "core.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "arena.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/placement.h"
#include "validate.h"
#include "proto/ctl_auth.h"
#include "proto/plane_auth.h"
#include "proto/transport.h"

/* ---- small helpers ---- */

static uint64_t next_random(struct core *c)
{
    /* xorshift64*, seeded from getrandom(): tokens need to differ, not to be secret */
    c->rng ^= c->rng >> 12;
    c->rng ^= c->rng << 25;
    c->rng ^= c->rng >> 27;
    return c->rng * 2685821657736338717ull;
}

static bool run_terminal(Grpo__RunState s)
{
    return s == GRPO__RUN_STATE__RUN_FINISHED || s == GRPO__RUN_STATE__RUN_FAILED;
}

/* A worker that has left on its own (it needs no heartbeat any more). */
static bool worker_ended(Grpo__WorkerState s)
{
    return s == GRPO__WORKER_STATE__WORKER_STOPPED || s == GRPO__WORKER_STATE__WORKER_FINISHED ||
           s == GRPO__WORKER_STATE__WORKER_FAILED;
}

static bool worker_watched(Grpo__WorkerState s) { return !worker_ended(s) && s != GRPO__WORKER_STATE__WORKER_LOST; }

/* Whether losing this rank (failed, or silent) leaves other ranks waiting in a collective without it, so that the
 * job cannot go on: a trainer of a split run or a colocated rank in a job of several. A rollout rank is replaceable
 * and a spare waits in no collective: nobody waits for either. */
static bool loss_ends_job(const struct core *c, const struct core_worker *w)
{
    return core_role_holds_state(w->role) && c->run.world > 1;
}

Grpo__WorkerState core_worker_shown_state(const struct core_worker *w)
{
    return w->suspect && worker_watched(w->state) ? GRPO__WORKER_STATE__WORKER_SUSPECT : w->state;
}

/* How long w has been silent in grpod's own running time: the pauses of grpod's loop since it was last heard from
 * (core.stalled_s) are not its silence. */
static double silence(const struct core *c, const struct core_worker *w, double now)
{
    double s = now - w->last_seen - (c->stalled_s - w->stall_seen);
    return s > 0 ? s : 0;
}

/* "6.2 s", or "6.2 s (4.0 s of it grpod itself did not run)": the silence as a clock on the wall saw it. */
static void silence_text(const struct core *c, const struct core_worker *w, double now, char *out, size_t len)
{
    double wall = now - w->last_seen, own = wall - silence(c, w, now);
    if (own >= 0.05)
        snprintf(out, len, "%.1f s (%.1f s of it grpod itself did not run)", wall, own);
    else
        snprintf(out, len, "%.1f s", wall);
}

/* Silence after which a worker is suspect: two heartbeat intervals (missed heartbeats; the trainers' dispatcher
 * grants a silent rollout process's work to the others after as long), never past the loss bound. */
static double suspect_after(const struct core *c)
{
    double s = 2 * c->set.heartbeat_interval_s;
    return s < c->set.heartbeat_timeout_s ? s : c->set.heartbeat_timeout_s;
}

/* A worker heard from (a heartbeat or a registration): its silence starts again. */
static void heard(struct core *c, struct core_worker *w, double now)
{
    w->last_seen = now;
    w->stall_seen = c->stalled_s;
    w->suspect = false;
}

static void vadd_event(struct core *c, bool urgent, const char *fmt, va_list ap)
{
    char text[CORE_REASON_MAX];
    vsnprintf(text, sizeof text, fmt, ap);
    core_add_event_record(c, clock_wall_s(), text);
    log_info("registry", "%s", text);
    if (c->on_event)
        c->on_event(c->event_ud, c->events[c->nevents - 1].time, text);
    c->dirty = true;
    c->dirty_urgent |= urgent;
}

/* An event a restart must know: journaled before the next reply goes out. */
static void add_event(struct core *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_event(struct core *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vadd_event(c, true, fmt, ap);
    va_end(ap);
}

/* An event that changes nothing a restart needs (a worker suspect, heard again; grpod's own pause): in events.log
 * at once, in the journal's ring at the next periodic write (no fsync on a loaded host for it). */
static void add_note(struct core *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_note(struct core *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vadd_event(c, false, fmt, ap);
    va_end(ap);
}

void core_add_event_record(struct core *c, double time, const char *text)
{
    if (c->nevents == CORE_EVENTS) {
        memmove(c->events, c->events + 1, (CORE_EVENTS - 1) * sizeof *c->events);
        c->nevents--;
    }
    if (c->events_new < CORE_EVENTS)
        c->events_new++;
    c->events[c->nevents].time = time;
    snprintf(c->events[c->nevents].text, sizeof c->events[c->nevents].text, "%s", text);
    c->nevents++;
}

static void set_state(struct core *c, Grpo__RunState s, const char *reason)
{
    if (c->run.state == s && strcmp(c->run.reason, reason) == 0)
        return;
    bool changed = c->run.state != s;
    c->run.state = s;
    snprintf(c->run.reason, sizeof c->run.reason, "%s", reason);
    c->dirty = true;
    if (changed) {
        if (reason[0])
            add_event(c, "run %s: %s", core_run_state_name(s), reason);
        else
            add_event(c, "run %s", core_run_state_name(s));
    }
}

/* grpod's own placement (all zero without keys: every rank hybrid, until a configuration says). */
static struct placement_spec own_place(const struct core *c) { return c->set.place; }

static void new_run(struct core *c)
{
    core_free_workers(c);
    free(c->run.config);
    memset(&c->run, 0, sizeof c->run);
    c->place = own_place(c);
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(c->run.id, sizeof c->run.id, "run-%s-%04x", stamp, (unsigned)(next_random(c) & 0xffff));
    c->run.state = GRPO__RUN_STATE__RUN_WAITING;
    snprintf(c->run.reason, sizeof c->run.reason, "no worker has registered yet");
    c->run.checkpoint_step = -1;
    c->run.started = clock_wall_s();
    plane_run_key_new(c->run.plane_key); /* a fresh data-plane key for each run, and for each launch of it */
    c->run.plane_epoch = 1;
    c->dirty = c->dirty_urgent = true;
}

int core_settings_place(struct core_settings *set, const struct grpo_config *cfg, char *why, size_t whylen)
{
    struct placement_spec ps;
    int rc = placement_spec_from_config(cfg, &ps, why, whylen);
    /* keys of the run grpod was given are checked against every rank; without them the first rank's
     * configuration defines the run */
    set->own_placement = placement_keys_given(cfg);
    set->place = ps;
    return rc;
}

void core_init(struct core *c, const struct core_settings *set, double now)
{
    memset(c, 0, sizeof *c);
    c->set = *set;
    c->record_rank = -1;
    const struct placement_spec *ps = &set->place;
    if (ps->trainer_ranks || ps->rollout_ranks || ps->tp_size > 1 || ps->pp_size > 1 || ps->cp_size > 1 ||
        ps->ep_size > 1 || ps->rollout_tp > 1)
        c->set.own_placement = true;
    if (c->set.place.tp_size < 1)
        c->set.place.tp_size = 1;
    if (c->set.place.pp_size < 1)
        c->set.place.pp_size = 1;
    if (getrandom(&c->rng, sizeof c->rng, GRND_NONBLOCK) != (ssize_t)sizeof c->rng)
        c->rng = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull;
    c->rng |= 1;
    c->start_mono = now;
    c->start_wall = clock_wall_s();
    new_run(c);
}

void core_free_workers(struct core *c)
{
    for (int r = 0; r < c->nworkers; r++)
        if (c->workers[r]) {
            core_worker_release(c->workers[r]);
            free(c->workers[r]);
        }
    free(c->workers);
    c->workers = NULL;
    if (c->rank_hosts)
        for (int r = 0; r < c->nworkers; r++)
            free(c->rank_hosts[r]);
    free(c->rank_hosts);
    c->rank_hosts = NULL;
    c->nworkers = 0;
}

void core_deinit(struct core *c)
{
    core_free_workers(c);
    free(c->run.config);
    c->run.config = NULL;
    ctl_server_free(c->ctl);
    c->ctl = NULL;
}

/* A configuration text read into a configuration (config_init'ed here; the caller frees it). 0, or -1 with why. */
static int read_config(const char *text, const char *origin, struct grpo_config *cfg, char *why, size_t whylen)
{
    config_init(cfg);
    return config_apply_run_text(cfg, text, CORE_CONFIG_MAX, origin, why, whylen);
}

int core_set_run_config(struct core *c, const char *text, char *why, size_t whylen)
{
    struct grpo_config cfg;
    struct placement_spec spec = c->place;
    int rc = read_config(text, "the run's configuration", &cfg, why, whylen);
    if (rc == 0 && !c->set.own_placement)
        rc = placement_spec_from_config(&cfg, &spec, why, whylen);
    config_free(&cfg);
    if (rc != 0)
        return -1;
    c->place = spec;
    free(c->run.config);
    c->run.config = xstrdup(text);
    c->dirty = c->dirty_urgent = true;
    return 0;
}

void core_set_event_hook(struct core *c, core_event_fn fn, void *ud)
{
    c->on_event = fn;
    c->event_ud = ud;
}

/* ---- run state from the workers' states ---- */

static int placement_world(const struct placement_spec *s) { return s->rollout_ranks + s->trainer_ranks; }

/* Value of a metric from the lowest rank that reports it; NAN when none does. */
static double run_metric(const struct core *c, const char *name)
{
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        if (!w)
            continue;
        for (int i = 0; i < w->nmetrics; i++)
            if (strcmp(w->metrics[i].name, name) == 0)
                return w->metrics[i].value;
    }
    return NAN;
}

static void update_checkpoints(struct core *c)
{
    uint64_t done = UINT64_MAX;
    int64_t step = INT64_MAX;
    int n = 0;
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        /* rollout ranks hold nothing a checkpoint keeps: the trainers' checkpoints are the run's (a waiting spare's
         * neither, nor an idle rank's) */
        if (!w || w->state == GRPO__WORKER_STATE__WORKER_LOST || !core_role_holds_state(w->role))
            continue;
        n++;
        done = w->checkpoint_seq_done < done ? w->checkpoint_seq_done : done;
        step = w->checkpoint_step < step ? w->checkpoint_step : step;
    }
    if (!n)
        return;
    if (step != c->run.checkpoint_step && step >= 0) {
        c->run.checkpoint_step = step;
        c->dirty = true;
    }
    if (done > c->run.checkpoint_seq_done && done <= c->run.checkpoint_seq) {
        c->run.checkpoint_seq_done = done;
        add_event(c,
                  "checkpoint request %" PRIu64 " written by every worker (newest common checkpoint: step %" PRId64 ")",
                  done, c->run.checkpoint_step);
    }
}

static void reevaluate(struct core *c)
{
    c->evaluations++;
    update_checkpoints(c);
    if (run_terminal(c->run.state))
        return;
    char reason[CORE_REASON_MAX];
    int present = 0, ended = 0, finished = 0, paused = 0, rollouts = 0, rollouts_lost = 0;
    int trainers = 0, trainers_finished = 0; /* trainer and colocated (hybrid) ranks: the ones that train */
    const struct core_worker *lost = NULL, *failed = NULL, *lost_rollout = NULL;
    char survived[CORE_REASON_MAX / 2] = ""; /* the ranks the others went on without, and why */
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        if (!w)
            continue;
        present++;
        if (w->state == GRPO__WORKER_STATE__WORKER_FAILED && !failed)
            failed = w;
        /* a lost rollout rank holds nothing up: the trainers grant its work units to the other rollout ranks */
        bool spare = w->state == GRPO__WORKER_STATE__WORKER_LOST && w->role == GRPO__ROLE__ROLE_ROLLOUT;
        if (spare && !lost_rollout)
            lost_rollout = w;
        rollouts += w->role == GRPO__ROLE__ROLE_ROLLOUT;
        rollouts_lost += spare;
        /* a trainer the others went on without (trainer.survive_trainer_loss) holds nothing up either, nor does a
         * spare (trainer.survive_spare_ranks) that waits or is lost, or a rank that left its model copy: it is in
         * no collective of a step */
        const bool idle_spare = w->role == GRPO__ROLE__ROLE_SPARE || w->role == GRPO__ROLE__ROLE_IDLE;
        const bool gone = (w->state == GRPO__WORKER_STATE__WORKER_LOST && w->survived) ||
                          (idle_spare && w->state == GRPO__WORKER_STATE__WORKER_LOST);
        if (gone) {
            size_t n = strlen(survived);
            snprintf(survived + n, sizeof survived - n, "%s%srank %d on host %.40s lost (%.60s)", n ? "; " : "",
                     w->role == GRPO__ROLE__ROLE_SPARE  ? "spare "
                     : w->role == GRPO__ROLE__ROLE_IDLE ? "idle "
                                                        : "",
                     w->rank, w->host, w->error[0] ? w->error : "no heartbeat");
        }
        spare |= gone;
        const bool trains = !gone && (w->role == GRPO__ROLE__ROLE_TRAINER || w->role == GRPO__ROLE__ROLE_HYBRID);
        trainers += trains;
        trainers_finished += trains && w->state == GRPO__WORKER_STATE__WORKER_FINISHED;
        if (w->state == GRPO__WORKER_STATE__WORKER_LOST && !spare && !lost)
            lost = w;
        ended += worker_ended(w->state) || w->state == GRPO__WORKER_STATE__WORKER_LOST;
        finished += w->state == GRPO__WORKER_STATE__WORKER_FINISHED || spare;
        paused += w->state == GRPO__WORKER_STATE__WORKER_PAUSED || worker_ended(w->state) || spare || idle_spare;
    }
    if (failed) {
        snprintf(reason, sizeof reason, "rank %d on host %.100s failed: %.300s", failed->rank, failed->host,
                 failed->error[0] ? failed->error : "no reason given");
        set_state(c, GRPO__RUN_STATE__RUN_FAILED, reason);
        return;
    }
    if (c->run.stop) {
        if (ended == present) {
            /* who asked: grpoctl (its --reason, else "operator"), or a worker's SIGTERM and where it came from
             * (its launcher ending the job is no operator's doing) */
            const char *by = c->run.stop_by[0] ? c->run.stop_by : "operator";
            if (c->run.checkpoint_step >= 0)
                snprintf(reason, sizeof reason,
                         "stopped by %.300s at step %" PRId64 " (checkpoint at step %" PRId64 ")", by, c->run.step,
                         c->run.checkpoint_step);
            else
                snprintf(reason, sizeof reason, "stopped by %.300s at step %" PRId64, by, c->run.step);
            set_state(c, GRPO__RUN_STATE__RUN_FINISHED, reason);
        } else {
            snprintf(reason, sizeof reason, "stopping: %d of %d workers done", ended, present);
            set_state(c, GRPO__RUN_STATE__RUN_STOPPING, reason);
        }
        return;
    }
    /* every rank finished; or every rank that trains did, which is the end of training: a rollout rank still on
     * its way out (it missed the trainers' last word, stalled as they closed) hears the run is over from here */
    if (c->run.world > 0 && present == c->run.world &&
        (finished == present || (trainers > 0 && trainers_finished == trainers))) {
        snprintf(reason, sizeof reason, "training finished at step %" PRId64, c->run.step);
        set_state(c, GRPO__RUN_STATE__RUN_FINISHED, reason);
        return;
    }
    if (c->run.world == 0 || present < c->run.world) {
        if (c->run.world == 0)
            snprintf(reason, sizeof reason, "no worker has registered yet");
        else
            snprintf(reason, sizeof reason, "%d of %d workers registered", present, c->run.world);
        set_state(c, GRPO__RUN_STATE__RUN_WAITING, reason);
        return;
    }
    if (lost) {
        if (c->run.abort[0] && c->run.checkpoint_step >= 0)
            snprintf(reason, sizeof reason, "%.400s; relaunch the job: it resumes from checkpoint step %" PRId64,
                     c->run.abort, c->run.checkpoint_step);
        else if (c->run.abort[0])
            snprintf(reason, sizeof reason, "%.400s; relaunch the job: it starts over (no checkpoint yet)",
                     c->run.abort);
        else
            snprintf(reason, sizeof reason,
                     "rank %d on host %s lost (no heartbeat for %.1f s); waiting for it to register again", lost->rank,
                     lost->host, c->set.heartbeat_timeout_s);
        set_state(c, GRPO__RUN_STATE__RUN_WAITING, reason);
        return;
    }
    if (c->run.pause) {
        if (paused == present && lost_rollout) { /* the operator sees the loss while the run is held too */
            snprintf(reason, sizeof reason,
                     "paused by operator; rollout rank %d on host %s lost: its work goes to the other rollout ranks "
                     "(relaunch it with grpo-worker --replace-rank %d)",
                     lost_rollout->rank, lost_rollout->host, lost_rollout->rank);
            set_state(c, GRPO__RUN_STATE__RUN_PAUSED, reason);
        } else if (paused == present)
            set_state(c, GRPO__RUN_STATE__RUN_PAUSED, "paused by operator");
        else {
            snprintf(reason, sizeof reason, "pausing: %d of %d workers at a safe point", paused, present);
            if (c->run.state != GRPO__RUN_STATE__RUN_PAUSING || c->run.pause_asked == 0)
                c->run.pause_asked = clock_wall_s(); /* how long the pause waits (grpoctl diagnose: hang_pause) */
            set_state(c, GRPO__RUN_STATE__RUN_PAUSING, reason);
        }
        return;
    }
    if (lost_rollout && rollouts_lost == rollouts) { /* nobody generates: the trainers wait for the data */
        char ranks[320] = "";
        for (int r = 0; r < c->nworkers; r++) {
            const struct core_worker *w = c->workers[r];
            size_t n = strlen(ranks);
            if (w && w->role == GRPO__ROLE__ROLE_ROLLOUT && n + 64 < sizeof ranks)
                snprintf(ranks + n, sizeof ranks - n, "%s%d on host %.40s", n ? ", " : "", w->rank, w->host);
        }
        snprintf(reason, sizeof reason,
                 "every rollout rank is lost (rank %s): no rollout rank is left, and the run waits for replacements "
                 "(relaunch each with grpo-worker --replace-rank R)",
                 ranks);
        set_state(c, GRPO__RUN_STATE__RUN_RUNNING, reason);
        return;
    }
    if (lost_rollout) {
        snprintf(reason, sizeof reason,
                 "rollout rank %d on host %s lost; its work goes to the other rollout ranks (relaunch it with "
                 "grpo-worker --replace-rank %d)",
                 lost_rollout->rank, lost_rollout->host, lost_rollout->rank);
        set_state(c, GRPO__RUN_STATE__RUN_RUNNING, reason);
        return;
    }
    if (survived[0]) {
        snprintf(reason, sizeof reason, "%s; the run goes on without it", survived);
        set_state(c, GRPO__RUN_STATE__RUN_RUNNING, reason);
        return;
    }
    set_state(c, GRPO__RUN_STATE__RUN_RUNNING, "");
}

/* ---- replies ---- */

static uint8_t *pack_reply(uint64_t id, bool ok, const char *error, const char *message, bool retry, size_t *len)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Reply reply = GRPO__REPLY__INIT;
    reply.ok = ok;
    reply.error = (char *)(error ? error : "");
    reply.message = (char *)(message ? message : "");
    reply.retry = retry;
    env.request_id = id;
    env.body_case = GRPO__ENVELOPE__BODY_REPLY;
    env.reply = &reply;
    return CHECK_ALLOC(protocol_pack(&env, len));
}

static uint8_t *refuse(struct core *c, uint64_t id, bool retry, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static uint8_t *refuse(struct core *c, uint64_t id, bool retry, size_t *len, const char *fmt, ...)
{
    char text[2 * CORE_REASON_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    c->counters.refused++;
    log_warn("registry", "refused: %s", text);
    return pack_reply(id, false, text, NULL, retry, len);
}

/* ---- registration ---- */

/* Role and coordinates of a rank (common/placement.c, shared with grpo-worker); -1 with why when the layout
 * does not fit. */
static int place_rank(const struct placement_spec *spec, int rank, int world, struct placement *p, Grpo__Role *role,
                      char *why, size_t whylen)
{
    if (placement_of(spec, rank, world, p, why, whylen) != 0)
        return -1;
    *role = p->role == PLACE_TRAINER   ? GRPO__ROLE__ROLE_TRAINER
            : p->role == PLACE_ROLLOUT ? GRPO__ROLE__ROLE_ROLLOUT
                                       : GRPO__ROLE__ROLE_HYBRID;
    return 0;
}

static bool has_capability(const Grpo__Register *r, const char *cap)
{
    if (r->n_capabilities == 0)
        return true; /* a worker that lists none can do anything asked */
    for (size_t i = 0; i < r->n_capabilities; i++)
        if (strcmp(r->capabilities[i], cap) == 0 || strcmp(r->capabilities[i], "hybrid") == 0)
            return true;
    return false;
}

/* The data-plane base: grpod.data_endpoint; without it ipc:///tmp/grpo-RUNID when every rank is on one host,
 * tcp:// on a port (a port chosen from the run id) when the run spans hosts. */
static void data_base(const struct core *c, char *out, size_t len)
{
    placement_data_base(c->set.data_endpoint, c->run.across_hosts ? 2 : 1, c->run.id, out, len);
}

/* Endpoint of trainer DP rank dp: for binding (the trainer) or connecting (rollout, host given). */
static void data_endpoint(const struct core *c, int dp, const char *host, char *out, size_t len)
{
    char base[256];
    data_base(c, base, sizeof base);
    placement_data_endpoint(base, dp, host, out, len);
}

/* The ranks of a DP rank that share its sequences (Ulysses SP): 1 without. */
/* The trainers' DP size in layout s (placement_of's, as every worker computes it; 0 without trainer ranks). */
static int trainer_dps(const struct placement_spec *s)
{
    struct placement p;
    char why[256];
    if (s->trainer_ranks < 1 || placement_of(s, 0, s->trainer_ranks + s->rollout_ranks, &p, why, sizeof why) != 0)
        return 0;
    return p.dp_size;
}

/* The trainer that binds DP rank dp's data endpoint: its TP, PP and SP/CP rank 0 (the worker's own rule). */
static const struct core_worker *trainer_head(const struct core *c, int dp)
{
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        struct placement p;
        char why[256];
        if (w && w->role == GRPO__ROLE__ROLE_TRAINER && w->dp_rank == dp && w->tp_rank == 0 && w->pp_rank == 0 &&
            placement_of(&c->place, w->rank, c->place.trainer_ranks + c->place.rollout_ranks, &p, why, sizeof why) ==
                0 &&
            p.cp == 0)
            return w;
    }
    return NULL;
}

static uint8_t *reply_assignment(struct core *c, uint64_t id, const struct core_worker *w, size_t *len)
{
    struct arena a = {0};
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Assignment *as = arena_alloc(&a, sizeof *as);
    grpo__assignment__init(as);
    as->role = w->role;
    as->dp_rank = w->dp_rank;
    as->dp_size = w->dp_size;
    as->tp_rank = w->tp_rank;
    as->tp_size = w->tp_size;
    as->pp_rank = w->pp_rank;
    as->pp_size = w->pp_size;
    as->config_digest = c->run.config_digest;
    as->run_id = arena_strdup(&a, c->run.id);
    as->resume_step = c->run.checkpoint_step;
    as->incarnation = w->incarnation;
    as->heartbeat_interval_s = c->set.heartbeat_interval_s;
    as->world_size = c->run.world;
    as->checkpoint_seq = c->run.checkpoint_seq;
    /* the process's data-plane key, for its identity (rank, the pid it registered with, this incarnation); the run
     * key to the trainers, which check every process's messages with it */
    const struct plane_id pid_ = {
        .rank = w->rank, .pid = (uint32_t)w->pid, .incarnation = w->incarnation, .epoch = c->run.plane_epoch};
    as->plane_epoch = c->run.plane_epoch;
    uint8_t *pk = arena_alloc(&a, PLANE_KEY_BYTES);
    plane_key_derive(c->run.plane_key, &pid_, pk);
    as->plane_key.data = pk;
    as->plane_key.len = PLANE_KEY_BYTES;
    if (w->role == GRPO__ROLE__ROLE_TRAINER) {
        as->plane_run_key.data = arena_alloc(&a, PLANE_KEY_BYTES);
        memcpy(as->plane_run_key.data, c->run.plane_key, PLANE_KEY_BYTES);
        as->plane_run_key.len = PLANE_KEY_BYTES;
    }
    char ep[300];
    if (w->role == GRPO__ROLE__ROLE_TRAINER && w->tp_rank == 0 && w->pp_rank == 0) {
        data_endpoint(c, w->dp_rank, NULL, ep, sizeof ep);
        as->data_pull_endpoint = arena_strdup(&a, ep);
        if (w->dp_rank == 0 && c->place.trainer_ranks > 0) { /* the dispatcher binds here */
            char base[256];
            data_base(c, base, sizeof base);
            placement_dispatch_endpoint(base, trainer_dps(&c->place), NULL, ep, sizeof ep);
            as->dispatch_endpoint = arena_strdup(&a, ep);
        }
    }
    if (w->role == GRPO__ROLE__ROLE_ROLLOUT && c->place.trainer_ranks > 0) {
        int dps = trainer_dps(&c->place);
        as->n_trainer_endpoints = (size_t)dps;
        as->trainer_endpoints = arena_alloc(&a, (size_t)dps * sizeof(char *));
        for (int d = 0; d < dps; d++) {
            const struct core_worker *t = trainer_head(c, d);
            data_endpoint(c, d, t ? t->host : NULL, ep, sizeof ep);
            as->trainer_endpoints[d] = arena_strdup(&a, ep);
        }
        as->data_push_endpoint = dps > 0 ? as->trainer_endpoints[w->dp_rank % dps] : ""; /* dps >= 1: placed */
        char base[256];
        data_base(c, base, sizeof base);
        const struct core_worker *head = trainer_head(c, 0);
        placement_dispatch_endpoint(base, dps, head ? head->host : NULL, ep, sizeof ep);
        as->dispatch_endpoint = arena_strdup(&a, ep);
    }
    env.request_id = id;
    env.body_case = GRPO__ENVELOPE__BODY_ASSIGNMENT;
    env.assignment = as;
    uint8_t *out = CHECK_ALLOC(protocol_pack(&env, len));
    arena_free(&a);
    return out;
}

/* A rollout rank on tcp needs every trainer head's host: those that have not registered yet. */
static int missing_trainer_heads(const struct core *c, const struct placement_spec *s)
{
    char base[256];
    data_base(c, base, sizeof base);
    if (strncmp(base, "tcp://", 6) != 0 || s->trainer_ranks == 0)
        return 0;
    int dps = trainer_dps(s), missing = 0;
    for (int d = 0; d < dps; d++)
        missing += trainer_head(c, d) == NULL;
    return missing;
}

/* How many keys to name in a refusal before "and N more". */
#define CONFIG_DIFF_SHOWN 3

/* A rank's configuration text (Register.run_config) checked: it reads, it gives the rank's digest, it has grpod's
 * own keys and placement, and it is the run's (when the run has one). present: ranks registered in the run;
 * the first one's text lays the run out (*spec) when grpod has no placement of its own. 0, or -1 with why. */
static int check_rank_config(const struct core *c, const Grpo__Register *r, int present, struct placement_spec *spec,
                             int *spares, char *why, size_t whylen)
{
    char who[48], diff[2 * CORE_REASON_MAX], err[CORE_REASON_MAX];
    snprintf(who, sizeof who, "rank %d", r->rank);
    struct grpo_config cfg;
    struct placement_spec rs;
    int rc = -1;
    if (read_config(r->run_config, "Register.run_config", &cfg, err, sizeof err) != 0) {
        snprintf(why, whylen, "rank %d's configuration cannot be read: %s", r->rank, err);
        goto out;
    }
    uint64_t digest = config_digest(&cfg);
    digest = digest ? digest : 1; /* control_config_digest's: 0 means "not checked" */
    if (r->config_digest && r->config_digest != digest) {
        snprintf(why, whylen,
                 "rank %d's configuration text does not give its digest (%016" PRIx64 ", the text's %016" PRIx64
                 "): a damaged message, or grpo-worker and grpod disagree on the keys (upgrade the older side)",
                 r->rank, r->config_digest, digest);
        goto out;
    }
    if (c->set.own_config && c->set.own_config[0]) {
        int n = config_text_diff(c->set.own_config, "grpod", r->run_config, who, true, CONFIG_DIFF_SHOWN, diff,
                                 sizeof diff);
        if (n) {
            snprintf(why, whylen,
                     "rank %d's configuration differs from grpod's own keys in %d key(s): %.700s; give grpod the job's "
                     "keys or none (the first rank's configuration then defines the run)",
                     r->rank, n, diff);
            goto out;
        }
    }
    if (placement_spec_from_config(&cfg, &rs, err, sizeof err) != 0) {
        snprintf(why, whylen, "rank %d's configuration: %s", r->rank, err);
        goto out;
    }
    /* trainer.survive_spare_ranks: the job's last ranks wait outside the layout (ROLE_SPARE) */
    *spares = cfg.trainer_survive_trainer_loss ? (int)cfg.trainer_survive_spare_ranks : 0;
    /* a rank that gives no rank counts takes grpod's (a grpo-worker checks its assignment against its own) */
    if (c->set.own_placement && (rs.trainer_ranks || rs.rollout_ranks) && !placement_spec_same(&rs, spec)) {
        char theirs[160], ours[160];
        placement_spec_describe(&rs, theirs, sizeof theirs);
        placement_spec_describe(spec, ours, sizeof ours);
        snprintf(why, whylen,
                 "rank %d's configuration places %s, grpod's keys %s: give grpod the job's placement keys or none",
                 r->rank, theirs, ours);
        goto out;
    }
    if (c->run.config) {
        int n = config_text_diff(c->run.config, "run", r->run_config, who, false, CONFIG_DIFF_SHOWN, diff, sizeof diff);
        if (n) {
            snprintf(
                why, whylen,
                "rank %d's configuration differs from run %s's (its first rank's) in %d key(s): %.700s; give every "
                "rank the same configuration",
                r->rank, c->run.id, n, diff);
            goto out;
        }
    } else if (c->run.config_digest && digest != c->run.config_digest) {
        snprintf(why, whylen,
                 "rank %d's configuration differs from the run's (digest %016" PRIx64 ", run %016" PRIx64
                 "): give every rank the same configuration",
                 r->rank, digest, c->run.config_digest);
        goto out;
    }
    if (!c->set.own_placement && !present && !c->run.config)
        *spec = rs;
    rc = 0;
out:
    config_free(&cfg);
    return rc;
}

/* The first registration of a launch grpod has not seen (Register.launch): the launch before it is retired, and
 * this one gets a fresh data-plane key and the next key epoch, so that no key or message of an earlier launch is
 * taken (a run's first launch keeps the run's fresh key). A replacement (--replace-rank) joins the launch under way. */
static void new_launch(struct core *c, const Grpo__Register *r)
{
    if (c->run.launch) {
        if (c->run.nretired == CORE_RETIRED) {
            memmove(c->run.retired, c->run.retired + 1, (CORE_RETIRED - 1) * sizeof c->run.retired[0]);
            c->run.nretired--;
        }
        c->run.retired[c->run.nretired++] = c->run.launch;
        plane_run_key_new(c->run.plane_key);
        c->run.plane_epoch++;
        add_event(c,
                  "a new launch of run %s (rank %d on host %s first): a fresh data-plane key, epoch %" PRIu64
                  " (the keys of the launch before are dead)",
                  c->run.id, r->rank, r->host, c->run.plane_epoch);
    }
    c->run.launch = r->launch;
    c->dirty = c->dirty_urgent = true;
}

static uint8_t *handle_register(struct core *c, const Grpo__Envelope *env, double now, size_t *len)
{
    const Grpo__Register *r = env->register_;
    uint64_t id = env->request_id;
    /* whether this registration changes more of the run than its journal record holds (core_save_record): a new
     * run or launch, the run's configuration, its world: then the whole state is journaled before the answer */
    bool whole = c->dirty_urgent || c->run.world == 0 || c->run.abort[0];
    if (r->replaces) { /* only a lost rank of the running run can be replaced */
        const struct core_worker *old = r->rank >= 0 && r->rank < c->nworkers ? c->workers[r->rank] : NULL;
        if (run_terminal(c->run.state) || !c->nworkers)
            return refuse(c, id, false, len, "rank %d cannot be replaced: run %s is %s", r->rank, c->run.id,
                          c->nworkers ? core_run_state_name(c->run.state) : "not under way");
        if (!old)
            return refuse(c, id, false, len, "rank %d cannot be replaced: it never registered in run %s", r->rank,
                          c->run.id);
        if (old->role != GRPO__ROLE__ROLE_ROLLOUT)
            return refuse(c, id, false, len,
                          "rank %d is a %s: only a rollout rank can be replaced while the run goes on", r->rank,
                          core_role_name(old->role));
        if (worker_ended(old->state))
            return refuse(c, id, false, len, "rank %d has %s: nothing to replace", r->rank,
                          core_worker_state_name(old->state));
        if (old->state != GRPO__WORKER_STATE__WORKER_LOST)
            return refuse(c, id, true, len, "rank %d is not lost (pid %d on host %s, %s): nothing to replace yet",
                          r->rank, old->pid, old->host, core_worker_state_name(core_worker_shown_state(old)));
    }
    if (r->launch && !r->replaces && !run_terminal(c->run.state))
        for (int i = 0; i < c->run.nretired; i++)
            if (c->run.retired[i] == r->launch)
                return refuse(c, id, false, len,
                              "rank %d belongs to launch %016" PRIx64 " of run %s, which a later launch has replaced: "
                              "its data-plane keys are dead",
                              r->rank, r->launch, c->run.id);
    if (run_terminal(c->run.state)) {
        if (r->run_id[0] && strcmp(r->run_id, c->run.id) == 0)
            return refuse(c, id, false, len, "run %s is over (%s: %s)", c->run.id, core_run_state_name(c->run.state),
                          c->run.reason);
        new_run(c);
        whole = true;
        add_event(c, "new run %s, begun by rank %d on host %s", c->run.id, r->rank, r->host);
    }
    int present = 0;
    for (int i = 0; i < c->nworkers; i++)
        present += (c->workers[i] != NULL);
    if (r->run_id[0] && strcmp(r->run_id, c->run.id) != 0) {
        if (present || c->run.state != GRPO__RUN_STATE__RUN_WAITING)
            return refuse(c, id, false, len, "rank %d belongs to run %s, but grpod runs %s", r->rank, r->run_id,
                          c->run.id);
        /* grpod lost its journal (a new state directory): the workers' run carries on under its name */
        snprintf(c->run.id, sizeof c->run.id, "%s", r->run_id);
        whole = true;
        add_event(c, "adopting run %s from re-registering rank %d on host %s", r->run_id, r->rank, r->host);
    }
    struct placement_spec spec = c->place;
    char why[2 * CORE_REASON_MAX];
    int spares = 0;
    if (r->run_config[0] && check_rank_config(c, r, present, &spec, &spares, why, sizeof why) != 0)
        return refuse(c, id, false, len, "%s", why);
    const int laid = placement_world(&spec), pw = laid > 0 ? laid + spares : 0;
    if (pw > 0 && r->world_size != pw)
        return refuse(c, id, false, len,
                      "rank %d says the world has %d ranks, but the placement has %d (%d trainer + %d rollout ranks%s)",
                      r->rank, r->world_size, pw, spec.trainer_ranks, spec.rollout_ranks,
                      spares ? " + the spares of trainer.survive_spare_ranks" : "");
    if (c->run.world > 0 && r->world_size != c->run.world)
        return refuse(c, id, false, len, "rank %d says the world has %d ranks, but run %s has %d", r->rank,
                      r->world_size, c->run.id, c->run.world);
    if (c->run.config_digest && r->config_digest && r->config_digest != c->run.config_digest)
        return refuse(c, id, false, len,
                      "rank %d's configuration differs from the run's (digest %016" PRIx64 ", run %016" PRIx64
                      "): give every rank the same configuration",
                      r->rank, r->config_digest, c->run.config_digest);
    struct placement p;
    Grpo__Role role;
    const int layout_world = laid > 0 ? laid : r->world_size - spares; /* the ranks that are not spares */
    if (spares > 0 && r->rank >= layout_world) { /* a spare: in no group until it takes a lost trainer's place */
        p = (struct placement){.role = PLACE_HYBRID, .dp_size = 1, .tp_size = 1, .pp_size = 1};
        role = GRPO__ROLE__ROLE_SPARE;
    } else if (place_rank(&spec, r->rank, layout_world, &p, &role, why, sizeof why) != 0)
        return refuse(c, id, false, len, "%s", why);
    const char *need = role == GRPO__ROLE__ROLE_ROLLOUT ? "rollout" : "trainer";
    if (!has_capability(r, need) ||
        ((role == GRPO__ROLE__ROLE_HYBRID || role == GRPO__ROLE__ROLE_SPARE) && !has_capability(r, "rollout")))
        return refuse(c, id, false, len, "rank %d on host %s cannot take the %s role (capabilities lack '%s')", r->rank,
                      r->host, core_role_name(role),
                      role == GRPO__ROLE__ROLE_HYBRID && has_capability(r, "trainer") ? "rollout" : need);
    if (r->world_hosts > 1 && !c->run.across_hosts) {
        c->run.across_hosts = true;
        whole = true;
        if (!(c->set.data_endpoint && c->set.data_endpoint[0]))
            add_event(c, "the run spans %d hosts (rank %d's world): its data plane goes over TCP", r->world_hosts,
                      r->rank);
    }
    if (role == GRPO__ROLE__ROLE_ROLLOUT && missing_trainer_heads(c, &spec) > 0)
        return refuse(c, id, true, len, "rank %d waits for the trainer ranks to register (%d data-plane hosts unknown)",
                      r->rank, missing_trainer_heads(c, &spec));
    if (c->run.world == 0) {
        c->run.world = r->world_size;
        c->workers = xcalloc((size_t)c->run.world, sizeof(struct core_worker *));
        c->nworkers = c->run.world;
    }
    if (!c->rank_hosts && r->n_world_host_names == (size_t)c->nworkers) { /* the hosts of ranks not heard from */
        c->rank_hosts = xcalloc((size_t)c->nworkers, sizeof *c->rank_hosts);
        for (int k = 0; k < c->nworkers; k++)
            c->rank_hosts[k] = xstrdup(r->world_host_names[k]);
    }
    struct core_worker *w = c->workers[r->rank];
    bool same = w && r->incarnation && r->incarnation == w->incarnation;
    /* the same process asking again before its first heartbeat: its wait for the answer ran out while grpod was
     * busy (a launch of 10,000 ranks). It gets the registration it has, again: a new one each time made work for
     * grpod that nobody heard, and under 10,000 ranks no registration got through (docs/scaling.md) */
    if (w && !r->incarnation && !r->replaces && w->state == GRPO__WORKER_STATE__WORKER_STARTING && w->pid == r->pid &&
        strcmp(w->host, r->host) == 0 && (!r->launch || r->launch == c->run.launch)) {
        c->counters.registrations_repeated++;
        return reply_assignment(c, id, w, len);
    }
    if (w && !same && worker_watched(w->state) && w->state != GRPO__WORKER_STATE__WORKER_RECONNECTING &&
        silence(c, w, now) < 2.0 * c->set.heartbeat_interval_s + 0.5)
        return refuse(c, id, true, len, "rank %d is held by pid %d on host %s (heard from %.1f s ago)", r->rank, w->pid,
                      w->host, now - w->last_seen);
    if (!c->run.config_digest) {
        c->run.config_digest = r->config_digest;
        whole = true;
    }
    if (!present && !c->run.config && r->run_config[0]) { /* the first rank's configuration defines the run */
        whole = true;
        if (core_set_run_config(c, r->run_config, why, sizeof why) != 0) /* read once already: cannot fail */
            return refuse(c, id, false, len, "%s", why);
        if (!c->set.own_placement) {
            char lay[160];
            placement_spec_describe(&c->place, lay, sizeof lay);
            add_event(c, "run %s follows rank %d's configuration: %s", c->run.id, r->rank, lay);
        }
    }
    if (r->launch && !r->replaces && r->launch != c->run.launch) {
        new_launch(c, r);
        whole = true;
    }
    if (!w) /* one allocation per registered rank: a large world costs nothing until it shows up */
        w = c->workers[r->rank] = xcalloc(1, sizeof *w);
    if (!same) {
        /* the data-plane generation (proto/plane_auth.h): one after the rank's last registration, so that a
         * replacement is the later process at the dispatcher; a rank's first registration is generation 0 */
        const unsigned gen = w->incarnation ? plane_generation(w->incarnation) + 1 : 0;
        core_worker_release(w);
        memset(w, 0, sizeof *w);
        w->incarnation = plane_incarnation_of(gen, next_random(c)) | 1;
        w->checkpoint_seq_done = c->run.checkpoint_seq;
        w->checkpoint_step = -1;
        w->registered_at = clock_wall_s();
    }
    w->rank = r->rank;
    w->pid = r->pid;
    snprintf(w->host, sizeof w->host, "%s", r->host);
    w->ndevices = (int)r->n_devices;
    for (size_t i = 0; i < r->n_devices; i++)
        snprintf(w->devices[i], sizeof w->devices[i], "%s", r->devices[i]);
    w->capabilities[0] = 0;
    for (size_t i = 0; i < r->n_capabilities; i++) {
        size_t l = strlen(w->capabilities);
        snprintf(w->capabilities + l, sizeof w->capabilities - l, "%s%s", i ? "," : "", r->capabilities[i]);
    }
    w->role = role;
    w->dp_rank = p.dp;
    w->dp_size = p.dp_size;
    w->tp_rank = p.tp;
    w->tp_size = p.tp_size;
    w->pp_rank = p.pp;
    w->pp_size = p.pp_size;
    w->state = GRPO__WORKER_STATE__WORKER_STARTING;
    heard(c, w, now);
    if (role != GRPO__ROLE__ROLE_ROLLOUT && !same)
        c->run.abort[0] = 0; /* a fresh trainer: the job was relaunched */
    if (r->step > w->step)
        w->step = r->step;
    if (w->step > c->run.step)
        c->run.step = w->step;
    add_event(c, "rank %d %s from host %s (pid %d) as %s, dp %d/%d tp %d/%d pp %d/%d", r->rank,
              same ? "registered again" : "registered", r->host, r->pid, core_role_name(role), p.dp, p.dp_size, p.tp,
              p.tp_size, p.pp, p.pp_size);
    reevaluate(c);
    c->record_rank = whole ? -1 : r->rank;
    return reply_assignment(c, id, w, len);
}

/* ---- the run's configuration, for a replacement rank ---- */

static uint8_t *handle_run_config(struct core *c, uint64_t id, size_t *len)
{
    if (!c->nworkers || run_terminal(c->run.state))
        return refuse(c, id, false, len, "run %s is %s: there is no configuration to take", c->run.id,
                      c->nworkers ? core_run_state_name(c->run.state) : "not under way");
    if (!c->run.config)
        return refuse(c, id, false, len,
                      "run %s has no configuration text: its ranks did not send theirs (an older grpo-worker); give "
                      "the replacement the job's keys",
                      c->run.id);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__RunConfig rc = GRPO__RUN_CONFIG__INIT;
    rc.run_id = c->run.id;
    rc.config = c->run.config;
    rc.config_digest = c->run.config_digest;
    rc.world_size = c->run.world;
    env.request_id = id;
    env.body_case = GRPO__ENVELOPE__BODY_RUN_CONFIG;
    env.run_config = &rc;
    return CHECK_ALLOC(protocol_pack(&env, len));
}

/* ---- heartbeat ---- */

static void note_step(struct core *c, int64_t step)
{
    if (step <= c->run.step)
        return;
    c->run.step = step;
    c->dirty = c->dirty_urgent = true; /* once a step: the run's step never goes back after a crash */
    struct core_history_point pt = {step, run_metric(c, "critic/score/mean"), run_metric(c, "perf/throughput"),
                                    clock_wall_s()};
    core_add_history_point(c, &pt);
}

void core_add_history_point(struct core *c, const struct core_history_point *pt)
{
    if (c->run.nhistory == CORE_HISTORY) {
        memmove(c->run.history, c->run.history + 1, (CORE_HISTORY - 1) * sizeof *pt);
        c->run.nhistory--;
    }
    c->run.history[c->run.nhistory++] = *pt;
    if (c->history_new < CORE_HISTORY)
        c->history_new++;
}

static uint8_t *reply_ack(struct core *c, const struct core_worker *w, uint64_t id, bool reregister, const char *reason,
                          size_t *len)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__HeartbeatAck ack = GRPO__HEARTBEAT_ACK__INIT;
    ack.run_state = c->run.state;
    ack.pause = c->run.pause;
    /* a failed run has no future: the workers save what they have and end */
    ack.stop = c->run.stop || c->run.state == GRPO__RUN_STATE__RUN_FAILED;
    ack.checkpoint_seq = c->run.checkpoint_seq;
    ack.reregister = reregister;
    ack.reason = (char *)(reason ? reason : c->run.reason);
    /* the word to end goes to the ranks of the job that lost one; a rank of its relaunch that registered after it
     * (a rollout rank may come before the trainers that clear it) is not told to end */
    ack.abort = !w || c->run.abort_at == 0 || w->registered_at <= c->run.abort_at ? c->run.abort : "";
    ack.trace_seq = w ? w->trace_seq : 0;
    ack.stacks_seq = w ? w->stacks_seq : 0;
    env.request_id = id;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT_ACK;
    env.heartbeat_ack = &ack;
    return CHECK_ALLOC(protocol_pack(&env, len));
}

void core_worker_release(struct core_worker *w)
{
    free(w->trace);
    w->trace = NULL;
    w->ntrace = 0;
    free(w->stacks);
    w->stacks = NULL;
}

static void copy_flight(struct core_flight *d, const Grpo__FlightEntry *e)
{
    d->id = e->id;
    d->seq = e->seq;
    d->bytes = e->bytes;
    snprintf(d->kind, sizeof d->kind, "%s", e->kind);
    snprintf(d->op, sizeof d->op, "%s", e->op);
    snprintf(d->group, sizeof d->group, "%s", e->group);
    snprintf(d->members, sizeof d->members, "%s", e->members);
    d->group_size = e->group_size;
    d->peer = e->peer;
    d->layer = e->layer;
    d->phase = e->phase;
    d->backward = e->backward;
    d->open = e->open;
    d->failed = e->failed;
    d->began = e->began;
    d->seconds = e->seconds;
}

/* The flight recorder's part of a heartbeat: the wait under way, the last ones, and the answers to grpoctl trace
 * and stacks (an answer to a request grpod has not counted is ignored). */
static void copy_flight_heartbeat(struct core_worker *w, const Grpo__Heartbeat *h, double now)
{
    w->waiting = h->current_wait != NULL;
    w->layer = h->layer_plus_one > 0 ? h->layer_plus_one - 1 : -1;
    w->backward = h->backward;
    if (h->current_wait)
        copy_flight(&w->wait, h->current_wait);
    w->wait_heard = now;
    w->nrecent = 0;
    const size_t skip = h->n_recent_waits > CORE_FLIGHT_RECENT ? h->n_recent_waits - CORE_FLIGHT_RECENT : 0;
    for (size_t i = skip; i < h->n_recent_waits; i++)
        copy_flight(&w->recent[w->nrecent++], h->recent_waits[i]);
    if (h->trace_seq_done > w->trace_done && h->trace_seq_done <= w->trace_seq) {
        free(w->trace);
        w->trace = xcalloc(h->n_trace ? h->n_trace : 1, sizeof *w->trace);
        for (size_t i = 0; i < h->n_trace; i++)
            copy_flight(&w->trace[i], h->trace[i]);
        w->ntrace = (int)h->n_trace;
        w->trace_done = h->trace_seq_done;
        w->trace_at = now;
        log_info("registry", "rank %d sent its flight recorder's %zu waits (grpoctl trace)", w->rank, h->n_trace);
    }
    if (h->stacks_seq_done > w->stacks_done && h->stacks_seq_done <= w->stacks_seq) {
        free(w->stacks);
        w->stacks = xstrdup(h->stacks);
        w->stacks_done = h->stacks_seq_done;
        w->stacks_at = now;
        log_info("registry", "rank %d sent its native stack (grpoctl stacks)", w->rank);
    }
}

static void copy_heartbeat(struct core_worker *w, const Grpo__Heartbeat *h)
{
    double d_idle = h->idle_seconds - w->idle_s, d_busy = h->busy_seconds - w->busy_s;
    if (d_idle >= 0 && d_busy >= 0 && d_idle + d_busy > 1e-6) {
        double f = d_idle / (d_idle + d_busy);
        /* smoothed over the last few heartbeats: a moment of waiting is not an idle worker */
        w->idle_fraction = w->idle_s + w->busy_s > 0 ? 0.7 * w->idle_fraction + 0.3 * f : f;
        /* the diagnosis' ledger: the time between two heartbeats that both say running (not loading, paused or
         * ended, not across a reconnection) */
        if (w->state == GRPO__WORKER_STATE__WORKER_RUNNING &&
            (h->state == GRPO__WORKER_STATE__WORKER_RUNNING || h->state == GRPO__WORKER_STATE__WORKER_UNKNOWN)) {
            w->run_idle_s += d_idle;
            w->run_busy_s += d_busy;
        }
    }
    w->peak_rss_gb = h->peak_rss_gb;
    w->host_memory_gb = h->host_memory_gb;
    w->idle_s = h->idle_seconds;
    w->busy_s = h->busy_seconds;
    w->step = h->step;
    w->total_steps = h->total_steps;
    w->phase = h->phase;
    for (size_t i = 0; i < h->n_phase_changes; i++) {
        if (w->ntimeline == CORE_TIMELINE) {
            memmove(w->timeline, w->timeline + 1, sizeof w->timeline[0] * (CORE_TIMELINE - 1));
            w->ntimeline--;
        }
        w->timeline[w->ntimeline].start = h->phase_changes[i]->start;
        w->timeline[w->ntimeline++].phase = h->phase_changes[i]->phase;
    }
    memset(w->timings, 0, sizeof w->timings);
    for (size_t i = 0; i < h->n_timings; i++)
        w->timings[h->timings[i]->phase] += h->timings[i]->seconds;
    w->nmetrics = (int)h->n_metrics;
    for (size_t i = 0; i < h->n_metrics; i++) {
        snprintf(w->metrics[i].name, sizeof w->metrics[i].name, "%s", h->metrics[i]->name);
        w->metrics[i].value = h->metrics[i]->value;
    }
}

/* What a heartbeat after a silence tells of it, by the worker's own count and clock (Heartbeat.seq, sent_s,
 * unanswered) against the heartbeat grpod heard before: heartbeats it sent that grpod never heard (held up or dropped
 * on the way), tries it made without an answer (it backs off between them), or nothing sent for as long (the worker
 * itself stalled). ": ..." into out, or "" when the worker does not count (an older one) or this is the first
 * heartbeat of its registration. silent: grpod's measure of the gap (its own pauses left out). */
static void explain_gap(const struct core_worker *w, const Grpo__Heartbeat *h, double silent, char *out, size_t len)
{
    out[0] = 0;
    if (!h->seq || !w->hb_seq || h->seq <= w->hb_seq || h->sent_s <= 0 || w->hb_sent <= 0)
        return;
    const uint64_t missed = h->seq - w->hb_seq - 1; /* sent, never handled by grpod */
    const double own = h->sent_s - w->hb_sent;      /* the worker's own time between the two grpod heard */
    if (missed > 0)
        snprintf(out, len,
                 ": %" PRIu64 " heartbeat(s) it sent in that time never reached grpod (it sent this one %.1f s after "
                 "the one before, by its own clock): they were held up or dropped on the way (the network, grpod's "
                 "socket)",
                 missed, own);
    else if (h->unanswered > 0)
        snprintf(out, len,
                 ": its last %u heartbeat(s) had no answer in time and it waited to try again (it sent this one %.1f s "
                 "after the one before, by its own clock): grpod, or the way to it, was slow",
                 h->unanswered, own);
    else if (own >= 0.5 * silent)
        snprintf(out, len,
                 ": by its own clock it sent nothing for %.1f s and none was lost on the way: the worker itself was "
                 "stalled (a loaded host, a stopped process)",
                 own);
    else
        snprintf(out, len,
                 ": it sent this heartbeat %.1f s after the one before, by its own clock, and none was lost: it was "
                 "held up on the way (the network, grpod's socket)",
                 own);
}

/* Heartbeat.survived: the ranks the sender's run went on without (trainer.survive_trainer_loss). Each is lost, with
 * the reason, and holds nothing up: its peers are not told to end. */
static void note_survived(struct core *c, const struct core_worker *from, const Grpo__Heartbeat *h)
{
    for (size_t i = 0; i < h->n_survived; i++) {
        const Grpo__SurvivedLoss *l = h->survived[i];
        if (l->rank < 0 || l->rank >= c->nworkers || !c->workers[l->rank] || c->workers[l->rank] == from)
            continue;
        struct core_worker *x = c->workers[l->rank];
        if (x->survived || worker_ended(x->state))
            continue;
        x->survived = true;
        x->suspect = false;
        if (x->state != GRPO__WORKER_STATE__WORKER_LOST)
            c->counters.losses++;
        x->state = GRPO__WORKER_STATE__WORKER_LOST;
        snprintf(x->error, sizeof x->error, "%s", l->reason[0] ? l->reason : "survived");
        c->dirty = true;
        add_event(c, "rank %d on host %s (pid %d) lost: %s (rank %d says); the run goes on without it", x->rank,
                  x->host, x->pid, x->error, from->rank);
    }
}

/* Heartbeat.layout_dp_*: after a loss survived, the sender's place in the re-formed layout; a spare that joined
 * trains from now on (a colocated rank). */
static void note_layout(struct core *c, struct core_worker *w, const Grpo__Heartbeat *h)
{
    if (h->layout_dp_size <= 0 || h->layout_dp_rank < 0 || h->layout_dp_rank >= h->layout_dp_size ||
        (w->dp_rank == h->layout_dp_rank && w->dp_size == h->layout_dp_size && w->role != GRPO__ROLE__ROLE_SPARE))
        return;
    if (w->role == GRPO__ROLE__ROLE_SPARE) {
        w->role = GRPO__ROLE__ROLE_HYBRID;
        add_event(c, "spare rank %d on host %s (pid %d) took a lost rank's place: DP rank %d of %d", w->rank, w->host,
                  w->pid, h->layout_dp_rank, h->layout_dp_size);
    }
    w->dp_rank = h->layout_dp_rank;
    w->dp_size = h->layout_dp_size;
    c->dirty = true;
}

/* Heartbeat.left_copy: the sender's model copy (TP/PP) lost a rank and left; the sender waits until the run ends,
 * in no step (ROLE_IDLE). Said in every heartbeat from then on: a registration made again (grpod restarted) learns
 * it from the next one. */
static void note_left(struct core *c, struct core_worker *w, const Grpo__Heartbeat *h)
{
    if (!h->left_copy || !h->left_copy[0] || w->role == GRPO__ROLE__ROLE_IDLE)
        return;
    w->role = GRPO__ROLE__ROLE_IDLE;
    add_event(c, "rank %d on host %s (pid %d) left its model copy and is idle until the run ends: %.160s", w->rank,
              w->host, w->pid, h->left_copy);
    c->dirty = true;
}

static uint8_t *handle_heartbeat(struct core *c, const Grpo__Envelope *env, double now, size_t *len)
{
    const Grpo__Heartbeat *h = env->heartbeat;
    if (h->rank >= c->nworkers || !c->workers[h->rank] || c->workers[h->rank]->incarnation != h->incarnation) {
        char why[CORE_REASON_MAX];
        snprintf(why, sizeof why, "grpod does not know this registration of rank %d in run %s: register again", h->rank,
                 c->run.id);
        log_debug("registry", "%s", why);
        return reply_ack(c, NULL, env->request_id, true, why, len);
    }
    struct core_worker *w = c->workers[h->rank];
    Grpo__WorkerState old = w->state;
    const bool was_suspect = w->suspect;
    /* what the run's state is judged by (reevaluate) that a heartbeat can change: with none of it changed, as in
     * every steady heartbeat, the verdict stands and is not judged again (a judgement reads every worker: at 1 Hz
     * from N workers that was N^2 a second, grpod's whole core at 10,000; docs/scaling.md) */
    const uint64_t ck_done0 = w->checkpoint_seq_done;
    const int64_t ck_step0 = w->checkpoint_step, run_step0 = c->run.step;
    char silent[96] = "", gap[CORE_REASON_MAX] = "";
    if (old == GRPO__WORKER_STATE__WORKER_LOST || was_suspect) {
        silence_text(c, w, now, silent, sizeof silent);
        explain_gap(w, h, silence(c, w, now), gap, sizeof gap);
    }
    heard(c, w, now);
    if (h->seq) {
        w->hb_seq = h->seq;
        w->hb_sent = h->sent_s;
    }
    copy_heartbeat(w, h);
    copy_flight_heartbeat(w, h, now);
    note_survived(c, w, h);
    note_layout(c, w, h);
    note_left(c, w, h);
    Grpo__WorkerState st =
        h->state == GRPO__WORKER_STATE__WORKER_UNKNOWN ? GRPO__WORKER_STATE__WORKER_RUNNING : h->state;
    if (old == GRPO__WORKER_STATE__WORKER_LOST)
        add_event(c, "rank %d on host %s is back after %s of silence%s", w->rank, w->host, silent, gap);
    else if (was_suspect)
        add_note(c, "rank %d on host %s heard again after %s of silence (was suspect, not lost)%s", w->rank, w->host,
                 silent, gap);
    else if (old == GRPO__WORKER_STATE__WORKER_RECONNECTING)
        add_event(c, "rank %d on host %s reconnected", w->rank, w->host);
    if (st != old) {
        w->state = st;
        c->dirty = true;
        if (st == GRPO__WORKER_STATE__WORKER_FAILED) {
            snprintf(w->error, sizeof w->error, "%s", h->error[0] ? h->error : "no reason given");
            add_event(c, "rank %d on host %s failed: %s", w->rank, w->host, w->error);
            /* a trainer (or colocated rank) that failed leaves its peers waiting in a collective, on whatever host
             * they are: the other ranks are told to end, as when one is lost (its own host's ranks end with it, but
             * mpirun cannot end the others when it keeps the job after a lost rank) */
            if (loss_ends_job(c, w) && !c->run.abort[0]) {
                c->run.abort_at = clock_wall_s();
                snprintf(c->run.abort, sizeof c->run.abort, "%s rank %d on host %.60s failed: %.200s",
                         w->role == GRPO__ROLE__ROLE_HYBRID ? "colocated" : "trainer", w->rank, w->host, w->error);
                add_event(c, "%s: the other ranks are told to end", c->run.abort);
            }
        } else if (st == GRPO__WORKER_STATE__WORKER_FINISHED || st == GRPO__WORKER_STATE__WORKER_STOPPED) {
            /* a worker that ends on grpod's word says so (Heartbeat.error: "ended as grpod said: ...") */
            add_event(c, "rank %d on host %s %s at step %" PRId64 "%s%.300s", w->rank, w->host,
                      st == GRPO__WORKER_STATE__WORKER_FINISHED ? "finished" : "stopped", w->step,
                      h->error[0] ? ": " : "", h->error);
        }
    }
    if (h->checkpoint_seq_done > w->checkpoint_seq_done || h->checkpoint_step != w->checkpoint_step) {
        if (h->checkpoint_step != w->checkpoint_step && h->checkpoint_step >= 0)
            log_info("registry", "rank %d wrote a checkpoint at step %" PRId64, w->rank, h->checkpoint_step);
        w->checkpoint_seq_done = h->checkpoint_seq_done;
        w->checkpoint_step = h->checkpoint_step;
        c->dirty = c->dirty_urgent = true;
    }
    note_step(c, h->step);
    if (h->total_steps > c->run.total_steps)
        c->run.total_steps = h->total_steps;
    c->run.phase = GRPO__PHASE__PHASE_IDLE; /* the lowest rank still at work says where the run is */
    for (int r = 0; r < c->nworkers; r++)
        if (c->workers[r] && worker_watched(c->workers[r]->state)) {
            c->run.phase = c->workers[r]->phase;
            break;
        }
    if (w->state != old || w->checkpoint_seq_done != ck_done0 || w->checkpoint_step != ck_step0 ||
        c->run.step != run_step0)
        reevaluate(c);
    /* what a heartbeat changes that must be durable (a step, the worker's state, its checkpoint, the run's state)
     * is all in its worker's record: a step no longer rewrites the whole state before its answer */
    c->record_rank = w->rank;
    return reply_ack(c, w, env->request_id, false, NULL, len);
}

/* ---- commands ---- */

static uint8_t *handle_command(struct core *c, const Grpo__Envelope *env, size_t *len)
{
    const Grpo__CommandRequest *cmd = env->command;
    uint64_t id = env->request_id;
    const char *st = core_run_state_name(c->run.state);
    const char *by = cmd->reason[0] ? cmd->reason : "operator";
    char msg[CORE_REASON_MAX];
    if (run_terminal(c->run.state))
        return refuse(c, id, false, len, "run %s is %s (%s); nothing to %s", c->run.id, st, c->run.reason,
                      cmd->command == GRPO__COMMAND__COMMAND_PAUSE    ? "pause"
                      : cmd->command == GRPO__COMMAND__COMMAND_RESUME ? "resume"
                      : cmd->command == GRPO__COMMAND__COMMAND_STOP   ? "stop"
                                                                      : "checkpoint");
    switch (cmd->command) {
    case GRPO__COMMAND__COMMAND_PAUSE:
        if (c->run.stop)
            return refuse(c, id, false, len, "run %s is stopping; it cannot be paused", c->run.id);
        if (c->run.pause) {
            snprintf(msg, sizeof msg, "run is already %s", st);
            break;
        }
        c->run.pause = true;
        add_event(c, "pause requested by %s", by);
        snprintf(msg, sizeof msg, "pause requested: every worker holds at its next safe point");
        break;
    case GRPO__COMMAND__COMMAND_RESUME:
        if (c->run.stop)
            return refuse(c, id, false, len, "run %s is stopping; it cannot be resumed", c->run.id);
        if (!c->run.pause) {
            snprintf(msg, sizeof msg, "run is not paused (%s)", st);
            break;
        }
        c->run.pause = false;
        add_event(c, "resume requested by %s", by);
        snprintf(msg, sizeof msg, "resumed");
        break;
    case GRPO__COMMAND__COMMAND_STOP:
        if (c->run.stop) {
            snprintf(msg, sizeof msg, "run is already stopping");
            break;
        }
        c->run.stop = true;
        c->run.pause = false;
        /* the run's end names who asked: a worker on a signal (its launcher ending the job is no operator's
         * doing), else the operator, with grpoctl's --reason */
        if (cmd->requester[0])
            snprintf(c->run.stop_by, sizeof c->run.stop_by, "%s", cmd->requester);
        else if (cmd->reason[0])
            snprintf(c->run.stop_by, sizeof c->run.stop_by, "operator (%.200s)", cmd->reason);
        else
            snprintf(c->run.stop_by, sizeof c->run.stop_by, "operator");
        add_event(c, "stop requested by %s", cmd->requester[0] ? cmd->requester : by);
        snprintf(msg, sizeof msg, "stop requested: every worker checkpoints at its next safe point and ends");
        break;
    default: {
        int present = 0;
        for (int r = 0; r < c->nworkers; r++)
            present += (c->workers[r] != NULL);
        if (!present)
            return refuse(c, id, false, len, "no workers have registered; nothing to checkpoint");
        c->run.checkpoint_seq++;
        add_event(c, "checkpoint %" PRIu64 " requested by %s", c->run.checkpoint_seq, by);
        snprintf(msg, sizeof msg, "checkpoint %" PRIu64 " requested: written at the next safe point",
                 c->run.checkpoint_seq);
        break;
    }
    }
    reevaluate(c);
    return pack_reply(id, true, NULL, msg, false, len);
}

/* ---- grpoctl trace and stacks ---- */

/* A worker that can still answer a request: it heartbeats (not ended, not lost) */
static bool flight_answerable(const struct core_worker *w) { return worker_watched(w->state); }

void core_flight_proto(const struct core_flight *f, Grpo__FlightEntry *e)
{
    grpo__flight_entry__init(e);
    e->id = f->id;
    e->kind = (char *)f->kind;
    e->op = (char *)f->op;
    e->group = (char *)f->group;
    e->members = (char *)f->members;
    e->group_size = f->group_size;
    e->seq = f->seq;
    e->bytes = f->bytes;
    e->peer = f->peer;
    e->phase = f->phase;
    e->layer = f->layer;
    e->backward = f->backward;
    e->began = f->began;
    e->seconds = f->seconds;
    e->open = f->open;
    e->failed = f->failed;
}

/* FlightRequest: ask (a new request for the worker, or for every worker that can answer: rank -1, stacks) or
 * poll (seq 0: the newest request), answered with each worker's newest answer and whether it answers seq. */
static uint8_t *handle_flight(struct core *c, const Grpo__Envelope *env, double now, size_t *len)
{
    const Grpo__FlightRequest *q = env->flight_request;
    const bool stacks = q->what == GRPO__FLIGHT_REQUEST__WHAT__STACKS;
    const char *what = stacks ? "stacks" : "trace";
    if (q->rank >= 0 && (q->rank >= c->nworkers || !c->workers[q->rank]))
        return refuse(c, env->request_id, false, len,
                      "no rank %d has registered in run %s (grpoctl workers lists them)", q->rank, c->run.id);
    const int lo = q->rank >= 0 ? q->rank : 0, hi = q->rank >= 0 ? q->rank + 1 : c->nworkers;
    int n = 0;
    for (int r = lo; r < hi; r++)
        n += c->workers[r] != NULL;
    if (!n)
        return refuse(c, env->request_id, false, len, "no workers have registered in run %s", c->run.id);
    Grpo__FlightReply reply = GRPO__FLIGHT_REPLY__INIT;
    Grpo__FlightDump *dumps = xcalloc((size_t)n, sizeof *dumps), **dp = xcalloc((size_t)n, sizeof *dp);
    size_t nentries = 0;
    for (int r = lo; r < hi; r++)
        if (c->workers[r] && !stacks)
            nentries += (size_t)c->workers[r]->ntrace;
    Grpo__FlightEntry *es = xcalloc(nentries ? nentries : 1, sizeof *es),
                      **ep = xcalloc(nentries ? nentries : 1, sizeof *ep);
    size_t used = 0;
    for (int r = lo; r < hi; r++) {
        struct core_worker *w = c->workers[r];
        if (!w)
            continue;
        uint64_t *seq = stacks ? &w->stacks_seq : &w->trace_seq;
        const uint64_t done = stacks ? w->stacks_done : w->trace_done;
        if (q->ask && (q->rank >= 0 || flight_answerable(w)))
            ++*seq;
        Grpo__FlightDump *d = &dumps[reply.n_dumps];
        grpo__flight_dump__init(d);
        d->rank = w->rank;
        d->host = w->host;
        d->pid = w->pid;
        d->seq = q->ask || !q->seq ? *seq : q->seq;
        d->answered = done >= d->seq && done > 0;
        d->state = (char *)core_worker_state_name(core_worker_shown_state(w));
        if (stacks) {
            d->stacks = w->stacks ? w->stacks : "";
            d->age_s = w->stacks ? now - w->stacks_at : 0;
        } else {
            d->trace = ep + used;
            for (int i = 0; i < w->ntrace; i++) {
                core_flight_proto(&w->trace[i], &es[used]);
                ep[used] = &es[used];
                used++;
            }
            d->n_trace = (size_t)w->ntrace;
            d->age_s = w->trace ? now - w->trace_at : 0;
        }
        dp[reply.n_dumps++] = d;
    }
    if (q->ask)
        log_info("registry", "grpoctl %s asked of %s", what, q->rank >= 0 ? "one rank" : "every rank");
    reply.dumps = dp;
    Grpo__Envelope out = GRPO__ENVELOPE__INIT;
    out.request_id = env->request_id;
    out.body_case = GRPO__ENVELOPE__BODY_FLIGHT_REPLY;
    out.flight_reply = &reply;
    uint8_t *packed = CHECK_ALLOC(protocol_pack(&out, len));
    free(es);
    free(ep);
    free(dumps);
    free(dp);
    return packed;
}

/* ---- entry points ---- */

static uint8_t *handle_status(struct core *c, uint64_t id, double now, size_t *len)
{
    struct arena a = {0};
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.request_id = id;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS;
    env.status = core_status(c, now, &a);
    uint8_t *out = CHECK_ALLOC(protocol_pack(&env, len));
    arena_free(&a);
    return out;
}

static uint8_t *handle_metrics(struct core *c, uint64_t id, double now, size_t *len)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    char *text = core_metrics_text(c, now);
    env.request_id = id;
    env.body_case = GRPO__ENVELOPE__BODY_METRICS_TEXT;
    env.metrics_text = text;
    uint8_t *out = CHECK_ALLOC(protocol_pack(&env, len));
    free(text);
    return out;
}

/* Log a dropped request, at most 10 lines per 10 s: a flood of garbage must not flood the log. */
static void log_dropped(struct core *c, double now, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void log_dropped(struct core *c, double now, const char *fmt, ...)
{
    if (now - c->drop_window > 10.0) {
        if (c->drop_suppressed)
            log_warn("grpod", "... and %" PRIu64 " more dropped requests not logged", c->drop_suppressed);
        c->drop_window = now;
        c->drop_logged = 0;
        c->drop_suppressed = 0;
    }
    if (c->drop_logged >= 10) {
        c->drop_suppressed++;
        return;
    }
    c->drop_logged++;
    char text[CORE_REASON_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    log_warn("grpod", "%s", text);
}

uint8_t *core_handle(struct core *c, const uint8_t *buf, size_t len, const char *secret, double now, size_t *reply_len)
{
    return core_handle_auth(c, buf, len, secret, now, reply_len, NULL);
}

/* An envelope that did not decode (pe, why), answered. env may be NULL; it is freed. */
static uint8_t *undecodable(struct core *c, enum protocol_error pe, Grpo__Envelope *env, char *why, size_t whylen,
                            double now, size_t *reply_len)
{
    if (pe == PROTOCOL_BAD_VERSION && env) {
        c->counters.bad_version++;
        snprintf(why, whylen, "incompatible protocol version %u: grpod speaks version %u; upgrade the older side",
                 env->version, GRPO_PROTOCOL_VERSION);
    } else {
        c->counters.malformed++;
    }
    log_dropped(c, now, "dropped a request: %s", why);
    uint8_t *out = CHECK_ALLOC(protocol_pack_error(env ? env->request_id : 0, why, reply_len));
    protocol_free(env);
    return out;
}

/* A decoded request grpod takes (on ipc, or opened from a tcp session): checked field by field, then answered. */
static uint8_t *handle_request(struct core *c, const Grpo__Envelope *env, double now, size_t *reply_len)
{
    char why[CORE_REASON_MAX];
    const uint64_t id = env->request_id;
    if (validate_request(env, why, sizeof why) != 0) {
        bool unexpected = strstr(why, "is not a request") != NULL;
        if (unexpected)
            c->counters.unexpected++;
        else
            c->counters.invalid++;
        log_dropped(c, now, "dropped an invalid request: %s", why);
        return CHECK_ALLOC(protocol_pack_error(id, why, reply_len));
    }
    if ((unsigned)env->body_case < sizeof c->counters.requests / sizeof c->counters.requests[0])
        c->counters.requests[env->body_case]++;
    switch (env->body_case) {
    case GRPO__ENVELOPE__BODY_REGISTER: return handle_register(c, env, now, reply_len);
    case GRPO__ENVELOPE__BODY_HEARTBEAT: return handle_heartbeat(c, env, now, reply_len);
    case GRPO__ENVELOPE__BODY_COMMAND: return handle_command(c, env, reply_len);
    case GRPO__ENVELOPE__BODY_METRICS_REQUEST: return handle_metrics(c, id, now, reply_len);
    case GRPO__ENVELOPE__BODY_RUN_CONFIG_REQUEST: return handle_run_config(c, id, reply_len);
    case GRPO__ENVELOPE__BODY_FLIGHT_REQUEST: return handle_flight(c, env, now, reply_len);
    default: return handle_status(c, id, now, reply_len);
    }
}

/* A refusal of a tcp request's authentication, unsealed; reauth: the client may authenticate again. */
static uint8_t *refuse_auth(uint64_t id, const char *error, bool reauth, size_t *len)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Reply reply = GRPO__REPLY__INIT;
    reply.error = (char *)error;
    reply.reauth = reauth;
    env.request_id = id;
    env.body_case = GRPO__ENVELOPE__BODY_REPLY;
    env.reply = &reply;
    return CHECK_ALLOC(protocol_pack(&env, len));
}

/* A request on a tcp:// endpoint (protocol 1.12, proto/ctl_auth.h): a hello is challenged; a sealed request of a
 * known session, with a counter it has not used, is opened, handled and its answer sealed; everything else is
 * refused. The secret itself is never taken: a request that carries it comes from an older client. */
static uint8_t *handle_tcp(struct core *c, Grpo__Envelope *env, const char *secret, double now, size_t *reply_len,
                           bool *authenticated)
{
    char why[CORE_REASON_MAX], text[CORE_REASON_MAX + 128];
    const uint64_t id = env->request_id;
    if (!c->ctl || !ctl_server_keyed(c->ctl, secret)) {
        ctl_server_free(c->ctl);
        c->ctl = ctl_server_new(secret);
    }
    if (env->secret.len) {
        c->counters.auth_failed++;
        log_dropped(c, now,
                    "refused a %s request from a client of protocol 1.%u: it sent the shared secret over the network "
                    "(since 1.12 the secret never crosses it; change the secret)",
                    protocol_body_name(env->body_case), env->minor_version);
        snprintf(text, sizeof text,
                 "authentication failed: this client (protocol 1.%u) sent the shared secret over the network; grpod "
                 "(1.%u) authenticates by challenge-response and never takes the secret itself: upgrade the client, "
                 "and change the secret (it crossed the network in clear)",
                 env->minor_version, GRPO_PROTOCOL_MINOR);
        return refuse_auth(id, text, false, reply_len);
    }
    if (env->body_case == GRPO__ENVELOPE__BODY_AUTH_HELLO) {
        uint8_t *out = ctl_server_challenge(c->ctl, env, now, reply_len, why, sizeof why);
        if (out)
            return out;
        c->counters.invalid++;
        log_dropped(c, now, "dropped an authentication hello: %s", why);
        return refuse_auth(id, why, false, reply_len);
    }
    if (env->body_case != GRPO__ENVELOPE__BODY_SEALED) {
        c->counters.auth_failed++;
        log_dropped(c, now, "refused a %s request on tcp: not sealed in an authenticated session",
                    protocol_body_name(env->body_case));
        return refuse_auth(id,
                           "authentication failed: on tcp:// a request must come sealed in a session that proved the "
                           "shared secret of grpod.secret_file by challenge-response (protocol 1.12)",
                           false, reply_len);
    }
    uint8_t *plain;
    size_t plen;
    struct ctl_ticket t;
    enum ctl_verdict v = ctl_server_open(c->ctl, env->sealed, now, &plain, &plen, &t, why, sizeof why);
    if (v != CTL_OK) {
        if (v == CTL_UNKNOWN)
            c->counters.unknown_session++;
        else if (v == CTL_REPLAY)
            c->counters.replayed++;
        else
            c->counters.auth_failed++;
        log_dropped(c, now, "refused a sealed request: %s", why);
        return refuse_auth(id, why, v == CTL_UNKNOWN, reply_len);
    }
    *authenticated = true;
    Grpo__Envelope *inner;
    enum protocol_error pe = protocol_decode(plain, plen, GRPO_MAX_CONTROL_BYTES, &inner, why, sizeof why);
    ctl_wipe_free(plain, plen);
    size_t rlen;
    uint8_t *reply = pe == PROTOCOL_OK ? handle_request(c, inner, now, &rlen)
                                       : undecodable(c, pe, inner, why, sizeof why, now, &rlen);
    if (pe == PROTOCOL_OK)
        protocol_free(inner);
    uint8_t *out = CHECK_ALLOC(ctl_server_seal(&t, id, reply, rlen, reply_len));
    ctl_wipe_free(reply, rlen); /* an assignment holds data-plane keys */
    return out;
}

uint8_t *core_handle_auth(struct core *c, const uint8_t *buf, size_t len, const char *secret, double now,
                          size_t *reply_len, bool *authenticated)
{
    bool dummy;
    if (!authenticated)
        authenticated = &dummy;
    *authenticated = false;
    c->record_rank = -1; /* a registration's handler says when its record is all the journal needs */
    Grpo__Envelope *env;
    char why[CORE_REASON_MAX];
    enum protocol_error pe = protocol_decode(buf, len, GRPO_MAX_CONTROL_BYTES, &env, why, sizeof why);
    if (pe != PROTOCOL_OK)
        return undecodable(c, pe, env, why, sizeof why, now, reply_len);
    uint8_t *out;
    if (secret) {
        out = handle_tcp(c, env, secret, now, reply_len, authenticated);
    } else {
        *authenticated = true;
        out = handle_request(c, env, now, reply_len);
    }
    protocol_free(env);
    return out;
}

/* grpod's own pauses: a tick later than four tick periods says grpod's loop did not run meanwhile (a loaded host, a
 * stopped process). Heartbeats sent in that time wait in its sockets, read only after this tick (libuv runs timers
 * before it polls): that time is nobody's silence. */
static void note_own_pause(struct core *c, double now)
{
    const double gap = now - c->last_tick;
    const bool first = !c->ticked; /* the time before the first tick is grpod starting, not a pause */
    c->last_tick = now;
    c->ticked = true;
    if (first || c->set.tick_s <= 0 || gap <= 4 * c->set.tick_s)
        return;
    const double paused = gap - c->set.tick_s;
    c->stalled_s += paused;
    add_note(c,
             "grpod's own loop did not run for %.1f s (a loaded or stopped host): that time is not counted as any "
             "worker's silence",
             paused);
}

void core_tick(struct core *c, double now)
{
    c->record_rank = -1;
    note_own_pause(c, now);
    for (int r = 0; r < c->nworkers; r++) {
        struct core_worker *w = c->workers[r];
        if (!w || !worker_watched(w->state))
            continue;
        /* suspect after two intervals of silence, lost after grpod.heartbeat_timeout_s, every role alike: a rollout
         * rank's work goes to the other rollout ranks after two intervals anyway (the trainers' dispatcher), so its
         * loss need not be called before a stalled but live rank can speak again */
        const double silent = silence(c, w, now);
        char said[96];
        if (silent <= c->set.heartbeat_timeout_s) {
            if (silent > suspect_after(c) && !w->suspect && w->state != GRPO__WORKER_STATE__WORKER_RECONNECTING) {
                w->suspect = true;
                c->counters.suspects++;
                silence_text(c, w, now, said, sizeof said);
                add_note(c, "rank %d on host %s (pid %d) suspect: no heartbeat for %s (lost after %.1f s)", w->rank,
                         w->host, w->pid, said, c->set.heartbeat_timeout_s);
            }
            continue;
        }
        silence_text(c, w, now, said, sizeof said);
        w->state = GRPO__WORKER_STATE__WORKER_LOST;
        w->suspect = false;
        c->counters.losses++;
        add_event(c, "rank %d on host %s (pid %d) lost: no heartbeat for %s", w->rank, w->host, w->pid, said);
        /* the trainers of a split run, and colocated ranks, wait for each other in collectives: without the lost
         * one they cannot go on. Tell every other rank to end (their job is relaunched and resumes from the newest
         * checkpoint). */
        if (loss_ends_job(c, w) && !c->run.abort[0]) {
            c->run.abort_at = clock_wall_s();
            snprintf(c->run.abort, sizeof c->run.abort, "%s rank %d on host %s lost (no heartbeat for %.1f s)",
                     w->role == GRPO__ROLE__ROLE_HYBRID ? "colocated" : "trainer", w->rank, w->host,
                     now - w->last_seen);
            add_event(c, "%s: the other ranks are told to end", c->run.abort);
        }
        if (c->set.fail_on_lost && !run_terminal(c->run.state)) {
            char reason[CORE_REASON_MAX];
            snprintf(reason, sizeof reason, "rank %d on host %s lost: no heartbeat for %s", w->rank, w->host, said);
            set_state(c, GRPO__RUN_STATE__RUN_FAILED, reason);
        }
    }
    reevaluate(c);
}
