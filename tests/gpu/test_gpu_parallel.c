/* Expert, sequence and context parallelism on the CUDA back-end (trainer.device=cuda's paths), under mpirun with 2
 * ranks, against the one-process run on the device, on small random models:
 *   --ep  the experts of a Qwen3-MoE and a Mixtral shape split over the 2 ranks (each rank its own sequences, as
 *         data-parallel ranks): the permuted token rows in device memory, dispatched and combined over the EP group;
 *         each rank's log-probs and entropies against a whole model's on the device, and the gradients (the dense
 *         ones summed over the ranks, the experts' held once, assembled whole) against the whole models' summed
 *         over the ranks; plain, checkpointed, and with the load-balancing loss; and the whole model on the device
 *         against the CPU back-end's (a MoE model on CUDA); and, where each rank has a GPU (a TP group's collectives
 *         run over NCCL), generation with the experts held whole over the 2 ranks as a TP group
 *         (rollout.expert_parallel_size): prefill and decode logits against the whole model's;
 *   --sp  Ulysses: each rank a slice of a packed batch's tokens, the all-to-all around attention in device memory;
 *   --cp  ring attention: each rank the load-balanced chunks of every sequence, K/V passed around the ring;
 *         for both, every row's log-probs and entropies, and the gradients summed over the ranks, against the whole
 *         model's on the same device, with and without checkpointing.
 * Every case runs with the group over MPI (the rows staged through pinned host memory: what ranks sharing a GPU
 * get) and, where each rank has a GPU of its own, again over NCCL in device memory. Bound: 1e-3 relative (the fp32
 * cuBLAS products sum in other orders than one process's over other row counts).
 * Skipped (77) without a CUDA device. Exit 0 only if every rank saw every value right. */
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
#include "worker/model/model.h"

static int g_bad;
static const double TOL = 1e-3;

static void expect_close(const char *cfg, const char *what, const float *a, const float *b, size_t n, double tol)
{
    const double e = test_rel_err_l2(a, b, n);
    if (!(e <= tol)) {
        g_bad++;
        log_error("test", "%s: %s differs from the one-process run on the device: relative %.3g > %.1g", cfg, what, e,
                  tol);
    }
}

/* A host copy of n floats of m's context. */
static float *host_of(const struct model *m, const float *p, size_t n)
{
    float *h = xmalloc((n ? n : 1) * sizeof(float));
    k_to_host(m->K, h, p, n * sizeof(float));
    return h;
}

/* Every parameter's gradient of got (host, the whole layout) against want's (host, whole's layout). */
static void expect_grads(const char *name, const char *tag, const struct model *whole, const float *got,
                         const float *want)
{
    const int nr = model_param_refs(whole, whole->grad, NULL, 0);
    struct param_ref *refs = xcalloc((size_t)nr, sizeof *refs);
    model_param_refs(whole, whole->grad, refs, nr);
    for (int i = 0; i < nr; i++) {
        char what[200];
        const size_t off = (size_t)(refs[i].data - whole->grad->mem);
        snprintf(what, sizeof what, "gradient of %s%s", refs[i].name, tag);
        expect_close(name, what, got + off, want + off, refs[i].numel, TOL);
    }
    free(refs);
}

/* A packed batch: B sequences of lens; with dp, tokens that depend on the rank (expert parallelism: each rank its
 * own sequences); kept: log-probs read from each sequence's second half only. */
struct batch {
    struct packed_batch pb;
    int32_t *ids, *tg, *pos, *cu, *from;
    float *dlogp, *dent;
};

