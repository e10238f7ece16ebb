/* Run a function in a forked child with its stderr captured (for tests of fatal errors and log lines). Include
 * after <cmocka.h>. */
#ifndef GRPO_TESTS_UNIT_CAPTURE_H
#define GRPO_TESTS_UNIT_CAPTURE_H

#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

/* fn() in a child, its stderr into out (NUL-terminated); returns its exit status (128: killed). */
static inline int capture(void (*fn)(void), char *out, size_t outlen)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], STDERR_FILENO);
        close(p[0]);
        fn();
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
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#endif
