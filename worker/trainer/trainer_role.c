/* The trainer role: each step's groups arrive from the rollout ranks over the
 * data plane; the update runs data-parallel over the trainer ranks; DP rank 0
 * sends the new weights to the rollout ranks. The run loop is trainer.c's, the step trainer_step.c's. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
#include "common/log.h"
#include "prompts.h"
#include "trainer.h"
#include "worker/comm/weight_sync.h"
#include "worker/metrics/metrics.h"
#include "worker/model/model.h"
#include "worker/roles.h"
#include "worker/rollout/batch.h"
#include "worker/rollout/dataplane.h"
#include "worker/rollout/wire.h"

/* A batch that arrived before its step (one-step-off: the rollout runs ahead). */
struct pending {
    struct wire_header h;
    struct step_batch b;
};

struct trainer_rank {
    struct role_env *env;
    struct trainer *t;
    struct dataplane_pull *pull;
    struct wire_limits lim;
    struct pending *pend;
    int n_pend, cap_pend;
    uint64_t *last_seq; /* (world) newest seq_no seen from each rank */
    uint64_t refused, duplicates, stale;
    int64_t start;
    double sync_s_pending; /* weight sync time to report with the next step */
    size_t sync_bytes_pending;
    double refused_logged_at;
};

static void drop_refused(struct trainer_rank *r, const char *why)
{
    r->refused++;
    double now = rollout_now_s();
    if (now - r->refused_logged_at > 5.0) { /* a flood of garbage must not flood the log */
        log_warn("dataplane", "refused a batch on the data socket (%" PRIu64 " so far): %s", r->refused, why);
        r->refused_logged_at = now;
    }
}

/* Take one message off the socket into pending (checked, de-duplicated). 1 if a batch was kept, 0 if none came
 * or it was dropped, -1 on a socket error. */
static int receive_one(struct trainer_rank *r, int64_t k, int timeout_ms)
{
    void *buf;
    size_t len;
    char err[1024];
    int got = dataplane_recv(r->pull, timeout_ms, &buf, &len, err, sizeof err);
    if (got <= 0) {
        if (got < 0)
            log_error("dataplane", "%s", err);
        return got;
    }
    struct pending p = {0};
    int rc = wire_unpack_batch(buf, len, &r->lim, &p.h, &p.b, err, sizeof err);
    dataplane_msg_free(buf);
    dataplane_answer(r->pull, rc == 0, err); /* the acknowledgement, or the refusal with its reason */
    if (rc != 0) {
        drop_refused(r, err);
        return 0;
    }
    const int from = p.h.from_rank;
    if (p.h.seq_no <= r->last_seq[from] || p.h.step < k) {
        if (p.h.step < k)
            r->stale++;
        else
            r->duplicates++;
        log_debug("dataplane", "dropped batch seq %" PRIu64 " of step %lld from rank %d (duplicate or stale)",
                  p.h.seq_no, (long long)p.h.step, from);
        step_batch_free(&p.b);
        return 0;
    }
    r->last_seq[from] = p.h.seq_no;
    if (r->n_pend == r->cap_pend) {
        r->cap_pend = r->cap_pend ? 2 * r->cap_pend : 8;
        r->pend = xrealloc(r->pend, (size_t)r->cap_pend * sizeof *r->pend);
    }
    r->pend[r->n_pend++] = p;
    return 1;
}

static int by_gidx(const void *a, const void *b)
{
    const struct rollout_seq *x = a, *y = b;
    return (x->gidx > y->gidx) - (x->gidx < y->gidx);
}

