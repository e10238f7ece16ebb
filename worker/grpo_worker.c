/* grpo-worker: one rank of a GRPO run, launched by mpirun.
 *
 * main reads: parse the command line, init MPI and logging, launch (worker/launch: this rank's place, endpoints,
 * GPU and groups), run the role, finalize. Each rank takes the role its placement gives it (grpod's Assignment,
 * which the launch checks against the same arithmetic in common/placement.c): hybrid (the whole GRPO loop in one
 * process, or colocated ranks that each generate and train), rollout or trainer (worker/roles.h). --selftest checks the
 * collective plane with the requested tensor/pipeline layout across all ranks. */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "worker/agent/agent_loop.h"
#include "common/check.h"
#include "common/config.h"
#include "common/log.h"
#include "common/placement.h"
#include "kernels/kernels.h"
#include "worker/comm/comm.h"
#include "worker/comm/parallel.h"
#include "worker/control/control.h"
#include "worker/watchdog/watchdog.h"
#include "worker/flight/flight.h"
#include "worker/launch/launch.h"
#include "worker/model/device.h"
#include "worker/roles.h"
#include "worker/survive/survive.h"

static void usage(FILE *out)
{
    fputs("usage: mpirun -np N grpo-worker [--config FILE] [key.path=value ...] [options]\n"
          "\n"
          "One rank of a GRPO training run. With no rollout split every rank is hybrid (verl's colocated\n"
          "layout): one rank runs every part of GRPO; N ranks each generate a share of every step, then all\n"
          "train together (trainer.nnodes x trainer.n_gpus_per_node = N, or no placement keys at all):\n"
          "  mpirun -np 2 grpo-worker --config run.yaml trainer.nnodes=1 trainer.n_gpus_per_node=2\n"
          "With a split placement the ranks take roles: ranks 0..T-1 train, the next R generate and score and\n"
          "push their groups to the trainers, trainer rank 0 sends the weights back:\n"
          "  mpirun -np 3 grpo-worker --config run.yaml trainer.nnodes=1 trainer.n_gpus_per_node=2 \\\n"
          "      rollout.nnodes=1 rollout.n_gpus_per_node=1 actor_rollout_ref.rollout.mode=async\n"
          "(placement.trainer_ranks / placement.rollout_ranks say the same; rollout.mode sync is on-policy,\n"
          "async one-step-off). The trainers split the model with Megatron's layout:\n"
          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=TP and pipeline_model_parallel_size=PP,\n"
          "DP = T / (TP x PP); actor_rollout_ref.rollout.tensor_model_parallel_size groups the rollout ranks\n"
          "(colocated: the generating ranks, the weights resharded into that layout each step).\n"
          "Each rollout process fetches every policy version from trainer rank 0, or with\n"
          "actor_rollout_ref.rollout.weight_sync=broadcast takes it in one broadcast (MPI; NCCL on GPUs).\n"
          "Under grpod (grpod.endpoint) every rank registers and grpod assigns the roles; the first rank's\n"
          "configuration defines the run, and a rank whose configuration differs is refused.\n"
          "Launched with mpirun --mca orte_enable_recovery 1 under grpod, the run survives a lost rollout rank:\n"
          "its work goes to the others, and grpo-worker --replace-rank R puts a new process in its place.\n"
          "\n"
          "options:\n"
          "  -c, --config FILE      YAML configuration (verl key names; see docs/configuration.md)\n"
          "  key.path=value         override one key, e.g. data.train_batch_size=16\n"
          "      --config-name NAME verl's Hydra config: ppo_trainer and ppo_megatron_trainer are the defaults\n"
          "                         here; fully_async_ppo_trainer and fully_async_ppo_megatron_trainer turn on\n"
          "                         fully-async training; the DAPO recipe's dapo_trainer and\n"
          "                         dapo_megatron_trainer set its defaults (--config-path has no effect)\n"
          "      --print-config     print the effective configuration with each value's origin, and exit\n"
          "      --config-reference print the Markdown reference of every key, and exit\n"
          "      --selftest         check the collective plane across all ranks and the DP/TP/PP groups\n"
          "      --tp N, --pp N     with --selftest: the TP and PP sizes of the groups it checks (default 1)\n"
          "      --replace-rank R   take the place of lost rollout rank R of the run under grpod (one process,\n"
          "                         not under mpirun -np; it joins at the next step). It needs only\n"
          "                         grpod.endpoint (and grpod.secret_file): it takes the run's configuration\n"
          "                         from grpod; other keys given must be the run's\n"
          "  -h, --help             this text\n"
          "\n"
          "environment: GRPO_LOG_LEVEL=error|warn|info|debug\n",
          out);
}

