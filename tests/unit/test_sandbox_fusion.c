/* worker/agent/sandbox_fusion.c: verl's SandboxFusionTool with a sandbox_fusion_url, against a stand-in server
 * (tests/fixtures/tools/sandbox_fusion_standin.py, on a port the OS picks, announced on its stdout) that really
 * runs the code with the request's time and memory limits.
 *
 * The request carries verl's fields (code, language, compile_timeout, run_timeout, memory_limit_MB, stdin, files,
 * fetch_files); answers: stdout and stderr, "[exit status N]" for a non-zero exit, MemoryError under
 * memory_limit_mb, "[stopped: the time limit ...]"; the call's "language" and "timeout" arguments; and each failure
 * mode is an error answer (is_error) and never a hang: HTTP 500 (tried 3 times, with backoff), a server that fails
 * twice then answers (the third try's answer), a body that is not JSON, SandboxError, HTTP 404, a port where nothing
 * listens (3 tries), a server slower than compile + run + api_timeout (one try, stopped by the timeout). The
 * limits on requests in flight: num_workers per tool, and the process-wide rate_limit set by the first tool that
 * enables it (verl's named rate limiter), seen as the server's most concurrent requests. The config keys come
 * through verl's tool-config YAML. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "worker/agent/tool.h"

#define CONTAINS(hay, needle)                                                                                          \
    do {                                                                                                               \
        if (!strstr((hay), (needle)))                                                                                  \
            fail_msg("expected '%s' in:\n%s", (needle), (hay));                                                        \
    } while (0)

static pid_t server_pid;
static int port;
static char tmpdir[] = "/tmp/grpo-sf.XXXXXX";

/* Start the stand-in and read the port it prints (a line on a pipe, awaited with poll). */
static int start_server(void **state)
{
    (void)state;
    if (!mkdtemp(tmpdir))
        return -1;
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    server_pid = fork();
    if (server_pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execlp("python3", "python3", "tests/fixtures/tools/sandbox_fusion_standin.py", "-", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[32] = {0};
    size_t n = 0;
    const double deadline = clock_now_s() + 30;
    while (!memchr(buf, '\n', n) && n < sizeof buf - 1) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        const double left = deadline - clock_now_s();
        if (left <= 0 || poll(&p, 1, (int)(left * 1000) + 1) <= 0)
            break;
        const ssize_t r = read(fds[0], buf + n, sizeof buf - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fds[0]);
    port = atoi(buf);
    if (port <= 0) {
        fprintf(stderr, "the stand-in server did not start (read '%s')\n", buf);
        return -1;
    }
    return 0;
}

static int stop_server(void **state)
{
    (void)state;
    if (server_pid > 0) {
        kill(server_pid, SIGKILL);
        waitpid(server_pid, NULL, 0);
    }
    rmdir(tmpdir);
    return 0;
}

static size_t keep(char *p, size_t size, size_t n, void *ud)
{
    char *buf = ud;
    const size_t have = strlen(buf), add = size * n;
    if (have + add < 4096) {
        memcpy(buf + have, p, add);
        buf[have + add] = '\0';
    }
    return add;
}

/* GET path from the stand-in: its body (static) */
static const char *get(const char *path)
{
    static char buf[4096];
    char url[256];
    buf[0] = '\0';
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, keep);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, buf);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    assert_int_equal(curl_easy_perform(h), CURLE_OK);
    curl_easy_cleanup(h);
    return buf;
}

static int count(const char *path)
{
    char q[128];
    snprintf(q, sizeof q, "/count?path=%s", path);
    return atoi(get(q));
}

/* A tool set from YAML: one SandboxFusionTool at url_path with extra config lines. */
static struct tool_set load(const char *url_path, const char *extra)
{
    char path[128];
    snprintf(path, sizeof path, "%s/tools.yaml", tmpdir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "tools:\n"
            "  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n"
            "    config:\n"
            "      type: native\n"
            "      sandbox_fusion_url: \"http://127.0.0.1:%d%s\"\n"
            "      max_tool_response_length: 0\n"
            "%s"
            "    tool_schema:\n"
            "      type: function\n"
            "      function:\n"
            "        name: code_interpreter\n"
            "        description: A tool for executing code.\n"
            "        parameters:\n"
            "          type: object\n"
            "          properties:\n"
            "            code: {type: string, description: The code to execute.}\n"
            "          required: [code]\n",
            port, url_path, extra ? extra : "");
    fclose(f);
    struct tool_set s;
    char err[1024];
    if (tool_set_load_yaml(&s, path, err, sizeof err) != 0)
        fail_msg("%s", err);
    unlink(path);
    return s;
}

