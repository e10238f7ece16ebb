/* Byte-level BPE tokenizer: hand-worked merges on tiny vocabularies, malformed inputs, and (when
 * the bundled model is present) every reference string of tests/fixtures/tokenizer/ encoded by
 * Hugging Face tokenizers from the same GGUF, the chat template, and a tokenizer.json round trip.
 * Regenerate the fixtures with tests/fixtures/make_tokenizer_fixtures.py. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../test_util.h"

#include "common/clock.h"
#include "worker/formats/gguf.h"
#include "worker/tokenizer/tokenizer.h"

#define FIXTURE_DIR "tests/fixtures/tokenizer/"

/* ---- helpers ---- */

static struct tokenizer *from_str(const char *json)
{
    char err[512];
    struct tokenizer *t = tokenizer_from_json_string(json, strlen(json), "inline.json", err, sizeof err);
    if (!t)
        fail_msg("load failed: %s", err);
    return t;
}

static void expect_ids(const struct tokenizer *t, const char *text, const int32_t *want, size_t nwant)
{
    size_t n;
    int32_t *got = tokenizer_encode(t, text, strlen(text), 0, &n);
    bool same = n == nwant && memcmp(got, want, n * sizeof *got) == 0;
    char buf[512];
    size_t k = 0;
    for (size_t i = 0; i < n && k < sizeof buf - 16; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%d ", got[i]);
    buf[k] = 0;
    free(got);
    if (!same)
        fail_msg("'%s' encoded to [%s] (%zu ids, want %zu)", text, buf, n, nwant);
}

#define EXPECT(t, text, ...)                                                                                           \
    do {                                                                                                               \
        const int32_t want_[] = {__VA_ARGS__};                                                                         \
        expect_ids((t), (text), want_, sizeof want_ / sizeof want_[0]);                                                \
    } while (0)

/* ---- tiny hand-made tokenizers (no model needed) ---- */

/* vocab a b c Ġ ab bc abc Ġab, merges by rank: a+b, b+c, ab+c, Ġ+ab; one special token. GPT-2 split:
 *   "abc"     a b c: (a,b) rank 0 -> ab c -> (ab,c) rank 2 -> abc            = [6]
 *   "bcab"    b c a b: (a,b) rank 0 beats (b,c) rank 1 -> b c ab -> bc ab     = [5 4]
 *   " abc ab" pieces " abc", " ab": Ġ a b c -> Ġ ab c -> (ab,c) rank 2 before (Ġ,ab) rank 3
 *             -> Ġ abc (no merge); Ġ a b -> Ġ ab -> Ġab                     = [3 6 7]
 *   "abab"    both (a,b) are rank 0, leftmost first: ab ab                   = [4 4]
 *   "aaa"     no merge applies                                             = [0 0 0]
 *   "ab<|x|>c" the special token is matched first and never split          = [4 8 2]
 *   "xyz"     no token for x, y, z and no unk: dropped                        = [] */
static const char TINY_HEAD[] =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":8,\"content\":\"<|x|>\",\"special\":true,"
    "\"normalized\":false}],\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"trim_offsets\":true,\"use_regex\":true},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"\\u0120\":3,\"ab\":4,"
    "\"bc\":5,\"abc\":6,\"\\u0120ab\":7,\"<|x|>\":8},";

static void check_tiny(const struct tokenizer *t)
{
    EXPECT(t, "abc", 6);
    EXPECT(t, "bcab", 5, 4);
    EXPECT(t, " abc ab", 3, 6, 7);
    EXPECT(t, "abab", 4, 4);
    EXPECT(t, "aaa", 0, 0, 0);
    EXPECT(t, "ab<|x|>c", 4, 8, 2);
    size_t n;
    int32_t *ids = tokenizer_encode(t, "xyz", 3, 0, &n);
    assert_int_equal(n, 0);
    free(ids);
    ids = tokenizer_encode(t, "", 0, 0, &n);
    assert_int_equal(n, 0);
    free(ids);
    const int32_t seq[] = {3, 6, 7, 8, 2};
    char *s = tokenizer_decode(t, seq, 5, false);
    assert_string_equal(s, " abc ab<|x|>c");
    free(s);
    s = tokenizer_decode(t, seq, 5, true);
    assert_string_equal(s, " abc abc");
    free(s);
    assert_string_equal(tokenizer_token_text(t, 7), "\xc4\xa0"
                                                    "ab");
    size_t bl;
    const char *b = tokenizer_token_bytes(t, 7, &bl);
    assert_int_equal(bl, 3);
    assert_memory_equal(b, " ab", 3);
    assert_int_equal(tokenizer_vocab_size(t), 9);
    assert_int_equal(tokenizer_token_id(t, "<|x|>"), 8);
    assert_true(tokenizer_is_special(t, 8));
    assert_false(tokenizer_is_special(t, 4));
    assert_int_equal(tokenizer_pre_type(t), TOKENIZER_PRE_GPT2);
}

static void test_tiny_string_merges(void **state)
{
    (void)state;
    char json[2048];
    snprintf(json, sizeof json, "%s\"merges\":[\"a b\",\"b c\",\"ab c\",\"\\u0120 ab\"]}}", TINY_HEAD);
    struct tokenizer *t = from_str(json);
    check_tiny(t);
    /* the added token as plain text: '<', '|', 'x' ... have no tokens here, so only "c" survives */
    size_t n;
    int32_t *ids = tokenizer_encode(t, "<|x|>c", 6, TOKENIZER_ENCODE_NO_ADDED, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 2);
    free(ids);
    tokenizer_free(t);
}

static void test_tiny_list_merges(void **state)
{
    (void)state;
    char json[2048];
    snprintf(json, sizeof json, "%s\"merges\":[[\"a\",\"b\"],[\"b\",\"c\"],[\"ab\",\"c\"],[\"\\u0120\",\"ab\"]]}}",
             TINY_HEAD);
    struct tokenizer *t = from_str(json);
    check_tiny(t);
    tokenizer_free(t);
}

/* Split behaviours, on vocab a b - a- -b -- with merges a+-, -+b, -+-: with no split "a-b" would
 * become a- b (rank 0 first), so the pieces each behaviour cuts show in the ids. */
static struct tokenizer *split_tok(const char *behavior, const char *pattern_kind, const char *pattern)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"%s\":"
             "\"%s\"},\"behavior\":\"%s\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
             "\"trim_offsets\":false,\"use_regex\":false}]},"
             "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"-\":2,\"a-\":3,\"-b\":4,\"--\":5},"
             "\"merges\":[\"a -\",\"- b\",\"- -\"]}}",
             pattern_kind, pattern, behavior);
    return from_str(json);
}

