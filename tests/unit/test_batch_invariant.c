/* Batch-invariant mode's kernels (k_set_batch_invariant, docs/training.md): each row's result is the same bits
 * whatever the batch around it, and right against a double-precision reference.
 *  - linear_forward_bi on every ISA path this CPU runs: a row alone, in a batch of 37 and at row 200 of a batch of
 *    300 (across the row blocks) gives the same bits; a block of columns read in place (ldx, ldw) the same bits as
 *    the block copied out; every output within 1e-5 of the double loop. The backend's linear forward (with bias) in
 *    the mode is that kernel, for any M.
 *  - attention: the training forward over a whole sequence, the cached prefill of it and decode steps one token at
 *    a time give every query row the same bits, and the same log-sum-exp; within 1e-5 of a double softmax.
 *  - the LM head: the trainer's chunked log-probs (lmhead_logprob_forward) equal, bit for bit, the sampler's
 *    (k_sample through the CPU back-end) for the sampled tokens, at temperature 0.7, with chunks of 3 and of 64
 *    rows; and within 1e-5 of a double log-softmax.
 *  - attention_rows (context parallelism in the mode): chosen rows of a packed row, in any order, against the whole
 *    row's keys give the training forward's bits and log-sum-exp; within 1e-5 of double.
 *  - the experts' down projections in the mode's fixed groups: TP 2's and TP 4's shards summed by the top of the
 *    tree give TP 1's bits; within 1e-4 of a double per-token reference.
 *  - the same under expert parallelism (each rank's experts' groups left apart, sent home and combined there group
 *    by group, simulated in one process): EP 2, EP 4 and EP 2 x TP 2 give one process's bits. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/kernels.h"
#include "test_kernel_util.h"

static int teardown(void **state)
{
    (void)state;
    k_set_batch_invariant(false);
    cpu_force_isa(CPU_ISA_AUTO);
    return 0;
}

static void check_linear_rows(void)
{
    enum { K = 1001, N = 29, BIG = 300 };
    uint64_t s = 5;
    float *x = tk_alloc((size_t)BIG * K), *W = tk_alloc((size_t)N * K);
    float *yb = tk_alloc((size_t)BIG * N), *y37 = tk_alloc(37 * N), *y1 = tk_alloc(N);
    tk_fill(x, (size_t)BIG * K, &s, -1, 1);
    tk_fill(W, (size_t)N * K, &s, -1, 1);
    linear_forward_bi(yb, x, K, W, K, BIG, K, N);
    linear_forward_bi(y37, x + (size_t)200 * K, K, W, K, 37, K, N); /* rows 200.. of the big batch */
    for (int i = 0; i < 37; i++) {
        linear_forward_bi(y1, x + (size_t)(200 + i) * K, K, W, K, 1, K, N);
        assert_memory_equal(y1, y37 + (size_t)i * N, N * sizeof(float));
        assert_memory_equal(y1, yb + (size_t)(200 + i) * N, N * sizeof(float));
        for (int o = 0; o < N; o++) {
            double r = 0;
            for (int j = 0; j < K; j++)
                r += (double)x[(size_t)(200 + i) * K + j] * W[(size_t)o * K + j];
            assert_float_equal(y1[o], r, 1e-4);
        }
    }
    /* columns [300, 550) in place against the same block copied out */
    enum { C0 = 300, KC = 250 };
    float *xc = tk_alloc(37 * KC), *Wc = tk_alloc((size_t)N * KC), *ya = tk_alloc(37 * N);
    for (int i = 0; i < 37; i++)
        memcpy(xc + (size_t)i * KC, x + (size_t)i * K + C0, KC * sizeof(float));
    for (int o = 0; o < N; o++)
        memcpy(Wc + (size_t)o * KC, W + (size_t)o * K + C0, KC * sizeof(float));
    linear_forward_bi(ya, x + C0, K, W + C0, K, 37, KC, N);
    linear_forward_bi(y37, xc, KC, Wc, KC, 37, KC, N);
    assert_memory_equal(ya, y37, 37 * N * sizeof(float));
    free(x), free(W), free(yb), free(y37), free(y1), free(xc), free(Wc), free(ya);
}

