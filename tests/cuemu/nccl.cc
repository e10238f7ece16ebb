// cuemu: NCCL between processes on one host (tests/cuemu/NCCL.md). Each rank is a process with its own emulated
// device; a communicator is a POSIX shared-memory object named by the unique id (a header: per rank its pid, device,
// the last operation it published and the last it completed), and each rank publishes its part of an operation
// (its send buffers, with a descriptor per call) in a shared-memory data object of its own. An operation completes
// at a rank once every rank has published it: the rank reads every part and writes its receive buffers.
//
// As on a GPU the calls return at once: the operation is pending on its stream, and it progresses in the background
// (a thread per process) and whenever the runtime is asked about or orders work behind the stream
// (nccl_hooks.h). Operations of a communicator run in the order they were issued, one at a time: a rank publishes
// operation k once every rank has completed k - 1 (so a data object is never overwritten while read).
//
// Reductions fold the ranks' parts in rank order ((r0 + r1) + r2 ...), the same on every rank. Calls are checked as
// NCCL cannot: buffers must be device memory, and the ranks' collectives (kind, type, count, operator, root) and
// sends and receives (bytes) must match; a mismatch fails the communicator (ncclInvalidUsage) with a message where a
// GPU would hang or corrupt memory.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "nccl.h"
#include "nccl_hooks.h"

