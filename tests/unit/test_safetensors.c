/* safetensors: files written by the Python safetensors package (F32, BF16, F16, I64, scalar, empty; a 2-shard
 * checkpoint with its index) read correctly; st_write / st_write_sharded output reads back identically; bad
 * headers, truncated files and broken indexes give errors naming the file, never crashes. Fixtures come from
 * tests/fixtures/make_format_fixtures.py. */
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../test_util.h"

#include "worker/formats/safetensors.h"

#define FIX TEST_FORMATS_FIXTURE

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void assert_bits_equal(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4) != 0 && !(isnan(got[i]) && isnan(want[i])))
            fail_msg("%s[%zu]: got %.9g, want %.9g", what, i, got[i], want[i]);
}

/* ---- files written by the Python package ---- */

static void check_against(const struct st_file *f, const char *name, const char *ref)
{
    char err[512];
    const struct st_tensor_info *t = st_find(f, name);
    if (!t)
        fail_msg("no tensor %s", name);
    size_t n;
    float *want = must_read(ref, &n);
    assert_int_equal(n, t->n_elements * 4);
    float *got = malloc(n + 4);
    if (st_tensor_to_f32(f, t, got, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_bits_equal(got, want, t->n_elements, name);
    free(got);
    free(want);
}

static void test_read_python_file(void **state)
{
    (void)state;
    char err[512];
    const char *path = FIX "st_types.safetensors";
    struct st_file *f = st_open(path, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    assert_string_equal(st_path(f), path);
    assert_int_equal(st_num_tensors(f), 6);
    assert_int_equal(st_num_metadata(f), 2);
    assert_string_equal(st_metadata(f, "format"), "pt");
    assert_string_equal(st_metadata(f, "note"), "fixture");
    assert_null(st_metadata(f, "absent"));
    const char *key;
    assert_non_null(st_metadata_at(f, 1, &key));
    assert_null(st_metadata_at(f, 2, &key));

    const struct st_tensor_info *t = st_find(f, "b.bf16");
    assert_non_null(t);
    assert_int_equal(t->dtype, ST_BF16);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 4);
    assert_int_equal(t->shape[1], 5);
    assert_int_equal(t->n_elements, 20);
    assert_int_equal(t->n_bytes, 40);
    assert_int_equal(t->data_end - t->data_begin, 40);
    t = st_find(f, "c.f16");
    assert_int_equal(t->dtype, ST_F16);
    assert_int_equal(t->shape[0], 3);
    assert_int_equal(t->shape[1], 4);
    t = st_find(f, "scalar");
    assert_int_equal(t->n_dims, 0);
    assert_int_equal(t->n_elements, 1);
    t = st_find(f, "empty");
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 0);
    assert_int_equal(t->n_elements, 0);
    float dummy;
    assert_int_equal(st_tensor_to_f32(f, t, &dummy, err, sizeof err), 0);
    assert_null(st_find(f, "nope"));
    assert_null(st_find(f, "__metadata__"));
    /* st_tensor lists in data order */
    for (int i = 1; i < st_num_tensors(f); i++)
        assert_true(st_tensor(f, i - 1)->data_end <= st_tensor(f, i)->data_begin);
    assert_null(st_tensor(f, 6));
    assert_null(st_tensor(f, -1));

    check_against(f, "a.f32", FIX "st_types.a.f32.f32");
    check_against(f, "b.bf16", FIX "st_types.b.bf16.f32");
    check_against(f, "c.f16", FIX "st_types.c.f16.f32");
    check_against(f, "scalar", FIX "st_types.scalar.f32");

    float out[4];
    t = st_find(f, "d.i64");
    assert_int_equal(t->dtype, ST_I64);
    assert_int_equal(st_tensor_to_f32(f, t, out, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "'d.i64'"));
    assert_non_null(strstr(err, "I64"));
    int64_t raw[2];
    memcpy(raw, t->data, sizeof raw);
    assert_int_equal(raw[0], -3);
    assert_int_equal(raw[1], INT64_C(1) << 40);
    st_close(f);
}

static const char *sharded_names[] = {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                                      "model.norm.weight"};

static void check_sharded(struct st_model *m)
{
    char err[512], ref[256];
    assert_int_equal(st_model_num_files(m), 2);
    assert_int_equal(st_model_num_tensors(m), 3);
    for (int i = 0; i < 3; i++) {
        const struct st_file *file = NULL;
        const struct st_tensor_info *t = st_model_tensor(m, i, &file);
        assert_string_equal(t->name, sharded_names[i]); /* sorted by name */
        assert_ptr_equal(st_model_find(m, sharded_names[i], NULL), t);
        assert_ptr_equal(st_find(file, t->name), t);
        snprintf(ref, sizeof ref, FIX "sharded.%s.f32", t->name);
        size_t n;
        float *want = must_read(ref, &n);
        float *got = malloc(n);
        if (st_model_tensor_to_f32(m, t->name, got, err, sizeof err) != 0)
            fail_msg("%s", err);
        assert_bits_equal(got, want, n / 4, t->name);
        free(got);
        free(want);
    }
    const struct st_file *file;
    const struct st_tensor_info *t = st_model_find(m, "model.layers.0.mlp.up_proj.weight", &file);
    assert_int_equal(t->dtype, ST_BF16);
    assert_int_equal(t->shape[0], 8);
    assert_int_equal(t->shape[1], 4);
    assert_non_null(strstr(st_path(file), "model-00002-of-00002.safetensors"));
    assert_string_equal(st_metadata(file, "format"), "pt");
    assert_null(st_model_find(m, "lm_head.weight", NULL));
    float x;
    assert_int_equal(st_model_tensor_to_f32(m, "lm_head.weight", &x, err, sizeof err), -1);
    assert_non_null(strstr(err, "'lm_head.weight'"));
}

static void test_read_python_sharded(void **state)
{
    (void)state;
    char err[512];
    struct st_model *m = st_model_open(FIX "sharded", err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    check_sharded(m);
    st_model_close(m);
    m = st_model_open(FIX "sharded/model.safetensors.index.json", err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    check_sharded(m);
    st_model_close(m);
    /* a single file given directly */
    m = st_model_open(FIX "st_types.safetensors", err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    assert_int_equal(st_model_num_files(m), 1);
    assert_int_equal(st_model_num_tensors(m), 6);
    assert_non_null(st_model_find(m, "c.f16", NULL));
    st_model_close(m);

    assert_null(st_model_open(FIX, err, sizeof err)); /* neither file there */
    assert_non_null(strstr(err, FIX));
    assert_null(st_model_open("/nonexistent/ckpt", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/ckpt"));
}

/* ---- writing ---- */

static void test_write_roundtrip(void **state)
{
    (void)state;
    char *dir = must_tmpdir("test_st"), path[256], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    enum { R = 5, C = 7 };
    float w[R * C], v[C], bf[8], s = 42.5f;
    srand(3);
    for (int i = 0; i < R * C; i++)
        w[i] = (float)rand() / (float)RAND_MAX * 4 - 2;
    for (int i = 0; i < C; i++)
        v[i] = (float)i - 3.25f;
    /* hand-worked BF16 rounding: 7 stored mantissa bits, so the ulp at 1 is 2^-7 */
    bf[0] = 1.0f + 0x1p-8f;            /* tie, 1.0 is even -> 1.0 */
    bf[1] = 1.0f + 0x1p-7f + 0x1p-8f;  /* tie, odd below -> 1 + 2^-6 */
    bf[2] = 1.0f + 0x1p-8f + 0x1p-20f; /* above the tie -> 1 + 2^-7 */
    bf[3] = -3.0f;                     /* exact */
    bf[4] = 0x1p-130f;                 /* subnormal, exact in bf16 */
    bf[5] = INFINITY;
    bf[6] = NAN;
    bf[7] = -0.0f;
    const float bf_want[8] = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -3.0f, 0x1p-130f, INFINITY, NAN, -0.0f};
    float big_bf[R * C];
    for (int i = 0; i < R * C; i++)
        big_bf[i] = w[i] * 1000;
    const int64_t shape_w[2] = {R, C}, shape_v[1] = {C}, shape_bf[3] = {2, 2, 2}, shape_e[2] = {3, 0};
    const struct st_write_tensor ts[] = {
        {"layers.0.bf", shape_bf, 3, bf, ST_BF16},
        {"layers.0.w", shape_w, 2, w, ST_F32},
        {"layers.0.w_bf16", shape_w, 2, big_bf, ST_BF16},
        {"v", shape_v, 1, v, ST_F32},
        {"scalar", NULL, 0, &s, ST_F32},
        {"empty", shape_e, 2, NULL, ST_F32},
    };
    const struct st_kv meta[] = {{"format", "pt"}, {"step", "17"}};
    if (st_write(path, ts, 6, meta, 2, err, sizeof err) != 0)
        fail_msg("%s", err);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_false(exists(tmp));

    struct st_file *f = st_open(path, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    assert_int_equal(st_num_tensors(f), 6);
    assert_string_equal(st_metadata(f, "step"), "17");
    assert_string_equal(st_metadata(f, "format"), "pt");
    /* F32 stored before BF16, each starting at an offset aligned to its element size */
    size_t n;
    uint8_t *raw = must_read(path, &n);
    uint64_t hlen;
    memcpy(&hlen, raw, 8);
    assert_int_equal(hlen % 8, 0);
    free(raw);
    for (int i = 0; i < st_num_tensors(f); i++) {
        const struct st_tensor_info *t = st_tensor(f, i);
        assert_int_equal(t->data_begin % st_dtype_size(t->dtype), 0);
        if (i > 0)
            assert_true(st_tensor(f, i - 1)->dtype == ST_F32 || t->dtype == ST_BF16);
    }

    float out[R * C];
    const struct st_tensor_info *t = st_find(f, "layers.0.w");
    assert_int_equal(t->dtype, ST_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], R);
    assert_int_equal(t->shape[1], C);
    assert_int_equal(st_tensor_to_f32(f, t, out, err, sizeof err), 0);
    assert_bits_equal(out, w, R * C, "layers.0.w");
    assert_int_equal(st_tensor_to_f32(f, st_find(f, "v"), out, err, sizeof err), 0);
    assert_bits_equal(out, v, C, "v");
    t = st_find(f, "scalar");
    assert_int_equal(t->n_dims, 0);
    assert_int_equal(st_tensor_to_f32(f, t, out, err, sizeof err), 0);
    assert_true(out[0] == 42.5f);
    t = st_find(f, "empty");
    assert_int_equal(t->n_elements, 0);
    assert_int_equal(t->shape[1], 0);
    t = st_find(f, "layers.0.bf");
    assert_int_equal(t->dtype, ST_BF16);
    assert_int_equal(t->n_dims, 3);
    assert_int_equal(st_tensor_to_f32(f, t, out, err, sizeof err), 0);
    assert_bits_equal(out, bf_want, 8, "layers.0.bf");
    assert_int_equal(st_tensor_to_f32(f, st_find(f, "layers.0.w_bf16"), out, err, sizeof err), 0);
    for (int i = 0; i < R * C; i++)
        assert_true(out[i] == test_bf16_round(big_bf[i]));
    st_close(f);

    /* rewriting replaces the file atomically */
    if (st_write(path, ts + 3, 1, NULL, 0, err, sizeof err) != 0)
        fail_msg("%s", err);
    f = st_open(path, err, sizeof err);
    assert_non_null(f);
    assert_int_equal(st_num_tensors(f), 1);
    assert_int_equal(st_num_metadata(f), 0);
    st_close(f);
    must_rm_rf(dir);
    free(dir);
}

static void test_write_rejects(void **state)
{
    (void)state;
    char *dir = must_tmpdir("test_st"), path[256], err[512];
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    float x[4] = {1, 2, 3, 4};
    const int64_t sh[1] = {4}, neg[1] = {-4};
    const struct {
        struct st_write_tensor t[2];
        size_t n;
        const char *needle;
    } cases[] = {
        {{{"a", sh, 1, x, ST_F32}, {"a", sh, 1, x, ST_BF16}}, 2, "'a' appears twice"},
        {{{"a", sh, 1, x, ST_F16}}, 1, "F16"},
        {{{"a", neg, 1, x, ST_F32}}, 1, "bad shape"},
        {{{"__metadata__", sh, 1, x, ST_F32}}, 1, "invalid name"},
        {{{"", sh, 1, x, ST_F32}}, 1, "invalid name"},
        {{{"a", sh, 1, NULL, ST_F32}}, 1, "no data"},
        {{{"a", sh, 9, x, ST_F32}}, 1, "dimension count"},
        {{{"bad\xff", sh, 1, x, ST_F32}}, 1, "UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(st_write(path, cases[i].t, cases[i].n, NULL, 0, err, sizeof err), -1);
        if (!strstr(err, path) || !strstr(err, cases[i].needle))
            fail_msg("case %zu: '%s'", i, err);
        assert_false(exists(path));
    }
    /* the directory does not exist */
    const struct st_write_tensor ok = {"a", sh, 1, x, ST_F32};
    assert_int_equal(st_write("/nonexistent/dir/x.safetensors", &ok, 1, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/dir/x.safetensors"));
    must_rm_rf(dir);
    free(dir);
}

static void test_write_sharded(void **state)
{
    (void)state;
    char *dir = must_tmpdir("test_st"), p[512], err[512];
    enum { N = 5 };
    float data[N][64];
    int64_t shapes[N][2];
    char names[N][32];
    struct st_write_tensor ts[N];
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < 64; j++)
            data[i][j] = (float)(i * 100 + j) * 0.5f;
        shapes[i][0] = 8;
        shapes[i][1] = 8;
        snprintf(names[i], sizeof names[i], "model.layers.%d.weight", i);
        ts[i] = (struct st_write_tensor){names[i], shapes[i], 2, data[i], i == 2 ? ST_BF16 : ST_F32};
    }
    /* 256 bytes per F32 tensor, 128 for the BF16 one; budget 520 -> [0,1] [2,3] [4] */
    int n_shards = 0;
    const struct st_kv meta[] = {{"format", "pt"}};
    if (st_write_sharded(dir, ts, N, meta, 1, 520, &n_shards, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(n_shards, 3);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_true(exists(p));
    size_t n;
    char *idx = must_read(p, &n);
    assert_non_null(strstr(idx, "\"total_size\": 1152"));
    assert_non_null(strstr(idx, "\"model.layers.3.weight\": \"model-00002-of-00003.safetensors\""));
    free(idx);
    snprintf(p, sizeof p, "%s/model-00003-of-00003.safetensors", dir);
    assert_true(exists(p));

    struct st_model *m = st_model_open(dir, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    assert_int_equal(st_model_num_files(m), 3);
    assert_int_equal(st_model_num_tensors(m), N);
    float out[64];
    for (int i = 0; i < N; i++) {
        const struct st_file *file;
        const struct st_tensor_info *t = st_model_find(m, names[i], &file);
        assert_non_null(t);
        assert_string_equal(st_metadata(file, "format"), "pt");
        assert_int_equal(st_model_tensor_to_f32(m, names[i], out, err, sizeof err), 0);
        for (int j = 0; j < 64; j++)
            assert_true(out[j] == (i == 2 ? test_bf16_round(data[i][j]) : data[i][j]));
    }
    st_model_close(m);

    /* everything fits: a single model.safetensors, and the stale index goes */
    assert_int_equal(st_write_sharded(dir, ts, N, NULL, 0, UINT64_MAX, &n_shards, err, sizeof err), 0);
    assert_int_equal(n_shards, 1);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_false(exists(p));
    m = st_model_open(dir, err, sizeof err);
    assert_non_null(m);
    assert_int_equal(st_model_num_files(m), 1);
    assert_int_equal(st_model_num_tensors(m), N);
    st_model_close(m);

    /* back to shards (one tensor each, budget 1): the stale single file goes */
    assert_int_equal(st_write_sharded(dir, ts, N, NULL, 0, 1, &n_shards, err, sizeof err), 0);
    assert_int_equal(n_shards, N);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_false(exists(p));
    m = st_model_open(dir, err, sizeof err);
    assert_non_null(m);
    assert_int_equal(st_model_num_files(m), N);
    assert_int_equal(st_model_tensor_to_f32(m, names[4], out, err, sizeof err), 0);
    assert_true(out[63] == data[4][63]);
    st_model_close(m);

    assert_int_equal(st_write_sharded("/nonexistent/dir", ts, N, NULL, 0, 1, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/dir"));
    must_rm_rf(dir);
    free(dir);
}

/* ---- malformed files ---- */

/* A file made of an 8-byte length, the header text, and data_len bytes of data. */
static void write_st(const char *path, const char *header, uint64_t hlen_field, size_t data_len)
{
    size_t h = strlen(header);
    uint8_t *buf = calloc(1, 8 + h + data_len);
    memcpy(buf, &hlen_field, 8);
    memcpy(buf + 8, header, h);
    must_write(path, buf, 8 + h + data_len, "wb");
    free(buf);
}

static void test_bad_headers(void **state)
{
    (void)state;
    char path[128], err[512];
    snprintf(path, sizeof path, "/tmp/test_st_%ld_bad.safetensors", (long)getpid());
    const struct {
        const char *header;
        size_t data_len;
        const char *needle;
    } cases[] = {
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 12,
         "tensor 'w' data [65, 81) runs past the end of the file (77 bytes)"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16, "hold 12 bytes"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[16,0]}}", 16, "end before"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
         24, "overlap"},
        {"{\"w\":{\"dtype\":\"F128\",\"shape\":[2],\"data_offsets\":[0,32]}}", 32, "unknown dtype 'F128'"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "\"shape\""},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,-8]}}", 8, "data_offsets"},
        {"{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"extra\":1}}", 8, "'extra'"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
         8, "bad header JSON"},
        {"{\"w\":[1,2]}", 0, "not a JSON object"},
        {"{\"__metadata__\":{\"a\":1}}", 0, "metadata key 'a'"},
        {"{\"__metadata__\":[]}", 0, "__metadata__"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,8]}}", 8, "overflows"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dimensions"},
        {"{\"w\": ", 0, "bad header JSON"},
        {"[1,2]", 0, "not a JSON object"},
        {"", 0, "not a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_st(path, cases[i].header, strlen(cases[i].header), cases[i].data_len);
        struct st_file *f = st_open(path, err, sizeof err);
        if (f)
            fail_msg("case %zu accepted: %s", i, cases[i].header);
        if (!strstr(err, path) || !strstr(err, cases[i].needle))
            fail_msg("case %zu: error '%s' lacks '%s'", i, err, cases[i].needle);
    }
    /* header length fields: beyond the file, absurd */
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    write_st(path, hdr, strlen(hdr) + 5, 4);
    assert_null(st_open(path, err, sizeof err));
    assert_non_null(strstr(err, "runs past the end"));
    write_st(path, hdr, UINT64_C(1) << 40, 4);
    assert_null(st_open(path, err, sizeof err));
    assert_non_null(strstr(err, "limit"));
    /* and the well-formed one opens; trailing spaces in the header are allowed */
    char padded[128];
    snprintf(padded, sizeof padded, "%s    ", hdr);
    write_st(path, padded, strlen(padded), 4);
    struct st_file *f = st_open(path, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    st_close(f);
    must_write(path, "abc", 3, "wb");
    assert_null(st_open(path, err, sizeof err));
    assert_non_null(strstr(err, path));
    unlink(path);
}

static void test_truncated_at_every_offset(void **state)
{
    (void)state;
    size_t n;
    uint8_t *orig = must_read(FIX "st_types.safetensors", &n);
    char path[128], err[512];
    snprintf(path, sizeof path, "/tmp/test_st_%ld_trunc.safetensors", (long)getpid());
    for (size_t cut = 0; cut < n; cut++) {
        must_write(path, orig, cut, "wb");
        err[0] = '\0';
        struct st_file *f = st_open(path, err, sizeof err);
        if (f)
            fail_msg("file cut at %zu of %zu bytes was accepted", cut, n);
        if (!strstr(err, path))
            fail_msg("cut at %zu: error does not name the file: '%s'", cut, err);
    }
    must_write(path, orig, n, "wb");
    struct st_file *f = st_open(path, err, sizeof err);
    assert_non_null(f);
    st_close(f);
    unlink(path);
    free(orig);
}

static void copy_file(const char *from, const char *to)
{
    size_t n;
    void *b = must_read(from, &n);
    must_write(to, b, n, "wb");
    free(b);
}

static void expect_model_fails(const char *dir, const char *index_text, const char *needle)
{
    char p[512], err[512];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    must_write(p, index_text, strlen(index_text), "wb");
    struct st_model *m = st_model_open(dir, err, sizeof err);
    if (m)
        fail_msg("index accepted: %s", index_text);
    if (!strstr(err, dir) || !strstr(err, needle))
        fail_msg("error '%s' lacks '%s'", err, needle);
}

static void test_bad_index(void **state)
{
    (void)state;
    char *dir = must_tmpdir("test_st"), p[512];
    const char *s1 = "model-00001-of-00002.safetensors", *s2 = "model-00002-of-00002.safetensors";
    snprintf(p, sizeof p, "%s/%s", dir, s1);
    copy_file(FIX "sharded/model-00001-of-00002.safetensors", p);
    snprintf(p, sizeof p, "%s/%s", dir, s2);
    copy_file(FIX "sharded/model-00002-of-00002.safetensors", p);

    expect_model_fails(dir, "{\"metadata\":{}}", "weight_map");
    expect_model_fails(dir, "{\"weight_map\": ", "bad JSON");
    expect_model_fails(dir,
                       "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                       "\"model.norm.weight\":\"model-00003-of-00002.safetensors\"}}",
                       "model-00003-of-00002.safetensors");
    expect_model_fails(dir, "{\"weight_map\":{\"model.embed_tokens.weight\":\"../etc/passwd\"}}", "../etc/passwd");
    expect_model_fails(dir, "{\"weight_map\":{\"model.embed_tokens.weight\":7}}", "model.embed_tokens.weight");
    /* mapped to the wrong shard */
    expect_model_fails(dir, "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00002-of-00002.safetensors\"}}",
                       "'model.embed_tokens.weight'");
    /* a shard holds a tensor the index does not list */
    expect_model_fails(dir,
                       "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                       "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}",
                       "'model.layers.0.mlp.up_proj.weight' is not in the index");
    /* a corrupt shard: the error names the shard */
    snprintf(p, sizeof p, "%s/%s", dir, s2);
    must_write(p, "\x10\0\0\0\0\0\0\0{}", 10, "wb");
    expect_model_fails(dir,
                       "{\"weight_map\":{\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                       "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}",
                       s2);
    must_rm_rf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_python_file),
        cmocka_unit_test(test_read_python_sharded),
        cmocka_unit_test(test_write_roundtrip),
        cmocka_unit_test(test_write_rejects),
        cmocka_unit_test(test_write_sharded),
        cmocka_unit_test(test_bad_headers),
        cmocka_unit_test(test_truncated_at_every_offset),
        cmocka_unit_test(test_bad_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
