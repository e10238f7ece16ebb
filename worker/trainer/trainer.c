/* The trainer's run loop: steps between safe points (pause, checkpoint, stop; DP rank 0 decides for every DP rank),
 * validation, the metrics logged, checkpoints written and read, and after every step the check that the DP replicas
 * hold the same weights; the trainer's accessors. Its set-up is trainer_create.c's, the step trainer_step.c's. */
#include "trainer.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "trainer_internal.h"
#include "common/dirlock.h"
#include "common/check.h"
#include "common/clock.h"
#include "kernels/kernels.h"
#include "common/fs.h"
#include "common/config.h"
#include "common/config_key_names.h"
#include "common/log.h"
#include "worker/watchdog/watchdog.h"
#include "worker/step/prompts.h"
#include "grad_reduce.h"
#include "zero1.h"

/* decide()'s broadcast to the other DP ranks: not the decision yet, but "save with me now" (a ZeRO-1
 * checkpoint that DP rank 0 writes from its safe point needs every rank's block of the optimizer state) */
#define TRAINER_SAVE_NOW 16
#include "worker/comm/comm.h"
#include "worker/control/control.h"
#include "worker/data/dataset.h"
#include "worker/metrics/metrics.h"
#include "worker/model/bundled.h"
#include "worker/model/device.h"
#include "worker/model/lora.h"
#include "worker/model/model_io.h"
#include "worker/rewards/reward.h"
#include "worker/tokenizer/tokenizer.h"

/* This rank's place in its model copy (ranks with the same place hold the same part of the weights). */
static int mp_rank(const struct trainer *t)
{
    return (t->lay.pp_rank * t->lay.tp_size + t->lay.tp_rank) * t->lay.ep_size + t->lay.ep_rank;
}

/* The group the decisions are broadcast over (every trainer rank), NULL when alone. */
struct comm *trainer_all_group(const struct trainer *t)
{
    return t->lay.all && comm_size(t->lay.all) > 1 ? t->lay.all : NULL;
}

/* ------------------------------------------------------------- life cycle */

/* ---- a policy in device memory (trainer.device=cuda): what reads host memory gets a host copy ---- */

float *trainer_host_buffer(struct trainer *t)
{
    if (!t->host_params) {
        const size_t bytes = model_trainable(t->policy).n * sizeof(float);
        karena_init_host(&t->host_stage, t->policy->K, "the trainable parameters' host copy");
        karena_reserve(&t->host_stage, bytes, 1);
        t->host_params = karena_take(&t->host_stage, bytes);
    }
    return t->host_params;
}

/* A host copy of optimizer state held in its context's memory, and back. */
static struct adamw *adamw_to_host(const struct adamw *o)
{
    struct adamw *h = adamw_create(o->n, o->beta1, o->beta2, o->eps, o->weight_decay);
    h->t = o->t;
    k_to_host(o->K, h->m, o->m, o->n * sizeof(float));
    k_to_host(o->K, h->v, o->v, o->n * sizeof(float));
    return h;
}

static void adamw_from_host(struct adamw *o, const struct adamw *h)
{
    k_to_device(o->K, o->m, h->m, o->n * sizeof(float));
    k_to_device(o->K, o->v, h->v, o->n * sizeof(float));
    o->t = h->t;
}

/* This rank's part of a buffer laid out as the policy's parameters (in K's memory) to TP x PP rank 0's whole (host)
 * buffer; from a GPU through the host, so that every rank of the group sends and receives host memory. */
static void shard_gather(struct trainer *t, struct kctx *K, const float *local, float *whole)
{
    const float *part = local;
    if (K->device != KDEV_CPU) {
        float *stage = trainer_host_buffer(t);
        k_to_host(K, stage, local, t->policy->w.n_floats * sizeof(float));
        part = stage;
    }
    model_shard_gather(t->policy, part, whole, 0);
}

