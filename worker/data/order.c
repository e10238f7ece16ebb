/* Deterministic randomness of the data module (splitmix64), the per-epoch
 * prompt order and the resumable cursor over it. */
#include "dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config_key_names.h"

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void data_rng_seed(struct data_rng *g, uint64_t seed, uint64_t stream)
{
    g->state = mix64(mix64(seed + 0x9E3779B97F4A7C15ull) ^ (stream * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull));
}

uint64_t data_rng_next(struct data_rng *g)
{
    g->state += 0x9E3779B97F4A7C15ull;
    return mix64(g->state);
}

uint64_t data_rng_below(struct data_rng *g, uint64_t bound)
{
    /* reject the top sliver that would make some values more likely */
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do
        x = data_rng_next(g);
    while (x >= limit);
    return x % bound;
}

/* stream id of epoch e's order: "order" in ASCII, then the epoch */
#define ORDER_STREAM 0x6f72646572ull

void dataset_order(int n, uint64_t seed, long epoch, int *out_perm)
{
    for (int i = 0; i < n; i++)
        out_perm[i] = i;
    struct data_rng g;
    data_rng_seed(&g, seed, ORDER_STREAM ^ ((uint64_t)epoch * 0x9E3779B97F4A7C15ull));
    for (int i = n - 1; i > 0; i--) {
        int j = (int)data_rng_below(&g, (uint64_t)i + 1);
        int t = out_perm[i];
        out_perm[i] = out_perm[j];
        out_perm[j] = t;
    }
}

static void cursor_fill(struct data_cursor *c)
{
    if (c->shuffle) {
        dataset_order(c->n, c->seed, c->epoch, c->perm);
    } else {
        for (int i = 0; i < c->n; i++)
            c->perm[i] = i;
    }
}

int data_cursor_init(struct data_cursor *c, int n, int batch_size, bool shuffle, uint64_t seed, char *err,
                     size_t errlen)
{
    memset(c, 0, sizeof *c);
    if (batch_size < 1 || n < batch_size) {
        snprintf(err, errlen, "data: %d prompts do not fill one batch of %d (" KEY_data_train_batch_size ")", n,
                 batch_size);
        return -1;
    }
    c->n = n;
    c->batch_size = batch_size;
    c->shuffle = shuffle;
    c->seed = seed;
    c->perm = xmalloc((size_t)n * sizeof *c->perm);
    cursor_fill(c);
    return 0;
}

void data_cursor_free(struct data_cursor *c)
{
    free(c->perm);
    c->perm = NULL;
}

int data_cursor_batches_per_epoch(const struct data_cursor *c) { return c->n / c->batch_size; }

void data_cursor_seek(struct data_cursor *c, long epoch, int index)
{
    if (epoch < 0)
        epoch = 0;
    if (index < 0)
        index = 0;
    if (index + c->batch_size > c->n) {
        epoch++;
        index = 0;
    }
    bool refill = epoch != c->epoch;
    c->epoch = epoch;
    c->index = index;
    if (refill)
        cursor_fill(c);
}

long data_cursor_next(struct data_cursor *c, int *out)
{
    if (c->index + c->batch_size > c->n)
        data_cursor_seek(c, c->epoch + 1, 0);
    long epoch = c->epoch;
    memcpy(out, c->perm + c->index, (size_t)c->batch_size * sizeof *out);
    c->index += c->batch_size;
    /* step into the next epoch now, so that the saved (epoch, index) points at the next batch */
    if (c->index + c->batch_size > c->n)
        data_cursor_seek(c, c->epoch + 1, 0);
    return epoch;
}
