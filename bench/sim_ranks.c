/* sim_ranks: many simulated grpo-worker ranks in one process, speaking the real protocol, generating nothing.
 *
 * Each simulated rank has its own nanomsg REQ socket to grpod (as a worker's control client has), registers with
 * a Register the way worker/control/control.c does (rank, world size, host, pid, capabilities, the configuration's
 * digest, the launch), and heartbeats every interval with a realistic payload (10 metrics, 4 phase timings). A
 * rollout rank (--rollout) also opens a REQ socket to the dispatcher its Assignment names and, with the data-plane
 * key the Assignment hands it, asks for work units (done at once: nothing is generated), fetches each new policy
 * version in chunks, and pings every interval, every request authenticated (proto/plane_auth.h). Every message is
 * packed, unpacked and authenticated by the project's own functions (proto/protocol.h, proto/plane_auth.h).
 *
 * One thread: every socket is polled through its NN_RCVFD, one request in flight per socket (REQ). nanomsg caps a
 * process at 512 sockets (its NN_MAX_SOCKETS): run several sim_ranks processes for more ranks
 * (bench/run_scale_bench.sh does).
 *
 * --trainer: world rank 0, a trainer. It registers, takes the run key and the dispatcher's endpoint from its
 * Assignment, runs the real dispatcher (worker/plane/dispatch.h) for the rollout ranks, publishes versions of
 * --floats parameters and counts grants: once each unit of a step is delivered (its holder's next ask says so), it
 * publishes the next version, as the trainers do once they have trained the step. It reports grants per second, each
 * step's time from publish to the last unit delivered, and the weight bytes the dispatcher served.
 *
 *   sim_ranks --endpoint ipc://.../ctl.sock --world W --first R --count K [--rollout] [--seconds S]
 *   sim_ranks --endpoint ipc://.../ctl.sock --world W --trainer --units U --steps N [--floats F]
 * SIGUSR1 starts a measured window: the latencies and counts so far (registration's) are dropped; SIGUSR2 prints the
 * summary line and goes on; SIGTERM ends the run and prints it.
 * Common options: --interval 1.0 (heartbeats and pings), --launch HEX (the same in every process of a run),
 * --digest N, --step-s S --step-base UNIX_S (the heartbeats' step: one more every S seconds since the base),
 * --register-timeout S (a registration unanswered this long is sent again after a backoff, waiting twice as long
 * each time up to 32 s, as grpo-worker's from its 2 s; 0, the default: wait for the answer), --relay K (the weight
 * relay tree of fan-out K, trainer and rollout ranks alike: each rollout rank asks the dispatcher where to take a
 * version from, fetches it there, from the dispatcher or from another rank's relay, checks a relayed one against
 * the digest, and serves it on a relay of its own, the project's (worker/plane/relay.h); a rank then holds a copy of
 * the version and uses two more sockets). Output:
 * one "sim_ranks: ..." summary line of key=value pairs on stdout. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/hb_payload.h"
#include "common/check.h"
#include "common/clock.h"
#include "proto/plane_auth.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "worker/plane/dispatch.h"
#include "worker/plane/relay.h"

/* what a socket's request in flight is */
enum req_kind {
    REQ_NONE,
    REQ_REGISTER,
    REQ_HEARTBEAT,
    REQ_PING,
    REQ_WORK,
    REQ_WEIGHTS,
    REQ_RELAY,
    REQ_HOLD,
    REQ_CHUNK
};

/* the relay tree (--relay K): where a rollout rank is in taking a version */
enum relay_state { RS_NONE, RS_ASK, RS_DIRECT, RS_RELAY, RS_HOLD };

struct sock {
    int s, fd;          /* nanomsg socket, its NN_RCVFD */
    enum req_kind kind; /* in flight (REQ_NONE: idle) */
    uint64_t rid, counter;
    double sent_at;
};

struct rank {
    int rank;
    struct sock ctl, disp;
    bool registered, failed, ended;
    uint64_t incarnation;
    double hb_due, retry_at;
    double reg_first_at, backoff; /* the first registration's send; the wait before the next try (control.c's) */
    double reg_timeout;           /* this rank's wait for an answer: --register-timeout, doubled when it runs out */
    /* the dispatcher (rollout ranks) */
    struct plane_cred cred;
    uint64_t worker_id;
    int slot;
    double ping_due, ask_due;
    int64_t last_step, held_version, want_version;
    int last_unit;
    size_t fetch_off, n_floats;
    /* the relay tree (--relay K): this rank's relay (the project's, worker/plane/relay.h) serving the version it holds
     * from buf, the relay it fetches from (rcli), the version's digest, the relay to name as failed */
    struct relay_server *srv;
    char dial[300];
    float *buf;
    struct sock rcli;
    enum relay_state rs;
    uint8_t digest[RELAY_DIGEST_BYTES], token[RELAY_TOKEN_BYTES];
    int relay_rank, bad_rank;
    double wait_since, wait_pause;
};

struct lat {
    double *v;
    size_t n, cap;
};

static void lat_add(struct lat *l, double x)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->v = xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double lat_pct(struct lat *l, double p)
{
    if (!l->n)
        return NAN;
    qsort(l->v, l->n, sizeof *l->v, cmp_double);
    size_t i = (size_t)floor(p / 100.0 * (double)l->n);
    return l->v[i < l->n ? i : l->n - 1];
}

