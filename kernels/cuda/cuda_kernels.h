/* CUDA twins of the CPU kernels in kernels.h: same shapes and semantics, device pointers (host scalars), launched
 * on the given stream; each returns the launch's error (cudaGetLastError). Built only when CUDA is enabled. They are
 * deterministic: no reduction uses atomics, so two runs on the same inputs and device give the same bits.
 *
 * The CUDA back-end of the kernel interface (kops_cuda, kernels/cuda/backend.c) runs these on its context's stream.
 * Its ops take DEVICE pointers for everything kernels.h calls context memory, including the index arrays (ids,
 * targets, positions, cu_seqlens: int32) and RoPE's inv_freq, which for the CUDA back-end is a device array of
 * hd / 2 doubles (the model uploads it once); struct vocab_shard stays a host struct and its reduce is called on
 * host buffers. */
#ifndef GRPO_KERNELS_CUDA_CUDA_KERNELS_H
#define GRPO_KERNELS_CUDA_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* RMSNorm forward on the GPU (see rmsnorm_forward). */
cudaError_t rmsnorm_forward_cuda(float *y, float *rstd, const float *x, const float *w, int N, int D, float eps,
                                 cudaStream_t stream);
/* Bytes of device scratch that rmsnorm_backward_cuda needs for N rows of D (0 when there is nothing to do). */
size_t rmsnorm_backward_cuda_scratch_bytes(int N, int D);
/* RMSNorm backward on the GPU (see rmsnorm_backward); dw is summed in a fixed order through scratch, a device
 * buffer of rmsnorm_backward_cuda_scratch_bytes(N, D) bytes that the caller owns (its contents are overwritten). */
cudaError_t rmsnorm_backward_cuda(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                  const float *rstd, int N, int D, void *scratch, cudaStream_t stream);

/* RoPE forward in place on the GPU (see rope_forward_freqs); pos (N) and inv_freq (hd / 2) are device arrays. */
cudaError_t rope_forward_cuda(float *x, const int32_t *pos, int N, int H, int hd, const double *inv_freq,
                              cudaStream_t stream);
/* RoPE backward in place on the GPU (see rope_backward_freqs): the inverse rotation, overwriting dx. */
cudaError_t rope_backward_cuda(float *dx, const int32_t *pos, int N, int H, int hd, const double *inv_freq,
                               cudaStream_t stream);

/* SwiGLU forward on the GPU (see swiglu_forward); out may alias gate or up. */
cudaError_t swiglu_forward_cuda(float *out, const float *gate, const float *up, size_t n, cudaStream_t stream);
/* SwiGLU backward on the GPU (see swiglu_backward): accumulates into dgate and dup. */
cudaError_t swiglu_backward_cuda(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                 size_t n, cudaStream_t stream);

/* Embedding forward over the vocabulary shard [lo, hi) (see embedding_forward_shard; table: (hi - lo, D)). */
cudaError_t embedding_forward_cuda(float *out, const int32_t *ids, const float *table, int N, int D, int lo, int hi,
                                   cudaStream_t stream);
/* Embedding backward over the shard [lo, hi) (see embedding_backward_shard), in token order without atomics. */
cudaError_t embedding_backward_cuda(float *dtable, const float *dout, const int32_t *ids, int N, int D, int lo, int hi,
                                    cudaStream_t stream);

/* One AdamW step on the GPU, as adamw_step (worker/trainer/optim.c) at step number t >= 1 (its t after the
 * increment); m and v (n) are the moments, updated in place. */
cudaError_t adamw_step_cuda(float *params, const float *grads, float *m, float *v, size_t n, double lr, double beta1,
                            double beta2, double eps, double weight_decay, int64_t t, cudaStream_t stream);

/* ---- used by the kops table (kernels/cuda/backend.c); all pointers are device memory unless said ---- */

/* dst[i] = x[i] rounded to BF16 (round to nearest even), n elements; dst is __nv_bfloat16 (2 bytes each). */
cudaError_t f32_to_bf16_cuda(void *dst, const float *x, size_t n, cudaStream_t stream);
/* y (N, D) += b (D) broadcast over the rows. */
cudaError_t bias_add_cuda(float *y, const float *b, int N, int D, cudaStream_t stream);
/* Bytes of scratch colsum_add_cuda needs for N rows of D. */
size_t colsum_add_cuda_scratch_bytes(int N, int D);
/* out (D) += column sums of x (N, D): partial sums over fixed slices of rows, then the slices in order (no
 * atomics: the same bits every run). */
