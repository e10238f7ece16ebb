/* The collective plane over MPI, run under mpirun: every collective in every
 * group of the requested layout, checked against closed-form expectations.
 * Exit 0 only if every rank saw every value right. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/check_mpi.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/comm/comm.h"
#include "worker/comm/parallel.h"

static int g_bad;

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            g_bad++;                                                                                                   \
            log_error("test", __VA_ARGS__);                                                                            \
        }                                                                                                              \
    } while (0)

/* value that rank r contributes at index i */
static float val(int r, size_t i) { return (float)((r + 1) * 0.5 + (double)(i % 97)); }

static void check_group(struct comm *c, const char *what, size_t n)
{
    int r = comm_rank(c), s = comm_size(c);
    comm_traffic_reset(c);
    float *buf = xmalloc(n * sizeof *buf);
    /* allreduce: sum_r val(r,i) = sum_r (r+1)/2 + s*(i%97) */
    for (size_t i = 0; i < n; i++)
        buf[i] = val(r, i);
    comm_allreduce_sum(c, buf, n, COMM_F32);
    double base = 0.5 * s * (s + 1) / 2.0;
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(base + s * (double)(i % 97))) {
            EXPECT(0, "%s allreduce[%zu] = %g, want %g", what, i, buf[i], base + s * (double)(i % 97));
            break;
        }
    /* non-blocking sums of three pieces, started in order, tested, then waited: each piece's closed form, and the
     * traffic counted as the blocking sum's */
    for (size_t i = 0; i < n; i++)
        buf[i] = val(r, i);
    struct comm_traffic t0, t1;
    comm_traffic(c, &t0);
    const size_t cut[4] = {0, n / 3, n / 3 + n / 4, n};
    struct comm_req *req[3];
    for (int k = 0; k < 3; k++) {
        req[k] = comm_iallreduce_sum(c, buf + cut[k], cut[k + 1] - cut[k], COMM_F32, NULL);
        for (int j = 0; j < k; j++)
            comm_test(req[j]);
    }
    for (int k = 0; k < 3; k++)
        comm_wait(req[k]);
    comm_traffic(c, &t1);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(base + s * (double)(i % 97))) {
            EXPECT(0, "%s iallreduce[%zu] = %g, want %g", what, i, buf[i], base + s * (double)(i % 97));
            break;
        }
    EXPECT(t1.calls[COMM_OP_ALLREDUCE] - t0.calls[COMM_OP_ALLREDUCE] == 3 &&
               t1.payload[COMM_OP_ALLREDUCE] - t0.payload[COMM_OP_ALLREDUCE] == (double)n * sizeof(float),
           "%s iallreduce traffic: %llu calls, %g bytes", what,
           t1.calls[COMM_OP_ALLREDUCE] - t0.calls[COMM_OP_ALLREDUCE],
           t1.payload[COMM_OP_ALLREDUCE] - t0.payload[COMM_OP_ALLREDUCE]);
    /* allreduce max: the largest rank's value */
    for (size_t i = 0; i < n; i++)
        buf[i] = val(r, i);
    comm_allreduce_max(c, buf, n, COMM_F32);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != val(s - 1, i)) {
            EXPECT(0, "%s allreduce_max[%zu] = %g, want %g", what, i, buf[i], val(s - 1, i));
            break;
        }
    /* sendrecv around the ring: each rank gets its left neighbour's values */
    float *mine = xmalloc(n * sizeof *mine);
    for (size_t i = 0; i < n; i++)
        mine[i] = val(r, i);
    if (s > 1)
        comm_sendrecv(c, mine, n, (r + 1) % s, buf, n, (r + s - 1) % s, COMM_F32);
    for (size_t i = 0; s > 1 && i < n; i++)
        if (buf[i] != val((r + s - 1) % s, i)) {
            EXPECT(0, "%s sendrecv[%zu] = %g, want %g", what, i, buf[i], val((r + s - 1) % s, i));
            break;
        }
    free(mine);
    /* allgather: block q holds rank q's values */
    float *all = xmalloc(n * (size_t)s * sizeof *all);
    for (size_t i = 0; i < n; i++)
        buf[i] = val(r, i);
    comm_allgather(c, buf, all, n, COMM_F32);
    for (int q = 0; q < s; q++)
        for (size_t i = 0; i < n; i++)
            if (all[(size_t)q * n + i] != val(q, i)) {
                EXPECT(0, "%s allgather block %d [%zu] wrong", what, q, i);
                q = s;
                break;
            }
    /* reduce-scatter: rank r keeps the sum of block r */
    for (int q = 0; q < s; q++)
        for (size_t i = 0; i < n; i++)
            all[(size_t)q * n + i] = val(r, i) + (float)q;
    comm_reduce_scatter_sum(c, all, buf, n, COMM_F32);
    for (size_t i = 0; i < n; i++)
        if (buf[i] != (float)(base + s * (double)(i % 97) + (double)s * r)) {
            EXPECT(0, "%s reduce_scatter[%zu] = %g", what, i, buf[i]);
            break;
        }
    /* broadcast from the last rank */
    int64_t token = r == s - 1 ? 1234567890123LL : -1;
    comm_broadcast(c, &token, 1, COMM_I64, s - 1);
    EXPECT(token == 1234567890123LL, "%s broadcast got %lld", what, (long long)token);
    /* ring send/recv: even ranks send first to avoid deadlock with blocking calls */
    if (s > 1) {
        int32_t out = 1000 + r, in = -1;
        int next = (r + 1) % s, prev = (r + s - 1) % s;
        if (r % 2 == 0) {
            comm_send(c, &out, 1, COMM_I32, next);
            comm_recv(c, &in, 1, COMM_I32, prev);
        } else {
            comm_recv(c, &in, 1, COMM_I32, prev);
            comm_send(c, &out, 1, COMM_I32, next);
        }
        EXPECT(in == 1000 + prev, "%s ring recv got %d, want %d", what, in, 1000 + prev);
    }
    comm_barrier(c);
    /* the traffic counted, by the ring model worked by hand: all-reduces (sum, max, and the three non-blocking pieces
     * of n in all) 2(s-1)/s of 4n bytes each,
     * all-gather and reduce-scatter (s-1)/s of the 4ns-byte whole, the broadcast's 8 bytes sent by its root, one
     * 4-byte send and the sendrecv's 4n bytes */
    struct comm_traffic tr;
    comm_traffic(c, &tr);
    const double B = 4.0 * (double)n;
    EXPECT(tr.calls[COMM_OP_ALLREDUCE] == 5 && tr.calls[COMM_OP_ALLGATHER] == 1 &&
               tr.calls[COMM_OP_REDUCE_SCATTER] == 1 && tr.calls[COMM_OP_BROADCAST] == 1 &&
               tr.calls[COMM_OP_SEND] == (s > 1 ? 2u : 0u) && tr.sent_f32[COMM_OP_SEND] == (s > 1 ? B : 0),
           "%s traffic: wrong call counts", what);
    EXPECT(tr.payload[COMM_OP_ALLREDUCE] == 3 * B && tr.payload[COMM_OP_ALLGATHER] == B &&
               tr.payload[COMM_OP_REDUCE_SCATTER] == B * s,
           "%s traffic: wrong payloads", what);
    EXPECT(tr.sent_f32[COMM_OP_ALLREDUCE] == (s > 1 ? 6.0 * (s - 1) / s * B : 0) &&
               tr.sent_f32[COMM_OP_ALLGATHER] == (s > 1 ? (double)(s - 1) * B : 0) &&
               tr.sent_f32[COMM_OP_REDUCE_SCATTER] == (s > 1 ? (double)(s - 1) * B : 0),
           "%s traffic: f32 bytes sent %g %g %g, want the ring model's", what, tr.sent_f32[COMM_OP_ALLREDUCE],
           tr.sent_f32[COMM_OP_ALLGATHER], tr.sent_f32[COMM_OP_REDUCE_SCATTER]);
    EXPECT(tr.sent_other[COMM_OP_BROADCAST] == (s > 1 && r == s - 1 ? 8.0 : 0) &&
               tr.sent_other[COMM_OP_SEND] == (s > 1 ? 4.0 : 0),
           "%s traffic: other bytes sent %g (broadcast), %g (send)", what, tr.sent_other[COMM_OP_BROADCAST],
           tr.sent_other[COMM_OP_SEND]);
    free(all);
    free(buf);
}

