/* The rollout work dispatcher against real work clients over ipc sockets: units are granted one per rollout rank
 * per step, and only once the policy version a step needs is published (on-policy and one-step-off); versions are
 * served exactly, in the chunks asked for, while they are held (the newest staleness + 1); a rollout process that
 * falls silent is lost and its unit goes to a live one (a rank never seen keeps its units through the grace), while
 * the process that takes over its rank gets that rank's units again; the end is told to requests and pings, its first
 * word stands, and close returns once every live process has heard it; a wrong rank, garbage, another kind of request
 * or a missing secret are refused without harm to the others. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "common/clock.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "worker/rollout/dispatch.h"

#define NEXT_TIMEOUT_MS 5000

/* ---- a fresh directory for the ipc sockets of each test ---- */

struct fx {
    char dir[64];
};

static int setup(void **state)
{
    struct fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/dispatch-test.XXXXXX");
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    DIR *dir = opendir(f->dir);
    if (dir) {
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", f->dir, e->d_name);
            unlink(path);
        }
        closedir(dir);
    }
    int rc = rmdir(f->dir);
    free(f);
    return rc == 0 ? 0 : -1;
}

static void endpoint(const struct fx *f, const char *name, char *ep, size_t len)
{
    snprintf(ep, len, "ipc://%s/%s", f->dir, name);
}

/* ---- helpers ---- */

static struct dispatcher *open_dispatcher(const char *ep, const char *secret, int units, int staleness, int64_t total,
                                          size_t n_floats, double lost_after_s)
{
    const struct dispatch_options o = {.endpoint = ep,
                                       .secret = secret,
                                       .units = units,
                                       .groups_in_step = 5,
                                       .staleness = staleness,
                                       .start = 0,
                                       .total_steps = total,
                                       .start_epoch = 3,
                                       .start_cursor = 17,
                                       .n_floats = n_floats,
                                       .lost_after_s = lost_after_s};
    char err[512] = "";
    struct dispatcher *d = dispatcher_open(&o, err, sizeof err);
    if (!d)
        fail_msg("dispatcher_open(%s): %s", ep, err);
    return d;
}

static struct work_client *open_client(const char *ep, const char *secret, int rank, double ping_s)
{
    char err[512] = "";
    struct work_client *c = work_client_open(ep, secret, rank, ping_s, err, sizeof err);
    if (!c)
        fail_msg("work_client_open(%s, rank %d): %s", ep, rank, err);
    return c;
}

static void next_ok(struct work_client *c, struct work_grant *g)
{
    char err[512] = "";
    memset(g, 0xA5, sizeof *g);
    if (work_client_next(c, g, NEXT_TIMEOUT_MS, err, sizeof err) != 0)
        fail_msg("work_client_next: %s", err);
}

/* The next answer is unit `unit` of step `step`, to be generated with policy version `version`. */
static void expect_unit(struct work_client *c, int64_t step, int unit, int64_t version)
{
    struct work_grant g;
    next_ok(c, &g);
    if (g.kind != WORK_UNIT)
        fail_msg("expected step %lld unit %d, got kind %d (%s)", (long long)step, unit, (int)g.kind, g.reason);
    if (g.step != step || g.unit != unit || g.version != version)
        fail_msg("expected step %lld unit %d version %lld, got step %lld unit %d version %lld", (long long)step, unit,
                 (long long)version, (long long)g.step, g.unit, (long long)g.version);
}

/* The next answer is a wait whose reason contains each of the (up to two) texts. */
static void expect_wait(struct work_client *c, const char *text, const char *text2)
{
    struct work_grant g;
    next_ok(c, &g);
    if (g.kind != WORK_WAIT)
        fail_msg("expected a wait (%s), got kind %d step %lld unit %d", text, (int)g.kind, (long long)g.step, g.unit);
    if (!strstr(g.reason, text) || (text2 && !strstr(g.reason, text2)))
        fail_msg("wait reason '%s' does not mention '%s' and '%s'", g.reason, text, text2 ? text2 : "");
}

