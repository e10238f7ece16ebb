/* grpod: the coordinator of a GRPO run.
 *
 * One thread, one libuv loop. Each control endpoint is a nanomsg REP socket
 * whose NN_RCVFD joins the loop through uv_poll; REP answers one request at a
 * time, which suits a control plane whose every request is handled in
 * microseconds (see docs/protocol.md). Signals arrive through the loop
 * (SIGTERM, SIGINT: graceful stop; SIGPIPE ignored), readiness and status go
 * to systemd through sd_notify, and the run is journaled in the state
 * directory so that a restarted grpod, even after kill -9, carries on.
 *
 * Start-up runs in order and teardown in reverse, through one cleanup path. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <uv.h>

#ifdef GRPO_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "common/check.h"
#include "common/config.h"
#include "common/log.h"
#include "common/placement.h"
#include "core.h"
#include "daemon/grpod_version.h"
#include "http.h"
#include "journal.h"
#include "proto/transport.h"

#define MAX_LISTENERS 4

struct grpod;

/* One control endpoint: a REP socket in the loop. */
struct listener {
    struct grpod *d;
    int sock, rcvfd, sndfd;
    uv_poll_t rpoll, spoll;
    bool rpoll_init, spoll_init;
    bool bound; /* the ipc socket file is ours to remove */
    char endpoint[512];
    char ipc_path[512];
    bool needs_secret;
    uint8_t *pending; /* a reply the socket could not take yet */
    size_t pending_len;
    double pending_since;
};

struct grpod {
    uv_loop_t loop;
    struct grpo_config *cfg;
    struct core core;
    struct journal journal;
    struct listener listeners[MAX_LISTENERS];
    int nlisteners;
    struct http *http;
    uv_signal_t sigterm, sigint;
    uv_timer_t tick, flush;
    char secret[GRPO_SECRET_MAX + 1];
    char http_url[256];
    char last_status[256];
    int exit_code;
};

static double mono_now(void) { return transport_now(); }

static void usage(FILE *out)
{
    fputs("usage: grpod [--config FILE] [key.path=value ...] [options]\n"
          "\n"
          "Coordinator of a GRPO run: registers workers, assigns roles, watches their health,\n"
          "pauses, resumes, checkpoints and stops the run, serves a status page and metrics.\n"
          "\n"
          "options:\n"
          "  -c, --config FILE      YAML configuration (the grpod.* and placement.* keys; docs/configuration.md)\n"
          "  key.path=value         override one key, e.g. grpod.endpoint=ipc:///tmp/grpod.sock\n"
          "      --print-config     print the effective configuration and exit\n"
          "  -V, --version          print the version and protocol version, and exit\n"
          "  -h, --help             this text\n"
          "\n"
          "signals: SIGTERM or SIGINT stop grpod gracefully (the run's state stays journaled;\n"
          "         workers keep training and reconnect to the next grpod)\n"
          "exit status: 0 stopped cleanly, 1 runtime failure, 2 usage or configuration error\n"
          "environment: GRPO_LOG_LEVEL=error|warn|info|debug\n",
          out);
}

/* ---- systemd ---- */

static void notify(const char *state)
{
#ifdef GRPO_HAVE_SYSTEMD
    sd_notify(0, state);
#else
    (void)state;
#endif
}

static void notify_status(struct grpod *d)
{
    char st[256];
    int present = 0;
    for (int r = 0; r < d->core.nworkers; r++)
        present += (d->core.workers[r] != NULL);
    snprintf(st, sizeof st, "STATUS=run %s %s, step %lld, %d of %d workers", d->core.run.id,
             core_run_state_name(d->core.run.state), (long long)d->core.run.step, present, d->core.run.world);
    if (strcmp(st, d->last_status) != 0) {
        notify(st);
        snprintf(d->last_status, sizeof d->last_status, "%s", st);
    }
#ifdef GRPO_HAVE_SYSTEMD
    uint64_t usec;
    if (sd_watchdog_enabled(0, &usec) > 0)
        notify("WATCHDOG=1");
#endif
}

/* ---- journal ---- */

static void persist(struct grpod *d)
{
    if (!d->core.dirty)
        return;
    char *text = core_save_json(&d->core);
    char err[512];
    if (journal_save(&d->journal, text, err, sizeof err) != 0)
        log_error("journal", "%s (the run's state is not durable until this is fixed)", err);
    else
        d->core.dirty = d->core.dirty_urgent = false;
    free(text);
}

