/* Byte-level BPE: vocabulary and merge maps, pre-tokenizer steps, encode and decode. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "worker/tokenizer/chat_template.h"
#include "worker/tokenizer/tokenizer_internal.h"

/* GPT-2's split (also ByteLevel's use_regex split in tokenizers) */
const char TOK_RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Llama-3's: case-insensitive contractions, numbers in groups of up to three */
const char TOK_RE_LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                             "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen2's: as Llama-3's but single digits */
const char TOK_RE_QWEN2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                            "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_DIGIT[] = "\\p{N}";
static const char RE_DIGITS[] = "\\p{N}+";

/* ------------------------------------------------------------------------------------------ */
/* byte-level alphabet (GPT-2's bytes_to_unicode)                                             */

static char byte_chars[256][3];
static int16_t char_bytes[324]; /* code points 0..323 -> byte or -1 */
static pthread_once_t alphabet_once = PTHREAD_ONCE_INIT;

static int byte_is_printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static void alphabet_init(void)
{
    for (int i = 0; i < 324; i++)
        char_bytes[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = byte_is_printable(b) ? (uint32_t)b : (uint32_t)(256 + extra++);
        char_bytes[cp] = (int16_t)b;
        if (cp < 0x80) {
            byte_chars[b][0] = (char)cp;
            byte_chars[b][1] = 0;
        } else {
            byte_chars[b][0] = (char)(0xC0 | (cp >> 6));
            byte_chars[b][1] = (char)(0x80 | (cp & 0x3F));
            byte_chars[b][2] = 0;
        }
    }
}

const char *tok_byte_char(uint8_t b)
{
    pthread_once(&alphabet_once, alphabet_init);
    return byte_chars[b];
}

int tok_char_byte(uint32_t cp)
{
    pthread_once(&alphabet_once, alphabet_init);
    return cp < 324 ? char_bytes[cp] : -1;
}

size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned char c = u[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        v = c & 0x1F;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        v = c & 0x0F;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        v = c & 0x07;
        min = 0x10000;
    } else {
        *cp = 0xFFFFFFFFu;
        return 1;
    }
    if (len > n) {
        *cp = 0xFFFFFFFFu;
        return 1;
    }
    for (size_t i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *cp = 0xFFFFFFFFu;
            return 1;
        }
        v = (v << 6) | (u[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = 0xFFFFFFFFu;
        return 1;
    }
    *cp = v;
    return len;
}

bool tok_in_alphabet(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += tok_utf8_next(s + i, n - i, &cp);
        if (tok_char_byte(cp) < 0)
            return false;
    }
    return true;
}

char *tok_bytes_to_text(const char *s, size_t n, size_t *out_len)
{
    char *o = xmalloc(2 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *c = tok_byte_char((uint8_t)s[i]);
        while (*c)
            o[k++] = *c++;
    }
    o[k] = 0;
    if (out_len)
        *out_len = k;
    return o;
}

/* Unicode White_Space (Rust's char::is_whitespace) */
static bool is_unicode_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ------------------------------------------------------------------------------------------ */
/* hash maps                                                                                  */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int tok_vocab_get(const struct tokenizer *t, const char *s, size_t n)
{
    if (!t->vocab.cap)
        return -1;
    size_t mask = t->vocab.cap - 1;
    for (size_t j = hash_bytes(s, n) & mask;; j = (j + 1) & mask) {
        int32_t id = t->vocab.slots[j];
        if (id < 0)
            return -1;
        if (t->text_len[id] == n && memcmp(t->text[id], s, n) == 0)
            return id;
    }
}

/* Map id's text to id (a later id with the same text replaces an earlier one, as a dict would). */
static void strmap_put(struct tokenizer *t, int32_t id)
{
    size_t mask = t->vocab.cap - 1;
    size_t j = hash_bytes(t->text[id], t->text_len[id]) & mask;
    for (;; j = (j + 1) & mask) {
        int32_t o = t->vocab.slots[j];
        if (o < 0)
            break;
        if (t->text_len[o] == t->text_len[id] && memcmp(t->text[o], t->text[id], t->text_len[id]) == 0)
            break;
    }
    t->vocab.slots[j] = id;
}

void tok_index(struct tokenizer *t)
{
    size_t cap = 1024;
    while (cap < 2 * (size_t)t->n_ids + 16)
        cap <<= 1;
    free(t->vocab.slots);
    t->vocab.slots = xmalloc(cap * sizeof *t->vocab.slots);
    t->vocab.cap = cap;
    for (size_t i = 0; i < cap; i++)
        t->vocab.slots[i] = -1;
    for (int32_t i = 0; i < t->n_ids; i++)
        if (t->text[i] && (t->flags[i] & TOKF_IN_VOCAB))
            strmap_put(t, i);
}

