#include "validate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "proto/transport.h"

int validate_text(const char *s, size_t max)
{
    if (!s)
        return 1;
    size_t n = strlen(s);
    if (n > max)
        return 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        if (c < 0x20 || c == 0x7f)
            return 0;
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n)
            return 0;
        unsigned cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k < len; k++) {
            if ((p[i + k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        /* overlong forms, surrogates and values beyond Unicode are not UTF-8 */
        static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return 0;
        i += len;
    }
    return 1;
}

/* Lines of printable UTF-8 (validate_text each), at most max bytes in all. 1 when valid. */
static int validate_lines(const char *s, size_t max)
{
    if (strnlen(s, max + 1) > max)
        return 0;
    char line[4096];
    for (const char *p = s; *p;) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        if (l >= sizeof line)
            return 0;
        memcpy(line, p, l);
        line[l] = 0;
        if (!validate_text(line, sizeof line - 1))
            return 0;
        p += l + (nl != NULL);
    }
    return 1;
}

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        snprintf(why, whylen, __VA_ARGS__);                                                                            \
        return -1;                                                                                                     \
    } while (0)

static int check_register(const Grpo__Register *r, char *why, size_t whylen)
{
    if (r->world_size < 1 || r->world_size > CORE_MAX_WORKERS)
        FAIL("register.world_size %d is outside 1..%d", r->world_size, CORE_MAX_WORKERS);
    if (r->rank < 0 || r->rank >= r->world_size)
        FAIL("register.rank %d is outside 0..%d (world_size %d)", r->rank, r->world_size - 1, r->world_size);
    if (!r->host || !r->host[0] || !validate_text(r->host, CORE_HOST_MAX - 1))
        FAIL("register.host is empty, too long or not printable UTF-8");
    if (r->pid < 0)
        FAIL("register.pid %d is negative", r->pid);
    if (r->n_devices > CORE_MAX_DEVICES)
        FAIL("register.devices has %zu entries (at most %d)", r->n_devices, CORE_MAX_DEVICES);
    for (size_t i = 0; i < r->n_devices; i++)
        if (!validate_text(r->devices[i], 127))
            FAIL("register.devices[%zu] is too long or not printable UTF-8", i);
    if (r->n_capabilities > 16)
        FAIL("register.capabilities has %zu entries (at most 16)", r->n_capabilities);
    for (size_t i = 0; i < r->n_capabilities; i++)
        if (!r->capabilities[i][0] || !validate_text(r->capabilities[i], 14) || strchr(r->capabilities[i], ','))
            FAIL("register.capabilities[%zu] is empty, too long or not a plain word", i);
    if (!validate_text(r->run_id, CORE_NAME_MAX - 1))
        FAIL("register.run_id is too long or not printable UTF-8");
    if (r->step < 0 || r->step > (int64_t)1 << 50)
        FAIL("register.step %lld is out of range", (long long)r->step);
    if (r->n_world_host_names && r->n_world_host_names != (size_t)r->world_size)
        FAIL("register.world_host_names has %zu entries, not world_size %d", r->n_world_host_names, r->world_size);
    for (size_t i = 0; i < r->n_world_host_names; i++)
        if (!validate_text(r->world_host_names[i], CORE_HOST_MAX - 1))
            FAIL("register.world_host_names[%zu] is too long or not printable UTF-8", i);
    if (!validate_lines(r->run_config, CORE_CONFIG_MAX))
        FAIL("register.run_config is longer than %d bytes, has a line over 4095 bytes, or is not lines of printable "
             "UTF-8",
             CORE_CONFIG_MAX);
    return 0;
}

static int check_metrics(Grpo__Metric **m, size_t n, const char *field, char *why, size_t whylen)
{
    if (n > CORE_MAX_METRICS)
        FAIL("%s has %zu entries (at most %d)", field, n, CORE_MAX_METRICS);
    for (size_t i = 0; i < n; i++) {
        if (!m[i]->name || !m[i]->name[0] || !validate_text(m[i]->name, CORE_NAME_MAX - 1))
            FAIL("%s[%zu].name is empty, too long or not printable UTF-8", field, i);
        /* NaN is a legitimate report (a diverged loss); infinities too. Nothing to check. */
    }
    return 0;
}

