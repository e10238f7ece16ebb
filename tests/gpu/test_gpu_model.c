/* The whole model on a CUDA context against the CPU path: forward log-probs and entropies, every gradient, greedy
 * generation, and one GRPO update (actor_update: clipped loss, gradient clipping, AdamW), in fp32 GEMMs (tight
 * bounds) and BF16 GEMMs (BF16 bounds). Exits 77 without a CUDA device.
 *
 *   test_gpu_model [bundled-model-path]
 *
 * With a path (the bundled SmolLM2-135M GGUF, scripts/fetch_model.sh) it also checks that 32 greedy tokens on the
 * GPU equal the CPU's. GRPO_GPU_SMALL=1 keeps the shapes small (under compute-sanitizer). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GRPO_CUEMU
#include <cuda_runtime.h> /* cuemu_work_count */
#endif

#include "../test_util.h"
#include "common/check.h"
#include "kernels/kernels.h"
#include "worker/model/model_generate.h"
#include "worker/model/model.h"
#include "worker/model/model_io.h"
#include "worker/trainer/actor.h"
#include "worker/trainer/optim.h"

static int g_fail;

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fprintf(stderr, "\n");                                                                                     \
            g_fail++;                                                                                                  \
        }                                                                                                              \
    } while (0)

/* A packed batch of three sequences of unequal lengths. */
struct batch {
    int N, B;
    int32_t ids[256], targets[256], pos[256], cu[4];
    float dlogp[256], dent[256];
};

static void make_batch(struct batch *b, int V, int scale)
{
    const int lens[3] = {7 * scale, 12 * scale, 5 * scale};
    b->B = 3;
    b->N = 0;
    b->cu[0] = 0;
    for (int s = 0; s < 3; s++) {
        for (int t = 0; t < lens[s]; t++, b->N++) {
            b->ids[b->N] = (int32_t)((b->N * 7919 + 13) % V);
            b->targets[b->N] = (int32_t)((b->N * 104729 + 7) % V);
            b->pos[b->N] = t;
            b->dlogp[b->N] = 0.05f * (float)(b->N % 5) - 0.1f;
            b->dent[b->N] = 0.01f * (float)(b->N % 3);
        }
        b->cu[s + 1] = b->N;
    }
}

/* Forward and backward of b on m; logp, entropy and the gradients (host copies). */
static void fwd_bwd(struct model *m, const struct batch *b, float *logp, float *ent, float *grads)
{
    const struct packed_batch pb = {b->N, b->B, b->ids, b->targets, b->pos, b->cu, NULL, NULL, NULL};
    model_alloc_grads(m);
    model_zero_grads(m);
    struct model_acts *A = model_forward(m, &pb, 1.0f, false, logp, ent);
    model_backward(m, A, b->dlogp, b->dent);
    k_to_host(m->K, grads, m->grad->mem, m->grad->n_floats * sizeof(float));
}

/* The model of dir on the CPU and on K: forward and backward agree within tol (relative), max_abs_logp. */
static void check_forward_backward(const char *name, struct model *cpu, struct kctx *K, double tol_grad,
                                   double tol_logp, int scale)
{
    struct model *gpu = model_copy_to(cpu, K);
    struct batch b;
    make_batch(&b, cpu->cfg.vocab_size, scale);
    const size_t n = cpu->w.n_floats;
    float *gc = xmalloc(n * sizeof(float)), *gg = xmalloc(n * sizeof(float));
    float lc[256], lg[256], ec[256], eg[256];
    fwd_bwd(cpu, &b, lc, ec, gc);
    fwd_bwd(gpu, &b, lg, eg, gg);
    const double dl = test_max_abs_diff(lg, lc, (size_t)b.N), de = test_max_abs_diff(eg, ec, (size_t)b.N),
                 dg = test_rel_err_max(gg, gc, n);
    printf("%-24s %-5s logp %.2e entropy %.2e grads %.2e (bounds %.0e, %.0e)\n", name,
           K->matmul == KMM_BF16 ? "bf16" : "fp32", dl, de, dg, tol_logp, tol_grad);
    EXPECT(dl <= tol_logp, "%s: log-probs differ by %g", name, dl);
    EXPECT(de <= tol_logp, "%s: entropies differ by %g", name, de);
    EXPECT(dg <= tol_grad, "%s: gradients differ by %g of the largest", name, dg);
    /* the same inputs twice on the GPU: the same bits (no atomics in the reductions) */
    float *gg2 = xmalloc(n * sizeof(float)), lg2[256], eg2[256];
    fwd_bwd(gpu, &b, lg2, eg2, gg2);
    EXPECT(memcmp(gg, gg2, n * sizeof(float)) == 0 && memcmp(lg, lg2, (size_t)b.N * sizeof(float)) == 0,
           "%s: two GPU runs on the same inputs differ", name);
    free(gc), free(gg), free(gg2);
    model_free(gpu);
}

