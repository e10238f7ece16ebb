/* The CPU back-end of the kernel interface: host memory, the fp32 kernels of this folder and OpenBLAS. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/check.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"

/* Big blocks (gradients, activation arenas, KV caches: BIG_BLOCK bytes and more) are mapped here and, once freed,
 * kept for the next allocation they fit instead of going back to the kernel: a block mapped anew costs a page fault
 * for every 4 KiB when first written (about 1.1 s a GB on the test machine's virtual machine), and a GRPO step frees
 * its gradients and training buffers before generation (rollout.free_cache_engine) and maps them again in the update:
 * about 1.3 GB a step at 134.5 M parameters. The process keeps them, as PyTorch's caching allocator does with
 * freed tensors; generation takes what fits of them. The memory kept idle is at most the memory in big blocks in use
 * (the oldest kept first given back beyond that) and at most MAX_KEPT blocks; GRPO_CPU_KEEP_FREED=0 gives every
 * freed block back at once. Smaller blocks are malloc's. One table for the process (every CPU context's memory is
 * the same host memory), under a lock. */
#if defined(__SANITIZE_ADDRESS__)
#define GRPO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GRPO_ASAN 1
#endif
#endif
#ifdef GRPO_ASAN /* under AddressSanitizer a kept block is poisoned (a use after its free is reported), and so is a    \
                  * block's tail past what was asked (a write past the end) */
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define BIG_BLOCK ((size_t)4 << 20)
#define MAP_ROUND ((size_t)2 << 20)
#define MAX_KEPT 32

struct big {
    char *p;
    size_t cap;
};

static struct {
    pthread_mutex_t lock;
    struct big *live; /* sorted by address */
    size_t n_live, cap_live, live_bytes;
    struct big kept[MAX_KEPT]; /* oldest first */
    int n_kept;
    size_t kept_bytes;
} g_big = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool keep_freed(void)
{
    const char *e = getenv("GRPO_CPU_KEEP_FREED");
    return !(e && strcmp(e, "0") == 0);
}

