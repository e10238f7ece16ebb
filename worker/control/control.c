/* Worker-side control client; see control.h. One mutex guards everything the
 * trainer and the heartbeat thread share; the socket belongs to the thread
 * once control_open has registered. */
#include "control.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/backoff.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "worker/flight/flight.h"
#include "worker/metrics/metrics.h"

#define MAX_METRICS 128
#define MAX_SPANS 64
#define MAX_SURVIVED 16   /* control_set_survived */
#define RECENT_WAITS 8    /* finished waits each heartbeat carries (Heartbeat.recent_waits) */
#define TRACE_MAX 4096    /* the most records a trace carries (a heartbeat stays far below the control limit) */
#define STACKS_MAX 16384  /* bytes of a native stack (Heartbeat.stacks) */
#define STACKS_WAIT_S 2.0 /* how long the heartbeat thread waits for the main thread's stack */
#define FINISH_WAIT_S 5.0

_Static_assert(CONTROL_ROLE_SPARE == (int)GRPO__ROLE__ROLE_SPARE, "roles follow grpo.Role");
_Static_assert(CONTROL_ROLE_IDLE == (int)GRPO__ROLE__ROLE_IDLE, "roles follow grpo.Role");
_Static_assert(CONTROL_CHECKPOINT == (int)GRPO__COMMAND__COMMAND_CHECKPOINT, "commands follow grpo.Command");

struct control {
    /* fixed at open */
    char endpoint[512], host[256], caps[256], devices[1024];
    int rank, world, world_hosts;
    uint64_t digest;
    char *run_config;        /* Register.run_config: config_run_text of the run's configuration ("" when not given) */
    char **world_host_names; /* Register.world_host_names ([world], NULL: not sent) */
    Grpo__Phase delay_phase; /* test only: see control_options */
    double delay_s;
    double host_memory_gb;
    double end_wait_s; /* grpod.connect_timeout_s: how long an end grpod cannot hear is kept and retried; 0: forever */
    struct rpc_client *rpc; /* the heartbeat thread's alone after open */
    uint64_t hb_seq;        /* heartbeats sent (tries included): Heartbeat.seq; the heartbeat thread's alone */
    int reg_timeout_ms;     /* how long a registration waits for its answer (register_once) */
    void (*on_abort)(const char *reason);
    bool replaces;
    uint64_t launch;
    pthread_t thread;
    bool thread_started;

    pthread_mutex_t mu;
    pthread_cond_t changed; /* the thread heard from grpod: waiters re-check */
    pthread_cond_t wake;    /* the trainer has news: the thread sends it now */

    /* identity in the run (the thread updates it when registering again) */
    enum control_role role;
    char run_id[64];
    uint64_t incarnation;
    double interval;

    /* the snapshot the heartbeats carry */
    int64_t step, total_steps;
    Grpo__Phase phase;
    double since; /* when the current phase (or pause) began */
    double cur[GRPO_NUM_PHASES], last[GRPO_NUM_PHASES];
    double busy, idle;
    bool paused;
    bool said_paused; /* "paused at step N" logged since the last resume (a rank held while it waited is paused
                       * before it reaches its safe point, and says so there) */
    struct {
        char name[64];
        double value;
    } metrics[MAX_METRICS];
    int nmetrics;
    Grpo__WorkerState state;
    char error[512];
    uint64_t ckpt_done_seq;
    int64_t ckpt_step;
    uint64_t generation, acked_generation; /* snapshot versions made and known to grpod */
    struct {
        double start;
        Grpo__Phase phase;
    } spans[MAX_SPANS]; /* phase changes not yet sent, oldest first (the status page's timeline) */
    int nspans;

    /* trainer.survive_trainer_loss: the ranks the run went on without, sent in every heartbeat from then on */
    struct {
        int rank;
        char reason[96];
    } survived[MAX_SURVIVED];
    int nsurvived;
    int layout_dp_rank, layout_dp_size; /* the re-formed layout's (control_set_layout; size 0: unchanged) */
    char left_copy[400];                /* control_set_left's why ("": this rank trains) */

    /* what grpod wants, as levels */
    bool want_pause, want_stop, run_over;
    bool run_finished; /* grpod said the run finished (a heartbeat's answer, or a refusal: it is over) */
    uint64_t ckpt_seq, ckpt_taken;
    char reason[512];
    bool stop_sent; /* grpod has been asked to stop the run because of a signal (control_stop_signal) */
    /* grpoctl trace / stacks (HeartbeatAck.trace_seq, stacks_seq): the requests heard, and answered */
    uint64_t trace_want, trace_done, stacks_want, stacks_done;
    bool connected, reregister_warned;
    bool quit, kick;
};

const char *control_command_name(enum control_command cmd)
{
    static const char *n[] = {"none", "pause", "resume", "stop", "checkpoint"};
    return (unsigned)cmd < sizeof n / sizeof n[0] ? n[cmd] : "unknown";
}

const char *control_role_name(enum control_role role)
{
    static const char *n[] = {"unassigned", "rollout", "trainer", "hybrid", "spare"};
    return (unsigned)role < sizeof n / sizeof n[0] ? n[role] : "unknown";
}

uint64_t control_config_digest(const struct grpo_config *cfg)
{
    uint64_t h = config_digest(cfg); /* leaves out grpod.* and trainer.log_level */
    return h ? h : 1;
}

void control_options_from_config(struct control_options *o, const struct grpo_config *cfg, int rank, int world_size)
{
    memset(o, 0, sizeof *o);
    o->endpoint = cfg->grpod_endpoint;
    o->secret_file = cfg->grpod_secret_file;
    o->rank = rank;
    o->world_size = world_size;
    o->capabilities = "rollout,trainer";
    o->devices = "cpu";
    o->config_digest = control_config_digest(cfg);
    o->config = cfg;
    o->connect_timeout_s = cfg->grpod_connect_timeout_s;
    /* test only: a rank made slow on purpose */
    const struct cfg_flist *d = &cfg->test_delay_s;
    o->delay_s = d->n == 1 ? d->v[0] : rank >= 0 && rank < d->n ? d->v[rank] : 0;
    for (int p = 1; p < GRPO_NUM_PHASES; p++)
        if (strcmp(cfg->test_delay_phase, core_phase_name((Grpo__Phase)p)) == 0)
            o->delay_phase = (Grpo__Phase)p;
}

/* ---- SIGTERM and SIGINT ---- */

static atomic_int stop_signal_taken; /* the first one's number, 0: none */
static sigset_t stop_signal_set;
/* Where the first one came from (" from its launcher, mpirun (pid N)", " from pid N (bash)"; "" when the kernel
 * does not say): written by the signal thread before stop_signal_taken is set, read after. */
static char stop_signal_from[200];
/* The control client to wake when the first signal comes, so that its stop request goes to grpod at once (a
 * launcher that ends the job sends SIGKILL a second after its SIGTERM) */
static pthread_mutex_t kick_mu = PTHREAD_MUTEX_INITIALIZER;
static struct control *kick_target;