/* A flight recorder's record (1.15): short printable names, a phase, finite non-negative times. */
static int check_flight(const Grpo__FlightEntry *e, const char *field, size_t i, char *why, size_t whylen)
{
    if (!validate_text(e->kind, 15) || !validate_text(e->op, 31) || !validate_text(e->group, 31) ||
        !validate_text(e->members, 127))
        FAIL("%s[%zu]: kind, op, group or members is too long or not printable UTF-8", field, i);
    if ((unsigned)e->phase >= GRPO_NUM_PHASES)
        FAIL("%s[%zu].phase %d is not a phase", field, i, (int)e->phase);
    if (!isfinite(e->began) || e->began < 0 || !isfinite(e->seconds) || e->seconds < 0)
        FAIL("%s[%zu]: began and seconds must be finite and non-negative", field, i);
    if (e->group_size < 0 || e->layer < -1 || e->peer < -1)
        FAIL("%s[%zu]: group_size, layer or peer is out of range", field, i);
    return 0;
}

static int check_heartbeat_flight(const Grpo__Heartbeat *h, char *why, size_t whylen)
{
    if (h->current_wait && check_flight(h->current_wait, "heartbeat.current_wait", 0, why, whylen) != 0)
        return -1;
    if (h->layer_plus_one < 0 || h->layer_plus_one > 1000000)
        FAIL("heartbeat.layer_plus_one %d is outside 0..1000000", h->layer_plus_one);
    if (h->n_recent_waits > CORE_FLIGHT_RECENT)
        FAIL("heartbeat.recent_waits has %zu entries (at most %d)", h->n_recent_waits, CORE_FLIGHT_RECENT);
    for (size_t i = 0; i < h->n_recent_waits; i++)
        if (check_flight(h->recent_waits[i], "heartbeat.recent_waits", i, why, whylen) != 0)
            return -1;
    if (h->n_trace > CORE_FLIGHT_TRACE + 1) /* the ring's newest and the open wait */
        FAIL("heartbeat.trace has %zu entries (at most %d)", h->n_trace, CORE_FLIGHT_TRACE + 1);
    for (size_t i = 0; i < h->n_trace; i++)
        if (check_flight(h->trace[i], "heartbeat.trace", i, why, whylen) != 0)
            return -1;
    if (!validate_lines(h->stacks, CORE_STACKS_MAX - 1))
        FAIL("heartbeat.stacks is longer than %d bytes or not lines of printable UTF-8", CORE_STACKS_MAX - 1);
    return 0;
}

