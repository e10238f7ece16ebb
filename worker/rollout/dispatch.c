#include "dispatch.h"

#include <errno.h>
#include <inttypes.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "proto/protocol.h"
#include "proto/transport.h"

/* Floats per weights chunk at most: well inside GRPO_MAX_MESSAGE_BYTES with the envelope around it. */
#define CHUNK_MAX_FLOATS ((size_t)12 << 20)
#define MAX_PROCS 256
#define PENDING (-1)

void dispatch_unit_range(int B, int U, int u, int *lo, int *hi)
{
    *lo = (int)((long long)B * u / U);
    *hi = (int)((long long)B * (u + 1) / U);
}

/* ---- the dispatcher ---- */

struct proc {
    uint64_t id;
    int slot;
    double last_seen;
    bool alive, told_end;
};

struct snapshot {
    int64_t version; /* -1: empty */
    float *w;
};

struct dispatcher {
    struct dispatch_options o;
    char secret[1024];
    int sock;
    pthread_t thread;
    pthread_mutex_t mu;
    bool quit;
    double opened_at;
    struct snapshot *snaps;
    int nsnap;
    int64_t latest, end_after; /* newest published version (-1: none); the run's last step (-1: not ended) */
    char end_why[256];
    int64_t win0;    /* first step of the window (latest + 1) */
    int window;      /* steps in the window: staleness + 1 */
    int *holder;     /* [window][units]: PENDING or the index in procs of the process that holds it */
    bool *slot_seen; /* [units]: some process has served this slot */
    struct proc procs[MAX_PROCS];
    int nprocs;
    struct dispatch_stats st;
    /* the weight broadcast (dispatcher_broadcast_on) */
    bool bc_on, bc_off;       /* on; given up for the rest of the run (a lost process, a failed round) */
    double bc_rendezvous_s;   /* a version every rollout rank has not asked for by then is fetched instead */
    int64_t *bc_want;         /* [units]: the version each rollout rank's process asks to take in a round (-1) */
    double *bc_asked;         /* [units]: since when */
    int64_t bc_round;         /* the version being broadcast (-1: none) */
    int64_t bc_done, bc_skip; /* the newest version broadcast, the newest one fetched instead */
};

static bool slot_alive(const struct dispatcher *d, int slot)
{
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].alive && d->procs[i].slot == slot)
            return true;
    return false;
}

/* A unit whose own rollout rank is gone (or never came): any live process may take it. */
static bool orphaned(const struct dispatcher *d, int slot, double now)
{
    if (slot_alive(d, slot))
        return false;
    double grace = 10 * d->o.lost_after_s > 30 ? 10 * d->o.lost_after_s : 30;
    return d->slot_seen[slot] || now - d->opened_at > grace;
}

static struct proc *proc_of(struct dispatcher *d, uint64_t id, int slot, double now)
{
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].id == id) {
            struct proc *p = &d->procs[i];
            if (!p->alive)
                log_info("dispatch", "rollout process %016" PRIx64 " (rank %d) is back", id, p->slot);
            p->alive = true;
            p->last_seen = now;
            return p;
        }
    int i = d->nprocs;
    if (i == MAX_PROCS) { /* reuse the longest-silent dead entry */
        i = -1;
        for (int j = 0; j < d->nprocs; j++)
            if (!d->procs[j].alive && (i < 0 || d->procs[j].last_seen < d->procs[i].last_seen))
                i = j;
        if (i < 0)
            return NULL;
    } else {
        d->nprocs++;
    }
    bool replaces = d->slot_seen[slot] && !slot_alive(d, slot);
    d->procs[i] = (struct proc){.id = id, .slot = slot, .last_seen = now, .alive = true};
    d->slot_seen[slot] = true;
    log_info("dispatch", "rollout process %016" PRIx64 " %s rollout rank %d", id, replaces ? "takes over" : "serves",
             slot);
    return &d->procs[i];
}

