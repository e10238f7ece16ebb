/* Contexts, counted memory and arenas of the kernel interface (kernels.h); the ops are the back-ends'. */
#include "kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <threads.h>

#include "common/check.h"
#include "common/config_key_names.h"

/* The device names of enum kdevice: a context's back-end is the registered one of its device's name. */
static const char *const device_name[] = {[KDEV_CPU] = "cpu", [KDEV_CUDA] = "cuda"};

const struct kbackend *kbackend_find(const char *name)
{
    for (const struct kbackend *const *b = kbackends; *b; b++)
        if (strcmp((*b)->name, name) == 0)
            return *b;
    return NULL;
}

static const struct kbackend *backend_of(const struct kctx *K) { return kbackend_find(device_name[K->device]); }

static struct kctx g_cpu = {.device = KDEV_CPU, .matmul = KMM_F32};
static once_flag g_cpu_once = ONCE_FLAG_INIT;
static void cpu_init(void) { g_cpu.ops = kbackend_find("cpu")->ops; }

struct kctx *kctx_cpu(void)
{
    call_once(&g_cpu_once, cpu_init);
    return &g_cpu;
}

int kctx_cuda_devices(void)
{
    const struct kbackend *b = kbackend_find("cuda");
    return b && b->devices ? b->devices() : 0;
}

bool kctx_cuda_available(void) { return kctx_cuda_devices() > 0; }

size_t kctx_device_bytes(struct kctx *K)
{
    const struct kbackend *b = backend_of(K);
    return b && b->device_bytes ? b->device_bytes(K) : 0;
}

struct kctx *kctx_create(const char *device, enum kmatmul matmul, char *why, size_t len)
{
    const char *d = device && *device ? device : "cpu";
    enum kdevice dev = KDEV_CPU;
    int index = 0;
    if (strcmp(d, "cpu") != 0) {
        if (strncmp(d, "cuda:", 5) == 0) {
            char *end;
            const long v = strtol(d + 5, &end, 10);
            index = end != d + 5 && !*end && v >= 0 && v < 1024 ? (int)v : -1;
        }
        if ((strcmp(d, "cuda") != 0 && strncmp(d, "cuda:", 5) != 0) || index < 0) {
            error_set(why, len, "unknown device '%s' (cpu, cuda or cuda:N)", d);
            return NULL;
        }
        dev = KDEV_CUDA;
    }
    const struct kbackend *b = kbackend_find(device_name[dev]);
    if (!b) {
        error_set(why, len,
                  "device '%s': this build has no CUDA back-end (configure with -Dcuda=enabled on a machine "
                  "with nvcc)",
                  d);
        return NULL;
    }
    struct kctx *K = xcalloc(1, sizeof *K);
    *K = (struct kctx){.ops = b->ops, .device = b->device, .device_index = index, .matmul = matmul};
    if (b->open && b->open(K, index, why, len) != 0) {
        free(K);
        return NULL;
    }
    return K;
}

void kctx_free(struct kctx *K)
{
    if (!K || K == &g_cpu)
        return;
    const struct kbackend *b = backend_of(K);
    if (b && b->close)
        b->close(K);
    free(K);
}

const char *kctx_describe(const struct kctx *K, char *buf, size_t len)
{
    const char *mm = K->matmul == KMM_BF16 ? "BF16 GEMMs, fp32 accumulation" : "fp32 GEMMs";
    const struct kbackend *b = backend_of(K);
    if (b && b->gemm_name) {
        char gemm[256];
        snprintf(buf, len, "%s, %s (%s)", b->name, mm, b->gemm_name(K, gemm, sizeof gemm));
    } else {
        snprintf(buf, len, "%s:%d, %s", device_name[K->device], K->device_index, mm);
    }
    return buf;
}

static const char *kind_name[KMEM_KINDS] = {"weights",     "gradients", "optimizer state",
                                            "activations", "KV cache",  "other"};
