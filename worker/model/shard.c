/* Model-parallel shards and the whole model: slicing a whole (Hugging Face layout) buffer into a rank's part,
 * assembling the parts back over the TP x PP ranks of one model copy, the gradients of parameters held twice
 * (replicated KV heads, the tied embedding's last-stage copy), and norms that count each parameter once. Parts
 * match their whole tensors by Hugging Face name, so a stage's subset of the tensors needs no bookkeeping. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model.h"
#include "model_internal.h"
#include "worker/comm/comm.h"

static struct param_ref *refs_of(const struct model_config *c, const struct model_shard *sh, float *mem, int *n)
{
    *n = model_refs_over(c, sh, NULL, NULL, 0);
    struct param_ref *r = xcalloc((size_t)(*n ? *n : 1), sizeof *r);
    model_refs_over(c, sh, mem, r, *n);
    return r;
}

const struct param_ref *model_whole_ref(const struct param_ref *w, int nw, const struct param_ref *part, int *hint)
{
    for (int k = 0; k < nw; k++) {
        int i = (*hint + k) % nw;
        if (strcmp(w[i].name, part->name) == 0) {
            *hint = i + 1;
            return &w[i];
        }
    }
    check_failf(__FILE__, __LINE__, "model shard: no whole tensor named %s", part->name);
    return NULL;
}

void model_part_copy(struct kctx *K, const struct param_ref *p, float *part, float *whole, bool to_whole)
{
    const int64_t rows = p->shape[0], cols = p->shape[1], fcols = p->full[1];
    if (p->split != 2) { /* whole rows: one block */
        float *b = whole + (p->split == 1 ? p->at : 0) * fcols;
        const size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
        k_copy(K, to_whole ? b : part, to_whole ? part : b, bytes);
        return;
    }
    for (int64_t i = 0; i < rows; i++) {
        float *a = part + i * cols, *b = whole + i * fcols + p->at;
        k_copy(K, to_whole ? b : a, to_whole ? a : b, (size_t)cols * sizeof(float));
    }
}

/* The same in host memory. */
static void copy_part(const struct param_ref *p, float *part, float *whole, bool to_whole)
{
    model_part_copy(kctx_cpu(), p, part, whole, to_whole);
}

void model_shard_slice(const struct model *m, const float *whole, float *local)
{
    const struct model_shard one = model_shard_of(&m->cfg, 0, 1, 0, 1);
    int nw, nl, hint = 0;
    struct param_ref *w = refs_of(&m->cfg, &one, (float *)whole, &nw);
    struct param_ref *l = refs_of(&m->cfg, &m->sh, local, &nl);
    for (int i = 0; i < nl; i++)
        copy_part(&l[i], l[i].data, model_whole_ref(w, nw, &l[i], &hint)->data, false);
    free(w);
    free(l);
}

/* Copy the parts that mp rank r (TP rank r % TP of stage r / TP) owns, laid out in its buffer part, to their
 * places in the whole tensors w (nw of them): every element of the whole model has exactly one owner. */
static void place_owned(const struct model *m, int r, const float *part, const struct param_ref *w, int nw)
{
    struct model_shard sh = model_shard_of_mp(m, r);
    int n, hint = 0;
    struct param_ref *l = refs_of(&m->cfg, &sh, (float *)part, &n);
    for (int i = 0; i < n; i++)
        if (l[i].owner)
            copy_part(&l[i], l[i].data, model_whole_ref(w, nw, &l[i], &hint)->data, true);
    free(l);
}

void model_shard_assemble(const struct model *m, const float *local, float *whole)
{
    const int n_mp = m->sh.tp_size * m->sh.pp_size * m->sh.ep_size;
    if (n_mp == 1) {
        memcpy(whole, local, m->w.n_floats * sizeof(float));
        return;
    }
    size_t per = 0; /* the largest part: stages and vocabulary shards differ */
    for (int r = 0; r < n_mp; r++) {
        struct model_shard sh = model_shard_of_mp(m, r);
        size_t n = model_shard_floats(&m->cfg, &sh);
        per = n > per ? n : per;
    }
    per = per ? per : 1;
    float *send = xcalloc(per, sizeof(float)), *all = xmalloc((size_t)n_mp * per * sizeof(float));
    memcpy(send, local, m->w.n_floats * sizeof(float));
    comm_allgather(m->sh.mp, send, all, per, COMM_F32);
    const struct model_shard one = model_shard_of(&m->cfg, 0, 1, 0, 1);
    int nw;
    struct param_ref *w = refs_of(&m->cfg, &one, whole, &nw);
    for (int r = 0; r < n_mp; r++)
        place_owned(m, r, all + (size_t)r * per, w, nw);
    free(w);
    free(send);
    free(all);
}

void model_shard_gather(const struct model *m, const float *local, float *whole, int root)
{
    const int n_mp = m->sh.tp_size * m->sh.pp_size * m->sh.ep_size;
    if (n_mp == 1) {
        memcpy(whole, local, m->w.n_floats * sizeof(float));
        return;
    }
    struct comm *mp = m->sh.mp;
    if (comm_rank(mp) != root) {
        comm_send(mp, local, m->w.n_floats, COMM_F32, root);
        return;
    }
    const struct model_shard one = model_shard_of(&m->cfg, 0, 1, 0, 1);
    int nw;
    struct param_ref *w = refs_of(&m->cfg, &one, whole, &nw);
    float *buf = NULL;
    for (int r = 0; r < n_mp; r++) { /* mp rank r is TP rank r % TP of stage r / TP */
        struct model_shard sh = model_shard_of_mp(m, r);
        const size_t n = model_shard_floats(&m->cfg, &sh);
        const float *part = local;
        if (r != root) {
            buf = xrealloc(buf, (n ? n : 1) * sizeof(float));
            comm_recv(mp, buf, n, COMM_F32, r);
            part = buf;
        }
        place_owned(m, r, part, w, nw);
    }
    free(buf);
    free(w);
}

