// cuemu: the CUDA runtime on the CPU (tests/cuemu/README.md). Memory, streams and events, and the kernel executor:
// every thread of a block is a fiber on its own stack, switched by cuemu_switch (x86-64, below); barriers
// (__syncthreads, the warp operations) park a fiber until every thread the barrier names has arrived.
//
// What it checks, as a GPU or compute-sanitizer would and more loudly (each finding is printed, "cuemu: ..."):
// launch limits (block and grid sizes, dynamic shared memory over 48 KiB without the opt-in attribute), kernel
// arguments that point at host memory, copies whose direction or length is wrong, reads and writes past either
// end of device memory or of dynamic shared memory (guard pages: the process stops at the faulting access and the
// kernel, block and thread are named), barriers that can never open, and warp operations on lanes that left.
//
// CUEMU_DEVICES (default 1) sets the device count, CUEMU_DEVICE_MEMORY the bytes per device (default 16 GiB),
// CUEMU_ORDER the order in which a block's threads run between barriers: forward (default), reverse or
// random (a seeded shuffle per block): a result that changes with the order is a race.
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_runtime.h"
#include "nccl_hooks.h"

#if !defined(__x86_64__)
#error "cuemu switches fibers with x86-64 assembly: build it on x86-64"
#endif

extern "C" void cuemu_switch(void **save_sp, void *to_sp);
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp, and resumes the
// context whose stack pointer is to_sp (saved by an earlier switch or laid out by fiber_start). MXCSR and the x87
// control word are not switched: nothing in a kernel or the executor changes them, so every fiber runs with the
// launching thread's.
asm(R"(
    .text
    .globl cuemu_switch
    .hidden cuemu_switch
    .type cuemu_switch, @function
cuemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuemu_switch, .-cuemu_switch
)");

namespace cuemu
{
extern unsigned cur_lane;
uint3 *tid;
uint3 block;
dim3 bdim, gdim;
} // namespace cuemu

namespace
{

const size_t kPage = 4096;
const size_t kStack = 256 * 1024; // per fiber, below it a guard page
const int kMaxThreads = 1024;
const size_t kDefaultSmem = 48 * 1024, kOptinSmem = 227 * 1024;

// ---- diagnostics and the sticky error ----

cudaError_t last_error = cudaSuccess; // cudaGetLastError's
cudaError_t sticky = cudaSuccess;     // a fault in a kernel: every later call returns it, as on a GPU

cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t fail(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cuemu_vsay(fmt, ap);
    va_end(ap);
    last_error = e;
    return e;
}

// ---- memory: every allocation its own mapping, guard pages on both sides ----

struct alloc {
    char *map; // the mapping: [guard][data pages][guard]
    size_t map_len;
    size_t size; // bytes asked for
    int kind;    // 1 device, 2 pinned host
    int device;
};
std::map<uintptr_t, alloc> allocs; // by user pointer
std::mutex mem_lock;
// Device memory is PROT_NONE outside the emulated device's work (device_depth 0), so that host code touching it
// faults as on a GPU. Lock order: prot_lock, then mem_lock.
std::mutex prot_lock;
int device_depth;

bool host_guard()
{
    static int on = -1;
    if (on < 0) {
        const char *s = getenv("CUEMU_HOST_GUARD");
        on = !(s && !strcmp(s, "0"));
    }
    return on;
}

void protect_all(int prot)
{
    for (auto &kv : allocs)
        if (kv.second.kind == 1)
            mprotect(kv.second.map + kPage, kv.second.map_len - 2 * kPage, prot);
}
size_t used_bytes[64];
int current_device = 0;

int env_int(const char *name, int dflt)
{
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}

int device_count() { return env_int("CUEMU_DEVICES", 1); }

size_t device_memory()
{
    const char *s = getenv("CUEMU_DEVICE_MEMORY");
    return s && *s ? (size_t)strtoull(s, NULL, 10) : (size_t)16 << 30;
}

// the allocation holding [p, p + len) (len 0: p itself, or its end), or NULL
const alloc *find(const void *p, size_t len, uintptr_t *base)
{
    uintptr_t u = (uintptr_t)p;
    auto it = allocs.upper_bound(u);
    if (it == allocs.begin())
        return NULL;
    --it;
    if (u + len > it->first + it->second.size)
        return NULL;
    if (base)
        *base = it->first;
    return &it->second;
}

// the allocation whose mapping holds p (for a fault's report)
const alloc *find_near(const void *p, uintptr_t *base)
{
    uintptr_t u = (uintptr_t)p;
    for (auto &kv : allocs)
        if (u >= (uintptr_t)kv.second.map && u < (uintptr_t)kv.second.map + kv.second.map_len) {
            *base = kv.first;
            return &kv.second;
        }
    return NULL;
}

void install_fault_handler();

void *map_guarded(size_t size, size_t *map_len, char **map)
{
    size_t rounded = (size + 255) & ~(size_t)255, data = (rounded + kPage - 1) & ~(kPage - 1);
    if (data == 0)
        data = kPage;
    *map_len = data + 2 * kPage;
    void *m = mmap(NULL, *map_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    *map = (char *)m;
    if (mprotect(*map + kPage, data, PROT_READ | PROT_WRITE) != 0) {
        munmap(m, *map_len);
        return NULL;
    }
    // the data end at the upper guard, 256-aligned: an overrun of the rounded size faults at once
    return *map + kPage + data - (rounded ? rounded : 256);
}

cudaError_t do_alloc(void **ptr, size_t bytes, int kind, const char *what)
{
    if (!ptr)
        return fail(cudaErrorInvalidValue, "%s: a NULL result pointer", what);
    install_fault_handler();
    std::lock_guard<std::mutex> pg(prot_lock);
    std::lock_guard<std::mutex> g(mem_lock);
    if (kind == 1 && used_bytes[current_device] + bytes > device_memory()) {
        *ptr = NULL;
        return fail(cudaErrorMemoryAllocation, "%s(%zu bytes): device %d is out of memory (%zu of %zu bytes in use)",
                    what, bytes, current_device, used_bytes[current_device], device_memory());
    }
    alloc a;
    a.size = bytes;
    a.kind = kind;
    a.device = current_device;
    void *p = map_guarded(bytes, &a.map_len, &a.map);
    if (!p) {
        *ptr = NULL;
        return fail(cudaErrorMemoryAllocation, "%s(%zu bytes): mmap: %s", what, bytes, strerror(errno));
    }
    allocs[(uintptr_t)p] = a;
    if (kind == 1) {
        used_bytes[current_device] += bytes;
        if (device_depth == 0 && host_guard())
            mprotect(a.map + kPage, a.map_len - 2 * kPage, PROT_NONE);
    }
    *ptr = p;
    return cudaSuccess;
}

cudaError_t do_free(void *p, int kind, const char *what)
{
    if (!p)
        return cudaSuccess;
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end() || it->second.kind != kind)
        return fail(cudaErrorInvalidValue, "%s(%p): not a pointer that %s returned", what, p,
                    kind == 1 ? "cudaMalloc" : "cudaMallocHost");
    if (kind == 1)
        used_bytes[it->second.device] -= it->second.size;
    munmap(it->second.map, it->second.map_len);
    allocs.erase(it);
    return cudaSuccess;
}

} // namespace

