/* The per-step summary line on stderr and the transient status line of long
 * phases. */
#include "worker/metrics/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "worker/metrics/metrics_internal.h"

void metrics_console_init(struct metrics_console *c, long total_steps)
{
    memset(c, 0, sizeof *c);
    c->total_steps = total_steps;
    c->bar_width = 12;
    c->prev_reward = NAN;
}

/* A value by name when present and finite. */
static bool val(const struct metrics *m, const char *name, double *v)
{
    return metrics_get(m, name, v) && isfinite(*v);
}

/* Three significant digits, no exponent for everyday magnitudes: 0.0031, 1.92, 23.4, 412, 1530. */
static void fmt_sig(char *buf, size_t cap, double v)
{
    double a = fabs(v);
    if (a == 0)
        snprintf(buf, cap, "0");
    else if (a < 1e-4 || a >= 1e6)
        snprintf(buf, cap, "%.2e", v);
    else if (a >= 1000)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.3g", v);
}

/* 45s, 17m, 2h05m, 3d04h */
static void fmt_duration(char *buf, size_t cap, double s)
{
    if (!(s >= 0) || s > 1e9) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = lround(s);
    if (t < 60)
        snprintf(buf, cap, "%lds", t);
    else if (t < 3600)
        snprintf(buf, cap, "%ldm", (t + 30) / 60);
    else if (t < 86400)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
    else
        snprintf(buf, cap, "%ldd%02ldh", t / 86400, (t % 86400) / 3600);
}

struct out {
    char *buf;
    size_t cap;
    size_t len; /* the length the full line has */
};

__attribute__((format(printf, 2, 3))) static void out_printf(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

int metrics_console_render(const struct metrics_console *c, long step, const struct metrics *m, char *buf, size_t cap)
{
    struct out o = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    char a[32];
    double v, prev;

    if (c->total_steps > 0) {
        int width = snprintf(NULL, 0, "%ld", c->total_steps);
        out_printf(&o, "step %*ld/%ld", width, step, c->total_steps);
        double frac = (double)step / (double)c->total_steps;
        frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
        int bw = c->bar_width > 0 ? c->bar_width : 0;
        if (bw > 0) {
            int filled = (int)floor(frac * bw + 1e-9);
            out_printf(&o, " [");
            for (int i = 0; i < bw; i++)
                out_printf(&o, "%c", i < filled ? '#' : '.');
            out_printf(&o, "]");
        }
        out_printf(&o, " %3d%%", (int)floor(frac * 100 + 1e-9));
    } else {
        out_printf(&o, "step %ld", step);
    }

    if (val(m, "critic/score/mean", &v)) {
        out_printf(&o, " | reward %.3f", v);
        prev = c->prev_reward;
        if (isfinite(prev))
            out_printf(&o, " (%+.3f)", v - prev);
    }
    if (val(m, "critic/acc/mean", &v))
        out_printf(&o, " | acc %.3f", v);
    if (val(m, "actor/kl_loss", &v) || val(m, "actor/ppo_kl", &v)) {
        fmt_sig(a, sizeof a, v);
        out_printf(&o, " | kl %s", a);
    }
    if (val(m, "actor/entropy", &v))
        out_printf(&o, " | entropy %.3f", v);
    if (val(m, "response_length/mean", &v))
        out_printf(&o, " | len %.1f", v);
    if (val(m, "perf/throughput", &v)) {
        fmt_sig(a, sizeof a, v);
        out_printf(&o, " | %s tok/s", a);
    }
    /* validation rewards: val-core/DS/reward/mean@N, with the accuracy val-core/DS/acc/mean@N when set */
    for (size_t i = 0; i < metrics_count(m); i++) {
        const char *name = metrics_name(m, i);
        if (strncmp(name, "val-core/", 9) != 0 || !isfinite(metrics_value(m, i)))
            continue;
        const char *tail = strstr(name + 9, "/reward/mean@");
        if (!tail)
            continue;
        int dl = (int)(tail - (name + 9));
        out_printf(&o, " | val %.*s %.3f", dl, name + 9, metrics_value(m, i));
        char acc[300];
        snprintf(acc, sizeof acc, "val-core/%.*s/acc/mean@%s", dl, name + 9, tail + strlen("/reward/mean@"));
        if (val(m, acc, &v))
            out_printf(&o, " acc %.3f", v);
    }
    if (val(m, "timing_s/step", &v)) {
        out_printf(&o, " | step %.1fs", v);
        if (c->total_steps > 0 && step < c->total_steps) {
            double mean = (c->step_time_sum + v) / (double)(c->step_time_n + 1);
            fmt_duration(a, sizeof a, mean * (double)(c->total_steps - step));
            out_printf(&o, " | eta %s", a);
        }
    }
    return (int)o.len;
}

void metrics_console_update(struct metrics_console *c, const struct metrics *m)
{
    double v;
    if (val(m, "critic/score/mean", &v))
        c->prev_reward = v;
    if (val(m, "timing_s/step", &v)) {
        c->step_time_sum += v;
        c->step_time_n++;
    }
}

/* ---------------------------------------------------------- transient status */

static bool transient_shown;
static double transient_last;

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

void metrics_console_print(struct metrics_console *c, long step, const struct metrics *m)
{
    struct mbuf b = {0};
    if (transient_shown && isatty(STDERR_FILENO))
        mbuf_puts(&b, "\r\033[K");
    transient_shown = false;
    int len = metrics_console_render(c, step, m, NULL, 0);
    mbuf_reserve(&b, (size_t)len + 1);
    metrics_console_render(c, step, m, b.p + b.n, (size_t)len + 1);
    b.n += (size_t)len;
    mbuf_putc(&b, '\n');
    write_all(STDERR_FILENO, b.p, b.n);
    mbuf_free(&b);
    metrics_console_update(c, m);
}

int metrics_progress_render(char *buf, size_t cap, const char *phase, long done, long total, const char *unit)
{
    const char *sp = unit && *unit ? " " : "";
    const char *u = unit ? unit : "";
    if (total > 0)
        return snprintf(buf, cap, "%s %ld/%ld%s%s", phase, done, total, sp, u);
    return snprintf(buf, cap, "%s %ld%s%s", phase, done, sp, u);
}

void metrics_progress(const char *phase, long done, long total, const char *unit)
{
    if (!isatty(STDERR_FILENO))
        return;
    double now = clock_now_s();
    if (transient_shown && now - transient_last < 0.1 && !(total > 0 && done >= total))
        return;
    transient_last = now;
    char text[200], line[256];
    metrics_progress_render(text, sizeof text, phase, done, total, unit);
    int n = snprintf(line, sizeof line, "\r%s\033[K", text);
    if (n > 0)
        write_all(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    transient_shown = true;
}

void metrics_progress_done(void)
{
    if (!transient_shown)
        return;
    transient_shown = false;
    if (isatty(STDERR_FILENO))
        write_all(STDERR_FILENO, "\r\033[K", 4);
}