static void test_linear_rows(void **state)
{
    (void)state;
    const enum cpu_isa isas[] = {CPU_ISA_AVX512, CPU_ISA_AVX2, CPU_ISA_NONE};
    int ran = 0;
    for (int i = 0; i < 3; i++) {
        if (!cpu_force_isa(isas[i]))
            continue; /* this CPU cannot run it */
        check_linear_rows();
        ran++;
    }
    cpu_force_isa(CPU_ISA_AUTO);
    assert_true(ran >= 1);
    /* the back-end's forward in the mode, with a bias, at M 1 and 90 */
    enum { K = 70, N = 33, M = 90 };
    uint64_t s = 9;
    float *x = tk_alloc(M * K), *W = tk_alloc(N * K), *b = tk_alloc(N), *y = tk_alloc(M * N), *y1 = tk_alloc(N);
    tk_fill(x, M * K, &s, -1, 1), tk_fill(W, N * K, &s, -1, 1), tk_fill(b, N, &s, -1, 1);
    k_set_batch_invariant(true);
    struct kctx *Kc = kctx_cpu();
    k_linear_forward(Kc, y, x, W, b, M, K, N);
    for (int i = 0; i < M; i++) {
        k_linear_forward(Kc, y1, x + (size_t)i * K, W, b, 1, K, N);
        assert_memory_equal(y1, y + (size_t)i * N, N * sizeof(float));
    }
    k_set_batch_invariant(false);
    free(x), free(W), free(b), free(y), free(y1);
}

static void test_attention_rows(void **state)
{
    (void)state;
    enum { T = 70, HQ = 4, HKV = 2, HD = 16, QD = HQ * HD, KD = HKV * HD };
    uint64_t s = 13;
    float *q = tk_alloc(T * QD), *k = tk_alloc(T * KD), *v = tk_alloc(T * KD);
    float *train = tk_alloc(T * QD), *lse = tk_alloc(T * HQ), *pre = tk_alloc(T * QD), *dec = tk_alloc(QD);
    tk_fill(q, T * QD, &s, -2, 2), tk_fill(k, T * KD, &s, -2, 2), tk_fill(v, T * KD, &s, -1, 1);
    const int32_t cu[2] = {0, T};
    k_set_batch_invariant(true);
    attention_forward(train, lse, q, k, v, cu, NULL, 1, HQ, HKV, HD);
    attention_cached(pre, q, k, v, T, T, HQ, HKV, HD); /* a prefill of the whole sequence */
    assert_memory_equal(pre, train, T * QD * sizeof(float));
    for (int t = 0; t < T; t++) { /* decode steps: query t against the cache of t + 1 keys */
        attention_cached(dec, q + (size_t)t * QD, k, v, 1, t + 1, HQ, HKV, HD);
        assert_memory_equal(dec, train + (size_t)t * QD, QD * sizeof(float));
        for (int h = 0; h < HQ; h++) { /* a double softmax */
            const int g = h / (HQ / HKV);
            double sc[T], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) {
                double d = 0;
                for (int e = 0; e < HD; e++)
                    d += (double)q[(size_t)t * QD + h * HD + e] * k[(size_t)j * KD + g * HD + e];
                sc[j] = d / sqrt((double)HD);
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= t; j++)
                sum += exp(sc[j] - mx);
            assert_float_equal(lse[(size_t)t * HQ + h], mx + log(sum), 1e-5);
            for (int e = 0; e < HD; e++) {
                double o = 0;
                for (int j = 0; j <= t; j++)
                    o += exp(sc[j] - mx) / sum * v[(size_t)j * KD + g * HD + e];
                assert_float_equal(dec[h * HD + e], o, 1e-5);
            }
        }
    }
    k_set_batch_invariant(false);
    free(q), free(k), free(v), free(train), free(lse), free(pre), free(dec);
}

/* The double softmax attention of query row t (head h) over keys f..t, checked against out and lse. */
static void check_attention_ref(const float *out, float lse, const float *q, const float *k, const float *v, int f,
                                int t, int h, int hq, int hkv, int hd)
{
    const int g = h / (hq / hkv), qd = hq * hd, kd = hkv * hd;
    double sc[256] = {0}, mx = -INFINITY, sum = 0;
    assert_true(t - f < 256);
    for (int j = f; j <= t; j++) {
        double d = 0;
        for (int e = 0; e < hd; e++)
            d += (double)q[(size_t)t * qd + h * hd + e] * k[(size_t)j * kd + g * hd + e];
        sc[j - f] = d / sqrt((double)hd);
        mx = sc[j - f] > mx ? sc[j - f] : mx;
    }
    for (int j = f; j <= t; j++)
        sum += exp(sc[j - f] - mx);
    assert_float_equal(lse, mx + log(sum), 1e-5);
    for (int e = 0; e < hd; e++) {
        double o = 0;
        for (int j = f; j <= t; j++)
            o += exp(sc[j - f] - mx) / sum * v[(size_t)j * kd + g * hd + e];
        assert_float_equal(out[e], o, 1e-5);
    }
}

