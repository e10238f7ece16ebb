/* The collective plane: a small communication interface with two back-ends,
 * MPI (CPU buffers) and NCCL (GPU buffers). Counts are elements, never bytes
 * (comm_allgather_bytes alone, which says so, counts bytes).
 * All collectives are blocking from the caller's point of view (the NCCL
 * back-end synchronises its stream), so the CPU and GPU paths are drop-in
 * replacements in tests; the one non-blocking operation, comm_iallreduce_sum,
 * overlaps the gradients' sum with the backward. */
#ifndef GRPO_WORKER_COMM_H
#define GRPO_WORKER_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum comm_dtype { COMM_F32, COMM_F64, COMM_I32, COMM_I64 };

struct comm;

/* Size in bytes of one element of dtype. */
size_t comm_dtype_size(enum comm_dtype t);

/* Start MPI for this process of the job (main's argc and argv); from then on a failed check ends the whole job,
 * not this rank alone. */
void comm_mpi_init(int *argc, char ***argv);
/* Say (one info line) which MPI library runs this process and whether the job can outlive a lost trainer rank with
 * it: only Open MPI 5 with ULFM, launched with its fault tolerance (scripts/mpirun_ft), will; after comm_mpi_init. */
void comm_mpi_log_caps(void);
/* End MPI, once every comm is freed. */
void comm_mpi_finalize(void);
/* End the whole job with exit status code: a rank the others would wait for in a collective cannot go on. Under a
 * launch with ULFM's fault tolerance on, this rank ends with that status and its peers learn of its loss (the only
 * end of a rank that mpirun then reports as the job's failure; comm_mpi.c says why). */
void comm_end_job(int code);
/* Whether mpirun keeps the job when one of its ranks dies (--mca orte_enable_recovery 1). */
bool comm_job_outlives_ranks(void);
/* Whether this launch turned ULFM's fault tolerance on (comm_ft_available, asked once at comm_mpi_init). */
bool comm_ft_launched(void);
/* Whether the job lost a rank that this process outlived (ULFM: the collective plane handed a loss to its handler,
 * a word to a spare found it gone, or MPI's failure detector reports a rank of the world lost). */
bool comm_ft_peer_was_lost(void);
/* Under mpirun in that mode: make ready (before comm_mpi_finalize) to ask mpirun to end the job; elsewhere nothing. */
void comm_arm_job_end(void);
/* After comm_arm_job_end, once this rank's part of a finished run is done (MPI_Finalize returned, or hangs for a
 * lost rank): ask mpirun to end the job, ending any rank of it still there; mpirun then exits with the job's status.
 * Nothing when not armed. Safe from another thread while comm_mpi_finalize runs. */
void comm_end_finished_job(void);
/* MPI_COMM_WORLD as a comm (MPI must be initialised). */
struct comm *comm_mpi_world(void);
/* A sub-group of parent: ranks with the same color, ordered by key (same back-end as parent). */
struct comm *comm_split(struct comm *parent, int color, int key);
/* A sub-group of parent: the ranks that share this rank's host (its node), ordered by key (same back-end as parent);
 * collective over parent. */
struct comm *comm_split_node(struct comm *parent, int key);
/* From now on an error in a collective of c (a lost peer) ends this rank only, with a log line, instead of the
 * whole job: for a group whose loss the run survives (a rollout TP group). */
void comm_fail_alone(struct comm *c);
/* Bound every wait of c to `seconds` (0: none): a collective or point-to-point operation that has not completed by
 * then ends the run naming the operation, the group size and the rank (a lost or stuck peer never hangs the run);
 * NCCL aborts the communicator first, and in a comm_fail_alone group only this rank ends. The MPI back-end then
 * runs every operation non-blocking and tests it; comm_broadcast_polled, the wait at a safe point that lasts
 * through a pause, is not bounded. Groups split from c inherit the deadline. */
void comm_set_deadline(struct comm *c, double seconds);
/* Fault tolerance (comm_ft.c): ULFM, Open MPI 5 launched with its fault tolerance on (scripts/mpirun_ft). Whether
 * this process can outlive a lost peer; false with the reason in why (a build without ULFM, a launch without
 * --with-ft ulfm). */
bool comm_ft_available(char *why, size_t whylen);
/* c's MPI errors come back to the collective plane instead of ending the job in MPI itself (the handler below sees
 * them; groups split from c later inherit this). A device group (NCCL) is watched through its MPI twin, and its own
 * failures (a peer's loss that NCCL reports, or that MPI knows of while NCCL waits) go to the handler too. */