// ---- streams, and what a capturing stream records ----

// device work recorded by a capture, run at each launch of its graph
struct cuemu_node {
    std::string what;
    std::function<void()> run;
};
struct cuemu_graph {
    std::vector<cuemu_node> nodes;
};
struct cuemu_graph_exec {
    std::vector<cuemu_node> nodes;
};
struct cuemu_stream {
    unsigned flags;
    int device;
    // capture (cudaStreamBeginCapture): its status, mode and thread, the graph being recorded, and what invalidated it
    enum cudaStreamCaptureStatus capture;
    enum cudaStreamCaptureMode mode;
    std::thread::id thread;
    cuemu_graph *graph;
    std::string why;
};

// Copies to the host on a non-blocking stream wait (CUEMU_DEFER_COPIES, on unless "0") until something orders the
// host or other work behind them: that stream's next work, a wait on an event of it (cudaStreamWaitEvent,
// cudaEventSynchronize, cudaEventQuery), its cudaStreamSynchronize, cudaStreamQuery or destruction,
// cudaDeviceSynchronize, a cudaFree. That is the latest a GPU may run them, so a copy whose source is changed
// before such a wait (work that should have waited and did not) reads the changed values here, as it might there.
namespace
{
std::mutex defer_lock;
std::vector<std::pair<cudaStream_t, std::function<void()>>> deferred;

bool defer_copies()
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("CUEMU_DEFER_COPIES");
        on = !(e && strcmp(e, "0") == 0);
    }
    return on;
}

bool deferrable(cudaStream_t stream)
{
    return stream && stream != CUEMU_ALL_STREAMS && (stream->flags & cudaStreamNonBlocking) && defer_copies();
}

// the deferred copies of `only` (CUEMU_ALL_STREAMS: every stream's; NULL, the legacy stream, orders nothing behind
// non-blocking streams), in the order they were made
void run_deferred(cudaStream_t only)
{
    if (!only)
        return;
    for (;;) {
        std::function<void()> w;
        {
            std::lock_guard<std::mutex> g(defer_lock);
            auto it = std::find_if(deferred.begin(), deferred.end(), [only](const auto &d) {
                return only == CUEMU_ALL_STREAMS || d.first == only;
            });
            if (it == deferred.end())
                return;
            w = std::move(it->second);
            deferred.erase(it);
        }
        w();
    }
}
} // namespace

