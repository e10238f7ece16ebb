/* The trainer's set-up, stage by stage (trainer_create_dist): its layout, the algorithm's settings, the policy loaded,
 * checked against the layout and placed, sequence or context parallelism, LoRA and the reference, the data and the
 * scorers, the optimizer, the run directory, the resume from a checkpoint, ZeRO-1 and the metrics' sinks; and its
 * end (trainer_free). The run loop is trainer.c's, the step trainer_step.c's. */
#include "trainer.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
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
#include "common/log.h"
#include "worker/step/prompts.h"
#include "grad_reduce.h"
#include "zero1.h"
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

/* Achievable sgemm FLOP/s of this process (all its threads: khost_sgemm), measured once: MFU's denominator. */
static double measure_peak_flops(void)
{
    const int n = 384;
    float *a = xcalloc((size_t)n * n, sizeof(float)), *b = xcalloc((size_t)n * n, sizeof(float)),
          *c = xcalloc((size_t)n * n, sizeof(float));
    for (int i = 0; i < n * n; i++)
        a[i] = b[i] = (float)(i % 7) * 0.1f;
    khost_sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n); /* warm */
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = clock_now_s();
        khost_sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n);
        double dt = clock_now_s() - t0;
        if (dt > 0 && 2.0 * n * n * n / dt > best)
            best = 2.0 * n * n * n / dt;
    }
    free(a), free(b), free(c);
    return best > 0 ? best : 1e9;
}

/* One job at a time in a run directory (two submissions of one run.yaml would checkpoint into the same place):
 * the lead rank locks RUN_DIR/run.lock for the run's life (common/dirlock; the kernel drops it when the process
 * ends) and tells every trainer rank the outcome, so that all of them stop at start, naming the other job's
 * host and pid, or none does. */
static int lock_run_dir(struct trainer *t, char *err, size_t errlen)
{
    union {
        int64_t words[80];
        char text[640];
    } msg = {{0}};
    if (trainer_is_lead(t)) {
        char why[600];
        t->run_lock_fd = dirlock_take(t->run_dir, "run.lock", "another job", why, sizeof why);
        if (t->run_lock_fd < 0)
            snprintf(msg.text, sizeof msg.text, "%s", why);
    }
    if (trainer_all_group(t))
        comm_broadcast(trainer_all_group(t), msg.words, sizeof msg.words / sizeof *msg.words, COMM_I64, 0);
    if (!msg.text[0])
        return 0;
    msg.text[sizeof msg.text - 1] = 0;
    return error_set(err, errlen,
                     "the run directory %s; start this job with another " KEY_trainer_experiment_name
                     " (or " KEY_trainer_default_local_dir "), or end the other",
                     msg.text);
}

/* This rank's micro-batch sizes: the _per_gpu keys, or verl's deprecated global keys divided by the DP size,
 * with verl's deprecation notice (once, from the lead rank). */
int trainer_resolve_micro_batches(struct trainer *t, char *err, size_t errlen)
{
    int *out[3] = {
        [CFG_MICRO_ACTOR] = &t->micro_actor, [CFG_MICRO_OLD_LOGP] = &t->micro_old, [CFG_MICRO_REF] = &t->micro_ref};
    for (int w = 0; w < 3; w++) {
        const char *global = NULL;
        char why[512];
        *out[w] = config_micro_batch(t->cfg, (enum cfg_micro)w, t->lay.dp_size, &global, why, sizeof why);
        if (*out[w] < 1)
            return error_set(err, errlen, "%s", why);
        if (global && trainer_is_lead(t))
            log_warn("config",
                     "%s is deprecated (as in verl): it is divided by the %d data-parallel trainer rank%s, %d "
                     "sequences each; give %s_per_gpu=%d instead",
                     global, t->lay.dp_size, t->lay.dp_size == 1 ? "" : "s", *out[w], global, *out[w]);
    }
    return 0;
}

static int64_t compute_total_steps(const struct grpo_config *cfg, int n_train)
{
    return config_total_steps(cfg, n_train);
}

/* verl's MFU denominator on a GPU: the device's dense BF16 tensor-core peak, by name (the first name in the
 * table that the device's contains, so H200 before H20); 0 for a device not listed (no perf/mfu/actor). */
static double device_peak_flops(const struct kctx *K)
{
    static const struct {
        const char *name;
        double flops;
    } peaks[] = {{"H200", 989e12}, {"H100", 989e12}, {"H800", 989e12}, {"H20", 148e12}, {"B200", 2250e12},
                 {"A100", 312e12}, {"A800", 312e12}, {"L40S", 362e12}, {"L40", 181e12}, {"L4", 121e12}};
    char d[256];
    kctx_describe(K, d, sizeof d);
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
        if (strstr(d, peaks[i].name))
            return peaks[i].flops;
    log_warn("trainer", "%s: no BF16 peak known for this device; perf/mfu/actor is not logged", d);
    return 0;
}

/* trainer.device=cuda with other DP ranks: the gradients' group. NCCL where every DP rank has a GPU of its own;
 * where some share one (NCCL refuses two ranks on a GPU), MPI over a host copy. */
void trainer_device_dp_setup(struct trainer *t)
{
    if (!trainer_on_device(t) || t->lay.dp_size < 2)
        return;
    if (!t->lay.gpus_shared)
        t->dp_dev = comm_device_group(t->lay.dp, t->policy->K->device_index);
    if (!t->dp_dev)
        trainer_host_buffer(t);
    if (trainer_is_lead(t))
        log_info("trainer", "%d DP ranks on GPUs: gradients summed %s", t->lay.dp_size,
                 t->dp_dev ? "over NCCL, in device memory"
                           : "over MPI through pinned host memory (some DP ranks share a GPU, and NCCL needs one "
                             "per rank: give each trainer rank a GPU of its own for NCCL)");
}

