/* The CUDA back-end of the kernel interface (kernels.h): device memory, the kernels of this folder and cuBLAS, all
 * on the context's stream. Every pointer an op gets is device memory (k_alloc of this context), the index arrays
 * (ids, targets, positions, cu_seqlens: int32) and RoPE's inv_freq (hd / 2 doubles) included, except where
 * kernels.h says host: the sample op's tokens, logps and uniforms. struct vocab_shard is a host struct and its reduce
 * is called on host buffers, in the order of kernels/cpu/logprob.c. Ops that need values on the host (cu_seqlens
 * for the grid, sumsq's result, the shard statistics, sampled tokens) copy them and synchronise the stream; the
 * others only enqueue. Any CUDA or cuBLAS error is fatal (check.h), naming the call. Index arrays are not range
 * checked on the device as the CPU checks them: an id or target outside [0, V) belongs to no shard.
 *
 * GEMMs: fp32 (KMM_F32) are cublasGemmEx in FP32 with CUBLAS_COMPUTE_32F, TF32 only where K->tf32 says so
 * (CUBLAS_COMPUTE_32F_FAST_TF32); BF16 (KMM_BF16) round their fp32 activations to BF16 into grow-only workspaces
 * first and read their weights from a BF16 copy of each weights buffer kept until the buffer changes (kept_operand),
 * and accumulate in fp32 into fp32 outputs, so weights stay fp32 masters. The LM head's chunk products follow the
 * context's precision too, as the CPU back-end's do, and so do attention_forward's and attention_backward's: in BF16
 * they are batched cuBLAS GEMMs (tc_forward, tc_backward), in fp32 the FP32 flash kernels of attention.cu.
 *
 * Memory: plain cudaMalloc / cudaFree, with the sizes of live allocations kept in a small table so that
 * K->mem.reserved is what the context holds from the device (its allocations plus its workspaces).
 *
 * Graphs (k_graph_begin, kernels.h): the stream captures (cudaStreamBeginCapture, thread-local mode: other threads'
 * allocations are not refused) and the graph is instantiated once and launched as often as asked. What a capture
 * cannot hold (host_wait: a read of results on the host or a free; an allocation; a workspace that must grow; a
 * kept BF16 copy to make) ends the capture there, failed (capture_fail), and runs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/check_cuda.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/kernels.h"
#include "common/config_key_names.h"

static int kops_cuda_open(struct kctx *K, int device, char *why, size_t len);
static void kops_cuda_close(struct kctx *K);
static int kops_cuda_devices(void);
static size_t kops_cuda_device_bytes(struct kctx *K);

/* A grow-only device buffer. */
struct dbuf {
    void *p;
    size_t cap;
};

struct live {
    void *p;
    size_t bytes;
};

enum { BF16_SLOTS = 3 };

/* A weights buffer (k_alloc'd as KMEM_WEIGHTS) and, in a BF16 context, its kept BF16 copy: made at the first
 * product that reads the buffer, and again at the first after a change (stale). */
struct kept {
    const float *base;
    size_t n;   /* floats */
    void *bf16; /* n BF16 values, or NULL until a product reads the buffer */
    bool stale;
};

struct cuda_impl {
    struct dbuf bf16[BF16_SLOTS]; /* GEMM operands rounded to BF16 */
    struct kept *kept;            /* the weights buffers (kernels.h, k_weights_changed) */
    int n_kept, cap_kept;
    int check_kept;                            /* GRPO_CHECK_KEPT_WEIGHTS: -1 not read yet, 0 off, 1 on */
    struct dbuf check;                         /* its fresh rounding */
    struct dbuf scratch;                       /* rmsnorm's dw partials, column sums, sum of squares */
    struct dbuf attn;                          /* attention backward's D, decode partials */
    struct dbuf attn_tc;                       /* BF16 attention's operands and scores (struct tc_ws) */
    struct dbuf lm_z, lm_st;                   /* LM head: a chunk's logits (c, Vl) and its statistics (4c doubles) */
    struct dbuf sample, sample_tok, sample_lp; /* sampling: its scratch; tokens and logps before the host */
    struct dbuf moe, moe_dp;                   /* routing replay's ref and flags; the routing backward's dp_col */
    double *sumsq_result;                      /* one device double */
    double *host_st;                           /* host copy of the statistics for vocab_shard reduce */
    size_t host_st_cap;
    int32_t *host_cu; /* host copy of cu_seqlens */
    size_t host_cu_cap;
    struct live *tab; /* live allocations (open addressing, linear probing) */
    size_t tab_cap, tab_count;
    size_t held; /* bytes of live allocations and workspaces */
    int capture; /* k_graph_begin: 0 none, 1 the stream captures, 2 the capture failed (capture_failed says why) */
    char capture_failed[160];
    uint64_t epoch; /* k_graph_epoch */
    /* k_to_host_behind: the copy stream (made at the first copy), the compute stream's point each copy follows, the
     * last copy's end, and whether a copy went since the host last waited for them */
    cudaStream_t behind;
    cudaEvent_t behind_after, behind_done;
    bool behind_pending;
};

struct kgraph {
    cudaGraphExec_t exec;
};

static struct cuda_impl *impl(struct kctx *K) { return (struct cuda_impl *)K->impl; }
static cudaStream_t stream(struct kctx *K) { return (cudaStream_t)K->stream; }
static cublasHandle_t blas(struct kctx *K) { return (cublasHandle_t)K->blas; }

/* A write into [p, p + bytes): a weights buffer's kept BF16 copy goes stale (below, with the GEMMs). */
static void wrote(struct kctx *K, const void *p, size_t bytes);

/* Ops may run on a thread whose current device is another one: make it this context's. */
static void use(struct kctx *K) { CHECK_CUDA(cudaSetDevice(K->device_index)); }

static void update_reserved(struct kctx *K)
{
    K->mem.reserved = impl(K)->held;
    if (K->mem.reserved > K->mem.max_reserved)
        K->mem.max_reserved = K->mem.reserved;
}

/* ---- the table of live allocations: pointer -> bytes ---- */

static size_t slot_of(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (size_t)h & (cap - 1);
}

static void tab_put(struct cuda_impl *I, void *p, size_t bytes);

static void tab_grow(struct cuda_impl *I)
{
    struct live *old = I->tab;
    size_t old_cap = I->tab_cap;
    I->tab_cap = old_cap ? old_cap * 2 : 256;
    I->tab = xcalloc(I->tab_cap, sizeof *I->tab);
    I->tab_count = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].p)
            tab_put(I, old[i].p, old[i].bytes);
    free(old);
}

static void tab_put(struct cuda_impl *I, void *p, size_t bytes)
{
    if ((I->tab_count + 1) * 2 > I->tab_cap)
        tab_grow(I);
    size_t mask = I->tab_cap - 1, i = slot_of(p, I->tab_cap);
    while (I->tab[i].p)
        i = (i + 1) & mask;
    I->tab[i] = (struct live){p, bytes};
    I->tab_count++;
}

/* Removes p; returns its bytes (0 when it is not there). Backward-shift deletion keeps every probe chain whole. */
static size_t tab_take(struct cuda_impl *I, const void *p)
{
    if (!I->tab_cap)
        return 0;
    size_t mask = I->tab_cap - 1, i = slot_of(p, I->tab_cap);
    while (I->tab[i].p && I->tab[i].p != p)
        i = (i + 1) & mask;
    if (!I->tab[i].p)
        return 0;
    size_t bytes = I->tab[i].bytes;
    for (size_t j = i;;) {
        j = (j + 1) & mask;
        if (!I->tab[j].p)
            break;
        size_t home = slot_of(I->tab[j].p, I->tab_cap);
        /* the entry at j may fill the hole at i unless its home lies cyclically in (i, j] */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!stays) {
            I->tab[i] = I->tab[j];
            i = j;
        }
    }
    I->tab[i] = (struct live){NULL, 0};
    I->tab_count--;
    return bytes;
}

/* ---- what a capture cannot hold ---- */

/* The capture (k_graph_begin) meets what it cannot record, why: it ends here, failed (what it recorded is dropped:
 * k_graph_end returns no graph and why), and the ops from here on run. Nothing while the stream does not capture. */
static void capture_fail(struct kctx *K, const char *why)
{
    struct cuda_impl *I = impl(K);
    if (I->capture != 1)
        return;
    snprintf(I->capture_failed, sizeof I->capture_failed, "%s", why);
    I->capture = 2;
    cudaGraph_t g = NULL;
    CHECK_CUDA(cudaStreamEndCapture(stream(K), &g));
    if (g)
        CHECK_CUDA(cudaGraphDestroy(g));
}

/* The host waits for the stream's work (to read its results, to free what it used): never inside a capture. */
static void host_wait(struct kctx *K, const char *why)
{
    capture_fail(K, why);
    CHECK_CUDA(cudaStreamSynchronize(stream(K)));
}

/* ---- workspaces ---- */

