/* grpod's core driven directly with packed requests: placement and roles, the
 * run state machine, health, commands, refusals, the journal form, the tcp
 * endpoints' challenge-response and sealed sessions, the launches' key epochs,
 * field validation, and garbage that must never crash it. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/log.h"
#include "daemon/arena.h"
#include "daemon/core.h"
#include "daemon/validate.h"
#include "proto/ctl_auth.h"
#include "proto/plane_auth.h"
#include "common/placement.h"
#include "proto/status_json.h"
#include "proto/transport.h"

static double T = 1000.0; /* the test's monotonic clock */

static struct core_settings settings(int trainer, int rollout, int tp, int pp)
{
    struct core_settings s = {
        .place = {.rollout_ranks = rollout, .trainer_ranks = trainer, .tp_size = tp, .pp_size = pp},
        .heartbeat_interval_s = 1.0,
        .heartbeat_timeout_s = 5.0,
        .data_endpoint = "",
        .http_url = ""};
    return s;
}

static Grpo__Envelope *roundtrip(struct core *c, Grpo__Envelope *req, const char *secret)
{
    size_t len, rlen;
    uint8_t *buf = protocol_pack(req, &len);
    uint8_t *r = core_handle(c, buf, len, secret, T, &rlen);
    free(buf);
    char why[256];
    Grpo__Envelope *e = protocol_unpack(r, rlen, why, sizeof why);
    if (!e)
        fail_msg("reply does not decode: %s", why);
    free(r);
    return e;
}

static Grpo__Envelope *send_register_as(struct core *c, int rank, int world, const char *host, const char *caps,
                                        uint64_t digest, bool replaces)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char capbuf[64];
    char *capv[4];
    size_t ncap = 0;
    snprintf(capbuf, sizeof capbuf, "%s", caps);
    for (char *tok = strtok(capbuf, ","); tok && ncap < 4; tok = strtok(NULL, ","))
        capv[ncap++] = tok;
    char *dev[] = {"cpu"};
    reg.rank = rank;
    reg.world_size = world;
    reg.host = (char *)host;
    reg.pid = 100 + rank;
    reg.config_digest = digest;
    reg.capabilities = capv;
    reg.n_capabilities = ncap;
    reg.devices = dev;
    reg.n_devices = 1;
    reg.replaces = replaces;
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    return roundtrip(c, &env, NULL);
}

static Grpo__Envelope *send_register(struct core *c, int rank, int world, const char *host, const char *caps,
                                     uint64_t digest)
{
    return send_register_as(c, rank, world, host, caps, digest, false);
}

/* Register and expect an assignment; returns the incarnation token. */
static uint64_t reg_ok(struct core *c, int rank, int world, Grpo__Role role)
{
    char host[32];
    snprintf(host, sizeof host, "node%02d", rank);
    Grpo__Envelope *e = send_register(c, rank, world, host, "rollout,trainer", 42);
    if (e->body_case != GRPO__ENVELOPE__BODY_ASSIGNMENT)
        fail_msg("rank %d refused: %s", rank, e->body_case == GRPO__ENVELOPE__BODY_REPLY ? e->reply->error : "?");
    assert_int_equal(e->assignment->role, role);
    uint64_t inc = e->assignment->incarnation;
    assert_true(inc != 0);
    protocol_free(e);
    return inc;
}

/* A heartbeat with its error text (state failed or stopped: why) */
static Grpo__Envelope *beat_why(struct core *c, int rank, uint64_t inc, Grpo__WorkerState st, int64_t step,
                                const char *error)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    Grpo__Metric m = GRPO__METRIC__INIT, *mp = &m;
    m.name = "critic/score/mean";
    m.value = 0.5 + (double)step;
    hb.rank = rank;
    hb.incarnation = inc;
    hb.state = st;
    hb.step = step;
    hb.total_steps = 100;
    hb.phase = GRPO__PHASE__PHASE_GEN;
    hb.metrics = &mp;
    hb.n_metrics = 1;
    hb.checkpoint_step = -1;
    hb.error = (char *)error;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    Grpo__Envelope *e = roundtrip(c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_HEARTBEAT_ACK);
    return e;
}

static Grpo__Envelope *beat(struct core *c, int rank, uint64_t inc, Grpo__WorkerState st, int64_t step)
{
    return beat_why(c, rank, inc, st, step, "");
}

static void beat_ok(struct core *c, int rank, uint64_t inc, Grpo__WorkerState st, int64_t step)
{
    Grpo__Envelope *e = beat(c, rank, inc, st, step);
    assert_false(e->heartbeat_ack->reregister);
    protocol_free(e);
}

/* A command with a reason (grpoctl --reason; "" as grpoctl without one) and a requester (a worker's stop on a
 * signal; "": an operator). */
static Grpo__Envelope *command_by(struct core *c, Grpo__Command cmd, const char *reason, const char *requester)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__CommandRequest cr = GRPO__COMMAND_REQUEST__INIT;
    cr.command = cmd;
    cr.reason = (char *)reason;
    cr.requester = (char *)requester;
    env.body_case = GRPO__ENVELOPE__BODY_COMMAND;
    env.command = &cr;
    Grpo__Envelope *e = roundtrip(c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    return e;
}

static Grpo__Envelope *command(struct core *c, Grpo__Command cmd) { return command_by(c, cmd, "", ""); }

static void command_ok(struct core *c, Grpo__Command cmd)
{
    Grpo__Envelope *e = command(c, cmd);
    if (!e->reply->ok)
        fail_msg("command %d refused: %s", cmd, e->reply->error);
    protocol_free(e);
}

static void test_placement_trainer_rollout(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(4, 2, 2, 1);
    core_init(&c, &s, T);
    /* rollout ranks on ipc can register before the trainers */
    Grpo__Envelope *e = send_register(&c, 5, 6, "r5", "rollout", 1);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(e->assignment->role, GRPO__ROLE__ROLE_ROLLOUT);
    assert_int_equal(e->assignment->dp_rank, 1);
    assert_int_equal(e->assignment->dp_size, 2);
    assert_int_equal(e->assignment->n_trainer_endpoints, 2); /* 4 trainers / tp 2 = 2 DP ranks */
    assert_non_null(strstr(e->assignment->trainer_endpoints[1], "-dp1.sock"));
    assert_string_equal(e->assignment->data_push_endpoint, e->assignment->trainer_endpoints[1]);
    /* issue 27: a rollout rank gets its own data-plane key, for its identity (rank, pid, incarnation), derived
     * from the run's key, and never the run's key */
    uint8_t want[PLANE_KEY_BYTES];
    plane_key_derive(c.run.plane_key,
                     &(struct plane_id){.rank = 5, .pid = 105, .incarnation = e->assignment->incarnation, .epoch = 1},
                     want);
    assert_int_equal(e->assignment->plane_key.len, PLANE_KEY_BYTES);
    assert_memory_equal(e->assignment->plane_key.data, want, PLANE_KEY_BYTES);
    assert_int_equal(e->assignment->plane_run_key.len, 0);
    protocol_free(e);
    for (int r = 0; r < 4; r++) {
        e = send_register(&c, r, 6, "t", "trainer", 1);
        assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
        const Grpo__Assignment *a = e->assignment;
        /* a trainer rank checks every process's messages: it gets the run's key */
        assert_int_equal(a->plane_run_key.len, PLANE_KEY_BYTES);
        assert_memory_equal(a->plane_run_key.data, c.run.plane_key, PLANE_KEY_BYTES);
        assert_int_equal(a->role, GRPO__ROLE__ROLE_TRAINER);
        assert_int_equal(a->tp_rank, r % 2);
        assert_int_equal(a->dp_rank, r / 2);
        assert_int_equal(a->dp_size, 2);
        assert_int_equal(a->tp_size, 2);
        if (a->tp_rank == 0)
            assert_non_null(strstr(a->data_pull_endpoint, "-dp"));
        else
            assert_string_equal(a->data_pull_endpoint, "");
        protocol_free(e);
    }
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_WAITING);
    assert_non_null(strstr(c.run.reason, "5 of 6"));
    /* a rank that cannot roll out is not given the rollout role */
    e = send_register(&c, 4, 6, "r4", "trainer", 1);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(e->reply->error, "capabilities lack 'rollout'"));
    protocol_free(e);
    e = send_register(&c, 4, 6, "r4", "rollout", 1);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    protocol_free(e);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    core_deinit(&c);
}

static void test_placement_hybrid_megatron_order(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 2, 2);
    core_init(&c, &s, T);
    for (int r = 0; r < 8; r++) {
        Grpo__Envelope *e = send_register(&c, r, 8, "h", "", 7);
        assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
        const Grpo__Assignment *a = e->assignment;
        assert_int_equal(a->role, GRPO__ROLE__ROLE_HYBRID);
        /* rank = (pp * dp_size + dp) * tp_size + tp, as worker/comm/parallel.c */
        assert_int_equal((a->pp_rank * a->dp_size + a->dp_rank) * a->tp_size + a->tp_rank, r);
        assert_int_equal(a->dp_size, 2);
        assert_int_equal(a->world_size, 8);
        protocol_free(e);
    }
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    core_deinit(&c);
    /* a world that does not divide by tp x pp is refused with the reason */
    core_init(&c, &s, T);
    Grpo__Envelope *e = send_register(&c, 0, 6, "h", "", 7);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(
        strstr(e->reply->error, "not a multiple of actor_rollout_ref.actor.megatron.tensor_model_parallel_size 2"));
    protocol_free(e);
    core_deinit(&c);
}

/* The data plane's base ports, worked by hand for three ephemeral ranges: Linux's default (the stretch below it is
 * the larger), a range starting low (the stretch above it), and one covering every port (the old fixed window). */
static void test_data_port_window(void **state)
{
    (void)state;
    int first = 0, span = 0;
    placement_port_window(32768, 60999, &first, &span);
    assert_int_equal(first, 10000);
    assert_int_equal(span, 32768 - 256 - 10000);
    placement_port_window(12000, 40000, &first, &span);
    assert_int_equal(first, 40001);
    assert_int_equal(span, 65280 - 256 - 40001);
    placement_port_window(1024, 65535, &first, &span);
    assert_int_equal(first, 20000);
    assert_int_equal(span, 20000);
    /* every tag's base, and the ports above it a run may take, stay out of the default range */
    char base[64], tag[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(tag, sizeof tag, "run-%d", i);
        placement_data_base("", 2, tag, base, sizeof base);
        const long port = strtol(strrchr(base, ':') + 1, NULL, 10);
        int lo = 0, hi = 0;
        placement_ephemeral_range(&lo, &hi);
        assert_true(port >= 1024 && port + PLACEMENT_PORTS_PER_RUN < 65536);
        assert_true(port + PLACEMENT_PORTS_PER_RUN <= lo || port > hi);
    }
}

static void test_refusals(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(1, 1, 1, 1);
    core_init(&c, &s, T);
    Grpo__Envelope *e = send_register(&c, 0, 3, "h", "", 7);
    assert_non_null(strstr(e->reply->error, "placement has 2"));
    protocol_free(e);
    reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_TRAINER);
    e = send_register(&c, 1, 2, "h", "", 8); /* another configuration */
    assert_non_null(strstr(e->reply->error, "configuration differs"));
    assert_false(e->reply->retry);
    protocol_free(e);
    /* a second process for a rank that is alive: refused for now, may retry */
    e = send_register(&c, 0, 2, "other", "", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(e->reply->error, "rank 0 is held by pid 100 on host node00"));
    assert_true(e->reply->retry);
    protocol_free(e);
    /* once the holder has been silent a while, the newcomer takes the rank */
    T += 3.0;
    e = send_register(&c, 0, 2, "other", "", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    protocol_free(e);
    /* heartbeats of an unknown registration are told to register again */
    e = beat(&c, 1, 12345, GRPO__WORKER_STATE__WORKER_RUNNING, 0);
    assert_true(e->heartbeat_ack->reregister);
    protocol_free(e);
    core_deinit(&c);
}

static void test_state_machine(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_WAITING);
    uint64_t i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_WAITING);
    uint64_t i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 3);
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_RUNNING, 2);
    assert_int_equal(c.run.step, 3);
    assert_int_equal(c.run.nhistory, 1);
    assert_true(fabs(c.run.history[0].reward - 3.5) < 1e-12);

    command_ok(&c, GRPO__COMMAND__COMMAND_PAUSE);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_PAUSING);
    Grpo__Envelope *e = beat(&c, 0, i0, GRPO__WORKER_STATE__WORKER_PAUSED, 3);
    assert_true(e->heartbeat_ack->pause);
    protocol_free(e);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_PAUSING);
    assert_non_null(strstr(c.run.reason, "1 of 2"));
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_PAUSED, 3);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_PAUSED);
    command_ok(&c, GRPO__COMMAND__COMMAND_CHECKPOINT);
    assert_int_equal(c.run.checkpoint_seq, 1);
    command_ok(&c, GRPO__COMMAND__COMMAND_RESUME);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    e = beat(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 4);
    assert_false(e->heartbeat_ack->pause);
    assert_int_equal(e->heartbeat_ack->checkpoint_seq, 1);
    protocol_free(e);

    command_ok(&c, GRPO__COMMAND__COMMAND_STOP);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_STOPPING);
    e = command(&c, GRPO__COMMAND__COMMAND_PAUSE);
    assert_false(e->reply->ok);
    protocol_free(e);
    e = beat(&c, 0, i0, GRPO__WORKER_STATE__WORKER_STOPPED, 5);
    assert_true(e->heartbeat_ack->stop);
    protocol_free(e);
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_STOPPED, 5);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FINISHED);
    assert_non_null(strstr(c.run.reason, "stopped by operator at step 5"));
    e = command(&c, GRPO__COMMAND__COMMAND_RESUME);
    assert_false(e->reply->ok);
    assert_non_null(strstr(e->reply->error, "nothing to resume"));
    protocol_free(e);
    /* the next fresh registration begins a new run */
    char old[CORE_NAME_MAX];
    snprintf(old, sizeof old, "%s", c.run.id);
    c.run.id[strlen(c.run.id) - 1] ^= 1; /* the clock may not have moved: make the ids differ */
    snprintf(old, sizeof old, "%s", c.run.id);
    reg_ok(&c, 0, 1, GRPO__ROLE__ROLE_HYBRID);
    assert_string_not_equal(c.run.id, old);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    core_deinit(&c);
}

/* A steady heartbeat (same state, step and checkpoint) leaves the run's verdict as it was without judging it again
 * from every worker (that was N^2 a second at N workers: docs/scaling.md); a heartbeat that changes what the verdict
 * reads still moves the run. */
static void test_steady_heartbeats_judge_nothing(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    enum { N = 64 };
    uint64_t inc[N];
    for (int r = 0; r < N; r++)
        inc[r] = reg_ok(&c, r, N, GRPO__ROLE__ROLE_HYBRID);
    for (int r = 0; r < N; r++) /* starting -> running: each a change */
        beat_ok(&c, r, inc[r], GRPO__WORKER_STATE__WORKER_RUNNING, 3);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    const uint64_t judged = c.evaluations;
    for (int round = 0; round < 5; round++)
        for (int r = 0; r < N; r++)
            beat_ok(&c, r, inc[r], GRPO__WORKER_STATE__WORKER_RUNNING, 3);
    assert_int_equal(c.evaluations, judged); /* 320 steady heartbeats, no judgement */
    /* a step forward is judged once (the run's step moves) */
    beat_ok(&c, 0, inc[0], GRPO__WORKER_STATE__WORKER_RUNNING, 4);
    assert_int_equal(c.evaluations, judged + 1);
    assert_int_equal(c.run.step, 4);
    /* a state change is judged: pausing, then every worker paused */
    command_ok(&c, GRPO__COMMAND__COMMAND_PAUSE);
    for (int r = 0; r < N; r++)
        beat_ok(&c, r, inc[r], GRPO__WORKER_STATE__WORKER_PAUSED, 4);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_PAUSED);
    const uint64_t paused = c.evaluations;
    beat_ok(&c, 5, inc[5], GRPO__WORKER_STATE__WORKER_PAUSED, 4);
    assert_int_equal(c.evaluations, paused);
    /* a failure is judged at once, by a heartbeat alone */
    beat_ok(&c, 7, inc[7], GRPO__WORKER_STATE__WORKER_FAILED, 4);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FAILED);
    core_deinit(&c);
}

