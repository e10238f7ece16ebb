/* The model engine against Hugging Face transformers (fixtures made by
 * tests/fixtures/make_model_fixtures.py), against finite differences, and
 * against itself (KV cache vs full forward, checkpointing vs not). */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/npy.h"
#include "model_fixtures.h"
#include "kernels/kernels.h"
#include "worker/model/fit.h"
#include "worker/plan/planner.h"
#include "worker/model/model_generate.h"
#include "worker/model/model_io.h"

static const char *const tiny_models[] = {"tiny-llama-tied",   "tiny-llama-untied", "tiny-qwen2-bias",
                                          "tiny-qwen2-untied", "tiny-llama3-rope",  "tiny-llama3-rope-v4",
                                          "tiny-qwen3",        "tiny-qwen3-moe",    "tiny-mixtral"};

static void test_logits_match_transformers(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof tiny_models / sizeof *tiny_models; k++) {
        struct model *m = load(tiny_models[k]);
        char path[512];
        int T;
        snprintf(path, sizeof path, FIX "%s/input_ids.json", tiny_models[k]);
        int32_t *ids = read_ids(path, &T);
        size_t n;
        snprintf(path, sizeof path, FIX "%s/logits.npy", tiny_models[k]);
        float *want = read_npy(path, &n);
        assert_int_equal(n, (size_t)T * m->cfg.vocab_size);
        float *got = malloc(n * sizeof *got);
        model_logits(m, ids, T, got);
        expect_close(tiny_models[k], got, want, n, 1e-4, 1e-4);
        free(got), free(want), free(ids);
        model_free(m);
    }
}

/* Training path: packed forward log-probs and backward gradients against transformers' autograd. */
static void test_logprobs_and_grads_match_transformers(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof tiny_models / sizeof *tiny_models; k++) {
        const char *name = tiny_models[k];
        struct model *m = load(name);
        char path[512];
        int T;
        snprintf(path, sizeof path, FIX "%s/input_ids.json", name);
        int32_t *ids = read_ids(path, &T);
        int32_t *targets = calloc((size_t)T, sizeof *targets), *pos = calloc((size_t)T, sizeof *pos);
        for (int t = 0; t < T; t++) {
            targets[t] = t + 1 < T ? ids[t + 1] : 0;
            pos[t] = t;
        }
        int32_t cu[2] = {0, T};
        struct packed_batch b = {T, 1, ids, targets, pos, cu, NULL, NULL, NULL};
        float *logp = calloc((size_t)T, sizeof *logp), *dlogp = calloc((size_t)T, sizeof *dlogp);
        model_alloc_grads(m);
        struct model_acts *acts = model_forward(m, &b, 1.0f, false, logp, NULL);
        size_t n;
        snprintf(path, sizeof path, FIX "%s/logprobs.npy", name);
        float *want = read_npy(path, &n);
        assert_int_equal(n, (size_t)T - 1);
        expect_close(name, logp, want, n, 1e-4, 1e-4);
        for (int t = 0; t + 1 < T; t++)
            dlogp[t] = 1.0f; /* loss = sum of log-probs, as the fixture */
        model_backward(m, acts, dlogp, NULL);
        /* every gradient file listed in grads.json */
        snprintf(path, sizeof path, FIX "%s/grads.json", name);
        json_error_t je;
        json_t *g = json_load_file(path, 0, &je);
        json_t *files = json_object_get(g, "files");
        const char *file;
        json_t *info;
        int checked = 0;
        int nrefs = model_param_refs(m, m->grad, NULL, 0);
        struct param_ref *refs = calloc((size_t)nrefs, sizeof *refs);
        model_param_refs(m, m->grad, refs, nrefs);
        json_object_foreach(files, file, info)
        {
            const char *param = json_string_value(json_object_get(info, "param"));
            struct param_ref *r = NULL;
            for (int i = 0; i < nrefs; i++)
                if (strcmp(refs[i].name, param) == 0)
                    r = &refs[i];
            if (!r)
                fail_msg("%s: no parameter %s", name, param);
            snprintf(path, sizeof path, FIX "%s/%s", name, file);
            float *gw = read_npy(path, &n);
            assert_int_equal(n, r->numel);
            double scale = 0;
            for (size_t i = 0; i < n; i++)
                scale = fmax(scale, fabs(gw[i]));
            char what[256];
            snprintf(what, sizeof what, "%s grad %s", name, param);
            expect_close(what, r->data, gw, n, 1e-4 * (1 + scale), 1e-3);
            free(gw);
            checked++;
        }
        assert_true(checked >= 11);
        json_decref(g);
        free(refs), free(want), free(logp), free(dlogp), free(ids), free(targets), free(pos);
        model_free(m);
    }
}

/* Two sequences packed without padding give each sequence's own logits (KV path and training path). */
static void test_packed_sequences(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    const int V = m->cfg.vocab_size;
    int T0, T1;
    int32_t *s0 = read_ids(FIX "tiny-llama-tied/input_ids_seq0.json", &T0);
    int32_t *s1 = read_ids(FIX "tiny-llama-tied/input_ids_seq1.json", &T1);
    size_t n0, n1;
    float *w0 = read_npy(FIX "tiny-llama-tied/logits_seq0.npy", &n0);
    float *w1 = read_npy(FIX "tiny-llama-tied/logits_seq1.npy", &n1);
    int N = T0 + T1;
    int32_t *ids = malloc(sizeof *ids * (size_t)N), *pos = malloc(sizeof *pos * (size_t)N);
    int32_t *tg = malloc(sizeof *tg * (size_t)N);
    memcpy(ids, s0, sizeof *ids * (size_t)T0);
    memcpy(ids + T0, s1, sizeof *ids * (size_t)T1);
    for (int i = 0; i < N; i++) {
        pos[i] = i < T0 ? i : i - T0;
        tg[i] = (int32_t)((i * 7 + 3) % V);
    }
    /* KV-cache path: both sequences in one step */
    struct kv_cache *kc[2] = {kv_cache_create(m, T0), kv_cache_create(m, T1)};
    int ntok[2] = {T0, T1};
    float *logits = malloc(sizeof(float) * (size_t)N * V);
    model_step(m, kc, 2, ntok, ids, logits, true);
    expect_close("seq0 logits", logits, w0, n0, 1e-4, 1e-4);
    expect_close("seq1 logits", logits + (size_t)T0 * V, w1, n1, 1e-4, 1e-4);
    /* training path: log-probs of arbitrary targets equal log_softmax of the reference logits */
    int32_t cu[3] = {0, T0, N};
    struct packed_batch b = {N, 2, ids, tg, pos, cu, NULL, NULL, NULL};
    float *logp = malloc(sizeof(float) * (size_t)N);
    model_acts_free(model_forward(m, &b, 1.0f, false, logp, NULL));
    for (int i = 0; i < N; i++) {
        const float *row = i < T0 ? w0 + (size_t)i * V : w1 + (size_t)(i - T0) * V;
        double mx = row[0], z = 0;
        for (int j = 1; j < V; j++)
            mx = fmax(mx, row[j]);
        for (int j = 0; j < V; j++)
            z += exp(row[j] - mx);
        double want = row[tg[i]] - mx - log(z);
        if (fabs(logp[i] - want) > 1e-4)
            fail_msg("packed logp[%d] = %g, want %g", i, logp[i], want);
    }
    kv_cache_free(kc[0]), kv_cache_free(kc[1]);
    free(logp), free(logits), free(ids), free(pos), free(tg), free(s0), free(s1), free(w0), free(w1);
    model_free(m);
}

