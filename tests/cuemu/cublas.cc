// cuemu: cublasGemmEx and cublasGemmStridedBatchedEx on the CPU, from the definition (tests/cuemu/README.md).
// Column-major, as cuBLAS: C (m, n) = alpha op(A) op(B) + beta C with op(A) (m, k) and op(B) (k, n), for each batch
// entry i at A + i strideA, B + i strideB and C + i strideC (elements) in the batched call; every product summed in
// double in index order, then rounded once to float. BF16 inputs are read as their exact values.
// CUBLAS_COMPUTE_32F_FAST_TF32 with fp32 inputs rounds each input to TF32 first (10 mantissa bits, to nearest with
// ties away from zero, as cvt.rna.tf32.f32). The arguments are checked as cuBLAS's documentation states them, and a
// refusal is printed ("cuemu: cublasGemmEx: ...") before its status is returned.
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"

struct cuemu_cublas {
    cudaStream_t stream;
    cublasMath_t math;
};

namespace
{

cublasStatus_t refuse(const char *fn, const char *why)
{
    cuemu_say("%s: %s", fn, why);
    return CUBLAS_STATUS_INVALID_VALUE;
}

// x rounded to TF32: its 13 low mantissa bits dropped, to nearest with ties away from zero (NaN and infinity kept)
float tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u)
        return x;
    u = (u + 0x1000u) & ~0x1fffu;
    memcpy(&x, &u, 4);
    return x;
}

double load(const void *p, cudaDataType_t t, size_t i, bool fast_tf32)
{
    if (t == CUDA_R_32F)
        return fast_tf32 ? tf32(((const float *)p)[i]) : ((const float *)p)[i];
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

size_t elem_bytes(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

// p + i elements of type t
const void *at(const void *p, cudaDataType_t t, long long i) { return (const char *)p + i * (long long)elem_bytes(t); }

// Whether two of the batch entries of C (m, n, column-major, ldc) sC elements apart share an element: the entries
// are independent products (run side by side on a GPU), so cuBLAS leaves such a call undefined.
bool entries_overlap(int m, int n, int ldc, long long sC, int batch)
{
    if (batch < 2 || sC >= (long long)(n - 1) * ldc + m)
        return false;
    std::vector<bool> seen((size_t)((batch - 1) * sC + (long long)(n - 1) * ldc + m));
    for (int e = 0; e < batch; e++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                const size_t x = (size_t)(e * sC + (long long)j * ldc + i);
                if (seen[x])
                    return true;
                seen[x] = true;
            }
    return false;
}

// One product of the definition (A, B and C the entry's), inside the device's scope.
void product(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float al, const void *A,
             cudaDataType_t Atype, int lda, const void *B, cudaDataType_t Btype, int ldb, float be, float *c, int ldc,
             bool fast_tf32)
{
    // op(A) as rows of k (m of them) and op(B) as columns of k (n of them), each contiguous
    std::vector<double> a((size_t)m * k), b((size_t)n * k);
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++)
            a[(size_t)i * k + p] =
                load(A, Atype, transa == CUBLAS_OP_N ? (size_t)p * lda + i : (size_t)i * lda + p, fast_tf32);
    for (int j = 0; j < n; j++)
        for (int p = 0; p < k; p++)
            b[(size_t)j * k + p] =
                load(B, Btype, transb == CUBLAS_OP_N ? (size_t)j * ldb + p : (size_t)p * ldb + j, fast_tf32);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            const double *ai = &a[(size_t)i * k], *bj = &b[(size_t)j * k];
            double s = 0.0;
            for (int p = 0; p < k; p++)
                s += ai[p] * bj[p];
            float *cij = &c[(size_t)j * ldc + i];
            // beta 0: C is not read (it may hold NaNs), as cuBLAS documents
            *cij = be == 0.0f ? (float)(al * s) : (float)(al * s + (double)be * *cij);
        }
}

