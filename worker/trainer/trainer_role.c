/* The trainer role: each step's groups arrive from the rollout ranks over the
 * data plane, one batch per work unit; the update runs data-parallel over the
 * trainer ranks; DP rank 0 runs the dispatcher (worker/plane/dispatch.h) that
 * grants the units and serves each new policy version. The run loop is
 * trainer.c's, the step trainer_step.c's. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "worker/step/prompts.h"
#include "proto/transport.h"
#include "trainer.h"
#include "worker/metrics/metrics.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/roles.h"
#include "worker/step/batch.h"
#include "worker/plane/dataplane.h"
#include "worker/plane/dispatch.h"
#include "worker/plane/weight_sync.h"
#include "worker/plane/wire.h"
#include "worker/trainer/async_stream.h"
#include "worker/data/dataset.h"
#include "common/fs.h"

/* A batch that arrived before its step (one-step-off: the rollout runs ahead). */
struct pending {
    struct wire_header h;
    struct step_batch b;
    uint8_t *raw; /* the message as it came (TP rank 0 of a TP group: its peers get a copy); NULL otherwise */
    size_t raw_len;
};

struct trainer_rank {
    struct role_env *env;
    struct trainer *t;
    struct dataplane_pull *pull;
    struct wire_limits lim;
    struct plane_verifier verifier; /* the run key and the counters each rollout process has used */
    struct wire_auth auth;          /* lim.auth: the last batch's sender, for its answer */
    struct pending *pend;
    int n_pend, cap_pend;
    struct dispatcher *disp; /* DP rank 0, TP rank 0 only */
    struct comm *mp;         /* the ranks holding this DP rank's batches (model copy, SP group, or both; NULL: this rank
                              * alone): its rank 0 pulls and shares */
    uint64_t refused, duplicates, stale;
    /* batches dropped, by reason: refused as malformed or out of range, for a step beyond the window, from a
     * process the unit was not granted to, holding other prompts than their step draws (refused, or dropped at
     * the step when they came ahead of it) */
    uint64_t drop_invalid, drop_future, drop_not_granted, drop_prompt;
    uint64_t old_epoch;  /* of the refused, batches of another key epoch (another launch's keys) */
    const int *cur_uids; /* the step next_batch waits for (cur_k): the prompts it draws at each group */
    int64_t cur_k;
    int64_t start;
    double sync_s_pending;  /* publishing time to report with the next step */
    int64_t bytes_reported; /* weight bytes the dispatcher had served at the previous step */
    double refused_logged_at;
    struct weight_sync_sender ws; /* the dispatcher's rank: the broadcast rounds (weight_sync=broadcast) */
    /* fully-async training (async_training.*): the stream's units at this trainer, the prompts of each chunk (drawn
     * from the data's start: the cursor before each, and its uids), what the units since the last step reported */
    struct astream *as;
    struct data_cursor acur;
    bool acur_open;
    int64_t chunks_drawn;
    int *chunk_uids;   /* (chunks_drawn x groups_in_step) */
    int64_t *chunk_at; /* (chunks_drawn x 2): the cursor's epoch and index before each chunk */
    int64_t published; /* the newest version published (-1: none) */
    bool draining;     /* a checkpoint holds the dispatcher's grants: lifted at the next push */
    double a_gen, a_reward, a_idle, a_wait_weights, a_peak_rss; /* the units' figures since the last step (sums) */
};

/* The sender's phase: weight sync while a round runs. */
static void sync_phase(void *ud, bool syncing)
{
    struct trainer_rank *r = ud;
    control_set_phase(r->env->ctl, syncing ? GRPO__PHASE__PHASE_WEIGHT_SYNC : GRPO__PHASE__PHASE_IDLE);
}

/* Between the rounds finish_rounds waits for: the rollout ranks hold at their safe points while the run is to
 * pause, and so does this wait. */
static void hold(void *ud)
{
    struct trainer_rank *r = ud;
    control_hold_while_waiting(r->env->ctl, false);
}

/* A dropped batch, logged at a bounded rate (a flood of garbage must not flood the log). */
static void log_dropped(struct trainer_rank *r, const char *what, const char *why)
{
    double now = clock_now_s();
    if (now - r->refused_logged_at > 5.0) {
        log_warn("dataplane",
                 "%s (%" PRIu64 " refused so far: %" PRIu64 " malformed or out of range, %" PRIu64 " for a later step, "
                 "%" PRIu64 " not granted to their sender, %" PRIu64 " with other prompts than their step's): %s",
                 what, r->refused, r->drop_invalid, r->drop_future, r->drop_not_granted, r->drop_prompt, why);
        r->refused_logged_at = now;
    }
}

static void drop_refused(struct trainer_rank *r, const char *why)
{
    r->refused++;
    log_dropped(r, "refused a batch on the data socket", why);
}

/* The rollout rank (the dispatcher's slot) of world rank `from`, or -1 when it is no rollout rank's sender. */
static int slot_of(const struct trainer_rank *r, int from)
{
    const int T = r->env->spec.trainer_ranks, rtp = r->env->spec.rollout_tp > 1 ? r->env->spec.rollout_tp : 1;
    if (from < T || from >= T + r->env->spec.rollout_ranks || (from - T) % rtp != 0)
        return -1;
    return (from - T) / rtp;
}

/* 0 when every sequence of a batch for step k holds the prompt step k draws at its group (uids), else -1 with why. */
static int prompts_agree(const struct trainer_rank *r, const struct pending *p, int64_t k, const int *uids, char *why,
                         size_t whylen)
{
    for (int i = 0; i < p->b.n_seq; i++) {
        const struct rollout_seq *q = &p->b.seqs[i];
        const int g = q->gidx / r->lim.n, uid = p->b.group_uid[q->group];
        if (uids[g] != uid) {
            snprintf(why, whylen,
                     "step %lld unit %d from rank %d: group %d holds prompt uid %d, but step %lld draws uid %d "
                     "there (the sender is not of this run, or its data.* settings differ from the trainers')",
                     (long long)p->h.step, p->h.unit, p->h.from_rank, g, uid, (long long)k, uids[g]);
            return -1;
        }
    }
    return 0;
}

/* Append a batch to the pending list (it owns the batch from here on). */
static void keep_pending(struct trainer_rank *r, const struct pending *p)
{
    if (r->n_pend == r->cap_pend) {
        r->cap_pend = r->cap_pend ? 2 * r->cap_pend : 8;
        r->pend = xrealloc(r->pend, (size_t)r->cap_pend * sizeof *r->pend);
    }
    r->pend[r->n_pend++] = *p;
}

/* This rank pulls for a DP rank other than the dispatcher's: which copy of a unit counts is DP rank 0's word. */
static bool decides_later(const struct trainer_rank *r) { return r->pull && r->env->at.dp != 0; }

/* Take one message off the socket into pending (checked, de-duplicated). 1 if a batch was kept, 0 if none came
 * or it was dropped, -1 on a socket error. */
/* One message off the socket (*buf, *len: the caller frees it with dataplane_msg_free), unpacked into p under
 * r->lim: 1 with *rc the unpacking's status (err says why it failed), 0 when none came, -1 on a socket error
 * (logged). */
