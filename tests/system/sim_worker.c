/* sim_worker: a stand-in for grpo-worker in the control-plane tests.
 *
 * It registers through worker/control, runs N fake steps (gen, reward,
 * update_actor phases with sleeps) with fake metrics, and obeys pause, resume,
 * checkpoint and stop at two safe points per step, exactly as the trainer
 * does. Its "model" is a few doubles driven by a seeded generator, so its
 * final state depends only on the number of steps taken: a run paused and
 * resumed must end bit-identical to one that was not.
 *
 * Files: STATE (final state), STATE.ckpt (newest checkpoint; resumed from at
 * start when present), both written atomically (temporary, fsync, rename). */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/log.h"
#include "worker/control/control.h"

#define NW 8

struct sim {
    int64_t step;
    uint64_t rng;
    uint64_t rng0; /* at the start of the step: a checkpoint replays the step from there */
    double w[NW];
    const char *state_path;
};

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void sleep_ms(double ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(fmod(ms, 1000.0) * 1e6)};
    nanosleep(&ts, NULL); /* sleep-ok: a simulated step takes --step-ms */
}

/* The state to write (fs_write_fn's ctx). */
struct sim_state {
    const struct sim *s;
    uint64_t rng;
};

static int put_state(FILE *f, void *ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    const struct sim_state *st = ctx;
    fprintf(f, "step %lld\nrng %llu\n", (long long)st->s->step, (unsigned long long)st->rng);
    for (int i = 0; i < NW; i++)
        fprintf(f, "w %a\n", st->s->w[i]); /* hex floats: exact */
    return ferror(f) ? -1 : 0;
}

/* Write the state atomically: a reader sees the old file or the new one, never half. */
static int write_state(const struct sim *s, uint64_t rng, const char *path)
{
    struct sim_state st = {s, rng};
    char err[1024];
    if (fs_write_atomic_with(path, 0644, put_state, &st, err, sizeof err) != 0) {
        log_error("sim", "%s", err);
        return -1;
    }
    return 0;
}

/* "KEY VALUE" lines in write_state's order; 0 when all were there. */
static int read_state(struct sim *s, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[128];
    int got = 0, nw = 0;
    while (fgets(line, sizeof line, f)) {
        char *v = strchr(line, ' ');
        if (!v)
            break;
        *v++ = 0;
        char *end;
        if (strcmp(line, "step") == 0) {
            s->step = strtoll(v, &end, 10);
            got += end != v;
        } else if (strcmp(line, "rng") == 0) {
            s->rng = strtoull(v, &end, 10);
            got += end != v;
        } else if (strcmp(line, "w") == 0 && nw < NW) {
            s->w[nw] = strtod(v, &end); /* reads the %a hex floats back exactly */
            nw += end != v;
        }
    }
    fclose(f);
    return got == 2 && nw == NW ? 0 : -1;
}

/* A number option, or exit 2 naming it. */
static double number_arg(const char *opt, const char *text)
{
    char *end;
    double v = text ? strtod(text, &end) : 0;
    if (!text || end == text || *end) {
        fprintf(stderr, "sim_worker: %s expects a number, got '%s'\n", opt, text ? text : "");
        exit(2);
    }
    return v;
}

static int save_checkpoint(void *ud, int64_t step)
{
    struct sim *s = ud;
    char path[1024];
    snprintf(path, sizeof path, "%s.ckpt", s->state_path);
    (void)step;
    int rc = write_state(s, s->rng0, path);
    if (rc == 0)
        log_info("sim", "checkpoint at step %lld written to %s", (long long)s->step, path);
    return rc;
}

static void usage(FILE *out)
{
    fputs("usage: sim_worker [--config FILE] [key=value ...] --rank R --world N --state FILE [options]\n"
          "  --steps N        steps to train (default 20)\n"
          "  --step-ms MS     wall time of one step (default 100)\n"
          "  --host NAME      host name to report (default: gethostname)\n"
          "  --caps LIST      capabilities (default rollout,trainer)\n"
          "  --fail-at STEP   report a failure at this step and exit 1\n"
          "--state may hold %r, replaced by the rank; under mpirun the rank and size default to\n"
          "OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE.\n"
          "grpod.endpoint=E registers with grpod; without it the worker runs alone.\n",
          out);
}

