/* The model object: made for a layout on a kernel context (its shard's weights in one allocation, the RoPE
 * frequencies), cloned or copied to another context, its weights to and from host memory, random weights, its
 * gradients made, zeroed and given back, its base frozen, its groups (SP, CP) and hooks set, and freed. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "model_internal.h"
#include "sampler.h"
#include "worker/comm/comm.h"

void model_set_sp(struct model *m, struct comm *sp)
{
    m->sh.sp = sp && comm_size(sp) > 1 ? sp : NULL;
    m->sh.sp_rank = m->sh.sp ? comm_rank(sp) : 0;
    m->sh.sp_size = m->sh.sp ? comm_size(sp) : 1;
    m->sh.ring = false;
}

void model_set_cp(struct model *m, struct comm *cp)
{
    model_set_sp(m, cp);
    m->sh.ring = m->sh.sp != NULL;
}

void model_set_hook(struct model *m, const struct model_hook *h) { m->hook = h; }

/* Floats of the frozen norms' gradient sink: the largest norm's weight (the hidden size, or Qwen3's head_dim). */
static size_t sink_floats(const struct model *m)
{
    return (size_t)(m->cfg.hidden_size > m->cfg.head_dim ? m->cfg.hidden_size : m->cfg.head_dim);
}

void model_freeze(struct model *m, bool on)
{
    if (on && !m->frozen)
        m->sink = k_calloc(m->K, sink_floats(m) * sizeof(float), KMEM_GRADS, "the frozen norms' gradient sink");
    else if (!on && m->frozen)
        k_free(m->K, m->sink, sink_floats(m) * sizeof(float), KMEM_GRADS);
    if (!on)
        m->sink = NULL;
    m->frozen = on;
}

void model_backward_grads(struct model *m)
{
    if (!m->frozen)
        model_alloc_grads(m);
    if (m->hook && m->hook->make_grads)
        m->hook->make_grads(m);
}

void model_set_layer_grads_hook(struct model *m, void (*fn)(void *ud, int layer), void *ud)
{
    m->layer_grads_hook = fn;
    m->layer_grads_ud = ud;
}

struct model *model_create_shard(const struct model_config *c, const struct model_layout *lay)
{
    return model_create_on(c, lay, NULL);
}

