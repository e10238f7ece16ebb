/* The vectorised exp of softmax rows against libm's exp over its whole range. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"

static void test_matches_libm(void **state)
{
    (void)state;
    enum { N = 20001 };
    static float x[N], y[N];
    for (int i = 0; i < N; i++)
        x[i] = -90.0f + 90.0f * (float)i / (N - 1); /* [-90, 0] */
    vec_exp_shifted(y, x, N, 0.0f);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double want = exp((double)x[i]);
        if (x[i] < -87.0f) {
            assert_true(y[i] == 0.0f); /* flushed below the float range's comfortable end */
            continue;
        }
        double rel = fabs(y[i] - want) / want;
        worst = rel > worst ? rel : worst;
    }
    if (worst > 5e-7)
        fail_msg("worst relative error %g", worst);
    /* the shift: exp(3 - 5) */
    float a = 3.0f, r;
    vec_exp_shifted(&r, &a, 1, 5.0f);
    assert_float_equal(r, exp(-2.0), 1e-7);
    a = 5.0f;
    vec_exp_shifted(&r, &a, 1, 5.0f);
    assert_true(r == 1.0f);
    a = -INFINITY;
    vec_exp_shifted(&r, &a, 1, 0.0f);
    assert_true(r == 0.0f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_matches_libm)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
