/* Loading a tokenizer from tokenizer.json or GGUF metadata, and saving tokenizer.json and
 * tokenizer_config.json for the Hugging Face layout. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/fs.h"
#include "common/json_file.h"
#include "common/log.h"
#include "worker/formats/gguf.h"
#include "worker/tokenizer/tokenizer_internal.h"

#define ERRMAX 512

/* ------------------------------------------------------------------------------------------ */
/* tokenizer.json                                                                             */

static bool jbool(const json_t *o, const char *key, bool def)
{
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static int parse_pre(struct tokenizer *t, const json_t *pt, char *e, size_t el, int depth)
{
    if (!json_is_object(pt)) {
        error_set(e, el, "pre_tokenizer is not an object");
        return -1;
    }
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!type) {
        error_set(e, el, "pre_tokenizer has no type");
        return -1;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(pt, "pretokenizers");
        if (!json_is_array(arr) || depth > 8) {
            error_set(e, el, "pre_tokenizer Sequence has no pretokenizers array");
            return -1;
        }
        size_t i;
        const json_t *it;
        json_array_foreach(arr, i, it)
        {
            if (parse_pre(t, it, e, el, depth + 1) < 0)
                return -1;
        }
        return 0;
    }
    struct tok_step st = {0};
    if (strcmp(type, "ByteLevel") == 0) {
        if (jbool(pt, "add_prefix_space", false)) {
            error_set(e, el, "pre_tokenizer ByteLevel with add_prefix_space=true is not supported");
            return -1;
        }
        st.kind = TOK_STEP_BYTELEVEL;
        st.use_regex = jbool(pt, "use_regex", true);
        st.trim_offsets = jbool(pt, "trim_offsets", true);
    } else if (strcmp(type, "Digits") == 0) {
        st.kind = TOK_STEP_DIGITS;
        st.individual_digits = jbool(pt, "individual_digits", false);
    } else if (strcmp(type, "Split") == 0) {
        st.kind = TOK_STEP_SPLIT;
        const json_t *pat = json_object_get(pt, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (!re && !lit) {
            error_set(e, el, "pre_tokenizer Split has no pattern Regex or String");
            return -1;
        }
        st.pattern = (char *)(re ? re : lit);
        st.literal = !re;
        const char *beh = json_string_value(json_object_get(pt, "behavior"));
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int b = -1;
        for (int i = 0; beh && i < 5; i++)
            if (strcmp(beh, names[i]) == 0)
                b = i;
        if (b < 0) {
            error_set(e, el, "pre_tokenizer Split has unknown behavior '%s'", beh ? beh : "(none)");
            return -1;
        }
        st.behavior = (enum tok_split_behavior)b;
        st.invert = jbool(pt, "invert", false);
    } else {
        error_set(e, el, "pre_tokenizer type '%s' is not supported", type);
        return -1;
    }
    return tok_add_step(t, &st, e, el);
}

static int parse_normalizer(const json_t *n, char *e, size_t el)
{
    if (!n || json_is_null(n))
        return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        const json_t *it;
        json_array_foreach(json_object_get(n, "normalizers"), i, it)
        {
            if (parse_normalizer(it, e, el) < 0)
                return -1;
        }
        return 0;
    }
    if (type && (strcmp(type, "NFC") == 0 || strcmp(type, "NFKC") == 0)) {
        log_warn("tokenizer", "normalizer %s is not applied: encodings agree on text already in %s form", type, type);
        return 0;
    }
    error_set(e, el, "normalizer type '%s' is not supported", type ? type : "(none)");
    return -1;
}

/* A TemplateProcessing that puts a special token before the sequence: that token is a BOS. */
static void parse_post(struct tokenizer *t, const json_t *pp)
{
    if (!pp || json_is_null(pp))
        return;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        const json_t *it;
        json_array_foreach(json_object_get(pp, "processors"), i, it) { parse_post(t, it); }
        return;
    }
    if (!type || strcmp(type, "ByteLevel") == 0)
        return;
    if (strcmp(type, "TemplateProcessing") == 0) {
        const json_t *single = json_object_get(pp, "single");
        const json_t *first = json_array_get(single, 0);
        const char *name = json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
        if (name) {
            const json_t *st = json_object_get(json_object_get(pp, "special_tokens"), name);
            const json_t *ids = json_object_get(st, "ids");
            int id = json_is_integer(json_array_get(ids, 0)) ? (int)json_integer_value(json_array_get(ids, 0))
                                                             : tokenizer_token_id(t, name);
            if (id >= 0 && id < t->n_ids && t->text[id]) {
                t->add_bos = true;
                t->bos_id = id;
            } else if (id >= 0) {
                log_warn("tokenizer", "post_processor: special token '%s' has id %d, which is not a token; ignored",
                         name, id);
            }
        }
        return;
    }
    log_warn("tokenizer", "post_processor %s is ignored", type);
}

