/* BF16 matrix products on the CPU: x, W and dy rounded to BF16 (round to nearest even), products accumulated in
 * fp32, fp32 results with the += semantics of linear.c.
 *
 * The products run in oneDNN's matmul (bf16 sources and weights, f32 destination; its AVX512-BF16 or AMX kernels,
 * whichever the CPU has: AMX is enabled from here, no environment variable needed). We round the operands
 * ourselves into grow-only buffers (one conversion pass per operand and call; no allocation once the largest shape
 * has run), and keep one oneDNN primitive per shape (a model has a handful). The weight-gradient product takes
 * dy^T: dy is transposed while it is rounded, so every product oneDNN runs is a plain row-major A B or A B^T
 * (measured on the model's shapes: bench/bf16_gemm_bench.c, docs/results/performance.md).
 *
 * cpu_bf16_gemm_available() asks the CPU (cpuid: AVX512-BF16 with the OS saving the ZMM state, or AMX-BF16 with
 * the OS granting the tile data) and oneDNN (the ISA it dispatches to); without oneDNN in the build it is false.
 * One thread calls these at a time (the trainer's); oneDNN's own threads follow OpenBLAS's thread count. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "cpu_kernels.h"
#include "cpu_bf16.h"
#include "pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* ---- the CPU ---- */

#if defined(__x86_64__)
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

struct bf16_cpu cpu_bf16_features(void)
{
    struct bf16_cpu f = {0};
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE: xgetbv is there */
        return f;
    const uint64_t xcr0 = xgetbv0();
    /* XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM saved by the OS */
    const bool os_zmm = (xcr0 & 0xe6) == 0xe6;
    /* XTILECFG (17), XTILEDATA (18) */
    const bool os_tile = (xcr0 & (3ull << 17)) == (3ull << 17);
    if (__get_cpuid_max(0, NULL) < 7)
        return f;
    __cpuid_count(7, 0, a, b, c, d);
    const bool avx512 = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31)); /* F, BW, VL */
    const bool amx_bf16 = (d & (1u << 22)) && (d & (1u << 24));                   /* AMX-BF16, AMX-TILE */
    const unsigned max7 = a;
    bool avx512_bf16 = false;
    if (max7 >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        avx512_bf16 = a & (1u << 5);
    }
    f.avx512_bf16 = avx512 && os_zmm && avx512_bf16;
    if (amx_bf16 && os_tile && avx512 && os_zmm) {
        /* Linux hands out the tile data state on request (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
         * a kernel without that request (before 5.16) has no AMX for processes. */
        long r = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
        f.amx_bf16 = r == 0;
    }
#endif
    return f;
}

/* ---- rounding to BF16 ---- */

static void round_generic(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = f32_to_bf16(src[i]);
}

/* dst (cols, rows) = src (rows, cols)^T, rounded; in 16 x 16 tiles so both sides stay in cache lines. */
static void round_transpose_generic(uint16_t *dst, const float *src, int rows, int cols)
{
    enum { T = 16 };
    for (int r0 = 0; r0 < rows; r0 += T) {
        const int r1 = r0 + T < rows ? r0 + T : rows;
        for (int c0 = 0; c0 < cols; c0 += T) {
            const int c1 = c0 + T < cols ? c0 + T : cols;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++)
                    dst[(size_t)c * rows + r] = f32_to_bf16(src[(size_t)r * cols + c]);
        }
    }
}

/* The same loops compiled for AVX-512 (the build targets baseline x86-64; these run only on CPUs with
 * AVX-512, which every CPU with a BF16 GEMM has): 4-5x faster than the SSE2 build of them, which mattered (the
 * rounding took 16% of a 576 x 576 forward's time). */