/* attention_rows (context parallelism's rows in the mode): chosen query rows of a row packing two sequences, in any
 * order, against the whole row's keys give the training forward's bits and log-sum-exp; within 1e-5 of double. */
static void test_attention_chosen_rows(void **state)
{
    (void)state;
    enum { T = 72, HQ = 4, HKV = 2, HD = 16, QD = HQ * HD, KD = HKV * HD, NR = 9 };
    uint64_t s = 23;
    float *q = tk_alloc(T * QD), *k = tk_alloc(T * KD), *v = tk_alloc(T * KD), *qr = tk_alloc(NR * QD);
    float *train = tk_alloc(T * QD), *lse = tk_alloc(T * HQ), *out = tk_alloc(NR * QD), *lr = tk_alloc(NR * HQ);
    tk_fill(q, T * QD, &s, -2, 2), tk_fill(k, T * KD, &s, -2, 2), tk_fill(v, T * KD, &s, -1, 1);
    const int32_t cu[3] = {0, 30, T}, rows[NR] = {69, 0, 29, 30, 31, 5, 54, 71, 18};
    int32_t kf[NR], kl[NR];
    for (int i = 0; i < NR; i++) {
        kl[i] = rows[i], kf[i] = rows[i] < cu[1] ? 0 : cu[1];
        memcpy(qr + (size_t)i * QD, q + (size_t)rows[i] * QD, QD * sizeof(float));
    }
    k_set_batch_invariant(true);
    attention_forward(train, lse, q, k, v, cu, NULL, 2, HQ, HKV, HD);
    k_attention_rows(kctx_cpu(), out, lr, qr, k, v, kf, kl, NR, HQ, HKV, HD);
    for (int i = 0; i < NR; i++) {
        assert_memory_equal(out + (size_t)i * QD, train + (size_t)rows[i] * QD, QD * sizeof(float));
        assert_memory_equal(lr + (size_t)i * HQ, lse + (size_t)rows[i] * HQ, HQ * sizeof(float));
        for (int h = 0; h < HQ; h++)
            check_attention_ref(out + (size_t)i * QD + h * HD, lr[(size_t)i * HQ + h], q, k, v, kf[i], kl[i], h, HQ,
                                HKV, HD);
    }
    k_set_batch_invariant(false);
    free(q), free(k), free(v), free(qr), free(train), free(lse), free(out), free(lr);
}

enum { MN = 11, ME = 4, MK = 2, MD = 24, MF = 32 };

/* The experts' weights of a TP rank's shard: their F columns [f0, f0 + nf) of the whole model's, into g, u, d. */
static void shard_weights(float *g, float *u, float *d, const float *Wg, const float *Wu, const float *Wd, int f0,
                          int nf)
{
    for (int e = 0; e < ME; e++)
        for (int f = 0; f < nf; f++)
            for (int i = 0; i < MD; i++) {
                g[((size_t)e * nf + f) * MD + i] = Wg[((size_t)e * MF + f0 + f) * MD + i];
                u[((size_t)e * nf + f) * MD + i] = Wu[((size_t)e * MF + f0 + f) * MD + i];
                d[((size_t)e * MD + i) * nf + f] = Wd[((size_t)e * MD + i) * MF + f0 + f];
            }
}

/* r's buffers (N, E, k, D, F set) from ar. */
static void moe_buffers(struct kmoe *r, struct karena *ar)
{
    struct karena plan;
    karena_init_counter(&plan);
    kmoe_take(&plan, r, false);
    karena_init(ar, kctx_cpu(), KMEM_ACTS, "moe groups test");
    karena_reserve(ar, plan.used, 0);
    kmoe_take(ar, r, false);
}

