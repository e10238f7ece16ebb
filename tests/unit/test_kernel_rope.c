/* RoPE (HF rotate_half): identity at position 0, norm preservation, a hand-worked rotation, agreement
 * with a double-precision reference at positions up to 32k, backward as the inverse rotation and
 * against finite differences at large positions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "test_kernel_util.h"

enum { N = 4, H = 3, HD = 8 };
#define THETA 10000.0f

static void test_pos0_identity_and_norm(void **state)
{
    (void)state;
    uint64_t s = 1;
    float x[N * H * HD], y[N * H * HD];
    tk_fill(x, N * H * HD, &s, -1, 1);
    memcpy(y, x, sizeof x);
    const int32_t zero[N] = {0, 0, 0, 0};
    rope_forward(y, zero, N, H, HD, THETA);
    for (int i = 0; i < N * H * HD; i++)
        assert_float_equal(y[i], x[i], 0.0);

    const int32_t pos[N] = {1, 17, 4095, 32767};
    memcpy(y, x, sizeof x);
    rope_forward(y, pos, N, H, HD, THETA);
    for (int t = 0; t < N * H; t++) {
        double nx = tk_dot(x + t * HD, x + t * HD, HD), ny = tk_dot(y + t * HD, y + t * HD, HD);
        assert_float_equal(ny, nx, 1e-5 * nx);
        /* each rotated pair (i, i + hd/2) keeps its own norm too */
        for (int i = 0; i < HD / 2; i++) {
            const float *a = x + t * HD, *b = y + t * HD;
            double px = (double)a[i] * a[i] + (double)a[i + HD / 2] * a[i + HD / 2];
            double py = (double)b[i] * b[i] + (double)b[i + HD / 2] * b[i + HD / 2];
            assert_float_equal(py, px, 1e-5 * (px + 1e-3));
        }
    }
}

static void test_hand_worked(void **state)
{
    (void)state;
    /* hd = 4, theta = 100: inv_freq = (1, 0.1). pos = 5: angles (5, 0.5).
     * x = (1, 2, 3, 4): pairs (x0, x2) = (1, 3) by 5 rad, (x1, x3) = (2, 4) by 0.5 rad. */
    float x[4] = {1, 2, 3, 4};
    const int32_t pos[1] = {5};
    rope_forward(x, pos, 1, 1, 4, 100.0f);
    double c0 = cos(5.0), s0 = sin(5.0), c1 = cos(0.5), s1 = sin(0.5);
    assert_float_equal(x[0], 1 * c0 - 3 * s0, 1e-6);
    assert_float_equal(x[2], 3 * c0 + 1 * s0, 1e-6);
    assert_float_equal(x[1], 2 * c1 - 4 * s1, 1e-6);
    assert_float_equal(x[3], 4 * c1 + 2 * s1, 1e-6);
}

static void test_large_positions_match_double_reference(void **state)
{
    (void)state;
    enum { HD2 = 64 };
    const int32_t pos[3] = {8191, 30011, 32767};
    uint64_t s = 2;
    float x[3 * HD2], y[3 * HD2];
    tk_fill(x, 3 * HD2, &s, -1, 1);
    memcpy(y, x, sizeof x);
    rope_forward(y, pos, 3, 1, HD2, 1000000.0f);
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < HD2 / 2; i++) {
            double a = pos[t] * pow(1000000.0, -2.0 * i / HD2);
            double x1 = x[t * HD2 + i], x2 = x[t * HD2 + i + HD2 / 2];
            assert_float_equal(y[t * HD2 + i], x1 * cos(a) - x2 * sin(a), 2e-6);
            assert_float_equal(y[t * HD2 + i + HD2 / 2], x2 * cos(a) + x1 * sin(a), 2e-6);
        }
}

static void test_backward_inverts_forward(void **state)
{
    (void)state;
    uint64_t s = 3;
    const int32_t pos[N] = {0, 3, 20000, 32000};
    float x[N * H * HD], y[N * H * HD];
    tk_fill(x, N * H * HD, &s, -1, 1);
    memcpy(y, x, sizeof x);
    rope_forward(y, pos, N, H, HD, THETA);
    rope_backward(y, pos, N, H, HD, THETA);
    for (int i = 0; i < N * H * HD; i++)
        assert_float_equal(y[i], x[i], 1e-6);
}

struct ctx {
    float *x, *g;
    const int32_t *pos;
};

static double loss(void *p)
{
    struct ctx *c = p;
    float y[N * H * HD];
    memcpy(y, c->x, sizeof y);
    rope_forward(y, c->pos, N, H, HD, THETA);
    return tk_dot(y, c->g, N * H * HD);
}

static void test_backward_finite_differences(void **state)
{
    (void)state;
    uint64_t s = 4;
    const int32_t pos[N] = {7, 1000, 16383, 32767};
    float x[N * H * HD], g[N * H * HD], dx[N * H * HD];
    tk_fill(x, N * H * HD, &s, -1, 1);
    tk_fill(g, N * H * HD, &s, -1, 1);
    memcpy(dx, g, sizeof dx);
    rope_backward(dx, pos, N, H, HD, THETA);
    struct ctx c = {x, g, pos};
    tk_fd_check("dx", x, N * H * HD, NULL, 0, dx, 0.0f, loss, &c, 1e-2f, 1e-3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pos0_identity_and_norm),
        cmocka_unit_test(test_hand_worked),
        cmocka_unit_test(test_large_positions_match_double_reference),
        cmocka_unit_test(test_backward_inverts_forward),
        cmocka_unit_test(test_backward_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
