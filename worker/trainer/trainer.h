/* The trainer library's public interface: a GRPO run loop fed by a step source (struct trainer_source) it does not
 * know: for each step the source's rollouts (drawn, generated and scored wherever the source makes them), then old
 * log-probs, reference log-probs, advantages and the PPO/GRPO update; validate, log metrics, checkpoint. Resuming
 * from a checkpoint continues bit-identically. The sources: worker/hybrid/ (one process, colocated ranks) and
 * worker/split/ (rollout ranks). */
#ifndef GRPO_WORKER_TRAINER_H
#define GRPO_WORKER_TRAINER_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/names.h" /* Grpo__Phase: the phases of a step */

struct grpo_config;
struct metrics;
struct trainer;
struct comm;
struct step_batch;
struct model;
struct prompt_set;
struct gen_ctx;
struct prompt_item;

/* What a safe point asks the trainer to do. */
enum trainer_action { TRAINER_CONTINUE = 0, TRAINER_CHECKPOINT = 1, TRAINER_STOP = 2 };

/* Optional callbacks, e.g. the control-plane client. All may be NULL. */
struct trainer_hooks {
    void *ctx;
    /* entering a phase of a step (gen, reward, old_log_prob, ref, adv, update_actor, validate, checkpoint) */
    void (*phase)(void *ctx, int64_t step, Grpo__Phase phase);
    /* after each step (and after validation at step 0) with its metrics */
    void (*step_done)(void *ctx, int64_t step, int64_t total_steps, const struct metrics *m);
    /* at each safe point (between generation rounds and after each step); may block while paused; returns an
     * enum trainer_action, possibly OR'ed (TRAINER_CHECKPOINT | TRAINER_STOP) */
    int (*safe_point)(void *ctx, int64_t step);
    /* while waiting for the other ranks in a collective (done false), and once when it completes (done true):
     * report paused while the run is to pause (control_hold_while_waiting) */
    void (*waiting)(void *ctx, bool done);
    /* a checkpoint of `step` steps is on disk (DP rank 0 wrote it, writer true; the other DP ranks hold the same
     * state and hear of it with writer false) */
    void (*checkpoint_saved)(void *ctx, int64_t step, bool writer);
};

/* This trainer's place among the trainer ranks. The zero value is one process (hybrid). */
struct trainer_layout {
    struct comm *dp; /* data-parallel group of the trainers (the ranks holding the same shard); NULL: alone */
    int dp_rank, dp_size;
    struct comm *tp; /* tensor-parallel group (the ranks splitting each layer); NULL: whole layers */
    int tp_rank, tp_size;
    struct comm *pp; /* pipeline group (this TP rank's stages); NULL: every layer here */
    int pp_rank, pp_size;
    struct comm *mp; /* the TP x PP ranks of one model copy (ranked pp x TP + tp; with EP and PP the stages' EP groups,
                      * ranked pp x EP + ep); NULL: TP and PP both 1 */
    struct comm *cp; /* Ulysses sequence parallelism: the ranks sharing each sequence (same DP rank, same batch;
                        each runs a slice of its tokens); NULL: none */
    int cp_rank, cp_size;
    struct comm *grads; /* with cp: DP x CP, the ranks whose gradients add up (NULL: dp) */
    /* expert parallelism (actor_rollout_ref.actor.megatron.expert_model_parallel_size, out of the DP ranks): ep the
     * DP ranks splitting the experts (EP rank dp % ep_size; it is then the model copy's group, mp; with PP mp is the
     * stages' EP groups, role_env.emp), edp those holding
     * the same experts, over which the experts' gradients add up; NULL when ep_size is 1 */
    struct comm *ep, *edp;
    int ep_rank, ep_size;
    struct comm *etp; /* EP with TP: the EP x TP ranks of one model copy (ranked ep x TP + tp), the model copy's group
                         (mp) then; NULL otherwise */
    struct comm *all; /* every trainer rank: stop and checkpoint decisions follow its rank 0 (DP 0, TP 0) */
    int devices;      /* ranks the run uses (perf/throughput divides by it); 0: 1 */
    int device;       /* trainer.device=cuda: this rank's GPU (its CUDA index on the node) */
    bool gpus_shared; /* trainer.device=cuda: some DP ranks share a GPU, so NCCL cannot sum their gradients */
    bool spare;       /* trainer.survive_spare_ranks: a spare, alone, waits to take a lost rank's place: it leads,
                         validates and trains nothing until it joins (trainer_reform) */
};

