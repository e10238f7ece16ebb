#include "weight_sync.h"

#include <sodium.h>
#include <stdlib.h>

#include "common/clock.h"
#include "common/log.h"
#include "proto/transport.h"
#include "worker/comm/comm.h"
#include "worker/flight/flight.h"
#include "worker/plane/dispatch.h"
#include "worker/plane/relay.h"
#include "worker/plane/weight_bcast.h"

/* ---- the sender: the dispatcher's rank ---- */

double weight_sync_serve_round(struct weight_sync_sender *s)
{
    int64_t v;
    const float *w;
    if (!s->disp || !s->group || !dispatcher_round_begin(s->disp, &v, &w))
        return 0;
    if (s->phase)
        s->phase(s->ud, true);
    const double t0 = clock_now_s();
    if (!s->bcast)
        s->bcast = weight_bcast_group(s->group, s->K, s->gpus_shared);
    size_t bytes = 0;
    char err[512];
    float *unused = NULL; /* the root sends from the dispatcher's copy */
    int rc =
        weight_bcast(s->bcast, s->K, v, (float *)w, s->n_floats, s->bucket_bytes, &unused, &bytes, err, sizeof err);
    dispatcher_round_end(s->disp, rc == 0);
    const double dt = clock_now_s() - t0;
    if (rc != 0)
        log_warn("trainer", "%s: the rollout processes fetch every version from now on", err);
    else
        log_info("trainer", "policy version %lld broadcast to %d rollout process(es) over %s: %zu bytes in %.3fs",
                 (long long)v, comm_size(s->bcast) - 1, comm_backend_name(s->bcast), bytes, dt);
    if (s->phase)
        s->phase(s->ud, false);
    return dt;
}

double weight_sync_finish_rounds(struct weight_sync_sender *s, void (*wait)(void *ud), void *ud)
{
    if (!s->disp || !s->group)
        return 0;
    double spent = 0;
    const double t0 = clock_now_s();
    while (dispatcher_round_due(s->disp, clock_now_s() - t0)) {
        spent += weight_sync_serve_round(s);
        if (wait)
            wait(ud);
        clock_sleep_s(0.005);
    }
    return spent;
}

void weight_sync_sender_release(struct weight_sync_sender *s)
{
    if (s->bcast && s->bcast != s->group)
        comm_free(s->bcast);
    s->bcast = NULL;
}

/* ---- the receiver: a rollout process ---- */

/* weight_sync=broadcast: take version v in the trainers' broadcast when the dispatcher says every rollout process
 * has asked for it. 1: v is in dst; 0: fetch it instead (no round for it, or the broadcast is off); -1 with err
 * (the dispatcher is gone). */
static int take_broadcast(struct weight_sync_receiver *r, int64_t v, float *dst, size_t n, size_t bucket, size_t *bytes,
                          char *err, size_t errlen)
{
    if (!r->group || (r->bcast_made && !r->bcast))
        return 0;
    for (;;) {
        enum work_broadcast a;
        if (work_client_broadcast_ask(r->work, v, &a, err, errlen) != 0)
            return -1;
        if (a == WB_FETCH)
            return 0;
        if (a == WB_JOIN)
            break;
        if (r->wait)
            r->wait(r->ud);
        clock_sleep_s(0.005);
    }
    if (!r->bcast_made) {
        r->bcast = weight_bcast_group(r->group, r->K, r->gpus_shared);
        r->bcast_made = true;
    }
    char why[512];
    if (weight_bcast(r->bcast, r->K, v, dst, n, bucket, &r->bcast_bucket, bytes, why, sizeof why) == 0)
        return 1;
    log_warn("rollout", "%s: fetching this version and every later one from the dispatcher", why);
    if (r->bcast != r->group)
        comm_free(r->bcast);
    r->bcast = NULL; /* given up: never used again */
    return 0;
}

/* The relay tree: version v into dst from the holder the dispatcher names (checked against the digest its
 * authenticated answer carried), or from the dispatcher: the tree's first level, no holder with room for
 * RELAY_WAIT_MAX_S, a relay that failed (named to the dispatcher), or a dispatcher that relays nothing. 0, or -1 with
 * err. */
