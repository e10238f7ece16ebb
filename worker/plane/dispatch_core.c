#include "dispatch_core.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "proto/plane_auth.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "common/config_key_names.h"
#include "worker/plane/relay.h"

#define CHUNK_MAX_FLOATS DISPATCH_CHUNK_MAX_FLOATS
#define PENDING (-1)

void dispatch_unit_range(int B, int U, int u, int *lo, int *hi)
{
    *lo = (int)((long long)B * u / U);
    *hi = (int)((long long)B * (u + 1) / U);
}

/* A rollout process the dispatcher has heard from: one entry per identity. Every entry that is not superseded is
 * the current process of its rollout rank (d->current), so the table holds at most one live process per rank; the
 * superseded ones are kept (while there is room) to refuse them by name. */
struct proc {
    uint64_t id;
    struct plane_id who; /* the identity its requests are authenticated as: the id is its, nobody else's */
    int slot;
    double last_seen;
    bool alive;
    bool heard_end;  /* it has said it heard the end (WorkRequest.end_heard, since 1.14) */
    bool superseded; /* a newer process serves its rank: each of its requests is refused */
    /* the relay tree: the newest version it holds and serves (-1: none), the newest it was sent to fetch (-1: none),
     * how many it was named to for the one it holds, whether a receiver said it failed it (never named again), and
     * where it serves */
    int64_t held, sent_for;
    int kids;
    bool relay_barred;
    char relay_ep[256];
};

/* A process's request budget (a token bucket): DISPATCH_RATE_PER_S, bursts of DISPATCH_RATE_BURST. */
struct peer {
    struct plane_id who;
    double tokens, at;
    uint64_t used; /* for eviction: the least recently used goes first */
};

struct snapshot {
    int64_t version; /* -1: empty */
    float *w;
    /* the relay tree: the version's digest, the processes sent here to fetch it (direct), named a holder or sent
     * here (assigned), that said they hold it (holders), those sent here after a relay failed them, the weight
     * bytes served from here */
    uint8_t digest[RELAY_DIGEST_BYTES];
    uint8_t token[RELAY_TOKEN_BYTES]; /* what a relay asks of a request for it (relay_token) */
    int direct, assigned, holders, fallbacks;
    int64_t bytes;
};

/* A unit's grant: the process that holds it, since when, and whether it said it delivered the unit. A lease not
 * delivered by lease_s() after its grant ends: the unit is granted again to a process with nothing else to do. */
struct lease {
    int holder; /* PENDING or the index in procs of the process that holds it */
    double since;
    bool done;
};

static const struct lease pending_lease = {.holder = PENDING};

struct dispatch_core {
    struct dispatch_options o;  /* endpoint and run key not kept */
    struct plane_verifier auth; /* the run key and the counters seen */
    double opened_at;
    struct snapshot *snaps;
    int nsnap;
    int64_t latest, end_after; /* newest published version (-1: none); the run's last step (-1: not ended) */
    char end_why[256];
    int64_t win0;        /* first step of the window (latest + 1) */
    int window;          /* steps in the window: staleness + 1 */
    struct lease *lease; /* [window][units]: who holds each unit of the window's steps, since when */
    bool *ever;          /* [window][units][units]: rollout rank s's process has been granted unit u of step j */
    double longest_s;    /* the longest a unit has taken from its grant to its holder's next ask (0: none yet) */
    bool *slot_seen;     /* [units]: some process has served this slot */
    int *current;        /* [units]: the index in procs of the process serving each rollout rank (-1: none yet) */
    int *slot_live;      /* [units]: the live processes of each rollout rank (set_alive) */
    struct proc *procs;  /* [maxprocs]: a rank's current process, and superseded ones while there is room */
    int nprocs, maxprocs;
    struct peer *peers; /* [maxpeers]: the request budgets of the authenticated processes heard from */
    int npeers, maxpeers;
    uint64_t peer_clock;
    struct dispatch_stats st;
    /* the weight broadcast (dispatcher_broadcast_on) */
    bool bc_on, bc_off;       /* on; given up for the rest of the run (a lost process, a failed round) */
    double bc_rendezvous_s;   /* a version every rollout rank has not asked for by then is fetched instead */
    int64_t *bc_want;         /* [units]: the version each rollout rank's process asks to take in a round (-1) */
    double *bc_asked;         /* [units]: since when */
    int64_t bc_round;         /* the version being broadcast (-1: none) */
    int64_t bc_done, bc_skip; /* the newest version broadcast, the newest one fetched instead */
    struct snapshot *writing; /* the snapshot between publish_begin and publish_end */
    /* fully-async training (o.async): the units granted and not yet delivered, the stream's next unit, a replay's
     * units (deep copies) and the next of them, verl's count of groups since the last push */
    struct alease *al;
    int n_al, cap_al;
    int64_t a_next;
    struct dispatch_replay *rp;
    int n_rp, a_rnext;
    int64_t a_granted, a_taken, a_window; /* groups: granted in all (and outstanding at the start), taken, counted */
    bool a_hold, replaying;
};

/* A granted unit of the stream: who holds it (PENDING: its holder was lost, to be granted again), since when, with
 * which version, the replay entry it is (-1: live), and which rollout ranks' processes were ever granted it. */
struct alease {
    int64_t n;
    int holder;
    bool done; /* its holder said it delivered it (the trainer may not have read it yet) */
    double since;
    int64_t version;
    int ri;
    uint8_t *ever; /* (units) */
};

/* Whether a live process serves rollout rank slot: a count kept as processes come and go (set_alive), not a scan of
 * the processes, which an ask made once for every pending unit (units x processes an ask: docs/scaling.md). */
static bool slot_alive(const struct dispatch_core *d, int slot) { return d->slot_live[slot] > 0; }

/* Every change of a process's liveness goes through here, keeping slot_live. */
static void set_alive(struct dispatch_core *d, struct proc *p, bool alive)
{
    if (p->alive != alive)
        d->slot_live[p->slot] += alive ? 1 : -1;
    p->alive = alive;
}

/* A unit whose own rollout rank is gone (or never came): any live process may take it. */
static bool orphaned(const struct dispatch_core *d, int slot, double now)
{
    if (slot_alive(d, slot))
        return false;
    double grace = 10 * d->o.lost_after_s > 30 ? 10 * d->o.lost_after_s : 30;
    return d->slot_seen[slot] || now - d->opened_at > grace;
}

static bool same_who(const struct plane_id *a, const struct plane_id *b)
{
    return a->rank == b->rank && a->pid == b->pid && a->incarnation == b->incarnation;
}

/* Process i is out of the run (lost, or superseded by a newer process of its rank): it is not alive, and its units
 * go back to be granted again (their list in units[]). The weight broadcast, whose group it was in: off for good
 * when a newer process serves its rank (not in the group); while it is only silent, no round begins and each
 * version is fetched, and the rounds come back with it ("is back"): a process that was only slow, on a loaded host
 * say, must not cost the rest of the run its broadcast (the emulated gpu-dist lost it so on a busy machine). */
static void release(struct dispatch_core *d, int i, const char *what, char *units, size_t len)
{
    struct proc *p = &d->procs[i];
    set_alive(d, p, false);
    if (d->bc_on && !d->bc_off && p->superseded) {
        d->bc_off = true;
        log_warn("dispatch",
                 "weight broadcast off for the rest of the run: rollout rank %d's process is %s "
                 "(each version is fetched from here instead)",
                 p->slot, what);
    } else if (d->bc_on && !d->bc_off) {
        log_warn("dispatch",
                 "weight broadcast paused: rollout rank %d's process is %s (each version is fetched from here "
                 "until it is back)",
                 p->slot, what);
    }
    units[0] = 0;
    for (int a = 0; a < d->n_al; a++) /* fully-async: the stream's allocations it held */
        if (d->al[a].holder == i && !d->al[a].done) {
            d->al[a].holder = PENDING;
            const size_t l = strlen(units);
            const long long chunk = d->al[a].n / d->o.units + 1;
            snprintf(units + l, len - l, "%s%lld/%d", l ? ", " : "", chunk, (int)(d->al[a].n % d->o.units));
        }
    for (int j = 0; j < d->window; j++)
        for (int u = 0; u < d->o.units; u++)
            if (d->lease[j * d->o.units + u].holder == i) {
                d->lease[j * d->o.units + u] = pending_lease;
                size_t l = strlen(units);
                snprintf(units + l, len - l, "%s%lld/%d", l ? ", " : "", (long long)d->win0 + j, u);
            }
}