cudaError_t colsum_add_cuda(float *out, const float *x, int N, int D, void *scratch, cudaStream_t stream);

/* y += x, y += a x, x *= a (n); each product and sum rounded once as on the CPU (no fused multiply-add). */
cudaError_t vec_add_cuda(float *y, const float *x, size_t n, cudaStream_t stream);
cudaError_t vec_axpy_cuda(float *y, float a, const float *x, size_t n, cudaStream_t stream);
cudaError_t vec_scale_cuda(float *x, double a, size_t n, cudaStream_t stream);
/* Bytes of scratch sumsq_cuda needs (a fixed count of double partial sums). */
size_t sumsq_cuda_scratch_bytes(void);
/* *result (one device double, not inside scratch) = sum of x[i]^2 in double: a grid whose shape depends on n
 * only, each block reducing in a fixed tree, then one block summing the partials in order; deterministic. */
cudaError_t sumsq_cuda(double *result, const float *x, size_t n, void *scratch, cudaStream_t stream);

/* The most dynamic shared memory a block of the tiled attention kernels takes for head_dim hd: the forward's
 * (backward 0), or the larger of the backward's two kernels' (1). A device whose opt-in limit per block is below it
 * cannot run them. */
size_t attention_smem_bytes(int hd, int backward);
/* Flash-style causal GQA attention (see attention_forward): cu_seqlens (B + 1) is a DEVICE array; max_len is the
 * longest sequence (the caller reads cu_seqlens on the host). Nothing of size T x T is stored. hd <= 256. */
cudaError_t attention_forward_cuda(float *out, float *lse, const float *q, const float *k, const float *v,
                                   const int32_t *cu_seqlens, int B, int max_len, int Hq, int Hkv, int hd,
                                   cudaStream_t stream);
/* Bytes of scratch attention_backward_cuda needs for N tokens of Hq heads: D_i = dout_i . out_i per (token, head). */
size_t attention_backward_cuda_scratch_bytes(int N, int Hq);
/* dq, dk, dv += the gradients (see attention_backward), recomputing probabilities from lse. Deterministic without
 * atomics: dk and dv come from one block per key tile looping over the query heads of its KV head and the query
 * rows in a fixed order; dq from one block per query tile looping over the keys. N = cu_seqlens[B]. */
cudaError_t attention_backward_cuda(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                    const float *lse, const float *q, const float *k, const float *v,
                                    const int32_t *cu_seqlens, int B, int N, int max_len, int Hq, int Hkv, int hd,
                                    void *scratch, cudaStream_t stream);
/* Bytes of scratch attention_cached_cuda needs (partial results of the split-key decode path). */
size_t attention_cached_cuda_scratch_bytes(int Tq, int Tk, int Hq, int hd);
/* KV-cache attention, one sequence (see attention_cached). Few query rows (decode) split the keys over blocks and
 * merge the partial softmaxes in a fixed order; more rows use the tiled kernel of attention_forward_cuda. kcache and
 * vcache hold fp32, or BF16 (__nv_bfloat16) where kv_bf16 is set, widened to fp32 as they are read. */
cudaError_t attention_cached_cuda(float *out, const float *q, const void *kcache, const void *vcache, int kv_bf16,
                                  int Tq, int Tk, int Hq, int Hkv, int hd, void *scratch, cudaStream_t stream);
/* Batched decode (see attention_decode_batched in kernels.h): one launch for B sequences of one new token each,
 * the new K and V rows appended to each sequence's cache (fp32, or rounded to BF16 where kv_bf16 is set) and
 * attended as the cache holds them; kc, vc and len device arrays of B. */
cudaError_t attention_decode_batched_cuda(float *out, const float *q, const float *k, const float *v, void *const *kc,
                                          void *const *vc, int kv_bf16, const int32_t *len, int B, int Hq, int Hkv,
                                          int hd, cudaStream_t stream);

/* Attention in a BF16 context on tensor cores (kernels/cuda/attention_tc.cu; backend.c runs the products as cuBLAS
 * batched GEMMs): the kernels around the products, in the layouts that file describes. The query rows per tile of a
 * sequence of L rows with Hq query heads (its scores take at most 12 Hq L bytes a row). */
