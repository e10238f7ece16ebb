#include "launch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/config.h"
#include "common/log.h"
#include "common/netaddr.h"
#include "common/placement.h"
#include "kernels/kernels.h"
#include "proto/plane_auth.h"
#include "proto/transport.h"
#include "worker/watchdog/watchdog.h"
#include "worker/control/control.h"

/* The run's rules for several ranks (a split or a colocated placement) that are not about rank counts. 0, or -1
 * with why. */
static int split_supported(const struct grpo_config *c, const struct placement_spec *ps, char *why, size_t whylen)
{
    if (config_gen_batch_size(c) != c->data_train_batch_size && ps->rollout_ranks > 0)
        return error_set(why, whylen,
                         KEY_data_gen_batch_size
                         "=%lld (other than " KEY_data_train_batch_size "=%lld) runs in one process and on "
                         "colocated ranks (" KEY_placement_rollout_ranks "=0); with %d separate rollout ranks "
                         "(" KEY_placement_rollout_ranks
                         ") the dispatcher draws one round of " KEY_data_train_batch_size " prompts a "
                         "step (not available yet)",
                         (long long)c->data_gen_batch_size, (long long)c->data_train_batch_size, ps->rollout_ranks);
    if (c->alg_filter_groups_enable && ps->rollout_ranks > 0)
        return error_set(why, whylen,
                         KEY_alg_filter_groups_enable " (dynamic sampling) runs in one process and on colocated "
                                                      "ranks for now; it is not available with separate rollout ranks");
    if (c->trainer_sft_warmup_steps > 0)
        return error_set(why, whylen,
                         KEY_trainer_sft_warmup_steps
                         " %lld: the supervised warm-start runs in one process; warm-start "
                         "first, then point " KEY_arr_model_path " at its checkpoint",
                         (long long)c->trainer_sft_warmup_steps);
    if (ps->trainer_ranks / (ps->tp_size * ps->pp_size) > ROLE_MAX_ENDPOINTS)
        return error_set(why, whylen, "%d trainer DP ranks: at most %d", ps->trainer_ranks, ROLE_MAX_ENDPOINTS);
    return 0;
}

/* This rank's advertised address (grpod.advertise_host, else the host part of grpod.data_endpoint) into
 * env->advertise, and how many hosts the world spans into env->world_hosts (its ranks' host names compared).
 * Collective over the world. 0, or -1 (logged): an interface without an address. */
static int advertise(struct role_env *env)
{
    const struct grpo_config *c = env->cfg;
    char named[256] = "", err[512];
    if (c->grpod_advertise_host && c->grpod_advertise_host[0])
        snprintf(named, sizeof named, "%s", c->grpod_advertise_host);
    else if (c->grpod_data_endpoint)
        placement_endpoint_host(c->grpod_data_endpoint, named, sizeof named);
    int rc = net_advertise_address(named, env->advertise, sizeof env->advertise, err, sizeof err);
    if (rc != 0)
        log_error("worker", "%s", err);
    int world = comm_size(env->world);
    char host[64] = "", *hosts = xcalloc((size_t)world, sizeof host);
    gethostname(host, sizeof host - 1);
    comm_allgather_bytes(env->world, host, hosts, sizeof host);
    env->world_hosts = placement_count_hosts(hosts, world, sizeof host);
    _Static_assert(sizeof host == ROLE_HOST_NAME, "the host names' stride");
    free(env->world_host_names);
    env->world_host_names = hosts; /* Register.world_host_names */
    /* the launch's name (Register.launch): world rank 0's, the same on every rank */
    uint64_t launch_id = comm_rank(env->world) == 0 ? plane_random64() : 0;
    comm_broadcast(env->world, &launch_id, 1, COMM_I64, 0);
    env->launch_id = launch_id;
    return rc;
}

/* Data endpoints of the trainer DP ranks when no grpod hands them out: grpod.data_endpoint, or (placement_data_base)
 * a fresh ipc://~run/grpo-PID-TIME prefix (in the user's private runtime directory) chosen by rank 0 when every
 * rank is on one host, tcp:// with a port from
 * it when not; tcp:// ports count up from the base, dialled at each trainer's advertised address (its host name
 * when none is named). Collective over the world. */
