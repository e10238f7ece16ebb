/* Expert-parallel model against data parallelism over whole models, under mpirun (every rank a DP rank, the DP
 * ranks split into EP groups of --ep): each rank runs its own sequences; the EP shards' log-probs, entropies,
 * routing statistics and gradients (the experts' summed over the ranks holding them, the rest over DP, assembled
 * whole) agree with whole models' (their gradients summed over DP) within 1e-5 relative, with and without
 * checkpointing and with the load-balancing loss on; the gradient norm counts every parameter once (and ZeRO-1's,
 * each EP rank less model_tp_unowned_spans, every expert once and the dense parameters once an EP rank); slicing and
 * assembling the weights is exact; an empty batch on one rank still serves the others' tokens; the all-to-all
 * traffic is what the routing says (remote slots x hidden x 4 bytes, each way); bad EP sizes are refused by
 * name; the device path of the dispatch and combine (rows moved by kernel ops, all-to-alls staged through host
 * memory) on a CPU-backed context that says it is a GPU gives the CPU path's values. With --tp T every DP rank is a TP
 * group of T ranks (EP x TP): each expert split over TP by intermediate rows, tokens dispatched among the EP ranks of
 * the same TP rank, the same checks. In batch-invariant mode the shards' log-probs are the whole model's bit for bit.
 * Exit 0 only if every rank saw every value right. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test_util.h"
#include "common/check.h"
#include "common/check_mpi.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "worker/comm/comm.h"
#include "worker/comm/parallel.h"
#include "worker/model/model.h"
#include "worker/trainer/optim.h"
#include "worker/trainer/zero1.h"

static int g_bad;

static void expect_close(const char *cfg, const char *what, const float *a, const float *b, size_t n, double tol)
{
    double e = test_rel_err_l2(a, b, n);
    if (!(e <= tol)) {
        g_bad++;
        log_error("test", "%s: %s differs from data parallelism over whole models: relative %.3g > %.1g", cfg, what, e,
                  tol);
    }
}

/* This DP rank's sequences: n_seq of them (0: an empty batch), their lengths and tokens depending on the rank. */
struct batch {
    struct packed_batch pb;
    int32_t *ids, *tg, *pos, *cu;
    float *dlogp, *dent;
};

static void batch_make(struct batch *b, int dp, int n_seq, int V)
{
    memset(b, 0, sizeof *b);
    b->cu = xcalloc((size_t)n_seq + 1, sizeof *b->cu);
    int N = 0;
    for (int s = 0; s < n_seq; s++)
        b->cu[s + 1] = (N += 3 + (dp * 5 + s * 7) % 8);
    const size_t n = (size_t)(N ? N : 1);
    b->ids = xmalloc(n * sizeof *b->ids), b->tg = xmalloc(n * sizeof *b->tg), b->pos = xmalloc(n * sizeof *b->pos);
    b->dlogp = xmalloc(n * sizeof(float)), b->dent = xmalloc(n * sizeof(float));
    for (int s = 0, i = 0; s < n_seq; s++)
        for (int j = 0; j < b->cu[s + 1] - b->cu[s]; j++, i++) {
            b->ids[i] = (int32_t)((i * 37 + 11 + dp * 13) % V);
            b->tg[i] = (int32_t)((i * 53 + 5 + dp * 7) % V);
            b->pos[i] = j;
            b->dlogp[i] = (float)sin(1.0 + i + dp);
            b->dent[i] = (float)(0.3 * cos(2.0 + i - dp));
        }
    b->pb = (struct packed_batch){N, n_seq, b->ids, b->tg, b->pos, b->cu, NULL, NULL, NULL};
}

static void batch_free(struct batch *b)
{
    free(b->ids), free(b->tg), free(b->pos), free(b->cu), free(b->dlogp), free(b->dent);
}

/* The gradients of an EP shard summed as the trainer does: each layer's experts over edp, the rest over dp. */
static void ep_sum(struct model *m, struct comm *dp, struct comm *edp)
{
    size_t at = 0;
    float *g = m->grad->mem;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        size_t lo, hi;
        model_expert_span(m, l, &lo, &hi);
        comm_allreduce_sum(dp, g + at, lo - at, COMM_F32);
        if (edp)
            comm_allreduce_sum(edp, g + lo, hi - lo, COMM_F32);
        at = hi;
    }
    comm_allreduce_sum(dp, g + at, m->grad->n_floats - at, COMM_F32);
}