static int receive_batch(struct trainer_rank *r, int timeout_ms, struct pending *p, int *rc, void **buf, size_t *len,
                         char *err, size_t errlen)
{
    int got = dataplane_recv(r->pull, timeout_ms, buf, len, err, errlen);
    if (got <= 0) {
        if (got < 0)
            log_error("dataplane", "%s", err);
        return got;
    }
    *p = (struct pending){0};
    *rc = wire_unpack_batch(*buf, *len, &r->lim, &p->h, &p->b, err, errlen);
    return 1;
}

static int receive_one(struct trainer_rank *r, int64_t k, int timeout_ms)
{
    char err[1024];
    struct pending p;
    void *buf;
    size_t len;
    int rc = 0;
    int got = receive_batch(r, timeout_ms, &p, &rc, &buf, &len, err, sizeof err);
    if (got <= 0)
        return got;
    /* only the steps the dispatcher can have granted: version k - 1 is published, which opens steps up to
     * k + staleness (dispatch.h); anything later is not kept, whoever sent it */
    const int64_t last = k + r->env->staleness;
    uint64_t *reason = &r->drop_invalid;
    if (rc == 0 && p.h.step > last) {
        snprintf(err, sizeof err, "batch for step %lld, but the trainers take steps %lld..%lld now (step %lld and %s)",
                 (long long)p.h.step, (long long)k, (long long)last, (long long)k,
                 r->env->staleness ? "the next, one-step-off" : "no later, on-policy");
        step_batch_free(&p.b);
        rc = -1;
        reason = &r->drop_future;
    }
    /* the step waited for: its prompts are known, so a batch that holds others is refused before it can take the
     * unit's place (a later, right copy is then kept) */
    if (rc == 0 && p.h.step == k && r->cur_uids && r->cur_k == k &&
        prompts_agree(r, &p, k, r->cur_uids, err, sizeof err) != 0) {
        step_batch_free(&p.b);
        rc = -1;
        reason = &r->drop_prompt;
    }
    /* only from a process the dispatcher granted the unit to: the dispatcher's rank knows the grants; every rank
     * knows that only a rollout rank's sender can have been granted one */
    if (rc == 0 && p.h.step >= k) {
        const int slot = slot_of(r, p.h.from_rank);
        if (slot < 0 || (r->disp && !dispatcher_granted(r->disp, p.h.step, p.h.unit, slot))) {
            snprintf(err, sizeof err, "step %lld unit %d was not granted to rank %d%s", (long long)p.h.step, p.h.unit,
                     p.h.from_rank, slot < 0 ? " (not a rollout rank's sender)" : "'s process");
            step_batch_free(&p.b);
            rc = -1;
            reason = &r->drop_not_granted;
        }
    }
    if (rc == 0 && r->mp) {
        p.raw = xcalloc((len + 3) / 4 * 4, 1); /* share_step broadcasts it in whole 32-bit words */
        memcpy(p.raw, buf, len);
        p.raw_len = len;
    }
    dataplane_msg_free(buf);
    /* the acknowledgement, or the refusal with its reason, authenticated for a sender whose MAC was good */
    dataplane_answer(r->pull, rc == 0, err, &r->auth);
    if (rc != 0) {
        (*reason)++;
        r->old_epoch += r->auth.old_epoch;
        drop_refused(r, err);
        return 0;
    }
    /* the first copy of each (step, unit) counts: a unit granted again after its process was lost comes out the
     * same, and a second copy of it is dropped. The dispatcher's rank keeps only granted copies; the other DP ranks
     * cannot tell, so they keep one copy of each unit per rollout rank's sender (at most one per unit of a step:
     * the real one always finds room) until DP rank 0 says whose counts (choose_senders) */
    int copies = 0;
    bool same_sender = false;
    for (int i = 0; i < r->n_pend; i++)
        if (r->pend[i].h.step == p.h.step && r->pend[i].h.unit == p.h.unit) {
            copies++;
            same_sender |= r->pend[i].h.from_rank == p.h.from_rank;
        }
    const bool dup = decides_later(r) ? same_sender || copies >= r->lim.units : copies > 0;
    if (dup || p.h.step < k) {
        if (p.h.step < k)
            r->stale++;
        else
            r->duplicates++;
        log_debug("dataplane", "dropped step %lld unit %d from rank %d (%s)", (long long)p.h.step, p.h.unit,
                  p.h.from_rank, dup ? "a copy is in already" : "that step is trained");
        step_batch_free(&p.b);
        free(p.raw);
        return 0;
    }
    keep_pending(r, &p);
    return 1;
}

static int by_gidx(const void *a, const void *b)
{
    const struct rollout_seq *x = a, *y = b;
    return (x->gidx > y->gidx) - (x->gidx < y->gidx);
}

static void hold_while_waiting(void *ud, bool done)
{
    struct trainer_rank *r = ud;
    control_hold_while_waiting(r->env->ctl, done);
}

/* Under TP or PP: rank 0 of the model copy (TP rank 0, the first stage) sends the step's messages (as they came
 * over the data plane) to the other ranks of the copy, which unpack them with the same checks into their own
 * pending list. 0, or -1 (a peer could not unpack one). */
static int share_step(struct trainer_rank *r, int64_t k)
{
    const bool root = comm_rank(r->mp) == 0;
    int64_t count = 0;
    for (int i = 0; root && i < r->n_pend; i++)
        count += r->pend[i].h.step == k;
    comm_broadcast_polled(r->mp, &count, 1, COMM_I64, 0, root ? NULL : hold_while_waiting, r);
    for (int i = 0, sent = 0; sent < count; i++) {
        struct pending *p = root ? &r->pend[i] : NULL;
        if (root && p->h.step != k)
            continue;
        int64_t len = root ? (int64_t)p->raw_len : 0;
        comm_broadcast(r->mp, &len, 1, COMM_I64, 0);
        uint8_t *buf = root ? p->raw : xcalloc((size_t)len + 4, 1);
        comm_broadcast(r->mp, buf, ((size_t)len + 3) / 4, COMM_I32, 0); /* bytes as 32-bit words */
        sent++;
        if (root)
            continue;
        struct pending q = {0};
        char err[1024];
        int rc = wire_unpack_batch(buf, (size_t)len, &r->lim, &q.h, &q.b, err, sizeof err);
        free(buf);
        if (rc != 0) {
            log_error("trainer", "step %lld: a batch from the model copy's rank 0 does not unpack here: %s",
                      (long long)k, err);
            return -1;
        }
        keep_pending(r, &q);
    }
    return 0;
}

/* Distinct units of step k held. */
static int units_held(const struct trainer_rank *r, int64_t k)
{
    int have = 0;
    for (int i = 0; i < r->n_pend; i++) {
        if (r->pend[i].h.step != k)
            continue;
        bool first = true;
        for (int j = 0; j < i && first; j++)
            first = !(r->pend[j].h.step == k && r->pend[j].h.unit == r->pend[i].h.unit);
        have += first;
    }
    return have;
}

/* On a DP rank other than the dispatcher's: keep of step k only the first copy of each unit from the sender DP rank 0
 * kept (pick[u]); drop the others (granted[u * R + slot]: whether that sender was granted the unit at all). The
 * number of units still without that sender's copy. */
