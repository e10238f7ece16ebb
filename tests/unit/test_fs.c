/* common/fs: the one durable atomic write. Its content lands and replaces the old one whole, the temporary
 * file is gone afterwards, the old file stays until the rename, and a failure (no such directory, a file where
 * the directory should be, a writer that fails half-way, a directory where the file should be) returns an
 * error naming the path and leaves the old content and no temporary file behind. */
#include <dirent.h>
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

#include "common/fs.h"

static char dir[] = "/tmp/grpo_fs_XXXXXX";

static int setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/grpo_fs_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return test_rm_rf(dir);
}

/* How many entries dir holds besides . and .. */
static int entries(const char *d)
{
    DIR *dp = opendir(d);
    assert_non_null(dp);
    int n = 0;
    for (struct dirent *e; (e = readdir(dp));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(dp);
    return n;
}

static void assert_file(const char *path, const char *want)
{
    char *got = test_read_file(path, NULL);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_content_lands_and_replaces(void **state)
{
    (void)state;
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/state.json", dir);
    assert_int_equal(fs_write_atomic(path, "first", 5, err, sizeof err), 0);
    assert_file(path, "first");
    assert_int_equal(fs_write_atomic(path, "the second, longer", 18, err, sizeof err), 0);
    assert_file(path, "the second, longer");
    assert_int_equal(fs_write_atomic(path, "", 0, err, sizeof err), 0); /* an empty file is a file */
    assert_file(path, "");
    assert_int_equal(entries(dir), 1); /* no temporary file left */
}

/* A writer that checks, half-way, that the old file is still whole and the new bytes go to PATH.tmp. */
struct probe {
    const char *path;
    int saw_tmp, saw_old;
};

static int probing_writer(FILE *f, void *ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    struct probe *p = ctx;
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", p->path);
    p->saw_tmp = access(tmp, F_OK) == 0;
    char *old = test_read_file(p->path, NULL);
    p->saw_old = old && strcmp(old, "old") == 0;
    free(old);
    return fputs("new", f) < 0 ? -1 : 0;
}

static void test_old_file_stays_until_rename(void **state)
{
    (void)state;
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/run.json", dir);
    assert_int_equal(fs_write_atomic(path, "old", 3, err, sizeof err), 0);
    struct probe p = {path, 0, 0};
    umask(022);
    assert_int_equal(fs_write_atomic_with(path, 0640, probing_writer, &p, err, sizeof err), 0);
    assert_true(p.saw_tmp);
    assert_true(p.saw_old);
    assert_file(path, "new");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640);
    assert_int_equal(entries(dir), 1);
}

static void test_missing_directory_names_path(void **state)
{
    (void)state;
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/no/such/dir/config.json", dir);
    assert_int_equal(fs_write_atomic(path, "x", 1, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "cannot create"));
    /* a regular file where a directory should be */
    char file[600];
    snprintf(file, sizeof file, "%s/plainfile", dir);
    assert_int_equal(fs_write_atomic(file, "x", 1, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/plainfile/config.json", dir);
    err[0] = '\0';
    assert_int_equal(fs_write_atomic(path, "x", 1, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_int_equal(entries(dir), 1);
    /* a NULL error buffer is allowed */
    assert_int_equal(fs_write_atomic(path, "x", 1, NULL, 0), -1);
}

/* Writes part of the content, then fails: with its own message when told to, else with errno's. */
static int failing_writer(FILE *f, void *ctx, char *err, size_t errlen)
{
    fputs("partial", f);
    if (ctx)
        snprintf(err, errlen, "%s", (const char *)ctx);
    return -1;
}

static void test_failed_writer_leaves_old_file(void **state)
{
    (void)state;
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(fs_write_atomic(path, "complete", 8, err, sizeof err), 0);
    assert_int_equal(fs_write_atomic_with(path, 0644, failing_writer, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "failed"));
    assert_int_equal(fs_write_atomic_with(path, 0644, failing_writer, "the encoder gave up", err, sizeof err), -1);
    assert_string_equal(err, "the encoder gave up");
    assert_file(path, "complete");
    assert_int_equal(entries(dir), 1); /* no partial temporary file */
    /* a failure with no file there before leaves no file at all */
    snprintf(path, sizeof path, "%s/new.bin", dir);
    assert_int_equal(fs_write_atomic_with(path, 0644, failing_writer, NULL, err, sizeof err), -1);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(entries(dir), 1);
}

static void test_rename_failure_cleans_up(void **state)
{
    (void)state;
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(mkdir(path, 0755), 0); /* a directory cannot be replaced by a file */
    assert_int_equal(fs_write_atomic(path, "data", 4, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "cannot rename"));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(entries(dir), 1);
}

static void test_fsync_dir_of(void **state)
{
    (void)state;
    char path[600], err[1024] = "";
    snprintf(path, sizeof path, "%s/x", dir);
    assert_int_equal(fs_fsync_dir_of(path, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/gone/x", dir);
    assert_int_equal(fs_fsync_dir_of(path, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
}

/* d/name as a file holding text, or as a directory (name ending in '/'). */
static void make(const char *d, const char *name, const char *text)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", d, name);
    size_t n = strlen(path);
    if (path[n - 1] == '/') {
        path[n - 1] = '\0';
        assert_int_equal(mkdir(path, 0755), 0);
        return;
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* fs_remove_tree runs no shell: names made to break one (quotes, $(), backticks, newlines, leading dashes, dots)
 * are removed like any other and nothing they spell runs; a symbolic link to a directory outside the tree is
 * removed and what it points at stays; a path that does not exist is done; "/" "." and ".." ends are refused. */
static void test_remove_tree_hostile_names(void **state)
{
    (void)state;
    char victim[600], tree[600], err[2048] = "", cwd[4096];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    make(dir, "victim/", "");
    make(dir, "victim/keep.txt", "precious");
    /* the tree, named as a hostile run would be */
    snprintf(tree, sizeof tree, "%s/e'$(touch INJECTED)' victim '`touch INJECTED2`", dir);
    assert_int_equal(mkdir(tree, 0755), 0);
    const char *names[] = {"O'Brien runs/",
                           "O'Brien runs/global_step_1/",
                           "O'Brien runs/global_step_1/a b\nc",
                           "-rf",
                           "--",
                           "..x",
                           "...",
                           "$(touch INJECTED3)",
                           "x;touch INJECTED4",
                           "\"",
                           "line\nbreak/",
                           "line\nbreak/'",
                           NULL};
    for (int i = 0; names[i]; i++)
        make(tree, names[i], "x");
    char link[1200];
    snprintf(link, sizeof link, "%s/to-victim", tree); /* a link out of the tree */
    assert_int_equal(symlink(victim, link), 0);
    snprintf(link, sizeof link, "%s/line\nbreak/up", tree);
    assert_int_equal(symlink("../../victim", link), 0);
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(dir), 0); /* where a shell would have touched INJECTED* */
    int rc = fs_remove_tree(tree, err, sizeof err);
    assert_int_equal(chdir(cwd), 0);
    if (rc != 0)
        fail_msg("%s", err);
    struct stat st;
    assert_int_not_equal(lstat(tree, &st), 0);
    char keep[700];
    snprintf(keep, sizeof keep, "%s/keep.txt", victim);
    assert_file(keep, "precious");
    assert_int_equal(entries(dir), 1); /* victim alone: no INJECTED* was made */
    /* done already; and ends that name no entry are refused with the path */
    assert_int_equal(fs_remove_tree(tree, err, sizeof err), 0);
    char bad[700];
    snprintf(bad, sizeof bad, "%s/victim/..", dir);
    assert_int_equal(fs_remove_tree(bad, err, sizeof err), -1);
    assert_non_null(strstr(err, bad));
    assert_file(keep, "precious");
}

/* A link given as the tree itself is removed, not followed. */
static void test_remove_tree_link_root(void **state)
{
    (void)state;
    char target[600], link[600], err[1024] = "";
    snprintf(target, sizeof target, "%s/target", dir);
    make(dir, "target/", "");
    make(dir, "target/f", "kept");
    snprintf(link, sizeof link, "%s/link", dir);
    assert_int_equal(symlink(target, link), 0);
    assert_int_equal(fs_remove_tree(link, err, sizeof err), 0);
    char f[700];
    snprintf(f, sizeof f, "%s/f", target);
    assert_file(f, "kept");
    assert_int_equal(entries(dir), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_content_lands_and_replaces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_old_file_stays_until_rename, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_directory_names_path, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_writer_leaves_old_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rename_failure_cleans_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fsync_dir_of, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_tree_hostile_names, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove_tree_link_root, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
