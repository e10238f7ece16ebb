#include <math.h>

#include "common/check.h"
#include "cpu_kernels.h"

/* Rotates every head of every token by its position's angles; sign = +1 forward, -1 for the
 * inverse (transpose) rotation used by backward. Angles and their cos/sin are computed in double
 * (pos * inv_freq reaches ~3e4 rad, where float angles lose ~1e-3 rad), then rounded once. */
static void rope_apply(float *x, const int32_t *pos, int N, int H, int hd, const double *inv_freq, double sign)
{
    if (hd % 2 != 0)
        check_failf(__FILE__, __LINE__, "rope: head_dim %d is odd", hd);
    int half = hd / 2;
    float *c = xmalloc(sizeof(float) * (size_t)half), *s = xmalloc(sizeof(float) * (size_t)half);
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < half; i++) {
            double a = (double)pos[t] * inv_freq[i];
            c[i] = (float)cos(a);
            s[i] = (float)(sign * sin(a));
        }
        for (int h = 0; h < H; h++) {
            float *xh = x + ((size_t)t * H + h) * hd;
            for (int i = 0; i < half; i++) {
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c[i] - x2 * s[i];
                xh[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
    free(c);
    free(s);
}

void rope_default_freqs(double *inv_freq, int hd, float theta)
{
    for (int i = 0; i < hd / 2; i++)
        inv_freq[i] = pow((double)theta, -2.0 * i / hd);
}

void rope_forward_freqs(float *x, const int32_t *pos, int N, int H, int hd, const double *inv_freq)
{
    rope_apply(x, pos, N, H, hd, inv_freq, 1.0);
}

void rope_backward_freqs(float *dx, const int32_t *pos, int N, int H, int hd, const double *inv_freq)
{
    /* forward is an orthogonal rotation R per pair; dL/dx = R^T dL/dy = rotation by -angle */
    rope_apply(dx, pos, N, H, hd, inv_freq, -1.0);
}

/* The default frequencies of theta, for one call. */
static double *default_freqs(int hd, float theta)
{
    double *f = xmalloc(sizeof(double) * (size_t)(hd / 2 > 0 ? hd / 2 : 1));
    rope_default_freqs(f, hd, theta);
    return f;
}

void rope_forward(float *x, const int32_t *pos, int N, int H, int hd, float theta)
{
    double *f = default_freqs(hd, theta);
    rope_apply(x, pos, N, H, hd, f, 1.0);
    free(f);
}

void rope_backward(float *dx, const int32_t *pos, int N, int H, int hd, float theta)
{
    double *f = default_freqs(hd, theta);
    rope_apply(dx, pos, N, H, hd, f, -1.0);
    free(f);
}
