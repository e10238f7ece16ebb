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
    default: return "unknown";
    }
}

const char *core_role_name(Grpo__Role r)
{
    switch (r) {
    case GRPO__ROLE__ROLE_ROLLOUT: return "rollout";
    case GRPO__ROLE__ROLE_TRAINER: return "trainer";
    case GRPO__ROLE__ROLE_HYBRID: return "hybrid";
    default: return "unassigned";
    }
}

const char *core_phase_name(Grpo__Phase p)
{
    static const char *names[10] = {"idle", "gen",          "reward",      "old_log_prob", "ref",
                                    "adv",  "update_actor", "weight_sync", "testing",      "save_checkpoint"};
    return (unsigned)p < 10 ? names[p] : "unknown";
}
