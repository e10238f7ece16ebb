/* CHECK_CUDA(call), CHECK_CUBLAS(call), CHECK_NCCL(call): report the library's
 * error text with file and line, then end the program (see check.h). */
#ifndef GRPO_COMMON_CHECK_CUDA_H
#define GRPO_COMMON_CHECK_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "check.h"

static inline void check_cuda_impl(cudaError_t rc, const char *file, int line, const char *expr)
{
    if (rc != cudaSuccess)
        check_fail(file, line, expr, cudaGetErrorString(rc));
}

static inline void check_nccl_impl(ncclResult_t rc, const char *file, int line, const char *expr)
{
    if (rc != ncclSuccess)
        check_fail(file, line, expr, ncclGetErrorString(rc));
}

static inline void check_cublas_impl(cublasStatus_t rc, const char *file, int line, const char *expr)
{
    if (rc != CUBLAS_STATUS_SUCCESS) {
        char text[64];
        snprintf(text, sizeof text, "cuBLAS status %d", (int)rc);
        check_fail(file, line, expr, text);
    }
}

#define CHECK_CUDA(call) check_cuda_impl((call), __FILE__, __LINE__, #call)
#define CHECK_NCCL(call) check_nccl_impl((call), __FILE__, __LINE__, #call)
#define CHECK_CUBLAS(call) check_cublas_impl((call), __FILE__, __LINE__, #call)

#endif