static struct tok_merge_slot *mergemap_find(const struct tok_mergemap *m, uint64_t key)
{
    if (!m->cap)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t j = hash_u64(key) & mask;; j = (j + 1) & mask) {
        if (m->slots[j].key == key)
            return &m->slots[j];
        if (m->slots[j].key == UINT64_MAX)
            return NULL;
    }
}

static void mergemap_build(struct tokenizer *t)
{
    size_t cap = 1024;
    while (cap < 2 * (size_t)t->n_merges + 16)
        cap <<= 1;
    struct tok_merge_slot *slots = xmalloc(cap * sizeof *slots);
    for (size_t i = 0; i < cap; i++)
        slots[i].key = UINT64_MAX;
    for (int32_t r = 0; r < t->n_merges; r++) {
        int32_t l = t->merges[r][0], rr = t->merges[r][1];
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)rr;
        size_t j = hash_u64(key) & (cap - 1);
        while (slots[j].key != UINT64_MAX && slots[j].key != key)
            j = (j + 1) & (cap - 1);
        /* a repeated pair: the later rank wins, as in tokenizers */
        slots[j].key = key;
        slots[j].rank = r;
        slots[j].merged = t->merges[r][2];
    }
    free(t->merge_map.slots);
    t->merge_map.slots = slots;
    t->merge_map.cap = cap;
}

/* ------------------------------------------------------------------------------------------ */
/* building                                                                                   */

struct tokenizer *tok_new(int32_t n_ids)
{
    struct tokenizer *t = xcalloc(1, sizeof *t);
    t->unk_id = t->bos_id = t->eos_id = t->pad_id = t->cfg_unk_id = -1;
    t->chat = chat_renderer_new();
    tok_grow(t, n_ids);
    return t;
}

void tok_grow(struct tokenizer *t, int32_t n_ids)
{
    if (n_ids <= t->n_ids)
        return;
    t->text = xrealloc(t->text, (size_t)n_ids * sizeof *t->text);
    t->text_len = xrealloc(t->text_len, (size_t)n_ids * sizeof *t->text_len);
    t->bytes = xrealloc(t->bytes, (size_t)n_ids * sizeof *t->bytes);
    t->bytes_len = xrealloc(t->bytes_len, (size_t)n_ids * sizeof *t->bytes_len);
    t->flags = xrealloc(t->flags, (size_t)n_ids);
    for (int32_t i = t->n_ids; i < n_ids; i++) {
        t->text[i] = NULL;
        t->text_len[i] = 0;
        t->bytes[i] = NULL;
        t->bytes_len[i] = 0;
        t->flags[i] = 0;
    }
    t->n_ids = n_ids;
}

int tok_set_token(struct tokenizer *t, int32_t id, const char *text, size_t len, bool in_vocab)
{
    if (id < 0)
        return -1;
    if (id >= t->n_ids) { /* doubling in 64 bits: an id near INT32_MAX must not overflow the size */
        int64_t n = t->n_ids ? t->n_ids : 256;
        while (n <= id)
            n *= 2;
        tok_grow(t, (int32_t)(n > INT32_MAX ? (int64_t)id + 1 : n));
    }
    if (t->text[id]) {
        if (t->text_len[id] != len || memcmp(t->text[id], text, len) != 0)
            return -1;
    } else {
        t->text[id] = xmalloc(len + 1);
        memcpy(t->text[id], text, len);
        t->text[id][len] = 0;
        t->text_len[id] = (uint32_t)len;
        t->flags[id] |= TOKF_USED;
    }
    if (in_vocab)
        t->flags[id] |= TOKF_IN_VOCAB;
    return 0;
}

int tok_add_merge(struct tokenizer *t, const char *l, size_t ll, const char *r, size_t rl, char *err, size_t errlen)
{
    int a = tok_vocab_get(t, l, ll), b = tok_vocab_get(t, r, rl);
    if (a < 0 || b < 0) {
        error_set(err, errlen, "token '%.*s' is not in the vocabulary", (int)(a < 0 ? ll : rl), a < 0 ? l : r);
        return -1;
    }
    char *buf = xmalloc(ll + rl + 1);
    memcpy(buf, l, ll);
    memcpy(buf + ll, r, rl);
    int m = tok_vocab_get(t, buf, ll + rl);
    if (m < 0) {
        error_set(err, errlen, "merged token '%.*s' is not in the vocabulary", (int)(ll + rl), buf);
        free(buf);
        return -1;
    }
    free(buf);
    if (t->n_merges == t->merges_cap) {
        t->merges_cap = t->merges_cap ? 2 * t->merges_cap : 1024;
        t->merges = xrealloc(t->merges, (size_t)t->merges_cap * sizeof *t->merges);
    }
    t->merges[t->n_merges][0] = a;
    t->merges[t->n_merges][1] = b;
    t->merges[t->n_merges][2] = m;
    t->n_merges++;
    return 0;
}