static void local_endpoints(struct role_env *env)
{
    const struct grpo_config *c = env->cfg;
    char base[200] = "";
    _Static_assert(sizeof base % sizeof(int32_t) == 0, "the prefix travels as whole int32 elements");
    if (comm_rank(env->world) == 0) {
        char tag[64];
        snprintf(tag, sizeof tag, "%d-%ld", (int)getpid(), (long)time(NULL));
        placement_data_base(c->grpod_data_endpoint, env->world_hosts, tag, base, sizeof base);
    }
    comm_broadcast(env->world, base, sizeof base / sizeof(int32_t), COMM_I32, 0);
    int world = comm_size(env->world);
    char host[256] = "", *hosts = xcalloc((size_t)world, sizeof host);
    if (env->advertise[0])
        snprintf(host, sizeof host, "%s", env->advertise);
    else
        gethostname(host, sizeof host - 1);
    comm_allgather_bytes(env->world, host, hosts, sizeof host);
    /* one endpoint per trainer DP rank, bound by its TP and SP rank 0 (PP stage 0): trainer rank d x TP x SP */
    const int tp = env->spec.tp_size, cp = env->spec.cp_size > 1 ? env->spec.cp_size : 1;
    env->n_endpoints = env->spec.trainer_ranks / (tp * env->spec.pp_size * cp);
    for (int d = 0; d < env->n_endpoints; d++) /* the trainer binds; the rollouts connect to it */
        placement_data_endpoint(base, d,
                                env->at.role == PLACE_TRAINER && env->at.dp == d && env->at.tp == 0 && env->at.cp == 0
                                    ? NULL
                                    : hosts + (size_t)d * tp * cp * sizeof host,
                                env->endpoints[d], sizeof env->endpoints[d]);
    /* the dispatcher is trainer DP rank 0's, world rank 0 */
    placement_dispatch_endpoint(base, env->n_endpoints, env->rank == 0 ? NULL : hosts, env->dispatch_endpoint,
                                sizeof env->dispatch_endpoint);
    free(hosts);
}

/* A trainer binds its endpoints at its advertised address (every interface, "*", otherwise); a rollout rank checks that
 * the trainers' host names resolve here, so that a name peers cannot resolve is an error at start, not a wait.
 * 0, or -1 with err. */
