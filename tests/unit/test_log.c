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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels_and_format),
        cmocka_unit_test(test_level_names),
        cmocka_unit_test(test_check_fopen_reports_path_and_line),
        cmocka_unit_test(test_check_alloc_and_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
