/* The split source and the trainer role of a split run: each step's groups arrive from the rollout ranks over the
 * data plane, one batch per work unit (split_receive.c; fully-async training's stream, split_async.c); the update
 * runs on the trainer ranks (the trainer library, worker/trainer/, run by trainer_process.c); DP rank 0 runs the
 * dispatcher (worker/plane/dispatch.h) that grants the units and serves each new policy version. */
#include "split_internal.h"
#include "worker/survive/survive.h"

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

/* The data plane's counters into the step's figures (the socket's refusals and drops, and the dispatcher's when
 * this rank runs it), and the weight sync's time since the last step. */
void split_plane_counters(struct trainer_rank *r)
{
    r->fig.update_weights_s = r->sync_s_pending;
    r->fig.refused = r->refused;
    r->fig.old_epoch = r->old_epoch;
    r->fig.duplicates = r->duplicates + r->stale;
    r->fig.drop_invalid = r->drop_invalid;
    r->fig.drop_future = r->drop_future;
    r->fig.drop_not_granted = r->drop_not_granted;
    r->fig.drop_prompt = r->drop_prompt;
    if (r->disp) {
        struct dispatch_stats ds;
        dispatcher_stats(r->disp, &ds);
        r->fig.dispatched = true;
        r->fig.live_processes = ds.live;
        r->fig.lost_processes = ds.lost;
        r->fig.units_regranted = ds.regranted;
        r->fig.weight_bytes = ds.bytes - r->bytes_reported;
        r->fig.dispatch_refused = ds.refused;
        r->fig.dispatch_old_epoch = ds.old_epoch;
        r->fig.dispatch_oversized = ds.oversized;
        r->fig.dispatch_superseded = ds.superseded;
        r->fig.dispatch_rate_limited = ds.rate_limited;
        r->fig.replaced_processes = ds.replaced;
        r->bytes_reported = ds.bytes;
    }
    r->sync_s_pending = 0;
}

/* Sequences in the step's order. */
static int by_gidx(const void *a, const void *b)
{
    const struct rollout_seq *x = a, *y = b;
    return (x->gidx > y->gidx) - (x->gidx < y->gidx);
}

static void publish(struct trainer_rank *r, int64_t version);
/* The floats of a policy version as the dispatcher serves it: with LoRA the whole adapter (under EP every
 * expert's), else the whole model's weights. */
static size_t version_floats(struct trainer *t)
{
    return trainer_policy(t)->lora ? lora_whole_floats(trainer_policy(t)) : model_whole_floats(&trainer_policy(t)->cfg);
}
static int open_dispatcher(struct trainer_rank *r, struct trainer *t, const char *endpoint, int64_t floor, char *err,
                           size_t errlen);

/* Trainer-loss survival: the lead of this split run was lost and this rank is DP rank 0 of the survivors. It takes
 * the lead at step k's redo, from the step's start (version k - 1): it pulls the rollouts' whole units at its own
 * data endpoint and runs the dispatcher at its lead endpoint (placement_lead_endpoint), where every rollout process
 * is connected already (work_client_also, dataplane_push_open_any), and grants step k's units anew: a unit's groups
 * come out the same whoever generates them, and nothing the lost lead had was trained. One-step-off step k is
 * generated with version k - 2: the weights at step k - 1's start, which this rank kept (survive_step_start), go
 * out first, and the dispatcher takes them as its oldest version (dispatch_options.version_floor). 0, or -1
 * (logged). */
