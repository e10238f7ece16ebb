/* The dispatcher's shell: one REP socket and one thread that feed the pure core (dispatch_core.c) each request
 * with the time, and a mutex that serialises the trainer's calls with the thread's.
 *
 * For the tests only: with GRPO_TEST_SLOW_GRANT_S=S in the environment, the first answer that grants a unit is
 * sent S seconds late (the rollout process has given up on it by then: tests/system/test_slow_grant.sh); with
 * GRPO_TEST_LEASE_FLOOR_S=S, the leases' floor is S seconds instead of DISPATCH_LEASE_FLOOR_S, so a unit held
 * past its lease is granted again within a test's time (tests/system/test_lease.sh). */
#include "dispatch.h"

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "worker/plane/relay.h"

struct dispatcher {
    struct dispatch_core *core;
    int sock;
    pthread_t thread;
    pthread_mutex_t mu;
    bool quit;
    double slow_grant_s; /* GRPO_TEST_SLOW_GRANT_S: the first grant's answer this late (0: none) */
    /* the dispatcher thread's CPU time on requests refused before any MAC (by their size or kind): count, total, most
     */
    int64_t cheap_n;
    double cheap_cpu_s, cheap_cpu_max_s;
};

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
        pthread_mutex_unlock(&d->mu);
        if (quit)
            break;
        void *msg = NULL;
        int n = nn_recv(d->sock, &msg, NN_MSG, NN_DONTWAIT);
        if (n < 0) {
            /* nothing waits: every request that arrived has been handled, so silence now is the processes' own
             * (a flood that keeps the socket busy delays this, never hastens it: no process is judged lost from
             * how late a busy dispatcher got to its pings) */
            pthread_mutex_lock(&d->mu);
            dispatch_core_tick(d->core, clock_now_s());
            pthread_mutex_unlock(&d->mu);
            n = nn_recv(d->sock, &msg, NN_MSG, 0);
            if (n < 0)
                continue; /* timed out (or interrupted): look at the clock again */
        }
        size_t len = 0;
        struct dispatch_stats before, after;
        pthread_mutex_lock(&d->mu);
        dispatch_core_stats(d->core, &before);
        const double cpu0 = thread_cpu_s();
        uint8_t *out = dispatch_core_handle(d->core, msg, (size_t)n, clock_now_s(), &len);
        const double cpu = thread_cpu_s() - cpu0;
        dispatch_core_stats(d->core, &after);
        if (after.macs == before.macs && after.refused > before.refused) { /* refused before any MAC */
            d->cheap_n++;
            d->cheap_cpu_s += cpu;
            if (cpu > d->cheap_cpu_max_s)
                d->cheap_cpu_max_s = cpu;
        }
        pthread_mutex_unlock(&d->mu);
        nn_freemsg(msg);
        if (d->slow_grant_s > 0 && after.granted > before.granted) {
            log_warn("dispatch", "GRPO_TEST_SLOW_GRANT_S: this grant's answer goes %.1f s late", d->slow_grant_s);
            clock_sleep_s(d->slow_grant_s);
            d->slow_grant_s = 0;
        }
        nn_send(d->sock, out, len, 0);
        free(out);
    }
    return NULL;
}