/* What refused a work request or ping in proc_of. */
enum refusal { R_NONE, R_SECOND_ID, R_THEIRS, R_SUPERSEDED, R_SECOND_PROCESS };

/* Whether a process of identity who, not (or no longer) the current process of rollout rank slot, is refused for
 * the rank's current one: superseded (by a newer process, or of an older generation than the current one), or a
 * second process of the current one's generation while it lives. R_NONE: it may take the rank (none serves it, or
 * the current one is lost or of an older generation). */
static enum refusal displaced(const struct dispatch_core *d, const struct plane_id *who, int slot, char *why,
                              size_t len)
{
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].superseded && same_who(&d->procs[i].who, who)) {
            const struct proc *c = &d->procs[d->current[slot]];
            snprintf(why, len,
                     "superseded: rollout rank %d is served by a newer process (world rank %d, pid %u, generation %u) "
                     "since this one (pid %u, generation %u) was replaced; it ends here",
                     slot, c->who.rank, c->who.pid, plane_generation(c->who.incarnation), who->pid,
                     plane_generation(who->incarnation));
            return R_SUPERSEDED;
        }
    const int ci = d->current[slot];
    if (ci < 0)
        return R_NONE;
    const struct proc *c = &d->procs[ci];
    const unsigned g = plane_generation(who->incarnation), cg = plane_generation(c->who.incarnation);
    if (plane_generation_later(cg, g)) {
        snprintf(why, len,
                 "superseded: rollout rank %d is served by a process of a later generation (world rank %d, pid %u, "
                 "generation %u) than this one's (pid %u, generation %u); it ends here",
                 slot, c->who.rank, c->who.pid, cg, who->pid, g);
        return R_SUPERSEDED;
    }
    if (c->alive && !plane_generation_later(g, cg)) {
        snprintf(why, len,
                 "rollout rank %d is served by a live process (world rank %d, pid %u, generation %u): a second process "
                 "of its generation is refused (one process per rollout rank; a replacement, grpo-worker "
                 "--replace-rank, comes as a later generation)",
                 slot, c->who.rank, c->who.pid, cg);
        return R_SECOND_PROCESS;
    }
    return R_NONE;
}

/* The process entry of worker id `id`, authenticated as who, for rollout rank slot: NULL with *r and why when it is
 * refused. A process has one worker id; a new process of a rank takes the rank when none serves it, when the one
 * that does is lost, or when it is of a later generation (a replacement): the one before is superseded. So the
 * table holds at most one live process per rollout rank, whatever one key asks. */
static struct proc *proc_of(struct dispatch_core *d, uint64_t id, const struct plane_id *who, int slot, double now,
                            enum refusal *r, char *why, size_t len)
{
    *r = R_NONE;
    for (int i = 0; i < d->nprocs; i++) {
        struct proc *p = &d->procs[i];
        if (!same_who(&p->who, who))
            continue;
        if (p->superseded) {
            *r = displaced(d, who, slot, why, len);
            return NULL;
        }
        if (p->id != id) { /* its own key, phantom ids: they would fill the table and keep real processes out */
            *r = R_SECOND_ID;
            snprintf(why, len,
                     "worker id %016" PRIx64 " is a second id of world rank %d's process (pid %u): a process has "
                     "one worker id",
                     id, who->rank, who->pid);
            return NULL;
        }
        if (!p->alive)
            log_info("dispatch", "rollout process %016" PRIx64 " (rank %d) is back%s", id, p->slot,
                     d->bc_on && !d->bc_off ? ": the weight broadcast resumes once every rollout rank's is there" : "");
        set_alive(d, p, true);
        p->last_seen = now;
        return p;
    }
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].id == id) {
            *r = R_THEIRS;
            snprintf(why, len,
                     "worker id %016" PRIx64 " is another process's (this one is world rank %d, pid %u): "
                     "no process speaks for another",
                     id, who->rank, who->pid);
            return NULL;
        }
    if ((*r = displaced(d, who, slot, why, len)) != R_NONE)
        return NULL;
    /* a new process of the rank: an unused entry, else the superseded one heard from least recently (there is
     * one: the table has more entries than ranks, and every entry not superseded is a rank's current process) */
    int i = d->nprocs < d->maxprocs ? d->nprocs++ : -1;
    for (int j = 0; i < 0 && j < d->nprocs; j++)
        if (d->procs[j].superseded && (i < 0 || d->procs[j].last_seen < d->procs[i].last_seen))
            i = j;
    if (i < 0)
        abort(); /* cannot be: see above */
    const int ci = d->current[slot];
    const char *how = d->slot_seen[slot] ? "takes over" : "serves";
    if (ci >= 0) { /* the rank's process before: lost, or alive and of an older generation */
        struct proc *old = &d->procs[ci];
        char units[256];
        const bool was_alive = old->alive;
        old->superseded = true; /* before release: a superseded process turns the broadcast off */
        release(d, ci, "superseded", units, sizeof units);
        if (was_alive) {
            d->st.replaced++;
            how = "supersedes the live process of";
            log_warn("dispatch",
                     "rollout process %016" PRIx64 " (pid %u, generation %u) supersedes rollout rank %d's process "
                     "%016" PRIx64 " (pid %u, generation %u); %s%s%s",
                     id, who->pid, plane_generation(who->incarnation), slot, old->id, old->who.pid,
                     plane_generation(old->who.incarnation), units[0] ? "its unit(s) (step/unit) " : "it held no unit",
                     units, units[0] ? " are granted again" : "");
        }
    }
    set_alive(d, &d->procs[i], false); /* an entry reused (a superseded process's: not alive already) */
    d->procs[i] = (struct proc){.id = id, .who = *who, .slot = slot, .last_seen = now, .held = -1, .sent_for = -1};
    set_alive(d, &d->procs[i], true);
    d->current[slot] = i;
    d->slot_seen[slot] = true;
    log_info("dispatch", "rollout process %016" PRIx64 " (pid %u, generation %u) %s rollout rank %d", id, who->pid,
             plane_generation(who->incarnation), how, slot);
    return &d->procs[i];
}

/* Whether the authenticated process who may make one more request at time now (its token bucket). */
static bool peer_allow(struct dispatch_core *d, const struct plane_id *who, double now)
{
    struct peer *p = NULL;
    for (int i = 0; i < d->npeers && !p; i++)
        if (same_who(&d->peers[i].who, who))
            p = &d->peers[i];
    if (!p) { /* a fresh budget; when the table is full, the one used least recently goes */
        int i = d->npeers < d->maxpeers ? d->npeers++ : 0;
        for (int j = 1; i == 0 && j < d->npeers; j++)
            if (d->peers[j].used < d->peers[i].used)
                i = j;
        p = &d->peers[i];
        *p = (struct peer){.who = *who, .tokens = DISPATCH_RATE_BURST, .at = now};
    }
    p->used = ++d->peer_clock;
    if (now > p->at) {
        p->tokens += (now - p->at) * DISPATCH_RATE_PER_S;
        if (p->tokens > DISPATCH_RATE_BURST)
            p->tokens = DISPATCH_RATE_BURST;
        p->at = now;
    }
    if (p->tokens < 1)
        return false;
    p->tokens -= 1;
    return true;
}

