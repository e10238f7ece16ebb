#include "weight_bcast.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"
#include "worker/comm/comm.h"

/* A bucket's floats at most: the dispatcher's chunk size, so neither way holds more than 48 MiB extra. */
#define BUCKET_MAX_FLOATS ((size_t)12 << 20)

struct comm *weight_bcast_group(struct comm *group, struct kctx *K, bool gpus_shared)
{
    struct comm *g = K->device != KDEV_CPU && !gpus_shared ? comm_device_group(group, K->device_index) : NULL;
    return g ? g : group; /* a build without CUDA has no GPU context */
}

int weight_bcast(struct comm *g, struct kctx *K, int64_t version, float *w, size_t n, size_t bucket_bytes,
                 float **host_bucket, size_t *bytes, char *err, size_t errlen)
{
    const bool root = comm_rank(g) == 0;
    *bytes = 0;
    /* A receive that gives up is left behind in MPI (it cannot be taken back) and may complete later, so what a
     * member receives into on the host is its own heap memory, kept (not freed) if the group is given up: never
     * this stack frame, nor the weights. */
    int64_t *h = xmalloc(2 * sizeof *h);
    h[0] = version;
    h[1] = (int64_t)n;
    if (comm_try_broadcast(g, h, 2, COMM_I64, 0) != 0)
        return error_set(err, errlen, "the weight broadcast's group did not complete the header of version %lld",
                         (long long)version); /* h stays allocated */
    if (h[0] != version || h[1] != (int64_t)n) {
        /* the floats would follow in a size this rank does not expect: it gives the group up (its peers' waits end
         * at the deadline), and the version is fetched */
        int rc = error_set(err, errlen,
                           "the weight broadcast carries version %lld of %lld floats; this process asked for version "
                           "%lld of %zu",
                           (long long)h[0], (long long)h[1], (long long)version, n);
        comm_give_up(g);
        free(h);
        return rc;
    }
    free(h);
    size_t per = bucket_bytes / sizeof(float);
    if (per < 1)
        per = 1;
    if (per > BUCKET_MAX_FLOATS)
        per = BUCKET_MAX_FLOATS;
    if (per > n)
        per = n;
    const bool dev = comm_caps(g)->device_memory; /* payloads in device memory only */
    /* on a GPU every member's bucket is device memory (NCCL moves no other); over MPI the members' is heap */
    if (!dev && !root && n && !*host_bucket)
        *host_bucket = xmalloc(BUCKET_MAX_FLOATS * sizeof(float));
    float *bounce = !n     ? NULL
                    : dev  ? k_alloc(K, per * sizeof(float), KMEM_OTHER, "the weight broadcast's bucket")
                    : root ? NULL
                           : *host_bucket;
    int rc = 0;
    for (size_t off = 0; off < n; off += per) {
        const size_t cnt = n - off < per ? n - off : per;
        float *buf = bounce ? bounce : w + off;
        if (dev && root)
            k_to_device(K, bounce, w + off, cnt * sizeof(float));
        if (comm_try_broadcast(g, buf, cnt, COMM_F32, 0) != 0) {
            rc = error_set(err, errlen, "the weight broadcast of version %lld stopped at float %zu of %zu",
                           (long long)version, off, n);
            break;
        }
        if (dev && !root)
            k_to_host(K, w + off, bounce, cnt * sizeof(float));
        else if (bounce && !root)
            memcpy(w + off, bounce, cnt * sizeof(float));
        *bytes += cnt * sizeof(float);
    }
    if (dev && bounce) /* an aborted NCCL communicator writes nothing more */
        k_free(K, bounce, per * sizeof(float), KMEM_OTHER);
    else if (bounce && rc != 0)
        *host_bucket = NULL; /* left to a late MPI receive: never used again */
    return rc;
}
