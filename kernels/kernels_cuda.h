/* CUDA twins of the CPU kernels in kernels.h: same shapes, device pointers,
 * launched on the given stream. Built only when CUDA is enabled. */
#ifndef GRPO_KERNELS_CUDA_H
#define GRPO_KERNELS_CUDA_H

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* RMSNorm forward on the GPU (see rmsnorm_forward). */
cudaError_t rmsnorm_forward_cuda(float *y, float *rstd, const float *x, const float *w, int N, int D, float eps,
                                 cudaStream_t stream);
/* RMSNorm backward on the GPU (see rmsnorm_backward; dw accumulated with atomics). */
cudaError_t rmsnorm_backward_cuda(float *dx, float *dw, const float *dy, const float *x, const float *w,
                                  const float *rstd, int N, int D, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
