#include "comm.h"

#include <stdint.h>

size_t comm_dtype_size(enum comm_dtype t)
{
    switch (t) {
    case COMM_F32: return sizeof(float);
    case COMM_F64: return sizeof(double);
    case COMM_I32: return sizeof(int32_t);
    case COMM_I64: return sizeof(int64_t);
    }
    return 0;
}

int comm_rank(const struct comm *c) { return c->rank; }
int comm_size(const struct comm *c) { return c->size; }
const char *comm_backend_name(const struct comm *c) { return c->be->name; }

struct comm *comm_split(struct comm *parent, int color, int key) { return parent->be->split(parent, color, key); }

void comm_free(struct comm *c)
{
    if (c)
        c->be->destroy(c);
}

void comm_allreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    if (count)
        c->be->allreduce_sum(c, buf, count, t);
}

void comm_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (count)
        c->be->allgather(c, send, recv, count, t);
}

void comm_reduce_scatter_sum(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (count)
        c->be->reduce_scatter_sum(c, send, recv, count, t);
}

void comm_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    if (count)
        c->be->broadcast(c, buf, count, t, root);
}

void comm_broadcast_polled(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root,
                           void (*poll)(void *ud, bool done), void *ud)
{
    if (!count)
        return;
    if (c->be->broadcast_polled) /* always: MPI matches a non-blocking broadcast only with another */
        c->be->broadcast_polled(c, buf, count, t, root, poll, ud);
    else
        c->be->broadcast(c, buf, count, t, root);
}

void comm_send(struct comm *c, const void *buf, size_t count, enum comm_dtype t, int peer)
{
    c->be->send(c, buf, count, t, peer);
}

void comm_recv(struct comm *c, void *buf, size_t count, enum comm_dtype t, int peer)
{
    c->be->recv(c, buf, count, t, peer);
}

void comm_barrier(struct comm *c) { c->be->barrier(c); }
