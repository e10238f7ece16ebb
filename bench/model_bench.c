/* model_bench: throughput of our CPU model engine on one machine, for comparison with PyTorch
 * (bench/model_bench_torch.py measures the same things the same way; bench/run_model_bench.sh
 * runs both and prints the ratios).
 *
 *   sgemm     sgemm GFLOP/s at n^3 over our threads (cpu_sgemm) (x W^T layout, as linear_forward), best of several:
 *             the machine's achievable peak at this thread count
 *   fwd_bwd   packed forward + backward of B sequences of S tokens, loss = sum of next-token
 *             log-probs (the last token of each sequence has no target: weight 0); tokens/s and
 *             model GFLOP/s (3 x forward FLOPs, the trainer's MFU formula)
 *   --lora R  the forward + backward with a rank-R LoRA adapter on every projection (alpha 2R, the base
 *             frozen: the adapter's gradients only), for LoRA against full fine-tuning (docs/results/performance.md)
 *   --bf16    the same on a CPU context with BF16 GEMMs (kctx_create("cpu", KMM_BF16): the linear layers'
 *             products in BF16 with fp32 accumulation; weights, activations and the rest in fp32); the
 *             PyTorch side's --bf16 runs under torch.autocast("cpu", torch.bfloat16)
 *   decode    B sequences: prefill a P-token prompt each, then N greedy decode steps with the KV
 *             cache (model_step, one token per sequence per step); decode tokens/s = B*N / time
 *
 * Token ids are a fixed function of the position (bench_token below; the Python side uses the same),
 * so both sides compute on identical inputs and their losses and greedy tokens can be compared.
 * One JSON object per line on stdout; diagnostics on stderr. */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/clock.h"
#include "kernels/kernels.h"
#include "worker/model/model_generate.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/model/model_io.h"

/* Token id of position t of sequence b; the Python side computes the same. Avoids ids 0..15
 * (special tokens in most vocabularies). */
static int32_t bench_token(int b, int t, int V)
{
    uint64_t x = (uint64_t)b * 1000003u + (uint64_t)t * 7919u + 12345u;
    x ^= x >> 13;
    x *= 0x9E3779B1u;
    x ^= x >> 16;
    return (int32_t)(16 + x % (uint64_t)(V - 16));
}

/* Model FLOPs of one token's forward at context ctx (causal: the average token attends ctx/2),
 * the same formula as the trainer's MFU. */
static double flops_per_token(const struct model_config *c, double ctx)
{
    const double D = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    const double QD = (double)c->n_heads * c->head_dim, KD = (double)c->n_kv_heads * c->head_dim;
    const double per_layer = 2 * (D * QD + 2 * D * KD + QD * D + 3 * D * F) + 4 * QD * ctx / 2;
    return c->n_layers * per_layer + 2 * V * D;
}

