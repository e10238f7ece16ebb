/* libFuzzer harness of everything grpod parses from outside: control requests
 * (on ipc, and on tcp: hellos and sealed requests), the journaled state file, and the
 * replies a client decodes and prints as JSON. The first input byte picks the
 * target; the core lives across inputs, so sequences of requests build up
 * state the way a real socket would.
 *
 * Built and run by run_fuzz.sh (clang -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "daemon/arena.h"
#include "daemon/core.h"
#include "proto/status_json.h"
#include "proto/protocol.h"

static struct core core;
static double now = 1000.0;

static void write_seed(const char *dir, const char *name, uint8_t target, const uint8_t *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return;
    fputc(target, f);
    fwrite(buf, 1, len, f);
    fclose(f);
}

static void write_envelope_seed_to(const char *dir, const char *name, uint8_t target, Grpo__Envelope *env)
{
    size_t len;
    uint8_t *buf = protocol_pack(env, &len);
    write_seed(dir, name, target, buf, len);
    free(buf);
}

static void write_envelope_seed(const char *dir, const char *name, Grpo__Envelope *env)
{
    write_envelope_seed_to(dir, name, 0, env);
}

/* Seeds: one well-formed message of each kind, so mutations start from the real grammar. */
static void write_seeds(const char *dir, uint64_t incarnation)
{
    mkdir(dir, 0755);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char *caps[] = {"rollout", "trainer"}, *dev[] = {"cpu"};
    reg.rank = 1;
    reg.world_size = 2;
    reg.host = "node01";
    reg.pid = 7;
    reg.capabilities = caps;
    reg.n_capabilities = 2;
    reg.devices = dev;
    reg.n_devices = 1;
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    write_envelope_seed(dir, "register", &env);
    Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
    Grpo__Metric m = GRPO__METRIC__INIT, *mp = &m;
    Grpo__PhaseTime pt = GRPO__PHASE_TIME__INIT, *ptp = &pt;
    m.name = "critic/score/mean";
    m.value = 0.5;
    pt.phase = GRPO__PHASE__PHASE_GEN;
    pt.seconds = 1.5;
    hb.incarnation = incarnation;
    hb.step = 3;
    hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
    hb.metrics = &mp;
    hb.n_metrics = 1;
    hb.timings = &ptp;
    hb.n_timings = 1;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    write_envelope_seed(dir, "heartbeat", &env);
    Grpo__CommandRequest cr = GRPO__COMMAND_REQUEST__INIT;
    cr.command = GRPO__COMMAND__COMMAND_PAUSE;
    env.body_case = GRPO__ENVELOPE__BODY_COMMAND;
    env.command = &cr;
    write_envelope_seed(dir, "command", &env);
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    write_envelope_seed(dir, "status", &env);
    /* a tcp endpoint's (target 1, protocol 1.12): a hello, and a sealed request of a session grpod does not know */
    uint8_t nonce[32] = {1}, session[16] = {2}, box[64] = {3};
    Grpo__AuthHello hello = GRPO__AUTH_HELLO__INIT;
    hello.client_nonce.data = nonce;
    hello.client_nonce.len = sizeof nonce;
    env.body_case = GRPO__ENVELOPE__BODY_AUTH_HELLO;
    env.auth_hello = &hello;
    write_envelope_seed_to(dir, "tcp_hello", 1, &env);
    Grpo__Sealed sealed = GRPO__SEALED__INIT;
    sealed.session.data = session;
    sealed.session.len = sizeof session;
    sealed.counter = 1;
    sealed.box.data = box;
    sealed.box.len = sizeof box;
    env.body_case = GRPO__ENVELOPE__BODY_SEALED;
    env.sealed = &sealed;
    write_envelope_seed_to(dir, "tcp_sealed", 1, &env);
    char *state = core_save_json(&core);
    write_seed(dir, "state", 2, (const uint8_t *)state, strlen(state));
    free(state);
    struct arena a = {0};
    Grpo__Envelope st = GRPO__ENVELOPE__INIT;
    st.body_case = GRPO__ENVELOPE__BODY_STATUS;
    st.status = core_status(&core, now, &a);
    size_t len;
    uint8_t *buf = protocol_pack(&st, &len);
    write_seed(dir, "status_reply", 3, buf, len);
    free(buf);
    arena_free(&a);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    log_set_level(LOG_ERROR + (getenv("GRPO_FUZZ_VERBOSE") ? 3 : 0));
    struct core_settings set = {.heartbeat_interval_s = 1,
                                .heartbeat_timeout_s = 5,
                                .place = {.tp_size = 1, .pp_size = 1},
                                .data_endpoint = "",
                                .http_url = ""};
    core_init(&core, &set, now);
    core.rng = 0x5eed; /* deterministic tokens, so the seed heartbeat matches */
    /* one registered rank of two, so heartbeats and commands reach deep code */
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    reg.world_size = 2;
    reg.host = "node00";
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    size_t len, rlen;
    uint8_t *buf = protocol_pack(&env, &len);
    free(core_handle(&core, buf, len, NULL, now, &rlen));
    free(buf);
    const char *dir = getenv("GRPO_FUZZ_SEEDS");
    if (dir)
        write_seeds(dir, core.workers && core.workers[0] ? core.workers[0]->incarnation : 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t target = data[0] % 4;
    data++;
    size--;
    now += 0.25;
    switch (target) {
    case 0:
    case 1: { /* a request on a socket without / with a shared secret */
        size_t rlen;
        uint8_t *r = core_handle(&core, data, size, target ? "s3cret" : NULL, now, &rlen);
        Grpo__Envelope *e = protocol_unpack(r, rlen, (char[64]){0}, 64);
        if (!e)
            abort(); /* every answer must be a well-formed envelope */
        protocol_free(e);
        free(r);
        core_tick(&core, now);
        if (core.nevents == CORE_EVENTS && size % 7 == 0) {
            char *text = core_metrics_text(&core, now);
            free(text);
        }
        break;
    }
    case 2: { /* a state file */
        char *text = malloc(size + 1);
        memcpy(text, data, size);
        text[size] = 0;
        struct core c;
        struct core_settings set = core.set;
        core_init(&c, &set, now);
        char err[256];
        if (core_load_json(&c, text, now, err, sizeof err) == 0) {
            char *again = core_save_json(&c);
            free(again);
            free(core_metrics_text(&c, now));
        }
        core_deinit(&c);
        free(text);
        break;
    }
    default: { /* a reply, as grpoctl decodes and prints it */
        Grpo__Envelope *env;
        char why[256];
        if (protocol_decode(data, size, GRPO_MAX_MESSAGE_BYTES, &env, why, sizeof why) == PROTOCOL_OK &&
            env->body_case == GRPO__ENVELOPE__BODY_STATUS)
            free(status_to_json(env->status, 1));
        protocol_free(env);
        break;
    }
    }
    return 0;
}
