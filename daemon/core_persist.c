/* The run as grpod journals it: one JSON document with the run, its workers
 * and recent events. Loading brings the workers back as RECONNECTING with a
 * fresh grace period, so a grpod restart does not count as their silence. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/check.h"
#include "core.h"

#define STATE_FORMAT 1

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static double get_num(const json_t *o, const char *key, double def)
{
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : json_is_null(v) ? NAN : def;
}

static long long get_int(const json_t *o, const char *key, long long def)
{
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : def;
}

static void get_str(const json_t *o, const char *key, char *out, size_t len)
{
    const json_t *v = json_object_get(o, key);
    snprintf(out, len, "%s", json_is_string(v) ? json_string_value(v) : "");
}

/* 64-bit tokens travel as hex text: JSON integers are signed and readers vary. */
static json_t *hex64(uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%016" PRIx64, v);
    return json_string(buf);
}

static uint64_t get_hex64(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? strtoull(json_string_value(v), NULL, 16) : 0;
}

static json_t *worker_json(const struct core_worker *w)
{
    json_t *o = json_object(), *dev = json_array(), *met = json_object();
    for (int i = 0; i < w->ndevices; i++)
        json_array_append_new(dev, json_string(w->devices[i]));
    for (int i = 0; i < w->nmetrics; i++)
        json_object_set_new(met, w->metrics[i].name, num(w->metrics[i].value));
    json_object_set_new(o, "rank", json_integer(w->rank));
    json_object_set_new(o, "pid", json_integer(w->pid));
    json_object_set_new(o, "host", json_string(w->host));
    json_object_set_new(o, "devices", dev);
    json_object_set_new(o, "capabilities", json_string(w->capabilities));
    json_object_set_new(o, "role", json_integer(w->role));
    json_object_set_new(o, "dp",
                        json_pack("[iiiiii]", w->dp_rank, w->dp_size, w->tp_rank, w->tp_size, w->pp_rank, w->pp_size));
    json_object_set_new(o, "incarnation", hex64(w->incarnation));
    json_object_set_new(o, "state", json_integer(w->state));
    json_object_set_new(o, "registered_at", json_real(w->registered_at));
    json_object_set_new(o, "step", json_integer(w->step));
    json_object_set_new(o, "total_steps", json_integer(w->total_steps));
    json_object_set_new(o, "checkpoint_seq_done", hex64(w->checkpoint_seq_done));
    json_object_set_new(o, "checkpoint_step", json_integer(w->checkpoint_step));
    json_object_set_new(o, "error", json_string(w->error));
    json_object_set_new(o, "metrics", met);
    /* the diagnosis' ledger, so a finished run keeps its verdict across a restart of grpod */
    json_object_set_new(o, "ledger",
                        json_pack("[ffff]", w->run_idle_s, w->run_busy_s, w->peak_rss_gb, w->host_memory_gb));
    json_t *ph = json_array();
    for (int p = 0; p < GRPO_NUM_PHASES; p++)
        json_array_append_new(ph, json_real(w->timings[p]));
    json_object_set_new(o, "phase_s", ph);
    return o;
}

/* The run's fields a registration changes besides its worker (core_save_record); core_save_json starts from them */
static json_t *run_scalars(const struct core *c)
{
    json_t *run = json_object();
    json_object_set_new(run, "state", json_integer(c->run.state));
    json_object_set_new(run, "reason", json_string(c->run.reason));
    json_object_set_new(run, "abort", json_string(c->run.abort));
    json_object_set_new(run, "abort_at", json_real(c->run.abort_at));
    json_object_set_new(run, "step", json_integer(c->run.step));
    json_object_set_new(run, "total_steps", json_integer(c->run.total_steps));
    json_object_set_new(run, "checkpoint_seq_done", hex64(c->run.checkpoint_seq_done));
    json_object_set_new(run, "checkpoint_step", json_integer(c->run.checkpoint_step));
    return run;
}