/* This rank's part of a whole (host) buffer into local (in K's memory), through the host from a GPU. */
static void shard_slice(struct trainer *t, struct kctx *K, const float *whole, float *local)
{
    if (K->device == KDEV_CPU) {
        model_shard_slice(t->policy, whole, local);
        return;
    }
    float *stage = trainer_host_buffer(t);
    model_shard_slice(t->policy, whole, stage);
    k_to_device(K, local, stage, t->policy->w.n_floats * sizeof(float));
}

/* LoRA on a model copy split over ranks (EP, TP, PP): this rank's buffer in the adapter's layout (in K's memory) to
 * the whole adapter's (host; NULL: this rank only sends), and a whole one's part back into local; from a GPU
 * through the host. */
static void lora_gather(struct trainer *t, struct kctx *K, const float *local, float *whole)
{
    const float *part = local;
    if (K->device != KDEV_CPU) {
        float *stage = trainer_host_buffer(t);
        k_to_host(K, stage, local, t->policy->lora->n * sizeof(float));
        part = stage;
    }
    lora_mp_gather(t->policy, part, whole);
}

static void lora_slice(struct trainer *t, struct kctx *K, const float *whole, float *local)
{
    if (K->device == KDEV_CPU) {
        lora_mp_slice(t->policy, whole, local);
        return;
    }
    float *stage = trainer_host_buffer(t);
    lora_mp_slice(t->policy, whole, stage);
    k_to_device(K, local, stage, t->policy->lora->n * sizeof(float));
}

/* The whole model and optimizer state from every rank's part (ZeRO-1 blocks over DP, then the TP and PP parts
 * to trainer rank 0, which writes). *wm: the whole policy (NULL: t->policy is whole, or this rank does not
 * write); *wo: the whole optimizer state (NULL: t->opt is, or this rank does not write). The caller frees
 * both. */
static void gather_whole(struct trainer *t, struct model **wm, struct adamw **wo)
{
    struct adamw *local = t->zero ? zero1_gather(t->zero, t->opt) : NULL; /* collective over DP */
    *wm = NULL;
    *wo = local;
    /* the first model copy gathers (EP: DP ranks 0..EP-1); under SP or CP its CP rank 0's, the others hold the same
     * parts */
    if (!t->lay.mp || t->lay.dp_rank / t->lay.ep_size != 0 || t->lay.cp_rank != 0)
        return;
    const struct adamw *opt = local ? local : t->opt;
    *wo = NULL;
    if (t->policy->lora) { /* LoRA under EP, TP or PP: the whole adapter and its moments (every expert's, row,
                            * column and layer) */
        const struct model *p = t->policy;
        if (trainer_is_lead(t)) {
            char err[256];
            *wm = model_create(&p->cfg);
            if (lora_attach(*wm, &p->lora->cfg, err, sizeof err) != 0)
                check_failf(__FILE__, __LINE__, "gather_whole: %s", err);
            snprintf((*wm)->lora->base, sizeof(*wm)->lora->base, "%s", p->lora->base);
            *wo = adamw_create((*wm)->lora->n, opt->beta1, opt->beta2, opt->eps, opt->weight_decay);
            (*wo)->t = opt->t;
        }
        lora_gather(t, p->K, p->lora->mem, *wm ? (*wm)->lora->mem : NULL);
        lora_gather(t, opt->K, opt->m, *wo ? (*wo)->m : NULL);
        lora_gather(t, opt->K, opt->v, *wo ? (*wo)->v : NULL);
        adamw_free(local);
        return;
    }
    if (trainer_is_lead(t)) {
        *wm = model_create(&t->policy->cfg);
        *wo = adamw_create((*wm)->w.n_floats, opt->beta1, opt->beta2, opt->eps, opt->weight_decay);
        (*wo)->t = opt->t;
    }
    shard_gather(t, t->policy->K, t->policy->w.mem, *wm ? (*wm)->w.mem : NULL);
    shard_gather(t, opt->K, opt->m, *wo ? (*wo)->m : NULL);
    shard_gather(t, opt->K, opt->v, *wo ? (*wo)->v : NULL);
    adamw_free(local);
}

