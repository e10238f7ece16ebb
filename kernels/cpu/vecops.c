#include "cpu_kernels.h"

void vec_add_inplace(float *y, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

void vec_axpy(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void vec_scale(float *x, float a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] *= a;
}