/* The special-token string of a tokenizer_config.json entry (a string or an AddedToken object). */
static const char *cfg_token(const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    if (json_is_string(v))
        return json_string_value(v);
    return json_string_value(json_object_get(v, "content"));
}

static char *read_text_file(const char *path)
{
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why); /* a FIFO is refused, not waited on */
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *s = xmalloc(cap);
    size_t r;
    while ((r = fread(s + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n - 1 == 0) {
            cap *= 2;
            s = xrealloc(s, cap);
        }
    }
    fclose(f);
    s[n] = 0;
    return s;
}

/* The chat template of a tokenizer_config.json: a string, or [{name, template}] (the "default" one, else the
 * first). Absent: NULL with *bad false. Present and not one of those (a number, an object, a list without a
 * template, an empty text): NULL with *bad true. */
static const char *config_chat_template(const json_t *cfg, bool *bad)
{
    const json_t *ct = json_object_get(cfg, "chat_template");
    *bad = false;
    if (!ct || json_is_null(ct))
        return NULL;
    const char *pick = NULL;
    if (json_is_string(ct)) {
        pick = json_string_value(ct);
    } else if (json_is_array(ct)) {
        size_t i;
        const json_t *it;
        json_array_foreach(ct, i, it)
        {
            const char *nm = json_string_value(json_object_get(it, "name"));
            const char *tp = json_string_value(json_object_get(it, "template"));
            if (tp && (!pick || (nm && strcmp(nm, "default") == 0)))
                pick = tp;
        }
    }
    *bad = !pick || !*pick;
    return *bad ? NULL : pick;
}

/* tokenizer_config.json (and chat_template.jinja) beside a tokenizer.json: special ids, chat template,
 * add_bos. Missing files are fine; a config that is not JSON, or whose chat_template is neither a text nor a
 * list of named ones, is an error naming the file (0, or -1 with err). */
static int load_config_beside(struct tokenizer *t, const char *path, char *err, size_t errlen)
{
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    char *cfgp = xmalloc(dl + 64);
    memcpy(cfgp, path, dl);
    strcpy(cfgp + dl, "tokenizer_config.json");
    if (access(cfgp, R_OK) == 0) {
        json_error_t je;
        json_t *cfg = json_file_load(cfgp, &je);
        if (!cfg || !json_is_object(cfg)) {
            if (cfg)
                error_set(err, errlen, "%s: not a JSON object (it holds the chat template and special tokens)", cfgp);
            else
                error_set(err, errlen,
                          "%s: %s (line %d): not valid JSON (it holds the chat template and special "
                          "tokens)",
                          cfgp, je.text, je.line);
            json_decref(cfg);
            free(cfgp);
            return -1;
        }
        const char *s;
        if ((s = cfg_token(cfg, "bos_token")))
            t->bos_id = tokenizer_token_id(t, s);
        if ((s = cfg_token(cfg, "eos_token")))
            t->eos_id = tokenizer_token_id(t, s);
        if ((s = cfg_token(cfg, "pad_token")))
            t->pad_id = tokenizer_token_id(t, s);
        if ((s = cfg_token(cfg, "unk_token")))
            t->cfg_unk_id = tokenizer_token_id(t, s);
        const json_t *ab = json_object_get(cfg, "add_bos_token");
        if (json_is_boolean(ab))
            t->add_bos = json_is_true(ab);
        bool bad;
        const char *tpl = config_chat_template(cfg, &bad);
        if (bad) {
            error_set(err, errlen,
                      "%s: chat_template is not a template (a non-empty text, or a list of {\"name\", "
                      "\"template\"}): fix or remove it",
                      cfgp);
            json_decref(cfg);
            free(cfgp);
            return -1;
        }
        if (tpl)
            tokenizer_set_chat_template(t, tpl);
        json_decref(cfg);
    }
    strcpy(cfgp + dl, "chat_template.jinja");
    if (!t->chat_template) {
        char *tpl = read_text_file(cfgp);
        if (tpl) {
            tokenizer_set_chat_template(t, tpl);
            free(tpl);
        }
    }
    free(cfgp);
    return 0;
}

