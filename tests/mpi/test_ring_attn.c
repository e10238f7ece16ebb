/* Ring attention (worker/model/ring_attn.c) under mpirun, the world as one context-parallel group of C ranks: for
 * rows of one sequence and packed rows, GQA and plain heads, short rows and a row of 2,048 tokens, every rank's
 * output, log-sum-exp and dQ, dK, dV equal the single-rank attention's (the kernel's, over the whole row) and a
 * direct double-precision attention's written here, within 1e-5 relative; the bytes each rank sends around the
 * ring equal the formula (comm's traffic counters); every rank scores the same number of pairs and chunk blocks
 * (the front-and-back layout's balance); a row that cannot be cut, bad heads and bad offsets are refused naming
 * the value. Exit 0 only if every rank saw every value right. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test_util.h"
#include "common/check.h"
#include "common/check_mpi.h"
#include "common/log.h"
#include "kernels/cpu/cpu_kernels.h" /* kops_cpu */
#include "kernels/kernels.h"
#include "worker/comm/comm.h"
#include "worker/model/ring_attn.h"

static int g_bad;

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            g_bad++;                                                                                                   \
            log_error("test", __VA_ARGS__);                                                                            \
        }                                                                                                              \
    } while (0)

static uint64_t g_rng;
static float uniform(void) /* in [-1, 1) */
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}
static float *random_floats(size_t n, float scale)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = scale * uniform();
    return x;
}

/* The whole attention of one row, forward and backward, in double, straight from the definition: query t of
 * sequence b sees keys cu[b]..t; P = softmax(q k / sqrt(hd)); dP = dout v; dS = P (dP - sum_j P dP); dq = dS k /
 * sqrt(hd), dk = dS^T q / sqrt(hd), dv = P^T dout. Outputs are float, dq, dk, dv zeroed here. */
struct whole {
    float *out, *lse, *dq, *dk, *dv;
};
static void direct_attention(struct whole *w, const float *q, const float *k, const float *v, const float *dout,
                             const int32_t *cu, int B, int L, int Hq, int Hkv, int hd)
{
    const int ldq = Hq * hd, ldk = Hkv * hd;
    const double sc = 1.0 / sqrt((double)hd);
    double *P = xmalloc(sizeof(double) * (size_t)L), *dP = xmalloc(sizeof(double) * (size_t)L);
    double *dk = xcalloc((size_t)L * ldk, sizeof(double)), *dv = xcalloc((size_t)L * ldk, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int t = cu[b]; t < cu[b + 1]; t++)
            for (int h = 0; h < Hq; h++) {
                const int kh = h / (Hq / Hkv), n = t - cu[b] + 1;
                const float *qt = q + (size_t)t * ldq + h * hd, *gt = dout + (size_t)t * ldq + h * hd;
                double m = -INFINITY, z = 0;
                for (int j = 0; j < n; j++) {
                    const float *kj = k + (size_t)(cu[b] + j) * ldk + kh * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += (double)qt[d] * kj[d];
                    P[j] = s * sc;
                    m = fmax(m, P[j]);
                }
                for (int j = 0; j < n; j++)
                    z += (P[j] = exp(P[j] - m));
                double D = 0;
                for (int j = 0; j < n; j++) {
                    const float *vj = v + (size_t)(cu[b] + j) * ldk + kh * hd;
                    P[j] /= z;
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += (double)gt[d] * vj[d];
                    dP[j] = s;
                    D += P[j] * s;
                }
                w->lse[(size_t)t * Hq + h] = (float)(m + log(z));
                for (int d = 0; d < hd; d++) {
                    double o = 0, g = 0;
                    for (int j = 0; j < n; j++) {
                        const size_t kj = (size_t)(cu[b] + j) * ldk + kh * hd + d;
                        o += P[j] * v[kj];
                        g += P[j] * (dP[j] - D) * k[kj];
                    }
                    w->out[(size_t)t * ldq + h * hd + d] = (float)o;
                    w->dq[(size_t)t * ldq + h * hd + d] = (float)(g * sc);
                }
                for (int j = 0; j < n; j++) {
                    const size_t kj = (size_t)(cu[b] + j) * ldk + kh * hd;
                    const double ds = P[j] * (dP[j] - D);
                    for (int d = 0; d < hd; d++) {
                        dk[kj + d] += ds * sc * qt[d];
                        dv[kj + d] += P[j] * gt[d];
                    }
                }
            }
    for (size_t e = 0; e < (size_t)L * ldk; e++)
        w->dk[e] = (float)dk[e], w->dv[e] = (float)dv[e];
    free(P), free(dP), free(dk), free(dv);
}