static int check_heartbeat(const Grpo__Heartbeat *h, char *why, size_t whylen)
{
    if (h->rank < 0 || h->rank >= CORE_MAX_WORKERS)
        FAIL("heartbeat.rank %d is out of range", h->rank);
    if (h->step < -1 || h->step > (int64_t)1 << 50 || h->total_steps < -1 || h->total_steps > (int64_t)1 << 50)
        FAIL("heartbeat.step or total_steps is out of range");
    if ((unsigned)h->phase >= GRPO_NUM_PHASES)
        FAIL("heartbeat.phase %d is not a phase", (int)h->phase);
    if ((unsigned)h->state > GRPO__WORKER_STATE__WORKER_SUSPECT || h->state == GRPO__WORKER_STATE__WORKER_LOST ||
        h->state == GRPO__WORKER_STATE__WORKER_RECONNECTING || h->state == GRPO__WORKER_STATE__WORKER_SUSPECT)
        FAIL("heartbeat.state %d is not a state a worker reports", (int)h->state);
    if (h->n_timings > GRPO_NUM_PHASES * 2)
        FAIL("heartbeat.timings has %zu entries (at most %d)", h->n_timings, GRPO_NUM_PHASES * 2);
    for (size_t i = 0; i < h->n_timings; i++)
        if ((unsigned)h->timings[i]->phase >= GRPO_NUM_PHASES || !isfinite(h->timings[i]->seconds) ||
            h->timings[i]->seconds < 0)
            FAIL("heartbeat.timings[%zu] has an unknown phase or a negative or non-finite time", i);
    if (h->n_phase_changes > 256)
        FAIL("heartbeat.phase_changes has %zu entries (at most 256)", h->n_phase_changes);
    for (size_t i = 0; i < h->n_phase_changes; i++)
        if ((unsigned)h->phase_changes[i]->phase >= GRPO_NUM_PHASES || !isfinite(h->phase_changes[i]->start) ||
            h->phase_changes[i]->start < 0)
            FAIL("heartbeat.phase_changes[%zu] has an unknown phase or a bad time", i);
    if (!isfinite(h->idle_seconds) || h->idle_seconds < 0 || !isfinite(h->busy_seconds) || h->busy_seconds < 0)
        FAIL("heartbeat.idle_seconds/busy_seconds must be finite and non-negative");
    if (!isfinite(h->peak_rss_gb) || h->peak_rss_gb < 0 || h->peak_rss_gb > 1e9 || !isfinite(h->host_memory_gb) ||
        h->host_memory_gb < 0 || h->host_memory_gb > 1e9)
        FAIL("heartbeat.peak_rss_gb/host_memory_gb must be finite, non-negative and below 1e9");
    if (!isfinite(h->sent_s) || h->sent_s < 0)
        FAIL("heartbeat.sent_s must be finite and non-negative");
    if (h->checkpoint_step < -1)
        FAIL("heartbeat.checkpoint_step %lld is out of range", (long long)h->checkpoint_step);
    if (!validate_text(h->error, CORE_REASON_MAX - 1))
        FAIL("heartbeat.error is too long or not printable UTF-8");
    if (check_heartbeat_flight(h, why, whylen) != 0)
        return -1;
    return check_metrics(h->metrics, h->n_metrics, "heartbeat.metrics", why, whylen);
}

int validate_request(const Grpo__Envelope *env, char *why, size_t whylen)
{
    if (env->secret.len > GRPO_SECRET_MAX)
        FAIL("secret of %zu bytes is longer than %d bytes", env->secret.len, GRPO_SECRET_MAX);
    switch (env->body_case) {
    case GRPO__ENVELOPE__BODY_REGISTER: return check_register(env->register_, why, whylen);
    case GRPO__ENVELOPE__BODY_HEARTBEAT: return check_heartbeat(env->heartbeat, why, whylen);
    case GRPO__ENVELOPE__BODY_COMMAND:
        if (env->command->command < GRPO__COMMAND__COMMAND_PAUSE ||
            env->command->command > GRPO__COMMAND__COMMAND_CHECKPOINT)
            FAIL("command.command %d is not a command", (int)env->command->command);
        if (!validate_text(env->command->reason, 255))
            FAIL("command.reason is too long or not printable UTF-8");
        return 0;
    case GRPO__ENVELOPE__BODY_FLIGHT_REQUEST:
        if (env->flight_request->what != GRPO__FLIGHT_REQUEST__WHAT__TRACE &&
            env->flight_request->what != GRPO__FLIGHT_REQUEST__WHAT__STACKS)
            FAIL("flight_request.what %d is neither trace nor stacks", (int)env->flight_request->what);
        if (env->flight_request->rank < -1 || env->flight_request->rank >= CORE_MAX_WORKERS ||
            (env->flight_request->rank < 0 && env->flight_request->what == GRPO__FLIGHT_REQUEST__WHAT__TRACE))
            FAIL("flight_request.rank %d is out of range (-1, every rank, only for stacks)", env->flight_request->rank);
        return 0;
    case GRPO__ENVELOPE__BODY_STATUS_REQUEST:
    case GRPO__ENVELOPE__BODY_METRICS_REQUEST:
    case GRPO__ENVELOPE__BODY_RUN_CONFIG_REQUEST: return 0;
    default: FAIL("'%s' is not a request grpod answers", protocol_body_name(env->body_case));
    }
}
