#include "backoff.h"

#include <time.h>
#include <unistd.h>

void backoff_init_seeded(struct backoff *b, double first_s, double cap_s, uint64_t seed)
{
    b->first = first_s > 0 ? first_s : 0.001;
    b->cap = cap_s > b->first ? cap_s : b->first;
    b->cur = b->first;
    b->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
}

void backoff_init(struct backoff *b, double first_s, double cap_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    backoff_init_seeded(b, first_s, cap_s,
                        ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20));
}

/* splitmix64: a uniform double in [0, 1) */
static double uniform(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-53;
}

double backoff_next(struct backoff *b)
{
    const double d = b->cur;
    b->cur = d * 2 < b->cap ? d * 2 : b->cap;
    return d * (0.5 + 0.5 * uniform(&b->rng));
}

void backoff_reset(struct backoff *b) { b->cur = b->first; }