const char *control_signal_name(int sig)
{
    static _Thread_local char other[32];
    if (sig == SIGTERM)
        return "SIGTERM";
    if (sig == SIGINT)
        return "SIGINT";
    snprintf(other, sizeof other, "signal %d", sig);
    return other;
}

int control_stop_signal(void) { return atomic_load(&stop_signal_taken); }

const char *control_stop_signal_from(void) { return atomic_load(&stop_signal_taken) ? stop_signal_from : ""; }

/* " from ..." for a signal sent by process pid: its launcher (this process's parent: mpirun, Open MPI's orted,
 * slurmstepd) or another process, by its command name; "" when the sender is unknown (pid 0: the kernel, or a
 * process of another PID namespace). */
static void describe_sender(pid_t pid, char *out, size_t len)
{
    out[0] = 0;
    if (pid <= 0)
        return;
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = 0;
        fclose(f);
    }
    if (pid == getppid() && strcmp(comm, "orted") == 0) /* mpirun runs on another host, or orted was signalled */
        snprintf(out, len, " from its launcher, Open MPI's daemon orted (pid %d)", (int)pid);
    else if (pid == getppid())
        snprintf(out, len, " from its launcher, %s (pid %d)", comm[0] ? comm : "its parent", (int)pid);
    else
        snprintf(out, len, " from pid %d%s%s%s", (int)pid, comm[0] ? " (" : "", comm, comm[0] ? ")" : "");
}

/* Wake the control client's heartbeat thread: a stop signal came. */
static void kick_control(void);

/* A second signal this soon after the first, and of its kind, is the same request: coreutils' timeout and a
 * signal to the process group (Slurm, systemd, a shell's ^C) deliver one to the process and one to its group. */
#define STOP_SIGNAL_ECHO_S 1.0

/* Takes the signals the other threads block: the first is a stop request, and so is its echo (the same signal
 * within STOP_SIGNAL_ECHO_S); any other signal after it, or a third, ends the process. */
static void *signal_thread(void *arg)
{
    (void)arg;
    double first_at = 0;
    bool echo_taken = false;
    for (;;) {
        siginfo_t info;
        const int sig = sigwaitinfo(&stop_signal_set, &info);
        if (sig < 0)
            continue;
        if (atomic_load(&stop_signal_taken) == 0) /* this thread alone writes it, before the first is taken */
            describe_sender(info.si_code == SI_USER || info.si_code == SI_QUEUE ? info.si_pid : 0, stop_signal_from,
                            sizeof stop_signal_from);
        int expected = 0;
        if (atomic_compare_exchange_strong(&stop_signal_taken, &expected, sig)) {
            first_at = clock_now_s();
            log_warn("worker",
                     "%s received%s: the run stops at its next safe point, after a checkpoint, and this process "
                     "ends with it (another signal more than %.0f s later ends it at once, without a checkpoint)",
                     control_signal_name(sig), stop_signal_from, STOP_SIGNAL_ECHO_S);
            kick_control();
        } else if (!echo_taken && sig == expected && clock_now_s() - first_at <= STOP_SIGNAL_ECHO_S) {
            echo_taken = true;
            log_info("worker",
                     "%s received again within %.0f s: the same request to stop (timeout and signals to the process "
                     "group deliver two); a further signal ends the process at once",
                     control_signal_name(sig), STOP_SIGNAL_ECHO_S);
        } else {
            log_error("worker", "%s received after %s: ending now, without a checkpoint", control_signal_name(sig),
                      control_signal_name(expected));
            _exit(128 + sig);
        }
    }
    return NULL;
}

int control_catch_stop_signals(void)
{
    sigemptyset(&stop_signal_set);
    sigaddset(&stop_signal_set, SIGTERM);
    sigaddset(&stop_signal_set, SIGINT);
    int rc = pthread_sigmask(SIG_BLOCK, &stop_signal_set, NULL);
    pthread_t th;
    if (rc == 0)
        rc = pthread_create(&th, NULL, signal_thread, NULL);
    if (rc != 0) {
        pthread_sigmask(SIG_UNBLOCK, &stop_signal_set, NULL);
        log_error("worker", "cannot take SIGTERM and SIGINT in a thread (%s): they end the process at once",
                  strerror(rc));
        return -1;
    }
    pthread_detach(th);
    return 0;
}

/* A stop signal this worker obeys at its safe points: a rollout rank ends when the trainers say so. */
static bool signal_stops(const struct control *c)
{
    return control_stop_signal() != 0 && c->role != CONTROL_ROLE_ROLLOUT;
}

/* ---- the snapshot ---- */

/* Book the time since the last call to the current phase (busy) or to idle. Under mu. */
static void account(struct control *c, double now)
{
    double dt = now - c->since;
    if (dt < 0)
        dt = 0;
    if (c->paused || c->phase == GRPO__PHASE__PHASE_IDLE)
        c->idle += dt;
    else
        c->busy += dt;
    if (!c->paused)
        c->cur[c->phase] += dt;
    c->since = now;
}

/* A deadline `seconds` from now on the monotonic clock the condition variables use. */
static struct timespec deadline_in(double seconds)
{
    const double t = clock_now_s() + seconds;
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    return ts;
}

/* Something grpod should hear about soon. Under mu. */
static void changed_locked(struct control *c)
{
    c->generation++;
    c->kick = true;
    pthread_cond_signal(&c->wake);
}

/* Test only (test.delay_phase, test.delay_s): the rank made slow on purpose, in the phase it has just entered,
 * so the time counts as that phase's. */
static void test_delay(const struct control *c)
{
    log_debug("control", KEY_test_delay_s ": %.3f s in phase %s", c->delay_s, core_phase_name(c->delay_phase));
    clock_sleep_s(c->delay_s);
}

void control_set_phase(struct control *c, Grpo__Phase phase)
{
    if ((unsigned)phase >= GRPO_NUM_PHASES)
        return;
    flight_set_phase((int)phase); /* with or without grpod: the flight recorder's records say where they began */
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    account(c, clock_now_s());
    const bool entered = phase != c->phase;
    if (entered) {
        if (c->nspans == MAX_SPANS) { /* grpod has not heard for a while: keep the newest */
            memmove(c->spans, c->spans + 1, sizeof c->spans[0] * (MAX_SPANS - 1));
            c->nspans--;
        }
        c->spans[c->nspans].start = clock_wall_s();
        c->spans[c->nspans++].phase = phase;
    }
    c->phase = phase;
    if (c->state == GRPO__WORKER_STATE__WORKER_STARTING && phase != GRPO__PHASE__PHASE_IDLE)
        c->state = GRPO__WORKER_STATE__WORKER_RUNNING; /* loading is over: the first step has begun */
    pthread_mutex_unlock(&c->mu);
    if (entered && c->delay_s > 0 && phase == c->delay_phase)
        test_delay(c);
}

void control_set_step(struct control *c, int64_t step, int64_t total_steps)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    account(c, clock_now_s());
    if (step != c->step) {
        memcpy(c->last, c->cur, sizeof c->last);
        memset(c->cur, 0, sizeof c->cur);
    }
    c->step = step;
    c->total_steps = total_steps;
    c->generation++;
    pthread_mutex_unlock(&c->mu);
}

