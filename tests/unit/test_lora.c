/* LoRA adapters (worker/model/lora.c): the zero-B start is the base model bit for bit, gradients of A, B and the
 * input against finite differences, PEFT's files (adapters made and saved by peft itself, tests/fixtures/models/
 * lora-*) loaded to peft's logits and gradients and written back tensor for tensor, the merged export, the frozen
 * base (no full-model gradient buffer), the bypassed reference, and target_modules parsing. */
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
#include "kernels/kernels.h"
#include "worker/formats/safetensors.h"
#include "model_fixtures.h"
#include "worker/model/lora.h"
#include "worker/model/model_io.h"
#include "worker/trainer/checkpoint.h"

/* The ids of fixture NAME, and one of its arrays. */
static int32_t *fixture_ids(const char *name, int *n)
{
    char path[512];
    snprintf(path, sizeof path, FIX "%s/input_ids.json", name);
    return read_ids(path, n);
}

static float *fixture_npy(const char *name, const char *file, size_t *count)
{
    char path[512];
    snprintf(path, sizeof path, FIX "%s/%s", name, file);
    return read_npy(path, count);
}

static void attach(struct model *m, int rank, double alpha, unsigned targets)
{
    char err[512];
    const struct lora_config c = {.rank = rank, .alpha = alpha, .targets = targets};
    if (lora_attach(m, &c, err, sizeof err) != 0)
        fail_msg("%s", err);
}

/* A packed batch of one sequence: ids, next-token targets, positions. */
struct one_seq {
    int32_t *ids, *targets, *pos, cu[2];
    struct packed_batch b;
};

static void one_seq_make(struct one_seq *s, const int32_t *ids, int T)
{
    s->ids = calloc((size_t)T, sizeof *s->ids);
    s->targets = calloc((size_t)T, sizeof *s->targets);
    s->pos = calloc((size_t)T, sizeof *s->pos);
    for (int t = 0; t < T; t++) {
        s->ids[t] = ids[t];
        s->targets[t] = t + 1 < T ? ids[t + 1] : 0;
        s->pos[t] = t;
    }
    s->cu[0] = 0, s->cu[1] = T;
    s->b = (struct packed_batch){T, 1, s->ids, s->targets, s->pos, s->cu, NULL, NULL, NULL};
}

static void one_seq_free(struct one_seq *s) { free(s->ids), free(s->targets), free(s->pos); }

/* LoRA of rank r with B zero (PEFT's start) gives exactly the base model's logits and log-probs. */
static void test_zero_b_is_base_bitwise(void **state)
{
    (void)state;
    const char *bases[] = {"tiny-llama-untied", "tiny-qwen2-bias", "tiny-qwen3"};
    for (size_t k = 0; k < sizeof bases / sizeof *bases; k++) {
        struct model *m = load(bases[k]);
        int T;
        int32_t *ids = fixture_ids(bases[k], &T);
        const size_t nl = (size_t)T * m->cfg.vocab_size;
        float *base = malloc(nl * sizeof *base), *got = malloc(nl * sizeof *got);
        float *lp0 = calloc((size_t)T, sizeof *lp0), *lp1 = calloc((size_t)T, sizeof *lp1);
        struct one_seq s;
        one_seq_make(&s, ids, T);
        model_logits(m, ids, T, base);
        model_acts_free(model_forward(m, &s.b, 1.0f, false, lp0, NULL));
        attach(m, 8, 16, LORA_ALL_LINEAR);
        lora_init(m, 7);
        float a0;
        k_to_host(m->K, &a0, m->lora->w[0].A[PROJ_Q], sizeof a0);
        assert_true(a0 != 0.0f); /* A is random, B zero */
        model_logits(m, ids, T, got);
        assert_memory_equal(got, base, nl * sizeof *got);
        model_acts_free(model_forward(m, &s.b, 1.0f, false, lp1, NULL));
        assert_memory_equal(lp1, lp0, (size_t)T * sizeof *lp0);
        one_seq_free(&s);
        free(base), free(got), free(lp0), free(lp1), free(ids);
        model_free(m);
    }
}

/* Fill the adapter with normal(0, std) values (A and B), reproducibly. */
static void randomise_adapter(struct model *m, unsigned seed, double std)
{
    float *h = malloc(m->lora->n * sizeof *h);
    srand(seed);
    for (size_t i = 0; i < m->lora->n; i++)
        h[i] = (float)(std * ((double)rand() / RAND_MAX * 2 - 1) * 1.7);
    k_to_device(m->K, m->lora->mem, h, m->lora->n * sizeof *h);
    free(h);
}