static void expect_error(int rc, const char *err, const char *text)
{
    assert_int_equal(rc, -1);
    if (!strstr(err, text))
        fail_msg("error '%s' does not mention '%s'", err, text);
}

static struct dispatch_stats stats(struct dispatcher *d)
{
    struct dispatch_stats st;
    dispatcher_stats(d, &st);
    return st;
}

/* Wait (at most secs) for the dispatcher to count n live rollout processes. */
static void wait_live(struct dispatcher *d, int n, double secs)
{
    const double until = clock_now_s() + secs;
    int live;
    while ((live = stats(d).live) != n) {
        if (clock_now_s() > until)
            fail_msg("%d live rollout processes after %.1f s, expected %d", live, secs, n);
        clock_sleep_s(0.02);
    }
}

static float *weights(size_t n, float scale, float offset)
{
    float *w = malloc(n * sizeof *w);
    assert_non_null(w);
    for (size_t i = 0; i < n; i++)
        w[i] = (float)i * scale + offset;
    return w;
}

/* Fetch version v (n floats, chunks of chunk_bytes) and expect exactly want[]. */
static void expect_weights(struct work_client *c, int64_t v, const float *want, size_t n, size_t chunk_bytes)
{
    float *w = calloc(n, sizeof *w);
    assert_non_null(w);
    size_t bytes = 0;
    int chunks = 0;
    char err[512] = "";
    if (work_client_weights(c, v, w, n, chunk_bytes, &bytes, &chunks, err, sizeof err) != 0)
        fail_msg("work_client_weights: %s", err);
    size_t per = chunk_bytes / sizeof(float);
    assert_int_equal(chunks, (int)((n + per - 1) / per));
    assert_int_equal(bytes, n * sizeof(float));
    assert_memory_equal(w, want, n * sizeof(float));
    free(w);
}

static void expect_not_held(struct work_client *c, int64_t v, size_t n)
{
    float *w = calloc(n, sizeof *w);
    assert_non_null(w);
    size_t bytes = 99;
    int chunks = 99;
    char err[512] = "";
    expect_error(work_client_weights(c, v, w, n, 1024, &bytes, &chunks, err, sizeof err), err, "not held");
    assert_int_equal(chunks, 0);
    assert_int_equal(bytes, 0);
    free(w);
}

/* ---- the tests ---- */

