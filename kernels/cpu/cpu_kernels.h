/* CPU compute kernels, fp32, row-major. Each op has a forward and a backward;
 * backward functions ACCUMULATE (+=) into parameter gradients and input
 * gradients, so callers zero them once per step. Shapes are in the comments:
 * N rows (tokens), D features. */
#ifndef GRPO_KERNELS_CPU_H
#define GRPO_KERNELS_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h" /* struct vocab_shard, struct kctx, struct kmoe */

/* RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.  x, y: (N, D); w: (D); rstd out: (N), kept for backward. */
void rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int N, int D, float eps);
/* dx += d/dx, dw += d/dw given dy (N, D), x, w and the rstd saved by forward. */
void rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd, int N,
                      int D);

/* Embedding lookup: out[i] = table[ids[i]].  out: (N, D); ids: (N) in [0, V); table: (V, D). */
void embedding_forward(float *out, const int32_t *ids, const float *table, int N, int D, int V);
/* dtable[ids[i]] += dout[i].  dtable: (V, D); dout: (N, D). Repeated ids accumulate. */
void embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N, int D, int V);

/* Embedding rows of this shard: out[i] = table[ids[i] - lo] for ids in [lo, hi), zero rows for the others
 * (summed over the shards, the whole lookup). table: (hi - lo, D); ids in [0, V). */
void embedding_forward_shard(float *out, const int32_t *ids, const float *table, int N, int D,
                             const struct vocab_shard *vs);
/* dtable[ids[i] - lo] += dout[i] for the ids of this shard. */
void embedding_backward_shard(float *dtable, const float *dout, const int32_t *ids, int N, int D,
                              const struct vocab_shard *vs);

/* The CPU back-end's threads (the trainer's trainer.num_threads, grpo-model's --threads): products and kernels split
 * into this many parts on kernels/cpu/pool.c's threads; OpenBLAS itself runs single-threaded from then on. */
void cpu_set_threads(int threads);
/* C (M, N) = alpha op(A) op(B) + beta C, row-major as cblas_sgemm (ta, tb: A, B transposed), split over those threads
 * by rows or columns of C; the same thread count gives the same bits. kernels/cpu/gemm.c. */
void cpu_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
               float beta, float *C, int ldc);

/* Linear, HF nn.Linear layout: y = x W^T + b.  y: (N, Dout); x: (N, Din); W: (Dout, Din); b: (Dout) or NULL. */
void linear_forward(float *y, const float *x, const float *W, const float *b, int N, int Din, int Dout);
/* dx += dy W (N, Din); dW += dy^T x (Dout, Din); db += sum_rows dy (Dout). Any of dx, dW, db may be NULL. */
/* The vector ISA of the kernels we write (kernels/cpu/isa.c): the best this CPU runs, capped by GRPO_CPU_ISA=avx2 or
 * none, so that a run here follows the arithmetic of a CPU without AVX-512 (with OPENBLAS_CORETYPE=Haswell for
 * OpenBLAS's kernels: docs/results/performance.md, "Another CPU's run, computed here"). Every kernel with ISA variants
 * (the few-row products, SwiGLU, the softmax's exp, decode attention) dispatches on it. cpu_force_isa picks one for
 * tests (false: this CPU cannot run it); CPU_ISA_AUTO undoes it. */
enum cpu_isa { CPU_ISA_NONE = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2, CPU_ISA_AUTO = 3 };
enum cpu_isa cpu_isa(void);
bool cpu_force_isa(enum cpu_isa isa);
const char *cpu_isa_name(enum cpu_isa isa);
/* The few-row product of linear_forward (kernels/cpu/skinny.c): y (M, N) = x (M, K) W^T without bias, W read once;
 * y[m][n] depends on x[m], W[n] and the ISA only. linear_forward takes it for M <= SKINNY_MAX_ROWS when cpu_isa() is
 * AVX2 (with FMA) or AVX-512. */
enum { SKINNY_MAX_ROWS = 32 };
bool skinny_wanted(int M, int K);
void linear_forward_skinny(float *y, const float *x, const float *W, int M, int K, int N);
/* Batch-invariant mode's product (docs/training.md): y (M, N) = x (M, K) W^T, x's rows ldx floats apart and W's ldw,
 * every M through the few-row kernels (without AVX2 a plain loop): y[m][n]'s bits depend on x[m], W[n], K and the
 * ISA only, never on M, the row's place or the threads. */