/* What a step's source reports with its rollouts, the figures the trainer's own metrics use: the seconds they took
 * where they were made (summed over rollout ranks when they come from several), and this rank's wait for them.
 * step_metrics.c turns them into metrics; what else a source did to get them (its planes, its engines, DAPO's
 * rounds) it keeps and reports itself (trainer_source.metrics). */
struct step_timing {
    double gen, reward;
    double wait_data; /* this rank waiting for the step's batches */
    bool split;       /* rollouts came from rollout ranks: the trainer reports its waiting for them, its gradient
                       * traffic and its idle share (the source its own ranks') */
    double wait_meet; /* the part of wait_data spent meeting the other ranks (a collective: idle counts it) */
    /* a source that generates on this rank: the memory the generation phase held at its peak */
    bool gen_here;
    double gen_max_allocated_gb; /* everything the policy's context held, at the generation's peak */
    double gen_grads_gb;         /* of which gradients (0 when they were given back for generation) */
};

/* Where a source's own metrics go among a step's (verl's order). */
enum source_metrics_at {
    SOURCE_METRICS_FIRST, /* before every other metric of the step */
    SOURCE_METRICS_LATE,  /* after the trainer's timings and its waiting for data */
};

/* Where each step's rollouts come from, and what happens between steps: every trainer is fed by one (the one-process
 * and colocated sources are worker/hybrid/'s, the split run's worker/split/'s); the trainer knows none of them. */
struct trainer_source {
    void *ctx;
    /* this rank's share of step k's rollouts into b (whole groups, gidx set), with its report in tm; 0, or -1
     * to end the run with an error */
    int (*next_batch)(void *ctx, int64_t k, struct step_batch *b, struct step_timing *tm);
    /* at the safe point after step k (before step k + 1 or the end): stop says whether the run ends here.
     * For weight sync; 0, or -1 on error. May be NULL. */
    int (*between_steps)(void *ctx, int64_t k, bool stop);
    /* next_batch generates on this rank (one process, colocated ranks): each phase's memory goes back to the other
     * around it (actor_rollout_ref.rollout.free_cache_engine) */
    bool generates;
    /* validation shared by every rank (called on all of them, the metrics set on DP rank 0's first rank) with the
     * policy as it is now; NULL: DP rank 0's model copy validates alone */
    void (*validate)(void *ctx, uint64_t seed, struct metrics *m);
    /* fully-async training: weights are pushed after steps that are multiples of this; safe points (pause, stop,
     * grpod's checkpoints, signals) are there only, and trainer.save_freq and test_freq count pushes (0: every
     * step) */
    int push_every;
    /* the source's state for a checkpoint of `step` steps (fully-async training: the stream drained, the units not
     * yet trained): *blob (malloc'd, *len bytes) goes into the checkpoint as async_state.bin. May be NULL. 0, or -1 */
    int (*checkpoint_state)(void *ctx, int64_t step, uint8_t **blob, size_t *len);
    /* the source's own metrics of the step it made last (its counters and figures, which it owns), set at `at`; tm
     * is the step's as the trainer ended it and step_s its seconds. May be NULL. */
    void (*metrics)(void *ctx, enum source_metrics_at at, const struct step_timing *tm, double step_s,
                    struct metrics *m);
    /* trainer_free gives ctx back with it (NULL: the caller owns ctx) */
    void (*release)(void *ctx);
};
/* The file a source's checkpoint state goes to, in the checkpoint's directory. */
#define TRAINER_SOURCE_STATE_FILE "async_state.bin"