struct model *model_create_on(const struct model_config *c, const struct model_layout *lay, struct kctx *K)
{
    const struct model_layout whole = {0, 1, 0, 1, NULL, NULL, NULL, 0, 1, NULL, false};
    const struct model_layout *L = lay ? lay : &whole;
    const int ep = L->ep_size > 1 ? L->ep_size : 1;
    char why[256];
    if (model_shard_check(c, L->tp_size, "the TP size", why, sizeof why) != 0 ||
        model_stage_check(c, L->pp_size, "the PP size", why, sizeof why) != 0 ||
        model_ep_check(c, ep, L->tp_size, L->pp_size, "the EP size", why, sizeof why) != 0)
        check_failf(__FILE__, __LINE__, "model_create_shard: %s", why);
    if (ep > 1 && (L->ep_rank < 0 || L->ep_rank >= ep || !L->ep || (L->tp_size > 1 && !L->mp)))
        check_failf(__FILE__, __LINE__, "model_create_shard: EP rank %d of %d, or a missing group", L->ep_rank, ep);
    if (L->tp_rank < 0 || L->tp_rank >= L->tp_size || L->pp_rank < 0 || L->pp_rank >= L->pp_size ||
        (L->tp_size > 1 && !L->tp) || (L->pp_size > 1 && (!L->pp || !L->mp)))
        check_failf(__FILE__, __LINE__, "model_create_shard: TP rank %d of %d, stage %d of %d, or a missing group",
                    L->tp_rank, L->tp_size, L->pp_rank, L->pp_size);
    struct model *m = xcalloc(1, sizeof *m);
    m->cfg = *c;
    m->sh = model_shard_of(c, L->tp_rank, L->tp_size, L->pp_rank, L->pp_size);
    m->sh.tp = L->tp_size > 1 ? L->tp : NULL;
    m->sh.pp = L->pp_size > 1 ? L->pp : NULL;
    m->sh.mp = L->pp_size > 1 ? L->mp : m->sh.tp;
    if (ep > 1) { /* the EP group holds one model copy between its ranks */
        model_shard_set_ep(&m->sh, c, L->ep_rank, ep);
        m->sh.ep = L->ep;
        /* the model copy: the EP group, or with TP or PP the EP x TP ranks of every stage (L->mp) */
        m->sh.mp = L->tp_size > 1 || L->pp_size > 1 ? L->mp : L->ep;
    }
    if (L->experts_over_tp) { /* generation's experts held whole over the TP group */
        if (!c->n_experts || L->tp_size < 2 || ep > 1 || L->pp_size > 1 || c->n_experts % L->tp_size)
            check_failf(__FILE__, __LINE__,
                        "model_create_shard: experts held whole over TP %d need a mixture of experts whose %d experts "
                        "that size divides, no EP group and no pipeline",
                        L->tp_size, c->n_experts);
        model_shard_set_experts_over_tp(&m->sh, c);
    }
    m->K = K ? K : kctx_cpu();
    if ((ep > 1 || L->experts_over_tp) && !k_has_moe_ep(m->K))
        check_failf(__FILE__, __LINE__,
                    "model_create: expert parallelism: the %s back-end has no row moves for its dispatch and combine",
                    m->K->ops->name);
    if (c->n_experts && !k_has_moe(m->K))
        check_failf(__FILE__, __LINE__,
                    "model_create: the %s back-end has no mixture-of-experts kernels yet (a %d-expert model runs on "
                    "the CPU)",
                    m->K->ops->name, c->n_experts);
    m->moe_aux_scale = 1.0f;
    model_params_alloc(m->K, KMEM_WEIGHTS, c, &m->sh, &m->w);
    const size_t nf = (size_t)(c->head_dim / 2 > 0 ? c->head_dim / 2 : 1);
    double *freqs = xcalloc(nf, sizeof(double));
    model_rope_freqs(c, freqs);
    m->rope_freqs = k_alloc(m->K, nf * sizeof(double), KMEM_WEIGHTS, "the RoPE frequencies");
    k_to_device(m->K, m->rope_freqs, freqs, nf * sizeof(double));
    free(freqs);
    return m;
}

struct model *model_create(const struct model_config *c) { return model_create_shard(c, NULL); }

struct model *model_clone(const struct model *m)
{
    const struct model_layout lay = {
        m->sh.tp_rank, m->sh.tp_size, m->sh.pp_rank, m->sh.pp_size,        m->sh.tp, m->sh.pp, m->sh.mp,
        m->sh.ep_rank, m->sh.ep_size, m->sh.ep,      m->sh.experts_over_tp};
    struct model *r = model_create_on(&m->cfg, &lay, m->K);
    k_copy(m->K, r->w.mem, m->w.mem, m->w.n_floats * sizeof(float));
    r->moe_aux_coef = m->moe_aux_coef, r->moe_aux_scale = m->moe_aux_scale;
    r->moe_replay = m->moe_replay;
    model_set_sp(r, m->sh.sp);
    r->sh.ring = m->sh.ring; /* context parallelism: the same ring */
    return r;
}

/* n bytes of src, memory of context from, into dst, memory of context to. */
static void copy_between(struct kctx *to, void *dst, struct kctx *from, const void *src, size_t n)
{
    if (from->device == KDEV_CPU) {
        k_to_device(to, dst, src, n);
    } else if (to->device == KDEV_CPU) {
        k_to_host(from, dst, src, n);
    } else { /* device to device: through the host */
        void *h = xmalloc(n ? n : 1);
        k_to_host(from, h, src, n);
        k_to_device(to, dst, h, n);
        free(h);
    }
}

