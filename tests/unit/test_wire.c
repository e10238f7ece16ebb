/* The data plane's wire codec and the placement arithmetic: a packed batch decodes to the same sequences; every
 * kind of bad message a stranger or a misconfigured rank could send is refused with a reason that names the
 * field; impossible placements are errors that name the keys. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/placement.h"
#include "proto/protocol.h"
#include "common/config.h"
#include "worker/plane/wire.h"
#include "worker/step/batch.h"

#define B 3
#define N 2
#define PLEN 4

struct fx {
    struct prompt_set set;
    struct prompt_item items[5];
    int32_t ids[5][PLEN];
    struct step_batch b;
    struct wire_limits lim;
};

static struct fx *make(void)
{
    struct fx *f = calloc(1, sizeof *f);
    for (int u = 0; u < 5; u++) {
        for (int t = 0; t < PLEN; t++)
            f->ids[u][t] = 10 * u + t;
        f->items[u] = (struct prompt_item){.data_source = "arithmetic", .ids = f->ids[u], .len = PLEN};
    }
    f->set = (struct prompt_set){.name = "fixture", .n = 5, .items = f->items};
    /* groups 1 and 2 of a 3-group step: uids 4 and 0 */
    const int uids[2] = {4, 0};
    step_batch_reserve(&f->b, 2 * N);
    for (int g = 0; g < 2; g++) {
        f->b.group_prompt[g] = &f->items[uids[g]];
        f->b.group_uid[g] = uids[g];
        f->b.n_groups++;
        for (int s = 0; s < N; s++) {
            struct rollout_seq *q = &f->b.seqs[f->b.n_seq];
            memset(q, 0, sizeof *q);
            q->group = g;
            q->gidx = (g + 1) * N + s;
            q->prompt = f->ids[uids[g]];
            q->prompt_len = PLEN;
            q->resp_len = 2 + s;
            q->resp = malloc(sizeof(int32_t) * (size_t)q->resp_len);
            q->gen_logp = malloc(sizeof(float) * (size_t)q->resp_len);
            for (int t = 0; t < q->resp_len; t++) {
                q->resp[t] = 7 + t + s;
                q->gen_logp[t] = -0.5f * (float)(t + 1);
            }
            q->score = 0.25 * (s + 1);
            q->raw_score = q->score - 0.125;
            q->acc = s == 1 ? NAN : (double)(s % 2); /* 0, unknown, 0, 1, ... */
            q->stopped = s == 0;
            f->b.resp_text[f->b.n_seq++] = NULL;
        }
    }
    f->lim = (struct wire_limits){.prompts = &f->set,
                                  .vocab_size = 100,
                                  .max_response_length = 8,
                                  .groups_in_step = B,
                                  .n = N,
                                  .units = 1,
                                  .world_size = 3,
                                  .dp_rank = 1};
    return f;
}

static void drop(struct fx *f)
{
    step_batch_free(&f->b);
    free(f);
}

static const struct wire_header HDR = {.step = 5,
                                       .from_rank = 2,
                                       .to_dp = 1,
                                       .seq_no = 9,
                                       .policy_version = 4,
                                       .groups_in_step = B,
                                       .n = N,
                                       .gen_s = 1.5,
                                       .reward_s = 0.25,
                                       .idle_s = 0.5,
                                       .unit = 0,
                                       .units = 1};

static uint8_t *pack(struct fx *f, const struct wire_header *h, size_t *len)
{
    const int groups[2] = {0, 1};
    return wire_pack_batch(h, &f->b, groups, 2, NULL, len);
}

/* DAPO's filter by algorithm.filter_groups.metric, hand-worked: three groups of two responses.
 * group 0: scores 1, 0 (varied); accuracy 1, 1 (the same)
 * group 1: scores 0.5, 0.5 with the overlong penalty, raw 1, 0 (varied only before the penalty); accuracy NaN
 *          (a scorer that does not know it: the score decides)
 * group 2: scores 0, 0; raw 0, 0; accuracy 0, 1 */
static void test_filter_metric(void **state)
{
    (void)state;
    static const double score[6] = {1, 0, 0.5, 0.5, 0, 0}, raw[6] = {1, 0, 1, 0, 0, 0};
    static const double acc[6] = {1, 1, NAN, NAN, 0, 1};
    for (int metric = 0; metric < 3; metric++) {
        struct step_batch b = {0};
        step_batch_reserve(&b, 6);
        b.n_groups = 3;
        for (int i = 0; i < 6; i++) {
            memset(&b.seqs[i], 0, sizeof b.seqs[i]);
            b.seqs[i].group = i / 2;
            b.seqs[i].score = score[i];
            b.seqs[i].raw_score = raw[i];
            b.seqs[i].acc = acc[i];
            b.resp_text[i] = NULL;
        }
        b.n_seq = 6;
        for (int g = 0; g < 3; g++) {
            b.group_uid[g] = 10 + g;
            b.group_prompt[g] = NULL;
        }
        static const char *const names[] = {"seq_final_reward", "score", "acc"};
        step_batch_filter_groups(&b, step_filter_metric_from_name(names[metric]));
        /* kept: seq_final_reward {10}; score (before the penalty) {10, 11}; acc {12} (group 1 falls back to its equal
         * scores) */
        static const int want_n[3] = {1, 2, 1};
        static const int want_first[3] = {10, 10, 12};
        assert_int_equal(b.n_groups, want_n[metric]);
        assert_int_equal(b.group_uid[0], want_first[metric]);
        assert_int_equal(b.n_seq, 2 * want_n[metric]);
        step_batch_free(&b);
    }
}

