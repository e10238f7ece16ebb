/* What grpod tells about the run: the Status message (grpoctl, /api/status)
 * and the Prometheus text exposition (/metrics, grpoctl metrics). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "common/check.h"
#include "core.h"
#include "daemon/grpod_version.h"
#include "diagnose.h"
#include "proto/hang.h"

/* The Status points into the core's own strings (it is packed before the core changes again)
 * and takes its structs in a few bulk allocations: a status of hundreds of workers is asked for
 * many times a second. The casts drop a const that protobuf-c's structs do not declare. */
#define TEXT(s) ((char *)(s))

static Grpo__Metric *new_metric(struct arena *a, const char *name, double value)
{
    Grpo__Metric *m = arena_alloc(a, sizeof *m);
    grpo__metric__init(m);
    m->name = TEXT(name);
    m->value = value;
    return m;
}

static void worker_status(Grpo__WorkerStatus *ws, const struct core_worker *w, double now, struct arena *a)
{
    grpo__worker_status__init(ws);
    ws->rank = w->rank;
    ws->host = TEXT(w->host);
    ws->pid = w->pid;
    ws->role = w->role;
    ws->worker_state = core_worker_shown_state(w);
    ws->state = TEXT(core_worker_state_name(ws->worker_state));
    ws->last_heartbeat_age_s = now - w->last_seen;
    ws->idle_fraction = w->idle_fraction;
    ws->phase = w->phase;
    ws->step = w->step;
    ws->dp_rank = w->dp_rank;
    ws->tp_rank = w->tp_rank;
    ws->pp_rank = w->pp_rank;
    ws->checkpoint_step = w->checkpoint_step;
    ws->error = TEXT(w->error);
    ws->busy_seconds = w->busy_s;
    ws->idle_seconds = w->idle_s;
    /* one block: device pointers, metric pointers and structs, timing pointers and structs */
    size_t nd = (size_t)w->ndevices, nm = (size_t)w->nmetrics;
    char *block = arena_alloc(a, nd * sizeof(char *) + nm * (sizeof(Grpo__Metric *) + sizeof(Grpo__Metric)) +
                                     GRPO_NUM_PHASES * (sizeof(Grpo__PhaseTime *) + sizeof(Grpo__PhaseTime)));
    Grpo__Metric *ms = (Grpo__Metric *)block;
    Grpo__PhaseTime *ts = (Grpo__PhaseTime *)(ms + nm);
    ws->metrics = (Grpo__Metric **)(ts + GRPO_NUM_PHASES);
    ws->timings = (Grpo__PhaseTime **)(ws->metrics + nm);
    ws->devices = (char **)(ws->timings + GRPO_NUM_PHASES);
    ws->n_devices = nd;
    for (size_t i = 0; i < nd; i++)
        ws->devices[i] = TEXT(w->devices[i]);
    ws->n_metrics = nm;
    for (size_t i = 0; i < nm; i++) {
        grpo__metric__init(&ms[i]);
        ms[i].name = TEXT(w->metrics[i].name);
        ms[i].value = w->metrics[i].value;
        ws->metrics[i] = &ms[i];
    }
    for (int p = 1; p < GRPO_NUM_PHASES; p++) {
        if (w->timings[p] <= 0)
            continue;
        Grpo__PhaseTime *t = &ts[ws->n_timings];
        grpo__phase_time__init(t);
        t->phase = (Grpo__Phase)p;
        t->seconds = w->timings[p];
        ws->timings[ws->n_timings++] = t;
    }
    if (w->ntimeline > 0) {
        Grpo__PhaseSpan *sp = arena_alloc(a, (size_t)w->ntimeline * sizeof *sp);
        ws->timeline = arena_alloc(a, (size_t)w->ntimeline * sizeof *ws->timeline);
        for (int i = 0; i < w->ntimeline; i++) {
            grpo__phase_span__init(&sp[i]);
            sp[i].start = w->timeline[i].start;
            sp[i].phase = w->timeline[i].phase;
            ws->timeline[i] = &sp[i];
        }
        ws->n_timeline = (size_t)w->ntimeline;
    }
    /* the flight recorder: the wait under way (it has lasted since grpod heard it too) and the last ones */
    if (w->waiting) {
        Grpo__FlightEntry *e = arena_alloc(a, sizeof *e);
        core_flight_proto(&w->wait, e);
        if (e->open && now > w->wait_heard)
            e->seconds += now - w->wait_heard;
        ws->current_wait = e;
    }
    if (w->nrecent > 0) {
        Grpo__FlightEntry *es = arena_alloc(a, (size_t)w->nrecent * sizeof *es);
        ws->recent_waits = arena_alloc(a, (size_t)w->nrecent * sizeof *ws->recent_waits);
        for (int i = 0; i < w->nrecent; i++) {
            core_flight_proto(&w->recent[i], &es[i]);
            ws->recent_waits[i] = &es[i];
        }
        ws->n_recent_waits = (size_t)w->nrecent;
    }
}

