/* Chunked LM-head log-probabilities and entropies: forward against a naive full log_softmax in
 * double, results independent of the chunk size, backward (logp and entropy terms, temperature != 1)
 * against central finite differences, backward independent of the chunk size, the backward from the
 * forward's kept logits equal to recomputing them, and the sum of squared probabilities (verl's sum_pi_squared). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "test_kernel_util.h"

enum { N = 5, D = 6, V = 11 };
static const int32_t targets[N] = {3, 0, 10, 3, 7};

struct ctx {
    float *h, *W, *gl, *ge; /* ge may be NULL: loss without the entropy term */
    float temperature;
};

static void init(struct ctx *c, float *h, float *W, float *gl, float *ge, float temperature, uint64_t seed)
{
    uint64_t s = seed;
    tk_fill(h, N * D, &s, -1.5f, 1.5f);
    tk_fill(W, V * D, &s, -1.5f, 1.5f);
    tk_fill(gl, N, &s, -1, 1);
    if (ge)
        tk_fill(ge, N, &s, -1, 1);
    *c = (struct ctx){h, W, gl, ge, temperature};
}

static void naive(double *logp, double *ent, const float *h, const float *W, float temperature)
{
    for (int i = 0; i < N; i++) {
        double z[V], m = -INFINITY, sum = 0, H = 0;
        for (int j = 0; j < V; j++) {
            z[j] = 0;
            for (int e = 0; e < D; e++)
                z[j] += (double)h[i * D + e] * W[j * D + e];
            z[j] /= temperature;
            m = z[j] > m ? z[j] : m;
        }
        for (int j = 0; j < V; j++)
            sum += exp(z[j] - m);
        double lse = m + log(sum);
        for (int j = 0; j < V; j++)
            H -= exp(z[j] - lse) * (z[j] - lse);
        logp[i] = z[targets[i]] - lse;
        ent[i] = H;
    }
}

static void test_forward_matches_naive_any_chunk(void **state)
{
    (void)state;
    float h[N * D], W[V * D], gl[N];
    struct ctx c;
    for (int t = 0; t < 2; t++) {
        float temperature = t ? 0.6f : 1.0f;
        init(&c, h, W, gl, NULL, temperature, 100 + (uint64_t)t);
        double rl[N], re[N];
        naive(rl, re, h, W, temperature);
        const int chunks[5] = {1, 2, 3, N, 64};
        for (int k = 0; k < 5; k++) {
            float logp[N], ent[N], logp2[N];
            lmhead_logprob_forward(logp, ent, h, W, targets, N, D, V, temperature, chunks[k]);
            lmhead_logprob_forward(logp2, NULL, h, W, targets, N, D, V, temperature, chunks[k]);
            for (int i = 0; i < N; i++) {
                if (fabs(logp[i] - rl[i]) > 1e-5 * (1 + fabs(rl[i])))
                    fail_msg("T=%g chunk %d: logp[%d] = %.7g, reference %.7g", temperature, chunks[k], i, logp[i],
                             rl[i]);
                if (fabs(ent[i] - re[i]) > 1e-5 * (1 + fabs(re[i])))
                    fail_msg("T=%g chunk %d: entropy[%d] = %.7g, reference %.7g", temperature, chunks[k], i, ent[i],
                             re[i]);
                assert_float_equal(logp2[i], logp[i], 0.0);
                assert_true(logp[i] <= 0.0f && ent[i] >= 0.0f && ent[i] <= log((double)V) + 1e-5);
            }
        }
    }
}

static void test_forward_extreme_logits_finite(void **state)
{
    (void)state;
    /* logits around +-500: a naive exp would overflow */
    float h[N * D], W[V * D], gl[N], logp[N], ent[N];
    struct ctx c;
    init(&c, h, W, gl, NULL, 1.0f, 7);
    for (int i = 0; i < N * D; i++)
        h[i] *= 100.0f;
    lmhead_logprob_forward(logp, ent, h, W, targets, N, D, V, 1.0f, 2);
    for (int i = 0; i < N; i++)
        assert_true(isfinite(logp[i]) && isfinite(ent[i]) && logp[i] <= 0.0f && ent[i] >= 0.0f);
}