static void test_round_trip(void **state)
{
    (void)state;
    struct fx *f = make();
    size_t len;
    uint8_t *buf = pack(f, &HDR, &len);
    struct step_batch out = {0};
    struct wire_header h;
    char why[512] = "";
    assert_int_equal(wire_unpack_batch(buf, len, &f->lim, &h, &out, why, sizeof why), 0);
    assert_int_equal(h.step, 5);
    assert_int_equal(h.seq_no, 9);
    assert_int_equal(h.policy_version, 4);
    assert_true(h.gen_s == 1.5 && h.reward_s == 0.25 && h.idle_s == 0.5);
    assert_int_equal(out.n_groups, 2);
    assert_int_equal(out.n_seq, 2 * N);
    for (int i = 0; i < out.n_seq; i++) {
        const struct rollout_seq *a = &f->b.seqs[i], *b = &out.seqs[i];
        assert_int_equal(b->gidx, a->gidx);
        assert_int_equal(out.group_uid[b->group], f->b.group_uid[a->group]);
        assert_ptr_equal(b->prompt, f->ids[out.group_uid[b->group]]); /* the trainer's own copy */
        assert_int_equal(b->resp_len, a->resp_len);
        assert_memory_equal(b->resp, a->resp, sizeof(int32_t) * (size_t)a->resp_len);
        assert_memory_equal(b->gen_logp, a->gen_logp, sizeof(float) * (size_t)a->resp_len);
        assert_true(b->score == a->score && b->raw_score == a->raw_score);
        assert_true(b->acc == a->acc || (isnan(b->acc) && isnan(a->acc)));
        assert_int_equal(b->stopped, a->stopped);
    }
    step_batch_free(&out);
    free(buf);
    drop(f);
}

/* decode buf and expect a refusal whose reason contains text; the batch stays empty */
static void refused(struct fx *f, const uint8_t *buf, size_t len, const char *text)
{
    struct step_batch out = {0};
    struct wire_header h;
    char why[512] = "";
    assert_int_equal(wire_unpack_batch(buf, len, &f->lim, &h, &out, why, sizeof why), -1);
    if (!strstr(why, text))
        fail_msg("reason '%s' does not mention '%s'", why, text);
    assert_int_equal(out.n_seq, 0);
}

static void test_garbage_and_wrong_version(void **state)
{
    (void)state;
    struct fx *f = make();
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    refused(f, junk, sizeof junk, "");
    refused(f, junk, 0, "");
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    size_t len;
    uint8_t *buf = protocol_pack(&env, &len);
    refused(f, buf, len, "only rollout batches");
    free(buf);
    /* a batch from a peer of another major version */
    buf = pack(f, &HDR, &len);
    Grpo__Envelope *e = protocol_unpack(buf, len, NULL, 0);
    assert_non_null(e);
    free(buf);
    e->version = GRPO_PROTOCOL_VERSION + 1;
    len = grpo__envelope__get_packed_size(e);
    buf = malloc(len);
    grpo__envelope__pack(e, buf);
    protocol_free(e);
    refused(f, buf, len, "version");
    free(buf);
    /* a truncated batch */
    buf = pack(f, &HDR, &len);
    refused(f, buf, len / 2, "");
    free(buf);
    drop(f);
}

static void test_bad_fields(void **state)
{
    (void)state;
    struct fx *f = make();
    size_t len;
    struct wire_header h = HDR;
    uint8_t *buf;
#define EXPECT_REFUSED(mutate, text)                                                                                   \
    do {                                                                                                               \
        struct fx *g = make();                                                                                         \
        h = HDR;                                                                                                       \
        mutate;                                                                                                        \
        buf = pack(g, &h, &len);                                                                                       \
        refused(g, buf, len, text);                                                                                    \
        free(buf);                                                                                                     \
        drop(g);                                                                                                       \
    } while (0)
    EXPECT_REFUSED(h.from_rank = 7, "from_rank");
    EXPECT_REFUSED(h.to_dp = 0, "DP rank");
    EXPECT_REFUSED(h.step = 0, "step");
    EXPECT_REFUSED(h.groups_in_step = B + 1, "train_batch_size");
    /* issue 27: header fields out of range (a version the step cannot be generated with, non-figures) */
    EXPECT_REFUSED(h.policy_version = 5, "policy_version 5 for step 5");
    EXPECT_REFUSED(h.policy_version = -1, "policy_version -1");
    EXPECT_REFUSED(h.gen_s = NAN, "gen_seconds nan");
    EXPECT_REFUSED(h.idle_s = -2, "idle_seconds -2");
    EXPECT_REFUSED(h.peak_rss_gb = 1e300, "peak_rss_gb");
    EXPECT_REFUSED(g->b.seqs[0].resp[0] = 100, "vocabulary");
    EXPECT_REFUSED(g->b.seqs[1].gen_logp[0] = 0.5f, "log-prob");
    EXPECT_REFUSED(g->b.seqs[2].score = INFINITY, "not finite");
    EXPECT_REFUSED(g->b.group_uid[0] = 9, "uid 9");
    EXPECT_REFUSED(g->b.group_uid[1] = 1, "prompt ids");                   /* uid 1 exists but the prompt differs */
    EXPECT_REFUSED(g->b.seqs[3].gidx = 3 * N, "group_index");              /* past the step */
    EXPECT_REFUSED(g->b.seqs[3].gidx = g->b.seqs[2].gidx, "repeats");      /* the same sample twice */
    EXPECT_REFUSED(g->lim.max_response_length = 2, "max_response_length"); /* sample 1 has 3 tokens */
    /* a response of no tokens (issue 27: its unpacking passed NULL to memcpy, and it was trained on) */
    EXPECT_REFUSED(g->b.seqs[2].resp_len = 0, "sequence 2: an empty response");
    EXPECT_REFUSED(h.unit = 1, "work unit 1 of 1"); /* the run's steps have one unit */
    EXPECT_REFUSED(h.units = 2, "1 units");         /* the sender counts other units */
    /* two units of a 3-group step: unit 0 is group 0 only, and this batch holds groups 0 and 1 */
    EXPECT_REFUSED((g->lim.units = 2, h.units = 2), "outside work unit 0");
    /* a group without all of its samples */
    struct fx *g = make();
    const int one[1] = {0};
    g->b.seqs[1].group = 1; /* group 0 keeps only sample 0 */
    buf = wire_pack_batch(&HDR, &g->b, one, 1, NULL, &len);
    g->b.seqs[1].group = 0;
    refused(g, buf, len, "not whole");
    free(buf);
    drop(g);
    drop(f);
}