void control_set_metric(struct control *c, const char *name, double value)
{
    if (!c || !name || !name[0])
        return;
    pthread_mutex_lock(&c->mu);
    int i = 0;
    while (i < c->nmetrics && strncmp(c->metrics[i].name, name, sizeof c->metrics[i].name - 1) != 0)
        i++;
    if (i < MAX_METRICS) {
        if (i == c->nmetrics) {
            snprintf(c->metrics[i].name, sizeof c->metrics[i].name, "%s", name);
            c->nmetrics++;
        }
        c->metrics[i].value = value;
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- commands ---- */

enum control_command control_poll(struct control *c)
{
    if (!c)
        return CONTROL_NONE;
    enum control_command cmd = CONTROL_NONE;
    pthread_mutex_lock(&c->mu);
    if (c->want_stop || c->run_over || signal_stops(c)) {
        c->ckpt_taken = c->ckpt_seq; /* the stop's checkpoint answers any request still open */
        cmd = CONTROL_STOP;
    } else if (c->ckpt_seq > c->ckpt_taken) {
        c->ckpt_taken = c->ckpt_seq;
        cmd = CONTROL_CHECKPOINT;
    } else if (c->want_pause) {
        cmd = CONTROL_PAUSE;
    }
    pthread_mutex_unlock(&c->mu);
    return cmd;
}

enum control_command control_wait_resume(struct control *c)
{
    if (!c)
        return CONTROL_RESUME;
    enum control_command cmd;
    pthread_mutex_lock(&c->mu);
    if (!c->paused) {
        account(c, clock_now_s());
        c->paused = true;
        c->state = GRPO__WORKER_STATE__WORKER_PAUSED;
        changed_locked(c);
    }
    if (!c->said_paused) {
        log_info("control", "paused at step %lld; waiting for grpod to resume the run", (long long)c->step);
        c->said_paused = true;
    }
    for (;;) {
        if (c->want_stop || c->run_over || signal_stops(c)) {
            c->ckpt_taken = c->ckpt_seq;
            cmd = CONTROL_STOP;
            break;
        }
        if (c->ckpt_seq > c->ckpt_taken) {
            c->ckpt_taken = c->ckpt_seq;
            cmd = CONTROL_CHECKPOINT;
            break;
        }
        if (!c->want_pause) {
            cmd = CONTROL_RESUME;
            break;
        }
        /* a signal cannot wake the condition: look for one now and then */
        struct timespec until = deadline_in(0.25);
        pthread_cond_timedwait(&c->changed, &c->mu, &until);
    }
    if (cmd == CONTROL_RESUME) {
        account(c, clock_now_s());
        c->paused = false;
        c->state = GRPO__WORKER_STATE__WORKER_RUNNING;
        changed_locked(c);
        c->said_paused = false;
        log_info("control", "resumed at step %lld", (long long)c->step);
    }
    pthread_mutex_unlock(&c->mu);
    return cmd;
}

/* Report paused or running again (under mu). */
static void set_held(struct control *c, bool held)
{
    if (c->paused == held)
        return;
    account(c, clock_now_s());
    c->paused = held;
    c->state = held ? GRPO__WORKER_STATE__WORKER_PAUSED : GRPO__WORKER_STATE__WORKER_RUNNING;
    changed_locked(c);
}

void control_hold_while_waiting(struct control *c, bool done)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (done || !c->want_pause || c->want_stop || c->run_over) {
        set_held(c, false);
    } else {
        set_held(c, true);
        /* a moment at most: the caller goes back to see whether its peers have come (checkpoint requests stay
         * open for the next safe point) */
        struct timespec until = deadline_in(0.05); /* the condition variables wait on the monotonic clock */
        if (c->want_pause && !c->want_stop && !c->run_over && !c->quit)
            pthread_cond_timedwait(&c->changed, &c->mu, &until);
    }
    pthread_mutex_unlock(&c->mu);
}

void control_wait_poll(void *ctl, bool done) { control_hold_while_waiting(ctl, done); }

bool control_run_finished(struct control *c)
{
    if (!c)
        return false;
    pthread_mutex_lock(&c->mu);
    bool done = c->run_finished;
    pthread_mutex_unlock(&c->mu);
    return done;
}

bool control_run_goes_on(struct control *c)
{
    if (!c)
        return false;
    pthread_mutex_lock(&c->mu);
    bool on = !c->connected || (!c->want_stop && !c->run_over && !c->run_finished);
    pthread_mutex_unlock(&c->mu);
    return on;
}

bool control_pause_wanted(struct control *c)
{
    if (!c)
        return false;
    pthread_mutex_lock(&c->mu);
    bool paused = c->want_pause && !c->want_stop && !c->run_over;
    pthread_mutex_unlock(&c->mu);
    return paused;
}

void control_checkpoint_done(struct control *c, int64_t step)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->ckpt_done_seq = c->ckpt_taken;
    c->ckpt_step = step;
    changed_locked(c);
    pthread_mutex_unlock(&c->mu);
}

void control_set_survived(struct control *c, const int *ranks, int n, const char *reason)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < n && c->nsurvived < MAX_SURVIVED; i++) {
        c->survived[c->nsurvived].rank = ranks[i];
        snprintf(c->survived[c->nsurvived++].reason, sizeof c->survived[0].reason, "%s", reason);
    }
    changed_locked(c);
    pthread_mutex_unlock(&c->mu);
}

void control_set_layout(struct control *c, int dp_rank, int dp_size)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->layout_dp_rank = dp_rank;
    c->layout_dp_size = dp_size;
    if (c->role == CONTROL_ROLE_SPARE)
        c->role = CONTROL_ROLE_HYBRID; /* it trains from now on */
    changed_locked(c);
    pthread_mutex_unlock(&c->mu);
}

void control_set_left(struct control *c, const char *why)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    snprintf(c->left_copy, sizeof c->left_copy, "%s", why && why[0] ? why : "its model copy lost a rank");
    c->role = CONTROL_ROLE_IDLE;
    changed_locked(c);
    pthread_mutex_unlock(&c->mu);
}

void control_checkpoint_held(struct control *c, int64_t step)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->ckpt_taken = c->ckpt_done_seq = c->ckpt_seq;
    c->ckpt_step = step;
    changed_locked(c);
    pthread_mutex_unlock(&c->mu);
}

bool control_safe_point(struct control *c, int64_t step, int (*save)(void *ud, int64_t step), void *ud)
{
    enum control_command cmd = control_poll(c);
    bool paused = false;
    for (;;) {
        switch (cmd) {
        case CONTROL_NONE:
        case CONTROL_RESUME: return true;
        case CONTROL_PAUSE: paused = true; break;
        case CONTROL_CHECKPOINT:
        case CONTROL_STOP:
            if (save(ud, step) == 0)
                control_checkpoint_done(c, step);
            else
                log_error("control", "checkpoint at step %lld failed", (long long)step);
            if (cmd == CONTROL_STOP)
                return false;
            break;
        }
        cmd = paused ? control_wait_resume(c) : control_poll(c);
    }
}

