#include "clock.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

static double seconds_of(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double clock_now_s(void) { return seconds_of(CLOCK_MONOTONIC); }

double clock_wall_s(void) { return seconds_of(CLOCK_REALTIME); }

void clock_sleep_s(double seconds)
{
    if (seconds <= 0)
        return;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void clock_test_sleep(const char *name, double *cache)
{
    if (*cache < 0) {
        const char *v = getenv(name);
        const double s = v ? strtod(v, NULL) : 0;
        *cache = s > 0 && s < 10 ? s : 0;
    }
    clock_sleep_s(*cache);
}