/* Routing replay (protocol 1.9): each sequence's recorded experts (2 layers x 2 of 4 experts per input token) come
 * back as sent; a batch whose routes do not fit the trainer's model, or that carries routes the trainer does not
 * expect, is refused naming routed_experts. */
/* A fixture made by setup, changed by mutate, packed: refused with text. */
#define REFUSED_AFTER(setup, mutate, text)                                                                             \
    do {                                                                                                               \
        struct fx *r = make();                                                                                         \
        setup(r);                                                                                                      \
        mutate;                                                                                                        \
        size_t rlen;                                                                                                   \
        uint8_t *rbuf = pack(r, &HDR, &rlen);                                                                          \
        refused(r, rbuf, rlen, text);                                                                                  \
        free(rbuf);                                                                                                    \
        drop(r);                                                                                                       \
    } while (0)

static void with_routes(struct fx *f)
{
    const struct model_config mc = {.n_layers = 2, .n_experts = 4, .n_experts_per_tok = 2};
    wire_limits_set_routes(&f->lim, &mc, true);
    for (int i = 0; i < f->b.n_seq; i++) {
        struct rollout_seq *q = &f->b.seqs[i];
        const int n = rollout_seq_tokens(q) * 4;
        q->routes_w = 4;
        q->routes = malloc(sizeof *q->routes * (size_t)n);
        for (int j = 0; j < n; j++) /* pairs (e, e + 1 mod 4): distinct within a layer */
            q->routes[j] = (uint16_t)((j / 2 + i + (j % 2)) % 4);
    }
}

static void test_routes(void **state)
{
    (void)state;
    struct fx *f = make();
    with_routes(f);
    size_t len;
    uint8_t *buf = pack(f, &HDR, &len);
    struct step_batch out = {0};
    struct wire_header h;
    char why[512] = "";
    assert_int_equal(wire_unpack_batch(buf, len, &f->lim, &h, &out, why, sizeof why), 0);
    for (int i = 0; i < out.n_seq; i++) {
        const struct rollout_seq *a = &f->b.seqs[i], *b = &out.seqs[i];
        assert_int_equal(b->routes_w, 4);
        assert_non_null(b->routes);
        assert_memory_equal(b->routes, a->routes, sizeof *a->routes * (size_t)rollout_seq_tokens(a) * 4);
    }
    step_batch_free(&out);
    free(buf);
    /* a 1.8 sender, or routing replay off at the rollout rank: none carried where the trainer expects them */
    struct fx *g = make();
    g->lim.routes_layers = 2, g->lim.routes_k = 2, g->lim.routes_experts = 4;
    buf = pack(g, &HDR, &len);
    refused(g, buf, len, "routed_experts holds 0 bytes, not 40");
    free(buf);
    drop(g);
    REFUSED_AFTER(with_routes, r->b.seqs[1].routes[5] = 4, "layer 0: expert 4 is not one of the model's");
    REFUSED_AFTER(with_routes, r->b.seqs[0].routes[3] = 1, "layer 1: expert 1 is chosen twice"); /* routes[2] is 1 */
    REFUSED_AFTER(with_routes, r->lim.routes_layers = 3, "not 60");             /* another model's layers */
    REFUSED_AFTER(with_routes, r->lim.routes_layers = 0, "records no routing"); /* the trainer expects none */
    REFUSED_AFTER(with_routes, r->b.seqs[2].routes_w = 2, "sequence 2: routed_experts holds"); /* short */
    drop(f);
}

/* Response masks (protocol 1.10): a mask with 0s comes back as sent; none, and an all-ones one, come back as none
 * (every token the model's); a mask of another length, with a byte other than 0 or 1, or with no 1 is refused
 * naming response_mask. */
static void with_masks(struct fx *f)
{
    static const uint8_t m1[3] = {1, 0, 1}, m2[2] = {1, 1}, m3[3] = {0, 1, 1}; /* sequence 0: none */
    const uint8_t *m[4] = {NULL, m1, m2, m3};
    assert_int_equal(f->b.n_seq, 4);
    for (int i = 1; i < 4; i++) {
        struct rollout_seq *q = &f->b.seqs[i];
        q->mask = malloc((size_t)q->resp_len);
        memcpy(q->mask, m[i], (size_t)q->resp_len);
        for (int t = 0; t < q->resp_len; t++)
            if (!q->mask[t])
                q->gen_logp[t] = 0; /* a token put in from outside has no sampler's log-prob */
    }
}

