#include "comm.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config_key_names.h"
#include "common/log.h"
#include "worker/flight/flight.h"

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

double comm_ring_bytes(enum comm_op op, double bytes, int n, bool root)
{
    if (n <= 1)
        return 0;
    switch (op) {
    case COMM_OP_ALLREDUCE: return 2.0 * (n - 1) / n * bytes;
    case COMM_OP_ALLGATHER:
    case COMM_OP_REDUCE_SCATTER: return (double)(n - 1) / n * bytes; /* of the whole (gathered or scattered) buffer */
    case COMM_OP_BROADCAST: return root ? bytes : 0;
    case COMM_OP_SEND: return bytes;
    case COMM_OP_ALLTOALL: return (double)(n - 1) / n * bytes; /* equal blocks: all but this rank's own */
    case COMM_OPS: break;
    }
    return 0;
}

/* Count one call: `whole` bytes of the whole buffer the ring model divides. */
static void tally(struct comm *c, enum comm_op op, double payload, double whole, enum comm_dtype t, bool root)
{
    struct comm_traffic *tr = &c->traffic;
    c->completed++;
    tr->calls[op]++;
    tr->payload[op] += payload;
    double sent = op == COMM_OP_SEND ? payload : comm_ring_bytes(op, whole, c->size, root);
    if (t == COMM_F32)
        tr->sent_f32[op] += sent;
    else
        tr->sent_other[op] += sent;
}

/* comm_wait_seconds: the blocking calls below add their time (the collective plane is driven from one thread) */
static double g_wait_s;
double comm_wait_seconds(void) { return g_wait_s; }
/* comm_test_freeze's end: this rank, inside operation op #seq of c, for ever */
static void frozen(const struct comm *c, enum flight_op op, uint64_t seq) __attribute__((noreturn));
static void frozen(const struct comm *c, enum flight_op op, uint64_t seq)
{
    log_warn("comm", KEY_test_block_at ": this rank freezes for ever inside %s #%llu of %s (ranks %s)",
             flight_op_name(op), (unsigned long long)seq, c->name, c->members);
    for (;;)
        clock_sleep_s(3600);
}

/* expr, a wait of c: its time counted (comm_wait_seconds) and recorded by the flight recorder as operation op, the
 * group's operation number seq, bytes of this rank's buffer and peer (-1: none), with the same two clock reads */
#define WAITED(c, op, seq, bytes, peer, expr)                                                                          \
    do {                                                                                                               \
        const double t0_ = clock_now_s();                                                                              \
        const uint64_t seq_ = (seq); /* once: callers pass ++c->coll_seq */                                            \
        const int tok_ = flight_begin((op), (c)->flight_group, seq_, (uint64_t)(bytes), (peer), t0_);                  \
        if ((c)->test_freeze)                                                                                          \
            frozen((c), (op), seq_);                                                                                   \
        expr;                                                                                                          \
        const double t1_ = clock_now_s();                                                                              \
        g_wait_s += t1_ - t0_;                                                                                         \
        flight_end(tok_, t1_, false);                                                                                  \
    } while (0)

void comm_set_name(struct comm *c, const char *name)
{
    snprintf(c->name, sizeof c->name, "%s", name && name[0] ? name : "group");
    c->members[0] = 0;
    if (c->be->world_ranks && c->size > 0) {
        int *r = xcalloc((size_t)c->size, sizeof *r);
        c->be->world_ranks(c, r);
        flight_ranks_text(r, c->size, c->members, sizeof c->members);
        free(r);
    }
    c->flight_group = flight_group(c->name, c->members, c->size);
    if (c->be->set_name)
        c->be->set_name(c, c->name);
}

const char *comm_name(const struct comm *c) { return c->name; }
const char *comm_members(const struct comm *c) { return c->members; }

void comm_traffic(const struct comm *c, struct comm_traffic *out) { *out = c->traffic; }
unsigned long long comm_progress(const struct comm *c) { return c->completed; }
void comm_traffic_reset(struct comm *c) { memset(&c->traffic, 0, sizeof c->traffic); }

int comm_rank(const struct comm *c) { return c->rank; }
int comm_size(const struct comm *c) { return c->size; }
const char *comm_backend_name(const struct comm *c) { return c->be->name; }
const struct comm_caps *comm_caps(const struct comm *c) { return &c->be->caps; }

static void (*test_hold)(const char *point);

struct comm_req *comm_iallreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t, void *after_stream)
{
    if (test_hold) /* tests: a rank to be killed before its part of the sum is started, its peers waiting on it */
        test_hold("allreduce-start");
    struct comm_req *r;
    const uint64_t seq = ++c->coll_seq;
    if (c->be->iallreduce_sum) {
        r = c->be->iallreduce_sum(c, buf, count, t, after_stream);
    } else {
        WAITED(c, FLIGHT_OP_ALLREDUCE, seq, count * comm_dtype_size(t), -1, c->be->allreduce_sum(c, buf, count, t));
        r = xcalloc(1, sizeof *r);
    }
    r->c = c, r->count = count, r->t = t, r->seq = seq;
    return r;
}

