/* grpoctl: the operator's client of grpod.
 *
 * Every command is one request (plus status polls for --wait), retried with
 * backoff while grpod cannot be reached. Exit status: 0 done, 1 grpod refused
 * or the run did not reach the awaited state (for stop --wait: a trainer or
 * hybrid worker, lost or failing, wrote no checkpoint of the stop), 2 usage or
 * configuration error, 3 grpod could not be reached. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "proto/names.h"
#include "proto/status_json.h"
#include "proto/protocol.h"
#include "proto/transport.h"

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

struct opts {
    const char *endpoint;
    const char *secret_file;
    double timeout_s;
    int attempts;
    bool json;
    double wait_s; /* < 0: do not wait */
    const char *reason;
};

static void usage(FILE *out)
{
    fputs("usage: grpoctl [options] COMMAND\n"
          "\n"
          "Control a GRPO run through grpod.\n"
          "\n"
          "commands:\n"
          "  status       the run (state, step, phase, throughput, reward) and every worker\n"
          "  workers      the workers only: role, host, state, last heartbeat, idle share\n"
          "  pause        hold the run at the next safe point, keeping all in-memory state\n"
          "  resume       let a paused run go on\n"
          "  stop         checkpoint at the next safe point and end the run cleanly\n"
          "  checkpoint   write a checkpoint at the next safe point\n"
          "  metrics      grpod's metrics in the Prometheus text format\n"
          "  diagnose     a hang first (the rank that has not entered the collective its peers wait in,\n"
          "               ranks in different collectives, a rank stuck in checkpoint I/O, a rollout rank\n"
          "               without grants, a rank that never registered, with its host), then where the\n"
          "               run's time goes, live or finished: rollout-, trainer- or weight-sync-bound, a long\n"
          "               tail of generation, a straggler rank, memory headroom; each finding with its\n"
          "               numbers and what to turn or look at, worst first\n"
          "  trace RANK   the flight recorder of worker RANK: its last waits (collectives with their group,\n"
          "               number and bytes, data-plane requests, checkpoint I/O), oldest first, and the one\n"
          "               under way; also written to RUN_DIR/flight/rank-RANK.jsonl on its host\n"
          "  stacks [RANK]  the native stack of the main thread of worker RANK (default: every worker)\n"
          "\n"
          "options:\n"
          "  -e, --endpoint E      grpod's control endpoint (ipc://PATH or tcp://HOST:PORT)\n"
          "  -s, --secret-file F   shared secret for a tcp:// endpoint\n"
          "  -j, --json            status/workers/diagnose as JSON, for scripts\n"
          "  -w, --wait[=SECONDS]  pause/resume/stop/checkpoint: wait until the run has done it\n"
          "                        (default 120 s); trace/stacks: wait this long for the answers\n"
          "                        (default 15 s)\n"
          "  -t, --timeout S       seconds to wait for each answer (default 5)\n"
          "  -r, --retries N       tries while grpod cannot be reached, with backoff (default 4)\n"
          "      --reason TEXT     recorded with a command in grpod's event log\n"
          "  -c, --config FILE     read grpod.endpoint and grpod.secret_file from a YAML configuration\n"
          "  key.path=value        override one configuration key\n"
          "  -h, --help            this text\n"
          "\n"
          "The endpoint is --endpoint, else $GRPOD_ENDPOINT, else grpod.endpoint from the configuration,\n"
          "else " GRPOD_DEFAULT_ENDPOINT ". The secret file likewise: --secret-file, $GRPOD_SECRET_FILE,\n"
          "grpod.secret_file.\n"
          "\n"
          "exit status: 0 done; 1 grpod refused, or the run did not reach the awaited state (stop --wait:\n"
          "             a worker, e.g. a lost one, wrote no checkpoint of the stop); 2 usage or configuration\n"
          "             error; 3 cannot reach grpod\n",
          out);
}

/* One request, retried while unreachable. Exit code, with the reply in *reply on success. */
static int call(struct rpc_client *rpc, const struct opts *o, Grpo__Envelope *req, Grpo__Envelope **reply)
{
    char err[512];
    enum rpc_result r = rpc_call_retry(rpc, req, o->attempts, (int)(o->timeout_s * 1000), reply, err, sizeof err);
    if (r == RPC_UNREACHABLE) {
        fprintf(stderr, "grpoctl: cannot reach grpod at %s: %s\n", o->endpoint, err);
        return EXIT_UNREACHABLE;
    }
    if (r == RPC_BAD_REPLY) {
        fprintf(stderr, "grpoctl: %s: %s\n", o->endpoint, err);
        return EXIT_FAILED;
    }
    if ((*reply)->body_case == GRPO__ENVELOPE__BODY_REPLY && !(*reply)->reply->ok) {
        fprintf(stderr, "grpoctl: grpod refused: %s\n", (*reply)->reply->error);
        protocol_free(*reply);
        *reply = NULL;
        return EXIT_FAILED;
    }
    return EXIT_OK;
}