#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX512_CLONES 1
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void round_avx512(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = f32_to_bf16(src[i]);
}
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void round_transpose_avx512(uint16_t *dst, const float *src,
                                                                                        int rows, int cols)
{
    enum { T = 16 };
    for (int r0 = 0; r0 < rows; r0 += T) {
        const int r1 = r0 + T < rows ? r0 + T : rows;
        for (int c0 = 0; c0 < cols; c0 += T) {
            const int c1 = c0 + T < cols ? c0 + T : cols;
            for (int c = c0; c < c1; c++)
                for (int r = r0; r < r1; r++)
                    dst[(size_t)c * rows + r] = f32_to_bf16(src[(size_t)r * cols + c]);
        }
    }
}
#endif

static bool use_avx512(void)
{
#ifdef HAVE_AVX512_CLONES
    static int v = -1;
    if (v < 0)
        v = cpu_bf16_features().avx512_bf16;
    return v;
#else
    return false;
#endif
}

static void round_serial(uint16_t *dst, const float *src, size_t n)
{
#ifdef HAVE_AVX512_CLONES
    if (use_avx512()) {
        round_avx512(dst, src, n);
        return;
    }
#endif
    round_generic(dst, src, n);
}

struct round_job {
    uint16_t *dst;
    const float *src;
    size_t n;
};

static void round_part(void *arg, int part, int parts)
{
    const struct round_job *j = arg;
    /* parts of whole cache lines (16 floats), so no two threads write one line */
    const size_t lines = (j->n + 15) / 16, lo = lines * (size_t)part / (size_t)parts * 16,
                 hi = lines * (size_t)(part + 1) / (size_t)parts * 16;
    if (lo < j->n)
        round_serial(j->dst + lo, j->src + lo, (hi < j->n ? hi : j->n) - lo);
}

/* Arrays below this many values are rounded on the calling thread alone (a weight matrix of the model's layers is
 * above it; waking a helper costs more than rounding a few activations). */
enum { ROUND_SPLIT_MIN = 1 << 18 };

void bf16_round(uint16_t *dst, const float *src, size_t n)
{
    const int parts = n >= ROUND_SPLIT_MIN ? cpu_pool_threads() : 1;
    if (parts <= 1) {
        round_serial(dst, src, n);
        return;
    }
    struct round_job j = {.dst = dst, .src = src, .n = n};
    cpu_run_parts(parts, round_part, &j);
}

void bf16_round_transpose(uint16_t *dst, const float *src, int rows, int cols)
{
#ifdef HAVE_AVX512_CLONES
    if (use_avx512()) {
        round_transpose_avx512(dst, src, rows, cols);
        return;
    }
#endif
    round_transpose_generic(dst, src, rows, cols);
}

/* ---- grow-only scratch ---- */

uint16_t *bf16_scratch(struct bf16_scratch *s, size_t n)
{
    if (n > s->cap) {
        free(s->p);
        size_t cap = n + n / 8 + 64;
        void *p = NULL;
        if (posix_memalign(&p, 64, cap * sizeof(uint16_t)) != 0)
            check_failf(__FILE__, __LINE__, "BF16 GEMM: out of memory for %zu bf16 values", cap);
        s->p = p;
        s->cap = cap;
    }
    return s->p;
}

/* A: the activations (x or dy), B: the weights (or x for dW), T: dy^T */
static struct bf16_scratch g_a, g_b;

#ifdef GRPO_HAVE_DNNL
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

/* ---- oneDNN ---- */

/* C (M, N) (+)= A (M, K) B, with B given as (K, N) row-major (b_trans 0) or as (N, K) row-major (b_trans 1);
 * leading dimensions: A K, B ldb, C ldc (a block of a larger product). Memory objects per part, so that the
 * parts of one product run on their threads at once; a product has at most 8 parts (threads beyond go to the
 * fp32 products and the attention). */
enum { MAX_PARTS = 8 };
struct mm_prim {
    int M, N, K, ldb, ldc;
    bool b_trans, accumulate;
    dnnl_primitive_t prim;
    dnnl_memory_t a[MAX_PARTS], b[MAX_PARTS], c[MAX_PARTS], scratch[MAX_PARTS];
    size_t scratch_bytes;
};

