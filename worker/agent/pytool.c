/* Python tools: a verl BaseTool-shaped class named in the tool config (class_name: pkg.module.Class), or the
 * @function_tool functions of a file (verl's multi_turn.function_tool_path), run by a pool of Python helper
 * processes (the runner, worker/agent/pytool_runner.py, embedded at build time; its head describes the protocol).
 *
 * Owns: the pool (helpers started as needed, one call at a time each), the per-call timeout (past it the
 * helper's process group is killed and a fresh helper is started for the next call), a helper that dies
 * (replaced the same way), and per-trajectory instances: an instance lives in one helper (its state is that
 * process's), so its calls wait for that helper; a call outside any instance, or a function tool's call, takes
 * whichever helper is free. When the helper holding an instance was replaced (a timeout, a crash), the instance
 * is created again there with its create_kwargs before its next call, and a warning says its state was lost.
 *
 * Threads: every entry point may be called from several threads at once. The pool's lock guards the helpers'
 * busy flags and the instance table; the I/O of a call happens outside it, by the thread that holds the helper.
 * Helpers are started with posix_spawn (no fork of a large multi-threaded process) and do not use
 * PR_SET_PDEATHSIG (it fires when the starting *thread* ends); a helper notices the C process is gone by the end
 * of file of a pipe only we hold the write end of, and ends its process group. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fs.h"
#include "common/clock.h"
#include "common/linebuf.h"
#include "common/log.h"
#include "common/procgroup.h"
#include "pytool_runner.h"
#include "worker/agent/tool.h"

extern char **environ;

#define START_SLACK_S 60.0 /* beyond the call timeout, for a helper to start and import the tool's module */

struct pyhelper {
    pid_t pid;         /* 0: none runs (not started yet, or lost) */
    int fd;            /* our end of its socket; -1 when none runs */
    struct linebuf lb; /* what it wrote, taken as lines */
    int busy;          /* a call holds it */
    unsigned epoch;    /* which start of this slot runs (0: never started) */
    int bound;         /* instances living in it */
};

struct pyinst {
    char *id;
    char *kwargs;   /* create_kwargs as JSON text, replayed when the helper was replaced */
    int helper;     /* the slot it lives in */
    unsigned epoch; /* the slot's start it was created in (0: not created yet) */
    struct pyinst *next;
};

struct pypool {
    pthread_mutex_t lock;
    pthread_cond_t freed;
    int refs;
    int functions;  /* a function file (stateless tools) rather than a class */
    char *spec;     /* the first line every helper is sent */
    char what[512]; /* "class pkg.mod.Cls" or "function tools of FILE", for messages */
    struct pytool_options o;
    int life_w; /* the write end of the helpers' life pipe (only we hold it) */
    int life_r; /* its read end, each helper's fd 4 */
    int n;
    struct pyhelper *h;
    struct pyinst *inst;
};

struct pytool {
    struct pypool *pool;
};

void pytool_options_default(struct pytool_options *o)
{
    memset(o, 0, sizeof *o);
    snprintf(o->python, sizeof o->python, "python3");
    o->timeout_s = PYTOOL_DEFAULT_TIMEOUT_S;
    o->num_procs = PYTOOL_DEFAULT_PROCS;
}

/* ---- one helper ---- */

static void helper_stop(struct pyhelper *h, double grace_s)
{
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
    linebuf_reset(&h->lb);
    if (h->pid > 0)
        procgroup_end(h->pid, grace_s);
    h->pid = 0;
}

/* How it ended (reaps it): "killed by SIGKILL" / "exit status 1". */
static void helper_ended(struct pyhelper *h, char *why, size_t len)
{
    const pid_t pid = h->pid;
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
    linebuf_reset(&h->lb);
    h->pid = 0;
    const int st = pid > 0 ? procgroup_end(pid, 2.0) : 0; /* it closed its end: it is exiting */
    if (WIFSIGNALED(st)) {
        const char *abbrev = sigabbrev_np(WTERMSIG(st));
        snprintf(why, len, "killed by SIG%s", abbrev ? abbrev : "?");
    } else {
        snprintf(why, len, "exit status %d", WEXITSTATUS(st));
    }
}

