/* bf16_gemm_bench: the linear layers' products of SmolLM2-135M on B x S tokens, fp32 (linear_forward /
 * linear_backward, OpenBLAS) against BF16 (linear_forward_bf16 / linear_backward_bf16, kernels/cpu/linear_bf16.c),
 * each timed as the model calls it: forward y = x W^T, backward dx += dy W and dW += dy^T x (the BF16 times include
 * rounding the operands). bench/bf16_gemm_bench_torch.py times torch.nn.functional.linear in fp32 and in bf16 on
 * the same shapes. GFLOP/s per shape and direction, best of REPS; one JSON object per line on stdout.
 *
 *   build/bench/bf16_gemm_bench [--tokens N] [--reps R] [--threads T] */
#include <cblas.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/clock.h"
#include "kernels/cpu/cpu_bf16.h"
#include "kernels/cpu/cpu_kernels.h"

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) * (1.0 / 16777216.0) - 0.5);
    }
}

struct shape {
    const char *name;
    int Din, Dout, count; /* count: how many of it one layer runs */
};

enum op { FWD, BWD_DX, BWD_DW };
static const char *op_name[] = {"fwd", "bwd_dx", "bwd_dw"};

static double time_op(enum op op, bool bf16, int N, const struct shape *s, float *x, float *W, float *y, float *dx,
                      float *dW, int reps)
{
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* the first run warms up (and creates oneDNN's primitive) */
        double t0 = clock_now_s();
        switch (op) {
        case FWD: (bf16 ? linear_forward_bf16 : linear_forward)(y, x, W, NULL, N, s->Din, s->Dout); break;
        case BWD_DX:
            (bf16 ? linear_backward_bf16 : linear_backward)(dx, NULL, NULL, y, x, W, N, s->Din, s->Dout);
            break;
        case BWD_DW:
            (bf16 ? linear_backward_bf16 : linear_backward)(NULL, dW, NULL, y, x, W, N, s->Din, s->Dout);
            break;
        }
        double dt = clock_now_s() - t0;
        if (r > 0 && dt < best)
            best = dt;
    }
    return best;
}

int main(int argc, char **argv)
{
    int N = 1024, reps = 7, threads = 1;
    static const struct option lo[] = {{"tokens", required_argument, 0, 'n'},
                                       {"reps", required_argument, 0, 'r'},
                                       {"threads", required_argument, 0, 't'},
                                       {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'n': N = (int)strtol(optarg, NULL, 10); break;
        case 'r': reps = (int)strtol(optarg, NULL, 10); break;
        case 't': threads = (int)strtol(optarg, NULL, 10); break;
        default: fprintf(stderr, "usage: bf16_gemm_bench [--tokens N] [--reps R] [--threads T]\n"); return 2;
        }
    }
    if (N < 1 || reps < 1 || threads < 1) {
        fprintf(stderr, "bf16_gemm_bench: bad arguments\n");
        return 2;
    }
    cpu_set_threads(threads);
    const bool bf16 = cpu_bf16_gemm_available();
    char blas[256];
    fprintf(stderr, "bf16_gemm_bench: %d tokens, %d thread(s); fp32: %s; bf16: %s\n", N, threads,
            blas_kernels(blas, sizeof blas), cpu_bf16_gemm_name());
    /* SmolLM2-135M: hidden 576, 9 query heads and 3 KV heads of 64, intermediate 1536 */
    const struct shape shapes[] = {
        {"q/o proj 576->576", 576, 576, 2},
        {"k/v proj 576->192", 576, 192, 2},
        {"MLP gate/up 576->1536", 576, 1536, 2},
        {"MLP down 1536->576", 1536, 576, 1},
    };
    const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
    double tot[2] = {0, 0};
    for (int si = 0; si < nshapes; si++) {
        const struct shape *s = &shapes[si];
        float *x = xmalloc((size_t)N * s->Din * sizeof(float)), *W = xmalloc((size_t)s->Dout * s->Din * sizeof(float));
        float *y = xmalloc((size_t)N * s->Dout * sizeof(float)), *dx = xcalloc((size_t)N * s->Din, sizeof(float));
        float *dW = xcalloc((size_t)s->Dout * s->Din, sizeof(float));
        fill(x, (size_t)N * s->Din, 1), fill(W, (size_t)s->Dout * s->Din, 2), fill(y, (size_t)N * s->Dout, 3);
        for (int op = FWD; op <= BWD_DW; op++) {
            const double flops = 2.0 * N * s->Din * s->Dout;
            double t32 = time_op(op, false, N, s, x, W, y, dx, dW, reps);
            double t16 = bf16 ? time_op(op, true, N, s, x, W, y, dx, dW, reps) : NAN;
            /* the product oneDNN runs: forward A B^T; dx A B; dW (dy^T, rounded transposed) B */
            const int M = op == BWD_DW ? s->Dout : N, Nn = op == FWD ? s->Dout : s->Din;
            const int K = op == FWD ? s->Din : op == BWD_DX ? s->Dout : N;
            const char *impl = bf16 ? bf16_gemm_impl(M, Nn, K, op == FWD) : "none";
            printf("{\"what\":\"linear\",\"side\":\"ours\",\"threads\":%d,\"tokens\":%d,\"shape\":\"%s\",\"op\":\"%s\","
                   "\"count\":%d,\"fp32_s\":%.6f,\"bf16_s\":%.6f,\"fp32_gflops\":%.2f,\"bf16_gflops\":%.2f,"
                   "\"bf16_impl\":\"%s\"}\n",
                   threads, N, s->name, op_name[op], s->count, t32, bf16 ? t16 : 0.0, flops / t32 / 1e9,
                   bf16 ? flops / t16 / 1e9 : 0.0, impl);
            fprintf(stderr, "  %-24s %-7s fp32 %7.2f GFLOP/s  bf16 %7.2f GFLOP/s  (x%.2f)  %s\n", s->name, op_name[op],
                    flops / t32 / 1e9, bf16 ? flops / t16 / 1e9 : 0.0, bf16 ? t32 / t16 : 0.0, impl);
            tot[0] += s->count * t32;
            tot[1] += s->count * (bf16 ? t16 : 0);
        }
        free(x), free(W), free(y), free(dx), free(dW);
    }
    printf("{\"what\":\"layer\",\"side\":\"ours\",\"threads\":%d,\"tokens\":%d,\"fp32_s\":%.6f,\"bf16_s\":%.6f,"
           "\"bf16_name\":\"%s\"}\n",
           threads, N, tot[0], tot[1], cpu_bf16_gemm_name());
    fprintf(stderr, "  one layer's linear products, forward + backward: fp32 %.2f ms, bf16 %.2f ms (x%.2f)\n",
            tot[0] * 1e3, tot[1] * 1e3, bf16 ? tot[0] / tot[1] : 0.0);
    return 0;
}