struct sim {
    const char *endpoint;
    int world, first, count, units;
    bool rollout;
    double interval, seconds, step_s, step_base, register_timeout;
    uint64_t launch, digest;
    struct rank *r;
    uint64_t next_rid;
    /* counts */
    long registered, refused, heartbeats, pings, grants, waits, ends, chunks, errors, reregister;
    int relay;                                       /* --relay: the tree's fan-out (0: off) */
    long relayed, relay_failed, relay_waits, direct; /* versions taken from a relay, relays failed, waits, direct */
    long reg_tries, reg_timeouts,
        reg_retries; /* registrations sent; given up on after --register-timeout; told to retry */
    int64_t weight_bytes;
    struct lat reg_lat, hb_lat, work_lat;
    char last_error[512];
};

static volatile sig_atomic_t stop_now, reset_now, print_now;
static void on_signal(int sig)
{
    if (sig == SIGUSR1) /* the measured window begins: what came before (the registrations) is forgotten */
        reset_now = 1;
    else if (sig == SIGUSR2) /* the window's summary, and the run goes on */
        print_now = 1;
    else
        stop_now = 1;
}

static void note_error(struct sim *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_error(struct sim *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->last_error, sizeof s->last_error, fmt, ap);
    va_end(ap);
    if (s->errors++ < 10)
        fprintf(stderr, "sim_ranks: %s\n", s->last_error);
}

/* A REQ socket connected to endpoint; -1 with err (nanomsg's socket cap shows here: "Too many open files"). */
static int sock_open(struct sock *k, const char *endpoint, char *err, size_t errlen)
{
    *k = (struct sock){.s = -1, .fd = -1};
    int s = nn_socket(AF_SP, NN_REQ);
    if (s < 0)
        return error_set(err, errlen, "nn_socket: %s", nn_strerror(nn_errno()));
    int maxsz = -1; /* answers of any size (the status of 10,000 workers is megabytes) */
    size_t fl = sizeof k->fd;
    if (nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsz, sizeof maxsz) != 0 || nn_connect(s, endpoint) < 0 ||
        nn_getsockopt(s, NN_SOL_SOCKET, NN_RCVFD, &k->fd, &fl) != 0) {
        error_set(err, errlen, "%s: %s", endpoint, nn_strerror(nn_errno()));
        nn_close(s);
        return -1;
    }
    k->s = s;
    return 0;
}

/* Send env on k (packed with plane credentials when cred is not NULL); false on failure. */
static bool sock_send(struct sim *s, struct sock *k, Grpo__Envelope *env, struct plane_cred *cred, enum req_kind kind)
{
    env->request_id = ++s->next_rid;
    size_t len;
    uint8_t *buf = cred ? plane_pack_request_n(env, cred, &k->counter, &len) : protocol_pack(env, &len);
    if (!buf) {
        note_error(s, "cannot pack a %s", protocol_body_name(env->body_case));
        return false;
    }
    int n = nn_send(k->s, buf, len, NN_DONTWAIT);
    free(buf);
    if (n < 0) {
        note_error(s, "send: %s", nn_strerror(nn_errno()));
        return false;
    }
    k->rid = env->request_id;
    k->kind = kind;
    k->sent_at = clock_now_s();
    return true;
}

/* The answer waiting on k, decoded (the caller frees it), or NULL (nothing yet, or garbage: counted). */
static Grpo__Envelope *sock_recv(struct sim *s, struct sock *k)
{
    void *msg = NULL;
    int n = nn_recv(k->s, &msg, NN_MSG, NN_DONTWAIT);
    if (n < 0)
        return NULL;
    Grpo__Envelope *env = NULL;
    char why[256];
    enum protocol_error pe = protocol_decode(msg, (size_t)n, GRPO_MAX_MESSAGE_BYTES, &env, why, sizeof why);
    nn_freemsg(msg);
    if (pe != PROTOCOL_OK) {
        note_error(s, "an answer that does not decode: %s", why);
        protocol_free(env);
        k->kind = REQ_NONE;
        return NULL;
    }
    if (env->request_id != k->rid) { /* a late answer to an earlier try: REQ drops those, but be sure */
        protocol_free(env);
        return NULL;
    }
    return env;
}

/* ---- grpod: register and heartbeat ---- */

/* env: a registration of rank on host offering caps, one simulated device (the strings must outlive env's send) */
static void register_fill(const struct sim *s, Grpo__Envelope *env, Grpo__Register *reg, int rank, char *host,
                          char **caps, size_t ncaps)
{
    static char *dev[] = {"cpu sim"};
    reg->rank = rank;
    reg->world_size = s->world;
    reg->host = host;
    reg->pid = getpid();
    reg->capabilities = caps;
    reg->n_capabilities = ncaps;
    reg->devices = dev;
    reg->n_devices = 1;
    reg->config_digest = s->digest;
    reg->launch = s->launch;
    reg->world_hosts = 1;
    env->body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env->register_ = reg;
}

static void send_register(struct sim *s, struct rank *r)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    /* a plain rank offers both roles, as grpod_bench's do: grpod's placement gives it one */
    char host[32], *caps_rollout[] = {"rollout"}, *caps_both[] = {"rollout", "trainer"};
    snprintf(host, sizeof host, "sim%04d", r->rank / 8); /* 8 ranks a host */
    register_fill(s, &env, &reg, r->rank, host, s->rollout ? caps_rollout : caps_both, s->rollout ? 1 : 2);
    if (!sock_send(s, &r->ctl, &env, NULL, REQ_REGISTER)) {
        r->retry_at = clock_now_s() + 1.0;
        return;
    }
    s->reg_tries++;
    if (!r->reg_first_at)
        r->reg_first_at = r->ctl.sent_at;
}

