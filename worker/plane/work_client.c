/* The rollout process's side of the dispatcher: work requests, weight chunks and broadcast asks on one REQ
 * socket, and a thread that pings every heartbeat interval on another. */
#include "dispatch.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "common/config_key_names.h"
#include "worker/flight/flight.h"

#define CHUNK_MAX_FLOATS DISPATCH_CHUNK_MAX_FLOATS

struct work_client {
    struct rpc_client *rpc, *ping_rpc;
    uint64_t id;
    int slot;
    int64_t last_step; /* the last unit granted to this process (0: none yet), reported done with the next ask */
    int last_unit;
    double ping_s;
    pthread_t pinger;
    pthread_mutex_t mu;
    bool quit, ended, pinging;
    struct work_grant end;      /* the end as heard (kind WORK_END, its step, the run's last, why), once ended */
    int64_t latest;             /* the newest version the dispatcher said it published (-1: not heard) */
    void (*on_chunk)(void *ud); /* after each weights chunk (work_client_on_chunk) */
    void *on_chunk_ud;
    uint16_t flight_group; /* the dispatcher, for the flight recorder's records */
};

uint16_t work_client_group(const struct work_client *c) { return c->flight_group; }

static bool reply_error(const Grpo__Envelope *r, char *err, size_t errlen)
{
    if (r->body_case == GRPO__ENVELOPE__BODY_REPLY && !r->reply->ok) {
        error_set(err, errlen, "the dispatcher refused: %s", r->reply->error);
        return true;
    }
    return false;
}

/* rpc_call, asking again (after 20 ms, doubling to 0.5 s) while the dispatcher refuses with Reply.retry (the
 * process is over its request budget: dispatch_core.h, DISPATCH_RATE_PER_S), within timeout_ms in all. */
static enum rpc_result call(struct rpc_client *rpc, Grpo__Envelope *req, int timeout_ms, Grpo__Envelope **r, char *why,
                            size_t whylen)
{
    const double until = clock_now_s() + timeout_ms / 1000.0;
    double pause = 0.02;
    for (;;) {
        const int left = (int)((until - clock_now_s()) * 1000);
        enum rpc_result rc = rpc_call(rpc, req, left > 1 ? left : 1, r, why, whylen);
        if (rc != RPC_OK || (*r)->body_case != GRPO__ENVELOPE__BODY_REPLY || (*r)->reply->ok || !(*r)->reply->retry ||
            clock_now_s() + pause >= until)
            return rc;
        protocol_free(*r);
        *r = NULL;
        clock_sleep_s(pause);
        pause = pause * 2 < 0.5 ? pause * 2 : 0.5;
    }
}

/* The end has reached this process (a grant or a ping's answer, *x): kept for work_client_end, and said in every
 * request from now on (end_heard). c->mu held. */
static void heard_end(struct work_client *c, const Grpo__WorkGrant *x)
{
    if (c->ended)
        return;
    c->ended = true;
    c->end = (struct work_grant){.kind = WORK_END, .step = x->step, .total_steps = x->total_steps};
    snprintf(c->end.reason, sizeof c->end.reason, "%s", x->reason ? x->reason : "the trainers ended the run");
}

/* A ping on rpc: "alive", and once the end is heard, that it is. The answer (the caller frees it), or NULL. */
/* A work request (or a ping) from this process in *req, body *w: who asks, and whether it has heard the end. */
static void work_request(struct work_client *c, Grpo__Envelope *req, Grpo__WorkRequest *w, bool ping)
{
    w->worker_id = c->id;
    w->rank = c->slot;
    w->ping = ping;
    pthread_mutex_lock(&c->mu);
    w->end_heard = c->ended;
    pthread_mutex_unlock(&c->mu);
    req->body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    req->work_request = w;
}

static Grpo__Envelope *ping_call(struct work_client *c, struct rpc_client *rpc, int timeout_ms)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    work_request(c, &req, &w, true);
    Grpo__Envelope *r = NULL;
    char err[256];
    if (call(rpc, &req, timeout_ms, &r, err, sizeof err) != RPC_OK) {
        protocol_free(r);
        return NULL;
    }
    return r;
}