/* Feeding tokens one at a time through the KV cache gives the full forward's logits. */
static void test_kv_cache_incremental(void **state)
{
    (void)state;
    struct model *m = load("tiny-qwen2-bias");
    const int V = m->cfg.vocab_size, T = 10;
    int32_t ids[10] = {5, 9, 1, 33, 60, 2, 2, 17, 40, 11};
    float *full = malloc(sizeof(float) * T * V), *step = malloc(sizeof(float) * V);
    model_logits(m, ids, T, full);
    /* prefill 4 tokens, then one at a time */
    struct kv_cache *kc = kv_cache_create(m, T);
    int four = 4, one = 1;
    float *pre = malloc(sizeof(float) * 4 * V);
    model_step(m, &kc, 1, &four, ids, pre, true);
    expect_close("prefill", pre, full, 4 * (size_t)V, 1e-5, 1e-5);
    for (int t = 4; t < T; t++) {
        model_step(m, &kc, 1, &one, ids + t, step, false);
        expect_close("decode", step, full + (size_t)t * V, (size_t)V, 1e-5, 1e-5);
    }
    assert_int_equal(kc->len, T);
    kv_cache_free(kc);
    free(pre), free(full), free(step);
    model_free(m);
}

/* The whole model's gradient (with the entropy term and a temperature) against central differences. */
static void test_whole_model_finite_differences(void **state)
{
    (void)state;
    struct model *m = load("tiny-qwen2-untied");
    struct fd_batch f;
    fd_batch_init(&f);
    const struct packed_batch b = f.b;
    const float *a = f.a, *c = f.c;
    float logp[9], ent[9];
    model_alloc_grads(m);
    model_zero_grads(m);
    struct model_acts *acts = model_forward(m, &b, 0.7f, false, logp, ent);
    model_backward(m, acts, a, c);
    int nrefs = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *w = calloc((size_t)nrefs, sizeof *w), *g = calloc((size_t)nrefs, sizeof *g);
    model_param_refs(m, &m->w, w, nrefs);
    model_param_refs(m, m->grad, g, nrefs);
    const int checked = fd_check(m, &b, a, c, w, g, nrefs, 2e-3f, 3e-3, 2e-2); /* a few entries of every tensor */
    assert_true(checked > 40);
    free(w), free(g);
    model_free(m);
}

/* model_loss with the routing's signature (tokens per expert and layer, weighted by position) into sig (8). */
static double moe_loss(struct model *m, const struct fd_batch *f, double *sig)
{
    model_moe_stats(m, NULL, NULL);
    float logp[9], ent[9];
    model_acts_free(model_forward(m, &f->b, 0.7f, false, logp, ent));
    double aux = 0;
    const int layers = model_moe_stats(m, sig, &aux);
    double s = (double)m->moe_aux_coef * m->moe_aux_scale * aux * layers;
    for (int i = 0; i < 9; i++)
        s += (double)f->a[i] * logp[i] + (double)f->c[i] * ent[i];
    return s;
}

/* Central differences of moe_loss against g for a few entries of each of n tensors; an entry whose step changes
 * the routing (a top-k choice flips: the loss jumps there) is skipped. Returns the entries checked. */
static int moe_fd_check(struct model *m, const struct fd_batch *f, const struct param_ref *w, const struct param_ref *g,
                        int n, float h, int *skipped)
{
    int checked = 0;
    for (int r = 0; r < n; r++)
        for (size_t j = 0; j < w[r].numel; j += w[r].numel / 4 + 1) {
            const float keep = w[r].data[j];
            double s0[8], sp[8], sm[8];
            moe_loss(m, f, s0);
            w[r].data[j] = keep + h;
            const double lp = moe_loss(m, f, sp);
            w[r].data[j] = keep - h;
            const double lm = moe_loss(m, f, sm);
            w[r].data[j] = keep;
            if (memcmp(sp, s0, sizeof s0) != 0 || memcmp(sm, s0, sizeof s0) != 0) {
                (*skipped)++;
                continue;
            }
            const double fd = (lp - lm) / (2 * h);
            if (fabs(fd - g[r].data[j]) > 3e-3 + 2e-2 * fabs(fd))
                fail_msg("%s[%zu]: analytic %g, finite difference %g", w[r].name, j, g[r].data[j], fd);
            checked++;
        }
    return checked;
}

/* Mixture of experts: the gradients of every tensor (routers and experts included) against central differences,
 * with the router's load-balancing loss (a large coefficient so that its part is visible) and without; the loss
 * is 1 at a perfect balance and the coefficient scales it. */
static void test_moe_finite_differences_with_aux_loss(void **state)
{
    (void)state;
    const char *names[] = {"tiny-qwen3-moe", "tiny-mixtral"};
    for (int k = 0; k < 2; k++) {
        for (int with_aux = 0; with_aux < 2; with_aux++) {
            struct model *m = load(names[k]);
            assert_true(m->cfg.n_experts == 4 && m->cfg.n_experts_per_tok == 2);
            char why[256];
            /* TP splits each expert by its intermediate rows: they must divide */
            assert_int_equal(model_shard_check(&m->cfg, 2, "tp_key", why, sizeof why), 0);
            struct model_config odd = m->cfg;
            odd.moe_intermediate = 7;
            assert_int_equal(model_shard_check(&odd, 2, "tp_key", why, sizeof why), -1);
            assert_non_null(strstr(why, "moe_intermediate_size (7) is not divisible by tp_key (2)"));
            /* the memory estimates count the router and every expert */
            assert_true(model_weight_bytes(&m->cfg) == (double)model_num_params(m) * sizeof(float));
            assert_true(plan_param_count(&m->cfg) == (double)model_num_params(m));
            m->moe_aux_coef = with_aux ? 0.5f : 0.0f;
            m->moe_aux_scale = 0.75f;
            struct fd_batch f;
            fd_batch_init(&f);
            const struct packed_batch b = f.b;
            float logp[9], ent[9];
            model_alloc_grads(m);
            model_zero_grads(m);
            model_moe_stats(m, NULL, NULL);
            struct model_acts *acts = model_forward(m, &b, 0.7f, false, logp, ent);
            double tokens[2 * 4], aux;
            assert_int_equal(model_moe_stats(m, tokens, &aux), 2);
            double sum = 0;
            for (int i = 0; i < 8; i++)
                sum += tokens[i];
            assert_true(sum == 2.0 * 9 * 2); /* dropless: 2 layers x 9 tokens x 2 experts each */
            assert_true(aux >= 1.0 - 1e-6);  /* Megatron's switch loss is at least 1 (balanced) */
            model_backward(m, acts, f.a, f.c);
            int nrefs = model_param_refs(m, &m->w, NULL, 0);
            struct param_ref *w = calloc((size_t)nrefs, sizeof *w), *g = calloc((size_t)nrefs, sizeof *g);
            model_param_refs(m, &m->w, w, nrefs);
            model_param_refs(m, m->grad, g, nrefs);
            /* the routers alone: their gradient holds the aux loss's part */
            int routers = 0;
            for (int i = 0; i < nrefs; i++)
                if (strstr(w[i].name, ".gate.weight")) {
                    w[routers] = w[i], g[routers] = g[i];
                    routers++;
                }
            assert_int_equal(routers, 2);
            int skipped = 0;
            assert_true(moe_fd_check(m, &f, w, g, routers, 1e-3f, &skipped) >= 6);
            model_param_refs(m, &m->w, w, nrefs);
            model_param_refs(m, m->grad, g, nrefs);
            const int checked = moe_fd_check(m, &f, w, g, nrefs, 2e-3f, &skipped);
            assert_true(checked > 40 && skipped < checked / 10);
            free(w), free(g);
            model_free(m);
        }
    }
}

