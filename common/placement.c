#include "placement.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"

/* ranks = nodes x per_node from verl's keys, when either is set; -1 with why when only one is */
static int verl_ranks(long long nodes, long long per_node, const char *prefix, int *out, char *why, size_t whylen)
{
    *out = -1;
    if (nodes == 0 && per_node == 0)
        return 0;
    if (nodes == 0 || per_node == 0) {
        snprintf(why, whylen, "%s.nnodes (%lld) and %s.n_gpus_per_node (%lld) are set together", prefix, nodes, prefix,
                 per_node);
        return -1;
    }
    *out = (int)(nodes * per_node);
    return 0;
}

int placement_spec_from_config(const struct grpo_config *cfg, struct placement_spec *s, char *why, size_t whylen)
{
    *s = (struct placement_spec){0}; /* every number comes from cfg: none left from the caller's memory */
    s->trainer_ranks = (int)cfg->placement_trainer_ranks;
    s->rollout_ranks = (int)cfg->placement_rollout_ranks;
    s->tp_size = (int)cfg->actor_megatron_tensor_model_parallel_size;
    s->pp_size = (int)cfg->actor_megatron_pipeline_model_parallel_size;
    s->cp_size = (int)cfg->actor_ulysses_sequence_parallel_size;
    s->cp_key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size";
    s->ep_size = (int)cfg->actor_megatron_expert_model_parallel_size;
    if (cfg->actor_megatron_context_parallel_size > 1) { /* context parallelism: the same dimension (not both) */
        s->cp_size = (int)cfg->actor_megatron_context_parallel_size;
        s->cp_key = "actor_rollout_ref.actor.megatron.context_parallel_size";
    }
    s->rollout_tp = (int)cfg->rollout_tensor_model_parallel_size;
    int vt, vr;
    if (verl_ranks(cfg->trainer_nnodes, cfg->trainer_n_gpus_per_node, "trainer", &vt, why, whylen) != 0 ||
        verl_ranks(cfg->split_rollout_nnodes, cfg->split_rollout_n_gpus_per_node, "rollout", &vr, why, whylen) != 0)
        return -1;
    if (vt >= 0 && s->trainer_ranks && vt != s->trainer_ranks) {
        snprintf(why, whylen,
                 KEY_trainer_nnodes " x " KEY_trainer_n_gpus_per_node " = %d, but " KEY_placement_trainer_ranks
                                    " is %d",
                 vt, s->trainer_ranks);
        return -1;
    }
    if (vr >= 0 && s->rollout_ranks && vr != s->rollout_ranks) {
        snprintf(why, whylen,
                 KEY_split_rollout_nnodes " x " KEY_split_rollout_n_gpus_per_node
                                          " = %d, but " KEY_placement_rollout_ranks " is %d",
                 vr, s->rollout_ranks);
        return -1;
    }
    if (vt >= 0)
        s->trainer_ranks = vt;
    if (vr >= 0)
        s->rollout_ranks = vr;
    return 0;
}