static void batch_make(struct batch *t, int V, const int *lens, int B, int dp, bool kept)
{
    memset(t, 0, sizeof *t);
    int N = 0;
    t->cu = xcalloc((size_t)B + 1, sizeof *t->cu);
    for (int b = 0; b < B; b++)
        t->cu[b + 1] = (N += lens[b]);
    const size_t n = (size_t)(N ? N : 1);
    t->ids = xmalloc(n * sizeof *t->ids), t->tg = xmalloc(n * sizeof *t->tg), t->pos = xmalloc(n * sizeof *t->pos);
    t->dlogp = xmalloc(n * sizeof(float)), t->dent = xmalloc(n * sizeof(float));
    if (kept) {
        t->from = xmalloc((size_t)(B ? B : 1) * sizeof *t->from);
        for (int b = 0; b < B; b++)
            t->from[b] = t->cu[b] + lens[b] / 2;
    }
    for (int b = 0, i = 0; b < B; b++)
        for (int j = 0; j < lens[b]; j++, i++) {
            t->ids[i] = (int32_t)((i * 37 + 11 + dp * 13) % V);
            t->tg[i] = (int32_t)((i * 53 + 5 + dp * 7) % V);
            t->pos[i] = j;
            const bool read = !kept || i >= t->from[b];
            t->dlogp[i] = read ? (float)sin(1.0 + i + dp) : 0.0f;
            t->dent[i] = read ? (float)(0.3 * cos(2.0 + i - dp)) : 0.0f;
        }
    t->pb = (struct packed_batch){N, B, t->ids, t->tg, t->pos, t->cu, t->from, NULL, NULL};
}

static void batch_free(struct batch *t)
{
    free(t->ids), free(t->tg), free(t->pos), free(t->cu), free(t->from), free(t->dlogp), free(t->dent);
}

/* ---- expert parallelism: EP 2 over the 2 ranks (each expert held once: no sum over the ranks holding the same) */

static void ep_case(const char *name, const struct model_config *c, struct kctx *G, struct comm *world, struct comm *ep,
                    int n_seq)
{
    const int rank = comm_rank(world), P = comm_size(world);
    struct model *cpu = model_create(c);
    model_init_random(cpu, 7, 0.2);
    const struct model_layout lay = {.tp_size = 1, .pp_size = 1, .ep_rank = rank, .ep_size = P, .ep = ep};
    struct model *cpu_part = model_create_shard(c, &lay);
    model_shard_slice(cpu_part, cpu->w.mem, cpu_part->w.mem);
    struct model *whole = model_copy_to(cpu, G), *part = model_copy_to(cpu_part, G);
    model_free(cpu_part);
    int lens[3];
    for (int s = 0; s < n_seq; s++)
        lens[s] = 3 + (rank * 5 + s * 7) % 8;
    struct batch t;
    batch_make(&t, c->vocab_size, lens, n_seq, rank, false);
    const int N = t.pb.N;
    const size_t n = (size_t)(N ? N : 1), nw = cpu->w.n_floats;
    float *lw = xmalloc(n * 4), *ew = xmalloc(n * 4), *lp = xmalloc(n * 4), *ep_ = xmalloc(n * 4);
    float *assembled = xmalloc(nw * sizeof(float));
    for (int pass = 0; pass < 3; pass++) { /* plain, checkpointed, and with the load-balancing loss */
        const bool ck = pass == 1;
        whole->moe_aux_coef = part->moe_aux_coef = pass == 2 ? 0.05f : 0.0f;
        model_alloc_grads(whole), model_zero_grads(whole);
        model_alloc_grads(part), model_zero_grads(part);
        model_backward(whole, model_forward(whole, &t.pb, 0.7f, ck, lw, ew), t.dlogp, t.dent);
        model_backward(part, model_forward(part, &t.pb, 0.7f, ck, lp, ep_), t.dlogp, t.dent);
        char tag[32], what[64];
        snprintf(tag, sizeof tag, " (pass %d)", pass);
        snprintf(what, sizeof what, "log-probs%s", tag);
        expect_close(name, what, lp, lw, (size_t)N, TOL);
        snprintf(what, sizeof what, "entropies%s", tag);
        expect_close(name, what, ep_, ew, (size_t)N, TOL);
        /* the whole models' gradients summed over the ranks (data parallelism); the shards' dense ones too, the
         * experts' as they are (each held once), then assembled whole */
        float *gw = host_of(whole, whole->grad->mem, nw);
        comm_allreduce_sum(world, gw, nw, COMM_F32);
        float *gp = host_of(part, part->grad->mem, part->grad->n_floats);
        size_t at = 0;
        for (int l = 0; l < c->n_layers; l++) {
            size_t lo, hi;
            model_expert_span(part, l, &lo, &hi);
            comm_allreduce_sum(world, gp + at, lo - at, COMM_F32);
            at = hi;
        }
        comm_allreduce_sum(world, gp + at, part->grad->n_floats - at, COMM_F32);
        model_shard_assemble(part, gp, assembled);
        expect_grads(name, tag, whole, assembled, gw);
        if (pass == 0) { /* the one-process run on the device against the CPU back-end's (a MoE model on CUDA) */
            float *lc = xmalloc(n * 4), *ec = xmalloc(n * 4);
            model_alloc_grads(cpu), model_zero_grads(cpu);
            cpu->moe_aux_coef = 0.0f;
            model_backward(cpu, model_forward(cpu, &t.pb, 0.7f, false, lc, ec), t.dlogp, t.dent);
            comm_allreduce_sum(world, cpu->grad->mem, nw, COMM_F32);
            char cname[96];
            snprintf(cname, sizeof cname, "%s (one process on the device against the CPU back-end)", name);
            expect_close(cname, "log-probs", lw, lc, (size_t)N, TOL);
            expect_close(cname, "entropies", ew, ec, (size_t)N, TOL);
            expect_grads(cname, "", whole, gw, cpu->grad->mem);
            free(lc), free(ec);
        }
        free(gw), free(gp);
    }
    if (rank == 0)
        log_info("test", "%s: EP %d on %s, the group over %s: checked", name, P, G->ops->name,
                 comm_caps(ep)->device_memory ? "NCCL (device memory)" : "MPI (staged through host memory)");
    batch_free(&t);
    free(lw), free(ew), free(lp), free(ep_), free(assembled);
    model_free(whole), model_free(part), model_free(cpu);
}

