/* Log-probabilities and entropies through the LM head, `chunk` tokens at a time, so the (N, V)
 * logits are never held whole: each chunk's logits are one sgemm into a chunk x V buffer.
 *
 * Under tensor parallelism each rank holds a shard of the vocabulary (rows [lo, hi) of the head): a chunk's
 * row maxima are combined first (max), then the sums of exponentials, the sums of p * z (the entropy) and the
 * target logits (sum). With the whole vocabulary the combinations are the identity. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "cpu_bf16.h"
#include "cpu_kernels.h"

static void check_args(const char *who, const int32_t *targets, int N, const struct vocab_shard *vs, float temperature,
                       int chunk)
{
    if (!(temperature > 0.0f) || chunk <= 0 || vs->V <= 0 || vs->lo < 0 || vs->hi <= vs->lo || vs->hi > vs->V)
        check_failf(__FILE__, __LINE__,
                    "%s: need temperature > 0, chunk > 0, a non-empty shard [lo, hi) of V (got %g, %d, [%d, %d) of %d)",
                    who, (double)temperature, chunk, vs->lo, vs->hi, vs->V);
    for (int i = 0; i < N; i++)
        if (targets[i] < 0 || targets[i] >= vs->V)
            check_failf(__FILE__, __LINE__, "%s: targets[%d] = %d outside vocabulary [0, %d)", who, i, (int)targets[i],
                        vs->V);
}

/* The chunk's logits and exponentials, 2 x chunk x V floats (25 MB for 64 tokens of a 49k vocabulary): kept from
 * call to call, per thread, growing only. Allocated per call they came back from the kernel as fresh pages every
 * time (page faults and zeroing were about 10% of a training step). */
static _Thread_local float *tl_scratch;
static _Thread_local size_t tl_scratch_n;

static float *scratch_floats(size_t n)
{
    if (n > tl_scratch_n) {
        free(tl_scratch);
        tl_scratch = xmalloc(n * sizeof(float));
        tl_scratch_n = n;
    }
    return tl_scratch;
}

/* max of x[0..n) (n >= 1) in 16 interleaved lanes, so that it runs as SIMD */
static float row_max(const float *x, int n)
{
    float m[16];
    for (int l = 0; l < 16; l++)
        m[l] = x[0];
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; l++)
            m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
    for (; j < n; j++)
        m[0] = x[j] > m[0] ? x[j] : m[0];
    float r = m[0];
    for (int l = 1; l < 16; l++)
        r = m[l] > r ? m[l] : r;
    return r;
}

/* ---- the head's three products: fp32 (OpenBLAS), or BF16 operands with fp32 accumulation (a BF16 context: the
 * head is a quarter of SmolLM2's forward+backward FLOPs). In BF16 the weights are rounded once per call, not per
 * chunk, and each chunk's activations and logit gradients as they come. */

/* per thread, growing only: the rounded weights (Vl, D), a chunk's rounded rows (h or dz, c x max(D, Vl)) and its
 * dz^T (Vl, c) */
static _Thread_local struct bf16_scratch tl_wb, tl_ab, tl_tb;

struct head {
    const float *W;
    const uint16_t *Wb; /* NULL: fp32 products */
    int D, Vl;
};

static struct head head_of(const float *W, int D, int Vl, bool bf16)
{
    struct head hd = {.W = W, .D = D, .Vl = Vl};
    if (bf16) {
        uint16_t *wb = bf16_scratch(&tl_wb, (size_t)Vl * D);
        bf16_round(wb, W, (size_t)Vl * D);
        hd.Wb = wb;
    }
    return hd;
}

/* logits (c, Vl) = h_chunk W^T / temperature */
static void chunk_logits(float *z, const float *h, const struct head *hd, int c, float temperature)
{
    const int D = hd->D, Vl = hd->Vl;
    if (!hd->Wb) {
        cpu_sgemm(false, true, c, Vl, D, 1.0f / temperature, h, D, hd->W, D, 0.0f, z, Vl);
        return;
    }
    uint16_t *hb = bf16_scratch(&tl_ab, (size_t)c * D);
    bf16_round(hb, h, (size_t)c * D);
    bf16_gemm(z, hb, hd->Wb, c, Vl, D, true, false);
    if (temperature != 1.0f)
        vec_scale(z, 1.0f / temperature, (size_t)c * Vl);
}

