/* The rollout role: take work units from the trainers' dispatcher, generate
 * and score each unit's groups and push them to the trainers; fetch the policy
 * version each unit asks for. A rollout rank alone uses no MPI: it can die, or
 * join later in a lost one's place, and the run goes on.
 *
 * With actor_rollout_ref.rollout.tensor_model_parallel_size t > 1, t
 * neighbouring rollout ranks form a TP group (an engine) that generates with one
 * model split over them. Its first rank speaks for the group: it takes the
 * units, downloads each policy version and hands every peer its shard (the
 * resharding from the trainers' layout, in buckets), and pushes the batches.
 * It tells its peers what comes next with a small message (wait, weights, a
 * unit, the end), and keeps them informed while it waits. A rank that sees no
 * traffic from its group for tp_group_timeout_s (a peer is lost) ends itself:
 * the group stops answering the dispatcher, which grants its units to the
 * other groups. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/gen/generate.h"
#include "common/backoff.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/placement.h"
#include "common/config.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "proto/transport.h"
#include "worker/plane/dataplane.h"
#include "worker/plane/dispatch.h"
#include "worker/plane/relay.h"
#include "worker/plane/weight_sync.h"
#include "worker/plane/wire.h"
#include "worker/data/dataset.h"
#include "worker/metrics/metrics.h"
#include "worker/comm/comm.h"
#include "worker/flight/flight.h"
#include "worker/model/device.h"
#include "worker/model/bundled.h"
#include "worker/model/lora.h"
#include "worker/model/model_io.h"
#include "worker/rewards/reward.h"
#include "worker/roles.h"
#include "worker/tokenizer/tokenizer.h"

struct rollout_rank {
    struct role_env *env;
    char relay_dial[300]; /* the relay tree: where the other rollout processes dial this one's relay */
    struct model *policy;
    struct model *base; /* LoRA with TP, the head: the whole frozen base (host memory) holding the adapter */
    struct tokenizer *tok;
    struct reward_fn *reward;
    struct prompt_set train, val;
    struct data_cursor cur;
    bool cur_open;
    int64_t cur_step; /* the step whose prompts the cursor drew last */
    /* the run's steps (0: not heard yet), and whether the dispatcher has granted every step's units (this rank
     * had one of the final step, or was told every step is granted): then a dispatcher gone is the trainers' end,
     * not a loss */
    int64_t total_steps;
    bool all_granted, said_all_granted;
    bool said_waiting_on; /* said that the trainers have been silent a minute and this rank waits on (under grpod) */
    bool said_send_hold;  /* said that it holds for a pause while a trainer has not taken its batch before */
    double gone_since;    /* since when the dispatcher's endpoint is gone (0: it is not) */
    int64_t version;      /* policy version in the model (-1: none yet) */
    struct gen_ctx rc;
    struct dataplane_push *push;
    struct work_client *work;
    uint64_t seq_no;
    /* rollout TP group (NULL: alone) */
    struct comm *eng;
    struct comm *eng_dev; /* trainer.device=cuda: eng's NCCL twin, over which the model's TP collectives run */
    bool head;            /* the group's first rank: dispatcher, trainers, weights */
    float *whole;         /* the head: each downloaded version, whole (with TP, or on a GPU: its host copy) */
    double keepalive_at;  /* the head: when its peers last heard from it */
    struct weight_sync_receiver ws; /* the head: how each version comes (fetched, or in the trainers' broadcast) */
    pthread_t watchdog;
    bool watching;
    int replaying; /* generating a replayed unit's phase: no live pause */
    atomic_bool quit;
};

/* What the head tells its peers next (int64 words, broadcast over the group). */
enum eng_kind { ENG_WAIT = 0, ENG_UNIT = 1, ENG_END = 2, ENG_WEIGHTS = 3 };
enum {
    ENG_KIND,
    ENG_STEP,
    ENG_UNIT_NO,
    ENG_UNITS,
    ENG_VERSION,
    ENG_START,
    ENG_TOTAL,
    ENG_EPOCH,
    ENG_CURSOR,
    ENG_PHASES,  /* a replayed fully-async unit: its phases (their versions and tokens follow the message) */
    ENG_RTOKENS, /* and its tokens at each phase's end, phases x sequences */
    ENG_WORDS
};

static void eng_send(struct rollout_rank *r, int64_t *msg)
{
    /* the peers wait with a polled (non-blocking) broadcast: MPI matches it only with the same kind */
    comm_broadcast_polled(r->eng, msg, ENG_WORDS, COMM_I64, 0, NULL, NULL);
    r->keepalive_at = clock_now_s();
}

/* The head, while it waits or downloads: a word to the peers now and then, so their watchdog knows it lives. */
static void eng_keepalive(void *ud)
{
    struct rollout_rank *r = ud;
    if (!r->eng || clock_now_s() - r->keepalive_at < 0.5)
        return;
    int64_t msg[ENG_WORDS] = {ENG_WAIT};
    eng_send(r, msg);
}

/* The head, between broadcast asks: its peers hear it lives, and the control plane's hold. */
static void between_asks(void *ud)
{
    struct rollout_rank *r = ud;
    eng_keepalive(r);
    control_wait_poll(r->env->ctl, false);
}

/* What the group has moved: over MPI, and over NCCL on GPUs (the model's collectives). */
static unsigned long long group_progress(const struct rollout_rank *r)
{
    return comm_progress(r->eng) + (r->eng_dev ? comm_progress(r->eng_dev) : 0);
}

/* A rank of a TP group whose group has moved nothing for the timeout ends itself: a peer is lost, and every
 * collective of the group would wait for it for ever. Time while the run is paused does not count. */
static void *watch_group(void *arg)
{
    struct rollout_rank *r = arg;
    const double limit = r->env->cfg->rollout_tp_group_timeout_s;
    unsigned long long seen = group_progress(r);
    double since = clock_now_s();
    while (!atomic_load(&r->quit)) {
        usleep(200000);
        const unsigned long long now_seen = group_progress(r);
        if (now_seen != seen || control_pause_wanted(r->env->ctl)) {
            seen = now_seen;
            since = clock_now_s();
        } else if (clock_now_s() - since > limit) {
            log_error("rollout",
                      "rollout rank %d: its TP group (engine %d) has moved nothing for %.0f s "
                      "(" KEY_rollout_tp_group_timeout_s "): a peer is lost; ending this rank so that the "
                      "dispatcher grants the group's units to the other groups",
                      r->env->at.dp, r->env->at.engine, limit);
            _exit(4);
        }
    }
    return NULL;
}

