/* Mixture-of-experts kernels (kernels/cpu/moe.c through the kernel interface) against a direct per-token
 * reference in double: routing (softmax, top-k, renormalised or not), the experts' SwiGLU MLPs weighted by the
 * router, every slot kept (dropless); and the backward against central finite differences of the whole forward,
 * including the load-balancing loss's gradient on the router probabilities (dp_col). */
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

enum { N = 13, E = 5, TOPK = 2, D = 8, F = 6 };

struct moe_case {
    bool norm;
    float x[N * D], logits[N * E], Wg[E * F * D], Wu[E * F * D], Wd[E * D * F];
    float G[N * D], c[E]; /* loss = sum(y G) + sum_e c_e pmean_e */
};

/* The loss through the kernels; y (N, D) out when not NULL. */
static double kernel_loss(struct moe_case *m, float *y_out, struct kmoe *keep, struct karena *ar)
{
    struct kctx *K = kctx_cpu();
    struct kmoe r = {.N = N, .E = E, .k = TOPK, .D = D, .F = F, .norm_topk = m->norm};
    struct karena plan;
    karena_init_counter(&plan);
    kmoe_take(&plan, &r, true);
    karena_release(ar);
    karena_reserve(ar, plan.used, 0);
    kmoe_take(ar, &r, true);
    float y[N * D];
    k_moe_route(K, &r, m->logits);
    k_moe_experts_forward(K, y, m->x, m->Wg, m->Wu, m->Wd, &r);
    if (y_out)
        memcpy(y_out, y, sizeof y);
    if (keep)
        *keep = r;
    double s = tk_dot(y, m->G, N * D);
    for (int e = 0; e < E; e++)
        s += (double)m->c[e] * r.pmean[e];
    return s;
}

/* The reference: token by token, expert by expert, in double. */
static void reference(const struct moe_case *m, double *y, int *count)
{
    memset(count, 0, E * sizeof *count);
    for (int t = 0; t < N; t++) {
        double p[E], mx = -1e30, s = 0;
        for (int e = 0; e < E; e++)
            mx = fmax(mx, m->logits[t * E + e]);
        for (int e = 0; e < E; e++)
            s += p[e] = exp(m->logits[t * E + e] - mx);
        for (int e = 0; e < E; e++)
            p[e] /= s;
        int id[TOPK];
        double w[TOPK], ws = 0;
        bool used[E] = {0};
        for (int j = 0; j < TOPK; j++) {
            int b = -1;
            for (int e = 0; e < E; e++)
                if (!used[e] && (b < 0 || p[e] > p[b]))
                    b = e;
            used[b] = true, id[j] = b, w[j] = p[b], ws += p[b];
            count[b]++;
        }
        for (int i = 0; i < D; i++)
            y[t * D + i] = 0;
        for (int j = 0; j < TOPK; j++) {
            const int e = id[j];
            const double wj = m->norm ? w[j] / ws : w[j];
            double a[F];
            for (int f = 0; f < F; f++) {
                double g = 0, u = 0;
                for (int i = 0; i < D; i++) {
                    g += (double)m->Wg[(e * F + f) * D + i] * m->x[t * D + i];
                    u += (double)m->Wu[(e * F + f) * D + i] * m->x[t * D + i];
                }
                a[f] = g / (1 + exp(-g)) * u;
            }
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int f = 0; f < F; f++)
                    o += (double)m->Wd[(e * D + i) * F + f] * a[f];
                y[t * D + i] += wj * o;
            }
        }
    }
}

static void fill(struct moe_case *m, bool norm, uint64_t seed)
{
    uint64_t s = seed;
    m->norm = norm;
    tk_fill(m->x, N * D, &s, -1, 1);
    tk_fill(m->logits, N * E, &s, -2, 2);
    tk_fill(m->Wg, E * F * D, &s, -0.5f, 0.5f);
    tk_fill(m->Wu, E * F * D, &s, -0.5f, 0.5f);
    tk_fill(m->Wd, E * D * F, &s, -0.5f, 0.5f);
    tk_fill(m->G, N * D, &s, -1, 1);
    tk_fill(m->c, E, &s, -1, 1);
}

