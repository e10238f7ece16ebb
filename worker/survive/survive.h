/* Surviving a lost trainer rank (trainer.survive_trainer_loss; docs/operations.md, "Open MPI 5 with fault tolerance
 * (ULFM)"). Colocated plain data parallelism on Open MPI 5 launched with its fault tolerance on (scripts/mpirun_ft):
 * when a rank dies, the survivors' next operation with it fails (MPI reports the loss, within
 * actor_rollout_ref.nccl_timeout at the latest); they revoke the trainers' groups (every survivor's wait ends at
 * once), shrink them to the survivors, agree on the step to redo (the earliest any survivor is in) and redo it from
 * its start with one DP rank fewer: the same global batch split over the survivors, each survivor's own copy of the
 * step's start restored (every plain DP rank holds the whole state). The run then equals one that used the smaller
 * DP from that step on, and the step's audit file is written once, by the redone step. The lost rank may be the
 * lead (rank 0: it decides, logs, checkpoints and writes the audit files for all): the survivors' rank 0 takes its
 * place, appending to the run's metrics files, and writes again a checkpoint the lost lead had not put in place.
 * With spares (trainer.survive_spare_ranks: the job's last ranks, outside the layout) a spare waits in one receive
 * on the world group, in no collective of a step; a loss revokes that group too, the spare shrinks with the others
 * and, one for each lost trainer while spares are left, joins DP at the redone step with the step's start
 * broadcast from the new DP rank 0: DP keeps its size. The lead releases the spares still waiting at the run's end.
 * With TP or PP (model copies of TP x PP ranks, one per DP rank) a lost rank's copy is incomplete: without a spare
 * it leaves whole (its other ranks idle, waiting as a spare does until the run's end, never to join), and the
 * whole copies redo the step with one DP rank fewer, each rank restoring its own shard; a spare instead takes the
 * lost rank's TP/PP position, that shard's step start broadcast over the position's DP group from a copy that lost
 * no rank (its replica). With no copy left whole (DP 1) the run stops, naming the checkpoint a relaunch takes.
 * On GPUs (trainer.device=cuda) the DP group's NCCL twin is watched too (with TP or PP the copy's twins as well, made
 * again over the re-formed groups; no spare with TP or PP there): a loss that
 * NCCL reports (ncclRemoteError), or that MPI knows of while an NCCL wait goes on (asked beside every such wait), comes
 * to the same handler; the revoke aborts the communicator (ncclCommAbort), the step's start is copied through host
 * memory, and after the shrink the survivors make a new communicator, its unique id from their rank 0 over their
 * shrunk MPI group.
 *
 * Where it sits: the trainer's run loop comes back to the start of its step (survive_jmp, a setjmp at each step's
 * start); the collective plane hands a lost peer to this module (comm_set_peer_lost_handler); the trainer's state
 * and layout are trainer_survive.c's; the colocated source re-forms its own part (its ledger of work units), and
 * the split source tells grpod, through the callback given here (worker/split/split_survive.c keeps a split run's
 * step data for the redo). */
#ifndef GRPO_WORKER_SURVIVE_H
#define GRPO_WORKER_SURVIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct grpo_config;
struct placement_spec;
struct role_env;
struct trainer;

/* Whether this run may turn trainer.survive_trainer_loss on: 0, or -1 with why naming what is not covered (an MPI
 * without ULFM, a launch without --with-ft ulfm, SP/CP, EP, rollout TP; in a split run (rollout ranks) anything but
 * plain DP trainers, spares, ZeRO-1, fully-async training, the broadcast weight sync; TP or PP with ZeRO-1,
 * under grpod, or with spares on GPUs or with LoRA). colocated: every rank generates and
 * trains (no rollout split); world: the ranks. Call only with the key on. Under grpod the survivors tell it (struct
 * survive_loss). */
int survive_check(const struct grpo_config *cfg, const struct placement_spec *spec, bool colocated, int world,
                  char *why, size_t whylen);

struct survive;
/* A loss survived: the ranks lost (their launch ranks: the world's, as the logs and grpod name them) and the reason,
 * "survived: DP 3 -> 2 at step 4" (grpod shows it: control_set_survived). */
struct survive_loss {
    const int *ranks;
    int n;
    const char *reason;
    /* TP or PP: this rank's model copy lost a rank and it left the training (it waits idle until the run ends):
     * the source lets go of the lost groups' state and trains nothing */
    bool left;
};
/* For the colocated ranks of env, or the trainer ranks of a split run (env->spec.rollout_ranks > 0: the world, which
 * spans the rollout ranks, is left alone, and the lead's loss stops the run); its trainers and DP groups are watched
 * from here on. reform(ud, loss) runs after
 * the groups re-formed, env updated (trainers, dp, tp, pp, at, rank, world_size): the source's own part, and telling
 * grpod. */
struct survive *survive_create(struct role_env *env, void (*reform)(void *ud, const struct survive_loss *loss),
                               void *ud);
/* The trainer whose steps are redone: its run loop gets the recovery hooks (struct trainer_recovery), which keep
 * each step's start, bring a lost peer's survivors back to it and re-form them (shrink, name the lost ranks, agree
 * on the step, move the trainer and the source onto the survivors, restore the step's start). */
void survive_attach(struct survive *s, struct trainer *t);
/* The trainable floats at step k's start as this rank kept them (the weights after step k - 1: policy version
 * k - 1), *n of them, or NULL when it keeps no longer step k's start (it keeps the last two steps'). */
const float *survive_step_start(const struct survive *s, int64_t k, size_t *n);
void survive_free(struct survive *s);

/* Tests only: GRPO_TEST_KILL_AT=POINT:STEP:RANK[,POINT:STEP:RANK...] with GRPO_TEST_HOLD_FILE=FILE makes launch rank
 * RANK, at POINT of step STEP, write its pid to FILE.held and hold while FILE exists (at most 10 minutes), so that a
 * test kills it there and not at a time a machine's speed decides. The points: "gen" (its generation done),
 * "logprob" (its old log-probs taken, the reference's not), "allreduce" (its all-reduce of the step's gradients
 * started, not waited for, through comm_set_test_hold), "allreduce-start" (its first gradient bucket's all-reduce of
 * the step not started: its peers wait on it in theirs), "optim" (a mini-batch's gradients summed, its optimizer step
 * not taken), "spare" (a spare about to wait at the start of step STEP), "ckpt" (in the step's checkpoint: the lead
 * with the weights and optimizer state written, not moved into place; another rank in its part). Each once per
 * process; a test that kills twice removes FILE.held before it kills (the next victim writes it anew). */
void survive_test_hold(const char *point);

#endif
