#include <string.h>

#include "common/check.h"
#include "kernels.h"

static void check_id(int32_t id, int i, int V)
{
    if (id < 0 || id >= V)
        check_failf(__FILE__, __LINE__, "embedding: ids[%d] = %d outside vocabulary [0, %d)", i, (int)id, V);
}

void embedding_forward(float *out, const int32_t *ids, const float *table, int N, int D, int V)
{
    for (int i = 0; i < N; i++) {
        check_id(ids[i], i, V);
        memcpy(out + (size_t)i * D, table + (size_t)ids[i] * D, sizeof(float) * (size_t)D);
    }
}

void embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N, int D, int V)
{
    for (int i = 0; i < N; i++) {
        check_id(ids[i], i, V);
        float *row = dtable + (size_t)ids[i] * D;
        const float *g = dout + (size_t)i * D;
        for (int j = 0; j < D; j++)
            row[j] += g[j];
    }
}