static void test_grants_and_versions(void **state)
{
    const struct fx *f = *state;
    char ep[128];
    endpoint(f, "d.sock", ep, sizeof ep);
    enum { N = 1000 };
    float *w0 = weights(N, 0.5f, 0), *w1 = weights(N, -0.25f, -1), *w2 = weights(N, 2.0f, 0.125f);
    struct dispatcher *d = open_dispatcher(ep, NULL, 2, 0, 3, N, 10.0);
    struct work_client *c0 = open_client(ep, NULL, 0, 0.2), *c1 = open_client(ep, NULL, 1, 0.2);

    /* nothing published: wait, with the reason */
    expect_wait(c0, "first weights", NULL);
    expect_wait(c1, "first weights", NULL);
    expect_not_held(c0, 0, N);

    /* version 0 opens step 1 (on-policy: step k uses version k-1) */
    dispatcher_publish(d, 0, w0);
    struct work_grant g;
    next_ok(c0, &g);
    assert_int_equal(g.kind, WORK_UNIT);
    assert_int_equal(g.step, 1);
    assert_int_equal(g.unit, 0);
    assert_int_equal(g.units, 2);
    assert_int_equal(g.version, 0);
    assert_int_equal(g.start, 0);
    assert_int_equal(g.total_steps, 3);
    assert_int_equal(g.start_epoch, 3);
    assert_int_equal(g.start_cursor, 17);
    assert_int_equal(g.n_floats, N);
    expect_unit(c1, 1, 1, 0);
    /* step 2 needs version 1 */
    expect_wait(c0, "step 2", "version 1");
    expect_wait(c1, "step 2", "version 1");

    /* version 0 in 1 KiB chunks: ceil(4000 / 1024) = 4 chunks; and in one chunk */
    size_t bytes = 0;
    int chunks = 0;
    char err[512] = "";
    float *w = calloc(N, sizeof *w);
    assert_int_equal(work_client_weights(c1, 0, w, N, 1024, &bytes, &chunks, err, sizeof err), 0);
    assert_int_equal(chunks, 4);
    assert_int_equal(bytes, 4000);
    assert_memory_equal(w, w0, sizeof(float) * N);
    expect_weights(c0, 0, w0, N, 4000);
    expect_weights(c0, 0, w0, N, 3 * 4 * 100); /* 300 floats a chunk: 4 chunks, the last of 100 */
    /* a version never published, and a model of another size */
    expect_not_held(c0, 7, N);
    expect_error(work_client_weights(c0, 0, w, N - 1, 1024, &bytes, &chunks, err, sizeof err), err, "1000 parameters");
    struct dispatch_stats st = stats(d);
    assert_int_equal(st.granted, 2);
    assert_int_equal(st.bytes, 3 * 4000 + 1024); /* the refused count mismatch moved one 1 KiB chunk */
    assert_int_equal(st.refused, 0);

    /* version 0 published again (a trainer's first safe point after the start's): it is held already and stays
     * as it was, never marked as being written while a rollout reads it (that race failed a rollout rank once) */
    dispatcher_publish(d, 0, w1);
    expect_weights(c0, 0, w0, N, 1024);

    /* version 1 opens step 2; on-policy keeps one version, so version 0 is gone */
    dispatcher_publish(d, 1, w1);
    expect_unit(c1, 2, 1, 1);
    expect_unit(c0, 2, 0, 1);
    expect_wait(c0, "step 3", "version 2");
    expect_weights(c1, 1, w1, N, 1024);
    expect_not_held(c1, 0, N);

    /* version 2 opens step 3, the last; version 3 opens nothing */
    dispatcher_publish(d, 2, w2);
    expect_unit(c0, 3, 0, 2);
    expect_unit(c1, 3, 1, 2);
    expect_weights(c0, 2, w2, N, 1024);
    dispatcher_publish(d, 3, w0);
    expect_wait(c0, "every step is granted", "step 3");
    expect_wait(c1, "every step is granted", NULL);

    st = stats(d);
    assert_int_equal(st.granted, 6);
    assert_int_equal(st.regranted, 0);
    assert_int_equal(st.lost, 0);
    assert_int_equal(st.refused, 0);
    assert_int_equal(st.live, 2);

    work_client_close(c0);
    work_client_close(c1);
    dispatcher_close(d, 1.0);
    free(w), free(w0), free(w1), free(w2);

    /* unit u of U holds groups [B*u/U, B*(u+1)/U) */
    int lo = -1, hi = -1;
    dispatch_unit_range(5, 2, 0, &lo, &hi);
    assert_int_equal(lo, 0);
    assert_int_equal(hi, 2);
    dispatch_unit_range(5, 2, 1, &lo, &hi);
    assert_int_equal(lo, 2);
    assert_int_equal(hi, 5);
    dispatch_unit_range(5, 3, 1, &lo, &hi); /* 5/3 = 1, 10/3 = 3 */
    assert_int_equal(lo, 1);
    assert_int_equal(hi, 3);
    dispatch_unit_range(7, 7, 6, &lo, &hi);
    assert_int_equal(lo, 6);
    assert_int_equal(hi, 7);
    /* the units of a step cover it once */
    for (int U = 1; U <= 6; U++) {
        int prev = 0;
        for (int u = 0; u < U; u++) {
            dispatch_unit_range(13, U, u, &lo, &hi);
            assert_int_equal(lo, prev);
            assert_true(hi >= lo);
            prev = hi;
        }
        assert_int_equal(prev, 13);
    }
}