namespace
{

std::mutex cap_lock;
std::vector<cuemu_stream *> captures; // the streams capturing now (active or invalidated)

const char *mode_name(enum cudaStreamCaptureMode m)
{
    return m == cudaStreamCaptureModeGlobal ? "global" : m == cudaStreamCaptureModeThreadLocal ? "thread-local" : "relaxed";
}

// the capture on s fails at its end (cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated), the first reason kept
void invalidate(cuemu_stream *s, const char *why)
{
    if (s->capture == cudaStreamCaptureStatusActive)
        s->why = why;
    s->capture = cudaStreamCaptureStatusInvalidated;
}

// A potentially unsafe call (one a capture cannot record, and that may synchronise: cudaMalloc, cudaFree, ...): as
// CUDA, refused (cudaErrorStreamCaptureUnsupported) in a thread with a capture of its own in global or thread-local
// mode, and in any thread while a global-mode capture runs anywhere; the captures that refuse it are invalidated.
cudaError_t unsafe_call(const char *what)
{
    std::lock_guard<std::mutex> g(cap_lock);
    const cuemu_stream *by = NULL;
    for (cuemu_stream *s : captures)
        if (s->mode == cudaStreamCaptureModeGlobal ||
            (s->mode == cudaStreamCaptureModeThreadLocal && s->thread == std::this_thread::get_id())) {
            invalidate(s, what);
            by = s;
        }
    if (!by)
        return cudaSuccess;
    return fail(cudaErrorStreamCaptureUnsupported,
                "%s while a stream captures (%s mode): not permitted during stream capture; the capture is invalidated",
                what, mode_name(by->mode));
}

enum route { RUN_NOW, RECORD };

// Where device work on stream goes: run now, or recorded (the stream captures). An error instead: work on a stream
// whose capture was invalidated (cudaErrorStreamCaptureInvalidated), and work on the legacy default stream while a
// blocking stream of its device captures (cudaErrorStreamCaptureImplicit: the legacy stream would wait on the
// capture, which runs nothing; the capture is invalidated), as CUDA.
cudaError_t route_of(cudaStream_t stream, const char *what, enum route *r)
{
    *r = RUN_NOW;
    std::lock_guard<std::mutex> g(cap_lock);
    if (captures.empty())
        return cudaSuccess;
    if (stream) {
        if (stream->capture == cudaStreamCaptureStatusInvalidated)
            return fail(cudaErrorStreamCaptureInvalidated, "%s on a stream whose capture was invalidated (by %s)", what,
                        stream->why.c_str());
        if (stream->capture == cudaStreamCaptureStatusActive)
            *r = RECORD;
        return cudaSuccess;
    }
    bool hit = false;
    for (cuemu_stream *s : captures)
        if (!(s->flags & cudaStreamNonBlocking) && s->device == current_device) {
            invalidate(s, what);
            hit = true;
        }
    if (!hit)
        return cudaSuccess;
    return fail(cudaErrorStreamCaptureImplicit,
                "%s on the legacy default stream while a blocking stream captures (a synchronous copy or set, say): "
                "the legacy stream would wait on work that is not run; the capture is invalidated",
                what);
}

// a synchronisation of stream (cudaStreamSynchronize, cudaStreamQuery) while it, or for the legacy stream a blocking
// stream, captures: refused, the capture invalidated (nothing recorded has run: there is nothing to wait for)
cudaError_t sync_during_capture(cudaStream_t stream, const char *what)
{
    enum route r;
    cudaError_t e = route_of(stream, what, &r);
    if (e == cudaErrorStreamCaptureImplicit || e == cudaErrorStreamCaptureInvalidated)
        return e;
    if (r == RUN_NOW)
        return cudaSuccess;
    std::lock_guard<std::mutex> g(cap_lock);
    invalidate(stream, what);
    return fail(cudaErrorStreamCaptureUnsupported,
                "%s of a capturing stream: not permitted during stream capture (the host would wait on work that is "
                "only recorded); the capture is invalidated",
                what);
}

// work the emulator does not record (events, NCCL, a graph launched inside a capture): refused on a capturing stream
cudaError_t not_recorded(cudaStream_t stream, const char *what)
{
    enum route r;
    cudaError_t e = route_of(stream, what, &r);
    if (e || r == RUN_NOW)
        return e;
    std::lock_guard<std::mutex> g(cap_lock);
    invalidate(stream, what);
    return fail(cudaErrorStreamCaptureUnsupported, "%s on a capturing stream: not emulated; the capture is invalidated",
                what);
}

void record(cudaStream_t stream, const char *what, std::function<void()> run)
{
    std::lock_guard<std::mutex> g(cap_lock);
    stream->graph->nodes.push_back(cuemu_node{what, std::move(run)});
}

// ---- the kernel executor ----

enum { RUN, AT_BLOCK, AT_WARP, DONE };

struct fiber {
    void *sp;
    char *stack; // its mapping: a guard page, then kStack bytes
    uint3 idx;
    unsigned lane;
    int state;
    unsigned mask;  // AT_WARP: the lanes the operation names
    uint64_t value; // AT_WARP: this lane's value; AT_BLOCK: its predicate
    int snap;       // after a warp operation: the snapshot of the lanes' values it reads
    int result;     // after __syncthreads_or/and/count
    int pred_op;
};

// A warp operation's values, one snapshot per opening: every lane of the mask reads it once (refs), so that
// groups of one warp with different masks never overwrite values a lane has still to read.
struct snapshot {
    uint64_t v[32];
    int refs;
};
const int kSnaps = 33; // at most 32 groups of one lane each are open at once, plus one being opened

fiber fibers[kMaxThreads];
snapshot snaps[kMaxThreads / 32][kSnaps];
fiber *running;
int run_pos; // running's position in order
std::vector<int> order;
int n_done, n_at_block;
int n_at_warp[kMaxThreads / 32];
void *sched_sp;
const std::function<void()> *body;
int nthreads;
const char *kernel_name;
char *smem;
size_t smem_len, smem_map_len;
char *smem_map;
std::mutex launch_lock;
// device work submitted (kernel launches, copies, memsets, cuBLAS calls): cuemu_work_count
std::atomic<unsigned long long> work_count{0};
std::map<const void *, int> smem_optin; // cudaFuncSetAttribute(MaxDynamicSharedMemorySize)

void resume(fiber *f)
{
    running = f;
    cuemu::tid = &f->idx;
    cuemu::cur_lane = f->lane;
}

// me has blocked or finished: run the next runnable thread after it in the order, or go back to run_block when
// none is (it opens __syncthreads or reports that nothing can open)
void switch_from(fiber *me)
{
    for (int k = 1; k <= nthreads; k++) {
        int p = run_pos + k < nthreads ? run_pos + k : run_pos + k - nthreads;
        fiber *f = &fibers[order[(size_t)p]];
        if (f->state == RUN) {
            run_pos = p;
            resume(f);
            cuemu_switch(&me->sp, f->sp);
            return;
        }
    }
    running = NULL;
    cuemu_switch(&me->sp, sched_sp);
}

[[noreturn]] void fiber_main()
{
    (*body)();
    running->state = DONE;
    n_done++;
    switch_from(running);
    abort(); // a finished fiber is never resumed
}

void fiber_start(fiber *f)
{
    if (!f->stack) {
        void *m =
            mmap(NULL, kStack + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cuemu: no memory for a thread's stack: %s\n", strerror(errno));
            abort();
        }
        mprotect(m, kPage, PROT_NONE);
        f->stack = (char *)m;
    }
    uint64_t *sp = (uint64_t *)(((uintptr_t)(f->stack + kPage + kStack)) & ~(uintptr_t)15);
    *--sp = 0;                            // fiber_main's return address: it never returns
    *--sp = (uint64_t)(void *)fiber_main; // where cuemu_switch's ret goes
    for (int i = 0; i < 6; i++)
        *--sp = 0; // rbp, rbx, r12..r15
    f->sp = sp;
}

char where_buf[256];

const char *where()
{
    if (!kernel_name)
        return "host code";
    snprintf(where_buf, sizeof where_buf, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u)", kernel_name, cuemu::block.x,
             cuemu::block.y, cuemu::block.z, running ? running->idx.x : 0, running ? running->idx.y : 0,
             running ? running->idx.z : 0);
    return where_buf;
}

