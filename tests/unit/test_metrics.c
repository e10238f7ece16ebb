/* The metrics container and its sinks: JSONL (NaN as null, truncation after a
 * step, reading back), CRC-32C test vectors, TFRecord framing and the Event
 * protobuf bytes, the SVG chart (well-formed XML, edge cases), the console
 * line, and the logger across a resume. */
#include <dirent.h>
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
#include <jansson.h>

#include "worker/metrics/metrics.h"

/* ------------------------------------------------------------------ helpers */

static int count_substr(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static int count_lines(const char *path)
{
    char *s = must_read(path, NULL);
    int n = 0;
    for (char *p = s; *p; p++)
        n += *p == '\n';
    free(s);
    return n;
}

/* ---------------------------------------------------------------- container */

static void test_container(void **state)
{
    (void)state;
    struct metrics m;
    metrics_init(&m);
    double v = 0;
    assert_false(metrics_get(&m, "actor/pg_loss", &v));
    metrics_set(&m, "actor/pg_loss", 0.5);
    metrics_set(&m, "actor/kl_loss", 0.01);
    metrics_set(&m, "actor/entropy", 1.9);
    metrics_set(&m, "actor/pg_loss", -0.25); /* update keeps the position */
    assert_int_equal(metrics_count(&m), 3);
    assert_string_equal(metrics_name(&m, 0), "actor/pg_loss");
    assert_string_equal(metrics_name(&m, 1), "actor/kl_loss");
    assert_string_equal(metrics_name(&m, 2), "actor/entropy");
    assert_true(metrics_get(&m, "actor/pg_loss", &v));
    assert_true(v == -0.25);
    assert_true(metrics_get(&m, "actor/kl_loss", NULL));
    assert_true(metrics_get_or(&m, "missing", 7.0) == 7.0);
    assert_true(metrics_remove(&m, "actor/kl_loss"));
    assert_false(metrics_remove(&m, "actor/kl_loss"));
    assert_int_equal(metrics_count(&m), 2);
    assert_string_equal(metrics_name(&m, 1), "actor/entropy");

    /* many names: the storage grows */
    for (int i = 0; i < 100; i++) {
        char name[32];
        snprintf(name, sizeof name, "x/%d", i);
        metrics_set(&m, name, i);
    }
    assert_int_equal(metrics_count(&m), 102);
    assert_true(metrics_get_or(&m, "x/99", -1) == 99);

    struct metrics a, b;
    metrics_init(&a);
    metrics_init(&b);
    metrics_set(&a, "p", 1);
    metrics_set(&a, "q", 2);
    metrics_set(&b, "q", 20);
    metrics_set(&b, "r", 30);
    metrics_merge(&a, &b);
    assert_int_equal(metrics_count(&a), 3);
    assert_true(metrics_get_or(&a, "q", 0) == 20);
    assert_string_equal(metrics_name(&a, 2), "r");
    metrics_copy(&b, &a);
    assert_int_equal(metrics_count(&b), 3);
    assert_string_equal(metrics_name(&b, 0), "p");

    metrics_clear(&m);
    assert_int_equal(metrics_count(&m), 0);
    metrics_set(&m, "again", 1);
    assert_int_equal(metrics_count(&m), 1);
    metrics_free(&m);
    metrics_free(&a);
    metrics_free(&b);
}

static void test_stats(void **state)
{
    (void)state;
    struct metrics m;
    metrics_init(&m);
    const double scores[] = {0.0, 1.0, NAN, 0.5, INFINITY};
    metrics_set_stats(&m, "critic/score", scores, 5);
    assert_int_equal(metrics_count(&m), 3);
    assert_string_equal(metrics_name(&m, 0), "critic/score/mean");
    assert_string_equal(metrics_name(&m, 1), "critic/score/max");
    assert_string_equal(metrics_name(&m, 2), "critic/score/min");
    assert_true(fabs(metrics_get_or(&m, "critic/score/mean", NAN) - 0.5) < 1e-15);
    assert_true(metrics_get_or(&m, "critic/score/max", NAN) == 1.0);
    assert_true(metrics_get_or(&m, "critic/score/min", NAN) == 0.0);

    const float adv[] = {-1.5f, 2.5f, 0.5f, 0.5f};
    metrics_set_stats_f(&m, "critic/advantages", adv, 4);
    assert_true(fabs(metrics_get_or(&m, "critic/advantages/mean", NAN) - 0.5) < 1e-12);
    assert_true(metrics_get_or(&m, "critic/advantages/max", NAN) == 2.5);
    assert_true(metrics_get_or(&m, "critic/advantages/min", NAN) == -1.5);

    /* the summary is what the statistics are made of: the finite values only */
    const struct metrics_summary sm = metrics_summarize(scores, 5);
    assert_true(sm.sum == 1.5 && sm.max == 1.0 && sm.min == 0.0);
    assert_int_equal(sm.n, 3);
    metrics_set_summary(&m, "summary", &sm);
    assert_true(metrics_get_or(&m, "summary/mean", NAN) == metrics_get_or(&m, "critic/score/mean", 0));
    assert_true(metrics_get_or(&m, "summary/max", NAN) == 1.0);
    assert_int_equal(metrics_summarize(NULL, 0).n, 0);

    metrics_set_stats(&m, "empty", NULL, 0);
    assert_true(isnan(metrics_get_or(&m, "empty/mean", 0)));
    assert_true(isnan(metrics_get_or(&m, "empty/max", 0)));
    assert_true(isnan(metrics_get_or(&m, "empty/min", 0)));
    metrics_free(&m);
}

static void test_proc_rss(void **state)
{
    (void)state;
    double gb = proc_rss_gb();
    assert_true(gb > 0);
    assert_true(gb < 1024);
}

/* -------------------------------------------------------------------- JSONL */

static void test_jsonl_format(void **state)
{
    (void)state;
    struct metrics m;
    metrics_init(&m);
    metrics_set(&m, "actor/pg_loss", 0.1);
    metrics_set(&m, "actor/kl_loss", NAN);
    metrics_set(&m, "perf/total_num_tokens", 123456789012.0);
    metrics_set(&m, "actor/lr", 1e-6);
    metrics_set(&m, "neg_inf", -INFINITY);
    metrics_set(&m, "tiny", 1e-300);
    metrics_set(&m, "third", 1.0 / 3.0);
    metrics_set(&m, "odd \"name\"\\\n\x01", 2);
    char *line = metrics_jsonl_format(7, &m);
    assert_string_equal(line, "{\"step\": 7, \"actor/pg_loss\": 0.1, \"actor/kl_loss\": null, "
                              "\"perf/total_num_tokens\": 123456789012, \"actor/lr\": 1e-06, \"neg_inf\": null, "
                              "\"tiny\": 1e-300, \"third\": 0.3333333333333333, "
                              "\"odd \\\"name\\\"\\\\\\n\\u0001\": 2}\n");
    /* a JSON parser reads it back, every number exactly */
    json_error_t err;
    json_t *root = json_loads(line, 0, &err);
    assert_non_null(root);
    assert_int_equal(json_integer_value(json_object_get(root, "step")), 7);
    assert_true(json_is_null(json_object_get(root, "actor/kl_loss")));
    assert_true(json_number_value(json_object_get(root, "third")) == 1.0 / 3.0);
    assert_true(json_number_value(json_object_get(root, "tiny")) == 1e-300);
    assert_true(json_number_value(json_object_get(root, "odd \"name\"\\\n\x01")) == 2);
    json_decref(root);
    free(line);
    metrics_free(&m);
}

struct collected {
    long steps[64];
    struct metrics m[64];
    int n;
};

static int collect_cb(long step, const struct metrics *m, void *ctx)
{
    struct collected *c = ctx;
    c->steps[c->n] = step;
    metrics_init(&c->m[c->n]);
    metrics_copy(&c->m[c->n], m);
    c->n++;
    return 0;
}

static void collected_free(struct collected *c)
{
    for (int i = 0; i < c->n; i++)
        metrics_free(&c->m[i]);
    c->n = 0;
}

static void write_steps(const char *path, long first, long last)
{
    struct metrics_jsonl w;
    assert_int_equal(metrics_jsonl_open(&w, path), 0);
    struct metrics m;
    metrics_init(&m);
    for (long s = first; s <= last; s++) {
        metrics_clear(&m);
        metrics_set(&m, "critic/score/mean", 0.1 * (double)s);
        metrics_set(&m, "actor/kl_loss", s == 2 ? NAN : 0.001 * (double)s);
        assert_int_equal(metrics_jsonl_write(&w, s, &m), 0);
    }
    assert_int_equal(metrics_jsonl_sync(&w), 0);
    metrics_jsonl_close(&w);
    metrics_free(&m);
}

static void test_jsonl_write_read(void **state)
{
    (void)state;
    char *dir = must_tmpdir("grpo_metrics");
    char *path = test_path_join(dir, "metrics.jsonl");
    write_steps(path, 1, 5);
    assert_int_equal(count_lines(path), 5);
    struct collected c = {0};
    assert_int_equal(metrics_jsonl_read(path, collect_cb, &c), 5);
    assert_int_equal(c.n, 5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(c.steps[i], i + 1);
        assert_int_equal(metrics_count(&c.m[i]), 2);
        assert_string_equal(metrics_name(&c.m[i], 0), "critic/score/mean");
        assert_true(metrics_get_or(&c.m[i], "critic/score/mean", NAN) == 0.1 * (i + 1));
    }
    double v = 0;
    assert_true(metrics_get(&c.m[1], "actor/kl_loss", &v)); /* null reads back as NaN */
    assert_true(isnan(v));
    collected_free(&c);

    /* reopening appends; unreadable and non-numeric entries are skipped */
    write_steps(path, 6, 6);
    must_append(path, "not json\n\n{\"step\": 7, \"s\": \"text\", \"b\": true, \"x\": 3}\n[1,2]\n{\"nostep\": 1}\n");
    assert_int_equal(metrics_jsonl_read(path, collect_cb, &c), 7);
    assert_int_equal(c.steps[5], 6);
    assert_int_equal(c.steps[6], 7);
    assert_int_equal(metrics_count(&c.m[6]), 1);
    assert_true(metrics_get_or(&c.m[6], "x", 0) == 3);
    collected_free(&c);

    assert_int_equal(metrics_jsonl_read("/nonexistent/metrics.jsonl", collect_cb, &c), -1);
    must_rm_rf(dir);
    free(path);
    free(dir);
}

static void test_jsonl_truncate(void **state)
{
    (void)state;
    char *dir = must_tmpdir("grpo_metrics");
    char *path = test_path_join(dir, "metrics.jsonl");
    assert_int_equal(metrics_jsonl_truncate_after(path, 3), 0); /* missing file */
    write_steps(path, 1, 5);
    assert_int_equal(metrics_jsonl_truncate_after(path, 3), 2);
    assert_int_equal(count_lines(path), 3);
    struct collected c = {0};
    assert_int_equal(metrics_jsonl_read(path, collect_cb, &c), 3);
    assert_int_equal(c.steps[2], 3);
    collected_free(&c);

    /* nothing to drop: the file is left alone */
    struct stat before, after;
    assert_int_equal(stat(path, &before), 0);
    assert_int_equal(metrics_jsonl_truncate_after(path, 3), 0);
    assert_int_equal(stat(path, &after), 0);
    assert_int_equal(before.st_ino, after.st_ino);

    /* a torn last line (crash mid-write) is dropped */
    must_append(path, "{\"step\": 4, \"critic/sc");
    assert_int_equal(metrics_jsonl_truncate_after(path, 100), 1);
    assert_int_equal(count_lines(path), 3);
    char *text = must_read(path, NULL);
    assert_true(text[strlen(text) - 1] == '\n');
    free(text);

    /* a complete last line without its newline is kept and ended */
    must_append(path, "{\"step\": 4, \"x\": 1}");
    assert_int_equal(metrics_jsonl_truncate_after(path, 100), 0);
    assert_int_equal(count_lines(path), 4);

    /* a writer opened after a torn line starts on a fresh line */
    must_append(path, "{\"step\": 5, \"x\"");
    write_steps(path, 6, 6);
    assert_int_equal(metrics_jsonl_read(path, collect_cb, &c), 5);
    assert_int_equal(c.steps[4], 6);
    collected_free(&c);

    /* out-of-order steps (an earlier resume that did not truncate): every step > k goes */
    write_steps(path, 2, 3);
    assert_int_equal(metrics_jsonl_truncate_after(path, 2), 5); /* 3, 4, the torn 5, 6, 3 */
    assert_int_equal(metrics_jsonl_read(path, collect_cb, &c), 3);
    assert_int_equal(c.steps[0], 1);
    assert_int_equal(c.steps[1], 2);
    assert_int_equal(c.steps[2], 2);
    collected_free(&c);

    assert_int_equal(metrics_jsonl_truncate_after(path, -1), 3);
    assert_int_equal(count_lines(path), 0);
    /* no temporary file left behind */
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 1);
    must_rm_rf(dir);
    free(path);
    free(dir);
}

