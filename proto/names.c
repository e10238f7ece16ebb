#include "proto/names.h"

const char *core_run_state_name(Grpo__RunState s)
{
    switch (s) {
    case GRPO__RUN_STATE__RUN_WAITING: return "waiting";
    case GRPO__RUN_STATE__RUN_RUNNING: return "running";
    case GRPO__RUN_STATE__RUN_PAUSED: return "paused";
    case GRPO__RUN_STATE__RUN_STOPPING: return "stopping";
    case GRPO__RUN_STATE__RUN_FINISHED: return "finished";
    case GRPO__RUN_STATE__RUN_FAILED: return "failed";
    case GRPO__RUN_STATE__RUN_PAUSING: return "pausing";
    default: return "unknown";
    }
}

const char *core_worker_state_name(Grpo__WorkerState s)
{
    switch (s) {
    case GRPO__WORKER_STATE__WORKER_STARTING: return "starting";
    case GRPO__WORKER_STATE__WORKER_RUNNING: return "running";
    case GRPO__WORKER_STATE__WORKER_PAUSED: return "paused";
    case GRPO__WORKER_STATE__WORKER_STOPPED: return "stopped";
    case GRPO__WORKER_STATE__WORKER_FINISHED: return "finished";
    case GRPO__WORKER_STATE__WORKER_FAILED: return "failed";
    case GRPO__WORKER_STATE__WORKER_LOST: return "lost";
    case GRPO__WORKER_STATE__WORKER_RECONNECTING: return "reconnecting";
    case GRPO__WORKER_STATE__WORKER_SUSPECT: return "suspect";
    default: return "unknown";
    }
}

const char *core_role_name(Grpo__Role r)
{
    switch (r) {
    case GRPO__ROLE__ROLE_ROLLOUT: return "rollout";
    case GRPO__ROLE__ROLE_TRAINER: return "trainer";
    case GRPO__ROLE__ROLE_HYBRID: return "hybrid";
    case GRPO__ROLE__ROLE_SPARE: return "spare";
    case GRPO__ROLE__ROLE_IDLE: return "idle";
    default: return "unassigned";
    }
}

bool core_role_holds_state(Grpo__Role r)
{
    return r != GRPO__ROLE__ROLE_ROLLOUT && r != GRPO__ROLE__ROLE_SPARE && r != GRPO__ROLE__ROLE_IDLE;
}

const char *core_phase_name(Grpo__Phase p)
{
    static const char *const names[] = {
        [GRPO__PHASE__PHASE_IDLE] = "idle",
        [GRPO__PHASE__PHASE_GEN] = "gen",
        [GRPO__PHASE__PHASE_REWARD] = "reward",
        [GRPO__PHASE__PHASE_OLD_LOG_PROB] = "old_log_prob",
        [GRPO__PHASE__PHASE_REF] = "ref",
        [GRPO__PHASE__PHASE_ADV] = "adv",
        [GRPO__PHASE__PHASE_UPDATE_ACTOR] = "update_actor",
        [GRPO__PHASE__PHASE_WEIGHT_SYNC] = "weight_sync",
        [GRPO__PHASE__PHASE_VALIDATE] = "testing",
        [GRPO__PHASE__PHASE_CHECKPOINT] = "save_checkpoint",
    };
    _Static_assert(sizeof names / sizeof *names == GRPO_NUM_PHASES, "a name for every phase");
    return (unsigned)p < GRPO_NUM_PHASES ? names[p] : "unknown";
}
