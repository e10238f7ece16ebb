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
#include <dirent.h>
#include <sys/resource.h>
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
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/placement.h"
#include "core.h"
#include "daemon/grpod_version.h"
#include "http.h"
#include "journal.h"
#include "proto/transport.h"
#include "ratelimit.h"
#include "sp_tcp.h"

#define MAX_LISTENERS 4
/* the health tick (core_tick): grpod judges its own pauses against it */
#define TICK_MS 250

struct grpod;

/* One control endpoint: a nanomsg REP socket in the loop (ipc://), or grpod's own SP server (tcp://, which
 * limits and authenticates connections: sp_tcp.h). */
struct listener {
    struct grpod *d;
    struct sp_server *tcp;  /* tcp:// */
    int sock, rcvfd, sndfd; /* ipc:// */
    uv_poll_t rpoll, spoll;
    bool rpoll_init, spoll_init;
    bool bound; /* the ipc socket file is ours to remove */
    char endpoint[512];
    char ipc_path[512];
    dev_t ipc_dev; /* of the socket file bound, so that only it is removed at exit */
    ino_t ipc_ino;
    bool needs_secret;
    uint8_t *pending; /* a reply the socket could not take yet */
    size_t pending_len;
    double pending_since;
    struct ratelimit rl_recv; /* of "receive failed" lines */
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
    double last_save_s, last_save_at; /* how long the last state file took to write whole, and when it ended */
};

