/* libFuzzer harness of the trainer's data socket: wire_unpack_batch, the checked decoding of a rollout batch,
 * against a small run (8 prompts, a vocabulary of 64, 4 groups of 2 per step in 2 work units). The first input
 * byte says whether the trainer checks the data plane's authentication (a fixed run key; the seeds carry good
 * MACs of the rollout ranks' processes under it); the rest is the message as it came off the socket. Each input
 * stands alone (a fresh verifier, no state between inputs), so a crash file reproduces by itself. A batch that is
 * accepted must keep what the decoder promises: whole groups, responses of 1..max tokens inside the vocabulary, finite
 * rewards and log-probabilities.
 *
 * Built and run by run_fuzz.sh (clang -fsanitize=fuzzer,address,undefined). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "worker/plane/wire.h"
#include "worker/step/batch.h"

#define PROMPTS 8
#define VOCAB 64
#define MAX_RESP 16
#define GROUPS 4
#define N 2
#define UNITS 2

static struct prompt_item items[PROMPTS];
static int32_t ids[PROMPTS][8];
static struct prompt_set prompts = {.name = "fuzz", .n = PROMPTS, .items = items};

static const uint8_t run_key[PLANE_KEY_BYTES] = {7, 1, 7, 2, 7, 3};

static struct wire_limits limits(struct wire_auth *auth)
{
    return (struct wire_limits){.prompts = &prompts,
                                .vocab_size = VOCAB,
                                .max_response_length = MAX_RESP,
                                .groups_in_step = GROUPS,
                                .n = N,
                                .units = UNITS,
                                .world_size = 4,
                                .dp_rank = 0,
                                .auth = auth};
}

static void write_seed(const char *dir, const char *name, uint8_t first, const uint8_t *buf, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return;
    fputc(first, f);
    fwrite(buf, 1, len, f);
    fclose(f);
}

/* A real batch: unit u's groups (uids of its groups given), each of N samples with responses of 1..4 tokens. */
static void seed_batch(const char *dir, const char *name, int unit, const int *uids, bool authenticated)
{
    struct step_batch b = {0};
    int lo = GROUPS * unit / UNITS, hi = GROUPS * (unit + 1) / UNITS, ng = hi - lo;
    step_batch_reserve(&b, ng * N);
    int groups[GROUPS];
    for (int g = 0; g < ng; g++) {
        groups[g] = g;
        b.group_uid[g] = uids[g];
        b.group_prompt[g] = &items[uids[g]];
        b.n_groups++;
        for (int s = 0; s < N; s++) {
            struct rollout_seq *q = &b.seqs[b.n_seq];
            memset(q, 0, sizeof *q);
            q->group = g;
            q->gidx = (lo + g) * N + s;
            q->prompt = items[uids[g]].ids;
            q->prompt_len = items[uids[g]].len;
            q->resp_len = 1 + (g + s) % 4;
            q->resp = calloc((size_t)q->resp_len, sizeof(int32_t));
            q->gen_logp = calloc((size_t)q->resp_len, sizeof(float));
            for (int t = 0; t < q->resp_len; t++)
                q->resp[t] = (t * 11 + s) % VOCAB, q->gen_logp[t] = -0.5f * (float)(t + 1);
            q->stopped = s == 0;
            q->score = q->raw_score = s;
            q->acc = s;
            b.resp_text[b.n_seq++] = NULL;
        }
    }
    struct wire_header h = {.step = 1 + unit,
                            .from_rank = 2 + unit,
                            .to_dp = 0,
                            .seq_no = 1,
                            .policy_version = 0,
                            .groups_in_step = GROUPS,
                            .n = N,
                            .gen_s = 1.5,
                            .reward_s = 0.1,
                            .unit = unit,
                            .units = UNITS};
    size_t len;
    struct plane_cred cred;
    plane_cred_issue(&cred, run_key, &(struct plane_id){.rank = h.from_rank, .pid = 100 + (uint32_t)unit, .epoch = 1});
    uint8_t *buf = wire_pack_batch(&h, &b, groups, ng, authenticated ? &cred : NULL, &len);
    write_seed(dir, name, authenticated ? 1 : 0, buf, len);
    free(buf);
    step_batch_free(&b);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    log_set_level(LOG_ERROR + (getenv("GRPO_FUZZ_VERBOSE") ? 3 : 0));
    if (plane_init() != 0)
        abort();
    for (int i = 0; i < PROMPTS; i++) {
        items[i].data_source = "fuzz";
        items[i].len = 1 + i % 5;
        for (int j = 0; j < items[i].len; j++)
            ids[i][j] = (i * 7 + j) % VOCAB;
        items[i].ids = ids[i];
    }
    const char *dir = getenv("GRPO_FUZZ_SEEDS");
    if (dir) {
        mkdir(dir, 0755);
        seed_batch(dir, "unit0", 0, (const int[]){3, 5}, false);
        seed_batch(dir, "unit1", 1, (const int[]){0, 7}, false);
        seed_batch(dir, "unit0_auth", 0, (const int[]){1, 2}, true);
        seed_batch(dir, "unit1_auth", 1, (const int[]){4, 6}, true);
        struct step_batch empty = {0};
        struct wire_header h = {
            .step = 2, .from_rank = 3, .seq_no = 9, .groups_in_step = GROUPS, .n = N, .unit = 1, .units = UNITS};
        size_t len;
        uint8_t *buf = wire_pack_batch(&h, &empty, NULL, 0, NULL, &len);
        write_seed(dir, "empty", 0, buf, len);
        free(buf);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct plane_verifier v;
    plane_verifier_init(&v, run_key, 1);
    struct wire_auth auth = {.v = &v};
    const struct wire_limits lim = limits(data[0] & 1 ? &auth : NULL);
    struct wire_header h;
    struct step_batch b = {0};
    char why[512];
    if (wire_unpack_batch(data + 1, size - 1, &lim, &h, &b, why, sizeof why) == 0) {
        if (h.unit < 0 || h.unit >= UNITS || h.step < 1 || b.n_seq > GROUPS * N)
            abort();
        for (int i = 0; i < b.n_seq; i++) {
            const struct rollout_seq *s = &b.seqs[i];
            if (s->resp_len < 1 || s->resp_len > MAX_RESP || s->group < 0 || s->group >= b.n_groups || s->gidx < 0 ||
                s->gidx >= GROUPS * N || !isfinite(s->score) || !isfinite(s->raw_score))
                abort();
            for (int t = 0; t < s->resp_len; t++)
                if (s->resp[t] < 0 || s->resp[t] >= VOCAB || !isfinite(s->gen_logp[t]))
                    abort();
        }
        if (b.n_seq % N != 0)
            abort(); /* whole groups only */
    } else if (!why[0]) {
        abort(); /* a refusal says why */
    }
    step_batch_free(&b);
    plane_verifier_free(&v);
    return 0;
}
