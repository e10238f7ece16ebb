/* The kernel interface's contexts, arenas and KV slab: plans that match their use, no allocation in a steady
 * training or generation step, memory counted by kind, and clear errors for a wrong plan or an exhausted device. */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "capture.h"

#include "common/check.h"
#include "kernels/cpu/cpu_kernels.h" /* kops_cpu, sample_row */
#include "kernels/kernels.h"
#include "worker/model/model_generate.h"
#include "worker/model/model.h"

static struct kctx *fresh_cpu(void)
{
    char why[256];
    struct kctx *K = kctx_create("cpu", KMM_F32, why, sizeof why);
    assert_non_null(K);
    return K;
}

static void test_arena_plan_and_reuse(void **state)
{
    (void)state;
    struct kctx *K = fresh_cpu();
    struct karena plan, a;
    karena_init_counter(&plan);
    assert_null(karena_take(&plan, 10));
    assert_null(karena_take(&plan, 64));
    assert_null(karena_take(&plan, 65));
    assert_int_equal(plan.used, 64 + 64 + 128); /* each piece rounded up to 64 bytes */
    karena_init(&a, K, KMEM_ACTS, "test");
    karena_reserve(&a, plan.used, 0);
    const unsigned long long allocs = K->mem.allocs;
    char *p1 = karena_take(&a, 10), *p2 = karena_take(&a, 64), *p3 = karena_take(&a, 65);
    assert_true((uintptr_t)p1 % 64 == 0 && p2 == p1 + 64 && p3 == p2 + 64);
    assert_int_equal(a.used, plan.used);
    assert_int_equal(K->mem.in_use[KMEM_ACTS], a.cap);
    karena_reset(&a);
    karena_reserve(&a, plan.used, 0); /* the same plan again: nothing new */
    assert_int_equal(K->mem.allocs, allocs);
    assert_ptr_equal(karena_take(&a, 10), p1);
    karena_reset(&a);
    karena_reserve(&a, plan.used * 2, 0); /* a larger shape: one new reservation */
    assert_int_equal(K->mem.allocs, allocs + 1);
    karena_release(&a);
    assert_int_equal(K->mem.in_use[KMEM_ACTS], 0);
    assert_true(K->mem.peak[KMEM_ACTS] >= plan.used * 2);
    kctx_free(K);
}

static void overrun(void)
{
    struct karena a;
    karena_init(&a, kctx_cpu(), KMEM_ACTS, "activations");
    karena_reserve(&a, 128, 0);
    karena_take(&a, 100);
    karena_take(&a, 100);
}

static void *null_alloc(struct kctx *K, size_t bytes)
{
    (void)K, (void)bytes;
    return NULL;
}

static void exhausted(void)
{
    static struct kops ops;
    ops = kops_cpu;
    ops.alloc = null_alloc;
    struct kctx K = {.ops = &ops, .device = KDEV_CPU};
    K.mem.in_use[KMEM_WEIGHTS] = 2000000000;
    k_alloc(&K, 1u << 20, KMEM_ACTS, "activations of 4096 tokens");
}

static void test_errors_name_the_cause(void **state)
{
    (void)state;
    char out[4096];
    assert_int_not_equal(capture(overrun, out, sizeof out), 0);
    assert_non_null(strstr(out, "activations arena holds"));
    assert_non_null(strstr(out, "beyond its plan"));
    assert_int_not_equal(capture(exhausted, out, sizeof out), 0);
    assert_non_null(strstr(out, "out of memory on cpu"));
    assert_non_null(strstr(out, "activations of 4096 tokens"));
    assert_non_null(strstr(out, "1048576 bytes"));
    assert_non_null(strstr(out, "weights 2.000 GB"));
    assert_non_null(strstr(out, "enable_gradient_checkpointing"));
}

static void test_unknown_device(void **state)
{
    (void)state;
    char why[256] = "";
    assert_null(kctx_create("tpu", KMM_F32, why, sizeof why));
    assert_non_null(strstr(why, "unknown device 'tpu'"));
    if (!kctx_cuda_available()) {
        assert_null(kctx_create("cuda:0", KMM_F32, why, sizeof why));
        assert_non_null(strstr(why, "cuda"));
    }
}

/* The back-ends register themselves: the build's list starts with the host's (the CPU, with the host's helpers), a
 * context's back-end is found by its device's name, and the interface describes it from the registered table. */