static int get_status(struct rpc_client *rpc, const struct opts *o, Grpo__Envelope **reply)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    req.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    req.status_request = 1;
    int rc = call(rpc, o, &req, reply);
    if (rc == EXIT_OK && (*reply)->body_case != GRPO__ENVELOPE__BODY_STATUS) {
        fprintf(stderr, "grpoctl: grpod answered a status request with '%s'\n",
                protocol_body_name((*reply)->body_case));
        protocol_free(*reply);
        *reply = NULL;
        return EXIT_FAILED;
    }
    return rc;
}

static void format_age(double s, char *out, size_t len)
{
    if (s < 60)
        snprintf(out, len, "%.1fs ago", s);
    else if (s < 3600)
        snprintf(out, len, "%dm%02ds ago", (int)s / 60, (int)s % 60);
    else
        snprintf(out, len, "%dh%02dm ago", (int)s / 3600, (int)s % 3600 / 60);
}

static void format_duration(double s, char *out, size_t len)
{
    int t = (int)s;
    if (t < 3600)
        snprintf(out, len, "%dm%02ds", t / 60, t % 60);
    else
        snprintf(out, len, "%dh%02dm%02ds", t / 3600, t % 3600 / 60, t % 60);
}

static void format_number(double v, char *out, size_t len)
{
    if (isfinite(v))
        snprintf(out, len, "%.4g", v);
    else
        snprintf(out, len, "-");
}

/* A flight recorder's wait for people: "all-reduce #1234 of dp (ranks 0-4,6-7), 4.0 KiB, 0.250 ms, phase
 * update_actor, layer 12 backward" (a wait under way: "waiting 95.0 s so far"). */
static void format_wait(const Grpo__FlightEntry *e, char *out, size_t len)
{
    char what[96], group[200] = "", peer[32] = "", size[32] = "", t[64], where[64] = "";
    const bool io = strcmp(e->kind, "io") == 0;
    if (e->seq)
        snprintf(what, sizeof what, io ? "%s of step %" PRIu64 : "%s #%" PRIu64, e->op, e->seq);
    else
        snprintf(what, sizeof what, "%s", e->op);
    if (io)
        snprintf(group, sizeof group, "%s%s", e->members[0] ? " in " : "", e->members);
    else if (e->group[0] && strcmp(e->kind, "plane") == 0)
        snprintf(group, sizeof group, " to %s%s%s", e->group, e->members[0] ? " at " : "", e->members);
    else if (e->group[0])
        snprintf(group, sizeof group, " of %s%s%s%s", e->group, e->members[0] ? " (ranks " : "", e->members,
                 e->members[0] ? ")" : "");
    if (e->peer >= 0)
        snprintf(peer, sizeof peer, strcmp(e->op, "broadcast") == 0 ? " from root %d" : " with peer %d", e->peer);
    if (e->bytes) {
        size[0] = ',', size[1] = ' ';
        log_bytes_text(e->bytes, size + 2, sizeof size - 2);
    }
    if (e->open)
        snprintf(t, sizeof t, "waiting %.1f s so far", e->seconds);
    else
        snprintf(t, sizeof t, "%.3f ms%s", e->seconds * 1e3, e->failed ? ", failed" : "");
    if (e->layer >= 0)
        snprintf(where, sizeof where, ", layer %d %s", e->layer, e->backward ? "backward" : "forward");
    snprintf(out, len, "%s%s%s%s, %s, phase %s%s", what, group, peer, size, t, core_phase_name(e->phase), where);
}