bool placement_keys_given(const struct grpo_config *cfg)
{
    static const char *const keys[] = {"placement.trainer_ranks",
                                       "placement.rollout_ranks",
                                       "trainer.nnodes",
                                       "trainer.n_gpus_per_node",
                                       "rollout.nnodes",
                                       "rollout.n_gpus_per_node",
                                       "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
                                       "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size",
                                       "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                                       "actor_rollout_ref.actor.megatron.context_parallel_size",
                                       "actor_rollout_ref.actor.megatron.expert_model_parallel_size",
                                       "actor_rollout_ref.rollout.tensor_model_parallel_size"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (config_given(cfg, keys[i]))
            return true;
    return false;
}

static int at_least_1(int v) { return v > 1 ? v : 1; }

bool placement_spec_same(const struct placement_spec *a, const struct placement_spec *b)
{
    return a->trainer_ranks == b->trainer_ranks && a->rollout_ranks == b->rollout_ranks &&
           at_least_1(a->tp_size) == at_least_1(b->tp_size) && at_least_1(a->pp_size) == at_least_1(b->pp_size) &&
           at_least_1(a->cp_size) == at_least_1(b->cp_size) && at_least_1(a->ep_size) == at_least_1(b->ep_size) &&
           at_least_1(a->rollout_tp) == at_least_1(b->rollout_tp);
}

void placement_spec_describe(const struct placement_spec *s, char *out, size_t len)
{
    snprintf(out, len, "%d trainer + %d rollout ranks (TP %d, PP %d, SP/CP %d, EP %d, rollout TP %d)", s->trainer_ranks,
             s->rollout_ranks, at_least_1(s->tp_size), at_least_1(s->pp_size), at_least_1(s->cp_size),
             at_least_1(s->ep_size), at_least_1(s->rollout_tp));
}

const char *placement_role_name(enum placement_role r)
{
    return r == PLACE_TRAINER ? "trainer" : r == PLACE_ROLLOUT ? "rollout" : "hybrid";
}

int placement_of(const struct placement_spec *s, int rank, int world, struct placement *p, char *why, size_t whylen)
{
    const int T = s->trainer_ranks, R = s->rollout_ranks, tp = s->tp_size, pp = s->pp_size;
    const int cp = s->cp_size > 1 ? s->cp_size : 1, ep = s->ep_size > 1 ? s->ep_size : 1;
    const char *cp_key = s->cp_key ? s->cp_key : "actor_rollout_ref.actor.megatron.context_parallel_size";
    memset(p, 0, sizeof *p);
    p->cp_size = p->ep_size = 1;
    if (tp < 1 || pp < 1) {
        snprintf(why, whylen,
                 KEY_actor_megatron_tensor_model_parallel_size
                 " (%d) and " KEY_actor_megatron_pipeline_model_parallel_size " (%d) must be >= 1",
                 tp, pp);
        return -1;
    }
    if (rank < 0 || rank >= world) {
        snprintf(why, whylen, "rank %d is outside a world of %d ranks", rank, world);
        return -1;
    }
    int n = world;
    if (T == 0 && R == 0) {
        p->role = PLACE_HYBRID;
    } else {
        if (T < 1) {
            snprintf(why, whylen,
                     "placement has no trainers: " KEY_placement_trainer_ranks " is 0 with " KEY_placement_rollout_ranks
                     " %d "
                     "(give at least one trainer rank)",
                     R);
            return -1;
        }
        if (T + R != world && R == 0) {
            snprintf(why, whylen,
                     "placement does not add up: " KEY_trainer_nnodes " x " KEY_trainer_n_gpus_per_node
                     " (" KEY_placement_trainer_ranks ") "
                     "is %d with no rollout ranks (every rank colocated), but mpirun started %d ranks",
                     T, world);
            return -1;
        }
        if (T + R != world) {
            snprintf(why, whylen,
                     "placement does not add up: " KEY_placement_trainer_ranks " %d + " KEY_placement_rollout_ranks
                     " %d = %d, but "
                     "mpirun started %d ranks",
                     T, R, T + R, world);
            return -1;
        }
        if (R == 0) { /* verl's colocated layout (its hybrid engine): every rank generates and trains */
            p->role = PLACE_HYBRID;
        } else if (rank >= T) {
            const int rtp = s->rollout_tp > 1 ? s->rollout_tp : 1;
            if (R % rtp != 0) {
                snprintf(why, whylen,
                         "placement does not fit: %d rollout ranks are not a multiple "
                         "of " KEY_rollout_tensor_model_parallel_size " %d",
                         R, rtp);
                return -1;
            }
            p->role = PLACE_ROLLOUT;
            p->dp = rank - T;
            p->dp_size = R;
            p->tp = p->dp % rtp;
            p->tp_size = rtp;
            p->pp_size = 1;
            p->engine = p->dp / rtp;
            p->engines = R / rtp;
            return 0;
        } else {
            p->role = PLACE_TRAINER;
            n = T;
        }
    }
    if (n % (tp * pp) != 0) {
        snprintf(
            why, whylen,
            "placement does not fit: %d %s ranks are not a multiple of " KEY_actor_megatron_tensor_model_parallel_size
            " %d x " KEY_actor_megatron_pipeline_model_parallel_size " %d",
            n, p->role == PLACE_HYBRID ? "hybrid" : "trainer", tp, pp);
        return -1;
    }
    if (n % (tp * pp * cp) != 0) {
        snprintf(
            why, whylen,
            "placement does not fit: %d %s ranks are not a multiple of " KEY_actor_megatron_tensor_model_parallel_size
            " %d x " KEY_actor_megatron_pipeline_model_parallel_size " %d x %s %d",
            n, p->role == PLACE_HYBRID ? "hybrid" : "trainer", tp, pp, cp_key, cp);
        return -1;
    }
    p->tp_size = tp;
    p->pp_size = pp;
    p->cp_size = cp;
    p->dp_size = n / (tp * pp * cp);
    if (p->dp_size % ep != 0) {
        snprintf(why, whylen,
                 "placement does not fit: the %d data-parallel ranks are not a multiple "
                 "of " KEY_actor_megatron_expert_model_parallel_size " %d (expert groups are made of "
                 "data-parallel ranks)",
                 p->dp_size, ep);
        return -1;
    }
    p->tp = rank % tp;
    p->cp = (rank / tp) % cp;
    p->dp = (rank / (tp * cp)) % p->dp_size;
    p->pp = rank / (tp * cp * p->dp_size);
    p->ep_size = ep;
    p->ep = p->dp % ep;
    if (p->role == PLACE_HYBRID) { /* generation: rollout TP groups (engines) of neighbouring ranks */
        const int rtp = s->rollout_tp > 1 ? s->rollout_tp : 1;
        if (n % rtp != 0) {
            snprintf(why, whylen,
                     "placement does not fit: %d colocated ranks are not a multiple "
                     "of " KEY_rollout_tensor_model_parallel_size " %d",
                     n, rtp);
            return -1;
        }
        p->engine = rank / rtp;
        p->engine_tp = rank % rtp;
        p->engines = n / rtp;
    }
    return 0;
}

void placement_data_endpoint(const char *base, int dp, const char *host, char *out, size_t len)
{
    if (strncmp(base, "tcp://", 6) == 0) {
        const char *colon = strrchr(base, ':');
        long port = colon ? strtol(colon + 1, NULL, 10) : 0;
        snprintf(out, len, "tcp://%s:%ld", host ? host : "*", port + dp);
    } else {
        snprintf(out, len, "%s-dp%d.sock", base, dp);
    }
}

void placement_ephemeral_range(int *lo, int *hi)
{
    *lo = 32768; /* Linux's default net.ipv4.ip_local_port_range */
    *hi = 60999;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (!f)
        return;
    char line[64];
    if (fgets(line, sizeof line, f)) {
        char *end = NULL, *end2 = NULL;
        const long a = strtol(line, &end, 10), b = strtol(end, &end2, 10);
        if (end != line && end2 != end && a > 0 && a <= b && b < 65536) {
            *lo = (int)a;
            *hi = (int)b;
        }
    }
    fclose(f);
}

void placement_port_window(int lo, int hi, int *first, int *span)
{
    /* the data ports (one per trainer DP rank, then the dispatcher's) must never be a port the kernel hands out to an
     * outgoing connection: such a port, taken on a trainer's host by an MPI or control connection, made the bind
     * fail ("Address already in use"). The larger free stretch of 10000..65279 outside [lo, hi], less
     * PLACEMENT_PORTS_PER_RUN at its top so that a run's last port stays out too. */
    const int floor_ = 10000, ceil_ = 65280 - PLACEMENT_PORTS_PER_RUN;
    int below = lo - PLACEMENT_PORTS_PER_RUN - floor_, above = ceil_ - (hi + 1);
    if (below >= above && below > 0) {
        *first = floor_;
        *span = below;
    } else if (above > 0) {
        *first = hi + 1;
        *span = above;
    } else { /* the whole range is ephemeral: nothing to avoid it with */
        *first = 20000;
        *span = 20000;
    }
}

void placement_data_base(const char *configured, int hosts, const char *tag, char *out, size_t len)
{
    if (configured && configured[0]) {
        snprintf(out, len, "%s", configured);
        return;
    }
    if (hosts > 1) {
        uint32_t h = 2166136261u; /* FNV-1a of the tag */
        for (const char *p = tag; p && *p; p++)
            h = (h ^ (uint8_t)*p) * 16777619u;
        int lo = 0, hi = 0;
        placement_ephemeral_range(&lo, &hi);
        int first = 0, span = 0;
        placement_port_window(lo, hi, &first, &span);
        snprintf(out, len, "tcp://*:%u", (unsigned)first + h % (unsigned)span);
        return;
    }
    snprintf(out, len, PLACEMENT_RUNTIME_PREFIX "grpo-%s", tag ? tag : "");
}

int placement_runtime_dir(char *out, size_t len, char *why, size_t whylen)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && xdg[0] == '/')
        snprintf(out, len, "%s/grpo", xdg);
    else
        snprintf(out, len, "/tmp/grpo-%u", (unsigned)getuid());
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        snprintf(why, whylen, "cannot create the runtime directory %s: %s", out, strerror(errno));
        return -1;
    }
    struct stat st;
    const char *wrong = NULL;
    if (lstat(out, &st) != 0)
        wrong = strerror(errno);
    else if (S_ISLNK(st.st_mode))
        wrong = "a symbolic link";
    else if (!S_ISDIR(st.st_mode))
        wrong = "not a directory";
    else if (st.st_uid != getuid())
        wrong = "owned by another user";
    else if (st.st_mode & 077)
        wrong = "open to other users (its mode lets group or others in)";
    if (!wrong)
        return 0;
    snprintf(why, whylen,
             "the runtime directory for this run's sockets, %s, is %s: someone may have taken the name first; "
             "remove it (or set XDG_RUNTIME_DIR to a directory of your own, mode 0700)",
             out, wrong);
    return -1;
}