/* ------------------------------------------------------------------ history */

static void test_history(void **state)
{
    (void)state;
    struct metrics_history h;
    metrics_history_init(&h);
    struct metrics m;
    metrics_init(&m);
    long order[] = {3, 1, 2, 5};
    for (int i = 0; i < 4; i++) {
        metrics_clear(&m);
        metrics_set(&m, "critic/score/mean", (double)order[i]);
        metrics_history_append(&h, order[i], &m);
    }
    assert_int_equal(h.n, 4);
    for (size_t i = 1; i < h.n; i++)
        assert_true(h.steps[i - 1].step < h.steps[i].step);
    /* a second record of a step merges into it */
    metrics_clear(&m);
    metrics_set(&m, "val-core/gsm8k/reward/mean@1", 0.25);
    metrics_set(&m, "critic/score/mean", 2.5);
    metrics_history_append(&h, 2, &m);
    assert_int_equal(h.n, 4);
    assert_int_equal(h.steps[1].step, 2);
    assert_int_equal(metrics_count(&h.steps[1].m), 2);
    assert_true(metrics_get_or(&h.steps[1].m, "critic/score/mean", 0) == 2.5);
    metrics_history_truncate_after(&h, 2);
    assert_int_equal(h.n, 2);
    assert_int_equal(h.steps[1].step, 2);

    char *dir = must_tmpdir("grpo_metrics");
    char *path = test_path_join(dir, "metrics.jsonl");
    assert_int_equal(metrics_history_load_jsonl(&h, path, true), 0);
    assert_int_equal(metrics_history_load_jsonl(&h, path, false), -1);
    write_steps(path, 2, 4);
    assert_int_equal(metrics_history_load_jsonl(&h, path, false), 3);
    assert_int_equal(h.n, 4); /* 1, 2 (merged), 3, 4 */
    assert_true(metrics_get_or(&h.steps[1].m, "critic/score/mean", 0) == 0.2);
    assert_true(metrics_get(&h.steps[1].m, "val-core/gsm8k/reward/mean@1", NULL));
    metrics_history_free(&h);
    metrics_free(&m);
    must_rm_rf(dir);
    free(path);
    free(dir);
}