static void send_heartbeat(struct sim *s, struct rank *r, double now, double t0)
{
    struct hb_payload payload;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    hb.rank = r->rank;
    hb.incarnation = r->incarnation;
    hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
    /* the run's steps, the same in every process: one every --step-s seconds of the wall clock since --step-base
     * (a step is journaled whole by grpod: the journal's bytes per hour follow the steps); 1 without */
    hb.step = s->step_s > 0 ? 1 + (int64_t)((clock_wall_s() - s->step_base) / s->step_s) : 1;
    hb.total_steps = 1000;
    hb.phase = s->rollout ? GRPO__PHASE__PHASE_GEN : GRPO__PHASE__PHASE_UPDATE_ACTOR;
    hb.busy_seconds = now - t0;
    hb_payload_set(&payload, &hb);
    hb.checkpoint_step = -1;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    sock_send(s, &r->ctl, &env, NULL, REQ_HEARTBEAT);
}

/* The wait before a rank's next registration, as grpo-worker's: 0.1 s, doubling to 2 s. */
static double next_backoff(struct rank *r)
{
    r->backoff = r->backoff > 0 ? fmin(2 * r->backoff, 2.0) : 0.1;
    return r->backoff;
}

static void on_ctl_answer(struct sim *s, struct rank *r, Grpo__Envelope *a, double now)
{
    const enum req_kind kind = r->ctl.kind;
    r->ctl.kind = REQ_NONE;
    if (kind == REQ_REGISTER) {
        if (a->body_case == GRPO__ENVELOPE__BODY_ASSIGNMENT) {
            const Grpo__Assignment *as = a->assignment;
            r->registered = true;
            r->incarnation = as->incarnation;
            s->registered++;
            lat_add(&s->reg_lat, now - r->reg_first_at); /* from the first try */
            /* heartbeats spread over the interval */
            r->hb_due = now + s->interval * (double)(r->rank % 997) / 997.0;
            if (s->rollout) {
                char err[256];
                if (as->plane_key.len != PLANE_KEY_BYTES || !as->dispatch_endpoint || !as->dispatch_endpoint[0]) {
                    note_error(s, "rank %d: the assignment carries no data-plane key or dispatcher", r->rank);
                    r->failed = true;
                } else if (sock_open(&r->disp, as->dispatch_endpoint, err, sizeof err) != 0) {
                    note_error(s, "rank %d: the dispatcher: %s", r->rank, err);
                    r->failed = true;
                } else {
                    r->cred = (struct plane_cred){.id = {.rank = r->rank,
                                                         .pid = (uint32_t)getpid(),
                                                         .incarnation = as->incarnation,
                                                         .epoch = as->plane_epoch},
                                                  .set = true};
                    memcpy(r->cred.key, as->plane_key.data, PLANE_KEY_BYTES);
                    r->worker_id = plane_random64();
                    r->slot = r->rank - (s->world - s->units);
                    r->ping_due = now + s->interval;
                    r->ask_due = now;
                    char bind[300];
                    if (s->relay > 0 && (relay_endpoints(as->dispatch_endpoint, r->slot, "127.0.0.1", bind, r->dial,
                                                         sizeof r->dial, err, sizeof err) != 0 ||
                                         !(r->srv = relay_server_open(bind, r->slot, err, sizeof err)))) {
                        note_error(s, "rank %d: its relay: %s", r->rank, err);
                        r->failed = true;
                    }
                }
            }
        } else if (a->body_case == GRPO__ENVELOPE__BODY_REPLY && a->reply->retry) {
            s->reg_retries++;
            r->retry_at = now + next_backoff(r);
        } else {
            s->refused++;
            note_error(s, "rank %d refused: %s", r->rank,
                       a->body_case == GRPO__ENVELOPE__BODY_REPLY ? a->reply->error : "another answer");
            r->failed = true;
        }
        return;
    }
    if (a->body_case == GRPO__ENVELOPE__BODY_HEARTBEAT_ACK) {
        s->heartbeats++;
        lat_add(&s->hb_lat, now - r->ctl.sent_at);
        if (a->heartbeat_ack->reregister) {
            s->reregister++;
            r->registered = false;
        }
    } else {
        note_error(s, "rank %d: a heartbeat answered with %s", r->rank, protocol_body_name(a->body_case));
    }
}

/* ---- the dispatcher (rollout ranks) ---- */

static void send_work(struct sim *s, struct rank *r, bool ping)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = r->worker_id;
    w.rank = r->slot;
    w.ping = ping;
    w.end_heard = r->ended;
    if (!ping) {
        w.done_step = r->last_step;
        w.done_unit = r->last_unit;
        w.names_done = true;
    }
    env.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    env.work_request = &w;
    sock_send(s, &r->disp, &env, &r->cred, ping ? REQ_PING : REQ_WORK);
}

static void send_weights(struct sim *s, struct rank *r)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest w = GRPO__WEIGHTS_REQUEST__INIT;
    w.worker_id = r->worker_id;
    w.version = r->want_version;
    w.offset = r->fetch_off;
    size_t left = r->n_floats - r->fetch_off;
    w.count = left < DISPATCH_CHUNK_MAX_FLOATS ? left : DISPATCH_CHUNK_MAX_FLOATS;
    env.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    env.weights_request = &w;
    sock_send(s, &r->disp, &env, &r->cred, REQ_WEIGHTS);
}

/* The relay tree: a relay ask for the version wanted (naming the relay that failed, if one did), or, once it is
 * held, the report that this rank serves it. */
static void send_relay(struct sim *s, struct rank *r, bool hold)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest w = GRPO__WEIGHTS_REQUEST__INIT;
    w.worker_id = r->worker_id;
    w.version = r->want_version;
    w.relay = true;
    w.holds = hold;
    w.relay_endpoint = hold ? r->dial : "";
    w.bad_relay = !hold && r->bad_rank >= 0 ? r->bad_rank + 1 : 0;
    env.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    env.weights_request = &w;
    if (sock_send(s, &r->disp, &env, &r->cred, hold ? REQ_HOLD : REQ_RELAY))
        r->bad_rank = -1;
}