/* Processes silent past the limit are lost; their units go back to be granted again. */
static void reap(struct dispatch_core *d, double now)
{
    for (int i = 0; i < d->nprocs; i++) {
        struct proc *p = &d->procs[i];
        if (!p->alive || now - p->last_seen <= d->o.lost_after_s)
            continue;
        char units[256];
        release(d, i, "lost", units, sizeof units);
        d->st.lost++;
        log_warn("dispatch",
                 "rollout process %016" PRIx64 " (rank %d) lost: silent for %.1f s; %s%s%s. Relaunch it with "
                 "grpo-worker --replace-rank (see docs/operations.md)",
                 p->id, p->slot, now - p->last_seen, units[0] ? "its unit(s) (step/unit) " : "it held no unit", units,
                 units[0] ? " go to the other rollout processes" : "");
    }
}

static const struct snapshot *snapshot_of(const struct dispatch_core *d, int64_t v)
{
    if (v < 0) /* -1 marks a snapshot being written */
        return NULL;
    for (int i = 0; i < d->nsnap; i++)
        if (d->snaps[i].version == v && d->snaps[i].w)
            return &d->snaps[i];
    return NULL;
}

static int64_t version_for(const struct dispatch_core *d, int64_t k)
{
    const int64_t v = k - 1 - d->o.staleness, floor = d->o.version_floor_set ? d->o.version_floor : d->o.start;
    return v > floor ? v : floor;
}

/* How long a grant lasts before the unit may be granted again: DISPATCH_LEASE_FACTOR times the longest a unit has
 * taken in this run, and never less than the floor (DISPATCH_LEASE_FLOOR_S unless the options lower it). */
static double lease_s(const struct dispatch_core *d)
{
    const double l = DISPATCH_LEASE_FACTOR * d->longest_s;
    const double floor = d->o.lease_floor_s > 0 ? d->o.lease_floor_s : DISPATCH_LEASE_FLOOR_S;
    return l > floor ? l : floor;
}

/* Process pi says it finished and delivered unit u of step k (the last unit granted to it): its lease is kept
 * for good (never granted again while it lives), and the time it took counts towards the leases. A word about a
 * unit it no longer holds (granted again meanwhile, or its step trained) changes nothing. */
static void async_delivered(struct dispatch_core *d, int pi, int64_t chunk, int u, double now);

static void delivered(struct dispatch_core *d, int pi, int64_t k, int u, double now)
{
    if (d->o.async) {
        async_delivered(d, pi, k, u, now);
        return;
    }
    const int64_t j = k - d->win0;
    if (k <= 0 || j < 0 || j >= d->window || u < 0 || u >= d->o.units)
        return;
    struct lease *l = &d->lease[j * d->o.units + u];
    if (l->holder != pi || l->done)
        return;
    l->done = true;
    d->st.delivered++;
    if (now - l->since > d->longest_s)
        d->longest_s = now - l->since;
}

/* Grant unit u of the window's step j (to the process serving rollout rank slot). */
static void give_unit(struct dispatch_core *d, Grpo__WorkGrant *g, int j, int u, int slot)
{
    d->ever[((size_t)j * d->o.units + u) * d->o.units + slot] = true;
    g->kind = WORK_UNIT;
    g->step = d->win0 + j;
    g->unit = u;
    g->version = version_for(d, g->step);
}

static void async_grant(struct dispatch_core *d, int pi, bool names_done, Grpo__WorkGrant *g, char *reason, size_t rlen,
                        double now);

/* The next unit for process p, or a wait / end with its reason. */
static void grant(struct dispatch_core *d, int pi, bool names_done, Grpo__WorkGrant *g, char *reason, size_t rlen,
                  double now)
{
    struct proc *p = &d->procs[pi];
    if (d->o.async && d->end_after < 0) {
        async_grant(d, pi, names_done, g, reason, rlen, now);
        return;
    }
    g->start_step = d->o.start;
    g->total_steps = d->o.total_steps;
    g->start_epoch = d->o.start_epoch;
    g->start_cursor = d->o.start_cursor;
    g->n_floats = d->o.n_floats;
    g->units = d->o.units;
    if (d->end_after >= 0) {
        g->kind = WORK_END;
        g->step = d->end_after;
        snprintf(reason, rlen, "%s", d->end_why);
        return;
    }
    if (d->latest < 0) {
        g->kind = WORK_WAIT;
        snprintf(reason, rlen, "the trainers have not published their first weights yet");
        return;
    }
    /* a unit it holds and has not delivered: the answer that granted it was lost (it asked again), so it is
     * granted again, the same unit */
    for (int j = 0; j < d->window && names_done; j++)
        for (int u = 0; u < d->o.units; u++) {
            struct lease *l = &d->lease[j * d->o.units + u];
            if (l->holder != pi || l->done)
                continue;
            l->since = now;
            log_info("dispatch",
                     "step %lld unit %d granted again to the process serving rank %d, which holds it and asks "
                     "again (it never heard the answer)",
                     (long long)d->win0 + j, u, p->slot);
            give_unit(d, g, j, u, p->slot);
            return;
        }
    for (int j = 0; j < d->window; j++) {
        int64_t k = d->win0 + j;
        if (k > d->o.total_steps)
            break;
        int pick = -1;
        if (d->lease[j * d->o.units + p->slot].holder == PENDING)
            pick = p->slot;
        for (int u = 0; u < d->o.units && pick < 0; u++)
            if (d->lease[j * d->o.units + u].holder == PENDING && orphaned(d, u, now))
                pick = u;
        if (pick < 0)
            continue;
        d->lease[j * d->o.units + pick] = (struct lease){.holder = pi, .since = now};
        d->st.granted++;
        if (pick != p->slot) {
            d->st.regranted++;
            log_info("dispatch", "step %lld unit %d (rollout rank %d's) granted to the process serving rank %d",
                     (long long)k, pick, pick, p->slot);
        }
        give_unit(d, g, j, pick, p->slot);
        return;
    }
    /* nothing else to do: a lease past its deadline (its holder alive but silent about it) is granted to this
     * process too; whichever copy reaches the trainers first counts */
    const double lease = lease_s(d);
    for (int j = 0; j < d->window && d->win0 + j <= d->o.total_steps; j++)
        for (int u = 0; u < d->o.units; u++) {
            struct lease *l = &d->lease[j * d->o.units + u];
            if (l->holder == PENDING || l->holder == pi || l->done || now - l->since <= lease)
                continue;
            log_warn("dispatch",
                     "step %lld unit %d: the process serving rank %d has held it %.0f s, past its lease of %.0f s; "
                     "granted again to the process serving rank %d",
                     (long long)d->win0 + j, u, d->procs[l->holder].slot, now - l->since, lease, p->slot);
            *l = (struct lease){.holder = pi, .since = now};
            d->st.granted++;
            d->st.regranted++;
            d->st.expired++;
            give_unit(d, g, j, u, p->slot);
            return;
        }
    g->kind = WORK_WAIT;
    int64_t next = d->win0 + d->window;
    g->step = next; /* the next step to grant: past total_steps, every step is granted */
    if (next > d->o.total_steps)
        snprintf(reason, rlen, "every step is granted; the trainers finish step %lld", (long long)d->o.total_steps);
    else
        snprintf(reason, rlen, "step %lld waits for the trainers' policy version %lld", (long long)next,
                 (long long)version_for(d, next));
}

/* The broadcast is on, not given up, and the run goes on. */
static bool broadcasting(const struct dispatch_core *d) { return d->bc_on && !d->bc_off && d->end_after < 0; }

/* The first rollout rank whose process was heard from and is now lost (silent past lost_after_s), or -1: while
 * one is, no round begins and each version is fetched (a rank that has not come yet is waited for instead). */
