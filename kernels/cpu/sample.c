/* Sampling one token from a row of logits: temperature, then top-k and top-p (nucleus) truncation, from one
 * uniform number the caller draws (so the random stream belongs to the sequence, not to the batch). */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/check.h"
#include "cpu_kernels.h"

struct cand {
    float p;
    int id;
};

/* descending probability, ties by id so the order is total and reproducible */
static int cmp_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

/* The candidates of a row, kept from call to call (a vocabulary's worth, one thread). */
static _Thread_local struct cand *g_cand;
static _Thread_local int g_cap;

int sample_row(const float *logits, int V, float temperature, float top_p, int top_k, double u, float *logp)
{
    const double t = temperature > 0 ? temperature : 1.0;
    float mx = logits[0];
    int arg = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) {
            mx = logits[i];
            arg = i;
        }
    double z = 0;
    for (int i = 0; i < V; i++)
        z += exp((logits[i] - mx) / t);
    const double logz = log(z); // cppcheck-suppress invalidFunctionArg ; z >= 1: the maximum contributes exp(0)
    int tok = arg;
    if (temperature > 0) {
        if (V > g_cap) {
            free(g_cand);
            g_cand = xmalloc((size_t)V * sizeof *g_cand);
            g_cap = V;
        }
        struct cand *c = g_cand;
        for (int i = 0; i < V; i++)
            c[i] = (struct cand){(float)exp((logits[i] - mx) / t - logz), i};
        int n = V;
        bool truncate = (top_k > 0 && top_k < V) || top_p < 1.0f;
        if (truncate) {
            qsort(c, (size_t)V, sizeof *c, cmp_desc);
            if (top_k > 0 && top_k < n)
                n = top_k;
            if (top_p < 1.0f) {
                double acc = 0;
                int keep = 0;
                while (keep < n) {
                    acc += c[keep++].p;
                    if (acc >= top_p)
                        break;
                }
                n = keep;
            }
        }
        double mass = 0;
        for (int i = 0; i < n; i++)
            mass += c[i].p;
        double acc = 0;
        const double x = u * mass;
        tok = c[n - 1].id;
        for (int i = 0; i < n; i++) {
            acc += c[i].p;
            if (x < acc) {
                tok = c[i].id;
                break;
            }
        }
    }
    if (logp)
        *logp = (float)((logits[tok] - mx) / t - logz);
    return tok;
}