/* As grpod's shell does after each request: the state is durable (written whole, or the record appended). */
static void made_durable(struct core *c)
{
    c->dirty = c->dirty_urgent = false;
    c->record_rank = -1;
    c->events_new = c->history_new = 0;
}

/* A registration into a run under way is journaled as one record (the worker, the run's state and reason, its
 * events) instead of the whole state: a state file saved before it, with the record applied, gives the run as it was
 * after it; a record the state file holds already is skipped; a torn record is refused. The first registration (the
 * run's world; likewise a new launch, the run's configuration) still writes the whole state (docs/scaling.md). */
static bool has_event(const struct core *c, const char *text);
static void test_registration_records(void **state)
{
    (void)state;
    struct core c, d;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    Grpo__Envelope *e = send_register(&c, 0, 3, "node00", "rollout,trainer", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    protocol_free(e);
    assert_true(c.dirty_urgent);
    assert_int_equal(c.record_rank, -1); /* the first: the run's world, its digest */
    made_durable(&c);
    uint64_t i1 = reg_ok(&c, 1, 3, GRPO__ROLE__ROLE_HYBRID);
    assert_true(c.dirty_urgent);
    assert_int_equal(c.record_rank, 1);
    char *r1 = core_save_record(&c);
    assert_non_null(r1);
    assert_null(strchr(r1, '\n')); /* one line */
    made_durable(&c);
    char *before = core_save_json(&c); /* the state file holds record 1 */
    uint64_t i2 = reg_ok(&c, 2, 3, GRPO__ROLE__ROLE_HYBRID);
    assert_int_equal(c.record_rank, 2);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING); /* every rank there */
    char *r2 = core_save_record(&c);
    made_durable(&c);
    /* a restart: the state file, then the log */
    core_init(&d, &s, T + 10);
    char err[256];
    assert_int_equal(core_load_json(&d, before, T + 10, err, sizeof err), 0);
    assert_null(d.workers[2]);
    assert_int_equal(core_apply_record(&d, r1, T + 10, err, sizeof err), 0); /* held already: skipped */
    assert_int_equal(d.workers[1]->incarnation, i1);
    assert_int_equal(core_apply_record(&d, r2, T + 10, err, sizeof err), 0);
    assert_non_null(d.workers[2]);
    assert_int_equal(d.workers[2]->incarnation, i2);
    assert_int_equal(d.workers[2]->state, GRPO__WORKER_STATE__WORKER_RECONNECTING);
    assert_int_equal(d.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(d.run.reason, c.run.reason);
    assert_true(has_event(&d, "rank 2 registered"));
    /* a heartbeat's step is journaled as its worker's record too (a step used to rewrite the whole state) */
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_RUNNING, 5);
    assert_true(c.dirty_urgent);
    assert_int_equal(c.record_rank, 1);
    char *r3 = core_save_record(&c);
    made_durable(&c);
    assert_int_equal(core_apply_record(&d, r3, T + 10, err, sizeof err), 0);
    free(r3);
    assert_int_equal(d.run.step, 5);
    assert_int_equal(d.run.nhistory, c.run.nhistory);
    assert_int_equal(d.run.history[d.run.nhistory - 1].step, 5);
    assert_true(fabs(d.run.history[d.run.nhistory - 1].reward - c.run.history[c.run.nhistory - 1].reward) < 1e-12);
    assert_int_equal(d.workers[1]->step, 5);
    /* the worker it brought back heartbeats on: its registration is known */
    beat_ok(&d, 2, i2, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    /* a torn record, and one of a rank outside the world, are refused and change nothing */
    char torn[64];
    snprintf(torn, sizeof torn, "%.40s", r2);
    assert_int_equal(core_apply_record(&d, torn, T + 10, err, sizeof err), -1);
    assert_int_equal(
        core_apply_record(&d, "{\"seq\": 99, \"run\": {}, \"worker\": {\"rank\": 7}}", T + 10, err, sizeof err), -1);
    assert_non_null(strstr(err, "rank 7 is outside the run's 3 ranks"));
    assert_int_equal(d.workers[2]->incarnation, i2);
    core_deinit(&d);
    free(r1);
    free(r2);
    free(before);
    core_deinit(&c);
}

/* A status of some workers (/api/status?workers=N): the ones not at work first (here a failed and a starting one),
 * then the lowest ranks, in rank order; the count registered is every worker's. */
static void test_status_of_some_workers(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    enum { W = 10 };
    uint64_t inc[W];
    for (int r = 0; r < W; r++)
        inc[r] = reg_ok(&c, r, W, GRPO__ROLE__ROLE_HYBRID);
    for (int r = 0; r < W; r++)
        if (r != 8) /* rank 8 stays starting */
            beat_ok(&c, r, inc[r], r == 6 ? GRPO__WORKER_STATE__WORKER_FAILED : GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    struct arena a = {0};
    int registered = -1;
    Grpo__Status *st = core_status_some(&c, T, &a, 4, &registered);
    assert_int_equal(registered, W);
    assert_int_equal(st->n_workers, 4);
    const int want[4] = {0, 1, 6, 8};
    for (int i = 0; i < 4; i++)
        assert_int_equal(st->workers[i]->rank, want[i]);
    st = core_status_some(&c, T, &a, 1, NULL);
    assert_int_equal(st->n_workers, 1);
    assert_int_equal(st->workers[0]->rank, 6); /* the notable ones before any other */
    st = core_status_some(&c, T, &a, 0, NULL);
    assert_int_equal(st->n_workers, 0);
    st = core_status_some(&c, T, &a, 100, NULL);
    assert_int_equal(st->n_workers, W);
    registered = -1;
    st = core_status_some(&c, T, &a, 2, &registered);
    char *json = status_to_json_of(st, 0, registered);
    assert_non_null(strstr(json, "\"workers_registered\":10"));
    free(json);
    arena_free(&a);
    core_deinit(&c);
}

/* A process that asks to register again before its first heartbeat (its wait for the answer ran out) gets the
 * registration it has: the same incarnation, nothing new to journal, no event; after its first heartbeat, or from
 * another process, it does not (a rank held by a live process is refused with retry). */
static void test_registration_asked_again(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID);
    made_durable(&c);
    const uint64_t i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    made_durable(&c);
    const int nevents = c.nevents;
    assert_int_equal(reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID), i1); /* the same process (pid 101), again */
    assert_false(c.dirty_urgent);
    assert_int_equal(c.nevents, nevents);
    assert_int_equal(c.counters.registrations_repeated, 1);
    /* another process of rank 1 (pid 999) while the first is fresh: held, retry */
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char *caps[] = {"rollout", "trainer"}, *dev[] = {"cpu"};
    reg.rank = 1;
    reg.world_size = 2;
    reg.host = "node01";
    reg.pid = 999;
    reg.config_digest = 42;
    reg.capabilities = caps;
    reg.n_capabilities = 2;
    reg.devices = dev;
    reg.n_devices = 1;
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    Grpo__Envelope *e = roundtrip(&c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_true(e->reply->retry);
    protocol_free(e);
    /* after its first heartbeat the same process asking is a new registration's business, as before */
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    e = send_register(&c, 1, 2, "node01", "rollout,trainer", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY); /* held: heard from just now */
    assert_true(e->reply->retry);
    protocol_free(e);
    assert_int_equal(c.counters.registrations_repeated, 1);
    core_deinit(&c);
}

static void test_checkpoint_completion(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID), i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    Grpo__Envelope *e = command(&c, GRPO__COMMAND__COMMAND_CHECKPOINT);
    assert_true(e->reply->ok);
    assert_non_null(strstr(e->reply->message, "checkpoint 1 requested"));
    protocol_free(e);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
    hb.step = 7;
    hb.checkpoint_seq_done = 1;
    hb.checkpoint_step = 7;
    hb.rank = 0;
    hb.incarnation = i0;
    protocol_free(roundtrip(&c, &env, NULL));
    assert_int_equal(c.run.checkpoint_seq_done, 0); /* rank 1 has not written yet */
    hb.rank = 1;
    hb.incarnation = i1;
    protocol_free(roundtrip(&c, &env, NULL));
    assert_int_equal(c.run.checkpoint_seq_done, 1);
    assert_int_equal(c.run.checkpoint_step, 7);
    core_deinit(&c);
}

static void test_lost_worker(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID), i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    T += 4.0;
    beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    T += 2.0; /* rank 1: 6 s of silence, over the 5 s timeout */
    core_tick(&c, T);
    assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_WAITING);
    assert_non_null(strstr(c.run.reason, "rank 1 on host node01 lost"));
    bool said = false; /* the loss, and (colocated ranks wait for each other) the word to the others to end */
    for (int i = 0; i < c.nevents; i++)
        said |= strstr(c.events[i].text, "rank 1 on host node01 (pid 101) lost") != NULL;
    assert_true(said);
    assert_non_null(strstr(c.run.abort, "colocated rank 1 on host node01 lost"));
    assert_non_null(strstr(c.run.reason, "relaunch the job"));
    /* the same process speaks again: back, and the run goes on */
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    core_deinit(&c);

    s.fail_on_lost = true;
    core_init(&c, &s, T);
    reg_ok(&c, 0, 1, GRPO__ROLE__ROLE_HYBRID);
    T += 6.0;
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FAILED);
    assert_non_null(strstr(c.run.reason, "rank 0 on host node00 lost: no heartbeat for 6.0 s"));
    core_deinit(&c);
}

/* TP model copies with trainer.survive_trainer_loss (protocol 1.19): DP 2 x TP 2 on 4 colocated ranks, rank 3 lost and
 * survived; rank 2, whose copy left, says so in its heartbeats (left_copy). grpod shows it idle with an event, counts
 * it in no step (the run goes on, no word to end; a pause is paused without it) and the run finishes without it
 * training. */
static void hb_survived(struct core *c, int rank, uint64_t inc, const char *left)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    Grpo__SurvivedLoss sl = GRPO__SURVIVED_LOSS__INIT, *slp = &sl;
    sl.rank = 3;
    sl.reason = "survived: DP 2 -> 1 at step 3";
    hb.rank = rank;
    hb.incarnation = inc;
    hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
    hb.step = 3;
    hb.total_steps = 100;
    hb.checkpoint_step = -1;
    hb.survived = &slp;
    hb.n_survived = 1;
    hb.left_copy = (char *)left;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    Grpo__Envelope *e = roundtrip(c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_HEARTBEAT_ACK);
    assert_false(e->heartbeat_ack->stop);
    protocol_free(e);
}

static void test_left_copy_idle(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 2, 1);
    core_init(&c, &s, T);
    uint64_t inc[4];
    for (int r = 0; r < 4; r++)
        inc[r] = reg_ok(&c, r, 4, GRPO__ROLE__ROLE_HYBRID);
    for (int r = 0; r < 4; r++)
        beat_ok(&c, r, inc[r], GRPO__WORKER_STATE__WORKER_RUNNING, 2);
    const char *why = "TP rank 0, PP stage 0 of DP rank 1 of 2: its copy lost rank 3 at step 3";
    T += 3.0;
    hb_survived(&c, 0, inc[0], "");
    hb_survived(&c, 1, inc[1], "");
    hb_survived(&c, 2, inc[2], why);
    assert_int_equal(c.workers[2]->role, GRPO__ROLE__ROLE_IDLE);
    assert_string_equal(core_role_name(c.workers[2]->role), "idle");
    bool said = false;
    for (int i = 0; i < c.nevents; i++)
        said |=
            strstr(c.events[i].text, "rank 2 on host node02 (pid 102) left its model copy and is idle until the "
                                     "run ends: TP rank 0, PP stage 0 of DP rank 1 of 2: its copy lost rank 3") != NULL;
    assert_true(said);
    T += 3.0; /* rank 3 silent 6 s: lost, and survived */
    hb_survived(&c, 0, inc[0], "");
    hb_survived(&c, 1, inc[1], "");
    hb_survived(&c, 2, inc[2], why);
    core_tick(&c, T);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(c.run.abort, "");
    assert_int_equal(c.workers[2]->role, GRPO__ROLE__ROLE_IDLE); /* said again in every heartbeat: no second event */
    int events = 0;
    for (int i = 0; i < c.nevents; i++)
        events += strstr(c.events[i].text, "left its model copy") != NULL;
    assert_int_equal(events, 1);
    /* a pause: the whole copy's ranks paused, the idle rank still running in its wait: the run is paused */
    command_ok(&c, GRPO__COMMAND__COMMAND_PAUSE);
    beat_ok(&c, 0, inc[0], GRPO__WORKER_STATE__WORKER_PAUSED, 3);
    beat_ok(&c, 1, inc[1], GRPO__WORKER_STATE__WORKER_PAUSED, 3);
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_PAUSED);
    command_ok(&c, GRPO__COMMAND__COMMAND_RESUME);
    /* the whole copy finishes: the run has finished (the idle rank is released at the end) */
    beat_ok(&c, 0, inc[0], GRPO__WORKER_STATE__WORKER_FINISHED, 100);
    beat_ok(&c, 1, inc[1], GRPO__WORKER_STATE__WORKER_FINISHED, 100);
    beat_ok(&c, 2, inc[2], GRPO__WORKER_STATE__WORKER_FINISHED, 3);
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FINISHED);
    core_deinit(&c);
}

static void test_worker_failure(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 1, GRPO__ROLE__ROLE_HYBRID);
    Grpo__Envelope *e = beat_why(&c, 0, i0, GRPO__WORKER_STATE__WORKER_FAILED, 0, "CUDA out of memory");
    assert_true(e->heartbeat_ack->stop);
    protocol_free(e);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FAILED);
    assert_string_equal(c.run.reason, "rank 0 on host node00 failed: CUDA out of memory");
    core_deinit(&c);
}

/* A trainer of a split run that fails (reports it) ends the job on every host: the other ranks' heartbeats are
 * answered with the word to end, naming the failed rank and its reason (issue 26, item 4). */
static void test_split_trainer_failure_aborts(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(2, 1, 1, 1);
    core_init(&c, &s, T);
    uint64_t inc[3];
    for (int r = 0; r < 3; r++)
        inc[r] = reg_ok(&c, r, 3, r < 2 ? GRPO__ROLE__ROLE_TRAINER : GRPO__ROLE__ROLE_ROLLOUT);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    hb.rank = 1;
    hb.incarnation = inc[1];
    hb.state = GRPO__WORKER_STATE__WORKER_FAILED;
    hb.error = "CUDA out of memory";
    protocol_free(roundtrip(&c, &env, NULL));
    for (int r = 0; r < 3; r += 2) {
        Grpo__Heartbeat other = GRPO__HEARTBEAT__INIT;
        other.rank = r;
        other.incarnation = inc[r];
        other.state = GRPO__WORKER_STATE__WORKER_RUNNING;
        env.heartbeat = &other;
        Grpo__Envelope *e = roundtrip(&c, &env, NULL);
        if (!strstr(e->heartbeat_ack->abort, "trainer rank 1 on host node01 failed: CUDA out of memory"))
            fail_msg("rank %d told \"%s\" (body %d)", r, e->heartbeat_ack->abort, e->body_case);
        protocol_free(e);
    }
    core_deinit(&c);
    /* a rollout rank that fails ends nobody: its work goes to the others */
    core_init(&c, &s, T);
    for (int r = 0; r < 3; r++)
        inc[r] = reg_ok(&c, r, 3, r < 2 ? GRPO__ROLE__ROLE_TRAINER : GRPO__ROLE__ROLE_ROLLOUT);
    hb.rank = 2;
    hb.incarnation = inc[2];
    env.heartbeat = &hb;
    protocol_free(roundtrip(&c, &env, NULL));
    assert_string_equal(c.run.abort, "");
    core_deinit(&c);
}