/* The setting that lowers each kind of memory. */
static const char *kind_knob[KMEM_KINDS] = {
    "split the model over more ranks (actor_rollout_ref.actor.megatron.tensor_model_parallel_size or "
    "pipeline_model_parallel_size)",
    "split the model over more ranks (tensor_model_parallel_size or pipeline_model_parallel_size)",
    "shard it over the data-parallel ranks (actor_rollout_ref.actor.zero_stage=1) or split the model",
    "lower actor_rollout_ref.actor.ppo_max_token_len_per_gpu or set "
    "actor_rollout_ref.model.enable_gradient_checkpointing=true",
    "lower actor_rollout_ref.rollout.max_num_seqs or data.max_response_length",
    "lower the batch sizes"};

static double gb(size_t b) { return (double)b / 1e9; }

/* The CPU's reserved: what is allocated, and what the host keeps of freed memory (kernels/cpu/backend.c); a device
 * back-end that caches updates reserved itself */
static void host_reserved(struct kctx *K)
{
    if (K->device == KDEV_CPU)
        K->mem.reserved = K->mem.allocated + (K->ops->cached ? K->ops->cached(K) : 0);
}

void *k_alloc(struct kctx *K, size_t bytes, enum kmem_kind kind, const char *what)
{
    void *p = K->ops->alloc(K, bytes);
    if (!p) {
        struct kmem_stats *s = &K->mem;
        check_failf(__FILE__, __LINE__,
                    "out of memory on %s: %s (%s) needs %zu bytes (%.3f GB); in use: weights %.3f GB, gradients "
                    "%.3f GB, optimizer state %.3f GB, activations %.3f GB, KV cache %.3f GB; to fit, %s",
                    K->ops->name, what ? what : "a buffer", kind_name[kind], bytes, gb(bytes),
                    gb(s->in_use[KMEM_WEIGHTS]), gb(s->in_use[KMEM_GRADS]), gb(s->in_use[KMEM_OPTIM]),
                    gb(s->in_use[KMEM_ACTS]), gb(s->in_use[KMEM_KV]), kind_knob[kind]);
    }
    struct kmem_stats *s = &K->mem;
    s->allocs++;
    s->in_use[kind] += bytes;
    if (s->in_use[kind] > s->peak[kind])
        s->peak[kind] = s->in_use[kind];
    s->allocated += bytes;
    if (s->allocated > s->max_allocated)
        s->max_allocated = s->allocated;
    host_reserved(K);
    if (s->allocated > s->reserved)
        s->reserved = s->allocated;
    if (s->reserved > s->max_reserved)
        s->max_reserved = s->reserved;
    if (kind == KMEM_WEIGHTS && K->ops->weights_note)
        K->ops->weights_note(K, p, bytes);
    return p;
}

void *k_calloc(struct kctx *K, size_t bytes, enum kmem_kind kind, const char *what)
{
    void *p = k_alloc(K, bytes, kind, what);
    k_zero(K, p, bytes);
    return p;
}

void k_free(struct kctx *K, void *p, size_t bytes, enum kmem_kind kind)
{
    if (!p)
        return;
    if (kind == KMEM_WEIGHTS && K->ops->weights_forget)
        K->ops->weights_forget(K, p);
    K->ops->free(K, p);
    struct kmem_stats *s = &K->mem;
    s->in_use[kind] -= bytes <= s->in_use[kind] ? bytes : s->in_use[kind];
    s->allocated -= bytes <= s->allocated ? bytes : s->allocated;
    host_reserved(K);
}

void kmem_reset_peaks(struct kctx *K)
{
    struct kmem_stats *s = &K->mem;
    for (int i = 0; i < KMEM_KINDS; i++)
        s->peak[i] = s->in_use[i];
    s->max_allocated = s->allocated;
    s->max_reserved = s->reserved;
}

bool k_graph_begin(struct kctx *K, char *why, size_t len)
{
    if (K->ops->graph_begin)
        return K->ops->graph_begin(K, why, len);
    snprintf(why, len, "the %s back-end has no graphs", K->ops->name);
    return false;
}

#define ARENA_ALIGN 64

