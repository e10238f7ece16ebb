/* The chat template renderer (worker/tokenizer/chat_template.c): the templates of SmolLM2, Qwen2.5, Qwen3,
 * Llama 3.2, Llama 3.1/3.3 and Mistral Nemo rendered byte for byte as transformers' apply_chat_template rendered
 * them (tests/fixtures/chat_templates, written by tests/fixtures/make_chat_fixtures.py), with the same token ids;
 * template errors name their line; python3 or jinja2 missing says what to install; the helper ends with the
 * tokenizer. */
#include <dirent.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"
#include "tests/test_util.h"
#include "worker/tokenizer/chat_template.h"
#include "worker/tokenizer/tokenizer.h"

#define FIX "tests/fixtures/chat_templates/"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n)
        fail_msg("%s: cannot read", path);
    fclose(f);
    s[n] = '\0';
    *len = (size_t)n;
    return s;
}

static struct tokenizer *load(const char *model)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, FIX "%s/tokenizer.json", model);
    struct tokenizer *t = tokenizer_from_json(path, err, sizeof err);
    if (!t)
        fail_msg("%s", err);
    if (!tokenizer_chat_template(t))
        fail_msg("%s: no chat template loaded", model);
    return t;
}

static void test_fixtures(void **state)
{
    (void)state;
    json_error_t je;
    json_t *root = json_load_file(FIX "cases.json", 0, &je);
    if (!root)
        fail_msg("cases.json: %s (line %d)", je.text, je.line);
    size_t i;
    json_t *c;
    int bad = 0, n = 0;
    struct tokenizer *t = NULL;
    const char *loaded = "";
    json_array_foreach(json_object_get(root, "cases"), i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        const char *model = json_string_value(json_object_get(c, "model"));
        if (strcmp(model, loaded) != 0) { /* one tokenizer (and helper) per model, reused by its cases */
            tokenizer_free(t);
            t = load(model);
            loaded = model;
        }
        char *messages = json_dumps(json_object_get(c, "messages"), JSON_COMPACT);
        const json_t *tj = json_object_get(c, "tools"), *kj = json_object_get(c, "kwargs");
        char *tools = json_is_null(tj) ? NULL : json_dumps(tj, JSON_COMPACT);
        char *kwargs = json_is_null(kj) ? NULL : json_dumps(kj, JSON_COMPACT);
        char err[2048], path[512];
        char *got = tokenizer_render_chat(t, messages, tools, json_is_true(json_object_get(c, "add_generation_prompt")),
                                          kwargs, err, sizeof err);
        snprintf(path, sizeof path, FIX "expected/%s.txt", name);
        size_t wlen;
        char *want = read_all(path, &wlen);
        if (!got) {
            print_error("%s: %s\n", name, err);
            bad++;
        } else if (strlen(got) != wlen || memcmp(got, want, wlen) != 0) {
            size_t k = 0;
            while (k < wlen && got[k] && got[k] == want[k])
                k++;
            print_error("%s: differs from transformers' rendering at byte %zu:\n--- got\n%s\n--- want\n%s\n", name, k,
                        got, want);
            bad++;
        } else { /* and the ids, as transformers' tokenize=True gives them */
            size_t nid;
            int32_t *ids = tokenizer_encode(t, got, strlen(got), 0, &nid);
            size_t cap = nid * 12 + 1, off = 0;
            char *s = malloc(cap);
            s[0] = '\0';
            for (size_t k = 0; k < nid; k++)
                off += (size_t)snprintf(s + off, cap - off, "%s%d", k ? "," : "", ids[k]);
            if (strcmp(s, json_string_value(json_object_get(c, "ids"))) != 0) {
                print_error("%s: token ids differ from transformers'\n", name);
                bad++;
            }
            free(s);
            free(ids);
        }
        n++;
        free(got), free(want), free(messages), free(tools), free(kwargs);
    }
    tokenizer_free(t);
    json_decref(root);
    assert_true(n >= 20);
    assert_int_equal(bad, 0);
}

/* A template of its own (in a copy of one fixture tokenizer) rendered with one user message: the text, or NULL
 * with err. */
static char *render_with(const char *tpl, const char *kwargs, char *err, size_t errlen)
{
    struct tokenizer *t = load("qwen3-0.6b");
    tokenizer_set_chat_template(t, tpl);
    char *s = tokenizer_render_chat(t, "[{\"role\": \"user\", \"content\": \"Hi\"}]", NULL, true, kwargs, err, errlen);
    tokenizer_free(t);
    return s;
}

