/* grpo-worker: one rank of a GRPO run, launched by mpirun.
 *
 * Each rank takes the role its placement gives it (grpod's Assignment, which
 * this rank checks against the same arithmetic in common/placement.c): hybrid
 * (the whole GRPO loop in one process), rollout or trainer (worker/roles.h).
 * --selftest checks the MPI collective plane with the requested
 * tensor/pipeline layout across all ranks. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>

#include "common/check_mpi.h"
#include "common/config.h"
#include "common/log.h"
#include "worker/comm/comm.h"
#include "worker/comm/parallel.h"
#include "worker/control/control.h"
#include "worker/metrics/metrics.h"
#include "proto/transport.h"
#include "worker/roles.h"
#include "worker/trainer/trainer.h"
#include "common/check.h"
#include "common/placement.h"
#include "kernels/kernels.h"
#include <time.h>

static void usage(FILE *out)
{
    fputs("usage: mpirun -np N grpo-worker [--config FILE] [key.path=value ...] [options]\n"
          "\n"
          "One rank of a GRPO training run. With one rank it runs every part of GRPO (role hybrid). With a\n"
          "split placement the ranks take roles: ranks 0..T-1 train, the next R generate and score and push\n"
          "their groups to the trainers, trainer rank 0 sends the weights back:\n"
          "  mpirun -np 3 grpo-worker --config run.yaml trainer.nnodes=1 trainer.n_gpus_per_node=2 \\\n"
          "      rollout.nnodes=1 rollout.n_gpus_per_node=1 actor_rollout_ref.rollout.mode=async\n"
          "(placement.trainer_ranks / placement.rollout_ranks say the same; rollout.mode sync is on-policy,\n"
          "async one-step-off). The trainers split the model with Megatron's layout:\n"
          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=TP and pipeline_model_parallel_size=PP,\n"
          "DP = T / (TP x PP); actor_rollout_ref.rollout.tensor_model_parallel_size groups the rollout ranks.\n"
          "Each rollout process fetches every policy version from trainer rank 0, or with\n"
          "actor_rollout_ref.rollout.weight_sync=broadcast takes it in one broadcast (MPI; NCCL on GPUs).\n"
          "Under grpod (grpod.endpoint) every rank registers and grpod assigns the roles.\n"
          "Launched with mpirun --mca orte_enable_recovery 1 under grpod, the run survives a lost rollout rank:\n"
          "its work goes to the others, and grpo-worker --replace-rank R puts a new process in its place.\n"
          "\n"
          "options:\n"
          "  -c, --config FILE      YAML configuration (verl key names; see docs/configuration.md)\n"
          "  key.path=value         override one key, e.g. data.train_batch_size=16\n"
          "      --print-config     print the effective configuration with each value's origin, and exit\n"
          "      --config-reference print the Markdown reference of every key, and exit\n"
          "      --selftest         check the collective plane across all ranks and the DP/TP/PP groups\n"
          "      --tp N, --pp N     with --selftest: the TP and PP sizes of the groups it checks (default 1)\n"
          "      --replace-rank R   take the place of lost rollout rank R of the run under grpod (one process,\n"
          "                         not under mpirun -np; it joins at the next step)\n"
          "  -h, --help             this text\n"
          "\n"
          "environment: GRPO_LOG_LEVEL=error|warn|info|debug\n",
          out);
}

/* Set where every rank refuses the run for the same reason (the configuration or the placement, before any role
 * starts): then rank 0 alone ends the job. When every rank asked Open MPI to end it at once, mpirun now and then
 * crashed in its message aggregation (a segfault instead of the exit status). */
static bool g_refused_alike;

/* In recovery mode a job that lost a rank can hang in MPI_Finalize (Open MPI 4.1 waits for the dead rank in its
 * closing exchange, now and then): the work is done and written, so after a grace the process ends by itself. */
static int finalize_status;
static void *finalize_guard(void *arg)
{
    (void)arg;
    sleep(20);
    log_warn("worker", "MPI_Finalize has not returned in 20 s (a rank of this job was lost): ending without it");
    _exit(finalize_status);
    return NULL;
}

static void finalize_watchdog(int status)
{
    finalize_status = status;
    pthread_t th;
    if (pthread_create(&th, NULL, finalize_guard, NULL) == 0)
        pthread_detach(th);
}