static void test_one_step_off(void **state)
{
    const struct fx *f = *state;
    char ep[128];
    endpoint(f, "d.sock", ep, sizeof ep);
    enum { N = 64 };
    float *w0 = weights(N, 1, 0), *w1 = weights(N, 1, 1000), *w2 = weights(N, 1, 2000);
    struct dispatcher *d = open_dispatcher(ep, NULL, 1, 1, 4, N, 10.0);
    struct work_client *c = open_client(ep, NULL, 0, 0.2);

    /* version 0 opens steps 1 and 2: step k uses version max(0, k-2) */
    dispatcher_publish(d, 0, w0);
    expect_unit(c, 1, 0, 0);
    expect_unit(c, 2, 0, 0);
    expect_wait(c, "step 3", "version 1");

    dispatcher_publish(d, 1, w1);
    expect_unit(c, 3, 0, 1);
    expect_wait(c, "step 4", "version 2");
    /* two versions kept: 0 is still served after 1 */
    expect_weights(c, 0, w0, N, 100);
    expect_weights(c, 1, w1, N, 100);

    dispatcher_publish(d, 2, w2);
    expect_not_held(c, 0, N);
    expect_weights(c, 1, w1, N, 4 * N);
    expect_weights(c, 2, w2, N, 4 * N);
    expect_unit(c, 4, 0, 2);
    expect_wait(c, "every step is granted", "step 4");

    struct dispatch_stats st = stats(d);
    assert_int_equal(st.granted, 4);
    assert_int_equal(st.regranted, 0);
    assert_int_equal(st.live, 1);
    work_client_close(c);
    dispatcher_close(d, 1.0);
    free(w0), free(w1), free(w2);
}

static void test_loss_and_regrant(void **state)
{
    const struct fx *f = *state;
    char ep[128];
    endpoint(f, "d.sock", ep, sizeof ep);
    enum { N = 16 };
    float *w0 = weights(N, 1, 0), *w1 = weights(N, 1, 1);

    /* a rank never seen is not lost before a grace of max(30 s, 10 lost_after_s): its units wait for it */
    char ep0[128];
    endpoint(f, "d0.sock", ep0, sizeof ep0);
    struct dispatcher *d = open_dispatcher(ep0, NULL, 2, 0, 5, N, 0.3);
    struct work_client *a = open_client(ep0, NULL, 0, 0.1);
    dispatcher_publish(d, 0, w0);
    expect_unit(a, 1, 0, 0);
    clock_sleep_s(0.6);
    expect_wait(a, "step 2", NULL);
    assert_int_equal(stats(d).lost, 0);
    work_client_close(a);
    dispatcher_close(d, 1.0);

    d = open_dispatcher(ep, NULL, 2, 0, 5, N, 0.3);
    a = open_client(ep, NULL, 0, 0.1);
    struct work_client *b = open_client(ep, NULL, 1, 0.1);
    dispatcher_publish(d, 0, w0);

    expect_unit(b, 1, 1, 0);
    expect_unit(a, 1, 0, 0);
    expect_wait(a, "step 2", NULL); /* b is alive: its unit is not a's */
    assert_int_equal(stats(d).live, 2);

    /* b falls silent: within a few lost_after_s its unit goes to a */
    work_client_close(b);
    const double t0 = clock_now_s();
    struct work_grant g;
    for (;;) {
        next_ok(a, &g);
        if (g.kind != WORK_WAIT)
            break;
        if (clock_now_s() - t0 > 3.0)
            fail_msg("rank 1's unit not granted again 3 s after its process fell silent (%s)", g.reason);
        clock_sleep_s(0.02);
    }
    if (g.kind != WORK_UNIT || g.step != 1 || g.unit != 1 || g.version != 0)
        fail_msg("expected step 1 unit 1 version 0 again, got kind %d step %lld unit %d version %lld", (int)g.kind,
                 (long long)g.step, g.unit, (long long)g.version);
    struct dispatch_stats st = stats(d);
    assert_true(st.lost >= 1);
    assert_true(st.regranted >= 1);
    assert_int_equal(st.granted, 3);
    assert_int_equal(st.live, 1);
    expect_wait(a, "step 2", "version 1");

    /* a process takes over rank 1: from the next step on it gets rank 1's units, and a only its own */
    struct work_client *r = open_client(ep, NULL, 1, 0.1);
    expect_wait(r, "step 2", "version 1");
    wait_live(d, 2, 3.0);
    dispatcher_publish(d, 1, w1);
    expect_unit(a, 2, 0, 1);
    expect_wait(a, "step 3", NULL);
    expect_unit(r, 2, 1, 1);
    st = stats(d);
    assert_int_equal(st.granted, 5);
    assert_int_equal(st.regranted, 1);
    assert_int_equal(st.live, 2);

    work_client_close(a);
    work_client_close(r);
    dispatcher_close(d, 1.0);
    free(w0), free(w1);
}

