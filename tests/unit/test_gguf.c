/* GGUF reader: metadata of every value type, the tensor directory, dequantisation of every supported type
 * against gguf-py's own numpy dequantiser (fixtures made by tests/fixtures/make_format_fixtures.py),
 * truncated and corrupted files (errors, never crashes), and the bundled SmolLM2 model when it is cached. */
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "../test_util.h"

#include "worker/formats/gguf.h"

#define FIX TEST_FORMATS_FIXTURE
#define TINY FIX "tiny.gguf"

static void tmp_path(char *out, size_t n, const char *tag)
{
    snprintf(out, n, "/tmp/test_gguf_%ld_%s.gguf", (long)getpid(), tag);
}

/* got matches want bit for bit, or within 1 ulp, or both are NaN */
static void assert_close_ulp(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &got[i], 4);
        memcpy(&b, &want[i], 4);
        if (a == b || (isnan(got[i]) && isnan(want[i])))
            continue;
        int64_t ia = (a & 0x80000000u) ? -(int64_t)(a & 0x7fffffffu) : (int64_t)a;
        int64_t ib = (b & 0x80000000u) ? -(int64_t)(b & 0x7fffffffu) : (int64_t)b;
        if (llabs(ia - ib) > 1)
            fail_msg("%s[%zu]: got %.9g (0x%08" PRIx32 "), want %.9g (0x%08" PRIx32 ")", what, i, got[i], a, want[i],
                     b);
    }
}

/* ---- metadata ---- */