static int keep_picked(struct trainer_rank *r, int64_t k, const int32_t *pick, const int32_t *granted)
{
    const int R = r->lim.units;
    bool *have = xcalloc((size_t)R, sizeof *have);
    int w = 0;
    for (int i = 0; i < r->n_pend; i++) {
        struct pending *p = &r->pend[i];
        const int u = p->h.unit;
        if (p->h.step != k || (p->h.from_rank == pick[u] && !have[u])) {
            if (p->h.step == k)
                have[u] = true;
            r->pend[w++] = *p;
            continue;
        }
        const int slot = slot_of(r, p->h.from_rank);
        if (slot < 0 || !granted[u * R + slot]) {
            char why[256];
            snprintf(why, sizeof why, "step %lld unit %d was not granted to rank %d (DP rank 0 keeps rank %d's copy)",
                     (long long)k, u, p->h.from_rank, pick[u]);
            r->drop_not_granted++;
            log_dropped(r, "dropped a batch at its step", why);
        } else {
            r->duplicates++;
        }
        step_batch_free(&p->b);
        free(p->raw);
    }
    r->n_pend = w;
    int missing = 0;
    for (int u = 0; u < R; u++)
        missing += !have[u];
    free(have);
    return missing;
}

struct pull_wait {
    struct trainer_rank *r;
    int64_t k;
};

/* While a DP rank waits for DP rank 0's word, it keeps taking batches off its socket (and holds for a pause). */
static void pull_while_waiting(void *ud, bool done)
{
    struct pull_wait *pw = ud;
    if (!done)
        receive_one(pw->r, pw->k, 10);
    control_hold_while_waiting(pw->r->env->ctl, false);
}

/* Every DP rank trains step k on the same senders' copies: DP rank 0 (the dispatcher's, which kept only copies from
 * processes the unit was granted to) says whose copy of each unit it kept and to whom each unit was granted; the
 * other DP ranks keep that sender's copy, drop the rest and wait for any still missing. 0, or -1 on a socket error. */
static int choose_senders(struct trainer_rank *r, int64_t k)
{
    const int R = r->lim.units;
    int32_t *pick = xcalloc((size_t)R * (size_t)(R + 1), sizeof *pick), *granted = pick + R;
    if (r->env->at.dp == 0) {
        for (int i = 0; i < r->n_pend; i++)
            if (r->pend[i].h.step == k)
                pick[r->pend[i].h.unit] = r->pend[i].h.from_rank;
        for (int u = 0; u < R; u++)
            for (int slot = 0; slot < R; slot++)
                granted[u * R + slot] = r->disp && dispatcher_granted(r->disp, k, u, slot);
    }
    struct pull_wait pw = {.r = r, .k = k};
    comm_broadcast_polled(r->env->dp, pick, (size_t)R * (size_t)(R + 1), COMM_I32, 0,
                          r->env->at.dp == 0 ? NULL : pull_while_waiting, &pw);
    int rc = 0;
    if (r->env->at.dp != 0) {
        const double t0 = clock_now_s();
        double last_note = t0;
        while (keep_picked(r, k, pick, granted) > 0) {
            if (receive_one(r, k, 200) < 0) {
                rc = -1;
                break;
            }
            control_hold_while_waiting(r->env->ctl, false);
            if (clock_now_s() - last_note > 60) {
                log_warn("trainer", "step %lld: waiting %.0f s for the copies of DP rank 0's senders", (long long)k,
                         clock_now_s() - t0);
                last_note = clock_now_s();
            }
        }
    }
    free(pick);
    return rc;
}

/* Batches of step k that came ahead of it (one-step-off) and hold other prompts than step k draws: dropped, and on
 * the dispatcher's rank their unit is granted again (a right copy from another sender may be pending still). */
static void drop_other_prompts(struct trainer_rank *r, int64_t k, const int *uids)
{
    int w = 0;
    for (int i = 0; i < r->n_pend; i++) {
        struct pending *p = &r->pend[i];
        char why[512];
        if (p->h.step != k || prompts_agree(r, p, k, uids, why, sizeof why) == 0) {
            r->pend[w++] = *p;
            continue;
        }
        r->drop_prompt++;
        log_dropped(r, "dropped a batch that came ahead of its step", why);
        if (r->disp)
            dispatcher_regrant(r->disp, k, p->h.unit, "the trainers dropped its batch: other prompts than the step's");
        step_batch_free(&p->b);
        free(p->raw);
    }
    r->n_pend = w;
}

/* ---- fully-async training (docs/training.md): units in the order they come to trainer rank 0 ---- */

/* The uids chunk j of the stream draws (chunk 1 is the data's first batch), drawn as needed. */
static const int *chunk_uids(struct trainer_rank *r, int64_t j)
{
    const int B = r->lim.groups_in_step;
    while (r->chunks_drawn < j) {
        const int64_t c = r->chunks_drawn++;
        r->chunk_uids = xrealloc(r->chunk_uids, (size_t)r->chunks_drawn * (size_t)B * sizeof(int));
        r->chunk_at = xrealloc(r->chunk_at, (size_t)r->chunks_drawn * 2 * sizeof(int64_t));
        r->chunk_at[2 * c] = r->acur.epoch;
        r->chunk_at[2 * c + 1] = r->acur.index;
        data_cursor_next(&r->acur, r->chunk_uids + (size_t)c * B);
    }
    return r->chunk_uids + (size_t)(j - 1) * B;
}

/* One message off the socket into the stream (checked: granted to its sender, its chunk's prompts, a first copy).
 * 1 if a unit arrived, 0 if none came or it was dropped, -1 on a socket error. */
static int async_receive_one(struct trainer_rank *r, int timeout_ms)
{
    char err[1024];
    struct pending p;
    int rc = 0;
    void *buf;
    size_t len;
    r->lim.max_version = r->published;
    int got = receive_batch(r, timeout_ms, &p, &rc, &buf, &len, err, sizeof err);
    if (got <= 0)
        return got;
    dataplane_msg_free(buf);
    uint64_t *reason = &r->drop_invalid;
    if (rc == 0 && p.h.step > r->chunks_drawn + 1000000) {
        snprintf(err, sizeof err, "chunk %lld is far past the stream", (long long)p.h.step);
        rc = -1, reason = &r->drop_future;
    }
    if (rc == 0) {
        const int slot = slot_of(r, p.h.from_rank);
        if (slot < 0 || !dispatcher_async_granted(r->disp, p.h.step, p.h.unit, slot)) {
            if (astream_have(r->as, p.h.step, p.h.unit)) { /* a late copy of a unit that is in: dropped quietly */
                dataplane_answer(r->pull, true, "", &r->auth);
                r->duplicates++;
                step_batch_free(&p.b);
                return 0;
            }
            snprintf(err, sizeof err, "chunk %lld unit %d was not granted to rank %d", (long long)p.h.step, p.h.unit,
                     p.h.from_rank);
            rc = -1, reason = &r->drop_not_granted;
        }
    }
    if (rc == 0) {
        const int *uids = chunk_uids(r, p.h.step);
        for (int i = 0; i < p.b.n_seq && rc == 0; i++) {
            const int g = p.b.seqs[i].gidx / r->lim.n, uid = p.b.group_uid[p.b.seqs[i].group];
            if (uids[g] != uid) {
                snprintf(err, sizeof err,
                         "chunk %lld unit %d from rank %d: group %d holds prompt uid %d, but the chunk draws uid %d "
                         "there (the sender is not of this run, or its data.* settings differ)",
                         (long long)p.h.step, p.h.unit, p.h.from_rank, g, uid, uids[g]);
                rc = -1, reason = &r->drop_prompt;
            }
        }
    }
    dataplane_answer(r->pull, rc == 0, err, &r->auth);
    if (rc != 0) {
        step_batch_free(&p.b);
        (*reason)++;
        drop_refused(r, err);
        return 0;
    }
    if (astream_have(r->as, p.h.step, p.h.unit)) { /* a unit granted again comes out the same: the first counts */
        r->duplicates++;
        step_batch_free(&p.b);
        return 0;
    }
    r->a_gen += p.h.gen_s, r->a_reward += p.h.reward_s, r->a_idle += p.h.idle_s;
    r->a_wait_weights += p.h.wait_weights_s;
    r->a_peak_rss = fmax(r->a_peak_rss, p.h.peak_rss_gb);
    dispatcher_async_received(r->disp, p.h.step, p.h.unit);
    astream_arrive(r->as, &p.h, &p.b);
    return 1;
}