/* The broadcast's answer to client c's ask for version v. */
static enum work_broadcast bcast_ask(struct work_client *c, int64_t v)
{
    enum work_broadcast a = 0;
    char err[512] = "";
    if (work_client_broadcast_ask(c, v, &a, err, sizeof err) != 0)
        fail_msg("work_client_broadcast_ask(%lld): %s", (long long)v, err);
    return a;
}

/* weight_sync=broadcast: a round begins only once every rollout process has asked for the same held version; a
 * version not everyone asks for within the rendezvous, or one the trainer has waited for past it, is fetched; a
 * failed round or a lost process turns the broadcast off for good. */
static void test_broadcast_rounds(void **state)
{
    const struct fx *f = *state;
    char ep[128];
    endpoint(f, "b.sock", ep, sizeof ep);
    enum { N = 16 };
    float *w[6];
    for (int i = 0; i < 6; i++)
        w[i] = weights(N, 1, (float)i);
    /* one step off: the two newest versions are held, and versions 0..4 are needed by steps 2..6 */
    struct dispatcher *d = open_dispatcher(ep, NULL, 2, 1, 6, N, 0.5);
    struct work_client *a = open_client(ep, NULL, 0, 0.1), *b = open_client(ep, NULL, 1, 0.1);
    int64_t v = -1;
    const float *src = NULL;

    wait_live(d, 2, 3.0); /* asks come from processes the dispatcher knows (they asked for work first) */
    /* without dispatcher_broadcast_on every ask is told to fetch */
    dispatcher_publish(d, 0, w[0]);
    assert_int_equal(bcast_ask(a, 0), WB_FETCH);
    dispatcher_broadcast_on(d, 0.4);
    assert_true(dispatcher_round_due(d, 0));

    /* version 0: a asks, then b; the round begins only then, and the askers are told to join */
    assert_false(dispatcher_round_begin(d, &v, &src));
    assert_int_equal(bcast_ask(a, 0), WB_WAIT);
    assert_false(dispatcher_round_begin(d, &v, &src));
    assert_int_equal(bcast_ask(b, 0), WB_WAIT);
    assert_true(dispatcher_round_begin(d, &v, &src));
    assert_int_equal(v, 0);
    assert_memory_equal(src, w[0], N * sizeof(float));
    assert_false(dispatcher_round_begin(d, &v, &src)); /* one round at a time */
    assert_int_equal(bcast_ask(a, 0), WB_JOIN);
    assert_int_equal(bcast_ask(b, 0), WB_JOIN);
    expect_weights(a, 0, w[0], N, 64); /* a fetch still works meanwhile */
    dispatcher_round_end(d, true);
    assert_int_equal(stats(d).broadcasts, 1);
    assert_false(dispatcher_round_due(d, 0));
    assert_int_equal(bcast_ask(a, 0), WB_FETCH); /* its round is over */

    /* version 1: only a asks; past the rendezvous it is fetched, by b too */
    dispatcher_publish(d, 1, w[1]);
    assert_true(dispatcher_round_due(d, 0));
    assert_int_equal(bcast_ask(a, 1), WB_WAIT);
    clock_sleep_s(0.5);
    assert_false(dispatcher_round_begin(d, &v, &src));
    assert_int_equal(bcast_ask(a, 1), WB_FETCH);
    assert_int_equal(bcast_ask(b, 1), WB_FETCH);
    assert_false(dispatcher_round_due(d, 0));

    /* version 2: asked for apart (a version 2, b an older one) is no round; the trainer waits past the
     * rendezvous, and it is fetched */
    dispatcher_publish(d, 2, w[2]);
    assert_int_equal(bcast_ask(a, 2), WB_WAIT);
    assert_int_equal(bcast_ask(b, 1), WB_FETCH); /* skipped already */
    assert_false(dispatcher_round_begin(d, &v, &src));
    assert_true(dispatcher_round_due(d, 0.1));
    assert_false(dispatcher_round_due(d, 1.0));
    assert_int_equal(bcast_ask(a, 2), WB_FETCH);

    /* version 3: a failed round turns the broadcast off */
    dispatcher_publish(d, 3, w[3]);
    assert_int_equal(bcast_ask(b, 3), WB_WAIT);
    assert_int_equal(bcast_ask(a, 3), WB_WAIT);
    assert_true(dispatcher_round_begin(d, &v, &src));
    assert_int_equal(v, 3);
    dispatcher_round_end(d, false);
    assert_int_equal(stats(d).broadcasts, 1);
    dispatcher_publish(d, 4, w[4]);
    assert_false(dispatcher_round_due(d, 0));
    assert_int_equal(bcast_ask(a, 4), WB_FETCH);
    assert_int_equal(bcast_ask(b, 4), WB_FETCH);
    expect_weights(b, 4, w[4], N, 64);
    work_client_close(a);
    work_client_close(b);
    dispatcher_close(d, 1.0);

    /* a lost process turns it off too; the last version (no step to come needs it) is never due */
    endpoint(f, "b2.sock", ep, sizeof ep);
    d = open_dispatcher(ep, NULL, 2, 0, 2, N, 0.3);
    dispatcher_broadcast_on(d, 30);
    a = open_client(ep, NULL, 0, 0.1);
    b = open_client(ep, NULL, 1, 0.1);
    wait_live(d, 2, 3.0);
    dispatcher_publish(d, 0, w[0]);
    assert_int_equal(bcast_ask(a, 0), WB_WAIT);
    work_client_close(b);
    wait_live(d, 1, 3.0);
    assert_int_equal(bcast_ask(a, 0), WB_FETCH);
    assert_false(dispatcher_round_begin(d, &v, &src));
    assert_false(dispatcher_round_due(d, 0));
    work_client_close(a);
    dispatcher_close(d, 1.0);
    endpoint(f, "b3.sock", ep, sizeof ep);
    d = open_dispatcher(ep, NULL, 1, 1, 3, N, 5);
    dispatcher_broadcast_on(d, 30);
    dispatcher_publish(d, 1, w[1]);
    assert_true(dispatcher_round_due(d, 0)); /* step 3 is generated with version 1 (one step off) */
    dispatcher_publish(d, 2, w[2]);
    assert_false(dispatcher_round_due(d, 0)); /* no step 4 */
    dispatcher_close(d, 1.0);
    for (int i = 0; i < 6; i++)
        free(w[i]);
}

