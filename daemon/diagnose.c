/* grpoctl diagnose's verdict: see diagnose.h. */
#include "diagnose.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A side of a split run idle this share of its time is waiting for the other side by construction, not by
 * noise: the moments between steps, logging and a heartbeat's rounding stay well under 10% on a balanced run
 * (the target), and a third of the time lost is worth a change of layout. */
#define DIAG_IDLE_BOUND 0.30
/* Weight sync taking a quarter of the step is time neither side computes; a bucketed broadcast moves a model in
 * a small fraction of a step, so this much means the transport is the cost. */
#define DIAG_SYNC_SHARE 0.25
/* Ranks waiting this share of the step for the slowest rank's generation: the long tail of response lengths
 * is costing a tenth of the run. */
#define DIAG_TAIL_SHARE 0.10
/* The slowest share of a step's generation over the mean: 1.25 means the others stand idle for a fifth of the
 * slowest share's time. */
#define DIAG_IMBALANCE 1.25
/* A rank busy 1.5x its peers' median over the whole run is slower, not unlucky: response lengths even out over
 * steps, a slower device or a loaded host does not. */
#define DIAG_STRAGGLER_RATIO 1.5
/* ... and by this many seconds at least, so the first step's noise on a short run names no one. */
#define DIAG_STRAGGLER_MIN_S 0.5
/* A host whose ranks' resident peaks take this share of its memory is one larger batch away from the OOM
 * killer (the kernel, the page cache and other processes need the rest). */
#define DIAG_MEMORY_FULL 0.85

static const char *const kind_names[] = {"too_early",         "balanced",  "rollout_bound", "trainer_bound",
                                         "weight_sync_bound", "long_tail", "straggler",     "memory_headroom"};

const char *diag_kind_name(enum diag_kind k)
{
    return (unsigned)k < sizeof kind_names / sizeof kind_names[0] ? kind_names[k] : "unknown";
}

const char *diag_severity_name(enum diag_severity s) { return s == DIAG_WARN ? "warn" : "info"; }

struct findings {
    struct diag_finding *out;
    int n, max;
};