/* The packed batch buf (replaced) with its sequence 1's response_mask cut to keep bytes. */
static uint8_t *cut_mask(uint8_t *buf, size_t *len, size_t keep)
{
    Grpo__Envelope *e = protocol_unpack(buf, *len, NULL, 0);
    assert_non_null(e);
    free(buf);
    Grpo__Sequence *q = e->rollout->sequences[1]; /* sequence 1: mask {1, 0, 1} */
    assert_int_equal(q->response_mask.len, 3);
    q->response_mask.len = keep;
    *len = grpo__envelope__get_packed_size(e);
    buf = malloc(*len);
    grpo__envelope__pack(e, buf);
    protocol_free(e);
    return buf;
}

static void test_response_mask(void **state)
{
    (void)state;
    struct fx *f = make();
    with_masks(f);
    size_t len;
    uint8_t *buf = pack(f, &HDR, &len);
    struct step_batch out = {0};
    struct wire_header h;
    char why[512] = "";
    assert_int_equal(wire_unpack_batch(buf, len, &f->lim, &h, &out, why, sizeof why), 0);
    assert_int_equal(out.n_seq, 4);
    assert_null(out.seqs[0].mask);
    assert_non_null(out.seqs[1].mask);
    assert_memory_equal(out.seqs[1].mask, ((const uint8_t[]){1, 0, 1}), 3);
    assert_null(out.seqs[2].mask); /* all ones */
    assert_memory_equal(out.seqs[3].mask, ((const uint8_t[]){0, 1, 1}), 3);
    assert_int_equal(rollout_seq_model_tokens(&out.seqs[1]), 2);
    assert_int_equal(rollout_seq_model_tokens(&out.seqs[2]), 2);
    assert_float_equal(out.seqs[1].gen_logp[1], 0.0, 0);
    /* the batch operations move a sequence's mask with it */
    bool keep[2] = {false, true};
    step_batch_keep_groups(&out, keep); /* group 1: sequences 2 and 3 */
    assert_int_equal(out.n_seq, 2);
    assert_null(out.seqs[0].mask);
    assert_memory_equal(out.seqs[1].mask, ((const uint8_t[]){0, 1, 1}), 3);
    step_batch_free(&out);
    free(buf);
    REFUSED_AFTER(with_masks, r->b.seqs[1].mask[1] = 2, "sequence 1: response_mask byte 1 is 2, not 0");
    REFUSED_AFTER(with_masks, r->b.seqs[3].mask[1] = r->b.seqs[3].mask[2] = 0,
                  "sequence 3: response_mask marks none of the 3 response tokens as the model's");
    buf = cut_mask(pack(f, &HDR, &len), &len, 2);
    refused(f, buf, len, "sequence 1: response_mask holds 2 bytes for 3 response tokens");
    free(buf);
    drop(f);
}

/* remax's baseline and gdpo's reward components travel with their sequence: as many components as the trainer's keys
 * (wire_limits.reward_parts), each finite; a sender of none to a gdpo trainer, or of some to another, is refused. */
static void with_parts(struct fx *f)
{
    f->lim.reward_parts = 2;
    for (int i = 0; i < f->b.n_seq; i++) {
        struct rollout_seq *q = &f->b.seqs[i];
        q->reward_baseline = 0.5 + i;
        q->n_parts = 2;
        q->reward_parts = malloc(2 * sizeof(double));
        q->reward_parts[0] = 0.1 * i;
        q->reward_parts[1] = 1.0 / 3.0;
    }
}

static void test_reward_parts(void **state)
{
    (void)state;
    struct fx *f = make();
    with_parts(f);
    size_t len;
    uint8_t *buf = pack(f, &HDR, &len);
    struct step_batch out = {0};
    struct wire_header h;
    char why[512] = "";
    assert_int_equal(wire_unpack_batch(buf, len, &f->lim, &h, &out, why, sizeof why), 0);
    for (int i = 0; i < 4; i++) {
        assert_true(out.seqs[i].reward_baseline == 0.5 + i);
        assert_int_equal(out.seqs[i].n_parts, 2);
        assert_true(out.seqs[i].reward_parts[0] == 0.1 * i && out.seqs[i].reward_parts[1] == 1.0 / 3.0);
    }
    step_batch_free(&out);
    f->lim.reward_parts = 3;
    refused(f, buf, len, "2 reward components (reward_parts), but this trainer takes 3");
    f->lim.reward_parts = 0;
    refused(f, buf, len, "2 reward components (reward_parts), but this trainer takes 0");
    free(buf);
    drop(f);
    REFUSED_AFTER(with_parts, r->b.seqs[2].reward_parts[1] = NAN, "reward component 1 is not finite");
    REFUSED_AFTER(with_parts, r->b.seqs[0].reward_baseline = INFINITY, "reward_baseline is not finite");
    /* a trainer of gdpo takes its keys' count from the configuration */
    struct grpo_config c;
    config_init(&c);
    struct cfg_error ce;
    assert_int_equal(config_set(&c, "algorithm.gdpo_reward_keys", "[a, b, c]", "test", &ce), 0);
    assert_int_equal(config_gdpo_parts(&c), 0); /* not gdpo */
    assert_int_equal(config_set(&c, "algorithm.adv_estimator", "gdpo", "test", &ce), 0);
    assert_int_equal(config_gdpo_parts(&c), 3);
    config_free(&c);
}