/* A stop asked for by a worker on a signal from its launcher (mpirun ending the job) ends the run with that reason,
 * not "stopped by operator" (issue 40, item 5); a restarted grpod keeps it. */
static void test_stop_reason_names_who_asked(void **state)
{
    (void)state;
    struct core c, d;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID), i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 4);
    const char *by = "SIGTERM on rank 0 (host h0) from its launcher, mpirun (pid 7)";
    Grpo__Envelope *e = command_by(&c, GRPO__COMMAND__COMMAND_STOP, by, by);
    assert_true(e->reply->ok);
    protocol_free(e);
    char *text = core_save_json(&c);
    core_init(&d, &s, T + 1);
    char err[256];
    assert_int_equal(core_load_json(&d, text, T + 1, err, sizeof err), 0);
    free(text);
    assert_string_equal(d.run.stop_by, by);
    core_deinit(&d);
    beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_STOPPED, 4);
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_STOPPED, 4);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FINISHED);
    assert_non_null(strstr(c.run.reason, "stopped by SIGTERM on rank 0 (host h0) from its launcher, mpirun (pid 7) at "
                                         "step 4"));
    assert_null(strstr(c.run.reason, "operator"));
    core_deinit(&c);
    /* grpoctl stop --reason: the operator, with the reason */
    core_init(&c, &s, T);
    i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID), i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    e = command_by(&c, GRPO__COMMAND__COMMAND_STOP, "systemctl stop grpo-workers", "");
    protocol_free(e);
    beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_STOPPED, 0);
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_STOPPED, 0);
    assert_non_null(strstr(c.run.reason, "stopped by operator (systemctl stop grpo-workers) at step 0"));
    core_deinit(&c);
}

static void test_journal_round_trip(void **state)
{
    (void)state;
    struct core c, d;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID), i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 9);
    command_ok(&c, GRPO__COMMAND__COMMAND_PAUSE);
    command_ok(&c, GRPO__COMMAND__COMMAND_CHECKPOINT);
    char *text = core_save_json(&c);
    core_init(&d, &s, T + 50);
    char err[256];
    assert_false(memcmp(d.run.plane_key, c.run.plane_key, PLANE_KEY_BYTES) == 0); /* a fresh core's own key */
    assert_int_equal(core_load_json(&d, text, T + 50, err, sizeof err), 0);
    assert_string_equal(d.run.id, c.run.id);
    /* the run's data-plane key comes back: a replacement issued after a restart is the trainers' key's */
    assert_memory_equal(d.run.plane_key, c.run.plane_key, PLANE_KEY_BYTES);
    assert_int_equal(d.run.step, 9);
    assert_true(d.run.pause);
    assert_int_equal(d.run.checkpoint_seq, 1);
    assert_int_equal(d.run.world, 2);
    assert_int_equal(d.run.nhistory, c.run.nhistory);
    assert_int_equal(d.nevents, c.nevents);
    assert_int_equal(d.workers[1]->state, GRPO__WORKER_STATE__WORKER_RECONNECTING);
    assert_int_equal(d.workers[1]->incarnation, i1);
    assert_string_equal(d.workers[1]->host, "node01");
    /* the workers' heartbeats are recognised: no re-registration needed */
    double saved = T;
    T += 51;
    beat_ok(&d, 1, i1, GRPO__WORKER_STATE__WORKER_PAUSED, 9);
    assert_int_equal(d.workers[1]->state, GRPO__WORKER_STATE__WORKER_PAUSED);
    T = saved;
    free(text);
    /* garbage is refused and leaves the core as it was */
    struct core e;
    core_init(&e, &s, T);
    char id[CORE_NAME_MAX];
    snprintf(id, sizeof id, "%s", e.run.id);
    assert_int_equal(core_load_json(&e,
                                    "{\"format\": 1, \"run\": {\"id\": \"x\", \"world\": 1}, \"workers\": "
                                    "[{\"rank\": 5}]}",
                                    T, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "rank 5"));
    assert_string_equal(e.run.id, id);
    assert_int_equal(core_load_json(&e, "not json", T, err, sizeof err), -1);
    assert_int_equal(core_load_json(&e, "{\"format\": 99}", T, err, sizeof err), -1);
    core_deinit(&c);
    core_deinit(&d);
    core_deinit(&e);
}

/* Heartbeat of a worker that has written a checkpoint at ckpt_step on its own (no request: checkpoint_seq_done 0). */
static void beat_ckpt(struct core *c, int rank, uint64_t inc, Grpo__WorkerState st, int64_t step, int64_t ckpt_step)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    hb.rank = rank;
    hb.incarnation = inc;
    hb.state = st;
    hb.step = step;
    hb.total_steps = step;
    hb.checkpoint_step = ckpt_step;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    Grpo__Envelope *e = roundtrip(c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_HEARTBEAT_ACK);
    protocol_free(e);
}

/* A split run's final checkpoint, written by the trainers on their own schedule (nobody asked for it), is the
 * run's checkpoint; the rollout rank, which writes none, does not hold it back (issue 12, defect 14). */
static void test_checkpoint_unrequested_split(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(2, 1, 1, 1);
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 3, GRPO__ROLE__ROLE_TRAINER), i1 = reg_ok(&c, 1, 3, GRPO__ROLE__ROLE_TRAINER),
             i2 = reg_ok(&c, 2, 3, GRPO__ROLE__ROLE_ROLLOUT);
    beat_ckpt(&c, 2, i2, GRPO__WORKER_STATE__WORKER_RUNNING, 15, -1);
    beat_ckpt(&c, 1, i1, GRPO__WORKER_STATE__WORKER_RUNNING, 15, 15);
    assert_int_equal(c.run.checkpoint_step, -1); /* trainer 0 has not written it yet */
    beat_ckpt(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 15, 15);
    assert_int_equal(c.run.checkpoint_step, 15);
    beat_ckpt(&c, 2, i2, GRPO__WORKER_STATE__WORKER_FINISHED, 15, -1);
    beat_ckpt(&c, 1, i1, GRPO__WORKER_STATE__WORKER_FINISHED, 15, 15);
    beat_ckpt(&c, 0, i0, GRPO__WORKER_STATE__WORKER_FINISHED, 15, 15);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FINISHED);
    struct arena a = {0};
    Grpo__Status *st = core_status(&c, T, &a);
    assert_int_equal(st->checkpoint_step, 15);
    assert_int_equal(st->checkpoint_seq, 0);
    assert_int_equal(st->n_workers, 3);
    assert_int_equal(st->workers[0]->checkpoint_step, 15);
    assert_int_equal(st->workers[2]->checkpoint_step, -1);
    arena_free(&a);
    char *text = core_metrics_text(&c, T);
    assert_non_null(strstr(text, "grpod_run_checkpoint_step 15\n"));
    free(text);
    core_deinit(&c);
}

/* Bytes in, bytes out: the core's raw answer to raw bytes on a tcp endpoint of secret (caller frees). */
static uint8_t *tcp_raw(struct core *c, const uint8_t *buf, size_t len, const char *secret, size_t *rlen, bool *authed)
{
    bool a = false;
    uint8_t *r = core_handle_auth(c, buf, len, secret, T, rlen, &a);
    assert_non_null(r);
    if (authed)
        *authed = a;
    return r;
}

static Grpo__Envelope *decoded(const uint8_t *r, size_t rlen)
{
    char why[256];
    Grpo__Envelope *e = protocol_unpack(r, rlen, why, sizeof why);
    if (!e)
        fail_msg("reply does not decode: %s", why);
    return e;
}

static bool holds(const uint8_t *buf, size_t len, const void *what, size_t wlen)
{
    return buf && what && wlen && memmem(buf, len, what, wlen) != NULL;
}

/* A client's session with the core over tcp (hello, challenge), as proto/transport.c makes it. */
static void tcp_session(struct core *c, struct ctl_client *cl, const char *client_secret, const char *grpod_secret)
{
    ctl_client_init(cl, client_secret);
    size_t len, rlen;
    uint8_t *hello = ctl_client_hello(cl, 1, &len);
    bool authed = true;
    uint8_t *r = tcp_raw(c, hello, len, grpod_secret, &rlen, &authed);
    assert_false(authed); /* a hello proves nothing */
    assert_false(holds(hello, len, client_secret, strlen(client_secret)));
    assert_false(holds(r, rlen, grpod_secret, strlen(grpod_secret)));
    Grpo__Envelope *e = decoded(r, rlen);
    char why[300] = "";
    int rc = ctl_client_accept(cl, e, why, sizeof why);
    if (strcmp(client_secret, grpod_secret) == 0 && rc != 0)
        fail_msg("the challenge is refused: %s", why);
    if (strcmp(client_secret, grpod_secret) != 0) {
        assert_int_equal(rc, -1);
        assert_non_null(strstr(why, "authentication failed: grpod's proof"));
    }
    protocol_free(e);
    free(hello);
    free(r);
}

/* A request sealed in cl's session; *sent gets the bytes sent (caller frees), the answer opened (NULL when it was
 * refused unsealed: *refusal gets it, caller frees). */
static Grpo__Envelope *tcp_call(struct core *c, struct ctl_client *cl, Grpo__Envelope *req, const char *secret,
                                uint8_t **sent, size_t *sent_len, Grpo__Envelope **refusal)
{
    uint64_t counter;
    size_t rlen;
    *sent = ctl_client_seal(cl, req, &counter, sent_len);
    assert_non_null(*sent);
    uint8_t *r = tcp_raw(c, *sent, *sent_len, secret, &rlen, NULL);
    Grpo__Envelope *outer = decoded(r, rlen), *inner = NULL;
    *refusal = NULL;
    if (outer->body_case == GRPO__ENVELOPE__BODY_REPLY) {
        *refusal = outer;
        free(r);
        return NULL;
    }
    char why[300] = "";
    if (ctl_client_open(cl, counter, outer, &inner, why, sizeof why) != 0)
        fail_msg("the sealed answer does not open: %s", why);
    protocol_free(outer);
    free(r);
    return inner;
}

/* tcp endpoints (protocol 1.12): the secret never crosses the wire. A plain request and an older client's request
 * carrying the secret are refused; a client proves the secret by challenge-response and seals its requests, grpod
 * proves it in its challenge; a wrong secret is found out by the client (grpod's proof) and a box made without the
 * secret does not open; a sealed request replayed, in its session or after grpod forgot the session, is refused
 * and counted; the assignment's data-plane keys travel sealed. */
static void test_secret(void **state)
{
    (void)state;
    const char *secret = "s3cret-0123456789abcdefgh";
    struct core c;
    struct core_settings s = settings(1, 1, 1, 1);
    core_init(&c, &s, T);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    /* plain, and as a 1.11 client sends it: the secret itself (right or wrong), refused */
    Grpo__Envelope *e = roundtrip(&c, &env, secret);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(e->reply->error, "authentication failed"));
    protocol_free(e);
    const char *old[] = {secret, "s3cres"};
    for (int i = 0; i < 2; i++) {
        envelope_set_secret(&env, old[i]);
        e = roundtrip(&c, &env, secret);
        assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
        assert_non_null(strstr(e->reply->error, "sent the shared secret over the network"));
        assert_non_null(strstr(e->reply->error, "upgrade the client"));
        protocol_free(e);
    }
    envelope_set_secret(&env, NULL);
    assert_int_equal(c.counters.auth_failed, 3);
    /* challenge-response, then a sealed status request: answered sealed */
    struct ctl_client cl;
    tcp_session(&c, &cl, secret, secret);
    assert_true(cl.open);
    uint8_t *sent;
    size_t sent_len;
    Grpo__Envelope *refusal;
    e = tcp_call(&c, &cl, &env, secret, &sent, &sent_len, &refusal);
    assert_non_null(e);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_STATUS);
    protocol_free(e);
    assert_false(holds(sent, sent_len, secret, strlen(secret)));
    /* the same bytes again: a replay, refused and counted, not answered */
    size_t rlen;
    bool authed = true;
    uint8_t *r = tcp_raw(&c, sent, sent_len, secret, &rlen, &authed);
    assert_false(authed);
    e = decoded(r, rlen);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(e->reply->error, "a replayed request"));
    assert_false(e->reply->reauth);
    protocol_free(e);
    free(r);
    assert_int_equal(c.counters.replayed, 1);
    /* a registration: the assignment holds the data-plane keys, sealed, none of them in the bytes on the wire */
    Grpo__Envelope renv = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char *caps[] = {"trainer"};
    reg.rank = 0, reg.world_size = 2, reg.host = "t0", reg.pid = 100, reg.launch = 77;
    reg.capabilities = caps, reg.n_capabilities = 1;
    renv.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    renv.register_ = &reg;
    uint64_t counter;
    size_t alen;
    uint8_t *rsent = ctl_client_seal(&cl, &renv, &counter, &alen);
    uint8_t *ans = tcp_raw(&c, rsent, alen, secret, &rlen, &authed);
    assert_true(authed);
    Grpo__Envelope *outer = decoded(ans, rlen), *inner = NULL;
    char why[300];
    assert_int_equal(ctl_client_open(&cl, counter, outer, &inner, why, sizeof why), 0);
    assert_int_equal(inner->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(inner->assignment->plane_run_key.len, PLANE_KEY_BYTES);
    assert_int_equal(inner->assignment->plane_key.len, PLANE_KEY_BYTES);
    assert_int_equal(inner->assignment->plane_epoch, 1);
    assert_false(holds(ans, rlen, inner->assignment->plane_run_key.data, PLANE_KEY_BYTES));
    assert_false(holds(ans, rlen, inner->assignment->plane_key.data, PLANE_KEY_BYTES));
    assert_false(holds(ans, rlen, c.run.plane_key, PLANE_KEY_BYTES));
    protocol_free(inner);
    inner = NULL;
    /* the answer opened under another counter (an answer to another request) is not taken */
    assert_int_equal(ctl_client_open(&cl, counter + 1, outer, &inner, why, sizeof why), -1);
    if (inner)
        protocol_free(inner);
    protocol_free(outer);
    free(ans);
    free(rsent);
    /* a client with a wrong secret: grpod's proof fails at the client; a box it makes anyway does not open */
    struct ctl_client bad;
    tcp_session(&c, &bad, "another-secret-0123456789", secret);
    assert_false(bad.open);
    memcpy(bad.session, cl.session, sizeof bad.session); /* even in a real session's name */
    bad.open = true;
    bad.counter = 1000;
    e = tcp_call(&c, &bad, &env, secret, &rsent, &alen, &refusal);
    assert_null(e);
    assert_non_null(strstr(refusal->reply->error, "does not open"));
    protocol_free(refusal);
    free(rsent);
    assert_int_equal(c.counters.auth_failed, 4);
    /* the session still serves its own client */
    e = tcp_call(&c, &cl, &env, secret, &rsent, &alen, &refusal);
    assert_non_null(e);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_STATUS);
    protocol_free(e);
    free(rsent);
    core_deinit(&c);
    /* grpod restarted (a fresh core): the captured request names a session it does not know; the client is told
     * to authenticate again, and a fresh challenge makes a session of its own */
    core_init(&c, &s, T);
    r = tcp_raw(&c, sent, sent_len, secret, &rlen, &authed);
    assert_false(authed);
    e = decoded(r, rlen);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_true(e->reply->reauth);
    protocol_free(e);
    free(r);
    assert_int_equal(c.counters.unknown_session, 1);
    uint8_t old_session[CTL_SESSION_BYTES];
    memcpy(old_session, cl.session, sizeof old_session);
    tcp_session(&c, &cl, secret, secret);
    assert_memory_not_equal(old_session, cl.session, sizeof old_session);
    e = tcp_call(&c, &cl, &env, secret, &rsent, &alen, &refusal);
    assert_non_null(e);
    protocol_free(e);
    free(rsent);
    free(sent);
    ctl_client_wipe(&cl);
    core_deinit(&c);
}