int tok_add_added(struct tokenizer *t, const struct tok_added *a, char *err, size_t errlen)
{
    if (a->id < 0) {
        error_set(err, errlen, "added token '%s' has a negative id", a->content);
        return -1;
    }
    if (a->len == 0) {
        error_set(err, errlen, "added token %d has empty content", a->id);
        return -1;
    }
    if (a->id < t->n_ids && t->text[a->id] &&
        (t->text_len[a->id] != a->len || memcmp(t->text[a->id], a->content, a->len) != 0)) {
        /* tokenizers lets an added token take a vocabulary entry's id; the added spelling wins */
        log_warn("tokenizer", "added token %d '%s' replaces vocabulary entry '%s'", a->id, a->content, t->text[a->id]);
        free(t->text[a->id]);
        t->text[a->id] = NULL;
        t->flags[a->id] = 0;
    }
    tok_set_token(t, a->id, a->content, a->len, false);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == a->id) {
            error_set(err, errlen, "added token id %d appears twice", a->id);
            return -1;
        }
    t->added = xrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    struct tok_added *d = &t->added[t->n_added++];
    *d = *a;
    d->content = xmalloc(a->len + 1);
    memcpy(d->content, a->content, a->len);
    d->content[a->len] = 0;
    t->flags[a->id] |= TOKF_ADDED | (a->special ? TOKF_SPECIAL : 0);
    return 0;
}

/* White_Space, which \s means in tokenizers' Oniguruma; PCRE2 (10.42) also counts U+180E */
#define WS_CLASS                                                                                                       \
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* Spell \s and \S out as White_Space classes (outside a class: [..] / [^..]; inside one: \s
 * inlined, \S left alone). Other escapes and \Q..\E quoting are copied as they are. */
static char *rewrite_spaces(const char *pat)
{
    size_t n = strlen(pat), cap = n * 8 + 64, k = 0;
    char *o = xmalloc(cap);
    bool in_class = false, quoted = false;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (quoted) {
            if (c == '\\' && pat[i + 1] == 'E') {
                quoted = false;
                o[k++] = pat[i++];
            }
            o[k++] = pat[i];
            continue;
        }
        if (c == '\\' && i + 1 < n) {
            char d = pat[i + 1];
            if (d == 'Q')
                quoted = true;
            if (d == 's' && in_class) {
                k += (size_t)sprintf(o + k, "%s", WS_CLASS);
                i++;
                continue;
            }
            if ((d == 's' || d == 'S') && !in_class) {
                k += (size_t)sprintf(o + k, "[%s%s]", d == 'S' ? "^" : "", WS_CLASS);
                i++;
                continue;
            }
            o[k++] = c;
            o[k++] = pat[++i];
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            o[k++] = c;
            /* a ']' right after '[' or '[^' is a literal member */
            if (pat[i + 1] == '^')
                o[k++] = pat[++i];
            if (pat[i + 1] == ']')
                o[k++] = pat[++i];
            continue;
        }
        if (c == '[' && in_class && pat[i + 1] == ':') { /* POSIX [:name:] */
            const char *e = strstr(pat + i + 2, ":]");
            if (e) {
                size_t l = (size_t)(e + 2 - (pat + i));
                memcpy(o + k, pat + i, l);
                k += l;
                i += l - 1;
                continue;
            }
        }
        if (c == ']' && in_class)
            in_class = false;
        o[k++] = c;
    }
    o[k] = 0;
    return o;
}

