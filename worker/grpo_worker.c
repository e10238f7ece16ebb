/* grpo-worker: one rank of a GRPO run, launched by mpirun.
 *
 * With one rank it runs the whole GRPO loop in this process (rollout, reward,
 * reference and trainer roles). --selftest checks the MPI collective plane
 * with the requested tensor/pipeline layout across all ranks. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/check_mpi.h"
#include "common/config.h"
#include "common/log.h"
#include "worker/comm/comm.h"
#include "worker/comm/parallel.h"
#include "worker/control/control.h"
#include "worker/metrics/metrics.h"
#include "worker/trainer/trainer.h"

static void usage(FILE *out)
{
    fputs("usage: mpirun -np N grpo-worker [--config FILE] [key.path=value ...] [options]\n"
          "\n"
          "One rank of a GRPO training run.\n"
          "\n"
          "options:\n"
          "  -c, --config FILE      YAML configuration (verl key names; see docs/configuration.md)\n"
          "  key.path=value         override one key, e.g. data.train_batch_size=16\n"
          "      --print-config     print the effective configuration with each value's origin, and exit\n"
          "      --config-reference print the Markdown reference of every key, and exit\n"
          "      --tp N             tensor-parallel size (default 1)\n"
          "      --pp N             pipeline-parallel size (default 1)\n"
          "      --selftest         check the collective plane across all ranks and the DP/TP/PP groups\n"
          "  -h, --help             this text\n"
          "\n"
          "environment: GRPO_LOG_LEVEL=error|warn|info|debug\n",
          out);
}

/* The control-plane client behind the trainer's hooks (a NULL control: no grpod, hooks do nothing). */
struct worker_ctl {
    struct control *ctl;
    struct trainer *trainer;
};

static enum control_phase phase_of(const char *name)
{
    static const struct {
        const char *name;
        enum control_phase phase;
    } map[] = {{"gen", CONTROL_PHASE_GEN},
               {"reward", CONTROL_PHASE_REWARD},
               {"old_log_prob", CONTROL_PHASE_OLD_LOG_PROB},
               {"ref", CONTROL_PHASE_REF},
               {"adv", CONTROL_PHASE_ADV},
               {"update_actor", CONTROL_PHASE_UPDATE_ACTOR},
               {"validate", CONTROL_PHASE_VALIDATE},
               {"checkpoint", CONTROL_PHASE_CHECKPOINT}};
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (strcmp(map[i].name, name) == 0)
            return map[i].phase;
    return CONTROL_PHASE_IDLE;
}

static void hook_phase(void *ctx, int64_t step, const char *phase)
{
    (void)step;
    struct worker_ctl *w = ctx;
    control_set_phase(w->ctl, phase_of(phase));
}

static void hook_step_done(void *ctx, int64_t step, int64_t total, const struct metrics *m)
{
    struct worker_ctl *w = ctx;
    control_set_step(w->ctl, step, total);
    for (size_t i = 0; i < metrics_count(m); i++)
        control_set_metric(w->ctl, metrics_name(m, i), metrics_value(m, i));
    control_set_phase(w->ctl, CONTROL_PHASE_IDLE);
}

static int save_for_control(void *ud, int64_t step)
{
    (void)step;
    struct worker_ctl *w = ud;
    return trainer_save_checkpoint(w->trainer);
}

/* Between steps: obey pause (blocks, heartbeats go on), checkpoint and stop from grpod. */
static int hook_safe_point(void *ctx, int64_t step)
{
    struct worker_ctl *w = ctx;
    return control_safe_point(w->ctl, step, save_for_control, w) ? TRAINER_CONTINUE : TRAINER_STOP;
}

/* The single-process GRPO run: every role in this process, under grpod when grpod.endpoint is set. */
static int run_trainer(const struct grpo_config *cfg)
{
    char err[2048];
    struct worker_ctl w = {0};
    struct control_options o;
    struct control_assignment a;
    control_options_from_config(&o, cfg, 0, 1);
    if (control_open(&o, &w.ctl, &a, err, sizeof err) != 0) {
        log_error("worker", "%s", err);
        return 3;
    }
    if (w.ctl)
        log_info("worker", "registered with grpod at %s: role %s, run %s", o.endpoint, control_role_name(a.role),
                 a.run_id);
    struct trainer_hooks hooks = {
        .ctx = &w, .phase = hook_phase, .step_done = hook_step_done, .safe_point = hook_safe_point};
    struct trainer *t = trainer_create(cfg, w.ctl ? &hooks : NULL, err, sizeof err);
    if (!t) {
        log_error("worker", "%s", err);
        control_finish(w.ctl, CONTROL_END_FAILED, err);
        control_close(w.ctl);
        return 2;
    }
    w.trainer = t;
    control_set_step(w.ctl, trainer_step(t), trainer_total_steps(t));
    int rc = trainer_run(t);
    bool finished = trainer_step(t) >= trainer_total_steps(t);
    if (rc == 0)
        log_info("worker", "run %s at step %lld; results in %s", finished ? "finished" : "stopped",
                 (long long)trainer_step(t), trainer_run_dir(t));
    control_finish(w.ctl, rc != 0 ? CONTROL_END_FAILED : (finished ? CONTROL_END_FINISHED : CONTROL_END_STOPPED),
                   rc != 0 ? "training failed (see the worker's log)" : NULL);
    control_close(w.ctl);
    trainer_free(t);
    return rc == 0 ? 0 : 1;
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
    int tp = 1, pp = 1, do_selftest = 0;
    static const struct option opts[] = {{"tp", required_argument, 0, 't'},
                                         {"pp", required_argument, 0, 'p'},
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
    } else if (comm_size(world) > 1) {
        if (comm_rank(world) == 0)
            log_error("worker",
                      "the trainer runs in one process for now (all roles); launch 1 rank, or use "
                      "--selftest to check a %d-rank layout",
                      comm_size(world));
        status = 2;
    } else {
        status = run_trainer(&cfg);
    }
    parallel_groups_free(&groups);
out_world:
    comm_free(world);
    MPI_Finalize();
    config_free(&cfg);
    return status;
}