/* The run's metrics: each name once, from the lowest rank that reports it. */
static void run_metrics(const struct core *c, Grpo__Status *s, struct arena *a)
{
    size_t cap = 0;
    for (int r = 0; r < c->nworkers; r++)
        cap += c->workers[r] ? (size_t)c->workers[r]->nmetrics : 0;
    s->metrics = arena_alloc(a, (cap ? cap : 1) * sizeof(Grpo__Metric *));
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        if (!w)
            continue;
        for (int i = 0; i < w->nmetrics; i++) {
            bool seen = false;
            for (size_t k = 0; k < s->n_metrics && !seen; k++)
                seen = strcmp(s->metrics[k]->name, w->metrics[i].name) == 0;
            if (!seen)
                s->metrics[s->n_metrics++] = new_metric(a, w->metrics[i].name, w->metrics[i].value);
        }
    }
}

/* A metric of the run (the lowest rank that reports it); NAN when none does. */
static double metric_of(const struct core *c, const char *name)
{
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        for (int i = 0; w && i < w->nmetrics; i++)
            if (strcmp(w->metrics[i].name, name) == 0)
                return w->metrics[i].value;
    }
    return NAN;
}

int core_diagnose(const struct core *c, struct diag_finding *out, int max)
{
    int n = 0;
    for (int r = 0; r < c->nworkers; r++)
        n += c->workers[r] != NULL;
    struct diag_rank *ranks = xmalloc((size_t)(n ? n : 1) * sizeof *ranks);
    n = 0;
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        if (!w)
            continue;
        struct diag_rank *d = &ranks[n++];
        memset(d, 0, sizeof *d);
        d->rank = w->rank;
        d->role = w->role;
        /* an ended rank's ledger stands (a finished run keeps its verdict); a lost or failed one's does not */
        d->live = w->state != GRPO__WORKER_STATE__WORKER_LOST && w->state != GRPO__WORKER_STATE__WORKER_FAILED;
        d->host = w->host;
        d->idle_s = w->run_idle_s;
        d->busy_s = w->run_busy_s;
        memcpy(d->phase_s, w->timings, sizeof d->phase_s);
        d->peak_rss_gb = w->peak_rss_gb > 0 ? w->peak_rss_gb : NAN;
        d->host_memory_gb = w->host_memory_gb > 0 ? w->host_memory_gb : NAN;
    }
    const struct diag_run run = {.steps = c->run.step,
                                 .step_s = metric_of(c, "timing_s/step"),
                                 .wait_data_s = metric_of(c, "timing_s/wait_data"),
                                 .update_weights_s = metric_of(c, "timing_s/update_weights"),
                                 .staleness = metric_of(c, "training/staleness"),
                                 .gen_wait_peers_s = metric_of(c, "colocated/gen_wait_peers_s"),
                                 .gen_imbalance = metric_of(c, "colocated/gen_imbalance"),
                                 .units_stolen = metric_of(c, "colocated/units_stolen")};
    int found = diagnose(ranks, n, &run, out, max);
    free(ranks);
    return found;
}

