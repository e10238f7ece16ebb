/* Reward functions: built-in scorers by data_source or a custom scorer from a
 * shared library, and the isolation that keeps a crashing or hanging scorer
 * from taking the run down.
 *
 * Isolated scoring of a batch: fork a child that scores the samples from
 * `next` on, in order, writing one fixed-size record per sample to a pipe
 * (each write is smaller than PIPE_BUF, so it arrives whole). The parent reads
 * the records, allowing each sample `timeout_s`. When the pipe closes early or
 * the time runs out, the sample after the last record is the culprit: it gets
 * 0 and a reason, the child is reaped (killed first on a timeout), and a fresh
 * child goes on with the sample after it. */
#include "reward.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "pyscorer.h"
#include "scorers.h"

struct reward_fn {
    void *dl;            /* dlopen handle of the custom scorer, or NULL */
    struct pyscorer *py; /* a Python custom scorer's process, or NULL */
    reward_custom_fn custom;
    char *custom_path, *custom_name;
    double timeout_s;
    bool isolate_builtin;
    bool lenient_scorers; /* reward_model.lenient_scorers */
    long failures;
    int batch_failures; /* in the batch being scored */
    /* GDPO's reward components (algorithm.gdpo_reward_keys): entries of the Python scorer's dict */
    char *parts[CFG_GDPO_MAX_KEYS];
    int n_parts;
};

#define REWARD_LOG_PER_BATCH 5

/* One result from the child. */
struct reward_record {
    int32_t index;
    int32_t failed; /* reason holds why the sample could not be scored */
    double score;
    char reason[REWARD_REASON_MAX];
};

_Static_assert(sizeof(struct reward_record) <= 512, "a record must be written atomically to a pipe");

static struct reward_fn *create(const char *path, const char *name, const char *python, int num_workers,
                                double timeout_s, char *err, size_t errlen)
{
    struct reward_fn *r = xcalloc(1, sizeof *r);
    r->timeout_s = timeout_s > 0 ? timeout_s : REWARD_DEFAULT_TIMEOUT_S;
    if (!path || !*path)
        return r;
    if (!name || !*name)
        name = "compute_score";
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, KEY_crf_path ": cannot load '%s': %s", path, strerror(errno));
        free(r);
        return NULL;
    }
    if (pyscorer_is_python(path)) {
        r->py = pyscorer_start(python, path, name, num_workers, r->timeout_s, err, errlen);
        if (!r->py) {
            free(r);
            return NULL;
        }
        r->custom_path = xstrdup(path);
        r->custom_name = xstrdup(name);
        log_info("reward", "custom scorer %s from %s (Python, %s; %d processes; %.3g s per sample)", name, path,
                 python && *python ? python : "python3", pyscorer_num_procs(r->py), r->timeout_s);
        return r;
    }
    /* a bare file name is a file here, not a library to look up on the search path */
    char local[4096];
    const char *open_path = path;
    if (!strchr(path, '/')) {
        snprintf(local, sizeof local, "./%s", path);
        open_path = local;
    }
    dlerror();
    r->dl = dlopen(open_path, RTLD_NOW | RTLD_LOCAL);
    if (!r->dl) {
        const char *e = dlerror();
        snprintf(err, errlen, KEY_crf_path ": cannot load '%s': %s", path, e ? e : "unknown error");
        free(r);
        return NULL;
    }
    dlerror();
    void *sym = dlsym(r->dl, name);
    const char *e = dlerror();
    if (e || !sym) {
        snprintf(err, errlen,
                 KEY_crf_name
                 ": symbol '%s' not found in '%s'%s%s (expected: double %s(const char "
                 "*data_source, const char *solution_str, const char *ground_truth, const char *extra_info_json))",
                 name, path, e ? ": " : "", e ? e : "", name);
        dlclose(r->dl);
        free(r);
        return NULL;
    }
    /* POSIX guarantees that a dlsym result converts to a function pointer */
    memcpy(&r->custom, &sym, sizeof r->custom);
    r->custom_path = xstrdup(path);
    r->custom_name = xstrdup(name);
    log_info("reward", "custom scorer %s from %s (isolated, %.3g s per sample)", name, path, r->timeout_s);
    return r;
}