static void usage(FILE *out)
{
    fputs("usage: grpod [--config FILE] [key.path=value ...] [options]\n"
          "\n"
          "Coordinator of a GRPO run: registers workers, assigns roles, watches their health,\n"
          "pauses, resumes, checkpoints and stops the run, serves a status page and metrics.\n"
          "grpod needs none of the run's keys: the first rank's configuration defines the run and\n"
          "every other rank must match it (a refusal names the keys that differ); a rank given\n"
          "with grpo-worker --replace-rank takes the run's configuration from grpod. Keys of the run\n"
          "given to grpod (placement.*, trainer.nnodes, ...) are checked against every rank.\n"
          "\n"
          "options:\n"
          "  -c, --config FILE      YAML configuration (the grpod.* keys; docs/configuration.md)\n"
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
    d->core.record_rank = -1;
    d->core.events_new = d->core.history_new = 0;
    const double t0 = clock_now_s();
    char *text = core_save_json(&d->core);
    char err[512];
    const int rc = journal_save(&d->journal, text, err, sizeof err);
    d->last_save_at = clock_now_s();
    d->last_save_s = d->last_save_at - t0;
    d->core.counters.journal_seconds += d->last_save_s;
    if (rc != 0)
        log_error("journal", "%s (the run's state is not durable until this is fixed)", err);
    else {
        d->core.dirty = d->core.dirty_urgent = false;
        d->core.counters.journal_saves++;
        d->core.counters.journal_bytes += strlen(text);
    }
    free(text);
}

/* What must be durable before the answer goes out: a registration's or a heartbeat's record alone (one line
 * appended: a state file of 10,000 workers rewritten for each of 10,000 registrations was the registry's first limit,
 * and one rewritten at each step held grpod's loop for a second: docs/scaling.md), else the whole state. A record
 * leaves the state dirty: the periodic write (on_flush) brings the state file up to date within a second, and empties
 * the record log. */
static void make_durable(struct grpod *d)
{
    if (!d->core.dirty_urgent)
        return;
    char *line = d->core.record_rank >= 0 ? core_save_record(&d->core) : NULL;
    char err[512];
    if (line && journal_append(&d->journal, line, err, sizeof err) == 0) {
        d->core.dirty_urgent = false;
        d->core.record_rank = -1;
        d->core.events_new = d->core.history_new = 0;
        d->core.counters.journal_records++;
        d->core.counters.journal_bytes += strlen(line) + 1;
    } else {
        if (line)
            log_warn("journal", "%s; writing the whole state instead", err);
        persist(d);
    }
    free(line);
}

static void on_event(void *ud, double time, const char *text)
{
    struct grpod *d = ud;
    d->core.counters.journal_event_bytes += journal_event(&d->journal, time, text);
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
    l->pending_since = clock_now_s();
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
            int e = nn_errno();
            if (e != EAGAIN && e != EINTR &&
                ratelimit_allow(&l->rl_recv, clock_now_s(), 5, "grpod", "receive failures"))
                log_warn("grpod", "%s: receive failed: %s", l->endpoint, nn_strerror(e));
            return;
        }
        size_t rlen;
        uint8_t *reply =
            core_handle(&d->core, msg, (size_t)n, l->needs_secret ? d->secret : NULL, clock_now_s(), &rlen);
        nn_freemsg(msg);
        make_durable(d); /* registrations and commands are durable before they are answered */
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

/* The requests grpod refused as failed attempts so far: authentication (a plain request, the secret itself, a box
 * that does not open, a replay), a bad hello, garbage, another protocol version. A session grpod forgot (reauth) is
 * not one. */
static uint64_t failed_requests(const struct core *c)
{
    return c->counters.auth_failed + c->counters.replayed + c->counters.invalid + c->counters.malformed +
           c->counters.bad_version;
}

/* A request on a tcp:// endpoint: sealed in a session that proved the secret (or a hello, answered with a
 * challenge); says whether the connection may stay, and whether the request was a failed attempt (answered late,
 * and TCP_MAX_FAILURES of them close the connection). */
static uint8_t *on_tcp_request(void *ud, const uint8_t *msg, size_t len, bool *authenticated, bool *failed,
                               size_t *reply_len)
{
    struct listener *l = ud;
    struct grpod *d = l->d;
    const uint64_t failed0 = failed_requests(&d->core);
    uint8_t *reply = core_handle_auth(&d->core, msg, len, d->secret, clock_now_s(), reply_len, authenticated);
    *failed = failed_requests(&d->core) > failed0;
    make_durable(d); /* registrations and commands are durable before they are answered */
    return reply;
}

/* Limits of a tcp:// endpoint before the descriptor budget is known (fd_budget sets the caps). */
static const struct sp_limits tcp_limits = {
    .max_conns = 64,
    .max_pending = 32,
    .max_pending_per_ip = 16,
    .handshake_s = 2.0,
    .auth_deadline_s = 5.0,
    .max_msg = GRPO_MAX_CONTROL_BYTES,
    .max_pending_msg = 64 * 1024, /* a registration, a heartbeat or a command is far smaller */
    .max_failures = GRPOD_MAX_FAILED_ATTEMPTS,
    .failure_delay_s = GRPOD_FAILED_ATTEMPT_DELAY_S,
};

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
    if (kind == ENDPOINT_TCP) {
        l->tcp = sp_server_start(&d->loop, endpoint, &tcp_limits, on_tcp_request, l, clock_now_s, err, errlen);
        if (!l->tcp)
            return -1;
        log_info("grpod", "listening on %s (clients prove the shared secret by challenge-response; requests sealed)",
                 endpoint);
        return 0;
    }
    l->sock = nn_socket(AF_SP, NN_REP);
    if (l->sock < 0) {
        snprintf(err, errlen, "nn_socket: %s", nn_strerror(nn_errno()));
        return -1;
    }
    int max = (int)GRPO_MAX_CONTROL_BYTES, linger = 0;
    nn_setsockopt(l->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof max);
    nn_setsockopt(l->sock, NN_SOL_SOCKET, NN_LINGER, &linger, sizeof linger);
    /* nanomsg's bind removes whatever refuses a connection at the path (a regular file too) and aborts on a
     * directory: only a stale socket may go, anything else is refused first; the socket file is born with its mode */
    char why[700];
    if (endpoint_bind(l->sock, endpoint, mode, why, sizeof why) != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", endpoint, why);
        return -1;
    }
    l->bound = true;
    if (kind == ENDPOINT_IPC) {
        struct stat st;
        if (lstat(l->ipc_path, &st) != 0) {
            snprintf(err, errlen, "cannot stat %s: %s", l->ipc_path, strerror(errno));
            return -1;
        }
        l->ipc_dev = st.st_dev;
        l->ipc_ino = st.st_ino;
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
    log_info("grpod", "listening on %s", endpoint);
    return 0;
}

static void listener_close(struct listener *l)
{
    sp_server_stop(l->tcp);
    l->tcp = NULL;
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
        struct stat st; /* our socket, not whatever may have replaced it since */
        if (l->bound && l->ipc_path[0] && lstat(l->ipc_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
            st.st_dev == l->ipc_dev && st.st_ino == l->ipc_ino)
            unlink(l->ipc_path);
    }
}

/* ---- descriptors ---- */

/* Descriptors kept free for what must always work: the journal's writes, IPC clients (grpoctl on the head
 * node), nanomsg's own, systemd's notifications. Connections from the network get the rest. */
#define FD_RESERVE 32

/* Raise the soft RLIMIT_NOFILE to the hard one (grpod polls with epoll, so no FD_SETSIZE bound); the limit. */
static long raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl.rlim_cur = rl.rlim_max;
    }
    return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (1 << 30) ? (1 << 30) : (long)rl.rlim_cur;
}