static void on_event(void *ud, double time, const char *text)
{
    struct grpod *d = ud;
    journal_event(&d->journal, time, text);
}

/* ---- control sockets ---- */

static void on_readable(uv_poll_t *p, int status, int events);

static void resume_reading(struct listener *l)
{
    if (l->spoll_init)
        uv_poll_stop(&l->spoll);
    uv_poll_start(&l->rpoll, UV_READABLE, on_readable);
}

/* Send a reply, or keep it until NN_SNDFD says the socket takes it; 1 when it went out. */
static int send_reply(struct listener *l, uint8_t *buf, size_t len)
{
    int rc = nn_send(l->sock, buf, len, NN_DONTWAIT);
    if (rc >= 0) {
        free(buf);
        return 1;
    }
    if (nn_errno() != EAGAIN) {
        log_warn("grpod", "%s: reply not sent: %s", l->endpoint, nn_strerror(nn_errno()));
        free(buf);
        return 1;
    }
    l->pending = buf;
    l->pending_len = len;
    l->pending_since = mono_now();
    return 0;
}

static void on_writable(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    struct listener *l = p->data;
    if (!l->pending) {
        resume_reading(l);
        return;
    }
    uint8_t *buf = l->pending;
    l->pending = NULL;
    if (send_reply(l, buf, l->pending_len))
        resume_reading(l);
}

static void on_readable(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    struct listener *l = p->data;
    struct grpod *d = l->d;
    /* a bounded batch per wake-up keeps the other sockets and timers served */
    for (int i = 0; i < 64 && !l->pending; i++) {
        void *msg = NULL;
        int n = nn_recv(l->sock, &msg, NN_MSG, NN_DONTWAIT);
        if (n < 0) {
            if (nn_errno() != EAGAIN && nn_errno() != EINTR)
                log_warn("grpod", "%s: receive failed: %s", l->endpoint, nn_strerror(nn_errno()));
            return;
        }
        size_t rlen;
        uint8_t *reply = core_handle(&d->core, msg, (size_t)n, l->needs_secret ? d->secret : NULL, mono_now(), &rlen);
        nn_freemsg(msg);
        if (d->core.dirty_urgent) /* registrations and commands are durable before they are answered */
            persist(d);
        if (!send_reply(l, reply, rlen)) {
            uv_poll_stop(&l->rpoll);
            uv_poll_start(&l->spoll, UV_READABLE, on_writable);
        }
    }
}

static int parse_mode(const char *text, mode_t *mode)
{
    char *end;
    long v = strtol(text, &end, 8);
    if (!text[0] || *end || v < 0 || v > 0777)
        return -1;
    *mode = (mode_t)v;
    return 0;
}

