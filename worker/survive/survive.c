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
 * them (trainer_state_share). The other spares go back to their wait; disarm releases them at the run's end. */
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
    /* the groups a loss revokes: the world and the trainers (every rank), DP and on GPUs DP's NCCL twin (revoking it
     * aborts it); after a loss the shrunk ones and the new twin */
    struct comm *watch[5];
    int n_watch;
    /* every rank of the job still in it: the trainers, then the spares (trainer.survive_spare_ranks), in launch
     * order; the world at first, after a loss the survivors (sides) */
    struct comm *all;
    int n_spare;                   /* all's last ranks that are spares */
    bool spare;                    /* this rank is one: it waits in step_begin until a loss or the run's end */
    struct comm *sides;            /* owned after a loss: the survivors */
    struct comm *tr;               /* owned after a loss with spares: the survivors that train (NULL: sides) */
    struct parallel_groups groups; /* owned after a loss: their DP, TP and PP groups */
    bool have_groups;
    int *launch_rank; /* each rank of all's rank at launch: lost ranks are named as the logs name them */
    /* the loss being recovered: when it was found, the step redone, the ranks lost (for step_done) */
    double lost_at, reformed_s;
    int64_t redo;
    char lost_names[256];
    bool said_cost;
};

/* the one survive object of the process: the test hold reads its step */
static struct survive *g_survive;

int survive_check(const struct grpo_config *cfg, const struct placement_spec *spec, bool colocated, int world,
                  char *why, size_t whylen)
{
    const char *not_yet = "; it covers colocated plain data parallelism (docs/operations.md)";
    char ft[512];
    if (!comm_ft_available(ft, sizeof ft))
        return error_set(why, whylen, KEY_trainer_survive_trainer_loss ": %s", ft);
    if (world > 1 && !colocated)
        return error_set(why, whylen,
                         KEY_trainer_survive_trainer_loss " with rollout ranks (" KEY_placement_rollout_ranks
                                                          ", a split run) is not covered yet%s",
                         not_yet);
    /* on GPUs the step's start is copied through host memory and the DP group's NCCL twin made again over the
     * survivors; ZeRO-1's block copies and a spare's state move between host buffers only */
    const bool gpu = strcmp(config_device(cfg), "cpu") != 0;
    if (gpu && cfg->trainer_survive_spare_ranks > 0)
        return error_set(why, whylen,
                         KEY_trainer_survive_spare_ranks " with " KEY_trainer_device
                                                         "=%s is not covered yet: a spare joins on the CPU only",
                         config_device(cfg));
    if (gpu && cfg->actor_megatron_use_distributed_optimizer)
        return error_set(why, whylen,
                         KEY_trainer_survive_trainer_loss " with " KEY_actor_megatron_use_distributed_optimizer
                                                          " (ZeRO-1) and " KEY_trainer_device
                                                          "=%s is not covered yet: ZeRO-1's blocks are kept on the "
                                                          "CPU only%s",
                         config_device(cfg), not_yet);
    struct {
        int size;
        const char *key;
    } sizes[] = {{spec->tp_size, KEY_actor_megatron_tensor_model_parallel_size},
                 {spec->pp_size, KEY_actor_megatron_pipeline_model_parallel_size},
                 {spec->cp_size, spec->cp_key ? spec->cp_key : KEY_actor_megatron_context_parallel_size},
                 {spec->ep_size, KEY_actor_megatron_expert_model_parallel_size},
                 {spec->rollout_tp, KEY_rollout_tensor_model_parallel_size}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].size > 1)
            return error_set(why, whylen, KEY_trainer_survive_trainer_loss " with %s=%d is not covered yet%s",
                             sizes[i].key, sizes[i].size, not_yet);
    if (cfg->trainer_survive_spare_ranks > 0 && cfg->grpod_endpoint && cfg->grpod_endpoint[0])
        return error_set(why, whylen,
                         KEY_trainer_survive_spare_ranks " under grpod (" KEY_grpod_endpoint
                                                         ") is not covered yet: grpod lays the run out without spares");
    if (cfg->trainer_survive_spare_ranks > 0 && cfg->actor_megatron_use_distributed_optimizer)
        return error_set(why, whylen,
                         KEY_trainer_survive_spare_ranks " with " KEY_actor_megatron_use_distributed_optimizer
                                                         " (ZeRO-1) is not covered yet: a spare joins plain DP only");
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
        log_warn("survive", "spare: %s: revoking the job's groups to re-form them without the lost rank", what);
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
    s->all = env->world;
    s->n_spare = env->spare_ranks;
    s->spare = env->spare;
    const int n = comm_size(env->world);
    s->launch_rank = xmalloc((size_t)n * sizeof *s->launch_rank);
    for (int r = 0; r < n; r++)
        s->launch_rank[r] = r; /* colocated: the trainers are the world, in its order, the spares after them */
    watch(s, env->world);
    if (!env->spare) { /* a spare's own groups stay whole: it leaves through them if it never joins */
        watch(s, env->trainers);
        if (env->dp != env->trainers)
            watch(s, env->dp);
    }
    comm_set_peer_lost_handler(on_peer_lost, s);
    comm_set_test_hold(survive_test_hold);
    g_survive = s;
    if (env->rank == 0 && !env->spare_ranks)
        log_info("survive",
                 "trainer-loss survival on (" KEY_trainer_survive_trainer_loss "): a lost rank's step is redone by "
                 "the other %d ranks with one DP rank fewer; each step's start is kept in memory",
                 env->world_size - 1);
    else if (env->rank == 0)
        log_info("survive",
                 "trainer-loss survival on (" KEY_trainer_survive_trainer_loss "), %d spare rank(s) "
                 "(" KEY_trainer_survive_spare_ranks ", launch ranks %d..%d): a lost rank's step is redone with a "
                 "spare in its place (DP stays %d), with one DP rank fewer once none is left; each step's start is "
                 "kept in memory",
                 env->spare_ranks, n - env->spare_ranks, n - 1, env->world_size);
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
    log_info("survive", "spare (launch rank %d) waiting to take a lost rank's place", me);
    s->armed = true;
    int32_t word = 0;
    if (comm_ft_wait_word(s->all, &word) != 0)
        check_failf(__FILE__, __LINE__, "spare (launch rank %d): its wait failed without a loss", me);
    s->armed = false;
    log_info("survive", "spare (launch rank %d) released: the run ended without needing it", me);
    return 1;
}

