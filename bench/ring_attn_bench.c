/* Ring attention (worker/model/ring_attn.c) against one rank's whole-row attention, under mpirun -np C:
 *   mpirun -np C build-dev/bench/ring_attn_bench L HQ HKV HD [REPS]
 * prints, for one causal row of L tokens: the slowest rank's forward and backward (the best of REPS; at C = 1 that
 * is the kernel's whole-row attention alone, the baseline), the bytes a rank sends, the pairs each rank scores, and
 * the attention tensors a rank keeps for the backward (q, k, v, out, lse) against the whole row's, with the ring's
 * buffers and scratch that exist while it runs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"
#include "common/check.h"
#include "common/check_mpi.h"
#include "kernels/kernels.h"
#include "worker/comm/comm.h"
#include "worker/model/ring_attn.h"

/* A positive integer argument, or -1 (named on stderr by the caller's usage line). */
static int arg_int(const char *s)
{
    char *end;
    const long v = strtol(s, &end, 10);
    return *s && !*end && v > 0 && v <= 1 << 30 ? (int)v : -1;
}

static double slowest(struct comm *w, double t)
{
    comm_allreduce_max(w, &t, 1, COMM_F64);
    return t;
}

int main(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *w = comm_mpi_world();
    if (argc < 5) {
        if (comm_rank(w) == 0)
            fprintf(stderr, "usage: mpirun -np C ring_attn_bench L HQ HKV HD [REPS]\n");
        MPI_Finalize();
        return 2;
    }
    const int L = arg_int(argv[1]), Hq = arg_int(argv[2]), Hkv = arg_int(argv[3]), hd = arg_int(argv[4]);
    const int reps = argc > 5 ? arg_int(argv[5]) : 3, C = comm_size(w), r = comm_rank(w);
    if (L < 0 || Hq < 0 || Hkv < 0 || hd < 0 || reps < 0) {
        if (r == 0)
            fprintf(stderr, "ring_attn_bench: L, HQ, HKV, HD and REPS must be positive integers\n");
        MPI_Finalize();
        return 2;
    }
    const int32_t cu[2] = {0, L};
    struct ring_attn ra;
    char why[256];
    if (ring_attn_plan(&ra, kctx_cpu(), w, L, cu, 1, NULL, 0, Hq, Hkv, hd, why, sizeof why) != 0) {
        if (r == 0)
            fprintf(stderr, "ring_attn_bench: %s\n", why);
        MPI_Finalize();
        return 2;
    }
    const size_t nq = (size_t)L * Hq * hd, nk = (size_t)L * Hkv * hd, n = 2 * (size_t)ra.c;
    float *q = xmalloc(nq * sizeof(float)), *k = xmalloc(nk * sizeof(float)), *v = xmalloc(nk * sizeof(float));
    float *g = xmalloc(nq * sizeof(float));
    bench_fill(q, nq, 1), bench_fill(k, nk, 2), bench_fill(v, nk, 3), bench_fill(g, nq, 4);
    const size_t lq = n * Hq * hd, lk = n * Hkv * hd;
    float *mq = xmalloc(lq * sizeof(float)), *mk = xmalloc(lk * sizeof(float)), *mv = xmalloc(lk * sizeof(float));
    float *mg = xmalloc(lq * sizeof(float)), *out = xmalloc(lq * sizeof(float)), *lse = xmalloc(n * Hq * sizeof(float));
    float *dq = xcalloc(lq, sizeof(float)), *dk = xcalloc(lk, sizeof(float)), *dv = xcalloc(lk, sizeof(float));
    ring_attn_take(&ra, mq, q, Hq * hd), ring_attn_take(&ra, mk, k, Hkv * hd), ring_attn_take(&ra, mv, v, Hkv * hd);
    ring_attn_take(&ra, mg, g, Hq * hd);

    double fwd = INFINITY, bwd = INFINITY;
    for (int i = 0; i < reps; i++) {
        comm_barrier(w);
        double t0 = bench_now();
        ring_attn_forward(&ra, out, lse, mq, mk, mv);
        double t1 = bench_now();
        ring_attn_backward(&ra, dq, dk, dv, mg, out, lse, mq, mk, mv);
        double t2 = bench_now();
        fwd = fmin(fwd, slowest(w, t1 - t0)), bwd = fmin(bwd, slowest(w, t2 - t1));
    }
    long long pairs[2] = {(long long)(ra.stats.scores / (unsigned long long)reps), 0};
    pairs[1] = -pairs[0];
    comm_allreduce_max(w, pairs, 2, COMM_I64);

    if (r == 0) {
        /* what the backward keeps of the attention (q, k, v, out, lse) and what the ring adds while it runs */
        const double kept = (double)(2 * lq + 2 * lk + n * Hq) * 4,
                     whole = (double)(2 * nq + 2 * nk + (size_t)L * Hq) * 4;
        const double ring = C > 1 ? 2.0 * 4 * lk * 4 : 0.0, scratch = (C > 1 ? 2.0 * 64 * n * 4 : 0.0) + 8.0 * L;
        printf("C=%d L=%d Hq=%d Hkv=%d hd=%d: forward %.1f ms, backward %.1f ms (slowest rank); sent per rank %.0f + "
               "%.0f bytes; pairs per rank %lld..%lld; kept for the backward per rank %.2f MB (whole row %.2f MB), "
               "ring buffers %.2f MB, scratch %.2f MB (a thread's, and the row's maps)\n",
               C, L, Hq, Hkv, hd, fwd * 1e3, bwd * 1e3, ring_attn_bytes(C, ra.c, Hkv, hd, 0),
               ring_attn_bytes(C, ra.c, Hkv, hd, 1), -pairs[1], pairs[0], kept / 1e6, whole / 1e6, ring / 1e6,
               scratch / 1e6);
    }
    free(q), free(k), free(v), free(g), free(mq), free(mk), free(mv), free(mg), free(out), free(lse), free(dq),
        free(dk), free(dv);
    ring_attn_free(&ra);
    comm_free(w);
    MPI_Finalize();
    return 0;
}