static void test_end(void **state)
{
    const struct fx *f = *state;
    char ep[128];
    endpoint(f, "d.sock", ep, sizeof ep);
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);
    struct dispatcher *d = open_dispatcher(ep, NULL, 2, 0, 10, N, 10.0);
    struct work_client *a = open_client(ep, NULL, 0, 0.1), *b = open_client(ep, NULL, 1, 0.1);
    dispatcher_publish(d, 0, w0);
    expect_unit(a, 1, 0, 0);
    wait_live(d, 2, 3.0); /* b only pings */
    assert_false(work_client_ended(a));
    assert_false(work_client_ended(b));

    dispatcher_end(d, 2, "stopped after step 2");
    struct work_grant g;
    next_ok(a, &g);
    assert_int_equal(g.kind, WORK_END);
    assert_int_equal(g.step, 2);
    assert_string_equal(g.reason, "stopped after step 2");
    /* the first word stands */
    dispatcher_end(d, 5, "finished");
    next_ok(a, &g);
    assert_int_equal(g.kind, WORK_END);
    assert_int_equal(g.step, 2);
    assert_string_equal(g.reason, "stopped after step 2");

    /* both hear it in their pings */
    const double until = clock_now_s() + 3.0;
    while (!work_client_ended(a) || !work_client_ended(b)) {
        if (clock_now_s() > until)
            fail_msg("the pings did not hear the end within 3 s (a %d, b %d)", work_client_ended(a),
                     work_client_ended(b));
        clock_sleep_s(0.02);
    }
    /* every live process has heard it: close does not linger */
    double t0 = clock_now_s();
    dispatcher_close(d, 10.0);
    double took = clock_now_s() - t0;
    if (took >= 2.0)
        fail_msg("dispatcher_close took %.2f s with every live process told the end", took);
    work_client_close(a);
    work_client_close(b);

    /* a live process that has not heard the end (its next ping is far off) holds close for linger_s at most */
    char ep2[128];
    endpoint(f, "d2.sock", ep2, sizeof ep2);
    d = open_dispatcher(ep2, NULL, 1, 0, 10, N, 60.0);
    struct work_client *slow = open_client(ep2, NULL, 0, 30.0);
    expect_wait(slow, "first weights", NULL);
    dispatcher_end(d, 0, "stopped before step 1");
    t0 = clock_now_s();
    dispatcher_close(d, 0.5);
    took = clock_now_s() - t0;
    if (took < 0.45 || took >= 3.0)
        fail_msg("dispatcher_close(0.5) took %.2f s with a live process not told the end", took);
    assert_false(work_client_ended(slow));
    work_client_close(slow);
    free(w0);
}

