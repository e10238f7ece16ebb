/* Mixture-of-experts on the CPU: top-k softmax routing, and the experts' SwiGLU MLPs run dropless with the tokens
 * permuted by expert, so that each expert's tokens go through its three projections as one GEMM each (the
 * context's linear op: fp32 or BF16; the per-expert loop is kernels.c's kmoe_products_*, which the CUDA back-end
 * runs too). Shapes and buffers: struct kmoe in kernels/kernels.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/cpu/cpu_kernels.h"
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
        kmoe_topk(p, E, k, id);
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

/* LoRA on expert e's token group [lo, lo + n) (struct kmoe_lora). Expert e's B (Dout, R) is gathered from PEFT's
 * interleaved columns into scratch (and its gradient added back the same way). */
static void gather_b(float *dst, const float *B, int O, int R, int E, int e)
{
    for (int o = 0; o < O; o++)
        for (int j = 0; j < R; j++)
            dst[(size_t)o * R + j] = B[((size_t)o * R + j) * E + e];
}

static void scatter_add_b(float *gB, const float *src, int O, int R, int E, int e)
{
    for (int o = 0; o < O; o++)
        for (int j = 0; j < R; j++)
            gB[((size_t)o * R + j) * E + e] += src[(size_t)o * R + j];
}

/* The scratch: (n, R) products t and dt, (n, max(F, D)) w, then expert e's B and its gradient. */
struct lscratch {
    float *t, *dt, *w, *B, *gB;
};

static struct lscratch lscratch(const struct kmoe *r, int n)
{
    const struct kmoe_lora *L = r->lora;
    const size_t R = (size_t)(L->Rgu > L->Rd ? L->Rgu : L->Rd), W = (size_t)(r->F > r->D ? r->F : r->D);
    const size_t bgu = 2 * (size_t)r->F * (size_t)L->Rgu, bd = (size_t)r->D * (size_t)L->Rd;
    struct lscratch s;
    s.t = L->tmp;
    s.dt = s.t + (size_t)n * R;
    s.w = s.dt + (size_t)n * R;
    s.B = s.w + (size_t)n * W;
    s.gB = s.B + (bgu > bd ? bgu : bd);
    return s;
}

/* gate and up += s (xs Agu_e^T) Bgu_e^T, the two halves of Bgu_e's rows. */
static void lora_gate_up_forward(struct kctx *K, const struct kmoe *r, int e, int lo, int n)
{
    const struct kmoe_lora *L = r->lora;
    const int R = L->Rgu, D = r->D, F = r->F;
    const size_t d = (size_t)D, f = (size_t)F, rk = (size_t)R;
    struct lscratch s = lscratch(r, n);
    gather_b(s.B, L->Bgu, 2 * F, R, r->E, e);
    K->ops->linear_forward(K, s.t, r->xs + lo * d, L->Agu + (size_t)e * rk * d, NULL, n, D, R);
    for (int half = 0; half < 2; half++) {
        K->ops->linear_forward(K, s.w, s.t, s.B + (size_t)half * f * rk, NULL, n, R, F);
        float *dst = (half ? r->u : r->g) + lo * f;
        for (size_t i = 0; i < (size_t)n * f; i++)
            dst[i] += L->scale * s.w[i];
    }
}

/* ys += s (a Ad_e^T) Bd_e^T. */
static void lora_down_forward(struct kctx *K, const struct kmoe *r, int e, int lo, int n)
{
    const struct kmoe_lora *L = r->lora;
    const int R = L->Rd, D = r->D, F = r->F;
    const size_t d = (size_t)D, f = (size_t)F, rk = (size_t)R;
    struct lscratch s = lscratch(r, n);
    gather_b(s.B, L->Bd, D, R, r->E, e);
    K->ops->linear_forward(K, s.t, r->a + lo * f, L->Ad + (size_t)e * rk * f, NULL, n, F, R);
    K->ops->linear_forward(K, s.w, s.t, s.B, NULL, n, R, D);
    float *ys = r->ys + lo * d;
    for (size_t i = 0; i < (size_t)n * d; i++)
        ys[i] += L->scale * s.w[i];
}

/* The down adapter's backward: da += s (dys Bd_e) Ad_e; gBd_e += s dys^T (a Ad_e^T); gAd_e += s (dys Bd_e)^T a. */
static void lora_down_backward(struct kctx *K, const struct kmoe *r, int e, int lo, int n, float *da, const float *dys)
{
    const struct kmoe_lora *L = r->lora;
    const int R = L->Rd, D = r->D, F = r->F;
    const size_t d = (size_t)D, f = (size_t)F, rk = (size_t)R, nr = (size_t)n * rk;
    struct lscratch s = lscratch(r, n);
    const float *A = L->Ad + (size_t)e * rk * f;
    gather_b(s.B, L->Bd, D, R, r->E, e);
    memset(s.gB, 0, d * rk * sizeof(float));
    K->ops->linear_forward(K, s.t, r->a + lo * f, A, NULL, n, F, R);
    for (size_t i = 0; i < nr; i++)
        s.t[i] *= L->scale;
    memset(s.dt, 0, nr * sizeof(float));
    K->ops->linear_backward(K, s.dt, L->gBd ? s.gB : NULL, NULL, dys + lo * d, s.t, s.B, n, R, D);
    if (L->gBd)
        scatter_add_b(L->gBd, s.gB, D, R, r->E, e);
    for (size_t i = 0; i < nr; i++)
        s.dt[i] *= L->scale;
    K->ops->linear_backward(K, da + lo * f, L->gAd ? L->gAd + (size_t)e * rk * f : NULL, NULL, s.dt, r->a + lo * f, A,
                            n, F, R);
}

