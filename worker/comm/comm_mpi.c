/* MPI back-end of the collective plane: CPU buffers, used where there is no GPU. */
#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef GRPO_HAVE_PMIX
#include <pmix.h>
#endif
#ifdef GRPO_HAVE_ULFM
#include <mpi.h>
#include <mpi-ext.h> /* after mpi.h, which it needs */
#endif

#include "comm.h"
#include "comm_mpi_impl.h"
#include "common/check_mpi.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/config_key_names.h"
#include "worker/flight/flight.h"

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

/* An error in a collective: the whole job ends (CHECK_MPI), or, in a group marked comm_fail_alone, this rank
 * only, with a log line (the group lost a peer; the run goes on without the group). */
static void comm_check(struct comm *c, int rc, const char *file, int line, const char *expr)
{
    if (rc == MPI_SUCCESS)
        return;
    comm_ft_check(c, rc, expr); /* a lost peer where the run survives one: does not return */
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

/* With a deadline (comm_set_deadline, actor_rollout_ref.nccl_timeout) every operation below is started
 * non-blocking and tested until it completes or the deadline passes: a peer that is lost or stuck would
 * otherwise hold this rank in MPI for ever. Every rank of a group has the same deadline (a group inherits its
 * parent's, and the parent's comes from the run's configuration), so the ranks of a collective all take the
 * blocking or all the non-blocking form, as MPI requires for collectives. */
static bool bounded(const struct comm *c) { return c->deadline_s > 0; }

/* Test n requests of the operation `what` until they are complete (the caller then waits on them, which returns at
 * once and says so to MPI checkers); past the deadline the run ends (in a comm_fail_alone group, this
 * rank only) with the operation, the group size and this rank named. */
static int mpi_wait_until(struct comm *c, MPI_Request *req, int n, const char *what, bool soft);
static void mpi_wait_bounded(struct comm *c, MPI_Request *req, int n, const char *what)
{
    (void)mpi_wait_until(c, req, n, what, false);
}

/* mpi_wait_bounded; soft: past the deadline return -1 with a log line instead (the requests are left behind,
 * since MPI cannot cancel a collective: the caller never uses the group again). */
static int mpi_wait_until(struct comm *c, MPI_Request *req, int n, const char *what, bool soft)
{
    const double t0 = clock_now_s();
    MPI_Status st[2]; /* every caller has one or two requests */
    if (n > 2)
        check_failf(__FILE__, __LINE__, "mpi_wait_until: %d requests (at most 2)", n);
    for (long spins = 0;; spins++) {
        int done = 0;
        int rc = MPI_Testall(n, req, &done, st);
        if (rc == MPI_ERR_IN_STATUS) /* the request's own error (a lost peer's, which comm_check hands on) */
            for (int i = 0; i < n; i++)
                if (st[i].MPI_ERROR != MPI_SUCCESS && st[i].MPI_ERROR != MPI_ERR_PENDING) {
                    rc = st[i].MPI_ERROR;
                    break;
                }
        comm_check(c, rc, __FILE__, __LINE__, "MPI_Testall(n, req, &done, st)");
        if (done)
            return 0; /* the caller's MPI_Wait releases the complete requests */
        const double waited = (clock_now_s() - t0);
        if (c->deadline_s > 0 && waited > c->deadline_s) {
            char why[512];
            snprintf(why, sizeof why,
                     "MPI %s over %d ranks (this is rank %d of the group) did not complete after %.1f s: a peer is "
                     "lost or stuck (" KEY_arr_nccl_timeout " = %.0f s)",
                     what, c->size, c->rank, waited, c->deadline_s);
            /* what this rank waited for, and what it did before: the flight recorder's ring, in the log and the
             * run directory, before the run ends (the peers' dumps say where they were) */
            flight_dump(why, true);
            if (soft) {
                log_warn("comm", "%s; giving the group up", why);
                return -1;
            }
            if (((struct mpi_impl *)c->impl)->alone) {
                log_error("comm", "%s; ending this rank only", why);
                _exit(4);
            }
            check_failf(__FILE__, __LINE__, "%s; ending the run", why);
        }
        /* MPI progresses the operation inside these tests, so they go on back to back as a blocking call would
         * spin (a nap between them slowed a large all-reduce); past the first spins each also yields the core, to
         * a peer that computes on it when ranks outnumber cores (Open MPI's own yield_when_idle) */
        if (spins > 1000)
            sched_yield();
    }
}

static void mpi_allreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Allreduce(MPI_IN_PLACE, buf, icount(count), mpi_type(t), MPI_SUM, mc(c)));
        return;
    }
    MPI_Request r;
    CHECK_C(c, MPI_Iallreduce(MPI_IN_PLACE, buf, icount(count), mpi_type(t), MPI_SUM, mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "all-reduce");
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE));
}