int trainer_save_checkpoint(struct trainer *t)
{
    /* Checkpoints are whole (the Hugging Face layout, whatever the parallel layout): with ZeRO-1 every DP rank
     * sends its block of the optimizer state, and with TP or PP every rank of DP rank 0's model copy its part. From
     * the leader's safe point (grpod asked for it) the others wait in decide(): call them first. */
    const bool collective = t->zero || t->lay.mp;
    if (collective && t->in_decide && trainer_is_lead(t)) {
        int act = TRAINER_SAVE_NOW;
        comm_broadcast_polled(trainer_all_group(t), &act, 1, COMM_I32, 0, NULL, NULL);
    }
    struct model *wm = NULL;
    struct adamw *wo = NULL;
    if (collective) {
        gather_whole(t, &wm, &wo);
        if (!wm && trainer_on_device(t) &&
            trainer_is_lead(t)) /* ZeRO-1 on GPUs: the moments came gathered to the host, not the weights */
            wm = model_copy_to(t->policy, kctx_cpu());
    } else if (trainer_on_device(t)) { /* one process on a GPU: the checkpoint is written from host copies */
        if (!t->policy->lora)          /* an adapter is saved from the device by lora_save itself */
            wm = model_copy_to(t->policy, kctx_cpu());
        wo = adamw_to_host(t->opt);
    }
    const struct adamw *opt = wo ? wo : t->opt;
    uint8_t *blob = NULL; /* the source's state (fully-async training: the stream drained) */
    size_t blob_len = 0;
    if (t->src.checkpoint_state && t->src.checkpoint_state(t->src.ctx, t->st.global_step, &blob, &blob_len) != 0) {
        model_free(wm);
        adamw_free(wo);
        log_error("checkpoint", "step %lld: the step source's state could not be gathered",
                  (long long)t->st.global_step);
        return -1;
    }
    if (!trainer_is_lead(t)) {
        comm_test_hold("ckpt"); /* tests: a rank dies in its part of a checkpoint the leader writes */
        free(blob);
        model_free(wm);
        adamw_free(wo); /* the leader writes for every replica: the weights and optimizer state are the same */
        if (t->hooks.checkpoint_saved)
            t->hooks.checkpoint_saved(t->hooks.ctx, t->st.global_step, false);
        return 0;
    }
    trainer_phase(t, GRPO__PHASE__PHASE_CHECKPOINT);
    char err[1024];
    double t0 = clock_now_s();
    int saved = checkpoint_save_extra(t->ckpt_root, wm ? wm : t->policy, opt, t->tok, &t->st,
                                      (int)t->cfg->trainer_max_actor_ckpt_to_keep,
                                      blob ? TRAINER_SOURCE_STATE_FILE : NULL, blob, blob_len, err, sizeof err);
    free(blob);
    model_free(wm);
    adamw_free(wo);
    if (saved != 0) {
        log_error("checkpoint", "%s", err);
        return -1;
    }
    t->saved_step = t->st.global_step;
    char saved_dir[4200];
    snprintf(saved_dir, sizeof saved_dir, "%s/global_step_%lld", t->ckpt_root, (long long)t->st.global_step);
    watchdog_checkpoint_saved(t->st.global_step, saved_dir);
    if (t->hooks.checkpoint_saved)
        t->hooks.checkpoint_saved(t->hooks.ctx, t->st.global_step, true);
    if (t->logger_open)
        metrics_logger_sync(&t->logger); /* metrics up to this checkpoint are durable too */
    log_info("checkpoint", "step %lld saved in %.1fs under %s", (long long)t->st.global_step, clock_now_s() - t0,
             t->ckpt_root);
    return 0;
}

/* End of the supervised warm-start: GRPO starts from here, so this is the reference policy (KL is measured
 * against it) and the optimizer starts afresh. The reference is kept in RUN_DIR/reference for resumes. */
