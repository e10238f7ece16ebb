/* The data plane's sockets: each trainer DP rank binds one nanomsg PULL
 * endpoint (handed out by grpod, or derived from the run when there is none);
 * each rollout rank connects one PUSH socket to every trainer endpoint. A
 * send blocks while the trainer's queue is full, so a slow trainer slows the
 * rollout instead of growing memory (bounded back-pressure). */
#ifndef GRPO_WORKER_ROLLOUT_DATAPLANE_H
#define GRPO_WORKER_ROLLOUT_DATAPLANE_H

#include <stddef.h>

struct dataplane_pull;
struct dataplane_push;

/* Bind a PULL socket at endpoint (messages over GRPO_MAX_MESSAGE_BYTES are dropped by nanomsg). NULL with err. */
struct dataplane_pull *dataplane_pull_open(const char *endpoint, char *err, size_t errlen);
/* Wait up to timeout_ms for one message: 1 with *buf (free with dataplane_msg_free) and *len, 0 on timeout,
 * -1 with err on a socket error. */
int dataplane_recv(struct dataplane_pull *p, int timeout_ms, void **buf, size_t *len, char *err, size_t errlen);
void dataplane_pull_close(struct dataplane_pull *p);

/* Connect one PUSH socket to each of the n endpoints. queue_bytes bounds what waits in each socket's send
 * buffer. NULL with err. */
struct dataplane_push *dataplane_push_open(const char *const *endpoints, int n, int queue_bytes, char *err,
                                           size_t errlen);
/* Send to endpoint i, waiting up to timeout_ms for room (back-pressure). 0, or -1 with err (timeout: the trainer
 * does not take data). */
int dataplane_send(struct dataplane_push *p, int i, const void *buf, size_t len, int timeout_ms, char *err,
                   size_t errlen);
void dataplane_push_close(struct dataplane_push *p);

void dataplane_msg_free(void *buf);

#endif