static void test_split_behaviors(void **state)
{
    (void)state;
    struct tokenizer *t = split_tok("Isolated", "String", "-");
    EXPECT(t, "a-b", 0, 2, 1);
    EXPECT(t, "a--b", 0, 2, 2, 1);
    tokenizer_free(t);
    t = split_tok("Removed", "Regex", "-");
    EXPECT(t, "a-b", 0, 1);
    tokenizer_free(t);
    t = split_tok("MergedWithPrevious", "String", "-");
    EXPECT(t, "a-b", 3, 1);
    tokenizer_free(t);
    t = split_tok("MergedWithNext", "String", "-");
    EXPECT(t, "a-b", 0, 4);
    tokenizer_free(t);
    t = split_tok("Contiguous", "Regex", "-");
    EXPECT(t, "a--b", 0, 5, 1);
    tokenizer_free(t);
    /* the byte-level map of the remaining steps without any split: rank 0 merge a+- wins */
    struct tokenizer *u = from_str("{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                                   "\"use_regex\":false},\"model\":{\"vocab\":{\"a\":0,\"b\":1,\"-\":2,\"a-\":3,"
                                   "\"-b\":4},\"merges\":[\"a -\",\"- b\"]}}");
    EXPECT(u, "a-b", 3, 1);
    tokenizer_free(u);
}

/* GPT-2 regex behaviour on whitespace and contractions, seen through one-byte tokens only:
 * every byte is its own token (id = byte), so the ids spell the input back, and a merge
 * "Ġ Ġ" shows which spaces share a pre-token. */