namespace
{

const int kMaxRanks = 64;
const char kIdPrefix[] = "cuemu-nccl:";

// ---- the shared header of a communicator (zeroed by ftruncate when created) ----

struct shm_rank {
    int32_t pid; // 0 until the rank has joined
    int32_t device;
    int32_t aborted;
    int32_t pad;
    uint64_t pub_seq;  // the last operation whose part is in its data object
    uint64_t done_seq; // the last operation it completed (it has read every part of it)
    uint64_t data_gen; // its data object's generation (0: none yet)
    uint64_t data_size;
    uint64_t mapped_gen[kMaxRanks]; // the generation of rank j's data object that this rank has mapped
};

struct shm_header {
    int32_t nranks; // set by the first rank to join
    int32_t pad;
    shm_rank r[kMaxRanks];
};

template <class T> T ld(const T *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
template <class T> void st(T *p, T v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

// ---- a rank's part of an operation, in its data object ----

enum kind { ALLREDUCE, ALLGATHER, REDUCESCATTER, BROADCAST, SEND, RECV };
const char *kind_name(int k)
{
    static const char *n[] = {"all-reduce", "all-gather", "reduce-scatter", "broadcast", "send", "receive"};
    return k >= 0 && k <= RECV ? n[k] : "?";
}

struct blob_head {
    uint64_t seq, ntasks;
};
struct blob_task {
    int32_t kind, type, op, peer;  // peer: the root of a broadcast, the other rank of a send or receive
    uint64_t count, offset, bytes; // offset: of its data from the blob's start
};

// ---- this process's view ----

struct task {
    int kind;
    ncclDataType_t type;
    ncclRedOp_t op;
    size_t count;
    int peer;
    const void *send;
    void *recv;
};

struct cuemu_op {
    struct cuemu_nccl_comm *c;
    std::vector<task> tasks;
    uint64_t seq, gseq;
    cudaStream_t stream;
    bool stream_nonblocking;
    bool published;
};

struct peer_map {
    char *p;
    size_t len;
    uint64_t gen;
};

enum state { INIT, READY, FAILED, ABORTED, DESTROYED };

} // namespace

struct cuemu_nccl_comm {
    int rank, nranks, device;
    bool blocking;
    int state;
    ncclResult_t error; // FAILED: why
    bool finalizing;
    std::string id; // the unique id's text: the names of the shared objects
    shm_header *h;
    bool h_unlinked;
    char *data; // this rank's data object
    size_t data_len;
    uint64_t data_gen;
    bool data_unlinked;
    std::vector<peer_map> peers;
    std::deque<cuemu_op *> q;
    uint64_t last_seq; // the last operation issued
    int waiting_for;   // the rank the head operation waits for (-1: none)
    double last_alive_check;
};

namespace
{

struct global {
    std::mutex m;
    std::vector<cuemu_nccl_comm *> comms; // live ones
    uint64_t gseq = 0;                    // operations issued by this process
    std::atomic<long> npending{0};
    std::atomic<bool> thread_started{false};
};
// never destroyed: the progress thread may run while the process exits
global *G()
{
    static global *g = new global;
    return g;
}

thread_local int group_depth;
struct group_call {
    cuemu_nccl_comm *c;
    task t;
    cudaStream_t stream;
};
thread_local std::vector<group_call> *group_calls;

double now()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void nap(long spins)
{
    struct timespec t = {0, spins < 200 ? 20000 : spins < 2000 ? 200000 : 1000000};
    nanosleep(&t, NULL);
}

double hang_s()
{
    const char *s = getenv("CUEMU_NCCL_HANG_S");
    return s && *s ? atof(s) : 600.0;
}

// CUEMU_NCCL_PEER_LOSS=silent: a peer that exited or aborted is not noticed (as NCCL over a node's shared memory or
// NVLink may never notice a dead peer): what waits for it stays pending, so the caller's deadline, or its own word
// of the loss (the project asks MPI), decides
bool peer_loss_silent()
{
    static int silent = -1;
    if (silent < 0) {
        const char *s = getenv("CUEMU_NCCL_PEER_LOSS");
        silent = s && strcmp(s, "silent") == 0;
    }
    return silent == 1;
}

ncclResult_t say(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t say(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cuemu_vsay(fmt, ap);
    va_end(ap);
    return r;
}

size_t type_size(int t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    }
    return 0;
}

std::string header_name(const cuemu_nccl_comm *c) { return "/cuemu-nccl-" + c->id; }
std::string data_name(const cuemu_nccl_comm *c, int rank, uint64_t gen, int pid)
{
    char s[96];
    snprintf(s, sizeof s, "-r%dg%llu-p%d", rank, (unsigned long long)gen, pid);
    return "/cuemu-nccl-" + c->id + s;
}

// ---- reductions: out = op(out, in), element by element ----

template <class T> T apply(int op, T a, T b)
{
    if constexpr (std::is_integral<T>::value) {
        typedef typename std::make_unsigned<T>::type U; // wrapping, as a GPU's integer arithmetic
        switch (op) {
        case ncclSum: return (T)(U)((U)a + (U)b);
        case ncclProd: return (T)(U)((U)a * (U)b);
        }
    } else {
        switch (op) {
        case ncclSum: return a + b;
        case ncclProd: return a * b;
        }
    }
    return op == ncclMax ? (b > a ? b : a) : (b < a ? b : a);
}

template <class T> void fold_t(void *out, const void *in, size_t n, int op)
{
    T *o = (T *)out;
    const T *x = (const T *)in;
    for (size_t i = 0; i < n; i++)
        o[i] = apply<T>(op, o[i], x[i]);
}

void fold(int type, int op, void *out, const void *in, size_t n)
{
    switch (type) {
    case ncclInt8: fold_t<int8_t>(out, in, n, op); break;
    case ncclUint8: fold_t<uint8_t>(out, in, n, op); break;
    case ncclInt32: fold_t<int32_t>(out, in, n, op); break;
    case ncclUint32: fold_t<uint32_t>(out, in, n, op); break;
    case ncclInt64: fold_t<int64_t>(out, in, n, op); break;
    case ncclUint64: fold_t<uint64_t>(out, in, n, op); break;
    case ncclFloat32: fold_t<float>(out, in, n, op); break;
    case ncclFloat64: fold_t<double>(out, in, n, op); break;
    }
}

// ---- the life of an operation ----

void fail_comm(cuemu_nccl_comm *c, ncclResult_t why);

// The pending operations are dropped (their receive buffers are not written).
void drop_ops(cuemu_nccl_comm *c)
{
    G()->npending -= (long)c->q.size();
    for (cuemu_op *o : c->q)
        delete o;
    c->q.clear();
}

void fail_comm(cuemu_nccl_comm *c, ncclResult_t why)
{
    if (c->state == READY || c->state == INIT) {
        c->state = FAILED;
        c->error = why;
    }
    if (!c->q.empty())
        cuemu_say("NCCL rank %d of %d: %zu pending operation(s) dropped (%s)", c->rank, c->nranks, c->q.size(),
                  ncclGetErrorString(why));
    drop_ops(c);
}

// Makes this rank's data object hold at least `bytes` (a new generation when it grows); false on failure.
bool data_reserve(cuemu_nccl_comm *c, size_t bytes)
{
    if (c->data && c->data_len >= bytes)
        return true;
    size_t len = c->data_len ? c->data_len : 64 * 1024;
    while (len < bytes)
        len *= 2;
    if (c->data) { // every rank is done with the old one (the caller waited): no one opens it again
        munmap(c->data, c->data_len);
        if (!c->data_unlinked)
            shm_unlink(data_name(c, c->rank, c->data_gen, getpid()).c_str());
        c->data = NULL;
    }
    uint64_t gen = c->data_gen + 1;
    std::string name = data_name(c, c->rank, gen, getpid());
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        say(ncclSystemError, "NCCL rank %d: shm_open(%s): %s", c->rank, name.c_str(), strerror(errno));
        return false;
    }
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name.c_str());
        say(ncclSystemError, "NCCL rank %d: %zu bytes of shared memory (%s): %s", c->rank, len, name.c_str(),
            strerror(err));
        return false;
    }
    c->data = (char *)p;
    c->data_len = len;
    c->data_gen = gen;
    c->data_unlinked = false;
    shm_rank *me = &c->h->r[c->rank];
    st(&me->data_size, (uint64_t)len);
    st(&me->data_gen, gen);
    return true;
}

// The rank that holds c's head operation back, or -1 when every rank has completed operation seq - 1.
int first_behind(cuemu_nccl_comm *c, uint64_t seq)
{
    for (int r = 0; r < c->nranks; r++)
        if (ld(&c->h->r[r].done_seq) + 1 < seq)
            return r;
    return -1;
}