static void test_backends_registered(void **state)
{
    (void)state;
    assert_non_null(kbackends[0]);
    assert_string_equal(kbackends[0]->name, "cpu");
    assert_ptr_equal(kbackend_find("cpu"), kbackends[0]);
    assert_ptr_equal(kbackends[0]->ops, &kops_cpu);
    assert_non_null(khost());
    assert_null(kbackend_find("tpu"));
    int n = 0;
    for (const struct kbackend *const *b = kbackends; *b; b++, n++)
        assert_non_null((*b)->ops);
    assert_true(n >= 1);
#ifdef GRPO_HAVE_CUDA
    assert_non_null(kbackend_find("cuda"));
#else
    assert_null(kbackend_find("cuda"));
#endif
    assert_ptr_equal(kctx_cpu()->ops, &kops_cpu);
    char d[256], blas[256];
    kctx_describe(kctx_cpu(), d, sizeof d);
    char want[600];
    snprintf(want, sizeof want, "cpu, fp32 GEMMs (%s)", khost_blas_kernels(blas, sizeof blas));
    assert_string_equal(d, want);
    /* the host's helpers: a row sampled greedily through the interface is the CPU kernels' */
    const float logits[4] = {0.5f, 2.0f, -1.0f, 1.0f};
    float a = 0, b = 0;
    assert_int_equal(khost_sample_row(logits, 4, 0, 1, 0, 0.3, &a), sample_row(logits, 4, 0, 1, 0, 0.3, &b));
    assert_true(a == b);
}

/* The CPU back-end keeps freed big blocks (4 MiB and more) for the next allocation they fit, instead of mapping
 * them anew (a page fault per 4 KiB written): the same memory comes back, zeroed by k_calloc, counted in reserved;
 * what is kept idle never exceeds the big blocks in use; small blocks are malloc's; GRPO_CPU_KEEP_FREED=0 keeps none.
 */