static int open_descriptors(void)
{
    DIR *dir = opendir("/proc/self/fd");
    if (!dir)
        return 64; /* a guess on the safe side */
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n - 1; /* the directory's own */
}

/* Share what the limit leaves, after the descriptors open now and the reserve, between the tcp endpoints
 * and HTTP, so that no flood of connections can take the last descriptor. */
static void fd_budget(struct grpod *d, long nofile)
{
    int ntcp = 0;
    for (int i = 0; i < d->nlisteners; i++)
        ntcp += d->listeners[i].tcp != NULL;
    long left = nofile - open_descriptors() - FD_RESERVE;
    if (left < 8)
        left = 8;
    int http_cap = d->http ? (int)(left / (ntcp ? 4 : 1)) : 0;
    if (http_cap > 256)
        http_cap = 256;
    if (d->http && http_cap < 4)
        http_cap = 4;
    long tcp_cap = ntcp ? (left - http_cap) / ntcp : 0;
    if (tcp_cap > 2 * CORE_MAX_WORKERS + 64) /* every worker keeps two connections at most */
        tcp_cap = 2 * CORE_MAX_WORKERS + 64;
    if (ntcp && tcp_cap < 4)
        tcp_cap = 4;
    struct sp_limits lim = tcp_limits;
    lim.max_conns = (int)tcp_cap;
    /* a host's ranks connect at once when a job starts: room for them, while one address cannot take all */
    lim.max_pending = lim.max_conns / 2 < 128 ? (lim.max_conns / 2 > 1 ? lim.max_conns / 2 : 1) : 128;
    lim.max_pending_per_ip = lim.max_pending < 32 ? lim.max_pending : 32;
    for (int i = 0; i < d->nlisteners; i++)
        if (d->listeners[i].tcp)
            sp_server_set_limits(d->listeners[i].tcp, &lim);
    if (d->http)
        http_set_connection_limit(d->http, http_cap);
    log_info("grpod",
             "descriptors: limit %ld, %d open, %d kept in reserve; each tcp endpoint takes %d connections (%d not yet "
             "authenticated, %d from one address, %.0f s to authenticate), HTTP %d",
             nofile, open_descriptors(), FD_RESERVE, lim.max_conns, lim.max_pending, lim.max_pending_per_ip,
             lim.auth_deadline_s, http_cap);
    if (ntcp && tcp_cap < 2 * 16)
        log_warn("grpod", "few descriptors for tcp connections (limit %ld): raise LimitNOFILE / ulimit -n", nofile);
}