/* trainer_source.next_batch: step k's batches from every rollout rank, merged in the step's order. */
static int next_batch(void *ctx, int64_t k, struct step_batch *b, struct step_timing *tm, struct metrics *m)
{
    struct trainer_rank *r = ctx;
    const int R = r->env->spec.rollout_ranks, B = r->lim.groups_in_step;
    int *uids = xmalloc((size_t)B * sizeof(int));
    trainer_advance_cursor(r->t, uids); /* the checkpoint's cursor moves with the rollout ranks' */
    control_set_phase(r->env->ctl, CONTROL_PHASE_IDLE);
    const double t0 = rollout_now_s();
    double last_note = t0;
    for (;;) {
        int have = 0;
        for (int i = 0; i < r->n_pend; i++)
            have += r->pend[i].h.step == k;
        if (have >= R)
            break;
        if (receive_one(r, k, 1000) < 0) {
            free(uids);
            return -1;
        }
        if (rollout_now_s() - last_note > 60) {
            log_warn("trainer", "step %lld: %d of %d rollout batches after %.0fs; still waiting", (long long)k, have, R,
                     rollout_now_s() - t0);
            last_note = rollout_now_s();
        }
    }
    tm->wait_data = rollout_now_s() - t0;
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
    }
    r->n_pend = w;
    /* the step's order, whatever order the batches came in; groups keep their indices */
    qsort(b->seqs, (size_t)b->n_seq, sizeof *b->seqs, by_gidx);
    int bad = 0; /* each sequence's prompt is the one this step draws at its group's position */
    for (int i = 0; i < b->n_seq; i++)
        bad += uids[b->seqs[i].gidx / r->lim.n] != b->group_uid[b->seqs[i].group];
    free(uids);
    if (bad) {
        log_error("trainer",
                  "step %lld: %d sequence(s) hold other prompts than this step draws: the rollout ranks "
                  "and the trainers disagree on the data order (same data.* settings everywhere?)",
                  (long long)k, bad);
        return -1;
    }
    metrics_set(m, "training/staleness", (double)staleness);
    metrics_set(m, "timing_s/update_weights", r->sync_s_pending);
    metrics_set(m, "perf/update_weights_bytes", (double)r->sync_bytes_pending);
    metrics_set(m, "dataplane/refused", (double)r->refused);
    metrics_set(m, "dataplane/duplicates", (double)(r->duplicates + r->stale));
    r->sync_s_pending = 0;
    r->sync_bytes_pending = 0;
    return 0;
}

static void send_weights(struct trainer_rank *r, int64_t version, bool stop, bool with_weights)
{
    struct model *p = trainer_policy(r->t);
    struct weight_sync_header h = {
        .version = version, .stop = stop, .has_weights = with_weights, .total_steps = trainer_total_steps(r->t)};
    trainer_cursor(r->t, &h.epoch, &h.cursor);
    control_set_phase(r->env->ctl, CONTROL_PHASE_WEIGHT_SYNC);
    struct weight_sync_stats ws;
    /* while the rollout ranks have not taken the header, report paused if the run is to pause */
    weight_sync_send(r->env->sync, &h, p->w.mem, p->w.n_floats,
                     (size_t)r->env->cfg->rollout_update_weights_bucket_megabytes << 20, &ws,
                     r->env->ctl ? control_wait_poll : NULL, r->env->ctl);
    control_set_phase(r->env->ctl, CONTROL_PHASE_IDLE);
    r->sync_s_pending += ws.seconds;
    r->sync_bytes_pending += ws.bytes;
    if (with_weights)
        log_debug("trainer", "weights of step %lld sent: %zu bytes in %d bucket(s), %.3fs", (long long)version,
                  ws.bytes, ws.buckets, ws.seconds);
}

/* trainer_source.between_steps: after step j the rollout ranks need the word for their step j + 1 + staleness;
 * and the end of the run, whenever it comes, is always said (the rollout ranks wait for it before they exit, so
 * no batch they pushed is lost to a closing socket). */
static int between_steps(void *ctx, int64_t j, bool stop)
{
    struct trainer_rank *r = ctx;
    if (!r->env->sync || (!stop && j + 1 + r->env->staleness > trainer_total_steps(r->t)))
        return 0;
    send_weights(r, j, stop, j > r->start && !stop);
    return 0;
}

