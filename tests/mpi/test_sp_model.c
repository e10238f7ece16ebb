/* Ulysses sequence-parallel model against the whole model, under mpirun (the world is one SP group): each rank
 * runs its slice of a packed batch's tokens, with an all-to-all to every token of its share of the heads around
 * attention. For Llama (KV heads split, or replicated when fewer than the ranks), Qwen2 (biases, one KV head) and
 * Qwen3 (q/k norms) shapes, on packed batches of several sequences whose slices cut through sequences (and with
 * shared-prompt packing and log-probs read on the responses only), with and without checkpointing: every row's
 * log-probs and entropies on every rank, and the gradients of every parameter summed over the ranks, agree with
 * one process's within 1e-5 (relative L2). Heads that do not divide are refused naming the key and the numbers.
 * Mixture-of-experts models (Qwen3-MoE, Mixtral; without --pp): the same, with the load-balancing loss on and off
 * and with the rollout's experts given and replayed, and the routing statistics (tokens per expert, the
 * load-balancing loss, the tokens routed unlike the rollout) equal to the whole model's on every rank.
 * The device path (on a CPU-backed context that says it is a GPU: rows moved by kernel ops, the all-to-all or the
 * ring staged through host memory) gives the same on the packed batch.
 * With --cp: the same checks for context parallelism (model_set_cp: each sequence padded to a multiple of 2C is a
 * segment of which each rank holds the load-balanced chunks r and 2C-1-r, and attends over the ring with every
 * head; no shared-prompt batch), and the bytes each rank sent around the ring (the group's traffic counters) equal
 * ring_attn_bytes' formula for the layers' forwards, backwards and checkpointed recomputations.
 * With --memory LEN (on a world of 4): one sequence of LEN tokens through a forward and a backward at SP 1, 2 and 4
 * (groups of neighbouring ranks): each rank's activation high-water (its context's peak of activation memory)
 * falls as 1/SP within 10%, and the bytes the all-to-alls send are the planner's (plan_sp_alltoall_bytes) exactly;
 * rank 0 prints the figures; with --cp --memory LEN the same at CP 1, 2, 4 (the ring's own host buffers added to the
 * context's peak), the ring's bytes against the planner's (plan_cp_ring_bytes) and ring_attn_bytes.
 * With --pp P: the world is P pipeline stages of an SP (or CP) group each (rank = stage x SP + SP rank); each stage
 * runs its layers on its rows (model_stage_rows), passing the activation slice and its gradient to the same SP rank of
 * the next and previous stage; the same checks on every stage's parameters.
 * With --tp T (composes with --cp and --pp; a world of P x S x T ranks in Megatron's order, TP fastest, then SP or
 * CP, then PP: rank = (stage x S + SP rank) x T + TP rank): each rank holds its TP rank's shard (heads / T query heads
 * and its KV heads, a slice of the intermediate rows and of the vocabulary; under --pp its stage's layers of it), and
 * the S ranks of one TP rank share the batch as above, swapping slices of that TP rank's heads (Ulysses) or passing
 * its KV heads around the ring (--cp); the log-probs, entropies and gradients (the TP ranks' replicated parts summed,
 * then summed over the S ranks and assembled over TP x PP) agree with one process's the same way, and the bytes the
 * all-to-alls or the ring send are the planner's for the TP rank's heads. Exit 0 only if every rank saw every value
 * right. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test_util.h"
#include "common/check.h"
#include "common/check_mpi.h"
#include "common/log.h"
#include "worker/comm/comm.h"
#include "kernels/kernels.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/ring_attn.h"
#include "worker/plan/planner.h"

static int g_bad;
static bool g_cp;          /* --cp: context parallelism (ring attention) instead of Ulysses */
static struct comm *g_pp;  /* --pp P: this rank's pipeline group (the same SP rank of every stage), else NULL */
static int g_tp = 1;       /* --tp T: each rank a TP shard, the sequence shared by the ranks of one TP rank */
static struct comm *g_tpc; /* --tp T: this rank's TP group (the same stage and SP rank), else NULL */
static struct comm *g_mp;  /* --tp or --pp: the TP x PP ranks of one model copy (ranked stage x T + TP rank) */

/* A forward and a backward of b through part's stages (one stage without --pp): between stages this rank's rows
 * (its slice, or its ring chunks) of the activation and of its gradient; the last stage's log-probs and entropies
 * to every stage. */
static void part_pass(struct model *part, const struct packed_batch *b, bool ck, float *logp, float *ent,
                      const float *dlogp, const float *dent)
{
    const struct model_shard *sh = &part->sh;
    if (!g_pp) {
        model_backward(part, model_forward(part, b, 0.7f, ck, logp, ent), dlogp, dent);
        return;
    }
    const size_t nD = (size_t)model_stage_rows(part, b) * part->cfg.hidden_size;
    float *x = xmalloc((nD ? nD : 1) * sizeof(float)), *y = xmalloc((nD ? nD : 1) * sizeof(float));
    if (!sh->has_embed)
        comm_recv(g_pp, x, nD, COMM_F32, sh->pp_rank - 1);
    struct model_acts *a = model_forward_stage(part, b, 0.7f, ck, x, y, logp, ent);
    if (!sh->has_head) {
        comm_send(g_pp, y, nD, COMM_F32, sh->pp_rank + 1);
        comm_recv(g_pp, y, nD, COMM_F32, sh->pp_rank + 1);
    }
    model_backward_stage(part, a, dlogp, dent, y, x);
    if (!sh->has_embed)
        comm_send(g_pp, x, nD, COMM_F32, sh->pp_rank - 1);
    comm_broadcast(g_pp, logp, (size_t)b->N, COMM_F32, sh->pp_size - 1);
    comm_broadcast(g_pp, ent, (size_t)b->N, COMM_F32, sh->pp_size - 1);
    free(x), free(y);
}