static void test_pretokenizer_whitespace(void **state)
{
    (void)state;
    json_t *root = json_object(), *model = json_object(), *vocab = json_object();
    /* byte-level spelling of each byte */
    for (int b = 0; b < 256; b++) {
        int cp = b, extra = 0;
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (!printable) {
            for (int c = 0; c < b; c++)
                if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE)))
                    extra++;
            cp = 256 + extra;
        }
        char s[4];
        if (cp < 0x80) {
            s[0] = (char)cp;
            s[1] = 0;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
            s[2] = 0;
        }
        json_object_set_new(vocab, s, json_integer(b));
    }
    json_object_set_new(vocab, "\xc4\xa0\xc4\xa0", json_integer(256)); /* "ĠĠ" */
    json_object_set_new(model, "type", json_string("BPE"));
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", json_pack("[s]", "\xc4\xa0 \xc4\xa0"));
    json_object_set_new(root, "model", model);
    json_object_set_new(root, "pre_tokenizer",
                        json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 1));
    char *js = json_dumps(root, 0);
    json_decref(root);
    struct tokenizer *t = from_str(js);
    free(js);
    /* "a  b": \s+(?!\S) takes one space, " b" keeps the other: a, Ġ, Ġb -> a Ġ Ġ b (no ĠĠ) */
    EXPECT(t, "a  b", 'a', ' ', ' ', 'b');
    /* "a   " at the end: all three spaces are one pre-token: ĠĠ Ġ */
    EXPECT(t, "a   ", 'a', 256, ' ');
    /* "don't": 't is its own piece, so no cross-piece effects: bytes back */
    EXPECT(t, "don't", 'd', 'o', 'n', '\'', 't');
    size_t n;
    const char *bin = "\x00\x01\xff\xfe";
    int32_t *ids = tokenizer_encode(t, bin, 4, 0, &n); /* invalid UTF-8 still encodes byte by byte */
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[2], 255);
    char *back = tokenizer_decode(t, ids, n, false);
    assert_memory_equal(back, bin, 4);
    free(back);
    free(ids);
    tokenizer_free(t);
}

/* A post-processor that puts a token first marks a BOS; save_json + save_config_json and a
 * reload keep vocabulary, merges, specials, add_bos and the chat template. */
static void test_tiny_save_reload(void **state)
{
    (void)state;
    char json[4096];
    snprintf(json, sizeof json,
             "%s\"merges\":[\"a b\",\"b c\",\"ab c\",\"\\u0120 ab\"]},"
             "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|x|>\","
             "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<|x|>\":{\"id\":"
             "\"<|x|>\",\"ids\":[8],\"tokens\":[\"<|x|>\"]}}}}",
             TINY_HEAD);
    struct tokenizer *t = from_str(json);
    assert_true(tokenizer_adds_bos(t));
    assert_int_equal(tokenizer_bos_id(t), 8);
    tokenizer_set_chat_template(t, "{{ '<|im_start|>system\nBe kind.<|im_end|>\n' }}");
    char *dir = must_tmpdir("grpo_tok");
    char *tj = test_path_join(dir, "tokenizer.json"), *tc = test_path_join(dir, "tokenizer_config.json");
    char err[512];
    assert_int_equal(tokenizer_save_json(t, tj, err, sizeof err), 0);
    assert_int_equal(tokenizer_save_config_json(t, tc, err, sizeof err), 0);
    struct tokenizer *u = tokenizer_from_json(tj, err, sizeof err);
    if (!u)
        fail_msg("%s", err);
    check_tiny(u);
    assert_true(tokenizer_adds_bos(u));
    assert_int_equal(tokenizer_bos_id(u), 8);
    assert_int_equal(tokenizer_eos_id(u), -1);
    assert_string_equal(tokenizer_chat_template(u), tokenizer_chat_template(t));
    assert_string_equal(tokenizer_default_system_prompt(u), "Be kind.");
    tokenizer_free(u);
    /* a transformers-style config: AddedToken objects, a list of named templates */
    const char *cfg = "{\"bos_token\":{\"content\":\"<|x|>\",\"__type\":\"AddedToken\"},\"eos_token\":\"<|x|>\","
                      "\"add_bos_token\":false,\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},"
                      "{\"name\":\"default\",\"template\":\"D\"}]}";
    must_write(tc, cfg, strlen(cfg), "wb");
    u = tokenizer_from_json(tj, err, sizeof err);
    assert_non_null(u);
    assert_false(tokenizer_adds_bos(u));
    assert_int_equal(tokenizer_eos_id(u), 8);
    assert_string_equal(tokenizer_chat_template(u), "D");
    assert_null(tokenizer_default_system_prompt(u));
    tokenizer_free(u);
    /* issue 27: a broken chat_template, or a config that is not JSON, is an error naming the file (it was
     * ignored, and ChatML used) */
    const char *broken[] = {"{\"chat_template\": 42}", "{\"chat_template\": [{\"name\": \"default\"}]}",
                            "{\"chat_template\": \"\"}", "{\"chat_template\": {\"template\": \"T\"}}",
                            "{\"chat_template\": \"{% for m in messages %}\""};
    for (size_t i = 0; i < sizeof broken / sizeof *broken; i++) {
        must_write(tc, broken[i], strlen(broken[i]), "wb");
        u = tokenizer_from_json(tj, err, sizeof err);
        if (u || !strstr(err, "tokenizer_config.json"))
            fail_msg("config %s: %s", broken[i], u ? "accepted" : err);
        if (i < 4 && !strstr(err, "chat_template is not a template"))
            fail_msg("config %s: '%s' does not name chat_template", broken[i], err);
    }
    tokenizer_free(t);
    unlink(tj);
    unlink(tc);
    rmdir(dir);
    free(tj);
    free(tc);
    free(dir);
}