size_t task_bytes(const cuemu_nccl_comm *c, const task &t)
{
    const size_t es = type_size(t.type);
    switch (t.kind) {
    case ALLREDUCE:
    case ALLGATHER:
    case SEND: return t.count * es;
    case REDUCESCATTER: return t.count * es * (size_t)c->nranks;
    case BROADCAST: return t.peer == c->rank ? t.count * es : 0;
    }
    return 0; // RECV
}

// Publishes this rank's part of the head operation, once every rank has completed the one before.
bool try_publish(cuemu_nccl_comm *c, cuemu_op *o)
{
    cuemu::device_scope device; // the send buffers are device memory
    int behind = first_behind(c, o->seq);
    if (behind >= 0) {
        c->waiting_for = behind;
        return false;
    }
    size_t off = (sizeof(blob_head) + o->tasks.size() * sizeof(blob_task) + 63) & ~(size_t)63;
    std::vector<blob_task> bt(o->tasks.size());
    for (size_t i = 0; i < o->tasks.size(); i++) {
        const task &t = o->tasks[i];
        bt[i] = blob_task{t.kind, (int32_t)t.type, (int32_t)t.op, t.peer, t.count, off, task_bytes(c, t)};
        off = (off + bt[i].bytes + 63) & ~(size_t)63;
    }
    if (!data_reserve(c, off)) {
        fail_comm(c, ncclSystemError);
        return false;
    }
    blob_head hd = {o->seq, o->tasks.size()};
    memcpy(c->data, &hd, sizeof hd);
    memcpy(c->data + sizeof hd, bt.data(), bt.size() * sizeof(blob_task));
    for (size_t i = 0; i < o->tasks.size(); i++)
        if (bt[i].bytes)
            memcpy(c->data + bt[i].offset, o->tasks[i].send, bt[i].bytes);
    st(&c->h->r[c->rank].pub_seq, o->seq);
    o->published = true;
    return true;
}

// Maps rank r's current data object; NULL when it cannot (the rank has gone).
const char *peer_data(cuemu_nccl_comm *c, int r)
{
    const shm_rank *pr = &c->h->r[r];
    uint64_t gen = ld(&pr->data_gen);
    peer_map &m = c->peers[(size_t)r];
    if (r == c->rank)
        return c->data;
    if (m.p && m.gen == gen)
        return m.p;
    if (m.p)
        munmap(m.p, m.len);
    m.p = NULL;
    size_t len = ld(&pr->data_size);
    std::string name = data_name(c, r, gen, ld(&pr->pid));
    int fd = shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0) {
        say(ncclRemoteError, "NCCL rank %d: the data of rank %d (%s) is gone: %s", c->rank, r, name.c_str(),
            strerror(errno));
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        say(ncclSystemError, "NCCL rank %d: mapping the data of rank %d: %s", c->rank, r, strerror(errno));
        return NULL;
    }
    m.p = (char *)p;
    m.len = len;
    m.gen = gen;
    st(&c->h->r[c->rank].mapped_gen[r], gen);
    return m.p;
}

bool mismatch(cuemu_nccl_comm *c, const cuemu_op *o, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool mismatch(cuemu_nccl_comm *c, const cuemu_op *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr,
            "cuemu: NCCL rank %d of %d, operation %llu: the ranks' calls do not match (a GPU would hang): ", c->rank,
            c->nranks, (unsigned long long)o->seq);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fail_comm(c, ncclInvalidUsage);
    return false;
}

