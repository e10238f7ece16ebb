/* The built-in calculator tool: exact arithmetic on integers of any length and on decimal floats, with
 * Python's meaning for every operator (+ - * / // % **, parentheses, unary minus and plus; // and % round
 * toward minus infinity; ** binds tighter than unary minus and to the right; int / int and int ** -n give a
 * float) and Python's way of printing the result. Owns: the expression parser (recursive descent), the
 * integers (sign and magnitude in base 10^9 limbs), the float printing (Python's shortest repr), and the limits
 * (expression length, nesting, digits of any integer, exponent size), each of which answers an error message. */
#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "worker/agent/tool.h"

#define CALC_MAX_EXPR 10000   /* characters of an expression */
#define CALC_MAX_DIGITS 10000 /* decimal digits of any integer, given or computed */
#define CALC_MAX_DEPTH 200    /* nesting of parentheses and unary signs */
#define BASE 1000000000u
#define BASE_DIGITS 9

/* ---- integers ---- */

struct big {
    int neg;
    size_t n;    /* limbs in use; 0 is n == 0 */
    uint32_t *d; /* little-endian limbs < BASE */
};

static void big_free(struct big *a)
{
    free(a->d);
    a->d = NULL;
    a->n = 0;
    a->neg = 0;
}

static void big_trim(struct big *a)
{
    while (a->n && a->d[a->n - 1] == 0)
        a->n--;
    if (!a->n)
        a->neg = 0;
}

static struct big big_alloc(size_t n)
{
    struct big a = {0, n, xcalloc(n ? n : 1, sizeof(uint32_t))};
    return a;
}

static struct big big_copy(const struct big *a)
{
    struct big c = big_alloc(a->n);
    if (a->n)
        memcpy(c.d, a->d, a->n * sizeof *a->d);
    c.neg = a->neg;
    return c;
}

static struct big big_small(uint32_t v)
{
    struct big a = big_alloc(1);
    a.d[0] = v;
    big_trim(&a);
    return a;
}

static size_t big_digits(const struct big *a)
{
    if (!a->n)
        return 1;
    size_t k = (a->n - 1) * BASE_DIGITS;
    for (uint32_t top = a->d[a->n - 1]; top; top /= 10)
        k++;
    return k;
}

/* decimal digits (no sign, no underscores) */
static struct big big_from_digits(const char *s, size_t len)
{
    struct big a = big_alloc((len + BASE_DIGITS - 1) / BASE_DIGITS);
    size_t limb = 0;
    for (size_t end = len; end > 0; limb++) {
        const size_t start = end > BASE_DIGITS ? end - BASE_DIGITS : 0;
        uint32_t v = 0;
        for (size_t i = start; i < end; i++)
            v = v * 10 + (uint32_t)(s[i] - '0');
        a.d[limb] = v;
        end = start;
    }
    big_trim(&a);
    return a;
}

static char *big_to_string(const struct big *a)
{
    char *s = xmalloc(a->n * BASE_DIGITS + 3);
    char *p = s;
    if (a->neg)
        *p++ = '-';
    if (!a->n) {
        *p++ = '0';
    } else {
        p += sprintf(p, "%u", a->d[a->n - 1]);
        for (size_t i = a->n - 1; i-- > 0;)
            p += sprintf(p, "%09u", a->d[i]);
    }
    *p = '\0';
    return s;
}

static int cmp_abs(const struct big *a, const struct big *b)
{
    if (a->n != b->n)
        return a->n < b->n ? -1 : 1;
    for (size_t i = a->n; i-- > 0;)
        if (a->d[i] != b->d[i])
            return a->d[i] < b->d[i] ? -1 : 1;
    return 0;
}

static struct big add_abs(const struct big *a, const struct big *b)
{
    const size_t n = (a->n > b->n ? a->n : b->n) + 1;
    struct big c = big_alloc(n);
    uint32_t carry = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = carry + (i < a->n ? a->d[i] : 0) + (i < b->n ? b->d[i] : 0);
        carry = v >= BASE;
        c.d[i] = carry ? v - BASE : v;
    }
    big_trim(&c);
    return c;
}