/* A chunk request to the relay the rank fetches from (no key: the digest checks what comes). */
static void send_chunk(struct sim *s, struct rank *r)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest w = GRPO__WEIGHTS_REQUEST__INIT;
    w.version = r->want_version;
    w.offset = r->fetch_off;
    const size_t left = r->n_floats - r->fetch_off;
    w.count = left < DISPATCH_CHUNK_MAX_FLOATS ? left : DISPATCH_CHUNK_MAX_FLOATS;
    w.relay_token.data = r->token;
    w.relay_token.len = RELAY_TOKEN_BYTES;
    env.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    env.weights_request = &w;
    sock_send(s, &r->rcli, &env, NULL, REQ_CHUNK);
}

static void relay_close_cli(struct rank *r)
{
    if (r->rcli.s >= 0)
        nn_close(r->rcli.s);
    r->rcli = (struct sock){.s = -1, .fd = -1};
}

/* The version is whole in buf (from the dispatcher, or from a relay and checked): it is served, and said. */
static void relay_took(struct rank *r)
{
    relay_server_hold(r->srv, r->want_version, r->buf, r->n_floats, r->token);
    r->rs = RS_HOLD;
}

/* The relay the rank fetched from failed it (why): ask again, naming it; the dispatcher sends it to trainer rank 0. */
static void relay_failed(struct sim *s, struct rank *r, const char *why, bool named, double now)
{
    relay_close_cli(r);
    if (named) {
        s->relay_failed++;
        r->bad_rank = r->relay_rank;
        note_error(s, "rank %d: rollout rank %d's relay: %s", r->rank, r->relay_rank, why);
    }
    r->rs = RS_ASK;
    r->ask_due = now;
}

/* An answer of the relay the rank fetches from. */
static void on_relay_answer(struct sim *s, struct rank *r, Grpo__Envelope *a, double now)
{
    r->rcli.kind = REQ_NONE;
    const Grpo__WeightsChunk *c = a->body_case == GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK ? a->weights_chunk : NULL;
    if (!c || (c->error && c->error[0])) {
        const bool moved_on = c && strncmp(c->error, "not held", 8) == 0; /* no fault of its */
        relay_failed(s, r, c ? c->error : "another answer", !moved_on, now);
        return;
    }
    const size_t left = r->n_floats - r->fetch_off;
    const size_t cnt = left < DISPATCH_CHUNK_MAX_FLOATS ? left : DISPATCH_CHUNK_MAX_FLOATS;
    if (c->version != r->want_version || c->offset != r->fetch_off || c->data.len != cnt * sizeof(float)) {
        relay_failed(s, r, "a chunk of the wrong version, offset or size", true, now);
        return;
    }
    memcpy(r->buf + r->fetch_off, c->data.data, c->data.len);
    s->chunks++;
    r->fetch_off += cnt;
    if (r->fetch_off < r->n_floats)
        return;
    uint8_t got[RELAY_DIGEST_BYTES];
    relay_digest(r->buf, r->n_floats, got);
    if (memcmp(got, r->digest, sizeof got) != 0) {
        relay_failed(s, r, "its digest is wrong", true, now);
        return;
    }
    relay_close_cli(r);
    s->relayed++;
    relay_took(r);
}