int tok_add_step(struct tokenizer *t, const struct tok_step *s, char *err, size_t errlen)
{
    struct tok_step st = *s;
    st.pattern = s->pattern ? xstrdup(s->pattern) : NULL;
    st.re = NULL;
    const char *pat = NULL;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
    switch (st.kind) {
    case TOK_STEP_SPLIT:
        pat = st.pattern;
        if (st.literal)
            opts = (opts & ~(uint32_t)PCRE2_UCP) | PCRE2_LITERAL; /* LITERAL refuses UCP */
        break;
    case TOK_STEP_DIGITS: pat = st.individual_digits ? RE_DIGIT : RE_DIGITS; break;
    case TOK_STEP_BYTELEVEL: pat = st.use_regex ? TOK_RE_GPT2 : NULL; break;
    }
    if (pat) {
        int ec;
        PCRE2_SIZE eo;
        char *rw = (opts & PCRE2_LITERAL) ? xstrdup(pat) : rewrite_spaces(pat);
        st.re = pcre2_compile((PCRE2_SPTR)rw, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
        free(rw);
        if (!st.re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            error_set(err, errlen, "bad pre-tokenizer regex at offset %zu: %s", (size_t)eo, (char *)msg);
            free(st.pattern);
            return -1;
        }
        pcre2_jit_compile(st.re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if unavailable */
    }
    t->steps = xrealloc(t->steps, (size_t)(t->n_steps + 1) * sizeof *t->steps);
    t->steps[t->n_steps++] = st;
    return 0;
}

void tok_set_pre(struct tokenizer *t, enum tokenizer_pre pre)
{
    struct tok_step bl = {.kind = TOK_STEP_BYTELEVEL, .use_regex = false, .trim_offsets = false};
    struct tok_step sp = {.kind = TOK_STEP_SPLIT, .behavior = TOK_SPLIT_ISOLATED};
    switch (pre) {
    case TOKENIZER_PRE_CUSTOM:
    case TOKENIZER_PRE_GPT2:
        bl.use_regex = true;
        bl.trim_offsets = true;
        tok_add_step(t, &bl, NULL, 0);
        break;
    case TOKENIZER_PRE_SMOLLM: {
        struct tok_step d = {.kind = TOK_STEP_DIGITS, .individual_digits = true};
        tok_add_step(t, &d, NULL, 0);
        bl.use_regex = true;
        bl.trim_offsets = true;
        tok_add_step(t, &bl, NULL, 0);
        break;
    }
    case TOKENIZER_PRE_LLAMA3:
        sp.pattern = (char *)TOK_RE_LLAMA3;
        tok_add_step(t, &sp, NULL, 0);
        tok_add_step(t, &bl, NULL, 0);
        break;
    case TOKENIZER_PRE_QWEN2:
        sp.pattern = (char *)TOK_RE_QWEN2;
        tok_add_step(t, &sp, NULL, 0);
        tok_add_step(t, &bl, NULL, 0);
        break;
    }
    t->pre = pre == TOKENIZER_PRE_CUSTOM ? TOKENIZER_PRE_GPT2 : pre;
}

/* Which named family a step list is (for reporting and the tokenizer_config's class). */
static enum tokenizer_pre detect_pre(const struct tokenizer *t)
{
    const struct tok_step *s = t->steps;
    if (t->n_steps == 1 && s[0].kind == TOK_STEP_BYTELEVEL && s[0].use_regex)
        return TOKENIZER_PRE_GPT2;
    if (t->n_steps == 2 && s[0].kind == TOK_STEP_DIGITS && s[0].individual_digits && s[1].kind == TOK_STEP_BYTELEVEL &&
        s[1].use_regex)
        return TOKENIZER_PRE_SMOLLM;
    if (t->n_steps == 2 && s[0].kind == TOK_STEP_SPLIT && !s[0].literal && !s[0].invert &&
        s[0].behavior == TOK_SPLIT_ISOLATED && s[1].kind == TOK_STEP_BYTELEVEL && !s[1].use_regex) {
        if (strcmp(s[0].pattern, TOK_RE_LLAMA3) == 0)
            return TOKENIZER_PRE_LLAMA3;
        if (strcmp(s[0].pattern, TOK_RE_QWEN2) == 0)
            return TOKENIZER_PRE_QWEN2;
    }
    return TOKENIZER_PRE_CUSTOM;
}

/* The default system prompt of a ChatML template: the text of a literal
 * '<|im_start|>system\n...<|im_end|>' turn that the template writes itself. */
static char *find_default_system(const char *tpl)
{
    if (!tpl)
        return NULL;
    static const char head[] = "<|im_start|>system";
    for (const char *p = strstr(tpl, head); p; p = strstr(p + 1, head)) {
        const char *q = p + sizeof head - 1;
        if (*q == '\n')
            q++;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *e = strstr(q, "<|im_end|>");
        if (!e || e == q)
            continue;
        /* a literal prompt: no template syntax, no string-quote ends inside */
        bool literal = true;
        for (const char *c = q; c < e; c++)
            if (*c == '\'' || *c == '"' || *c == '{' || *c == '}' || *c == '\\') {
                literal = false;
                break;
            }
        if (!literal)
            continue;
        char *s = xmalloc((size_t)(e - q) + 1);
        memcpy(s, q, (size_t)(e - q));
        s[e - q] = 0;
        return s;
    }
    return NULL;
}

static int cmp_added_len_desc(const void *a, const void *b, void *ctx)
{
    const struct tok_added *ad = ctx;
    size_t la = ad[*(const int32_t *)a].len, lb = ad[*(const int32_t *)b].len;
    if (la != lb)
        return la > lb ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

int tok_finish(struct tokenizer *t, char *err, size_t errlen)
{
    tok_index(t);
    for (int b = 0; b < 256; b++) {
        const char *c = tok_byte_char((uint8_t)b);
        t->byte_id[b] = tok_vocab_get(t, c, strlen(c));
    }
    mergemap_build(t);
    for (int32_t r = 0; r < t->n_merges; r++)
        if (!mergemap_find(&t->merge_map, ((uint64_t)(uint32_t)t->merges[r][0] << 32) | (uint32_t)t->merges[r][1])) {
            error_set(err, errlen, "merge map lost merge %d", r);
            return -1;
        }

    /* decoded bytes: a token spelled wholly in the byte alphabet maps back through it,
     * any other token decodes to its own text (as tokenizers' ByteLevel decoder does) */
    for (int32_t i = 0; i < t->n_ids; i++) {
        free(t->bytes[i]);
        t->bytes[i] = NULL;
        t->bytes_len[i] = 0;
        if (!t->text[i])
            continue;
        const char *s = t->text[i];
        size_t n = t->text_len[i];
        char *o = xmalloc(n + 1);
        size_t k = 0;
        bool ok = true;
        for (size_t j = 0; j < n;) {
            uint32_t cp;
            j += tok_utf8_next(s + j, n - j, &cp);
            int b = tok_char_byte(cp);
            if (b < 0) {
                ok = false;
                break;
            }
            o[k++] = (char)b;
        }
        if (!ok) {
            memcpy(o, s, n);
            k = n;
        }
        o[k] = 0;
        t->bytes[i] = o;
        t->bytes_len[i] = (uint32_t)k;
    }

    for (int b = 0; b < 256; b++) {
        free(t->added_by_byte[b]);
        t->added_by_byte[b] = NULL;
        t->n_added_by_byte[b] = 0;
    }
    for (int i = 0; i < t->n_added; i++) {
        uint8_t b = (uint8_t)t->added[i].content[0];
        t->added_by_byte[b] = xrealloc(t->added_by_byte[b], (size_t)(t->n_added_by_byte[b] + 1) * sizeof(int32_t));
        t->added_by_byte[b][t->n_added_by_byte[b]++] = i;
    }
    for (int b = 0; b < 256; b++)
        if (t->n_added_by_byte[b] > 1)
            qsort_r(t->added_by_byte[b], (size_t)t->n_added_by_byte[b], sizeof(int32_t), cmp_added_len_desc, t->added);

    bool has_bytelevel = false;
    for (int i = 0; i < t->n_steps; i++)
        has_bytelevel |= t->steps[i].kind == TOK_STEP_BYTELEVEL;
    if (!has_bytelevel) {
        error_set(err, errlen, "pre-tokenizer has no ByteLevel step (only byte-level BPE is supported)");
        return -1;
    }
    t->pre = detect_pre(t);
    free(t->default_system);
    t->default_system = find_default_system(t->chat_template);
    return 0;
}

void tokenizer_free(struct tokenizer *t)
{
    if (!t)
        return;
    for (int32_t i = 0; i < t->n_ids; i++) {
        free(t->text[i]);
        free(t->bytes[i]);
    }
    free(t->text);
    free(t->text_len);
    free(t->bytes);
    free(t->bytes_len);
    free(t->flags);
    free(t->vocab.slots);
    free(t->merges);
    free(t->merge_map.slots);
    for (int i = 0; i < t->n_steps; i++) {
        free(t->steps[i].pattern);
        pcre2_code_free(t->steps[i].re);
    }
    free(t->steps);
    for (int i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    for (int b = 0; b < 256; b++)
        free(t->added_by_byte[b]);
    free(t->chat_template);
    free(t->default_system);
    json_decref(t->chat_kwargs);
    chat_renderer_free(t->chat);
    free(t);
}

/* ------------------------------------------------------------------------------------------ */
/* getters                                                                                    */

int tokenizer_vocab_size(const struct tokenizer *t)
{
    int32_t n = t->n_ids;
    while (n > 0 && !t->text[n - 1])
        n--;
    return n;
}
int tokenizer_bos_id(const struct tokenizer *t) { return t->bos_id; }
int tokenizer_eos_id(const struct tokenizer *t) { return t->eos_id; }
int tokenizer_pad_id(const struct tokenizer *t) { return t->pad_id; }
bool tokenizer_adds_bos(const struct tokenizer *t) { return t->add_bos; }
enum tokenizer_pre tokenizer_pre_type(const struct tokenizer *t) { return t->pre; }
const char *tokenizer_chat_template(const struct tokenizer *t) { return t->chat_template; }
const char *tokenizer_default_system_prompt(const struct tokenizer *t) { return t->default_system; }

void tokenizer_set_chat_template(struct tokenizer *t, const char *jinja)
{
    free(t->chat_template);
    t->chat_template = jinja ? xstrdup(jinja) : NULL;
    free(t->default_system);
    t->default_system = find_default_system(t->chat_template);
}

const char *tokenizer_token_text(const struct tokenizer *t, int id)
{
    return (id >= 0 && id < t->n_ids) ? t->text[id] : NULL;
}

const char *tokenizer_token_bytes(const struct tokenizer *t, int id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->bytes[id])
        return NULL;
    if (len)
        *len = t->bytes_len[id];
    return t->bytes[id];
}

int tokenizer_token_id(const struct tokenizer *t, const char *text)
{
    size_t n = strlen(text);
    for (int i = 0; i < t->n_added; i++) /* added tokens first, as tokenizers' token_to_id */
        if (t->added[i].len == n && memcmp(t->added[i].content, text, n) == 0)
            return t->added[i].id;
    return tok_vocab_get(t, text, n);
}

bool tokenizer_is_special(const struct tokenizer *t, int id)
{
    return id >= 0 && id < t->n_ids && (t->flags[id] & TOKF_SPECIAL);
}

/* ------------------------------------------------------------------------------------------ */
/* encoding                                                                                   */

struct span {
    size_t off, len;
};

struct spans {
    struct span *v;
    size_t n, cap;
};

static void spans_push(struct spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
}

struct heap_item {
    int32_t rank, pos, left, right;
};

struct enc {
    const struct tokenizer *t;
    const char *text;
    int32_t *out;
    size_t n, cap;
    struct spans a, b; /* pieces, double-buffered through the steps */
    struct spans m;    /* matches of one split, is_match in len's top bit */
    /* BPE scratch */
    int32_t *sym, *prev, *next;
    size_t sym_cap;
    struct heap_item *heap;
    size_t heap_n, heap_cap;
    char *tmp;
    size_t tmp_cap;
    pcre2_match_data *md;
};

static void emit(struct enc *e, int32_t id)
{
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 64;
        e->out = xrealloc(e->out, e->cap * sizeof *e->out);
    }
    e->out[e->n++] = id;
}

static bool heap_less(const struct heap_item *a, const struct heap_item *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct enc *e, struct heap_item it)
{
    if (e->heap_n == e->heap_cap) {
        e->heap_cap = e->heap_cap ? 2 * e->heap_cap : 64;
        e->heap = xrealloc(e->heap, e->heap_cap * sizeof *e->heap);
    }
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&it, &e->heap[p]))
            break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = it;
}

