#include <string.h>

#include "common/check.h"
#include "cpu_kernels.h"

static void check_id(int32_t id, int i, int V)
{
    if (id < 0 || id >= V)
        check_failf(__FILE__, __LINE__, "embedding: ids[%d] = %d outside vocabulary [0, %d)", i, (int)id, V);
}

void embedding_forward_shard(float *out, const int32_t *ids, const float *table, int N, int D,
                             const struct vocab_shard *vs)
{
    for (int i = 0; i < N; i++) {
        check_id(ids[i], i, vs->V);
        float *row = out + (size_t)i * D;
        if (ids[i] >= vs->lo && ids[i] < vs->hi)
            memcpy(row, table + (size_t)(ids[i] - vs->lo) * D, sizeof(float) * (size_t)D);
        else
            memset(row, 0, sizeof(float) * (size_t)D);
    }
}

void embedding_backward_shard(float *dtable, const float *dout, const int32_t *ids, int N, int D,
                              const struct vocab_shard *vs)
{
    for (int i = 0; i < N; i++) {
        check_id(ids[i], i, vs->V);
        if (ids[i] < vs->lo || ids[i] >= vs->hi)
            continue;
        float *row = dtable + (size_t)(ids[i] - vs->lo) * D;
        const float *g = dout + (size_t)i * D;
        for (int j = 0; j < D; j++)
            row[j] += g[j];
    }
}

void embedding_forward(float *out, const int32_t *ids, const float *table, int N, int D, int V)
{
    const struct vocab_shard whole = {.lo = 0, .hi = V, .V = V};
    embedding_forward_shard(out, ids, table, N, D, &whole);
}

void embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N, int D, int V)
{
    const struct vocab_shard whole = {.lo = 0, .hi = V, .V = V};
    embedding_backward_shard(dtable, dout, ids, N, D, &whole);
}
