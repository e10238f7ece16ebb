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
#include "worker/flight/flight.h"

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

/* all-to-all with uneven blocks: rank r sends (r + p) % 3 + 1 values to rank p (a zero-length block when r = p = 0
 * is tried too, by sending nothing to self on rank 0), each naming sender, receiver and position */
static size_t a2a_count(int from, int to) { return from == 0 && to == 0 ? 0 : (size_t)((from + to) % 3 + 1); }
static float a2a_val(int from, int to, size_t k) { return (float)(from * 1000 + to * 10 + (int)k); }
static void check_alltoall(struct comm *c, const char *what)
{
    const int r = comm_rank(c), s = comm_size(c);
    size_t sc[64], rc[64], ns = 0, nr = 0;
    for (int p = 0; p < s && p < 64; p++) {
        sc[p] = a2a_count(r, p);
        rc[p] = a2a_count(p, r);
        ns += sc[p];
        nr += rc[p];
    }
    float *send = xmalloc((ns + 1) * sizeof *send), *recv = xmalloc((nr + 1) * sizeof *recv);
    for (int p = 0, o = 0; p < s; p++)
        for (size_t k = 0; k < sc[p]; k++)
            send[o++] = a2a_val(r, p, k);
    comm_traffic_reset(c);
    comm_alltoallv(c, send, sc, recv, rc, COMM_F32);
    for (int p = 0, o = 0; p < s; p++)
        for (size_t k = 0; k < rc[p]; k++, o++)
            EXPECT(recv[o] == a2a_val(p, r, k), "%s all-to-all: block from rank %d [%zu] = %g, want %g", what, p, k,
                   recv[o], a2a_val(p, r, k));
    struct comm_traffic tr;
    comm_traffic(c, &tr);
    const double want = (double)(ns - sc[r]) * sizeof(float);
    EXPECT(tr.calls[COMM_OP_ALLTOALL] == 1 && tr.sent_f32[COMM_OP_ALLTOALL] == want &&
               tr.payload[COMM_OP_ALLTOALL] == (double)ns * sizeof(float),
           "%s all-to-all traffic: %llu calls, %g bytes sent, want 1 and %g", what, tr.calls[COMM_OP_ALLTOALL],
           tr.sent_f32[COMM_OP_ALLTOALL], want);
    free(send);
    free(recv);
}

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

/* Within group c every member's coordinates agree on the fields `same` marks (tp, pp, dp, cp, ep, dp / ep, and
 * ep x TP + tp) and differ by the group rank in `pos`: a group made of the wrong ranks fails. */
enum { F_TP, F_PP, F_DP, F_CP, F_EP, F_EGROUP, F_ETP, F_N };
static void coords_fields(const struct parallel_coords *a, int32_t *f)
{
    f[F_TP] = a->tp_rank;
    f[F_PP] = a->pp_rank;
    f[F_DP] = a->dp_rank;
    f[F_CP] = a->cp_rank;
    f[F_EP] = a->ep_rank;
    f[F_EGROUP] = a->dp_rank / a->ep_size;
    f[F_ETP] = a->ep_rank * a->tp_size + a->tp_rank;
}
static void check_members(struct comm *c, const struct parallel_coords *at, const char *what, const int *same,
                          int nsame, int pos)
{
    const int s = comm_size(c);
    int32_t mine[F_N], *all = xmalloc((size_t)s * F_N * sizeof *all);
    coords_fields(at, mine);
    comm_allgather(c, mine, all, F_N, COMM_I32);
    for (int m = 0; m < s; m++) {
        for (int k = 0; k < nsame; k++)
            EXPECT(all[m * F_N + same[k]] == mine[same[k]], "%s group: member %d has field %d = %d, this rank %d", what,
                   m, same[k], all[m * F_N + same[k]], mine[same[k]]);
        if (pos >= 0)
            EXPECT(all[m * F_N + pos] == m, "%s group: member %d is at %d", what, m, all[m * F_N + pos]);
    }
    free(all);
}