static void expect_close(const char *cfg, const char *what, const float *a, const float *b, size_t n, double tol)
{
    double e = test_rel_err_l2(a, b, n);
    if (!(e <= tol)) {
        g_bad++;
        log_error("test", "%s: %s differs from the whole model: relative %.3g > %.1g", cfg, what, e, tol);
    }
}

/* A packed batch of B sequences of lens (prefix: sequence 1 and 2 continue sequence 0, a shared prompt; kept:
 * log-probs read from each sequence's second half only). */
struct batch {
    struct packed_batch pb;
    int32_t *ids, *tg, *pos, *cu, *from, *prefix;
    float *dlogp, *dent;
};

static void batch_make(struct batch *t, const struct model_config *c, const int *lens, int B, bool prefix, bool kept)
{
    memset(t, 0, sizeof *t);
    int N = 0;
    t->cu = xcalloc((size_t)B + 1, sizeof *t->cu);
    for (int b = 0; b < B; b++)
        t->cu[b + 1] = (N += lens[b]);
    t->ids = xmalloc((size_t)N * sizeof *t->ids);
    t->tg = xmalloc((size_t)N * sizeof *t->tg);
    t->pos = xmalloc((size_t)N * sizeof *t->pos);
    t->dlogp = xmalloc((size_t)N * sizeof(float));
    t->dent = xmalloc((size_t)N * sizeof(float));
    if (prefix) {
        t->prefix = xmalloc((size_t)B * sizeof *t->prefix);
        for (int b = 0; b < B; b++)
            t->prefix[b] = b == 1 || b == 2 ? 0 : -1;
    }
    if (kept) {
        t->from = xmalloc((size_t)B * sizeof *t->from);
        for (int b = 0; b < B; b++)
            t->from[b] = t->cu[b] + lens[b] / 2;
    }
    for (int b = 0, i = 0; b < B; b++)
        for (int j = 0; j < lens[b]; j++, i++) {
            t->ids[i] = (int32_t)((i * 37 + 11) % c->vocab_size);
            t->tg[i] = (int32_t)((i * 53 + 5) % c->vocab_size);
            t->pos[i] = (prefix && (b == 1 || b == 2) ? lens[0] : 0) + j;
            const bool read = !kept || i >= t->from[b];
            t->dlogp[i] = read ? (float)sin(1.0 + i) : 0.0f;
            t->dent[i] = read ? (float)(0.3 * cos(2.0 + i)) : 0.0f;
        }
    t->pb = (struct packed_batch){N, B, t->ids, t->tg, t->pos, t->cu, t->from, t->prefix, NULL};
}

static void batch_free(struct batch *t)
{
    free(t->ids), free(t->tg), free(t->pos), free(t->cu), free(t->from), free(t->prefix), free(t->dlogp), free(t->dent);
}

