/* The rollout work dispatcher. Its pure core is driven message by message with a clock the test moves by hand (no
 * sockets, no sleeps): units are granted one per rollout rank per step, and only once the policy version a step
 * needs is published (on-policy and one-step-off); versions are served exactly, in the chunks asked for, while
 * they are held (the newest staleness + 1); a rollout process that falls silent is lost and its unit goes to a live
 * one (a rank never seen keeps its units through the grace), while the process that takes over its rank gets that
 * rank's units again; a lost answer (the process asks again and gets the unit it holds, counted once), a grant's
 * lease (past it, the unit of a live holder goes to an idle process; the lease grows with the longest unit) and
 * late or repeated words that change nothing; the weight broadcast's rounds and rendezvous; the end is told to requests
 * and pings and its first word stands; a wrong rank, garbage, another kind of request, or a request of another
 * launch's key epoch are refused without harm to the others. Then the shell and the client over real ipc sockets: the
 * same grants and chunks end to end, bad options, a regular file at the socket's path, and close (at once when every
 * live process has heard the end, after linger_s at most when one has not). */
#include <dirent.h>
#include <pthread.h>
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
#include "proto/plane_auth.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "worker/plane/dispatch.h"
#include "worker/plane/relay.h"

#define NEXT_TIMEOUT_MS 5000
/* The test's run: trainer ranks 0..FIRST_ROLLOUT-1, then one rollout rank per unit; its data-plane key. */
#define FIRST_ROLLOUT 2
#define EPOCH 5 /* the run key's epoch (the launch's) */
static uint8_t run_key[PLANE_KEY_BYTES];

/* ---- the core, with a hand-moved clock ---- */

/* What each process has heard last, as the real client (work_client.c) keeps it: the last unit granted to it,
 * which its next ask reports finished and delivered. Forgotten with each new core. */
static struct heard {
    uint64_t id;
    int64_t step;
    int unit;
    bool old;         /* a process of protocol 1.6, whose asks name no unit */
    uint64_t counter; /* its requests so far (the counter of its authentication) */
} heard[64];
static int n_heard;

static struct heard *heard_of(uint64_t id)
{
    for (int i = 0; i < n_heard; i++)
        if (heard[i].id == id)
            return &heard[i];
    assert_true(n_heard < 64);
    heard[n_heard] = (struct heard){.id = id};
    return &heard[n_heard++];
}

/* A core with the leases' floor at lease_floor_s (0: DISPATCH_LEASE_FLOOR_S). */
static struct dispatch_core *core_open_floor(int units, int staleness, int64_t total, size_t n_floats,
                                             double lost_after_s, double now, double lease_floor_s)
{
    const struct dispatch_options o = {.units = units,
                                       .groups_in_step = 5,
                                       .staleness = staleness,
                                       .start = 0,
                                       .total_steps = total,
                                       .start_epoch = 3,
                                       .start_cursor = 17,
                                       .n_floats = n_floats,
                                       .lost_after_s = lost_after_s,
                                       .run_key = run_key,
                                       .epoch = EPOCH,
                                       .first_rollout_rank = FIRST_ROLLOUT,
                                       .rollout_tp = 1,
                                       .lease_floor_s = lease_floor_s};
    char err[512] = "";
    n_heard = 0;
    struct dispatch_core *d = dispatch_core_create(&o, now, err, sizeof err);
    if (!d)
        fail_msg("dispatch_core_create: %s", err);
    return d;
}

static struct dispatch_core *core_open(int units, int staleness, int64_t total, size_t n_floats, double lost_after_s,
                                       double now)
{
    return core_open_floor(units, staleness, total, n_floats, lost_after_s, now, 0);
}

static void publish(struct dispatch_core *d, int64_t v, const float *w)
{
    float *dst = dispatch_core_publish_begin(d, v);
    if (dst) {
        memcpy(dst, w, dispatch_core_floats(d) * sizeof(float));
        dispatch_core_publish_end(d, v);
    }
}

/* A rollout process as the core sees it: its id and rank. */
struct proc {
    uint64_t id;
    int rank;
};

/* Rollout ranks the tests' runs have at most: a process that names another rank holds rollout rank 0's
 * credentials (it asks for a rank the run lacks in its request only). */
#define TEST_UNITS_MAX 2

/* The credentials of process p: world rank FIRST_ROLLOUT + its rollout rank (see TEST_UNITS_MAX), pid and
 * incarnation its id, the counter its own. */
static struct plane_cred cred_of(const struct proc *p)
{
    struct plane_cred c;
    const int slot = p->rank >= 0 && p->rank < TEST_UNITS_MAX ? p->rank : 0;
    plane_cred_issue(
        &c, run_key,
        &(struct plane_id){.rank = FIRST_ROLLOUT + slot, .pid = (uint32_t)p->id, .incarnation = p->id, .epoch = EPOCH});
    c.counter = heard_of(p->id)->counter;
    return c;
}

/* Pack env (authenticated as process p; NULL: not at all), hand it to the core at time now, and decode the reply. */
static Grpo__Envelope *core_call(struct dispatch_core *d, Grpo__Envelope *env, const struct proc *p, double now)
{
    static uint64_t next_id = 1;
    env->request_id = next_id++;
    size_t len = 0, rlen = 0;
    struct plane_cred c;
    if (p)
        c = cred_of(p);
    uint8_t *buf = plane_pack_request(env, p ? &c : NULL, &len);
    if (p)
        heard_of(p->id)->counter = c.counter;
    assert_non_null(buf);
    uint8_t *out = dispatch_core_handle(d, buf, len, now, &rlen);
    free(buf);
    assert_non_null(out);
    char why[256] = "";
    Grpo__Envelope *r = protocol_unpack(out, rlen, why, sizeof why);
    free(out);
    if (!r) {
        print_error("the core's reply does not decode: %s\n", why);
        fail();
        abort(); /* fail() does not return; this tells the analysers so */
    }
    assert_int_equal(r->request_id, env->request_id);
    return r;
}

static Grpo__Envelope *work_call(struct dispatch_core *d, const struct proc *p, bool ping, double now)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = p->id;
    w.rank = p->rank;
    w.ping = ping;
    if (!ping && !heard_of(p->id)->old) {
        w.done_step = heard_of(p->id)->step;
        w.done_unit = heard_of(p->id)->unit;
        w.names_done = true;
    }
    req.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    req.work_request = &w;
    return core_call(d, &req, p, now);
}

/* p says it has heard the end (a ping with end_heard, as a 1.14 process sends once the end reached it); the
 * answer, an end again, is checked and dropped. */
static void say_heard(struct dispatch_core *d, const struct proc *p, double now)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = p->id;
    w.rank = p->rank;
    w.ping = true;
    w.end_heard = true;
    req.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    req.work_request = &w;
    Grpo__Envelope *r = core_call(d, &req, p, now);
    assert_int_equal(r->body_case, GRPO__ENVELOPE__BODY_WORK_GRANT);
    assert_int_equal(r->work_grant->kind, WORK_END);
    protocol_free(r);
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

/* The grant a work request (or a ping) gets; *g filled. The process hears it (a unit is its last) unless the
 * answer is lost on its way. */
static void grant_heard(struct dispatch_core *d, const struct proc *p, bool ping, double now, struct work_grant *g,
                        bool lost)
{
    Grpo__Envelope *r = work_call(d, p, ping, now);
    if (r->body_case != GRPO__ENVELOPE__BODY_WORK_GRANT)
        fail_msg("rank %d: expected a grant, got body %d (%s)", p->rank, (int)r->body_case,
                 r->body_case == GRPO__ENVELOPE__BODY_REPLY ? r->reply->error : "");
    work_grant_of(r->work_grant, g);
    protocol_free(r);
    if (!lost && g->kind == WORK_UNIT) {
        heard_of(p->id)->step = g->step;
        heard_of(p->id)->unit = g->unit;
    }
}

static void grant_of(struct dispatch_core *d, const struct proc *p, bool ping, double now, struct work_grant *g)
{
    grant_heard(d, p, ping, now, g, false);
}

static void expect_unit_at(struct dispatch_core *d, const struct proc *p, double now, int64_t step, int unit,
                           int64_t version)
{
    struct work_grant g;
    grant_of(d, p, false, now, &g);
    if (g.kind != WORK_UNIT)
        fail_msg("rank %d: expected step %lld unit %d, got kind %d (%s)", p->rank, (long long)step, unit, (int)g.kind,
                 g.reason);
    if (g.step != step || g.unit != unit || g.version != version)
        fail_msg("rank %d: expected step %lld unit %d version %lld, got step %lld unit %d version %lld", p->rank,
                 (long long)step, unit, (long long)version, (long long)g.step, g.unit, (long long)g.version);
    work_grant_release(&g); /* (a replayed unit's arrays) */
}

/* The answer is a wait whose reason contains each of the (up to two) texts. */
static void expect_wait_at(struct dispatch_core *d, const struct proc *p, double now, const char *text,
                           const char *text2)
{
    struct work_grant g;
    grant_of(d, p, false, now, &g);
    if (g.kind != WORK_WAIT)
        fail_msg("rank %d: expected a wait (%s), got kind %d step %lld unit %d", p->rank, text, (int)g.kind,
                 (long long)g.step, g.unit);
    if (!strstr(g.reason, text) || (text2 && !strstr(g.reason, text2)))
        fail_msg("wait reason '%s' does not mention '%s' and '%s'", g.reason, text, text2 ? text2 : "");
    work_grant_release(&g);
}

/* A weights request: a chunk [off, off + cnt) of version v, or a broadcast ask. */
static Grpo__Envelope *weights_call(struct dispatch_core *d, const struct proc *p, int64_t v, uint64_t off,
                                    uint64_t cnt, bool broadcast, double now)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
    q.worker_id = p->id;
    q.version = v;
    q.offset = off;
    q.count = cnt;
    q.broadcast = broadcast;
    req.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    req.weights_request = &q;
    Grpo__Envelope *r = core_call(d, &req, p, now);
    if (r->body_case != GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK)
        fail_msg("expected a weights chunk, got body %d", (int)r->body_case);
    return r;
}

/* Version v read in chunks of per floats equals want[0..n). */
static void expect_weights_at(struct dispatch_core *d, const struct proc *p, double now, int64_t v, const float *want,
                              size_t n, size_t per)
{
    for (size_t off = 0; off < n; off += per) {
        size_t cnt = n - off < per ? n - off : per;
        Grpo__Envelope *r = weights_call(d, p, v, off, cnt, false, now);
        const Grpo__WeightsChunk *c = r->weights_chunk;
        if (c->error[0])
            fail_msg("version %lld at %zu: %s", (long long)v, off, c->error);
        assert_int_equal(c->version, v);
        assert_int_equal(c->offset, off);
        assert_int_equal(c->n_floats, n);
        assert_int_equal(c->data.len, cnt * sizeof(float));
        assert_memory_equal(c->data.data, want + off, cnt * sizeof(float));
        protocol_free(r);
    }
}

static void expect_chunk_error(struct dispatch_core *d, const struct proc *p, double now, int64_t v, uint64_t off,
                               uint64_t cnt, const char *text)
{
    Grpo__Envelope *r = weights_call(d, p, v, off, cnt, false, now);
    if (!strstr(r->weights_chunk->error, text))
        fail_msg("chunk error '%s' does not mention '%s'", r->weights_chunk->error, text);
    assert_int_equal(r->weights_chunk->data.len, 0);
    protocol_free(r);
}

static int bcast(struct dispatch_core *d, const struct proc *p, int64_t v, double now)
{
    Grpo__Envelope *r = weights_call(d, p, v, 0, 0, true, now);
    int a = r->weights_chunk->broadcast;
    protocol_free(r);
    return a;
}

static struct dispatch_stats cstats(const struct dispatch_core *d)
{
    struct dispatch_stats st;
    dispatch_core_stats(d, &st);
    return st;
}

/* Rank 0's first grant of a run of 2 units and 3 steps from step 0 (data cursor epoch 3, index 17) of an n-float
 * policy: step 1's unit 0, with version 0, and the run's whole shape. */
static void expect_first_grant(const struct work_grant *g, size_t n)
{
    assert_int_equal(g->kind, WORK_UNIT);
    assert_int_equal(g->step, 1);
    assert_int_equal(g->unit, 0);
    assert_int_equal(g->units, 2);
    assert_int_equal(g->version, 0);
    assert_int_equal(g->start, 0);
    assert_int_equal(g->total_steps, 3);
    assert_int_equal(g->start_epoch, 3);
    assert_int_equal(g->start_cursor, 17);
    assert_int_equal(g->n_floats, n);
}

static float *weights(size_t n, float scale, float offset)
{
    float *w = malloc(n * sizeof *w);
    assert_non_null(w);
    for (size_t i = 0; i < n; i++)
        w[i] = (float)i * scale + offset;
    return w;
}

/* ---- the core's tests ---- */

