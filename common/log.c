#include "log.h"

#include "clock.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Process-wide logger settings: the one piece of global state outside main,
 * set once at start-up before any thread exists. */
static enum log_level g_level = LOG_INFO;
static int g_rank = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void log_set_level(enum log_level level) { g_level = level; }

enum log_level log_get_level(void) { return g_level; }

void log_set_rank(int rank) { g_rank = rank; }

int log_level_from_name(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, level_names[i]) == 0)
            return i;
    return -1;
}

int log_init_from_env(void)
{
    const char *v = getenv("GRPO_LOG_LEVEL");
    if (!v || !*v)
        return 0;
    int level = log_level_from_name(v);
    if (level < 0) {
        log_warn("log", "GRPO_LOG_LEVEL='%s' is not one of error, warn, info, debug; keeping %s", v,
                 level_names[g_level]);
        return -1;
    }
    g_level = (enum log_level)level;
    return 0;
}

void log_vwrite(enum log_level level, const char *subsys, const char *fmt, va_list ap)
{
    if (level > g_level)
        return;
    char line[4096];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof line - (size_t)n, ".%03ldZ %-5s ", (long)(tv.tv_usec / 1000), level_names[level]);
    if (g_rank >= 0)
        n += snprintf(line + n, sizeof line - (size_t)n, "[rank %d] ", g_rank);
    n += snprintf(line + n, sizeof line - (size_t)n, "%s: ", subsys ? subsys : "-");
    if (n < (int)sizeof line - 1) {
        int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
        if (m > 0)
            n += m;
    }
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2; /* long messages are cut, never overflow */
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

void log_write(enum log_level level, const char *subsys, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(level, subsys, fmt, ap);
    va_end(ap);
}

static pthread_mutex_t limit_mu = PTHREAD_MUTEX_INITIALIZER;

int log_limit_pass(struct log_limit *l, double now, double interval_s, unsigned *held)
{
    pthread_mutex_lock(&limit_mu);
    int pass = !l->used || now - l->last >= interval_s;
    if (pass) {
        *held = l->held;
        l->held = 0;
        l->last = now;
        l->used = 1;
    } else {
        l->held++;
    }
    pthread_mutex_unlock(&limit_mu);
    return pass;
}

void log_write_limited(struct log_limit *l, double interval_s, enum log_level level, const char *subsys,
                       const char *fmt, ...)
{
    if (level > g_level)
        return;
    unsigned held;
    if (!log_limit_pass(l, clock_now_s(), interval_s, &held))
        return;
    char msg[3500];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (held)
        log_write(level, subsys, "%s (%u more like this in the last %.0f s)", msg, held, interval_s);
    else
        log_write(level, subsys, "%s", msg);
}

void log_bytes_text(uint64_t b, char *out, size_t len)
{
    if (b < 1024)
        snprintf(out, len, "%" PRIu64 " B", b);
    else if (b < 1024 * 1024)
        snprintf(out, len, "%.1f KiB", (double)b / 1024);
    else if (b < 1024ull * 1024 * 1024)
        snprintf(out, len, "%.1f MiB", (double)b / (1024.0 * 1024));
    else
        snprintf(out, len, "%.2f GiB", (double)b / (1024.0 * 1024 * 1024));
}
