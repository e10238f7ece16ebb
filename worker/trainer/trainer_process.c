/* A trainer rank's process, whatever feeds it: the trainer created with its layout and its step source, hooked to
 * the control plane (phases, steps, safe points, checkpoints), run, and its end reported. The hybrid role (one
 * process, colocated ranks) and the trainer role of a split run (worker/split/) both run their trainers here, each
 * with its own trainer_source; this file knows none of them. */
#include "trainer_process.h"

#include <stdio.h>
#include <string.h>

#include "common/config.h"
#include "common/log.h"
#include "trainer.h"
#include "worker/comm/comm.h"
#include "worker/control/control.h"
#include "worker/metrics/metrics.h"
#include "worker/roles.h"
#include "worker/watchdog/watchdog.h"

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
                                   .devices = comm_size(env->world) - env->spare_ranks,
                                   .spare = env->spare,
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

static bool paused(void *ctl) { return control_pause_wanted(ctl); }

/* The watchdog ends the job: grpod hears why first (at most a few seconds). */
static void tell_grpod(void *ctl, const char *why) { control_fail_now(ctl, why, 5.0); }

/* The progress watchdog of this trainer rank (trainer.hang_timeout_s, trainer.hang_action). */
static void start_watchdog(const struct role_env *env, struct trainer *t)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/flight", trainer_run_dir(t)); /* where the flight recorder dumps */
    const int world = comm_size(env->world) - env->spare_ranks; /* the spares run none */
    const struct watchdog_options o = {
        .timeout_s = env->cfg->trainer_hang_timeout_s,
        .stop = strcmp(env->cfg->trainer_hang_action, "stop") == 0,
        .rank = env->rank,
        .watched = env->spec.trainer_ranks > 0 && env->spec.trainer_ranks < world ? env->spec.trainer_ranks : world,
        .dump_dir = dir,
        .held = paused,
        .held_ud = env->ctl,
        .end_job = comm_end_job,
        .on_stop = tell_grpod,
        .on_stop_ud = env->ctl,
    };
    if (trainer_resumed_from(t)[0]) /* until it writes one, the checkpoint it resumed from is the newest */
        watchdog_checkpoint_saved(trainer_step(t), trainer_resumed_from(t));
    watchdog_start(&o);
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
    if (!env->spare) /* a spare completes no step until it joins */
        start_watchdog(env, t);
    int rc = trainer_run(t);
    watchdog_stop();
    /* a spare released at the run's end (env->spare: it never joined) did all it was asked */
    bool finished = trainer_step(t) >= trainer_total_steps(t) || env->spare;
    log_info("worker", "peak resident memory of this rank: %.3f GB", proc_peak_rss_gb());
    if (rc == 0 && trainer_leads(t)) /* the lead at the end (a survived loss of the first moves it) */
        log_info("worker", "run %s at step %lld; results in %s", finished ? "finished" : "stopped",
                 (long long)trainer_step(t), trainer_run_dir(t));
    const char *why = trainer_failure(t);
    control_finish(env->ctl, rc != 0 ? CONTROL_END_FAILED : (finished ? CONTROL_END_FINISHED : CONTROL_END_STOPPED),
                   rc != 0 ? (why && why[0] ? why : "training failed (see the worker's log)") : NULL);
    trainer_free(t);
    return rc == 0 ? 0 : 1;
}