/* The data plane's counters into the step's figures (the socket's refusals and drops, and the dispatcher's when
 * this rank runs it), and the weight sync's time since the last step. */
static void plane_counters(struct trainer_rank *r, struct step_timing *tm)
{
    tm->update_weights_s = r->sync_s_pending;
    tm->refused = r->refused;
    tm->old_epoch = r->old_epoch;
    tm->duplicates = r->duplicates + r->stale;
    tm->drop_invalid = r->drop_invalid;
    tm->drop_future = r->drop_future;
    tm->drop_not_granted = r->drop_not_granted;
    tm->drop_prompt = r->drop_prompt;
    if (r->disp) {
        struct dispatch_stats ds;
        dispatcher_stats(r->disp, &ds);
        tm->dispatched = true;
        tm->live_processes = ds.live;
        tm->lost_processes = ds.lost;
        tm->units_regranted = ds.regranted;
        tm->weight_bytes = ds.bytes - r->bytes_reported;
        tm->dispatch_refused = ds.refused;
        tm->dispatch_old_epoch = ds.old_epoch;
        tm->dispatch_oversized = ds.oversized;
        tm->dispatch_superseded = ds.superseded;
        tm->dispatch_rate_limited = ds.rate_limited;
        tm->replaced_processes = ds.replaced;
        r->bytes_reported = ds.bytes;
    }
    r->sync_s_pending = 0;
}

/* Whether the update packs a group's shared prompt once (the rows step_batch_balance weighs), as the rollout ranks
 * reckon it when they cut a unit over the DP ranks in the on-policy split layout. */
static bool packs_shared_prompts(const struct trainer_rank *r)
{
    return r->env->cfg->actor_shared_prompt_packing && strcmp(config_device(r->env->cfg), "cpu") == 0;
}

/* Fully-async training with more than one trainer rank: trainer rank 0 (the stream's) sends the units step k took
 * to the others in one broadcast over the trainers (s NULL: its stream failed, and they fail with it). */
static void send_units(struct trainer_rank *r, const struct astream_step *s)
{
    struct comm *all = r->env->trainers;
    if (!all || comm_size(all) < 2)
        return;
    size_t len = 0;
    uint8_t *msg = s ? astream_step_pack(s, &len) : NULL;
    int64_t n = s ? (int64_t)len : -1;
    comm_broadcast_polled(all, &n, 1, COMM_I64, 0, NULL, NULL);
    if (msg) {
        const size_t words = (len + 3) / 4; /* bytes as 32-bit words */
        msg = xrealloc(msg, words * 4 + 4);
        memset(msg + len, 0, words * 4 + 4 - len);
        comm_broadcast(all, msg, words, COMM_I32, 0);
    }
    free(msg);
}

/* The other trainer ranks: the units step k took, from trainer rank 0 (waited for as for data, holding for a pause
 * meanwhile). 0, or -1 (rank 0's stream failed, or its message does not unpack here). */
static int receive_units(struct trainer_rank *r, int64_t k, struct astream_step *s)
{
    struct comm *all = r->env->trainers;
    int64_t n = 0;
    comm_broadcast_polled(all, &n, 1, COMM_I64, 0, hold_while_waiting, r);
    if (n < 0) {
        log_error("trainer", "step %lld: trainer rank 0's stream failed (see its log)", (long long)k);
        return -1;
    }
    const size_t words = ((size_t)n + 3) / 4;
    uint8_t *msg = xcalloc(words * 4 + 4, 1);
    comm_broadcast(all, msg, words, COMM_I32, 0);
    char err[1024];
    const int rc = astream_step_unpack(msg, (size_t)n, &r->lim, s, err, sizeof err);
    free(msg);
    if (rc != 0)
        log_error("trainer", "step %lld: %s", (long long)k, err);
    return rc;
}

/* Step k's units at trainer rank 0, from the stream: in the order they came (a replay: its schedule's), the stale
 * ones dropped. 0, or -1. */
static int async_take_units(struct trainer_rank *r, int64_t k, struct astream_step *s, struct step_timing *tm)
{
    const double t0 = clock_now_s();
    double last_note = t0;
    char err[1024];
    for (;;) {
        int taken, dropped;
        const int got = astream_take(r->as, k, s, &tm->fa, &taken, &dropped, err, sizeof err);
        if (taken || dropped)
            dispatcher_async_taken(r->disp, taken, false);
        if (dropped) /* one more is granted in its place */
            dispatcher_async_taken(r->disp, dropped, true);
        if (got < 0) {
            log_error("trainer", "%s", err);
            return -1;
        }
        if (got > 0)
            return 0;
        if (async_receive_one(r, 200) < 0)
            return -1;
        control_hold_while_waiting(r->env->ctl, false);
        if (clock_now_s() - last_note > 60) {
            struct dispatch_stats ds;
            dispatcher_stats(r->disp, &ds);
            log_warn("trainer",
                     "step %lld: waiting %.0f s for the stream's units (%d held, %d in flight, %d rollout "
                     "process(es) alive)",
                     (long long)k, clock_now_s() - t0, astream_held(r->as), dispatcher_async_in_flight(r->disp),
                     ds.live);
            last_note = clock_now_s();
        }
    }
}

/* Rank 0's figures of the step: the rollout processes' of the units since the last step (per process), the data
 * plane's counters, and the data cursor checkpoints record (past the newest chunk drawn; a checkpoint sets the
 * stream's own). */
static void async_figures(struct trainer_rank *r, struct step_timing *tm)
{
    tm->fa.total_wait_time = tm->wait_data;
    const double U = r->lim.units;
    tm->gen = r->a_gen / U, tm->reward = r->a_reward / U, tm->rollout_idle = r->a_idle / U;
    tm->rollout_wait_weights = r->a_wait_weights / U, tm->rollout_peak_rss_gb = r->a_peak_rss;
    r->a_gen = r->a_reward = r->a_idle = r->a_wait_weights = 0;
    tm->staleness = (int64_t)tm->fa.staleness_max;
    plane_counters(r, tm);
    if (r->chunks_drawn > 0)
        trainer_set_cursor(r->t, r->acur.epoch, r->acur.index);
}