/* the live table's index of p, or where it would go */
static size_t live_find(const char *p)
{
    size_t lo = 0, hi = g_big.n_live;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (g_big.live[mid].p < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void kept_drop(int i)
{
    g_big.kept_bytes -= g_big.kept[i].cap;
    memmove(&g_big.kept[i], &g_big.kept[i + 1], (size_t)(g_big.n_kept - i - 1) * sizeof g_big.kept[0]);
    g_big.n_kept--;
}

static void *big_alloc(size_t bytes)
{
    const size_t cap = (bytes + MAP_ROUND - 1) / MAP_ROUND * MAP_ROUND;
    char *p = NULL;
    size_t got = cap;
    pthread_mutex_lock(&g_big.lock);
    int best = -1; /* the smallest kept block that fits, wasting at most half of it */
    for (int i = 0; i < g_big.n_kept; i++)
        if (g_big.kept[i].cap >= cap && g_big.kept[i].cap / 2 <= cap &&
            (best < 0 || g_big.kept[i].cap < g_big.kept[best].cap))
            best = i;
    if (best >= 0) {
        p = g_big.kept[best].p;
        got = g_big.kept[best].cap;
        kept_drop(best);
    }
    pthread_mutex_unlock(&g_big.lock);
    if (!p) {
        void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        p = m;
    }
    pthread_mutex_lock(&g_big.lock);
    if (g_big.n_live == g_big.cap_live) {
        g_big.cap_live = g_big.cap_live ? 2 * g_big.cap_live : 64;
        g_big.live = xrealloc(g_big.live, g_big.cap_live * sizeof *g_big.live);
    }
    const size_t at = live_find(p);
    memmove(&g_big.live[at + 1], &g_big.live[at], (g_big.n_live - at) * sizeof *g_big.live);
    g_big.live[at] = (struct big){p, got};
    g_big.n_live++;
    g_big.live_bytes += got;
    pthread_mutex_unlock(&g_big.lock);
    UNPOISON(p, bytes);
    POISON(p + bytes, got - bytes);
    return p;
}

/* true when p was a big block (kept, or unmapped) */
static bool big_free(char *p)
{
    struct big gone[MAX_KEPT + 1];
    int n_gone = 0;
    pthread_mutex_lock(&g_big.lock);
    const size_t at = live_find(p);
    if (at >= g_big.n_live || g_big.live[at].p != p) {
        pthread_mutex_unlock(&g_big.lock);
        return false;
    }
    const struct big b = g_big.live[at];
    memmove(&g_big.live[at], &g_big.live[at + 1], (g_big.n_live - at - 1) * sizeof *g_big.live);
    g_big.n_live--;
    g_big.live_bytes -= b.cap;
    POISON(b.p, b.cap);
    if (keep_freed()) {
        if (g_big.n_kept == MAX_KEPT)
            gone[n_gone++] = g_big.kept[0], kept_drop(0);
        g_big.kept[g_big.n_kept++] = b;
        g_big.kept_bytes += b.cap;
        while (g_big.n_kept > 0 && g_big.kept_bytes > g_big.live_bytes && n_gone < MAX_KEPT + 1)
            gone[n_gone++] = g_big.kept[0], kept_drop(0);
    } else {
        gone[n_gone++] = b;
    }
    pthread_mutex_unlock(&g_big.lock);
    for (int i = 0; i < n_gone; i++) {
        UNPOISON(gone[i].p, gone[i].cap); /* a later mapping there starts clean */
        munmap(gone[i].p, gone[i].cap);
    }
    return true;
}

static size_t cpu_cached(struct kctx *K)
{
    (void)K;
    pthread_mutex_lock(&g_big.lock);
    const size_t n = g_big.kept_bytes;
    pthread_mutex_unlock(&g_big.lock);
    return n;
}

static void *cpu_alloc(struct kctx *K, size_t bytes)
{
    (void)K;
    if (bytes >= BIG_BLOCK)
        return big_alloc(bytes); /* page-aligned */
    void *p = NULL;
    /* 64-byte aligned: whole cache lines, and AVX-512 loads that never split one */
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return NULL;
    return p;
}
static void cpu_free(struct kctx *K, void *p)
{
    (void)K;
    if (p && !big_free(p))
        free(p);
}
static void cpu_copy(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    (void)K;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
}

static void cpu_copy_rows(struct kctx *K, void *dst, size_t dpitch, const void *src, size_t spitch, size_t bytes,
                          size_t rows)
{
    (void)K;
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, bytes);
}
static void cpu_zero(struct kctx *K, void *p, size_t bytes)
{
    (void)K;
    if (bytes)
        memset(p, 0, bytes);
}
static void cpu_sync(struct kctx *K) { (void)K; }

static void cpu_rmsnorm_forward(struct kctx *K, float *y, float *rstd, const float *x, const float *w, int N, int D,
                                float eps)
{
    (void)K;
    rmsnorm_forward(y, rstd, x, w, N, D, eps);
}
static void cpu_rmsnorm_backward(struct kctx *K, float *dx, float *dw, const float *dy, const float *x, const float *w,
                                 const float *rstd, int N, int D)
{
    (void)K;
    rmsnorm_backward(dx, dw, dy, x, w, rstd, N, D);
}
static void cpu_embedding_forward(struct kctx *K, float *out, const int32_t *ids, const float *table, int N, int D,
                                  const struct vocab_shard *vs)
{
    (void)K;
    embedding_forward_shard(out, ids, table, N, D, vs);
}
static void cpu_embedding_backward(struct kctx *K, float *dtable, const float *dout, const int32_t *ids, int N, int D,
                                   const struct vocab_shard *vs)
{
    (void)K;
    embedding_backward_shard(dtable, dout, ids, N, D, vs);
}
/* Batch-invariant mode (kernels.h): process-wide, set once from the configuration. */
static bool g_batch_invariant;
void k_set_batch_invariant(bool on) { g_batch_invariant = on; }
bool k_batch_invariant(void) { return g_batch_invariant; }

static void cpu_linear_forward(struct kctx *K, float *y, const float *x, const float *W, const float *b, int N, int Din,
                               int Dout)
{
    if (g_batch_invariant) { /* every M through the fixed-order kernel, fp32 also in a BF16 context */
        linear_forward_bi(y, x, Din, W, Din, N, Din, Dout);
        if (b)
            for (int i = 0; i < N; i++)
                vec_add_inplace(y + (size_t)i * Dout, b, (size_t)Dout);
        return;
    }
    /* A decode step's few rows stay fp32 in a BF16 context: the few-row kernel reads the fp32 weights once, while
     * the BF16 product would first round all of them (a decode step at batch 8 ran at 256 tokens/s so, against 348
     * in fp32 on Zen 5; docs/results/performance.md). */
    if (K->matmul == KMM_BF16 && !skinny_wanted(N, Din))
        linear_forward_bf16(y, x, W, b, N, Din, Dout);
    else
        linear_forward(y, x, W, b, N, Din, Dout);
}
static void cpu_linear_backward(struct kctx *K, float *dx, float *dW, float *db, const float *dy, const float *x,
                                const float *W, int N, int Din, int Dout)
{
    if (K->matmul == KMM_BF16)
        linear_backward_bf16(dx, dW, db, dy, x, W, N, Din, Dout);
    else
        linear_backward(dx, dW, db, dy, x, W, N, Din, Dout);
}
static void cpu_linear_forward_ld(struct kctx *K, float *y, const float *x, int ldx, const float *W, int ldw, int N,
                                  int Din, int Dout)
{
    (void)K;
    linear_forward_bi(y, x, ldx, W, ldw, N, Din, Dout);
}
static void cpu_rope_forward(struct kctx *K, float *x, const int32_t *pos, int N, int H, int hd, const double *inv_freq)
{
    (void)K;
    rope_forward_freqs(x, pos, N, H, hd, inv_freq);
}
static void cpu_rope_backward(struct kctx *K, float *dx, const int32_t *pos, int N, int H, int hd,
                              const double *inv_freq)
{
    (void)K;
    rope_backward_freqs(dx, pos, N, H, hd, inv_freq);
}
static void cpu_attention_forward(struct kctx *K, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *cu_seqlens, const int32_t *prefix_of, int B, int Hq,
                                  int Hkv, int hd)
{
    (void)K;
    attention_forward(out, lse, q, k, v, cu_seqlens, prefix_of, B, Hq, Hkv, hd);
}
static void cpu_attention_backward(struct kctx *K, float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v,
                                   const int32_t *cu_seqlens, const int32_t *prefix_of, int B, int Hq, int Hkv, int hd)
{
    (void)K;
    attention_backward(dq, dk, dv, dout, out, lse, q, k, v, cu_seqlens, prefix_of, B, Hq, Hkv, hd);
}
/* The KV cache stays fp32 on the CPU in either context, and a BF16 context stores its values rounded to BF16: the
 * numbers of the CUDA back-end's BF16 cache, while the attention kernels (their batch-invariant paths included) keep
 * one fp32 input and the fp32 context's results keep their bits. Holding 2-byte elements would halve the cache's host
 * memory but have every decode step widen the whole cache back to fp32 for those kernels. Batch-invariant mode's
 * BF16 context runs its forward in fp32 (cpu_linear_forward) so that generation's log-probs are the trainer's bit for
 * bit: its cache is not rounded either. */
static size_t cpu_kv_elem_bytes(const struct kctx *K)
{
    (void)K;
    return sizeof(float);
}
static void cpu_kv_store(struct kctx *K, void *cache, size_t at, const float *x, size_t n)
{
    kv_store((float *)cache + at, x, n, K->matmul == KMM_BF16 && !g_batch_invariant);
}
static void cpu_attention_cached(struct kctx *K, float *out, const float *q, const void *kcache, const void *vcache,
                                 int Tq, int Tk, int Hq, int Hkv, int hd)
{
    (void)K;
    attention_cached(out, q, kcache, vcache, Tq, Tk, Hq, Hkv, hd);
}
static void cpu_attention_rows(struct kctx *K, float *out, float *lse, const float *q, const float *k, const float *v,
                               const int32_t *kfirst, const int32_t *klast, int n, int Hq, int Hkv, int hd)
{
    (void)K;
    attention_rows(out, lse, q, k, v, kfirst, klast, n, Hq, Hkv, hd);
}
static void cpu_swiglu_forward(struct kctx *K, float *out, const float *gate, const float *up, size_t n)
{
    (void)K;
    swiglu_forward(out, gate, up, n);
}
static void cpu_swiglu_backward(struct kctx *K, float *dgate, float *dup, const float *dout, const float *gate,
                                const float *up, size_t n)
{
    (void)K;
    swiglu_backward(dgate, dup, dout, gate, up, n);
}
static void cpu_add(struct kctx *K, float *y, const float *x, size_t n)
{
    (void)K;
    vec_add_inplace(y, x, n);
}
static void cpu_axpy(struct kctx *K, float *y, float a, const float *x, size_t n)
{
    (void)K;
    vec_axpy(y, a, x, n);
}
static void cpu_scale(struct kctx *K, float *x, double a, size_t n)
{
    (void)K;
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(x[i] * a);
}
static double cpu_sumsq(struct kctx *K, const float *x, size_t n)
{
    (void)K;
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}
static void cpu_lmhead_forward(struct kctx *K, float *logp, float *entropy, const float *h, const float *W,
                               const int32_t *targets, int N, int D, const struct vocab_shard *vs, float temperature,
                               int chunk)
{
    if (K->matmul == KMM_BF16)
        lmhead_logprob_forward_shard_bf16(logp, entropy, h, W, targets, N, D, vs, temperature, chunk);
    else
        lmhead_logprob_forward_shard(logp, entropy, h, W, targets, N, D, vs, temperature, chunk);
}
static void cpu_lmhead_backward(struct kctx *K, float *dh, float *dW, const float *dlogp, const float *dentropy,
                                const float *h, const float *W, const int32_t *targets, int N, int D,
                                const struct vocab_shard *vs, float temperature, int chunk)
{
    if (K->matmul == KMM_BF16)
        lmhead_logprob_backward_shard_bf16(dh, dW, dlogp, dentropy, h, W, targets, N, D, vs, temperature, chunk);
    else
        lmhead_logprob_backward_shard(dh, dW, dlogp, dentropy, h, W, targets, N, D, vs, temperature, chunk);
}
static void cpu_sample(struct kctx *K, int32_t *tokens, float *logps, const float *logits, int B, int V,
                       float temperature, float top_p, int top_k, const double *uniforms)
{
    (void)K;
    for (int b = 0; b < B; b++)
        tokens[b] = sample_row(logits + (size_t)b * V, V, temperature, top_p, top_k, uniforms[b], &logps[b]);
    if (g_batch_invariant) /* the trainer's function of the same row */
        for (int b = 0; b < B; b++)
            logps[b] = logprob_row_bi(logits + (size_t)b * V, V, temperature, tokens[b]);
}
static void cpu_adamw(struct kctx *K, float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                      double beta2, double eps, double weight_decay, int64_t t)
{
    (void)K;
    const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
    const float b1 = (float)beta1, b2 = (float)beta2;
    const float decay = (float)(1.0 - lr * weight_decay);
    const float step = (float)(lr / bc1), e = (float)eps, inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    for (size_t i = 0; i < n; i++) {
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        /* torch: p *= 1 - lr*wd; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) */
        p[i] = p[i] * decay - step * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + e);
    }
}

