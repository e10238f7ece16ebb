/* Retrying without hammering: exponential backoff with jitter, the one policy of every retry loop.
 *
 *   struct backoff b;
 *   backoff_init(&b, 0.1, 5.0);
 *   while (try() != 0)
 *       clock_sleep_s(backoff_next(&b));   // 0.05-0.1 s, 0.1-0.2, 0.2-0.4, ... then 2.5-5 s each
 *
 * Each delay is drawn uniformly from [d/2, d], d doubling from `first` up to `cap` ("equal jitter"), so that
 * processes refused together (a restarted grpod, a full dispatcher) do not come back together. The draws come
 * from a generator seeded by the process id and the clock: two processes do not draw the same delays. */
#ifndef GRPO_COMMON_BACKOFF_H
#define GRPO_COMMON_BACKOFF_H

#include <stdint.h>

struct backoff {
    double first, cap, cur;
    uint64_t rng;
};

/* first_s > 0, cap_s >= first_s. */
void backoff_init(struct backoff *b, double first_s, double cap_s);
/* The same with a given seed (tests). */
void backoff_init_seeded(struct backoff *b, double first_s, double cap_s, uint64_t seed);
/* The next delay in seconds, in [d/2, d] for the current d; d then doubles, up to cap. */
double backoff_next(struct backoff *b);
/* After a success: the next delay starts from first again. */
void backoff_reset(struct backoff *b);

#endif