static void hang_wait_of(const struct core_flight *f, double extra, struct hang_wait *w)
{
    *w = (struct hang_wait){.kind = f->kind,
                            .op = f->op,
                            .group = f->group,
                            .members = f->members,
                            .group_size = f->group_size,
                            .seq = f->seq,
                            .peer = f->peer,
                            .phase = f->phase,
                            .layer = f->layer,
                            .backward = f->backward,
                            .seconds = f->seconds + (f->open && extra > 0 ? extra : 0)};
}

/* A wait this many times the last step's seconds, when that is longer than grpod.hang_wait_s, before one is a
 * hang. */
#define HANG_STEPS 3.0

int core_hang(const struct core *c, double now, struct hang_finding *out, int max)
{
    const Grpo__RunState st = c->run.state;
    /* paused ranks wait for their leader on purpose: a paused run is judged no hang; a pausing one's held ranks'
     * waits neither (hang_rank.held), and the pause's own wait is (hang_run.pausing_s) */
    const bool pausing = st == GRPO__RUN_STATE__RUN_PAUSING;
    const bool judged = st == GRPO__RUN_STATE__RUN_RUNNING || st == GRPO__RUN_STATE__RUN_WAITING ||
                        st == GRPO__RUN_STATE__RUN_STOPPING || pausing;
    const int n = judged ? c->nworkers : 0;
    struct hang_rank *r = xcalloc((size_t)(n ? n : 1), sizeof *r);
    struct hang_wait *last = xcalloc((size_t)(n ? n : 1), sizeof *last);
    double first_registered = 0;
    bool missing = false;
    for (int k = 0; k < n; k++) {
        const struct core_worker *w = c->workers[k];
        r[k].rank = k;
        r[k].layer = -1;
        r[k].host = c->rank_hosts && c->rank_hosts[k] ? c->rank_hosts[k] : "";
        if (!w) {
            r[k].presence = HANG_UNREGISTERED;
            missing = true;
            continue;
        }
        r[k].host = w->host;
        r[k].role = w->role;
        r[k].phase = w->phase;
        r[k].layer = w->layer;
        r[k].backward = w->backward;
        const Grpo__WorkerState ws = w->state;
        r[k].held = ws == GRPO__WORKER_STATE__WORKER_PAUSED;
        r[k].presence = ws == GRPO__WORKER_STATE__WORKER_STARTING || ws == GRPO__WORKER_STATE__WORKER_RUNNING ||
                                ws == GRPO__WORKER_STATE__WORKER_PAUSED
                            ? HANG_LIVE
                            : HANG_GONE;
        if (w->waiting) {
            r[k].waiting = true;
            hang_wait_of(&w->wait, now - w->wait_heard, &r[k].wait);
        }
        if (w->nrecent > 0) {
            hang_wait_of(&w->recent[w->nrecent - 1], 0, &last[k]);
            r[k].last = &last[k];
        }
        if (w->registered_at > 0 && (first_registered == 0 || w->registered_at < first_registered))
            first_registered = w->registered_at;
    }
    /* a wait as long as a few whole steps is no hang: a slow rank's generation, a long update the rollout ranks
     * wait through */
    const double step_s = metric_of(c, "timing_s/step");
    double min_wait = c->set.hang_wait_s > 0 ? c->set.hang_wait_s : 60;
    if (isfinite(step_s) && HANG_STEPS * step_s > min_wait)
        min_wait = HANG_STEPS * step_s;
    struct hang_run run = {.min_wait_s = min_wait};
    if (pausing && c->run.pause_asked > 0) {
        const double wall = c->start_wall + (now - c->start_mono);
        run.pausing_s = wall > c->run.pause_asked ? wall - c->run.pause_asked : 0;
    }
    if (missing && st == GRPO__RUN_STATE__RUN_WAITING && first_registered > 0) {
        const double wall = c->start_wall + (now - c->start_mono);
        run.waiting_for_ranks_s = wall > first_registered ? wall - first_registered : 0;
    }
    const int found = hang_analyse(r, n, &run, out, max);
    free(r);
    free(last);
    return found;
}

