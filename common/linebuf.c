#include "linebuf.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"

int linebuf_take(struct linebuf *b, char **line)
{
    char *nl = b->len ? memchr(b->buf, '\n', b->len) : NULL;
    if (!nl)
        return 0;
    free(b->line);
    const size_t n = (size_t)(nl - b->buf);
    b->line = xmalloc(n + 1);
    memcpy(b->line, b->buf, n);
    b->line[n] = '\0';
    memmove(b->buf, nl + 1, b->len - n - 1);
    b->len -= n + 1;
    *line = b->line;
    return 1;
}

int linebuf_fill(struct linebuf *b, int fd)
{
    for (;;) {
        if (b->cap - b->len < 65536) {
            b->cap = b->cap * 2 + 65536;
            b->buf = xrealloc(b->buf, b->cap);
        }
        const ssize_t k = read(fd, b->buf + b->len, b->cap - b->len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN)
            return 0;
        if (k <= 0)
            return -1;
        b->len += (size_t)k;
        return 0;
    }
}

int linebuf_read(struct linebuf *b, int fd, double deadline, char **line)
{
    for (;;) {
        if (linebuf_take(b, line))
            return 1;
        const double left = deadline - clock_now_s();
        if (left <= 0)
            return 0;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        const int ms = (int)ceil(left * 1000.0);
        const int pr = poll(&pfd, 1, ms < 1 ? 1 : ms);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return -1;
        if (pr > 0 && linebuf_fill(b, fd) != 0)
            return -1;
    }
}

void linebuf_reset(struct linebuf *b) { b->len = 0; }

void linebuf_free(struct linebuf *b)
{
    free(b->buf);
    free(b->line);
    *b = (struct linebuf){0};
}
