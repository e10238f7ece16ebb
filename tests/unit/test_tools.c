/* worker/agent: the tool interface and the code interpreter's sandbox.
 *
 * The interface: arguments checked against the schema (a missing, mistyped, unknown or out-of-enum argument is
 * an error message naming it; arguments that are not JSON or not an object too), schema errors name their path,
 * truncation keeps the left, right or middle part with a marker saying how much was cut (between UTF-8
 * characters).
 *
 * The sandbox: each escape attempt ends with an error for the model and the caller goes on: hidden files
 * (/etc/shadow, the project tree, $HOME), writes outside the tmpfs, TCP to a listener of this test and an
 * abstract unix socket of this test (neither listener sees a connection), a fork bomb (the process limit
 * answers before the wall limit), an endless loop (SIGXCPU from the CPU limit), 1 GB of memory (MemoryError),
 * 100 MB of output (cut at the limit), ptrace / unshare / mount through ctypes (EPERM), a sleep past the wall
 * limit, and a background process left behind (gone when the call returns: no process in /proc has its marker
 * or a sandbox uid). A sandbox that cannot be made (no bwrap) refuses to run the code. The waits are the
 * sandbox's own (pidfd, pipe); the test never sleeps. Each check fails when the protection it names is gone. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "worker/agent/tool.h"

#define CONTAINS(hay, needle)                                                                                          \
    do {                                                                                                               \
        if (!strstr((hay), (needle)))                                                                                  \
            fail_msg("expected '%s' in:\n%s", (needle), (hay));                                                        \
    } while (0)
#define LACKS(hay, needle)                                                                                             \
    do {                                                                                                               \
        if (strstr((hay), (needle)))                                                                                   \
            fail_msg("did not expect '%s' in:\n%s", (needle), (hay));                                                  \
    } while (0)

static struct tool *calc_tool(void)
{
    char err[256];
    struct tool *t = calculator_new(NULL, err, sizeof err);
    assert_non_null(t);
    return t;
}

/* ---- the interface ---- */

static const char SCHEMA[] =
    "{\"type\":\"function\",\"function\":{\"name\":\"probe\",\"description\":\"d\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"n\":{\"type\":"
    "\"number\"},\"b\":{\"type\":\"boolean\"},\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},\"e\":{"
    "\"type\":\"string\",\"enum\":[\"x\",\"y\"]}},\"required\":[\"s\",\"i\"],\"additionalProperties\":false}}}";

static char *echo_execute(struct tool *t, const json_t *args)
{
    (void)t;
    return json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
}
static const struct tool_ops ECHO_OPS = {.execute = echo_execute};