char *core_save_json(const struct core *c)
{
    json_t *root = json_object(), *run = run_scalars(c), *workers = json_array(), *hist = json_array(),
           *events = json_array();
    json_object_set_new(root, "format", json_integer(STATE_FORMAT));
    json_object_set_new(root, "seq", json_integer((json_int_t)c->journal_seq)); /* the records it holds */
    json_object_set_new(run, "id", json_string(c->run.id));
    json_object_set_new(run, "config_digest", hex64(c->run.config_digest));
    char pk[2 * sizeof c->run.plane_key + 1];
    for (size_t i = 0; i < sizeof c->run.plane_key; i++)
        snprintf(pk + 2 * i, 3, "%02x", c->run.plane_key[i]);
    json_object_set_new(run, "plane_key", json_string(pk));
    json_object_set_new(run, "plane_epoch", hex64(c->run.plane_epoch));
    json_object_set_new(run, "launch", hex64(c->run.launch));
    json_t *retired = json_array();
    for (int i = 0; i < c->run.nretired; i++)
        json_array_append_new(retired, hex64(c->run.retired[i]));
    json_object_set_new(run, "retired_launches", retired);
    if (c->run.config)
        json_object_set_new(run, "config", json_string(c->run.config));
    json_object_set_new(run, "world", json_integer(c->run.world));
    json_object_set_new(run, "pause", json_boolean(c->run.pause));
    json_object_set_new(run, "stop", json_boolean(c->run.stop));
    json_object_set_new(run, "stop_by", json_string(c->run.stop_by));
    json_object_set_new(run, "checkpoint_seq", hex64(c->run.checkpoint_seq));
    json_object_set_new(run, "started", json_real(c->run.started));
    for (int i = 0; i < c->run.nhistory; i++) {
        const struct core_history_point *h = &c->run.history[i];
        json_array_append_new(
            hist, json_pack("[Iooo]", (json_int_t)h->step, num(h->reward), num(h->throughput), num(h->time)));
    }
    json_object_set_new(run, "history", hist);
    json_object_set_new(root, "run", run);
    for (int r = 0; r < c->nworkers; r++)
        if (c->workers[r])
            json_array_append_new(workers, worker_json(c->workers[r]));
    json_object_set_new(root, "workers", workers);
    for (int i = 0; i < c->nevents; i++)
        json_array_append_new(events, json_pack("[fs]", c->events[i].time, c->events[i].text));
    json_object_set_new(root, "events", events);
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(root);
    return CHECK_ALLOC(text);
}

char *core_save_record(struct core *c)
{
    const struct core_worker *w =
        c->record_rank >= 0 && c->record_rank < c->nworkers ? c->workers[c->record_rank] : NULL;
    if (!w)
        return NULL;
    json_t *root = json_object(), *events = json_array();
    json_object_set_new(root, "seq", json_integer((json_int_t)++c->journal_seq));
    json_object_set_new(root, "run", run_scalars(c));
    json_object_set_new(root, "worker", worker_json(w));
    for (int i = c->nevents - (c->events_new < c->nevents ? c->events_new : c->nevents); i < c->nevents; i++)
        json_array_append_new(events, json_pack("[fs]", c->events[i].time, c->events[i].text));
    json_object_set_new(root, "events", events);
    json_t *hist = json_array();
    for (int i = c->run.nhistory - (c->history_new < c->run.nhistory ? c->history_new : c->run.nhistory);
         i < c->run.nhistory; i++) {
        const struct core_history_point *h = &c->run.history[i];
        json_array_append_new(
            hist, json_pack("[Iooo]", (json_int_t)h->step, num(h->reward), num(h->throughput), num(h->time)));
    }
    json_object_set_new(root, "history", hist);
    char *text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS); /* one line: the journal's records are lines */
    json_decref(root);
    return CHECK_ALLOC(text);
}

static int load_worker(struct core *c, const json_t *o, double now, char *err, size_t errlen);

