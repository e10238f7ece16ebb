/* Python custom scorers (custom_reward_function.path=FILE.py): verl's compute_score(data_source, solution_str,
 * ground_truth, extra_info) run by a pool of long-lived CPython processes per scoring rank.
 *
 * The process runs the driver below with the file and the function's name. Requests and results travel on two
 * pipes of their own (the child's fds 3 and 4), so what the user's code prints reaches our stderr (the log) and
 * cannot break the protocol. Each is one JSON object a line:
 *
 *   driver -> us, once:      {"ready": true}  or  {"ready": false, "error": "why"}
 *   us -> driver, per batch: {"items": [{"data_source": .., "solution_str": .., "ground_truth": .., "extra_info":
 * {..}}]} driver -> us, per item:  {"i": k, "score": x}  or  {"i": k, "error": "the exception's last line"}; a
 * function that returns a dict adds its other numeric entries (verl's reward_extra_info: GDPO's reward components),
 * {"i": k, "score": x, "extra": {"name": v or null when not finite, ..}}
 *
 * There are reward_model.num_workers such processes (the pool). A batch is cut into runs of consecutive items,
 * each run goes to a free process in one request, and the processes score their runs concurrently; each result is
 * awaited for at most the per-sample timeout. A result past it, or the process ending, fails that sample alone:
 * the process is killed (on a timeout), started again, and given the rest of its run. */
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

#include "common/fs.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/linebuf.h"
#include "common/procgroup.h"
#include "common/log.h"
#include "common/config_key_names.h"

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
    "            extra = None\n"
    "            if isinstance(r, dict):\n"
    "                if 'score' not in r:\n"
    "                    raise TypeError('%s returned a dict without \"score\"' % name)\n"
    "                extra = {}\n"
    "                for k, v in r.items():\n"
    "                    t = type(v)\n"
    "                    if k != 'score' and isinstance(k, str) and (isinstance(v, (bool, int, float)) or (\n"
    "                            t.__module__ == 'numpy' and getattr(v, 'ndim', 1) == 0 and v.dtype.kind in 'biuf')):\n"
    "                        v = float(v)\n"
    "                        extra[k] = v if math.isfinite(v) else None\n"
    "                r = r['score']\n"
    "            if not isinstance(r, (int, float)):\n"
    "                t = type(r)\n"
    "                if not (t.__module__ == 'numpy' and hasattr(r, 'dtype') and r.dtype.kind in 'iuf'):\n"
    "                    raise TypeError('%s returned %s, not a number or a dict with \"score\"' % (name, "
    "t.__name__))\n"
    "            r = float(r)\n"
    "            if not math.isfinite(r):\n"
    "                raise ValueError('%s returned %r' % (name, r))\n"
    "            send({'i': i, 'score': r} if extra is None else {'i': i, 'score': r, 'extra': extra})\n"
    "        except Exception as e:\n"
    "            send({'i': i, 'error': last_line(e)})\n";

/* One process of the pool and the part of a batch it is working on. */
struct pyproc {
    pid_t pid;
    int to_child, from_child; /* -1 when no process runs */
    struct linebuf lb;        /* what the child wrote, taken as lines */
    bool starting;            /* spawned, its ready line not read yet */
    int base, next, hi;       /* its items [base, hi) were sent; the result for `next` is awaited */
    double deadline;          /* for the ready line or the result awaited */
};

struct pyscorer {
    char *python, *path, *name;
    int nproc;
    struct pyproc *w;
};

static void stop(struct pyproc *w, bool kill_it)
{
    if (w->to_child >= 0)
        close(w->to_child);
    if (w->from_child >= 0)
        close(w->from_child);
    w->to_child = w->from_child = -1;
    if (w->pid > 0) /* the driver leads a group of its own (spawn): what the user's code forked goes with it */
        procgroup_end(w->pid, kill_it ? 0 : -1);
    w->pid = 0;
    linebuf_reset(&w->lb);
    w->starting = false;
}

static int take_line(struct pyproc *w, char **line) { return linebuf_take(&w->lb, line); }

static int fill(struct pyproc *w) { return linebuf_fill(&w->lb, w->from_child); }

/* The next line from the child within `deadline` (clock_now_s): 1 with *line, 0 on the deadline, -1 when the
 * process is gone. */
static int read_line(struct pyproc *w, double deadline, char **line)
{
    return linebuf_read(&w->lb, w->from_child, deadline, line);
}

/* How the process ended, for a reason text; reaps it. */
static void ended(struct pyproc *w, char *why, size_t len)
{
    int st = 0;
    const pid_t pid = w->pid;
    w->pid = 0;
    stop(w, false);
    if (pid > 0)
        st = procgroup_end(pid, -1);
    if (pid > 0 && WIFSIGNALED(st)) {
        const char *abbrev = sigabbrev_np(WTERMSIG(st));
        snprintf(why, len, "the Python scorer process was killed by SIG%s", abbrev ? abbrev : "?");
    } else {
        snprintf(why, len, "the Python scorer process exited (status %d)", pid > 0 ? WEXITSTATUS(st) : -1);
    }
}