/* Run to trainer.total_training_steps (or a stop request). 0 when finished or stopped cleanly, -1 on error.
 * Besides grpod's stop (the safe_point hook), the run stops at its next safe point, after a checkpoint, when
 * the process (any DP rank) has received SIGTERM or SIGINT (control_stop_signal(): returns 0), and when a
 * record of the run could not be written (metrics_output_failure(): metrics.jsonl, TensorBoard, the chart,
 * the rollout dumps, on any DP rank; returns -1, with trainer_failure() saying why). */
int trainer_run(struct trainer *t);
/* Set up a run from the configuration: model, reference, tokenizer, data, scorers, run directory, and resume from a
 * checkpoint when trainer.resume_mode asks; on one rank of several trainers (lay; NULL: alone) fed by src (its
 * next_batch required). Only DP rank 0 validates, writes metrics and checkpoints; stop and checkpoint decisions are
 * DP rank 0's, and every step checks that the weights are identical on every DP rank. NULL with err on failure. */
struct trainer *trainer_create_dist(const struct grpo_config *cfg, const struct trainer_hooks *hooks,
                                    const struct trainer_layout *lay, const struct trainer_source *src, char *err,
                                    size_t errlen);
/* Advance the data cursor by one step (as a step that draws its prompts does) and give the step's prompt
 * indices (config_gen_batch_size of them: data.gen_batch_size, else data.train_batch_size) in uids: a trainer fed by
 * rollout ranks keeps its cursor, which goes into checkpoints, in step with theirs. */
void trainer_advance_cursor(struct trainer *t, int *uids);
/* The next n prompts (the data cursor's batch: config_gen_batch_size; verl's sampler with drop_last) into out (and
 * their dataset indices into uids, may be NULL), for a source that draws in the trainer's process; the cursor is part
 * of the run state. */
void trainer_draw_prompts(struct trainer *t, const struct prompt_item **out, int *uids, int n);
/* Enter phase p of the coming step (a source's phases: the log and the control plane hear of it). */
void trainer_enter_phase(struct trainer *t, Grpo__Phase p);
/* The seed of the run's random draws (data.seed, or the checkpoint's): a source seeds step k with
 * rollout_step_seed(seed, k, round). */
uint64_t trainer_seed(const struct trainer *t);
/* The checkpoint directory the run resumed from, or "" (a source reads its state there: async_state.bin). */
const char *trainer_resumed_from(const struct trainer *t);
/* Set the data cursor that checkpoints record (a source that draws its own prompts: fully-async training's stream). */
void trainer_set_cursor(struct trainer *t, int64_t epoch, int64_t index);
/* The policy model (weight sync sends its parameters). */
struct model *trainer_policy(struct trainer *t);
/* The trainer's generation context (its policy, tokenizer, scorers; the reward model on DP rank 0): colocated
 * ranks generate with a copy of it. */
const struct gen_ctx *trainer_rollout_ctx(const struct trainer *t);
/* The training prompts (a data-plane batch is checked against them). */
const struct prompt_set *trainer_prompts(const struct trainer *t);
/* The validation prompts. */
const struct prompt_set *trainer_val_prompts(const struct trainer *t);
/* Data cursor position of the next step: its epoch and index (rollout ranks start from it). */
void trainer_cursor(const struct trainer *t, int64_t *epoch, int64_t *index);
void trainer_free(struct trainer *t);

/* Why trainer_run ended with an error when the cause was not a step's own (a record of the run could not be
 * written: "writing RUN/metrics.jsonl: No space left on device"), else "" (the log says). For the report to
 * grpod. */
const char *trainer_failure(const struct trainer *t);

/* Write a checkpoint of the current step now (at a safe point); 0 or -1 (logged). */
int trainer_save_checkpoint(struct trainer *t);

/* Current progress (for status reporting). */
int64_t trainer_step(const struct trainer *t);
int64_t trainer_total_steps(const struct trainer *t);
/* This rank leads the trainers (DP rank 0 of the first model copy: it decides, logs and checkpoints for all); after a
 * survived loss of the lead, the survivor that took its place. */
bool trainer_leads(const struct trainer *t);
/* Run directory (metrics.jsonl, tensorboard/, checkpoints/, charts). */
const char *trainer_run_dir(const struct trainer *t);
/* The policy's trainable parameters in host memory (the adapter with LoRA): on a GPU a host copy, made now and
 * valid until the next call (checksums, published weights, equivalence tests). */
