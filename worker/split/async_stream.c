/* Fully-async training, the trainer's side of the stream: see async_stream.h. */
#include "async_stream.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/config_key_names.h"

/* A unit that reached the trainer: its header, its groups, its place in the stream, its tokens' oldest and newest
 * versions. */
struct aunit {
    struct wire_header h;
    struct step_batch b;
    int64_t n;
    int64_t vmin, vmax;
};

/* One unit of a schedule: the step that took it (or dropped it), where it is, and its versions phase by phase with
 * each sequence's tokens once each phase ends (phases x sequences). */
struct sched {
    int64_t step, chunk;
    int unit;
    bool dropped;
    int64_t staleness;
    int n_phases, n_seq;
    int64_t *versions;
    int32_t *tokens;
};

struct astream {
    struct astream_options o;
    struct aunit *buf; /* held, in arrival order */
    int n_buf, cap_buf;
    struct aunit *cur; /* the step's units taken so far */
    int n_cur;
    uint8_t *have; /* by stream index: arrived (held, taken or dropped) */
    int64_t cap_have;
    /* cumulative counters (verl's fully_async/count/) */
    int64_t generated, stale_samples, stale_traj, dropped_samples;
    int64_t step_dropped; /* units dropped for the step being taken */
    double drop_after;    /* ceil(staleness_threshold) */
    FILE *sched;          /* the schedule being written (NULL: none) */
    struct sched *rp;     /* a replayed schedule */
    int n_rp, rp_next;
    struct dispatch_replay *pending; /* astream_replay_pending's answer */
};

struct astream *astream_create(const struct astream_options *o)
{
    struct astream *a = xcalloc(1, sizeof *a);
    a->o = *o;
    a->drop_after = ceil(o->staleness_threshold);
    a->cur = xcalloc((size_t)(o->units > 0 ? o->units : 1), sizeof *a->cur);
    return a;
}

static void sched_free(struct sched *s)
{
    free(s->versions);
    free(s->tokens);
}

void astream_free(struct astream *a)
{
    if (!a)
        return;
    for (int i = 0; i < a->n_buf; i++)
        step_batch_free(&a->buf[i].b);
    for (int i = 0; i < a->n_cur; i++)
        step_batch_free(&a->cur[i].b);
    free(a->buf), free(a->cur), free(a->have);
    if (a->sched)
        fclose(a->sched);
    for (int i = 0; i < a->n_rp; i++)
        sched_free(&a->rp[i]);
    free(a->rp), free(a->pending);
    free(a);
}

static int64_t stream_index(const struct astream *a, int64_t chunk, int unit)
{
    return (chunk - 1) * a->o.units + unit;
}

static void mark(struct astream *a, int64_t n)
{
    if (n < 0)
        return;
    if (n >= a->cap_have) {
        int64_t cap = a->cap_have ? a->cap_have : 1024;
        while (cap <= n)
            cap *= 2;
        a->have = xrealloc(a->have, (size_t)cap);
        memset(a->have + a->cap_have, 0, (size_t)(cap - a->cap_have));
        a->cap_have = cap;
    }
    a->have[n] = 1;
}

bool astream_have(const struct astream *a, int64_t chunk, int unit)
{
    const int64_t n = stream_index(a, chunk, unit);
    return n >= 0 && n < a->cap_have && a->have[n];
}

int astream_held(const struct astream *a) { return a->n_buf; }

bool astream_replaying(const struct astream *a) { return a->rp != NULL; }

/* A sequence's oldest and newest token versions (non-decreasing). */
static void seq_versions(const struct rollout_seq *s, int64_t *lo, int64_t *hi)
{
    *lo = s->versions && s->resp_len ? s->versions[0] : s->version_first;
    *hi = s->versions && s->resp_len ? s->versions[s->resp_len - 1] : s->version_first;
}