/* Fork and exec the driver; its ready line is read later (check_ready). */
static int spawn(const struct pyscorer *p, struct pyproc *w, char *err, size_t errlen)
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
        setpgid(0, 0); /* a group of its own, ended whole (procgroup_end) */
        signal(SIGPIPE, SIG_DFL);
        /* fds 3 and 4 are the protocol's; dup2 clears close-on-exec */
        const int rq = fcntl(req[0], F_DUPFD_CLOEXEC, 10), wr = fcntl(res[1], F_DUPFD_CLOEXEC, 10);
        if (rq < 0 || wr < 0 || dup2(rq, 3) < 0 || dup2(wr, 4) < 0)
            _exit(112);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
#ifdef SYS_close_range
        /* none of the worker's sockets and files (MPI's, the data plane's, the other scorers' pipes) stay open */
        syscall(SYS_close_range, 5u, ~0u, 0u);
#endif
        execlp(p->python, p->python, "-u", "-c", DRIVER, p->path, p->name, (char *)NULL);
        fprintf(stderr, KEY_crf_python ": cannot run %s: %s\n", p->python, strerror(errno));
        _exit(127);
    }
    setpgid(pid, pid); /* also here: the group exists before anyone signals it (EACCES once it has exec'd) */
    close(req[0]);
    close(res[1]);
    w->pid = pid;
    w->to_child = req[1];
    w->from_child = res[0];
    linebuf_reset(&w->lb);
    w->starting = true;
    return 0;
}

/* The ready line: 0, or -1 with err naming the key and Python's reason (the process is stopped). */
static int check_ready(const struct pyscorer *p, struct pyproc *w, const char *line, char *err, size_t errlen)
{
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    const json_t *ready = o ? json_object_get(o, "ready") : NULL;
    if (!json_is_true(ready)) {
        const json_t *e = o ? json_object_get(o, "error") : NULL;
        const bool no_fn = json_is_string(e) && strncmp(json_string_value(e), "no function", 11) == 0;
        error_set(err, errlen, "%s: %s: %s", no_fn ? KEY_crf_name : KEY_crf_path, p->path,
                  json_is_string(e) ? json_string_value(e) : "the driver did not start");
        json_decref(o);
        stop(w, true);
        return -1;
    }
    json_decref(o);
    w->starting = false;
    return 0;
}

/* Start one process and wait for its ready line (at most timeout_s + 30 s for the import). */
static int start(const struct pyscorer *p, struct pyproc *w, double timeout_s, char *err, size_t errlen)
{
    if (spawn(p, w, err, errlen) != 0)
        return -1;
    char *line;
    const int rc = read_line(w, clock_now_s() + timeout_s + 30.0, &line);
    if (rc <= 0) {
        char why[160];
        if (rc == 0) {
            stop(w, true);
            snprintf(why, sizeof why, "it did not start within %.3g s", timeout_s + 30.0);
        } else {
            ended(w, why, sizeof why);
        }
        return error_set(err, errlen, KEY_crf_path ": %s with %s: %s", p->path, p->python, why);
    }
    return check_ready(p, w, line, err, errlen);
}

struct pyscorer *pyscorer_start(const char *python, const char *path, const char *name, int nproc, double timeout_s,
                                char *err, size_t errlen)
{
    struct pyscorer *p = xcalloc(1, sizeof *p);
    p->python = xstrdup(python && *python ? python : "python3");
    p->path = xstrdup(path);
    p->name = xstrdup(name && *name ? name : "compute_score");
    p->nproc = nproc < 1 ? 1 : nproc > PYSCORER_MAX_PROCS ? PYSCORER_MAX_PROCS : nproc;
    p->w = xcalloc((size_t)p->nproc, sizeof *p->w);
    for (int k = 0; k < p->nproc; k++)
        p->w[k].to_child = p->w[k].from_child = -1;
    /* the first one alone, so that an error in the file is reported once, then the rest together */
    if (start(p, &p->w[0], timeout_s, err, errlen) != 0) {
        pyscorer_free(p);
        return NULL;
    }
    for (int k = 1; k < p->nproc; k++)
        if (spawn(p, &p->w[k], err, errlen) != 0) {
            pyscorer_free(p);
            return NULL;
        }
    const double deadline = clock_now_s() + timeout_s + 30.0;
    for (int k = 1; k < p->nproc; k++) {
        char *line;
        const int rc = read_line(&p->w[k], deadline, &line);
        if (rc <= 0) {
            char why[160];
            if (rc == 0)
                snprintf(why, sizeof why, "it did not start within %.3g s", timeout_s + 30.0);
            else
                ended(&p->w[k], why, sizeof why);
            error_set(err, errlen, KEY_crf_path ": %s with %s: %s", p->path, p->python, why);
            pyscorer_free(p);
            return NULL;
        }
        if (check_ready(p, &p->w[k], line, err, errlen) != 0) {
            pyscorer_free(p);
            return NULL;
        }
    }
    return p;
}