/* dA and dB of every targeted projection against central differences (loss with the entropy term and a
 * temperature, two packed sequences, gradient checkpointing off and on); the base gets no gradient buffer. */
static void test_finite_differences(void **state)
{
    (void)state;
    struct model *m = load("tiny-qwen2-untied");
    attach(m, 3, 6, LORA_ALL_LINEAR);
    randomise_adapter(m, 3, 0.3);
    struct fd_batch f;
    fd_batch_init(&f);
    const struct packed_batch b = f.b;
    const float *a = f.a, *c = f.c;
    float logp[9], ent[9];
    const struct trainable tr = model_trainable(m);
    assert_ptr_equal(tr.params, m->lora->mem);
    assert_int_equal(tr.n, m->lora->n);
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        model_trainable_zero_grads(m);
        model_backward(m, model_forward(m, &b, 0.7f, ckpt, logp, ent), a, c);
        assert_null(m->grad); /* the frozen base has no gradient buffer */
        const int n = lora_refs(m, m->lora->mem, NULL, 0);
        struct param_ref *w = calloc((size_t)n, sizeof *w), *g = calloc((size_t)n, sizeof *g);
        lora_refs(m, m->lora->mem, w, n);
        lora_refs(m, m->lora->grad, g, n);
        assert_int_equal(n, 2 * PROJ_KINDS * m->cfg.n_layers);
        assert_true(fd_check(m, &b, a, c, w, g, n, 2e-3f, 2e-3, 2e-2) >= 2 * n);
        free(w), free(g);
    }
    model_free(m);
}

/* dx through one LoRA'd projection (base and adapter) against central differences. */
static void test_proj_dx_finite_differences(void **state)
{
    (void)state;
    struct model *m = load("tiny-llama-untied");
    attach(m, 4, 8, 1u << PROJ_DOWN | 1u << PROJ_V);
    randomise_adapter(m, 5, 0.4);
    model_trainable(m);
    const enum proj_kind kinds[2] = {PROJ_DOWN, PROJ_V};
    for (int k = 0; k < 2; k++) {
        int din, dout;
        model_proj_dims(m, kinds[k], &din, &dout);
        const int N = 3;
        float *x = malloc((size_t)N * din * sizeof *x), *y = malloc((size_t)N * dout * sizeof *y);
        float *w = malloc((size_t)N * dout * sizeof *w), *dx = calloc((size_t)N * din, sizeof *dx);
        for (int i = 0; i < N * din; i++)
            x[i] = (float)sin(0.37 * i + k);
        for (int i = 0; i < N * dout; i++)
            w[i] = (float)cos(0.11 * i);
        model_proj_backward(m, 1, kinds[k], dx, w, x, N); /* loss = sum w * y */
        for (int i = 0; i < N * din; i += 7) {
            double l[2];
            const float keep = x[i], h = 1e-2f;
            for (int sgn = 0; sgn < 2; sgn++) {
                x[i] = keep + (sgn ? -h : h);
                model_proj_forward(m, 1, kinds[k], y, x, N);
                l[sgn] = 0;
                for (int j = 0; j < N * dout; j++)
                    l[sgn] += (double)w[j] * y[j];
            }
            x[i] = keep;
            const double fd = (l[0] - l[1]) / (2 * h);
            if (fabs(fd - dx[i]) > 1e-3 + 1e-3 * fabs(fd))
                fail_msg("%s dx[%d]: analytic %g, finite difference %g", lora_proj_name(kinds[k]), i, dx[i], fd);
        }
        free(x), free(y), free(w), free(dx);
    }
    model_free(m);
}

/* adapter fixture, its base, and how many of its tensors' gradients peft wrote (grads.json) */
static const struct {
    const char *name, *base;
    int grads;
} peft_fixtures[] = {{"lora-llama-untied", "tiny-llama-untied", 4},
                     {"lora-qwen3", "tiny-qwen3", 4},
                     {"lora-qwen3-moe", "tiny-qwen3-moe", 4},
                     {"lora-mixtral", "tiny-mixtral", 4},
                     /* the experts (PEFT's target_parameters on fused experts) and the router (all-linear) */
                     {"lora-qwen3-moe-experts", "tiny-qwen3-moe", 10},
                     {"lora-qwen3-moe-down", "tiny-qwen3-moe", 2},
                     {"lora-mixtral-experts", "tiny-mixtral", 10}};

static struct model *load_with_adapter(int k)
{
    struct model *m = load(peft_fixtures[k].base);
    char dir[512], err[1024];
    snprintf(dir, sizeof dir, FIX "%s/adapter", peft_fixtures[k].name);
    if (lora_load(m, dir, err, sizeof err) != 0)
        fail_msg("%s", err);
    return m;
}

