#include "sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

#include "common/check.h"
#include "kernels/kernels.h"

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

struct sampler_scratch {
    int V;
};

struct sampler_scratch *sampler_scratch_create(int V)
{
    struct sampler_scratch *s = xcalloc(1, sizeof *s);
    s->V = V;
    return s;
}

void sampler_scratch_free(struct sampler_scratch *s) { free(s); }

int sample_token(const float *logits, int V, const struct sampler_params *p, struct rng *r, struct sampler_scratch *s,
                 float *logp)
{
    (void)s;
    /* one uniform per sampled token, none for greedy: the stream does not depend on how tokens are batched */
    const double u = p->temperature > 0 ? rng_uniform(r) : 0.0;
    float lp;
    const int tok = khost_sample_row(logits, V, p->temperature, p->top_p, p->top_k, u, &lp);
    if (logp)
        *logp = lp;
    return tok;
}