int pyscorer_num_procs(const struct pyscorer *p) { return p ? p->nproc : 0; }

void pyscorer_free(struct pyscorer *p)
{
    if (!p)
        return;
    for (int k = 0; k < p->nproc; k++) {
        stop(&p->w[k], true);
        linebuf_free(&p->w[k].lb);
    }
    free(p->w);
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
static int send_batch(struct pyproc *p, const struct reward_item *items, int from, int n)
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
    const int rc = fs_write_full(p->to_child, text, len + 1);
    sigaction(SIGPIPE, &old, NULL);
    free(text);
    return rc;
}

static void fail(int i, const char *why, double *scores, bool *failed, char (*reasons)[PYSCORER_REASON_MAX])
{
    scores[i] = 0;
    failed[i] = true;
    snprintf(reasons[i], PYSCORER_REASON_MAX, "%.*s", PYSCORER_REASON_MAX - 1, why);
}

/* Send w's items [w->next, w->hi) to its running process. */
static void send_rest(struct pyproc *w, const struct reward_item *items, double timeout_s, double *scores, bool *failed,
                      char (*reasons)[PYSCORER_REASON_MAX])
{
    w->base = w->next;
    if (send_batch(w, items, w->base, w->hi) != 0) {
        char why[PYSCORER_REASON_MAX];
        ended(w, why, sizeof why);
        fail(w->next++, why, scores, failed, reasons);
        return;
    }
    w->deadline = clock_now_s() + timeout_s;
}

/* One line from w's process: the ready line of a fresh process, or the result for w->next. */
static void on_line(const struct pyscorer *p, struct pyproc *w, const char *line, const struct reward_item *items,
                    double timeout_s, double *scores, bool *failed, char (*reasons)[PYSCORER_REASON_MAX],
                    const struct pyscorer_parts *pp)
{
    if (w->starting) {
        char err[PYSCORER_REASON_MAX];
        if (check_ready(p, w, line, err, sizeof err) != 0) {
            for (; w->next < w->hi; w->next++) /* no use starting it again for these */
                fail(w->next, err, scores, failed, reasons);
            return;
        }
        send_rest(w, items, timeout_s, scores, failed, reasons);
        return;
    }
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    const json_t *i = o ? json_object_get(o, "i") : NULL;
    const json_t *s = o ? json_object_get(o, "score") : NULL;
    const json_t *e = o ? json_object_get(o, "error") : NULL;
    if (!json_is_integer(i) || json_integer_value(i) != w->next - w->base ||
        (!json_is_number(s) && !json_is_string(e))) {
        json_decref(o);
        stop(w, true);
        fail(w->next++, "lost the Python scorer's results (protocol error)", scores, failed, reasons);
        return;
    }
    if (json_is_number(s)) {
        scores[w->next] = json_number_value(s);
        failed[w->next] = false;
        reasons[w->next][0] = '\0';
        const json_t *ex = json_object_get(o, "extra");
        for (int k = 0; pp && k < pp->n; k++) { /* the components asked for, each a finite number */
            const json_t *v = json_is_object(ex) ? json_object_get(ex, pp->keys[k]) : NULL;
            if (json_is_number(v)) {
                pp->v[(size_t)w->next * pp->n + k] = json_number_value(v);
                continue;
            }
            char why[PYSCORER_REASON_MAX];
            snprintf(why, sizeof why, "%s returned %s '%s'%s", p->name,
                     !json_is_object(ex) ? "no dict, so no"
                     : v                 ? "a non-finite"
                                         : "a dict without",
                     pp->keys[k], pp->what ? pp->what : "");
            fail(w->next, why, scores, failed, reasons);
            break;
        }
    } else {
        char why[PYSCORER_REASON_MAX];
        snprintf(why, sizeof why, "%s raised %s", p->name, json_string_value(e));
        fail(w->next, why, scores, failed, reasons);
    }
    json_decref(o);
    w->next++;
    w->deadline = clock_now_s() + timeout_s;
}

/* The batch is cut into runs of consecutive items handed to whichever process is free; each process scores its run
 * in order and each item's result lands at its own index, so the scores do not depend on the pool's size. A
 * process that hangs (past timeout_s on one item) is killed; one that dies is reaped; either way that item alone
 * fails and a fresh process takes the rest of the run. */
