/* The hang verdict: see hang.h. */
#include "proto/hang.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAMED 8 /* ranks named one by one in a sentence; past it, "and N more" */

static const char *const kind_names[] = {"none",    "unregistered", "io",    "mismatch",
                                         "laggard", "grant",        "stuck", "pause"};

const char *hang_kind_name(enum hang_kind k)
{
    return (unsigned)k < sizeof kind_names / sizeof kind_names[0] ? kind_names[k] : "unknown";
}

static int cmp_int(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int hang_parse_ranks(const char *text, int *out, int max)
{
    int n = 0;
    const char *p = text;
    if (!p || !*p)
        return -1;
    while (*p) {
        char *end;
        errno = 0;
        const long a = strtol(p, &end, 10);
        if (end == p || errno || a < 0 || a > 1000000)
            return -1;
        long b = a;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1 || errno || b < a || b > 1000000)
                return -1;
            p = end;
        }
        for (long r = a; r <= b; r++) {
            if (n == max)
                return -1;
            out[n++] = (int)r;
        }
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    qsort(out, (size_t)n, sizeof *out, cmp_int);
    return n;
}

void hang_ranks_text(const int *r, int n, char *out, size_t len)
{
    if (!len)
        return;
    out[0] = 0;
    size_t at = 0;
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && r[j + 1] == r[j] + 1)
            j++;
        char piece[32];
        if (j > i)
            snprintf(piece, sizeof piece, "%s%d-%d", at ? "," : "", r[i], r[j]);
        else
            snprintf(piece, sizeof piece, "%s%d", at ? "," : "", r[i]);
        const size_t pl = strlen(piece);
        if (at + pl + 4 > len) { /* room for "..." and the NUL */
            snprintf(out + at, len - at, "%s", len - at > 3 ? "..." : "");
            return;
        }
        memcpy(out + at, piece, pl + 1);
        at += pl;
        i = j + 1;
    }
}

static bool is(const char *a, const char *b) { return strcmp(a, b) == 0; }

/* hang_wait_text, with a group's members or without ("all-reduce #12 of dp") */
static void wait_text(const struct hang_wait *w, bool where, bool members, char *out, size_t len)
{
    char what[128], group[300] = "", peer[32] = "", at[64] = "";
    const bool io = is(w->kind, "io");
    if (w->seq)
        snprintf(what, sizeof what, io ? "%s of step %" PRIu64 : "%s #%" PRIu64, w->op, w->seq);
    else
        snprintf(what, sizeof what, "%s", w->op);
    if (io)
        snprintf(group, sizeof group, "%s%s", w->members[0] ? " in " : "", w->members);
    else if (w->group[0] && is(w->kind, "plane"))
        snprintf(group, sizeof group, " to %s%s%s", w->group, w->members[0] ? " at " : "", w->members);
    else if (w->group[0] && members)
        snprintf(group, sizeof group, " of %s%s%s%s", w->group, w->members[0] ? " (ranks " : "", w->members,
                 w->members[0] ? ")" : "");
    else if (w->group[0])
        snprintf(group, sizeof group, " of %s", w->group);
    if (w->peer >= 0)
        snprintf(peer, sizeof peer, is(w->op, "broadcast") ? " from root %d" : " with peer %d", w->peer);
    if (where && w->layer >= 0)
        snprintf(at, sizeof at, ", layer %d %s", w->layer, w->backward ? "backward" : "forward");
    snprintf(out, len, "%s%s%s%s", what, group, peer, at);
}

void hang_wait_text(const struct hang_wait *w, bool where, char *out, size_t len)
{
    wait_text(w, where, true, out, len);
}

struct findings {
    struct hang_finding *out;
    int n, max;
};

static struct hang_finding *add(struct findings *f, enum hang_kind kind, int rank, double wait)
{
    if (f->n == f->max)
        return NULL;
    struct hang_finding *d = &f->out[f->n++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->rank = rank;
    d->wait = wait;
    return d;
}

static void say(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, HANG_TEXT_MAX, fmt, ap);
    va_end(ap);
}