/* Between the slices of a wait on a trainer (dataplane_push_until's test). A rank that waits for the trainer to
 * take its batch before (back-pressure: the trainers take a stream's units as their steps need them) holds there
 * while the run is to pause, as at a safe point: a trainer paused at its own takes nothing until the run resumes,
 * so this rank would never reach its next one (the pause waited on it for ever: "1 of 2 workers at a safe
 * point"). Its unit is generated, and it sends it once the run resumes. True when the end has reached this
 * rollout process: a batch on its way, of a unit the trainers no longer wait for, is dropped at once. */
static bool between_send_slices(void *ud)
{
    struct rollout_rank *r = ud;
    if (control_pause_wanted(r->env->ctl) && !r->said_send_hold) {
        log_info("rollout",
                 "held for the pause with a unit to send: the trainer has not yet taken this rank's previous batch (it "
                 "takes batches as its steps need them); the unit goes once the run resumes");
        r->said_send_hold = true;
    }
    control_wait_poll(r->env->ctl, false);
    return work_client_ended(r->work);
}

static int setup(struct rollout_rank *r, char *err, size_t errlen)
{
    const struct grpo_config *c = r->env->cfg;
    if (r->head && !r->env->plane.set) /* the launch hands every rollout process its key */
        return error_set(err, errlen,
                         "rollout rank %d has no data-plane key (from grpod's Assignment.plane_key, or world rank 0 at "
                         "launch): refusing to speak on the data plane unauthenticated",
                         r->env->rank);
    /* connect (and start pinging) first, so the dispatcher knows this rank is coming while the model loads; a TP
     * group is one process to the dispatcher (its slot: the group's index) */
    if (r->head) {
        /* fully-async training: a push is heard within a ping (partial rollout stops there), so they come often */
        const double ping_s = c->async_enable && r->env->heartbeat_s > 0.25 ? 0.25 : r->env->heartbeat_s;
        r->work = work_client_open(r->env->dispatch_endpoint, &r->env->plane, r->env->at.engine, ping_s, err, errlen);
        if (!r->work)
            return -1;
        /* trainer-loss survival: a survivor that takes the lead runs the dispatcher at its own endpoint */
        for (int d = 1; c->trainer_survive_trainer_loss && d < r->env->n_endpoints; d++) {
            char ep[512];
            placement_lead_endpoint(r->env->endpoints[d], ep, sizeof ep);
            if (work_client_also(r->work, ep, err, errlen) != 0)
                return -1;
        }
        work_client_on_chunk(r->work, eng_keepalive, r);
        r->ws = (struct weight_sync_receiver){.work = r->work,
                                              .group = r->env->weight_group,
                                              .gpus_shared = r->env->trainer_gpus_shared || r->env->rollout_gpus_shared,
                                              .wait = between_asks,
                                              .ud = r,
                                              .relay_from = -1};
        if (c->rollout_weight_relay_fanout > 0) { /* the relay tree: this process serves the version it holds */
            char host[256] = "", bind[300];
            if (r->env->advertise[0])
                snprintf(host, sizeof host, "%s", r->env->advertise);
            else
                gethostname(host, sizeof host - 1);
            /* a relay that cannot start (its port taken, say by the live process this one replaces) costs the tree
             * this process, not the run: it fetches every version from the dispatcher */
            char why[512];
            r->ws.relay_dial = r->relay_dial;
            if (relay_endpoints(r->env->dispatch_endpoint, r->env->at.engine, host, bind, r->relay_dial,
                                sizeof r->relay_dial, why, sizeof why) != 0 ||
                !(r->ws.relay = relay_server_open(bind, r->env->at.engine, why, sizeof why)))
                log_warn("rollout", "rollout rank %d serves no weight relay (it fetches every version): %s",
                         r->env->at.engine, why);
            else
                log_info("rollout", "weight relay of rollout rank %d at %s (" KEY_rollout_weight_relay_fanout " %lld)",
                         r->env->at.engine, r->relay_dial, (long long)c->rollout_weight_relay_fanout);
        }
    }
    char bundled[4096];
    const char *path = c->arr_model_path;
    if (!path || !*path) {
        if (model_bundled_path(bundled, sizeof bundled) != 0)
            return error_set(err, errlen,
                             KEY_arr_model_path " is empty and the bundled model is not in %s (fetch it "
                                                "with scripts/fetch_model.sh)",
                             bundled);
        path = bundled;
    }
    char *tools = NULL; /* multi-turn rollouts: the tools' schemas, rendered into the tool agents' prompts */
    if (!(r->policy = model_load(path, err, errlen)) ||
        !(r->tok = prompt_load_tokenizer(path, r->env->cfg->data_apply_chat_template_kwargs,
                                         r->env->cfg->arr_model_custom_chat_template, err, errlen)) ||
        gen_tools_json(c, &tools, err, errlen) != 0)
        return -1;
    const int loaded = prompt_sets_load(c, r->tok, tools, &r->train, &r->val, err, errlen);
    free(tools);
    /* a TP group's peer sends no batch: it scores nothing, so it starts no scorer (a Python one's processes) */
    if (loaded != 0 || (r->head && !(r->reward = reward_create(c, err, errlen))))
        return -1;
    if (r->eng) { /* this rank's shard of the group's model */
        if (model_shard_check(&r->policy->cfg, r->env->at.tp_size,
                              "actor_rollout_ref.rollout.tensor_model_parallel_size", err, errlen) != 0 ||
            (config_rollout_experts_over_tp(c) && model_ep_check(&r->policy->cfg, r->env->at.tp_size, 1, 1,
                                                                 KEY_rollout_expert_parallel_size, err, errlen) != 0))
            return -1;
        const struct model_layout lay = {
            r->env->at.tp, r->env->at.tp_size, 0, 1, r->eng, NULL, NULL, 0, 1, NULL, config_rollout_experts_over_tp(c)};
        struct model *part = model_create_shard(&r->policy->cfg, &lay);
        model_shard_slice(part, r->policy->w.mem, part->w.mem);
        if (part->sh.experts_over_tp)
            log_info("rollout", "TP rank %d of %d generates with experts %d..%d of %d whole (expert parallelism)",
                     r->env->at.tp, r->env->at.tp_size, part->sh.expert_lo, part->sh.expert_lo + part->sh.n_experts - 1,
                     r->policy->cfg.n_experts);
        /* LoRA: the head keeps the whole base and the adapter, merges each version's adapter into a copy of it
         * and hands every TP rank its shard of the merged weights (as without LoRA); the peers hold no adapter */
        if (r->head && (c->arr_model_lora_rank > 0 || c->arr_model_lora_adapter_path[0])) {
            if (lora_attach_config(r->policy, c, path, err, errlen) != 0)
                return -1;
            r->base = r->policy;
        } else {
            model_free(r->policy);
        }
        r->policy = part;
    }
    /* trainer.device=cuda: the rank's GPU (the launch's assign_devices), else the CPU */
    char dev[32] = "cpu";
    if (strcmp(config_device(c), "cuda") == 0)
        snprintf(dev, sizeof dev, "cuda:%d", r->env->device);
    struct kctx *K = model_context_for(dev, c->rollout_dtype, "actor_rollout_ref.rollout.dtype", err, errlen);
    if (!K)
        return -1;
    model_move(&r->policy, K);
    r->ws.K = r->policy->K;
    if (r->eng && K->device != KDEV_CPU) { /* the group's TP collectives over NCCL, in device memory */
        if (r->env->rollout_gpus_shared)
            return error_set(err, errlen,
                             KEY_rollout_tensor_model_parallel_size
                             " %d with " KEY_trainer_device "=cuda: a "
                             "group's TP collectives run over NCCL, which needs a GPU per rank, and some node runs "
                             "more ranks than it has GPUs; give each rank a GPU of its own or set it to 1",
                             r->env->at.tp_size);
        if (!(r->eng_dev = comm_device_group(r->eng, K->device_index)))
            return error_set(err, errlen, "rollout TP with " KEY_trainer_device "=cuda: this build has no NCCL");
        comm_fail_alone(r->eng_dev); /* a lost peer ends this group only, as over MPI */
        model_set_groups(r->policy, r->eng_dev, NULL, r->eng_dev);
    }
    /* LoRA: the same adapter as the trainers' (its values arrive with every policy version) on the frozen base;
     * with TP the head's whole base holds it (above) */
    if (!r->eng && lora_attach_config(r->policy, c, path, err, errlen) != 0)
        return -1;
    if (data_cursor_init(&r->cur, r->train.n, (int)c->data_train_batch_size, c->data_shuffle, (uint64_t)c->data_seed,
                         err, errlen) != 0)
        return -1;
    r->cur_open = true;
    r->cur_step = -1;
    r->version = -1;
    gen_ctx_init(&r->rc, c, r->policy, r->tok, r->reward);
    r->rc.unscored = !r->head;
    /* multi-turn rollouts on a TP group: the head's tools, told to the peers */
    if ((r->head && gen_ctx_load_reward_model(&r->rc, err, errlen) != 0) ||
        gen_ctx_load_env(&r->rc, r->eng, r->head, err, errlen) != 0)
        return -1;
    if (!r->head)
        return 0;
    const char *eps[ROLE_MAX_ENDPOINTS];
    for (int i = 0; i < r->env->n_endpoints; i++)
        eps[i] = r->env->endpoints[i];
    /* trainer-loss survival: every whole unit goes to the lead, whichever trainer leads (dataplane_push_open_any) */
    r->push = c->trainer_survive_trainer_loss
                  ? dataplane_push_open_any(eps, r->env->n_endpoints, &r->env->plane_dp, err, errlen)
                  : dataplane_push_open(eps, r->env->n_endpoints, &r->env->plane_dp, err, errlen);
    if (r->push && r->work)
        dataplane_push_until(r->push, between_send_slices, r);
    return r->push ? 0 : -1;
}