/* Generation with the experts held whole over a TP group of the 2 ranks (rollout.expert_parallel_size): each rank's
 * shard on the device (its experts' local run: the offsets uploaded, the slots in device memory) gives the whole
 * model's prefill and decode logits on the device. */
static void etp_case(const char *name, const struct model_config *c, struct kctx *G, struct comm *world,
                     struct comm *tp)
{
    const int rank = comm_rank(world), T = comm_size(world), V = c->vocab_size;
    struct model *cpu = model_create(c);
    model_init_random(cpu, 9, 0.2);
    const struct model_layout lay = {
        .tp_rank = rank, .tp_size = T, .pp_size = 1, .tp = tp, .mp = tp, .ep_size = 1, .experts_over_tp = true};
    struct model *cpu_part = model_create_shard(c, &lay);
    model_shard_slice(cpu_part, cpu->w.mem, cpu_part->w.mem);
    struct model *whole = model_copy_to(cpu, G), *part = model_copy_to(cpu_part, G);
    model_free(cpu_part);
    int32_t ids[10], tg[2] = {3, 17};
    for (int i = 0; i < 10; i++)
        ids[i] = (int32_t)((i * 37 + 11) % V);
    struct kv_cache *kw[2] = {kv_cache_create(whole, 16), kv_cache_create(whole, 16)};
    struct kv_cache *kp[2] = {kv_cache_create(part, 16), kv_cache_create(part, 16)};
    int ntok[2] = {4, 6}, one[2] = {1, 1};
    float *gw = xmalloc((size_t)10 * V * sizeof(float)), *gp = xmalloc((size_t)10 * V * sizeof(float));
    model_step(whole, kw, 2, ntok, ids, gw, true);
    model_step(part, kp, 2, ntok, ids, gp, true);
    expect_close(name, "prefill logits (experts whole over TP)", gp, gw, (size_t)10 * V, TOL);
    model_step(whole, kw, 2, one, tg, gw, false);
    model_step(part, kp, 2, one, tg, gp, false);
    expect_close(name, "decode logits (experts whole over TP)", gp, gw, (size_t)2 * V, TOL);
    for (int i = 0; i < 2; i++)
        kv_cache_free(kw[i]), kv_cache_free(kp[i]);
    free(gw), free(gp);
    if (rank == 0)
        log_info("test", "%s: experts whole over TP %d on %s, the group over %s: checked", name, T, G->ops->name,
                 comm_caps(tp)->device_memory ? "NCCL (device memory)" : "MPI (staged through host memory)");
    model_free(whole), model_free(part), model_free(cpu);
}

