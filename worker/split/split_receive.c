/* The split source's receive side of the data plane: batches off this DP rank's socket, checked (granted to
 * their sender, for a step in the window, holding the prompts their step draws) and de-duplicated into the pending
 * list; shared with the model copy's other ranks; the DP ranks agreeing on whose copy of each unit counts. */
#include "split_internal.h"

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

void split_drop_refused(struct trainer_rank *r, const char *why)
{
    r->refused++;
    log_dropped(r, "refused a batch on the data socket", why);
}

/* The rollout rank (the dispatcher's slot) of world rank `from`, or -1 when it is no rollout rank's sender. */
int split_slot_of(const struct trainer_rank *r, int from)
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

void split_keep_pending(struct trainer_rank *r, const struct pending *p)
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
int split_receive_batch(struct trainer_rank *r, int timeout_ms, struct pending *p, int *rc, void **buf, size_t *len,
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

int split_receive_one(struct trainer_rank *r, int64_t k, int timeout_ms)
{
    char err[1024];
    struct pending p;
    void *buf;
    size_t len;
    int rc = 0;
    int got = split_receive_batch(r, timeout_ms, &p, &rc, &buf, &len, err, sizeof err);
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
        const int slot = split_slot_of(r, p.h.from_rank);
        if (slot < 0 || (r->disp && !dispatcher_granted(r->disp, p.h.step, p.h.unit, slot))) {
            snprintf(err, sizeof err, "step %lld unit %d was not granted to rank %d%s", (long long)p.h.step, p.h.unit,
                     p.h.from_rank, slot < 0 ? " (not a rollout rank's sender)" : "'s process");
            step_batch_free(&p.b);
            rc = -1;
            reason = &r->drop_not_granted;
        }
    }
    if (rc == 0 && r->mp) {
        p.raw = xcalloc((len + 3) / 4 * 4, 1); /* split_share_step broadcasts it in whole 32-bit words */
        memcpy(p.raw, buf, len);
        p.raw_len = len;
    }
    dataplane_msg_free(buf);
    /* the acknowledgement, or the refusal with its reason, authenticated for a sender whose MAC was good */
    dataplane_answer(r->pull, rc == 0, err, &r->auth);
    if (rc != 0) {
        (*reason)++;
        r->old_epoch += r->auth.old_epoch;
        split_drop_refused(r, err);
        return 0;
    }
    /* the first copy of each (step, unit) counts: a unit granted again after its process was lost comes out the
     * same, and a second copy of it is dropped. The dispatcher's rank keeps only granted copies; the other DP ranks
     * cannot tell, so they keep one copy of each unit per rollout rank's sender (at most one per unit of a step:
     * the real one always finds room) until DP rank 0 says whose counts (split_choose_senders) */
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
    split_keep_pending(r, &p);
    return 1;
}

uint8_t *split_pad_words(uint8_t *msg, size_t len)
{
    const size_t words = (len + 3) / 4;
    msg = xrealloc(msg, words * 4 + 4);
    memset(msg + len, 0, words * 4 + 4 - len);
    return msg;
}

uint8_t *split_share_msg(struct trainer_rank *r, uint8_t *msg, int64_t *n)
{
    struct comm *all = r->env->trainers;
    const bool root = comm_rank(all) == 0;
    comm_broadcast_polled(all, n, 1, COMM_I64, 0, root ? NULL : split_hold_while_waiting, r);
    if (*n < 0 || (uint64_t)*n > ((uint64_t)1 << 34))
        return NULL;
    if (!root)
        msg = xcalloc(((size_t)*n + 3) / 4 * 4 + 4, 1);
    comm_broadcast(all, msg, ((size_t)*n + 3) / 4, COMM_I32, 0);
    return msg;
}

bool split_packs_shared_prompts(const struct trainer_rank *r)
{
    return r->env->cfg->actor_shared_prompt_packing && strcmp(config_device(r->env->cfg), "cpu") == 0;
}

void split_hold_while_waiting(void *ud, bool done)
{
    struct trainer_rank *r = ud;
    control_hold_while_waiting(r->env->ctl, done);
}

/* Under TP or PP: rank 0 of the model copy (TP rank 0, the first stage) sends the step's messages (as they came
 * over the data plane) to the other ranks of the copy, which unpack them with the same checks into their own
 * pending list. 0, or -1 (a peer could not unpack one). */
int split_share_step(struct trainer_rank *r, int64_t k)
{
    const bool root = comm_rank(r->mp) == 0;
    int64_t count = 0;
    for (int i = 0; root && i < r->n_pend; i++)
        count += r->pend[i].h.step == k;
    comm_broadcast_polled(r->mp, &count, 1, COMM_I64, 0, root ? NULL : split_hold_while_waiting, r);
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
        split_keep_pending(r, &q);
    }
    return 0;
}

/* Distinct units of step k held. */
int split_units_held(const struct trainer_rank *r, int64_t k)
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
        const int slot = split_slot_of(r, p->h.from_rank);
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
        split_receive_one(pw->r, pw->k, 10);
    control_hold_while_waiting(pw->r->env->ctl, false);
}

/* Every DP rank trains step k on the same senders' copies: DP rank 0 (the dispatcher's, which kept only copies from
 * processes the unit was granted to) says whose copy of each unit it kept and to whom each unit was granted; the
 * other DP ranks keep that sender's copy, drop the rest and wait for any still missing. 0, or -1 on a socket error. */
int split_choose_senders(struct trainer_rank *r, int64_t k)
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
            if (split_receive_one(r, k, 200) < 0) {
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
void split_drop_other_prompts(struct trainer_rank *r, int64_t k, const int *uids)
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
