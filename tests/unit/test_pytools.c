/* worker/agent: Python tools (pytool.c and its runner) and the per-trajectory tool API.
 *
 * A verl BaseTool-shaped class from a tool-config YAML (tests/fixtures/tools/counter.yaml, classes in
 * counter_tool.py, which imports verl's own module paths): create / execute / calc_reward / release are
 * observable (a counter per instance; two instances independent; create_kwargs reach create; release forgets);
 * a plain class with sync methods and other return forms (str, a 2-tuple, an int, a dict); @function_tool
 * functions (tests/fixtures/tools/function_tools.py): the schema derived from the signature and the docstring
 * checked against the expected JSON, sync and async calls, a union type checked; an exception is an error answer
 * (type and message) and the next call works; a hang is answered "timed out" after the config's timeout, its
 * helper killed (its pid gone) and replaced, while a call on another instance is answered meanwhile (the hang is
 * known to be in progress from a FIFO the tool writes, not from a time); a helper that exits mid-call is
 * replaced; calls from several threads at once, also on one instance, are all counted; bytes, a non-UTF-8 text
 * and a 2 MB answer come back as text, truncated; the verl stand-ins are used where verl is not installed and a
 * verl package found on the path is used instead; a YAML naming a module or class that cannot be imported, an
 * __init__ that raises, a function without a described parameter are errors naming FILE:LINE or the function.
 * The built-ins report is_error for their error answers. The waits are the tools' own (pipes, sockets). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "worker/agent/tool.h"

#define FIX "tests/fixtures/tools/"

#define CONTAINS(hay, needle)                                                                                          \
    do {                                                                                                               \
        if (!strstr((hay), (needle)))                                                                                  \
            fail_msg("expected '%s' in:\n%s", (needle), (hay));                                                        \
    } while (0)

static struct tool_set load_yaml(const char *path)
{
    struct tool_set s;
    char err[2048];
    if (tool_set_load_yaml(&s, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    return s;
}

static struct tool *find(const struct tool_set *s, const char *name)
{
    struct tool *t = tool_set_find(s, name);
    if (!t)
        fail_msg("no tool '%s'", name);
    return t;
}

/* one call: the answer (malloc'd), with the reward and error flag */
static char *call(struct tool *t, const char *inst, const char *args, double *reward, int *is_error)
{
    double r;
    int e;
    return tool_call_in(t, inst, args, reward ? reward : &r, is_error ? is_error : &e);
}

static void expect_answer(struct tool *t, const char *inst, const char *args, const char *want, int want_error)
{
    int e = -1;
    char *out = call(t, inst, args, NULL, &e);
    if (strcmp(out, want) != 0)
        fail_msg("%s(%s): expected '%s', got '%s'", t->name, args, want, out);
    if (e != want_error)
        fail_msg("%s(%s): is_error %d, expected %d (answer '%s')", t->name, args, e, want_error, out);
    free(out);
}

/* ---- a BaseTool class ---- */

static void test_class_life_cycle(void **state)
{
    (void)state;
    struct tool_set s = load_yaml(FIX "counter.yaml");
    struct tool *t = find(&s, "counter");
    char err[512];
    assert_int_equal(tool_create(t, "a", NULL, err, sizeof err), 0);
    json_t *kw = json_pack("{s:i}", "start", 10);
    assert_int_equal(tool_create(t, "b", kw, err, sizeof err), 0);
    json_decref(kw);
    double r = -1;
    int e = -1;
    char *out = call(t, "a", "{}", &r, &e);
    assert_string_equal(out, "call 1 of a!");
    assert_true(r == 0.5);
    assert_int_equal(e, 0);
    free(out);
    expect_answer(t, "a", "{}", "call 2 of a!", 0);
    expect_answer(t, "b", "{}", "call 11 of b!", 0);
    assert_true(tool_calc_reward(t, "a") == 2.0);
    assert_true(tool_calc_reward(t, "b") == 11.0);
    /* a second create of a live instance is refused */
    assert_int_equal(tool_create(t, "a", NULL, err, sizeof err), -1);
    CONTAINS(err, "exists already");
    tool_release(t, "a");
    assert_true(tool_calc_reward(t, "a") == 0.0); /* gone: no state, no reward */
    assert_true(tool_calc_reward(t, "b") == 11.0);
    /* a call outside any trajectory: an instance of its own, made and released around it */
    out = call(t, NULL, "{}", &r, &e);
    CONTAINS(out, "call 1 of call-");
    assert_int_equal(e, 0);
    free(out);
    /* schema checks happen before Python: an unknown argument (additionalProperties false) */
    expect_answer(t, "b", "{\"colour\": 1}", "Error: unknown argument 'colour' (this tool takes: what, fifo)", 1);
    expect_answer(t, "b", "{\"what\": ", "Error: the arguments are not valid JSON: unexpected token near end of file",
                  1);
    /* create's exception: the instance cannot be used */
    kw = json_pack("{s:s}", "start", "ten");
    assert_int_equal(tool_create(t, "c", kw, err, sizeof err), -1);
    json_decref(kw);
    CONTAINS(err, "ValueError: invalid literal for int()");
    tool_release(t, "b");
    tool_set_free(&s);
}