static void print_workers(const Grpo__Status *s)
{
    if (!s->n_workers) {
        printf("no workers registered\n");
        return;
    }
    printf("%-5s %-16s %-8s %-8s %-9s %-12s %-6s %-14s %-14s %5s  %s\n", "RANK", "HOST", "PID", "ROLE", "DP/TP/PP",
           "STATE", "STEP", "PHASE", "HEARTBEAT", "IDLE", "DEVICES");
    for (size_t i = 0; i < s->n_workers; i++) {
        const Grpo__WorkerStatus *w = s->workers[i];
        char coords[32], age[32], dev[256] = "";
        snprintf(coords, sizeof coords, "%d/%d/%d", w->dp_rank, w->tp_rank, w->pp_rank);
        format_age(w->last_heartbeat_age_s, age, sizeof age);
        for (size_t k = 0; k < w->n_devices; k++) {
            size_t l = strlen(dev);
            snprintf(dev + l, sizeof dev - l, "%s%s", k ? "," : "", w->devices[k]);
        }
        printf("%-5d %-16s %-8d %-8s %-9s %-12s %-6" PRId64 " %-14s %-14s %4.0f%%  %s\n", w->rank, w->host, w->pid,
               core_role_name(w->role), coords, core_worker_state_name(w->worker_state), w->step,
               core_phase_name(w->phase), age, 100.0 * w->idle_fraction, dev[0] ? dev : "-");
        if (w->error[0]) /* a failed worker's error, a lost one's reason (survived: DP 3 -> 2 at step 4) */
            printf("      %s: %s\n", w->worker_state == GRPO__WORKER_STATE__WORKER_FAILED ? "error" : "reason",
                   w->error);
        if (w->current_wait && w->current_wait->seconds >= 1.0) { /* a wait of note (grpoctl trace: all of them) */
            char wait[512];
            format_wait(w->current_wait, wait, sizeof wait);
            printf("      in %s\n", wait);
        }
    }
}

/* The newest checkpoint any worker reports having written (whoever asked for it: an operator, the trainer's
 * own trainer.save_freq, a stop), and its rank; -1 when none has. */
static int64_t newest_checkpoint(const Grpo__Status *s, int *rank)
{
    int64_t newest = -1;
    for (size_t i = 0; i < s->n_workers; i++)
        if (s->workers[i]->checkpoint_step > newest) {
            newest = s->workers[i]->checkpoint_step;
            *rank = s->workers[i]->rank;
        }
    return newest;
}

static void print_status(const Grpo__Status *s)
{
    char up[32], tp[32], rw[32], total[32];
    format_duration(s->uptime_s, up, sizeof up);
    format_number(s->throughput, tp, sizeof tp);
    format_number(s->reward, rw, sizeof rw);
    if (s->total_steps > 0)
        snprintf(total, sizeof total, " of %" PRId64, s->total_steps);
    else
        total[0] = 0;
    printf("run         %s\n", s->run_id);
    printf("state       %s%s%s\n", core_run_state_name(s->state), s->reason[0] ? ": " : "", s->reason);
    printf("step        %" PRId64 "%s   phase %s\n", s->step, total, core_phase_name(s->phase));
    printf("reward      %s   (critic/score/mean)\n", rw);
    printf("throughput  %s   (perf/throughput, tokens/s per device)\n", tp);
    /* the run's checkpoint is the newest every trainer has (a relaunch resumes from it); a newer one that only
     * some workers have, or one when not every worker has any, is shown beside it */
    int newest_rank = -1;
    int64_t newest = newest_checkpoint(s, &newest_rank);
    if (s->checkpoint_step >= 0 && newest > s->checkpoint_step)
        printf("checkpoint  step %" PRId64 " (requests %" PRIu64 ", written %" PRIu64 "); newest step %" PRId64
               " on rank %d\n",
               s->checkpoint_step, s->checkpoint_seq, s->checkpoint_seq_done, newest, newest_rank);
    else if (s->checkpoint_step >= 0)
        printf("checkpoint  step %" PRId64 " (requests %" PRIu64 ", written %" PRIu64 ")\n", s->checkpoint_step,
               s->checkpoint_seq, s->checkpoint_seq_done);
    else if (newest >= 0)
        printf("checkpoint  step %" PRId64 " written by rank %d, not by every worker (requests %" PRIu64 ")\n", newest,
               newest_rank, s->checkpoint_seq);
    else
        printf("checkpoint  none yet (requests %" PRIu64 ")\n", s->checkpoint_seq);
    printf("workers     %zu of %d registered\n", s->n_workers, s->expected_workers);
    if (s->n_diagnosis) /* the worst finding; grpoctl diagnose has them all, with what to turn */
        printf("diagnosis   %s\n", s->diagnosis[0]->text);
    printf("grpod       %s, up %s%s%s\n", s->grpod_version, up, s->http_url[0] ? ", status page " : "",
           s->http_url[0] ? s->http_url : "");
    printf("\n");
    print_workers(s);
}