/* Processes silent past the limit are lost; their units go back to be granted again. */
static void reap(struct dispatcher *d, double now)
{
    for (int i = 0; i < d->nprocs; i++) {
        struct proc *p = &d->procs[i];
        if (!p->alive || now - p->last_seen <= d->o.lost_after_s)
            continue;
        p->alive = false;
        d->st.lost++;
        if (d->bc_on && !d->bc_off) {
            d->bc_off = true;
            log_warn("dispatch",
                     "weight broadcast off for the rest of the run: rollout rank %d's process is lost "
                     "(each version is fetched from here instead)",
                     p->slot);
        }
        char units[256] = "";
        for (int j = 0; j < d->window; j++)
            for (int u = 0; u < d->o.units; u++)
                if (d->holder[j * d->o.units + u] == i) {
                    d->holder[j * d->o.units + u] = PENDING;
                    size_t l = strlen(units);
                    snprintf(units + l, sizeof units - l, "%s%lld/%d", l ? ", " : "", (long long)d->win0 + j, u);
                }
        log_warn("dispatch",
                 "rollout process %016" PRIx64 " (rank %d) lost: silent for %.1f s; %s%s%s. Relaunch it with "
                 "grpo-worker --replace-rank (see docs/operations.md)",
                 p->id, p->slot, now - p->last_seen, units[0] ? "its unit(s) (step/unit) " : "it held no unit", units,
                 units[0] ? " go to the other rollout processes" : "");
    }
}

static const struct snapshot *snapshot_of(const struct dispatcher *d, int64_t v)
{
    if (v < 0) /* -1 marks a snapshot being written */
        return NULL;
    for (int i = 0; i < d->nsnap; i++)
        if (d->snaps[i].version == v && d->snaps[i].w)
            return &d->snaps[i];
    return NULL;
}

static int64_t version_for(const struct dispatcher *d, int64_t k)
{
    int64_t v = k - 1 - d->o.staleness;
    return v > d->o.start ? v : d->o.start;
}

/* The next unit for process p, or a wait / end with its reason. Called with the mutex held. */
static void grant(struct dispatcher *d, int pi, Grpo__WorkGrant *g, char *reason, size_t rlen, double now)
{
    struct proc *p = &d->procs[pi];
    g->start_step = d->o.start;
    g->total_steps = d->o.total_steps;
    g->start_epoch = d->o.start_epoch;
    g->start_cursor = d->o.start_cursor;
    g->n_floats = d->o.n_floats;
    g->units = d->o.units;
    if (d->end_after >= 0) {
        g->kind = WORK_END;
        g->step = d->end_after;
        snprintf(reason, rlen, "%s", d->end_why);
        p->told_end = true;
        return;
    }
    if (d->latest < 0) {
        g->kind = WORK_WAIT;
        snprintf(reason, rlen, "the trainers have not published their first weights yet");
        return;
    }
    for (int j = 0; j < d->window; j++) {
        int64_t k = d->win0 + j;
        if (k > d->o.total_steps)
            break;
        int pick = -1;
        if (d->holder[j * d->o.units + p->slot] == PENDING)
            pick = p->slot;
        for (int u = 0; u < d->o.units && pick < 0; u++)
            if (d->holder[j * d->o.units + u] == PENDING && orphaned(d, u, now))
                pick = u;
        if (pick < 0)
            continue;
        d->holder[j * d->o.units + pick] = pi;
        d->st.granted++;
        if (pick != p->slot) {
            d->st.regranted++;
            log_info("dispatch", "step %lld unit %d (rollout rank %d's) granted to the process serving rank %d",
                     (long long)k, pick, pick, p->slot);
        }
        g->kind = WORK_UNIT;
        g->step = k;
        g->unit = pick;
        g->version = version_for(d, k);
        return;
    }
    g->kind = WORK_WAIT;
    int64_t next = d->win0 + d->window;
    if (next > d->o.total_steps)
        snprintf(reason, rlen, "every step is granted; the trainers finish step %lld", (long long)d->o.total_steps);
    else
        snprintf(reason, rlen, "step %lld waits for the trainers' policy version %lld", (long long)next,
                 (long long)version_for(d, next));
}

/* The broadcast is on, not given up, and the run goes on. Mutex held. */
static bool broadcasting(const struct dispatcher *d) { return d->bc_on && !d->bc_off && d->end_after < 0; }

/* The broadcast's round of version v may begin: no round is under way, and every rollout rank's process has asked
 * for v, which is held, newer than any broadcast or skipped. Mutex held. */