int run_hybrid(struct role_env *env) { return run_trainer_process(env, NULL, NULL, NULL, NULL); }

/* The run's rules for a split placement that are not about rank counts. 0, or -1 with why. */
static int split_supported(const struct grpo_config *c, const struct placement_spec *ps, char *why, size_t whylen)
{
    if (c->alg_filter_groups_enable)
        return error_set(why, whylen,
                         "algorithm.filter_groups.enable (dynamic sampling) runs in one process for now; it is not "
                         "available with separate rollout ranks");
    if (c->trainer_sft_warmup_steps > 0)
        return error_set(why, whylen,
                         "trainer.sft_warmup_steps %lld: the supervised warm-start runs in one process; warm-start "
                         "first, then point actor_rollout_ref.model.path at its checkpoint",
                         (long long)c->trainer_sft_warmup_steps);
    if (ps->trainer_ranks / (ps->tp_size * ps->pp_size) > ROLE_MAX_ENDPOINTS)
        return error_set(why, whylen, "%d trainer DP ranks: at most %d", ps->trainer_ranks, ROLE_MAX_ENDPOINTS);
    return 0;
}

/* Data endpoints of the trainer DP ranks when no grpod hands them out: grpod.data_endpoint, or a fresh
 * ipc:///tmp/grpo-PID-TIME prefix chosen by rank 0; tcp:// ports count up from the base on each trainer's host. */
static void local_endpoints(struct role_env *env)
{
    const struct grpo_config *c = env->cfg;
    char base[200] = "";
    if (comm_rank(env->world) == 0) {
        if (c->grpod_data_endpoint && c->grpod_data_endpoint[0])
            snprintf(base, sizeof base, "%s", c->grpod_data_endpoint);
        else
            snprintf(base, sizeof base, "ipc:///tmp/grpo-%d-%ld", (int)getpid(), (long)time(NULL));
    }
    MPI_Bcast(base, sizeof base, MPI_CHAR, 0, MPI_COMM_WORLD);
    int world = comm_size(env->world);
    char host[64] = "", *hosts = xcalloc((size_t)world, sizeof host);
    gethostname(host, sizeof host - 1);
    MPI_Allgather(host, sizeof host, MPI_CHAR, hosts, sizeof host, MPI_CHAR, MPI_COMM_WORLD);
    /* one endpoint per trainer DP rank, bound by its TP rank 0 (PP stage 0): trainer rank d x TP */
    const int tp = env->spec.tp_size;
    env->n_endpoints = env->spec.trainer_ranks / (tp * env->spec.pp_size);
    for (int d = 0; d < env->n_endpoints; d++) /* the trainer binds every interface; the rollouts connect to it */
        placement_data_endpoint(base, d,
                                env->at.role == PLACE_TRAINER && env->at.dp == d && env->at.tp == 0
                                    ? NULL
                                    : hosts + (size_t)d * tp * sizeof host,
                                env->endpoints[d], sizeof env->endpoints[d]);
    /* the dispatcher is trainer DP rank 0's, world rank 0 */
    placement_dispatch_endpoint(base, env->n_endpoints, env->rank == 0 ? NULL : hosts, env->dispatch_endpoint,
                                sizeof env->dispatch_endpoint);
    free(hosts);
}

/* grpod says a trainer this rank's job depends on is lost: the trainers would wait for it in a collective for
 * ever (mpirun keeps the job when it may lose ranks), so the job ends here, and its relaunch resumes. */
static void abort_job(const char *reason)
{
    log_error("worker", "ending the job: %s", reason);
    check_mpi_end_job(4);
}

/* Register with grpod (when grpod.endpoint is set) and check that its assignment is the placement this rank
 * computed from the same configuration; take the data endpoints it hands out. 0, or -1 (logged). */