static void check_batch(const char *name, struct model *whole, struct model *part, const struct batch *t,
                        struct comm *sp, double tol)
{
    const int N = t->pb.N;
    float *lw = xmalloc((size_t)N * sizeof(float)), *ew = xmalloc((size_t)N * sizeof(float));
    float *lp = xmalloc((size_t)N * sizeof(float)), *ep = xmalloc((size_t)N * sizeof(float));
    float *g = xmalloc(whole->w.n_floats * sizeof(float));
    for (int ck = 0; ck < 2; ck++) {
        model_alloc_grads(whole);
        model_zero_grads(whole);
        model_alloc_grads(part);
        model_zero_grads(part);
        model_backward(whole, model_forward(whole, &t->pb, 0.7f, ck, lw, ew), t->dlogp, t->dent);
        memset(lp, 0xff, (size_t)N * sizeof(float)); /* NaN: a row no rank wrote shows */
        memset(ep, 0xff, (size_t)N * sizeof(float));
        struct comm_traffic before, after;
        comm_traffic(sp, &before);
        part_pass(part, &t->pb, ck, lp, ep, t->dlogp, t->dent);
        comm_traffic(sp, &after);
        char what[200];
        if (g_cp) { /* the ring's bytes: per layer a forward and a backward, and with checkpointing a second forward */
            const int C = comm_size(sp);
            int L = 0; /* each sequence padded to a multiple of 2C */
            for (int b = 0; b < t->pb.B; b++)
                L += (t->pb.cu_seqlens[b + 1] - t->pb.cu_seqlens[b] + 2 * C - 1) / (2 * C) * (2 * C);
            const struct model_config *c = &whole->cfg;
            const double want = (part->sh.layer_hi - part->sh.layer_lo) *
                                ((ck ? 2 : 1) * ring_attn_bytes(C, L / (2 * C), part->sh.n_kv_heads, c->head_dim, 0) +
                                 ring_attn_bytes(C, L / (2 * C), part->sh.n_kv_heads, c->head_dim, 1));
            const double got = after.sent_f32[COMM_OP_SEND] - before.sent_f32[COMM_OP_SEND];
            if (got != want || want <= 0) {
                g_bad++;
                log_error("test", "%s: %.0f bytes sent around the ring%s, ring_attn_bytes says %.0f", name, got,
                          ck ? " (checkpointed)" : "", want);
            }
        }
        { /* the planner's figure (with TP: the TP rank's heads; under PP: the stage's layers): Ulysses' all-to-alls
           * summed over the group for any batch; the ring's per rank for one sequence */
            const struct model_config *c = &whole->cfg;
            const int S = comm_size(sp), nl = part->sh.layer_hi - part->sh.layer_lo;
            const int T = part->sh.tp_size; /* the MoE checks run whole models over the SP group even under --tp */
            double got = after.sent_f32[g_cp ? COMM_OP_SEND : COMM_OP_ALLTOALL] -
                         before.sent_f32[g_cp ? COMM_OP_SEND : COMM_OP_ALLTOALL];
            double want = -1;
            if (!g_cp) {
                comm_allreduce_sum(sp, &got, 1, COMM_F64);
                want = S * plan_sp_alltoall_bytes(c, N, S, T, (ck ? 2 : 1) * nl, nl);
            } else if (t->pb.B == 1) {
                want = plan_cp_ring_bytes(c, N, S, T, (ck ? 2 : 1) * nl, nl);
            }
            if (want >= 0 && fabs(got - want) > 1e-9 * (want > 1 ? want : 1)) {
                g_bad++;
                log_error("test", "%s: %.0f bytes sent %s%s, the planner says %.0f", name, got,
                          g_cp ? "around the ring by this rank" : "in the all-to-alls over the group",
                          ck ? " (checkpointed)" : "", want);
            }
        }
        snprintf(what, sizeof what, "log-probs%s", ck ? " (checkpointed)" : "");
        expect_close(name, what, lp, lw, (size_t)N, tol);
        snprintf(what, sizeof what, "entropies%s", ck ? " (checkpointed)" : "");
        expect_close(name, what, ep, ew, (size_t)N, tol);
        /* each rank's gradients are its tokens' part: summed over the group, the whole batch's (under --tp or --pp
         * each shard's, the TP ranks' replicated parts and the tied embedding's two copies summed, assembled over
         * TP x PP) */
        if (g_mp) {
            model_shard_sync_grads(part);
            model_shard_assemble(part, part->grad->mem, g);
        } else {
            memcpy(g, part->grad->mem, whole->w.n_floats * sizeof(float));
        }
        comm_allreduce_sum(sp, g, whole->w.n_floats, COMM_F32);
        int n = model_param_refs(whole, whole->grad, NULL, 0);
        struct param_ref *refs = xcalloc((size_t)n, sizeof *refs);
        model_param_refs(whole, whole->grad, refs, n);
        for (int i = 0; i < n; i++) {
            snprintf(what, sizeof what, "gradient of %s%s", refs[i].name, ck ? " (checkpointed)" : "");
            expect_close(name, what, g + (refs[i].data - whole->grad->mem), refs[i].data, refs[i].numel, tol);
        }
        free(refs);
    }
    free(lw), free(ew), free(lp), free(ep), free(g);
}

/* A LoRA adapter (rank 3 on every projection, B not zero so that every A has a gradient) on a whole model and on the
 * same model over the group: the log-probs and entropies, and the adapter's gradients summed over the ranks, agree
 * with the whole model's, with and without checkpointing, and checkpointed with the layer inputs offloaded (each
 * rank's token slice in host memory). */