void on_segv(int sig, siginfo_t *si, void *)
{
    uintptr_t base = 0;
    const alloc *a = find_near(si->si_addr, &base);
    bool in_data = a && (char *)si->si_addr >= a->map + kPage && (char *)si->si_addr < a->map + a->map_len - kPage;
    if (a && a->kind == 1 && in_data && !kernel_name)
        fprintf(stderr,
                "cuemu: host code touched device memory at %p (the device allocation of %zu bytes at %p): on a GPU "
                "this is a fault too; copy it to the host first (cudaMemcpy)\n",
                si->si_addr, a->size, (void *)base);
    else if (a)
        fprintf(stderr, "cuemu: %s: invalid access at %p, %s the %s allocation of %zu bytes at %p\n", where(),
                si->si_addr, (uintptr_t)si->si_addr < base ? "before" : "past the end of",
                a->kind == 1 ? "device" : "pinned host", a->size, (void *)base);
    else if (smem_map && (char *)si->si_addr >= smem_map && (char *)si->si_addr < smem_map + smem_map_len)
        fprintf(stderr, "cuemu: %s: invalid access at %p, outside the launch's %zu bytes of dynamic shared memory\n",
                where(), si->si_addr, smem_len);
    else
        fprintf(stderr, "cuemu: %s: invalid access at %p\n", where(), si->si_addr);
    signal(sig, SIG_DFL);
    raise(sig);
}

void install_fault_handler()
{
    static bool done;
    if (done)
        return;
    done = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}

const char *state_name(int s)
{
    return s == AT_BLOCK ? "__syncthreads" : s == AT_WARP ? "a warp operation" : s == RUN ? "running" : "exited";
}

[[noreturn]] void stuck(const char *why)
{
    fprintf(stderr, "cuemu: kernel %s, block (%u,%u,%u): %s; the threads:\n", kernel_name, cuemu::block.x,
            cuemu::block.y, cuemu::block.z, why);
    int shown = 0;
    for (int i = 0; i < nthreads && shown < 16; i++) {
        fiber *f = &fibers[i];
        if (f->state == DONE)
            continue;
        fprintf(stderr, "  thread %d (warp %d, lane %d): at %s", i, i / 32, i % 32, state_name(f->state));
        if (f->state == AT_WARP)
            fprintf(stderr, " with mask 0x%08x", f->mask);
        fprintf(stderr, "\n");
        shown++;
    }
    fprintf(stderr, "  (%d of %d threads exited)\n", n_done, nthreads);
    fflush(stderr);
    abort(); // a GPU would hang here, or run on with undefined results
}

// A lane of the mask m that can never arrive (exited, or past the block): report it (a fault).
void check_mask(int w, unsigned m)
{
    fiber *lanes = &fibers[w * 32];
    int nl = nthreads - w * 32 < 32 ? nthreads - w * 32 : 32;
    for (int j = 0; j < 32; j++) {
        if (!(m >> j & 1u))
            continue;
        char why[200];
        if (j >= nl) {
            snprintf(why, sizeof why, "a warp operation's mask 0x%08x names lane %d, past the block's %d threads", m, j,
                     nthreads);
            stuck(why);
        }
        if (lanes[j].state == DONE) {
            snprintf(why, sizeof why, "a warp operation's mask 0x%08x names lane %d of warp %d, which has exited", m, j,
                     w);
            stuck(why);
        }
    }
}

// The warp operation of lane me (mask m) has one more lane arrived: open it when every lane it names is there
// with the same mask (counted first: only the arrival that can complete it looks at the lanes).
bool try_open_warp(fiber *me, unsigned m)
{
    int w = (int)(me - fibers) / 32, need = __builtin_popcount(m);
    if (++n_at_warp[w] < need)
        return false;
    fiber *lanes = &fibers[w * 32];
    check_mask(w, m);
    for (int j = 0; j < 32; j++)
        if ((m >> j & 1u) && (lanes[j].state != AT_WARP || lanes[j].mask != m))
            return false;
    int s = 0;
    while (snaps[w][s].refs)
        s++; // fewer than kSnaps are ever in use
    snapshot *sn = &snaps[w][s];
    sn->refs = need;
    for (int j = 0; j < 32; j++)
        if (m >> j & 1u) {
            sn->v[j] = lanes[j].value;
            lanes[j].snap = s;
            lanes[j].state = RUN;
        }
    n_at_warp[w] -= need;
    return true;
}

// every live thread is at __syncthreads: open it (its _or/_and/_count over the live threads)
void open_block_barrier()
{
    // threads that returned count as arrived only by whole warps (what GPUs are relied on for): a warp that is
    // part gone and part waiting is a barrier in divergent code
    if (n_done)
        for (int w = 0; w * 32 < nthreads; w++) {
            int gone = 0, at = 0;
            for (int i = w * 32; i < nthreads && i < w * 32 + 32; i++) {
                gone += fibers[i].state == DONE;
                at += fibers[i].state == AT_BLOCK;
            }
            if (gone && at) {
                char why[200];
                snprintf(why, sizeof why,
                         "no barrier can open: in warp %d, %d threads wait at __syncthreads and %d have returned (a "
                         "__syncthreads in code that not every thread of the warp runs)",
                         w, at, gone);
                stuck(why);
            }
        }
    int orv = 0, andv = 1, count = 0;
    for (int i = 0; i < nthreads; i++)
        if (fibers[i].state == AT_BLOCK) {
            orv |= fibers[i].value != 0;
            andv &= fibers[i].value != 0;
            count += fibers[i].value != 0;
        }
    for (int i = 0; i < nthreads; i++)
        if (fibers[i].state == AT_BLOCK) {
            int op = fibers[i].pred_op;
            fibers[i].result = op == 0 ? orv : op == 1 ? andv : count;
            fibers[i].state = RUN;
        }
    n_at_block = 0;
}