static int join_control_plane(struct role_env *env)
{
    char err[2048];
    struct control_options o;
    struct control_assignment a;
    control_options_from_config(&o, env->cfg, env->rank, env->world_size);
    o.on_abort = abort_job;
    o.replaces = env->replacing;
    o.capabilities = env->at.role == PLACE_ROLLOUT   ? "rollout"
                     : env->at.role == PLACE_TRAINER ? "trainer"
                                                     : "rollout,trainer";
    if (control_open(&o, &env->ctl, &a, err, sizeof err) != 0) {
        log_error("worker", "%s", err);
        return -1;
    }
    if (!env->ctl)
        return 0;
    const enum placement_role assigned = a.role == CONTROL_ROLE_ROLLOUT   ? PLACE_ROLLOUT
                                         : a.role == CONTROL_ROLE_TRAINER ? PLACE_TRAINER
                                                                          : PLACE_HYBRID;
    if (assigned != env->at.role || a.dp_rank != env->at.dp || a.dp_size != env->at.dp_size) {
        snprintf(err, sizeof err,
                 "grpod assigned role %s dp %d/%d, but this rank's configuration places it as %s dp %d/%d: give "
                 "grpod and the workers the same placement keys",
                 control_role_name(a.role), a.dp_rank, a.dp_size, placement_role_name(env->at.role), env->at.dp,
                 env->at.dp_size);
        log_error("worker", "%s", err);
        control_finish(env->ctl, CONTROL_END_FAILED, err);
        return -1;
    }
    log_info("worker", "registered with grpod at %s: role %s, dp %d/%d, run %s", o.endpoint, control_role_name(a.role),
             a.dp_rank, a.dp_size, a.run_id);
    if (a.heartbeat_interval_s > 0)
        env->heartbeat_s = a.heartbeat_interval_s;
    if (a.dispatch_endpoint[0])
        snprintf(env->dispatch_endpoint, sizeof env->dispatch_endpoint, "%s", a.dispatch_endpoint);
    if (a.role == CONTROL_ROLE_TRAINER) {
        snprintf(env->endpoints[a.dp_rank], sizeof env->endpoints[0], "%s", a.data_pull_endpoint);
        env->n_endpoints = a.dp_size;
    } else if (a.role == CONTROL_ROLE_ROLLOUT) {
        env->n_endpoints = a.n_trainer_endpoints;
        for (int d = 0; d < a.n_trainer_endpoints && d < ROLE_MAX_ENDPOINTS; d++)
            snprintf(env->endpoints[d], sizeof env->endpoints[d], "%s", a.trainer_endpoints[d]);
    }
    return 0;
}

/* trainer.device=cuda in a split run: each rank's GPU on its node. A node's trainer ranks take its GPUs first
 * (its trainer i: GPU i), its rollout ranks the next ones, round-robin when the node has more ranks than GPUs.
 * Ranks that share a GPU work, more slowly; but NCCL needs a GPU per rank, so trainers that share one sum their
 * gradients over MPI, staged through host memory (env->trainer_gpus_shared, the same on every rank). Collective
 * over the job. */
static void assign_devices(struct role_env *env)
{
    const int ndev = kctx_cuda_devices();
    MPI_Comm node;
    CHECK_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env->rank, MPI_INFO_NULL, &node));
    int n = 0, me = 0;
    CHECK_MPI(MPI_Comm_size(node, &n));
    CHECK_MPI(MPI_Comm_rank(node, &me));
    int trainer = env->at.role == PLACE_TRAINER;
    int *is = xcalloc((size_t)n, sizeof *is);
    CHECK_MPI(MPI_Allgather(&trainer, 1, MPI_INT, is, 1, MPI_INT, node));
    int trainers = 0, before = 0; /* the node's trainers; the ranks of this one's role before it on the node */
    for (int i = 0; i < n; i++) {
        trainers += is[i];
        before += i < me && is[i] == trainer;
    }
    free(is);
    CHECK_MPI(MPI_Comm_free(&node));
    const int slot = trainer ? before : trainers + before;
    env->device = ndev > 0 ? slot % ndev : 0;
    int crowded[2] = {trainers > (ndev > 0 ? ndev : 1), n > (ndev > 0 ? ndev : 1)};
    CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, crowded, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    env->trainer_gpus_shared = crowded[0] != 0;
    env->rollout_gpus_shared = crowded[1] != 0;
    log_info("worker", "rank %d: cuda:%d of the %d GPU(s) of its node, which runs %d trainer and %d rollout rank(s)",
             env->rank, env->device, ndev, trainers, n - trainers);
}

