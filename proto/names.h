/* Words for the protocol's enums, as grpoctl, the status page and the logs show them. */
#ifndef GRPO_DAEMON_NAMES_H
#define GRPO_DAEMON_NAMES_H

#include <stdbool.h>

#include "proto/protocol.h"

/* Name of a run state ("waiting", "running", ...). */
const char *core_run_state_name(Grpo__RunState s);
/* Name of a worker state ("running", "lost", ...). */
const char *core_worker_state_name(Grpo__WorkerState s);
/* Name of a role ("rollout", "trainer", "hybrid", "spare", "idle", "unassigned"). */
const char *core_role_name(Grpo__Role r);
/* Whether a rank of role r holds training state, which a checkpoint keeps and its peers' collectives wait on: a
 * trainer, a colocated (hybrid) rank, or one not yet assigned; not a rollout rank, nor a spare that has not joined. */
bool core_role_holds_state(Grpo__Role r);
/* The phases of a step are the protocol's grpo.Phase (Grpo__Phase) from the worker to grpod's page: the one
 * enum, with this one count and core_phase_name the one name table. */
#define GRPO_NUM_PHASES ((int)GRPO__PHASE__PHASE_CHECKPOINT + 1)
/* verl name of a phase's timing ("idle", "gen", "reward", "old_log_prob", "ref", "adv", "update_actor",
 * "weight_sync", "testing", "save_checkpoint"): the worker's logs and timing_s/ metrics, grpod's page and
 * metrics, grpoctl. "unknown" for a number outside the enum. */
const char *core_phase_name(Grpo__Phase p);

#endif
