/* Inside the trainer: its state, shared by its set-up (trainer_create.c), the run loop (trainer.c) and the step
 * (trainer_step.c). Not for other modules: they use trainer.h. */
#ifndef GRPO_WORKER_TRAINER_INTERNAL_H
#define GRPO_WORKER_TRAINER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "actor.h"
#include "rollout_corr.h"
#include "checkpoint.h"
#include "common/config.h"
#include "common/log.h"
#include "worker/step/prompts.h"
#include "kernels/kernels.h"
#include "trainer.h"
#include "worker/data/dataset.h"
#include "worker/flight/flight.h"
#include "worker/metrics/metrics.h"
#include "worker/gen/generate.h"

struct zero1;

struct trainer {
    const struct grpo_config *cfg;
    struct trainer_hooks hooks;
    struct model *policy, *ref;
    struct tokenizer *tok;
    struct adamw *opt;  /* with ZeRO-1: this DP rank's block of the optimizer state */
    struct zero1 *zero; /* ZeRO-1 over the DP group (NULL: off) */
    bool in_decide;     /* DP rank 0 at its safe point inside decide() */
    struct reward_fn *reward;
    struct prompt_set train, val;
    struct run_state st;
    struct data_cursor cursor; /* position in the training prompts */
    bool cursor_open;
    int64_t saved_step; /* step of the newest checkpoint written by this process (-1: none) */
    char run_dir[2048], ckpt_root[2100];
    int run_lock_fd; /* the lead rank's lock on run_dir (run.lock; -1: none held here) */
    /* this rank's micro-batches (sequences): the _per_gpu keys, or verl's deprecated global ones over the DP size */
    int micro_actor, micro_old, micro_ref;
    struct metrics_logger logger; /* JSONL, TensorBoard, console, SVG chart (with the run's history) */
    bool logger_open;
    unsigned logger_sinks;     /* the sinks the lead opens (METRICS_SINK_*): again on a new lead after a loss */
    struct gen_ctx rc;         /* generation and scoring with the policy (hybrid steps, validation) */
    struct trainer_layout lay; /* this rank in the trainers' DP group */
    /* trainer.device=cuda beside other ranks: lay.dp's NCCL twin for the gradients (a GPU per DP rank; NULL when
     * they share GPUs), and pinned host memory of the trainable parameters' size (held in host_stage) for what
     * goes through the host: gradients summed over MPI without NCCL, the replicas' checksum, published weights */
    struct comm *dp_dev;
    /* the same for the policy's TP, PP and TP x PP groups (a GPU per rank; NULL without TP or PP, or on the CPU) */
    struct comm *tp_dev, *pp_dev, *mp_dev;
    /* the EP group's NCCL twin for expert parallelism's all-to-alls from device memory (mp_dev itself where the
     * model copy is the EP group); NULL on the CPU or where ranks share GPUs (MPI through pinned host memory) */
    struct comm *ep_dev;
    /* the same for sequence or context parallelism's group (lay.cp): the all-to-all or the K/V ring */
    struct comm *cp_dev;
    /* and for the ranks whose gradients add up under it (lay.grads, DP x CP): their sum and ZeRO-1's
     * reduce-scatter and all-gather in device memory (NULL on the CPU, without CP, or where ranks share GPUs) */
    struct comm *grads_dev;
    /* and for the ranks holding the same experts under EP (lay.edp): the experts' gradient sums and ZeRO-1 */
    struct comm *edp_dev;
    struct grad_reducer *overlap; /* overlap_grad_reduce's buckets (NULL: one all-reduce after the backward) */
    struct karena host_stage;
    float *host_params;
    struct trainer_source src; /* where each step's rollouts come from */
    char resumed_from[4096];   /* the checkpoint directory this run resumed from ("": none) */
    double iter_t0;            /* start of this loop iteration: the step time includes the safe point's work */
    double keep_s;             /* trainer.survive_trainer_loss: keeping this step's start (0 without the key) */
    double wait_t0;            /* comm_wait_seconds() then: the step's time in collectives */
    struct kmem_stats gen_mem; /* the policy context's peaks in the step's generation (gen_mem_set) */
    bool gen_mem_set;
    int peer_wants;        /* DP rank 0: the other DP ranks' reasons to end the run (trainer.c's WANTS_*) */
    int peer_failed_rank;  /* DP rank 0: a DP rank whose records could not be written (-1: none) */
    char failure[1300];    /* why the run ended with an error, when it is not a step's own ("": none) */
    struct lr_schedule lr; /* the learning rate at each step (lr_at) */
    double peak_flops;     /* measured sgemm FLOP/s x threads, the MFU denominator */
    bool share_prompts;    /* shared-prompt packing in effect: the key, on the CPU (no CUDA attention for it yet) */
    struct policy_loss_params loss;
    enum loss_agg agg;
    enum adv_estimator est;
    /* gdpo: algorithm.gdpo_reward_keys (malloc'd) and their weights */
    int gdpo_n;
    char *gdpo_keys[CFG_GDPO_MAX_KEYS];
    double gdpo_w[CFG_GDPO_MAX_KEYS];
    enum kl_type kl_reward_type;
    struct rollout_corr corr;    /* algorithm.rollout_correction */
    struct trainer_recovery rec; /* trainer.survive_trainer_loss: a lost rank's step redone (rec.point NULL: off) */
};

