/* Tensor-parallel model against the whole model, under mpirun (every rank is one TP rank of one group):
 * for Llama and Qwen2 shapes (split and replicated KV heads, tied and untied heads, q/k/v biases), the
 * vocab-parallel log-probs and entropies, the gradients of every parameter (assembled whole), the gradient norm
 * counted once per parameter, and the generation logits agree with one process's within 1e-5 (relative L2); slicing
 * and assembling the whole buffer is exact. Mixture-of-experts models (Qwen3-MoE, Mixtral) too, with the
 * load-balancing loss on: every expert split over TP by intermediate rows like the dense MLP, the router whole and
 * the same on every TP rank (its gradient the same on each, counted once). LoRA adapters sharded like the
 * projections they wrap (Llama, Qwen2 with its one KV head replicated, and the attention's adapters of a Qwen3-MoE):
 * a new adapter is the whole one's part bit for bit, slicing and gathering it is exact, and the log-probs, every
 * rank's adapter gradients (summed over TP: the parts every TP rank holds whole included), their norm counted once,
 * the merged weights and the generation logits agree with one process's. Exit 0 only if every rank saw every value
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
#include "worker/comm/parallel.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"

static int g_bad;

/* test_rel_err_l2 (float32 sums in another order differ by rounding, element by element, far below tol) */
static void expect_close(const char *cfg, const char *what, const float *a, const float *b, size_t n, double tol)
{
    double e = test_rel_err_l2(a, b, n);
    if (!(e <= tol)) {
        g_bad++;
        log_error("test", "%s: %s differs from the whole model: relative %.3g > %.1g", cfg, what, e, tol);
    }
}

/* One micro-batch through the stages: forward (activations sent on), backward (input gradients sent back). */
static void pipeline_pass(struct model *m, const struct packed_batch *pb, bool ck, float *logp, float *ent,
                          const float *dlogp, const float *dent)
{
    const struct model_shard *sh = &m->sh;
    const size_t nD = (size_t)pb->N * m->cfg.hidden_size;
    float *x = xmalloc(nD * sizeof(float)), *y = xmalloc(nD * sizeof(float));
    if (!sh->has_embed)
        comm_recv(sh->pp, x, nD, COMM_F32, sh->pp_rank - 1);
    struct model_acts *a = model_forward_stage(m, pb, 0.7f, ck, x, y, logp, ent);
    if (!sh->has_head)
        comm_send(sh->pp, y, nD, COMM_F32, sh->pp_rank + 1);
    if (!sh->has_head)
        comm_recv(sh->pp, y, nD, COMM_F32, sh->pp_rank + 1);
    model_backward_stage(m, a, dlogp, dent, y, x);
    if (!sh->has_embed)
        comm_send(sh->pp, x, nD, COMM_F32, sh->pp_rank - 1);
    if (sh->pp) { /* the last stage's log-probs to every stage */
        comm_broadcast(sh->pp, logp, (size_t)pb->N, COMM_F32, sh->pp_size - 1);
        comm_broadcast(sh->pp, ent, (size_t)pb->N, COMM_F32, sh->pp_size - 1);
    }
    free(x), free(y);
}

/* Generation on part against whole: two sequences prefilled (4 and 6 of ids), then one decode step each (tg's
 * first two); every rank gets the whole logits. */
static void check_generation(const char *name, struct model *whole, struct model *part, const int32_t *ids,
                             const int32_t *tg)
{
    const int V = whole->cfg.vocab_size;
    struct kv_cache *kw[2] = {kv_cache_create(whole, 16), kv_cache_create(whole, 16)};
    struct kv_cache *kp[2] = {kv_cache_create(part, 16), kv_cache_create(part, 16)};
    int ntok[2] = {4, 6}, one[2] = {1, 1};
    float *gw = xmalloc((size_t)10 * V * sizeof(float)), *gp = xmalloc((size_t)10 * V * sizeof(float));
    model_step(whole, kw, 2, ntok, ids, gw, true);
    model_step(part, kp, 2, ntok, ids, gp, true);
    expect_close(name, "prefill logits", gp, gw, (size_t)10 * V, 1e-5);
    model_step(whole, kw, 2, one, tg, gw, false);
    model_step(part, kp, 2, one, tg, gp, false);
    expect_close(name, "decode logits", gp, gw, (size_t)2 * V, 1e-5);
    for (int i = 0; i < 2; i++)
        kv_cache_free(kw[i]), kv_cache_free(kp[i]);
    free(gw), free(gp);
}