static void on_disp_answer(struct sim *s, struct rank *r, Grpo__Envelope *a, double now)
{
    const enum req_kind kind = r->disp.kind;
    r->disp.kind = REQ_NONE;
    char why[256];
    if (plane_verify_answer(&r->cred, r->disp.counter, a, why, sizeof why) != 0) {
        note_error(s, "rank %d: the dispatcher's answer: %s", r->rank, why);
        r->ask_due = now + 0.5;
        return;
    }
    if (a->body_case == GRPO__ENVELOPE__BODY_REPLY) {
        if (a->reply->retry) { /* over the budget: ask again shortly, as work_client does */
            r->ask_due = now + 0.02;
            return;
        }
        note_error(s, "rank %d: the dispatcher refused: %s", r->rank, a->reply->error);
        r->failed = true;
        return;
    }
    if (kind == REQ_HOLD) {
        r->rs = RS_NONE;
        r->held_version = r->want_version; /* generated at once: the next ask says the unit is done */
        return;
    }
    if (kind == REQ_RELAY) {
        const Grpo__WeightsChunk *c = a->body_case == GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK ? a->weights_chunk : NULL;
        if (!c || (c->error && c->error[0])) {
            note_error(s, "rank %d: a relay ask: %s", r->rank, c ? c->error : "another answer");
            r->rs = RS_NONE;
            r->want_version = r->held_version;
            return;
        }
        r->fetch_off = 0;
        if (c->digest.len != RELAY_DIGEST_BYTES || c->relay_token.len != RELAY_TOKEN_BYTES) { /* it relays nothing */
            r->rs = RS_DIRECT;
            s->direct++;
            return;
        }
        memcpy(r->digest, c->digest.data, RELAY_DIGEST_BYTES);
        memcpy(r->token, c->relay_token.data, RELAY_TOKEN_BYTES);
        if (c->relay_wait && now - r->wait_since < RELAY_WAIT_MAX_S) { /* ask again, 10 ms doubling to 200 ms */
            s->relay_waits++;
            r->wait_pause = r->wait_pause > 0 ? fmin(2 * r->wait_pause, 0.2) : 0.01;
            r->ask_due = now + r->wait_pause;
            return;
        }
        char err[256];
        if (c->relay_endpoint && c->relay_endpoint[0] && !c->relay_wait) {
            r->relay_rank = c->relay_rank;
            if (sock_open(&r->rcli, c->relay_endpoint, err, sizeof err) == 0) {
                r->rs = RS_RELAY;
                return;
            }
            relay_failed(s, r, err, true, now);
            return;
        }
        r->rs = RS_DIRECT;
        s->direct++;
        return;
    }
    if (kind == REQ_WEIGHTS) {
        if (a->body_case != GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK ||
            (a->weights_chunk->error && a->weights_chunk->error[0])) {
            note_error(s, "rank %d: weights: %s", r->rank,
                       a->body_case == GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK ? a->weights_chunk->error : "another answer");
            r->want_version = r->held_version; /* ask for work again: the grant says what is current */
            return;
        }
        s->chunks++;
        s->weight_bytes += (int64_t)a->weights_chunk->data.len;
        if (r->buf && a->weights_chunk->offset == r->fetch_off &&
            r->fetch_off + a->weights_chunk->data.len / sizeof(float) <= r->n_floats)
            memcpy(r->buf + r->fetch_off, a->weights_chunk->data.data, a->weights_chunk->data.len);
        r->fetch_off += a->weights_chunk->data.len / sizeof(float);
        if (a->weights_chunk->data.len == 0 || r->fetch_off >= r->n_floats) {
            if (r->srv)
                relay_took(r); /* held: said before the next ask (RS_HOLD) */
            else
                r->held_version = r->want_version; /* generated at once: the next ask says the unit is done */
        }
        return;
    }
    if (a->body_case != GRPO__ENVELOPE__BODY_WORK_GRANT) {
        note_error(s, "rank %d: a work request answered with %s", r->rank, protocol_body_name(a->body_case));
        return;
    }
    const Grpo__WorkGrant *g = a->work_grant;
    if (kind == REQ_PING) {
        s->pings++;
        if (g->kind == WORK_END)
            r->ended = true;
        return;
    }
    lat_add(&s->work_lat, now - r->disp.sent_at);
    if (g->kind == WORK_UNIT) {
        s->grants++;
        r->last_step = g->step;
        r->last_unit = g->unit;
        if (g->version != r->held_version) { /* fetch the version, then "generate" (nothing) */
            r->want_version = g->version;
            r->fetch_off = 0;
            r->n_floats = (size_t)g->n_floats;
            if (r->srv) { /* the relay tree: ask where from; buf changes, so nothing is served from it meanwhile */
                relay_server_drop(r->srv);
                if (!r->buf)
                    r->buf = xcalloc(r->n_floats ? r->n_floats : 1, sizeof(float));
                r->rs = RS_ASK;
                r->bad_rank = -1;
                r->wait_since = now;
                r->wait_pause = 0;
            }
        }
        r->ask_due = now;
    } else if (g->kind == WORK_WAIT) {
        s->waits++;
        r->ask_due = now + 0.05; /* the rollout loop asks 50 ms apart while it waits */
    } else {
        s->ends++;
        r->ended = true;
        r->ping_due = now; /* say at once that the end is heard */
    }
}

/* The summary line: counts and latencies since the start, or since the last SIGUSR1 (window_s says which). */
static void print_summary(struct sim *s, double t0, double reg_done_at, double window_at)
{
    const double wall = clock_now_s() - t0;
    int64_t rb = 0, rb_max = 0; /* the relays' bytes out: in all, the most one relay sent */
    for (int i = 0; s->r && i < s->count; i++)
        if (s->r[i].srv) {
            const int64_t b = relay_server_bytes(s->r[i].srv);
            rb += b;
            rb_max = b > rb_max ? b : rb_max;
        }
    printf("sim_ranks: ranks=%d first=%d rollout=%d registered=%ld refused=%ld registration_s=%.3f "
           "register_ms_p50=%.3f register_ms_p99=%.3f reg_tries=%ld reg_timeouts=%ld reg_retries=%ld heartbeats=%ld "
           "heartbeat_ms_p50=%.3f heartbeat_ms_p99=%.3f "
           "heartbeat_ms_max=%.3f pings=%ld grants=%ld waits=%ld ends=%ld chunks=%ld weight_bytes=%" PRId64
           " work_ms_p50=%.3f work_ms_p99=%.3f reregister=%ld errors=%ld wall_s=%.1f window_s=%.1f relayed=%ld"
           " relay_failed=%ld relay_waits=%ld direct=%ld relay_bytes=%" PRId64 " relay_bytes_max=%" PRId64 "\n",
           s->count, s->first, s->rollout, s->registered, s->refused, reg_done_at ? reg_done_at - t0 : NAN,
           1e3 * lat_pct(&s->reg_lat, 50), 1e3 * lat_pct(&s->reg_lat, 99), s->reg_tries, s->reg_timeouts,
           s->reg_retries, s->heartbeats, 1e3 * lat_pct(&s->hb_lat, 50), 1e3 * lat_pct(&s->hb_lat, 99),
           1e3 * lat_pct(&s->hb_lat, 100), s->pings, s->grants, s->waits, s->ends, s->chunks, s->weight_bytes,
           1e3 * lat_pct(&s->work_lat, 50), 1e3 * lat_pct(&s->work_lat, 99), s->reregister, s->errors, wall,
           clock_now_s() - window_at, s->relayed, s->relay_failed, s->relay_waits, s->direct, rb, rb_max);
    fflush(stdout);
}

/* ---- the rollout and plain ranks' loop ---- */