/* Sessions are bounded: a flood of hellos forgets challenged sessions only (at most CTL_PENDING_MAX of them), never
 * a session in use; a hello of the wrong nonce size is refused. */
static void test_session_flood(void **state)
{
    (void)state;
    const char *secret = "s3cret-0123456789abcdefgh";
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    struct ctl_client cl;
    tcp_session(&c, &cl, secret, secret);
    uint8_t *sent;
    size_t sent_len;
    Grpo__Envelope *refusal;
    Grpo__Envelope *e = tcp_call(&c, &cl, &env, secret, &sent, &sent_len, &refusal);
    assert_non_null(e);
    protocol_free(e);
    free(sent);
    for (int i = 0; i < 10 * CTL_SESSIONS_MAX; i++) {
        struct ctl_client x;
        tcp_session(&c, &x, secret, secret);
        ctl_client_wipe(&x);
    }
    int sessions, pending;
    ctl_server_counts(c.ctl, &sessions, &pending);
    assert_int_equal(pending, CTL_PENDING_MAX);
    assert_int_equal(sessions, CTL_PENDING_MAX + 1);
    e = tcp_call(&c, &cl, &env, secret, &sent, &sent_len, &refusal);
    assert_non_null(e); /* the session in use survived the flood */
    protocol_free(e);
    free(sent);
    Grpo__Envelope h = GRPO__ENVELOPE__INIT;
    Grpo__AuthHello ah = GRPO__AUTH_HELLO__INIT;
    ah.client_nonce.data = (uint8_t *)"short";
    ah.client_nonce.len = 5;
    h.body_case = GRPO__ENVELOPE__BODY_AUTH_HELLO;
    h.auth_hello = &ah;
    e = roundtrip(&c, &h, secret);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(e->reply->error, "client nonce of 32 bytes"));
    protocol_free(e);
    ctl_client_wipe(&cl);
    core_deinit(&c);
}

/* Keys die with their launch (1.12): a run's first launch keeps the run's key at epoch 1; the first registration of
 * another launch makes a fresh key at epoch 2, and the keys it hands out derive from it; a rank of the launch before
 * is refused from then on; a replacement (--replace-rank, a launch of its own) joins the launch under way; the
 * epoch, the launch and the retired launches are journaled. */
static void test_launch_epochs(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(1, 1, 1, 1);
    core_init(&c, &s, T);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char *tcaps[] = {"trainer"}, *rcaps[] = {"rollout"};
    reg.world_size = 2, reg.host = "h";
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    /* launch 0xA: both ranks */
    reg.rank = 0, reg.pid = 100, reg.launch = 0xA, reg.capabilities = tcaps, reg.n_capabilities = 1;
    Grpo__Envelope *e = roundtrip(&c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(e->assignment->plane_epoch, 1);
    uint8_t key1[PLANE_KEY_BYTES];
    memcpy(key1, e->assignment->plane_run_key.data, PLANE_KEY_BYTES);
    protocol_free(e);
    reg.rank = 1, reg.pid = 101, reg.capabilities = rcaps;
    e = roundtrip(&c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(e->assignment->plane_epoch, 1);
    /* the data-plane generation (the incarnation's top bits): a rank's first registration is generation 0 */
    assert_int_equal(plane_generation(e->assignment->incarnation), 0);
    uint8_t want[PLANE_KEY_BYTES];
    plane_key_derive(
        key1, &(struct plane_id){.rank = 1, .pid = 101, .incarnation = e->assignment->incarnation, .epoch = 1}, want);
    assert_memory_equal(e->assignment->plane_key.data, want, PLANE_KEY_BYTES);
    protocol_free(e);
    /* the job ends and is launched again (launch 0xB): its first rank gets a fresh key at epoch 2 (the old holders
     * are long silent) */
    T += 60;
    reg.rank = 1, reg.pid = 201, reg.launch = 0xB;
    e = roundtrip(&c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(e->assignment->plane_epoch, 2);
    assert_memory_not_equal(c.run.plane_key, key1, PLANE_KEY_BYTES);
    plane_key_derive(c.run.plane_key,
                     &(struct plane_id){.rank = 1, .pid = 201, .incarnation = e->assignment->incarnation, .epoch = 2},
                     want);
    assert_memory_equal(e->assignment->plane_key.data, want, PLANE_KEY_BYTES);
    protocol_free(e);
    reg.rank = 0, reg.pid = 200, reg.capabilities = tcaps;
    e = roundtrip(&c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(e->assignment->plane_epoch, 2);
    assert_memory_equal(e->assignment->plane_run_key.data, c.run.plane_key, PLANE_KEY_BYTES);
    protocol_free(e);
    /* a rank of launch 0xA registering now: refused, its keys are dead */
    reg.rank = 1, reg.pid = 101, reg.launch = 0xA, reg.capabilities = rcaps;
    e = roundtrip(&c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(e->reply->error, "which a later launch has replaced"));
    protocol_free(e);
    /* the journal keeps the epoch, the launch and the retired one */
    char *text = core_save_json(&c);
    struct core back;
    core_init(&back, &s, T);
    char err[256];
    assert_int_equal(core_load_json(&back, text, T, err, sizeof err), 0);
    assert_int_equal(back.run.plane_epoch, 2);
    assert_int_equal(back.run.launch, 0xB);
    assert_int_equal(back.run.nretired, 1);
    assert_int_equal(back.run.retired[0], 0xA);
    assert_memory_equal(back.run.plane_key, c.run.plane_key, PLANE_KEY_BYTES);
    free(text);
    core_deinit(&back);
    /* rank 1 lost; its replacement, a launch of its own, joins epoch 2 */
    T += 60;
    core_tick(&c, T);
    const unsigned gen = plane_generation(c.workers[1]->incarnation);
    assert_int_equal(gen, 1); /* registered once in each launch */
    reg.rank = 1, reg.pid = 301, reg.launch = 0xC, reg.replaces = true;
    e = roundtrip(&c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(e->assignment->plane_epoch, 2);
    /* the replacement is the later generation: the dispatcher takes it as the newer process of rank 1 */
    assert_int_equal(plane_generation(e->assignment->incarnation), gen + 1);
    assert_int_equal(c.run.launch, 0xB);
    protocol_free(e);
    core_deinit(&c);
}

static void test_validation(void **state)
{
    (void)state;
    assert_true(validate_text("node-07.example", 64));
    assert_true(validate_text("gpu \xc3\xa9t\xc3\xa9", 64)); /* UTF-8 */
    assert_false(validate_text("a\nb", 64));
    assert_false(validate_text("\xc3", 64));         /* truncated */
    assert_false(validate_text("\xc0\xaf", 64));     /* overlong */
    assert_false(validate_text("\xed\xa0\x80", 64)); /* surrogate */
    assert_false(validate_text("abcdef", 5));
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    Grpo__Envelope *e = send_register(&c, 0, 1, "bad\x01host", "", 1);
    assert_non_null(strstr(e->reply->error, "register.host"));
    protocol_free(e);
    e = send_register(&c, 3, 2, "h", "", 1);
    assert_non_null(strstr(e->reply->error, "register.rank 3 is outside"));
    protocol_free(e);
    /* a message grpod does not take as a request */
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Reply r = GRPO__REPLY__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_REPLY;
    env.reply = &r;
    e = roundtrip(&c, &env, NULL);
    assert_non_null(strstr(e->reply->error, "'reply' is not a request"));
    protocol_free(e);
    assert_int_equal(c.counters.invalid, 2);
    assert_int_equal(c.counters.unexpected, 1);
    core_deinit(&c);
}

static void test_status_and_metrics(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 1, GRPO__ROLE__ROLE_HYBRID);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    Grpo__Metric m1 = GRPO__METRIC__INIT, m2 = GRPO__METRIC__INIT, *mp[2] = {&m1, &m2};
    m1.name = "actor/pg_loss";
    m1.value = NAN;
    m2.name = "perf/\"throughput\"";
    m2.value = 12.5;
    hb.incarnation = i0;
    hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
    hb.step = 2;
    hb.metrics = mp;
    hb.n_metrics = 2;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    protocol_free(roundtrip(&c, &env, NULL));
    char *text = core_metrics_text(&c, T);
    assert_non_null(strstr(text, "grpo_run_metric{name=\"actor/pg_loss\"} NaN\n"));
    assert_non_null(strstr(text, "grpo_run_metric{name=\"perf/\\\"throughput\\\"\"} 12.5\n"));
    assert_non_null(strstr(text, "# TYPE grpod_requests_total counter\n"));
    assert_non_null(strstr(text, "grpod_run_state{state=\"running\"} 1\n"));
    free(text);
    struct arena a = {0};
    Grpo__Status *st = core_status(&c, T + 1.5, &a);
    assert_int_equal(st->n_workers, 1);
    assert_true(fabs(st->workers[0]->last_heartbeat_age_s - 1.5) < 1e-9);
    assert_int_equal(st->n_metrics, 2);
    arena_free(&a);
    core_deinit(&c);
}

/* ---- the hang verdict (proto/hang.h) from the registry: a rank that never registered, named with the host the
 * others' registrations gave (1.16); a laggard from the heartbeats' waits and layer, its wait growing with grpod's
 * clock; the verdict first in the status and in grpod_run_hang ---- */

static Grpo__Envelope *register_with_hosts(struct core *c, int rank, int world, char **hosts)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char *caps[] = {"rollout", "trainer"}, *dev[] = {"cpu"};
    reg.rank = rank;
    reg.world_size = world;
    reg.host = hosts[rank];
    reg.pid = 100 + rank;
    reg.config_digest = 42;
    reg.capabilities = caps;
    reg.n_capabilities = 2;
    reg.devices = dev;
    reg.n_devices = 1;
    reg.world_host_names = hosts;
    reg.n_world_host_names = (size_t)world;
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    return roundtrip(c, &env, NULL);
}

/* A heartbeat of rank `rank` in phase update_actor: in an open all-reduce #7 of dp (ranks 0-1) for wait_s, or (wait_s
 * 0) in no wait at layer `layer` of the backward pass. */
static void hang_beat(struct core *c, int rank, uint64_t inc, double wait_s, int layer)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    Grpo__FlightEntry cur = GRPO__FLIGHT_ENTRY__INIT;
    cur.kind = "collective";
    cur.op = "all-reduce";
    cur.group = "dp";
    cur.members = "0-1";
    cur.group_size = 2;
    cur.seq = 7;
    cur.peer = -1;
    cur.phase = GRPO__PHASE__PHASE_UPDATE_ACTOR;
    cur.layer = -1;
    cur.began = 1.8e9;
    cur.seconds = wait_s;
    cur.open = true;
    hb.rank = rank;
    hb.incarnation = inc;
    hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
    hb.step = 3;
    hb.phase = GRPO__PHASE__PHASE_UPDATE_ACTOR;
    hb.checkpoint_step = -1;
    if (wait_s > 0)
        hb.current_wait = &cur;
    hb.layer_plus_one = layer + 1;
    hb.backward = true;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    protocol_free(roundtrip(c, &env, NULL));
}

/* The status's first finding at time now: its kind into kind[], its text into text[]. */
static void first_finding(struct core *c, double now, char *kind, char *text, size_t len)
{
    struct arena a = {0};
    Grpo__Status *st = core_status(c, now, &a);
    assert_true(st->n_diagnosis >= 1);
    snprintf(kind, 32, "%s", st->diagnosis[0]->kind);
    snprintf(text, len, "%s", st->diagnosis[0]->text);
    arena_free(&a);
}

static void test_hang_verdict(void **state)
{
    (void)state;
    char kind[32], text[1024];
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    s.hang_wait_s = 30;
    core_init(&c, &s, T);
    char *hosts[] = {"node-a", "node-b", "node-c"};
    Grpo__Envelope *e = register_with_hosts(&c, 0, 3, hosts);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    protocol_free(e);
    e = register_with_hosts(&c, 1, 3, hosts);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    protocol_free(e);
    first_finding(&c, T + 5, kind, text, sizeof text); /* start-up is young: no hang */
    assert_true(strncmp(kind, "hang_", 5) != 0);
    first_finding(&c, T + 40, kind, text, sizeof text);
    assert_string_equal(kind, "hang_unregistered");
    if (!strstr(text, "start-up waits for rank 2 (host node-c), which never registered: 2 rank(s) registered"))
        fail_msg("%s", text);
    char *m = core_metrics_text(&c, T + 40);
    assert_non_null(strstr(m, "grpod_run_hang{kind=\"unregistered\"} 1\n"));
    assert_non_null(strstr(m, "grpod_run_hang{kind=\"laggard\"} 0\n"));
    free(m);
    core_deinit(&c);

    /* a laggard: rank 0 waits in dp's all-reduce #7, rank 1 computes in layer 12's backward */
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID), i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    hang_beat(&c, 0, i0, 40, -1);
    hang_beat(&c, 1, i1, 0, 12);
    first_finding(&c, T, kind, text, sizeof text);
    assert_string_equal(kind, "hang_laggard");
    assert_string_equal(text, "rank 1 (host node01) has not entered all-reduce #7 of dp (rank 0 waiting there 40 s); "
                              "rank 1 is in phase update_actor, layer 12 backward, in no wait");
    first_finding(&c, T + 10, kind, text, sizeof text); /* the wait has lasted since the heartbeat too */
    assert_non_null(strstr(text, "(rank 0 waiting there 50 s)"));
    hang_beat(&c, 0, i0, 0, -1); /* the all-reduce completed: no hang */
    first_finding(&c, T + 10, kind, text, sizeof text);
    assert_true(strncmp(kind, "hang_", 5) != 0);
    core_deinit(&c);
}

/* ---- the flight recorder (1.15): the current wait in the status, grpoctl trace's and stacks' conversation ---- */

static Grpo__Envelope *flight_ask(struct core *c, Grpo__FlightRequest__What what, int rank, bool ask, uint64_t seq)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__FlightRequest q = GRPO__FLIGHT_REQUEST__INIT;
    q.what = what;
    q.rank = rank;
    q.ask = ask;
    q.seq = seq;
    env.body_case = GRPO__ENVELOPE__BODY_FLIGHT_REQUEST;
    env.flight_request = &q;
    return roundtrip(c, &env, NULL);
}

/* a heartbeat of rank 0 in an all-reduce of dp, answering trace request trace_seq and stack request stacks_seq (0:
 * none); the ack's levels come back in *trace_want and *stacks_want */
static void flight_beat(struct core *c, uint64_t inc, uint64_t trace_seq, uint64_t stacks_seq, uint64_t *trace_want,
                        uint64_t *stacks_want)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    Grpo__FlightEntry cur = GRPO__FLIGHT_ENTRY__INIT, done = GRPO__FLIGHT_ENTRY__INIT, *donep = &done;
    Grpo__FlightEntry *trace[2] = {&done, &cur};
    cur.kind = done.kind = "collective";
    cur.op = done.op = "all-reduce";
    cur.group = done.group = "dp";
    cur.members = done.members = "0-4,6-7";
    cur.group_size = done.group_size = 7;
    cur.seq = 1234;
    cur.bytes = 4096;
    cur.peer = -1;
    cur.phase = GRPO__PHASE__PHASE_UPDATE_ACTOR;
    cur.layer = 12;
    cur.backward = true;
    cur.began = 1.8e9;
    cur.seconds = 2.0;
    cur.open = true;
    done.id = 7;
    done.seq = 1233;
    done.peer = -1;
    done.layer = -1;
    done.began = 1.8e9 - 1;
    done.seconds = 0.001;
    hb.incarnation = inc;
    hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
    hb.step = 3;
    hb.checkpoint_step = -1;
    hb.current_wait = &cur;
    hb.recent_waits = &donep;
    hb.n_recent_waits = 1;
    if (trace_seq) {
        hb.trace_seq_done = trace_seq;
        hb.trace = trace;
        hb.n_trace = 2;
    }
    if (stacks_seq) {
        hb.stacks_seq_done = stacks_seq;
        hb.stacks = "grpo-worker(comm_allreduce_sum+0x42) [0x1234]\ngrpo-worker(main+0x10) [0x5678]\n";
    }
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    Grpo__Envelope *e = roundtrip(c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_HEARTBEAT_ACK);
    *trace_want = e->heartbeat_ack->trace_seq;
    *stacks_want = e->heartbeat_ack->stacks_seq;
    protocol_free(e);
}