static void test_sync_class_and_return_forms(void **state)
{
    (void)state;
    struct tool_set s = load_yaml(FIX "counter.yaml");
    struct tool *t = find(&s, "sync");
    char err[256];
    assert_int_equal(tool_create(t, "x", NULL, err, sizeof err), 0); /* no create method: nothing to call */
    expect_answer(t, "x", "{}", "plain sync", 0);
    double r = 0;
    char *out = call(t, "x", "{\"what\": \"tuple\"}", &r, NULL);
    assert_string_equal(out, "two");
    assert_true(r == 2.0);
    free(out);
    expect_answer(t, "x", "{\"what\": \"int\"}", "42", 0);
    expect_answer(t, "x", "{\"what\": \"dict\"}", "{\"a\": 1, \"b\": \"\xc3\xbc\"}", 0);
    assert_true(tool_calc_reward(t, "x") == 0.0); /* no calc_reward method */
    tool_release(t, "x");
    tool_set_free(&s);
}

/* bytes, a NUL and a lone surrogate (each byte of its encoding one U+FFFD) and a 2 MB answer come back as
 * text, cut to max_tool_response_length (100) */
static void test_odd_answers(void **state)
{
    (void)state;
    struct tool_set s = load_yaml(FIX "counter.yaml");
    struct tool *t = find(&s, "counter");
    expect_answer(t, NULL, "{\"what\": \"bytes\"}", "b'\\xff\\xfe raw'", 0);
    expect_answer(t, NULL, "{\"what\": \"odd\"}",
                  "a\xef\xbf\xbd"
                  "b \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd ok",
                  0);
    int e = -1;
    char *out = call(t, NULL, "{\"what\": \"huge\"}", NULL, &e);
    assert_int_equal(e, 0);
    CONTAINS(out, "...(truncated 2097052 characters)...");
    assert_true(strlen(out) < 200);
    free(out);
    tool_set_free(&s);
}

/* ---- failures ---- */

static pid_t answer_pid(struct tool *t, const char *inst)
{
    char *out = call(t, inst, "{\"what\": \"pid\"}", NULL, NULL);
    const pid_t pid = (pid_t)atoi(out);
    if (pid <= 0)
        fail_msg("no pid in '%s'", out);
    free(out);
    return pid;
}

static void test_exception_and_exit(void **state)
{
    (void)state;
    struct tool_set s = load_yaml(FIX "counter.yaml");
    struct tool *t = find(&s, "counter");
    char err[256];
    assert_int_equal(tool_create(t, "a", NULL, err, sizeof err), 0);
    expect_answer(t, "a", "{}", "call 1 of a!", 0);
    expect_answer(t, "a", "{\"what\": \"raise\"}", "Error: ValueError: the counter was asked to fail", 1);
    expect_answer(t, "a", "{}", "call 2 of a!", 0); /* the same process, its state kept */
    /* what the tool prints goes to the log (stderr), not into the answer or the protocol */
    expect_answer(t, "a", "{\"what\": \"print\"}", "call 3 of a!", 0);
    const pid_t before = answer_pid(t, "a");
    int e = -1;
    char *out = call(t, "a", "{\"what\": \"exit\"}", NULL, &e);
    assert_string_equal(out, "Error: the tool's Python process ended during the call (exit status 3)");
    assert_int_equal(e, 1);
    free(out);
    assert_int_equal(kill(before, 0), -1); /* reaped */
    /* replaced: the instance is made again in the new process, its count from the start */
    expect_answer(t, "a", "{}", "call 1 of a!", 0);
    assert_true(answer_pid(t, "a") != before);
    tool_release(t, "a");
    tool_set_free(&s);
}

