/* The flight recorder; see flight.h. The recording thread writes slots as seqlocks (an odd version while it
 * writes, the next even one when done), word by word with relaxed atomics between a release fence and a release
 * store; a reader loads the version (acquire), the words, fences (acquire) and loads the version again, keeping the
 * copy only when the two versions are the same even number. The writer never waits for a reader. */
#include "flight.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config_key_names.h"
#include "common/fs.h"
#include "common/log.h"
#include "proto/hang.h"
#include "proto/names.h"

#define WORDS (sizeof(struct flight_entry) / sizeof(uint64_t))
_Static_assert(sizeof(struct flight_entry) % sizeof(uint64_t) == 0, "a record is whole words");
#define MAX_DEPTH 8

struct slot {
    _Atomic uint64_t ver; /* odd while written */
    _Atomic uint64_t w[WORDS];
};

static struct slot *g_ring;
static _Atomic int g_size;      /* 0: off */
static _Atomic uint64_t g_head; /* records in the ring so far (the newest one's id) */
static struct slot g_cur;       /* the innermost open wait; began 0: none */
static _Atomic int g_phase, g_layer = -1, g_backward;
static _Atomic int g_rank = -1;
static _Thread_local bool t_recorder; /* this thread records */
static double g_wall_minus_mono;

/* the recording thread's own */
static struct flight_entry g_open[MAX_DEPTH];
static int g_depth;
static uint64_t g_next;

static pthread_mutex_t g_dump_mu = PTHREAD_MUTEX_INITIALIZER; /* dumps and the dump directory */
static char g_dump_dir[2048], g_dump_path[2100];

struct group {
    char name[16];
    char members[112];
    int size;
};
static struct group g_groups[FLIGHT_MAX_GROUPS]; /* [0]: none */
static _Atomic int g_ngroups = 1;
static pthread_mutex_t g_group_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- slots ---- */

static void slot_write(struct slot *s, const struct flight_entry *e)
{
    uint64_t w[WORDS];
    memcpy(w, e, sizeof w);
    const uint64_t v = atomic_load_explicit(&s->ver, memory_order_relaxed);
    atomic_store_explicit(&s->ver, v + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    for (size_t i = 0; i < WORDS; i++)
        atomic_store_explicit(&s->w[i], w[i], memory_order_relaxed);
    atomic_store_explicit(&s->ver, v + 2, memory_order_release);
}

/* A consistent copy of the slot; false when every try caught the writer at work (it was descheduled mid-write). */
static bool slot_read(struct slot *s, struct flight_entry *e)
{
    for (int tries = 0; tries < 1000; tries++) {
        const uint64_t v1 = atomic_load_explicit(&s->ver, memory_order_acquire);
        if (v1 & 1) {
            if (tries > 10)
                sched_yield();
            continue;
        }
        uint64_t w[WORDS];
        for (size_t i = 0; i < WORDS; i++)
            w[i] = atomic_load_explicit(&s->w[i], memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&s->ver, memory_order_relaxed) == v1) {
            memcpy(e, w, sizeof w);
            return true;
        }
    }
    return false;
}

/* ---- set-up ---- */

void flight_init(int size)
{
    if (size < 0)
        size = 0;
    if (size > FLIGHT_MAX_SIZE)
        size = FLIGHT_MAX_SIZE;
    atomic_store(&g_size, 0);
    free(g_ring);
    g_ring = size ? xcalloc((size_t)size, sizeof *g_ring) : NULL;
    atomic_store(&g_head, 0);
    g_next = 0;
    g_depth = 0;
    const struct flight_entry none = {0};
    slot_write(&g_cur, &none);
    g_wall_minus_mono = clock_wall_s() - clock_now_s();
    t_recorder = true;
    atomic_store(&g_size, size);
}

void flight_shutdown(void)
{
    atomic_store(&g_size, 0);
    free(g_ring);
    g_ring = NULL;
    t_recorder = false;
}

int flight_size(void) { return atomic_load(&g_size); }
void flight_set_rank(int rank) { atomic_store(&g_rank, rank); }

void flight_set_dump_dir(const char *dir)
{
    pthread_mutex_lock(&g_dump_mu);
    snprintf(g_dump_dir, sizeof g_dump_dir, "%s", dir ? dir : "");
    g_dump_path[0] = 0;
    pthread_mutex_unlock(&g_dump_mu);
}