/* trainer.device=cuda with TP or PP: the policy's TP, PP and TP x PP collectives over NCCL twins of those groups,
 * in device memory (a GPU per trainer rank: NCCL refuses two ranks on one). Must run on every trainer rank in the
 * same order (each twin is made collectively). 0, or -1 with err. */
static int device_mp_setup(struct trainer *t, char *err, size_t errlen)
{
    if (!trainer_on_device(t) || !t->lay.mp)
        return 0;
    if (t->lay.gpus_shared && !t->lay.tp && !t->lay.pp) { /* EP alone: its groups carry host values, but the rows */
        if (trainer_is_lead(t))
            log_info("trainer",
                     "EP %d on GPUs that trainer ranks share: the experts' all-to-alls over MPI through pinned host "
                     "memory (NCCL needs a GPU per rank)",
                     t->lay.ep_size);
        return 0;
    }
    if (t->lay.gpus_shared)
        return error_set(err, errlen,
                         KEY_trainer_device
                         "=cuda with tensor_model_parallel_size %d and pipeline_model_parallel_size %d: "
                         "TP and PP on GPUs run over NCCL, which needs a GPU per trainer rank, and the trainers share "
                         "fewer GPUs here; give each trainer rank a GPU of its own or set " KEY_trainer_device "=cpu",
                         t->lay.tp_size, t->lay.pp_size);
    const int dev = t->policy->K->device_index;
    if (t->lay.tp)
        t->tp_dev = comm_device_group(t->lay.tp, dev);
    if (t->lay.pp)
        t->pp_dev = comm_device_group(t->lay.pp, dev);
    t->mp_dev = t->lay.mp == t->lay.tp ? t->tp_dev : comm_device_group(t->lay.mp, dev);
    if ((t->lay.tp && !t->tp_dev) || (t->lay.pp && !t->pp_dev) || !t->mp_dev)
        return error_set(err, errlen, KEY_trainer_device "=cuda with TP or PP: this build has no NCCL");
    model_set_groups(t->policy, t->tp_dev, t->pp_dev, t->mp_dev);
    if (t->lay.ep) { /* the experts' all-to-alls from device memory (the counts, host values, go over MPI) */
        t->ep_dev = t->lay.ep == t->lay.mp ? t->mp_dev : comm_device_group(t->lay.ep, dev);
        if (!t->ep_dev)
            return error_set(err, errlen, KEY_trainer_device "=cuda with expert parallelism: this build has no NCCL");
        t->policy->sh.ep = t->ep_dev;
        if (trainer_is_lead(t))
            log_info("trainer", "EP %d on GPUs: the experts' dispatch and combine over NCCL, in device memory",
                     t->lay.ep_size);
    }
    if (trainer_is_lead(t) && (t->lay.tp || t->lay.pp))
        log_info("trainer",
                 "TP %d x PP %d on GPUs: activations, gradients and stage hand-offs over NCCL, in device "
                 "memory",
                 t->lay.tp_size, t->lay.pp_size);
    return 0;
}

void trainer_free_model_devices(struct trainer *t)
{
    if (t->mp_dev && t->mp_dev != t->tp_dev)
        comm_free(t->mp_dev);
    if (t->tp_dev)
        comm_free(t->tp_dev);
    if (t->pp_dev)
        comm_free(t->pp_dev);
    t->mp_dev = t->tp_dev = t->pp_dev = NULL;
}

/* overlap_grad_reduce: the DP gradient sum in buckets during the backward, where the sum is one all-reduce of
 * the whole gradient in this rank's memory (not with ZeRO-1's reduce-scatter, TP or PP's shards, LoRA's adapter,
 * or the host staging of GPUs that DP ranks share). ZeRO-1 by its key, not by t->zero (which the key makes, with DP
 * of 2 or more): a spare that joins a re-formed group is set up here before its blocks are made
 * (trainer_snapshot_restore), and must sum as its peers. */
void trainer_overlap_setup(struct trainer *t)
{
    const struct grpo_config *c = t->cfg;
    if (t->lay.dp_size < 2 || !c->actor_ddp_overlap_grad_reduce || c->actor_megatron_use_distributed_optimizer ||
        t->lay.mp || t->lay.cp || t->policy->lora || (trainer_on_device(t) && !t->dp_dev))
        return;
    t->overlap = grad_reducer_create(t->policy, t->dp_dev ? t->dp_dev : t->lay.dp, (size_t)c->actor_ddp_bucket_size);
    if (trainer_is_lead(t))
        log_info("trainer",
                 "DP gradients all-reduced in %d bucket(s) of up to %zu parameters while the backward goes on "
                 "(" KEY_actor_ddp_overlap_grad_reduce ")",
                 grad_reducer_buckets(t->overlap), grad_reducer_largest(t->overlap));
}

/* What expert parallelism does not run with yet, refused by name. 0, or -1 with err. */
static int ep_refusals(const struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *c = t->cfg;
    const long long ep = t->lay.ep_size;
    if (c->trainer_sft_warmup_steps > 0) /* its step sums no gradient over DP: every rank runs every answer */
        return error_set(err, errlen,
                         KEY_actor_megatron_expert_model_parallel_size
                         " %lld with " KEY_trainer_sft_warmup_steps
                         " %lld: the supervised warm-start runs without expert parallelism "
                         "for now; warm-start in a run of its own and resume from its checkpoint with EP",
                         ep, (long long)c->trainer_sft_warmup_steps);
    return 0;
}

