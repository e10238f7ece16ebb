/* Ring attention's blocks on the CPU back-end (kernels/cpu/attention_block.c through the kernel interface) against
 * the causal attention kernel: the last query row of each packed sequence sees every key of its sequence, so a
 * block of those rows against all keys (no causal cut, a query seeing its own sequence's keys) must give the
 * causal kernel's output, log-sum-exp and, with the output gradient on those rows only, its gradients; the same
 * keys cut into two blocks merged by log-sum-exp must give the same again (a sequence wholly in one block included,
 * and a query that sees none of a block's keys). These are the reference the CUDA back-end's blocks are checked
 * against (tests/gpu/test_gpu_kernels.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels.h"
#include "test_kernel_util.h"

enum { B = 3, N = 18, HQ = 4, HKV = 2, HD = 8, NQ = B };

static const int32_t cu[B + 1] = {0, 5, 14, 18};

struct fixture {
    float q[N * HQ * HD], k[N * HKV * HD], v[N * HKV * HD], out[N * HQ * HD], lse[N * HQ];
    int32_t seq[N], last_seq[NQ];
    float lq[NQ * HQ * HD], lout[NQ * HQ * HD], llse[NQ * HQ]; /* the last rows' */
};

static void setup_fixture(struct fixture *f)
{
    uint64_t s = 42;
    tk_fill(f->q, N * HQ * HD, &s, -1, 1);
    tk_fill(f->k, N * HKV * HD, &s, -1, 1);
    tk_fill(f->v, N * HKV * HD, &s, -1, 1);
    struct kctx *K = kctx_cpu();
    k_attention_forward(K, f->out, f->lse, f->q, f->k, f->v, cu, NULL, B, HQ, HKV, HD);
    for (int b = 0; b < B; b++) {
        for (int t = cu[b]; t < cu[b + 1]; t++)
            f->seq[t] = 100 + b; /* any ids: only equality counts */
        const int r = cu[b + 1] - 1;
        f->last_seq[b] = 100 + b;
        memcpy(f->lq + b * HQ * HD, f->q + r * HQ * HD, sizeof(float) * HQ * HD);
        memcpy(f->lout + b * HQ * HD, f->out + r * HQ * HD, sizeof(float) * HQ * HD);
        memcpy(f->llse + b * HQ, f->lse + r * HQ, sizeof(float) * HQ);
    }
}

static void near(const char *what, const float *got, const float *want, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * (1 + fabs((double)want[i]))))
            fail_msg("%s[%zu] = %.9g, the causal kernel's %.9g", what, i, (double)got[i], (double)want[i]);
}

static void test_block_forward_is_the_last_rows_attention(void **state)
{
    (void)state;
    static struct fixture f;
    setup_fixture(&f);
    struct kctx *K = kctx_cpu();
    float po[NQ * HQ * HD], plse[NQ * HQ];
    k_attention_block_forward(K, po, plse, f.lq, f.k, f.v, f.last_seq, f.seq, NQ, N, HQ, HKV, HD);
    near("po", po, f.lout, NQ * HQ * HD, 1e-5);
    near("plse", plse, f.llse, NQ * HQ, 1e-5);
    /* a query of a sequence the block does not hold: -inf and 0 */
    const int32_t other = 7;
    float po1[HQ * HD], pl1[HQ];
    tk_set(po1, HQ * HD, 3.0f);
    k_attention_block_forward(K, po1, pl1, f.lq, f.k, f.v, &other, f.seq, 1, N, HQ, HKV, HD);
    for (int h = 0; h < HQ; h++)
        assert_true(isinf(pl1[h]) && pl1[h] < 0);
    for (int i = 0; i < HQ * HD; i++)
        assert_true(po1[i] == 0.0f);
}

