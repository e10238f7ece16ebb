/* The flight recorder: every rank keeps a ring of its last N waits (collectives, point-to-point operations,
 * data-plane requests, checkpoint I/O), each with what it was (the operation, its group and the group's world
 * ranks, its number in the group, the bytes, the peer), where the rank was (the step's phase, the model layer and
 * pass) and when it began and ended; and the wait it is in now, if any.
 *
 * One thread records: the thread that called flight_init (the main thread, which runs every collective); calls
 * from any other thread record nothing. Any thread reads, without a lock the recording thread could hold: each
 * slot of the ring is a seqlock of C11 atomics (the writer never waits, a reader retries a slot caught mid-write),
 * so a heartbeat thread reads the ring of a main thread stuck in a collective.
 *
 *     int tok = flight_begin(FLIGHT_OP_ALLREDUCE, group, seq, bytes, -1, t0);
 *     ... the wait ...
 *     flight_end(tok, clock_now_s());
 *
 * The ring is dumped as JSON lines to DIR/rank-R.jsonl (flight_set_dump_dir; written whole, then renamed over the
 * last dump) on SIGUSR2 (flight_catch_dump_signal), by a comm deadline before the run ends, and on grpod's request
 * (grpoctl trace RANK); flight_stack_capture has the recording thread write its native backtrace (grpoctl stacks).
 * Size 0 (trainer.flight_recorder.size) turns recording off: flight_begin returns 0 at once. */
#ifndef GRPO_WORKER_FLIGHT_FLIGHT_H
#define GRPO_WORKER_FLIGHT_FLIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What kind of wait an operation is. */
enum flight_kind {
    FLIGHT_KIND_COLLECTIVE = 0, /* every rank of a group takes part */
    FLIGHT_KIND_P2P = 1,        /* one peer of a group */
    FLIGHT_KIND_PLANE = 2,      /* a data-plane or dispatcher request */
    FLIGHT_KIND_IO = 3,         /* checkpoint files */
};

/* The operations recorded (flight_op_name: their names in dumps and messages). */
enum flight_op {
    FLIGHT_OP_ALLREDUCE,        /* "all-reduce" */
    FLIGHT_OP_ALLREDUCE_MAX,    /* "all-reduce (max)" */
    FLIGHT_OP_ALLREDUCE_BUCKET, /* "all-reduce (bucket)": the wait for a started non-blocking sum */
    FLIGHT_OP_ALLGATHER,        /* "all-gather" */
    FLIGHT_OP_REDUCE_SCATTER,   /* "reduce-scatter" */
    FLIGHT_OP_BROADCAST,        /* "broadcast" */
    FLIGHT_OP_ALLTOALL,         /* "all-to-all" */
    FLIGHT_OP_BARRIER,          /* "barrier" */
    FLIGHT_OP_TABLE_UPDATE,     /* "table update" (one-sided, rank 0's window) */
    FLIGHT_OP_SEND,             /* "send" */
    FLIGHT_OP_RECV,             /* "receive" */
    FLIGHT_OP_SENDRECV,         /* "send-receive" */
    FLIGHT_OP_WORK_REQUEST,     /* "work request": a rollout rank asks the dispatcher for a grant */
    FLIGHT_OP_WEIGHTS_FETCH,    /* "weights fetch": a policy version from the dispatcher */
    FLIGHT_OP_BATCH_PUSH,       /* "batch push": a rollout batch to a trainer, until it answers */
    FLIGHT_OP_BATCH_RECV,       /* "batch receive": a trainer waits for rollout batches */
    FLIGHT_OP_CKPT_WRITE,       /* "checkpoint write" */
    FLIGHT_OP_CKPT_READ,        /* "checkpoint read" */
    FLIGHT_OPS
};

/* One record. Times are the monotonic clock's (clock_now_s); flight_wall converts them. */
struct flight_entry {
    uint64_t id;         /* this rank's count of finished records, from 1 (0: an open wait, not in the ring yet) */
    uint64_t seq;        /* the operation's number in its group, from 1: "all-reduce #1234 of dp" (0: none) */
    uint64_t bytes;      /* this rank's buffer (0: none or unknown) */
    double began, ended; /* ended 0: still waiting */
    int32_t peer;        /* the peer (group rank) of a point-to-point operation, a broadcast's root; -1: none */
    uint16_t group;      /* flight_group's id (0: none) */
    uint8_t op;          /* enum flight_op */
    uint8_t flags;       /* FLIGHT_BACKWARD, FLIGHT_FAILED */
    int16_t phase;       /* the step's phase when it began (a grpo.Phase, proto/names.h); 0: idle */
    int16_t layer;       /* the model layer the rank was in, -1: none */
    int32_t reserved;
};
#define FLIGHT_BACKWARD 1u /* layer: the backward pass (else the forward) */
#define FLIGHT_FAILED 2u   /* ended without completing (given up past its deadline, an error) */

