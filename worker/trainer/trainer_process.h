/* A trainer rank's process under the control plane (trainer_process.c), shared by every role that runs a trainer:
 * the hybrid role (one process, colocated ranks) and the split run's trainer role, each with its own step source. */
#ifndef GRPO_WORKER_TRAINER_PROCESS_H
#define GRPO_WORKER_TRAINER_PROCESS_H

struct role_env;
struct trainer;
struct trainer_layout;
struct trainer_source;

/* A trainer process under the control plane: create it fed by src (with on_created called once it exists), run
 * it, report how it ended. The process exit status (0: finished or stopped cleanly). */
int run_trainer_process(struct role_env *env, const struct trainer_layout *lay, const struct trainer_source *src,
                        void (*on_created)(void *ud, struct trainer *t), void *ud);
/* A trainer's layout from its role's groups and coordinates. */
void trainer_layout_of(const struct role_env *env, struct trainer_layout *lay);

#endif