/* One GRPO update (actor_update) on the CPU and on K from the same sequences: loss, gradient norm and weights. */
static void check_grpo_step(struct model *cpu0, struct kctx *K, double tol)
{
    struct model *cpu = model_clone(cpu0), *gpu = model_copy_to(cpu0, K);
    const int V = cpu->cfg.vocab_size, n = 4;
    struct rollout_seq seqs[4][2];
    int32_t prompts[4][5], idx[4] = {0, 1, 2, 3};
    struct adamw *oc = adamw_create(cpu->w.n_floats, 0.9, 0.999, 1e-6, 0.01);
    struct adamw *og = adamw_create_on(K, gpu->w.n_floats, 0.9, 0.999, 1e-6, 0.01);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++) {
            struct rollout_seq *s = &seqs[i][k];
            memset(s, 0, sizeof *s);
            s->group = i / 2;
            s->gidx = i;
            s->prompt_len = 3 + i % 2;
            for (int t = 0; t < s->prompt_len; t++)
                prompts[i][t] = (int32_t)((i * 31 + t * 17) % V);
            s->prompt = prompts[i];
            s->resp_len = 4 + i;
            s->resp = xmalloc((size_t)s->resp_len * sizeof(int32_t));
            s->adv = xmalloc((size_t)s->resp_len * sizeof(double));
            for (int t = 0; t < s->resp_len; t++) {
                s->resp[t] = (int32_t)((i * 13 + t * 29 + 5) % V);
                s->adv[t] = i % 2 ? 1.0 : -1.0;
            }
        }
    struct update_params p = {.agg = AGG_TOKEN_MEAN,
                              .max_response_length = 16,
                              .mini_batch_seqs = n,
                              .ppo_epochs = 1,
                              .grad_clip = 1.0,
                              .lr = 1e-3,
                              .temperature = 1.0f,
                              .bt = {2, 0},
                              .old_from_current = true};
    p.loss.clip_low = p.loss.clip_high = 0.2;
    p.loss.clip_c = 3.0;
    struct rollout_seq on_cpu[4], on_gpu[4];
    for (int i = 0; i < n; i++)
        on_cpu[i] = seqs[i][0], on_gpu[i] = seqs[i][1];
    struct update_stats sc = {0}, sg = {0};
    actor_update(cpu, oc, on_cpu, idx, n, &p, &sc);
    actor_update(gpu, og, on_gpu, idx, n, &p, &sg);
    const size_t nf = cpu->w.n_floats;
    float *wg = xmalloc(nf * sizeof(float));
    model_weights_to_host(gpu, wg);
    const double dw = test_rel_err_max(wg, cpu->w.mem, nf);
    const double dloss = fabs(sg.pg_loss - sc.pg_loss) / fmax(fabs(sc.pg_loss), 1e-3);
    const double dnorm = fabs(sg.grad_norm - sc.grad_norm) / fmax(sc.grad_norm, 1e-6);
    printf("GRPO step %-5s loss %.6f / %.6f, grad norm %.6f / %.6f, weights %.2e (bound %.0e)\n",
           K->matmul == KMM_BF16 ? "bf16" : "fp32", sg.pg_loss, sc.pg_loss, sg.grad_norm, sc.grad_norm, dw, tol);
    EXPECT(dloss <= tol, "GRPO loss %g on the GPU, %g on the CPU", sg.pg_loss, sc.pg_loss);
    EXPECT(dnorm <= tol, "gradient norm %g on the GPU, %g on the CPU", sg.grad_norm, sc.grad_norm);
    EXPECT(dw <= tol, "weights after the step differ by %g of the largest", dw);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++)
            free(seqs[i][k].resp), free(seqs[i][k].adv);
    for (int i = 0; i < n; i++)
        free(on_cpu[i].old_logp), free(on_gpu[i].old_logp);
    free(wg);
    adamw_free(oc), adamw_free(og);
    model_free(cpu), model_free(gpu);
}

