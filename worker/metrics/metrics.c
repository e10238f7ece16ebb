/* The per-step metrics container, statistics helpers, process memory, the
 * run history, and file helpers shared by the sinks. */
#include "worker/metrics/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fs.h"
#include "common/log.h"
#include "worker/metrics/metrics_internal.h"

/* ---------------------------------------------------------------- container */

void metrics_init(struct metrics *m) { memset(m, 0, sizeof *m); }

void metrics_clear(struct metrics *m)
{
    for (size_t i = 0; i < m->n; i++)
        free(m->items[i].name);
    m->n = 0;
}

void metrics_free(struct metrics *m)
{
    metrics_clear(m);
    free(m->items);
    memset(m, 0, sizeof *m);
}

static long find(const struct metrics *m, const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->items[i].name, name) == 0)
            return (long)i;
    return -1;
}

void metrics_set(struct metrics *m, const char *name, double value)
{
    long i = find(m, name);
    if (i >= 0) {
        m->items[i].value = value;
        return;
    }
    if (m->n == m->cap) {
        m->cap = m->cap ? 2 * m->cap : 32;
        m->items = xrealloc(m->items, m->cap * sizeof *m->items);
    }
    m->items[m->n].name = xstrdup(name);
    m->items[m->n].value = value;
    m->n++;
}

bool metrics_get(const struct metrics *m, const char *name, double *value)
{
    long i = find(m, name);
    if (i < 0)
        return false;
    if (value)
        *value = m->items[i].value;
    return true;
}

double metrics_get_or(const struct metrics *m, const char *name, double fallback)
{
    double v;
    return metrics_get(m, name, &v) ? v : fallback;
}

bool metrics_remove(struct metrics *m, const char *name)
{
    long i = find(m, name);
    if (i < 0)
        return false;
    free(m->items[i].name);
    memmove(&m->items[i], &m->items[i + 1], (m->n - (size_t)i - 1) * sizeof *m->items);
    m->n--;
    return true;
}

void metrics_merge(struct metrics *dst, const struct metrics *src)
{
    for (size_t i = 0; i < src->n; i++)
        metrics_set(dst, src->items[i].name, src->items[i].value);
}

void metrics_copy(struct metrics *dst, const struct metrics *src)
{
    if (dst == src)
        return;
    metrics_clear(dst);
    metrics_merge(dst, src);
}

void metrics_set_stats3(struct metrics *m, const char *prefix, double sum, double mx, double mn, size_t k)
{
    size_t len = strlen(prefix) + 6;
    char *name = xmalloc(len);
    double mean = k ? sum / (double)k : NAN;
    if (!k)
        mx = mn = NAN;
    snprintf(name, len, "%s/mean", prefix);
    metrics_set(m, name, mean);
    snprintf(name, len, "%s/max", prefix);
    metrics_set(m, name, mx);
    snprintf(name, len, "%s/min", prefix);
    metrics_set(m, name, mn);
    free(name);
}

static void summary_add(struct metrics_summary *a, double v)
{
    if (!isfinite(v))
        return;
    a->sum += v;
    a->max = v > a->max ? v : a->max;
    a->min = v < a->min ? v : a->min;
    a->n++;
}

struct metrics_summary metrics_summarize(const double *values, size_t n)
{
    struct metrics_summary a = {0, -INFINITY, INFINITY, 0};
    for (size_t i = 0; i < n; i++)
        summary_add(&a, values[i]);
    return a;
}

void metrics_set_summary(struct metrics *m, const char *prefix, const struct metrics_summary *s)
{
    metrics_set_stats3(m, prefix, s->sum, s->max, s->min, s->n);
}

void metrics_set_stats(struct metrics *m, const char *prefix, const double *values, size_t n)
{
    const struct metrics_summary a = metrics_summarize(values, n);
    metrics_set_summary(m, prefix, &a);
}

void metrics_set_stats_f(struct metrics *m, const char *prefix, const float *values, size_t n)
{
    struct metrics_summary a = {0, -INFINITY, INFINITY, 0};
    for (size_t i = 0; i < n; i++)
        summary_add(&a, values[i]);
    metrics_set_summary(m, prefix, &a);
}

/* A "Name:   N kB" line of /proc/self/status in GiB; NaN when unavailable. */
static double proc_status_gb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return NAN;
    char line[256];
    double gb = NAN;
    const size_t len = strlen(field);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, field, len) != 0)
            continue;
        char *end;
        errno = 0;
        unsigned long long kb = strtoull(line + len, &end, 10);
        if (errno == 0 && end != line + len)
            gb = (double)kb / (1024.0 * 1024.0);
        break;
    }
    fclose(f);
    return gb;
}

double proc_rss_gb(void) { return proc_status_gb("VmRSS:"); }
double proc_peak_rss_gb(void) { return proc_status_gb("VmHWM:"); }

/* ------------------------------------------------------------------ history */

void metrics_history_init(struct metrics_history *h) { memset(h, 0, sizeof *h); }

void metrics_history_free(struct metrics_history *h)
{
    for (size_t i = 0; i < h->n; i++)
        metrics_free(&h->steps[i].m);
    free(h->steps);
    memset(h, 0, sizeof *h);
}