/* struct trainer_recovery's hooks (ud: the survive object) */
static int step_begin(void *ud, int64_t k)
{
    struct survive *s = ud;
    if (s->spare)
        return spare_wait(s);
    const double t0 = clock_now_s();
    /* with ZeRO-1 a collective (each block's copy to the next rank): a loss in it comes back to the previous
     * step's start, kept in the other slot (s->step is still that step's; none before the first step) */
    trainer_snapshot_take(s->t, s->snap[k % 2]);
    s->step = k;
    if (!s->said_cost && s->env->rank == 0) { /* what the key costs a step, once */
        s->said_cost = true;
        log_info("survive", "step %lld's start kept in %.3f s (%.1f MB: the weights, AdamW's moments%s; every step)",
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
        comm_ft_send_word(s->all, r, 1);
}

static void step_done(void *ud, int64_t k)
{
    struct survive *s = ud;
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

static int recover(void *ud)
{
    struct survive *s = ud;
    struct role_env *env = s->env;
    struct comm *old = s->all; /* the trainers, then the spares */
    const int old_size = comm_size(old), old_trainers = old_size - s->n_spare;
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
    /* the step to redo: the earliest any trainer is in (one whose copy of step k's last collective completed is in
     * k + 1 already, its start of k kept in the other slot); a spare is in none */
    int64_t neg = s->spare ? INT64_MIN + 1 : -s->step;
    comm_allreduce_max(sides, &neg, 1, COMM_I64);
    const int64_t redo = -neg;
    struct trainer_snapshot *snap =
        !s->spare && trainer_snapshot_step(s->snap[redo % 2]) == redo ? s->snap[redo % 2] : NULL;
    /* the survivors' layout: the trainers that are left (all's first ranks, in order), then as many spares as
     * trainers were lost; the other spares stay spares */
    const int size = comm_size(sides), me = comm_rank(sides);
    const int kept = old_trainers - lost_trainers, spares = size - kept;
    const int join = lost_trainers < spares ? lost_trainers : spares, D = kept + join;
    const bool trains = me < D, joins = s->spare && trains;
    /* every survivor can redo it: the same answer on all of them */
    int ok = (s->spare || snap) && lost_trainers > 0 && kept > 0;
    if (comm_agree(sides, &ok) != 0)
        ok = 0;
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
    /* with spares the trainers are a group of their own (each spare one alone); without, the survivors */
    struct comm *tr = s->n_spare > 0 ? comm_split(sides, trains ? 0 : 1 + me - D, me) : sides;
    if (tr != sides)
        comm_set_name(tr, trains ? "trainers" : "spare");
    /* the groups of an earlier loss are dead too: freed (their wrappers; revoked ones are not MPI-freed) */
    if (s->have_groups)
        parallel_groups_free(&s->groups);
    s->have_groups = false;
    if (s->tr)
        comm_free(s->tr);
    if (s->sides)
        comm_free(s->sides);
    s->sides = sides;
    s->all = sides;
    s->n_spare = size - D;
    s->tr = NULL;
    s->n_watch = 0;
    watch(s, sides);
    if (!trains) { /* still a spare: back to its wait, on the survivors */
        comm_free(tr);
        log_info("survive", "spare (launch rank %d) stays a spare: %s lost, %d DP ranks go on", mine, s->lost_names, D);
        return 0;
    }
    if (tr != sides) {
        s->tr = tr;
        watch(s, tr);
    }
    /* the trainers' layout: plain DP over all of them (survive_check allows nothing else) */
    const struct placement_spec plain = {.tp_size = 1, .pp_size = 1, .cp_size = 1, .ep_size = 1, .rollout_tp = 1};
    struct placement at;
    char why[256];
    if (placement_of(&plain, comm_rank(tr), comm_size(tr), &at, why, sizeof why) != 0)
        check_failf(__FILE__, __LINE__, "the survivors' layout: %s", why);
    struct parallel_groups g;
    const struct parallel_sizes sz = {1, 1, 1, 1};
    if (parallel_groups_init_sized(&g, tr, &sz) != 0)
        check_failf(__FILE__, __LINE__, "the survivors' groups: %d ranks", comm_size(tr));
    s->groups = g;
    s->have_groups = true;
    env->trainers = tr;
    env->dp = g.dp;
    env->tp = g.tp;
    env->pp = g.pp;
    env->at = at;
    env->rank = comm_rank(tr);
    env->world_size = comm_size(tr);
    env->spare = false;
    env->spare_ranks = s->n_spare;
    s->spare = false;
    watch(s, g.dp);
    if (trainer_reform(s->t, tr, g.dp, at.dp, at.dp_size, err, sizeof err) != 0) {
        log_error("survive", "moving the trainer onto %d DP ranks: %s; ending the run", at.dp_size, err);
        return -1;
    }
    if (trainer_dp_device_group(s->t)) { /* on GPUs: DP's NCCL twin, made again over the survivors */
        watch(s, trainer_dp_device_group(s->t));
        if (env->rank == 0)
            log_info("survive",
                     "the lost group's NCCL communicators aborted; a new one over the %d survivors (its unique id "
                     "from their rank 0 over their shrunk MPI group)",
                     at.dp_size);
    }
    if (!joins && trainer_snapshot_restore(s->t, snap, lost, lost_trainers, err, sizeof err) != 0) {
        log_error("survive", "restoring step %lld's start on %d DP ranks: %s; ending the run", (long long)redo,
                  at.dp_size, err);
        return -1;
    }
    if (join > 0) { /* the spares that joined take the step's start from DP rank 0 (every old rank holds it) */
        const size_t bytes = trainer_state_share(s->t, 0);
        if (joins)
            log_info("survive",
                     "spare (launch rank %d) joined as DP rank %d of %d for step %lld: took the step's start "
                     "(weights, AdamW's moments and step count, the run state and data cursor; %.1f MB) from DP "
                     "rank 0 (launch rank %d)",
                     mine, at.dp, at.dp_size, (long long)redo, (double)bytes / 1e6, s->launch_rank[0]);
    }
    char reason[96];
    snprintf(reason, sizeof reason, "survived: DP %d -> %d at step %lld", old_trainers, at.dp_size, (long long)redo);
    const struct survive_loss loss = {.ranks = names, .n = n_lost, .reason = reason};
    if (s->reform)
        s->reform(s->ud, &loss);
    if (lead_lost && env->rank == 0)
        log_info("survive",
                 "the lead (rank 0) lost: rank %d leads from step %lld (the decisions, metrics.jsonl and the other "
                 "sinks, checkpoints, the audit files and the run's log lines)",
                 s->launch_rank[0], (long long)redo);
    /* the lead (it decides, logs, checkpoints and writes the audit files for every rank) is the survivors' rank
     * 0: with the old one lost, the run's records move to it */
    if (trainer_reform_records(s->t, lead_lost, err, sizeof err) != 0) {
        log_error("survive", "the run's records after the loss of %s: %s; ending the run", s->lost_names, err);
        return -1;
    }
    s->redo = redo;
    s->reformed_s = clock_now_s() - t0;
    if (env->rank == 0) {
        char spare_note[96] = "";
        if (join > 0 || s->n_spare > 0)
            snprintf(spare_note, sizeof spare_note, "; %d spare(s) joined, %d left", join, s->n_spare);
        log_info("survive", "%s lost at step %lld; %d DP ranks go on, step %lld redone (of %d ranks, %d survive%s)",
                 s->lost_names, (long long)redo, at.dp_size, (long long)redo, old_trainers, kept, spare_note);
    }
    return 0;
}

void survive_attach(struct survive *s, struct trainer *t)
{
    s->t = t;
    watch(s, trainer_dp_device_group(t)); /* on GPUs: a lost peer found in NCCL is survived too */
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
    if (!n || !g_survive || g_survive->spare)
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
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
        rename(tmp, path); /* the test reads a whole pid or nothing */
    }
    log_info("survive", "test: holding at %s of step %lld while %s exists (pid %d)", point, h->step, flag,
             (int)getpid());
    for (int i = 0; i < 12000 && access(flag, F_OK) == 0; i++)
        usleep(50000);
}