/* n_tokens greedy tokens from a prompt: the same on the GPU as on the CPU. */
static void check_greedy(struct model *cpu, struct kctx *K, const int32_t *prompt, int plen, int n_tokens)
{
    struct model *gpu = model_copy_to(cpu, K);
    const struct gen_params gp = {.sampling = {.temperature = 0, .top_p = 1, .top_k = 0},
                                  .max_new_tokens = n_tokens,
                                  .n_samples = 1,
                                  .max_batch = 1,
                                  .seed = 1};
    struct gen_output oc, og;
    model_generate(cpu, &prompt, &plen, 1, &gp, &oc);
    model_generate(gpu, &prompt, &plen, 1, &gp, &og);
    int same = 0;
    while (same < oc.len && same < og.len && oc.tokens[same] == og.tokens[same])
        same++;
    printf("greedy %-5s %d of %d tokens equal\n", K->matmul == KMM_BF16 ? "bf16" : "fp32", same, oc.len);
    EXPECT(K->matmul == KMM_BF16 || (same == oc.len && og.len == oc.len), "greedy tokens differ at %d", same);
    model_gen_output_free(&oc), model_gen_output_free(&og);
    model_free(gpu);
}

/* Bytes the BF16 weights cost a decode step (issue 43 item 3), counted by the back-end (struct kgemm_stats): every
 * product reads its weights from the kept BF16 copy, made once for the whole generation (4 bytes per parameter read
 * once, 2 written), so no product rounds a weight per call, and a decode step reads each parameter's 2 bytes only.
 * (Rounded per call, as before, a step read 4 bytes, wrote 2 and read those 2 again: 8.) */
static void check_decode_bytes(struct model *cpu, struct kctx *K, int n_tokens)
{
    struct model *gpu = model_copy_to(cpu, K);
    static const int32_t prompt[] = {3, 5, 7, 11};
    const int32_t *pp = prompt;
    const int plen = 4;
    const struct gen_params gp = {.sampling = {.temperature = 0, .top_p = 1, .top_k = 0},
                                  .max_new_tokens = n_tokens,
                                  .n_samples = 1,
                                  .max_batch = 1,
                                  .seed = 1};
    const struct kgemm_stats s0 = K->gemm;
    struct gen_output o;
    model_generate(gpu, &pp, &plen, 1, &gp, &o);
    const struct kgemm_stats s1 = K->gemm;
    const double n = (double)gpu->w.n_floats, steps = o.len > 0 ? o.len : 1;
    const double per_call = (double)(s1.round_bytes_weights - s0.round_bytes_weights) / n / steps;
    const double refresh = (double)(s1.kept_refresh_bytes - s0.kept_refresh_bytes) / n;
    printf("decode bf16: %d step(s): weights rounded per call %.2f bytes per parameter per step; kept copies made %llu "
           "time(s), reading %.2f bytes per parameter once; a step reads 2 bytes per parameter (was 8)\n",
           o.len, per_call, s1.kept_refreshes - s0.kept_refreshes, refresh);
    EXPECT(per_call == 0, "a decode step rounded %.2f bytes of weights per parameter", per_call);
    EXPECT(s1.kept_refreshes - s0.kept_refreshes == 1, "%llu kept copies made for one generation",
           s1.kept_refreshes - s0.kept_refreshes);
    EXPECT(k_weights_check(K) == 0, "a kept copy is stale");
    model_gen_output_free(&o);
    model_free(gpu);
}