/* ---- groups ---- */

uint16_t flight_group(const char *name, const char *members, int size)
{
    name = name ? name : "";
    members = members ? members : "";
    pthread_mutex_lock(&g_group_mu);
    const int n = atomic_load_explicit(&g_ngroups, memory_order_relaxed);
    int id = 0;
    for (int i = 1; i < n && !id; i++)
        if (strncmp(g_groups[i].name, name, sizeof g_groups[i].name - 1) == 0 &&
            strncmp(g_groups[i].members, members, sizeof g_groups[i].members - 1) == 0 && g_groups[i].size == size)
            id = i;
    if (!id && n < FLIGHT_MAX_GROUPS) {
        struct group *g = &g_groups[n];
        snprintf(g->name, sizeof g->name, "%s", name);
        snprintf(g->members, sizeof g->members, "%s", members);
        g->size = size;
        atomic_store_explicit(&g_ngroups, n + 1, memory_order_release); /* published whole */
        id = n;
    }
    pthread_mutex_unlock(&g_group_mu);
    return (uint16_t)id;
}

static const struct group *group_of(uint16_t id)
{
    static const struct group none = {"", "", 0};
    const int n = atomic_load_explicit(&g_ngroups, memory_order_acquire);
    return id > 0 && id < FLIGHT_MAX_GROUPS && id < n ? &g_groups[id] : &none;
}
const char *flight_group_name(uint16_t id) { return group_of(id)->name; }
const char *flight_group_members(uint16_t id) { return group_of(id)->members; }
int flight_group_size(uint16_t id) { return group_of(id)->size; }

static int cmp_int(const void *a, const void *b)
{
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

void flight_ranks_text(const int *ranks, int n, char *out, size_t len)
{
    if (!len)
        return;
    out[0] = 0;
    int *r = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *r);
    memcpy(r, ranks, (size_t)(n > 0 ? n : 0) * sizeof *r);
    qsort(r, (size_t)(n > 0 ? n : 0), sizeof *r, cmp_int);
    hang_ranks_text(r, n, out, len);
    free(r);
}

/* ---- recording ---- */

void flight_set_phase(int phase) { atomic_store_explicit(&g_phase, phase, memory_order_relaxed); }

void flight_set_layer(int layer, bool backward)
{
    atomic_store_explicit(&g_layer, layer, memory_order_relaxed);
    atomic_store_explicit(&g_backward, backward, memory_order_relaxed);
}

int flight_layer(bool *backward)
{
    const int layer = atomic_load_explicit(&g_layer, memory_order_relaxed);
    if (backward)
        *backward = layer >= 0 && atomic_load_explicit(&g_backward, memory_order_relaxed);
    return layer;
}

int flight_begin(enum flight_op op, uint16_t group, uint64_t seq, uint64_t bytes, int peer, double now)
{
    if (!t_recorder || !atomic_load_explicit(&g_size, memory_order_relaxed) || g_depth >= MAX_DEPTH)
        return 0;
    struct flight_entry *e = &g_open[g_depth++];
    const int layer = atomic_load_explicit(&g_layer, memory_order_relaxed);
    *e = (struct flight_entry){
        .seq = seq,
        .bytes = bytes,
        .began = now > 0 ? now : 1e-9, /* began 0 says "none" in the current slot */
        .peer = peer,
        .group = group,
        .op = (uint8_t)op,
        .flags = layer >= 0 && atomic_load_explicit(&g_backward, memory_order_relaxed) ? FLIGHT_BACKWARD : 0,
        .phase = (int16_t)atomic_load_explicit(&g_phase, memory_order_relaxed),
        .layer = (int16_t)(layer < INT16_MAX ? layer : INT16_MAX),
    };
    slot_write(&g_cur, e);
    return g_depth;
}

void flight_end(int token, double now, bool failed)
{
    const int size = atomic_load_explicit(&g_size, memory_order_relaxed);
    if (token <= 0 || !t_recorder || token > g_depth || !size)
        return;
    struct flight_entry *e = &g_open[token - 1];
    e->ended = now > e->began ? now : e->began;
    if (failed)
        e->flags |= FLIGHT_FAILED;
    e->id = ++g_next;
    slot_write(&g_ring[(e->id - 1) % (uint64_t)size], e);
    atomic_store_explicit(&g_head, e->id, memory_order_release);
    g_depth = token - 1; /* waits begun inside it (not ended: a path that left early) end with it, unrecorded */
    const struct flight_entry none = {0};
    slot_write(&g_cur, g_depth ? &g_open[g_depth - 1] : &none);
}