int placement_resolve_endpoint(char *ep, size_t len, char *why, size_t whylen)
{
    const size_t pl = strlen(PLACEMENT_RUNTIME_PREFIX);
    if (strncmp(ep, PLACEMENT_RUNTIME_PREFIX, pl) != 0)
        return 0;
    char dir[4096];
    if (placement_runtime_dir(dir, sizeof dir, why, whylen) != 0)
        return -1;
    char rest[512];
    snprintf(rest, sizeof rest, "%s", ep + pl);
    if ((size_t)snprintf(ep, len, "ipc://%s/%s", dir, rest) >= len || strlen(dir) + strlen(rest) + 2 > 107) {
        snprintf(why, whylen, "the socket path %s/%s is too long for a unix socket (107 bytes)", dir, rest);
        return -1;
    }
    return 0;
}

void placement_bind_endpoint(const char *ep, const char *addr, char *out, size_t len)
{
    if (addr && addr[0] && strncmp(ep, "tcp://*:", 8) == 0)
        snprintf(out, len, "tcp://%s:%s", addr, ep + 8);
    else
        snprintf(out, len, "%s", ep);
}

void placement_endpoint_host(const char *ep, char *out, size_t len)
{
    if (len)
        out[0] = 0;
    if (strncmp(ep, "tcp://", 6) != 0)
        return;
    const char *h = ep + 6, *colon = strrchr(h, ':');
    size_t n = colon ? (size_t)(colon - h) : strlen(h);
    if ((n == 1 && h[0] == '*') || (n == 7 && strncmp(h, "0.0.0.0", 7) == 0))
        return;
    snprintf(out, len, "%.*s", (int)n, h);
}