void control_finish(struct control *c, enum control_end end, const char *error)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    account(c, clock_now_s());
    c->paused = false;
    c->state = end == CONTROL_END_FINISHED  ? GRPO__WORKER_STATE__WORKER_FINISHED
               : end == CONTROL_END_STOPPED ? GRPO__WORKER_STATE__WORKER_STOPPED
                                            : GRPO__WORKER_STATE__WORKER_FAILED;
    if (end == CONTROL_END_STOPPED && !error && control_stop_signal()) /* who stopped it, for grpod's record */
        snprintf(c->error, sizeof c->error, "%s received%s", control_signal_name(control_stop_signal()),
                 control_stop_signal_from());
    else
        snprintf(c->error, sizeof c->error, "%s", error ? error : "");
    changed_locked(c);
    uint64_t want = c->generation;
    /* The end message is kept until grpod acknowledges it: the heartbeat thread sends it, and while grpod does
     * not answer it retries with backoff. A grpod that answers hears it at once, so FINISH_WAIT_S is plenty. A
     * grpod that is unreachable (down, restarting) is waited for up to grpod.connect_timeout_s (0: for ever):
     * a grpod restarted meanwhile on its state directory recovers the run as running with this worker
     * reconnecting, and only this message tells it the run ended (issue 40 item 6; docs/operations.md). A stop
     * signal (the job is being ended) cuts the wait back to FINISH_WAIT_S. */
    const double start = clock_now_s();
    bool told = false;
    while (c->acked_generation < want && !c->run_over) {
        const double waited = clock_now_s() - start;
        const bool keep = !c->connected && control_stop_signal() == 0;
        const double limit = !keep ? FINISH_WAIT_S : c->end_wait_s <= 0 ? INFINITY : fmax(c->end_wait_s, FINISH_WAIT_S);
        if (waited >= limit) {
            log_warn("control", "grpod has not acknowledged that this worker ended; leaving anyway");
            break;
        }
        if (keep && waited >= FINISH_WAIT_S && !told) {
            if (isinf(limit))
                log_warn("control",
                         "grpod has not acknowledged that this worker ended (unreachable at %s); retrying "
                         "until it does (" KEY_grpod_connect_timeout_s " = 0)",
                         c->endpoint);
            else
                log_warn("control",
                         "grpod has not acknowledged that this worker ended (unreachable at %s); retrying "
                         "for up to %.0f s (" KEY_grpod_connect_timeout_s ")",
                         c->endpoint, limit);
            told = true;
        }
        struct timespec until = deadline_in(fmin(0.5, limit - waited));
        pthread_cond_timedwait(&c->changed, &c->mu, &until);
    }
    if (told && c->acked_generation >= want)
        log_info("control", "grpod acknowledged that this worker ended");
    pthread_mutex_unlock(&c->mu);
}

void control_fail_now(struct control *c, const char *error, double wait_s)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    account(c, clock_now_s());
    c->state = GRPO__WORKER_STATE__WORKER_FAILED;
    snprintf(c->error, sizeof c->error, "%s", error ? error : "");
    changed_locked(c);
    const uint64_t want = c->generation;
    const double until_s = clock_now_s() + wait_s;
    while (c->acked_generation < want && clock_now_s() < until_s) {
        struct timespec until = deadline_in(fmin(0.25, until_s - clock_now_s()));
        pthread_cond_timedwait(&c->changed, &c->mu, &until);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- talking to grpod ---- */

static void split_list(const char *list, char ***out, size_t *n)
{
    *n = 0;
    *out = NULL;
    if (!list || !list[0])
        return;
    size_t cap = 1;
    for (const char *p = list; *p; p++)
        cap += *p == ',';
    *out = xcalloc(cap, sizeof **out);
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        if (l)
            (*out)[(*n)++] = strndup(p, l);
        p += l + (p[l] == ',');
    }
}

static void free_list(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

static void copy_assignment(struct control_assignment *a, const Grpo__Assignment *as)
{
    memset(a, 0, sizeof *a);
    a->role = (enum control_role)as->role;
    a->dp_rank = as->dp_rank;
    a->dp_size = as->dp_size;
    a->tp_rank = as->tp_rank;
    a->tp_size = as->tp_size;
    a->pp_rank = as->pp_rank;
    a->pp_size = as->pp_size;
    a->world_size = as->world_size;
    snprintf(a->run_id, sizeof a->run_id, "%s", as->run_id);
    a->resume_step = as->resume_step;
    a->config_digest = as->config_digest;
    snprintf(a->data_pull_endpoint, sizeof a->data_pull_endpoint, "%s", as->data_pull_endpoint);
    snprintf(a->data_push_endpoint, sizeof a->data_push_endpoint, "%s", as->data_push_endpoint);
    for (size_t i = 0; i < as->n_trainer_endpoints && i < 64; i++)
        snprintf(a->trainer_endpoints[a->n_trainer_endpoints++], sizeof a->trainer_endpoints[0], "%s",
                 as->trainer_endpoints[i]);
    snprintf(a->dispatch_endpoint, sizeof a->dispatch_endpoint, "%s", as->dispatch_endpoint);
    a->heartbeat_interval_s = as->heartbeat_interval_s;
    a->incarnation = as->incarnation;
    if (as->plane_key.len == sizeof a->plane_key) {
        memcpy(a->plane_key, as->plane_key.data, sizeof a->plane_key);
        a->has_plane_key = true;
    }
    if (as->plane_run_key.len == sizeof a->plane_run_key) {
        memcpy(a->plane_run_key, as->plane_run_key.data, sizeof a->plane_run_key);
        a->has_plane_run_key = true;
    }
    a->plane_epoch = as->plane_epoch;
}

/* A registration's wait for its answer: at first, and at most once it has grown. */
#define REGISTER_TIMEOUT_MS 2000
#define REGISTER_TIMEOUT_MAX_MS 32000

/* One registration attempt. 0: registered (a filled); 1: try again later (err says why); -1: refused. */
static int register_once(struct control *c, const char *run_id, uint64_t incarnation, int64_t step,
                         struct control_assignment *a, uint64_t *token, uint64_t *ckpt_seq, char *err, size_t errlen)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    reg.rank = c->rank;
    reg.world_size = c->world;
    reg.host = c->host;
    reg.world_hosts = c->world_hosts;
    if (c->world_host_names) {
        reg.world_host_names = c->world_host_names;
        reg.n_world_host_names = (size_t)c->world;
    }
    reg.pid = (int32_t)getpid();
    reg.config_digest = c->digest;
    reg.run_config = c->run_config;
    reg.run_id = (char *)run_id;
    reg.incarnation = incarnation;
    reg.step = step;
    reg.replaces = c->replaces;
    reg.launch = c->launch;
    split_list(c->devices, &reg.devices, &reg.n_devices);
    split_list(c->caps, &reg.capabilities, &reg.n_capabilities);
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    Grpo__Envelope *reply = NULL;
    /* 2 s, twice as long after each registration left unanswered, at most REGISTER_TIMEOUT_MAX_MS: 10,000 ranks
     * registering at once queue at grpod for longer than 2 s, and with a fixed 2 s every answer came too late, every
     * rank asked again and none got in (docs/scaling.md) */
    if (c->reg_timeout_ms < REGISTER_TIMEOUT_MS)
        c->reg_timeout_ms = REGISTER_TIMEOUT_MS;
    enum rpc_result r = rpc_call(c->rpc, &env, c->reg_timeout_ms, &reply, err, errlen);
    char probe[128];
    if (r == RPC_UNREACHABLE && endpoint_probe(rpc_endpoint(c->rpc), probe, sizeof probe) == 0) /* up, but busy */
        c->reg_timeout_ms =
            c->reg_timeout_ms * 2 < REGISTER_TIMEOUT_MAX_MS ? c->reg_timeout_ms * 2 : REGISTER_TIMEOUT_MAX_MS;
    else
        c->reg_timeout_ms = REGISTER_TIMEOUT_MS; /* answered, or nobody listens: a down grpod is tried every 2 s */
    free_list(reg.devices, reg.n_devices);
    free_list(reg.capabilities, reg.n_capabilities);
    if (r == RPC_UNREACHABLE)
        return 1;
    if (r == RPC_BAD_REPLY)
        return -1;
    int rc = -1;
    if (reply->body_case == GRPO__ENVELOPE__BODY_ASSIGNMENT) {
        copy_assignment(a, reply->assignment);
        *token = reply->assignment->incarnation;
        *ckpt_seq = reply->assignment->checkpoint_seq;
        rc = 0;
    } else if (reply->body_case == GRPO__ENVELOPE__BODY_REPLY && !reply->reply->ok) {
        snprintf(err, errlen, "%s", reply->reply->error);
        rc = reply->reply->retry ? 1 : -1;
    } else {
        snprintf(err, errlen, "grpod answered the registration with '%s'", protocol_body_name(reply->body_case));
    }
    protocol_free(reply);
    return rc;
}