static double loss(void *p)
{
    struct ctx *c = p;
    float logp[N], ent[N];
    lmhead_logprob_forward(logp, ent, c->h, c->W, targets, N, D, V, c->temperature, 2);
    return tk_dot(logp, c->gl, N) + (c->ge ? tk_dot(ent, c->ge, N) : 0.0);
}

static void run_fd(float temperature, int with_entropy, int chunk, uint64_t seed)
{
    float h[N * D], W[V * D], gl[N], ge[N], dh[N * D], dW[V * D];
    struct ctx c;
    init(&c, h, W, gl, with_entropy ? ge : NULL, temperature, seed);
    tk_set(dh, N * D, 0.3f);
    tk_set(dW, V * D, 0.3f);
    lmhead_logprob_backward(dh, dW, gl, with_entropy ? ge : NULL, h, W, targets, N, D, V, temperature, chunk);
    tk_fd_check("dh", h, N * D, NULL, 0, dh, 0.3f, loss, &c, 2e-3f, 3e-3);
    tk_fd_check("dW", W, V * D, NULL, 0, dW, 0.3f, loss, &c, 2e-3f, 3e-3);
}

static void test_backward_fd_logp(void **state)
{
    (void)state;
    run_fd(1.0f, 0, 2, 201);
}

static void test_backward_fd_logp_and_entropy_temperature(void **state)
{
    (void)state;
    run_fd(0.7f, 1, 3, 202);
    run_fd(1.6f, 1, 1, 203);
}

static void test_backward_independent_of_chunk(void **state)
{
    (void)state;
    float h[N * D], W[V * D], gl[N], ge[N];
    struct ctx c;
    init(&c, h, W, gl, ge, 0.8f, 300);
    float dh_ref[N * D] = {0}, dW_ref[V * D] = {0};
    lmhead_logprob_backward(dh_ref, dW_ref, gl, ge, h, W, targets, N, D, V, 0.8f, N);
    const int chunks[3] = {1, 2, 100};
    for (int k = 0; k < 3; k++) {
        float dh[N * D] = {0}, dW[V * D] = {0}, dh_only[N * D] = {0};
        lmhead_logprob_backward(dh, dW, gl, ge, h, W, targets, N, D, V, 0.8f, chunks[k]);
        lmhead_logprob_backward(dh_only, NULL, gl, ge, h, W, targets, N, D, V, 0.8f, chunks[k]);
        for (int i = 0; i < N * D; i++) {
            assert_float_equal(dh[i], dh_ref[i], 1e-5);
            assert_float_equal(dh_only[i], dh[i], 0.0);
        }
        for (int i = 0; i < V * D; i++)
            assert_float_equal(dW[i], dW_ref[i], 1e-5);
    }
}

/* With the logits kept (vocab_shard.keep) the forward gives the same log-probs and entropies, and the backward
 * from the kept logits the same gradients, bit for bit, as recomputing them; the shard's halves too. */
static void test_backward_from_kept_logits(void **state)
{
    (void)state;
    float h[N * D], W[V * D], gl[N], ge[N];
    struct ctx c;
    init(&c, h, W, gl, ge, 0.7f, 400);
    const int chunks[3] = {1, 2, 100};
    const struct vocab_shard parts[2] = {{.lo = 0, .hi = V, .V = V}, {.lo = 4, .hi = V, .V = V}};
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 3; k++) {
            struct vocab_shard vs = parts[p];
            const int Vl = vs.hi - vs.lo;
            const float *Ws = W + (size_t)vs.lo * D;
            float lp[N], en[N], lp2[N], en2[N], keep[N * V];
            float dh[N * D] = {0}, dW[V * D] = {0}, dh2[N * D] = {0}, dW2[V * D] = {0};
            lmhead_logprob_forward_shard(lp, en, h, Ws, targets, N, D, &vs, 0.7f, chunks[k]);
            lmhead_logprob_backward_shard(dh, dW, gl, ge, h, Ws, targets, N, D, &vs, 0.7f, chunks[k]);
            vs.keep = keep;
            lmhead_logprob_forward_shard(lp2, en2, h, Ws, targets, N, D, &vs, 0.7f, chunks[k]);
            lmhead_logprob_backward_shard(dh2, dW2, gl, ge, h, Ws, targets, N, D, &vs, 0.7f, chunks[k]);
            assert_memory_equal(lp, lp2, sizeof lp);
            assert_memory_equal(en, en2, sizeof en);
            assert_memory_equal(dh, dh2, sizeof dh);
            assert_memory_equal(dW, dW2, sizeof(float) * (size_t)Vl * D);
        }
}