static bool round_ready(const struct dispatcher *d, int64_t *v)
{
    if (!broadcasting(d) || d->bc_round >= 0)
        return false;
    const int64_t x = d->bc_want[0];
    for (int u = 0; u < d->o.units; u++)
        if (d->bc_want[u] != x || !slot_alive(d, u))
            return false;
    if (x <= d->bc_done || x <= d->bc_skip || !snapshot_of(d, x))
        return false;
    *v = x;
    return true;
}

/* Every version asked for, and none broadcast, by the rendezvous: fetched instead. Mutex held. */
static void skip_wanted(struct dispatcher *d, const char *why)
{
    int64_t newest = -1;
    for (int u = 0; u < d->o.units; u++) {
        if (d->bc_want[u] > newest)
            newest = d->bc_want[u];
        d->bc_want[u] = -1;
    }
    if (newest > d->bc_skip) {
        d->bc_skip = newest;
        log_info("dispatch", "policy version %lld is fetched, not broadcast: %s", (long long)newest, why);
    }
}

/* The answer to a broadcast ask for held version v from rollout rank `slot`'s process: 1 wait, 2 join the round
 * now, 3 fetch it. Mutex held. */
static int broadcast_answer(struct dispatcher *d, int slot, int64_t v, double now)
{
    enum { WAIT = 1, JOIN = 2, FETCH = 3 };
    if (!broadcasting(d) || slot < 0)
        return FETCH;
    if (d->bc_round >= 0)
        return d->bc_round == v ? JOIN : FETCH;
    if (v <= d->bc_done || v <= d->bc_skip)
        return FETCH;
    if (d->bc_want[slot] != v) {
        d->bc_want[slot] = v;
        d->bc_asked[slot] = now;
    }
    for (int u = 0; u < d->o.units; u++)
        if (d->bc_want[u] >= 0 && now - d->bc_asked[u] > d->bc_rendezvous_s) {
            char why[160];
            snprintf(why, sizeof why, "rollout rank %d asked %.0f s ago and not every rank has asked for it since", u,
                     now - d->bc_asked[u]);
            skip_wanted(d, why);
            return FETCH;
        }
    return WAIT;
}

static uint8_t *answer(struct dispatcher *d, const Grpo__Envelope *req, size_t *len)
{
    const double now = clock_now_s();
    Grpo__Envelope out = GRPO__ENVELOPE__INIT;
    out.request_id = req->request_id;
    Grpo__WorkGrant g = GRPO__WORK_GRANT__INIT;
    Grpo__WeightsChunk ch = GRPO__WEIGHTS_CHUNK__INIT;
    char reason[512] = "";
    uint8_t *buf = NULL;
    pthread_mutex_lock(&d->mu);
    if (req->body_case == GRPO__ENVELOPE__BODY_WORK_REQUEST) {
        const Grpo__WorkRequest *w = req->work_request;
        if (w->rank < 0 || w->rank >= d->o.units) {
            d->st.refused++;
            pthread_mutex_unlock(&d->mu);
            snprintf(reason, sizeof reason, "rollout rank %d: this run has rollout ranks 0..%d", (int)w->rank,
                     d->o.units - 1);
            return CHECK_ALLOC(protocol_pack_error(req->request_id, reason, len));
        }
        struct proc *p = proc_of(d, w->worker_id, w->rank, now);
        if (!p) {
            pthread_mutex_unlock(&d->mu);
            return CHECK_ALLOC(protocol_pack_error(req->request_id, "too many rollout processes", len));
        }
        if (w->ping) {
            g.kind = d->end_after >= 0 ? WORK_END : WORK_WAIT;
            p->told_end |= d->end_after >= 0;
            snprintf(reason, sizeof reason, "%s", d->end_after >= 0 ? d->end_why : "alive");
        } else {
            grant(d, (int)(p - d->procs), &g, reason, sizeof reason, now);
        }
        g.reason = reason;
        out.body_case = GRPO__ENVELOPE__BODY_WORK_GRANT;
        out.work_grant = &g;
        buf = CHECK_ALLOC(protocol_pack(&out, len));
    } else if (req->body_case == GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST) {
        const Grpo__WeightsRequest *w = req->weights_request;
        int slot = -1; /* the asker's rollout rank (-1: not a live process) */
        for (int i = 0; i < d->nprocs; i++)
            if (d->procs[i].id == w->worker_id && d->procs[i].alive) {
                d->procs[i].last_seen = now;
                slot = d->procs[i].slot;
            }
        const struct snapshot *s = snapshot_of(d, w->version);
        ch.version = w->version;
        ch.offset = w->offset;
        ch.n_floats = d->o.n_floats;
        if (w->broadcast && s)
            ch.broadcast = broadcast_answer(d, slot, w->version, now);
        else if (!s)
            snprintf(reason, sizeof reason, "policy version %lld is not held (newest %lld)", (long long)w->version,
                     (long long)d->latest);
        else if (w->offset > d->o.n_floats || w->count > CHUNK_MAX_FLOATS || w->count > d->o.n_floats - w->offset)
            snprintf(reason, sizeof reason,
                     "floats %" PRIu64 "+%" PRIu64 " out of range (%zu parameters, chunks of at most %zu)", w->offset,
                     w->count, d->o.n_floats, CHUNK_MAX_FLOATS);
        else {
            ch.data.data = (uint8_t *)(s->w + w->offset);
            ch.data.len = (size_t)w->count * sizeof(float);
            d->st.bytes += (int64_t)ch.data.len;
        }
        ch.error = reason;
        out.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK;
        out.weights_chunk = &ch;
        buf = CHECK_ALLOC(protocol_pack(&out, len)); /* copies the chunk while the mutex holds the snapshot */
    } else {
        d->st.refused++;
        pthread_mutex_unlock(&d->mu);
        return CHECK_ALLOC(
            protocol_pack_error(req->request_id, "the dispatcher takes work and weights requests only", len));
    }
    pthread_mutex_unlock(&d->mu);
    return buf;
}