static void test_grants_and_versions(void **state)
{
    (void)state;
    enum { N = 1000 };
    float *w0 = weights(N, 0.5f, 0), *w1 = weights(N, -0.25f, -1), *w2 = weights(N, 2.0f, 0.125f);
    double t = 100;
    struct dispatch_core *d = core_open(2, 0, 3, N, 10.0, t);
    const struct proc c0 = {0xA0, 0}, c1 = {0xB1, 1};

    /* nothing published: wait, with the reason */
    expect_wait_at(d, &c0, t, "first weights", NULL);
    expect_wait_at(d, &c1, t, "first weights", NULL);
    expect_chunk_error(d, &c0, t, 0, 0, 10, "not held");

    /* version 0 opens step 1 (on-policy: step k uses version k-1) */
    publish(d, 0, w0);
    struct work_grant g;
    grant_of(d, &c0, false, t, &g);
    expect_first_grant(&g, N);
    expect_unit_at(d, &c1, t, 1, 1, 0);
    /* step 2 needs version 1 */
    expect_wait_at(d, &c0, t, "step 2", "version 1");
    expect_wait_at(d, &c1, t, "step 2", "version 1");

    /* version 0 in chunks of 256, 1000 and 300 floats (the last of 100) */
    expect_weights_at(d, &c1, t, 0, w0, N, 256);
    expect_weights_at(d, &c0, t, 0, w0, N, N);
    expect_weights_at(d, &c0, t, 0, w0, N, 300);
    /* a version never published, and chunks out of range */
    expect_chunk_error(d, &c0, t, 7, 0, 10, "not held");
    expect_chunk_error(d, &c0, t, 0, 990, 20, "1000 parameters");
    expect_chunk_error(d, &c0, t, 0, 1001, 0, "out of range");
    expect_chunk_error(d, &c0, t, 0, 0, DISPATCH_CHUNK_MAX_FLOATS + 1, "out of range");
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.granted, 2);
    assert_int_equal(st.bytes, 3 * 4000);
    assert_int_equal(st.refused, 0);

    /* version 0 published again (a trainer's first safe point after the start's): it is held already and stays
     * as it was, never marked as being written while a rollout reads it (that race failed a rollout rank once) */
    assert_null(dispatch_core_publish_begin(d, 0));
    expect_weights_at(d, &c0, t, 0, w0, N, 256);

    /* version 1 opens step 2; on-policy keeps one version, so version 0 is gone */
    publish(d, 1, w1);
    expect_unit_at(d, &c1, t, 2, 1, 1);
    expect_unit_at(d, &c0, t, 2, 0, 1);
    expect_wait_at(d, &c0, t, "step 3", "version 2");
    expect_weights_at(d, &c1, t, 1, w1, N, 256);
    expect_chunk_error(d, &c1, t, 0, 0, 10, "not held");

    /* version 2 opens step 3, the last; version 3 opens nothing */
    publish(d, 2, w2);
    expect_unit_at(d, &c0, t, 3, 0, 2);
    expect_unit_at(d, &c1, t, 3, 1, 2);
    expect_weights_at(d, &c0, t, 2, w2, N, 256);
    publish(d, 3, w0);
    expect_wait_at(d, &c0, t, "every step is granted", "step 3");
    expect_wait_at(d, &c1, t, "every step is granted", NULL);

    st = cstats(d);
    assert_int_equal(st.granted, 6);
    assert_int_equal(st.regranted, 0);
    assert_int_equal(st.lost, 0);
    assert_int_equal(st.refused, 0);
    assert_int_equal(st.live, 2);
    dispatch_core_free(d);
    free(w0), free(w1), free(w2);

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
    (void)state;
    enum { N = 64 };
    float *w0 = weights(N, 1, 0), *w1 = weights(N, 1, 1000), *w2 = weights(N, 1, 2000);
    const double t = 5;
    struct dispatch_core *d = core_open(1, 1, 4, N, 10.0, t);
    const struct proc c = {7, 0};

    /* version 0 opens steps 1 and 2: step k uses version max(0, k-2) */
    publish(d, 0, w0);
    expect_unit_at(d, &c, t, 1, 0, 0);
    expect_unit_at(d, &c, t, 2, 0, 0);
    expect_wait_at(d, &c, t, "step 3", "version 1");

    publish(d, 1, w1);
    expect_unit_at(d, &c, t, 3, 0, 1);
    expect_wait_at(d, &c, t, "step 4", "version 2");
    /* two versions kept: 0 is still served after 1 */
    expect_weights_at(d, &c, t, 0, w0, N, 25);
    expect_weights_at(d, &c, t, 1, w1, N, 25);

    publish(d, 2, w2);
    expect_chunk_error(d, &c, t, 0, 0, N, "not held");
    expect_weights_at(d, &c, t, 1, w1, N, N);
    expect_weights_at(d, &c, t, 2, w2, N, N);
    expect_unit_at(d, &c, t, 4, 0, 2);
    expect_wait_at(d, &c, t, "every step is granted", "step 4");

    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.granted, 4);
    assert_int_equal(st.regranted, 0);
    assert_int_equal(st.live, 1);
    dispatch_core_free(d);
    free(w0), free(w1), free(w2);
}

/* A survivor that takes over a lost lead one-step-off, at the redo of step 3: its dispatcher starts at step 2 (its
 * data cursor is step 3's), with the version floor below it, 1: it publishes version 1 (from step 2's kept start)
 * and 2 (its weights now). Step 3 is granted with version 1 and step 4 with version 2, as the lost lead had them;
 * no step up to 2 is granted again, not even between the two publishes. */
static void test_takeover_floor(void **state)
{
    (void)state;
    enum { N = 16 };
    float *w1 = weights(N, 1, 1000), *w2 = weights(N, 1, 2000);
    const double t = 5;
    const struct dispatch_options o = {.units = 1,
                                       .groups_in_step = 5,
                                       .staleness = 1,
                                       .start = 2,
                                       .version_floor_set = true,
                                       .version_floor = 1,
                                       .total_steps = 5,
                                       .start_epoch = 0,
                                       .start_cursor = 10,
                                       .n_floats = N,
                                       .lost_after_s = 10,
                                       .run_key = run_key,
                                       .epoch = EPOCH,
                                       .first_rollout_rank = FIRST_ROLLOUT,
                                       .rollout_tp = 1};
    char err[512] = "";
    n_heard = 0;
    struct dispatch_core *d = dispatch_core_create(&o, t, err, sizeof err);
    assert_non_null(d);
    const struct proc c = {9, 0};
    expect_wait_at(d, &c, t, "first weights", NULL);
    publish(d, 1, w1);
    struct work_grant g;
    grant_of(d, &c, false, t, &g); /* between the publishes: step 3 (version 1), never step 2 */
    assert_int_equal(g.kind, WORK_UNIT);
    assert_int_equal(g.step, 3);
    assert_int_equal(g.version, 1);
    assert_int_equal(g.start, 2);
    assert_int_equal(g.start_cursor, 10);
    work_grant_release(&g);
    publish(d, 2, w2);
    expect_unit_at(d, &c, t, 4, 0, 2);
    expect_weights_at(d, &c, t, 1, w1, N, N); /* both versions held */
    expect_weights_at(d, &c, t, 2, w2, N, N);
    assert_int_equal(cstats(d).granted, 2);
    dispatch_core_free(d);
    free(w1), free(w2);
}