/* b holds at least bytes (grown, never shrunk; the old buffer is freed once the stream is done with it). */
static void *ws(struct kctx *K, struct dbuf *b, size_t bytes)
{
    if (bytes <= b->cap)
        return b->p;
    struct cuda_impl *I = impl(K);
    capture_fail(K, "a workspace had to grow (cudaMalloc)");
    I->epoch++; /* a graph that used the old buffer reads freed memory */
    if (b->p) {
        host_wait(K, "a workspace had to grow");
        CHECK_CUDA(cudaFree(b->p));
        I->held -= b->cap;
        b->p = NULL;
        b->cap = 0;
    }
    size_t cap = bytes < 4096 ? 4096 : bytes + bytes / 8; /* some room, so slowly growing shapes do not churn */
    if (cudaMalloc(&b->p, cap) != cudaSuccess) {
        (void)cudaGetLastError();
        check_failf(__FILE__, __LINE__,
                    "out of memory on cuda:%d: a kernel workspace needs %zu bytes (%.3f GB) beyond the %.3f GB this "
                    "context holds; lower the batch sizes (" KEY_actor_ppo_max_token_len_per_gpu ") or the "
                    "LM-head chunk",
                    K->device_index, cap, (double)cap / 1e9, (double)I->held / 1e9);
    }
    b->cap = cap;
    I->held += cap;
    update_reserved(K);
    return b->p;
}

static void dbuf_free(struct dbuf *b)
{
    if (b->p)
        cudaFree(b->p);
    b->p = NULL;
    b->cap = 0;
}

/* ---- memory ops ---- */

static void *cuda_alloc(struct kctx *K, size_t bytes)
{
    use(K);
    capture_fail(K, "an allocation (cudaMalloc)");
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it, the caller reports */
        return NULL;
    }
    struct cuda_impl *I = impl(K);
    tab_put(I, p, bytes);
    I->held += bytes;
    update_reserved(K);
    return p;
}

static void cuda_free(struct kctx *K, void *p)
{
    if (!p)
        return;
    use(K);
    capture_fail(K, "a free (cudaFree)");
    CHECK_CUDA(cudaFree(p));
    struct cuda_impl *I = impl(K);
    I->epoch++; /* a graph may have read it */
    size_t bytes = tab_take(I, p);
    I->held -= bytes <= I->held ? bytes : I->held;
    update_reserved(K);
}

/* Page-locked host memory: copies from and to it run at the link's full speed and need no staging. */
static void *cuda_host_alloc(struct kctx *K, size_t bytes)
{
    use(K);
    capture_fail(K, "a pinned host allocation (cudaMallocHost)");
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 256) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_host_free(struct kctx *K, void *p)
{
    if (!p)
        return;
    use(K);
    capture_fail(K, "a pinned host free (cudaFreeHost)");
    CHECK_CUDA(cudaFreeHost(p));
}

static void cuda_to_device(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    use(K);
    wrote(K, dst, bytes);
    /* from pageable memory the call returns once src is staged: the caller may reuse it */
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(K)));
}

static void cuda_to_host(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    use(K);
    capture_fail(K, "a read of device memory on the host (to_host)");
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(K)));
    CHECK_CUDA(cudaStreamSynchronize(stream(K)));
}

/* The copy follows the compute stream's work so far (an event it waits on) and runs on a stream of its own, a
 * non-blocking one (the legacy stream's work does not wait for it): the compute that follows overlaps it. */
static void cuda_to_host_behind(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    use(K);
    capture_fail(K, "a copy to the host beside the stream (k_to_host_behind)");
    struct cuda_impl *I = impl(K);
    if (!I->behind) {
        CHECK_CUDA(cudaStreamCreateWithFlags(&I->behind, cudaStreamNonBlocking));
        CHECK_CUDA(cudaEventCreateWithFlags(&I->behind_after, cudaEventDisableTiming));
        CHECK_CUDA(cudaEventCreateWithFlags(&I->behind_done, cudaEventDisableTiming));
    }
    CHECK_CUDA(cudaEventRecord(I->behind_after, stream(K)));
    CHECK_CUDA(cudaStreamWaitEvent(I->behind, I->behind_after, 0));
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, I->behind));
    CHECK_CUDA(cudaEventRecord(I->behind_done, I->behind));
    I->behind_pending = true;
}

static void cuda_behind_wait(struct kctx *K, bool host)
{
    struct cuda_impl *I = impl(K);
    if (!I->behind_pending)
        return;
    use(K);
    CHECK_CUDA(cudaStreamWaitEvent(stream(K), I->behind_done, 0));
    if (!host)
        return;
    capture_fail(K, "a host wait for the copies beside the stream (k_behind_wait)");
    CHECK_CUDA(cudaEventSynchronize(I->behind_done));
    I->behind_pending = false;
}

static void cuda_copy(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src)
        return;
    use(K);
    wrote(K, dst, bytes);
    CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(K)));
}

/* one strided copy (cudaMemcpy2DAsync) for rows blocks of bytes (Ulysses' column slices, say) */
static void cuda_copy_rows(struct kctx *K, void *dst, size_t dpitch, const void *src, size_t spitch, size_t bytes,
                           size_t rows)
{
    if (!bytes || !rows)
        return;
    use(K);
    wrote(K, dst, (rows - 1) * dpitch + bytes);
    CHECK_CUDA(cudaMemcpy2DAsync(dst, dpitch, src, spitch, bytes, rows, cudaMemcpyDeviceToDevice, stream(K)));
}

static void cuda_zero(struct kctx *K, void *p, size_t bytes)
{
    if (!bytes)
        return;
    use(K);
    wrote(K, p, bytes);
    CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, stream(K)));
}

static void cuda_sync(struct kctx *K)
{
    use(K);
    host_wait(K, "a wait for the device (sync)");
}

/* ---- GEMMs ---- */

/* ---- kept BF16 weights (kernels.h, k_weights_changed) ---- */

/* The weights buffer holding [p, p + bytes), or NULL. A model has a handful (the parameters, a LoRA adapter, a
 * ZeRO-1 block): a scan. */
static struct kept *kept_of(struct cuda_impl *I, const void *p, size_t bytes)
{
    const char *c = p;
    for (int i = 0; i < I->n_kept; i++) {
        const char *b = (const char *)I->kept[i].base;
        if (c >= b && c + bytes <= b + I->kept[i].n * sizeof(float))
            return &I->kept[i];
    }
    return NULL;
}

static void cuda_weights_note(struct kctx *K, const void *p, size_t bytes)
{
    if (K->matmul != KMM_BF16) /* fp32 products read the weights themselves: nothing to keep, nothing to mark */
        return;
    struct cuda_impl *I = impl(K);
    if (I->n_kept == I->cap_kept) {
        I->cap_kept = I->cap_kept ? 2 * I->cap_kept : 8;
        I->kept = xrealloc(I->kept, (size_t)I->cap_kept * sizeof *I->kept);
    }
    I->kept[I->n_kept++] = (struct kept){.base = p, .n = bytes / sizeof(float), .stale = true};
}

static void cuda_weights_forget(struct kctx *K, const void *p)
{
    struct cuda_impl *I = impl(K);
    for (int i = 0; i < I->n_kept; i++) {
        if (I->kept[i].base != p)
            continue;
        if (I->kept[i].bf16) {
            use(K);
            host_wait(K, "a kept BF16 weight copy freed"); /* no product reads it any more */
            CHECK_CUDA(cudaFree(I->kept[i].bf16));
            I->epoch++;
            I->held -= I->kept[i].n * 2;
            update_reserved(K);
        }
        I->kept[i] = I->kept[--I->n_kept];
        return;
    }
}

/* Anything written into [p, p + bytes) of a weights buffer makes its copy stale (the ops below that write call it). */
static void wrote(struct kctx *K, const void *p, size_t bytes)
{
    struct kept *k = impl(K)->n_kept ? kept_of(impl(K), p, bytes ? bytes : 1) : NULL;
    if (k) {
        k->stale = true;
        impl(K)->epoch++; /* a graph that reads the copy would read the old weights */
    }
}

static void cuda_weights_changed(struct kctx *K, const void *p) { wrote(K, p, 1); }

/* Whether the kept copy k equals a fresh rounding of its buffer (a device compare, through the host). */
static bool kept_fresh(struct kctx *K, const struct kept *k)
{
    struct cuda_impl *I = impl(K);
    void *now = ws(K, &I->check, k->n * 2);
    CHECK_CUDA(f32_to_bf16_cuda(now, k->base, k->n, stream(K)));
    uint16_t *a = xmalloc(k->n * 2), *b = xmalloc(k->n * 2);
    capture_fail(K, "a kept BF16 weight copy checked on the host");
    CHECK_CUDA(cudaMemcpyAsync(a, now, k->n * 2, cudaMemcpyDeviceToHost, stream(K)));
    CHECK_CUDA(cudaMemcpyAsync(b, k->bf16, k->n * 2, cudaMemcpyDeviceToHost, stream(K)));
    CHECK_CUDA(cudaStreamSynchronize(stream(K)));
    const bool same = memcmp(a, b, k->n * 2) == 0;
    free(a), free(b);
    return same;
}

static int cuda_weights_check(struct kctx *K)
{
    struct cuda_impl *I = impl(K);
    use(K);
    int bad = 0;
    for (int i = 0; i < I->n_kept; i++)
        bad += I->kept[i].bf16 && !I->kept[i].stale && !kept_fresh(K, &I->kept[i]);
    return bad;
}