static void test_forward_matches_per_token_reference(void **state)
{
    (void)state;
    static struct moe_case m;
    struct karena ar;
    karena_init(&ar, kctx_cpu(), KMEM_ACTS, "moe test");
    for (int norm = 0; norm < 2; norm++) {
        fill(&m, norm, 7 + norm);
        float y[N * D];
        struct kmoe r;
        kernel_loss(&m, y, &r, &ar);
        double want[N * D];
        int count[E];
        reference(&m, want, count);
        for (int i = 0; i < N * D; i++)
            assert_float_equal(y[i], want[i], 1e-5 * (1 + fabs(want[i])));
        /* dropless: every slot kept, each expert's tokens one contiguous group in the permutation */
        assert_int_equal(r.offs[0], 0);
        assert_int_equal(r.offs[E], N * TOPK);
        for (int e = 0; e < E; e++) {
            assert_int_equal(r.offs[e + 1] - r.offs[e], count[e]);
            for (int j = r.offs[e]; j < r.offs[e + 1]; j++)
                assert_int_equal(r.idx[r.order[j]], e);
        }
        /* the renormalised weights sum to 1; the plain ones to the chosen probabilities' sum (< 1) */
        for (int t = 0; t < N; t++) {
            double s = 0;
            for (int j = 0; j < TOPK; j++)
                s += r.wt[t * TOPK + j];
            if (norm)
                assert_float_equal(s, 1.0, 1e-6);
            else
                assert_true(s < 1.0);
        }
    }
    karena_release(&ar);
}

static struct moe_case *fd_case;
static struct karena *fd_arena;
static double fd_loss(void *p)
{
    (void)p;
    return kernel_loss(fd_case, NULL, NULL, fd_arena);
}

static void test_backward_matches_finite_differences(void **state)
{
    (void)state;
    static struct moe_case m;
    struct karena ar;
    karena_init(&ar, kctx_cpu(), KMEM_ACTS, "moe test");
    fd_case = &m, fd_arena = &ar;
    for (int norm = 0; norm < 2; norm++) {
        fill(&m, norm, 11 + norm);
        struct kctx *K = kctx_cpu();
        struct kmoe r;
        kernel_loss(&m, NULL, &r, &ar);
        static float dx[N * D], dWg[E * F * D], dWu[E * F * D], dWd[E * D * F], dwt[N * TOPK], dz[N * E];
        tk_set(dx, N * D, 0.25f); /* accumulated into */
        tk_set(dWg, E * F * D, 0.25f), tk_set(dWu, E * F * D, 0.25f), tk_set(dWd, E * D * F, 0.25f);
        float dp_col[E];
        for (int e = 0; e < E; e++)
            dp_col[e] = m.c[e] / N; /* d(sum_e c_e pmean_e)/dp[t][e] */
        k_moe_experts_backward(K, dx, dWg, dWu, dWd, dwt, m.G, m.Wg, m.Wu, m.Wd, &r);
        k_moe_route_backward(K, dz, &r, dwt, dp_col);
        tk_fd_check("x", m.x, N * D, NULL, 0, dx, 0.25f, fd_loss, NULL, 1e-3f, 2e-2);
        tk_fd_check("Wg", m.Wg, E * F * D, NULL, 0, dWg, 0.25f, fd_loss, NULL, 1e-3f, 2e-2);
        tk_fd_check("Wu", m.Wu, E * F * D, NULL, 0, dWu, 0.25f, fd_loss, NULL, 1e-3f, 2e-2);
        tk_fd_check("Wd", m.Wd, E * D * F, NULL, 0, dWd, 0.25f, fd_loss, NULL, 1e-3f, 2e-2);
        tk_fd_check("logits", m.logits, N * E, NULL, 0, dz, 0.0f, fd_loss, NULL, 1e-3f, 2e-2);
    }
    karena_release(&ar);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_matches_per_token_reference),
        cmocka_unit_test(test_backward_matches_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