/* Step k's batch, fully-async: trainer rank 0 takes the step's units from its stream and sends them to the other
 * trainer ranks; every rank trains its DP rank's share of them (the TP, PP and SP ranks of a DP rank the same). */
static int async_next_batch(struct trainer_rank *r, int64_t k, struct step_batch *b, struct step_timing *tm)
{
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
    const double t0 = clock_now_s();
    struct astream_step s = {0};
    if (r->as) {
        const int rc = async_take_units(r, k, &s, tm);
        send_units(r, rc == 0 ? &s : NULL);
        if (rc != 0)
            return -1;
    } else if (receive_units(r, k, &s) != 0) {
        return -1;
    }
    control_hold_while_waiting(r->env->ctl, true);
    tm->wait_data = clock_now_s() - t0;
    tm->split = true;
    tm->fully_async = true;
    astream_step_batch(&s, r->lim.n, r->env->at.dp, r->env->at.dp_size, packs_shared_prompts(r), b);
    if (r->as)
        async_figures(r, tm);
    return 0;
}

/* trainer_source.checkpoint_state: the stream drained (no new grants; the units in flight finish with the weights
 * they have and come in), then the units held, the counters and the stream's next unit; the data cursor is the
 * stream's. The hold lasts to the next push. */
static int async_checkpoint_state(void *ctx, int64_t step, uint8_t **blob, size_t *len)
{
    struct trainer_rank *r = ctx;
    if (!r->as) { /* the stream is trainer rank 0's, and so is the checkpoint's writing */
        *blob = NULL, *len = 0;
        return 0;
    }
    dispatcher_async_hold(r->disp, true);
    r->draining = true;
    const double t0 = clock_now_s();
    double last_note = t0;
    while (dispatcher_async_in_flight(r->disp) > 0) {
        if (async_receive_one(r, 200) < 0)
            return -1;
        control_hold_while_waiting(r->env->ctl, false);
        if (clock_now_s() - last_note > 60) {
            log_warn("trainer", "checkpoint of step %lld: waiting %.0f s for %d unit(s) in flight", (long long)step,
                     clock_now_s() - t0, dispatcher_async_in_flight(r->disp));
            last_note = clock_now_s();
        }
    }
    const int64_t next = dispatcher_async_next(r->disp);
    *blob = astream_state(r->as, next, len);
    const int64_t chunk = next / r->lim.units + 1; /* the chunk the next unit is of: the cursor before it */
    chunk_uids(r, chunk);
    trainer_set_cursor(r->t, r->chunk_at[2 * (chunk - 1)], r->chunk_at[2 * (chunk - 1) + 1]);
    log_info("trainer",
             "step %lld: the stream is drained for the checkpoint (%d unit(s) held, next chunk %lld unit "
             "%lld, in %.2fs)",
             (long long)step, astream_held(r->as), (long long)chunk, (long long)(next % r->lim.units),
             clock_now_s() - t0);
    return 0;
}

/* trainer_source.next_batch: step k's batches from every rollout rank, merged in the step's order. */
static int next_batch(void *ctx, int64_t k, struct step_batch *b, struct step_timing *tm)
{
    struct trainer_rank *r = ctx;
    if (r->env->cfg->async_enable)
        return async_next_batch(r, k, b, tm);
    const int R = r->lim.units, B = r->lim.groups_in_step;
    int *uids = xmalloc((size_t)B * sizeof(int));
    trainer_advance_cursor(r->t, uids); /* the checkpoint's cursor moves with the rollout ranks' */
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
    const double t0 = clock_now_s();
    double last_note = t0;
    r->cur_uids = uids, r->cur_k = k;
    for (; r->pull;) { /* the model copy's rank 0 pulls; the others get the batches from it */
        drop_other_prompts(r, k, uids);
        if (units_held(r, k) >= R)
            break;
        /* on-policy the rollout processes ask for the version of this step while it waits */
        r->sync_s_pending += weight_sync_serve_round(&r->ws);
        if (receive_one(r, k, r->disp && r->env->weight_group ? 20 : 200) < 0) {
            free(uids);
            return -1;
        }
        /* the rollout ranks hold at their safe points while the run is to pause: so does this wait */
        control_hold_while_waiting(r->env->ctl, false);
        if (clock_now_s() - last_note > 60) {
            log_warn("trainer", "step %lld: %d of %d work units after %.0fs; still waiting", (long long)k,
                     units_held(r, k), R, clock_now_s() - t0);
            if (r->disp) {
                struct dispatch_stats ds;
                dispatcher_stats(r->disp, &ds);
                if (ds.live == 0)
                    log_warn("trainer", "no rollout process is alive: relaunch the lost ones with grpo-worker "
                                        "--replace-rank R (docs/operations.md)");
            }
            last_note = clock_now_s();
        }
    }
    r->sync_s_pending += weight_sync_finish_rounds(&r->ws, hold, r);
    if (r->pull && r->env->at.dp_size > 1 && choose_senders(r, k) != 0) {
        free(uids);
        return -1;
    }
    if (r->pull)
        control_hold_while_waiting(r->env->ctl, true);
    if (r->mp && share_step(r, k) != 0) {
        free(uids);
        return -1;
    }
    tm->wait_data = clock_now_s() - t0;
    tm->split = true;
    int64_t staleness = 0;
    int w = 0;
    for (int i = 0; i < r->n_pend; i++) {
        struct pending *p = &r->pend[i];
        if (p->h.step != k) {
            r->pend[w++] = *p;
            continue;
        }
        tm->gen = fmax(tm->gen, p->h.gen_s); /* the ranks generate side by side */
        tm->reward = fmax(tm->reward, p->h.reward_s);
        if (p->h.idle_s >= tm->rollout_idle) {
            tm->rollout_idle = p->h.idle_s;
            tm->rollout_wait_weights = p->h.wait_weights_s;
        }
        tm->rollout_peak_rss_gb = fmax(tm->rollout_peak_rss_gb, p->h.peak_rss_gb);
        int64_t st = (k - 1) - p->h.policy_version;
        staleness = st > staleness ? st : staleness;
        step_batch_append(b, &p->b);
        free(p->raw);
    }
    r->n_pend = w;
    /* the step's order, whatever order the batches came in; groups keep their indices */
    qsort(b->seqs, (size_t)b->n_seq, sizeof *b->seqs, by_gidx);
    int bad = 0; /* each sequence's prompt is the one this step draws at its group's position (checked as each
                  * batch came: this holds unless the model copy's rank 0 shared another) */
    for (int i = 0; i < b->n_seq; i++)
        bad += uids[b->seqs[i].gidx / r->lim.n] != b->group_uid[b->seqs[i].group];
    r->cur_uids = NULL;
    free(uids);
    if (bad) {
        log_error("trainer",
                  "step %lld: %d sequence(s) hold other prompts than this step draws: the rollout ranks "
                  "and the trainers disagree on the data order (same data.* settings everywhere?)",
                  (long long)k, bad);
        return -1;
    }
    tm->staleness = staleness;
    plane_counters(r, tm);
    return 0;
}