/* Adopt a registration: its token, and grpod's count of checkpoint requests as the new baseline
 * (requests made before this registration are not this process's to answer). Under mu. */
static void adopt(struct control *c, const struct control_assignment *a, uint64_t token, uint64_t ckpt_seq)
{
    c->role = a->role;
    snprintf(c->run_id, sizeof c->run_id, "%s", a->run_id);
    c->interval = a->heartbeat_interval_s > 0 ? a->heartbeat_interval_s : 1.0;
    c->incarnation = token;
    c->ckpt_seq = c->ckpt_taken = c->ckpt_done_seq = ckpt_seq;
}

static void tell_ending(struct control *c, const char *why);

static void apply_ack(struct control *c, const Grpo__HeartbeatAck *ack)
{
    if (ack->pause != c->want_pause || ack->stop != c->want_stop || ack->checkpoint_seq != c->ckpt_seq)
        log_info("control", "grpod: run %s%s%s, checkpoint requests %llu", c->run_id, ack->pause ? ", pause" : "",
                 ack->stop ? ", stop" : "", (unsigned long long)ack->checkpoint_seq);
    c->want_pause = ack->pause;
    c->want_stop = ack->stop;
    if (ack->trace_seq > c->trace_want)
        c->trace_want = ack->trace_seq;
    if (ack->stacks_seq > c->stacks_want)
        c->stacks_want = ack->stacks_seq;
    if (ack->run_state == GRPO__RUN_STATE__RUN_FINISHED)
        c->run_finished = true;
    if (ack->checkpoint_seq > c->ckpt_seq)
        c->ckpt_seq = ack->checkpoint_seq;
    snprintf(c->reason, sizeof c->reason, "%s", ack->reason);
    if (ack->abort[0]) {
        log_error("control", "grpod: %s", ack->abort);
        if (c->on_abort) {
            tell_ending(c, ack->abort);
            c->on_abort(ack->abort); /* does not come back */
        }
    }
}

/* The heartbeat of the current snapshot. Under mu; the strings point into c. */
static void build_heartbeat(struct control *c, Grpo__Heartbeat *hb, Grpo__PhaseTime *pt, Grpo__PhaseTime **ptp,
                            Grpo__Metric *m, Grpo__Metric **mp, Grpo__PhaseSpan *ps, Grpo__PhaseSpan **psp)
{
    account(c, clock_now_s());
    grpo__heartbeat__init(hb);
    hb->rank = c->rank;
    hb->step = c->step;
    hb->total_steps = c->total_steps;
    hb->phase = c->phase;
    hb->idle_seconds = c->idle;
    hb->busy_seconds = c->busy;
    const double peak = proc_peak_rss_gb(); /* GiB, as perf/cpu_memory_peak_gb */
    hb->peak_rss_gb = isfinite(peak) && peak > 0 ? peak : 0;
    hb->host_memory_gb = c->host_memory_gb;
    hb->paused = c->paused;
    hb->incarnation = c->incarnation;
    hb->state = c->state;
    hb->checkpoint_seq_done = c->ckpt_done_seq;
    hb->checkpoint_step = c->ckpt_step;
    hb->error = c->error;
    bool have_last = false;
    for (int p = 0; p < GRPO_NUM_PHASES; p++)
        have_last |= c->last[p] > 0;
    const double *t = have_last ? c->last : c->cur; /* the last whole step, or the first one so far */
    for (int p = 1; p < GRPO_NUM_PHASES; p++) {
        if (t[p] <= 0)
            continue;
        grpo__phase_time__init(&pt[hb->n_timings]);
        pt[hb->n_timings].phase = (Grpo__Phase)p;
        pt[hb->n_timings].seconds = t[p];
        ptp[hb->n_timings] = &pt[hb->n_timings];
        hb->n_timings++;
    }
    hb->timings = ptp;
    for (int i = 0; i < c->nmetrics; i++) {
        grpo__metric__init(&m[i]);
        m[i].name = c->metrics[i].name;
        m[i].value = c->metrics[i].value;
        mp[i] = &m[i];
    }
    hb->n_metrics = (size_t)c->nmetrics;
    hb->metrics = mp;
    for (int i = 0; i < c->nspans; i++) {
        grpo__phase_span__init(&ps[i]);
        ps[i].start = c->spans[i].start;
        ps[i].phase = c->spans[i].phase;
        psp[i] = &ps[i];
    }
    hb->n_phase_changes = (size_t)c->nspans;
    hb->phase_changes = psp;
    c->nspans = 0; /* sent once; a lost heartbeat loses only a stretch of the timeline */
}

/* Send hb, stamped with the worker's own count and clock of its heartbeats (after a silence grpod tells a worker
 * that stalled, sent nothing, from heartbeats held up on the way, sent and never heard) and the tries just before
 * it that had no answer. On the heartbeat thread, the only user of c->rpc. */
static enum rpc_result send_heartbeat(struct control *c, Grpo__Heartbeat *hb, uint32_t unanswered, int timeout_ms,
                                      Grpo__Envelope **reply, char *err, size_t errlen)
{
    hb->seq = ++c->hb_seq;
    hb->sent_s = clock_now_s();
    hb->unanswered = unanswered;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = hb;
    return rpc_call(c->rpc, &env, timeout_ms, reply, err, errlen);
}