/* What to do about a hang of this kind. */
static const char *hang_knob(enum hang_kind k)
{
    switch (k) {
    case HANG_UNREGISTERED_RANK:
        return "look at that host: its grpo-worker may not have started, or cannot reach grpod (grpod.endpoint, "
               "grpod.secret_file)";
    case HANG_IO:
        return "look at the file system of the checkpoint (full, slow, a stale mount); grpoctl stacks RANK shows "
               "where the rank is";
    case HANG_MISMATCH:
        return "the ranks run different code paths: grpoctl trace RANK for each, grpoctl stacks; a bug to report "
               "with both";
    case HANG_LAGGARD:
        return "grpoctl stacks RANK (its native stack) and grpoctl trace RANK; trainer.hang_timeout_s and "
               "trainer.hang_action=stop end such a run on their own";
    case HANG_GRANT: return "grpoctl trace of the trainers' rank 0 (the dispatcher's rank); grpoctl stacks";
    case HANG_PAUSE:
        return "grpoctl stacks RANK and grpoctl trace RANK show where the rank is; grpoctl resume gives the pause up "
               "(the run goes on), grpoctl stop ends it at the next safe point; the findings after this one say "
               "why it does not come";
    default: return "grpoctl stacks and grpoctl trace RANK";
    }
}

/* The verdict into the Status (its strings in the arena): a hang first, then where the time goes. */
static void status_diagnosis(const struct core *c, double now, Grpo__Status *s, struct arena *a)
{
    struct diag_finding f[DIAG_MAX_FINDINGS];
    struct hang_finding h[HANG_MAX_FINDINGS];
    int nh = core_hang(c, now, h, HANG_MAX_FINDINGS);
    if (nh && h[0].kind == HANG_NONE)
        nh = 0;
    const int nd = core_diagnose(c, f, DIAG_MAX_FINDINGS), n = nh + nd;
    s->diagnosis = arena_alloc(a, (size_t)(n ? n : 1) * sizeof *s->diagnosis);
    Grpo__Finding *fs = arena_alloc(a, (size_t)(n ? n : 1) * sizeof *fs);
    for (int i = 0; i < nh; i++) {
        char kind[32];
        snprintf(kind, sizeof kind, "hang_%s", hang_kind_name(h[i].kind));
        grpo__finding__init(&fs[i]);
        fs[i].kind = arena_strdup(a, kind);
        fs[i].severity = TEXT("warn");
        fs[i].text = arena_strdup(a, h[i].text);
        fs[i].knob = TEXT(hang_knob(h[i].kind));
        fs[i].share = 1;
        s->diagnosis[i] = &fs[i];
    }
    fs += nh;
    for (int i = 0; i < nd; i++) {
        grpo__finding__init(&fs[i]);
        fs[i].kind = TEXT(diag_kind_name(f[i].kind));
        fs[i].severity = TEXT(diag_severity_name(f[i].severity));
        fs[i].text = arena_strdup(a, f[i].text);
        fs[i].knob = arena_strdup(a, f[i].knob);
        fs[i].share = f[i].share;
        s->diagnosis[nh + i] = &fs[i];
    }
    s->n_diagnosis = (size_t)n;
}

/* Whether a worker is listed first in a status of some workers: one that is not simply at work or done
 * (starting, suspect, lost, failed, reconnecting) is what a person looks for. */
static bool worker_notable(const struct core_worker *w)
{
    switch (core_worker_shown_state(w)) {
    case GRPO__WORKER_STATE__WORKER_RUNNING:
    case GRPO__WORKER_STATE__WORKER_PAUSED:
    case GRPO__WORKER_STATE__WORKER_STOPPED:
    case GRPO__WORKER_STATE__WORKER_FINISHED: return false;
    default: return true;
    }
}

Grpo__Status *core_status(const struct core *c, double now, struct arena *a)
{
    return core_status_some(c, now, a, -1, NULL);
}