static int cmd_status(struct rpc_client *rpc, const struct opts *o, bool workers_only)
{
    Grpo__Envelope *reply;
    int rc = get_status(rpc, o, &reply);
    if (rc != EXIT_OK)
        return rc;
    const Grpo__Status *s = reply->status;
    if (o->json) {
        char *text = status_to_json(s, 1);
        if (workers_only) {
            json_t *root = json_loads(text, 0, NULL);
            char *w = json_dumps(json_object_get(root, "workers"), JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            printf("%s\n", w ? w : "[]");
            free(w);
            json_decref(root);
        } else {
            printf("%s\n", text);
        }
        free(text);
    } else if (workers_only) {
        print_workers(s);
    } else {
        print_status(s);
    }
    protocol_free(reply);
    return EXIT_OK;
}

/* grpod's verdict on the run (Status.diagnosis), worst first. */
static int cmd_diagnose(struct rpc_client *rpc, const struct opts *o)
{
    Grpo__Envelope *reply;
    int rc = get_status(rpc, o, &reply);
    if (rc != EXIT_OK)
        return rc;
    const Grpo__Status *s = reply->status;
    if (o->json) {
        char *text = status_to_json(s, 1);
        json_t *root = json_loads(text, 0, NULL);
        char *d = json_dumps(json_object_get(root, "diagnosis"), JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", d ? d : "[]");
        free(d);
        json_decref(root);
        free(text);
    } else {
        printf("run %s, %s at step %" PRId64 "\n", s->run_id, core_run_state_name(s->state), s->step);
        if (!s->n_diagnosis)
            printf("no verdict: this grpod does not diagnose runs (version %s)\n", s->grpod_version);
        for (size_t i = 0; i < s->n_diagnosis; i++) {
            const Grpo__Finding *f = s->diagnosis[i];
            printf("%-5s %s\n", f->severity, f->text);
            if (f->knob[0])
                printf("      turn: %s\n", f->knob);
        }
    }
    protocol_free(reply);
    return EXIT_OK;
}

static int cmd_metrics(struct rpc_client *rpc, const struct opts *o)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT, *reply;
    req.body_case = GRPO__ENVELOPE__BODY_METRICS_REQUEST;
    req.metrics_request = 1;
    int rc = call(rpc, o, &req, &reply);
    if (rc != EXIT_OK)
        return rc;
    if (reply->body_case == GRPO__ENVELOPE__BODY_METRICS_TEXT)
        fputs(reply->metrics_text, stdout);
    else
        rc = EXIT_FAILED;
    protocol_free(reply);
    return rc;
}

/* Has the run done what the command asked? 1 yes, 0 not yet, -1 never will (why[] says). */
static int reached(Grpo__Command cmd, const Grpo__Status *s, uint64_t ckpt_seq, char *why, size_t len)
{
    bool over = s->state == GRPO__RUN_STATE__RUN_FINISHED || s->state == GRPO__RUN_STATE__RUN_FAILED;
    switch (cmd) {
    case GRPO__COMMAND__COMMAND_PAUSE:
        if (s->state == GRPO__RUN_STATE__RUN_PAUSED)
            return 1;
        break;
    case GRPO__COMMAND__COMMAND_RESUME:
        if (s->state != GRPO__RUN_STATE__RUN_PAUSED && s->state != GRPO__RUN_STATE__RUN_PAUSING)
            return over ? -1 : 1;
        break;
    case GRPO__COMMAND__COMMAND_STOP:
        if (over)
            return s->state == GRPO__RUN_STATE__RUN_FINISHED ? 1 : -1;
        break;
    default:
        if (s->checkpoint_seq_done >= ckpt_seq)
            return 1;
        break;
    }
    if (over || (cmd != GRPO__COMMAND__COMMAND_STOP && s->stop_requested)) {
        snprintf(why, len, "run is %s: %s", core_run_state_name(s->state), s->reason);
        return -1;
    }
    return 0;
}

/* A worker whose checkpoint the run's end needs: trainers and hybrids (rollout ranks hold nothing a checkpoint
 * keeps). */
static bool holds_state(const Grpo__WorkerStatus *w)
{
    return core_role_holds_state(w->role); /* a spare holds none yet */
}

/* While a stop is under way: say once which workers are lost (they cannot checkpoint). seen[] is per rank. */
static void note_lost(const Grpo__Status *s, bool *seen, size_t nseen)
{
    for (size_t i = 0; i < s->n_workers; i++) {
        const Grpo__WorkerStatus *w = s->workers[i];
        if (w->worker_state != GRPO__WORKER_STATE__WORKER_LOST || !holds_state(w) || w->rank < 0 ||
            (size_t)w->rank >= nseen || seen[w->rank])
            continue;
        seen[w->rank] = true;
        fprintf(stderr,
                "grpoctl: rank %d on host %s is lost (no heartbeat for %.1f s): it cannot write its checkpoint; "
                "waiting for the others\n",
                w->rank, w->host, w->last_heartbeat_age_s);
    }
}

/* The run has ended on a stop: did every worker that holds state write its checkpoint? 0 yes; otherwise 1 with
 * each one that did not named on stderr (lost, or stopped without a checkpoint of its last step). */
static int check_stop_checkpoints(const Grpo__Status *s)
{
    int missing = 0;
    for (size_t i = 0; i < s->n_workers; i++) {
        const Grpo__WorkerStatus *w = s->workers[i];
        if (!holds_state(w))
            continue;
        char newest[64];
        if (w->checkpoint_step >= 0)
            snprintf(newest, sizeof newest, "step %" PRId64, w->checkpoint_step);
        else
            snprintf(newest, sizeof newest, "none");
        if (w->worker_state == GRPO__WORKER_STATE__WORKER_LOST) {
            fprintf(stderr,
                    "grpoctl: rank %d on host %s is lost (no heartbeat for %.1f s, last at step %" PRId64
                    "): it wrote no checkpoint for the stop (its newest: %s)\n",
                    w->rank, w->host, w->last_heartbeat_age_s, w->step, newest);
            missing++;
        } else if (w->worker_state == GRPO__WORKER_STATE__WORKER_STOPPED && w->checkpoint_step < w->step) {
            fprintf(stderr,
                    "grpoctl: rank %d on host %s stopped at step %" PRId64
                    " without writing its checkpoint (its newest: %s; see its log)\n",
                    w->rank, w->host, w->step, newest);
            missing++;
        }
    }
    if (missing)
        fprintf(stderr,
                "grpoctl: run %s is %s (%s), but %d worker(s) wrote no checkpoint of the stop: a relaunch resumes "
                "from the newest checkpoint every rank has\n",
                s->run_id, core_run_state_name(s->state), s->reason, missing);
    return missing ? EXIT_FAILED : EXIT_OK;
}

static int cmd_command(struct rpc_client *rpc, const struct opts *o, Grpo__Command cmd)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT, *reply;
    Grpo__CommandRequest cr = GRPO__COMMAND_REQUEST__INIT;
    char reason[300];
    snprintf(reason, sizeof reason, "%s", o->reason ? o->reason : "grpoctl");
    cr.command = cmd;
    cr.reason = reason;
    req.body_case = GRPO__ENVELOPE__BODY_COMMAND;
    req.command = &cr;
    int rc = call(rpc, o, &req, &reply);
    if (rc != EXIT_OK)
        return rc;
    printf("%s\n", reply->body_case == GRPO__ENVELOPE__BODY_REPLY ? reply->reply->message : "done");
    protocol_free(reply);
    if (o->wait_s < 0)
        return EXIT_OK;
    Grpo__Envelope *st;
    if ((rc = get_status(rpc, o, &st)) != EXIT_OK)
        return rc;
    uint64_t seq = st->status->checkpoint_seq; /* the request just made */
    double deadline = clock_now_s() + o->wait_s;
    bool lost_told[4096] = {false};
    for (;;) {
        char why[600];
        int r = reached(cmd, st->status, seq, why, sizeof why);
        if (r == 0 && cmd == GRPO__COMMAND__COMMAND_STOP)
            note_lost(st->status, lost_told, sizeof lost_told / sizeof *lost_told);
        if (r != 0) {
            int code = r > 0 ? EXIT_OK : EXIT_FAILED;
            if (r > 0) {
                if (cmd == GRPO__COMMAND__COMMAND_CHECKPOINT)
                    printf("checkpoint written: step %" PRId64 "\n", st->status->checkpoint_step);
                else
                    printf("run %s at step %" PRId64 "%s%s\n", core_run_state_name(st->status->state), st->status->step,
                           st->status->reason[0] ? ": " : "", st->status->reason);
                /* grpod ends a stop once no worker is left running, the lost ones included */
                if (cmd == GRPO__COMMAND__COMMAND_STOP)
                    code = check_stop_checkpoints(st->status);
            } else {
                fprintf(stderr, "grpoctl: %s\n", why);
            }
            protocol_free(st);
            return code;
        }
        if (clock_now_s() > deadline) {
            fprintf(stderr, "grpoctl: run still %s after %.0f s: %s\n", core_run_state_name(st->status->state),
                    o->wait_s, st->status->reason);
            protocol_free(st);
            return EXIT_FAILED;
        }
        protocol_free(st);
        clock_sleep_s(0.2);
        if ((rc = get_status(rpc, o, &st)) != EXIT_OK)
            return rc;
    }
}