/* ---- timers and signals ---- */

static void on_tick(uv_timer_t *t)
{
    struct grpod *d = t->data;
    double now = clock_now_s();
    core_tick(&d->core, now);
    if (d->core.dirty_urgent)
        persist(d);
    uint64_t failing = 0;
    for (int i = 0; i < d->nlisteners; i++) {
        struct listener *l = &d->listeners[i];
        if (l->tcp) {
            struct sp_stats st;
            sp_server_stats(l->tcp, &st);
            failing += st.closed_failing;
        }
        if (l->pending && now - l->pending_since > 2.0) { /* the asker is gone: let the next request in */
            log_warn("grpod", "%s: dropped a reply nobody took for 2 s", l->endpoint);
            free(l->pending);
            l->pending = NULL;
            resume_reading(l);
        }
    }
    d->core.counters.closed_failing_tcp = failing;
    notify_status(d);
}

/* The periodic write of what changed and need not be durable at once: at most once a second, and while a write
 * takes over a tenth of a second (10 MB of 10,000 workers on a loaded host), at most once every ten of its own
 * lengths, so that it holds grpod's loop a tenth of the time at most (docs/scaling.md). What must be durable
 * before its answer (make_durable) is never held back. */
static void on_flush(uv_timer_t *t)
{
    struct grpod *d = t->data;
    if (clock_now_s() - d->last_save_at < 10 * d->last_save_s)
        return;
    persist(d);
}

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
            snprintf(err, errlen, KEY_grpod_endpoint " lists more than %d endpoints", MAX_LISTENERS);
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
        snprintf(err, errlen, KEY_grpod_socket_mode " '%s' is not an octal file mode such as 0660",
                 c->grpod_socket_mode);
        return -1;
    }
    if (tcp) {
        if (!c->grpod_secret_file[0]) {
            snprintf(err, errlen,
                     "a tcp:// endpoint needs " KEY_grpod_secret_file
                     ": a file of mode 0600 holding one line of random "
                     "text (e.g. head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE)");
            return -1;
        }
        if (secret_read(c->grpod_secret_file, d->secret, sizeof d->secret, err, errlen) != 0)
            return -1;
    }
    struct placement_spec ps;
    if (placement_spec_from_config(c, &ps, err, errlen) != 0)
        return -1;
    if (ps.trainer_ranks + ps.rollout_ranks > 0 &&
        placement_check(&ps, ps.trainer_ranks + ps.rollout_ranks, (int)c->data_train_batch_size, err, errlen) != 0)
        return -1;
    if (c->grpod_heartbeat_timeout_s <= c->grpod_heartbeat_interval_s) {
        snprintf(err, errlen, KEY_grpod_heartbeat_timeout_s " (%g) must exceed " KEY_grpod_heartbeat_interval_s " (%g)",
                 c->grpod_heartbeat_timeout_s, c->grpod_heartbeat_interval_s);
        return -1;
    }
    return 0;
}

/* A journal that is no journal of ours: renamed STATE.unreadable-TIME, kept for the operator. */
static void set_aside(struct grpod *d, const char *why)
{
    char aside[PATH_MAX + 64];
    snprintf(aside, sizeof aside, "%s.unreadable-%ld", d->journal.state_path, (long)time(NULL));
    log_error("journal", "%s; kept as %s, starting a new run", why, aside);
    if (rename(d->journal.state_path, aside) != 0)
        log_error("journal", "cannot rename it: %s", strerror(errno));
}

/* The records appended since the state file (registrations), in order; a torn last line (a crash while it was
 * written: its registration was never answered) ends them. */