struct reward_fn *reward_create_custom(const char *path, const char *name, char *err, size_t errlen)
{
    return create(path, name, "python3", 1, REWARD_DEFAULT_TIMEOUT_S, err, errlen);
}

struct reward_fn *reward_create(const struct grpo_config *cfg, char *err, size_t errlen)
{
    if (!cfg)
        return reward_create_custom(NULL, NULL, err, errlen);
    struct reward_fn *r = create(cfg->crf_path, cfg->crf_name, cfg->crf_python, (int)cfg->rm_num_workers,
                                 cfg->crf_timeout_s, err, errlen);
    if (!r)
        return NULL;
    r->lenient_scorers = cfg->rm_lenient_scorers;
    if (strcmp(cfg->alg_adv_estimator, "gdpo") == 0) {
        double w[CFG_GDPO_MAX_KEYS];
        r->n_parts = config_gdpo_keys(cfg, r->parts, w, err, errlen);
        if (r->n_parts < 0 || !r->py) {
            if (r->n_parts >= 0)
                snprintf(err, errlen,
                         KEY_alg_adv_estimator
                         "=gdpo: its reward components (" KEY_alg_gdpo_reward_keys ") are entries "
                         "of the dict a Python custom_reward_function returns, and %s returns one score",
                         r->custom ? "a C custom scorer" : "a built-in scorer");
            else
                r->n_parts = 0;
            reward_free(r);
            return NULL;
        }
    }
    return r;
}

int reward_num_parts(const struct reward_fn *r) { return r ? r->n_parts : 0; }

const char *reward_part_name(const struct reward_fn *r, int k) { return r->parts[k]; }

void reward_free(struct reward_fn *r)
{
    if (!r)
        return;
    if (r->dl)
        dlclose(r->dl);
    pyscorer_free(r->py);
    free(r->custom_path);
    free(r->custom_name);
    for (int k = 0; k < r->n_parts; k++)
        free(r->parts[k]);
    free(r);
}

void reward_set_timeout(struct reward_fn *r, double seconds)
{
    if (seconds > 0 && isfinite(seconds))
        r->timeout_s = seconds;
}

void reward_set_isolate_builtin(struct reward_fn *r, bool isolate) { r->isolate_builtin = isolate; }
bool reward_is_custom(const struct reward_fn *r) { return r->custom != NULL || r->py != NULL; }
long reward_num_failures(const struct reward_fn *r) { return r->failures; }

bool reward_supports(const struct reward_fn *r, const char *data_source)
{
    return reward_is_custom(r) || reward_builtin_scorer_name(data_source) != NULL;
}

double reward_accuracy(const struct reward_fn *r, const struct reward_item *item)
{
    if (reward_is_custom(r) || !item)
        return NAN;
    return reward_builtin_accuracy_lenient(item->data_source, item->solution_str, item->ground_truth,
                                           r->lenient_scorers);
}

double reward_overlong_penalty(int response_length, int max_response_length, int buffer_len, double penalty_factor)
{
    if (buffer_len <= 0)
        return 0.0;
    int expected = max_response_length - buffer_len;
    int exceed = response_length - expected;
    if (exceed <= 0)
        return 0.0;
    double p = -(double)exceed / buffer_len * penalty_factor;
    return p < -penalty_factor ? -penalty_factor : p;
}

/* Score one item in the current process. Returns the score; *failed and reason tell a failure. */
static double score_here(const struct reward_fn *r, const struct reward_item *it, bool *failed, char *reason,
                         size_t reasonlen)
{
    reason[0] = '\0';
    *failed = false;
    const char *ds = it->data_source ? it->data_source : "";
    const char *sol = it->solution_str ? it->solution_str : "";
    const char *gt = it->ground_truth ? it->ground_truth : "";
    const char *extra = it->extra_info_json ? it->extra_info_json : "{}";
    double s;
    if (r->custom) {
        s = r->custom(ds, sol, gt, extra);
        if (!isfinite(s)) {
            snprintf(reason, reasonlen, "scorer %s returned %s", r->custom_name, isnan(s) ? "NaN" : "infinity");
            *failed = true;
            return 0.0;
        }
        return s;
    }
    s = reward_builtin_score_lenient(ds, sol, gt, extra, r->lenient_scorers, reason, reasonlen);
    if (reason[0])
        *failed = true;
    return s;
}

