#include <math.h>

#include "cpu_kernels.h"

void rmsnorm_forward(float *y, float *rstd, const float *x, const float *w, int N, int D, float eps)
{
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * D;
        float *yi = y + (size_t)i * D;
        double ss = 0.0; /* double: D up to ~10^4 squares summed */
        for (int j = 0; j < D; j++)
            ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / D + eps));
        if (rstd)
            rstd[i] = r;
        for (int j = 0; j < D; j++)
            yi[j] = xi[j] * r * w[j];
    }
}

void rmsnorm_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd, int N,
                      int D)
{
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * D, *dyi = dy + (size_t)i * D;
        float *dxi = dx + (size_t)i * D;
        float r = rstd[i];
        /* y_j = x_j r w_j, r = (mean x^2 + eps)^-1/2, dr/dx_k = -r^3 x_k / D */
        double dot = 0.0;
        for (int j = 0; j < D; j++) {
            dot += (double)dyi[j] * w[j] * xi[j];
            dw[j] += dyi[j] * xi[j] * r;
        }
        float c = (float)(dot * r * r * r / D);
        for (int j = 0; j < D; j++)
            dxi[j] += dyi[j] * w[j] * r - c * xi[j];
    }
}