static void teardown(struct rollout_rank *r)
{
    if (r->ws.relay) { /* first: it serves from the buffers freed below */
        log_info("rollout", "weight relay of rollout rank %d: %lld bytes served to other rollout processes",
                 r->env->at.engine, (long long)relay_server_bytes(r->ws.relay));
        relay_server_close(r->ws.relay);
        r->ws.relay = NULL;
    }
    if (r->watching) {
        atomic_store(&r->quit, true);
        pthread_join(r->watchdog, NULL);
    }
    free(r->whole);
    gen_ctx_release(&r->rc);
    if (r->work)
        work_client_close(r->work);
    if (r->push)
        dataplane_push_close(r->push);
    if (r->cur_open)
        data_cursor_free(&r->cur);
    prompt_set_free(&r->train);
    prompt_set_free(&r->val);
    if (r->reward)
        reward_free(r->reward);
    if (r->tok)
        tokenizer_free(r->tok);
    model_free(r->policy);
    model_free(r->base);
    if (r->eng_dev) /* after the model that used it */
        comm_free(r->eng_dev);
    weight_sync_receiver_release(&r->ws);
}

/* The prompt indices of step k into idx (the same the trainers draw): the cursor moves on from the step it drew
 * last, or starts again from the trainers' first step when k is earlier (a unit granted again). */
static void draw_step(struct rollout_rank *r, const struct work_grant *g, int *idx)
{
    if (r->cur_step < g->start || g->step <= r->cur_step) {
        data_cursor_seek(&r->cur, (long)g->start_epoch, (int)g->start_cursor);
        r->cur_step = g->start;
    }
    while (r->cur_step < g->step) {
        data_cursor_next(&r->cur, idx);
        r->cur_step++;
    }
}

/* What one work unit came to: its groups, and the seconds the trainers hear of with them. */
struct unit_result {
    struct step_batch batch;
    int64_t version_first;  /* the version the unit started with (the batch's policy_version) */
    double gen_s, reward_s; /* phases gen and reward */
    double wait_weights_s;  /* waiting for work and weights since the previous unit */
    double wait_send_s;     /* the previous unit's sending (waiting for room at the trainers) */
};

static int take_version(struct rollout_rank *r, int64_t version, char *err, size_t errlen);

/* After each decode step of a fully-async unit: with partial rollout (live), whether a newer version than the one
 * generating is out. For the tests only, GRPO_TEST_DECODE_SLEEP_S=S makes each decode step S seconds longer (a slow
 * engine, so that pushes come while units are generated). */
static bool after_decode(void *ud)
{
    struct rollout_rank *r = ud;
    static double sleep_s = -1;
    clock_test_sleep("GRPO_TEST_DECODE_SLEEP_S", &sleep_s);
    if (!r->env->cfg->async_partial_rollout || r->replaying)
        return false;
    /* with rollout TP the head decides for its group (only it hears the dispatcher), which stops at the same token
     * on every rank: the model's collectives need the whole group */
    int64_t newer = r->head && work_client_latest(r->work) > r->version;
    if (r->eng)
        comm_broadcast_polled(r->eng, &newer, 1, COMM_I64, 0, NULL, NULL);
    return newer != 0;
}

static void reshard_recv(struct rollout_rank *r, int64_t version, size_t bucket);

/* A peer of a TP group at a fully-async unit's phase break: the head's next version, resharded (the head's
 * keep-alive words while it fetches it are passed over). */
