#include "weight_bcast.h"

#include "common/check.h"
#include "kernels/kernels.h"
#include "worker/comm/comm.h"

int weight_bcast(struct comm *g, struct kctx *K, int64_t version, float *w, size_t n, size_t bucket_bytes,
                 size_t *bytes, char *err, size_t errlen)
{
    const bool root = comm_rank(g) == 0;
    *bytes = 0;
    int64_t h[2] = {version, (int64_t)n};
    if (comm_try_broadcast(g, h, 2, COMM_I64, 0) != 0)
        return error_set(err, errlen, "the weight broadcast's group did not complete the header of version %lld",
                         (long long)version);
    if (h[0] != version || h[1] != (int64_t)n) {
        /* the floats would follow in a size this rank does not expect: it leaves the group, the others fetch
         * once their wait runs out */
        return error_set(err, errlen,
                         "the weight broadcast carries version %lld of %lld floats; this process asked for version "
                         "%lld of %zu",
                         (long long)h[0], (long long)h[1], (long long)version, n);
    }
    size_t per = bucket_bytes / sizeof(float);
    if (per < 1)
        per = 1;
    if (per > n)
        per = n;
    const bool dev = K && K->device != KDEV_CPU;
    float *bounce = dev && n ? k_alloc(K, per * sizeof(float), KMEM_OTHER, "the weight broadcast's bucket") : NULL;
    int rc = 0;
    for (size_t off = 0; off < n && rc == 0; off += per) {
        const size_t cnt = n - off < per ? n - off : per;
        float *buf = bounce ? bounce : w + off;
        if (bounce && root)
            k_to_device(K, bounce, w + off, cnt * sizeof(float));
        if (comm_try_broadcast(g, buf, cnt, COMM_F32, 0) != 0) {
            rc = error_set(err, errlen, "the weight broadcast of version %lld stopped at float %zu of %zu",
                           (long long)version, off, n);
            break;
        }
        if (bounce && !root)
            k_to_host(K, w + off, bounce, cnt * sizeof(float));
        *bytes += cnt * sizeof(float);
    }
    if (bounce)
        k_free(K, bounce, per * sizeof(float), KMEM_OTHER);
    return rc;
}