static void test_flight_requests(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    const uint64_t inc = reg_ok(&c, 0, 1, GRPO__ROLE__ROLE_HYBRID);
    uint64_t tw, sw;
    flight_beat(&c, inc, 0, 0, &tw, &sw);
    assert_int_equal(tw, 0); /* nothing asked yet */
    assert_int_equal(sw, 0);
    /* the wait under way in the status, grown by the time since the heartbeat */
    struct arena a = {0};
    Grpo__Status *st = core_status(&c, T + 3.0, &a);
    assert_non_null(st->workers[0]->current_wait);
    assert_string_equal(st->workers[0]->current_wait->op, "all-reduce");
    assert_string_equal(st->workers[0]->current_wait->members, "0-4,6-7");
    assert_int_equal(st->workers[0]->current_wait->seq, 1234);
    assert_true(fabs(st->workers[0]->current_wait->seconds - 5.0) < 1e-9);
    assert_int_equal(st->workers[0]->n_recent_waits, 1);
    assert_int_equal(st->workers[0]->recent_waits[0]->seq, 1233);
    arena_free(&a);

    /* trace: asked, not answered; the level goes out in the ack; the answer comes with the next heartbeat */
    Grpo__Envelope *r = flight_ask(&c, GRPO__FLIGHT_REQUEST__WHAT__TRACE, 0, true, 0);
    assert_int_equal(r->body_case, GRPO__ENVELOPE__BODY_FLIGHT_REPLY);
    assert_int_equal(r->flight_reply->n_dumps, 1);
    const uint64_t seq = r->flight_reply->dumps[0]->seq;
    assert_int_equal(seq, 1);
    assert_false(r->flight_reply->dumps[0]->answered);
    protocol_free(r);
    flight_beat(&c, inc, 0, 0, &tw, &sw);
    assert_int_equal(tw, seq);
    flight_beat(&c, inc, 5, 0, &tw, &sw); /* an answer to a request never made is dropped */
    r = flight_ask(&c, GRPO__FLIGHT_REQUEST__WHAT__TRACE, 0, false, seq);
    assert_false(r->flight_reply->dumps[0]->answered);
    protocol_free(r);
    flight_beat(&c, inc, seq, 0, &tw, &sw);
    r = flight_ask(&c, GRPO__FLIGHT_REQUEST__WHAT__TRACE, 0, false, seq);
    const Grpo__FlightDump *d = r->flight_reply->dumps[0];
    assert_true(d->answered);
    assert_int_equal(d->n_trace, 2);
    assert_int_equal(d->trace[0]->id, 7);
    assert_true(d->trace[1]->open);
    assert_int_equal(d->trace[1]->layer, 12);
    assert_string_equal(d->host, "node00");
    protocol_free(r);

    /* stacks of every rank (-1), answered */
    r = flight_ask(&c, GRPO__FLIGHT_REQUEST__WHAT__STACKS, -1, true, 0);
    assert_int_equal(r->flight_reply->n_dumps, 1);
    assert_false(r->flight_reply->dumps[0]->answered);
    protocol_free(r);
    flight_beat(&c, inc, 0, 0, &tw, &sw);
    assert_int_equal(sw, 1);
    flight_beat(&c, inc, 0, sw, &tw, &sw);
    r = flight_ask(&c, GRPO__FLIGHT_REQUEST__WHAT__STACKS, -1, false, 0);
    assert_true(r->flight_reply->dumps[0]->answered);
    assert_non_null(strstr(r->flight_reply->dumps[0]->stacks, "comm_allreduce_sum"));
    protocol_free(r);

    /* refused: a rank that never registered; validated: a trace of every rank, a stack of bad text */
    r = flight_ask(&c, GRPO__FLIGHT_REQUEST__WHAT__TRACE, 3, true, 0);
    assert_int_equal(r->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_false(r->reply->ok);
    assert_non_null(strstr(r->reply->error, "no rank 3 has registered"));
    protocol_free(r);
    r = flight_ask(&c, GRPO__FLIGHT_REQUEST__WHAT__TRACE, -1, true, 0);
    assert_int_equal(r->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(r->reply->error, "flight_request.rank -1 is out of range"));
    protocol_free(r);
    core_deinit(&c);
}

/* ---- split placement: 2 trainer ranks (0, 1) and 2 rollout ranks (2, 3) ---- */

static struct core_settings split_settings(void)
{
    struct core_settings s = settings(2, 2, 1, 1);
    s.heartbeat_interval_s = 0.5; /* a rollout rank is lost after 1 s */
    s.heartbeat_timeout_s = 10.0; /* a trainer rank after 10 s */
    return s;
}

/* Register the 4 ranks of a split run and have each heartbeat once: RUNNING. */
static void start_split_run(struct core *c, uint64_t inc[4])
{
    inc[0] = reg_ok(c, 0, 4, GRPO__ROLE__ROLE_TRAINER);
    inc[1] = reg_ok(c, 1, 4, GRPO__ROLE__ROLE_TRAINER);
    inc[2] = reg_ok(c, 2, 4, GRPO__ROLE__ROLE_ROLLOUT);
    inc[3] = reg_ok(c, 3, 4, GRPO__ROLE__ROLE_ROLLOUT);
    for (int r = 0; r < 4; r++)
        beat_ok(c, r, inc[r], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    assert_int_equal(c->run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(c->run.reason, "");
}

/* A split run's core, its 4 ranks registered and heard (start_split_run) */
static void split_run(struct core *c, uint64_t inc[4])
{
    struct core_settings s = split_settings();
    core_init(c, &s, T);
    start_split_run(c, inc);
}

/* A heartbeat that must be acknowledged (not told to register again); returns a copy of its abort field. */
static void beat_abort(struct core *c, int rank, uint64_t inc, char *abort_out, size_t len)
{
    Grpo__Envelope *e = beat(c, rank, inc, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    assert_false(e->heartbeat_ack->reregister);
    snprintf(abort_out, len, "%s", e->heartbeat_ack->abort);
    protocol_free(e);
}

static Grpo__Envelope *send_replace(struct core *c, int rank)
{
    char host[32];
    snprintf(host, sizeof host, "spare%02d", rank);
    return send_register_as(c, rank, 4, host, "rollout,trainer", 42, true);
}

/* Move the clock to t, 0.5 s (the split run's interval) at a time: every rank of live[] heartbeats at each step and the
 * core ticks. */
static void run_until(struct core *c, const uint64_t inc[4], const bool live[4], double t)
{
    while (T < t - 1e-9) {
        T = T + 0.5 < t ? T + 0.5 : t;
        for (int r = 0; r < 4; r++)
            if (live[r])
                beat_ok(c, r, inc[r], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(c, T);
    }
}

static bool has_event(const struct core *c, const char *text)
{
    for (int i = 0; i < c->nevents; i++)
        if (strstr(c->events[i].text, text))
            return true;
    return false;
}

static void test_split_rollout_rank_lost(void **state)
{
    (void)state;
    struct core c;
    uint64_t inc[4];
    split_run(&c, inc);
    const double t0 = T;
    /* 0.9 s of silence: under 2 x 0.5 s, nobody is suspect */
    T = t0 + 0.9;
    beat_ok(&c, 0, inc[0], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    beat_ok(&c, 2, inc[2], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    core_tick(&c, T);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(core_worker_shown_state(c.workers[3]), GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(c.run.reason, "");
    /* 1.1 s: two intervals missed: the rollout rank and the silent trainer rank are suspect, nothing more (the
     * trainers' dispatcher has granted the rollout rank's work to the other one by now) */
    T = t0 + 1.1;
    beat_ok(&c, 0, inc[0], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    beat_ok(&c, 2, inc[2], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    core_tick(&c, T);
    assert_int_equal(core_worker_shown_state(c.workers[3]), GRPO__WORKER_STATE__WORKER_SUSPECT);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(core_worker_shown_state(c.workers[1]), GRPO__WORKER_STATE__WORKER_SUSPECT);
    assert_true(has_event(&c, "rank 3 on host node03 (pid 103) suspect: no heartbeat for 1.1 s (lost after 10.0 s)"));
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(c.run.reason, "");
    assert_int_equal(c.counters.suspects, 2);
    /* rank 1 speaks again: no longer suspect, and the journal says it was not lost */
    beat_ok(&c, 1, inc[1], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    assert_int_equal(core_worker_shown_state(c.workers[1]), GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_true(has_event(&c, "rank 1 on host node01 heard again after 1.1 s of silence (was suspect, not lost)"));
    /* rank 3 stays silent: suspect up to grpod.heartbeat_timeout_s (10 s), lost past it */
    const bool live[4] = {true, true, true, false};
    run_until(&c, inc, live, t0 + 10.0);
    assert_int_equal(core_worker_shown_state(c.workers[3]), GRPO__WORKER_STATE__WORKER_SUSPECT);
    assert_int_equal(c.counters.suspects, 2); /* said once */
    run_until(&c, inc, live, t0 + 10.1);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(core_worker_shown_state(c.workers[3]), GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_non_null(
        strstr(c.events[c.nevents - 1].text, "rank 3 on host node03 (pid 103) lost: no heartbeat for 10.1 s"));
    assert_int_equal(c.counters.losses, 1);
    /* the others heartbeat: the run goes on without rank 3, and says how to replace it */
    for (int r = 0; r < 3; r++) {
        Grpo__Envelope *e = beat(&c, r, inc[r], GRPO__WORKER_STATE__WORKER_RUNNING, 2);
        const Grpo__HeartbeatAck *ack = e->heartbeat_ack;
        assert_false(ack->reregister);
        assert_int_equal(ack->run_state, GRPO__RUN_STATE__RUN_RUNNING);
        assert_false(ack->stop);
        assert_string_equal(ack->abort, ""); /* a lost rollout rank ends nobody */
        assert_non_null(strstr(ack->reason, "rollout rank 3"));
        protocol_free(e);
    }
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_non_null(strstr(c.run.reason, "rollout rank 3 on host node03 lost"));
    assert_non_null(strstr(c.run.reason, "--replace-rank 3"));
    assert_int_equal(c.run.step, 2);
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_LOST);
    core_deinit(&c);
}

/* Issue 40 item 9: with other work on the cores a rollout rank's heartbeats stop for 6 s, then come again. It was
 * lost after two intervals (2 s) and back 4 s later, tripping the grpod_workers{state="lost"} > 0 alert with no
 * fault. Loss now needs grpod.heartbeat_timeout_s of silence (10 s here, the default): a rank that speaks again
 * before that was never lost. grpod ticks every 0.25 s, as it does; the others heartbeat every second. */
static void test_stalled_rollout_rank_not_lost(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(2, 2, 1, 1);
    s.heartbeat_interval_s = 1.0;
    s.heartbeat_timeout_s = 10.0;
    core_init(&c, &s, T);
    uint64_t inc[4];
    start_split_run(&c, inc);
    const double t0 = T;
    for (int k = 1; k <= 24; k++) { /* 6 s, rank 3 silent */
        T = t0 + 0.25 * k;
        if (k % 4 == 0)
            for (int r = 0; r < 3; r++)
                beat_ok(&c, r, inc[r], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
        if (c.workers[3]->state == GRPO__WORKER_STATE__WORKER_LOST)
            fail_msg("rank 3 taken for lost after %.2f s of silence (grpod.heartbeat_timeout_s 10 s)", T - t0);
        char *m = core_metrics_text(&c, T);
        assert_non_null(strstr(m, "grpod_workers{state=\"lost\"} 0\n"));
        free(m);
        assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
        assert_string_equal(c.run.reason, "");
    }
    beat_ok(&c, 3, inc[3], GRPO__WORKER_STATE__WORKER_RUNNING, 1); /* its reports come again */
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(c.run.reason, "");
    for (int i = 0; i < c.nevents; i++)
        if (strstr(c.events[i].text, ") lost: "))
            fail_msg("a loss in the journal: %s", c.events[i].text);
    core_deinit(&c);
}

/* A heartbeat with the worker's own count and clock (Heartbeat.seq, sent_s). */
static void beat_seq(struct core *c, int rank, uint64_t inc, uint64_t seq, double sent_s, uint32_t unanswered)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    hb.rank = rank;
    hb.incarnation = inc;
    hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
    hb.step = 1;
    hb.checkpoint_step = -1;
    hb.seq = seq;
    hb.sent_s = sent_s;
    hb.unanswered = unanswered;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    Grpo__Envelope *e = roundtrip(c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_HEARTBEAT_ACK);
    assert_false(e->heartbeat_ack->reregister);
    protocol_free(e);
}

/* The heartbeat after a silence says, by the worker's own count and clock, whether the worker stalled (it sent
 * nothing) or its heartbeats were held up on the way (sent, never heard); suspect is shown in status and metrics
 * and ends with the heartbeat. */
static void test_suspect_and_the_workers_own_account(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1); /* interval 1 s, timeout 5 s */
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID), i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    const double w0 = 500.0; /* rank 1's own clock */
    beat_seq(&c, 1, i1, 5, w0, 0);
    const double t0 = T;
    /* 3 s of silence, by grpod's ticks: suspect after 2 s, shown as such */
    for (int k = 1; k <= 12; k++) {
        T = t0 + 0.25 * k;
        beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
        assert_int_equal(core_worker_shown_state(c.workers[1]),
                         T - t0 > 2.0 ? GRPO__WORKER_STATE__WORKER_SUSPECT : GRPO__WORKER_STATE__WORKER_RUNNING);
    }
    struct arena a = {0};
    Grpo__Status *st = core_status(&c, T, &a);
    assert_int_equal(st->workers[1]->worker_state, GRPO__WORKER_STATE__WORKER_SUSPECT);
    assert_string_equal(st->workers[1]->state, "suspect");
    assert_int_equal(st->workers[0]->worker_state, GRPO__WORKER_STATE__WORKER_RUNNING);
    arena_free(&a);
    char *m = core_metrics_text(&c, T);
    assert_non_null(strstr(m, "grpod_workers{state=\"suspect\"} 1\n"));
    assert_non_null(strstr(m, "grpod_workers{state=\"lost\"} 0\n"));
    assert_non_null(strstr(m, "grpod_workers{state=\"running\"} 1\n"));
    assert_non_null(strstr(m, "grpod_worker_up{rank=\"1\",host=\"node01\",role=\"hybrid\",state=\"suspect\"} 1\n"));
    assert_non_null(strstr(m, "grpod_worker_suspects_total 1\n"));
    free(m);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    /* (a) its next heartbeat follows the one before (seq 6 after 5), sent 3 s later by its own clock: it stalled */
    beat_seq(&c, 1, i1, 6, w0 + 3.0, 0);
    assert_int_equal(core_worker_shown_state(c.workers[1]), GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_non_null(strstr(c.events[c.nevents - 1].text,
                           "rank 1 on host node01 heard again after 3.0 s of silence (was suspect, not lost): by its "
                           "own clock it sent nothing for 3.0 s and none was lost on the way: the worker itself was "
                           "stalled"));
    /* (b) silent 3.5 s again, then seq 10: three heartbeats it sent never reached grpod */
    const double t1 = T;
    for (int k = 1; k <= 14; k++) {
        T = t1 + 0.25 * k;
        beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
    }
    assert_int_equal(core_worker_shown_state(c.workers[1]), GRPO__WORKER_STATE__WORKER_SUSPECT);
    beat_seq(&c, 1, i1, 10, w0 + 6.4, 0);
    assert_non_null(strstr(c.events[c.nevents - 1].text,
                           "heard again after 3.5 s of silence (was suspect, not lost): 3 heartbeat(s) it sent in that "
                           "time never reached grpod (it sent this one 3.4 s after the one before, by its own clock): "
                           "they were held up or dropped on the way"));
    /* (c) and one sent right after the one before but heard 3 s later: held up on the way */
    const double t2 = T;
    for (int k = 1; k <= 12; k++) {
        T = t2 + 0.25 * k;
        beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
    }
    beat_seq(&c, 1, i1, 11, w0 + 6.6, 0);
    assert_non_null(strstr(c.events[c.nevents - 1].text,
                           "it sent this heartbeat 0.2 s after the one before, by its own "
                           "clock, and none was lost: it was held up on the way"));
    /* (d) seq 12 after 11, 3 s later, after two tries that had no answer in time: it was backing off */
    const double t4 = T;
    for (int k = 1; k <= 12; k++) {
        T = t4 + 0.25 * k;
        beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
    }
    beat_seq(&c, 1, i1, 12, w0 + 9.6, 2);
    assert_non_null(strstr(c.events[c.nevents - 1].text,
                           "its last 2 heartbeat(s) had no answer in time and it waited to try again (it sent this one "
                           "3.0 s after the one before, by its own clock): grpod, or the way to it, was slow"));
    /* (e) silent past the timeout: lost, and the heartbeat after it says the same of the gap */
    const double t3 = T;
    for (int k = 1; k <= 24; k++) {
        T = t3 + 0.25 * k;
        beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
    }
    assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(core_worker_shown_state(c.workers[1]), GRPO__WORKER_STATE__WORKER_LOST);
    beat_seq(&c, 1, i1, 13, w0 + 15.6, 0);
    assert_true(has_event(&c, "rank 1 on host node01 is back after 6.0 s of silence: by its own clock it sent nothing "
                              "for 6.0 s"));
    /* an older worker's heartbeats carry no count: the journal says only the silence */
    const double t5 = T;
    for (int k = 1; k <= 12; k++) {
        T = t5 + 0.25 * k;
        beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
    }
    beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    assert_true(has_event(&c, "rank 1 on host node01 heard again after 3.0 s of silence (was suspect, not lost)"));
    assert_null(strstr(c.events[c.nevents - 1].text, "own clock"));
    core_deinit(&c);
}

/* grpod's own loop did not run for 8 s (a loaded host: the tick comes late), with heartbeats waiting in its socket:
 * the first tick after it finds every worker silent for 8 s, past the 5 s timeout. That time is grpod's, not the
 * workers': nobody is lost, and the heartbeats read after the tick find them running. A worker that really died is
 * still lost, once it has been silent for the timeout in grpod's running time. */
static void test_grpod_own_pause_is_not_silence(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1); /* interval 1 s, timeout 5 s */
    s.tick_s = 0.25;
    core_init(&c, &s, T);
    uint64_t i0 = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID), i1 = reg_ok(&c, 1, 2, GRPO__ROLE__ROLE_HYBRID);
    const double t0 = T;
    for (int k = 1; k <= 8; k++) { /* 2 s of ordinary ticks */
        T = t0 + 0.25 * k;
        if (k % 4 == 0) {
            beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
            beat_ok(&c, 1, i1, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        }
        core_tick(&c, T);
    }
    assert_true(c.stalled_s == 0);
    const double t1 = T;
    T = t1 + 8.0; /* grpod did not run */
    core_tick(&c, T);
    assert_int_equal(c.workers[0]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(core_worker_shown_state(c.workers[0]), GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_true(fabs(c.stalled_s - 7.75) < 1e-9);
    assert_true(has_event(&c, "grpod's own loop did not run for 7.8 s (a loaded or stopped host): that time is not "
                              "counted as any worker's silence"));
    char *m = core_metrics_text(&c, T);
    assert_non_null(strstr(m, "grpod_loop_stall_seconds_total 7.750\n"));
    assert_non_null(strstr(m, "grpod_workers{state=\"lost\"} 0\n"));
    free(m);
    /* rank 0's heartbeat, read after the tick; rank 1 has died meanwhile and says nothing more */
    beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    const double t2 = T;
    double lost_at = 0;
    for (int k = 1; k <= 40 && !lost_at; k++) {
        T = t2 + 0.25 * k;
        if (k % 4 == 0)
            beat_ok(&c, 0, i0, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
        if (c.workers[1]->state == GRPO__WORKER_STATE__WORKER_LOST)
            lost_at = T;
    }
    /* silent since t1 in grpod's time: 0.25 s counted at the late tick, so lost once 4.75 s more have passed */
    if (!(lost_at > t2 + 4.75 - 1e-9 && lost_at <= t2 + 5.0 + 1e-9))
        fail_msg("rank 1 lost %.2f s after grpod ran again (4.75 to 5 expected)", lost_at - t2);
    assert_int_equal(c.workers[0]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_true(has_event(&c, "rank 1 on host node01 (pid 101) lost: no heartbeat for 13.0 s (7.8 s of it grpod "
                              "itself did not run)"));
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_WAITING);
    /* ticks that are only late (a busy loop, 0.9 s apart: under four ticks) count in full */
    const double t3 = T;
    for (int k = 1; k <= 4; k++) {
        T = t3 + 0.9 * k;
        core_tick(&c, T);
    }
    assert_true(fabs(c.stalled_s - 7.75) < 1e-9);
    core_deinit(&c);
}

/* The trainers finished while a rollout rank is still on its way out (it missed their last word): training is over,
 * the run is finished, and that rank's next heartbeat says so (it ends on it); a rollout rank finishing first ends
 * nothing. */
static void test_split_trainers_finished_end_run(void **state)
{
    (void)state;
    struct core c;
    uint64_t inc[4];
    split_run(&c, inc);
    beat_ok(&c, 2, inc[2], GRPO__WORKER_STATE__WORKER_FINISHED, 5); /* a rollout rank first: training goes on */
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    beat_ok(&c, 0, inc[0], GRPO__WORKER_STATE__WORKER_FINISHED, 5);
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING); /* one trainer of two */
    beat_ok(&c, 1, inc[1], GRPO__WORKER_STATE__WORKER_FINISHED, 5);
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FINISHED);
    assert_string_equal(c.run.reason, "training finished at step 5");
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    Grpo__Envelope *e = beat(&c, 3, inc[3], GRPO__WORKER_STATE__WORKER_RUNNING, 5);
    assert_int_equal(e->heartbeat_ack->run_state, GRPO__RUN_STATE__RUN_FINISHED);
    assert_false(e->heartbeat_ack->reregister);
    assert_string_equal(e->heartbeat_ack->abort, "");
    protocol_free(e);
    beat_ok(&c, 3, inc[3], GRPO__WORKER_STATE__WORKER_FINISHED, 5); /* it ends; the run stays finished */
    core_tick(&c, T);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FINISHED);
    core_deinit(&c);
}

/* Every rollout rank lost: the run goes on for the trainers, but status says that no rollout rank is left and that
 * the run waits for replacements (not that the work goes to the others); one replacement, and the text is the
 * usual one for the rank still lost. */
static void test_split_every_rollout_rank_lost(void **state)
{
    (void)state;
    struct core c;
    uint64_t inc[4];
    split_run(&c, inc);
    const double t0 = T;
    /* rank 3 is lost first (10 s of silence): the other rollout rank takes its work */
    const bool live3[4] = {true, true, true, false}, live2[4] = {true, true, false, false};
    run_until(&c, inc, live3, t0 + 10.1);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_non_null(strstr(c.run.reason, "its work goes to the other rollout ranks"));
    /* then rank 2: nobody is left to generate */
    run_until(&c, inc, live2, t0 + 20.2);
    assert_int_equal(c.workers[2]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_LOST);
    if (strstr(c.run.reason, "goes to the other rollout ranks") || !strstr(c.run.reason, "no rollout rank is left") ||
        !strstr(c.run.reason, "waits for replacements") ||
        !strstr(c.run.reason, "2 on host node02, 3 on host node03") || !strstr(c.run.reason, "--replace-rank"))
        fail_msg("status with every rollout rank lost: '%s'", c.run.reason);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    Grpo__Envelope *e = beat(&c, 0, inc[0], GRPO__WORKER_STATE__WORKER_RUNNING, 2);
    assert_non_null(strstr(e->heartbeat_ack->reason, "no rollout rank is left"));
    assert_string_equal(e->heartbeat_ack->abort, ""); /* the trainers are not told to end */
    protocol_free(e);
    /* a replacement for rank 2: rank 3's work goes to it again */
    e = send_replace(&c, 2);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    uint64_t inc2 = e->assignment->incarnation;
    protocol_free(e);
    beat_ok(&c, 2, inc2, GRPO__WORKER_STATE__WORKER_RUNNING, 2);
    assert_non_null(
        strstr(c.run.reason, "rollout rank 3 on host node03 lost; its work goes to the other rollout ranks"));
    core_deinit(&c);
}

static void test_split_trainer_lost_aborts(void **state)
{
    (void)state;
    struct core c;
    uint64_t inc[4];
    split_run(&c, inc);
    const double t0 = T;
    const int others[3] = {0, 2, 3};
    char abort_text[CORE_REASON_MAX];
    /* rank 1 falls silent; the others heartbeat every 0.5 s: up to 9.5 s, nobody is told anything */
    for (int k = 1; k <= 19; k++) {
        T = t0 + 0.5 * k;
        for (int i = 0; i < 3; i++) {
            beat_abort(&c, others[i], inc[others[i]], abort_text, sizeof abort_text);
            assert_string_equal(abort_text, "");
        }
        core_tick(&c, T);
        assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
        assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    }
    T = t0 + 10.5;
    for (int i = 0; i < 3; i++)
        beat_ok(&c, others[i], inc[others[i]], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    core_tick(&c, T);
    assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_non_null(strstr(c.run.abort, "trainer rank 1 on host node01 lost"));
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_WAITING);
    assert_non_null(strstr(c.run.reason, "trainer rank 1 on host node01 lost"));
    assert_non_null(strstr(c.run.reason, "relaunch the job"));
    /* every other rank, trainer or rollout, is told to end, naming the lost trainer */
    for (int i = 0; i < 3; i++) {
        Grpo__Envelope *e = beat(&c, others[i], inc[others[i]], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        const Grpo__HeartbeatAck *ack = e->heartbeat_ack;
        assert_false(ack->reregister);
        assert_int_equal(ack->run_state, GRPO__RUN_STATE__RUN_WAITING);
        assert_non_null(strstr(ack->abort, "trainer rank 1"));
        assert_non_null(strstr(ack->abort, "lost"));
        assert_non_null(strstr(ack->reason, "relaunch the job"));
        protocol_free(e);
    }
    /* the rollout ranks are not lost for the time the run waits: they keep being told */
    T += 0.4;
    core_tick(&c, T);
    beat_abort(&c, 3, inc[3], abort_text, sizeof abort_text);
    assert_non_null(strstr(abort_text, "trainer rank 1"));
    /* the relaunched job's rollout rank may register before its trainers: it is not told to end (the old job's
     * rank 3, silent since, no longer holds the rank: silent past two intervals and half a second) */
    T += 3.0;
    core_tick(&c, T);
    Grpo__Envelope *r3 = send_register(&c, 3, 4, "node13", "rollout", 42);
    assert_int_equal(r3->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    const uint64_t inc3 = r3->assignment->incarnation;
    protocol_free(r3);
    beat_abort(&c, 3, inc3, abort_text, sizeof abort_text);
    assert_string_equal(abort_text, "");
    beat_abort(&c, 0, inc[0], abort_text, sizeof abort_text); /* the old job's trainer still is */
    assert_non_null(strstr(abort_text, "trainer rank 1"));
    inc[3] = inc3;
    /* the relaunched job: a fresh registration of the trainer (no incarnation) ends the abort */
    Grpo__Envelope *e = send_register(&c, 1, 4, "node11", "trainer", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(e->assignment->role, GRPO__ROLE__ROLE_TRAINER);
    uint64_t inc1 = e->assignment->incarnation;
    assert_true(inc1 != inc[1]);
    protocol_free(e);
    assert_string_equal(c.run.abort, "");
    for (int i = 0; i < 3; i++) {
        beat_abort(&c, others[i], inc[others[i]], abort_text, sizeof abort_text);
        assert_string_equal(abort_text, "");
    }
    beat_abort(&c, 1, inc1, abort_text, sizeof abort_text);
    assert_string_equal(abort_text, "");
    assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(c.run.reason, "");
    core_deinit(&c);
}

/* A rank told to end (a trainer lost) says so in its last heartbeat, as stopped and why (control.c tell_ending):
 * grpod's events name its end, the run still waits for the relaunch, and its silence after is no loss. */
static void test_split_rank_ends_as_told(void **state)
{
    (void)state;
    struct core c;
    uint64_t inc[4];
    split_run(&c, inc);
    const double t0 = T;
    const bool live[4] = {true, false, true, true};
    run_until(&c, inc, live, t0 + 10.5);
    assert_int_equal(c.workers[1]->state, GRPO__WORKER_STATE__WORKER_LOST);
    char abort_text[CORE_REASON_MAX];
    beat_abort(&c, 3, inc[3], abort_text, sizeof abort_text);
    assert_non_null(strstr(abort_text, "trainer rank 1 on host node01 lost"));
    char why[CORE_REASON_MAX + 32];
    snprintf(why, sizeof why, "ended as grpod said: %s", abort_text);
    protocol_free(beat_why(&c, 3, inc[3], GRPO__WORKER_STATE__WORKER_STOPPED, 1, why));
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_STOPPED);
    assert_true(has_event(&c, "rank 3 on host node03 stopped at step 1: ended as grpod said: trainer rank 1 on host "
                              "node01 lost"));
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_WAITING);
    assert_non_null(strstr(c.run.reason, "relaunch the job"));
    /* silent from then on: not found lost */
    const bool rest[4] = {true, false, true, false};
    run_until(&c, inc, rest, T + 20.0);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_STOPPED);
    assert_false(has_event(&c, "rank 3 on host node03 (pid 103) lost"));
    core_deinit(&c);
}

static void test_replace_rank(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = split_settings();
    /* (d) no run under way: nothing to replace, and nothing registered */
    core_init(&c, &s, T);
    Grpo__Envelope *e = send_replace(&c, 3);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_false(e->reply->ok);
    assert_false(e->reply->retry);
    assert_non_null(strstr(e->reply->error, "rank 3 cannot be replaced"));
    assert_non_null(strstr(e->reply->error, "not under way"));
    protocol_free(e);
    assert_int_equal(c.nworkers, 0);
    assert_int_equal(c.run.world, 0);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_WAITING);

    uint64_t inc[4];
    start_split_run(&c, inc);
    /* (a) rank 3 is alive: refused for now, the replacement may retry */
    e = send_replace(&c, 3);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_false(e->reply->ok);
    assert_true(e->reply->retry);
    assert_non_null(strstr(e->reply->error, "rank 3 is not lost"));
    protocol_free(e);
    assert_int_equal(c.workers[3]->incarnation, inc[3]);
    assert_int_equal(c.workers[3]->pid, 103);
    beat_ok(&c, 3, inc[3], GRPO__WORKER_STATE__WORKER_RUNNING, 1); /* the holder carries on */

    /* (b) rank 3 falls silent: suspect, it may be only stalled, and is not replaced; lost, the replacement takes its
     * place */
    const double t0 = T;
    const bool live[4] = {true, true, true, false};
    run_until(&c, inc, live, t0 + 1.2);
    assert_int_equal(core_worker_shown_state(c.workers[3]), GRPO__WORKER_STATE__WORKER_SUSPECT);
    e = send_replace(&c, 3);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_true(e->reply->retry);
    assert_non_null(strstr(e->reply->error, "rank 3 is not lost (pid 103 on host node03, suspect)"));
    protocol_free(e);
    run_until(&c, inc, live, t0 + 10.2);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_LOST);
    e = send_replace(&c, 3);
    if (e->body_case != GRPO__ENVELOPE__BODY_ASSIGNMENT)
        fail_msg("replacement refused: %s", e->body_case == GRPO__ENVELOPE__BODY_REPLY ? e->reply->error : "?");
    const Grpo__Assignment *a = e->assignment;
    assert_int_equal(a->role, GRPO__ROLE__ROLE_ROLLOUT);
    assert_int_equal(a->dp_rank, 1);
    assert_int_equal(a->dp_size, 2);
    assert_int_equal(a->world_size, 4);
    assert_string_equal(a->run_id, c.run.id);
    assert_string_not_equal(a->dispatch_endpoint, "");
    assert_non_null(strstr(a->dispatch_endpoint, "-dispatch.sock"));
    assert_int_equal(a->n_trainer_endpoints, 2);
    uint64_t inc3 = a->incarnation;
    assert_true(inc3 != 0 && inc3 != inc[3]);
    protocol_free(e);
    assert_int_equal(c.workers[3]->pid, 103);
    assert_string_equal(c.workers[3]->host, "spare03");
    /* the old process's heartbeats are no longer recognised; the replacement's are */
    e = beat(&c, 3, inc[3], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    assert_true(e->heartbeat_ack->reregister);
    protocol_free(e);
    e = beat(&c, 3, inc3, GRPO__WORKER_STATE__WORKER_RUNNING, 1);
    assert_false(e->heartbeat_ack->reregister);
    assert_int_equal(e->heartbeat_ack->run_state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(e->heartbeat_ack->abort, "");
    protocol_free(e);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    core_tick(&c, T);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_RUNNING);
    assert_string_equal(c.run.reason, "");
    /* a replacement for a rank that has just been replaced: it is alive again */
    e = send_replace(&c, 3);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_true(e->reply->retry);
    assert_non_null(strstr(e->reply->error, "not lost"));
    protocol_free(e);
    assert_int_equal(c.workers[3]->incarnation, inc3);

    /* (c) trainer rank 0 is lost (silent past the 10 s timeout): it cannot be replaced */
    inc[3] = inc3;
    const double t1 = T;
    for (int k = 1; k <= 21; k++) {
        T = t1 + 0.5 * k;
        for (int r = 1; r < 4; r++)
            beat_ok(&c, r, inc[r], GRPO__WORKER_STATE__WORKER_RUNNING, 1);
        core_tick(&c, T);
    }
    assert_int_equal(c.workers[0]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_RUNNING);
    e = send_replace(&c, 0);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_false(e->reply->ok);
    assert_false(e->reply->retry);
    assert_non_null(strstr(e->reply->error, "rank 0 is a trainer"));
    protocol_free(e);
    assert_int_equal(c.workers[0]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(c.workers[0]->incarnation, inc[0]);
    core_deinit(&c);

    /* (d) the run is finished: no replacement, and no new run begun by one */
    core_init(&c, &s, T);
    start_split_run(&c, inc);
    run_until(&c, inc, live, T + 10.2); /* rank 3 lost, the others finish */
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_LOST);
    for (int r = 0; r < 3; r++)
        beat_ok(&c, r, inc[r], GRPO__WORKER_STATE__WORKER_FINISHED, 100);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FINISHED);
    char id[CORE_NAME_MAX];
    snprintf(id, sizeof id, "%s", c.run.id);
    e = send_replace(&c, 3);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_false(e->reply->ok);
    assert_false(e->reply->retry);
    assert_non_null(strstr(e->reply->error, "rank 3 cannot be replaced"));
    assert_non_null(strstr(e->reply->error, "finished"));
    protocol_free(e);
    assert_int_equal(c.run.state, GRPO__RUN_STATE__RUN_FINISHED);
    assert_string_equal(c.run.id, id);
    assert_int_equal(c.workers[3]->state, GRPO__WORKER_STATE__WORKER_LOST);
    assert_int_equal(c.workers[3]->incarnation, inc[3]);
    core_deinit(&c);
}

static void test_dispatch_endpoints(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = split_settings();
    /* ipc (the default base): trainer rank 0 binds PREFIX-dispatch.sock, the rollout ranks connect to it */
    core_init(&c, &s, T);
    Grpo__Envelope *e = send_register(&c, 0, 4, "t0", "trainer", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    char want[CORE_REASON_MAX];
    snprintf(want, sizeof want, "ipc://~run/grpo-%s-dispatch.sock", e->assignment->run_id);
    assert_string_equal(e->assignment->dispatch_endpoint, want);
    snprintf(want, sizeof want, "ipc://~run/grpo-%s-dp0.sock", e->assignment->run_id);
    assert_string_equal(e->assignment->data_pull_endpoint, want);
    protocol_free(e);
    e = send_register(&c, 1, 4, "t1", "trainer", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_int_equal(e->assignment->dp_rank, 1);
    assert_string_equal(e->assignment->dispatch_endpoint, ""); /* only DP rank 0 runs the dispatcher */
    assert_non_null(strstr(e->assignment->data_pull_endpoint, "-dp1.sock"));
    protocol_free(e);
    snprintf(want, sizeof want, "ipc://~run/grpo-%s-dispatch.sock", c.run.id);
    for (int r = 2; r < 4; r++) {
        e = send_register(&c, r, 4, "r", "rollout", 42);
        assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
        assert_int_equal(e->assignment->role, GRPO__ROLE__ROLE_ROLLOUT);
        assert_string_equal(e->assignment->dispatch_endpoint, want);
        assert_string_equal(e->assignment->data_pull_endpoint, "");
        protocol_free(e);
    }
    core_deinit(&c);

    /* tcp: the dispatcher's port follows the 2 data ports; trainer rank 0 binds *, the rollout ranks dial its host */
    s.data_endpoint = "tcp://10.0.0.1:7000";
    core_init(&c, &s, T);
    e = send_register(&c, 0, 4, "t0", "trainer", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_string_equal(e->assignment->dispatch_endpoint, "tcp://*:7002");
    assert_string_equal(e->assignment->data_pull_endpoint, "tcp://*:7000");
    protocol_free(e);
    e = send_register(&c, 1, 4, "t1", "trainer", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_string_equal(e->assignment->dispatch_endpoint, "");
    assert_string_equal(e->assignment->data_pull_endpoint, "tcp://*:7001");
    protocol_free(e);
    e = send_register(&c, 2, 4, "r2", "rollout", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    assert_string_equal(e->assignment->dispatch_endpoint, "tcp://t0:7002");
    assert_int_equal(e->assignment->n_trainer_endpoints, 2);
    assert_string_equal(e->assignment->trainer_endpoints[0], "tcp://t0:7000");
    assert_string_equal(e->assignment->trainer_endpoints[1], "tcp://t1:7001");
    assert_string_equal(e->assignment->data_push_endpoint, "tcp://t0:7000"); /* rollout DP 0 -> trainer DP 0 */
    protocol_free(e);
    core_deinit(&c);
}

/* No grpod.data_endpoint and a run whose ranks span hosts (Register.world_hosts 2): TCP endpoints on a port chosen
 * from the run id, a rollout rank registering first waits for the trainers' hosts; one host: ipc as before. */
static void test_endpoints_across_hosts(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = split_settings();
    core_init(&c, &s, T);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char *caps[] = {"rollout"}, *dev[] = {"cpu"};
    reg.rank = 2;
    reg.world_size = 4;
    reg.host = "hostb";
    reg.pid = 102;
    reg.config_digest = 42;
    reg.capabilities = caps;
    reg.n_capabilities = 1;
    reg.devices = dev;
    reg.n_devices = 1;
    reg.world_hosts = 2;
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    Grpo__Envelope *e = roundtrip(&c, &env, NULL); /* the rollout rank first: it waits for the trainers' hosts */
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(e->reply->error, "waits for the trainer ranks"));
    protocol_free(e);
    assert_true(c.run.across_hosts);
    char base[64];
    placement_data_base("", 2, c.run.id, base, sizeof base);
    const long port = strtol(strrchr(base, ':') + 1, NULL, 10);
    int lo = 0, hi = 0;
    placement_ephemeral_range(&lo, &hi);
    /* never a port the kernel may give an outgoing connection (an MPI or control socket took one in CI) */
    assert_true(port + PLACEMENT_PORTS_PER_RUN <= lo || port > hi);
    char want[64];
    e = send_register(&c, 0, 4, "hosta", "trainer", 42);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    snprintf(want, sizeof want, "tcp://*:%ld", port);
    assert_string_equal(e->assignment->data_pull_endpoint, want);
    protocol_free(e);
    protocol_free(send_register(&c, 1, 4, "hosta", "trainer", 42));
    e = roundtrip(&c, &env, NULL);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_ASSIGNMENT);
    snprintf(want, sizeof want, "tcp://hosta:%ld", port + 1);
    assert_string_equal(e->assignment->trainer_endpoints[1], want);
    snprintf(want, sizeof want, "tcp://hosta:%ld", port + 2);
    assert_string_equal(e->assignment->dispatch_endpoint, want);
    protocol_free(e);
    core_deinit(&c);
    /* every rank on one host (world_hosts 1, or 0 from an older worker): ipc */
    core_init(&c, &s, T);
    e = send_register(&c, 0, 4, "hosta", "trainer", 42);
    assert_non_null(strstr(e->assignment->data_pull_endpoint, "ipc://~run/grpo-"));
    assert_false(c.run.across_hosts);
    protocol_free(e);
    core_deinit(&c);
}

/* xorshift for reproducible garbage */
static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_garbage_never_crashes(void **state)
{
    (void)state;
    enum log_level lvl = log_get_level();
    log_set_level(LOG_ERROR);
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t inc = reg_ok(&c, 0, 2, GRPO__ROLE__ROLE_HYBRID);
    /* valid messages to mutate */
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    hb.incarnation = inc;
    hb.step = 3;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    size_t hlen;
    uint8_t *hbuf = protocol_pack(&env, &hlen);
    uint64_t seed = 0x1234567;
    uint8_t buf[512];
    for (int i = 0; i < 20000; i++) {
        size_t len;
        if (i % 2) { /* random bytes */
            len = rnd(&seed) % sizeof buf;
            for (size_t k = 0; k < len; k++)
                buf[k] = (uint8_t)rnd(&seed);
        } else { /* a valid heartbeat with a few bytes flipped, cut or grown */
            len = hlen;
            memcpy(buf, hbuf, hlen);
            for (int k = 0; k < 3; k++)
                buf[rnd(&seed) % len] = (uint8_t)rnd(&seed);
            if (rnd(&seed) % 4 == 0)
                len = rnd(&seed) % (len + 1);
        }
        size_t rlen;
        uint8_t *r = core_handle(&c, buf, len, NULL, T, &rlen);
        char why[256];
        Grpo__Envelope *e = protocol_unpack(r, rlen, why, sizeof why);
        assert_non_null(e); /* every answer is a well-formed envelope */
        protocol_free(e);
        free(r);
        if (i % 1000 == 0)
            core_tick(&c, T);
    }
    free(hbuf);
    core_deinit(&c);
    log_set_level(lvl);
}

/* ---- the run's configuration (Register.run_config) ---- */

/* The configuration text and digest of the defaults with overrides ("key=value", NULL-terminated). */
static char *config_text_of(const char *const *overrides, uint64_t *digest)
{
    struct grpo_config cfg;
    struct cfg_error err;
    config_init(&cfg);
    for (int i = 0; overrides && overrides[i]; i++)
        if (config_apply_override(&cfg, overrides[i], &err) != 0)
            fail_msg("%s", err.msg);
    char *text = config_run_text(&cfg, 0);
    *digest = config_digest(&cfg);
    *digest = *digest ? *digest : 1;
    config_free(&cfg);
    return text;
}

static Grpo__Envelope *send_register_config(struct core *c, int rank, int world, const char *text, uint64_t digest,
                                            bool replaces)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char host[32];
    snprintf(host, sizeof host, "node%02d", rank);
    reg.rank = rank;
    reg.world_size = world;
    reg.host = host;
    reg.pid = 100 + rank;
    reg.config_digest = digest;
    reg.run_config = (char *)text;
    reg.replaces = replaces;
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    return roundtrip(c, &env, NULL);
}

static uint64_t reg_config_ok(struct core *c, int rank, int world, const char *text, uint64_t digest, Grpo__Role role)
{
    Grpo__Envelope *e = send_register_config(c, rank, world, text, digest, false);
    if (e->body_case != GRPO__ENVELOPE__BODY_ASSIGNMENT)
        fail_msg("rank %d refused: %s", rank, e->body_case == GRPO__ENVELOPE__BODY_REPLY ? e->reply->error : "?");
    assert_int_equal(e->assignment->role, role);
    uint64_t inc = e->assignment->incarnation;
    protocol_free(e);
    return inc;
}

/* A registration that must be refused, for good, with every one of the needles in the error. */
static void reg_config_refused(struct core *c, int rank, int world, const char *text, uint64_t digest,
                               const char *const *needles)
{
    Grpo__Envelope *e = send_register_config(c, rank, world, text, digest, false);
    if (e->body_case != GRPO__ENVELOPE__BODY_REPLY)
        fail_msg("rank %d was not refused", rank);
    assert_false(e->reply->ok);
    for (int i = 0; needles[i]; i++)
        if (!strstr(e->reply->error, needles[i]))
            fail_msg("refusal '%s' lacks '%s'", e->reply->error, needles[i]);
    protocol_free(e);
}

static Grpo__Envelope *ask_run_config(struct core *c)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_RUN_CONFIG_REQUEST;
    env.run_config_request = true;
    return roundtrip(c, &env, NULL);
}

static const char *const split_2_1[] = {"placement.trainer_ranks=2", "placement.rollout_ranks=1",
                                        "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                        NULL};

/* A grpod with no keys of its own: the first rank's configuration lays the run out (2 trainers + 1 rollout),
 * a rank with another value of a key is refused naming the key and both values, and a replacement asks for
 * the run's configuration. */
static void test_first_rank_defines_run(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    Grpo__Envelope *e = ask_run_config(&c); /* no run under way */
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_REPLY);
    assert_non_null(strstr(e->reply->error, "not under way"));
    protocol_free(e);
    uint64_t d, d_other, d_many;
    char *text = config_text_of(split_2_1, &d);
    const char *const other[] = {"placement.trainer_ranks=2",     "placement.rollout_ranks=1",
                                 "data.train_batch_size=4",       "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                 "actor_rollout_ref.rollout.n=4", NULL};
    char *other_text = config_text_of(other, &d_other);
    const char *const many[] = {"placement.trainer_ranks=2",     "placement.rollout_ranks=1",
                                "data.train_batch_size=4",       "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                "actor_rollout_ref.rollout.n=4", "data.max_prompt_length=64",
                                "data.max_response_length=9",    "trainer.total_epochs=3",
                                "trainer.experiment_name=other", NULL};
    char *many_text = config_text_of(many, &d_many);
    /* the rollout rank first: its configuration says it is the rollout rank of 2 + 1 */
    reg_config_ok(&c, 2, 3, text, d, GRPO__ROLE__ROLE_ROLLOUT);
    assert_int_equal(c.place.trainer_ranks, 2);
    assert_int_equal(c.place.rollout_ranks, 1);
    assert_non_null(c.run.config);
    reg_config_ok(&c, 0, 3, text, d, GRPO__ROLE__ROLE_TRAINER);
    reg_config_refused(&c, 1, 3, other_text, d_other,
                       (const char *const[]){"rank 1's configuration differs from run", "in 1 key(s)",
                                             "actor_rollout_ref.rollout.n (run: 8, rank 1: 4)", NULL});
    reg_config_refused(
        &c, 1, 3, many_text, d_many,
        (const char *const[]){"in 5 key(s)", "actor_rollout_ref.rollout.n (run: 8, rank 1: 4)", "and 2 more", NULL});
    assert_null(c.workers[1]);
    reg_config_ok(&c, 1, 3, text, d, GRPO__ROLE__ROLE_TRAINER);
    /* a rank without the text (an older worker) is still checked by its digest */
    reg_config_refused(&c, 1, 3, "", d_other, (const char *const[]){"digest", NULL});
    /* the replacement's question: the run's configuration, as the first rank sent it */
    e = ask_run_config(&c);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_RUN_CONFIG);
    assert_string_equal(e->run_config->config, text);
    assert_string_equal(e->run_config->run_id, c.run.id);
    assert_int_equal(e->run_config->world_size, 3);
    assert_true(e->run_config->config_digest == d);
    protocol_free(e);
    free(text);
    free(other_text);
    free(many_text);
    core_deinit(&c);
}

/* A grpod given keys of its own checks them: its placement (spelt with verl's keys by the ranks, it is the same
 * placement) and its other keys, each refusal naming the numbers or the key and both values. */
static void test_own_keys_checked(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(2, 1, 1, 1);
    s.own_config = "data.train_batch_size=4\n";
    core_init(&c, &s, T);
    uint64_t d;
    const char *const batch8[] = {"placement.trainer_ranks=2", "placement.rollout_ranks=1", "data.train_batch_size=8",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=4", NULL};
    char *text = config_text_of(batch8, &d);
    reg_config_refused(
        &c, 0, 3, text, d,
        (const char *const[]){"differs from grpod's own keys", "data.train_batch_size (grpod: 4, rank 0: 8)", NULL});
    free(text);
    const char *const one_two[] = {"placement.trainer_ranks=1", "placement.rollout_ranks=2", "data.train_batch_size=4",
                                   "actor_rollout_ref.actor.ppo_mini_batch_size=4", NULL};
    text = config_text_of(one_two, &d);
    reg_config_refused(
        &c, 0, 3, text, d,
        (const char *const[]){"places 1 trainer + 2 rollout ranks", "grpod's keys 2 trainer + 1 rollout ranks", NULL});
    free(text);
    assert_int_equal(c.run.world, 0);
    const char *const verl[] = {"trainer.nnodes=1",
                                "trainer.n_gpus_per_node=2",
                                "rollout.nnodes=1",
                                "rollout.n_gpus_per_node=1",
                                "data.train_batch_size=4",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                NULL};
    text = config_text_of(verl, &d);
    reg_config_ok(&c, 0, 3, text, d, GRPO__ROLE__ROLE_TRAINER);
    reg_config_ok(&c, 2, 3, text, d, GRPO__ROLE__ROLE_ROLLOUT);
    free(text);
    core_deinit(&c);
    /* a rank whose configuration gives no rank counts takes grpod's placement (as before) */
    core_init(&c, &s, T);
    const char *const no_counts[] = {"data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", NULL};
    text = config_text_of(no_counts, &d);
    reg_config_ok(&c, 2, 3, text, d, GRPO__ROLE__ROLE_ROLLOUT);
    free(text);
    core_deinit(&c);
}

/* Configuration text that does not read, or does not give the rank's digest, or is too long, is refused with
 * what is wrong, and leaves the run as it was. */
static void test_garbled_config_refused(void **state)
{
    (void)state;
    struct core c;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t d;
    char *text = config_text_of(split_2_1, &d);
    reg_config_refused(&c, 0, 3, "hello world", 7,
                       (const char *const[]){"rank 0's configuration cannot be read", "line 1: not name=value", NULL});
    reg_config_refused(&c, 0, 3, "no.such.key=1\n", 7,
                       (const char *const[]){"'no.such.key' is not a key that shapes the run", NULL});
    reg_config_refused(&c, 0, 3, "data.train_batch_size=-3\n", 7, (const char *const[]){"data.train_batch_size", NULL});
    reg_config_refused(&c, 0, 3, text, d ^ 1, (const char *const[]){"does not give its digest", NULL});
    /* control characters and oversize text are invalid fields: dropped before the core looks at them */
    reg_config_refused(&c, 0, 3, "data.train_batch_size=4\x01\n", 7,
                       (const char *const[]){"register.run_config", NULL});
    char *big = malloc(CORE_CONFIG_MAX + 2);
    memset(big, 'a', CORE_CONFIG_MAX + 1);
    big[CORE_CONFIG_MAX + 1] = 0;
    for (size_t i = 100; i < CORE_CONFIG_MAX; i += 100)
        big[i] = '\n';
    reg_config_refused(&c, 0, 3, big, 7, (const char *const[]){"register.run_config is longer than", NULL});
    free(big);
    assert_int_equal(c.run.world, 0);
    assert_null(c.run.config);
    assert_int_equal(c.place.trainer_ranks, 0);
    reg_config_ok(&c, 0, 3, text, d, GRPO__ROLE__ROLE_TRAINER);
    free(text);
    core_deinit(&c);
}

/* The run's configuration survives a grpod restart: the journal keeps it, and the layout follows it. */
static void test_run_config_journaled(void **state)
{
    (void)state;
    struct core c, d;
    struct core_settings s = settings(0, 0, 1, 1);
    core_init(&c, &s, T);
    uint64_t dg;
    char *text = config_text_of(split_2_1, &dg);
    reg_config_ok(&c, 0, 3, text, dg, GRPO__ROLE__ROLE_TRAINER);
    char *json = core_save_json(&c);
    core_init(&d, &s, T + 10);
    char err[256];
    assert_int_equal(core_load_json(&d, json, T + 10, err, sizeof err), 0);
    assert_non_null(d.run.config);
    assert_string_equal(d.run.config, text);
    assert_int_equal(d.place.trainer_ranks, 2);
    assert_int_equal(d.place.rollout_ranks, 1);
    reg_config_ok(&d, 2, 3, text, dg, GRPO__ROLE__ROLE_ROLLOUT);
    Grpo__Envelope *e = ask_run_config(&d);
    assert_int_equal(e->body_case, GRPO__ENVELOPE__BODY_RUN_CONFIG);
    assert_string_equal(e->run_config->config, text);
    protocol_free(e);
    free(json);
    free(text);
    core_deinit(&c);
    core_deinit(&d);
}

/* One layout of the parallel keys: the overrides and the world mpirun starts. */
struct layout {
    const char *name;
    int world;
    const char *keys[12];
};

/* Every layout key (TP, PP, EP, SP, CP, rollout TP), split (placement.* or verl's node counts) and colocated: a
 * grpod configured from the job's keys (core_settings_place, as grpod's main does) and a bare grpod (the first
 * rank's configuration lays the run out) give every rank the assignment placement_of gives that rank from the
 * same configuration, the one grpo-worker checks, and hand a rollout rank one data endpoint per trainer DP rank. */
static void test_placement_follows_every_layout_key(void **state)
{
    (void)state;
#define BATCH "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"
    static const struct layout layouts[] = {
        {"split SP",
         3,
         {"placement.trainer_ranks=2", "placement.rollout_ranks=1",
          "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", BATCH}},
        {"split CP",
         3,
         {"placement.trainer_ranks=2", "placement.rollout_ranks=1",
          "actor_rollout_ref.actor.megatron.context_parallel_size=2", BATCH}},
        {"split TP",
         6,
         {"placement.trainer_ranks=4", "placement.rollout_ranks=2",
          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", BATCH}},
        {"split PP",
         5,
         {"placement.trainer_ranks=4", "placement.rollout_ranks=1",
          "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", BATCH}},
        {"split EP",
         5,
         {"placement.trainer_ranks=4", "placement.rollout_ranks=1",
          "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2", BATCH}},
        {"split rollout TP",
         4,
         {"placement.trainer_ranks=2", "placement.rollout_ranks=2",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=2", BATCH}},
        {"split TP PP SP rollout TP",
         10,
         {"placement.trainer_ranks=8", "placement.rollout_ranks=2",
          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
          "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
          "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=2", BATCH}},
        {"split verl node counts SP",
         3,
         {"trainer.nnodes=1", "trainer.n_gpus_per_node=2", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
          "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", BATCH}},
        {"split CP EP",
         9,
         {"placement.trainer_ranks=8", "placement.rollout_ranks=1",
          "actor_rollout_ref.actor.megatron.context_parallel_size=2",
          "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2", BATCH}},
        {"colocated SP",
         4,
         {"placement.trainer_ranks=4", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", BATCH}},
        {"colocated CP rollout TP",
         4,
         {"placement.trainer_ranks=4", "actor_rollout_ref.actor.megatron.context_parallel_size=2",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=2", BATCH}},
        {"colocated TP PP",
         8,
         {"placement.trainer_ranks=8", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
          "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", BATCH}},
        {"colocated EP",
         4,
         {"placement.trainer_ranks=4", "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2", BATCH}},
        {"no rank counts, SP", 4, {"actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", BATCH}},
        {"no rank counts, CP", 4, {"actor_rollout_ref.actor.megatron.context_parallel_size=2", BATCH}},
    };
#undef BATCH
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
        const struct layout *lay = &layouts[l];
        struct grpo_config cfg;
        struct cfg_error cerr;
        char why[1024];
        config_init(&cfg);
        for (int i = 0; lay->keys[i]; i++)
            if (config_apply_override(&cfg, lay->keys[i], &cerr) != 0)
                fail_msg("%s: %s", lay->name, cerr.msg);
        struct placement_spec spec; /* the worker's */
        if (placement_spec_from_config(&cfg, &spec, why, sizeof why) != 0)
            fail_msg("%s: %s", lay->name, why);
        uint64_t digest;
        char *text = config_text_of(lay->keys, &digest);
        for (int own = 0; own < 2; own++) { /* grpod given the job's keys, and a bare grpod */
            struct core c;
            struct core_settings s = settings(0, 0, 1, 1);
            char *own_config = NULL;
            if (own) {
                own_config = config_run_text(&cfg, CONFIG_TEXT_GIVEN | CONFIG_TEXT_NO_COUNTS);
                s.own_config = own_config;
                if (core_settings_place(&s, &cfg, why, sizeof why) != 0)
                    fail_msg("%s: %s", lay->name, why);
            }
            core_init(&c, &s, T);
            for (int r = 0; r < lay->world; r++) {
                struct placement p;
                if (placement_of(&spec, r, lay->world, &p, why, sizeof why) != 0)
                    fail_msg("%s: rank %d: %s", lay->name, r, why);
                const Grpo__Role want = p.role == PLACE_TRAINER   ? GRPO__ROLE__ROLE_TRAINER
                                        : p.role == PLACE_ROLLOUT ? GRPO__ROLE__ROLE_ROLLOUT
                                                                  : GRPO__ROLE__ROLE_HYBRID;
                Grpo__Envelope *e = send_register_config(&c, r, lay->world, text, digest, false);
                if (e->body_case != GRPO__ENVELOPE__BODY_ASSIGNMENT)
                    fail_msg("%s (%s grpod): rank %d refused: %s", lay->name, own ? "keyed" : "bare", r,
                             e->body_case == GRPO__ENVELOPE__BODY_REPLY ? e->reply->error : "?");
                const Grpo__Assignment *a = e->assignment;
                if (a->role != want || a->dp_rank != p.dp || a->dp_size != p.dp_size || a->tp_rank != p.tp ||
                    a->tp_size != p.tp_size || a->pp_rank != p.pp || a->pp_size != p.pp_size)
                    fail_msg("%s (%s grpod): rank %d assigned role %d dp %d/%d tp %d/%d pp %d/%d, the worker computes "
                             "role %d dp %d/%d tp %d/%d pp %d/%d",
                             lay->name, own ? "keyed" : "bare", r, a->role, a->dp_rank, a->dp_size, a->tp_rank,
                             a->tp_size, a->pp_rank, a->pp_size, want, p.dp, p.dp_size, p.tp, p.tp_size, p.pp,
                             p.pp_size);
                if (p.role == PLACE_ROLLOUT) { /* one data endpoint per trainer DP rank */
                    struct placement t;
                    assert_int_equal(placement_of(&spec, 0, lay->world, &t, why, sizeof why), 0);
                    assert_int_equal((int)a->n_trainer_endpoints, t.dp_size);
                }
                protocol_free(e);
            }
            assert_int_equal(c.run.world, lay->world);
            core_deinit(&c);
            free(own_config);
        }
        free(text);
        config_free(&cfg);
    }
}

/* A grpod given the rank counts but not the ranks' SP size refuses them naming both layouts (it used to assign
 * them a DP size the ranks do not compute). */
static void test_own_layout_differs_in_sp(void **state)
{
    (void)state;
    const char *const counts[] = {"placement.trainer_ranks=2", "placement.rollout_ranks=1", NULL};
    struct grpo_config cfg;
    struct cfg_error cerr;
    char why[512];
    config_init(&cfg);
    for (int i = 0; counts[i]; i++)
        assert_int_equal(config_apply_override(&cfg, counts[i], &cerr), 0);
    struct core_settings s = settings(0, 0, 1, 1);
    assert_int_equal(core_settings_place(&s, &cfg, why, sizeof why), 0);
    assert_true(s.own_placement);
    config_free(&cfg);
    struct core c;
    core_init(&c, &s, T);
    const char *const sp[] = {"placement.trainer_ranks=2",
                              "placement.rollout_ranks=1",
                              "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                              "data.train_batch_size=4",
                              "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                              NULL};
    uint64_t d;
    char *text = config_text_of(sp, &d);
    reg_config_refused(&c, 0, 3, text, d,
                       (const char *const[]){"places 2 trainer + 1 rollout ranks (TP 1, PP 1, SP/CP 2",
                                             "grpod's keys 2 trainer + 1 rollout ranks (TP 1, PP 1, SP/CP 1", NULL});
    free(text);
    assert_int_equal(c.run.world, 0);
    core_deinit(&c);
}

int main(void)
{
    log_set_level(LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement_trainer_rollout),
        cmocka_unit_test(test_placement_hybrid_megatron_order),
        cmocka_unit_test(test_data_port_window),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_state_machine),
        cmocka_unit_test(test_steady_heartbeats_judge_nothing),
        cmocka_unit_test(test_registration_records),
        cmocka_unit_test(test_status_of_some_workers),
        cmocka_unit_test(test_registration_asked_again),
        cmocka_unit_test(test_stop_reason_names_who_asked),
        cmocka_unit_test(test_checkpoint_completion),
        cmocka_unit_test(test_checkpoint_unrequested_split),
        cmocka_unit_test(test_lost_worker),
        cmocka_unit_test(test_left_copy_idle),
        cmocka_unit_test(test_worker_failure),
        cmocka_unit_test(test_journal_round_trip),
        cmocka_unit_test(test_secret),
        cmocka_unit_test(test_session_flood),
        cmocka_unit_test(test_launch_epochs),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_status_and_metrics),
        cmocka_unit_test(test_split_rollout_rank_lost),
        cmocka_unit_test(test_split_trainers_finished_end_run),
        cmocka_unit_test(test_split_every_rollout_rank_lost),
        cmocka_unit_test(test_stalled_rollout_rank_not_lost),
        cmocka_unit_test(test_suspect_and_the_workers_own_account),
        cmocka_unit_test(test_grpod_own_pause_is_not_silence),
        cmocka_unit_test(test_split_trainer_lost_aborts),
        cmocka_unit_test(test_split_rank_ends_as_told),
        cmocka_unit_test(test_replace_rank),
        cmocka_unit_test(test_dispatch_endpoints),
        cmocka_unit_test(test_endpoints_across_hosts),
        cmocka_unit_test(test_split_trainer_failure_aborts),
        cmocka_unit_test(test_garbage_never_crashes),
        cmocka_unit_test(test_first_rank_defines_run),
        cmocka_unit_test(test_own_keys_checked),
        cmocka_unit_test(test_garbled_config_refused),
        cmocka_unit_test(test_run_config_journaled),
        cmocka_unit_test(test_placement_follows_every_layout_key),
        cmocka_unit_test(test_own_layout_differs_in_sp),
        cmocka_unit_test(test_flight_requests),
        cmocka_unit_test(test_hang_verdict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
