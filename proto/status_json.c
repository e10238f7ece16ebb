#include "proto/status_json.h"

#include <math.h>

#include <jansson.h>

#include "common/check.h"
#include "proto/names.h"

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *metrics_json(Grpo__Metric **m, size_t n)
{
    json_t *o = json_object();
    for (size_t i = 0; i < n; i++)
        json_object_set_new(o, m[i]->name, num(m[i]->value));
    return o;
}

json_t *status_flight_json(const Grpo__FlightEntry *e)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer((json_int_t)e->id));
    json_object_set_new(o, "kind", json_string(e->kind));
    json_object_set_new(o, "op", json_string(e->op));
    json_object_set_new(o, "group", json_string(e->group));
    json_object_set_new(o, "members", json_string(e->members));
    json_object_set_new(o, "group_size", json_integer(e->group_size));
    json_object_set_new(o, "seq", json_integer((json_int_t)e->seq));
    json_object_set_new(o, "bytes", json_integer((json_int_t)e->bytes));
    json_object_set_new(o, "peer", json_integer(e->peer));
    json_object_set_new(o, "phase", json_string(core_phase_name(e->phase)));
    json_object_set_new(o, "layer", json_integer(e->layer));
    json_object_set_new(o, "pass", json_string(e->layer < 0 ? "" : e->backward ? "backward" : "forward"));
    json_object_set_new(o, "began", num(e->began));
    json_object_set_new(o, "seconds", num(e->seconds));
    json_object_set_new(o, "open", json_boolean(e->open));
    json_object_set_new(o, "failed", json_boolean(e->failed));
    return o;
}

static json_t *worker_json(const Grpo__WorkerStatus *w)
{
    json_t *o = json_object(), *dev = json_array(), *tim = json_object();
    for (size_t i = 0; i < w->n_devices; i++)
        json_array_append_new(dev, json_string(w->devices[i]));
    for (size_t i = 0; i < w->n_timings; i++)
        json_object_set_new(tim, core_phase_name(w->timings[i]->phase), num(w->timings[i]->seconds));
    json_object_set_new(o, "rank", json_integer(w->rank));
    json_object_set_new(o, "host", json_string(w->host));
    json_object_set_new(o, "pid", json_integer(w->pid));
    json_object_set_new(o, "role", json_string(core_role_name(w->role)));
    json_object_set_new(o, "state", json_string(core_worker_state_name(w->worker_state)));
    json_object_set_new(o, "last_heartbeat_age_s", num(w->last_heartbeat_age_s));
    json_object_set_new(o, "idle_fraction", num(w->idle_fraction));
    json_object_set_new(o, "phase", json_string(core_phase_name(w->phase)));
    json_object_set_new(o, "step", json_integer(w->step));
    json_object_set_new(o, "dp_rank", json_integer(w->dp_rank));
    json_object_set_new(o, "tp_rank", json_integer(w->tp_rank));
    json_object_set_new(o, "pp_rank", json_integer(w->pp_rank));
    json_object_set_new(o, "devices", dev);
    json_object_set_new(o, "metrics", metrics_json(w->metrics, w->n_metrics));
    json_object_set_new(o, "timings_s", tim);
    json_object_set_new(o, "checkpoint_step", json_integer(w->checkpoint_step));
    json_object_set_new(o, "error", json_string(w->error));
    json_object_set_new(o, "busy_seconds", num(w->busy_seconds));
    json_object_set_new(o, "idle_seconds", num(w->idle_seconds));
    json_t *tl = json_array(); /* [start, phase] pairs, oldest first */
    for (size_t i = 0; i < w->n_timeline; i++)
        json_array_append_new(tl, json_pack("[fs]", w->timeline[i]->start, core_phase_name(w->timeline[i]->phase)));
    json_object_set_new(o, "timeline", tl);
    json_object_set_new(o, "current_wait", w->current_wait ? status_flight_json(w->current_wait) : json_null());
    json_t *rw = json_array(); /* the flight recorder's last finished waits, oldest first */
    for (size_t i = 0; i < w->n_recent_waits; i++)
        json_array_append_new(rw, status_flight_json(w->recent_waits[i]));
    json_object_set_new(o, "recent_waits", rw);
    return o;
}