static int take_lead(struct trainer_rank *r, int64_t k)
{
    char err[1024], ep[512];
    const char *data_ep = r->env->endpoints[r->launch_dp];
    const int64_t floor = k - 1 - r->env->staleness > r->run_start ? k - 1 - r->env->staleness : r->run_start;
    /* with TP or PP the whole model copy takes the lead: its rank 0 the sockets, every rank its part of each version
     * (the kept one assembled from the parts' host copies: on the CPU only, launch refuses it on GPUs) */
    const struct model *p = trainer_policy(r->t);
    const bool sharded = p->sh.tp_size * p->sh.pp_size > 1, head = split_is_lead(r);
    size_t n = 0, want = 0;
    const float *older = floor < k - 1 ? survive_step_start(r->survive, floor + 1, &n) : NULL;
    trainer_params(r->t, &want);
    int bad = !(floor >= k - 1 || (older && n == (sharded ? want : version_floats(r->t))));
    if (sharded && r->env->mp)
        comm_allreduce_max(r->env->mp, &bad, 1, COMM_I32); /* every rank of the copy, or none, goes on */
    if (bad) {
        log_error("trainer",
                  "step %lld: taking the lead of the split run after the lead's loss: policy version %lld (the "
                  "weights at step %lld's start, which one-step-off step %lld is generated with) is no longer kept "
                  "here",
                  (long long)k, (long long)floor, (long long)floor + 1, (long long)k);
        return -1;
    }
    r->lead_copy = true;
    r->start = k - 1;
    r->lim.dp_rank = r->env->at.dp; /* the rollout ranks send whole units to "DP rank 0", which this rank is now */
    if (head) {
        r->pull = dataplane_pull_open(data_ep, err, sizeof err);
        placement_lead_endpoint(data_ep, ep, sizeof ep);
        if (!r->pull || open_dispatcher(r, r->t, ep, floor, err, sizeof err) != 0) {
            log_error("trainer", "step %lld: taking the lead of the split run after the lead's loss: %s", (long long)k,
                      err);
            return -1;
        }
    }
    if (older && sharded) { /* the kept version's parts, assembled at the copy's rank 0 */
        float *whole = head ? xmalloc(version_floats(r->t) * sizeof(float)) : NULL;
        model_shard_gather(p, older, whole, 0);
        if (head)
            dispatcher_publish(r->disp, floor, whole);
        free(whole);
    } else if (older) {
        dispatcher_publish(r->disp, floor, older);
    }
    publish(r, r->start);
    if (!head)
        return 0;
    log_info("trainer",
             "step %lld: this rank (launch DP rank %d) leads the split run now: pulling rollouts at %s; the step's "
             "%d work unit(s) granted anew%s",
             (long long)k, r->launch_dp, data_ep, r->lim.units,
             older ? " (one-step-off: with the policy version kept from the step before)" : "");
    return 0;
}