static void cpu_attention_block_forward(struct kctx *K, float *po, float *plse, const float *q, const float *k,
                                        const float *v, const int32_t *qseq, const int32_t *kseq, int nq, int nk,
                                        int Hq, int Hkv, int hd)
{
    (void)K;
    attention_block_forward(po, plse, q, k, v, qseq, kseq, nq, nk, Hq, Hkv, hd);
}

static void cpu_attention_block_backward(struct kctx *K, float *dq, float *dk, float *dv, const float *dout,
                                         const float *lse, const float *drow, const float *q, const float *k,
                                         const float *v, const int32_t *qseq, const int32_t *kseq, int nq, int nk,
                                         int Hq, int Hkv, int hd)
{
    (void)K;
    attention_block_backward(dq, dk, dv, dout, lse, drow, q, k, v, qseq, kseq, nq, nk, Hq, Hkv, hd);
}

static void cpu_attention_merge(struct kctx *K, float *out, float *lse, const float *po, const float *plse, int n,
                                int Hq, int hd)
{
    (void)K;
    attention_merge(out, lse, po, plse, n, Hq, hd);
}

static void cpu_attention_drow(struct kctx *K, float *drow, const float *dout, const float *out, int n, int Hq, int hd)
{
    (void)K;
    attention_drow(drow, dout, out, n, Hq, hd);
}

