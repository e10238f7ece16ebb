/* RUN_DIR/metrics.jsonl: one JSON object per step, appended and flushed;
 * truncation after a step for resumed runs; a reader for the history. */
#include "worker/metrics/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/fs.h"
#include "common/check.h"
#include "common/log.h"
#include "worker/metrics/metrics_internal.h"

#define SUBSYS "metrics"

/* The shortest of %.15g/%.16g/%.17g that reads back to v; null for NaN and +-Inf. */
static void put_number(struct mbuf *b, double v)
{
    if (!isfinite(v)) {
        mbuf_puts(b, "null");
        return;
    }
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    mbuf_puts(b, buf);
}

/* A JSON string: quotes, backslash and control characters escaped; other bytes (UTF-8) as they are. */
static void put_string(struct mbuf *b, const char *s)
{
    mbuf_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': mbuf_puts(b, "\\\""); break;
        case '\\': mbuf_puts(b, "\\\\"); break;
        case '\n': mbuf_puts(b, "\\n"); break;
        case '\r': mbuf_puts(b, "\\r"); break;
        case '\t': mbuf_puts(b, "\\t"); break;
        case '\b': mbuf_puts(b, "\\b"); break;
        case '\f': mbuf_puts(b, "\\f"); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                mbuf_printf(b, "\\u%04x", *p);
            else
                mbuf_putc(b, (char)*p);
        }
    }
    mbuf_putc(b, '"');
}

char *metrics_jsonl_format(long step, const struct metrics *m)
{
    struct mbuf b = {0};
    mbuf_printf(&b, "{\"step\": %ld", step);
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->items[i].name, "step") == 0)
            continue; /* the key is taken */
        mbuf_puts(&b, ", ");
        put_string(&b, m->items[i].name);
        mbuf_puts(&b, ": ");
        put_number(&b, m->items[i].value);
    }
    mbuf_puts(&b, "}\n");
    return mbuf_take(&b);
}

/* path exists and is not a regular file: a device or a pipe (/dev/null, /dev/full) is written, never read
 * back (reading /dev/full or /dev/zero never ends) */
static bool special_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISREG(sb.st_mode);
}

int metrics_jsonl_open(struct metrics_jsonl *w, const char *path)
{
    memset(w, 0, sizeof *w);
    FILE *f = fopen(path, "a+b");
    if (!f) {
        metrics_output_failed(SUBSYS, path, "cannot open %s: %s", path, check_errno_text());
        return -1;
    }
    /* a line torn by a crash must not swallow the next one */
    if (!special_file(path) && fseek(f, -1, SEEK_END) == 0) {
        int c = fgetc(f);
        if (c != '\n' && c != EOF) {
            log_warn(SUBSYS, "%s: last line has no newline (torn write?); ending it", path);
            fseek(f, 0, SEEK_END); /* a positioning call between a read and a write */
            fputc('\n', f);
        }
    }
    fseek(f, 0, SEEK_END);
    w->f = f;
    w->path = xstrdup(path);
    return 0;
}

int metrics_jsonl_write(struct metrics_jsonl *w, long step, const struct metrics *m)
{
    if (!w->f)
        return -1;
    char *line = metrics_jsonl_format(step, m);
    size_t len = strlen(line);
    int rc = 0;
    if (fwrite(line, 1, len, w->f) != len || fflush(w->f) != 0) {
        metrics_output_failed(SUBSYS, w->path, "writing %s: %s", w->path, check_errno_text());
        clearerr(w->f);
        rc = -1;
    }
    free(line);
    return rc;
}

int metrics_jsonl_sync(struct metrics_jsonl *w) { return metrics_stream_sync(w->f, w->path, SUBSYS); }

void metrics_jsonl_close(struct metrics_jsonl *w)
{
    metrics_stream_close(w->f, w->path, SUBSYS);
    free(w->path);
    memset(w, 0, sizeof *w);
}

/* Parse one line: 1 with *step and m filled, 0 for a blank line, -1 when it is not a metrics object
 * (why in err). */
static int parse_line(const char *line, size_t len, long *step, struct metrics *m, char *err, size_t errlen)
{
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n'))
        i++;
    if (i == len)
        return 0;
    json_error_t jerr;
    json_t *root = json_loadb(line, len, 0, &jerr);
    if (!root) {
        snprintf(err, errlen, "%s", jerr.text);
        return -1;
    }
    json_t *js = json_object_get(root, "step");
    if (!json_is_object(root) || !json_is_integer(js)) {
        snprintf(err, errlen, "not an object with an integer \"step\"");
        json_decref(root);
        return -1;
    }
    *step = (long)json_integer_value(js);
    metrics_clear(m);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "step") == 0)
            continue;
        if (json_is_number(val))
            metrics_set(m, key, json_number_value(val));
        else if (json_is_null(val))
            metrics_set(m, key, NAN);
    }
    json_decref(root);
    return 1;
}

long metrics_jsonl_read(const char *path, metrics_jsonl_cb cb, void *ctx)
{
    if (special_file(path)) {
        log_warn(SUBSYS, "%s is not a regular file: nothing read back from it", path);
        return 0;
    }
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    if (!f) {
        log_error(SUBSYS, "cannot open %s: %s", path, why);
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0, delivered = 0;
    struct metrics m;
    metrics_init(&m);
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        long step;
        char err[200];
        int rc = parse_line(line, (size_t)len, &step, &m, err, sizeof err);
        if (rc < 0) {
            log_warn(SUBSYS, "%s:%ld: skipped: %s", path, lineno, err);
            continue;
        }
        if (rc == 0)
            continue;
        delivered++;
        if (cb && cb(step, &m, ctx) != 0)
            break;
    }
    metrics_free(&m);
    free(line);
    fclose(f);
    return delivered;
}

long metrics_jsonl_truncate_after(const char *path, long step)
{
    if (special_file(path))
        return 0; /* nothing to read or rewrite */
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    if (!f) {
        if (errno == ENOENT)
            return 0;
        log_error(SUBSYS, "cannot open %s: %s", path, why);
        return -1;
    }
    struct mbuf keep = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long dropped = 0, lineno = 0;
    bool rewrite = false;
    struct metrics m;
    metrics_init(&m);
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        long s;
        char err[200];
        int rc = parse_line(line, (size_t)len, &s, &m, err, sizeof err);
        if (rc == 0) {
            rewrite = true; /* blank lines go */
            continue;
        }
        if (rc < 0) {
            log_warn(SUBSYS, "%s:%ld: dropped unreadable line: %s", path, lineno, err);
            dropped++;
            continue;
        }
        if (s > step) {
            dropped++;
            continue;
        }
        mbuf_putn(&keep, line, (size_t)len);
        if (line[len - 1] != '\n') {
            mbuf_putc(&keep, '\n');
            rewrite = true;
        }
    }
    bool read_error = ferror(f);
    metrics_free(&m);
    free(line);
    fclose(f);
    if (read_error) {
        log_error(SUBSYS, "reading %s failed", path);
        mbuf_free(&keep);
        return -1;
    }
    int rc = 0;
    if (dropped > 0 || rewrite)
        rc = metrics_write_file_atomic(path, keep.p ? keep.p : "", keep.n, SUBSYS);
    mbuf_free(&keep);
    if (rc != 0)
        return -1;
    if (dropped > 0)
        log_info(SUBSYS, "%s: dropped %ld line(s) after step %ld", path, dropped, step);
    return dropped;
}