/* Tensor and pipeline parallelism: the whole policy, as loaded, is cut into this rank's part (before the
 * reference, gradients and optimizer state exist, so that only the weights are ever held whole). */
static void shard_policy(struct trainer *t)
{
    const struct model_layout ml = {t->lay.tp_rank, t->lay.tp_size, t->lay.pp_rank, t->lay.pp_size,
                                    t->lay.tp,      t->lay.pp,      t->lay.mp,      t->lay.ep_rank,
                                    t->lay.ep_size, t->lay.ep,      false};
    struct model *p = model_create_shard(&t->policy->cfg, &ml);
    model_shard_slice(p, t->policy->w.mem, p->w.mem);
    if (t->lay.ep)
        log_info("trainer",
                 "EP rank %d of %d: experts %d..%d of %d (TP rank %d of %d: their rows %d..%d), stage %d of %d "
                 "(layers %d..%d), %zu of the model's %zu parameters",
                 t->lay.ep_rank, t->lay.ep_size, p->sh.expert_lo, p->sh.expert_lo + p->sh.n_experts - 1,
                 p->cfg.n_experts, t->lay.tp_rank, t->lay.tp_size, p->sh.moe_inter_lo,
                 p->sh.moe_inter_lo + p->sh.moe_inter - 1, t->lay.pp_rank, t->lay.pp_size, p->sh.layer_lo,
                 p->sh.layer_hi - 1, p->w.n_floats, t->policy->w.n_floats);
    else
        log_info("trainer",
                 "TP rank %d of %d, stage %d of %d: %zu of the model's %zu parameters (layers %d..%d, heads %d..%d, "
                 "vocabulary %d..%d)",
                 t->lay.tp_rank, t->lay.tp_size, t->lay.pp_rank, t->lay.pp_size, p->w.n_floats, t->policy->w.n_floats,
                 p->sh.layer_lo, p->sh.layer_hi - 1, p->sh.head_lo, p->sh.head_lo + p->sh.n_heads - 1, p->sh.vocab_lo,
                 p->sh.vocab_hi - 1);
    model_free(t->policy);
    t->policy = p;
}

/* Stage layout: this rank's place among the trainers, the groups it lacks filled in (alone: the zero value). */
static void set_layout(struct trainer *t, const struct trainer_layout *lay)
{
    t->lay = lay ? *lay : (struct trainer_layout){.dp_size = 1};
    if (t->lay.dp_size < 1)
        t->lay.dp_size = 1;
    if (t->lay.tp_size < 1 || !t->lay.tp)
        t->lay.tp_size = 1, t->lay.tp_rank = 0, t->lay.tp = NULL;
    if (t->lay.pp_size < 1 || !t->lay.pp)
        t->lay.pp_size = 1, t->lay.pp_rank = 0, t->lay.pp = NULL;
    if (t->lay.ep_size < 1 || !t->lay.ep)
        t->lay.ep_size = 1, t->lay.ep_rank = 0, t->lay.ep = t->lay.edp = t->lay.etp = NULL;
    if (!t->lay.tp)
        t->lay.etp = NULL;
    /* the experts of one model copy are spread over the EP group (and each over TP: EP x TP); with PP over the
     * stages' EP groups (and their TP ranks), the layout's mp */
    if (t->lay.ep && !t->lay.pp)
        t->lay.mp = t->lay.etp ? t->lay.etp : t->lay.ep;
    if (!t->lay.mp)
        t->lay.mp = t->lay.tp;
    if (t->lay.cp_size < 2 || !t->lay.cp)
        t->lay.cp_size = 1, t->lay.cp_rank = 0, t->lay.cp = NULL, t->lay.grads = NULL;
    if (!t->lay.all)
        t->lay.all = t->lay.dp; /* data parallelism alone: the DP group is every trainer */
}

/* Stage algorithm: advantage estimator, policy loss, rollout correction, threads, micro-batches. 0, or -1 (err). */
static int setup_algorithm(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    t->est = (enum adv_estimator)adv_estimator_from_name(cfg->alg_adv_estimator);
    if (t->est == ADV_GDPO) { /* checked by config_validate */
        char why[256];
        t->gdpo_n = config_gdpo_keys(cfg, t->gdpo_keys, t->gdpo_w, why, sizeof why);
        t->gdpo_n = t->gdpo_n > 0 ? t->gdpo_n : 0;
    }
    t->agg = (enum loss_agg)loss_agg_from_name(cfg->actor_loss_agg_mode);
    t->kl_reward_type = (enum kl_type)kl_type_from_name(cfg->alg_kl_penalty);
    t->loss = (struct policy_loss_params){
        .clip_low = config_clip_low(cfg),
        .clip_high = config_clip_high(cfg),
        .clip_c = cfg->actor_clip_ratio_c,
        .use_kl_loss = cfg->actor_use_kl_loss,
        .kl_type = (enum kl_type)kl_type_from_name(cfg->actor_kl_loss_type),
        .kl_coef = cfg->actor_kl_loss_coef,
        .entropy_coeff = cfg->actor_entropy_coeff,
        .mode = (enum loss_mode)loss_mode_from_name(cfg->actor_policy_loss_mode),
        .tau_pos = cfg->actor_tau_pos,
        .tau_neg = cfg->actor_tau_neg,
        .clip_cov_ratio = cfg->actor_policy_loss_clip_cov_ratio,
        .clip_cov_lb = cfg->actor_policy_loss_clip_cov_lb,
        .clip_cov_ub = cfg->actor_policy_loss_clip_cov_ub,
        .kl_cov_ratio = cfg->actor_policy_loss_kl_cov_ratio,
        .ppo_kl_coef = cfg->actor_policy_loss_ppo_kl_coef,
        .dro_beta = cfg->actor_policy_loss_dro_beta,
        .agg = t->agg,
    };
    if (rollout_corr_parse(cfg->alg_rc_rollout_is, cfg->alg_rc_rollout_is_threshold,
                           cfg->alg_rc_rollout_is_batch_normalize, cfg->alg_rc_rollout_rs,
                           cfg->alg_rc_rollout_rs_threshold, cfg->alg_rc_bypass_mode, cfg->alg_rc_loss_type, &t->corr,
                           err, errlen) != 0)
        return -1;
    if (t->corr.bypass)
        t->loss.bypass = &t->corr;
    if (cfg->trainer_num_threads > 0)
        khost_set_threads((int)cfg->trainer_num_threads);
    if (trainer_resolve_micro_batches(t, err, errlen) != 0)
        return -1;
    return 0;
}