struct model *model_copy_to(const struct model *m, struct kctx *K)
{
    const struct model_layout lay = {
        m->sh.tp_rank, m->sh.tp_size, m->sh.pp_rank, m->sh.pp_size,        m->sh.tp, m->sh.pp, m->sh.mp,
        m->sh.ep_rank, m->sh.ep_size, m->sh.ep,      m->sh.experts_over_tp};
    struct model *r = model_create_on(&m->cfg, &lay, K);
    copy_between(r->K, r->w.mem, m->K, m->w.mem, m->w.n_floats * sizeof(float));
    r->moe_aux_coef = m->moe_aux_coef, r->moe_aux_scale = m->moe_aux_scale;
    r->moe_replay = m->moe_replay;
    return r;
}

void model_weights_to_host(const struct model *m, float *dst)
{
    copy_between(kctx_cpu(), dst, m->K, m->w.mem, m->w.n_floats * sizeof(float));
}

void model_weights_from_host(struct model *m, const float *src)
{
    copy_between(m->K, m->w.mem, kctx_cpu(), src, m->w.n_floats * sizeof(float));
}

bool model_set_activation_offload(struct model *m, bool on)
{
    const bool was = m->offload_acts;
    m->offload_acts = on;
    return was;
}

void model_free(struct model *m)
{
    if (!m)
        return;
    model_work_free(m);
    if (m->hook && m->hook->release)
        m->hook->release(m);
    model_freeze(m, false);
    free(m->moe_tokens);
    k_free(m->K, m->rope_freqs, (size_t)(m->cfg.head_dim / 2 > 0 ? m->cfg.head_dim / 2 : 1) * sizeof(double),
           KMEM_WEIGHTS);
    model_params_free(m->K, KMEM_WEIGHTS, &m->w);
    if (m->grad) {
        model_params_free(m->K, KMEM_GRADS, m->grad);
        free(m->grad);
    }
    free(m);
}

void model_init_random(struct model *m, uint64_t seed, double std)
{
    /* drawn in host memory, then moved to the model's context */
    float *host = xcalloc(m->w.n_floats ? m->w.n_floats : 1, sizeof(float));
    int n = model_refs_over(&m->cfg, &m->sh, host, NULL, 0);
    struct param_ref *refs = xcalloc((size_t)(n > 0 ? n : 1), sizeof *refs);
    model_refs_over(&m->cfg, &m->sh, host, refs, n);
    struct rng r;
    rng_seed(&r, seed, 0x1417);
    for (int i = 0; i < n; i++) {
        const char *name = refs[i].name;
        bool norm = strstr(name, "norm") != NULL, bias = strstr(name, "bias") != NULL; // NOLINT: name is an array
        for (size_t j = 0; j < refs[i].numel; j += 2) {
            /* Box-Muller: two normals from two uniforms */
            double u1 = rng_uniform(&r), u2 = rng_uniform(&r);
            double rad = sqrt(-2.0 * log(u1 > 0 ? u1 : 1e-300));
            float z[2] = {(float)(rad * cos(2 * M_PI * u2) * std), (float)(rad * sin(2 * M_PI * u2) * std)};
            for (size_t k = 0; k < 2 && j + k < refs[i].numel; k++)
                refs[i].data[j + k] = norm ? 1.0f : (bias ? 0.0f : z[k]);
        }
    }
    model_weights_from_host(m, host);
    free(host);
    free(refs);
}

void model_alloc_grads(struct model *m)
{
    if (m->grad)
        return;
    m->grad = xcalloc(1, sizeof *m->grad);
    model_params_alloc(m->K, KMEM_GRADS, &m->cfg, &m->sh, m->grad);
}

void model_free_grads(struct model *m)
{
    if (!m->grad)
        return;
    model_params_free(m->K, KMEM_GRADS, m->grad);
    free(m->grad);
    m->grad = NULL;
}

void model_zero_grads(struct model *m)
{
    if (m->grad)
        k_zero(m->K, m->grad->mem, m->grad->n_floats * sizeof(float));
}

size_t model_num_params(const struct model *m) { return m->w.n_floats; }