static int slot_lost(const struct dispatch_core *d)
{
    for (int u = 0; u < d->o.units; u++)
        if (d->slot_seen[u] && !slot_alive(d, u))
            return u;
    return -1;
}

/* The broadcast's round of version v may begin: no round is under way, and every rollout rank's process has asked
 * for v, which is held, newer than any broadcast or skipped. */
static bool round_ready(const struct dispatch_core *d, int64_t *v)
{
    if (!broadcasting(d) || d->bc_round >= 0)
        return false;
    const int64_t x = d->bc_want[0];
    for (int u = 0; u < d->o.units; u++)
        if (d->bc_want[u] != x || !slot_alive(d, u))
            return false;
    if (x <= d->bc_done || x <= d->bc_skip || !snapshot_of(d, x))
        return false;
    *v = x;
    return true;
}

/* Every version asked for, and none broadcast, by the rendezvous: fetched instead. */
static void skip_wanted(struct dispatch_core *d, const char *why)
{
    int64_t newest = -1;
    for (int u = 0; u < d->o.units; u++) {
        if (d->bc_want[u] > newest)
            newest = d->bc_want[u];
        d->bc_want[u] = -1;
    }
    if (newest > d->bc_skip) {
        d->bc_skip = newest;
        log_info("dispatch", "policy version %lld is fetched, not broadcast: %s", (long long)newest, why);
    }
}

/* The answer to a broadcast ask for held version v from rollout rank `slot`'s process: 1 wait, 2 join the round
 * now, 3 fetch it. */
static int broadcast_answer(struct dispatch_core *d, int slot, int64_t v, double now)
{
    enum { WAIT = 1, JOIN = 2, FETCH = 3 };
    if (!broadcasting(d) || slot < 0)
        return FETCH;
    if (d->bc_round >= 0)
        return d->bc_round == v ? JOIN : FETCH;
    if (v <= d->bc_done || v <= d->bc_skip)
        return FETCH;
    const int lost = slot_lost(d);
    if (lost >= 0) { /* fetch until it is back (v > bc_skip here: skip_wanted records it) */
        char why[128];
        snprintf(why, sizeof why, "rollout rank %d's process is silent", lost);
        d->bc_want[slot] = v;
        skip_wanted(d, why);
        return FETCH;
    }
    if (d->bc_want[slot] != v) {
        d->bc_want[slot] = v;
        d->bc_asked[slot] = now;
    }
    for (int u = 0; u < d->o.units; u++)
        if (d->bc_want[u] >= 0 && now - d->bc_asked[u] > d->bc_rendezvous_s) {
            char why[160];
            snprintf(why, sizeof why, "rollout rank %d asked %.0f s ago and not every rank has asked for it since", u,
                     now - d->bc_asked[u]);
            skip_wanted(d, why);
            return FETCH;
        }
    return WAIT;
}

/* ---- the relay tree ---- */

/* What version s cost this rank: its bytes served, in copies, and how the processes took it (the log). */
static void served_log(struct dispatch_core *d, const struct snapshot *s)
{
    if (s->version < 0 || (s->bytes == 0 && s->assigned == 0))
        return;
    const double copies = d->o.n_floats ? (double)s->bytes / ((double)d->o.n_floats * sizeof(float)) : 0;
    if (d->o.relay_fanout > 0)
        log_info("dispatch",
                 "policy version %lld: %lld weight bytes served from here (%.2f copies); relay tree of fan-out %d: %d "
                 "process(es) sent here, %d named a holder, %d after a relay failed them, %d said they hold it",
                 (long long)s->version, (long long)s->bytes, copies, d->o.relay_fanout, s->direct,
                 s->assigned - s->direct, s->fallbacks, s->holders);
    else
        log_info("dispatch", "policy version %lld: %lld weight bytes served from here (%.2f copies)",
                 (long long)s->version, (long long)s->bytes, copies);
}

/* Rollout rank slot's relay failed the process of asker_slot for version v: its process is never named again. */
static void bar_relay(struct dispatch_core *d, int slot, int asker_slot, int64_t v)
{
    if (slot < 0 || slot >= d->o.units || d->current[slot] < 0)
        return;
    struct proc *p = &d->procs[d->current[slot]];
    d->st.relay_failed++;
    /* a relay named to several before the first of them said it failed is reported by each */
    log_warn("dispatch",
             "rollout rank %d's weight relay failed rollout rank %d for policy version %lld (a wrong digest, no "
             "answer, or gone): %s, and rank %d fetches the version from here",
             slot, asker_slot, (long long)v,
             p->relay_barred ? "it was named before it was barred" : "it is never named a relay again", asker_slot);
    if (!p->relay_barred)
        d->st.relays_barred++;
    p->relay_barred = true;
}

/* The answer to a relay ask (WeightsRequest.relay) for held version s from the process authenticated as who, of
 * rollout rank slot (-1: not a live process of its own id), into *ch: the digest and the token, and fetch it here,
 * from a holder, or wait. A holding report records where the asker serves it; a failure report bars the relay and
 * sends the asker here. */
static void relay_answer(struct dispatch_core *d, struct snapshot *s, const Grpo__WeightsRequest *w,
                         const struct plane_id *who, int slot, Grpo__WeightsChunk *ch)
{
    ch->digest.data = s->digest;
    ch->digest.len = RELAY_DIGEST_BYTES;
    ch->relay_token.data = s->token;
    ch->relay_token.len = RELAY_TOKEN_BYTES;
    struct proc *me = NULL;
    for (int i = 0; i < d->nprocs && !me; i++)
        if (d->procs[i].id == w->worker_id && d->procs[i].alive && same_who(&d->procs[i].who, who))
            me = &d->procs[i];
    if (w->holds) { /* it holds the version whole, checked: it serves it from now on */
        if (me && w->relay_endpoint && w->relay_endpoint[0] && strlen(w->relay_endpoint) < sizeof me->relay_ep &&
            me->held != s->version) {
            me->held = s->version;
            me->kids = 0;
            snprintf(me->relay_ep, sizeof me->relay_ep, "%s", w->relay_endpoint);
            s->holders++;
        }
        return;
    }
    const int k = d->o.relay_fanout;
    if (w->bad_relay > 0) { /* a relay failed it: the asker takes it from here */
        bar_relay(d, (int)w->bad_relay - 1, slot, s->version);
        s->fallbacks++;
        d->st.relay_direct++;
        if (me)
            me->sent_for = s->version;
        return;
    }
    if (s->direct < k || !me) { /* the tree's first level (or a process the tree does not know): from here */
        s->direct++;
        s->assigned++;
        d->st.relay_direct++;
        if (me)
            me->sent_for = s->version;
        return;
    }
    /* a holder with room, the one named least so far (the tree fills level by level) */
    struct proc *best = NULL;
    bool coming = false; /* a live process on its way to hold it (sent for it, not holding it yet) */
    for (int i = 0; i < d->nprocs; i++) {
        struct proc *p = &d->procs[i];
        if (p == me || !p->alive || p->superseded)
            continue;
        coming |= p->sent_for == s->version && p->held != s->version && !p->relay_barred;
        if (p->relay_barred || p->held != s->version || p->kids >= k)
            continue;
        if (!best || p->kids < best->kids)
            best = p;
    }
    if (best) {
        log_debug("dispatch", "policy version %lld: rollout rank %d takes it from rollout rank %d's relay",
                  (long long)s->version, slot, best->slot);
        best->kids++;
        s->assigned++;
        d->st.relayed++;
        me->sent_for = s->version;
        ch->relay_endpoint = best->relay_ep;
        ch->relay_rank = best->slot;
        return;
    }
    if (coming) { /* live processes on their way to hold it: one will have room */
        ch->relay_wait = true;
        return;
    }
    s->direct++; /* no holder can take it (barred, gone) and none is coming: from here */
    s->assigned++;
    d->st.relay_direct++;
    me->sent_for = s->version;
}