/* Stage model: the policy loaded whole from model.path or the bundled model (*model_path). 0, or -1 (err). */
static int load_policy(struct trainer *t, char *bundled, size_t bundled_len, const char **model_path, char *err,
                       size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    *model_path = cfg->arr_model_path;
    if (!*model_path || !**model_path) {
        if (model_bundled_path(bundled, bundled_len) != 0) {
            error_set(err, errlen,
                      KEY_arr_model_path " is empty and the bundled model is not in %s "
                                         "(fetch it with scripts/fetch_model.sh)",
                      bundled);
            return -1;
        }
        *model_path = bundled;
    }
    char kern[256];
    if (trainer_is_lead(t))
        log_info("trainer", "kernels: %s", khost_blas_kernels(kern, sizeof kern));
    if (trainer_is_lead(t) && khost_blas_kernels_better())
        log_warn("trainer",
                 "OPENBLAS_CORETYPE=%s names older kernels than this CPU runs (%s, about 2x faster GEMMs where "
                 "measured: docs/results/performance.md); unset it to let the kernels be chosen for the CPU",
                 getenv("OPENBLAS_CORETYPE"), khost_blas_kernels_better());
    log_info("trainer", "loading %s", *model_path);
    t->policy = model_load(*model_path, err, errlen);
    if (!t->policy)
        return -1;
    return 0;
}

