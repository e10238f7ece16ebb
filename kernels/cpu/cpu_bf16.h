/* Internals of the BF16 matrix products (kernels/cpu/linear_bf16.c), shared with their unit test and benchmark. */
#ifndef GRPO_KERNELS_CPU_BF16_H
#define GRPO_KERNELS_CPU_BF16_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* What this CPU and its OS can run: AVX512-BF16 (with AVX-512 F/BW/VL and the ZMM state saved by the OS), and
 * AMX-BF16 (with the tile data granted to this process; asking for it is what makes it usable on Linux). */
struct bf16_cpu {
    bool avx512_bf16, amx_bf16;
};
struct bf16_cpu cpu_bf16_features(void);

/* One value rounded to BF16, nearest even: the upper 16 bits of the fp32 pattern. */
static inline uint16_t f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    /* NaN stays a (quiet) NaN; everything else rounds to nearest even (overflow to infinity, as it should) */
    uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);
    uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
    return (uint16_t)(nan ? (u >> 16) | 0x40u : r >> 16);
}

/* Round to BF16, nearest even (a NaN stays a NaN): dst[i] = bf16(src[i]), the upper 16 bits of the fp32 pattern. */
void bf16_round(uint16_t *dst, const float *src, size_t n);
/* The same, transposed: dst (cols, rows) = bf16(src (rows, cols))^T. */
void bf16_round_transpose(uint16_t *dst, const float *src, int rows, int cols);

/* A grow-only buffer of BF16 values (64-byte aligned): bf16_scratch returns at least n of them, reallocating only
 * when a larger n comes (no allocation once the largest shape has run). */
struct bf16_scratch {
    uint16_t *p;
    size_t cap; /* elements */
};
uint16_t *bf16_scratch(struct bf16_scratch *s, size_t n);

/* C (M, N) = A (M, K) B, or += with accumulate, on BF16 operands rounded beforehand (bf16_round): B given as (K, N)
 * row-major, or as (N, K) row-major when b_trans; products accumulated in fp32, split over the pool's threads as
 * linear_forward_bf16's are. For an operand used by several products (the LM head's weights over its chunks),
 * rounded once. Ends the process with a clear message where cpu_bf16_gemm_available() is false. */
void bf16_gemm(float *C, const uint16_t *A, const uint16_t *B, int M, int N, int K, bool b_trans, bool accumulate);

/* The oneDNN implementation that computes C (M, N) = A (M, K) B, B given as (N, K) when b_trans ("brg:avx512_core_
 * amx"), or "none". */
const char *bf16_gemm_impl(int M, int N, int K, bool b_trans);

#endif