/* Per-layer recomputation gives bit-identical gradients. */
static void test_checkpointing_identical(void **state)
{
    (void)state;
    /* a dense model, and the mixture-of-experts ones with their load-balancing loss */
    const char *names[] = {"tiny-llama-untied", "tiny-qwen3-moe", "tiny-mixtral"};
    for (int k = 0; k < 3; k++) {
        struct model *m = load(names[k]);
        m->moe_aux_coef = 0.1f;
        int32_t ids[7] = {1, 2, 3, 4, 5, 6, 7}, tg[7] = {2, 3, 4, 5, 6, 7, 8}, pos[7] = {0, 1, 2, 0, 1, 2, 3};
        int32_t cu[3] = {0, 3, 7};
        struct packed_batch b = {7, 2, ids, tg, pos, cu, NULL, NULL, NULL};
        float logp[7], ent[7], logp2[7], ent2[7], d[7] = {1, -1, 0.5f, 2, 0, 1, 1}, de[7] = {0.1f, 0, 0, 0.2f, 0, 0, 1};
        model_alloc_grads(m);
        model_zero_grads(m);
        model_backward(m, model_forward(m, &b, 1.0f, false, logp, ent), d, de);
        float *ref = malloc(m->grad->n_floats * sizeof(float));
        memcpy(ref, m->grad->mem, m->grad->n_floats * sizeof(float));
        model_zero_grads(m);
        model_backward(m, model_forward(m, &b, 1.0f, true, logp2, ent2), d, de);
        assert_memory_equal(logp, logp2, sizeof logp);
        assert_memory_equal(ent, ent2, sizeof ent);
        assert_memory_equal(ref, m->grad->mem, m->grad->n_floats * sizeof(float));
        free(ref);
        model_free(m);
    }
}

/* The LM head on the rows a caller reads (packed_batch.logp_from, a response after its prompt) gives those rows'
 * log-probs and entropies and the gradients of the whole-rows pass whose other rows have zero dlogp and dentropy
 * (the rows' products equal, the weight gradient's sum over fewer rows within float rounding); other rows read 0. */
static void test_logp_rows_subset(void **state)
{
    (void)state;
    struct model *m = load("tiny-qwen2-untied");
    int32_t ids[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, tg[9] = {2, 3, 4, 5, 6, 7, 8, 9, 10};
    int32_t pos[9] = {0, 1, 2, 3, 0, 1, 2, 3, 4}, cu[3] = {0, 4, 9}, from[2] = {2, 6};
    float d[9] = {0, 0, 1, -0.5f, 0, 0, 2, 0.25f, -1}, de[9] = {0, 0, 0.1f, 0, 0, 0, 0.3f, 0, 0.2f};
    float logp[9], ent[9], logp2[9], ent2[9];
    struct packed_batch all = {9, 2, ids, tg, pos, cu, NULL, NULL, NULL}, kept = all;
    kept.logp_from = from;
    model_alloc_grads(m);
    model_zero_grads(m);
    model_backward(m, model_forward(m, &all, 0.8f, false, logp, ent), d, de);
    float *ref = malloc(m->grad->n_floats * sizeof(float));
    memcpy(ref, m->grad->mem, m->grad->n_floats * sizeof(float));
    for (int ck = 0; ck < 2; ck++) {
        model_zero_grads(m);
        model_backward(m, model_forward(m, &kept, 0.8f, ck, logp2, ent2), d, de);
        for (int i = 0; i < 9; i++) {
            const bool read = (i >= from[0] && i < cu[1]) || i >= from[1];
            if (read && (fabsf(logp2[i] - logp[i]) > 1e-6f || fabsf(ent2[i] - ent[i]) > 1e-6f))
                fail_msg("row %d: logp %g / entropy %g, all rows give %g / %g", i, logp2[i], ent2[i], logp[i], ent[i]);
            if (!read && (logp2[i] != 0 || ent2[i] != 0))
                fail_msg("row %d is not read, but holds logp %g, entropy %g", i, logp2[i], ent2[i]);
        }
        expect_close("gradients, kept rows vs all rows", m->grad->mem, ref, m->grad->n_floats, 1e-6, 1e-5);
    }
    free(ref);
    model_free(m);
}

/* Activation offload (checkpointing with the layer inputs in the context's host memory) gives bit-identical
 * log-probs and gradients, and moves the layer inputs out of the context's activation memory: on a 6-layer model
 * the forward's activations take exactly 4 layer inputs less (2 stay on the device, in turn), and the host arena
 * holds all 6. */
static void test_activation_offload_identical(void **state)
{
    (void)state;
    struct model *tiny = load("tiny-llama-untied");
    struct model_config c = tiny->cfg;
    model_free(tiny);
    c.n_layers = 6;
    struct model *m[2] = {model_create(&c), model_create(&c)};
    int32_t ids[7] = {1, 2, 3, 4, 5, 6, 7}, tg[7] = {2, 3, 4, 5, 6, 7, 8}, pos[7] = {0, 1, 2, 0, 1, 2, 3};
    int32_t cu[3] = {0, 3, 7};
    struct packed_batch b = {7, 2, ids, tg, pos, cu, NULL, NULL, NULL};
    float logp[2][7], ent[2][7], d[7] = {1, -1, 0.5f, 2, 0, 1, 1}, de[7] = {0.1f, 0, 0, 0.2f, 0, 0, 1};
    size_t acts[2], host[2];
    for (int k = 0; k < 2; k++) {
        model_init_random(m[k], 5, 0.1);
        model_alloc_grads(m[k]);
        model_zero_grads(m[k]);
        assert_false(model_set_activation_offload(m[k], k == 1));
        struct kctx *K = m[k]->K;
        const size_t a0 = K->mem.in_use[KMEM_ACTS], h0 = K->mem.host;
        struct model_acts *A = model_forward(m[k], &b, 1.0f, true, logp[k], ent[k]);
        acts[k] = K->mem.in_use[KMEM_ACTS] - a0;
        host[k] = K->mem.host - h0;
        model_backward(m[k], A, d, de);
    }
    assert_memory_equal(logp[0], logp[1], sizeof logp[0]);
    assert_memory_equal(ent[0], ent[1], sizeof ent[0]);
    assert_memory_equal(m[0]->grad->mem, m[1]->grad->mem, m[0]->grad->n_floats * sizeof(float));
    const size_t layer_in = karena_piece((size_t)7 * c.hidden_size * sizeof(float));
    if (acts[0] - acts[1] != 4 * layer_in || host[0] != 0 || host[1] < 6 * layer_in)
        fail_msg("activations %zu -> %zu bytes (want 4 x %zu less), host %zu -> %zu (want >= 6 x %zu)", acts[0],
                 acts[1], layer_in, host[0], host[1], layer_in);
    model_free(m[0]), model_free(m[1]);
}

static void test_save_and_reload(void **state)
{
    (void)state;
    struct model *m = load("tiny-qwen2-bias");
    char dir[] = "/tmp/grpo_model_XXXXXX", err[1024];
    assert_non_null(mkdtemp(dir));
    assert_int_equal(model_save_hf(m, dir, 0, err, sizeof err), 0);
    struct model *back = model_load(dir, err, sizeof err);
    if (!back)
        fail_msg("%s", err);
    assert_int_equal(back->w.n_floats, m->w.n_floats);
    assert_memory_equal(back->w.mem, m->w.mem, m->w.n_floats * sizeof(float));
    assert_true(back->cfg.rope_theta == m->cfg.rope_theta && back->cfg.tie_word_embeddings);
    model_free(back);
    /* a config we do not implement is refused by name */
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48,"
          " \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
          " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8.0}}",
          f);
    fclose(f);
    assert_null(model_load(dir, err, sizeof err));
    assert_non_null(strstr(err, "rope_scaling type 'yarn' is not supported (supported: default, llama3, linear)"));
    f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48,"
          " \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
          " \"rope_parameters\": {\"rope_type\": \"dynamic\", \"factor\": 2.0, \"rope_theta\": 10000}}",
          f);
    fclose(f);
    assert_null(model_load(dir, err, sizeof err));
    assert_non_null(strstr(err, "rope_scaling type 'dynamic' is not supported"));
    f = fopen(path, "w"); /* llama3 without its frequency bounds */
    fputs("{\"model_type\": \"llama\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48,"
          " \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
          " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}",
          f);
    fclose(f);
    assert_null(model_load(dir, err, sizeof err));
    assert_non_null(strstr(err, "rope_scaling llama3 needs factor > 0, 0 < low_freq_factor < high_freq_factor"));
    f = fopen(path, "w");
    fputs("{\"model_type\": \"qwen2_moe\"}", f);
    fclose(f);
    assert_null(model_load(dir, err, sizeof err));
    assert_non_null(strstr(err, "model_type 'qwen2_moe' is a mixture-of-experts model: not supported yet"));
    f = fopen(path, "w");
    fputs("{\"model_type\": \"mistral\"}", f);
    fclose(f);
    assert_null(model_load(dir, err, sizeof err));
    assert_non_null(strstr(err, "model_type 'mistral' is not supported"));
    f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\", \"vocab_size\": 64", f); /* truncated */
    fclose(f);
    assert_null(model_load(dir, err, sizeof err));
    assert_non_null(strstr(err, "config.json"));
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    model_free(m);
}