int main(int argc, char **argv)
{
    log_init_from_env();
    struct grpo_config cfg;
    config_init(&cfg);
    int rc = config_from_args(&cfg, &argc, argv);
    if (rc != 0)
        return rc < 0 ? 2 : 0;
    /* under mpirun the rank and size come from the launcher, as for grpo-worker */
    const char *er = getenv("OMPI_COMM_WORLD_RANK"), *es = getenv("OMPI_COMM_WORLD_SIZE");
    int rank = er ? (int)number_arg("OMPI_COMM_WORLD_RANK", er) : 0;
    int world = es ? (int)number_arg("OMPI_COMM_WORLD_SIZE", es) : 1;
    long long steps = 20, fail_at = -1;
    double step_ms = 100;
    const char *host = NULL, *caps = "rollout,trainer", *state = NULL;
    static const struct option opts[] = {{"rank", required_argument, 0, 'r'},  {"world", required_argument, 0, 'n'},
                                         {"steps", required_argument, 0, 's'}, {"step-ms", required_argument, 0, 'm'},
                                         {"state", required_argument, 0, 'f'}, {"host", required_argument, 0, 'H'},
                                         {"caps", required_argument, 0, 'C'},  {"fail-at", required_argument, 0, 'F'},
                                         {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'r': rank = (int)number_arg("--rank", optarg); break;
        case 'n': world = (int)number_arg("--world", optarg); break;
        case 's': steps = (long long)number_arg("--steps", optarg); break;
        case 'm': step_ms = number_arg("--step-ms", optarg); break;
        case 'f': state = optarg; break;
        case 'H': host = optarg; break;
        case 'C': caps = optarg; break;
        case 'F': fail_at = (long long)number_arg("--fail-at", optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!state) {
        usage(stderr);
        return 2;
    }
    char state_buf[1024];
    const char *pct = strstr(state, "%r"); /* one file per rank: --state run.%r.state */
    if (pct) {
        snprintf(state_buf, sizeof state_buf, "%.*s%d%s", (int)(pct - state), state, rank, pct + 2);
        state = state_buf;
    }
    struct sim s = {.rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)rank, .state_path = state};
    char ckpt[1100];
    snprintf(ckpt, sizeof ckpt, "%s.ckpt", state);
    s.rng0 = s.rng;
    if (read_state(&s, ckpt) == 0)
        log_info("sim", "rank %d resumes from %s at step %lld", rank, ckpt, (long long)s.step);

    struct control_options copt;
    control_options_from_config(&copt, &cfg, rank, world);
    copt.host = host;
    copt.capabilities = caps;
    copt.start_step = s.step;
    struct control *ctl;
    struct control_assignment a;
    char err[1024];
    if (control_open(&copt, &ctl, &a, err, sizeof err) != 0) {
        log_error("sim", "%s", err);
        config_free(&cfg);
        return 1;
    }
    if (ctl)
        log_info("sim", "rank %d: role %s, run %s", rank, control_role_name(a.role), a.run_id);
    control_set_step(ctl, s.step, steps);
    bool stopped = false;
    int exit_code = 0;
    while (s.step < steps) {
        s.rng0 = s.rng;
        /* generation: draws from the generator, like sampling */
        control_set_phase(ctl, GRPO__PHASE__PHASE_GEN);
        sleep_ms(step_ms * 0.5);
        double reward = 0;
        for (int i = 0; i < NW; i++)
            reward += (double)(xorshift(&s.rng) >> 11) * 0x1p-53;
        reward = reward / NW * 0.2 + 1.0 - exp(-(double)s.step / 10.0);
        if (!control_safe_point(ctl, s.step, save_checkpoint, &s)) {
            stopped = true;
            break;
        }
        control_set_phase(ctl, GRPO__PHASE__PHASE_REWARD);
        sleep_ms(step_ms * 0.1);
        control_set_phase(ctl, GRPO__PHASE__PHASE_UPDATE_ACTOR);
        sleep_ms(step_ms * 0.4);
        for (int i = 0; i < NW; i++)
            s.w[i] += 0.01 * ((double)(xorshift(&s.rng) >> 11) * 0x1p-53 - 0.5) - 0.001 * s.w[i] + 1e-3 * reward;
        s.step++;
        s.rng0 = s.rng;
        control_set_metric(ctl, "critic/score/mean", reward);
        control_set_metric(ctl, "perf/throughput", 1000.0 + 10.0 * (double)s.step);
        control_set_metric(ctl, "actor/pg_loss", -reward * 0.1);
        control_set_step(ctl, s.step, steps);
        control_set_phase(ctl, GRPO__PHASE__PHASE_IDLE);
        if (s.step == fail_at) {
            char why[128];
            snprintf(why, sizeof why, "simulated failure at step %lld", fail_at);
            log_error("sim", "%s", why);
            control_finish(ctl, CONTROL_END_FAILED, why);
            exit_code = 1;
            break;
        }
        if (!control_safe_point(ctl, s.step, save_checkpoint, &s)) {
            stopped = true;
            break;
        }
    }
    if (exit_code == 0) {
        if (write_state(&s, s.rng, state) != 0) {
            log_error("sim", "cannot write %s", state);
            exit_code = 1;
        }
        control_finish(ctl, stopped ? CONTROL_END_STOPPED : CONTROL_END_FINISHED, NULL);
        log_info("sim", "rank %d %s at step %lld", rank, stopped ? "stopped" : "finished", (long long)s.step);
    }
    control_close(ctl);
    config_free(&cfg);
    return exit_code;
}
