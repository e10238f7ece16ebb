/* The tool agent (worker/agent/agent_loop.c) as generation drives it, on real chat templates and tokenizers
 * (tests/fixtures/chat_templates) and the built-in calculator, with the model's turns written by hand:
 *  - the tokens appended after a turn are the template's text for the tool answer, written out by hand from the
 *    template (Qwen2.5's <tool_response> user turn, Llama 3's ipython turn with its tojson of a string), with the
 *    newline ChatML puts after <|im_end|>;
 *  - the conversation, counts, num_turns and tool rewards at the end; the tokenization sanity check passes on a
 *    consistent trajectory;
 *  - malformed calls, unknown tools and schema mismatches are answers to the model, counted; calls past
 *    max_parallel_calls are dropped; max_assistant_turns, the budget and a turn without calls end it;
 *  - the tool parsers on their own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/config.h"
#include "worker/agent/agent_loop.h"
#include "worker/agent/interaction.h"
#include "worker/agent/tool_parser.h"
#include "worker/gen/multi_turn.h"
#include "worker/tokenizer/tokenizer.h"

#define FIX "tests/fixtures/chat_templates/"

static struct tokenizer *load_tok(const char *model)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, FIX "%s/tokenizer.json", model);
    struct tokenizer *t = tokenizer_from_json(path, err, sizeof err);
    if (!t)
        fail_msg("%s", err);
    return t;
}

struct fixture {
    struct grpo_config c;
    struct tokenizer *tok;
    struct turn_env *env;
};

static void setup(struct fixture *f, const char *model, const char *const *overrides)
{
    config_init(&f->c);
    struct cfg_error e;
    assert_int_equal(config_set(&f->c, "actor_rollout_ref.rollout.multi_turn.enable", "true", "test", &e), 0);
    for (int i = 0; overrides && overrides[i]; i += 2)
        if (config_set(&f->c, overrides[i], overrides[i + 1], "test", &e) != 0)
            fail_msg("%s", e.msg);
    f->tok = load_tok(model);
    char err[1024];
    f->env = agent_env_factory.create(&f->c, f->tok, err, sizeof err);
    if (!f->env)
        fail_msg("%s", err);
}

static void teardown(struct fixture *f)
{
    agent_env_factory.destroy(f->env);
    tokenizer_free(f->tok);
    config_free(&f->c);
}

/* A model turn: text's tokens and the stop token `stop`. The answer's text (keep special tokens), or NULL for
 * none; *done when the trajectory ends (after the answer, where there is one). */
static char *turn_ex(struct fixture *f, int traj, const char *text, const char *stop, int budget, bool *done)
{
    size_t n;
    int32_t *ids = tokenizer_encode(f->tok, text, strlen(text), 0, &n);
    int32_t *more = realloc(ids, (n + 1) * sizeof *ids);
    assert_non_null(more);
    ids = more;
    int id = tokenizer_token_id(f->tok, stop);
    assert_true(id >= 0);
    ids[n++] = id;
    f->env->ops->turn_end(f->env, traj, ids, (int)n, true, budget);
    free(ids);
    struct turn_reply r;
    assert_int_equal(f->env->ops->poll(f->env, &r, 1, true), 1);
    assert_int_equal(r.traj, traj);
    *done = r.done;
    if (!r.ids)
        return NULL;
    char *s = tokenizer_decode(f->tok, r.ids, (size_t)r.n, false);
    free(r.ids);
    return s;
}

/* turn_ex for a turn the trajectory goes on after (its answer), or ends at without an answer (NULL). */
static char *turn(struct fixture *f, int traj, const char *text, const char *stop, int budget)
{
    bool done;
    char *s = turn_ex(f, traj, text, stop, budget, &done);
    if (done)
        assert_null(s);
    else
        assert_non_null(s);
    return s;
}