static void test_loss_and_regrant(void **state)
{
    (void)state;
    enum { N = 16 };
    float *w0 = weights(N, 1, 0), *w1 = weights(N, 1, 1);
    const struct proc a = {0xA, 0}, b = {0xB, 1}, r = {0xC, 1};

    /* a rank never seen is not lost before a grace of max(30 s, 10 lost_after_s): its units wait for it */
    double t = 0;
    struct dispatch_core *d = core_open(2, 0, 5, N, 0.3, t);
    publish(d, 0, w0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    struct work_grant g;
    for (int i = 1; i < 120; i++) { /* a pings every 0.25 s, within its lost_after_s, up to 29.75 s */
        t = 0.25 * i;
        grant_of(d, &a, true, t, &g);
        dispatch_core_tick(d, t);
    }
    t = 30;
    expect_wait_at(d, &a, t, "step 2", NULL); /* t = 30 s: not past the grace */
    assert_int_equal(cstats(d).lost, 0);
    /* past the grace, the unit of the rank never seen is a's */
    t = 30.25;
    grant_of(d, &a, true, t, &g);
    dispatch_core_tick(d, t);
    expect_unit_at(d, &a, t, 1, 1, 0);
    assert_int_equal(cstats(d).regranted, 1);
    dispatch_core_free(d);

    t = 0;
    d = core_open(2, 0, 5, N, 0.3, t);
    publish(d, 0, w0);
    expect_unit_at(d, &b, t, 1, 1, 0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    expect_wait_at(d, &a, t, "step 2", NULL); /* b is alive: its unit is not a's */
    assert_int_equal(cstats(d).live, 2);

    /* b falls silent: at lost_after_s it is still alive, just past it it is lost and its unit goes to a */
    t = 0.3;
    dispatch_core_tick(d, t);
    expect_wait_at(d, &a, t, "step 2", NULL);
    assert_int_equal(cstats(d).lost, 0);
    t = 0.31;
    dispatch_core_tick(d, t);
    assert_int_equal(cstats(d).lost, 1);
    expect_unit_at(d, &a, t, 1, 1, 0);
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.regranted, 1);
    assert_int_equal(st.granted, 3);
    assert_int_equal(st.live, 1);
    expect_wait_at(d, &a, t, "step 2", "version 1");

    /* a process takes over rank 1: from the next step on it gets rank 1's units, and a only its own */
    expect_wait_at(d, &r, t, "step 2", "version 1");
    assert_int_equal(cstats(d).live, 2);
    publish(d, 1, w1);
    expect_unit_at(d, &a, t, 2, 0, 1);
    expect_wait_at(d, &a, t, "step 3", NULL);
    expect_unit_at(d, &r, t, 2, 1, 1);
    st = cstats(d);
    assert_int_equal(st.granted, 5);
    assert_int_equal(st.regranted, 1);
    assert_int_equal(st.live, 2);

    /* the lost process comes back (it was only slow): r serves its rank now, so b is superseded, refused and
     * counted; one live process per rank */
    t = 0.5;
    expect_refusal(work_call(d, &b, true, t), "superseded: rollout rank 1 is served by a newer process");
    expect_refusal(work_call(d, &b, false, t), "superseded");
    st = cstats(d);
    assert_int_equal(st.superseded, 2);
    assert_int_equal(st.live, 2);
    dispatch_core_free(d);

    /* a lost process comes back before anyone took its place: alive again, and it holds nothing */
    t = 0;
    d = core_open(2, 0, 5, N, 0.3, t);
    publish(d, 0, w0);
    expect_unit_at(d, &b, t, 1, 1, 0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    dispatch_core_tick(d, 1.0);
    assert_int_equal(cstats(d).lost, 2);
    grant_of(d, &b, true, 1.0, &g);
    assert_int_equal(g.kind, WORK_WAIT);
    assert_int_equal(cstats(d).live, 1);
    dispatch_core_free(d);
    free(w0), free(w1);
}

/* weight_sync=broadcast: a round begins only once every rollout process has asked for the same held version; a
 * version not everyone asks for within the rendezvous, or one the trainer has waited for past it, is fetched; a
 * failed round or a process superseded by a replacement turns the broadcast off for good; a lost one only pauses it
 * until it is back. */
/* A process asks, the dispatcher grants it a unit, and the answer never reaches it (its ask timed out first, or
 * the network cut it): asking again, it gets the same unit, counted once; nobody else gets it meanwhile. The same
 * one-step-off, where the unit lost is the next step's and the last one's is reported done. */
/* issue 27: the dispatcher says to whom each unit of the window was granted (the trainers keep a batch only from
 * such a process), and a unit whose batch the trainers dropped is granted again */
static void test_granted_and_dropped(void **state)
{
    (void)state;
    enum { N = 16 };
    float *w0 = weights(N, 1, 0), *w1 = weights(N, 1, 1);
    const struct proc a = {0xA, 0}, b = {0xB, 1};
    double t = 0;
    struct dispatch_core *d = core_open(2, 0, 5, N, 5, t);
    publish(d, 0, w0);
    assert_false(dispatch_core_granted(d, 1, 0, 0)); /* nothing granted yet */
    expect_unit_at(d, &a, t, 1, 0, 0);
    assert_true(dispatch_core_granted(d, 1, 0, 0));
    assert_false(dispatch_core_granted(d, 1, 0, 1)); /* not to rank 1 */
    assert_false(dispatch_core_granted(d, 1, 1, 0)); /* rank 0 has not unit 1 */
    assert_false(dispatch_core_granted(d, 2, 0, 0)); /* a step not granted yet */
    assert_false(dispatch_core_granted(d, 1, 0, 7)); /* no such rank */
    assert_false(dispatch_core_granted(d, 1000000, 0, 0));
    expect_unit_at(d, &b, t, 1, 1, 0);
    assert_true(dispatch_core_granted(d, 1, 1, 1));
    /* a delivers, then the trainers drop its batch: unit 0 goes out again, to a (its own rank) */
    expect_wait_at(d, &a, t + 1, "step 2", NULL);
    dispatch_core_regrant(d, 1, 0, "test: dropped");
    assert_int_equal(cstats(d).redone, 1);
    expect_unit_at(d, &a, t + 2, 1, 0, 0);
    assert_true(dispatch_core_granted(d, 1, 0, 0));
    /* a step trained: its grants are forgotten, the next step's kept */
    expect_wait_at(d, &a, t + 3, "step 2", NULL);
    expect_wait_at(d, &b, t + 3, "step 2", NULL);
    publish(d, 1, w1);
    assert_false(dispatch_core_granted(d, 1, 0, 0));
    expect_unit_at(d, &a, t + 4, 2, 0, 1);
    assert_true(dispatch_core_granted(d, 2, 0, 0));
    dispatch_core_regrant(d, 9, 0, "test: out of the window"); /* no such step: nothing happens */
    assert_int_equal(cstats(d).redone, 1);
    dispatch_core_free(d);
    free(w0);
    free(w1);
}

static void test_lost_answer(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0), *w1 = weights(N, 1, 1);
    const struct proc a = {0xA, 0}, b = {0xB, 1};
    double t = 0;
    struct dispatch_core *d = core_open(2, 0, 3, N, 10.0, t);
    publish(d, 0, w0);
    struct work_grant g;
    grant_heard(d, &a, false, t, &g, true); /* granted, never heard */
    assert_int_equal(g.kind, WORK_UNIT);
    assert_int_equal(g.step, 1);
    assert_int_equal(g.unit, 0);
    t = 5.5; /* the ask timed out: a asks again, and again loses the answer */
    grant_heard(d, &a, false, t, &g, true);
    assert_int_equal(g.kind, WORK_UNIT);
    assert_int_equal(g.step, 1);
    assert_int_equal(g.unit, 0);
    t = 11;
    expect_unit_at(d, &a, t, 1, 0, 0); /* heard at last */
    expect_unit_at(d, &b, t, 1, 1, 0);
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.granted, 2); /* the same grant three times counts once */
    assert_int_equal(st.regranted, 0);
    assert_int_equal(st.delivered, 0); /* granted, not yet said delivered */
    /* a delivered its unit and asks: step 2 waits for the trainers, and nothing of step 1 is a's again */
    expect_wait_at(d, &a, t, "step 2", "version 1");
    assert_int_equal(cstats(d).delivered, 1); /* a's ask named its unit; b has not asked again */
    expect_wait_at(d, &a, t, "step 2", "version 1");
    assert_int_equal(cstats(d).delivered, 1); /* the same unit named again counts once */
    publish(d, 1, w1);
    expect_unit_at(d, &a, t, 2, 0, 1);
    expect_unit_at(d, &b, t, 2, 1, 1);
    expect_wait_at(d, &a, t, "step 3", NULL);
    dispatch_core_free(d);

    /* one-step-off: a holds step 1's unit (delivered) and loses the answer that granted step 2's */
    t = 0;
    d = core_open(2, 1, 3, N, 10.0, t);
    publish(d, 0, w0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    grant_heard(d, &a, false, t, &g, true);
    assert_int_equal(g.step, 2);
    assert_int_equal(g.unit, 0);
    expect_unit_at(d, &a, t, 2, 0, 0); /* again step 2's, not step 1's (delivered) nor a wait */
    expect_wait_at(d, &a, t, "step 3", NULL);
    expect_unit_at(d, &b, t, 1, 1, 0);
    expect_unit_at(d, &b, t, 2, 1, 0);
    assert_int_equal(cstats(d).granted, 4);
    dispatch_core_free(d);

    /* a process of protocol 1.6 names no unit: its asks are answered as they were (the next unit or a wait,
     * never the one it holds again, which it would generate over and over) */
    const struct proc old = {0x01D, 0};
    d = core_open(2, 0, 3, N, 10.0, t);
    heard_of(old.id)->old = true;
    publish(d, 0, w0);
    expect_unit_at(d, &old, t, 1, 0, 0);
    expect_wait_at(d, &old, t, "step 2", NULL);
    dispatch_core_free(d);
    free(w0), free(w1);
}

/* A grant's lease: a unit its live holder has not delivered past the lease is granted to a process with nothing
 * else to do (counted as expired), never before, and never a delivered one. The lease is the floor until units
 * take longer: then DISPATCH_LEASE_FACTOR times the longest. */
static void test_lease_expiry(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0), *w1 = weights(N, 1, 1);
    const struct proc a = {0xA, 0}, b = {0xB, 1};
    const double floor = DISPATCH_LEASE_FLOOR_S;
    double t = 0; /* lost_after_s far away: both stay alive throughout */
    struct dispatch_core *d = core_open(2, 0, 3, N, 1e9, t);
    publish(d, 0, w0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    expect_unit_at(d, &b, t, 1, 1, 0);
    t = 5; /* b delivers in 5 s: the lease stays the floor (4 x 5 s is less) */
    expect_wait_at(d, &b, t, "step 2", NULL);
    t = floor; /* a's lease is not over */
    dispatch_core_tick(d, t);
    expect_wait_at(d, &b, t, "step 2", NULL);
    assert_int_equal(cstats(d).expired, 0);
    t = floor + 0.5; /* it is: b, idle, gets a's unit too */
    dispatch_core_tick(d, t);
    expect_unit_at(d, &b, t, 1, 0, 0);
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.expired, 1);
    assert_int_equal(st.regranted, 1);
    assert_int_equal(st.granted, 3);
    assert_int_equal(st.lost, 0);
    /* a delivers late: its word about a unit it no longer holds changes nothing; a waits, b's lease stands */
    t = floor + 1;
    expect_wait_at(d, &a, t, "step 2", NULL);
    assert_int_equal(cstats(d).granted, 3);
    /* b delivers it too; every unit of step 1 is delivered, and none goes again however long the trainers take */
    t = floor + 2;
    expect_wait_at(d, &b, t, "step 2", NULL);
    t = 100 * floor;
    expect_wait_at(d, &a, t, "step 2", NULL);
    expect_wait_at(d, &b, t, "step 2", NULL);
    assert_int_equal(cstats(d).granted, 3);
    dispatch_core_free(d);

    /* units that take long make the lease longer: a delivers step 1 in 2 floors, so b's lease lasts 8 floors */
    t = 0;
    d = core_open(2, 0, 3, N, 1e9, t);
    publish(d, 0, w0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    expect_unit_at(d, &b, t, 1, 1, 0);
    t = 2 * floor;
    expect_wait_at(d, &a, t, "step 2", NULL);
    t = DISPATCH_LEASE_FACTOR * 2 * floor;
    expect_wait_at(d, &a, t, "step 2", NULL);
    t += 1;
    expect_unit_at(d, &a, t, 1, 1, 0);
    assert_int_equal(cstats(d).expired, 1);
    /* the next step: each gets its own unit first (an expired lease goes only to a process with nothing else) */
    publish(d, 1, w1);
    expect_unit_at(d, &b, t, 2, 1, 1);
    expect_unit_at(d, &a, t, 2, 0, 1);
    dispatch_core_free(d);
    free(w0), free(w1);
}

/* The options' lease_floor_s (a test's setting: GRPO_TEST_LEASE_FLOOR_S) replaces DISPATCH_LEASE_FLOOR_S: a unit
 * held past 2 s goes to an idle process, not before. */
static void test_lease_floor_option(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);
    const struct proc a = {0xA, 0}, b = {0xB, 1};
    double t = 0;
    struct dispatch_core *d = core_open_floor(2, 0, 3, N, 1e9, t, 2.0);
    publish(d, 0, w0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    expect_unit_at(d, &b, t, 1, 1, 0);
    t = 0.1; /* b delivers at once: 4 x 0.1 s is under the floor */
    expect_wait_at(d, &b, t, "step 2", NULL);
    t = 2.0;
    dispatch_core_tick(d, t);
    expect_wait_at(d, &b, t, "step 2", NULL);
    assert_int_equal(cstats(d).expired, 0);
    t = 2.5;
    dispatch_core_tick(d, t);
    expect_unit_at(d, &b, t, 1, 0, 0);
    assert_int_equal(cstats(d).expired, 1);
    dispatch_core_free(d);
    free(w0);
}

/* Late and repeated words are harmless: an ask that arrives twice (the second a late copy naming the unit before)
 * gets the unit it holds, a ping grants nothing, and a word about a unit of a step already trained, of a unit
 * out of range or never granted to the asker changes no lease. */
static void test_late_answers(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0), *w1 = weights(N, 1, 1);
    const struct proc a = {0xA, 0}, b = {0xB, 1};
    double t = 0;
    struct dispatch_core *d = core_open(2, 0, 3, N, 1e9, t);
    publish(d, 0, w0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    expect_unit_at(d, &b, t, 1, 1, 0);
    expect_wait_at(d, &a, t, "step 2", NULL);
    expect_wait_at(d, &b, t, "step 2", NULL);
    publish(d, 1, w1);
    expect_unit_at(d, &a, t, 2, 0, 1);
    /* a late copy of a's ask of step 1 (it names step 1's unit, delivered): a holds step 2's unit, gets it again */
    struct heard *h = heard_of(a.id);
    h->step = 1;
    h->unit = 0;
    expect_unit_at(d, &a, t, 2, 0, 1);
    /* words about units a does not hold: step 1 (trained), unit 1 of step 2 (b's, not yet granted), a unit out
     * of range; none marks anything delivered, and b still gets its unit */
    const int64_t steps[] = {1, 2, 2, 2, 99};
    const int units[] = {0, 1, -1, 7, 0};
    for (int i = 0; i < 5; i++) {
        h->step = steps[i];
        h->unit = units[i];
        expect_unit_at(d, &a, t, 2, 0, 1);
    }
    grant_of(d, &a, true, t, &(struct work_grant){0});
    expect_unit_at(d, &b, t, 2, 1, 1);
    assert_int_equal(cstats(d).granted, 4);
    assert_int_equal(cstats(d).regranted, 0);
    /* a's unit is still a's: b (idle) does not get it before the lease */
    expect_wait_at(d, &b, t, "step 3", NULL);
    dispatch_core_free(d);
    free(w0), free(w1);
}

static void test_broadcast_rounds(void **state)
{
    (void)state;
    enum { N = 16 };
    float *w[6];
    for (int i = 0; i < 6; i++)
        w[i] = weights(N, 1, (float)i);
    const struct proc a = {1, 0}, b = {2, 1};
    double t = 0;
    /* one step off: the two newest versions are held, and versions 0..4 are needed by steps 2..6 */
    struct dispatch_core *d = core_open(2, 1, 6, N, 0.5, t);
    int64_t v = -1;
    const float *src = NULL;

    /* asks come from processes the dispatcher knows (they asked for work first) */
    struct work_grant g;
    grant_of(d, &a, true, t, &g);
    grant_of(d, &b, true, t, &g);
    /* without broadcast_on every ask is told to fetch */
    publish(d, 0, w[0]);
    assert_int_equal(bcast(d, &a, 0, t), WB_FETCH);
    dispatch_core_broadcast_on(d, 0.4);
    assert_true(dispatch_core_round_due(d, 0));

    /* version 0: a asks, then b; the round begins only then, and the askers are told to join */
    assert_false(dispatch_core_round_begin(d, &v, &src));
    assert_int_equal(bcast(d, &a, 0, t), WB_WAIT);
    assert_false(dispatch_core_round_begin(d, &v, &src));
    assert_int_equal(bcast(d, &b, 0, t), WB_WAIT);
    assert_true(dispatch_core_round_begin(d, &v, &src));
    assert_int_equal(v, 0);
    assert_memory_equal(src, w[0], N * sizeof(float));
    assert_false(dispatch_core_round_begin(d, &v, &src)); /* one round at a time */
    assert_int_equal(bcast(d, &a, 0, t), WB_JOIN);
    assert_int_equal(bcast(d, &b, 0, t), WB_JOIN);
    expect_weights_at(d, &a, t, 0, w[0], N, 16); /* a fetch still works meanwhile */
    dispatch_core_round_end(d, true);
    assert_int_equal(cstats(d).broadcasts, 1);
    assert_false(dispatch_core_round_due(d, 0));
    assert_int_equal(bcast(d, &a, 0, t), WB_FETCH); /* its round is over */

    /* version 1: only a asks; at the rendezvous it still waits, past it it is fetched, by b too */
    publish(d, 1, w[1]);
    assert_true(dispatch_core_round_due(d, 0));
    assert_int_equal(bcast(d, &a, 1, t), WB_WAIT);
    t = 0.4;
    assert_int_equal(bcast(d, &a, 1, t), WB_WAIT);
    t = 0.45;
    assert_false(dispatch_core_round_begin(d, &v, &src));
    assert_int_equal(bcast(d, &a, 1, t), WB_FETCH);
    assert_int_equal(bcast(d, &b, 1, t), WB_FETCH);
    assert_false(dispatch_core_round_due(d, 0));

    /* version 2: asked for apart (a version 2, b an older one) is no round; the trainer waits past the
     * rendezvous, and it is fetched */
    publish(d, 2, w[2]);
    assert_int_equal(bcast(d, &a, 2, t), WB_WAIT);
    assert_int_equal(bcast(d, &b, 1, t), WB_FETCH); /* skipped already */
    assert_false(dispatch_core_round_begin(d, &v, &src));
    assert_true(dispatch_core_round_due(d, 0.1));
    assert_false(dispatch_core_round_due(d, 1.0));
    assert_int_equal(bcast(d, &a, 2, t), WB_FETCH);

    /* version 3: a failed round turns the broadcast off */
    publish(d, 3, w[3]);
    assert_int_equal(bcast(d, &b, 3, t), WB_WAIT);
    assert_int_equal(bcast(d, &a, 3, t), WB_WAIT);
    assert_true(dispatch_core_round_begin(d, &v, &src));
    assert_int_equal(v, 3);
    dispatch_core_round_end(d, false);
    assert_int_equal(cstats(d).broadcasts, 1);
    publish(d, 4, w[4]);
    assert_false(dispatch_core_round_due(d, 0));
    assert_int_equal(bcast(d, &a, 4, t), WB_FETCH);
    assert_int_equal(bcast(d, &b, 4, t), WB_FETCH);
    expect_weights_at(d, &b, t, 4, w[4], N, 16);
    dispatch_core_free(d);

    /* a lost process pauses it: no round is due or begins, each version is fetched at once (no wait for the
     * rendezvous); the process is back (it was only slow), and so are the rounds; a process that takes over the
     * rank (not in the broadcast's group) turns it off for good */
    t = 0;
    d = core_open(2, 0, 8, N, 0.3, t);
    dispatch_core_broadcast_on(d, 30);
    grant_of(d, &a, true, t, &g);
    grant_of(d, &b, true, t, &g);
    publish(d, 0, w[0]);
    assert_int_equal(bcast(d, &a, 0, t), WB_WAIT);
    t = 0.2;
    grant_of(d, &a, true, t, &g); /* a pings, b does not */
    t = 0.35;
    dispatch_core_tick(d, t);
    assert_int_equal(cstats(d).live, 1);
    assert_int_equal(bcast(d, &a, 0, t), WB_FETCH);
    assert_false(dispatch_core_round_begin(d, &v, &src));
    assert_false(dispatch_core_round_due(d, 0));
    publish(d, 1, w[1]);
    assert_false(dispatch_core_round_due(d, 0)); /* b is silent: version 1 is not broadcast either */
    assert_int_equal(bcast(d, &a, 1, t), WB_FETCH);
    t = 0.4;
    grant_of(d, &b, true, t, &g); /* b is back */
    assert_int_equal(cstats(d).live, 2);
    assert_int_equal(bcast(d, &b, 1, t), WB_FETCH); /* version 1 was fetched by a: b fetches it too */
    publish(d, 2, w[2]);
    assert_true(dispatch_core_round_due(d, 0));
    assert_int_equal(bcast(d, &a, 2, t), WB_WAIT);
    assert_int_equal(bcast(d, &b, 2, t), WB_WAIT);
    assert_true(dispatch_core_round_begin(d, &v, &src));
    assert_int_equal(v, 2);
    dispatch_core_round_end(d, true);
    assert_int_equal(cstats(d).broadcasts, 1);
    const struct proc b2 = {(1ull << PLANE_GENERATION_SHIFT) | 0xB2, 1}; /* b's replacement: generation 1 */
    grant_of(d, &b2, true, t, &g);
    publish(d, 3, w[3]);
    assert_false(dispatch_core_round_due(d, 0));
    assert_int_equal(bcast(d, &a, 3, t), WB_FETCH);
    assert_int_equal(bcast(d, &b2, 3, t), WB_FETCH);
    dispatch_core_free(d);
    d = core_open(1, 1, 3, N, 5, 0);
    dispatch_core_broadcast_on(d, 30);
    publish(d, 1, w[1]);
    assert_true(dispatch_core_round_due(d, 0)); /* step 3 is generated with version 1 (one step off) */
    publish(d, 2, w[2]);
    assert_false(dispatch_core_round_due(d, 0)); /* no step 4 */
    dispatch_core_free(d);
    for (int i = 0; i < 6; i++)
        free(w[i]);
}

/* An async core (fully-async training): 2 units a chunk of 4 groups (2 a unit), verl's bound max_groups. */
static struct dispatch_core *async_open(int64_t max_groups, int64_t stream_next, int64_t outstanding,
                                        const struct dispatch_replay *rp, int n_rp, double now)
{
    const struct dispatch_options o = {.units = 2,
                                       .groups_in_step = 4,
                                       .total_steps = 100,
                                       .n_floats = 4,
                                       .lost_after_s = 2,
                                       .run_key = run_key,
                                       .epoch = EPOCH,
                                       .first_rollout_rank = FIRST_ROLLOUT,
                                       .rollout_tp = 1,
                                       .async = true,
                                       .stream_next = stream_next,
                                       .unit_groups = 2,
                                       .max_groups = max_groups,
                                       .outstanding = outstanding,
                                       .replay = rp,
                                       .n_replay = n_rp};
    char err[512] = "";
    n_heard = 0;
    struct dispatch_core *d = dispatch_core_create(&o, now, err, sizeof err);
    if (!d)
        fail_msg("dispatch_core_create: %s", err);
    return d;
}

/* Fully-async: units in stream order to whoever asks, each with the newest version; verl's bound (groups granted
 * since the push, counted from what is outstanding at it) holds new grants; a dropped unit makes room for one
 * more; a push starts the count again; a lost holder's unit goes first, with the newest version; only its
 * grantees' copies count; the hold (a checkpoint's drain) grants nothing new; every answer says the newest
 * version. */
static void test_async_stream(void **state)
{
    (void)state;
    const float w[4] = {1, 2, 3, 4};
    struct dispatch_core *d = async_open(6, 0, 0, NULL, 0, 0); /* 6 groups: 3 units */
    const struct proc a = {101, 0}, b = {202, 1};
    expect_wait_at(d, &a, 0, "not published", NULL);
    publish(d, 0, w);
    expect_unit_at(d, &a, 1, 1, 0, 0); /* chunk 1 unit 0 */
    expect_unit_at(d, &a, 1, 1, 1, 0); /* a asks again (delivered): the stream's next, whoever asks */
    expect_unit_at(d, &b, 1, 2, 0, 0);
    assert_int_equal(dispatch_core_async_window(d), 6);
    expect_wait_at(d, &a, 1, "6 prompts granted since policy version 0's push, at most 6", NULL);
    assert_true(dispatch_core_async_granted(d, 2, 0, 1));
    assert_false(dispatch_core_async_granted(d, 2, 0, 0));
    assert_true(dispatch_core_async_granted(d, 1, 1, 0)); /* delivered, not yet at the trainer */
    assert_int_equal(dispatch_core_async_in_flight(d), 3);
    dispatch_core_async_received(d, 1, 0);
    dispatch_core_async_received(d, 1, 1);
    assert_false(dispatch_core_async_granted(d, 1, 1, 0)); /* the trainer has it: a late copy is not kept */
    assert_int_equal(dispatch_core_async_in_flight(d), 1);
    /* the trainer drops a unit for staleness: one more may go */
    dispatch_core_async_taken(d, 2, true);
    expect_unit_at(d, &a, 2, 2, 1, 0);
    expect_wait_at(d, &a, 2, "at most 6", NULL);
    /* two units taken, then the push: the count starts from what is outstanding (8 granted, 6 taken or dropped) */
    dispatch_core_async_taken(d, 2, false);
    dispatch_core_async_taken(d, 2, false);
    publish(d, 4, w);
    assert_int_equal(dispatch_core_async_window(d), 2);
    expect_unit_at(d, &a, 3, 3, 0, 4); /* the newest version */
    struct work_grant g;
    grant_of(d, &b, true, 3, &g); /* a ping says the newest version too */
    assert_int_equal(g.kind, WORK_WAIT);
    assert_int_equal(g.latest_version, 4);
    /* b (holding chunk 2 unit 0, then its ping) falls silent: its unit goes first, with the newest version */
    grant_of(d, &a, true, 5, &g); /* a lives */
    dispatch_core_async_received(d, 2, 1);
    dispatch_core_tick(d, 6);
    assert_int_equal(dispatch_core_async_in_flight(d), 2); /* a's 3/0 and the lost one's 2/0 */
    expect_unit_at(d, &a, 6, 2, 0, 4);
    dispatch_core_async_received(d, 3, 0);
    assert_true(dispatch_core_async_granted(d, 2, 0, 0) && dispatch_core_async_granted(d, 2, 0, 1));
    /* the hold: nothing new, until it is lifted */
    dispatch_core_async_hold(d, true);
    expect_wait_at(d, &a, 6, "drain the stream", NULL);
    assert_int_equal(dispatch_core_async_in_flight(d), 1); /* delivered (its holder asked again), not yet read */
    dispatch_core_async_received(d, 2, 0);
    assert_int_equal(dispatch_core_async_in_flight(d), 0);
    dispatch_core_async_hold(d, false);
    expect_unit_at(d, &a, 6, 3, 1, 4);
    assert_int_equal(dispatch_core_async_next(d), 6);
    dispatch_core_end(d, 9, "done");
    grant_of(d, &a, false, 7, &g);
    assert_int_equal(g.kind, WORK_END);
    dispatch_core_free(d);
    /* a resumed stream: from unit 5 (chunk 3 unit 1), 4 groups outstanding in the checkpoint */
    d = async_open(6, 5, 4, NULL, 0, 0);
    publish(d, 8, w);
    assert_int_equal(dispatch_core_async_window(d), 4);
    expect_unit_at(d, &a, 1, 3, 1, 8);
    expect_wait_at(d, &b, 1, "at most 6", NULL);
    dispatch_core_free(d);
}

/* A replayed schedule: its units in its order, each with its recorded versions and switches, once its first version
 * is published; nothing past it. */
static void test_async_replay(void **state)
{
    (void)state;
    const float w[4] = {1, 2, 3, 4};
    const int64_t v0[1] = {0}, v1[2] = {0, 2};
    const int32_t t0[4] = {5, 5, 5, 5}, t1[8] = {3, 3, 0, 0, 6, 6, 5, 5};
    const struct dispatch_replay rp[3] = {
        {.chunk = 1, .unit = 1, .n_phases = 1, .n_seq = 4, .versions = v0, .tokens = t0},
        {.chunk = 1, .unit = 0, .n_phases = 2, .n_seq = 4, .versions = v1, .tokens = t1},
        {.chunk = 2, .unit = 0, .n_phases = 1, .n_seq = 4, .versions = v1 + 1, .tokens = t0}};
    struct dispatch_core *d = async_open(2, 0, 0, rp, 3, 0); /* the bound is the schedule's */
    const struct proc a = {101, 0};
    publish(d, 0, w);
    struct work_grant g;
    grant_of(d, &a, false, 1, &g);
    assert_true(g.kind == WORK_UNIT && g.step == 1 && g.unit == 1 && g.version == 0 && g.n_phases == 1);
    work_grant_release(&g);
    grant_of(d, &a, false, 1, &g);
    assert_true(g.kind == WORK_UNIT && g.step == 1 && g.unit == 0 && g.n_phases == 2 && g.n_replay_tokens == 8);
    assert_int_equal(g.replay_versions[1], 2);
    assert_memory_equal(g.replay_tokens, t1, sizeof t1);
    work_grant_release(&g);
    expect_wait_at(d, &a, 1, "replayed chunk 2 unit 0 waits for policy version 2", NULL);
    publish(d, 2, w);
    expect_unit_at(d, &a, 2, 2, 0, 2);
    expect_wait_at(d, &a, 2, "every unit of the replayed schedule is granted", NULL);
    dispatch_core_free(d);
}

static void test_end(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);
    const double t = 1;
    struct dispatch_core *d = core_open(2, 0, 10, N, 10.0, t);
    const struct proc a = {1, 0}, b = {2, 1};
    publish(d, 0, w0);
    expect_unit_at(d, &a, t, 1, 0, 0);
    struct work_grant g;
    grant_of(d, &b, true, t, &g); /* b only pings */
    assert_int_equal(g.kind, WORK_WAIT);
    assert_string_equal(g.reason, "alive");
    assert_true(dispatch_core_all_heard(d)); /* nothing to hear yet */

    dispatch_core_end(d, 2, "stopped after step 2");
    assert_false(dispatch_core_all_heard(d));
    grant_of(d, &a, false, t, &g);
    assert_int_equal(g.kind, WORK_END);
    assert_int_equal(g.step, 2);
    assert_string_equal(g.reason, "stopped after step 2");
    /* the first word stands */
    dispatch_core_end(d, 5, "finished");
    grant_of(d, &a, false, t, &g);
    assert_int_equal(g.kind, WORK_END);
    assert_int_equal(g.step, 2);
    assert_string_equal(g.reason, "stopped after step 2");
    /* a was sent the end, but sent is not heard (the answer can be lost as the socket closes): until a says so,
     * close waits for it */
    assert_false(dispatch_core_all_heard(d));
    say_heard(d, &a, t);
    assert_false(dispatch_core_all_heard(d)); /* b has not heard it */
    /* b's ping is answered with the end, its step and the run's last step, as a work request's is */
    grant_of(d, &b, true, t, &g);
    assert_int_equal(g.kind, WORK_END);
    assert_int_equal(g.step, 2);
    assert_int_equal(g.total_steps, 10);
    assert_string_equal(g.reason, "stopped after step 2");
    assert_false(dispatch_core_all_heard(d));
    say_heard(d, &b, t);
    assert_true(dispatch_core_all_heard(d));
    dispatch_core_free(d);

    /* a live process that has not heard the end holds it; once lost, it does not */
    d = core_open(1, 0, 10, N, 1.0, 0);
    const struct proc slow = {9, 0};
    expect_wait_at(d, &slow, 0, "first weights", NULL);
    dispatch_core_end(d, 0, "stopped before step 1");
    dispatch_core_tick(d, 0.9);
    assert_false(dispatch_core_all_heard(d));
    dispatch_core_tick(d, 1.1);
    assert_true(dispatch_core_all_heard(d));
    dispatch_core_free(d);
    free(w0);
}

