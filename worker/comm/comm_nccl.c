/* NCCL back-end of the collective plane: device buffers, one CUDA stream per
 * communicator; every call waits for its stream so callers see blocking
 * semantics like the MPI back-end. Built only with CUDA.
 *
 * A group of a GPU run carries both the tensors (device memory: NCCL) and small host values (loss statistics,
 * token counts, the LM head's per-token softmax statistics): a host buffer goes through the group's MPI twin, so
 * callers use one group for both. Before a collective on device memory the device is synchronised, so kernels
 * that produced the buffer on the model's stream have finished. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "common/check_cuda.h"
#include "common/check_mpi.h"
#include "common/log.h"

MPI_Comm comm_mpi_handle(struct comm *c);

struct nccl_impl {
    ncclComm_t comm;
    cudaStream_t stream;
    struct comm *mpi; /* the matching MPI group: used for splitting and the unique id */
    int device;
    bool alone; /* comm_fail_alone: a lost peer ends this rank only */
};

static ncclDataType_t nccl_type(enum comm_dtype t)
{
    switch (t) {
    case COMM_F32: return ncclFloat32;
    case COMM_F64: return ncclFloat64;
    case COMM_I32: return ncclInt32;
    case COMM_I64: return ncclInt64;
    }
    return ncclFloat32;
}

static struct nccl_impl *ni(struct comm *c) { return c->impl; }

/* Whether p is memory the device reads (device or managed); host memory goes through MPI. */
static bool device_memory(const void *p)
{
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* an unknown pointer is host memory */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* device_memory, with the device's pending work finished first when it is (a blocking collective). */
static bool on_device(const void *p)
{
    if (!device_memory(p))
        return false;
    CHECK_CUDA(cudaDeviceSynchronize());
    return true;
}

/* Wait for the stream's collective, `what`, bounded by the comm's deadline (comm_set_deadline; 0: none): a
 * peer that is lost or stuck would otherwise hold this rank in the collective for ever. On the deadline, or on
 * an error NCCL reports meanwhile, the communicator is aborted and the run ends with the collective, the
 * group size and this rank named. */
static int nccl_wait_until(struct comm *c, cudaEvent_t ev, const char *what, bool soft);
static void nccl_wait_event(struct comm *c, cudaEvent_t ev, const char *what)
{
    (void)nccl_wait_until(c, ev, what, false);
}
static void nccl_wait_for(struct comm *c, const char *what) { nccl_wait_event(c, NULL, what); }

/* As nccl_wait_for, for the work up to event ev of the stream (NULL: all of it); soft: on the deadline or an
 * error, the communicator aborted, -1 with a log line instead of the end of the run (comm_try_broadcast). */
static int nccl_wait_until(struct comm *c, cudaEvent_t ev, const char *what, bool soft)
{
    const double limit = c->deadline_s;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long spins = 0;; spins++) {
        const cudaError_t q = ev ? cudaEventQuery(ev) : cudaStreamQuery(ni(c)->stream);
        if (q == cudaSuccess)
            return 0;
        if (q != cudaErrorNotReady)
            CHECK_CUDA(q);
        ncclResult_t async = ncclSuccess;
        CHECK_NCCL(ncclCommGetAsyncError(ni(c)->comm, &async));
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        if ((async != ncclSuccess && async != ncclInProgress) || (limit > 0 && waited > limit)) {
            ncclCommAbort(ni(c)->comm);
            char why[256];
            snprintf(why, sizeof why, "NCCL %s over %d ranks (this is rank %d) %s after %.1f s", what, c->size, c->rank,
                     async != ncclSuccess && async != ncclInProgress ? ncclGetErrorString(async) : "did not complete",
                     waited);
            if (soft) {
                log_warn("comm", "%s: a peer is lost or stuck; giving the group up", why);
                return -1;
            }
            if (ni(c)->alone) { /* comm_fail_alone: the run goes on without this group */
                log_error("comm", "%s: this rank's group has lost a peer; ending this rank only", why);
                _exit(4);
            }
            check_failf(__FILE__, __LINE__, "%s: a peer is lost or stuck; ending the run", why);
        }
        if (spins > 1000) { /* a short collective finishes within the spins; a long one is polled gently */
            struct timespec nap = {0, 50000};
            nanosleep(&nap, NULL);
        }
    }
}

