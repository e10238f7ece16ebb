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
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "comm_nccl.h"
#include "common/check_cuda.h"
#include "common/clock.h"
#include "common/check_mpi.h"
#include "common/log.h"
#include "worker/flight/flight.h"

MPI_Comm comm_mpi_handle(struct comm *c);

struct nccl_impl {
    ncclComm_t comm;
    cudaStream_t stream;
    struct comm *mpi; /* the matching MPI group: used for splitting and the unique id */
    int device;
    bool alone;   /* comm_fail_alone: a lost peer ends this rank only */
    bool aborted; /* ncclCommAbort has run: the communicator is gone */
    bool watched; /* comm_ft_watch: a lost peer goes to the collective plane's handler (trainer-loss survival) */
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

/* The communicators are non-blocking (ncclConfig_t.blocking = 0): set-up, and the connections NCCL makes at a
 * group's first collective, run in the background, so that no NCCL call holds this rank past the deadline. An
 * NCCL call returns at once, ncclInProgress while its work is being queued; the state is then polled
 * (ncclCommGetAsyncError) before anything else touches the communicator or its stream. */

static void nccl_abort(struct comm *c)
{
    if (!ni(c)->aborted) {
        ni(c)->aborted = true;
        ncclCommAbort(ni(c)->comm);
    }
}

/* In a watched group (comm_ft_watch: the run survives a lost peer) a failed or overdue NCCL wait is a lost peer
 * when NCCL says a remote rank failed (ncclRemoteError: it exited, or aborted the communicator) or MPI knows of a
 * loss in the group's twin (comm_ft_poll): NCCL over a node's shared memory or NVLink may never notice a peer that
 * died, so every wait of a watched group also asks MPI every FT_POLL_S. A lost peer is the handler's (comm_ft_lost,
 * which does not return where the run survives it); anything else ends the run as without survival. */
#define FT_POLL_S 0.01
/* and before a watched group's wait ends the run for another reason (the deadline, another error): this many times */
#define FT_ASK_LAST 50

/* `what` failed (error: NCCL's error, or NULL: past the deadline; lost: MPI's word on a lost peer, or NULL) after
 * `waited` s: the communicator is aborted; a lost peer of a watched group goes to the handler; soft: -1 with a log
 * line (comm_try_broadcast), else this rank (comm_fail_alone) or the run ends. */
static int nccl_fail_lost(struct comm *c, const char *what, ncclResult_t error, const char *lost, double waited,
                          bool soft)
{
    nccl_abort(c);
    char mpi_lost[160] = "";
    /* MPI's word, asked a few times (its failure detector moves on with MPI's progress, which these probes give it);
     * once where NCCL has said a peer failed */
    const int asks = error == ncclRemoteError ? 1 : FT_ASK_LAST;
    for (int i = 0; ni(c)->watched && !soft && !lost && i < asks; i++) {
        if (comm_ft_poll(ni(c)->mpi, mpi_lost, sizeof mpi_lost))
            lost = mpi_lost;
        else
            clock_sleep_s(FT_POLL_S);
    }
    if (ni(c)->watched && !soft && (lost || error == ncclRemoteError)) {
        char how[512]; /* who said so: NCCL (its error), MPI (its word), or both */
        snprintf(how, sizeof how, "NCCL %s over %d ranks (this is rank %d): a peer is lost (%s%s%s%s, after %.1f s)",
                 what, c->size, c->rank, error != ncclSuccess ? "NCCL: " : "",
                 error != ncclSuccess ? ncclGetErrorString(error) : "", error != ncclSuccess && lost ? "; " : "",
                 lost ? lost : "", waited);
        comm_ft_lost(c, how); /* where the run survives the loss, it goes on from the handler's point */
    }
    char why[256];
    snprintf(why, sizeof why, "NCCL %s over %d ranks (this is rank %d) %s after %.1f s", what, c->size, c->rank,
             lost                   ? lost
             : error != ncclSuccess ? ncclGetErrorString(error)
                                    : "did not complete",
             waited);
    flight_dump(why, true); /* the flight recorder's ring before the run ends, as comm_mpi.c's */
    if (soft) {
        log_warn("comm", "%s: a peer is lost or stuck; giving the group up", why);
        return -1;
    }
    if (ni(c)->alone) { /* comm_fail_alone: the run goes on without this group */
        log_error("comm", "%s: this rank's group has lost a peer; ending this rank only", why);
        _exit(4);
    }
    check_failf(__FILE__, __LINE__, "%s: a peer is lost or stuck; ending the run", why);
    return -1;
}

static int nccl_fail(struct comm *c, const char *what, ncclResult_t error, double waited, bool soft)
{
    return nccl_fail_lost(c, what, error, NULL, waited, soft);
}

/* In a watched group, every FT_POLL_S of a wait (*polled: when it asked last): whether MPI knows of a lost peer
 * (lost gets its word). */
static bool ft_polled_lost(struct comm *c, double *polled, char *lost, size_t len)
{
    if (!ni(c)->watched)
        return false;
    const double now = clock_now_s();
    if (now - *polled < FT_POLL_S)
        return false;
    *polled = now;
    return comm_ft_poll(ni(c)->mpi, lost, len);
}

static void nap(long spins)
{
    if (spins > 1000) { /* a short collective finishes within the spins; a long one is polled gently */
        struct timespec t = {0, 50000};
        nanosleep(&t, NULL);
    }
}

/* rc, what an NCCL call on c returned: 0 once its work is queued (ncclInProgress polled until it is, bounded by
 * the deadline), else the call failed (nccl_fail). */
static int nccl_issued(struct comm *c, ncclResult_t rc, const char *what, bool soft)
{
    const double t0 = clock_now_s();
    double polled = t0;
    char lost[160];
    for (long spins = 0; rc == ncclInProgress; spins++) {
        if (ncclCommGetAsyncError(ni(c)->comm, &rc) != ncclSuccess)
            rc = ncclInternalError;
        if (rc == ncclInProgress && c->deadline_s > 0 && (clock_now_s() - t0) > c->deadline_s)
            return nccl_fail(c, what, ncclSuccess, clock_now_s() - t0, soft);
        if (rc == ncclInProgress && !soft && ft_polled_lost(c, &polled, lost, sizeof lost))
            return nccl_fail_lost(c, what, ncclSuccess, lost, clock_now_s() - t0, soft);
        nap(spins);
    }
    return rc == ncclSuccess ? 0 : nccl_fail(c, what, rc, clock_now_s() - t0, soft);
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
    const double t0 = clock_now_s();
    double polled = t0;
    char lost[160];
    for (long spins = 0;; spins++) {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(ni(c)->comm, &async) != ncclSuccess)
            async = ncclInternalError;
        if (async != ncclSuccess && async != ncclInProgress)
            return nccl_fail(c, what, async, clock_now_s() - t0, soft);
        if (async == ncclSuccess) { /* everything queued: the stream says when it is done */
            const cudaError_t q = ev ? cudaEventQuery(ev) : cudaStreamQuery(ni(c)->stream);
            if (q == cudaSuccess)
                return 0;
            if (q != cudaErrorNotReady)
                CHECK_CUDA(q);
        }
        if (c->deadline_s > 0 && (clock_now_s() - t0) > c->deadline_s)
            return nccl_fail(c, what, ncclSuccess, clock_now_s() - t0, soft);
        if (!soft && ft_polled_lost(c, &polled, lost, sizeof lost))
            return nccl_fail_lost(c, what, ncclSuccess, lost, clock_now_s() - t0, soft);
        nap(spins);
    }
}

