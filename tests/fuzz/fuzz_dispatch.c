/* libFuzzer harness of the dispatcher (worker/plane/dispatch_core.c): every message its REP socket takes, decoded
 * and answered by the pure core, mixed with what the trainer's thread does between them (publishing versions,
 * the clock moving, the run ending, the weight broadcast's rounds). An input is a script of records
 *     [op] [length, 2 bytes little-endian] [length bytes]
 * run against a fresh core (2 work units, one-step-off, 5 steps), so a crash file reproduces by itself. Every
 * answer must decode as an envelope.
 *
 * Built and run by run_fuzz.sh (clang -fsanitize=fuzzer,address,undefined). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "worker/plane/dispatch_core.h"

#define FLOATS 300

static void publish(struct dispatch_core *d, int64_t v)
{
    float *w = dispatch_core_publish_begin(d, v);
    if (!w)
        return;
    for (int i = 0; i < FLOATS; i++)
        w[i] = (float)v + (float)i * 1e-3f;
    dispatch_core_publish_end(d, v);
}

static void run(const uint8_t *data, size_t size)
{
    const struct dispatch_options o = {.units = 2,
                                       .groups_in_step = 4,
                                       .staleness = 1,
                                       .start = 0,
                                       .total_steps = 5,
                                       .start_epoch = 0,
                                       .start_cursor = 0,
                                       .n_floats = FLOATS,
                                       .lost_after_s = 2};
    double now = 100.0;
    char err[256];
    struct dispatch_core *d = dispatch_core_create(&o, now, err, sizeof err);
    if (!d)
        abort();
    int64_t version = 0;
    publish(d, version);
    size_t i = 1;
    while (i + 3 <= size) {
        uint8_t op = data[i];
        size_t len = (size_t)data[i + 1] | (size_t)data[i + 2] << 8;
        i += 3;
        if (len > size - i)
            len = size - i;
        const uint8_t *msg = data + i;
        i += len;
        now += 0.1;
        switch (op % 8) {
        case 5: /* the trainers trained a step: its version goes out */ publish(d, ++version); break;
        case 6: dispatch_core_end(d, version, "fuzz: the trainers stopped"); break;
        case 7: { /* the weight broadcast: on, a round begun and ended, or the trainers' wait */
            dispatch_core_broadcast_on(d, 5.0);
            int64_t v;
            const float *w;
            if (dispatch_core_round_begin(d, &v, &w)) {
                volatile float x = w[0] + w[FLOATS - 1]; /* the weights must be readable */
                (void)x;
                dispatch_core_round_end(d, len % 2 == 0);
            }
            (void)dispatch_core_round_due(d, (double)len);
            break;
        }
        case 4: /* the clock moves */
            now += (double)len * 0.5;
            dispatch_core_tick(d, now);
            break;
        default: {
            size_t rlen;
            uint8_t *r = dispatch_core_handle(d, msg, len, now, &rlen);
            Grpo__Envelope *e = protocol_unpack(r, rlen, NULL, 0);
            if (!e)
                abort(); /* every answer is a well-formed envelope */
            protocol_free(e);
            free(r);
            break;
        }
        }
    }
    struct dispatch_stats st;
    dispatch_core_stats(d, &st);
    if (st.live < 0 || st.granted < st.regranted)
        abort();
    (void)dispatch_core_all_heard(d);
    dispatch_core_free(d);
}

/* Seeds: the conversation of two rollout processes with the dispatcher, from real messages. */
static void put(FILE *f, uint8_t op, const uint8_t *buf, size_t len)
{
    fputc(op, f);
    fputc((int)(len & 0xff), f);
    fputc((int)(len >> 8), f);
    if (len)
        fwrite(buf, 1, len, f);
}

static void put_env(FILE *f, Grpo__Envelope *env, const char *secret)
{
    if (secret)
        envelope_set_secret(env, secret);
    size_t len;
    uint8_t *buf = protocol_pack(env, &len);
    put(f, 0, buf, len);
    free(buf);
}

static void write_seed(const char *dir, const char *name, const char *secret, int broadcast)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return;
    fputc(secret ? 1 : 0, f);
    if (broadcast)
        put(f, 7, NULL, 0);
    for (int step = 1; step <= 5; step++)
        for (int rank = 0; rank < 2; rank++) {
            Grpo__Envelope env = GRPO__ENVELOPE__INIT;
            Grpo__WorkRequest w = GRPO__WORK_REQUEST__INIT;
            w.worker_id = 0x1000 + (uint64_t)rank;
            w.rank = rank;
            w.ping = 1;
            env.body_case = GRPO__ENVELOPE__BODY_WORK_REQUEST;
            env.work_request = &w;
            env.request_id = (uint64_t)step * 10 + (uint64_t)rank;
            put_env(f, &env, secret);
            w.ping = 0;
            w.names_done = step > 1;
            w.done_step = step - 1;
            w.done_unit = rank;
            put_env(f, &env, secret);
            Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
            q.worker_id = w.worker_id;
            q.version = step - 1;
            q.offset = 0;
            q.count = 100;
            q.broadcast = broadcast;
            env.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
            env.weights_request = &q;
            put_env(f, &env, secret);
            if (broadcast)
                put(f, 7, NULL, 0);
            if (rank == 1)
                put(f, 5, NULL, 0);
        }
    put(f, 4, (const uint8_t[8]){0}, 8); /* silence: both processes lost */
    put(f, 6, NULL, 0);
    fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    log_set_level(LOG_ERROR + (getenv("GRPO_FUZZ_VERBOSE") ? 3 : 0));
    const char *dir = getenv("GRPO_FUZZ_SEEDS");
    if (dir) {
        mkdir(dir, 0755);
        write_seed(dir, "run", NULL, 0);
        write_seed(dir, "run_secret", "s3cret", 0);
        write_seed(dir, "run_broadcast", NULL, 1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 1)
        run(data, size);
    return 0;
}