// Completes the head operation (published) once every rank has published it: checks that the ranks' calls match,
// then writes this rank's receive buffers.
bool try_complete(cuemu_nccl_comm *c, cuemu_op *o)
{
    cuemu::device_scope device; // the receive buffers are device memory
    const int n = c->nranks, me = c->rank;
    for (int r = 0; r < n; r++)
        if (ld(&c->h->r[r].pub_seq) < o->seq) {
            c->waiting_for = r;
            return false;
        }
    std::vector<const char *> blob((size_t)n);
    std::vector<const blob_task *> tasks((size_t)n);
    std::vector<uint64_t> ntasks((size_t)n);
    for (int r = 0; r < n; r++) {
        blob[(size_t)r] = peer_data(c, r);
        if (!blob[(size_t)r]) {
            fail_comm(c, ncclRemoteError);
            return false;
        }
        blob_head hd;
        memcpy(&hd, blob[(size_t)r], sizeof hd);
        if (hd.seq != o->seq) {
            say(ncclInternalError, "NCCL rank %d: rank %d's data holds operation %llu, not %llu", me, r,
                (unsigned long long)hd.seq, (unsigned long long)o->seq);
            fail_comm(c, ncclInternalError);
            return false;
        }
        ntasks[(size_t)r] = hd.ntasks;
        tasks[(size_t)r] = (const blob_task *)(blob[(size_t)r] + sizeof hd);
    }
    // the collectives, the j-th of every rank together
    std::vector<std::vector<const blob_task *>> coll((size_t)n);
    for (int r = 0; r < n; r++)
        for (uint64_t i = 0; i < ntasks[(size_t)r]; i++)
            if (tasks[(size_t)r][i].kind < SEND)
                coll[(size_t)r].push_back(&tasks[(size_t)r][i]);
    for (int r = 1; r < n; r++)
        if (coll[(size_t)r].size() != coll[0].size())
            return mismatch(c, o, "rank 0 calls %zu collective(s), rank %d %zu", coll[0].size(), r,
                            coll[(size_t)r].size());
    for (size_t j = 0; j < coll[0].size(); j++) {
        const blob_task *a = coll[0][j];
        for (int r = 1; r < n; r++) {
            const blob_task *b = coll[(size_t)r][j];
            if (a->kind != b->kind || a->type != b->type || a->count != b->count ||
                ((a->kind == ALLREDUCE || a->kind == REDUCESCATTER) && a->op != b->op) ||
                (a->kind == BROADCAST && a->peer != b->peer))
                return mismatch(c, o,
                                "collective %zu is a %s (type %d, count %llu, op %d, root %d) on rank 0 but a %s "
                                "(type %d, count %llu, op %d, root %d) on rank %d",
                                j, kind_name(a->kind), a->type, (unsigned long long)a->count, a->op, a->peer,
                                kind_name(b->kind), b->type, (unsigned long long)b->count, b->op, b->peer, r);
        }
    }
    // the point-to-point calls: my k-th receive from p is p's k-th send to me
    std::vector<std::vector<const blob_task *>> sends_to_me((size_t)n);
    for (int r = 0; r < n; r++)
        for (uint64_t i = 0; i < ntasks[(size_t)r]; i++)
            if (tasks[(size_t)r][i].kind == SEND && tasks[(size_t)r][i].peer == me)
                sends_to_me[(size_t)r].push_back(&tasks[(size_t)r][i]);
    std::vector<size_t> used((size_t)n);
    std::vector<const blob_task *> recv_from(o->tasks.size());
    for (size_t i = 0; i < o->tasks.size(); i++) {
        const task &t = o->tasks[i];
        if (t.kind != RECV)
            continue;
        size_t k = used[(size_t)t.peer]++;
        if (k >= sends_to_me[(size_t)t.peer].size())
            return mismatch(c, o, "rank %d receives %zu time(s) from rank %d, which sends it %zu", me, k + 1, t.peer,
                            sends_to_me[(size_t)t.peer].size());
        const blob_task *s = sends_to_me[(size_t)t.peer][k];
        if (s->bytes != t.count * type_size(t.type))
            return mismatch(c, o, "receive %zu of rank %d from rank %d is %zu bytes, the send %llu bytes", k + 1, me,
                            t.peer, t.count * type_size(t.type), (unsigned long long)s->bytes);
        recv_from[i] = s;
    }
    for (int r = 0; r < n; r++)
        if (used[(size_t)r] != sends_to_me[(size_t)r].size())
            return mismatch(c, o, "rank %d sends rank %d %zu time(s), which receives %zu", r, me,
                            sends_to_me[(size_t)r].size(), used[(size_t)r]);
    // the results
    size_t j = 0;
    for (size_t i = 0; i < o->tasks.size(); i++) {
        const task &t = o->tasks[i];
        const size_t es = type_size(t.type), bytes = t.count * es;
        if (t.kind == RECV) {
            if (bytes)
                memcpy(t.recv, blob[(size_t)t.peer] + recv_from[i]->offset, bytes);
            continue;
        }
        if (t.kind == SEND)
            continue;
        const size_t jj = j++;
        auto part = [&](int r) { return blob[(size_t)r] + coll[(size_t)r][jj]->offset; };
        switch (t.kind) {
        case ALLREDUCE:
        case REDUCESCATTER: {
            const size_t at = t.kind == REDUCESCATTER ? (size_t)me * bytes : 0;
            memcpy(t.recv, part(0) + at, bytes);
            for (int r = 1; r < n; r++)
                fold(t.type, t.op, t.recv, part(r) + at, t.count);
            break;
        }
        case ALLGATHER:
            for (int r = 0; r < n; r++)
                memcpy((char *)t.recv + (size_t)r * bytes, part(r), bytes);
            break;
        case BROADCAST: memcpy(t.recv, part(t.peer), bytes); break;
        }
    }
    st(&c->h->r[me].done_seq, o->seq);
    // this rank's data object, once every rank has it mapped, needs no name
    if (c->data && !c->data_unlinked) {
        bool all = true;
        for (int r = 0; r < n && all; r++)
            all = r == me || ld(&c->h->r[r].mapped_gen[me]) == c->data_gen;
        if (all) {
            shm_unlink(data_name(c, me, c->data_gen, getpid()).c_str());
            c->data_unlinked = true;
        }
    }
    return true;
}

// A rank that has aborted the communicator, or the rank waited for when it has exited (a rank that finished its
// part may exit), fails the communicator (ncclRemoteError).
void check_peer(cuemu_nccl_comm *c, int waited)
{
    if (peer_loss_silent())
        return;
    for (int r = 0; r < c->nranks; r++)
        if (r != c->rank && ld(&c->h->r[r].aborted)) {
            say(ncclRemoteError, "NCCL rank %d of %d: rank %d has aborted the communicator", c->rank, c->nranks, r);
            fail_comm(c, ncclRemoteError);
            return;
        }
    if (waited < 0 || waited == c->rank)
        return;
    const shm_rank *pr = &c->h->r[waited];
    double t = now();
    if (t - c->last_alive_check < 0.5)
        return;
    c->last_alive_check = t;
    int pid = ld(&pr->pid);
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
        say(ncclRemoteError, "NCCL rank %d of %d: rank %d (pid %d) has exited", c->rank, c->nranks, waited, pid);
        fail_comm(c, ncclRemoteError);
    }
}