/* grpod told this worker to end (a trainer its job depends on is lost): one last heartbeat says so, as stopped
 * and why, so that grpod's record holds this rank's end, not its loss found later by its silence. Its own line
 * may never be read: Open MPI 4.1's mpirun, once it lost a host's daemon, was seen to leave its ranks' last lines
 * unread and end. Under mu, on the heartbeat thread (the only user of c->rpc); grpod has just answered. */
static void tell_ending(struct control *c, const char *why)
{
    c->state = GRPO__WORKER_STATE__WORKER_STOPPED;
    snprintf(c->error, sizeof c->error, "ended as grpod said: %s", why);
    Grpo__Heartbeat hb;
    Grpo__PhaseTime pt[GRPO_NUM_PHASES], *ptp[GRPO_NUM_PHASES];
    Grpo__Metric m[MAX_METRICS], *mp[MAX_METRICS];
    Grpo__PhaseSpan ps[MAX_SPANS], *psp[MAX_SPANS];
    build_heartbeat(c, &hb, pt, ptp, m, mp, ps, psp);
    Grpo__Envelope *reply = NULL;
    char err[512];
    if (send_heartbeat(c, &hb, 0, 1000, &reply, err, sizeof err) != RPC_OK)
        log_warn("control", "grpod did not hear that this worker ends: %s", err);
    protocol_free(reply);
}

/* grpod forgot us (restart with another state directory, or we were replaced): register again.
 * 0 when registered; otherwise the caller backs off (run_over is set when grpod said never). */
static int reregister(struct control *c)
{
    char run_id[64], err[512];
    pthread_mutex_lock(&c->mu);
    snprintf(run_id, sizeof run_id, "%s", c->run_id);
    uint64_t inc = c->incarnation;
    int64_t step = c->step;
    pthread_mutex_unlock(&c->mu);
    struct control_assignment *a = xcalloc(1, sizeof *a);
    uint64_t token = 0, seq = 0;
    int rc = register_once(c, run_id, inc, step, a, &token, &seq, err, sizeof err);
    pthread_mutex_lock(&c->mu);
    if (rc == 0) {
        adopt(c, a, token, seq);
        log_info("control", "registered again with grpod: run %s, rank %d as %s", a->run_id, c->rank,
                 control_role_name(a->role));
    } else if (rc < 0) {
        c->run_over = true;
        if (strstr(err, "is over (finished"))
            c->run_finished = true;
        snprintf(c->reason, sizeof c->reason, "%s", err);
        log_error("control", "grpod refused to take rank %d back: %s; ending", c->rank, err);
        pthread_cond_broadcast(&c->changed);
    } else if (!c->reregister_warned) {
        log_warn("control", "registering again with grpod: %s; retrying", err);
        c->reregister_warned = true;
    }
    if (rc == 0)
        c->reregister_warned = false;
    pthread_mutex_unlock(&c->mu);
    free(a);
    return rc == 0 ? 0 : -1;
}

static void kick_control(void)
{
    pthread_mutex_lock(&kick_mu);
    struct control *c = kick_target;
    if (c) {
        pthread_mutex_lock(&c->mu);
        changed_locked(c);
        pthread_mutex_unlock(&c->mu);
    }
    pthread_mutex_unlock(&kick_mu);
}

/* This worker took SIGTERM or SIGINT: ask grpod to stop the run, as grpoctl stop does, so that every rank
 * ends at its safe point and grpod records why: the signal, the rank and who sent it (a launcher ending the job
 * is no operator). Not under mu (the socket is this thread's). true once grpod has answered, whether or not it
 * took the request. */
static bool send_stop(struct control *c, int sig)
{
    char reason[400], err[512];
    snprintf(reason, sizeof reason, "%s on rank %d (host %.100s)%s", control_signal_name(sig), c->rank, c->host,
             control_stop_signal_from());
    Grpo__Envelope env = GRPO__ENVELOPE__INIT, *reply = NULL;
    Grpo__CommandRequest cr = GRPO__COMMAND_REQUEST__INIT;
    cr.command = GRPO__COMMAND__COMMAND_STOP;
    cr.reason = reason;
    cr.requester = reason;
    env.body_case = GRPO__ENVELOPE__BODY_COMMAND;
    env.command = &cr;
    enum rpc_result r = rpc_call(c->rpc, &env, 2000, &reply, err, sizeof err);
    if (r != RPC_OK) {
        log_debug("control", "asking grpod to stop the run: %s", err);
        return r == RPC_BAD_REPLY;
    }
    if (reply->body_case == GRPO__ENVELOPE__BODY_REPLY && !reply->reply->ok)
        log_info("control", "grpod did not take the stop request: %s", reply->reply->error);
    else
        log_info("control", "asked grpod to stop the run (%s)", reason);
    protocol_free(reply);
    return true;
}

/* ---- the flight recorder's part of a heartbeat ---- */

static void flight_proto(const struct flight_entry *e, double now, Grpo__FlightEntry *p)
{
    grpo__flight_entry__init(p);
    const enum flight_op op = (enum flight_op)e->op;
    p->id = e->id;
    p->kind = (char *)flight_kind_name(flight_op_kind(op));
    p->op = (char *)flight_op_name(op);
    p->group = (char *)flight_group_name(e->group); /* the recorder's group table: never freed */
    p->members = (char *)flight_group_members(e->group);
    p->group_size = flight_group_size(e->group);
    p->seq = e->seq;
    p->bytes = e->bytes;
    p->peer = e->peer;
    p->phase = (unsigned)e->phase < GRPO_NUM_PHASES ? (Grpo__Phase)e->phase : GRPO__PHASE__PHASE_IDLE;
    p->layer = e->layer;
    p->backward = (e->flags & FLIGHT_BACKWARD) != 0;
    p->began = flight_wall(e->began);
    p->seconds = (e->ended > 0 ? e->ended : now) - e->began;
    if (p->seconds < 0)
        p->seconds = 0;
    p->open = e->ended <= 0;
    p->failed = (e->flags & FLIGHT_FAILED) != 0;
}

/* What a heartbeat says of the recorder: the wait under way and the last few, and a trace or the main thread's
 * stack when grpod asked for one the worker has not answered (trace_want, stacks_want as read under mu). Read
 * without mu: the ring is the recorder's (lock-free), and a stack takes up to STACKS_WAIT_S. The pointers go
 * into f, which the caller frees with flight_parts_free once the heartbeat is sent. */
struct flight_parts {
    struct flight_entry raw[RECENT_WAITS], cur;
    Grpo__FlightEntry wait, recent[RECENT_WAITS], *recentp[RECENT_WAITS];
    Grpo__FlightEntry *trace, **tracep;
    char *stacks;
};