void flight_end_bytes(int token, double now, uint64_t bytes)
{
    if (token > 0 && t_recorder && token <= g_depth)
        g_open[token - 1].bytes = bytes;
    flight_end(token, now, false);
}

void flight_cancel(int token)
{
    if (token <= 0 || !t_recorder || token > g_depth)
        return;
    g_depth = token - 1;
    const struct flight_entry none = {0};
    slot_write(&g_cur, g_depth ? &g_open[g_depth - 1] : &none);
}

bool flight_current(struct flight_entry *out)
{
    if (!atomic_load_explicit(&g_size, memory_order_acquire))
        return false;
    return slot_read(&g_cur, out) && out->began > 0;
}

uint64_t flight_recorded(void) { return atomic_load_explicit(&g_head, memory_order_acquire); }

int flight_snapshot(struct flight_entry *out, int max)
{
    const int size = atomic_load_explicit(&g_size, memory_order_acquire);
    if (!size || max <= 0)
        return 0;
    const uint64_t head = atomic_load_explicit(&g_head, memory_order_acquire);
    uint64_t n = head < (uint64_t)size ? head : (uint64_t)size;
    if (n > (uint64_t)max)
        n = (uint64_t)max;
    int got = 0;
    for (uint64_t id = head - n + 1; id <= head; id++) {
        struct flight_entry e;
        /* a slot rewritten meanwhile by a newer record (the ring went round while we read) is left out */
        if (slot_read(&g_ring[(id - 1) % (uint64_t)size], &e) && e.id == id)
            out[got++] = e;
    }
    return got;
}

/* ---- names and formats ---- */

static const struct {
    const char *name;
    enum flight_kind kind;
} ops[FLIGHT_OPS] = {
    [FLIGHT_OP_ALLREDUCE] = {"all-reduce", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_ALLREDUCE_MAX] = {"all-reduce (max)", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_ALLREDUCE_BUCKET] = {"all-reduce (bucket)", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_ALLGATHER] = {"all-gather", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_REDUCE_SCATTER] = {"reduce-scatter", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_BROADCAST] = {"broadcast", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_ALLTOALL] = {"all-to-all", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_BARRIER] = {"barrier", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_TABLE_UPDATE] = {"table update", FLIGHT_KIND_COLLECTIVE},
    [FLIGHT_OP_SEND] = {"send", FLIGHT_KIND_P2P},
    [FLIGHT_OP_RECV] = {"receive", FLIGHT_KIND_P2P},
    [FLIGHT_OP_SENDRECV] = {"send-receive", FLIGHT_KIND_P2P},
    [FLIGHT_OP_WORK_REQUEST] = {"work request", FLIGHT_KIND_PLANE},
    [FLIGHT_OP_WEIGHTS_FETCH] = {"weights fetch", FLIGHT_KIND_PLANE},
    [FLIGHT_OP_BATCH_PUSH] = {"batch push", FLIGHT_KIND_PLANE},
    [FLIGHT_OP_BATCH_RECV] = {"batch receive", FLIGHT_KIND_PLANE},
    [FLIGHT_OP_CKPT_WRITE] = {"checkpoint write", FLIGHT_KIND_IO},
    [FLIGHT_OP_CKPT_READ] = {"checkpoint read", FLIGHT_KIND_IO},
};

const char *flight_op_name(enum flight_op op) { return (unsigned)op < FLIGHT_OPS ? ops[op].name : "unknown"; }
enum flight_kind flight_op_kind(enum flight_op op)
{
    return (unsigned)op < FLIGHT_OPS ? ops[op].kind : FLIGHT_KIND_COLLECTIVE;
}
const char *flight_kind_name(enum flight_kind kind)
{
    static const char *n[] = {"collective", "p2p", "plane", "io"};
    return (unsigned)kind < 4 ? n[kind] : "unknown";
}
double flight_wall(double mono) { return mono + g_wall_minus_mono; }

