/* Helpers shared by the files of worker/metrics (private to that folder). */
#ifndef GRPO_WORKER_METRICS_INTERNAL_H
#define GRPO_WORKER_METRICS_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Growable string; p is always NUL-terminated once anything was added. */
struct mbuf {
    char *p;
    size_t n, cap;
};
void mbuf_reserve(struct mbuf *b, size_t extra);
void mbuf_putn(struct mbuf *b, const char *s, size_t n);
void mbuf_puts(struct mbuf *b, const char *s);
void mbuf_putc(struct mbuf *b, char c);
void mbuf_printf(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The string (never NULL); ownership passes to the caller and b is emptied. */
char *mbuf_take(struct mbuf *b);
void mbuf_free(struct mbuf *b);

/* Write len bytes to path atomically: path.tmp.PID, fsync, rename, fsync of the directory.
 * 0, or -1 (logged under subsys). */
int metrics_write_file_atomic(const char *path, const void *data, size_t len, const char *subsys);
/* malloc'd a + b. */
char *metrics_path_join(const char *dir, const char *name);

/* fflush + fsync of an open stream (NULL: -1); errors logged under subsys naming path. 0 or -1. */
int metrics_stream_sync(FILE *f, const char *path, const char *subsys);
/* fclose (NULL: nothing), logging a failed final flush. */
void metrics_stream_close(FILE *f, const char *path, const char *subsys);

#endif