/* |a| - |b| with |a| >= |b| */
static struct big sub_abs(const struct big *a, const struct big *b)
{
    struct big c = big_alloc(a->n);
    int64_t borrow = 0;
    for (size_t i = 0; i < a->n; i++) {
        int64_t v = (int64_t)a->d[i] - borrow - (i < b->n ? b->d[i] : 0);
        borrow = v < 0;
        c.d[i] = (uint32_t)(v < 0 ? v + BASE : v);
    }
    big_trim(&c);
    return c;
}

static struct big big_add(const struct big *a, const struct big *b, int negate_b)
{
    const int bneg = negate_b ? (b->n ? !b->neg : 0) : b->neg;
    struct big c;
    if (a->neg == bneg) {
        c = add_abs(a, b);
        c.neg = c.n ? a->neg : 0;
    } else if (cmp_abs(a, b) >= 0) {
        c = sub_abs(a, b);
        c.neg = c.n ? a->neg : 0;
    } else {
        c = sub_abs(b, a);
        c.neg = c.n ? bneg : 0;
    }
    return c;
}

static struct big big_mul(const struct big *a, const struct big *b)
{
    if (!a->n || !b->n)
        return big_alloc(0);
    struct big c = big_alloc(a->n + b->n);
    for (size_t i = 0; i < a->n; i++) {
        uint64_t carry = 0;
        for (size_t j = 0; j < b->n; j++) {
            const uint64_t v = (uint64_t)a->d[i] * b->d[j] + c.d[i + j] + carry;
            c.d[i + j] = (uint32_t)(v % BASE);
            carry = v / BASE;
        }
        for (size_t k = i + b->n; carry; k++) {
            const uint64_t v = (uint64_t)c.d[k] + carry;
            c.d[k] = (uint32_t)(v % BASE);
            carry = v / BASE;
        }
    }
    c.neg = a->neg != b->neg;
    big_trim(&c);
    return c;
}

/* |b| * q for one limb q, into out (b->n + 1 limbs) */
static void mul_limb(const struct big *b, uint32_t q, uint32_t *out)
{
    uint64_t carry = 0;
    for (size_t i = 0; i < b->n; i++) {
        const uint64_t v = (uint64_t)b->d[i] * q + carry;
        out[i] = (uint32_t)(v % BASE);
        carry = v / BASE;
    }
    out[b->n] = (uint32_t)carry;
}

/* compare r (n limbs) with t (n limbs) */
static int cmp_limbs(const uint32_t *r, const uint32_t *t, size_t n)
{
    for (size_t i = n; i-- > 0;)
        if (r[i] != t[i])
            return r[i] < t[i] ? -1 : 1;
    return 0;
}

