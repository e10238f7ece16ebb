/* Words for the protocol's enums, as grpoctl, the status page and the logs show them. */
#ifndef GRPO_DAEMON_NAMES_H
#define GRPO_DAEMON_NAMES_H

#include "proto/protocol.h"

/* Name of a run state ("waiting", "running", ...). */
const char *core_run_state_name(Grpo__RunState s);
/* Name of a worker state ("running", "lost", ...). */
const char *core_worker_state_name(Grpo__WorkerState s);
/* Name of a role ("rollout", "trainer", "hybrid", "unassigned"). */
const char *core_role_name(Grpo__Role r);
/* verl name of a phase's timing ("gen", "update_actor", ...). */
const char *core_phase_name(Grpo__Phase p);

#endif