Grpo__Status *core_status_some(const struct core *c, double now, struct arena *a, int max_workers, int *registered)
{
    Grpo__Status *s = arena_alloc(a, sizeof *s);
    grpo__status__init(s);
    s->state = c->run.state;
    s->reason = TEXT(c->run.reason);
    s->step = c->run.step;
    s->total_steps = c->run.total_steps;
    s->phase = c->run.phase;
    s->run_id = TEXT(c->run.id);
    s->uptime_s = now - c->start_mono;
    s->expected_workers = c->run.world;
    s->http_url = TEXT(c->set.http_url ? c->set.http_url : "");
    s->checkpoint_seq = c->run.checkpoint_seq;
    s->checkpoint_step = c->run.checkpoint_step;
    s->checkpoint_seq_done = c->run.checkpoint_seq_done;
    s->grpod_version = TEXT(GRPO_VERSION_STRING);
    s->pause_requested = c->run.pause;
    s->stop_requested = c->run.stop;
    const bool over = s->state == GRPO__RUN_STATE__RUN_FINISHED || s->state == GRPO__RUN_STATE__RUN_FAILED;
    s->job_end = over ? TEXT(c->run.reason) : TEXT(c->run.abort);
    s->run_started = c->run.started;
    s->throughput = NAN;
    s->reward = NAN;
    if (c->run.nhistory) {
        s->throughput = c->run.history[c->run.nhistory - 1].throughput;
        s->reward = c->run.history[c->run.nhistory - 1].reward;
    }
    int present = 0, notable = 0;
    for (int r = 0; r < c->nworkers; r++) {
        present += (c->workers[r] != NULL);
        notable += c->workers[r] && worker_notable(c->workers[r]);
    }
    if (registered)
        *registered = present;
    /* some workers (max_workers >= 0): the notable ones first, then the lowest ranks, listed by rank; a status of
     * 10,000 workers is megabytes, and building it holds grpod's loop (docs/scaling.md) */
    const int want = max_workers >= 0 && max_workers < present ? max_workers : present;
    const int take_notable = notable < want ? notable : want;
    int other = want - take_notable;
    s->workers = arena_alloc(a, (size_t)(want ? want : 1) * sizeof(Grpo__WorkerStatus *));
    Grpo__WorkerStatus *ws = arena_alloc(a, (size_t)(want ? want : 1) * sizeof *ws);
    int notable_left = take_notable;
    for (int r = 0; r < c->nworkers && (int)s->n_workers < want; r++) {
        const struct core_worker *w = c->workers[r];
        if (!w)
            continue;
        if (want < present) {
            if (worker_notable(w) ? notable_left <= 0 : other <= 0)
                continue;
            if (worker_notable(w))
                notable_left--;
            else
                other--;
        }
        worker_status(&ws[s->n_workers], w, now, a);
        s->workers[s->n_workers] = &ws[s->n_workers];
        s->n_workers++;
    }
    run_metrics(c, s, a);
    status_diagnosis(c, now, s, a);
    s->n_history = (size_t)c->run.nhistory;
    s->history = arena_alloc(a, (s->n_history ? s->n_history : 1) * sizeof(Grpo__HistoryPoint *));
    Grpo__HistoryPoint *hs = arena_alloc(a, (s->n_history ? s->n_history : 1) * sizeof *hs);
    for (int i = 0; i < c->run.nhistory; i++) {
        Grpo__HistoryPoint *h = &hs[i];
        grpo__history_point__init(h);
        h->step = c->run.history[i].step;
        h->reward = c->run.history[i].reward;
        h->throughput = c->run.history[i].throughput;
        h->time = c->run.history[i].time;
        s->history[i] = h;
    }
    s->n_events = (size_t)c->nevents;
    s->events = arena_alloc(a, (s->n_events ? s->n_events : 1) * sizeof(Grpo__Event *));
    Grpo__Event *es = arena_alloc(a, (s->n_events ? s->n_events : 1) * sizeof *es);
    for (int i = 0; i < c->nevents; i++) {
        Grpo__Event *e = &es[i];
        grpo__event__init(e);
        e->time = c->events[i].time;
        e->text = TEXT(c->events[i].text);
        s->events[i] = e;
    }
    return s;
}

/* ---- Prometheus text format ---- */

