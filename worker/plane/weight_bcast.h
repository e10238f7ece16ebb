/* The weight broadcast's payload (actor_rollout_ref.rollout.weight_sync=broadcast): one policy version from
 * trainer rank 0 (the group's rank 0) to the launch's rollout processes, over a group of the collective plane.
 * A header {version, floats} goes first, so a member that expected another version or size says so instead of
 * taking the wrong weights; then the floats, in buckets. On GPUs (kctx a CUDA context, group an NCCL twin) each
 * bucket goes through one bucket of device memory on every member: NCCL moves device memory only. Every wait is
 * bounded by the group's deadline; a lost or stuck member gives the group up (comm_try_broadcast) instead of
 * ending the run, and the caller fetches the version instead. See worker/rollout/dispatch.h for the rounds. */
#ifndef GRPO_WORKER_PLANE_WEIGHT_BCAST_H
#define GRPO_WORKER_PLANE_WEIGHT_BCAST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct comm;
struct kctx;

/* The group a member's rounds go over, made at its first round (every member is in it then) and decided the same
 * way by every member: the NCCL twin of `group` where K is a GPU context and no node's ranks share a GPU
 * (gpus_shared), else `group` itself. Free it (when it is not `group`) after the last round. */
struct comm *weight_bcast_group(struct comm *group, struct kctx *K, bool gpus_shared);
/* Rank 0 of g sends w[0..n) as version `version`; the others receive it into w. K: the member's context; over an
 * NCCL group (weight_bcast_group) the bucket is its device memory, else the buckets are host memory. *host_bucket: a
 * member's bucket of host memory, kept by the caller from round to round (NULL at first; made here; left to leak, and
 * set to NULL, when the group is given up, since a receive left behind may still land in it). 0 when every byte
 * arrived, -1 with err (the group is given up, or the header disagreed). *bytes: the floats' bytes moved. */
int weight_bcast(struct comm *g, struct kctx *K, int64_t version, float *w, size_t n, size_t bucket_bytes,
                 float **host_bucket, size_t *bytes, char *err, size_t errlen);

#endif