/* Batch-invariant mode (kernels.h k_set_batch_invariant): the forward kernels below take their fixed-order paths. */
bool k_batch_invariant(void);
void linear_forward_bi(float *y, const float *x, int ldx, const float *W, int ldw, int M, int K, int N);
/* Batch-invariant mode's log-probability of token tok in a row of V logits at temperature (0: 1): the sampler's
 * and the trainer's, the same function of the row's bits. */
float logprob_row_bi(const float *logits, int V, float temperature, int tok);
void linear_backward(float *dx, float *dW, float *db, const float *dy, const float *x, const float *W, int N, int Din,
                     int Dout);

/* RoPE, HF rotate_half convention, in place on x: (N, H, hd), hd even; pos: (N); pairs (i, i + hd/2),
 * angle = pos * theta^(-2i/hd), computed in double. */
void rope_forward(float *x, const int32_t *pos, int N, int H, int hd, float theta);
/* In place: turns dL/d(rotated) (N, H, hd) into dL/d(input) (the inverse rotation; overwrites, no +=). */
void rope_backward(float *dx, const int32_t *pos, int N, int H, int hd, float theta);
/* The same with the frequencies given: pair i turns by pos * inv_freq[i] (hd / 2 of them; a scaled RoPE, such
 * as Llama 3's, remaps them). */
void rope_forward_freqs(float *x, const int32_t *pos, int N, int H, int hd, const double *inv_freq);
void rope_backward_freqs(float *dx, const int32_t *pos, int N, int H, int hd, const double *inv_freq);
/* inv_freq[i] = theta^(-2i/hd), i < hd / 2. */
void rope_default_freqs(double *inv_freq, int hd, float theta);

/* Causal GQA attention over packed sequences: sequence b is rows cu_seqlens[b]..cu_seqlens[b+1]-1.
 * out, q: (N, Hq, hd); k, v: (N, Hkv, hd); lse: (N, Hq) log-sum-exp of the scaled scores, or NULL;
 * scale 1/sqrt(hd); query head h uses kv head h / (Hq / Hkv). N = cu_seqlens[B].
 * prefix_of: NULL, or (B) host entries: -1, or the sequence p whose rows all come before sequence b's (a prompt
 * shared by a group's responses, packed once): b's rows then see all of p's keys, then their own causally. p must
 * have no prefix itself. */
void attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                       const int32_t *cu_seqlens, const int32_t *prefix_of, int B, int Hq, int Hkv, int hd);
/* dq += dL/dq (N, Hq, hd); dk, dv += (N, Hkv, hd), given dout, and out and lse from attention_forward.
 * Probabilities are recomputed block by block from lse (the N x N matrix is never stored). */
void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                        const float *q, const float *k, const float *v, const int32_t *cu_seqlens,
                        const int32_t *prefix_of, int B, int Hq, int Hkv, int hd);
/* KV-cache attention for generation, one sequence: out, q: (Tq, Hq, hd); kcache, vcache: (Tk, Hkv, hd),
 * Tq <= Tk; query i sits at position Tk - Tq + i and attends to cache positions 0 .. Tk - Tq + i. */
void attention_cached(float *out, const float *q, const float *kcache, const float *vcache, int Tq, int Tk, int Hq,
                      int Hkv, int hd);
/* The CPU's KV-cache append (the kv_store op): cache[i] = x[i] for i < n, or with bf16 x[i] rounded to BF16 (nearest
 * even) and held in fp32, as a BF16 cache on a GPU holds it. */
void kv_store(float *cache, const float *x, size_t n, bool bf16);
/* Batch-invariant mode's attention of n chosen query rows q (n, Hq, hd): row i against the keys and values
 * kfirst[i] .. klast[i] of k, v (rows Hkv hd apart, causal: the query sits at klast[i]), each row and head as a
 * decode step computes it (its bits those of attention_forward's and attention_cached's rows in the mode); out
 * (n, Hq, hd) and lse (n, Hq). Context parallelism's rows over the whole row's keys (worker/model/ring_attn.c). */
void attention_rows(float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *kfirst,
                    const int32_t *klast, int n, int Hq, int Hkv, int hd);