/* The asker of the request being answered: its identity and counter (NULL who: it had no good MAC). */
struct asker {
    const struct plane_id *who;
    uint64_t counter;
};

/* An error reply to request_id, authenticated for the asker when it was. */
static uint8_t *refuse_retry(struct dispatch_core *d, const struct asker *a, uint64_t request_id, const char *error,
                             bool retry, size_t *len)
{
    d->st.refused++;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Reply reply = GRPO__REPLY__INIT;
    reply.error = (char *)error;
    reply.retry = retry;
    env.request_id = request_id;
    env.body_case = GRPO__ENVELOPE__BODY_REPLY;
    env.reply = &reply;
    return CHECK_ALLOC(plane_pack_answer(&env, &d->auth, a->who, a->counter, len));
}

static uint8_t *refuse(struct dispatch_core *d, const struct asker *a, uint64_t request_id, const char *error,
                       size_t *len)
{
    return refuse_retry(d, a, request_id, error, false, len);
}

/* The rollout slot of world rank `rank` (-1: not a rollout rank of this run). */
static int slot_of_rank(const struct dispatch_core *d, int rank)
{
    const int tp = d->o.rollout_tp > 1 ? d->o.rollout_tp : 1;
    const int off = rank - d->o.first_rollout_rank;
    if (off < 0 || off >= d->o.units * tp)
        return -1;
    return off / tp;
}

/* The answer to a decoded request that carried a good MAC of a rollout process, of slot `slot`. */
static uint8_t *answer(struct dispatch_core *d, const Grpo__Envelope *req, const struct asker *a, int slot, double now,
                       size_t *len)
{
    Grpo__Envelope out = GRPO__ENVELOPE__INIT;
    out.request_id = req->request_id;
    Grpo__WorkGrant g = GRPO__WORK_GRANT__INIT;
    Grpo__WeightsChunk ch = GRPO__WEIGHTS_CHUNK__INIT;
    char reason[512] = "";
    if (req->body_case == GRPO__ENVELOPE__BODY_WORK_REQUEST) {
        const Grpo__WorkRequest *w = req->work_request;
        if (w->rank < 0 || w->rank >= d->o.units) {
            snprintf(reason, sizeof reason, "rollout rank %d: this run has rollout ranks 0..%d", (int)w->rank,
                     d->o.units - 1);
            return refuse(d, a, req->request_id, reason, len);
        }
        if (w->rank != slot) { /* a ping or a claim for another process's rank */
            snprintf(reason, sizeof reason,
                     "a %s for rollout rank %d from a process authenticated as world rank %d (rollout rank %d's): "
                     "no process speaks for another",
                     w->ping ? "ping" : "work request", (int)w->rank, a->who->rank, slot);
            log_warn("dispatch", "refused %s", reason);
            return refuse(d, a, req->request_id, reason, len);
        }
        enum refusal r;
        struct proc *p = proc_of(d, w->worker_id, a->who, w->rank, now, &r, reason, sizeof reason);
        if (!p) {
            const char *what = w->ping ? "ping" : "work request";
            if (r == R_SUPERSEDED) { /* counted; a process that keeps asking says so once per 5 s */
                d->st.superseded++;
                log_warn_every("dispatch", "refused a %s of world rank %d (pid %u): %s (%" PRId64 " so far)", what,
                               a->who->rank, a->who->pid, reason, d->st.superseded);
            } else if (r == R_THEIRS) {
                log_warn("dispatch", "refused a %s: %s", what, reason);
            } else {
                d->st.second++;
                log_warn_every("dispatch", "refused a %s: %s (%" PRId64 " so far)", what, reason, d->st.second);
            }
            return refuse(d, a, req->request_id, reason, len);
        }
        p->heard_end |= w->end_heard && d->end_after >= 0;
        if (w->ping) {
            g.kind = d->end_after >= 0 ? WORK_END : WORK_WAIT;
            snprintf(reason, sizeof reason, "%s", d->end_after >= 0 ? d->end_why : "alive");
            if (d->end_after >= 0) /* as a work request's end says it: where it ended, and the run's last step */
                g.step = d->end_after, g.total_steps = d->o.total_steps;
        } else {
            if (w->names_done)
                delivered(d, (int)(p - d->procs), w->done_step, w->done_unit, now);
            grant(d, (int)(p - d->procs), w->names_done, &g, reason, sizeof reason, now);
        }
        g.reason = reason;
        g.latest_version = d->latest;
        out.body_case = GRPO__ENVELOPE__BODY_WORK_GRANT;
        out.work_grant = &g;
    } else if (req->body_case == GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST) {
        const Grpo__WeightsRequest *w = req->weights_request;
        /* a superseded process gets no weights, nor a second one of a live process's generation (a process that
         * was never heard from may fetch: it fetches before it asks for work) */
        bool registered = false;
        for (int i = 0; i < d->nprocs && !registered; i++)
            registered = !d->procs[i].superseded && same_who(&d->procs[i].who, a->who);
        const enum refusal r = registered ? R_NONE : displaced(d, a->who, slot, reason, sizeof reason);
        if (r != R_NONE) {
            if (r == R_SUPERSEDED) {
                d->st.superseded++;
                log_warn_every("dispatch",
                               "refused a weights request of world rank %d (pid %u): %s (%" PRId64 " so far)",
                               a->who->rank, a->who->pid, reason, d->st.superseded);
            } else {
                d->st.second++;
            }
            return refuse(d, a, req->request_id, reason, len);
        }
        int bslot = -1; /* the asker's rollout rank in the broadcast (-1: not a live process of its own id) */
        for (int i = 0; i < d->nprocs; i++)
            if (d->procs[i].id == w->worker_id && d->procs[i].alive && same_who(&d->procs[i].who, a->who)) {
                d->procs[i].last_seen = now;
                bslot = d->procs[i].slot;
            }
        struct snapshot *s = (struct snapshot *)snapshot_of(d, w->version);
        ch.version = w->version;
        ch.offset = w->offset;
        ch.n_floats = d->o.n_floats;
        if (w->broadcast && s)
            ch.broadcast = broadcast_answer(d, bslot, w->version, now);
        else if (w->relay && s && d->o.relay_fanout > 0)
            relay_answer(d, s, w, a->who, bslot, &ch);
        else if (!s) {
            /* a relay that failed the asker is barred all the same: the version went by while the asker waited on
             * it (a silent relay holds it up for its timeout), and the asker then asks for new work */
            if (w->relay && w->bad_relay > 0 && d->o.relay_fanout > 0)
                bar_relay(d, (int)w->bad_relay - 1, bslot, w->version);
            snprintf(reason, sizeof reason, "policy version %lld is not held (newest %lld)", (long long)w->version,
                     (long long)d->latest);
        } else if (w->offset > d->o.n_floats || w->count > CHUNK_MAX_FLOATS || w->count > d->o.n_floats - w->offset)
            snprintf(reason, sizeof reason,
                     "floats %" PRIu64 "+%" PRIu64 " out of range (%zu parameters, chunks of at most %zu)", w->offset,
                     w->count, d->o.n_floats, CHUNK_MAX_FLOATS);
        else {
            ch.data.data = (uint8_t *)(s->w + w->offset);
            ch.data.len = (size_t)w->count * sizeof(float);
            d->st.bytes += (int64_t)ch.data.len;
            s->bytes += (int64_t)ch.data.len;
        }
        ch.error = reason;
        out.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK;
        out.weights_chunk = &ch;
    } else { /* refused before its MAC (dispatch_core_handle): not reached */
        return refuse(d, a, req->request_id, "the dispatcher takes work and weights requests only", len);
    }
    /* copies the chunk (the shell holds its lock) */
    return CHECK_ALLOC(plane_pack_answer(&out, &d->auth, a->who, a->counter, len));
}

