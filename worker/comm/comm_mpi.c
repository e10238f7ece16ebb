/* MPI back-end of the collective plane: CPU buffers, used where there is no GPU. */
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "common/check_mpi.h"
#include "common/log.h"

static MPI_Datatype mpi_type(enum comm_dtype t)
{
    switch (t) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_F64: return MPI_DOUBLE;
    case COMM_I32: return MPI_INT32_T;
    case COMM_I64: return MPI_INT64_T;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Comm mc(struct comm *c) { return *(MPI_Comm *)c->impl; }

struct mpi_impl {
    MPI_Comm comm; /* first member: mc() reads it through the impl pointer */
    bool owned;
    bool alone; /* comm_fail_alone: an error ends this rank only */
};

/* An error in a collective: the whole job ends (CHECK_MPI), or, in a group marked comm_fail_alone, this rank
 * only, with a log line (the group lost a peer; the run goes on without the group). */
static void comm_check(struct comm *c, int rc, const char *file, int line, const char *expr)
{
    if (rc == MPI_SUCCESS)
        return;
    if (((struct mpi_impl *)c->impl)->alone) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
            snprintf(text, sizeof text, "MPI error %d", rc);
        log_error("comm", "%s:%d: %s: %s: this rank's group has lost a peer; ending this rank only", file, line, expr,
                  text);
        _exit(4);
    }
    check_mpi_impl(rc, file, line, expr);
}
#define CHECK_C(c, call) comm_check((c), (call), __FILE__, __LINE__, #call)

/* MPI counts are int; larger buffers would need chunking, which no caller needs yet. */
static int icount(size_t count)
{
    if (count > INT_MAX)
        check_failf(__FILE__, __LINE__, "collective of %zu elements exceeds MPI's int count", count);
    return (int)count;
}

static void mpi_allreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    CHECK_C(c, MPI_Allreduce(MPI_IN_PLACE, buf, icount(count), mpi_type(t), MPI_SUM, mc(c)));
}

static void mpi_allreduce_max(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    CHECK_C(c, MPI_Allreduce(MPI_IN_PLACE, buf, icount(count), mpi_type(t), MPI_MAX, mc(c)));
}

static void mpi_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    CHECK_C(c, MPI_Allgather(send, icount(count), mpi_type(t), recv, icount(count), mpi_type(t), mc(c)));
}

static void mpi_reduce_scatter_sum(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    CHECK_C(c, MPI_Reduce_scatter_block(send, recv, icount(count), mpi_type(t), MPI_SUM, mc(c)));
}

static void mpi_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    CHECK_C(c, MPI_Bcast(buf, icount(count), mpi_type(t), root, mc(c)));
}

/* Non-blocking broadcast, tested every millisecond; poll runs in between (a rank waiting for its peers keeps
 * answering the control plane). */
static void mpi_broadcast_polled(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root,
                                 void (*poll)(void *ud, bool done), void *ud)
{
    MPI_Request req;
    CHECK_C(c, MPI_Ibcast(buf, icount(count), mpi_type(t), root, mc(c), &req));
    bool polled = false;
    for (int done = 0;;) {
        CHECK_C(c, MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done) {
            if (polled)
                poll(ud, true);
            break;
        }
        if (poll) {
            poll(ud, false);
            polled = true;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    CHECK_C(c, MPI_Wait(&req, MPI_STATUS_IGNORE)); /* complete already: releases nothing, says so to checkers */
}

static void mpi_send(struct comm *c, const void *buf, size_t count, enum comm_dtype t, int peer)
{
    CHECK_C(c, MPI_Send(buf, icount(count), mpi_type(t), peer, 0, mc(c)));
}

static void mpi_recv(struct comm *c, void *buf, size_t count, enum comm_dtype t, int peer)
{
    CHECK_C(c, MPI_Recv(buf, icount(count), mpi_type(t), peer, 0, mc(c), MPI_STATUS_IGNORE));
}

static void mpi_sendrecv(struct comm *c, const void *send, size_t sc, int dest, void *recv, size_t rc, int src,
                         enum comm_dtype t)
{
    CHECK_C(c, MPI_Sendrecv(send, icount(sc), mpi_type(t), dest, 0, recv, icount(rc), mpi_type(t), src, 0, mc(c),
                            MPI_STATUS_IGNORE));
}

static void mpi_barrier(struct comm *c) { CHECK_C(c, MPI_Barrier(mc(c))); }

static struct comm *mpi_wrap(MPI_Comm m, bool owned);

static struct comm *mpi_split(struct comm *parent, int color, int key)
{
    MPI_Comm m;
    CHECK_MPI(MPI_Comm_split(mc(parent), color, key, &m));
    return mpi_wrap(m, true);
}

static void mpi_fail_alone(struct comm *c)
{
    ((struct mpi_impl *)c->impl)->alone = true;
    CHECK_MPI(MPI_Comm_set_errhandler(mc(c), MPI_ERRORS_RETURN));
}

static void mpi_destroy(struct comm *c)
{
    struct mpi_impl *impl = c->impl;
    if (impl->owned)
        MPI_Comm_free(&impl->comm);
    free(impl);
    free(c);
}

static const struct comm_backend mpi_backend = {
    .name = "mpi",
    .allreduce_sum = mpi_allreduce_sum,
    .allreduce_max = mpi_allreduce_max,
    .allgather = mpi_allgather,
    .reduce_scatter_sum = mpi_reduce_scatter_sum,
    .broadcast = mpi_broadcast,
    .broadcast_polled = mpi_broadcast_polled,
    .send = mpi_send,
    .recv = mpi_recv,
    .sendrecv = mpi_sendrecv,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .fail_alone = mpi_fail_alone,
    .destroy = mpi_destroy,
};

static struct comm *mpi_wrap(MPI_Comm m, bool owned)
{
    struct comm *c = xcalloc(1, sizeof *c);
    struct mpi_impl *impl = xcalloc(1, sizeof *impl);
    impl->comm = m;
    impl->owned = owned;
    c->be = &mpi_backend;
    c->impl = impl;
    CHECK_MPI(MPI_Comm_rank(m, &c->rank));
    CHECK_MPI(MPI_Comm_size(m, &c->size));
    return c;
}

struct comm *comm_mpi_world(void) { return mpi_wrap(MPI_COMM_WORLD, false); }

/* The NCCL back-end needs the MPI communicator under a comm to share its unique id. */
MPI_Comm comm_mpi_handle(struct comm *c);
MPI_Comm comm_mpi_handle(struct comm *c) { return mc(c); }