/* Control-plane phase of a trainer hook's phase name ("gen", "update_actor", ...). */
static enum control_phase phase_of(const char *name)
{
    static const struct {
        const char *name;
        enum control_phase phase;
    } map[] = {{"gen", CONTROL_PHASE_GEN},
               {"reward", CONTROL_PHASE_REWARD},
               {"old_log_prob", CONTROL_PHASE_OLD_LOG_PROB},
               {"ref", CONTROL_PHASE_REF},
               {"adv", CONTROL_PHASE_ADV},
               {"update_actor", CONTROL_PHASE_UPDATE_ACTOR},
               {"validate", CONTROL_PHASE_VALIDATE},
               {"checkpoint", CONTROL_PHASE_CHECKPOINT}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (strcmp(map[i].name, name) == 0)
            return map[i].phase;
    return CONTROL_PHASE_IDLE;
}

/* Trainer hooks to the control plane (shared with the hybrid role in grpo_worker.c). */
struct trainer_ctl {
    struct control *ctl;
    struct trainer *t;
};

static void hook_phase(void *ctx, int64_t step, const char *phase)
{
    (void)step;
    control_set_phase(((struct trainer_ctl *)ctx)->ctl, phase_of(phase));
}

static void hook_step_done(void *ctx, int64_t step, int64_t total, const struct metrics *m)
{
    struct trainer_ctl *w = ctx;
    control_set_step(w->ctl, step, total);
    for (size_t i = 0; i < metrics_count(m); i++)
        control_set_metric(w->ctl, metrics_name(m, i), metrics_value(m, i));
    control_set_phase(w->ctl, CONTROL_PHASE_IDLE);
}

static void hook_waiting(void *ctx, bool done) { control_hold_while_waiting(((struct trainer_ctl *)ctx)->ctl, done); }

static void hook_checkpoint_saved(void *ctx, int64_t step)
{
    control_checkpoint_done(((struct trainer_ctl *)ctx)->ctl, step);
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
    if (rc == 0 && (!lay || lay->dp_rank == 0))
        log_info("worker", "run %s at step %lld; results in %s", finished ? "finished" : "stopped",
                 (long long)trainer_step(t), trainer_run_dir(t));
    control_finish(env->ctl, rc != 0 ? CONTROL_END_FAILED : (finished ? CONTROL_END_FINISHED : CONTROL_END_STOPPED),
                   rc != 0 ? "training failed (see the worker's log)" : NULL);
    trainer_free(t);
    return rc == 0 ? 0 : 1;
}

/* Once the trainer exists (its model loaded, any checkpoint resumed): bind the data socket, and DP rank 0 sends
 * the rollout ranks the weights to start from. */
static void trainer_ready(void *ud, struct trainer *t)
{
    struct trainer_rank *r = ud;
    r->t = t;
    r->start = trainer_step(t);
    r->lim.prompts = trainer_prompts(t);
    r->lim.vocab_size = trainer_policy(t)->cfg.vocab_size;
    if (r->env->sync)
        send_weights(r, r->start, false, true);
}

int run_trainer(struct role_env *env)
{
    const struct grpo_config *c = env->cfg;
    char err[1024];
    struct trainer_rank r = {.env = env};
    r.lim = (struct wire_limits){.max_response_length = (int)c->data_max_response_length,
                                 .groups_in_step = (int)c->data_train_batch_size,
                                 .n = (int)c->rollout_n,
                                 .world_size = comm_size(env->world),
                                 .dp_rank = env->at.dp,
                                 .secret = env->secret};
    r.last_seq = xcalloc((size_t)comm_size(env->world), sizeof *r.last_seq);
    /* bind before anything slow, so the rollout ranks' first batches find the socket */
    r.pull = dataplane_pull_open(env->endpoints[env->at.dp], err, sizeof err);
    if (!r.pull) {
        log_error("trainer", "%s", err);
        control_finish(env->ctl, CONTROL_END_FAILED, err);
        free(r.last_seq);
        return 2;
    }
    log_info("trainer", "DP rank %d of %d: pulling rollouts at %s", env->at.dp, env->at.dp_size,
             env->endpoints[env->at.dp]);
    struct trainer_layout lay = {
        .dp = env->trainers, .dp_rank = env->at.dp, .dp_size = env->at.dp_size, .devices = comm_size(env->world)};
    struct trainer_source src = {.ctx = &r, .next_batch = next_batch, .between_steps = between_steps};
    int status = run_trainer_process(env, &lay, &src, trainer_ready, &r);
    if (r.refused || r.duplicates || r.stale)
        log_info("dataplane", "DP rank %d: %" PRIu64 " batch(es) refused, %" PRIu64 " duplicate(s), %" PRIu64 " stale",
                 env->at.dp, r.refused, r.duplicates, r.stale);
    for (int i = 0; i < r.n_pend; i++)
        step_batch_free(&r.pend[i].b);
    free(r.pend);
    free(r.last_seq);
    dataplane_pull_close(r.pull);
    return status;
}
