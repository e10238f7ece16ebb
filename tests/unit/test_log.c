/* Logging: level filtering, the line format (level, rank, subsystem), and
 * check macros that report file and line and end the program. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "capture.h"

#include "common/backoff.h"
#include "common/check.h"
#include "common/log.h"

static void emit_levels(void)
{
    log_set_level(LOG_WARN);
    log_set_rank(3);
    log_debug("sub", "hidden-debug");
    log_info("sub", "hidden-info");
    log_warn("cfg", "shown-warn %d", 42);
    log_error("cfg", "shown-error");
}

static void test_levels_and_format(void **state)
{
    (void)state;
    char out[4096];
    assert_int_equal(capture(emit_levels, out, sizeof out), 0);
    assert_null(strstr(out, "hidden"));
    assert_non_null(strstr(out, "warn  [rank 3] cfg: shown-warn 42\n"));
    assert_non_null(strstr(out, "error [rank 3] cfg: shown-error\n"));
}

static void test_level_names(void **state)
{
    (void)state;
    assert_int_equal(log_level_from_name("debug"), LOG_DEBUG);
    assert_int_equal(log_level_from_name("error"), LOG_ERROR);
    assert_int_equal(log_level_from_name("verbose"), -1);
    assert_int_equal(log_level_from_name(NULL), -1);
}

static void fail_fopen(void)
{
    FILE *f = CHECK_FOPEN("/nonexistent/dir/x.bin", "rb");
    (void)f;
}

static void test_check_fopen_reports_path_and_line(void **state)
{
    (void)state;
    char out[4096];
    assert_int_equal(capture(fail_fopen, out, sizeof out), 1);
    assert_non_null(strstr(out, "'/nonexistent/dir/x.bin'"));
    assert_non_null(strstr(out, "No such file or directory"));
    assert_non_null(strstr(out, "test_log.c:"));
}

static void fail_alloc(void)
{
    void *p = CHECK_ALLOC(NULL);
    (void)p;
}

static int hook_code = -1;
static void hook(int code)
{
    hook_code = code;
    fprintf(stderr, "hook ran with %d\n", code);
    _exit(7);
}

static void fail_with_hook(void)
{
    check_set_fatal_hook(hook);
    fail_alloc();
}

static void test_check_alloc_and_hook(void **state)
{
    (void)state;
    char out[4096];
    assert_int_equal(capture(fail_alloc, out, sizeof out), 1);
    assert_non_null(strstr(out, "out of memory"));
    assert_int_equal(capture(fail_with_hook, out, sizeof out), 7);
    assert_non_null(strstr(out, "hook ran with 1"));
}

/* Rate limiting, decided at given times: the first line passes, the next ones within the interval are held and
 * counted, the first after it passes with that count, and the count starts again. */
static void test_log_limit(void **state)
{
    (void)state;
    struct log_limit l = {0};
    unsigned held = 99;
    assert_true(log_limit_pass(&l, 100.0, 5.0, &held));
    assert_int_equal(held, 0);
    for (int i = 0; i < 1000; i++) /* a refusal loop: 1000 lines in under a second */
        assert_false(log_limit_pass(&l, 100.0 + i * 0.0009, 5.0, &held));
    assert_false(log_limit_pass(&l, 104.99, 5.0, &held));
    assert_true(log_limit_pass(&l, 105.0, 5.0, &held));
    assert_int_equal(held, 1001);
    assert_true(log_limit_pass(&l, 200.0, 5.0, &held));
    assert_int_equal(held, 0);
}

static void emit_limited(void)
{
    for (int i = 0; i < 500; i++)
        log_warn_every("rollout", "refused (%d); asking again", i);
    log_warn("rollout", "another call site");
}

/* One call site in a loop writes one line; another call site is not held by it. */
static void test_log_every_one_line(void **state)
{
    (void)state;
    char out[65536];
    assert_int_equal(capture(emit_limited, out, sizeof out), 0);
    int lines = 0;
    for (const char *p = out; (p = strchr(p, '\n')); p++)
        lines++;
    assert_int_equal(lines, 2);
    assert_non_null(strstr(out, "refused (0); asking again\n"));
    assert_non_null(strstr(out, "another call site"));
}

/* Backoff: each delay lies in [d/2, d] for d = first, 2 first, 4 first, ... capped; a reset starts over; two
 * seeds draw different delays (processes refused together do not come back together). */
static void test_backoff(void **state)
{
    (void)state;
    struct backoff a, b;
    backoff_init_seeded(&a, 0.1, 2.0, 1);
    backoff_init_seeded(&b, 0.1, 2.0, 2);
    double d = 0.1;
    int differ = 0;
    for (int i = 0; i < 12; i++) {
        const double x = backoff_next(&a), y = backoff_next(&b);
        if (!(x >= d / 2 && x <= d) || !(y >= d / 2 && y <= d))
            fail_msg("try %d: delays %g and %g outside [%g, %g]", i, x, y, d / 2, d);
        differ += x != y;
        d = d * 2 < 2.0 ? d * 2 : 2.0;
    }
    assert_true(differ >= 11);
    backoff_reset(&a);
    const double x = backoff_next(&a);
    assert_true(x >= 0.05 && x <= 0.1);
    /* the jitter spreads: over many draws at the cap, both halves of [1, 2] are used */
    int low = 0, high = 0;
    for (int i = 0; i < 200; i++) {
        const double z = backoff_next(&a);
        low += z < 1.5;
        high += z >= 1.5;
    }
    assert_true(low > 40 && high > 40);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_and_format),
        cmocka_unit_test(test_level_names),
        cmocka_unit_test(test_check_fopen_reports_path_and_line),
        cmocka_unit_test(test_check_alloc_and_hook),
        cmocka_unit_test(test_log_limit),
        cmocka_unit_test(test_log_every_one_line),
        cmocka_unit_test(test_backoff),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