static bool checking_kept(struct cuda_impl *I)
{
    if (I->check_kept < 0) {
        const char *e = getenv("GRPO_CHECK_KEPT_WEIGHTS");
#ifdef GRPO_CUEMU
        I->check_kept = !(e && strcmp(e, "0") == 0); /* on under the emulator unless turned off */
#else
        I->check_kept = e && strcmp(e, "1") == 0;
#endif
    }
    return I->check_kept == 1;
}

/* W (n floats inside weights buffer k) as a BF16 operand: the kept copy, made again first if stale. */
static const void *kept_operand(struct kctx *K, struct kept *k, const float *W, const char *who)
{
    struct cuda_impl *I = impl(K);
    if (!k->bf16 || k->stale) /* a graph would round the weights again at every launch */
        capture_fail(K, "a kept BF16 weight copy had to be made");
    if (!k->bf16) {
        CHECK_CUDA(cudaMalloc(&k->bf16, k->n * 2));
        I->held += k->n * 2;
        update_reserved(K);
        k->stale = true;
    }
    if (k->stale) {
        CHECK_CUDA(f32_to_bf16_cuda(k->bf16, k->base, k->n, stream(K)));
        k->stale = false;
        I->epoch++;
        K->gemm.kept_refreshes++;
        K->gemm.kept_refresh_bytes += k->n * sizeof(float);
    } else if (I->capture == 0 && checking_kept(I) && !kept_fresh(K, k)) {
        /* (not while capturing: the check reads on the host; the eager steps before a capture check) */
        check_failf(__FILE__, __LINE__,
                    "%s: the kept BF16 copy of a weights buffer (%zu parameters) is stale: something wrote the "
                    "weights without k_weights_changed (kernels.h)",
                    who, k->n);
    }
    return (const uint16_t *)k->bf16 + (W - k->base);
}

/* x in the context's GEMM precision: itself (fp32), or rounded to BF16 into workspace slot. */
static const void *gemm_operand(struct kctx *K, int slot, const float *x, size_t n)
{
    if (K->matmul != KMM_BF16)
        return x;
    void *dst = ws(K, &impl(K)->bf16[slot], n * 2);
    CHECK_CUDA(f32_to_bf16_cuda(dst, x, n, stream(K)));
    K->gemm.round_bytes_act += n * sizeof(float);
    return dst;
}

/* A weight W (n floats) in the context's GEMM precision: in BF16, the kept copy when W lies in a weights buffer
 * (who names the product, for the check), else rounded into workspace slot as any operand. */
static const void *gemm_weight(struct kctx *K, int slot, const float *W, size_t n, const char *who)
{
    if (K->matmul != KMM_BF16)
        return W;
    struct kept *k = kept_of(impl(K), W, n * sizeof(float));
    if (k)
        return kept_operand(K, k, W, who);
    void *dst = ws(K, &impl(K)->bf16[slot], n * 2);
    CHECK_CUDA(f32_to_bf16_cuda(dst, W, n, stream(K)));
    K->gemm.round_bytes_weights += n * sizeof(float);
    return dst;
}

/* Row-major C (M, N) = alpha op(A) op(B) + beta C, A and B in the context's precision (gemm_operand), lda, ldb,
 * ldc the row-major leading dimensions. A row-major matrix is its transpose in column-major, so this is the
 * column-major C^T = op(B)^T op(A)^T: cuBLAS gets B first, with the same transpose flags, and N, M swapped. */
static void gemm_rm(struct kctx *K, bool ta, bool tb, int M, int N, int Kd, float alpha, const void *A, int lda,
                    const void *B, int ldb, float beta, float *C, int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    const cudaDataType_t in = K->matmul == KMM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    /* fp32 products on TF32 tensor cores only where K->tf32 allows it (fp32_matmul_precision=high) */
    const cublasComputeType_t ct = K->matmul == KMM_F32 && K->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    CHECK_CUBLAS(cublasGemmEx(blas(K), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, Kd, &alpha,
                              B, in, ldb, A, in, lda, &beta, C, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT));
}

static void cuda_linear_forward(struct kctx *K, float *y, const float *x, const float *W, const float *b, int N,
                                int Din, int Dout)
{
    if (N <= 0 || Dout <= 0)
        return;
    use(K);
    if (Din <= 0) {
        CHECK_CUDA(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)N * Dout, stream(K)));
    } else {
        /* y (N, Dout) = x (N, Din) W^T */
        const void *xa = gemm_operand(K, 0, x, (size_t)N * Din);
        const void *wa = gemm_weight(K, 1, W, (size_t)Dout * Din, "linear_forward");
        gemm_rm(K, false, true, N, Dout, Din, 1.0f, xa, Din, wa, Din, 0.0f, y, Dout);
    }
    if (b)
        CHECK_CUDA(bias_add_cuda(y, b, N, Dout, stream(K)));
}

static void cuda_linear_backward(struct kctx *K, float *dx, float *dW, float *db, const float *dy, const float *x,
                                 const float *W, int N, int Din, int Dout)
{
    if (N <= 0 || Dout <= 0)
        return;
    use(K);
    if ((dx || dW) && Din > 0) {
        const void *dya = gemm_operand(K, 0, dy, (size_t)N * Dout);
        if (dx) /* dx (N, Din) += dy (N, Dout) W (Dout, Din) */
            gemm_rm(K, false, false, N, Din, Dout, 1.0f, dya, Dout,
                    gemm_weight(K, 1, W, (size_t)Dout * Din, "linear_backward"), Din, 1.0f, dx, Din);
        if (dW) /* dW (Dout, Din) += dy^T x */
            gemm_rm(K, true, false, Dout, Din, N, 1.0f, dya, Dout, gemm_operand(K, 2, x, (size_t)N * Din), Din, 1.0f,
                    dW, Din);
    }
    if (db) {
        void *s = ws(K, &impl(K)->scratch, colsum_add_cuda_scratch_bytes(N, Dout));
        CHECK_CUDA(colsum_add_cuda(db, dy, N, Dout, s, stream(K)));
    }
}

/* ---- element-wise and per-row ops ---- */

static void cuda_rmsnorm_forward(struct kctx *K, float *y, float *rstd, const float *x, const float *w, int N, int D,
                                 float eps)
{
    use(K);
    CHECK_CUDA(rmsnorm_forward_cuda(y, rstd, x, w, N, D, eps, stream(K)));
}

static void cuda_rmsnorm_backward(struct kctx *K, float *dx, float *dw, const float *dy, const float *x, const float *w,
                                  const float *rstd, int N, int D)
{
    if (N <= 0 || D <= 0)
        return;
    use(K);
    void *s = ws(K, &impl(K)->scratch, rmsnorm_backward_cuda_scratch_bytes(N, D));
    CHECK_CUDA(rmsnorm_backward_cuda(dx, dw, dy, x, w, rstd, N, D, s, stream(K)));
}

static void check_shard(const char *who, const struct vocab_shard *vs)
{
    if (!vs || vs->V <= 0 || vs->lo < 0 || vs->hi <= vs->lo || vs->hi > vs->V)
        check_failf(__FILE__, __LINE__, "%s: need a non-empty vocabulary shard [lo, hi) of V (got %s[%d, %d) of %d)",
                    who, vs ? "" : "none, ", vs ? vs->lo : 0, vs ? vs->hi : 0, vs ? vs->V : 0);
}

/* ids outside [0, V) cannot be checked on the device: they belong to no shard (zero rows, no gradient). */
static void cuda_embedding_forward(struct kctx *K, float *out, const int32_t *ids, const float *table, int N, int D,
                                   const struct vocab_shard *vs)
{
    check_shard("embedding_forward", vs);
    use(K);
    CHECK_CUDA(embedding_forward_cuda(out, ids, table, N, D, vs->lo, vs->hi, stream(K)));
}

static void cuda_embedding_backward(struct kctx *K, float *dtable, const float *dout, const int32_t *ids, int N, int D,
                                    const struct vocab_shard *vs)
{
    check_shard("embedding_backward", vs);
    use(K);
    CHECK_CUDA(embedding_backward_cuda(dtable, dout, ids, N, D, vs->lo, vs->hi, stream(K)));
}

static void check_rope(int hd)
{
    if (hd % 2 != 0)
        check_failf(__FILE__, __LINE__, "rope: head_dim %d is odd", hd);
}

/* inv_freq: a DEVICE array of hd / 2 doubles for this back-end. */
static void cuda_rope_forward(struct kctx *K, float *x, const int32_t *pos, int N, int H, int hd,
                              const double *inv_freq)
{
    check_rope(hd);
    use(K);
    CHECK_CUDA(rope_forward_cuda(x, pos, N, H, hd, inv_freq, stream(K)));
}

static void cuda_rope_backward(struct kctx *K, float *dx, const int32_t *pos, int N, int H, int hd,
                               const double *inv_freq)
{
    check_rope(hd);
    use(K);
    CHECK_CUDA(rope_backward_cuda(dx, pos, N, H, hd, inv_freq, stream(K)));
}

