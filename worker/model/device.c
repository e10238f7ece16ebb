/* Where a role's model runs: the kernel context of its device and precision keys, and moving a model there. */
#include "device.h"

#include <stdio.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "common/config_key_names.h"

/* One context per (device, precision) per process: the trainer's policy and reference share theirs (a process
 * uses one GPU: the first "cuda:N" asked for). */
static struct kctx *g_ctx[2][2];
static bool g_fallback_said;
static bool g_tf32; /* actor_rollout_ref.model.fp32_matmul_precision=high */

void model_set_fp32_matmul_tf32(bool tf32)
{
    g_tf32 = tf32;
    for (int d = 0; d < 2; d++)
        if (g_ctx[1][d])
            g_ctx[1][d]->tf32 = tf32;
}

struct kctx *model_context_for(const char *device, const char *dtype, const char *dtype_key, char *err, size_t errlen)
{
    const bool cuda = device && strncmp(device, "cuda", 4) == 0; /* "cuda" (the first GPU) or "cuda:N" */
    enum kmatmul mm = dtype && strcmp(dtype, "bfloat16") == 0 ? KMM_BF16 : KMM_F32;
    if (!cuda && mm == KMM_F32)
        return kctx_cpu();
    if (!cuda && mm == KMM_BF16 && !khost_bf16_gemm_available()) {
        if (!g_fallback_said)
            log_warn("model", "%s=bfloat16: this CPU has no BF16 matrix products (%s); running float32", dtype_key,
                     khost_bf16_gemm_name());
        g_fallback_said = true;
        return kctx_cpu();
    }
    struct kctx **slot = &g_ctx[cuda][mm == KMM_BF16];
    if (!*slot) {
        char why[256];
        *slot = kctx_create(cuda ? device : "cpu", mm, why, sizeof why);
        if (!*slot) {
            error_set(err, errlen, "%s: %s", cuda ? KEY_trainer_device "=cuda" : dtype_key, why);
            return NULL;
        }
        (*slot)->tf32 = cuda && g_tf32;
        char d[256];
        log_info("model", "kernels: %s", kctx_describe(*slot, d, sizeof d));
    }
    return *slot;
}

void model_move(struct model **m, struct kctx *K)
{
    if ((*m)->K == K)
        return;
    struct model *moved = model_copy_to(*m, K);
    model_free(*m);
    *m = moved;
}
