/* Surviving a lost trainer rank: the policy (survive.h says what and why). A step's life with the key on:
 *
 *   step_begin           the step's start kept (two slots: a survivor that finished step k's last collective is in
 *                        k + 1 while another's copy of that collective failed and it is still in k), and armed;
 *   a lost peer          the collective plane calls on_peer_lost: the trainers' groups are revoked (every survivor's
 *                        wait on them ends at once, wherever it is) and the rank jumps back to the step's start;
 *   recover              shrink (MPI agrees on the survivors), the lost ranks named, the step agreed on (the earliest
 *                        any survivor is in) and MPIX_Comm_agree that every survivor can redo it, the groups and
 *                        the layout re-formed, the trainer and the source moved onto them, the step's start
 *                        restored, the run's records with the survivors' rank 0 (a new lead where the lead was
 *                        lost: trainer_reform_records); the loop then runs the step again.
 *
 * Spares (trainer.survive_spare_ranks): all is every rank still in the job, the trainers first, then the spares. A
 * spare's step_begin waits in one receive on all (spare_wait); a loss ends it through on_peer_lost like any other
 * rank's wait, and recover shrinks all (spares included), keeps the trainers left as DP ranks 0.., makes the first
 * spares (one per lost trainer) the last DP ranks, and the new DP rank 0 broadcasts the restored step's start to
 * them (trainer_state_share). The other spares go back to their wait; disarm releases them at the run's end.
 *
 * TP or PP (model copies of TP x PP ranks): recover also works out which copies lost a rank. Spares fill whole
 * copies (every lost rank of one) while a copy that lost none is left to hold each shard; the other damaged copies
 * leave (trainer_leave: their ranks become idle, all's very last ranks, waiting as spares do but never joining).
 * The survivors are reordered into the new layout (the whole copies keep their positions, their DP ranks
 * renumbered), the copies' TP, PP and TP x PP groups made anew, and a spare that joined becomes its position's
 * shard (trainer_join_shard) and takes it from that replica over the position's DP group (trainer_state_share,
 * trainer_ref_share). No whole copy left: the run stops, naming the checkpoint a relaunch takes. */
#include "survive.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/placement.h"
#include "worker/comm/comm.h"
#include "worker/comm/parallel.h"
#include "worker/roles.h"
#include "worker/trainer/trainer.h"

#define MAX_LOST 64

struct survive {
    struct role_env *env;
    struct trainer *t;
    jmp_buf jb;
    bool armed;                       /* inside a step: a lost peer comes back to its start */
    int64_t step;                     /* the step begun last */
    struct trainer_snapshot *snap[2]; /* step k's start in snap[k % 2] */
    void (*reform)(void *ud, const struct survive_loss *loss);
    void *ud;
    /* the groups a loss revokes: the world and the trainers (every rank), DP, with TP or PP the model copy's TP, PP
     * and TP x PP groups, and on GPUs DP's NCCL twin (revoking it aborts it); after a loss the shrunk ones and the new
     * twin */
    struct comm *watch[12];
    int n_watch;
    /* every rank of the job still in it: the trainers, then the spares (trainer.survive_spare_ranks), in launch
     * order; the world at first, after a loss the survivors (sides) */
    struct comm *all;
    int n_spare;                   /* all's last ranks that are spares (and idle ones) */
    int n_idle;                    /* TP or PP: all's very last ranks, those that left their model copy */
    bool spare;                    /* this rank is one: it waits in step_begin until a loss or the run's end */
    struct comm *sides;            /* owned after a loss: the survivors */
    struct comm *tr;               /* owned after a loss with spares: the survivors that train (NULL: sides) */
    struct parallel_groups groups; /* owned after a loss: their DP, TP and PP groups */
    bool have_groups;
    /* TP or PP: a model copy's sizes (1 and 1: plain DP); a copy that loses a rank leaves whole, its other ranks
     * idle (they wait as spares do, never to join) */
    int tp_size, pp_size;
    bool idle;              /* this rank left its copy */
    struct comm *mp;        /* owned after a loss with TP or PP: the survivors' TP x PP groups (role_env.mp) */
    struct comm *launch_mp; /* role_env.mp at the start: the launch frees it */
    int *launch_rank;       /* each rank of all's rank at launch: lost ranks are named as the logs name them */
    /* the loss being recovered: when it was found, the step redone, the ranks lost (for step_done) */
    double lost_at, reformed_s;
    int64_t redo;
    char lost_names[256];
    bool said_cost;
    /* a split run: all is the trainers alone (the rollout ranks take no part in re-forming); the lead runs the
     * dispatcher and holds the step's units, and a survivor takes them over when it is lost */
    bool split;
};

/* the one survive object of the process: the test hold reads its step */
static struct survive *g_survive;

/* A split run (rollout ranks feed the trainers) survives a lost trainer where its trainers are DP ranks, plain or TP x
 * PP model copies (a copy that loses a rank leaves, as colocated): the rollout ranks send each whole work unit to
 * the lead (rank 0 of DP rank 0's copy, the dispatcher's), which keeps the step's units and
 * hands them to every trainer, each cutting its DP share as the rollout ranks would have (split/split_survive.c), so
 * the survivors redo a step from the units it already has. The lead's own loss is survived too: the
 * survivors' new lead takes the dispatcher and the data socket over at its own endpoints, which every rollout
 * process is connected to from the start, and grants the redone step's units anew (split/split_source.c,
 * take_lead; with TP or PP the whole copy that is DP rank 0 now); one-step-off it also publishes the version of the
 * step before, from the step start it kept (a copy's from its ranks' kept parts, assembled in host memory: on the CPU
 * only). Not covered: what changes the trainers' data beyond that: SP or CP trainers, EP, spares, fully-async
 * training, the broadcast weight sync (its group spans the rollout ranks). 0, or -1 with why. */