static struct tokenizer *from_json_root(const json_t *root, const char *name, char *err, size_t errlen)
{
    char e[ERRMAX] = "";
    struct tokenizer *t = NULL;
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        error_set(err, errlen, "%s: no \"model\" object", name);
        return NULL;
    }
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE") != 0) {
        error_set(err, errlen, "%s: model.type is '%s'; only BPE is supported", name, mtype);
        return NULL;
    }
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0) {
        error_set(err, errlen, "%s: missing or empty model.vocab", name);
        return NULL;
    }
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) {
        error_set(err, errlen, "%s: missing model.merges", name);
        return NULL;
    }
    for (const char **k = (const char *[]){"continuing_subword_prefix", "end_of_word_suffix", NULL}; *k; k++) {
        const char *s = json_string_value(json_object_get(model, *k));
        if (s && *s) {
            error_set(err, errlen, "%s: model.%s '%s' is not supported", name, *k, s);
            return NULL;
        }
    }
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added)) {
        error_set(err, errlen, "%s: added_tokens is not an array", name);
        return NULL;
    }
    /* Ids index arrays as long as the largest id: bound them by what the file defines, so that a stray id (near
     * 2^31, or 10^8) is an error rather than gigabytes of allocation. Real tokenizers number their vocabulary and
     * added tokens densely; twice their count leaves room for gaps. */
    const json_int_t n_entries = (json_int_t)json_object_size(vocab) + (json_int_t)json_array_size(added);
    const json_int_t id_limit = 2 * n_entries + 256;
    t = tok_new((int32_t)json_object_size(vocab));
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)vocab, key, val)
    {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id > 0x7fffffff) {
            error_set(err, errlen, "%s: model.vocab['%s'] is not a valid id", name, key);
            goto fail;
        }
        if (id >= id_limit) {
            error_set(err, errlen,
                      "%s: model.vocab['%s'] has id %lld; a file of %lld vocabulary entries and added tokens may use "
                      "ids below %lld",
                      name, key, (long long)id, (long long)n_entries, (long long)id_limit);
            goto fail;
        }
        if (tok_set_token(t, (int32_t)id, key, strlen(key), true) < 0) {
            error_set(err, errlen, "%s: model.vocab: id %lld is used by '%s' and '%s'", name, (long long)id,
                      t->text[id], key);
            goto fail;
        }
    }
    t->ignore_merges = jbool(model, "ignore_merges", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);

    size_t i;
    const json_t *it;
    json_array_foreach(added, i, it)
    {
        const json_t *jid = json_object_get(it, "id");
        const char *content = json_string_value(json_object_get(it, "content"));
        if (!json_is_integer(jid) || !content || json_integer_value(jid) < 0 || json_integer_value(jid) > 0x7fffffff) {
            error_set(err, errlen, "%s: added_tokens[%zu] needs an id and a content", name, i);
            goto fail;
        }
        if (json_integer_value(jid) >= id_limit) {
            error_set(err, errlen,
                      "%s: added_tokens[%zu] ('%s') has id %lld; a file of %lld vocabulary entries and added tokens "
                      "may use ids below %lld",
                      name, i, content, (long long)json_integer_value(jid), (long long)n_entries, (long long)id_limit);
            goto fail;
        }
        struct tok_added a = {
            .id = (int32_t)json_integer_value(jid),
            .content = (char *)content,
            .len = strlen(content),
            .special = jbool(it, "special", false),
            .lstrip = jbool(it, "lstrip", false),
            .rstrip = jbool(it, "rstrip", false),
            .single_word = jbool(it, "single_word", false),
        };
        a.normalized = jbool(it, "normalized", !a.special);
        if (tok_add_added(t, &a, e, sizeof e) < 0) {
            error_set(err, errlen, "%s: added_tokens[%zu]: %s", name, i, e);
            goto fail;
        }
    }
    tok_index(t);
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    if (unk) {
        t->unk_id = tokenizer_token_id(t, unk);
        t->cfg_unk_id = t->unk_id;
    }

    json_array_foreach(merges, i, it)
    {
        const char *l, *r;
        size_t ll, rl;
        if (json_is_string(it)) {
            const char *s = json_string_value(it);
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ') || sp == s || !sp[1]) {
                error_set(err, errlen, "%s: model.merges[%zu] '%s' is not two tokens separated by one space", name, i,
                          s);
                goto fail;
            }
            l = s;
            ll = (size_t)(sp - s);
            r = sp + 1;
            rl = strlen(r);
        } else if (json_is_array(it) && json_array_size(it) == 2 && json_is_string(json_array_get(it, 0)) &&
                   json_is_string(json_array_get(it, 1))) {
            l = json_string_value(json_array_get(it, 0));
            r = json_string_value(json_array_get(it, 1));
            ll = strlen(l);
            rl = strlen(r);
        } else {
            error_set(err, errlen, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", name, i);
            goto fail;
        }
        if (tok_add_merge(t, l, ll, r, rl, e, sizeof e) < 0) {
            error_set(err, errlen, "%s: model.merges[%zu]: %s", name, i, e);
            goto fail;
        }
    }

    if (parse_normalizer(json_object_get(root, "normalizer"), e, sizeof e) < 0) {
        error_set(err, errlen, "%s: %s", name, e);
        goto fail;
    }
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    if (!pre || json_is_null(pre)) {
        error_set(err, errlen, "%s: no pre_tokenizer (only byte-level BPE is supported)", name);
        goto fail;
    }
    if (parse_pre(t, pre, e, sizeof e, 0) < 0) {
        error_set(err, errlen, "%s: %s", name, e);
        goto fail;
    }
    parse_post(t, json_object_get(root, "post_processor"));
    if (tok_finish(t, e, sizeof e) < 0) {
        error_set(err, errlen, "%s: %s", name, e);
        goto fail;
    }
    return t;