void run_block()
{
    for (int i = 0; i < nthreads; i++) {
        fiber *f = &fibers[i];
        f->idx.x = (unsigned)i % cuemu::bdim.x;
        f->idx.y = ((unsigned)i / cuemu::bdim.x) % cuemu::bdim.y;
        f->idx.z = (unsigned)i / (cuemu::bdim.x * cuemu::bdim.y);
        f->lane = (unsigned)i % 32;
        f->state = RUN;
        fiber_start(f);
    }
    for (int w = 0; w * 32 < nthreads; w++) {
        n_at_warp[w] = 0;
        for (int s = 0; s < kSnaps; s++)
            snaps[w][s].refs = 0;
    }
    n_done = n_at_block = 0;
    if (smem_len)
        memset(smem, 0xff, smem_len); // NaNs: a read before any write shows
    for (;;) {
        // run the first runnable thread in the order; the threads pass control among themselves until none is
        // runnable, then come back here
        int p = 0;
        while (p < nthreads && fibers[order[(size_t)p]].state != RUN)
            p++;
        if (p < nthreads) {
            run_pos = p;
            resume(&fibers[order[(size_t)p]]);
            cuemu_switch(&sched_sp, running->sp);
        }
        if (n_done == nthreads)
            return;
        if (n_at_block + n_done == nthreads) {
            open_block_barrier();
            continue;
        }
        for (int i = 0; i < nthreads; i++) // name a lane that left, if that is why
            if (fibers[i].state == AT_WARP)
                check_mask(i / 32, fibers[i].mask);
        stuck("no barrier can open (a __syncthreads not reached by every live thread, or a warp operation not "
              "reached by every lane its mask names)");
    }
}

unsigned long long order_seed = 0x9e3779b97f4a7c15ull;

// a warp operation: wait for the lanes of mask; returns the snapshot this lane reads (release it after reading)
snapshot *warp_wait(unsigned mask, uint64_t value)
{
    if (!running)
        cuemu::fault("a warp operation outside a kernel");
    fiber *me = running;
    if (!(mask >> me->lane & 1u))
        cuemu::fault("a warp operation with mask 0x%08x, which does not name the calling lane %u", mask, me->lane);
    me->state = AT_WARP;
    me->mask = mask;
    me->value = value;
    if (!try_open_warp(me, mask)) // the last lane to arrive opens it and runs on
        switch_from(me);
    return &snaps[(me - fibers) / 32][me->snap];
}

} // namespace