/* fd duplicated above 9 (so that the child's dup2 to 3 and 4 cannot clobber a source), close-on-exec */
static int high_dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 10); }

static int helper_spawn(struct pypool *p, struct pyhelper *h, char *err, size_t errlen)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return error_set(err, errlen, "cannot create a socket: %s", strerror(errno));
    const int s = high_dup(sv[1]), l = high_dup(p->life_r);
    close(sv[1]);
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&at, 0); /* a group of its own, ended whole (procgroup_end) */
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &dfl);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, 2, 1); /* what the tool prints goes to our stderr (the log) */
    posix_spawn_file_actions_adddup2(&fa, s, 3);
    posix_spawn_file_actions_adddup2(&fa, l, 4);
    posix_spawn_file_actions_addclosefrom_np(&fa, 5); /* none of our other files stay open in it */
    char *argv[] = {p->o.python, (char *)"-u", (char *)"-c", (char *)PYTOOL_RUNNER, NULL};
    pid_t pid = 0;
    const int rc = (s < 0 || l < 0) ? errno : posix_spawnp(&pid, p->o.python, &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (s >= 0)
        close(s);
    if (l >= 0)
        close(l);
    if (rc != 0) {
        close(sv[0]);
        return error_set(err, errlen, "cannot run %s: %s", p->o.python, strerror(rc));
    }
    h->pid = pid;
    h->fd = sv[0];
    linebuf_reset(&h->lb);
    return 0;
}

/* Send one line (a JSON text without its newline). 0, or -1 when the helper is gone. */
static int send_line(struct pyhelper *h, const char *text)
{
    const size_t len = strlen(text);
    char *buf = xmalloc(len + 2);
    memcpy(buf, text, len);
    buf[len] = '\n';
    buf[len + 1] = '\0';
    const int rc = fs_write_full(h->fd, buf, len + 1);
    free(buf);
    return rc;
}

/* The next line as JSON by deadline: 1 with *out, 0 on the deadline, -1 when the helper is gone or wrote
 * something that is not a JSON object. */
static int read_json(struct pyhelper *h, double deadline, json_t **out)
{
    char *line;
    const int rc = linebuf_read(&h->lb, h->fd, deadline, &line);
    if (rc <= 0)
        return rc;
    json_error_t je;
    *out = json_loads(line, 0, &je);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return -1;
    }
    return 1;
}

/* Start slot h (it holds no process) and read its ready line: 0 (with *ready, the line, when asked), or -1 with
 * err: Python's reason (the import error) or how the process ended. */
static int helper_start(struct pypool *p, struct pyhelper *h, json_t **ready, char *err, size_t errlen)
{
    if (helper_spawn(p, h, err, errlen) != 0)
        return -1;
    const double limit = p->o.timeout_s + START_SLACK_S;
    json_t *o = NULL;
    int rc = send_line(h, p->spec) == 0 ? read_json(h, clock_now_s() + limit, &o) : -1;
    if (rc == 0) {
        helper_stop(h, 0);
        return error_set(err, errlen, "the Python helper (%s) did not start within %g s", p->o.python, limit);
    }
    if (rc < 0) {
        char why[128];
        helper_ended(h, why, sizeof why);
        return error_set(err, errlen, "the Python helper (%s) ended before it was ready (%s; its reason is in the log)",
                         p->o.python, why);
    }
    if (!json_is_true(json_object_get(o, "ready"))) {
        const char *e = json_string_value(json_object_get(o, "error"));
        error_set(err, errlen, "%s", e ? e : "the Python helper did not start");
        json_decref(o);
        helper_stop(h, 2.0);
        return -1;
    }
    h->epoch++;
    if (ready)
        *ready = o;
    else
        json_decref(o);
    return 0;
}

