/* Check macros for calls that must not fail: each reports the call, the file
 * and line, and a reason, then ends the program through the fatal hook (plain
 * exit(1) by default; MPI programs install one that calls MPI_Abort so every
 * rank stops instead of hanging in a collective).
 *
 *   FILE *f = CHECK_FOPEN(path, "rb");
 *   float *x = CHECK_ALLOC(malloc(n * sizeof *x));
 *   CHECK_MPI(MPI_Allreduce(...));          (check_mpi.h)
 *   CHECK_CUDA(cudaMalloc(&p, bytes));      (check_cuda.h)
 *   CHECK_NCCL(ncclAllReduce(...));         (check_cuda.h)
 */
#ifndef GRPO_COMMON_CHECK_H
#define GRPO_COMMON_CHECK_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*check_fatal_hook)(int exit_code);

/* Install the function that ends the program after a failed check. */
void check_set_fatal_hook(check_fatal_hook hook);
/* Report "what failed at file:line: reason" and end the program. */
_Noreturn void check_fail(const char *file, int line, const char *what, const char *reason);
/* printf-style variant of check_fail for callers that build their own reason. */
_Noreturn void check_failf(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void *check_alloc_impl(void *p, const char *file, int line, const char *expr);
FILE *check_fopen_impl(const char *path, const char *mode, const char *file, int line);
void check_fclose_impl(FILE *f, const char *path, const char *file, int line);

/* Abort with file and line when an allocation returned NULL. */
#define CHECK_ALLOC(expr) check_alloc_impl((expr), __FILE__, __LINE__, #expr)
/* fopen() that names the path and errno's text when it fails. */
#define CHECK_FOPEN(path, mode) check_fopen_impl((path), (mode), __FILE__, __LINE__)
/* fclose() that catches a failed final flush (a full disk loses data silently otherwise). */
#define CHECK_FCLOSE(f, path) check_fclose_impl((f), (path), __FILE__, __LINE__)
/* Abort when a POSIX-style call returns a negative value; errno gives the reason. */
#define CHECK_ERRNO(expr)                                                                                              \
    do {                                                                                                               \
        if ((expr) < 0)                                                                                                \
            check_fail(__FILE__, __LINE__, #expr, check_errno_text());                                                 \
    } while (0)

/* Format an error message into err (errlen bytes) and return -1, so failure paths read
 * `return error_set(err, errlen, "%s: ...", path)`. */
int error_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* strerror(errno), kept thread-safe. */
const char *check_errno_text(void);

/* Allocation helpers that never return NULL; a failure names the caller's file and line. */
#define xmalloc(n) check_alloc_impl(malloc(n), __FILE__, __LINE__, "malloc")
#define xcalloc(count, size) check_alloc_impl(calloc((count), (size)), __FILE__, __LINE__, "calloc")
#define xrealloc(p, n) check_alloc_impl(realloc((p), (n)), __FILE__, __LINE__, "realloc")
#define xstrdup(s) ((char *)check_alloc_impl(strdup(s), __FILE__, __LINE__, "strdup"))
#define xstrndup(s, n) ((char *)check_alloc_impl(strndup((s), (n)), __FILE__, __LINE__, "strndup"))

#endif