static void test_cpu_keeps_freed_big_blocks(void **state)
{
    (void)state;
    struct kctx *K = fresh_cpu();
    const size_t big = (size_t)16 << 20, n = big / sizeof(float);
    unsetenv("GRPO_CPU_KEEP_FREED");
    float *hold = k_alloc(K, (size_t)64 << 20, KMEM_WEIGHTS, "weights"); /* in use: room to keep what is freed */
    float *a = k_alloc(K, big, KMEM_GRADS, "gradients");
    assert_int_equal((uintptr_t)a % 4096, 0);
    for (size_t i = 0; i < n; i++)
        a[i] = 1.0f;
    k_free(K, a, big, KMEM_GRADS);
    assert_true(K->mem.reserved >= K->mem.allocated + big); /* kept: reserved, not allocated */
    float *b = k_alloc(K, big - 4096, KMEM_GRADS, "gradients again");
    assert_ptr_equal(b, a); /* the same block, its pages kept: what was written is there (a new mapping is zeros) */
    assert_true(b[0] == 1.0f && b[n / 2] == 1.0f && b[n - 1025] == 1.0f);
    k_free(K, b, big - 4096, KMEM_GRADS);
    b = k_calloc(K, big - 4096, KMEM_GRADS, "gradients again, zeroed");
    assert_ptr_equal(b, a);
    for (size_t i = 0; i < n - 1024; i++)
        if (b[i] != 0.0f)
            fail_msg("reused block not zeroed at %zu: %g", i, (double)b[i]);
    /* a block too big for it (more than twice) is not taken for a small request */
    k_free(K, b, big - 4096, KMEM_GRADS);
    float *c = k_alloc(K, big / 4, KMEM_ACTS, "activations"); /* 4 MiB: a big block, a quarter of the kept one */
    assert_ptr_not_equal(c, a);
    k_free(K, c, big / 4, KMEM_ACTS);
    float *d = k_alloc(K, big / 2, KMEM_ACTS, "activations"); /* half: the kept block is taken */
    assert_ptr_equal(d, a);
    k_free(K, d, big / 2, KMEM_ACTS);
#if defined(__SANITIZE_ADDRESS__)
    /* under AddressSanitizer a kept block is poisoned: a read after its free is reported (the child ends failed) */
    float *gone = k_alloc(K, big, KMEM_GRADS, "gradients");
    k_free(K, gone, big, KMEM_GRADS);
    fflush(NULL);
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        volatile float x = gone[n / 2]; /* reported here */
        (void)x;
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_false(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
    /* idle memory is bounded by what is in use: with the weights freed, nothing big is in use, nothing kept */
    k_free(K, hold, (size_t)64 << 20, KMEM_WEIGHTS);
    assert_int_equal(K->mem.reserved, K->mem.allocated);
    /* off: a freed block is unmapped, nothing kept */
    setenv("GRPO_CPU_KEEP_FREED", "0", 1);
    hold = k_alloc(K, (size_t)64 << 20, KMEM_WEIGHTS, "weights");
    a = k_alloc(K, big, KMEM_GRADS, "gradients");
    a[0] = 1.0f;
    k_free(K, a, big, KMEM_GRADS);
    assert_int_equal(K->mem.reserved, K->mem.allocated);
    b = k_alloc(K, big, KMEM_GRADS, "gradients again");
    assert_true(b[0] == 0.0f); /* a new mapping, wherever it lies */
    k_free(K, b, big, KMEM_GRADS);
    k_free(K, hold, (size_t)64 << 20, KMEM_WEIGHTS);
    unsetenv("GRPO_CPU_KEEP_FREED");
    /* small blocks: malloc's, freed through the same op */
    void *s = k_alloc(K, 1000, KMEM_OTHER, "small");
    assert_int_equal((uintptr_t)s % 64, 0);
    k_free(K, s, 1000, KMEM_OTHER);
    kctx_free(K);
}

static const struct model_config tiny = {.arch = ARCH_QWEN3,
                                         .vocab_size = 53,
                                         .hidden_size = 16,
                                         .intermediate_size = 24,
                                         .n_layers = 2,
                                         .n_heads = 4,
                                         .n_kv_heads = 2,
                                         .head_dim = 6,
                                         .rope_theta = 10000,
                                         .rms_norm_eps = 1e-5f,
                                         .qk_norm = true,
                                         .max_position_embeddings = 64,
                                         .bos_token_id = -1,
                                         .eos_token_id = -1};

/* A forward and backward of two sequences: logp and the gradients. */
static void train_step(struct model *m, bool ckpt, float *logp, float *grads)
{
    int32_t ids[11], targets[11], pos[11], cu[3] = {0, 5, 11};
    for (int i = 0; i < 11; i++) {
        ids[i] = (i * 7 + 3) % tiny.vocab_size;
        targets[i] = (i * 5 + 1) % tiny.vocab_size;
        pos[i] = i < 5 ? i : i - 5;
    }
    const struct packed_batch b = {11, 2, ids, targets, pos, cu, NULL, NULL, NULL};
    float dlogp[11], ent[11];
    for (int i = 0; i < 11; i++)
        dlogp[i] = 0.1f * (float)(i % 3) - 0.1f;
    model_zero_grads(m);
    struct model_acts *A = model_forward(m, &b, 0.9f, ckpt, logp, ent);
    model_backward(m, A, dlogp, NULL);
    memcpy(grads, m->grad->mem, m->grad->n_floats * sizeof(float));
}

static void test_steady_training_step_allocates_nothing(void **state)
{
    (void)state;
    struct kctx *K = fresh_cpu();
    struct model *m = model_create_on(&tiny, NULL, K);
    model_init_random(m, 7, 0.2);
    const size_t w_bytes = m->w.n_floats * sizeof(float);
    assert_true(K->mem.in_use[KMEM_WEIGHTS] >= w_bytes);
    model_alloc_grads(m);
    assert_int_equal(K->mem.in_use[KMEM_GRADS], w_bytes);
    float *g1 = xmalloc(w_bytes), *g2 = xmalloc(w_bytes), *g3 = xmalloc(w_bytes);
    float lp1[11], lp2[11], lp3[11];
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        train_step(m, ckpt, lp1, g1);
        const unsigned long long allocs = K->mem.allocs;
        train_step(m, ckpt, lp2, g2);
        assert_int_equal(K->mem.allocs, allocs); /* the second step of a shape takes no memory */
        /* reused buffers give the same numbers */
        assert_memory_equal(lp1, lp2, sizeof lp1);
        assert_memory_equal(g1, g2, w_bytes);
        if (ckpt) { /* recomputation gives the same gradients */
            assert_memory_equal(lp1, lp3, sizeof lp1);
            assert_memory_equal(g1, g3, w_bytes);
        }
        memcpy(lp3, lp1, sizeof lp1);
        memcpy(g3, g1, w_bytes);
    }
    free(g1), free(g2), free(g3);
    model_free(m);
    for (int k = 0; k < KMEM_KINDS; k++)
        assert_int_equal(K->mem.in_use[k], 0); /* everything given back */
    kctx_free(K);
}

/* Rows of one GEMM may round differently by position (the BLAS's edge kernels): equal to 1e-5. */
static void assert_close(const float *a, const float *b, int n)
{
    for (int i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > 1e-5f * (1.0f + fabsf(a[i])))
            fail_msg("element %d: %.9g against %.9g", i, (double)a[i], (double)b[i]);
}