const float *trainer_params(struct trainer *t, size_t *n);

/* Surviving a lost trainer rank (trainer.survive_trainer_loss; worker/survive/ decides and fills the hooks,
 * trainer_survive.c does the trainer's part): with these set, the start of every step of trainer_run is a point a
 * lost peer brings this rank back to (a setjmp on *point), to redo the step. */
struct trainer_recovery {
    void *ctx;
    jmp_buf *point; /* set (setjmp) at the start of each step */
    /* step k starts: its start is kept, a loss from here comes back; nonzero: this rank is a spare the run no
     * longer needs (it ended), out of the loop */
    int (*step_begin)(void *ctx, int64_t k);
    int (*recover)(void *ctx);               /* back at the point: 0 to redo the restored step, -1 to end the run */
    void (*step_done)(void *ctx, int64_t k); /* step k is done and logged */
    void (*disarm)(void *ctx);               /* past the last step: a loss ends the job */
};
void trainer_set_recovery(struct trainer *t, const struct trainer_recovery *r);
/* The NCCL twin of the DP group that sums the gradients in device memory (trainer.device=cuda, a GPU per DP rank),
 * or NULL: a lost peer found in it is survived as in the MPI groups (comm_ft_watch). */
struct comm *trainer_dp_device_group(const struct trainer *t);
/* Whether the optimizer state is sharded over DP (ZeRO-1). */
bool trainer_zero1(const struct trainer *t);
/* The trainer's state at the start of a step (weights, AdamW's moments and count, the run state with the data
 * cursor), in host memory (on a GPU copied out of device memory, beside the step's work, and back): taken at the start
 * of step global_step
 * + 1, restored to redo that step. With ZeRO-1 taking it is a collective of the DP group (each rank's block of the
 * moments copied to the next rank too). */
struct trainer_snapshot;
struct trainer_snapshot *trainer_snapshot_new(void);
/* After the step whose start s is: s whole (made now if no optimizer step made it), and no longer armed. */
void trainer_snapshot_settle(struct trainer *t, struct trainer_snapshot *s);
/* Whether s waits for its step's first optimizer step to be made (host memory, no ZeRO-1: adamw_keep). */
bool trainer_snapshot_deferred(const struct trainer_snapshot *s);
/* Whether s is being copied out of a GPU beside the step's work (no ZeRO-1, pinned host memory: k_to_host_behind);
 * the step's first optimizer step waits for the copies on the device, the host before it reads them. */
bool trainer_snapshot_beside(const struct trainer_snapshot *s);
/* The copy of the step's start beside a GPU's work, issued if it is still to be: once the step has freed what it
 * gives back (a free makes the host wait for the device's work, copies included). */
void trainer_keep_issue(struct trainer *t);
void trainer_snapshot_take(struct trainer *t, struct trainer_snapshot *s);
/* s's memory for t's state made and touched before the first step (the first touch is not a step's): its bytes (0:
 * it was there already). */
size_t trainer_snapshot_reserve(struct trainer *t, struct trainer_snapshot *s);
/* Back to s: on the survivors of a loss (the trainer moved onto their groups first, trainer_reform), lost the DP
 * ranks lost, as numbered in s's layout. With ZeRO-1 the optimizer state is re-sharded over the current DP group
 * from every survivor's block and the lost ranks' copies (each rank keeps its previous DP rank's block: two
 * neighbours lost at once cannot be restored); a collective of the current DP group then, in which a spare that
 * joins takes part with s NULL (it gets its block; trainer_state_share gives it the rest). 0, or -1 with err. */
int trainer_snapshot_restore(struct trainer *t, struct trainer_snapshot *s, const int *lost, int n_lost, char *err,
                             size_t errlen);
/* Whether ZeRO-1's optimizer state survives the loss of the DP ranks lost (of dp_size): not when a rank and the
 * next one, which kept the copy of its block, are both lost. 0, or -1 with err. */