/* What a launch uses: the capabilities, the byte all-gather (an odd size, counted in bytes) and the node split
 * (every rank of the test runs on this host). */
static void check_launch_primitives(struct comm *w)
{
    const int r = comm_rank(w), s = comm_size(w);
    EXPECT(!comm_caps(w)->device_memory, "the MPI back-end advertises device memory");
    char mine[7], *all = xcalloc((size_t)s, sizeof mine);
    for (size_t i = 0; i < sizeof mine; i++)
        mine[i] = (char)('a' + (r * 7 + (int)i) % 26);
    struct comm_traffic before, after;
    comm_traffic(w, &before);
    comm_allgather_bytes(w, mine, all, sizeof mine);
    comm_traffic(w, &after);
    for (int q = 0; q < s; q++)
        for (size_t i = 0; i < sizeof mine; i++)
            if (all[(size_t)q * sizeof mine + i] != (char)('a' + (q * 7 + (int)i) % 26)) {
                EXPECT(0, "allgather_bytes block %d [%zu] wrong", q, i);
                q = s;
                break;
            }
    EXPECT(after.calls[COMM_OP_ALLGATHER] == before.calls[COMM_OP_ALLGATHER] + 1 &&
               after.payload[COMM_OP_ALLGATHER] == before.payload[COMM_OP_ALLGATHER] + (double)sizeof mine,
           "allgather_bytes traffic: %llu calls, %g bytes", after.calls[COMM_OP_ALLGATHER],
           after.payload[COMM_OP_ALLGATHER]);
    free(all);
    struct comm *node = comm_split_node(w, r), *back = comm_split_node(w, -r);
    EXPECT(comm_size(node) == s && comm_rank(node) == r, "node split: rank %d of %d, want %d of %d", comm_rank(node),
           comm_size(node), r, s);
    EXPECT(comm_rank(back) == s - 1 - r, "node split by descending key: rank %d, want %d", comm_rank(back), s - 1 - r);
    EXPECT(node->deadline_s == w->deadline_s, "node split: deadline %g, not its parent's %g", node->deadline_s,
           w->deadline_s);
    int32_t one = 1;
    comm_allreduce_sum(node, &one, 1, COMM_I32);
    EXPECT(one == s, "an all-reduce over the node's group summed %d ranks, want %d", one, s);
    comm_free(back);
    comm_free(node);
}