static void *ping_loop(void *arg)
{
    struct work_client *c = arg;
    for (;;) {
        const int ticks = (int)(c->ping_s / 0.05) > 1 ? (int)(c->ping_s / 0.05) : 1;
        for (int tick = 0; tick < ticks; tick++) {
            pthread_mutex_lock(&c->mu);
            bool quit = c->quit;
            pthread_mutex_unlock(&c->mu);
            if (quit)
                return NULL;
            clock_sleep_s(0.05);
        }
        Grpo__Envelope *r = ping_call(c, c->ping_rpc, (int)(c->ping_s * 1000) + 500);
        if (r) {
            if (r->body_case == GRPO__ENVELOPE__BODY_WORK_GRANT) {
                pthread_mutex_lock(&c->mu);
                if (r->work_grant->kind == WORK_END)
                    heard_end(c, r->work_grant);
                if (r->work_grant->latest_version > c->latest)
                    c->latest = r->work_grant->latest_version;
                pthread_mutex_unlock(&c->mu);
            }
            protocol_free(r);
        }
    }
}

struct work_client *work_client_open(const char *endpoint, struct plane_cred *cred, int rank, double ping_s, char *err,
                                     size_t errlen)
{
    struct work_client *c = xcalloc(1, sizeof *c);
    c->slot = rank;
    c->ping_s = ping_s > 0 ? ping_s : 1.0;
    c->latest = -1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->id = ((uint64_t)getpid() << 32) ^ ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull) ^ (uint64_t)ts.tv_sec ^
            (uint64_t)rank;
    pthread_mutex_init(&c->mu, NULL);
    /* no shared secret here: the dispatcher takes the data plane's MACs (proto/plane_auth.h), and grpod's secret
     * never crosses the network */
    if (!(c->rpc = rpc_open(endpoint, NULL, err, errlen)) || !(c->ping_rpc = rpc_open(endpoint, NULL, err, errlen))) {
        work_client_close(c);
        return NULL;
    }
    c->flight_group = flight_group("dispatcher", endpoint, 0);
    rpc_set_plane(c->rpc, cred); /* both threads: one counter, atomic */
    rpc_set_plane(c->ping_rpc, cred);
    if (pthread_create(&c->pinger, NULL, ping_loop, c) != 0) {
        error_set(err, errlen, "work client: cannot start the ping thread");
        work_client_close(c);
        return NULL;
    }
    c->pinging = true;
    return c;
}

int work_client_also(struct work_client *c, const char *endpoint, char *err, size_t errlen)
{
    if (rpc_connect_also(c->rpc, endpoint, err, errlen) != 0 || rpc_connect_also(c->ping_rpc, endpoint, err, errlen))
        return -1;
    return 0;
}

void work_grant_release(struct work_grant *g)
{
    free(g->replay_versions);
    free(g->replay_tokens);
    g->replay_versions = NULL;
    g->replay_tokens = NULL;
    g->n_phases = g->n_replay_tokens = 0;
}

int64_t work_client_latest(struct work_client *c)
{
    pthread_mutex_lock(&c->mu);
    const int64_t v = c->latest;
    pthread_mutex_unlock(&c->mu);
    return v;
}

void work_grant_of(const Grpo__WorkGrant *x, struct work_grant *g)
{
    *g = (struct work_grant){.kind = (enum work_kind)x->kind,
                             .latest_version = x->latest_version,
                             .step = x->step,
                             .unit = x->unit,
                             .units = x->units,
                             .version = x->version,
                             .start = x->start_step,
                             .total_steps = x->total_steps,
                             .start_epoch = x->start_epoch,
                             .start_cursor = x->start_cursor,
                             .n_floats = (size_t)x->n_floats};
    snprintf(g->reason, sizeof g->reason, "%s", x->reason ? x->reason : "");
    if (x->n_replay_versions > 0 && x->n_replay_versions < (1u << 20) && x->n_replay_tokens < (1u << 26) &&
        x->n_replay_tokens % x->n_replay_versions == 0) {
        g->n_phases = (int)x->n_replay_versions;
        g->n_replay_tokens = (int)x->n_replay_tokens;
        g->replay_versions = xmalloc(x->n_replay_versions * sizeof(int64_t));
        memcpy(g->replay_versions, x->replay_versions, x->n_replay_versions * sizeof(int64_t));
        g->replay_tokens = xmalloc((x->n_replay_tokens ? x->n_replay_tokens : 1) * sizeof(int32_t));
        memcpy(g->replay_tokens, x->replay_tokens, x->n_replay_tokens * sizeof(int32_t));
    }
}

