/* A self-contained SVG chart of a run: small multiples (one panel per series)
 * against the training step, with axes, ticks and titles. No script, no
 * external fonts (generic family names only). */
#include "worker/metrics/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "worker/metrics/metrics_internal.h"

#define SUBSYS "metrics"

/* layout, in SVG user units */
enum {
    COLS = 3,
    PANEL_W = 320,
    PANEL_H = 220,
    GAP = 16,
    HEADER_H = 44,
    PAD_L = 58, /* y tick labels */
    PAD_R = 14,
    PAD_T = 40, /* title and metric name */
    PAD_B = 34, /* x tick labels and axis name */
    MAX_SERIES = 8,
};

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"};

struct series {
    char *label; /* name in the "latest values" panel (the panel title for a panel's first series) */
    const char *color;
    bool markers; /* validation points: markers on a thin line */
    double *x, *y;
    size_t n;
};

struct panel {
    const char *title;
    const char *subtitle; /* metric name(s) */
    struct series s[MAX_SERIES];
    int ns;
};

/* XML text or attribute value: markup characters escaped, control characters and invalid UTF-8
 * replaced with '?' (XML 1.0 allows neither). */
static void put_xml(struct mbuf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char c = *p;
        if (c < 0x80) {
            switch (c) {
            case '&': mbuf_puts(b, "&amp;"); break;
            case '<': mbuf_puts(b, "&lt;"); break;
            case '>': mbuf_puts(b, "&gt;"); break;
            case '"': mbuf_puts(b, "&quot;"); break;
            case '\'': mbuf_puts(b, "&apos;"); break;
            default: mbuf_putc(b, (c < 0x20 && c != '\t') || c == 0x7f ? '?' : (char)c);
            }
            p++;
            continue;
        }
        int len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
        bool ok = len > 0;
        for (int i = 1; ok && i < len; i++)
            ok = (p[i] & 0xc0) == 0x80;
        if (ok && len == 3 && ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] >= 0xa0)))
            ok = false; /* overlong, surrogate */
        if (ok && len == 4 && ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] >= 0x90)))
            ok = false; /* overlong, beyond U+10FFFF */
        if (!ok) {
            mbuf_putc(b, '?');
            p++;
            continue;
        }
        mbuf_putn(b, (const char *)p, (size_t)len);
        p += len;
    }
}