void comm_ft_watch(struct comm *c);
/* From now on an operation of a watched MPI group that fails because a peer is lost, or because a survivor revoked
 * the group, calls lost(ud, c, what) (what names the call and why) before anything else; lost does not return where
 * the run survives the loss (it jumps back to a point it set), and when it returns the run ends as before. NULL:
 * none. */
void comm_set_peer_lost_handler(void (*lost)(void *ud, struct comm *c, const char *what), void *ud);
/* Revoke c: every survivor's operation on it, waiting or to come, fails at once. c is dead: comm_free releases its
 * wrapper only. A device group (NCCL) is aborted (ncclCommAbort: its queued operations dropped) and its MPI twin
 * revoked; a new one over the survivors is made with comm_device_group on their shrunk group. */
void comm_revoke(struct comm *c);
/* The survivors of c (revoked) as a new group, ranked as in c, with c's deadline, watched; collective over the
 * survivors (MPIX_Comm_shrink agrees on who they are). NULL with err. */
struct comm *comm_shrink(struct comm *c, char *err, size_t errlen);
/* The ranks of old that are not in survivors (its shrink), in increasing order: up to max of them in ranks; their
 * count. The same on every survivor. */
int comm_lost_ranks(struct comm *old, struct comm *survivors, int *ranks, int max);
/* Every survivor of c's flag ANDed, the same on all of them even if a peer is lost meanwhile (MPIX_Comm_agree);
 * 0, or -1. */
int comm_agree(struct comm *c, int *flag);
/* A spare rank's wait (trainer.survive_spare_ranks): one word from rank `from` of c (a watched group) on a tag of its
 * own (not from any rank: another spare's loss would end it), in one receive that from's loss or a revoke of c ends
 * (through the peer-lost handler, which does
 * not return where the run survives). 0 with *word, or -1 (no ULFM, or the handler returned). comm_ft_send_word:
 * the word to rank peer on that tag: 0, or -1 when peer is lost (the peer-lost handler is not called: a spare
 * lost while it waited loses nothing). Outside the step's collectives: they cost a step nothing. */
int comm_ft_wait_word(struct comm *c, int from, int32_t *word);
int comm_ft_send_word(struct comm *c, int peer, int32_t word);
/* For a device-group back-end (comm_nccl.c), whose waits are no MPI calls. comm_ft_lost: its operation on c, a
 * watched group, failed for a lost peer (what names the call and why), c already aborted: the handler of
 * comm_set_peer_lost_handler runs, and does not return where the run survives the loss; otherwise (no handler, or
 * it returned) this returns and the caller ends the run as before. comm_ft_poll: whether MPI knows that a peer of
 * mpi_comm (the group's watched MPI twin) is lost, or that a survivor revoked it, with MPI's progress moved first
 * (a probe): true with why; false without ULFM. A few microseconds: for a wait's loop every few milliseconds. */
void comm_ft_lost(struct comm *c, const char *what);
bool comm_ft_poll(struct comm *mpi_comm, char *why, size_t whylen);
/* Tests of a lost peer: hold(point) runs where this rank is about to wait for an all-reduce it started ("allreduce",
 * comm_wait), so that a test kills it there, its part started and its peers waiting on it, and where it is about to
 * start one ("allreduce-start", comm_iallreduce_sum: its peers wait on its part, which never comes; over NCCL a
 * started part may already have reached them); NULL: none. */
void comm_set_test_hold(void (*hold)(const char *point));
/* The hold of comm_set_test_hold at another point of a step, named by point ("logprob", "optim", "ckpt": where the
 * trainer calls it); nothing without one. */
void comm_test_hold(const char *point);
/* Test only (test.block_at=in_dp_collective): the next waited operation of c on this rank freezes for ever inside
 * its wait, its flight record open and the back-end not called (a process frozen inside a collective its peers
 * entered: they wait in it for ever). */
void comm_test_freeze(struct comm *c);
/* Name c for the flight recorder (worker/flight) and its messages: a short word, "dp", "tp", "pp", "world",
 * "trainers" (at most 15 bytes), set by the creator that knows what the group is for. A record then reads
 * "all-reduce #1234 of dp (ranks 0-4,6-7)": the name, the group's world ranks and the operation's number in the
 * group. comm_mpi_world's is "world", a split's "split" and a node's "node" until named; a device group takes its
 * MPI group's. Local: no communication. */