/* Llama 3 RoPE and Qwen3 survive a save and reload (config.json and weights), and the frequencies follow
 * transformers' llama3 remap worked by hand for the fixture's first three pairs. */
static void test_new_families_roundtrip(void **state)
{
    (void)state;
    const char *names[] = {"tiny-llama3-rope", "tiny-qwen3"};
    for (int k = 0; k < 2; k++) {
        struct model *m = load(names[k]);
        char dir[] = "/tmp/grpo-test-family-XXXXXX", err[1024];
        assert_non_null(mkdtemp(dir));
        assert_int_equal(model_save_hf(m, dir, 0, err, sizeof err), 0);
        struct model *back = model_load(dir, err, sizeof err);
        if (!back)
            fail_msg("%s", err);
        assert_int_equal(back->cfg.arch, m->cfg.arch);
        assert_int_equal(back->cfg.rope.kind, m->cfg.rope.kind);
        assert_true(back->cfg.rope.factor == m->cfg.rope.factor);
        assert_int_equal(back->cfg.rope.original_max_position_embeddings, m->cfg.rope.original_max_position_embeddings);
        assert_int_equal(back->cfg.qk_norm, m->cfg.qk_norm);
        assert_int_equal(back->cfg.head_dim, m->cfg.head_dim);
        assert_int_equal(back->w.n_floats, m->w.n_floats);
        assert_memory_equal(back->w.mem, m->w.mem, m->w.n_floats * sizeof(float));
        model_free(back);
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        assert_int_equal(system(cmd), 0);
        if (k == 0) {
            /* theta 10000, head_dim 8: frequencies 1, 0.1, 0.01, 0.001 (wavelengths 6.28, 62.8, 628, 6283);
             * original 8, low/high factors 1 and 4: bounds 8 and 2, factor 8. 6.28 lies between: blended with
             * smooth = (8 / 6.28 - 1) / (4 - 1); the others are longer than 8: divided by 8. */
            assert_int_equal(m->cfg.rope.kind, ROPE_LLAMA3);
            const double smooth = (8.0 / (2 * M_PI) - 1.0) / 3.0;
            assert_float_equal(m->rope_freqs[0], (1 - smooth) / 8.0 + smooth, 1e-15);
            assert_float_equal(m->rope_freqs[1], 0.1 / 8.0, 1e-15);
            assert_float_equal(m->rope_freqs[2], 0.01 / 8.0, 1e-15);
        } else {
            assert_int_equal(m->cfg.arch, ARCH_QWEN3);
            assert_true(m->cfg.qk_norm && m->cfg.head_dim == 16 && m->cfg.hidden_size / m->cfg.n_heads == 8);
        }
        model_free(m);
    }
}

/* The families' table: each family found by its config.json model_type and its GGUF name, the lists the
 * refusals print, and what sets each family apart. */
static void test_arch_table(void **state)
{
    (void)state;
    const enum model_arch all[] = {ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3};
    for (int i = 0; i < 3; i++) {
        const struct model_arch_info *f = model_arch_info(all[i]);
        assert_int_equal(f->arch, all[i]);
        assert_ptr_equal(model_arch_by_model_type(f->model_type), f);
        assert_string_equal(model_arch_name(all[i]), f->model_type);
        if (f->gguf_name)
            assert_ptr_equal(model_arch_by_gguf_name(f->gguf_name), f);
    }
    assert_string_equal(model_arch_info(ARCH_QWEN2)->hf_class, "Qwen2ForCausalLM");
    assert_null(model_arch_by_gguf_name("qwen3")); /* no GGUF import of Qwen3 */
    assert_null(model_arch_by_model_type("mistral"));
    assert_null(model_arch_by_model_type(NULL));
    assert_true(model_arch_is_moe("qwen2_moe") && !model_arch_is_moe("qwen3_moe") && !model_arch_is_moe("qwen3"));
    assert_true(model_arch_info(ARCH_QWEN2)->qkv_bias_always && !model_arch_info(ARCH_QWEN3)->qkv_bias_always);
    assert_true(model_arch_info(ARCH_QWEN3)->qk_norm && !model_arch_info(ARCH_LLAMA)->qk_norm);
    assert_true(model_arch_info(ARCH_LLAMA)->gguf_qk_permuted && !model_arch_info(ARCH_QWEN2)->gguf_qk_permuted);
    char names[64];
    assert_string_equal(model_arch_list(false, names, sizeof names), "llama, qwen2, qwen3, qwen3_moe, mixtral");
    assert_string_equal(model_arch_list(true, names, sizeof names), "llama, qwen2");
    assert_string_equal(model_arch_list(false, names, 8), "llama, "); /* cut short, still a string */
}

/* Greedy decoding through the KV cache gives transformers' tokens (generate, 12 new tokens after 6): scaled
 * RoPE at positions past original_max_position_embeddings, and Qwen3's q/k norms in the cached step. */
