/* The workers' control client against grpod's real core served from a thread:
 * registration, heartbeats while the trainer is busy, pause / resume /
 * checkpoint / stop at safe points, no grpod at all, an unreachable grpod, a
 * peer of another protocol version; and the transport's endpoint and secret
 * handling. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "daemon/core.h"
#include "worker/control/control.h"
#include "proto/transport.h"

/* ---- a grpod in a thread: the real core behind a REP socket ---- */

struct server {
    char dir[64], endpoint[128];
    int sock;
    struct core core;
    pthread_t thread;
    volatile int quit;
    int wrong_version; /* answer everything as a protocol-2 peer */
    double register_s; /* a busy grpod: each registration answered this long after it is read */
};

static void *serve(void *arg)
{
    struct server *s = arg;
    while (!s->quit) {
        void *msg;
        int n = nn_recv(s->sock, &msg, NN_MSG, 0);
        if (n < 0) {
            core_tick(&s->core, clock_now_s());
            continue;
        }
        size_t rlen;
        uint8_t *r;
        if (s->wrong_version) {
            Grpo__Envelope env = GRPO__ENVELOPE__INIT;
            Grpo__Reply reply = GRPO__REPLY__INIT;
            reply.error = "incompatible protocol version 1: grpod speaks version 2";
            env.body_case = GRPO__ENVELOPE__BODY_REPLY;
            env.reply = &reply;
            env.version = 2;
            rlen = grpo__envelope__get_packed_size(&env);
            r = malloc(rlen);
            grpo__envelope__pack(&env, r);
        } else {
            if (s->register_s > 0) {
                char why[128];
                Grpo__Envelope *e = protocol_unpack(msg, (size_t)n, why, sizeof why);
                if (e && e->body_case == GRPO__ENVELOPE__BODY_REGISTER)
                    clock_sleep_s(s->register_s); /* sleep-ok: the busy grpod this server plays */
                protocol_free(e);
            }
            r = core_handle(&s->core, msg, (size_t)n, NULL, clock_now_s(), &rlen);
        }
        nn_freemsg(msg);
        nn_send(s->sock, r, rlen, 0);
        free(r);
    }
    return NULL;
}

static void server_start(struct server *s, int wrong_version)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/grpo-ctl-XXXXXX");
    assert_non_null(mkdtemp(s->dir));
    snprintf(s->endpoint, sizeof s->endpoint, "ipc://%s/ctl.sock", s->dir);
    struct core_settings set = {.heartbeat_interval_s = 0.1,
                                .heartbeat_timeout_s = 5,
                                .place = {.tp_size = 1, .pp_size = 1},
                                .data_endpoint = "",
                                .http_url = ""};
    core_init(&s->core, &set, clock_now_s());
    s->wrong_version = wrong_version;
    s->sock = nn_socket(AF_SP, NN_REP);
    assert_true(s->sock >= 0);
    int to = 50;
    nn_setsockopt(s->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to);
    assert_true(nn_bind(s->sock, s->endpoint) >= 0);
    assert_int_equal(pthread_create(&s->thread, NULL, serve, s), 0);
}

static void server_stop(struct server *s)
{
    s->quit = 1;
    pthread_join(s->thread, NULL);
    nn_close(s->sock);
    core_deinit(&s->core);
    char path[128];
    snprintf(path, sizeof path, "%s/ctl.sock", s->dir);
    unlink(path);
    rmdir(s->dir);
}

/* ---- an operator's requests, through the transport ---- */

static Grpo__Status *status(const char *endpoint, Grpo__Envelope **keep)
{
    char err[256];
    struct rpc_client *rpc = rpc_open(endpoint, NULL, err, sizeof err);
    assert_non_null(rpc);
    Grpo__Envelope req = GRPO__ENVELOPE__INIT, *reply;
    req.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    req.status_request = 1;
    assert_int_equal(rpc_call_retry(rpc, &req, 3, 2000, &reply, err, sizeof err), RPC_OK);
    rpc_close(rpc);
    assert_int_equal(reply->body_case, GRPO__ENVELOPE__BODY_STATUS);
    *keep = reply;
    return reply->status;
}