static int run_ranks(struct sim *s)
{
    s->r = xcalloc((size_t)s->count, sizeof *s->r);
    char err[256];
    for (int i = 0; i < s->count; i++) {
        struct rank *r = &s->r[i];
        r->rank = s->first + i;
        r->held_version = r->want_version = -1;
        r->disp = (struct sock){.s = -1, .fd = -1};
        r->rcli = (struct sock){.s = -1, .fd = -1};
        if (sock_open(&r->ctl, s->endpoint, err, sizeof err) != 0) {
            fprintf(stderr,
                    "sim_ranks: rank %d of %d in this process: %s (nanomsg allows 512 sockets a process: run "
                    "more processes)\n",
                    r->rank, s->count, err);
            return 1;
        }
    }
    struct pollfd *pf = xcalloc(3 * (size_t)s->count, sizeof *pf);
    struct sock **ps = xcalloc(3 * (size_t)s->count, sizeof *ps);
    int *pr = xcalloc(3 * (size_t)s->count, sizeof *pr);
    const double t0 = clock_now_s(), until = t0 + s->seconds;
    double reg_done_at = 0, window_at = t0;
    for (;;) {
        double now = clock_now_s();
        if (stop_now || now >= until)
            break;
        if (print_now) {
            print_now = 0;
            print_summary(s, t0, reg_done_at, window_at);
        }
        if (reset_now) {
            reset_now = 0;
            s->hb_lat.n = s->work_lat.n = 0;
            s->heartbeats = s->pings = s->grants = s->waits = 0;
            window_at = now;
        }
        bool all_ended = s->rollout;
        double next = now + 0.05;
        int n = 0;
        for (int i = 0; i < s->count; i++) {
            struct rank *r = &s->r[i];
            if (r->failed)
                continue;
            all_ended = all_ended && r->ended;
            /* grpod; a registration unanswered past --register-timeout is given up and sent again after a backoff,
             * as grpo-worker does (its REQ socket drops the first one's answer) */
            if (r->ctl.kind == REQ_REGISTER && s->register_timeout > 0 &&
                now - r->ctl.sent_at > fmax(r->reg_timeout, s->register_timeout)) {
                s->reg_timeouts++;
                r->ctl.kind = REQ_NONE;
                r->retry_at = now + next_backoff(r);
                /* grpo-worker waits twice as long after each unanswered try, at most 32 s (worker/control) */
                r->reg_timeout = fmin(2 * fmax(r->reg_timeout, s->register_timeout), 32.0);
            }
            if (r->ctl.kind == REQ_NONE) {
                if (!r->registered && now >= r->retry_at)
                    send_register(s, r);
                else if (r->registered && now >= r->hb_due) {
                    send_heartbeat(s, r, now, t0);
                    r->hb_due += s->interval;
                    if (r->hb_due < now)
                        r->hb_due = now + s->interval;
                }
            }
            if (r->ctl.kind == REQ_NONE)
                next = fmin(next, r->registered ? r->hb_due : r->retry_at);
            else {
                pf[n] = (struct pollfd){.fd = r->ctl.fd, .events = POLLIN};
                ps[n] = &r->ctl;
                pr[n++] = i;
            }
            /* the dispatcher */
            if (r->disp.s < 0)
                continue;
            /* the relay it fetches from: one chunk request in flight, silent past RELAY_CHUNK_TIMEOUT_MS: failed */
            if (r->rs == RS_RELAY && r->rcli.kind == REQ_NONE)
                send_chunk(s, r);
            else if (r->rs == RS_RELAY && now - r->rcli.sent_at > RELAY_CHUNK_TIMEOUT_MS / 1000.0)
                relay_failed(s, r, "no answer", true, now);
            if (r->rs == RS_RELAY && r->rcli.kind != REQ_NONE) {
                pf[n] = (struct pollfd){.fd = r->rcli.fd, .events = POLLIN};
                ps[n] = &r->rcli;
                pr[n++] = i;
            }
            if (r->disp.kind == REQ_NONE) {
                if (now >= r->ping_due) {
                    send_work(s, r, true);
                    r->ping_due = now + s->interval;
                } else if (r->rs == RS_HOLD) {
                    send_relay(s, r, true);
                } else if (r->rs == RS_ASK) {
                    if (now >= r->ask_due)
                        send_relay(s, r, false);
                } else if (r->rs == RS_RELAY) {
                    /* fetching from a relay: nothing to ask the dispatcher meanwhile */
                } else if (r->want_version != r->held_version && r->want_version >= 0) {
                    send_weights(s, r);
                } else if (!r->ended && now >= r->ask_due) {
                    send_work(s, r, false);
                }
            }
            if (r->disp.kind == REQ_NONE)
                next = fmin(next, r->ended ? r->ping_due : fmin(r->ping_due, r->ask_due));
            else {
                pf[n] = (struct pollfd){.fd = r->disp.fd, .events = POLLIN};
                ps[n] = &r->disp;
                pr[n++] = i;
            }
        }
        if (!reg_done_at && s->registered == s->count)
            reg_done_at = clock_now_s();
        if (all_ended && s->count > 0)
            break;
        int wait_ms = (int)ceil((next - clock_now_s()) * 1000);
        int got = poll(pf, (nfds_t)n, wait_ms < 0 ? 0 : wait_ms > 50 ? 50 : wait_ms);
        if (got < 0 && errno != EINTR) {
            note_error(s, "poll: %s", strerror(errno));
            break;
        }
        now = clock_now_s();
        for (int k = 0; k < n && got > 0; k++) {
            if (!(pf[k].revents & POLLIN))
                continue;
            Grpo__Envelope *a = sock_recv(s, ps[k]);
            if (!a)
                continue;
            struct rank *r = &s->r[pr[k]];
            if (ps[k] == &r->ctl)
                on_ctl_answer(s, r, a, now);
            else if (ps[k] == &r->rcli)
                on_relay_answer(s, r, a, now);
            else
                on_disp_answer(s, r, a, now);
            protocol_free(a);
        }
    }
    print_summary(s, t0, reg_done_at, window_at);
    for (int i = 0; i < s->count; i++) {
        nn_close(s->r[i].ctl.s);
        if (s->r[i].disp.s >= 0)
            nn_close(s->r[i].disp.s);
        relay_close_cli(&s->r[i]);
        relay_server_close(s->r[i].srv);
        free(s->r[i].buf);
    }
    free(pf);
    free(ps);
    free(pr);
    free(s->r);
    free(s->reg_lat.v);
    free(s->hb_lat.v);
    free(s->work_lat.v);
    return s->registered == s->count && !s->errors ? 0 : 1;
}

