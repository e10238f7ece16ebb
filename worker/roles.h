/* The three roles a grpo-worker rank can take, as grpod (or, without grpod, the
 * same placement arithmetic in common/placement.c) assigns them:
 *   hybrid   every part of the GRPO step in this process (one-rank runs);
 *   rollout  draw this rank's share of each step's prompts, generate, score, and
 *            send the groups to the trainers over nanomsg (each batch acknowledged);
 *            take new weights;
 *   trainer  pull the step's groups, compute log-probs, advantages and the
 *            update with gradients summed over the trainers' DP group; DP
 *            rank 0 sends the weights back, validates, logs and checkpoints. */
#ifndef GRPO_WORKER_ROLES_H
#define GRPO_WORKER_ROLES_H

#include "common/placement.h"
#include "worker/comm/comm.h"
#include "worker/control/control.h"

struct grpo_config;

#define ROLE_MAX_ENDPOINTS 64

/* Everything a role needs from the launch: built once by grpo_worker.c. */
struct role_env {
    const struct grpo_config *cfg;
    struct comm *world;
    struct placement_spec spec;
    struct placement at;   /* this rank's role and coordinates */
    struct control *ctl;   /* NULL: no grpod */
    struct comm *trainers; /* the trainers' DP group (trainer ranks only) */
    struct comm *sync;     /* trainer DP rank 0 (rank 0 here) and every rollout rank; NULL elsewhere */
    int staleness;         /* 0: on-policy (rollout.mode=sync), 1: one-step-off (async) */
    char secret[1024];     /* grpod.secret_file's secret: every data-plane batch carries it ("": none) */
    int n_endpoints;       /* one data endpoint per trainer DP rank */
    char endpoints[ROLE_MAX_ENDPOINTS][256];
};

/* Each returns the process exit status (0: finished or stopped cleanly). */
int run_hybrid(struct role_env *env);
int run_rollout(struct role_env *env);
int run_trainer(struct role_env *env);

struct trainer;
struct trainer_layout;
struct trainer_source;
/* A trainer process under the control plane: create (with on_created called once it exists), run, report how
 * it ended. The hybrid and trainer roles share it. */
int run_trainer_process(struct role_env *env, const struct trainer_layout *lay, const struct trainer_source *src,
                        void (*on_created)(void *ud, struct trainer *t), void *ud);

#endif
