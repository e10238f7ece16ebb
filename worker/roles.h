/* The three roles a grpo-worker rank can take, as grpod (or, without grpod, the
 * same placement arithmetic in common/placement.c) assigns them:
 *   hybrid   every part of the GRPO step: alone in one process, or on N colocated ranks that each generate
 *            their share of every step and then train together as DP x TP x PP (worker/hybrid);
 *   rollout  take work units (a share of a step's prompts) and policy versions
 *            from the trainers' dispatcher, generate, score, and send the
 *            groups to the trainers over nanomsg (each batch acknowledged);
 *            no MPI traffic, so a lost rollout rank costs the run nothing;
 *   trainer  pull the step's groups, compute log-probs, advantages and the
 *            update with gradients summed over the trainers' DP group; DP
 *            rank 0 runs the dispatcher, validates, logs and checkpoints. */
#ifndef GRPO_WORKER_ROLES_H
#define GRPO_WORKER_ROLES_H

#include "common/placement.h"
#include "proto/plane_auth.h"
#include "worker/comm/comm.h"
#include "worker/control/control.h"

struct grpo_config;

#define ROLE_MAX_ENDPOINTS 64

/* Everything a role needs from the launch: built once by worker/launch/launch.c. */
struct role_env {
    const struct grpo_config *cfg;
    struct comm *world;
    int rank, world_size; /* this rank in the run: the MPI rank and size, or --replace-rank's */
    bool replacing;       /* --replace-rank: in the place of a lost rollout rank */
    int spare_ranks;      /* trainer.survive_spare_ranks: the world's last ranks, outside rank and world_size */
    bool spare;           /* this rank is one of them: it waits to take a lost rank's place (worker/survive) */
    struct placement_spec spec;
    struct placement at;       /* this rank's role and coordinates */
    struct control *ctl;       /* NULL: no grpod */
    struct comm *trainers;     /* every trainer rank (trainer ranks only; colocated: every rank) */
    struct comm *dp, *tp, *pp; /* a trainer's data-, tensor- and pipeline-parallel groups within them */
    struct comm *mp;           /* the TP x PP ranks of a trainer's model copy (ranked pp x TP + tp) */
    struct comm *cp;           /* a trainer's sequence-parallel group (the ranks sharing its sequences), or NULL */
    struct comm *replica;      /* with cp and TP or PP: every rank holding a DP rank's batches (TP x PP x CP, ranked
                                  (pp x CP + cp) x TP + tp); NULL otherwise (mp or cp alone is that group) */
    struct comm *grads;        /* with cp: DP x CP, the ranks whose gradients add up; NULL without */
    struct comm *ep, *edp;     /* expert parallelism: the DP ranks splitting the experts, and those holding the same
                                  experts (NULL when actor_rollout_ref.actor.megatron.expert_model_parallel_size is 1) */
    struct comm *etp;          /* EP with TP: the EP x TP ranks of one model copy (ranked ep x TP + tp), else NULL */
    struct comm *emp; /* EP with PP: the model copy, the stages' EP groups (ranked pp x EP + ep; mp is then one DP
                         rank's stages, which share its batches); NULL otherwise */
    struct comm *rollout_tp;   /* a rollout rank's TP group (actor_rollout_ref.rollout.tensor_model_parallel_size);
                                  a colocated rank's generation engine */
    struct comm *weight_group; /* weight_sync=broadcast: trainer rank 0 (its rank 0) and the launch's rollout ranks
                                  that fetch for their TP group (NULL elsewhere) */
    int device;                /* trainer.device=cuda in a split run: this rank's GPU on its node (assign_devices) */
    bool trainer_gpus_shared;  /* some node has more trainer ranks than GPUs: they share (NCCL cannot run there) */
    bool rollout_gpus_shared;  /* some node has more ranks than GPUs: rollout ranks share one (the same for NCCL) */
    int staleness;             /* 0: on-policy (rollout.mode=sync), 1: one-step-off (async) */
    double heartbeat_s;        /* grpod's heartbeat interval (grpod.heartbeat_interval_s without grpod): the rollout
                                  processes ping the dispatcher this often, and are lost after two */
    /* data-plane authentication (proto/plane_auth.h), split runs: every process's own credentials, and the run
     * key of this launch's key epoch on trainer ranks only (they check every batch and request with it, and refuse
     * another epoch's); handed out by grpod, or by world rank 0 at launch without grpod */
    struct plane_cred plane;    /* for the dispatcher (its two threads share the counter) */
    struct plane_cred plane_dp; /* the same identity and key, for the data sockets (one thread) */
    uint8_t plane_run_key[PLANE_KEY_BYTES];
    bool have_run_key;
    uint64_t plane_epoch; /* this launch's key epoch (never 0 once credentials are set) */
    uint64_t launch_id;   /* names the launch (world rank 0's random number; Register.launch) */
    int n_endpoints;      /* one data endpoint per trainer DP rank */
    char endpoints[ROLE_MAX_ENDPOINTS][256];
    char dispatch_endpoint[256]; /* the trainers' dispatcher: trainer DP rank 0 binds it, the rollout ranks connect */
    char advertise[256];         /* grpod.advertise_host resolved: the address this rank's endpoints are dialled at
                                    and bound to ("": the host name; binds take every interface) */
    int world_hosts;             /* how many hosts the MPI world spans (0: not counted, a replacement) */
    char *world_host_names;      /* each world rank's host name, ROLE_HOST_NAME bytes each, until registered; NULL:
                                    unknown (a replacement) */
};
#define ROLE_HOST_NAME 64

/* Each returns the process exit status (0: finished or stopped cleanly). */
int run_hybrid(struct role_env *env);
int run_rollout(struct role_env *env);
int run_trainer(struct role_env *env);

#endif