void comm_test(struct comm_req *r)
{
    if (r->c->be->test)
        r->c->be->test(r);
}

void comm_set_test_hold(void (*hold)(const char *point)) { test_hold = hold; }

void comm_test_freeze(struct comm *c) { c->test_freeze = true; }

void comm_test_hold(const char *point)
{
    if (test_hold)
        test_hold(point);
}

void comm_wait(struct comm_req *r)
{
    if (test_hold) /* tests: a rank to be killed with its all-reduces started, its peers waiting on them */
        test_hold("allreduce");
    struct comm *c = r->c;
    const double b = (double)r->count * comm_dtype_size(r->t);
    const enum comm_dtype t = r->t;
    if (c->be->wait)
        WAITED(c, FLIGHT_OP_ALLREDUCE_BUCKET, r->seq, b, -1, c->be->wait(r));
    else
        free(r);
    tally(c, COMM_OP_ALLREDUCE, b, b, t, false);
}

struct comm *comm_split(struct comm *parent, int color, int key)
{
    struct comm *c = parent->be->split(parent, color, key);
    if (c) {
        c->deadline_s = parent->deadline_s; /* a sub-group waits no longer than its parent */
        comm_set_name(c, "split");
    }
    return c;
}

struct comm *comm_split_node(struct comm *parent, int key)
{
    struct comm *c = parent->be->split_node(parent, key);
    if (c) {
        c->deadline_s = parent->deadline_s; /* as comm_split */
        comm_set_name(c, "node");
    }
    return c;
}

void comm_set_deadline(struct comm *c, double seconds)
{
    c->deadline_s = seconds > 0 ? seconds : 0;
    if (c->be->set_deadline)
        c->be->set_deadline(c, c->deadline_s);
}

void comm_fail_alone(struct comm *c)
{
    if (c->be->fail_alone)
        c->be->fail_alone(c);
}

void comm_free(struct comm *c)
{
    if (c)
        c->be->destroy(c);
}

void comm_allreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    if (!count)
        return;
    WAITED(c, FLIGHT_OP_ALLREDUCE, ++c->coll_seq, count * comm_dtype_size(t), -1,
           c->be->allreduce_sum(c, buf, count, t));
    const double b = (double)count * comm_dtype_size(t);
    tally(c, COMM_OP_ALLREDUCE, b, b, t, false);
}

void comm_allreduce_max(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    if (!count)
        return;
    WAITED(c, FLIGHT_OP_ALLREDUCE_MAX, ++c->coll_seq, count * comm_dtype_size(t), -1,
           c->be->allreduce_max(c, buf, count, t));
    const double b = (double)count * comm_dtype_size(t);
    tally(c, COMM_OP_ALLREDUCE, b, b, t, false);
}

void comm_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (!count)
        return;
    WAITED(c, FLIGHT_OP_ALLGATHER, ++c->coll_seq, count * comm_dtype_size(t), -1,
           c->be->allgather(c, send, recv, count, t));
    const double b = (double)count * comm_dtype_size(t);
    tally(c, COMM_OP_ALLGATHER, b, b * c->size, t, false);
}

void comm_allgather_bytes(struct comm *c, const void *send, void *recv, size_t bytes)
{
    if (!bytes)
        return;
    WAITED(c, FLIGHT_OP_ALLGATHER, ++c->coll_seq, bytes, -1, c->be->allgather_bytes(c, send, recv, bytes));
    const double b = (double)bytes;
    tally(c, COMM_OP_ALLGATHER, b, b * c->size, COMM_I32, false); /* counted with the buffers that are not float32 */
}

void comm_reduce_scatter_sum(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (!count)
        return;
    WAITED(c, FLIGHT_OP_REDUCE_SCATTER, ++c->coll_seq, count * comm_dtype_size(t) * (size_t)c->size, -1,
           c->be->reduce_scatter_sum(c, send, recv, count, t));
    const double b = (double)count * comm_dtype_size(t);
    tally(c, COMM_OP_REDUCE_SCATTER, b * c->size, b * c->size, t, false);
}

void comm_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    if (!count)
        return;
    WAITED(c, FLIGHT_OP_BROADCAST, ++c->coll_seq, count * comm_dtype_size(t), root,
           c->be->broadcast(c, buf, count, t, root));
    const double b = (double)count * comm_dtype_size(t);
    tally(c, COMM_OP_BROADCAST, b, b, t, c->rank == root);
}

void comm_broadcast_polled(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root,
                           void (*poll)(void *ud, bool done), void *ud)
{
    if (!count)
        return;
    const uint64_t seq = ++c->coll_seq;
    const size_t bytes = count * comm_dtype_size(t);
    if (c->be->broadcast_polled) /* always: MPI matches a non-blocking broadcast only with another */
        WAITED(c, FLIGHT_OP_BROADCAST, seq, bytes, root, c->be->broadcast_polled(c, buf, count, t, root, poll, ud));
    else
        WAITED(c, FLIGHT_OP_BROADCAST, seq, bytes, root, c->be->broadcast(c, buf, count, t, root));
    const double b = (double)count * comm_dtype_size(t);
    tally(c, COMM_OP_BROADCAST, b, b, t, c->rank == root);
}