void comm_set_name(struct comm *c, const char *name);
/* c's name (comm_set_name). */
const char *comm_name(const struct comm *c);
/* c's world ranks as ranges, "0-4,6-7" ("" where the back-end cannot say). */
const char *comm_members(const struct comm *c);
/* Release a comm from comm_mpi_world, comm_split or comm_device_group. */
void comm_free(struct comm *c);

int comm_rank(const struct comm *c);
int comm_size(const struct comm *c);
/* "mpi" or "nccl": for log lines only; callers branch on comm_caps. */
const char *comm_backend_name(const struct comm *c);

/* What a back-end offers its callers, who branch on these and never on its name. */
struct comm_caps {
    bool device_memory; /* payloads travel from and to the memory of the group's GPU (a host buffer takes a slower
                           MPI twin, meant for small values): a caller stages bulk host data through device memory */
};
/* The capabilities of c's back-end. */
const struct comm_caps *comm_caps(const struct comm *c);

/* In-place sum over the group. */
void comm_allreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t);
/* A started operation: comm_test lets it progress, comm_wait completes and frees it. */
struct comm_req {
    struct comm *c;
    size_t count;
    enum comm_dtype t;
    uint64_t seq; /* the sum's number among c's collectives (the flight recorder's) */
};
/* Start an in-place sum over the group and return at once (overlapping the gradients' all-reduce with the
 * backward that produces the next ones). after_stream: the CUDA stream whose queued work writes buf (NULL: host
 * memory, or nothing pending); an NCCL group sums after that work, on its own stream, without stopping the
 * caller. The same operations must be started in the same order on every rank; buf is not touched until
 * comm_wait returns. Back-ends without a non-blocking form sum at once. */
struct comm_req *comm_iallreduce_sum(struct comm *c, void *buf, size_t count, enum comm_dtype t, void *after_stream);
/* Let r progress (MPI moves a non-blocking collective's messages inside its calls): between pieces of work. */
void comm_test(struct comm_req *r);
/* Complete r within the group's deadline (a lost peer ends the run naming the operation) and free it. */
void comm_wait(struct comm_req *r);
/* In-place maximum over the group (vocab-parallel softmax: the row maxima). */
void comm_allreduce_max(struct comm *c, void *buf, size_t count, enum comm_dtype t);
/* recv (count * size) gets every rank's send (count) in rank order. */
void comm_allgather(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t);
/* As comm_allgather, but counted in BYTES, not elements: recv (bytes * size) gets every rank's send (bytes) in rank
 * order (host names, text). */
void comm_allgather_bytes(struct comm *c, const void *send, void *recv, size_t bytes);
/* send (count * size) summed over the group; rank r keeps block r (count) in recv. */
void comm_reduce_scatter_sum(struct comm *c, const void *send, void *recv, size_t count, enum comm_dtype t);
/* root's buf copied to every rank. */
void comm_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root);
/* As comm_broadcast, calling poll(ud, false) (poll may be NULL) now and then while the peers have not arrived,
 * and poll(ud, true) once when the broadcast completes after such calls (small
 * buffers: a header, a decision). Every rank of the group must use this call for the same broadcast (MPI does not
 * match a non-blocking broadcast with a blocking one). Back-ends without one block as comm_broadcast does. */
void comm_broadcast_polled(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root,
                           void (*poll)(void *ud, bool done), void *ud);
/* As comm_broadcast, but a peer that has not come by the group's deadline (or an error the back-end reports)
 * gives the group up instead of ending the run: -1, with a log line, and every later comm_try_broadcast on c
 * returns -1 at once (MPI cannot take back a started collective, NCCL's communicator is aborted). For a group
 * whose loss the run survives (the weight broadcast to the rollout ranks, which then fetch instead). 0 when
 * every byte arrived. Every rank of the group must use this call for the same broadcast. */
int comm_try_broadcast(struct comm *c, void *buf, size_t count, enum comm_dtype t, int root);
/* Give c up as a failed comm_try_broadcast does (its peers disagree with this rank): later ones return -1 at once,
 * and an NCCL communicator is aborted when c is freed. */
void comm_give_up(struct comm *c);
/* Point-to-point within the group (pipeline stages). */
void comm_send(struct comm *c, const void *buf, size_t count, enum comm_dtype t, int peer);
void comm_recv(struct comm *c, void *buf, size_t count, enum comm_dtype t, int peer);
/* All-to-all with a block per peer: send_counts[p] elements of send (in rank order, back to back) go to rank p,
 * which receives them as block `this rank` of its recv; recv_counts[p] is what rank p sends here. Every rank's
 * send_counts[q] must equal rank q's recv_counts[this rank] (expert dispatch and combine, Ulysses' sequence <->
 * head swap). Bounded by the group's deadline. */