int attention_tc_tile_rows(int L, int Hq);
/* rows [t0, N) of x (N, Hq, hd) rounded to BF16 into dst (grouped: N Hq hd BF16 values) */
cudaError_t attention_tc_group_cuda(void *dst, const float *x, int t0, int N, int Hq, int Hkv, int hd,
                                    cudaStream_t stream);
/* rows [t0, N) of y (N, Hq, hd) = (add: +=) those of xg (grouped, N Hq hd floats) */
cudaError_t attention_tc_ungroup_cuda(float *y, const float *xg, int t0, int N, int Hq, int Hkv, int hd, int add,
                                      cudaStream_t stream);
/* The tile [i0, i1) of the sequence at row s0: P (BF16, Hkv x (i1 - i0) Hq / Hkv rows of i1) = the causal softmax
 * of the scores S (fp32, the same shape), and lse (NULL: not wanted) of its rows. */
cudaError_t attention_tc_softmax_cuda(void *P, float *lse, const float *S, int s0, int i0, int i1, int Hq, int Hkv,
                                      cudaStream_t stream);
/* The backward's: P = exp(S - lse) (causal) and dS = P (dP - D) into BF16 P and dS, D (N, Hq) = dout . out. */
cudaError_t attention_tc_dsoft_cuda(void *P, void *dS, const float *S, const float *dP, const float *lse,
                                    const float *D, int s0, int i0, int i1, int Hq, int Hkv, cudaStream_t stream);

/* Ring attention's blocks (kernels/cuda/attention_block.cu), as attention_block_forward, attention_block_backward,
 * attention_merge and attention_drow of kernels/cpu/cpu_kernels.h; qseq, kseq device int32. hd <= 256 (else
 * cudaErrorInvalidValue). Deterministic without atomics. NOT YET RUN on a GPU. */
cudaError_t attention_block_forward_cuda(float *po, float *plse, const float *q, const float *k, const float *v,
                                         const int32_t *qseq, const int32_t *kseq, int nq, int nk, int Hq, int Hkv,
                                         int hd, cudaStream_t stream);
cudaError_t attention_block_backward_cuda(float *dq, float *dk, float *dv, const float *dout, const float *lse,
                                          const float *drow, const float *q, const float *k, const float *v,
                                          const int32_t *qseq, const int32_t *kseq, int nq, int nk, int Hq, int Hkv,
                                          int hd, cudaStream_t stream);
cudaError_t attention_merge_cuda(float *out, float *lse, const float *po, const float *plse, int n, int Hq, int hd,
                                 cudaStream_t stream);
cudaError_t attention_drow_cuda(float *drow, const float *dout, const float *out, int n, int Hq, int hd,
                                cudaStream_t stream);

/* LM head per-row statistics of a chunk of c logit rows z (c, Vl), into st (4c device doubles, the layout of
 * kernels/cpu/logprob.c's chunk_stats): st[i] the row maximum. */
cudaError_t lmhead_rowmax_cuda(double *st, const float *z, int c, int Vl, cudaStream_t stream);
/* st[c + i] sum_j exp(z_ij - M_i), st[2c + i] sum_j exp(z_ij - M_i) (z_ij - M_i), st[3c + i] the target's logit
 * (0 when the target is outside [lo, lo + Vl)), with M_i = (float)st[i] (the combined maximum). */
cudaError_t lmhead_rowsums_cuda(double *st, const float *z, const int32_t *targets, int c, int Vl, int lo,
                                cudaStream_t stream);
/* st[4c + i] sum_j exp(z_ij - M_i)^2 (st then holds 5c doubles). */
cudaError_t lmhead_rowsq_cuda(double *st, const float *z, int c, int Vl, cudaStream_t stream);
/* logp[i], entropy[i] (entropy may be NULL) from the combined statistics st of c rows; with sum_pi_sq entropy[i]
 * gets sum_j p_ij^2 instead (st[4c + i] / st[c + i]^2). */
cudaError_t lmhead_finalize_cuda(float *logp, float *entropy, const double *st, int c, bool sum_pi_sq,
                                 cudaStream_t stream);
