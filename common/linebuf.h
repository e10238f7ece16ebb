/* Lines from a child process's pipe or socket, read as they come, with a deadline: the one reader of the Python
 * helpers' JSON-lines protocols (the reward scorers' pool, the chat-template renderer). */
#ifndef GRPO_COMMON_LINEBUF_H
#define GRPO_COMMON_LINEBUF_H

#include <stddef.h>

struct linebuf {
    char *buf;  /* bytes read and not yet taken as lines */
    char *line; /* the line handed out last */
    size_t len, cap;
};

/* A whole line already read: 1 with *line (valid until the next call), else 0. */
int linebuf_take(struct linebuf *b, char **line);
/* Read what fd holds now (poll said it is readable): 0, or -1 when the writer is gone (end of file, an error). */
int linebuf_fill(struct linebuf *b, int fd);
/* The next line from fd by deadline (clock_now_s): 1 with *line, 0 on the deadline, -1 when the writer is gone. */
int linebuf_read(struct linebuf *b, int fd, double deadline, char **line);
/* Forget what was read (a new child). */
void linebuf_reset(struct linebuf *b);
void linebuf_free(struct linebuf *b);

#endif