/* One part of a product, run by the calling thread (part 0) or a helper. */
struct mm_job {
    struct mm_prim *p;
    float *C;
    const uint16_t *A, *B;
};

enum { MAX_PRIMS = 96 };
static struct {
    bool init, ok;
    dnnl_engine_t engine;
    dnnl_stream_t streams[MAX_PARTS];
    struct mm_prim prims[MAX_PRIMS];
    int nprims;
    void (*omp_set_num_threads)(int);
    char name[96];
    /* part i of the current product (part 0 on the calling thread, the others on pool.c's helpers) */
    struct mm_job jobs[MAX_PARTS];
    /* each part's scratchpad: oneDNN's own (library mode) is one per process, not for products at once */
    void *scratch[MAX_PARTS];
    size_t scratch_cap[MAX_PARTS];
} g_dnnl;

#define DNNL_OK(call)                                                                                                  \
    do {                                                                                                               \
        dnnl_status_t st_ = (call);                                                                                    \
        if (st_ != dnnl_success)                                                                                       \
            check_failf(__FILE__, __LINE__, "oneDNN: %s failed (status %d)", #call, (int)st_);                         \
    } while (0)

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx)
        return "avx512_core_amx";
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16)
        return "avx512_core_bf16";
    if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core)
        return "avx512_core (no bf16)";
    return "no avx512";
}

/* oneDNN runs one thread per part: its OpenMP threads are not used (set to 1 in every thread that calls it). With
 * OpenMP's threads, which spin between parallel regions, next to OpenBLAS's, which spin between calls, two threads
 * on two cores ran the model's products at half the speed of one (bench/bf16_gemm_bench.c). */
static void omp_one_thread(void)
{
    if (g_dnnl.omp_set_num_threads)
        g_dnnl.omp_set_num_threads(1);
}

static void dnnl_setup(void)
{
    if (g_dnnl.init)
        return;
    g_dnnl.init = true;
    struct bf16_cpu f = cpu_bf16_features();
    if (!f.avx512_bf16 && !f.amx_bf16) {
        snprintf(g_dnnl.name, sizeof g_dnnl.name, "no BF16 GEMM (this CPU has neither AVX512-BF16 nor AMX-BF16)");
        return;
    }
    /* oneDNN 2.x may leave AMX off unless asked (its "initial support" ISAs need DNNL_MAX_CPU_ISA): ask from here,
     * before the first primitive, unless the user chose. The call fails harmlessly once the ISA is fixed. */
    if (f.amx_bf16 && !getenv("DNNL_MAX_CPU_ISA") && !getenv("ONEDNN_MAX_CPU_ISA"))
        (void)dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_amx);
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
        snprintf(g_dnnl.name, sizeof g_dnnl.name, "no BF16 GEMM (oneDNN dispatches to %s)", isa_name(isa));
        return;
    }
    const dnnl_version_t *v = dnnl_version();
    snprintf(g_dnnl.name, sizeof g_dnnl.name, "oneDNN %d.%d %s", v->major, v->minor, isa_name(isa));
    DNNL_OK(dnnl_engine_create(&g_dnnl.engine, dnnl_cpu, 0));
    for (int i = 0; i < MAX_PARTS; i++)
        DNNL_OK(dnnl_stream_create(&g_dnnl.streams[i], g_dnnl.engine, dnnl_stream_default_flags));
    /* the OpenMP runtime oneDNN loaded (libgomp), found at run time so the build needs no OpenMP flags */
    g_dnnl.omp_set_num_threads = (void (*)(int))dlsym(RTLD_DEFAULT, "omp_set_num_threads");
    omp_one_thread();
    g_dnnl.ok = true;
}