static double bench_sgemm(int n, int reps)
{
    float *a = xmalloc((size_t)n * n * sizeof(float)), *b = xmalloc((size_t)n * n * sizeof(float)),
          *c = xmalloc((size_t)n * n * sizeof(float));
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 13) * 0.01f;
        b[i] = (float)(i % 7) * 0.02f;
    }
    khost_sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n); /* warm */
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = clock_now_s();
        khost_sgemm(false, true, n, n, n, 1, a, n, b, n, 0, c, n);
        double dt = clock_now_s() - t0;
        double g = 2.0 * n * n * n / dt / 1e9;
        if (g > best)
            best = g;
    }
    free(a), free(b), free(c);
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *g_matmul = "fp32"; /* "bf16" with --bf16 */
static int g_lora;                    /* --lora R: the adapter's rank (0: full fine-tuning) */

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench_fwd_bwd(struct model *m, int B, int S, int warmup, int iters, int threads, double peak)
{
    const int V = m->cfg.vocab_size, N = B * S;
    int32_t *ids = xmalloc((size_t)N * sizeof *ids), *tgt = xmalloc((size_t)N * sizeof *tgt);
    int32_t *pos = xmalloc((size_t)N * sizeof *pos), *cu = xmalloc((size_t)(B + 1) * sizeof *cu);
    float *logp = xmalloc((size_t)N * sizeof *logp), *dlogp = xmalloc((size_t)N * sizeof *dlogp);
    for (int b = 0; b < B; b++) {
        cu[b] = b * S;
        for (int t = 0; t < S; t++) {
            int i = b * S + t;
            ids[i] = bench_token(b, t, V);
            tgt[i] = t + 1 < S ? bench_token(b, t + 1, V) : 0;
            pos[i] = t;
            dlogp[i] = t + 1 < S ? 1.0f : 0.0f; /* d(sum of next-token log-probs)/dlogp */
        }
    }
    cu[B] = N;
    struct packed_batch pb = {.N = N, .B = B, .ids = ids, .targets = tgt, .pos = pos, .cu_seqlens = cu};
    const size_t trainable = model_trainable(m).n; /* the adapter with --lora, else every parameter */
    double *times = xmalloc((size_t)(iters > 0 ? iters : 1) * sizeof *times);
    double *cpu = xmalloc((size_t)(iters > 0 ? iters : 1) * sizeof *cpu);
    double loss = 0;
    for (int it = 0; it < warmup + iters; it++) {
        model_trainable_zero_grads(m); /* outside the timing, as the Python side's zero_grad */
        double t0 = clock_now_s(), c0 = cpu_s();
        struct model_acts *acts = model_forward(m, &pb, 1.0f, false, logp, NULL);
        model_backward(m, acts, dlogp, NULL);
        double dt = clock_now_s() - t0;
        if (it >= warmup)
            cpu[it - warmup] = cpu_s() - c0;
        loss = 0;
        for (int i = 0; i < N; i++)
            loss += dlogp[i] * logp[i];
        fprintf(stderr, "  fwd_bwd %s %d: %.3f s\n", it < warmup ? "warmup" : "iter", it < warmup ? it : it - warmup,
                dt);
        if (it >= warmup)
            times[it - warmup] = dt;
    }
    double best = times[0];
    for (int i = 1; i < iters; i++)
        best = times[i] < best ? times[i] : best;
    double med = median(times, iters), med_cpu = median(cpu, iters);
    double flops = 3.0 * flops_per_token(&m->cfg, S) * N;
    const struct kmem_stats *ms = &m->K->mem;
    printf("{\"side\":\"ours\",\"what\":\"fwd_bwd\",\"threads\":%d,\"batch\":%d,\"seqlen\":%d,\"iters\":%d,"
           "\"median_s\":%.6f,\"best_s\":%.6f,\"median_cpu_s\":%.6f,\"tokens_per_s\":%.3f,\"gflops\":%.3f,"
           "\"peak_gflops\":%.3f,\"loss_sum_logp\":%.6f,\"matmul\":\"%s\",\"lora_rank\":%d,\"trainable\":%zu,"
           "\"peak_gb\":{\"weights\":%.4f,\"gradients\":%.4f,\"activations\":%.4f,\"all\":%.4f}}\n",
           threads, B, S, iters, med, best, med_cpu, N / med, flops / med / 1e9, peak, loss, g_matmul, g_lora,
           trainable, ms->peak[KMEM_WEIGHTS] / 1e9, ms->peak[KMEM_GRADS] / 1e9, ms->peak[KMEM_ACTS] / 1e9,
           ms->max_allocated / 1e9);
    fflush(stdout);
    free(times), free(cpu), free(ids), free(tgt), free(pos), free(cu), free(logp), free(dlogp);
}

static int argmax(const float *x, int n)
{
    int k = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[k])
            k = i;
    return k;
}

