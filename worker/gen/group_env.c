/* A generating group's turn environment: the head's real one, its answers broadcast to the peers (group_env.h). */
#include "group_env.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/clock.h"
#include "worker/comm/comm.h"

struct group_env {
    struct turn_env base;
    struct turn_env *inner; /* the head's real environment; NULL on a peer (or one kept for a regroup) */
    void (*inner_destroy)(struct turn_env *);
    struct comm *group;
    bool head;
};

static void bcast(struct group_env *g, void *buf, size_t count, enum comm_dtype t)
{
    if (count > 0 && g->group) /* every rank makes the same calls: the polled broadcast on all, as the group's other
                                * words */
        comm_broadcast_polled(g->group, buf, count, t, 0, NULL, NULL);
}

static int env_begin(struct turn_env *te, int traj, const char *messages_json, const char *extra_info,
                     const char *agent_name)
{
    struct group_env *g = (struct group_env *)te;
    int64_t single = g->head ? g->inner->ops->begin(g->inner, traj, messages_json, extra_info, agent_name) : 0;
    bcast(g, &single, 1, COMM_I64);
    return (int)single;
}

static void env_turn_end(struct turn_env *te, int traj, const int32_t *ids, int n, bool stopped, int budget)
{
    struct group_env *g = (struct group_env *)te;
    if (g->head) /* the peers' answer comes with the head's poll */
        g->inner->ops->turn_end(g->inner, traj, ids, n, stopped, budget);
}

/* The head takes the answers ready and tells them: their count and tokens, then each one's trajectory, end flag and
 * length, then the tokens; a peer takes the same. */
static int env_poll(struct turn_env *te, struct turn_reply *out, int max, bool wait)
{
    struct group_env *g = (struct group_env *)te;
    int64_t head[2] = {0, 0};
    if (g->head) {
        /* a wait for the tools: a word to the peers every half second (-1: none yet), so that their watchdog
         * (rollout.tp_group_timeout_s) sees the group move while a slow tool runs */
        double said = clock_now_s();
        while ((head[0] = g->inner->ops->poll(g->inner, out, max, false)) == 0 && wait) {
            if (clock_now_s() - said >= 0.5) {
                int64_t none[2] = {-1, 0};
                bcast(g, none, 2, COMM_I64);
                said = clock_now_s();
            }
            clock_sleep_s(0.002);
        }
        for (int i = 0; i < head[0]; i++)
            head[1] += out[i].n > 0 ? out[i].n : 0;
    }
    do /* a peer: past the head's words while it waits */
        bcast(g, head, 2, COMM_I64);
    while (!g->head && head[0] == -1);
    const int k = (int)head[0];
    if (k < 0 || k > max || head[1] < 0)
        check_failf(__FILE__, __LINE__, "generating group: %d answers (%lld tokens) from the head, at most %d", k,
                    (long long)head[1], max);
    int32_t *meta = xmalloc((size_t)(3 * k + 1) * sizeof(int32_t));
    int32_t *ids = xmalloc((size_t)(head[1] + 1) * sizeof(int32_t));
    if (g->head) {
        size_t at = 0;
        for (int i = 0; i < k; i++) {
            const int n = out[i].n > 0 ? out[i].n : 0;
            meta[3 * i] = out[i].traj, meta[3 * i + 1] = out[i].done, meta[3 * i + 2] = n;
            if (n > 0)
                memcpy(ids + at, out[i].ids, (size_t)n * sizeof(int32_t));
            at += (size_t)n;
        }
    }
    bcast(g, meta, 3 * (size_t)k, COMM_I32);
    bcast(g, ids, (size_t)head[1], COMM_I32);
    if (!g->head) {
        size_t at = 0;
        for (int i = 0; i < k; i++) {
            const int n = meta[3 * i + 2];
            out[i] = (struct turn_reply){.traj = meta[3 * i], .done = meta[3 * i + 1] != 0, .n = n};
            if (n > 0) {
                out[i].ids = xmalloc((size_t)n * sizeof(int32_t));
                memcpy(out[i].ids, ids + at, (size_t)n * sizeof(int32_t));
                at += (size_t)n;
            }
        }
    }
    free(meta), free(ids);
    return k;
}

/* A text of the head's told to the peers: its length (-1: NULL), then its bytes. */
static char *bcast_text(struct group_env *g, const char *text)
{
    int64_t n = g->head ? (text ? (int64_t)strlen(text) : -1) : 0;
    bcast(g, &n, 1, COMM_I64);
    if (n < 0)
        return NULL;
    const int64_t words = (n + 7) / 8; /* the bytes as 8-byte words: a whole number of them, zero-padded */
    int64_t *buf = xcalloc((size_t)(words ? words : 1), sizeof *buf);
    if (g->head && text) /* n >= 0 on the head: its text */
        memcpy(buf, text, (size_t)n);
    bcast(g, buf, (size_t)words, COMM_I64);
    char *t = xmalloc((size_t)n + 1);
    memcpy(t, buf, (size_t)n);
    t[n] = 0;
    free(buf);
    return t;
}

/* The head's summary, told to the peers: its counts, the scorer's extra_info (reward_json: the tools' and the
 * interaction's scores) and the conversation, so that every rank of the group scores and reports what the head does
 * (a colocated engine's ranks, a trainer's model copy validating). */
static void env_finish(struct turn_env *te, int traj, struct turn_summary *out)
{
    struct group_env *g = (struct group_env *)te;
    if (g->head)
        g->inner->ops->finish(g->inner, traj, out);
    else
        memset(out, 0, sizeof *out);
    if (!g->group)
        return;
    double w[6] = {out->turns,        out->tool_calls, out->tool_errors,
                   out->tool_seconds, out->mismatch,   out->template_errors};
    bcast(g, w, 6, COMM_F64);
    char *reward = bcast_text(g, out->reward_json), *messages = bcast_text(g, out->messages_json);
    if (g->head) {
        free(reward), free(messages);
        return;
    }
    out->turns = (int)w[0], out->tool_calls = (int)w[1], out->tool_errors = (int)w[2];
    out->tool_seconds = w[3], out->mismatch = w[4] != 0, out->template_errors = (int)w[5];
    out->reward_json = reward, out->messages_json = messages;
}

static const struct turn_env_ops group_ops = {env_begin, env_turn_end, env_poll, env_finish};

struct turn_env *gen_group_env_create(struct turn_env *inner, void (*inner_destroy)(struct turn_env *),
                                      struct comm *group, bool head)
{
    struct group_env *g = xcalloc(1, sizeof *g);
    *g = (struct group_env){
        .base = {&group_ops}, .inner = inner, .inner_destroy = inner_destroy, .group = group, .head = head || !group};
    return &g->base;
}

bool gen_group_env_regroup(struct turn_env *e, struct comm *group, bool head)
{
    struct group_env *g = (struct group_env *)e;
    g->group = group;
    g->head = head || !group;
    return g->head && !g->inner;
}

void gen_group_env_set_inner(struct turn_env *e, struct turn_env *inner, void (*inner_destroy)(struct turn_env *))
{
    struct group_env *g = (struct group_env *)e;
    if (g->inner && g->inner_destroy)
        g->inner_destroy(g->inner);
    g->inner = inner;
    g->inner_destroy = inner_destroy;
}

void gen_group_env_destroy(struct turn_env *e)
{
    struct group_env *g = (struct group_env *)e;
    if (!g)
        return;
    if (g->inner && g->inner_destroy)
        g->inner_destroy(g->inner);
    free(g);
}