// Set-up: every rank has joined (then the header needs no name); two ranks on one device fail it, as in NCCL.
void check_joined(cuemu_nccl_comm *c)
{
    if (c->state != INIT)
        return;
    for (int r = 0; r < c->nranks; r++)
        if (!ld(&c->h->r[r].pid)) {
            c->waiting_for = r;
            return;
        }
    if (!c->h_unlinked) {
        shm_unlink(header_name(c).c_str());
        c->h_unlinked = true;
    }
    for (int r = 0; r < c->nranks; r++)
        for (int s = r + 1; s < c->nranks; s++)
            if (ld(&c->h->r[r].device) == ld(&c->h->r[s].device)) {
                say(ncclInvalidUsage,
                    "ncclCommInitRankConfig: ranks %d and %d are both on device %d (NCCL refuses "
                    "two ranks on one GPU; CUEMU_DEVICES sets the device count)",
                    r, s, ld(&c->h->r[r].device));
                fail_comm(c, ncclInvalidUsage);
                return;
            }
    c->state = READY;
    c->waiting_for = -1;
}

void progress_comm(cuemu_nccl_comm *c)
{
    if (c->state == INIT) {
        check_joined(c);
        if (c->state == INIT)
            check_peer(c, -1); // a rank that joined and aborted
    }
    if (c->state != READY)
        return;
    c->waiting_for = -1;
    while (!c->q.empty() && c->state == READY) {
        cuemu_op *o = c->q.front();
        if (!o->published && !try_publish(c, o))
            break;
        if (c->state != READY || !try_complete(c, o))
            break;
        c->q.pop_front();
        delete o;
        G()->npending--;
        c->waiting_for = -1;
    }
    if (!c->q.empty() && c->state == READY)
        check_peer(c, c->waiting_for);
}

// finalize: every operation of this rank done, and every rank done with its parts
bool finalized(cuemu_nccl_comm *c)
{
    if (c->state != READY)
        return true;
    progress_comm(c);
    if (!c->q.empty())
        return false;
    int behind = first_behind(c, c->last_seq + 1);
    if (behind >= 0) {
        c->waiting_for = behind;
        check_peer(c, behind);
        return c->state != READY;
    }
    return true;
}

void progress_all()
{
    for (cuemu_nccl_comm *c : G()->comms)
        progress_comm(c);
}

void progress_thread()
{
    global *g = G();
    for (long spins = 0;; spins++) {
        bool busy;
        {
            std::lock_guard<std::mutex> l(g->m);
            progress_all();
            busy = g->npending > 0;
        }
        if (!busy)
            spins = 2000; // idle: a millisecond between looks
        nap(spins);
    }
}

void start_thread()
{
    global *g = G();
    if (g->thread_started)
        return;
    g->thread_started = true;
    std::thread(progress_thread).detach();
}

void unlink_names();

// Waits (the lock held between looks) until done(c) holds; past hang_s the process stops.
template <class F> void wait_for(cuemu_nccl_comm *c, std::unique_lock<std::mutex> &l, const char *what, F done)
{
    const double t0 = now(), limit = hang_s();
    for (long spins = 0; !done(); spins++) {
        if (now() - t0 > limit) {
            cuemu_say("%s (NCCL rank %d of %d) has waited %.0f s for rank %d", what, c->rank, c->nranks, limit,
                      c->waiting_for);
            fflush(stderr);
            unlink_names();
            abort();
        }
        l.unlock();
        nap(spins);
        l.lock();
    }
}

// The shared objects: this rank's names unlinked (the header's too: a rank that has not joined never will), the
// mappings released.
void release(cuemu_nccl_comm *c)
{
    drop_ops(c);
    if (c->data) {
        munmap(c->data, c->data_len);
        c->data = NULL;
    }
    if (c->data_gen && !c->data_unlinked)
        shm_unlink(data_name(c, c->rank, c->data_gen, getpid()).c_str());
    c->data_unlinked = true;
    for (peer_map &m : c->peers)
        if (m.p)
            munmap(m.p, m.len);
    c->peers.clear();
    if (!c->h_unlinked)
        shm_unlink(header_name(c).c_str());
    c->h_unlinked = true;
    if (c->h)
        munmap(c->h, sizeof *c->h);
    c->h = NULL;
    auto &v = G()->comms;
    for (size_t i = 0; i < v.size(); i++)
        if (v[i] == c) {
            v.erase(v.begin() + (long)i);
            break;
        }
}

// This process's names (its data objects; the headers of set-ups not completed), before it exits or stops: a rank
// that is gone is waited for no more (its peers see it gone). The lock is held.
void unlink_names()
{
    for (cuemu_nccl_comm *c : G()->comms) {
        if (c->data_gen && !c->data_unlinked)
            shm_unlink(data_name(c, c->rank, c->data_gen, getpid()).c_str());
        c->data_unlinked = true;
        if (!c->h_unlinked && c->state == INIT)
            shm_unlink(header_name(c).c_str());
    }
}

