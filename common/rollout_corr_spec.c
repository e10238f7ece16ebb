#include "rollout_corr_spec.h"
#include "common/config_key_names.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const rc_rs_names[RS_NSTATS] = {"token_k1",    "token_k2",   "token_k3",    "seq_sum_k1",
                                            "seq_sum_k2",  "seq_sum_k3", "seq_mean_k1", "seq_mean_k2",
                                            "seq_mean_k3", "seq_max_k2", "seq_max_k3"};

static bool is_null(const char *s)
{
    return !s || !*s || strcmp(s, "null") == 0 || strcmp(s, "~") == 0 || strcmp(s, "None") == 0 ||
           strcmp(s, "none") == 0;
}

/* The next comma-separated item at *p, spaces trimmed: its start, its length in *n; *p moves past it. */
static const char *next_item(const char **p, size_t *n)
{
    const char *c = strchr(*p, ','), *q = *p;
    *n = c ? (size_t)(c - *p) : strlen(*p);
    *p += c ? *n + 1 : *n;
    while (*n && *q == ' ')
        q++, (*n)--;
    while (*n && q[*n - 1] == ' ')
        (*n)--;
    return q;
}

/* s[0..n) without surrounding blanks, as a number (Python's float()); -1 if it is not one. */
static int parse_num(const char *s, size_t n, double *v)
{
    while (n && (*s == ' ' || *s == '\t'))
        s++, n--;
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    if (!n || n > 63)
        return -1;
    char buf[64];
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    errno = 0;
    *v = strtod(buf, &end);
    return *end || errno == ERANGE ? -1 : 0;
}

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

bool rc_rs_is_k1(enum rc_rs_stat s) { return s == RS_TOKEN_K1 || s == RS_SEQ_SUM_K1 || s == RS_SEQ_MEAN_K1; }