/* comm_table: every rank adds to shared counters under the lock, many times, while the others do too: no update is
 * lost (each read-modify-write is whole), and each rank's own slot counts its calls. */
static void bump(void *ud, int64_t *v)
{
    const int r = *(const int *)ud;
    v[0]++;
    v[1 + r]++;
}

static void peek(void *ud, int64_t *v) { (void)ud, (void)v; }

static void check_table(struct comm *w)
{
    const int r = comm_rank(w), s = comm_size(w), times = 200;
    struct comm_table *t = comm_table_create(w, (size_t)s + 1);
    EXPECT(t != NULL, "the MPI back-end has no comm_table");
    if (!t)
        return;
    int64_t *v = xcalloc((size_t)s + 1, sizeof *v);
    for (int i = 0; i < times; i++)
        comm_table_update(t, v, bump, (void *)&r);
    comm_barrier(w);
    int64_t last[2] = {0, 0};
    comm_table_update(t, v, peek, NULL); /* read it, everyone's updates done */
    last[0] = v[0];
    last[1] = v[1 + r];
    EXPECT(last[0] == (int64_t)times * s, "comm_table: %lld updates counted, want %d", (long long)last[0], times * s);
    EXPECT(last[1] == times, "comm_table: rank %d's slot %lld, want %d", r, (long long)last[1], times);
    free(v);
    comm_table_free(t);
}