/* Multi-turn figures and the conversation travel with their sequence; impossible ones are refused by name. */
static void with_turns(struct fx *f)
{
    with_masks(f);
    struct rollout_seq *s = &f->b.seqs[1];
    s->num_turns = 3, s->tool_calls = 1, s->tool_errors = 1, s->tool_seconds = 0.25f, s->tokens_mismatch = true;
    s->messages_json = strdup("[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"tool\",\"content\":\"4\"}]");
}

static void test_turns(void **state)
{
    (void)state;
    struct fx *f = make();
    with_turns(f);
    size_t len;
    uint8_t *buf = pack(f, &HDR, &len);
    struct step_batch out = {0};
    struct wire_header h;
    char why[512] = "";
    assert_int_equal(wire_unpack_batch(buf, len, &f->lim, &h, &out, why, sizeof why), 0);
    const struct rollout_seq *s = &out.seqs[1];
    assert_int_equal(s->num_turns, 3);
    assert_int_equal(s->tool_calls, 1);
    assert_int_equal(s->tool_errors, 1);
    assert_float_equal(s->tool_seconds, 0.25, 0);
    assert_true(s->tokens_mismatch);
    assert_string_equal(s->messages_json, f->b.seqs[1].messages_json);
    assert_int_equal(out.seqs[0].num_turns, 0);
    assert_null(out.seqs[0].messages_json);
    step_batch_free(&out);
    free(buf);
    drop(f);
    REFUSED_AFTER(with_turns, r->b.seqs[1].num_turns = 9, "sequence 1: num_turns 9 for 3 response tokens");
    REFUSED_AFTER(with_turns, r->b.seqs[1].tool_errors = 2, "sequence 1: tool_calls 1 with tool_errors 2");
    REFUSED_AFTER(with_turns, r->b.seqs[1].tool_seconds = -1, "sequence 1: tool_seconds -1 is not a duration");
    REFUSED_AFTER(with_turns, (free(r->b.seqs[1].messages_json), r->b.seqs[1].messages_json = strdup("{\"role\":1}")),
                  "sequence 1: messages is not a JSON array of messages");
}

/* Authentication (proto/plane_auth.h): a batch without a MAC, with another process's key, naming another rank
 * than its credentials', or replayed is refused; a good one is taken; the answer is authenticated for its asker
 * only. Each of these was taken before protocol 1.8. */
static void test_auth(void **state)
{
    (void)state;
    struct fx *f = make();
    uint8_t run_key[PLANE_KEY_BYTES];
    plane_run_key_new(run_key);
    struct plane_verifier v;
    plane_verifier_init(&v, run_key, 3);
    struct wire_auth auth = {.v = &v};
    f->lim.auth = &auth;
    const int groups[2] = {0, 1};
    size_t len;
    /* no authentication */
    uint8_t *buf = wire_pack_batch(&HDR, &f->b, groups, 2, NULL, &len);
    refused(f, buf, len, "carries no authentication");
    assert_false(auth.verified);
    free(buf);
    /* a 1.7 peer's batch: the refusal names its version and the remedy */
    buf = wire_pack_batch(&HDR, &f->b, groups, 2, NULL, &len);
    Grpo__Envelope *old = protocol_unpack(buf, len, NULL, 0);
    free(buf);
    assert_non_null(old);
    old->minor_version = 7;
    len = grpo__envelope__get_packed_size(old);
    buf = malloc(len);
    assert_non_null(buf);
    grpo__envelope__pack(old, buf);
    protocol_free(old);
    refused(f, buf, len, "the sender speaks 1.7: upgrade the older side");
    free(buf);
    /* rank 2's credentials (HDR's from_rank), and those of rank 3 of another run */
    struct plane_cred me, other_run, rank3;
    plane_cred_issue(&me, run_key, &(struct plane_id){.rank = 2, .pid = 100, .incarnation = 7, .epoch = 3});
    plane_cred_issue(&rank3, run_key, &(struct plane_id){.rank = 3, .pid = 101, .incarnation = 8, .epoch = 3});
    uint8_t k2[PLANE_KEY_BYTES];
    plane_run_key_new(k2);
    plane_cred_issue(&other_run, k2, &(struct plane_id){.rank = 2, .pid = 100, .incarnation = 7, .epoch = 3});
    buf = wire_pack_batch(&HDR, &f->b, groups, 2, &other_run, &len);
    refused(f, buf, len, "authentication failed");
    free(buf);
    /* rank 3's key, claiming to be rank 2: its MAC is not rank 2's */
    struct plane_cred forged = rank3;
    forged.id.rank = 2;
    buf = wire_pack_batch(&HDR, &f->b, groups, 2, &forged, &len);
    refused(f, buf, len, "authentication failed");
    free(buf);
    /* rank 3 as itself, with from_rank 2 */
    buf = wire_pack_batch(&HDR, &f->b, groups, 2, &rank3, &len);
    refused(f, buf, len, "authenticated as rank 3");
    assert_true(auth.verified); /* its answer is authenticated for it */
    free(buf);
    /* good: taken; the same bytes again (a socket's resend of the last) pass the MAC check; an older one is a
     * replay */
    uint8_t *first = wire_pack_batch(&HDR, &f->b, groups, 2, &me, &len);
    size_t first_len = len;
    struct step_batch out = {0};
    struct wire_header h;
    char why[512] = "";
    assert_int_equal(wire_unpack_batch(first, first_len, &f->lim, &h, &out, why, sizeof why), 0);
    assert_true(auth.verified);
    assert_int_equal(auth.who.rank, 2);
    assert_int_equal(auth.counter, 1);
    step_batch_free(&out);
    assert_int_equal(wire_unpack_batch(first, first_len, &f->lim, &h, &out, why, sizeof why), 0);
    step_batch_free(&out);
    buf = wire_pack_batch(&HDR, &f->b, groups, 2, &me, &len);
    assert_int_equal(wire_unpack_batch(buf, len, &f->lim, &h, &out, why, sizeof why), 0);
    step_batch_free(&out);
    free(buf);
    refused(f, first, first_len, "replayed");
    free(first);
    /* the answer: authenticated for the asker and its counter, and for nobody else */
    Grpo__Envelope ans = GRPO__ENVELOPE__INIT;
    Grpo__Reply rep = GRPO__REPLY__INIT;
    rep.ok = 1;
    ans.body_case = GRPO__ENVELOPE__BODY_REPLY;
    ans.reply = &rep;
    buf = plane_pack_answer(&ans, &v, &me.id, 2, &len);
    Grpo__Envelope *e = protocol_unpack(buf, len, why, sizeof why);
    assert_non_null(e);
    assert_int_equal(plane_verify_answer(&me, 2, e, why, sizeof why), 0);
    assert_int_equal(plane_verify_answer(&me, 1, e, why, sizeof why), -1);    /* another request's */
    assert_int_equal(plane_verify_answer(&rank3, 2, e, why, sizeof why), -1); /* another process's */
    e->auth->mac.data[0] ^= 1;
    assert_int_equal(plane_verify_answer(&me, 2, e, why, sizeof why), -1); /* altered */
    protocol_free(e);
    free(buf);
    plane_verifier_free(&v);
    drop(f);
}