static struct heap_item heap_pop(struct enc *e)
{
    struct heap_item top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0, n = e->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&e->heap[c + 1], &e->heap[c]))
            c++;
        if (!heap_less(&e->heap[c], &last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n)
        e->heap[i] = last;
    return top;
}

static void push_pair(struct enc *e, int32_t pos)
{
    int32_t nx = e->next[pos];
    if (nx < 0)
        return;
    uint64_t key = ((uint64_t)(uint32_t)e->sym[pos] << 32) | (uint32_t)e->sym[nx];
    const struct tok_merge_slot *m = mergemap_find(&e->t->merge_map, key);
    if (m && m->merged >= 0)
        heap_push(e, (struct heap_item){m->rank, pos, e->sym[pos], e->sym[nx]});
}

/* BPE on one pre-token (raw bytes) */
static void bpe_piece(struct enc *e, const char *s, size_t n)
{
    const struct tokenizer *t = e->t;
    if (n == 0 || n > INT32_MAX / 2) /* symbol positions are int32 (a text this long has failed to allocate) */
        return;
    if (t->ignore_merges) {
        size_t need = 2 * n + 1;
        if (need > e->tmp_cap) {
            e->tmp_cap = need;
            e->tmp = xrealloc(e->tmp, need);
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            for (const char *c = tok_byte_char((uint8_t)s[i]); *c; c++)
                e->tmp[k++] = *c;
        int id = tok_vocab_get(t, e->tmp, k);
        if (id >= 0) {
            emit(e, id);
            return;
        }
    }
    if (n > e->sym_cap) {
        e->sym_cap = n < 64 ? 64 : n;
        e->sym = xrealloc(e->sym, e->sym_cap * sizeof *e->sym);
        e->prev = xrealloc(e->prev, e->sym_cap * sizeof *e->prev);
        e->next = xrealloc(e->next, e->sym_cap * sizeof *e->next);
    }
    /* initial symbols: one per byte; a byte with no token becomes unk (fused when asked) or is dropped */
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(uint8_t)s[i]];
        if (id < 0) {
            if (t->unk_id < 0)
                continue;
            if (t->fuse_unk && m > 0 && e->sym[m - 1] == t->unk_id)
                continue;
            id = t->unk_id;
        }
        e->sym[m] = id;
        e->prev[m] = m - 1;
        e->next[m] = m + 1;
        m++;
    }
    if (m == 0)
        return;
    e->next[m - 1] = -1;
    e->heap_n = 0;
    for (int32_t i = 0; i + 1 < m; i++)
        push_pair(e, i);
    while (e->heap_n) {
        struct heap_item it = heap_pop(e);
        int32_t p = it.pos;
        if (e->sym[p] < 0)
            continue; /* absorbed */
        int32_t nx = e->next[p];
        if (nx < 0 || e->sym[p] != it.left || e->sym[nx] != it.right)
            continue; /* stale */
        const struct tok_merge_slot *ms =
            mergemap_find(&t->merge_map, ((uint64_t)(uint32_t)it.left << 32) | (uint32_t)it.right);
        e->sym[p] = ms->merged;
        e->sym[nx] = -1;
        e->next[p] = e->next[nx];
        if (e->next[p] >= 0)
            e->prev[e->next[p]] = p;
        if (e->prev[p] >= 0)
            push_pair(e, e->prev[p]);
        push_pair(e, p);
    }
    for (int32_t i = 0; i >= 0; i = e->next[i])
        emit(e, e->sym[i]);
}