/* ---- the pool ---- */

/* Take slot `want` (>= 0), or any slot (-1: a free one that runs, else a free one that does not), waiting while
 * it is (they all are) busy. */
static int acquire(struct pypool *p, int want)
{
    pthread_mutex_lock(&p->lock);
    int k = -1;
    for (;;) {
        if (want >= 0) {
            if (!p->h[want].busy)
                k = want;
        } else {
            for (int i = 0; i < p->n && k < 0; i++)
                if (!p->h[i].busy && p->h[i].pid > 0)
                    k = i;
            for (int i = 0; i < p->n && k < 0; i++)
                if (!p->h[i].busy)
                    k = i;
        }
        if (k >= 0)
            break;
        pthread_cond_wait(&p->freed, &p->lock);
    }
    p->h[k].busy = 1;
    pthread_mutex_unlock(&p->lock);
    return k;
}

static void give_back(struct pypool *p, int k)
{
    pthread_mutex_lock(&p->lock);
    p->h[k].busy = 0;
    pthread_cond_broadcast(&p->freed);
    pthread_mutex_unlock(&p->lock);
}

enum { RT_OK = 0, RT_ERROR = -1, RT_TIMEOUT = -2, RT_LOST = -3 };

/* One request on held slot k (started first when it runs nothing). RT_OK with *resp (the helper's answer, ok or
 * not); RT_TIMEOUT (the helper was killed); RT_LOST / RT_ERROR with why (it died, or cannot be started). */
static int roundtrip(struct pypool *p, int k, json_t *req, json_t **resp, char *why, size_t whylen)
{
    struct pyhelper *h = &p->h[k];
    *resp = NULL;
    if (h->pid <= 0) {
        char e[900];
        if (helper_start(p, h, NULL, e, sizeof e) != 0) {
            snprintf(why, whylen, "the tool's Python process cannot be started: %.900s", e);
            return RT_ERROR;
        }
    }
    char *text = json_dumps(req, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!text) {
        snprintf(why, whylen, "the request cannot be written as JSON");
        return RT_ERROR;
    }
    int rc = send_line(h, text);
    free(text);
    if (rc == 0)
        rc = read_json(h, clock_now_s() + p->o.timeout_s, resp);
    else
        rc = -1;
    if (rc == 1)
        return RT_OK;
    if (rc == 0) {
        log_warn("agent", "%s: a call timed out after %g s: its Python process (pid %d) is killed and will be replaced",
                 p->what, p->o.timeout_s, (int)h->pid);
        helper_stop(h, 0);
        return RT_TIMEOUT;
    }
    char how[128];
    helper_ended(h, how, sizeof how);
    snprintf(why, whylen, "the tool's Python process ended during the call (%s)", how);
    log_warn("agent", "%s: %s; it will be replaced", p->what, why);
    return RT_LOST;
}

/* A tool's answer for a failed roundtrip or an error answer: malloc'd "Error: ..." */
static char *error_answer(const struct pypool *p, int rc, const json_t *resp, const char *why)
{
    char msg[1400];
    if (rc == RT_TIMEOUT)
        snprintf(msg, sizeof msg, "Error: the tool timed out after %g s", p->o.timeout_s);
    else if (rc != RT_OK)
        snprintf(msg, sizeof msg, "Error: %s", why);
    else
        snprintf(msg, sizeof msg, "Error: %s", json_string_value(json_object_get(resp, "error")) ?: "the tool failed");
    return xstrdup(msg);
}

static struct pyinst *find_inst(struct pypool *p, const char *id)
{
    for (struct pyinst *i = p->inst; i; i = i->next)
        if (strcmp(i->id, id) == 0)
            return i;
    return NULL;
}

static json_t *request(const char *op, const char *tool, const char *instance)
{
    return json_pack("{s:s, s:s, s:s?}", "op", op, "tool", tool, "instance", instance);
}