/* In recovery mode a job that lost a rank can hang in MPI_Finalize (comm_mpi_finalize; Open MPI 4.1 waits for the
 * dead rank in its closing exchange): the work is done and written, so after a grace the process ends by itself,
 * and a rank whose run finished first asks mpirun to end the job (comm_end_finished_job: mpirun would not notice a
 * lost rank's end by itself). The grace also covers the other ranks' last steps: a rollout rank hears of the end
 * of the run a few seconds after the trainers, and the job's end stops every rank still there. */
static int finalize_status;
static bool finalize_lost; /* this rank knows the job lost a rank (else it may have: trainer-loss survival is on) */
static void *finalize_guard(void *arg)
{
    (void)arg;
    sleep(20);
    log_warn("worker", "MPI_Finalize has not returned in 20 s (%s): ending without it%s",
             finalize_lost ? "a rank of this job was lost"
                           : "a rank of this job may have been lost: " KEY_trainer_survive_trainer_loss " is on",
             finalize_status == 0 ? ", and asking mpirun to end the job" : "");
    if (finalize_status == 0)
        comm_end_finished_job();
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

/* trainer.device=auto (the default): cuda when this build has CUDA and the driver shows a device, else cpu, said in
 * the first lines (verl's default is cuda: a verl script on a GPU node trains there, and on a CPU machine runs on
 * the CPU, saying so). */
static int resolve_device(struct grpo_config *c)
{
    if (strcmp(c->trainer_device, "auto") != 0)
        return 0;
    const int n = kctx_cuda_devices();
    struct cfg_error e;
    if (config_set(c, "trainer.device", n > 0 ? "cuda" : "cpu", "auto", &e) != 0) {
        log_error("worker", "%s", e.msg);
        return -1;
    }
    if (n > 0)
        log_info("worker",
                 KEY_trainer_device "=auto: cuda (%d CUDA device%s visible; " KEY_trainer_device
                                    "=cpu to train on the CPU)",
                 n, n == 1 ? "" : "s");
    else
        log_info("worker", KEY_trainer_device "=auto: cpu (%s)",
                 kbackend_find("cuda") ? "no CUDA device visible" : "this build has no CUDA back-end");
    return 0;
}

/* The command line: the configuration and the options. */
struct args {
    struct grpo_config cfg;
    struct launch_options launch;
};

/* Parse the command line into a (logging set up from the environment first: parsing reports errors); with
 * --replace-rank, the run's configuration from grpod goes into it too. -1 to go on, else the exit status (--help,
 * --print-config and the like end here, as does bad input). */
static int parse(int *argc, char **argv, struct args *a)
{
    log_init_from_env();
    config_init(&a->cfg);
    int rc = config_from_args(&a->cfg, argc, argv);
    if (rc != 0) {
        config_free(&a->cfg);
        return rc < 0 ? 2 : 0;
    }
    a->launch = (struct launch_options){.tp = 1, .pp = 1, .selftest = false, .replace_rank = -1};
    static const struct option opts[] = {{"tp", required_argument, 0, 't'},
                                         {"pp", required_argument, 0, 'p'},
                                         {"replace-rank", required_argument, 0, 'r'},
                                         {"selftest", no_argument, 0, 's'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(*argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 't':
        case 'p':
            if (parse_size(optarg, o == 't' ? &a->launch.tp : &a->launch.pp) != 0) {
                log_error("worker", "--%s expects a positive integer, got '%s'", o == 't' ? "tp" : "pp", optarg);
                config_free(&a->cfg);
                return 2;
            }
            break;
        case 's': a->launch.selftest = true; break;
        case 'r': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 0 || v >= 1 << 20) {
                log_error("worker", "--replace-rank expects a rank number, got '%s'", optarg);
                config_free(&a->cfg);
                return 2;
            }
            a->launch.replace_rank = (int)v;
            break;
        }
        case 'h':
            usage(stdout);
            config_free(&a->cfg);
            return 0;
        default:
            usage(stderr);
            config_free(&a->cfg);
            return 2;
        }
    }
    if (optind < *argc) {
        log_error("worker", "unexpected argument '%s' (overrides look like key.path=value)", argv[optind]);
        config_free(&a->cfg);
        return 2;
    }
    if (resolve_device(&a->cfg) != 0) {
        config_free(&a->cfg);
        return 2;
    }
    char err[2048];
    if (a->launch.replace_rank >= 0 && a->cfg.grpod_endpoint[0] &&
        control_adopt_run_config(&a->cfg, err, sizeof err) != 0) { /* without grpod.endpoint, launch says why */
        log_error("worker", "--replace-rank %d: %s", a->launch.replace_rank, err);
        config_free(&a->cfg);
        return 2;
    }
    k_set_batch_invariant(a->cfg.arr_model_batch_invariant);
    model_set_fp32_matmul_tf32(strcmp(a->cfg.arr_model_fp32_matmul_precision, "high") == 0);
    model_set_decode_graphs(!a->cfg.rollout_enforce_eager);
    if (a->cfg.arr_model_batch_invariant && strcmp(a->cfg.trainer_device, "cpu") != 0)
        log_warn("worker", KEY_arr_model_batch_invariant
                 ": the CUDA back-end has no batch-invariant kernels "
                 "yet; its rollout log-probs are not the trainer's bit for bit (docs/training.md)");
    return -1;
}

