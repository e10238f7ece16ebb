/* Where each rank of a run goes: its role (hybrid, trainer or rollout) and its
 * parallel coordinates, from the run's placement numbers. Written once here and
 * used by grpod (which assigns) and by grpo-worker (which checks what it was
 * assigned, and places itself when it runs without grpod).
 *
 * Ranks 0..T-1 train, ranks T..T+R-1 generate. Trainer ranks are laid out as
 * Megatron does, (PP, DP, CP, TP) with TP fastest:
 *     rank = ((pp * dp_size + dp) * cp_size + cp) * tp_size + tp
 * so a TP group sits on neighbouring ranks (one node), the ranks that share a sequence (CP: Megatron's context
 * parallelism or verl's Ulysses sequence parallelism, one of the two) next, and PP stages are the farthest apart.
 * Expert parallelism splits the DP ranks: EP rank dp % ep_size of EP group dp / ep_size (Megatron carves its
 * expert groups out of the data-parallel ranks the same way). Rollout rank r of R has dp = r, dp_size = R, and with a
 * rollout TP of t it is TP rank r % t of rollout TP group (engine) r / t.
 *
 * With no rollout ranks every rank is hybrid (verl's colocated layout): it trains at its trainer coordinates
 * and generates in engine rank / t, as TP rank rank % t of it (t: the rollout TP). */
#ifndef GRPO_COMMON_PLACEMENT_H
#define GRPO_COMMON_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>

enum placement_role { PLACE_HYBRID = 0, PLACE_TRAINER = 1, PLACE_ROLLOUT = 2 };

/* The run's placement numbers (placement.* keys, or verl's trainer./rollout. node counts). */
struct placement_spec {
    int trainer_ranks, rollout_ranks; /* both 0: every rank is hybrid */
    int tp_size, pp_size;             /* of the trainer (or hybrid) ranks */
    int cp_size;                      /* ranks that share each sequence (0 or 1: none) */
    const char *cp_key;               /* the key cp_size came from, for messages (NULL: Megatron's CP key) */
    int ep_size;                      /* expert-parallel ranks, out of the DP ranks (0 or 1: none) */
    int rollout_tp;                   /* rollout ranks per rollout TP group (0 or 1: each rank alone) */
};

struct placement {
    enum placement_role role;
    int dp, dp_size, tp, tp_size, pp, pp_size;
    int cp, cp_size;     /* position in the group of ranks that share a sequence (1: alone) */
    int ep, ep_size;     /* expert-parallel rank (dp % ep_size) and group size (1: every rank holds every expert) */
    int engine, engines; /* a rollout or hybrid rank's generation TP group (engine) and the number of them */
    int engine_tp;       /* a hybrid rank's TP rank in its engine (a rollout rank's is tp) */
};

struct grpo_config;
/* The placement numbers of a configuration: placement.* or verl's trainer.nnodes x trainer.n_gpus_per_node and
 * rollout.nnodes x rollout.n_gpus_per_node (which must agree with placement.* when both are set). 0, or -1
 * with why naming the keys. */
int placement_spec_from_config(const struct grpo_config *cfg, struct placement_spec *s, char *why, size_t whylen);

/* Whether cfg was given any key placement_spec_from_config reads (rank counts, TP, PP, SP, CP, EP, rollout TP):
 * grpod given one lays the run out itself and checks every rank against it. */
bool placement_keys_given(const struct grpo_config *cfg);
/* Whether two specs lay a world out the same way (sizes of 0 and 1 alike). */
bool placement_spec_same(const struct placement_spec *a, const struct placement_spec *b);
/* The spec in words for messages: "T trainer + R rollout ranks (TP t, PP p, SP/CP c, EP e, rollout TP r)". */
void placement_spec_describe(const struct placement_spec *s, char *out, size_t len);

/* Role and coordinates of `rank` in a world of `world` ranks. 0, or -1 with why naming the keys and the
 * numbers when the layout cannot work (ranks that do not add up, no trainers, a trainer count that is not a
 * multiple of TP x PP). */
int placement_of(const struct placement_spec *s, int rank, int world, struct placement *out, char *why, size_t whylen);

/* The whole layout checked before any work starts: placement_of for every rank, plus the data the rollout
 * ranks share (prompts_per_step >= rollout ranks, so none is left without work). 0, or -1 with why. */
int placement_check(const struct placement_spec *s, int world, int prompts_per_step, char *why, size_t whylen);