static void check_config(const char *name, const struct model_config *c, const struct parallel_groups *g,
                         struct comm *mp, float aux_coef)
{
    const int r = g->at.tp_rank, T = g->at.tp_size, P = g->at.pp_size;
    struct comm *tp = g->tp;
    char why[256];
    if (model_shard_check(c, T, "TP", why, sizeof why) != 0 || model_stage_check(c, P, "PP", why, sizeof why) != 0) {
        g_bad++;
        log_error("test", "%s: %s", name, why);
        return;
    }
    struct model *whole = model_create(c);
    model_init_random(whole, 7, 0.2);
    const struct model_layout lay = {r, T, g->at.pp_rank, P, tp, g->pp, mp, 0, 1, NULL, false};
    struct model *part = model_create_shard(c, &lay);
    whole->moe_aux_coef = part->moe_aux_coef = aux_coef;
    model_shard_slice(part, whole->w.mem, part->w.mem);
    /* slicing then assembling gives back the whole buffer bit for bit */
    float *back = xmalloc(whole->w.n_floats * sizeof(float));
    model_shard_assemble(part, part->w.mem, back);
    if (memcmp(back, whole->w.mem, whole->w.n_floats * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: slice + assemble does not give the whole weights back", name);
    }
    /* gathered to one rank (the last), the same */
    const int root = comm_size(mp) - 1;
    memset(back, 0, whole->w.n_floats * sizeof(float));
    model_shard_gather(part, part->w.mem, comm_rank(mp) == root ? back : NULL, root);
    if (comm_rank(mp) == root && memcmp(back, whole->w.mem, whole->w.n_floats * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: slice + gather to rank %d does not give the whole weights back", name, root);
    }
    /* a packed batch of three sequences */
    const int lens[3] = {5, 9, 3}, B = 3;
    int N = 0, cu[4] = {0};
    for (int b = 0; b < B; b++)
        cu[b + 1] = (N += lens[b]);
    int32_t *ids = xmalloc((size_t)N * sizeof *ids), *tg = xmalloc((size_t)N * sizeof *tg);
    int32_t *pos = xmalloc((size_t)N * sizeof *pos);
    float *dlogp = xmalloc((size_t)N * sizeof(float)), *dent = xmalloc((size_t)N * sizeof(float));
    for (int b = 0, i = 0; b < B; b++)
        for (int j = 0; j < lens[b]; j++, i++) {
            ids[i] = (int32_t)((i * 37 + 11) % c->vocab_size);
            tg[i] = (int32_t)((i * 53 + 5) % c->vocab_size);
            pos[i] = j;
            dlogp[i] = (float)sin(1.0 + i);
            dent[i] = (float)(0.3 * cos(2.0 + i));
        }
    struct packed_batch pb = {N, B, ids, tg, pos, cu, NULL, NULL, NULL};
    float *lw = xmalloc((size_t)N * sizeof(float)), *ew = xmalloc((size_t)N * sizeof(float));
    float *lp = xmalloc((size_t)N * sizeof(float)), *ep = xmalloc((size_t)N * sizeof(float));
    for (int ck = 0; ck < 2; ck++) {
        model_alloc_grads(whole);
        model_zero_grads(whole);
        model_alloc_grads(part);
        model_zero_grads(part);
        model_backward(whole, model_forward(whole, &pb, 0.7f, ck, lw, ew), dlogp, dent);
        pipeline_pass(part, &pb, ck, lp, ep, dlogp, dent);
        expect_close(name, "log-probs", lp, lw, (size_t)N, 1e-5);
        expect_close(name, "entropies", ep, ew, (size_t)N, 1e-5);
        model_shard_sync_grads(part);
        float *g = xmalloc(whole->w.n_floats * sizeof(float));
        model_shard_assemble(part, part->grad->mem, g);
        int n = model_param_refs(whole, whole->grad, NULL, 0);
        struct param_ref *refs = xcalloc((size_t)n, sizeof *refs);
        model_param_refs(whole, whole->grad, refs, n);
        for (int i = 0; i < n; i++) {
            char what[160];
            snprintf(what, sizeof what, "gradient of %s%s", refs[i].name, ck ? " (checkpointed)" : "");
            expect_close(name, what, g + (refs[i].data - whole->grad->mem), refs[i].data, refs[i].numel, 1e-5);
        }
        free(refs);
        if (c->n_experts && T > 1) { /* the router's gradient: the same on every TP rank, not a part of a sum */
            const float *router = part->grad->layers[part->sh.layer_lo].router;
            const size_t nr = (size_t)c->n_experts * c->hidden_size;
            float *r0 = xmalloc(nr * sizeof(float));
            memcpy(r0, router, nr * sizeof(float));
            comm_broadcast(tp, r0, nr, COMM_F32, 0);
            if (memcmp(r0, router, nr * sizeof(float)) != 0) {
                g_bad++;
                log_error("test", "%s: the router's gradient on TP rank %d differs from TP rank 0's", name, r);
            }
            free(r0);
        }
        double sq = model_owned_sq(part, part->grad->mem, 0, part->grad->n_floats), want = 0;
        comm_allreduce_sum(mp, &sq, 1, COMM_F64);
        for (size_t i = 0; i < whole->grad->n_floats; i++)
            want += (double)whole->grad->mem[i] * whole->grad->mem[i];
        if (!(fabs(sq - want) <= 1e-5 * want)) {
            g_bad++;
            log_error("test", "%s: gradient norm^2 over the TP ranks %.9g, whole %.9g", name, sq, want);
        }
        free(g);
    }
    check_generation(name, whole, part, ids, tg);
    free(ids), free(tg), free(pos), free(dlogp), free(dent), free(lw), free(ew), free(lp), free(ep), free(back);
    model_free(whole);
    model_free(part);
    if (comm_rank(mp) == 0)
        log_info("test", "%s: TP %d x PP %d checked", name, T, P);
}

/* Generation with the experts held whole over the TP group (verl's rollout.expert_parallel_size = TP): TP rank r holds
 * experts [r E / T, (r + 1) E / T) unsplit; its slice of the whole weights assembles back bit for bit, and its prefill
 * and decode logits are the whole model's. */
static void check_experts_over_tp(const char *name, const struct model_config *c, const struct parallel_groups *g)
{
    const int T = g->at.tp_size;
    struct model *whole = model_create(c);
    model_init_random(whole, 11, 0.3);
    const struct model_layout lay = {g->at.tp_rank, T, 0, 1, g->tp, NULL, g->tp, 0, 1, NULL, true};
    struct model *part = model_create_shard(c, &lay);
    if (part->sh.n_experts != c->n_experts / T || part->sh.expert_lo != g->at.tp_rank * c->n_experts / T ||
        part->sh.moe_inter != c->moe_intermediate) {
        g_bad++;
        log_error("test", "%s: TP rank %d holds experts [%d, +%d) of %d rows", name, g->at.tp_rank, part->sh.expert_lo,
                  part->sh.n_experts, part->sh.moe_inter);
    }
    model_shard_slice(part, whole->w.mem, part->w.mem);
    float *back = xmalloc(whole->w.n_floats * sizeof(float));
    model_shard_assemble(part, part->w.mem, back);
    if (memcmp(back, whole->w.mem, whole->w.n_floats * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: slice + assemble does not give the whole weights back", name);
    }
    free(back);
    int32_t ids[10], tg[2] = {3, 17};
    for (int i = 0; i < 10; i++)
        ids[i] = (int32_t)((i * 37 + 11) % c->vocab_size);
    check_generation(name, whole, part, ids, tg);
    model_free(whole);
    model_free(part);
    if (g->at.tp_rank == 0)
        log_info("test", "%s: experts whole over TP %d checked", name, T);
}

/* LoRA (rank 3, alpha 6, on targets) on shards of c against the whole model's adapter. */
static void check_lora(const char *name, const struct model_config *c, const struct parallel_groups *g, struct comm *mp,
                       unsigned targets)
{
    const int T = g->at.tp_size, P = g->at.pp_size;
    const struct model_layout lay = {g->at.tp_rank, T, g->at.pp_rank, P, g->tp, g->pp, mp, 0, 1, NULL, false};
    const struct lora_config lc = {.rank = 3, .alpha = 6, .targets = targets};
    char err[512];
    struct model *whole = model_create(c), *part = model_create_shard(c, &lay);
    model_init_random(whole, 7, 0.2);
    model_shard_slice(part, whole->w.mem, part->w.mem);
    if (lora_attach(whole, &lc, err, sizeof err) != 0 || lora_attach(part, &lc, err, sizeof err) != 0) {
        g_bad++;
        log_error("test", "%s: LoRA: %s", name, err);
        model_free(whole), model_free(part);
        return;
    }
    const size_t nw = lora_whole_floats(part), n = part->lora->n;
    if (nw != whole->lora->n) {
        g_bad++;
        log_error("test", "%s: LoRA: the whole adapter has %zu floats, a whole model's %zu", name, nw, whole->lora->n);
    }
    /* a new adapter: this rank's part of the whole one, drawn from the same seed */
    lora_init(whole, 11);
    lora_init(part, 11);
    float *back = xcalloc(nw, sizeof(float)), *mine = xcalloc(n ? n : 1, sizeof(float));
    lora_mp_gather(part, part->lora->mem, back);
    if (memcmp(back, whole->lora->mem, nw * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: LoRA: the shards' new adapter gathered is not the whole model's", name);
    }
    /* B not zero (a new adapter's is): every float of the adapter its own value, sliced, and gathered back exact */
    for (size_t i = 0; i < nw; i++)
        whole->lora->mem[i] = (float)(0.3 * sin(0.7 * (double)i + 0.1));
    lora_mp_slice(part, whole->lora->mem, part->lora->mem);
    memset(back, 0, nw * sizeof(float));
    lora_mp_gather(part, part->lora->mem, comm_rank(mp) == 0 ? back : NULL);
    if (comm_rank(mp) == 0 && memcmp(back, whole->lora->mem, nw * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: LoRA: slice + gather does not give the whole adapter back", name);
    }
    const int lens[2] = {7, 4}, B = 2;
    int N = 0, cu[3] = {0};
    for (int b = 0; b < B; b++)
        cu[b + 1] = (N += lens[b]);
    int32_t ids[11], tg[11], pos[11];
    float dlogp[11], dent[11], lw[11], ew[11], lp[11], ep[11];
    for (int b = 0, i = 0; b < B; b++)
        for (int j = 0; j < lens[b]; j++, i++) {
            ids[i] = (int32_t)((i * 29 + 3) % c->vocab_size);
            tg[i] = (int32_t)((i * 41 + 7) % c->vocab_size);
            pos[i] = j;
            dlogp[i] = (float)cos(0.5 + i);
            dent[i] = (float)(0.2 * sin(1.5 + i));
        }
    const struct packed_batch pb = {N, B, ids, tg, pos, cu, NULL, NULL, NULL};
    const struct trainable tw = model_trainable(whole), tr = model_trainable(part);
    model_trainable_zero_grads(whole);
    model_trainable_zero_grads(part);
    model_backward(whole, model_forward(whole, &pb, 0.7f, false, lw, ew), dlogp, dent);
    pipeline_pass(part, &pb, false, lp, ep, dlogp, dent);
    expect_close(name, "LoRA log-probs", lp, lw, (size_t)N, 1e-5);
    lora_sync_grads(part);
    /* every rank's parts (those every TP rank holds whole too) against the whole gradient's */
    lora_mp_slice(part, tw.grads, mine);
    int nr = lora_refs(part, tr.grads, NULL, 0);
    struct param_ref *refs = xcalloc((size_t)nr, sizeof *refs);
    lora_refs(part, tr.grads, refs, nr);
    for (int i = 0; i < nr; i++) {
        char what[160];
        snprintf(what, sizeof what, "LoRA gradient of %s", refs[i].name);
        expect_close(name, what, refs[i].data, mine + (refs[i].data - tr.grads), refs[i].numel, 1e-5);
    }
    free(refs);
    double sq = lora_owned_sq_range(part, tr.grads, 0, tr.n), want = 0;
    comm_allreduce_sum(mp, &sq, 1, COMM_F64);
    for (size_t i = 0; i < tw.n; i++)
        want += (double)tw.grads[i] * tw.grads[i];
    if (!(want > 0) || !(fabs(sq - want) <= 1e-5 * want)) {
        g_bad++;
        log_error("test", "%s: LoRA gradient norm^2 over the ranks %.9g, whole %.9g", name, sq, want);
    }
    /* the merged weights: each shard's part, gathered, are the whole model's bit for bit */
    float *mw = xmalloc(whole->w.n_floats * sizeof(float)), *mp_w = xmalloc(part->w.n_floats * sizeof(float));
    float *mg = xcalloc(whole->w.n_floats, sizeof(float));
    lora_merged_weights(whole, mw);
    lora_merged_weights(part, mp_w);
    model_shard_assemble(part, mp_w, mg);
    if (memcmp(mg, mw, whole->w.n_floats * sizeof(float)) != 0) {
        g_bad++;
        log_error("test", "%s: LoRA: the shards' merged weights are not the whole model's", name);
    }
    /* generation with the adapter (unmerged: the low-rank products on each shard) */
    if (P == 1) {
        const int V = c->vocab_size;
        struct kv_cache *kw[2] = {kv_cache_create(whole, 16), kv_cache_create(whole, 16)};
        struct kv_cache *kp[2] = {kv_cache_create(part, 16), kv_cache_create(part, 16)};
        int ntok[2] = {4, 6};
        float *gw = xmalloc((size_t)10 * V * sizeof(float)), *gp = xmalloc((size_t)10 * V * sizeof(float));
        model_step(whole, kw, 2, ntok, ids, gw, true);
        model_step(part, kp, 2, ntok, ids, gp, true);
        expect_close(name, "LoRA prefill logits", gp, gw, (size_t)10 * V, 1e-5);
        for (int i = 0; i < 2; i++)
            kv_cache_free(kw[i]), kv_cache_free(kp[i]);
        free(gw), free(gp);
    }
    free(mw), free(mp_w), free(mg), free(back), free(mine);
    model_free(whole);
    model_free(part);
    if (comm_rank(mp) == 0)
        log_info("test", "%s: LoRA under TP %d x PP %d checked", name, T, P);
}

int main(int argc, char **argv)
{
    CHECK_MPI(MPI_Init(&argc, &argv));
    struct comm *w = comm_mpi_world();
    int T = comm_size(w), P = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--tp") == 0)
            T = atoi(argv[i + 1]);
        if (strcmp(argv[i], "--pp") == 0)
            P = atoi(argv[i + 1]);
    }
    struct parallel_groups g;
    if (T * P != comm_size(w) || parallel_groups_init(&g, w, T, P) != 0) {
        fprintf(stderr, "usage: test_tp_model --tp T --pp P on T x P ranks\n");
        return 2;
    }
    /* Llama: tied head, 4 query heads over 2 KV heads (split at TP 2, replicated at TP 4), odd vocabulary */
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
    /* Qwen2: untied head, q/k/v biases, one KV head (replicated on every TP rank) */
    struct model_config qwen = llama;
    qwen.arch = ARCH_QWEN2;
    qwen.tie_word_embeddings = false;
    qwen.attention_bias = true;
    qwen.n_kv_heads = 1;
    qwen.n_heads = 4;
    qwen.vocab_size = 61;
    /* Qwen3: per-head q/k norms (whole on every TP rank, their gradients summed over TP), an explicit head_dim,
     * with Llama 3's RoPE remap */
    struct model_config qwen3 = llama;
    qwen3.arch = ARCH_QWEN3;
    qwen3.qk_norm = true;
    qwen3.head_dim = 6;
    qwen3.rope = (struct rope_scaling){ROPE_LLAMA3, 4.0, 1.0, 4.0, 4};
    /* Qwen3-MoE: 4 experts of 8 rows, top 2 renormalised, q/k norms; Mixtral: 8 experts, top 2, tied head */
    struct model_config qwen3moe = qwen3;
    qwen3moe.arch = ARCH_QWEN3_MOE;
    qwen3moe.head_dim = 4;
    qwen3moe.rope = (struct rope_scaling){0};
    qwen3moe.n_experts = 4;
    qwen3moe.n_experts_per_tok = 2;
    qwen3moe.moe_intermediate = 8;
    qwen3moe.norm_topk_prob = true;
    struct model_config mixtral = qwen3moe;
    mixtral.arch = ARCH_MIXTRAL;
    mixtral.qk_norm = false;
    mixtral.n_experts = 8;
    mixtral.norm_topk_prob = false;
    check_config("llama-tied-gqa", &llama, &g, w, 0); /* one model copy: the world is its TP x PP group */
    check_config("qwen2-bias-untied-mqa", &qwen, &g, w, 0);
    check_config("qwen3-qknorm-llama3-rope", &qwen3, &g, w, 0);
    check_config("qwen3-moe", &qwen3moe, &g, w, 0);
    check_config("qwen3-moe-aux", &qwen3moe, &g, w, 0.05f);
    check_config("mixtral-aux", &mixtral, &g, w, 0.05f);
    const unsigned attn = 1u << PROJ_Q | 1u << PROJ_K | 1u << PROJ_V | 1u << PROJ_O;
    check_lora("llama-lora-all-linear", &llama, &g, w, LORA_ALL_LINEAR);
    check_lora("qwen2-lora-all-linear", &qwen, &g, w, LORA_ALL_LINEAR);
    check_lora("qwen3-moe-lora-attention", &qwen3moe, &g, w, attn);
    if (T > 1 && P == 1) { /* generation's experts held whole over the TP group */
        check_experts_over_tp("qwen3-moe-experts-over-tp", &qwen3moe, &g);
        check_experts_over_tp("mixtral-experts-over-tp", &mixtral, &g);
    }
    if (T * P > 1) { /* the experts' adapters under TP or PP: refused naming the way out */
        const struct model_layout lay = {g.at.tp_rank, T, g.at.pp_rank, P, g.tp, g.pp, w, 0, 1, NULL, false};
        struct model *m = model_create_shard(&qwen3moe, &lay);
        const struct lora_config all = {.rank = 2, .alpha = 4, .targets = LORA_ALL_LINEAR, .router = true};
        char why[512] = "";
        if (lora_attach(m, &all, why, sizeof why) == 0 || !strstr(why, "mixture-of-experts") ||
            !strstr(why, "target_modules=[q_proj,k_proj,v_proj,o_proj]")) {
            g_bad++;
            log_error("test", "LoRA on the experts under TP %d x PP %d not refused clearly: '%s'", T, P, why);
        }
        model_free(m);
    }
    /* layouts that cannot work are refused with the key and the numbers */
    char why[256];
    struct model_config bad = llama;
    bad.n_heads = 6;
    bad.n_kv_heads = 3;
    if (model_shard_check(&bad, 4, "tensor_model_parallel_size", why, sizeof why) == 0 ||
        !strstr(why, "num_attention_heads (6)") || !strstr(why, "tensor_model_parallel_size (4)")) {
        g_bad++;
        log_error("test", "6 heads over TP 4 not refused clearly: '%s'", why);
    }
    struct model_config odd = qwen3moe; /* each expert splits over TP by its intermediate rows */
    odd.moe_intermediate = 6;
    if (model_shard_check(&odd, 4, "tensor_model_parallel_size", why, sizeof why) == 0 ||
        !strstr(why, "moe_intermediate_size (6)") || !strstr(why, "tensor_model_parallel_size (4)")) {
        g_bad++;
        log_error("test", "experts of 6 rows over TP 4 not refused clearly: '%s'", why);
    }
    int bad_all = g_bad;
    comm_allreduce_sum(w, &bad_all, 1, COMM_I32);
    if (comm_rank(w) == 0)
        printf("%s: model over TP %d x PP %d ranks (%d problems)\n", bad_all ? "FAIL" : "ok", T, P, bad_all);
    parallel_groups_free(&g);
    comm_free(w);
    CHECK_MPI(MPI_Finalize());
    return bad_all ? 1 : 0;
}