static void md_2d(dnnl_memory_desc_t *md, int rows, int cols, int ld, bool transposed, dnnl_data_type_t dt)
{
    /* a (rows, cols) matrix stored row-major with leading dimension ld, or stored as its transpose */
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
    DNNL_OK(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides));
}

static void prim_destroy(struct mm_prim *p)
{
    dnnl_primitive_destroy(p->prim);
    for (int i = 0; i < MAX_PARTS; i++)
        dnnl_memory_destroy(p->a[i]), dnnl_memory_destroy(p->b[i]), dnnl_memory_destroy(p->c[i]),
            dnnl_memory_destroy(p->scratch[i]);
}

static struct mm_prim *mm_get(int M, int N, int K, int ldb, int ldc, bool b_trans, bool accumulate)
{
    for (int i = 0; i < g_dnnl.nprims; i++) {
        struct mm_prim *p = &g_dnnl.prims[i];
        if (p->M == M && p->N == N && p->K == K && p->ldb == ldb && p->ldc == ldc && p->b_trans == b_trans &&
            p->accumulate == accumulate)
            return p;
    }
    struct mm_prim *p;
    if (g_dnnl.nprims < MAX_PRIMS) {
        p = &g_dnnl.prims[g_dnnl.nprims++];
    } else { /* many shapes (generation at many batch sizes): recycle the oldest slot */
        prim_destroy(&g_dnnl.prims[0]);
        memmove(&g_dnnl.prims[0], &g_dnnl.prims[1], (MAX_PRIMS - 1) * sizeof *p);
        p = &g_dnnl.prims[MAX_PRIMS - 1];
    }
    *p = (struct mm_prim){.M = M, .N = N, .K = K, .ldb = ldb, .ldc = ldc, .b_trans = b_trans, .accumulate = accumulate};
    dnnl_memory_desc_t amd, bmd, cmd;
    md_2d(&amd, M, K, K, false, dnnl_bf16);
    md_2d(&bmd, K, N, ldb, b_trans, dnnl_bf16);
    md_2d(&cmd, M, N, ldc, false, dnnl_f32);
    dnnl_matmul_desc_t desc;
    DNNL_OK(dnnl_matmul_desc_init(&desc, &amd, &bmd, NULL, &cmd));
    dnnl_primitive_attr_t attr;
    DNNL_OK(dnnl_primitive_attr_create(&attr));
    DNNL_OK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (accumulate) {
        dnnl_post_ops_t po;
        DNNL_OK(dnnl_post_ops_create(&po));
        DNNL_OK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &desc, attr, g_dnnl.engine, NULL));
    dnnl_primitive_attr_destroy(attr);
    DNNL_OK(dnnl_primitive_create(&p->prim, pd));
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    p->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
    for (int i = 0; i < MAX_PARTS; i++) {
        if (p->scratch_bytes)
            DNNL_OK(dnnl_memory_create(&p->scratch[i], smd, g_dnnl.engine, DNNL_MEMORY_NONE));
    }
    dnnl_primitive_desc_destroy(pd);
    for (int i = 0; i < MAX_PARTS; i++) {
        DNNL_OK(dnnl_memory_create(&p->a[i], &amd, g_dnnl.engine, DNNL_MEMORY_NONE));
        DNNL_OK(dnnl_memory_create(&p->b[i], &bmd, g_dnnl.engine, DNNL_MEMORY_NONE));
        DNNL_OK(dnnl_memory_create(&p->c[i], &cmd, g_dnnl.engine, DNNL_MEMORY_NONE));
    }
    return p;
}

/* The oneDNN implementation a product of this shape runs ("brg:avx512_core_bf16"): for the benchmark. */
const char *bf16_gemm_impl(int M, int N, int K, bool b_trans)
{
    dnnl_setup();
    if (!g_dnnl.ok)
        return "none";
    struct mm_prim *p = mm_get(M, N, K, b_trans ? K : N, N, b_trans, false);
    const_dnnl_primitive_desc_t pd;
    const char *impl = "?";
    if (dnnl_primitive_get_primitive_desc(p->prim, &pd) == dnnl_success)
        (void)dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    return impl;
}