static void bench_decode(struct model *m, int B, int P, int steps, int threads)
{
    const int V = m->cfg.vocab_size;
    struct kv_cache **caches = xmalloc((size_t)B * sizeof(struct kv_cache *));
    for (int b = 0; b < B; b++)
        caches[b] = kv_cache_create(m, P + steps + 1);
    int *ntok = xmalloc((size_t)B * sizeof *ntok);
    int32_t *ids = xmalloc((size_t)B * P * sizeof *ids), *next = xmalloc((size_t)B * sizeof *next);
    int32_t *first = xmalloc((size_t)(steps + 1) * sizeof *first); /* greedy tokens of sequence 0 */
    float *logits = xmalloc((size_t)B * V * sizeof *logits);
    for (int b = 0; b < B; b++) {
        ntok[b] = P;
        for (int t = 0; t < P; t++)
            ids[b * P + t] = bench_token(b, t, V);
    }
    double t0 = clock_now_s();
    model_step(m, caches, B, ntok, ids, logits, false);
    double t_prefill = clock_now_s() - t0;
    for (int b = 0; b < B; b++) {
        next[b] = argmax(logits + (size_t)b * V, V);
        ntok[b] = 1;
    }
    first[0] = next[0];
    t0 = clock_now_s();
    for (int s = 0; s < steps; s++) {
        model_step(m, caches, B, ntok, next, logits, false);
        for (int b = 0; b < B; b++)
            next[b] = argmax(logits + (size_t)b * V, V);
        first[s + 1] = next[0];
    }
    double t_dec = clock_now_s() - t0;
    int nshow = steps + 1 < 16 ? steps + 1 : 16;
    printf("{\"side\":\"ours\",\"what\":\"decode\",\"threads\":%d,\"batch\":%d,\"prompt_len\":%d,\"steps\":%d,"
           "\"prefill_s\":%.6f,\"decode_s\":%.6f,\"tokens_per_s\":%.3f,\"greedy0\":[",
           threads, B, P, steps, t_prefill, t_dec, (double)B * steps / t_dec);
    for (int i = 0; i < nshow; i++)
        printf("%s%d", i ? "," : "", first[i]);
    printf("]}\n");
    fflush(stdout);
    fprintf(stderr, "  decode batch %d: prefill %.3f s, %d steps %.3f s\n", B, t_prefill, steps, t_dec);
    for (int b = 0; b < B; b++)
        kv_cache_free(caches[b]);
    free(caches), free(ntok), free(ids), free(next), free(first), free(logits);
}

/* GRPO's generation shape: G prompts of P tokens, n samples each, `steps` new tokens per sample (no stop token),
 * all G x n sequences at once, through model_generate(). Shared: each prompt prefilled once and its KV cache copied to
 * its n samples (what the rollout does). Unshared: the same G x n sequences given as G x n separate prompts, each
 * prefilled on its own. Same sampling streams, so the same tokens; the time difference is the shared prefill. */
static double group_run(struct model *m, int nprompts, int n, int P, int steps, int32_t **prompts, int *plens,
                        int *first_tok)
{
    struct gen_params gp = {.sampling = {.temperature = 1.0f, .top_p = 1.0f, .top_k = -1},
                            .max_new_tokens = steps,
                            .n_samples = n,
                            .max_batch = nprompts * n,
                            .seed = 7};
    (void)P;
    struct gen_output *out = xmalloc((size_t)nprompts * n * sizeof *out);
    double t0 = clock_now_s();
    model_generate(m, (const int32_t *const *)prompts, plens, nprompts, &gp, out);
    double dt = clock_now_s() - t0;
    *first_tok = out[0].len > 0 ? out[0].tokens[0] : -1;
    for (int i = 0; i < nprompts * n; i++)
        model_gen_output_free(&out[i]);
    free(out);
    return dt;
}