/* ---- the trainer: rank 0 with the real dispatcher ---- */

/* CPU seconds of this process (every thread: the dispatcher's, its sockets', the main one's). */
static double cpu_seconds(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
           1e-6 * (double)u.ru_stime.tv_usec;
}

/* One blocking call to grpod on c; the answer or NULL (reported). */
static Grpo__Envelope *ctl_call(struct rpc_client *c, Grpo__Envelope *env)
{
    Grpo__Envelope *a = NULL;
    char err[512];
    if (rpc_call(c, env, 10000, &a, err, sizeof err) != RPC_OK) {
        fprintf(stderr, "sim_ranks: trainer: grpod: %s\n", err);
        return NULL;
    }
    return a;
}

static int run_trainer(struct sim *s, int steps, size_t floats)
{
    char err[512];
    struct rpc_client *c = rpc_open(s->endpoint, NULL, err, sizeof err);
    if (!c) {
        fprintf(stderr, "sim_ranks: trainer: %s\n", err);
        return 1;
    }
    struct rank r0 = {.rank = 0};
    Grpo__Envelope *a = NULL;
    for (int tries = 0; tries < 100 && !a; tries++) {
        Grpo__Envelope env = GRPO__ENVELOPE__INIT;
        Grpo__Register reg = GRPO__REGISTER__INIT;
        char host[] = "sim0000", *caps[] = {"trainer"};
        register_fill(s, &env, &reg, 0, host, caps, 1);
        a = ctl_call(c, &env);
        if (a && a->body_case == GRPO__ENVELOPE__BODY_REPLY && a->reply->retry) {
            protocol_free(a);
            a = NULL;
            clock_sleep_s(0.2);
        }
    }
    if (!a || a->body_case != GRPO__ENVELOPE__BODY_ASSIGNMENT || a->assignment->plane_run_key.len != PLANE_KEY_BYTES ||
        !a->assignment->dispatch_endpoint || !a->assignment->dispatch_endpoint[0]) {
        fprintf(stderr, "sim_ranks: trainer: no trainer assignment with a run key and a dispatcher: %s\n",
                a && a->body_case == GRPO__ENVELOPE__BODY_REPLY ? a->reply->error : "another answer");
        protocol_free(a);
        rpc_close(c);
        return 1;
    }
    r0.incarnation = a->assignment->incarnation;
    uint8_t run_key[PLANE_KEY_BYTES];
    memcpy(run_key, a->assignment->plane_run_key.data, PLANE_KEY_BYTES);
    char endpoint[512];
    snprintf(endpoint, sizeof endpoint, "%s", a->assignment->dispatch_endpoint);
    const struct dispatch_options o = {.endpoint = endpoint,
                                       .units = s->units,
                                       .groups_in_step = s->units,
                                       .staleness = 0,
                                       .start = 0,
                                       .total_steps = steps,
                                       .n_floats = floats,
                                       .lost_after_s = 2 * s->interval,
                                       .run_key = run_key,
                                       .epoch = a->assignment->plane_epoch,
                                       .first_rollout_rank = s->world - s->units,
                                       .rollout_tp = 1,
                                       .relay_fanout = s->relay};
    protocol_free(a);
    struct dispatcher *d = dispatcher_open(&o, err, sizeof err);
    if (!d) {
        fprintf(stderr, "sim_ranks: trainer: the dispatcher: %s\n", err);
        rpc_close(c);
        return 1;
    }
    float *w = xcalloc(floats ? floats : 1, sizeof *w);
    const double t0 = clock_now_s(), cpu0 = cpu_seconds();
    double hb_due = t0, first_grant = 0, round_max = 0, round_sum = 0;
    dispatcher_publish(d, 0, w);
    double published = clock_now_s();
    int64_t step = 1;
    struct dispatch_stats st = {0};
    int rc = 0;
    while (!stop_now && step <= steps) {
        double now = clock_now_s();
        if (now - t0 > s->seconds) {
            fprintf(stderr, "sim_ranks: trainer: step %" PRId64 " not granted whole within --seconds %.0f\n", step,
                    s->seconds);
            rc = 1;
            break;
        }
        if (now >= hb_due) {
            Grpo__Envelope env = GRPO__ENVELOPE__INIT;
            Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
            hb.rank = 0;
            hb.incarnation = r0.incarnation;
            hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
            hb.step = 1;
            hb.total_steps = 1000;
            hb.phase = GRPO__PHASE__PHASE_UPDATE_ACTOR;
            hb.checkpoint_step = -1;
            env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
            env.heartbeat = &hb;
            protocol_free(ctl_call(c, &env));
            hb_due += s->interval;
        }
        dispatcher_stats(d, &st);
        if (st.granted > 0 && !first_grant)
            first_grant = clock_now_s();
        if (st.delivered >= step * s->units) { /* every unit of the step delivered: "train" it, publish its version */
            now = clock_now_s();
            const double round = now - published;
            round_sum += round;
            round_max = fmax(round_max, round);
            for (size_t i = 0; i < floats; i++)
                w[i] = (float)step;
            dispatcher_publish(d, step, w);
            published = clock_now_s();
            step++;
            continue;
        }
        clock_sleep_s(0.002);
    }
    const double wall = clock_now_s() - (first_grant ? first_grant : t0), cpu = cpu_seconds() - cpu0;
    dispatcher_stats(d, &st);
    const int done = (int)(step - 1);
    dispatcher_end(d, done, "the simulated run is over");
    dispatcher_close(d, 3 * s->interval + 2, 0);
    printf("sim_ranks: trainer units=%d steps=%d granted=%" PRId64 " regranted=%" PRId64 " lost=%" PRId64
           " refused=%" PRId64 " rate_limited=%" PRId64 " grants_per_s=%.1f step_round_s_mean=%.3f "
           "step_round_s_max=%.3f weight_bytes_out=%" PRId64 " weight_bytes_per_version=%.0f floats=%zu wall_s=%.2f "
           "cpu_s=%.2f relay=%d relay_named=%" PRId64 " relay_direct=%" PRId64 " relay_failed=%" PRId64 "\n",
           s->units, done, st.granted, st.regranted, st.lost, st.refused, st.rate_limited,
           wall > 0 ? (double)st.granted / wall : 0.0, done ? round_sum / done : NAN, round_max, st.bytes,
           done ? (double)st.bytes / done : NAN, floats, wall, cpu, s->relay, st.relayed, st.relay_direct,
           st.relay_failed);
    fflush(stdout);
    free(w);
    rpc_close(c);
    return rc || done < steps ? 1 : 0;
}