const struct kops kops_cpu = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_alloc, /* the CPU's memory is the host's */
    .host_free = cpu_free,
    .cached = cpu_cached,
    .to_device = cpu_copy,
    .to_host = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .copy_rows = cpu_copy_rows,
    .sync = cpu_sync,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .linear_forward = cpu_linear_forward,
    .linear_forward_ld = cpu_linear_forward_ld,
    .linear_backward = cpu_linear_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .kv_elem_bytes = cpu_kv_elem_bytes,
    .kv_store = cpu_kv_store,
    .attention_cached = cpu_attention_cached,
    .attention_rows = cpu_attention_rows,
    .attention_block_forward = cpu_attention_block_forward,
    .attention_block_backward = cpu_attention_block_backward,
    .attention_merge = cpu_attention_merge,
    .attention_drow = cpu_attention_drow,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
    .add = cpu_add,
    .axpy = cpu_axpy,
    .scale = cpu_scale,
    .sumsq = cpu_sumsq,
    .lmhead_forward = cpu_lmhead_forward,
    .lmhead_backward = cpu_lmhead_backward,
    .sample = cpu_sample,
    .adamw = cpu_adamw,
    .moe_route = cpu_moe_route,
    .moe_route_backward = cpu_moe_route_backward,
    .moe_experts_forward = cpu_moe_experts_forward,
    .moe_experts_backward = cpu_moe_experts_backward,
    .moe_gather = cpu_moe_gather,
    .moe_combine = cpu_moe_combine,
    .moe_slot_grad = cpu_moe_slot_grad_op,
    .moe_scatter = cpu_moe_scatter,
};