/* The KV cache's bytes (issue 43 item 4): a BF16 context's cache holds 2-byte BF16 elements, so the KV memory the
 * context reports (KMEM_KV, what perf/max_memory_gb's kv_cache line reads) and the cache bytes a decode step reads
 * both halve against the fp32 context's. Counted from each context's KMEM_KV line around a slab of B sequences of
 * cap positions, against the model's shape (layers x (K, V) x positions x KV heads x head_dim x 4 or 2 bytes); a
 * decode step at context ctx reads each sequence's ctx cached positions and appends its new one, ctx + 1 times the
 * bytes of one position, the slab's bytes over its B cap positions. */
static void check_kv_bytes(struct model *cpu, struct kctx *f32, struct kctx *bf16)
{
    const int B = 4, cap = 16, ctx = 12;
    const struct model_config *c = &cpu->cfg;
    struct kctx *K[2] = {f32, bf16};
    double slab[2], step[2];
    for (int i = 0; i < 2; i++) {
        struct model *gpu = model_copy_to(cpu, K[i]);
        const size_t before = K[i]->mem.in_use[KMEM_KV];
        struct kv_slab *s = kv_slab_create(gpu, B, cap);
        slab[i] = (double)(K[i]->mem.in_use[KMEM_KV] - before);
        step[i] = slab[i] / ((double)B * cap) * B * (ctx + 1);
        const double want = (double)c->n_layers * 2 * cap * c->n_kv_heads * c->head_dim * B * (i ? 2 : 4);
        EXPECT(slab[i] == want, "the %s context's KV cache of %d x %d positions: %.0f bytes (its shape: %.0f)",
               i ? "bf16" : "fp32", B, cap, slab[i], want);
        kv_slab_free(s);
        EXPECT(K[i]->mem.in_use[KMEM_KV] == before, "the %s slab's KV bytes were not given back", i ? "bf16" : "fp32");
        model_free(gpu);
    }
    printf("KV cache of %d sequences x %d positions: %.0f bytes fp32, %.0f bf16; a decode step of the %d at context %d "
           "reads and appends %.0f bytes of it in fp32, %.0f in bf16\n",
           B, cap, slab[0], slab[1], B, ctx, step[0], step[1]);
    EXPECT(2 * step[1] == step[0], "a bf16 decode step's KV bytes (%.0f) are not half the fp32 step's (%.0f)", step[1],
           step[0]);
}

/* B sequences in a new slab of 16 positions each (up to 8), c[b] the caches, with prompts of 1 to 3 tokens
 * ((mul i + add) mod V) run through gpu (not a decode step); ntok[] then 1 each, ready to decode. */
static struct kv_slab *prompted_slab(struct model *gpu, int B, int mul, int add, struct kv_cache **c, int *ntok)
{
    const int V = gpu->cfg.vocab_size;
    struct kv_slab *slab = kv_slab_create(gpu, B, 16);
    int32_t ids[8 * 3];
    for (int b = 0; b < B; b++) {
        c[b] = kv_slab_slot(slab, b);
        c[b]->len = 0;
        ntok[b] = 1 + b % 3;
    }
    for (int i = 0; i < 8 * 3; i++)
        ids[i] = (int32_t)((mul * i + add) % V);
    model_step(gpu, c, B, ntok, ids, NULL, false);
    for (int b = 0; b < B; b++)
        ntok[b] = 1;
    return slab;
}

/* Batched decode (issue 43 item 4): a decode step of B sequences takes one call per layer for the KV append and the
 * attention (k_attention_decode_batched) instead of 4 launches per sequence per layer (2 copies, the split-key pass
 * and its merge); in a BF16 context over BF16 caches (the append rounds, as k_kv_store does). Against the
 * per-sequence path on the same caches: the same logits bit for bit (keys up to 256), and
 * under the emulator the device work of an eager step counted (cuemu_work_count): the batched step's does not grow
 * with B, the per-sequence step's grows by 4 per sequence per layer. Prints the launches of a decode step of 128
 * sequences by the two paths, from the counts at B = 2 and 4 (checked linear with B = 8). */