namespace cuemu
{

unsigned cur_lane;

void *dyn_smem() { return smem; }

void sync_block() { (void)sync_block_pred(0, 0); }

int sync_block_pred(int pred, int op)
{
    fiber *me = running;
    me->state = AT_BLOCK;
    me->value = pred != 0;
    me->pred_op = op;
    n_at_block++;
    switch_from(me);
    return me->result;
}

uint64_t warp_shfl(unsigned mask, uint64_t value, int src, const char *op)
{
    snapshot *sn = warp_wait(mask, value);
    uint64_t r = value;
    if (src >= 0) {
        if (src > 31 || !(mask >> src & 1u))
            fault("%s reads lane %d, which its mask 0x%08x does not name", op, src, mask);
        r = sn->v[src];
    }
    sn->refs--;
    return r;
}

unsigned warp_ballot(unsigned mask, int pred)
{
    snapshot *sn = warp_wait(mask, pred != 0);
    unsigned r = 0;
    for (unsigned i = 0; i < 32; i++)
        if ((mask >> i & 1u) && sn->v[i])
            r |= 1u << i;
    sn->refs--;
    return r;
}

void fault(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuemu: %s: ", where());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}

cudaError_t func_set_attribute(const void *fn, enum cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
        return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d is not emulated", (int)attr);
    if (value < 0 || (size_t)value > kOptinSmem)
        return fail(cudaErrorInvalidValue,
                    "cudaFuncSetAttribute: %d bytes of dynamic shared memory is past the device's %zu", value,
                    kOptinSmem);
    std::lock_guard<std::mutex> g(launch_lock);
    smem_optin[fn] = value;
    return cudaSuccess;
}

// Runs a kernel whose launch was checked (launch), now or as a graph's node.
static cudaError_t run_kernel(const char *name, dim3 grid, dim3 blk, size_t smem_bytes,
                       const std::function<void()> &kernel_body)
{
    std::lock_guard<std::mutex> g(launch_lock);
    // dynamic shared memory: a guarded mapping per launch
    smem_len = smem_bytes;
    smem = NULL;
    smem_map = NULL;
    if (smem_bytes) {
        smem = (char *)map_guarded(smem_bytes, &smem_map_len, &smem_map);
        if (!smem)
            return fail(cudaErrorMemoryAllocation, "kernel %s: no memory for its shared memory", name);
        smem += (((smem_bytes + 255) & ~(size_t)255) - smem_bytes) & ~(size_t)15; // within 15 bytes of the guard
    }
    const char *ord = getenv("CUEMU_ORDER");
    int mode = !ord || !strcmp(ord, "forward") ? 0 : !strcmp(ord, "reverse") ? 1 : 2;
    nthreads = (int)(blk.x * blk.y * blk.z);
    order.resize((size_t)nthreads);
    for (int i = 0; i < nthreads; i++)
        order[(size_t)i] = mode == 1 ? nthreads - 1 - i : i;
    body = &kernel_body;
    kernel_name = name;
    cuemu::gdim = grid;
    cuemu::bdim = blk;
    cuemu::device_scope device;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                cuemu::block = uint3{x, y, z};
                if (mode == 2) // random: a fresh shuffle per block
                    for (int i = nthreads - 1; i > 0; i--) {
                        order_seed = order_seed * 6364136223846793005ull + 1442695040888963407ull;
                        int j = (int)((order_seed >> 33) % (unsigned long long)(i + 1));
                        std::swap(order[(size_t)i], order[(size_t)j]);
                    }
                run_block();
            }
    kernel_name = NULL;
    body = NULL;
    if (smem_map)
        munmap(smem_map, smem_map_len);
    smem = smem_map = NULL;
    smem_len = 0;
    return cudaSuccess;
}

cudaError_t launch(const void *fn, const char *name, dim3 grid, dim3 blk, size_t smem_bytes, cudaStream_t stream,
                   const std::function<void()> &kernel_body, const void *const *ptrs, int nptrs)
{
    if (sticky)
        return last_error = sticky;
    unsigned long long nt = (unsigned long long)blk.x * blk.y * blk.z;
    if (!blk.x || !blk.y || !blk.z || nt > (unsigned long long)kMaxThreads || blk.z > 64)
        return fail(cudaErrorInvalidConfiguration, "kernel %s: block (%u,%u,%u) is not a valid block", name, blk.x,
                    blk.y, blk.z);
    if (!grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
        return fail(cudaErrorInvalidConfiguration,
                    "kernel %s: grid (%u,%u,%u) is not a valid grid (x up to 2^31 - 1, y and z up to 65535)", name,
                    grid.x, grid.y, grid.z);
    if (smem_bytes > kDefaultSmem) {
        std::lock_guard<std::mutex> g(launch_lock);
        auto it = smem_optin.find(fn);
        if (it == smem_optin.end() || (size_t)it->second < smem_bytes)
            return fail(cudaErrorInvalidValue,
                        "kernel %s: %zu bytes of dynamic shared memory, past 48 KiB without cudaFuncSetAttribute("
                        "cudaFuncAttributeMaxDynamicSharedMemorySize) raising it (set: %d)",
                        name, smem_bytes, it == smem_optin.end() ? 0 : it->second);
    }
    {
        std::lock_guard<std::mutex> m(mem_lock);
        for (int i = 0; i < nptrs; i++)
            if (ptrs[i] && !find(ptrs[i], 0, NULL))
                return fail(cudaErrorInvalidValue,
                            "kernel %s: pointer argument %d (%p) is not in device memory (nor pinned host memory)",
                            name, i + 1, ptrs[i]);
    }
    enum route r;
    if (cudaError_t e = route_of(stream, name, &r))
        return e;
    if (r == RECORD) { // checked now, as CUDA checks a captured launch; run at each launch of the graph
        std::function<void()> b = kernel_body; // the launch's arguments, copied
        record(stream, name, [name, grid, blk, smem_bytes, b]() { run_kernel(name, grid, blk, smem_bytes, b); });
        return cudaSuccess;
    }
    run_deferred(stream);
    cuemu_nccl_progress(true, stream, UINT64_MAX); // behind the stream's pending NCCL work
    work_count++;
    return run_kernel(name, grid, blk, smem_bytes, kernel_body);
}

cudaError_t submit(cudaStream_t stream, const char *what, std::function<void()> work)
{
    enum route r;
    if (cudaError_t e = route_of(stream, what, &r))
        return e;
    if (r == RECORD) {
        record(stream, what, std::move(work));
        return cudaSuccess;
    }
    run_deferred(stream);
    cuemu_nccl_progress(true, stream, UINT64_MAX); // behind the stream's pending NCCL work
    work_count++;
    work();
    return cudaSuccess;
}

// a copy to the host: on a non-blocking stream deferred (run_deferred), elsewhere as submit
cudaError_t submit_copy_to_host(cudaStream_t stream, const char *what, std::function<void()> work)
{
    enum route r;
    if (cudaError_t e = route_of(stream, what, &r))
        return e;
    if (r == RECORD || !deferrable(stream))
        return submit(stream, what, std::move(work));
    work_count++;
    std::lock_guard<std::mutex> g(defer_lock);
    deferred.emplace_back(stream, std::move(work));
    return cudaSuccess;
}

} // namespace cuemu

// ---- the runtime API ----

struct cuemu_event {
    unsigned flags;
    bool recorded;
    cudaStream_t stream; // where it was last recorded
    uint64_t mark;       // the NCCL operations issued by then (cuemu_nccl_mark)
};

// ---- NCCL's pending work (nccl_hooks.h, nccl.cc) ----
// Kernels, copies and sets run at once, in the calling thread; only NCCL operations stay pending on a stream (until
// every peer has published its part). So before the runtime runs work on a stream, or says that a stream or an
// event is done, it asks the NCCL emulation about the operations that work orders behind. Nothing pending: one
// atomic load, the behaviour without NCCL.

extern "C" unsigned cuemu_stream_flags(cudaStream_t stream) { return stream ? stream->flags : 0; }

namespace
{
// work on `stream` (NULL: the legacy default stream; CUEMU_ALL_STREAMS: the device) waits for what it orders behind
void nccl_order(cudaStream_t stream)
{
    run_deferred(stream);
    cuemu_nccl_progress(true, stream, UINT64_MAX);
}
// cudaStreamQuery, cudaEventQuery: done, or progress made without waiting (deferred copies run: they need no peer)
bool nccl_done(cudaStream_t stream, uint64_t mark)
{
    run_deferred(stream);
    return cuemu_nccl_progress(false, stream, mark);
}
} // namespace

namespace
{

// every call after a kernel fault returns it
#define STICKY()                                                                                                       \
    do {                                                                                                               \
        if (sticky)                                                                                                    \
            return last_error = sticky;                                                                                \
    } while (0)

const char *kind_name(int k) { return k == 1 ? "device memory" : k == 2 ? "pinned host memory" : "host memory"; }

int pointer_kind(const void *p, size_t len, bool *inside)
{
    uintptr_t base;
    const alloc *a = find(p, 0, &base);
    if (!a) {
        *inside = true;
        return 0;
    }
    *inside = (uintptr_t)p + len <= base + a->size;
    return a->kind;
}

cudaError_t check_copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, const char *what)
{
    std::lock_guard<std::mutex> g(mem_lock);
    bool din, sin;
    int dk = pointer_kind(dst, bytes, &din), sk = pointer_kind(src, bytes, &sin);
    if (!din)
        return fail(cudaErrorInvalidValue, "%s: %zu bytes to %p run past the end of its allocation", what, bytes, dst);
    if (!sin)
        return fail(cudaErrorInvalidValue, "%s: %zu bytes from %p run past the end of its allocation", what, bytes,
                    src);
    bool dd = dk == 1, sd = sk == 1;
    const char *bad = NULL;
    switch (kind) {
    case cudaMemcpyHostToDevice:
        bad = !dd ? "the destination is not device memory" : sd ? "the source is device memory" : NULL;
        break;
    case cudaMemcpyDeviceToHost:
        bad = !sd ? "the source is not device memory" : dd ? "the destination is device memory" : NULL;
        break;
    case cudaMemcpyDeviceToDevice: bad = !dd || !sd ? "one side is not device memory" : NULL; break;
    case cudaMemcpyHostToHost: bad = dd || sd ? "one side is device memory" : NULL; break;
    case cudaMemcpyDefault: break;
    default: bad = "an unknown copy kind";
    }
    if (bad)
        return fail(cudaErrorInvalidValue, "%s(kind %d, %zu bytes, %s to %s): %s", what, (int)kind, bytes,
                    kind_name(sk), kind_name(dk), bad);
    return cudaSuccess;
}

} // namespace