void comm_alltoallv(struct comm *c, const void *send, const size_t *send_counts, void *recv, const size_t *recv_counts,
                    enum comm_dtype t);
/* Send to dest and receive from src at once (pipeline stages in the steady state of 1F1B: one stage's send
 * meets its neighbour's receive whichever starts first, so no two stages wait on each other's sends). */
void comm_sendrecv(struct comm *c, const void *send, size_t send_count, int dest, void *recv, size_t recv_count,
                   int src, enum comm_dtype t);
void comm_barrier(struct comm *c);
/* A barrier with no deadline that calls poll(ud, false) while it waits and poll(ud, true) once when it waited (as
 * comm_broadcast_polled does; poll may be NULL): where ranks wait for something slower than a lost peer's
 * deadline, a rollout say. */
void comm_barrier_polled(struct comm *c, void (*poll)(void *ud, bool done), void *ud);

/* A table of n int64 values held by rank 0 of c that any rank reads and rewrites under an exclusive lock, with no
 * part played by rank 0 (MPI one-sided: a rank busy computing does not hold the others up). Collective over c;
 * the values start at 0. NULL where the back-end has none (NCCL: make it on the MPI group). */
struct comm_table;
struct comm_table *comm_table_create(struct comm *c, size_t n);
/* Lock the table, read its values into v (n of them), call fn(ud, v), write v back, unlock: fn sees and leaves
 * the table as no other rank can in between. */
void comm_table_update(struct comm_table *t, int64_t *v, void (*fn)(void *ud, int64_t *v), void *ud);
/* Free the table (collective over its comm). */
void comm_table_free(struct comm_table *t);

/* Memory shared by the ranks of c, every one of them on this host (a group of comm_split_node): bytes of it, zeros,
 * the same bytes at comm_shared_base on every rank. Collective over c; NULL where the back-end has none. Plain
 * memory that the ranks read and change with atomic operations, no MPI call in between: a rank that dies leaves
 * nothing held, and the others are never inside an MPI call on its account (unlike comm_table's lock). */
struct comm_shared;
struct comm_shared *comm_shared_create(struct comm *c, size_t bytes);
void *comm_shared_base(const struct comm_shared *s);
/* Free it (collective over its comm). */
void comm_shared_free(struct comm_shared *s);

/* Seconds this process has spent inside blocking collectives and receives, over every comm (waiting for its
 * peers, and moving the data): the part of a step a rank is idle for others. */
double comm_wait_seconds(void);

/* What a comm has moved since it was made (or since comm_traffic_reset): per kind of collective, the calls,
 * the payload (the caller's buffer) and the bytes this rank sends in the ring algorithms the planner assumes
 * (all-reduce 2(n-1)/n of the buffer, all-gather and reduce-scatter (n-1) blocks, broadcast the buffer from the
 * root, send the buffer, all-to-all the blocks for the other ranks), for float32 buffers (gradients, weights) apart
 * from the rest (counts, statistics). */
enum comm_op {
    COMM_OP_ALLREDUCE,
    COMM_OP_ALLGATHER,
    COMM_OP_REDUCE_SCATTER,
    COMM_OP_BROADCAST,
    COMM_OP_SEND,
    COMM_OP_ALLTOALL, /* sent: the blocks this rank sends to the other ranks (not its own) */
    COMM_OPS
};
struct comm_traffic {
    unsigned long long calls[COMM_OPS];
    double payload[COMM_OPS];
    double sent_f32[COMM_OPS], sent_other[COMM_OPS];
};
void comm_traffic(const struct comm *c, struct comm_traffic *out);
/* Operations this comm has completed (any thread may ask): a rank stuck in a collective with a lost peer stops
 * counting. */
unsigned long long comm_progress(const struct comm *c);
void comm_traffic_reset(struct comm *c);
/* The bytes this rank sends for op on a buffer of `bytes` in a group of n (the ring model above; 0 for n = 1). */
double comm_ring_bytes(enum comm_op op, double bytes, int n, bool root);

/* The NCCL twin of an MPI group for buffers in the memory of GPU `device` (one GPU per rank of the group), or
 * NULL in a build without CUDA. */