static void flight_parts_fill(struct flight_parts *f, Grpo__Heartbeat *hb, int rank, uint64_t trace_want,
                              uint64_t trace_done, uint64_t stacks_want, uint64_t stacks_done)
{
    const double now = clock_now_s();
    f->trace = NULL;
    f->tracep = NULL;
    f->stacks = NULL;
    if (flight_current(&f->cur)) {
        flight_proto(&f->cur, now, &f->wait);
        hb->current_wait = &f->wait;
    }
    bool backward;
    const int layer = flight_layer(&backward);
    hb->layer_plus_one = layer >= 0 ? layer + 1 : 0;
    hb->backward = backward;
    const int n = flight_snapshot(f->raw, RECENT_WAITS);
    for (int i = 0; i < n; i++) {
        flight_proto(&f->raw[i], now, &f->recent[i]);
        f->recentp[i] = &f->recent[i];
    }
    hb->n_recent_waits = (size_t)n;
    hb->recent_waits = f->recentp;
    if (trace_want > trace_done) { /* grpoctl trace: the whole ring (its newest TRACE_MAX), the open wait last */
        const int size = flight_size(), max = size < TRACE_MAX ? size : TRACE_MAX;
        struct flight_entry *all = xcalloc((size_t)max + 1, sizeof *all);
        int m = flight_snapshot(all, max);
        if (flight_current(&all[m]))
            m++;
        f->trace = xcalloc((size_t)m + 1, sizeof *f->trace);
        f->tracep = xcalloc((size_t)m + 1, sizeof *f->tracep);
        for (int i = 0; i < m; i++) {
            flight_proto(&all[i], now, &f->trace[i]);
            f->tracep[i] = &f->trace[i];
        }
        free(all);
        hb->n_trace = (size_t)m;
        hb->trace = f->tracep;
        hb->trace_seq_done = trace_want;
        flight_dump("grpoctl trace", false); /* the same ring in the run directory */
        log_info("control", "grpoctl trace: sent the %d waits of this rank's flight recorder to grpod", m);
    }
    if (stacks_want > stacks_done) { /* grpoctl stacks: the main thread's, written by its signal handler */
        f->stacks = xmalloc(STACKS_MAX);
        char *text = xmalloc(STACKS_MAX);
        if (flight_stack_capture(text, STACKS_MAX, STACKS_WAIT_S) == 0) {
            snprintf(f->stacks, STACKS_MAX, "%s", text);
            log_info("control", "grpoctl stacks: the stack of this rank's main thread:");
            char *save = NULL;
            for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
                log_info("control", "  %s", l);
            flight_save_text("stacks", f->stacks);
        } else {
            snprintf(f->stacks, STACKS_MAX,
                     "rank %d: its main thread did not write its stack within %.0f s (native stacks are off, or it "
                     "runs with the signal blocked)\n",
                     rank, STACKS_WAIT_S);
            log_warn("control", "grpoctl stacks: %s", f->stacks);
        }
        free(text);
        hb->stacks = f->stacks;
        hb->stacks_seq_done = stacks_want;
    }
}

static void flight_parts_free(struct flight_parts *f)
{
    free(f->trace);
    free(f->tracep);
    free(f->stacks);
}

