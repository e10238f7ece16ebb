/* The split source under fully-async training (docs/training.md): units in the order they come to trainer rank 0,
 * into its stream (async_stream.c), taken a step at a time and sent to the other trainer ranks; the stream drained
 * for a checkpoint; the stream set up once the trainer exists. */
#include "split_internal.h"

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
    int got = split_receive_batch(r, timeout_ms, &p, &rc, &buf, &len, err, sizeof err);
    if (got <= 0)
        return got;
    dataplane_msg_free(buf);
    uint64_t *reason = &r->drop_invalid;
    if (rc == 0 && p.h.step > r->chunks_drawn + 1000000) {
        snprintf(err, sizeof err, "chunk %lld is far past the stream", (long long)p.h.step);
        rc = -1, reason = &r->drop_future;
    }
    if (rc == 0) {
        const int slot = split_slot_of(r, p.h.from_rank);
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
        split_drop_refused(r, err);
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

/* Fully-async training with more than one trainer rank: trainer rank 0 (the stream's) sends the units step k took
 * to the others in one broadcast over the trainers (s NULL: its stream failed, and they fail with it). */
static void send_units(struct trainer_rank *r, const struct astream_step *s)
{
    struct comm *all = r->env->trainers;
    if (!all || comm_size(all) < 2)
        return;
    size_t len = 0;
    uint8_t *msg = s ? astream_step_pack(s, &len) : NULL;
    if (msg)
        msg = split_pad_words(msg, len);
    int64_t n = s ? (int64_t)len : -1;
    split_share_msg(r, msg, &n);
    free(msg);
}

/* The other trainer ranks: the units step k took, from trainer rank 0 (waited for as for data, holding for a pause
 * meanwhile). 0, or -1 (rank 0's stream failed, or its message does not unpack here). */
static int receive_units(struct trainer_rank *r, int64_t k, struct astream_step *s)
{
    int64_t n = 0;
    uint8_t *msg = split_share_msg(r, NULL, &n);
    if (!msg) {
        log_error("trainer", "step %lld: trainer rank 0's stream failed (see its log; its message's length: %lld)",
                  (long long)k, (long long)n);
        return -1;
    }
    char err[1024];
    const int rc = astream_step_unpack(msg, (size_t)n, &r->lim, s, err, sizeof err);
    free(msg);
    if (rc != 0)
        log_error("trainer", "step %lld: %s", (long long)k, err);
    return rc;
}

/* Step k's units at trainer rank 0, from the stream: in the order they came (a replay: its schedule's), the stale
 * ones dropped. 0, or -1. */
static int async_take_units(struct trainer_rank *r, int64_t k, struct astream_step *s)
{
    const double t0 = clock_now_s();
    double last_note = t0;
    char err[1024];
    for (;;) {
        int taken, dropped;
        const int got = astream_take(r->as, k, s, &r->fig.fa, &taken, &dropped, err, sizeof err);
        if (taken || dropped)
            dispatcher_async_taken(r->disp, taken, false);
        if (dropped) /* one more is granted in its place */
            dispatcher_async_taken(r->disp, dropped, true);
        if (got < 0) {
            log_error("trainer", "%s", err);
            return -1;
        }
        if (got > 0) {
            /* the step's units came in (some were in flight when the run was asked to pause): while the pause
             * lasts the step waits here, held, as at a safe point (it went on, and trained a step while grpod said
             * every rank had paused) */
            while (control_pause_wanted(r->env->ctl))
                control_hold_while_waiting(r->env->ctl, false);
            return 0;
        }
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
    r->fig.fa.total_wait_time = tm->wait_data;
    const double U = r->lim.units;
    tm->gen = r->a_gen / U, tm->reward = r->a_reward / U, r->fig.rollout_idle = r->a_idle / U;
    r->fig.rollout_wait_weights = r->a_wait_weights / U, r->fig.rollout_peak_rss_gb = r->a_peak_rss;
    r->a_gen = r->a_reward = r->a_idle = r->a_wait_weights = 0;
    r->fig.staleness = (int64_t)r->fig.fa.staleness_max;
    split_plane_counters(r);
    if (r->chunks_drawn > 0)
        trainer_set_cursor(r->t, r->acur.epoch, r->acur.index);
}

/* Step k's batch, fully-async: trainer rank 0 takes the step's units from its stream and sends them to the other
 * trainer ranks; every rank trains its DP rank's share of them (the TP, PP and SP ranks of a DP rank the same). */
int split_async_next_batch(struct trainer_rank *r, int64_t k, struct step_batch *b, struct step_timing *tm)
{
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
    const double t0 = clock_now_s();
    struct astream_step s = {0};
    if (r->as) {
        const int rc = async_take_units(r, k, &s);
        send_units(r, rc == 0 ? &s : NULL);
        if (rc != 0)
            return -1;
    } else if (receive_units(r, k, &s) != 0) {
        return -1;
    }
    control_hold_while_waiting(r->env->ctl, true);
    tm->wait_data = clock_now_s() - t0;
    tm->split = true;
    r->fig.fully_async = true;
    astream_step_batch(&s, r->lim.n, r->env->at.dp, r->env->at.dp_size, split_packs_shared_prompts(r), b);
    if (r->as)
        async_figures(r, tm);
    return 0;
}

/* trainer_source.checkpoint_state: the stream drained (no new grants; the units in flight finish with the weights
 * they have and come in), then the units held, the counters and the stream's next unit; the data cursor is the
 * stream's. The hold lasts to the next push. */
int split_async_checkpoint_state(void *ctx, int64_t step, uint8_t **blob, size_t *len)
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

/* Fully-async training, once the trainer exists: the stream (its state from the checkpoint resumed, the schedule
 * written or replayed) and the dispatcher's stream options. 0, or -1 with err. */
int split_async_setup(struct trainer_rank *r, struct trainer *t, struct dispatch_options *o, char *err, size_t errlen)
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