static void mpi_allreduce_max(struct comm *c, void *buf, size_t count, enum comm_dtype t)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Allreduce(MPI_IN_PLACE, buf, icount(count), mpi_type(t), MPI_MAX, mc(c)));
        return;
    }
    MPI_Request r;
    CHECK_C(c, MPI_Iallreduce(MPI_IN_PLACE, buf, icount(count), mpi_type(t), MPI_MAX, mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "all-reduce (max)");
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE));
}

/* A non-blocking sum (comm_iallreduce_sum): the request lives beside the comm_req the caller holds. */
struct mpi_req {
    struct comm_req base; /* first: the caller's view */
    MPI_Request r;
};

static struct comm_req *mpi_iallreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t, void *stream)
{
    (void)stream; /* host memory */
    struct mpi_req *q = xcalloc(1, sizeof *q);
    /* completed by mpi_req_wait, which the caller of comm_iallreduce_sum must call */
    CHECK_C(c, MPI_Iallreduce(MPI_IN_PLACE, buf, icount(count), mpi_type(t), MPI_SUM, mc(c), // NOLINT
                              &q->r));
    return &q->base;
}

static void mpi_req_test(struct comm_req *base)
{
    struct mpi_req *q = (struct mpi_req *)base;
    int done = 0;
    CHECK_C(base->c, MPI_Test(&q->r, &done, MPI_STATUS_IGNORE)); // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
}

static void mpi_req_wait(struct comm_req *base)
{
    struct mpi_req *q = (struct mpi_req *)base;
    if (bounded(base->c))
        mpi_wait_bounded(base->c, &q->r, 1, "all-reduce (a gradient bucket)");
    CHECK_C(base->c, MPI_Wait(&q->r, MPI_STATUS_IGNORE)); // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
    free(q);
}

static void mpi_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Allgather(send, icount(count), mpi_type(t), recv, icount(count), mpi_type(t), mc(c)));
        return;
    }
    MPI_Request r;
    CHECK_C(c, MPI_Iallgather(send, icount(count), mpi_type(t), recv, icount(count), mpi_type(t), mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "all-gather");
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE));
}

static void mpi_allgather_bytes(struct comm *c, const void *send, void *recv, size_t bytes)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Allgather(send, icount(bytes), MPI_BYTE, recv, icount(bytes), MPI_BYTE, mc(c)));
        return;
    }
    MPI_Request r;
    CHECK_C(c, MPI_Iallgather(send, icount(bytes), MPI_BYTE, recv, icount(bytes), MPI_BYTE, mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "all-gather");
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE));
}

static void mpi_reduce_scatter_sum(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Reduce_scatter_block(send, recv, icount(count), mpi_type(t), MPI_SUM, mc(c)));
        return;
    }
    MPI_Request r;
    CHECK_C(c, MPI_Ireduce_scatter_block(send, recv, icount(count), mpi_type(t), MPI_SUM, mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "reduce-scatter");
    /* complete already; the MPI checker does not know this non-blocking call */
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE)); // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
}