void pyscorer_score(struct pyscorer *p, const struct reward_item *items, int n, double timeout_s, double *scores,
                    bool *failed, char (*reasons)[PYSCORER_REASON_MAX], const struct pyscorer_parts *pp)
{
    const int run = (n + 4 * p->nproc - 1) / (4 * p->nproc); /* about four runs per process: load balance */
    int queued = 0;
    for (int k = 0; k < p->nproc; k++)
        p->w[k].next = p->w[k].hi = 0;
    struct pollfd *pfd = xcalloc((size_t)p->nproc, sizeof *pfd);
    int *who = xcalloc((size_t)p->nproc, sizeof *who);
    for (;;) {
        /* hand out work; start a process again where one was lost */
        for (int k = 0; k < p->nproc; k++) {
            struct pyproc *w = &p->w[k];
            if (w->next >= w->hi && queued < n) {
                w->next = queued;
                w->hi = queued + run < n ? queued + run : n;
                queued = w->hi;
                if (w->pid > 0)
                    send_rest(w, items, timeout_s, scores, failed, reasons);
            }
            if (w->next < w->hi && w->pid <= 0) {
                char err[PYSCORER_REASON_MAX];
                if (spawn(p, w, err, sizeof err) != 0)
                    for (; w->next < w->hi; w->next++)
                        fail(w->next, err, scores, failed, reasons);
                else
                    w->deadline = clock_now_s() + timeout_s + 30.0;
            }
        }
        int np = 0;
        double first = INFINITY;
        for (int k = 0; k < p->nproc; k++)
            if (p->w[k].next < p->w[k].hi && p->w[k].pid > 0) {
                pfd[np] = (struct pollfd){.fd = p->w[k].from_child, .events = POLLIN};
                who[np++] = k;
                first = fmin(first, p->w[k].deadline);
            }
        if (np == 0)
            break; /* nothing queued, nothing awaited */
        const double left = first - clock_now_s();
        const int ms = left <= 0 ? 0 : (int)ceil(left * 1000.0);
        const int pr = poll(pfd, (nfds_t)np, ms);
        if (pr < 0 && errno != EINTR)
            break; /* cannot happen with valid fds; the items not scored fail below */
        for (int j = 0; j < np; j++) {
            struct pyproc *w = &p->w[who[j]];
            const bool gone = pr > 0 && pfd[j].revents && fill(w) != 0;
            char *line;
            while (w->pid > 0 && w->next < w->hi && take_line(w, &line))
                on_line(p, w, line, items, timeout_s, scores, failed, reasons, pp);
            if (w->pid <= 0 || w->next >= w->hi)
                continue;
            char why[PYSCORER_REASON_MAX];
            if (gone) {
                const bool starting = w->starting;
                ended(w, why, sizeof why);
                if (starting) {                           /* it cannot start: no use trying again for this run */
                    char err[PYSCORER_REASON_MAX + 4096]; /* cut to PYSCORER_REASON_MAX by fail */
                    snprintf(err, sizeof err, KEY_crf_path ": %s with %s: %s", p->path, p->python, why);
                    for (; w->next < w->hi; w->next++)
                        fail(w->next, err, scores, failed, reasons);
                } else {
                    fail(w->next++, why, scores, failed, reasons);
                }
            } else if (clock_now_s() >= w->deadline) {
                const bool starting = w->starting;
                stop(w, true);
                if (starting) {
                    snprintf(why, sizeof why, "the Python scorer did not start within %.3g s", timeout_s + 30.0);
                    for (; w->next < w->hi; w->next++)
                        fail(w->next, why, scores, failed, reasons);
                } else {
                    snprintf(why, sizeof why, "the Python scorer %s timed out after %.3g s", p->name, timeout_s);
                    fail(w->next++, why, scores, failed, reasons);
                }
            }
        }
    }
    /* only after a failed poll: whatever is left fails, and its processes start afresh next time */
    for (int k = 0; k < p->nproc; k++) {
        struct pyproc *w = &p->w[k];
        if (w->next < w->hi)
            stop(w, true);
        for (; w->next < w->hi; w->next++)
            fail(w->next, "the Python scorer's pipe could not be polled", scores, failed, reasons);
    }
    for (int i = queued; i < n; i++)
        fail(i, "the Python scorer's pipe could not be polled", scores, failed, reasons);
    free(pfd), free(who);
}

bool pyscorer_is_python(const char *path)
{
    const size_t n = strlen(path);
    if (n >= 3 && strcmp(path + n - 3, ".py") == 0)
        return true;
    /* no .py ending: a shared library starts with ELF's magic, anything else is taken for Python source */
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    if (!f)
        return false;
    unsigned char m[4] = {0};
    const size_t got = fread(m, 1, 4, f);
    fclose(f);
    return !(got == 4 && m[0] == 0x7f && m[1] == 'E' && m[2] == 'L' && m[3] == 'F');
}