/* Whether this rank holds a part of DP rank 0's model copy other than DP rank 0's own: its TP or PP peers, or the
 * other ranks of its EP group (DP ranks 1 .. EP - 1), which give their parts of every version published. */
static bool copy_peer(const struct trainer_rank *r)
{
    const struct placement *at = &r->env->at;
    if (at->dp == 0)
        return at->tp != 0 || at->pp != 0;
    return at->ep_size > 1 && at->dp < at->ep_size;
}

/* DP rank 0's model copy: version `version` goes to the dispatcher, which serves it to the rollout processes
 * (the TP and PP parts, or the EP group's experts, assembled whole first: the rollout ranks generate with the
 * whole model). */
static void publish(struct trainer_rank *r, int64_t version)
{
    const struct model *p = trainer_policy(r->t);
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_WEIGHT_SYNC);
    const double t0 = clock_now_s();
    float *whole = NULL;
    size_t n;
    if (p->lora && (p->sh.ep || p->sh.mp)) { /* LoRA under EP, TP or PP: the whole adapter, every rank's parts of
                                              * it (from a host copy) */
        if (r->disp)
            whole = xmalloc(lora_whole_floats(p) * sizeof(float));
        lora_mp_gather(p, trainer_params(r->t, &n), whole);
    } else if (p->sh.tp_size * p->sh.pp_size > 1 || p->sh.ep) { /* the parts to the dispatcher's rank, each from a host
                                                                 * copy on GPUs; under EP the experts of DP ranks
                                                                 * 1 .. EP - 1; SP rank 0's copy */
        if (r->disp)
            whole = xmalloc(model_whole_floats(&p->cfg) * sizeof(float));
        model_shard_gather(p, trainer_params(r->t, &n), whole, 0);
    }
    /* with LoRA the adapter only: the rollout ranks hold the frozen base, loaded from the same path; from a GPU
     * a host copy */
    if (r->disp)
        dispatcher_publish(r->disp, version, whole ? whole : trainer_params(r->t, &n)); /* with LoRA, the adapter */
    r->published = version > r->published ? version : r->published;
    free(whole);
    r->sync_s_pending += clock_now_s() - t0;
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
    log_debug("trainer", "policy version %lld published (%zu bytes)", (long long)version,
              (p->lora ? lora_whole_floats(p) : model_whole_floats(&p->cfg)) * sizeof(float));
}

/* trainer_source.between_steps: after step j the rollout processes need version j for their step j + 1 +
 * staleness; and the end of the run, whenever it comes, is always said, so they end as soon as they hear it. */
static int between_steps(void *ctx, int64_t j, bool stop)
{
    struct trainer_rank *r = ctx;
    if (r->env->at.cp != 0 || (r->env->at.dp != 0 && !copy_peer(r))) /* SP ranks hold the whole model */
        return 0;
    if (stop) {
        if (!r->disp)
            return 0;
        char why[128];
        snprintf(why, sizeof why, "the trainers %s after step %lld",
                 j >= trainer_total_steps(r->t) ? "finished" : "stopped", (long long)j);
        dispatcher_end(r->disp, j, why);
    } else if (r->env->cfg->async_enable) { /* fully-async: a push every trigger_parameter_sync_step steps (the
                                             * model copy's peers give their parts); a checkpoint's hold ends */
        const int64_t T = r->env->cfg->async_trigger_parameter_sync_step;
        if (j > r->start && j % T == 0 && j < trainer_total_steps(r->t))
            publish(r, j);
        if (r->draining && (j % T == 0 || j == r->start)) {
            dispatcher_async_hold(r->disp, false);
            r->draining = false;
        }
    } else if (j > r->start && j + 1 + r->env->staleness <= trainer_total_steps(r->t)) {
        publish(r, j); /* version r->start went out at the start (trainer_ready) */
    }
    return 0;
}

void trainer_layout_of(const struct role_env *env, struct trainer_layout *lay)
{
    const bool split_model = env->at.tp_size > 1 || env->at.pp_size > 1;
    *lay = (struct trainer_layout){.dp = env->dp,
                                   .dp_rank = env->at.dp,
                                   .dp_size = env->at.dp_size,
                                   .tp = env->at.tp_size > 1 ? env->tp : NULL,
                                   .tp_rank = env->at.tp,
                                   .tp_size = env->at.tp_size,
                                   .pp = env->at.pp_size > 1 ? env->pp : NULL,
                                   .pp_rank = env->at.pp,
                                   .pp_size = env->at.pp_size,
                                   .mp = env->emp      ? env->emp
                                         : split_model ? env->mp
                                                       : NULL,
                                   .cp = env->cp,
                                   .cp_rank = env->at.cp,
                                   .cp_size = env->at.cp_size,
                                   .grads = env->grads,
                                   .ep = env->ep,
                                   .edp = env->edp,
                                   .etp = env->etp,
                                   .ep_rank = env->at.ep,
                                   .ep_size = env->at.ep_size,
                                   .all = env->trainers,
                                   .devices = comm_size(env->world),
                                   .device = env->device,
                                   .gpus_shared = env->trainer_gpus_shared};
}

/* Trainer hooks to the control plane (shared with the hybrid role in grpo_worker.c). */
struct trainer_ctl {
    struct control *ctl;
    struct trainer *t;
};

static void hook_phase(void *ctx, int64_t step, Grpo__Phase phase)
{
    (void)step;
    control_set_phase(((struct trainer_ctl *)ctx)->ctl, phase);
}

static void hook_step_done(void *ctx, int64_t step, int64_t total, const struct metrics *m)
{
    struct trainer_ctl *w = ctx;
    control_set_step(w->ctl, step, total);
    for (size_t i = 0; i < metrics_count(m); i++)
        control_set_metric(w->ctl, metrics_name(m, i), metrics_value(m, i));
    control_set_phase(w->ctl, GRPO__PHASE__PHASE_IDLE);
}

static void hook_waiting(void *ctx, bool done) { control_hold_while_waiting(((struct trainer_ctl *)ctx)->ctl, done); }

static void hook_checkpoint_saved(void *ctx, int64_t step, bool writer)
{
    struct control *c = ((struct trainer_ctl *)ctx)->ctl;
    if (writer)
        control_checkpoint_done(c, step);
    else /* a replica takes no requests itself: the writer's checkpoint answers every one it has heard of */
        control_checkpoint_held(c, step);
}

static int save_for_control(void *ud, int64_t step)
{
    (void)step;
    return trainer_save_checkpoint(((struct trainer_ctl *)ud)->t);
}

static int hook_safe_point(void *ctx, int64_t step)
{
    struct trainer_ctl *w = ctx;
    return control_safe_point(w->ctl, step, save_for_control, w) ? TRAINER_CONTINUE : TRAINER_STOP;
}