/* Start MPI and tag the log with this rank (a replacement's: the rank it replaces); the world's comm. */
static struct comm *init(int *argc, char ***argv, const struct args *a)
{
    /* SIGTERM / SIGINT (Slurm's time limit and preemption, systemctl stop, ^C): a checkpoint at the next safe
     * point, then exit 0; a second one ends the process at once. Before MPI starts, so that no thread started
     * later (MPI's, nanomsg's, the heartbeat) has a system call cut short by them. */
    /* the flight recorder (worker/flight): this thread's waits, SIGUSR2's dump taken in a thread of its own, and
     * the native stack on request. */
    /* All of them blocked before either thread starts: a thread inherits its creator's mask, so the dump thread
     * started first with SIGTERM still open would take SIGTERM's default action (the process ends, 143) */
    sigset_t taken;
    sigemptyset(&taken);
    sigaddset(&taken, SIGUSR2);
    if (!a->launch.selftest) {
        sigaddset(&taken, SIGTERM);
        sigaddset(&taken, SIGINT);
    }
    pthread_sigmask(SIG_BLOCK, &taken, NULL);
    flight_catch_dump_signal();
    if (!a->launch.selftest)
        control_catch_stop_signals();
    flight_init((int)a->cfg.trainer_flight_recorder_size);
    flight_stack_init();
    comm_mpi_init(argc, argv);
    struct comm *world = comm_mpi_world();
    const int rank = a->launch.replace_rank >= 0 ? a->launch.replace_rank : comm_rank(world);
    log_set_rank(rank);
    flight_set_rank(rank);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s/%s/flight", a->cfg.trainer_default_local_dir, a->cfg.trainer_project_name,
             a->cfg.trainer_experiment_name);
    flight_set_dump_dir(dir);
    watchdog_test_setup(a->cfg.test_block_at, (int)a->cfg.test_block_rank, a->cfg.test_block_step, rank);
    if (comm_rank(world) == 0)
        comm_mpi_log_caps();
    return world;
}