/* Adapters made and saved by peft: our loader gives peft's logits (generation path), log-probs and adapter
 * gradients (training path). */
static void test_peft_adapter_matches_peft(void **state)
{
    (void)state;
    for (int k = 0; k < (int)(sizeof peft_fixtures / sizeof *peft_fixtures); k++) {
        const char *name = peft_fixtures[k].name;
        struct model *m = load_with_adapter(k);
        int T;
        int32_t *ids = fixture_ids(name, &T);
        size_t n;
        float *want = fixture_npy(name, "logits.npy", &n);
        assert_int_equal(n, (size_t)T * m->cfg.vocab_size);
        float *got = malloc(n * sizeof *got);
        model_logits(m, ids, T, got);
        expect_close(name, got, want, n, 1e-4, 1e-4);
        free(want);
        /* training path: log-probs and the gradients of their sum */
        struct one_seq s;
        one_seq_make(&s, ids, T);
        float *logp = calloc((size_t)T, sizeof *logp), *dlogp = calloc((size_t)T, sizeof *dlogp);
        model_trainable_zero_grads(m);
        struct model_acts *acts = model_forward(m, &s.b, 1.0f, false, logp, NULL);
        want = fixture_npy(name, "logprobs.npy", &n);
        expect_close(name, logp, want, (size_t)T - 1, 1e-4, 1e-4);
        free(want);
        for (int t = 0; t + 1 < T; t++)
            dlogp[t] = 1.0f;
        model_backward(m, acts, dlogp, NULL);
        const int nr = lora_refs(m, m->lora->grad, NULL, 0);
        struct param_ref *g = calloc((size_t)nr, sizeof *g);
        lora_refs(m, m->lora->grad, g, nr);
        int checked = 0;
        for (int r = 0; r < nr; r++) {
            char file[256];
            snprintf(file, sizeof file, "grad_%s", g[r].name);
            for (char *p = file; *p; p++)
                *p = *p == '.' ? '_' : *p;
            strcat(file, ".npy");
            char path[512];
            snprintf(path, sizeof path, FIX "%s/%s", name, file);
            if (access(path, R_OK) != 0)
                continue;
            float *gw = fixture_npy(name, file, &n);
            assert_int_equal(n, g[r].numel);
            double scale = 0;
            for (size_t i = 0; i < n; i++)
                scale = fmax(scale, fabs(gw[i]));
            expect_close(g[r].name, g[r].data, gw, n, 1e-4 * (1 + scale), 1e-3);
            free(gw);
            checked++;
        }
        assert_int_equal(checked, peft_fixtures[k].grads);
        free(g), free(logp), free(dlogp), free(got), free(ids);
        one_seq_free(&s);
        model_free(m);
    }
}

/* Our saver writes peft's tensor names, shapes and values, and a config that reads back (and has the fields peft
 * needs); the merged export reproduces peft's merge_and_unload. */
