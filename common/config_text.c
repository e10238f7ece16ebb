/* The run's configuration as text, for the control plane: one `name=value` line per key that shapes the run,
 * read back into a configuration, and compared key by key. See config.h. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"

bool config_key_shapes_run(const char *name)
{
    /* trainer.max_consecutive_skipped_steps only decides when a failing run gives up; the flight recorder only
     * watches (a rank may keep a longer ring than its peers) */
    return strncmp(name, "grpod.", 6) != 0 && strcmp(name, "trainer.log_level") != 0 &&
           strcmp(name, "trainer.max_consecutive_skipped_steps") != 0 &&
           strcmp(name, "trainer.flight_recorder.size") != 0;
}

/* The keys that count the ranks of each side: a grpod compares the numbers they give, not how they are spelt. */
static bool count_key(const char *name)
{
    static const char *const keys[] = {"placement.trainer_ranks", "placement.rollout_ranks", "trainer.nnodes",
                                       "trainer.n_gpus_per_node", "rollout.nnodes",          "rollout.n_gpus_per_node"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (strcmp(name, keys[i]) == 0)
            return true;
    return false;
}

bool config_given(const struct grpo_config *c, const char *name)
{
    const struct cfg_key_info *k = config_find(name);
    if (!k)
        return false;
    for (int i = 0; i < config_num_keys(); i++)
        if (config_key(i) == k)
            return strcmp(c->origin[i], "default") != 0;
    return false;
}

/* A growing text buffer. */
struct text {
    char *s;
    size_t n, cap;
};

static void put(struct text *t, const char *s, size_t n)
{
    if (t->n + n + 1 > t->cap) {
        t->cap = (t->n + n + 1) * 2;
        t->s = xrealloc(t->s, t->cap);
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = 0;
}

/* A value on one line: a backslash as \\, control characters as \n, \r, \t or \xHH. */
static void put_escaped(struct text *t, const char *v)
{
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        char e[8];
        if (*p == '\\')
            put(t, "\\\\", 2);
        else if (*p == '\n')
            put(t, "\\n", 2);
        else if (*p == '\r')
            put(t, "\\r", 2);
        else if (*p == '\t')
            put(t, "\\t", 2);
        else if (*p < 0x20 || *p == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", *p);
            put(t, e, 4);
        } else
            put(t, (const char *)p, 1);
    }
}

char *config_run_text(const struct grpo_config *c, unsigned flags)
{
    struct text t = {0};
    put(&t, "", 0);
    for (int i = 0; i < config_num_keys(); i++) {
        const struct cfg_key_info *k = config_key(i);
        if (!config_key_shapes_run(k->name) || ((flags & CONFIG_TEXT_GIVEN) && !strcmp(c->origin[i], "default")) ||
            ((flags & CONFIG_TEXT_NO_COUNTS) && count_key(k->name)))
            continue;
        put(&t, k->name, strlen(k->name));
        put(&t, "=", 1);
        if (k->type == CFG_STR || k->type == CFG_ENUM) {
            put_escaped(&t, *(char *const *)((const char *)c + k->offset));
        } else {
            char val[512];
            config_value_text(c, k, val, sizeof val);
            put(&t, val, strlen(val));
        }
        put(&t, "\n", 1);
    }
    return t.s;
}

/* Undo put_escaped in place (out may be in). -1 for a bad escape. */
static int unescape(const char *in, char *out)
{
    while (*in) {
        if (*in != '\\') {
            *out++ = *in++;
            continue;
        }
        char e = in[1];
        if (e == '\\' || e == 'n' || e == 'r' || e == 't') {
            *out++ = e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : '\\';
            in += 2;
        } else if (e == 'x' && in[2] && in[3]) {
            char hex[3] = {in[2], in[3], 0}, *end;
            long v = strtol(hex, &end, 16);
            if (*end || v < 1)
                return -1;
            *out++ = (char)v;
            in += 4;
        } else {
            return -1;
        }
    }
    *out = 0;
    return 0;
}

int config_apply_run_text(struct grpo_config *c, const char *text, size_t max, const char *origin, char *why,
                          size_t whylen)
{
    size_t len = strnlen(text, max + 1);
    if (len > max) {
        snprintf(why, whylen, "%s is longer than %zu bytes", origin, max);
        return -1;
    }
    char *copy = xstrdup(text);
    int line = 0, rc = 0;
    for (char *p = copy, *next; *p && rc == 0; p = next) {
        line++;
        char *nl = strchr(p, '\n');
        next = nl ? nl + 1 : p + strlen(p);
        if (nl)
            *nl = 0;
        char *eq = strchr(p, '=');
        if (!eq) {
            snprintf(why, whylen, "%s, line %d: not name=value ('%.60s')", origin, line, p);
            rc = -1;
            break;
        }
        *eq = 0;
        const char *name = p;
        char *value = eq + 1;
        if (!config_find(name) || !config_key_shapes_run(name)) {
            snprintf(why, whylen, "%s, line %d: '%.80s' is not a key that shapes the run", origin, line, name);
            rc = -1;
        } else if (unescape(value, value) != 0) {
            snprintf(why, whylen, "%s, line %d: %s has a bad escape in its value", origin, line, name);
            rc = -1;
        } else {
            struct cfg_error err;
            if (config_set(c, name, value, origin, &err) != 0) {
                snprintf(why, whylen, "%s (line %d)", err.msg, line);
                rc = -1;
            }
        }
    }
    free(copy);
    return rc;
}

/* The line of `name` in a run text: its value's start and length; NULL when absent. */
static const char *find_value(const char *text, const char *name, size_t nlen, size_t *vlen)
{
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        if (l > nlen && strncmp(p, name, nlen) == 0 && p[nlen] == '=') {
            *vlen = l - nlen - 1;
            return p + nlen + 1;
        }
        p += l + (nl != NULL);
    }
    return NULL;
}