static int listener_open(struct grpod *d, struct listener *l, const char *endpoint, mode_t mode, char *err,
                         size_t errlen)
{
    enum endpoint_kind kind;
    memset(l, 0, sizeof *l);
    l->d = d;
    l->sock = -1;
    snprintf(l->endpoint, sizeof l->endpoint, "%s", endpoint);
    if (endpoint_parse(endpoint, &kind, l->ipc_path, sizeof l->ipc_path, err, errlen) != 0)
        return -1;
    l->needs_secret = kind == ENDPOINT_TCP;
    l->sock = nn_socket(AF_SP, NN_REP);
    if (l->sock < 0) {
        snprintf(err, errlen, "nn_socket: %s", nn_strerror(nn_errno()));
        return -1;
    }
    int max = (int)GRPO_MAX_CONTROL_BYTES, linger = 0;
    nn_setsockopt(l->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof max);
    nn_setsockopt(l->sock, NN_SOL_SOCKET, NN_LINGER, &linger, sizeof linger);
    /* the socket file is born with the right mode (umask), and chmod makes sure of it */
    mode_t old = kind == ENDPOINT_IPC ? umask((mode_t)(~mode & 0777)) : 0;
    int rc = nn_bind(l->sock, endpoint);
    int e = nn_errno();
    if (kind == ENDPOINT_IPC)
        umask(old);
    if (rc < 0) {
        snprintf(err, errlen, "cannot listen on %s: %s%s", endpoint, nn_strerror(e),
                 e == EADDRINUSE ? " (another grpod runs there?)" : "");
        return -1;
    }
    l->bound = true;
    if (kind == ENDPOINT_IPC) {
        int tries = 0;
        while (chmod(l->ipc_path, mode) != 0 && errno == ENOENT && tries++ < 100)
            transport_sleep(0.01);
        struct stat st;
        if (stat(l->ipc_path, &st) != 0 || (st.st_mode & 0777) != mode) {
            snprintf(err, errlen, "cannot set mode %04o on %s: %s", (unsigned)mode, l->ipc_path, strerror(errno));
            return -1;
        }
    }
    size_t rsz = sizeof l->rcvfd, ssz = sizeof l->sndfd;
    if (nn_getsockopt(l->sock, NN_SOL_SOCKET, NN_RCVFD, &l->rcvfd, &rsz) < 0 ||
        nn_getsockopt(l->sock, NN_SOL_SOCKET, NN_SNDFD, &l->sndfd, &ssz) < 0) {
        snprintf(err, errlen, "cannot get the descriptors of %s: %s", endpoint, nn_strerror(nn_errno()));
        return -1;
    }
    uv_poll_init(&d->loop, &l->rpoll, l->rcvfd);
    l->rpoll_init = true;
    uv_poll_init(&d->loop, &l->spoll, l->sndfd);
    l->spoll_init = true;
    l->rpoll.data = l->spoll.data = l;
    uv_poll_start(&l->rpoll, UV_READABLE, on_readable);
    log_info("grpod", "listening on %s%s", endpoint,
             kind == ENDPOINT_TCP ? " (requests must carry the shared secret)" : "");
    return 0;
}

static void listener_close(struct listener *l)
{
    if (l->rpoll_init)
        uv_close((uv_handle_t *)&l->rpoll, NULL);
    if (l->spoll_init)
        uv_close((uv_handle_t *)&l->spoll, NULL);
    l->rpoll_init = l->spoll_init = false;
    free(l->pending);
    l->pending = NULL;
}

/* nanomsg sockets close after the loop has let go of their descriptors */
static void listener_release(struct listener *l)
{
    if (l->sock >= 0) {
        nn_close(l->sock);
        l->sock = -1;
        if (l->bound && l->ipc_path[0])
            unlink(l->ipc_path);
    }
}

/* ---- timers and signals ---- */

static void on_tick(uv_timer_t *t)
{
    struct grpod *d = t->data;
    double now = mono_now();
    core_tick(&d->core, now);
    if (d->core.dirty_urgent)
        persist(d);
    for (int i = 0; i < d->nlisteners; i++) {
        struct listener *l = &d->listeners[i];
        if (l->pending && now - l->pending_since > 2.0) { /* the asker is gone: let the next request in */
            log_warn("grpod", "%s: dropped a reply nobody took for 2 s", l->endpoint);
            free(l->pending);
            l->pending = NULL;
            resume_reading(l);
        }
    }
    notify_status(d);
}

static void on_flush(uv_timer_t *t) { persist(t->data); }

static void on_signal(uv_signal_t *s, int signum)
{
    struct grpod *d = s->data;
    log_info("grpod", "%s: stopping (the run stays journaled in %s)", strsignal(signum), d->journal.dir);
    notify("STOPPING=1");
    uv_stop(&d->loop);
}

/* ---- configuration ---- */