static int finish_warm_start(struct trainer *t)
{
    char dir[2300], err[1024];
    snprintf(dir, sizeof dir, "%s/reference", t->run_dir);
    struct kctx *K = t->policy->K; /* the reference shares the policy's context (model_clone) */
    if (t->ref)
        k_copy(K, t->ref->w.mem, t->policy->w.mem, t->policy->w.n_floats * sizeof(float));
    struct model *host = trainer_on_device(t) ? model_copy_to(t->policy, kctx_cpu()) : NULL;
    int saved = model_save_hf(host ? host : t->policy, dir, 0, err, sizeof err);
    model_free(host);
    if (saved != 0) {
        log_error("trainer", "saving the warm-started reference: %s", err);
        return -1;
    }
    k_zero(t->opt->K, t->opt->m, t->opt->n * sizeof(float));
    k_zero(t->opt->K, t->opt->v, t->opt->n * sizeof(float));
    t->opt->t = 0;
    log_info("trainer", "supervised warm-start done at step %lld: reference policy saved in %s, GRPO starts",
             (long long)t->st.global_step, dir);
    return 0;
}

static void log_step(struct trainer *t, int64_t step, struct metrics *m)
{
    if (t->logger_open)
        metrics_logger_log(&t->logger, step, m); /* also redraws the run's SVG chart */
    flight_set_phase(GRPO__PHASE__PHASE_IDLE);   /* the step is over (the hook says so to grpod) */
    watchdog_step_done(step);
    if (t->hooks.step_done)
        t->hooks.step_done(t->hooks.ctx, step, t->st.total_steps, m);
}

/* FNV-1a over the parameters' bit patterns, one 32-bit word per step of the hash (every step of a run pays for
 * it: four times fewer multiplications than byte by byte). */
static uint64_t params_checksum(struct trainer *t)
{
    uint64_t h = 0xcbf29ce484222325ull;
    size_t n;
    const float *w = trainer_params(t, &n); /* what training changes: the adapter with LoRA */
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &w[i], sizeof bits);
        h = (h ^ bits) * 0x100000001b3ull;
    }
    return h;
}

/* Reasons of this process to end the run at the next safe point (DP rank 0 decides for all, so the other DP
 * ranks send theirs along with the weights' checksum after every step). */
enum {
    WANTS_SIGNAL = 1, /* SIGTERM or SIGINT: stop after a checkpoint */
    WANTS_OUTPUT = 2, /* a record of the run could not be written: stop after a checkpoint, with an error */
};
/* A stop that ends the run with an error (with TRAINER_STOP in the broadcast decision; not a hook's answer). */
#define TRAINER_FAIL 8
/* In the broadcast decision: DP rank 0 holds a checkpoint of this step already (written at its safe point or by
 * save_freq), so no rank saves it again. Only DP rank 0 knows (its saved_step); a save is collective with ZeRO-1. */
#define TRAINER_ALREADY_SAVED 32

static int local_wants(void)
{
    return (control_stop_signal() ? WANTS_SIGNAL : 0) | (metrics_output_failure(NULL, 0) ? WANTS_OUTPUT : 0);
}

/* Every DP rank must hold the same weights after a step (the same shard, under TP); -1 (logged) if any differs.
 * The leader also learns the other ranks' reasons to end the run (peer_wants). */