/* ZeRO-1 under EP on a context that says it is a GPU (its packed classes, parameter block and AdamW block in the
 * context's memory; the state sharded from and gathered to host memory) against the CPU's: from the same summed
 * gradients, one clipped step gives the same norm, parameters and gathered AdamW state, and the step moved them. */
static void check_zero1_device(const char *name, struct model *part, struct model *dpart, struct kctx *dev,
                               const struct parallel_groups *g)
{
    struct kctx *H = kctx_cpu();
    const size_t n = part->w.n_floats, bytes = n * sizeof(float);
    float *ph = xmalloc(bytes), *gh = xmalloc(bytes), *back = xmalloc(bytes);
    float *pd = k_calloc(dev, bytes, KMEM_WEIGHTS, "test params"), *gd = k_calloc(dev, bytes, KMEM_GRADS, "test grads");
    memcpy(ph, part->w.mem, bytes);
    memcpy(gh, part->grad->mem, bytes);
    k_to_device(dev, pd, ph, bytes);
    k_to_device(dev, gd, gh, bytes);
    struct adamw *whole = adamw_create(n, 0.9, 0.999, 1e-8, 0.01);
    for (size_t i = 0; i < n; i++) /* a state several steps in */
        whole->m[i] = (float)(1e-3 * sin(0.3 * (double)i)), whole->v[i] = (float)(1e-6 * (1.5 + cos(0.7 * (double)i)));
    whole->t = 4;
    struct zero1 *zh = zero1_create_ep(H, g->dp, g->edp, part), *zd = zero1_create_ep(dev, g->dp, g->edp, dpart);
    struct adamw *bh = zero1_shard(zh, whole), *bd = zero1_shard(zd, whole);
    zero1_reduce_scatter(zh, gh);
    zero1_reduce_scatter(zd, gd);
    const double nh = zero1_clip(zh, 0.05, part), nd = zero1_clip(zd, 0.05, dpart);
    zero1_step(zh, bh, ph, 1e-2);
    zero1_step(zd, bd, pd, 1e-2);
    if (!(fabs(nh - nd) <= 1e-9 * nh) || !(nh > 0)) {
        g_bad++;
        log_error("test", "%s: ZeRO-1 under EP: the device path's norm %.9g, the CPU's %.9g", name, nd, nh);
    }
    k_to_host(dev, back, pd, bytes);
    expect_close(name, "ZeRO-1 under EP: the device path's stepped parameters", back, ph, n, 1e-7);
    size_t moved = 0;
    for (size_t i = 0; i < n; i++)
        moved += ph[i] != part->w.mem[i];
    if (moved < n / 2) {
        g_bad++;
        log_error("test", "%s: ZeRO-1 under EP: the step moved %zu of %zu parameters", name, moved, n);
    }
    struct adamw *sh = zero1_gather(zh, bh), *sd = zero1_gather(zd, bd);
    expect_close(name, "ZeRO-1 under EP: the device path's gathered first moments", sd->m, sh->m, n, 1e-7);
    expect_close(name, "ZeRO-1 under EP: the device path's gathered second moments", sd->v, sh->v, n, 1e-7);
    if (sd->t != sh->t || sh->t != 5) {
        g_bad++;
        log_error("test", "%s: ZeRO-1 under EP: steps %lld (device) and %lld (CPU), not 5", name, (long long)sd->t,
                  (long long)sh->t);
    }
    adamw_free(sh), adamw_free(sd), adamw_free(bh), adamw_free(bd), adamw_free(whole);
    zero1_free(zh), zero1_free(zd);
    k_free(dev, pd, bytes, KMEM_WEIGHTS), k_free(dev, gd, bytes, KMEM_GRADS);
    free(ph), free(gh), free(back);
}

/* Batch-invariant mode (docs/training.md): the shards' log-probs are the whole model's bit for bit, each expert's
 * column groups sent home apart and combined there as one process combines them (moe_ep.c). */