static void job_run(int part)
{
    const struct mm_job *j = &g_dnnl.jobs[part];
    dnnl_stream_t st = g_dnnl.streams[part];
    DNNL_OK(dnnl_memory_set_data_handle_v2(j->p->a[part], (void *)j->A, st));
    DNNL_OK(dnnl_memory_set_data_handle_v2(j->p->b[part], (void *)j->B, st));
    DNNL_OK(dnnl_memory_set_data_handle_v2(j->p->c[part], j->C, st));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, j->p->a[part]},
                               {DNNL_ARG_WEIGHTS, j->p->b[part]},
                               {DNNL_ARG_DST, j->p->c[part]},
                               {DNNL_ARG_SCRATCHPAD, j->p->scratch[part]}};
    if (j->p->scratch_bytes) {
        if (j->p->scratch_bytes > g_dnnl.scratch_cap[part]) { /* grows to the largest product's, then stays */
            free(g_dnnl.scratch[part]);
            size_t cap = j->p->scratch_bytes + 4096;
            if (posix_memalign(&g_dnnl.scratch[part], 64, cap) != 0)
                check_failf(__FILE__, __LINE__, "BF16 GEMM: out of memory for a %zu-byte scratchpad", cap);
            g_dnnl.scratch_cap[part] = cap;
        }
        DNNL_OK(dnnl_memory_set_data_handle_v2(j->p->scratch[part], g_dnnl.scratch[part], st));
    }
    DNNL_OK(dnnl_primitive_execute(j->p->prim, st, j->p->scratch_bytes ? 4 : 3, args));
    DNNL_OK(dnnl_stream_wait(st));
}

static void job_part(void *arg, int part, int parts)
{
    (void)arg, (void)parts;
    static __thread bool omp_set;
    if (!omp_set) { /* oneDNN's OpenMP stays at one thread in every thread that calls it */
        omp_one_thread();
        omp_set = true;
    }
    job_run(part);
}

/* Products below this many multiply-adds run on the calling thread alone (waking a helper costs more). */
enum { SPLIT_MIN_MACS = 1 << 21 };

static void mm_run(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K, bool b_trans, bool accumulate)
{
    /* parts: as many as OpenBLAS's threads (the trainer's thread setting), split over the rows of C, or over its
     * columns when it has few rows (generation), each at least 16 wide */
    int parts = cpu_pool_threads();
    parts = parts < MAX_PARTS ? parts : MAX_PARTS;
    const bool by_rows = M >= 16 * parts || M >= N;
    const int extent = by_rows ? M : N;
    if (parts > extent / 16)
        parts = extent / 16;
    if (parts < 1 || (double)M * N * K < SPLIT_MIN_MACS)
        parts = 1;
    const int ldb = b_trans ? K : N;
    for (int i = 0; i < MAX_PARTS; i++)
        g_dnnl.jobs[i].p = NULL;
    for (int i = 0; i < parts; i++) {
        const int lo = (int)((long)extent * i / parts), hi = (int)((long)extent * (i + 1) / parts);
        struct mm_job *j = &g_dnnl.jobs[i];
        if (by_rows) {
            j->p = mm_get(hi - lo, N, K, ldb, N, b_trans, accumulate);
            j->A = A + (size_t)lo * K, j->B = B, j->C = C + (size_t)lo * N;
        } else {
            j->p = mm_get(M, hi - lo, K, ldb, N, b_trans, accumulate);
            j->A = A, j->B = B + (b_trans ? (size_t)lo * K : (size_t)lo), j->C = C + lo;
        }
    }
    cpu_run_parts(parts, job_part, NULL);
}

bool cpu_bf16_gemm_available(void)
{
    dnnl_setup();
    return g_dnnl.ok;
}