static void check_lora(const char *name, struct model *whole, struct model *part, const struct batch *t,
                       struct comm *sp)
{
    const struct lora_config lc = {.rank = 3, .alpha = 6, .targets = LORA_ALL_LINEAR};
    char err[256];
    struct model *ms[2] = {whole, part};
    for (int i = 0; i < 2; i++) {
        if (lora_attach(ms[i], &lc, err, sizeof err) != 0) {
            g_bad++;
            log_error("test", "%s: %s", name, err);
            if (i == 1) /* the whole model's adapter would stay for the checks after this one */
                lora_detach(whole);
            return;
        }
        struct lora *a = ms[i]->lora;
        for (size_t k = 0; k < a->n; k++) /* CPU context: the adapter is host memory */
            a->mem[k] = (float)(0.2 * sin(0.37 * (double)k + 1.0));
    }
    const int N = t->pb.N;
    float *lw = xmalloc((size_t)N * sizeof(float)), *ew = xmalloc((size_t)N * sizeof(float));
    float *lp = xmalloc((size_t)N * sizeof(float)), *ep = xmalloc((size_t)N * sizeof(float));
    const size_t n = whole->lora->n;
    float *g = xmalloc((n ? n : 1) * sizeof(float));
    for (int mode = 0; mode < 3; mode++) { /* plain, checkpointed, checkpointed with offload */
        const bool ck = mode > 0;
        model_set_activation_offload(part, mode == 2);
        const struct trainable tw = model_trainable(whole), tp = model_trainable(part);
        model_trainable_zero_grads(whole);
        model_trainable_zero_grads(part);
        model_backward(whole, model_forward(whole, &t->pb, 0.7f, ck, lw, ew), t->dlogp, t->dent);
        memset(lp, 0xff, (size_t)N * sizeof(float));
        memset(ep, 0xff, (size_t)N * sizeof(float));
        const size_t h0 = part->K->mem.host;
        struct model_acts *A = model_forward(part, &t->pb, 0.7f, ck, lp, ep);
        double host = (double)(part->K->mem.host - h0);
        model_backward(part, A, t->dlogp, t->dent);
        /* offloaded: every layer's input for this rank's rows only (a row of D floats is a whole arena piece here),
         * so the group's host bytes are one copy of the batch's rows (CP: each sequence padded to 2C chunks) */
        const struct model_config *c = &whole->cfg;
        if (mode == 2 && c->hidden_size * sizeof(float) % 64 == 0) {
            const int C = comm_size(sp);
            double rows = 0;
            for (int b = 0; b < t->pb.B; b++) {
                const int len = t->pb.cu_seqlens[b + 1] - t->pb.cu_seqlens[b];
                rows += g_cp ? (len + 2 * C - 1) / (2 * C) * (2 * C) : len;
            }
            const double want = rows * c->n_layers * c->hidden_size * sizeof(float), mine = host;
            comm_allreduce_sum(sp, &host, 1, COMM_F64);
            if (host != want || !(mine < want)) {
                g_bad++;
                log_error("test",
                          "%s: the offloaded layer inputs take %.0f bytes of host memory on this rank, %.0f over "
                          "the group; the batch's rows are %.0f bytes",
                          name, mine, host, want);
            }
        }
        static const char *const how[3] = {"", " (checkpointed)", " (checkpointed, offloaded)"};
        char what[200];
        snprintf(what, sizeof what, "LoRA log-probs%s", how[mode]);
        expect_close(name, what, lp, lw, (size_t)N, 1e-5);
        snprintf(what, sizeof what, "LoRA entropies%s", how[mode]);
        expect_close(name, what, ep, ew, (size_t)N, 1e-5);
        memcpy(g, tp.grads, n * sizeof(float));
        comm_allreduce_sum(sp, g, n, COMM_F32);
        snprintf(what, sizeof what, "LoRA adapter's gradients%s", how[mode]);
        expect_close(name, what, g, tw.grads, n, 1e-5);
        double sq = 0;
        for (size_t k = 0; k < n; k++)
            sq += (double)tw.grads[k] * tw.grads[k];
        if (!(sq > 0)) {
            g_bad++;
            log_error("test", "%s: the adapter's gradients are zero%s", name, how[mode]);
        }
    }
    model_set_activation_offload(part, false);
    lora_detach(whole);
    lora_detach(part);
    free(lw), free(ew), free(lp), free(ep), free(g);
}

