/* Rate limit of repeated log lines: a flood of bad connections or requests must not flood the log.
 * At most `max` lines per 10 s window per limiter; the first line after a window with suppressed lines
 * is preceded by a count of them. */
#ifndef GRPO_DAEMON_RATELIMIT_H
#define GRPO_DAEMON_RATELIMIT_H

#include <stdbool.h>
#include <stdint.h>

#define RATELIMIT_WINDOW_S 10.0

struct ratelimit {
    double window;       /* start of the current window (monotonic seconds) */
    int lines;           /* lines let through in it */
    uint64_t suppressed; /* lines held back in it */
};

/* Whether a line may go to the log now (true), or is counted as suppressed (false). When a new window
 * begins after suppressed lines, says how many under subsystem, naming what (e.g. "connection refusals"). */
bool ratelimit_allow(struct ratelimit *r, double now, int max, const char *subsystem, const char *what);

/* Say how many lines were suppressed once their window is over, even when no new line comes (call it from
 * a timer). */
void ratelimit_flush(struct ratelimit *r, double now, const char *subsystem, const char *what);

#endif