static void peer_take_version(struct rollout_rank *r)
{
    const size_t bucket = (size_t)r->env->cfg->rollout_update_weights_bucket_megabytes << 20;
    for (;;) {
        int64_t msg[ENG_WORDS] = {0};
        comm_broadcast_polled(r->eng, msg, ENG_WORDS, COMM_I64, 0, control_wait_poll, r->env->ctl);
        if (msg[ENG_KIND] == ENG_WAIT)
            continue;
        if (msg[ENG_KIND] != ENG_WEIGHTS)
            check_failf(__FILE__, __LINE__,
                        "rollout TP peer: the group's head sent message kind %lld in a unit's phase break, where only "
                        "a policy version can come",
                        (long long)msg[ENG_KIND]);
        control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_WEIGHT_SYNC);
        reshard_recv(r, msg[ENG_VERSION], bucket);
        control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_GEN);
        return;
    }
}

/* Fully-async training: unit g in phases, each with the version the model holds (docs/training.md). Live, with
 * async_training.partial_rollout, a push stops the phase (a newer version is out) and the unit goes on with the
 * newest; a replayed unit switches where its schedule says. The unit's version is the first it took. */
static void generate_phases(struct rollout_rank *r, const struct work_grant *g, const struct prompt_item **prompts,
                            const int *uids, int n_prompts, int first_group, const struct sampler_params *sp,
                            struct unit_result *u)
{
    const struct grpo_config *c = r->env->cfg;
    const int n = (int)c->rollout_n, total = n_prompts * n;
    struct gen_unit ug;
    gen_unit_begin(&r->rc, &ug, prompts, uids, n_prompts, first_group, sp, n,
                   rollout_step_seed((uint64_t)c->data_seed, g->step, 0));
    u->version_first = r->version;
    int *pause_at = xmalloc((size_t)(total ? total : 1) * sizeof(int));
    char err[1024];
    if (g->n_phases > 0 && g->n_replay_tokens != g->n_phases * total)
        check_failf(__FILE__, __LINE__,
                    "chunk %lld unit %d: a replayed schedule of %d phases x %d tokens for %d "
                    "sequences",
                    (long long)g->step, g->unit, g->n_phases, g->n_replay_tokens, total);
    for (int phase = 0;; phase++) {
        if (g->n_phases > 0) { /* replay: this phase's version, until each sequence holds its recorded tokens */
            const bool last = phase >= g->n_phases - 1;
            if (phase > 0 && phase < g->n_phases && !r->head) {
                peer_take_version(r);
            } else if (phase > 0 && phase < g->n_phases) {
                const double t0 = clock_now_s();
                for (bool said = false; take_version(r, g->replay_versions[phase], err, sizeof err) != 0;) {
                    if (!said) /* its version is not out yet: the trainers publish it */
                        log_debug("rollout", "replay: chunk %lld unit %d waits for version %lld (%s)",
                                  (long long)g->step, g->unit, (long long)g->replay_versions[phase], err);
                    said = true;
                    eng_keepalive(r);
                    control_wait_poll(r->env->ctl, false);
                    clock_sleep_s(0.05);
                }
                u->wait_weights_s += clock_now_s() - t0;
            }
            for (int i = 0; i < total; i++)
                pause_at[i] = last ? -1 : g->replay_tokens[phase * total + i];
            r->replaying = 1;
            gen_unit_phase(&r->rc, &ug, r->version, pause_at, after_decode, r); /* the schedule says when it ends */
            r->replaying = 0;
            if (last)
                break;
        } else {
            const int open = gen_unit_phase(&r->rc, &ug, r->version, NULL, after_decode, r);
            if (open == 0)
                break;
            /* paused at a push: the newest version, then on */
            const double t0 = clock_now_s();
            if (!r->head) {
                peer_take_version(r);
                continue;
            }
            const int64_t v = work_client_latest(r->work);
            if (take_version(r, v, err, sizeof err) != 0)
                check_failf(__FILE__, __LINE__, "partial rollout: version %lld: %s", (long long)v, err);
            u->wait_weights_s += clock_now_s() - t0;
            log_debug("rollout", "chunk %lld unit %d: %d trajectories go on with policy version %lld",
                      (long long)g->step, g->unit, open, (long long)v);
        }
    }
    free(pause_at);
    gen_unit_finish(&r->rc, &ug, &u->batch, &u->gen_s, &u->reward_s);
}

/* Phase gen (and reward) of unit g: its share of the step's prompts, generated and scored into u. */
static void generate_unit(struct rollout_rank *r, const struct work_grant *g, struct unit_result *u)
{
    const struct grpo_config *c = r->env->cfg;
    const int B = (int)c->data_train_batch_size;
    int lo, hi;
    dispatch_unit_range(B, g->units, g->unit, &lo, &hi);
    int *idx = xmalloc((size_t)B * sizeof(int));
    draw_step(r, g, idx);
    const struct prompt_item **prompts = xmalloc((size_t)B * sizeof *prompts);
    for (int i = 0; i < B; i++)
        prompts[i] = &r->train.items[idx[i]];
    struct sampler_params sp = {(float)c->rollout_temperature, (float)c->rollout_top_p, (int)c->rollout_top_k};
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_GEN);
    u->version_first = g->version;
    if (c->async_enable)
        generate_phases(r, g, prompts + lo, idx + lo, hi - lo, lo, &sp, u);
    else
        gen_generate_and_score(&r->rc, prompts + lo, idx + lo, hi - lo, lo, &sp, (int)c->rollout_n,
                               rollout_step_seed((uint64_t)c->data_seed, g->step, 0), &u->batch, &u->gen_s,
                               &u->reward_s);
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
    log_debug("rollout", "step %lld unit %d: %d groups (%d..%d) with policy version %lld, gen %.2fs, reward %.2fs",
              (long long)g->step, g->unit, u->batch.n_groups, lo, hi - 1, (long long)g->version, u->gen_s, u->reward_s);
    free(idx), free(prompts);
}

/* The wire header of unit g's batch for trainer DP rank d: where it comes from, and the unit's seconds. */
static struct wire_header unit_header(struct rollout_rank *r, const struct work_grant *g, const struct unit_result *u,
                                      int d)
{
    const struct grpo_config *c = r->env->cfg;
    return (struct wire_header){.step = g->step,
                                .from_rank = r->env->rank,
                                .to_dp = d,
                                .seq_no = ++r->seq_no,
                                .policy_version = u->version_first,
                                .groups_in_step = (int)c->data_train_batch_size,
                                .n = (int)c->rollout_n,
                                .gen_s = u->gen_s,
                                .reward_s = u->reward_s,
                                .idle_s = u->wait_weights_s + u->wait_send_s,
                                .wait_weights_s = u->wait_weights_s,
                                .peak_rss_gb = proc_peak_rss_gb(),
                                .unit = g->unit,
                                .units = g->units};
}

