/* SwiGLU forward against the formula (also at large |gate|), backward against finite differences,
 * and the small vector ops. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "test_kernel_util.h"

enum { N = 40 };

static void test_forward_formula_and_extremes(void **state)
{
    (void)state;
    const float gate[6] = {0.0f, 1.0f, -2.0f, 100.0f, -100.0f, -1000.0f};
    const float up[6] = {3.0f, 2.0f, 0.5f, 1.5f, 7.0f, 1.0f};
    float out[6];
    swiglu_forward(out, gate, up, 6);
    for (int i = 0; i < 6; i++) {
        double g = gate[i], want = g / (1.0 + exp(-g)) * up[i];
        assert_float_equal(out[i], want, 1e-6 * (1 + fabs(want)));
    }
    /* gradients stay finite at the extremes */
    float dg[6] = {0}, du[6] = {0};
    const float dout[6] = {1, 1, 1, 1, 1, 1};
    swiglu_backward(dg, du, dout, gate, up, 6);
    for (int i = 0; i < 6; i++)
        assert_true(isfinite(dg[i]) && isfinite(du[i]));
    assert_float_equal(dg[3], up[3], 1e-5); /* silu'(100) = 1 */
    assert_float_equal(dg[4], 0.0, 1e-5);   /* silu'(-100) = 0 */
    assert_float_equal(dg[0], 0.5 * up[0], 1e-6);
}

struct ctx {
    float *gate, *up, *g;
};

static double loss(void *p)
{
    struct ctx *c = p;
    float out[N];
    swiglu_forward(out, c->gate, c->up, N);
    return tk_dot(out, c->g, N);
}

static void test_backward_finite_differences(void **state)
{
    (void)state;
    uint64_t s = 8;
    float gate[N], up[N], g[N], dgate[N], dup[N];
    tk_fill(gate, N, &s, -4, 4);
    tk_fill(up, N, &s, -2, 2);
    tk_fill(g, N, &s, -1, 1);
    tk_set(dgate, N, -0.5f);
    tk_set(dup, N, -0.5f);
    swiglu_backward(dgate, dup, g, gate, up, N);
    struct ctx c = {gate, up, g};
    tk_fd_check("dgate", gate, N, NULL, 0, dgate, -0.5f, loss, &c, 1e-2f, 2e-3);
    tk_fd_check("dup", up, N, NULL, 0, dup, -0.5f, loss, &c, 1e-2f, 2e-3);
}

static void test_vecops(void **state)
{
    (void)state;
    float y[3] = {1, 2, 3};
    const float x[3] = {10, 20, 30};
    vec_add_inplace(y, x, 3);
    assert_float_equal(y[0], 11, 0);
    assert_float_equal(y[2], 33, 0);
    vec_axpy(y, -0.5f, x, 3);
    assert_float_equal(y[0], 6, 0);
    assert_float_equal(y[1], 12, 0);
    vec_scale(y, 2.0f, 3);
    assert_float_equal(y[2], 36, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_formula_and_extremes),
        cmocka_unit_test(test_backward_finite_differences),
        cmocka_unit_test(test_vecops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