void astream_arrive(struct astream *a, const struct wire_header *h, struct step_batch *b)
{
    if (a->n_buf == a->cap_buf) {
        a->cap_buf = a->cap_buf ? 2 * a->cap_buf : 16;
        a->buf = xrealloc(a->buf, (size_t)a->cap_buf * sizeof *a->buf);
    }
    struct aunit *x = &a->buf[a->n_buf++];
    *x = (struct aunit){
        .h = *h, .n = stream_index(a, h->step, h->unit), .vmin = h->policy_version, .vmax = h->policy_version};
    step_batch_append(&x->b, b);
    for (int i = 0; i < x->b.n_seq; i++) {
        struct rollout_seq *s = &x->b.seqs[i];
        s->version_first = h->policy_version;
        int64_t lo, hi;
        seq_versions(s, &lo, &hi);
        x->vmin = lo < x->vmin ? lo : x->vmin;
        x->vmax = hi > x->vmax ? hi : x->vmax;
    }
    mark(a, x->n);
    a->generated += a->o.unit_groups;
}

/* Unit x's schedule entry (without step, dropped and staleness): its versions phase by phase (distinct, rising) and
 * each sequence's tokens once each phase ends, sequences in the unit's order (group within the unit x n + sample). */
static void unit_schedule(const struct astream *a, const struct aunit *x, struct sched *e)
{
    const int n = a->o.n, n_seq = a->o.unit_groups * n, lo = x->h.unit * a->o.unit_groups;
    int cap = 8, nv = 1;
    int64_t *v = xmalloc((size_t)cap * sizeof *v);
    v[0] = x->h.policy_version;
    for (int i = 0; i < x->b.n_seq; i++) {
        const struct rollout_seq *s = &x->b.seqs[i];
        for (int t = 0; s->versions && t < s->resp_len; t++) {
            bool known = false;
            for (int j = 0; j < nv && !known; j++)
                known = v[j] == s->versions[t];
            if (known)
                continue;
            if (nv == cap)
                v = xrealloc(v, (size_t)(cap *= 2) * sizeof *v);
            int j = nv++;
            while (j > 0 && v[j - 1] > s->versions[t]) { /* kept sorted */
                v[j] = v[j - 1];
                j--;
            }
            v[j] = s->versions[t];
        }
    }
    int32_t *tok = xcalloc((size_t)nv * (size_t)(n_seq ? n_seq : 1), sizeof *tok);
    for (int i = 0; i < x->b.n_seq; i++) {
        const struct rollout_seq *s = &x->b.seqs[i];
        const int local = s->gidx - lo * n;
        if (local < 0 || local >= n_seq)
            continue;
        for (int p = 0; p < nv; p++) {
            int c = 0;
            for (int t = 0; t < s->resp_len; t++)
                c += (s->versions ? s->versions[t] : s->version_first) <= v[p];
            tok[(size_t)p * n_seq + local] = c;
        }
    }
    *e = (struct sched){
        .chunk = x->h.step, .unit = x->h.unit, .n_phases = nv, .n_seq = n_seq, .versions = v, .tokens = tok};
}

static void write_schedule(struct astream *a, const struct sched *e)
{
    if (!a->sched)
        return;
    json_t *o = json_object(), *v = json_array(), *t = json_array();
    json_object_set_new(o, "step", json_integer(e->step));
    json_object_set_new(o, "chunk", json_integer(e->chunk));
    json_object_set_new(o, "unit", json_integer(e->unit));
    json_object_set_new(o, "dropped", json_boolean(e->dropped));
    json_object_set_new(o, "staleness", json_integer(e->staleness));
    for (int p = 0; p < e->n_phases; p++)
        json_array_append_new(v, json_integer(e->versions[p]));
    for (int i = 0; i < e->n_phases * e->n_seq; i++)
        json_array_append_new(t, json_integer(e->tokens[i]));
    json_object_set_new(o, "versions", v);
    json_object_set_new(o, "tokens", t);
    char *line = CHECK_ALLOC(json_dumps(o, JSON_COMPACT));
    json_decref(o);
    fprintf(a->sched, "%s\n", line);
    fflush(a->sched);
    free(line);
}

