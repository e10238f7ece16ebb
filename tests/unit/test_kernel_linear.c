/* Linear layer: forward against a naive double loop (with and without bias), backward against
 * central finite differences for dx, dW, db, and NULL gradient outputs. The few-row product (skinny.c) on every
 * ISA path this CPU runs: against the double loop over odd shapes (K and N tails), and bit for bit the same for a
 * row whatever the batch around it and the thread count. */
#include <cblas.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/pool.h"
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

/* every skinny ISA path this CPU can run (CPU_ISA_NONE: sgemm), the automatic choice first */
static int skinny_paths(enum cpu_isa *out)
{
    int n = 0;
    out[n++] = CPU_ISA_AUTO;
    for (int isa = CPU_ISA_NONE; isa <= CPU_ISA_AVX512; isa++)
        if (cpu_force_isa((enum cpu_isa)isa))
            out[n++] = (enum cpu_isa)isa;
    cpu_force_isa(CPU_ISA_AUTO);
    return n;
}

static void test_skinny_matches_naive(void **state)
{
    (void)state;
    enum cpu_isa paths[5];
    const int npaths = skinny_paths(paths);
    print_message("skinny: automatic choice %s, %d path(s) checked\n", cpu_isa_name(cpu_isa()), npaths);
    const int Ms[] = {1, 3, 4, 8, 13, 32}, Ks[] = {1, 5, 16, 23, 64, 129}, Ns[] = {1, 3, 7, 16, 33};
    uint64_t s = 17;
    float *x = tk_alloc(32 * 129), *W = tk_alloc(33 * 129), *y = tk_alloc(32 * 33);
    tk_fill(x, 32 * 129, &s, -1, 1);
    tk_fill(W, 33 * 129, &s, -1, 1);
    for (int p = 0; p < npaths; p++) {
        assert_true(cpu_force_isa(paths[p]));
        for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
            for (size_t b = 0; b < sizeof Ks / sizeof *Ks; b++)
                for (size_t c = 0; c < sizeof Ns / sizeof *Ns; c++) {
                    const int M = Ms[a], K = Ks[b], Nn = Ns[c];
                    tk_set(y, 32 * 33, NAN);
                    linear_forward(y, x, W, NULL, M, K, Nn);
                    for (int i = 0; i < M; i++)
                        for (int o = 0; o < Nn; o++) {
                            double r = 0.0, mag = 0.0;
                            for (int j = 0; j < K; j++) {
                                r += (double)x[i * K + j] * W[o * K + j];
                                mag += fabs((double)x[i * K + j] * W[o * K + j]);
                            }
                            if (fabs(y[i * Nn + o] - r) > 1e-6 * (mag + 1.0))
                                fail_msg("skinny %s M=%d K=%d N=%d: y[%d][%d] = %.9g, double loop %.9g",
                                         cpu_isa_name(paths[p]), M, K, Nn, i, o, y[i * Nn + o], r);
                        }
                    for (int i = M * Nn; i < 32 * 33; i++)
                        assert_true(isnan(y[i])); /* nothing written past the output */
                }
    }
    cpu_force_isa(CPU_ISA_AUTO);
    free(x), free(W), free(y);
}

/* A row's output is the same bits alone, at any place in a batch of up to SKINNY_MAX_ROWS, and with 2 threads
 * (generation batches rows differently from one step to the next). */
static void test_skinny_row_independent(void **state)
{
    (void)state;
    enum { K = 200, NO = 300, MMAX = SKINNY_MAX_ROWS };
    enum cpu_isa paths[5];
    const int npaths = skinny_paths(paths);
    uint64_t s = 23;
    float *x = tk_alloc(MMAX * K), *W = tk_alloc(NO * K), *y1 = tk_alloc(NO), *yb = tk_alloc(MMAX * NO);
    tk_fill(x, MMAX * K, &s, -1, 1);
    tk_fill(W, NO * K, &s, -1, 1);
    const int threads = cpu_pool_threads();
    for (int p = 0; p < npaths; p++) {
        if (paths[p] == CPU_ISA_NONE || (paths[p] == CPU_ISA_AUTO && cpu_isa() == CPU_ISA_NONE))
            continue; /* sgemm: rows are not independent there */
        assert_true(cpu_force_isa(paths[p]));
        for (int t = 1; t <= 2; t++) {
            cpu_set_threads(t);
            for (int M = 1; M <= MMAX; M += 7) {
                linear_forward(yb, x, W, NULL, M, K, NO);
                for (int i = 0; i < M; i++) {
                    cpu_set_threads(1);
                    linear_forward(y1, x + (size_t)i * K, W, NULL, 1, K, NO);
                    cpu_set_threads(t);
                    if (memcmp(y1, yb + (size_t)i * NO, NO * sizeof(float)) != 0)
                        fail_msg("skinny %s: row %d of a batch of %d at %d thread(s) differs from the row alone",
                                 cpu_isa_name(paths[p]), i, M, t);
                }
            }
        }
    }
    cpu_set_threads(threads);
    cpu_force_isa(CPU_ISA_AUTO);
    free(x), free(W), free(y1), free(yb);
}