static void expect_load_error(const char *json, const char *needle)
{
    char *dir = must_tmpdir("grpo_tok");
    char *p = test_path_join(dir, "tokenizer.json");
    must_write(p, json, strlen(json), "wb");
    char err[512] = "";
    struct tokenizer *t = tokenizer_from_json(p, err, sizeof err);
    if (t)
        fail_msg("loading %s succeeded; expected an error about %s", json, needle);
    if (!strstr(err, p))
        fail_msg("error '%s' does not name the file %s", err, p);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not mention '%s'", err, needle);
    unlink(p);
    rmdir(dir);
    free(p);
    free(dir);
}

#define PRE_OK "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}"

static void test_malformed(void **state)
{
    (void)state;
    expect_load_error("{" PRE_OK "}", "model");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"merges\":[]}}", "vocab");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}", "merges");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}",
                      "merges[0]");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"ab\"]}}",
                      "merges[0]");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}",
                      "not in the vocabulary"); /* "ab" missing */
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\"]]}}",
                      "merges[0]");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", "vocab");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", "BPE");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", "pre_tokenizer");
    expect_load_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                      "regex");
    expect_load_error("{" PRE_OK ",\"added_tokens\":[{\"id\":1}],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
                      "\"merges\":[]}}",
                      "added_tokens[0]");
    expect_load_error("{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]", "line");
    expect_load_error("[1, 2]", "object");
    expect_load_error("", "");
    /* a truncated copy of a valid file */
    const char *valid = "{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
                        "\"merges\":[\"a b\"]}}";
    struct tokenizer *ok = from_str(valid);
    tokenizer_free(ok);
    for (size_t cut = 1; cut < strlen(valid); cut += 7) {
        char *part = strndup(valid, cut);
        expect_load_error(part, "");
        free(part);
    }
    char err[256] = "";
    assert_null(tokenizer_from_json("/nonexistent/dir/tokenizer.json", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/dir/tokenizer.json"));
}

/* issue 12: an id near 2^31 hung in tok_set_token (a signed size doubling past INT32_MAX) and ids around 10^8
 * allocated gigabytes; ids are bounded by what the file defines, with a message naming the entry. */
static void test_ids_bounded_by_file(void **state)
{
    (void)state;
#define VOCAB_WITH(ID)                                                                                                 \
    "{" PRE_OK ",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":" ID "},\"merges\":[\"a b\"]}}"
    expect_load_error(VOCAB_WITH("2147483600"), "model.vocab['ab'] has id 2147483600");
    expect_load_error(VOCAB_WITH("2147483647"), "ids below");
    expect_load_error(VOCAB_WITH("100000000"), "model.vocab['ab'] has id 100000000");
    expect_load_error("{" PRE_OK ",\"added_tokens\":[{\"id\":1000000000,\"content\":\"<x>\"}],"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
                      "added_tokens[0] ('<x>') has id 1000000000");
    /* small gaps in the numbering are fine */
    struct tokenizer *t = from_str(VOCAB_WITH("40"));
    assert_int_equal(tokenizer_token_id(t, "ab"), 40);
    tokenizer_free(t);
#undef VOCAB_WITH
    /* a post-processor's special token id that is not a token is ignored, not indexed */
    t = from_str("{" PRE_OK ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
                 "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                 "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[2000000000],\"tokens\":[\"<s>\"]}}},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}");
    assert_int_equal(tokenizer_bos_id(t), -1);
    size_t n;
    int32_t *ids = tokenizer_encode(t, "ab", 2, 0, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 2);
    free(ids);
    char *dir = must_tmpdir("grpo_tok"), *p = test_path_join(dir, "tokenizer.json"), err[512];
    assert_int_equal(tokenizer_save_json(t, p, err, sizeof err), 0);
    unlink(p);
    rmdir(dir);
    free(p);
    free(dir);
    tokenizer_free(t);
}