/* trainer_source.next_batch: step k's batches from every rollout rank, merged in the step's order. */
static int next_batch(void *ctx, int64_t k, struct step_batch *b, struct step_timing *tm)
{
    struct trainer_rank *r = ctx;
    r->fig = (struct split_figures){0};
    if (r->env->cfg->async_enable)
        return split_async_next_batch(r, k, b, tm);
    if (r->whole && r->env->at.dp == 0 && !r->lead_copy && take_lead(r, k) != 0)
        return -1;
    const int R = r->lim.units, B = r->lim.groups_in_step;
    int *uids = xmalloc((size_t)B * sizeof(int));
    trainer_advance_cursor(r->t, uids); /* the checkpoint's cursor moves with the rollout ranks' */
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
    const double t0 = clock_now_s();
    double last_note = t0;
    r->cur_uids = uids, r->cur_k = k;
    /* the model copy's rank 0 pulls, the others get the batches from it; under trainer.survive_trainer_loss the
     * lead alone pulls, and a step redone after a loss has its units already (split_survive.c) */
    for (; r->pull && !split_kept_step(r, k);) {
        split_drop_other_prompts(r, k, uids);
        if (split_units_held(r, k) >= R)
            break;
        /* on-policy the rollout processes ask for the version of this step while it waits */
        r->sync_s_pending += weight_sync_serve_round(&r->ws);
        if (split_receive_one(r, k, r->disp && r->env->weight_group ? 20 : 200) < 0) {
            free(uids);
            return -1;
        }
        /* the rollout ranks hold at their safe points while the run is to pause: so does this wait */
        control_hold_while_waiting(r->env->ctl, false);
        if (clock_now_s() - last_note > 60) {
            log_warn("trainer", "step %lld: %d of %d work units after %.0fs; still waiting", (long long)k,
                     split_units_held(r, k), R, clock_now_s() - t0);
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
    if (r->whole ? split_whole_step(r, k) != 0 : r->pull && r->env->at.dp_size > 1 && split_choose_senders(r, k) != 0) {
        free(uids);
        return -1;
    }
    if (r->pull)
        control_hold_while_waiting(r->env->ctl, true);
    if (r->mp && !r->whole && split_share_step(r, k) != 0) { /* whole: every rank has its share already */
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
        if (p->h.idle_s >= r->fig.rollout_idle) {
            r->fig.rollout_idle = p->h.idle_s;
            r->fig.rollout_wait_weights = p->h.wait_weights_s;
        }
        r->fig.rollout_peak_rss_gb = fmax(r->fig.rollout_peak_rss_gb, p->h.peak_rss_gb);
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
    r->fig.staleness = staleness;
    split_plane_counters(r);
    return 0;
}

/* The data and weight planes of the step (the dispatcher's figures on its rank). */
static void plane_metrics(struct metrics *m, const struct split_figures *f)
{
    metrics_set(m, "training/staleness", (double)f->staleness);
    metrics_set(m, "timing_s/update_weights", f->update_weights_s);
    metrics_set(m, "dataplane/refused", (double)(f->refused + (uint64_t)f->dispatch_refused));
    metrics_set(m, "dataplane/refused_old_epoch", (double)(f->old_epoch + (uint64_t)f->dispatch_old_epoch));
    metrics_set(m, "dataplane/duplicates", (double)f->duplicates);
    metrics_set(m, "dataplane/dropped_batches",
                (double)(f->drop_invalid + f->drop_future + f->drop_not_granted + f->drop_prompt));
    metrics_set(m, "dataplane/dropped/invalid", (double)f->drop_invalid);
    metrics_set(m, "dataplane/dropped/future_step", (double)f->drop_future);
    metrics_set(m, "dataplane/dropped/not_granted", (double)f->drop_not_granted);
    metrics_set(m, "dataplane/dropped/other_prompts", (double)f->drop_prompt);
    if (f->dispatched) {
        metrics_set(m, "rollouter/live_processes", (double)f->live_processes);
        metrics_set(m, "rollouter/lost_processes", (double)f->lost_processes);
        metrics_set(m, "rollouter/units_regranted", (double)f->units_regranted);
        metrics_set(m, "rollouter/replaced_processes", (double)f->replaced_processes);
        metrics_set(m, "dataplane/refused_size", (double)f->dispatch_oversized);
        metrics_set(m, "dataplane/refused_superseded", (double)f->dispatch_superseded);
        metrics_set(m, "dataplane/rate_limited", (double)f->dispatch_rate_limited);
        metrics_set(m, "perf/update_weights_bytes", (double)f->weight_bytes);
    }
}

/* Fully-async training: verl's fully_async/ names, and verl v1's training/off_policy/ staleness. */
static void fully_async_metrics(struct metrics *m, const struct split_figures *f, const struct step_timing *tm,
                                double step_s)
{
    const struct fully_async_stats *a = &f->fa;
    metrics_set(m, "fully_async/count/current_param_version", (double)a->current_param_version);
    metrics_set(m, "fully_async/count/total_generated_samples", (double)a->total_generated_samples);
    metrics_set(m, "fully_async/count/stale_samples_processed", (double)a->stale_samples_processed);
    metrics_set(m, "fully_async/count/stale_trajectory_processed", (double)a->stale_trajectory_processed);
    metrics_set(m, "fully_async/count/dropped_stale_samples", (double)a->dropped_stale_samples);
    metrics_set(m, "fully_async/count/buffered_samples", (double)a->buffered_samples);
    metrics_set(m, "fully_async/partial/total_partial_num", (double)a->total_partial_num);
    metrics_set(m, "fully_async/partial/partial_ratio", a->partial_ratio);
    metrics_set(m, "fully_async/partial/max_partial_span", (double)a->max_partial_span);
    metrics_set(m, "fully_async/total_wait_time", a->total_wait_time);
    metrics_set(m, "fully_async/trainer/idle_ratio", step_s > 0 ? tm->wait_data / step_s : 0);
    const double busy = tm->gen + tm->reward;
    metrics_set(m, "fully_async/rollouter/idle_ratio",
                busy + f->rollout_idle > 0 ? f->rollout_idle / (busy + f->rollout_idle) : 0);
    metrics_set(m, "fully_async/static/required_samples", (double)a->required_samples);
    metrics_set(m, "fully_async/static/max_required_samples", (double)a->max_required_samples);
    metrics_set(m, "fully_async/static/staleness_threshold", a->staleness_threshold);
    metrics_set(m, "training/off_policy/trajectory_staleness/mean", a->staleness_mean);
    metrics_set(m, "training/off_policy/trajectory_staleness/max", a->staleness_max);
    metrics_set(m, "training/off_policy/trajectory_staleness/min", a->staleness_min);
    metrics_set(m, "training/off_policy/trajectory_staleness_worst/mean", a->worst_mean);
    metrics_set(m, "training/off_policy/trajectory_staleness_worst/max", a->worst_max);
    metrics_set(m, "training/off_policy/trajectory_staleness_worst/min", a->worst_min);
    metrics_set(m, "training/off_policy/trajectory_spans/mean", a->spans_mean);
    metrics_set(m, "training/off_policy/trajectory_spans/max", a->spans_max);
    metrics_set(m, "training/off_policy/trajectory_spans/min", a->spans_min);
}

/* trainer_source.metrics: the planes' (and fully-async training's) first; late, after the trainer's waiting, the
 * rollout ranks'. */
static void split_metrics(void *ctx, enum source_metrics_at at, const struct step_timing *tm, double step_s,
                          struct metrics *m)
{
    const struct split_figures *f = &((const struct trainer_rank *)ctx)->fig;
    if (at == SOURCE_METRICS_FIRST) {
        plane_metrics(m, f);
        if (f->fully_async)
            fully_async_metrics(m, f, tm, step_s);
        return;
    }
    const double busy = tm->gen + tm->reward;
    metrics_set(m, "perf/cpu_memory_peak_gb/rollout", f->rollout_peak_rss_gb);
    metrics_set(m, "timing_s/rollout_wait_weights", f->rollout_wait_weights);
    metrics_set(m, "timing_s/rollout_wait_send", f->rollout_idle - f->rollout_wait_weights);
    metrics_set(m, "rollouter/idle_ratio", busy + f->rollout_idle > 0 ? f->rollout_idle / (busy + f->rollout_idle) : 0);
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
    if (r->whole && !r->lead_copy) /* a copy that is DP rank 0 since a loss publishes when it takes the lead (at the
                                    * redone step's batch: take_lead), not before */
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

/* Once the trainer exists (its model loaded, any checkpoint resumed): DP rank 0 opens the dispatcher with the
 * weights and the data cursor to start from. */
static void trainer_ready(void *ud, struct trainer *t)
{
    struct trainer_rank *r = ud;
    r->t = t;
    if (r->survive)
        survive_attach(r->survive, t);
    r->start = r->run_start = trainer_step(t);
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
    char err[1024];
    if (open_dispatcher(r, t, r->env->dispatch_endpoint, r->start, err, sizeof err) != 0) {
        log_error("trainer", "%s", err);
        control_finish(r->env->ctl, CONTROL_END_FAILED, err);
        check_failf(__FILE__, __LINE__, "%s", err); /* the other ranks wait for it: end the job */
    }
    if (r->start < trainer_total_steps(t))
        publish(r, r->start);
    else
        dispatcher_end(r->disp, r->start, "the run has trained every step already");
}

/* Open the dispatcher at endpoint, from the trainer's step r->start and its data cursor (DP rank 0 at the start, or
 * the survivor that takes the lead of a split run whose lead was lost), floor the oldest policy version a step is
 * generated with (r->start, but where a survivor takes over one-step-off); the weight sender goes through it. 0, or
 * -1 with err. */
static int open_dispatcher(struct trainer_rank *r, struct trainer *t, const char *endpoint, int64_t floor, char *err,
                           size_t errlen)
{
    int64_t epoch, cursor;
    trainer_cursor(t, &epoch, &cursor);
    struct dispatch_options o = {.endpoint = endpoint,
                                 .version_floor_set = true,
                                 .version_floor = floor,
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
                                 .n_floats = version_floats(t),
                                 .lost_after_s = 2 * r->env->heartbeat_s,
                                 .relay_fanout = (int)r->env->cfg->rollout_weight_relay_fanout};
    if (r->env->cfg->async_enable && split_async_setup(r, t, &o, err, errlen) != 0)
        return -1;
    r->disp = dispatcher_open(&o, err, errlen);
    if (!r->disp)
        return -1;
    r->ws =
        (struct weight_sync_sender){.disp = r->disp,
                                    .group = r->env->weight_group,
                                    .K = trainer_policy(t)->K,
                                    .gpus_shared = r->env->trainer_gpus_shared || r->env->rollout_gpus_shared,
                                    .bucket_bytes = (size_t)r->env->cfg->rollout_update_weights_bucket_megabytes << 20,
                                    .n_floats = o.n_floats,
                                    .phase = sync_phase,
                                    .ud = r};
    log_info("trainer", "dispatching %d work unit(s) per step at %s", r->lim.units, endpoint);
    if (o.relay_fanout > 0)
        log_info("trainer",
                 "policy versions go through the weight relay tree of fan-out %d (" KEY_rollout_weight_relay_fanout
                 "): about %d copies of each from here",
                 o.relay_fanout, o.relay_fanout < r->lim.units ? o.relay_fanout : r->lim.units);
    if (r->env->weight_group) {
        dispatcher_broadcast_on(r->disp, DISPATCH_RENDEZVOUS_S);
        log_info("trainer",
                 "policy versions go to the %d rollout process(es) of the launch in a broadcast "
                 "(" KEY_rollout_weight_sync "=broadcast)",
                 comm_size(r->env->weight_group) - 1);
    }
    return 0;
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
    r.launch_dp = env->at.dp;
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
    plane_verifier_capacity(&r.verifier, 2 * env->world_size + 16); /* every rank and a replacement of each */
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
    r.survive = split_survive_create(&r);
    if (env->at.tp == 0 && env->at.pp == 0 && env->at.cp == 0 && (!r.whole || env->at.dp == 0)) {
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
    struct trainer_source src = {
        .ctx = &r, .next_batch = next_batch, .between_steps = between_steps, .metrics = split_metrics};
    if (c->async_enable) {
        src.push_every = (int)c->async_trigger_parameter_sync_step;
        src.checkpoint_state = split_async_checkpoint_state;
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
        /* a rollout rank never heard from (still loading, or stopped) is waited for without grpod as long as a
         * rollout rank waits for an absent dispatcher before it gives the trainers up (rollout_role.c, a minute).
         * Under grpod it is not: such a rank hears the run's end from grpod, and waiting kept this trainer from
         * MPI_Finalize until its peers' grace ran out and they ended the job over it (a rank frozen while the
         * run was paused at its start was woken into a job already ending, not into a finished run) */
        dispatcher_close(r.disp, 3 * env->heartbeat_s + 2, env->ctl ? 0 : 60);
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
    survive_free(r.survive);
    free(r.kept[0]), free(r.kept[1]);
    return status;
}
