/* The CPU back-end as it registers itself (struct kbackend, kernels.h): the host's back-end, its ops (kops_cpu,
 * backend.c) and the host's helpers (struct khost) over this folder's functions. */
#include <stdio.h>

#include "common/check.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/pool.h"
#include "kernels/kernels.h"

/* A CPU context runs BF16 products only where this CPU has them. */
static int cpu_open(struct kctx *K, int index, char *why, size_t len)
{
    (void)index;
    if (K->matmul == KMM_BF16 && !cpu_bf16_gemm_available())
        return error_set(why, len, "BF16 matrix products need a CPU with AVX512-BF16 or AMX (this one has neither)");
    return 0;
}

static const char *cpu_gemm_name(const struct kctx *K, char *buf, size_t len)
{
    return K->matmul == KMM_BF16 ? cpu_bf16_gemm_name() : blas_kernels(buf, len);
}

static const struct khost cpu_host = {
    .set_threads = cpu_set_threads,
    .threads = cpu_pool_threads,
    .run_parts = cpu_run_parts,
    .sgemm = cpu_sgemm,
    .blas_kernels = blas_kernels,
    .blas_kernels_better = blas_kernels_better,
    .bf16_gemm_available = cpu_bf16_gemm_available,
    .bf16_gemm_name = cpu_bf16_gemm_name,
    .rope_default_freqs = rope_default_freqs,
    .sample_row = sample_row,
    .exp_shifted = vec_exp_shifted,
};

const struct kbackend kbackend_cpu = {
    .name = "cpu",
    .device = KDEV_CPU,
    .ops = &kops_cpu,
    .open = cpu_open,
    .gemm_name = cpu_gemm_name,
    .host = &cpu_host,
};