static void test_chat_template_plain(void **state)
{
    (void)state;
    char json[2048];
    snprintf(json, sizeof json, "%s\"merges\":[\"a b\"]}}", TINY_HEAD);
    struct tokenizer *t = from_str(json);
    struct chat_message m[] = {{"user", "Hi"}, {"assistant", "Hello"}};
    char err[1024];
    char *s = tokenizer_apply_chat_template(t, m, 2, true, err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    assert_string_equal(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
                           "<|im_start|>assistant\n");
    free(s);
    /* a template with a default system prompt (Qwen2's words) */
    tokenizer_set_chat_template(t, "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
                                   "'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
                                   "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                                   "'<|im_end|>' + '\\n'}}{% endfor %}");
    assert_string_equal(tokenizer_default_system_prompt(t), "You are a helpful assistant.");
    s = tokenizer_apply_chat_template(t, m, 1, false, err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    assert_string_equal(s,
                        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    free(s);
    struct chat_message sys[] = {{"system", "Be brief."}, {"user", "Hi"}};
    s = tokenizer_apply_chat_template(t, sys, 2, false, err, sizeof err);
    if (!s)
        fail_msg("%s", err);
    assert_string_equal(s, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
    free(s);
    tokenizer_free(t);
}

/* ---- the bundled model ---- */

static struct tokenizer *g_tok;
static bool g_tried;

static const char *model_path(void)
{
    static char buf[1024];
    const char *p = getenv("GRPO_MODEL_GGUF");
    if (p && *p)
        return p;
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.cache/grpo/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : "");
    return buf;
}

static struct tokenizer *model_tok(void)
{
    if (!g_tried) {
        g_tried = true;
        const char *p = model_path();
        if (access(p, R_OK) != 0)
            return NULL;
        char err[512];
        struct gguf_file *g = gguf_open(p, err, sizeof err);
        if (!g)
            fail_msg("gguf_open: %s", err);
        g_tok = tokenizer_from_gguf(g, err, sizeof err);
        gguf_close(g);
        if (!g_tok)
            fail_msg("tokenizer_from_gguf: %s", err);
    }
    return g_tok;
}

#define NEED_MODEL(t)                                                                                                  \
    struct tokenizer *t = model_tok();                                                                                 \
    if (!(t)) {                                                                                                        \
        print_message("model not found at %s (scripts/fetch_model.sh); skipped\n", model_path());                      \
        skip();                                                                                                        \
    }

struct fixture {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n;
};

/* The "text" and the ids under key of each line of a JSONL fixture. */
static struct fixture *load_jsonl(const char *path, const char *key, size_t *count)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    assert_non_null(f);
    struct fixture *v = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t l;
    while ((l = getline(&line, &lcap, f)) > 0) {
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)l, 0, &je);
        if (!o)
            fail_msg("fixture line %zu: %s", n + 1, je.text);
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            struct fixture *nv = realloc(v, cap * sizeof *v);
            assert_non_null(nv);
            v = nv;
        }
        const json_t *txt = json_object_get(o, "text"), *ids = json_object_get(o, key);
        if (!json_is_string(txt) || !json_is_array(ids))
            fail_msg("%s line %zu: no text or no %s", path, n + 1, key);
        v[n].len = json_string_length(txt);
        v[n].text = malloc(v[n].len + 1);
        memcpy(v[n].text, json_string_value(txt), v[n].len + 1);
        v[n].n = json_array_size(ids);
        v[n].ids = malloc((v[n].n + 1) * sizeof(int32_t));
        for (size_t i = 0; i < v[n].n; i++)
            v[n].ids[i] = (int32_t)json_integer_value(json_array_get(ids, i));
        json_decref(o);
        n++;
    }
    free(line);
    fclose(f);
    *count = n;
    return v;
}