/* Whether two entries say the same of a unit: where it is, its versions, its tokens, and whether it was dropped. */
static bool same_entry(const struct sched *x, const struct sched *y, char *why, size_t len)
{
    if (x->chunk != y->chunk || x->unit != y->unit)
        return snprintf(why, len, "chunk %lld unit %d instead of chunk %lld unit %d", (long long)x->chunk, x->unit,
                        (long long)y->chunk, y->unit),
               false;
    if (x->dropped != y->dropped)
        return snprintf(why, len, "%s, but the schedule %s it", x->dropped ? "dropped" : "taken",
                        y->dropped ? "dropped" : "took"),
               false;
    if (x->n_phases != y->n_phases || x->n_seq != y->n_seq ||
        memcmp(x->versions, y->versions, (size_t)x->n_phases * sizeof *x->versions) != 0 ||
        memcmp(x->tokens, y->tokens, (size_t)x->n_phases * (size_t)x->n_seq * sizeof *x->tokens) != 0)
        return snprintf(why, len,
                        "generated with other versions or switched elsewhere (%d phases from version %lld, "
                        "the schedule %d from %lld)",
                        x->n_phases, (long long)x->versions[0], y->n_phases, (long long)y->versions[0]),
               false;
    return true;
}

static int by_gidx(const void *p, const void *q)
{
    const struct rollout_seq *x = p, *y = q;
    return (x->gidx > y->gidx) - (x->gidx < y->gidx);
}

static int by_stream(const void *p, const void *q)
{
    const struct aunit *x = p, *y = q;
    return (x->n > y->n) - (x->n < y->n);
}

/* The figures of the step's units (taken, in a->cur) into fa. */
static void step_figures(struct astream *a, int64_t P, struct fully_async_stats *fa)
{
    const int T = a->o.push_every > 0 ? a->o.push_every : 1;
    double st_sum = 0, wo_sum = 0, sp_sum = 0;
    int64_t traj = 0, partial = 0, max_span = 0;
    double st_min = INFINITY, st_max = -INFINITY, wo_min = INFINITY, wo_max = -INFINITY, sp_min = INFINITY,
           sp_max = -INFINITY;
    for (int i = 0; i < a->n_cur; i++) {
        const struct aunit *x = &a->cur[i];
        if (P - x->vmax / T >= 1)
            a->stale_samples += x->b.n_groups;
        for (int j = 0; j < x->b.n_seq; j++) {
            int64_t lo, hi;
            seq_versions(&x->b.seqs[j], &lo, &hi);
            const int64_t phi = hi / T, plo = lo / T; /* pushes in the newest and the oldest token's version */
            const double st = (double)(P - phi), wo = (double)(P - plo), sp = (double)(phi - plo + 1);
            a->stale_traj += st >= 1;
            partial += hi / T != lo / T;
            max_span = hi / T - lo / T > max_span ? hi / T - lo / T : max_span;
            st_sum += st, wo_sum += wo, sp_sum += sp;
            st_min = fmin(st_min, st), st_max = fmax(st_max, st);
            wo_min = fmin(wo_min, wo), wo_max = fmax(wo_max, wo);
            sp_min = fmin(sp_min, sp), sp_max = fmax(sp_max, sp);
            traj++;
        }
    }
    const double nt = traj ? (double)traj : 1;
    *fa = (struct fully_async_stats){.current_param_version = P,
                                     .total_generated_samples = a->generated,
                                     .stale_samples_processed = a->stale_samples,
                                     .stale_trajectory_processed = a->stale_traj,
                                     .dropped_stale_samples = a->dropped_samples,
                                     .dropped_units = a->step_dropped,
                                     .total_partial_num = partial,
                                     .max_partial_span = max_span,
                                     .partial_ratio = (double)partial / nt,
                                     .staleness_mean = st_sum / nt,
                                     .staleness_min = traj ? st_min : 0,
                                     .staleness_max = traj ? st_max : 0,
                                     .worst_mean = wo_sum / nt,
                                     .worst_min = traj ? wo_min : 0,
                                     .worst_max = traj ? wo_max : 0,
                                     .spans_mean = sp_sum / nt,
                                     .spans_min = traj ? sp_min : 0,
                                     .spans_max = traj ? sp_max : 0,
                                     .required_samples = (int64_t)a->o.units * a->o.unit_groups,
                                     .max_required_samples = a->o.max_required,
                                     .staleness_threshold = a->o.staleness_threshold,
                                     .buffered_samples = (int64_t)a->n_buf * a->o.unit_groups};
}

