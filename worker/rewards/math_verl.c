/* verl's MATH scorer (verl/utils/reward_score/math_reward.py, the lighteval MATH rule), rewritten in C with its
 * quirks kept: the last \boxed answer (or \fbox, which its remove_boxed then rejects), both strings normalised
 * by its strip_string, equal as text. Where verl's Python raises inside strip_string (an IndexError, a failed
 * assert), is_equiv compares the raw strings; where it raises outside (remove_boxed's asserts), the score is 0.
 * Python indexes characters, not bytes: s[0] below takes a whole UTF-8 character. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "scorers.h"

/* Bytes of the UTF-8 character at s (1 for a stray byte). */
static size_t char_len(const char *s)
{
    const unsigned char c = (unsigned char)*s;
    size_t n = c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    for (size_t k = 1; k < n; k++)
        if (!s[k])
            return k;
    return n;
}

/* s with every from replaced by to (Python's str.replace); frees s. */
static char *replace_all(char *s, const char *from, const char *to)
{
    const size_t fl = strlen(from), tl = strlen(to);
    size_t count = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + fl, from))
        count++;
    if (!count)
        return s;
    char *out = xmalloc(strlen(s) + count * (tl > fl ? tl - fl : 0) + 1), *o = out;
    const char *p = s;
    for (const char *q = strstr(p, from); q; q = strstr(p, from)) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, tl);
        o += tl;
        p = q + fl;
    }
    strcpy(o, p);
    free(s);
    return out;
}

static size_t count_of(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + strlen(what), what))
        n++;
    return n;
}

/* A growing string. */
struct buf {
    char *s;
    size_t n, cap;
};