extern "C" {

void cuemu_device_enter(void)
{
    std::lock_guard<std::mutex> pg(prot_lock);
    if (device_depth++ == 0 && host_guard()) {
        std::lock_guard<std::mutex> g(mem_lock);
        protect_all(PROT_READ | PROT_WRITE);
    }
}

void cuemu_device_leave(void)
{
    std::lock_guard<std::mutex> pg(prot_lock);
    if (--device_depth == 0 && host_guard()) {
        std::lock_guard<std::mutex> g(mem_lock);
        protect_all(PROT_NONE);
    }
}

void cuemu_vsay(const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    fprintf(stderr, "cuemu: %s\n", line); // one write: ranks' lines do not interleave mid-line
}

void cuemu_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cuemu_vsay(fmt, ap);
    va_end(ap);
}

int cuemu_pointer_kind(const void *p)
{
    std::lock_guard<std::mutex> g(mem_lock);
    const alloc *a = find(p, 0, NULL);
    return a ? a->kind : 0;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = device_count();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    STICKY();
    if (device < 0 || device >= device_count() || device >= 64)
        return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): %d device(s) (CUEMU_DEVICES)", device, device_count());
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (device < 0 || device >= device_count())
        return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d): no such device", device);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cuemu (CUDA emulated on the CPU)");
    prop->totalGlobalMem = device_memory();
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->sharedMemPerBlockOptin = kOptinSmem;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (device < 0 || device >= device_count())
        return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: no device %d", device);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = kMaxThreads; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)kDefaultSmem; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)kOptinSmem; break;
    default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    STICKY();
    if (cudaError_t e = unsafe_call("cudaDeviceSynchronize"))
        return e;
    nccl_order(CUEMU_ALL_STREAMS);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    STICKY();
    std::lock_guard<std::mutex> g(mem_lock);
    *total_bytes = device_memory();
    *free_bytes = device_memory() - used_bytes[current_device];
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = sticky;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalState: return "the resource is not in a valid state to perform the requested operation";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    default: return "unknown error";
    }
}

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    STICKY();
    if (cudaError_t e = unsafe_call("cudaMalloc"))
        return e;
    return do_alloc(ptr, bytes, 1, "cudaMalloc");
}

cudaError_t cudaFree(void *ptr)
{
    STICKY();
    if (cudaError_t e = unsafe_call("cudaFree"))
        return e;
    nccl_order(CUEMU_ALL_STREAMS); // as on a GPU, a free waits for the device
    return do_free(ptr, 1, "cudaFree");
}

cudaError_t cudaMallocHost(void **ptr, size_t bytes)
{
    if (cudaError_t e = unsafe_call("cudaMallocHost"))
        return e;
    return do_alloc(ptr, bytes, 2, "cudaMallocHost");
}

cudaError_t cudaFreeHost(void *ptr)
{
    if (cudaError_t e = unsafe_call("cudaFreeHost"))
        return e;
    return do_free(ptr, 2, "cudaFreeHost");
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    std::lock_guard<std::mutex> g(mem_lock);
    memset(attr, 0, sizeof *attr);
    const alloc *a = find(ptr, 0, NULL);
    attr->type = !a ? cudaMemoryTypeUnregistered : a->kind == 1 ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    attr->device = a ? a->device : -1;
    attr->devicePointer = a ? (void *)ptr : NULL;
    attr->hostPointer = a && a->kind == 2 ? (void *)ptr : NULL;
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    STICKY();
    if (!bytes)
        return cudaSuccess;
    cudaError_t e = check_copy(dst, src, bytes, kind, "cudaMemcpy");
    if (e)
        return e;
    // recorded by a capture, a copy from or to host memory reads or writes it when the graph runs
    auto work = [dst, src, bytes]() {
        cuemu::device_scope device;
        memmove(dst, src, bytes);
    };
    if (kind == cudaMemcpyDeviceToHost)
        return cuemu::submit_copy_to_host(stream, "cudaMemcpy", work);
    return cuemu::submit(stream, "cudaMemcpy", work);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    return cudaMemcpyAsync(dst, src, bytes, kind, NULL);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                              enum cudaMemcpyKind kind, cudaStream_t stream)
{
    STICKY();
    if (!width || !height)
        return cudaSuccess;
    if (width > dpitch || width > spitch)
        return fail(cudaErrorInvalidValue, "cudaMemcpy2D: rows of %zu bytes wider than the pitches %zu, %zu", width,
                    dpitch, spitch);
    // the whole span of each side, first row to the end of the last
    cudaError_t e = check_copy(dst, src, 0, kind, "cudaMemcpy2D");
    if (!e)
        e = check_copy((char *)dst + dpitch * (height - 1), (const char *)src + spitch * (height - 1), width, kind,
                       "cudaMemcpy2D (last row)");
    if (e)
        return e;
    return cuemu::submit(stream, "cudaMemcpy2D", [dst, dpitch, src, spitch, width, height]() {
        cuemu::device_scope device;
        for (size_t r = 0; r < height; r++)
            memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    });
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    STICKY();
    if (!bytes)
        return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(mem_lock);
        const alloc *a = find(ptr, bytes, NULL);
        if (!a || a->kind != 1)
            return fail(cudaErrorInvalidValue, "cudaMemset(%p, %zu bytes): not inside one device allocation", ptr,
                        bytes);
    }
    return cuemu::submit(stream, "cudaMemset", [ptr, value, bytes]() {
        cuemu::device_scope device;
        memset(ptr, value, bytes);
    });
}

