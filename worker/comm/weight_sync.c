#include "weight_sync.h"

#include <time.h>

#include "common/check.h"

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void move_buckets(struct comm *c, float *w, size_t n, size_t bucket_bytes, struct weight_sync_stats *st)
{
    size_t per = bucket_bytes / sizeof(float);
    if (per < 1)
        per = 1;
    for (size_t off = 0; off < n; off += per) {
        size_t cnt = n - off < per ? n - off : per;
        comm_broadcast(c, w + off, cnt, COMM_F32, 0);
        st->buckets++;
        st->bytes += cnt * sizeof(float);
    }
}

void weight_sync_send(struct comm *c, const struct weight_sync_header *h, const float *w, size_t n, size_t bucket_bytes,
                      struct weight_sync_stats *st, void (*poll)(void *ud, bool done), void *ud)
{
    double t0 = mono_s();
    *st = (struct weight_sync_stats){0};
    struct weight_sync_header hh = *h;
    hh.n_floats = (int64_t)n;
    comm_broadcast_polled(c, &hh, sizeof hh / sizeof(int64_t), COMM_I64, 0, poll, ud); /* as the receivers */
    if (hh.has_weights && !hh.stop)
        move_buckets(c, (float *)w, n, bucket_bytes, st); /* the root's buffer is only read */
    st->seconds = mono_s() - t0;
}

int weight_sync_recv(struct comm *c, struct weight_sync_header *h, float *w, size_t n, size_t bucket_bytes,
                     struct weight_sync_stats *st, void (*poll)(void *ud, bool done), void *ud, char *err,
                     size_t errlen)
{
    double t0 = mono_s();
    *st = (struct weight_sync_stats){0};
    comm_broadcast_polled(c, h, sizeof *h / sizeof(int64_t), COMM_I64, 0, poll, ud);
    if (h->has_weights && !h->stop) {
        if (h->n_floats != (int64_t)n)
            return error_set(err, errlen,
                             "weight sync: the trainer sends %lld parameters, this rollout rank's model has %zu "
                             "(give every rank the same actor_rollout_ref.model.path)",
                             (long long)h->n_floats, n);
        move_buckets(c, w, n, bucket_bytes, st);
    }
    st->seconds = mono_s() - t0;
    return 0;
}