static void test_new_families_greedy(void **state)
{
    (void)state;
    const char *names[] = {"tiny-llama3-rope", "tiny-llama3-rope-v4", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral"};
    for (int k = 0; k < 5; k++) {
        struct model *m = load(names[k]);
        char path[512];
        snprintf(path, sizeof path, FIX "%s/greedy.json", names[k]);
        json_error_t je;
        json_t *g = json_load_file(path, 0, &je);
        assert_non_null(g);
        json_t *prompt = json_object_get(g, "prompt"), *want = json_object_get(g, "new_ids");
        const int P = (int)json_array_size(prompt), T = (int)json_array_size(want), V = m->cfg.vocab_size;
        int32_t ids[64];
        for (int i = 0; i < P; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(prompt, (size_t)i));
        struct kv_cache *kc = kv_cache_create(m, P + T);
        float *logits = malloc((size_t)V * sizeof(float));
        assert_non_null(logits);
        int n = P;
        model_step(m, &kc, 1, &n, ids, logits, false);
        for (int t = 0; t < T; t++) {
            int32_t best = 0;
            for (int j = 1; j < V; j++)
                best = logits[j] > logits[best] ? j : best;
            const int32_t expect = (int32_t)json_integer_value(json_array_get(want, (size_t)t));
            if (best != expect)
                fail_msg("%s: greedy token %d is %d, transformers %d", names[k], t, best, expect);
            int one = 1;
            model_step(m, &kc, 1, &one, &best, logits, false);
        }
        free(logits);
        kv_cache_free(kc);
        json_decref(g);
        model_free(m);
    }
}

static const char *bundled_gguf(void)
{
    static char path[1024];
    const char *env = getenv("GRPO_MODEL_GGUF");
    if (env && *env)
        snprintf(path, sizeof path, "%s", env);
    else
        snprintf(path, sizeof path, "%s/.cache/grpo/SmolLM2-135M-Instruct.Q4_1.gguf", getenv("HOME"));
    return access(path, R_OK) == 0 ? path : NULL;
}

/* SmolLM2-135M-Instruct imported from GGUF matches transformers' own GGUF import. */
static void test_smollm2_matches_transformers(void **state)
{
    (void)state;
    const char *gguf = bundled_gguf();
    if (!gguf)
        skip();
    char err[1024];
    struct model *m = model_load(gguf, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    const int V = m->cfg.vocab_size;
    assert_int_equal(V, 49152);
    assert_int_equal(m->cfg.n_layers, 30);
    assert_int_equal(m->cfg.n_kv_heads, 3);
    assert_true(m->cfg.tie_word_embeddings);
    assert_float_equal(m->cfg.rope_theta, 100000.0f, 1e-3);
    int T;
    int32_t *ids = read_ids(FIX "smollm2/input_ids.json", &T);
    float *logits = malloc(sizeof(float) * (size_t)T * V);
    model_logits(m, ids, T, logits);
    size_t n;
    float *last = read_npy(FIX "smollm2/logits_last.npy", &n);
    assert_int_equal(n, (size_t)V);
    expect_close("smollm2 last-position logits", logits + (size_t)(T - 1) * V, last, n, 2e-3, 2e-4);
    float *rows = read_npy(FIX "smollm2/logits_rows.npy", &n);
    int ncols;
    int32_t *cols = read_ids(FIX "smollm2/logit_cols.json", &ncols);
    assert_int_equal(n, (size_t)T * ncols);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < ncols; j++) {
            float got = logits[(size_t)t * V + cols[j]], want = rows[(size_t)t * ncols + j];
            if (fabs(got - want) > 2e-3 + 2e-4 * fabs(want))
                fail_msg("smollm2 logits[%d][%d] = %g, want %g", t, cols[j], got, want);
        }
    /* greedy continuation token for token */
    int G;
    int32_t *greedy = read_ids(FIX "smollm2/greedy.json", &G);
    struct gen_params gp = {.sampling = {0, 1, 0}, .max_new_tokens = G, .n_samples = 1, .max_batch = 1};
    struct gen_output out;
    const int32_t *prompts[1] = {ids};
    model_generate(m, prompts, &T, 1, &gp, &out);
    assert_int_equal(out.len, G);
    assert_memory_equal(out.tokens, greedy, sizeof(int32_t) * (size_t)G);
    model_gen_output_free(&out);
    free(greedy), free(cols), free(rows), free(last), free(logits), free(ids);
    model_free(m);
}

/* Sampling is reproducible from the seed and independent of how sequences are batched. */
static void test_generation_reproducible(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    int32_t p0[3] = {1, 2, 3}, p1[5] = {9, 8, 7, 6, 5};
    const int32_t *prompts[2] = {p0, p1};
    int lens[2] = {3, 5};
    int32_t stop = 2;
    struct gen_params gp = {.sampling = {1.0f, 0.9f, 20},
                            .max_new_tokens = 12,
                            .n_samples = 3,
                            .max_batch = 6,
                            .stop_ids = &stop,
                            .n_stop = 1,
                            .seed = 42};
    struct gen_output a[6], b[6], c[6];
    model_generate(m, prompts, lens, 2, &gp, a);
    model_generate(m, prompts, lens, 2, &gp, c); /* same settings: bit-identical */
    gp.max_batch = 3;                            /* one group at a time: same tokens, GEMM rounding may differ */
    model_generate(m, prompts, lens, 2, &gp, b);
    int distinct = 0;
    for (int i = 0; i < 6; i++) {
        assert_int_equal(a[i].len, c[i].len);
        assert_memory_equal(a[i].tokens, c[i].tokens, sizeof(int32_t) * (size_t)a[i].len);
        assert_memory_equal(a[i].logps, c[i].logps, sizeof(float) * (size_t)a[i].len);
        assert_int_equal(a[i].len, b[i].len);
        assert_memory_equal(a[i].tokens, b[i].tokens, sizeof(int32_t) * (size_t)a[i].len);
        for (int t = 0; t < a[i].len; t++)
            assert_float_equal(a[i].logps[t], b[i].logps[t], 1e-5);
        for (int t = 0; t < a[i].len; t++)
            assert_true(a[i].logps[t] <= 0);
        if (a[i].stopped)
            assert_int_equal(a[i].tokens[a[i].len - 1], stop);
        if (i > 0 &&
            (a[i].len != a[0].len || memcmp(a[i].tokens, a[0].tokens, sizeof(int32_t) * (size_t)a[i].len) != 0))
            distinct++;
    }
    assert_true(distinct > 0); /* different streams sample different responses */
    /* the recorded log-prob is the model's: recompute with the training forward at the same temperature */
    int L = a[1].len, N = lens[0] + L - 1;
    int32_t *ids = malloc(sizeof *ids * (size_t)N), *tg = malloc(sizeof *tg * (size_t)N),
            *pos = malloc(sizeof *pos * (size_t)N);
    for (int i = 0; i < N; i++) {
        ids[i] = i < lens[0] ? p0[i] : a[1].tokens[i - lens[0]];
        tg[i] = i + 1 < lens[0] ? 0 : a[1].tokens[i + 1 - lens[0]];
        pos[i] = i;
    }
    int32_t cu[2] = {0, N};
    struct packed_batch pb = {N, 1, ids, tg, pos, cu, NULL, NULL, NULL};
    float *logp = malloc(sizeof(float) * (size_t)N);
    model_acts_free(model_forward(m, &pb, 1.0f, false, logp, NULL));
    for (int t = 0; t < L; t++)
        assert_float_equal(logp[lens[0] - 1 + t], a[1].logps[t], 2e-5);
    free(logp), free(ids), free(tg), free(pos);
    for (int i = 0; i < 6; i++) {
        model_gen_output_free(&a[i]);
        model_gen_output_free(&b[i]);
        model_gen_output_free(&c[i]);
    }
    model_free(m);
}

/* ---- issue 30: routing replay ---- */

/* One generated sequence (prompt ++ response) as a packed batch with its recorded experts: log-probs of the response
 * under m into logp (len) from the training forward; *differ gets the token-layers whose own routing differed. */
static void replay_logp(struct model *m, const int32_t *prompt, int plen, const struct gen_output *o, bool replay,
                        float *logp, double *differ, double *compared)
{
    const int N = plen + o->len - 1;
    int32_t *ids = malloc(sizeof *ids * (size_t)N), *tg = malloc(sizeof *tg * (size_t)N),
            *pos = malloc(sizeof *pos * (size_t)N), cu[2] = {0, N};
    for (int i = 0; i < N; i++) {
        ids[i] = i < plen ? prompt[i] : o->tokens[i - plen];
        tg[i] = i + 1 < plen ? 0 : o->tokens[i + 1 - plen];
        pos[i] = i;
    }
    struct packed_batch pb = {N, 1, ids, tg, pos, cu, NULL, NULL, o->routes};
    float *all = malloc(sizeof(float) * (size_t)N);
    m->moe_replay = replay;
    model_moe_route_stats(m, differ, compared);
    model_acts_free(model_forward(m, &pb, 1.0f, false, all, NULL));
    model_moe_route_stats(m, differ, compared);
    memcpy(logp, all + plen - 1, sizeof(float) * (size_t)o->len);
    free(all), free(ids), free(tg), free(pos);
}

/* Generation records each token's experts, and the training forward that replays them takes the same experts.
 * Same weights and precision: the recorded routes are the trainer's own (nothing differs, the log-probs agree to
 * float rounding, replayed or not). A rollout engine whose router weights are BF16 (verl's rollouts run in BF16;
 * Megatron keeps its router in fp32, moe_router_dtype) routes some tokens to other experts: without replay the
 * log-prob gap holds those flips, with replay only the routers' rounding is left, and it is smaller. (On this CPU
 * engine a BF16 context decodes in fp32, its skinny products, so the rounding is put on the router's weights.)
 * Near ties: a router whose rows differ only at float rounding (an indifferent router, as at initialisation) picks
 * its top-k by rounding, so generation (one token at a time, its own summation order) and the trainer's forward
 * (the whole sequence in one product) route tokens differently although nothing else differs: without replay the
 * gap holds whole experts' differences, with replay it falls to float rounding. */
static void test_moe_routing_replay(void **state)
{
    (void)state;
    const char *names[] = {"tiny-qwen3-moe", "tiny-mixtral"};
    double flips = 0;
    for (int mi = 0; mi < 2; mi++) {
        struct model *m = load(names[mi]);
        int32_t p0[4] = {1, 2, 3, 4}, p1[6] = {9, 8, 7, 6, 5, 4};
        const int32_t *prompts[2] = {p0, p1};
        int lens[2] = {4, 6};
        struct gen_params gp = {.sampling = {1.0f, 1.0f, 0},
                                .max_new_tokens = 24,
                                .n_samples = 8,
                                .max_batch = 16,
                                .seed = 7,
                                .record_routes = true};
        for (int bf = 0; bf < 3; bf++) {
            struct model *gen = bf ? model_clone(m) : m, *trainer = bf == 2 ? gen : m;
            const size_t D = (size_t)m->cfg.hidden_size;
            for (int l = 0; bf == 1 && l < m->cfg.n_layers; l++)
                for (size_t i = 0; i < (size_t)m->cfg.n_experts * D; i++)
                    gen->w.layers[l].router[i] = test_bf16_round(gen->w.layers[l].router[i]);
            for (int l = 0; bf == 2 && l < m->cfg.n_layers; l++) { /* every row expert 0's, a few ulps apart */
                float *w = gen->w.layers[l].router;
                for (size_t e = 1; e < (size_t)m->cfg.n_experts; e++)
                    for (size_t i = 0; i < D; i++)
                        w[e * D + i] = w[i] * (1.0f + 2.4e-7f * (float)((int)((e * 7 + i * 13) % 5) - 2));
            }
            struct gen_output out[16];
            model_generate(gen, prompts, lens, 2, &gp, out);
            double gap[2] = {0, 0}, n_differ[2] = {0, 0}, n_cmp = 0;
            for (int i = 0; i < 16; i++) {
                assert_non_null(out[i].routes);
                float *lp = malloc(sizeof(float) * (size_t)out[i].len);
                for (int r = 0; r < 2; r++) {
                    double d, c;
                    replay_logp(trainer, prompts[i / 8], lens[i / 8], &out[i], r == 1, lp, &d, &c);
                    assert_int_equal((int)c, (lens[i / 8] + out[i].len - 1) * m->cfg.n_layers);
                    n_differ[r] += d;
                    n_cmp += r == 0 ? c : 0;
                    for (int t = 0; t < out[i].len; t++)
                        gap[r] = fmax(gap[r], fabs((double)lp[t] - out[i].logps[t]));
                }
                free(lp);
            }
            printf("# %s, %s rollout router: %g of %g token-layers routed differently; largest |log-prob gap| %.3g "
                   "without replay, %.3g with\n",
                   names[mi],
                   bf == 1   ? "BF16"
                   : bf == 2 ? "near-tie"
                             : "fp32",
                   n_differ[0], n_cmp, gap[0], gap[1]);
            if (!bf) { /* the recorded routes are the trainer's own: the same log-probs to float rounding */
                assert_true(n_differ[0] == 0);
                assert_true(gap[0] < 2e-5 && gap[1] < 2e-5);
            } else if (bf == 2) { /* flips from rounding alone; replayed, nothing but rounding is left */
                if (!(n_differ[0] > 0 && gap[0] > 1e-3 && gap[1] < 2e-5))
                    fail_msg("near-tie router: %g flips, gap %g without replay, %g with", n_differ[0], gap[0], gap[1]);
            } else if (n_differ[0] > 0) {
                assert_true(gap[1] < gap[0]);
            }
            flips += bf == 1 ? n_differ[0] : 0;
            for (int i = 0; i < 16; i++)
                model_gen_output_free(&out[i]);
            if (gen != m)
                model_free(gen);
        }
        model_free(m);
    }
    assert_true(flips > 0);
}

/* ---- issue 12: bad weights and sizes are refused by name before anything large is allocated ---- */

/* dir/config.json with one key's value replaced (value is JSON text). */
static void patch_config(const char *dir, const char *key, const char *value)
{
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    assert_non_null(o);
    json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
    assert_non_null(v);
    json_object_set_new(o, key, v);
    assert_int_equal(json_dump_file(o, path, 0), 0);
    json_decref(o);
}

static void expect_load_fails(const char *path, const char *needle1, const char *needle2)
{
    char err[1024] = "";
    struct model *m = model_load(path, err, sizeof err);
    if (m)
        fail_msg("%s loaded; expected an error about %s", path, needle1);
    if (!strstr(err, needle1) || (needle2 && !strstr(err, needle2)))
        fail_msg("error '%s' lacks '%s' / '%s'", err, needle1, needle2 ? needle2 : "");
}

static void test_load_refuses_bad_hf(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-untied");
    char dir[] = "/tmp/grpo_model_XXXXXX", err[1024];
    assert_non_null(mkdtemp(dir));
    assert_int_equal(model_save_hf(m, dir, 0, err, sizeof err), 0);
    struct model *ok = model_load(dir, err, sizeof err);
    if (!ok)
        fail_msg("%s", err);
    model_free(ok);

    /* NaN or infinite weights: refused with the tensor's name (they made every optimizer step skip) */
    int n = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *refs = calloc((size_t)n, sizeof *refs);
    model_param_refs(m, &m->w, refs, n);
    for (int which = 0; which < 2; which++) {
        struct param_ref *r = &refs[which ? n - 1 : 3];
        float keep = r->data[r->numel / 2];
        r->data[r->numel / 2] = which ? INFINITY : NAN;
        assert_int_equal(model_save_hf(m, dir, 0, err, sizeof err), 0);
        r->data[r->numel / 2] = keep;
        char want[200];
        snprintf(want, sizeof want, "tensor '%s'", r->name);
        expect_load_fails(dir, want, "non-finite");
    }
    assert_int_equal(model_save_hf(m, dir, 0, err, sizeof err), 0);

    /* a configuration that leaves out a layer of the weights */
    patch_config(dir, "num_hidden_layers", "1");
    expect_load_fails(dir, "num_hidden_layers is 1", "model.layers.1.");
    patch_config(dir, "num_hidden_layers", "2");
    /* max_position_embeddings 0 bounds nothing */
    patch_config(dir, "max_position_embeddings", "0");
    expect_load_fails(dir, "max_position_embeddings (0) must be positive", NULL);
    patch_config(dir, "max_position_embeddings", "512");
    /* sizes that do not fit the machine fail by name before calloc does */
    patch_config(dir, "hidden_size", "1000000000");
    expect_load_fails(dir, "hidden_size 1000000000", "bytes");
    /* and sizes that do not fit an int are not wrapped into plausible ones */
    patch_config(dir, "hidden_size", "4294967328");
    expect_load_fails(dir, "'hidden_size' = 4294967328 is out of range", NULL);
    free(refs);
    must_rm_rf(dir);
    model_free(m);
}

/* A minimal GGUF v3 writer: string/uint32 metadata and F32 tensors, data aligned to 32 bytes. */
struct gguf_w {
    uint8_t *b;
    size_t n, cap;
};

static void gw_put(struct gguf_w *w, const void *p, size_t n)
{
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 1024;
        w->b = realloc(w->b, w->cap);
        assert_non_null(w->b);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void gw_u32(struct gguf_w *w, uint32_t v) { gw_put(w, &v, 4); }
static void gw_u64(struct gguf_w *w, uint64_t v) { gw_put(w, &v, 8); }
static void gw_str(struct gguf_w *w, const char *s)
{
    gw_u64(w, strlen(s));
    gw_put(w, s, strlen(s));
}
static void gw_kv_u32(struct gguf_w *w, const char *k, uint32_t v)
{
    gw_str(w, k);
    gw_u32(w, 4); /* GGUF_TYPE_UINT32 */
    gw_u32(w, v);
}

/* GGUF name of an HF parameter name (llama.cpp's naming). */
static void gguf_name(const char *hf, char *out, size_t len)
{
    static const char *const map[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"},    {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},      {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    int l;
    char rest[96];
    if (strcmp(hf, "model.embed_tokens.weight") == 0)
        snprintf(out, len, "token_embd.weight");
    else if (strcmp(hf, "model.norm.weight") == 0)
        snprintf(out, len, "output_norm.weight");
    else if (strcmp(hf, "lm_head.weight") == 0)
        snprintf(out, len, "output.weight");
    else if (sscanf(hf, "model.layers.%d.%95s", &l, rest) == 2) {
        for (size_t i = 0; i < sizeof map / sizeof *map; i++)
            if (strcmp(rest, map[i][0]) == 0)
                snprintf(out, len, "blk.%d.%s", l, map[i][1]);
    }
}

/* Write m (llama, no biases) as a GGUF file claiming block_count and context_length. */
static void write_gguf(const struct model *m, const char *path, uint32_t block_count, uint32_t context_length)
{
    const struct model_config *c = &m->cfg;
    int n = model_param_refs(m, &m->w, NULL, 0);
    struct param_ref *refs = calloc((size_t)n, sizeof *refs);
    model_param_refs(m, &m->w, refs, n);
    struct gguf_w w = {0};
    gw_put(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, (uint64_t)n);
    gw_u64(&w, 8);
    gw_str(&w, "general.architecture");
    gw_u32(&w, 8); /* GGUF_TYPE_STRING */
    gw_str(&w, "llama");
    gw_kv_u32(&w, "llama.embedding_length", (uint32_t)c->hidden_size);
    gw_kv_u32(&w, "llama.block_count", block_count);
    gw_kv_u32(&w, "llama.feed_forward_length", (uint32_t)c->intermediate_size);
    gw_kv_u32(&w, "llama.attention.head_count", (uint32_t)c->n_heads);
    gw_kv_u32(&w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    gw_kv_u32(&w, "llama.attention.key_length", (uint32_t)c->head_dim);
    gw_kv_u32(&w, "llama.context_length", context_length);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        char name[128] = "?";
        gguf_name(refs[i].name, name, sizeof name);
        gw_str(&w, name);
        gw_u32(&w, (uint32_t)refs[i].n_dims);
        for (int d = refs[i].n_dims - 1; d >= 0; d--) /* ggml order: row length first */
            gw_u64(&w, (uint64_t)refs[i].shape[d]);
        gw_u32(&w, 0); /* F32 */
        gw_u64(&w, off);
        off += (refs[i].numel * sizeof(float) + 31) / 32 * 32;
    }
    static const uint8_t zeros[32];
    gw_put(&w, zeros, (32 - w.n % 32) % 32);
    for (int i = 0; i < n; i++) {
        gw_put(&w, refs[i].data, refs[i].numel * sizeof(float));
        gw_put(&w, zeros, (32 - w.n % 32) % 32);
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(w.b, 1, w.n, f), w.n);
    fclose(f);
    free(w.b);
    free(refs);
}

static void test_load_refuses_bad_gguf(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-untied");
    char dir[] = "/tmp/grpo_gguf_XXXXXX", path[600], err[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    const uint32_t L = (uint32_t)m->cfg.n_layers;
    write_gguf(m, path, L, 512);
    struct model *ok = model_load(path, err, sizeof err);
    if (!ok)
        fail_msg("%s", err);
    assert_int_equal(ok->cfg.n_layers, (int)L);
    assert_memory_equal(ok->w.embed, m->w.embed, sizeof(float) * (size_t)m->cfg.vocab_size * m->cfg.hidden_size);
    model_free(ok);
    /* a block_count that drops a block */
    write_gguf(m, path, L - 1, 512);
    char want[64];
    snprintf(want, sizeof want, "blk.%u.", L - 1);
    expect_load_fails(path, "llama.block_count is", want);
    /* context length 0 */
    write_gguf(m, path, L, 0);
    expect_load_fails(path, "max_position_embeddings (0) must be positive", NULL);
    /* a NaN weight */
    m->w.layers[0].w_up[5] = NAN;
    write_gguf(m, path, L, 512);
    expect_load_fails(path, "tensor 'blk.0.ffn_up.weight'", "non-finite");
    must_rm_rf(dir);
    model_free(m);
}

/* The run must fit the model's positions and the machine before it allocates; errors name the keys. */
static void test_run_fit(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    const struct model_config *mc = &m->cfg;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error ce;
    char err[1024] = "";
    const uint64_t GB = 1ull << 30;
    assert_int_equal(config_apply_override(&c, "data.max_prompt_length=100", &ce), 0); /* the model has 128 */
    assert_int_equal(run_fit_check(mc, &c, 64 * GB, err, sizeof err), 0);
    assert_true(machine_memory_bytes() > (1ull << 20));
    /* prompt + response past max_position_embeddings */
    char o[64];
    snprintf(o, sizeof o, "data.max_response_length=%d", mc->max_position_embeddings - 99);
    assert_int_equal(config_apply_override(&c, o, &ce), 0);
    assert_int_equal(run_fit_check(mc, &c, 64 * GB, err, sizeof err), -1);
    assert_non_null(strstr(err, "data.max_response_length"));
    assert_non_null(strstr(err, "max_position_embeddings"));
    assert_int_equal(config_apply_override(&c, "data.max_response_length=24", &ce), 0);
    /* max_num_seqs is a bound, not an allocation: a million costs what the step's sequences cost */
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.rollout.max_num_seqs=1000000", &ce), 0);
    assert_int_equal(run_fit_check(mc, &c, 1 * GB, err, sizeof err), 0);
    /* ... unless the step has that many sequences */
    assert_int_equal(config_apply_override(&c, "data.train_batch_size=100000", &ce), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.rollout.n=64", &ce), 0);
    assert_int_equal(run_fit_check(mc, &c, 1 * GB, err, sizeof err), -1);
    assert_non_null(strstr(err, "actor_rollout_ref.rollout.max_num_seqs = 1000000"));
    assert_non_null(strstr(err, "bytes"));
    assert_non_null(strstr(err, "the machine has 1073741824 bytes"));
    /* the weights alone */
    assert_int_equal(run_fit_check(mc, &c, 1000, err, sizeof err), -1);
    config_free(&c);
    config_init(&c);
    static const char *const small[] = {
        "data.max_prompt_length=1",      "data.max_response_length=1",
        "data.train_batch_size=1",       "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.rollout.n=1", "data.val_batch_size=1"};
    for (size_t i = 0; i < sizeof small / sizeof *small; i++)
        assert_int_equal(config_apply_override(&c, small[i], &ce), 0);
    assert_int_equal(run_fit_check(mc, &c, 1000, err, sizeof err), -1);
    assert_non_null(strstr(err, "weights"));
    assert_non_null(strstr(err, "the machine has 1000 bytes"));
    config_free(&c);
    model_free(m);
}

/* model_generate() holds a KV cache per slot: max_batch beyond the call's sequences must not allocate more, and does
 * not change what is generated. */
static void test_generate_slots_bounded(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    int32_t p0[3] = {1, 2, 3}, p1[2] = {4, 5};
    const int32_t *prompts[2] = {p0, p1};
    int lens[2] = {3, 2};
    struct gen_params gp = {
        .sampling = {1.0f, 1.0f, -1}, .max_new_tokens = 6, .n_samples = 2, .max_batch = 4, .seed = 7};
    struct gen_output a[4], b[4];
    model_generate(m, prompts, lens, 2, &gp, a);
    gp.max_batch = 1000000;
    model_generate(m, prompts, lens, 2, &gp, b);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(a[i].len, b[i].len);
        assert_memory_equal(a[i].tokens, b[i].tokens, sizeof(int32_t) * (size_t)a[i].len);
        assert_memory_equal(a[i].logps, b[i].logps, sizeof(float) * (size_t)a[i].len);
        model_gen_output_free(&a[i]);
        model_gen_output_free(&b[i]);
    }
    model_free(m);
}

static bool pause_after(void *ud)
{
    int *left = ud;
    return --*left <= 0;
}

static void expect_same_outputs(const struct gen_output *a, const struct gen_output *b, int n)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(a[i].len, b[i].len);
        assert_int_equal(a[i].stopped, b[i].stopped);
        assert_memory_equal(a[i].tokens, b[i].tokens, sizeof(int32_t) * (size_t)a[i].len);
        assert_memory_equal(a[i].logps, b[i].logps, sizeof(float) * (size_t)a[i].len);
    }
}

/* generate_phase (partial rollout): a live pause after a few decode steps, then the rest with other weights, is
 * reproduced bit for bit by pausing each sequence at the length it had (pause_at) and resuming the same way; what
 * came before the pause is what an uninterrupted call makes; a group not started before the pause starts whole. */
static void test_generate_phases(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-tied");
    struct model *m2 = model_clone(m); /* the "newer version": other weights */
    for (size_t i = 0; i < m2->w.n_floats; i++)
        m2->w.mem[i] *= 1.01f;
    int32_t p0[3] = {1, 2, 3}, p1[2] = {4, 5}, p2[4] = {6, 7, 8, 9};
    const int32_t *prompts[3] = {p0, p1, p2};
    int lens[3] = {3, 2, 4};
    enum { N = 6 };
    struct gen_params gp = {
        .sampling = {1.0f, 1.0f, -1}, .max_new_tokens = 9, .n_samples = 2, .max_batch = 4, .seed = 5};
    struct gen_output whole[N], live[N], replay[N];
    model_generate(m, prompts, lens, 3, &gp, whole);
    /* live: paused after the third decode step (the third group, 4 slots for 6 sequences, has not started) */
    int left = 3;
    struct gen_params g1 = gp;
    g1.should_pause = pause_after;
    g1.pause_ud = &left;
    const int open = model_generate_phase(m, prompts, lens, 3, &g1, live);
    assert_int_equal(open, N);
    int at[N];
    for (int i = 0; i < N; i++) {
        at[i] = live[i].len;
        assert_memory_equal(live[i].tokens, whole[i].tokens, sizeof(int32_t) * (size_t)live[i].len);
        assert_memory_equal(live[i].logps, whole[i].logps, sizeof(float) * (size_t)live[i].len);
    }
    assert_int_equal(at[4], 0); /* the third group waits for slots */
    assert_int_equal(at[5], 0);
    assert_true(at[0] == 4 && at[3] == 4); /* one token at admission, three decode steps */
    struct gen_params g2 = gp;
    g2.resume = true;
    assert_int_equal(model_generate_phase(m2, prompts, lens, 3, &g2, live), 0);
    /* replayed: the same pauses, by length */
    struct gen_params r1 = gp;
    r1.pause_at = at;
    assert_int_equal(model_generate_phase(m, prompts, lens, 3, &r1, replay), N);
    assert_int_equal(model_generate_phase(m2, prompts, lens, 3, &g2, replay), 0);
    expect_same_outputs(live, replay, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(live[i].len, 9);
        model_gen_output_free(&whole[i]);
        model_gen_output_free(&live[i]);
        model_gen_output_free(&replay[i]);
    }
    model_free(m2);
    model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_match_transformers),
        cmocka_unit_test(test_logprobs_and_grads_match_transformers),
        cmocka_unit_test(test_packed_sequences),
        cmocka_unit_test(test_kv_cache_incremental),
        cmocka_unit_test(test_whole_model_finite_differences),
        cmocka_unit_test(test_moe_finite_differences_with_aux_loss),
        cmocka_unit_test(test_checkpointing_identical),
        cmocka_unit_test(test_logp_rows_subset),
        cmocka_unit_test(test_activation_offload_identical),
        cmocka_unit_test(test_save_and_reload),
        cmocka_unit_test(test_new_families_roundtrip),
        cmocka_unit_test(test_arch_table),
        cmocka_unit_test(test_new_families_greedy),
        cmocka_unit_test(test_smollm2_matches_transformers),
        cmocka_unit_test(test_generation_reproducible),
        cmocka_unit_test(test_moe_routing_replay),
        cmocka_unit_test(test_load_refuses_bad_hf),
        cmocka_unit_test(test_load_refuses_bad_gguf),
        cmocka_unit_test(test_run_fit),
        cmocka_unit_test(test_generate_slots_bounded),
        cmocka_unit_test(test_generate_phases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
