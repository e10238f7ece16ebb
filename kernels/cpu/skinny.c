/* y (M, N) = x (M, K) W^T for few rows M (generation's decode steps, the LM head of a decode step): W (N, K)
 * row-major is read once, straight from memory, with every row of x against it.
 *
 * Why not sgemm: for a handful of rows OpenBLAS packs W into its panel layout on every call (sgemm_incopy took 47%
 * of a decode step at batch 8, more than the products), so W crosses memory three times. Here each output is one
 * dot product of a row of x with a row of W, summed in 16 (AVX-512) or 8 (AVX2) lanes over K in order, then the
 * lanes in a fixed tree: the bits of y[m][n] depend on x[m], W[n] and the ISA only, not on M, on the row's place
 * in the batch or on the number of threads. */
#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "pool.h"

/* The lines of next[0..floats), a share of them (part t of parts). */
static inline void prefetch_part(const float *next, size_t floats, int t, int parts)
{
    const size_t lines = (floats * sizeof(float) + 63) / 64, lo = lines * (size_t)t / (size_t)parts,
                 hi = lines * (size_t)(t + 1) / (size_t)parts;
    for (size_t l = lo; l < hi; l++)
        __builtin_prefetch((const char *)next + l * 64, 0, 3);
}

/* ---- AVX-512: tiles of 4 rows of x by 4 rows of W (16 accumulators) */