/* One worker id per process (issue 39: one rollout key filled the dispatcher's process table with 254 phantom ids,
 * and a real process was then refused): the same authenticated process asking under other ids is refused each
 * time, naming it, the table stays as it was, and the other rank's real process still gets in. A request over
 * the dispatcher's size bound is refused by its size, before any decoding. */
static void test_one_id_per_process(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);
    const double t = 0;
    struct dispatch_core *d = core_open(2, 0, 10, N, 10.0, t);
    publish(d, 0, w0);
    const struct proc p0 = {600, 0}, p1 = {601, 1};
    struct work_grant g;
    grant_of(d, &p0, true, t, &g);
    for (int k = 0; k < 300; k++) { /* p0's own key, phantom ids */
        Grpo__Envelope req = GRPO__ENVELOPE__INIT;
        Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
        w.worker_id = 100000 + (uint64_t)k;
        w.rank = 0;
        w.ping = true;
        req.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
        req.work_request = &w;
        expect_refusal(core_call(d, &req, &p0, t), "a process has one worker id");
    }
    assert_int_equal(cstats(d).live, 1);
    grant_of(d, &p1, true, t, &g); /* the other rank's real process */
    assert_int_equal(cstats(d).live, 2);
    grant_of(d, &p0, true, t, &g); /* and p0 under its own id, as before */
    /* too big to be a dispatcher request: refused by its size */
    const size_t big = (size_t)GRPO_MAX_DISPATCH_REQUEST_BYTES + 1;
    uint8_t *junk = calloc(1, big);
    size_t len = 0;
    uint8_t *out = dispatch_core_handle(d, junk, big, t, &len);
    char why[256] = "";
    Grpo__Envelope *r = protocol_unpack(out, len, why, sizeof why);
    free(out);
    free(junk);
    expect_refusal(r, "the dispatcher takes at most 65536");
    dispatch_core_free(d);
    free(w0);
}