static struct diag_finding *add(struct findings *f, enum diag_kind kind, enum diag_severity sev, double share)
{
    if (f->n == f->max)
        return NULL;
    struct diag_finding *d = &f->out[f->n++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->severity = sev;
    d->share = share;
    return d;
}

static void say(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(char *buf, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, DIAG_TEXT_MAX, fmt, ap);
    va_end(ap);
}

static double pct(double x) { return 100.0 * x; }

/* Idle share of the live ranks of a role (idle over idle + busy, summed); NAN when there are none. */
static double role_idle(const struct diag_rank *r, int n, Grpo__Role role, int *count)
{
    double idle = 0, all = 0;
    *count = 0;
    for (int i = 0; i < n; i++)
        if (r[i].live && r[i].role == role && r[i].idle_s + r[i].busy_s > 0) {
            idle += r[i].idle_s;
            all += r[i].idle_s + r[i].busy_s;
            (*count)++;
        }
    return all > 0 ? idle / all : NAN;
}

static bool on_policy(const struct diag_run *run) { return isfinite(run->staleness) && run->staleness == 0; }

#define COLOCATED_KNOB                                                                                                 \
    "run colocated (trainer.nnodes x trainer.n_gpus_per_node = every rank, no rollout.* keys: each rank generates "    \
    "and trains)"

/* A split run: which side waits for the other. */
static void split_bound(const struct diag_rank *r, int n, const struct diag_run *run, struct findings *f)
{
    int nt, nr;
    const double ti = role_idle(r, n, GRPO__ROLE__ROLE_TRAINER, &nt),
                 ri = role_idle(r, n, GRPO__ROLE__ROLE_ROLLOUT, &nr);
    if (!nt || !nr)
        return;
    const char *policy = on_policy(run) ? "on-policy" : isfinite(run->staleness) ? "async" : "policy lag unknown";
    struct diag_finding *d;
    if (ti >= DIAG_IDLE_BOUND && ti >= ri && (d = add(f, DIAG_ROLLOUT_BOUND, DIAG_WARN, ti))) {
        say(d->text,
            "rollout-bound: the %d trainer rank(s) idle %.0f%% waiting for rollouts (the %d rollout rank(s) "
            "idle %.0f%%; %s)",
            nt, pct(ti), nr, pct(ri), policy);
        if (on_policy(run))
            say(d->knob,
                "actor_rollout_ref.rollout.mode=async (generation overlaps training), or more rollout ranks "
                "(rollout.nnodes x rollout.n_gpus_per_node, or placement.rollout_ranks) and fewer trainer ranks, or "
                "%s",
                COLOCATED_KNOB);
        else
            say(d->knob, "more rollout ranks (rollout.nnodes x rollout.n_gpus_per_node, or placement.rollout_ranks) "
                         "and fewer trainer ranks (trainer.n_gpus_per_node), or a shorter data.max_response_length");
    } else if (ri >= DIAG_IDLE_BOUND && ri > ti && (d = add(f, DIAG_TRAINER_BOUND, DIAG_WARN, ri))) {
        say(d->text,
            "trainer-bound: the %d rollout rank(s) idle %.0f%% waiting for the trainers (the %d trainer "
            "rank(s) idle %.0f%%; %s)",
            nr, pct(ri), nt, pct(ti), policy);
        if (on_policy(run))
            say(d->knob,
                "%s, or actor_rollout_ref.rollout.mode=async (generation overlaps training), or fewer rollout ranks "
                "(rollout.n_gpus_per_node, or placement.rollout_ranks) and more trainer ranks",
                COLOCATED_KNOB);
        else
            say(d->knob, "fewer rollout ranks (rollout.n_gpus_per_node, or placement.rollout_ranks) and more trainer "
                         "ranks (trainer.n_gpus_per_node), or a faster update: a larger "
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu or "
                         "actor_rollout_ref.actor.use_dynamic_bsz=true");
    }
}

static void weight_sync(const struct diag_rank *r, int n, const struct diag_run *run, struct findings *f)
{
    if (!(run->step_s > 0))
        return;
    double sync = isfinite(run->update_weights_s) ? run->update_weights_s : 0;
    int who = -1;
    for (int i = 0; i < n; i++)
        if (r[i].live && r[i].phase_s[GRPO__PHASE__PHASE_WEIGHT_SYNC] > sync) {
            sync = r[i].phase_s[GRPO__PHASE__PHASE_WEIGHT_SYNC];
            who = r[i].rank;
        }
    const double share = sync / run->step_s;
    struct diag_finding *d;
    if (share < DIAG_SYNC_SHARE || !(d = add(f, DIAG_WEIGHT_SYNC_BOUND, DIAG_WARN, share > 1 ? 1 : share)))
        return;
    char by[64] = "";
    if (who >= 0)
        snprintf(by, sizeof by, " (on rank %d)", who);
    say(d->text, "weight-sync-bound: moving the weights takes %.2f s%s of a %.2f s step (%.0f%%)", sync, by,
        run->step_s, pct(share > 1 ? 1 : share));
    say(d->knob, "actor_rollout_ref.rollout.weight_sync=broadcast (one collective instead of each rollout rank "
                 "fetching), or a larger actor_rollout_ref.rollout.update_weights_bucket_megabytes");
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median busy seconds of the live ranks of role other than rank `skip`; NAN when there are none. */
static double peers_median(const struct diag_rank *r, int n, Grpo__Role role, int skip)
{
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    if (!v)
        return NAN;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (i != skip && r[i].live && r[i].role == role && r[i].idle_s + r[i].busy_s > 0)
            v[m++] = r[i].busy_s;
    double med = NAN;
    if (m) {
        qsort(v, (size_t)m, sizeof *v, cmp_double);
        med = m % 2 ? v[m / 2] : (v[m / 2 - 1] + v[m / 2]) / 2;
    }
    free(v);
    return med;
}

/* A rank busy far longer than the other ranks of its role over the whole run. Ranks of a role do the same work
 * each step, so the excess is the rank's own; its peers wait for it. Only each role's busiest rank is judged:
 * it has the largest ratio to its peers' median (leaving out the largest value leaves the smallest median).
 * Returns whether one was found. */
static bool straggler(const struct diag_rank *r, int n, struct findings *f)
{
    static const Grpo__Role roles[] = {GRPO__ROLE__ROLE_TRAINER, GRPO__ROLE__ROLE_ROLLOUT, GRPO__ROLE__ROLE_HYBRID};
    int worst = -1;
    double worst_ratio = 0, worst_peers = 0;
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) {
        int busiest = -1;
        for (int i = 0; i < n; i++)
            if (r[i].live && r[i].role == roles[k] && r[i].idle_s + r[i].busy_s > 0 &&
                (busiest < 0 || r[i].busy_s > r[busiest].busy_s))
                busiest = i;
        if (busiest < 0)
            continue;
        const double peers = peers_median(r, n, roles[k], busiest);
        if (!(peers > 0) || r[busiest].busy_s - peers < DIAG_STRAGGLER_MIN_S)
            continue;
        const double ratio = r[busiest].busy_s / peers;
        if (ratio >= DIAG_STRAGGLER_RATIO && ratio > worst_ratio) {
            worst = busiest;
            worst_ratio = ratio;
            worst_peers = peers;
        }
    }
    if (worst < 0)
        return false;
    const struct diag_rank *w = &r[worst];
    const double share = (w->busy_s - worst_peers) / (w->busy_s + w->idle_s);
    struct diag_finding *d = add(f, DIAG_STRAGGLER, DIAG_WARN, share);
    if (!d)
        return true;
    say(d->text,
        "straggler: rank %d (%s on host %s) was busy %.1f s since the first step, %.1fx its peers' %.2f s: "
        "they wait for it",
        w->rank, core_role_name(w->role), w->host, w->busy_s, worst_ratio, worst_peers);
    if (w->role == GRPO__ROLE__ROLE_ROLLOUT)
        say(d->knob,
            "look at host %s (another load on it, a slower or throttled device); or run without that rank: "
            "one rollout rank fewer (rollout.n_gpus_per_node, or placement.rollout_ranks)",
            w->host);
    else
        say(d->knob,
            "look at host %s (another load on it, a slower or throttled device); the ranks of a step move "
            "at the pace of the slowest",
            w->host);
    return true;
}

/* Colocated ranks waiting for the slowest share of a step's generation (the hybrid ranks' metrics), or the
 * rollout ranks' generation seconds of the last step far apart (a split run). */
static void long_tail(const struct diag_rank *r, int n, const struct diag_run *run, struct findings *f)
{
    const double wait_share =
        run->step_s > 0 && isfinite(run->gen_wait_peers_s) ? run->gen_wait_peers_s / run->step_s : NAN;
    if ((isfinite(wait_share) && wait_share >= DIAG_TAIL_SHARE) ||
        (isfinite(run->gen_imbalance) && run->gen_imbalance >= DIAG_IMBALANCE)) {
        const double share = isfinite(wait_share) ? wait_share : (run->gen_imbalance - 1) / run->gen_imbalance;
        struct diag_finding *d = add(f, DIAG_LONG_TAIL, DIAG_WARN, share > 1 ? 1 : share);
        if (!d)
            return;
        char stolen[64] = "";
        if (isfinite(run->units_stolen))
            snprintf(stolen, sizeof stolen, "; %.0f unit(s) taken over from slower ranks", run->units_stolen);
        if (isfinite(wait_share))
            say(d->text,
                "long tail: ranks waited up to %.2f s of a %.2f s step (%.0f%%) for the slowest rank's generation "
                "(slowest / mean %.2f%s)",
                run->gen_wait_peers_s, run->step_s, pct(wait_share), run->gen_imbalance, stolen);
        else
            say(d->text, "long tail: the slowest rank's generation took %.2fx the mean%s", run->gen_imbalance, stolen);
        if (isfinite(run->units_stolen)) /* colocated ranks: the work units */
            say(d->knob, "placement.colocated_steal=true (an idle rank takes the slowest one's unstarted units) with "
                         "more placement.colocated_units; or cap the tail: a shorter data.max_response_length, or "
                         "reward_model.overlong_buffer.enable=true (long answers cost reward)");
        else
            say(d->knob,
                "cap the tail: a shorter data.max_response_length, or reward_model.overlong_buffer.enable=true "
                "(long answers cost reward); a larger data.train_batch_size evens out the ranks' shares");
        return;
    }
    double max = 0, sum = 0;
    int m = 0, slowest = -1;
    for (int i = 0; i < n; i++) {
        const double g = r[i].phase_s[GRPO__PHASE__PHASE_GEN];
        if (!r[i].live || r[i].role != GRPO__ROLE__ROLE_ROLLOUT || !(g > 0))
            continue;
        sum += g;
        m++;
        if (g > max) {
            max = g;
            slowest = r[i].rank;
        }
    }
    if (m < 2 || max / (sum / m) < DIAG_IMBALANCE)
        return;
    const double mean = sum / m;
    struct diag_finding *d = add(f, DIAG_LONG_TAIL, DIAG_WARN, (max - mean) / max);
    if (!d)
        return;
    say(d->text,
        "long tail: the last step's generation took %.2f s on rank %d against a mean of %.2f s over the %d rollout "
        "ranks (%.2fx)",
        max, slowest, mean, m, max / mean);
    say(d->knob, "cap the tail: a shorter data.max_response_length, or reward_model.overlong_buffer.enable=true "
                 "(long answers cost reward); or actor_rollout_ref.rollout.mode=async (the next step's generation "
                 "overlaps)");
}

struct host_rank {
    const char *host;
    int i;
};

static int by_host(const void *a, const void *b)
{
    const struct host_rank *x = a, *y = b;
    const int c = strcmp(x->host, y->host);
    return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* One host's ranks (h[0..m-1], by rank) against its memory. */
static void host_memory(const struct diag_rank *r, const struct host_rank *h, int m, struct findings *f)
{
    double used = 0, total = 0;
    char list[128] = "";
    for (int k = 0; k < m; k++) {
        const struct diag_rank *q = &r[h[k].i];
        used += q->peak_rss_gb;
        total = q->host_memory_gb > total ? q->host_memory_gb : total;
        size_t l = strlen(list);
        if (l + 16 < sizeof list)
            snprintf(list + l, sizeof list - l, "%s%d", k ? "," : "", q->rank);
    }
    const double share = total > 0 ? used / total : 0;
    struct diag_finding *d;
    if (share < DIAG_MEMORY_FULL || !(d = add(f, DIAG_MEMORY_HEADROOM, DIAG_WARN, share > 1 ? 1 : share)))
        return;
    say(d->text, "memory headroom: host %s's %d rank(s) (%s) peak at %.1f GB of its %.1f GB (%.0f%%)", h[0].host, m,
        list, used, total, pct(share));
    say(d->knob, "a smaller actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu, or "
                 "actor_rollout_ref.actor.use_dynamic_bsz=true with a smaller "
                 "actor_rollout_ref.actor.ppo_max_token_len_per_gpu, or "
                 "actor_rollout_ref.model.enable_gradient_checkpointing=true; or fewer ranks on that host");
}

/* Each host's ranks' resident peaks against its memory (the live ranks that report both). */
static void memory(const struct diag_rank *r, int n, struct findings *f)
{
    struct host_rank *h = malloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    if (!h)
        return;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (r[i].live && r[i].host_memory_gb > 0 && isfinite(r[i].peak_rss_gb))
            h[m++] = (struct host_rank){r[i].host, i};
    qsort(h, (size_t)m, sizeof *h, by_host);
    for (int a = 0, b; a < m; a = b) {
        for (b = a + 1; b < m && strcmp(h[b].host, h[a].host) == 0; b++)
            ;
        host_memory(r, h + a, b - a, f);
    }
    free(h);
}

static int by_cost(const void *a, const void *b)
{
    const struct diag_finding *x = a, *y = b;
    if (x->severity != y->severity)
        return x->severity == DIAG_WARN ? -1 : 1;
    return (x->share < y->share) - (x->share > y->share);
}

/* Nothing found: the idle shares, so the reader sees why. */
static void balanced(const struct diag_rank *r, int n, struct findings *f)
{
    struct diag_finding *d = add(f, DIAG_BALANCED, DIAG_INFO, 0);
    if (!d)
        return;
    static const struct {
        Grpo__Role role;
        const char *name;
    } roles[] = {{GRPO__ROLE__ROLE_TRAINER, "trainer"},
                 {GRPO__ROLE__ROLE_ROLLOUT, "rollout"},
                 {GRPO__ROLE__ROLE_HYBRID, "colocated"}};
    char parts[DIAG_TEXT_MAX] = "";
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) {
        int m;
        const double idle = role_idle(r, n, roles[k].role, &m);
        size_t l = strlen(parts);
        if (m && l + 64 < sizeof parts)
            snprintf(parts + l, sizeof parts - l, "%s%d %s rank(s) idle %.0f%%", l ? ", " : "", m, roles[k].name,
                     pct(idle));
    }
    say(d->text, "no bottleneck found: %s", parts[0] ? parts : "no rank has reported its time yet");
}

int diagnose(const struct diag_rank *ranks, int n, const struct diag_run *run, struct diag_finding *out, int max)
{
    struct findings f = {out, 0, max};
    if (max <= 0)
        return 0;
    if (run->steps < 1) {
        struct diag_finding *d = add(&f, DIAG_TOO_EARLY, DIAG_INFO, 0);
        say(d->text, "no verdict yet: no step has finished");
        return f.n;
    }
    memory(ranks, n, &f);
    const bool slow_rank = straggler(ranks, n, &f);
    split_bound(ranks, n, run, &f);
    weight_sync(ranks, n, run, &f);
    if (!slow_rank) /* a straggler's slow generation is the straggler's, not the responses' */
        long_tail(ranks, n, run, &f);
    if (!f.n)
        balanced(ranks, n, &f);
    qsort(out, (size_t)f.n, sizeof *out, by_cost);
    return f.n;
}