/* Send unit g's groups to the trainer DP ranks, balanced by tokens: one batch to every one (an empty one where no
 * group goes, so each trainer knows the unit is in). Fully-async, the whole unit goes to DP rank 0, whose stream
 * decides which step takes it and cuts it over the DP ranks the same way then; so does it under
 * trainer.survive_trainer_loss (the lead keeps each step's units, for the survivors of a lost trainer to redo the
 * step with: worker/split/split_survive.c). A TP group's head sends; its peers
 * generated along. 0, or -1 with err. */
static int send_unit(struct rollout_rank *r, const struct work_grant *g, const struct unit_result *u, char *err,
                     size_t errlen)
{
    const struct step_batch *b = &u->batch;
    const int n_dp = !r->head                                                                 ? 0
                     : r->env->cfg->async_enable || r->env->cfg->trainer_survive_trainer_loss ? 1
                                                                                              : r->env->n_endpoints;
    int *dp_of = xmalloc((size_t)(b->n_groups ? b->n_groups : 1) * sizeof(int));
    int *sel = xmalloc((size_t)(b->n_groups ? b->n_groups : 1) * sizeof(int));
    if (n_dp > 0)
        step_batch_balance(
            b, n_dp, r->env->cfg->actor_shared_prompt_packing && strcmp(config_device(r->env->cfg), "cpu") == 0, dp_of);
    int rc = 0;
    for (int d = 0; d < n_dp && rc == 0; d++) {
        int ns = 0;
        for (int k = 0; k < b->n_groups; k++)
            if (dp_of[k] == d)
                sel[ns++] = k;
        const struct wire_header h = unit_header(r, g, u, d);
        size_t len;
        uint8_t *msg = wire_pack_batch(&h, b, sel, ns, &r->env->plane_dp, &len);
        const uint64_t counter = plane_cred_last(&r->env->plane_dp); /* this thread alone uses it */
        /* a trainer busy with a long step takes its time: wait, but say so, and give up after an hour; the run
         * ending meanwhile ends the wait */
        for (int tries = 0;; tries++) {
            rc = dataplane_send(r->push, d, msg, len, counter, 60000, err, errlen);
            control_wait_poll(r->env->ctl, true); /* held while it waited (between_send_slices): no more */
            r->said_send_hold = false;
            /* trainer-loss survival: the batch before went to a lead that was lost, and the survivor that leads now
             * refused it (its dispatcher grants the unit anew): that batch is dropped, this one goes */
            if (rc == -2 && r->env->cfg->trainer_survive_trainer_loss && strstr(err, " was not granted to rank ")) {
                log_warn("rollout", "step %lld: %s: the lead changed since; sending this unit's batch",
                         (long long)g->step, err);
                continue;
            }
            if (rc != -1 || tries >= 60 || work_client_ended(r->work))
                break;
            eng_keepalive(r); /* its peers wait for the next word meanwhile */
            log_warn("rollout", "step %lld: trainer DP rank %d has taken no data for %d min; still waiting",
                     (long long)g->step, d, tries + 1);
        }
        free(msg);
    }
    free(dp_of), free(sel);
    return rc;
}

/* For the tests only: GRPO_TEST_HOLD_UNIT=E:S makes rollout TP group E's head hold the first unit it generates S
 * seconds before sending it, alive (its ping thread goes on) but silent about the unit, so the unit outlives its
 * lease and is granted again elsewhere (tests/system/test_lease.sh); E:vV holds it until the trainers have published
 * policy version V (fully-async training: a unit that comes too stale, tests/mpi/test_fully_async.sh). */
static void test_hold_unit(struct rollout_rank *r, const struct work_grant *g)
{
    static bool held;
    const char *v = getenv("GRPO_TEST_HOLD_UNIT");
    if (held || !r->head || !v)
        return;
    char *end;
    const long engine = strtol(v, &end, 10);
    if (end == v || *end != ':')
        return;
    const char *sv = end + 1;
    if (*sv == 'v') { /* E:vV (fully-async training): held until the trainers have published version V */
        const long long v = strtoll(sv + 1, &end, 10);
        if (end == sv + 1 || *end || engine != r->env->at.engine || !r->work)
            return;
        held = true;
        log_warn("rollout", "GRPO_TEST_HOLD_UNIT: holding chunk %lld unit %d until policy version %lld is out",
                 (long long)g->step, g->unit, v);
        while (work_client_latest(r->work) < v && !work_client_ended(r->work))
            clock_sleep_s(0.02);
        return;
    }
    const double s = strtod(sv, &end);
    if (end == sv || *end || engine != r->env->at.engine || !(s > 0))
        return;
    held = true;
    log_warn("rollout", "GRPO_TEST_HOLD_UNIT: holding step %lld unit %d for %.1f s before sending it",
             (long long)g->step, g->unit, s);
    clock_sleep_s(s);
}

/* Unit g: generate it, then send it. The batches report the waiting since the previous unit: for work and
 * weights (waited) and to send (*wait_send, which gets this unit's). 0, or -1 with err. */
static int rollout_unit(struct rollout_rank *r, const struct work_grant *g, double waited, double *wait_send, char *err,
                        size_t errlen)
{
    struct unit_result u = {.wait_weights_s = waited, .wait_send_s = *wait_send};
    generate_unit(r, g, &u);
    test_hold_unit(r, g);
    const double t0 = clock_now_s();
    const int rc = send_unit(r, g, &u, err, errlen);
    *wait_send = clock_now_s() - t0;
    step_batch_free(&u.batch);
    return rc;
}

/* A checkpoint is the trainers' to write: a rollout rank holds nothing that is not in it. */
static int nothing_to_save(void *ud, int64_t step)
{
    (void)ud, (void)step;
    return 0;
}

/* The head, after downloading a version whole: each TP rank's shard of it (the peers' sent in buckets of at
 * most `bucket` bytes, its own sliced in place). Returns the bytes sent to the peers. */
static size_t reshard_send(struct rollout_rank *r, int64_t version, size_t bucket)
{
    int64_t msg[ENG_WORDS] = {ENG_WEIGHTS};
    msg[ENG_VERSION] = version;
    eng_send(r, msg);
    const size_t per = bucket / sizeof(float) > 0 ? bucket / sizeof(float) : 1;
    size_t sent = 0;
    for (int p = 1; p < comm_size(r->eng); p++) {
        const struct model_layout lay = {
            p, comm_size(r->eng), 0, 1, r->eng, NULL, NULL, 0, 1, NULL, config_rollout_experts_over_tp(r->env->cfg)};
        struct model *part = model_create_shard(&r->policy->cfg, &lay);
        model_shard_slice(part, r->whole, part->w.mem);
        for (size_t off = 0; off < part->w.n_floats; off += per) {
            const size_t cnt = part->w.n_floats - off < per ? part->w.n_floats - off : per;
            comm_send(r->eng, part->w.mem + off, cnt, COMM_F32, p);
            sent += cnt * sizeof(float);
        }
        model_free(part);
    }
    float *mine = r->policy->K->device == KDEV_CPU ? r->policy->w.mem : xmalloc(r->policy->w.n_floats * sizeof(float));
    model_shard_slice(r->policy, r->whole, mine);
    if (mine != r->policy->w.mem) { /* on a GPU: sliced in host memory, then up */
        model_weights_from_host(r->policy, mine);
        free(mine);
    }
    return sent;
}