/* Turns each logit row of z (c, Vl) in place into dL/d(h W^T) from dlogp (c) and dentropy (c, or NULL). */
cudaError_t lmhead_dlogits_cuda(float *z, const double *st, const float *dlogp, const float *dentropy,
                                const int32_t *targets, int c, int Vl, int lo, float temperature, cudaStream_t stream);

/* Sampling of one token per row of logits (B, V) on the GPU, as sample_row (kernels/cpu/sample.c) does:
 * temperature 0 is greedy (the first maximum); otherwise softmax(logits / temperature), then top-k (top_k > 0)
 * and top-p (top_p < 1) truncation in order of descending probability (ties by lower id), then the token whose
 * cumulative probability (over the kept tokens) first exceeds the row's uniform times their mass. tokens (B) and
 * logps (B, or NULL) are device arrays; logps get the chosen token's log-softmax at that temperature (1 when
 * greedy) before truncation. uniforms: B doubles in [0, 1), drawn on the host by the caller (rng_uniform), in host
 * or device memory (copied into scratch on the stream with cudaMemcpyDefault: pageable host memory may be reused
 * once the call returns, pinned memory once the stream has run the copy; unused when greedy, may be NULL then).
 * scratch: sample_rows_cuda_scratch_bytes(B, V) device bytes (0 when B or V is not positive, or when the sort cannot
 * be sized). Deterministic; greedy picks exactly the CPU's token (sample_row, kernels/cpu/sample.c). */
size_t sample_rows_cuda_scratch_bytes(int B, int V);
cudaError_t sample_rows_cuda(int32_t *tokens, float *logps, const float *logits, int B, int V, float temperature,
                             float top_p, int top_k, const double *uniforms, void *scratch, size_t scratch_bytes,
                             cudaStream_t s);

/* Mixture of experts' routing on the GPU, as cpu_moe_route (kernels/cpu/moe.c) computes it from logits (N, E):
 * probs, pmean, idx, wt, the stable sort of the N k slots by expert (order, offs) and its inverse pos (struct
 * kmoe's arrays, all device memory). ref (N, k device ints, or NULL): the experts chosen elsewhere; then
 * differ (N device ints) gets whether each token's own top-k set differs from ref's, and *n_differ (one device int)
 * their count; with replay each token takes ref's experts. Deterministic (no atomics). NOT YET RUN on a GPU. */
cudaError_t moe_route_cuda(float *probs, float *pmean, int32_t *idx, float *wt, int32_t *order, int32_t *offs,
                           int32_t *pos, int32_t *differ, int32_t *n_differ, const float *logits, const int32_t *ref,
                           int replay, int N, int E, int k, int norm, cudaStream_t stream);
/* The routing's backward as cpu_moe_route_backward: dlogits (N, E) written from dwt (N, k) and dp_col (E device
 * floats added to every token's dL/dprobs, or NULL). NOT YET RUN on a GPU. */
cudaError_t moe_route_backward_cuda(float *dlogits, const float *probs, const int32_t *idx, const float *wt,
                                    const float *dwt, const float *dp_col, int N, int E, int k, int norm,
                                    cudaStream_t stream);
/* Mixture of experts' row moves (kernels/cuda/moe.cu; struct kmoe's buffers): xs[j] = x[order[j] / k]; y[t] = sum
 * of wt[s] ys[pos[s]] over t's k slots; dys[j] = wt[s] dy[t] and dwt[s] = dy[t] . ys[j] for s = order[j];
 * dx[t] += sum of dxs[pos[s]] over t's slots. NOT YET RUN on a GPU. */
cudaError_t moe_gather_cuda(float *xs, const float *x, const int32_t *order, int nk, int k, int D, cudaStream_t stream);
/* pos[order[j]] = j for the nk slots */
cudaError_t moe_pos_cuda(int32_t *pos, const int32_t *order, int nk, cudaStream_t stream);
cudaError_t moe_combine_cuda(float *y, const float *ys, const float *wt, const int32_t *pos, int N, int k, int D,
                             cudaStream_t stream);
cudaError_t moe_slot_grad_cuda(float *dys, float *dwt, const float *dy, const float *ys, const float *wt,
                               const int32_t *order, int nk, int k, int D, cudaStream_t stream);
cudaError_t moe_scatter_cuda(float *dx, const float *dxs, const int32_t *pos, int N, int k, int D, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
