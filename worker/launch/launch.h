/* Launching a grpo-worker rank: the role and coordinates it takes (grpod's assignment, checked against the same
 * arithmetic in common/placement.c), the data endpoints it binds or connects to, its registration with grpod, its
 * GPU, and the groups its role talks over. Everything goes through the collective plane (worker/comm/comm.h). */
#ifndef GRPO_WORKER_LAUNCH_H
#define GRPO_WORKER_LAUNCH_H

#include <stdbool.h>

#include "worker/comm/comm.h"
#include "worker/comm/parallel.h"
#include "worker/roles.h"

struct grpo_config;

/* What the command line asks of the launch. */
struct launch_options {
    int tp, pp;       /* --tp, --pp: the TP and PP sizes of the world's groups (default 1) */
    bool selftest;    /* --selftest: the world's groups only, no role */
    int replace_rank; /* --replace-rank R: in the place of lost rollout rank R; -1: none */
};

/* What a launch built. */
struct launch {
    bool selftest;
    struct parallel_groups world_groups; /* the world as DP x TP x PP (launch_options' tp and pp) */
    bool have_world_groups;
    bool peers_wait;    /* past the world's groups, for a role: a rank that fails from here on leaves its peers
                           waiting for it in a collective, so its failure ends the job */
    bool refused_alike; /* every rank refused the run for the same reason (the configuration or the placement, before
                           any role starts): rank 0 alone ends the job */
    bool launched;      /* the role's environment is complete (launch returned 0, not for --selftest) */
    bool split;         /* a trainer or rollout rank of a split placement (false: hybrid) */
    bool colocated;     /* a hybrid rank of several (every rank generates and trains) */
    struct role_env env;
    struct comm *sides;                    /* a split run's world cut into the trainers and the rollout ranks */
    struct parallel_groups trainer_groups; /* a trainer's DP, TP and PP groups within the trainers */
};

/* Build the world's groups, then (not for --selftest) place this rank, derive the data endpoints, assign its GPU,
 * register with grpod and build its role's groups into l. Collective over world. 0, or the exit status with the
 * reason logged: 2 (the options, the configuration or the placement refuse the run), 3 (grpod). */
int launch(struct launch *l, const struct grpo_config *cfg, struct comm *world, const struct launch_options *o);
/* Free the role's groups and leave grpod, once the role has run (nothing after a failed launch). */
void launch_close_role(struct launch *l);
/* Free what launch_close_role left (the world's groups; world is the caller's). */
void launch_close(struct launch *l);

#endif