static void nccl_allreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    if (!on_device(buf)) {
        comm_allreduce_sum(ni(c)->mpi, buf, count, t);
        return;
    }
    nccl_issued(c, ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, ni(c)->comm, ni(c)->stream), "all-reduce",
                false);
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
    /* queued before the event is recorded behind it */
    nccl_issued(c, ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, ni(c)->comm, ni(c)->stream),
                "all-reduce (a gradient bucket)", false);
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
    nccl_issued(c, ncclAllReduce(buf, buf, count, nccl_type(t), ncclMax, ni(c)->comm, ni(c)->stream),
                "all-reduce (max)", false);
    nccl_wait_for(c, "all-reduce (max)");
}

static void nccl_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (!on_device(recv)) {
        comm_allgather(ni(c)->mpi, send, recv, count, t);
        return;
    }
    nccl_issued(c, ncclAllGather(send, recv, count, nccl_type(t), ni(c)->comm, ni(c)->stream), "all-gather", false);
    nccl_wait_for(c, "all-gather");
}

static void nccl_allgather_bytes(struct comm *c, const void *send, void *recv, size_t bytes)
{
    if (!on_device(recv)) {
        comm_allgather_bytes(ni(c)->mpi, send, recv, bytes);
        return;
    }
    nccl_issued(c, ncclAllGather(send, recv, bytes, ncclUint8, ni(c)->comm, ni(c)->stream), "all-gather", false);
    nccl_wait_for(c, "all-gather");
}