cudaError_t cudaMemset(void *ptr, int value, size_t bytes) { return cudaMemsetAsync(ptr, value, bytes, NULL); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags)
{
    STICKY();
    *stream = new cuemu_stream{flags, current_device, cudaStreamCaptureStatusNone, cudaStreamCaptureModeGlobal, {},
                               NULL, {}};
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    if (stream)
        nccl_order(stream); // its pending NCCL work first (the emulation tells streams apart by address)
    if (stream && stream->capture != cudaStreamCaptureStatusNone) { // its capture ends with it, unfinished
        std::lock_guard<std::mutex> g(cap_lock);
        captures.erase(std::find(captures.begin(), captures.end(), stream));
        delete stream->graph;
    }
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    STICKY();
    if (cudaError_t e = sync_during_capture(stream, "cudaStreamSynchronize"))
        return e;
    nccl_order(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    STICKY();
    if (cudaError_t e = sync_during_capture(stream, "cudaStreamQuery"))
        return e;
    return nccl_done(stream, UINT64_MAX) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags)
{
    (void)stream;
    (void)flags;
    STICKY();
    if (!event)
        return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: a NULL event");
    if (cudaError_t e = not_recorded(stream, "cudaStreamWaitEvent"))
        return e;
    if (event->recorded) { // the stream's later work runs at once: what the event marks must be done first
        run_deferred(event->stream);
        cuemu_nccl_progress(true, event->stream, event->mark);
    }
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags)
{
    *event = new cuemu_event{flags, false, NULL, 0};
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    delete event;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    STICKY();
    if (!event)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: a NULL event");
    if (cudaError_t e = not_recorded(stream, "cudaEventRecord"))
        return e;
    event->recorded = true;
    event->stream = stream;
    event->mark = cuemu_nccl_mark();
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    STICKY();
    if (!event)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: a NULL event");
    return !event->recorded || nccl_done(event->stream, event->mark) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    STICKY();
    if (!event)
        return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: a NULL event");
    if (event->recorded) {
        run_deferred(event->stream);
        cuemu_nccl_progress(true, event->stream, event->mark);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    STICKY();
    if (!stream)
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy default stream cannot capture");
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode %d is not a capture mode", (int)mode);
    std::lock_guard<std::mutex> g(cap_lock);
    if (stream->capture != cudaStreamCaptureStatusNone)
        return fail(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream captures already");
    stream->capture = cudaStreamCaptureStatusActive;
    stream->mode = mode;
    stream->thread = std::this_thread::get_id();
    stream->graph = new cuemu_graph;
    stream->why.clear();
    captures.push_back(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *graph)
{
    if (!graph)
        return fail(cudaErrorInvalidValue, "cudaStreamEndCapture: a NULL graph pointer");
    *graph = NULL;
    if (!stream || stream->capture == cudaStreamCaptureStatusNone)
        return fail(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
    std::lock_guard<std::mutex> g(cap_lock);
    if (stream->mode != cudaStreamCaptureModeRelaxed && stream->thread != std::this_thread::get_id())
        return fail(cudaErrorStreamCaptureWrongThread,
                    "cudaStreamEndCapture: a %s-mode capture ended in another thread than the one that began it",
                    mode_name(stream->mode));
    captures.erase(std::find(captures.begin(), captures.end(), stream));
    const bool ok = stream->capture == cudaStreamCaptureStatusActive;
    stream->capture = cudaStreamCaptureStatusNone;
    if (!ok) {
        delete stream->graph;
        stream->graph = NULL;
        return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture: the capture was invalidated (by %s)",
                    stream->why.c_str());
    }
    *graph = stream->graph;
    stream->graph = NULL;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status)
{
    if (!status)
        return fail(cudaErrorInvalidValue, "cudaStreamIsCapturing: a NULL status pointer");
    std::lock_guard<std::mutex> g(cap_lock);
    if (!stream) { // the legacy stream: unusable while a blocking stream of its device captures (not invalidated)
        for (const cuemu_stream *s : captures)
            if (!(s->flags & cudaStreamNonBlocking) && s->device == current_device)
                return fail(cudaErrorStreamCaptureImplicit,
                            "cudaStreamIsCapturing: the legacy stream while a blocking stream captures");
        *status = cudaStreamCaptureStatusNone;
        return cudaSuccess;
    }
    *status = stream->capture;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags)
{
    STICKY();
    if (!exec || !graph)
        return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: a NULL %s", !exec ? "result pointer" : "graph");
    if (flags)
        return fail(cudaErrorInvalidValue, "cudaGraphInstantiate: flags 0x%llx are not emulated", flags);
    *exec = new cuemu_graph_exec{graph->nodes}; // a copy: the graph may be destroyed, the executable stays
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream)
{
    STICKY();
    if (!exec)
        return fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: a NULL graph executable");
    if (cudaError_t e = not_recorded(stream, "cudaGraphLaunch"))
        return e;
    nccl_order(stream);
    work_count++; // one launch, however many nodes
    for (const cuemu_node &n : exec->nodes)
        n.run();
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

int cuemu_stream_captures(cudaStream_t stream)
{
    std::lock_guard<std::mutex> g(cap_lock);
    if (stream)
        return stream->capture != cudaStreamCaptureStatusNone;
    for (const cuemu_stream *s : captures)
        if (!(s->flags & cudaStreamNonBlocking) && s->device == current_device)
            return 1;
    return 0;
}

} // extern "C"

unsigned long long cuemu_work_count(void) { return work_count.load(); }

void cuemu_count_work(void) { work_count++; }
