/* Rate limit of repeated log lines. See ratelimit.h. */
#include "ratelimit.h"

#include <inttypes.h>

#include "common/log.h"

void ratelimit_flush(struct ratelimit *r, double now, const char *subsystem, const char *what)
{
    if (r->suppressed && (now - r->window >= RATELIMIT_WINDOW_S || now < r->window)) {
        log_warn(subsystem, "... %" PRIu64 " more %s in %.0f s not logged", r->suppressed, what, RATELIMIT_WINDOW_S);
        r->window = now;
        r->lines = 0;
        r->suppressed = 0;
    }
}

bool ratelimit_allow(struct ratelimit *r, double now, int max, const char *subsystem, const char *what)
{
    if (now - r->window >= RATELIMIT_WINDOW_S || now < r->window) {
        ratelimit_flush(r, now, subsystem, what);
        r->window = now;
        r->lines = 0;
        r->suppressed = 0;
    }
    if (r->lines >= max) {
        r->suppressed++;
        return false;
    }
    r->lines++;
    return true;
}
