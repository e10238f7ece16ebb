/* The CPU back-end of the kernel interface: host memory, the fp32 kernels of this folder and OpenBLAS. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"

static void *cpu_alloc(struct kctx *K, size_t bytes)
{
    (void)K;
    void *p = NULL;
    /* 64-byte aligned: whole cache lines, and AVX-512 loads that never split one */
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return NULL;
    return p;
}
static void cpu_free(struct kctx *K, void *p)
{
    (void)K;
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
