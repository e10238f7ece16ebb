/* Mixture-of-experts on the CPU: top-k softmax routing, and the experts' SwiGLU MLPs run dropless with the tokens
 * permuted by expert, so that each expert's tokens go through its three projections as one GEMM each (the
 * context's linear op: fp32 or BF16; the per-expert loop is kernels.c's kmoe_products_*, which the CUDA back-end
 * runs too). Shapes and buffers: struct kmoe in kernels/kernels.h. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"

void cpu_moe_route(struct kctx *K, struct kmoe *r, const float *logits)
{
    (void)K;
    const int N = r->N, E = r->E, k = r->k;
    int *cnt = (int *)r->offs; /* counts first, then prefix sums */
    r->n_differ = 0;
    r->n_compared = r->ref ? N : 0;
    memset(r->offs, 0, (size_t)(E + 1) * sizeof *r->offs);
    memset(r->pmean, 0, (size_t)E * sizeof *r->pmean);
    for (int t = 0; t < N; t++) {
        const float *z = logits + (size_t)t * E;
        float *p = r->probs + (size_t)t * E;
        float mx = z[0];
        for (int e = 1; e < E; e++)
            mx = z[e] > mx ? z[e] : mx;
        double s = 0;
        for (int e = 0; e < E; e++)
            s += (p[e] = expf(z[e] - mx));
        for (int e = 0; e < E; e++) {
            p[e] = (float)(p[e] / s);
            r->pmean[e] += p[e];
        }
        /* the k largest probabilities, best first; a tie goes to the lower expert index (as torch.topk on CPU) */
        int32_t *id = r->idx + (size_t)t * k;
        float *w = r->wt + (size_t)t * k;
        double sum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int i = 0; i < j; i++)
                    taken |= id[i] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            id[j] = best;
        }
        if (r->ref) { /* the token's own choice against ref's, as sets; with replay ref's experts are taken */
            const int32_t *rf = r->ref + (size_t)t * k;
            bool same = true;
            for (int j = 0; j < k; j++) {
                bool found = false;
                for (int i = 0; i < k; i++)
                    found |= rf[i] == id[j];
                same &= found;
            }
            r->n_differ += !same;
            if (r->replay)
                memcpy(id, rf, (size_t)k * sizeof *id);
        }
        for (int j = 0; j < k; j++) {
            w[j] = p[id[j]];
            sum += p[id[j]];
            cnt[id[j] + 1]++;
        }
        if (r->norm_topk)
            for (int j = 0; j < k; j++)
                w[j] = (float)(w[j] / sum);
    }
    for (int e = 0; e < E; e++)
        r->pmean[e] = N ? r->pmean[e] / (float)N : 0.0f;
    for (int e = 0; e < E; e++)
        r->offs[e + 1] += r->offs[e];
    /* a stable counting sort of the N k slots by expert */
    int32_t fill[E > 0 ? E : 1];
    for (int e = 0; e < E; e++)
        fill[e] = r->offs[e];
    for (int s = 0; s < N * k; s++)
        r->order[fill[r->idx[s]]++] = s; // NOLINT: idx holds experts 0..E-1 (the top-k above), each fill[] set
}

void cpu_moe_route_backward(struct kctx *K, float *dlogits, const struct kmoe *r, const float *dwt, const float *dp_col)
{
    (void)K;
    const int N = r->N, E = r->E, k = r->k;
    float dp[E > 0 ? E : 1];
    for (int t = 0; t < N; t++) {
        const float *p = r->probs + (size_t)t * E;
        const int32_t *id = r->idx + (size_t)t * k;
        const float *w = r->wt + (size_t)t * k, *dw = dwt + (size_t)t * k;
        for (int e = 0; e < E; e++)
            dp[e] = dp_col ? dp_col[e] : 0.0f;
        if (r->norm_topk) { /* w_j = p_j / S, S = sum of the chosen p: dp_j = (dw_j - sum_i dw_i w_i) / S */
            double S = 0, dot = 0;
            for (int j = 0; j < k; j++)
                S += p[id[j]], dot += (double)dw[j] * w[j];
            for (int j = 0; j < k; j++)
                dp[id[j]] += (float)((dw[j] - dot) / S);
        } else {
            for (int j = 0; j < k; j++)
                dp[id[j]] += dw[j];
        }
        /* through the softmax: dz_e = p_e (dp_e - sum_i p_i dp_i) */
        double dot = 0;
        for (int e = 0; e < E; e++)
            dot += (double)p[e] * dp[e];
        float *dz = dlogits + (size_t)t * E;
        for (int e = 0; e < E; e++)
            dz[e] = (float)(p[e] * (dp[e] - dot));
    }
}

void cpu_moe_experts_forward(struct kctx *K, float *y, const float *x, const float *Wg, const float *Wu,
                             const float *Wd, struct kmoe *r)
{
    const int N = r->N, k = r->k, D = r->D;
    const size_t d = (size_t)D;
    for (int j = 0; j < N * k; j++) /* gather: row j of xs is the input of slot order[j] */
        memcpy(r->xs + j * d, x + (size_t)(r->order[j] / k) * d, d * sizeof(float));
    kmoe_products_forward(K, r->offs, Wg, Wu, Wd, r);
    /* combine: each token's output is its slots' outputs weighted by the router, summed in slot order (the same
     * order whatever the permutation) */
    int32_t *pos = r->pos; /* slot -> row of the permuted buffers */
    for (int j = 0; j < N * k; j++)
        pos[r->order[j]] = j;
    for (int t = 0; t < N; t++) {
        float *yt = y + (size_t)t * d;
        memset(yt, 0, d * sizeof(float));
        for (int s = t * k; s < (t + 1) * k; s++) {
            const float w = r->wt[s], *ys = r->ys + (size_t)pos[s] * d;
            for (int i = 0; i < D; i++)
                yt[i] += w * ys[i];
        }
    }
}

void cpu_moe_slot_grad(const struct kmoe *r, const float *dy, float *dys, float *dwt)
{
    const int N = r->N, k = r->k, D = r->D;
    const size_t d = (size_t)D;
    for (int j = 0; j < N * k; j++) { /* y_t = sum_s w_s ys_s: dys_s = w_s dy_t, dw_s = dy_t . ys_s */
        const int s = r->order[j];
        const float *dyt = dy + (size_t)(s / k) * d, *ys = r->ys + j * d;
        float *o = dys + j * d;
        double dot = 0;
        for (int i = 0; i < D; i++) {
            o[i] = r->wt[s] * dyt[i];
            dot += (double)dyt[i] * ys[i];
        }
        dwt[s] = (float)dot;
    }
}

void cpu_moe_experts_backward(struct kctx *K, float *dx, float *dWg, float *dWu, float *dWd, float *dwt,
                              const float *dy, const float *Wg, const float *Wu, const float *Wd, const struct kmoe *r)
{
    const int N = r->N, k = r->k, D = r->D;
    const size_t d = (size_t)D, nk = (size_t)N * k;
    float *dys = r->bwd_d;
    const float *dxs = r->bwd_d + nk * d;
    cpu_moe_slot_grad(r, dy, dys, dwt);
    kmoe_products_backward(K, r->offs, dWg, dWu, dWd, Wg, Wu, Wd, r);
    for (int j = 0; j < N * k; j++) { /* scatter back to the tokens */
        float *o = dx + (size_t)(r->order[j] / k) * d;
        const float *g = dxs + j * d;
        for (int i = 0; i < D; i++)
            o[i] += g[i];
    }
}