static void test_metadata(void **state)
{
    (void)state;
    char err[512];
    struct gguf_file *f = gguf_open(TINY, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    assert_string_equal(gguf_path(f), TINY);
    assert_string_equal(gguf_get_str(f, "general.architecture"), "llama");
    assert_string_equal(gguf_get_str(f, "general.name"), "tiny fixture");
    assert_string_equal(gguf_get_str(f, "test.str"), "h\xc3\xa9llo");

    int64_t i;
    double d;
    const struct {
        const char *key;
        int64_t want;
    } ints[] = {{"test.u8", 200},
                {"test.i8", -100},
                {"test.u16", 60000},
                {"test.i16", -30000},
                {"test.u32", 4000000000LL},
                {"test.i32", -2000000000LL},
                {"test.u64", (INT64_C(1) << 40) + 3},
                {"test.i64", -(INT64_C(1) << 40) - 5},
                {"test.bool", 1}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        assert_int_equal(gguf_has_key(f, ints[k].key), 1);
        if (gguf_get_int(f, ints[k].key, &i) != 0)
            fail_msg("gguf_get_int(%s) failed", ints[k].key);
        assert_int_equal(i, ints[k].want);
        /* integers read as floats too */
        assert_int_equal(gguf_get_float(f, ints[k].key, &d), 0);
        assert_true(d == (double)ints[k].want);
    }
    assert_int_equal(gguf_get_float(f, "test.f32", &d), 0);
    assert_true(d == 0.15625);
    assert_int_equal(gguf_get_float(f, "test.f64", &d), 0);
    assert_true(d == 3.141592653589793);
    assert_int_equal(gguf_get_int(f, "test.f32", &i), -1); /* a float is not an integer */

    /* wrong type / absent */
    assert_null(gguf_get_str(f, "test.u8"));
    assert_int_equal(gguf_get_int(f, "test.str", &i), -1);
    assert_int_equal(gguf_get_float(f, "test.str", &d), -1);
    assert_int_equal(gguf_has_key(f, "no.such.key"), 0);
    assert_null(gguf_get_str(f, "no.such.key"));
    assert_int_equal(gguf_get_int(f, "no.such.key", &i), -1);
    assert_int_equal(gguf_get_arr_n(f, "no.such.key"), 0);
    assert_int_equal(gguf_get_arr_n(f, "test.u8"), 0);
    assert_int_equal(gguf_has_key(f, "general.alignment"), 0);

    /* arrays */
    size_t len;
    assert_int_equal(gguf_get_arr_n(f, "test.arr_str"), 4);
    const char *want_s[] = {"a", "bc", "", "d\303\251f"};
    for (size_t k = 0; k < 4; k++) {
        const char *s = gguf_get_arr_str(f, "test.arr_str", k, &len);
        assert_non_null(s);
        assert_int_equal(len, strlen(want_s[k]));
        assert_memory_equal(s, want_s[k], len);
    }
    assert_null(gguf_get_arr_str(f, "test.arr_str", 4, &len));
    assert_null(gguf_get_arr_str(f, "test.arr_i32", 0, &len));
    assert_int_equal(gguf_get_arr_int(f, "test.arr_str", 0, &i), -1);

    assert_int_equal(gguf_get_arr_n(f, "test.arr_i32"), 3);
    const int64_t want_i[] = {1, -2, 300000};
    for (size_t k = 0; k < 3; k++) {
        assert_int_equal(gguf_get_arr_int(f, "test.arr_i32", k, &i), 0);
        assert_int_equal(i, want_i[k]);
        assert_int_equal(gguf_get_arr_float(f, "test.arr_i32", k, &d), 0);
        assert_true(d == (double)want_i[k]);
    }
    assert_int_equal(gguf_get_arr_int(f, "test.arr_i32", 3, &i), -1);
    assert_int_equal(gguf_get_arr_n(f, "test.arr_u8"), 2);
    assert_int_equal(gguf_get_arr_int(f, "test.arr_u8", 1, &i), 0);
    assert_int_equal(i, 255);
    assert_int_equal(gguf_get_arr_int(f, "test.arr_bool", 0, &i), 0);
    assert_int_equal(i, 1);
    assert_int_equal(gguf_get_arr_int(f, "test.arr_bool", 1, &i), 0);
    assert_int_equal(i, 0);
    assert_int_equal(gguf_get_arr_n(f, "test.arr_f32"), 3);
    const double want_f[] = {0.5, -1.5, 2.25};
    for (size_t k = 0; k < 3; k++) {
        assert_int_equal(gguf_get_arr_float(f, "test.arr_f32", k, &d), 0);
        assert_true(d == want_f[k]);
    }
    assert_int_equal(gguf_get_arr_int(f, "test.arr_f32", 0, &i), -1);
    gguf_close(f);
}

/* ---- tensor directory and dequantisation ---- */

static const struct {
    const char *name;
    uint32_t type;
    int n_dims;
    uint64_t d0, d1;
    uint64_t n_bytes;
} tiny_tensors[] = {
    {"f32", GGUF_TYPE_F32, 2, 8, 3, 96},      {"f16", GGUF_TYPE_F16, 2, 16, 2, 64},
    {"bf16", GGUF_TYPE_BF16, 2, 16, 2, 64},   {"q4_0", GGUF_TYPE_Q4_0, 2, 64, 3, 108},
    {"q4_1", GGUF_TYPE_Q4_1, 2, 64, 3, 120},  {"q8_0", GGUF_TYPE_Q8_0, 2, 64, 3, 204},
    {"q6_k", GGUF_TYPE_Q6_K, 2, 256, 2, 420},
};
#define N_TINY ((int)(sizeof tiny_tensors / sizeof tiny_tensors[0]))

static void test_tensor_directory(void **state)
{
    (void)state;
    char err[512];
    struct gguf_file *f = gguf_open(TINY, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    assert_int_equal(gguf_num_tensors(f), N_TINY);
    for (int k = 0; k < N_TINY; k++) {
        const struct gguf_tensor_info *t = gguf_tensor(f, k);
        assert_non_null(t);
        assert_string_equal(t->name, tiny_tensors[k].name);
        assert_int_equal(t->type, tiny_tensors[k].type);
        assert_int_equal(t->n_dims, tiny_tensors[k].n_dims);
        assert_int_equal(t->dims[0], tiny_tensors[k].d0);
        assert_int_equal(t->dims[1], tiny_tensors[k].d1);
        assert_int_equal(t->dims[2], 1);
        assert_int_equal(t->dims[3], 1);
        assert_int_equal(t->n_elements, tiny_tensors[k].d0 * tiny_tensors[k].d1);
        assert_int_equal(t->n_bytes, tiny_tensors[k].n_bytes);
        assert_int_equal(t->offset % 32, 0);
        assert_ptr_equal(gguf_find_tensor(f, tiny_tensors[k].name), t);
    }
    assert_null(gguf_find_tensor(f, "nope"));
    assert_null(gguf_tensor(f, -1));
    assert_null(gguf_tensor(f, N_TINY));
    assert_string_equal(gguf_type_name(GGUF_TYPE_Q4_1), "Q4_1");
    assert_string_equal(gguf_type_name(GGUF_TYPE_Q6_K), "Q6_K");
    assert_string_equal(gguf_type_name(GGUF_TYPE_BF16), "BF16");
    assert_string_equal(gguf_type_name(12), "Q4_K");
    assert_string_equal(gguf_type_name(4), "unknown");
    assert_string_equal(gguf_type_name(1000), "unknown");
    gguf_close(f);
}

static void check_tensor_against(struct gguf_file *f, const char *tensor, const char *ref_path)
{
    char err[512];
    const struct gguf_tensor_info *t = gguf_find_tensor(f, tensor);
    if (!t)
        fail_msg("no tensor %s", tensor);
    size_t n;
    float *want = must_read(ref_path, &n);
    assert_int_equal(n, t->n_elements * 4);
    float *got = malloc(n);
    assert_non_null(got);
    if (gguf_tensor_to_f32(f, t, got, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_close_ulp(got, want, t->n_elements, tensor);
    free(got);
    free(want);
}

static void test_dequantize_every_type(void **state)
{
    (void)state;
    char err[512], ref[256];
    struct gguf_file *f = gguf_open(TINY, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    for (int k = 0; k < N_TINY; k++) {
        snprintf(ref, sizeof ref, FIX "tiny.%s.f32", tiny_tensors[k].name);
        check_tensor_against(f, tiny_tensors[k].name, ref);
    }
    gguf_close(f);
}

static void test_custom_alignment(void **state)
{
    (void)state;
    char err[512];
    struct gguf_file *f = gguf_open(FIX "tiny_align64.gguf", err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    int64_t a;
    assert_int_equal(gguf_get_int(f, "general.alignment", &a), 0);
    assert_int_equal(a, 64);
    assert_int_equal(gguf_num_tensors(f), 2);
    assert_int_equal(gguf_find_tensor(f, "b")->offset, 64);
    check_tensor_against(f, "a", FIX "tiny_align64.a.f32");
    check_tensor_against(f, "b", FIX "tiny_align64.b.f32");
    gguf_close(f);
}

/* ---- a walker over the fixture, to find the byte offsets of fields to corrupt ---- */

struct layout {
    size_t kv_key[64], kv_type[64];
    int n_kv;
    size_t ti_name[16], ti_ndims[16], ti_dim0[16], ti_type[16], ti_off[16];
    int n_t;
    size_t infos_end;
};

static uint64_t ld64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t ld32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static size_t skip_value(const uint8_t *b, size_t pos, uint32_t type)
{
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    if (type == 8)
        return pos + 8 + ld64(b + pos);
    if (type == 9) {
        uint32_t et = ld32(b + pos);
        uint64_t n = ld64(b + pos + 4);
        pos += 12;
        for (uint64_t i = 0; i < n; i++)
            pos = skip_value(b, pos, et);
        return pos;
    }
    return pos + sz[type];
}

static void walk(const uint8_t *b, struct layout *L)
{
    uint64_t n_t = ld64(b + 8), n_kv = ld64(b + 16);
    assert_true(n_kv <= 64 && n_t <= 16);
    size_t pos = 24;
    L->n_kv = (int)n_kv;
    for (uint64_t i = 0; i < n_kv; i++) {
        L->kv_key[i] = pos;
        pos += 8 + ld64(b + pos);
        L->kv_type[i] = pos;
        uint32_t type = ld32(b + pos);
        pos = skip_value(b, pos + 4, type);
    }
    L->n_t = (int)n_t;
    for (uint64_t i = 0; i < n_t; i++) {
        L->ti_name[i] = pos;
        pos += 8 + ld64(b + pos);
        L->ti_ndims[i] = pos;
        uint32_t nd = ld32(b + pos);
        L->ti_dim0[i] = pos + 4;
        pos += 4 + 8 * (size_t)nd;
        L->ti_type[i] = pos;
        L->ti_off[i] = pos + 4;
        pos += 12;
    }
    L->infos_end = pos;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Opening the corrupt copy fails with an error that names the file and contains `needle` (if given). */
static void expect_open_fails(const uint8_t *buf, size_t n, const char *needle, const char *what)
{
    char path[128], err[512];
    tmp_path(path, sizeof path, "corrupt");
    must_write(path, buf, n, "wb");
    struct gguf_file *f = gguf_open(path, err, sizeof err);
    if (f) {
        gguf_close(f);
        unlink(path);
        fail_msg("%s: a corrupt file was accepted", what);
    }
    unlink(path);
    if (!strstr(err, path))
        fail_msg("%s: error does not name the file: %s", what, err);
    if (needle && !strstr(err, needle))
        fail_msg("%s: error lacks '%s': %s", what, needle, err);
}

static void test_corrupt_fields(void **state)
{
    (void)state;
    size_t n;
    uint8_t *orig = must_read(TINY, &n), *b = malloc(n);
    assert_non_null(b);
    struct layout L;
    walk(orig, &L);
    assert_int_equal(L.n_t, N_TINY);
#define RESET() memcpy(b, orig, n)

    RESET();
    b[0] = 'X';
    expect_open_fails(b, n, "not a GGUF file", "magic");
    RESET();
    put32(b + 4, 1);
    expect_open_fails(b, n, "version 1", "version 1");
    RESET();
    put32(b + 4, 7);
    expect_open_fails(b, n, "version 7", "version 7");
    RESET();
    put32(b + 4, 0x03000000u);
    expect_open_fails(b, n, "big-endian", "big-endian");
    RESET();
    put64(b + 8, UINT64_MAX);
    expect_open_fails(b, n, "tensor count", "n_tensors");
    RESET();
    put64(b + 16, UINT64_C(1) << 40);
    expect_open_fails(b, n, "metadata count", "n_kv");
    RESET();
    put64(b + 16, ld64(orig + 16) + 1); /* one entry more than there is: the tensor infos are read as an entry */
    expect_open_fails(b, n, NULL, "n_kv + 1");

    /* key length past the end; value type unknown */
    RESET();
    put64(b + L.kv_key[3], UINT64_MAX - 3);
    expect_open_fails(b, n, "runs past the end", "key length");
    RESET();
    put32(b + L.kv_type[3], 99);
    expect_open_fails(b, n, "unknown value type 99", "value type");
    /* a string value whose length runs past the end: entry 1 is general.name */
    RESET();
    put64(b + L.kv_type[1] + 4, n);
    expect_open_fails(b, n, "general.name", "string length");

    /* tensor infos: q4_0 is tensor 3 */
    RESET();
    put32(b + L.ti_ndims[3], 5);
    expect_open_fails(b, n, "tensor 'q4_0' has 5 dimensions", "n_dims");
    RESET();
    put32(b + L.ti_type[3], 99);
    expect_open_fails(b, n, "tensor 'q4_0' has unknown type 99", "type");
    RESET();
    put32(b + L.ti_type[3], 4); /* a number ggml retired */
    expect_open_fails(b, n, "unknown type 4", "type 4");
    RESET();
    put64(b + L.ti_off[3], ld64(orig + L.ti_off[3]) + (UINT64_C(1) << 20));
    expect_open_fails(b, n, "tensor 'q4_0' data [", "offset past end");
    RESET();
    put64(b + L.ti_off[3], UINT64_MAX - 31); /* wraps when the data start is added */
    expect_open_fails(b, n, "runs past the end of the file", "offset wraps");
    RESET();
    put64(b + L.ti_off[3], ld64(orig + L.ti_off[3]) + 2);
    expect_open_fails(b, n, "not a multiple of the alignment", "unaligned offset");
    RESET();
    put64(b + L.ti_off[3], ld64(orig + L.ti_off[2])); /* q4_0 on top of bf16 */
    expect_open_fails(b, n, "overlap", "overlap");
    RESET();
    put64(b + L.ti_dim0[3], UINT64_C(1) << 62); /* with dims[1] = 3 the element count overflows */
    expect_open_fails(b, n, "overflows", "dims overflow");
    RESET();
    put64(b + L.ti_dim0[3], 48); /* not a multiple of the Q4_0 block of 32 */
    expect_open_fails(b, n, "block size", "partial block");
    RESET();
    put64(b + L.ti_dim0[6], 512); /* q6_k grows to 4 blocks: its data now runs past the end */
    expect_open_fails(b, n, "tensor 'q6_k' data", "grown tensor");
    RESET();
    memcpy(b + L.ti_name[1] + 8, "f32", 3); /* "f16" renamed "f32": duplicate */
    expect_open_fails(b, n, "duplicate tensor name 'f32'", "duplicate tensor");

    /* a type the file format knows but we cannot dequantise: opens, then a clear error */
    RESET();
    put32(b + L.ti_type[6], 12); /* q6_k -> Q4_K: 144-byte blocks, still inside the file */
    char path[128], err[512];
    tmp_path(path, sizeof path, "q4k");
    must_write(path, b, n, "wb");
    struct gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    const struct gguf_tensor_info *t = gguf_find_tensor(f, "q6_k");
    assert_int_equal(t->n_bytes, 2 * 144);
    float out[512];
    assert_int_equal(gguf_tensor_to_f32(f, t, out, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "'q6_k'"));
    assert_non_null(strstr(err, "Q4_K"));
    gguf_close(f);
    unlink(path);

    /* version 2 has the same layout */
    RESET();
    put32(b + 4, 2);
    tmp_path(path, sizeof path, "v2");
    must_write(path, b, n, "wb");
    f = gguf_open(path, err, sizeof err);
    if (!f)
        fail_msg("version 2: %s", err);
    check_tensor_against(f, "q8_0", FIX "tiny.q8_0.f32");
    gguf_close(f);
    unlink(path);
#undef RESET
    free(b);
    free(orig);
}

/* Every prefix of the file: an error naming the file while any tensor's data is cut; a file cut only in the
 * trailing padding still opens and dequantises. */
static void test_truncated_at_every_offset(void **state)
{
    (void)state;
    size_t n;
    uint8_t *orig = must_read(TINY, &n);
    char path[128], err[512];
    tmp_path(path, sizeof path, "trunc");
    /* end of the last tensor's data */
    struct gguf_file *f = gguf_open(TINY, err, sizeof err);
    assert_non_null(f);
    struct layout L;
    walk(orig, &L);
    size_t data_start = (L.infos_end + 31) / 32 * 32, need = 0;
    for (int k = 0; k < gguf_num_tensors(f); k++) {
        const struct gguf_tensor_info *t = gguf_tensor(f, k);
        if (data_start + t->offset + t->n_bytes > need)
            need = data_start + t->offset + t->n_bytes;
    }
    gguf_close(f);
    assert_true(need <= n);
    float *out = malloc(512 * sizeof(float));
    for (size_t cut = 0; cut < n; cut++) {
        must_write(path, orig, cut, "wb");
        err[0] = '\0';
        f = gguf_open(path, err, sizeof err);
        if (cut < need) {
            if (f)
                fail_msg("file cut at %zu of %zu bytes was accepted", cut, n);
            if (!strstr(err, path))
                fail_msg("cut at %zu: error does not name the file: '%s'", cut, err);
        } else {
            if (!f)
                fail_msg("file cut at %zu (only padding lost) rejected: %s", cut, err);
            for (int k = 0; k < gguf_num_tensors(f); k++)
                assert_int_equal(gguf_tensor_to_f32(f, gguf_tensor(f, k), out, err, sizeof err), 0);
            gguf_close(f);
        }
    }
    free(out);
    unlink(path);
    free(orig);
}

/* Random bytes overwritten in the header and directory: open may fail or succeed, but never crashes, and a file
 * that opens dequantises every tensor of a supported type within its bounds. */
static void test_random_corruption(void **state)
{
    (void)state;
    size_t n;
    uint8_t *orig = must_read(TINY, &n), *b = malloc(n);
    struct layout L;
    walk(orig, &L);
    char path[128], err[512];
    tmp_path(path, sizeof path, "fuzz");
    srand(12345);
    int opened = 0;
    for (int it = 0; it < 1500; it++) {
        memcpy(b, orig, n);
        int flips = 1 + rand() % 3;
        for (int k = 0; k < flips; k++)
            b[(size_t)rand() % L.infos_end] = (uint8_t)(rand() & 0xff);
        must_write(path, b, n, "wb");
        struct gguf_file *f = gguf_open(path, err, sizeof err);
        if (!f) {
            if (!strstr(err, path))
                fail_msg("iteration %d: error does not name the file: '%s'", it, err);
            continue;
        }
        opened++;
        for (int k = 0; k < gguf_num_tensors(f); k++) {
            const struct gguf_tensor_info *t = gguf_tensor(f, k);
            if (t->n_elements > (UINT64_C(1) << 24))
                continue;
            float *out = malloc(t->n_elements * sizeof(float) + 4);
            gguf_tensor_to_f32(f, t, out, err, sizeof err);
            free(out);
        }
        gguf_close(f);
    }
    assert_true(opened > 0); /* flips inside string bytes leave the file valid */
    unlink(path);
    free(b);
    free(orig);
}

static void test_missing_file(void **state)
{
    (void)state;
    char err[512];
    assert_null(gguf_open("/nonexistent/dir/model.gguf", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/dir/model.gguf"));
    assert_null(gguf_open("/tmp", err, sizeof err));
    assert_non_null(strstr(err, "/tmp"));
    char path[128];
    tmp_path(path, sizeof path, "empty");
    must_write(path, "", 0, "wb");
    assert_null(gguf_open(path, err, sizeof err));
    assert_non_null(strstr(err, path));
    unlink(path);
}

/* ---- the bundled model ---- */

static void test_bundled_model(void **state)
{
    (void)state;
    char path[1024], err[512];
    const char *env = getenv("GRPO_MODEL_GGUF");
    if (env && *env)
        snprintf(path, sizeof path, "%s", env);
    else if (getenv("GRPO_CACHE"))
        snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", getenv("GRPO_CACHE"));
    else
        snprintf(path, sizeof path, "%s/.cache/grpo/SmolLM2-135M-Instruct.Q4_1.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    if (access(path, R_OK) != 0) {
        print_message("bundled model not found at %s (scripts/fetch_model.sh fetches it); skipping\n", path);
        skip();
    }
    struct gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f)
        fail_msg("%s", err);
    assert_string_equal(gguf_get_str(f, "general.architecture"), "llama");
    assert_int_equal(gguf_num_tensors(f), 272);
    int64_t v;
    assert_int_equal(gguf_get_int(f, "llama.block_count", &v), 0);
    assert_int_equal(v, 30);
    assert_int_equal(gguf_get_int(f, "llama.embedding_length", &v), 0);
    assert_int_equal(v, 576);
    double d;
    assert_int_equal(gguf_get_float(f, "llama.rope.freq_base", &d), 0);
    assert_true(d == 100000.0);
    assert_int_equal(gguf_get_arr_n(f, "tokenizer.ggml.tokens"), 49152);
    size_t len;
    const char *s = gguf_get_arr_str(f, "tokenizer.ggml.tokens", 1, &len);
    assert_non_null(s);
    assert_int_equal(len, strlen("<|im_start|>"));
    assert_memory_equal(s, "<|im_start|>", len);
    s = gguf_get_arr_str(f, "tokenizer.ggml.tokens", 49151, &len);
    assert_int_equal(len, 7);
    assert_memory_equal(s, "ectable", 7);
    assert_int_equal(gguf_get_arr_n(f, "tokenizer.ggml.merges"), 48900);
    assert_int_equal(gguf_get_arr_int(f, "tokenizer.ggml.token_type", 0, &v), 0);
    assert_int_equal(v, 3);

    int n_q41 = 0, n_f32 = 0, n_q80 = 0;
    for (int k = 0; k < gguf_num_tensors(f); k++) {
        const struct gguf_tensor_info *t = gguf_tensor(f, k);
        n_q41 += t->type == GGUF_TYPE_Q4_1;
        n_f32 += t->type == GGUF_TYPE_F32;
        n_q80 += t->type == GGUF_TYPE_Q8_0;
        float *out = malloc(t->n_elements * sizeof(float));
        assert_non_null(out);
        if (gguf_tensor_to_f32(f, t, out, err, sizeof err) != 0)
            fail_msg("%s", err);
        for (uint64_t i = 0; i < t->n_elements; i++)
            if (!isfinite(out[i]))
                fail_msg("%s[%" PRIu64 "] = %g", t->name, i, out[i]);
        free(out);
    }
    assert_int_equal(n_q41, 210);
    assert_int_equal(n_f32, 61);
    assert_int_equal(n_q80, 1);

    /* Reference values from gguf-py 0.19.0: GGUFReader(path) and gguf.quants.dequantize(t.data, t.tensor_type),
     * flattened in ggml order (printed by tests/fixtures/make_format_fixtures.py --model PATH). */
    static const struct {
        const char *tensor;
        uint64_t n;
        double sum; /* float64 sum of all elements */
        size_t idx[7];
        uint32_t bits[7];
        int k;
    } refs[] = {
        {"blk.0.ffn_down.weight",
         884736,
         150.63577270507812,
         {0, 1, 2, 31, 32, 1000, 884735},
         {0xbea96000, 0x3eb13000, 0x3d9a4000, 0xbd760000, 0x3d2a8000, 0x3e7b6000, 0xbe39b800},
         7},
        {"token_embd.weight",
         28311552,
         -15353.04449415207,
         {0, 1, 575, 576, 28311551},
         {0xbdda3400, 0x3d071400, 0x3cf3c000, 0xbcc30000, 0xbd2ad000},
         5},
        {"blk.0.attn_norm.weight", 576, 0.6129436492919922, {0, 1, 575}, {0x3c650000, 0x3cc30000, 0xbd1d0000}, 3},
    };
    for (size_t r = 0; r < sizeof refs / sizeof refs[0]; r++) {
        const struct gguf_tensor_info *t = gguf_find_tensor(f, refs[r].tensor);
        assert_non_null(t);
        assert_int_equal(t->n_elements, refs[r].n);
        float *out = malloc(t->n_elements * sizeof(float));
        assert_int_equal(gguf_tensor_to_f32(f, t, out, err, sizeof err), 0);
        for (int k = 0; k < refs[r].k; k++) {
            float want;
            memcpy(&want, &refs[r].bits[k], 4);
            assert_close_ulp(&out[refs[r].idx[k]], &want, 1, refs[r].tensor);
        }
        double sum = 0;
        for (uint64_t i = 0; i < t->n_elements; i++)
            sum += out[i];
        if (fabs(sum - refs[r].sum) > 1e-6 * (1 + fabs(refs[r].sum)))
            fail_msg("%s: sum %.17g, gguf-py %.17g", refs[r].tensor, sum, refs[r].sum);
        free(out);
    }
    gguf_close(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_tensor_directory),
        cmocka_unit_test(test_dequantize_every_type),
        cmocka_unit_test(test_custom_alignment),
        cmocka_unit_test(test_corrupt_fields),
        cmocka_unit_test(test_truncated_at_every_offset),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_bundled_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