/* dh (c, D) += dz (c, Vl) W (Vl, D) and dW (Vl, D) += dz^T (Vl, c) h_chunk (c, D), either NULL */
static void chunk_grads(float *dh, float *dW, const float *dz, const float *hc, const struct head *hd, int c)
{
    const int D = hd->D, Vl = hd->Vl;
    if (!hd->Wb) {
        if (dh)
            cpu_sgemm(false, false, c, D, Vl, 1.0f, dz, Vl, hd->W, D, 1.0f, dh, D);
        if (dW)
            cpu_sgemm(true, false, Vl, D, c, 1.0f, dz, Vl, hc, D, 1.0f, dW, D);
        return;
    }
    uint16_t *ab = bf16_scratch(&tl_ab, (size_t)c * (D > Vl ? D : Vl));
    if (dh) {
        bf16_round(ab, dz, (size_t)c * Vl);
        bf16_gemm(dh, ab, hd->Wb, c, D, Vl, false, true);
    }
    if (dW) {
        uint16_t *tb = bf16_scratch(&tl_tb, (size_t)Vl * c);
        bf16_round_transpose(tb, dz, c, Vl);
        bf16_round(ab, hc, (size_t)c * D);
        bf16_gemm(dW, tb, ab, Vl, D, c, false, true);
    }
}

/* Per-token softmax statistics of a chunk of c rows of this shard's logits z (c, Vl), combined over the shards:
 * st[i] the row maximum M, st[c + i] sum_j exp(z_ij - M), st[2c + i] sum_j exp(z_ij - M) (z_ij - M), st[3c + i]
 * the target's logit, and with vs->sum_pi_sq st[4c + i] sum_j exp(z_ij - M)^2. e gets exp(z - M) of every element
 * (c, Vl). */
