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
          "  diagnose     where the run's time goes, live or finished: rollout-, trainer- or weight-sync-\n"
          "               bound, a long tail of generation, a straggler rank, memory headroom; each\n"
          "               finding with its numbers and the configuration keys to turn, worst first\n"
          "\n"
          "options:\n"
          "  -e, --endpoint E      grpod's control endpoint (ipc://PATH or tcp://HOST:PORT)\n"
          "  -s, --secret-file F   shared secret for a tcp:// endpoint\n"
          "  -j, --json            status/workers/diagnose as JSON, for scripts\n"
          "  -w, --wait[=SECONDS]  pause/resume/stop/checkpoint: wait until the run has done it\n"
          "                        (default 120 s)\n"
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
        if (w->error[0])
            printf("      error: %s\n", w->error);
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
static bool holds_state(const Grpo__WorkerStatus *w) { return w->role != GRPO__ROLE__ROLE_ROLLOUT; }

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
    if (optind != argc - 1) {
        fprintf(stderr, "grpoctl: %s\n",
                optind >= argc ? "which command? (see grpoctl --help)" : "one command at a time (see grpoctl --help)");
        goto usage_error;
    }
    const char *cmd = argv[optind];
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
        strcmp(cmd, "diagnose") != 0) {
        fprintf(stderr,
                "grpoctl: unknown command '%s' (status, workers, diagnose, pause, resume, stop, checkpoint, metrics)\n",
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
    else
        rc = cmd_status(rpc, &o, strcmp(cmd, "workers") == 0);
    rpc_close(rpc);
    config_free(&cfg);
    return rc;

usage_error:
    config_free(&cfg);
    return EXIT_USAGE;
}
