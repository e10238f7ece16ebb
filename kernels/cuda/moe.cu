// Mixture of experts on the GPU: the routing (softmax, top-k, the stable sort of the slots by expert) and its
// backward, and the row moves around the per-expert products (which the back-end runs through the shared loop of
// kernels.c, one cuBLAS GEMM per expert and projection): gathering the slots' inputs in expert order, combining the
// experts' outputs per token, the slots' gradients, and scattering the inputs' gradients back. Each output row is
// summed in slot order by one thread per element: no atomics, so the sums are deterministic. Written against
// kernels/cpu/moe.c; NOT YET RUN on a GPU (compiled only: tests/gpu/test_gpu_kernels.c's t_moe checks it against
// the CPU when scripts/gpu_check.sh runs on a device).
#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256;

// One thread per token t, as cpu_moe_route's loop body: probs (the softmax, its sum in double), the k most
// probable experts best first (a tie to the lower index), against ref's set (differ[t]) and with replay ref's
// experts, and their weights (renormalised with norm).
__global__ void route_kernel(float *probs, int32_t *idx, float *wt, int32_t *differ, const float *logits,
                             const int32_t *ref, int replay, int N, int E, int k, int norm)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N)
        return;
    const float *z = logits + (size_t)t * E;
    float *p = probs + (size_t)t * E;
    float mx = z[0];
    for (int e = 1; e < E; e++)
        mx = z[e] > mx ? z[e] : mx;
    double s = 0;
    for (int e = 0; e < E; e++) {
        const float v = expf(z[e] - mx);
        p[e] = v;
        s += v;
    }
    for (int e = 0; e < E; e++)
        p[e] = (float)(p[e] / s);
    int32_t *id = idx + (size_t)t * k;
    float *w = wt + (size_t)t * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken |= id[i] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        id[j] = best;
    }
    if (ref) {
        const int32_t *rf = ref + (size_t)t * k;
        bool same = true;
        for (int j = 0; j < k; j++) {
            bool found = false;
            for (int i = 0; i < k; i++)
                found |= rf[i] == id[j];
            same &= found;
        }
        differ[t] = !same;
        if (replay)
            for (int j = 0; j < k; j++)
                id[j] = rf[j];
    }
    double sum = 0;
    for (int j = 0; j < k; j++) {
        w[j] = p[id[j]];
        sum += p[id[j]];
    }
    if (norm)
        for (int j = 0; j < k; j++)
            w[j] = (float)(w[j] / sum);
}

// pmean[e] = the mean over the tokens of probs[., e]: one block per expert, a fixed tree in double
__global__ void pmean_kernel(float *pmean, const float *probs, int N, int E)
{
    __shared__ double part[kThreads];
    const int e = blockIdx.x;
    double acc = 0;
    for (int t = threadIdx.x; t < N; t += blockDim.x)
        acc += probs[(size_t)t * E + e];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        pmean[e] = N ? (float)(part[0] / N) : 0.0f;
}

// offs[e + 1] = the slots routed to expert e: one block per expert
__global__ void count_kernel(int32_t *offs, const int32_t *idx, int nk)
{
    __shared__ int part[kThreads];
    const int e = blockIdx.x;
    int acc = 0;
    for (int s = threadIdx.x; s < nk; s += blockDim.x)
        acc += idx[s] == e;
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        offs[e + 1] = part[0];
}

// the counts into offsets, in place: E is small (the experts of one layer), one thread
__global__ void offsets_kernel(int32_t *offs, int E)
{
    offs[0] = 0;
    for (int e = 0; e < E; e++)
        offs[e + 1] += offs[e];
}