int main(int argc, char **argv)
{
    int tp = 1, pp = 1;
    size_t n = 1000;
    double deadline = 0;
    const char *stuck = NULL; /* --stuck-peer OP: the last rank sleeps while the others run OP */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--tp") == 0)
            tp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--pp") == 0)
            pp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--elements") == 0)
            n = (size_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--deadline") == 0)
            deadline = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--stuck-peer") == 0)
            stuck = argv[i + 1];
    }
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    log_set_rank(comm_rank(world));
    /* every group below is split from world: they inherit its deadline (every operation non-blocking, tested) */
    comm_set_deadline(world, deadline);
    if (stuck && strcmp(stuck, "try_broadcast") == 0) {
        /* the root comes late: the others' comm_try_broadcast gives the group up at the deadline, without ending
         * the job, and a second one returns at once; the root's late broadcast then completes their requests */
        const int root = comm_size(world) - 1;
        double x = comm_rank(world) == root ? 42 : 0;
        if (comm_rank(world) == root) {
            sleep(8);
            int rc = comm_try_broadcast(world, &x, 1, COMM_F64, root);
            printf("late root: rc %d\n", rc);
            MPI_Finalize();
            return 0;
        }
        const double t0 = clock_now_s();
        int rc = comm_try_broadcast(world, &x, 1, COMM_F64, root);
        const double t1 = clock_now_s();
        int rc2 = comm_try_broadcast(world, &x, 1, COMM_F64, root);
        const double t2 = clock_now_s();
        printf("rank %d gave up: rc %d after %.1f s; again: rc %d after %.3f s\n", comm_rank(world), rc, t1 - t0, rc2,
               t2 - t1);
        fflush(stdout);
        MPI_Finalize();
        return rc == -1 && rc2 == -1 ? 0 : 1;
    }
    if (stuck) { /* a stuck peer: the others' operation must end the job at the deadline, naming itself */
        if (comm_rank(world) == comm_size(world) - 1) {
            sleep(60);
            MPI_Finalize();
            return 0;
        }
        double x = 1;
        if (strcmp(stuck, "allreduce") == 0)
            comm_allreduce_sum(world, &x, 1, COMM_F64);
        else if (strcmp(stuck, "iallreduce") == 0)
            comm_wait(comm_iallreduce_sum(world, &x, 1, COMM_F64, NULL));
        else
            comm_recv(world, &x, 1, COMM_F64, comm_size(world) - 1);
        printf("returned without its peer\n");
        MPI_Finalize();
        return 1;
    }
    struct parallel_groups g;
    if (parallel_groups_init(&g, world, tp, pp) != 0) {
        log_error("test", "bad layout tp=%d pp=%d for %d ranks", tp, pp, comm_size(world));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* group sizes and the coordinate <-> rank mapping */
    EXPECT(comm_size(g.tp) == tp && comm_size(g.pp) == pp && comm_size(g.dp) == comm_size(world) / (tp * pp),
           "group sizes tp=%d pp=%d dp=%d", comm_size(g.tp), comm_size(g.pp), comm_size(g.dp));
    EXPECT(comm_rank(g.tp) == g.at.tp_rank && comm_rank(g.dp) == g.at.dp_rank && comm_rank(g.pp) == g.at.pp_rank,
           "ranks inside groups disagree with coordinates");
    EXPECT(parallel_rank_of(&g.at) == comm_rank(world), "rank_of(coords_of(r)) != r");
    /* TP groups are contiguous world ranks (same node in practice) */
    int32_t wr = comm_rank(world), first = wr;
    comm_broadcast(g.tp, &first, 1, COMM_I32, 0);
    EXPECT(wr - first == g.at.tp_rank, "TP group not contiguous: rank %d, group starts at %d", wr, first);

    check_group(world, "world", n);
    check_group(g.dp, "dp", n);
    check_group(g.tp, "tp", n);
    check_group(g.pp, "pp", n);
    check_launch_primitives(world);
    check_table(world);

    comm_allreduce_sum(world, &g_bad, 1, COMM_I32);
    if (comm_rank(world) == 0)
        printf("%s: %d ranks tp=%d pp=%d, %zu elements, %d failure(s)\n", g_bad ? "FAIL" : "ok", comm_size(world), tp,
               pp, n, g_bad);
    parallel_groups_free(&g);
    comm_free(world);
    MPI_Finalize();
    return g_bad ? 1 : 0;
}