int astream_take(struct astream *a, int64_t k, struct astream_step *out, struct fully_async_stats *fa, int *taken,
                 int *dropped, char *err, size_t errlen)
{
    const int T = a->o.push_every > 0 ? a->o.push_every : 1;
    const int64_t P = (k - 1) / T; /* the trainer's parameter version at step k: pushes so far */
    *taken = *dropped = 0;
    while (a->n_cur < a->o.units) {
        int at = -1;
        const struct sched *want = NULL;
        if (a->rp) { /* the schedule's next unit, once it is here */
            if (a->rp_next >= a->n_rp || a->rp[a->rp_next].step != k)
                return error_set(err, errlen,
                                 "replay: step %lld needs %d more unit(s), but the replayed schedule has %s",
                                 (long long)k, a->o.units - a->n_cur,
                                 a->rp_next >= a->n_rp ? "no more" : "the next for a later step");
            want = &a->rp[a->rp_next];
            for (int i = 0; i < a->n_buf && at < 0; i++)
                if (a->buf[i].h.step == want->chunk && a->buf[i].h.unit == want->unit)
                    at = i;
        } else if (a->n_buf > 0) {
            at = 0;
        }
        if (at < 0)
            return 0;
        struct aunit x = a->buf[at];
        memmove(a->buf + at, a->buf + at + 1, (size_t)(a->n_buf - at - 1) * sizeof *a->buf);
        a->n_buf--;
        struct sched e;
        unit_schedule(a, &x, &e);
        e.step = k;
        e.staleness = P - x.vmax / T;
        e.dropped = (double)e.staleness > a->drop_after;
        if (want) {
            char why[512];
            const bool same = same_entry(&e, want, why, sizeof why);
            a->rp_next++;
            if (!same) {
                sched_free(&e);
                step_batch_free(&x.b);
                return error_set(err, errlen, "replay: step %lld took chunk %lld unit %d %s", (long long)k,
                                 (long long)x.h.step, x.h.unit, why);
            }
        }
        write_schedule(a, &e);
        sched_free(&e);
        if (e.dropped) {
            log_info("trainer", "step %lld: chunk %lld unit %d dropped: %lld pushes stale (at most %g)", (long long)k,
                     (long long)x.h.step, x.h.unit, (long long)e.staleness, a->drop_after);
            a->dropped_samples += x.b.n_groups;
            a->step_dropped++;
            *dropped += a->o.unit_groups;
            step_batch_free(&x.b);
            continue;
        }
        a->cur[a->n_cur++] = x;
        *taken += a->o.unit_groups;
    }
    /* the step's units in stream order: which came first changes nothing */
    qsort(a->cur, (size_t)a->n_cur, sizeof *a->cur, by_stream);
    step_figures(a, P, fa);
    *out = (struct astream_step){.n = a->n_cur,
                                 .h = xmalloc((size_t)a->n_cur * sizeof *out->h),
                                 .b = xmalloc((size_t)a->n_cur * sizeof *out->b)};
    for (int i = 0; i < a->n_cur; i++)
        out->h[i] = a->cur[i].h, out->b[i] = a->cur[i].b;
    a->n_cur = 0;
    a->step_dropped = 0;
    return 1;
}

void astream_step_free(struct astream_step *s)
{
    for (int i = 0; s->b && i < s->n; i++)
        step_batch_free(&s->b[i]);
    free(s->h), free(s->b);
    *s = (struct astream_step){0};
}

