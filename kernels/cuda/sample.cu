// Token sampling on the GPU, one row of logits per sequence, with sample_row's semantics (kernels/cpu/sample.c,
// what sample_token of worker/model/sampler.c runs): greedy argmax (first maximum) at temperature 0; otherwise p =
// softmax(logits / T), then, when top-k or top-p truncates, the candidates in order of descending p (ties by lower id)
// cut to the first top_k and then to the shortest prefix whose cumulative p reaches top_p, and the token is the first
// candidate whose cumulative p exceeds u * (the kept mass); without truncation the candidates are walked in id order,
// as the CPU does. The sort is a CUB segmented radix sort of 64-bit keys (p's bits above the complemented id), so ties
// are ordered by id without relying on a stable sort. Sums run in double in a fixed block order: the results are
// deterministic, and equal to the CPU's but where a cumulative sum lands within rounding of u.
#include <math.h>
#include <stdint.h>

#include <cub/device/device_segmented_radix_sort.cuh>

#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;
constexpr size_t kAlign = 256;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct layout {
    size_t keys_a, keys_b, offsets, uniforms, mx, logz, arg, temp, temp_bytes, total;
};

cudaError_t plan(int B, int V, layout *L)
{
    const size_t items = (size_t)B * V;
    size_t off = 0;
    L->keys_a = off;
    off += align_up(items * sizeof(uint64_t));
    L->keys_b = off;
    off += align_up(items * sizeof(uint64_t));
    L->offsets = off;
    off += align_up((size_t)(B + 1) * sizeof(int));
    L->uniforms = off;
    off += align_up((size_t)B * sizeof(double));
    L->mx = off;
    off += align_up((size_t)B * sizeof(float));
    L->logz = off;
    off += align_up((size_t)B * sizeof(double));
    L->arg = off;
    off += align_up((size_t)B * sizeof(int));
    L->temp = off;
    size_t temp_bytes = 0;
    cudaError_t rc = cub::DeviceSegmentedRadixSort::SortKeysDescending(
        nullptr, temp_bytes, static_cast<const uint64_t *>(nullptr), static_cast<uint64_t *>(nullptr), (int)items, B,
        static_cast<const int *>(nullptr), static_cast<const int *>(nullptr));
    if (rc != cudaSuccess)
        return rc;
    L->temp_bytes = temp_bytes;
    off += align_up(temp_bytes);
    L->total = off;
    return cudaSuccess;
}

__device__ __forceinline__ float key_p(uint64_t key) { return __uint_as_float((uint32_t)(key >> 32)); }
__device__ __forceinline__ int key_id(uint64_t key) { return (int)(0xffffffffu - (uint32_t)key); }

// Per row: the first maximum and its index, and log sum_j exp((l_j - max) / t) in double; offsets[r] = r V (the
// sort's segments, B + 1 of them).
__global__ void row_stats_kernel(float *mx, double *logz, int *arg, int *offsets, const float *logits, int B, int V,
                                 double t)
{
    __shared__ float sv[kThreads];
    __shared__ int si[kThreads];
    __shared__ double sd[kThreads];
    const float *l = logits + (size_t)blockIdx.x * V;
    float best = -INFINITY;
    int bi = V; // none yet
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        if (!isnan(l[j]) && (bi == V || l[j] > best)) { // a NaN never wins (the CPU's > skips it too)
            best = l[j];
            bi = j;
        }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            float v2 = sv[threadIdx.x + s];
            int i2 = si[threadIdx.x + s];
            // the larger value; between equal values the lower index (an empty slot has index V)
            if (i2 < V &&
                (si[threadIdx.x] == V || v2 > sv[threadIdx.x] || (v2 == sv[threadIdx.x] && i2 < si[threadIdx.x]))) {
                sv[threadIdx.x] = v2;
                si[threadIdx.x] = i2;
            }
        }
        __syncthreads();
    }
    const bool any = si[0] < V; // else every logit is NaN: index 0, as on the CPU
    const float m = any ? sv[0] : l[0];
    double z = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        z += exp((double)(l[j] - m) / t);
    sd[threadIdx.x] = z;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sd[threadIdx.x] += sd[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        mx[blockIdx.x] = m;
        arg[blockIdx.x] = any ? si[0] : 0;
        logz[blockIdx.x] = log(sd[0]);
        offsets[blockIdx.x] = (int)blockIdx.x * V;
        if (blockIdx.x == 0)
            offsets[B] = B * V;
    }
}

// keys[r * V + j] = bits of p_rj (as the CPU rounds it: float of exp in double) above ~j.
__global__ void keys_kernel(uint64_t *keys, const float *logits, const float *mx, const double *logz, int B, int V,
                            double t)
{
    const size_t n = (size_t)B * V;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(idx / V), j = (int)(idx - (size_t)r * V);
        const float p = (float)exp((double)(logits[idx] - mx[r]) / t - logz[r]);
        keys[idx] = ((uint64_t)__float_as_uint(p) << 32) | (uint64_t)(0xffffffffu - (uint32_t)j);
    }
}

// Inclusive prefix sum over the block (fixed pattern); *total gets the block's sum. Starts with a barrier, so
// back-to-back calls may reuse sh.
__device__ double scan_block(double v, double *sh, double *total)
{
    __syncthreads();
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int off = 1; off < kThreads; off <<= 1) {
        double add = (int)threadIdx.x >= off ? sh[threadIdx.x - off] : 0.0;
        __syncthreads();
        sh[threadIdx.x] += add;
        __syncthreads();
    }
    *total = sh[kThreads - 1];
    return sh[threadIdx.x];
}

