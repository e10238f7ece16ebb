#include "pool.h"

#include <pthread.h>
#include <stdbool.h>

#include <cblas.h>

static struct {
    pthread_mutex_t run; /* one caller at a time */
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int helpers, gen, pending;
    int gen_at_start[CPU_POOL_MAX_PARTS]; /* the generation when helper i was made: it waits for the next one */
    cpu_part_fn fn;
    void *arg;
    int parts, on_helpers;           /* parts 1 .. on_helpers run on helpers 1 .. on_helpers */
    int part_of[CPU_POOL_MAX_PARTS]; /* helper i's argument points at part_of[i] == i */
} g = {.run = PTHREAD_MUTEX_INITIALIZER,
       .mu = PTHREAD_MUTEX_INITIALIZER,
       .go = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER};

static void *helper_main(void *arg)
{
    const int part = *(const int *)arg;
    pthread_mutex_lock(&g.mu);
    int seen = g.gen_at_start[part];
    for (;;) {
        while (g.gen == seen)
            pthread_cond_wait(&g.go, &g.mu);
        seen = g.gen;
        const bool mine = part <= g.on_helpers;
        cpu_part_fn fn = g.fn;
        void *farg = g.arg;
        const int parts = g.parts;
        pthread_mutex_unlock(&g.mu);
        if (mine)
            fn(farg, part, parts);
        pthread_mutex_lock(&g.mu);
        if (--g.pending == 0)
            pthread_cond_signal(&g.done);
    }
    return NULL;
}

/* The process's thread setting: OpenBLAS's own count when first asked (OPENBLAS_NUM_THREADS, or the cores), then
 * cpu_set_threads; OpenBLAS itself is kept at one thread (gemm.c says why). */
static int g_threads;

static int clamp_threads(int t) { return t < 1 ? 1 : t < CPU_POOL_MAX_PARTS ? t : CPU_POOL_MAX_PARTS; }

void cpu_set_threads(int threads)
{
    g_threads = clamp_threads(threads);
    openblas_set_num_threads(1);
}

int cpu_pool_threads(void)
{
    if (!g_threads)
        cpu_set_threads(openblas_get_num_threads());
    return g_threads;
}

static void run_serial(int parts, cpu_part_fn fn, void *arg)
{
    for (int i = 0; i < parts; i++)
        fn(arg, i, parts);
}

void cpu_run_parts(int parts, cpu_part_fn fn, void *arg)
{
    if (parts > CPU_POOL_MAX_PARTS)
        parts = CPU_POOL_MAX_PARTS;
    if (parts <= 1) {
        if (parts == 1)
            fn(arg, 0, 1);
        return;
    }
    if (pthread_mutex_trylock(&g.run) != 0) {
        run_serial(parts, fn, arg);
        return;
    }
    while (g.helpers < parts - 1) {
        pthread_t th;
        g.gen_at_start[g.helpers + 1] = g.gen;
        g.part_of[g.helpers + 1] = g.helpers + 1;
        if (pthread_create(&th, NULL, helper_main, &g.part_of[g.helpers + 1]) != 0)
            break;
        pthread_detach(th);
        g.helpers++;
    }
    const int on_helpers = parts - 1 < g.helpers ? parts - 1 : g.helpers;
    pthread_mutex_lock(&g.mu);
    g.fn = fn, g.arg = arg, g.parts = parts, g.on_helpers = on_helpers;
    g.pending = g.helpers;
    g.gen++;
    pthread_cond_broadcast(&g.go);
    pthread_mutex_unlock(&g.mu);
    fn(arg, 0, parts);
    for (int i = on_helpers + 1; i < parts; i++) /* parts no helper could take */
        fn(arg, i, parts);
    pthread_mutex_lock(&g.mu);
    while (g.pending > 0)
        pthread_cond_wait(&g.done, &g.mu);
    pthread_mutex_unlock(&g.mu);
    pthread_mutex_unlock(&g.run);
}