static void check_ep(struct kctx *G, struct comm *world, struct comm *nccl)
{
    struct model_config qwen3moe = {.arch = ARCH_QWEN3_MOE,
                                    .vocab_size = 61,
                                    .hidden_size = 32,
                                    .intermediate_size = 48,
                                    .n_layers = 2,
                                    .n_heads = 4,
                                    .n_kv_heads = 2,
                                    .head_dim = 8,
                                    .rope_theta = 10000,
                                    .rms_norm_eps = 1e-6f,
                                    .qk_norm = true,
                                    .max_position_embeddings = 64,
                                    .bos_token_id = -1,
                                    .eos_token_id = -1,
                                    .n_experts = 4,
                                    .n_experts_per_tok = 2,
                                    .moe_intermediate = 16,
                                    .norm_topk_prob = true};
    struct model_config mixtral = qwen3moe;
    mixtral.arch = ARCH_MIXTRAL, mixtral.qk_norm = false, mixtral.n_experts = 8, mixtral.tie_word_embeddings = true;
    struct comm *groups[2] = {world, nccl};
    for (int i = 0; i < 2 && groups[i]; i++) {
        ep_case("qwen3-moe", &qwen3moe, G, world, groups[i], 3);
        ep_case("mixtral", &mixtral, G, world, groups[i], 2);
        /* an empty batch on the last rank: it still runs the other's slots for its experts */
        ep_case("qwen3-moe-one-rank-idle", &qwen3moe, G, world, groups[i], comm_rank(world) == 1 ? 0 : 2);
        if (comm_caps(groups[i])->device_memory) { /* a TP group on GPUs runs over NCCL (the engines' twins) */
            etp_case("qwen3-moe", &qwen3moe, G, world, groups[i]);
            etp_case("mixtral", &mixtral, G, world, groups[i]);
        }
    }
}

/* ---- sequence (Ulysses) and context (ring) parallelism over the 2 ranks */

static void sp_case(const char *name, const struct model_config *c, struct kctx *G, struct comm *sp, bool cp,
                    const int *lens, int B, bool kept)
{
    struct model *cpu = model_create(c);
    model_init_random(cpu, 7, 0.2);
    struct model *whole = model_copy_to(cpu, G), *part = model_copy_to(cpu, G);
    if (cp)
        model_set_cp(part, sp);
    else
        model_set_sp(part, sp);
    struct batch t;
    batch_make(&t, c->vocab_size, lens, B, 0, kept);
    const int N = t.pb.N;
    const size_t nw = cpu->w.n_floats;
    float *lw = xmalloc((size_t)N * 4), *ew = xmalloc((size_t)N * 4), *lp = xmalloc((size_t)N * 4);
    float *ep = xmalloc((size_t)N * 4);
    for (int ck = 0; ck < 2; ck++) {
        model_alloc_grads(whole), model_zero_grads(whole);
        model_alloc_grads(part), model_zero_grads(part);
        model_backward(whole, model_forward(whole, &t.pb, 0.7f, ck, lw, ew), t.dlogp, t.dent);
        memset(lp, 0xff, (size_t)N * 4); /* NaN: a row no rank wrote shows */
        memset(ep, 0xff, (size_t)N * 4);
        model_backward(part, model_forward(part, &t.pb, 0.7f, ck, lp, ep), t.dlogp, t.dent);
        const char *tag = ck ? " (checkpointed)" : "";
        char what[64];
        snprintf(what, sizeof what, "log-probs%s", tag);
        expect_close(name, what, lp, lw, (size_t)N, TOL);
        snprintf(what, sizeof what, "entropies%s", tag);
        expect_close(name, what, ep, ew, (size_t)N, TOL);
        float *gw = host_of(whole, whole->grad->mem, nw), *gp = host_of(part, part->grad->mem, nw);
        comm_allreduce_sum(sp, gp, nw, COMM_F32); /* each rank's gradients are its tokens' part */
        expect_grads(name, tag, whole, gp, gw);
        free(gw), free(gp);
    }
    if (comm_rank(sp) == 0)
        log_info("test", "%s: %s %d on %s, the group over %s: checked", name, cp ? "CP" : "SP", comm_size(sp),
                 G->ops->name,
                 comm_caps(sp)->device_memory ? "NCCL (device memory)" : "MPI (staged through host memory)");
    batch_free(&t);
    free(lw), free(ew), free(lp), free(ep);
    model_free(whole), model_free(part), model_free(cpu);
}