/* The experts' forward of tokens x routed by logits over experts whose F columns are [f0, f0 + nf) of the whole
 * model's (a TP rank's shard), in `groups` batch-invariant groups (0: off); y (MN, MD). */
static void moe_shard(float *y, const float *x, const float *logits, const float *Wg, const float *Wu, const float *Wd,
                      int f0, int nf, int groups)
{
    float *g = tk_alloc((size_t)ME * nf * MD), *u = tk_alloc((size_t)ME * nf * MD), *d = tk_alloc((size_t)ME * MD * nf);
    shard_weights(g, u, d, Wg, Wu, Wd, f0, nf);
    struct kctx *K = kctx_cpu();
    struct kmoe r = {.N = MN, .E = ME, .k = MK, .D = MD, .F = nf, .norm_topk = true};
    struct karena ar;
    moe_buffers(&r, &ar);
    k_moe_route(K, &r, logits);
    r.bi_groups = groups;
    k_moe_experts_forward(K, y, x, g, u, d, &r);
    karena_release(&ar);
    free(g), free(u), free(d);
}

/* Expert parallelism's local run of one EP rank (worker/model/moe_ep.c), in one process: the slots [lo, hi) of r's
 * permuted inputs (those of experts [e0, e0 + El)) through those experts with unit weights, the groups left apart
 * (bi_apart), each group's outputs copied home to the slots' rows (group 0 in r->ys, the others in ys_groups, as
 * the all-to-all puts them). g, u, d: the shard's weights of every expert. */
static void ep_rank_run(struct kmoe *r, int e0, int El, const float *g, const float *u, const float *d)
{
    const int lo = r->offs[e0], R = r->offs[e0 + El] - lo, G = r->bi_groups, nf = r->F;
    const size_t md = MD, nkd = (size_t)MN * MK * md, ew = (size_t)nf * md;
    struct kmoe q = {.N = R, .E = El, .k = 1, .D = MD, .F = nf, .bi_groups = G, .bi_apart = true};
    struct karena ar;
    moe_buffers(&q, &ar);
    for (int j = 0; j < R; j++) /* the received rows are in expert order already */
        q.order[j] = j, q.wt[j] = 1.0f;
    for (int e = 0; e <= El; e++)
        q.offs[e] = r->offs[e0 + e] - lo;
    float *yq = tk_alloc((size_t)G * (R > 0 ? R : 1) * md);
    k_moe_experts_forward(kctx_cpu(), yq, r->xs + (size_t)lo * md, g + e0 * ew, u + e0 * ew, d + e0 * ew, &q);
    for (int j = 0; j < G; j++)
        memcpy((j ? r->ys_groups + (size_t)(j - 1) * nkd : r->ys) + (size_t)lo * md, yq + (size_t)j * R * md,
               (size_t)R * md * sizeof(float));
    free(yq);
    karena_release(&ar);
}

/* moe_shard's forward under expert parallelism over P ranks (ME / P experts each): the slots gathered, each rank's
 * experts run apart, their groups sent home and combined there by the combine op; y (MN, MD). */
static void moe_ep_shard(float *y, const float *x, const float *logits, const float *Wg, const float *Wu,
                         const float *Wd, int f0, int nf, int groups, int P)
{
    float *g = tk_alloc((size_t)ME * nf * MD), *u = tk_alloc((size_t)ME * nf * MD), *d = tk_alloc((size_t)ME * MD * nf);
    shard_weights(g, u, d, Wg, Wu, Wd, f0, nf);
    struct kctx *K = kctx_cpu();
    struct kmoe r = {.N = MN, .E = ME, .k = MK, .D = MD, .F = nf, .norm_topk = true, .bi_groups = groups};
    struct karena ar;
    moe_buffers(&r, &ar);
    k_moe_route(K, &r, logits);
    k_moe_gather(K, r.xs, x, &r);
    r.ys_groups = tk_alloc((size_t)(groups - 1) * MN * MD * (MK + 1));
    for (int p = 0; p < P; p++)
        ep_rank_run(&r, p * (ME / P), ME / P, g, u, d);
    k_moe_combine(K, y, r.ys, &r);
    free(r.ys_groups);
    karena_release(&ar);
    free(g), free(u), free(d);
}

