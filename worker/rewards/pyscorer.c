/* Python custom scorers (custom_reward_function.path=FILE.py): verl's compute_score(data_source, solution_str,
 * ground_truth, extra_info) run by a long-lived CPython process per scoring rank.
 *
 * The process runs the driver below with the file and the function's name. Requests and results travel on two
 * pipes of their own (the child's fds 3 and 4), so what the user's code prints reaches our stderr (the log) and
 * cannot break the protocol. Each is one JSON object a line:
 *
 *   driver -> us, once:      {"ready": true}  or  {"ready": false, "error": "why"}
 *   us -> driver, per batch: {"items": [{"data_source": .., "solution_str": .., "ground_truth": .., "extra_info":
 * {..}}]} driver -> us, per item:  {"i": k, "score": x}  or  {"i": k, "error": "the exception's last line"}
 *
 * Every response of a batch goes in one request; each result is awaited for at most the per-sample timeout. A
 * result past it, or the process ending, fails that sample alone: the process is killed (on a timeout), started
 * again, and given the rest of the batch. */
#include "pyscorer.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"

/* The driver. argv: the file, the function's name. */
static const char DRIVER[] =
    "import importlib.util, json, math, os, sys, traceback\n"
    "path, name = sys.argv[1], sys.argv[2]\n"
    "rq = os.fdopen(3, 'r', encoding='utf-8')\n"
    "wr = os.fdopen(4, 'w', encoding='utf-8')\n"
    "sys.stdout = sys.stderr\n"
    "def send(o):\n"
    "    wr.write(json.dumps(o) + '\\n')\n"
    "    wr.flush()\n"
    "def last_line(e):\n"
    "    return traceback.format_exception_only(type(e), e)[-1].strip()\n"
    "try:\n"
    "    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))\n"
    "    spec = importlib.util.spec_from_file_location('custom_reward_module', path)\n"
    "    if spec is None:\n"
    "        raise ImportError('not a Python file')\n"
    "    mod = importlib.util.module_from_spec(spec)\n"
    "    spec.loader.exec_module(mod)\n"
    "except BaseException as e:\n"
    "    send({'ready': False, 'error': 'cannot load: ' + last_line(e)})\n"
    "    sys.exit(0)\n"
    "fn = getattr(mod, name, None)\n"
    "if not callable(fn):\n"
    "    send({'ready': False, 'error': 'no function %r in the file' % name})\n"
    "    sys.exit(0)\n"
    "send({'ready': True})\n"
    "def gt_value(g):\n"
    "    if g[:1] in ('{', '['):\n"
    "        try:\n"
    "            return json.loads(g)\n"
    "        except ValueError:\n"
    "            pass\n"
    "    return g\n"
    "for line in rq:\n"
    "    for i, it in enumerate(json.loads(line)['items']):\n"
    "        try:\n"
    "            r = fn(it['data_source'], it['solution_str'], gt_value(it['ground_truth']), it['extra_info'])\n"
    "            if isinstance(r, dict):\n"
    "                if 'score' not in r:\n"
    "                    raise TypeError('%s returned a dict without \"score\"' % name)\n"
    "                r = r['score']\n"
    "            if not isinstance(r, (int, float)):\n"
    "                t = type(r)\n"
    "                if not (t.__module__ == 'numpy' and hasattr(r, 'dtype') and r.dtype.kind in 'iuf'):\n"
    "                    raise TypeError('%s returned %s, not a number or a dict with \"score\"' % (name, "
    "t.__name__))\n"
    "            r = float(r)\n"
    "            if not math.isfinite(r):\n"
    "                raise ValueError('%s returned %r' % (name, r))\n"
    "            send({'i': i, 'score': r})\n"
    "        except Exception as e:\n"
    "            send({'i': i, 'error': last_line(e)})\n";

struct pyscorer {
    char *python, *path, *name;
    pid_t pid;
    int to_child, from_child; /* -1 when no process runs */
    char *buf;                /* bytes read from the child not yet consumed as lines */
    char *line;               /* the line read_line handed out last */
    size_t len, cap;
};