static const char *USER = "[{\"role\":\"user\",\"content\":\"What is 2**70?\"}]";
#define CALL(expr)                                                                                                     \
    "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"" expr "\"}}\n</tool_call>"

static void test_qwen_hermes_round_trip(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, "qwen2.5-instruct", NULL);
    assert_int_equal(f.env->ops->begin(f.env, 3, USER, "{\"index\":7}", NULL), 0);
    char *a = turn(&f, 3, CALL("2**70"), "<|im_end|>", 500);
    assert_non_null(a);
    assert_string_equal(a, "\n<|im_start|>user\n<tool_response>\n1180591620717411303424\n</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n");
    free(a);
    assert_null(turn(&f, 3, "#### 1180591620717411303424", "<|im_end|>", 400)); /* no call: the end */
    struct turn_summary s;
    f.env->ops->finish(f.env, 3, &s);
    assert_int_equal(s.turns, 4); /* 1 tool turn + 2 model turns + 1, verl's count */
    assert_int_equal(s.tool_calls, 1);
    assert_int_equal(s.tool_errors, 0);
    assert_false(s.mismatch);
    json_t *m = json_loads(s.messages_json, 0, NULL), *x = json_loads(s.reward_json, 0, NULL);
    assert_int_equal(json_array_size(m), 4); /* user, assistant (with its call), tool, assistant */
    json_t *call = json_array_get(json_object_get(json_array_get(m, 1), "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "name")), "calculator");
    assert_string_equal(json_string_value(json_object_get(json_object_get(call, "arguments"), "expression")), "2**70");
    assert_string_equal(json_string_value(json_object_get(json_array_get(m, 2), "content")), "1180591620717411303424");
    assert_int_equal(json_integer_value(json_object_get(x, "num_turns")), 4);
    assert_int_equal(json_integer_value(json_object_get(x, "index")), 7); /* the sample's extra_info is kept */
    assert_true(json_is_number(json_object_get(json_object_get(x, "rollout_reward_scores"), "calculator")));
    json_decref(m), json_decref(x);
    gen_turn_summary_free(&s);
    teardown(&f);
}

static void test_bad_calls_are_answers(void **state)
{
    (void)state;
    struct fixture f;
    const char *ov[] = {"actor_rollout_ref.rollout.multi_turn.max_parallel_calls", "3", NULL};
    setup(&f, "qwen2.5-instruct", ov);
    assert_int_equal(f.env->ops->begin(f.env, 0, USER, NULL, NULL), 0);
    char *a = turn(&f, 0,
                   "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": }</tool_call>"
                   "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}</tool_call>"
                   "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expr\": \"1\"}}</tool_call>",
                   "<|im_end|>", 2000);
    assert_non_null(a);
    assert_non_null(strstr(a, "Error: the tool call is not valid JSON"));
    assert_non_null(strstr(a, "Error: there is no tool 'search' (the tools are: code_interpreter, calculator)"));
    assert_non_null(strstr(a, "Error: missing required argument 'expression'"));
    /* three answers in one user turn, as Qwen's template groups consecutive tool messages */
    const char *p = a;
    int k = 0;
    while ((p = strstr(p, "<tool_response>")))
        k++, p++;
    assert_int_equal(k, 3);
    assert_int_equal((int)(strstr(a, "<|im_start|>user") - a), 1);
    free(a);
    assert_null(turn(&f, 0, "I give up.", "<|im_end|>", 1000));
    struct turn_summary s;
    f.env->ops->finish(f.env, 0, &s);
    assert_int_equal(s.tool_calls, 3);
    assert_int_equal(s.tool_errors, 3);
    gen_turn_summary_free(&s);
    teardown(&f);
}