static void check_decode_batched(struct model *cpu, struct kctx *K)
{
    struct model *gpu = model_copy_to(cpu, K);
    model_set_decode_graphs(false); /* the eager steps' launches (check_decode_graph counts the graphs') */
    const int V = gpu->cfg.vocab_size, L = gpu->cfg.n_layers, Bs[3] = {2, 4, 8};
    long long work[2][3] = {{0}};
    for (int bi = 0; bi < 3; bi++) {
        const int B = Bs[bi];
        float *lg[2];
        for (int path = 0; path < 2; path++) { /* 0: per sequence, 1: batched */
            struct kv_cache *c[8];
            int ntok[8];
            int32_t ids[8 * 3];
            gpu->decode_per_sequence = path == 0;
            struct kv_slab *slab = prompted_slab(gpu, B, 7, 3, c, ntok);
            for (int i = 0; i < 8 * 3; i++) /* the decode step reads ids[0..B-1]: the prompts' own array */
                ids[i] = (int32_t)((7 * i + 3) % V);
            lg[path] = xmalloc((size_t)B * V * sizeof(float));
#ifdef GRPO_CUEMU
            const unsigned long long w0 = cuemu_work_count();
#endif
            model_step(gpu, c, B, ntok, ids, lg[path], false);
#ifdef GRPO_CUEMU
            work[path][bi] = (long long)(cuemu_work_count() - w0);
#endif
            kv_slab_free(slab);
        }
        size_t differ = 0;
        for (size_t i = 0; i < (size_t)B * V; i++)
            differ += memcmp(&lg[0][i], &lg[1][i], sizeof(float)) != 0;
        EXPECT(differ == 0, "decode of %d sequences: %zu logits differ between the batched and per-sequence paths", B,
               differ);
        free(lg[0]), free(lg[1]);
    }
    gpu->decode_per_sequence = false;
    model_set_decode_graphs(true);
#ifdef GRPO_CUEMU
    const long long per_seq = (work[0][1] - work[0][0]) / 2, bat_per = (work[1][1] - work[1][0]) / 2;
    printf("decode launches per eager %s step, per-sequence path: %lld, %lld, %lld at 2, 4, 8 sequences (%lld per "
           "sequence, %d layers); batched: %lld, %lld, %lld; at 128 sequences: %lld and %lld\n",
           K->matmul == KMM_BF16 ? "bf16" : "fp32", work[0][0], work[0][1], work[0][2], per_seq, L, work[1][0],
           work[1][1], work[1][2], work[0][0] + per_seq * 126, work[1][0] + bat_per * 126);
    /* (each sequence's last row is x's own row in a decode step: no copy since 2026-12-06, one per sequence before) */
    EXPECT(per_seq == 4LL * L, "the per-sequence path took %lld launches per sequence (expected 4 per layer: %d)",
           per_seq, 4 * L);
    EXPECT(work[0][2] - work[0][1] == 4 * per_seq, "the per-sequence path is not linear in the sequences");
    EXPECT(bat_per == 0 && work[1][2] == work[1][1],
           "the batched path grew by %lld and %lld launches from 2 to 4 and 4 to 8 sequences (expected none)",
           work[1][1] - work[1][0], work[1][2] - work[1][1]);
#else
    (void)work, (void)L;
#endif
    model_free(gpu);
}

/* Graphs at the kernel interface (k_graph_begin, kernels.h): the ops between begin and end run nothing until the
 * graph is launched, then run at each launch on the memory as it is, a launch counted once; a recording that meets
 * a host read ends there, failed, naming it, with the ops before it dropped and the ones after it run; a free moves
 * the epoch that says a graph is stale. */