static int check_config(struct grpod *d, char endpoints[][512], int *n, mode_t *mode, char *err, size_t errlen)
{
    const struct grpo_config *c = d->cfg;
    const char *list = c->grpod_endpoint[0] ? c->grpod_endpoint : GRPOD_DEFAULT_ENDPOINT;
    bool tcp = false;
    *n = 0;
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        if (*n == MAX_LISTENERS) {
            snprintf(err, errlen, "grpod.endpoint lists more than %d endpoints", MAX_LISTENERS);
            return -1;
        }
        snprintf(endpoints[*n], 512, "%.*s", (int)l, p);
        enum endpoint_kind kind;
        if (endpoint_parse(endpoints[*n], &kind, NULL, 0, err, errlen) != 0)
            return -1;
        tcp |= kind == ENDPOINT_TCP;
        (*n)++;
        p += l + (p[l] == ',');
    }
    if (parse_mode(c->grpod_socket_mode, mode) != 0) {
        snprintf(err, errlen, "grpod.socket_mode '%s' is not an octal file mode such as 0660", c->grpod_socket_mode);
        return -1;
    }
    if (tcp) {
        if (!c->grpod_secret_file[0]) {
            snprintf(err, errlen,
                     "a tcp:// endpoint needs grpod.secret_file: a file of mode 0600 holding one line of random "
                     "text (e.g. head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE)");
            return -1;
        }
        if (secret_read(c->grpod_secret_file, 1, d->secret, sizeof d->secret, err, errlen) != 0)
            return -1;
    }
    struct placement_spec ps;
    if (placement_spec_from_config(c, &ps, err, errlen) != 0)
        return -1;
    if (ps.trainer_ranks + ps.rollout_ranks > 0 &&
        placement_check(&ps, ps.trainer_ranks + ps.rollout_ranks, (int)c->data_train_batch_size, err, errlen) != 0)
        return -1;
    if (c->grpod_heartbeat_timeout_s <= c->grpod_heartbeat_interval_s) {
        snprintf(err, errlen, "grpod.heartbeat_timeout_s (%g) must exceed grpod.heartbeat_interval_s (%g)",
                 c->grpod_heartbeat_timeout_s, c->grpod_heartbeat_interval_s);
        return -1;
    }
    return 0;
}

/* Bring back the journaled run. A state file that cannot be read stops grpod (starting over would
 * overwrite it); one that reads but does not parse is kept aside and a new run begins. */