/* Stage checks: the policy against TP, PP and EP, cut to this rank's part, its MoE settings. 0, or -1 (err). */
static int check_policy(struct trainer *t, const char *model_path, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    if (model_shard_check(&t->policy->cfg, t->lay.tp_size,
                          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", err, errlen) != 0 ||
        model_stage_check(&t->policy->cfg, t->lay.pp_size,
                          "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size", err, errlen) != 0 ||
        model_ep_check(&t->policy->cfg, t->lay.ep_size, t->lay.tp_size, t->lay.pp_size,
                       "actor_rollout_ref.actor.megatron.expert_model_parallel_size", err, errlen) != 0)
        return -1;
    if (t->lay.ep && ep_refusals(t, err, errlen) != 0)
        return -1;
    if (t->lay.mp)
        shard_policy(t);
    t->policy->moe_aux_coef = (float)cfg->actor_moe_aux_loss_coeff;
    t->policy->moe_replay = strcmp(cfg->actor_router_replay_mode, "R3") == 0;
    if (!t->policy->cfg.n_experts && (t->policy->moe_replay || cfg->rollout_enable_routing_replay)) {
        snprintf(err, errlen, "%s: routing replay needs a mixture-of-experts model; %s is dense (no router)",
                 t->policy->moe_replay ? KEY_actor_router_replay_mode "=R3" : KEY_rollout_enable_routing_replay "=true",
                 model_path);
        return -1;
    }
    return 0;
}

/* Stage device: the policy in its context (precision, device), the model copy's device groups. 0, or -1 (err). */
static int place_policy(struct trainer *t, bool with_layout, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    /* the policy's precision (and the reference's: a clone shares the context) */
    char dev[32]; /* with other ranks, the GPU grpo_worker gave this one (trainer_layout.device) */
    snprintf(dev, sizeof dev, "%s", config_device(cfg));
    if (with_layout && strcmp(dev, "cuda") == 0)
        snprintf(dev, sizeof dev, "cuda:%d", t->lay.device);
    struct kctx *K = model_context_for(dev, cfg->actor_dtype, "actor_rollout_ref.actor.dtype", err, errlen);
    if (!K)
        return -1;
    model_move(&t->policy, K);
    if (device_mp_setup(t, err, errlen) != 0)
        return -1;
    return 0;
}

/* Stage parallel groups: sequence (Ulysses) or context (ring) parallelism over the CP group. 0, or -1 (err). */
static int setup_seq_parallel(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    struct kctx *K = t->policy->K;
    /* context parallelism (Megatron's): the same group, ring attention instead of the all-to-all */
    const bool ring = t->lay.cp && cfg->actor_megatron_context_parallel_size > 1;
    if (t->lay.cp) { /* Ulysses: every rank of the group runs a slice of each micro-batch's tokens */
        const char *key = ring ? "actor_rollout_ref.actor.megatron.context_parallel_size"
                               : "actor_rollout_ref.actor.ulysses_sequence_parallel_size";
        if ((ring ? model_cp_check(&t->policy->cfg, t->lay.cp_size, key, err, errlen)
                  : model_sp_check(&t->policy->cfg, t->lay.cp_size, t->lay.tp_size, key,
                                   "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", err, errlen)) != 0)
            return -1;
        if (ring)
            model_set_cp(t->policy, t->lay.cp);
        else
            model_set_sp(t->policy, t->lay.cp);
        /* on GPUs of their own, the all-to-all or the ring from device memory over the group's NCCL twin; where
         * ranks share a GPU, over MPI through pinned host memory (the model's paths stage it) */
        if (K->device != KDEV_CPU && !t->lay.gpus_shared &&
            (t->cp_dev = comm_device_group(t->lay.cp, K->device_index)) != NULL) {
            if (ring)
                model_set_cp(t->policy, t->cp_dev);
            else
                model_set_sp(t->policy, t->cp_dev);
        }
        if (K->device != KDEV_CPU && trainer_is_lead(t))
            log_info("trainer", "%s=%d on GPUs: its %s over %s", key, t->lay.cp_size, ring ? "K/V ring" : "all-to-all",
                     t->cp_dev ? "NCCL, in device memory"
                               : "MPI through pinned host memory (NCCL needs a GPU per rank)");
        /* with TP, a rank's heads are its TP rank's (heads / TP of them) */
        const int heads = t->policy->sh.n_heads, all = t->policy->cfg.n_heads;
        char of[96] = "";
        if (t->lay.tp_size > 1)
            snprintf(of, sizeof of, " (its TP rank's, of %d over TP %d)", all, t->lay.tp_size);
        if (ring && trainer_is_lead(t))
            log_info("trainer",
                     "context parallelism over %d ranks: each holds chunks r and %d-r of every micro-batch's row cut "
                     "into %d, and attends over the ring with all %d query heads%s",
                     t->lay.cp_size, 2 * t->lay.cp_size - 1, 2 * t->lay.cp_size, heads, of);
        else if (trainer_is_lead(t))
            log_info("trainer",
                     "sequence parallelism (Ulysses) over %d ranks: each runs 1/%d of every micro-batch's tokens and "
                     "attends with %d of the %d query heads%s",
                     t->lay.cp_size, t->lay.cp_size, heads / t->lay.cp_size, heads, of);
    }
    return 0;
}

/* Stage LoRA: activation offload, the adapter, the reference (a clone, or LoRA's base), the tokenizer. 0, or -1. */
static int setup_lora_ref_tokenizer(struct trainer *t, const char *model_path, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    model_set_activation_offload(t->policy, cfg->arr_model_enable_activation_offload);
    if (cfg->arr_model_enable_activation_offload && !cfg->arr_model_enable_gradient_checkpointing && trainer_is_lead(t))
        log_warn("trainer", KEY_arr_model_enable_activation_offload
                 "=true acts with "
                 "enable_gradient_checkpointing=true (it offloads the layer inputs checkpointing keeps); "
                 "without it every activation stays on the device");
    if (lora_attach_config(t->policy, cfg, model_path, err, errlen) != 0)
        return -1;
    char targets[128], moe[192];
    if (t->policy->lora && trainer_is_lead(t))
        log_info("trainer",
                 "LoRA: rank %d, alpha %g (scale %g) on %s%s: %zu trainable parameters, the %zu of the base frozen; "
                 "the reference policy is the base model",
                 t->policy->lora->cfg.rank, t->policy->lora->cfg.alpha, (double)t->policy->lora->scale,
                 lora_targets_text(t->policy->lora->cfg.targets, targets, sizeof targets),
                 lora_moe_text(t->policy, moe, sizeof moe), t->policy->lora->n, t->policy->w.n_floats);
    if ((cfg->actor_use_kl_loss || cfg->alg_use_kl_in_reward) && !t->policy->lora) {
        t->ref = model_clone(t->policy); /* with LoRA the reference is the base: the policy, adapter bypassed */
    }
    t->tok = prompt_load_tokenizer(model_path, cfg->data_apply_chat_template_kwargs,
                                   cfg->arr_model_custom_chat_template, err, errlen);
    if (!t->tok)
        return -1;
    return 0;
}

/* Multi-turn rollouts where this trainer generates (its validation, one process): a model copy split over TP x PP
 * ranks generates as one (its group; *head on its first rank, which runs the tools); with EP DP rank 0 validates
 * alone on the whole model (NULL). A source that validates (colocated ranks) makes its engines' own environment. */
struct comm *trainer_env_group(const struct trainer *t, bool *head)
{
    *head = t->lay.tp_rank == 0 && t->lay.pp_rank == 0;
    return !t->policy->sh.ep && (t->policy->sh.tp || t->policy->sh.pp) ? t->lay.mp : NULL;
}

/* Stage data and scorers: prompts, scorers, generation context, every data_source scored. 0, or -1 (err). */
static int load_data_scorers(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    char *tools = NULL; /* multi-turn rollouts: the tools' schemas, rendered into the tool agents' prompts */
    if (gen_tools_json(cfg, &tools, err, errlen) != 0)
        return -1;
    const int loaded = prompt_sets_load(cfg, t->tok, tools, &t->train, &t->val, err, errlen);
    free(tools);
    if (loaded != 0)
        return -1;
    t->reward = reward_create(cfg, err, errlen);
    if (!t->reward)
        return -1;
    gen_ctx_init(&t->rc, cfg, t->policy, t->tok, t->reward);
    /* the reward model, where this process generates: one process, or the trainers that validate */
    if (t->lay.dp_rank == 0 && gen_ctx_load_reward_model(&t->rc, err, errlen) != 0)
        return -1;
    const struct model *p = t->policy;
    if (p->sh.ep && (p->sh.tp || p->sh.pp) && gen_multi_turn(cfg))
        return error_set(err, errlen,
                         "multi-turn rollouts with " KEY_actor_megatron_expert_model_parallel_size
                         " and tensor or pipeline parallelism in the trainer are not available yet");
    bool head;
    struct comm *group = trainer_env_group(t, &head);
    if (!t->src.validate && gen_ctx_load_env(&t->rc, group, head, err, errlen) != 0)
        return -1;
    const bool rules = !cfg->rm_enable || cfg->rm_rule_reward_weight != 0; /* a reward model alone needs none */
    for (int i = 0; rules && i < t->train.n; i++)
        if (!reward_supports(t->reward, t->train.items[i].data_source)) {
            error_set(err, errlen, "%s: no scorer for data_source '%s' (see docs/rewards.md)", t->train.name,
                      t->train.items[i].data_source);
            return -1;
        }
    return 0;
}

/* The learning-rate schedule from the optimizer's keys (verl's FSDP and Megatron ones), over the run's steps. 0, or
 * -1 (err) where Megatron's scheduler would refuse it. */
static int lr_schedule_set(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *c = t->cfg;
    const int64_t grpo_steps = t->st.total_steps - c->trainer_sft_warmup_steps;
    struct lr_schedule *s = &t->lr;
    s->style = (enum lr_style)lr_style_named(c->actor_optim_warmup_style);
    s->wsd_style = (enum lr_wsd_style)lr_wsd_style_named(c->actor_optim_lr_wsd_decay_style);
    s->lr = c->actor_optim_lr;
    s->init_lr = c->actor_optim_lr_warmup_init;
    s->min_lr = c->actor_optim_min_lr > 0 ? c->actor_optim_min_lr : c->actor_optim_min_lr_ratio * c->actor_optim_lr;
    s->decay_steps = c->actor_optim_lr_decay_steps > 0 ? c->actor_optim_lr_decay_steps : t->st.total_steps;
    s->wsd_steps = c->actor_optim_lr_wsd_decay_steps;
    /* a warm-up given as a ratio: of the decay's steps (Megatron's), which are the run's GRPO steps by default */
    s->warmup =
        c->actor_optim_lr_warmup_steps >= 0
            ? c->actor_optim_lr_warmup_steps
            : (int64_t)(c->actor_optim_lr_warmup_steps_ratio *
                        (double)(c->actor_optim_lr_decay_steps > 0 ? c->actor_optim_lr_decay_steps : grpo_steps));
    if (c->actor_optim_lr_decay_steps > 0 && s->warmup >= s->decay_steps) {
        error_set(err, errlen,
                  KEY_actor_optim_lr_decay_steps "=%lld: the warm-up (%lld steps) must end before the decay does",
                  (long long)s->decay_steps, (long long)s->warmup);
        return -1;
    }
    if (s->style == LR_WSD && s->wsd_steps > s->decay_steps) {
        error_set(err, errlen,
                  KEY_actor_optim_lr_wsd_decay_steps
                  "=%lld: longer than the decay (%lld steps, " KEY_actor_optim_lr_decay_steps " or the run's steps)",
                  (long long)s->wsd_steps, (long long)s->decay_steps);
        return -1;
    }
    return 0;
}

/* Stage optimizer: data cursor, AdamW's moments, run state, MFU peak, gradient device groups. 0, or -1 (err). */
static int setup_optimizer(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    if (data_cursor_init(&t->cursor, t->train.n, config_gen_batch_size(cfg), cfg->data_shuffle,
                         (uint64_t)cfg->data_seed, err, errlen) != 0)
        return -1;
    t->cursor_open = true;
    /* AdamW's moments beside the weights: host memory on the CPU, the GPU's with trainer.device=cuda */
    t->opt = adamw_create_on(trainer_on_device(t) ? t->policy->K : kctx_cpu(), model_trainable(t->policy).n,
                             cfg->actor_optim_betas.v[0], cfg->actor_optim_betas.v[1], cfg->actor_optim_eps,
                             cfg->actor_optim_weight_decay);
    t->st.seed = (uint64_t)cfg->data_seed;
    t->st.config_digest = config_digest(cfg);
    t->st.total_steps = compute_total_steps(cfg, t->train.n) + cfg->trainer_sft_warmup_steps;
    if (lr_schedule_set(t, err, errlen) != 0)
        return -1;
    t->peak_flops = trainer_on_device(t) ? device_peak_flops(t->policy->K) : measure_peak_flops();
    trainer_device_dp_setup(t);
    if (trainer_on_device(t) &&
        (t->lay.ep || t->lay.cp)) /* EP's expert sums, DP x CP's: MPI groups, through the host */
        trainer_host_buffer(t);
    if (trainer_on_device(t) && t->lay.grads && !t->lay.gpus_shared) /* DP x CP's sums over NCCL, in device memory */
        t->grads_dev = comm_device_group(t->lay.grads, t->policy->K->device_index);
    if (trainer_on_device(t) && t->lay.edp && comm_size(t->lay.edp) > 1 &&
        !t->lay.gpus_shared) /* the experts' the same */
        t->edp_dev = comm_device_group(t->lay.edp, t->policy->K->device_index);
    t->share_prompts = cfg->actor_shared_prompt_packing && !trainer_on_device(t) && !t->policy->sh.ring;
    if (cfg->actor_shared_prompt_packing && t->policy->sh.ring && trainer_is_lead(t))
        log_info("trainer", "context parallelism packs every sequence whole (ring attention has no shared "
                            "prompts; " KEY_actor_shared_prompt_packing " does not apply)");
    if (cfg->actor_shared_prompt_packing && trainer_on_device(t) && trainer_is_lead(t))
        log_info("trainer", "shared-prompt packing has no CUDA kernel yet: every sequence is packed whole on the "
                            "GPU (" KEY_actor_shared_prompt_packing " applies on the CPU)");
    return 0;
}

/* Stage run directory: made and locked (run.lock). 0, or -1 with err. */
static int open_run_dir(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    snprintf(t->run_dir, sizeof t->run_dir, "%s/%s/%s", cfg->trainer_default_local_dir, cfg->trainer_project_name,
             cfg->trainer_experiment_name);
    snprintf(t->ckpt_root, sizeof t->ckpt_root, "%s/checkpoints", t->run_dir);
    if (fs_mkdir_p(t->run_dir) != 0) {
        error_set(err, errlen, "%s: cannot create run directory: %s", t->run_dir, check_errno_text());
        return -1;
    }
    if (lock_run_dir(t, err, errlen) != 0)
        return -1;
    return 0;
}

/* Stage resume (trainer.resume_mode): weights, optimizer, run state, cursor, reference; t->resumed_from. 0, or -1. */
static int resume_checkpoint(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    char resume[4096] = "";
    if (strcmp(cfg->trainer_resume_mode, "resume_path") == 0)
        snprintf(resume, sizeof resume, "%s", cfg->trainer_resume_from_path);
    else if (strcmp(cfg->trainer_resume_mode, "auto") == 0 &&
             checkpoint_find_latest(t->ckpt_root, resume, sizeof resume) != 0)
        resume[0] = 0;
    if (resume[0]) {
        struct run_state st;
        if (trainer_load_checkpoint(t, resume, &st, err, errlen) != 0)
            return -1;
        if (st.config_digest != t->st.config_digest)
            log_warn("trainer", "resuming %s with a configuration that differs from the one it was written with",
                     resume);
        t->st.global_step = st.global_step;
        t->st.epoch = st.epoch;
        t->st.cursor = st.cursor;
        t->st.seed = st.seed;
        data_cursor_seek(&t->cursor, (long)st.epoch, (int)st.cursor);
        if (t->ref && cfg->trainer_sft_warmup_steps > 0 && st.global_step >= cfg->trainer_sft_warmup_steps) {
            char refdir[2300];
            snprintf(refdir, sizeof refdir, "%s/reference", t->run_dir);
            struct model *r = model_load_hf(refdir, err, errlen);
            if (!r)
                return -1;
            model_move(&r, t->policy->K); /* the reference computes where and as the policy does */
            model_free(t->ref);
            t->ref = r;
        }
        snprintf(t->resumed_from, sizeof t->resumed_from, "%s", resume);
        log_info("trainer", "resumed from %s at step %lld", resume, (long long)st.global_step);
    }
    return 0;
}

/* Stage ZeRO-1: this rank keeps its block of the optimizer state over the ranks summing gradients. 0, or -1 (err). */
static int setup_zero1(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    /* ZeRO-1 shards over the ranks whose gradients add up: DP, or DP x CP with sequence or context parallelism
     * (every rank of a CP group holds the whole model and its part of each gradient) */
    struct comm *zg = t->lay.grads ? t->lay.grads : t->lay.dp;
    if (cfg->actor_megatron_use_distributed_optimizer && zg && comm_size(zg) > 1) {
        /* ZeRO-1: this rank keeps its block of the (whole, possibly just loaded) optimizer state */
        struct comm *zg_dev = t->lay.grads ? t->grads_dev : t->dp_dev; /* its NCCL twin on GPUs */
        struct comm *edp = t->edp_dev ? t->edp_dev : t->lay.edp;
        if (trainer_on_device(t) && (!zg_dev || (t->lay.edp && comm_size(t->lay.edp) > 1 && !t->edp_dev))) {
            error_set(err, errlen,
                      KEY_actor_megatron_use_distributed_optimizer
                      "=true with " KEY_trainer_device "=cuda: "
                      "ZeRO-1 on GPUs runs over NCCL, which needs a GPU per trainer rank, and %d %s ranks share "
                      "fewer GPUs here; give each trainer rank a GPU of its own or set it to false",
                      comm_size(zg), t->lay.grads ? "DP x CP" : "DP");
            return -1;
        }
        /* expert parallelism: the dense parameters over DP, the experts over the ranks holding the same ones */
        struct comm *zz = trainer_on_device(t) ? zg_dev : zg;
        t->zero = t->lay.ep ? zero1_create_ep(t->opt->K, zz, edp, t->policy)
                            : zero1_create(t->opt->K, zz, model_trainable(t->policy).n);
        struct adamw *block = zero1_shard(t->zero, t->opt);
        adamw_free(t->opt);
        t->opt = block;
        if (t->zero->ep)
            log_info("trainer",
                     "ZeRO-1 with EP: DP rank %d keeps the optimizer state of %zu of this EP rank's %zu parameters "
                     "(dense ones over DP, experts over the %d DP ranks holding the same experts)",
                     comm_rank(zg), block->n, t->zero->n, t->lay.edp ? comm_size(t->lay.edp) : 1);
        else
            log_info("trainer", "ZeRO-1: %s rank %d keeps the optimizer state of parameters %zu..%zu (%.2f GB of %.2f)",
                     t->lay.grads ? "DP x CP" : "DP", comm_rank(zg), t->zero->lo, t->zero->hi,
                     8.0 * (double)block->n / 1e9, 8.0 * (double)t->zero->n / 1e9);
    }
    return 0;
}

/* Stage sinks: the metrics' sinks (trainer.logger) opened on the lead rank, the run announced. 0, or -1 (err). */
static int open_sinks(struct trainer *t, char *err, size_t errlen)
{
    const struct grpo_config *cfg = t->cfg;
    /* a failed write of an earlier run in this process (tests run several) is not this run's */
    metrics_output_failure_reset();
    /* steps logged after the checkpoint we resume from are forgotten: they are redone */
    /* trainer.logger picks the console and TensorBoard; metrics.jsonl and the SVG chart are always written (grpoctl
     * and resumption read them); a remote sink gets one notice */
    unsigned want = 0;
    char skipped[256];
    struct cfg_error cerr;
    if (config_logger_sinks(cfg, &want, skipped, sizeof skipped, &cerr) != 0) {
        error_set(err, errlen, "%s", cerr.msg);
        return -1;
    }
    unsigned sinks = METRICS_SINK_JSONL | METRICS_SINK_SVG;
    if (want & CFG_LOG_CONSOLE)
        sinks |= METRICS_SINK_CONSOLE;
    if (want & CFG_LOG_TENSORBOARD)
        sinks |= METRICS_SINK_TENSORBOARD;
    if (trainer_is_lead(t) && skipped[0]) {
        char *save = NULL;
        for (char *s = strtok_r(skipped, ", ", &save); s; s = strtok_r(NULL, ", ", &save))
            log_info("trainer", KEY_trainer_logger ": %s skipped (no %s client here); metrics go to %s/metrics.jsonl",
                     s, s, t->run_dir);
    }
    if (trainer_is_lead(t) &&
        metrics_logger_open(&t->logger, t->run_dir, sinks, (long)t->st.total_steps,
                            t->resumed_from[0] ? (long)t->st.global_step : -1, cfg->trainer_experiment_name) != 0) {
        error_set(err, errlen, "%s: cannot open the metrics files", t->run_dir);
        return -1;
    }
    t->logger_open = trainer_is_lead(t);
    t->logger_sinks = sinks;
    log_info("trainer",
             "run %s: %d train / %d val prompts, %lld steps (%lld done), batch %lld prompts x %lld responses, "
             "%zu parameters",
             t->run_dir, t->train.n, t->val.n, (long long)t->st.total_steps, (long long)t->st.global_step,
             cfg->data_train_batch_size, cfg->rollout_n, model_num_params(t->policy));
    return 0;
}

struct trainer *trainer_create_dist(const struct grpo_config *cfg, const struct trainer_hooks *hooks,
                                    const struct trainer_layout *lay, const struct trainer_source *src, char *err,
                                    size_t errlen)
{
    struct trainer *t = xcalloc(1, sizeof *t);
    t->run_lock_fd = -1;
    t->cfg = cfg;
    t->saved_step = -1;
    t->peer_failed_rank = -1;
    if (hooks)
        t->hooks = *hooks;
    set_layout(t, lay);
    if (src)
        t->src = *src; /* its ctx goes with the trainer from here (release) */
    if (!t->src.next_batch) {
        error_set(err, errlen, "a trainer needs a step source (struct trainer_source with next_batch)");
        goto fail;
    }
    char bundled[4096]; /* the bundled model's path, when it is the one loaded */
    const char *model_path = NULL;
    if (setup_algorithm(t, err, errlen) != 0 ||
        load_policy(t, bundled, sizeof bundled, &model_path, err, errlen) != 0 ||
        check_policy(t, model_path, err, errlen) != 0 || place_policy(t, lay != NULL, err, errlen) != 0 ||
        setup_seq_parallel(t, err, errlen) != 0 || setup_lora_ref_tokenizer(t, model_path, err, errlen) != 0 ||
        load_data_scorers(t, err, errlen) != 0 || setup_optimizer(t, err, errlen) != 0 ||
        open_run_dir(t, err, errlen) != 0 || resume_checkpoint(t, err, errlen) != 0 || setup_zero1(t, err, errlen) != 0)
        goto fail;
    trainer_overlap_setup(t);
    if (open_sinks(t, err, errlen) != 0)
        goto fail;
    return t;
fail:
    trainer_free(t);
    return NULL;
}

void trainer_free(struct trainer *t)
{
    if (!t)
        return;
    if (t->run_lock_fd >= 0)
        close(t->run_lock_fd); /* releases run.lock */
    if (t->logger_open)
        metrics_logger_close(&t->logger);
    model_free(t->policy);
    model_free(t->ref);
    for (int k = 0; k < t->gdpo_n; k++)
        free(t->gdpo_keys[k]);
    if (t->tok)
        tokenizer_free(t->tok);
    adamw_free(t->opt);
    zero1_free(t->zero);
    grad_reducer_free(t->overlap);
    if (t->dp_dev)
        comm_free(t->dp_dev);
    if (t->ep_dev && t->ep_dev != t->mp_dev)
        comm_free(t->ep_dev);
    if (t->cp_dev)
        comm_free(t->cp_dev);
    if (t->grads_dev)
        comm_free(t->grads_dev);
    if (t->edp_dev)
        comm_free(t->edp_dev);
    trainer_free_model_devices(t);
    if (t->host_params)
        karena_release(&t->host_stage);
    gen_ctx_release(&t->rc);
    if (t->reward)
        reward_free(t->reward);
    if (t->cursor_open)
        data_cursor_free(&t->cursor);
    prompt_set_free(&t->train);
    prompt_set_free(&t->val);
    if (t->src.release)
        t->src.release(t->src.ctx);
    free(t);
}