static void check_graph_ops(struct kctx *K)
{
    const size_t n = 1000;
    float *x = k_alloc(K, n * sizeof(float), KMEM_ACTS, "graph test x"),
          *y = k_alloc(K, n * sizeof(float), KMEM_ACTS, "y");
    float *hx = xmalloc(n * sizeof(float)), *hy = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        hx[i] = (float)(i % 17) - 8.0f, hy[i] = 0.25f * (float)(i % 5);
    k_to_device(K, x, hx, n * sizeof(float));
    k_to_device(K, y, hy, n * sizeof(float));
    char why[256] = "";
    const uint64_t e0 = k_graph_epoch(K);
    EXPECT(k_graph_begin(K, why, sizeof why), "k_graph_begin: %s", why);
    k_add(K, x, y, n); /* x += y */
    k_scale(K, y, 2.0, n);
    struct kgraph *g = k_graph_end(K, why, sizeof why);
    EXPECT(g != NULL, "a recording of an add and a scale gave no graph: %s", why);
    k_to_host(K, got, x, n * sizeof(float));
    EXPECT(memcmp(got, hx, n * sizeof(float)) == 0, "a recorded op ran before its graph was launched");
    size_t wrong = 0;
#ifdef GRPO_CUEMU
    const unsigned long long w0 = cuemu_work_count();
#endif
    for (int r = 0; g && r < 2; r++)
        k_graph_launch(K, g);
#ifdef GRPO_CUEMU
    EXPECT(cuemu_work_count() - w0 == 2, "two launches of a graph of 2 ops counted %llu launches",
           cuemu_work_count() - w0);
#endif
    k_to_host(K, got, x, n * sizeof(float));
    for (size_t i = 0; i < n; i++) /* x + y, then + 2 y: the second launch reads y as the first left it */
        wrong += got[i] != hx[i] + hy[i] + 2.0f * hy[i];
    EXPECT(wrong == 0, "%zu of %zu elements differ after two launches of the graph", wrong, n);
    k_graph_free(K, g);
    EXPECT(k_graph_epoch(K) == e0, "nothing that moves the epoch happened, yet it moved");
    /* a host read inside the recording: the add before it dropped, the scale after it run, the reason named */
    k_to_device(K, x, hx, n * sizeof(float));
    k_to_device(K, y, hy, n * sizeof(float));
    EXPECT(k_graph_begin(K, why, sizeof why), "k_graph_begin: %s", why);
    k_add(K, x, y, n);
    k_to_host(K, got, y, n * sizeof(float));
    k_scale(K, y, 2.0, n);
    g = k_graph_end(K, why, sizeof why);
    EXPECT(g == NULL && strstr(why, "read of device memory on the host"),
           "a recording with a host read in it gave %s (why: %s)", g ? "a graph" : "no graph", why);
    printf("graphs at the kernel interface: a recording with a host read ends, failed: %s\n", why);
    k_graph_free(K, g);
    k_to_host(K, got, x, n * sizeof(float));
    EXPECT(memcmp(got, hx, n * sizeof(float)) == 0, "the op recorded before the failure ran");
    k_to_host(K, got, y, n * sizeof(float));
    wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += got[i] != 2.0f * hy[i];
    EXPECT(wrong == 0, "the op after the failed recording did not run (%zu elements)", wrong);
    k_free(K, x, n * sizeof(float), KMEM_ACTS);
    EXPECT(k_graph_epoch(K) != e0, "a free did not move the graph epoch");
    k_free(K, y, n * sizeof(float), KMEM_ACTS);
    free(hx), free(hy), free(got);
}

/* Decode steps as graphs (issue 43 item 4; model_step.c): S decode steps of B sequences with graphs and without,
 * over the same prompts and tokens: the same logits bit for bit at every step, and under the emulator the launches
 * of each step counted. The first step of a shape runs eagerly, the second is recorded and launched, the rest are
 * launched: one launch for the graph, around it one copy of the inputs in and one of the logits out. Then whole
 * generations (sampled, 2 prompts x 4 samples) with graphs and without: the same tokens and log-probs, bit for bit,
 * with fewer launches. Prints the launches per step of both at 2, 4 and 8 sequences and at 128 (the eager step's
 * from its growth with B, as check_decode_batched; the replayed step's does not grow). */