fail:
    tokenizer_free(t);
    return NULL;
}

struct tokenizer *tokenizer_from_json_string(const char *json, size_t len, const char *name, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je);
    if (!root) {
        error_set(err, errlen, "%s: %s (line %d, column %d)", name, je.text, je.line, je.column);
        return NULL;
    }
    struct tokenizer *t = NULL;
    if (!json_is_object(root))
        error_set(err, errlen, "%s: not a JSON object", name);
    else
        t = from_json_root(root, name, err, errlen);
    json_decref(root);
    return t;
}

struct tokenizer *tokenizer_from_json(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        error_set(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadf(f, 0, &je);
    fclose(f);
    if (!root) {
        error_set(err, errlen, "%s: %s (line %d, column %d)", path, je.text, je.line, je.column);
        return NULL;
    }
    struct tokenizer *t = NULL;
    if (!json_is_object(root))
        error_set(err, errlen, "%s: not a JSON object", path);
    else
        t = from_json_root(root, path, err, errlen);
    json_decref(root);
    if (t && load_config_beside(t, path, err, errlen) != 0) {
        tokenizer_free(t);
        t = NULL;
    }
    return t;
}

/* ------------------------------------------------------------------------------------------ */
/* GGUF                                                                                       */

static const struct {
    const char *name;
    enum tokenizer_pre pre;
} gguf_pres[] = {
    {"gpt-2", TOKENIZER_PRE_GPT2},       {"default", TOKENIZER_PRE_GPT2},
    {"phi-2", TOKENIZER_PRE_GPT2},       {"mpt", TOKENIZER_PRE_GPT2},
    {"olmo", TOKENIZER_PRE_GPT2},        {"smollm", TOKENIZER_PRE_SMOLLM},
    {"starcoder", TOKENIZER_PRE_SMOLLM}, {"refact", TOKENIZER_PRE_SMOLLM},
    {"codeshell", TOKENIZER_PRE_SMOLLM}, {"llama-bpe", TOKENIZER_PRE_LLAMA3},
    {"llama3", TOKENIZER_PRE_LLAMA3},    {"llama-v3", TOKENIZER_PRE_LLAMA3},
    {"falcon3", TOKENIZER_PRE_LLAMA3},   {"pixtral", TOKENIZER_PRE_LLAMA3},
    {"qwen2", TOKENIZER_PRE_QWEN2},      {"deepseek-r1-qwen", TOKENIZER_PRE_QWEN2},
};

struct tokenizer *tokenizer_from_gguf(const struct gguf_file *g, char *err, size_t errlen)
{
    const char *path = gguf_path(g);
    char e[ERRMAX] = "";
    const char *model = gguf_get_str(g, "tokenizer.ggml.model");
    if (!model) {
        error_set(err, errlen, "%s: no tokenizer.ggml.model", path);
        return NULL;
    }
    if (strcmp(model, "gpt2") != 0) {
        error_set(err, errlen, "%s: tokenizer.ggml.model is '%s'; only 'gpt2' (byte-level BPE) is supported", path,
                  model);
        return NULL;
    }
    const char *pre_name = gguf_get_str(g, "tokenizer.ggml.pre");
    enum tokenizer_pre pre = TOKENIZER_PRE_CUSTOM;
    for (size_t i = 0; i < sizeof gguf_pres / sizeof gguf_pres[0]; i++)
        if (strcmp(pre_name ? pre_name : "default", gguf_pres[i].name) == 0)
            pre = gguf_pres[i].pre;
    if (pre == TOKENIZER_PRE_CUSTOM) {
        error_set(err, errlen,
                  "%s: tokenizer.ggml.pre '%s' is not supported (known: gpt-2, default, smollm, starcoder, "
                  "llama-bpe, qwen2 and their aliases)",
                  path, pre_name);
        return NULL;
    }
    size_t n = gguf_get_arr_n(g, "tokenizer.ggml.tokens");
    if (n == 0 || n > 0x7fffffff) {
        error_set(err, errlen, "%s: missing or empty tokenizer.ggml.tokens", path);
        return NULL;
    }
    size_t n_types = gguf_get_arr_n(g, "tokenizer.ggml.token_type");
    if (n_types && n_types != n) {
        error_set(err, errlen, "%s: tokenizer.ggml.token_type has %zu entries for %zu tokens", path, n_types, n);
        return NULL;
    }
    size_t n_merges = gguf_get_arr_n(g, "tokenizer.ggml.merges");
    if (n_merges == 0) {
        error_set(err, errlen, "%s: missing or empty tokenizer.ggml.merges", path);
        return NULL;
    }
    struct tokenizer *t = tok_new((int32_t)n);
    /* types 3 (control) become special added tokens, 4 (user-defined) plain added tokens, as
     * transformers' GGUF loader does; a token outside the byte alphabet is spelled through it */
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gguf_get_arr_str(g, "tokenizer.ggml.tokens", i, &len);
        if (!s) {
            error_set(err, errlen, "%s: tokenizer.ggml.tokens[%zu] is not a string", path, i);
            goto fail;
        }
        bool in_alpha = tok_in_alphabet(s, len);
        if (in_alpha)
            tok_set_token(t, (int32_t)i, s, len, true);
        else {
            size_t tl;
            char *txt = tok_bytes_to_text(s, len, &tl);
            tok_set_token(t, (int32_t)i, txt, tl, true);
            free(txt);
        }
        int64_t type = 1;
        if (n_types && gguf_get_arr_int(g, "tokenizer.ggml.token_type", i, &type) < 0) {
            error_set(err, errlen, "%s: tokenizer.ggml.token_type[%zu] is not an integer", path, i);
            goto fail;
        }
        if ((type == 3 || type == 4) && in_alpha && len > 0) {
            struct tok_added a = {.id = (int32_t)i, .content = (char *)s, .len = len, .special = type == 3};
            if (tok_add_added(t, &a, e, sizeof e) < 0) {
                error_set(err, errlen, "%s: tokenizer.ggml.tokens[%zu]: %s", path, i, e);
                goto fail;
            }
        }
    }
    tok_index(t);
    for (size_t i = 0; i < n_merges; i++) {
        size_t len;
        const char *s = gguf_get_arr_str(g, "tokenizer.ggml.merges", i, &len);
        const char *sp = s ? memchr(s, ' ', len) : NULL;
        if (!sp || sp == s || (size_t)(sp - s) + 1 >= len || memchr(sp + 1, ' ', len - (size_t)(sp - s) - 1)) {
            error_set(err, errlen, "%s: tokenizer.ggml.merges[%zu] '%.*s' is not two tokens separated by one space",
                      path, i, s ? (int)len : 0, s ? s : "");
            goto fail;
        }
        if (tok_add_merge(t, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp - s) - 1, e, sizeof e) < 0) {
            error_set(err, errlen, "%s: tokenizer.ggml.merges[%zu]: %s", path, i, e);
            goto fail;
        }
    }
    tok_set_pre(t, pre);
    t->ignore_merges = pre == TOKENIZER_PRE_LLAMA3; /* llama.cpp and Llama-3's tokenizer.json do */
    int64_t v;
    if (gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v) == 0 && v >= 0 && v < (int64_t)n)
        t->bos_id = (int32_t)v;
    if (gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v) == 0 && v >= 0 && v < (int64_t)n)
        t->eos_id = (int32_t)v;
    if (gguf_get_int(g, "tokenizer.ggml.padding_token_id", &v) == 0 && v >= 0 && v < (int64_t)n)
        t->pad_id = (int32_t)v;
    if (gguf_get_int(g, "tokenizer.ggml.unknown_token_id", &v) == 0 && v >= 0 && v < (int64_t)n)
        t->cfg_unk_id = (int32_t)v;
    if (gguf_get_int(g, "tokenizer.ggml.add_bos_token", &v) == 0)
        t->add_bos = v != 0;
    const char *tpl = gguf_get_str(g, "tokenizer.chat_template");
    if (tpl)
        t->chat_template = xstrdup(tpl);
    if (tok_finish(t, e, sizeof e) < 0) {
        error_set(err, errlen, "%s: %s", path, e);
        goto fail;
    }
    return t;