static void chunk_stats(const float *z, float *e, const int32_t *targets, int c, const struct vocab_shard *vs,
                        double *st)
{
    const int Vl = vs->hi - vs->lo;
    for (int i = 0; i < c; i++) {
        st[i] = row_max(z + (size_t)i * Vl, Vl);
    }
    if (vs->reduce)
        vs->reduce(vs->ud, st, c, true);
    for (int i = 0; i < c; i++) {
        const float *zi = z + (size_t)i * Vl;
        float *ei = e + (size_t)i * Vl;
        const float m = (float)st[i];
        vec_exp_shifted(ei, zi, (size_t)Vl, m);
        /* sums in double, in 8 interleaved partial sums (SIMD lanes) */
        double as[8] = {0, 0, 0, 0, 0, 0, 0, 0}, az[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int j = 0;
        for (; j + 8 <= Vl; j += 8)
            for (int l = 0; l < 8; l++) {
                as[l] += ei[j + l];
                az[l] += (double)ei[j + l] * (zi[j + l] - m);
            }
        for (; j < Vl; j++) {
            as[j & 7] += ei[j];
            az[j & 7] += (double)ei[j] * (zi[j] - m);
        }
        double sum = 0.0, sz = 0.0;
        for (int l = 0; l < 8; l++)
            sum += as[l], sz += az[l];
        const int t = targets[i] - vs->lo;
        st[c + i] = sum;
        st[2 * c + i] = sz;
        st[3 * c + i] = t >= 0 && t < Vl ? zi[t] : 0.0;
        if (vs->sum_pi_sq) {
            double a2[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s2 = 0.0;
            for (j = 0; j < Vl; j++)
                a2[j & 7] += (double)ei[j] * ei[j];
            for (int l = 0; l < 8; l++)
                s2 += a2[l];
            st[4 * c + i] = s2;
        }
    }
    if (vs->reduce)
        vs->reduce(vs->ud, st + c, (vs->sum_pi_sq ? 4 : 3) * c, false);
}

/* per thread, growing only: logprob_row_bi's row */
static _Thread_local float *tl_bi;
static _Thread_local size_t tl_bi_n;

float logprob_row_bi(const float *logits, int V, float temperature, int tok)
{
    if (V > 0 && (size_t)V > tl_bi_n) {
        free(tl_bi);
        tl_bi = xmalloc((size_t)V * sizeof(float));
        tl_bi_n = (size_t)V;
    }
    const float inv = 1.0f / (temperature > 0 ? temperature : 1.0f), mx = row_max(logits, V);
    float *z = tl_bi;
    for (int j = 0; j < V; j++)
        z[j] = (logits[j] - mx) * inv;
    vec_exp_shifted(z, z, (size_t)V, 0.0f);
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int j = 0;
    for (; j + 8 <= V; j += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += z[j + l];
    for (; j < V; j++)
        acc[j & 7] += z[j];
    const double sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    return (float)((double)((logits[tok] - mx) * inv) - log(sum)); // cppcheck-suppress invalidFunctionArg
}

static void forward_shard(float *logp, float *entropy, const float *h, const float *W, const int32_t *targets, int N,
                          int D, const struct vocab_shard *vs, float temperature, int chunk, bool bf16)
{
    check_args("lmhead_logprob_forward", targets, N, vs, temperature, chunk);
    if (N <= 0)
        return;
    const int Vl = vs->hi - vs->lo, cmax = chunk < N ? chunk : N;
    /* batch-invariant mode, the whole vocabulary here: the logits through the fixed-order product, unscaled, and
     * each token's log-prob by the sampler's function of its row (the entropies as usual, from the scaled row) */
    const bool bi = k_batch_invariant() && ((!vs->reduce && Vl == vs->V) || (vs->gather && vs->shards > 1));
    float *whole = NULL, *mine = NULL, *all = NULL; /* under TP: the chunk's rows of every shard, gathered */
    const int per = vs->shards > 1 ? (vs->V + vs->shards - 1) / vs->shards : 0;
    if (bi && vs->gather && vs->shards > 1) {
        whole = xmalloc((size_t)cmax * vs->V * sizeof(float));
        mine = xmalloc((size_t)cmax * per * sizeof(float));
        all = xmalloc((size_t)vs->shards * cmax * per * sizeof(float));
    }
    const struct head hd = head_of(W, D, Vl, bf16 && !bi);
    float *z = scratch_floats(2 * (size_t)cmax * Vl), *e = z + (size_t)cmax * Vl;
    double *st = xmalloc(sizeof(double) * 5 * (size_t)cmax);
    for (int t0 = 0; t0 < N; t0 += cmax) {
        int c = N - t0 < cmax ? N - t0 : cmax;
        float *zc = vs->keep ? vs->keep + (size_t)t0 * Vl : z; /* the same product, kept for the backward */
        if (bi) {
            linear_forward_bi(zc, h + (size_t)t0 * D, D, W, D, c, D, Vl);
            if (whole) { /* every shard's logits of the chunk's rows, whole rows again */
                for (int i = 0; i < c; i++) {
                    memcpy(mine + (size_t)i * per, zc + (size_t)i * Vl, (size_t)Vl * sizeof(float));
                    memset(mine + (size_t)i * per + Vl, 0, (size_t)(per - Vl) * sizeof(float));
                }
                vs->gather(vs->ud, mine, all, (size_t)c * per);
                for (int r = 0; r < vs->shards; r++) {
                    const int lo = (int)((int64_t)vs->V * r / vs->shards),
                              hi = (int)((int64_t)vs->V * (r + 1) / vs->shards);
                    for (int i = 0; i < c; i++)
                        memcpy(whole + (size_t)i * vs->V + lo, all + ((size_t)r * c + i) * per,
                               (size_t)(hi - lo) * sizeof(float));
                }
            }
            for (int i = 0; i < c; i++)
                logp[t0 + i] = whole ? logprob_row_bi(whole + (size_t)i * vs->V, vs->V, temperature, targets[t0 + i])
                                     : logprob_row_bi(zc + (size_t)i * Vl, Vl, temperature, targets[t0 + i]);
            if (temperature != 1.0f)
                vec_scale(zc, 1.0f / temperature, (size_t)c * Vl);
        } else {
            chunk_logits(zc, h + (size_t)t0 * D, &hd, c, temperature);
        }
        chunk_stats(zc, e, targets + t0, c, vs, st);
        for (int i = 0; i < c; i++) {
            /* sum >= 1: the maximum contributes exp(0) */
            double logsum = log(st[c + i]); // cppcheck-suppress invalidFunctionArg
            if (!bi)
                logp[t0 + i] = (float)(st[3 * c + i] - (st[i] + logsum));
            if (entropy && vs->sum_pi_sq) /* sum p^2 = sum exp(z - M)^2 / (sum exp(z - M))^2 */
                entropy[t0 + i] = (float)(st[4 * c + i] / (st[c + i] * st[c + i]));
            else if (entropy) /* H = -sum p (z - lse) = log(sum) - sum p (z - M) */
                entropy[t0 + i] = (float)(logsum - st[2 * c + i] / st[c + i]);
        }
    }
    free(st);
    free(whole), free(mine), free(all);
}

static void backward_shard(float *dh, float *dW, const float *dlogp, const float *dentropy, const float *h,
                           const float *W, const int32_t *targets, int N, int D, const struct vocab_shard *vs,
                           float temperature, int chunk, bool bf16)
{
    check_args("lmhead_logprob_backward", targets, N, vs, temperature, chunk);
    if (N <= 0 || (!dh && !dW))
        return;
    const int Vl = vs->hi - vs->lo, cmax = chunk < N ? chunk : N;
    const struct head hd = head_of(W, D, Vl, bf16);
    float *z = scratch_floats(2 * (size_t)cmax * Vl), *e = z + (size_t)cmax * Vl;
    double *st = xmalloc(sizeof(double) * 5 * (size_t)cmax);
    double inv_t = 1.0 / temperature;
    for (int t0 = 0; t0 < N; t0 += cmax) {
        int c = N - t0 < cmax ? N - t0 : cmax;
        const float *hc = h + (size_t)t0 * D;
        if (vs->keep) /* the forward's logits: the same bits as recomputing them */
            z = vs->keep + (size_t)t0 * Vl;
        else
            chunk_logits(z, hc, &hd, c, temperature);
        chunk_stats(z, e, targets + t0, c, vs, st);
        /* turn each logit row into dL/d(h W^T): with p = softmax(z),
         * dlogp/dz_j = 1[j = t] - p_j, dH/dz_j = -p_j (log p_j + H), and dz/d(hW^T) = 1/temperature */
        for (int i = 0; i < c; i++) {
            float *zi = z + (size_t)i * Vl;
            const float *ei = e + (size_t)i * Vl;
            double gl = dlogp[t0 + i], ge = dentropy ? dentropy[t0 + i] : 0.0;
            double logsum = log(st[c + i]); // cppcheck-suppress invalidFunctionArg
            double lse = st[i] + logsum, H = logsum - st[2 * c + i] / st[c + i];
            const float pscale = (float)(1.0 / st[c + i]);
            const float a = (float)(-gl * inv_t), b = (float)(-ge * inv_t), lse_f = (float)lse, Hf = (float)H;
            for (int j = 0; j < Vl; j++) {
                float p = ei[j] * pscale;
                zi[j] = a * p + b * p * (zi[j] - lse_f + Hf);
            }
            const int t = targets[t0 + i] - vs->lo;
            if (t >= 0 && t < Vl)
                zi[t] += (float)(gl * inv_t);
        }
        chunk_grads(dh ? dh + (size_t)t0 * D : NULL, dW, z, hc, &hd, c);
    }
    free(st);
}

void lmhead_logprob_forward_shard(float *logp, float *entropy, const float *h, const float *W, const int32_t *targets,
                                  int N, int D, const struct vocab_shard *vs, float temperature, int chunk)
{
    forward_shard(logp, entropy, h, W, targets, N, D, vs, temperature, chunk, false);
}

void lmhead_logprob_backward_shard(float *dh, float *dW, const float *dlogp, const float *dentropy, const float *h,
                                   const float *W, const int32_t *targets, int N, int D, const struct vocab_shard *vs,
                                   float temperature, int chunk)
{
    backward_shard(dh, dW, dlogp, dentropy, h, W, targets, N, D, vs, temperature, chunk, false);
}

void lmhead_logprob_forward_shard_bf16(float *logp, float *entropy, const float *h, const float *W,
                                       const int32_t *targets, int N, int D, const struct vocab_shard *vs,
                                       float temperature, int chunk)
{
    forward_shard(logp, entropy, h, W, targets, N, D, vs, temperature, chunk, true);
}

void lmhead_logprob_backward_shard_bf16(float *dh, float *dW, const float *dlogp, const float *dentropy, const float *h,
                                        const float *W, const int32_t *targets, int N, int D,
                                        const struct vocab_shard *vs, float temperature, int chunk)
{
    backward_shard(dh, dW, dlogp, dentropy, h, W, targets, N, D, vs, temperature, chunk, true);
}

void lmhead_logprob_forward(float *logp, float *entropy, const float *h, const float *W, const int32_t *targets, int N,
                            int D, int V, float temperature, int chunk)
{
    const struct vocab_shard whole = {.lo = 0, .hi = V, .V = V};
    lmhead_logprob_forward_shard(logp, entropy, h, W, targets, N, D, &whole, temperature, chunk);
}

void lmhead_logprob_backward(float *dh, float *dW, const float *dlogp, const float *dentropy, const float *h,
                             const float *W, const int32_t *targets, int N, int D, int V, float temperature, int chunk)
{
    const struct vocab_shard whole = {.lo = 0, .hi = V, .V = V};
    lmhead_logprob_backward_shard(dh, dW, dlogp, dentropy, h, W, targets, N, D, &whole, temperature, chunk);
}