/* ---- trace and stacks: asked of grpod, which asks the workers in their heartbeats' answers ---- */

static int flight_call(struct rpc_client *rpc, const struct opts *o, Grpo__FlightRequest__What what, int rank, bool ask,
                       uint64_t seq, Grpo__Envelope **reply)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__FlightRequest q = GRPO__FLIGHT_REQUEST__INIT;
    q.what = what;
    q.rank = rank;
    q.ask = ask;
    q.seq = seq;
    req.body_case = GRPO__ENVELOPE__BODY_FLIGHT_REQUEST;
    req.flight_request = &q;
    int rc = call(rpc, o, &req, reply);
    if (rc == EXIT_OK && (*reply)->body_case != GRPO__ENVELOPE__BODY_FLIGHT_REPLY) {
        fprintf(stderr, "grpoctl: grpod answered with '%s' (a grpod older than protocol 1.15 has no flight recorder)\n",
                protocol_body_name((*reply)->body_case));
        protocol_free(*reply);
        *reply = NULL;
        return EXIT_FAILED;
    }
    return rc;
}

/* A worker that can answer: it heartbeats (grpod asked it) */
static bool answers(const Grpo__FlightDump *d)
{
    static const char *gone[] = {"lost", "finished", "stopped", "failed"};
    for (size_t i = 0; i < sizeof gone / sizeof *gone; i++)
        if (strcmp(d->state, gone[i]) == 0)
            return false;
    return d->seq > 0;
}