/* pf (NULL: none): the next W rows, NR of them, fetched into the cache a line per row per step (as tile256 does) */
__attribute__((target("avx512f"), always_inline)) static inline void
tile512(float *y, int ldy, const float *x, int ldx, const float *W, int ldw, int K, int MR, int NR, const float *pf)
{
    __m512 acc[4][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            acc[i][j] = _mm512_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        if (pf)
            for (int j = 0; j < NR; j++)
                __builtin_prefetch(pf + (size_t)j * ldw + k, 0, 3);
        __m512 w[4];
        for (int j = 0; j < NR; j++)
            w[j] = _mm512_loadu_ps(W + (size_t)j * ldw + k);
        for (int i = 0; i < MR; i++) {
            const __m512 xv = _mm512_loadu_ps(x + (size_t)i * ldx + k);
            for (int j = 0; j < NR; j++)
                acc[i][j] = _mm512_fmadd_ps(xv, w[j], acc[i][j]);
        }
    }
    if (k < K) {
        const __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        __m512 w[4];
        for (int j = 0; j < NR; j++)
            w[j] = _mm512_maskz_loadu_ps(m, W + (size_t)j * ldw + k);
        for (int i = 0; i < MR; i++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, x + (size_t)i * ldx + k);
            for (int j = 0; j < NR; j++)
                acc[i][j] = _mm512_fmadd_ps(xv, w[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            y[(size_t)i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]);
}

__attribute__((target("avx512f"))) static void cols512(float *y, const float *x, int ldx, const float *W, int ldw,
                                                       int M, int N, int K, int n0, int n1)
{
    /* The next group of W rows is fetched while this one computes, as in cols256 (the LM head's rows at batch 8
     * ran at 150 GFLOP/s without it against 242 for the AVX2 kernel with it, bench/skinny_bench on Zen 5). */
    const int tiles = M / 4 + M % 4;
    int n = n0;
    for (; n + 4 <= n1; n += 4) {
        const float *Wn = W + (size_t)n * ldw;
        const float *next = M >= 4 && n + 8 <= n1 && ldw == K ? Wn + (size_t)4 * ldw : NULL;
        const float *inloop = M < 16 ? next : NULL, *spread = M >= 16 ? next : NULL;
        int m = 0, t = 0;
        for (; m + 4 <= M; m += 4, t++) {
            if (spread)
                prefetch_part(spread, (size_t)4 * K, t, tiles);
            tile512(y + (size_t)m * N + n, N, x + (size_t)m * ldx, ldx, Wn, ldw, K, 4, 4, m == 0 ? inloop : NULL);
        }
        for (; m < M; m++, t++) {
            if (spread)
                prefetch_part(spread, (size_t)4 * K, t, tiles);
            tile512(y + (size_t)m * N + n, N, x + (size_t)m * ldx, ldx, Wn, ldw, K, 1, 4, m == 0 ? inloop : NULL);
        }
    }
    for (; n < n1; n++)
        for (int m = 0; m < M; m++)
            tile512(y + (size_t)m * N + n, N, x + (size_t)m * ldx, ldx, W + (size_t)n * ldw, ldw, K, 1, 1, NULL);
}

/* ---- AVX2 + FMA: tiles of 4 rows of x by 3 rows of W (12 accumulators: an FMA takes 4-5 cycles on two pipes, so
 * fewer than 10 independent sums leave the pipes idle; with 4 x 2 the kernel ran at half the FMA rate on Zen,
 * bench/skinny_bench) */

__attribute__((target("avx2,fma"), always_inline)) static inline float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* pf (NULL: none): the next W rows, NR of them, fetched into the cache a line per row every other step (W streams
 * from memory once per call; without this a group's first tile waits for it; a prefetch changes no result) */
__attribute__((target("avx2,fma"), always_inline)) static inline void
tile256(float *y, int ldy, const float *x, int ldx, const float *W, int ldw, int K, int MR, int NR, const float *pf)
{
    __m256 acc[4][3];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            acc[i][j] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        if (pf && (k & 15) == 0)
            for (int j = 0; j < NR; j++)
                __builtin_prefetch(pf + (size_t)j * ldw + k, 0, 3);
        __m256 w[3];
        for (int j = 0; j < NR; j++)
            w[j] = _mm256_loadu_ps(W + (size_t)j * ldw + k);
        for (int i = 0; i < MR; i++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)i * ldx + k);
            for (int j = 0; j < NR; j++)
                acc[i][j] = _mm256_fmadd_ps(xv, w[j], acc[i][j]);
        }
    }
    if (k < K) {
        const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(K - k), idx);
        __m256 w[3];
        for (int j = 0; j < NR; j++)
            w[j] = _mm256_maskload_ps(W + (size_t)j * ldw + k, m);
        for (int i = 0; i < MR; i++) {
            const __m256 xv = _mm256_maskload_ps(x + (size_t)i * ldx + k, m);
            for (int j = 0; j < NR; j++)
                acc[i][j] = _mm256_fmadd_ps(xv, w[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++)
            y[(size_t)i * ldy + j] = hsum256(acc[i][j]);
}

__attribute__((target("avx2,fma"))) static void cols256(float *y, const float *x, int ldx, const float *W, int ldw,
                                                        int M, int N, int K, int n0, int n1)
{
    /* The next group of W rows is fetched while this one computes: with few tiles of rows during the first tile's
     * steps, with many (M >= 16) a share of its lines before each tile. Below 4 rows the hardware's prefetch keeps
     * up alone (measured on Zen: bench/skinny_bench and the decode benchmark, docs/results/performance.md). */
    const int tiles = M / 4 + M % 4;
    int n = n0;
    for (; n + 3 <= n1; n += 3) {
        const float *Wn = W + (size_t)n * ldw;
        const float *next = M >= 4 && n + 6 <= n1 && ldw == K ? Wn + (size_t)3 * ldw : NULL;
        const float *inloop = M < 16 ? next : NULL, *spread = M >= 16 ? next : NULL;
        int m = 0, t = 0;
        for (; m + 4 <= M; m += 4, t++) {
            if (spread)
                prefetch_part(spread, (size_t)3 * K, t, tiles);
            tile256(y + (size_t)m * N + n, N, x + (size_t)m * ldx, ldx, Wn, ldw, K, 4, 3, m == 0 ? inloop : NULL);
        }
        for (; m < M; m++, t++) {
            if (spread)
                prefetch_part(spread, (size_t)3 * K, t, tiles);
            tile256(y + (size_t)m * N + n, N, x + (size_t)m * ldx, ldx, Wn, ldw, K, 1, 3, m == 0 ? inloop : NULL);
        }
    }
    for (; n < n1; n++)
        for (int m = 0; m < M; m++)
            tile256(y + (size_t)m * N + n, N, x + (size_t)m * ldx, ldx, W + (size_t)n * ldw, ldw, K, 1, 1, NULL);
}

/* ---- dispatch */

typedef void (*cols_fn)(float *y, const float *x, int ldx, const float *W, int ldw, int M, int N, int K, int n0,
                        int n1);

bool skinny_wanted(int M, int K) { return M >= 1 && M <= SKINNY_MAX_ROWS && K >= 1 && cpu_isa() != CPU_ISA_NONE; }

struct skinny_job {
    cols_fn fn;
    float *y;
    const float *x, *W;
    int ldx, ldw, M, N, K, align;
};

static void skinny_part(void *arg, int part, int parts)
{
    const struct skinny_job *j = arg;
    /* columns split in multiples of the tile width, so a tile's outputs are never split */
    const int units = (j->N + j->align - 1) / j->align;
    const int lo = (int)((long)units * part / parts) * j->align;
    int hi = (int)((long)units * (part + 1) / parts) * j->align;
    hi = hi < j->N ? hi : j->N;
    if (lo < hi)
        j->fn(j->y, j->x, j->ldx, j->W, j->ldw, j->M, j->N, j->K, lo, hi);
}

/* Products below this many multiply-adds run on the calling thread alone (waking a helper costs more). */
enum { SKINNY_SPLIT_MIN_MACS = 1 << 18 };

void linear_forward_skinny(float *y, const float *x, const float *W, int M, int K, int N)
{
    const enum cpu_isa isa = cpu_isa();
    struct skinny_job j = {.fn = isa == CPU_ISA_AVX512 ? cols512 : cols256,
                           .y = y,
                           .x = x,
                           .W = W,
                           .ldx = K,
                           .ldw = K,
                           .M = M,
                           .N = N,
                           .K = K,
                           .align = isa == CPU_ISA_AVX512 ? 4 : 3};
    int parts = cpu_pool_threads();
    if ((double)M * N * K < SKINNY_SPLIT_MIN_MACS)
        parts = 1;
    if (parts > N / (4 * j.align))
        parts = N / (4 * j.align) > 0 ? N / (4 * j.align) : 1;
    cpu_run_parts(parts, skinny_part, &j);
}

/* ---- batch-invariant products (docs/training.md, "Batch-invariant mode"): the few-row kernels for every M */

/* Without AVX2: each output one dot product in 8 lanes over K in order, the lanes in a fixed tree (what the
 * compiler makes of it is the same for every row). */
static void cols_generic(float *y, const float *x, int ldx, const float *W, int ldw, int M, int N, int K, int n0,
                         int n1)
{
    for (int m = 0; m < M; m++)
        for (int n = n0; n < n1; n++) {
            const float *xm = x + (size_t)m * ldx, *wn = W + (size_t)n * ldw;
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int k = 0;
            for (; k + 8 <= K; k += 8)
                for (int l = 0; l < 8; l++)
                    acc[l] += xm[k + l] * wn[k + l];
            for (; k < K; k++)
                acc[k & 7] += xm[k] * wn[k];
            y[(size_t)m * N + n] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
        }
}

void linear_forward_bi(float *y, const float *x, int ldx, const float *W, int ldw, int M, int K, int N)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) {
        memset(y, 0, (size_t)M * N * sizeof(float));
        return;
    }
    const enum cpu_isa isa = cpu_isa();
    struct skinny_job j = {.fn = isa == CPU_ISA_AVX512 ? cols512
                                 : isa == CPU_ISA_AVX2 ? cols256
                                                       : cols_generic,
                           .W = W,
                           .ldx = ldx,
                           .ldw = ldw,
                           .N = N,
                           .K = K,
                           .align = isa == CPU_ISA_AVX512 ? 4
                                    : isa == CPU_ISA_AVX2 ? 3
                                                          : 1};
    /* blocks of rows whose x stays in the cache while W streams past (each output's sum is the same whatever the
     * block: one row of x against one row of W) */
    int rows = (int)((size_t)(256 << 10) / ((size_t)K * sizeof(float)));
    rows = rows < 4 ? 4 : rows / 4 * 4;
    for (int m0 = 0; m0 < M; m0 += rows) {
        j.M = M - m0 < rows ? M - m0 : rows;
        j.x = x + (size_t)m0 * ldx;
        j.y = y + (size_t)m0 * N;
        int parts = cpu_pool_threads();
        if ((double)j.M * N * K < SKINNY_SPLIT_MIN_MACS)
            parts = 1;
        if (parts > N / (4 * j.align))
            parts = N / (4 * j.align) > 0 ? N / (4 * j.align) : 1;
        cpu_run_parts(parts, skinny_part, &j);
    }
}