void comm_give_up(struct comm *c) { c->given_up = true; }

int comm_try_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    if (c->given_up)
        return -1;
    if (!count)
        return 0;
    const int tok = flight_begin(FLIGHT_OP_BROADCAST, c->flight_group, ++c->coll_seq, count * comm_dtype_size(t), root,
                                 clock_now_s());
    if (!c->be->try_broadcast) {
        c->be->broadcast(c, buf, count, t, root);
    } else if (c->be->try_broadcast(c, buf, count, t, root) != 0) {
        c->given_up = true;
        flight_end(tok, clock_now_s(), true);
        return -1;
    }
    flight_end(tok, clock_now_s(), false);
    const double b = (double)count * comm_dtype_size(t);
    tally(c, COMM_OP_BROADCAST, b, b, t, c->rank == root);
    return 0;
}

void comm_send(struct comm *c, const void *buf, size_t count, enum comm_dtype t, int peer)
{
    const double t0 = clock_now_s();
    const int tok = flight_begin(FLIGHT_OP_SEND, c->flight_group, ++c->p2p_seq, count * comm_dtype_size(t), peer, t0);
    c->be->send(c, buf, count, t, peer); /* not counted as a wait: a send returns once its data is on its way */
    flight_end(tok, clock_now_s(), false);
    tally(c, COMM_OP_SEND, (double)count * comm_dtype_size(t), 0, t, false);
}

void comm_recv(struct comm *c, void *buf, size_t count, enum comm_dtype t, int peer)
{
    WAITED(c, FLIGHT_OP_RECV, ++c->p2p_seq, count * comm_dtype_size(t), peer, c->be->recv(c, buf, count, t, peer));
    c->completed++;
}

void comm_sendrecv(struct comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                   int src, enum comm_dtype t)
{
    WAITED(c, FLIGHT_OP_SENDRECV, ++c->p2p_seq, (send_count + recv_count) * comm_dtype_size(t), dest,
           c->be->sendrecv(c, send, send_count, dest, recv, recv_count, src, t));
    tally(c, COMM_OP_SEND, (double)send_count * comm_dtype_size(t), 0, t, false);
}

void comm_alltoallv(struct comm *c, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                    enum comm_dtype t)
{
    size_t all = 0;
    for (int p = 0; p < c->size; p++)
        all += send_counts[p];
    WAITED(c, FLIGHT_OP_ALLTOALL, ++c->coll_seq, all * comm_dtype_size(t), -1,
           c->be->alltoallv(c, send, send_counts, recv, recv_counts, t));
    const double es = (double)comm_dtype_size(t), payload = (double)all * es;
    struct comm_traffic *tr = &c->traffic;
    c->completed++;
    tr->calls[COMM_OP_ALLTOALL]++;
    tr->payload[COMM_OP_ALLTOALL] += payload;
    const double sent = payload - (double)send_counts[c->rank] * es;
    if (t == COMM_F32)
        tr->sent_f32[COMM_OP_ALLTOALL] += sent;
    else
        tr->sent_other[COMM_OP_ALLTOALL] += sent;
}

void comm_barrier(struct comm *c) { WAITED(c, FLIGHT_OP_BARRIER, ++c->coll_seq, 0, -1, c->be->barrier(c)); }

void comm_barrier_polled(struct comm *c, void (*poll)(void *ud, bool done), void *ud)
{
    const uint64_t seq = ++c->coll_seq;
    if (c->be->barrier_polled)
        WAITED(c, FLIGHT_OP_BARRIER, seq, 0, -1, c->be->barrier_polled(c, poll, ud));
    else
        WAITED(c, FLIGHT_OP_BARRIER, seq, 0, -1, c->be->barrier(c));
}

struct comm *comm_device_group(struct comm *mpi_comm, int device)
{
    const struct comm_device_backend *b = comm_device_backends[0];
    struct comm *c = b ? b->from(mpi_comm, device) : NULL;
    if (c)
        comm_set_name(c, mpi_comm->name); /* its MPI group's name: the same ranks, for the same purpose */
    return c;
}

struct comm_table *comm_table_create(struct comm *c, size_t n)
{
    return c->be->table_create ? c->be->table_create(c, n) : NULL;
}

void comm_table_update(struct comm_table *t, int64_t *v, void (*fn)(void *ud, int64_t *v), void *ud)
{
    const struct comm *c = *(struct comm **)t; /* every back-end's table starts with its comm */
    WAITED(c, FLIGHT_OP_TABLE_UPDATE, 0, 0, 0, c->be->table_update(t, v, fn, ud));
}

void comm_table_free(struct comm_table *t)
{
    if (t)
        (*(struct comm **)t)->be->table_free(t);
}

struct comm_shared *comm_shared_create(struct comm *c, size_t bytes)
{
    return c->be->shared_create ? c->be->shared_create(c, bytes) : NULL;
}

void *comm_shared_base(const struct comm_shared *s) { return ((const struct comm_shared_head *)s)->base; }

void comm_shared_free(struct comm_shared *s)
{
    if (s)
        ((struct comm_shared_head *)s)->c->be->shared_free(s);
}
