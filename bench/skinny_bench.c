/* Few-row products y = x W^T (decode steps, short prefills) against OpenBLAS's sgemm on the same machine in one
 * run: our few-row kernel at each ISA this CPU runs (kernels/cpu/skinny.c) and cblas_sgemm, for M rows of x and
 * the weight shapes of SmolLM2-135M (q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536, the LM head
 * 49152x576). Prints GFLOP/s per shape, M and path, best of REPS, and for each M which path is faster: the data
 * behind SKINNY_MAX_ROWS (docs/results/performance.md).
 *
 *   build/bench/skinny_bench [REPS]        (one thread: OPENBLAS_NUM_THREADS=1) */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"
#include "kernels/cpu/cpu_kernels.h"

/* Best seconds of reps calls of path (-1: sgemm, else a skinny ISA) on (M, N, K). */
static double best_time(int path, float *y, const float *x, const float *W, int M, int N, int K, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* one warm-up */
        double t0 = bench_now();
        if (path < 0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, W, K, 0.0f, y, N);
        else
            linear_forward_skinny(y, x, W, M, K, N);
        double dt = bench_now() - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    return best;
}

int main(int argc, char **argv)
{
    const long reps_arg = argc > 1 ? strtol(argv[1], NULL, 10) : 5;
    const int reps = reps_arg >= 1 && reps_arg <= 1000 ? (int)reps_arg : 5;
    static const struct {
        const char *name;
        int N, K;
    } shapes[] = {{"q/o 576x576", 576, 576},
                  {"k/v 192x576", 192, 576},
                  {"gate/up 1536x576", 1536, 576},
                  {"down 576x1536", 576, 1536},
                  {"LM head 49152x576", 49152, 576}};
    static const int Ms[] = {1, 2, 4, 8, 16, 24, 32, 48, 64};
    int isas[2], n_isa = 0;
    if (cpu_force_isa(CPU_ISA_AVX2))
        isas[n_isa++] = CPU_ISA_AVX2;
    if (cpu_force_isa(CPU_ISA_AVX512))
        isas[n_isa++] = CPU_ISA_AVX512;
    printf("few-row products, GFLOP/s (best of %d), one process, %d OpenBLAS thread(s), OpenBLAS %s\n", reps,
           openblas_get_num_threads(), openblas_get_corename());
    printf("%-20s %4s %10s", "shape", "M", "sgemm");
    for (int i = 0; i < n_isa; i++)
        printf(" %10s", cpu_isa_name((enum cpu_isa)isas[i]));
    printf("  faster\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int N = shapes[s].N, K = shapes[s].K, Mmax = Ms[sizeof Ms / sizeof Ms[0] - 1];
        float *W = malloc((size_t)N * K * sizeof(float)), *x = malloc((size_t)Mmax * K * sizeof(float)),
              *y = malloc((size_t)Mmax * N * sizeof(float));
        if (!W || !x || !y) {
            free(W), free(x), free(y);
            return 1;
        }
        bench_fill(W, (size_t)N * K, 7), bench_fill(x, (size_t)Mmax * K, 11);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi];
            const double flops = 2.0 * M * N * K;
            const double tg = best_time(-1, y, x, W, M, N, K, reps);
            printf("%-20s %4d %10.1f", shapes[s].name, M, flops / tg / 1e9);
            double tbest = tg;
            const char *winner = "sgemm";
            for (int i = 0; i < n_isa; i++) {
                cpu_force_isa((enum cpu_isa)isas[i]);
                const double t = best_time(isas[i], y, x, W, M, N, K, reps);
                printf(" %10.1f", flops / t / 1e9);
                if (t < tbest)
                    tbest = t, winner = cpu_isa_name((enum cpu_isa)isas[i]);
            }
            printf("  %s (x%.2f over sgemm)\n", winner, tg / tbest);
        }
        free(W), free(x), free(y);
    }
    cpu_force_isa(CPU_ISA_AUTO);
    return 0;
}