struct text {
    char *buf;
    size_t len, cap;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
    if (!t->buf) {
        t->cap = 4096;
        t->buf = xmalloc(t->cap);
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        t->cap = t->cap * 2 + (size_t)(n > 0 ? n : 0) + 256;
        t->buf = xrealloc(t->buf, t->cap);
    }
}

/* A label value with \, " and newline escaped, as the exposition format wants. */
static const char *label(const char *s, char *out, size_t len)
{
    size_t o = 0;
    for (; *s && o + 3 < len; s++) {
        if (*s == '\\' || *s == '"') {
            out[o++] = '\\';
            out[o++] = *s;
        } else if (*s == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *s;
        }
    }
    out[o] = 0;
    return out;
}

static void put_value(struct text *t, double v)
{
    if (isnan(v))
        put(t, "NaN\n");
    else if (isinf(v))
        put(t, v > 0 ? "+Inf\n" : "-Inf\n");
    else
        put(t, "%.17g\n", v);
}

static void family(struct text *t, const char *name, const char *type, const char *help)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void worker_metrics(const struct core *c, struct text *t, double now)
{
    char host[600];
    family(t, "grpod_worker_up", "gauge",
           "1 while the worker is at work (starting, running, paused; suspect ones too): not lost, not ended.");
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        if (w) {
            bool up = w->state == GRPO__WORKER_STATE__WORKER_STARTING ||
                      w->state == GRPO__WORKER_STATE__WORKER_RUNNING || w->state == GRPO__WORKER_STATE__WORKER_PAUSED;
            put(t, "grpod_worker_up{rank=\"%d\",host=\"%s\",role=\"%s\",state=\"%s\"} %d\n", w->rank,
                label(w->host, host, sizeof host), core_role_name(w->role),
                core_worker_state_name(core_worker_shown_state(w)), up);
        }
    }
    family(t, "grpod_worker_heartbeat_age_seconds", "gauge", "Seconds since the worker's last heartbeat.");
    for (int r = 0; r < c->nworkers; r++)
        if (c->workers[r])
            put(t, "grpod_worker_heartbeat_age_seconds{rank=\"%d\"} %.3f\n", r, now - c->workers[r]->last_seen);
    family(t, "grpod_worker_step", "gauge", "Training steps the worker has completed.");
    for (int r = 0; r < c->nworkers; r++)
        if (c->workers[r])
            put(t, "grpod_worker_step{rank=\"%d\"} %" PRId64 "\n", r, c->workers[r]->step);
    family(t, "grpod_worker_idle_ratio", "gauge", "Fraction of recent time the worker spent idle (0..1).");
    for (int r = 0; r < c->nworkers; r++)
        if (c->workers[r])
            put(t, "grpod_worker_idle_ratio{rank=\"%d\"} %.4f\n", r, c->workers[r]->idle_fraction);
    family(t, "grpod_worker_phase_seconds", "gauge", "Seconds the worker spent in each phase of its last step.");
    for (int r = 0; r < c->nworkers; r++)
        for (int p = 1; p < GRPO_NUM_PHASES && c->workers[r]; p++)
            if (c->workers[r]->timings[p] > 0)
                put(t, "grpod_worker_phase_seconds{rank=\"%d\",phase=\"%s\"} %.6f\n", r,
                    core_phase_name((Grpo__Phase)p), c->workers[r]->timings[p]);
}