static void print_trace(const Grpo__FlightDump *d, bool json)
{
    if (json) {
        json_t *o = json_object(), *es = json_array();
        json_object_set_new(o, "rank", json_integer(d->rank));
        json_object_set_new(o, "host", json_string(d->host));
        json_object_set_new(o, "pid", json_integer(d->pid));
        for (size_t i = 0; i < d->n_trace; i++)
            json_array_append_new(es, status_flight_json(d->trace[i]));
        json_object_set_new(o, "entries", es);
        char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", text ? text : "{}");
        free(text);
        json_decref(o);
        return;
    }
    size_t open = 0;
    for (size_t i = 0; i < d->n_trace; i++)
        open += d->trace[i]->open;
    printf("rank %d (host %s, pid %d, %s): the last %zu waits of its flight recorder, oldest first%s\n", d->rank,
           d->host, d->pid, d->state, d->n_trace - open, open ? ", then the one under way" : "");
    for (size_t i = 0; i < d->n_trace; i++) {
        const Grpo__FlightEntry *e = d->trace[i];
        char line[512], when[32] = "-";
        format_wait(e, line, sizeof line);
        const time_t sec = (time_t)e->began;
        struct tm tm;
        if (e->began > 0 && gmtime_r(&sec, &tm))
            snprintf(when, sizeof when, "%02d:%02d:%02d.%03dZ", tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)((e->began - floor(e->began)) * 1000));
        if (e->open)
            printf("  %-8s %s  %s\n", "now", when, line);
        else
            printf("  #%-7" PRIu64 " %s  %s\n", e->id, when, line);
    }
}

/* grpoctl trace RANK and grpoctl stacks [RANK] (rank -1: every worker): ask, then poll until every worker asked has
 * answered or the wait runs out. */