/* The data-plane endpoint of trainer DP rank dp from the run's base (grpod.data_endpoint, or an ipc:// prefix):
 * PREFIX-dpD.sock for ipc, tcp://HOST:PORT+D for tcp (host NULL: "*", to bind). grpod hands these out; ranks
 * without grpod derive the same. */
void placement_data_endpoint(const char *base, int dp, const char *host, char *out, size_t len);
/* The trainers' dispatcher (work units and weights, on trainer DP rank 0's host) in a run with n_dp trainer DP
 * ranks: PREFIX-dispatch.sock for ipc, tcp://HOST:PORT+n_dp for tcp (the port after the data ports). */
void placement_dispatch_endpoint(const char *base, int n_dp, const char *host, char *out, size_t len);
/* Where trainer DP rank d > 0 runs the dispatcher once it leads a split run whose lead was lost
 * (trainer.survive_trainer_loss), from its data endpoint data_ep (as this process names it: to bind or to dial):
 * PREFIX-dpD-dispatch.sock for ipc, tcp://HOST:PORT+PLACEMENT_PORTS_PER_RUN/2 for tcp (above the data, dispatch
 * and relay ports of a run of up to 127 DP ranks and rollout processes). */
void placement_lead_endpoint(const char *data_ep, char *out, size_t len);

/* The run's data-plane base: `configured` (grpod.data_endpoint) when set; else, when the run's ranks span more
 * than one host (hosts > 1), tcp:// "*" PORT, PORT chosen from `tag` (the run id, or a value rank 0 drew), so
 * that runs on one host seldom share ports, in placement_port_window of this host's ephemeral range (never a port
 * the kernel may give an outgoing connection); else ipc://~run/grpo-TAG, where "~run" stands for
 * the private runtime directory of the user the workers run as (placement_resolve_endpoint): never a name in a
 * shared /tmp that another user could take first. */
/* Ports a run's data plane may take above its base: one per trainer DP rank and the dispatcher's. */
#define PLACEMENT_PORTS_PER_RUN 256
/* This host's ephemeral port range (net.ipv4.ip_local_port_range; Linux's default 32768..60999 when unreadable). */
void placement_ephemeral_range(int *lo, int *hi);
/* Where data-plane base ports are drawn from, given the ephemeral range [lo, hi]: [first, first + span), the
 * larger stretch of 10000..65279 outside it, with room for PLACEMENT_PORTS_PER_RUN ports above each base. */
void placement_port_window(int lo, int hi, int *first, int *span);
void placement_data_base(const char *configured, int hosts, const char *tag, char *out, size_t len);
/* The prefix of an ipc endpoint in the runtime directory, resolved where the endpoint is used. */
#define PLACEMENT_RUNTIME_PREFIX "ipc://~run/"
/* This user's private directory for sockets: $XDG_RUNTIME_DIR/grpo when XDG_RUNTIME_DIR is set, else
 * /tmp/grpo-UID; created 0700 when missing, and then checked whoever made it: a directory (not a link) owned by
 * this user that no one else may enter. 0 with the path, or -1 with why naming the directory and what is wrong
 * (another user's, a link, a mode that lets others in: someone may have taken the name first). */
int placement_runtime_dir(char *out, size_t len, char *why, size_t whylen);
/* ep with PLACEMENT_RUNTIME_PREFIX replaced by ipc:// and the runtime directory, in place (other endpoints are
 * left as they are). 0, or -1 with why. */
int placement_resolve_endpoint(char *ep, size_t len, char *why, size_t whylen);
/* The endpoint a process binds for `ep` (a placement_data_endpoint or placement_dispatch_endpoint made with host
 * NULL): the host "*" of tcp://HOST:PORT becomes ADDR when addr (the resolved grpod.advertise_host) is set; anything
 * else is copied. */
void placement_bind_endpoint(const char *ep, const char *addr, char *out, size_t len);
/* The host part of a tcp:// endpoint ("" when it is not tcp://, or the host is "*" or 0.0.0.0). */
void placement_endpoint_host(const char *ep, char *out, size_t len);
/* How many distinct names `hosts` (n fixed-size entries of `stride` bytes, NUL-terminated) holds. */
int placement_count_hosts(const char *hosts, int n, size_t stride);

/* "hybrid", "trainer", "rollout". */
const char *placement_role_name(enum placement_role r);

#endif