/* On held slot k: create instance id there when it was not created in this start of the slot (a first call, or
 * the helper was replaced since). RT_OK, or an error with *answer. */
static int ensure_created(struct pypool *p, const char *tool, int k, const char *id, char **answer)
{
    pthread_mutex_lock(&p->lock);
    struct pyinst *in = find_inst(p, id);
    const unsigned epoch = in ? in->epoch : 0;
    char *kwargs = in && in->kwargs ? xstrdup(in->kwargs) : NULL;
    pthread_mutex_unlock(&p->lock);
    if (!in || (p->h[k].pid > 0 && epoch == p->h[k].epoch)) {
        free(kwargs);
        return RT_OK;
    }
    if (epoch != 0)
        log_warn("agent",
                 "%s: instance %s: its Python process was replaced, so it is created again (its state is lost)",
                 p->what, id);
    json_t *req = request("create", tool, id);
    json_object_set_new(req, "kwargs", kwargs ? json_loads(kwargs, 0, NULL) : json_object());
    free(kwargs);
    json_t *resp;
    char why[1024];
    int rc = roundtrip(p, k, req, &resp, why, sizeof why);
    json_decref(req);
    if (rc == RT_OK && !json_is_true(json_object_get(resp, "ok")))
        rc = RT_ERROR, snprintf(why, sizeof why, "%s",
                                json_string_value(json_object_get(resp, "error")) ?: "the tool's create failed");
    if (rc != RT_OK) {
        *answer = error_answer(p, rc, NULL, why);
        json_decref(resp);
        return rc;
    }
    json_decref(resp);
    pthread_mutex_lock(&p->lock);
    if ((in = find_inst(p, id)))
        in->epoch = p->h[k].epoch;
    pthread_mutex_unlock(&p->lock);
    return RT_OK;
}

/* The slot instance id lives in; a new one is bound to the slot with the fewest instances (a free one first). */
static int bind_inst(struct pypool *p, const char *id, const json_t *kwargs, int *created)
{
    pthread_mutex_lock(&p->lock);
    struct pyinst *in = find_inst(p, id);
    *created = !in;
    if (!in) {
        int best = 0;
        for (int i = 1; i < p->n; i++) { /* the fewest instances, then a free one */
            const struct pyhelper *a = &p->h[i], *b = &p->h[best];
            if (a->bound != b->bound ? a->bound < b->bound : !a->busy && b->busy)
                best = i;
        }
        in = xcalloc(1, sizeof *in);
        in->id = xstrdup(id);
        in->kwargs = kwargs ? json_dumps(kwargs, JSON_COMPACT) : NULL;
        in->helper = best;
        in->next = p->inst;
        p->inst = in;
        p->h[best].bound++;
    }
    const int k = in->helper;
    pthread_mutex_unlock(&p->lock);
    return k;
}

static void unbind_inst(struct pypool *p, const char *id, int *helper, unsigned *epoch)
{
    pthread_mutex_lock(&p->lock);
    *helper = -1;
    for (struct pyinst **pp = &p->inst; *pp; pp = &(*pp)->next) {
        struct pyinst *in = *pp;
        if (strcmp(in->id, id) != 0)
            continue;
        *helper = in->helper;
        *epoch = in->epoch;
        p->h[in->helper].bound--;
        *pp = in->next;
        free(in->id), free(in->kwargs), free(in);
        break;
    }
    pthread_mutex_unlock(&p->lock);
}

static void pool_free(struct pypool *p)
{
    if (!p || --p->refs > 0)
        return;
    for (int k = 0; k < p->n; k++) {
        helper_stop(&p->h[k], 2.0); /* its socket closed, the runner's loop ends */
        linebuf_free(&p->h[k].lb);
    }
    while (p->inst) {
        struct pyinst *in = p->inst;
        p->inst = in->next;
        free(in->id), free(in->kwargs), free(in);
    }
    close(p->life_w);
    close(p->life_r);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->freed);
    free(p->h);
    free(p->spec);
    free(p);
}