static int cmd_flight(struct rpc_client *rpc, const struct opts *o, bool stacks, int rank)
{
    const Grpo__FlightRequest__What what =
        stacks ? GRPO__FLIGHT_REQUEST__WHAT__STACKS : GRPO__FLIGHT_REQUEST__WHAT__TRACE;
    const char *name = stacks ? "stacks" : "trace";
    Grpo__Envelope *reply = NULL;
    int rc = flight_call(rpc, o, what, rank, true, 0, &reply);
    if (rc != EXIT_OK)
        return rc;
    const uint64_t seq = rank >= 0 && reply->flight_reply->n_dumps ? reply->flight_reply->dumps[0]->seq : 0;
    const double deadline = clock_now_s() + (o->wait_s > 0 ? o->wait_s : 15.0);
    for (;;) {
        const Grpo__FlightReply *fr = reply->flight_reply;
        size_t waiting = 0;
        for (size_t i = 0; i < fr->n_dumps; i++)
            waiting += answers(fr->dumps[i]) && !fr->dumps[i]->answered;
        if (!waiting || clock_now_s() > deadline)
            break;
        protocol_free(reply);
        reply = NULL;
        clock_sleep_s(0.1);
        if ((rc = flight_call(rpc, o, what, rank, false, seq, &reply)) != EXIT_OK)
            return rc;
    }
    const Grpo__FlightReply *fr = reply->flight_reply;
    int code = EXIT_OK;
    for (size_t i = 0; i < fr->n_dumps; i++) {
        const Grpo__FlightDump *d = fr->dumps[i];
        if (!d->answered) {
            if (answers(d) || rank >= 0) {
                fprintf(stderr,
                        "grpoctl: rank %d (host %s, %s) did not answer the %s request within %.0f s (a worker older "
                        "than protocol 1.15 never does)\n",
                        d->rank, d->host, d->state, name, o->wait_s > 0 ? o->wait_s : 15.0);
                code = EXIT_FAILED;
            } else if (!o->json) {
                printf("==== rank %d (host %s, pid %d): %s, not asked\n", d->rank, d->host, d->pid, d->state);
            }
            continue;
        }
        if (!stacks)
            print_trace(d, o->json);
        else if (o->json) {
            json_t *j =
                json_pack("{s:i, s:s, s:i, s:s}", "rank", d->rank, "host", d->host, "pid", d->pid, "stacks", d->stacks);
            char *text = json_dumps(j, JSON_COMPACT);
            printf("%s\n", text ? text : "{}");
            free(text);
            json_decref(j);
        } else {
            printf("==== rank %d (host %s, pid %d): the main thread's stack\n%s", d->rank, d->host, d->pid, d->stacks);
            const size_t l = strlen(d->stacks);
            if (l && d->stacks[l - 1] != '\n')
                printf("\n");
        }
    }
    protocol_free(reply);
    return code;
}