struct hang_arg {
    struct tool *t;
    const char *args;
    char *out;
    int is_error;
    double took;
    atomic_int done;
};

static void *hang_thread(void *p)
{
    struct hang_arg *h = p;
    const double t0 = clock_now_s();
    double r;
    h->out = tool_call_in(h->t, "hung", h->args, &r, &h->is_error);
    h->took = clock_now_s() - t0;
    atomic_store(&h->done, 1);
    return NULL;
}

static void test_timeout(void **state)
{
    (void)state;
    struct tool_set s = load_yaml(FIX "counter.yaml"); /* timeout: 2, two processes */
    struct tool *t = find(&s, "counter");
    char err[256], dir[] = "/tmp/grpo-pytools.XXXXXX", fifo[64], args[160];
    assert_non_null(mkdtemp(dir));
    snprintf(fifo, sizeof fifo, "%s/hang", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(tool_create(t, "hung", NULL, err, sizeof err), 0);
    assert_int_equal(tool_create(t, "other", NULL, err, sizeof err), 0);
    const pid_t hung_pid = answer_pid(t, "hung");
    snprintf(args, sizeof args, "{\"what\": \"hang\", \"fifo\": \"%s\"}", fifo);
    struct hang_arg h = {.t = t, .args = args};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, hang_thread, &h), 0);
    /* the tool opens the FIFO when it starts hanging: this open returns then */
    const int fd = open(fifo, O_RDONLY);
    assert_true(fd >= 0);
    char line[16] = {0};
    assert_true(read(fd, line, sizeof line - 1) > 0);
    close(fd);
    /* meanwhile, another instance (in the other process) is answered while the hung call is still waiting */
    expect_answer(t, "other", "{}", "call 1 of other!", 0);
    assert_int_equal(atomic_load(&h.done), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_string_equal(h.out, "Error: the tool timed out after 2 s");
    assert_int_equal(h.is_error, 1);
    assert_true(h.took >= 2.0 && h.took < 10.0);
    free(h.out);
    assert_int_equal(kill(hung_pid, 0), -1); /* its process group was killed and reaped */
    assert_int_equal(errno, ESRCH);
    /* the next call works, in a fresh process (the instance made again there) */
    expect_answer(t, "hung", "{}", "call 1 of hung!", 0);
    assert_true(answer_pid(t, "hung") != hung_pid);
    expect_answer(t, "other", "{}", "call 2 of other!", 0);
    tool_release(t, "hung");
    tool_release(t, "other");
    tool_set_free(&s);
    unlink(fifo);
    rmdir(dir);
}

/* ---- threads ---- */

#define THREADS 6
#define CALLS 12

struct worker_arg {
    struct tool *t;
    char inst[32];
    int bad;
};

static void *worker(void *p)
{
    struct worker_arg *w = p;
    for (int i = 1; i <= CALLS; i++) {
        int e = -1;
        char *out = call(w->t, w->inst, "{}", NULL, &e);
        char want[64];
        snprintf(want, sizeof want, "call %d of %s!", i, w->inst);
        w->bad += strcmp(out, want) != 0 || e != 0;
        free(out);
    }
    return NULL;
}

