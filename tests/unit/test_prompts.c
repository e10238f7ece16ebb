/* Prompts longer than data.max_prompt_length, as verl treats them: data.truncation error (the default: an error
 * naming the line), left (keep the end), right (keep the start), middle (keep both ends), and
 * data.filter_overlong_prompts (drop them). Each cut is checked token by token against the whole encoding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../test_util.h"

#include "common/config.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/step/prompts.h"

#define TOK_DIR TEST_TOKENIZER_FIXTURE

static char g_file[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_file, sizeof g_file, "/tmp/grpo-prompts-XXXXXX");
    int fd = mkstemp(g_file);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    fputs("{\"prompt\": \"hi\", \"ground_truth\": \"1\", \"data_source\": \"t\"}\n", f);
    fputs("{\"prompt\": \"a rather long question that does not fit the limit\", \"ground_truth\": \"2\", "
          "\"data_source\": \"t\"}\n",
          f);
    fputs("{\"prompt\": \"ok\", \"ground_truth\": \"3\", \"data_source\": \"t\"}\n", f);
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_file);
    return 0;
}

/* Load the file with data.max_prompt_length = max and the given truncation/filter; rc of prompt_sets_load. */
static int load(struct tokenizer *tok, int max, const char *truncation, bool filter, struct prompt_set *tr,
                struct prompt_set *va, char *err, size_t errlen)
{
    struct grpo_config c;
    config_init(&c);
    struct cfg_error e;
    char v[128];
    config_set(&c, "data.train_files", g_file, "test", &e);
    config_set(&c, "data.val_files", g_file, "test", &e);
    snprintf(v, sizeof v, "%d", max);
    config_set(&c, "data.max_prompt_length", v, "test", &e);
    config_set(&c, "data.truncation", truncation, "test", &e);
    config_set(&c, "data.filter_overlong_prompts", filter ? "true" : "false", "test", &e);
    int rc = prompt_sets_load(&c, tok, NULL, tr, va, err, errlen);
    config_free(&c);
    return rc;
}