static void check_batch_invariant(const char *name, struct model *whole, struct model *part, const struct batch *b)
{
    const int N = b->pb.N;
    const size_t n = (size_t)(N ? N : 1);
    float *lw = xmalloc(n * sizeof(float)), *lp = xmalloc(n * sizeof(float));
    whole->moe_aux_coef = part->moe_aux_coef = 0.0f;
    k_set_batch_invariant(true);
    model_acts_free(model_forward(whole, &b->pb, 0.7f, false, lw, NULL));
    model_acts_free(model_forward(part, &b->pb, 0.7f, false, lp, NULL));
    k_set_batch_invariant(false);
    if (memcmp(lp, lw, (size_t)N * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: in batch-invariant mode the log-probs are not the whole model's bits", name);
    }
    free(lw), free(lp);
}

static void check_config(const char *name, const struct model_config *c, const struct parallel_groups *g, int n_seq)
{
    const int dp = g->at.dp_rank, E = c->n_experts, D = c->hidden_size, L = c->n_layers;
    struct model *whole = model_create(c);
    model_init_random(whole, 7, 0.2);
    const int T = g->at.tp_size;
    const struct model_layout lay = {.tp_rank = g->at.tp_rank,
                                     .tp_size = T,
                                     .pp_size = 1,
                                     .tp = g->tp,
                                     .mp = g->etp,
                                     .ep_rank = g->at.ep_rank,
                                     .ep_size = g->at.ep_size,
                                     .ep = g->ep};
    struct model *part = model_create_shard(c, &lay);
    model_shard_slice(part, whole->w.mem, part->w.mem);
    /* the device path (moe_ep.c: the rows in the context's memory, moved by its kernel ops, the local run's order,
     * offsets and positions uploaded, the all-to-alls staged through host memory over this MPI group) on a context
     * that says it is a GPU but runs the CPU's ops in host memory: the same values as the CPU path */
    struct kctx dev = *kctx_cpu();
    dev.device = KDEV_CUDA;
    memset(&dev.mem, 0, sizeof dev.mem);
    struct model *dpart = model_copy_to(part, &dev);
    float *back = xmalloc(whole->w.n_floats * sizeof(float));
    model_shard_assemble(part, part->w.mem, back);
    if (memcmp(back, whole->w.mem, whole->w.n_floats * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: slice + assemble over EP does not give the whole weights back", name);
    }
    memset(back, 0, whole->w.n_floats * sizeof(float));
    model_shard_gather(part, part->w.mem, comm_rank(part->sh.mp) == 0 ? back : NULL, 0);
    if (comm_rank(part->sh.mp) == 0 && memcmp(back, whole->w.mem, whole->w.n_floats * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: slice + gather over EP does not give the whole weights back", name);
    }
    if (T == 1 &&
        part->w.n_floats != whole->w.n_floats - (size_t)L * 3 * (E - E / g->at.ep_size) * c->moe_intermediate * D) {
        g_bad++;
        log_error("test", "%s: the EP shard holds %zu floats, not the whole's less the other ranks' experts", name,
                  part->w.n_floats);
    }
    struct batch b;
    batch_make(&b, dp, n_seq, c->vocab_size);
    const int N = b.pb.N;
    const size_t n = (size_t)(N ? N : 1);
    float *lw = xmalloc(n * sizeof(float)), *ew = xmalloc(n * sizeof(float));
    float *lp = xmalloc(n * sizeof(float)), *ep = xmalloc(n * sizeof(float));
    double *tw = xcalloc((size_t)L * E, sizeof(double)), *tp = xcalloc((size_t)L * E, sizeof(double));
    for (int pass = 0; pass < 3; pass++) { /* plain, checkpointed, and with the load-balancing loss */
        const bool ck = pass == 1;
        whole->moe_aux_coef = part->moe_aux_coef = pass == 2 ? 0.05f : 0.0f;
        model_alloc_grads(whole), model_zero_grads(whole);
        model_alloc_grads(part), model_zero_grads(part);
        model_backward(whole, model_forward(whole, &b.pb, 0.7f, ck, lw, ew), b.dlogp, b.dent);
        struct comm_traffic t0, t1;
        comm_traffic(g->ep, &t0);
        model_backward(part, model_forward(part, &b.pb, 0.7f, ck, lp, ep), b.dlogp, b.dent);
        comm_traffic(g->ep, &t1);
        char what[160];
        {
            float *dl = xmalloc(n * sizeof(float)), *de = xmalloc(n * sizeof(float));
            dpart->moe_aux_coef = part->moe_aux_coef;
            model_alloc_grads(dpart), model_zero_grads(dpart);
            model_backward(dpart, model_forward(dpart, &b.pb, 0.7f, ck, dl, de), b.dlogp, b.dent);
            snprintf(what, sizeof what, "the device path's log-probs (pass %d)", pass);
            expect_close(name, what, dl, lp, (size_t)N, 1e-6);
            snprintf(what, sizeof what, "the device path's entropies (pass %d)", pass);
            expect_close(name, what, de, ep, (size_t)N, 1e-6);
            snprintf(what, sizeof what, "the device path's gradients (pass %d)", pass);
            expect_close(name, what, dpart->grad->mem, part->grad->mem, part->grad->n_floats, 1e-6);
            free(dl), free(de);
        }
        snprintf(what, sizeof what, "log-probs (pass %d)", pass);
        expect_close(name, what, lp, lw, (size_t)N, 1e-5);
        snprintf(what, sizeof what, "entropies (pass %d)", pass);
        expect_close(name, what, ep, ew, (size_t)N, 1e-5);
        double aw, ap;
        const int fw = model_moe_stats(whole, tw, &aw), fp = model_moe_stats(part, tp, &ap);
        if (fw != fp || memcmp(tw, tp, (size_t)L * E * sizeof(double)) != 0 ||
            !(fabs(aw - ap) <= 1e-6 * fabs(aw))) { /* the same routing; the loss up to the experts' rounding */
            g_bad++;
            log_error("test", "%s: routing statistics differ (pass %d): %d/%d layer forwards, aux %.9g/%.9g", name,
                      pass, fp, fw, ap, aw);
        }
        /* the bytes: a forward sends each layer's slots routed to another rank's experts (dispatch) and the
         * outputs of the other ranks' slots for this rank's experts (combine), hidden floats each; the backward
         * sends the same two again, and with checkpointing a third time (the recomputed forward) */
        const int per = E / g->at.ep_size;
        double sent_out = 0, mine_in = 0;
        for (int l = 0; l < L; l++)
            for (int e = 0; e < E; e++)
                if (e / per != g->at.ep_rank)
                    sent_out += tw[(size_t)l * E + e];
        double *all = xmalloc((size_t)g->at.ep_size * L * E * sizeof(double));
        comm_allgather(g->ep, tw, all, (size_t)L * E, COMM_F64);
        for (int r = 0; r < g->at.ep_size; r++)
            for (int l = 0; r != g->at.ep_rank && l < L; l++)
                for (int e = g->at.ep_rank * per; e < (g->at.ep_rank + 1) * per; e++)
                    mine_in += all[((size_t)r * L + l) * E + e];
        free(all);
        const double bytes = t1.sent_f32[COMM_OP_ALLTOALL] - t0.sent_f32[COMM_OP_ALLTOALL]; /* counted in bytes */
        const double fwd = (sent_out + mine_in) * D * 4.0, expect = fwd * (ck ? 3 : 2);
        if (fabs(bytes - expect) > 0.5) {
            g_bad++;
            log_error("test", "%s: all-to-all bytes %.0f, the routing says %.0f (pass %d)", name, bytes, expect, pass);
        } else if (dp == 0 && g->at.tp_rank == 0 && pass == 0) {
            log_info("test",
                     "%s: EP rank 0 sent %.0f bytes in the all-to-alls of one forward and backward over %d "
                     "tokens x top-%d x %d layers, as (remote slots out %.0f + in %.0f) x hidden %d x 4 B x 2 passes",
                     name, bytes, N, c->n_experts_per_tok, L, sent_out, mine_in, D);
        }
        /* data parallelism's sum for the whole models, EP's for the shards */
        comm_allreduce_sum(g->dp, whole->grad->mem, whole->grad->n_floats, COMM_F32);
        model_shard_sync_grads(part); /* under TP: the q/k norms' parts over TP */
        ep_sum(part, g->dp, g->edp);
        float *gw = xmalloc(whole->w.n_floats * sizeof(float));
        model_shard_assemble(part, part->grad->mem, gw);
        const int nr = model_param_refs(whole, whole->grad, NULL, 0);
        struct param_ref *refs = xcalloc((size_t)nr, sizeof *refs);
        model_param_refs(whole, whole->grad, refs, nr);
        for (int i = 0; i < nr; i++) {
            snprintf(what, sizeof what, "gradient of %s (pass %d)", refs[i].name, pass);
            expect_close(name, what, gw + (refs[i].data - whole->grad->mem), refs[i].data, refs[i].numel, 1e-5);
        }
        free(refs);
        double sq = model_owned_sq(part, part->grad->mem, 0, part->grad->n_floats), want_sq = 0;
        comm_allreduce_sum(part->sh.mp, &sq, 1, COMM_F64);
        for (size_t i = 0; i < whole->grad->n_floats; i++)
            want_sq += (double)whole->grad->mem[i] * whole->grad->mem[i];
        if (!(fabs(sq - want_sq) <= 1e-5 * want_sq)) {
            g_bad++;
            log_error("test", "%s: gradient norm^2 over the EP ranks %.9g, whole %.9g", name, sq, want_sq);
        }
        /* ZeRO-1's count under EP (each EP rank its own experts and a block of the dense parameters, all of them
         * over DP): an EP rank's parts less model_tp_unowned_spans, summed over its TP ranks, are its experts and the
         * dense parameters once; over EP, every expert once and the dense ones EP times */
        size_t *sa, *sl;
        const int ns = model_tp_unowned_spans(part, &sa, &sl);
        double ep_sq = 0, dense_sq = want_sq;
        for (size_t i = 0; i < part->grad->n_floats; i++)
            ep_sq += (double)part->grad->mem[i] * part->grad->mem[i];
        for (int j = 0; j < ns; j++)
            for (size_t i = sa[j]; i < sa[j] + sl[j]; i++)
                ep_sq -= (double)part->grad->mem[i] * part->grad->mem[i];
        free(sa), free(sl);
        if (part->sh.tp)
            comm_allreduce_sum(part->sh.tp, &ep_sq, 1, COMM_F64);
        comm_allreduce_sum(g->ep, &ep_sq, 1, COMM_F64);
        for (int l = 0; l < L; l++) {
            size_t lo, hi;
            model_expert_span(whole, l, &lo, &hi);
            for (size_t i = lo; i < hi; i++)
                dense_sq -= (double)whole->grad->mem[i] * whole->grad->mem[i];
        }
        const double want_ep = want_sq + (g->at.ep_size - 1) * dense_sq;
        if (!(fabs(ep_sq - want_ep) <= 1e-5 * want_ep)) {
            g_bad++;
            log_error("test", "%s: ZeRO-1's count under EP %.9g, the whole model's with the dense part %d times %.9g",
                      name, ep_sq, g->at.ep_size, want_ep);
        }
        free(gw);
        if (pass == 2)
            check_zero1_device(name, part, dpart, &dev, g);
    }
    check_batch_invariant(name, whole, part, &b);
    batch_free(&b);
    free(lw), free(ew), free(lp), free(ep), free(tw), free(tp), free(back);
    model_free(whole);
    model_free(part);
    model_free(dpart);
    if (dev.mem.allocated != 0) {
        g_bad++;
        log_error("test", "%s: the device path left %zu bytes of its context allocated", name, dev.mem.allocated);
    }
    if (comm_rank(g->world) == 0)
        log_info("test", "%s: EP %d x DP %d x TP %d checked", name, g->at.ep_size, g->at.dp_size / g->at.ep_size, T);
}

int main(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    struct comm *w = comm_mpi_world();
    int ep = comm_size(w), tp = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--ep") == 0)
            ep = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--tp") == 0)
            tp = atoi(argv[i + 1]);
    }
    struct parallel_groups g;
    const struct parallel_sizes sz = {tp, 1, 1, ep};
    if (ep < 2 || tp < 1 || parallel_groups_init_sized(&g, w, &sz) != 0 || (tp > 1) != (g.etp != NULL)) {
        fprintf(stderr, "usage: test_ep_model --ep EP [--tp T] on a multiple of EP x T ranks (EP >= 2)\n");
        return 2;
    }
    /* Qwen3-MoE: q/k norms, 4 experts, top 2 renormalised; Mixtral: 8 experts, top 2, no q/k norm */
    struct model_config qwen3moe = {.arch = ARCH_QWEN3_MOE,
                                    .vocab_size = 61,
                                    .hidden_size = 16,
                                    .intermediate_size = 24,
                                    .n_layers = 2,
                                    .n_heads = 4,
                                    .n_kv_heads = 2,
                                    .head_dim = 4,
                                    .rope_theta = 10000,
                                    .rms_norm_eps = 1e-6f,
                                    .qk_norm = true,
                                    .max_position_embeddings = 64,
                                    .bos_token_id = -1,
                                    .eos_token_id = -1,
                                    .n_experts = 4,
                                    .n_experts_per_tok = 2,
                                    .moe_intermediate = 8,
                                    .norm_topk_prob = true};
    struct model_config mixtral = qwen3moe;
    mixtral.arch = ARCH_MIXTRAL;
    mixtral.qk_norm = false;
    mixtral.n_experts = 8;
    mixtral.tie_word_embeddings = true;
    struct model_config qwen3_unnormed = qwen3moe;
    qwen3_unnormed.norm_topk_prob = false;
    check_config("qwen3-moe", &qwen3moe, &g, 3);
    check_config("mixtral", &mixtral, &g, 2);
    check_config("qwen3-moe-unnormed", &qwen3_unnormed, &g, 1);
    /* an empty batch on the last DP rank: it still runs the others' slots for its experts */
    check_config("qwen3-moe-one-rank-idle", &qwen3moe, &g, g.at.dp_rank == g.at.dp_size - 1 ? 0 : 2);
    /* layouts that cannot work are refused with the key and the numbers */
    char why[256];
    const char *key = "expert_model_parallel_size";
    struct model_config dense = qwen3moe;
    dense.n_experts = 0;
    if (model_ep_check(&qwen3moe, 3, 1, 1, key, why, sizeof why) == 0 || !strstr(why, "num_experts (4)") ||
        !strstr(why, "expert_model_parallel_size (3)")) {
        g_bad++;
        log_error("test", "4 experts over EP 3 not refused clearly: '%s'", why);
    }
    if (model_ep_check(&qwen3moe, 2, 2, 1, key, why, sizeof why) != 0) {
        g_bad++;
        log_error("test", "EP 2 with TP 2 refused: '%s'", why);
    }
    if (model_ep_check(&qwen3moe, 2, 2, 2, key, why, sizeof why) != 0) { /* EP x TP x PP */
        g_bad++;
        log_error("test", "EP 2 with TP 2 and PP 2 refused: '%s'", why);
    }
    if (model_ep_check(&qwen3moe, 2, 1, 2, key, why, sizeof why) != 0) { /* each stage's layers over its EP group */
        g_bad++;
        log_error("test", "EP with PP refused: '%s'", why);
    }
    if (model_ep_check(&dense, 2, 1, 1, key, why, sizeof why) == 0 || !strstr(why, "dense")) {
        g_bad++;
        log_error("test", "EP on a dense model not refused clearly: '%s'", why);
    }
    int bad_all = g_bad;
    comm_allreduce_sum(w, &bad_all, 1, COMM_I32);
    if (comm_rank(w) == 0)
        printf("%s: model over EP %d x DP %d x TP %d ranks (%d problems)\n", bad_all ? "FAIL" : "ok", ep,
               comm_size(w) / ep / tp, tp, bad_all);
    parallel_groups_free(&g);
    comm_free(w);
    CHECK_MPI(MPI_Finalize());
    return bad_all ? 1 : 0;
}