static void *heartbeat_thread(void *arg)
{
    struct control *c = arg;
    double backoff = 0;      /* 0 while grpod answers; else the wait before the next try */
    uint32_t unanswered = 0; /* tries in a row with no answer: Heartbeat.unanswered */
    struct backoff bo;
    backoff_init(&bo, 0.25, 5.0);
    pthread_mutex_lock(&c->mu);
    while (!c->quit) {
        if (c->run_over) { /* grpod will not take this worker back: nothing more to say */
            pthread_cond_wait(&c->wake, &c->mu);
            continue;
        }
        if (!c->stop_sent && signal_stops(c)) {
            pthread_mutex_unlock(&c->mu);
            bool sent = send_stop(c, control_stop_signal());
            pthread_mutex_lock(&c->mu);
            c->stop_sent = sent;
        }
        Grpo__Heartbeat hb;
        Grpo__PhaseTime pt[GRPO_NUM_PHASES], *ptp[GRPO_NUM_PHASES];
        Grpo__Metric m[MAX_METRICS], *mp[MAX_METRICS];
        Grpo__PhaseSpan ps[MAX_SPANS], *psp[MAX_SPANS];
        build_heartbeat(c, &hb, pt, ptp, m, mp, ps, psp);
        uint64_t gen = c->generation;
        int timeout_ms = (int)(c->interval * 2000);
        if (timeout_ms < 1000)
            timeout_ms = 1000;
        /* the snapshot's strings live in c: copy what the message points at before unlocking */
        char error[512], names[MAX_METRICS][64], why[MAX_SURVIVED][96], left[sizeof c->left_copy];
        snprintf(error, sizeof error, "%s", c->error);
        hb.error = error;
        snprintf(left, sizeof left, "%s", c->left_copy);
        hb.left_copy = left;
        Grpo__SurvivedLoss sl[MAX_SURVIVED], *slp[MAX_SURVIVED];
        for (int i = 0; i < c->nsurvived; i++) {
            grpo__survived_loss__init(&sl[i]);
            sl[i].rank = c->survived[i].rank;
            snprintf(why[i], sizeof why[i], "%s", c->survived[i].reason);
            sl[i].reason = why[i];
            slp[i] = &sl[i];
        }
        hb.n_survived = (size_t)c->nsurvived;
        hb.survived = slp;
        hb.layout_dp_size = c->layout_dp_size;
        hb.layout_dp_rank = c->layout_dp_rank;
        for (size_t i = 0; i < hb.n_metrics; i++) {
            snprintf(names[i], sizeof names[i], "%s", m[i].name);
            m[i].name = names[i];
        }
        const uint64_t trace_want = c->trace_want, stacks_want = c->stacks_want;
        const uint64_t trace_done = c->trace_done, stacks_done = c->stacks_done;
        pthread_mutex_unlock(&c->mu);
        struct flight_parts fp;
        flight_parts_fill(&fp, &hb, c->rank, trace_want, trace_done, stacks_want, stacks_done);

        Grpo__Envelope *reply = NULL;
        char err[512];
        enum rpc_result r = send_heartbeat(c, &hb, unanswered, timeout_ms, &reply, err, sizeof err);
        bool need_reregister = false;
        unanswered = r == RPC_OK ? 0 : unanswered + 1;
        flight_parts_free(&fp);

        pthread_mutex_lock(&c->mu);
        if (r == RPC_OK && reply->body_case == GRPO__ENVELOPE__BODY_HEARTBEAT_ACK) {
            if (!c->connected)
                log_info("control", "in contact with grpod at %s", c->endpoint);
            c->connected = true;
            backoff = 0;
            backoff_reset(&bo);
            need_reregister = reply->heartbeat_ack->reregister;
            if (!need_reregister) {
                /* grpod has the trace and the stack this heartbeat carried */
                if (hb.trace_seq_done > c->trace_done)
                    c->trace_done = hb.trace_seq_done;
                if (hb.stacks_seq_done > c->stacks_done)
                    c->stacks_done = hb.stacks_seq_done;
                apply_ack(c, reply->heartbeat_ack);
                if (gen > c->acked_generation)
                    c->acked_generation = gen;
            }
        } else {
            if (r == RPC_OK)
                snprintf(err, sizeof err, "%s",
                         reply->body_case == GRPO__ENVELOPE__BODY_REPLY ? reply->reply->error : "unexpected answer");
            if (c->connected || backoff == 0)
                log_warn("control", "no heartbeat answer from grpod at %s: %s; retrying with backoff", c->endpoint,
                         err);
            c->connected = false;
            backoff = backoff_next(&bo);
        }
        protocol_free(reply);
        pthread_cond_broadcast(&c->changed);
        double wait = c->connected ? c->interval : backoff;
        if (c->connected && (c->trace_want > c->trace_done || c->stacks_want > c->stacks_done))
            wait = 0; /* grpoctl waits for a trace or a stack: answer at once */
        if (need_reregister) {
            pthread_mutex_unlock(&c->mu);
            int rc = reregister(c);
            pthread_mutex_lock(&c->mu);
            if (rc == 0)
                continue; /* heartbeat at once under the new registration */
            backoff = backoff_next(&bo);
            wait = backoff;
        }
        struct timespec until = deadline_in(wait);
        while (!c->quit && !c->kick)
            if (pthread_cond_timedwait(&c->wake, &c->mu, &until) == ETIMEDOUT)
                break;
        c->kick = false;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int control_open(const struct control_options *o, struct control **out, struct control_assignment *a, char *err,
                 size_t errlen)
{
    *out = NULL;
    memset(a, 0, sizeof *a);
    if (!o->endpoint || !o->endpoint[0])
        return 0;
    char secret[GRPO_SECRET_MAX + 1] = "";
    enum endpoint_kind kind;
    if (endpoint_parse(o->endpoint, &kind, NULL, 0, err, errlen) != 0)
        return -1;
    if (kind == ENDPOINT_TCP) {
        if (!o->secret_file || !o->secret_file[0]) {
            snprintf(err, errlen, "grpod endpoint %s is tcp://: " KEY_grpod_secret_file " must name the shared secret",
                     o->endpoint);
            return -1;
        }
        if (secret_read(o->secret_file, secret, sizeof secret, err, errlen) != 0)
            return -1;
    }
    struct control *c = xcalloc(1, sizeof *c);
    snprintf(c->endpoint, sizeof c->endpoint, "%s", o->endpoint);
    if (o->host && o->host[0])
        snprintf(c->host, sizeof c->host, "%s", o->host);
    else if (gethostname(c->host, sizeof c->host) != 0 || !c->host[0])
        snprintf(c->host, sizeof c->host, "localhost");
    c->host[sizeof c->host - 1] = 0;
    snprintf(c->caps, sizeof c->caps, "%s", o->capabilities ? o->capabilities : "rollout,trainer");
    snprintf(c->devices, sizeof c->devices, "%s", o->devices ? o->devices : "cpu");
    c->rank = o->rank;
    c->world_hosts = o->world_hosts;
    c->world = o->world_size;
    if (o->world_host_names && o->world_host_stride > 0 && o->world_size > 0) {
        c->world_host_names = xcalloc((size_t)o->world_size, sizeof *c->world_host_names);
        for (int r = 0; r < o->world_size; r++)
            c->world_host_names[r] = CHECK_ALLOC(strndup(o->world_host_names + (size_t)r * (size_t)o->world_host_stride,
                                                         (size_t)o->world_host_stride - 1));
    }
    c->digest = o->config_digest;
    c->run_config = o->config ? config_run_text(o->config, 0) : xstrdup("");
    c->delay_phase = o->delay_phase;
    c->delay_s = o->delay_s;
    c->end_wait_s = o->connect_timeout_s;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    c->host_memory_gb = pages > 0 && page > 0 ? (double)pages * (double)page / (1024.0 * 1024.0 * 1024.0) : 0;
    c->on_abort = o->on_abort;
    c->replaces = o->replaces;
    c->launch = o->launch;
    c->step = o->start_step;
    c->ckpt_step = -1;
    c->state = GRPO__WORKER_STATE__WORKER_STARTING;
    c->since = clock_now_s();
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines immune to wall-clock jumps */
    pthread_cond_init(&c->changed, &ca);
    pthread_cond_init(&c->wake, &ca);
    pthread_condattr_destroy(&ca);
    c->rpc = rpc_open(o->endpoint, secret, err, errlen);
    if (!c->rpc) {
        control_close(c);
        return -1;
    }
    const double start = clock_now_s();
    struct backoff b;
    backoff_init(&b, 0.1, 2.0);
    double backoff = backoff_next(&b);
    bool told = false;
    uint64_t token = 0, seq = 0;
    for (;;) {
        char why[512];
        int rc = register_once(c, "", 0, o->start_step, a, &token, &seq, why, sizeof why);
        if (rc == 0)
            break;
        if (rc > 0 && control_stop_signal()) {
            snprintf(err, errlen, "%s received while waiting for grpod at %s (%s): ending",
                     control_signal_name(control_stop_signal()), o->endpoint, why);
            control_close(c);
            return -1;
        }
        if (rc < 0) {
            snprintf(err, errlen, "grpod at %s refused rank %d: %s", o->endpoint, o->rank, why);
            control_close(c);
            return -1;
        }
        double waited = clock_now_s() - start;
        if (o->connect_timeout_s > 0 && waited + backoff > o->connect_timeout_s) {
            snprintf(err, errlen,
                     "cannot reach grpod at %s: %s (gave up after %.0f s, " KEY_grpod_connect_timeout_s ")",
                     o->endpoint, why, waited);
            control_close(c);
            return -1;
        }
        if (!told)
            log_warn("control", "waiting for grpod at %s: %s; retrying with backoff", o->endpoint, why);
        told = true;
        clock_sleep_s(backoff);
        backoff = backoff_next(&b);
    }
    adopt(c, a, token, seq);
    c->connected = true;
    log_info("control", "registered with grpod at %s: run %s, rank %d of %d as %s (dp %d/%d tp %d/%d pp %d/%d)",
             o->endpoint, a->run_id, o->rank, o->world_size, control_role_name(a->role), a->dp_rank, a->dp_size,
             a->tp_rank, a->tp_size, a->pp_rank, a->pp_size);
    if (pthread_create(&c->thread, NULL, heartbeat_thread, c) != 0) {
        snprintf(err, errlen, "cannot start the heartbeat thread");
        control_close(c);
        return -1;
    }
    c->thread_started = true;
    pthread_mutex_lock(&kick_mu);
    kick_target = c;
    pthread_mutex_unlock(&kick_mu);
    *out = c;
    return 0;
}

void control_close(struct control *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&kick_mu);
    if (kick_target == c)
        kick_target = NULL;
    pthread_mutex_unlock(&kick_mu);
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->quit = true;
        pthread_cond_signal(&c->wake);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    rpc_close(c->rpc);
    pthread_cond_destroy(&c->wake);
    pthread_cond_destroy(&c->changed);
    pthread_mutex_destroy(&c->mu);
    free(c->run_config);
    for (int r = 0; c->world_host_names && r < c->world; r++)
        free(c->world_host_names[r]);
    free(c->world_host_names);
    free(c);
}