static void series_add(struct series *s, double x, double y)
{
    if (!isfinite(y))
        return;
    if ((s->n & (s->n - 1)) == 0) { /* grow at powers of two */
        size_t cap = s->n ? 2 * s->n : 1;
        s->x = xrealloc(s->x, cap * sizeof *s->x);
        s->y = xrealloc(s->y, cap * sizeof *s->y);
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
}

/* The finite values of name against the step; NaN, Inf and steps without name are skipped (the line
 * joins the neighbours). */
static void fill_series(struct series *s, const struct metrics_history *h, const char *name)
{
    for (size_t i = 0; i < h->n; i++) {
        double v;
        if (metrics_get(&h->steps[i].m, name, &v))
            series_add(s, (double)h->steps[i].step, v);
    }
}

static bool history_has(const struct metrics_history *h, const char *name)
{
    for (size_t i = 0; i < h->n; i++)
        if (metrics_get(&h->steps[i].m, name, NULL))
            return true;
    return false;
}

/* A "nice" tick spacing (1, 2, 5 x 10^k) for about target intervals over span. */
static double nice_step(double span, int target)
{
    double raw = span / target;
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    double nf = f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10;
    return nf * mag;
}

struct axis {
    double lo, hi, step;
    int decimals; /* for tick labels; -1: exponent form */
};

static void make_axis(struct axis *a, double lo, double hi, int target, bool integer)
{
    if (!(hi > lo)) { /* one value: make room around it */
        double d = integer ? 1 : (lo != 0 ? fabs(lo) * 0.1 : 1);
        lo -= d;
        hi += d;
    }
    double st = nice_step(hi - lo, target);
    if (integer && st < 1)
        st = 1;
    a->step = st;
    a->lo = floor(lo / st + 1e-9) * st;
    a->hi = ceil(hi / st - 1e-9) * st;
    if (a->hi <= a->lo)
        a->hi = a->lo + st;
    double big = fmax(fabs(a->lo), fabs(a->hi));
    if (st < 1e-3 || big >= 1e7)
        a->decimals = -1;
    else
        a->decimals = st >= 1 ? 0 : (int)ceil(-log10(st) - 1e-9);
}

static void fmt_tick(char *buf, size_t cap, const struct axis *a, double v)
{
    if (fabs(v) < a->step * 1e-9)
        v = 0; /* no "-0" */
    if (a->decimals < 0)
        snprintf(buf, cap, "%.2g", v);
    else
        snprintf(buf, cap, "%.*f", a->decimals, v);
}

static void draw_panel(struct mbuf *b, const struct panel *p, double ox, double oy)
{
    double px0 = ox + PAD_L, px1 = ox + PANEL_W - PAD_R;
    double py0 = oy + PAD_T, py1 = oy + PANEL_H - PAD_B;

    mbuf_printf(b,
                "<g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" stroke=\"#dddddd\"/>\n",
                ox, oy, PANEL_W, PANEL_H);
    mbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">", ox + 10, oy + 18);
    put_xml(b, p->title);
    mbuf_puts(b, "</text>\n");
    mbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666666\">", ox + 10, oy + 31);
    put_xml(b, p->subtitle);
    mbuf_puts(b, "</text>\n");

    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    size_t total = 0;
    for (int k = 0; k < p->ns; k++)
        for (size_t i = 0; i < p->s[k].n; i++) {
            xmin = fmin(xmin, p->s[k].x[i]);
            xmax = fmax(xmax, p->s[k].x[i]);
            ymin = fmin(ymin, p->s[k].y[i]);
            ymax = fmax(ymax, p->s[k].y[i]);
            total++;
        }
    mbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"white\" stroke=\"#999999\"/>\n",
                px0, py0, px1 - px0, py1 - py0);
    if (total == 0) {
        mbuf_printf(b,
                    "<text x=\"%.1f\" y=\"%.1f\" font-size=\"13\" fill=\"#999999\" text-anchor=\"middle\">"
                    "no data</text>\n</g>\n",
                    (px0 + px1) / 2, (py0 + py1) / 2 + 4);
        return;
    }

    struct axis ax, ay;
    make_axis(&ax, xmin, xmax, 5, true);
    make_axis(&ay, ymin, ymax, 4, false);
#define SX(v) (px0 + ((v)-ax.lo) / (ax.hi - ax.lo) * (px1 - px0))
#define SY(v) (py1 - ((v)-ay.lo) / (ay.hi - ay.lo) * (py1 - py0))

    char label[48];
    /* y grid and tick labels */
    for (int i = 0; i <= 100; i++) {
        double v = ay.lo + i * ay.step;
        if (v > ay.hi + ay.step * 1e-6)
            break;
        double y = SY(v);
        mbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e6e6e6\"/>\n", px0, y, px1, y);
        mbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999999\"/>\n", px0 - 4, y, px0,
                    y);
        fmt_tick(label, sizeof label, &ay, v);
        mbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%s</text>\n", px0 - 6, y + 3.5,
                    label);
    }
    /* x ticks */
    for (int i = 0; i <= 100; i++) {
        double v = ax.lo + i * ax.step;
        if (v > ax.hi + ax.step * 1e-6)
            break;
        double x = SX(v);
        mbuf_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999999\"/>\n", x, py1, x,
                    py1 + 4);
        fmt_tick(label, sizeof label, &ax, v);
        mbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%s</text>\n", x, py1 + 15,
                    label);
    }
    mbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666666\" text-anchor=\"middle\">step</text>\n",
                (px0 + px1) / 2, py1 + 28);

    /* series: a polyline each (two points or more), markers for validation points and lone points */
    for (int k = 0; k < p->ns; k++) {
        const struct series *s = &p->s[k];
        if (s->n >= 2) {
            mbuf_printf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\" points=\"", s->color,
                        s->markers ? "1" : "1.8");
            for (size_t i = 0; i < s->n; i++)
                mbuf_printf(b, "%s%.1f,%.1f", i ? " " : "", SX(s->x[i]), SY(s->y[i]));
            mbuf_puts(b, "\"/>\n");
        }
        if (s->markers || s->n == 1)
            for (size_t i = 0; i < s->n; i++)
                mbuf_printf(b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", SX(s->x[i]), SY(s->y[i]),
                            s->color);
    }