int work_client_next(struct work_client *c, struct work_grant *g, int timeout_ms, char *err, size_t errlen)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    work_request(c, &req, &w, false);
    w.done_step = c->last_step;
    w.done_unit = c->last_unit;
    w.names_done = true;
    Grpo__Envelope *r = NULL;
    char why[512];
    if (call(c->rpc, &req, timeout_ms, &r, why, sizeof why) != RPC_OK)
        return error_set(err, errlen, "the trainers' dispatcher at %s: %s", rpc_endpoint(c->rpc), why);
    int rc = 0;
    if (reply_error(r, err, errlen)) {
        rc = -1;
    } else if (r->body_case != GRPO__ENVELOPE__BODY_WORK_GRANT || r->work_grant->kind < WORK_WAIT ||
               r->work_grant->kind > WORK_END) {
        rc = error_set(err, errlen, "the dispatcher answered a work request with something else");
    } else {
        work_grant_of(r->work_grant, g); /* the caller releases the previous grant's replay arrays */
        pthread_mutex_lock(&c->mu);
        if (g->latest_version > c->latest)
            c->latest = g->latest_version;
        const bool newly_ended = g->kind == WORK_END && !c->ended;
        if (g->kind == WORK_END)
            heard_end(c, r->work_grant);
        pthread_mutex_unlock(&c->mu);
        /* say at once that the end is heard (the dispatcher closes once every live process has said so); its
         * answer changes nothing, and a lost one costs nothing: the pings say it too */
        if (newly_ended)
            protocol_free(ping_call(c, c->rpc, timeout_ms < 2000 ? timeout_ms : 2000));
        if (g->kind == WORK_UNIT && (g->units < 1 || g->unit < 0 || g->unit >= g->units))
            rc = error_set(err, errlen, "the dispatcher granted unit %d of %d", g->unit, g->units);
        else if (g->kind == WORK_UNIT) {
            c->last_step = g->step;
            c->last_unit = g->unit;
        }
    }
    protocol_free(r);
    return rc;
}

void work_client_on_chunk(struct work_client *c, void (*fn)(void *ud), void *ud)
{
    c->on_chunk = fn;
    c->on_chunk_ud = ud;
}

static int weights_call_q(struct work_client *c, Grpo__WeightsRequest *q, int timeout_ms, Grpo__Envelope **out,
                          char *err, size_t errlen);

/* One WeightsRequest for version (a chunk [off, off + cnt), or a broadcast ask): *out gets the WeightsChunk answer
 * without an error of its own (the caller frees it), or -1 with err. */
static int weights_call(struct work_client *c, int64_t version, size_t off, size_t cnt, bool broadcast, int timeout_ms,
                        Grpo__Envelope **out, char *err, size_t errlen)
{
    Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
    q.version = version;
    q.offset = off;
    q.count = cnt;
    q.broadcast = broadcast;
    return weights_call_q(c, &q, timeout_ms, out, err, errlen);
}

/* weights_call of a request made by the caller (its worker id filled in here). */
static int weights_call_q(struct work_client *c, Grpo__WeightsRequest *q, int timeout_ms, Grpo__Envelope **out,
                          char *err, size_t errlen)
{
    const int64_t version = q->version;
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    q->worker_id = c->id;
    req.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    req.weights_request = q;
    Grpo__Envelope *r = NULL;
    char why[512];
    if (call(c->rpc, &req, timeout_ms, &r, why, sizeof why) != RPC_OK || !r) {
        error_set(err, errlen, "weights of version %lld from %s: %s", (long long)version, rpc_endpoint(c->rpc), why);
        return -1;
    }
    bool ok = false;
    if (reply_error(r, err, errlen)) /* err says why */
        ok = false;
    else if (r->body_case != GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK)
        error_set(err, errlen, "the dispatcher answered a weights request with something else");
    else if (r->weights_chunk->error[0])
        error_set(err, errlen, "weights of version %lld: %s", (long long)version, r->weights_chunk->error);
    else
        ok = true;
    if (!ok) {
        protocol_free(r);
        return -1;
    }
    *out = r;
    return 0;
}

int work_client_relay_ask(struct work_client *c, int64_t version, int bad_rank, const char *holds_at,
                          struct relay_plan *p, char *err, size_t errlen)
{
    Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
    q.version = version;
    q.relay = true;
    q.bad_relay = bad_rank >= 0 ? bad_rank + 1 : 0;
    q.holds = holds_at != NULL;
    q.relay_endpoint = (char *)(holds_at ? holds_at : "");
    Grpo__Envelope *r = NULL;
    if (weights_call_q(c, &q, 30000, &r, err, errlen) != 0)
        return -1;
    const Grpo__WeightsChunk *ch = r->weights_chunk;
    *p = (struct relay_plan){.relays = ch->digest.len == sizeof p->digest, .wait = ch->relay_wait, .rank = -1};
    if (p->relays && ch->relay_token.len == sizeof p->token)
        memcpy(p->token, ch->relay_token.data, sizeof p->token);
    else
        p->relays = p->wait = false; /* no digest and token: a dispatcher that relays nothing */
    if (p->relays) {
        memcpy(p->digest, ch->digest.data, sizeof p->digest);
        if (ch->relay_endpoint && ch->relay_endpoint[0]) {
            snprintf(p->endpoint, sizeof p->endpoint, "%s", ch->relay_endpoint);
            p->rank = ch->relay_rank;
        }
    }
    protocol_free(r);
    return 0;
}