static void stop(struct pyscorer *p, bool kill_it)
{
    if (p->to_child >= 0)
        close(p->to_child);
    if (p->from_child >= 0)
        close(p->from_child);
    p->to_child = p->from_child = -1;
    if (p->pid > 0) {
        if (kill_it)
            kill(p->pid, SIGKILL);
        int st;
        while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR)
            ;
    }
    p->pid = 0;
    p->len = 0;
}

/* The next line from the child within `deadline` (clock_now_s): 1 with *line (valid until the next call), 0 on
 * the deadline, -1 when the process is gone. */
static int read_line(struct pyscorer *p, double deadline, char **line)
{
    for (;;) {
        char *nl = p->len ? memchr(p->buf, '\n', p->len) : NULL;
        if (nl) {
            free(p->line);
            const size_t n = (size_t)(nl - p->buf);
            p->line = xmalloc(n + 1);
            memcpy(p->line, p->buf, n);
            p->line[n] = '\0';
            memmove(p->buf, nl + 1, p->len - n - 1);
            p->len -= n + 1;
            *line = p->line;
            return 1;
        }
        const double left = deadline - clock_now_s();
        if (left <= 0)
            return 0;
        struct pollfd pfd = {.fd = p->from_child, .events = POLLIN};
        const int ms = (int)ceil(left * 1000.0);
        const int pr = poll(&pfd, 1, ms < 1 ? 1 : ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return -1;
        if (pr == 0)
            continue;
        if (p->cap - p->len < 65536) {
            p->cap = p->cap * 2 + 65536;
            p->buf = xrealloc(p->buf, p->cap);
        }
        const ssize_t k = read(p->from_child, p->buf + p->len, p->cap - p->len);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0)
            return -1;
        p->len += (size_t)k;
    }
}

/* How the process ended, for a reason text; reaps it. */
static void ended(struct pyscorer *p, char *why, size_t len)
{
    int st = 0;
    const pid_t pid = p->pid;
    p->pid = 0;
    stop(p, false);
    if (pid > 0)
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
    if (pid > 0 && WIFSIGNALED(st)) {
        const char *abbrev = sigabbrev_np(WTERMSIG(st));
        snprintf(why, len, "the Python scorer process was killed by SIG%s", abbrev ? abbrev : "?");
    } else {
        snprintf(why, len, "the Python scorer process exited (status %d)", pid > 0 ? WEXITSTATUS(st) : -1);
    }
}

/* Start the process and wait for its ready line (at most timeout_s + 30 s for the import). */
static int start(struct pyscorer *p, double timeout_s, char *err, size_t errlen)
{
    int req[2], res[2];
    if (pipe2(req, O_CLOEXEC) < 0)
        return error_set(err, errlen, "cannot create a pipe: %s", strerror(errno));
    if (pipe2(res, O_CLOEXEC) < 0) {
        close(req[0]), close(req[1]);
        return error_set(err, errlen, "cannot create a pipe: %s", strerror(errno));
    }
    fflush(NULL);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
        close(req[0]), close(req[1]), close(res[0]), close(res[1]);
        return error_set(err, errlen, "cannot start %s: %s", p->python, strerror(errno));
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(111);
        signal(SIGPIPE, SIG_DFL);
        /* fds 3 and 4 are the protocol's; dup2 clears close-on-exec */
        const int rq = fcntl(req[0], F_DUPFD_CLOEXEC, 10), wr = fcntl(res[1], F_DUPFD_CLOEXEC, 10);
        if (rq < 0 || wr < 0 || dup2(rq, 3) < 0 || dup2(wr, 4) < 0)
            _exit(112);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
#ifdef SYS_close_range
        /* none of the worker's sockets and files (MPI's, the data plane's) stay open in the scorer */
        syscall(SYS_close_range, 5u, ~0u, 0u);
#endif
        execlp(p->python, p->python, "-u", "-c", DRIVER, p->path, p->name, (char *)NULL);
        fprintf(stderr, "custom_reward_function.python: cannot run %s: %s\n", p->python, strerror(errno));
        _exit(127);
    }
    close(req[0]);
    close(res[1]);
    p->pid = pid;
    p->to_child = req[1];
    p->from_child = res[0];
    p->len = 0;
    char *line;
    const int rc = read_line(p, clock_now_s() + timeout_s + 30.0, &line);
    if (rc <= 0) {
        char why[160];
        if (rc == 0) {
            stop(p, true);
            snprintf(why, sizeof why, "it did not start within %.3g s", timeout_s + 30.0);
        } else {
            ended(p, why, sizeof why);
        }
        return error_set(err, errlen, "custom_reward_function.path: %s with %s: %s", p->path, p->python, why);
    }
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    const json_t *ready = o ? json_object_get(o, "ready") : NULL;
    if (!json_is_true(ready)) {
        const json_t *e = o ? json_object_get(o, "error") : NULL;
        const bool no_fn = e && json_is_string(e) && strncmp(json_string_value(e), "no function", 11) == 0;
        error_set(err, errlen, "%s: %s: %s", no_fn ? "custom_reward_function.name" : "custom_reward_function.path",
                  p->path, e && json_is_string(e) ? json_string_value(e) : "the driver did not start");
        json_decref(o);
        stop(p, true);
        return -1;
    }
    json_decref(o);
    return 0;
}