static void whole_alloc(struct whole *w, int L, int Hq, int Hkv, int hd)
{
    w->out = xcalloc((size_t)L * Hq * hd, sizeof(float));
    w->lse = xcalloc((size_t)L * Hq, sizeof(float));
    w->dq = xcalloc((size_t)L * Hq * hd, sizeof(float));
    w->dk = xcalloc((size_t)L * Hkv * hd, sizeof(float));
    w->dv = xcalloc((size_t)L * Hkv * hd, sizeof(float));
}
static void whole_free(struct whole *w) { free(w->out), free(w->lse), free(w->dq), free(w->dk), free(w->dv); }
static void whole_bcast(struct comm *c, struct whole *w, int L, int Hq, int Hkv, int hd)
{
    comm_broadcast(c, w->out, (size_t)L * Hq * hd, COMM_F32, 0);
    comm_broadcast(c, w->lse, (size_t)L * Hq, COMM_F32, 0);
    comm_broadcast(c, w->dq, (size_t)L * Hq * hd, COMM_F32, 0);
    comm_broadcast(c, w->dk, (size_t)L * Hkv * hd, COMM_F32, 0);
    comm_broadcast(c, w->dv, (size_t)L * Hkv * hd, COMM_F32, 0);
}

/* a (this rank's rows) against this rank's rows of the whole-row tensor w, relative L2 and max-over-max */
static void expect_rows(const char *cs, const char *what, const char *against, const struct ring_attn *ra,
                        const float *a, const float *w, int width)
{
    const size_t n = (size_t)2 * ra->c * width;
    float *mine = xmalloc(n * sizeof(float));
    ring_attn_take(ra, mine, w, width);
    const double l2 = test_rel_err_l2(a, mine, n), mx = test_rel_err_max(a, mine, n);
    EXPECT(l2 <= 1e-5 && mx <= 1e-5, "%s: rank %d's %s differs from the %s: relative L2 %.3g, max %.3g (> 1e-5)", cs,
           ra->rank, what, against, l2, mx);
    free(mine);
}

/* The device path of ring attention (ring_attn.h: the blocks and merges as kernel-interface ops on the context's
 * memory, the ring staged through host buffers over an MPI group) run on a context that says CUDA but has the
 * CPU's table, so its memory is the host's: the same results as the CPU path and the whole attention within
 * 1e-5, the same bytes sent. What the CUDA back-end's ops add is checked against the CPU's by the gpu suite. */