static void cuda_swiglu_forward(struct kctx *K, float *out, const float *gate, const float *up, size_t n)
{
    use(K);
    CHECK_CUDA(swiglu_forward_cuda(out, gate, up, n, stream(K)));
}

static void cuda_swiglu_backward(struct kctx *K, float *dgate, float *dup, const float *dout, const float *gate,
                                 const float *up, size_t n)
{
    use(K);
    CHECK_CUDA(swiglu_backward_cuda(dgate, dup, dout, gate, up, n, stream(K)));
}

static void cuda_add(struct kctx *K, float *y, const float *x, size_t n)
{
    use(K);
    wrote(K, y, n * sizeof(float));
    CHECK_CUDA(vec_add_cuda(y, x, n, stream(K)));
}

static void cuda_axpy(struct kctx *K, float *y, float a, const float *x, size_t n)
{
    use(K);
    wrote(K, y, n * sizeof(float));
    CHECK_CUDA(vec_axpy_cuda(y, a, x, n, stream(K)));
}

static void cuda_scale(struct kctx *K, float *x, double a, size_t n)
{
    use(K);
    wrote(K, x, n * sizeof(float));
    /* a double coefficient, one rounding: the CPU's bits */
    CHECK_CUDA(vec_scale_cuda(x, a, n, stream(K)));
}

static double cuda_sumsq(struct kctx *K, const float *x, size_t n)
{
    if (n == 0)
        return 0.0;
    use(K);
    struct cuda_impl *I = impl(K);
    void *s = ws(K, &I->scratch, sumsq_cuda_scratch_bytes());
    CHECK_CUDA(sumsq_cuda(I->sumsq_result, x, n, s, stream(K)));
    double r = 0.0;
    capture_fail(K, "a sum of squares read on the host");
    CHECK_CUDA(cudaMemcpyAsync(&r, I->sumsq_result, sizeof r, cudaMemcpyDeviceToHost, stream(K)));
    CHECK_CUDA(cudaStreamSynchronize(stream(K)));
    return r;
}

static void cuda_adamw(struct kctx *K, float *p, const float *g, float *m, float *v, size_t n, double lr, double beta1,
                       double beta2, double eps, double weight_decay, int64_t t)
{
    if (t < 1)
        check_failf(__FILE__, __LINE__, "adamw: step %lld (need t >= 1)", (long long)t);
    use(K);
    wrote(K, p, n * sizeof(float));
    CHECK_CUDA(adamw_step_cuda(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t, stream(K)));
}

/* ---- attention ---- */

static void check_heads(struct kctx *K, const char *who, int Hq, int Hkv, int hd, bool backward, bool tiles)
{
    if (Hq <= 0 || Hkv <= 0 || hd <= 0 || Hq % Hkv != 0 || hd > 256)
        check_failf(__FILE__, __LINE__,
                    "%s: bad head layout Hq=%d Hkv=%d hd=%d (need Hq %% Hkv == 0 and head_dim <= 256 on CUDA)", who, Hq,
                    Hkv, hd);
    if (!tiles) /* a BF16 context's attention_forward and _backward: cuBLAS products, no tiles of ours */
        return;
    /* the tiles of the flash-style kernels live in shared memory: hd 128's backward takes 114 KiB a block, which
     * an H100/H200 (227 KiB) and an A100 (163 KiB) give, and an sm_86/sm_89 card (99 KiB) does not */
    int limit = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, K->device_index));
    const size_t need = attention_smem_bytes(hd, backward);
    if (need > (size_t)limit)
        check_failf(__FILE__, __LINE__,
                    "%s: head_dim %d needs %zu bytes of shared memory per block, and cuda:%d gives at most %d: this "
                    "model's attention does not run on this GPU (an A100, H100 or H200 runs head_dim 128)",
                    who, hd, need, K->device_index, limit);
}

/* Shared-prompt packing has no CUDA kernel yet: the trainer packs whole sequences on a GPU. */
static void no_prefix(const char *who, const int32_t *prefix_of)
{
    if (prefix_of)
        check_failf(__FILE__, __LINE__,
                    "%s: shared-prompt packing (a batch with prefix_of) is not implemented on CUDA; "
                    "set " KEY_actor_shared_prompt_packing "=false",
                    who);
}

/* cu_seqlens (device) read on the host and checked as the CPU does; returns the longest sequence and sets *N. */
static int read_seqlens(struct kctx *K, const char *who, const int32_t *cu, int B, int *N)
{
    struct cuda_impl *I = impl(K);
    if (B < 0 || B > 65535)
        check_failf(__FILE__, __LINE__, "%s: %d sequences (at most 65535 per call on CUDA)", who, B);
    if ((size_t)B + 1 > I->host_cu_cap) {
        I->host_cu_cap = (size_t)B + 1 < 64 ? 64 : (size_t)B + 1;
        free(I->host_cu);
        I->host_cu = xmalloc(I->host_cu_cap * sizeof *I->host_cu);
    }
    capture_fail(K, "cu_seqlens read on the host");
    CHECK_CUDA(cudaMemcpyAsync(I->host_cu, cu, sizeof(int32_t) * ((size_t)B + 1), cudaMemcpyDeviceToHost, stream(K)));
    CHECK_CUDA(cudaStreamSynchronize(stream(K)));
    int m = 0;
    for (int b = 0; b < B; b++) {
        int L = I->host_cu[b + 1] - I->host_cu[b];
        if (L < 0 || I->host_cu[b] < 0)
            check_failf(__FILE__, __LINE__, "%s: cu_seqlens[%d], [%d] = %d, %d is not a valid range", who, b, b + 1,
                        (int)I->host_cu[b], (int)I->host_cu[b + 1]);
        if (L > m)
            m = L;
    }
    *N = B > 0 ? I->host_cu[B] : 0;
    return m;
}

/* ---- attention in a BF16 context: the products on tensor cores (attention_tc.cu) ----
 *
 * Per sequence and tile of its query rows (attention_tc_tile_rows), each product is one cublasGemmStridedBatchedEx
 * over the KV heads, BF16 inputs with fp32 accumulation: S = scale Q K^T and O = P V forward (2 per tile), S, dP =
 * dO V^T, dV += P^T dO, dK += scale dS^T Q and dQ = scale dS K backward (5 per tile). q and dout go in grouped
 * (attention_tc.cu: a KV head's query heads over a tile are one matrix), k and v as they are (rows Hkv hd apart, the
 * heads hd apart); dk and dv accumulate in place, out and dq come back from the grouped layout in one pass. The
 * scores are fp32, P and dS rounded to BF16 for the products that read them: inputs rounded to BF16 and fp32 sums,
 * as the context's linear ops. */

/* Row-major C (M, N) = alpha op(A) op(B) + beta C for each of batch entries whose A, B and C lie sA, sB and sC
 * elements apart: A and B BF16, C fp32, mapped to column-major as gemm_rm does. */