/* Matches of re in the piece, as spans with is_match flagged in the high bit of len. */
#define MATCH_BIT ((size_t)1 << (sizeof(size_t) * 8 - 1))

static void find_matches(struct enc *e, const pcre2_code *re, struct span piece)
{
    e->m.n = 0;
    const char *subj = e->text + piece.off;
    size_t len = piece.len, start = 0, prev = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    while (start <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)subj, len, start, 0, e->md, NULL);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* JIT stack exhausted: the interpreter uses the heap */
            rc = pcre2_match(re, (PCRE2_SPTR)subj, len, start, PCRE2_NO_JIT, e->md, NULL);
        if (rc < 0)
            break; /* no match (or a resource limit: the rest stays one piece) */
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* skip empty matches, one character on */
            if (ms >= len)
                break;
            uint32_t cp;
            start = ms + tok_utf8_next(subj + ms, len - ms, &cp);
            continue;
        }
        if (ms > prev)
            spans_push(&e->m, piece.off + prev, ms - prev);
        spans_push(&e->m, piece.off + ms, (me - ms) | MATCH_BIT);
        prev = start = me;
    }
    if (prev < len)
        spans_push(&e->m, piece.off + prev, len - prev);
}

static void split_piece(struct enc *e, const struct tok_step *st, struct span piece, struct spans *out)
{
    find_matches(e, st->re, piece);
    enum tok_split_behavior beh = st->kind == TOK_STEP_SPLIT ? st->behavior : TOK_SPLIT_ISOLATED;
    bool invert = st->kind == TOK_STEP_SPLIT && st->invert;
    size_t n = e->m.n;
    struct span *m = e->m.v;
    size_t first = out->n;
    bool prev_match = false;
    switch (beh) {
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++) {
            bool is = !!(m[i].len & MATCH_BIT) != invert;
            if (!is)
                spans_push(out, m[i].off, m[i].len & ~MATCH_BIT);
        }
        break;
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++)
            spans_push(out, m[i].off, m[i].len & ~MATCH_BIT);
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < n; i++) {
            bool is = !!(m[i].len & MATCH_BIT) != invert;
            size_t l = m[i].len & ~MATCH_BIT;
            if (is && !prev_match && out->n > first)
                out->v[out->n - 1].len = m[i].off + l - out->v[out->n - 1].off;
            else
                spans_push(out, m[i].off, l);
            prev_match = is;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        /* walk backwards: a match joins the piece after it unless that one is a match */
        size_t start_n = out->n;
        for (size_t k = n; k-- > 0;) {
            bool is = !!(m[k].len & MATCH_BIT) != invert;
            size_t l = m[k].len & ~MATCH_BIT;
            if (is && !prev_match && out->n > start_n) {
                struct span *last = &out->v[out->n - 1];
                last->len = last->off + last->len - m[k].off;
                last->off = m[k].off;
            } else
                spans_push(out, m[k].off, l);
            prev_match = is;
        }
        for (size_t i = start_n, j = out->n - 1; i < j; i++, j--) {
            struct span tmp = out->v[i];
            out->v[i] = out->v[j];
            out->v[j] = tmp;
        }
        break;
    }
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool is = !!(m[i].len & MATCH_BIT) != invert;
            size_t l = m[i].len & ~MATCH_BIT;
            if (is == prev_match && out->n > first)
                out->v[out->n - 1].len = m[i].off + l - out->v[out->n - 1].off;
            else
                spans_push(out, m[i].off, l);
            prev_match = is;
        }
        break;
    }
}