/* trainer.survive_trainer_loss only where it is covered (survive_check): 0, or 2 with the reason (rank 0 says it;
 * every rank refuses alike). */
static int survive_allowed(struct launch *l)
{
    const struct role_env *env = &l->env;
    if (l->selftest || !env->cfg->trainer_survive_trainer_loss)
        return 0;
    if (env->world_size == 1) {
        log_warn("worker", KEY_trainer_survive_trainer_loss ": one process has no other rank to go on without it");
        return 0;
    }
    char why[1024];
    if (survive_check(env->cfg, &env->spec, l->colocated, env->world_size, why, sizeof why) == 0)
        return 0;
    if (env->rank == 0)
        log_error("worker", "%s", why);
    l->refused_alike = true;
    return 2;
}

/* The launched role (or --selftest's check); its exit status. */
static int run(struct launch *l)
{
    if (l->selftest)
        return selftest(&l->world_groups);
    if (!l->split)
        return run_hybrid(&l->env);
    return l->env.at.role == PLACE_TRAINER ? run_trainer(&l->env) : run_rollout(&l->env);
}

/* Free what the launch built, end the job when this rank failed while its peers wait for it, end MPI. The world's
 * size is read before the world is freed. Returns status. */
static int finalize(struct launch *l, struct comm *world, struct args *a, int status)
{
    const int rank = comm_rank(world), size = comm_size(world);
    if (flight_size() > 0)
        log_info("flight", "%llu waits recorded on this rank (the flight recorder keeps the last %d)",
                 (unsigned long long)flight_recorded(), flight_size());
    launch_close_role(l);
    if (l->peers_wait && status != 0 && size > 1) {
        /* rank 0 ends the job for every rank, this one with it; if not, it ends it itself below. Under ULFM's fault
         * tolerance rank 0's end ends no other rank (comm_end_job): each ends itself at once */
        if (l->refused_alike && rank != 0 && !comm_ft_launched())
            sleep(30);
        /* the other ranks wait in a collective for this one: end the whole job, with the reason above */
        log_error("worker", "rank %d failed (exit %d): ending the job", rank, status);
        comm_end_job(status);
    }
    launch_close(l);
    comm_free(world);
    /* Open MPI 5 with ULFM after a survived loss too: its mpirun was seen not to end such a job now and then, all
     * the survivors' work written (docs/operations.md, "Surviving a lost trainer rank") */
    const bool lost = comm_ft_peer_was_lost();
    /* under trainer-loss survival a rank that saw no loss (a rollout rank, which takes part in no collective of
     * the trainers) may still be held in MPI_Finalize by one: every rank of the job needs the guard, or the
     * others' ending without MPI_Finalize leaves it there (a split run whose lead was lost did, now and then) */
    const bool outlives = (comm_job_outlives_ranks() || lost || a->cfg.trainer_survive_trainer_loss) && size > 1;
    finalize_lost = lost;
    if (lost && size > 1)
        log_info("worker", "this job lost a rank: if MPI_Finalize waits for it, this rank ends in 20 s%s",
                 status == 0 ? " and asks mpirun to end the job" : "");
    if (outlives && status == 0)
        comm_arm_job_end();
    if (outlives)
        finalize_watchdog(status);
    comm_mpi_finalize();
    /* every rank still in the job has reached MPI_Finalize: its work is done; mpirun ends a job that lost a rank
     * only when asked (a failed run's ranks end it through comm_end_job, with their status) */
    if (outlives && status == 0)
        comm_end_finished_job();
    config_free(&a->cfg);
    return status;
}

int main(int argc, char **argv)
{
    gen_turn_env_register(&agent_env_factory); /* multi-turn rollouts: the tool agent answers generation's turns */
    struct args a;
    int status = parse(&argc, argv, &a);
    if (status >= 0)
        return status;
    struct comm *world = init(&argc, &argv, &a);
    struct launch l;
    status = launch(&l, &a.cfg, world, &a.launch);
    if (status == 0)
        status = survive_allowed(&l);
    if (status == 0)
        status = run(&l);
    return finalize(&l, world, &a, status);
}