/* A pool for spec, its first helper started (so that an error in the user's code is reported now): the pool
 * and *ready, or NULL with err. */
static struct pypool *pool_new(json_t *spec, const struct pytool_options *o, const char *what, json_t **ready,
                               char *err, size_t errlen)
{
    struct pypool *p = xcalloc(1, sizeof *p);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->freed, NULL);
    p->refs = 1;
    p->o = *o;
    if (!p->o.python[0])
        snprintf(p->o.python, sizeof p->o.python, "python3");
    if (!(p->o.timeout_s > 0))
        p->o.timeout_s = PYTOOL_DEFAULT_TIMEOUT_S;
    p->n = p->o.num_procs < 1 ? 1 : p->o.num_procs > PYTOOL_MAX_PROCS ? PYTOOL_MAX_PROCS : p->o.num_procs;
    snprintf(p->what, sizeof p->what, "%s", what);
    p->h = xcalloc((size_t)p->n, sizeof *p->h);
    for (int k = 0; k < p->n; k++)
        p->h[k].fd = -1;
    int life[2];
    if (pipe2(life, O_CLOEXEC) != 0) {
        error_set(err, errlen, "cannot create a pipe: %s", strerror(errno));
        p->life_r = p->life_w = -1;
        free(p->h), free(p);
        return NULL;
    }
    p->life_r = life[0];
    p->life_w = life[1];
    p->spec = json_dumps(spec, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!p->spec || helper_start(p, &p->h[0], ready, err, errlen) != 0) {
        if (!p->spec)
            error_set(err, errlen, "the tool's config cannot be written as JSON");
        pool_free(p);
        return NULL;
    }
    return p;
}

/* ---- the tool ops ---- */

static char *py_execute_in(struct tool *t, const char *instance_id, const json_t *args, double *step_reward,
                           int *is_error)
{
    struct pypool *p = ((struct pytool *)t->impl)->pool;
    *step_reward = 0;
    *is_error = 1;
    const int stateful = instance_id && !p->functions;
    int created = 0;
    const int k = stateful ? bind_inst(p, instance_id, NULL, &created) : -1;
    const int slot = acquire(p, k);
    char *answer = NULL;
    if (stateful && ensure_created(p, t->name, slot, instance_id, &answer) != RT_OK) {
        give_back(p, slot);
        return answer;
    }
    json_t *req = request(stateful ? "execute" : "call", t->name, stateful ? instance_id : NULL);
    json_object_set(req, "args", (json_t *)args);
    json_t *resp;
    char why[1024];
    const int rc = roundtrip(p, slot, req, &resp, why, sizeof why);
    json_decref(req);
    give_back(p, slot);
    if (rc == RT_OK && json_is_true(json_object_get(resp, "ok"))) {
        const json_t *text = json_object_get(resp, "text");
        answer = xstrdup(json_string_value(text) ?: "");
        *step_reward = json_number_value(json_object_get(resp, "reward"));
        *is_error = 0;
    } else {
        answer = error_answer(p, rc, resp, why);
    }
    json_decref(resp);
    return answer;
}

static char *py_execute(struct tool *t, const json_t *args)
{
    double reward;
    int is_error;
    return py_execute_in(t, NULL, args, &reward, &is_error);
}

static int py_create(struct tool *t, const char *instance_id, const json_t *create_kwargs, char *err, size_t errlen)
{
    struct pypool *p = ((struct pytool *)t->impl)->pool;
    if (!instance_id || p->functions)
        return 0; /* function tools have no instances */
    int created;
    const int k = bind_inst(p, instance_id, create_kwargs, &created);
    if (!created)
        return error_set(err, errlen, "%s: instance '%s' exists already", t->name, instance_id);
    const int slot = acquire(p, k);
    char *answer = NULL;
    const int rc = ensure_created(p, t->name, slot, instance_id, &answer);
    give_back(p, slot);
    if (rc != RT_OK) {
        int h;
        unsigned e;
        unbind_inst(p, instance_id, &h, &e);
        error_set(err, errlen, "%s: create: %s", t->name, answer + strlen("Error: "));
        free(answer);
        return -1;
    }
    return 0;
}