struct dispatcher *dispatcher_open(const struct dispatch_options *o, char *err, size_t errlen)
{
    struct dispatch_options opt = *o;
    const char *floor = getenv("GRPO_TEST_LEASE_FLOOR_S");
    if (floor && *floor) {
        char *end = NULL;
        const double f = strtod(floor, &end);
        if (*end || !(f > 0)) {
            error_set(err, errlen, "dispatcher: GRPO_TEST_LEASE_FLOOR_S=%s is not a number of seconds > 0", floor);
            return NULL;
        }
        opt.lease_floor_s = f;
        log_warn("dispatch", "GRPO_TEST_LEASE_FLOOR_S: the leases' floor is %.1f s (a test's setting)", f);
    }
    struct dispatch_core *core = dispatch_core_create(&opt, clock_now_s(), err, errlen);
    if (!core)
        return NULL;
    /* a flood of big frames is dropped unread */
    int s = endpoint_listen_rep(o->endpoint, (int)GRPO_MAX_DISPATCH_REQUEST_BYTES, "dispatcher", err, errlen);
    if (s < 0) {
        dispatch_core_free(core);
        return NULL;
    }
    struct dispatcher *d = xcalloc(1, sizeof *d);
    d->core = core;
    d->sock = s;
    const char *slow = getenv("GRPO_TEST_SLOW_GRANT_S");
    d->slow_grant_s = slow ? strtod(slow, NULL) : 0;
    pthread_mutex_init(&d->mu, NULL);
    if (pthread_create(&d->thread, NULL, serve, d) != 0) {
        error_set(err, errlen, "dispatcher: cannot start its thread");
        pthread_mutex_destroy(&d->mu);
        free(d);
        goto fail;
    }
    return d;
fail:
    nn_close(s);
    dispatch_core_free(core);
    return NULL;
}

void dispatcher_publish(struct dispatcher *d, int64_t version, const float *w)
{
    pthread_mutex_lock(&d->mu);
    float *dst = dispatch_core_publish_begin(d->core, version);
    pthread_mutex_unlock(&d->mu);
    if (!dst)
        return;
    /* the copy runs outside the lock: the snapshot is marked empty meanwhile, so nobody is served from it */
    memcpy(dst, w, sizeof(float) * dispatch_core_floats(d->core));
    pthread_mutex_lock(&d->mu);
    uint8_t *digest = dispatch_core_publish_digest(d->core);
    pthread_mutex_unlock(&d->mu);
    if (digest) /* the relay tree: the receivers check what relays send against it (outside the lock too) */
        relay_digest(dst, dispatch_core_floats(d->core), digest);
    pthread_mutex_lock(&d->mu);
    dispatch_core_publish_end(d->core, version);
    pthread_mutex_unlock(&d->mu);
}

void dispatcher_end(struct dispatcher *d, int64_t after, const char *why)
{
    pthread_mutex_lock(&d->mu);
    dispatch_core_end(d->core, after, why);
    pthread_mutex_unlock(&d->mu);
}

void dispatcher_stats(struct dispatcher *d, struct dispatch_stats *st)
{
    pthread_mutex_lock(&d->mu);
    dispatch_core_stats(d->core, st);
    pthread_mutex_unlock(&d->mu);
}

bool dispatcher_granted(struct dispatcher *d, int64_t step, int unit, int slot)
{
    pthread_mutex_lock(&d->mu);
    bool g = dispatch_core_granted(d->core, step, unit, slot);
    pthread_mutex_unlock(&d->mu);
    return g;
}

void dispatcher_regrant(struct dispatcher *d, int64_t step, int unit, const char *why)
{
    pthread_mutex_lock(&d->mu);
    dispatch_core_regrant(d->core, step, unit, why);
    pthread_mutex_unlock(&d->mu);
}

bool dispatcher_async_granted(struct dispatcher *d, int64_t chunk, int unit, int slot)
{
    pthread_mutex_lock(&d->mu);
    bool g = dispatch_core_async_granted(d->core, chunk, unit, slot);
    pthread_mutex_unlock(&d->mu);
    return g;
}

void dispatcher_async_received(struct dispatcher *d, int64_t chunk, int unit)
{
    pthread_mutex_lock(&d->mu);
    dispatch_core_async_received(d->core, chunk, unit);
    pthread_mutex_unlock(&d->mu);
}

void dispatcher_async_taken(struct dispatcher *d, int groups, bool dropped)
{
    pthread_mutex_lock(&d->mu);
    dispatch_core_async_taken(d->core, groups, dropped);
    pthread_mutex_unlock(&d->mu);
}

void dispatcher_async_hold(struct dispatcher *d, bool hold)
{
    pthread_mutex_lock(&d->mu);
    dispatch_core_async_hold(d->core, hold);
    pthread_mutex_unlock(&d->mu);
}