/* The most bytes a request of this kind may hold (0: a kind the dispatcher does not take). */
static size_t kind_bound(Grpo__Envelope__BodyCase kind)
{
    return kind == GRPO__ENVELOPE__BODY_WORK_REQUEST      ? DISPATCH_MAX_WORK_REQUEST_BYTES
           : kind == GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST ? DISPATCH_MAX_WEIGHTS_REQUEST_BYTES
                                                          : 0;
}

uint8_t *dispatch_core_handle(struct dispatch_core *d, const void *msg, size_t n, double now, size_t *len)
{
    char why[512];
    const struct asker none = {0};
    if (n > GRPO_MAX_DISPATCH_REQUEST_BYTES) { /* refused by its size alone: no decoding, no MAC over it */
        d->st.oversized++;
        snprintf(why, sizeof why, "a request of %zu bytes; the dispatcher takes at most %u", n,
                 (unsigned)GRPO_MAX_DISPATCH_REQUEST_BYTES);
        return refuse(d, &none, 0, why, len);
    }
    Grpo__Envelope *req = protocol_unpack(msg, n, why, sizeof why);
    if (!req)
        return refuse(d, &none, 0, why, len);
    /* bounded by its kind before any MAC: a flood of requests, authenticated or not, costs the dispatcher a MAC of
     * at most DISPATCH_MAX_*_REQUEST_BYTES each */
    const size_t bound = kind_bound(req->body_case);
    if (!bound || n > bound) {
        if (bound) {
            d->st.oversized++;
            snprintf(why, sizeof why, "a %s of %zu bytes; it holds at most %zu (refused by its size, unauthenticated)",
                     protocol_body_name(req->body_case), n, bound);
            log_warn_every("dispatch", "refused %s (%" PRId64 " refused by their size so far)", why, d->st.oversized);
        } else {
            snprintf(why, sizeof why, "a %s: the dispatcher takes work and weights requests only",
                     protocol_body_name(req->body_case));
        }
        uint8_t *out = refuse(d, &none, req->request_id, why, len);
        protocol_free(req);
        return out;
    }
    uint8_t *out;
    struct plane_id who;
    uint64_t counter;
    enum plane_verdict pv;
    if ((pv = plane_verify_request(&d->auth, req, &who, &counter, why, sizeof why)) != PLANE_OK) {
        /* no good MAC (or a replay: a request is never resent by its REQ socket) */
        const struct asker a = {.who = pv == PLANE_REPLAY || pv == PLANE_REPEAT ? &who : NULL, .counter = counter};
        if (pv == PLANE_REPEAT)
            snprintf(why, sizeof why, "a replayed message: rank %d (pid %u) used counter %" PRIu64 " already", who.rank,
                     who.pid, counter);
        if (pv == PLANE_EPOCH) { /* counted; a replay of a whole launch's capture says so once per 5 s */
            d->st.old_epoch++;
            log_warn_every("dispatch", "refused a %s claiming world rank %d: %s (%" PRId64 " so far)",
                           protocol_body_name(req->body_case), who.rank, why, d->st.old_epoch);
        }
        out = refuse(d, &a, req->request_id, why, len);
    } else {
        const struct asker a = {.who = &who, .counter = counter};
        const int slot = slot_of_rank(d, who.rank);
        if (!peer_allow(d, &who, now)) { /* over its budget: refused at once, to be asked again a little later */
            d->st.rate_limited++;
            snprintf(why, sizeof why,
                     "rate limited: world rank %d (pid %u) asks more than %.0f requests per second (bursts of %.0f); "
                     "ask again shortly",
                     who.rank, who.pid, DISPATCH_RATE_PER_S, DISPATCH_RATE_BURST);
            log_warn_every("dispatch", "refused a %s: %s (%" PRId64 " rate limited so far)",
                           protocol_body_name(req->body_case), why, d->st.rate_limited);
            out = refuse_retry(d, &a, req->request_id, why, true, len);
        } else if (slot < 0) {
            snprintf(why, sizeof why,
                     "world rank %d is not a rollout rank of this run (ranks %d..%d): work and weights go to "
                     "rollout processes only",
                     who.rank, d->o.first_rollout_rank,
                     d->o.first_rollout_rank + d->o.units * (d->o.rollout_tp > 1 ? d->o.rollout_tp : 1) - 1);
            out = refuse(d, &a, req->request_id, why, len);
        } else {
            out = answer(d, req, &a, slot, now, len);
        }
    }
    protocol_free(req);
    return out;
}

void dispatch_core_tick(struct dispatch_core *d, double now) { reap(d, now); }

struct dispatch_core *dispatch_core_create(const struct dispatch_options *o, double now, char *err, size_t errlen)
{
    if (o->units < 1 || o->staleness < 0) {
        error_set(err, errlen, "dispatcher: %d units, staleness %d", o->units, o->staleness);
        return NULL;
    }
    struct dispatch_core *d = xcalloc(1, sizeof *d);
    d->o = *o;
    d->o.endpoint = NULL;
    d->o.run_key = NULL;
    plane_verifier_init(&d->auth, o->run_key, o->epoch); /* NULL: not set, every request refused */
    /* every process the table of processes can hold, each rank's and the superseded ones it remembers */
    plane_verifier_capacity(&d->auth, 4 * o->units * (o->rollout_tp > 0 ? o->rollout_tp : 1) + 16);
    d->latest = -1;
    d->end_after = -1;
    d->window = o->staleness + 1;
    d->win0 = o->start + 1;
    d->nsnap = o->staleness + 1;
    d->snaps = xcalloc((size_t)d->nsnap, sizeof *d->snaps);
    for (int i = 0; i < d->nsnap; i++)
        d->snaps[i].version = -1;
    d->lease = xmalloc((size_t)d->window * (size_t)o->units * sizeof *d->lease);
    for (int i = 0; i < d->window * o->units; i++)
        d->lease[i] = pending_lease;
    d->ever = xcalloc((size_t)d->window * (size_t)o->units * (size_t)o->units, sizeof *d->ever);
    d->slot_seen = xcalloc((size_t)o->units, sizeof *d->slot_seen);
    d->current = xmalloc((size_t)o->units * sizeof *d->current);
    d->slot_live = xcalloc((size_t)o->units, sizeof *d->slot_live);
    for (int u = 0; u < o->units; u++)
        d->current[u] = -1;
    d->maxprocs = 2 * o->units + 8; /* a current process per rank, and room to remember superseded ones */
    d->procs = xcalloc((size_t)d->maxprocs, sizeof *d->procs);
    d->maxpeers = 4 * o->units + 16;
    d->peers = xcalloc((size_t)d->maxpeers, sizeof *d->peers);
    d->bc_want = xmalloc((size_t)o->units * sizeof *d->bc_want);
    d->bc_asked = xcalloc((size_t)o->units, sizeof *d->bc_asked);
    for (int u = 0; u < o->units; u++)
        d->bc_want[u] = -1;
    d->bc_round = d->bc_done = d->bc_skip = -1;
    d->opened_at = now;
    if (o->async) {
        if (o->unit_groups < 1 || o->max_groups < o->unit_groups) {
            error_set(err, errlen, "dispatcher: %d groups a unit, at most %lld outstanding", o->unit_groups,
                      (long long)o->max_groups);
            dispatch_core_free(d);
            return NULL;
        }
        for (int i = 0; i < d->nsnap; i++)
            free(d->snaps[i].w);
        free(d->snaps);
        d->nsnap = o->keep_versions > 0 ? o->keep_versions : 3;
        d->snaps = xcalloc((size_t)d->nsnap, sizeof *d->snaps);
        for (int i = 0; i < d->nsnap; i++)
            d->snaps[i].version = -1;
        d->a_next = o->stream_next;
        d->a_granted = o->outstanding;
        d->a_window = o->outstanding;
        d->n_rp = o->n_replay;
        d->rp = xcalloc((size_t)(o->n_replay ? o->n_replay : 1), sizeof *d->rp);
        for (int i = 0; i < o->n_replay; i++) {
            const struct dispatch_replay *x = &o->replay[i];
            int64_t *v = xmalloc((size_t)(x->n_phases ? x->n_phases : 1) * sizeof *v);
            const size_t nt = (size_t)x->n_phases * (size_t)x->n_seq;
            int32_t *t = xmalloc((nt ? nt : 1) * sizeof *t);
            memcpy(v, x->versions, (size_t)x->n_phases * sizeof *v);
            memcpy(t, x->tokens, nt * sizeof *t);
            d->rp[i] = *x;
            d->rp[i].versions = v;
            d->rp[i].tokens = t;
        }
        d->replaying = o->replay != NULL;
        d->o.replay = NULL;
    }
    return d;
}