static void *serve(void *arg)
{
    struct dispatcher *d = arg;
    int to = 100;
    nn_setsockopt(d->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to);
    int sndto = 1000;
    nn_setsockopt(d->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &sndto, sizeof sndto);
    for (;;) {
        pthread_mutex_lock(&d->mu);
        bool quit = d->quit;
        reap(d, clock_now_s());
        pthread_mutex_unlock(&d->mu);
        if (quit)
            break;
        void *msg = NULL;
        int n = nn_recv(d->sock, &msg, NN_MSG, 0);
        if (n < 0)
            continue; /* timed out (or interrupted): look at the clock again */
        char why[512];
        size_t len = 0;
        uint8_t *out;
        Grpo__Envelope *req = protocol_unpack(msg, (size_t)n, why, sizeof why);
        nn_freemsg(msg);
        if (!req) {
            out = CHECK_ALLOC(protocol_pack_error(0, why, &len));
            pthread_mutex_lock(&d->mu);
            d->st.refused++;
            pthread_mutex_unlock(&d->mu);
        } else if (d->secret[0] && !secret_matches(req->secret, d->secret)) {
            out = CHECK_ALLOC(protocol_pack_error(req->request_id, "wrong or missing secret", &len));
            pthread_mutex_lock(&d->mu);
            d->st.refused++;
            pthread_mutex_unlock(&d->mu);
        } else {
            out = answer(d, req, &len);
        }
        if (req)
            protocol_free(req);
        nn_send(d->sock, out, len, 0);
        free(out);
    }
    return NULL;
}