int trainer_zero1_restorable(const int *lost, int n_lost, int dp_size, char *err, size_t errlen);
/* The step whose start s holds (-1: none). */
int64_t trainer_snapshot_step(const struct trainer_snapshot *s);
/* The trainable floats s holds (*n of them; trainer_params' layout: with LoRA the adapter), in host memory. */
const float *trainer_snapshot_params(struct trainer_snapshot *s, size_t *n);
/* The host memory it holds. */
size_t trainer_snapshot_bytes(const struct trainer_snapshot *s);
void trainer_snapshot_free(struct trainer_snapshot *s);
/* trainer.survive_spare_ranks: after trainer_reform and trainer_snapshot_restore, DP rank root's state (the
 * weights, AdamW's step count, the run state with the data cursor, and with plain DP AdamW's moments: ZeRO-1's
 * blocks were re-sharded by the restore) to every rank of the DP group: a spare that joined takes the step's start
 * from it. A collective of the DP group. The bytes broadcast. */
size_t trainer_state_share(struct trainer *t, int root);
/* Move the trainer onto the survivors' groups: all (every trainer) and dp (plain DP: the same ranks), this rank
 * dp_rank of dp_size; the gradient buckets and micro-batch sizes follow, the interrupted step's buffers go. On GPUs
 * the lost group's NCCL twin (aborted by the loss's comm_revoke) is freed and a new one made over dp (its rank 0's
 * new unique id handed over dp's MPI twin): a collective of dp. 0, or -1 with err. */
int trainer_reform(struct trainer *t, struct comm *all, struct comm *dp, int dp_rank, int dp_size, char *err,
                   size_t errlen);
/* TP or PP (after trainer_reform): the model copy's groups of the survivors' layout, the same position (TP rank,
 * stage) in it; the policy's and the reference's collectives go over them from here (on GPUs over new NCCL twins
 * of them, made collectively over each group; the lost ones freed). */
void trainer_reform_groups(struct trainer *t, struct comm *tp, struct comm *pp, struct comm *mp);
/* On GPUs with TP or PP: the NCCL twins the model's collectives use (TP, PP, the copy's group where PP splits it),
 * each once, into out (room for 3): their count. A lost peer found in one is survived (comm_ft_watch). */
int trainer_model_device_groups(const struct trainer *t, struct comm **out);
/* TP or PP with spares: a spare (whole layers until now) takes a lost rank's place, TP rank tp_rank of tp_size and
 * stage pp_rank of pp_size over the groups tp, pp and mp (NULL where the size is 1): its policy, reference and
 * AdamW's moments become that shard's (their values come from a replica: trainer_state_share with ref). Before
 * trainer_reform. */
void trainer_join_shard(struct trainer *t, int tp_rank, int tp_size, int pp_rank, int pp_size, struct comm *tp,
                        struct comm *pp, struct comm *mp);
/* With TP or PP: the reference's weights too (frozen, the same on every replica), for a spare that took a shard's
 * place; a collective of the DP group. The bytes broadcast. */
size_t trainer_ref_share(struct trainer *t, int root);
/* TP or PP: a rank of a model copy that lost one of its ranks leaves the training for good (the other copies go
 * on without it): its run's records closed (the lead's metrics files and the run directory's lock, for the new
 * lead to take), its watchdog stopped, its interrupted step's buffers dropped, its layout alone (no group of the
 * lost copy is used again); it waits idle, as a spare does, until the run ends. */
void trainer_leave(struct trainer *t);
/* The checkpoint a relaunch resumes from (checkpoint_find_latest under the run's checkpoint root) into out, and
 * 0; -1 ("" in out) where there is none. */
int trainer_latest_checkpoint(const struct trainer *t, char *out, size_t outlen);
/* After trainer_snapshot_restore: the run's records follow the lead, the survivors' DP rank 0 (lead_lost: the lost
 * ranks held the old one). On the lead its metrics sinks are (re)opened on the run's files, appending after the
 * restored step (a line logged past it goes: the redone step logs it once), and a new lead takes run.lock; with
 * the lead lost, the checkpoint of the restored step is written again where it was due and not in place (the lost
 * lead was writing it): a collective of every survivor. 0, or -1 with err. */
int trainer_reform_records(struct trainer *t, bool lead_lost, char *err, size_t errlen);

#endif