/* A peer: its shard of version `version`, in the head's buckets. */
static void reshard_recv(struct rollout_rank *r, int64_t version, size_t bucket)
{
    const size_t per = bucket / sizeof(float) > 0 ? bucket / sizeof(float) : 1;
    /* over MPI into host memory: on a GPU a host copy first, then up */
    const bool gpu = r->policy->K->device != KDEV_CPU;
    float *dst = gpu ? xmalloc(r->policy->w.n_floats * sizeof(float)) : r->policy->w.mem;
    for (size_t off = 0; off < r->policy->w.n_floats; off += per) {
        const size_t cnt = r->policy->w.n_floats - off < per ? r->policy->w.n_floats - off : per;
        comm_recv(r->eng, dst + off, cnt, COMM_F32, 0);
    }
    if (gpu) {
        model_weights_from_host(r->policy, dst);
        free(dst);
    }
    r->version = version;
}

/* A peer: the head's next word (waiting while it waits, receiving weights when it sends them) as a grant: a
 * unit or the end. */
static void peer_next(struct rollout_rank *r, struct work_grant *g)
{
    const size_t bucket = (size_t)r->env->cfg->rollout_update_weights_bucket_megabytes << 20;
    for (;;) {
        int64_t msg[ENG_WORDS] = {0};
        comm_broadcast_polled(r->eng, msg, ENG_WORDS, COMM_I64, 0, control_wait_poll, r->env->ctl);
        if (msg[ENG_KIND] == ENG_WEIGHTS) {
            control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_WEIGHT_SYNC);
            reshard_recv(r, msg[ENG_VERSION], bucket);
            control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
            continue;
        }
        if (msg[ENG_KIND] == ENG_WAIT)
            continue;
        memset(g, 0, sizeof *g);
        g->kind = msg[ENG_KIND] == ENG_UNIT ? WORK_UNIT : WORK_END;
        g->step = msg[ENG_STEP];
        g->unit = (int)msg[ENG_UNIT_NO];
        g->units = (int)msg[ENG_UNITS];
        g->version = msg[ENG_VERSION];
        g->start = msg[ENG_START];
        g->total_steps = msg[ENG_TOTAL];
        g->start_epoch = msg[ENG_EPOCH];
        g->start_cursor = msg[ENG_CURSOR];
        g->n_phases = (int)msg[ENG_PHASES];
        g->n_replay_tokens = (int)msg[ENG_RTOKENS];
        if (g->kind == WORK_UNIT && g->n_phases > 0) { /* a replayed unit's schedule, as the head got it */
            g->replay_versions = xmalloc((size_t)g->n_phases * sizeof *g->replay_versions);
            g->replay_tokens = xmalloc((size_t)(g->n_replay_tokens > 0 ? g->n_replay_tokens : 1) * sizeof(int32_t));
            comm_broadcast_polled(r->eng, g->replay_versions, (size_t)g->n_phases, COMM_I64, 0, NULL, NULL);
            if (g->n_replay_tokens > 0)
                comm_broadcast_polled(r->eng, g->replay_tokens, (size_t)g->n_replay_tokens, COMM_I32, 0, NULL, NULL);
        }
        snprintf(g->reason, sizeof g->reason, "the group's first rank heard the end");
        return;
    }
}

/* The head: the grant to its peers (a unit or the end). */
static void head_tell(struct rollout_rank *r, const struct work_grant *g)
{
    int64_t msg[ENG_WORDS] = {g->kind == WORK_UNIT ? ENG_UNIT : ENG_END,
                              g->step,
                              g->unit,
                              g->units,
                              g->version,
                              g->start,
                              g->total_steps,
                              g->start_epoch,
                              g->start_cursor,
                              g->kind == WORK_UNIT ? g->n_phases : 0,
                              g->kind == WORK_UNIT ? g->n_replay_tokens : 0};
    eng_send(r, msg);
    if (g->kind == WORK_UNIT && g->n_phases > 0) { /* a replayed unit's schedule: the peers pause where it says */
        comm_broadcast_polled(r->eng, g->replay_versions, (size_t)g->n_phases, COMM_I64, 0, NULL, NULL);
        if (g->n_replay_tokens > 0)
            comm_broadcast_polled(r->eng, g->replay_tokens, (size_t)g->n_replay_tokens, COMM_I32, 0, NULL, NULL);
    }
}

/* The dispatcher's next word: a unit (with its policy version in the model), or the end. Waiting (for the
 * trainers' next version, or while the run is paused) is added to *waited. 0, 1 when the grant went stale before
 * its version could be fetched (ask again), or -1 with err. */
static int next_work_asked(struct rollout_rank *r, struct work_grant *g, double *waited, char *err, size_t errlen);

/* The next grant; the flight recorder keeps the whole wait for it (every ask, the answers to wait and the backoff)
 * as one record against the dispatcher: a rank that waits for a grant says so. */
static int next_work(struct rollout_rank *r, struct work_grant *g, double *waited, char *err, size_t errlen)
{
    const int tok = flight_begin(FLIGHT_OP_WORK_REQUEST, work_client_group(r->work), 0, 0, -1, clock_now_s());
    int rc;
    while ((rc = next_work_asked(r, g, waited, err, errlen)) == 1) /* a stale grant: ask again */
        ;
    flight_end(tok, clock_now_s(), rc != 0);
    return rc;
}

/* For the tests only: GRPO_TEST_HOLD_FETCH=E:FILE makes rollout TP group E's head hold the first grant whose policy
 * version it must fetch while FILE exists (at most 10 minutes); the test freezes the process meanwhile (SIGSTOP:
 * the dispatcher takes it for lost and grants its units elsewhere) until the trainers are two versions on, then
 * removes FILE and wakes it. The fetch then finds the version gone, as after a silent weight relay's timeout on a
 * loaded machine (tests/system/test_lease.sh). */
static void test_hold_fetch(struct rollout_rank *r, const struct work_grant *g)
{
    static bool held;
    const char *v = getenv("GRPO_TEST_HOLD_FETCH");
    char *end;
    if (held || !r->head || !v || strtol(v, &end, 10) != r->env->at.engine || end == v || *end != ':')
        return;
    held = true;
    log_warn("rollout",
             "GRPO_TEST_HOLD_FETCH: holding step %lld unit %d (policy version %lld) while %s exists (pid %d)",
             (long long)g->step, g->unit, (long long)g->version, end + 1, (int)getpid());
    for (const double t0 = clock_now_s(); access(end + 1, F_OK) == 0 && clock_now_s() - t0 < 600;)
        clock_sleep_s(0.02);
}