static void test_two_blocks_merged_are_one(void **state)
{
    (void)state;
    static struct fixture f;
    setup_fixture(&f);
    struct kctx *K = kctx_cpu();
    /* keys [0, 9) and [9, 18): sequence 0 only in the first, sequence 2 only in the second, sequence 1 in both */
    const int cut = 9;
    float out[NQ * HQ * HD], lse[NQ * HQ], po[NQ * HQ * HD], plse[NQ * HQ];
    k_attention_block_forward(K, out, lse, f.lq, f.k, f.v, f.last_seq, f.seq, NQ, cut, HQ, HKV, HD);
    k_attention_block_forward(K, po, plse, f.lq, f.k + cut * HKV * HD, f.v + cut * HKV * HD, f.last_seq, f.seq + cut,
                              NQ, N - cut, HQ, HKV, HD);
    k_attention_merge(K, out, lse, po, plse, NQ, HQ, HD);
    near("merged out", out, f.lout, NQ * HQ * HD, 1e-5);
    near("merged lse", lse, f.llse, NQ * HQ, 1e-5);
}

static void test_block_backward_is_the_last_rows_gradient(void **state)
{
    (void)state;
    static struct fixture f;
    setup_fixture(&f);
    struct kctx *K = kctx_cpu();
    uint64_t s = 7;
    static float dout[N * HQ * HD], dq[N * HQ * HD], dk[N * HKV * HD], dv[N * HKV * HD];
    float ldout[NQ * HQ * HD];
    tk_fill(ldout, NQ * HQ * HD, &s, -1, 1);
    memset(dout, 0, sizeof dout);
    for (int b = 0; b < B; b++)
        memcpy(dout + (cu[b + 1] - 1) * HQ * HD, ldout + b * HQ * HD, sizeof(float) * HQ * HD);
    memset(dq, 0, sizeof dq), memset(dk, 0, sizeof dk), memset(dv, 0, sizeof dv);
    k_attention_backward(K, dq, dk, dv, dout, f.out, f.lse, f.q, f.k, f.v, cu, NULL, B, HQ, HKV, HD);
    /* the block's: accumulated onto a base of 0.5 */
    float drow[NQ * HQ], bdq[NQ * HQ * HD], bdk[N * HKV * HD], bdv[N * HKV * HD];
    k_attention_drow(K, drow, ldout, f.lout, NQ, HQ, HD);
    for (int e = 0; e < NQ * HQ; e++) {
        double d = 0;
        for (int i = 0; i < HD; i++)
            d += (double)ldout[e * HD + i] * f.lout[e * HD + i];
        assert_true(fabs(drow[e] - d) <= 1e-6 * (1 + fabs(d)));
    }
    tk_set(bdq, NQ * HQ * HD, 0.5f), tk_set(bdk, N * HKV * HD, 0.5f), tk_set(bdv, N * HKV * HD, 0.5f);
    k_attention_block_backward(K, bdq, bdk, bdv, ldout, f.llse, drow, f.lq, f.k, f.v, f.last_seq, f.seq, NQ, N, HQ, HKV,
                               HD);
    float want_dq[NQ * HQ * HD], want_dk[N * HKV * HD], want_dv[N * HKV * HD];
    for (int b = 0; b < B; b++)
        for (int i = 0; i < HQ * HD; i++)
            want_dq[b * HQ * HD + i] = dq[(cu[b + 1] - 1) * HQ * HD + i] + 0.5f;
    for (int i = 0; i < N * HKV * HD; i++)
        want_dk[i] = dk[i] + 0.5f, want_dv[i] = dv[i] + 0.5f;
    near("dq", bdq, want_dq, NQ * HQ * HD, 1e-5);
    near("dk", bdk, want_dk, N * HKV * HD, 1e-5);
    near("dv", bdv, want_dv, N * HKV * HD, 1e-5);
    double mag = 0;
    for (int i = 0; i < N * HKV * HD; i++)
        mag += fabs(dk[i]) + fabs(dv[i]);
    assert_true(mag > 1e-3); /* a check that could fail */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_forward_is_the_last_rows_attention),
        cmocka_unit_test(test_two_blocks_merged_are_one),
        cmocka_unit_test(test_block_backward_is_the_last_rows_gradient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