static void *same_instance(void *p)
{
    struct worker_arg *w = p;
    for (int i = 0; i < CALLS; i++) {
        int e = -1;
        char *out = call(w->t, "shared", "{}", NULL, &e);
        w->bad += strncmp(out, "call ", 5) != 0 || e != 0;
        free(out);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    struct tool_set s = load_yaml(FIX "counter.yaml");
    struct tool *t = find(&s, "counter");
    char err[256];
    struct worker_arg w[THREADS];
    pthread_t th[THREADS];
    assert_int_equal(tool_create(t, "shared", NULL, err, sizeof err), 0);
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker_arg){.t = t};
        snprintf(w[i].inst, sizeof w[i].inst, "traj-%d", i);
        if (i < THREADS / 2)
            assert_int_equal(tool_create(t, w[i].inst, NULL, err, sizeof err), 0);
        /* the others are made by their first call */
        assert_int_equal(pthread_create(&th[i], NULL, i % 3 == 2 ? same_instance : worker, &w[i]), 0);
    }
    int shared_callers = 0;
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(w[i].bad, 0);
        if (i % 3 == 2)
            shared_callers++;
        else
            assert_true(tool_calc_reward(t, w[i].inst) == CALLS);
    }
    assert_true(tool_calc_reward(t, "shared") == (double)(shared_callers * CALLS));
    for (int i = 0; i < THREADS; i++)
        tool_release(t, w[i].inst);
    tool_release(t, "shared");
    tool_set_free(&s);
}

/* ---- @function_tool ---- */

