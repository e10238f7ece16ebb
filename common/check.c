#include "check.h"

#include <errno.h>
#include <stdarg.h>

#include "log.h"

static check_fatal_hook g_fatal_hook;

void check_set_fatal_hook(check_fatal_hook hook) { g_fatal_hook = hook; }

static _Noreturn void check_exit(int code)
{
    if (g_fatal_hook)
        g_fatal_hook(code);
    exit(code);
}

void check_fail(const char *file, int line, const char *what, const char *reason)
{
    log_error("fatal", "%s failed at %s:%d: %s", what, file, line, reason ? reason : "unknown error");
    check_exit(1);
}

void check_failf(const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_error("fatal", "%s (at %s:%d)", msg, file, line);
    check_exit(1);
}

int error_set(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

const char *check_errno_text(void)
{
    static _Thread_local char buf[256];
    int err = errno;
    /* GNU strerror_r may return a static string instead of filling buf */
    const char *s = strerror_r(err, buf, sizeof buf);
    return s ? s : "unknown error";
}

void *check_alloc_impl(void *p, const char *file, int line, const char *expr)
{
    if (!p)
        check_fail(file, line, expr, "out of memory");
    return p;
}

FILE *check_fopen_impl(const char *path, const char *mode, const char *file, int line)
{
    FILE *f = fopen(path, mode);
    if (!f) {
        char what[512];
        snprintf(what, sizeof what, "opening '%s' (mode %s)", path, mode);
        check_fail(file, line, what, check_errno_text());
    }
    return f;
}

void check_fclose_impl(FILE *f, const char *path, const char *file, int line)
{
    if (fclose(f) != 0) {
        char what[512];
        snprintf(what, sizeof what, "closing '%s'", path);
        check_fail(file, line, what, check_errno_text());
    }
}