static int weights(struct work_client *c, int64_t version, float *w, size_t n, size_t chunk_bytes, size_t *bytes,
                   int *chunks, char *err, size_t errlen);

int work_client_weights(struct work_client *c, int64_t version, float *w, size_t n, size_t chunk_bytes, size_t *bytes,
                        int *chunks, char *err, size_t errlen)
{
    /* one record for the whole fetch: its number is the version */
    const int tok = flight_begin(FLIGHT_OP_WEIGHTS_FETCH, c->flight_group, version > 0 ? (uint64_t)version : 0,
                                 n * sizeof(float), -1, clock_now_s());
    const int rc = weights(c, version, w, n, chunk_bytes, bytes, chunks, err, errlen);
    flight_end(tok, clock_now_s(), rc != 0);
    return rc;
}

static int weights(struct work_client *c, int64_t version, float *w, size_t n, size_t chunk_bytes, size_t *bytes,
                   int *chunks, char *err, size_t errlen)
{
    size_t per = chunk_bytes / sizeof(float);
    if (per < 1)
        per = 1;
    if (per > CHUNK_MAX_FLOATS)
        per = CHUNK_MAX_FLOATS;
    *bytes = 0;
    *chunks = 0;
    for (size_t off = 0; off < n;) {
        size_t cnt = n - off < per ? n - off : per;
        Grpo__Envelope *r = NULL;
        if (weights_call(c, version, off, cnt, false, 120000, &r, err, errlen) != 0)
            return -1;
        int rc = 0;
        if (r->weights_chunk->n_floats != n)
            rc = error_set(err, errlen,
                           "the trainers' policy has %" PRIu64 " parameters, this rollout process's model %zu (give "
                           "every rank the same " KEY_arr_model_path ")",
                           r->weights_chunk->n_floats, n);
        else if (r->weights_chunk->version != version || r->weights_chunk->offset != off ||
                 r->weights_chunk->data.len != cnt * sizeof(float))
            rc = error_set(err, errlen, "weights chunk of version %lld at %zu: wrong version, offset or size",
                           (long long)version, off);
        else
            memcpy(w + off, r->weights_chunk->data.data, cnt * sizeof(float));
        protocol_free(r);
        if (rc != 0)
            return rc;
        off += cnt;
        *bytes += cnt * sizeof(float);
        ++*chunks;
        if (c->on_chunk)
            c->on_chunk(c->on_chunk_ud);
    }
    return 0;
}

int work_client_broadcast_ask(struct work_client *c, int64_t version, enum work_broadcast *answer, char *err,
                              size_t errlen)
{
    Grpo__Envelope *r = NULL;
    if (weights_call(c, version, 0, 0, true, 30000, &r, err, errlen) != 0)
        return -1;
    const int a = r->weights_chunk->broadcast;
    protocol_free(r);
    if (a < WB_WAIT || a > WB_FETCH)
        return error_set(err, errlen, "the dispatcher answered a broadcast ask for version %lld with %d",
                         (long long)version, a);
    *answer = (enum work_broadcast)a;
    return 0;
}

bool work_client_ended(struct work_client *c)
{
    pthread_mutex_lock(&c->mu);
    bool e = c->ended;
    pthread_mutex_unlock(&c->mu);
    return e;
}

bool work_client_end(struct work_client *c, struct work_grant *g)
{
    pthread_mutex_lock(&c->mu);
    const bool e = c->ended;
    if (e) {
        work_grant_release(g);
        *g = c->end;
    }
    pthread_mutex_unlock(&c->mu);
    return e;
}

void work_client_close(struct work_client *c)
{
    if (!c)
        return;
    if (c->pinging) {
        pthread_mutex_lock(&c->mu);
        c->quit = true;
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->pinger, NULL);
    }
    if (c->rpc)
        rpc_close(c->rpc);
    if (c->ping_rpc)
        rpc_close(c->ping_rpc);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