static void send_command(const char *endpoint, Grpo__Command cmd)
{
    char err[256];
    struct rpc_client *rpc = rpc_open(endpoint, NULL, err, sizeof err);
    assert_non_null(rpc);
    Grpo__Envelope req = GRPO__ENVELOPE__INIT, *reply;
    Grpo__CommandRequest cr = GRPO__COMMAND_REQUEST__INIT;
    cr.command = cmd;
    req.body_case = GRPO__ENVELOPE__BODY_COMMAND;
    req.command = &cr;
    assert_int_equal(rpc_call(rpc, &req, 2000, &reply, err, sizeof err), RPC_OK);
    assert_true(reply->reply->ok);
    protocol_free(reply);
    rpc_close(rpc);
}

/* control_poll until it says cmd (at most 5 s). */
static int poll_until(struct control *c, enum control_command cmd)
{
    for (int i = 0; i < 500; i++) {
        enum control_command got = control_poll(c);
        if (got == cmd)
            return 1;
        clock_sleep_s(0.01); /* sleep-ok: the poll interval of a bounded wait */
    }
    return 0;
}

static struct control *open_worker(struct server *s, struct control_assignment *a)
{
    struct control_options o = {.endpoint = s->endpoint,
                                .rank = 0,
                                .world_size = 1,
                                .host = "testhost",
                                .config_digest = 9,
                                .connect_timeout_s = 5};
    struct control *c = NULL;
    char err[512];
    if (control_open(&o, &c, a, err, sizeof err) != 0)
        fail_msg("control_open: %s", err);
    assert_non_null(c);
    return c;
}

static void test_no_grpod(void **state)
{
    (void)state;
    struct control_options o = {.endpoint = "", .rank = 0, .world_size = 1};
    struct control *c = (struct control *)1;
    struct control_assignment a;
    char err[128];
    assert_int_equal(control_open(&o, &c, &a, err, sizeof err), 0);
    assert_null(c);
    control_set_phase(c, GRPO__PHASE__PHASE_GEN);
    control_set_step(c, 1, 2);
    control_set_metric(c, "x", 1);
    assert_int_equal(control_poll(c), CONTROL_NONE);
    assert_int_equal(control_wait_resume(c), CONTROL_RESUME);
    control_checkpoint_done(c, 1);
    control_finish(c, CONTROL_END_FINISHED, NULL);
    control_close(c);
}

/* rpc_connect_also: a request goes to whichever connected endpoint listens (a split run's dispatcher, moved to the
 * survivor that took the lead); a call that times out says "gone" only when every endpoint is. */
static void test_connect_also(void **state)
{
    (void)state;
    struct server s;
    server_start(&s, 0);
    char err[512] = "", first[160];
    snprintf(first, sizeof first, "ipc://%s/gone.sock", s.dir); /* the lost lead's: nothing listens */
    struct rpc_client *rpc = rpc_open(first, NULL, err, sizeof err);
    assert_non_null(rpc);
    Grpo__Envelope req = GRPO__ENVELOPE__INIT, *reply = NULL;
    req.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    req.status_request = 1;
    assert_int_equal(rpc_call(rpc, &req, 300, &reply, err, sizeof err), RPC_UNREACHABLE);
    assert_non_null(strstr(err, "no such file or directory")); /* gone: the only endpoint is */
    assert_int_equal(rpc_connect_also(rpc, s.endpoint, err, sizeof err), 0);
    assert_int_equal(rpc_call(rpc, &req, 5000, &reply, err, sizeof err), RPC_OK); /* found where it listens */
    assert_int_equal(reply->body_case, GRPO__ENVELOPE__BODY_STATUS);
    protocol_free(reply);
    s.quit = 1; /* the server stops answering but its socket stays bound: not gone, silent */
    pthread_join(s.thread, NULL);
    assert_int_equal(rpc_call(rpc, &req, 300, &reply, err, sizeof err), RPC_UNREACHABLE);
    assert_non_null(strstr(err, "no answer within 0.3 s"));
    assert_int_equal(rpc_connect_also(rpc, "nonsense://x", err, sizeof err), -1);
    rpc_close(rpc);
    nn_close(s.sock);
    core_deinit(&s.core);
    char path[160];
    snprintf(path, sizeof path, "%s/ctl.sock", s.dir);
    unlink(path);
    rmdir(s.dir);
}

