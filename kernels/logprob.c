/* Log-probabilities and entropies through the LM head, `chunk` tokens at a time, so the (N, V)
 * logits are never held whole: each chunk's logits are one sgemm into a chunk x V buffer. */
#include <cblas.h>
#include <math.h>

#include "common/check.h"
#include "kernels.h"

static void check_args(const char *who, const int32_t *targets, int N, int V, float temperature, int chunk)
{
    if (!(temperature > 0.0f) || chunk <= 0 || V <= 0)
        check_failf(__FILE__, __LINE__, "%s: need temperature > 0, chunk > 0, V > 0 (got %g, %d, %d)", who,
                    (double)temperature, chunk, V);
    for (int i = 0; i < N; i++)
        if (targets[i] < 0 || targets[i] >= V)
            check_failf(__FILE__, __LINE__, "%s: targets[%d] = %d outside vocabulary [0, %d)", who, i, (int)targets[i],
                        V);
}

/* logits (c, V) = h_chunk W^T / temperature */
static void chunk_logits(float *z, const float *h, const float *W, int c, int D, int V, float temperature)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c, V, D, 1.0f / temperature, h, D, W, D, 0.0f, z, V);
}

/* Softmax statistics of one row z (V): e[j] = exp(z_j - max) into e, returns log(sum e) + max (the
 * log-sum-exp); *inv_sum (if not NULL) gets 1 / sum e, so p_j = e_j * inv_sum; *ent (if not NULL) gets the
 * entropy lse - sum_j p_j z_j. */
static double row_softmax(const float *z, float *e, int V, double *ent, double *inv_sum)
{
    float m = z[0];
    for (int j = 1; j < V; j++)
        m = z[j] > m ? z[j] : m;
    vec_exp_shifted(e, z, (size_t)V, m);
    double sum = 0.0, sz = 0.0;
    for (int j = 0; j < V; j++) {
        sum += e[j];
        sz += (double)e[j] * (z[j] - m);
    }
    double logsum = log(sum); // cppcheck-suppress invalidFunctionArg ; sum >= 1: the maximum contributes exp(0)
    if (inv_sum)
        *inv_sum = 1.0 / sum;
    if (ent) /* H = -sum p (z - lse) = log(sum) - sum p (z - m) */
        *ent = logsum - sz / sum;
    return m + logsum;
}

void lmhead_logprob_forward(float *logp, float *entropy, const float *h, const float *W, const int32_t *targets, int N,
                            int D, int V, float temperature, int chunk)
{
    check_args("lmhead_logprob_forward", targets, N, V, temperature, chunk);
    if (N <= 0)
        return;
    int cmax = chunk < N ? chunk : N;
    float *z = xmalloc(sizeof(float) * (size_t)cmax * V), *e = xmalloc(sizeof(float) * (size_t)V);
    for (int t0 = 0; t0 < N; t0 += cmax) {
        int c = N - t0 < cmax ? N - t0 : cmax;
        chunk_logits(z, h + (size_t)t0 * D, W, c, D, V, temperature);
        for (int i = 0; i < c; i++) {
            const float *zi = z + (size_t)i * V;
            double H;
            double lse = row_softmax(zi, e, V, entropy ? &H : NULL, NULL);
            logp[t0 + i] = (float)(zi[targets[t0 + i]] - lse);
            if (entropy)
                entropy[t0 + i] = (float)H;
        }
    }
    free(z);
    free(e);
}

void lmhead_logprob_backward(float *dh, float *dW, const float *dlogp, const float *dentropy, const float *h,
                             const float *W, const int32_t *targets, int N, int D, int V, float temperature, int chunk)
{
    check_args("lmhead_logprob_backward", targets, N, V, temperature, chunk);
    if (N <= 0 || (!dh && !dW))
        return;
    int cmax = chunk < N ? chunk : N;
    float *z = xmalloc(sizeof(float) * (size_t)cmax * V), *e = xmalloc(sizeof(float) * (size_t)V);
    double inv_t = 1.0 / temperature;
    for (int t0 = 0; t0 < N; t0 += cmax) {
        int c = N - t0 < cmax ? N - t0 : cmax;
        const float *hc = h + (size_t)t0 * D;
        chunk_logits(z, hc, W, c, D, V, temperature);
        /* turn each logit row into dL/d(h W^T): with p = softmax(z),
         * dlogp/dz_j = 1[j = t] - p_j, dH/dz_j = -p_j (log p_j + H), and dz/d(hW^T) = 1/temperature */
        for (int i = 0; i < c; i++) {
            float *zi = z + (size_t)i * V;
            double gl = dlogp[t0 + i], ge = dentropy ? dentropy[t0 + i] : 0.0, H = 0.0;
            double inv_sum;
            double lse = row_softmax(zi, e, V, ge != 0.0 ? &H : NULL, &inv_sum);
            /* p_j = e_j / sum: one exp per element, done in row_softmax */
            const float pscale = (float)inv_sum;
            const float a = (float)(-gl * inv_t), b = (float)(-ge * inv_t), lse_f = (float)lse, Hf = (float)H;
            for (int j = 0; j < V; j++) {
                float p = e[j] * pscale;
                zi[j] = a * p + b * p * (zi[j] - lse_f + Hf);
            }
            zi[targets[t0 + i]] += (float)(gl * inv_t);
        }
        if (dh) /* dh (c, D) += dz (c, V) W (V, D) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, c, D, V, 1.0f, z, V, W, D, 1.0f, dh + (size_t)t0 * D,
                        D);
        if (dW) /* dW (V, D) += dz^T (V, c) h_chunk (c, D) */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, D, c, 1.0f, z, V, hc, D, 1.0f, dW, D);
    }
    free(z);
    free(e);
}