/* Send raw bytes on a REQ socket and return the decoded answer (NULL when it does not decode). */
static Grpo__Envelope *raw_call(int s, const void *buf, size_t len)
{
    assert_int_equal(nn_send(s, buf, len, 0), (int)len);
    void *msg = NULL;
    int n = nn_recv(s, &msg, NN_MSG, 0);
    if (n < 0)
        fail_msg("no answer from the dispatcher: %s", nn_strerror(nn_errno()));
    char why[256];
    Grpo__Envelope *r = protocol_unpack(msg, (size_t)n, why, sizeof why);
    nn_freemsg(msg);
    return r;
}

static void expect_refusal(Grpo__Envelope *r, const char *text)
{
    assert_non_null(r);
    assert_int_equal(r->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_false(r->reply->ok);
    if (!strstr(r->reply->error, text))
        fail_msg("refusal '%s' does not mention '%s'", r->reply->error, text);
    protocol_free(r);
}

static void test_bad_input(void **state)
{
    const struct fx *f = *state;
    char ep[128], err[512] = "";
    endpoint(f, "d.sock", ep, sizeof ep);
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);

    /* options that make no dispatcher */
    const struct dispatch_options none = {.endpoint = ep, .units = 0, .n_floats = N, .lost_after_s = 1};
    assert_null(dispatcher_open(&none, err, sizeof err));
    assert_non_null(strstr(err, "0 units"));

    /* a regular file at the socket's path is neither removed nor bound over (issue 12, defect 3) */
    char file_ep[128], path[128];
    endpoint(f, "precious", file_ep, sizeof file_ep);
    snprintf(path, sizeof path, "%s/precious", f->dir);
    FILE *pf = fopen(path, "w");
    assert_non_null(pf);
    fputs("precious\n", pf);
    fclose(pf);
    const struct dispatch_options on_file = {.endpoint = file_ep, .units = 1, .n_floats = N, .lost_after_s = 1};
    assert_null(dispatcher_open(&on_file, err, sizeof err));
    assert_non_null(strstr(err, "not a socket"));
    char back[32] = "";
    pf = fopen(path, "r");
    assert_non_null(pf);
    assert_non_null(fgets(back, sizeof back, pf));
    fclose(pf);
    assert_string_equal(back, "precious\n");

    struct dispatcher *d = open_dispatcher(ep, NULL, 2, 0, 10, N, 10.0);
    dispatcher_publish(d, 0, w0);

    /* a rank the run does not have */
    struct work_client *bad = open_client(ep, NULL, 7, 0.2);
    struct work_grant g;
    expect_error(work_client_next(bad, &g, NEXT_TIMEOUT_MS, err, sizeof err), err, "rollout ranks 0..1");
    assert_non_null(strstr(err, "rollout rank 7"));
    work_client_close(bad);
    struct dispatch_stats st = stats(d);
    assert_true(st.refused >= 1);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.granted, 0);

    /* garbage, and a request of another kind, on a raw socket */
    int s = nn_socket(AF_SP, NN_REQ);
    assert_true(s >= 0);
    int to = 5000;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &to, sizeof to);
    assert_true(nn_connect(s, ep) >= 0);
    const int64_t refused0 = stats(d).refused;
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    expect_refusal(raw_call(s, junk, sizeof junk), "");
    assert_true(stats(d).refused >= refused0 + 1);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.request_id = 42;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    size_t len;
    uint8_t *buf = protocol_pack(&env, &len);
    assert_non_null(buf);
    Grpo__Envelope *r = raw_call(s, buf, len);
    free(buf);
    assert_non_null(r);
    assert_int_equal(r->request_id, 42);
    expect_refusal(r, "work and weights requests only");
    assert_true(stats(d).refused >= refused0 + 2);
    nn_close(s);

    /* the dispatcher still serves */
    struct work_client *c = open_client(ep, NULL, 0, 0.2);
    expect_unit(c, 1, 0, 0);
    work_client_close(c);
    dispatcher_close(d, 1.0);

    /* with a secret: none or a wrong one is refused, the right one served */
    char ep2[128];
    endpoint(f, "d2.sock", ep2, sizeof ep2);
    d = open_dispatcher(ep2, "s3cret", 2, 0, 10, N, 10.0);
    dispatcher_publish(d, 0, w0);
    struct work_client *anon = open_client(ep2, NULL, 0, 0.2);
    expect_error(work_client_next(anon, &g, NEXT_TIMEOUT_MS, err, sizeof err), err, "secret");
    work_client_close(anon);
    struct work_client *wrong = open_client(ep2, "s3cre", 0, 0.2);
    expect_error(work_client_next(wrong, &g, NEXT_TIMEOUT_MS, err, sizeof err), err, "secret");
    work_client_close(wrong);
    st = stats(d);
    assert_true(st.refused >= 2);
    assert_int_equal(st.live, 0);
    struct work_client *ok = open_client(ep2, "s3cret", 0, 0.2);
    expect_unit(ok, 1, 0, 0);
    float w[N];
    size_t bytes;
    int chunks;
    assert_int_equal(work_client_weights(ok, 0, w, N, 1024, &bytes, &chunks, err, sizeof err), 0);
    assert_memory_equal(w, w0, sizeof w);
    st = stats(d);
    assert_int_equal(st.granted, 1);
    assert_int_equal(st.live, 1);
    work_client_close(ok);
    dispatcher_close(d, 1.0);
    free(w0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_grants_and_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_step_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_and_regrant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broadcast_rounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