int rollout_corr_parse(const char *rollout_is, const char *is_threshold, bool batch_normalize, const char *rollout_rs,
                       const char *rs_threshold, bool bypass, const char *loss_type, struct rollout_corr *rc, char *err,
                       size_t errlen)
{
    memset(rc, 0, sizeof *rc);
    rc->batch_normalize = batch_normalize;
    rc->bypass = bypass;
    if (!loss_type || strcmp(loss_type, "ppo_clip") == 0)
        rc->reinforce = false;
    else if (strcmp(loss_type, "reinforce") == 0)
        rc->reinforce = true;
    else
        return fail(err, errlen, KEY_alg_rc_loss_type "=%s: Invalid loss_type: must be 'reinforce' or 'ppo_clip'",
                    loss_type);
    if (is_null(rollout_is))
        rc->is = RC_OFF;
    else if (strcmp(rollout_is, "token") == 0)
        rc->is = RC_TOKEN;
    else if (strcmp(rollout_is, "sequence") == 0)
        rc->is = RC_SEQUENCE;
    else
        return fail(err, errlen,
                    KEY_alg_rc_rollout_is "=%s: Invalid rollout_is: must be one of token, sequence "
                                          "(or null)%s",
                    rollout_is,
                    strcmp(rollout_is, "geometric") == 0
                        ? "; verl v0.9 has no geometric IS: reject by the geometric mean with rollout_rs=seq_mean_k1"
                        : "");
    if (rc->is != RC_OFF) { /* verl parses the threshold only where IS is on */
        const char *spec = is_null(is_threshold) ? "" : is_threshold;
        const char *us = strchr(spec, '_');
        double lo = 0, up;
        if (!*spec)
            return fail(err, errlen,
                        KEY_alg_rc_rollout_is_threshold " must not be empty with "
                                                        "rollout_is set");
        if (us ? parse_num(spec, (size_t)(us - spec), &lo) != 0 || parse_num(us + 1, strlen(us + 1), &up) != 0
               : parse_num(spec, strlen(spec), &up) != 0)
            return fail(err, errlen,
                        KEY_alg_rc_rollout_is_threshold "='%s': Invalid rollout_is_threshold: a "
                                                        "number (TIS's upper bound) or 'lower_upper' (IcePop's bounds)",
                        spec);
        if (!(up > 0))
            return fail(err, errlen, KEY_alg_rc_rollout_is_threshold "='%s': the upper bound must be positive", spec);
        if (us && !(lo > 0))
            return fail(err, errlen, KEY_alg_rc_rollout_is_threshold "='%s': the lower bound must be positive", spec);
        if (us && lo > up)
            return fail(err, errlen,
                        KEY_alg_rc_rollout_is_threshold "='%s': the lower bound must be <= the "
                                                        "upper bound",
                        spec);
        rc->is_upper = up;
        rc->is_lower = us ? lo : 0;
    }
    if (is_null(rollout_rs))
        return 0;
    /* comma-separated options, every one must pass */
    for (const char *p = rollout_rs; *p;) {
        size_t n;
        const char *q = next_item(&p, &n);
        if (!n)
            continue;
        int k = -1;
        for (int s = 0; s < RS_NSTATS; s++)
            if (strlen(rc_rs_names[s]) == n && strncmp(q, rc_rs_names[s], n) == 0)
                k = s;
        if (k < 0) {
            char known[256] = "";
            for (int s = 0; s < RS_NSTATS; s++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", s ? ", " : "", rc_rs_names[s]);
            return fail(err, errlen,
                        KEY_alg_rc_rollout_rs
                        "=%s: Invalid rollout_rs option '%.*s': must be one "
                        "of %s (comma-separated; verl v0.7's token, sequence and geometric are token_k1, seq_sum_k1 "
                        "and seq_mean_k1 in v0.9)",
                        rollout_rs, (int)n, q, known);
        }
        bool dup = false;
        for (int j = 0; j < rc->n_rs; j++)
            dup |= rc->rs[j].stat == (enum rc_rs_stat)k;
        if (!dup)
            rc->rs[rc->n_rs++].stat = (enum rc_rs_stat)k;
    }
    if (!rc->n_rs)
        return fail(err, errlen,
                    KEY_alg_rc_rollout_rs "=%s: rollout_rs must contain at least one "
                                          "valid option",
                    rollout_rs);
    if (is_null(rs_threshold))
        return fail(err, errlen,
                    KEY_alg_rc_rollout_rs "=%s: rollout_rs_threshold must be explicitly provided "
                                          "when rollout_rs is enabled",
                    rollout_rs);
    /* one threshold for every option, or one per option */
    const char *spec[RS_NSTATS];
    size_t slen[RS_NSTATS];
    int ns = 0;
    for (const char *p = rs_threshold; *p;) {
        size_t n;
        const char *q = next_item(&p, &n);
        if (!n)
            continue;
        if (ns == RS_NSTATS || ns == rc->n_rs)
            return fail(err, errlen,
                        KEY_alg_rc_rollout_rs_threshold
                        "='%s': expects either one threshold shared "
                        "by all options or exactly %d thresholds to match the rollout_rs options",
                        rs_threshold, rc->n_rs);
        spec[ns] = q, slen[ns++] = n;
    }
    if (ns == 0)
        return fail(err, errlen, KEY_alg_rc_rollout_rs_threshold " must contain at least one value");
    if (ns != 1 && ns != rc->n_rs)
        return fail(err, errlen,
                    KEY_alg_rc_rollout_rs_threshold
                    "='%s': expects either one threshold shared by "
                    "all options or exactly %d thresholds to match the rollout_rs options",
                    rs_threshold, rc->n_rs);
    for (int j = 0; j < rc->n_rs; j++) {
        const char *q = spec[ns == 1 ? 0 : j];
        const size_t n = slen[ns == 1 ? 0 : j];
        const char *us = memchr(q, '_', n);
        struct rc_rs *o = &rc->rs[j];
        if (rc_rs_is_k1(o->stat)) {
            double lo, up;
            if (us ? parse_num(q, (size_t)(us - q), &lo) != 0 || parse_num(us + 1, n - (size_t)(us + 1 - q), &up) != 0
                   : parse_num(q, n, &up) != 0)
                return fail(err, errlen,
                            KEY_alg_rc_rollout_rs_threshold ": Invalid numeric threshold "
                                                            "'%.*s' for option '%s'",
                            (int)n, q, rc_rs_names[o->stat]);
            if (!us)
                lo = 1.0 / up;
            if (!(lo > 0) || !(up > 0))
                return fail(err, errlen,
                            KEY_alg_rc_rollout_rs_threshold ": thresholds for option '%s' must be "
                                                            "positive, got %.*s",
                            rc_rs_names[o->stat], (int)n, q);
            if (lo > up)
                return fail(err, errlen,
                            KEY_alg_rc_rollout_rs_threshold ": thresholds for option '%s' must be "
                                                            "lower <= upper, got %.*s",
                            rc_rs_names[o->stat], (int)n, q);
            o->lower = lo, o->upper = up;
        } else {
            double up;
            if (us)
                return fail(err, errlen,
                            KEY_alg_rc_rollout_rs_threshold " for option '%s' must provide a single "
                                                            "upper bound without '_'. Received '%.*s'",
                            rc_rs_names[o->stat], (int)n, q);
            if (parse_num(q, n, &up) != 0)
                return fail(err, errlen,
                            KEY_alg_rc_rollout_rs_threshold ": Invalid numeric threshold "
                                                            "'%.*s' for option '%s'",
                            (int)n, q, rc_rs_names[o->stat]);
            if (!(up > 0))
                return fail(err, errlen,
                            KEY_alg_rc_rollout_rs_threshold ": threshold for option '%s' must be "
                                                            "positive, got %.*s",
                            rc_rs_names[o->stat], (int)n, q);
            o->lower = 0, o->upper = up;
        }
    }
    return 0;
}