static void gemm_rm_batched(struct kctx *K, bool ta, bool tb, int M, int N, int Kd, float alpha, const void *A, int lda,
                            long long sA, const void *B, int ldb, long long sB, float beta, float *C, int ldc,
                            long long sC, int batch)
{
    CHECK_CUBLAS(cublasGemmStridedBatchedEx(blas(K), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N,
                                            M, Kd, &alpha, B, CUDA_R_16BF, ldb, sB, A, CUDA_R_16BF, lda, sA, &beta, C,
                                            CUDA_R_32F, ldc, sC, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    K->gemm.attn_products++;
}

/* The BF16 attention's workspace (impl->attn_tc), in pieces: q, k, v and (backward) dout in BF16, q and dout
 * grouped; out or dq grouped in fp32; one tile's scores S in fp32 and P in BF16, with the backward's dP (fp32) and dS
 * (BF16). With N rows, the largest tile's T = rows x keys x Hq: 2 N (Hq + 2 Hkv) hd + 4 N Hq hd + 6 T bytes forward,
 * 2 N (2 Hq + 2 Hkv) hd + 4 N Hq hd + 12 T backward; 12 T is at most 256 MiB unless a tile's 16 rows at least take
 * more (a sequence of over 1.4M / Hq rows; attention_tc.cu). */
struct tc_ws {
    uint16_t *q, *k, *v, *dout;
    float *o, *s, *dp;
    void *p, *ds;
};

static size_t tc_piece(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

static struct tc_ws tc_take(struct kctx *K, int B, int N, int Hq, int Hkv, int hd, bool backward)
{
    struct cuda_impl *I = impl(K);
    const size_t nq = (size_t)N * Hq * hd, nk = (size_t)N * Hkv * hd;
    size_t T = 0;
    for (int b = 0; b < B; b++) {
        const int L = I->host_cu[b + 1] - I->host_cu[b];
        const size_t t = (size_t)attention_tc_tile_rows(L, Hq) * L * Hq;
        T = t > T ? t : T;
    }
    const size_t bytes[9] = {2 * nq,
                             2 * nk,
                             2 * nk,
                             backward ? 2 * nq : 0,
                             4 * nq,
                             4 * T,
                             backward ? 4 * T : 0,
                             2 * T,
                             backward ? 2 * T : 0};
    size_t total = 0;
    for (int i = 0; i < 9; i++)
        total += tc_piece(bytes[i]);
    char *at = ws(K, &I->attn_tc, total);
    void *piece[9];
    for (int i = 0; i < 9; i++) {
        piece[i] = bytes[i] ? at : NULL;
        at += tc_piece(bytes[i]);
    }
    return (struct tc_ws){piece[0], piece[1], piece[2], piece[3], piece[4], piece[5], piece[6], piece[7], piece[8]};
}

/* The operands of rows [t0, N) in BF16: q and dout (NULL: none) grouped, k and v as they are. */
static void tc_operands(struct kctx *K, const struct tc_ws *w, const float *q, const float *k, const float *v,
                        const float *dout, int t0, int N, int Hq, int Hkv, int hd)
{
    const size_t at = (size_t)t0 * Hkv * hd, nk = (size_t)(N - t0) * Hkv * hd, nq = (size_t)(N - t0) * Hq * hd;
    CHECK_CUDA(attention_tc_group_cuda(w->q, q, t0, N, Hq, Hkv, hd, stream(K)));
    CHECK_CUDA(f32_to_bf16_cuda(w->k + at, k + at, nk, stream(K)));
    CHECK_CUDA(f32_to_bf16_cuda(w->v + at, v + at, nk, stream(K)));
    if (dout)
        CHECK_CUDA(attention_tc_group_cuda(w->dout, dout, t0, N, Hq, Hkv, hd, stream(K)));
    K->gemm.round_bytes_act += sizeof(float) * (nq * (dout ? 2 : 1) + 2 * nk);
}

/* The BF16 forward of the B sequences of impl->host_cu (read_seqlens), N rows. */
static void tc_forward(struct kctx *K, float *out, float *lse, const float *q, const float *k, const float *v, int B,
                       int N, int Hq, int Hkv, int hd)
{
    const int32_t *cu = impl(K)->host_cu;
    const int g = Hq / Hkv, ldk = Hkv * hd;
    const long long sq = (long long)N * g * hd; /* a KV head's grouped rows */
    const float scale = (float)(1.0 / sqrt((double)hd));
    const struct tc_ws w = tc_take(K, B, N, Hq, Hkv, hd, false);
    tc_operands(K, &w, q, k, v, NULL, cu[0], N, Hq, Hkv, hd);
    for (int b = 0; b < B; b++) {
        const int s0 = cu[b], L = cu[b + 1] - s0, rows = attention_tc_tile_rows(L, Hq);
        const size_t ko = (size_t)s0 * ldk;
        for (int i0 = 0; i0 < L; i0 += rows) {
            const int i1 = L - i0 < rows ? L : i0 + rows, R = (i1 - i0) * g;
            const long long ss = (long long)R * i1;
            const size_t qo = (size_t)(s0 + i0) * g * hd;
            /* S (R, i1) = scale Q K^T; P = softmax(S); O (R, hd) = P V */
            gemm_rm_batched(K, false, true, R, i1, hd, scale, w.q + qo, hd, sq, w.k + ko, ldk, hd, 0.0f, w.s, i1, ss,
                            Hkv);
            CHECK_CUDA(attention_tc_softmax_cuda(w.p, lse, w.s, s0, i0, i1, Hq, Hkv, stream(K)));
            gemm_rm_batched(K, false, false, R, hd, i1, 1.0f, w.p, i1, ss, w.v + ko, ldk, hd, 0.0f, w.o + qo, hd, sq,
                            Hkv);
        }
    }
    CHECK_CUDA(attention_tc_ungroup_cuda(out, w.o, cu[0], N, Hq, Hkv, hd, 0, stream(K)));
}

/* The BF16 backward: dq, dk, dv += the gradients, the probabilities recomputed from lse. */
static void tc_backward(struct kctx *K, float *dq, float *dk, float *dv, const float *dout, const float *out,
                        const float *lse, const float *q, const float *k, const float *v, int B, int N, int Hq, int Hkv,
                        int hd)
{
    const int32_t *cu = impl(K)->host_cu;
    const int t0 = cu[0], g = Hq / Hkv, ldk = Hkv * hd;
    const long long sq = (long long)N * g * hd;
    const float scale = (float)(1.0 / sqrt((double)hd));
    float *D = ws(K, &impl(K)->attn, attention_backward_cuda_scratch_bytes(N, Hq)); /* dout . out, (N, Hq) */
    CHECK_CUDA(attention_drow_cuda(D + (size_t)t0 * Hq, dout + (size_t)t0 * Hq * hd, out + (size_t)t0 * Hq * hd, N - t0,
                                   Hq, hd, stream(K)));
    const struct tc_ws w = tc_take(K, B, N, Hq, Hkv, hd, true);
    tc_operands(K, &w, q, k, v, dout, t0, N, Hq, Hkv, hd);
    for (int b = 0; b < B; b++) {
        const int s0 = cu[b], L = cu[b + 1] - s0, rows = attention_tc_tile_rows(L, Hq);
        const size_t ko = (size_t)s0 * ldk;
        for (int i0 = 0; i0 < L; i0 += rows) {
            const int i1 = L - i0 < rows ? L : i0 + rows, R = (i1 - i0) * g;
            const long long ss = (long long)R * i1;
            const size_t qo = (size_t)(s0 + i0) * g * hd;
            /* S = scale Q K^T, dP = dO V^T; P and dS; dV += P^T dO, dK += scale dS^T Q, dQ = scale dS K */
            gemm_rm_batched(K, false, true, R, i1, hd, scale, w.q + qo, hd, sq, w.k + ko, ldk, hd, 0.0f, w.s, i1, ss,
                            Hkv);
            gemm_rm_batched(K, false, true, R, i1, hd, 1.0f, w.dout + qo, hd, sq, w.v + ko, ldk, hd, 0.0f, w.dp, i1, ss,
                            Hkv);
            CHECK_CUDA(attention_tc_dsoft_cuda(w.p, w.ds, w.s, w.dp, lse, D, s0, i0, i1, Hq, Hkv, stream(K)));
            gemm_rm_batched(K, true, false, i1, hd, R, 1.0f, w.p, i1, ss, w.dout + qo, hd, sq, 1.0f, dv + ko, ldk, hd,
                            Hkv);
            gemm_rm_batched(K, true, false, i1, hd, R, scale, w.ds, i1, ss, w.q + qo, hd, sq, 1.0f, dk + ko, ldk, hd,
                            Hkv);
            gemm_rm_batched(K, false, false, R, hd, i1, scale, w.ds, i1, ss, w.k + ko, ldk, hd, 0.0f, w.o + qo, hd, sq,
                            Hkv);
        }
    }
    CHECK_CUDA(attention_tc_ungroup_cuda(dq, w.o, t0, N, Hq, Hkv, hd, 1, stream(K)));
}

static void cuda_attention_forward(struct kctx *K, float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *cu_seqlens, const int32_t *prefix_of, int B, int Hq,
                                   int Hkv, int hd)
{
    check_heads(K, "attention_forward", Hq, Hkv, hd, false, K->matmul != KMM_BF16);
    no_prefix("attention_forward", prefix_of);
    use(K);
    int N = 0, maxL = read_seqlens(K, "attention_forward", cu_seqlens, B, &N);
    if (maxL == 0)
        return;
    if (K->matmul == KMM_BF16)
        tc_forward(K, out, lse, q, k, v, B, N, Hq, Hkv, hd);
    else
        CHECK_CUDA(attention_forward_cuda(out, lse, q, k, v, cu_seqlens, B, maxL, Hq, Hkv, hd, stream(K)));
}

static void cuda_attention_backward(struct kctx *K, float *dq, float *dk, float *dv, const float *dout,
                                    const float *out, const float *lse, const float *q, const float *k, const float *v,
                                    const int32_t *cu_seqlens, const int32_t *prefix_of, int B, int Hq, int Hkv, int hd)
{
    check_heads(K, "attention_backward", Hq, Hkv, hd, true, K->matmul != KMM_BF16);
    no_prefix("attention_backward", prefix_of);
    use(K);
    int N = 0, maxL = read_seqlens(K, "attention_backward", cu_seqlens, B, &N);
    if (maxL == 0 || N <= 0)
        return;
    if (K->matmul == KMM_BF16) {
        tc_backward(K, dq, dk, dv, dout, out, lse, q, k, v, B, N, Hq, Hkv, hd);
        return;
    }
    void *s = ws(K, &impl(K)->attn, attention_backward_cuda_scratch_bytes(N, Hq));
    CHECK_CUDA(attention_backward_cuda(dq, dk, dv, dout, out, lse, q, k, v, cu_seqlens, B, N, maxL, Hq, Hkv, hd, s,
                                       stream(K)));
}

/* The KV cache: BF16 in a BF16 context (half the bytes a decode step's attention reads), fp32 otherwise. */
static bool kv_bf16(const struct kctx *K) { return K->matmul == KMM_BF16; }
static size_t cuda_kv_elem_bytes(const struct kctx *K) { return kv_bf16(K) ? 2 : sizeof(float); }

static void cuda_kv_store(struct kctx *K, void *cache, size_t at, const float *x, size_t n)
{
    if (!kv_bf16(K)) {
        cuda_copy(K, (float *)cache + at, x, n * sizeof(float));
        return;
    }
    if (!n)
        return;
    use(K);
    CHECK_CUDA(f32_to_bf16_cuda((char *)cache + at * 2, x, n, stream(K)));
}

static void cuda_attention_cached(struct kctx *K, float *out, const float *q, const void *kcache, const void *vcache,
                                  int Tq, int Tk, int Hq, int Hkv, int hd)
{
    check_heads(K, "attention_cached", Hq, Hkv, hd, false, true);
    if (Tq < 0 || Tq > Tk)
        check_failf(__FILE__, __LINE__, "attention_cached: Tq=%d queries but Tk=%d cached positions", Tq, Tk);
    if (Tq == 0)
        return;
    use(K);
    size_t bytes = attention_cached_cuda_scratch_bytes(Tq, Tk, Hq, hd);
    void *s = bytes ? ws(K, &impl(K)->attn, bytes) : NULL;
    CHECK_CUDA(attention_cached_cuda(out, q, kcache, vcache, kv_bf16(K), Tq, Tk, Hq, Hkv, hd, s, stream(K)));
}

static void cuda_attention_decode_batched(struct kctx *K, float *out, const float *q, const float *k, const float *v,
                                          void *const *kc, void *const *vc, const int32_t *len, int B, int Hq, int Hkv,
                                          int hd)
{
    check_heads(K, "attention_decode_batched", Hq, Hkv, hd, false, true);
    if (B < 0 || B > 65535)
        check_failf(__FILE__, __LINE__, "attention_decode_batched: %d sequences (at most 65535 a step)", B);
    if (B == 0)
        return;
    use(K);
    CHECK_CUDA(attention_decode_batched_cuda(out, q, k, v, kc, vc, kv_bf16(K), len, B, Hq, Hkv, hd, stream(K)));
}

/* ---- LM head ---- */

static void check_lmhead(const char *who, const struct vocab_shard *vs, float temperature, int chunk)
{
    if (!vs || !(temperature > 0.0f) || chunk <= 0 || vs->V <= 0 || vs->lo < 0 || vs->hi <= vs->lo || vs->hi > vs->V)
        check_failf(__FILE__, __LINE__,
                    "%s: need temperature > 0, chunk > 0, a non-empty shard [lo, hi) of V (got %g, %d, [%d, %d) of %d)",
                    who, (double)temperature, chunk, vs ? vs->lo : 0, vs ? vs->hi : 0, vs ? vs->V : 0);
}

/* The host buffer for n statistics. */
static double *host_st(struct cuda_impl *I, size_t n)
{
    if (n > I->host_st_cap) {
        free(I->host_st);
        I->host_st = xmalloc(n * sizeof *I->host_st);
        I->host_st_cap = n;
    }
    return I->host_st;
}

/* vs->reduce on n device doubles at d, through the host. */
static void reduce_on_host(struct kctx *K, const struct vocab_shard *vs, double *d, int n, bool max)
{
    double *h = host_st(impl(K), (size_t)n);
    capture_fail(K, "the vocabulary shards' statistics reduced on the host");
    CHECK_CUDA(cudaMemcpyAsync(h, d, sizeof(double) * (size_t)n, cudaMemcpyDeviceToHost, stream(K)));
    CHECK_CUDA(cudaStreamSynchronize(stream(K)));
    vs->reduce(vs->ud, h, n, max);
    CHECK_CUDA(cudaMemcpyAsync(d, h, sizeof(double) * (size_t)n, cudaMemcpyHostToDevice, stream(K)));
    /* the next reduce reuses h: the copy must have read it (pageable copies are staged before returning, but a
     * pinned buffer would not be, so do not rely on it) */
    CHECK_CUDA(cudaStreamSynchronize(stream(K)));
}

/* A chunk's logits z (c, Vl) = h_c W^T / temperature (hc, W already in the GEMM's precision) and their combined
 * statistics st (4c device doubles), as chunk_logits and chunk_stats of logprob.c: the row maxima reduced (max)
 * first, then the sums, entropy terms and target logits (sum). */
static void lm_chunk(struct kctx *K, float *z, double *st, const void *hc, const void *W, const int32_t *targets, int c,
                     int D, const struct vocab_shard *vs, float temperature, bool sq)
{
    const int Vl = vs->hi - vs->lo;
    gemm_rm(K, false, true, c, Vl, D, 1.0f / temperature, hc, D, W, D, 0.0f, z, Vl);
    CHECK_CUDA(lmhead_rowmax_cuda(st, z, c, Vl, stream(K)));
    if (vs->reduce)
        reduce_on_host(K, vs, st, c, true);
    CHECK_CUDA(lmhead_rowsums_cuda(st, z, targets, c, Vl, vs->lo, stream(K)));
    if (sq) /* the sum of squared exponentials too (st holds 5c then) */
        CHECK_CUDA(lmhead_rowsq_cuda(st, z, c, Vl, stream(K)));
    if (vs->reduce)
        reduce_on_host(K, vs, st + c, (sq ? 4 : 3) * c, false);
}

/* h (N, D) in the GEMM's precision: rows t0.. of it start at elem offset t0 * D. */
static const void *rows_at(struct kctx *K, const void *base, int t0, int D)
{
    size_t elem = K->matmul == KMM_BF16 ? 2 : sizeof(float);
    return (const char *)base + (size_t)t0 * D * elem;
}

static void cuda_lmhead_forward(struct kctx *K, float *logp, float *entropy, const float *h, const float *W,
                                const int32_t *targets, int N, int D, const struct vocab_shard *vs, float temperature,
                                int chunk)
{
    check_lmhead("lmhead_logprob_forward", vs, temperature, chunk);
    if (N <= 0)
        return;
    use(K);
    /* the products in the context's precision, as on the CPU (kernels/cpu/logprob.c's BF16 head) */
    struct cuda_impl *I = impl(K);
    const int Vl = vs->hi - vs->lo, cmax = chunk < N ? chunk : N;
    float *z = ws(K, &I->lm_z, sizeof(float) * (size_t)cmax * Vl);
    double *st = ws(K, &I->lm_st, sizeof(double) * 5 * (size_t)cmax);
    const void *ha = gemm_operand(K, 0, h, (size_t)N * D);
    const void *wa = gemm_weight(K, 1, W, (size_t)Vl * D, "lmhead_forward");
    const bool sq = entropy && vs->sum_pi_sq; /* the entropy output gets sum_j p_j^2 */
    for (int t0 = 0; t0 < N; t0 += cmax) {
        int c = N - t0 < cmax ? N - t0 : cmax;
        lm_chunk(K, z, st, rows_at(K, ha, t0, D), wa, targets + t0, c, D, vs, temperature, sq);
        CHECK_CUDA(lmhead_finalize_cuda(logp + t0, entropy ? entropy + t0 : NULL, st, c, sq, stream(K)));
    }
}

static void cuda_lmhead_backward(struct kctx *K, float *dh, float *dW, const float *dlogp, const float *dentropy,
                                 const float *h, const float *W, const int32_t *targets, int N, int D,
                                 const struct vocab_shard *vs, float temperature, int chunk)
{
    check_lmhead("lmhead_logprob_backward", vs, temperature, chunk);
    if (N <= 0 || (!dh && !dW))
        return;
    use(K);
    /* the products in the context's precision, as on the CPU (kernels/cpu/logprob.c's BF16 head) */
    struct cuda_impl *I = impl(K);
    const int Vl = vs->hi - vs->lo, cmax = chunk < N ? chunk : N;
    float *z = ws(K, &I->lm_z, sizeof(float) * (size_t)cmax * Vl);
    double *st = ws(K, &I->lm_st, sizeof(double) * 5 * (size_t)cmax);
    const void *ha = gemm_operand(K, 0, h, (size_t)N * D);
    const void *wa = gemm_weight(K, 1, W, (size_t)Vl * D, "lmhead_backward");
    for (int t0 = 0; t0 < N; t0 += cmax) {
        int c = N - t0 < cmax ? N - t0 : cmax;
        const void *hc = rows_at(K, ha, t0, D);
        lm_chunk(K, z, st, hc, wa, targets + t0, c, D, vs, temperature, false);
        CHECK_CUDA(lmhead_dlogits_cuda(z, st, dlogp + t0, dentropy ? dentropy + t0 : NULL, targets + t0, c, Vl, vs->lo,
                                       temperature, stream(K)));
        const void *dz = gemm_operand(K, 2, z, (size_t)c * Vl);
        if (dh) /* dh (c, D) += dz (c, Vl) W (Vl, D) */
            gemm_rm(K, false, false, c, D, Vl, 1.0f, dz, Vl, wa, D, 1.0f, dh + (size_t)t0 * D, D);
        if (dW) /* dW (Vl, D) += dz^T (Vl, c) h_c (c, D) */
            gemm_rm(K, true, false, Vl, D, c, 1.0f, dz, Vl, hc, D, 1.0f, dW, D);
    }
}

/* ---- sampling ---- */

/* tokens, logps and uniforms are HOST arrays (B); logits (B, V) device memory. */
static void cuda_sample(struct kctx *K, int32_t *tokens, float *logps, const float *logits, int B, int V,
                        float temperature, float top_p, int top_k, const double *uniforms)
{
    if (B <= 0)
        return;
    if (V <= 0 || (size_t)B * (size_t)V > (size_t)INT32_MAX)
        check_failf(__FILE__, __LINE__, "sample: %d rows of %d logits (at most 2^31 - 1 in all on CUDA)", B, V);
    use(K);
    struct cuda_impl *I = impl(K);
    size_t bytes = sample_rows_cuda_scratch_bytes(B, V);
    if (!bytes)
        check_failf(__FILE__, __LINE__, "sample: cannot size the sort's scratch for %d x %d", B, V);
    void *s = ws(K, &I->sample, bytes);
    int32_t *dtok = ws(K, &I->sample_tok, (size_t)B * sizeof *dtok);
    float *dlp = ws(K, &I->sample_lp, (size_t)B * sizeof *dlp);
    /* the uniforms are host memory: copied on the stream, which this op synchronises before it returns */
    capture_fail(K, "sampled tokens read on the host");
    CHECK_CUDA(sample_rows_cuda(dtok, dlp, logits, B, V, temperature, top_p, top_k, uniforms, s, bytes, stream(K)));
    CHECK_CUDA(cudaMemcpyAsync(tokens, dtok, (size_t)B * sizeof *tokens, cudaMemcpyDeviceToHost, stream(K)));
    if (logps)
        CHECK_CUDA(cudaMemcpyAsync(logps, dlp, (size_t)B * sizeof *logps, cudaMemcpyDeviceToHost, stream(K)));
    CHECK_CUDA(cudaStreamSynchronize(stream(K)));
}

/* ---- graphs (k_graph_begin, kernels.h) ---- */

static bool cuda_graph_begin(struct kctx *K, char *why, size_t len)
{
    struct cuda_impl *I = impl(K);
    if (I->capture)
        check_failf(__FILE__, __LINE__, "k_graph_begin: the context records a graph already");
    use(K);
    /* thread-local: the calls a capture forbids are refused in this thread only, not in threads beside it */
    const cudaError_t rc = cudaStreamBeginCapture(stream(K), cudaStreamCaptureModeThreadLocal);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, len, "cudaStreamBeginCapture: %s", cudaGetErrorString(rc));
        return false;
    }
    I->capture = 1;
    I->capture_failed[0] = '\0';
    return true;
}

static struct kgraph *cuda_graph_end(struct kctx *K, char *why, size_t len)
{
    struct cuda_impl *I = impl(K);
    if (!I->capture)
        check_failf(__FILE__, __LINE__, "k_graph_end without k_graph_begin");
    use(K);
    const bool failed = I->capture == 2;
    I->capture = 0;
    if (failed) {
        snprintf(why, len, "%s", I->capture_failed);
        return NULL;
    }
    cudaGraph_t g = NULL;
    cudaError_t rc = cudaStreamEndCapture(stream(K), &g);
    if (rc != cudaSuccess || !g) {
        (void)cudaGetLastError();
        snprintf(why, len, "cudaStreamEndCapture: %s", cudaGetErrorString(rc));
        return NULL;
    }
    cudaGraphExec_t exec = NULL;
    rc = cudaGraphInstantiate(&exec, g, 0);
    CHECK_CUDA(cudaGraphDestroy(g));
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, len, "cudaGraphInstantiate: %s", cudaGetErrorString(rc));
        return NULL;
    }
    struct kgraph *kg = xmalloc(sizeof *kg);
    kg->exec = exec;
    return kg;
}