static void check_decode_graph(struct model *cpu, struct kctx *K)
{
    struct model *gpu = model_copy_to(cpu, K);
    const int V = gpu->cfg.vocab_size, Bs[3] = {2, 4, 8}, S = 4;
    long long work[2][3][4] = {{{0}}}; /* [graphs][B][step] */
    for (int bi = 0; bi < 3; bi++) {
        const int B = Bs[bi];
        float *lg[2];
        for (int gr = 0; gr < 2; gr++) {
            model_set_decode_graphs(gr == 1);
            struct kv_cache *c[8];
            int ntok[8];
            int32_t ids[8 * 3];
            struct kv_slab *slab = prompted_slab(gpu, B, 5, 1, c, ntok);
            lg[gr] = xmalloc((size_t)S * B * V * sizeof(float));
            for (int st = 0; st < S; st++) {
                for (int b = 0; b < B; b++)
                    ids[b] = (int32_t)((11 * st + 3 * b + 2) % V);
#ifdef GRPO_CUEMU
                const unsigned long long w0 = cuemu_work_count();
#endif
                model_step(gpu, c, B, ntok, ids, lg[gr] + (size_t)st * B * V, false);
#ifdef GRPO_CUEMU
                work[gr][bi][st] = (long long)(cuemu_work_count() - w0);
#endif
            }
            kv_slab_free(slab);
        }
        size_t differ = 0;
        for (size_t i = 0; i < (size_t)S * B * V; i++)
            differ += memcmp(&lg[0][i], &lg[1][i], sizeof(float)) != 0;
        EXPECT(differ == 0, "decode of %d sequences: %zu of %zu logits differ between graphs and eager steps", B,
               differ, (size_t)S * B * V);
        free(lg[0]), free(lg[1]);
    }
#ifdef GRPO_CUEMU
    const char *mm = K->matmul == KMM_BF16 ? "bf16" : "fp32";
    printf(
        "decode launches per %s step of %d, %d, %d sequences: eager %lld, %lld, %lld; with graphs, step by step: "
        "%lld %lld %lld %lld, %lld %lld %lld %lld, %lld %lld %lld %lld; at 128 sequences: eager %lld, replayed %lld\n",
        mm, Bs[0], Bs[1], Bs[2], work[0][0][S - 1], work[0][1][S - 1], work[0][2][S - 1], work[1][0][0], work[1][0][1],
        work[1][0][2], work[1][0][3], work[1][1][0], work[1][1][1], work[1][1][2], work[1][1][3], work[1][2][0],
        work[1][2][1], work[1][2][2], work[1][2][3],
        work[0][0][S - 1] + (work[0][1][S - 1] - work[0][0][S - 1]) / 2 * 126, work[1][2][S - 1]);
    for (int bi = 0; bi < 3; bi++) {
        EXPECT(work[1][bi][0] == work[0][bi][0],
               "the first step of %d sequences with graphs took %lld launches, "
               "eagerly %lld (it runs eagerly)",
               Bs[bi], work[1][bi][0], work[0][bi][0]);
        for (int st = 1; st < S; st++) /* the inputs in, the graph, the logits out */
            EXPECT(work[1][bi][st] == 3, "decode step %d of %d sequences with graphs took %lld launches (expected 3)",
                   st + 1, Bs[bi], work[1][bi][st]);
    }
#else
    (void)work;
#endif
    /* whole generations: sampled tokens and their log-probs */
    const int32_t p0[] = {3, 7, 11}, p1[] = {5, 2};
    const int32_t *prompts[2] = {p0, p1};
    const int plens[2] = {3, 2};
    const struct gen_params gp = {.sampling = {.temperature = 1.0f, .top_p = 1, .top_k = -1},
                                  .max_new_tokens = 8,
                                  .n_samples = 4,
                                  .max_batch = 8,
                                  .seed = 7};
    struct gen_output out[2][8];
    long long gen_work[2] = {0, 0};
    for (int gr = 0; gr < 2; gr++) {
        model_set_decode_graphs(gr == 1);
#ifdef GRPO_CUEMU
        const unsigned long long w0 = cuemu_work_count();
#endif
        model_generate(gpu, prompts, plens, 2, &gp, out[gr]);
#ifdef GRPO_CUEMU
        gen_work[gr] = (long long)(cuemu_work_count() - w0);
#endif
    }
    model_set_decode_graphs(true);
    int same = 0, tokens = 0;
    for (int i = 0; i < 8; i++) {
        tokens += out[0][i].len;
        same += out[0][i].len == out[1][i].len &&
                memcmp(out[0][i].tokens, out[1][i].tokens, (size_t)out[0][i].len * sizeof(int32_t)) == 0 &&
                memcmp(out[0][i].logps, out[1][i].logps, (size_t)out[0][i].len * sizeof(float)) == 0;
        model_gen_output_free(&out[0][i]), model_gen_output_free(&out[1][i]);
    }
    printf("generation %s, 2 prompts x 4 samples, %d tokens: %d of 8 sequences the same tokens and log-probs with "
           "graphs as eagerly; %lld launches eagerly, %lld with graphs\n",
           K->matmul == KMM_BF16 ? "bf16" : "fp32", tokens, same, gen_work[0], gen_work[1]);
    EXPECT(same == 8, "%d of 8 sequences differ in tokens or log-probs between graphs and eager steps", 8 - same);
#ifdef GRPO_CUEMU
    EXPECT(gen_work[1] < gen_work[0], "the generation with graphs took %lld launches, eagerly %lld", gen_work[1],
           gen_work[0]);
#endif
    model_free(gpu);
}