static void check_config(const char *name, const struct model_config *c, struct comm *sp)
{
    char why[256];
    if ((g_cp ? model_cp_check(c, comm_size(sp), "context_parallel_size", why, sizeof why)
              : model_sp_check(c, comm_size(sp), g_tp, "ulysses_sequence_parallel_size", "tensor_model_parallel_size",
                               why, sizeof why)) != 0 ||
        model_shard_check(c, g_tp, "tensor_model_parallel_size", why, sizeof why) != 0 ||
        (g_pp && model_stage_check(c, comm_size(g_pp), "pipeline_model_parallel_size", why, sizeof why) != 0)) {
        g_bad++;
        log_error("test", "%s: %s", name, why);
        return;
    }
    struct model *whole = model_create(c);
    model_init_random(whole, 7, 0.2);
    struct model *part;
    if (g_mp) { /* this rank's TP shard of its stage's layers of the same weights */
        const struct model_layout lay = {g_tpc ? comm_rank(g_tpc) : 0,
                                         g_tp,
                                         g_pp ? comm_rank(g_pp) : 0,
                                         g_pp ? comm_size(g_pp) : 1,
                                         g_tpc,
                                         g_pp,
                                         g_mp,
                                         0,
                                         1,
                                         NULL,
                                         false};
        part = model_create_shard(c, &lay);
        model_shard_slice(part, whole->w.mem, part->w.mem);
    } else {
        part = model_clone(whole);
    }
    if (g_cp)
        model_set_cp(part, sp);
    else
        model_set_sp(part, sp);
    /* slices of 37 / S tokens cut through sequences; one sequence shorter than a slice */
    const int lens[4] = {11, 3, 17, 6};
    struct batch t;
    char what[160];
    batch_make(&t, c, lens, 4, false, false);
    snprintf(what, sizeof what, "%s packed", name);
    check_batch(what, whole, part, &t, sp, 1e-5);
    if (!g_pp) { /* the device path (the all-to-all's rows moved by kernel ops and staged through host memory over
                  * this MPI group; the ring's blocks as kernel ops) on a context that says it is a GPU but runs the
                  * CPU's ops in host memory */
        struct kctx dev = *kctx_cpu();
        dev.device = KDEV_CUDA;
        memset(&dev.mem, 0, sizeof dev.mem);
        struct model *dpart = model_copy_to(whole, &dev);
        if (g_cp)
            model_set_cp(dpart, sp);
        else
            model_set_sp(dpart, sp);
        snprintf(what, sizeof what, "%s packed, device path", name);
        check_batch(what, whole, dpart, &t, sp, 1e-5);
        model_free(dpart);
        if (dev.mem.allocated != 0) {
            g_bad++;
            log_error("test", "%s: the device path left %zu bytes of its context allocated", what, dev.mem.allocated);
        }
    }
    batch_free(&t);
    batch_make(&t, c, lens, 4, false, true);
    snprintf(what, sizeof what, "%s packed, responses' log-probs", name);
    check_batch(what, whole, part, &t, sp, 1e-5);
    snprintf(what, sizeof what, "%s packed, responses' log-probs, LoRA", name);
    if (!g_mp) /* LoRA runs on whole models (no TP shards, no pipeline stages) */
        check_lora(what, whole, part, &t, sp);
    batch_free(&t);
    if (!g_cp) { /* context parallelism runs without shared-prompt packing */
        batch_make(&t, c, lens, 4, true, true);
        snprintf(what, sizeof what, "%s shared prompt", name);
        check_batch(what, whole, part, &t, sp, 1e-5);
        batch_free(&t);
    } else { /* sequences of whole chunks (no padding) */
        const int C = comm_size(sp), even[3] = {2 * C, 6 * C, 4 * C};
        batch_make(&t, c, even, 3, false, true);
        snprintf(what, sizeof what, "%s unpadded row", name);
        check_batch(what, whole, part, &t, sp, 1e-5);
        batch_free(&t);
    }
    /* fewer tokens than ranks: some ranks hold none (a key that one query reads has a gradient of a few terms that
     * nearly cancel, which float32 sums in another order move by 1e-5 of its size: 1e-4 here) */
    const int tiny[1] = {2};
    batch_make(&t, c, tiny, 1, false, false);
    snprintf(what, sizeof what, "%s two tokens", name);
    check_batch(what, whole, part, &t, sp, 1e-4);
    batch_free(&t);
    model_free(whole);
    model_free(part);
    if (comm_rank(sp) == 0)
        log_info("test", "%s: %s %d x TP %d x PP %d checked", name, g_cp ? "CP" : "SP", comm_size(sp), g_tp,
                 g_pp ? comm_size(g_pp) : 1);
}

/* A mixture-of-experts model (routing and experts per token, on each rank's own tokens) over the group against the
 * whole model: check_batch's log-probs, entropies and gradients (the router's and the experts' summed over the
 * ranks), with the load-balancing loss off and on (its count per expert and token count the whole micro-batch's,
 * summed over the group; the ring's padding rows left out), with and without the rollout's experts replayed
 * (routes sliced like the tokens); and the routing statistics (tokens per expert, the load-balancing loss, the
 * tokens whose own choice differs from the rollout's) equal to the whole model's on every rank. */
static void check_moe(const char *name, const struct model_config *c, struct comm *sp)
{
    char why[256];
    if ((g_cp ? model_cp_check(c, comm_size(sp), "context_parallel_size", why, sizeof why)
              : model_sp_check(c, comm_size(sp), 1, "ulysses_sequence_parallel_size", "tensor_model_parallel_size", why,
                               sizeof why)) != 0) {
        g_bad++;
        log_error("test", "%s: %s", name, why);
        return;
    }
    struct model *whole = model_create(c);
    model_init_random(whole, 11, 0.3);
    struct model *part = model_clone(whole);
    if (g_cp)
        model_set_cp(part, sp);
    else
        model_set_sp(part, sp);
    const int L = c->n_layers, E = c->n_experts, k = c->n_experts_per_tok;
    const int lens[4] = {11, 3, 17, 6}, tiny[1] = {2};
    for (int shape = 0; shape < 2; shape++)
        for (int pass = 0; pass < 4; pass++) { /* aux loss off / on, x routes none / replayed; then the stats */
            struct batch t;
            batch_make(&t, c, shape ? tiny : lens, shape ? 1 : 4, false, pass & 1);
            const int N = t.pb.N;
            uint16_t *routes = NULL;
            if (pass >= 2) { /* the rollout's experts: k distinct a token and layer, not the router's own choice */
                routes = xmalloc((size_t)N * L * k * sizeof *routes);
                for (int i = 0; i < N; i++)
                    for (int l = 0; l < L; l++)
                        for (int j = 0; j < k; j++)
                            routes[((size_t)i * L + l) * k + j] = (uint16_t)((i * 3 + l + j) % E);
                t.pb.routes = routes;
            }
            whole->moe_aux_coef = part->moe_aux_coef = pass & 1 ? 0.05f : 0.0f;
            whole->moe_replay = part->moe_replay = pass == 3;
            model_moe_stats(whole, NULL, NULL), model_moe_stats(part, NULL, NULL);
            double d, n;
            model_moe_route_stats(whole, &d, &n), model_moe_route_stats(part, &d, &n);
            char what[200];
            snprintf(what, sizeof what, "%s%s%s%s", name, shape ? " two tokens" : " packed",
                     pass & 1 ? ", load-balancing loss" : "",
                     pass == 2   ? ", routes"
                     : pass == 3 ? ", replayed"
                                 : "");
            check_batch(what, whole, part, &t, sp, shape ? 1e-4 : 1e-5);
            if (!shape &&
                pass == 3) { /* LoRA on the attention, every expert and the router (once: the offload arena) */
                char lw[240];
                snprintf(lw, sizeof lw, "%s, LoRA", what);
                check_lora(lw, whole, part, &t, sp);
            }
            double *tw = xcalloc((size_t)L * E, sizeof *tw), *tp = xcalloc((size_t)L * E, sizeof *tp), aw, ap;
            const int fw = model_moe_stats(whole, tw, &aw), fp = model_moe_stats(part, tp, &ap);
            double dw, cw, dp, cpd;
            model_moe_route_stats(whole, &dw, &cw), model_moe_route_stats(part, &dp, &cpd);
            if (fw != fp || fw <= 0 || memcmp(tw, tp, (size_t)L * E * sizeof *tw) != 0 ||
                !(fabs(aw - ap) <= 1e-6 * fabs(aw)) || !(aw > 0) || dw != dp || cw != cpd ||
                (pass >= 2 && (cw <= 0 || dw <= 0))) {
                g_bad++;
                log_error("test",
                          "%s: routing statistics differ from the whole model's: %d/%d layer forwards, aux %.9g/%.9g, "
                          "differing tokens %.0f of %.0f / %.0f of %.0f, tokens of layer 0 expert 0 %.0f/%.0f",
                          what, fp, fw, ap, aw, dp, cpd, dw, cw, tp[0], tw[0]);
            }
            free(tw), free(tp), free(routes);
            batch_free(&t);
        }
    whole->moe_replay = part->moe_replay = false;
    model_free(whole);
    model_free(part);
    if (comm_rank(sp) == 0)
        log_info("test", "%s: %s %d checked", name, g_cp ? "CP" : "SP", comm_size(sp));
}

