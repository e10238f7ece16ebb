/* Embedding lookup forward (row copies) and backward (scatter-add with repeated ids, finite differences). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "test_kernel_util.h"

enum { V = 5, D = 3, N = 6 };
static const int32_t ids[N] = {4, 0, 4, 2, 4, 0}; /* repeats: 4 three times, 0 twice, 1 and 3 never */

static void test_forward_copies_rows(void **state)
{
    (void)state;
    float table[V * D], out[N * D];
    for (int i = 0; i < V * D; i++)
        table[i] = (float)i;
    embedding_forward(out, ids, table, N, D, V);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < D; j++)
            assert_float_equal(out[i * D + j], (float)(ids[i] * D + j), 0.0);
}

static void test_backward_scatter_adds(void **state)
{
    (void)state;
    float dout[N * D], dtable[V * D];
    for (int i = 0; i < N * D; i++)
        dout[i] = (float)(i + 1);
    tk_set(dtable, V * D, 1.0f);
    embedding_backward(dtable, dout, ids, N, D, V);
    for (int r = 0; r < V; r++)
        for (int j = 0; j < D; j++) {
            float want = 1.0f;
            for (int i = 0; i < N; i++)
                if (ids[i] == r)
                    want += dout[i * D + j];
            assert_float_equal(dtable[r * D + j], want, 0.0);
        }
}

struct ctx {
    float *table, *g;
};

static double loss(void *p)
{
    struct ctx *c = p;
    float out[N * D];
    embedding_forward(out, ids, c->table, N, D, V);
    return tk_dot(out, c->g, N * D);
}

static void test_backward_finite_differences(void **state)
{
    (void)state;
    uint64_t s = 11;
    float table[V * D], g[N * D], dtable[V * D];
    tk_fill(table, V * D, &s, -1, 1);
    tk_fill(g, N * D, &s, -1, 1);
    tk_set(dtable, V * D, 0.25f);
    embedding_backward(dtable, g, ids, N, D, V);
    struct ctx c = {table, g};
    tk_fd_check("dtable", table, V * D, NULL, 0, dtable, 0.25f, loss, &c, 1e-2f, 1e-3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_copies_rows),
        cmocka_unit_test(test_backward_scatter_adds),
        cmocka_unit_test(test_backward_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