static Grpo__Envelope *signed_call(struct dispatch_core *d, Grpo__Envelope *env, struct plane_cred *c, int n,
                                   double now);

/* A process of rollout rank `rank` (a TEST_UNITS_MAX rank) of generation gen, pid pid: its credentials. */
static struct plane_cred gen_cred(int rank, unsigned gen, uint32_t pid)
{
    struct plane_cred c;
    plane_cred_issue(&c, run_key,
                     &(struct plane_id){.rank = FIRST_ROLLOUT + rank,
                                        .pid = pid,
                                        .incarnation = plane_incarnation_of(gen, 0x1000 + pid),
                                        .epoch = EPOCH});
    return c;
}

/* A work request (ping or ask) of worker id `id` for rollout rank `rank`, authenticated with c; the answer. */
static Grpo__Envelope *cred_work(struct dispatch_core *d, struct plane_cred *c, uint64_t id, int rank, bool ping,
                                 double now)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = id, w.rank = rank, w.ping = ping;
    req.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    req.work_request = &w;
    return signed_call(d, &req, c, 1, now);
}

static void expect_grant_kind(Grpo__Envelope *r, int kind)
{
    assert_non_null(r);
    if (r->body_case != GRPO__ENVELOPE__BODY_WORK_GRANT)
        fail_msg("expected a grant, got body %d (%s)", (int)r->body_case,
                 r->body_case == GRPO__ENVELOPE__BODY_REPLY ? r->reply->error : "");
    assert_int_equal(r->work_grant->kind, kind);
    protocol_free(r);
}

/* The fixture of the rank table's tests (test_replacement, test_table_bound): a dispatcher of 2 rollout ranks, opened
 * at time 0 with version 0 of RANK_FLOATS floats published, whose silent processes are lost after the seconds the test
 * gives as its initial state (a double). */
enum { RANK_FLOATS = 8 };
struct rank_fx {
    struct dispatch_core *d;
    float *w0;
};

static int rank_setup(void **state)
{
    const double lost_after_s = *(const double *)*state;
    struct rank_fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    f->w0 = weights(RANK_FLOATS, 1, 0);
    f->d = core_open(2, 0, 10, RANK_FLOATS, lost_after_s, 0);
    publish(f->d, 0, f->w0);
    *state = f;
    return 0;
}

static int rank_teardown(void **state)
{
    struct rank_fx *f = *state;
    dispatch_core_free(f->d);
    free(f->w0);
    free(f);
    return 0;
}

/* the fixture's lost_after_s of each */
static double replacement_lost_after_s = 1.0, table_bound_lost_after_s = 10.0;

/* issue 39 item 4: one live process per rollout rank. A newer incarnation (a later generation: what grpod gives a
 * replacement) supersedes the live one: the older one's units are granted again (to the newer one first), the
 * broadcast it was part of is off, and every later request of the older one (work, ping, weights, under any worker
 * id) is refused as superseded and counted. A process of an older generation than the rank's is superseded too,
 * even once the rank's process is lost; a second process of the live one's generation is refused (it may take the
 * rank once that one is lost). Generations compare modulo 2^16. */
static void test_replacement(void **state)
{
    struct dispatch_core *d = ((struct rank_fx *)*state)->d;
    double t = 0;
    dispatch_core_broadcast_on(d, 60);
    const struct proc a = {0xA, 0}, b = {0xB, 1}; /* generation 0 (cred_of: the incarnation is the id) */
    const struct proc a1 = {(1ull << PLANE_GENERATION_SHIFT) | 0xA1, 0}; /* a's replacement: generation 1 */
    expect_unit_at(d, &a, t, 1, 0, 0);
    expect_unit_at(d, &b, t, 1, 1, 0);
    assert_int_equal(cstats(d).live, 2);

    /* a1 arrives while a lives: it supersedes a, and gets the unit a held (its own rank's) */
    t = 0.5;
    struct work_grant g;
    grant_of(d, &a1, true, t, &g);
    assert_int_equal(g.kind, WORK_WAIT);
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.live, 2);
    assert_int_equal(st.replaced, 1);
    assert_int_equal(st.lost, 0);
    expect_unit_at(d, &a1, t, 1, 0, 0);
    assert_int_equal(bcast(d, &a1, 0, t), WB_FETCH); /* a was in the broadcast group: it is off */
    /* a asks on: refused as superseded, whatever it asks and under whatever id */
    expect_refusal(work_call(d, &a, true, t), "superseded: rollout rank 0 is served by a newer process");
    expect_refusal(work_call(d, &a, false, t), "superseded");
    struct plane_cred ca = cred_of(&a);
    expect_refusal(cred_work(d, &ca, 0xDEAD, 0, true, t), "superseded");
    heard_of(a.id)->counter = ca.counter;
    Grpo__Envelope wreq = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
    q.worker_id = a.id, q.version = 0, q.count = RANK_FLOATS;
    wreq.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    wreq.weights_request = &q;
    expect_refusal(core_call(d, &wreq, &a, t), "superseded");
    st = cstats(d);
    assert_int_equal(st.superseded, 4);
    assert_int_equal(st.live, 2);
    assert_int_equal(st.bytes, 0);

    /* another process of a1's generation: refused while a1 lives */
    struct plane_cred twin = gen_cred(0, 1, 4242);
    expect_refusal(cred_work(d, &twin, 0x7777, 0, true, t), "a second process of its generation is refused");
    assert_int_equal(cstats(d).second, 1);
    /* an older generation than the rank's: superseded, also once a1 is lost */
    struct plane_cred old = gen_cred(0, 0, 4343);
    expect_refusal(cred_work(d, &old, 0x7878, 0, true, t), "superseded: rollout rank 0 is served by a process of a "
                                                           "later generation");
    grant_of(d, &b, true, 2.0, &g); /* b lives on; a1 falls silent */
    dispatch_core_tick(d, 2.0);
    assert_int_equal(cstats(d).lost, 1);
    expect_refusal(cred_work(d, &old, 0x7878, 0, true, 2.0), "later generation");
    /* the twin may take the rank now that a1 is lost (a1, back, is then superseded) */
    expect_grant_kind(cred_work(d, &twin, 0x7777, 0, true, 2.0), WORK_WAIT);
    expect_refusal(work_call(d, &a1, true, 2.0), "superseded");
    assert_int_equal(cstats(d).live, 2);

    /* generations compare modulo 2^16 */
    assert_true(plane_generation_later(1, 0));
    assert_false(plane_generation_later(0, 0));
    assert_true(plane_generation_later(0, 0xffff));
    assert_false(plane_generation_later(0xffff, 0));
    assert_int_equal(plane_generation(plane_incarnation_new(7)), 7);
    assert_int_not_equal(plane_incarnation_of(3, 0) & 0xffffffffffffull, 0);
}

/* The table stays bounded whatever one key asks, and a real process is never kept out: 300 processes of rank 0 of
 * one generation (the first serves, every other is refused), then 300 of rising generations (each supersedes the one
 * before): at most one live process per rollout rank at every step, and rank 1's real process, silent meanwhile,
 * gets its place back after the storm. */
static void test_table_bound(void **state)
{
    struct dispatch_core *d = ((struct rank_fx *)*state)->d;
    double t = 0;
    const struct proc b = {0xB, 1};
    expect_unit_at(d, &b, t, 1, 1, 0);
    for (int k = 0; k < 300; k++) {
        struct plane_cred c = gen_cred(0, 0, 5000 + (uint32_t)k);
        Grpo__Envelope *r = cred_work(d, &c, 90000 + (uint64_t)k, 0, true, t);
        if (k == 0)
            expect_grant_kind(r, WORK_WAIT);
        else
            expect_refusal(r, "a second process of its generation");
        assert_true(cstats(d).live <= 2);
    }
    assert_int_equal(cstats(d).second, 299);
    for (int k = 1; k <= 300; k++) {
        struct plane_cred c = gen_cred(0, (unsigned)k, 6000 + (uint32_t)k);
        expect_grant_kind(cred_work(d, &c, 80000 + (uint64_t)k, 0, true, t), WORK_WAIT);
        assert_true(cstats(d).live <= 2);
    }
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.replaced, 300);
    assert_int_equal(st.live, 2);
    /* b (silent 9 s, still within lost_after_s) and then, lost and back, gets in again: never refused */
    t = 9;
    expect_wait_at(d, &b, t, "", NULL);
    dispatch_core_tick(d, 30);
    assert_int_equal(cstats(d).lost, 2);
    struct work_grant g;
    grant_of(d, &b, true, 30, &g);
    assert_int_equal(g.kind, WORK_WAIT);
    assert_int_equal(cstats(d).live, 1);
}

/* Per-process rate limits: a process gets DISPATCH_RATE_BURST requests at once and DISPATCH_RATE_PER_S after; past
 * its budget a request is refused at once with Reply.retry, counted; another process is not held back, and
 * requests refused before their MAC is good (forged in its name, replayed) cost the real process nothing. */
static void test_rate_limit(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);
    double t = 100;
    struct dispatch_core *d = core_open(2, 0, 10, N, 1000.0, t);
    publish(d, 0, w0);
    const struct proc a = {0xA, 0}, b = {0xB, 1};
    /* forged in a's name (the MAC is another key's) and replayed ones first: none is charged to a */
    struct plane_cred forged = cred_of(&b);
    forged.id = cred_of(&a).id;
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = a.id, w.rank = 0, w.ping = true;
    req.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    req.work_request = &w;
    for (int k = 0; k < 2000; k++) {
        forged.counter = 100000 + (uint64_t)k;
        Grpo__Envelope *r = signed_call(d, &req, &forged, 1, t);
        assert_false(r->reply->retry);
        expect_refusal(r, "authentication failed");
    }
    struct work_grant g;
    const int burst = (int)DISPATCH_RATE_BURST;
    for (int k = 0; k < burst; k++)
        grant_of(d, &a, true, t, &g);
    Grpo__Envelope *r = work_call(d, &a, true, t);
    assert_int_equal(r->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_true(r->reply->retry);
    expect_refusal(r, "rate limited: world rank 2");
    expect_refusal(work_call(d, &a, false, t), "rate limited");
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.rate_limited, 2);
    assert_int_equal(st.granted, 0);
    grant_of(d, &b, true, t, &g); /* b has its own budget */
    /* 20 ms later, 10 more */
    t += 10.5 / DISPATCH_RATE_PER_S;
    for (int k = 0; k < 10; k++)
        grant_of(d, &a, true, t, &g);
    expect_refusal(work_call(d, &a, true, t), "rate limited");
    /* a second later the budget is back (bursts of DISPATCH_RATE_BURST) */
    t += 2.0;
    expect_unit_at(d, &a, t, 1, 0, 0);
    assert_int_equal(cstats(d).rate_limited, 3);
    dispatch_core_free(d);
    free(w0);
}

/* Appends a length-delimited unknown field (number 1000) of `pad` bytes to a packed envelope: a request that decodes
 * and is larger than its kind allows. buf must have room. */