static void test_save_and_merge(void **state)
{
    (void)state;
    char tmp[] = "/tmp/grpo-lora-XXXXXX";
    assert_non_null(mkdtemp(tmp));
    for (int k = 0; k < (int)(sizeof peft_fixtures / sizeof *peft_fixtures); k++) {
        const char *name = peft_fixtures[k].name;
        struct model *m = load_with_adapter(k);
        char err[1024], dir[600], path[700];
        snprintf(dir, sizeof dir, "%s/%s", tmp, name);
        if (lora_save(m, dir, "my-base", err, sizeof err) != 0)
            fail_msg("%s", err);
        snprintf(path, sizeof path, FIX "%s/adapter/adapter_model.safetensors", name);
        struct st_file *theirs = st_open(path, err, sizeof err);
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        struct st_file *ours = st_open(path, err, sizeof err);
        assert_non_null(theirs);
        assert_non_null(ours);
        assert_int_equal(st_num_tensors(ours), st_num_tensors(theirs));
        for (int i = 0; i < st_num_tensors(theirs); i++) {
            const struct st_tensor_info *a = st_tensor(theirs, i), *b = st_find(ours, a->name);
            if (!b)
                fail_msg("%s: we did not write %s", name, a->name);
            assert_int_equal(b->dtype, ST_F32);
            assert_int_equal(b->n_dims, 2);
            assert_int_equal(b->shape[0], a->shape[0]);
            assert_int_equal(b->shape[1], a->shape[1]);
            assert_memory_equal(b->data, a->data, a->n_bytes);
        }
        st_close(theirs), st_close(ours);
        /* the config: what peft reads */
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        json_error_t je;
        json_t *cfg = json_load_file(path, 0, &je);
        assert_non_null(cfg);
        assert_string_equal(json_string_value(json_object_get(cfg, "peft_type")), "LORA");
        assert_string_equal(json_string_value(json_object_get(cfg, "task_type")), "CAUSAL_LM");
        assert_string_equal(json_string_value(json_object_get(cfg, "bias")), "none");
        assert_string_equal(json_string_value(json_object_get(cfg, "base_model_name_or_path")), "my-base");
        assert_int_equal(json_integer_value(json_object_get(cfg, "r")), m->lora->cfg.rank);
        assert_true(json_is_false(json_object_get(cfg, "use_rslora")));
        assert_true(json_is_false(json_object_get(cfg, "fan_in_fan_out")));
        assert_true(json_number_value(json_object_get(cfg, "lora_dropout")) == 0.0);
        json_decref(cfg);
        struct lora_config c = {0};
        char base[64];
        assert_int_equal(lora_read_config(dir, &c, base, sizeof base, err, sizeof err), 0);
        assert_int_equal(c.rank, m->lora->cfg.rank);
        assert_int_equal(c.targets, m->lora->cfg.targets);
        assert_int_equal(c.router, m->lora->cfg.router);
        assert_true(c.alpha == m->lora->cfg.alpha);
        /* merged export: W + s B A, saved and reloaded as a plain checkpoint */
        int T;
        int32_t *ids = fixture_ids(name, &T);
        size_t n;
        float *want = fixture_npy(name, "merged_logits.npy", &n), *got = malloc(n * sizeof *got);
        lora_merge(m);
        assert_null(m->lora);
        snprintf(path, sizeof path, "%s/merged", dir);
        if (model_save_hf(m, path, 0, err, sizeof err) != 0)
            fail_msg("%s", err);
        struct model *merged = model_load_hf(path, err, sizeof err);
        assert_non_null(merged);
        model_logits(merged, ids, T, got);
        expect_close("merged", got, want, n, 1e-4, 1e-4);
        free(want), free(got), free(ids);
        model_free(merged);
        model_free(m);
    }
    must_rm_rf(tmp);
}

/* The reference policy: the same model with the adapter bypassed gives the base's logits exactly; the adapter
 * (and its gradients) is all a LoRA model adds to the base's memory (no second copy for the reference). */
static void test_bypass_is_base(void **state)
{
    (void)state;
    const struct kmem_stats *st = &kctx_cpu()->mem;
    const size_t w_start = st->in_use[KMEM_WEIGHTS];
    struct model *base = load("tiny-qwen3");
    const size_t base_bytes = st->in_use[KMEM_WEIGHTS] - w_start;
    struct model *m = load_with_adapter(1);
    /* the LoRA model holds the base once and the adapter; its gradients are the adapter's alone */
    assert_int_equal(st->in_use[KMEM_WEIGHTS] - w_start, 2 * base_bytes + m->lora->n * sizeof(float));
    const size_t g_before = st->in_use[KMEM_GRADS];
    model_trainable(m);
    assert_int_equal(st->in_use[KMEM_GRADS] - g_before, m->lora->n * sizeof(float));
    assert_null(m->grad);
    int T;
    int32_t *ids = fixture_ids("lora-qwen3", &T);
    const size_t nl = (size_t)(T > 0 ? T : 1) * m->cfg.vocab_size;
    float *a = malloc(nl * sizeof *a), *b = malloc(nl * sizeof *b);
    model_logits(base, ids, T, a);
    model_logits(m, ids, T, b);
    assert_true(memcmp(a, b, nl * sizeof *a) != 0);
    lora_set_bypass(m, true);
    model_logits(m, ids, T, b);
    assert_memory_equal(a, b, nl * sizeof *a);
    lora_set_bypass(m, false);
    free(a), free(b), free(ids);
    model_free(m);
    model_free(base);
}

/* target_modules: verl's spellings, and errors naming the entry; adapters we do not run are refused by name. */
/* lora_merged_weights, what the rollout TP shards: the same floats as lora_merge's W + s B A, the model left as
 * it was (its adapter attached, its base unchanged), and the base alone while bypassed. */
static void test_merged_weights(void **state)
{
    (void)state;
    struct model *m = load_with_adapter(1), *want = load_with_adapter(1), *base = load("tiny-qwen3");
    const size_t n = m->w.n_floats;
    assert_int_equal(n, base->w.n_floats);
    float *got = malloc(n * sizeof *got);
    lora_merged_weights(m, got);
    lora_merge(want);
    assert_memory_equal(got, want->w.mem, n * sizeof *got);
    assert_true(memcmp(got, base->w.mem, n * sizeof *got) != 0); /* the adapter moved the targeted weights */
    assert_non_null(m->lora);
    assert_memory_equal(m->w.mem, base->w.mem, n * sizeof *got);
    lora_set_bypass(m, true);
    lora_merged_weights(m, got);
    assert_memory_equal(got, base->w.mem, n * sizeof *got);
    free(got);
    model_free(m), model_free(want), model_free(base);
}