static void test_truncation_modes(void **state)
{
    (void)state;
    char err[1024];
    struct tokenizer *tok = prompt_load_tokenizer(TOK_DIR, NULL, NULL, err, sizeof err);
    assert_non_null(tok);
    /* the whole encodings, with a limit they fit */
    struct prompt_set full, fv;
    if (load(tok, 512, "error", false, &full, &fv, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(full.n, 3);
    const int long_len = full.items[1].len, short_len = full.items[0].len;
    const int max = (short_len + long_len) / 2; /* the short prompts fit, the long one does not */
    assert_true(short_len <= max && full.items[2].len <= max && long_len > max);
    /* error: names the file, the line and the lengths */
    struct prompt_set t, v;
    assert_int_not_equal(load(tok, max, "error", false, &t, &v, err, sizeof err), 0);
    char want[256];
    snprintf(want, sizeof want, ":2: prompt has %d tokens; data.max_prompt_length is %d", long_len, max);
    assert_non_null(strstr(err, want));
    prompt_set_free(&t), prompt_set_free(&v);
    /* left, right, middle: the kept tokens are the whole encoding's end, start, or both ends */
    const char *modes[] = {"left", "right", "middle"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(load(tok, max, modes[k], false, &t, &v, err, sizeof err), 0);
        assert_int_equal(t.n, 3);
        const int32_t *all = full.items[1].ids, *got = t.items[1].ids;
        assert_int_equal(t.items[1].len, max);
        const int head = k == 0 ? 0 : k == 1 ? max : max / 2;
        for (int i = 0; i < max; i++) {
            const int from = i < head ? i : long_len - (max - i);
            if (got[i] != all[from])
                fail_msg("truncation=%s: token %d is %d, want token %d of the whole (%d)", modes[k], i, got[i], from,
                         all[from]);
        }
        assert_int_equal(t.items[0].len, short_len); /* prompts that fit are untouched */
        prompt_set_free(&t), prompt_set_free(&v);
    }
    /* filter_overlong_prompts: the long one is dropped, the others keep their order */
    assert_int_equal(load(tok, max, "error", true, &t, &v, err, sizeof err), 0);
    assert_int_equal(t.n, 2);
    assert_string_equal(t.items[0].ground_truth, "1");
    assert_string_equal(t.items[1].ground_truth, "3");
    prompt_set_free(&t), prompt_set_free(&v);
    /* every prompt too long and filtered: an error, not an empty run */
    assert_int_not_equal(load(tok, 1, "error", true, &t, &v, err, sizeof err), 0);
    assert_non_null(strstr(err, "every prompt is longer than data.max_prompt_length"));
    prompt_set_free(&t), prompt_set_free(&v);
    prompt_set_free(&full), prompt_set_free(&fv);
    tokenizer_free(tok);
}

/* data.prompt_key and data.reward_fn_key name the columns (verl's keys); a row without them is an error naming
 * the key. */
static void test_column_keys(void **state)
{
    (void)state;
    char path[] = "/tmp/grpo-prompt-keys-XXXXXX", err[1024];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"question\": \"2+2?\", \"ground_truth\": \"4\", \"src\": \"arithmetic\"}\n", f);
    fputs("{\"question\": [{\"role\": \"user\", \"content\": \"3+3?\"}], \"ground_truth\": \"6\", "
          "\"src\": \"openai/gsm8k\"}\n",
          f);
    fclose(f);
    struct tokenizer *tok = prompt_load_tokenizer(TOK_DIR, NULL, NULL, err, sizeof err);
    assert_non_null(tok);
    struct grpo_config c;
    config_init(&c);
    struct cfg_error e;
    config_set(&c, "data.train_files", path, "test", &e);
    config_set(&c, "data.val_files", path, "test", &e);
    config_set(&c, "data.prompt_key", "question", "test", &e);
    config_set(&c, "data.reward_fn_key", "src", "test", &e);
    struct prompt_set t, v;
    if (prompt_sets_load(&c, tok, NULL, &t, &v, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(t.n, 2);
    assert_string_equal(t.items[0].data_source, "arithmetic");
    assert_string_equal(t.items[1].data_source, "openai/gsm8k");
    assert_non_null(strstr(t.items[0].text, "2+2?"));
    assert_non_null(strstr(t.items[1].text, "3+3?"));
    prompt_set_free(&t), prompt_set_free(&v);
    /* the default column is not there: the error names data.prompt_key's column */
    config_set(&c, "data.prompt_key", "query", "test", &e);
    assert_int_not_equal(prompt_sets_load(&c, tok, NULL, &t, &v, err, sizeof err), 0);
    assert_non_null(strstr(err, ":1: missing 'query' (data.prompt_key"));
    prompt_set_free(&t), prompt_set_free(&v);
    config_free(&c);
    tokenizer_free(tok);
    unlink(path);
}

/* A tokenizer directory in dir (a mkdtemp template, filled in): the test tokenizer and chat_template.jinja
 * holding jinja. */
static void template_dir(char *dir, const char *jinja)
{
    char path[600], src[600];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_non_null(realpath(TOK_DIR "/tokenizer.json", src));
    assert_int_equal(symlink(src, path), 0);
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(jinja, f);
    fclose(f);
}

/* data.apply_chat_template_kwargs reaches the model's template: a tokenizer directory whose chat_template.jinja
 * reads two extra variables renders them as given, and without them as the template's defaults; a value that is
 * not a JSON object is refused naming the key. */
static void test_chat_kwargs_reach_template(void **state)
{
    (void)state;
    char dir[] = "/tmp/grpo_chatkw_XXXXXX", err[1024];
    template_dir(dir, "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                      "{% if enable_thinking is defined and not enable_thinking %}(no thinking){% endif %}"
                      "{{ date_string | default('no date') }}");
    const struct chat_message msgs[] = {{"user", "What is 2 + 2?"}};
    struct tokenizer *tok = prompt_load_tokenizer(dir, "{\"enable_thinking\":false,\"date_string\":\"26 Jul 2024\"}",
                                                  NULL, err, sizeof err);
    if (!tok)
        fail_msg("%s", err);
    char *text = tokenizer_apply_chat_template(tok, msgs, 1, true, err, sizeof err);
    if (!text)
        fail_msg("%s", err);
    assert_string_equal(text, "[user] What is 2 + 2?\n(no thinking)26 Jul 2024");
    free(text);
    tokenizer_free(tok);
    tok = prompt_load_tokenizer(dir, "{}", NULL, err, sizeof err);
    assert_non_null(tok);
    text = tokenizer_apply_chat_template(tok, msgs, 1, true, err, sizeof err);
    assert_non_null(text);
    assert_string_equal(text, "[user] What is 2 + 2?\nno date");
    free(text);
    tokenizer_free(tok);
    assert_null(prompt_load_tokenizer(dir, "[1]", NULL, err, sizeof err));
    assert_non_null(strstr(err, "data.apply_chat_template_kwargs"));
    must_rm_rf(dir);
}

/* actor_rollout_ref.model.custom_chat_template replaces the model's template (verl's tokenizer.chat_template = ...),
 * with data.apply_chat_template_kwargs reaching it too; a template that cannot render is refused at load, naming the
 * key. */
static void test_custom_chat_template(void **state)
{
    (void)state;
    char dir[] = "/tmp/grpo_chatcustom_XXXXXX", err[1024];
    template_dir(dir, "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}");
    const struct chat_message msgs[] = {{"system", "Be brief."}, {"user", "What is 2 + 2?"}};
    struct tokenizer *tok = prompt_load_tokenizer(
        dir, "{\"tag\":\"math\"}",
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content | upper }}{% if not loop.last %} {% endif %}"
        "{% endfor %}{% if add_generation_prompt %}<|assistant:{{ tag }}|>{% endif %}",
        err, sizeof err);
    if (!tok)
        fail_msg("%s", err);
    char *text = tokenizer_apply_chat_template(tok, msgs, 2, true, err, sizeof err);
    if (!text)
        fail_msg("%s", err);
    assert_string_equal(text, "<|system|>BE BRIEF. <|user|>WHAT IS 2 + 2?<|assistant:math|>");
    free(text);
    tokenizer_free(tok);
    /* empty: the model's own */
    tok = prompt_load_tokenizer(dir, NULL, "", err, sizeof err);
    assert_non_null(tok);
    text = tokenizer_apply_chat_template(tok, msgs + 1, 1, true, err, sizeof err);
    assert_non_null(text);
    assert_string_equal(text, "[user] What is 2 + 2?\n");
    free(text);
    tokenizer_free(tok);
    /* an unclosed block, and one that raises: refused at load, by the key's name */
    assert_null(prompt_load_tokenizer(dir, NULL, "{% for m in messages %}{{ m.content }}", err, sizeof err));
    assert_non_null(strstr(err, "actor_rollout_ref.model.custom_chat_template: "));
    assert_null(prompt_load_tokenizer(dir, NULL, "{{ raise_exception('no system prompt here') }}", err, sizeof err));
    assert_non_null(strstr(err, "actor_rollout_ref.model.custom_chat_template: "));
    assert_non_null(strstr(err, "no system prompt here"));
    must_rm_rf(dir);
}

/* verl's multi-turn columns: agent_name picks the sample's agent loop (a tool agent's prompt is rendered with the
 * tools, a single-turn one's without), its messages are kept as JSON for the agent; an unknown agent loop is
 * refused naming the line. */
static void test_agent_columns(void **state)
{
    (void)state;
    char dir[] = "/tmp/grpo_agentcol_XXXXXX", err[1024];
    template_dir(dir, "{% if tools %}[tools: {{ tools | length }}]{% endif %}{% for m in messages %}[{{ m.role }}] "
                      "{{ m.content }}\n{% endfor %}");
    char data[640];
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    fputs("{\"prompt\": [{\"role\": \"user\", \"content\": \"2*3?\"}], \"ground_truth\": \"6\", "
          "\"data_source\": \"arithmetic\", \"agent_name\": \"tool_agent\", "
          "\"extra_info\": {\"tools_kwargs\": {\"calculator\": {\"create_kwargs\": {}}}}}\n"
          "{\"prompt\": [{\"role\": \"user\", \"content\": \"4*5?\"}], \"ground_truth\": \"20\", "
          "\"data_source\": \"arithmetic\", \"agent_name\": \"single_turn_agent\"}\n"
          "{\"prompt\": [{\"role\": \"user\", \"content\": \"1*1?\"}], \"ground_truth\": \"1\", "
          "\"data_source\": \"arithmetic\"}\n",
          f);
    fclose(f);
    struct tokenizer *tok = prompt_load_tokenizer(dir, NULL, NULL, err, sizeof err);
    assert_non_null(tok);
    struct grpo_config c;
    config_init(&c);
    struct cfg_error e;
    config_set(&c, "data.train_files", data, "test", &e);
    config_set(&c, "data.val_files", data, "test", &e);
    config_set(&c, "actor_rollout_ref.rollout.multi_turn.enable", "true", "test", &e);
    struct prompt_set t, v;
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"calculator\"}}]";
    if (prompt_sets_load(&c, tok, tools, &t, &v, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_true(t.items[0].tool_agent);
    assert_string_equal(t.items[0].text, "[tools: 1][user] 2*3?\n");
    assert_false(t.items[1].tool_agent); /* single_turn_agent: no tools in its prompt */
    assert_string_equal(t.items[1].text, "[user] 4*5?\n");
    assert_true(t.items[2].tool_agent); /* no agent_name: multi_turn.enable makes it a tool agent */
    assert_string_equal(t.items[0].messages_json, "[{\"role\":\"user\",\"content\":\"2*3?\"}]");
    assert_non_null(strstr(t.items[0].extra_info, "tools_kwargs"));
    prompt_set_free(&t), prompt_set_free(&v);
    /* without tools (multi-turn off) every prompt is rendered as before */
    if (prompt_sets_load(&c, tok, NULL, &t, &v, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_false(t.items[0].tool_agent);
    assert_string_equal(t.items[0].text, "[user] 2*3?\n");
    prompt_set_free(&t), prompt_set_free(&v);
    f = fopen(data, "w");
    fputs("{\"prompt\": \"hi\", \"ground_truth\": \"1\", \"data_source\": \"arithmetic\", \"agent_name\": \"react\"}\n",
          f);
    fclose(f);
    assert_int_not_equal(prompt_sets_load(&c, tok, tools, &t, &v, err, sizeof err), 0);
    assert_non_null(strstr(err, ":1: agent_name: unknown agent loop 'react' (single_turn_agent, tool_agent)"));
    prompt_set_free(&t), prompt_set_free(&v);
    config_free(&c);
    tokenizer_free(tok);
    must_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_truncation_modes, setup, teardown),
        cmocka_unit_test(test_column_keys),
        cmocka_unit_test(test_chat_kwargs_reach_template),
        cmocka_unit_test(test_custom_chat_template),
        cmocka_unit_test(test_agent_columns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
