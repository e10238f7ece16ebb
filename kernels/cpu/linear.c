#include "cpu_kernels.h"

/* Every binary that multiplies matrices also links blas_select.c (its constructor picks the kernels). */
__attribute__((used)) static const char *(*const keep_blas_select)(char *, size_t) = blas_kernels;

void linear_forward(float *y, const float *x, const float *W, const float *b, int N, int Din, int Dout)
{
    if (N <= 0 || Dout <= 0)
        return;
    if (Din <= 0) {
        for (size_t i = 0; i < (size_t)N * Dout; i++)
            y[i] = 0.0f;
    } else {
        /* y (N, Dout) = x (N, Din) * W^T (Din, Dout) */
        if (skinny_wanted(N, Din))
            linear_forward_skinny(y, x, W, N, Din, Dout);
        else
            cpu_sgemm(false, true, N, Dout, Din, 1.0f, x, Din, W, Din, 0.0f, y, Dout);
    }
    if (b)
        for (int i = 0; i < N; i++) {
            float *yi = y + (size_t)i * Dout;
            for (int o = 0; o < Dout; o++)
                yi[o] += b[o];
        }
}

void linear_backward(float *dx, float *dW, float *db, const float *dy, const float *x, const float *W, int N, int Din,
                     int Dout)
{
    if (N <= 0 || Dout <= 0)
        return;
    if (dx && Din > 0) /* dx (N, Din) += dy (N, Dout) * W (Dout, Din) */
        cpu_sgemm(false, false, N, Din, Dout, 1.0f, dy, Dout, W, Din, 1.0f, dx, Din);
    if (dW && Din > 0) /* dW (Dout, Din) += dy^T (Dout, N) * x (N, Din) */
        cpu_sgemm(true, false, Dout, Din, N, 1.0f, dy, Dout, x, Din, 1.0f, dW, Din);
    if (db)
        for (int i = 0; i < N; i++) {
            const float *dyi = dy + (size_t)i * Dout;
            for (int o = 0; o < Dout; o++)
                db[o] += dyi[o];
        }
}