static void bench_group(struct model *m, int G, int n, int P, int steps, int threads)
{
    const int V = m->cfg.vocab_size, total = G * n;
    int32_t **prompts = xmalloc((size_t)total * sizeof *prompts);
    int *plens = xmalloc((size_t)total * sizeof *plens);
    for (int i = 0; i < total; i++) { /* sequence i = sample i % n of prompt i / n */
        prompts[i] = xmalloc((size_t)P * sizeof(int32_t));
        plens[i] = P;
        for (int t = 0; t < P; t++)
            prompts[i][t] = bench_token(i / n, t, V);
    }
    int32_t **group_prompts = xmalloc((size_t)G * sizeof *group_prompts);
    for (int g = 0; g < G; g++)
        group_prompts[g] = prompts[g * n];
    int tok_shared, tok_unshared;
    (void)group_run(m, 1, 1, P, 2, group_prompts, plens, &tok_shared); /* warm-up */
    double shared = group_run(m, G, n, P, steps, group_prompts, plens, &tok_shared);
    double unshared = group_run(m, total, 1, P, steps, prompts, plens, &tok_unshared);
    printf("{\"side\":\"ours\",\"what\":\"group_gen\",\"threads\":%d,\"groups\":%d,\"n\":%d,\"prompt_len\":%d,"
           "\"steps\":%d,\"shared_s\":%.6f,\"unshared_s\":%.6f,\"shared_tokens_per_s\":%.3f,"
           "\"unshared_tokens_per_s\":%.3f,\"prefill_tokens_shared\":%d,\"prefill_tokens_unshared\":%d}\n",
           threads, G, n, P, steps, shared, unshared, (double)total * steps / shared, (double)total * steps / unshared,
           G * P, total * P);
    fflush(stdout);
    fprintf(stderr,
            "  group generation %d x %d, prompt %d, %d tokens: shared prefill %.3f s, unshared %.3f s (x%.2f)\n", G, n,
            P, steps, shared, unshared, unshared / shared);
    for (int i = 0; i < total; i++)
        free(prompts[i]);
    free(prompts), free(plens), free(group_prompts);
}

/* A whole decimal int, or exit with usage status 2 naming the option. */
static int parse_int(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < -2147483647L || v > 2147483647L) {
        fprintf(stderr, "model_bench: %s: '%s' is not an integer\n", opt, s);
        exit(2);
    }
    return (int)v;
}

static void usage(FILE *out)
{
    fputs(
        "usage: model_bench MODEL [options]\n"
        "  MODEL                  Hugging Face model directory or .gguf file\n"
        "  --threads T            OpenBLAS threads (default 1)\n"
        "  --batch B              sequences of the forward/backward (default 4)\n"
        "  --seqlen S             tokens per sequence (default 256)\n"
        "  --warmup W             untimed forward/backward iterations (default 1)\n"
        "  --iters I              timed forward/backward iterations, median reported (default 3)\n"
        "  --decode-batches L     comma-separated decode batch sizes (default 1,8,32; 0 or '' skips)\n"
        "  --prompt-len P         prompt tokens prefilled before decoding (default 32)\n"
        "  --decode-steps N       timed decode steps (default 32)\n"
        "  --sgemm-n n            sgemm size for the peak (default 1024)\n"
        "  --group-gen G,n        also GRPO-shaped generation: G prompts x n samples, prompt prefilled once per group\n"
        "                         against every sample prefilling its own copy (default off)\n"
        "  --skip-fwd-bwd         decode only\n"
        "  --bf16                 BF16 GEMMs (fp32 accumulation) on a BF16 CPU context\n"
        "  --lora R               forward/backward with a rank-R LoRA adapter on every projection (base frozen)\n"
        "  --openblas-core        print OpenBLAS's kernel set (its CPU detection) and exit; MODEL not needed\n"
        "Prints one JSON object per measurement on stdout.\n",
        out);
}

