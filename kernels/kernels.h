/* CPU compute kernels, fp32, row-major. Each op has a forward and a backward;
 * backward functions ACCUMULATE (+=) into parameter gradients and input
 * gradients, so callers zero them once per step. Shapes are in the comments:
 * N rows (tokens), D features. */
#ifndef GRPO_KERNELS_H
#define GRPO_KERNELS_H

#include <stddef.h>

/* RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.  x, y: (N, D); w: (D); rstd out: (N), kept for backward. */
void rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int N, int D, float eps);
/* dx += d/dx, dw += d/dw given dy (N, D), x, w and the rstd saved by forward. */
void rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                      int N, int D);

#endif