static void test_targets_and_refusals(void **state)
{
    (void)state;
    unsigned mask;
    char why[256];
    assert_int_equal(config_lora_targets("all-linear", &mask, why, sizeof why), 0);
    assert_int_equal(mask, LORA_ALL_LINEAR);
    assert_int_equal(config_lora_targets("[q_proj,v_proj]", &mask, why, sizeof why), 0);
    assert_int_equal(mask, 1u << PROJ_Q | 1u << PROJ_V);
    assert_int_equal(config_lora_targets("['o_proj', \"down_proj\"]", &mask, why, sizeof why), 0);
    assert_int_equal(mask, 1u << PROJ_O | 1u << PROJ_DOWN);
    assert_int_equal(config_lora_targets("gate_proj, up_proj", &mask, why, sizeof why), 0);
    assert_int_equal(mask, 1u << PROJ_GATE | 1u << PROJ_UP);
    assert_int_equal(config_lora_targets("[q_proj,lm_head]", &mask, why, sizeof why), -1);
    assert_non_null(strstr(why, "lm_head"));
    assert_int_equal(config_lora_targets("[]", &mask, why, sizeof why), -1);
    char buf[128];
    assert_string_equal(lora_targets_text(1u << PROJ_Q | 1u << PROJ_DOWN, buf, sizeof buf), "q_proj, down_proj");
    assert_string_equal(lora_targets_text(LORA_ALL_LINEAR, buf, sizeof buf), "all-linear");
    /* rsLoRA is refused naming the key */
    char tmp[] = "/tmp/grpo-lora-cfg-XXXXXX", path[128], err[512];
    assert_non_null(mkdtemp(tmp));
    snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
    FILE *f = fopen(path, "w");
    fputs("{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
          "\"use_rslora\": true}",
          f);
    fclose(f);
    struct lora_config c = {0};
    assert_int_equal(lora_read_config(tmp, &c, NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "use_rslora"));
    /* a rank that does not match the attached adapter */
    struct model *m = load("tiny-llama-untied");
    attach(m, 2, 4, LORA_ALL_LINEAR);
    char dir[256];
    snprintf(dir, sizeof dir, FIX "lora-llama-untied/adapter");
    assert_int_equal(lora_load(m, dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "rank 4"));
    model_free(m);
    unlink(path);
    rmdir(tmp);
}

/* A checkpoint of a LoRA run: the adapter in PEFT's layout (no base weights) and its optimizer state, loaded back
 * bit for bit; a run without LoRA refuses it by name. */