/* Place this rank, join grpod, build the groups and run the role. */
static int run_role(const struct grpo_config *cfg, struct comm *world, int replace_rank)
{
    char why[1024];
    struct role_env env = {.cfg = cfg, .world = world};
    int rank = comm_rank(world), size = comm_size(world);
    if (replace_rank >= 0) {
        if (placement_spec_from_config(cfg, &env.spec, why, sizeof why) != 0) {
            log_error("worker", "%s", why);
            return 2;
        }
        if (size > 1 || !cfg->grpod_endpoint || !cfg->grpod_endpoint[0]) {
            log_error("worker", "--replace-rank takes the place of a lost rollout rank in a run under grpod: start "
                                "one process (not under mpirun's -np) with grpod.endpoint set");
            return 2;
        }
        rank = replace_rank;
        size = env.spec.trainer_ranks + env.spec.rollout_ranks;
        env.replacing = true;
    }
    env.rank = rank;
    env.world_size = size;
    env.heartbeat_s = cfg->grpod_heartbeat_interval_s;
    if (placement_spec_from_config(cfg, &env.spec, why, sizeof why) != 0 ||
        placement_check(&env.spec, size, (int)cfg->data_train_batch_size, why, sizeof why) != 0 ||
        placement_of(&env.spec, rank, size, &env.at, why, sizeof why) != 0) {
        if (rank == 0)
            log_error("worker", "%s", why);
        g_refused_alike = true;
        return 2;
    }
    const bool split = env.at.role != PLACE_HYBRID;
    if (!split && size > 1) {
        if (rank == 0)
            log_error("worker",
                      "%d ranks but no split placement: a hybrid run takes one rank. Give the ranks roles with "
                      "placement.trainer_ranks and placement.rollout_ranks (or verl's trainer.nnodes x "
                      "trainer.n_gpus_per_node and rollout.nnodes x rollout.n_gpus_per_node), or use --selftest",
                      size);
        g_refused_alike = true;
        return 2;
    }
    if (split && split_supported(cfg, &env.spec, why, sizeof why) != 0) {
        if (rank == 0)
            log_error("worker", "%s", why);
        g_refused_alike = true;
        return 2;
    }
    if (replace_rank >= 0 && env.at.role == PLACE_ROLLOUT && env.at.tp_size > 1) {
        log_error("worker",
                  "--replace-rank %d: rollout ranks form TP groups of %d "
                  "(actor_rollout_ref.rollout.tensor_model_parallel_size); a lost group's units go to the other "
                  "groups, and one rank cannot rejoin a group: relaunch the job (it resumes from the newest "
                  "checkpoint) to bring the group back",
                  replace_rank, env.at.tp_size);
        return 2;
    }
    if (replace_rank >= 0 && env.at.role != PLACE_ROLLOUT) {
        log_error("worker",
                  "--replace-rank %d: that rank is a %s; only a rollout rank can be replaced while the run goes on "
                  "(a lost trainer ends the job, and its relaunch resumes from the newest checkpoint)",
                  replace_rank, placement_role_name(env.at.role));
        return 2;
    }
    if (split && rank == 0 && size > 1) {
        if (!check_mpi_recovery_mode())
            log_warn("worker", "mpirun ends the whole job when any rank dies: launch with --mca orte_enable_recovery 1 "
                               "(and grpod) so that a lost rollout rank costs nothing");
        else if (!cfg->grpod_endpoint || !cfg->grpod_endpoint[0]) {
            log_error("worker",
                      "mpirun keeps the job when a rank dies (orte_enable_recovery), but without grpod nobody "
                      "would tell the trainers that one of them is lost: they would wait for it for ever. "
                      "Run under grpod (grpod.endpoint) or launch without the option");
            return 2;
        }
    }
    env.staleness = strcmp(cfg->rollout_mode, "async") == 0 ? 1 : 0;
    if (split && cfg->grpod_secret_file && cfg->grpod_secret_file[0] &&
        secret_read(cfg->grpod_secret_file, 1, env.secret, sizeof env.secret, why, sizeof why) != 0) {
        log_error("worker", "%s", why);
        return 2;
    }
    if (split && replace_rank < 0)
        local_endpoints(&env);
    if (split && strcmp(cfg->trainer_device, "cuda") == 0) {
        if (replace_rank < 0)
            assign_devices(&env);
        else /* alone, in place of a lost rollout rank: the node's GPUs in turn by rank */
            env.device = kctx_cuda_devices() > 0 ? replace_rank % kctx_cuda_devices() : 0;
    }
    if (join_control_plane(&env) != 0)
        return 3;
    int status;
    if (!split) {
        status = run_hybrid(&env);
    } else {
        /* the trainers and their DP and TP groups; the rollout ranks have no MPI traffic after this */
        struct comm *trainers = comm_split(world, env.at.role == PLACE_TRAINER ? 0 : 1, comm_rank(world));
        /* every group of the trainers (DP, TP, PP) and of the rollout ranks (rollout TP) is split from here: each
         * of their waits is bounded, the same on every rank (actor_rollout_ref.nccl_timeout) */
        comm_set_deadline(trainers, (double)env.cfg->arr_nccl_timeout);
        struct parallel_groups g = {0};
        if (env.at.role == PLACE_TRAINER) {
            env.trainers = trainers;
            if (parallel_groups_init(&g, trainers, env.spec.tp_size, env.spec.pp_size) != 0)
                check_failf(__FILE__, __LINE__, "trainer groups: %d ranks do not fit TP %d x PP %d",
                            comm_size(trainers), env.spec.tp_size, env.spec.pp_size);
            env.dp = g.dp;
            env.tp = g.tp;
            env.pp = g.pp;
            env.mp = comm_split(trainers, env.at.dp, env.at.pp * env.at.tp_size + env.at.tp);
        } else if (env.at.tp_size > 1) { /* a rollout TP group: neighbouring rollout ranks */
            env.rollout_tp = comm_split(trainers, env.at.engine, env.at.tp);
            comm_fail_alone(env.rollout_tp); /* a lost peer ends the group, not the run */
        }
        /* weight_sync=broadcast: trainer rank 0 (the dispatcher's) and each rollout TP group's first rank; the
         * group's waits are bounded like the others, and a lost member gives the group up, not the run */
        if (strcmp(env.cfg->rollout_weight_sync, "broadcast") == 0 && replace_rank < 0) {
            const bool member =
                env.at.role == PLACE_TRAINER ? env.at.dp == 0 && env.at.tp == 0 && env.at.pp == 0 : env.at.tp == 0;
            struct comm *g = comm_split(world, member ? 0 : 1, env.at.role == PLACE_TRAINER ? -1 : rank);
            comm_set_deadline(g, (double)env.cfg->arr_nccl_timeout);
            if (member)
                env.weight_group = g;
            else
                comm_free(g);
        }
        char tp_note[48] = "";
        if (env.at.role == PLACE_TRAINER && env.at.tp_size > 1)
            snprintf(tp_note, sizeof tp_note, ", tp %d of %d", env.at.tp, env.at.tp_size);
        if (env.at.role == PLACE_TRAINER && env.at.pp_size > 1)
            snprintf(tp_note + strlen(tp_note), sizeof tp_note - strlen(tp_note), ", pp %d of %d", env.at.pp,
                     env.at.pp_size);
        log_info("worker", "rank %d of %d: %s, dp %d of %d%s (%s)%s", rank, size, placement_role_name(env.at.role),
                 env.at.dp, env.at.dp_size, tp_note, env.staleness ? "one-step-off" : "on-policy",
                 replace_rank >= 0 ? ", in place of the lost one" : "");
        status = env.at.role == PLACE_TRAINER ? run_trainer(&env) : run_rollout(&env);
        if (env.at.role == PLACE_TRAINER) {
            comm_free(env.mp);
            parallel_groups_free(&g);
        }
        comm_free(env.rollout_tp);
        comm_free(env.weight_group);
        comm_free(trainers);
    }
    control_close(env.ctl);
    return status;
}