/* Counters of two threads of one process may cross: an older counter not seen yet is taken once. */
static void test_auth_window(void **state)
{
    (void)state;
    uint8_t run_key[PLANE_KEY_BYTES];
    plane_run_key_new(run_key);
    struct plane_verifier v;
    plane_verifier_init(&v, run_key, 1);
    struct plane_cred me;
    plane_cred_issue(&me, run_key, &(struct plane_id){.rank = 1, .pid = 5, .incarnation = 9, .epoch = 1});
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    uint8_t *m[4];
    size_t len[4];
    for (int i = 0; i < 4; i++)
        m[i] = plane_pack_request(&env, &me, &len[i]);
    const int order[4] = {0, 2, 1, 3};
    char why[256];
    struct plane_id who;
    uint64_t c;
    for (int i = 0; i < 4; i++) {
        Grpo__Envelope *e = protocol_unpack(m[order[i]], len[order[i]], why, sizeof why);
        assert_int_equal(plane_verify_request(&v, e, &who, &c, why, sizeof why), PLANE_OK);
        assert_int_equal(c, (uint64_t)order[i] + 1);
        protocol_free(e);
    }
    Grpo__Envelope *e = protocol_unpack(m[1], len[1], why, sizeof why);
    assert_int_equal(plane_verify_request(&v, e, &who, &c, why, sizeof why), PLANE_REPLAY);
    protocol_free(e);
    for (int i = 0; i < 4; i++)
        free(m[i]);
    plane_verifier_free(&v);
}

/* A verifier remembers every identity it was sized for (plane_verifier_capacity): with 2,000 processes, the first
 * one's message captured and sent again after the other 1,999 spoke is a replay. A table of the default 1,024 forgets
 * the first and takes it again (why every receiver sizes it for its run: docs/scaling.md). */
static void test_auth_many_identities(void **state)
{
    (void)state;
    uint8_t run_key[PLANE_KEY_BYTES];
    plane_run_key_new(run_key);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    enum { NPROC = 2000 };
    for (int sized = 0; sized < 2; sized++) {
        struct plane_verifier v;
        plane_verifier_init(&v, run_key, 1);
        if (sized)
            plane_verifier_capacity(&v, NPROC);
        char why[256];
        struct plane_id who;
        uint64_t c;
        uint8_t *first = NULL;
        size_t first_len = 0;
        for (int r = 0; r < NPROC; r++) {
            struct plane_cred p;
            plane_cred_issue(&p, run_key, &(struct plane_id){.rank = r, .pid = 7, .incarnation = 11, .epoch = 1});
            size_t len;
            uint8_t *m = plane_pack_request(&env, &p, &len);
            Grpo__Envelope *e = protocol_unpack(m, len, why, sizeof why);
            assert_int_equal(plane_verify_request(&v, e, &who, &c, why, sizeof why), PLANE_OK);
            protocol_free(e);
            if (r == 0) {
                first = m;
                first_len = len;
            } else {
                free(m);
            }
        }
        Grpo__Envelope *e = protocol_unpack(first, first_len, why, sizeof why);
        /* the last message of rank 0 again: a resend to the sized table, taken as new by the default one */
        assert_int_equal(plane_verify_request(&v, e, &who, &c, why, sizeof why), sized ? PLANE_REPEAT : PLANE_OK);
        protocol_free(e);
        free(first);
        plane_verifier_free(&v);
    }
}

