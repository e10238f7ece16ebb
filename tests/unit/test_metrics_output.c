/* Failed writes of a run's records (a full disk: /dev/full stands in for one) are caught in every sink, kept
 * as the run's reason to stop (metrics_output_failure) and logged once per file: metrics.jsonl (also when it is
 * a device: opening the logger must not read /dev/full for ever), the TensorBoard event file, the chart, and a
 * final sync or close. A device that takes everything (/dev/null) is no failure. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../test_util.h"

#include "common/log.h"
#include "worker/metrics/metrics.h"

static int setup(void **state)
{
    (void)state;
    metrics_output_failure_reset();
    return 0;
}

/* Run fn(arg) in a child with stderr captured into out; the child's exit status (128: it did not exit), and its
 * peak resident memory in KiB into *maxrss_kb (may be NULL). */
static int capture(void (*fn)(const char *), const char *arg, char *out, size_t outlen, long *maxrss_kb)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], STDERR_FILENO);
        close(p[0]);
        fn(arg);
        _exit(0);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < outlen && (r = read(p[0], out + n, outlen - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = 0;
    close(p[0]);
    int st;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    wait4(pid, &st, 0, &ru);
    if (maxrss_kb)
        *maxrss_kb = ru.ru_maxrss;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static void fill(struct metrics *m, double v)
{
    metrics_init(m);
    metrics_set(m, "actor/pg_loss", v);
    metrics_set(m, "critic/score/mean", 2 * v);
}

static void test_jsonl_on_full_disk(void **state)
{
    (void)state;
    char *dir = must_tmpdir("grpo_metrics_out");
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    assert_int_equal(symlink("/dev/full", path), 0);
    struct metrics_jsonl w;
    assert_int_equal(metrics_jsonl_open(&w, path), 0);
    assert_false(metrics_output_failure(NULL, 0));
    struct metrics m;
    fill(&m, 1);
    assert_int_equal(metrics_jsonl_write(&w, 1, &m), -1);
    char why[1300], want[700];
    assert_true(metrics_output_failure(why, sizeof why));
    snprintf(want, sizeof want, "writing %s: %s", path, strerror(ENOSPC));
    assert_string_equal(why, want);
    assert_int_equal(metrics_jsonl_write(&w, 2, &m), -1); /* still failing; the first failure is kept */
    metrics_jsonl_sync(&w); /* nothing is left to flush (stdio dropped it), and a device has nothing to sync */
    assert_true(metrics_output_failure(why, sizeof why));
    assert_string_equal(why, want);
    metrics_jsonl_close(&w);
    metrics_free(&m);
    must_rm_rf(dir);
    free(dir);
}

static void test_tensorboard_on_full_disk(void **state)
{
    (void)state;
    struct metrics_tb w = {.f = fopen("/dev/full", "wb"), .path = strdup("/dev/full")};
    assert_non_null(w.f);
    struct metrics m;
    fill(&m, 1);
    assert_int_equal(metrics_tb_write(&w, 1, &m, 1.0), -1);
    char why[1300];
    assert_true(metrics_output_failure(why, sizeof why));
    assert_non_null(strstr(why, "/dev/full"));
    assert_non_null(strstr(why, strerror(ENOSPC)));
    metrics_tb_close(&w);
    metrics_free(&m);
}

static void test_chart_cannot_be_written(void **state)
{
    (void)state;
    struct metrics_history h;
    metrics_history_init(&h);
    struct metrics m;
    fill(&m, 1);
    metrics_history_append(&h, 1, &m);
    assert_int_equal(metrics_write_svg("/nonexistent-dir-of-grpo/metrics.svg", &h, "t"), -1);
    char why[1300];
    assert_true(metrics_output_failure(why, sizeof why));
    assert_non_null(strstr(why, "/nonexistent-dir-of-grpo/metrics.svg"));
    metrics_history_free(&h);
    metrics_free(&m);
}

/* In a child: a logger whose metrics.jsonl is /dev/full logs five steps and closes. */
static void five_steps_on_full_disk(const char *dir)
{
    struct metrics_logger lg;
    if (metrics_logger_open(&lg, dir, METRICS_SINK_JSONL | METRICS_SINK_SVG, 5, -1, "t") != 0)
        _exit(3);
    if (metrics_output_failure(NULL, 0))
        _exit(4);
    struct metrics m;
    fill(&m, 1);
    int failed = 0;
    for (int k = 1; k <= 5; k++)
        failed += metrics_logger_log(&lg, k, &m) != 0;
    metrics_logger_sync(&lg);
    metrics_logger_close(&lg);
    metrics_free(&m);
    char why[1300];
    _exit(failed == 5 && metrics_output_failure(why, sizeof why) && strstr(why, "metrics.jsonl") ? 0 : 5);
}

static void test_logger_reports_once(void **state)
{
    (void)state;
    char *dir = must_tmpdir("grpo_metrics_out");
    char path[600], out[16384];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    assert_int_equal(symlink("/dev/full", path), 0);
    alarm(20); /* opening must not read /dev/full (endless zeros, no newline) for ever */
    long rss_kb = 0;
    int st = capture(five_steps_on_full_disk, dir, out, sizeof out, &rss_kb);
    alarm(0);
    if (st != 0)
        fprintf(stderr, "child exit %d, stderr:\n%s\n", st, out);
    assert_int_equal(st, 0);
    assert_true(rss_kb < 256 * 1024); /* nor until memory runs out */
    char line[700];
    snprintf(line, sizeof line, "metrics: writing %s: %s", path, strerror(ENOSPC));
    assert_int_equal(count(out, line), 1); /* five steps failed: one error line */
    assert_int_equal(count(out, "error "), 1);
    must_rm_rf(dir);
    free(dir);
}

/* In a child: a logger whose metrics.jsonl is /dev/null logs three steps, syncs and closes. */
static void three_steps_to_dev_null(const char *dir)
{
    struct metrics_logger lg;
    if (metrics_logger_open(&lg, dir, METRICS_SINK_JSONL | METRICS_SINK_TENSORBOARD, 3, -1, "t") != 0)
        _exit(3);
    struct metrics m;
    fill(&m, 1);
    int failed = 0;
    for (int k = 1; k <= 3; k++)
        failed += metrics_logger_log(&lg, k, &m) != 0;
    failed += metrics_logger_sync(&lg) != 0;
    metrics_logger_close(&lg);
    metrics_free(&m);
    _exit(failed == 0 && !metrics_output_failure(NULL, 0) ? 0 : 5);
}

static void test_dev_null_is_no_failure(void **state)
{
    (void)state;
    char *dir = must_tmpdir("grpo_metrics_out");
    char path[600], out[16384];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    assert_int_equal(symlink("/dev/null", path), 0);
    alarm(20);
    int st = capture(three_steps_to_dev_null, dir, out, sizeof out, NULL);
    alarm(0);
    if (st != 0)
        fprintf(stderr, "child exit %d, stderr:\n%s\n", st, out);
    assert_int_equal(st, 0);
    assert_int_equal(count(out, "error "), 0);
    must_rm_rf(dir);
    free(dir);
}

static void test_first_failure_kept_each_file_logged_once(void **state)
{
    (void)state;
    metrics_output_failed("a", "/x/one", "writing %s: %s", "/x/one", "first");
    metrics_output_failed("b", "/x/two", "writing %s: %s", "/x/two", "second");
    metrics_output_failed("a", "/x/one", "writing %s: %s", "/x/one", "again");
    char why[100];
    assert_true(metrics_output_failure(why, sizeof why));
    assert_string_equal(why, "writing /x/one: first");
    metrics_output_failure_reset();
    assert_false(metrics_output_failure(why, sizeof why));
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_jsonl_on_full_disk, setup),
        cmocka_unit_test_setup(test_tensorboard_on_full_disk, setup),
        cmocka_unit_test_setup(test_chart_cannot_be_written, setup),
        cmocka_unit_test_setup(test_logger_reports_once, setup),
        cmocka_unit_test_setup(test_dev_null_is_no_failure, setup),
        cmocka_unit_test_setup(test_first_failure_kept_each_file_logged_once, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
