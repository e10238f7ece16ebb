/* Numbers in answers and the answer-extraction rules shared by the scorers.
 * Everything here is a linear scan over the text (no regular expressions, no
 * recursion), so adversarial responses cost time proportional to their length. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "scorers.h"

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alnum(char c) { return isalnum((unsigned char)c) != 0; }
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* U+2212 MINUS SIGN in UTF-8 */
static bool is_unicode_minus(const char *s, size_t n)
{
    return n >= 3 && (unsigned char)s[0] == 0xE2 && (unsigned char)s[1] == 0x88 && (unsigned char)s[2] == 0x92;
}

/* Append digits s[0..n) to buf at *k, keeping room for the NUL; false when it does not fit. */
static bool put_digits(char *buf, size_t cap, size_t *k, const char *s, size_t n)
{
    if (*k + n + 1 > cap)
        return false;
    memcpy(buf + *k, s, n);
    *k += n;
    return true;
}

/* Scan one number at s: [sign] ['$'] digits (with ",ddd" groups) ['.' digits] ['/' digits], or
 * [sign] ['$'] '.' digits. Returns the bytes consumed (0: no number starts here). *valid is false
 * when the text is a number too long to compare exactly (callers skip it). */
static size_t scan_number(const char *s, size_t n, struct reward_number *out, bool *valid)
{
    size_t i = 0;
    bool neg = false;
    if (i < n && (s[i] == '-' || s[i] == '+')) {
        neg = s[i] == '-';
        i++;
    } else if (is_unicode_minus(s, n)) {
        neg = true;
        i = 3;
    }
    if (i < n && s[i] == '$')
        i++;
    size_t start = i;
    bool has_int = i < n && is_digit(s[i]);
    bool has_lead_point = !has_int && i + 1 < n && s[i] == '.' && is_digit(s[i + 1]);
    if (!has_int && !has_lead_point)
        return 0;

    char ip[REWARD_NUM_MAX], fp[REWARD_NUM_MAX], dp[REWARD_NUM_MAX];
    size_t ik = 0, fk = 0, dk = 0;
    bool ok = true;
    size_t j = i;
    while (j < n && is_digit(s[j]))
        j++;
    ok = ok && put_digits(ip, sizeof ip, &ik, s + i, j - i);
    i = j;
    /* thousands groups: ",ddd" not followed by a further digit */
    while (has_int && i + 3 < n && s[i] == ',' && is_digit(s[i + 1]) && is_digit(s[i + 2]) && is_digit(s[i + 3]) &&
           !(i + 4 < n && is_digit(s[i + 4]))) {
        ok = ok && put_digits(ip, sizeof ip, &ik, s + i + 1, 3);
        i += 4;
    }
    if (i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
        j = i + 1;
        while (j < n && is_digit(s[j]))
            j++;
        ok = ok && put_digits(fp, sizeof fp, &fk, s + i + 1, j - i - 1);
        i = j;
    }
    bool frac = false;
    if (i + 1 < n && s[i] == '/' && is_digit(s[i + 1]) && i > start) {
        j = i + 1;
        while (j < n && is_digit(s[j]))
            j++;
        ok = ok && put_digits(dp, sizeof dp, &dk, s + i + 1, j - i - 1);
        i = j;
        frac = true;
    }
    *valid = ok;
    if (!ok || !out)
        return i;

    /* canonical decimal: no leading zeros in the integer part, no trailing zeros in the fraction */
    ip[ik] = '\0';
    fp[fk] = '\0';
    const char *ipz = ip;
    while (*ipz == '0' && ipz[1] != '\0')
        ipz++;
    while (fk > 0 && fp[fk - 1] == '0')
        fp[--fk] = '\0';
    if (ik == 0)
        ipz = "0";
    bool zero = strcmp(ipz, "0") == 0 && fk == 0;
    char canon[3 * REWARD_NUM_MAX];
    snprintf(canon, sizeof canon, "%s%s%s%s", neg && !zero ? "-" : "", ipz, fk ? "." : "", fp);
    if (strlen(canon) >= sizeof out->canon) {
        *valid = false;
        return i;
    }
    memset(out, 0, sizeof *out);
    memcpy(out->canon, canon, strlen(canon) + 1);
    out->value = strtod(canon, NULL);
    if (frac) {
        dp[dk] = '\0';
        double d = strtod(dp, NULL);
        if (d == 0) {
            *valid = false; /* "3/0" is no number */
            return i;
        }
        out->is_fraction = true;
        out->value /= d;
    }
    return i;
}