__device__ int min_block(int v, int *sh)
{
    __syncthreads();
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] = min(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    return sh[0];
}

// The first candidate j < n (in keys' order) whose inclusive cumulative p satisfies `reach` (>= target when
// at_least, else > target); n when none. *mass gets the sum over all n when none is found.
__device__ int first_reaching(const uint64_t *keys, int n, double target, bool at_least, double *sh, int *shi,
                              double *mass)
{
    double carry = 0.0;
    for (int base = 0; base < n; base += kThreads) {
        const int j = base + threadIdx.x;
        const double p = j < n ? (double)key_p(keys[j]) : 0.0;
        double total;
        const double acc = carry + scan_block(p, sh, &total);
        const bool hit = j < n && (at_least ? acc >= target : target < acc);
        const int first = min_block(hit ? j : INT32_MAX, shi);
        if (first != INT32_MAX)
            return first;
        carry += total;
    }
    *mass = carry;
    return n;
}

__global__ void pick_kernel(int32_t *tokens, float *logps, const uint64_t *keys, const float *logits, const float *mx,
                            const double *logz, const int *arg, const double *uniforms, int V, double t, bool greedy,
                            bool truncate, float top_p, int top_k)
{
    __shared__ double sh[kThreads];
    __shared__ int shi[kThreads];
    const int r = blockIdx.x;
    int tok = arg[r];
    if (!greedy) {
        const uint64_t *kr = keys + (size_t)r * V;
        int n = V;
        if (truncate) {
            if (top_k > 0 && top_k < n)
                n = top_k;
            if (top_p < 1.0f) {
                double unused;
                const int first = first_reaching(kr, n, (double)top_p, true, sh, shi, &unused);
                n = first < n ? first + 1 : n;
            }
        }
        double mass = 0.0;
        first_reaching(kr, n, INFINITY, true, sh, shi, &mass); // nothing reaches infinity: the sum of the n
        const double u = uniforms[r] * mass;
        double unused;
        const int j = first_reaching(kr, n, u, false, sh, shi, &unused);
        tok = key_id(kr[j < n ? j : n - 1]);
    }
    if (threadIdx.x == 0) {
        tokens[r] = tok;
        if (logps)
            logps[r] = (float)((double)(logits[(size_t)r * V + tok] - mx[r]) / t - logz[r]);
    }
}

} // namespace

extern "C" size_t sample_rows_cuda_scratch_bytes(int B, int V)
{
    if (B <= 0 || V <= 0)
        return 0;
    layout L;
    if (plan(B, V, &L) != cudaSuccess)
        return 0;
    return L.total;
}

extern "C" cudaError_t sample_rows_cuda(int32_t *tokens, float *logps, const float *logits, int B, int V,
                                        float temperature, float top_p, int top_k, const double *uniforms,
                                        void *scratch, size_t scratch_bytes, cudaStream_t s)
{
    if (B < 0 || V <= 0 || (size_t)B * V > (size_t)INT32_MAX)
        return cudaErrorInvalidValue;
    if (B == 0)
        return cudaSuccess;
    layout L;
    cudaError_t rc = plan(B, V, &L);
    if (rc != cudaSuccess)
        return rc;
    if (!scratch || scratch_bytes < L.total || !tokens || !logits)
        return cudaErrorInvalidValue;
    char *base = static_cast<char *>(scratch);
    uint64_t *keys_a = reinterpret_cast<uint64_t *>(base + L.keys_a),
             *keys_b = reinterpret_cast<uint64_t *>(base + L.keys_b);
    int *offsets = reinterpret_cast<int *>(base + L.offsets), *arg = reinterpret_cast<int *>(base + L.arg);
    double *u = reinterpret_cast<double *>(base + L.uniforms), *logz = reinterpret_cast<double *>(base + L.logz);
    float *mx = reinterpret_cast<float *>(base + L.mx);
    const bool greedy = !(temperature > 0.0f);
    const double t = greedy ? 1.0 : (double)temperature;
    const bool truncate = (top_k > 0 && top_k < V) || top_p < 1.0f;
    if (!greedy) {
        if (!uniforms)
            return cudaErrorInvalidValue;
        rc = cudaMemcpyAsync(u, uniforms, sizeof(double) * (size_t)B, cudaMemcpyDefault, s);
        if (rc != cudaSuccess)
            return rc;
    }
    row_stats_kernel<<<B, kThreads, 0, s>>>(mx, logz, arg, offsets, logits, B, V, t);
    if ((rc = cudaGetLastError()) != cudaSuccess)
        return rc;
    const uint64_t *keys = keys_a;
    if (!greedy) {
        const size_t n = (size_t)B * V;
        size_t blocks = (n + kThreads - 1) / kThreads;
        keys_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), kThreads, 0, s>>>(keys_a, logits, mx, logz, B, V, t);
        if ((rc = cudaGetLastError()) != cudaSuccess)
            return rc;
        if (truncate) {
            size_t temp_bytes = L.temp_bytes;
            rc = cub::DeviceSegmentedRadixSort::SortKeysDescending(base + L.temp, temp_bytes, keys_a, keys_b, (int)n, B,
                                                                   offsets, offsets + 1, 0, 64, s);
            if (rc != cudaSuccess)
                return rc;
            keys = keys_b;
        }
    }
    pick_kernel<<<B, kThreads, 0, s>>>(tokens, logps, keys, logits, mx, logz, arg, u, V, t, greedy, truncate, top_p,
                                       top_k);
    return cudaGetLastError();
}