int run_trainer_process(struct role_env *env, const struct trainer_layout *lay, const struct trainer_source *src,
                        void (*on_created)(void *ud, struct trainer *t), void *ud)
{
    char err[2048];
    struct trainer_ctl w = {.ctl = env->ctl};
    struct trainer_hooks hooks = {.ctx = &w,
                                  .phase = hook_phase,
                                  .step_done = hook_step_done,
                                  .safe_point = hook_safe_point,
                                  .waiting = hook_waiting,
                                  .checkpoint_saved = hook_checkpoint_saved};
    struct trainer *t = trainer_create_dist(env->cfg, env->ctl ? &hooks : NULL, lay, src, err, sizeof err);
    if (!t) {
        log_error("worker", "%s", err);
        control_finish(env->ctl, CONTROL_END_FAILED, err);
        return 2;
    }
    w.t = t;
    if (on_created)
        on_created(ud, t);
    control_set_step(env->ctl, trainer_step(t), trainer_total_steps(t));
    int rc = trainer_run(t);
    bool finished = trainer_step(t) >= trainer_total_steps(t);
    log_info("worker", "peak resident memory of this rank: %.3f GB", proc_peak_rss_gb());
    if (rc == 0 && (!lay || lay->dp_rank == 0))
        log_info("worker", "run %s at step %lld; results in %s", finished ? "finished" : "stopped",
                 (long long)trainer_step(t), trainer_run_dir(t));
    const char *why = trainer_failure(t);
    control_finish(env->ctl, rc != 0 ? CONTROL_END_FAILED : (finished ? CONTROL_END_FINISHED : CONTROL_END_STOPPED),
                   rc != 0 ? (why && why[0] ? why : "training failed (see the worker's log)") : NULL);
    trainer_free(t);
    return rc == 0 ? 0 : 1;
}

/* Fully-async training, once the trainer exists: the stream (its state from the checkpoint resumed, the schedule
 * written or replayed) and the dispatcher's stream options. 0, or -1 with err. */
static int async_setup(struct trainer_rank *r, struct trainer *t, struct dispatch_options *o, char *err, size_t errlen)
{
    const struct grpo_config *c = r->env->cfg;
    const int T = (int)c->async_trigger_parameter_sync_step, U = r->lim.units, B = r->lim.groups_in_step;
    const int64_t max_required = (int64_t)((double)B * (1.0 + c->async_staleness_threshold) * T);
    const struct astream_options ao = {.push_every = T,
                                       .units = U,
                                       .unit_groups = B / U,
                                       .n = r->lim.n,
                                       .staleness_threshold = c->async_staleness_threshold,
                                       .max_required = max_required};
    r->as = astream_create(&ao);
    if (data_cursor_init(&r->acur, r->lim.prompts->n, B, c->data_shuffle, (uint64_t)c->data_seed, err, errlen) != 0)
        return -1;
    r->acur_open = true;
    if (c->async_replay_schedule[0] && astream_load_replay(r->as, c->async_replay_schedule, err, errlen) != 0)
        return -1;
    /* a checkpoint's stream: its units held and where the stream goes on; without one (a checkpoint of another
     * mode), the stream goes on after the chunks of the steps it holds */
    int64_t next = r->start * U;
    const char *from = trainer_resumed_from(t);
    if (from[0]) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", from, TRAINER_SOURCE_STATE_FILE);
        size_t len = 0;
        char *blob = access(path, F_OK) == 0 ? fs_read_all(path, (size_t)1 << 34, &len, err, errlen) : NULL;
        if (access(path, F_OK) == 0 && !blob)
            return error_set(err, errlen, "%s cannot be read", path);
        if (blob) {
            if (astream_restore(r->as, (const uint8_t *)blob, len, &r->lim, &next, err, errlen) != 0) {
                char why[1024];
                snprintf(why, sizeof why, "%s", err);
                free(blob);
                return error_set(err, errlen, "%s: %s", path, why);
            }
            free(blob);
            log_info("trainer", "fully-async stream resumed from %s: %d unit(s) held, next chunk %lld unit %lld", path,
                     astream_held(r->as), (long long)(next / U + 1), (long long)(next % U));
        } else {
            log_info("trainer", "%s has no %s: the stream starts after the chunks of its %lld steps", from,
                     TRAINER_SOURCE_STATE_FILE, (long long)r->start);
        }
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/async_schedule.jsonl", trainer_run_dir(t));
    if (astream_open_schedule(r->as, path, r->start, err, errlen) != 0)
        return -1;
    o->async = true;
    o->stream_next = next;
    o->unit_groups = B / U;
    o->max_groups = max_required;
    o->outstanding = (int64_t)astream_held(r->as) * (B / U);
    /* a replay grants each unit with its recorded first version: the dispatcher holds as many as a unit can be
     * behind the newest when its turn comes (verl's bound keeps that within ceil(staleness) + 2 pushes) */
    o->keep_versions = astream_replaying(r->as) ? (int)ceil(c->async_staleness_threshold) + 4 : 3;
    if (astream_replaying(r->as))
        o->replay = astream_replay_pending(r->as, &o->n_replay);
    log_info("trainer",
             "fully-async training: %d unit(s) of %d group(s) a chunk, a step takes %d; weights pushed every %d "
             "step(s); at most %lld prompts granted a push (staleness_threshold %g), units more than %g push(es) stale "
             "dropped; partial rollout %s%s%s",
             U, B / U, U, T, (long long)max_required, c->async_staleness_threshold, ceil(c->async_staleness_threshold),
             c->async_partial_rollout ? "on" : "off", astream_replaying(r->as) ? "; replaying " : "",
             astream_replaying(r->as) ? c->async_replay_schedule : "");
    return 0;
}

/* Once the trainer exists (its model loaded, any checkpoint resumed): DP rank 0 opens the dispatcher with the
 * weights and the data cursor to start from. */