/* Copy s[0..n) without the decorations LaTeX and prose put around numbers. Returns the new length. */
static size_t strip_number_decorations(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap;) {
        if (s[i] == '\\' && i + 1 < n &&
            (s[i + 1] == '!' || s[i + 1] == ',' || s[i + 1] == ';' || s[i + 1] == ':' || s[i + 1] == '(' ||
             s[i + 1] == ')')) {
            i += 2; /* LaTeX thin spaces and \( \) math delimiters */
        } else if (s[i] == '\\' && i + 1 < n && s[i + 1] == '$') {
            out[k++] = '$';
            i += 2;
        } else if (i + 2 < n && s[i] == '{' && s[i + 1] == ',' && s[i + 2] == '}') {
            out[k++] = ',';
            i += 3;
        } else if (is_space(s[i])) {
            i++;
        } else {
            out[k++] = s[i++];
        }
    }
    out[k] = '\0';
    return k;
}

/* Read "{digits-or-number}" at s; returns bytes consumed (0 when it is not that form). */
static size_t braced_group(const char *s, size_t n, const char **in, size_t *inlen)
{
    if (n == 0 || s[0] != '{')
        return 0;
    size_t i = 1;
    while (i < n && s[i] != '}' && s[i] != '{')
        i++;
    if (i >= n || s[i] != '}')
        return 0;
    *in = s + 1;
    *inlen = i - 1;
    return i + 1;
}

bool reward_parse_number(const char *s, size_t len, struct reward_number *out)
{
    if (len > 4 * REWARD_NUM_MAX)
        return false;
    char buf[4 * REWARD_NUM_MAX + 1];
    size_t n = strip_number_decorations(s, len, buf, sizeof buf);
    /* math-mode dollars around the whole thing, trailing sentence period */
    char *p = buf;
    while (n >= 2 && p[0] == '$' && p[n - 1] == '$') {
        p++;
        n -= 2;
    }
    if (n > 0 && p[n - 1] == '.')
        n--;
    if (n == 0)
        return false;
    p[n] = '\0';

    /* [-]\frac{a}{b}, \dfrac, \tfrac */
    size_t i = 0;
    bool neg = false;
    if (p[i] == '-') {
        neg = true;
        i++;
    }
    const char *fr[] = {"\\frac", "\\dfrac", "\\tfrac"};
    for (size_t f = 0; f < sizeof fr / sizeof fr[0]; f++) {
        size_t fl = strlen(fr[f]);
        if (n - i > fl && strncmp(p + i, fr[f], fl) == 0) {
            const char *a, *b;
            size_t al, bl;
            size_t c1 = braced_group(p + i + fl, n - i - fl, &a, &al);
            if (!c1)
                return false;
            size_t c2 = braced_group(p + i + fl + c1, n - i - fl - c1, &b, &bl);
            if (!c2 || i + fl + c1 + c2 != n)
                return false;
            struct reward_number na, nb;
            if (!reward_parse_number(a, al, &na) || !reward_parse_number(b, bl, &nb) || nb.value == 0)
                return false;
            memset(out, 0, sizeof *out);
            out->is_fraction = true;
            out->value = (neg ? -na.value : na.value) / nb.value;
            snprintf(out->canon, sizeof out->canon, "%.17g", out->value);
            return true;
        }
    }

    bool valid = false;
    struct reward_number tmp;
    size_t used = scan_number(p, n, &tmp, &valid);
    if (used != n || !valid)
        return false;
    *out = tmp;
    return true;
}

bool reward_numbers_equal(const struct reward_number *a, const struct reward_number *b)
{
    if (!a->is_fraction && !b->is_fraction)
        return strcmp(a->canon, b->canon) == 0;
    if (!isfinite(a->value) || !isfinite(b->value))
        return false;
    double scale = fmax(1.0, fmax(fabs(a->value), fabs(b->value)));
    return fabs(a->value - b->value) <= 1e-9 * scale;
}

/* Text normalisation of non-numeric answers. */
static size_t normalise_text(const char *s, size_t n, char *out, size_t cap)
{
    static const char *const drop[] = {"\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "$"};
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap;) {
        if (is_space(s[i])) {
            i++;
            continue;
        }
        bool dropped = false;
        for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++) {
            size_t dl = strlen(drop[d]);
            if (n - i >= dl && strncmp(s + i, drop[d], dl) == 0) {
                i += dl;
                dropped = true;
                break;
            }
        }
        if (dropped)
            continue;
        if (n - i >= 6 && (strncmp(s + i, "\\dfrac", 6) == 0 || strncmp(s + i, "\\tfrac", 6) == 0)) {
            if (k + 6 >= cap)
                break;
            memcpy(out + k, "\\frac", 5);
            k += 5;
            i += 6;
            continue;
        }
        out[k++] = s[i++];
    }
    while (k > 0 && out[k - 1] == '.')
        k--;
    out[k] = '\0';
    return k;
}

bool reward_answer_matches(const char *answer, size_t len, const char *ground_truth)
{
    if (!answer || !ground_truth)
        return false;
    struct reward_number a, g;
    size_t glen = strlen(ground_truth);
    bool an = reward_parse_number(answer, len, &a), gn = reward_parse_number(ground_truth, glen, &g);
    if (an && gn)
        return reward_numbers_equal(&a, &g);
    if (an != gn)
        return false;
    if (len > 4096 || glen > 4096)
        return false;
    char na[4097], ng[4097];
    size_t ka = normalise_text(answer, len, na, sizeof na), kg = normalise_text(ground_truth, glen, ng, sizeof ng);
    return ka > 0 && ka == kg && memcmp(na, ng, ka) == 0;
}