/* The products split over the pool's threads (kernels/cpu/gemm.c), by rows (many tokens) and by columns (few tokens,
 * wide outputs): at 1, 2 and 3 threads y, dx and dW match double loops, and a second call gives the same bits (the
 * bits may differ between thread counts: OpenBLAS picks its kernel by the size of each part). */
static double dot_ref(const float *a, int sa, const float *b, int sb, int n, double *mag)
{
    double r = 0;
    *mag = 0;
    for (int j = 0; j < n; j++)
        r += (double)a[(size_t)j * sa] * b[(size_t)j * sb], *mag += fabs((double)a[(size_t)j * sa] * b[(size_t)j * sb]);
    return r;
}

static void expect_ref(const char *what, float got, double ref, double mag, int N, int Din, int Dout, int t)
{
    if (fabs(got - ref) > 1e-5 * mag + 1e-6)
        fail_msg("%s, %d x %d x %d at %d thread(s): %.9g, double loop %.9g", what, N, Din, Dout, t, got, ref);
}

static void test_split_products(void **state)
{
    (void)state;
    static const int shapes[][3] = {{300, 100, 150}, {40, 96, 1000}, {1000, 64, 48}, {33, 257, 129}};
    const int before = cpu_pool_threads();
    uint64_t s = 29;
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        const int N = shapes[c][0], Din = shapes[c][1], Dout = shapes[c][2];
        float *x = tk_alloc((size_t)N * Din), *W = tk_alloc((size_t)Dout * Din), *dy = tk_alloc((size_t)N * Dout);
        tk_fill(x, (size_t)N * Din, &s, -1, 1);
        tk_fill(W, (size_t)Dout * Din, &s, -1, 1);
        tk_fill(dy, (size_t)N * Dout, &s, -1, 1);
        float *y[2], *dx[2], *dW[2];
        for (int t = 1; t <= 3; t++) {
            cpu_set_threads(t);
            for (int r = 0; r < 2; r++) {
                y[r] = tk_alloc((size_t)N * Dout), dx[r] = tk_alloc((size_t)N * Din);
                dW[r] = tk_alloc((size_t)Dout * Din);
                tk_set(dx[r], (size_t)N * Din, 0.5f), tk_set(dW[r], (size_t)Dout * Din, -0.5f);
                linear_forward(y[r], x, W, NULL, N, Din, Dout);
                linear_backward(dx[r], dW[r], NULL, dy, x, W, N, Din, Dout);
            }
            assert_memory_equal(y[1], y[0], sizeof(float) * (size_t)N * Dout);
            assert_memory_equal(dx[1], dx[0], sizeof(float) * (size_t)N * Din);
            assert_memory_equal(dW[1], dW[0], sizeof(float) * (size_t)Dout * Din);
            double mag, ref;
            for (int i = 0; i < N; i += 7)
                for (int o = 0; o < Dout; o += 5) {
                    ref = dot_ref(x + (size_t)i * Din, 1, W + (size_t)o * Din, 1, Din, &mag);
                    expect_ref("y", y[0][(size_t)i * Dout + o], ref, mag, N, Din, Dout, t);
                }
            for (int i = 0; i < N; i += 7)
                for (int j = 0; j < Din; j += 5) {
                    ref = dot_ref(dy + (size_t)i * Dout, 1, W + j, Din, Dout, &mag);
                    expect_ref("dx", dx[0][(size_t)i * Din + j] - 0.5f, ref, mag, N, Din, Dout, t);
                }
            for (int o = 0; o < Dout; o += 7)
                for (int j = 0; j < Din; j += 5) {
                    ref = dot_ref(dy + o, Dout, x + j, Din, N, &mag);
                    expect_ref("dW", dW[0][(size_t)o * Din + j] + 0.5f, ref, mag, N, Din, Dout, t);
                }
            for (int r = 0; r < 2; r++)
                free(y[r]), free(dx[r]), free(dW[r]);
        }
        free(x), free(W), free(dy);
    }
    cpu_set_threads(before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_hand_worked),    cmocka_unit_test(test_forward_matches_naive),
        cmocka_unit_test(test_backward_fd_with_bias),  cmocka_unit_test(test_backward_fd_without_bias),
        cmocka_unit_test(test_backward_null_outputs),  cmocka_unit_test(test_skinny_matches_naive),
        cmocka_unit_test(test_skinny_row_independent), cmocka_unit_test(test_split_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