static const char WEATHER_SCHEMA[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the current weather "
    "for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", "
    "\"description\": \"The city to look up, e.g. \\\"Tokyo\\\".\"}, \"unit\": {\"type\": \"string\", "
    "\"description\": \"The temperature unit.\", \"enum\": [\"c\", \"f\"]}}, \"required\": [\"city\"]}}}";
static const char ADD_SCHEMA[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \"Add two numbers.\\n\\nThe sum is "
    "exact for integers.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
    "\"integer\", \"description\": \"The first number.\"}, \"b\": {\"type\": \"number\", \"description\": \"The "
    "second number, which may have a fraction.\"}, \"note\": {\"type\": \"string\", \"description\": \"Anything to "
    "say\", \"enum\": [\"hi\", \"bye\"]}}, \"required\": [\"a\", \"b\"]}}}";
static const char ECHO_SCHEMA[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"slow_echo\", \"description\": \"Echo a text after "
    "yielding once.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"text\": {\"type\": \"string\", "
    "\"description\": \"What to echo.\"}, \"tags\": {\"type\": \"array\", \"description\": \"Labels.\"}, \"n\": "
    "{\"type\": [\"integer\", \"number\"], \"description\": \"A count.\"}}, \"required\": [\"text\", "
    "\"tags\"]}}}";

static void expect_schema(const struct tool *t, const char *want)
{
    json_t *w = json_loads(want, 0, NULL);
    assert_non_null(w);
    if (!json_equal(w, t->schema)) {
        char *got = json_dumps(t->schema, JSON_SORT_KEYS);
        char *exp = json_dumps(w, JSON_SORT_KEYS);
        fail_msg("%s's schema:\n%s\nexpected:\n%s", t->name, got, exp);
    }
    json_decref(w);
}

static void test_function_tools(void **state)
{
    (void)state;
    struct tool_set s = {0};
    char err[1024];
    if (tool_set_load_function_tools(&s, FIX "function_tools.py", err, sizeof err) != 0)
        fail_msg("%s", err);
    char *names = tool_set_names(&s);
    assert_string_equal(names, "add, fail, get_weather, slow_echo");
    free(names);
    expect_schema(find(&s, "get_weather"), WEATHER_SCHEMA);
    expect_schema(find(&s, "add"), ADD_SCHEMA);
    expect_schema(find(&s, "slow_echo"), ECHO_SCHEMA);
    expect_answer(find(&s, "add"), NULL, "{\"a\": 1, \"b\": 2.5}", "3.5", 0);
    expect_answer(find(&s, "add"), "traj", "{\"a\": 1, \"b\": 2, \"note\": \"hi\"}", "3 hi", 0);
    expect_answer(find(&s, "add"), NULL, "{\"a\": 1, \"b\": 2, \"note\": \"yo\"}",
                  "Error: argument 'note' must be one of [\"hi\",\"bye\"]", 1);
    expect_answer(find(&s, "get_weather"), NULL, "{\"city\": \"Tokyo\"}",
                  "{\"city\": \"Tokyo\", \"temperature\": 17.3}", 0);
    double r = 0;
    int e = -1;
    char *out = call(find(&s, "slow_echo"), NULL, "{\"text\": \"hi\", \"tags\": [], \"n\": 2.5}", &r, &e);
    assert_string_equal(out, "HI");
    assert_true(r == 0.25);
    assert_int_equal(e, 0);
    free(out);
    expect_answer(find(&s, "slow_echo"), NULL, "{\"text\": \"hi\", \"tags\": [], \"n\": \"2\"}",
                  "Error: argument 'n' must be of type integer or number, not string", 1);
    expect_answer(find(&s, "fail"), NULL, "{\"why\": \"boom\"}", "Error: KeyError: 'boom'", 1);
    /* function tools have no instances: create and release are no-ops, calc_reward 0 */
    assert_int_equal(tool_create(find(&s, "add"), "t1", NULL, err, sizeof err), 0);
    assert_true(tool_calc_reward(find(&s, "add"), "t1") == 0.0);
    tool_release(find(&s, "add"), "t1");
    /* a second load of the same names is refused, the set unchanged */
    assert_int_equal(tool_set_load_function_tools(&s, FIX "function_tools.py", err, sizeof err), -1);
    CONTAINS(err, "a tool of that name exists already");
    assert_int_equal(s.n, 4);
    tool_set_free(&s);
}

/* ---- load errors ---- */

static void expect_load_error(const char *path, const char *want)
{
    struct tool_set s;
    char err[2048];
    if (tool_set_load_yaml(&s, path, err, sizeof err) == 0)
        fail_msg("%s loaded", path);
    CONTAINS(err, want);
}

static void test_load_errors(void **state)
{
    (void)state;
    char dir[] = "/tmp/grpo-pytools.XXXXXX", path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/nomodule.yaml", dir);
    FILE *f = fopen(path, "w");
    fputs("tools:\n  - class_name: nosuch_pkg.tools.SearchTool\n"
          "    tool_schema: {type: function, function: {name: s, parameters: {type: object, properties: {}}}}\n",
          f);
    fclose(f);
    char want[256];
    snprintf(want, sizeof want,
             "%s:2: cannot load class 'nosuch_pkg.tools.SearchTool': ModuleNotFoundError: No module named "
             "'nosuch_pkg'",
             path);
    expect_load_error(path, want);
    unlink(path);
    rmdir(dir);
    expect_load_error(FIX "bad_class.yaml", FIX "bad_class.yaml:5: cannot load class 'counter_tool.NoSuchTool': "
                                                "ImportError: module 'counter_tool'");
    expect_load_error(FIX "bad_class.yaml", "has no attribute 'NoSuchTool'");
    expect_load_error(FIX "broken_init.yaml", FIX "broken_init.yaml:3: cannot load class 'counter_tool.BrokenInit': "
                                                  "RuntimeError: cannot build this tool");
    struct tool_set s = {0};
    char err[1024];
    assert_int_equal(tool_set_load_function_tools(&s, FIX "broken_function_tools.py", err, sizeof err), -1);
    CONTAINS(err, "@function_tool 'half_documented'");
    CONTAINS(err, "the docstring has no description for the argument 'y'");
    assert_int_equal(tool_set_load_function_tools(&s, FIX "nonexistent.py", err, sizeof err), -1);
    CONTAINS(err, "nonexistent.py: No such file or directory");
    assert_int_equal(s.n, 0);
}

/* ---- verl's own modules where installed, the stand-ins elsewhere ---- */

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char PROBE_TOOL[] =
    "from verl.tools.base_tool import BaseTool\n"
    "from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse\n"
    "from verl.tools.function_tool import function_tool\n"
    "import verl\n"
    "class Probe(BaseTool):\n"
    "    async def execute(self, instance_id, parameters, **kwargs):\n"
    "        return ToolResponse(text=getattr(verl, 'MARK', 'stand-in') + ' ' + self.name + ' ' +\n"
    "                            type(self.tool_schema).__name__), 0.0, {}\n";
static const char PROBE_YAML[] =
    "tools:\n  - class_name: probe_tool.Probe\n"
    "    tool_schema: {type: function, function: {name: probe, parameters: {type: object, properties: {}}}}\n";

/* whether `python3 -c CODE` exits 0 (its output dropped) */
static int python_ok(const char *code)
{
    const pid_t pid = fork();
    if (pid == 0) {
        const int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1), dup2(fd, 2);
        execlp("python3", "python3", "-c", code, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void test_verl_modules(void **state)
{
    (void)state;
    const int has_verl = python_ok("import verl");
    char dir[] = "/tmp/grpo-pytools.XXXXXX", path[512];
    assert_non_null(mkdtemp(dir));
    write_file(dir, "probe_tool.py", PROBE_TOOL);
    write_file(dir, "tools.yaml", PROBE_YAML);
    snprintf(path, sizeof path, "%s/tools.yaml", dir);
    struct tool_set s = load_yaml(path);
    if (!has_verl)
        expect_answer(find(&s, "probe"), NULL, "{}", "stand-in probe OpenAIFunctionToolSchema", 0);
    tool_set_free(&s);
    /* a verl package beside the tool (on the helpers' path): the runner uses it, not its stand-ins */
    char sub[600];
    snprintf(sub, sizeof sub, "%s/verl", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(sub, sizeof sub, "%s/verl/tools", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(sub, sizeof sub, "%s/verl/utils", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    write_file(dir, "verl/__init__.py", "MARK = 'installed'\n");
    write_file(dir, "verl/utils/__init__.py", "");
    write_file(dir, "verl/tools/__init__.py", "");
    write_file(dir, "verl/tools/schemas.py",
               "class OpenAIFunctionToolSchema(dict):\n"
               "    @classmethod\n"
               "    def model_validate(cls, d):\n"
               "        return cls(d)\n"
               "class ToolResponse:\n"
               "    def __init__(self, text=None):\n"
               "        self.text = text\n");
    write_file(dir, "verl/tools/base_tool.py",
               "class BaseTool:\n"
               "    def __init__(self, config, tool_schema):\n"
               "        self.tool_schema = tool_schema\n"
               "        self.name = 'own-' + tool_schema['function']['name']\n");
    write_file(dir, "verl/tools/function_tool.py", "def function_tool(f):\n    return f\n");
    s = load_yaml(path);
    expect_answer(find(&s, "probe"), NULL, "{}", "installed own-probe OpenAIFunctionToolSchema", 0);
    tool_set_free(&s);
    assert_int_equal(nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
}

/* ---- the built-ins' is_error ---- */

static void test_builtin_errors(void **state)
{
    (void)state;
    char err[256];
    struct tool *t = calculator_new(NULL, err, sizeof err);
    assert_non_null(t);
    assert_int_equal(tool_create(t, "x", NULL, err, sizeof err), 0); /* built-ins ignore instances */
    expect_answer(t, "x", "{\"expression\": \"6*7\"}", "42", 0);
    expect_answer(t, "x", "{\"expression\": \"1/0\"}", "Error: division by zero", 1);
    expect_answer(t, "x", "{}", "Error: missing required argument 'expression'", 1);
    assert_true(tool_calc_reward(t, "x") == 0.0);
    tool_release(t, "x");
    tool_free(t);
    /* the code interpreter without a sandbox answers an error */
    struct sandbox_limits l;
    sandbox_limits_default(&l);
    snprintf(l.bwrap, sizeof l.bwrap, "/nonexistent/bwrap");
    t = code_interpreter_new(NULL, &l, err, sizeof err);
    assert_non_null(t);
    int e = -1;
    char *out = call(t, "x", "{\"code\": \"print(1)\"}", NULL, &e);
    CONTAINS(out, "Error: code execution is unavailable");
    assert_int_equal(e, 1);
    free(out);
    tool_free(t);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_class_life_cycle), cmocka_unit_test(test_sync_class_and_return_forms),
        cmocka_unit_test(test_odd_answers),      cmocka_unit_test(test_exception_and_exit),
        cmocka_unit_test(test_timeout),          cmocka_unit_test(test_threads),
        cmocka_unit_test(test_function_tools),   cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_verl_modules),     cmocka_unit_test(test_builtin_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