/* Start recording with a ring of size entries (0: off; at most FLIGHT_MAX_SIZE), from the calling thread. Again:
 * a new, empty ring (tests); the groups stay. */
#define FLIGHT_MAX_SIZE 65536
void flight_init(int size);
/* Stop recording and free the ring (tests). */
void flight_shutdown(void);
/* The ring's size (0: off). */
int flight_size(void);
/* This process's world rank, for dumps (-1 until set). */
void flight_set_rank(int rank);
/* Where dumps go (RUN_DIR/flight; created at the first dump). NULL or "": no file, log lines only. */
void flight_set_dump_dir(const char *dir);

/* A group by its short name ("dp", "tp", "world", "dispatcher") and who is in it (the world ranks as text,
 * flight_ranks_text, or a data-plane endpoint): its id for records, the same for the same name and members
 * (at most FLIGHT_MAX_GROUPS distinct ones; past that, 0). Any thread. size: the group's size (0: not a group). */
#define FLIGHT_MAX_GROUPS 512
uint16_t flight_group(const char *name, const char *members, int size);
/* A group's name, members and size ("", "", 0 for id 0 or an unknown one). */
const char *flight_group_name(uint16_t id);
const char *flight_group_members(uint16_t id);
int flight_group_size(uint16_t id);
/* n world ranks (sorted or not) as ranges, "0-4,6-7"; cut with "..." when out is too short. */
void flight_ranks_text(const int *ranks, int n, char *out, size_t len);

/* Record: the step's phase (a grpo.Phase), and the model layer entered (-1: out of the layers). Cheap relaxed
 * stores, any thread; records that begin later carry them. */
void flight_set_phase(int phase);
void flight_set_layer(int layer, bool backward);
/* The model layer set last (-1: none), and whether in the backward pass. Any thread. */
int flight_layer(bool *backward);
/* A wait begins at `now` (clock_now_s): a token for flight_end, 0 when nothing is recorded (off, another thread,
 * or waits nested deeper than 8). */
int flight_begin(enum flight_op op, uint16_t group, uint64_t seq, uint64_t bytes, int peer, double now);
/* The wait of token ended at now (failed: without completing); it goes into the ring. Token 0: nothing. */
void flight_end(int token, double now, bool failed);
/* flight_end of a wait whose size was known only at its end (a received message's bytes). */
void flight_end_bytes(int token, double now, uint64_t bytes);
/* The wait of token is forgotten, not recorded (a poll that timed out: its caller polls again). */
void flight_cancel(int token);

/* Read, from any thread: the innermost wait under way (false: none); the newest finished records, oldest
 * first, at most max (returns how many); the records made so far. */
bool flight_current(struct flight_entry *out);
int flight_snapshot(struct flight_entry *out, int max);
uint64_t flight_recorded(void);

/* Names: "all-reduce", ...; "collective", "p2p", "plane", "io". */
const char *flight_op_name(enum flight_op op);
enum flight_kind flight_op_kind(enum flight_op op);
const char *flight_kind_name(enum flight_kind kind);
/* Unix seconds of a monotonic time of this process. */
double flight_wall(double mono);
/* One record as a JSON object (one line, no newline) and as a line for people: "all-reduce #1234 of dp (ranks
 * 0-4,6-7), 4.0 KiB, 0.25 ms, phase update_actor, layer 12 backward". now: for an open wait's time so far. */
void flight_entry_json(const struct flight_entry *e, double now, char *out, size_t len);
void flight_entry_text(const struct flight_entry *e, double now, char *out, size_t len);

/* Dump the ring: DIR/rank-R.jsonl (a header line {"rank", "reason", "time", "size", "recorded"}, then the records
 * oldest first, then the open waits, "open": true), and with to_log a log line per record. Any thread but not a
 * signal handler. 0, or -1 (logged) when the file could not be written. */
int flight_dump(const char *reason, bool to_log);
/* The path flight_dump writes ("" without a dump directory). */
const char *flight_dump_path(void);
/* Write text as DIR/NAME-rank-R.txt the way flight_dump writes ("stacks": grpoctl stacks' answer). 0, or -1
 * (logged; nothing written without a dump directory). */
int flight_save_text(const char *name, const char *text);

/* SIGUSR2 dumps the ring (with log lines) and the recording thread's stack into the log, from a thread of its
 * own. Blocks SIGUSR2 in the calling thread and so in every thread it starts later: call early in main, before
 * any other thread. 0, or -1 (logged). */
int flight_catch_dump_signal(void);

/* Native stacks: flight_stack_init (on the recording thread, after flight_init) warms glibc's backtrace up (its
 * first call loads libgcc, which a signal handler must not) and installs the handler of FLIGHT_STACK_SIGNAL.
 * flight_stack_capture (another thread) signals the recording thread, whose handler writes its backtrace into a
 * memory file, waits for it at most timeout_s and copies it into out as text; -1 when the thread did not answer
 * in time or stacks are off. Captures are serialised. */
int flight_stack_init(void);
int flight_stack_capture(char *out, size_t len, double timeout_s);

#endif