static bool live_wait(const struct hang_rank *r) { return r->presence == HANG_LIVE && r->waiting; }
static bool in_group(const struct hang_rank *r) /* a wait of a group of ranks: a collective or a peer's */
{
    return live_wait(r) && (is(r->wait.kind, "collective") || is(r->wait.kind, "p2p"));
}
static bool same_group(const struct hang_wait *a, const struct hang_wait *b)
{
    return is(a->group, b->group) && is(a->members, b->members);
}

static const struct hang_rank *by_rank(const struct hang_rank *r, int n, int rank)
{
    if (rank >= 0 && rank < n && r[rank].rank == rank) /* grpod's ranks are by rank */
        return &r[rank];
    for (int i = 0; i < n; i++)
        if (r[i].rank == rank)
            return &r[i];
    return NULL;
}

/* Where rank `rank` is, for a sentence: "rank 5 is in phase update_actor, in no wait (its last: ...)"; a rank not
 * live is named with its host, and a live one too with live_host ("rank 5 (host h) is in ..."). */
static void where_text(const struct hang_rank *r, int rank, bool live_host, char *out, size_t len)
{
    char host[300] = "", w[400];
    if (!r) {
        snprintf(out, len, "nothing is known of rank %d", rank);
        return;
    }
    if (r->host[0])
        snprintf(host, sizeof host, " (host %s)", r->host);
    switch (r->presence) {
    case HANG_UNREGISTERED: snprintf(out, len, "rank %d%s never registered", rank, host); return;
    case HANG_GONE: snprintf(out, len, "rank %d%s is gone (lost, failed or ended)", rank, host); return;
    case HANG_UNKNOWN: snprintf(out, len, "nothing is known of rank %d%s (no heartbeat, no dump)", rank, host); return;
    case HANG_LIVE: break;
    }
    const char *h = live_host ? host : "";
    if (r->waiting) {
        hang_wait_text(&r->wait, true, w, sizeof w);
        snprintf(out, len, "rank %d%s is in %s, waiting %.0f s", rank, h, w, r->wait.seconds);
    } else if (r->layer >= 0) {
        snprintf(out, len, "rank %d%s is in phase %s, layer %d %s, in no wait", rank, h, core_phase_name(r->phase),
                 r->layer, r->backward ? "backward" : "forward");
    } else if (r->last && r->last->layer >= 0) {
        hang_wait_text(r->last, true, w, sizeof w);
        snprintf(out, len, "rank %d%s is in phase %s, in no wait (its last: %s)", rank, h, core_phase_name(r->phase),
                 w);
    } else {
        snprintf(out, len, "rank %d%s is in phase %s, in no wait", rank, h, core_phase_name(r->phase));
    }
}

/* The live ranks waiting in a group's collective or with a peer that has `rank` among its members: "ranks 0-1,3
 * wait for it in all-reduce #12 of dp (ranks 0-3), 95 s"; "" when none. Marks them covered. */
static void waiters_of(const struct hang_rank *r, int n, int rank, bool *covered, char *out, size_t len)
{
    int *who = malloc((size_t)(n > 0 ? n : 1) * sizeof *who), *mem = malloc(4096 * sizeof *mem);
    int m = 0, first = -1;
    double longest = 0;
    out[0] = 0;
    for (int i = 0; who && mem && i < n; i++) {
        if (!in_group(&r[i]) || r[i].rank == rank)
            continue;
        const int k = hang_parse_ranks(r[i].wait.members, mem, 4096);
        bool has = false;
        for (int j = 0; j < k && !has; j++)
            has = mem[j] == rank;
        if (!has)
            continue;
        who[m++] = r[i].rank;
        covered[i] = true;
        if (first < 0)
            first = i;
        longest = r[i].wait.seconds > longest ? r[i].wait.seconds : longest;
    }
    if (m) {
        char list[128], w[400];
        qsort(who, (size_t)m, sizeof *who, cmp_int);
        hang_ranks_text(who, m, list, sizeof list);
        hang_wait_text(&r[first].wait, false, w, sizeof w);
        snprintf(out, len, "; rank%s %s wait%s for it (%s, up to %.0f s)", m > 1 ? "s" : "", list, m > 1 ? "" : "s", w,
                 longest);
    }
    free(who);
    free(mem);
}