static void mpi_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Bcast(buf, icount(count), mpi_type(t), root, mc(c)));
        return;
    }
    MPI_Request r;
    CHECK_C(c, MPI_Ibcast(buf, icount(count), mpi_type(t), root, mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "broadcast");
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE));
}

/* comm_try_broadcast: always non-blocking and tested (with or without a deadline), -1 past the deadline. */
static int mpi_try_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root)
{
    MPI_Request r;
    CHECK_C(c, MPI_Ibcast(buf, icount(count), mpi_type(t), root, mc(c), &r));
    /* past the deadline the request is left behind: MPI cannot cancel a collective, and the group is not used
     * again (comm_try_broadcast marks it given up) */
    if (mpi_wait_until(c, &r, 1, "broadcast", true) != 0)
        return -1; // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE));
    return 0;
}

/* A non-blocking operation tested every millisecond until it is complete (the caller then waits on it), with no
 * deadline; poll runs in between (a rank waiting for
 * its peers keeps answering the control plane). */
static void mpi_wait_polled(struct comm *c, MPI_Request *req, void (*poll)(void *ud, bool done), void *ud)
{
    bool polled = false;
    for (int done = 0;;) {
        CHECK_C(c, MPI_Test(req, &done, MPI_STATUS_IGNORE));
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
}

static void mpi_broadcast_polled(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root,
                                 void (*poll)(void *ud, bool done), void *ud)
{
    MPI_Request req;
    CHECK_C(c, MPI_Ibcast(buf, icount(count), mpi_type(t), root, mc(c), &req));
    mpi_wait_polled(c, &req, poll, ud);
    CHECK_C(c, MPI_Wait(&req, MPI_STATUS_IGNORE)); /* complete already: releases nothing, says so to checkers */
}

static void mpi_barrier_polled(struct comm *c, void (*poll)(void *ud, bool done), void *ud)
{
    MPI_Request req;
    CHECK_C(c, MPI_Ibarrier(mc(c), &req));
    mpi_wait_polled(c, &req, poll, ud);
    /* complete already; the MPI checker does not know this non-blocking call */
    CHECK_C(c, MPI_Wait(&req, MPI_STATUS_IGNORE)); // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
}

/* GRPO_COMM_SYNC_SENDS=1 (tests): every send completes only once its receive has started, as NCCL's do, where MPI
 * may buffer a small one and return at once; a pipeline schedule that leans on that buffering deadlocks here on the
 * CPU instead of on GPUs. */
static bool sync_sends(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("GRPO_COMM_SYNC_SENDS");
        v = e && strcmp(e, "1") == 0;
        if (v)
            log_info("comm", "synchronous sends (GRPO_COMM_SYNC_SENDS=1): a send waits for its receive, as NCCL's");
    }
    return v;
}

static void mpi_send(struct comm *c, const void *buf, size_t count, enum comm_dtype t, int peer)
{
    if (!bounded(c)) {
        if (sync_sends())
            CHECK_C(c, MPI_Ssend(buf, icount(count), mpi_type(t), peer, 0, mc(c)));
        else
            CHECK_C(c, MPI_Send(buf, icount(count), mpi_type(t), peer, 0, mc(c)));
        return;
    }
    MPI_Request r;
    if (sync_sends())
        CHECK_C(c, MPI_Issend(buf, icount(count), mpi_type(t), peer, 0, mc(c), &r));
    else
        CHECK_C(c, MPI_Isend(buf, icount(count), mpi_type(t), peer, 0, mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "send");
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE));
}

static void mpi_recv(struct comm *c, void *buf, size_t count, enum comm_dtype t, int peer)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Recv(buf, icount(count), mpi_type(t), peer, 0, mc(c), MPI_STATUS_IGNORE));
        return;
    }
    MPI_Request r;
    CHECK_C(c, MPI_Irecv(buf, icount(count), mpi_type(t), peer, 0, mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "receive");
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE));
}

