/* Linear layer: forward against a naive double loop (with and without bias), backward against
 * central finite differences for dx, dW, db, and NULL gradient outputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "test_kernel_util.h"

enum { N = 4, DIN = 5, DOUT = 3 };

static void test_forward_hand_worked(void **state)
{
    (void)state;
    /* x = (1, 2); W = [[1, 0], [3, -1]]; b = (0.5, -1): y = (1.5, 0) */
    const float x[2] = {1, 2}, W[4] = {1, 0, 3, -1}, b[2] = {0.5f, -1};
    float y[2];
    linear_forward(y, x, W, b, 1, 2, 2);
    assert_float_equal(y[0], 1.5f, 1e-6);
    assert_float_equal(y[1], 0.0f, 1e-6);
    linear_forward(y, x, W, NULL, 1, 2, 2);
    assert_float_equal(y[0], 1.0f, 1e-6);
    assert_float_equal(y[1], 1.0f, 1e-6);
}

static void test_forward_matches_naive(void **state)
{
    (void)state;
    uint64_t s = 3;
    float x[N * DIN], W[DOUT * DIN], b[DOUT], y[N * DOUT];
    tk_fill(x, N * DIN, &s, -1, 1);
    tk_fill(W, DOUT * DIN, &s, -1, 1);
    tk_fill(b, DOUT, &s, -1, 1);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        linear_forward(y, x, W, with_bias ? b : NULL, N, DIN, DOUT);
        for (int i = 0; i < N; i++)
            for (int o = 0; o < DOUT; o++) {
                double r = with_bias ? b[o] : 0.0;
                for (int j = 0; j < DIN; j++)
                    r += (double)x[i * DIN + j] * W[o * DIN + j];
                assert_float_equal(y[i * DOUT + o], r, 1e-5);
            }
    }
}

struct ctx {
    float *x, *W, *b, *g;
};

static double loss(void *p)
{
    struct ctx *c = p;
    float y[N * DOUT];
    linear_forward(y, c->x, c->W, c->b, N, DIN, DOUT);
    return tk_dot(y, c->g, N * DOUT);
}

static void run_fd(int with_bias)
{
    uint64_t s = 5 + (uint64_t)with_bias;
    float x[N * DIN], W[DOUT * DIN], b[DOUT], g[N * DOUT];
    float dx[N * DIN], dW[DOUT * DIN], db[DOUT];
    tk_fill(x, N * DIN, &s, -1, 1);
    tk_fill(W, DOUT * DIN, &s, -1, 1);
    tk_fill(b, DOUT, &s, -1, 1);
    tk_fill(g, N * DOUT, &s, -1, 1);
    tk_set(dx, N * DIN, 0.5f);
    tk_set(dW, DOUT * DIN, 0.5f);
    tk_set(db, DOUT, 0.5f);
    linear_backward(dx, dW, with_bias ? db : NULL, g, x, W, N, DIN, DOUT);
    struct ctx c = {x, W, with_bias ? b : NULL, g};
    tk_fd_check("dx", x, N * DIN, NULL, 0, dx, 0.5f, loss, &c, 1e-2f, 2e-3);
    tk_fd_check("dW", W, DOUT * DIN, NULL, 0, dW, 0.5f, loss, &c, 1e-2f, 2e-3);
    if (with_bias)
        tk_fd_check("db", b, DOUT, NULL, 0, db, 0.5f, loss, &c, 1e-2f, 2e-3);
    else
        for (int o = 0; o < DOUT; o++)
            assert_float_equal(db[o], 0.5f, 0.0); /* NULL db: untouched */
}

static void test_backward_fd_with_bias(void **state)
{
    (void)state;
    run_fd(1);
}

static void test_backward_fd_without_bias(void **state)
{
    (void)state;
    run_fd(0);
}

static void test_backward_null_outputs(void **state)
{
    (void)state;
    uint64_t s = 9;
    float x[N * DIN], W[DOUT * DIN], g[N * DOUT], dx[N * DIN] = {0}, dx2[N * DIN] = {0}, dW[DOUT * DIN] = {0};
    tk_fill(x, N * DIN, &s, -1, 1);
    tk_fill(W, DOUT * DIN, &s, -1, 1);
    tk_fill(g, N * DOUT, &s, -1, 1);
    linear_backward(dx, dW, NULL, g, x, W, N, DIN, DOUT);
    linear_backward(dx2, NULL, NULL, g, x, W, N, DIN, DOUT);
    for (int i = 0; i < N * DIN; i++)
        assert_float_equal(dx[i], dx2[i], 0.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_hand_worked),   cmocka_unit_test(test_forward_matches_naive),
        cmocka_unit_test(test_backward_fd_with_bias), cmocka_unit_test(test_backward_fd_without_bias),
        cmocka_unit_test(test_backward_null_outputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