static void test_checkpoint_roundtrip(void **state)
{
    (void)state;
    char tmp[] = "/tmp/grpo-lora-ckpt-XXXXXX", err[1024], path[256];
    assert_non_null(mkdtemp(tmp));
    struct model *m = load("tiny-llama-untied");
    attach(m, 2, 4, 1u << PROJ_Q | 1u << PROJ_UP);
    randomise_adapter(m, 9, 0.2);
    const struct trainable tr = model_trainable(m);
    struct adamw *o = adamw_create(tr.n, 0.9, 0.999, 1e-8, 0.01);
    for (size_t i = 0; i < tr.n; i++)
        o->m[i] = (float)i * 1e-3f, o->v[i] = (float)i * 1e-4f;
    o->t = 3;
    struct run_state st = {.global_step = 5, .epoch = 1, .cursor = 2, .seed = 7, .total_steps = 9};
    assert_int_equal(checkpoint_save(tmp, m, o, NULL, &st, 0, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/global_step_5/actor/model.safetensors", tmp);
    assert_int_not_equal(access(path, F_OK), 0); /* the adapter alone */
    snprintf(path, sizeof path, "%s/global_step_5", tmp);
    struct model *r = load("tiny-llama-untied");
    attach(r, 2, 4, 1u << PROJ_Q | 1u << PROJ_UP);
    struct adamw *ro = adamw_create(model_trainable(r).n, 0.9, 0.999, 1e-8, 0.01);
    struct run_state rs;
    if (checkpoint_load(path, r, ro, &rs, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_memory_equal(r->lora->mem, m->lora->mem, m->lora->n * sizeof(float));
    assert_memory_equal(ro->m, o->m, tr.n * sizeof(float));
    assert_memory_equal(ro->v, o->v, tr.n * sizeof(float));
    assert_int_equal(ro->t, 3);
    assert_int_equal(rs.global_step, 5);
    struct model *plain = load("tiny-llama-untied");
    struct adamw *po = adamw_create(plain->w.n_floats, 0.9, 0.999, 1e-8, 0.01);
    assert_int_equal(checkpoint_load(path, plain, po, &rs, err, sizeof err), -1);
    assert_non_null(strstr(err, "holds a LoRA adapter"));
    adamw_free(o), adamw_free(ro), adamw_free(po);
    model_free(m), model_free(r), model_free(plain);
    must_rm_rf(tmp);
}

/* model_loss of a mixture of experts and the routing it took (tokens per expert per layer, into sig[8]). */
static double routed_loss(struct model *m, const struct fd_batch *f, double *sig)
{
    float logp[16], ent[16];
    model_moe_stats(m, NULL, NULL); /* forget earlier forwards */
    model_acts_free(model_forward(m, &f->b, 0.7f, false, logp, ent));
    model_moe_stats(m, sig, NULL);
    double s = 0;
    for (int i = 0; i < f->b.N; i++)
        s += (double)f->a[i] * logp[i] + (double)f->c[i] * ent[i];
    return s;
}

/* Central differences of the adapter's entries (four of each tensor) against g; an entry whose step flips a
 * top-k choice (a kink of the loss) is skipped. Returns the entries checked. */
static int routed_fd_check(struct model *m, const struct fd_batch *f, const struct param_ref *w,
                           const struct param_ref *g, int n, float h, int *skipped)
{
    int checked = 0;
    for (int r = 0; r < n; r++)
        for (size_t j = 0; j < w[r].numel; j += w[r].numel / 4 + 1) {
            const float keep = w[r].data[j];
            double s0[8] = {0}, sp[8] = {0}, sm[8] = {0};
            routed_loss(m, f, s0);
            w[r].data[j] = keep + h;
            const double lp = routed_loss(m, f, sp);
            w[r].data[j] = keep - h;
            const double lm = routed_loss(m, f, sm);
            w[r].data[j] = keep;
            if (memcmp(sp, s0, sizeof s0) != 0 || memcmp(sm, s0, sizeof s0) != 0) {
                (*skipped)++;
                continue;
            }
            const double fd = (lp - lm) / (2 * h);
            if (fabs(fd - g[r].data[j]) > 2e-3 + 2e-2 * fabs(fd))
                fail_msg("%s[%zu]: analytic %g, finite difference %g", w[r].name, j, g[r].data[j], fd);
            checked++;
        }
    return checked;
}

/* LoRA on a mixture of experts (issue 30 item 6): on the attention projections (PEFT's own adapters on them:
 * test_peft_adapter_matches_peft), the adapter's gradients through the routed layers (experts and routers frozen)
 * against central differences, the files in PEFT's layout read back. The experts are refused by name, and so is
 * all-linear: PEFT's all-linear there adapts the experts' and the router's parameters too (target_parameters). */
static void test_moe_attention_adapter(void **state)
{
    (void)state;
    const char *names[] = {"tiny-qwen3-moe", "tiny-mixtral"};
    const unsigned attn = 1u << PROJ_Q | 1u << PROJ_K | 1u << PROJ_V | 1u << PROJ_O;
    for (int k = 0; k < 2; k++) {
        struct model *m = load(names[k]);
        attach(m, 2, 5, attn);
        randomise_adapter(m, 11 + (unsigned)k, 0.3);
        struct fd_batch f;
        fd_batch_init(&f);
        float logp[9], ent[9];
        model_trainable(m);
        model_trainable_zero_grads(m);
        model_backward(m, model_forward(m, &f.b, 0.7f, false, logp, ent), f.a, f.c);
        assert_null(m->grad);
        const int n = lora_refs(m, m->lora->mem, NULL, 0);
        assert_int_equal(n, 2 * 4 * m->cfg.n_layers);
        struct param_ref *w = calloc((size_t)n, sizeof *w), *g = calloc((size_t)n, sizeof *g);
        lora_refs(m, m->lora->mem, w, n);
        lora_refs(m, m->lora->grad, g, n);
        int skipped = 0;
        const int checked = routed_fd_check(m, &f, w, g, n, 2e-3f, &skipped);
        assert_true(checked >= 3 * n && skipped * 10 <= checked + skipped);
        free(w), free(g);
        /* PEFT's files: target_modules lists the four projections; the adapter reads back into a fresh model */
        char tmp[] = "/tmp/grpo-lora-moe-XXXXXX", err[512], path[300];
        assert_non_null(mkdtemp(tmp));
        if (lora_save(m, tmp, "base", err, sizeof err) != 0)
            fail_msg("%s", err);
        snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
        json_error_t je;
        json_t *cfg = json_load_file(path, 0, &je);
        assert_non_null(cfg);
        assert_int_equal(json_array_size(json_object_get(cfg, "target_modules")), 4);
        json_decref(cfg);
        struct model *r = load(names[k]);
        if (lora_load(r, tmp, err, sizeof err) != 0)
            fail_msg("%s", err);
        assert_memory_equal(r->lora->mem, m->lora->mem, m->lora->n * sizeof(float));
        model_free(r);
        /* target_parameters of the fused experts without PEFT's doubled rank for gate_up_proj, or naming a
         * parameter that is not the experts' or the router's: refused by name */
        FILE *fp = fopen(path, "w");
        fputs("{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 5, \"target_modules\": [\"q_proj\"], "
              "\"target_parameters\": [\"down_proj\", \"gate.weight\", \"gate_up_proj\"]}",
              fp);
        fclose(fp);
        r = load(names[k]);
        assert_int_equal(lora_load(r, tmp, err, sizeof err), -1);
        assert_non_null(strstr(err, "target_parameters names gate_up_proj but rank_pattern has no entry for it"));
        fp = fopen(path, "w");
        fputs("{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 5, \"target_modules\": [\"q_proj\"], "
              "\"target_parameters\": [\"experts.w9\"]}",
              fp);
        fclose(fp);
        assert_int_equal(lora_load(r, tmp, err, sizeof err), -1);
        assert_non_null(strstr(err, "target_parameters names experts.w9"));
        assert_null(r->lora);
        model_free(r);
        must_rm_rf(tmp);
        /* gate_proj without up_proj: one fused parameter, refused by name (as PEFT does) */
        r = load(names[k]);
        const struct lora_config gate = {.rank = 2, .alpha = 4, .targets = 1u << PROJ_Q | 1u << PROJ_GATE};
        assert_int_equal(lora_attach(r, &gate, err, sizeof err), -1);
        assert_non_null(strstr(err, "gate_proj without up_proj on a mixture-of-experts model (4 experts)"));
        assert_null(r->lora);
        model_free(r);
        model_free(m);
    }
}

/* LoRA on the experts and the router (all-linear, as PEFT's): the adapter's gradients through the grouped expert
 * products against central differences (the entropy term too), and PEFT's files (target_parameters, the doubled
 * rank and alpha of gate_up_proj) read back into a fresh model bit for bit. */
static void test_moe_expert_adapter(void **state)
{
    (void)state;
    const char *names[] = {"tiny-qwen3-moe", "tiny-mixtral"};
    for (int k = 0; k < 2; k++) {
        struct model *m = load(names[k]);
        char err[512];
        const struct lora_config all = {.rank = 2, .alpha = 5, .targets = LORA_ALL_LINEAR, .router = true};
        if (lora_attach(m, &all, err, sizeof err) != 0)
            fail_msg("%s", err);
        randomise_adapter(m, 21 + (unsigned)k, 0.3);
        struct fd_batch f;
        fd_batch_init(&f);
        float logp[9], ent[9];
        model_trainable(m);
        model_trainable_zero_grads(m);
        model_backward(m, model_forward(m, &f.b, 0.7f, false, logp, ent), f.a, f.c);
        const int n = lora_refs(m, m->lora->mem, NULL, 0);
        assert_int_equal(n, (2 * 4 + 2 * 3) * m->cfg.n_layers); /* q k v o, gate_up and down, the router */
        struct param_ref *w = calloc((size_t)n, sizeof *w), *g = calloc((size_t)n, sizeof *g);
        lora_refs(m, m->lora->mem, w, n);
        lora_refs(m, m->lora->grad, g, n);
        int skipped = 0, experts = 0;
        for (int r = 0; r < n; r++)
            experts += strstr(w[r].name, "mlp.experts") != NULL;
        assert_int_equal(experts, 4 * m->cfg.n_layers);
        const int checked = routed_fd_check(m, &f, w, g, n, 2e-3f, &skipped);
        assert_true(checked >= 3 * n && skipped * 10 <= checked + skipped);
        free(w), free(g);
        char tmp[] = "/tmp/grpo-lora-moex-XXXXXX", path[300];
        assert_non_null(mkdtemp(tmp));
        if (lora_save(m, tmp, "base", err, sizeof err) != 0)
            fail_msg("%s", err);
        snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
        json_error_t je;
        json_t *cfg = json_load_file(path, 0, &je);
        assert_non_null(cfg);
        assert_int_equal(json_array_size(json_object_get(cfg, "target_modules")), 4);
        assert_int_equal(json_array_size(json_object_get(cfg, "target_parameters")), 3);
        assert_int_equal(json_integer_value(json_object_get(json_object_get(cfg, "rank_pattern"), ".*\\.gate_up_proj")),
                         4);
        assert_int_equal(
            json_integer_value(json_object_get(json_object_get(cfg, "alpha_pattern"), ".*\\.gate_up_proj")), 10);
        json_decref(cfg);
        struct model *r = load(names[k]);
        if (lora_load(r, tmp, err, sizeof err) != 0)
            fail_msg("%s", err);
        assert_true(r->lora->cfg.router);
        assert_int_equal(r->lora->cfg.targets, LORA_ALL_LINEAR);
        assert_int_equal(r->lora->n, m->lora->n);
        assert_memory_equal(r->lora->mem, m->lora->mem, m->lora->n * sizeof(float));
        model_free(r);
        must_rm_rf(tmp);
        model_free(m);
    }
}

/* The keys: rank 0 is off; TP or PP with LoRA run, but not together with EP: refused naming the keys. */
static void test_config_keys(void **state)
{
    (void)state;
    struct grpo_config c;
    struct cfg_error err = {{0}};
    config_init(&c);
    assert_int_equal(c.arr_model_lora_rank, 0);
    assert_true(c.arr_model_lora_alpha == 16);
    assert_string_equal(c.arr_model_target_modules, "all-linear");
    assert_int_equal(config_validate(&c, &err), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.lora_rank=8", &err), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.target_modules=[q_proj,x_proj]", &err), 0);
    assert_int_equal(config_validate(&c, &err), -1);
    assert_non_null(strstr(err.msg, "x_proj"));
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.target_modules=[q_proj,v_proj]", &err), 0);
    assert_int_equal(config_validate(&c, &err), 0);
    /* exclude_modules (verl's, PEFT's list form): target_modules without them; a regular expression is refused,
     * and so is an exclusion that leaves nothing */
    unsigned mask;
    char why[512];
    assert_int_equal(config_lora_mask(&c, &mask, why, sizeof why), 0);
    assert_int_equal(mask, 1u | 4u);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.target_modules=all-linear", &err), 0);
    assert_int_equal(
        config_apply_override(&c, "actor_rollout_ref.model.lora.exclude_modules=['o_proj', down_proj]", &err), 0);
    assert_int_equal(config_validate(&c, &err), 0);
    assert_int_equal(config_lora_mask(&c, &mask, why, sizeof why), 0);
    assert_int_equal(mask, 0x7fu & ~(8u | 64u));
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.exclude_modules=.*visual.*", &err), 0);
    assert_int_equal(config_validate(&c, &err), -1);
    assert_non_null(strstr(err.msg, "actor_rollout_ref.model.exclude_modules '.*visual.*': a regular expression"));
    assert_non_null(strstr(err.msg, "not available"));
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.target_modules=[o_proj]", &err), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.exclude_modules=[o_proj]", &err), 0);
    assert_int_equal(config_validate(&c, &err), -1);
    assert_non_null(strstr(err.msg, "leaves nothing of actor_rollout_ref.model.target_modules '[o_proj]'"));
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.exclude_modules=null", &err), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.target_modules=[q_proj,v_proj]", &err), 0);
    assert_int_equal(config_validate(&c, &err), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", &err),
                     0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", &err),
                     0);
    assert_int_equal(config_validate(&c, &err), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2", &err),
                     0);
    assert_int_equal(config_validate(&c, &err), -1);
    assert_non_null(strstr(err.msg, "actor_rollout_ref.model.lora_rank"));
    assert_non_null(strstr(err.msg, "expert_model_parallel_size=2"));
    assert_non_null(strstr(err.msg, "tensor_model_parallel_size=2"));
    assert_non_null(strstr(err.msg, "LoRA with expert parallelism and training tensor or pipeline parallelism"));
    config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zero_b_is_base_bitwise),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_proj_dx_finite_differences),
        cmocka_unit_test(test_peft_adapter_matches_peft),
        cmocka_unit_test(test_save_and_merge),
        cmocka_unit_test(test_bypass_is_base),
        cmocka_unit_test(test_merged_weights),
        cmocka_unit_test(test_targets_and_refusals),
        cmocka_unit_test(test_checkpoint_roundtrip),
        cmocka_unit_test(test_moe_attention_adapter),
        cmocka_unit_test(test_moe_expert_adapter),
        cmocka_unit_test(test_config_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