/* Activation memory and all-to-all bytes of one LEN-token sequence at SP 1, 2, 4. */
static void check_memory(struct comm *w, int len)
{
    /* 8 query heads over 4 KV heads (split at every SP here), hidden 256, eight layers: besides each layer's
     * activations (1/SP of one process's) a sequence-parallel rank holds one set of buffers for all layers, this rank's
     * tokens' q, k, v and attention output and the all-to-all's staging, and the backward's of every token of its
     * heads, about a fifth of a layer's activations at any SP */
    const struct model_config c = {.arch = ARCH_LLAMA,
                                   .vocab_size = 512,
                                   .hidden_size = 256,
                                   .intermediate_size = 512,
                                   .n_layers = 8,
                                   .n_heads = 8,
                                   .n_kv_heads = 4,
                                   .head_dim = 32,
                                   .rope_theta = 10000,
                                   .rms_norm_eps = 1e-5f,
                                   .tie_word_embeddings = true,
                                   .max_position_embeddings = len,
                                   .bos_token_id = -1,
                                   .eos_token_id = -1};
    const int lens[1] = {len};
    struct batch t;
    batch_make(&t, &c, lens, 1, false, false);
    double act1 = 0;
    for (int S = 1; S <= 4 && S <= comm_size(w); S *= 2) {
        struct comm *sp = comm_split(w, comm_rank(w) / S, comm_rank(w));
        struct model *m = model_create(&c);
        model_init_random(m, 7, 0.05);
        if (g_cp)
            model_set_cp(m, sp);
        else
            model_set_sp(m, sp);
        model_alloc_grads(m);
        struct comm_traffic before, after;
        comm_traffic(sp, &before);
        const size_t base = m->K->mem.in_use[KMEM_ACTS];
        kmem_reset_peaks(m->K);
        float *lp = xmalloc((size_t)len * sizeof(float)), *ep = xmalloc((size_t)len * sizeof(float));
        model_backward(m, model_forward(m, &t.pb, 1.0f, false, lp, ep), t.dlogp, t.dent);
        double act = (double)(m->K->mem.peak[KMEM_ACTS] - base), sent;
        comm_traffic(sp, &after);
        sent = after.sent_f32[g_cp ? COMM_OP_SEND : COMM_OP_ALLTOALL] -
               before.sent_f32[g_cp ? COMM_OP_SEND : COMM_OP_ALLTOALL];
        /* the ring's own buffers (host memory outside the context's count): the visiting K/V pair and its
         * gradients, twice, and a step's partial output, log-sum-exp and dout . out, all of the rank's n rows */
        const size_t n = (size_t)((len + 2 * S - 1) / (2 * S)) * 2, hkv = (size_t)c.n_kv_heads * c.head_dim;
        if (g_cp && S > 1)
            act += (double)(2 * 4 * n * hkv * sizeof(float) + n * (size_t)c.n_heads * c.head_dim * sizeof(float) +
                            n * (size_t)c.n_heads * (sizeof(float) + sizeof(double)));
        comm_allreduce_max(w, &act, 1, COMM_F64);
        comm_allreduce_sum(sp, &sent, 1, COMM_F64);
        /* a forward and a backward of every layer: the all-to-alls, or the ring (chunks of n / 2 rows) */
        const double want = S * (g_cp ? plan_cp_ring_bytes(&c, len, S, 1, c.n_layers, c.n_layers)
                                      : plan_sp_alltoall_bytes(&c, len, S, 1, c.n_layers, c.n_layers));
        /* the component's own count agrees (ring_attn_bytes: chunks of n / 2 rows) */
        if (g_cp && fabs(want - S * c.n_layers *
                                    (ring_attn_bytes(S, (int)n / 2, c.n_kv_heads, c.head_dim, 0) +
                                     ring_attn_bytes(S, (int)n / 2, c.n_kv_heads, c.head_dim, 1))) > 1e-6) {
            g_bad++;
            log_error("test", "CP %d: the planner's ring bytes differ from ring_attn_bytes", S);
        }
        if (fabs(sent - want) > 1e-9 * (want > 1 ? want : 1)) {
            g_bad++;
            log_error("test", "%s %d: %s sent %.0f bytes over the group, %s says %.0f", g_cp ? "CP" : "SP", S,
                      g_cp ? "the ring" : "the all-to-alls", sent, "the planner", want);
        }
        if (S == 1)
            act1 = act;
        const double ratio = act / act1;
        if (fabs(ratio * S - 1) > 0.10) {
            g_bad++;
            log_error("test", "%s %d: activation memory %.0f bytes per rank is %.3f of 1 rank's, not 1/%d within 10%%",
                      g_cp ? "CP" : "SP", S, act, ratio, S);
        }
        if (comm_rank(w) == 0)
            printf("%s %d, one sequence of %d tokens: activations %.2f MB per rank (%.3f of 1 rank's, 1/%d = %.3f); "
                   "%s %.2f MB sent per rank (%s %.2f MB)\n",
                   g_cp ? "CP" : "SP", S, len, act / 1e6, ratio, S, 1.0 / S, g_cp ? "ring" : "all-to-all",
                   sent / S / 1e6, g_cp ? "ring_attn_bytes" : "planner", want / S / 1e6);
        free(lp), free(ep);
        model_free(m);
        comm_free(sp);
    }
    batch_free(&t);
}