/* ---- extraction ---- */

/* Whether a '-'/'+' at s[i] may be a sign (not the operator of "5-3"). */
static bool sign_position(const char *text, size_t i)
{
    if (i == 0)
        return true;
    char p = text[i - 1];
    return !is_alnum(p) && p != ')' && p != '.' && p != ']' && p != '}';
}

bool reward_find_hash_answer(const char *text, const char **ans, size_t *len)
{
    bool found = false;
    size_t n = strlen(text);
    /* one pass (strstr from every '#' of a long run of them would be quadratic on adversarial text) */
    for (size_t at = 0; at + 4 <= n; at++) {
        if (memcmp(text + at, "####", 4) != 0)
            continue;
        size_t i = at + 4;
        while (i < n && (text[i] == ' ' || text[i] == '\t'))
            i++;
        if (i < n && text[i] == '#')
            continue; /* part of a longer run of '#': only the run's last "####" can precede a number */
        bool valid = false;
        size_t used = scan_number(text + i, n - i, NULL, &valid);
        if (used > 0 && valid) {
            *ans = text + i;
            *len = used;
            found = true;
        }
    }
    return found;
}

/* Last occurrence of needle in text, or NULL. */
static const char *last_strstr(const char *text, const char *needle)
{
    const char *last = NULL, *p = text;
    while ((p = strstr(p, needle)) != NULL) {
        last = p;
        p++;
    }
    return last;
}

bool reward_find_boxed(const char *text, const char **ans, size_t *len)
{
    const char *b = last_strstr(text, "\\boxed"), *f = last_strstr(text, "\\fbox");
    const char *at = b;
    size_t skip = 6;
    if (f && (!b || f > b)) {
        at = f;
        skip = 5;
    }
    if (!at)
        return false;
    const char *p = at + skip;
    if (*p == ' ' && at == b) {
        /* "\boxed 5": up to the next space or '$' */
        while (*p == ' ')
            p++;
        const char *e = p;
        while (*e && !is_space(*e) && *e != '$')
            e++;
        if (e == p)
            return false;
        *ans = p;
        *len = (size_t)(e - p);
        return true;
    }
    while (*p == ' ')
        p++;
    if (*p != '{')
        return false;
    size_t depth = 0;
    for (const char *q = p; *q; q++) {
        if (*q == '{') {
            depth++;
        } else if (*q == '}') {
            if (--depth == 0) {
                *ans = p + 1;
                *len = (size_t)(q - p - 1);
                return true;
            }
        }
    }
    return false; /* unterminated */
}

bool reward_find_answer_is(const char *text, const char **ans, size_t *len)
{
    bool found = false;
    size_t n = strlen(text);
    for (size_t s = 0; s + 6 <= n; s++) {
        if (strncasecmp(text + s, "answer", 6) != 0)
            continue;
        size_t i = s + 6;
        bool linked = false;
        while (i < n && (text[i] == ' ' || text[i] == '\t' || text[i] == '*'))
            i++;
        if (i + 2 <= n && strncasecmp(text + i, "is", 2) == 0 && (i + 2 == n || !is_alnum(text[i + 2]))) {
            linked = true;
            i += 2;
        }
        while (i < n && (text[i] == ' ' || text[i] == '\t' || text[i] == '*' || text[i] == ':' || text[i] == '=')) {
            if (text[i] == ':' || text[i] == '=')
                linked = true;
            i++;
        }
        if (!linked)
            continue;
        if (i + 1 < n && text[i] == '\\' && text[i + 1] == '(')
            i += 2;
        while (i < n && (text[i] == ' ' || (text[i] == '$' && i + 1 < n && !is_digit(text[i + 1]))))
            i++;
        bool valid = false;
        size_t used = scan_number(text + i, n - i, NULL, &valid);
        if (used > 0 && valid) {
            *ans = text + i;
            *len = used;
            found = true;
        }
    }
    return found;
}

bool reward_find_last_number(const char *text, const char **ans, size_t *len)
{
    bool found = false;
    size_t n = strlen(text);
    for (size_t i = 0; i < n;) {
        char c = text[i];
        bool may_start = is_digit(c) || c == '.' || c == '$' ||
                         ((c == '-' || c == '+' || is_unicode_minus(text + i, n - i)) && sign_position(text, i));
        if (!may_start) {
            i++;
            continue;
        }
        bool valid = false;
        size_t used = scan_number(text + i, n - i, NULL, &valid);
        if (used == 0) {
            i++;
            continue;
        }
        if (valid) {
            *ans = text + i;
            *len = used;
            found = true;
        }
        i += used;
    }
    return found;
}