/* The gate/up adapter's backward: dt = s (dg Bgu_e[:F] + du Bgu_e[F:]); dxs += dt Agu_e; the gradients of Bgu_e
 * (both halves) and Agu_e. */
static void lora_gate_up_backward(struct kctx *K, const struct kmoe *r, int e, int lo, int n, float *dxs,
                                  const float *dg, const float *du)
{
    const struct kmoe_lora *L = r->lora;
    const int R = L->Rgu, D = r->D, F = r->F;
    const size_t d = (size_t)D, f = (size_t)F, rk = (size_t)R, nr = (size_t)n * rk;
    struct lscratch s = lscratch(r, n);
    const float *A = L->Agu + (size_t)e * rk * d;
    gather_b(s.B, L->Bgu, 2 * F, R, r->E, e);
    memset(s.gB, 0, 2 * f * rk * sizeof(float));
    float *gB = L->gBgu ? s.gB : NULL;
    K->ops->linear_forward(K, s.t, r->xs + lo * d, A, NULL, n, D, R);
    for (size_t i = 0; i < nr; i++)
        s.t[i] *= L->scale;
    memset(s.dt, 0, nr * sizeof(float));
    K->ops->linear_backward(K, s.dt, gB, NULL, dg + lo * f, s.t, s.B, n, R, F);
    K->ops->linear_backward(K, s.dt, gB ? gB + f * rk : NULL, NULL, du + lo * f, s.t, s.B + f * rk, n, R, F);
    if (gB)
        scatter_add_b(L->gBgu, s.gB, 2 * F, R, r->E, e);
    for (size_t i = 0; i < nr; i++)
        s.dt[i] *= L->scale;
    K->ops->linear_backward(K, dxs + lo * d, L->gAgu ? L->gAgu + (size_t)e * rk * d : NULL, NULL, s.dt, r->xs + lo * d,
                            A, n, D, R);
}

/* The hooks check which adapters a layer has (an absent projection's pointers are NULL). */
static void hook_gate_up_forward(struct kctx *K, const struct kmoe *r, int e, int lo, int n)
{
    if (r->lora->Agu)
        lora_gate_up_forward(K, r, e, lo, n);
}

static void hook_down_forward(struct kctx *K, const struct kmoe *r, int e, int lo, int n)
{
    if (r->lora->Ad)
        lora_down_forward(K, r, e, lo, n);
}

static void hook_down_backward(struct kctx *K, const struct kmoe *r, int e, int lo, int n, float *da, const float *dys)
{
    if (r->lora->Ad)
        lora_down_backward(K, r, e, lo, n, da, dys);
}

static void hook_gate_up_backward(struct kctx *K, const struct kmoe *r, int e, int lo, int n, float *dxs,
                                  const float *dg, const float *du)
{
    if (r->lora->Agu)
        lora_gate_up_backward(K, r, e, lo, n, dxs, dg, du);
}

/* LoRA on the experts, inside the products every back-end shares */
static const struct kmoe_expert_hooks lora_hooks = {hook_gate_up_forward, hook_down_forward, hook_down_backward,
                                                    hook_gate_up_backward};

/* y (N, D): each token's output, its slots' outputs in ys weighted by the router, summed in slot order (the same
 * order whatever the permutation); r->pos maps a slot to its row of ys. */
static void combine_slots(float *y, const float *ys, const struct kmoe *r)
{
    const int N = r->N, k = r->k, D = r->D;
    const size_t d = (size_t)D;
    for (int t = 0; t < N; t++) {
        float *yt = y + (size_t)t * d;
        memset(yt, 0, d * sizeof(float));
        for (int s = t * k; s < (t + 1) * k; s++) {
            const float w = r->wt[s], *yr = ys + (size_t)r->pos[s] * d;
            for (int i = 0; i < D; i++)
                yt[i] += w * yr[i];
        }
    }
}

/* The pairwise tree over n (a power of two) buffers of len floats into the first: (0+1)+(2+3)..., the order of
 * worker/model/model_proj.c's groups. */
static void tree_sum(float *const *b, int n, size_t len)
{
    for (int w = 1; w < n; w *= 2)
        for (int j = 0; j + w < n; j += 2 * w)
            for (size_t i = 0; i < len; i++)
                b[j][i] += b[j + w][i];
}