fail:
    tokenizer_free(t);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* saving                                                                                     */

static json_t *step_json(const struct tok_step *s)
{
    static const char *beh[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    switch (s->kind) {
    case TOK_STEP_SPLIT:
        return json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", s->literal ? "String" : "Regex",
                         s->pattern, "behavior", beh[s->behavior], "invert", s->invert);
    case TOK_STEP_DIGITS: return json_pack("{s:s, s:b}", "type", "Digits", "individual_digits", s->individual_digits);
    case TOK_STEP_BYTELEVEL:
        return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets",
                         s->trim_offsets, "use_regex", s->use_regex);
    }
    return json_null();
}

static json_t *added_json(const struct tok_added *a)
{
    return json_pack("{s:i, s:s%, s:b, s:b, s:b, s:b, s:b}", "id", a->id, "content", a->content, a->len, "single_word",
                     a->single_word, "lstrip", a->lstrip, "rstrip", a->rstrip, "normalized", a->normalized, "special",
                     a->special);
}

static int cmp_added_id(const void *a, const void *b)
{
    return ((const struct tok_added *)a)->id - ((const struct tok_added *)b)->id;
}

/* Write root to path, atomically and durably (common/fs). */
static int dump_atomic(json_t *root, const char *path, char *err, size_t errlen)
{
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text)
        return error_set(err, errlen, "%s: cannot encode the JSON", path);
    int rc = fs_write_atomic(path, text, strlen(text), err, errlen);
    free(text);
    return rc;
}