/* Pre-tokenize text[off..off+len) and BPE each piece. */
static void encode_plain(struct enc *e, size_t off, size_t len)
{
    if (len == 0)
        return;
    const struct tokenizer *t = e->t;
    e->a.n = 0;
    spans_push(&e->a, off, len);
    for (int si = 0; si < t->n_steps; si++) {
        const struct tok_step *st = &t->steps[si];
        if (!st->re)
            continue; /* ByteLevel without regex: the byte mapping happens in bpe_piece */
        e->b.n = 0;
        for (size_t i = 0; i < e->a.n; i++)
            split_piece(e, st, e->a.v[i], &e->b);
        struct spans tmp = e->a;
        e->a = e->b;
        e->b = tmp;
    }
    for (size_t i = 0; i < e->a.n; i++)
        bpe_piece(e, e->text + e->a.v[i].off, e->a.v[i].len);
}

/* Leftmost-longest added token in text[from..len): index into t->added, or -1. */
static int find_added(const struct tokenizer *t, const char *text, size_t len, size_t from, size_t *at)
{
    for (size_t p = from; p < len; p++) {
        uint8_t b = (uint8_t)text[p];
        int nb = t->n_added_by_byte[b];
        if (!nb)
            continue;
        const int32_t *c = t->added_by_byte[b];
        for (int i = 0; i < nb; i++) {
            const struct tok_added *a = &t->added[c[i]];
            if (a->len <= len - p && memcmp(text + p, a->content, a->len) == 0) {
                *at = p;
                return c[i];
            }
        }
    }
    return -1;
}