/* per thread, growing only: batch-invariant mode's groups */
static _Thread_local float *tl_groups;
static _Thread_local size_t tl_groups_n;

static float *group_floats(size_t n)
{
    if (n > tl_groups_n) {
        free(tl_groups);
        tl_groups = xmalloc(n * sizeof(float));
        tl_groups_n = n;
    }
    return tl_groups;
}

/* Batch-invariant mode's combine (struct kmoe's bi_groups): each group's slots combined alone, into y + j N D
 * with apart (struct kmoe's bi_apart), else the groups' results summed in the fixed tree into y; the groups' slot
 * outputs summed into ys (the backward's). */
static void combine_groups(float *y, const struct kmoe *r, bool apart)
{
    const int g = r->bi_groups;
    const size_t nd = (size_t)r->N * (size_t)r->D, nkd = nd * (size_t)r->k;
    float *part = r->ys_groups + (size_t)(g - 1) * nkd, *yb[8], *sb[8];
    for (int j = 0; j < g; j++) {
        yb[j] = apart ? y + (size_t)j * nd : j ? part + (size_t)(j - 1) * nd : y;
        sb[j] = j ? r->ys_groups + (size_t)(j - 1) * nkd : r->ys;
        combine_slots(yb[j], sb[j], r);
    }
    if (!apart)
        tree_sum(yb, g, nd);
    tree_sum(sb, g, nkd);
}

static void check_groups(const struct kmoe *r, const char *op)
{
    const int g = r->bi_groups;
    if (g > 1 && (g > 8 || (g & (g - 1)) || r->F % g != 0))
        check_failf(__FILE__, __LINE__, "%s: %d batch-invariant groups of %d columns", op, g, r->F);
}

void cpu_moe_experts_forward(struct kctx *K, float *y, const float *x, const float *Wg, const float *Wu,
                             const float *Wd, struct kmoe *r)
{
    const int N = r->N, k = r->k, D = r->D, g = r->bi_groups;
    const size_t d = (size_t)D, nd = (size_t)N * d, nkd = nd * (size_t)k;
    check_groups(r, "moe_experts_forward");
    for (int j = 0; j < N * k; j++) /* gather: row j of xs is the input of slot order[j] */
        memcpy(r->xs + j * d, x + (size_t)(r->order[j] / k) * d, d * sizeof(float));
    if (g > 1) /* the other groups' slot outputs, then their combined results */
        r->ys_groups = group_floats((size_t)(g - 1) * (nkd + nd));
    kmoe_products_forward(K, r->offs, Wg, Wu, Wd, r, r->lora ? &lora_hooks : NULL);
    for (int j = 0; j < N * k; j++) /* slot -> row of the permuted buffers */
        r->pos[r->order[j]] = j;
    if (g > 1)
        combine_groups(y, r, r->bi_apart);
    else
        combine_slots(y, r->ys, r);
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
    kmoe_products_backward(K, r->offs, dWg, dWu, dWd, Wg, Wu, Wd, r, r->lora ? &lora_hooks : NULL);
    for (int j = 0; j < N * k; j++) { /* scatter back to the tokens */
        float *o = dx + (size_t)(r->order[j] / k) * d;
        const float *g = dxs + j * d;
        for (int i = 0; i < D; i++)
            o[i] += g[i];
    }
}

/* Expert parallelism's row moves (kernels.h), the loops of the experts' ops above */
void cpu_moe_gather(struct kctx *K, float *xs, const float *x, struct kmoe *r)
{
    (void)K;
    const int nk = r->N * r->k, k = r->k;
    const size_t d = (size_t)r->D;
    for (int j = 0; j < nk; j++)
        memcpy(xs + j * d, x + (size_t)(r->order[j] / k) * d, d * sizeof(float));
    for (int j = 0; j < nk; j++)
        r->pos[r->order[j]] = j;
}

void cpu_moe_combine(struct kctx *K, float *y, const float *ys, const struct kmoe *r)
{
    (void)K;
    if (r->bi_groups <= 1) {
        combine_slots(y, ys, r);
        return;
    }
    check_groups(r, "moe_combine");
    if (ys != r->ys) /* the groups' tree goes into ys, the backward's */
        check_failf(__FILE__, __LINE__, "moe_combine: batch-invariant groups combine from r->ys only");
    combine_groups(y, r, false);
}

void cpu_moe_slot_grad_op(struct kctx *K, float *dys, float *dwt, const float *dy, const struct kmoe *r)
{
    (void)K;
    cpu_moe_slot_grad(r, dy, dys, dwt);
}

void cpu_moe_scatter(struct kctx *K, float *dx, const float *dxs, const struct kmoe *r)
{
    (void)K;
    const int nk = r->N * r->k, k = r->k, D = r->D;
    const size_t d = (size_t)D;
    for (int j = 0; j < nk; j++) { /* in expert order, as cpu_moe_experts_backward */
        float *o = dx + (size_t)(r->order[j] / k) * d;
        const float *g = dxs + j * d;
        for (int i = 0; i < D; i++)
            o[i] += g[i];
    }
}