static double number_arg(const char *opt, const char *text)
{
    char *end;
    double v = text ? strtod(text, &end) : 0;
    if (!text || end == text || *end) {
        fprintf(stderr, "sim_ranks: %s expects a number, got '%s'\n", opt, text ? text : "");
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    struct sim s = {.interval = 1.0, .seconds = 60, .digest = 1, .count = 1};
    bool trainer = false;
    int steps = 5;
    double floats = 65536;
    static const struct option opts[] = {{"endpoint", required_argument, 0, 'e'},
                                         {"world", required_argument, 0, 'w'},
                                         {"first", required_argument, 0, 'f'},
                                         {"count", required_argument, 0, 'c'},
                                         {"rollout", no_argument, 0, 'r'},
                                         {"trainer", no_argument, 0, 'T'},
                                         {"units", required_argument, 0, 'u'},
                                         {"steps", required_argument, 0, 'S'},
                                         {"floats", required_argument, 0, 'F'},
                                         {"interval", required_argument, 0, 'i'},
                                         {"seconds", required_argument, 0, 's'},
                                         {"launch", required_argument, 0, 'l'},
                                         {"digest", required_argument, 0, 'd'},
                                         {"step-s", required_argument, 0, 'P'},
                                         {"step-base", required_argument, 0, 'B'},
                                         {"register-timeout", required_argument, 0, 'R'},
                                         {"relay", required_argument, 0, 'k'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'e': s.endpoint = optarg; break;
        case 'w': s.world = (int)number_arg("--world", optarg); break;
        case 'f': s.first = (int)number_arg("--first", optarg); break;
        case 'c': s.count = (int)number_arg("--count", optarg); break;
        case 'r': s.rollout = true; break;
        case 'T': trainer = true; break;
        case 'u': s.units = (int)number_arg("--units", optarg); break;
        case 'S': steps = (int)number_arg("--steps", optarg); break;
        case 'F': floats = number_arg("--floats", optarg); break;
        case 'i': s.interval = number_arg("--interval", optarg); break;
        case 's': s.seconds = number_arg("--seconds", optarg); break;
        case 'l': s.launch = strtoull(optarg, NULL, 16); break;
        case 'd': s.digest = (uint64_t)number_arg("--digest", optarg); break;
        case 'P': s.step_s = number_arg("--step-s", optarg); break;
        case 'B': s.step_base = number_arg("--step-base", optarg); break;
        case 'R': s.register_timeout = number_arg("--register-timeout", optarg); break;
        case 'k': s.relay = (int)number_arg("--relay", optarg); break;
        default:
            fprintf(o == 'h' ? stdout : stderr,
                    "usage: sim_ranks --endpoint EP --world W --first R --count K [--rollout --units U] [--seconds S]\n"
                    "       sim_ranks --endpoint EP --world W --trainer --units U [--steps N] [--floats F]\n"
                    "       common: [--interval 1.0] [--launch HEX] [--digest N] [--step-s S --step-base UNIX_S]\n"
                    "               [--register-timeout S] [--relay K]\n");
            return o == 'h' ? 0 : 2;
        }
    }
    if (!s.endpoint || s.world < 1 || s.first < 0 || s.count < 1 || s.first + s.count > s.world || s.interval <= 0 ||
        s.seconds <= 0 || ((s.rollout || trainer) && (s.units < 1 || s.units >= s.world)) || steps < 1 || floats < 0) {
        fprintf(stderr, "sim_ranks: --endpoint and --world are required; ranks [first, first+count) within the world; "
                        "--units (the rollout ranks, the last of the world) with --rollout or --trainer\n");
        return 2;
    }
    if (s.rollout && s.first < s.world - s.units) {
        fprintf(stderr, "sim_ranks: --rollout ranks start at world - units = %d\n", s.world - s.units);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGUSR1, on_signal);
    signal(SIGUSR2, on_signal);
    if (plane_init() != 0) {
        fprintf(stderr, "sim_ranks: libsodium did not initialise\n");
        return 1;
    }
    return trainer ? run_trainer(&s, steps, (size_t)floats) : run_ranks(&s);
}