/* A request about an existing instance on its slot (calc_reward, release): the answer or NULL. */
static json_t *instance_request(struct tool *t, const char *op, const char *instance_id, int k)
{
    struct pypool *p = ((struct pytool *)t->impl)->pool;
    const int slot = acquire(p, k);
    char *answer = NULL;
    json_t *resp = NULL;
    if (ensure_created(p, t->name, slot, instance_id, &answer) == RT_OK) {
        json_t *req = request(op, t->name, instance_id);
        char why[1024];
        const int rc = roundtrip(p, slot, req, &resp, why, sizeof why);
        json_decref(req);
        if (rc != RT_OK) {
            answer = error_answer(p, rc, NULL, why);
            json_decref(resp);
            resp = NULL;
        }
    }
    give_back(p, slot);
    if (answer) {
        log_warn("agent", "%s: %s of instance %s: %s", t->name, op, instance_id, answer);
        free(answer);
    }
    return resp;
}

static double py_calc_reward(struct tool *t, const char *instance_id)
{
    struct pypool *p = ((struct pytool *)t->impl)->pool;
    if (!instance_id || p->functions)
        return 0;
    pthread_mutex_lock(&p->lock);
    const struct pyinst *in = find_inst(p, instance_id);
    const int k = in ? in->helper : -1;
    pthread_mutex_unlock(&p->lock);
    if (k < 0)
        return 0; /* never created: no state, no reward */
    json_t *resp = instance_request(t, "calc_reward", instance_id, k);
    double r = 0;
    if (resp && json_is_true(json_object_get(resp, "ok")))
        r = json_number_value(json_object_get(resp, "reward"));
    else if (resp)
        log_warn("agent", "%s: calc_reward of instance %s: %s (0 is used)", t->name, instance_id,
                 json_string_value(json_object_get(resp, "error")) ?: "failed");
    json_decref(resp);
    return r;
}

/* Instance id's end on the slot it lives in (a tool's release, an interaction's finalize_interaction), where the
 * process that holds it still runs; a failure is logged as "LABEL of instance ID". */
static void release_instance(struct pypool *p, const char *tool, const char *id, const char *label)
{
    int k;
    unsigned epoch = 0;
    unbind_inst(p, id, &k, &epoch);
    if (k < 0 || epoch == 0)
        return; /* never created */
    const int slot = acquire(p, k);
    if (p->h[slot].pid > 0 && p->h[slot].epoch == epoch) { /* else the process that held it is gone */
        json_t *req = request("release", tool, id), *resp;
        char why[1024];
        const int rc = roundtrip(p, slot, req, &resp, why, sizeof why);
        json_decref(req);
        if (rc != RT_OK || !json_is_true(json_object_get(resp, "ok")))
            log_warn("agent", "%s of instance %s: %s", label, id,
                     rc == RT_TIMEOUT ? "timed out"
                     : rc != RT_OK    ? why
                                      : json_string_value(json_object_get(resp, "error")) ?: "failed");
        json_decref(resp);
    }
    give_back(p, slot);
}

static void py_release(struct tool *t, const char *instance_id)
{
    struct pypool *p = ((struct pytool *)t->impl)->pool;
    if (!instance_id || p->functions)
        return;
    char label[256];
    snprintf(label, sizeof label, "%s: release", t->name);
    release_instance(p, t->name, instance_id, label);
}

static void py_destroy(struct tool *t)
{
    struct pytool *pt = t->impl;
    pool_free(pt->pool);
    free(pt);
}

static const struct tool_ops PY_OPS = {.execute = py_execute,
                                       .destroy = py_destroy,
                                       .create = py_create,
                                       .execute_in = py_execute_in,
                                       .calc_reward = py_calc_reward,
                                       .release = py_release};