static void nccl_reduce_scatter_sum(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (!on_device(recv)) {
        comm_reduce_scatter_sum(ni(c)->mpi, send, recv, count, t);
        return;
    }
    nccl_issued(c, ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, ni(c)->comm, ni(c)->stream),
                "reduce-scatter", false);
    nccl_wait_for(c, "reduce-scatter");
}

static void nccl_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    if (!on_device(buf)) {
        comm_broadcast(ni(c)->mpi, buf, count, t, root);
        return;
    }
    nccl_issued(c, ncclBroadcast(buf, buf, count, nccl_type(t), root, ni(c)->comm, ni(c)->stream), "broadcast", false);
    nccl_wait_for(c, "broadcast");
}

static int nccl_try_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    if (!on_device(buf))
        return comm_try_broadcast(ni(c)->mpi, buf, count, t, root);
    if (nccl_issued(c, ncclBroadcast(buf, buf, count, nccl_type(t), root, ni(c)->comm, ni(c)->stream), "broadcast",
                    true) != 0)
        return -1;
    return nccl_wait_until(c, NULL, "broadcast", true);
}

static void nccl_send(struct comm *c, const void *buf, size_t count, enum comm_dtype t, int peer)
{
    if (!on_device(buf)) {
        comm_send(ni(c)->mpi, buf, count, t, peer);
        return;
    }
    nccl_issued(c, ncclSend(buf, count, nccl_type(t), peer, ni(c)->comm, ni(c)->stream), "send", false);
    nccl_wait_for(c, "send");
}

static void nccl_recv(struct comm *c, void *buf, size_t count, enum comm_dtype t, int peer)
{
    if (!on_device(buf)) {
        comm_recv(ni(c)->mpi, buf, count, t, peer);
        return;
    }
    nccl_issued(c, ncclRecv(buf, count, nccl_type(t), peer, ni(c)->comm, ni(c)->stream), "receive", false);
    nccl_wait_for(c, "receive");
}

/* A call inside a group: recorded for ncclGroupEnd (a non-blocking communicator may say ncclInProgress). */
static void recorded(ncclResult_t rc)
{
    if (rc != ncclInProgress)
        CHECK_NCCL(rc);
}

static void nccl_sendrecv(struct comm *c, const void *send, size_t sc, int dest, void *recv, size_t rc, int src,
                          enum comm_dtype t)
{
    if (!on_device(recv)) {
        comm_sendrecv(ni(c)->mpi, send, sc, dest, recv, rc, src, t);
        return;
    }
    /* inside a group the calls only record; ncclGroupEnd issues them (ncclInProgress on this communicator) */
    CHECK_NCCL(ncclGroupStart());
    recorded(ncclSend(send, sc, nccl_type(t), dest, ni(c)->comm, ni(c)->stream));
    recorded(ncclRecv(recv, rc, nccl_type(t), src, ni(c)->comm, ni(c)->stream));
    nccl_issued(c, ncclGroupEnd(), "send-receive", false);
    nccl_wait_for(c, "send-receive");
}