static bool is_kv(const struct param_ref *r)
{
    return strstr(r->name, "k_proj") || strstr(r->name, "v_proj"); // NOLINT: name is an array
}

/* Replicated KV heads: each rank adds its KV parts' gradients at their place in a whole-KV buffer; the sum over
 * the TP group holds, at each KV head, the sum over the ranks that share it (the others left zeros there). */
static void sync_kv(struct model *m, const struct param_ref *g, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (is_kv(&g[i]))
            total += (size_t)g[i].full[0] * (size_t)g[i].full[1];
    const size_t bytes = (total ? total : 1) * sizeof(float);
    float *buf = k_calloc(m->K, bytes, KMEM_OTHER, "the replicated KV heads' gradients");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            comm_allreduce_sum(m->sh.tp, buf, total, COMM_F32);
        size_t off = 0;
        for (int i = 0; i < n; i++)
            if (is_kv(&g[i])) {
                model_part_copy(m->K, &g[i], g[i].data, buf + off, pass == 0);
                off += (size_t)g[i].full[0] * (size_t)g[i].full[1];
            }
    }
    k_free(m->K, buf, bytes, KMEM_OTHER);
}

void model_shard_sync_grads(struct model *m)
{
    const struct model_shard *sh = &m->sh;
    if (!m->grad)
        return;
    const bool qk = m->cfg.qk_norm && sh->tp; /* Qwen3's q/k norms: whole on every TP rank, each saw its heads */
    if (sh->kv_share > 1 || qk) {             /* only then are the tensors' names needed (once per optimizer step) */
        const int n = model_param_refs(m, m->grad, NULL, 0);
        struct param_ref *g = xcalloc((size_t)(n ? n : 1), sizeof *g);
        model_param_refs(m, m->grad, g, n);
        if (sh->kv_share > 1)
            sync_kv(m, g, n);
        for (int i = 0; qk && i < n; i++)
            if (strstr(g[i].name, "q_norm") || strstr(g[i].name, "k_norm")) // NOLINT: name is an array
                comm_allreduce_sum(sh->tp, g[i].data, g[i].numel, COMM_F32);
        free(g);
    }
    if (m->cfg.tie_word_embeddings && sh->pp_size > 1 && (sh->has_embed || sh->has_head)) {
        /* the first stage's embedding and the last stage's copy: both take the sum of their gradients (the same
         * float sum either way round), so the two copies stay equal */
        float *mine = sh->has_embed ? m->grad->embed : m->grad->lm_head;
        const size_t k = (size_t)(sh->vocab_hi - sh->vocab_lo) * (size_t)m->cfg.hidden_size;
        float *theirs = k_alloc(m->K, (k ? k : 1) * sizeof(float), KMEM_OTHER, "the tied embedding's gradient");
        const int peer = sh->has_embed ? sh->pp_size - 1 : 0;
        comm_sendrecv(sh->pp, mine, k, peer, theirs, k, peer, COMM_F32);
        k_add(m->K, mine, theirs, k);
        k_free(m->K, theirs, (k ? k : 1) * sizeof(float), KMEM_OTHER);
    }
}

double model_owned_sq(const struct model *m, const float *buf, size_t lo, size_t hi)
{
    const int n = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *r = xcalloc((size_t)(n ? n : 1), sizeof *r);
    model_param_refs(m, &m->w, r, n);
    double s = 0;
    for (int i = 0; i < n; i++) {
        if (!r[i].owner)
            continue;
        size_t a = (size_t)(r[i].data - m->w.mem), b = a + r[i].numel;
        a = a > lo ? a : lo;
        b = b < hi ? b : hi;
        if (a < b)
            s += k_sumsq(m->K, buf + (a - lo), b - a);
    }
    free(r);
    return s;
}

static int span_cmp(const void *a, const void *b)
{
    const size_t x = ((const size_t *)a)[0], y = ((const size_t *)b)[0];
    return (x > y) - (x < y);
}

int model_tp_unowned_spans(const struct model *m, size_t **at, size_t **len)
{
    struct model c = *m; /* a view whose ownership ignores EP: each EP rank counts what its TP and PP ranks own */
    c.sh.ep_rank = 0;
    const int n = model_param_refs(&c, &c.w, NULL, 0);
    struct param_ref *r = xcalloc((size_t)(n ? n : 1), sizeof *r);
    model_param_refs(&c, &c.w, r, n);
    size_t *sp = xcalloc(2 * (size_t)(n ? n : 1), sizeof *sp); /* (at, len) pairs */
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!r[i].owner && r[i].numel) {
            sp[2 * k] = (size_t)(r[i].data - m->w.mem);
            sp[2 * k + 1] = r[i].numel;
            k++;
        }
    qsort(sp, (size_t)k, 2 * sizeof *sp, span_cmp);
    *at = xcalloc((size_t)(k ? k : 1), sizeof **at);
    *len = xcalloc((size_t)(k ? k : 1), sizeof **len);
    for (int i = 0; i < k; i++)
        (*at)[i] = sp[2 * i], (*len)[i] = sp[2 * i + 1];
    free(sp);
    free(r);
    return k;
}

void model_set_groups(struct model *m, struct comm *tp, struct comm *pp, struct comm *mp)
{
    if (m->sh.tp)
        m->sh.tp = tp;
    if (m->sh.pp)
        m->sh.pp = pp;
    if (m->sh.mp)
        m->sh.mp = mp;
}