/* Append "name (A: v, B: w)" to out, values cut at 40 bytes. */
static void note_difference(char *out, size_t outlen, const char *name, size_t nlen, const char *a_name, const char *av,
                            size_t al, const char *b_name, const char *bv, size_t bl)
{
    size_t n = strlen(out);
    if (n + 1 >= outlen)
        return;
    snprintf(out + n, outlen - n, "%s%.*s (%s: %s%.*s%s, %s: %s%.*s%s)", n ? ", " : "", (int)nlen, name, a_name,
             av ? "" : "(not set)", av ? (int)(al > 40 ? 40 : al) : 0, av ? av : "", av && al > 40 ? "..." : "", b_name,
             bv ? "" : "(not set)", bv ? (int)(bl > 40 ? 40 : bl) : 0, bv ? bv : "", bv && bl > 40 ? "..." : "");
}

int config_text_diff(const char *a, const char *a_name, const char *b, const char *b_name, bool only_a, int show,
                     char *out, size_t outlen)
{
    int count = 0;
    char *list = xcalloc(1, outlen);
    for (int pass = 0; pass < (only_a ? 1 : 2); pass++) {
        const char *x = pass ? b : a, *y = pass ? a : b;
        for (const char *p = x; *p;) {
            const char *nl = strchr(p, '\n');
            size_t l = nl ? (size_t)(nl - p) : strlen(p);
            const char *eq = memchr(p, '=', l);
            if (eq) {
                size_t nlen = (size_t)(eq - p), xl = l - nlen - 1, yl = 0;
                const char *yv = find_value(y, p, nlen, &yl);
                /* the second pass adds only the keys the first text lacks */
                bool differs = pass ? !yv : !yv || yl != xl || memcmp(yv, eq + 1, xl) != 0;
                if (differs && count++ < show) {
                    if (pass)
                        note_difference(list, outlen, p, nlen, a_name, NULL, 0, b_name, eq + 1, xl);
                    else
                        note_difference(list, outlen, p, nlen, a_name, eq + 1, xl, b_name, yv, yl);
                }
            }
            p += l + (nl != NULL);
        }
    }
    if (count > show)
        snprintf(out, outlen, "%s and %d more", list, count - show);
    else
        snprintf(out, outlen, "%s", list);
    free(list);
    return count;
}