static void cuda_graph_launch(struct kctx *K, struct kgraph *g)
{
    use(K);
    CHECK_CUDA(cudaGraphLaunch(g->exec, stream(K)));
}

static void cuda_graph_free(struct kctx *K, struct kgraph *g)
{
    use(K);
    CHECK_CUDA(cudaGraphExecDestroy(g->exec)); /* one in flight is freed when it completes */
    free(g);
}

static uint64_t cuda_graph_epoch(struct kctx *K) { return impl(K)->epoch; }

/* ---- the table and the context ---- */

/* ---- ring attention's blocks (attention_block.cu): every pointer device memory, only enqueued. NOT YET RUN on a
 * GPU: compiled only (scripts/gpu_check.sh checks them against the CPU's). ---- */

static void check_block(const char *op, int Hq, int Hkv, int hd)
{
    if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0 || hd <= 0 || hd > 256)
        check_failf(__FILE__, __LINE__,
                    "%s: %d query heads over %d KV heads of %d (the query heads a multiple of the KV heads, the head "
                    "size 1..256 on CUDA)",
                    op, Hq, Hkv, hd);
}

static void cuda_attention_block_forward(struct kctx *K, float *po, float *plse, const float *q, const float *k,
                                         const float *v, const int32_t *qseq, const int32_t *kseq, int nq, int nk,
                                         int Hq, int Hkv, int hd)
{
    check_block("attention_block_forward", Hq, Hkv, hd);
    use(K);
    CHECK_CUDA(attention_block_forward_cuda(po, plse, q, k, v, qseq, kseq, nq, nk, Hq, Hkv, hd, stream(K)));
}