static void mpi_sendrecv(struct comm *c, const void *send, size_t sc, int dest, void *recv, size_t rc, int src,
                         enum comm_dtype t)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Sendrecv(send, icount(sc), mpi_type(t), dest, 0, recv, icount(rc), mpi_type(t), src, 0, mc(c),
                                MPI_STATUS_IGNORE));
        return;
    }
    MPI_Request r[2];
    CHECK_C(c, MPI_Irecv(recv, icount(rc), mpi_type(t), src, 0, mc(c), &r[0]));
    CHECK_C(c, MPI_Isend(send, icount(sc), mpi_type(t), dest, 0, mc(c), &r[1]));
    mpi_wait_bounded(c, r, 2, "send-receive");
    CHECK_C(c, MPI_Waitall(2, r, MPI_STATUSES_IGNORE));
}

static void mpi_alltoallv(struct comm *c, const void *send, const size_t *sc, void *recv, const size_t *rc,
                          enum comm_dtype t)
{
    const int n = c->size;
    int *v = xcalloc((size_t)4 * n, sizeof *v); /* send counts, send displacements, receive counts, displacements */
    size_t so = 0, ro = 0;
    for (int p = 0; p < n; p++) {
        v[p] = icount(sc[p]);
        v[n + p] = icount(so);
        v[2 * n + p] = icount(rc[p]);
        v[3 * n + p] = icount(ro);
        so += sc[p];
        ro += rc[p];
    }
    if (!bounded(c)) {
        CHECK_C(c, MPI_Alltoallv(send, v, v + n, mpi_type(t), recv, v + 2 * n, v + 3 * n, mpi_type(t), mc(c)));
    } else {
        MPI_Request r;
        CHECK_C(c, MPI_Ialltoallv(send, v, v + n, mpi_type(t), recv, v + 2 * n, v + 3 * n, mpi_type(t), mc(c), &r));
        mpi_wait_bounded(c, &r, 1, "all-to-all");
        /* complete already; the MPI checker does not know this non-blocking call */
        CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE)); // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
    }
    free(v);
}

static void mpi_barrier(struct comm *c)
{
    if (!bounded(c)) {
        CHECK_C(c, MPI_Barrier(mc(c)));
        return;
    }
    MPI_Request r;
    CHECK_C(c, MPI_Ibarrier(mc(c), &r));
    mpi_wait_bounded(c, &r, 1, "barrier");
    /* complete already; the MPI checker does not know this non-blocking call */
    CHECK_C(c, MPI_Wait(&r, MPI_STATUS_IGNORE)); // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
}

static struct comm *mpi_wrap(MPI_Comm m, bool owned);

static struct comm *mpi_split(struct comm *parent, int color, int key)
{
    MPI_Comm m;
    CHECK_MPI(MPI_Comm_split(mc(parent), color, key, &m));
    return mpi_wrap(m, true);
}

/* The ranks of parent on this rank's host: MPI's shared-memory split. */
static struct comm *mpi_split_node(struct comm *parent, int key)
{
    MPI_Comm m;
    CHECK_MPI(MPI_Comm_split_type(mc(parent), MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &m));
    return mpi_wrap(m, true);
}

static void mpi_fail_alone(struct comm *c)
{
    ((struct mpi_impl *)c->impl)->alone = true;
    CHECK_MPI(MPI_Comm_set_errhandler(mc(c), MPI_ERRORS_RETURN));
}

/* comm_members: each rank's rank in MPI_COMM_WORLD, by the groups' translation (no communication) */
static void mpi_world_ranks(const struct comm *c, int *out)
{
    MPI_Group g, world;
    int *mine = xcalloc((size_t)c->size, sizeof *mine);
    for (int i = 0; i < c->size; i++)
        mine[i] = i;
    CHECK_MPI(MPI_Comm_group(((const struct mpi_impl *)c->impl)->comm, &g));
    CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
    CHECK_MPI(MPI_Group_translate_ranks(g, c->size, mine, world, out));
    MPI_Group_free(&g);
    MPI_Group_free(&world);
    free(mine);
}