static char *run(struct tool *t, const char *code_json_args, int *is_error)
{
    double r;
    return tool_call_in(t, "traj", code_json_args, &r, is_error);
}

static void expect(struct tool *t, const char *args, const char *want, int want_error)
{
    int e = -1;
    char *out = run(t, args, &e);
    if (strcmp(out, want) != 0)
        fail_msg("%s: expected '%s', got '%s'", args, want, out);
    if (e != want_error)
        fail_msg("%s: is_error %d, expected %d", args, e, want_error);
    free(out);
}

/* ---- limits on requests in flight (first: the process-wide limit is set by the first tool that asks) ---- */

struct caller {
    struct tool *t;
    int bad;
};

static void *caller(void *p)
{
    struct caller *c = p;
    int e = -1;
    /* sleep-ok: a run that lasts, so that requests overlap and the server can count them */
    char *out = run(c->t, "{\"code\": \"import time; time.sleep(0.4); print('ok')\"}", &e);
    c->bad = strcmp(out, "ok\n") != 0 || e != 0;
    free(out);
    return NULL;
}

static int most_in_flight(struct tool *t, int threads)
{
    get("/reset");
    pthread_t th[8];
    struct caller c[8];
    for (int i = 0; i < threads; i++) {
        c[i] = (struct caller){.t = t};
        assert_int_equal(pthread_create(&th[i], NULL, caller, &c[i]), 0);
    }
    for (int i = 0; i < threads; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(c[i].bad, 0);
    }
    return atoi(get("/max_inflight"));
}

static void test_in_flight_limits(void **state)
{
    (void)state;
    /* the first tool with enable_global_rate_limit sets the process's limit (1); a later one's rate_limit (5)
     * does not change it */
    struct tool_set g1 = load("/run_code", "      enable_global_rate_limit: true\n      rate_limit: 1\n");
    struct tool_set g2 = load("/run_code", "      rate_limit: 5\n      num_workers: 5\n");
    assert_int_equal(most_in_flight(g2.tools[0], 3), 1);
    /* without the global limit: num_workers alone */
    struct tool_set w2 = load("/run_code", "      enable_global_rate_limit: false\n      num_workers: 2\n");
    assert_int_equal(most_in_flight(w2.tools[0], 4), 2);
    tool_set_free(&g1);
    tool_set_free(&g2);
    tool_set_free(&w2);
}

/* ---- answers ---- */

static void test_runs_code(void **state)
{
    (void)state;
    struct tool_set s = load("/run_code", "      default_timeout: 5\n      memory_limit_mb: 256\n"
                                          "      enable_global_rate_limit: false\n");
    struct tool *t = s.tools[0];
    expect(t, "{\"code\": \"print(6*7)\"}", "42\n", 0);
    json_t *last = json_loads(get("/last"), 0, NULL);
    assert_non_null(last);
    assert_string_equal(json_string_value(json_object_get(last, "code")), "print(6*7)");
    assert_string_equal(json_string_value(json_object_get(last, "language")), "python");
    assert_true(json_number_value(json_object_get(last, "run_timeout")) == 5.0);
    assert_true(json_number_value(json_object_get(last, "compile_timeout")) == 5.0);
    assert_int_equal(json_integer_value(json_object_get(last, "memory_limit_MB")), 256);
    assert_true(json_is_null(json_object_get(last, "stdin")));
    assert_true(json_is_object(json_object_get(last, "files")));
    assert_true(json_is_array(json_object_get(last, "fetch_files")));
    json_decref(last);
    expect(t, "{\"code\": \"import sys\\nprint('out')\\nprint('err', file=sys.stderr)\\nsys.exit(4)\"}",
           "out\nerr\n[exit status 4]", 1);
    int e = -1;
    char *out = run(t, "{\"code\": \"x = bytearray(400 << 20)\"}", &e);
    CONTAINS(out, "MemoryError");
    CONTAINS(out, "[exit status 1]");
    assert_int_equal(e, 1);
    free(out);
    /* verl's tool takes "timeout" and "language" from the call's arguments too */
    expect(
        t,
        "{\"code\": \"import time\\nprint('start', flush=True)\\ntime.sleep(30)\", \"timeout\": 1}", /* sleep-ok: a run
                                                                                                        past its time
                                                                                                        limit is what is
                                                                                                        tested */
        "start\n[stopped: the time limit of 1 s was reached]", 1);
    expect(t, "{\"code\": \"echo hi from bash\", \"language\": \"bash\"}", "hi from bash\n", 0);
    expect(t, "{\"code\": \"1\", \"language\": \"cobol\"}", "Error: unsupported language 'cobol'", 1);
    tool_set_free(&s);
}