static void check_device_path(struct comm *cp, const char *cs, int L, const int32_t *cu, int B, const int32_t *seg,
                              int S, int Hq, int Hkv, int hd, const struct ring_attn *host, const float *lq,
                              const float *lk, const float *lv, const float *lg, const struct whole *kern,
                              const struct whole *ref, double bytes)
{
    struct kctx dev = *kctx_cpu();
    dev.device = KDEV_CUDA;
    memset(&dev.mem, 0, sizeof dev.mem);
    struct ring_attn ra;
    char why[256], what[160];
    if (ring_attn_plan(&ra, &dev, cp, L, cu, B, seg, S, Hq, Hkv, hd, why, sizeof why) != 0) {
        EXPECT(0, "%s: ring_attn_plan refused the device path: %s", cs, why);
        return;
    }
    EXPECT(ra.dev && (comm_size(cp) == 1 || ra.stage[0]), "%s: the device path was not planned (staged)", cs);
    const int n = 2 * ra.c, ldq = Hq * hd, ldk = Hkv * hd;
    float *out = xmalloc(sizeof(float) * (size_t)n * ldq), *lse = xmalloc(sizeof(float) * (size_t)n * Hq);
    float *dq = xcalloc((size_t)n * ldq, sizeof(float)), *dk = xcalloc((size_t)n * ldk, sizeof(float));
    float *dv = xcalloc((size_t)n * ldk, sizeof(float));
    ring_attn_forward(&ra, out, lse, lq, lk, lv);
    ring_attn_backward(&ra, dq, dk, dv, lg, out, lse, lq, lk, lv);
    const struct {
        const char *what;
        const float *mine, *kw, *rw;
        int width;
    } t[5] = {{"output", out, kern->out, ref->out, ldq},
              {"log-sum-exp", lse, kern->lse, ref->lse, Hq},
              {"dQ", dq, kern->dq, ref->dq, ldq},
              {"dK", dk, kern->dk, ref->dk, ldk},
              {"dV", dv, kern->dv, ref->dv, ldk}};
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "device path's %s", t[i].what);
        expect_rows(cs, what, "single-rank kernel attention", host, t[i].mine, t[i].kw, t[i].width);
        expect_rows(cs, what, "direct attention", host, t[i].mine, t[i].rw, t[i].width);
    }
    EXPECT(ra.stats.sent_bytes == bytes && ra.stats.scores == host->stats.scores / 2,
           "%s: the device path sent %.0f bytes (want %.0f) and scored %llu pairs (the CPU path %llu)", cs,
           ra.stats.sent_bytes, bytes, ra.stats.scores, host->stats.scores / 2);
    free(out), free(lse), free(dq), free(dk), free(dv);
    ring_attn_free(&ra);
    EXPECT(dev.mem.allocated == 0, "%s: the device path left %zu bytes of its context allocated", cs,
           dev.mem.allocated);
}

/* One case: a row of L tokens packed as B sequences (cu), cut into S segments (seg; NULL: one), Hq over Hkv heads
 * of hd. */