/* s as the inside of a JSON string (the names and members are ours: quotes, backslashes and controls only) */
static void json_str(const char *s, char *out, size_t len)
{
    size_t at = 0;
    for (; *s && at + 7 < len; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            at += (size_t)snprintf(out + at, len - at, "\\%c", ch);
        else if (ch < 0x20)
            at += (size_t)snprintf(out + at, len - at, "\\u%04x", ch);
        else
            out[at++] = (char)ch;
    }
    out[at < len ? at : len - 1] = 0;
}

static double took(const struct flight_entry *e, double now)
{
    const double end = e->ended > 0 ? e->ended : now;
    return end > e->began ? end - e->began : 0;
}

void flight_entry_json(const struct flight_entry *e, double now, char *out, size_t len)
{
    char group[40], members[240];
    json_str(flight_group_name(e->group), group, sizeof group);
    json_str(flight_group_members(e->group), members, sizeof members);
    const enum flight_op op = (enum flight_op)e->op;
    snprintf(out, len,
             "{\"id\":%" PRIu64 ",\"kind\":\"%s\",\"op\":\"%s\",\"group\":\"%s\",\"members\":\"%s\","
             "\"group_size\":%d,\"seq\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"peer\":%d,\"phase\":\"%s\","
             "\"layer\":%d,\"pass\":\"%s\",\"began\":%.6f,\"seconds\":%.6f,\"open\":%s,\"failed\":%s}",
             e->id, flight_kind_name(flight_op_kind(op)), flight_op_name(op), group, members,
             flight_group_size(e->group), e->seq, e->bytes, e->peer, core_phase_name((Grpo__Phase)e->phase), e->layer,
             e->layer < 0                 ? ""
             : e->flags & FLIGHT_BACKWARD ? "backward"
                                          : "forward",
             flight_wall(e->began), took(e, now), e->ended > 0 ? "false" : "true",
             e->flags & FLIGHT_FAILED ? "true" : "false");
}

void flight_entry_text(const struct flight_entry *e, double now, char *out, size_t len)
{
    const enum flight_op op = (enum flight_op)e->op;
    const char *gname = flight_group_name(e->group), *members = flight_group_members(e->group);
    const enum flight_kind kind = flight_op_kind(op);
    char what[256], size[32] = "", t[48], where[64] = "", peer[24] = "";
    if (e->seq && kind == FLIGHT_KIND_IO)
        snprintf(what, sizeof what, "%s of step %" PRIu64, flight_op_name(op), e->seq);
    else if (e->seq)
        snprintf(what, sizeof what, "%s #%" PRIu64, flight_op_name(op), e->seq);
    else
        snprintf(what, sizeof what, "%s", flight_op_name(op));
    if (e->peer >= 0)
        snprintf(peer, sizeof peer, op == FLIGHT_OP_BROADCAST ? " from root %d" : " with peer %d", e->peer);
    if (e->bytes)
        log_bytes_text(e->bytes, size, sizeof size);
    const double s = took(e, now);
    if (e->ended > 0)
        snprintf(t, sizeof t, "%s%.3f ms%s", size[0] ? ", " : "", s * 1e3, e->flags & FLIGHT_FAILED ? ", failed" : "");
    else
        snprintf(t, sizeof t, "%swaiting %.1f s so far", size[0] ? ", " : "", s);
    if (e->layer >= 0)
        snprintf(where, sizeof where, ", layer %d %s", e->layer, e->flags & FLIGHT_BACKWARD ? "backward" : "forward");
    char group[200] = "";
    if (kind == FLIGHT_KIND_IO)
        snprintf(group, sizeof group, "%s%s", members[0] ? " in " : "", members);
    else if (gname[0] && kind == FLIGHT_KIND_PLANE)
        snprintf(group, sizeof group, " to %s%s%s", gname, members[0] ? " at " : "", members);
    else if (gname[0])
        snprintf(group, sizeof group, " of %s%s%s%s", gname, members[0] ? " (ranks " : "", members,
                 members[0] ? ")" : "");
    snprintf(out, len, "%s%s%s, %s%s, phase %s%s", what, group, peer, size, t, core_phase_name((Grpo__Phase)e->phase),
             where);
}

/* ---- dumps ---- */

struct buf {
    char *p;
    size_t n, cap;
};