static void apply_records(struct grpod *d)
{
    char *text = NULL, err[512];
    if (journal_load_log(&d->journal, &text, err, sizeof err) != 0) {
        log_error("journal", "%s (the registrations since the state file are not restored)", err);
        return;
    }
    int n = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (!next) {
            log_warn("journal", "%s: its last record is torn (a crash while it was written): left out",
                     d->journal.log_path);
            break;
        }
        *next++ = 0;
        if (core_apply_record(&d->core, line, clock_now_s(), err, sizeof err) != 0) {
            log_warn("journal", "%s: %s: the records from there are left out", d->journal.log_path, err);
            break;
        }
        n++;
    }
    if (n)
        log_info("journal", "%d record(s) of %s applied over the state file", n, d->journal.log_path);
    free(text);
}

/* Bring back the journaled run. A state file that cannot be read stops grpod (starting over would
 * overwrite it); one that is not a regular file, is over the size limit, or reads but does not parse is kept
 * aside and a new run begins. */
static int restore(struct grpod *d)
{
    char *text = NULL, err[512];
    int lrc = journal_load(&d->journal, &text, err, sizeof err);
    if (lrc < 0) {
        log_error("journal", "%s", err);
        return -1;
    }
    if (lrc > 0) {
        set_aside(d, err);
        return 0;
    }
    if (!text) {
        log_info("journal", "no journaled run in %s: starting run %s", d->journal.dir, d->core.run.id);
        return 0;
    }
    if (core_load_json(&d->core, text, clock_now_s(), err, sizeof err) != 0) {
        char why[PATH_MAX + 600];
        snprintf(why, sizeof why, "%s: %s", d->journal.state_path, err);
        set_aside(d, why);
    } else {
        apply_records(d);
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
    char *own_config = NULL;
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
    long nofile = raise_nofile();

    /* 1. the state directory, locked: one grpod per run */
    if (journal_open(&d.journal, cfg.grpod_state_dir, err, sizeof err) != 0) {
        log_error("journal", "%s", err);
        goto cleanup;
    }
    /* 2. the run, recovered from the journal when there is one */
    own_config = config_run_text(&cfg, CONFIG_TEXT_GIVEN | CONFIG_TEXT_NO_COUNTS);
    struct core_settings set = {
        .own_config = own_config,
        .heartbeat_interval_s = cfg.grpod_heartbeat_interval_s,
        .heartbeat_timeout_s = cfg.grpod_heartbeat_timeout_s,
        .tick_s = TICK_MS / 1000.0,
        .fail_on_lost = strcmp(cfg.grpod_on_worker_lost, "fail") == 0,
        .hang_wait_s = cfg.grpod_hang_wait_s,
        .data_endpoint = cfg.grpod_data_endpoint,
        .http_url = d.http_url,
    };
    core_settings_place(&set, &cfg, err, sizeof err); /* checked in settings_check */
    if (set.own_placement || own_config[0])
        log_info("grpod", "checking every rank against grpod's own keys%s",
                 set.own_placement ? ", placement included" : "");
    else
        log_info("grpod", "no run keys given: the first rank's configuration defines the run");
    core_init(&d.core, &set, clock_now_s());
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
        d.http = http_start(&d.loop, cfg.grpod_http_listen, &d.core, clock_now_s, d.http_url, sizeof d.http_url, err,
                            sizeof err);
        if (!d.http) {
            log_error("http", "%s", err);
            goto cleanup;
        }
        log_info("http", "status page at %s/ (also /api/status and /metrics)", d.http_url);
    }
    fd_budget(&d, nofile);
    /* 5. signals and timers */
    uv_signal_init(&d.loop, &d.sigterm);
    uv_signal_init(&d.loop, &d.sigint);
    d.sigterm.data = d.sigint.data = &d;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);
    uv_timer_init(&d.loop, &d.tick);
    uv_timer_init(&d.loop, &d.flush);
    d.tick.data = d.flush.data = &d;
    uv_timer_start(&d.tick, on_tick, TICK_MS, TICK_MS);
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
    free(own_config);
    if (d.exit_code == 0)
        log_info("grpod", "stopped");
    return d.exit_code;
}