static void check_case(struct comm *cp, int L, const int32_t *cu, int B, const int32_t *seg, int S, int Hq, int Hkv,
                       int hd, uint64_t seed)
{
    const int C = comm_size(cp), r = comm_rank(cp), ldq = Hq * hd, ldk = Hkv * hd;
    const int32_t whole_row[2] = {0, L};
    char cs[112];
    snprintf(cs, sizeof cs, "C=%d L=%d B=%d S=%d Hq=%d Hkv=%d hd=%d", C, L, B, seg ? S : 1, Hq, Hkv, hd);
    g_rng = seed;
    float *q = random_floats((size_t)L * ldq, 2.0f), *k = random_floats((size_t)L * ldk, 1.0f);
    float *v = random_floats((size_t)L * ldk, 1.0f), *dout = random_floats((size_t)L * ldq, 1.0f);

    /* the single-rank kernel attention and the direct one, on rank 0 */
    struct whole kern, ref;
    whole_alloc(&kern, L, Hq, Hkv, hd);
    whole_alloc(&ref, L, Hq, Hkv, hd);
    if (r == 0) {
        struct kctx *K = kctx_cpu();
        k_attention_forward(K, kern.out, kern.lse, q, k, v, cu, NULL, B, Hq, Hkv, hd);
        k_attention_backward(K, kern.dq, kern.dk, kern.dv, dout, kern.out, kern.lse, q, k, v, cu, NULL, B, Hq, Hkv, hd);
        direct_attention(&ref, q, k, v, dout, cu, B, L, Hq, Hkv, hd);
        const size_t nq = (size_t)L * ldq, nk = (size_t)L * ldk;
        const double e[5] = {test_rel_err_l2(kern.out, ref.out, nq), test_rel_err_l2(kern.lse, ref.lse, (size_t)L * Hq),
                             test_rel_err_l2(kern.dq, ref.dq, nq), test_rel_err_l2(kern.dk, ref.dk, nk),
                             test_rel_err_l2(kern.dv, ref.dv, nk)};
        for (int i = 0; i < 5; i++)
            EXPECT(e[i] <= 1e-5, "%s: the kernel's attention differs from the direct one (tensor %d): %.3g", cs, i,
                   e[i]);
    }
    whole_bcast(cp, &kern, L, Hq, Hkv, hd);
    whole_bcast(cp, &ref, L, Hq, Hkv, hd);

    struct ring_attn ra;
    char why[256];
    if (ring_attn_plan(&ra, kctx_cpu(), cp, L, cu, B, seg, S, Hq, Hkv, hd, why, sizeof why) != 0) {
        EXPECT(0, "%s: ring_attn_plan refused: %s", cs, why);
        goto out;
    }
    const int n = 2 * ra.c;
    EXPECT(ra.c * 2 * C == L, "%s: %d local rows", cs, n);
    if (!seg)
        seg = whole_row, S = 1;
    for (int g = 0, i = 0; g < S; g++) { /* rank r holds chunks r and 2C-1-r of each segment, in order */
        const int cg = (seg[g + 1] - seg[g]) / (2 * C);
        for (int t = 0; t < 2 * cg; t++, i++) {
            const int chunk = t < cg ? r : 2 * C - 1 - r;
            EXPECT(ring_attn_row(&ra, i) == seg[g] + chunk * cg + t % cg, "%s: local row %d is token %d", cs, i,
                   ring_attn_row(&ra, i));
        }
    }
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)L), *lpos = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int b = 0; b < B; b++) /* positions within each sequence, as a packed batch has them */
        for (int t = cu[b]; t < cu[b + 1]; t++)
            pos[t] = t - cu[b];
    ring_attn_take_i32(&ra, lpos, pos);
    for (int i = 0; i < n; i++)
        EXPECT(lpos[i] == pos[ring_attn_row(&ra, i)], "%s: local row %d has position %d", cs, i, lpos[i]);
    free(pos), free(lpos);
    float *lq = xmalloc(sizeof(float) * (size_t)n * ldq), *lk = xmalloc(sizeof(float) * (size_t)n * ldk);
    float *lv = xmalloc(sizeof(float) * (size_t)n * ldk), *lg = xmalloc(sizeof(float) * (size_t)n * ldq);
    ring_attn_take(&ra, lq, q, ldq);
    ring_attn_take(&ra, lk, k, ldk);
    ring_attn_take(&ra, lv, v, ldk);
    ring_attn_take(&ra, lg, dout, ldq);
    float *out = xmalloc(sizeof(float) * (size_t)n * ldq), *lse = xmalloc(sizeof(float) * (size_t)n * Hq);
    float *dq = xcalloc((size_t)n * ldq, sizeof(float)), *dk = xcalloc((size_t)n * ldk, sizeof(float));
    float *dv = xcalloc((size_t)n * ldk, sizeof(float));

    comm_traffic_reset(cp);
    ring_attn_forward(&ra, out, lse, lq, lk, lv);
    struct comm_traffic tf, tb;
    comm_traffic(cp, &tf);
    ring_attn_backward(&ra, dq, dk, dv, lg, out, lse, lq, lk, lv);
    comm_traffic(cp, &tb);

    const struct {
        const char *what;
        const float *mine, *kw, *rw;
        int width;
    } t[5] = {{"output", out, kern.out, ref.out, ldq},
              {"log-sum-exp", lse, kern.lse, ref.lse, Hq},
              {"dQ", dq, kern.dq, ref.dq, ldq},
              {"dK", dk, kern.dk, ref.dk, ldk},
              {"dV", dv, kern.dv, ref.dv, ldk}};
    for (int i = 0; i < 5; i++) {
        expect_rows(cs, t[i].what, "single-rank kernel attention", &ra, t[i].mine, t[i].kw, t[i].width);
        expect_rows(cs, t[i].what, "direct attention", &ra, t[i].mine, t[i].rw, t[i].width);
    }

    /* traffic: K and V of two chunks per step, C-1 steps forward; backward again and the gradients home */
    const double pair = 2.0 * (2.0 * ra.c) * Hkv * hd * 4;
    const double fwd = (C - 1) * pair, bwd = 2.0 * (C - 1) * pair;
    const double sent_f = tf.sent_f32[COMM_OP_SEND], sent_b = tb.sent_f32[COMM_OP_SEND] - sent_f;
    EXPECT(sent_f == fwd && sent_b == bwd && ra.stats.sent_bytes == fwd + bwd,
           "%s: rank %d sent %.0f bytes forward and %.0f backward (its own count %.0f), want %.0f and %.0f", cs, r,
           sent_f, sent_b, ra.stats.sent_bytes, fwd, bwd);
    EXPECT(ring_attn_bytes(C, ra.c, Hkv, hd, 0) == fwd && ring_attn_bytes(C, ra.c, Hkv, hd, 1) == bwd,
           "%s: ring_attn_bytes says %.0f and %.0f, want %.0f and %.0f", cs, ring_attn_bytes(C, ra.c, Hkv, hd, 0),
           ring_attn_bytes(C, ra.c, Hkv, hd, 1), fwd, bwd);
    EXPECT(tf.calls[COMM_OP_SEND] == (unsigned long long)(C - 1), "%s: %llu forward sendrecvs, want %d", cs,
           tf.calls[COMM_OP_SEND], C - 1);

    /* balance: every rank's unmasked pairs; one sequence per segment: the same on every rank, 2C c^2 + c and
     * 2C + 1 chunk blocks per segment of chunk c; any row: they add up to the causal pairs of its sequences */
    long long mine[2] = {(long long)ra.stats.scores, (long long)ra.stats.blocks}, *all = xmalloc(sizeof mine * C);
    comm_allgather(cp, mine, all, 2, COMM_I64);
    long long total = 0, want = 0;
    for (int p = 0; p < C; p++)
        total += all[2 * p];
    for (int b = 0; b < B; b++)
        want += (long long)(cu[b + 1] - cu[b]) * (cu[b + 1] - cu[b] + 1) / 2;
    EXPECT(total == want, "%s: the ranks scored %lld pairs in all, want %lld", cs, total, want);
    int one_each = S == B; /* each segment one sequence (none empty) */
    for (int b = 0; b < B && one_each; b++)
        one_each = cu[b] == seg[b] && cu[b + 1] == seg[b + 1];
    long long bal = 0;
    for (int g = 0; g < S; g++) {
        const long long c = (seg[g + 1] - seg[g]) / (2 * C);
        bal += 2LL * C * c * c + c;
    }
    for (int p = 0; p < C && one_each; p++)
        EXPECT(all[2 * p] == bal && all[2 * p + 1] == (2LL * C + 1) * S,
               "%s: rank %d scored %lld pairs in %lld blocks, want %lld in %lld (every rank the same)", cs, p,
               all[2 * p], all[2 * p + 1], bal, (2LL * C + 1) * S);
    if (r == 0)
        printf("%s: pairs per rank %lld (rank 0), %.0f + %.0f bytes sent per rank\n", cs, all[0], sent_f, sent_b);

    /* the same bits on 3 threads (the visiting blocks split over the CPU kernels' threads) as on one */
    float *out3 = xmalloc(sizeof(float) * (size_t)n * ldq), *lse3 = xmalloc(sizeof(float) * (size_t)n * Hq);
    float *dq3 = xcalloc((size_t)n * ldq, sizeof(float)), *dk3 = xcalloc((size_t)n * ldk, sizeof(float));
    float *dv3 = xcalloc((size_t)n * ldk, sizeof(float));
    cpu_set_threads(3);
    ring_attn_forward(&ra, out3, lse3, lq, lk, lv);
    ring_attn_backward(&ra, dq3, dk3, dv3, lg, out3, lse3, lq, lk, lv);
    cpu_set_threads(1);
    EXPECT(!memcmp(out, out3, sizeof(float) * (size_t)n * ldq) && !memcmp(lse, lse3, sizeof(float) * (size_t)n * Hq) &&
               !memcmp(dq, dq3, sizeof(float) * (size_t)n * ldq) && !memcmp(dk, dk3, sizeof(float) * (size_t)n * ldk) &&
               !memcmp(dv, dv3, sizeof(float) * (size_t)n * ldk),
           "%s: rank %d's results on 3 threads differ from those on one", cs, r);
    free(out3), free(lse3), free(dq3), free(dk3), free(dv3);
    check_device_path(cp, cs, L, cu, B, seg, S, Hq, Hkv, hd, &ra, lq, lk, lv, lg, &kern, &ref, fwd + bwd);
    free(all);
    free(lq), free(lk), free(lv), free(lg), free(out), free(lse), free(dq), free(dk), free(dv);
    ring_attn_free(&ra);