static struct fixture *load_fixtures(size_t *count)
{
    return load_jsonl(FIXTURE_DIR "smollm2_encode.jsonl", "ids", count);
}

static void free_fixtures(struct fixture *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].text);
        free(v[i].ids);
    }
    free(v);
}

/* Every fixture string: encode == reference ids, decode == text. Returns mismatches. */
static int check_all(const struct tokenizer *t, const struct fixture *v, size_t n, const char *what)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m;
        int32_t *ids = tokenizer_encode(t, v[i].text, v[i].len, 0, &m);
        if (m != v[i].n || memcmp(ids, v[i].ids, m * sizeof *ids) != 0) {
            if (bad++ < 5) {
                size_t k = 0;
                while (k < m && k < v[i].n && ids[k] == v[i].ids[k])
                    k++;
                print_error("%s: fixture %zu '%.60s': %zu ids, want %zu; first difference at %zu: %d vs %d\n", what,
                            i + 1, v[i].text, m, v[i].n, k, k < m ? ids[k] : -1, k < v[i].n ? v[i].ids[k] : -1);
            }
        }
        char *back = tokenizer_decode(t, ids, m, false);
        if (strlen(back) != v[i].len || memcmp(back, v[i].text, v[i].len) != 0)
            if (bad++ < 5)
                print_error("%s: fixture %zu '%.60s' decodes to '%.60s'\n", what, i + 1, v[i].text, back);
        free(back);
        free(ids);
    }
    return bad;
}

static void test_model_fixtures(void **state)
{
    (void)state;
    NEED_MODEL(t);
    size_t n;
    struct fixture *v = load_fixtures(&n);
    assert_true(n >= 1200);
    const double t0 = clock_now_s();
    int bad = check_all(t, v, n, "gguf");
    const double s = clock_now_s() - t0;
    print_message("%zu fixture strings encoded and decoded in %.3f s (%.0f strings/s)\n", n, s, (double)n / s);
    free_fixtures(v, n);
    assert_int_equal(bad, 0);
}

