/* A rollout TP group's turn environment (multi-turn rollouts on a model split over the group): the group's first
 * rank runs the real one (its tools, its sandbox, its interactions) and tells its peers, over the group, each
 * trajectory's kind at its start and every answer as it takes it; the peers run no tool and mirror it. Every rank's
 * generation then makes the same steps in the same order (worker/gen/multi_turn.c is deterministic given the
 * answers it takes), as the model's collectives need. */
#ifndef GRPO_WORKER_ROLLOUT_ENV_H
#define GRPO_WORKER_ROLLOUT_ENV_H

#include <stdbool.h>

#include "worker/gen/turn_env.h"

struct comm;
/* The head: inner is its real environment (owned from here on); a peer: inner is NULL. The group's broadcasts go
 * over `group` (an MPI group: the same order on every rank). */
struct turn_env *rollout_env_create(struct turn_env *inner, void (*inner_destroy)(struct turn_env *),
                                    struct comm *group, bool head);
void rollout_env_destroy(struct turn_env *e);

#endif