/* y (MN, MD) against a double reference: softmax, top 2 renormalised, SwiGLU experts. */
static void check_moe_ref(const float *y, const float *x, const float *lg, const float *Wg, const float *Wu,
                          const float *Wd)
{
    for (int t = 0; t < MN; t++) {
        double p[ME], mx = -INFINITY, z = 0;
        for (int e = 0; e < ME; e++)
            mx = lg[t * ME + e] > mx ? lg[t * ME + e] : mx;
        for (int e = 0; e < ME; e++)
            z += p[e] = exp(lg[t * ME + e] - mx);
        int a = 0, b = 1;
        for (int e = 0; e < ME; e++)
            a = p[e] > p[a] ? e : a;
        b = a == 0 ? 1 : 0;
        for (int e = 0; e < ME; e++)
            b = e != a && p[e] > p[b] ? e : b;
        const int ex[2] = {a, b};
        for (int o = 0; o < MD; o++) {
            double yo = 0;
            for (int j = 0; j < 2; j++) {
                const int e = ex[j];
                double acc = 0;
                for (int f = 0; f < MF; f++) {
                    double gg = 0, uu = 0;
                    for (int i = 0; i < MD; i++) {
                        gg += (double)Wg[((size_t)e * MF + f) * MD + i] * x[t * MD + i];
                        uu += (double)Wu[((size_t)e * MF + f) * MD + i] * x[t * MD + i];
                    }
                    acc += Wd[((size_t)e * MD + o) * MF + f] * gg / (1 + exp(-gg)) * uu;
                }
                yo += p[e] / (p[a] + p[b]) * acc;
            }
            assert_float_equal(y[t * MD + o], yo, 1e-4);
        }
    }
}

/* The experts' down projections in the mode's groups (struct kmoe bi_groups): TP 2's and TP 4's shards, each in its
 * G / TP groups, summed by the top of the tree, give TP 1's bits in G = 8 groups; within 1e-4 of double. */
static void test_moe_groups_over_tp(void **state)
{
    (void)state;
    uint64_t s = 29;
    float *x = tk_alloc(MN * MD), *lg = tk_alloc(MN * ME), *Wg = tk_alloc(ME * MF * MD), *Wu = tk_alloc(ME * MF * MD);
    float *Wd = tk_alloc(ME * MD * MF), *y1 = tk_alloc(MN * MD), *yr[4];
    tk_fill(x, MN * MD, &s, -1, 1), tk_fill(lg, MN * ME, &s, -2, 2), tk_fill(Wg, ME * MF * MD, &s, -0.5, 0.5);
    tk_fill(Wu, ME * MF * MD, &s, -0.5, 0.5), tk_fill(Wd, ME * MD * MF, &s, -0.5, 0.5);
    for (int i = 0; i < 4; i++)
        yr[i] = tk_alloc(MN * MD);
    k_set_batch_invariant(true);
    moe_shard(y1, x, lg, Wg, Wu, Wd, 0, MF, 8);
    moe_shard(yr[0], x, lg, Wg, Wu, Wd, 0, MF / 2, 4); /* TP 2: one addition */
    moe_shard(yr[1], x, lg, Wg, Wu, Wd, MF / 2, MF / 2, 4);
    for (int i = 0; i < MN * MD; i++)
        yr[0][i] += yr[1][i];
    assert_memory_equal(yr[0], y1, MN * MD * sizeof(float));
    for (int r = 0; r < 4; r++) /* TP 4: (0 + 1) + (2 + 3) */
        moe_shard(yr[r], x, lg, Wg, Wu, Wd, r * MF / 4, MF / 4, 2);
    for (int i = 0; i < MN * MD; i++)
        yr[0][i] = (yr[0][i] + yr[1][i]) + (yr[2][i] + yr[3][i]);
    assert_memory_equal(yr[0], y1, MN * MD * sizeof(float));
    check_moe_ref(y1, x, lg, Wg, Wu, Wd);
    k_set_batch_invariant(false);
    for (int i = 0; i < 4; i++)
        free(yr[i]);
    free(x), free(lg), free(Wg), free(Wu), free(Wd), free(y1);
}

/* Expert parallelism in the mode (moe_ep.c): each EP rank's experts' groups left apart and sent home, combined there
 * group by group and summed in the tree, give one process's bits: EP 2 and EP 4 (whole experts, 8 groups) and
 * EP 2 x TP 2 (each TP rank's 4 groups, the two summed by the tree's top); a token's slots on different ranks.
 * Within 1e-4 of double. */