// The stable counting sort: block e walks the slots in order, kThreads at a time, and writes those routed to e at
// offs[e] onwards in slot order (each warp's matches counted by ballot, the warps' counts summed in order).
__global__ void order_kernel(int32_t *order, const int32_t *offs, const int32_t *idx, int nk)
{
    __shared__ int warp_count[kThreads / 32];
    const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int next = offs[e];
    for (int c0 = 0; c0 < nk; c0 += blockDim.x) {
        const int s = c0 + threadIdx.x;
        const bool hit = s < nk && idx[s] == e;
        const unsigned mask = __ballot_sync(0xffffffffu, hit);
        if (lane == 0)
            warp_count[warp] = __popc(mask);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < (int)blockDim.x / 32; w++) {
            before += w < warp ? warp_count[w] : 0;
            total += warp_count[w];
        }
        if (hit)
            order[next + before + __popc(mask & ((1u << lane) - 1u))] = s;
        next += total;
        __syncthreads(); // warp_count is rewritten by the next chunk
    }
}

// pos[order[j]] = j
__global__ void pos_kernel(int32_t *pos, const int32_t *order, int nk)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < nk)
        pos[order[j]] = j;
}

// *n = sum of flags[0..N): one block
__global__ void count_flags_kernel(int32_t *n, const int32_t *flags, int N)
{
    __shared__ int part[kThreads];
    int acc = 0;
    for (int t = threadIdx.x; t < N; t += blockDim.x)
        acc += flags[t];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        *n = part[0];
}

// The routing's backward, one thread per token as cpu_moe_route_backward's loop body: dL/dprobs gathered in the
// token's own row of dlogits, then through the softmax in place.
__global__ void route_backward_kernel(float *dlogits, const float *probs, const int32_t *idx, const float *wt,
                                      const float *dwt, const float *dp_col, int N, int E, int k, int norm)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N)
        return;
    const float *p = probs + (size_t)t * E, *w = wt + (size_t)t * k, *dw = dwt + (size_t)t * k;
    const int32_t *id = idx + (size_t)t * k;
    float *dz = dlogits + (size_t)t * E;
    for (int e = 0; e < E; e++)
        dz[e] = dp_col ? dp_col[e] : 0.0f;
    if (norm) {
        double S = 0, dot = 0;
        for (int j = 0; j < k; j++)
            S += p[id[j]], dot += (double)dw[j] * w[j];
        for (int j = 0; j < k; j++)
            dz[id[j]] += (float)((dw[j] - dot) / S);
    } else {
        for (int j = 0; j < k; j++)
            dz[id[j]] += dw[j];
    }
    double dot = 0;
    for (int e = 0; e < E; e++)
        dot += (double)p[e] * dz[e];
    for (int e = 0; e < E; e++)
        dz[e] = (float)(p[e] * (dz[e] - dot));
}

// xs[j] = x[order[j] / k]: one block per slot row
__global__ void gather_kernel(float *xs, const float *x, const int32_t *order, int k, int D)
{
    const int j = blockIdx.x;
    const float *src = x + (size_t)(order[j] / k) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x)
        xs[(size_t)j * D + i] = src[i];
}

// y[t] = sum over t's slots s (in order) of wt[s] ys[pos[s]]: one block per token
__global__ void combine_kernel(float *y, const float *ys, const float *wt, const int32_t *pos, int k, int D)
{
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = 0.0f;
        for (int s = t * k; s < (t + 1) * k; s++)
            acc = __fadd_rn(acc, __fmul_rn(wt[s], ys[(size_t)pos[s] * D + i]));
        y[(size_t)t * D + i] = acc;
    }
}

// slot row j (slot s = order[j] of token t): dys[j] = wt[s] dy[t], dwt[s] = dy[t] . ys[j] (in double, a block's
// tree reduction): one block per slot row
__global__ void slot_grad_kernel(float *dys, float *dwt, const float *dy, const float *ys, const float *wt,
                                 const int32_t *order, int k, int D)
{
    __shared__ double part[kThreads];
    const int j = blockIdx.x, s = order[j];
    const float *dyt = dy + (size_t)(s / k) * D;
    double acc = 0;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        dys[(size_t)j * D + i] = __fmul_rn(wt[s], dyt[i]);
        acc += (double)dyt[i] * ys[(size_t)j * D + i];
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        dwt[s] = (float)part[0];
}