void at_exit()
{
    global *g = G();
    for (int i = 0; !g->m.try_lock(); i++) { // the progress thread holds it for moments only
        if (i == 100)
            return;
        usleep(1000);
    }
    unlink_names();
    g->m.unlock();
}

// What a process killed outright left in /dev/shm: objects named for a process that no longer exists, a minute
// old or more (an object of a live run in another PID namespace sharing /dev/shm could match; none is expected).
void sweep_orphans()
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    time_t t = time(NULL);
    while (struct dirent *e = readdir(d)) {
        if (strncmp(e->d_name, "cuemu-nccl-", 11) != 0)
            continue;
        const char *p = strrchr(e->d_name, '-');
        if (!p || p[1] != 'p')
            continue;
        int pid = atoi(p + 2);
        struct stat sb;
        std::string path = std::string("/dev/shm/") + e->d_name;
        if (pid <= 0 || stat(path.c_str(), &sb) != 0 || t - sb.st_ctime < 60)
            continue;
        if (kill(pid, 0) != 0 && errno == ESRCH)
            shm_unlink((std::string("/") + e->d_name).c_str());
    }
    closedir(d);
}

// a communicator already aborted or destroyed: refused, naming the call (ncclSuccess when it is live)
ncclResult_t refuse_ended(const cuemu_nccl_comm *c, const char *call)
{
    if (c->state != ABORTED && c->state != DESTROYED)
        return ncclSuccess;
    return say(ncclInvalidUsage, "%s: the communicator was %s", call,
               c->state == ABORTED ? "aborted (ncclCommAbort)" : "destroyed");
}

cuemu_nccl_comm *usable(cuemu_nccl_comm *c, const char *call, ncclResult_t *rc)
{
    *rc = ncclSuccess;
    if (!c) {
        *rc = say(ncclInvalidArgument, "%s: a NULL communicator", call);
        return NULL;
    }
    if ((*rc = refuse_ended(c, call)) != ncclSuccess)
        return NULL;
    if (c->finalizing) {
        *rc = say(ncclInvalidUsage, "%s: the communicator is finalized", call);
        return NULL;
    }
    return c;
}

// The checks of one call, before it is queued or recorded in a group.
ncclResult_t check_task(const char *call, cuemu_nccl_comm *c, const task &t)
{
    const size_t es = type_size(t.type);
    if (!es)
        return say(ncclInvalidArgument, "%s: data type %d", call, (int)t.type);
    if ((t.kind == ALLREDUCE || t.kind == REDUCESCATTER) &&
        (t.type == ncclFloat16 || (t.op != ncclSum && t.op != ncclProd && t.op != ncclMax && t.op != ncclMin)))
        return say(ncclInvalidArgument, "%s: reduction %d on type %d is not emulated", call, (int)t.op, (int)t.type);
    if ((t.kind == BROADCAST || t.kind == SEND || t.kind == RECV) && (t.peer < 0 || t.peer >= c->nranks))
        return say(ncclInvalidArgument, "%s: rank %d of a communicator of %d", call, t.peer, c->nranks);
    size_t sbytes = task_bytes(c, t), rbytes = t.count * es;
    if (t.kind == ALLGATHER)
        rbytes *= (size_t)c->nranks;
    if (t.kind == SEND)
        rbytes = 0;
    if (t.kind == BROADCAST && t.peer != c->rank)
        sbytes = 0;
    const struct {
        const void *p;
        size_t bytes;
        const char *what;
    } bufs[2] = {{t.send, sbytes, "send"}, {t.recv, rbytes, "receive"}};
    for (const auto &b : bufs) {
        if (!b.bytes)
            continue;
        int k0 = cuemu_pointer_kind(b.p), k1 = cuemu_pointer_kind((const char *)b.p + b.bytes - 1);
        if (k0 != 1 || k1 != 1)
            return say(ncclInvalidArgument,
                       "%s: the %s buffer %p (%zu bytes) is %s, not device memory (NCCL needs "
                       "memory from cudaMalloc)",
                       call, b.what, b.p, b.bytes,
                       k0 == 2   ? "pinned host memory"
                       : k0 == 0 ? "host memory"
                                 : "not inside one device allocation");
    }
    return ncclSuccess;
}

// Queues an operation (the tasks of one comm) on stream s; the lock is held.
ncclResult_t enqueue(const char *call, cuemu_nccl_comm *c, std::vector<task> tasks, cudaStream_t s)
{
    if (cuemu_stream_captures(s))
        return say(ncclInvalidUsage, "%s: on a stream that captures a CUDA graph (collectives in a graph are not emulated)",
                   call);
    if (c->state == INIT)
        check_joined(c);
    if (c->state == INIT)
        return say(ncclInvalidUsage,
                   "%s: the communicator's set-up has not completed (ncclCommGetAsyncError says "
                   "ncclInProgress until it has)",
                   call);
    if (c->state == FAILED)
        return c->error;
    cuemu_op *o = new cuemu_op;
    o->c = c;
    o->tasks = std::move(tasks);
    o->seq = ++c->last_seq;
    o->gseq = ++G()->gseq;
    o->stream = s;
    o->stream_nonblocking = (cuemu_stream_flags(s) & cudaStreamNonBlocking) != 0;
    o->published = false;
    c->q.push_back(o);
    G()->npending++;
    progress_comm(c); // publishes this rank's part at once when it can
    return ncclSuccess;
}