size_t karena_piece(size_t bytes) { return (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

void karena_init(struct karena *a, struct kctx *K, enum kmem_kind kind, const char *what)
{
    *a = (struct karena){.K = K, .kind = kind, .what = what};
}

void karena_init_host(struct karena *a, struct kctx *K, const char *what)
{
    *a = (struct karena){.K = K, .kind = KMEM_ACTS, .what = what, .host = true};
}

/* The host arena's memory, counted apart from the device's. */
static void *host_take(struct kctx *K, size_t bytes, const char *what)
{
    void *p = K->ops->host_alloc(K, bytes);
    if (!p)
        check_failf(__FILE__, __LINE__,
                    "out of host memory for %s: %zu bytes (%.3f GB) of %s host memory more, %.3f GB held; to fit, "
                    "lower " KEY_actor_ppo_max_token_len_per_gpu " or set " KEY_arr_model_enable_activation_offload
                    "=false",
                    what, bytes, gb(bytes), K->device == KDEV_CPU ? "plain" : "pinned", gb(K->mem.host));
    K->mem.host += bytes;
    if (K->mem.host > K->mem.max_host)
        K->mem.max_host = K->mem.host;
    return p;
}

static void host_give(struct kctx *K, void *p, size_t bytes)
{
    K->ops->host_free(K, p);
    K->mem.host -= bytes <= K->mem.host ? bytes : K->mem.host;
}

void karena_init_counter(struct karena *a) { *a = (struct karena){.cap = SIZE_MAX, .what = "plan"}; }

void karena_reserve(struct karena *a, size_t bytes, size_t pieces)
{
    if (a->used)
        check_failf(__FILE__, __LINE__, "karena_reserve: the %s arena is in use (%zu bytes taken)", a->what, a->used);
    const size_t need = bytes + pieces * ARENA_ALIGN;
    if (need <= a->cap)
        return;
    karena_release(a);
    a->base = a->host ? host_take(a->K, need, a->what) : k_alloc(a->K, need, a->kind, a->what);
    a->cap = need;
}

void *karena_take(struct karena *a, size_t bytes)
{
    const size_t n = karena_piece(bytes ? bytes : 1);
    if (a->used + n > a->cap)
        check_failf(__FILE__, __LINE__, "the %s arena holds %zu bytes and %zu are taken: %zu more is beyond its plan",
                    a->what, a->cap, a->used, n);
    if (!a->base && !a->K) { /* a counter */
        a->used += n;
        return NULL;
    }
    void *p = a->base + a->used;
    a->used += n;
    if (a->used > a->peak)
        a->peak = a->used;
    return p;
}

float *karena_floats0(struct karena *a, size_t n)
{
    float *p = karena_take(a, n * sizeof(float));
    if (p)
        k_zero(a->K, p, n * sizeof(float));
    return p;
}

void karena_reset(struct karena *a) { a->used = 0; }

void karena_release(struct karena *a)
{
    if (a->base && a->host)
        host_give(a->K, a->base, a->cap);
    else if (a->base)
        k_free(a->K, a->base, a->cap, a->kind);
    a->base = NULL;
    a->cap = a->used = 0;
}

void kmoe_take(struct karena *ar, struct kmoe *r, bool bwd)
{
    const size_t N = (size_t)(r->N > 0 ? r->N : 1), E = (size_t)r->E, nk = N * (size_t)r->k;
    const size_t D = (size_t)r->D, F = (size_t)r->F, f = sizeof(float), i = sizeof(int32_t);
    r->probs = karena_take(ar, N * E * f);
    r->pmean = karena_take(ar, E * f);
    r->idx = karena_take(ar, nk * i);
    r->wt = karena_take(ar, nk * f);
    r->order = karena_take(ar, nk * i);
    r->offs = karena_take(ar, (E + 1) * i);
    r->pos = karena_take(ar, nk * i);
    r->xs = karena_take(ar, nk * D * f);
    r->ys = karena_take(ar, nk * D * f);
    r->g = karena_take(ar, nk * F * f);
    r->u = karena_take(ar, nk * F * f);
    r->a = karena_take(ar, nk * F * f);
    r->bwd_d = bwd ? karena_take(ar, 2 * nk * D * f) : NULL;
    r->bwd_f = bwd ? karena_take(ar, 3 * nk * F * f) : NULL;
}

/* Batch-invariant mode's down product of one expert's n slots from lo: each of r's bi_groups column groups into its
 * own partial (group 0 into ys, the others into ys_groups). */
static void kmoe_down_groups(struct kctx *K, const float *Wd, struct kmoe *r, size_t lo, int n)
{
    const int g = r->bi_groups, F = r->F, kc = F / g;
    const size_t d = (size_t)r->D, f = (size_t)F, nkd = (size_t)r->N * (size_t)r->k * d;
    for (int j = 0; j < g; j++) {
        float *ys = (j ? r->ys_groups + (size_t)(j - 1) * nkd : r->ys) + lo * d;
        K->ops->linear_forward_ld(K, ys, r->a + lo * f + (size_t)j * kc, F, Wd + (size_t)j * kc, F, n, kc, r->D);
    }
}

void kmoe_products_forward(struct kctx *K, const int32_t *offs, const float *Wg, const float *Wu, const float *Wd,
                           struct kmoe *r, const struct kmoe_expert_hooks *hooks)
{
    const int E = r->E, D = r->D, F = r->F;
    const size_t d = (size_t)D, f = (size_t)F;
    for (int e = 0; e < E; e++) {
        const size_t lo = (size_t)offs[e];
        const int n = offs[e + 1] - offs[e];
        if (n <= 0)
            continue;
        const size_t ew = (size_t)e * f * d;
        K->ops->linear_forward(K, r->g + lo * f, r->xs + lo * d, Wg + ew, NULL, n, D, F);
        K->ops->linear_forward(K, r->u + lo * f, r->xs + lo * d, Wu + ew, NULL, n, D, F);
        if (hooks && hooks->gate_up_forward)
            hooks->gate_up_forward(K, r, e, (int)lo, n);
        K->ops->swiglu_forward(K, r->a + lo * f, r->g + lo * f, r->u + lo * f, (size_t)n * f);
        if (r->bi_groups > 1)
            kmoe_down_groups(K, Wd + ew, r, lo, n);
        else
            K->ops->linear_forward(K, r->ys + lo * d, r->a + lo * f, Wd + ew, NULL, n, F, D);
        if (hooks && hooks->down_forward) /* in batch-invariant mode into group 0 */
            hooks->down_forward(K, r, e, (int)lo, n);
    }
}

void kmoe_products_backward(struct kctx *K, const int32_t *offs, float *dWg, float *dWu, float *dWd, const float *Wg,
                            const float *Wu, const float *Wd, const struct kmoe *r,
                            const struct kmoe_expert_hooks *hooks)
{
    const int E = r->E, D = r->D, F = r->F;
    const size_t d = (size_t)D, f = (size_t)F, nk = (size_t)r->N * (size_t)r->k;
    const float *dys = r->bwd_d;
    float *dxs = r->bwd_d + nk * d, *da = r->bwd_f, *dg = r->bwd_f + nk * f, *du = r->bwd_f + 2 * nk * f;
    k_zero(K, dxs, nk * d * sizeof(float));
    k_zero(K, r->bwd_f, 3 * nk * f * sizeof(float));
    for (int e = 0; e < E; e++) {
        const size_t lo = (size_t)offs[e];
        const int n = offs[e + 1] - offs[e];
        if (n <= 0)
            continue;
        const size_t ew = (size_t)e * f * d;
        K->ops->linear_backward(K, da + lo * f, dWd ? dWd + ew : NULL, NULL, dys + lo * d, r->a + lo * f, Wd + ew, n, F,
                                D);
        if (hooks && hooks->down_backward)
            hooks->down_backward(K, r, e, (int)lo, n, da, dys);
        K->ops->swiglu_backward(K, dg + lo * f, du + lo * f, da + lo * f, r->g + lo * f, r->u + lo * f, (size_t)n * f);
        if (hooks && hooks->gate_up_backward)
            hooks->gate_up_backward(K, r, e, (int)lo, n, dxs, dg, du);
        K->ops->linear_backward(K, dxs + lo * d, dWg ? dWg + ew : NULL, NULL, dg + lo * f, r->xs + lo * d, Wg + ew, n,
                                D, F);
        K->ops->linear_backward(K, dxs + lo * d, dWu ? dWu + ew : NULL, NULL, du + lo * f, r->xs + lo * d, Wu + ew, n,
                                D, F);
    }
}