static int check_replicas(struct trainer *t, int64_t k)
{
    struct comm *all = trainer_all_group(t);
    if (!all)
        return 0;
    const int n = comm_size(all);
    int64_t mine[3] = {(int64_t)params_checksum(t), local_wants(), mp_rank(t)};
    int64_t *v = xmalloc((size_t)n * 3 * sizeof *v);
    comm_allgather(all, mine, v, 3, COMM_I64);
    int bad = 0, first = -1; /* first: the first rank holding this rank's shard (its DP rank 0) */
    for (int r = 0; r < n; r++) {
        if (v[3 * r + 2] == mine[2] && first < 0)
            first = r;
        bad += v[3 * r + 2] == mine[2] && v[3 * r] != v[3 * first];
        t->peer_wants |= (int)v[3 * r + 1];
        if ((v[3 * r + 1] & WANTS_OUTPUT) && t->peer_failed_rank < 0 && r != comm_rank(all))
            t->peer_failed_rank = r;
    }
    if (bad)
        log_error("trainer", "step %lld: weights differ between DP ranks (checksum %016llx here, %016llx on DP rank 0)",
                  (long long)k, (unsigned long long)mine[0], (unsigned long long)v[3 * first]);
    else if (t->lay.dp_size > 1)
        log_debug("trainer", "step %lld: weights identical on %d DP ranks (checksum %016llx)", (long long)k,
                  t->lay.dp_size, (unsigned long long)mine[0]);
    free(v);
    return bad ? -1 : 0;
}

/* DP rank 0: TRAINER_STOP (| TRAINER_FAIL) when this rank or another has a reason to end the run, with the
 * reason logged (and kept in t->failure for a failure); TRAINER_CONTINUE otherwise. */
static int stop_reason(struct trainer *t)
{
    const int wants = local_wants() | t->peer_wants;
    const long long step = (long long)t->st.global_step;
    if (wants & WANTS_OUTPUT) {
        char why[1200];
        if (metrics_output_failure(why, sizeof why))
            snprintf(t->failure, sizeof t->failure, "%s", why);
        else
            snprintf(t->failure, sizeof t->failure, "DP rank %d could not write its rollout dumps (see its log)",
                     (t->peer_failed_rank / t->lay.tp_size) % t->lay.dp_size); /* trainer rank -> its DP rank */
        log_error("trainer",
                  "the run's records cannot be written (%s): stopping at step %lld, after a checkpoint if "
                  "there is room",
                  t->failure, step);
        return TRAINER_STOP | TRAINER_FAIL;
    }
    if (wants & WANTS_SIGNAL) {
        if (control_stop_signal())
            log_info("trainer", "%s: stopping at step %lld, after a checkpoint",
                     control_signal_name(control_stop_signal()), step);
        else
            log_info("trainer", "another DP rank received SIGTERM or SIGINT: stopping at step %lld, after a checkpoint",
                     step);
        return TRAINER_STOP;
    }
    return TRAINER_CONTINUE;
}

/* While a DP rank waits for DP rank 0's decision: it reports paused while the run is to pause (DP rank 0 is held
 * at its safe point then). */
static void answer_control(void *ud, bool done)
{
    struct trainer *t = ud;
    t->hooks.waiting(t->hooks.ctx, done);
}

void trainer_meet(struct trainer *t)
{
    struct comm *all = trainer_all_group(t);
    if (all && comm_size(all) > 1)
        comm_barrier_polled(all, !trainer_is_lead(t) && t->hooks.waiting ? answer_control : NULL, t);
}

/* The safe point's decision, DP rank 0's for every DP rank: grpod's commands (the safe_point hook), a signal, a
 * record that could not be written. */
static int decide(struct trainer *t)
{
    int act = TRAINER_CONTINUE;
    if (trainer_is_lead(t)) {
        act = stop_reason(t);
        t->in_decide = true;
        if (act == TRAINER_CONTINUE)
            act = trainer_safe_point(t); /* may hold here while the run is paused */
        t->in_decide = false;
        if (!(act & TRAINER_STOP))
            act |= stop_reason(t); /* a signal that came while it was held */
        if (t->saved_step == t->st.global_step)
            act |= TRAINER_ALREADY_SAVED;
    }
    if (trainer_all_group(t)) /* stop and checkpoint follow the leader */
        for (;;) {
            comm_broadcast_polled(trainer_all_group(t), &act, 1, COMM_I32, 0,
                                  !trainer_is_lead(t) && t->hooks.waiting ? answer_control : NULL, t);
            if (trainer_is_lead(t) || act != TRAINER_SAVE_NOW)
                break;
            trainer_save_checkpoint(t); /* the leader writes; this rank sends its part */
            act = TRAINER_CONTINUE;
        }
    return act;
}

