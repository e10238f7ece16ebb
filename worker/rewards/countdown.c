/* Countdown (TinyZero): a safe, exact evaluator for the equation in the
 * response and the scorer around it. The evaluator is a recursive-descent
 * parser over a fixed grammar with a depth limit, computing in reduced
 * rationals of 64-bit integers with overflow checks; nothing is ever passed to
 * an interpreter. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scorers.h"

struct rat {
    int64_t n, d; /* d > 0, gcd(n, d) == 1 */
};

struct parser {
    const char *s;
    size_t len, i;
    int depth;
    int64_t *lits;
    int nlits;
    char *err;
    size_t errlen;
    bool failed;
};

static void fail(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(struct parser *p, const char *fmt, ...)
{
    if (p->failed)
        return;
    p->failed = true;
    if (p->err && p->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err, p->errlen, fmt, ap);
        va_end(ap);
    }
}

static int64_t gcd64(int64_t a, int64_t b)
{
    if (a < 0)
        a = -a;
    if (b < 0)
        b = -b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Build n/d reduced with d > 0; false on overflow (INT64_MIN cannot be negated). */
static bool make_rat(int64_t n, int64_t d, struct rat *out)
{
    if (n == INT64_MIN || d == INT64_MIN || d == 0)
        return false;
    if (d < 0) {
        n = -n;
        d = -d;
    }
    int64_t g = gcd64(n, d);
    if (g > 1) {
        n /= g;
        d /= g;
    }
    out->n = n;
    out->d = d;
    return true;
}

static struct rat binop(struct parser *p, struct rat a, char op, struct rat b, size_t col)
{
    struct rat r = {0, 1};
    int64_t x, y, z;
    bool ovf = false;
    switch (op) {
    case '+':
    case '-':
        ovf |= __builtin_mul_overflow(a.n, b.d, &x);
        ovf |= __builtin_mul_overflow(b.n, a.d, &y);
        ovf |= op == '+' ? __builtin_add_overflow(x, y, &z) : __builtin_sub_overflow(x, y, &z);
        ovf |= __builtin_mul_overflow(a.d, b.d, &y);
        break;
    case '*':
        ovf |= __builtin_mul_overflow(a.n, b.n, &z);
        ovf |= __builtin_mul_overflow(a.d, b.d, &y);
        break;
    default: /* '/' */
        if (b.n == 0) {
            fail(p, "division by zero at column %zu", col + 1);
            return r;
        }
        ovf |= __builtin_mul_overflow(a.n, b.d, &z);
        ovf |= __builtin_mul_overflow(a.d, b.n, &y);
        break;
    }
    if (ovf || !make_rat(z, y, &r))
        fail(p, "overflow at column %zu", col + 1);
    return r;
}

static void skip_ws(struct parser *p)
{
    while (p->i < p->len && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static void unexpected(struct parser *p, const char *expected)
{
    if (p->i >= p->len) {
        fail(p, "expected %s at the end", expected);
        return;
    }
    unsigned char c = (unsigned char)p->s[p->i];
    if (c >= 0x20 && c < 0x7f)
        fail(p, "unexpected character '%c' at column %zu (expected %s)", c, p->i + 1, expected);
    else
        fail(p, "unexpected byte 0x%02x at column %zu (expected %s)", c, p->i + 1, expected);
}

static struct rat parse_expr(struct parser *p);

static struct rat parse_factor(struct parser *p)
{
    struct rat zero = {0, 1};
    skip_ws(p);
    if (p->failed)
        return zero;
    if (p->i < p->len && p->s[p->i] == '(') {
        if (++p->depth > COUNTDOWN_MAX_DEPTH) {
            fail(p, "parentheses nested deeper than %d", COUNTDOWN_MAX_DEPTH);
            return zero;
        }
        p->i++;
        struct rat v = parse_expr(p);
        skip_ws(p);
        if (p->failed)
            return zero;
        if (p->i >= p->len || p->s[p->i] != ')') {
            unexpected(p, "')'");
            return zero;
        }
        p->i++;
        p->depth--;
        return v;
    }
    if (p->i < p->len && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        size_t start = p->i;
        int64_t v = 0;
        while (p->i < p->len && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
            if (p->i - start >= 9) {
                fail(p, "number at column %zu has more than 9 digits", start + 1);
                return zero;
            }
            v = v * 10 + (p->s[p->i] - '0');
            p->i++;
        }
        if (p->nlits >= COUNTDOWN_MAX_NUMBERS) {
            fail(p, "more than %d numbers", COUNTDOWN_MAX_NUMBERS);
            return zero;
        }
        p->lits[p->nlits++] = v;
        struct rat r = {v, 1};
        return r;
    }
    unexpected(p, "a number or '('");
    return zero;
}

static struct rat parse_term(struct parser *p)
{
    struct rat v = parse_factor(p);
    for (;;) {
        skip_ws(p);
        if (p->failed || p->i >= p->len || (p->s[p->i] != '*' && p->s[p->i] != '/'))
            return v;
        char op = p->s[p->i];
        size_t col = p->i++;
        struct rat w = parse_factor(p);
        if (p->failed)
            return v;
        v = binop(p, v, op, w, col);
    }
}

static struct rat parse_expr(struct parser *p)
{
    struct rat v = parse_term(p);
    for (;;) {
        skip_ws(p);
        if (p->failed || p->i >= p->len || (p->s[p->i] != '+' && p->s[p->i] != '-'))
            return v;
        char op = p->s[p->i];
        size_t col = p->i++;
        struct rat w = parse_term(p);
        if (p->failed)
            return v;
        v = binop(p, v, op, w, col);
    }
}

int countdown_eval(const char *expr, size_t len, int64_t *num, int64_t *den, int64_t *literals, int *n_literals,
                   char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (len > COUNTDOWN_MAX_EXPR) {
        if (err && errlen)
            snprintf(err, errlen, "equation longer than %d bytes", COUNTDOWN_MAX_EXPR);
        return -1;
    }
    int64_t scratch[COUNTDOWN_MAX_NUMBERS];
    struct parser p = {.s = expr, .len = len, .lits = literals ? literals : scratch, .err = err, .errlen = errlen};
    struct rat v = parse_expr(&p);
    skip_ws(&p);
    if (!p.failed && p.i < p.len)
        unexpected(&p, "an operator");
    if (!p.failed && p.nlits == 0)
        fail(&p, "empty equation");
    if (n_literals)
        *n_literals = p.nlits;
    if (p.failed)
        return -1;
    *num = v.n;
    *den = v.d;
    return 0;
}

int countdown_parse_ground_truth(const char *gt, int64_t *target, int64_t *numbers, int *n_numbers, char *err,
                                 size_t errlen)
{
    json_error_t je;
    json_t *root = json_loads(gt ? gt : "", JSON_DECODE_ANY, &je);
    int rc = -1;
    if (!root) {
        snprintf(err, errlen, "countdown ground truth is not JSON: %s", je.text);
        return -1;
    }
    json_t *t = json_object_get(root, "target");
    json_t *a = json_object_get(root, "numbers");
    if (!a)
        a = json_object_get(root, "nums");
    if (!json_is_object(root) || !json_is_integer(t) || !json_is_array(a)) {
        snprintf(err, errlen, "countdown ground truth must be {\"target\": INT, \"numbers\": [INT, ...]}");
        goto out;
    }
    size_t n = json_array_size(a);
    if (n == 0 || n > COUNTDOWN_MAX_NUMBERS) {
        snprintf(err, errlen, "countdown ground truth has %zu numbers (1 to %d allowed)", n, COUNTDOWN_MAX_NUMBERS);
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        json_t *v = json_array_get(a, k);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 999999999) {
            snprintf(err, errlen, "countdown ground truth: numbers[%zu] is not an integer in [0, 999999999]", k);
            goto out;
        }
        numbers[k] = json_integer_value(v);
    }
    *target = json_integer_value(t);
    *n_numbers = (int)n;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Last "<answer>...</answer>" pair: the last closing tag and the last opening tag before it. */
static bool find_answer_tags(const char *s, const char **content, size_t *len)
{
    const char *close = NULL, *p = s;
    while ((p = strstr(p, "</answer>")) != NULL)
        close = p++;
    if (!close)
        return false;
    const char *open = NULL;
    for (p = s; (p = strstr(p, "<answer>")) != NULL && p < close; p++)
        open = p;
    if (!open)
        return false;
    *content = open + 8;
    *len = (size_t)(close - open - 8);
    return true;
}

/* Is s[0..n) (trimmed) a plain integer equal to target? */
static bool is_integer_text(const char *s, size_t n, int64_t target)
{
    while (n > 0 && (*s == ' ' || *s == '\t' || *s == '\n'))
        s++, n--;
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n'))
        n--;
    if (n == 0 || n > 12)
        return false;
    char buf[16];
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end;
    long long v = strtoll(buf, &end, 10);
    return *end == '\0' && (buf[0] == '-' || (buf[0] >= '0' && buf[0] <= '9')) && v == target;
}

double reward_score_countdown(const char *solution, const char *ground_truth, char *why, size_t whylen)
{
    if (why && whylen)
        why[0] = '\0';
    char gerr[256];
    int64_t target, numbers[COUNTDOWN_MAX_NUMBERS];
    int nn;
    if (countdown_parse_ground_truth(ground_truth, &target, numbers, &nn, gerr, sizeof gerr) < 0) {
        if (why && whylen)
            snprintf(why, whylen, "%s", gerr);
        return 0.0;
    }
    const char *eq;
    size_t len;
    if (!find_answer_tags(solution, &eq, &len))
        return 0.0;
    const double wrong = REWARD_FORMAT_WEIGHT;
    if (len > COUNTDOWN_MAX_EXPR)
        return wrong;
    /* an optional "= TARGET" after the expression */
    const char *eqsign = memchr(eq, '=', len);
    if (eqsign) {
        size_t rest = len - (size_t)(eqsign - eq) - 1;
        if (memchr(eqsign + 1, '=', rest) || !is_integer_text(eqsign + 1, rest, target))
            return wrong;
        len = (size_t)(eqsign - eq);
    }
    int64_t num, den, lits[COUNTDOWN_MAX_NUMBERS];
    int nl;
    char eerr[128];
    if (countdown_eval(eq, len, &num, &den, lits, &nl, eerr, sizeof eerr) < 0)
        return wrong;
    /* each given number exactly once (TinyZero's rule) */
    if (nl != nn)
        return wrong;
    qsort(lits, (size_t)nl, sizeof lits[0], cmp_i64);
    qsort(numbers, (size_t)nn, sizeof numbers[0], cmp_i64);
    if (memcmp(lits, numbers, (size_t)nn * sizeof lits[0]) != 0)
        return wrong;
    return den == 1 && num == target ? 1.0 : wrong;
}