/* -------------------------------------------------------------- TensorBoard */

/* TFRecord's mask over the CRC-32C of common/crc32c (whose own vectors are in test_crc32c.c). */
static void test_crc32c_masked(void **state)
{
    (void)state;
    uint32_t c = test_crc32c_bitwise((const uint8_t *)"123456789", 9);
    assert_int_equal(c, 0xE3069283u);
    assert_int_equal(crc32c_masked("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
    assert_int_equal(crc32c_masked("", 0), 0xa282ead8u);
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static void test_tfrecord_frame(void **state)
{
    (void)state;
    uint8_t out[64];
    assert_int_equal(tfrecord_frame(out, "hello", 5), 21);
    assert_int_equal(le64(out), 5);
    assert_int_equal(le32(out + 8), mask(test_crc32c_bitwise(out, 8)));
    assert_memory_equal(out + 12, "hello", 5);
    assert_int_equal(le32(out + 17), mask(test_crc32c_bitwise((const uint8_t *)"hello", 5)));
    /* empty record */
    assert_int_equal(tfrecord_frame(out, "", 0), 16);
    assert_int_equal(le64(out), 0);
    assert_int_equal(le32(out + 12), mask(0));
}

static void test_event_encoding(void **state)
{
    (void)state;
    uint8_t buf[512];
    /* Event{wall_time 1.5, step 3, summary{value{tag "a/b", simple_value 0.25}}}, worked by hand */
    static const uint8_t scalar[] = {0x09, 0,    0,   0,    0,   0, 0, 0xf8, 0x3f, /* wall_time */
                                     0x10, 0x03,                                   /* step */
                                     0x2a, 0x0c,                                   /* summary, 12 bytes */
                                     0x0a, 0x0a,                                   /* value, 10 bytes */
                                     0x0a, 0x03, 'a', '/',  'b',                   /* tag */
                                     0x15, 0,    0,   0x80, 0x3e};                 /* simple_value */
    size_t n = tb_encode_scalar(buf, sizeof buf, 1.5, 3, "a/b", 0.25f);
    assert_int_equal(n, sizeof scalar);
    assert_memory_equal(buf, scalar, sizeof scalar);

    static const uint8_t version[] = {0x09, 0,   0,   0,   0,   0,   0,   0xf8, 0x3f, 0x1a, 13,  'b',
                                      'r',  'a', 'i', 'n', '.', 'E', 'v', 'e',  'n',  't',  ':', '2'};
    n = tb_encode_file_version(buf, sizeof buf, 1.5);
    assert_int_equal(n, sizeof version);
    assert_memory_equal(buf, version, sizeof version);

    static const uint8_t session[] = {0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x96, 0x01, 0x3a, 0x02, 0x08, 0x01};
    n = tb_encode_session_start(buf, sizeof buf, 1.5, 150);
    assert_int_equal(n, sizeof session);
    assert_memory_equal(buf, session, sizeof session);

    /* a short buffer is refused, a zero value is still written (oneof), a long tag gets a 2-byte length */
    assert_int_equal(tb_encode_scalar(buf, 10, 1.5, 3, "a/b", 0.25f), 0);
    n = tb_encode_scalar(buf, sizeof buf, 0, 0, "z", 0.0f);
    assert_int_equal(n, 9 + 2 + 2 + 2 + 3 + 5);
    assert_int_equal(buf[n - 5], 0x15);
    char tag[201];
    memset(tag, 't', 200);
    tag[200] = '\0';
    n = tb_encode_scalar(buf, sizeof buf, 0, 1, tag, 1.0f);
    /* value = 1 + 2 + 200 + 5 = 208; summary = 1 + 2 + 208 = 211; event = 9 + 2 + 1 + 2 + 211 */
    assert_int_equal(n, 225);
    assert_int_equal(buf[11], 0x2a);
    assert_int_equal(buf[12], (211 & 0x7f) | 0x80);
    assert_int_equal(buf[13], 211 >> 7);
    /* a negative step is a ten-byte varint, as protobuf writes int64 */
    n = tb_encode_scalar(buf, sizeof buf, 0, -1, "a", 1.0f);
    assert_int_equal(n, 9 + 11 + 2 + 2 + 3 + 5);
    assert_int_equal(buf[9], 0x10);
    for (int i = 10; i < 19; i++)
        assert_int_equal(buf[i], 0xff);
    assert_int_equal(buf[19], 0x01);
}

/* Read the records of an event file, checking both CRCs of each; returns how many. */
static int read_records(const char *path, uint8_t *records[], size_t lens[], int max)
{
    size_t len;
    uint8_t *data = (uint8_t *)must_read(path, &len);
    size_t off = 0;
    int n = 0;
    while (off < len) {
        assert_true(off + 12 <= len);
        uint64_t rl = le64(data + off);
        assert_int_equal(le32(data + off + 8), mask(test_crc32c_bitwise(data + off, 8)));
        assert_true(off + 16 + rl <= len);
        assert_int_equal(le32(data + off + 12 + rl), mask(test_crc32c_bitwise(data + off + 12, rl)));
        assert_true(n < max);
        records[n] = malloc(rl ? rl : 1);
        memcpy(records[n], data + off + 12, rl);
        lens[n] = rl;
        n++;
        off += 16 + rl;
    }
    free(data);
    return n;
}

static int list_event_files(const char *dir, char names[][256], int max)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0 && n < max)
            snprintf(names[n++], 256, "%s", e->d_name);
    closedir(d);
    return n;
}

static void test_tb_file(void **state)
{
    (void)state;
    char *root = must_tmpdir("grpo_metrics");
    char *dir = test_path_join(root, "run/tensorboard");
    struct metrics_tb w;
    assert_int_equal(metrics_tb_open(&w, dir, -1), 0);
    struct metrics m;
    metrics_init(&m);
    metrics_set(&m, "actor/pg_loss", 0.25);
    metrics_set(&m, "actor/kl_loss", NAN);
    assert_int_equal(metrics_tb_write(&w, 3, &m, 1.5), 0);
    assert_int_equal(metrics_tb_sync(&w), 0);
    char *path = strdup(w.path);
    metrics_tb_close(&w);

    uint8_t *rec[8] = {0};
    size_t len[8] = {0};
    int n = read_records(path, rec, len, 8);
    assert_int_equal(n, 3);
    assert_int_equal(len[0], 24);
    assert_memory_equal(rec[0] + 9,
                        "\x1a\x0d"
                        "brain.Event:2",
                        15);
    uint8_t expect[128];
    size_t en = tb_encode_scalar(expect, sizeof expect, 1.5, 3, "actor/pg_loss", 0.25f);
    assert_int_equal(len[1], en);
    assert_memory_equal(rec[1], expect, en);
    en = tb_encode_scalar(expect, sizeof expect, 1.5, 3, "actor/kl_loss", NAN);
    assert_int_equal(len[2], en);
    for (int i = 0; i < n; i++)
        free(rec[i]);

    /* a second writer in the same second gets its own file, with the SessionLog START */
    assert_int_equal(metrics_tb_open(&w, dir, 4), 0);
    assert_string_not_equal(w.path, path);
    char *path2 = strdup(w.path);
    metrics_tb_close(&w);
    n = read_records(path2, rec, len, 8);
    assert_int_equal(n, 2);
    en = tb_encode_session_start(expect, sizeof expect, 0, 4);
    assert_int_equal(len[1], en);
    assert_memory_equal(rec[1] + 9, expect + 9, en - 9);
    for (int i = 0; i < n; i++)
        free(rec[i]);
    char names[4][256];
    assert_int_equal(list_event_files(dir, names, 4), 2);
    char host[256];
    gethostname(host, sizeof host);
    assert_non_null(strstr(path, host));

    metrics_free(&m);
    must_rm_rf(root);
    free(path);
    free(path2);
    free(dir);
    free(root);
}

/* -------------------------------------------------------------------- chart */

/* A small XML well-formedness check: nesting, quoted attributes, entity references, one root,
 * no character data outside it. Returns NULL when well-formed, else what is wrong. */
static const char *xml_check(const char *s)
{
    static char why[128];
    const char *stack[64];
    size_t stack_len[64];
    int depth = 0, roots = 0;
    const char *p = s;
    if (strncmp(p, "<?xml", 5) == 0) {
        p = strstr(p, "?>");
        if (!p)
            return "unterminated prolog";
        p += 2;
    }
    while (*p) {
        if (*p != '<') {
            if (depth == 0 && !strchr(" \t\r\n", *p))
                return "text outside the root";
            if (*p == '&') {
                const char *e = strchr(p, ';');
                if (!e || e - p > 8)
                    return "bad entity";
                static const char *const ok[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
                bool found = p[1] == '#';
                for (int i = 0; i < 5 && !found; i++)
                    found = strncmp(p, ok[i], strlen(ok[i])) == 0;
                if (!found)
                    return "unknown entity";
            }
            if (*p == '>')
                return "stray >";
            if ((unsigned char)*p < 0x20 && !strchr("\t\r\n", *p))
                return "control character";
            p++;
            continue;
        }
        if (strncmp(p, "<!--", 4) == 0) {
            p = strstr(p, "-->");
            if (!p)
                return "unterminated comment";
            p += 3;
            continue;
        }
        bool closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t nlen = strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:.");
        if (nlen == 0)
            return "bad tag name";
        p = name + nlen;
        if (closing) {
            p += strspn(p, " \t\n");
            if (*p != '>')
                return "bad closing tag";
            if (depth == 0 || stack_len[depth - 1] != nlen || strncmp(stack[depth - 1], name, nlen) != 0) {
                snprintf(why, sizeof why, "mismatched </%.*s>", (int)nlen, name);
                return why;
            }
            depth--;
            p++;
            continue;
        }
        /* attributes */
        for (;;) {
            size_t ws = strspn(p, " \t\n");
            p += ws;
            if (*p == '>' || (p[0] == '/' && p[1] == '>'))
                break;
            if (!ws)
                return "attributes not separated";
            size_t alen = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_:.");
            if (alen == 0 || p[alen] != '=' || (p[alen + 1] != '"' && p[alen + 1] != '\''))
                return "bad attribute";
            char q = p[alen + 1];
            const char *v = p + alen + 2;
            const char *end = strchr(v, q);
            if (!end)
                return "unterminated attribute";
            for (const char *c = v; c < end; c++)
                if (*c == '<')
                    return "< in attribute";
            p = end + 1;
        }
        if (depth == 0)
            roots++;
        if (*p == '/') {
            p += 2;
            continue;
        }
        if (depth == 64)
            return "too deep";
        stack[depth] = name;
        stack_len[depth] = nlen;
        depth++;
        p++;
    }
    if (depth != 0)
        return "unclosed element";
    if (roots != 1)
        return "not exactly one root";
    return NULL;
}

static void test_xml_checker(void **state)
{
    (void)state;
    assert_null(xml_check("<?xml version=\"1.0\"?>\n<a x=\"1\"><b/>t &amp; u</a>\n"));
    assert_non_null(xml_check("<a><b></a></b>"));
    assert_non_null(xml_check("<a>x & y</a>"));
    assert_non_null(xml_check("<a x=1></a>"));
    assert_non_null(xml_check("<a></a><b></b>"));
    assert_non_null(xml_check("<a>"));
}

static char *svg_of(const struct metrics_history *h, const char *title)
{
    char *dir = must_tmpdir("grpo_metrics");
    char *path = test_path_join(dir, "metrics.svg");
    assert_int_equal(metrics_write_svg(path, h, title), 0);
    char *svg = must_read(path, NULL);
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 1); /* no temporary left */
    must_rm_rf(dir);
    free(path);
    free(dir);
    const char *why = xml_check(svg);
    if (why)
        fail_msg("SVG not well-formed: %s", why);
    assert_null(strstr(svg, "<script"));
    assert_null(strstr(svg, "@import"));
    assert_null(strstr(svg, "nan"));
    assert_null(strstr(svg, "inf"));
    return svg;
}

static void test_svg(void **state)
{
    (void)state;
    struct metrics_history h;
    metrics_history_init(&h);
    struct metrics m;
    metrics_init(&m);

    /* empty history: five panels, each without data */
    char *svg = svg_of(&h, NULL);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_int_equal(count_substr(svg, ">no data</text>"), 5);
    free(svg);

    /* a normal run, a NaN, a constant series, no throughput, validation points */
    for (long s = 1; s <= 30; s++) {
        metrics_clear(&m);
        metrics_set(&m, "critic/score/mean", 0.2 + 0.01 * (double)s);
        metrics_set(&m, "actor/kl_loss", s == 7 ? NAN : 1e-4 * (double)s);
        metrics_set(&m, "actor/entropy", 1.5);
        metrics_set(&m, "response_length/mean", 20 + (double)(s % 5));
        if (s % 10 == 0)
            metrics_set(&m, "val-core/gsm8k/reward/mean@1", 0.3 + 0.01 * (double)s);
        metrics_history_append(&h, s, &m);
    }
    svg = svg_of(&h, "qwen <0.5B> & \"gsm8k\"");
    assert_non_null(strstr(svg, "qwen &lt;0.5B&gt; &amp; &quot;gsm8k&quot;"));
    assert_non_null(strstr(svg, ">reward</text>"));
    assert_non_null(strstr(svg, ">KL</text>"));
    assert_non_null(strstr(svg, ">actor/kl_loss</text>"));
    assert_non_null(strstr(svg, ">entropy</text>"));
    assert_non_null(strstr(svg, ">response length</text>"));
    assert_non_null(strstr(svg, ">throughput (tokens/s)</text>"));
    assert_int_equal(count_substr(svg, ">no data</text>"), 1);
    assert_int_equal(count_substr(svg, "<polyline"), 5);              /* 4 training series + the validation line */
    assert_int_equal(count_substr(svg, "<circle"), 3);                /* 3 validation points */
    assert_non_null(strstr(svg, ">val gsm8k: 0.6 (step 30)</text>")); /* the latest-values panel */
    assert_non_null(strstr(svg, ">throughput (tokens/s): no data</text>"));
    assert_non_null(strstr(svg, ">step</text>"));
    assert_non_null(strstr(svg, ">30</text>")); /* an x tick at the last step */
    assert_null(strstr(svg, "acc"));            /* no accuracy recorded: none drawn */
    free(svg);

    /* accuracies: a training line and validation points in the reward panel */
    metrics_history_free(&h);
    metrics_history_init(&h);
    for (long s = 0; s <= 20; s++) {
        metrics_clear(&m);
        if (s > 0) {
            metrics_set(&m, "critic/score/mean", 0.2 + 0.01 * (double)s);
            metrics_set(&m, "critic/acc/mean", 0.01 * (double)s);
        }
        if (s % 10 == 0) {
            metrics_set(&m, "val-core/arithmetic/reward/mean@1", 0.1 + 0.02 * (double)s);
            metrics_set(&m, "val-core/arithmetic/acc/mean@1", 0.01 * (double)s);
        }
        metrics_history_append(&h, s, &m);
    }
    svg = svg_of(&h, NULL);
    assert_non_null(strstr(svg, ">critic/{score,acc}/mean; points: val-core/*/{reward,acc}/mean@N</text>"));
    assert_non_null(strstr(svg, ">train acc: 0.2 (step 20)</text>"));
    assert_non_null(strstr(svg, ">val arithmetic: 0.5 (step 20)</text>"));
    assert_non_null(strstr(svg, ">val arithmetic acc: 0.2 (step 20)</text>"));
    free(svg);

    /* KL falls back to ppo_kl; a single point draws a marker */
    metrics_history_free(&h);
    metrics_history_init(&h);
    metrics_clear(&m);
    metrics_set(&m, "actor/ppo_kl", 0.002);
    metrics_set(&m, "perf/throughput", 0);
    metrics_history_append(&h, 1, &m);
    svg = svg_of(&h, "one step");
    assert_non_null(strstr(svg, ">actor/ppo_kl</text>"));
    assert_int_equal(count_substr(svg, "<circle"), 2);
    assert_int_equal(count_substr(svg, "<polyline"), 0);
    assert_int_equal(count_substr(svg, ">no data</text>"), 3);
    free(svg);

    /* every value NaN: no data */
    metrics_clear(&m);
    metrics_set(&m, "critic/score/mean", NAN);
    metrics_history_append(&h, 2, &m);
    svg = svg_of(&h, NULL);
    assert_int_equal(count_substr(svg, ">no data</text>"), 3);
    free(svg);

    /* huge and tiny magnitudes keep their tick labels finite */
    metrics_clear(&m);
    metrics_set(&m, "perf/throughput", 3e9);
    metrics_set(&m, "actor/ppo_kl", 3e-9);
    metrics_history_append(&h, 1000000, &m);
    svg = svg_of(&h, NULL);
    free(svg);

    assert_int_equal(metrics_write_svg("/nonexistent/dir/x.svg", &h, NULL), -1);
    metrics_history_free(&h);
    metrics_free(&m);
}

/* ------------------------------------------------------------------ console */

static void test_console(void **state)
{
    (void)state;
    struct metrics_console c;
    metrics_console_init(&c, 40);
    struct metrics m;
    metrics_init(&m);
    metrics_set(&m, "critic/score/mean", 0.29);
    metrics_set(&m, "timing_s/step", 40.0);
    metrics_console_update(&c, &m);

    metrics_clear(&m);
    metrics_set(&m, "critic/score/mean", 0.41);
    metrics_set(&m, "actor/kl_loss", 0.0031);
    metrics_set(&m, "actor/entropy", 1.92);
    metrics_set(&m, "response_length/mean", 23.4);
    metrics_set(&m, "perf/throughput", 412.3);
    metrics_set(&m, "timing_s/step", 38.2);
    char buf[512];
    int n = metrics_console_render(&c, 12, &m, buf, sizeof buf);
    /* ETA: 28 steps left x (40 + 38.2) / 2 s = 1094.8 s */
    const char *want =
        "step 12/40 [###.........]  30% | reward 0.410 (+0.120) | kl 0.0031 | entropy 1.920 | len 23.4 | "
        "412 tok/s | step 38.2s | eta 18m";
    assert_string_equal(buf, want);
    assert_int_equal(n, (int)strlen(want));

    /* truncation reports the full length, like snprintf */
    char small[16];
    assert_int_equal(metrics_console_render(&c, 12, &m, small, sizeof small), n);
    assert_int_equal(strlen(small), 15);
    assert_memory_equal(small, want, 15);

    /* the ppo_kl fallback, validation rewards, unknown total */
    metrics_remove(&m, "actor/kl_loss");
    metrics_set(&m, "actor/ppo_kl", 0.00001234);
    metrics_set(&m, "val-core/gsm8k/reward/mean@1", 0.5);
    metrics_console_init(&c, 0);
    metrics_console_render(&c, 7, &m, buf, sizeof buf);
    assert_string_equal(buf, "step 7 | reward 0.410 | kl 1.23e-05 | entropy 1.920 | len 23.4 | 412 tok/s | "
                             "val gsm8k 0.500 | step 38.2s");
    /* the exact-answer accuracies next to the rewards */
    metrics_set(&m, "critic/acc/mean", 0.375);
    metrics_set(&m, "val-core/gsm8k/acc/mean@1", 0.46875);
    metrics_console_render(&c, 7, &m, buf, sizeof buf);
    assert_string_equal(buf, "step 7 | reward 0.410 | acc 0.375 | kl 1.23e-05 | entropy 1.920 | len 23.4 | 412 tok/s | "
                             "val gsm8k 0.500 acc 0.469 | step 38.2s");

    /* nothing known but the step */
    metrics_clear(&m);
    metrics_console_init(&c, 5);
    metrics_console_render(&c, 5, &m, buf, sizeof buf);
    assert_string_equal(buf, "step 5/5 [############] 100%");
    metrics_set(&m, "timing_s/step", 7200);
    metrics_console_render(&c, 2, &m, buf, sizeof buf);
    assert_string_equal(buf, "step 2/5 [####........]  40% | step 7200.0s | eta 6h00m");

    assert_int_equal(metrics_progress_render(buf, sizeof buf, "gen", 12, 64, "sequences"), 19);
    assert_string_equal(buf, "gen 12/64 sequences");
    metrics_progress_render(buf, sizeof buf, "reward", 3, 0, NULL);
    assert_string_equal(buf, "reward 3");
    /* not a terminal under the test runner: both are silent no-ops */
    metrics_progress("gen", 1, 2, "sequences");
    metrics_progress_done();
    metrics_free(&m);
}

/* ------------------------------------------------------------------- logger */

static void log_steps(struct metrics_logger *lg, long first, long last, double base)
{
    struct metrics m;
    metrics_init(&m);
    for (long s = first; s <= last; s++) {
        metrics_clear(&m);
        metrics_set(&m, "critic/score/mean", base + (double)s);
        metrics_set(&m, "timing_s/step", 1.0);
        assert_int_equal(metrics_logger_log(lg, s, &m), 0);
    }
    metrics_free(&m);
}

static void test_logger_resume(void **state)
{
    (void)state;
    char *root = must_tmpdir("grpo_metrics");
    char *run = test_path_join(root, "runs/grpo/demo");
    unsigned sinks = METRICS_SINK_JSONL | METRICS_SINK_TENSORBOARD | METRICS_SINK_SVG;
    struct metrics_logger lg;
    assert_int_equal(metrics_logger_open(&lg, run, sinks, 10, -1, "demo"), 0);
    log_steps(&lg, 1, 5, 0);
    assert_int_equal(metrics_logger_sync(&lg), 0);
    metrics_logger_close(&lg);

    /* resumed from the checkpoint of step 3: steps 4 and 5 are forgotten */
    assert_int_equal(metrics_logger_open(&lg, run, sinks, 10, 3, "demo"), 0);
    assert_int_equal(lg.history.n, 3);
    assert_int_equal(lg.console.step_time_n, 3);
    log_steps(&lg, 4, 6, 100);
    metrics_logger_close(&lg);

    char *jsonl = test_path_join(run, "metrics.jsonl");
    struct collected c = {0};
    assert_int_equal(metrics_jsonl_read(jsonl, collect_cb, &c), 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(c.steps[i], i + 1);
    assert_true(metrics_get_or(&c.m[2], "critic/score/mean", 0) == 3);
    assert_true(metrics_get_or(&c.m[3], "critic/score/mean", 0) == 104);
    collected_free(&c);

    char *tb = test_path_join(run, "tensorboard");
    char names[4][256];
    assert_int_equal(list_event_files(tb, names, 4), 2);
    char *svg_path = test_path_join(run, "metrics.svg");
    char *svg = must_read(svg_path, NULL);
    assert_null(xml_check(svg));
    assert_non_null(strstr(svg, ">demo</text>"));
    assert_non_null(strstr(svg, "steps 1 to 6"));
    free(svg);

    /* a fresh start in the same directory drops everything */
    assert_int_equal(metrics_logger_open(&lg, run, sinks, 10, -1, NULL), 0);
    assert_int_equal(lg.history.n, 0);
    metrics_logger_close(&lg);
    assert_int_equal(count_lines(jsonl), 0);

    must_rm_rf(root);
    free(svg_path);
    free(tb);
    free(jsonl);
    free(run);
    free(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_container),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_proc_rss),
        cmocka_unit_test(test_jsonl_format),
        cmocka_unit_test(test_jsonl_write_read),
        cmocka_unit_test(test_jsonl_truncate),
        cmocka_unit_test(test_history),
        cmocka_unit_test(test_crc32c_masked),
        cmocka_unit_test(test_tfrecord_frame),
        cmocka_unit_test(test_event_encoding),
        cmocka_unit_test(test_tb_file),
        cmocka_unit_test(test_xml_checker),
        cmocka_unit_test(test_svg),
        cmocka_unit_test(test_console),
        cmocka_unit_test(test_logger_resume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