static size_t pad_envelope(uint8_t *buf, size_t len, size_t pad)
{
    buf[len++] = 0xC2, buf[len++] = 0x3E; /* field 1000, wire type 2 */
    size_t v = pad;
    do {
        buf[len++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    memset(buf + len, 'x', pad);
    return len + pad;
}

/* Sizes bounded by kind before any MAC (issue 39 item 4: 48 MiB envelopes with a fake MAC were MACed whole): a work
 * or weights request over its kind's bound, with a good MAC or a fake one, is refused by its size and no MAC is
 * computed (the MAC counter does not move); nor for a request of a kind the dispatcher does not take. A fake MAC on
 * a request within the bound costs one MAC of at most that many bytes. */
static void test_size_before_mac(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);
    const double t = 0;
    struct dispatch_core *d = core_open(2, 0, 10, N, 10.0, t);
    publish(d, 0, w0);
    const struct proc a = {0xA, 0};
    expect_unit_at(d, &a, t, 1, 0, 0);
    const int64_t macs0 = cstats(d).macs;
    assert_int_equal(macs0, 1);
    static uint8_t buf[70000];
    struct plane_cred ca = cred_of(&a);
    ca.counter = 500;
    for (int kind = 0; kind < 3; kind++) {
        Grpo__Envelope env = GRPO__ENVELOPE__INIT;
        Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
        Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
        w.worker_id = a.id, w.rank = 0, w.ping = true;
        q.worker_id = a.id, q.count = N;
        if (kind == 0)
            env.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST, env.work_request = &w;
        else if (kind == 1)
            env.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST, env.weights_request = &q;
        else
            env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST, env.status_request = 1;
        size_t len;
        uint8_t *packed = plane_pack_request(&env, &ca, &len);
        memcpy(buf, packed, len);
        free(packed);
        const size_t pads[] = {DISPATCH_MAX_WORK_REQUEST_BYTES, 60000};
        for (int i = 0; i < 2; i++) {
            const size_t n = pad_envelope(buf, len, pads[i]);
            size_t rlen;
            uint8_t *out = dispatch_core_handle(d, buf, n, t, &rlen);
            Grpo__Envelope *r = protocol_unpack(out, rlen, NULL, 0);
            free(out);
            expect_refusal(r, kind < 2 ? "refused by its size, unauthenticated" : "work and weights requests only");
        }
    }
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.macs, macs0); /* not one MAC */
    assert_int_equal(st.oversized, 4);
    /* within the bound, a fake MAC costs one MAC over the request's bytes, no more */
    struct plane_cred forged = cred_of(&(struct proc){0xB, 1});
    forged.id = ca.id;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = a.id, w.rank = 0, w.ping = true;
    env.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST, env.work_request = &w;
    expect_refusal(signed_call(d, &env, &forged, 1, t), "authentication failed");
    st = cstats(d);
    assert_int_equal(st.macs, macs0 + 1);
    assert_true(st.mac_bytes <= 2 * DISPATCH_MAX_WORK_REQUEST_BYTES);
    /* a's own requests go on */
    heard_of(a.id)->counter = 1000;
    struct work_grant g;
    grant_of(d, &a, true, t, &g);
    assert_int_equal(g.kind, WORK_WAIT);
    dispatch_core_free(d);
    free(w0);
}

static void test_bad_input(void **state)
{
    (void)state;
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);
    char err[512] = "";

    /* options that make no dispatcher */
    const struct dispatch_options none = {.units = 0, .n_floats = N, .lost_after_s = 1};
    assert_null(dispatch_core_create(&none, 0, err, sizeof err));
    assert_non_null(strstr(err, "0 units"));
    const struct dispatch_options stale = {.units = 1, .staleness = -1, .n_floats = N, .lost_after_s = 1};
    assert_null(dispatch_core_create(&stale, 0, err, sizeof err));
    assert_non_null(strstr(err, "staleness -1"));

    const double t = 0;
    struct dispatch_core *d = core_open(2, 0, 10, N, 10.0, t);
    publish(d, 0, w0);

    /* a rank the run does not have */
    const struct proc bad = {3, 7}, neg = {4, -1};
    expect_refusal(work_call(d, &bad, false, t), "rollout rank 7: this run has rollout ranks 0..1");
    expect_refusal(work_call(d, &neg, true, t), "rollout ranks 0..1");
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.refused, 2);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.granted, 0);

    /* garbage, an empty message, and a request of another kind */
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    size_t len = 0;
    const size_t cuts[] = {sizeof junk, 0, 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        uint8_t *out = dispatch_core_handle(d, junk, cuts[i], t, &len);
        char why[256];
        Grpo__Envelope *r = protocol_unpack(out, len, why, sizeof why);
        free(out);
        expect_refusal(r, "");
    }
    assert_int_equal(cstats(d).refused, 5);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    expect_refusal(core_call(d, &env, &(struct proc){8, 0}, t), "work and weights requests only");
    assert_int_equal(cstats(d).refused, 6);
    /* issue 27: a work request, a ping and a weights request of major protocol version 2 are refused, naming the
     * version, and add no process and grant nothing */
    for (int kind = 0; kind < 3; kind++) {
        Grpo__Envelope v2 = GRPO__ENVELOPE__INIT;
        Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
        Grpo__WeightsRequest wr = GRPO__WEIGHTS_REQUEST__INIT;
        w.worker_id = 40 + (uint64_t)kind, w.rank = 0, w.ping = kind == 1;
        wr.worker_id = 40, wr.version = 0, wr.count = N;
        if (kind < 2)
            v2.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST, v2.work_request = &w;
        else
            v2.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST, v2.weights_request = &wr;
        v2.version = GRPO_PROTOCOL_VERSION + 1, v2.request_id = 77;
        uint8_t buf[256];
        size_t n = grpo__envelope__pack(&v2, buf); /* not protocol_pack: it would write this program's version */
        uint8_t *out = dispatch_core_handle(d, buf, n, t, &len);
        Grpo__Envelope *r = protocol_unpack(out, len, NULL, 0);
        free(out);
        expect_refusal(r, "incompatible protocol version 2");
    }
    st = cstats(d);
    assert_int_equal(st.refused, 9);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.granted, 0);
    assert_int_equal(st.bytes, 0);
    /* a weights request from a process never seen is served (it fetches before it asks for work) */
    const struct proc stranger = {5, 0};
    expect_weights_at(d, &stranger, t, 0, w0, N, N);

    /* the dispatcher still serves */
    const struct proc c = {6, 0};
    expect_unit_at(d, &c, t, 1, 0, 0);
    dispatch_core_free(d);
    free(w0);
}

/* ---- the shell and the client over ipc sockets ---- */

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

static struct dispatcher *open_dispatcher(const char *ep, int units, int64_t total, size_t n_floats)
{
    const struct dispatch_options o = {.endpoint = ep,
                                       .units = units,
                                       .groups_in_step = 5,
                                       .staleness = 0,
                                       .start = 0,
                                       .total_steps = total,
                                       .start_epoch = 3,
                                       .start_cursor = 17,
                                       .n_floats = n_floats,
                                       .lost_after_s = 60.0,
                                       .run_key = run_key,
                                       .epoch = EPOCH,
                                       .first_rollout_rank = FIRST_ROLLOUT,
                                       .rollout_tp = 1};
    char err[512] = "";
    struct dispatcher *d = dispatcher_open(&o, err, sizeof err);
    if (!d)
        fail_msg("dispatcher_open(%s): %s", ep, err);
    return d;
}

static struct work_client *open_client(const char *ep, int rank, double ping_s)
{
    char err[512] = "";
    static struct plane_cred creds[64]; /* each client's, for its lifetime */
    static int ncreds;
    struct plane_cred *cred = &creds[ncreds++ % 64];
    plane_cred_issue(cred, run_key,
                     &(struct plane_id){.rank = FIRST_ROLLOUT + (rank >= 0 && rank < TEST_UNITS_MAX ? rank : 0),
                                        .pid = (uint32_t)getpid(),
                                        .incarnation = plane_incarnation_new(0),
                                        .epoch = EPOCH});
    struct work_client *c = work_client_open(ep, cred, rank, ping_s, err, sizeof err);
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

/* Grants, chunks, broadcast asks and the end through the real client and the shell's thread. */
static void test_shell_end_to_end(void **state)
{
    const struct fx *f = *state;
    char ep[128], err[512] = "";
    endpoint(f, "d.sock", ep, sizeof ep);
    enum { N = 1000 };
    float *w0 = weights(N, 0.5f, 0), *w1 = weights(N, -0.25f, -1);
    struct dispatcher *d = open_dispatcher(ep, 2, 3, N);
    struct work_client *c0 = open_client(ep, 0, 30), *c1 = open_client(ep, 1, 30);
    struct work_grant g;
    next_ok(c0, &g);
    assert_int_equal(g.kind, WORK_WAIT);
    assert_non_null(strstr(g.reason, "first weights"));

    dispatcher_publish(d, 0, w0);
    next_ok(c0, &g);
    expect_first_grant(&g, N);
    next_ok(c1, &g);
    assert_int_equal(g.kind, WORK_UNIT);
    assert_int_equal(g.unit, 1);

    /* version 0 in 1 KiB chunks: ceil(4000 / 1024) = 4 chunks; in one chunk; in 300-float chunks */
    expect_weights(c1, 0, w0, N, 1024);
    expect_weights(c0, 0, w0, N, 4000);
    expect_weights(c0, 0, w0, N, 3 * 4 * 100);
    /* a version never published, and a model of another size */
    float *w = calloc(N, sizeof *w);
    size_t bytes = 99;
    int chunks = 99;
    expect_error(work_client_weights(c0, 7, w, N, 1024, &bytes, &chunks, err, sizeof err), err, "not held");
    assert_int_equal(chunks, 0);
    assert_int_equal(bytes, 0);
    expect_error(work_client_weights(c0, 0, w, N - 1, 1024, &bytes, &chunks, err, sizeof err), err, "1000 parameters");
    struct dispatch_stats st = stats(d);
    assert_int_equal(st.granted, 2);
    assert_int_equal(st.bytes, 3 * 4000 + 1024); /* the refused count mismatch moved one 1 KiB chunk */
    assert_int_equal(st.refused, 0);
    assert_int_equal(st.live, 2);

    /* a published version stays as it was when published again */
    dispatcher_publish(d, 0, w1);
    expect_weights(c0, 0, w0, N, 1024);
    /* a broadcast ask before broadcast_on: fetch */
    enum work_broadcast a = 0;
    assert_int_equal(work_client_broadcast_ask(c0, 0, &a, err, sizeof err), 0);
    assert_int_equal(a, WB_FETCH);
    expect_error(work_client_broadcast_ask(c0, 5, &a, err, sizeof err), err, "not held");

    /* the end reaches a work request; both have heard it, so close does not linger */
    dispatcher_end(d, 1, "stopped after step 1");
    next_ok(c0, &g);
    assert_int_equal(g.kind, WORK_END);
    assert_string_equal(g.reason, "stopped after step 1");
    next_ok(c1, &g);
    assert_int_equal(g.kind, WORK_END);
    double t0 = clock_now_s();
    dispatcher_close(d, 10.0, 0);
    double took = clock_now_s() - t0;
    if (took >= 2.0)
        fail_msg("dispatcher_close took %.2f s with every live process told the end", took);
    work_client_close(c0);
    work_client_close(c1);

    /* a live process that has not heard the end (its next ping is far off) holds close for linger_s at most */
    char ep2[128];
    endpoint(f, "d2.sock", ep2, sizeof ep2);
    d = open_dispatcher(ep2, 1, 10, N);
    struct work_client *slow = open_client(ep2, 0, 30.0);
    next_ok(slow, &g);
    assert_int_equal(g.kind, WORK_WAIT);
    dispatcher_end(d, 0, "stopped before step 1");
    t0 = clock_now_s();
    dispatcher_close(d, 0.5, 0);
    took = clock_now_s() - t0;
    if (took < 0.45 || took >= 3.0)
        fail_msg("dispatcher_close(0.5) took %.2f s with a live process not told the end", took);
    assert_false(work_client_ended(slow));
    work_client_close(slow);
    free(w), free(w0), free(w1);
}

/* A rollout rank whose process first asks after the run's end (it was still loading while a faster rank did the
 * whole run): close waits for it (up to unseen_s) and it hears the end, instead of finding the dispatcher gone and
 * giving the trainers up a minute later with the job failed. */
struct late {
    const char *ep;
    struct work_grant g;
    int rc;
};
static void *late_rank(void *arg)
{
    struct late *l = arg;
    /* sleep-ok: how late the rank comes is the case tested (close has begun, and has told the early rank) */
    clock_sleep_s(0.5);
    struct work_client *c = open_client(l->ep, 1, 30.0);
    char err[512] = "";
    l->rc = work_client_next(c, &l->g, 5000, err, sizeof err);
    work_client_close(c);
    return NULL;
}
static void test_close_waits_for_late_rank(void **state)
{
    const struct fx *f = *state;
    char ep[128];
    endpoint(f, "late.sock", ep, sizeof ep);
    struct dispatcher *d = open_dispatcher(ep, 2, 1, 16);
    struct work_client *early = open_client(ep, 0, 30.0);
    struct work_grant g;
    next_ok(early, &g);
    dispatcher_end(d, 0, "stopped before step 1");
    next_ok(early, &g);
    assert_int_equal(g.kind, WORK_END);
    /* rank 1 comes only now, after the end */
    struct late l = {.ep = ep, .rc = -2};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, late_rank, &l), 0);
    const double t0 = clock_now_s();
    dispatcher_close(d, 0.1, 30);
    const double took = clock_now_s() - t0;
    pthread_join(t, NULL);
    assert_int_equal(l.rc, 0);
    assert_int_equal(l.g.kind, WORK_END);
    assert_string_equal(l.g.reason, "stopped before step 1");
    if (took >= 10)
        fail_msg("dispatcher_close took %.2f s after the late rank heard the end", took);
    work_client_close(early);
}

/* The end heard in a ping, the answer to a work request never asked (the CI failure of 2026-12-05: a fully-async
 * rollout rank mid-unit heard the end in its ping, the dispatcher closed at once, and the rank's next ask found it
 * gone and gave the trainers up a minute later, failing a finished job). Close now waits until the process says it
 * heard (its next ping), and the process keeps the end as said: its step and the run's last step. */