static int restore(struct grpod *d)
{
    char *text = NULL, err[512];
    if (journal_load(&d->journal, &text, err, sizeof err) != 0) {
        log_error("journal", "%s", err);
        return -1;
    }
    if (!text) {
        log_info("journal", "no journaled run in %s: starting run %s", d->journal.dir, d->core.run.id);
        return 0;
    }
    if (core_load_json(&d->core, text, mono_now(), err, sizeof err) != 0) {
        char aside[PATH_MAX + 64];
        snprintf(aside, sizeof aside, "%s.unreadable-%ld", d->journal.state_path, (long)time(NULL));
        log_error("journal", "%s: %s; kept as %s, starting a new run", d->journal.state_path, err, aside);
        if (rename(d->journal.state_path, aside) != 0)
            log_error("journal", "cannot rename it: %s", strerror(errno));
    } else {
        int present = 0;
        for (int r = 0; r < d->core.nworkers; r++)
            present += (d->core.workers[r] != NULL);
        log_info("journal", "recovered run %s (%s, step %lld, %d workers); waiting for the workers to reconnect",
                 d->core.run.id, core_run_state_name(d->core.run.state), (long long)d->core.run.step, present);
    }
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    log_init_from_env();
    static struct grpo_config cfg; /* with d below: the daemon's top-level state */
    config_init(&cfg);
    int rc = config_from_args(&cfg, &argc, argv);
    if (rc != 0) {
        config_free(&cfg);
        return rc < 0 ? 2 : 0;
    }
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {"version", no_argument, 0, 'V'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "hV", opts, NULL)) != -1) {
        if (o == 'h' || o == 'V') {
            if (o == 'h')
                usage(stdout);
            else
                printf("grpod %s (protocol %u.%u%s)\n", GRPO_VERSION_STRING, GRPO_PROTOCOL_VERSION, GRPO_PROTOCOL_MINOR,
#ifdef GRPO_HAVE_SYSTEMD
                       ", sd_notify"
#else
                       ""
#endif
                );
            config_free(&cfg);
            return 0;
        }
        usage(stderr);
        config_free(&cfg);
        return 2;
    }
    if (optind < argc) {
        log_error("grpod", "unexpected argument '%s' (see grpod --help)", argv[optind]);
        config_free(&cfg);
        return 2;
    }

    static struct grpod d; /* the daemon's one top-level context */
    d.cfg = &cfg;
    d.exit_code = 1;
    d.journal.dir_fd = d.journal.lock_fd = d.journal.events_fd = -1;
    char endpoints[MAX_LISTENERS][512], err[1024];
    int nend = 0;
    mode_t mode = 0660;
    bool loop_ready = false, core_ready = false, handles_ready = false;
    if (check_config(&d, endpoints, &nend, &mode, err, sizeof err) != 0) {
        log_error("grpod", "%s", err);
        config_free(&cfg);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    /* 1. the state directory, locked: one grpod per run */
    if (journal_open(&d.journal, cfg.grpod_state_dir, err, sizeof err) != 0) {
        log_error("journal", "%s", err);
        goto cleanup;
    }
    /* 2. the run, recovered from the journal when there is one */
    struct placement_spec ps;
    placement_spec_from_config(&cfg, &ps, err, sizeof err); /* checked in settings_check */
    struct core_settings set = {
        .rollout_ranks = ps.rollout_ranks,
        .trainer_ranks = ps.trainer_ranks,
        .tp_size = ps.tp_size,
        .pp_size = ps.pp_size,
        .heartbeat_interval_s = cfg.grpod_heartbeat_interval_s,
        .heartbeat_timeout_s = cfg.grpod_heartbeat_timeout_s,
        .fail_on_lost = strcmp(cfg.grpod_on_worker_lost, "fail") == 0,
        .data_endpoint = cfg.grpod_data_endpoint,
        .http_url = d.http_url,
    };
    core_init(&d.core, &set, mono_now());
    core_ready = true;
    if (restore(&d) != 0)
        goto cleanup;
    core_set_event_hook(&d.core, on_event, &d);
    /* 3. the loop and its sockets */
    if (uv_loop_init(&d.loop) != 0) {
        log_error("grpod", "cannot create the event loop");
        goto cleanup;
    }
    loop_ready = true;
    for (int i = 0; i < nend; i++) {
        d.nlisteners++; /* counted before it opens: cleanup releases whatever it got */
        if (listener_open(&d, &d.listeners[i], endpoints[i], mode, err, sizeof err) != 0) {
            log_error("grpod", "%s", err);
            goto cleanup;
        }
    }
    /* 4. HTTP: status page, /api/status, /metrics */
    if (cfg.grpod_http_listen[0]) {
        d.http = http_start(&d.loop, cfg.grpod_http_listen, &d.core, mono_now, d.http_url, sizeof d.http_url, err,
                            sizeof err);
        if (!d.http) {
            log_error("http", "%s", err);
            goto cleanup;
        }
        log_info("http", "status page at %s/ (also /api/status and /metrics)", d.http_url);
    }
    /* 5. signals and timers */
    uv_signal_init(&d.loop, &d.sigterm);
    uv_signal_init(&d.loop, &d.sigint);
    d.sigterm.data = d.sigint.data = &d;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);
    uv_timer_init(&d.loop, &d.tick);
    uv_timer_init(&d.loop, &d.flush);
    d.tick.data = d.flush.data = &d;
    uv_timer_start(&d.tick, on_tick, 250, 250);
    uv_timer_start(&d.flush, on_flush, 1000, 1000);
    handles_ready = true;
    persist(&d);
    log_info("grpod", "grpod %s ready: run %s (%s), protocol %u.%u, state in %s", GRPO_VERSION_STRING, d.core.run.id,
             core_run_state_name(d.core.run.state), GRPO_PROTOCOL_VERSION, GRPO_PROTOCOL_MINOR, d.journal.dir);
    notify("READY=1");
    notify_status(&d);

    uv_run(&d.loop, UV_RUN_DEFAULT);
    d.exit_code = 0;

cleanup:
    /* reverse order: timers and signals, HTTP, sockets, then the journal's last word */
    if (loop_ready) {
        if (handles_ready) {
            uv_close((uv_handle_t *)&d.tick, NULL);
            uv_close((uv_handle_t *)&d.flush, NULL);
            uv_close((uv_handle_t *)&d.sigterm, NULL);
            uv_close((uv_handle_t *)&d.sigint, NULL);
        }
        http_stop(d.http);
        for (int i = 0; i < d.nlisteners; i++)
            listener_close(&d.listeners[i]);
        uv_run(&d.loop, UV_RUN_DEFAULT); /* let the close callbacks run */
        for (int i = 0; i < d.nlisteners; i++)
            listener_release(&d.listeners[i]);
        if (uv_loop_close(&d.loop) != 0)
            log_warn("grpod", "the event loop still had open handles at exit");
    }
    if (core_ready) {
        d.core.dirty = true;
        if (d.journal.dir_fd >= 0)
            persist(&d);
        core_deinit(&d.core);
    }
    journal_close(&d.journal);
    config_free(&cfg);
    if (d.exit_code == 0)
        log_info("grpod", "stopped");
    return d.exit_code;
}