static void cuda_attention_block_backward(struct kctx *K, float *dq, float *dk, float *dv, const float *dout,
                                          const float *lse, const float *drow, const float *q, const float *k,
                                          const float *v, const int32_t *qseq, const int32_t *kseq, int nq, int nk,
                                          int Hq, int Hkv, int hd)
{
    check_block("attention_block_backward", Hq, Hkv, hd);
    use(K);
    CHECK_CUDA(attention_block_backward_cuda(dq, dk, dv, dout, lse, drow, q, k, v, qseq, kseq, nq, nk, Hq, Hkv, hd,
                                             stream(K)));
}

static void cuda_attention_merge(struct kctx *K, float *out, float *lse, const float *po, const float *plse, int n,
                                 int Hq, int hd)
{
    use(K);
    CHECK_CUDA(attention_merge_cuda(out, lse, po, plse, n, Hq, hd, stream(K)));
}

static void cuda_attention_drow(struct kctx *K, float *drow, const float *dout, const float *out, int n, int Hq, int hd)
{
    use(K);
    CHECK_CUDA(attention_drow_cuda(drow, dout, out, n, Hq, hd, stream(K)));
}

/* ---- mixture of experts: the routing and its backward on the GPU (moe.cu: a thread per token, the stable sort of
 * the slots by expert in one block per expert), the row moves on the GPU, and each expert's tokens through
 * kernels.c's shared per-expert loop (one cuBLAS GEMM per expert and projection; the E + 1 offsets are the only
 * values that come to the host). NOT YET RUN on a GPU: compiled only (scripts/gpu_check.sh checks it). ---- */

static void cuda_moe_route(struct kctx *K, struct kmoe *r, const float *logits)
{
    use(K);
    const int N = r->N, E = r->E, k = r->k;
    const size_t nk = (size_t)N * (size_t)k;
    struct cuda_impl *I = impl(K);
    int32_t *ref = NULL, *differ = NULL, *n_differ = NULL;
    r->n_differ = 0;
    r->n_compared = r->ref ? N : 0;
    if (r->ref) { /* host memory (the rollout's choice): [ref (N k) | differ (N) | count] on the device */
        ref = ws(K, &I->moe, (nk + (size_t)N + 1) * sizeof(int32_t));
        differ = ref + nk, n_differ = differ + N;
        cuda_to_device(K, ref, r->ref, nk * sizeof(int32_t));
    }
    CHECK_CUDA(moe_route_cuda(r->probs, r->pmean, r->idx, r->wt, r->order, r->offs, r->pos, differ, n_differ, logits,
                              ref, r->replay, N, E, k, r->norm_topk, stream(K)));
    if (r->ref) {
        int32_t n = 0;
        cuda_to_host(K, &n, n_differ, sizeof n);
        r->n_differ = n;
    }
}

static void cuda_moe_route_backward(struct kctx *K, float *dlogits, const struct kmoe *r, const float *dwt,
                                    const float *dp_col)
{
    use(K);
    float *dp = NULL;
    if (dp_col) { /* host (E): the load-balancing loss's column */
        dp = ws(K, &impl(K)->moe_dp, (size_t)r->E * sizeof(float));
        cuda_to_device(K, dp, dp_col, (size_t)r->E * sizeof(float));
    }
    CHECK_CUDA(
        moe_route_backward_cuda(dlogits, r->probs, r->idx, r->wt, dwt, dp, r->N, r->E, r->k, r->norm_topk, stream(K)));
}

/* The E + 1 offsets of r on the host (the products' sizes): the caller frees them. */
static int32_t *moe_offs_host(struct kctx *K, const struct kmoe *r)
{
    int32_t *offs = xmalloc((size_t)(r->E + 1) * sizeof *offs);
    cuda_to_host(K, offs, r->offs, (size_t)(r->E + 1) * sizeof *offs);
    return offs;
}