static void unregistered(const struct hang_rank *r, int n, const struct hang_run *run, struct findings *f)
{
    if (!(run->waiting_for_ranks_s > 0) || run->waiting_for_ranks_s < run->min_wait_s)
        return;
    char names[400] = "";
    int missing = 0, registered = 0, first = -1;
    for (int i = 0; i < n; i++) {
        if (r[i].presence != HANG_UNREGISTERED) {
            registered += r[i].presence == HANG_LIVE;
            continue;
        }
        if (first < 0)
            first = r[i].rank;
        if (missing++ < MAX_NAMED) {
            const size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%srank %d (host %s)", l ? ", " : "", r[i].rank,
                     r[i].host[0] ? r[i].host : "unknown");
        }
    }
    if (!missing)
        return;
    struct hang_finding *d = add(f, HANG_UNREGISTERED_RANK, first, run->waiting_for_ranks_s);
    if (!d)
        return;
    char more[48] = "";
    if (missing > MAX_NAMED)
        snprintf(more, sizeof more, " and %d more", missing - MAX_NAMED);
    say(d->text, "start-up waits for %s%s, which never registered: %d rank(s) registered and have waited %.0f s for %s",
        names, more, registered, run->waiting_for_ranks_s, missing > 1 ? "them" : "it");
}

static void io_stuck(const struct hang_rank *r, int n, const struct hang_run *run, bool *covered, struct findings *f)
{
    for (int i = 0; i < n; i++) {
        if (!live_wait(&r[i]) || !is(r[i].wait.kind, "io") || r[i].wait.seconds < run->min_wait_s)
            continue;
        covered[i] = true;
        char w[400], waiters[600];
        hang_wait_text(&r[i].wait, false, w, sizeof w);
        waiters_of(r, n, r[i].rank, covered, waiters, sizeof waiters);
        struct hang_finding *d = add(f, HANG_IO, r[i].rank, r[i].wait.seconds);
        if (d)
            say(d->text, "rank %d%s%s%s is stuck in I/O: %s, %.0f s so far%s", r[i].rank, r[i].host[0] ? " (host " : "",
                r[i].host, r[i].host[0] ? ")" : "", w, r[i].wait.seconds, waiters);
    }
}

