/* Multi-turn generation (worker/gen/multi_turn.c) against a scripted turn environment, on the tiny fixture model:
 *  - every token the model sampled carries the log-prob that one training forward over the whole trajectory
 *    (prompt, model turns and answers, no KV cache) gives it: the cache kept across turns, and the cache rebuilt
 *    after an eviction, hold exactly the trajectory's tokens;
 *  - the answers sit in the response where they were given, with mask 0 and log-prob 0, and the model's tokens
 *    with mask 1;
 *  - an environment that ends every trajectory at its first turn gives model_generate()'s tokens and log-probs;
 *  - the response budget bounds model and answer tokens together, and an answer that would reach it ends the
 *    trajectory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model_fixtures.h"
#include "worker/gen/multi_turn.h"
#include "worker/model/model_generate.h"

/* The scripted environment: trajectory t gets `turns` answers of 3 tokens {40 + t % 5, 41, 42}, then ends. With
 * slow, answers are held until generation has nothing else to do (a blocking poll), as a slow tool's would; with
 * closing, the last answer ends the trajectory after it (an interaction's closing answer, done with tokens). */
struct script {
    struct turn_env base;
    int turns;
    bool slow, single, closing;
    int closed; /* trajectories that ended on a closing answer */
    int answered[64];
    struct turn_reply held[64];
    int n_held;
    int begun, finished, turn_ends;
};

static int s_begin(struct turn_env *e, int traj, const char *m, const char *x, const char *a)
{
    struct script *s = (struct script *)e;
    (void)m, (void)x, (void)a;
    assert_true(traj < 64);
    s->answered[traj] = 0;
    s->begun++;
    return s->single ? -1 : 0;
}

static void s_turn_end(struct turn_env *e, int traj, const int32_t *ids, int n, bool stopped, int budget)
{
    struct script *s = (struct script *)e;
    (void)ids, (void)stopped;
    assert_true(n > 0);
    s->turn_ends++;
    struct turn_reply r = {.traj = traj};
    if (s->answered[traj] < s->turns && budget > 3) { /* an answer that reaches the budget ends it */
        r.n = 3;
        r.ids = malloc(3 * sizeof(int32_t));
        r.ids[0] = 40 + traj % 5, r.ids[1] = 41, r.ids[2] = 42;
        s->answered[traj]++;
        r.done = s->closing && s->answered[traj] == s->turns;
        s->closed += r.done;
    } else {
        r.done = true;
    }
    s->held[s->n_held++] = r;
}

static int s_poll(struct turn_env *e, struct turn_reply *out, int max, bool wait)
{
    struct script *s = (struct script *)e;
    if (s->slow && !wait)
        return 0;
    int k = s->n_held < max ? s->n_held : max;
    if (s->slow && k > 1)
        k = 1; /* one answer at a time */
    memcpy(out, s->held, (size_t)k * sizeof *out);
    memmove(s->held, s->held + k, (size_t)(s->n_held - k) * sizeof *s->held);
    s->n_held -= k;
    assert_true(!wait || k > 0);
    return k;
}

static void s_finish(struct turn_env *e, int traj, struct turn_summary *out)
{
    struct script *s = (struct script *)e;
    memset(out, 0, sizeof *out);
    out->turns = 2 * s->answered[traj] + 2;
    s->finished++;
}

static const struct turn_env_ops script_ops = {s_begin, s_turn_end, s_poll, s_finish};

/* Log-probs of the response tokens of a trajectory under one forward of prompt ++ response. */
static void forward_logp(struct model *m, const int32_t *prompt, int plen, const struct gen_output *o, float *logp)
{
    const int N = plen + o->len - 1;
    int32_t *ids = malloc(sizeof *ids * (size_t)N), *tg = malloc(sizeof *tg * (size_t)N),
            *pos = malloc(sizeof *pos * (size_t)N), cu[2] = {0, N};
    for (int i = 0; i < N; i++) {
        ids[i] = i < plen ? prompt[i] : o->tokens[i - plen];
        tg[i] = i + 1 < plen ? 0 : o->tokens[i + 1 - plen];
        pos[i] = i;
    }
    struct packed_batch pb = {N, 1, ids, tg, pos, cu, NULL, NULL, NULL};
    float *all = malloc(sizeof(float) * (size_t)N);
    model_acts_free(model_forward(m, &pb, 1.0f, false, all, NULL));
    memcpy(logp, all + plen - 1, sizeof(float) * (size_t)o->len);
    free(all), free(ids), free(tg), free(pos);
}

