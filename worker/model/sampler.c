#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/check.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(struct rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull + 0x2545f4914f6cdd1dull);
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double rng_uniform(struct rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

struct cand {
    float p;
    int id;
};

struct sampler_scratch {
    int V;
    struct cand *c;
};

struct sampler_scratch *sampler_scratch_create(int V)
{
    struct sampler_scratch *s = xcalloc(1, sizeof *s);
    s->V = V;
    s->c = xmalloc((size_t)V * sizeof *s->c);
    return s;
}

void sampler_scratch_free(struct sampler_scratch *s)
{
    if (s) {
        free(s->c);
        free(s);
    }
}

/* descending probability, ties by id so the order is total and reproducible */
static int cmp_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->p != y->p)
        return x->p < y->p ? 1 : -1;
    return x->id - y->id;
}

int sample_token(const float *logits, int V, const struct sampler_params *p, struct rng *r, struct sampler_scratch *s,
                 float *logp)
{
    const double t = p->temperature > 0 ? p->temperature : 1.0;
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
    if (p->temperature > 0) {
        for (int i = 0; i < V; i++)
            s->c[i] = (struct cand){(float)exp((logits[i] - mx) / t - logz), i};
        int n = V;
        bool truncate = (p->top_k > 0 && p->top_k < V) || p->top_p < 1.0f;
        if (truncate) {
            qsort(s->c, (size_t)V, sizeof *s->c, cmp_desc);
            if (p->top_k > 0 && p->top_k < n)
                n = p->top_k;
            if (p->top_p < 1.0f) {
                double acc = 0;
                int keep = 0;
                while (keep < n) {
                    acc += s->c[keep++].p;
                    if (acc >= p->top_p)
                        break;
                }
                n = keep;
            }
        }
        double mass = 0;
        for (int i = 0; i < n; i++)
            mass += s->c[i].p;
        double u = rng_uniform(r) * mass, acc = 0;
        tok = s->c[n - 1].id;
        for (int i = 0; i < n; i++) {
            acc += s->c[i].p;
            if (u < acc) {
                tok = s->c[i].id;
                break;
            }
        }
    }
    if (logp)
        *logp = (float)((logits[tok] - mx) / t - logz);
    return tok;
}