static void mpi_destroy(struct comm *c)
{
    struct mpi_impl *impl = c->impl;
    if (impl->owned && !impl->revoked)
        MPI_Comm_free(&impl->comm);
    free(impl);
    free(c);
}

/* comm_table over MPI one-sided: a window of n int64 on rank 0, read and written under an exclusive lock */
struct mpi_table {
    struct comm *c; /* first member: comm.c finds the back-end through it */
    MPI_Win win;
    int64_t *base;
    size_t n;
};

static struct comm_table *mpi_table_create(struct comm *c, size_t n)
{
    struct mpi_table *t = xcalloc(1, sizeof *t);
    t->c = c;
    t->n = n;
    const MPI_Aint bytes = c->rank == 0 ? (MPI_Aint)(n * sizeof(int64_t)) : 0;
    CHECK_MPI(MPI_Win_allocate(bytes, sizeof(int64_t), MPI_INFO_NULL, mc(c), &t->base, &t->win));
    if (((struct mpi_impl *)c->impl)->watched) /* a lost peer comes back as an error, as on c */
        CHECK_MPI(MPI_Win_set_errhandler(t->win, MPI_ERRORS_RETURN));
    if (c->rank == 0) { /* the window's memory starts undefined: zeros, in an epoch of its own */
        CHECK_MPI(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, t->win));
        memset(t->base, 0, n * sizeof(int64_t));
        CHECK_MPI(MPI_Win_unlock(0, t->win));
    }
    CHECK_MPI(MPI_Barrier(mc(c))); /* nobody reads before the zeros */
    return (struct comm_table *)t;
}

static void mpi_table_update(struct comm_table *base, int64_t *v, void (*fn)(void *, int64_t *), void *ud)
{
    struct mpi_table *t = (struct mpi_table *)base;
    const int n = icount(t->n);
    CHECK_C(t->c, MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, t->win));
    CHECK_C(t->c, MPI_Get(v, n, MPI_INT64_T, 0, 0, n, MPI_INT64_T, t->win));
    CHECK_C(t->c, MPI_Win_flush(0, t->win));
    fn(ud, v);
    CHECK_C(t->c, MPI_Put(v, n, MPI_INT64_T, 0, 0, n, MPI_INT64_T, t->win));
    CHECK_C(t->c, MPI_Win_unlock(0, t->win));
}

static void mpi_table_free(struct comm_table *base)
{
    struct mpi_table *t = (struct mpi_table *)base;
    CHECK_MPI(MPI_Win_free(&t->win));
    free(t);
}

/* comm_shared over MPI: a shared-memory window of the node's ranks (MPI_Win_allocate_shared), its bytes on rank 0
 * and every rank's pointer to them; no synchronisation call is made on it after the start (comm.h) */
struct mpi_shared {
    struct comm_shared_head h; /* first member: comm.c finds the back-end and the base through it */
    MPI_Win win;
};

static struct comm_shared *mpi_shared_create(struct comm *c, size_t bytes)
{
    struct mpi_shared *s = xcalloc(1, sizeof *s);
    s->h.c = c;
    void *mine = NULL;
    if (MPI_Win_allocate_shared(c->rank == 0 ? (MPI_Aint)bytes : 0, 1, MPI_INFO_NULL, mc(c), &mine, &s->win) !=
        MPI_SUCCESS) {
        free(s);
        return NULL; /* the ranks of c are not on one host */
    }
    MPI_Aint size = 0;
    int unit = 0;
    CHECK_MPI(MPI_Win_shared_query(s->win, 0, &size, &unit, &s->h.base));
    if (c->rank == 0)
        memset(s->h.base, 0, bytes);
    CHECK_MPI(MPI_Barrier(mc(c))); /* nobody reads before the zeros */
    return (struct comm_shared *)s;
}

static void mpi_shared_free(struct comm_shared *base)
{
    struct mpi_shared *s = (struct mpi_shared *)base;
    CHECK_MPI(MPI_Win_free(&s->win));
    free(s);
}