static void buf_line(struct buf *b, const char *line)
{
    const size_t l = strlen(line);
    if (b->n + l + 2 > b->cap) {
        b->cap = (b->n + l + 2) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, line, l);
    b->n += l;
    b->p[b->n++] = '\n';
    b->p[b->n] = 0;
}

const char *flight_dump_path(void)
{
    pthread_mutex_lock(&g_dump_mu);
    if (g_dump_dir[0])
        snprintf(g_dump_path, sizeof g_dump_path, "%s/rank-%d.jsonl", g_dump_dir, atomic_load(&g_rank));
    else
        g_dump_path[0] = 0;
    pthread_mutex_unlock(&g_dump_mu);
    return g_dump_path;
}

int flight_dump(const char *reason, bool to_log)
{
    const int size = flight_size();
    if (!size) {
        if (to_log)
            log_info("flight", "%s: the flight recorder is off (" KEY_trainer_flight_recorder_size " 0)", reason);
        return 0;
    }
    struct flight_entry *all = xcalloc((size_t)size, sizeof *all);
    const int n = flight_snapshot(all, size);
    struct flight_entry cur;
    const bool open = flight_current(&cur);
    const double now = clock_now_s();
    const uint64_t recorded = flight_recorded();
    char line[1024], why[256], host[256] = "", host_json[300];
    json_str(reason ? reason : "", why, sizeof why);
    gethostname(host, sizeof host - 1);
    json_str(host, host_json, sizeof host_json);
    bool backward;
    const int layer = flight_layer(&backward);
    struct buf b = {0};
    snprintf(line, sizeof line,
             "{\"rank\":%d,\"reason\":\"%s\",\"time\":%.6f,\"size\":%d,\"recorded\":%" PRIu64 ",\"entries\":%d,"
             "\"waiting\":%s,\"phase\":\"%s\",\"layer\":%d,\"pass\":\"%s\",\"host\":\"%s\"}",
             atomic_load(&g_rank), why, clock_wall_s(), size, recorded, n, open ? "true" : "false",
             core_phase_name((Grpo__Phase)atomic_load_explicit(&g_phase, memory_order_relaxed)), layer,
             layer < 0  ? ""
             : backward ? "backward"
                        : "forward",
             host_json);
    buf_line(&b, line);
    if (to_log)
        log_info("flight", "%s: the last %d of %" PRIu64 " waits recorded on this rank, oldest first%s", reason, n,
                 recorded, open ? " (then the one under way)" : "");
    for (int i = 0; i < n; i++) {
        flight_entry_json(&all[i], now, line, sizeof line);
        buf_line(&b, line);
        if (to_log) {
            flight_entry_text(&all[i], now, line, sizeof line);
            log_info("flight", "#%" PRIu64 " %s", all[i].id, line);
        }
    }
    if (open) {
        flight_entry_json(&cur, now, line, sizeof line);
        buf_line(&b, line);
        if (to_log) {
            flight_entry_text(&cur, now, line, sizeof line);
            log_info("flight", "under way: %s", line);
        }
    }
    free(all);
    int rc = 0;
    pthread_mutex_lock(&g_dump_mu);
    if (g_dump_dir[0]) {
        char path[2100], err[2400];
        snprintf(path, sizeof path, "%s/rank-%d.jsonl", g_dump_dir, atomic_load(&g_rank));
        if (fs_mkdir_p(g_dump_dir) != 0) {
            log_warn("flight", "%s: cannot create the dump directory: %s", g_dump_dir, check_errno_text());
            rc = -1;
        } else if (fs_write_atomic(path, b.p, b.n, err, sizeof err) != 0) {
            log_warn("flight", "%s", err);
            rc = -1;
        } else if (to_log) {
            log_info("flight", "%s: the ring is in %s", reason, path);
        }
    }
    pthread_mutex_unlock(&g_dump_mu);
    free(b.p);
    return rc;
}

int flight_save_text(const char *name, const char *text)
{
    int rc = -1;
    pthread_mutex_lock(&g_dump_mu);
    if (g_dump_dir[0]) {
        char path[2200], err[2400];
        snprintf(path, sizeof path, "%s/%s-rank-%d.txt", g_dump_dir, name, atomic_load(&g_rank));
        if (fs_mkdir_p(g_dump_dir) != 0)
            log_warn("flight", "%s: cannot create the dump directory: %s", g_dump_dir, check_errno_text());
        else if (fs_write_atomic(path, text, strlen(text), err, sizeof err) != 0)
            log_warn("flight", "%s", err);
        else
            rc = 0;
    }
    pthread_mutex_unlock(&g_dump_mu);
    return rc;
}