static void test_model_specials(void **state)
{
    (void)state;
    NEED_MODEL(t);
    assert_int_equal(tokenizer_vocab_size(t), 49152);
    assert_int_equal(tokenizer_bos_id(t), 1);
    assert_int_equal(tokenizer_eos_id(t), 2);
    assert_int_equal(tokenizer_pad_id(t), 2);
    assert_false(tokenizer_adds_bos(t));
    assert_int_equal(tokenizer_pre_type(t), TOKENIZER_PRE_SMOLLM);
    assert_string_equal(tokenizer_token_text(t, 0), "<|endoftext|>");
    assert_string_equal(tokenizer_token_text(t, 1), "<|im_start|>");
    assert_string_equal(tokenizer_token_text(t, 2), "<|im_end|>");
    for (int i = 0; i <= 16; i++)
        assert_true(tokenizer_is_special(t, i));
    assert_false(tokenizer_is_special(t, 17));
    assert_int_equal(tokenizer_token_id(t, "<|im_end|>"), 2);
    assert_null(tokenizer_token_text(t, 49152));
    assert_null(tokenizer_token_text(t, -1));
    assert_non_null(tokenizer_default_system_prompt(t));
    assert_string_equal(tokenizer_default_system_prompt(t),
                        "You are a helpful AI assistant named SmolLM, trained by Hugging Face");

    /* specials are matched inside text and never split; without added-token matching they are text */
    const char *s = "<|im_start|>user\nHi<|im_end|>";
    size_t n, m;
    int32_t *ids = tokenizer_encode(t, s, strlen(s), 0, &n);
    assert_true(n >= 4);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[n - 1], 2);
    char *back = tokenizer_decode(t, ids, n, true);
    assert_string_equal(back, "user\nHi");
    free(back);
    back = tokenizer_decode(t, ids, n, false);
    assert_string_equal(back, s);
    free(back);
    int32_t *plain = tokenizer_encode(t, s, strlen(s), TOKENIZER_ENCODE_NO_ADDED, &m);
    assert_true(m > n);
    for (size_t i = 0; i < m; i++)
        assert_true(plain[i] > 16);
    back = tokenizer_decode(t, plain, m, true);
    assert_string_equal(back, s);
    free(back);
    free(plain);
    free(ids);
    /* each digit on its own */
    ids = tokenizer_encode(t, "2024", 4, 0, &n);
    assert_int_equal(n, 4);
    free(ids);
    /* a long run of one character and of spaces (no quadratic blow-up, no regex stack limit) */
    size_t big = 200000;
    char *run = malloc(big + 1);
    memset(run, ' ', big);
    run[big] = 0;
    ids = tokenizer_encode(t, run, big, 0, &n);
    back = tokenizer_decode(t, ids, n, false);
    assert_int_equal(strlen(back), big);
    free(back);
    free(ids);
    memset(run, 'a', big);
    ids = tokenizer_encode(t, run, big, 0, &n);
    back = tokenizer_decode(t, ids, n, false);
    assert_string_equal(back, run);
    free(back);
    free(ids);
    free(run);
}

static void test_model_chat(void **state)
{
    (void)state;
    NEED_MODEL(t);
    json_error_t je;
    json_t *meta = json_load_file(FIXTURE_DIR "smollm2_meta.json", 0, &je);
    if (!meta)
        fail_msg("smollm2_meta.json: %s", je.text);
    assert_string_equal(tokenizer_chat_template(t), json_string_value(json_object_get(meta, "chat_template")));
    size_t ci;
    json_t *c;
    json_array_foreach(json_object_get(meta, "chats"), ci, c)
    {
        json_t *msgs = json_object_get(c, "messages");
        size_t nm = json_array_size(msgs);
        struct chat_message *m = calloc(nm + 1, sizeof *m);
        for (size_t i = 0; i < nm; i++) {
            m[i].role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
            m[i].content = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
        }
        char err[1024];
        char *s = tokenizer_apply_chat_template(
            t, m, (int)nm, json_is_true(json_object_get(c, "add_generation_prompt")), err, sizeof err);
        if (!s) {
            fail_msg("%s", err);
            return; /* fail_msg does not return; this tells the analysers so */
        }
        assert_string_equal(s, json_string_value(json_object_get(c, "text")));
        size_t n;
        int32_t *ids = tokenizer_encode(t, s, strlen(s), 0, &n);
        json_t *want = json_object_get(c, "ids");
        assert_int_equal(n, json_array_size(want));
        for (size_t i = 0; i < n; i++)
            assert_int_equal(ids[i], json_integer_value(json_array_get(want, i)));
        free(ids);
        free(s);
        free(m);
    }
    json_decref(meta);
}