int tokenizer_save_json(const struct tokenizer *t, const char *path, char *err, size_t errlen)
{
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    struct tok_added *sorted = xmalloc((size_t)(t->n_added ? t->n_added : 1) * sizeof *sorted);
    if (t->n_added) /* t->added is NULL without added tokens */
        memcpy(sorted, t->added, (size_t)t->n_added * sizeof *sorted);
    qsort(sorted, (size_t)t->n_added, sizeof *sorted, cmp_added_id);
    json_t *added = json_array();
    for (int i = 0; i < t->n_added; i++)
        json_array_append_new(added, added_json(&sorted[i]));
    free(sorted);
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "normalizer", json_null());
    json_t *pre;
    if (t->n_steps == 1)
        pre = step_json(&t->steps[0]);
    else {
        json_t *arr = json_array();
        for (int i = 0; i < t->n_steps; i++)
            json_array_append_new(arr, step_json(&t->steps[i]));
        pre = json_pack("{s:s, s:o}", "type", "Sequence", "pretokenizers", arr);
    }
    json_object_set_new(root, "pre_tokenizer", pre);
    if (t->add_bos && t->bos_id >= 0 && t->text[t->bos_id]) {
        const char *b = t->text[t->bos_id];
        json_t *st = json_object();
        json_object_set_new(st, b, json_pack("{s:s, s:[i], s:[s]}", "id", b, "ids", t->bos_id, "tokens", b));
        json_object_set_new(root, "post_processor",
                            json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}, "
                                      "{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:o}",
                                      "type", "TemplateProcessing", "single", "SpecialToken", "id", b, "type_id", 0,
                                      "Sequence", "id", "A", "type_id", 0, "pair", "SpecialToken", "id", b, "type_id",
                                      0, "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", b, "type_id", 1,
                                      "Sequence", "id", "B", "type_id", 1, "special_tokens", st));
    } else
        json_object_set_new(root, "post_processor",
                            json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1,
                                      "trim_offsets", 0, "use_regex", 1));
    json_object_set_new(root, "decoder",
                        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
                                  "use_regex", 1));

    json_t *model = json_object();
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "dropout", json_null());
    json_object_set_new(model, "unk_token",
                        t->unk_id >= 0 && t->text[t->unk_id] ? json_string(t->text[t->unk_id]) : json_null());
    json_object_set_new(model, "continuing_subword_prefix", json_null());
    json_object_set_new(model, "end_of_word_suffix", json_null());
    json_object_set_new(model, "fuse_unk", json_boolean(t->fuse_unk));
    json_object_set_new(model, "byte_fallback", json_false());
    json_object_set_new(model, "ignore_merges", json_boolean(t->ignore_merges));
    json_t *vocab = json_object();
    for (int32_t i = 0; i < t->n_ids; i++)
        if (t->text[i] && (t->flags[i] & TOKF_IN_VOCAB) && tok_vocab_get(t, t->text[i], t->text_len[i]) == i)
            json_object_setn_new_nocheck(vocab, t->text[i], t->text_len[i], json_integer(i));
    json_object_set_new(model, "vocab", vocab);
    bool pairs = false; /* merges as "a b" unless a token holds a space */
    for (int32_t r = 0; r < t->n_merges && !pairs; r++)
        pairs = memchr(t->text[t->merges[r][0]], ' ', t->text_len[t->merges[r][0]]) ||
                memchr(t->text[t->merges[r][1]], ' ', t->text_len[t->merges[r][1]]);
    json_t *merges = json_array();
    for (int32_t r = 0; r < t->n_merges; r++) {
        int32_t a = t->merges[r][0], b = t->merges[r][1];
        if (pairs)
            json_array_append_new(
                merges, json_pack("[s%, s%]", t->text[a], (size_t)t->text_len[a], t->text[b], (size_t)t->text_len[b]));
        else {
            size_t la = t->text_len[a], lb = t->text_len[b];
            char *s = xmalloc(la + lb + 2);
            memcpy(s, t->text[a], la);
            s[la] = ' ';
            memcpy(s + la + 1, t->text[b], lb);
            json_array_append_new(merges, json_stringn_nocheck(s, la + lb + 1));
            free(s);
        }
    }
    json_object_set_new(model, "merges", merges);
    json_object_set_new(root, "model", model);
    int rc = dump_atomic(root, path, err, errlen);
    json_decref(root);
    return rc;
}