static void test_template_errors(void **state)
{
    (void)state;
    char err[2048];
    /* a syntax error: the line it is on */
    char *s = render_with("{%- for m in messages %}\n{{ m.content }}\n{{ m.role ( }}\n{%- endfor %}\n", NULL, err,
                          sizeof err);
    assert_null(s);
    print_message("syntax error: %s\n", err);
    assert_non_null(strstr(err, "chat template line 3: syntax error"));
    s = render_with("{% if messages %}\n{{ 'x' }}\n", NULL, err, sizeof err); /* a block never closed */
    assert_null(s);
    assert_non_null(strstr(err, "chat template line"));
    assert_non_null(strstr(err, "syntax error"));
    /* raise_exception: its message and the line of the call */
    s = render_with("{{- bos_token }}\n{%- if messages[0].role != 'system' %}\n    {{- raise_exception('Need a "
                    "system message!') }}\n{%- endif %}\n",
                    NULL, err, sizeof err);
    assert_null(s);
    print_message("raise_exception: %s\n", err);
    assert_string_equal(err, "chat template line 3: raise_exception: Need a system message!");
    /* a real template's check: Mistral Nemo's roles must alternate */
    struct tokenizer *t = load("mistral-nemo-instruct-2407");
    s = tokenizer_render_chat(t, "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]", NULL,
                              true, NULL, err, sizeof err);
    assert_null(s);
    assert_non_null(strstr(err, "chat template line 18: raise_exception: After the optional system message, "
                                "conversation roles must alternate"));
    /* other runtime errors name their kind and line; the helper goes on serving */
    tokenizer_set_chat_template(t, "{{ 'a' }}\n{{ messages[0].content + 1 }}\n");
    s = tokenizer_render_chat(t, "[{\"role\":\"user\",\"content\":\"a\"}]", NULL, true, NULL, err, sizeof err);
    assert_null(s);
    assert_non_null(strstr(err, "chat template line 2: TypeError"));
    tokenizer_set_chat_template(t, "{{ messages[0].content }}|{{ add_generation_prompt }}|{{ flag }}");
    s = tokenizer_render_chat(t, "[{\"role\":\"user\",\"content\":\"ok\"}]", NULL, false, "{\"flag\": [1, 2]}", err,
                              sizeof err);
    assert_non_null(s);
    assert_string_equal(s, "ok|False|[1, 2]");
    free(s);
    /* bad inputs are errors, not crashes */
    assert_null(tokenizer_render_chat(t, "[]", NULL, true, NULL, err, sizeof err));
    assert_non_null(strstr(err, "no messages"));
    assert_null(tokenizer_render_chat(t, "{\"role\":\"user\"}", NULL, true, NULL, err, sizeof err));
    assert_non_null(strstr(err, "messages: not a JSON array"));
    assert_null(tokenizer_render_chat(t, "[{\"role\":", NULL, true, NULL, err, sizeof err));
    assert_non_null(strstr(err, "messages: not valid JSON"));
    assert_null(tokenizer_render_chat(t, "[\"hi\"]", NULL, true, NULL, err, sizeof err));
    assert_non_null(strstr(err, "message 0 is not an object"));
    assert_null(tokenizer_render_chat(t, "[{\"role\":\"user\"}]", "{}", true, NULL, err, sizeof err));
    assert_non_null(strstr(err, "tools: not a JSON array"));
    assert_null(tokenizer_render_chat(t, "[{\"role\":\"user\"}]", NULL, true, "[1]", err, sizeof err));
    assert_non_null(strstr(err, "kwargs: not a JSON object"));
    tokenizer_free(t);
}