static size_t utf8_prev(const char *s, size_t pos)
{
    size_t p = pos - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80 && pos - p < 4)
        p--;
    return p;
}

int32_t *tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, unsigned flags, size_t *n)
{
    struct enc e = {.t = t, .text = text, .tmp_cap = 64};
    e.tmp = xmalloc(e.tmp_cap);
    e.md = pcre2_match_data_create(4, NULL);
    CHECK_ALLOC(e.md);
    size_t pos = 0;
    if (t->n_added && !(flags & TOKENIZER_ENCODE_NO_ADDED)) {
        for (;;) {
            size_t at;
            int ai = find_added(t, text, len, pos, &at);
            if (ai < 0)
                break;
            const struct tok_added *a = &t->added[ai];
            size_t ms = at, me = at + a->len;
            if (a->lstrip)
                while (ms > pos) {
                    size_t q = utf8_prev(text, ms);
                    uint32_t cp;
                    tok_utf8_next(text + q, ms - q, &cp);
                    if (!is_unicode_space(cp))
                        break;
                    ms = q;
                }
            if (a->rstrip)
                while (me < len) {
                    uint32_t cp;
                    size_t l = tok_utf8_next(text + me, len - me, &cp);
                    if (!is_unicode_space(cp))
                        break;
                    me += l;
                }
            encode_plain(&e, pos, ms - pos);
            emit(&e, a->id);
            pos = me;
        }
    }
    encode_plain(&e, pos, len - pos);
    pcre2_match_data_free(e.md);
    free(e.a.v);
    free(e.b.v);
    free(e.m.v);
    free(e.sym);
    free(e.prev);
    free(e.next);
    free(e.heap);
    free(e.tmp);
    if (!e.out)
        e.out = xmalloc(sizeof *e.out);
    *n = e.n;
    return e.out;
}

char *tokenizer_decode_utf8(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special)
{
    char *raw = tokenizer_decode(t, ids, n, skip_special);
    const size_t len = strlen(raw);
    char *o = xmalloc(3 * len + 1); /* one bad byte becomes 3 */
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        const size_t step = tok_utf8_next(raw + i, len - i, &cp);
        if (cp == 0xFFFFFFFFu) {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
        } else {
            memcpy(o + k, raw + i, step);
            k += step;
        }
        i += step;
    }
    o[k] = '\0';
    free(raw);
    return o;
}

char *tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_ids && t->bytes[ids[i]])
            total += t->bytes_len[ids[i]];
    char *o = xmalloc(total + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->bytes[id])
            continue;
        if (skip_special && (t->flags[id] & TOKF_SPECIAL))
            continue;
        memcpy(o + k, t->bytes[id], t->bytes_len[id]);
        k += t->bytes_len[id];
    }
    o[k] = 0;
    return o;
}