static void put(struct buf *b, const char *s, size_t n)
{
    if (!b->s || b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* fix_sqrt; false where Python raises (a "\sqrt" at the very end: split[0] of an empty piece). */
static bool fix_sqrt(char **sp)
{
    char *s = *sp;
    if (!strstr(s, "\\sqrt"))
        return true;
    struct buf b = {0};
    put(&b, "", 0);
    const char *p = s, *q = strstr(p, "\\sqrt");
    put(&b, p, (size_t)(q - p));
    while (q) {
        const char *piece = q + 5, *next = strstr(piece, "\\sqrt");
        const size_t len = next ? (size_t)(next - piece) : strlen(piece);
        if (len == 0) {
            free(b.s);
            return false;
        }
        if (piece[0] != '{') {
            const size_t c = char_len(piece);
            puts_(&b, "\\sqrt{");
            put(&b, piece, c);
            puts_(&b, "}");
            put(&b, piece + c, len - c);
        } else {
            puts_(&b, "\\sqrt");
            put(&b, piece, len);
        }
        q = next;
    }
    free(s);
    *sp = b.s;
    return true;
}

/* fix_fracs; false where Python raises (an empty piece after "\frac"). */
static bool fix_fracs(char **sp)
{
    char *s = *sp;
    const char *q = strstr(s, "\\frac");
    if (!q)
        return true;
    struct buf b = {0};
    put(&b, s, (size_t)(q - s));
    while (q) {
        const char *piece = q + 5, *next = strstr(piece, "\\frac");
        const size_t len = next ? (size_t)(next - piece) : strlen(piece);
        puts_(&b, "\\frac");
        if (len == 0) {
            free(b.s);
            return false;
        }
        if (piece[0] == '{') {
            put(&b, piece, len);
        } else {
            const size_t ca = char_len(piece);
            if (ca >= len) { /* fewer than two characters: the string as it was */
                free(b.s);
                return true;
            }
            const size_t cb = char_len(piece + ca);
            if (piece[ca] != '{') {
                puts_(&b, "{");
                put(&b, piece, ca);
                puts_(&b, "}{");
                put(&b, piece + ca, cb);
                puts_(&b, "}");
            } else {
                puts_(&b, "{");
                put(&b, piece, ca);
                puts_(&b, "}");
                put(&b, piece + ca, cb);
            }
            put(&b, piece + ca + cb, len - ca - cb);
        }
        q = next;
    }
    free(s);
    *sp = b.s;
    return true;
}

/* Whether s[0..n) is how Python prints an int (what int() then str() gives back). */
static bool canonical_int(const char *s, size_t n)
{
    size_t i = s[0] == '-' ? 1 : 0;
    if (i == n || (s[i] == '0' && (n - i > 1 || i == 1)))
        return false;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/* strip_string; NULL where Python raises. */
static char *strip_string(const char *in)
{
    char *s = xstrdup(in);
    s = replace_all(s, "\n", "");
    s = replace_all(s, "\\!", "");
    s = replace_all(s, "\\\\", "\\");
    s = replace_all(s, "tfrac", "frac");
    s = replace_all(s, "dfrac", "frac");
    s = replace_all(s, "\\left", "");
    s = replace_all(s, "\\right", "");
    s = replace_all(s, "^{\\circ}", "");
    s = replace_all(s, "^\\circ", "");
    s = replace_all(s, "\\$", "");
    const size_t units = count_of(s, "\\text{ ");
    if (units > 1) {
        free(s);
        return NULL; /* remove_right_units' assert */
    }
    if (units == 1)
        *strstr(s, "\\text{ ") = '\0';
    s = replace_all(s, "\\\\%", "");
    s = replace_all(s, "\\%", "");
    s = replace_all(s, " .", " 0.");
    s = replace_all(s, "{.", "{0.");
    if (!s[0])
        return s;
    if (s[0] == '.') {
        char *t = xmalloc(strlen(s) + 2);
        t[0] = '0';
        strcpy(t + 1, s);
        free(s);
        s = t;
    }
    const char *eq = strchr(s, '=');
    if (eq && !strchr(eq + 1, '=')) {
        const char *c = s;
        size_t chars = 0;
        while (c < eq) {
            c += char_len(c);
            chars++;
        }
        if (chars <= 2)
            memmove(s, eq + 1, strlen(eq + 1) + 1);
    }
    if (!fix_sqrt(&s)) {
        free(s);
        return NULL;
    }
    s = replace_all(s, " ", "");
    if (!fix_fracs(&s)) {
        free(s);
        return NULL;
    }
    if (strcmp(s, "0.5") == 0) {
        free(s);
        s = xstrdup("\\frac{1}{2}");
    }
    const char *slash = strchr(s, '/');
    if (slash && !strchr(slash + 1, '/') && canonical_int(s, (size_t)(slash - s)) &&
        canonical_int(slash + 1, strlen(slash + 1))) {
        const size_t an = (size_t)(slash - s);
        char *t = xmalloc(strlen(s) + 16);
        memcpy(t, "\\frac{", 6);
        memcpy(t + 6, s, an);
        strcpy(t + 6 + an, "}{");
        strcat(t, slash + 1);
        strcat(t, "}");
        free(s);
        s = t;
    }
    return s;
}

/* last_boxed_only_string: malloc'd, or NULL (None). */
static char *last_boxed(const char *s)
{
    const char *sp = strstr(s, "\\boxed ");
    if (sp) { /* the text after the last "\boxed ", up to a '$' */
        const char *last = sp;
        for (const char *p = strstr(sp + 1, "\\boxed "); p; p = strstr(p + 1, "\\boxed "))
            last = p;
        const char *rest = last + 7;
        const size_t n = strcspn(rest, "$");
        char *out = xmalloc(n + 8);
        memcpy(out, "\\boxed ", 7);
        memcpy(out + 7, rest, n);
        out[7 + n] = '\0';
        return out;
    }
    const char *idx = NULL;
    for (const char *p = strstr(s, "\\boxed"); p; p = strstr(p + 1, "\\boxed"))
        idx = p;
    if (!idx)
        for (const char *p = strstr(s, "\\fbox"); p; p = strstr(p + 1, "\\fbox"))
            idx = p;
    if (!idx)
        return NULL;
    int open = 0;
    for (const char *p = idx; *p; p++) {
        if (*p == '{')
            open++;
        if (*p == '}' && --open == 0) {
            const size_t n = (size_t)(p - idx) + 1;
            char *out = xmalloc(n + 1);
            memcpy(out, idx, n);
            out[n] = '\0';
            return out;
        }
    }
    return NULL;
}

double reward_score_math_verl(const char *solution, const char *ground_truth, char *why, size_t whylen)
{
    if (why && whylen)
        why[0] = '\0';
    char *boxed = last_boxed(solution);
    if (!boxed)
        return 0.0;
    /* remove_boxed: "\boxed X" or "\boxed{X}"; anything else fails its asserts (score 0) */
    const char *answer = NULL;
    size_t n = strlen(boxed);
    if (strstr(boxed, "\\boxed ")) {
        if (strncmp(boxed, "\\boxed ", 7) == 0)
            answer = boxed + 7;
    } else if (strncmp(boxed, "\\boxed{", 7) == 0 && n >= 8 && boxed[n - 1] == '}') {
        boxed[n - 1] = '\0';
        answer = boxed + 7;
    }
    double score = 0.0;
    if (answer) {
        char *a = strip_string(answer), *g = strip_string(ground_truth);
        score = a && g ? (strcmp(a, g) == 0) : (strcmp(answer, ground_truth) == 0);
        free(a), free(g);
    }
    free(boxed);
    return score;
}