struct dispatcher *dispatcher_open(const struct dispatch_options *o, char *err, size_t errlen)
{
    if (o->units < 1 || o->staleness < 0) {
        error_set(err, errlen, "dispatcher: %d units, staleness %d", o->units, o->staleness);
        return NULL;
    }
    int s = nn_socket(AF_SP, NN_REP);
    if (s < 0) {
        error_set(err, errlen, "dispatcher: nn_socket(REP): %s", nn_strerror(nn_errno()));
        return NULL;
    }
    int max = (int)GRPO_MAX_MESSAGE_BYTES;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof max);
    char why[600];
    if (endpoint_prepare_bind(o->endpoint, why, sizeof why) != 0) { /* never a file that is not a stale socket */
        error_set(err, errlen, "dispatcher: cannot bind %s: %s", o->endpoint, why);
        nn_close(s);
        return NULL;
    }
    if (nn_bind(s, o->endpoint) < 0) {
        error_set(err, errlen, "dispatcher: cannot bind %s: %s", o->endpoint, nn_strerror(nn_errno()));
        nn_close(s);
        return NULL;
    }
    if (strncmp(o->endpoint, "ipc://", 6) == 0)
        chmod(o->endpoint + 6, 0600);
    struct dispatcher *d = xcalloc(1, sizeof *d);
    d->o = *o;
    d->o.endpoint = NULL;
    d->o.secret = NULL;
    snprintf(d->secret, sizeof d->secret, "%s", o->secret ? o->secret : "");
    d->sock = s;
    d->latest = -1;
    d->end_after = -1;
    d->window = o->staleness + 1;
    d->win0 = o->start + 1;
    d->nsnap = o->staleness + 1;
    d->snaps = xcalloc((size_t)d->nsnap, sizeof *d->snaps);
    for (int i = 0; i < d->nsnap; i++)
        d->snaps[i].version = -1;
    d->holder = xmalloc((size_t)d->window * (size_t)o->units * sizeof *d->holder);
    for (int i = 0; i < d->window * o->units; i++)
        d->holder[i] = PENDING;
    d->slot_seen = xcalloc((size_t)o->units, sizeof *d->slot_seen);
    d->bc_want = xmalloc((size_t)o->units * sizeof *d->bc_want);
    d->bc_asked = xcalloc((size_t)o->units, sizeof *d->bc_asked);
    for (int u = 0; u < o->units; u++)
        d->bc_want[u] = -1;
    d->bc_round = d->bc_done = d->bc_skip = -1;
    d->opened_at = clock_now_s();
    pthread_mutex_init(&d->mu, NULL);
    if (pthread_create(&d->thread, NULL, serve, d) != 0) {
        error_set(err, errlen, "dispatcher: cannot start its thread");
        nn_close(s);
        free(d->snaps), free(d->holder), free(d->slot_seen), free(d->bc_want), free(d->bc_asked), free(d);
        return NULL;
    }
    return d;
}

void dispatcher_publish(struct dispatcher *d, int64_t version, const float *w)
{
    pthread_mutex_lock(&d->mu);
    if (snapshot_of(d, version)) { /* held already: a version never changes, and a rollout may be reading it */
        pthread_mutex_unlock(&d->mu);
        return;
    }
    int slot = 0; /* the oldest (or an empty) snapshot makes room */
    for (int i = 1; i < d->nsnap; i++)
        if (d->snaps[i].version < d->snaps[slot].version)
            slot = i;
    struct snapshot *s = &d->snaps[slot];
    if (!s->w)
        s->w = xmalloc(d->o.n_floats * sizeof(float));
    /* the copy runs outside the lock: nobody is served from the oldest snapshot once its steps are trained,
     * and it is marked empty meanwhile */
    s->version = -1;
    pthread_mutex_unlock(&d->mu);
    memcpy(s->w, w, d->o.n_floats * sizeof(float));
    pthread_mutex_lock(&d->mu);
    s->version = version;
    if (version > d->latest) {
        /* steps up to version are trained: the window moves to version + 1, keeping the leases it still holds */
        int64_t nw0 = version + 1;
        int *h = xmalloc((size_t)d->window * (size_t)d->o.units * sizeof *h);
        for (int j = 0; j < d->window; j++)
            for (int u = 0; u < d->o.units; u++) {
                int64_t k = nw0 + j, oj = k - d->win0;
                h[j * d->o.units + u] = oj >= 0 && oj < d->window ? d->holder[oj * d->o.units + u] : PENDING;
            }
        free(d->holder);
        d->holder = h;
        d->win0 = nw0;
        d->latest = version;
    }
    pthread_mutex_unlock(&d->mu);
}

void dispatcher_end(struct dispatcher *d, int64_t after, const char *why)
{
    pthread_mutex_lock(&d->mu);
    if (d->end_after < 0) { /* the first word stands */
        d->end_after = after;
        snprintf(d->end_why, sizeof d->end_why, "%s", why);
    }
    pthread_mutex_unlock(&d->mu);
}