/* Ring attention's blocks (context parallelism, kernels/cpu/attention_block.c): nq query rows q (nq, Hq, hd)
 * against nk key rows k, v (nk, Hkv, hd) with NO causal cut, a query seeing exactly the keys of its own sequence
 * (qseq[i] == kseq[t]); scale 1/sqrt(hd), query head h on KV head h / (Hq / Hkv).
 * attention_block_forward: po (nq, Hq, hd) and plse (nq, Hq), the partial attention and its log-sum-exp (-inf,
 * and po 0, for a query that sees none of the keys).
 * attention_block_backward: dq (nq, Hq, hd), dk, dv (nk, Hkv, hd) += the block's gradients, its probabilities
 * recomputed from lse (nq, Hq) of the WHOLE attention (all blocks merged) and drow (nq, Hq) = dout . out of it.
 * attention_merge: out (n, Hq, hd), lse (n, Hq) merged in place with a partial po, plse by log-sum-exp (an entry
 * whose plse is -inf unchanged). attention_drow: drow (n, Hq) = dout . out per row and head (summed in double). */
void attention_block_forward(float *po, float *plse, const float *q, const float *k, const float *v,
                             const int32_t *qseq, const int32_t *kseq, int nq, int nk, int Hq, int Hkv, int hd);
void attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *drow,
                              const float *q, const float *k, const float *v, const int32_t *qseq, const int32_t *kseq,
                              int nq, int nk, int Hq, int Hkv, int hd);
void attention_merge(float *out, float *lse, const float *po, const float *plse, int n, int Hq, int hd);
void attention_drow(float *drow, const float *dout, const float *out, int n, int Hq, int hd);

/* SwiGLU: out = silu(gate) * up, elementwise over n; silu(g) = g * sigmoid(g). out may alias gate or up. */
void swiglu_forward(float *out, const float *gate, const float *up, size_t n);
/* dgate += dout * up * silu'(gate); dup += dout * silu(gate). All (n). */
void swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n);

/* Which BLAS kernels run, and why ("OpenBLAS SkylakeX kernels (chosen for this CPU)"): OpenBLAS's own choice,
 * the user's OPENBLAS_CORETYPE, or ours (kernels/blas_select.c re-runs a binary whose OpenBLAS chose kernels
 * older than its CPU can run). Returns buf. */
const char *blas_kernels(char *buf, size_t len);
/* When the user's OPENBLAS_CORETYPE names older kernels than the CPU runs: the kernels it could run ("SkylakeX");
 * else NULL. */
const char *blas_kernels_better(void);

/* y += x, both (n) (residual connections, gradient sums). */
void vec_add_inplace(float *y, const float *x, size_t n);
/* y += a * x, both (n). */
void vec_axpy(float *y, float a, const float *x, size_t n);
/* x *= a, (n). */
void vec_scale(float *x, float a, size_t n);

/* out[j] = exp(x[j] - shift) for x[j] <= shift (softmax rows), about 2 ulp; values below e^-87 become 0. */
void vec_exp_shifted(float *out, const float *x, size_t n, float shift);

/* Chunked LM-head log-probabilities: z = h W^T / temperature, logp[i] = log_softmax(z_i)[targets[i]],
 * entropy[i] = -sum_j p_ij log p_ij (entropy may be NULL). h: (N, D); W: (V, D); targets: (N) in [0, V).
 * Only chunk x V logits exist at a time (chunk > 0 tokens per chunk). */
void lmhead_logprob_forward(float *logp, float *entropy, const float *h, const float *W, const int32_t *targets, int N,
                            int D, int V, float temperature, int chunk);
/* dh += dL/dh (N, D) and dW += dL/dW (V, D) (either may be NULL) from dlogp (N) and dentropy (N, or NULL);
 * recomputes each chunk's logits, so peak scratch is chunk x V floats. */
void lmhead_logprob_backward(float *dh, float *dW, const float *dlogp, const float *dentropy, const float *h,
                             const float *W, const int32_t *targets, int N, int D, int V, float temperature, int chunk);

/* The same over a vocabulary shard (W: (hi - lo, D), this shard's rows): the softmax statistics of each token
 * (row maximum, sum of exponentials, the target's logit) are combined over the shards with vs->reduce, so the
 * (N, V) logits are never gathered. Every shard gets the whole logp and entropy. */
void lmhead_logprob_forward_shard(float *logp, float *entropy, const float *h, const float *W, const int32_t *targets,
                                  int N, int D, const struct vocab_shard *vs, float temperature, int chunk);