/* Keys die with their launch (protocol 1.12): a batch of the launch before (its key epoch, the same run key or its
 * own) is refused by the next launch's verifier before its MAC is computed, as is a 1.11 sender's (no epoch); a
 * batch whose epoch field was changed to the current one fails its MAC (the epoch is part of the key and of what
 * the MAC covers). */
static void test_auth_epoch(void **state)
{
    (void)state;
    struct fx *f = make();
    uint8_t key1[PLANE_KEY_BYTES], key2[PLANE_KEY_BYTES];
    plane_run_key_new(key1);
    plane_run_key_new(key2);
    const int groups[2] = {0, 1};
    size_t len;
    /* launch 1 (epoch 1): a batch captured on its way */
    struct plane_cred l1;
    plane_cred_issue(&l1, key1, &(struct plane_id){.rank = 2, .pid = 100, .incarnation = 7, .epoch = 1});
    uint8_t *captured = wire_pack_batch(&HDR, &f->b, groups, 2, &l1, &len);
    const size_t captured_len = len;
    /* launch 2 (epoch 2): a fresh verifier, as a relaunched trainer's */
    struct plane_verifier v;
    plane_verifier_init(&v, key2, 2);
    struct wire_auth auth = {.v = &v};
    f->lim.auth = &auth;
    refused(f, captured, captured_len, "key epoch 1, not this launch's (2)");
    assert_false(auth.verified);
    /* the same run key kept across the relaunch (what grpod did before 1.12) is refused all the same */
    struct plane_verifier same_key;
    plane_verifier_init(&same_key, key1, 2);
    auth.v = &same_key;
    refused(f, captured, captured_len, "another launch's keys are dead");
    /* the capture with its epoch field rewritten to the current one: its MAC fails */
    Grpo__Envelope *e = protocol_unpack(captured, captured_len, NULL, 0);
    assert_non_null(e);
    e->auth->epoch = 2;
    len = grpo__envelope__get_packed_size(e);
    uint8_t *rewritten = malloc(len);
    assert_non_null(rewritten);
    grpo__envelope__pack(e, rewritten);
    protocol_free(e);
    refused(f, rewritten, len, "authentication failed");
    free(rewritten);
    /* a sender of 1.11 (no epoch) */
    struct plane_cred old;
    plane_cred_issue(&old, key1, &(struct plane_id){.rank = 2, .pid = 100, .incarnation = 7});
    uint8_t *buf = wire_pack_batch(&HDR, &f->b, groups, 2, &old, &len);
    e = protocol_unpack(buf, len, NULL, 0);
    free(buf);
    assert_non_null(e);
    e->minor_version = 11;
    len = grpo__envelope__get_packed_size(e);
    buf = malloc(len);
    assert_non_null(buf);
    grpo__envelope__pack(e, buf);
    protocol_free(e);
    refused(f, buf, len, "no key epoch (a sender of protocol 1.11");
    free(buf);
    /* launch 2's own batch is taken */
    auth.v = &v;
    struct plane_cred l2;
    plane_cred_issue(&l2, key2, &(struct plane_id){.rank = 2, .pid = 100, .incarnation = 7, .epoch = 2});
    buf = wire_pack_batch(&HDR, &f->b, groups, 2, &l2, &len);
    struct step_batch out = {0};
    struct wire_header h;
    char why[512] = "";
    assert_int_equal(wire_unpack_batch(buf, len, &f->lim, &h, &out, why, sizeof why), 0);
    step_batch_free(&out);
    free(buf);
    free(captured);
    plane_verifier_free(&v);
    plane_verifier_free(&same_key);
    drop(f);
}