/* The waits of one group (name and members): the ranks r[waiting[0..nw-1]] wait in it, by index. */
static void one_group(const struct hang_rank *r, int n, const int *waiting, int nw, const struct hang_run *run,
                      bool *covered, const bool *blamed_io, struct findings *f)
{
    const int i0 = waiting[0];
    const struct hang_wait *g = &r[i0].wait;
    double longest = 0;
    bool collective = true, differ = false;
    const struct hang_rank *ref = &r[i0];
    for (int k = 0; k < nw; k++) {
        const struct hang_rank *q = &r[waiting[k]];
        longest = q->wait.seconds > longest ? q->wait.seconds : longest;
        collective &= is(q->wait.kind, "collective");
        differ |= !is(q->wait.op, ref->wait.op) || q->wait.seq != ref->wait.seq;
    }
    if (longest < run->min_wait_s)
        return;
    for (int k = 0; k < nw; k++)
        covered[waiting[k]] = true;
    char w[400];
    wait_text(g, false, false, w, sizeof w); /* the members are named beside it */
    if (collective && differ) {              /* the members are in different collectives: they never meet */
        struct hang_finding *d = add(f, HANG_MISMATCH, -1, longest);
        if (d) {
            char parts[HANG_TEXT_MAX] = "";
            bool *done = calloc((size_t)nw, sizeof *done);
            for (int a = 0; done && a < nw; a++) {
                if (done[a])
                    continue;
                int who[64] = {0}, m = 0;
                const struct hang_wait *x = &r[waiting[a]].wait;
                for (int b = a; b < nw; b++) {
                    const struct hang_wait *y = &r[waiting[b]].wait;
                    if (!done[b] && is(x->op, y->op) && x->seq == y->seq) {
                        done[b] = true;
                        if (m < 64)
                            who[m++] = r[waiting[b]].rank;
                    }
                }
                qsort(who, (size_t)m, sizeof *who, cmp_int);
                char list[128];
                hang_ranks_text(who, m, list, sizeof list);
                const size_t l = strlen(parts);
                snprintf(parts + l, sizeof parts - l, "%srank%s %s in %s #%" PRIu64, l ? ", " : "", m > 1 ? "s" : "",
                         list, x->op, x->seq);
            }
            free(done);
            say(d->text,
                "mismatch in %s (ranks %s): its ranks wait in different collectives, which never meet: %s (up to "
                "%.0f s)",
                g->group, g->members, parts, longest);
        }
        return;
    }
    int members[4096];
    const int nm = hang_parse_ranks(g->members, members, 4096);
    if (nm < 0 || (g->group_size > 0 && nm != g->group_size)) { /* members unknown: the wait alone */
        struct hang_finding *d = add(f, HANG_STUCK, -1, longest);
        if (d) {
            hang_wait_text(&ref->wait, false, w, sizeof w);
            say(d->text, "rank %d has waited %.0f s in %s", ref->rank, ref->wait.seconds, w);
        }
        return;
    }
    int missing[4096], nmiss = 0, present[4096], np = 0;
    int *wr = malloc((size_t)nw * sizeof *wr); /* the waiting ranks, sorted: merged with the sorted members */
    if (!wr)
        return;
    for (int k = 0; k < nw; k++)
        wr[k] = r[waiting[k]].rank;
    qsort(wr, (size_t)nw, sizeof *wr, cmp_int);
    for (int k = 0, j = 0; k < nm; k++) {
        while (j < nw && wr[j] < members[k])
            j++;
        if (j < nw && wr[j] == members[k])
            present[np++] = members[k];
        else
            missing[nmiss++] = members[k];
    }
    free(wr);
    if (!nmiss) {
        struct hang_finding *d = add(f, HANG_STUCK, -1, longest);
        struct hang_wait op = *g; /* the operation alone: the group is named before it */
        op.group = "";
        wait_text(&op, false, false, w, sizeof w);
        if (d)
            say(d->text,
                "every rank of %s (ranks %s) has been in %s for up to %.0f s: the operation itself does not "
                "complete (the network, the device library, or a peer's process frozen)",
                g->group, g->members, w, longest);
        return;
    }
    char there[128];
    hang_ranks_text(present, np, there, sizeof there);
    for (int k = 0; k < nmiss && k < MAX_NAMED; k++) {
        const struct hang_rank *q = by_rank(r, n, missing[k]);
        if (q && blamed_io[q - r]) /* already named: stuck in I/O, with these ranks waiting for it */
            continue;
        char where[500];
        if (q && in_group(q) && is(q->wait.kind, "collective") && collective) {
            /* it waits in a collective of another group that some of these ranks never enter: a deadlock across
             * groups, told once, from the group judged first */
            int qm[4096];
            const int nq = hang_parse_ranks(q->wait.members, qm, 4096);
            bool crossed = false;
            for (int a = 0; a < nq && !crossed; a++)
                for (int b = 0; b < np && !crossed; b++)
                    crossed = qm[a] == present[b];
            if (crossed) {
                int q0 = 0;
                while (q0 < n && !(in_group(&r[q0]) && same_group(&r[q0].wait, &q->wait)))
                    q0++;
                if (q0 < i0)
                    continue;
                char qw[400], gw[400];
                hang_wait_text(&q->wait, false, qw, sizeof qw);
                hang_wait_text(g, false, gw, sizeof gw);
                struct hang_finding *d = add(f, HANG_MISMATCH, missing[k], longest);
                if (d)
                    say(d->text,
                        "mismatch across groups: rank %d waits in %s while rank%s %s wait%s in %s: neither can go on "
                        "(up to %.0f s)",
                        missing[k], qw, np > 1 ? "s" : "", there, np > 1 ? "" : "s", gw, longest);
                continue;
            }
        }
        where_text(q, missing[k], false, where, sizeof where);
        struct hang_finding *d = add(f, HANG_LAGGARD, missing[k], longest);
        if (d)
            say(d->text, "rank %d%s%s%s has not entered %s (rank%s %s waiting there %.0f s); %s", missing[k],
                q && q->host[0] ? " (host " : "", q ? q->host : "", q && q->host[0] ? ")" : "", w, np > 1 ? "s" : "",
                there, longest, where);
    }
}