static int settle_endpoints(struct role_env *env, char *err, size_t errlen)
{
    char ep[256], host[256];
    /* ipc endpoints live in this user's private runtime directory (placement_resolve_endpoint) */
    for (int d = 0; d < env->n_endpoints && d < ROLE_MAX_ENDPOINTS; d++)
        if (placement_resolve_endpoint(env->endpoints[d], sizeof env->endpoints[d], err, errlen) != 0)
            return -1;
    if (placement_resolve_endpoint(env->dispatch_endpoint, sizeof env->dispatch_endpoint, err, errlen) != 0)
        return -1;
    if (env->at.role == PLACE_TRAINER) {
        /* the name this trainer is dialled at must resolve here too (the ranks of the other hosts check it as
         * well): a trainer that fails at start makes grpod end the whole job, on every host */
        if (env->advertise[0] && env->at.dp < env->n_endpoints &&
            strncmp(env->endpoints[env->at.dp], "tcp://", 6) == 0 &&
            net_check_resolves(env->advertise, "grpod.advertise_host", err, errlen) != 0)
            return -1;
        if (env->at.dp < env->n_endpoints) {
            placement_bind_endpoint(env->endpoints[env->at.dp], env->advertise, ep, sizeof ep);
            snprintf(env->endpoints[env->at.dp], sizeof env->endpoints[0], "%s", ep);
        }
        if (env->rank == 0 || env->at.dp == 0) {
            placement_bind_endpoint(env->dispatch_endpoint, env->advertise, ep, sizeof ep);
            snprintf(env->dispatch_endpoint, sizeof env->dispatch_endpoint, "%s", ep);
        }
        return 0;
    }
    if (env->at.role != PLACE_ROLLOUT)
        return 0;
    for (int d = -1; d < env->n_endpoints && d < ROLE_MAX_ENDPOINTS; d++) {
        placement_endpoint_host(d < 0 ? env->dispatch_endpoint : env->endpoints[d], host, sizeof host);
        if (host[0] && net_check_resolves(host, "grpod.advertise_host on the trainers' hosts", err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* grpod says a trainer this rank's job depends on is lost: the trainers would wait for it in a collective for
 * ever (mpirun keeps the job when it may lose ranks), so the job ends here, and its relaunch resumes. */
static void abort_job(const char *reason)
{
    log_error("worker", "ending the job: %s", reason);
    comm_end_job(4);
}

/* Register with grpod (when grpod.endpoint is set) and check that its assignment is the placement this rank
 * computed from the same configuration; take the data endpoints it hands out. 0, or -1 (logged). */
static int join_control_plane(struct role_env *env)
{
    char err[2048];
    struct control_options o;
    struct control_assignment a;
    /* spares (trainer.survive_spare_ranks) register too: grpod's world counts them, and gives them ROLE_SPARE */
    control_options_from_config(&o, env->cfg, env->rank, env->world_size + env->spare_ranks);
    o.on_abort = abort_job;
    o.replaces = env->replacing;
    o.world_hosts = env->world_hosts;
    o.world_host_names = env->world_host_names;
    o.world_host_stride = ROLE_HOST_NAME;
    o.launch = env->launch_id;
    if (env->advertise[0]) /* grpod builds the data endpoints the other ranks dial from the registered host */
        o.host = env->advertise;
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
    if ((a.role == CONTROL_ROLE_SPARE) != env->spare) {
        snprintf(err, sizeof err,
                 "grpod assigned role %s, but this rank's configuration makes it %s (" KEY_trainer_survive_spare_ranks
                 "=%d of %d ranks): give grpod and the workers the same keys",
                 control_role_name(a.role), env->spare ? "a spare" : "no spare", env->spare_ranks,
                 env->world_size + env->spare_ranks);
        log_error("worker", "%s", err);
        control_finish(env->ctl, CONTROL_END_FAILED, err);
        return -1;
    }
    if (!env->spare && (assigned != env->at.role || a.dp_rank != env->at.dp || a.dp_size != env->at.dp_size)) {
        snprintf(err, sizeof err,
                 "grpod assigned role %s dp %d/%d, but this rank's configuration places it as %s dp %d/%d: give "
                 "grpod and the workers the same placement keys",
                 control_role_name(a.role), a.dp_rank, a.dp_size, placement_role_name(env->at.role), env->at.dp,
                 env->at.dp_size);
        log_error("worker", "%s", err);
        control_finish(env->ctl, CONTROL_END_FAILED, err);
        return -1; /* env->ctl is left open: the process ends at once, and grpod has heard why */
    }
    log_info("worker", "registered with grpod at %s: role %s, dp %d/%d, run %s", o.endpoint, control_role_name(a.role),
             a.dp_rank, a.dp_size, a.run_id);
    if (a.heartbeat_interval_s > 0)
        env->heartbeat_s = a.heartbeat_interval_s;
    if (a.dispatch_endpoint[0])
        snprintf(env->dispatch_endpoint, sizeof env->dispatch_endpoint, "%s", a.dispatch_endpoint);
    env->plane_epoch = a.plane_epoch;
    if (a.has_plane_key) { /* this process's data-plane identity: its rank, its pid (Register.pid), this registration,
                              and the launch's key epoch */
        const struct plane_id id = {
            .rank = env->rank, .pid = (uint32_t)getpid(), .incarnation = a.incarnation, .epoch = a.plane_epoch};
        env->plane = (struct plane_cred){.id = id, .set = true};
        memcpy(env->plane.key, a.plane_key, sizeof env->plane.key);
        env->plane_dp = env->plane;
    }
    if (a.role == CONTROL_ROLE_TRAINER && a.has_plane_run_key) {
        memcpy(env->plane_run_key, a.plane_run_key, sizeof env->plane_run_key);
        env->have_run_key = true;
    }
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

/* For the tests only: GRPO_TEST_SPARE_CREDENTIALS=FILE makes the issuer write good credentials of one more process
 * of the last rollout rank (pid 1, a fresh incarnation of generation 0, the real processes' own) into FILE (mode
 * 0600), so that a hostile client in the tests can hold one process's key without disturbing the real processes'
 * counters, and without the right to take a live process's place (tests/system/data_stranger.c). */
static void write_spare_credentials(const uint8_t run_key[PLANE_KEY_BYTES], uint64_t epoch, int rank)
{
    const char *path = getenv("GRPO_TEST_SPARE_CREDENTIALS");
    if (!path || !path[0])
        return;
    struct plane_cred c;
    /* generation 0, as the launch's own processes: it cannot take a live process's place at the dispatcher */
    const struct plane_id id = {.rank = rank, .pid = 1, .incarnation = plane_incarnation_new(0), .epoch = epoch};
    plane_cred_issue(&c, run_key, &id);
    char line[256];
    FILE *f = fopen(path, "w");
    if (f && plane_cred_format(&c, line, sizeof line) == 0) {
        fchmod(fileno(f), 0600);
        fputs(line, f);
    }
    if (f)
        fclose(f);
    log_warn("worker", "GRPO_TEST_SPARE_CREDENTIALS: spare data-plane credentials of rank %d written to %s", rank,
             path);
}

/* A split run's data-plane credentials (proto/plane_auth.h). Under grpod they came with the assignment, and a rank
 * without them is refused naming the key. Without grpod, world rank 0 makes the run key and hands each rank its
 * part over MPI (point to point, so no rank sees another's): the key to the trainer ranks, each rollout rank its
 * own key for its identity (its rank, its pid and a random incarnation, gathered from every rank first).
 * Collective over the world without grpod. 0, or -1 (logged). */
static int plane_credentials(struct role_env *env)
{
    const bool trainer = env->at.role == PLACE_TRAINER;
    if (plane_init() != 0) {
        log_error("worker", "libsodium cannot start: the data plane's authentication needs it");
        return -1;
    }
    if (env->ctl) {
        if (!env->plane_epoch) {
            log_error("worker",
                      "grpod handed this rank no data-plane key epoch (Assignment.plane_epoch, protocol 1.12): keys "
                      "that outlive their launch are not taken; upgrade grpod to this version");
            return -1;
        }
        if (trainer ? !env->have_run_key : !env->plane.set) {
            log_error("worker",
                      "grpod handed this %s rank no data-plane key (Assignment.%s, protocol 1.8): the data plane "
                      "never runs unauthenticated; upgrade grpod to this version",
                      trainer ? "trainer" : "rollout", trainer ? "plane_run_key" : "plane_key");
            return -1;
        }
        return 0;
    }
    struct comm *world = env->world;
    const int size = comm_size(world), me = comm_rank(world);
    struct {
        uint32_t pid, pad;
        uint64_t incarnation;
    } mine = {.pid = (uint32_t)getpid(), .incarnation = plane_incarnation_new(0)},
      *all = xcalloc((size_t)size, sizeof mine);
    _Static_assert(sizeof mine == 16 && PLANE_KEY_BYTES % sizeof(int32_t) == 0, "whole int32 elements");
    comm_allgather_bytes(world, &mine, all, sizeof mine);
    /* this launch's key epoch: world rank 0's, random (keys and messages of another launch are refused) */
    uint64_t epoch = me == 0 ? plane_epoch_new() : 0;
    comm_broadcast(world, &epoch, 1, COMM_I64, 0);
    env->plane_epoch = epoch;
    uint8_t key[PLANE_KEY_BYTES];
    if (me == 0) {
        plane_run_key_new(env->plane_run_key);
        env->have_run_key = true;
        for (int r = 1; r < size; r++) {
            if (r < env->spec.trainer_ranks) {
                comm_send(world, env->plane_run_key, PLANE_KEY_BYTES / 4, COMM_I32, r);
                continue;
            }
            const struct plane_id id = {
                .rank = r, .pid = all[r].pid, .incarnation = all[r].incarnation, .epoch = epoch};
            plane_key_derive(env->plane_run_key, &id, key);
            comm_send(world, key, PLANE_KEY_BYTES / 4, COMM_I32, r);
        }
        write_spare_credentials(env->plane_run_key, epoch, size - 1);
    } else {
        comm_recv(world, key, PLANE_KEY_BYTES / 4, COMM_I32, 0);
        if (trainer) {
            memcpy(env->plane_run_key, key, sizeof key);
            env->have_run_key = true;
        } else {
            env->plane = (struct plane_cred){
                .id = {.rank = env->rank, .pid = mine.pid, .incarnation = mine.incarnation, .epoch = epoch},
                .set = true};
            memcpy(env->plane.key, key, sizeof key);
            env->plane_dp = env->plane;
        }
    }
    memset(key, 0, sizeof key);
    free(all);
    return 0;
}

/* trainer.device=cuda in a split run: each rank's GPU on its node. A node's trainer ranks take its GPUs first
 * (its trainer i: GPU i), its rollout ranks the next ones, round-robin when the node has more ranks than GPUs.
 * Ranks that share a GPU work, more slowly; but NCCL needs a GPU per rank, so trainers that share one sum their
 * gradients over MPI, staged through host memory (env->trainer_gpus_shared, the same on every rank). Collective
 * over the world. */
static void assign_devices(struct role_env *env)
{
    const int ndev = kctx_cuda_devices();
    struct comm *node = comm_split_node(env->world, env->rank);
    const int n = comm_size(node), me = comm_rank(node);
    int32_t trainer = env->at.role != PLACE_ROLLOUT; /* a trainer, or a colocated rank */
    int32_t *is = xcalloc((size_t)n, sizeof *is);
    comm_allgather(node, &trainer, is, 1, COMM_I32);
    int trainers = 0, before = 0; /* the node's trainers; the ranks of this one's role before it on the node */
    for (int i = 0; i < n; i++) {
        trainers += is[i];
        before += i < me && is[i] == trainer;
    }
    free(is);
    comm_free(node);
    const int slot = trainer ? before : trainers + before;
    env->device = ndev > 0 ? slot % ndev : 0;
    int32_t crowded[2] = {trainers > (ndev > 0 ? ndev : 1), n > (ndev > 0 ? ndev : 1)};
    comm_allreduce_max(env->world, crowded, 2, COMM_I32);
    env->trainer_gpus_shared = crowded[0] != 0;
    env->rollout_gpus_shared = crowded[1] != 0;
    log_info("worker", "rank %d: cuda:%d of the %d GPU(s) of its node, which runs %d trainer and %d rollout rank(s)",
             env->rank, env->device, ndev, trainers, n - trainers);
}

/* This rank's place in the run: its rank and the run's size (the world's, or --replace-rank's), the placement and
 * its role and coordinates, checked against the run's rules. 0, or the exit status (2) with the reason logged. */
static int place(struct launch *l, int replace_rank)
{
    struct role_env *env = &l->env;
    const struct grpo_config *cfg = env->cfg;
    char why[1024];
    int rank = comm_rank(env->world), size = comm_size(env->world);
    if (replace_rank >= 0) {
        if (placement_spec_from_config(cfg, &env->spec, why, sizeof why) != 0) {
            log_error("worker", "%s", why);
            return 2;
        }
        if (size > 1 || !cfg->grpod_endpoint || !cfg->grpod_endpoint[0]) {
            log_error("worker", "--replace-rank takes the place of a lost rollout rank in a run under grpod: start "
                                "one process (not under mpirun's -np) with " KEY_grpod_endpoint " set");
            return 2;
        }
        rank = replace_rank;
        size = env->spec.trainer_ranks + env->spec.rollout_ranks;
        env->replacing = true;
    }
    /* trainer.survive_spare_ranks: the last ranks wait as spares; the layout is the others' (survive_check says
     * where spares are covered) */
    if (cfg->trainer_survive_spare_ranks > 0 && !cfg->trainer_survive_trainer_loss) {
        if (rank == 0)
            log_error("worker", KEY_trainer_survive_spare_ranks " needs " KEY_trainer_survive_trainer_loss "=true");
        l->refused_alike = true;
        return 2;
    }
    const int spares =
        replace_rank < 0 && cfg->trainer_survive_trainer_loss ? (int)cfg->trainer_survive_spare_ranks : 0;
    if (spares > 0 && size - spares < 2) {
        if (rank == 0)
            log_error("worker",
                      KEY_trainer_survive_spare_ranks "=%d of %d ranks leaves %d to train: at least 2 must (a "
                                                      "spare takes a lost one's place)",
                      spares, size, size - spares);
        l->refused_alike = true;
        return 2;
    }
    env->spare_ranks = spares;
    env->spare = spares > 0 && rank >= size - spares;
    size -= spares;
    env->rank = rank;
    env->world_size = size;
    env->heartbeat_s = cfg->grpod_heartbeat_interval_s;
    if (placement_spec_from_config(cfg, &env->spec, why, sizeof why) != 0 ||
        placement_check(&env->spec, size, (int)cfg->data_train_batch_size, why, sizeof why) != 0 ||
        placement_of(&env->spec, env->spare ? 0 : rank, size, &env->at, why, sizeof why) != 0) {
        if (replace_rank >= 0) /* alone: nobody else says it */
            log_error("worker", "--replace-rank %d: %s", replace_rank, why);
        else if (rank == 0)
            log_error("worker", "%s", why);
        l->refused_alike = true;
        return 2;
    }
    if (env->spare) { /* a spare trains nothing until it joins: a DP group of its own (survive.c moves it) */
        env->at.dp = 0;
        env->at.dp_size = 1;
        env->at.engine = env->at.engine_tp = 0;
        env->at.engines = 1;
        /* whole layers: with TP or PP it learns its shard when it takes a lost rank's place */
        env->at.tp = env->at.pp = 0;
        env->at.tp_size = env->at.pp_size = 1;
    }
    l->split = env->at.role != PLACE_HYBRID;
    l->colocated = !l->split && size > 1;
    if ((l->split || l->colocated) && split_supported(cfg, &env->spec, why, sizeof why) != 0) {
        if (rank == 0 || replace_rank >= 0)
            log_error("worker", "%s", why);
        l->refused_alike = true;
        return 2;
    }
    if (replace_rank >= 0 && env->at.role == PLACE_ROLLOUT && env->at.tp_size > 1) {
        log_error("worker",
                  "--replace-rank %d: rollout ranks form TP groups of %d "
                  "(" KEY_rollout_tensor_model_parallel_size "); a lost group's units go to the other "
                  "groups, and one rank cannot rejoin a group: relaunch the job (it resumes from the newest "
                  "checkpoint) to bring the group back",
                  replace_rank, env->at.tp_size);
        return 2;
    }
    if (replace_rank >= 0 && env->at.role != PLACE_ROLLOUT) {
        log_error("worker",
                  "--replace-rank %d: that rank is a %s; only a rollout rank can be replaced while the run goes on "
                  "(a lost trainer ends the job, and its relaunch resumes from the newest checkpoint)",
                  replace_rank, placement_role_name(env->at.role));
        return 2;
    }
    if ((l->split || l->colocated) && rank == 0 && size > 1) {
        const bool outlives = comm_job_outlives_ranks();
        /* mpirun (and its daemons) give their ranks OMPI_MCA_orte_hnp_uri; srun's direct launch (--mpi=pmix)
         * does not, and mpirun's option means nothing there */
        const bool under_mpirun = getenv("OMPI_MCA_orte_hnp_uri") != NULL;
        if (!outlives && l->split && under_mpirun)
            log_warn("worker", "mpirun ends the whole job when any rank dies: launch with --mca orte_enable_recovery 1 "
                               "(and grpod) so that a lost rollout rank costs nothing");
        else if (outlives && (!cfg->grpod_endpoint || !cfg->grpod_endpoint[0])) {
            log_error("worker",
                      "mpirun keeps the job when a rank dies (orte_enable_recovery), but without grpod nobody "
                      "would tell the trainers that one of them is lost: they would wait for it for ever. "
                      "Run under grpod (" KEY_grpod_endpoint ") or launch without the option");
            return 2;
        }
    }
    env->staleness = strcmp(cfg->rollout_mode, "async") == 0 ? 1 : 0;
    if (cfg->async_enable && !l->split) {
        log_error("worker",
                  "async_training.* (fully-async training) needs separate rollout ranks (" KEY_placement_rollout_ranks
                  ", or " KEY_split_rollout_nnodes " x " KEY_split_rollout_n_gpus_per_node
                  "): rollout ranks stream while the trainer trains");
        return 2;
    }
    return 0;
}

/* The training groups of l->sides (every trainer, or every colocated rank): DP, TP, PP, CP (and DP x CP) and EP
 * (and its expert-data-parallel twin) from the run's sizes, and the model-copy group (the TP x PP ranks of one
 * DP x CP position). what names the ranks in the error. Collective over l->sides. */
static void train_groups(struct launch *l, const char *what)
{
    struct role_env *env = &l->env;
    struct parallel_groups *g = &l->trainer_groups;
    env->trainers = l->sides;
    /* a spare alone, whole layers (survive.c gives it a place) */
    const struct parallel_sizes sz = env->spare ? (struct parallel_sizes){1, 1, 1, 1}
                                                : (struct parallel_sizes){env->spec.tp_size, env->spec.pp_size,
                                                                          env->spec.cp_size, env->spec.ep_size};
    if (parallel_groups_init_sized(g, l->sides, &sz) != 0)
        check_failf(__FILE__, __LINE__, "%s groups: %d ranks do not fit TP %d x PP %d x CP %d x EP %d", what,
                    comm_size(l->sides), env->spec.tp_size, env->spec.pp_size, env->spec.cp_size, env->spec.ep_size);
    env->dp = g->dp;
    env->tp = g->tp;
    env->pp = g->pp;
    env->cp = g->cp;
    env->grads = g->dpcp;
    env->ep = g->ep;
    env->edp = g->edp;
    env->etp = g->etp;
    env->mp =
        comm_split(l->sides, env->at.dp * env->at.cp_size + env->at.cp, env->at.pp * env->at.tp_size + env->at.tp);
    comm_set_name(env->mp, "mp");
    /* sequence or context parallelism with a split model: the batches of a DP rank go to its CP ranks' copies too
     * (every rank takes the same branch: the sizes are the launch's) */
    env->replica = NULL;
    if (env->at.cp_size > 1 && env->at.tp_size * env->at.pp_size > 1)
        env->replica = comm_split(l->sides, env->at.dp,
                                  (env->at.pp * env->at.cp_size + env->at.cp) * env->at.tp_size + env->at.tp);
    if (env->replica)
        comm_set_name(env->replica, "replica");
    /* EP with PP: a model copy is the stages' EP groups, ranked (stage x EP + EP rank) x TP + TP rank */
    const int E = env->at.ep_size;
    env->emp = E > 1 && env->at.pp_size > 1 ? comm_split(l->sides, env->at.dp / E * env->at.cp_size + env->at.cp,
                                                         (env->at.pp * E + env->at.ep) * env->at.tp_size + env->at.tp)
                                            : NULL;
    if (env->emp)
        comm_set_name(env->emp, "emp");
}

/* A split run's groups: the trainers and their DP, TP, PP and model-copy groups, a rollout TP group, and the
 * weight broadcast's group. Collective over the world. */
static void build_groups(struct launch *l, int replace_rank)
{
    struct role_env *env = &l->env;
    struct comm *world = env->world;
    /* the trainers and their DP and TP groups; the rollout ranks have no MPI traffic after this */
    l->sides = comm_split(world, env->at.role == PLACE_TRAINER ? 0 : 1, comm_rank(world));
    comm_set_name(l->sides, env->at.role == PLACE_TRAINER ? "trainers" : "rollouts");
    /* every group of the trainers (DP, TP, PP) and of the rollout ranks (rollout TP) is split from here: each
     * of their waits is bounded, the same on every rank (actor_rollout_ref.nccl_timeout) */
    comm_set_deadline(l->sides, (double)env->cfg->arr_nccl_timeout);
    if (env->at.role == PLACE_TRAINER) {
        train_groups(l, "trainer");
    } else if (env->at.tp_size > 1) { /* a rollout TP group: neighbouring rollout ranks */
        env->rollout_tp = comm_split(l->sides, env->at.engine, env->at.tp);
        comm_set_name(env->rollout_tp, "rollout-tp");
        comm_fail_alone(env->rollout_tp); /* a lost peer ends the group, not the run */
    }
    /* weight_sync=broadcast: trainer rank 0 (the dispatcher's) and each rollout TP group's first rank; the
     * group's waits are bounded like the others, and a lost member gives the group up, not the run */
    if (strcmp(env->cfg->rollout_weight_sync, "broadcast") == 0 && replace_rank < 0) {
        const bool member =
            env->at.role == PLACE_TRAINER ? env->at.dp == 0 && env->at.tp == 0 && env->at.pp == 0 : env->at.tp == 0;
        struct comm *g = comm_split(world, member ? 0 : 1, env->at.role == PLACE_TRAINER ? -1 : env->rank);
        comm_set_name(g, "weights");
        comm_set_deadline(g, (double)env->cfg->arr_nccl_timeout);
        if (member)
            env->weight_group = g;
        else
            comm_free(g);
    }
}

/* Colocated ranks' groups: every rank as a trainer (DP, TP, PP and model-copy groups, bounded by
 * actor_rollout_ref.nccl_timeout), and the generation engines of the rollout TP. Collective over the world. */
static void build_colocated_groups(struct launch *l)
{
    struct role_env *env = &l->env;
    /* trainer.survive_spare_ranks: each spare a group of its own, the others the trainers */
    l->sides = comm_split(env->world, env->spare ? 1 + comm_rank(env->world) - env->world_size : 0, env->rank);
    comm_set_name(l->sides, "trainers");
    comm_set_deadline(l->sides, (double)env->cfg->arr_nccl_timeout);
    train_groups(l, "colocated");
    if (env->spec.rollout_tp > 1) { /* an engine: neighbouring ranks */
        env->rollout_tp = comm_split(l->sides, env->at.engine, env->at.engine_tp);
        comm_set_name(env->rollout_tp, "rollout-tp");
    }
}

/* The world's DP x TP x PP groups (--tp, --pp). 0, or 2 with the reason logged. */
static int world_groups(struct launch *l, const struct grpo_config *cfg, struct comm *world,
                        const struct launch_options *o)
{
    if (parallel_groups_init(&l->world_groups, world, o->tp, o->pp) != 0) {
        if (comm_rank(world) == 0)
            log_error("worker",
                      "%d ranks cannot be split into tp=%d x pp=%d groups (the world size must be a "
                      "multiple of tp*pp)",
                      comm_size(world), o->tp, o->pp);
        return 2;
    }
    l->have_world_groups = true;
    const struct parallel_coords *at = &l->world_groups.at;
    log_debug("worker", "dp %d/%d tp %d/%d pp %d/%d, config digest %016llx", at->dp_rank, at->dp_size, at->tp_rank,
              at->tp_size, at->pp_rank, at->pp_size, (unsigned long long)config_digest(cfg));
    return 0;
}

int launch(struct launch *l, const struct grpo_config *cfg, struct comm *world, const struct launch_options *o)
{
    memset(l, 0, sizeof *l);
    l->selftest = o->selftest;
    l->env.cfg = cfg;
    l->env.world = world;
    int status = world_groups(l, cfg, world, o);
    if (status != 0 || o->selftest)
        return status;
    l->peers_wait = true;
    if ((status = place(l, o->replace_rank)) != 0)
        return status;
    struct role_env *env = &l->env;
    if (o->replace_rank < 0 && advertise(env) != 0)
        return 3;
    if (o->replace_rank >= 0) { /* alone: its own address only, and a launch of its own (grpod keeps the run's key
                                   epoch for a replacement) */
        env->launch_id = plane_random64();
        char err[512];
        const char *named = cfg->grpod_advertise_host;
        if (net_advertise_address(named, env->advertise, sizeof env->advertise, err, sizeof err) != 0) {
            log_error("worker", "%s", err);
            return 3;
        }
    }
    if (l->split && o->replace_rank < 0)
        local_endpoints(env);
    if ((l->split || l->colocated) && strcmp(config_device(cfg), "cuda") == 0) {
        if (o->replace_rank < 0)
            assign_devices(env);
        else /* alone, in place of a lost rollout rank: the node's GPUs in turn by rank */
            env->device = kctx_cuda_devices() > 0 ? o->replace_rank % kctx_cuda_devices() : 0;
    }
    watchdog_test_point(WATCHDOG_AT_REGISTER, 0); /* test.block_at=register only */
    const int joined = join_control_plane(env);
    free(env->world_host_names);
    env->world_host_names = NULL;
    if (joined != 0)
        return 3;
    if (l->split && plane_credentials(env) != 0) {
        control_finish(env->ctl, CONTROL_END_FAILED, "no data-plane key");
        return 3;
    }
    char err[1024];
    if (l->split && settle_endpoints(env, err, sizeof err) != 0) {
        log_error("worker", "%s", err);
        if (env->ctl)
            control_finish(env->ctl, CONTROL_END_FAILED, err);
        return 3;
    }
    l->launched = true;
    if (l->colocated) {
        build_colocated_groups(l);
        if (env->rank == 0)
            log_info("worker", "%d colocated ranks (hybrid: each generates and trains), DP %d x TP %d x PP %d%s",
                     env->world_size, env->at.dp_size, env->at.tp_size, env->at.pp_size,
                     env->at.cp_size > 1 ? " (each DP rank's sequences shared by its SP ranks)" : "");
        return 0;
    }
    if (!l->split)
        return 0;
    build_groups(l, o->replace_rank);
    char tp_note[48] = "";
    if (env->at.role == PLACE_TRAINER && env->at.tp_size > 1)
        snprintf(tp_note, sizeof tp_note, ", tp %d of %d", env->at.tp, env->at.tp_size);
    if (env->at.role == PLACE_TRAINER && env->at.pp_size > 1)
        snprintf(tp_note + strlen(tp_note), sizeof tp_note - strlen(tp_note), ", pp %d of %d", env->at.pp,
                 env->at.pp_size);
    log_info("worker", "rank %d of %d: %s, dp %d of %d%s (%s)%s", env->rank, env->world_size,
             placement_role_name(env->at.role), env->at.dp, env->at.dp_size, tp_note,
             env->staleness ? "one-step-off" : "on-policy", o->replace_rank >= 0 ? ", in place of the lost one" : "");
    return 0;
}

void launch_close_role(struct launch *l)
{
    if (!l->launched)
        return;
    l->launched = false;
    struct role_env *env = &l->env;
    if (l->split || l->colocated) {
        if (env->at.role != PLACE_ROLLOUT) {
            comm_free(env->mp);
            comm_free(env->replica);
            env->replica = NULL;
            comm_free(env->emp);
            parallel_groups_free(&l->trainer_groups);
        }
        comm_free(env->rollout_tp);
        comm_free(env->weight_group);
        comm_free(l->sides);
        env->mp = env->emp = env->rollout_tp = env->weight_group = env->trainers = l->sides = NULL;
        env->dp = env->tp = env->pp = env->cp = env->grads = NULL;
    }
    control_close(env->ctl);
    env->ctl = NULL;
}

void launch_close(struct launch *l)
{
    launch_close_role(l);
    if (l->have_world_groups)
        parallel_groups_free(&l->world_groups);
    l->have_world_groups = false;
}