struct comm *comm_device_group(struct comm *mpi_comm, int device);
/* A back-end of device groups as it registers itself: the build lists this build's in comm_device_backends[]
 * (worker/comm/meson.build generates the list, NULL-terminated; none without CUDA), and comm_device_group takes the
 * first. from: the twin of an MPI group on GPU device. */
struct comm_device_backend {
    const char *name; /* "nccl" */
    struct comm *(*from)(struct comm *mpi_comm, int device);
};
extern const struct comm_device_backend *const comm_device_backends[];

/* Back-end table; each back-end fills one. */
struct comm_backend {
    const char *name;
    struct comm_caps caps;
    void (*allreduce_sum)(struct comm *, void *, size_t, enum comm_dtype);
    void (*allreduce_max)(struct comm *, void *, size_t, enum comm_dtype);
    /* comm_iallreduce_sum, comm_test and comm_wait (NULL: the blocking sum); wait frees the request */
    struct comm_req *(*iallreduce_sum)(struct comm *, void *, size_t, enum comm_dtype, void *);
    void (*test)(struct comm_req *);
    void (*wait)(struct comm_req *);
    void (*allgather)(struct comm *, const void *, void *, size_t, enum comm_dtype);
    void (*allgather_bytes)(struct comm *, const void *, void *, size_t); /* the count in bytes */
    void (*reduce_scatter_sum)(struct comm *, const void *, void *, size_t, enum comm_dtype);
    void (*broadcast)(struct comm *, void *, size_t, enum comm_dtype, int);
    void (*broadcast_polled)(struct comm *, void *, size_t, enum comm_dtype, int, void (*)(void *, bool), void *);
    int (*try_broadcast)(struct comm *, void *, size_t, enum comm_dtype, int); /* NULL: comm_broadcast */
    void (*send)(struct comm *, const void *, size_t, enum comm_dtype, int);
    void (*recv)(struct comm *, void *, size_t, enum comm_dtype, int);
    void (*sendrecv)(struct comm *, const void *, size_t, int, void *, size_t, int, enum comm_dtype);
    void (*alltoallv)(struct comm *, const void *, const size_t *, void *, const size_t *, enum comm_dtype);
    void (*barrier)(struct comm *);
    void (*barrier_polled)(struct comm *, void (*)(void *, bool), void *); /* NULL: the barrier */
    struct comm *(*split)(struct comm *, int, int);
    struct comm *(*split_node)(struct comm *, int);
    void (*fail_alone)(struct comm *);           /* may be NULL */
    void (*ft_watch)(struct comm *);             /* comm_ft_watch of a device group; may be NULL */
    void (*revoke)(struct comm *);               /* comm_revoke of a device group; may be NULL */
    void (*set_deadline)(struct comm *, double); /* besides c->deadline_s (a twin's own); may be NULL */
    /* the world rank of every rank of the group, in group order (comm_members); may be NULL */
    void (*world_ranks)(const struct comm *, int *);
    void (*set_name)(struct comm *, const char *); /* besides c->name (a twin's); may be NULL */
    void (*destroy)(struct comm *);
    /* comm_table_create, _update and _free (NULL: no table) */
    struct comm_table *(*table_create)(struct comm *, size_t);
    void (*table_update)(struct comm_table *, int64_t *, void (*)(void *, int64_t *), void *);
    void (*table_free)(struct comm_table *);
    /* comm_shared_create and _free (NULL: none); a back-end's comm_shared starts with struct comm_shared_head */
    struct comm_shared *(*shared_create)(struct comm *, size_t);
    void (*shared_free)(struct comm_shared *);
};

struct comm_shared_head {
    struct comm *c;
    void *base;
};

struct comm {
    const struct comm_backend *be;
    int rank, size;
    void *impl;
    struct comm_traffic traffic;          /* counted in comm.c, whatever the back-end */
    _Atomic unsigned long long completed; /* operations finished, read by watchdog threads (comm_progress) */
    double deadline_s;                    /* comm_set_deadline (0: none) */
    bool given_up;                        /* a comm_try_broadcast failed: the group is not used again */
    /* the flight recorder's: the name (comm_set_name), the group's world ranks, its id of the two, and the
     * collectives and point-to-point operations begun on c so far (the main thread's) */
    char name[16];
    char members[112];
    uint16_t flight_group;
    uint64_t coll_seq, p2p_seq;
    bool test_freeze; /* comm_test_freeze */
};

#endif