ncclResult_t call(const char *name, cuemu_nccl_comm *comm, task t, cudaStream_t s)
{
    ncclResult_t rc;
    std::lock_guard<std::mutex> l(G()->m);
    cuemu_nccl_comm *c = usable(comm, name, &rc);
    if (!c)
        return rc;
    if ((rc = check_task(name, c, t)) != ncclSuccess)
        return rc;
    if (group_depth > 0) {
        if (!group_calls)
            group_calls = new std::vector<group_call>;
        group_calls->push_back(group_call{c, t, s});
        return ncclSuccess;
    }
    std::vector<task> v(1, t);
    return enqueue(name, c, v, s);
}

} // namespace

// ---- the runtime's side (nccl_hooks.h) ----

extern "C" uint64_t cuemu_nccl_mark(void)
{
    global *g = G();
    if (g->npending == 0 && !g->thread_started)
        return 0;
    std::lock_guard<std::mutex> l(g->m);
    return g->gseq;
}

extern "C" bool cuemu_nccl_progress(bool block, cudaStream_t only, uint64_t mark)
{
    global *g = G();
    if (g->npending.load() == 0)
        return true;
    const bool only_blocking =
        only != NULL && only != CUEMU_ALL_STREAMS && !(cuemu_stream_flags(only) & cudaStreamNonBlocking);
    const double t0 = now(), limit = hang_s();
    for (long spins = 0;; spins++) {
        cuemu_nccl_comm *held = NULL;
        {
            std::lock_guard<std::mutex> l(g->m);
            progress_all();
            for (cuemu_nccl_comm *c : g->comms)
                for (cuemu_op *o : c->q) {
                    if (o->gseq > mark)
                        continue;
                    if (only == CUEMU_ALL_STREAMS || o->stream == only || (only == NULL && !o->stream_nonblocking) ||
                        (o->stream == NULL && only_blocking)) {
                        held = c;
                        break;
                    }
                }
            if (!held)
                return true;
            if (!block)
                return false;
            if (now() - t0 > limit) {
                cuemu_say("an NCCL operation has waited %.0f s for rank %d (NCCL rank %d of %d)", limit,
                          held->waiting_for, held->rank, held->nranks);
                fflush(stderr);
                unlink_names();
                abort();
            }
        }
        nap(spins);
    }
}