void dispatcher_stats(struct dispatcher *d, struct dispatch_stats *st)
{
    pthread_mutex_lock(&d->mu);
    *st = d->st;
    st->live = 0;
    for (int i = 0; i < d->nprocs; i++)
        st->live += d->procs[i].alive;
    pthread_mutex_unlock(&d->mu);
}

void dispatcher_broadcast_on(struct dispatcher *d, double rendezvous_s)
{
    pthread_mutex_lock(&d->mu);
    d->bc_on = true;
    d->bc_rendezvous_s = rendezvous_s;
    pthread_mutex_unlock(&d->mu);
}

bool dispatcher_round_begin(struct dispatcher *d, int64_t *v, const float **w)
{
    pthread_mutex_lock(&d->mu);
    bool go = round_ready(d, v);
    if (go) {
        d->bc_round = *v;
        *w = snapshot_of(d, *v)->w; /* published versions change only on this (the trainer's) thread */
    }
    pthread_mutex_unlock(&d->mu);
    return go;
}

void dispatcher_round_end(struct dispatcher *d, bool ok)
{
    pthread_mutex_lock(&d->mu);
    if (d->bc_round >= 0) {
        d->bc_done = d->bc_round;
        d->bc_round = -1;
        for (int u = 0; u < d->o.units; u++)
            d->bc_want[u] = -1;
        d->st.broadcasts += ok;
        if (!ok && !d->bc_off) {
            d->bc_off = true;
            log_warn("dispatch",
                     "weight broadcast off for the rest of the run: the round of policy version %lld "
                     "failed (each version is fetched from here instead)",
                     (long long)d->bc_done);
        }
    }
    pthread_mutex_unlock(&d->mu);
}

bool dispatcher_round_due(struct dispatcher *d, double waited_s)
{
    pthread_mutex_lock(&d->mu);
    const int64_t v = d->latest;
    bool due =
        broadcasting(d) && v >= 0 && v > d->bc_done && v > d->bc_skip && v + 1 + d->o.staleness <= d->o.total_steps;
    if (due && waited_s > d->bc_rendezvous_s) {
        char why[160];
        snprintf(why, sizeof why, "the trainers waited %.0f s for every rollout rank to ask", waited_s);
        for (int u = 0; u < d->o.units; u++)
            if (d->bc_want[u] < v)
                d->bc_want[u] = v; /* skip it whoever asked */
        skip_wanted(d, why);
        due = false;
    }
    pthread_mutex_unlock(&d->mu);
    return due;
}

void dispatcher_close(struct dispatcher *d, double linger_s)
{
    if (!d)
        return;
    const double until = clock_now_s() + linger_s;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        int waiting = 0;
        for (int i = 0; i < d->nprocs; i++)
            waiting += d->procs[i].alive && !d->procs[i].told_end;
        bool done = d->end_after < 0 || waiting == 0 || clock_now_s() > until;
        if (done)
            d->quit = true;
        pthread_mutex_unlock(&d->mu);
        if (done)
            break;
        clock_sleep_s(0.05);
    }
    pthread_join(d->thread, NULL);
    nn_close(d->sock);
    for (int i = 0; i < d->nsnap; i++)
        free(d->snaps[i].w);
    free(d->snaps), free(d->holder), free(d->slot_seen), free(d->bc_want), free(d->bc_asked);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

/* ---- the rollout process's side ---- */

struct work_client {
    struct rpc_client *rpc, *ping_rpc;
    uint64_t id;
    int slot;
    double ping_s;
    pthread_t pinger;
    pthread_mutex_t mu;
    bool quit, ended, pinging;
    void (*on_chunk)(void *ud); /* after each weights chunk (work_client_on_chunk) */
    void *on_chunk_ud;
};

static bool reply_error(const Grpo__Envelope *r, char *err, size_t errlen)
{
    if (r->body_case == GRPO__ENVELOPE__BODY_REPLY && !r->reply->ok) {
        error_set(err, errlen, "the dispatcher refused: %s", r->reply->error);
        return true;
    }
    return false;
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
        Grpo__Envelope req = GRPO__ENVELOPE__INIT;
        Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
        w.worker_id = c->id;
        w.rank = c->slot;
        w.ping = true;
        req.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
        req.work_request = &w;
        Grpo__Envelope *r = NULL;
        char err[256];
        if (rpc_call(c->ping_rpc, &req, (int)(c->ping_s * 1000) + 500, &r, err, sizeof err) == RPC_OK && r) {
            if (r->body_case == GRPO__ENVELOPE__BODY_WORK_GRANT && r->work_grant->kind == WORK_END) {
                pthread_mutex_lock(&c->mu);
                c->ended = true;
                pthread_mutex_unlock(&c->mu);
            }
            protocol_free(r);
        }
    }
}

