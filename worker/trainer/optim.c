#include "optim.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <immintrin.h>
#endif

#include "common/check.h"
#include "kernels/kernels.h"

struct adamw *adamw_create(size_t n, double beta1, double beta2, double eps, double weight_decay)
{
    return adamw_create_on(kctx_cpu(), n, beta1, beta2, eps, weight_decay);
}

struct adamw *adamw_create_on(struct kctx *K, size_t n, double beta1, double beta2, double eps, double weight_decay)
{
    struct adamw *o = xcalloc(1, sizeof *o);
    o->K = K;
    o->n = n;
    o->m = k_calloc(K, (n ? n : 1) * sizeof(float), KMEM_OPTIM, "AdamW's first moments");
    o->v = k_calloc(K, (n ? n : 1) * sizeof(float), KMEM_OPTIM, "AdamW's second moments");
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
    k_free(o->K, o->m, (o->n ? o->n : 1) * sizeof(float), KMEM_OPTIM);
    k_free(o->K, o->v, (o->n ? o->n : 1) * sizeof(float), KMEM_OPTIM);
    free(o);
}

void adamw_copy_out(float *dst, const float *src, size_t n)
{
    size_t i = 0;
#ifdef __SSE2__
    /* streaming stores from the first 16-byte boundary of dst: the copy does not evict what the step reads */
    for (; i < n && ((uintptr_t)(dst + i) & 15); i++)
        dst[i] = src[i];
    for (; i + 4 <= n; i += 4)
        _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    _mm_sfence();
#endif
    memcpy(dst + i, src + i, (n - i) * sizeof(float));
}

/* AdamW is elementwise: the chunks' steps are the whole step's, bit for bit */
#define KEEP_CHUNK 16384

void adamw_keep_issue(struct adamw *o, const float *params)
{
    struct adamw_keep *k = o->keep;
    if (!k || !k->beside)
        return;
    k_to_host_behind(o->K, k->p, params, o->n * sizeof(float));
    k_to_host_behind(o->K, k->m, o->m, o->n * sizeof(float));
    k_to_host_behind(o->K, k->v, o->v, o->n * sizeof(float));
    k->beside = false;
    k->kept = true;
    k->behind = o->K;
}

void adamw_step(struct adamw *o, float *p, const float *g, double lr)
{
    o->t++;
    struct adamw_keep *k = o->keep;
    adamw_keep_issue(o, p); /* not issued yet: now, and waited for just below */
    if (k && k->behind) {   /* a GPU's copy of the state, under way beside its work: the update comes after it */
        k_behind_wait(k->behind, false);
        k->behind = NULL;
        o->keep = NULL;
        k = NULL;
    }
    if (!k || !k->armed || o->K->device != KDEV_CPU) {
        k_adamw(o->K, p, g, o->m, o->v, o->n, lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->t);
        return;
    }
    for (size_t i = 0; i < o->n; i += KEEP_CHUNK) {
        const size_t c = o->n - i < KEEP_CHUNK ? o->n - i : KEEP_CHUNK;
        adamw_copy_out(k->p + i, p + i, c);
        adamw_copy_out(k->m + i, o->m + i, c);
        adamw_copy_out(k->v + i, o->v + i, c);
        k_adamw(o->K, p + i, g + i, o->m + i, o->v + i, c, lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->t);
    }
    k->armed = false;
    k->kept = true;
    o->keep = NULL;
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
    grad_scale_to_on(kctx_cpu(), g, n, norm, max_norm);
}

void grad_scale_to_on(struct kctx *K, float *g, size_t n, double norm, double max_norm)
{
    if (max_norm > 0 && isfinite(norm)) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0)
            k_scale(K, g, coef, n);
    }
}

double grad_clip_on(struct kctx *K, float *g, size_t n, double max_norm)
{
    const double norm = sqrt(k_sumsq(K, g, n));
    grad_scale_to_on(K, g, n, norm, max_norm);
    return norm;
}

double grad_clip(float *g, size_t n, double max_norm)
{
    double norm = grad_global_norm(g, n);
    grad_scale_to(g, n, norm, max_norm);
    return norm;
}

double lr_at(const struct lr_schedule *s, int64_t step)
{
    const double n = (double)step, w = (double)s->warmup, d = (double)s->decay_steps;
    if (s->warmup > 0 && step <= s->warmup)
        return s->init_lr + (s->lr - s->init_lr) * n / w;
    if (s->style == LR_CONSTANT)
        return s->lr;
    if (step > s->decay_steps)
        return s->min_lr;
    if (s->style == LR_INV_SQRT) {
        const double v = s->lr * sqrt(w > 1 ? w : 1) / sqrt(n > 1 ? n : 1);
        return v > s->min_lr ? v : s->min_lr;
    }
    double coef = 1;
    if (s->style == LR_WSD) {
        const double anneal = d - (double)s->wsd_steps;
        if (n > anneal) {
            const double r = s->wsd_steps > 0 ? (n - anneal) / (double)s->wsd_steps : 1;
            switch (s->wsd_style) {
            case LR_WSD_LINEAR: coef = 1 - r; break;
            case LR_WSD_COSINE: coef = 0.5 * (1 + cos(M_PI * r)); break;
            case LR_WSD_MINUS_SQRT: coef = 1 - sqrt(r); break;
            case LR_WSD_EXPONENTIAL: coef = 2 * pow(0.5, r) - 1; break;
            }
        }
    } else {
        const double r = d > w ? (n - w) / (d - w) : 1;
        coef = s->style == LR_LINEAR ? 1 - r : 0.5 * (1 + cos(M_PI * r));
    }
    return s->min_lr + coef * (s->lr - s->min_lr);
}

int lr_style_named(const char *name)
{
    static const struct {
        const char *name;
        enum lr_style style;
    } names[] = {{"constant", LR_CONSTANT},
                 {"cosine", LR_COSINE},
                 {"linear", LR_LINEAR},
                 {"inverse_square_root", LR_INV_SQRT},
                 {"inverse-square-root", LR_INV_SQRT},
                 {"WSD", LR_WSD}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0)
            return (int)names[i].style;
    return -1;
}

int lr_wsd_style_named(const char *name)
{
    static const char *const names[] = {[LR_WSD_EXPONENTIAL] = "exponential",
                                        [LR_WSD_LINEAR] = "linear",
                                        [LR_WSD_COSINE] = "cosine",
                                        [LR_WSD_MINUS_SQRT] = "minus_sqrt"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            return (int)i;
    return -1;
}