/* Generate with the script; check every trajectory against the full forward and the answers' places. */
static void run_and_check(struct model *m, struct script *s, int max_batch, int max_new, struct multi_turn_stats *st)
{
    int32_t p0[3] = {1, 2, 3}, p1[5] = {9, 8, 7, 6, 5}, p2[4] = {4, 4, 5, 6};
    const int32_t *prompts[3] = {p0, p1, p2};
    int lens[3] = {3, 5, 4};
    int32_t stop = 2;
    const int n = 2, total = 3 * n;
    struct gen_params gp = {.sampling = {1.0f, 1.0f, 0},
                            .max_new_tokens = max_new,
                            .n_samples = n,
                            .max_batch = max_batch,
                            .stop_ids = &stop,
                            .n_stop = 1,
                            .seed = 7};
    struct gen_output out[6];
    struct turn_summary sums[6];
    memset(st, 0, sizeof *st);
    gen_generate_multi_turn(m, &s->base, prompts, lens, NULL, NULL, NULL, 3, &gp, out, sums, st);
    assert_int_equal(s->begun, total);
    assert_int_equal(s->finished, total);
    int answers = 0;
    for (int i = 0; i < total; i++) {
        const struct gen_output *o = &out[i];
        assert_true(o->len > 0 && o->len <= max_new);
        float *ref = malloc(sizeof(float) * (size_t)o->len);
        forward_logp(m, prompts[i / n], lens[i / n], o, ref);
        int model_tokens = 0;
        for (int t = 0; t < o->len; t++) {
            if (o->mask[t]) {
                assert_float_equal(o->logps[t], ref[t], 2e-5);
                model_tokens++;
                continue;
            }
            /* an answer: 3 tokens, after a model turn that ended on the stop token */
            assert_true(t >= 1 && t + 2 < o->len);
            assert_int_equal(o->tokens[t - 1], stop);
            assert_int_equal(o->mask[t - 1], 1);
            assert_int_equal(o->tokens[t], 40 + i % 5);
            assert_int_equal(o->tokens[t + 1], 41);
            assert_int_equal(o->tokens[t + 2], 42);
            assert_int_equal(o->mask[t + 1] + o->mask[t + 2], 0);
            assert_true(o->logps[t] == 0 && o->logps[t + 1] == 0 && o->logps[t + 2] == 0);
            answers++;
            t += 2;
        }
        assert_true(model_tokens > 0);
        /* a trajectory never ends on an answer, but on a closing one */
        assert_int_equal(o->mask[o->len - 1], s->closing && s->answered[i] == s->turns ? 0 : 1);
        assert_int_equal(sums[i].turns, 2 * s->answered[i] + 2);
        free(ref);
    }
    int given = 0, resumed = 0;
    long long prefilled = 0;
    for (int i = 0; i < total; i++) {
        given += s->answered[i];
        resumed += sums[i].resumed_turns;
        prefilled += sums[i].prefill_tokens;
    }
    assert_int_equal(answers, given);
    assert_int_equal(resumed, given - s->closed); /* each trajectory's own counts add up to the call's */
    assert_int_equal(prefilled, st->resume_tokens + st->recompute_tokens);
    assert_true(given > 0);
    for (int i = 0; i < total; i++)
        model_gen_output_free(&out[i]);
}

/* Stop token 2 is likely enough for the tiny model that turns end well before the budget. */
static void test_kept_cache(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    struct script s = {.base.ops = &script_ops, .turns = 3};
    struct multi_turn_stats st;
    run_and_check(m, &s, 6, 200, &st);
    assert_true(st.resumed_turns > 0);
    assert_int_equal(st.evictions, 0);
    /* a kept cache prefills only the turn's stop token and the answer: 1 + 3 per resumed turn */
    assert_int_equal(st.resume_tokens, 4 * st.resumed_turns);
    model_free(m);
}

static void test_evicted_cache_recomputed(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    /* slots for one group at a time, answers only when nothing else can run: waiting trajectories give their
     * caches to the next group and are prefilled again from their tokens */
    struct script s = {.base.ops = &script_ops, .turns = 2, .slow = true};
    struct multi_turn_stats st;
    run_and_check(m, &s, 2, 200, &st);
    assert_true(st.evictions > 0);
    assert_true(st.recompute_tokens > 0);
    assert_true(st.env_wait_s >= 0);
    model_free(m);
}

/* A closing answer (done, with tokens: an interaction ending the trajectory, verl's last user turn) is appended,
 * masked, and the trajectory ends there; a closing answer past the budget ends it without one. */
static void test_closing_answer(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    struct script s = {.base.ops = &script_ops, .turns = 2, .closing = true};
    struct multi_turn_stats st;
    run_and_check(m, &s, 6, 200, &st);
    assert_true(s.closed > 0);
    model_free(m);
}

static void test_budget_bounds_everything(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    struct script s = {.base.ops = &script_ops, .turns = 50};
    struct multi_turn_stats st;
    run_and_check(m, &s, 6, 12, &st); /* every response within 12 tokens, answers included */
    model_free(m);
}

/* Every trajectory single-turn: model_generate()'s tokens and log-probs. */
static void test_single_turn_equals_generate(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    int32_t p0[3] = {1, 2, 3}, p1[5] = {9, 8, 7, 6, 5};
    const int32_t *prompts[2] = {p0, p1};
    int lens[2] = {3, 5};
    int32_t stop = 2;
    struct gen_params gp = {.sampling = {1.0f, 0.9f, 20},
                            .max_new_tokens = 16,
                            .n_samples = 3,
                            .max_batch = 6,
                            .stop_ids = &stop,
                            .n_stop = 1,
                            .seed = 42};
    struct gen_output a[6], b[6];
    struct turn_summary sums[6];
    struct script s = {.base.ops = &script_ops, .single = true};
    struct multi_turn_stats st = {0};
    model_generate(m, prompts, lens, 2, &gp, a);
    gen_generate_multi_turn(m, &s.base, prompts, lens, NULL, NULL, NULL, 2, &gp, b, sums, &st);
    assert_int_equal(s.turn_ends, 0);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(a[i].len, b[i].len);
        assert_memory_equal(a[i].tokens, b[i].tokens, sizeof(int32_t) * (size_t)a[i].len);
        for (int t = 0; t < a[i].len; t++) {
            assert_float_equal(a[i].logps[t], b[i].logps[t], 1e-6);
            assert_int_equal(b[i].mask[t], 1);
        }
        assert_int_equal(a[i].stopped, b[i].stopped);
        model_gen_output_free(&a[i]);
        model_gen_output_free(&b[i]);
    }
    model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kept_cache),
        cmocka_unit_test(test_evicted_cache_recomputed),
        cmocka_unit_test(test_closing_answer),
        cmocka_unit_test(test_budget_bounds_everything),
        cmocka_unit_test(test_single_turn_equals_generate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
