/* Prompt datasets: JSONL layouts and errors that name file:line, the synthetic
 * generators (determinism, disjoint splits, answers the matching scorer
 * accepts), the per-epoch order and the resumable cursor. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/log.h"
#include "worker/data/dataset.h"
#include "worker/rewards/scorers.h"
#include "worker/tokenizer/tokenizer.h"

#define FIXTURE "tests/fixtures/data/prompts.jsonl"

/* Pinned outputs of seed 1: any change to the generators or the PRNG shows here (and changes the
 * prompts of every run made with the old version). */
#define ARITH_SEED1_TRAIN0 "What is 8 + 16?"
#define ARITH_SEED1_TRAIN0_GT "24"
#define ARITH_SEED1_VAL0 "What is 71 - 8?"
#define COUNTDOWN_SEED1_TRAIN0_GT "{\"target\": 61, \"numbers\": [44, 42, 25]}"
#define ORDER_N8_SEED1_EPOCH0                                                                                          \
    {                                                                                                                  \
        4, 2, 7, 6, 0, 3, 5, 1                                                                                         \
    }

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/grpo_data_XXXXXX.jsonl");
    int fd = mkstemps(path, 6);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    return path;
}

static void test_jsonl_layouts(void **state)
{
    (void)state;
    struct dataset d = {0};
    char err[512];
    if (dataset_load_jsonl(FIXTURE, NULL, &d, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(d.n, 6);
    struct prompt_sample *s = d.samples;

    /* a prompt string: one user message */
    assert_string_equal(s[0].data_source, "arithmetic");
    assert_int_equal(s[0].n_messages, 1);
    assert_string_equal(s[0].messages[0].role, "user");
    assert_string_equal(s[0].messages[0].content, "What is 2 + 3? Reply with only the final number after ####.");
    assert_string_equal(s[0].ground_truth, "5");
    assert_null(s[0].extra_info_json);
    assert_int_equal(s[0].line, 1);

    /* verl: prompt as a message list, reward_model.ground_truth, extra_info, other keys ignored */
    assert_string_equal(s[1].data_source, "openai/gsm8k");
    assert_int_equal(s[1].n_messages, 2);
    assert_string_equal(s[1].messages[0].role, "system");
    assert_string_equal(s[1].messages[0].content, "Be brief.");
    assert_string_equal(s[1].messages[1].role, "user");
    assert_non_null(strstr(s[1].messages[1].content, "after \"####\"."));
    assert_string_equal(s[1].ground_truth, "7");
    assert_string_equal(s[1].extra_info_json, "{\"split\":\"train\",\"index\":0}");
    assert_int_equal(s[1].line, 3);

    /* messages, an object ground truth kept as compact JSON */
    assert_string_equal(s[2].data_source, "countdown");
    assert_string_equal(s[2].ground_truth, "{\"target\":24,\"numbers\":[3,4,6,2]}");
    assert_int_equal(s[2].line, 5);
    int64_t target, nums[COUNTDOWN_MAX_NUMBERS];
    int nn;
    assert_int_equal(countdown_parse_ground_truth(s[2].ground_truth, &target, nums, &nn, err, sizeof err), 0);
    assert_true(target == 24 && nn == 4);

    /* numbers as ground truth: shortest text that reads back */
    assert_string_equal(s[3].ground_truth, "0.75");
    assert_string_equal(s[3].extra_info_json, "{\"note\":\"\xc3\xbc"
                                              "n\xc3\xaf"
                                              "code \xe2\x9c\x93\"}");
    assert_string_equal(s[4].ground_truth, "8");
    /* CRLF line ending */
    assert_string_equal(s[5].messages[0].content, "CRLF line");
    assert_int_equal(s[5].line, 8);

    /* loading again appends */
    assert_int_equal(dataset_load_jsonl(FIXTURE, NULL, &d, err, sizeof err), 0);
    assert_int_equal(d.n, 12);
    assert_string_equal(d.samples[7].data_source, "openai/gsm8k");
    dataset_free(&d);
    assert_int_equal(d.n, 0);
    assert_null(d.samples);
}

static void test_jsonl_default_data_source(void **state)
{
    (void)state;
    char *path = write_tmp("{\"prompt\": \"p\", \"ground_truth\": \"1\"}\n"
                           "{\"prompt\": \"q\", \"ground_truth\": \"2\", \"data_source\": \"gsm8k\"}\n");
    struct dataset d = {0};
    char err[512];
    assert_int_equal(dataset_load_jsonl(path, "arithmetic", &d, err, sizeof err), 0);
    assert_int_equal(d.n, 2);
    assert_string_equal(d.samples[0].data_source, "arithmetic");
    assert_string_equal(d.samples[1].data_source, "gsm8k");
    dataset_free(&d);
    /* without a default the data source is required */
    assert_int_equal(dataset_load_jsonl(path, NULL, &d, err, sizeof err), -1);
    char want[256];
    snprintf(want, sizeof want, "%s:1: missing 'data_source'", path);
    assert_non_null(strstr(err, want));
    dataset_free(&d);
    unlink(path);
    free(path);
}

static void test_jsonl_errors(void **state)
{
    (void)state;
    static const char good[] = "{\"prompt\": \"p\", \"ground_truth\": \"1\", \"data_source\": \"arithmetic\"}\n\n";
    static const struct {
        const char *line;
        const char *want;
    } cases[] = {
        {"{\"prompt\": \"x\", ", "not valid JSON"},
        {"{\"prompt\": \"x\"} junk", "not valid JSON"},
        {"{\"prompt\": \"x\", \"prompt\": \"y\", \"ground_truth\": \"1\", \"data_source\": \"a\"}", "not valid JSON"},
        {"[1, 2]", "expected a JSON object, got a list"},
        {"\"text\"", "expected a JSON object, got a string"},
        {"{\"ground_truth\": \"1\", \"data_source\": \"a\"}", "missing 'prompt'"},
        {"{\"prompt\": 5, \"ground_truth\": \"1\", \"data_source\": \"a\"}",
         "prompt: expected a string or a list of messages, got an integer"},
        {"{\"prompt\": \"\", \"ground_truth\": \"1\", \"data_source\": \"a\"}", "prompt: empty string"},
        {"{\"prompt\": [], \"ground_truth\": \"1\", \"data_source\": \"a\"}", "prompt: empty list of messages"},
        {"{\"prompt\": [\"hi\"], \"ground_truth\": \"1\", \"data_source\": \"a\"}", "prompt[0]: expected an object"},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\"}], \"ground_truth\": \"1\", "
         "\"data_source\": \"a\"}",
         "prompt[1]: missing 'content'"},
        {"{\"prompt\": [{\"content\": \"a\"}], \"ground_truth\": \"1\", \"data_source\": \"a\"}",
         "prompt[0]: missing 'role'"},
        {"{\"prompt\": [{\"role\": 1, \"content\": \"a\"}], \"ground_truth\": \"1\", \"data_source\": \"a\"}",
         "prompt[0].role: expected a string, got an integer"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [1]}], \"ground_truth\": \"1\", \"data_source\": \"a\"}",
         "messages[0].content: expected a string, got a list"},
        {"{\"messages\": \"hi\", \"ground_truth\": \"1\", \"data_source\": \"a\"}",
         "messages: expected a list of messages, got a string"},
        {"{\"prompt\": \"x\", \"data_source\": \"a\"}", "missing 'ground_truth'"},
        {"{\"prompt\": \"x\", \"ground_truth\": null, \"data_source\": \"a\"}", "missing 'ground_truth'"},
        {"{\"prompt\": \"x\", \"ground_truth\": true, \"data_source\": \"a\"}",
         "ground_truth: expected a string, number, object or list, got a boolean"},
        {"{\"prompt\": \"x\", \"reward_model\": {\"ground_truth\": false}, \"data_source\": \"a\"}",
         "reward_model.ground_truth: expected a string, number, object or list, got a boolean"},
        {"{\"prompt\": \"x\", \"reward_model\": \"rule\", \"data_source\": \"a\"}",
         "reward_model: expected an object, got a string"},
        {"{\"prompt\": \"x\", \"ground_truth\": \"1\"}", "missing 'data_source'"},
        {"{\"prompt\": \"x\", \"ground_truth\": \"1\", \"data_source\": 3}",
         "data_source: expected a string, got an integer"},
        {"{\"prompt\": \"x\", \"ground_truth\": \"1\", \"data_source\": \"\"}", "data_source: empty string"},
        {"{\"prompt\": \"x\", \"ground_truth\": \"1\", \"data_source\": \"a\", \"extra_info\": \"e\"}",
         "extra_info: expected an object, got a string"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        /* two good lines and a blank one first: the bad line is line 3 */
        size_t n = strlen(good) + strlen(cases[c].line) + 2;
        char *text = malloc(n);
        snprintf(text, n, "%s%s\n", good, cases[c].line);
        char *path = write_tmp(text);
        struct dataset d = {0};
        char err[512];
        if (dataset_load_jsonl(path, NULL, &d, err, sizeof err) == 0)
            fail_msg("case %zu loaded: %s", c, cases[c].line);
        char where[256];
        snprintf(where, sizeof where, "%s:3: ", path);
        if (strncmp(err, where, strlen(where)) != 0 || !strstr(err, cases[c].want))
            fail_msg("case %zu: error '%s', want '%s%s...'", c, err, where, cases[c].want);
        assert_int_equal(d.n, 1); /* the good sample before the error */
        dataset_free(&d);
        unlink(path);
        free(path);
        free(text);
    }

    struct dataset d = {0};
    char err[512];
    assert_int_equal(dataset_load_jsonl("/nonexistent/x.jsonl", NULL, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/x.jsonl: cannot open"));
    char *path = write_tmp("\n   \n");
    assert_int_equal(dataset_load_jsonl(path, NULL, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "no samples"));
    unlink(path);
    free(path);
}

/* ---- synthetic tasks ---- */

static bool same_sample(const struct prompt_sample *a, const struct prompt_sample *b)
{
    return strcmp(a->data_source, b->data_source) == 0 && strcmp(a->ground_truth, b->ground_truth) == 0 &&
           a->n_messages == b->n_messages && strcmp(a->messages[0].content, b->messages[0].content) == 0 &&
           strcmp(a->extra_info_json, b->extra_info_json) == 0;
}

static int count_shared_prompts(const struct dataset *a, const struct dataset *b)
{
    int shared = 0;
    for (int i = 0; i < a->n; i++)
        for (int j = 0; j < b->n; j++)
            shared += strcmp(a->samples[i].messages[0].content, b->samples[j].messages[0].content) == 0;
    return shared;
}

static void gen(enum synth_task task, uint64_t seed, int nt, int nv, struct dataset *t, struct dataset *v)
{
    struct synth_opts o;
    synth_default_opts(task, &o);
    char err[256];
    if (synth_generate(&o, seed, nt, nv, t, v, err, sizeof err) < 0)
        fail_msg("%s", err);
}

static void test_synth_determinism(void **state)
{
    (void)state;
    for (int task = 0; task < 2; task++) {
        struct dataset t1, v1, t2, v2, t3, v3;
        gen((enum synth_task)task, 1, 500, 64, &t1, &v1);
        gen((enum synth_task)task, 1, 500, 64, &t2, &v2);
        gen((enum synth_task)task, 2, 500, 64, &t3, &v3);
        assert_int_equal(t1.n, 500);
        assert_int_equal(v1.n, 64);
        for (int i = 0; i < t1.n; i++)
            assert_true(same_sample(&t1.samples[i], &t2.samples[i]));
        for (int i = 0; i < v1.n; i++)
            assert_true(same_sample(&v1.samples[i], &v2.samples[i]));
        int differ = 0;
        for (int i = 0; i < t1.n; i++)
            differ += !same_sample(&t1.samples[i], &t3.samples[i]);
        assert_true(differ > 400);
        /* validation is disjoint from training and has no repeats */
        assert_int_equal(count_shared_prompts(&t1, &v1), 0);
        assert_int_equal(count_shared_prompts(&v1, &v1), v1.n);
        /* the data source selects the matching scorer */
        assert_string_equal(t1.samples[0].data_source, task ? "countdown" : "arithmetic");
        assert_non_null(strstr(t1.samples[3].extra_info_json, "\"split\":\"train\",\"index\":3"));
        assert_non_null(strstr(v1.samples[5].extra_info_json, "\"split\":\"val\",\"index\":5"));
        /* no validation set */
        struct dataset t4, v4;
        gen((enum synth_task)task, 1, 500, 0, &t4, &v4);
        assert_int_equal(v4.n, 0);
        dataset_free(&t1), dataset_free(&v1), dataset_free(&t2), dataset_free(&v2);
        dataset_free(&t3), dataset_free(&v3), dataset_free(&t4), dataset_free(&v4);
    }
    /* the same prompts on every machine: pinned first samples of seed 1 */
    struct dataset t, v;
    gen(SYNTH_ARITHMETIC, 1, 2, 1, &t, &v);
    assert_non_null(strstr(t.samples[0].messages[0].content, ARITH_SEED1_TRAIN0));
    assert_string_equal(t.samples[0].ground_truth, ARITH_SEED1_TRAIN0_GT);
    assert_non_null(strstr(v.samples[0].messages[0].content, ARITH_SEED1_VAL0));
    dataset_free(&t), dataset_free(&v);
    gen(SYNTH_COUNTDOWN, 1, 1, 0, &t, NULL);
    assert_string_equal(t.samples[0].ground_truth, COUNTDOWN_SEED1_TRAIN0_GT);
    dataset_free(&t);
}

/* The value of "What is EXPR?" computed independently (the countdown evaluator does + - * with precedence). */
static int64_t prompt_value(const char *prompt)
{
    const char *a = strstr(prompt, "What is ");
    assert_non_null(a);
    a += 8;
    const char *q = strchr(a, '?');
    assert_non_null(q);
    /* the evaluator has no unary minus and no negative results matter here: "a - b" is binary */
    int64_t num, den, lits[COUNTDOWN_MAX_NUMBERS];
    int nl;
    char err[128];
    if (countdown_eval(a, (size_t)(q - a), &num, &den, lits, &nl, err, sizeof err) < 0)
        fail_msg("'%.*s': %s", (int)(q - a), a, err);
    assert_int_equal(den, 1);
    return num;
}

static double score(const struct prompt_sample *s, const char *response)
{
    char why[200];
    double v = reward_builtin_score(s->data_source, response, s->ground_truth, s->extra_info_json, why, sizeof why);
    if (why[0])
        fail_msg("scoring failed: %s", why);
    return v;
}

static void test_synth_arithmetic_answers(void **state)
{
    (void)state;
    struct dataset t, v;
    gen(SYNTH_ARITHMETIC, 7, 300, 20, &t, &v);
    for (int i = 0; i < t.n; i++) {
        const struct prompt_sample *s = &t.samples[i];
        char want[32], resp[128];
        int64_t val = prompt_value(s->messages[0].content);
        snprintf(want, sizeof want, "%lld", (long long)val);
        assert_string_equal(s->ground_truth, want);
        assert_true(val >= 0 && val <= 198); /* 1-2 digit + and -, no negative results */
        assert_non_null(strstr(s->messages[0].content, "####"));
        snprintf(resp, sizeof resp, "Adding up: %s.\n#### %lld", s->messages[0].content, (long long)val);
        assert_true(score(s, resp) == 1.0);
        snprintf(resp, sizeof resp, "#### %lld", (long long)val + 1);
        assert_true(score(s, resp) == REWARD_FORMAT_WEIGHT); /* wrong, in the asked form */
        snprintf(resp, sizeof resp, "I think it is %lld", (long long)val + 1);
        assert_true(score(s, resp) == 0.0);
    }
    dataset_free(&t), dataset_free(&v);

    /* the difficulty knobs */
    struct synth_opts o;
    synth_default_opts(SYNTH_ARITHMETIC, &o);
    o.min_digits = o.max_digits = 3;
    o.num_operands = 3;
    snprintf(o.ops, sizeof o.ops, "+-*");
    o.allow_negative = true;
    char err[256];
    assert_int_equal(synth_generate(&o, 3, 200, 10, &t, &v, err, sizeof err), 0);
    int negative = 0, products = 0;
    for (int i = 0; i < t.n; i++) {
        const struct prompt_sample *s = &t.samples[i];
        int64_t val = prompt_value(s->messages[0].content);
        char want[32];
        snprintf(want, sizeof want, "%lld", (long long)val);
        assert_string_equal(s->ground_truth, want);
        negative += val < 0;
        products += strchr(s->messages[0].content, '*') != NULL;
        char resp[64];
        snprintf(resp, sizeof resp, "#### %s", s->ground_truth);
        assert_true(score(s, resp) == 1.0);
    }
    assert_true(negative > 0 && products > 0);
    dataset_free(&t), dataset_free(&v);

    /* the tool agent's arithmetic: a system message and two worked examples with a calculator call, then the
     * question, whose answer the arithmetic scorer checks */
    synth_default_opts(SYNTH_TOOL_ARITHMETIC, &o);
    o.min_digits = 4, o.max_digits = 5;
    snprintf(o.ops, sizeof o.ops, "*");
    assert_int_equal(synth_generate(&o, 3, 20, 4, &t, &v, err, sizeof err), 0);
    for (int i = 0; i < t.n; i++) {
        const struct prompt_sample *s = &t.samples[i];
        assert_int_equal(s->n_messages, 10);
        assert_string_equal(s->messages[0].role, "system");
        assert_string_equal(s->messages[3].role, "tool");
        assert_non_null(strstr(s->messages[2].content, "<tool_call>"));
        assert_string_equal(s->messages[9].role, "user");
        assert_string_equal(s->agent_name, "tool_agent");
        assert_string_equal(s->data_source, "arithmetic");
        long long a, b;
        assert_int_equal(sscanf(s->messages[9].content, "What is %lld * %lld?", &a, &b), 2);
        assert_true(a >= 1000 && a <= 99999 && b >= 1000 && b <= 99999);
        char want[32];
        snprintf(want, sizeof want, "%lld", a * b);
        assert_string_equal(s->ground_truth, want);
    }
    dataset_free(&t), dataset_free(&v);

    /* worked examples: each a question in the task's wording and an answer whose sum is right and which the scorer
     * takes in full; the same questions as without them, and the training answers' scores unchanged */
    struct dataset t0, v0;
    gen(SYNTH_ARITHMETIC, 7, 50, 10, &t0, &v0);
    for (int shots = 1; shots <= SYNTH_MAX_SHOTS; shots++) {
        synth_default_opts(SYNTH_ARITHMETIC, &o);
        o.shots = shots;
        assert_int_equal(synth_generate(&o, 7, 50, 10, &t, &v, err, sizeof err), 0);
        for (int i = 0; i < t.n; i++) {
            const struct prompt_sample *s = &t.samples[i];
            assert_int_equal(s->n_messages, 2 * shots + 1);
            for (int k = 0; k < shots; k++) {
                assert_string_equal(s->messages[2 * k].role, "user");
                assert_string_equal(s->messages[2 * k + 1].role, "assistant");
                const int64_t val = prompt_value(s->messages[2 * k].content);
                long long a, b, c, d;
                char op;
                assert_int_equal(
                    sscanf(s->messages[2 * k + 1].content, "%lld %c %lld = %lld\n#### %lld", &a, &op, &b, &c, &d), 5);
                assert_true(c == val && d == val && (op == '+' ? a + b : a - b) == val);
                struct prompt_sample shot = *s;
                char truth[32];
                snprintf(truth, sizeof truth, "%lld", (long long)val);
                shot.ground_truth = truth;
                assert_true(score(&shot, s->messages[2 * k + 1].content) == 1.0);
            }
            assert_string_equal(s->messages[2 * shots].role, "user");
            assert_string_equal(s->messages[2 * shots].content, t0.samples[i].messages[0].content);
            assert_string_equal(s->ground_truth, t0.samples[i].ground_truth);
        }
        dataset_free(&t), dataset_free(&v);
    }
    dataset_free(&t0), dataset_free(&v0);
    synth_default_opts(SYNTH_ARITHMETIC, &o);
    o.shots = SYNTH_MAX_SHOTS + 1;
    assert_int_equal(synth_generate(&o, 1, 10, 10, &t, &v, err, sizeof err), -1);
    assert_non_null(strstr(err, "shots must be 0..2"));

    /* too few distinct prompts for the validation set */
    synth_default_opts(SYNTH_ARITHMETIC, &o);
    o.max_digits = 1;
    snprintf(o.ops, sizeof o.ops, "+");
    assert_int_equal(synth_generate(&o, 1, 10, 100, &t, &v, err, sizeof err), -1);
    assert_non_null(strstr(err, "only 81 distinct"));
    /* bad options */
    o.num_operands = 1;
    assert_int_equal(synth_generate(&o, 1, 10, 10, &t, &v, err, sizeof err), -1);
    synth_default_opts(SYNTH_ARITHMETIC, &o);
    snprintf(o.ops, sizeof o.ops, "+/");
    assert_int_equal(synth_generate(&o, 1, 10, 10, &t, &v, err, sizeof err), -1);
}

static void test_synth_countdown_answers(void **state)
{
    (void)state;
    struct dataset t, v;
    gen(SYNTH_COUNTDOWN, 11, 300, 20, &t, &v);
    for (int i = 0; i < t.n; i++) {
        const struct prompt_sample *s = &t.samples[i];
        int64_t target, nums[COUNTDOWN_MAX_NUMBERS];
        int nn;
        char err[256];
        assert_int_equal(countdown_parse_ground_truth(s->ground_truth, &target, nums, &nn, err, sizeof err), 0);
        assert_true(nn >= 3 && nn <= 4);
        assert_true(target >= 1 && target <= 100);
        for (int k = 0; k < nn; k++)
            assert_true(nums[k] >= 1 && nums[k] <= 99);
        /* the prompt names the numbers and the target and asks for <answer> tags */
        char tgt[48];
        snprintf(tgt, sizeof tgt, "equals %lld.", (long long)target);
        assert_non_null(strstr(s->messages[0].content, tgt));
        assert_non_null(strstr(s->messages[0].content, "<answer>"));
        /* the generator's own equation solves it */
        const char *sol = strstr(s->extra_info_json, "\"solution\":\"");
        assert_non_null(sol);
        sol += 12;
        const char *end = strchr(sol, '"');
        char resp[400];
        snprintf(resp, sizeof resp, "<think>easy</think> <answer>%.*s</answer>", (int)(end - sol), sol);
        assert_true(score(s, resp) == 1.0);
        /* a wrong equation in tags, and no tags at all */
        snprintf(resp, sizeof resp, "<answer>%.*s + 1</answer>", (int)(end - sol), sol);
        assert_true(score(s, resp) == REWARD_FORMAT_WEIGHT);
        snprintf(resp, sizeof resp, "%.*s", (int)(end - sol), sol);
        assert_true(score(s, resp) == 0.0);
    }
    dataset_free(&t), dataset_free(&v);
}

/* ---- order ---- */

static bool is_permutation(const int *p, int n)
{
    char *seen = calloc((size_t)n, 1);
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        ok = p[i] >= 0 && p[i] < n && !seen[p[i]];
        if (ok)
            seen[p[i]] = 1;
    }
    free(seen);
    return ok;
}

static void test_order(void **state)
{
    (void)state;
    enum { N = 1000 };
    int a[N], b[N], c[N], d[N];
    dataset_order(N, 42, 0, a);
    dataset_order(N, 42, 0, b);
    dataset_order(N, 42, 1, c);
    dataset_order(N, 43, 0, d);
    assert_true(is_permutation(a, N));
    assert_true(is_permutation(c, N));
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    assert_memory_not_equal(a, d, sizeof a);
    int fixed = 0;
    for (int i = 0; i < N; i++)
        fixed += a[i] == i;
    assert_true(fixed < 10); /* a shuffle, not the identity */
    /* pinned: the same order on every machine */
    int small[8];
    dataset_order(8, 1, 0, small);
    static const int want[8] = ORDER_N8_SEED1_EPOCH0;
    assert_memory_equal(small, want, sizeof want);
    dataset_order(1, 5, 3, small);
    assert_int_equal(small[0], 0);

    /* the PRNG helpers */
    struct data_rng g1, g2;
    data_rng_seed(&g1, 9, 1);
    data_rng_seed(&g2, 9, 2);
    assert_true(data_rng_next(&g1) != data_rng_next(&g2));
    int hist[3] = {0};
    for (int i = 0; i < 3000; i++)
        hist[data_rng_below(&g1, 3)]++;
    for (int k = 0; k < 3; k++)
        assert_true(hist[k] > 850 && hist[k] < 1150);
}

static void test_cursor(void **state)
{
    (void)state;
    char err[256];
    struct data_cursor c;
    assert_int_equal(data_cursor_init(&c, 3, 4, true, 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "data.train_batch_size"));

    /* 10 prompts, batches of 3: 3 batches per epoch, prompt order[9] skipped each epoch */
    assert_int_equal(data_cursor_init(&c, 10, 3, true, 5, err, sizeof err), 0);
    assert_int_equal(data_cursor_batches_per_epoch(&c), 3);
    int batches[9][3];
    long epochs[9], save_epoch = 0;
    int save_index = 0;
    for (int b = 0; b < 9; b++) {
        epochs[b] = data_cursor_next(&c, batches[b]);
        if (b == 3) { /* checkpoint after 4 batches */
            save_epoch = c.epoch;
            save_index = c.index;
        }
    }
    for (int b = 0; b < 9; b++)
        assert_int_equal(epochs[b], b / 3);
    assert_true(save_epoch == 1 && save_index == 3);
    /* within an epoch: the epoch's order, no repeats */
    for (int e = 0; e < 3; e++) {
        int perm[10];
        dataset_order(10, 5, e, perm);
        for (int k = 0; k < 9; k++)
            assert_int_equal(batches[3 * e + k / 3][k % 3], perm[k]);
    }
    /* after the last batch of an epoch the saved position is already the next epoch */
    assert_true(c.epoch == 3 && c.index == 0);
    data_cursor_free(&c);

    /* resume: a fresh cursor sought to the saved position continues identically */
    assert_int_equal(data_cursor_init(&c, 10, 3, true, 5, err, sizeof err), 0);
    data_cursor_seek(&c, save_epoch, save_index);
    for (int b = 4; b < 9; b++) {
        int got[3];
        assert_int_equal(data_cursor_next(&c, got), epochs[b]);
        assert_memory_equal(got, batches[b], sizeof got);
    }
    data_cursor_free(&c);

    /* without shuffling: file order, every epoch */
    assert_int_equal(data_cursor_init(&c, 7, 2, false, 5, err, sizeof err), 0);
    int got[2];
    for (int e = 0; e < 2; e++)
        for (int b = 0; b < 3; b++) {
            assert_int_equal(data_cursor_next(&c, got), e);
            assert_int_equal(got[0], 2 * b);
            assert_int_equal(got[1], 2 * b + 1);
        }
    data_cursor_free(&c);
}

static void test_from_config(void **state)
{
    (void)state;
    struct grpo_config c;
    struct cfg_error ce;
    char err[512];
    struct dataset t, v;
    config_init(&c);
    assert_int_equal(config_set(&c, "data.synthetic.num_train", "100", "test", &ce), 0);
    assert_int_equal(config_set(&c, "data.synthetic.num_val", "10", "test", &ce), 0);
    assert_int_equal(dataset_from_config(&c, &t, &v, err, sizeof err), 0);
    assert_int_equal(t.n, 100);
    assert_int_equal(v.n, 10);
    assert_string_equal(t.samples[0].data_source, "arithmetic");
    dataset_free(&t), dataset_free(&v);

    assert_int_equal(config_set(&c, "data.synthetic.task", "countdown", "test", &ce), 0);
    assert_int_equal(dataset_from_config(&c, &t, &v, err, sizeof err), 0);
    assert_string_equal(t.samples[0].data_source, "countdown");
    dataset_free(&t), dataset_free(&v);

    assert_int_equal(config_set(&c, "data.train_files", FIXTURE ", " FIXTURE, "test", &ce), 0);
    assert_int_equal(dataset_from_config(&c, &t, &v, err, sizeof err), 0);
    assert_int_equal(t.n, 12);
    assert_int_equal(v.n, 0);
    char first[64], second[64];
    snprintf(first, sizeof first, "%s", t.samples[0].ground_truth);
    snprintf(second, sizeof second, "%s", t.samples[5].ground_truth);
    dataset_free(&t), dataset_free(&v);

    /* verl's list forms: ['a','b'], [a, b] and "a" quoted; every file, in order */
    static const char *const lists[] = {"['" FIXTURE "', '" FIXTURE "']", "[" FIXTURE "," FIXTURE "]",
                                        "[\"" FIXTURE "\"]"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(config_set(&c, "data.train_files", lists[k], "test", &ce), 0);
        if (dataset_from_config(&c, &t, &v, err, sizeof err) != 0)
            fail_msg("%s: %s", lists[k], err);
        assert_int_equal(t.n, k == 2 ? 6 : 12);
        assert_string_equal(t.samples[0].ground_truth, first);
        dataset_free(&t), dataset_free(&v);
    }

    /* data.train_max_samples: the first ones without shuffle; a seeded subset with it */
    assert_int_equal(config_set(&c, "data.train_files", FIXTURE ", " FIXTURE, "test", &ce), 0);
    assert_int_equal(config_set(&c, "data.train_max_samples", "7", "test", &ce), 0);
    assert_int_equal(config_set(&c, "data.shuffle", "false", "test", &ce), 0);
    assert_int_equal(dataset_from_config(&c, &t, &v, err, sizeof err), 0);
    assert_int_equal(t.n, 7);
    assert_string_equal(t.samples[0].ground_truth, first);
    assert_string_equal(t.samples[5].ground_truth, second);
    dataset_free(&t), dataset_free(&v);
    assert_int_equal(config_set(&c, "data.shuffle", "true", "test", &ce), 0);
    assert_int_equal(dataset_from_config(&c, &t, &v, err, sizeof err), 0);
    assert_int_equal(t.n, 7);
    struct dataset t2, v2;
    assert_int_equal(dataset_from_config(&c, &t2, &v2, err, sizeof err), 0);
    for (int i = 0; i < 7; i++) /* the same subset every time (data.seed) */
        assert_string_equal(t.samples[i].ground_truth, t2.samples[i].ground_truth);
    dataset_free(&t), dataset_free(&v), dataset_free(&t2), dataset_free(&v2);
    assert_int_equal(config_set(&c, "data.train_max_samples", "-1", "test", &ce), 0);

    assert_int_equal(config_set(&c, "data.val_files", "/nonexistent.jsonl", "test", &ce), 0);
    assert_int_equal(dataset_from_config(&c, &t, &v, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent.jsonl"));
    assert_int_equal(t.n, 0);
    config_free(&c);
}

static void test_render_prompt(void **state)
{
    (void)state;
    static const char tiny[] = "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,"
                               "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                               "\"trim_offsets\":true,\"use_regex\":true},"
                               "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}";
    char err[512];
    struct tokenizer *tok = tokenizer_from_json_string(tiny, strlen(tiny), "tiny.json", err, sizeof err);
    if (!tok)
        fail_msg("%s", err);
    struct dataset d = {0};
    assert_int_equal(dataset_load_jsonl(FIXTURE, NULL, &d, err, sizeof err), 0);
    char *text = dataset_render_prompt(tok, &d.samples[1], err, sizeof err);
    if (!text)
        fail_msg("%s", err);
    assert_string_equal(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                              "Tom has 3 apples and buys 4 more. How many? Let's think step by step and output "
                              "the final answer after \"####\".<|im_end|>\n<|im_start|>assistant\n");
    free(text);
    dataset_free(&d);
    tokenizer_free(tok);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsonl_layouts),
        cmocka_unit_test(test_jsonl_default_data_source),
        cmocka_unit_test(test_jsonl_errors),
        cmocka_unit_test(test_synth_determinism),
        cmocka_unit_test(test_synth_arithmetic_answers),
        cmocka_unit_test(test_synth_countdown_answers),
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_cursor),
        cmocka_unit_test(test_from_config),
        cmocka_unit_test(test_render_prompt),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