out:
    whole_free(&kern), whole_free(&ref);
    free(q), free(k), free(v), free(dout);
}

/* Layouts ring attention cannot run are refused with the value named. */
static void check_refusals(struct comm *cp)
{
    const int C = comm_size(cp);
    struct ring_attn ra;
    char why[256], num[32];
    const int L = 8 * C * 3 + 2; /* not a multiple of 2C for C >= 2 (C = 1: 2 divides it) */
    const int32_t cu[2] = {0, L}, cu_short[2] = {0, L - 3}, cu_down[4] = {0, 9, 5, 8 * C};
    if (C > 1) {
        EXPECT(ring_attn_plan(&ra, kctx_cpu(), cp, L, cu, 1, NULL, 0, 4, 2, 8, why, sizeof why) == -1,
               "row of %d accepted", L);
        snprintf(num, sizeof num, "%d", L);
        EXPECT(strstr(why, num) && strstr(why, "context parallel"), "row of %d refused as: %s", L, why);
    }
    const int32_t cu_ok[2] = {0, 8 * C};
    EXPECT(ring_attn_plan(&ra, kctx_cpu(), cp, 8 * C, cu_ok, 1, NULL, 0, 4, 3, 8, why, sizeof why) == -1 &&
               strstr(why, "4 query heads over 3 KV heads"),
           "4 heads over 3 KV heads: %s", why);
    EXPECT(ring_attn_plan(&ra, kctx_cpu(), cp, L - 2, cu_short, 1, NULL, 0, 4, 2, 8, why, sizeof why) == -1 &&
               strstr(why, "offsets"),
           "offsets short of the row: %s", why);
    EXPECT(ring_attn_plan(&ra, kctx_cpu(), cp, 8 * C, cu_down, 3, NULL, 0, 4, 2, 8, why, sizeof why) == -1 &&
               strstr(why, "cu_seqlens[2] = 5"),
           "decreasing offsets: %s", why);
    /* a device context whose back-end has no ring attention blocks (the CPU's table without them, saying CUDA) */
    struct kops no_blocks = kops_cpu;
    no_blocks.attention_block_forward = NULL;
    struct kctx cuda_like = *kctx_cpu();
    cuda_like.device = KDEV_CUDA, cuda_like.ops = &no_blocks;
    EXPECT(ring_attn_plan(&ra, &cuda_like, cp, 8 * C, cu_ok, 1, NULL, 0, 4, 2, 8, why, sizeof why) == -1 &&
               strstr(why, "attention_block"),
           "a device context without the block ops: %s", why);
    /* segments: one not a multiple of 2C, one that starts inside a sequence */
    const int32_t cu3[4] = {0, 4 * C, 6 * C, 8 * C}, seg_odd[3] = {0, 4 * C + 1, 8 * C}, seg_in[3] = {0, 2 * C, 8 * C};
    if (C > 1) {
        EXPECT(ring_attn_plan(&ra, kctx_cpu(), cp, 8 * C, cu3, 3, seg_odd, 2, 4, 2, 8, why, sizeof why) == -1 &&
                   strstr(why, "segment 0 of ") && strstr(why, "context parallel"),
               "a segment of %d tokens: %s", 4 * C + 1, why);
    }
    snprintf(num, sizeof num, "token %d", 2 * C);
    EXPECT(ring_attn_plan(&ra, kctx_cpu(), cp, 8 * C, cu3, 3, seg_in, 2, 4, 2, 8, why, sizeof why) == -1 &&
               strstr(why, num) && strstr(why, "inside a sequence"),
           "a segment starting inside a sequence: %s", why);
}