/* Whether err is the dispatcher's answer that version is no longer held, a newer one being its newest. */
static bool version_gone(const char *err, int64_t version)
{
    const char *at = strstr(err, "is not held (newest ");
    return at && strtoll(at + strlen("is not held (newest "), NULL, 10) > version;
}

static int next_work_asked(struct rollout_rank *r, struct work_grant *g, double *waited, char *err, size_t errlen)
{
    const double t0 = clock_now_s();
    double unanswered_since = 0;
    struct backoff refused;
    backoff_init(&refused, 0.05, 2.0);
    control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
    for (;;) {
        /* pause holds here; stop is the trainers' to decide (the dispatcher says it). Fully-async, the step said is
         * the trainers' newest push (a chunk of the stream is not a step) */
        control_safe_point(r->env->ctl,
                           r->env->cfg->async_enable
                               ? (work_client_latest(r->work) > 0 ? work_client_latest(r->work) : 0)
                               : r->cur_step,
                           nothing_to_save, NULL);
        /* the end heard in a ping: asking a dispatcher that may have closed since would only wait */
        if (work_client_end(r->work, g))
            break;
        char why[1024];
        if (work_client_next(r->work, g, 5000, why, sizeof why) != 0) {
            if (strstr(why, "refused: superseded")) { /* a newer process serves this rank: its work is that one's */
                log_warn("rollout", "%s", why);
                g->kind = WORK_END;
                g->step = 0, g->total_steps = 1; /* stopped here, not finished */
                snprintf(g->reason, sizeof g->reason, "superseded by a newer process of rollout rank %d",
                         r->env->at.engine);
                break;
            }
            /* the end heard in a ping (the answer to this ask lost, or the dispatcher closed since: it closes once
             * every process has said it heard the end) */
            if (work_client_end(r->work, g))
                break;
            /* the dispatcher has a thread of its own and answers while the trainers work: silence for a minute
             * means the trainers are gone (the run ended or failed) */
            if (unanswered_since == 0)
                unanswered_since = clock_now_s();
            if (control_run_finished(r->env->ctl)) { /* it ended while this rank was away: nothing is owed */
                g->kind = WORK_END;
                g->step = g->total_steps = 1;
                snprintf(g->reason, sizeof g->reason, "the run finished while this rank was away (%.150s)", why);
                break;
            }
            /* the trainers close the dispatcher once every rollout process has been told the end, and an end told
             * as the socket closed can be lost: once every step is granted nothing more is owed here, and an
             * endpoint that is gone (no socket file, a refused connection: not a network cut, which only times
             * out) is the trainers' end */
            const bool gone = strstr(why, "no such file or directory") || strstr(why, "connection refused");
            /* under trainer-loss survival a lost lead's dispatcher is gone too, until a survivor takes the lead
             * (the trainers find the loss, re-form and redo the step first): gone that long is the end */
            const double lead_grace_s =
                r->env->cfg->trainer_survive_trainer_loss ? fmax(30.0, 10 * r->env->heartbeat_s) : 0;
            if (!gone)
                r->gone_since = 0;
            else if (r->gone_since == 0)
                r->gone_since = clock_now_s();
            if (r->all_granted && gone && clock_now_s() - r->gone_since >= lead_grace_s) {
                g->kind = WORK_END;
                g->step = g->total_steps = r->total_steps;
                snprintf(g->reason, sizeof g->reason,
                         "the trainers' dispatcher closed after every step to %lld was granted (%.150s)",
                         (long long)r->total_steps, why);
                break;
            }
            /* without grpod, silence for a minute means the trainers are gone. Under grpod the trainers' fate is
             * grpod's word: it ends this rank when a trainer is lost or the run ends, so a rank that cannot reach
             * the trainers (its host's link cut, a partition) waits on while grpod is unreachable too or says the
             * run goes on (a cut longer than a minute used to end the job: issue 40 item 5) */
            const double silent = clock_now_s() - unanswered_since;
            if (silent > 60 && !control_run_goes_on(r->env->ctl))
                return error_set(err, errlen, "%s for %.0f s: the trainers are gone", why, silent);
            if (silent > 60 && !r->said_waiting_on) {
                log_warn("rollout",
                         "the trainers' dispatcher has not answered for %.0f s (%s); waiting on: grpod is unreachable "
                         "or says the run goes on, and ends this rank if a trainer is lost or the run ends",
                         silent, why);
                r->said_waiting_on = true;
            }
            /* refused at once (a full table, a key of an older launch) or timed out: ask again after a delay that
             * grows, with jitter, and say so once per 5 s */
            const double wait = backoff_next(&refused);
            log_warn_every("rollout", "%s; asking again in %.2f s", why, wait);
            clock_sleep_s(wait);
            continue;
        }
        if (r->said_waiting_on)
            log_info("rollout", "the trainers' dispatcher answers again after %.0f s",
                     clock_now_s() - unanswered_since);
        r->said_waiting_on = false;
        unanswered_since = 0;
        backoff_reset(&refused);
        /* (fully-async training: chunks are not steps, and the trainers' end comes as an end) */
        if (g->total_steps > 0 && g->kind != WORK_END && !r->env->cfg->async_enable &&
            g->step >= g->total_steps + (g->kind == WORK_WAIT)) {
            if (g->kind == WORK_WAIT && !r->said_all_granted) /* a unit of the last step, or every one is out */
                log_info("rollout", "every step to %lld is granted, none of it here: waiting for the trainers' end",
                         (long long)g->total_steps);
            r->said_all_granted |= g->kind == WORK_WAIT;
            r->total_steps = g->total_steps, r->all_granted = true;
        }
        if (g->kind != WORK_WAIT)
            break;
        eng_keepalive(r);
        control_wait_poll(r->env->ctl, false);
        clock_sleep_s(0.05);
    }
    control_wait_poll(r->env->ctl, true);
    if (g->kind == WORK_UNIT && g->version != r->version)
        test_hold_fetch(r, g);
    if (g->kind == WORK_UNIT && g->version != r->version && take_version(r, g->version, err, errlen) != 0) {
        /* on-policy, a version the dispatcher no longer holds went by while this rank fetched it (a silent weight
         * relay held it up): the run is past the unit's step, so the unit was granted again elsewhere and done;
         * this grant is stale, and the rank asks for new work */
        if (work_client_end(r->work, g)) /* the trainers ended meanwhile: nothing is owed */
            return 0;
        if (!r->env->cfg->async_enable && version_gone(err, g->version)) {
            log_warn("rollout",
                     "step %lld unit %d: %s: the run is past this unit (granted again elsewhere); asking "
                     "for new work",
                     (long long)g->step, g->unit, err);
            work_grant_release(g);
            *waited += clock_now_s() - t0;
            return 1;
        }
        /* live fully-async training: a version gone by now is replaced by the newest, which the unit takes */
        if (!r->env->cfg->async_enable || g->n_phases > 0)
            return -1;
        const int64_t v = work_client_latest(r->work);
        log_info("rollout", "chunk %lld unit %d: version %lld is gone (%s); it takes the newest, %lld",
                 (long long)g->step, g->unit, (long long)g->version, err, (long long)v);
        if (take_version(r, v, err, errlen) != 0)
            return -1;
        g->version = v;
    }
    *waited += clock_now_s() - t0;
    return 0;
}