static void cuda_moe_experts_forward(struct kctx *K, float *y, const float *x, const float *Wg, const float *Wu,
                                     const float *Wd, struct kmoe *r)
{
    use(K);
    const int N = r->N, k = r->k, D = r->D;
    int32_t *offs = moe_offs_host(K, r);
    CHECK_CUDA(moe_gather_cuda(r->xs, x, r->order, N * k, k, D, stream(K)));
    kmoe_products_forward(K, offs, Wg, Wu, Wd, r, NULL); /* no LoRA on the experts here */
    CHECK_CUDA(moe_combine_cuda(y, r->ys, r->wt, r->pos, N, k, D, stream(K)));
    free(offs);
}

static void cuda_moe_experts_backward(struct kctx *K, float *dx, float *dWg, float *dWu, float *dWd, float *dwt,
                                      const float *dy, const float *Wg, const float *Wu, const float *Wd,
                                      const struct kmoe *r)
{
    use(K);
    const int N = r->N, k = r->k, D = r->D;
    const size_t nk = (size_t)N * k;
    float *dys = r->bwd_d;
    const float *dxs = r->bwd_d + nk * (size_t)D;
    int32_t *offs = moe_offs_host(K, r);
    CHECK_CUDA(moe_slot_grad_cuda(dys, dwt, dy, r->ys, r->wt, r->order, (int)nk, k, D, stream(K)));
    kmoe_products_backward(K, offs, dWg, dWu, dWd, Wg, Wu, Wd, r, NULL);
    CHECK_CUDA(moe_scatter_cuda(dx, dxs, r->pos, N, k, D, stream(K)));
    free(offs);
}

/* Expert parallelism's row moves around its all-to-alls (worker/model/moe_ep.c): the same kernels as above.
 * NOT YET RUN on a GPU. */
static void cuda_moe_gather(struct kctx *K, float *xs, const float *x, struct kmoe *r)
{
    use(K);
    CHECK_CUDA(moe_gather_cuda(xs, x, r->order, r->N * r->k, r->k, r->D, stream(K)));
    CHECK_CUDA(moe_pos_cuda(r->pos, r->order, r->N * r->k, stream(K)));
}

static void cuda_moe_combine(struct kctx *K, float *y, const float *ys, const struct kmoe *r)
{
    use(K);
    CHECK_CUDA(moe_combine_cuda(y, ys, r->wt, r->pos, r->N, r->k, r->D, stream(K)));
}

static void cuda_moe_slot_grad(struct kctx *K, float *dys, float *dwt, const float *dy, const struct kmoe *r)
{
    use(K);
    CHECK_CUDA(moe_slot_grad_cuda(dys, dwt, dy, r->ys, r->wt, r->order, r->N * r->k, r->k, r->D, stream(K)));
}

static void cuda_moe_scatter(struct kctx *K, float *dx, const float *dxs, const struct kmoe *r)
{
    use(K);
    CHECK_CUDA(moe_scatter_cuda(dx, dxs, r->pos, r->N, r->k, r->D, stream(K)));
}

const struct kops kops_cuda = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .to_host_behind = cuda_to_host_behind,
    .behind_wait = cuda_behind_wait,
    .copy = cuda_copy,
    .zero = cuda_zero,
    .copy_rows = cuda_copy_rows,
    .sync = cuda_sync,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .linear_forward = cuda_linear_forward,
    .linear_backward = cuda_linear_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .kv_elem_bytes = cuda_kv_elem_bytes,
    .kv_store = cuda_kv_store,
    .attention_cached = cuda_attention_cached,
    .attention_decode_batched = cuda_attention_decode_batched,
    .attention_block_forward = cuda_attention_block_forward,
    .attention_block_backward = cuda_attention_block_backward,
    .attention_merge = cuda_attention_merge,
    .attention_drow = cuda_attention_drow,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .add = cuda_add,
    .axpy = cuda_axpy,
    .scale = cuda_scale,
    .sumsq = cuda_sumsq,
    .lmhead_forward = cuda_lmhead_forward,
    .lmhead_backward = cuda_lmhead_backward,
    .sample = cuda_sample,
    .adamw = cuda_adamw,
    .weights_note = cuda_weights_note,
    .weights_forget = cuda_weights_forget,
    .weights_changed = cuda_weights_changed,
    .weights_check = cuda_weights_check,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .graph_epoch = cuda_graph_epoch,
    .moe_route = cuda_moe_route,
    .moe_route_backward = cuda_moe_route_backward,
    .moe_experts_forward = cuda_moe_experts_forward,
    .moe_experts_backward = cuda_moe_experts_backward,
    .moe_gather = cuda_moe_gather,
    .moe_combine = cuda_moe_combine,
    .moe_slot_grad = cuda_moe_slot_grad,
    .moe_scatter = cuda_moe_scatter,
};

static int kops_cuda_devices(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { /* no driver, no device: not an error here */
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

static size_t kops_cuda_device_bytes(struct kctx *K)
{
    use(K);
    size_t free_b = 0, total = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total));
    return total;
}

static int kops_cuda_open(struct kctx *K, int device, char *why, size_t len)
{
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return error_set(why, len, "cuda:%d: no CUDA device usable (%s)", device, cudaGetErrorString(rc));
    }
    if (device < 0 || device >= n)
        return error_set(why, len, "cuda:%d: no such device (%d visible)", device, n);
    if ((rc = cudaSetDevice(device)) != cudaSuccess)
        return error_set(why, len, "cuda:%d: cudaSetDevice: %s", device, cudaGetErrorString(rc));
    cudaStream_t s = NULL;
    /* a blocking stream: it orders with the legacy default stream, so plain cudaMemcpy elsewhere stays safe */
    if ((rc = cudaStreamCreate(&s)) != cudaSuccess)
        return error_set(why, len, "cuda:%d: cudaStreamCreate: %s", device, cudaGetErrorString(rc));
    cublasHandle_t hb = NULL;
    cublasStatus_t bs = cublasCreate(&hb);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetStream(hb, s);
    if (bs == CUBLAS_STATUS_SUCCESS) /* fp32 means fp32: no TF32 (GemmEx's CUBLAS_COMPUTE_32F does not either) */
        bs = cublasSetMathMode(hb, CUBLAS_DEFAULT_MATH);
    if (bs == CUBLAS_STATUS_SUCCESS) /* no atomics in cuBLAS's reductions: the same bits every run */
        bs = cublasSetAtomicsMode(hb, CUBLAS_ATOMICS_NOT_ALLOWED);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        if (hb)
            cublasDestroy(hb);
        cudaStreamDestroy(s);
        return error_set(why, len, "cuda:%d: cuBLAS could not start (status %d)", device, (int)bs);
    }
    struct cuda_impl *I = xcalloc(1, sizeof *I);
    I->check_kept = -1;
    if ((rc = cudaMalloc((void **)&I->sumsq_result, sizeof(double))) != cudaSuccess) {
        (void)cudaGetLastError();
        free(I);
        cublasDestroy(hb);
        cudaStreamDestroy(s);
        return error_set(why, len, "cuda:%d: cudaMalloc: %s", device, cudaGetErrorString(rc));
    }
    K->ops = &kops_cuda;
    K->device = KDEV_CUDA;
    K->device_index = device;
    K->stream = s;
    K->blas = hb;
    K->impl = I;
    return 0;
}

static void kops_cuda_close(struct kctx *K)
{
    struct cuda_impl *I = impl(K);
    if (!I)
        return;
    cudaSetDevice(K->device_index);
    cudaStreamSynchronize(stream(K));
    for (int i = 0; i < BF16_SLOTS; i++)
        dbuf_free(&I->bf16[i]);
    for (int i = 0; i < I->n_kept; i++)
        cudaFree(I->kept[i].bf16);
    free(I->kept);
    dbuf_free(&I->check);
    dbuf_free(&I->scratch);
    dbuf_free(&I->attn);
    dbuf_free(&I->attn_tc);
    dbuf_free(&I->lm_z);
    dbuf_free(&I->lm_st);
    dbuf_free(&I->sample);
    dbuf_free(&I->sample_tok);
    dbuf_free(&I->sample_lp);
    dbuf_free(&I->moe);
    dbuf_free(&I->moe_dp);
    cudaFree(I->sumsq_result);
    if (I->behind) { /* its copies done first: their host memory may be freed after */
        cudaStreamSynchronize(I->behind);
        cudaEventDestroy(I->behind_after);
        cudaEventDestroy(I->behind_done);
        cudaStreamDestroy(I->behind);
    }
    cublasDestroy(blas(K));
    cudaStreamDestroy(stream(K));
    free(I->host_st);
    free(I->host_cu);
    free(I->tab);
    free(I);
    K->impl = NULL;
    K->blas = NULL;
    K->stream = NULL;
}

/* The CUDA back-end as it registers itself (struct kbackend, kernels.h): devices "cuda" and "cuda:N". */
const struct kbackend kbackend_cuda = {
    .name = "cuda",
    .device = KDEV_CUDA,
    .ops = &kops_cuda,
    .devices = kops_cuda_devices,
    .open = kops_cuda_open,
    .close = kops_cuda_close,
    .device_bytes = kops_cuda_device_bytes,
};