/* The trainer rank that decides for all and writes the run's records: DP rank 0, TP rank 0, the first stage. */
static inline bool trainer_is_lead(const struct trainer *t)
{
    return !t->lay.spare && t->lay.dp_rank == 0 && t->lay.tp_rank == 0 && t->lay.pp_rank == 0 && t->lay.cp_rank == 0;
}

/* The policy lives in device memory (trainer.device=cuda): what reads host memory gets a host copy. */
static inline bool trainer_on_device(const struct trainer *t) { return t->policy->K->device != KDEV_CPU; }

/* The group the decisions are broadcast over (every trainer rank), NULL when alone (trainer.c). */
struct comm *trainer_all_group(const struct trainer *t);
/* Multi-turn rollouts where this trainer generates: the group its model copy generates as (NULL: alone), *head on
 * the rank that runs the tools (trainer_create.c) */
struct comm *trainer_env_group(const struct trainer *t, bool *head);

/* Resume from a checkpoint (whole, the Hugging Face layout) into this rank's part of the weights and of the optimizer
 * state (trainer.c). 0, or -1 with err. */
int trainer_load_checkpoint(struct trainer *t, const char *dir, struct run_state *st, char *err, size_t errlen);

/* Enter phase p of the coming step: the log (debug) and the hook hear of it. */
static inline void trainer_phase(struct trainer *t, Grpo__Phase p)
{
    log_debug("trainer", "step %lld: %s", (long long)t->st.global_step + 1, core_phase_name(p));
    flight_set_phase((int)p); /* with or without grpod (its hooks): the flight recorder's records say where */
    if (t->hooks.phase)
        t->hooks.phase(t->hooks.ctx, t->st.global_step + 1, p);
}

static inline int trainer_safe_point(struct trainer *t)
{
    return t->hooks.safe_point ? t->hooks.safe_point(t->hooks.ctx, t->st.global_step) : TRAINER_CONTINUE;
}

/* Seeds of step k's random draws: a pure function of the base seed and k, so a resumed run draws the same. */
static inline uint64_t trainer_step_seed(uint64_t seed, int64_t step, uint64_t salt)
{
    return rollout_step_seed(seed, step, salt);
}

/* Whether the run writes a checkpoint after step k (trainer.save_freq, the last step). */
bool trainer_save_due(const struct trainer *t, int64_t k);

/* One GRPO step (the source's batch, then the update); 0, or -1 on a fatal error. */
int trainer_grpo_step(struct trainer *t, struct metrics *m);
/* Every trainer rank meets here, with no deadline (the others answer the control plane meanwhile): once its step's
 * data has come (a rollout slower than actor_rollout_ref.nccl_timeout is not a lost peer, so the DP ranks that got
 * their data first wait here and not in the step's first bounded collective), and at the end of the run. One
 * process: nothing. */
void trainer_meet(struct trainer *t);
/* One supervised warm-start step k; 0, or -1. */
int trainer_sft_step(struct trainer *t, int64_t k, struct metrics *m);
/* Validation on the held-out prompts (DP rank 0). */
void trainer_validate(struct trainer *t, struct metrics *m);

/* This rank's micro-batch sizes from the keys and the DP size (again after the DP group shrank); 0, or -1 with err. */
int trainer_resolve_micro_batches(struct trainer *t, char *err, size_t errlen);
/* trainer.device=cuda with DP > 1: t->dp_dev, lay.dp's NCCL twin where every DP rank has a GPU of its own (else the
 * host buffer for MPI); a collective of lay.dp (again over the survivors' group after a loss). */
void trainer_device_dp_setup(struct trainer *t);
/* The NCCL twins of the model copy's TP, PP and TP x PP groups freed (each once; the pointers NULL). */
void trainer_free_model_devices(struct trainer *t);
/* overlap_grad_reduce's buckets over lay.dp, where they apply (t->overlap; left NULL elsewhere). */
void trainer_overlap_setup(struct trainer *t);

/* Pinned host memory of the trainable parameters' size (made on first use): what crosses the host on a GPU. */
float *trainer_host_buffer(struct trainer *t);

#endif
