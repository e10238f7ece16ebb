/* grpod's state directory: the state file replaced atomically, one grpod per
 * directory, a stale temporary removed, the event log appended. */
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

#include "daemon/journal.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/grpo-journal-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return test_rm_rf(dir);
}

static void test_save_load(void **state)
{
    (void)state;
    struct journal j;
    char err[512], path[512], *text;
    snprintf(path, sizeof path, "%s/a/b", dir); /* created with its parents */
    assert_int_equal(journal_open(&j, path, err, sizeof err), 0);
    assert_int_equal(journal_load(&j, &text, err, sizeof err), 0);
    assert_null(text);
    assert_int_equal(journal_save(&j, "{\"x\": 1}", err, sizeof err), 0);
    assert_int_equal(journal_save(&j, "{\"x\": 2}", err, sizeof err), 0);
    assert_int_equal(journal_load(&j, &text, err, sizeof err), 0);
    assert_string_equal(text, "{\"x\": 2}");
    free(text);
    struct stat st;
    assert_int_equal(stat(j.tmp_path, &st), -1); /* nothing half-written left */
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0750);
    assert_int_equal(stat(j.state_path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600); /* run.json holds the data-plane key of the run's launch */
    journal_event(&j, 1796000000.25, "rank 1 on host h lost");
    journal_event(&j, 1796000001.5, "run waiting");
    FILE *f = fopen(j.events_path, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "Z rank 1 on host h lost\n"));
    assert_non_null(fgets(line, sizeof line, f));
    assert_non_null(strstr(line, "run waiting"));
    fclose(f);
    journal_close(&j);
}

/* The record log: appended lines come back in order, journal_event says what it appended, and a state file written
 * whole empties the log (it holds the records). */
static void test_record_log(void **state)
{
    (void)state;
    struct journal j;
    char err[512], *text = (char *)"x";
    assert_int_equal(journal_open(&j, dir, err, sizeof err), 0);
    assert_int_equal(journal_load_log(&j, &text, err, sizeof err), 0);
    assert_null(text); /* none yet */
    assert_int_equal(journal_append(&j, "{\"seq\":1}", err, sizeof err), 0);
    assert_int_equal(journal_append(&j, "{\"seq\":2}", err, sizeof err), 0);
    assert_int_equal(journal_load_log(&j, &text, err, sizeof err), 0);
    assert_string_equal(text, "{\"seq\":1}\n{\"seq\":2}\n");
    free(text);
    struct stat st;
    assert_int_equal(stat(j.log_path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(journal_save(&j, "{\"seq\": 2}", err, sizeof err), 0);
    assert_int_equal(journal_load_log(&j, &text, err, sizeof err), 0);
    assert_string_equal(text, ""); /* emptied */
    free(text);
    assert_int_equal(journal_append(&j, "{\"seq\":3}", err, sizeof err), 0);
    journal_close(&j);
    assert_int_equal(journal_open(&j, dir, err, sizeof err), 0); /* a restart reads what was appended */
    assert_int_equal(journal_load_log(&j, &text, err, sizeof err), 0);
    assert_string_equal(text, "{\"seq\":3}\n");
    free(text);
    assert_int_equal(journal_event(&j, 1796000000.25, "run waiting"), strlen("2026-11-30T00:53:20.250Z run waiting\n"));
    journal_close(&j);
}

static void test_one_grpod_per_directory(void **state)
{
    (void)state;
    struct journal a, b;
    char err[512];
    assert_int_equal(journal_open(&a, dir, err, sizeof err), 0);
    assert_int_equal(journal_open(&b, dir, err, sizeof err), -1);
    char want[64];
    snprintf(want, sizeof want, "in use by another grpod (pid %d on host", (int)getpid());
    assert_non_null(strstr(err, want));
    journal_close(&a);
    assert_int_equal(journal_open(&b, dir, err, sizeof err), 0); /* the lock went with the first */
    journal_close(&b);
}

static void test_stale_temporary_removed(void **state)
{
    (void)state;
    char path[512], err[512], *text;
    snprintf(path, sizeof path, "%s/run.json.tmp", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"half", f);
    fclose(f);
    struct journal j;
    assert_int_equal(journal_open(&j, dir, err, sizeof err), 0);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(journal_load(&j, &text, err, sizeof err), 0);
    assert_null(text);
    journal_close(&j);
    assert_int_equal(journal_open(&j, "", err, sizeof err), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_save_load, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_grpod_per_directory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_temporary_removed, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
