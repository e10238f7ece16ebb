/* sgemm over the pool's threads. The CPU back-end has one set of threads, pool.c's: OpenBLAS runs single-threaded
 * and every product that is worth splitting is cut into parts here, one OpenBLAS call each.
 *
 * Why not OpenBLAS's own threads: its idle threads spin (sched_yield in a loop) for a while after each call. Next
 * to pool.c's helpers, which run the BF16 products and the few-row kernel, three busy threads then shared two
 * cores: with BF16 GEMMs at 2 threads a third of the time went to sched_yield and forward+backward ran barely
 * faster than at one thread (perf, docs/results/performance.md). One set of threads that sleep when idle removes that.
 *
 * A part computes whole rows (or whole columns) of C, over all of K: the same thread count gives the same bits
 * every time, but another count may change the last bits (OpenBLAS picks its kernel by the size of each part, as
 * its own threads did). */
#include <cblas.h>

#include "cpu_kernels.h"
#include "pool.h"

struct gemm_job {
    bool ta, tb, by_rows;
    int M, N, K, lda, ldb, ldc, extent;
    float alpha, beta;
    const float *A, *B;
    float *C;
};

static void gemm_part(void *arg, int part, int parts)
{
    const struct gemm_job *j = arg;
    const int lo = (int)((long)j->extent * part / parts), hi = (int)((long)j->extent * (part + 1) / parts);
    if (lo >= hi)
        return;
    const enum CBLAS_TRANSPOSE ta = j->ta ? CblasTrans : CblasNoTrans, tb = j->tb ? CblasTrans : CblasNoTrans;
    if (j->by_rows) /* rows lo..hi of op(A) and C: A (M, K) from row lo, or A (K, M) from column lo */
        cblas_sgemm(CblasRowMajor, ta, tb, hi - lo, j->N, j->K, j->alpha,
                    j->A + (j->ta ? (size_t)lo : (size_t)lo * j->lda), j->lda, j->B, j->ldb, j->beta,
                    j->C + (size_t)lo * j->ldc, j->ldc);
    else /* columns lo..hi of op(B) and C: B (K, N) from column lo, or B (N, K) from row lo */
        cblas_sgemm(CblasRowMajor, ta, tb, j->M, hi - lo, j->K, j->alpha, j->A, j->lda,
                    j->B + (j->tb ? (size_t)lo * j->ldb : (size_t)lo), j->ldb, j->beta, j->C + lo, j->ldc);
}

/* Products below this many multiply-adds run on the calling thread alone (waking a helper costs more). */
enum { GEMM_SPLIT_MIN_MACS = 1 << 20, GEMM_MIN_PART = 16 };

void cpu_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    struct gemm_job j = {.A = A, .B = B, .C = C};
    j.ta = ta, j.tb = tb, j.M = M, j.N = N, j.K = K, j.lda = lda, j.ldb = ldb, j.ldc = ldc;
    j.alpha = alpha, j.beta = beta;
    j.by_rows = M >= N;
    j.extent = j.by_rows ? M : N;
    int parts = cpu_pool_threads();
    if (parts > j.extent / GEMM_MIN_PART)
        parts = j.extent / GEMM_MIN_PART;
    if (parts < 1 || (double)M * N * K < GEMM_SPLIT_MIN_MACS)
        parts = 1;
    cpu_run_parts(parts, gemm_part, &j);
}
