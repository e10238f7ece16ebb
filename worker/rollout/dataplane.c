#include "dataplane.h"

#include <errno.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/check.h"
#include "proto/protocol.h"

struct dataplane_pull {
    int sock;
};

struct dataplane_push {
    int n;
    int *socks;
};

struct dataplane_pull *dataplane_pull_open(const char *endpoint, char *err, size_t errlen)
{
    int s = nn_socket(AF_SP, NN_PULL);
    if (s < 0) {
        error_set(err, errlen, "data plane: nn_socket(PULL): %s", nn_strerror(nn_errno()));
        return NULL;
    }
    int max = (int)GRPO_MAX_MESSAGE_BYTES;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof max);
    if (nn_bind(s, endpoint) < 0) {
        error_set(err, errlen, "data plane: cannot bind %s: %s", endpoint, nn_strerror(nn_errno()));
        nn_close(s);
        return NULL;
    }
    /* an ipc socket is for this user's ranks only (a tcp one checks the run's secret in every batch) */
    if (strncmp(endpoint, "ipc://", 6) == 0)
        chmod(endpoint + 6, 0600);
    struct dataplane_pull *p = xcalloc(1, sizeof *p);
    p->sock = s;
    return p;
}

int dataplane_recv(struct dataplane_pull *p, int timeout_ms, void **buf, size_t *len, char *err, size_t errlen)
{
    nn_setsockopt(p->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    void *msg = NULL;
    int n = nn_recv(p->sock, &msg, NN_MSG, 0);
    if (n < 0) {
        int e = nn_errno();
        if (e == ETIMEDOUT || e == EAGAIN || e == EINTR)
            return 0;
        error_set(err, errlen, "data plane: receive failed: %s", nn_strerror(e));
        return -1;
    }
    *buf = msg;
    *len = (size_t)n;
    return 1;
}

void dataplane_pull_close(struct dataplane_pull *p)
{
    if (!p)
        return;
    nn_close(p->sock);
    free(p);
}

struct dataplane_push *dataplane_push_open(const char *const *endpoints, int n, int queue_bytes, char *err,
                                           size_t errlen)
{
    struct dataplane_push *p = xcalloc(1, sizeof *p);
    p->socks = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) {
        int s = nn_socket(AF_SP, NN_PUSH);
        if (s < 0) {
            error_set(err, errlen, "data plane: nn_socket(PUSH): %s", nn_strerror(nn_errno()));
            dataplane_push_close(p);
            return NULL;
        }
        nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDBUF, &queue_bytes, sizeof queue_bytes);
        int linger = 5000; /* let queued batches reach the trainer when this rank ends */
        nn_setsockopt(s, NN_SOL_SOCKET, NN_LINGER, &linger, sizeof linger);
        p->socks[p->n++] = s;
        if (nn_connect(s, endpoints[i]) < 0) {
            error_set(err, errlen, "data plane: cannot connect to %s: %s", endpoints[i], nn_strerror(nn_errno()));
            dataplane_push_close(p);
            return NULL;
        }
    }
    return p;
}

int dataplane_send(struct dataplane_push *p, int i, const void *buf, size_t len, int timeout_ms, char *err,
                   size_t errlen)
{
    nn_setsockopt(p->socks[i], NN_SOL_SOCKET, NN_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
    int n;
    do
        n = nn_send(p->socks[i], buf, len, 0);
    while (n < 0 && nn_errno() == EINTR);
    if (n < 0) {
        int e = nn_errno();
        error_set(err, errlen, "data plane: sending %zu bytes to trainer DP rank %d: %s", len, i,
                  e == ETIMEDOUT ? "timed out (the trainer takes no data)" : nn_strerror(e));
        return -1;
    }
    return 0;
}

void dataplane_push_close(struct dataplane_push *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        nn_close(p->socks[i]);
    free(p->socks);
    free(p);
}

void dataplane_msg_free(void *buf)
{
    if (buf)
        nn_freemsg(buf);
}
