#include "dataplane.h"

#include <errno.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/check.h"
#include "common/clock.h"
#include "proto/protocol.h"
#include "proto/plane_auth.h"
#include "proto/transport.h"
#include "worker/flight/flight.h"
#include "worker/plane/wire.h"

struct dataplane_pull {
    int sock;
    uint16_t flight_group; /* the rollout ranks' batches to this endpoint, for the flight recorder */
};

struct dataplane_push {
    int n;
    int *socks;
    bool *waiting;     /* a batch sent on socket i awaits its answer */
    uint64_t *counter; /* ... the counter it was sent with */
    const struct plane_cred *cred;
    uint16_t *flight_group;  /* each trainer's endpoint, for the flight recorder */
    bool (*ended)(void *ud); /* the run has ended: a wait for a trainer gives up (dataplane_push_until) */
    void *ended_ud;
};

/* A wait on a trainer is cut in slices this long, between which the run's end is looked at */
#define WAIT_SLICE_MS 200

struct dataplane_pull *dataplane_pull_open(const char *endpoint, char *err, size_t errlen)
{
    /* an ipc socket is for this user's ranks only (on tcp too every batch is authenticated: proto/plane_auth.h) */
    const int s = endpoint_listen_rep(endpoint, (int)GRPO_MAX_MESSAGE_BYTES, "data plane", err, errlen);
    if (s < 0)
        return NULL;
    struct dataplane_pull *p = xcalloc(1, sizeof *p);
    p->sock = s;
    p->flight_group = flight_group("rollouts", endpoint, 0);
    return p;
}

int dataplane_recv(struct dataplane_pull *p, int timeout_ms, void **buf, size_t *len, char *err, size_t errlen)
{
    nn_setsockopt(p->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    void *msg = NULL;
    /* the flight recorder: a wait that brought a batch is kept; one that timed out (the caller polls) is not */
    const int tok = flight_begin(FLIGHT_OP_BATCH_RECV, p->flight_group, 0, 0, -1, clock_now_s());
    int n = nn_recv(p->sock, &msg, NN_MSG, 0);
    if (n < 0) {
        int e = nn_errno();
        if (e == ETIMEDOUT || e == EAGAIN || e == EINTR) {
            flight_cancel(tok);
            return 0;
        }
        flight_end(tok, clock_now_s(), true);
        error_set(err, errlen, "data plane: receive failed: %s", nn_strerror(e));
        return -1;
    }
    *buf = msg;
    *len = (size_t)n;
    flight_end_bytes(tok, clock_now_s(), (uint64_t)n);
    return 1;
}

void dataplane_answer(struct dataplane_pull *p, bool ok, const char *why, const struct wire_auth *a)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Reply reply = GRPO__REPLY__INIT;
    reply.ok = ok;
    reply.error = (char *)(ok ? "" : why);
    env.body_case = GRPO__ENVELOPE__BODY_REPLY;
    env.reply = &reply;
    size_t len;
    const bool sealed = a && a->verified;
    uint8_t *buf = CHECK_ALLOC(
        plane_pack_answer(&env, sealed ? a->v : NULL, sealed ? &a->who : NULL, sealed ? a->counter : 0, &len));
    int timeout = 1000; /* an answer nobody waits for any more is dropped */
    nn_setsockopt(p->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout, sizeof timeout);
    nn_send(p->sock, buf, len, 0);
    free(buf);
}

void dataplane_pull_close(struct dataplane_pull *p)
{
    if (!p)
        return;
    nn_close(p->sock);
    free(p);
}

struct dataplane_push *dataplane_push_open(const char *const *endpoints, int n, const struct plane_cred *cred,
                                           char *err, size_t errlen)
{
    struct dataplane_push *p = xcalloc(1, sizeof *p);
    p->cred = cred;
    p->counter = xcalloc((size_t)(n ? n : 1), sizeof(uint64_t));
    p->socks = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    p->waiting = xcalloc((size_t)(n ? n : 1), sizeof(bool));
    p->flight_group = xcalloc((size_t)(n ? n : 1), sizeof(uint16_t));
    for (int i = 0; i < n; i++) {
        p->flight_group[i] = flight_group("trainer", endpoints[i], 0);
        int s = nn_socket(AF_SP, NN_REQ);
        if (s < 0) {
            error_set(err, errlen, "data plane: nn_socket(REQ): %s", nn_strerror(nn_errno()));
            dataplane_push_close(p);
            return NULL;
        }
        /* resend a batch whose answer has not come in 10 minutes (a trainer restarted, a connection lost) */
        int resend = 600000;
        nn_setsockopt(s, NN_REQ, NN_REQ_RESEND_IVL, &resend, sizeof resend);
        p->socks[p->n++] = s;
        if (nn_connect(s, endpoints[i]) < 0) {
            error_set(err, errlen, "data plane: cannot connect to %s: %s", endpoints[i], nn_strerror(nn_errno()));
            dataplane_push_close(p);
            return NULL;
        }
    }
    return p;
}

struct dataplane_push *dataplane_push_open_any(const char *const *endpoints, int n, const struct plane_cred *cred,
                                               char *err, size_t errlen)
{
    struct dataplane_push *p = dataplane_push_open(endpoints, n > 0 ? 1 : 0, cred, err, errlen);
    for (int i = 1; p && i < n; i++)
        if (nn_connect(p->socks[0], endpoints[i]) < 0) {
            error_set(err, errlen, "data plane: cannot connect to %s: %s", endpoints[i], nn_strerror(nn_errno()));
            dataplane_push_close(p);
            return NULL;
        }
    return p;
}

