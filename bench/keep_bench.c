/* What keeping a training step's start costs (trainer.survive_trainer_loss, docs/scaling.md): on N trainable floats
 * (default 134515008, the demo model's), the AdamW step alone, the step that makes the copy as it goes (an armed
 * adamw_keep: each chunk of the weights and both moments copied just before it changes, the copy's stores past the
 * caches), and the copy made before the step by memcpy (how the step's start was kept until 2026-12-07), each
 * the median of REPS runs in turn, with the extra over the step alone. Every buffer is touched before the first
 * timing (the cost of a first touch is the allocation's, once per run).
 *
 *   build/bench/keep_bench [N [REPS]]        (default 134515008 7)
 *
 * The extra a step pays is the column's difference over the step alone; docs/scaling.md sets it against the step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "worker/trainer/optim.h"

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 134515008;
    const int reps = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 7;
    if (n == 0 || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: keep_bench [N [REPS]] (N > 0, 1 <= REPS <= 100)\n");
        return 2;
    }
    struct adamw *o = adamw_create(n, 0.9, 0.999, 1e-8, 0.01);
    float *p = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    float *kp = malloc(n * sizeof(float)), *km = malloc(n * sizeof(float)), *kv = malloc(n * sizeof(float));
    if (!o || !p || !g || !kp || !km || !kv) {
        fprintf(stderr, "keep_bench: out of memory for %zu floats (x 7)\n", n);
        adamw_free(o);
        free(p), free(g), free(kp), free(km), free(kv);
        return 1;
    }
    bench_fill(p, n, 1);
    bench_fill(g, n, 2);
    memset(kp, 0, n * sizeof(float)), memset(km, 0, n * sizeof(float)), memset(kv, 0, n * sizeof(float));
    adamw_step(o, p, g, 1e-6); /* the moments touched */
    double t[3][100];
    struct adamw_keep k = {.p = kp, .m = km, .v = kv};
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        adamw_step(o, p, g, 1e-6);
        t[0][r] = bench_now() - t0;
        k.armed = true, k.kept = false;
        o->keep = &k;
        t0 = bench_now();
        adamw_step(o, p, g, 1e-6);
        t[1][r] = bench_now() - t0;
        t0 = bench_now();
        memcpy(kp, p, n * sizeof(float));
        memcpy(km, o->m, n * sizeof(float));
        memcpy(kv, o->v, n * sizeof(float));
        adamw_step(o, p, g, 1e-6);
        t[2][r] = bench_now() - t0;
    }
    for (int c = 0; c < 3; c++)
        qsort(t[c], (size_t)reps, sizeof(double), cmp_double);
    const double alone = t[0][reps / 2], fused = t[1][reps / 2], before = t[2][reps / 2];
    printf("| trainable floats | AdamW step (s) | keeping as it goes (s) | memcpy, then the step (s) |\n");
    printf("|---|---|---|---|\n");
    printf("| %zu | %.4f | %.4f (+%.4f) | %.4f (+%.4f) |\n", n, alone, fused, fused - alone, before, before - alone);
    adamw_free(o);
    free(p), free(g), free(kp), free(km), free(kv);
    return 0;
}