static struct tool *wrap(struct pypool *p, json_t *schema, char *err, size_t errlen)
{
    struct pytool *pt = xcalloc(1, sizeof *pt);
    pt->pool = p;
    struct tool *t = tool_new(schema, &PY_OPS, pt, err, errlen);
    if (!t)
        free(pt);
    return t;
}

struct tool *pytool_class_new(const char *class_path, json_t *config, json_t *schema, const struct pytool_options *o,
                              char *err, size_t errlen)
{
    char where[256];
    if (tool_schema_check(schema, err, errlen, where, sizeof where) != 0)
        return NULL;
    json_t *spec = json_pack("{s:s, s:s, s:o, s:O, s:s}", "kind", "class", "class", class_path, "config",
                             config ? json_incref(config) : json_object(), "schema", schema, "dir", o->dir);
    char what[512];
    snprintf(what, sizeof what, "Python tool %s", class_path);
    char e[2048];
    struct pypool *p = spec ? pool_new(spec, o, what, NULL, e, sizeof e) : NULL;
    json_decref(spec);
    if (!p) {
        error_set(err, errlen, "cannot load class '%s': %s", class_path, spec ? e : "bad config");
        return NULL;
    }
    struct tool *t = wrap(p, schema, err, errlen);
    if (!t) {
        pool_free(p);
        return NULL;
    }
    log_debug("agent", "%s: Python class %s (%s; %d processes; %g s per call)", t->name, class_path, p->o.python, p->n,
              p->o.timeout_s);
    return t;
}

int pytool_load_function_file(const char *py_path, const struct pytool_options *o, struct tool ***tools, size_t *n,
                              char *err, size_t errlen)
{
    *tools = NULL;
    *n = 0;
    if (access(py_path, R_OK) != 0)
        return error_set(err, errlen, "%s: %s", py_path, strerror(errno));
    char *abs = realpath(py_path, NULL);
    struct pytool_options opt = *o;
    if (!opt.dir[0] && abs) { /* the file's directory: its sibling modules import */
        snprintf(opt.dir, sizeof opt.dir, "%s", abs);
        char *slash = strrchr(opt.dir, '/');
        if (slash)
            *slash = '\0';
    }
    json_t *spec = json_pack("{s:s, s:s, s:s}", "kind", "functions", "path", abs ? abs : py_path, "dir", opt.dir);
    free(abs);
    char what[512], e[2048];
    snprintf(what, sizeof what, "function tools of %s", py_path);
    json_t *ready = NULL;
    struct pypool *p = pool_new(spec, &opt, what, &ready, e, sizeof e);
    json_decref(spec);
    if (!p)
        return error_set(err, errlen, "%s: %s", py_path, e);
    p->functions = 1; /* the reference pool_new gave is ours until the end; each tool takes one more */
    const json_t *list = json_object_get(ready, "tools");
    size_t i;
    const json_t *item;
    int rc = 0;
    json_array_foreach(list, i, item)
    {
        char te[512];
        json_t *schema = json_object_get(item, "schema");
        struct tool *t = wrap(p, schema, te, sizeof te);
        if (!t) {
            rc = error_set(err, errlen, "%s: @function_tool '%s': %s", py_path,
                           json_string_value(json_object_get(item, "name")) ?: "?", te);
            break;
        }
        p->refs++;
        *tools = xrealloc(*tools, (*n + 1) * sizeof **tools);
        (*tools)[(*n)++] = t;
    }
    json_decref(ready);
    if (rc != 0) {
        for (size_t j = 0; j < *n; j++)
            tool_free((*tools)[j]);
        free(*tools);
        *tools = NULL;
        *n = 0;
    } else if (*n == 0) {
        log_warn("agent", "%s defines no @function_tool functions", py_path);
    } else {
        log_debug("agent", "%zu function tool(s) from %s (%s; %d processes; %g s per call)", *n, py_path, p->o.python,
                  p->n, p->o.timeout_s);
    }
    pool_free(p); /* ours: the pool lives on while a tool holds it */
    return rc;
}