void dataplane_push_until(struct dataplane_push *p, bool (*ended)(void *ud), void *ud)
{
    p->ended = ended;
    p->ended_ud = ud;
}

/* nn_send (send: len bytes at *msg) or nn_recv (a message of its own into *msg) on sock within timeout_ms, in
 * slices of WAIT_SLICE_MS with the run's end looked at between them: a batch of a step the trainers no longer
 * wait for (granted again elsewhere and done there) must not hold a finished run's rollout rank for the whole
 * timeout. The bytes, or -1 with nn_errno() set (ECANCELED: the run ended; ETIMEDOUT). A timed-out REQ send has
 * sent nothing, and a timed-out receive has taken nothing, so the next slice starts clean. */
static int sliced(const struct dataplane_push *p, int sock, bool send, void **msg, size_t len, int timeout_ms)
{
    const double until = clock_now_s() + timeout_ms / 1000.0;
    for (;;) {
        const int left = (int)((until - clock_now_s()) * 1000);
        int slice = left < WAIT_SLICE_MS ? left : WAIT_SLICE_MS;
        slice = slice > 1 ? slice : 1;
        nn_setsockopt(sock, NN_SOL_SOCKET, send ? NN_SNDTIMEO : NN_RCVTIMEO, &slice, sizeof slice);
        const int n = send ? nn_send(sock, *msg, len, 0) : nn_recv(sock, msg, NN_MSG, 0);
        if (n >= 0)
            return n;
        const int e = nn_errno();
        if (e == EINTR)
            continue;
        if (e != ETIMEDOUT || clock_now_s() >= until)
            return -1;
        if (p->ended && p->ended(p->ended_ud)) {
            errno = ECANCELED; /* nn_errno() is errno */
            return -1;
        }
    }
}

/* Wait for the answer to socket i's outstanding batch. */
static int await_answer(struct dataplane_push *p, int i, int timeout_ms, char *err, size_t errlen)
{
    if (!p->waiting[i])
        return 0;
    void *msg = NULL;
    const int n = sliced(p, p->socks[i], false, &msg, 0, timeout_ms);
    if (n < 0) {
        const int e = nn_errno();
        error_set(err, errlen, "data plane: no answer from trainer DP rank %d: %s", i,
                  e == ECANCELED   ? "the run ended meanwhile"
                  : e == ETIMEDOUT ? "timed out (the trainer takes no data)"
                                   : nn_strerror(e));
        return -1;
    }
    p->waiting[i] = false;
    char why[512];
    Grpo__Envelope *env = protocol_unpack(msg, (size_t)n, why, sizeof why);
    nn_freemsg(msg);
    int rc = 0;
    char auth_why[300];
    if (env && p->cred && p->cred->set && plane_verify_answer(p->cred, p->counter[i], env, auth_why, sizeof auth_why)) {
        if (env->body_case == GRPO__ENVELOPE__BODY_REPLY && !env->reply->ok) /* our own batch refused unheard */
            error_set(err, errlen, "data plane: trainer DP rank %d refused a batch: %s (%s)", i, env->reply->error,
                      auth_why);
        else
            error_set(err, errlen, "data plane: an answer from trainer DP rank %d is refused: %s", i, auth_why);
        rc = -2;
    } else if (!env || env->body_case != GRPO__ENVELOPE__BODY_REPLY) {
        error_set(err, errlen, "data plane: trainer DP rank %d answered with something other than a reply%s%s", i,
                  env ? "" : ": ", env ? "" : why);
        rc = -2;
    } else if (!env->reply->ok) {
        error_set(err, errlen, "data plane: trainer DP rank %d refused a batch: %s", i, env->reply->error);
        rc = -2;
    }
    if (env)
        protocol_free(env);
    return rc;
}

static int send_batch(struct dataplane_push *p, int i, const void *buf, size_t len, uint64_t counter, int timeout_ms,
                      char *err, size_t errlen);

int dataplane_send(struct dataplane_push *p, int i, const void *buf, size_t len, uint64_t counter, int timeout_ms,
                   char *err, size_t errlen)
{
    /* the flight recorder: the wait for the trainer's answer to the batch before, and the send */
    const int tok = flight_begin(FLIGHT_OP_BATCH_PUSH, p->flight_group[i], counter, len, i, clock_now_s());
    const int rc = send_batch(p, i, buf, len, counter, timeout_ms, err, errlen);
    flight_end(tok, clock_now_s(), rc != 0);
    return rc;
}

static int send_batch(struct dataplane_push *p, int i, const void *buf, size_t len, uint64_t counter, int timeout_ms,
                      char *err, size_t errlen)
{
    int rc = await_answer(p, i, timeout_ms, err, errlen);
    if (rc != 0)
        return rc;
    void *msg = (void *)buf;
    if (sliced(p, p->socks[i], true, &msg, len, timeout_ms) < 0) {
        const int e = nn_errno();
        return error_set(err, errlen, "data plane: sending %zu bytes to trainer DP rank %d: %s", len, i,
                         e == ECANCELED   ? "the run ended meanwhile"
                         : e == ETIMEDOUT ? "timed out (the trainer takes no data)"
                                          : nn_strerror(e));
    }
    p->waiting[i] = true;
    p->counter[i] = counter;
    return 0;
}

void dataplane_push_close(struct dataplane_push *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        nn_close(p->socks[i]);
    free(p->socks);
    free(p->waiting);
    free(p->counter);
    free(p->flight_group);
    free(p);
}

void dataplane_msg_free(void *buf)
{
    if (buf)
        nn_freemsg(buf);
}