static const struct comm_backend mpi_backend = {
    .name = "mpi",
    .caps = {.device_memory = false},
    .allreduce_sum = mpi_allreduce_sum,
    .allreduce_max = mpi_allreduce_max,
    .iallreduce_sum = mpi_iallreduce_sum,
    .test = mpi_req_test,
    .wait = mpi_req_wait,
    .allgather = mpi_allgather,
    .allgather_bytes = mpi_allgather_bytes,
    .reduce_scatter_sum = mpi_reduce_scatter_sum,
    .broadcast = mpi_broadcast,
    .broadcast_polled = mpi_broadcast_polled,
    .try_broadcast = mpi_try_broadcast,
    .barrier_polled = mpi_barrier_polled,
    .send = mpi_send,
    .recv = mpi_recv,
    .sendrecv = mpi_sendrecv,
    .alltoallv = mpi_alltoallv,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .split_node = mpi_split_node,
    .fail_alone = mpi_fail_alone,
    .world_ranks = mpi_world_ranks,
    .destroy = mpi_destroy,
    .table_create = mpi_table_create,
    .table_update = mpi_table_update,
    .table_free = mpi_table_free,
    .shared_create = mpi_shared_create,
    .shared_free = mpi_shared_free,
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

struct comm *comm_mpi_world(void)
{
    struct comm *c = mpi_wrap(MPI_COMM_WORLD, false);
    comm_set_name(c, "world");
    return c;
}

struct comm *comm_mpi_adopt(MPI_Comm m) { return mpi_wrap(m, true); }

static bool ft_launch; /* comm_ft_available at MPI_Init: the launch turned ULFM's fault tolerance on */

void comm_mpi_init(int *argc, char ***argv)
{
    /* Colocated ranks share their work-unit table through an MPI window. Among Open MPI 4.1's one-sided
     * components, rdma (and ucx) make a window across hosts on a plain TCP network that then fails
     * (MPI_ERR_WIN: the ranks abort); sm (one host) and pt2pt (any network) always work. Unless the launch chose
     * (mpirun --mca osc ... sets OMPI_MCA_osc), take those two. Read by Open MPI in MPI_Init; others ignore it. */
#if !defined(OMPI_MAJOR_VERSION) || OMPI_MAJOR_VERSION < 5 /* Open MPI 5 has no pt2pt: its own choice stands */
    if (!getenv("OMPI_MCA_osc"))
        setenv("OMPI_MCA_osc", "sm,pt2pt", 0);
#endif
    CHECK_MPI(MPI_Init(argc, argv));
    char why[256];
    ft_launch = comm_ft_available(why, sizeof why);
    check_set_fatal_hook(comm_end_job);
}

void comm_mpi_log_caps(void)
{
    /* the library that runs, not the headers built against: "Open MPI v4.1.4, package: ..." up to the comma */
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS)
        snprintf(lib, sizeof lib, "an MPI of unknown version");
    lib[strcspn(lib, ",\n")] = '\0';
#ifdef GRPO_HAVE_ULFM
    /* MPI_COMM_WORLD's MPIX_FT attribute: the launch enabled ULFM (mpirun --with-ft ulfm, as scripts/mpirun_ft) */
    int *ft = NULL, has = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPIX_FT, &ft, &has);
    if (has && ft && *ft)
        log_info("comm",
                 "MPI: %s with ULFM, fault tolerance on (mpirun --with-ft ulfm): trainer-loss survival is available "
                 "to data parallelism, plain or over TP x PP model copies, colocated or split "
                 "(" KEY_trainer_survive_trainer_loss
                 "=true); elsewhere a lost trainer rank still ends the job (docs/operations.md, \"Open MPI 5 with "
                 "fault tolerance (ULFM)\")",
                 lib);
    else
        log_info("comm",
                 "MPI: %s with ULFM, but this launch did not turn its fault tolerance on (scripts/mpirun_ft, or mpirun "
                 "--with-ft ulfm): trainer-loss survival is unavailable in this job",
                 lib);