static int take_relayed(struct weight_sync_receiver *r, int64_t v, float *dst, size_t n, size_t chunk_bytes,
                        size_t *bytes, int *chunks, struct relay_plan *plan, char *err, size_t errlen)
{
    struct relay_plan p = {0};
    const double t0 = clock_now_s();
    double pause = 0.01;
    int moved_on = 0; /* relays that no longer held it when asked (they moved on): asked again, at most 3 */
    r->relay_from = -1;
    for (;;) {
        if (work_client_relay_ask(r->work, v, -1, NULL, &p, err, errlen) != 0)
            return -1;
        *plan = p;
        if (!p.relays || !p.endpoint[0]) {
            if (!p.wait)
                break; /* from the dispatcher */
            if (clock_now_s() - t0 > RELAY_WAIT_MAX_S) {
                log_warn("rollout",
                         "policy version %lld: no weight relay had room for %.0f s; fetching it from the dispatcher",
                         (long long)v, RELAY_WAIT_MAX_S);
                break;
            }
            if (r->wait)
                r->wait(r->ud);
            clock_sleep_s(pause);
            pause = pause * 2 < 0.2 ? pause * 2 : 0.2;
            continue;
        }
        char why[600];
        /* one flight record for the whole fetch from the relay (a silent one shows as this wait) */
        const int tok = flight_begin(FLIGHT_OP_WEIGHTS_FETCH, flight_group("weight relay", p.endpoint, 0),
                                     v > 0 ? (uint64_t)v : 0, n * sizeof(float), -1, clock_now_s());
        const int rc = relay_fetch(p.endpoint, v, p.token, dst, n, chunk_bytes, RELAY_CHUNK_TIMEOUT_MS, bytes, chunks,
                                   why, sizeof why);
        flight_end(tok, clock_now_s(), rc != 0);
        uint8_t got[RELAY_DIGEST_BYTES];
        if (rc == 0)
            relay_digest(dst, n, got);
        if (rc == 0 && sodium_memcmp(got, p.digest, sizeof got) == 0) {
            r->relay_from = p.rank;
            return 0;
        }
        if (rc == 1 && ++moved_on <= 3)
            continue;
        r->relay_failures++;
        log_warn("rollout",
                 "policy version %lld from rollout rank %d's relay (%s): %s; fetching it from the dispatcher and "
                 "naming the relay",
                 (long long)v, p.rank, p.endpoint, rc == 0 ? "its digest is wrong" : why);
        if (work_client_relay_ask(r->work, v, p.rank, NULL, &p, err, errlen) != 0)
            return -1;
        break;
    }
    return work_client_weights(r->work, v, dst, n, chunk_bytes, bytes, chunks, err, errlen);
}

int weight_sync_receive(struct weight_sync_receiver *r, int64_t version, float *dst, size_t n, size_t chunk_bytes,
                        bool *broadcast, size_t *bytes, int *chunks, char *err, size_t errlen)
{
    *bytes = 0;
    *chunks = 0;
    r->relay_from = -1;
    if (r->relay) /* dst changes now: the version it held is no longer served */
        relay_server_drop(r->relay);
    int took = take_broadcast(r, version, dst, n, chunk_bytes, bytes, err, errlen);
    if (took < 0)
        return -1;
    *broadcast = took == 1;
    struct relay_plan plan = {0}; /* what the dispatcher said of the version (its token), when it was asked */
    if (!took && r->relay && take_relayed(r, version, dst, n, chunk_bytes, bytes, chunks, &plan, err, errlen) != 0)
        return -1;
    if (!took && !r->relay &&
        work_client_weights(r->work, version, dst, n, chunk_bytes, bytes, chunks, err, errlen) != 0)
        return -1;
    if (r->relay) {      /* it holds the version whole (authenticated, or checked): it serves it, and says so */
        if (plan.relays) /* first, so that nobody the dispatcher names it to finds it empty */
            relay_server_hold(r->relay, version, dst, n, plan.token);
        struct relay_plan p;
        char why[512];
        if (work_client_relay_ask(r->work, version, -1, r->relay_dial, &p, why, sizeof why) != 0)
            log_warn("rollout", "policy version %lld: could not tell the dispatcher this relay holds it: %s",
                     (long long)version, why);
        else if (!plan.relays && p.relays) /* taken in a broadcast: the token comes with the report's answer */
            relay_server_hold(r->relay, version, dst, n, p.token);
    }
    return 0;
}

void weight_sync_receiver_release(struct weight_sync_receiver *r)
{
    if (r->bcast && r->bcast != r->group)
        comm_free(r->bcast);
    r->bcast = NULL;
    free(r->bcast_bucket);
    r->bcast_bucket = NULL;
}