void dispatch_core_free(struct dispatch_core *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->nsnap; i++) {
        served_log(d, &d->snaps[i]);
        free(d->snaps[i].w);
    }
    free(d->snaps), free(d->lease), free(d->ever), free(d->slot_seen), free(d->bc_want), free(d->bc_asked);
    for (int i = 0; i < d->n_al; i++)
        free(d->al[i].ever);
    free(d->al);
    for (int i = 0; i < d->n_rp; i++) {
        free((void *)d->rp[i].versions);
        free((void *)d->rp[i].tokens);
    }
    free(d->rp);
    free(d->current), free(d->slot_live), free(d->procs), free(d->peers);
    plane_verifier_free(&d->auth);
    free(d);
}

float *dispatch_core_publish_begin(struct dispatch_core *d, int64_t version)
{
    if (d->writing || snapshot_of(d, version)) /* held already: a version never changes, and one may be read */
        return NULL;
    int slot = 0; /* the oldest (or an empty) snapshot makes room */
    for (int i = 1; i < d->nsnap; i++)
        if (d->snaps[i].version < d->snaps[slot].version)
            slot = i;
    struct snapshot *s = &d->snaps[slot];
    if (!s->w)
        s->w = xmalloc(d->o.n_floats * sizeof(float));
    served_log(d, s);
    s->direct = s->assigned = s->holders = s->fallbacks = 0;
    s->bytes = 0;
    /* nobody is served from the oldest snapshot once its steps are trained; it is marked empty while written */
    s->version = -1;
    d->writing = s;
    return s->w;
}

uint8_t *dispatch_core_publish_digest(struct dispatch_core *d)
{
    return d->writing && d->o.relay_fanout > 0 ? d->writing->digest : NULL;
}

void dispatch_core_publish_end(struct dispatch_core *d, int64_t version)
{
    if (!d->writing)
        return;
    d->writing->version = version;
    if (d->o.relay_fanout > 0)
        relay_token(d->auth.run_key, d->o.epoch, version, d->writing->token);
    d->writing = NULL;
    if (d->o.async) { /* a push: verl's count starts again from what is outstanding */
        if (version > d->latest)
            d->latest = version;
        d->a_window = d->a_granted - d->a_taken;
        return;
    }
    if (version > d->latest) {
        /* steps up to version are trained: the window moves to version + 1, keeping the leases it still holds (and
         * never before start + 1: a version older than start, published for the step after it, opens nothing) */
        const int64_t nw0 = version + 1 > d->o.start + 1 ? version + 1 : d->o.start + 1;
        struct lease *h = xmalloc((size_t)d->window * (size_t)d->o.units * sizeof *h);
        for (int j = 0; j < d->window; j++)
            for (int u = 0; u < d->o.units; u++) {
                int64_t k = nw0 + j, oj = k - d->win0;
                h[j * d->o.units + u] = oj >= 0 && oj < d->window ? d->lease[oj * d->o.units + u] : pending_lease;
            }
        const size_t uu = (size_t)d->o.units * (size_t)d->o.units;
        bool *e = xcalloc((size_t)d->window * uu, sizeof *e);
        for (int j = 0; j < d->window; j++) {
            int64_t oj = nw0 + j - d->win0;
            if (oj >= 0 && oj < d->window)
                memcpy(e + (size_t)j * uu, d->ever + (size_t)oj * uu, uu * sizeof *e);
        }
        free(d->ever);
        d->ever = e;
        free(d->lease);
        d->lease = h;
        d->win0 = nw0;
        d->latest = version;
    }
}

void dispatch_core_end(struct dispatch_core *d, int64_t after, const char *why)
{
    if (d->end_after < 0) { /* the first word stands */
        d->end_after = after;
        snprintf(d->end_why, sizeof d->end_why, "%s", why);
    }
}

void dispatch_core_stats(const struct dispatch_core *d, struct dispatch_stats *st)
{
    *st = d->st;
    st->macs = (int64_t)d->auth.macs;
    st->mac_bytes = (int64_t)d->auth.mac_bytes;
    st->live = 0;
    for (int i = 0; i < d->nprocs; i++)
        st->live += d->procs[i].alive;
}

bool dispatch_core_all_heard(const struct dispatch_core *d)
{
    if (d->end_after < 0)
        return true;
    for (int i = 0; i < d->nprocs; i++)
        if (d->procs[i].alive && !d->procs[i].heard_end)
            return false;
    return true;
}

int dispatch_core_unseen(const struct dispatch_core *d)
{
    int n = 0;
    for (int s = 0; s < d->o.units; s++)
        n += !d->slot_seen[s];
    return n;
}

void dispatch_core_broadcast_on(struct dispatch_core *d, double rendezvous_s)
{
    d->bc_on = true;
    d->bc_rendezvous_s = rendezvous_s;
}

bool dispatch_core_round_begin(struct dispatch_core *d, int64_t *v, const float **w)
{
    if (!round_ready(d, v))
        return false;
    d->bc_round = *v;
    *w = snapshot_of(d, *v)->w; /* published versions change only on the trainer's thread, which runs the round */
    return true;
}

void dispatch_core_round_end(struct dispatch_core *d, bool ok)
{
    if (d->bc_round < 0)
        return;
    d->bc_done = d->bc_round;
    d->bc_round = -1;
    for (int u = 0; u < d->o.units; u++)
        d->bc_want[u] = -1;
    d->st.broadcasts += ok;
    if (!ok && !d->bc_off) {
        d->bc_off = true;
        log_warn("dispatch",
                 "weight broadcast off for the rest of the run: the round of policy version %lld "
                 "failed (each version is fetched from here instead)",
                 (long long)d->bc_done);
    }
}

bool dispatch_core_round_due(struct dispatch_core *d, double waited_s)
{
    const int64_t v = d->latest;
    bool due = broadcasting(d) && slot_lost(d) < 0 && v >= 0 && v > d->bc_done && v > d->bc_skip &&
               v + 1 + d->o.staleness <= d->o.total_steps;
    if (due && waited_s > d->bc_rendezvous_s) {
        char why[160];
        snprintf(why, sizeof why, "the trainers waited %.0f s for every rollout rank to ask", waited_s);
        for (int u = 0; u < d->o.units; u++)
            if (d->bc_want[u] < v)
                d->bc_want[u] = v; /* skip it whoever asked */
        skip_wanted(d, why);
        due = false;
    }
    return due;
}

size_t dispatch_core_floats(const struct dispatch_core *d) { return d->o.n_floats; }

bool dispatch_core_granted(const struct dispatch_core *d, int64_t step, int unit, int slot)
{
    const int64_t j = step - d->win0;
    if (j < 0 || j >= d->window || unit < 0 || unit >= d->o.units || slot < 0 || slot >= d->o.units)
        return false;
    return d->ever[((size_t)j * d->o.units + unit) * d->o.units + slot];
}