#else
    log_info("comm",
             "MPI: %s, without ULFM: trainer-loss survival is unavailable with this MPI (a lost trainer rank ends the "
             "job; it needs Open MPI 5 with ULFM: scripts/mpirun_ft, docs/operations.md)",
             lib);
#endif
}

void comm_mpi_finalize(void) { MPI_Finalize(); }

/* Under a launch with ULFM's fault tolerance on (mpirun --with-ft ulfm) mpirun keeps the job after any rank's end,
 * and MPI_Abort is one rank's end like another: the peers hear of a lost rank. Its mpirun (Open MPI 5.0.11's PRRTE)
 * then reported such a job's end as 0, or never ended once every rank had gone, whenever the abort's message reached
 * it before the process's exit (a failed run's two survivors that both called MPI_Abort, one time in ten): it counts
 * an aborted rank as recoverable, and its exit status as nothing. An exit with the status is always counted as a
 * failure and kept as the job's status. So under that launch a rank ends the job by ending itself with its status;
 * its peers learn of the loss from ULFM, and end too (or, under trainer-loss survival, go on without it). */
void comm_end_job(int code)
{
    if (ft_launch) {
        fflush(NULL);
        _exit(code != 0 ? code : 1);
    }
    check_mpi_end_job(code);
}

bool comm_job_outlives_ranks(void) { return check_mpi_recovery_mode() != 0; }

bool comm_ft_launched(void) { return ft_launch; }

/* Open MPI 4.1 under orte_enable_recovery never ends a job that lost a rank on a host where it had other ranks:
 * that host's daemon tells mpirun of the first abnormal end of a rank of the job only (once per job, as mpirun
 * would normally end the job there and then), and the rank that ended so never counts as terminated on the daemon,
 * so the daemon never reports its host's part of the job as done; mpirun waits for ever. The ranks of a finished
 * run therefore ask mpirun to end the job themselves, through the process manager (PMIx) they were started with:
 * a "terminate" job control, which makes mpirun halt its daemons (they end what is left of their ranks) and exit
 * with the job's status, 0 when nothing failed. PMIx is opened here before MPI_Finalize (which closes MPI's use
 * of it), so that the request can still be made after it. */
#ifdef GRPO_HAVE_PMIX
static bool end_armed;
#endif

void comm_arm_job_end(void)
{
#ifdef GRPO_HAVE_PMIX
    /* only ranks that mpirun (or its daemons) started: they have OMPI_MCA_orte_hnp_uri; srun's direct launch has
     * its own process manager, where a terminate would cancel the step */
    if (end_armed || !check_mpi_recovery_mode() || !getenv("OMPI_MCA_orte_hnp_uri"))
        return;
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc == PMIX_SUCCESS)
        end_armed = true;
    else
        log_warn("comm",
                 "cannot reach mpirun's process manager (PMIx_Init: %s): if a rank of this job was lost, "
                 "end mpirun yourself once the run has finished",
                 PMIx_Error_string(rc));
#endif
}

void comm_end_finished_job(void)
{
#ifdef GRPO_HAVE_PMIX
    if (!end_armed)
        return;
    pmix_info_t info;
    bool yes = true;
    PMIX_INFO_CONSTRUCT(&info);
    PMIX_INFO_LOAD(&info, PMIX_JOB_CTRL_TERMINATE, &yes, PMIX_BOOL);
    pmix_status_t rc = PMIx_Job_control(NULL, 0, &info, 1, NULL, NULL);
    PMIX_INFO_DESTRUCT(&info);
    if (rc != PMIX_SUCCESS && rc != PMIX_OPERATION_SUCCEEDED)
        log_warn("comm", "mpirun did not take the request to end the finished job (%s): end it yourself",
                 PMIx_Error_string(rc));
#endif
}

/* The NCCL back-end needs the MPI communicator under a comm to share its unique id. */
MPI_Comm comm_mpi_handle(struct comm *c);
MPI_Comm comm_mpi_handle(struct comm *c) { return mc(c); }