static void test_placement(void **state)
{
    (void)state;
    char why[512];
    struct placement p;
    const struct placement_spec split = {.trainer_ranks = 2, .rollout_ranks = 1, .tp_size = 1, .pp_size = 1};
    assert_int_equal(placement_of(&split, 1, 3, &p, why, sizeof why), 0);
    assert_int_equal(p.role, PLACE_TRAINER);
    assert_int_equal(p.dp, 1);
    assert_int_equal(p.dp_size, 2);
    assert_int_equal(placement_of(&split, 2, 3, &p, why, sizeof why), 0);
    assert_int_equal(p.role, PLACE_ROLLOUT);
    assert_int_equal(p.dp, 0);
    assert_int_equal(placement_of(&split, 0, 4, &p, why, sizeof why), -1);
    assert_non_null(strstr(why, "placement.trainer_ranks 2 + placement.rollout_ranks 1 = 3"));
    assert_non_null(strstr(why, "4 ranks"));
    const struct placement_spec none = {.trainer_ranks = 0, .rollout_ranks = 3, .tp_size = 1, .pp_size = 1};
    assert_int_equal(placement_of(&none, 0, 3, &p, why, sizeof why), -1);
    assert_non_null(strstr(why, "no trainers"));
    const struct placement_spec many = {.trainer_ranks = 1, .rollout_ranks = 5, .tp_size = 1, .pp_size = 1};
    assert_int_equal(placement_check(&many, 6, 4, why, sizeof why), -1);
    assert_non_null(strstr(why, "placement.rollout_ranks 5"));
    assert_non_null(strstr(why, "4 prompts"));
    assert_int_equal(placement_check(&split, 3, 4, why, sizeof why), 0);
    const struct placement_spec mp = {.trainer_ranks = 6, .rollout_ranks = 1, .tp_size = 4, .pp_size = 1};
    assert_int_equal(placement_of(&mp, 0, 7, &p, why, sizeof why), -1);
    assert_non_null(strstr(why, "not a multiple of actor_rollout_ref.actor.megatron.tensor_model_parallel_size 4"));
    /* trainer ranks and no rollout split (verl's trainer.nnodes x n_gpus_per_node alone): every rank colocated
     * (hybrid), laid out as trainers, with its generation group from the rollout TP */
    const struct placement_spec one = {.trainer_ranks = 1, .rollout_ranks = 0, .tp_size = 1, .pp_size = 1};
    assert_int_equal(placement_of(&one, 0, 1, &p, why, sizeof why), 0);
    assert_int_equal(p.role, PLACE_HYBRID);
    assert_int_equal(p.dp_size, 1);
    const struct placement_spec colo = {
        .trainer_ranks = 8, .rollout_ranks = 0, .tp_size = 2, .pp_size = 2, .rollout_tp = 4};
    for (int r = 0; r < 8; r++) {
        assert_int_equal(placement_of(&colo, r, 8, &p, why, sizeof why), 0);
        assert_int_equal(p.role, PLACE_HYBRID);
        assert_int_equal(p.dp_size, 2);
        assert_int_equal((p.pp * p.dp_size + p.dp) * p.tp_size + p.tp, r);
        assert_int_equal(p.engine, r / 4);
        assert_int_equal(p.engine_tp, r % 4);
        assert_int_equal(p.engines, 2);
    }
    const struct placement_spec odd = {
        .trainer_ranks = 4, .rollout_ranks = 0, .tp_size = 1, .pp_size = 1, .rollout_tp = 3};
    assert_int_equal(placement_of(&odd, 0, 4, &p, why, sizeof why), -1);
    assert_non_null(strstr(why, "4 colocated ranks are not a multiple of"));
    assert_non_null(strstr(why, "tensor_model_parallel_size 3"));
    const struct placement_spec wide = {.trainer_ranks = 8, .rollout_ranks = 0, .tp_size = 1, .pp_size = 1};
    assert_int_equal(placement_check(&wide, 8, 4, why, sizeof why), -1); /* 8 generation groups, 4 prompts */
    assert_non_null(strstr(why, "4 prompts"));
    assert_int_equal(placement_of(&one, 0, 2, &p, why, sizeof why), -1); /* -np 2 for one trainer rank */
    assert_non_null(strstr(why, "trainer.nnodes x trainer.n_gpus_per_node"));
    assert_non_null(strstr(why, "is 1"));
    assert_non_null(strstr(why, "started 2 ranks"));
    /* Megatron order: rank = (pp * dp_size + dp) * tp_size + tp */
    const struct placement_spec tp = {.trainer_ranks = 8, .rollout_ranks = 2, .tp_size = 2, .pp_size = 2};
    for (int r = 0; r < 8; r++) {
        assert_int_equal(placement_of(&tp, r, 10, &p, why, sizeof why), 0);
        assert_int_equal((p.pp * p.dp_size + p.dp) * p.tp_size + p.tp, r);
    }
    /* with CP between TP and DP, worked by hand for 16 ranks, TP 2, CP 2, PP 2 (DP 2), EP 2: rank 13 = 1101b is
     * tp 1, cp 0, dp 1, pp 1, so EP rank 1 of expert group 0 */
    const struct placement_spec cpl = {.tp_size = 2, .pp_size = 2, .cp_size = 2, .ep_size = 2};
    assert_int_equal(placement_of(&cpl, 13, 16, &p, why, sizeof why), 0);
    assert_int_equal(p.tp, 1);
    assert_int_equal(p.cp, 0);
    assert_int_equal(p.dp, 1);
    assert_int_equal(p.pp, 1);
    assert_int_equal(p.dp_size, 2);
    assert_int_equal(p.ep, 1);
    assert_int_equal(p.ep_size, 2);
    assert_int_equal(placement_of(&cpl, 6, 16, &p, why, sizeof why), 0); /* 0110b: tp 0, cp 1, dp 1, pp 0 */
    assert_true(p.tp == 0 && p.cp == 1 && p.dp == 1 && p.pp == 0);
    /* a world that does not divide by TP x PP x CP names the CP key given; EP must divide DP */
    const struct placement_spec sp3 = {
        .tp_size = 1, .pp_size = 1, .cp_size = 3, .cp_key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"};
    assert_int_equal(placement_of(&sp3, 0, 8, &p, why, sizeof why), -1);
    assert_non_null(strstr(why, "ulysses_sequence_parallel_size 3"));
    const struct placement_spec ep3 = {.tp_size = 1, .pp_size = 1, .ep_size = 3};
    assert_int_equal(placement_of(&ep3, 0, 4, &p, why, sizeof why), -1);
    assert_non_null(strstr(why, "expert_model_parallel_size 3"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),    cmocka_unit_test(test_garbage_and_wrong_version),
        cmocka_unit_test(test_bad_fields),    cmocka_unit_test(test_routes),
        cmocka_unit_test(test_response_mask), cmocka_unit_test(test_turns),
        cmocka_unit_test(test_auth),          cmocka_unit_test(test_auth_epoch),
        cmocka_unit_test(test_auth_window),   cmocka_unit_test(test_auth_many_identities),
        cmocka_unit_test(test_placement),     cmocka_unit_test(test_filter_metric),
        cmocka_unit_test(test_reward_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
