/* Ring attention's blocks on the CPU (context parallelism): the kops entries attention_block_forward,
 * attention_block_backward, attention_merge and attention_drow (kernels.h), the reference the CUDA back-end's
 * (kernels/cuda/attention_block.cu) is checked against. Plain loops, each output element summed in a fixed order:
 * worker/model/ring_attn.c keeps its own threaded blocks for the CPU and calls these ops on a device. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

static double dot_d(const float *a, const float *b, int n)
{
    double s = 0;
    for (int d = 0; d < n; d++)
        s += (double)a[d] * b[d];
    return s;
}

void attention_block_forward(float *po, float *plse, const float *q, const float *k, const float *v,
                             const int32_t *qseq, const int32_t *kseq, int nq, int nk, int Hq, int Hkv, int hd)
{
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int group = Hq / Hkv;
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < Hq; h++) {
            const float *qi = q + ((size_t)i * Hq + h) * hd;
            float *o = po + ((size_t)i * Hq + h) * hd;
            const int kh = h / group;
            float m = -INFINITY;
            for (int t = 0; t < nk; t++)
                if (kseq[t] == qseq[i]) {
                    const float s = (float)(scale * dot_d(qi, k + ((size_t)t * Hkv + kh) * hd, hd));
                    m = s > m ? s : m;
                }
            memset(o, 0, sizeof(float) * (size_t)hd);
            if (m == -INFINITY) { /* none of its sequence's keys here */
                plse[(size_t)i * Hq + h] = -INFINITY;
                continue;
            }
            double l = 0;
            double acc[hd > 0 ? hd : 1];
            for (int d = 0; d < hd; d++)
                acc[d] = 0;
            for (int t = 0; t < nk; t++) {
                if (kseq[t] != qseq[i])
                    continue;
                const size_t ko = ((size_t)t * Hkv + kh) * hd;
                const float p = expf((float)(scale * dot_d(qi, k + ko, hd)) - m);
                l += p;
                for (int d = 0; d < hd; d++)
                    acc[d] += (double)p * v[ko + d];
            }
            for (int d = 0; d < hd; d++)
                o[d] = (float)(acc[d] / l);
            plse[(size_t)i * Hq + h] = (float)(m + log(l)); /* l >= 1: the maximum contributes exp(0) */
        }
}

void attention_block_backward(float *dq, float *dk, float *dv, const float *dout, const float *lse, const float *drow,
                              const float *q, const float *k, const float *v, const int32_t *qseq, const int32_t *kseq,
                              int nq, int nk, int Hq, int Hkv, int hd)
{
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int group = Hq / Hkv;
    for (int i = 0; i < nq; i++)
        for (int h = 0; h < Hq; h++) {
            const size_t qo = ((size_t)i * Hq + h) * hd, e = (size_t)i * Hq + h;
            const int kh = h / group;
            for (int t = 0; t < nk; t++) {
                if (kseq[t] != qseq[i])
                    continue;
                const size_t ko = ((size_t)t * Hkv + kh) * hd;
                const float s = (float)(scale * dot_d(q + qo, k + ko, hd));
                const float p = expf(s - lse[e]), dp = (float)dot_d(dout + qo, v + ko, hd);
                const float ds = p * (dp - drow[e]);
                for (int d = 0; d < hd; d++) {
                    dq[qo + d] += scale * ds * k[ko + d];
                    dk[ko + d] += scale * ds * q[qo + d];
                    dv[ko + d] += p * dout[qo + d];
                }
            }
        }
}

void attention_merge(float *out, float *lse, const float *po, const float *plse, int n, int Hq, int hd)
{
    for (size_t e = 0; e < (size_t)n * Hq; e++) {
        const double l1 = lse[e], l2 = plse[e];
        if (l2 == -INFINITY)
            continue;
        const double m = l1 > l2 ? l1 : l2, l = m + log(exp(l1 - m) + exp(l2 - m));
        const double w1 = exp(l1 - l), w2 = exp(l2 - l);
        for (int d = 0; d < hd; d++)
            out[e * hd + d] = (float)(w1 * out[e * hd + d] + w2 * po[e * hd + d]);
        lse[e] = (float)l;
    }
}

void attention_drow(float *drow, const float *dout, const float *out, int n, int Hq, int hd)
{
    for (size_t e = 0; e < (size_t)n * Hq; e++)
        drow[e] = (float)dot_d(dout + e * hd, out + e * hd, hd);
}