/* vocab_shard.sum_pi_sq: the entropy output gets sum_j p_j^2 at the temperature, as verl's
 * calculate_sum_pi_squared_from_logits computes it (exp(logsumexp(2z) - 2 logsumexp(z))) in double, for every chunk
 * size; the log-probs are the same bits as without it; BF16 products agree to their rounding. */
static void test_forward_sum_pi_squared(void **state)
{
    (void)state;
    float h[N * D], W[V * D], gl[N];
    struct ctx c;
    for (int t = 0; t < 2; t++) {
        const float temperature = t ? 0.6f : 1.0f;
        init(&c, h, W, gl, NULL, temperature, 500 + (uint64_t)t);
        double want[N];
        for (int i = 0; i < N; i++) {
            double z[V], m = -INFINITY, m2 = -INFINITY, s = 0, s2 = 0;
            for (int j = 0; j < V; j++) {
                z[j] = 0;
                for (int e = 0; e < D; e++)
                    z[j] += (double)h[i * D + e] * W[j * D + e];
                z[j] /= temperature;
                m = z[j] > m ? z[j] : m;
                m2 = 2 * z[j] > m2 ? 2 * z[j] : m2;
            }
            for (int j = 0; j < V; j++)
                s += exp(z[j] - m), s2 += exp(2 * z[j] - m2);
            want[i] = exp((m2 + log(s2)) - 2 * (m + log(s)));
        }
        const struct vocab_shard whole = {.lo = 0, .hi = V, .V = V}, sq = {.lo = 0, .hi = V, .V = V, .sum_pi_sq = true};
        const int chunks[4] = {1, 2, N, 64};
        for (int k = 0; k < 4; k++) {
            float lp[N], ent[N], lp2[N], spp[N], lpb[N], sppb[N];
            lmhead_logprob_forward_shard(lp, ent, h, W, targets, N, D, &whole, temperature, chunks[k]);
            lmhead_logprob_forward_shard(lp2, spp, h, W, targets, N, D, &sq, temperature, chunks[k]);
            lmhead_logprob_forward_shard_bf16(lpb, sppb, h, W, targets, N, D, &sq, temperature, chunks[k]);
            assert_memory_equal(lp, lp2, sizeof lp);
            for (int i = 0; i < N; i++) {
                if (fabs(spp[i] - want[i]) > 1e-6 * want[i])
                    fail_msg("T=%g chunk %d: sum_pi_sq[%d] = %.9g, reference %.9g", temperature, chunks[k], i, spp[i],
                             want[i]);
                assert_true(spp[i] > 1.0 / V && spp[i] <= 1.0f && spp[i] >= expf(lp[i]) * expf(lp[i]));
                assert_true(fabs(sppb[i] - want[i]) < 0.05 * want[i]);
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_matches_naive_any_chunk),
        cmocka_unit_test(test_forward_extreme_logits_finite),
        cmocka_unit_test(test_backward_fd_logp),
        cmocka_unit_test(test_backward_fd_logp_and_entropy_temperature),
        cmocka_unit_test(test_backward_independent_of_chunk),
        cmocka_unit_test(test_backward_from_kept_logits),
        cmocka_unit_test(test_forward_sum_pi_squared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