static void test_validation(void **state)
{
    (void)state;
    char err[256];
    json_t *schema = json_loads(SCHEMA, 0, NULL);
    assert_non_null(schema);
    struct tool *t = tool_new(schema, &ECHO_OPS, NULL, err, sizeof err);
    json_decref(schema);
    assert_non_null(t);
    static const char *const cases[][2] = {
        {"{\"s\":\"a\",\"i\":1}", "{\"i\":1,\"s\":\"a\"}"},
        {"{\"s\":\"a\",\"i\":2.0,\"n\":1,\"b\":true,\"o\":{},\"a\":[],\"e\":\"y\"}", "{\"a\":[],\"b\":true"},
        {"{\"i\":1}", "Error: missing required argument 's'"},
        {"{\"s\":1,\"i\":1}", "Error: argument 's' must be of type string, not integer"},
        {"{\"s\":\"a\",\"i\":1.5}", "Error: argument 'i' must be of type integer, not number"},
        {"{\"s\":\"a\",\"i\":1,\"n\":\"1\"}", "Error: argument 'n' must be of type number, not string"},
        {"{\"s\":\"a\",\"i\":1,\"b\":1}", "Error: argument 'b' must be of type boolean, not integer"},
        {"{\"s\":\"a\",\"i\":1,\"o\":[]}", "Error: argument 'o' must be of type object, not array"},
        {"{\"s\":\"a\",\"i\":1,\"a\":{}}", "Error: argument 'a' must be of type array, not object"},
        {"{\"s\":\"a\",\"i\":1,\"e\":\"z\"}", "Error: argument 'e' must be one of [\"x\",\"y\"]"},
        {"{\"s\":\"a\",\"i\":1,\"zz\":1}", "Error: unknown argument 'zz' (this tool takes: s, i, n, b, o, a, e)"},
        {"[1]", "Error: the arguments must be a JSON object, not array"},
        {"{\"s\":", "Error: the arguments are not valid JSON"},
        {"{\"s\":\"a\",\"s\":\"b\",\"i\":1}", "Error: the arguments are not valid JSON: duplicate object key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out = tool_call(t, cases[i][0]);
        if (strncmp(out, cases[i][1], strlen(cases[i][1])) != 0)
            fail_msg("%s -> %s (expected %s)", cases[i][0], out, cases[i][1]);
        free(out);
    }
    /* additionalProperties not false: an unknown key passes */
    json_t *open = json_loads(SCHEMA, 0, NULL);
    json_object_del(json_object_get(json_object_get(open, "function"), "parameters"), "additionalProperties");
    struct tool *t2 = tool_new(open, &ECHO_OPS, NULL, err, sizeof err);
    json_decref(open);
    char *out = tool_call(t2, "{\"s\":\"a\",\"i\":1,\"zz\":1}");
    assert_string_equal(out, "{\"i\":1,\"s\":\"a\",\"zz\":1}");
    free(out);
    tool_free(t2);
    tool_free(t);
}

static void test_schema_errors(void **state)
{
    (void)state;
    static const char *const cases[][3] = {
        {"{\"type\":\"tool\"}", "type", "must be \"function\""},
        {"{\"type\":\"function\"}", "function", "missing"},
        {"{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}", "function.name", "not a name"},
        {"{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"array\"}}}",
         "function.parameters.type", "must be \"object\""},
        {"{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
         "{\"x\":{\"type\":\"str\"}}}}}",
         "function.parameters.properties.x.type", "unknown type 'str'"},
        {"{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":"
         "{\"x\":{\"type\":\"string\"}},\"required\":[\"y\"]}}}",
         "function.parameters.required", "'y' is not one of the properties"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *s = json_loads(cases[i][0], 0, NULL);
        assert_non_null(s);
        char err[512], where[256];
        assert_int_equal(tool_schema_check(s, err, sizeof err, where, sizeof where), -1);
        assert_string_equal(where, cases[i][1]);
        CONTAINS(err, cases[i][2]);
        json_decref(s);
    }
}

static void test_truncation(void **state)
{
    (void)state;
    char *s;
    s = tool_truncate("0123456789", 4, TOOL_TRUNCATE_LEFT);
    assert_string_equal(s, "0123...(truncated 6 characters)");
    free(s);
    s = tool_truncate("0123456789", 4, TOOL_TRUNCATE_RIGHT);
    assert_string_equal(s, "(truncated 6 characters)...6789");
    free(s);
    s = tool_truncate("0123456789", 5, TOOL_TRUNCATE_MIDDLE);
    assert_string_equal(s, "01...(truncated 5 characters)...789");
    free(s);
    s = tool_truncate("0123456789", 10, TOOL_TRUNCATE_MIDDLE); /* fits */
    assert_string_equal(s, "0123456789");
    free(s);
    s = tool_truncate("0123456789", 0, TOOL_TRUNCATE_LEFT); /* no limit */
    assert_string_equal(s, "0123456789");
    free(s);
    /* characters, not bytes: é and € are kept whole */
    s = tool_truncate("\xc3\xa9\xc3\xa9\xe2\x82\xac\xe2\x82\xac", 2, TOOL_TRUNCATE_LEFT);
    assert_string_equal(s, "\xc3\xa9\xc3\xa9...(truncated 2 characters)");
    free(s);
    s = tool_truncate("\xc3\xa9\xc3\xa9\xe2\x82\xac\xe2\x82\xac", 3, TOOL_TRUNCATE_MIDDLE);
    assert_string_equal(s, "\xc3\xa9...(truncated 1 characters)...\xe2\x82\xac\xe2\x82\xac");
    free(s);
    /* through a call: the tool's limit and side apply to its answer */
    struct tool *t = calc_tool();
    t->max_response_length = 10;
    t->truncate_side = TOOL_TRUNCATE_RIGHT;
    char *out = tool_call(t, "{\"expression\": \"10**30\"}");
    assert_string_equal(out, "(truncated 21 characters)...0000000000");
    free(out);
    tool_free(t);
}

static void test_calculator(void **state)
{
    (void)state;
    static const char *const ok[][2] = {
        {"2**100", "1267650600228229401496703205376"},
        {"-2**2", "-4"},
        {"2**-1", "0.5"},
        {"2**3**2", "512"},
        {"-7 // 2", "-4"},
        {"-7 % 3", "2"},
        {"7 % -3", "-2"},
        {"(1+2)*3 - -4", "13"},
        {"1/3", "0.3333333333333333"},
        {"0.1 + 0.2", "0.30000000000000004"},
        {"1e16", "1e+16"},
        {"1.5e-5", "1.5e-05"},
        {"123456789123456789 * 987654321987654321", "121932631356500531347203169112635269"},
        {"10**40 // 7", "1428571428571428571428571428571428571428"},
        {"1_000 + 1", "1001"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char err[256];
        char *v = calculator_eval(ok[i][0], err, sizeof err);
        if (!v || strcmp(v, ok[i][1]) != 0)
            fail_msg("%s -> %s (expected %s)", ok[i][0], v ? v : err, ok[i][1]);
        free(v);
    }
    static const char *const bad[][2] = {
        {"1/0", "division by zero"}, {"5 % 0", "integer modulo by zero"},
        {"2**100000", "digits"},     {"(1+2", "missing ')'"},
        {"1+2)", "unmatched ')'"},   {"__import__('os')", "unexpected character '_'"},
        {"(-8.0)**0.5", "complex"},  {"10**400 * 1.0", "too large to convert to a float"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        char *v = calculator_eval(bad[i][0], err, sizeof err);
        if (v)
            fail_msg("%s -> %s (expected an error)", bad[i][0], v);
        CONTAINS(err, bad[i][1]);
    }
    char *longexpr = malloc(20002);
    memset(longexpr, '1', 20001);
    longexpr[20001] = '\0';
    char err[256];
    assert_null(calculator_eval(longexpr, err, sizeof err));
    CONTAINS(err, "longer than");
    free(longexpr);
}

/* ---- the sandbox ---- */

static struct sandbox_limits test_limits(void)
{
    struct sandbox_limits l;
    sandbox_limits_default(&l);
    l.wall_s = 20;
    l.cpu_s = 1;
    l.max_procs = 16;
    return l;
}

static struct tool *ci_tool(const struct sandbox_limits *l)
{
    char err[256];
    struct tool *t = code_interpreter_new(NULL, l, err, sizeof err);
    assert_non_null(t);
    t->max_response_length = 0;
    return t;
}

static char *run_code(struct tool *t, const char *code)
{
    json_t *args = json_pack("{s:s}", "code", code);
    char *out = tool_call_json(t, args);
    json_decref(args);
    return out;
}

/* A machine where no sandbox can be made fails these tests (a silent skip would hide a broken sandbox) unless
 * GRPO_TEST_NO_SANDBOX=1 says that is expected there; then they are skipped. */
static int skip_without_sandbox(void)
{
    struct sandbox_limits l = test_limits();
    char why[256];
    if (!sandbox_available(&l, why, sizeof why)) {
        const char *ok = getenv("GRPO_TEST_NO_SANDBOX");
        if (!ok || strcmp(ok, "1") != 0)
            fail_msg("no sandbox can be made on this machine (%s); GRPO_TEST_NO_SANDBOX=1 skips these tests", why);
        print_message("no sandbox on this machine (%s): skipped\n", why);
        return 1;
    }
    return 0;
}

static void test_hidden_files(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    struct sandbox_limits l = test_limits();
    struct tool *t = ci_tool(&l);
    char cwd[1024], home_file[1100], code[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    const char *home = getenv("HOME") ? getenv("HOME") : "/root";
    snprintf(home_file, sizeof home_file, "%s/.grpo-tool-test-XXXXXX", home);
    const int fd = mkstemp(home_file);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "secret\n", 7), 7);
    close(fd);
    snprintf(code, sizeof code,
             "for p in ['/etc/shadow', '/etc/passwd', '%s/meson.build', '%s', '/root/.bashrc']:\n"
             "    try:\n        open(p).read(); print('LEAK', p)\n"
             "    except OSError as e: print('blocked', p, type(e).__name__)\n",
             cwd, home_file);
    char *out = run_code(t, code);
    unlink(home_file);
    LACKS(out, "LEAK");
    CONTAINS(out, "blocked /etc/shadow FileNotFoundError");
    CONTAINS(out, "blocked /etc/passwd FileNotFoundError");
    CONTAINS(out, "meson.build FileNotFoundError");
    CONTAINS(out, ".grpo-tool-test-");
    LACKS(out, "secret");
    free(out);
    tool_free(t);
}

static void test_writes(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    struct sandbox_limits l = test_limits();
    struct tool *t = ci_tool(&l);
    char *out = run_code(t, "import os\n"
                            "for p in ['/x', '/usr/x', '/etc/x', '/dev/x']:\n"
                            "    try:\n        open(p, 'w').write('x'); print('WROTE', p)\n"
                            "    except OSError as e: print('refused', p, e.strerror)\n"
                            "open('here', 'w').write('ok'); open('/tmp/there', 'w').write('ok')\n"
                            "open('/dev/null', 'w').write('ok'); open('/dev/shm/x', 'w').write('ok')\n"
                            "print('cwd', os.getcwd(), sorted(os.listdir('.')))\n");
    LACKS(out, "WROTE");
    CONTAINS(out, "refused /x Read-only file system");
    CONTAINS(out, "refused /usr/x Read-only file system");
    CONTAINS(out, "refused /dev/x Read-only file system");
    CONTAINS(out, "cwd /tmp ['here', 'there']");
    free(out);
    /* the tmpfs is fresh for every call */
    out = run_code(t, "import os; print(sorted(os.listdir('/tmp')))");
    assert_string_equal(out, "[]\n");
    free(out);
    tool_free(t);
}

static void test_network(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    /* a TCP listener on 127.0.0.1 and an abstract unix socket, both this test's */
    const int tcp = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(tcp, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(tcp, 8), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(tcp, (struct sockaddr *)&sa, &sl), 0);
    const int ux = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_un su = {.sun_family = AF_UNIX};
    char name[64];
    snprintf(name, sizeof name, "grpo-tool-test-%d", (int)getpid());
    memcpy(su.sun_path + 1, name, strlen(name));
    const socklen_t ulen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    assert_int_equal(bind(ux, (struct sockaddr *)&su, ulen), 0);
    assert_int_equal(listen(ux, 8), 0);

    struct sandbox_limits l = test_limits();
    struct tool *t = ci_tool(&l);
    char code[2048];
    snprintf(code, sizeof code,
             "import socket\n"
             "try:\n    socket.create_connection(('127.0.0.1', %d), timeout=2); print('CONNECTED tcp')\n"
             "except OSError as e: print('tcp', type(e).__name__)\n"
             "try:\n    s = socket.socket(socket.AF_UNIX); s.connect('\\0%s'); print('CONNECTED unix')\n"
             "except OSError as e: print('unix', type(e).__name__)\n",
             ntohs(sa.sin_port), name);
    char *out = run_code(t, code);
    LACKS(out, "CONNECTED");
    CONTAINS(out, "tcp PermissionError");         /* seccomp: no AF_INET socket */
    CONTAINS(out, "unix ConnectionRefusedError"); /* network namespace: the host's abstract name is not there */
    /* the call has returned: any connection would be queued by now */
    assert_int_equal(accept(tcp, NULL, NULL), -1);
    assert_int_equal(errno, EAGAIN);
    assert_int_equal(accept(ux, NULL, NULL), -1);
    assert_int_equal(errno, EAGAIN);
    free(out);
    close(tcp), close(ux);
    tool_free(t);
}

static void test_syscalls(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    struct sandbox_limits l = test_limits();
    struct tool *t = ci_tool(&l);
    char *out = run_code(t, "import ctypes\n"
                            "libc = ctypes.CDLL(None, use_errno=True)\n"
                            "def show(name, rc): print(name, rc, ctypes.get_errno())\n"
                            "show('ptrace', libc.ptrace(0, 0, 0, 0))\n"       /* PTRACE_TRACEME */
                            "show('unshare', libc.unshare(0x10000000))\n"     /* CLONE_NEWUSER */
                            "show('unshare-net', libc.unshare(0x40000000))\n" /* CLONE_NEWNET */
                            "show('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n"
                            "show('keyctl', libc.syscall(250, 0, 0, 0, 0))\n"    /* keyctl on x86_64 */
                            "show('bpf', libc.syscall(321, 0, 0, 0))\n"          /* bpf on x86_64 */
                            "show('perf', libc.syscall(298, 0, 0, 0, 0, 0))\n"); /* perf_event_open */
    CONTAINS(out, "ptrace -1 1\n"); /* EPERM from the filter (TRACEME itself is allowed to anyone) */
    CONTAINS(out, "unshare -1 1\n");
    CONTAINS(out, "unshare-net -1 1\n");
    CONTAINS(out, "mount -1 1\n");
#if defined(__x86_64__)
    CONTAINS(out, "keyctl -1 1\n");
    CONTAINS(out, "bpf -1 1\n");
    CONTAINS(out, "perf -1 1\n");
#endif
    free(out);
    tool_free(t);
}

static void test_fork_bomb(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    struct sandbox_limits l = test_limits();
    struct sandbox_result r;
    char err[256];
    assert_int_equal(sandbox_run_python(&l, "import os\nwhile True: os.fork()", &r, err, sizeof err), 0);
    /* the process limit stops it (fork fails), well before the wall limit would */
    assert_false(r.wall_killed);
    CONTAINS(r.output, "BlockingIOError");
    sandbox_result_free(&r);
}

static void test_cpu_and_wall(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    struct sandbox_limits l = test_limits();
    struct sandbox_result r;
    char err[256];
    assert_int_equal(sandbox_run_python(&l, "while True: pass", &r, err, sizeof err), 0);
    assert_false(r.wall_killed);
    assert_int_equal(r.exit_code, 128 + SIGXCPU);
    sandbox_result_free(&r);
    struct tool *t = ci_tool(&l);
    char *out = run_code(t, "while True: pass");
    CONTAINS(out, "[exit status 152: killed by SIGXCPU, the CPU-time limit of 1 s]");
    free(out);
    tool_free(t);
    /* a sleep uses no CPU: the wall limit ends it */
    l.wall_s = 1;
    const double t0 = clock_now_s();
    t = ci_tool(&l);
    out = run_code(t, "import time\nprint('sleeping', flush=True)\ntime.sleep(1000)");
    CONTAINS(out, "sleeping\n[stopped: the wall-time limit of 1 s was reached]");
    assert_true(clock_now_s() - t0 < 15);
    free(out);
    tool_free(t);
}

static void test_memory_and_output(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    struct sandbox_limits l = test_limits();
    struct tool *t = ci_tool(&l);
    char *out = run_code(t, "x = bytearray(10**9)\nprint('GOT', len(x))");
    LACKS(out, "GOT");
    CONTAINS(out, "MemoryError");
    free(out);
    tool_free(t);
    struct sandbox_result r;
    char err[256];
    assert_int_equal(
        sandbox_run_python(&l, "import sys\nsys.stdout.write('x' * 100_000_000)\nprint('END')", &r, err, sizeof err),
        0);
    assert_true(r.output_cut);
    assert_int_equal(r.len, l.max_output);
    assert_false(r.wall_killed);
    LACKS(r.output, "END");
    sandbox_result_free(&r);
}

/* live processes whose command line holds marker, or whose real uid is a sandbox uid (0x70000000 up) */
static int leftovers(const char *marker, char *which, size_t len)
{
    DIR *d = opendir("/proc");
    assert_non_null(d);
    int n = 0;
    which[0] = '\0';
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "rb");
        size_t k = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        for (size_t i = 0; i < k; i++)
            if (!buf[i])
                buf[i] = ' ';
        buf[k] = '\0';
        int hit = strstr(buf, marker) != NULL;
        char cmd[64], st[64] = "";
        snprintf(cmd, sizeof cmd, "%.60s", buf);
        snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
        f = fopen(path, "r");
        while (f && fgets(buf, sizeof buf, f)) {
            if (strncmp(buf, "Uid:", 4) == 0) {
                const unsigned long uid = strtoul(buf + 4, NULL, 10);
                hit |= uid >= 0x70000000ul && uid < 0x71000000ul;
            }
            if (strncmp(buf, "State:", 6) == 0)
                snprintf(st, sizeof st, "%.20s", buf + 7);
        }
        if (f)
            fclose(f);
        if (hit && st[0] != 'Z') { /* a zombie is dead (its parent has yet to reap it) */
            n++;
            const size_t used = strlen(which);
            snprintf(which + used, len - used, "%s (%s; %.*s) ", e->d_name, cmd, (int)strcspn(st, "\n"), st);
        }
    }
    closedir(d);
    return n;
}

static void test_background_process_killed(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    struct sandbox_limits l = test_limits();
    struct tool *t = ci_tool(&l);
    char marker[64], code[2048], which[4096];
    snprintf(marker, sizeof marker, "grpo-leftover-%d-%u", (int)getpid(), (unsigned)clock_now_s());
    /* the child runs (exec'd, its marker in its command line) before the parent prints and exits */
    snprintf(code, sizeof code,
             "import os, sys\n"
             "r, w = os.pipe()\n"
             "if os.fork() == 0:\n"
             "    os.setsid(); os.close(r)\n"
             "    os.execv(sys.executable, [sys.executable, '-c',\n"
             /* sleep-ok: sandboxed processes that must outlive the call, on purpose */
             "             'import os,time; os.write(%%d, b\"1\"); time.sleep(1000)' %% w, '%s'])\n"
             "os.close(w); os.read(r, 1)\n"
             "print('parent leaves a child behind')\n",
             marker);
    char *out = run_code(t, code);
    CONTAINS(out, "parent leaves a child behind");
    free(out);
    /* the call has returned: the sandbox's processes are gone (it waited for the namespace's end) */
    if (leftovers(marker, which, sizeof which) != 0)
        fail_msg("processes left behind: %s", which);
    /* and after the wall-time kill too */
    l.wall_s = 1;
    struct tool *t2 = ci_tool(&l);
    snprintf(code, sizeof code,
             "import os, time\n"
             "for i in range(4):\n"
             "    if os.fork() == 0:\n"
             /* sleep-ok: sandboxed processes that must outlive the call, on purpose */
             "        os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(1000)', '%s'])\n"
             /* sleep-ok: sandboxed processes that must outlive the call, on purpose */
             "time.sleep(1000)\n",
             marker);
    out = run_code(t2, code);
    CONTAINS(out, "wall-time limit");
    free(out);
    if (leftovers(marker, which, sizeof which) != 0)
        fail_msg("processes left behind after the wall-time kill: %s", which);
    tool_free(t2);
    tool_free(t);
}

static void test_refuses_without_sandbox(void **state)
{
    (void)state;
    struct sandbox_limits l = test_limits();
    snprintf(l.bwrap, sizeof l.bwrap, "/nonexistent/bwrap");
    char why[256];
    assert_int_equal(sandbox_available(&l, why, sizeof why), 0);
    CONTAINS(why, "/nonexistent/bwrap");
    struct tool *t = ci_tool(&l);
    char *out = run_code(t, "print('RAN')");
    LACKS(out, "RAN");
    CONTAINS(out, "Error: code execution is unavailable: no sandbox can be made on this machine");
    free(out);
    tool_free(t);
}

static void test_code_interpreter_answers(void **state)
{
    (void)state;
    if (skip_without_sandbox())
        skip();
    struct sandbox_limits l = test_limits();
    struct tool *t = ci_tool(&l);
    char *out = run_code(t, "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)");
    assert_string_equal(out, "out\nerr\n[exit status 3]");
    free(out);
    /* code longer than an argument may be goes in as a file */
    size_t n = 200000;
    char *big = malloc(n + 64);
    memset(big, '#', n);
    strcpy(big + n, "\nprint('big ok')");
    out = run_code(t, big);
    assert_string_equal(out, "big ok\n");
    free(out);
    free(big);
    tool_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_calculator),
        cmocka_unit_test(test_refuses_without_sandbox),
        cmocka_unit_test(test_code_interpreter_answers),
        cmocka_unit_test(test_hidden_files),
        cmocka_unit_test(test_writes),
        cmocka_unit_test(test_network),
        cmocka_unit_test(test_syscalls),
        cmocka_unit_test(test_fork_bomb),
        cmocka_unit_test(test_cpu_and_wall),
        cmocka_unit_test(test_memory_and_output),
        cmocka_unit_test(test_background_process_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