void astream_step_batch(struct astream_step *s, int n, int dp, int dp_size, bool shared_prompts, struct step_batch *out)
{
    int base = 0; /* the unit's first group in the step */
    for (int i = 0; i < s->n; i++) {
        struct step_batch *b = &s->b[i];
        int lo, hi;
        dispatch_unit_range(s->h[i].groups_in_step, s->h[i].units, s->h[i].unit, &lo, &hi);
        for (int j = 0; j < b->n_seq; j++) {
            struct rollout_seq *q = &b->seqs[j];
            q->version_first = s->h[i].policy_version;
            q->gidx = (base + q->gidx / n - lo) * n + q->gidx % n;
        }
        base += hi - lo;
        step_batch_keep_dp_share(b, dp, dp_size, shared_prompts); /* this DP rank's groups of the unit */
        step_batch_append(out, b);
    }
    qsort(out->seqs, (size_t)out->n_seq, sizeof *out->seqs, by_gidx);
    astream_step_free(s);
}

/* ---- the schedule ---- */

int astream_open_schedule(struct astream *a, const char *path, int64_t keep_step, char *err, size_t errlen)
{
    /* a resumed run keeps the lines of the steps its checkpoint holds, and redoes the others */
    char *kept = NULL;
    size_t kept_len = 0, cap = 0;
    FILE *in = keep_step > 0 ? fopen(path, "r") : NULL;
    if (in) {
        char *line = NULL;
        size_t n = 0;
        ssize_t got;
        while ((got = getline(&line, &n, in)) > 0) {
            json_t *o = json_loads(line, 0, NULL);
            const long long step = o ? (long long)json_integer_value(json_object_get(o, "step")) : -1;
            json_decref(o);
            if (step < 1 || step > keep_step)
                continue;
            if (kept_len + (size_t)got + 1 > cap)
                kept = xrealloc(kept, cap = 2 * (kept_len + (size_t)got + 1));
            memcpy(kept + kept_len, line, (size_t)got);
            kept_len += (size_t)got;
        }
        free(line);
        fclose(in);
    }
    if (fs_write_atomic(path, kept ? kept : "", kept_len, err, errlen) != 0) {
        free(kept);
        return -1;
    }
    free(kept);
    a->sched = fopen(path, "a");
    if (!a->sched)
        return error_set(err, errlen, "%s: cannot open for appending", path);
    return 0;
}

int astream_load_replay(struct astream *a, const char *path, char *err, size_t errlen)
{
    FILE *in = fopen(path, "r");
    if (!in)
        return error_set(err, errlen, KEY_async_replay_schedule ": %s cannot be read", path);
    char *line = NULL;
    size_t n = 0;
    int lineno = 0, cap = 0, rc = 0;
    while (rc == 0 && getline(&line, &n, in) > 0) {
        lineno++;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *v = o ? json_object_get(o, "versions") : NULL, *t = o ? json_object_get(o, "tokens") : NULL;
        const size_t nv = json_array_size(v), nt = json_array_size(t);
        struct sched e = {.step = json_integer_value(json_object_get(o, "step")),
                          .chunk = json_integer_value(json_object_get(o, "chunk")),
                          .unit = (int)json_integer_value(json_object_get(o, "unit")),
                          .dropped = json_is_true(json_object_get(o, "dropped")),
                          .staleness = json_integer_value(json_object_get(o, "staleness")),
                          .n_phases = (int)nv};
        if (!o || e.step < 1 || e.chunk < 1 || e.unit < 0 || e.unit >= a->o.units || nv < 1 || nt % nv != 0 ||
            (int)(nt / nv) != a->o.unit_groups * a->o.n) {
            rc = error_set(err, errlen,
                           "%s:%d: not a unit of this run's schedule (step, chunk, unit below %d, versions, tokens: "
                           "phases x %d sequences)",
                           path, lineno, a->o.units, a->o.unit_groups * a->o.n);
            json_decref(o);
            break;
        }
        e.n_seq = (int)(nt / nv);
        e.versions = xmalloc(nv * sizeof *e.versions);
        e.tokens = xmalloc(nt * sizeof *e.tokens);
        for (size_t i = 0; i < nv; i++)
            e.versions[i] = json_integer_value(json_array_get(v, i));
        for (size_t i = 0; i < nt; i++)
            e.tokens[i] = (int32_t)json_integer_value(json_array_get(t, i));
        json_decref(o);
        if (a->n_rp == cap)
            a->rp = xrealloc(a->rp, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *a->rp);
        a->rp[a->n_rp++] = e;
    }
    free(line);
    fclose(in);
    if (rc == 0 && !a->rp)
        a->rp = xcalloc(1, sizeof *a->rp); /* an empty schedule: a replay still, of nothing */
    return rc;
}