void metrics_history_append(struct metrics_history *h, long step, const struct metrics *m)
{
    /* usually the new step goes last; search backwards for its place */
    size_t pos = h->n;
    while (pos > 0 && h->steps[pos - 1].step > step)
        pos--;
    if (pos > 0 && h->steps[pos - 1].step == step) {
        metrics_merge(&h->steps[pos - 1].m, m);
        return;
    }
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        h->steps = xrealloc(h->steps, h->cap * sizeof *h->steps);
    }
    memmove(&h->steps[pos + 1], &h->steps[pos], (h->n - pos) * sizeof *h->steps);
    h->steps[pos].step = step;
    metrics_init(&h->steps[pos].m);
    metrics_merge(&h->steps[pos].m, m);
    h->n++;
}

void metrics_history_truncate_after(struct metrics_history *h, long step)
{
    while (h->n > 0 && h->steps[h->n - 1].step > step) {
        metrics_free(&h->steps[h->n - 1].m);
        h->n--;
    }
}

static int history_cb(long step, const struct metrics *m, void *ctx)
{
    metrics_history_append(ctx, step, m);
    return 0;
}

long metrics_history_load_jsonl(struct metrics_history *h, const char *path, bool missing_ok)
{
    if (missing_ok && access(path, F_OK) != 0 && errno == ENOENT)
        return 0;
    return metrics_jsonl_read(path, history_cb, h);
}

/* ------------------------------------------------------------------ helpers */

char *metrics_path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int metrics_stream_sync(FILE *f, const char *path, const char *subsys)
{
    if (!f)
        return -1;
    if (fflush(f) != 0) {
        metrics_output_failed(subsys, path, "writing %s: %s", path, check_errno_text());
        clearerr(f);
        return -1;
    }
    /* a device or pipe (metrics.jsonl pointed at /dev/null) has nothing to sync: EINVAL */
    if (fsync(fileno(f)) != 0 && errno != EINVAL) {
        metrics_output_failed(subsys, path, "syncing %s: %s", path, check_errno_text());
        return -1;
    }
    return 0;
}

void metrics_stream_close(FILE *f, const char *path, const char *subsys)
{
    if (f && fclose(f) != 0)
        metrics_output_failed(subsys, path, "closing %s: %s", path, check_errno_text());
}

int metrics_write_file_atomic(const char *path, const void *data, size_t len, const char *subsys)
{
    char err[1024];
    if (fs_write_atomic(path, data, len, err, sizeof err) == 0)
        return 0;
    metrics_output_failed(subsys, path, "%s", err);
    return -1;
}

/* ------------------------------------------------------------ failed writes */

#define OUTPUT_FILES_NAMED 16

static pthread_mutex_t output_mu = PTHREAD_MUTEX_INITIALIZER;
static char output_first[1200];                    /* the first failure's text; "": none */
static char output_files[OUTPUT_FILES_NAMED][512]; /* files whose failure was logged */
static int output_nfiles;

void metrics_output_failed(const char *subsys, const char *path, const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!path)
        path = "";
    pthread_mutex_lock(&output_mu);
    bool seen = false;
    for (int i = 0; i < output_nfiles && !seen; i++)
        seen = strncmp(output_files[i], path, sizeof output_files[i] - 1) == 0;
    if (!seen && output_nfiles < OUTPUT_FILES_NAMED)
        snprintf(output_files[output_nfiles++], sizeof output_files[0], "%s", path);
    else
        seen = true; /* beyond the files named, nothing more is logged as an error */
    if (!output_first[0])
        snprintf(output_first, sizeof output_first, "%s", msg);
    pthread_mutex_unlock(&output_mu);
    if (!seen)
        log_error(subsys, "%s", msg);
    else
        log_debug(subsys, "%s (again)", msg);
}

bool metrics_output_failure(char *why, size_t len)
{
    pthread_mutex_lock(&output_mu);
    bool failed = output_first[0] != 0;
    if (failed && why && len)
        snprintf(why, len, "%s", output_first);
    pthread_mutex_unlock(&output_mu);
    return failed;
}

void metrics_output_failure_reset(void)
{
    pthread_mutex_lock(&output_mu);
    output_first[0] = 0;
    output_nfiles = 0;
    pthread_mutex_unlock(&output_mu);
}

void mbuf_reserve(struct mbuf *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1)
        cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void mbuf_putn(struct mbuf *b, const char *s, size_t n)
{
    mbuf_reserve(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void mbuf_puts(struct mbuf *b, const char *s) { mbuf_putn(b, s, strlen(s)); }

void mbuf_putc(struct mbuf *b, char c) { mbuf_putn(b, &c, 1); }

void mbuf_printf(struct mbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int len = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (len < 0)
        return;
    if ((size_t)len < sizeof small) {
        mbuf_putn(b, small, (size_t)len);
        return;
    }
    mbuf_reserve(b, (size_t)len);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)len + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)len;
}

char *mbuf_take(struct mbuf *b)
{
    char *p = b->p ? b->p : xstrdup("");
    memset(b, 0, sizeof *b);
    return p;
}

void mbuf_free(struct mbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}