const char *cpu_bf16_gemm_name(void)
{
    dnnl_setup();
    return g_dnnl.name;
}

#else /* no oneDNN in this build */

const char *bf16_gemm_impl(int M, int N, int K, bool b_trans)
{
    (void)M, (void)N, (void)K, (void)b_trans;
    return "none";
}

static void mm_run(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K, bool b_trans, bool accumulate)
{
    (void)C, (void)A, (void)B, (void)b_trans, (void)accumulate;
    check_failf(__FILE__, __LINE__, "BF16 GEMM (%d x %d x %d): built without oneDNN", M, N, K);
}

bool cpu_bf16_gemm_available(void) { return false; }
const char *cpu_bf16_gemm_name(void) { return "no BF16 GEMM (built without oneDNN)"; }

#endif

static void need_bf16(const char *what, int N, int Din, int Dout)
{
    if (!cpu_bf16_gemm_available())
        check_failf(__FILE__, __LINE__, "%s (%d x %d x %d): %s", what, N, Din, Dout, cpu_bf16_gemm_name());
}

void bf16_gemm(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K, bool b_trans, bool accumulate)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        if (!accumulate)
            memset(C, 0, (size_t)M * N * sizeof(float));
        return;
    }
    need_bf16("bf16_gemm", M, K, N);
    mm_run(C, A, B, M, N, K, b_trans, accumulate);
}

void linear_forward_bf16(float *y, const float *x, const float *W, const float *b, int N, int Din, int Dout)
{
    if (N <= 0 || Dout <= 0)
        return;
    if (Din <= 0) {
        memset(y, 0, (size_t)N * Dout * sizeof(float));
    } else {
        need_bf16("linear_forward_bf16", N, Din, Dout);
        uint16_t *xb = bf16_scratch(&g_a, (size_t)N * Din), *wb = bf16_scratch(&g_b, (size_t)Dout * Din);
        bf16_round(xb, x, (size_t)N * Din);
        bf16_round(wb, W, (size_t)Dout * Din);
        /* y (N, Dout) = x (N, Din) W^T; W (Dout, Din) row-major is W^T stored transposed */
        mm_run(y, xb, wb, N, Dout, Din, true, false);
    }
    if (b)
        for (int i = 0; i < N; i++) {
            float *yi = y + (size_t)i * Dout;
            for (int o = 0; o < Dout; o++)
                yi[o] += b[o];
        }
}

void linear_backward_bf16(float *dx, float *dW, float *db, const float *dy, const float *x, const float *W, int N,
                          int Din, int Dout)
{
    if (N <= 0 || Dout <= 0)
        return;
    if (Din > 0 && (dx || dW)) {
        need_bf16("linear_backward_bf16", N, Din, Dout);
        if (dx) { /* dx (N, Din) += dy (N, Dout) W (Dout, Din) */
            uint16_t *dyb = bf16_scratch(&g_a, (size_t)N * Dout), *wb = bf16_scratch(&g_b, (size_t)Dout * Din);
            bf16_round(dyb, dy, (size_t)N * Dout);
            bf16_round(wb, W, (size_t)Dout * Din);
            mm_run(dx, dyb, wb, N, Din, Dout, false, true);
        }
        if (dW) { /* dW (Dout, Din) += dy^T (Dout, N) x (N, Din) */
            uint16_t *dyt = bf16_scratch(&g_a, (size_t)N * Dout), *xb = bf16_scratch(&g_b, (size_t)N * Din);
            bf16_round_transpose(dyt, dy, N, Dout);
            bf16_round(xb, x, (size_t)N * Din);
            mm_run(dW, dyt, xb, Dout, Din, N, false, true);
        }
    }
    if (db)
        for (int i = 0; i < N; i++) {
            const float *dyi = dy + (size_t)i * Dout;
            for (int o = 0; o < Dout; o++)
                db[o] += dyi[o];
        }
}