static void report_failure(struct reward_fn *r, int i, const struct reward_item *it, const char *reason, double *scores,
                           char **reasons)
{
    r->failures++;
    scores[i] = 0.0;
    /* at most REWARD_LOG_PER_BATCH lines a batch: a scorer that fails on every sample must not flood the log */
    if (r->batch_failures++ < REWARD_LOG_PER_BATCH)
        log_warn("reward", "sample %d (data_source %s): %s", i, it->data_source ? it->data_source : "(null)", reason);
    if (reasons)
        reasons[i] = xstrdup(reason);
}

static void child_fatal_hook(int code) { _exit(code ? code : 1); }

/* The child: default signal dispositions (a crash must kill it, not run the parent's handlers
 * or MPI_Abort), then score items[next..n) in order, one record each. Never returns. */
static _Noreturn void child_main(const struct reward_fn *r, const struct reward_item *items, int next, int n, int fd,
                                 pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(111);
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE,  SIGILL,  SIGABRT, SIGTRAP, SIGSYS,  SIGTERM,
                               SIGINT,  SIGHUP, SIGPIPE, SIGXCPU, SIGXFSZ, SIGALRM, SIGUSR1, SIGUSR2};
    for (size_t k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
        signal(sigs[k], SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    check_set_fatal_hook(child_fatal_hook);
    for (int i = next; i < n; i++) {
        struct reward_record rec;
        memset(&rec, 0, sizeof rec);
        bool failed;
        rec.index = i;
        rec.score = score_here(r, &items[i], &failed, rec.reason, sizeof rec.reason);
        rec.failed = failed;
        const char *p = (const char *)&rec;
        size_t left = sizeof rec;
        while (left > 0) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                _exit(112);
            p += w;
            left -= (size_t)w;
        }
    }
    fflush(stdout);
    fflush(stderr);
    _exit(0);
}

static void describe_status(int status, char *buf, size_t len)
{
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char *abbrev = sigabbrev_np(sig);
        snprintf(buf, len, "scorer killed by SIG%s", abbrev ? abbrev : "?");
    } else if (WIFEXITED(status)) {
        snprintf(buf, len, "scorer process exited with status %d before returning a score", WEXITSTATUS(status));
    } else {
        snprintf(buf, len, "scorer process ended abnormally (wait status %d)", status);
    }
}

static void score_isolated(struct reward_fn *r, const struct reward_item *items, int n, double *scores, char **reasons)
{
    int next = 0;
    while (next < n) {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) < 0) {
            char why[REWARD_REASON_MAX];
            snprintf(why, sizeof why, "cannot create a pipe for the scorer: %s", strerror(errno));
            for (; next < n; next++)
                report_failure(r, next, &items[next], why, scores, reasons);
            return;
        }
        fflush(stdout); /* the child must not flush the parent's pending output a second time */
        fflush(stderr);
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid < 0) {
            char why[REWARD_REASON_MAX];
            snprintf(why, sizeof why, "cannot fork the scorer process: %s", strerror(errno));
            close(fds[0]);
            close(fds[1]);
            for (; next < n; next++)
                report_failure(r, next, &items[next], why, scores, reasons);
            return;
        }
        if (pid == 0) {
            close(fds[0]);
            child_main(r, items, next, n, fds[1], parent);
        }
        close(fds[1]);

        struct reward_record rec;
        size_t have = 0;
        bool timed_out = false, broken = false;
        double deadline = clock_now_s() + r->timeout_s;
        while (next < n) {
            double left = deadline - clock_now_s();
            if (left <= 0) {
                timed_out = true;
                break;
            }
            struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
            int ms = (int)ceil(left * 1000.0);
            int pr = poll(&pfd, 1, ms < 1 ? 1 : ms);
            if (pr < 0) {
                if (errno == EINTR)
                    continue;
                broken = true;
                break;
            }
            if (pr == 0)
                continue; /* the deadline check above decides */
            ssize_t k = read(fds[0], (char *)&rec + have, sizeof rec - have);
            if (k < 0) {
                if (errno == EINTR || errno == EAGAIN)
                    continue;
                broken = true;
                break;
            }
            if (k == 0)
                break; /* the child is gone */
            have += (size_t)k;
            if (have < sizeof rec)
                continue;
            have = 0;
            if (rec.index != next) {
                broken = true;
                break;
            }
            rec.reason[sizeof rec.reason - 1] = '\0';
            if (rec.failed) {
                report_failure(r, next, &items[next], rec.reason, scores, reasons);
            } else {
                scores[next] = rec.score;
                if (reasons)
                    reasons[next] = NULL;
            }
            next++;
            deadline = clock_now_s() + r->timeout_s;
        }
        close(fds[0]);
        if (next >= n) {
            int st;
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            break;
        }
        char why[REWARD_REASON_MAX];
        int st = 0;
        if (timed_out || broken)
            kill(pid, SIGKILL);
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        if (timed_out)
            snprintf(why, sizeof why, "scorer timed out after %.3g s", r->timeout_s);
        else if (broken)
            snprintf(why, sizeof why, "lost the scorer process's results (protocol error)");
        else
            describe_status(st, why, sizeof why);
        report_failure(r, next, &items[next], why, scores, reasons);
        next++;
    }
}