void dispatch_core_regrant(struct dispatch_core *d, int64_t step, int unit, const char *why)
{
    const int64_t j = step - d->win0;
    if (j < 0 || j >= d->window || unit < 0 || unit >= d->o.units)
        return;
    struct lease *l = &d->lease[j * d->o.units + unit];
    if (l->holder == PENDING)
        return;
    log_warn("dispatch", "step %lld unit %d is granted again (%s)", (long long)step, unit, why);
    *l = pending_lease;
    d->st.redone++;
}

/* ---- fully-async training ---- */

static struct alease *al_find(struct dispatch_core *d, int64_t n)
{
    for (int i = 0; i < d->n_al; i++)
        if (d->al[i].n == n)
            return &d->al[i];
    return NULL;
}

static struct alease *al_add(struct dispatch_core *d, int64_t n, int64_t version, int ri)
{
    if (d->n_al == d->cap_al) {
        d->cap_al = d->cap_al ? 2 * d->cap_al : 16;
        d->al = xrealloc(d->al, (size_t)d->cap_al * sizeof *d->al);
    }
    struct alease *a = &d->al[d->n_al++];
    *a = (struct alease){.n = n, .holder = PENDING, .version = version, .ri = ri};
    a->ever = xcalloc((size_t)d->o.units, 1);
    d->a_granted += d->o.unit_groups;
    d->a_window += d->o.unit_groups;
    return a;
}

/* The stream unit of (chunk, unit), or -1 when it names none. */
static int64_t stream_index(const struct dispatch_core *d, int64_t chunk, int u)
{
    if (chunk < 1 || u < 0 || u >= d->o.units)
        return -1;
    return (chunk - 1) * d->o.units + u;
}

static void async_delivered(struct dispatch_core *d, int pi, int64_t chunk, int u, double now)
{
    const int64_t n = stream_index(d, chunk, u);
    struct alease *a = n >= 0 ? al_find(d, n) : NULL;
    if (!a || a->holder != pi || a->done)
        return;
    if (now - a->since > d->longest_s)
        d->longest_s = now - a->since;
    a->done = true; /* it stays until the trainer has it (dispatch_core_async_received) */
}

/* Grant lease a to process pi: the unit, its version, and a replayed unit's switches. */
static void async_give(struct dispatch_core *d, struct alease *a, int pi, Grpo__WorkGrant *g, double now)
{
    a->holder = pi;
    a->since = now;
    a->ever[d->procs[pi].slot] = 1;
    g->kind = WORK_UNIT;
    g->step = a->n / d->o.units + 1;
    g->unit = (int)(a->n % d->o.units);
    g->version = a->version;
    if (a->ri >= 0) {
        const struct dispatch_replay *x = &d->rp[a->ri];
        g->n_replay_versions = (size_t)x->n_phases;
        g->replay_versions = (int64_t *)x->versions;
        g->n_replay_tokens = (size_t)x->n_phases * (size_t)x->n_seq;
        g->replay_tokens = (int32_t *)x->tokens;
    }
    d->st.granted++;
}

static void async_grant(struct dispatch_core *d, int pi, bool names_done, Grpo__WorkGrant *g, char *reason, size_t rlen,
                        double now)
{
    struct proc *p = &d->procs[pi];
    g->start_step = 0; /* chunk j is the j-th batch from the data's start */
    g->start_epoch = 0;
    g->start_cursor = 0;
    g->total_steps = d->o.total_steps;
    g->n_floats = d->o.n_floats;
    g->units = d->o.units;
    if (d->latest < 0) {
        g->kind = WORK_WAIT;
        snprintf(reason, rlen, "the trainers have not published their first weights yet");
        return;
    }
    /* a unit it holds and has not delivered: the answer that granted it was lost */
    for (int i = 0; names_done && i < d->n_al; i++)
        if (d->al[i].holder == pi && !d->al[i].done) {
            log_info("dispatch", "chunk %lld unit %d granted again to the process serving rank %d, which holds it",
                     (long long)(d->al[i].n / d->o.units + 1), (int)(d->al[i].n % d->o.units), p->slot);
            async_give(d, &d->al[i], pi, g, now);
            d->st.granted--;
            return;
        }
    /* a lost holder's unit first (live: with the newest version; a replay keeps the recorded one) */
    for (int i = 0; i < d->n_al; i++)
        if (d->al[i].holder == PENDING) {
            if (d->al[i].ri < 0)
                d->al[i].version = d->latest;
            d->st.regranted++;
            async_give(d, &d->al[i], pi, g, now);
            return;
        }
    g->kind = WORK_WAIT;
    if (d->a_hold) {
        snprintf(reason, rlen, "the trainers drain the stream for a checkpoint");
        return;
    }
    if (d->replaying) { /* a replay: the recorded order, each once its version is out */
        if (d->a_rnext >= d->n_rp) {
            snprintf(reason, rlen, "every unit of the replayed schedule is granted");
            return;
        }
        const struct dispatch_replay *x = &d->rp[d->a_rnext];
        if (!snapshot_of(d, x->versions[0])) {
            snprintf(reason, rlen, "replayed chunk %lld unit %d waits for policy version %lld (newest %lld)",
                     (long long)x->chunk, x->unit, (long long)x->versions[0], (long long)d->latest);
            if (x->versions[0] < d->latest)
                log_warn_every("dispatch", "%s: that version is no longer held", reason);
            return;
        }
        struct alease *a = al_add(d, stream_index(d, x->chunk, x->unit), x->versions[0], d->a_rnext++);
        async_give(d, a, pi, g, now);
        return;
    }
    if (d->a_window + d->o.unit_groups <= d->o.max_groups) {
        struct alease *a = al_add(d, d->a_next++, d->latest, -1);
        async_give(d, a, pi, g, now);
        return;
    }
    /* nothing new within the bound: a lease past its deadline goes to this process too */
    const double lease = lease_s(d);
    for (int i = 0; i < d->n_al; i++) {
        struct alease *a = &d->al[i];
        if (a->holder == PENDING || a->holder == pi || a->done || now - a->since <= lease)
            continue;
        log_warn("dispatch", "chunk %lld unit %d: held %.0f s, past its lease of %.0f s; granted again to rank %d",
                 (long long)(a->n / d->o.units + 1), (int)(a->n % d->o.units), now - a->since, lease, p->slot);
        d->st.regranted++;
        d->st.expired++;
        async_give(d, a, pi, g, now);
        return;
    }
    g->step = d->a_next / d->o.units + 1;
    snprintf(reason, rlen,
             "%lld prompts granted since policy version %lld's push, at most %lld (" KEY_async_staleness_threshold ")",
             (long long)d->a_window, (long long)d->latest, (long long)d->o.max_groups);
}

bool dispatch_core_async_granted(const struct dispatch_core *d, int64_t chunk, int unit, int slot)
{
    const int64_t n = stream_index(d, chunk, unit);
    if (n < 0 || slot < 0 || slot >= d->o.units)
        return false;
    for (int i = 0; i < d->n_al; i++)
        if (d->al[i].n == n)
            return d->al[i].ever[slot] != 0;
    return false;
}

void dispatch_core_async_received(struct dispatch_core *d, int64_t chunk, int unit)
{
    const int64_t n = stream_index(d, chunk, unit);
    struct alease *a = n >= 0 ? al_find(d, n) : NULL;
    if (!a)
        return;
    free(a->ever);
    *a = d->al[--d->n_al];
}

void dispatch_core_async_taken(struct dispatch_core *d, int groups, bool dropped)
{
    d->a_taken += groups;
    if (dropped)
        d->a_window -= groups;
}

void dispatch_core_async_hold(struct dispatch_core *d, bool hold) { d->a_hold = hold; }

int dispatch_core_async_in_flight(const struct dispatch_core *d) { return d->n_al; }

int64_t dispatch_core_async_next(const struct dispatch_core *d) { return d->a_next; }

int64_t dispatch_core_async_window(const struct dispatch_core *d) { return d->a_window; }