static void test_limits_end_trajectories(void **state)
{
    (void)state;
    struct fixture f;
    const char *ov[] = {"actor_rollout_ref.rollout.multi_turn.max_assistant_turns", "2", NULL};
    setup(&f, "qwen2.5-instruct", ov);
    /* max_parallel_calls 1 (verl's default): the second call of a turn is dropped */
    assert_int_equal(f.env->ops->begin(f.env, 0, USER, NULL, NULL), 0);
    char *a = turn(&f, 0, CALL("1+1") CALL("2+2"), "<|im_end|>", 1000);
    assert_non_null(strstr(a, "\n2\n"));
    assert_null(strstr(a, "\n4\n"));
    free(a);
    assert_null(turn(&f, 0, CALL("3+3"), "<|im_end|>", 900)); /* the second model turn is the last */
    struct turn_summary s;
    f.env->ops->finish(f.env, 0, &s);
    assert_int_equal(s.tool_calls, 1);
    assert_non_null(strstr(s.messages_json, "\"dropped\":true"));
    gen_turn_summary_free(&s);
    /* an answer that would reach the budget ends the trajectory instead */
    assert_int_equal(f.env->ops->begin(f.env, 1, USER, NULL, NULL), 0);
    assert_null(turn(&f, 1, CALL("2**70"), "<|im_end|>", 10));
    f.env->ops->finish(f.env, 1, &s);
    assert_int_equal(s.turns, 2);
    assert_non_null(strstr(s.messages_json, "\"shown\":false")); /* the call ran; its answer did not fit */
    gen_turn_summary_free(&s);
    /* a single-turn sample */
    assert_int_equal(f.env->ops->begin(f.env, 2, USER, NULL, "single_turn_agent"), -1);
    f.env->ops->finish(f.env, 2, &s);
    assert_null(s.messages_json);
    gen_turn_summary_free(&s);
    teardown(&f);
}

