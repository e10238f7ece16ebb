/* Where a role's model runs (kernels/kernels.h contexts) from its configuration keys. */
#ifndef GRPO_WORKER_MODEL_DEVICE_H
#define GRPO_WORKER_MODEL_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "model.h"

/* The context for device ("cpu", "cuda" or "cuda:N") and dtype ("float32" or "bfloat16", the value of
 * dtype_key): the CPU's own for float32 on the CPU; BF16 matrix products where the CPU has them, else the float32
 * one with one warning naming the key. NULL with err when the device cannot be used. */
struct kctx *model_context_for(const char *device, const char *dtype, const char *dtype_key, char *err, size_t errlen);
/* fp32 products on TF32 tensor cores in this process's CUDA contexts (actor_rollout_ref.model.fp32_matmul_precision
 * = high), those made before and after. */
void model_set_fp32_matmul_tf32(bool tf32);
/* Move *m (weights only: before gradients, optimizer state or an adapter exist) to K. */
void model_move(struct model **m, struct kctx *K);

#endif