int main(int argc, char **argv)
{
    if (!kctx_cuda_available()) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const bool small = getenv("GRPO_GPU_SMALL") != NULL;
    char why[256];
    struct kctx *f32 = kctx_create("cuda", KMM_F32, why, sizeof why);
    struct kctx *bf16 = kctx_create("cuda", KMM_BF16, why, sizeof why);
    if (!f32 || !bf16) {
        fprintf(stderr, "FAIL: a CUDA device is visible but no context: %s\n", why);
        return 1;
    }
    static const char *const tiny[] = {"tiny-llama-tied", "tiny-qwen2-bias", "tiny-qwen3", "tiny-llama3-rope"};
    for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) {
        char path[256], err[512];
        snprintf(path, sizeof path, "tests/fixtures/models/%s", tiny[i]);
        struct model *m = model_load(path, err, sizeof err);
        if (!m) {
            fprintf(stderr, "FAIL: %s\n", err);
            return 1;
        }
        check_forward_backward(tiny[i], m, f32, 1e-4, 1e-4, 1);
        /* BF16 against the CPU's fp32: a gradient goes through some 20 roundings to BF16 (every product's inputs
         * over 2 layers, forward and backward, and attention's P and dS), each off by u = 2^-8 at most: 20 u = 8e-2
         * of the largest. Measured: 5.1e-2 (tiny-llama3-rope's gradients; 4.9e-2 before attention's products were
         * BF16, all but P and dS then), 4.9e-2 (tiny-qwen2-bias's log-probs). A wrong head, mask or scale is O(1). */
        check_forward_backward(tiny[i], m, bf16, 8e-2, 8e-2, 1);
        if (i == 0) {
            check_grpo_step(m, f32, 1e-4);
            check_grpo_step(m, bf16, 5e-2);
            check_decode_bytes(m, bf16, 6);
            check_kv_bytes(m, f32, bf16);
            check_decode_batched(m, f32);
            check_decode_batched(m, bf16);
            check_graph_ops(f32);
            check_decode_graph(m, f32);
            check_decode_graph(m, bf16);
        }
        model_free(m);
    }
    if (argc > 1) { /* the bundled model */
        char err[512];
        struct model *m = model_load(argv[1], err, sizeof err);
        if (!m) {
            fprintf(stderr, "FAIL: %s\n", err);
            return 1;
        }
        const int32_t prompt[] = {1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018};
        check_greedy(m, f32, prompt, (int)(sizeof prompt / sizeof *prompt), small ? 8 : 32);
        check_greedy(m, bf16, prompt, (int)(sizeof prompt / sizeof *prompt), small ? 8 : 32);
        check_decode_batched(m, f32); /* the demo model's launches per decode step, both paths */
        check_decode_graph(m, f32);   /* and as graphs */
        check_kv_bytes(m, f32, bf16); /* and its KV cache's bytes */
        if (!small)
            check_forward_backward("smollm2-135m", m, f32, 1e-3, 1e-3, 4);
        model_free(m);
    }
    kctx_free(f32), kctx_free(bf16);
    printf("%s\n", g_fail ? "FAILED" : "all GPU model checks passed");
    return g_fail ? 1 : 0;
}