int main(int argc, char **argv)
{
    int threads = 1, B = 4, S = 256, warmup = 1, iters = 3, P = 32, steps = 32, sn = 1024, skip_fb = 0;
    int group_G = 0, group_n = 0;
    const char *dec = "1,8,32";
    static const struct option lo[] = {{"threads", required_argument, 0, 't'},
                                       {"batch", required_argument, 0, 'b'},
                                       {"seqlen", required_argument, 0, 's'},
                                       {"warmup", required_argument, 0, 'w'},
                                       {"iters", required_argument, 0, 'i'},
                                       {"decode-batches", required_argument, 0, 'd'},
                                       {"prompt-len", required_argument, 0, 'p'},
                                       {"decode-steps", required_argument, 0, 'n'},
                                       {"sgemm-n", required_argument, 0, 'g'},
                                       {"skip-fwd-bwd", no_argument, 0, 'F'},
                                       {"group-gen", required_argument, 0, 'G'},
                                       {"bf16", no_argument, 0, 'B'},
                                       {"lora", required_argument, 0, 'L'},
                                       {"openblas-core", no_argument, 0, 'C'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (o) {
        case 't': threads = parse_int("--threads", optarg); break;
        case 'b': B = parse_int("--batch", optarg); break;
        case 's': S = parse_int("--seqlen", optarg); break;
        case 'w': warmup = parse_int("--warmup", optarg); break;
        case 'i': iters = parse_int("--iters", optarg); break;
        case 'd': dec = optarg; break;
        case 'p': P = parse_int("--prompt-len", optarg); break;
        case 'n': steps = parse_int("--decode-steps", optarg); break;
        case 'g': sn = parse_int("--sgemm-n", optarg); break;
        case 'F': skip_fb = 1; break;
        case 'G': {
            char *comma = strchr(optarg, ',');
            char *end1 = NULL, *end2 = NULL;
            long gG = comma ? strtol(optarg, &end1, 10) : 0;
            long gn = comma ? strtol(comma + 1, &end2, 10) : 0;
            if (!comma || end1 != comma || end2 == comma + 1 || *end2 || gG < 1 || gn < 1 || gG > 4096 || gn > 4096) {
                fprintf(stderr, "model_bench: --group-gen: '%s' is not G,n with 1 <= G, n <= 4096\n", optarg);
                return 2;
            }
            group_G = (int)gG, group_n = (int)gn;
            break;
        }
        case 'B': g_matmul = "bf16"; break;
        case 'L': g_lora = parse_int("--lora", optarg); break;
        case 'C': {
            const char *core = openblas_get_corename();
            printf("%s\n", core ? core : "?");
            return 0;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || threads < 1 || B < 1 || S < 2 || warmup < 0 || iters < 1 || P < 1 || steps < 1 ||
        sn < 16) {
        usage(stderr);
        return 2;
    }
    khost_set_threads(threads);
    char err[1024];
    double t0 = clock_now_s();
    struct model *m = model_load(argv[optind], err, sizeof err);
    if (!m) {
        fprintf(stderr, "model_bench: %s\n", err);
        return 2;
    }
    fprintf(stderr, "model_bench: loaded %s in %.2f s (%zu parameters), %d threads\n", argv[optind], clock_now_s() - t0,
            model_num_params(m), threads);
    struct kctx *K = NULL;
    if (strcmp(g_matmul, "bf16") == 0) { /* the same weights on a BF16 context */
        K = kctx_create("cpu", KMM_BF16, err, sizeof err);
        if (!K) {
            fprintf(stderr, "model_bench: --bf16: %s\n", err);
            return 2;
        }
        struct model *mb = model_create_on(&m->cfg, NULL, K);
        k_to_device(K, mb->w.mem, m->w.mem, m->w.n_floats * sizeof(float));
        model_free(m);
        m = mb;
        char desc[256];
        fprintf(stderr, "model_bench: %s\n", kctx_describe(K, desc, sizeof desc));
    }
    if (g_lora > 0) {
        const struct lora_config lc = {.rank = g_lora, .alpha = 2.0 * g_lora, .targets = LORA_ALL_LINEAR};
        if (lora_attach(m, &lc, err, sizeof err) != 0) {
            fprintf(stderr, "model_bench: --lora: %s\n", err);
            return 2;
        }
        lora_init(m, 1);
    }
    double peak = bench_sgemm(sn, 5);
    const char *core = openblas_get_corename(), *ct = getenv("OPENBLAS_CORETYPE");
    printf("{\"side\":\"ours\",\"what\":\"sgemm\",\"threads\":%d,\"n\":%d,\"gflops\":%.3f,"
           "\"openblas_core\":\"%s\",\"openblas_coretype_env\":\"%s\"}\n",
           threads, sn, peak, core ? core : "?", ct ? ct : "");
    fflush(stdout);
    if (!skip_fb)
        bench_fwd_bwd(m, B, S, warmup, iters, threads, peak);
    char *list = strdup(dec);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int db = parse_int("--decode-batches", tok);
        if (db > 0)
            bench_decode(m, db, P, steps, threads);
    }
    free(list);
    if (group_G > 0)
        bench_group(m, group_G, group_n, P, steps, threads);
    model_free(m);
    if (K)
        kctx_free(K);
    return 0;
}