static void test_moe_groups_over_ep(void **state)
{
    (void)state;
    uint64_t s = 31;
    float *x = tk_alloc(MN * MD), *lg = tk_alloc(MN * ME), *Wg = tk_alloc(ME * MF * MD), *Wu = tk_alloc(ME * MF * MD);
    float *Wd = tk_alloc(ME * MD * MF), *y1 = tk_alloc(MN * MD), *ye = tk_alloc(MN * MD), *yt = tk_alloc(MN * MD);
    tk_fill(x, MN * MD, &s, -1, 1), tk_fill(lg, MN * ME, &s, -2, 2), tk_fill(Wg, ME * MF * MD, &s, -0.5, 0.5);
    tk_fill(Wu, ME * MF * MD, &s, -0.5, 0.5), tk_fill(Wd, ME * MD * MF, &s, -0.5, 0.5);
    k_set_batch_invariant(true);
    moe_shard(y1, x, lg, Wg, Wu, Wd, 0, MF, 8);
    for (int P = 2; P <= 4; P *= 2) {
        moe_ep_shard(ye, x, lg, Wg, Wu, Wd, 0, MF, 8, P);
        assert_memory_equal(ye, y1, MN * MD * sizeof(float));
    }
    moe_ep_shard(ye, x, lg, Wg, Wu, Wd, 0, MF / 2, 4, 2); /* EP 2 x TP 2 */
    moe_ep_shard(yt, x, lg, Wg, Wu, Wd, MF / 2, MF / 2, 4, 2);
    for (int i = 0; i < MN * MD; i++)
        ye[i] += yt[i];
    assert_memory_equal(ye, y1, MN * MD * sizeof(float));
    check_moe_ref(ye, x, lg, Wg, Wu, Wd);
    k_set_batch_invariant(false);
    free(x), free(lg), free(Wg), free(Wu), free(Wd), free(y1), free(ye), free(yt);
}

static void test_lmhead_equals_sampler(void **state)
{
    (void)state;
    enum { N = 21, D = 48, V = 300 };
    const float temp = 0.7f;
    uint64_t s = 17;
    float *h = tk_alloc(N * D), *W = tk_alloc(V * D), *logits = tk_alloc(V), *lp = tk_alloc(N), *lp3 = tk_alloc(N);
    tk_fill(h, N * D, &s, -1, 1), tk_fill(W, V * D, &s, -1, 1);
    int32_t tok[N];
    float slp[N];
    k_set_batch_invariant(true);
    struct kctx *Kc = kctx_cpu();
    for (int i = 0; i < N; i++) { /* the sampler: one row's logits (a decode step's head) and a draw */
        k_linear_forward(Kc, logits, h + (size_t)i * D, W, NULL, 1, D, V);
        const double u = (i + 0.5) / N;
        k_sample(Kc, &tok[i], &slp[i], logits, 1, V, temp, 1.0f, 0, &u);
        double mx = -INFINITY, z = 0, l[V];
        for (int j = 0; j < V; j++) {
            double d = 0;
            for (int e = 0; e < D; e++)
                d += (double)h[(size_t)i * D + e] * W[(size_t)j * D + e];
            l[j] = d / temp;
            mx = l[j] > mx ? l[j] : mx;
        }
        for (int j = 0; j < V; j++)
            z += exp(l[j] - mx);
        assert_float_equal(slp[i], l[tok[i]] - mx - log(z), 1e-5);
    }
    lmhead_logprob_forward(lp, NULL, h, W, tok, N, D, V, temp, 64);
    lmhead_logprob_forward(lp3, NULL, h, W, tok, N, D, V, temp, 3);
    assert_memory_equal(lp, slp, N * sizeof(float));
    assert_memory_equal(lp3, slp, N * sizeof(float));
    k_set_batch_invariant(false);
    free(h), free(W), free(logits), free(lp), free(lp3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_linear_rows, teardown),
        cmocka_unit_test_teardown(test_attention_rows, teardown),
        cmocka_unit_test_teardown(test_attention_chosen_rows, teardown),
        cmocka_unit_test_teardown(test_moe_groups_over_tp, teardown),
        cmocka_unit_test_teardown(test_moe_groups_over_ep, teardown),
        cmocka_unit_test_teardown(test_lmhead_equals_sampler, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