// dx[t] += sum over t's slots s of dxs[pos[s]]: one block per token
__global__ void scatter_kernel(float *dx, const float *dxs, const int32_t *pos, int k, int D)
{
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        float acc = dx[(size_t)t * D + i];
        for (int s = t * k; s < (t + 1) * k; s++)
            acc = __fadd_rn(acc, dxs[(size_t)pos[s] * D + i]);
        dx[(size_t)t * D + i] = acc;
    }
}

} // namespace

extern "C" cudaError_t moe_route_cuda(float *probs, float *pmean, int32_t *idx, float *wt, int32_t *order,
                                      int32_t *offs, int32_t *pos, int32_t *differ, int32_t *n_differ,
                                      const float *logits, const int32_t *ref, int replay, int N, int E, int k,
                                      int norm, cudaStream_t stream)
{
    if (E <= 0)
        return cudaSuccess;
    const int nk = N * k, blocks = (N + kThreads - 1) / kThreads, kblocks = (nk + kThreads - 1) / kThreads;
    if (N > 0)
        route_kernel<<<blocks, kThreads, 0, stream>>>(probs, idx, wt, differ, logits, ref, replay, N, E, k, norm);
    pmean_kernel<<<E, kThreads, 0, stream>>>(pmean, probs, N, E);
    count_kernel<<<E, kThreads, 0, stream>>>(offs, idx, nk);
    offsets_kernel<<<1, 1, 0, stream>>>(offs, E);
    order_kernel<<<E, kThreads, 0, stream>>>(order, offs, idx, nk);
    if (nk > 0)
        pos_kernel<<<kblocks, kThreads, 0, stream>>>(pos, order, nk);
    if (ref && n_differ)
        count_flags_kernel<<<1, kThreads, 0, stream>>>(n_differ, differ, N);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_route_backward_cuda(float *dlogits, const float *probs, const int32_t *idx, const float *wt,
                                               const float *dwt, const float *dp_col, int N, int E, int k, int norm,
                                               cudaStream_t stream)
{
    if (N <= 0 || E <= 0)
        return cudaSuccess;
    route_backward_kernel<<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dlogits, probs, idx, wt, dwt, dp_col,
                                                                                  N, E, k, norm);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_gather_cuda(float *xs, const float *x, const int32_t *order, int nk, int k, int D,
                                       cudaStream_t stream)
{
    if (nk == 0)
        return cudaSuccess;
    gather_kernel<<<nk, kThreads, 0, stream>>>(xs, x, order, k, D);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_pos_cuda(int32_t *pos, const int32_t *order, int nk, cudaStream_t stream)
{
    if (nk == 0)
        return cudaSuccess;
    pos_kernel<<<(nk + kThreads - 1) / kThreads, kThreads, 0, stream>>>(pos, order, nk);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_combine_cuda(float *y, const float *ys, const float *wt, const int32_t *pos, int N, int k,
                                        int D, cudaStream_t stream)
{
    if (N == 0)
        return cudaSuccess;
    combine_kernel<<<N, kThreads, 0, stream>>>(y, ys, wt, pos, k, D);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_slot_grad_cuda(float *dys, float *dwt, const float *dy, const float *ys, const float *wt,
                                          const int32_t *order, int nk, int k, int D, cudaStream_t stream)
{
    if (nk == 0)
        return cudaSuccess;
    slot_grad_kernel<<<nk, kThreads, 0, stream>>>(dys, dwt, dy, ys, wt, order, k, D);
    return cudaGetLastError();
}

extern "C" cudaError_t moe_scatter_cuda(float *dx, const float *dxs, const int32_t *pos, int N, int k, int D,
                                        cudaStream_t stream)
{
    if (N == 0)
        return cudaSuccess;
    scatter_kernel<<<N, kThreads, 0, stream>>>(dx, dxs, pos, k, D);
    return cudaGetLastError();
}