static void test_llama3_json(void **state)
{
    (void)state;
    struct fixture f;
    const char *ov[] = {"actor_rollout_ref.rollout.multi_turn.format", "llama3_json", NULL};
    setup(&f, "llama-3.2-3b-instruct", ov);
    assert_int_equal(f.env->ops->begin(f.env, 0, USER, NULL, NULL), 0);
    char *a = turn(&f, 0, "{\"name\": \"calculator\", \"parameters\": {\"expression\": \"6*7\"}}", "<|eot_id|>", 500);
    assert_non_null(a);
    /* Llama 3's template writes a tool answer with tojson: a string answer comes quoted */
    assert_string_equal(a, "<|start_header_id|>ipython<|end_header_id|>\n\n\"42\"<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(a);
    assert_null(turn(&f, 0, "The answer is 42.", "<|eot_id|>", 400));
    struct turn_summary s;
    f.env->ops->finish(f.env, 0, &s);
    assert_int_equal(s.tool_calls, 1);
    assert_false(s.mismatch);
    gen_turn_summary_free(&s);
    teardown(&f);
}

static void test_interaction(void **state)
{
    (void)state;
    struct fixture f;
    const char *ov[] = {"actor_rollout_ref.rollout.multi_turn.interaction_config_path",
                        "tests/fixtures/tools/retry_interaction.yaml",
                        "actor_rollout_ref.rollout.multi_turn.max_user_turns", "2", NULL};
    setup(&f, "qwen2.5-instruct", ov);
    assert_int_equal(f.env->ops->begin(f.env, 0, USER, NULL, NULL), 0);
    for (int k = 0; k < 2; k++) { /* a turn without a call: the simulated user answers, up to max_user_turns */
        char *a = turn(&f, 0, "#### 12", "<|im_end|>", 500);
        assert_non_null(a);
        assert_string_equal(a, "\n<|im_start|>user\nCheck your work and answer again.<|im_end|>\n"
                               "<|im_start|>assistant\n");
        free(a);
    }
    assert_null(turn(&f, 0, "#### 12", "<|im_end|>", 400));
    struct turn_summary s;
    f.env->ops->finish(f.env, 0, &s);
    assert_int_equal(s.turns, 2 + 3 + 1);
    assert_int_equal(s.tool_calls, 0);
    assert_false(s.mismatch);
    gen_turn_summary_free(&s);
    teardown(&f);
    /* a config naming an unknown key is refused with its line */
    const char *bad = "tmp-interaction-bad.yaml";
    FILE *y;
    struct interaction_set is;
    char err[512];
    y = fopen(bad, "w");
    fputs("interaction:\n  - name: a\n    class_name: grpo.interactions.Retry\n    config:\n      msg: x\n", y);
    fclose(y);
    assert_int_equal(interaction_set_load_yaml(&is, bad, err, sizeof err), -1);
    assert_non_null(strstr(err, ":5: unknown key 'msg' in config (message)"));
    unlink(bad);
}

/* A Python interaction written for verl (tests/fixtures/tools/grade_interaction.py), picked by the sample's
 * interaction_kwargs.name beside a Retry: start_interaction gets the sample's kwargs (its ground truth), each
 * trajectory its own state, each answer's score reaches the scorer's extra_info as turn_scores, and the answer that
 * ends the trajectory is appended before the end (as verl's agent loop does); an exception ends its trajectory,
 * counted, and the next trajectory is served. */
static void test_python_interaction(void **state)
{
    (void)state;
    struct fixture f;
    const char *ov[] = {"actor_rollout_ref.rollout.multi_turn.interaction_config_path",
                        "tests/fixtures/tools/grade_interaction.yaml",
                        "actor_rollout_ref.rollout.multi_turn.max_user_turns", "4", NULL};
    setup(&f, "qwen2.5-instruct", ov);
    const char *kw = "{\"interaction_kwargs\":{\"name\":\"grader\",\"ground_truth\":12}}";
    assert_int_equal(f.env->ops->begin(f.env, 0, USER, kw, NULL), 0);
    assert_int_equal(f.env->ops->begin(f.env, 1, USER, kw, NULL), 0);
    char *a = turn(&f, 0, "#### 7", "<|im_end|>", 500);
    assert_string_equal(a, "\n<|im_start|>user\nNot yet, look again. (try 1)<|im_end|>\n<|im_start|>assistant\n");
    free(a);
    a = turn(&f, 1, "#### 8", "<|im_end|>", 500); /* another trajectory: its own tries */
    assert_non_null(strstr(a, "(try 1)"));
    free(a);
    a = turn(&f, 0, "#### 9", "<|im_end|>", 450);
    assert_non_null(strstr(a, "(try 2)"));
    free(a);
    bool done = false;
    a = turn_ex(&f, 0, "#### 12", "<|im_end|>", 400, &done);
    assert_true(done);
    assert_non_null(a);
    assert_string_equal(a, "\n<|im_start|>user\nCorrect after 3 tries (grader).<|im_end|>\n<|im_start|>assistant\n");
    free(a);
    struct turn_summary s;
    f.env->ops->finish(f.env, 0, &s);
    assert_int_equal(s.turns, 3 + 3 + 1);
    assert_false(s.mismatch);
    assert_non_null(strstr(s.messages_json, "Correct after 3 tries"));
    json_t *x = json_loads(s.reward_json, 0, NULL);
    json_t *ts = json_object_get(x, "turn_scores");
    assert_int_equal((int)json_array_size(ts), 3);
    assert_float_equal(json_number_value(json_array_get(ts, 0)), 0.25, 0);
    assert_float_equal(json_number_value(json_array_get(ts, 1)), 0.5, 0);
    assert_float_equal(json_number_value(json_array_get(ts, 2)), 1.0, 0);
    assert_int_equal((int)json_array_size(json_object_get(x, "tool_rewards")), 0);
    json_decref(x);
    gen_turn_summary_free(&s);
    /* an exception in generate_response: the trajectory ends there, counted */
    assert_null(turn(&f, 1, "raise", "<|im_end|>", 450));
    f.env->ops->finish(f.env, 1, &s);
    assert_int_equal(s.tool_errors, 1);
    gen_turn_summary_free(&s);
    /* the Retry of the same file, by name */
    assert_int_equal(f.env->ops->begin(f.env, 2, USER, "{\"interaction_kwargs\":{\"name\":\"retry\"}}", NULL), 0);
    a = turn(&f, 2, "#### 12", "<|im_end|>", 500);
    assert_non_null(strstr(a, "Check your work and answer again."));
    free(a);
    f.env->ops->finish(f.env, 2, &s);
    gen_turn_summary_free(&s);
    teardown(&f);
    /* a class that does not load: the file's line and Python's reason */
    const char *bad = "tmp-interaction-py-bad.yaml";
    FILE *y = fopen(bad, "w");
    fputs("interaction:\n  - name: a\n    class_name: no_such_module.Grader\n", y);
    fclose(y);
    struct interaction_set is;
    char err[2048];
    assert_int_equal(interaction_set_load_yaml(&is, bad, err, sizeof err), -1);
    assert_non_null(
        strstr(err, "tmp-interaction-py-bad.yaml:3: interaction 'a': cannot load class 'no_such_module.Grader'"));
    assert_non_null(strstr(err, "No module named 'no_such_module'"));
    unlink(bad);
}

/* Python tools in a trajectory: verl's BaseTool class from a tool config, with the sample's create_kwargs; its
 * calc_reward reaches the scorer's extra_info as rollout_reward_scores; an exception is an answer, counted; a
 * function_tool_path file's functions are tools too. */
static void test_python_tools(void **state)
{
    (void)state;
    struct fixture f;
    const char *ov[] = {"actor_rollout_ref.rollout.multi_turn.tool_config_path",
                        "tests/fixtures/tools/counter.yaml",
                        "actor_rollout_ref.rollout.multi_turn.function_tool_path",
                        "tests/fixtures/tools/function_tools.py",
                        "actor_rollout_ref.rollout.multi_turn.max_parallel_calls",
                        "2",
                        NULL};
    setup(&f, "qwen2.5-instruct", ov);
    assert_int_equal(
        f.env->ops->begin(f.env, 0, USER, "{\"tools_kwargs\":{\"counter\":{\"create_kwargs\":{\"start\":10}}}}", NULL),
        0);
    char *a = turn(&f, 0, "<tool_call>{\"name\": \"counter\", \"arguments\": {}}</tool_call>", "<|im_end|>", 900);
    assert_non_null(strstr(a, "call 11 of "));
    free(a);
    a = turn(&f, 0,
             "<tool_call>{\"name\": \"counter\", \"arguments\": {\"what\": \"raise\"}}</tool_call>"
             "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 0.5}}</tool_call>",
             "<|im_end|>", 800);
    assert_non_null(strstr(a, "the counter was asked to fail"));
    assert_non_null(strstr(a, "2.5"));
    free(a);
    a = turn(&f, 0, "<tool_call>{\"name\": \"counter\", \"arguments\": {}}</tool_call>", "<|im_end|>", 700);
    assert_non_null(strstr(a, "call 12 of "));
    free(a);
    assert_null(turn(&f, 0, "#### 12", "<|im_end|>", 600));
    struct turn_summary s;
    f.env->ops->finish(f.env, 0, &s);
    assert_int_equal(s.tool_calls, 4);
    assert_int_equal(s.tool_errors, 1);
    json_t *x = json_loads(s.reward_json, 0, NULL);
    json_t *scores = json_object_get(x, "rollout_reward_scores");
    assert_float_equal(json_number_value(json_object_get(scores, "counter")), 12.0, 0); /* its calc_reward */
    assert_float_equal(json_number_value(json_object_get(scores, "add")), 0.0, 0);
    assert_int_equal(json_integer_value(json_object_get(x, "num_turns")), 3 + 4 + 1);
    json_decref(x);
    gen_turn_summary_free(&s);
    teardown(&f);
}

/* A template that raises on a tool answer: the trajectory ends there, counted; nothing crashes. */
static void test_template_raises(void **state)
{
    (void)state;
    struct fixture f;
    setup(&f, "qwen2.5-instruct", NULL);
    tokenizer_set_chat_template(f.tok, "{% for m in messages %}{% if m.role == 'tool' %}"
                                       "{{ raise_exception('no tool turns in this template') }}{% endif %}"
                                       "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
    assert_int_equal(f.env->ops->begin(f.env, 0, USER, NULL, NULL), 0);
    assert_null(turn(&f, 0, CALL("1+1"), "<|im_end|>", 500));
    struct turn_summary s;
    f.env->ops->finish(f.env, 0, &s);
    assert_int_equal(s.template_errors, 1);
    assert_int_equal(s.tool_calls, 1);
    assert_non_null(strstr(s.messages_json, "\"shown\":false"));
    gen_turn_summary_free(&s);
    teardown(&f);
}

static void test_parsers(void **state)
{
    (void)state;
    struct parsed_turn t;
    tool_parse_turn(TOOL_FORMAT_HERMES, "a <tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}</tool_call> b",
                    &t);
    assert_int_equal(t.n_calls, 1);
    assert_string_equal(t.calls[0].name, "f");
    assert_string_equal(t.calls[0].arguments, "{\"x\":1}"); /* arguments given as a JSON text */
    assert_string_equal(t.content, "a  b");
    parsed_turn_free(&t);
    tool_parse_turn(TOOL_FORMAT_HERMES, "<tool_call>{\"name\":\"f\"", &t);
    assert_int_equal(t.n_calls, 1);
    assert_non_null(strstr(t.calls[0].error, "not closed"));
    parsed_turn_free(&t);
    tool_parse_turn(TOOL_FORMAT_HERMES, "<tool_call>{\"arguments\":{}}</tool_call>", &t);
    assert_non_null(strstr(t.calls[0].error, "needs \"name\""));
    parsed_turn_free(&t);
    tool_parse_turn(TOOL_FORMAT_HERMES, "<tool_call>{\"name\":\"f\",\"arguments\":[1]}</tool_call>", &t);
    assert_non_null(strstr(t.calls[0].error, "must be a JSON object"));
    parsed_turn_free(&t);
    tool_parse_turn(TOOL_FORMAT_HERMES, "no calls here", &t);
    assert_int_equal(t.n_calls, 0);
    parsed_turn_free(&t);
    tool_parse_turn(TOOL_FORMAT_LLAMA3_JSON,
                    "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"arguments\": {}}",
                    &t);
    assert_int_equal(t.n_calls, 2);
    assert_string_equal(t.calls[1].name, "g");
    assert_string_equal(t.calls[0].arguments, "{\"a\":1}");
    parsed_turn_free(&t);
    tool_parse_turn(TOOL_FORMAT_LLAMA3_JSON, "The answer is {1}", &t);
    assert_int_equal(t.n_calls, 0);
    parsed_turn_free(&t);
    tool_parse_turn(TOOL_FORMAT_LLAMA3_JSON, "{\"name\": \"f\", ", &t);
    assert_int_equal(t.n_calls, 1);
    assert_non_null(t.calls[0].error);
    parsed_turn_free(&t);
    assert_int_equal(tool_format_from_name("hermes"), TOOL_FORMAT_HERMES);
    assert_int_equal(tool_format_from_name("pythonic"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen_hermes_round_trip),
        cmocka_unit_test(test_bad_calls_are_answers),
        cmocka_unit_test(test_limits_end_trajectories),
        cmocka_unit_test(test_llama3_json),
        cmocka_unit_test(test_interaction),
        cmocka_unit_test(test_python_interaction),
        cmocka_unit_test(test_template_raises),
        cmocka_unit_test(test_python_tools),
        cmocka_unit_test(test_parsers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