extern "C" {

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return say(ncclInvalidArgument, "ncclGetUniqueId: a NULL id");
    static std::atomic<unsigned> counter{0};
    unsigned long long rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        rnd = (unsigned long long)now() * 1000003ull;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "%s%llx-%llx-%x-%016llx-p%d", kIdPrefix, (unsigned long long)t.tv_sec,
             (unsigned long long)t.tv_nsec, counter++, rnd, (int)getpid());
    sweep_orphans();
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config)
{
    if (!comm)
        return say(ncclInvalidArgument, "ncclCommInitRankConfig: a NULL result pointer");
    *comm = NULL;
    if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
        return say(ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of %d (the emulation takes 1 to %d ranks)",
                   rank, nranks, kMaxRanks);
    id.internal[sizeof id.internal - 1] = 0;
    if (strncmp(id.internal, kIdPrefix, sizeof kIdPrefix - 1) != 0 || strchr(id.internal, '/'))
        return say(ncclInvalidArgument, "ncclCommInitRankConfig: not an id from ncclGetUniqueId");
    int device = 0;
    cudaGetDevice(&device);
    cuemu_nccl_comm *c = new cuemu_nccl_comm();
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    c->blocking = !config || config->blocking != 0;
    c->state = INIT;
    c->error = ncclSuccess;
    c->id = id.internal + sizeof kIdPrefix - 1;
    c->waiting_for = -1;
    c->peers.assign((size_t)nranks, peer_map{NULL, 0, 0});
    std::string name = header_name(c);
    int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
    struct stat sb;
    void *p = MAP_FAILED;
    if (fd >= 0 && fstat(fd, &sb) == 0 &&
        ((size_t)sb.st_size >= sizeof(shm_header) || ftruncate(fd, (off_t)sizeof(shm_header)) == 0))
        p = mmap(NULL, sizeof(shm_header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    if (fd >= 0)
        close(fd);
    if (p == MAP_FAILED) {
        delete c;
        return say(ncclSystemError, "ncclCommInitRankConfig: shared memory %s: %s", name.c_str(), strerror(err));
    }
    c->h = (shm_header *)p;
    int32_t want = 0;
    if (!__atomic_compare_exchange_n(&c->h->nranks, &want, nranks, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&
        want != nranks) {
        munmap(p, sizeof(shm_header));
        delete c;
        return say(ncclInvalidUsage, "ncclCommInitRankConfig: %d ranks here, %d at another rank of this id", nranks,
                   want);
    }
    st(&c->h->r[rank].device, (int32_t)device);
    int32_t none = 0;
    if (!__atomic_compare_exchange_n(&c->h->r[rank].pid, &none, (int32_t)getpid(), false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        munmap(p, sizeof(shm_header));
        delete c;
        return say(ncclInvalidUsage, "ncclCommInitRankConfig: rank %d of this id has joined already (pid %d)", rank,
                   none);
    }
    global *g = G();
    std::unique_lock<std::mutex> l(g->m);
    static bool registered;
    if (!registered) {
        registered = true;
        atexit(at_exit);
    }
    g->comms.push_back(c);
    start_thread();
    *comm = c;
    check_joined(c);
    if (!c->blocking)
        return c->state == INIT ? ncclInProgress : c->state == FAILED ? c->error : ncclSuccess;
    wait_for(c, l, "ncclCommInitRankConfig", [c] {
        check_joined(c);
        return c->state != INIT;
    });
    return c->state == FAILED ? c->error : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    if (!comm || !async_error)
        return say(ncclInvalidArgument, "ncclCommGetAsyncError: a NULL argument");
    std::lock_guard<std::mutex> l(G()->m);
    if (comm->state == ABORTED || comm->state == DESTROYED) {
        *async_error = ncclInvalidUsage;
        return ncclInvalidUsage;
    }
    if (comm->state == FAILED) {
        *async_error = comm->error;
        return ncclSuccess;
    }
    progress_comm(comm);
    if (comm->state == INIT || (comm->finalizing && !finalized(comm)))
        *async_error = ncclInProgress;
    else
        *async_error = comm->state == FAILED ? comm->error : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t rc;
    std::unique_lock<std::mutex> l(G()->m);
    cuemu_nccl_comm *c = usable(comm, "ncclCommFinalize", &rc);
    if (!c)
        return rc;
    c->finalizing = true;
    if (!c->blocking)
        return finalized(c) ? (c->state == FAILED ? c->error : ncclSuccess) : ncclInProgress;
    wait_for(c, l, "ncclCommFinalize", [c] { return finalized(c); });
    return c->state == FAILED ? c->error : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    std::unique_lock<std::mutex> l(G()->m);
    if (ncclResult_t r = refuse_ended(comm, "ncclCommDestroy"))
        return r;
    // its operations are finished first, as ncclCommFinalize would
    wait_for(comm, l, "ncclCommDestroy", [comm] { return finalized(comm); });
    release(comm);
    comm->state = DESTROYED; // the handle stays readable, so that a later call is refused, not undefined
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    std::lock_guard<std::mutex> l(G()->m);
    if (ncclResult_t r = refuse_ended(comm, "ncclCommAbort"))
        return r;
    if (comm->h)
        st(&comm->h->r[comm->rank].aborted, (int32_t)1);
    release(comm); // its pending operations are dropped: their streams are free at once
    comm->state = ABORTED;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth <= 0)
        return say(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0)
        return ncclSuccess;
    if (!group_calls || group_calls->empty())
        return ncclSuccess;
    std::vector<group_call> calls;
    calls.swap(*group_calls);
    std::lock_guard<std::mutex> l(G()->m);
    // one operation per communicator (the calls in their order), on the stream of its first call
    ncclResult_t rc = ncclSuccess;
    bool nonblocking = false;
    std::vector<bool> taken(calls.size());
    for (size_t i = 0; i < calls.size(); i++) {
        if (taken[i])
            continue;
        cuemu_nccl_comm *c = calls[i].c;
        std::vector<task> tasks;
        for (size_t k = i; k < calls.size(); k++)
            if (calls[k].c == c) {
                taken[k] = true;
                tasks.push_back(calls[k].t);
                if (calls[k].stream != calls[i].stream)
                    rc = say(ncclInvalidUsage, "ncclGroupEnd: one communicator's calls on two streams (not emulated)");
            }
        ncclResult_t r2 = ncclSuccess;
        if (!usable(c, "ncclGroupEnd", &r2))
            rc = r2;
        else if (rc == ncclSuccess)
            rc = enqueue("ncclGroupEnd", c, tasks, calls[i].stream);
        nonblocking |= !c->blocking;
    }
    // as NCCL with a non-blocking communicator: the group's work is being queued (ncclCommGetAsyncError says when)
    return rc == ncclSuccess && nonblocking ? ncclInProgress : rc;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream)
{
    return call("ncclAllReduce", comm, task{ALLREDUCE, type, op, count, 0, send, recv}, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream)
{
    return call("ncclAllGather", comm, task{ALLGATHER, type, ncclSum, count, 0, send, recv}, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream)
{
    return call("ncclReduceScatter", comm, task{REDUCESCATTER, type, op, count, 0, send, recv}, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream)
{
    return call("ncclBroadcast", comm, task{BROADCAST, type, ncclSum, count, root, send, recv}, stream);
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream)
{
    return call("ncclSend", comm, task{SEND, type, ncclSum, count, peer, send, NULL}, stream);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream)
{
    return call("ncclRecv", comm, task{RECV, type, ncclSum, count, peer, NULL, recv}, stream);
}

} // extern "C"
