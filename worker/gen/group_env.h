/* The turn environment of a group of ranks that generates as one engine (a model split over TP or PP ranks: a
 * rollout TP group, a colocated engine, a trainer's TP x PP model copy validating): the group's first rank runs the
 * real one (its tools, its sandbox, its interactions) and tells its peers, over the group, each trajectory's kind at
 * its start, every answer as it takes it, and each trajectory's summary at its end (the scorer's extra_info, the
 * conversation); the peers run no tool and mirror it. Every rank's generation then makes
 * the same steps in the same order (worker/gen/multi_turn.c is deterministic given the answers it takes), as the
 * model's collectives need. */
#ifndef GRPO_WORKER_GEN_GROUP_ENV_H
#define GRPO_WORKER_GEN_GROUP_ENV_H

#include <stdbool.h>

#include "worker/gen/turn_env.h"

struct comm;
/* inner: this rank's real environment (owned from here on, freed with inner_destroy), the head's at least; a peer's,
 * when it has one, is kept for a later regroup that makes it the head. The group's broadcasts go over `group` (an
 * MPI group: the same order on every rank; NULL: this rank alone, a head that tells no one). */
struct turn_env *gen_group_env_create(struct turn_env *inner, void (*inner_destroy)(struct turn_env *),
                                      struct comm *group, bool head);
/* After the groups were formed again (trainer-loss survival): the new group and whether this rank now heads it.
 * true when it heads it and has no real environment yet (gen_group_env_set_inner gives it one). */
bool gen_group_env_regroup(struct turn_env *e, struct comm *group, bool head);
void gen_group_env_set_inner(struct turn_env *e, struct turn_env *inner, void (*inner_destroy)(struct turn_env *));
void gen_group_env_destroy(struct turn_env *e);

#endif