static int by_chunk_unit(const void *p, const void *q)
{
    const struct dispatch_replay *x = p, *y = q;
    if (x->chunk != y->chunk)
        return (x->chunk > y->chunk) - (x->chunk < y->chunk);
    return (x->unit > y->unit) - (x->unit < y->unit);
}

struct dispatch_replay *astream_replay_pending(const struct astream *a, int *n)
{
    struct astream *w = (struct astream *)a;
    free(w->pending);
    w->pending = xcalloc((size_t)(a->n_rp ? a->n_rp : 1), sizeof *w->pending);
    *n = 0;
    for (int i = a->rp_next; i < a->n_rp; i++) {
        const struct sched *e = &a->rp[i];
        if (astream_have(a, e->chunk, e->unit)) /* held from the checkpoint */
            continue;
        w->pending[(*n)++] = (struct dispatch_replay){.chunk = e->chunk,
                                                      .unit = e->unit,
                                                      .n_phases = e->n_phases,
                                                      .n_seq = e->n_seq,
                                                      .versions = e->versions,
                                                      .tokens = e->tokens};
    }
    /* granted in the stream's order, as the recorded run granted them (its schedule is in the order they were taken):
     * a long unit goes out as early as it did, with the version it had then */
    qsort(w->pending, (size_t)*n, sizeof *w->pending, by_chunk_unit);
    return w->pending;
}

/* ---- the checkpoint's state ---- */

#define STATE_MAGIC "GRPOAS01"

static void put64(uint8_t **p, size_t *len, size_t *cap, int64_t v)
{
    if (*len + 8 > *cap)
        *p = xrealloc(*p, *cap = 2 * (*len + 8));
    for (int i = 0; i < 8; i++)
        (*p)[(*len)++] = (uint8_t)((uint64_t)v >> (8 * i));
}

static int get64(const uint8_t *p, size_t len, size_t *at, int64_t *v)
{
    if (*at + 8 > len)
        return -1;
    uint64_t x = 0;
    for (int i = 0; i < 8; i++)
        x |= (uint64_t)p[*at + i] << (8 * i);
    *at += 8;
    *v = (int64_t)x;
    return 0;
}

/* A unit as the wire carries it (unauthenticated), after its length. */
static void put_unit(uint8_t **p, size_t *len, size_t *cap, const struct wire_header *h, const struct step_batch *b)
{
    int *all = xmalloc((size_t)(b->n_groups ? b->n_groups : 1) * sizeof *all);
    for (int g = 0; g < b->n_groups; g++)
        all[g] = g;
    size_t ml;
    uint8_t *msg = wire_pack_batch(h, b, all, b->n_groups, NULL, &ml);
    free(all);
    put64(p, len, cap, (int64_t)ml);
    if (*len + ml > *cap)
        *p = xrealloc(*p, *cap = 2 * (*len + ml));
    memcpy(*p + *len, msg, ml);
    *len += ml;
    free(msg);
}

/* put_unit's unit at *at, checked against lim (written by a trainer: no MAC, any version). 0, or -1 with why. */
static int get_unit(const uint8_t *p, size_t len, size_t *at, const struct wire_limits *lim, struct wire_header *h,
                    struct step_batch *b, char *why, size_t whylen)
{
    int64_t ml;
    *b = (struct step_batch){0};
    if (get64(p, len, at, &ml) != 0 || ml < 0 || (uint64_t)ml > len - *at)
        return error_set(why, whylen, "it ends inside the unit");
    struct wire_limits l = *lim;
    l.auth = NULL; /* written by a trainer rank: a checkpoint's checksum is in state.json, a step's came over MPI */
    l.max_version = INT64_MAX;
    const int rc = wire_unpack_batch(p + *at, (size_t)ml, &l, h, b, why, whylen);
    *at += (size_t)ml;
    return rc;
}

