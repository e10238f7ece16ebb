/* sgemm of three libraries side by side, in one process: OpenBLAS (as the trainer links it, its kernels as
 * kernels/blas_select.c chooses them), BLIS (Debian's serial build) and oneDNN (Debian's), each loaded with
 * dlopen so that their cblas symbols do not collide. The shapes are those of one forward and backward of
 * SmolLM2-135M on 4 x 256 tokens (docs/results/performance.md's model benchmark): the q/o projection, the MLP's up and
 * down, a weight gradient (a transposed operand), and one chunk of the LM head. Each library computes
 * C = A B^T (row-major, as linear_forward does) or C = A^T B (the weight gradient); results are checked
 * against OpenBLAS's. Prints GFLOP/s per shape and library, best of REPS runs.
 *
 *   cc -O2 -o sgemm_bench bench/sgemm_bench.c -ldl && ./sgemm_bench [REPS]
 *
 * Threads: run with OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 for one core (BLIS is the serial build). */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdbool.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"

typedef void (*cblas_sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                               const float *B, int ldb, float beta, float *C, int ldc);
typedef int (*dnnl_sgemm_fn)(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
typedef char *(*corename_fn)(void);

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

struct shape {
    const char *name;
    int M, N, K;
    bool at; /* C = A^T B (A: K x M) instead of C = A B^T (B: N x K) */
};

int main(int argc, char **argv)
{
    const long r0 = argc > 1 ? strtol(argv[1], NULL, 10) : 5;
    const int reps = r0 > 0 && r0 < 1000 ? (int)r0 : 5;
    void *ob = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
    void *bl = dlopen("/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    void *dn = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    cblas_sgemm_fn ob_gemm = ob ? (cblas_sgemm_fn)dlsym(ob, "cblas_sgemm") : NULL;
    cblas_sgemm_fn bl_gemm = bl ? (cblas_sgemm_fn)dlsym(bl, "cblas_sgemm") : NULL;
    dnnl_sgemm_fn dn_gemm = dn ? (dnnl_sgemm_fn)dlsym(dn, "dnnl_sgemm") : NULL;
    corename_fn core = ob ? (corename_fn)dlsym(ob, "openblas_get_corename") : NULL;
    if (!ob_gemm) {
        fprintf(stderr, "OpenBLAS not found: %s\n", dlerror());
        return 1;
    }
    printf("# OpenBLAS %s kernels; BLIS %s; oneDNN %s; best of %d\n", core ? core() : "?",
           bl_gemm ? "serial" : "missing", dn_gemm ? "2.x" : "missing", reps);
    const struct shape shapes[] = {
        {"q/o projection 1024x576x576", 1024, 576, 576, false},
        {"MLP up 1024x1536x576", 1024, 1536, 576, false},
        {"MLP down 1024x576x1536", 1024, 576, 1536, false},
        {"weight grad 1536x576x1024 (A^T B)", 1536, 576, 1024, true},
        {"LM head chunk 64x49152x576", 64, 49152, 576, false},
    };
    printf("| shape | OpenBLAS GFLOP/s | BLIS GFLOP/s | oneDNN GFLOP/s |\n|---|---|---|---|\n");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const struct shape *sh = &shapes[s];
        const size_t M = (size_t)sh->M, N = (size_t)sh->N, K = (size_t)sh->K;
        float *A = malloc(M * K * sizeof(float)), *B = malloc(N * K * sizeof(float));
        float *C = calloc(M * N, sizeof(float)), *R = calloc(M * N, sizeof(float));
        bench_fill(A, M * K, 1 + (unsigned)s), bench_fill(B, N * K, 7 + (unsigned)s);
        double gf[3] = {0, 0, 0}, err[3] = {0, 0, 0};
        for (int lib = 0; lib < 3; lib++) {
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                memset(C, 0, M * N * sizeof(float));
                const double t0 = bench_now();
                if (lib < 2) {
                    cblas_sgemm_fn g = lib == 0 ? ob_gemm : bl_gemm;
                    if (!g)
                        break;
                    if (sh->at) /* A: K x M, B: K x N */
                        g(ROW_MAJOR, TRANS, NO_TRANS, sh->M, sh->N, sh->K, 1.0f, A, sh->M, B, sh->N, 0.0f, C, sh->N);
                    else /* A: M x K, B: N x K */
                        g(ROW_MAJOR, NO_TRANS, TRANS, sh->M, sh->N, sh->K, 1.0f, A, sh->K, B, sh->K, 0.0f, C, sh->N);
                } else {
                    if (!dn_gemm)
                        break;
                    if (sh->at)
                        dn_gemm('T', 'N', sh->M, sh->N, sh->K, 1.0f, A, sh->M, B, sh->N, 0.0f, C, sh->N);
                    else
                        dn_gemm('N', 'T', sh->M, sh->N, sh->K, 1.0f, A, sh->K, B, sh->K, 0.0f, C, sh->N);
                }
                const double t = bench_now() - t0;
                best = t < best ? t : best;
            }
            if (best < 1e30)
                gf[lib] = 2.0 * (double)M * (double)N * (double)K / best / 1e9;
            if (lib == 0)
                memcpy(R, C, M * N * sizeof(float));
            else if (best < 1e30) { /* ||C - R|| / ||R|| */
                double d = 0, w = 0;
                for (size_t i = 0; i < M * N; i++) {
                    d += ((double)C[i] - R[i]) * ((double)C[i] - R[i]);
                    w += (double)R[i] * R[i];
                }
                err[lib] = sqrt(d / (w > 0 ? w : 1));
            }
        }
        printf("| %s | %.1f | %.1f | %.1f |\n", sh->name, gf[0], gf[1], gf[2]);
        if (err[1] > 1e-5 || err[2] > 1e-5)
            printf("| (results differ from OpenBLAS's: BLIS %.2g, oneDNN %.2g relative) | | | |\n", err[1], err[2]);
        free(A), free(B), free(C), free(R);
    }
    return 0;
}