/* Load policy version `version` into the model (fetched, or taken in the trainers' broadcast; with TP resharded to
 * the peers). 0, or -1 with err. */
static int take_version(struct rollout_rank *r, int64_t version, char *err, size_t errlen)
{
    const size_t chunk = (size_t)r->env->cfg->rollout_update_weights_bucket_megabytes << 20;
    {
        struct {
            int64_t version;
        } gv = {version}, *g = &gv;
        size_t bytes;
        int chunks;
        const double t1 = clock_now_s();
        control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_WEIGHT_SYNC);
        /* with LoRA a version is the adapter alone: alone the rank's model holds it, with TP the head's base */
        const struct lora *ad = r->base ? r->base->lora : r->policy->lora;
        const size_t n = ad ? ad->n : model_whole_floats(&r->policy->cfg);
        const bool gpu = r->policy->K->device != KDEV_CPU; /* the version arrives in host memory, then goes up */
        if ((r->eng || gpu) && !r->whole)
            r->whole = xmalloc((r->base ? model_whole_floats(&r->policy->cfg) : n) * sizeof(float));
        float *dst = r->base && ad ? ad->mem : r->eng || gpu ? r->whole : ad ? ad->mem : r->policy->w.mem;
        bool took;
        if (weight_sync_receive(&r->ws, g->version, dst, n, chunk, &took, &bytes, &chunks, err, errlen) != 0)
            return -1;
        if (r->base) /* the base with this adapter merged, whole, to reshard */
            lora_merged_weights(r->base, r->whole);
        if (gpu && !r->eng) /* the weights, or with LoRA the adapter, up to the GPU */
            k_to_device(r->policy->K, ad ? ad->mem : r->policy->w.mem, r->whole, n * sizeof(float));
        const double t2 = clock_now_s();
        size_t sent = 0;
        if (r->eng)
            sent = reshard_send(r, g->version, chunk);
        control_set_phase(r->env->ctl, GRPO__PHASE__PHASE_IDLE);
        r->version = g->version;
        char how[64];
        if (took)
            snprintf(how, sizeof how, "in the trainers' broadcast");
        else if (r->ws.relay_from >= 0)
            snprintf(how, sizeof how, "in %d chunk(s) from rollout rank %d's relay", chunks, r->ws.relay_from);
        else
            snprintf(how, sizeof how, "in %d chunk(s)", chunks);
        if (r->eng)
            log_info("rollout",
                     "policy version %lld: %zu bytes %s in %.3fs; resharded to %d TP ranks: %zu bytes to the peers "
                     "in %.3fs",
                     (long long)g->version, bytes, how, t2 - t1, comm_size(r->eng), sent, clock_now_s() - t2);
        else
            log_debug("rollout", "policy version %lld: %zu bytes %s, %.3fs", (long long)g->version, bytes, how,
                      clock_now_s() - t1);
    }
    return 0;
}

int run_rollout(struct role_env *env)
{
    char err[2048];
    struct rollout_rank r = {.env = env, .eng = env->at.tp_size > 1 ? env->rollout_tp : NULL};
    r.head = env->at.tp == 0;
    atomic_init(&r.quit, false);
    int status = 1;
    if (setup(&r, err, sizeof err) != 0 || !r.policy) {
        log_error("rollout", "%s", err);
        control_finish(env->ctl, CONTROL_END_FAILED, err);
        teardown(&r);
        return 2;
    }
    if (r.eng) {
        r.watching = pthread_create(&r.watchdog, NULL, watch_group, &r) == 0;
        log_info("rollout", "rollout rank %d of %d: TP rank %d of %d in rollout TP group %d of %d%s", env->at.dp,
                 env->at.dp_size, env->at.tp, env->at.tp_size, env->at.engine, env->at.engines,
                 r.head ? " (it speaks for the group)" : "");
    }
    log_info("rollout", "rollout rank %d of %d (%s), %d trainer endpoint(s), dispatcher %s", env->at.dp,
             env->at.dp_size,
             env->cfg->async_enable ? (env->cfg->async_partial_rollout ? "fully-async, partial rollout" : "fully-async")
             : env->staleness       ? "one-step-off"
                                    : "on-policy",
             env->n_endpoints, env->dispatch_endpoint);
    double waited = 0, wait_send = 0;
    int units = 0;
    struct work_grant g = {0};
    for (;;) {
        work_grant_release(&g); /* the previous unit's replayed schedule */
        if (!r.head) {
            peer_next(&r, &g);
        } else if (next_work(&r, &g, &waited, err, sizeof err) != 0) {
            log_error("rollout", "%s", err);
            goto out;
        }
        if (r.head && r.eng)
            head_tell(&r, &g);
        if (g.kind == WORK_END)
            break;
        if (rollout_unit(&r, &g, waited, &wait_send, err, sizeof err) != 0) {
            if (r.work && work_client_ended(r.work)) { /* the run ended while this unit was on its way */
                log_info("rollout", "step %lld unit %d: not delivered, and not owed: %s", (long long)g.step, g.unit,
                         err);
                continue;
            }
            log_error("rollout", "%s", err);
            goto out;
        }
        waited = 0;
        units++;
        if (!env->cfg->async_enable)
            control_set_step(env->ctl, g.step, g.total_steps);
        else if (r.work) /* a chunk of the stream is not a step: the trainers' newest push is */
            control_set_step(env->ctl, work_client_latest(r.work) > 0 ? work_client_latest(r.work) : 0, g.total_steps);
    }
    work_grant_release(&g);
    const bool finished = g.step >= g.total_steps;
    log_info("rollout", "%s: %s (%d unit(s) generated here)", finished ? "finished" : "stopped", g.reason, units);
    control_finish(env->ctl, finished ? CONTROL_END_FINISHED : CONTROL_END_STOPPED, NULL);
    status = 0;
out:
    if (status != 0)
        control_finish(env->ctl, CONTROL_END_FAILED, err);
    teardown(&r);
    return status;
}