static void score_batch_parts(struct reward_fn *r, const struct reward_item *items, int n, double *scores,
                              char **reasons, double *parts);

void reward_score_batch(struct reward_fn *r, const struct reward_item *items, int n, double *scores, char **reasons)
{
    reward_score_batch_parts(r, items, n, scores, reasons, NULL);
}

void reward_score_batch_parts(struct reward_fn *r, const struct reward_item *items, int n, double *scores,
                              char **reasons, double *parts)
{
    if (n <= 0)
        return;
    if (reasons)
        for (int i = 0; i < n; i++)
            reasons[i] = NULL;
    r->batch_failures = 0;
    score_batch_parts(r, items, n, scores, reasons, parts);
    if (r->batch_failures > REWARD_LOG_PER_BATCH)
        log_warn("reward", "%d more samples of this batch of %d failed (not logged one by one; %ld failed in all)",
                 r->batch_failures - REWARD_LOG_PER_BATCH, n, r->failures);
}

static void score_batch_parts(struct reward_fn *r, const struct reward_item *items, int n, double *scores,
                              char **reasons, double *parts)
{
    if (r->py) {
        bool *failed = xcalloc((size_t)n, sizeof *failed);
        char(*why)[PYSCORER_REASON_MAX] = xcalloc((size_t)n, sizeof *why);
        const struct pyscorer_parts pp = {(const char *const *)r->parts, r->n_parts, parts,
                                          " (algorithm.gdpo_reward_keys)"};
        pyscorer_score(r->py, items, n, r->timeout_s, scores, failed, why, parts && r->n_parts ? &pp : NULL);
        for (int i = 0; i < n; i++)
            if (failed[i]) {
                report_failure(r, i, &items[i], why[i], scores, reasons);
                for (int k = 0; parts && k < r->n_parts; k++) /* a failed sample's components are 0, as its score */
                    parts[(size_t)i * r->n_parts + k] = 0.0;
            }
        free(failed), free(why);
        return;
    }
    if (r->custom || r->isolate_builtin) {
        score_isolated(r, items, n, scores, reasons);
        return;
    }
    for (int i = 0; i < n; i++) {
        char why[REWARD_REASON_MAX];
        bool failed;
        scores[i] = score_here(r, &items[i], &failed, why, sizeof why);
        if (failed)
            report_failure(r, i, &items[i], why, scores, reasons);
    }
}

double reward_score_one(struct reward_fn *r, const struct reward_item *item, char *why, size_t whylen)
{
    double s;
    char *reason = NULL;
    reward_score_batch(r, item, 1, &s, &reason);
    if (why && whylen)
        snprintf(why, whylen, "%s", reason ? reason : "");
    free(reason);
    return s;
}