static void test_end_heard_in_ping(void **state)
{
    const struct fx *f = *state;
    char ep[128], err[512] = "";
    endpoint(f, "ping.sock", ep, sizeof ep);
    struct dispatcher *d = open_dispatcher(ep, 1, 4, 16);
    struct work_client *c = open_client(ep, 0, 0.05);
    struct work_grant g = {0};
    next_ok(c, &g);
    assert_false(work_client_end(c, &g));
    dispatcher_end(d, 3, "finished after step 3");
    const double t0 = clock_now_s();
    dispatcher_close(d, 30.0, 0); /* returns once the ping after the end said it was heard */
    const double took = clock_now_s() - t0;
    if (took >= 10)
        fail_msg("dispatcher_close took %.2f s: the process's pings did not say they heard the end", took);
    assert_true(work_client_ended(c));
    /* the dispatcher is gone; the end stays as heard */
    assert_int_not_equal(work_client_next(c, &g, 300, err, sizeof err), 0);
    assert_true(work_client_end(c, &g));
    assert_int_equal(g.kind, WORK_END);
    assert_int_equal(g.step, 3);
    assert_int_equal(g.total_steps, 4);
    assert_string_equal(g.reason, "finished after step 3");
    work_client_close(c);
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

static void test_shell_bad_input(void **state)
{
    const struct fx *f = *state;
    char ep[128], err[512] = "";
    endpoint(f, "d.sock", ep, sizeof ep);
    enum { N = 8 };
    float *w0 = weights(N, 1, 0);

    /* options that make no dispatcher bind nothing */
    const struct dispatch_options none = {.endpoint = ep, .units = 0, .n_floats = N, .lost_after_s = 1};
    assert_null(dispatcher_open(&none, err, sizeof err));
    assert_non_null(strstr(err, "0 units"));
    assert_int_equal(access(ep + 6, F_OK), -1);

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

    struct dispatcher *d = open_dispatcher(ep, 2, 10, N);
    dispatcher_publish(d, 0, w0);
    /* a rank the run does not have: refused through the client with the reason */
    struct work_grant g;
    struct work_client *bad = open_client(ep, 7, 30);
    expect_error(work_client_next(bad, &g, NEXT_TIMEOUT_MS, err, sizeof err), err, "rollout ranks 0..1");
    work_client_close(bad);
    /* garbage on a raw socket */
    int s = nn_socket(AF_SP, NN_REQ);
    assert_true(s >= 0);
    int to = 5000;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &to, sizeof to);
    assert_true(nn_connect(s, ep) >= 0);
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    Grpo__Envelope *r = raw_call(s, junk, sizeof junk);
    assert_non_null(r);
    assert_int_equal(r->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_false(r->reply->ok);
    protocol_free(r);
    nn_close(s);
    struct dispatch_stats st = stats(d);
    assert_int_equal(st.refused, 2);
    assert_int_equal(st.live, 0);
    assert_int_equal(st.granted, 0);

    /* a good client is served */
    struct work_client *ok = open_client(ep, 0, 30);
    next_ok(ok, &g);
    assert_int_equal(g.kind, WORK_UNIT);
    float w[N];
    size_t bytes;
    int chunks;
    assert_int_equal(work_client_weights(ok, 0, w, N, 1024, &bytes, &chunks, err, sizeof err), 0);
    assert_memory_equal(w, w0, sizeof w);
    work_client_close(ok);
    dispatcher_close(d, 1.0, 0);
    free(w0);
}

/* A flood on the dispatcher's socket (issue 39 item 4): for 1.5 s, eight sockets send requests in a real process's
 * name with a fake MAC (forged under another process's key), padded ones over their kind's bound, and a ninth sends
 * messages over the socket's bound, while the real process pings every 0.1 s and is lost after 0.5 s of silence.
 * The real process is never declared lost and is served after the flood; the padded ones were refused by their
 * size with no MAC computed, the fake ones cost one MAC each of a request's size. */
static void test_shell_flood(void **state)
{
    const struct fx *f = *state;
    char ep[128], err[512] = "";
    endpoint(f, "flood.sock", ep, sizeof ep);
    enum { N = 64, SOCKS = 8 };
    float *w0 = weights(N, 1, 0);
    const struct dispatch_options o = {.endpoint = ep,
                                       .units = 2,
                                       .groups_in_step = 5,
                                       .total_steps = 3,
                                       .n_floats = N,
                                       .lost_after_s = 0.5,
                                       .run_key = run_key,
                                       .epoch = EPOCH,
                                       .first_rollout_rank = FIRST_ROLLOUT,
                                       .rollout_tp = 1};
    struct dispatcher *d = dispatcher_open(&o, err, sizeof err);
    if (!d)
        fail_msg("dispatcher_open: %s", err);
    dispatcher_publish(d, 0, w0);
    struct work_client *c = open_client(ep, 0, 0.1);
    struct work_grant g;
    next_ok(c, &g);
    assert_int_equal(g.kind, WORK_UNIT);
    /* the forger: another process's key, the real one's identity */
    struct plane_cred forged = gen_cred(1, 0, 99);
    forged.id = gen_cred(0, 0, 98).id;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    w.worker_id = 0x5742, w.rank = 0, w.ping = true;
    env.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST, env.work_request = &w;
    int s[SOCKS + 1];
    int tmo = 200;
    for (int i = 0; i <= SOCKS; i++) {
        s[i] = nn_socket(AF_SP, NN_REQ);
        assert_true(s[i] >= 0);
        nn_setsockopt(s[i], NN_SOL_SOCKET, NN_SNDTIMEO, &tmo, sizeof tmo);
        nn_setsockopt(s[i], NN_SOL_SOCKET, NN_RCVTIMEO, &tmo, sizeof tmo);
        assert_true(nn_connect(s[i], ep) >= 0);
    }
    static uint8_t big[100 << 10], pad[2048];
    long sent = 0, padded = 0;
    const double until = clock_now_s() + 1.5;
    while (clock_now_s() < until) {
        for (int i = 0; i < SOCKS; i++) {
            size_t len;
            uint8_t *buf = plane_pack_request(&env, &forged, &len);
            size_t n = len;
            if (i % 2) { /* over the kind's bound */
                memcpy(pad, buf, len);
                n = pad_envelope(pad, len, 1000);
                padded++;
            }
            if (nn_send(s[i], i % 2 ? pad : buf, n, 0) >= 0)
                sent++;
            free(buf);
        }
        for (int i = 0; i < SOCKS; i++) {
            void *m;
            int n = nn_recv(s[i], &m, NN_MSG, 0);
            if (n >= 0)
                nn_freemsg(m);
        }
        nn_send(s[SOCKS], big, sizeof big, NN_DONTWAIT); /* dropped unread by the socket */
    }
    struct dispatch_stats st = stats(d);
    if (st.lost != 0 || st.live != 1)
        fail_msg("during the flood: %lld lost, %lld live", (long long)st.lost, (long long)st.live);
    assert_true(st.oversized > 0);
    assert_true(st.mac_bytes <= st.macs * (int64_t)DISPATCH_MAX_WORK_REQUEST_BYTES);
    print_message("flood: %ld requests sent (%ld padded), %lld refused by their size, %lld MACs over %lld bytes\n",
                  sent, padded, (long long)st.oversized, (long long)st.macs, (long long)st.mac_bytes);
    for (int i = 0; i <= SOCKS; i++)
        nn_close(s[i]);
    next_ok(c, &g); /* served on: it asks again for the unit it holds (it never said it was done) */
    dispatcher_end(d, 1, "end");
    next_ok(c, &g);
    assert_int_equal(g.kind, WORK_END);
    work_client_close(c);
    dispatcher_close(d, 1.0, 0);
    free(w0);
}

/* Pack env with credentials c (NULL: none), hand the bytes to the core n times, and return the last answer. */
static Grpo__Envelope *signed_call(struct dispatch_core *d, Grpo__Envelope *env, struct plane_cred *c, int n,
                                   double now)
{
    size_t len = 0, rlen = 0;
    env->request_id = 4242;
    uint8_t *buf = plane_pack_request(env, c, &len);
    Grpo__Envelope *r = NULL;
    for (int i = 0; i < n; i++) {
        protocol_free(r);
        uint8_t *out = dispatch_core_handle(d, buf, len, now, &rlen);
        r = protocol_unpack(out, rlen, NULL, 0);
        free(out);
    }
    free(buf);
    return r;
}

/* A relay ask (WeightsRequest.relay) of process `id` with credentials c for version v: bad >= 0 names the rollout
 * rank whose relay failed it, holds_at says it holds v and serves it there. The answer (a weights chunk). */
static Grpo__Envelope *relay_ask(struct dispatch_core *d, struct plane_cred *c, uint64_t id, int64_t v, int bad,
                                 const char *holds_at, double now)
{
    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
    q.worker_id = id;
    q.version = v;
    q.relay = true;
    q.bad_relay = bad >= 0 ? bad + 1 : 0;
    q.holds = holds_at != NULL;
    q.relay_endpoint = (char *)(holds_at ? holds_at : "");
    req.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    req.weights_request = &q;
    Grpo__Envelope *r = signed_call(d, &req, c, 1, now);
    assert_non_null(r);
    if (r->body_case != GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK)
        fail_msg("a relay ask: expected a weights chunk, got body %d (%s)", (int)r->body_case,
                 r->body_case == GRPO__ENVELOPE__BODY_REPLY ? r->reply->error : "");
    assert_int_equal(r->weights_chunk->data.len, 0);
    return r;
}

/* What a relay ask was answered: "here" (fetch it from the dispatcher), "wait", or the holder's endpoint; the digest
 * must be want's and the token the version's (NULL: neither, a dispatcher without the tree). */
static void expect_plan(Grpo__Envelope *r, const uint8_t *want, const char *plan)
{
    const Grpo__WeightsChunk *c = r->weights_chunk;
    if (!want) {
        assert_int_equal(c->digest.len, 0);
        assert_int_equal(c->relay_token.len, 0);
    } else { /* the digest, and the version's relay token under the run key */
        assert_int_equal(c->digest.len, RELAY_DIGEST_BYTES);
        assert_memory_equal(c->digest.data, want, RELAY_DIGEST_BYTES);
        uint8_t tok[RELAY_TOKEN_BYTES];
        relay_token(run_key, EPOCH, c->version, tok);
        assert_int_equal(c->relay_token.len, RELAY_TOKEN_BYTES);
        assert_memory_equal(c->relay_token.data, tok, RELAY_TOKEN_BYTES);
    }
    const char *got = c->relay_wait ? "wait" : c->relay_endpoint && c->relay_endpoint[0] ? c->relay_endpoint : "here";
    if (strcmp(got, plan) != 0)
        fail_msg("a relay ask was answered '%s', expected '%s'", got, plan);
    if (c->relay_endpoint && c->relay_endpoint[0]) /* its endpoint is ipc://rR: rollout rank R's */
        assert_int_equal(c->relay_rank, strtol(c->relay_endpoint + 7, NULL, 10));
    protocol_free(r);
}

/* issue 45: the relay tree's assignment. 7 rollout processes, fan-out 2: the first 2 askers fetch a version from
 * the dispatcher, each holder is named to at most 2 more, the fullest holders last; an asker waits while live
 * processes on their way to hold it will have room (not for a lost one); a relay named as failed is never named
 * again, nor a lost one; a holder is never named to itself. Every answer carries the version's digest; with the tree
 * off, none (as a 1.16 dispatcher: the process fetches as before). */
static void test_relay_tree(void **state)
{
    (void)state;
    enum { U = 7, N = 16 };
    float *w0 = weights(N, 0.5f, 1.0f), *w1 = weights(N, 0.25f, -3.0f);
    const struct dispatch_options o = {.units = U,
                                       .groups_in_step = U,
                                       .staleness = 0,
                                       .total_steps = 3,
                                       .n_floats = N,
                                       .lost_after_s = 2,
                                       .run_key = run_key,
                                       .epoch = EPOCH,
                                       .first_rollout_rank = FIRST_ROLLOUT,
                                       .rollout_tp = 1,
                                       .relay_fanout = 2};
    char err[256];
    struct dispatch_core *d = dispatch_core_create(&o, 0, err, sizeof err);
    assert_non_null(d);
    uint8_t dg0[RELAY_DIGEST_BYTES], dg1[RELAY_DIGEST_BYTES], other[RELAY_DIGEST_BYTES];
    relay_digest(w0, N, dg0);
    relay_digest(w1, N, dg1);
    relay_digest(w1, N - 1, other);
    assert_memory_not_equal(dg0, dg1, RELAY_DIGEST_BYTES);
    assert_memory_not_equal(dg1, other, RELAY_DIGEST_BYTES);
    for (int v = 0; v < 2; v++) { /* published as the shell does: the digest filled between begin and end */
        float *dst = dispatch_core_publish_begin(d, v);
        assert_non_null(dst);
        memcpy(dst, v ? w1 : w0, N * sizeof(float));
        uint8_t *dg = dispatch_core_publish_digest(d);
        assert_non_null(dg);
        relay_digest(dst, N, dg);
        dispatch_core_publish_end(d, v);
    }
    struct plane_cred c[U];
    uint64_t id[U];
    for (int i = 0; i < U; i++) { /* each process says it is there */
        c[i] = gen_cred(i, 0, (uint32_t)(700 + i));
        id[i] = 0x5000 + (uint64_t)i;
        expect_grant_kind(cred_work(d, &c[i], id[i], i, true, 0.1), WORK_WAIT);
    }
    const double t = 0.5;
    expect_plan(relay_ask(d, &c[0], id[0], 1, -1, NULL, t), dg1, "here"); /* the first level: 2 from here */
    expect_plan(relay_ask(d, &c[1], id[1], 1, -1, NULL, t), dg1, "here");
    expect_plan(relay_ask(d, &c[2], id[2], 1, -1, NULL, t), dg1, "wait");       /* 2 on their way, none holds it */
    expect_plan(relay_ask(d, &c[0], id[0], 1, -1, "ipc://r0", t), dg1, "here"); /* rank 0 holds it */
    expect_plan(relay_ask(d, &c[2], id[2], 1, -1, NULL, t), dg1, "ipc://r0");
    expect_plan(relay_ask(d, &c[3], id[3], 1, -1, NULL, t), dg1, "ipc://r0");
    expect_plan(relay_ask(d, &c[4], id[4], 1, -1, NULL, t), dg1, "wait"); /* rank 0 full; 3 on their way */
    expect_plan(relay_ask(d, &c[1], id[1], 1, -1, "ipc://r1", t), dg1, "here");
    expect_plan(relay_ask(d, &c[4], id[4], 1, -1, NULL, t), dg1, "ipc://r1");
    expect_plan(relay_ask(d, &c[2], id[2], 1, -1, "ipc://r2", t), dg1, "here");
    /* the least named holder first: rank 2 (none yet) before rank 1 (one) */
    expect_plan(relay_ask(d, &c[5], id[5], 1, -1, NULL, t), dg1, "ipc://r2");
    /* rank 2's relay failed rank 5: rank 5 fetches it here, and rank 2 is never named again */
    expect_plan(relay_ask(d, &c[5], id[5], 1, 2, NULL, t), dg1, "here");
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.relay_failed, 1);
    assert_int_equal(st.relays_barred, 1);
    expect_plan(relay_ask(d, &c[6], id[6], 1, -1, NULL, t), dg1, "ipc://r1"); /* rank 1's second; never rank 2 */
    expect_plan(relay_ask(d, &c[6], id[6], 1, 2, NULL, t), dg1, "here");      /* named again: counted, barred once */
    st = cstats(d);
    assert_int_equal(st.relay_failed, 2);
    assert_int_equal(st.relays_barred, 1);
    expect_plan(relay_ask(d, &c[3], id[3], 1, -1, "ipc://r3", t), dg1, "here");
    expect_plan(relay_ask(d, &c[4], id[4], 1, -1, "ipc://r4", t), dg1, "here");
    /* rank 3 is silent past lost_after_s (the others ping): lost, never named; a holder never to itself */
    for (int i = 0; i < U; i++)
        if (i != 3)
            expect_grant_kind(cred_work(d, &c[i], id[i], i, true, 2.4), WORK_WAIT);
    dispatch_core_tick(d, 2.6);
    assert_int_equal(cstats(d).lost, 1);
    /* ranks 3 and 4 were named to nobody; rank 3 came first, but it is lost */
    expect_plan(relay_ask(d, &c[5], id[5], 1, -1, NULL, 2.6), dg1, "ipc://r4");
    /* rank 4 asks: the only holder with room is itself, and ranks 5 and 6 are on their way to hold it: wait */
    expect_plan(relay_ask(d, &c[4], id[4], 1, -1, NULL, 2.6), dg1, "wait");
    /* a version not held: the usual error, no plan */
    Grpo__Envelope *gone = relay_ask(d, &c[0], id[0], 7, -1, NULL, 2.6);
    assert_non_null(strstr(gone->weights_chunk->error, "not held"));
    assert_int_equal(gone->weights_chunk->digest.len, 0);
    protocol_free(gone);
    /* a relay that failed its asker for a version gone by meanwhile (a silent relay held the asker up for its
     * timeout while the run moved on; CI, 2026-12-06): barred all the same, and the asker told the version is gone
     * (it asks for new work) */
    st = cstats(d);
    gone = relay_ask(d, &c[5], id[5], 0, 4, NULL, 2.6);
    assert_non_null(strstr(gone->weights_chunk->error, "policy version 0 is not held (newest 1)"));
    protocol_free(gone);
    assert_int_equal(cstats(d).relay_failed, st.relay_failed + 1);
    assert_int_equal(cstats(d).relays_barred, st.relays_barred + 1);
    /* rank 4, the one holder with room before, is barred: rank 6 is not sent to it, and waits for ranks on their way */
    expect_plan(relay_ask(d, &c[6], id[6], 1, -1, NULL, 2.6), dg1, "wait");
    dispatch_core_free(d);

    /* fan-out 1: rank 1 waits for rank 0, on its way; rank 0 dies before it holds the version: rank 1 no longer
     * waits for it, and fetches it here */
    struct dispatch_options one = o;
    one.units = 3;
    one.groups_in_step = 3;
    one.relay_fanout = 1;
    d = dispatch_core_create(&one, 0, err, sizeof err);
    assert_non_null(d);
    float *dst = dispatch_core_publish_begin(d, 0);
    memcpy(dst, w0, N * sizeof(float));
    relay_digest(dst, N, dispatch_core_publish_digest(d));
    dispatch_core_publish_end(d, 0);
    for (int i = 0; i < 3; i++) {
        c[i] = gen_cred(i, 0, (uint32_t)(800 + i));
        expect_grant_kind(cred_work(d, &c[i], id[i], i, true, 0.1), WORK_WAIT);
    }
    expect_plan(relay_ask(d, &c[0], id[0], 0, -1, NULL, 0.2), dg0, "here");
    expect_plan(relay_ask(d, &c[1], id[1], 0, -1, NULL, 0.2), dg0, "wait");
    for (int i = 1; i < 3; i++) /* rank 0 falls silent */
        expect_grant_kind(cred_work(d, &c[i], id[i], i, true, 2.0), WORK_WAIT);
    dispatch_core_tick(d, 2.5);
    assert_int_equal(cstats(d).lost, 1);
    expect_plan(relay_ask(d, &c[1], id[1], 0, -1, NULL, 2.5), dg0, "here");
    expect_plan(relay_ask(d, &c[2], id[2], 0, -1, NULL, 2.5), dg0, "wait"); /* rank 1 is on its way now */
    expect_plan(relay_ask(d, &c[1], id[1], 0, -1, "ipc://r1", 2.6), dg0, "here");
    expect_plan(relay_ask(d, &c[2], id[2], 0, -1, NULL, 2.6), dg0, "ipc://r1");
    dispatch_core_free(d);

    /* the tree off: no digest, no holder (the process fetches from the dispatcher, as from a 1.16 one) */
    struct dispatch_options off = o;
    off.relay_fanout = 0;
    d = dispatch_core_create(&off, 0, err, sizeof err);
    assert_non_null(d);
    publish(d, 0, w0);
    assert_null(dispatch_core_publish_digest(d));
    c[0] = gen_cred(0, 0, 900);
    expect_grant_kind(cred_work(d, &c[0], 0x6000, 0, true, 0.1), WORK_WAIT);
    expect_plan(relay_ask(d, &c[0], 0x6000, 0, -1, NULL, 0.2), NULL, "here");
    dispatch_core_free(d);
    free(w0);
    free(w1);
}