static void nccl_alltoallv(struct comm *c, const void *send, const size_t *sc, void *recv, const size_t *rc,
                           enum comm_dtype t)
{
    if (!on_device(recv)) {
        comm_alltoallv(ni(c)->mpi, send, sc, recv, rc, t);
        return;
    }
    /* NCCL has no all-to-all: one send and one receive per peer in a group, as NCCL's documentation shows */
    const size_t es = comm_dtype_size(t);
    size_t so = 0, ro = 0;
    CHECK_NCCL(ncclGroupStart());
    for (int p = 0; p < c->size; p++) {
        if (sc[p])
            recorded(ncclSend((const char *)send + so * es, sc[p], nccl_type(t), p, ni(c)->comm, ni(c)->stream));
        if (rc[p])
            recorded(ncclRecv((char *)recv + ro * es, rc[p], nccl_type(t), p, ni(c)->comm, ni(c)->stream));
        so += sc[p];
        ro += rc[p];
    }
    nccl_issued(c, ncclGroupEnd(), "all-to-all", false);
    nccl_wait_for(c, "all-to-all");
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

/* The ranks on this rank's host, split from the MPI twin as nccl_split does. */
static struct comm *nccl_split_node(struct comm *parent, int key)
{
    struct comm *sub_mpi = comm_split_node(ni(parent)->mpi, key);
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

/* comm_ft_watch: a lost peer goes to the collective plane's handler, over NCCL (nccl_fail_lost) and over the MPI
 * twin (watched: its errors come back). comm_revoke: the communicator aborted (every operation queued on it
 * dropped; a peer still waiting in it gets ncclRemoteError, or finds the loss through MPI) and the twin revoked. */
static void nccl_ft_watch(struct comm *c)
{
    ni(c)->watched = true;
    comm_ft_watch(ni(c)->mpi);
}
static void nccl_revoke(struct comm *c)
{
    nccl_abort(c);
    comm_revoke(ni(c)->mpi);
}

/* comm_set_deadline: host buffers go through the MPI twin, which waits as long */
static void nccl_set_deadline(struct comm *c, double seconds) { comm_set_deadline(ni(c)->mpi, seconds); }

/* comm_members and comm_set_name: the MPI twin's ranks, and its name too (host buffers go through it) */
static void nccl_world_ranks(const struct comm *c, int *out)
{
    const struct comm *m = ((const struct nccl_impl *)c->impl)->mpi;
    if (m->be->world_ranks)
        m->be->world_ranks(m, out);
}
static void nccl_set_name(struct comm *c, const char *name) { comm_set_name(ni(c)->mpi, name); }

static void nccl_destroy(struct comm *c)
{
    /* an aborted communicator is freed by the abort; one given up elsewhere (its MPI twin) is aborted, since a peer
     * may still wait in it; else its queued work is finished (bounded) and it is destroyed */
    if (!ni(c)->aborted && (c->given_up || nccl_issued(c, ncclCommFinalize(ni(c)->comm), "finalize", true) != 0))
        nccl_abort(c);
    if (!ni(c)->aborted)
        ncclCommDestroy(ni(c)->comm);
    cudaStreamDestroy(ni(c)->stream);
    comm_free(ni(c)->mpi);
    free(c->impl);
    free(c);
}

static const struct comm_backend nccl_backend = {
    .name = "nccl",
    .caps = {.device_memory = true},
    .allreduce_sum = nccl_allreduce_sum,
    .allreduce_max = nccl_allreduce_max,
    .iallreduce_sum = nccl_iallreduce_sum,
    .wait = nccl_req_wait,
    .allgather = nccl_allgather,
    .allgather_bytes = nccl_allgather_bytes,
    .reduce_scatter_sum = nccl_reduce_scatter_sum,
    .broadcast = nccl_broadcast,
    .try_broadcast = nccl_try_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .sendrecv = nccl_sendrecv,
    .alltoallv = nccl_alltoallv,
    .barrier = nccl_barrier,
    .barrier_polled = nccl_barrier_polled,
    .split = nccl_split,
    .split_node = nccl_split_node,
    .fail_alone = nccl_fail_alone,
    .ft_watch = nccl_ft_watch,
    .revoke = nccl_revoke,
    .set_deadline = nccl_set_deadline,
    .world_ranks = nccl_world_ranks,
    .set_name = nccl_set_name,
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
    /* the unique id below reaches the ranks over the twin: after a loss, a split of the survivors' shrunk group (the
     * natural channel where ULFM is: the shrink alone decided who survived) */
    CHECK_CUDA(cudaSetDevice(device));
    CHECK_CUDA(cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (c->rank == 0)
        CHECK_NCCL(ncclGetUniqueId(&id));
    /* over the twin, bounded like its other operations; then the set-up in the background, polled */
    comm_broadcast(impl->mpi, &id, sizeof id / sizeof(int32_t), COMM_I32, 0);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    nccl_issued(c, ncclCommInitRankConfig(&impl->comm, c->size, id, c->rank, &config), "communicator set-up", false);
    return c;
}

/* The NCCL back-end as it registers itself (struct comm_device_backend, comm.h). */
const struct comm_device_backend comm_backend_nccl = {.name = "nccl", .from = comm_nccl_from};