bool trainer_save_due(const struct trainer *t, int64_t k)
{
    const int64_t push = t->src.push_every > 1 ? t->src.push_every : 1; /* fully-async: save_freq counts pushes */
    const int64_t freq = t->cfg->trainer_save_freq;
    return (freq > 0 && k % push == 0 && (k / push) % freq == 0) || k == t->st.total_steps;
}

int trainer_run(struct trainer *t)
{
    const struct grpo_config *c = t->cfg;
    /* validation generates with the policy: on every rank of DP rank 0's TP group (the leader logs it), or on
     * every rank where the source shares it out */
    /* (a spare validates nothing: it waits in its first step's start) */
    bool validator = !t->lay.spare && (t->lay.dp_rank / t->lay.ep_size == 0 || t->src.validate);
    struct metrics m;
    metrics_init(&m);
    int rc = 0;
    /* before training; with trainer.val_only at the step it starts from (a resumed checkpoint's too) */
    if ((t->st.global_step == 0 || c->trainer_val_only) && c->trainer_val_before_train && validator) {
        trainer_validate(t, &m);
        log_step(t, t->st.global_step, &m);
        metrics_clear(&m);
    }
    if (c->trainer_val_only) { /* verl's: nothing is trained; the run finishes at the step it validated */
        if (trainer_is_lead(t))
            log_info("trainer", KEY_trainer_val_only ": validated at step %lld; nothing is trained",
                     (long long)t->st.global_step);
        t->st.total_steps = t->st.global_step;
    }
    const int64_t push = t->src.push_every > 1 ? t->src.push_every : 1; /* fully-async: the weight pushes */
    while (t->st.global_step < t->st.total_steps) {
        /* trainer.survive_trainer_loss: a lost rank brings the others back here, to redo the step it interrupted
         * (the survivors re-formed and the step's start restored by survive_recover) */
        if (t->rec.point) {
            if (setjmp(*t->rec.point)) { /* alone in the condition, as setjmp must be */
                if (t->rec.recover(t->rec.ctx) != 0) {
                    rc = -1;
                    break;
                }
            }
            const bool spare = t->lay.spare;
            const double b0 = clock_now_s();
            if (t->rec.step_begin(t->rec.ctx, t->st.global_step + 1) != 0)
                break;                                                           /* a spare released at the run's end */
            validator = t->lay.dp_rank / t->lay.ep_size == 0 || t->src.validate; /* a lost lead's: the new one */
            /* the step's time includes keeping its start (the key's cost a step), not a spare's wait to join */
            t->keep_s = spare ? 0 : clock_now_s() - b0;
            t->iter_t0 = spare ? clock_now_s() : b0;
        } else {
            t->iter_t0 = clock_now_s();
        }
        t->wait_t0 = comm_wait_seconds();
        int act = t->st.global_step % push == 0 ? decide(t) : TRAINER_CONTINUE;
        /* a stop checkpoints too, unless this step is already saved */
        bool saved = act & TRAINER_ALREADY_SAVED;
        /* the leader wrote this step's checkpoint (from its safe point, grpod's request): a replica that took no
         * part in writing it holds the same state, and says the request is done too */
        if (saved && !trainer_is_lead(t) && t->hooks.checkpoint_saved)
            t->hooks.checkpoint_saved(t->hooks.ctx, t->st.global_step, false);
        if ((act & (TRAINER_CHECKPOINT | TRAINER_STOP)) && !saved)
            saved = trainer_save_checkpoint(t) == 0;
        if (t->src.between_steps && t->src.between_steps(t->src.ctx, t->st.global_step, act & TRAINER_STOP) != 0) {
            rc = -1;
            break;
        }
        if (act & TRAINER_FAIL) {
            /* a rank ending with an error ends the MPI job (grpo_worker.c): not before DP rank 0's checkpoint */
            if (trainer_all_group(t))
                comm_barrier(trainer_all_group(t));
            if (trainer_is_lead(t))
                log_error("trainer", "stopped at step %lld: %s; %s", (long long)t->st.global_step,
                          t->failure[0] ? t->failure : "a record of the run could not be written",
                          saved ? "the checkpoint of this step is written" : "no checkpoint could be written");
            rc = -1;
            break;
        }
        if (act & TRAINER_STOP) {
            if (trainer_is_lead(t))
                log_info("trainer", "stop requested at step %lld: %s, ending", (long long)t->st.global_step,
                         saved ? "checkpoint written" : "the checkpoint could not be written");
            break;
        }
        const int64_t k = t->st.global_step + 1;
        metrics_clear(&m);
        int r = k <= c->trainer_sft_warmup_steps ? trainer_sft_step(t, k, &m) : trainer_grpo_step(t, &m);
        if (r == 0)
            r = check_replicas(t, k);
        if (r != 0) {
            rc = -1;
            break;
        }
        t->st.global_step = k;
        if (k == c->trainer_sft_warmup_steps && trainer_is_lead(t) && finish_warm_start(t) != 0) {
            rc = -1;
            break;
        }
        /* validate on test_freq, at the last step, and where the warm-start hands over to GRPO */
        /* fully-async: test_freq and save_freq count pushes, as in verl */
        const bool pushed = k % push == 0;
        if (validator && ((c->trainer_test_freq > 0 && pushed && (k / push) % c->trainer_test_freq == 0) ||
                          k == t->st.total_steps || k == c->trainer_sft_warmup_steps))
            trainer_validate(t, &m);
        log_step(t, k, &m);
        if (t->rec.point)
            t->rec.step_done(t->rec.ctx, k);
        if (trainer_save_due(t, k))
            if (trainer_save_checkpoint(t) != 0) {
                rc = -1;
                break;
            }
    }
    if (t->rec.point) /* past the steps a lost rank ends the job, as without the key */
        t->rec.disarm(t->rec.ctx);
    /* the ranks leave together: DP rank 0 may still be validating or writing the last checkpoint, and a rank
     * that went ahead would wait for it in MPI_Finalize, whose guard takes a long wait for a lost rank */
    if (rc == 0)
        trainer_meet(t);
    if (rc == 0 && t->st.global_step >= t->st.total_steps && t->src.between_steps)
        rc = t->src.between_steps(t->src.ctx, t->st.global_step, true);
    metrics_free(&m);
    if (t->logger_open)
        metrics_logger_sync(&t->logger);
    /* a record that failed after the last safe point (the last step's, or the final sync) */
    char why[1200];
    if (rc == 0 && metrics_output_failure(why, sizeof why)) {
        snprintf(t->failure, sizeof t->failure, "%s", why);
        log_error("trainer", "the run ended at step %lld, but its records are incomplete: %s",
                  (long long)t->st.global_step, why);
        rc = -1;
    }
    return rc;
}