/* ---- Python interactions (verl's BaseInteraction; worker/agent/interaction.c) ---- */

struct pyinteraction {
    struct pypool *pool;
    char name[128]; /* the interaction's name, for messages */
};

struct pyinteraction *pyinteraction_new(const char *name, const char *class_path, json_t *config,
                                        const struct pytool_options *o, char *err, size_t errlen)
{
    json_t *cfg = json_is_object(config) ? json_deep_copy(config) : json_object();
    if (!json_object_get(cfg, "name")) /* verl's registry gives the class its name in its config */
        json_object_set_new(cfg, "name", json_string(name));
    json_t *spec =
        json_pack("{s:s, s:s, s:o, s:s}", "kind", "interaction", "class", class_path, "config", cfg, "dir", o->dir);
    char what[512], e[2048];
    snprintf(what, sizeof what, "Python interaction %s (%s)", name, class_path);
    struct pypool *p = spec ? pool_new(spec, o, what, NULL, e, sizeof e) : NULL;
    json_decref(spec);
    if (!p) {
        error_set(err, errlen, "cannot load class '%s': %s", class_path, spec ? e : "bad config");
        return NULL;
    }
    struct pyinteraction *pi = xcalloc(1, sizeof *pi);
    pi->pool = p;
    snprintf(pi->name, sizeof pi->name, "%s", name);
    log_debug("agent", "interaction %s: Python class %s (%s; %d processes; %g s per call)", name, class_path,
              p->o.python, p->n, p->o.timeout_s);
    return pi;
}

char *pyinteraction_respond(struct pyinteraction *pi, const char *instance_id, const json_t *kwargs,
                            const json_t *messages, int *terminate, double *reward, bool *scored, char *err,
                            size_t errlen)
{
    struct pypool *p = pi->pool;
    *terminate = 0, *reward = 0, *scored = false;
    int created = 0;
    const int k = bind_inst(p, instance_id, kwargs, &created); /* started (start_interaction) on its first turn */
    const int slot = acquire(p, k);
    char *answer = NULL;
    if (ensure_created(p, pi->name, slot, instance_id, &answer) != RT_OK) {
        give_back(p, slot);
        error_set(err, errlen, "start_interaction: %s", answer + strlen("Error: "));
        free(answer);
        return NULL;
    }
    json_t *req = request("respond", pi->name, instance_id);
    json_object_set(req, "messages", (json_t *)messages);
    json_object_set_new(req, "kwargs", kwargs ? json_deep_copy(kwargs) : json_object());
    json_t *resp;
    char why[1024];
    const int rc = roundtrip(p, slot, req, &resp, why, sizeof why);
    json_decref(req);
    give_back(p, slot);
    char *text = NULL;
    if (rc == RT_OK && json_is_true(json_object_get(resp, "ok"))) {
        text = xstrdup(json_string_value(json_object_get(resp, "text")) ?: "");
        *terminate = json_is_true(json_object_get(resp, "terminate"));
        const json_t *r = json_object_get(resp, "reward");
        *scored = json_is_number(r);
        *reward = *scored ? json_number_value(r) : 0;
    } else {
        answer = error_answer(p, rc, resp, why);
        error_set(err, errlen, "generate_response: %s", answer + strlen("Error: "));
        free(answer);
    }
    json_decref(resp);
    return text;
}

void pyinteraction_finalize(struct pyinteraction *pi, const char *instance_id)
{
    char label[256];
    snprintf(label, sizeof label, "interaction %s: finalize_interaction", pi->name);
    release_instance(pi->pool, pi->name, instance_id, label);
}

void pyinteraction_free(struct pyinteraction *pi)
{
    if (!pi)
        return;
    pool_free(pi->pool);
    free(pi);
}
