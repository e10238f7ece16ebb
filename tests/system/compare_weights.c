/* compare_weights DIR_A DIR_B [REL_TOL]: load two checkpoints (Hugging Face layout) of the same architecture
 * and compare every parameter. Exit 0 when max|a - b| <= REL_TOL x max|a| (REL_TOL 0: bit-identical), else 1
 * with the worst difference printed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/model/model_io.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: compare_weights DIR_A DIR_B [REL_TOL]\n");
        return 2;
    }
    double tol = argc > 3 ? atof(argv[3]) : 0;
    char err[1024];
    struct model *a = model_load(argv[1], err, sizeof err);
    if (!a) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    struct model *b = model_load(argv[2], err, sizeof err);
    if (!b) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (a->w.n_floats != b->w.n_floats) {
        fprintf(stderr, "parameter counts differ: %zu and %zu\n", a->w.n_floats, b->w.n_floats);
        return 1;
    }
    double maxdiff = 0, maxabs = 0;
    size_t at = 0, differ = 0;
    for (size_t i = 0; i < a->w.n_floats; i++) {
        double d = fabs((double)a->w.mem[i] - b->w.mem[i]);
        differ += a->w.mem[i] != b->w.mem[i];
        if (d > maxdiff || isnan(d)) {
            maxdiff = isnan(d) ? INFINITY : d;
            at = i;
        }
        maxabs = fmax(maxabs, fabs(a->w.mem[i]));
    }
    double rel = maxabs > 0 ? maxdiff / maxabs : maxdiff;
    printf("%zu parameters, %zu differ; max |a-b| %.3g at %zu (%.3g relative to max |a| %.3g)\n", a->w.n_floats, differ,
           maxdiff, at, rel, maxabs);
    model_free(a);
    model_free(b);
    return (tol == 0 ? differ == 0 : rel <= tol) ? 0 : 1;
}
