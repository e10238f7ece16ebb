#include "optim.h"

#include <math.h>
#include <stdlib.h>

#include "common/check.h"

struct adamw *adamw_create(size_t n, double beta1, double beta2, double eps, double weight_decay)
{
    struct adamw *o = xcalloc(1, sizeof *o);
    o->n = n;
    o->m = xcalloc(n, sizeof(float));
    o->v = xcalloc(n, sizeof(float));
    o->beta1 = beta1;
    o->beta2 = beta2;
    o->eps = eps;
    o->weight_decay = weight_decay;
    return o;
}

void adamw_free(struct adamw *o)
{
    if (!o)
        return;
    free(o->m);
    free(o->v);
    free(o);
}

void adamw_step(struct adamw *o, float *p, const float *g, double lr)
{
    o->t++;
    const double bc1 = 1.0 - pow(o->beta1, (double)o->t), bc2 = 1.0 - pow(o->beta2, (double)o->t);
    const float b1 = (float)o->beta1, b2 = (float)o->beta2;
    const float decay = (float)(1.0 - lr * o->weight_decay);
    const float step = (float)(lr / bc1), eps = (float)o->eps, inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    for (size_t i = 0; i < o->n; i++) {
        o->m[i] = b1 * o->m[i] + (1 - b1) * g[i];
        o->v[i] = b2 * o->v[i] + (1 - b2) * g[i] * g[i];
        /* torch: p *= 1 - lr*wd; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) */
        p[i] = p[i] * decay - step * o->m[i] / (sqrtf(o->v[i]) * inv_sqrt_bc2 + eps);
    }
}

double grad_global_norm(const float *g, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s);
}

void grad_scale_to(float *g, size_t n, double norm, double max_norm)
{
    if (max_norm > 0 && isfinite(norm)) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0)
            for (size_t i = 0; i < n; i++)
                g[i] = (float)(g[i] * coef);
    }
}

double grad_clip(float *g, size_t n, double max_norm)
{
    double norm = grad_global_norm(g, n);
    grad_scale_to(g, n, norm, max_norm);
    return norm;
}

double lr_at(enum lr_schedule s, double lr, int64_t step, int64_t warmup, int64_t total, double min_lr_ratio)
{
    if (warmup > 0 && step < warmup)
        return lr * (double)step / (double)warmup;
    if (s == LR_CONSTANT)
        return lr;
    double span = (double)(total - warmup);
    double progress = span > 0 ? (double)(step - warmup) / span : 1.0;
    if (progress > 1)
        progress = 1;
    double coef = 0.5 * (1.0 + cos(M_PI * progress));
    return lr * (min_lr_ratio + (1.0 - min_lr_ratio) * coef);
}