#undef SX
#undef SY

    mbuf_puts(b, "</g>\n");
}

/* The sixth slot: the legend of every series with its latest value. */
static void draw_summary(struct mbuf *b, const struct panel *panels, int np, double ox, double oy)
{
    mbuf_printf(b,
                "<g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" stroke=\"#dddddd\"/>\n",
                ox, oy, PANEL_W, PANEL_H);
    mbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">latest values</text>\n", ox + 10,
                oy + 18);
    mbuf_printf(
        b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666666\">last finite value of each series</text>\n",
        ox + 10, oy + 31);
    double y = oy + PAD_T + 12;
    for (int i = 0; i < np; i++)
        for (int k = 0; k < panels[i].ns; k++) {
            const struct series *s = &panels[i].s[k];
            if (y > oy + PANEL_H - 8)
                break;
            const char *label = k == 0 ? panels[i].title : s->label;
            mbuf_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"9\" height=\"9\" fill=\"%s\"/>\n", ox + 12, y - 8.5,
                        s->n ? s->color : "#cccccc");
            mbuf_printf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">", ox + 27, y);
            size_t len = strlen(label);
            if (len > 34) { /* keep the row inside the panel */
                char cut[40];
                snprintf(cut, sizeof cut, "%.31s...", label);
                put_xml(b, cut);
            } else {
                put_xml(b, label);
            }
            if (s->n)
                mbuf_printf(b, ": %.4g (step %.0f)</text>\n", s->y[s->n - 1], s->x[s->n - 1]);
            else
                mbuf_puts(b, ": no data</text>\n");
            y += 17;
        }
    mbuf_puts(b, "</g>\n");
}

static void free_panel(struct panel *p)
{
    for (int k = 0; k < p->ns; k++) {
        free(p->s[k].label);
        free(p->s[k].x);
        free(p->s[k].y);
    }
}

/* The validation series of the reward panel: every val-core/DS/KIND/mean@N name (KIND "reward" or "acc"), in
 * first-seen order. */
static void add_val_series(struct panel *p, const struct metrics_history *h, const char *kind)
{
    char tailpat[32];
    snprintf(tailpat, sizeof tailpat, "/%s/mean@", kind);
    for (size_t i = 0; i < h->n; i++) {
        const struct metrics *m = &h->steps[i].m;
        for (size_t j = 0; j < metrics_count(m); j++) {
            const char *name = metrics_name(m, j);
            if (strncmp(name, "val-core/", 9) != 0)
                continue;
            const char *tail = strstr(name + 9, tailpat);
            if (!tail)
                continue;
            bool seen = false;
            for (int k = 1; k < p->ns && !seen; k++)
                seen = p->s[k].markers && strcmp(p->s[k].label + 4, name + 9) == 0; /* "val " + DS/KIND/mean@N */
            if (seen || p->ns >= MAX_SERIES)
                continue;
            struct series *s = &p->s[p->ns];
            memset(s, 0, sizeof *s);
            size_t n = strlen(name + 9) + 5;
            s->label = xmalloc(n);
            snprintf(s->label, n, "val %s", name + 9);
            s->color = palette[1 + (p->ns - 1) % (int)(sizeof palette / sizeof *palette - 1)];
            s->markers = true;
            fill_series(s, h, name);
            p->ns++;
        }
    }
}

/* Legend text of the validation series: "val DS" (reward) and "val DS acc" when N is 1 for every series, the
 * full tail otherwise. */