static void check_sp(struct kctx *G, struct comm *world, struct comm *nccl, bool cp)
{
    struct model_config llama = {.arch = ARCH_LLAMA,
                                 .vocab_size = 67,
                                 .hidden_size = 32,
                                 .intermediate_size = 48,
                                 .n_layers = 2,
                                 .n_heads = 4,
                                 .n_kv_heads = 2,
                                 .head_dim = 8,
                                 .rope_theta = 10000,
                                 .rms_norm_eps = 1e-5f,
                                 .max_position_embeddings = 128,
                                 .bos_token_id = -1,
                                 .eos_token_id = -1};
    struct model_config qwen3 = llama;
    qwen3.arch = ARCH_QWEN3, qwen3.qk_norm = true, qwen3.rms_norm_eps = 1e-6f;
    const int lens[4] = {11, 3, 17, 6}, tiny[1] = {2};
    struct comm *groups[2] = {world, nccl};
    for (int i = 0; i < 2 && groups[i]; i++) {
        sp_case("llama packed", &llama, G, groups[i], cp, lens, 4, false);
        sp_case("qwen3 packed, responses' log-probs", &qwen3, G, groups[i], cp, lens, 4, true);
        sp_case("llama two tokens", &llama, G, groups[i], cp, tiny, 1, false);
    }
}

int main(int argc, char **argv)
{
    if (!kctx_cuda_available()) {
        printf("no CUDA device visible: skipped\n");
        return 77;
    }
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "--ep") != 0 && strcmp(mode, "--sp") != 0 && strcmp(mode, "--cp") != 0) {
        fprintf(stderr, "usage: mpirun -np 2 test_gpu_parallel --ep | --sp | --cp\n");
        return 2;
    }
    CHECK_MPI(MPI_Init(&argc, &argv));
    check_set_fatal_hook(check_mpi_abort_hook);
    struct comm *world = comm_mpi_world();
    int ndev = kctx_cuda_devices();
    if (ndev < 1)
        ndev = 1;
    char dev[32], why[256];
    snprintf(dev, sizeof dev, "cuda:%d", comm_rank(world) % ndev);
    struct kctx *G = kctx_create(dev, KMM_F32, why, sizeof why);
    if (!G) {
        fprintf(stderr, "rank %d: %s: %s\n", comm_rank(world), dev, why);
        g_bad++;
    } else if (comm_size(world) != 2) {
        fprintf(stderr, "test_gpu_parallel runs on 2 ranks, not %d\n", comm_size(world));
        g_bad++;
    } else {
        /* NCCL needs a GPU per rank: where the ranks share one, the MPI group alone (staged through the host) */
        struct comm *nccl = ndev >= comm_size(world) ? comm_device_group(world, comm_rank(world) % ndev) : NULL;
        if (comm_rank(world) == 0)
            log_info("test", "%d GPU(s) for %d ranks: the groups over MPI%s", ndev, comm_size(world),
                     nccl ? " and NCCL" : " only (NCCL needs a GPU per rank)");
        if (strcmp(mode, "--ep") == 0)
            check_ep(G, world, nccl);
        else
            check_sp(G, world, nccl, strcmp(mode, "--cp") == 0);
        if (nccl)
            comm_free(nccl);
    }
    int bad = g_bad;
    comm_allreduce_sum(world, &bad, 1, COMM_I32);
    if (comm_rank(world) == 0)
        printf("%s: %s on CUDA over %d ranks against one process (%d problems)\n", bad ? "FAIL" : "ok", mode + 2,
               comm_size(world), bad);
    if (G)
        kctx_free(G);
    comm_free(world);
    CHECK_MPI(MPI_Finalize());
    return bad ? 1 : 0;
}