static void test_unreachable(void **state)
{
    (void)state;
    struct control_options o = {
        .endpoint = "ipc:///tmp/grpo-no-such-dir/ctl.sock", .rank = 0, .world_size = 1, .connect_timeout_s = 0.5};
    struct control *c;
    struct control_assignment a;
    char err[512];
    double t0 = clock_now_s();
    assert_int_equal(control_open(&o, &c, &a, err, sizeof err), -1);
    assert_true(clock_now_s() - t0 < 5.0);
    assert_non_null(strstr(err, "cannot reach grpod at ipc:///tmp/grpo-no-such-dir/ctl.sock: "));
    assert_non_null(strstr(err, "no such file or directory"));
}

/* A grpod too busy to answer a registration within 2 s (10,000 ranks registering at once): the worker waits twice as
 * long at each try, and its second try, answered 2.5 s after it is read, gets in (with a fixed 2 s every answer came
 * too late and no try ever did), with the registration its first try made (grpod answers it again). */
static void test_busy_grpod(void **state)
{
    (void)state;
    struct server s;
    server_start(&s, 0);
    s.register_s = 2.5;
    struct control_options o = {.endpoint = s.endpoint,
                                .rank = 0,
                                .world_size = 1,
                                .host = "testhost",
                                .config_digest = 9,
                                .connect_timeout_s = 20};
    struct control *c = NULL;
    struct control_assignment a;
    char err[512];
    const double t0 = clock_now_s();
    if (control_open(&o, &c, &a, err, sizeof err) != 0)
        fail_msg("control_open: %s", err);
    assert_true(clock_now_s() - t0 < 15.0);
    assert_int_equal(s.core.counters.registrations_repeated, 1); /* the second try: the first one's answer again */
    control_finish(c, CONTROL_END_FINISHED, NULL);
    control_close(c);
    server_stop(&s);
}

static void test_version_mismatch(void **state)
{
    (void)state;
    struct server s;
    server_start(&s, 1);
    struct control_options o = {.endpoint = s.endpoint, .rank = 0, .world_size = 1, .connect_timeout_s = 5};
    struct control *c;
    struct control_assignment a;
    char err[512];
    assert_int_equal(control_open(&o, &c, &a, err, sizeof err), -1);
    assert_non_null(strstr(err, "grpod speaks protocol version 2, this program version 1"));
    server_stop(&s);
}

static void test_heartbeats_while_busy(void **state)
{
    (void)state;
    struct server s;
    server_start(&s, 0);
    struct control_assignment a;
    struct control *c = open_worker(&s, &a);
    assert_int_equal(a.role, CONTROL_ROLE_HYBRID);
    assert_true(a.run_id[0]);
    control_set_phase(c, GRPO__PHASE__PHASE_UPDATE_ACTOR);
    control_set_metric(c, "critic/score/mean", 0.25);
    control_set_step(c, 3, 10);
    clock_sleep_s(1.0); /* sleep-ok: the trainer busy for 1 s (no calls) is what is tested */
    Grpo__Envelope *keep;
    Grpo__Status *st = status(s.endpoint, &keep);
    assert_int_equal(st->n_workers, 1);
    assert_true(st->workers[0]->last_heartbeat_age_s < 0.5);
    assert_int_equal(st->step, 3);
    assert_string_equal(st->workers[0]->host, "testhost");
    assert_int_equal(st->workers[0]->worker_state, GRPO__WORKER_STATE__WORKER_RUNNING);
    assert_int_equal(st->workers[0]->phase, GRPO__PHASE__PHASE_UPDATE_ACTOR);
    assert_true(st->workers[0]->busy_seconds > 0.8);
    assert_int_equal(st->n_metrics, 1);
    protocol_free(keep);
    control_finish(c, CONTROL_END_FINISHED, NULL);
    st = status(s.endpoint, &keep);
    assert_int_equal(st->state, GRPO__RUN_STATE__RUN_FINISHED);
    protocol_free(keep);
    control_close(c);
    server_stop(&s);
}