/* A positive int from text; -1 for anything else. */
static int parse_size(const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 1 || v > 1 << 20)
        return -1;
    *out = (int)v;
    return 0;
}

/* Every rank contributes known values; each collective's result is checked against the closed form. */
static int selftest(struct parallel_groups *g)
{
    int bad = 0;
    struct comm *w = g->world;
    int r = comm_rank(w), n = comm_size(w);
    float v[3] = {(float)r, 1.0f, (float)(r * r)};
    comm_allreduce_sum(w, v, 3, COMM_F32);
    /* sums of 0..n-1 and of their squares, exact in integers */
    int sum = n * (n - 1) / 2, sumsq = (n - 1) * n * (2 * n - 1) / 6;
    if (v[0] != (float)sum || v[1] != (float)n || v[2] != (float)sumsq)
        bad++;
    int32_t mine = 100 + r, *all = xcalloc((size_t)n, sizeof *all);
    comm_allgather(w, &mine, all, 1, COMM_I32);
    for (int i = 0; i < n; i++)
        bad += all[i] != 100 + i;
    free(all);
    int tp = comm_size(g->tp);
    double tpsum = (double)comm_rank(g->tp);
    comm_allreduce_sum(g->tp, &tpsum, 1, COMM_F64);
    int tpwant = tp * (tp - 1) / 2;
    bad += tpsum != (double)tpwant;
    comm_allreduce_sum(w, &bad, 1, COMM_I32);
    if (r == 0) {
        if (bad)
            log_error("selftest", "collective plane check FAILED on %d value(s)", bad);
        else
            log_info("selftest", "collective plane OK: %d ranks (dp=%d tp=%d pp=%d), back-end %s", n, g->at.dp_size,
                     g->at.tp_size, g->at.pp_size, comm_backend_name(w));
    }
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    log_init_from_env();
    struct grpo_config cfg;
    config_init(&cfg);
    int rc = config_from_args(&cfg, &argc, argv);
    if (rc != 0) {
        config_free(&cfg);
        return rc < 0 ? 2 : 0;
    }
    int tp = 1, pp = 1, do_selftest = 0, replace_rank = -1;
    static const struct option opts[] = {{"tp", required_argument, 0, 't'},
                                         {"pp", required_argument, 0, 'p'},
                                         {"replace-rank", required_argument, 0, 'r'},
                                         {"selftest", no_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 't':
        case 'p':
            if (parse_size(optarg, o == 't' ? &tp : &pp) != 0) {
                log_error("worker", "--%s expects a positive integer, got '%s'", o == 't' ? "tp" : "pp", optarg);
                config_free(&cfg);
                return 2;
            }
            break;
        case 's': do_selftest = 1; break;
        case 'r': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 0 || v >= 1 << 20) {
                log_error("worker", "--replace-rank expects a rank number, got '%s'", optarg);
                config_free(&cfg);
                return 2;
            }
            replace_rank = (int)v;
            break;
        }
        case 'h':
            usage(stdout);
            config_free(&cfg);
            return 0;
        default:
            usage(stderr);
            config_free(&cfg);
            return 2;
        }
    }
    if (optind < argc) {
        log_error("worker", "unexpected argument '%s' (overrides look like key.path=value)", argv[optind]);
        config_free(&cfg);
        return 2;
    }

    /* SIGTERM / SIGINT (Slurm's time limit and preemption, systemctl stop, ^C): a checkpoint at the next safe
     * point, then exit 0; a second one ends the process at once. Before MPI_Init, so that no thread started
     * later (MPI's, nanomsg's, the heartbeat) has a system call cut short by them. */
    if (!do_selftest)
        control_catch_stop_signals();
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    log_set_rank(comm_rank(world));
    struct parallel_groups groups;
    int status = 0;
    if (parallel_groups_init(&groups, world, tp, pp) != 0) {
        if (comm_rank(world) == 0)
            log_error("worker",
                      "%d ranks cannot be split into tp=%d x pp=%d groups (the world size must be a "
                      "multiple of tp*pp)",
                      comm_size(world), tp, pp);
        status = 2;
        goto out_world;
    }
    log_debug("worker", "dp %d/%d tp %d/%d pp %d/%d, config digest %016llx", groups.at.dp_rank, groups.at.dp_size,
              groups.at.tp_rank, groups.at.tp_size, groups.at.pp_rank, groups.at.pp_size,
              (unsigned long long)config_digest(&cfg));
    if (do_selftest) {
        status = selftest(&groups);
    } else {
        status = run_role(&cfg, world, replace_rank);
        if (status != 0 && comm_size(world) > 1 && g_refused_alike && comm_rank(world) != 0)
            sleep(30); /* rank 0 ends the job for every rank, this one with it; if not, it ends it itself below */
        if (status != 0 && comm_size(world) > 1) {
            /* the other ranks wait in a collective for this one: end the whole job, with the reason above */
            log_error("worker", "rank %d failed (exit %d): ending the job", comm_rank(world), status);
            check_mpi_end_job(status);
        }
    }
    parallel_groups_free(&groups);
out_world:
    comm_free(world);
    if (check_mpi_recovery_mode() && comm_size(world) > 1)
        finalize_watchdog(status);
    MPI_Finalize();
    config_free(&cfg);
    return status;
}