// Both calls: the arguments checked, then each of batch entries computed (cublasGemmEx: one, strides 0).
cublasStatus_t gemm(const char *fn, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                    int n, int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda, long long sA,
                    const void *B, cudaDataType_t Btype, int ldb, long long sB, const void *beta, void *C,
                    cudaDataType_t Ctype, int ldc, long long sC, int batch, cublasComputeType_t computeType)
{
    char why[256];
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (transa == CUBLAS_OP_C || transb == CUBLAS_OP_C)
        return refuse(fn, "CUBLAS_OP_C is not emulated");
    if (m < 0 || n < 0 || k < 0 || batch < 0) {
        snprintf(why, sizeof why, "negative size m %d n %d k %d batch %d", m, n, k, batch);
        return refuse(fn, why);
    }
    if (sA < 0 || sB < 0 || sC < 0) {
        snprintf(why, sizeof why, "negative strides %lld %lld %lld are not emulated", sA, sB, sC);
        return refuse(fn, why);
    }
    // A is stored (m, k) untransposed or (k, m) transposed, column-major: lda >= its rows; likewise B and C
    int arows = transa == CUBLAS_OP_N ? m : k, brows = transb == CUBLAS_OP_N ? k : n;
    if (lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1)) {
        snprintf(why, sizeof why, "leading dimensions lda %d ldb %d ldc %d below the rows %d, %d, %d", lda, ldb, ldc,
                 arows, brows, m);
        return refuse(fn, why);
    }
    const bool fast_tf32 = computeType == CUBLAS_COMPUTE_32F_FAST_TF32 && Atype == CUDA_R_32F;
    if (Ctype != CUDA_R_32F || (computeType != CUBLAS_COMPUTE_32F && !fast_tf32) || Atype != Btype ||
        (Atype != CUDA_R_32F && Atype != CUDA_R_16BF))
        return refuse(fn, "only A, B in CUDA_R_32F or CUDA_R_16BF with C in CUDA_R_32F and CUBLAS_COMPUTE_32F (or "
                          "CUBLAS_COMPUTE_32F_FAST_TF32 with fp32 inputs) are emulated");
    if (m == 0 || n == 0 || batch == 0)
        return CUBLAS_STATUS_SUCCESS;
    // the first and the last element of every matrix in device memory (the last batch entry's last column)
    const int acols = transa == CUBLAS_OP_N ? k : m, bcols = transb == CUBLAS_OP_N ? n : k;
    const long long alast = (long long)(batch - 1) * sA + (long long)(acols - 1) * lda + arows - 1;
    const long long blast = (long long)(batch - 1) * sB + (long long)(bcols - 1) * ldb + brows - 1;
    const long long clast = (long long)(batch - 1) * sC + (long long)(n - 1) * ldc + m - 1;
    if (cuemu_pointer_kind(C) != 1 || cuemu_pointer_kind(at(C, Ctype, clast)) != 1 ||
        (k > 0 && (cuemu_pointer_kind(A) != 1 || cuemu_pointer_kind(B) != 1 ||
                   cuemu_pointer_kind(at(A, Atype, alast)) != 1 || cuemu_pointer_kind(at(B, Btype, blast)) != 1)))
        return refuse(fn, "A, B and C must be device memory, every batch entry whole");
    if (entries_overlap(m, n, ldc, sC, batch))
        return refuse(fn, "two batch entries of C share an element");
    if (cuemu_pointer_kind(alpha) == 1 || cuemu_pointer_kind(beta) == 1)
        return refuse(fn, "alpha and beta are host scalars (CUBLAS_POINTER_MODE_HOST)");
    // alpha and beta are read now (a capture records their values, as cuBLAS's host pointer mode does)
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const cudaError_t e = cuemu::submit(handle->stream, fn, [=]() {
        cuemu::device_scope device; // A, B and C are device memory
        for (int i = 0; i < batch; i++)
            product(transa, transb, m, n, k, al, at(A, Atype, i * sA), Atype, lda, at(B, Btype, i * sB), Btype, ldb,
                    be, (float *)C + i * sC, ldc, fast_tf32);
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} // namespace

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    *handle = new cuemu_cublas{NULL, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetAtomicsMode(cublasHandle_t handle, cublasAtomicsMode_t mode)
{
    (void)mode;
    return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo;
    return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, C,
                Ctype, ldc, 0, 1, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType_t Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType_t Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType_t Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo;
    return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype,
                ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType);
}

} // extern "C"
