/* Tensor-parallel shards and the whole model: slicing a whole (Hugging Face layout) buffer into a rank's part,
 * assembling the parts back, the gradients of replicated KV heads, and norms that count each parameter once. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "model.h"
#include "model_internal.h"
#include "worker/comm/comm.h"

static struct param_ref *refs_of(const struct model_config *c, const struct model_shard *sh, float *mem, int *n)
{
    *n = model_refs_over(c, sh, NULL, NULL, 0);
    struct param_ref *r = xcalloc((size_t)*n, sizeof *r);
    model_refs_over(c, sh, mem, r, *n);
    return r;
}

/* Copy between a part (p) and its place in the whole tensor (w, laid out full[0] x full[1]). */
static void copy_part(const struct param_ref *p, float *part, float *whole, bool to_whole)
{
    const int64_t rows = p->shape[0], cols = p->shape[1], fcols = p->full[1];
    for (int64_t i = 0; i < rows; i++) {
        float *a = part + i * cols;
        float *b = p->split == 2 ? whole + i * fcols + p->at : whole + (p->split == 1 ? p->at + i : i) * fcols;
        if (to_whole)
            memcpy(b, a, (size_t)cols * sizeof(float));
        else
            memcpy(a, b, (size_t)cols * sizeof(float));
    }
}

void model_shard_slice(const struct model *m, const float *whole, float *local)
{
    const struct model_shard one = model_shard_of(&m->cfg, 0, 1);
    int nw, nl;
    struct param_ref *w = refs_of(&m->cfg, &one, (float *)whole, &nw);
    struct param_ref *l = refs_of(&m->cfg, &m->sh, local, &nl);
    if (nw != nl)
        check_failf(__FILE__, __LINE__, "model_shard_slice: %d whole tensors, %d parts", nw, nl);
    for (int i = 0; i < nl; i++)
        copy_part(&l[i], l[i].data, w[i].data, false);
    free(w);
    free(l);
}

void model_shard_assemble(const struct model *m, const float *local, float *whole)
{
    const int tp = m->sh.tp_size;
    if (tp == 1) {
        memcpy(whole, local, m->w.n_floats * sizeof(float));
        return;
    }
    size_t per = 0; /* the largest part: vocabulary shards may differ by a row */
    for (int r = 0; r < tp; r++) {
        struct model_shard sh = model_shard_of(&m->cfg, r, tp);
        size_t n = model_shard_floats(&m->cfg, &sh);
        per = n > per ? n : per;
    }
    float *send = xcalloc(per, sizeof(float)), *all = xmalloc((size_t)tp * per * sizeof(float));
    memcpy(send, local, m->w.n_floats * sizeof(float));
    comm_allgather(m->sh.tp, send, all, per, COMM_F32);
    const struct model_shard one = model_shard_of(&m->cfg, 0, 1);
    int nw;
    struct param_ref *w = refs_of(&m->cfg, &one, whole, &nw);
    for (int r = 0; r < tp; r++) {
        struct model_shard sh = model_shard_of(&m->cfg, r, tp);
        int n;
        struct param_ref *l = refs_of(&m->cfg, &sh, all + (size_t)r * per, &n);
        for (int i = 0; i < n; i++)
            if (l[i].split != 0 || r == 0)
                copy_part(&l[i], l[i].data, w[i].data, true);
        free(l);
    }
    free(w);
    free(send);
    free(all);
}

void model_shard_sync_grads(struct model *m)
{
    const struct model_shard *sh = &m->sh;
    if (sh->kv_share == 1 || !m->grad)
        return;
    /* each rank adds its KV parts' gradients at their place in a whole-KV buffer; the sum over the TP group
     * holds, at each KV head, the sum over the ranks that share it */
    const int n = model_param_refs(m, m->grad, NULL, 0);
    struct param_ref *g = xcalloc((size_t)n, sizeof *g);
    model_param_refs(m, m->grad, g, n);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (strstr(g[i].name, "k_proj") || strstr(g[i].name, "v_proj")) // NOLINT: name is an array
            total += (size_t)g[i].full[0] * (size_t)g[i].full[1];
    float *buf = xcalloc(total, sizeof(float));
    size_t off = 0;
    for (int i = 0; i < n; i++)
        if (strstr(g[i].name, "k_proj") || strstr(g[i].name, "v_proj")) { // NOLINT: name is an array
            copy_part(&g[i], g[i].data, buf + off, true);
            off += (size_t)g[i].full[0] * (size_t)g[i].full[1];
        }
    /* ranks that do not hold a head left zeros there; only the sharers' parts add up */
    comm_allreduce_sum(sh->tp, buf, total, COMM_F32);
    off = 0;
    for (int i = 0; i < n; i++)
        if (strstr(g[i].name, "k_proj") || strstr(g[i].name, "v_proj")) { // NOLINT: name is an array
            copy_part(&g[i], g[i].data, buf + off, false);
            off += (size_t)g[i].full[0] * (size_t)g[i].full[1];
        }
    free(buf);
    free(g);
}

double model_owned_sq(const struct model *m, const float *buf, size_t lo, size_t hi)
{
    const int n = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *r = xcalloc((size_t)n, sizeof *r);
    model_param_refs(m, &m->w, r, n);
    double s = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].owner)
            continue;
        size_t a = (size_t)(r[i].data - m->w.mem), b = a + r[i].numel;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        for (size_t j = a; j < b; j++)
            s += (double)buf[j - lo] * buf[j - lo];
    }
    free(r);
    return s;
}