char *core_metrics_text(const struct core *c, double now)
{
    struct text t = {0};
    char buf[600];
    family(&t, "grpod_uptime_seconds", "gauge", "Seconds since grpod started.");
    put(&t, "grpod_uptime_seconds %.3f\n", now - c->start_mono);
    family(&t, "grpod_run_info", "gauge", "The current run (always 1; its id is a label).");
    put(&t, "grpod_run_info{run_id=\"%s\"} 1\n", label(c->run.id, buf, sizeof buf));
    family(&t, "grpod_run_state", "gauge", "1 for the run's current state, 0 for the others.");
    static const Grpo__RunState states[] = {GRPO__RUN_STATE__RUN_WAITING,  GRPO__RUN_STATE__RUN_RUNNING,
                                            GRPO__RUN_STATE__RUN_PAUSING,  GRPO__RUN_STATE__RUN_PAUSED,
                                            GRPO__RUN_STATE__RUN_STOPPING, GRPO__RUN_STATE__RUN_FINISHED,
                                            GRPO__RUN_STATE__RUN_FAILED};
    for (size_t i = 0; i < sizeof states / sizeof states[0]; i++)
        put(&t, "grpod_run_state{state=\"%s\"} %d\n", core_run_state_name(states[i]), c->run.state == states[i]);
    family(&t, "grpod_run_step", "gauge", "Training steps completed in the run.");
    put(&t, "grpod_run_step %" PRId64 "\n", c->run.step);
    family(&t, "grpod_run_total_steps", "gauge", "Training steps the run will take (0: not known yet).");
    put(&t, "grpod_run_total_steps %" PRId64 "\n", c->run.total_steps);
    family(&t, "grpod_run_checkpoint_step", "gauge", "Newest step every worker has a checkpoint of (-1: none).");
    put(&t, "grpod_run_checkpoint_step %" PRId64 "\n", c->run.checkpoint_step);
    family(&t, "grpod_workers_expected", "gauge", "Workers the run's placement expects.");
    put(&t, "grpod_workers_expected %d\n", c->run.world);
    family(&t, "grpod_workers", "gauge",
           "Registered workers by state (suspect: no heartbeat for two intervals; lost: none for "
           "grpod.heartbeat_timeout_s).");
    for (int s = GRPO__WORKER_STATE__WORKER_STARTING; s <= GRPO__WORKER_STATE__WORKER_SUSPECT; s++) {
        int n = 0;
        for (int r = 0; r < c->nworkers; r++)
            n += c->workers[r] && (int)core_worker_shown_state(c->workers[r]) == s;
        put(&t, "grpod_workers{state=\"%s\"} %d\n", core_worker_state_name((Grpo__WorkerState)s), n);
    }
    family(&t, "grpod_run_hang", "gauge",
           "1 for each kind of hang grpoctl diagnose finds now (a rank has waited grpod.hang_wait_s in one place, "
           "start-up has waited that long for a rank to register, or a pause for a rank to reach a safe point), 0 "
           "for the others.");
    {
        struct hang_finding h[HANG_MAX_FINDINGS];
        const int nh = core_hang(c, now, h, HANG_MAX_FINDINGS);
        static const enum hang_kind kinds[] = {
            HANG_UNREGISTERED_RANK, HANG_IO, HANG_MISMATCH, HANG_LAGGARD, HANG_GRANT, HANG_STUCK, HANG_PAUSE};
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            int found = 0;
            for (int i = 0; i < nh; i++)
                found |= h[i].kind == kinds[k];
            put(&t, "grpod_run_hang{kind=\"%s\"} %d\n", hang_kind_name(kinds[k]), found);
        }
    }
    family(&t, "grpod_worker_suspects_total", "counter", "Times a worker became suspect (missed heartbeats).");
    put(&t, "grpod_worker_suspects_total %" PRIu64 "\n", c->counters.suspects);
    family(&t, "grpod_worker_losses_total", "counter", "Times a worker was marked lost.");
    put(&t, "grpod_worker_losses_total %" PRIu64 "\n", c->counters.losses);
    family(&t, "grpod_loop_stall_seconds_total", "counter",
           "Seconds grpod's own loop did not run (a loaded or stopped host), not counted as any worker's silence.");
    put(&t, "grpod_loop_stall_seconds_total %.3f\n", c->stalled_s);
    family(&t, "grpod_journal_saves_total", "counter", "Times the run's state file was written whole (durably).");
    put(&t, "grpod_journal_saves_total %" PRIu64 "\n", c->counters.journal_saves);
    family(&t, "grpod_registrations_repeated_total", "counter",
           "Registrations a process asked for again before its first heartbeat (it never heard the answer): "
           "answered with the one it has.");
    put(&t, "grpod_registrations_repeated_total %" PRIu64 "\n", c->counters.registrations_repeated);
    family(&t, "grpod_journal_seconds_total", "counter",
           "Seconds grpod's loop spent writing state files whole (building the text, writing, syncing).");
    put(&t, "grpod_journal_seconds_total %.3f\n", c->counters.journal_seconds);
    family(&t, "grpod_journal_records_total", "counter",
           "Records appended to the journal's run.log (a registration each, durably) instead of a whole state file.");
    put(&t, "grpod_journal_records_total %" PRIu64 "\n", c->counters.journal_records);
    family(&t, "grpod_journal_bytes_total", "counter",
           "Bytes written to the journal: the state files and run.log's records (state), events.log's lines (events).");
    put(&t, "grpod_journal_bytes_total{file=\"state\"} %" PRIu64 "\n", c->counters.journal_bytes);
    put(&t, "grpod_journal_bytes_total{file=\"events\"} %" PRIu64 "\n", c->counters.journal_event_bytes);
    worker_metrics(c, &t, now);
    /* the trainer's own numbers, under their verl names */
    family(&t, "grpo_run_metric", "gauge", "The run's newest metrics under their verl names (critic/score/mean, ...).");
    for (int r = 0; r < c->nworkers; r++) {
        const struct core_worker *w = c->workers[r];
        for (int i = 0; w && i < w->nmetrics; i++) {
            bool earlier = false; /* reported by a lower rank already */
            for (int q = 0; q < r && !earlier; q++)
                for (int k = 0; c->workers[q] && k < c->workers[q]->nmetrics && !earlier; k++)
                    earlier = strcmp(c->workers[q]->metrics[k].name, w->metrics[i].name) == 0;
            if (earlier)
                continue;
            put(&t, "grpo_run_metric{name=\"%s\"} ", label(w->metrics[i].name, buf, sizeof buf));
            put_value(&t, w->metrics[i].value);
        }
    }
    family(&t, "grpod_requests_total", "counter", "Control requests answered, by type.");
    static const Grpo__Envelope__BodyCase kinds[] = {GRPO__ENVELOPE__BODY_REGISTER, GRPO__ENVELOPE__BODY_HEARTBEAT,
                                                     GRPO__ENVELOPE__BODY_COMMAND, GRPO__ENVELOPE__BODY_STATUS_REQUEST,
                                                     GRPO__ENVELOPE__BODY_METRICS_REQUEST};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        put(&t, "grpod_requests_total{type=\"%s\"} %" PRIu64 "\n", protocol_body_name(kinds[i]),
            c->counters.requests[kinds[i]]);
    family(&t, "grpod_rejected_requests_total", "counter", "Requests refused or dropped, by reason.");
    put(&t, "grpod_rejected_requests_total{reason=\"malformed\"} %" PRIu64 "\n", c->counters.malformed);
    put(&t, "grpod_rejected_requests_total{reason=\"bad_version\"} %" PRIu64 "\n", c->counters.bad_version);
    put(&t, "grpod_rejected_requests_total{reason=\"auth\"} %" PRIu64 "\n", c->counters.auth_failed);
    put(&t, "grpod_rejected_requests_total{reason=\"replay\"} %" PRIu64 "\n", c->counters.replayed);
    put(&t, "grpod_rejected_requests_total{reason=\"session\"} %" PRIu64 "\n", c->counters.unknown_session);
    put(&t, "grpod_rejected_requests_total{reason=\"invalid\"} %" PRIu64 "\n", c->counters.invalid);
    put(&t, "grpod_rejected_requests_total{reason=\"unexpected\"} %" PRIu64 "\n", c->counters.unexpected);
    put(&t, "grpod_rejected_requests_total{reason=\"refused\"} %" PRIu64 "\n", c->counters.refused);
    family(&t, "grpod_failing_connections_closed_total", "counter",
           "Connections closed after " GRPOD_STR(GRPOD_MAX_FAILED_ATTEMPTS) " failed requests, by endpoint kind.");
    put(&t, "grpod_failing_connections_closed_total{endpoint=\"tcp\"} %" PRIu64 "\n", c->counters.closed_failing_tcp);
    put(&t, "grpod_failing_connections_closed_total{endpoint=\"http\"} %" PRIu64 "\n", c->counters.closed_failing_http);
    return t.buf;
}