static void test_model_save_json_roundtrip(void **state)
{
    (void)state;
    NEED_MODEL(t);
    char *dir = must_tmpdir("grpo_tok");
    char *tj = test_path_join(dir, "tokenizer.json"), *tc = test_path_join(dir, "tokenizer_config.json");
    char err[512];
    if (tokenizer_save_json(t, tj, err, sizeof err) != 0)
        fail_msg("save_json: %s", err);
    if (tokenizer_save_config_json(t, tc, err, sizeof err) != 0)
        fail_msg("save_config_json: %s", err);
    struct tokenizer *u = tokenizer_from_json(tj, err, sizeof err);
    if (!u)
        fail_msg("reload: %s", err);
    size_t n;
    struct fixture *v = load_fixtures(&n);
    int bad = check_all(u, v, n, "saved tokenizer.json");
    free_fixtures(v, n);
    assert_int_equal(bad, 0);
    assert_int_equal(tokenizer_vocab_size(u), tokenizer_vocab_size(t));
    assert_int_equal(tokenizer_bos_id(u), 1);
    assert_int_equal(tokenizer_eos_id(u), 2);
    assert_int_equal(tokenizer_pad_id(u), 2);
    assert_int_equal(tokenizer_pre_type(u), TOKENIZER_PRE_SMOLLM);
    assert_string_equal(tokenizer_chat_template(u), tokenizer_chat_template(t));
    for (int i = 0; i < tokenizer_vocab_size(t); i++) {
        assert_string_equal(tokenizer_token_text(u, i), tokenizer_token_text(t, i));
        assert_int_equal(tokenizer_is_special(u, i), tokenizer_is_special(t, i));
    }
    tokenizer_free(u);
    const char *keep = getenv("GRPO_TOKENIZER_KEEP_JSON"); /* for make_tokenizer_fixtures.py --check-json */
    if (keep && *keep) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s' '%s'/", keep, tj, tc, keep);
        assert_int_equal(system(cmd), 0);
    }
    unlink(tj);
    unlink(tc);
    rmdir(dir);
    free(tj);
    free(tc);
    free(dir);
}

/* The model's vocabulary and merges under the GPT-2, Llama-3 (with ignore_merges) and Qwen2
 * pre-tokenizers, through a tokenizer.json: checks those regexes against tokenizers'. */
static void test_model_pre_variants(void **state)
{
    (void)state;
    NEED_MODEL(t);
    char *dir = must_tmpdir("grpo_tok");
    char *tj = test_path_join(dir, "tokenizer.json");
    char err[512];
    if (tokenizer_save_json(t, tj, err, sizeof err) != 0)
        fail_msg("save_json: %s", err);
    json_error_t je;
    json_t *root = json_load_file(tj, 0, &je), *meta = json_load_file(FIXTURE_DIR "smollm2_meta.json", 0, &je);
    assert_non_null(root);
    assert_non_null(meta);
    const struct {
        const char *name;
        enum tokenizer_pre pre;
    } vs[] = {{"gpt2", TOKENIZER_PRE_GPT2}, {"llama3", TOKENIZER_PRE_LLAMA3}, {"qwen2", TOKENIZER_PRE_QWEN2}};
    for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++) {
        json_t *spec = json_object_get(json_object_get(meta, "pre_variants"), vs[k].name);
        assert_non_null(spec);
        json_object_set(root, "pre_tokenizer", json_object_get(spec, "pre_tokenizer"));
        json_object_set(json_object_get(root, "model"), "ignore_merges", json_object_get(spec, "ignore_merges"));
        char *js = json_dumps(root, 0);
        struct tokenizer *u = tokenizer_from_json_string(js, strlen(js), vs[k].name, err, sizeof err);
        free(js);
        if (!u)
            fail_msg("%s: %s", vs[k].name, err);
        assert_int_equal(tokenizer_pre_type(u), vs[k].pre);
        size_t n;
        struct fixture *v = load_jsonl(FIXTURE_DIR "smollm2_pre_variants.jsonl", vs[k].name, &n);
        assert_true(n >= 400);
        int bad = check_all(u, v, n, vs[k].name);
        free_fixtures(v, n);
        tokenizer_free(u);
        assert_int_equal(bad, 0);
    }
    json_decref(root);
    json_decref(meta);
    unlink(tj);
    rmdir(dir);
    free(tj);
    free(dir);
}

static int teardown(void **state)
{
    (void)state;
    tokenizer_free(g_tok);
    g_tok = NULL;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_string_merges),
        cmocka_unit_test(test_tiny_list_merges),
        cmocka_unit_test(test_tiny_save_reload),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_pretokenizer_whitespace),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_ids_bounded_by_file),
        cmocka_unit_test(test_chat_template_plain),
        cmocka_unit_test(test_model_fixtures),
        cmocka_unit_test(test_model_specials),
        cmocka_unit_test(test_model_chat),
        cmocka_unit_test(test_model_save_json_roundtrip),
        cmocka_unit_test(test_model_pre_variants),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