/* |a| divmod |b| (b != 0), truncating: schoolbook long division, each quotient limb found by bisection */
static void divmod_abs(const struct big *a, const struct big *b, struct big *q, struct big *r)
{
    *q = big_alloc(a->n ? a->n : 1);
    const size_t m = b->n + 1;
    uint32_t *rem = xcalloc(m, sizeof *rem), *t = xcalloc(m, sizeof *t);
    for (size_t i = a->n; i-- > 0;) {
        memmove(rem + 1, rem, (m - 1) * sizeof *rem); /* rem = rem * BASE + a[i] (rem < b fits in m limbs) */
        rem[0] = a->d[i];
        uint32_t lo = 0, hi = BASE - 1;
        while (lo < hi) { /* the largest digit qd with b * qd <= rem */
            const uint32_t mid = lo + (hi - lo + 1) / 2;
            mul_limb(b, mid, t);
            if (cmp_limbs(rem, t, m) >= 0)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (lo) {
            mul_limb(b, lo, t);
            int64_t borrow = 0;
            for (size_t k = 0; k < m; k++) {
                int64_t v = (int64_t)rem[k] - t[k] - borrow;
                borrow = v < 0;
                rem[k] = (uint32_t)(v < 0 ? v + BASE : v);
            }
        }
        q->d[i] = lo;
    }
    big_trim(q);
    r->neg = 0;
    r->n = m;
    r->d = rem;
    big_trim(r);
    free(t);
}

/* Python's floor division and modulo: the remainder has the divisor's sign */
static void big_floordiv(const struct big *a, const struct big *b, struct big *q, struct big *r)
{
    divmod_abs(a, b, q, r);
    if (a->neg == b->neg) {
        r->neg = r->n ? b->neg : 0;
        return;
    }
    if (!r->n) {
        q->neg = q->n ? 1 : 0;
        return;
    }
    struct big one = big_small(1), babs = *b;
    babs.neg = 0;
    struct big q1 = add_abs(q, &one), r1 = sub_abs(&babs, r);
    big_free(&one);
    big_free(q), big_free(r);
    q1.neg = 1;
    r1.neg = r1.n ? b->neg : 0;
    *q = q1, *r = r1;
}

/* correctly rounded (strtod rounds the exact decimal) */
static double big_to_double(const struct big *a)
{
    char *s = big_to_string(a);
    const double v = strtod(s, NULL);
    free(s);
    return v;
}

/* ---- values ---- */

struct val {
    int is_float;
    double f;
    struct big i;
};

struct calc {
    const char *s;
    size_t pos;
    int depth;
    char *err;
    size_t errlen;
    int failed;
};

static int calc_fail(struct calc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int calc_fail(struct calc *c, const char *fmt, ...)
{
    if (!c->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
        c->failed = 1;
    }
    return -1;
}

static void val_free(struct val *v) { big_free(&v->i); }

static int check_digits(struct calc *c, const struct big *b)
{
    if (b->n > CALC_MAX_DIGITS / BASE_DIGITS + 2 || big_digits(b) > CALC_MAX_DIGITS)
        return calc_fail(c, "the result has more than %d digits (the calculator's limit)", CALC_MAX_DIGITS);
    return 0;
}

/* a value as a float, Python's int-to-float conversion (an int too large is an error) */
static int as_double(struct calc *c, const struct val *v, double *out)
{
    if (v->is_float) {
        *out = v->f;
        return 0;
    }
    *out = big_to_double(&v->i);
    if (isinf(*out))
        return calc_fail(c, "integer too large to convert to a float");
    return 0;
}

static void skip_space(struct calc *c)
{
    while (c->s[c->pos] == ' ' || c->s[c->pos] == '\t' || c->s[c->pos] == '\n' || c->s[c->pos] == '\r')
        c->pos++;
}

static int parse_expr(struct calc *c, struct val *out);

static int parse_number(struct calc *c, struct val *out)
{
    memset(out, 0, sizeof *out);
    const char *s = c->s;
    const size_t start = c->pos;
    size_t p = start;
    char *buf = xmalloc(strlen(s + start) + 1);
    size_t n = 0;
    int is_float = 0, ndig = 0;
    /* digits with single underscores between them, as Python writes them */
#define TAKE_DIGITS()                                                                                                  \
    while (isdigit((unsigned char)s[p]) ||                                                                             \
           (s[p] == '_' && n && isdigit((unsigned char)s[p + 1]) && isdigit((unsigned char)s[p - 1]))) {               \
        if (s[p] != '_')                                                                                               \
            buf[n++] = s[p], ndig++;                                                                                   \
        p++;                                                                                                           \
    }
    TAKE_DIGITS();
    if (s[p] == '.') {
        is_float = 1;
        buf[n++] = s[p++];
        TAKE_DIGITS();
    }
    if (!ndig) {
        free(buf);
        return calc_fail(c, "expected a number at position %zu", start + 1);
    }
    if ((s[p] == 'e' || s[p] == 'E') && (isdigit((unsigned char)s[p + 1]) ||
                                         ((s[p + 1] == '+' || s[p + 1] == '-') && isdigit((unsigned char)s[p + 2])))) {
        is_float = 1;
        buf[n++] = s[p++];
        if (s[p] == '+' || s[p] == '-')
            buf[n++] = s[p++];
        TAKE_DIGITS();
    }
#undef TAKE_DIGITS
    buf[n] = '\0';
    c->pos = p;
    memset(out, 0, sizeof *out);
    if (is_float) {
        out->is_float = 1;
        out->f = strtod(buf, NULL);
    } else {
        size_t z = 0;
        while (z + 1 < n && buf[z] == '0')
            z++;
        if (n - z > CALC_MAX_DIGITS) {
            free(buf);
            return calc_fail(c, "a number longer than %d digits at position %zu", CALC_MAX_DIGITS, start + 1);
        }
        out->i = big_from_digits(buf + z, n - z);
    }
    free(buf);
    return 0;
}

static int parse_atom(struct calc *c, struct val *out)
{
    memset(out, 0, sizeof *out);
    skip_space(c);
    const char ch = c->s[c->pos];
    if (ch == '(') {
        if (++c->depth > CALC_MAX_DEPTH)
            return calc_fail(c, "nesting deeper than %d", CALC_MAX_DEPTH);
        c->pos++;
        if (parse_expr(c, out) != 0)
            return -1;
        skip_space(c);
        if (c->s[c->pos] != ')') {
            val_free(out);
            return c->s[c->pos] ? calc_fail(c, "expected ')' at position %zu", c->pos + 1)
                                : calc_fail(c, "missing ')' at the end");
        }
        c->pos++;
        c->depth--;
        return 0;
    }
    if (isdigit((unsigned char)ch) || (ch == '.' && isdigit((unsigned char)c->s[c->pos + 1])))
        return parse_number(c, out);
    if (!ch)
        return calc_fail(c, "the expression ends where a number or '(' was expected");
    return calc_fail(c, "unexpected character '%c' at position %zu (numbers, + - * / // %% ** and parentheses only)",
                     isprint((unsigned char)ch) ? ch : '?', c->pos + 1);
}

/* ---- the operators ---- */

static int float_result(struct calc *c, double x, struct val *out)
{
    memset(out, 0, sizeof *out);
    out->is_float = 1;
    out->f = x;
    (void)c;
    return 0;
}

/* int / int, correctly rounded as Python does it: 40+ significant digits of the quotient and a sticky digit */
static int int_truediv(struct calc *c, const struct big *a, const struct big *b, struct val *out)
{
    if (!b->n)
        return calc_fail(c, "division by zero");
    if (!a->n)
        return float_result(c, a->neg != b->neg ? -0.0 : 0.0, out);
    const long shift = (long)big_digits(b) - (long)big_digits(a) + 40;
    const size_t k = shift > 0 ? (size_t)shift : 0;
    struct big scaled = big_copy(a);
    scaled.neg = 0;
    if (k) {
        char *ten = xmalloc(k + 2);
        ten[0] = '1';
        memset(ten + 1, '0', k);
        struct big p = big_from_digits(ten, k + 1);
        free(ten);
        struct big t = big_mul(&scaled, &p);
        big_free(&p), big_free(&scaled);
        scaled = t;
    }
    struct big babs = *b, q, r;
    babs.neg = 0;
    divmod_abs(&scaled, &babs, &q, &r);
    char *qs = big_to_string(&q);
    const size_t ql = strlen(qs);
    char *num = xmalloc(ql + 40);
    snprintf(num, ql + 40, "%s%s%se-%zu", a->neg != b->neg ? "-" : "", qs, r.n ? "1" : "", k + (r.n ? 1 : 0));
    const double v = strtod(num, NULL);
    free(qs), free(num);
    big_free(&scaled), big_free(&q), big_free(&r);
    if (isinf(v))
        return calc_fail(c, "the quotient is too large for a float");
    return float_result(c, v, out);
}

static int float_pow(struct calc *c, double x, double y, struct val *out)
{
    if (y == 0)
        return float_result(c, 1.0, out);
    if (x == 0 && y < 0)
        return calc_fail(c, "zero to a negative power");
    if (x < 0 && y != floor(y) && isfinite(y))
        return calc_fail(c, "a negative number to a fractional power (the result is complex)");
    const double v = pow(x, y);
    if (isinf(v) && isfinite(x) && isfinite(y))
        return calc_fail(c, "the power is too large for a float");
    return float_result(c, v, out);
}

static int int_pow(struct calc *c, const struct big *a, const struct big *e, struct val *out)
{
    if (e->neg) {
        const double x = big_to_double(a), y = big_to_double(e);
        if (isinf(x))
            return calc_fail(c, "integer too large to convert to a float");
        return float_pow(c, x, y, out);
    }
    memset(out, 0, sizeof *out);
    /* |a| <= 1: 0, 1 or -1 whatever the exponent */
    if (a->n == 0 || (a->n == 1 && a->d[0] == 1)) {
        const int odd = e->n ? (e->d[0] & 1) : 0;
        if (!a->n) {
            out->i = big_small(e->n ? 0 : 1);
        } else {
            out->i = big_small(1);
            out->i.neg = a->neg && odd;
        }
        return 0;
    }
    const double log10a = (double)(a->n - 1) * BASE_DIGITS + log10((double)a->d[a->n - 1]);
    const double ed = big_to_double(e);
    if (ed * log10a > CALC_MAX_DIGITS + 1)
        return calc_fail(c, "the power would have about %.0f digits (the calculator's limit is %d)", ed * log10a,
                         CALC_MAX_DIGITS);
    uint64_t n = (uint64_t)ed;
    struct big result = big_small(1), base = big_copy(a);
    while (n) {
        if (n & 1) {
            struct big t = big_mul(&result, &base);
            big_free(&result);
            result = t;
        }
        n >>= 1;
        if (n) {
            struct big t = big_mul(&base, &base);
            big_free(&base);
            base = t;
        }
    }
    big_free(&base);
    out->i = result;
    return check_digits(c, &out->i);
}

/* a OP b, Python's meaning; a and b are consumed */
static int apply(struct calc *c, const char *op, struct val *a, struct val *b, struct val *out)
{
    int rc = 0;
    memset(out, 0, sizeof *out);
    if (!a->is_float && !b->is_float) {
        struct big *x = &a->i, *y = &b->i;
        if (op[0] == '+' || op[0] == '-') {
            out->i = big_add(x, y, op[0] == '-');
            rc = check_digits(c, &out->i);
        } else if (strcmp(op, "**") == 0) {
            rc = int_pow(c, x, y, out);
        } else if (op[0] == '*') {
            if (big_digits(x) + big_digits(y) > CALC_MAX_DIGITS + 1 && x->n && y->n)
                rc = calc_fail(c, "the result has more than %d digits (the calculator's limit)", CALC_MAX_DIGITS);
            else {
                out->i = big_mul(x, y);
                rc = check_digits(c, &out->i);
            }
        } else if (strcmp(op, "/") == 0) {
            rc = int_truediv(c, x, y, out);
        } else { /* // or % */
            if (!y->n) {
                rc = calc_fail(c, op[0] == '%' ? "integer modulo by zero" : "integer division by zero");
            } else {
                struct big q, r;
                big_floordiv(x, y, &q, &r);
                if (op[0] == '%')
                    out->i = r, big_free(&q);
                else
                    out->i = q, big_free(&r);
            }
        }
    } else {
        double x, y;
        if (as_double(c, a, &x) != 0 || as_double(c, b, &y) != 0) {
            rc = -1;
        } else if (op[0] == '+') {
            rc = float_result(c, x + y, out);
        } else if (op[0] == '-') {
            rc = float_result(c, x - y, out);
        } else if (strcmp(op, "**") == 0) {
            rc = float_pow(c, x, y, out);
        } else if (op[0] == '*') {
            rc = float_result(c, x * y, out);
        } else if (y == 0) {
            rc = calc_fail(c, op[0] == '%' ? "float modulo by zero" : "float division by zero");
        } else if (strcmp(op, "/") == 0) {
            rc = float_result(c, x / y, out);
        } else { /* Python's float divmod */
            double mod = fmod(x, y), div = (x - mod) / y, fdiv;
            if (mod != 0) {
                if ((y < 0) != (mod < 0)) {
                    mod += y;
                    div -= 1.0;
                }
            } else {
                mod = copysign(0.0, y);
            }
            if (div != 0) {
                fdiv = floor(div);
                if (div - fdiv > 0.5)
                    fdiv += 1.0;
            } else {
                fdiv = copysign(0.0, x / y);
            }
            rc = float_result(c, op[0] == '%' ? mod : fdiv, out);
        }
    }
    val_free(a), val_free(b);
    if (rc != 0)
        val_free(out);
    return rc;
}

static int negate(struct calc *c, struct val *v)
{
    (void)c;
    if (v->is_float)
        v->f = -v->f;
    else if (v->i.n)
        v->i.neg = !v->i.neg;
    return 0;
}

static int parse_unary(struct calc *c, struct val *out);

/* power := atom ['**' unary]  (right-associative, tighter than a unary sign on its left) */
static int parse_power(struct calc *c, struct val *out)
{
    if (parse_atom(c, out) != 0)
        return -1;
    skip_space(c);
    if (c->s[c->pos] == '*' && c->s[c->pos + 1] == '*') {
        c->pos += 2;
        struct val e = {0}, r = {0};
        if (parse_unary(c, &e) != 0) {
            val_free(out);
            return -1;
        }
        if (apply(c, "**", out, &e, &r) != 0)
            return -1;
        *out = r;
    }
    return 0;
}

/* unary := ('-' | '+') unary | power */
static int parse_unary(struct calc *c, struct val *out)
{
    memset(out, 0, sizeof *out);
    skip_space(c);
    const char ch = c->s[c->pos];
    if (ch == '-' || ch == '+') {
        if (++c->depth > CALC_MAX_DEPTH)
            return calc_fail(c, "nesting deeper than %d", CALC_MAX_DEPTH);
        c->pos++;
        if (parse_unary(c, out) != 0)
            return -1;
        c->depth--;
        return ch == '-' ? negate(c, out) : 0;
    }
    return parse_power(c, out);
}

/* term := unary (('*' | '/' | '//' | '%') unary)* */
static int parse_term(struct calc *c, struct val *out)
{
    memset(out, 0, sizeof *out);
    if (parse_unary(c, out) != 0)
        return -1;
    for (;;) {
        skip_space(c);
        const char *s = c->s + c->pos;
        const char *op = s[0] == '/' && s[1] == '/'   ? "//"
                         : s[0] == '*' && s[1] != '*' ? "*"
                         : s[0] == '/'                ? "/"
                         : s[0] == '%'                ? "%"
                                                      : NULL;
        if (!op)
            return 0;
        c->pos += strlen(op);
        struct val b = {0}, r = {0};
        if (parse_unary(c, &b) != 0) {
            val_free(out);
            return -1;
        }
        if (apply(c, op, out, &b, &r) != 0)
            return -1;
        *out = r;
    }
}

/* expr := term (('+' | '-') term)* */
static int parse_expr(struct calc *c, struct val *out)
{
    memset(out, 0, sizeof *out);
    if (parse_term(c, out) != 0)
        return -1;
    for (;;) {
        skip_space(c);
        const char ch = c->s[c->pos];
        if (ch != '+' && ch != '-')
            return 0;
        c->pos++;
        struct val b = {0}, r = {0};
        if (parse_term(c, &b) != 0) {
            val_free(out);
            return -1;
        }
        if (apply(c, ch == '+' ? "+" : "-", out, &b, &r) != 0)
            return -1;
        *out = r;
    }
}

/* ---- Python's repr of a float: the shortest digits that read back, fixed or exponent notation ---- */

static void float_repr(double x, char *out, size_t len)
{
    if (isnan(x)) {
        snprintf(out, len, "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(out, len, x < 0 ? "-inf" : "inf");
        return;
    }
    const char *sign = signbit(x) ? "-" : "";
    const double ax = fabs(x);
    if (ax == 0) {
        snprintf(out, len, "%s0.0", sign);
        return;
    }
    char e[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, ax);
        if (strtod(e, NULL) == ax)
            break;
    }
    /* e: d[.ddd]e[+-]XX -> digits and the exponent of the first digit */
    char digits[32];
    size_t nd = 0;
    const char *q = e;
    for (; *q && *q != 'e'; q++)
        if (isdigit((unsigned char)*q))
            digits[nd++] = *q;
    const int exp10 = (int)strtol(q + 1, NULL, 10);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    if (exp10 >= -4 && exp10 < 16) {
        char body[64];
        if (exp10 >= 0) {
            size_t k = 0;
            for (int i = 0; i <= exp10; i++)
                body[k++] = (size_t)i < nd ? digits[i] : '0';
            body[k++] = '.';
            if ((size_t)exp10 + 1 < nd)
                for (size_t i = (size_t)exp10 + 1; i < nd; i++)
                    body[k++] = digits[i];
            else
                body[k++] = '0';
            body[k] = '\0';
        } else {
            snprintf(body, sizeof body, "0.%.*s%s", -exp10 - 1, "0000", digits);
        }
        snprintf(out, len, "%s%s", sign, body);
    } else {
        snprintf(out, len, "%s%c%s%s%se%c%02d", sign, digits[0], nd > 1 ? "." : "", digits + 1, "",
                 exp10 < 0 ? '-' : '+', abs(exp10));
    }
}

char *calculator_eval(const char *expr, char *err, size_t errlen)
{
    const size_t n = strlen(expr);
    if (n > CALC_MAX_EXPR) {
        error_set(err, errlen, "the expression is longer than %d characters", CALC_MAX_EXPR);
        return NULL;
    }
    struct calc c = {expr, 0, 0, err, errlen, 0};
    struct val v;
    if (parse_expr(&c, &v) != 0)
        return NULL;
    skip_space(&c);
    if (expr[c.pos]) {
        val_free(&v);
        if (expr[c.pos] == ')')
            error_set(err, errlen, "unmatched ')' at position %zu", c.pos + 1);
        else
            error_set(err, errlen, "unexpected '%c' at position %zu",
                      isprint((unsigned char)expr[c.pos]) ? expr[c.pos] : '?', c.pos + 1);
        return NULL;
    }
    if (v.is_float) {
        char buf[128];
        float_repr(v.f, buf, sizeof buf);
        return xstrdup(buf);
    }
    char *s = big_to_string(&v.i);
    val_free(&v);
    return s;
}

/* ---- the tool ---- */

static const char DEFAULT_SCHEMA[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"calculator\", \"description\": \"Evaluate an arithmetic "
    "expression exactly: integers of any length and decimal numbers, with + - * / // % ** and parentheses, as "
    "Python computes them.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"expression\": {\"type\": "
    "\"string\", \"description\": \"The expression, e.g. (123456789 ** 5 - 7) // 13\"}}, \"required\": "
    "[\"expression\"]}}}";

static char *calc_execute(struct tool *t, const json_t *args)
{
    (void)t;
    const char *expr = json_string_value(json_object_get(args, "expression"));
    if (!expr)
        return xstrdup("Error: missing required argument 'expression'");
    char err[256];
    char *v = calculator_eval(expr, err, sizeof err);
    if (v)
        return v;
    char msg[300];
    snprintf(msg, sizeof msg, "Error: %s", err);
    return xstrdup(msg);
}

static const struct tool_ops CALC_OPS = {.execute = calc_execute};

struct tool *calculator_new(json_t *schema, char *err, size_t errlen)
{
    json_t *own = NULL;
    if (!schema && !(own = schema = json_loads(DEFAULT_SCHEMA, 0, NULL))) {
        error_set(err, errlen, "calculator: bad default schema");
        return NULL;
    }
    const json_t *e = json_object_get(
        json_object_get(json_object_get(json_object_get(schema, "function"), "parameters"), "properties"),
        "expression");
    struct tool *t = NULL;
    if (!e || strcmp(json_string_value(json_object_get(e, "type")) ?: "", "string") != 0)
        error_set(err, errlen,
                  "the calculator takes a string argument 'expression' "
                  "(function.parameters.properties.expression)");
    else
        t = tool_new(schema, &CALC_OPS, NULL, err, errlen);
    json_decref(own);
    return t;
}