static int survive_split_refusal(const struct grpo_config *cfg, const struct placement_spec *spec, char *why,
                                 size_t whylen)
{
    const char *not_yet = "; a split run survives a lost trainer with DP trainers, plain or over TP x PP model "
                          "copies, with or without ZeRO-1 (docs/operations.md)";
    const bool gpu = strcmp(config_device(cfg), "cpu") != 0, model = spec->tp_size > 1 || spec->pp_size > 1;
    struct {
        bool on;
        const char *what;
    } no[] = {
        /* a new lead's copy assembles the one-step-off version it kept from its parts' host copies: on the CPU */
        {model && gpu && strcmp(cfg->rollout_mode, "async") == 0,
         "TP or PP trainers on GPUs one-step-off (" KEY_rollout_mode "=async)"},
        {spec->cp_size > 1, "sequence or context parallelism"},
        {spec->ep_size > 1, KEY_actor_megatron_expert_model_parallel_size " > 1"},
        {cfg->trainer_survive_spare_ranks > 0, KEY_trainer_survive_spare_ranks " > 0"},
        {cfg->async_enable, "fully-async training (async_training.*)"},
        {strcmp(cfg->rollout_weight_sync, "broadcast") == 0, KEY_rollout_weight_sync "=broadcast"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (no[i].on)
            return error_set(why, whylen,
                             KEY_trainer_survive_trainer_loss " with rollout ranks (" KEY_placement_rollout_ranks
                                                              ", a split run) and %s is not covered yet%s",
                             no[i].what, not_yet);
    /* on tcp the trainers' lead endpoints sit at data port + 128 (placement_lead_endpoint), above the data ports,
     * the dispatcher's and the rollout ranks' relays */
    if (spec->trainer_ranks + spec->rollout_ranks + 1 > PLACEMENT_PORTS_PER_RUN / 2)
        return error_set(why, whylen,
                         KEY_trainer_survive_trainer_loss
                         " in a split run of %d trainer and %d rollout ranks: at most "
                         "%d ranks in all are covered yet (the lead endpoints a survivor takes over a lost lead at "
                         "are the data ports + %d)",
                         spec->trainer_ranks, spec->rollout_ranks, PLACEMENT_PORTS_PER_RUN / 2 - 1,
                         PLACEMENT_PORTS_PER_RUN / 2);
    return 0;
}

int survive_check(const struct grpo_config *cfg, const struct placement_spec *spec, bool colocated, int world,
                  char *why, size_t whylen)
{
    const char *not_yet = "; it covers colocated data parallelism, plain or over model copies of TP x PP ranks "
                          "(with spares, or with ZeRO-1), on the CPU or GPUs "
                          "(docs/operations.md)";
    char ft[512];
    if (!comm_ft_available(ft, sizeof ft))
        return error_set(why, whylen, KEY_trainer_survive_trainer_loss ": %s", ft);
    /* a split run (rollout ranks): DP trainers, plain or TP x PP copies, the dispatcher's lead kept
     * (survive_split_refusal) */
    if (world > 1 && !colocated)
        return survive_split_refusal(cfg, spec, why, whylen);
    /* on GPUs (as on the CPU) the step's start is copied through host memory and the DP group's NCCL twin made
     * again over the survivors (a spare that joins among them, its state staged through host memory too, its shard
     * of TP or PP cut there); ZeRO-1's block copies go between host buffers over MPI, and the blocks are re-sharded
     * into the devices */
    struct {
        int size;
        const char *key;
    } sizes[] = {{spec->cp_size, spec->cp_key ? spec->cp_key : KEY_actor_megatron_context_parallel_size},
                 {spec->ep_size, KEY_actor_megatron_expert_model_parallel_size},
                 {spec->rollout_tp, KEY_rollout_tensor_model_parallel_size}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].size > 1)
            return error_set(why, whylen, KEY_trainer_survive_trainer_loss " with %s=%d is not covered yet%s",
                             sizes[i].key, sizes[i].size, not_yet);
    const bool split_model = spec->tp_size > 1 || spec->pp_size > 1;
    const char *model_key = spec->tp_size > 1 ? KEY_actor_megatron_tensor_model_parallel_size
                                              : KEY_actor_megatron_pipeline_model_parallel_size;
    const int model_size = spec->tp_size > 1 ? spec->tp_size : spec->pp_size;
    if (split_model && cfg->trainer_survive_spare_ranks > 0 && cfg->arr_model_lora_rank > 0)
        return error_set(why, whylen,
                         KEY_trainer_survive_spare_ranks " with %s=%d and LoRA (" KEY_arr_model_lora_rank
                                                         ") is not covered yet: a spare takes a shard of the whole "
                                                         "weights only",
                         model_key, model_size);
    /* ZeRO-1 over TP x PP copies (spares too): each position's blocks rebuilt as plain DP's (recover) */
    return 0;
}

/* The collective plane's handler: a peer of a watched group is lost (or a survivor revoked the group). */
static void on_peer_lost(void *ud, struct comm *c, const char *what)
{
    struct survive *s = ud;
    if (!s->armed) {
        log_error("survive",
                  "%s outside a step (before the first, after the last, or while the survivors re-formed): a rank "
                  "lost there is not survived; ending the job",
                  what);
        return; /* the caller ends the job */
    }
    s->armed = false;
    s->lost_at = clock_now_s();
    if (s->spare)
        log_warn("survive", "%s: %s: revoking the job's groups to re-form them without the lost rank",
                 s->idle ? "idle (left its model copy)" : "spare", what);
    else
        log_warn("survive", "step %lld: %s: revoking the trainers' groups to re-form them without the lost rank",
                 (long long)s->step, what);
    comm_revoke(c);
    for (int i = 0; i < s->n_watch; i++)
        comm_revoke(s->watch[i]);
    longjmp(s->jb, 1);
}

static void watch(struct survive *s, struct comm *c)
{
    if (!c || s->n_watch >= (int)(sizeof s->watch / sizeof s->watch[0]))
        return;
    comm_ft_watch(c);
    s->watch[s->n_watch++] = c;
}

/* On GPUs with TP or PP: the NCCL twins of the model copy's groups, watched as the MPI ones (a rank waiting in one
 * for a lost peer comes back too, and the loss's revoke aborts it) */
static void watch_model_devices(struct survive *s)
{
    struct comm *dev[3];
    const int n = s->t ? trainer_model_device_groups(s->t, dev) : 0;
    for (int i = 0; i < n; i++)
        watch(s, dev[i]);
}

struct survive *survive_create(struct role_env *env, void (*reform)(void *ud, const struct survive_loss *loss),
                               void *ud)
{
    struct survive *s = xcalloc(1, sizeof *s);
    s->env = env;
    s->reform = reform;
    s->ud = ud;
    s->step = -1;
    s->snap[0] = trainer_snapshot_new();
    s->snap[1] = trainer_snapshot_new();
    s->split = env->spec.rollout_ranks > 0;
    s->all = s->split ? env->trainers : env->world;
    s->n_spare = env->spare_ranks;
    s->spare = env->spare;
    s->tp_size = env->spec.tp_size > 1 ? env->spec.tp_size : 1; /* the run's (a spare holds whole layers) */
    s->pp_size = env->spec.pp_size > 1 ? env->spec.pp_size : 1;
    s->launch_mp = env->mp;
    const int n = comm_size(s->all);
    s->launch_rank = xmalloc((size_t)n * sizeof *s->launch_rank);
    for (int r = 0; r < n; r++)
        s->launch_rank[r] = r; /* the trainers are the world's first ranks, in its order, the spares after them */
    if (!s->split)             /* a split run's world spans the rollout ranks, which go on as they are */
        watch(s, env->world);
    if (!env->spare) { /* a spare's own groups stay whole: it leaves through them if it never joins */
        watch(s, env->trainers);
        if (env->dp != env->trainers)
            watch(s, env->dp);
        if (s->tp_size > 1) /* a rank waiting on its copy's peers comes back too */
            watch(s, env->tp);
        if (s->pp_size > 1)
            watch(s, env->pp);
        if (s->tp_size * s->pp_size > 1)
            watch(s, env->mp);
    }
    comm_set_peer_lost_handler(on_peer_lost, s);
    comm_set_test_hold(survive_test_hold);
    g_survive = s;
    const int copies = (n - env->spare_ranks) / (s->tp_size * s->pp_size);
    if (env->rank == 0 && s->tp_size * s->pp_size > 1 && env->spare_ranks > 0)
        log_info("survive",
                 "trainer-loss survival on (" KEY_trainer_survive_trainer_loss ") over %d model copies of TP %d x PP "
                 "%d ranks, %d spare rank(s) (" KEY_trainer_survive_spare_ranks ", launch ranks %d..%d): a lost "
                 "rank's place is taken by a spare, its shard rebuilt from a copy that lost none (DP stays %d); "
                 "with no spare left a copy that loses a rank leaves; each step's start is kept in memory",
                 copies, s->tp_size, s->pp_size, env->spare_ranks, n - env->spare_ranks, n - 1, copies);
    else if (env->rank == 0 && s->tp_size * s->pp_size > 1)
        log_info("survive",
                 "trainer-loss survival on (" KEY_trainer_survive_trainer_loss ") over %d model copies of TP %d x PP "
                 "%d ranks: %s; each step's start is kept in memory",
                 copies, s->tp_size, s->pp_size,
                 copies > 1 ? "a copy that loses a rank leaves (its other ranks idle until the run ends) and the "
                              "others redo the step with one DP rank fewer"
                            : "DP 1: a lost rank's shard has no replica, so a loss stops the run (a relaunch "
                              "resumes from the newest checkpoint)");
    else if (env->rank == 0 && s->split)
        log_info("survive",
                 "trainer-loss survival on (" KEY_trainer_survive_trainer_loss ") in a split run: a lost trainer's "
                 "step is redone by the other %d with one DP rank fewer, from the step's work units this rank keeps "
                 "(the rollout ranks send each whole to it); at its own loss the next takes the lead and the "
                 "dispatcher over; each step's start is kept in memory",
                 n - 1);
    else if (env->rank == 0 && !env->spare_ranks)
        log_info("survive",
                 "trainer-loss survival on (" KEY_trainer_survive_trainer_loss "): a lost rank's step is redone by "
                 "the other %d ranks with one DP rank fewer; each step's start is kept in memory",
                 n - 1);
    else if (env->rank == 0)
        log_info("survive",
                 "trainer-loss survival on (" KEY_trainer_survive_trainer_loss "), %d spare rank(s) "
                 "(" KEY_trainer_survive_spare_ranks ", launch ranks %d..%d): a lost rank's step is redone with a "
                 "spare in its place (DP stays %d), with one DP rank fewer once none is left; each step's start is "
                 "kept in memory",
                 env->spare_ranks, n - env->spare_ranks, n - 1, n - env->spare_ranks);
    return s;
}

void survive_free(struct survive *s)
{
    if (!s)
        return;
    comm_set_peer_lost_handler(NULL, NULL);
    comm_set_test_hold(NULL);
    if (g_survive == s)
        g_survive = NULL;
    trainer_snapshot_free(s->snap[0]);
    trainer_snapshot_free(s->snap[1]);
    if (s->have_groups)
        parallel_groups_free(&s->groups);
    if (s->mp) {
        if (s->env->mp == s->mp) /* the launch frees its own */
            s->env->mp = s->launch_mp;
        comm_free(s->mp);
    }
    if (s->tr)
        comm_free(s->tr);
    if (s->sides)
        comm_free(s->sides);
    free(s->launch_rank);
    free(s);
}

/* A spare's step start: it waits, in one receive on every rank of the job that a loss (or a survivor's revoke)
 * ends by jumping back to the recovery point, or that the lead's word at the run's end ends: 1 then (out of the
 * loop). */
static int spare_wait(struct survive *s)
{
    const int me = s->launch_rank[comm_rank(s->all)];
    if (s->idle)
        log_info("survive", "launch rank %d idle until the run ends (it left its model copy)", me);
    else
        log_info("survive", "spare (launch rank %d) waiting to take a lost rank's place", me);
    survive_test_hold("spare");
    s->armed = true;
    int32_t word = 0;
    if (comm_ft_wait_word(s->all, 0, &word) != 0) /* from the lead: all's rank 0 (the trainers come first) */
        check_failf(__FILE__, __LINE__, "spare (launch rank %d): its wait failed without a loss", me);
    s->armed = false;
    if (s->idle)
        log_info("survive", "launch rank %d released: the run ended", me);
    else
        log_info("survive", "spare (launch rank %d) released: the run ended without needing it", me);
    return 1;
}

/* struct trainer_recovery's hooks (ud: the survive object) */
static int step_begin(void *ud, int64_t k)
{
    struct survive *s = ud;
    if (s->spare) {
        s->step = k; /* the step it waits at (survive_test_hold's "spare") */
        return spare_wait(s);
    }
    const double t0 = clock_now_s();
    /* with ZeRO-1 a collective (each block's copy to the next rank): a loss in it comes back to the previous
     * step's start, kept in the other slot (s->step is still that step's; none before the first step) */
    trainer_snapshot_take(s->t, s->snap[k % 2]);
    s->step = k;
    if (!s->said_cost && s->env->rank == 0) { /* what the key costs a step, once */
        s->said_cost = true;
        if (trainer_snapshot_deferred(s->snap[k % 2]))
            log_info("survive",
                     "step %lld's start kept by its first optimizer step (%.1f MB: the weights and AdamW's moments, "
                     "each chunk copied as the step reads it; every step)",
                     (long long)k, (double)trainer_snapshot_bytes(s->snap[k % 2]) / 1e6);
        else if (trainer_snapshot_beside(s->snap[k % 2]))
            log_info("survive",
                     "step %lld's start copied out of the GPU beside the step's work (%.1f MB of pinned host memory: "
                     "the weights and AdamW's moments, on a copy stream; its first optimizer step waits for the copy; "
                     "every step)",
                     (long long)k, (double)trainer_snapshot_bytes(s->snap[k % 2]) / 1e6);
        else
            log_info(
                "survive", "step %lld's start kept in %.3f s (%.1f MB: the weights, AdamW's moments%s; every step)",
                (long long)k, clock_now_s() - t0, (double)trainer_snapshot_bytes(s->snap[k % 2]) / 1e6,
                s->t && trainer_zero1(s->t) ? " (this rank's ZeRO-1 block, and a copy of the previous rank's)" : "");
    }
    s->armed = true;
    return 0;
}

/* Past the last step: a loss ends the job; the lead releases the spares (each waits in spare_wait) */
static void disarm(void *ud)
{
    struct survive *s = ud;
    s->armed = false;
    if (s->spare || comm_rank(s->all) != 0)
        return;
    for (int r = comm_size(s->all) - s->n_spare; r < comm_size(s->all); r++)
        if (comm_ft_send_word(s->all, r, 1) != 0)
            log_warn("survive", "spare (launch rank %d) was lost while it waited: nothing to release",
                     s->launch_rank[r]);
}

static void step_done(void *ud, int64_t k)
{
    struct survive *s = ud;
    if (s->t && !s->spare && trainer_snapshot_step(s->snap[k % 2]) == k)
        trainer_snapshot_settle(s->t, s->snap[k % 2]); /* whole now: a later loss may need it (its redo, or a peer's) */
    if (s->lost_at <= 0 || k < s->redo)
        return;
    if (s->env->rank == 0)
        log_info("survive",
                 "step %lld (redone) completed %.2f s after the loss of %s was found (re-forming took %.3f s)",
                 (long long)k, clock_now_s() - s->lost_at, s->lost_names, s->reformed_s);
    s->lost_at = 0;
}

/* "rank 2", "ranks 1 and 2", "ranks 1, 2 and 3" (launch ranks) */
static void name_ranks(const int *r, int n, char *out, size_t len)
{
    int at = snprintf(out, len, "rank%s", n > 1 ? "s" : "");
    for (int i = 0; i < n && at > 0 && (size_t)at < len; i++)
        at += snprintf(out + at, len - (size_t)at, "%s%d", i == 0 ? " " : i == n - 1 ? " and " : ", ", r[i]);
}

/* the launch rank of the lost rank old_rank (of all) */
static int names_of(int old_rank, const int *names, const int *lost, int n)
{
    for (int i = 0; i < n; i++)
        if (lost[i] == old_rank)
            return names[i];
    return -1;
}

/* TP or PP, where no model copy is left whole: the run stops, naming the lost ranks and the checkpoint a relaunch
 * resumes from (as without the key). */
static void say_no_replica(struct survive *s, int64_t redo, int old_copies)
{
    char ckpt[4096];
    const bool have = trainer_latest_checkpoint(s->t, ckpt, sizeof ckpt) == 0;
    log_error("survive",
              "%s lost at step %lld: no model copy of TP %d x PP %d ranks is left whole (DP %d: %s), so the lost "
              "shard cannot be rebuilt from a replica; the run stops. A relaunch resumes from %s%s",
              s->lost_names, (long long)redo, s->tp_size, s->pp_size, old_copies,
              old_copies > 1 ? "every copy lost a rank" : "the lost rank's shard has no replica",
              have ? "the checkpoint " : "the start: no checkpoint is written yet", have ? ckpt : "");
}

static int recover(void *ud)
{
    struct survive *s = ud;
    struct role_env *env = s->env;
    struct comm *old = s->all; /* the trainers (in their layout's order), then the spares or idle ranks */
    const int old_size = comm_size(old), old_trainers = old_size - s->n_spare;
    const int T = s->tp_size, P = s->pp_size, M = T * P; /* a model copy's ranks */
    const bool split_model = M > 1;
    const struct parallel_sizes sz = {T, P, 1, 1};
    char err[1024];
    const double t0 = s->lost_at > 0 ? s->lost_at : clock_now_s();
    /* the survivors: MPI agrees on who they are (a rank that dies meanwhile is left out too) */
    struct comm *sides = comm_shrink(old, err, sizeof err);
    if (!sides) {
        log_error("survive", "step %lld: re-forming without the lost rank: %s; ending the run", (long long)s->step,
                  err);
        return -1;
    }
    int lost[MAX_LOST] = {0}, names[MAX_LOST] = {0};
    int n_lost = comm_lost_ranks(old, sides, lost, MAX_LOST);
    n_lost = n_lost < MAX_LOST ? n_lost : MAX_LOST;
    bool lead_lost = false;
    int lost_trainers = 0; /* the lost ranks that trained (lost[] is increasing: they come first) */
    for (int i = 0; i < n_lost; i++) {
        names[i] = s->launch_rank[lost[i]];
        lead_lost |= lost[i] == 0;
        lost_trainers += lost[i] < old_trainers;
    }
    name_ranks(names, n_lost, s->lost_names, sizeof s->lost_names);
    /* a split run's lead runs the dispatcher and takes the rollout ranks' units: the survivors' new lead takes them
     * over at the redo (split/split_source.c, take_lead) */
    /* TP or PP: the model copies (DP ranks) that lost a rank leave whole; the others keep their positions, their
     * DP ranks renumbered in order */
    const int old_copies = old_trainers / M, mo = comm_rank(old);
    const int first_idle = old_size - s->n_idle; /* all's ranks: the trainers, the spares, the idle ones */
    bool *broken = xcalloc((size_t)old_copies + 1, sizeof *broken), *gone = xcalloc((size_t)old_size, sizeof *gone);
    int *nlost = xcalloc((size_t)old_copies + 1, sizeof *nlost), *fill = xcalloc((size_t)n_lost + 1, sizeof *fill);
    bool *joined_at = xcalloc((size_t)M, sizeof *joined_at); /* the positions (pp x TP + tp) a spare takes */
    struct parallel_coords pc = {0};
    for (int i = 0; i < n_lost; i++) {
        gone[lost[i]] = true;
        if (split_model && lost[i] < old_trainers && parallel_coords_sized(lost[i], old_trainers, &sz, &pc) == 0)
            nlost[pc.dp_rank]++;
    }
    /* the spares left take the lost ranks' places, a copy at a time (all of its lost ranks, or it leaves), where a
     * copy that lost none holds each lost shard to rebuild it from */
    int spares_left = 0, intact = 0, n_fill = 0, donor = -1;
    for (int r = old_trainers; r < first_idle; r++)
        spares_left += !gone[r];
    for (int d = 0; d < old_copies && split_model; d++) {
        intact += nlost[d] == 0;
        donor = donor < 0 && nlost[d] == 0 ? d : donor;
    }
    for (int d = 0; d < old_copies && split_model; d++) {
        if (nlost[d] == 0)
            continue;
        if (intact > 0 && nlost[d] <= spares_left)
            spares_left -= nlost[d];
        else
            broken[d] = true;
    }
    for (int i = 0; i < n_lost && split_model; i++)
        if (lost[i] < old_trainers && parallel_coords_sized(lost[i], old_trainers, &sz, &pc) == 0 &&
            !broken[pc.dp_rank]) {
            fill[n_fill++] = lost[i];
            joined_at[pc.pp_rank * T + pc.tp_rank] = true;
        }
    int copies = 0, donor_dp = 0;
    for (int d = 0; d < old_copies; d++) {
        donor_dp += d < donor && !broken[d];
        copies += !broken[d];
    }
    const bool was_trainer = !s->spare && mo < old_trainers;
    bool leaves = false;
    /* key: the order in the survivors' group (the trainers in their new layout's order, then the spares, then the
     * idle ranks); takes: the lost rank a spare takes the place of; here: where this rank trained (a joining spare:
     * the lost rank's place), my_pos its TP x PP position (pp x T + tp), -1 for none */
    int key = mo, takes = -1, my_pos = -1;
    struct parallel_coords here = {0};
    if (split_model) {
        if (s->spare && !s->idle) { /* this spare's turn: the spares left before it in all */
            int j = 0;
            for (int r = old_trainers; r < mo; r++)
                j += !gone[r];
            takes = j < n_fill ? fill[j] : -1;
        }
        const int at_rank = was_trainer ? mo : takes;
        if (at_rank >= 0 && parallel_coords_sized(at_rank, old_trainers, &sz, &pc) != 0)
            check_failf(__FILE__, __LINE__, "rank %d of %d trainers: not a TP %d x PP %d layout", at_rank, old_trainers,
                        T, P);
        here = pc;
        leaves = was_trainer && broken[here.dp_rank];
        if (at_rank >= 0)
            my_pos = here.pp_rank * T + here.tp_rank;
        if (at_rank >= 0 && !leaves) {
            int dp = 0; /* the whole copies before this one */
            for (int d = 0; d < here.dp_rank; d++)
                dp += !broken[d];
            key = (here.pp_rank * copies + dp) * T + here.tp_rank;
        } else {
            key = copies * M + (s->spare && !s->idle ? 0 : old_size) + mo;
        }
        lead_lost = lead_lost || broken[0]; /* the lead (DP 0, TP 0, PP 0) lost, or leaving with its copy */
    }
    int n_idle = 0; /* after this loss: the idle ranks left, and the survivors of the copies that leave */
    for (int r = 0; r < old_size && split_model; r++) {
        const bool left =
            r < old_trainers && parallel_coords_sized(r, old_trainers, &sz, &pc) == 0 && broken[pc.dp_rank];
        n_idle += !gone[r] && (r >= first_idle || left);
    }
    /* ZeRO-1's blocks are kept per DP group (a model copy's rank at each TP x PP position with the same position of
     * the other copies); each block's copy on the next DP rank: the lost DP ranks of this rank's position are the
     * copies that leave (their live ranks' blocks go with them, rebuilt from the next copy's like a lost rank's),
     * and the copies whose rank at this position a spare takes (the spare joins with no block) */
    int lost_dp[MAX_LOST] = {0}, n_lost_dp = 0;
    for (int d = 0; d < old_copies && split_model && n_lost_dp < MAX_LOST; d++)
        if (broken[d])
            lost_dp[n_lost_dp++] = d;
    for (int i = 0; i < n_fill && my_pos >= 0 && n_lost_dp < MAX_LOST; i++)
        if (parallel_coords_sized(fill[i], old_trainers, &sz, &pc) == 0 && pc.pp_rank * T + pc.tp_rank == my_pos)
            lost_dp[n_lost_dp++] = pc.dp_rank;
    for (int i = 0; i < lost_trainers && !split_model; i++)
        lost_dp[n_lost_dp++] = lost[i];
    const bool my_pos_joined = split_model && was_trainer && !leaves && my_pos >= 0 && joined_at[my_pos];
    free(broken), free(gone), free(nlost), free(fill), free(joined_at);
    if (leaves) /* before any collective of the re-forming: the new lead takes over the run's files after them */
        trainer_leave(s->t);
    /* the step to redo: the earliest any trainer is in (one whose copy of step k's last collective completed is in
     * k + 1 already, its start of k kept in the other slot); a spare is in none */
    int64_t neg = s->spare ? INT64_MIN + 1 : -s->step;
    comm_allreduce_max(sides, &neg, 1, COMM_I64);
    const int64_t redo = -neg;
    struct trainer_snapshot *snap =
        !s->spare && trainer_snapshot_step(s->snap[redo % 2]) == redo ? s->snap[redo % 2] : NULL;
    if (split_model) { /* the survivors in the order of their new layout */
        struct comm *ordered = comm_split(sides, 0, key);
        comm_free(sides);
        sides = ordered;
        if (copies == 0) {
            if (comm_rank(sides) == 0)
                say_no_replica(s, redo, old_copies);
            comm_free(sides);
            return -1;
        }
    }
    /* the survivors' layout: the trainers that are left (all's first ranks, in order), then as many spares as
     * trainers were lost; the other spares stay spares (with TP or PP: the copies left whole, no spare joins) */
    const int size = comm_size(sides), me = comm_rank(sides);
    const int kept = split_model ? copies * M : old_trainers - lost_trainers, spares = size - kept;
    const int join = split_model ? n_fill : lost_trainers < spares ? lost_trainers : spares;
    const int D = split_model ? kept : kept + join;
    const bool trains = me < D, joins = s->spare && trains;
    /* every survivor can redo it: the same answer on all of them */
    /* only spares lost (one died while it waited, and a later loss found it): the trainers redo the step as they
     * were, DP unchanged */
    int ok = (s->spare || leaves || snap) && n_lost > 0 && kept > 0;
    /* ZeRO-1: a block lost with its copy cannot be rebuilt (every rank, spares too, sees the same ranks lost) */
    const bool zero = env->cfg->actor_megatron_use_distributed_optimizer;
    char zero_why[256] = "";
    if (ok && zero &&
        trainer_zero1_restorable(lost_dp, n_lost_dp, split_model ? old_copies : old_trainers, zero_why,
                                 sizeof zero_why) != 0)
        ok = 0;
    if (comm_agree(sides, &ok) != 0)
        ok = 0;
    if (!ok && zero_why[0]) {
        log_error("survive", "%s lost at step %lld: %s; ending the run", s->lost_names, (long long)redo, zero_why);
        comm_free(sides);
        return -1;
    }
    if (!ok) {
        log_error("survive",
                  "%s lost at step %lld, but not every survivor holds that step's start (this rank: %s) or no "
                  "trainer is left; ending the run",
                  s->lost_names, (long long)redo,
                  s->spare ? "a spare"
                  : snap   ? "yes"
                           : "no");
        comm_free(sides);
        return -1;
    }
    /* launch ranks follow their ranks into the new order */
    int mine = s->launch_rank[comm_rank(old)];
    int *launch_rank = xmalloc((size_t)size * sizeof *launch_rank);
    comm_allgather(sides, &mine, launch_rank, 1, COMM_I32);
    free(s->launch_rank);
    s->launch_rank = launch_rank;
    /* with spares or idle ranks the trainers are a group of their own (each of the others one alone); without,
     * the survivors */
    struct comm *tr = size > D ? comm_split(sides, trains ? 0 : 1 + me - D, me) : sides;
    if (tr != sides)
        comm_set_name(tr, trains ? "trainers" : s->spare ? "spare" : "idle");
    /* the groups of an earlier loss are dead too: freed (their wrappers; revoked ones are not MPI-freed) */
    if (s->have_groups)
        parallel_groups_free(&s->groups);
    s->have_groups = false;
    if (s->mp) {
        if (env->mp == s->mp)
            env->mp = s->launch_mp;
        comm_free(s->mp);
        s->mp = NULL;
    }
    if (s->tr)
        comm_free(s->tr);
    if (s->sides)
        comm_free(s->sides);
    s->sides = sides;
    s->all = sides;
    s->n_spare = size - D;
    s->n_idle = split_model ? n_idle : 0;
    s->tr = NULL;
    s->n_watch = 0;
    watch(s, sides);
    if (!trains) { /* still a spare, or one that left its copy: back to its wait, on the survivors */
        comm_free(tr);
        if (leaves) {
            s->idle = true;
            s->spare = true;
            env->spare = true;
            log_warn("survive",
                     "launch rank %d (TP rank %d, PP stage %d of DP rank %d) leaves the training: its model copy "
                     "lost %s at step %lld, and the %d whole copies go on without it; it stays idle until the run "
                     "ends",
                     mine, here.tp_rank, here.pp_rank, here.dp_rank, s->lost_names, (long long)redo, copies);
            char left[400];
            snprintf(left, sizeof left, "TP rank %d, PP stage %d of DP rank %d of %d: its copy lost %s at step %lld",
                     here.tp_rank, here.pp_rank, here.dp_rank, old_copies, s->lost_names, (long long)redo);
            const struct survive_loss gone = {.ranks = names, .n = n_lost, .reason = left, .left = true};
            if (s->reform)
                s->reform(s->ud, &gone);
        } else if (s->idle) {
            log_info("survive", "launch rank %d stays idle: %s lost", mine, s->lost_names);
        } else {
            log_info("survive", "spare (launch rank %d) stays a spare: %s lost, %d DP ranks go on", mine, s->lost_names,
                     D);
        }
        return 0;
    }
    if (tr != sides) {
        s->tr = tr;
        watch(s, tr);
    }
    /* the trainers' layout: plain DP over all of them, or the whole copies' TP x PP as before */
    const struct placement_spec layout = {.tp_size = T, .pp_size = P, .cp_size = 1, .ep_size = 1, .rollout_tp = 1};
    struct placement at;
    char why[256];
    if (placement_of(&layout, comm_rank(tr), comm_size(tr), &at, why, sizeof why) != 0)
        check_failf(__FILE__, __LINE__, "the survivors' layout: %s", why);
    struct parallel_groups g;
    if (parallel_groups_init_sized(&g, tr, &sz) != 0)
        check_failf(__FILE__, __LINE__, "the survivors' groups: %d ranks", comm_size(tr));
    s->groups = g;
    s->have_groups = true;
    env->trainers = tr;
    env->dp = g.dp;
    env->tp = g.tp;
    env->pp = g.pp;
    if (split_model) { /* the model copy's group: its TP x PP ranks, ranked pp x TP + tp (as the launch makes it) */
        s->mp = comm_split(tr, at.dp, at.pp * T + at.tp);
        comm_set_name(s->mp, "mp");
        env->mp = s->mp;
    }
    env->at = at;
    env->rank = comm_rank(tr);
    if (!s->split) /* a split run's world is the rollout ranks' too: its size stays the launch's */
        env->world_size = comm_size(tr);
    env->spare = false;
    env->spare_ranks = s->n_spare;
    s->spare = false;
    watch(s, g.dp);
    if (split_model) {
        if (T > 1)
            watch(s, g.tp);
        if (P > 1)
            watch(s, g.pp);
        watch(s, s->mp);
    }
    if (joins && split_model) /* its shard's model, for the replica's values (below) */
        trainer_join_shard(s->t, at.tp, T, at.pp, P, g.tp, g.pp, s->mp);
    if (trainer_reform(s->t, tr, g.dp, at.dp, at.dp_size, err, sizeof err) != 0) {
        log_error("survive", "moving the trainer onto %d DP ranks: %s; ending the run", at.dp_size, err);
        return -1;
    }
    if (split_model) {
        trainer_reform_groups(s->t, g.tp, g.pp, s->mp);
        watch_model_devices(s);
    }
    if (trainer_dp_device_group(s->t)) { /* on GPUs: DP's NCCL twin, made again over the survivors */
        watch(s, trainer_dp_device_group(s->t));
        if (env->rank == 0)
            log_info("survive",
                     "the lost group's NCCL communicators aborted; a new one over the %d survivors (its unique id "
                     "from their rank 0 over their shrunk MPI group)",
                     at.dp_size);
    }
    /* a spare that joins takes part with no snapshot (with ZeRO-1 the re-sharding is collective) */
    if (trainer_snapshot_restore(s->t, joins ? NULL : snap, lost_dp, n_lost_dp, err, sizeof err) != 0) {
        log_error("survive", "restoring step %lld's start on %d DP ranks: %s; ending the run", (long long)redo,
                  at.dp_size, err);
        return -1;
    }
    if (split_model && (joins || my_pos_joined)) { /* the shard from its replica on the copy that lost no rank */
        const size_t bytes = trainer_state_share(s->t, donor_dp) + trainer_ref_share(s->t, donor_dp);
        if (joins)
            log_info("survive",
                     "spare (launch rank %d) took launch rank %d's place (TP rank %d, PP stage %d of DP rank %d of "
                     "%d) for step %lld: took that shard's step start (weights, AdamW's moments and step count, the "
                     "reference's weights, the run state and data cursor; %.1f MB) from its replica on DP rank %d "
                     "(launch rank %d)",
                     mine, names_of(takes, names, lost, n_lost), at.tp, at.pp, at.dp, at.dp_size, (long long)redo,
                     (double)bytes / 1e6, donor_dp, s->launch_rank[(at.pp * at.dp_size + donor_dp) * T + at.tp]);
    } else if (join > 0) { /* the spares that joined take the step's start from DP rank 0 (every old rank holds it) */
        const size_t bytes = trainer_state_share(s->t, 0);
        if (joins)
            log_info("survive",
                     "spare (launch rank %d) joined as DP rank %d of %d for step %lld: took the step's start "
                     "(weights, %s, the run state and data cursor; %.1f MB) from DP rank 0 (launch rank %d)",
                     mine, at.dp, at.dp_size, (long long)redo,
                     zero ? "AdamW's step count, its ZeRO-1 block of the moments re-sharded over the survivors"
                          : "AdamW's moments and step count",
                     (double)bytes / 1e6, s->launch_rank[0]);
    }
    const int old_dp = split_model ? old_copies : old_trainers;
    char reason[96];
    if (lost_trainers > 0)
        snprintf(reason, sizeof reason, "survived: DP %d -> %d at step %lld", old_dp, at.dp_size, (long long)redo);
    else
        snprintf(reason, sizeof reason, "survived: a spare lost while it waited (step %lld)", (long long)redo);
    const struct survive_loss loss = {.ranks = names, .n = n_lost, .reason = reason};
    if (s->reform)
        s->reform(s->ud, &loss);
    if (lead_lost && env->rank == 0)
        log_info("survive",
                 "the lead (rank 0) %s: rank %d leads from step %lld (the decisions, metrics.jsonl and the other "
                 "sinks, checkpoints, the audit files and the run's log lines)",
                 split_model ? "lost or left with its model copy" : "lost", s->launch_rank[0], (long long)redo);
    /* the lead (it decides, logs, checkpoints and writes the audit files for every rank) is the survivors' rank
     * 0: with the old one lost, the run's records move to it */
    if (trainer_reform_records(s->t, lead_lost, err, sizeof err) != 0) {
        log_error("survive", "the run's records after the loss of %s: %s; ending the run", s->lost_names, err);
        return -1;
    }
    s->redo = redo;
    s->reformed_s = clock_now_s() - t0;
    if (env->rank == 0) {
        char note[200] = "";
        if (split_model) {
            int at_n = snprintf(note, sizeof note, "; TP %d x PP %d", T, P);
            if (join > 0 && at_n > 0 && (size_t)at_n < sizeof note)
                at_n += snprintf(note + at_n, sizeof note - (size_t)at_n,
                                 ": %d spare(s) took the lost ranks' places, %d spare(s) left", join,
                                 s->n_spare - s->n_idle);
            if (copies < old_copies && at_n > 0 && (size_t)at_n < sizeof note) {
                at_n += snprintf(note + at_n, sizeof note - (size_t)at_n, "%s the copy that lost it left",
                                 join > 0 ? ";" : ":");
                int first = 1;
                for (int r = size - s->n_idle; r < size && at_n > 0 && (size_t)at_n < sizeof note; r++, first = 0)
                    at_n += snprintf(note + at_n, sizeof note - (size_t)at_n, "%s%d",
                                     first ? (s->n_idle > 1 ? ", launch ranks " : ", launch rank ") : ",",
                                     s->launch_rank[r]);
                if (at_n > 0 && (size_t)at_n < sizeof note)
                    snprintf(note + at_n, sizeof note - (size_t)at_n, " idle");
            }
        } else if (join > 0 || s->n_spare > 0) {
            snprintf(note, sizeof note, "; %d spare(s) joined, %d left", join, s->n_spare);
        }
        if (lost_trainers > 0)
            log_info("survive", "%s lost at step %lld; %d DP ranks go on, step %lld redone (of %d %s, %d survive%s)",
                     s->lost_names, (long long)redo, at.dp_size, (long long)redo, old_dp,
                     split_model ? "DP ranks" : "ranks", split_model ? intact : kept, note);
        else
            log_info("survive", "spare %s lost while it waited (at step %lld); %d DP ranks go on, step %lld redone%s",
                     s->lost_names, (long long)redo, at.dp_size, (long long)redo, note);
    }
    return 0;
}

const float *survive_step_start(const struct survive *s, int64_t k, size_t *n)
{
    *n = 0;
    if (!s || k < 1 || trainer_snapshot_step(s->snap[k % 2]) != k)
        return NULL;
    return trainer_snapshot_params(s->snap[k % 2], n);
}

void survive_attach(struct survive *s, struct trainer *t)
{
    s->t = t;
    if (!s->spare) { /* the copies' memory, before the first step */
        const double t0 = clock_now_s();
        const size_t bytes = trainer_snapshot_reserve(t, s->snap[0]) + trainer_snapshot_reserve(t, s->snap[1]);
        if (s->env->rank == 0)
            log_info("survive", "memory for two copies of the state reserved: %.1f MB in %.2f s", (double)bytes / 1e6,
                     clock_now_s() - t0);
    }
    watch(s, trainer_dp_device_group(t)); /* on GPUs: a lost peer found in NCCL is survived too */
    watch_model_devices(s);
    const struct trainer_recovery r = {.ctx = s,
                                       .point = &s->jb,
                                       .step_begin = step_begin,
                                       .recover = recover,
                                       .step_done = step_done,
                                       .disarm = disarm};
    trainer_set_recovery(t, &r);
}

/* one POINT:STEP:RANK of GRPO_TEST_KILL_AT */
struct hold_at {
    char point[32];
    long long step;
    int rank;
    bool done;
};

/* GRPO_TEST_KILL_AT's holds into at (at most max): how many, or -1 where it is not POINT:STEP:RANK[,...] */
static int parse_holds(const char *spec, struct hold_at *at, int max)
{
    int n = 0;
    for (const char *p = spec; *p;) {
        const char *c1 = strchr(p, ':');
        char *end = NULL, *end2 = NULL;
        if (n >= max || !c1 || c1 == p || (size_t)(c1 - p) >= sizeof at[n].point)
            return -1;
        memcpy(at[n].point, p, (size_t)(c1 - p));
        at[n].point[c1 - p] = '\0';
        at[n].step = strtoll(c1 + 1, &end, 10);
        if (end == c1 + 1 || *end != ':')
            return -1;
        at[n].rank = (int)strtol(end + 1, &end2, 10);
        if (end2 == end + 1 || (*end2 != '\0' && *end2 != ','))
            return -1;
        at[n].done = false;
        n++;
        p = *end2 == ',' ? end2 + 1 : end2;
    }
    return n;
}

void survive_test_hold(const char *point)
{
    static int n = -1; /* the variables read once: this runs before every wait of a gradient bucket */
    static struct hold_at at[8];
    const char *flag = getenv("GRPO_TEST_HOLD_FILE");
    if (n < 0) {
        const char *spec = getenv("GRPO_TEST_KILL_AT");
        n = spec && flag ? parse_holds(spec, at, (int)(sizeof at / sizeof at[0])) : 0;
        if (n < 0 || (spec && !flag)) {
            log_warn("survive",
                     "GRPO_TEST_KILL_AT=%s is not POINT:STEP:RANK[,POINT:STEP:RANK...] with "
                     "GRPO_TEST_HOLD_FILE: no hold",
                     spec);
            n = 0;
        }
    }
    if (!n || !g_survive || (g_survive->spare != (strcmp(point, "spare") == 0)))
        return;
    const int me = g_survive->launch_rank[g_survive->env->rank];
    struct hold_at *h = NULL;
    for (int i = 0; i < n && !h; i++)
        if (!at[i].done && strcmp(at[i].point, point) == 0 && at[i].step == g_survive->step && at[i].rank == me)
            h = &at[i];
    if (!h || access(flag, F_OK) != 0)
        return;
    h->done = true; /* once */
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s.held", flag);
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    log_info("survive", "test: holding at %s of step %lld while %s exists (pid %d)", point, h->step, flag,
             (int)getpid());
    FILE *f = fopen(tmp, "w");
    bool said = false;
    if (f) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
        /* the test reads a whole pid or nothing, one hold at a time: a second process that reaches its hold point
         * while another's hold is still unread (a spare holds while the trainers go on to theirs) waits until the
         * test has taken the first (it removes the file before it acts on it), so no hold hides another */
        for (int i = 0; i < 12000 && access(flag, F_OK) == 0; i++) {
            if (link(tmp, path) == 0 || errno != EEXIST)
                break;
            if (!said)
                log_info("survive", "test: at %s of step %lld, waiting for another rank's hold to be taken", point,
                         h->step);
            said = true;
            usleep(50000);
        }
        unlink(tmp);
    }
    for (int i = 0; i < 12000 && access(flag, F_OK) == 0; i++)
        usleep(50000);
}