int main(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    struct comm *world = comm_mpi_world(), *w = world;
    g_cp = argc > 1 && strcmp(argv[1], "--cp") == 0;
    int P = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--pp") == 0)
            P = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--tp") == 0)
            g_tp = atoi(argv[i + 1]);
    }
    const int R = comm_size(world), me = comm_rank(world);
    if (P < 1 || g_tp < 1 || R % (P * g_tp) != 0) {
        if (me == 0)
            fprintf(stderr, "test_sp_model: --pp %d x --tp %d does not divide the %d ranks\n", P, g_tp, R);
        CHECK_MPI(MPI_Finalize());
        return 2;
    }
    /* Megatron's order: rank = (stage x S + SP rank) x T + TP rank; the SP group shares stage and TP rank, a
     * pipeline SP and TP rank, a TP group stage and SP rank, a model copy (TP x PP) the SP rank */
    const int S = R / (P * g_tp), stage = me / (S * g_tp), sp_rank = me / g_tp % S, tp_rank = me % g_tp;
    if (P > 1 || g_tp > 1) {
        w = comm_split(world, stage * g_tp + tp_rank, sp_rank);
        g_mp = comm_split(world, sp_rank, stage * g_tp + tp_rank);
    }
    if (P > 1)
        g_pp = comm_split(world, sp_rank * g_tp + tp_rank, stage);
    if (g_tp > 1)
        g_tpc = comm_split(world, stage * S + sp_rank, tp_rank);
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--memory") == 0) {
            check_memory(w, atoi(argv[i + 1]));
            int bad = g_bad;
            comm_allreduce_sum(w, &bad, 1, COMM_I32);
            if (comm_rank(w) == 0)
                printf("%s: activation memory and %s bytes over %s (%d problems)\n", bad ? "FAIL" : "ok",
                       g_cp ? "ring" : "all-to-all", g_cp ? "CP" : "SP", bad);
            if (w != world)
                comm_free(w);
            comm_free(world);
            CHECK_MPI(MPI_Finalize());
            return bad ? 1 : 0;
        }
    /* Llama: tied head, 4 query heads over 2 KV heads (split at SP 2, replicated at SP 4) */
    struct model_config llama = {.arch = ARCH_LLAMA,
                                 .vocab_size = 67,
                                 .hidden_size = 16,
                                 .intermediate_size = 24,
                                 .n_layers = 2,
                                 .n_heads = 4,
                                 .n_kv_heads = 2,
                                 .head_dim = 4,
                                 .rope_theta = 10000,
                                 .rms_norm_eps = 1e-5f,
                                 .tie_word_embeddings = true,
                                 .max_position_embeddings = 64,
                                 .bos_token_id = -1,
                                 .eos_token_id = -1};
    if (llama.n_heads % (S * g_tp) != 0) /* an odd group: 2 query heads a rank, KV heads split */
        llama.n_heads = 2 * S * g_tp, llama.n_kv_heads = S * g_tp;
    /* Qwen2: untied head, q/k/v biases, one KV head (replicated on every rank) */
    struct model_config qwen = llama;
    qwen.arch = ARCH_QWEN2;
    qwen.tie_word_embeddings = false;
    qwen.attention_bias = true;
    qwen.n_kv_heads = 1;
    qwen.vocab_size = 61;
    /* Qwen3: per-head q/k norms, an explicit head_dim, Llama 3's RoPE remap */
    struct model_config qwen3 = llama;
    qwen3.arch = ARCH_QWEN3;
    qwen3.qk_norm = true;
    qwen3.head_dim = 6;
    qwen3.rope = (struct rope_scaling){ROPE_LLAMA3, 4.0, 1.0, 4.0, 4};
    check_config("llama-tied-gqa", &llama, w);
    check_config("qwen2-bias-untied-mqa", &qwen, w);
    check_config("qwen3-qknorm-llama3-rope", &qwen3, w);
    if (!g_pp) { /* mixture of experts: Qwen3-MoE (4 experts, top 2 renormalised), Mixtral (8, top 2, tied) */
        struct model_config qmoe = qwen3;
        qmoe.arch = ARCH_QWEN3_MOE;
        qmoe.rope = (struct rope_scaling){0};
        qmoe.n_experts = 4, qmoe.n_experts_per_tok = 2, qmoe.moe_intermediate = 8, qmoe.norm_topk_prob = true;
        struct model_config mixtral = llama;
        mixtral.arch = ARCH_MIXTRAL;
        mixtral.n_experts = 8, mixtral.n_experts_per_tok = 2, mixtral.moe_intermediate = 6;
        check_moe("qwen3-moe", &qmoe, w);
        check_moe("mixtral", &mixtral, w);
    }
    /* heads that cannot split are refused with the key and the numbers */
    char why[256];
    if (g_cp) {
        struct model_config bad = llama;
        bad.n_heads = 6;
        bad.n_kv_heads = 4;
        if (model_cp_check(&bad, S, "actor_rollout_ref.actor.megatron.context_parallel_size", why, sizeof why) == 0 ||
            !strstr(why, "num_attention_heads (6)") || !strstr(why, "context_parallel_size")) {
            g_bad++;
            log_error("test", "6 query heads over 4 KV heads not refused clearly under CP: '%s'", why);
        }
        goto done;
    }
    struct model_config bad = llama;
    bad.n_heads = 6;
    bad.n_kv_heads = 3;
    if (model_sp_check(&bad, 4, 1, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "", why, sizeof why) ==
            0 ||
        !strstr(why, "num_attention_heads (6)") || !strstr(why, "ulysses_sequence_parallel_size (4)")) {
        g_bad++;
        log_error("test", "6 heads over SP 4 not refused clearly: '%s'", why);
    }
    bad.n_heads = 12;
    bad.n_kv_heads = 3;
    if (model_sp_check(&bad, 4, 1, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "", why, sizeof why) ==
            0 ||
        !strstr(why, "num_key_value_heads (3)") || !strstr(why, "ulysses_sequence_parallel_size (4)")) {
        g_bad++;
        log_error("test", "3 KV heads over SP 4 not refused clearly: '%s'", why);
    }
    /* under TP a TP rank's heads split over SP: 4 heads over TP 2 leave 2, not 4 */
    bad.n_heads = 4;
    bad.n_kv_heads = 2;
    if (model_sp_check(&bad, 4, 2, "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                       "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", why, sizeof why) == 0 ||
        !strstr(why, "num_attention_heads (4)") || !strstr(why, "tensor_model_parallel_size (2)") ||
        !strstr(why, "ulysses_sequence_parallel_size (4)") || !strstr(why, "2 query heads a TP rank")) {
        g_bad++;
        log_error("test", "4 heads over TP 2 x SP 4 not refused clearly: '%s'", why);
    }
    bad.n_heads = 12; /* 6 query heads a TP rank split at SP 2, but 3 KV heads a TP rank do not */
    bad.n_kv_heads = 6;
    if (model_sp_check(&bad, 2, 2, "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                       "actor_rollout_ref.actor.megatron.tensor_model_parallel_size", why, sizeof why) == 0 ||
        !strstr(why, "num_key_value_heads (6)") || !strstr(why, "3 KV heads a TP rank") ||
        !strstr(why, "ulysses_sequence_parallel_size (2)")) {
        g_bad++;
        log_error("test", "6 KV heads over TP 2 x SP 2 not refused clearly: '%s'", why);
    }
    bad.n_kv_heads = 2; /* one KV head a TP rank: replicated on both SP ranks */
    if (model_sp_check(&bad, 2, 2, "ulysses_sequence_parallel_size", "tensor_model_parallel_size", why, sizeof why) !=
        0) {
        g_bad++;
        log_error("test", "12 heads over 2 KV heads at TP 2 x SP 2 refused: '%s'", why);
    }
done:;
    int bad_all = g_bad;
    comm_allreduce_sum(world, &bad_all, 1, COMM_I32);
    if (comm_rank(world) == 0)
        printf("%s: model over %s %d ranks x TP %d x PP %d (%d problems)\n", bad_all ? "FAIL" : "ok",
               g_cp ? "CP" : "SP", S, g_tp, P, bad_all);
    if (g_pp)
        comm_free(g_pp);
    if (g_tpc)
        comm_free(g_tpc);
    if (g_mp)
        comm_free(g_mp), comm_free(w);
    comm_free(world);
    CHECK_MPI(MPI_Finalize());
    return bad_all ? 1 : 0;
}