/* ---- SIGUSR2 ---- */

static sigset_t dump_set;

static void *dump_thread(void *arg)
{
    (void)arg;
    for (;;) {
        int sig = 0;
        if (sigwait(&dump_set, &sig) != 0)
            continue;
        flight_dump("SIGUSR2", true);
        char *text = xmalloc(16384);
        if (flight_stack_capture(text, 16384, 2.0) == 0) {
            char *save = NULL;
            log_info("flight", "SIGUSR2: the stack of the main thread:");
            for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
                log_info("flight", "  %s", l);
        }
        free(text);
    }
    return NULL;
}

int flight_catch_dump_signal(void)
{
    sigemptyset(&dump_set);
    sigaddset(&dump_set, SIGUSR2);
    int rc = pthread_sigmask(SIG_BLOCK, &dump_set, NULL);
    pthread_t th;
    if (rc == 0) {
        rc = pthread_create(&th, NULL, dump_thread, NULL);
        if (rc != 0)
            pthread_sigmask(SIG_UNBLOCK, &dump_set, NULL);
    }
    if (rc != 0) {
        log_warn("flight", "cannot take SIGUSR2 (a flight-recorder dump) in a thread: %s", strerror(rc));
        return -1;
    }
    pthread_detach(th);
    return 0;
}

/* ---- stacks ---- */

static int stack_fd = -1;
static sem_t stack_done;
static pthread_t stack_thread;
static _Atomic bool stack_ready;
static pthread_mutex_t stack_mu = PTHREAD_MUTEX_INITIALIZER;

static int stack_signal(void) { return SIGRTMIN + 6; }

/* On the recording thread: its backtrace into the memory file, then say so. Async-signal-safe once backtrace was
 * warmed up (flight_stack_init): lseek, ftruncate, write, sem_post and backtrace_symbols_fd allocate nothing. */
static void stack_handler(int sig)
{
    (void)sig;
    const int saved = errno;
    void *frames[64];
    const int n = backtrace(frames, 64);
    if (lseek(stack_fd, 0, SEEK_SET) == 0 && ftruncate(stack_fd, 0) == 0)
        backtrace_symbols_fd(frames, n, stack_fd);
    sem_post(&stack_done);
    errno = saved;
}

int flight_stack_init(void)
{
    if (atomic_load(&stack_ready))
        return 0;
    void *warm[4];
    (void)backtrace(warm, 4); /* loads libgcc now, not in the handler */
    stack_fd = memfd_create("grpo-flight-stack", MFD_CLOEXEC);
    if (stack_fd < 0 || sem_init(&stack_done, 0, 0) != 0) {
        log_warn("flight", "native stacks unavailable: %s", check_errno_text());
        return -1;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = stack_handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(stack_signal(), &sa, NULL) != 0) {
        log_warn("flight", "native stacks unavailable: %s", check_errno_text());
        return -1;
    }
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, stack_signal());
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    stack_thread = pthread_self();
    atomic_store(&stack_ready, true);
    return 0;
}

int flight_stack_capture(char *out, size_t len, double timeout_s)
{
    if (!len)
        return -1;
    out[0] = 0;
    if (!atomic_load(&stack_ready))
        return -1;
    pthread_mutex_lock(&stack_mu);
    while (sem_trywait(&stack_done) == 0) /* an answer that came after an earlier capture gave up */
        ;
    int rc = pthread_kill(stack_thread, stack_signal());
    if (rc == 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        const double s = timeout_s > 0 ? timeout_s : 0;
        until.tv_sec += (time_t)s;
        until.tv_nsec += (long)((s - floor(s)) * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        while ((rc = sem_timedwait(&stack_done, &until)) != 0 && errno == EINTR)
            ;
    }
    if (rc == 0) {
        const ssize_t n = pread(stack_fd, out, len - 1, 0);
        out[n > 0 ? n : 0] = 0;
        rc = n > 0 ? 0 : -1;
    }
    pthread_mutex_unlock(&stack_mu);
    return rc;
}
