/* What the C tests of every suite share: the fixtures' paths, temporary directories, whole files read and
 * written, and float comparisons. The test_* functions are plain C and report failure by their return value;
 * included after <cmocka.h>, the must_* ones fail the test instead, naming the path. */
#ifndef GRPO_TESTS_TEST_UTIL_H
#define GRPO_TESTS_TEST_UTIL_H

#include <ftw.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The fixtures, relative to the source root (meson runs these tests from there). */
#define TEST_FIXTURES "tests/fixtures/"
/* The byte-level ChatML tokenizer (259 tokens) and its tiny Llama configuration. */
#define TEST_TOKENIZER_FIXTURE TEST_FIXTURES "tokenizers/bytes-chatml"
/* The transformers models (and PEFT adapters) of the model tests. */
#define TEST_MODELS_FIXTURE TEST_FIXTURES "models/"
/* The small GGUF and safetensors files of the format tests. */
#define TEST_FORMATS_FIXTURE TEST_FIXTURES "formats/"

/* A fresh directory /tmp/NAME-XXXXXX, malloc'd; NULL if it cannot be made. */
static inline char *test_tmpdir(const char *name)
{
    size_t n = strlen(name) + sizeof "/tmp/-XXXXXX";
    char *dir = malloc(n);
    if (!dir)
        return NULL;
    snprintf(dir, n, "/tmp/%s-XXXXXX", name);
    if (!mkdtemp(dir)) {
        free(dir);
        return NULL;
    }
    return dir;
}

static inline int test_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Remove path and all below it (no shell, no link followed). 0, or -1 if anything stays. */
static inline int test_rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return 0;
    return nftw(path, test_rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

/* a/b, malloc'd. */
static inline char *test_path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

/* The whole file, malloc'd with a NUL after its bytes, its size in *n (when n is not NULL); NULL if it cannot be
 * read. */
static inline void *test_read_file(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    char *buf = NULL;
    long sz = fseek(fp, 0, SEEK_END) == 0 ? ftell(fp) : -1;
    if (sz >= 0 && fseek(fp, 0, SEEK_SET) == 0 && (buf = malloc((size_t)sz + 1)) != NULL) {
        if (fread(buf, 1, (size_t)sz, fp) == (size_t)sz) {
            buf[sz] = '\0';
            if (n)
                *n = (size_t)sz;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(fp);
    return buf;
}

/* Write n bytes to path, opened with mode ("wb" to replace, "ab" to append). 0 or -1. */
static inline int test_write_file(const char *path, const void *buf, size_t n, const char *mode)
{
    FILE *fp = fopen(path, mode);
    if (!fp)
        return -1;
    int rc = n && fwrite(buf, 1, n, fp) != n ? -1 : 0;
    return fclose(fp) == 0 ? rc : -1;
}

/* max |a - b|. */
static inline double test_max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

/* The largest |a - b| over the largest |b| (a relative error of the whole vector). */
static inline double test_rel_err_max(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s = fmax(s, fabs((double)b[i]));
    return test_max_abs_diff(a, b, n) / (s > 0 ? s : 1);
}

/* ||a - b|| / ||b|| (||a - b|| when b is all zero). */
static inline double test_rel_err_l2(const float *a, const float *b, size_t n)
{
    double d = 0, w = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        w += (double)b[i] * b[i];
    }
    return w > 0 ? sqrt(d / w) : sqrt(d);
}

#ifdef CMOCKA_H_
/* test_read_file, or the test fails naming the file. */
static inline void *must_read(const char *path, size_t *n)
{
    void *buf = test_read_file(path, n);
    if (!buf) {
        fail_msg("cannot read %s (run the tests from the project root)", path);
        abort(); /* not reached: fail_msg ends the test */
    }
    return buf;
}

/* test_write_file, or the test fails naming the file. */
static inline void must_write(const char *path, const void *buf, size_t n, const char *mode)
{
    if (test_write_file(path, buf, n, mode) != 0)
        fail_msg("cannot write %s", path);
}

/* Append text to path, or the test fails naming the file. */
static inline void must_append(const char *path, const char *text) { must_write(path, text, strlen(text), "ab"); }

/* test_tmpdir, or the test fails. */
static inline char *must_tmpdir(const char *name)
{
    char *dir = test_tmpdir(name);
    if (!dir)
        fail_msg("cannot make a directory /tmp/%s-XXXXXX", name);
    return dir;
}

/* test_rm_rf, or the test fails naming what stays. */
static inline void must_rm_rf(const char *path)
{
    if (test_rm_rf(path) != 0)
        fail_msg("cannot remove %s", path);
}
#endif

/* CRC-32C bit at a time (Castagnoli, reflected 0x82F63B78): the reference the table-driven common/crc32c and the
 * TensorBoard records are checked against. */
static inline uint32_t test_crc32c_bitwise(const uint8_t *p, size_t n)
{
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* x rounded to BF16, to nearest even, by adding half an ulp of the kept part (the device's __float2bfloat16_rn and
 * the kernels' rounding; finite x). */
static inline float test_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x rounded to the nearest BF16 value, a tie to the one whose last mantissa bit is 0, found another way: its two
 * BF16 neighbours compared in double (not the carry trick of test_bf16_round and the kernels). x finite. */
static inline float test_bf16_nearest(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u; /* toward zero, and one BF16 step farther out */
    float a, b;
    memcpy(&a, &lo, sizeof a);
    memcpy(&b, &hi, sizeof b);
    const double da = fabs((double)x - a), db = fabs((double)b - x);
    return da < db || (da == db && !(lo & 0x10000u)) ? a : b;
}

#endif