static int by_group(const void *a, const void *b, void *ranks)
{
    const struct hang_rank *r = ranks;
    const int x = *(const int *)a, y = *(const int *)b;
    int c = strcmp(r[x].wait.group, r[y].wait.group);
    if (!c)
        c = strcmp(r[x].wait.members, r[y].wait.members);
    return c ? c : (x > y) - (x < y);
}

/* Each group some ranks wait in, judged once: the waiting ranks sorted by group (a world of thousands of ranks in
 * hundreds of groups costs n log n, not n x groups). */
static void groups(const struct hang_rank *r, int n, const struct hang_run *run, bool *covered, const bool *blamed_io,
                   struct findings *f)
{
    int *idx = malloc((size_t)(n > 0 ? n : 1) * sizeof *idx), m = 0;
    if (!idx)
        return;
    for (int i = 0; i < n; i++)
        if (in_group(&r[i]))
            idx[m++] = i;
    qsort_r(idx, (size_t)m, sizeof *idx, by_group, (void *)r);
    for (int a = 0, b; a < m; a = b) {
        for (b = a + 1; b < m && same_group(&r[idx[b]].wait, &r[idx[a]].wait); b++)
            ;
        one_group(r, n, idx + a, b - a, run, covered, blamed_io, f);
    }
    free(idx);
}

/* The trainers' whereabouts, for a rollout rank's wait: "rank 0 is in phase update_actor, in no wait". */
static void trainers_text(const struct hang_rank *r, int n, char *out, size_t len)
{
    out[0] = 0;
    int named = 0;
    for (int i = 0; i < n && named < 2; i++) {
        if (r[i].role != GRPO__ROLE__ROLE_TRAINER)
            continue;
        char where[500];
        where_text(&r[i], r[i].rank, false, where, sizeof where);
        const size_t l = strlen(out);
        snprintf(out + l, len - l, "%s%s", named++ ? "; " : "; the trainers: ", where);
    }
}

static void plane_waits(const struct hang_rank *r, int n, const struct hang_run *run, bool *covered, struct findings *f)
{
    for (int i = 0; i < n; i++) {
        if (covered[i] || !live_wait(&r[i]) || r[i].wait.seconds < run->min_wait_s)
            continue;
        covered[i] = true;
        char w[400], more[700] = "";
        hang_wait_text(&r[i].wait, false, w, sizeof w);
        if (is(r[i].wait.op, "work request")) {
            trainers_text(r, n, more, sizeof more);
            struct hang_finding *d = add(f, HANG_GRANT, r[i].rank, r[i].wait.seconds);
            if (d)
                say(d->text,
                    "rollout rank %d has waited %.0f s for a work grant that does not come (%s): the dispatcher "
                    "grants no unit%s",
                    r[i].rank, r[i].wait.seconds, w, more);
        } else {
            struct hang_finding *d = add(f, HANG_STUCK, r[i].rank, r[i].wait.seconds);
            if (d)
                say(d->text, "rank %d has waited %.0f s in %s", r[i].rank, r[i].wait.seconds, w);
        }
    }
}

/* A pause that has waited run->pausing_s (at least min_wait_s) for the ranks that are not held: each named with where
 * it is. The rank blamed: the only one not held, else the first of them in no wait (the others are likely to wait
 * for it), else the first. */