/* dh += this shard's part of dL/dh (summed over the shards, the whole gradient); dW += dL/dW of its rows. */
void lmhead_logprob_backward_shard(float *dh, float *dW, const float *dlogp, const float *dentropy, const float *h,
                                   const float *W, const int32_t *targets, int N, int D, const struct vocab_shard *vs,
                                   float temperature, int chunk);

/* One token from logits (V): greedy (temperature 0: the first maximum) or sampled from softmax(logits /
 * temperature) truncated to the top_k most likely (top_k <= 0: all) and then to the smallest set whose mass
 * reaches top_p (1: all), with the uniform u in [0, 1). *logp (may be NULL) gets the token's log-probability
 * under softmax(logits / temperature) before truncation (temperature 1 when greedy). */
int sample_row(const float *logits, int V, float temperature, float top_p, int top_k, double u, float *logp);

/* BF16 matrix products on this CPU (AMX or AVX512-BF16): whether they run here, and what runs them ("oneDNN
 * AMX-BF16"). kernels/cpu/linear_bf16.c. */
bool cpu_bf16_gemm_available(void);
const char *cpu_bf16_gemm_name(void);
/* linear_forward and linear_backward with x, W and dy rounded to BF16 for the products, fp32 accumulation and
 * fp32 results (same += semantics). */
void linear_forward_bf16(float *y, const float *x, const float *W, const float *b, int N, int Din, int Dout);
void linear_backward_bf16(float *dx, float *dW, float *db, const float *dy, const float *x, const float *W, int N,
                          int Din, int Dout);
/* lmhead_logprob_forward_shard and _backward_shard with the head's products in BF16 (h, W and the logits' gradients
 * rounded, fp32 accumulation); the softmax, its statistics and the results stay fp32 and double, as there. */
void lmhead_logprob_forward_shard_bf16(float *logp, float *entropy, const float *h, const float *W,
                                       const int32_t *targets, int N, int D, const struct vocab_shard *vs,
                                       float temperature, int chunk);
void lmhead_logprob_backward_shard_bf16(float *dh, float *dW, const float *dlogp, const float *dentropy, const float *h,
                                        const float *W, const int32_t *targets, int N, int D,
                                        const struct vocab_shard *vs, float temperature, int chunk);

/* The CPU back-end's table (kernels/cpu/backend.c), registered as kbackend_cpu (kernels/cpu/register.c). */
extern const struct kops kops_cpu;

/* Mixture of experts on the CPU (kernels/cpu/moe.c): the kops entries moe_route, moe_route_backward,
 * moe_experts_forward and moe_experts_backward (kernels.h). The routing pair touches only r's arrays (K unused); the
 * CUDA back-end has its own kernels for it (kernels/cuda/moe.cu). */
struct kctx;
struct kmoe;
void cpu_moe_route(struct kctx *K, struct kmoe *r, const float *logits);
void cpu_moe_route_backward(struct kctx *K, float *dlogits, const struct kmoe *r, const float *dwt,
                            const float *dp_col);
void cpu_moe_experts_forward(struct kctx *K, float *y, const float *x, const float *Wg, const float *Wu,
                             const float *Wd, struct kmoe *r);
/* The combine's backward, slot by slot in r's expert order: dys (N k, D) = each slot's weight x its token's dy, and
 * dwt (N k, by slot) = dy . the slot's expert output (r->ys); the expert-parallel layer reuses it. */
void cpu_moe_slot_grad(const struct kmoe *r, const float *dy, float *dys, float *dwt);
void cpu_moe_experts_backward(struct kctx *K, float *dx, float *dWg, float *dWu, float *dWd, float *dwt,
                              const float *dy, const float *Wg, const float *Wu, const float *Wd, const struct kmoe *r);
/* expert parallelism's row moves: the kops entries moe_gather, moe_combine, moe_slot_grad, moe_scatter */
void cpu_moe_gather(struct kctx *K, float *xs, const float *x, struct kmoe *r);
void cpu_moe_combine(struct kctx *K, float *y, const float *ys, const struct kmoe *r);
void cpu_moe_slot_grad_op(struct kctx *K, float *dys, float *dwt, const float *dy, const struct kmoe *r);
void cpu_moe_scatter(struct kctx *K, float *dx, const float *dxs, const struct kmoe *r);

#endif
