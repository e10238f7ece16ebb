/* Shared by the model tests (test_model.c, test_lora.c): the transformers fixtures under tests/fixtures/models/
 * (ids, NumPy arrays), a closeness check, and gradients against central differences. Include after cmocka.h. */
#ifndef GRPO_TESTS_MODEL_FIXTURES_H
#define GRPO_TESTS_MODEL_FIXTURES_H

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test_util.h"
#include "common/npy.h"
#include "worker/model/model.h"
#include "worker/model/model_io.h"

#define FIX TEST_MODELS_FIXTURE

/* The fixture model tests/fixtures/models/NAME. */
static inline struct model *load(const char *name)
{
    char path[512], err[1024];
    snprintf(path, sizeof path, FIX "%s", name);
    struct model *m = model_load(path, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    return m;
}

/* The ids of a JSON list, or of {"new_ids": [...]}. */
static inline int32_t *read_ids(const char *path, int *n)
{
    json_error_t je;
    json_t *a = json_load_file(path, 0, &je);
    if (!a)
        fail_msg("%s: %s", path, je.text);
    if (json_is_object(a)) { /* {"new_ids": [...]} */
        json_t *inner = json_object_get(a, "new_ids");
        json_incref(inner);
        json_decref(a);
        a = inner;
    }
    *n = (int)json_array_size(a);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    json_decref(a);
    return ids;
}

static inline float *read_npy(const char *path, size_t *count)
{
    float *d;
    int64_t shape[4];
    int nd;
    char err[512];
    if (npy_read_f32(path, &d, shape, &nd, err, sizeof err) != 0)
        fail_msg("%s", err);
    size_t c = 1;
    for (int i = 0; i < nd; i++)
        c *= (size_t)shape[i];
    *count = c;
    return d;
}

/* max |a - b| / (atol + |b|) style check */
static inline void expect_close(const char *what, const float *got, const float *want, size_t n, double atol,
                                double rtol)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= atol + rtol * fabs((double)want[i])))
            fail_msg("%s[%zu]: got %.7g, want %.7g", what, i, got[i], want[i]);
}

/* sum a[i] logp[i] + c[i] entropy[i] of a forward at temperature 0.7 (b->N <= 16), plus a mixture of experts'
 * load-balancing loss (model.h: moe_aux_coef) */
static inline double model_loss(struct model *m, const struct packed_batch *b, const float *a, const float *c, int ckpt)
{
    float logp[16], ent[16];
    model_moe_stats(m, NULL, NULL); /* forget earlier forwards */
    model_acts_free(model_forward(m, b, 0.7f, ckpt, logp, ent));
    double aux = 0;
    const int layers = model_moe_stats(m, NULL, &aux); /* a mixture of experts' load-balancing loss */
    double s = (double)m->moe_aux_coef * m->moe_aux_scale * aux * layers;
    for (int i = 0; i < b->N; i++)
        s += (double)a[i] * logp[i] + (double)c[i] * ent[i];
    return s;
}

/* The finite-difference tests' batch: two packed sequences (4 and 5 tokens) of the tiny vocabulary, and the loss
 * weights a (log-probs) and c (entropies) of model_loss. */
struct fd_batch {
    int32_t ids[9], tg[9], pos[9], cu[3];
    float a[9], c[9];
    struct packed_batch b;
};

static inline void fd_batch_init(struct fd_batch *f)
{
    static const int32_t ids[9] = {3, 14, 15, 9, 26, 5, 35, 8, 9}, tg[9] = {14, 15, 9, 26, 5, 35, 8, 9, 7};
    static const int32_t pos[9] = {0, 1, 2, 3, 0, 1, 2, 3, 4}, cu[3] = {0, 4, 9};
    memcpy(f->ids, ids, sizeof ids), memcpy(f->tg, tg, sizeof tg), memcpy(f->pos, pos, sizeof pos);
    memcpy(f->cu, cu, sizeof cu);
    for (int i = 0; i < 9; i++) {
        f->a[i] = 0.3f + 0.1f * (float)i;
        f->c[i] = i % 2 ? -0.2f : 0.15f;
    }
    f->b = (struct packed_batch){9, 2, f->ids, f->tg, f->pos, f->cu, NULL, NULL, NULL};
}

/* Entries of every tensor w[r] (three of each) against their gradients g[r] by central differences of
 * model_loss with step h: fails naming the tensor past atol + rtol |fd|; returns the entries checked. */
static inline int fd_check(struct model *m, const struct packed_batch *b, const float *a, const float *c,
                           const struct param_ref *w, const struct param_ref *g, int n, float h, double atol,
                           double rtol)
{
    int checked = 0;
    for (int r = 0; r < n; r++)
        for (size_t j = 0; j < w[r].numel; j += w[r].numel / 3 + 1) {
            const float keep = w[r].data[j];
            w[r].data[j] = keep + h;
            const double lp = model_loss(m, b, a, c, 0);
            w[r].data[j] = keep - h;
            const double lm = model_loss(m, b, a, c, 0);
            w[r].data[j] = keep;
            const double fd = (lp - lm) / (2 * h);
            if (fabs(fd - g[r].data[j]) > atol + rtol * fabs(fd))
                fail_msg("%s[%zu]: analytic %g, finite difference %g", w[r].name, j, g[r].data[j], fd);
            checked++;
        }
    return checked;
}

#endif
