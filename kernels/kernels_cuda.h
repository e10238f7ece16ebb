/* CUDA twins of the CPU kernels in kernels.h: same shapes and semantics, device pointers (host scalars), launched
 * on the given stream; each returns the launch's error (cudaGetLastError). Built only when CUDA is enabled. They are
 * deterministic: no reduction uses atomics, so two runs on the same inputs and device give the same bits. */
#ifndef GRPO_KERNELS_CUDA_H
#define GRPO_KERNELS_CUDA_H

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

#ifdef __cplusplus
}
#endif

#endif