static void nccl_allreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    if (!on_device(buf)) {
        comm_allreduce_sum(ni(c)->mpi, buf, count, t);
        return;
    }
    CHECK_NCCL(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, ni(c)->comm, ni(c)->stream));
    nccl_wait_for(c, "all-reduce");
}

/* comm_iallreduce_sum: queued on the group's stream behind the producer's queued work (an event between the
 * streams, so neither the caller nor the producer's stream waits), with an event marking its end. */
struct nccl_req {
    struct comm_req base; /* first: the caller's view */
    cudaEvent_t done;     /* NULL: a host buffer, summed over MPI at once */
};

static struct comm_req *nccl_iallreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t,
                                            void *after_stream)
{
    struct nccl_req *q = xcalloc(1, sizeof *q);
    if (!device_memory(buf)) { /* no sync: the point is not to wait for the producer */
        comm_allreduce_sum(ni(c)->mpi, buf, count, t);
        return &q->base;
    }
    if (after_stream) {
        cudaEvent_t ready;
        CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        CHECK_CUDA(cudaEventRecord(ready, (cudaStream_t)after_stream));
        CHECK_CUDA(cudaStreamWaitEvent(ni(c)->stream, ready, 0));
        CHECK_CUDA(cudaEventDestroy(ready)); /* released once the wait has seen it */
    }
    CHECK_NCCL(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, ni(c)->comm, ni(c)->stream));
    CHECK_CUDA(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming));
    CHECK_CUDA(cudaEventRecord(q->done, ni(c)->stream));
    return &q->base;
}

static void nccl_req_wait(struct comm_req *base)
{
    struct nccl_req *q = (struct nccl_req *)base;
    if (q->done) {
        nccl_wait_event(base->c, q->done, "all-reduce (a gradient bucket)");
        CHECK_CUDA(cudaEventDestroy(q->done));
    }
    free(q);
}

static void nccl_allreduce_max(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    if (!on_device(buf)) {
        comm_allreduce_max(ni(c)->mpi, buf, count, t);
        return;
    }
    CHECK_NCCL(ncclAllReduce(buf, buf, count, nccl_type(t), ncclMax, ni(c)->comm, ni(c)->stream));
    nccl_wait_for(c, "all-reduce (max)");
}

static void nccl_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (!on_device(recv)) {
        comm_allgather(ni(c)->mpi, send, recv, count, t);
        return;
    }
    CHECK_NCCL(ncclAllGather(send, recv, count, nccl_type(t), ni(c)->comm, ni(c)->stream));
    nccl_wait_for(c, "all-gather");
}

static void nccl_reduce_scatter_sum(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (!on_device(recv)) {
        comm_reduce_scatter_sum(ni(c)->mpi, send, recv, count, t);
        return;
    }
    CHECK_NCCL(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, ni(c)->comm, ni(c)->stream));
    nccl_wait_for(c, "reduce-scatter");
}

static void nccl_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    if (!on_device(buf)) {
        comm_broadcast(ni(c)->mpi, buf, count, t, root);
        return;
    }
    CHECK_NCCL(ncclBroadcast(buf, buf, count, nccl_type(t), root, ni(c)->comm, ni(c)->stream));
    nccl_wait_for(c, "broadcast");
}

static int nccl_try_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    if (!on_device(buf))
        return comm_try_broadcast(ni(c)->mpi, buf, count, t, root);
    if (ncclBroadcast(buf, buf, count, nccl_type(t), root, ni(c)->comm, ni(c)->stream) != ncclSuccess) {
        ncclCommAbort(ni(c)->comm);
        log_warn("comm", "NCCL broadcast over %d ranks could not start; giving the group up", c->size);
        return -1;
    }
    return nccl_wait_until(c, NULL, "broadcast", true);
}

static void nccl_send(struct comm *c, const void *buf, size_t count, enum comm_dtype t, int peer)
{
    if (!on_device(buf)) {
        comm_send(ni(c)->mpi, buf, count, t, peer);
        return;
    }
    CHECK_NCCL(ncclSend(buf, count, nccl_type(t), peer, ni(c)->comm, ni(c)->stream));
    nccl_wait_for(c, "send");
}