struct resumer {
    const char *endpoint;
    int saw_paused;
};

static void *resume_later(void *arg)
{
    struct resumer *r = arg;
    for (int i = 0; i < 300 && !r->saw_paused; i++) {
        Grpo__Envelope *keep;
        Grpo__Status *st = status(r->endpoint, &keep);
        r->saw_paused = st->state == GRPO__RUN_STATE__RUN_PAUSED;
        protocol_free(keep);
        clock_sleep_s(0.02); /* sleep-ok: the poll interval of a bounded wait */
    }
    send_command(r->endpoint, GRPO__COMMAND__COMMAND_RESUME);
    return NULL;
}

static void test_commands(void **state)
{
    (void)state;
    struct server s;
    server_start(&s, 0);
    struct control_assignment a;
    struct control *c = open_worker(&s, &a);
    control_set_phase(c, GRPO__PHASE__PHASE_GEN);
    assert_int_equal(control_poll(c), CONTROL_NONE);

    /* pause: held in control_wait_resume, reported as paused, until resumed */
    send_command(s.endpoint, GRPO__COMMAND__COMMAND_PAUSE);
    assert_true(poll_until(c, CONTROL_PAUSE));
    struct resumer r = {s.endpoint, 0};
    pthread_t t;
    pthread_create(&t, NULL, resume_later, &r);
    assert_int_equal(control_wait_resume(c), CONTROL_RESUME);
    pthread_join(t, NULL);
    assert_true(r.saw_paused);
    assert_int_equal(control_poll(c), CONTROL_NONE);

    /* checkpoint: returned once, then done */
    send_command(s.endpoint, GRPO__COMMAND__COMMAND_CHECKPOINT);
    assert_true(poll_until(c, CONTROL_CHECKPOINT));
    assert_int_equal(control_poll(c), CONTROL_NONE);
    control_checkpoint_done(c, 5);
    Grpo__Envelope *keep = NULL;
    for (int i = 0; i < 200; i++) {
        protocol_free(keep);
        if (status(s.endpoint, &keep)->checkpoint_seq_done == 1)
            break;
        clock_sleep_s(0.02); /* sleep-ok: the poll interval of a bounded wait */
    }
    assert_int_equal(keep->status->checkpoint_seq_done, 1);
    assert_int_equal(keep->status->checkpoint_step, 5);
    protocol_free(keep);

    /* stop: the trainer checkpoints and ends; the run finishes */
    send_command(s.endpoint, GRPO__COMMAND__COMMAND_STOP);
    assert_true(poll_until(c, CONTROL_STOP));
    control_checkpoint_done(c, 6);
    control_finish(c, CONTROL_END_STOPPED, NULL);
    Grpo__Status *st = status(s.endpoint, &keep);
    assert_int_equal(st->state, GRPO__RUN_STATE__RUN_FINISHED);
    assert_non_null(strstr(st->reason, "stopped by operator"));
    protocol_free(keep);
    control_close(c);
    server_stop(&s);
}

static int saves;
static int save_cb(void *ud, int64_t step)
{
    (void)ud;
    (void)step;
    saves++;
    return 0;
}