static void pause_waits(const struct hang_rank *r, int n, const struct hang_run *run, struct findings *f)
{
    if (run->pausing_s <= 0 || run->pausing_s < run->min_wait_s)
        return;
    int who[MAX_NAMED], m = 0, blame = -1, first = -1;
    for (int i = 0; i < n; i++) {
        if (r[i].presence != HANG_LIVE || r[i].held)
            continue;
        if (m < MAX_NAMED)
            who[m] = r[i].rank;
        m++;
        if (first < 0)
            first = r[i].rank;
        if (blame < 0 && !r[i].waiting)
            blame = r[i].rank;
    }
    if (m == 0)
        return;
    struct hang_finding *d = add(f, HANG_PAUSE, m == 1 ? first : blame >= 0 ? blame : first, run->pausing_s);
    if (!d)
        return;
    const int named = m < MAX_NAMED ? m : MAX_NAMED;
    qsort(who, (size_t)named, sizeof *who, cmp_int);
    char list[256], where[HANG_TEXT_MAX] = "";
    hang_ranks_text(who, named, list, sizeof list);
    size_t at = 0;
    for (int k = 0; k < named && at < sizeof where; k++) {
        char one[HANG_TEXT_MAX];
        where_text(by_rank(r, n, who[k]), who[k], true, one, sizeof one);
        at += (size_t)snprintf(where + at, sizeof where - at, "%s%s", k ? "; " : "", one);
    }
    if (m > named && at < sizeof where)
        snprintf(where + at, sizeof where - at, "; and %d more", m - named);
    say(d->text, "the pause has waited %.0f s for %s %s%s to reach a safe point: %s", run->pausing_s,
        m == 1 ? "rank" : "ranks", list, m > named ? " and more" : "", where);
}

/* A kind's place in the order of the findings: a pause first (why it does not complete), then the kinds in their
 * order. */
static int kind_order(enum hang_kind k) { return k == HANG_PAUSE ? -1 : (int)k; }

int hang_analyse(const struct hang_rank *ranks_in, int n, const struct hang_run *run, struct hang_finding *out, int max)
{
    struct findings f = {out, 0, max};
    if (max <= 0)
        return 0;
    /* a held rank waits on purpose (a paused run's ranks wait for their leader): its wait is judged no hang */
    struct hang_rank *ranks = malloc((size_t)(n > 0 ? n : 1) * sizeof *ranks);
    if (!ranks)
        return 0;
    for (int i = 0; i < n; i++) {
        ranks[i] = ranks_in[i];
        if (ranks[i].held)
            ranks[i].waiting = false;
    }
    pause_waits(ranks, n, run, &f);
    bool *covered = calloc((size_t)(n > 0 ? n : 1), sizeof *covered);
    bool *blamed_io = calloc((size_t)(n > 0 ? n : 1), sizeof *blamed_io);
    if (!covered || !blamed_io) {
        free(covered);
        free(blamed_io);
        free(ranks);
        return 0;
    }
    unregistered(ranks, n, run, &f);
    io_stuck(ranks, n, run, covered, &f);
    for (int i = 0; i < n; i++)
        blamed_io[i] = live_wait(&ranks[i]) && is(ranks[i].wait.kind, "io") && ranks[i].wait.seconds >= run->min_wait_s;
    groups(ranks, n, run, covered, blamed_io, &f);
    plane_waits(ranks, n, run, covered, &f);
    free(covered);
    free(blamed_io);
    if (!f.n) {
        struct hang_finding *d = add(&f, HANG_NONE, -1, 0);
        int who = -1;
        for (int i = 0; i < n; i++)
            if (live_wait(&ranks[i]) && (who < 0 || ranks[i].wait.seconds > ranks[who].wait.seconds))
                who = i;
        if (who >= 0) {
            char w[400];
            hang_wait_text(&ranks[who].wait, false, w, sizeof w);
            say(d->text,
                "no hang: no rank has waited %.0f s in one place (the longest wait now: rank %d, %.1f s in %s)",
                run->min_wait_s, ranks[who].rank, ranks[who].wait.seconds, w);
        } else {
            say(d->text, "no hang: no rank is waiting");
        }
        d->wait = who >= 0 ? ranks[who].wait.seconds : 0;
        free(ranks);
        return f.n;
    }
    free(ranks);
    /* worst first: the kinds in their order (a stable insertion sort keeps each kind's order of discovery) */
    for (int i = 1; i < f.n; i++) {
        struct hang_finding x = out[i];
        int j = i;
        for (; j > 0 && kind_order(out[j - 1].kind) > kind_order(x.kind); j--)
            out[j] = out[j - 1];
        out[j] = x;
    }
    return f.n;
}