/* issue 27: every request must carry a good MAC of a rollout process, which speaks for itself only: a request
 * without one, one whose MAC is another identity's, a replayed one, a ping or a claim for another rollout rank or
 * for another process's worker id, and weights for a process that is no rollout process are refused, counted, and
 * change nothing. (Before protocol 1.8 every one of them was answered.) */
static void test_identity(void **state)
{
    (void)state;
    const size_t N = 8;
    float *w0 = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        w0[i] = (float)i;
    const double t = 0;
    struct dispatch_core *d = core_open(2, 0, 10, N, 10.0, t);
    publish(d, 0, w0);
    const struct proc a = {0xA, 0}, b = {0xB, 1};
    expect_unit_at(d, &a, t, 1, 0, 0);
    expect_unit_at(d, &b, t, 1, 1, 0);
    assert_int_equal(cstats(d).live, 2);

    Grpo__Envelope req = GRPO__ENVELOPE__INIT;
    Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
    req.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
    req.work_request = &w;
    /* no authentication: a ping in rank 1's name */
    w.worker_id = 0xB, w.rank = 1, w.ping = true;
    expect_refusal(signed_call(d, &req, NULL, 1, t), "carries no authentication");
    /* rank 0's process (a's key) claiming to be rank 1's (b's identity): its MAC is not rank 1's */
    struct plane_cred ca = cred_of(&a);
    ca.counter = 1000;
    struct plane_cred forged = ca;
    forged.id = cred_of(&b).id;
    expect_refusal(signed_call(d, &req, &forged, 1, t), "authentication failed");
    /* a, as itself, pinging (and asking for work) for rollout rank 1 */
    expect_refusal(signed_call(d, &req, &ca, 1, t), "no process speaks for another");
    w.ping = false;
    expect_refusal(signed_call(d, &req, &ca, 1, t), "work request for rollout rank 1");
    /* another process of rank 0 (good credentials of its own) with a's worker id */
    struct plane_cred other;
    plane_cred_issue(&other, run_key,
                     &(struct plane_id){.rank = FIRST_ROLLOUT, .pid = 77, .incarnation = 78, .epoch = EPOCH});
    w.worker_id = 0xA, w.rank = 0, w.ping = true;
    expect_refusal(signed_call(d, &req, &other, 1, t), "is another process's");
    /* a replayed request: the same bytes twice */
    w.worker_id = 0xA, w.rank = 0, w.ping = true;
    expect_refusal(signed_call(d, &req, &ca, 2, t), "replayed");
    /* weights: without credentials, and for a trainer rank's identity */
    Grpo__Envelope wreq = GRPO__ENVELOPE__INIT;
    Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
    q.worker_id = 0xA, q.version = 0, q.count = N;
    wreq.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
    wreq.weights_request = &q;
    expect_refusal(signed_call(d, &wreq, NULL, 1, t), "carries no authentication");
    struct plane_cred trainer;
    plane_cred_issue(&trainer, run_key, &(struct plane_id){.rank = 0, .pid = 5, .incarnation = 6, .epoch = EPOCH});
    expect_refusal(signed_call(d, &wreq, &trainer, 1, t), "rollout processes only");
    /* keys die with their launch (1.12): a's request as the launch before made it (its key epoch, under the same run
     * key: what grpod kept across a relaunch before), and as a 1.11 process made it (no epoch), refused before any
     * MAC is computed and counted apart; the dispatcher logs the 20 copies once (at most one line per 5 s) */
    struct plane_cred before = cred_of(&a), ancient = cred_of(&a);
    before.id.epoch = EPOCH - 1;
    plane_key_derive(run_key, &before.id, before.key);
    ancient.id.epoch = 0;
    plane_key_derive(run_key, &ancient.id, ancient.key);
    w.worker_id = 0xA, w.rank = 0, w.ping = true;
    expect_refusal(signed_call(d, &req, &before, 20, t), "not this launch's");
    expect_refusal(signed_call(d, &req, &ancient, 1, t), "no key epoch");
    struct dispatch_stats st = cstats(d);
    assert_int_equal(st.old_epoch, 21);
    assert_int_equal(st.refused, 29);
    assert_int_equal(st.live, 2);
    assert_int_equal(st.granted, 2);
    assert_int_equal(st.bytes, 0);
    /* the real processes go on: b's lease is b's, and a's own ping is answered (a counts on from ca's counter:
     * its identity's) */
    heard_of(a.id)->counter = ca.counter;
    expect_wait_at(d, &a, t, "waits for the trainers' policy version", NULL);
    struct work_grant g;
    grant_of(d, &b, true, t, &g);
    assert_int_equal(g.kind, WORK_WAIT);
    expect_weights_at(d, &a, t, 0, w0, N, N);
    dispatch_core_free(d);
    free(w0);
}

int main(void)
{
    plane_run_key_new(run_key);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grants_and_versions),
        cmocka_unit_test(test_one_step_off),
        cmocka_unit_test(test_takeover_floor),
        cmocka_unit_test(test_loss_and_regrant),
        cmocka_unit_test(test_lost_answer),
        cmocka_unit_test(test_granted_and_dropped),
        cmocka_unit_test(test_lease_expiry),
        cmocka_unit_test(test_lease_floor_option),
        cmocka_unit_test(test_late_answers),
        cmocka_unit_test(test_broadcast_rounds),
        cmocka_unit_test(test_async_stream),
        cmocka_unit_test(test_async_replay),
        cmocka_unit_test(test_end),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_one_id_per_process),
        cmocka_unit_test_prestate_setup_teardown(test_replacement, rank_setup, rank_teardown,
                                                 &replacement_lost_after_s),
        cmocka_unit_test_prestate_setup_teardown(test_table_bound, rank_setup, rank_teardown,
                                                 &table_bound_lost_after_s),
        cmocka_unit_test(test_rate_limit),
        cmocka_unit_test(test_size_before_mac),
        cmocka_unit_test(test_identity),
        cmocka_unit_test_setup_teardown(test_close_waits_for_late_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_end_heard_in_ping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shell_end_to_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shell_bad_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shell_flood, setup, teardown),
        cmocka_unit_test(test_relay_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