static void nccl_recv(struct comm *c, void *buf, size_t count, enum comm_dtype t, int peer)
{
    if (!on_device(buf)) {
        comm_recv(ni(c)->mpi, buf, count, t, peer);
        return;
    }
    CHECK_NCCL(ncclRecv(buf, count, nccl_type(t), peer, ni(c)->comm, ni(c)->stream));
    nccl_wait_for(c, "receive");
}

static void nccl_sendrecv(struct comm *c, const void *send, size_t sc, int dest, void *recv, size_t rc, int src,
                          enum comm_dtype t)
{
    if (!on_device(recv)) {
        comm_sendrecv(ni(c)->mpi, send, sc, dest, recv, rc, src, t);
        return;
    }
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclSend(send, sc, nccl_type(t), dest, ni(c)->comm, ni(c)->stream));
    CHECK_NCCL(ncclRecv(recv, rc, nccl_type(t), src, ni(c)->comm, ni(c)->stream));
    CHECK_NCCL(ncclGroupEnd());
    nccl_wait_for(c, "send-receive");
}

static void nccl_barrier(struct comm *c) { comm_barrier(ni(c)->mpi); }
static void nccl_barrier_polled(struct comm *c, void (*poll)(void *, bool), void *ud)
{
    comm_barrier_polled(ni(c)->mpi, poll, ud);
}

static struct comm *nccl_split(struct comm *parent, int color, int key)
{
    struct comm *sub_mpi = comm_split(ni(parent)->mpi, color, key);
    struct comm *sub = comm_nccl_from(sub_mpi, ni(parent)->device);
    comm_free(sub_mpi);
    return sub;
}

/* comm_fail_alone: a lost peer ends this rank only, over NCCL (nccl_wait_event) and over the MPI twin alike. */
static void nccl_fail_alone(struct comm *c)
{
    ni(c)->alone = true;
    comm_fail_alone(ni(c)->mpi);
}

static void nccl_destroy(struct comm *c)
{
    if (!c->given_up) /* an aborted communicator is freed by the abort */
        ncclCommDestroy(ni(c)->comm);
    cudaStreamDestroy(ni(c)->stream);
    comm_free(ni(c)->mpi);
    free(c->impl);
    free(c);
}

static const struct comm_backend nccl_backend = {
    .name = "nccl",
    .allreduce_sum = nccl_allreduce_sum,
    .allreduce_max = nccl_allreduce_max,
    .iallreduce_sum = nccl_iallreduce_sum,
    .wait = nccl_req_wait,
    .allgather = nccl_allgather,
    .reduce_scatter_sum = nccl_reduce_scatter_sum,
    .broadcast = nccl_broadcast,
    .try_broadcast = nccl_try_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .sendrecv = nccl_sendrecv,
    .barrier = nccl_barrier,
    .barrier_polled = nccl_barrier_polled,
    .split = nccl_split,
    .fail_alone = nccl_fail_alone,
    .destroy = nccl_destroy,
};

struct comm *comm_nccl_from(struct comm *mpi_comm, int device)
{
    struct comm *c = xcalloc(1, sizeof *c);
    struct nccl_impl *impl = xcalloc(1, sizeof *impl);
    c->be = &nccl_backend;
    c->impl = impl;
    c->rank = comm_rank(mpi_comm);
    c->size = comm_size(mpi_comm);
    impl->device = device;
    /* keep our own MPI group so later splits mirror NCCL's */
    impl->mpi = comm_split(mpi_comm, 0, c->rank);
    c->deadline_s = mpi_comm->deadline_s; /* the MPI group's deadline (actor_rollout_ref.nccl_timeout) holds here too */
    CHECK_CUDA(cudaSetDevice(device));
    CHECK_CUDA(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
    ncclUniqueId id;
    if (c->rank == 0)
        CHECK_NCCL(ncclGetUniqueId(&id));
    CHECK_MPI(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, comm_mpi_handle(impl->mpi)));
    CHECK_NCCL(ncclCommInitRank(&impl->comm, c->size, id, c->rank));
    return c;
}