static void test_safe_point(void **state)
{
    (void)state;
    struct server s;
    server_start(&s, 0);
    struct control_assignment a;
    struct control *c = open_worker(&s, &a);
    saves = 0;
    assert_true(control_safe_point(c, 1, save_cb, NULL));
    assert_int_equal(saves, 0);
    send_command(s.endpoint, GRPO__COMMAND__COMMAND_CHECKPOINT);
    for (int i = 0; i < 500 && saves == 0; i++) {
        assert_true(control_safe_point(c, 2, save_cb, NULL));
        clock_sleep_s(0.01); /* sleep-ok: the poll interval of a bounded wait */
    }
    assert_int_equal(saves, 1);
    send_command(s.endpoint, GRPO__COMMAND__COMMAND_STOP);
    bool go_on = true;
    for (int i = 0; i < 500 && go_on; i++) {
        go_on = control_safe_point(c, 3, save_cb, NULL);
        clock_sleep_s(0.01); /* sleep-ok: the poll interval of a bounded wait */
    }
    assert_false(go_on);
    assert_int_equal(saves, 2);
    control_finish(c, CONTROL_END_STOPPED, NULL);
    control_close(c);
    server_stop(&s);
}

static void test_transport(void **state)
{
    (void)state;
    enum endpoint_kind k;
    char path[128], err[256];
    assert_int_equal(endpoint_parse("ipc:///run/grpo/ctl.sock", &k, path, sizeof path, err, sizeof err), 0);
    assert_int_equal(k, ENDPOINT_IPC);
    assert_string_equal(path, "/run/grpo/ctl.sock");
    assert_int_equal(endpoint_parse("tcp://head:7070", &k, NULL, 0, err, sizeof err), 0);
    assert_int_equal(k, ENDPOINT_TCP);
    assert_int_equal(endpoint_parse("tcp://head", &k, NULL, 0, err, sizeof err), -1);
    assert_int_equal(endpoint_parse("tcp://head:99999", &k, NULL, 0, err, sizeof err), -1);
    assert_int_equal(endpoint_parse("inproc://x", &k, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "use ipc://PATH or tcp://HOST:PORT"));
    assert_int_equal(endpoint_parse("ipc://", &k, NULL, 0, err, sizeof err), -1);

    char file[] = "/tmp/grpo-secret-XXXXXX", out[64];
    int fd = mkstemp(file);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "  s3cret-s3cret-s3cret-s3cret \nsecond line\n", 42), 42);
    close(fd);
    chmod(file, 0640); /* every reader refuses it: grpod, grpoctl and the workers alike */
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), -1);
    assert_non_null(strstr(err, "chmod 600"));
    chmod(file, 0600);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "s3cret-s3cret-s3cret-s3cret");
    /* short secrets are refused naming their size; 22 characters (16 random bytes in base64) is the least */
    fd = open(file, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "x\n", 2), 2);
    close(fd);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), -1);
    assert_non_null(strstr(err, "is 1 characters (6 bits at most, as base64); at least 22"));
    fd = open(file, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "abcdefghijklmnopqrstu\n", 22), 22); /* 21 */
    close(fd);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), -1);
    fd = open(file, O_WRONLY | O_TRUNC);
    assert_int_equal(write(fd, "abcdefghijklmnopqrstuv\n", 23), 23); /* 22 */
    close(fd);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), 0);
    /* 0600 or stricter: 0400 is taken; an execute or set-id bit is not, even for the owner alone */
    chmod(file, 0400);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), 0);
    chmod(file, 0700);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), -1);
    assert_non_null(strstr(err, "has mode 0700: it must be 0600 or stricter"));
    chmod(file, 04600);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), -1);
    chmod(file, 0600);
    /* a file of another user's (it could change it): refused, naming the owner (root can make one to test) */
    if (geteuid() == 0 && chown(file, 65534, 65534) == 0) {
        assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), -1);
        assert_non_null(strstr(err, "belongs to uid 65534, not to this process's user (uid 0)"));
        assert_int_equal(chown(file, 0, 0), 0);
        assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), 0);
    }
    unlink(file);
    /* a FIFO is refused at once, not waited on for a writer that never comes */
    assert_int_equal(mkfifo(file, 0600), 0);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), -1);
    assert_non_null(strstr(err, "a FIFO, not a regular file"));
    unlink(file);
    assert_int_equal(secret_read(file, out, sizeof out, err, sizeof err), -1);
    assert_true(secret_equal("abc", "abc"));
    assert_false(secret_equal("abc", "abd"));
    assert_false(secret_equal("abc", "ab"));
    assert_false(secret_equal("", "x"));
    assert_int_equal(endpoint_probe("ipc:///tmp/grpo-no-such-dir/x.sock", err, sizeof err), -1);
    assert_string_equal(err, "no such file or directory");
}