char *status_to_json(const Grpo__Status *s, int pretty) { return status_to_json_of(s, pretty, -1); }

char *status_to_json_of(const Grpo__Status *s, int pretty, int registered)
{
    json_t *o = json_object(), *workers = json_array(), *hist = json_array(), *events = json_array();
    json_object_set_new(o, "run_id", json_string(s->run_id));
    json_object_set_new(o, "state", json_string(core_run_state_name(s->state)));
    json_object_set_new(o, "reason", json_string(s->reason));
    json_object_set_new(o, "step", json_integer(s->step));
    json_object_set_new(o, "total_steps", json_integer(s->total_steps));
    json_object_set_new(o, "phase", json_string(core_phase_name(s->phase)));
    json_object_set_new(o, "uptime_s", num(s->uptime_s));
    json_object_set_new(o, "expected_workers", json_integer(s->expected_workers));
    json_object_set_new(o, "throughput", num(s->throughput));
    json_object_set_new(o, "reward", num(s->reward));
    json_object_set_new(o, "http_url", json_string(s->http_url));
    json_object_set_new(o, "checkpoint_seq", json_integer((json_int_t)s->checkpoint_seq));
    json_object_set_new(o, "checkpoint_seq_done", json_integer((json_int_t)s->checkpoint_seq_done));
    json_object_set_new(o, "checkpoint_step", json_integer(s->checkpoint_step));
    json_object_set_new(o, "pause_requested", json_boolean(s->pause_requested));
    json_object_set_new(o, "stop_requested", json_boolean(s->stop_requested));
    json_object_set_new(o, "job_end", json_string(s->job_end));
    json_object_set_new(o, "run_started", num(s->run_started));
    json_object_set_new(o, "grpod_version", json_string(s->grpod_version));
    json_object_set_new(o, "metrics", metrics_json(s->metrics, s->n_metrics));
    for (size_t i = 0; i < s->n_workers; i++)
        json_array_append_new(workers, worker_json(s->workers[i]));
    json_object_set_new(o, "workers", workers);
    json_object_set_new(o, "workers_registered", json_integer(registered >= 0 ? registered : (json_int_t)s->n_workers));
    for (size_t i = 0; i < s->n_history; i++) {
        json_t *h = json_object();
        json_object_set_new(h, "step", json_integer(s->history[i]->step));
        json_object_set_new(h, "reward", num(s->history[i]->reward));
        json_object_set_new(h, "throughput", num(s->history[i]->throughput));
        json_object_set_new(h, "time", num(s->history[i]->time));
        json_array_append_new(hist, h);
    }
    json_object_set_new(o, "history", hist);
    for (size_t i = 0; i < s->n_events; i++)
        json_array_append_new(events,
                              json_pack("{s:o,s:s}", "time", num(s->events[i]->time), "text", s->events[i]->text));
    json_object_set_new(o, "events", events);
    json_t *diag = json_array(); /* grpoctl diagnose: worst first */
    for (size_t i = 0; i < s->n_diagnosis; i++) {
        const Grpo__Finding *f = s->diagnosis[i];
        json_array_append_new(diag, json_pack("{s:s,s:s,s:s,s:s,s:o}", "kind", f->kind, "severity", f->severity, "text",
                                              f->text, "knob", f->knob, "share", num(f->share)));
    }
    json_object_set_new(o, "diagnosis", diag);
    char *text =
        json_dumps(o, (pretty ? JSON_INDENT(2) : JSON_COMPACT) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(o);
    return CHECK_ALLOC(text);
}