int tokenizer_save_config_json(const struct tokenizer *t, const char *path, char *err, size_t errlen)
{
    json_t *root = json_object();
    json_object_set_new(root, "add_bos_token", json_boolean(t->add_bos));
    json_object_set_new(root, "add_prefix_space", json_false());
    json_t *dec = json_object();
    struct tok_added *sorted = xmalloc((size_t)(t->n_added ? t->n_added : 1) * sizeof *sorted);
    if (t->n_added) /* t->added is NULL without added tokens */
        memcpy(sorted, t->added, (size_t)t->n_added * sizeof *sorted);
    qsort(sorted, (size_t)t->n_added, sizeof *sorted, cmp_added_id);
    for (int i = 0; i < t->n_added; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", sorted[i].id);
        json_t *a = added_json(&sorted[i]);
        json_object_del(a, "id");
        json_object_set_new(dec, key, a);
    }
    free(sorted);
    json_object_set_new(root, "added_tokens_decoder", dec);
    const struct {
        const char *key;
        int32_t id;
    } sp[] = {
        {"bos_token", t->bos_id}, {"eos_token", t->eos_id}, {"pad_token", t->pad_id}, {"unk_token", t->cfg_unk_id}};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        json_object_set_new(root, sp[i].key,
                            sp[i].id >= 0 && sp[i].id < t->n_ids && t->text[sp[i].id] ? json_string(t->text[sp[i].id])
                                                                                      : json_null());
    if (t->chat_template)
        json_object_set_new(root, "chat_template", json_string(t->chat_template));
    json_object_set_new(root, "clean_up_tokenization_spaces", json_false());
    json_object_set_new(root, "tokenizer_class", json_string("PreTrainedTokenizerFast"));
    int rc = dump_atomic(root, path, err, errlen);
    json_decref(root);
    return rc;
}