static void test_config_digest(void **state)
{
    (void)state;
    struct grpo_config a, b;
    struct cfg_error err;
    config_init(&a);
    config_init(&b);
    assert_int_equal(control_config_digest(&a), control_config_digest(&b));
    /* how a host reaches grpod, and how much it logs, may differ between ranks */
    assert_int_equal(config_set(&b, "grpod.endpoint", "tcp://head:7070", "test", &err), 0);
    assert_int_equal(config_set(&b, "trainer.log_level", "debug", "test", &err), 0);
    assert_int_equal(control_config_digest(&a), control_config_digest(&b));
    /* what shapes the run may not */
    assert_int_equal(config_set(&b, "data.train_batch_size", "16", "test", &err), 0);
    assert_true(control_config_digest(&a) != control_config_digest(&b));
    struct control_options o;
    control_options_from_config(&o, &b, 3, 4);
    assert_int_equal(o.rank, 3);
    assert_int_equal(o.world_size, 4);
    assert_string_equal(o.endpoint, "tcp://head:7070");
    assert_int_equal(o.config_digest, control_config_digest(&b));
    config_free(&a);
    config_free(&b);
}

/* endpoint_bind (proto/transport.c), which every ipc listener uses: the socket file is born 0600 whatever the umask
 * lets through (no moment where another user may connect), a path in use and a regular file are refused with the
 * reason, and the file stays. */
static void test_endpoint_bind(void **state)
{
    (void)state;
    char dir[] = "/tmp/grpo-bind-XXXXXX", ep[640], path[600], err[700];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/s.sock", dir);
    snprintf(ep, sizeof ep, "ipc://%s", path);
    const mode_t old = umask(0);
    int a = nn_socket(AF_SP, NN_REP), b = nn_socket(AF_SP, NN_REP);
    assert_true(a >= 0 && b >= 0);
    assert_int_equal(endpoint_bind(a, ep, 0600, err, sizeof err), 0);
    umask(old);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    /* a socket something answers on */
    assert_int_equal(endpoint_bind(b, ep, 0600, err, sizeof err), -1);
    print_message("in use: %s\n", err);
    assert_non_null(strstr(err, "in use"));
    nn_close(a);
    nn_close(b);
    unlink(path);
    /* a regular file: refused, named, kept */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("keep me\n", f);
    fclose(f);
    b = nn_socket(AF_SP, NN_REP);
    assert_int_equal(endpoint_bind(b, ep, 0600, err, sizeof err), -1);
    print_message("a file: %s\n", err);
    assert_non_null(strstr(err, path));
    nn_close(b);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transport),
        cmocka_unit_test(test_no_grpod),
        cmocka_unit_test(test_unreachable),
        cmocka_unit_test(test_connect_also),
        cmocka_unit_test(test_version_mismatch),
        cmocka_unit_test(test_busy_grpod),
        cmocka_unit_test(test_heartbeats_while_busy),
        cmocka_unit_test(test_commands),
        cmocka_unit_test(test_safe_point),
        cmocka_unit_test(test_config_digest),
        cmocka_unit_test(test_endpoint_bind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