static int parse_seconds(const char *s, double *out)
{
    if (!s)
        return -1;
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || v > 1e7)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    log_init_from_env();
    struct grpo_config cfg;
    config_init(&cfg);
    int rc = config_from_args(&cfg, &argc, argv);
    if (rc != 0) {
        config_free(&cfg);
        return rc < 0 ? EXIT_USAGE : EXIT_OK;
    }
    struct opts o = {.timeout_s = 5, .attempts = 4, .wait_s = -1};
    enum { OPT_REASON = 256 };
    static const struct option lopts[] = {{"endpoint", required_argument, 0, 'e'},
                                          {"secret-file", required_argument, 0, 's'},
                                          {"json", no_argument, 0, 'j'},
                                          {"wait", optional_argument, 0, 'w'},
                                          {"timeout", required_argument, 0, 't'},
                                          {"retries", required_argument, 0, 'r'},
                                          {"reason", required_argument, 0, OPT_REASON},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "e:s:jwt:r:h", lopts, NULL)) != -1) {
        switch (c) {
        case 'e': o.endpoint = optarg; break;
        case 's': o.secret_file = optarg; break;
        case 'j': o.json = true; break;
        case 'w':
            o.wait_s = 120;
            if (optarg && parse_seconds(optarg, &o.wait_s) != 0) {
                fprintf(stderr, "grpoctl: --wait expects seconds, got '%s'\n", optarg);
                goto usage_error;
            }
            break;
        case 't':
            if (parse_seconds(optarg, &o.timeout_s) != 0) {
                fprintf(stderr, "grpoctl: --timeout expects seconds, got '%s'\n", optarg);
                goto usage_error;
            }
            break;
        case 'r': {
            char *end;
            long n = optarg ? strtol(optarg, &end, 10) : 0;
            o.attempts = optarg && !*end ? (int)n : 0;
            if (n < 1 || n > 1000 || o.attempts < 1) {
                fprintf(stderr, "grpoctl: --retries expects 1..1000, got '%s'\n", optarg ? optarg : "");
                goto usage_error;
            }
            break;
        }
        case OPT_REASON: o.reason = optarg; break;
        case 'h':
            usage(stdout);
            config_free(&cfg);
            return EXIT_OK;
        default: goto usage_error;
        }
    }
    const bool takes_rank =
        optind < argc && (strcmp(argv[optind], "trace") == 0 || strcmp(argv[optind], "stacks") == 0);
    if (optind >= argc || argc - optind > (takes_rank ? 2 : 1)) {
        fprintf(stderr, "grpoctl: %s\n",
                optind >= argc ? "which command? (see grpoctl --help)" : "one command at a time (see grpoctl --help)");
        goto usage_error;
    }
    const char *cmd = argv[optind];
    int flight_rank = -1; /* trace RANK, stacks [RANK] */
    if (takes_rank) {
        char *end = NULL;
        const char *arg = optind + 1 < argc ? argv[optind + 1] : NULL;
        const long v = arg ? strtol(arg, &end, 10) : -1;
        if (arg && (end == arg || *end || v < 0 || v > 1 << 20)) {
            fprintf(stderr, "grpoctl: %s expects a rank number, got '%s'\n", cmd, arg);
            goto usage_error;
        }
        if (!arg && strcmp(cmd, "trace") == 0) {
            fprintf(stderr, "grpoctl: trace RANK: which rank? (grpoctl workers lists them)\n");
            goto usage_error;
        }
        flight_rank = (int)v;
    }
    if (!o.endpoint)
        o.endpoint = getenv("GRPOD_ENDPOINT");
    if (!o.endpoint || !o.endpoint[0])
        o.endpoint = cfg.grpod_endpoint[0] ? cfg.grpod_endpoint : GRPOD_DEFAULT_ENDPOINT;
    if (!o.secret_file)
        o.secret_file = getenv("GRPOD_SECRET_FILE");
    if (!o.secret_file || !o.secret_file[0])
        o.secret_file = cfg.grpod_secret_file;

    static const struct {
        const char *name;
        Grpo__Command cmd;
    } commands[] = {{"pause", GRPO__COMMAND__COMMAND_PAUSE},
                    {"resume", GRPO__COMMAND__COMMAND_RESUME},
                    {"stop", GRPO__COMMAND__COMMAND_STOP},
                    {"checkpoint", GRPO__COMMAND__COMMAND_CHECKPOINT}};
    int which = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(cmd, commands[i].name) == 0)
            which = i;
    if (which < 0 && strcmp(cmd, "status") != 0 && strcmp(cmd, "workers") != 0 && strcmp(cmd, "metrics") != 0 &&
        strcmp(cmd, "diagnose") != 0 && !takes_rank) {
        fprintf(stderr,
                "grpoctl: unknown command '%s' (status, workers, diagnose, trace, stacks, pause, resume, stop, "
                "checkpoint, metrics)\n",
                cmd);
        goto usage_error;
    }

    char err[600], secret[GRPO_SECRET_MAX + 1] = "";
    enum endpoint_kind kind;
    if (endpoint_parse(o.endpoint, &kind, NULL, 0, err, sizeof err) != 0) {
        fprintf(stderr, "grpoctl: %s\n", err);
        goto usage_error;
    }
    if (kind == ENDPOINT_TCP) {
        if (!o.secret_file || !o.secret_file[0]) {
            fprintf(stderr,
                    "grpoctl: %s is a tcp:// endpoint: give the shared secret with --secret-file or "
                    "$GRPOD_SECRET_FILE\n",
                    o.endpoint);
            goto usage_error;
        }
        if (secret_read(o.secret_file, secret, sizeof secret, err, sizeof err) != 0) {
            fprintf(stderr, "grpoctl: %s\n", err);
            goto usage_error;
        }
    }
    struct rpc_client *rpc = rpc_open(o.endpoint, secret, err, sizeof err);
    if (!rpc) {
        fprintf(stderr, "grpoctl: %s\n", err);
        config_free(&cfg);
        return EXIT_UNREACHABLE;
    }
    if (which >= 0)
        rc = cmd_command(rpc, &o, commands[which].cmd);
    else if (strcmp(cmd, "metrics") == 0)
        rc = cmd_metrics(rpc, &o);
    else if (strcmp(cmd, "diagnose") == 0)
        rc = cmd_diagnose(rpc, &o);
    else if (takes_rank)
        rc = cmd_flight(rpc, &o, strcmp(cmd, "stacks") == 0, flight_rank);
    else
        rc = cmd_status(rpc, &o, strcmp(cmd, "workers") == 0);
    rpc_close(rpc);
    config_free(&cfg);
    return rc;

usage_error:
    config_free(&cfg);
    return EXIT_USAGE;
}
