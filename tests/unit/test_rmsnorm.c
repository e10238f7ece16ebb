/* RMSNorm forward against a hand-worked case, backward against central finite differences. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"

static void test_forward_hand_worked(void **state)
{
    (void)state;
    /* x = (3, 4): mean square 12.5, rstd = 1/sqrt(12.5) = 0.28284271 */
    const float x[2] = {3.0f, 4.0f}, w[2] = {1.0f, 2.0f};
    float y[2], r;
    rmsnorm_forward(y, &r, x, w, 1, 2, 0.0f);
    assert_float_equal(r, 0.28284271f, 1e-6);
    assert_float_equal(y[0], 0.84852814f, 1e-6);
    assert_float_equal(y[1], 2.26274170f, 1e-6);
}

/* loss = sum(y * g) for a fixed random g, so dloss/dy = g */
static double loss_of(const float *x, const float *w, const float *g, int N, int D)
{
    float *y = malloc(sizeof(float) * (size_t)(N * D));
    rmsnorm_forward(y, NULL, x, w, N, D, 1e-5f);
    double s = 0;
    for (int i = 0; i < N * D; i++)
        s += (double)y[i] * g[i];
    free(y);
    return s;
}

static void test_backward_finite_differences(void **state)
{
    (void)state;
    enum { N = 3, D = 7 };
    float x[N * D], w[D], g[N * D], y[N * D], rstd[N], dx[N * D] = {0}, dw[D] = {0};
    srand(7);
    for (int i = 0; i < N * D; i++) {
        x[i] = (float)rand() / RAND_MAX * 2 - 1;
        g[i] = (float)rand() / RAND_MAX * 2 - 1;
    }
    for (int j = 0; j < D; j++)
        w[j] = 0.5f + (float)rand() / RAND_MAX;
    rmsnorm_forward(y, rstd, x, w, N, D, 1e-5f);
    rmsnorm_backward(dx, dw, g, x, w, rstd, N, D);
    const float h = 1e-2f;
    for (int i = 0; i < N * D; i++) {
        float keep = x[i];
        x[i] = keep + h;
        double lp = loss_of(x, w, g, N, D);
        x[i] = keep - h;
        double lm = loss_of(x, w, g, N, D);
        x[i] = keep;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - dx[i]) > 2e-3 * (1 + fabs(fd)))
            fail_msg("dx[%d]: analytic %g, finite difference %g", i, dx[i], fd);
    }
    for (int j = 0; j < D; j++) {
        float keep = w[j];
        w[j] = keep + h;
        double lp = loss_of(x, w, g, N, D);
        w[j] = keep - h;
        double lm = loss_of(x, w, g, N, D);
        w[j] = keep;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - dw[j]) > 2e-3 * (1 + fabs(fd)))
            fail_msg("dw[%d]: analytic %g, finite difference %g", j, dw[j], fd);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_hand_worked),
        cmocka_unit_test(test_backward_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