/* The struct API (what training renders prompts with) and the tokenizer's own keyword arguments. */
static void test_struct_api_and_kwargs(void **state)
{
    (void)state;
    char err[1024];
    struct tokenizer *t = load("qwen3-0.6b");
    struct chat_message m[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *s = tokenizer_apply_chat_template(t, m, 2, true, err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    assert_string_equal(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                           "<|im_start|>assistant\n");
    free(s);
    assert_int_equal(tokenizer_set_chat_kwargs(t, "{\"enable_thinking\": false}", err, sizeof err), 0);
    s = tokenizer_apply_chat_template(t, m + 1, 1, true, err, sizeof err);
    assert_string_equal(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(s);
    /* a call's own kwargs win */
    s = tokenizer_render_chat(t, "[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, true, "{\"enable_thinking\": true}",
                              err, sizeof err);
    assert_string_equal(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    assert_int_equal(tokenizer_set_chat_kwargs(t, "[true]", err, sizeof err), -1);
    assert_int_equal(tokenizer_set_chat_kwargs(t, NULL, err, sizeof err), 0);
    /* special tokens reach the template; a kwarg of the same name wins, as in transformers */
    tokenizer_set_chat_template(t, "{{ eos_token }}|{{ pad_token }}|{{ bos_token is defined }}");
    s = tokenizer_apply_chat_template(t, m, 1, false, err, sizeof err);
    assert_string_equal(s, "<|im_end|>|<|endoftext|>|False");
    free(s);
    s = tokenizer_render_chat(t, "[{\"role\":\"user\"}]", NULL, false, "{\"eos_token\": \"E\"}", err, sizeof err);
    assert_string_equal(s, "E|<|endoftext|>|False");
    free(s);
    /* no template: ChatML */
    tokenizer_set_chat_template(t, NULL);
    s = tokenizer_apply_chat_template(t, m, 2, false, err, sizeof err);
    assert_string_equal(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    free(s);
    tokenizer_free(t);
}

/* Children of this process whose command line holds `needle`. */
static int count_children(const char *needle)
{
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    const pid_t me = getpid();
    while (d && (e = readdir(d))) {
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        int ppid = 0;
        const int ok = fscanf(f, "%*d (%*[^)]) %*c %d", &ppid) == 1;
        fclose(f);
        if (!ok || ppid != me)
            continue;
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        f = fopen(path, "r");
        if (!f)
            continue;
        const size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t j = 0; j < k; j++)
            if (!buf[j])
                buf[j] = ' ';
        buf[k] = '\0';
        if (strstr(buf, needle))
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

static void test_helper_lifetime(void **state)
{
    (void)state;
    char err[1024];
    const int before = count_children("python3");
    struct tokenizer *t = load("smollm2-135m-instruct");
    assert_int_equal(count_children("python3"), before); /* started lazily */
    struct chat_message m[] = {{"user", "Hi"}};
    for (int k = 0; k < 3; k++) {
        char *s = tokenizer_apply_chat_template(t, m, 1, true, err, sizeof err);
        if (!s)
            fail_msg("%s", err);
        free(s);
        assert_int_equal(count_children("python3"), before + 1); /* one, reused */
    }
    tokenizer_free(t);
    assert_int_equal(count_children("python3"), before); /* ended and reaped */
}

static void test_missing_python_or_jinja2(void **state)
{
    (void)state;
    char err[1024];
    struct chat_message m[] = {{"user", "Hi"}};
    /* jinja2 that cannot be imported (a stand-in that raises ImportError, first on the path) */
    char *dir = must_tmpdir("grpo_chat");
    char *pkg = test_path_join(dir, "jinja2"), *init = test_path_join(pkg, "__init__.py");
    assert_int_equal(mkdir(pkg, 0700), 0);
    FILE *f = fopen(init, "w");
    fputs("raise ImportError(\"No module named 'jinja2'\")\n", f);
    fclose(f);
    const char *old_pp = getenv("PYTHONPATH");
    char *saved_pp = old_pp ? strdup(old_pp) : NULL;
    setenv("PYTHONPATH", dir, 1);
    struct tokenizer *t = load("smollm2-135m-instruct");
    char *s = tokenizer_apply_chat_template(t, m, 1, true, err, sizeof err);
    assert_null(s);
    print_message("no jinja2: %s\n", err);
    assert_non_null(strstr(err, "cannot import jinja2"));
    assert_non_null(strstr(err, "install python3-jinja2"));
    tokenizer_free(t);
    if (saved_pp)
        setenv("PYTHONPATH", saved_pp, 1);
    else
        unsetenv("PYTHONPATH");
    free(saved_pp);
    /* no python3 on PATH */
    const char *old_path = getenv("PATH");
    char *saved_path = strdup(old_path ? old_path : "/usr/bin:/bin");
    setenv("PATH", dir, 1);
    t = load("smollm2-135m-instruct");
    s = tokenizer_apply_chat_template(t, m, 1, true, err, sizeof err);
    assert_null(s);
    print_message("no python3: %s\n", err);
    assert_non_null(strstr(err, "cannot run python3"));
    assert_non_null(strstr(err, "install python3 and python3-jinja2"));
    tokenizer_free(t);
    setenv("PATH", saved_path, 1);
    free(saved_path);
    unlink(init);
    rmdir(pkg);
    rmdir(dir);
    free(init), free(pkg), free(dir);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_template_errors),
        cmocka_unit_test(test_struct_api_and_kwargs),
        cmocka_unit_test(test_helper_lifetime),
        cmocka_unit_test(test_missing_python_or_jinja2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