static void test_kv_slab_and_steady_decode(void **state)
{
    (void)state;
    struct kctx *K = fresh_cpu();
    struct model *m = model_create_on(&tiny, NULL, K);
    model_init_random(m, 9, 0.3);
    struct kv_slab *s = kv_slab_create(m, 3, 8);
    assert_int_equal(K->mem.allocs > 0, 1);
    const size_t KD = (size_t)tiny.n_kv_heads * tiny.head_dim;
    assert_int_equal(K->mem.in_use[KMEM_KV], 3u * tiny.n_layers * 2 * 8 * KD * sizeof(float));
    struct kv_cache *c[3] = {kv_slab_slot(s, 0), kv_slab_slot(s, 1), kv_slab_slot(s, 2)};
    const int32_t prompt[4] = {1, 2, 3, 4};
    int ntok[3] = {4, 4, 4};
    int32_t ids[12];
    for (int i = 0; i < 12; i++)
        ids[i] = prompt[i % 4];
    float logits[3 * 53];
    model_step(m, c, 3, ntok, ids, logits, false);
    /* the same prompt in three slots: the same logits (the slots do not overlap) */
    assert_close(logits, logits + 53, 53);
    assert_close(logits, logits + 106, 53);
    int one[3] = {1, 1, 1};
    int32_t next[3] = {5, 5, 5};
    model_step(m, c, 3, one, next, logits, false);
    const unsigned long long allocs = K->mem.allocs;
    next[0] = 6, next[1] = 7, next[2] = 6;
    model_step(m, c, 3, one, next, logits, false);
    assert_int_equal(K->mem.allocs, allocs); /* a decode step of a seen shape allocates nothing */
    assert_close(logits, logits + 106, 53);
    bool differ = false;
    for (int i = 0; i < 53; i++)
        differ |= fabsf(logits[i] - logits[53 + i]) > 1e-3f;
    assert_true(differ); /* another token, other logits */
    /* a copied cache continues as the original */
    kv_cache_copy(m, c[1], c[0]);
    next[0] = 8, next[1] = 8;
    model_step(m, c, 2, one, next, logits, false);
    assert_close(logits, logits + 53, 53);
    kv_slab_free(s);
    assert_int_equal(K->mem.in_use[KMEM_KV], 0);
    model_free(m);
    kctx_free(K);
}

/* The model with BF16 matrix products against fp32: log-probs and gradients within BF16's bounds (8 bits of
 * mantissa in the products' inputs), and not the same numbers (the BF16 path ran). */
static void test_bf16_model_within_bounds(void **state)
{
    (void)state;
    char why[256];
    struct kctx *bf = kctx_create("cpu", KMM_BF16, why, sizeof why);
    if (!bf) {
        print_message("skipped: %s\n", why);
        skip();
    }
    struct model *m = model_create(&tiny);
    model_init_random(m, 11, 0.2);
    struct model *b = model_copy_to(m, bf);
    model_alloc_grads(m), model_alloc_grads(b);
    const size_t n = m->w.n_floats;
    float *g32 = xmalloc(n * sizeof(float)), *g16 = xmalloc(n * sizeof(float));
    float l32[11], l16[11];
    train_step(m, false, l32, g32);
    train_step(b, false, l16, g16);
    double dl = 0, dg = 0, gmax = 0;
    for (int i = 0; i < 11; i++)
        dl = fmax(dl, fabs((double)l32[i] - l16[i]));
    for (size_t i = 0; i < n; i++) {
        dg = fmax(dg, fabs((double)g32[i] - g16[i]));
        gmax = fmax(gmax, fabs((double)g32[i]));
    }
    print_message("bf16 against fp32: log-probs %.2e, gradients %.2e of the largest\n", dl, dg / gmax);
    assert_true(dl > 0 && dl < 2e-2);
    assert_true(dg > 0 && dg < 3e-2 * gmax);
    free(g32), free(g16);
    model_free(b), model_free(m);
    kctx_free(bf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_plan_and_reuse),
        cmocka_unit_test(test_errors_name_the_cause),
        cmocka_unit_test(test_unknown_device),
        cmocka_unit_test(test_backends_registered),
        cmocka_unit_test(test_cpu_keeps_freed_big_blocks),
        cmocka_unit_test(test_steady_training_step_allocates_nothing),
        cmocka_unit_test(test_kv_slab_and_steady_decode),
        cmocka_unit_test(test_bf16_model_within_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