int dispatcher_async_in_flight(struct dispatcher *d)
{
    pthread_mutex_lock(&d->mu);
    int n = dispatch_core_async_in_flight(d->core);
    pthread_mutex_unlock(&d->mu);
    return n;
}

int64_t dispatcher_async_next(struct dispatcher *d)
{
    pthread_mutex_lock(&d->mu);
    int64_t n = dispatch_core_async_next(d->core);
    pthread_mutex_unlock(&d->mu);
    return n;
}

int64_t dispatcher_async_window(struct dispatcher *d)
{
    pthread_mutex_lock(&d->mu);
    int64_t n = dispatch_core_async_window(d->core);
    pthread_mutex_unlock(&d->mu);
    return n;
}

void dispatcher_broadcast_on(struct dispatcher *d, double rendezvous_s)
{
    pthread_mutex_lock(&d->mu);
    dispatch_core_broadcast_on(d->core, rendezvous_s);
    pthread_mutex_unlock(&d->mu);
}

bool dispatcher_round_begin(struct dispatcher *d, int64_t *v, const float **w)
{
    pthread_mutex_lock(&d->mu);
    bool go = dispatch_core_round_begin(d->core, v, w);
    pthread_mutex_unlock(&d->mu);
    return go;
}

void dispatcher_round_end(struct dispatcher *d, bool ok)
{
    pthread_mutex_lock(&d->mu);
    dispatch_core_round_end(d->core, ok);
    pthread_mutex_unlock(&d->mu);
}

bool dispatcher_round_due(struct dispatcher *d, double waited_s)
{
    pthread_mutex_lock(&d->mu);
    bool due = dispatch_core_round_due(d->core, waited_s);
    pthread_mutex_unlock(&d->mu);
    return due;
}

void dispatcher_close(struct dispatcher *d, double linger_s, double unseen_s)
{
    if (!d)
        return;
    const double until = clock_now_s() + linger_s, until_unseen = clock_now_s() + unseen_s;
    bool all_heard = false;
    int unseen = 0;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        unseen = dispatch_core_unseen(d->core);
        all_heard = dispatch_core_all_heard(d->core) && (unseen == 0 || unseen_s <= 0);
        bool done = all_heard || (clock_now_s() > until && (unseen == 0 || clock_now_s() > until_unseen));
        if (done)
            d->quit = true;
        pthread_mutex_unlock(&d->mu);
        if (done)
            break;
        clock_sleep_s(0.05);
    }
    if (all_heard)
        log_info("dispatch", "closed: every rollout process has heard the end");
    else if (unseen)
        log_warn("dispatch", "closed: %d rollout rank(s) never asked for work, %.0f s after the end", unseen, unseen_s);
    else
        log_info("dispatch", "closed after %.0f s: some rollout processes did not say they heard the end", linger_s);
    pthread_join(d->thread, NULL);
    struct dispatch_stats st;
    dispatch_core_stats(d->core, &st);
    const uint64_t dropped = nn_get_statistic(d->sock, NN_STAT_BROKEN_CONNECTIONS);
    log_info("dispatch",
             "requests refused: %" PRId64 " (%" PRId64 " by their size before any MAC, %" PRId64 " of another key "
             "epoch, %" PRId64 " superseded, %" PRId64 " second processes, %" PRId64 " rate limited); %" PRId64
             " MACs over %" PRId64 " bytes; %" PRId64 " refused before any MAC took %.1f us of CPU each (at most "
             "%.1f); %" PRIu64 " connections dropped by the socket (messages over %u bytes, or broken); %" PRId64
             " processes lost, %" PRId64 " superseded while alive",
             st.refused, st.oversized, st.old_epoch, st.superseded, st.second, st.rate_limited, st.macs, st.mac_bytes,
             d->cheap_n, d->cheap_n ? 1e6 * d->cheap_cpu_s / (double)d->cheap_n : 0.0, 1e6 * d->cheap_cpu_max_s,
             dropped, (unsigned)GRPO_MAX_DISPATCH_REQUEST_BYTES, st.lost, st.replaced);
    nn_close(d->sock);
    dispatch_core_free(d->core);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