uint8_t *astream_step_pack(const struct astream_step *s, size_t *len)
{
    size_t cap = 256, n = 0;
    uint8_t *p = xmalloc(cap);
    put64(&p, &n, &cap, s->n);
    for (int i = 0; i < s->n; i++)
        put_unit(&p, &n, &cap, &s->h[i], &s->b[i]);
    *len = n;
    return p;
}

int astream_step_unpack(const uint8_t *msg, size_t len, const struct wire_limits *lim, struct astream_step *s,
                        char *err, size_t errlen)
{
    size_t at = 0;
    int64_t count;
    *s = (struct astream_step){0};
    if (get64(msg, len, &at, &count) != 0 || count < 0 || count > lim->units)
        return error_set(err, errlen, "a step's units from trainer rank 0: not a count of units at its start");
    struct wire_limits l = *lim;
    l.dp_rank = 0; /* the rollout ranks send every unit to DP rank 0 */
    s->h = xcalloc((size_t)(count ? count : 1), sizeof *s->h);
    s->b = xcalloc((size_t)(count ? count : 1), sizeof *s->b);
    for (; s->n < count; s->n++) {
        char why[512];
        if (get_unit(msg, len, &at, &l, &s->h[s->n], &s->b[s->n], why, sizeof why) != 0) {
            const int i = s->n;
            astream_step_free(s);
            return error_set(err, errlen, "unit %d of a step's units from trainer rank 0: %s", i, why);
        }
    }
    return 0;
}

uint8_t *astream_state(const struct astream *a, int64_t stream_next, size_t *len)
{
    size_t cap = 256, n = 0;
    uint8_t *p = xmalloc(cap);
    memcpy(p, STATE_MAGIC, 8);
    n = 8;
    const int64_t head[] = {stream_next,        a->generated, a->stale_samples, a->stale_traj,
                            a->dropped_samples, a->rp_next,   a->n_buf};
    for (size_t i = 0; i < sizeof head / sizeof *head; i++)
        put64(&p, &n, &cap, head[i]);
    for (int i = 0; i < a->n_buf; i++)
        put_unit(&p, &n, &cap, &a->buf[i].h, &a->buf[i].b);
    *len = n;
    return p;
}

int astream_restore(struct astream *a, const uint8_t *blob, size_t len, const struct wire_limits *lim,
                    int64_t *stream_next, char *err, size_t errlen)
{
    size_t at = 8;
    int64_t head[7];
    if (len < 8 || memcmp(blob, STATE_MAGIC, 8) != 0)
        return error_set(err, errlen, "not a fully-async stream's state (no %s at its start)", STATE_MAGIC);
    for (int i = 0; i < 7; i++)
        if (get64(blob, len, &at, &head[i]) != 0)
            return error_set(err, errlen, "the stream's state ends early (%zu bytes)", len);
    if (head[0] < 0 || head[6] < 0 || head[5] < 0 || (a->rp && head[5] > a->n_rp))
        return error_set(err, errlen, "the stream's state holds impossible counts");
    *stream_next = head[0];
    a->generated = head[1], a->stale_samples = head[2], a->stale_traj = head[3], a->dropped_samples = head[4];
    if (a->rp) {
        a->rp_next = (int)head[5];
        for (int i = 0; i < a->rp_next; i++) /* taken or dropped before the checkpoint */
            mark(a, stream_index(a, a->rp[i].chunk, a->rp[i].unit));
    } else {
        for (int64_t n = 0; n < head[0]; n++) /* every unit before the stream's next reached the trainer */
            mark(a, n);
    }
    for (int64_t i = 0; i < head[6]; i++) {
        struct wire_header h;
        struct step_batch b;
        char why[512];
        if (get_unit(blob, len, &at, lim, &h, &b, why, sizeof why) != 0)
            return error_set(err, errlen, "unit %lld of the stream's state: %s", (long long)i, why);
        astream_arrive(a, &h, &b);
        a->generated -= a->o.unit_groups; /* counted when it first came */
    }
    return 0;
}