static void check_sequence_groups(const struct parallel_groups *g, struct comm *world)
{
    const struct parallel_coords *a = &g->at;
    const int w = comm_size(world), T = a->tp_size, P = a->pp_size, C = a->cp_size, E = a->ep_size;
    EXPECT(C * T * P * a->dp_size == w && a->dp_size % E == 0, "sizes cp %d ep %d dp %d", C, E, a->dp_size);
    EXPECT(parallel_grad_group(g) == (C > 1 ? g->dpcp : g->dp), "the gradients' group");
    EXPECT((C > 1) == (g->cp != NULL) && (E > 1) == (g->ep != NULL), "cp/ep groups made only above size 1");
    if (g->cp) {
        EXPECT(comm_size(g->cp) == C && comm_size(g->dpcp) == C * a->dp_size, "cp %d dpcp %d", comm_size(g->cp),
               comm_size(g->dpcp));
        check_members(g->cp, a, "cp", (const int[]){F_TP, F_PP, F_DP}, 3, F_CP);
        check_members(g->dpcp, a, "dpcp", (const int[]){F_TP, F_PP}, 2, -1);
        /* the ranks sharing a sequence sit next to each other after TP: world rank differs by tp_size per CP rank */
        int32_t wr = comm_rank(world), first = wr;
        comm_broadcast(g->cp, &first, 1, COMM_I32, 0);
        EXPECT(wr - first == a->cp_rank * T, "CP group not after TP: rank %d, group starts at %d", wr, first);
        check_alltoall(g->cp, "cp");
    }
    if (g->ep) {
        EXPECT(comm_size(g->ep) == E && comm_size(g->edp) == a->dp_size / E, "ep %d edp %d", comm_size(g->ep),
               comm_size(g->edp));
        check_members(g->ep, a, "ep", (const int[]){F_TP, F_PP, F_CP, F_EGROUP}, 4, F_EP);
        check_members(g->edp, a, "edp", (const int[]){F_TP, F_PP, F_CP, F_EP}, 4, F_EGROUP);
        check_alltoall(g->ep, "ep");
    }
    /* EP x TP: one model copy's ranks, ranked ep x TP + tp */
    EXPECT((E > 1 && T > 1) == (g->etp != NULL), "the etp group made only with EP and TP above 1");
    if (g->etp) {
        EXPECT(comm_size(g->etp) == E * T, "etp %d", comm_size(g->etp));
        check_members(g->etp, a, "etp", (const int[]){F_PP, F_CP, F_EGROUP}, 3, F_ETP);
    }
}

int main(int argc, char **argv)
{
    int tp = 1, pp = 1, cp = 1, ep = 1;
    size_t n = 1000;
    double deadline = 0;
    const char *stuck = NULL;      /* --stuck-peer OP: the last rank sleeps while the others run OP */
    const char *flight_dir = NULL; /* --flight-dir DIR: the flight recorder on, dumping into DIR */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--tp") == 0)
            tp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--pp") == 0)
            pp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--cp") == 0)
            cp = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--ep") == 0)
            ep = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--elements") == 0)
            n = (size_t)atol(argv[i + 1]);
        else if (strcmp(argv[i], "--deadline") == 0)
            deadline = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--stuck-peer") == 0)
            stuck = argv[i + 1];
        else if (strcmp(argv[i], "--flight-dir") == 0)
            flight_dir = argv[i + 1];
    }
    if (flight_dir)
        flight_init(16);
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
            sleep(8); /* sleep-ok: a late peer, on purpose */
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
    if (stuck) {          /* a stuck peer: the others' operation must end the job at the deadline, naming itself */
        if (flight_dir) { /* three sums with every rank first: the dump at the deadline holds them, then the stuck one
                           */
            flight_set_rank(comm_rank(world));
            flight_set_dump_dir(flight_dir);
            for (int i = 0; i < 3; i++) {
                double y = 1;
                comm_allreduce_sum(world, &y, 1, COMM_F64);
            }
        }
        if (comm_rank(world) == comm_size(world) - 1) {
            sleep(60); /* sleep-ok: a stuck peer, on purpose */
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
    const struct parallel_sizes sz = {.tp = tp, .pp = pp, .cp = cp, .ep = ep};
    if (parallel_groups_init_sized(&g, world, &sz) != 0) {
        log_error("test", "bad layout tp=%d pp=%d cp=%d ep=%d for %d ranks", tp, pp, cp, ep, comm_size(world));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* group sizes and the coordinate <-> rank mapping */
    EXPECT(comm_size(g.tp) == tp && comm_size(g.pp) == pp && comm_size(g.dp) == comm_size(world) / (tp * pp * cp),
           "group sizes tp=%d pp=%d dp=%d", comm_size(g.tp), comm_size(g.pp), comm_size(g.dp));
    check_sequence_groups(&g, world);
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
    check_alltoall(world, "world");
    check_alltoall(g.dp, "dp");
    check_alltoall(g.tp, "tp");
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