int core_apply_record(struct core *c, const char *line, double now, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loads(line, 0, &je);
    if (!root) {
        snprintf(err, errlen, "a record that is not JSON (%s)", je.text);
        return -1;
    }
    const json_t *run = json_object_get(root, "run"), *wj = json_object_get(root, "worker");
    const long long seq = get_int(root, "seq", -1), rank = get_int(wj, "rank", -1);
    int rc = -1;
    if (seq < 0 || !json_is_object(run) || !json_is_object(wj)) {
        snprintf(err, errlen, "a record without its number, run or worker");
        goto out;
    }
    if ((uint64_t)seq <= c->journal_seq) { /* the state file holds it already */
        rc = 0;
        goto out;
    }
    if (rank < 0 || rank >= c->nworkers) {
        snprintf(err, errlen, "record %lld: rank %lld is outside the run's %d ranks", seq, rank, c->nworkers);
        goto out;
    }
    struct core_worker *old = c->workers[rank];
    c->workers[rank] = NULL;
    if (load_worker(c, wj, now, err, errlen) != 0) {
        c->workers[rank] = old;
        goto out;
    }
    if (old) {
        core_worker_release(old);
        free(old);
    }
    long long st = get_int(run, "state", c->run.state);
    if (st >= 0 && st <= GRPO__RUN_STATE__RUN_PAUSING)
        c->run.state = (Grpo__RunState)st;
    get_str(run, "reason", c->run.reason, sizeof c->run.reason);
    get_str(run, "abort", c->run.abort, sizeof c->run.abort);
    c->run.abort_at = get_num(run, "abort_at", c->run.abort_at);
    c->run.step = get_int(run, "step", c->run.step);
    c->run.total_steps = get_int(run, "total_steps", c->run.total_steps);
    c->run.checkpoint_seq_done = get_hex64(run, "checkpoint_seq_done");
    c->run.checkpoint_step = get_int(run, "checkpoint_step", c->run.checkpoint_step);
    const json_t *events = json_object_get(root, "events");
    for (size_t i = 0; i < json_array_size(events); i++) {
        const json_t *e = json_array_get(events, i);
        if (json_is_string(json_array_get(e, 1)))
            core_add_event_record(c, json_number_value(json_array_get(e, 0)), json_string_value(json_array_get(e, 1)));
    }
    const json_t *hist = json_object_get(root, "history");
    for (size_t i = 0; i < json_array_size(hist); i++) {
        const json_t *h = json_array_get(hist, i);
        const struct core_history_point p = {
            json_integer_value(json_array_get(h, 0)),
            json_is_number(json_array_get(h, 1)) ? json_number_value(json_array_get(h, 1)) : NAN,
            json_is_number(json_array_get(h, 2)) ? json_number_value(json_array_get(h, 2)) : NAN,
            json_is_number(json_array_get(h, 3)) ? json_number_value(json_array_get(h, 3)) : 0};
        core_add_history_point(c, &p);
    }
    c->journal_seq = (uint64_t)seq;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

static int load_worker(struct core *c, const json_t *o, double now, char *err, size_t errlen)
{
    long long rank = get_int(o, "rank", -1);
    if (rank < 0 || rank >= c->nworkers) {
        snprintf(err, errlen, "worker rank %lld is outside the run's %d ranks", rank, c->nworkers);
        return -1;
    }
    if (c->workers[rank]) {
        snprintf(err, errlen, "worker rank %lld appears twice", rank);
        return -1;
    }
    struct core_worker *w = c->workers[rank] = xcalloc(1, sizeof *w);
    w->rank = (int)rank;
    w->pid = (int)get_int(o, "pid", 0);
    get_str(o, "host", w->host, sizeof w->host);
    get_str(o, "capabilities", w->capabilities, sizeof w->capabilities);
    get_str(o, "error", w->error, sizeof w->error);
    const json_t *dev = json_object_get(o, "devices");
    for (size_t i = 0; i < json_array_size(dev) && w->ndevices < CORE_MAX_DEVICES; i++)
        if (json_is_string(json_array_get(dev, i)))
            snprintf(w->devices[w->ndevices++], sizeof w->devices[0], "%s", json_string_value(json_array_get(dev, i)));
    long long role = get_int(o, "role", 0);
    w->role = role >= 0 && role <= GRPO__ROLE__ROLE_IDLE ? (Grpo__Role)role : GRPO__ROLE__ROLE_UNASSIGNED;
    int d[6] = {0, 1, 0, 1, 0, 1};
    if (json_unpack((json_t *)json_object_get(o, "dp"), "[iiiiii]", &d[0], &d[1], &d[2], &d[3], &d[4], &d[5]) != 0) {
        snprintf(err, errlen, "worker rank %lld has no parallel coordinates", rank);
        return -1;
    }
    w->dp_rank = d[0], w->dp_size = d[1], w->tp_rank = d[2], w->tp_size = d[3], w->pp_rank = d[4], w->pp_size = d[5];
    w->incarnation = get_hex64(o, "incarnation");
    long long st = get_int(o, "state", GRPO__WORKER_STATE__WORKER_RUNNING);
    w->state = st >= 0 && st <= GRPO__WORKER_STATE__WORKER_RECONNECTING ? (Grpo__WorkerState)st
                                                                        : GRPO__WORKER_STATE__WORKER_RUNNING;
    /* those that were alive get a fresh grace period to find the restarted grpod */
    if (w->state != GRPO__WORKER_STATE__WORKER_STOPPED && w->state != GRPO__WORKER_STATE__WORKER_FINISHED &&
        w->state != GRPO__WORKER_STATE__WORKER_FAILED && w->state != GRPO__WORKER_STATE__WORKER_LOST)
        w->state = GRPO__WORKER_STATE__WORKER_RECONNECTING;
    w->last_seen = now; /* a fresh grace period */
    w->stall_seen = c->stalled_s;
    w->registered_at = get_num(o, "registered_at", 0);
    w->step = get_int(o, "step", 0);
    w->total_steps = get_int(o, "total_steps", 0);
    w->checkpoint_seq_done = get_hex64(o, "checkpoint_seq_done");
    w->checkpoint_step = get_int(o, "checkpoint_step", -1);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(o, "metrics"), name, v)
    {
        if (w->nmetrics == CORE_MAX_METRICS)
            break;
        snprintf(w->metrics[w->nmetrics].name, CORE_NAME_MAX, "%s", name);
        w->metrics[w->nmetrics++].value = json_is_number(v) ? json_number_value(v) : NAN;
    }
    const json_t *ledger = json_object_get(o, "ledger"); /* absent in an older grpod's state file */
    double *lv[] = {&w->run_idle_s, &w->run_busy_s, &w->peak_rss_gb, &w->host_memory_gb};
    for (size_t i = 0; i < sizeof lv / sizeof lv[0]; i++) {
        const json_t *x = json_array_get(ledger, i);
        *lv[i] = json_is_number(x) && json_number_value(x) >= 0 ? json_number_value(x) : 0;
    }
    const json_t *ph = json_object_get(o, "phase_s");
    for (int p = 0; p < GRPO_NUM_PHASES; p++) {
        const json_t *x = json_array_get(ph, (size_t)p);
        w->timings[p] = json_is_number(x) && json_number_value(x) >= 0 ? json_number_value(x) : 0;
    }
    return 0;
}