/* Resume from a checkpoint (whole, the Hugging Face layout) into this rank's part of the weights and of the
 * optimizer state. 0, or -1 with err. */
int trainer_load_checkpoint(struct trainer *t, const char *dir, struct run_state *st, char *err, size_t errlen)
{
    if (!t->lay.mp && !trainer_on_device(t))
        return checkpoint_load(dir, t->policy, t->opt, st, err, errlen);
    if (t->policy->lora && t->lay.mp) { /* LoRA under EP, TP or PP: the whole adapter, then this rank's part */
        const struct model *p = t->policy;
        struct model *wm = model_create(&p->cfg);
        if (lora_attach(wm, &p->lora->cfg, err, errlen) != 0) {
            model_free(wm);
            return -1;
        }
        struct adamw *wo = adamw_create(wm->lora->n, t->opt->beta1, t->opt->beta2, t->opt->eps, t->opt->weight_decay);
        int rc = checkpoint_load(dir, wm, wo, st, err, errlen);
        if (rc == 0) {
            p->lora->cfg.alpha = wm->lora->cfg.alpha;
            p->lora->scale = wm->lora->scale;
            lora_slice(t, p->K, wm->lora->mem, p->lora->mem);
            lora_slice(t, t->opt->K, wo->m, t->opt->m);
            lora_slice(t, t->opt->K, wo->v, t->opt->v);
            t->opt->t = wo->t;
        }
        adamw_free(wo);
        model_free(wm);
        return rc;
    }
    if (t->policy->lora) { /* a whole model on a GPU: lora_load fills the device's adapter itself */
        struct adamw *ho = adamw_create(t->opt->n, t->opt->beta1, t->opt->beta2, t->opt->eps, t->opt->weight_decay);
        int rc = checkpoint_load(dir, t->policy, ho, st, err, errlen);
        if (rc == 0)
            adamw_from_host(t->opt, ho);
        adamw_free(ho);
        return rc;
    }
    /* the whole checkpoint in host memory, then this rank's part of it (TP, PP) or all of it into the GPU's */
    struct model *wm = model_create(&t->policy->cfg);
    struct adamw *wo = adamw_create(wm->w.n_floats, t->opt->beta1, t->opt->beta2, t->opt->eps, t->opt->weight_decay);
    int rc = checkpoint_load(dir, wm, wo, st, err, errlen);
    if (rc == 0 && t->lay.mp) {
        shard_slice(t, t->policy->K, wm->w.mem, t->policy->w.mem);
        shard_slice(t, t->opt->K, wo->m, t->opt->m);
        shard_slice(t, t->opt->K, wo->v, t->opt->v);
        t->opt->t = wo->t;
    } else if (rc == 0) {
        model_weights_from_host(t->policy, wm->w.mem);
        adamw_from_host(t->opt, wo);
    }
    model_free(wm);
    adamw_free(wo);
    return rc;
}