/* ---- failures ---- */

static void test_server_failures(void **state)
{
    (void)state;
    const char *fast = "      enable_global_rate_limit: false\n";
    struct tool_set s = load("/status500/run_code", fast);
    expect(s.tools[0], "{\"code\": \"1\"}", "Error: the code sandbox failed: HTTP 500 (3 attempts)", 1);
    assert_int_equal(count("/status500/run_code"), 3);
    tool_set_free(&s);

    s = load("/flaky/run_code", fast);
    expect(s.tools[0], "{\"code\": \"print(2)\"}", "2\n", 0);
    assert_int_equal(count("/flaky/run_code"), 3);
    tool_set_free(&s);

    s = load("/garbage/run_code", fast);
    expect(s.tools[0], "{\"code\": \"1\"}",
           "Error: the code sandbox's answer is not a JSON object (17 bytes: '[' or '{' expected near 'this')", 1);
    assert_int_equal(count("/garbage/run_code"), 1); /* not retried */
    tool_set_free(&s);

    s = load("/sandboxerror/run_code", fast);
    expect(s.tools[0], "{\"code\": \"1\"}", "Error: the code sandbox failed: the runner crashed", 1);
    tool_set_free(&s);

    s = load("/nowhere/run_code", fast);
    expect(s.tools[0], "{\"code\": \"1\"}",
           "Error: the code sandbox refused the request: HTTP 404: {\"detail\": \"Not Found\"}", 1);
    tool_set_free(&s);

    /* slower than compile + run timeouts + api_timeout (1 + 1 + 1 s): stopped, not retried */
    s = load("/slow/run_code",
             "      enable_global_rate_limit: false\n      default_timeout: 1\n      api_timeout: 1\n");
    const double t0 = clock_now_s();
    expect(s.tools[0], "{\"code\": \"1\"}", "Error: the code sandbox did not answer within 3 s", 1);
    const double took = clock_now_s() - t0;
    assert_true(took >= 2.9 && took < 15);
    assert_int_equal(count("/slow/run_code"), 1);
    tool_set_free(&s);
}

static void test_nothing_listens(void **state)
{
    (void)state;
    /* a port bound and not listening: connections are refused */
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    const int saved = port;
    port = ntohs(a.sin_port);
    struct tool_set s = load("/run_code", "      enable_global_rate_limit: false\n");
    port = saved;
    expect(s.tools[0], "{\"code\": \"1\"}",
           "Error: the code sandbox cannot be reached (Couldn't connect to server; 3 attempts)", 1);
    tool_set_free(&s);
    close(fd);
}

/* ---- config errors ---- */

static void test_config_errors(void **state)
{
    (void)state;
    char path[128], err[1024];
    snprintf(path, sizeof path, "%s/bad.yaml", tmpdir);
    const char *cases[][2] = {
        {"      sandbox_fusion_url: \"ftp://x/run_code\"\n",
         ":4: config.sandbox_fusion_url: an http:// or https:// URL of SandboxFusion's run_code"},
        {"      sandbox_fusion_url: \"http://x/run_code\"\n      cpu_time_limit_s: 3\n",
         ":5: config.cpu_time_limit_s: applies to the built-in local sandbox, not to a SandboxFusion server"},
        {"      sandbox_fusion_url: \"http://x/run_code\"\n      default_language: cobol\n",
         ":5: config.default_language: 'cobol' is not a language SandboxFusion runs"},
        {"      sandbox_fusion_url: \"http://x/run_code\"\n      enable_global_rate_limit: maybe\n",
         ":5: config.enable_global_rate_limit: expected true or false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        FILE *f = fopen(path, "w");
        fprintf(f,
                "tools:\n  - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool\n    config:\n"
                "%s    tool_schema: {type: function, function: {name: c, parameters: {type: object, properties: "
                "{code: {type: string}}}}}\n",
                cases[i][0]);
        fclose(f);
        struct tool_set s;
        if (tool_set_load_yaml(&s, path, err, sizeof err) == 0)
            fail_msg("case %zu loaded", i);
        CONTAINS(err, cases[i][1]);
    }
    unlink(path);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    setenv("no_proxy", "127.0.0.1", 1); /* the stand-in is local whatever proxy the environment names */
    setenv("NO_PROXY", "127.0.0.1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_flight_limits), cmocka_unit_test(test_runs_code),
        cmocka_unit_test(test_server_failures),  cmocka_unit_test(test_nothing_listens),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, start_server, stop_server);
}