int main(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *w = comm_mpi_world();
    log_set_rank(comm_rank(w));
    const int C = comm_size(w);
    bool long_rows = true;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--short") == 0)
            long_rows = false;
        else if (strcmp(argv[i], "--deadline") == 0 && i + 1 < argc) /* the ring's sends under a deadline */
            comm_set_deadline(w, strtod(argv[++i], NULL));

    cpu_set_threads(1);
    check_refusals(w);
    /* one sequence, GQA (2 query heads per KV head) */
    const int32_t one24[2] = {0, 24};
    check_case(w, 24, one24, 1, NULL, 0, 4, 2, 8, 11);
    /* packed: sequences across chunk borders, one of a single token, an empty one; one KV head */
    const int32_t packed24[6] = {0, 5, 6, 6, 19, 24};
    check_case(w, 24, packed24, 5, NULL, 0, 2, 1, 8, 12);
    /* the shortest row: one token per chunk (8 = 2C for C = 4) */
    const int32_t packed8[3] = {0, 3, 8};
    check_case(w, 8, packed8, 2, NULL, 0, 2, 1, 4, 16);
    /* plain heads, an odd head size, two sequences */
    const int32_t two40[3] = {0, 17, 40};
    check_case(w, 40, two40, 2, NULL, 0, 3, 3, 5, 13);
    /* segments (Megatron's split of packed sequences): one per sequence, and one holding two sequences */
    const int32_t three48[4] = {0, 16, 24, 48}, seg48[3] = {0, 16, 48};
    check_case(w, 48, three48, 3, three48, 3, 4, 2, 8, 17);
    check_case(w, 48, three48, 3, seg48, 2, 2, 2, 8, 18);
    if (long_rows) {
        /* a long response: 2,048 tokens in one sequence, and packed */
        const int32_t one2k[2] = {0, 2048}, packed2k[4] = {0, 700, 1500, 2048};
        check_case(w, 2048, one2k, 1, NULL, 0, 4, 2, 16, 14);
        check_case(w, 2048, packed2k, 3, NULL, 0, 2, 1, 16, 15);
        const int32_t seq2k[4] = {0, 1024, 1536, 2048};
        check_case(w, 2048, seq2k, 3, seq2k, 3, 4, 1, 16, 19);
    }

    comm_allreduce_sum(w, &g_bad, 1, COMM_I32);
    if (comm_rank(w) == 0)
        printf("%s: ring attention over %d ranks, %d failure(s)\n", g_bad ? "FAIL" : "ok", C, g_bad);
    comm_free(w);
    MPI_Finalize();
    return g_bad ? 1 : 0;
}