int64_t trainer_step(const struct trainer *t) { return t->st.global_step; }
bool trainer_leads(const struct trainer *t) { return trainer_is_lead(t); }
const char *trainer_failure(const struct trainer *t) { return t->failure; }
struct model *trainer_policy(struct trainer *t) { return t->policy; }
const struct prompt_set *trainer_prompts(const struct trainer *t) { return &t->train; }
const struct prompt_set *trainer_val_prompts(const struct trainer *t) { return &t->val; }
const struct gen_ctx *trainer_rollout_ctx(const struct trainer *t) { return &t->rc; }

void trainer_cursor(const struct trainer *t, int64_t *epoch, int64_t *index)
{
    *epoch = t->st.epoch;
    *index = t->st.cursor;
}

void trainer_advance_cursor(struct trainer *t, int *uids)
{
    const int B = config_gen_batch_size(t->cfg); /* the cursor's draw */
    const struct prompt_item **p = xmalloc((size_t)B * sizeof *p);
    trainer_draw_prompts(t, p, uids, B);
    free(p);
}
int64_t trainer_total_steps(const struct trainer *t) { return t->st.total_steps; }
const char *trainer_resumed_from(const struct trainer *t) { return t->resumed_from; }
void trainer_enter_phase(struct trainer *t, Grpo__Phase p) { trainer_phase(t, p); }
uint64_t trainer_seed(const struct trainer *t) { return t->st.seed; }

void trainer_set_cursor(struct trainer *t, int64_t epoch, int64_t index)
{
    t->st.epoch = epoch;
    t->st.cursor = index;
}
const char *trainer_run_dir(const struct trainer *t) { return t->run_dir; }

const float *trainer_params(struct trainer *t, size_t *n)
{
    const struct trainable tr = model_trainable(t->policy);
    *n = tr.n;
    if (!trainer_on_device(t))
        return tr.params;
    k_to_host(t->policy->K, trainer_host_buffer(t), tr.params, tr.n * sizeof(float));
    return t->host_params;
}