int placement_count_hosts(const char *hosts, int n, size_t stride)
{
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = strcmp(hosts + (size_t)i * stride, hosts + (size_t)j * stride) == 0;
        distinct += !seen;
    }
    return distinct;
}

void placement_dispatch_endpoint(const char *base, int n_dp, const char *host, char *out, size_t len)
{
    if (strncmp(base, "tcp://", 6) == 0)
        placement_data_endpoint(base, n_dp, host, out, len);
    else
        snprintf(out, len, "%s-dispatch.sock", base);
}

void placement_lead_endpoint(const char *data_ep, char *out, size_t len)
{
    const size_t n = strlen(data_ep), sl = strlen(".sock");
    if (strncmp(data_ep, "tcp://", 6) == 0) {
        const char *colon = strrchr(data_ep, ':');
        const long port = colon ? strtol(colon + 1, NULL, 10) : 0;
        snprintf(out, len, "%.*s:%ld", (int)(colon ? colon - data_ep : (long)n), data_ep,
                 port + PLACEMENT_PORTS_PER_RUN / 2);
    } else if (n > sl && strcmp(data_ep + n - sl, ".sock") == 0) {
        snprintf(out, len, "%.*s-dispatch.sock", (int)(n - sl), data_ep);
    } else {
        snprintf(out, len, "%s-dispatch", data_ep);
    }
}

int placement_check(const struct placement_spec *s, int world, int prompts_per_step, char *why, size_t whylen)
{
    struct placement p;
    for (int r = 0; r < world; r++)
        if (placement_of(s, r, world, &p, why, whylen) != 0)
            return -1;
    const int rtp = s->rollout_tp > 1 ? s->rollout_tp : 1;
    if (s->rollout_ranks == 0 && world / rtp > prompts_per_step) {
        snprintf(why, whylen,
                 "%d colocated ranks in %d generation group(s) of " KEY_rollout_tensor_model_parallel_size " "
                 "%d: more groups than the %d prompts of a step (" KEY_data_train_batch_size "), some ranks would have "
                 "nothing to generate",
                 world, world / rtp, rtp, prompts_per_step);
        return -1;
    }
    const int engines = s->rollout_ranks / rtp;
    if (engines > prompts_per_step) {
        snprintf(why, whylen,
                 KEY_placement_rollout_ranks " %d (%d rollout TP group(s)) is more than the %d prompts of a step "
                                             "(" KEY_data_train_batch_size
                                             "): some rollout ranks would have nothing to generate",
                 s->rollout_ranks, engines, prompts_per_step);
        return -1;
    }
    return 0;
}