static void shorten_val_labels(struct panel *p)
{
    for (int k = 1; k < p->ns; k++) {
        if (!p->s[k].markers)
            continue;
        char *at = strstr(p->s[k].label, "/reward/mean@");
        if (at && strcmp(at, "/reward/mean@1") == 0)
            *at = '\0';
        at = strstr(p->s[k].label, "/acc/mean@");
        if (at && strcmp(at, "/acc/mean@1") == 0)
            memcpy(at, " acc", 5);
    }
}

int metrics_write_svg(const char *path, const struct metrics_history *h, const char *title)
{
    struct panel panels[5];
    memset(panels, 0, sizeof panels);
    const char *kl = history_has(h, "actor/kl_loss") ? "actor/kl_loss" : "actor/ppo_kl";
    const struct {
        const char *title, *metric;
    } spec[5] = {
        {"reward", "critic/score/mean"},
        {"KL", kl},
        {"entropy", "actor/entropy"},
        {"response length", "response_length/mean"},
        {"throughput (tokens/s)", "perf/throughput"},
    };
    for (int i = 0; i < 5; i++) {
        panels[i].title = spec[i].title;
        panels[i].subtitle = spec[i].metric;
        panels[i].ns = 1;
        panels[i].s[0].color = palette[0];
        panels[i].s[0].label = xstrdup("train");
        fill_series(&panels[i].s[0], h, spec[i].metric);
    }
    /* the reward panel also shows the exact-answer accuracy, apart from format credit, where it is known */
    if (history_has(h, "critic/acc/mean")) {
        struct series *s = &panels[0].s[panels[0].ns++];
        s->color = "#17becf"; /* not in the palette the validation series cycle through */
        s->label = xstrdup("train acc");
        fill_series(s, h, "critic/acc/mean");
    }
    int before_val = panels[0].ns;
    add_val_series(&panels[0], h, "reward");
    add_val_series(&panels[0], h, "acc");
    shorten_val_labels(&panels[0]);
    if (panels[0].ns > before_val)
        panels[0].subtitle = before_val > 1 ? "critic/{score,acc}/mean; points: val-core/*/{reward,acc}/mean@N"
                                            : "critic/score/mean; points: val-core/*/reward/mean@N";
    else if (before_val > 1)
        panels[0].subtitle = "critic/{score,acc}/mean";

    int rows = (6 + COLS - 1) / COLS;
    int width = COLS * PANEL_W + (COLS + 1) * GAP;
    int height = HEADER_H + rows * PANEL_H + rows * GAP;
    struct mbuf b = {0};
    mbuf_printf(&b,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
                "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
                width, height, width, height);
    mbuf_puts(&b, "<title>");
    put_xml(&b, title && *title ? title : "training metrics");
    mbuf_puts(&b, "</title>\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
    mbuf_printf(&b, "<text x=\"%d\" y=\"28\" font-size=\"18\" font-weight=\"bold\">", GAP);
    put_xml(&b, title && *title ? title : "training metrics");
    mbuf_puts(&b, "</text>\n");
    if (h->n > 0)
        mbuf_printf(&b,
                    "<text x=\"%d\" y=\"28\" font-size=\"12\" fill=\"#666666\" text-anchor=\"end\">steps %ld to %ld"
                    " (%zu recorded)</text>\n",
                    width - GAP, h->steps[0].step, h->steps[h->n - 1].step, h->n);
    for (int i = 0; i <= 5; i++) {
        int col = i % COLS, row = i / COLS;
        double ox = GAP + col * (PANEL_W + GAP);
        double oy = HEADER_H + row * (PANEL_H + GAP);
        if (i < 5)
            draw_panel(&b, &panels[i], ox, oy);
        else
            draw_summary(&b, panels, 5, ox, oy);
    }
    for (int i = 0; i < 5; i++)
        free_panel(&panels[i]);
    mbuf_puts(&b, "</svg>\n");
    int rc = metrics_write_file_atomic(path, b.p, b.n, SUBSYS);
    mbuf_free(&b);
    return rc;
}