struct pyscorer *pyscorer_start(const char *python, const char *path, const char *name, double timeout_s, char *err,
                                size_t errlen)
{
    struct pyscorer *p = xcalloc(1, sizeof *p);
    p->python = xstrdup(python && *python ? python : "python3");
    p->path = xstrdup(path);
    p->name = xstrdup(name && *name ? name : "compute_score");
    p->to_child = p->from_child = -1;
    if (start(p, timeout_s, err, errlen) != 0) {
        pyscorer_free(p);
        return NULL;
    }
    return p;
}

void pyscorer_free(struct pyscorer *p)
{
    if (!p)
        return;
    stop(p, true);
    free(p->buf);
    free(p->line);
    free(p->python), free(p->path), free(p->name);
    free(p);
}

/* s as valid UTF-8 (malloc'd): each byte of an ill-formed sequence becomes U+FFFD, as Python's
 * bytes.decode(errors="replace") and verl's tokenizer.decode give the text of tokens that split a character. */
static char *valid_utf8(const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    const size_t n = strlen((const char *)p);
    char *out = xmalloc(3 * n + 1), *o = out;
    for (size_t i = 0; i < n;) {
        const unsigned char c = p[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = (p[i + k] & 0xc0) == 0x80;
        if (ok && len > 1) { /* no overlong forms, surrogates or code points past U+10FFFF */
            uint32_t cp = c & (0x7f >> len);
            for (size_t k = 1; k < len; k++)
                cp = cp << 6 | (p[i + k] & 0x3f);
            static const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
            ok = cp >= min_cp[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
        }
        if (ok) {
            memcpy(o, p + i, len);
            o += len;
            i += len;
        } else {
            memcpy(o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    *o = '\0';
    return out;
}

/* Write the request for items[from..n) (one line). 0, or -1 when the process is gone. */
static int send_batch(struct pyscorer *p, const struct reward_item *items, int from, int n)
{
    json_t *list = json_array();
    for (int i = from; i < n; i++) {
        json_error_t je;
        json_t *extra = items[i].extra_info_json ? json_loads(items[i].extra_info_json, JSON_DECODE_ANY, &je) : NULL;
        if (!extra)
            extra = json_object();
        char *ds = valid_utf8(items[i].data_source), *sol = valid_utf8(items[i].solution_str);
        char *gt = valid_utf8(items[i].ground_truth);
        json_t *item = json_pack("{s:s, s:s, s:s, s:o}", "data_source", ds, "solution_str", sol, "ground_truth", gt,
                                 "extra_info", extra);
        free(ds), free(sol), free(gt);
        if (!item) /* cannot happen with valid UTF-8; the request must still hold one entry per item */
            item = json_pack("{s:s, s:s, s:s, s:{}}", "data_source", "", "solution_str", "", "ground_truth", "",
                             "extra_info");
        json_array_append_new(list, item);
    }
    json_t *req = json_pack("{s:o}", "items", list);
    char *text = json_dumps(req, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(req);
    if (!text)
        return -1;
    const size_t len = strlen(text);
    text = xrealloc(text, len + 2);
    text[len] = '\n';
    text[len + 1] = '\0';
    /* a write to a process that is gone must not end ours with SIGPIPE */
    struct sigaction ign = {.sa_handler = SIG_IGN}, old;
    sigaction(SIGPIPE, &ign, &old);
    int rc = 0;
    for (size_t off = 0; off < len + 1;) {
        const ssize_t w = write(p->to_child, text + off, len + 1 - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = -1;
            break;
        }
        off += (size_t)w;
    }
    sigaction(SIGPIPE, &old, NULL);
    free(text);
    return rc;
}

void pyscorer_score(struct pyscorer *p, const struct reward_item *items, int n, double timeout_s, double *scores,
                    bool *failed, char (*reasons)[PYSCORER_REASON_MAX])
{
    int next = 0;
    while (next < n) {
        char why[PYSCORER_REASON_MAX];
        if (p->pid <= 0) { /* started again after a sample that killed or hung it */
            char err[PYSCORER_REASON_MAX];
            if (start(p, timeout_s, err, sizeof err) != 0) {
                for (; next < n; next++) {
                    failed[next] = true;
                    scores[next] = 0;
                    snprintf(reasons[next], PYSCORER_REASON_MAX, "%s", err);
                }
                return;
            }
        }
        const int base = next;
        if (send_batch(p, items, base, n) != 0) {
            ended(p, why, sizeof why);
            failed[next] = true;
            scores[next] = 0;
            snprintf(reasons[next], PYSCORER_REASON_MAX, "%s", why);
            next++;
            continue;
        }
        while (next < n) {
            char *line;
            const int rc = read_line(p, clock_now_s() + timeout_s, &line);
            if (rc <= 0) {
                if (rc == 0) {
                    stop(p, true);
                    snprintf(why, sizeof why, "the Python scorer %s timed out after %.3g s", p->name, timeout_s);
                } else {
                    ended(p, why, sizeof why);
                }
                failed[next] = true;
                scores[next] = 0;
                snprintf(reasons[next], PYSCORER_REASON_MAX, "%s", why);
                next++;
                break; /* the rest go to a fresh process */
            }
            json_error_t je;
            json_t *o = json_loads(line, 0, &je);
            const json_t *i = o ? json_object_get(o, "i") : NULL;
            const json_t *s = o ? json_object_get(o, "score") : NULL;
            const json_t *e = o ? json_object_get(o, "error") : NULL;
            if (!json_is_integer(i) || json_integer_value(i) != next - base ||
                (!json_is_number(s) && !json_is_string(e))) {
                json_decref(o);
                stop(p, true);
                failed[next] = true;
                scores[next] = 0;
                snprintf(reasons[next], PYSCORER_REASON_MAX, "lost the Python scorer's results (protocol error)");
                next++;
                break;
            }
            if (json_is_number(s)) {
                scores[next] = json_number_value(s);
                failed[next] = false;
                reasons[next][0] = '\0';
            } else {
                scores[next] = 0;
                failed[next] = true;
                snprintf(reasons[next], PYSCORER_REASON_MAX, "%s raised %s", p->name, json_string_value(e));
            }
            json_decref(o);
            next++;
        }
    }
}

bool pyscorer_is_python(const char *path)
{
    const size_t n = strlen(path);
    if (n >= 3 && strcmp(path + n - 3, ".py") == 0)
        return true;
    /* no .py ending: a shared library starts with ELF's magic, anything else is taken for Python source */
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    unsigned char m[4] = {0};
    const size_t got = fread(m, 1, 4, f);
    fclose(f);
    return !(got == 4 && m[0] == 0x7f && m[1] == 'E' && m[2] == 'L' && m[3] == 'F');
}