static void trainer_ready(void *ud, struct trainer *t)
{
    struct trainer_rank *r = ud;
    r->t = t;
    r->start = trainer_step(t);
    r->lim.prompts = trainer_prompts(t);
    r->lim.vocab_size = trainer_policy(t)->cfg.vocab_size;
    wire_limits_set_routes(&r->lim, &trainer_policy(t)->cfg, config_records_routes(r->env->cfg));
    r->lim.reward_parts = config_gdpo_parts(r->env->cfg);
    if (r->env->at.cp != 0 || (r->env->at.dp != 0 && !copy_peer(r))) /* SP: SP rank 0 publishes the model */
        return;
    if (copy_peer(r)) { /* the dispatcher is the copy's rank 0's; this rank gives its part of each version */
        if (r->start < trainer_total_steps(t))
            publish(r, r->start);
        return;
    }
    int64_t epoch, cursor;
    trainer_cursor(t, &epoch, &cursor);
    struct dispatch_options o = {.endpoint = r->env->dispatch_endpoint,
                                 .run_key = r->env->have_run_key ? r->env->plane_run_key : NULL,
                                 .epoch = r->env->plane_epoch,
                                 .first_rollout_rank = r->env->spec.trainer_ranks,
                                 .rollout_tp = r->env->spec.rollout_tp > 1 ? r->env->spec.rollout_tp : 1,
                                 .units = r->lim.units,
                                 .groups_in_step = r->lim.groups_in_step,
                                 .staleness = r->env->staleness,
                                 .start = r->start,
                                 .total_steps = trainer_total_steps(t),
                                 .start_epoch = epoch,
                                 .start_cursor = cursor,
                                 /* with LoRA the whole adapter (under EP every expert's) */
                                 .n_floats = trainer_policy(t)->lora ? lora_whole_floats(trainer_policy(t))
                                                                     : model_whole_floats(&trainer_policy(t)->cfg),
                                 .lost_after_s = 2 * r->env->heartbeat_s};
    char err[1024];
    if (r->env->cfg->async_enable && async_setup(r, t, &o, err, sizeof err) != 0) {
        log_error("trainer", "%s", err);
        control_finish(r->env->ctl, CONTROL_END_FAILED, err);
        check_failf(__FILE__, __LINE__, "%s", err);
    }
    r->disp = dispatcher_open(&o, err, sizeof err);
    if (!r->disp) {
        log_error("trainer", "%s", err);
        control_finish(r->env->ctl, CONTROL_END_FAILED, err);
        check_failf(__FILE__, __LINE__, "%s", err); /* the other ranks wait for it: end the job */
    }
    r->ws =
        (struct weight_sync_sender){.disp = r->disp,
                                    .group = r->env->weight_group,
                                    .K = trainer_policy(t)->K,
                                    .gpus_shared = r->env->trainer_gpus_shared || r->env->rollout_gpus_shared,
                                    .bucket_bytes = (size_t)r->env->cfg->rollout_update_weights_bucket_megabytes << 20,
                                    .n_floats = o.n_floats,
                                    .phase = sync_phase,
                                    .ud = r};
    log_info("trainer", "dispatching %d work unit(s) per step at %s", r->lim.units, r->env->dispatch_endpoint);
    if (r->env->weight_group) {
        dispatcher_broadcast_on(r->disp, DISPATCH_RENDEZVOUS_S);
        log_info("trainer",
                 "policy versions go to the %d rollout process(es) of the launch in a broadcast "
                 "(" KEY_rollout_weight_sync "=broadcast)",
                 comm_size(r->env->weight_group) - 1);
    }
    if (r->start < trainer_total_steps(t))
        publish(r, r->start);
    else
        dispatcher_end(r->disp, r->start, "the run has trained every step already");
}

int run_trainer(struct role_env *env)
{
    const struct grpo_config *c = env->cfg;
    char err[1024];
    const bool split_model = env->at.tp_size > 1 || env->at.pp_size > 1;
    /* the ranks that hold a DP rank's batches: its model copy (TP x PP), its sequence-parallel group, or both */
    struct trainer_rank r = {.env = env,
                             .mp = env->replica          ? env->replica
                                   : split_model         ? env->mp
                                   : env->at.cp_size > 1 ? env->cp
                                                         : NULL};
    r.lim =
        (struct wire_limits){.max_response_length = (int)c->data_max_response_length,
                             .groups_in_step = (int)c->data_train_batch_size,
                             .n = (int)c->rollout_n,
                             /* a work unit per rollout TP group (per rollout rank without rollout TP) */
                             .units = env->spec.rollout_ranks / (env->spec.rollout_tp > 1 ? env->spec.rollout_tp : 1),
                             .world_size = env->world_size,
                             .dp_rank = env->at.dp};
    r.published = -1;
    if (c->async_enable) { /* what fully-async training runs with (the configuration refused the rest by name) */
        r.lim.async = true;
        if (r.lim.units < 1 || r.lim.groups_in_step % r.lim.units != 0) {
            snprintf(
                err, sizeof err,
                "fully-async training (async_training.*) with a stream chunk (" KEY_data_train_batch_size
                " prompts) that does not cut into one equal work unit per rollout rank: not available yet (%d trainer "
                "rank(s), %d rollout rank(s), %d prompts a step)",
                env->spec.trainer_ranks, r.lim.units, r.lim.groups_in_step);
            log_error("trainer", "%s", err);
            control_finish(env->ctl, CONTROL_END_FAILED, err);
            return 2;
        }
    }
    plane_verifier_init(&r.verifier, env->have_run_key ? env->plane_run_key : NULL, env->plane_epoch);
    r.auth.v = &r.verifier;
    r.lim.auth = &r.auth;     /* every batch from a rollout process: a good MAC of the rank it names */
    if (!env->have_run_key) { /* the launch hands every trainer one: never a data plane that checks nothing */
        snprintf(err, sizeof err,
                 "trainer rank %d has no data-plane run key (from grpod's Assignment.plane_run_key, or world rank 0 "
                 "at launch): refusing to open the data plane at %s unauthenticated",
                 env->rank, env->endpoints[env->at.dp]);
        log_error("trainer", "%s", err);
        control_finish(env->ctl, CONTROL_END_FAILED, err);
        plane_verifier_free(&r.verifier);
        return 2;
    }
    /* bind before anything slow, so the rollout ranks' first batches find the socket (TP, PP and SP rank 0 of each
     * DP rank pulls; it shares each batch with its peers) */
    if (env->at.tp == 0 && env->at.pp == 0 && env->at.cp == 0) {
        r.pull = dataplane_pull_open(env->endpoints[env->at.dp], err, sizeof err);
        if (!r.pull) {
            log_error("trainer", "%s", err);
            control_finish(env->ctl, CONTROL_END_FAILED, err);
            return 2;
        }
        log_info("trainer", "DP rank %d of %d: pulling rollouts at %s", env->at.dp, env->at.dp_size,
                 env->endpoints[env->at.dp]);
    }
    struct trainer_layout lay;
    trainer_layout_of(env, &lay);
    struct trainer_source src = {.ctx = &r, .next_batch = next_batch, .between_steps = between_steps};
    if (c->async_enable) {
        src.push_every = (int)c->async_trigger_parameter_sync_step;
        src.checkpoint_state = async_checkpoint_state;
    }
    int status = run_trainer_process(env, &lay, &src, trainer_ready, &r);
    if (r.refused || r.duplicates || r.stale || r.drop_not_granted || r.drop_prompt)
        log_info("dataplane",
                 "DP rank %d: %" PRIu64 " batch(es) refused, %" PRIu64 " duplicate(s), %" PRIu64
                 " stale; dropped: %" PRIu64 " malformed or out of range, %" PRIu64 " for a later step, %" PRIu64
                 " not granted to their sender, %" PRIu64 " with other prompts than their step's",
                 env->at.dp, r.refused, r.duplicates, r.stale, r.drop_invalid, r.drop_future, r.drop_not_granted,
                 r.drop_prompt);
    if (r.disp) { /* the rollout processes hear the end (their pings are answered "end") before it goes */
        dispatcher_end(r.disp, r.start, status == 0 ? "the trainers ended" : "the trainers failed");
        /* (a rollout rank never heard from is waited for as long as a rollout rank waits for an absent dispatcher
         * before it gives the trainers up: rollout_role.c, a minute) */
        dispatcher_close(r.disp, 3 * env->heartbeat_s + 2, 60);
    }
    for (int i = 0; i < r.n_pend; i++) {
        step_batch_free(&r.pend[i].b);
        free(r.pend[i].raw);
    }
    free(r.pend);
    astream_free(r.as);
    if (r.acur_open)
        data_cursor_free(&r.acur);
    free(r.chunk_uids), free(r.chunk_at);
    if (r.pull)
        dataplane_pull_close(r.pull);
    plane_verifier_free(&r.verifier);
    weight_sync_sender_release(&r.ws);
    return status;
}