int core_load_json(struct core *c, const char *text, double now, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) {
        snprintf(err, errlen, "not JSON (line %d: %s)", je.line, je.text);
        return -1;
    }
    const json_t *run = json_object_get(root, "run");
    if (get_int(root, "format", 0) != STATE_FORMAT || !json_is_object(run)) {
        snprintf(err, errlen, "unknown state format %lld (this grpod reads format %d)", get_int(root, "format", 0),
                 STATE_FORMAT);
        json_decref(root);
        return -1;
    }
    struct core_run saved_run = c->run;
    struct placement_spec saved_place = c->place;
    struct core_run *r = &c->run;
    memset(r, 0, sizeof *r);
    get_str(run, "id", r->id, sizeof r->id);
    long long st = get_int(run, "state", 0);
    r->state = st >= 0 && st <= GRPO__RUN_STATE__RUN_PAUSING ? (Grpo__RunState)st : GRPO__RUN_STATE__RUN_WAITING;
    get_str(run, "reason", r->reason, sizeof r->reason);
    get_str(run, "abort", r->abort, sizeof r->abort);
    r->abort_at = get_num(run, "abort_at", 0);
    r->step = get_int(run, "step", 0);
    r->total_steps = get_int(run, "total_steps", 0);
    r->config_digest = get_hex64(run, "config_digest");
    /* the run's data-plane key: a journal without one (an older grpod's) keeps the fresh key of this grpod */
    const char *pk = json_string_value(json_object_get(run, "plane_key"));
    if (pk && strlen(pk) == 2 * sizeof r->plane_key && strspn(pk, "0123456789abcdef") == strlen(pk)) {
        for (size_t i = 0; i < sizeof r->plane_key; i++) {
            const char two[3] = {pk[2 * i], pk[2 * i + 1], 0};
            r->plane_key[i] = (uint8_t)strtoul(two, NULL, 16);
        }
    } else {
        memcpy(r->plane_key, saved_run.plane_key, sizeof r->plane_key);
    }
    /* its epoch and launch (an older journal: epoch 1, the launch learned from the next registration) */
    r->plane_epoch = get_hex64(run, "plane_epoch");
    if (!r->plane_epoch)
        r->plane_epoch = 1;
    r->launch = get_hex64(run, "launch");
    const json_t *retired = json_object_get(run, "retired_launches");
    for (size_t i = 0; json_is_array(retired) && i < json_array_size(retired) && r->nretired < CORE_RETIRED; i++) {
        const char *h = json_string_value(json_array_get(retired, i));
        if (h)
            r->retired[r->nretired++] = strtoull(h, NULL, 16);
    }
    long long world = get_int(run, "world", 0);
    r->pause = json_is_true(json_object_get(run, "pause"));
    r->stop = json_is_true(json_object_get(run, "stop"));
    get_str(run, "stop_by", r->stop_by, sizeof r->stop_by); /* an older grpod's journal has none: "operator" */
    r->checkpoint_seq = get_hex64(run, "checkpoint_seq");
    r->checkpoint_seq_done = get_hex64(run, "checkpoint_seq_done");
    r->checkpoint_step = get_int(run, "checkpoint_step", -1);
    r->started = get_num(run, "started", 0);
    const json_t *hist = json_object_get(run, "history");
    for (size_t i = 0; i < json_array_size(hist) && r->nhistory < CORE_HISTORY; i++) {
        const json_t *h = json_array_get(hist, i);
        struct core_history_point *p = &r->history[r->nhistory++];
        p->step = json_integer_value(json_array_get(h, 0));
        p->reward = json_is_number(json_array_get(h, 1)) ? json_number_value(json_array_get(h, 1)) : NAN;
        p->throughput = json_is_number(json_array_get(h, 2)) ? json_number_value(json_array_get(h, 2)) : NAN;
        p->time = json_is_number(json_array_get(h, 3)) ? json_number_value(json_array_get(h, 3)) : 0;
    }
    if (!r->id[0] || world < 0 || world > CORE_MAX_WORKERS) {
        snprintf(err, errlen, "run has no id or an impossible world size %lld", world);
        goto fail;
    }
    core_free_workers(c);
    r->world = (int)world;
    if (world > 0) {
        c->workers = xcalloc((size_t)world, sizeof(struct core_worker *));
        c->nworkers = (int)world;
    }
    const json_t *workers = json_object_get(root, "workers");
    for (size_t i = 0; i < json_array_size(workers); i++)
        if (load_worker(c, json_array_get(workers, i), now, err, errlen) != 0)
            goto fail;
    /* the run's configuration (its first rank's): a replacement takes it, and the layout follows it */
    const json_t *config = json_object_get(run, "config");
    if (json_is_string(config)) {
        char why[512];
        if (core_set_run_config(c, json_string_value(config), why, sizeof why) != 0) {
            snprintf(err, errlen, "%s", why);
            goto fail;
        }
    }
    c->nevents = 0;
    const json_t *events = json_object_get(root, "events");
    for (size_t i = 0; i < json_array_size(events); i++) {
        const json_t *e = json_array_get(events, i);
        if (json_is_string(json_array_get(e, 1)))
            core_add_event_record(c, json_number_value(json_array_get(e, 0)), json_string_value(json_array_get(e, 1)));
    }
    c->journal_seq = (uint64_t)get_int(root, "seq", 0);
    c->record_rank = -1;
    c->events_new = c->history_new = 0;
    free(saved_run.config);
    json_decref(root);
    c->dirty = false;
    c->dirty_urgent = false;
    return 0;
fail:
    json_decref(root);
    core_free_workers(c);
    free(c->run.config);
    c->run = saved_run;
    c->place = saved_place;
    return -1;
}