struct work_client *work_client_open(const char *endpoint, const char *secret, int rank, double ping_s, char *err,
                                     size_t errlen)
{
    struct work_client *c = xcalloc(1, sizeof *c);
    c->slot = rank;
    c->ping_s = ping_s > 0 ? ping_s : 1.0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->id = ((uint64_t)getpid() << 32) ^ ((uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull) ^ (uint64_t)ts.tv_sec ^
            (uint64_t)rank;
    pthread_mutex_init(&c->mu, NULL);
    if (!(c->rpc = rpc_open(endpoint, secret, err, errlen)) ||
        !(c->ping_rpc = rpc_open(endpoint, secret, err, errlen))) {
        work_client_close(c);
        return NULL;
    }
    if (pthread_create(&c->pinger, NULL, ping_loop, c) != 0) {
        error_set(err, errlen, "work client: cannot start the ping thread");
        work_client_close(c);
        return NULL;
    }
    c->pinging = true;
    return c;
}

int work_client_next(struct work_client *c, struct work_grant *g, int timeout_ms, char *err, size_t errlen)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = c->id;
    w.rank = c->slot;
    req.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    req.work_request = &w;
    Grpo__Envelope *r = NULL;
    char why[512];
    if (rpc_call(c->rpc, &req, timeout_ms, &r, why, sizeof why) != RPC_OK)
        return error_set(err, errlen, "the trainers' dispatcher at %s: %s", rpc_endpoint(c->rpc), why);
    int rc = 0;
    if (reply_error(r, err, errlen)) {
        rc = -1;
    } else if (r->body_case != GRPO__ENVELOPE__BODY_WORK_GRANT || r->work_grant->kind < WORK_WAIT ||
               r->work_grant->kind > WORK_END) {
        rc = error_set(err, errlen, "the dispatcher answered a work request with something else");
    } else {
        const Grpo__WorkGrant *x = r->work_grant;
        *g = (struct work_grant){.kind = (enum work_kind)x->kind,
                                 .step = x->step,
                                 .unit = x->unit,
                                 .units = x->units,
                                 .version = x->version,
                                 .start = x->start_step,
                                 .total_steps = x->total_steps,
                                 .start_epoch = x->start_epoch,
                                 .start_cursor = x->start_cursor,
                                 .n_floats = (size_t)x->n_floats};
        snprintf(g->reason, sizeof g->reason, "%s", x->reason);
        if (g->kind == WORK_UNIT && (g->units < 1 || g->unit < 0 || g->unit >= g->units))
            rc = error_set(err, errlen, "the dispatcher granted unit %d of %d", g->unit, g->units);
    }
    protocol_free(r);
    return rc;
}

void work_client_on_chunk(struct work_client *c, void (*fn)(void *ud), void *ud)
{
    c->on_chunk = fn;
    c->on_chunk_ud = ud;
}

/* One WeightsRequest for version (a chunk [off, off + cnt), or a broadcast ask): *out gets the WeightsChunk answer
 * without an error of its own (the caller frees it), or -1 with err. */
static int weights_call(struct work_client *c, int64_t version, size_t off, size_t cnt, bool broadcast, int timeout_ms,
                        Grpo__Envelope **out, char *err, size_t errlen)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
    q.worker_id = c->id;
    q.version = version;
    q.offset = off;
    q.count = cnt;
    q.broadcast = broadcast;
    req.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    req.weights_request = &q;
    Grpo__Envelope *r = NULL;
    char why[512];
    if (rpc_call(c->rpc, &req, timeout_ms, &r, why, sizeof why) != RPC_OK || !r) {
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

int work_client_weights(struct work_client *c, int64_t version, float *w, size_t n, size_t chunk_bytes, size_t *bytes,
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
                           "every rank the same actor_rollout_ref.model.path)",
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
