// Embedding over a vocabulary shard [lo, hi) on the GPU. Forward copies rows (zero rows for ids outside the shard).
// Backward is deterministic without atomics: the first token of each id (its "leader") adds the gradient rows of
// all that id's tokens into the table row, in token order, starting from the row's value; that is the CPU's order
// of additions exactly, so dtable matches embedding_backward_shard bit for bit and runs are bit-identical.
//
// Cost: one block per token. Each in-shard token scans the ids before it for an earlier copy (stopping at the
// first one found), and each leader scans the ids after it: O(N^2) id reads when the ids are all distinct (2.7e8
// for N = 16k, mostly from L1/L2; estimated well under a millisecond on an H100, not measured), plus N x D gradient
// reads. A leader adds its rows alone, so an id repeated K times costs K x D sequential reads in one block (K ~ N
// for a padding id): slower than atomics, which is the price of a fixed order.
//
// Unlike the CPU path, ids outside [0, V) cannot abort the program from the device: they are treated as belonging
// to no shard (zero rows forward, nothing added backward).
#include "cuda_kernels.h"

namespace
{

constexpr int kThreads = 256; // a multiple of 32: the backward compacts its matches by warp ballots

__global__ void embedding_forward_kernel(float *out, const int32_t *ids, const float *table, int D, int lo, int hi)
{
    const int id = ids[blockIdx.x];
    float *row = out + (size_t)blockIdx.x * D;
    if (id >= lo && id < hi) {
        const float *src = table + (size_t)(id - lo) * D;
        for (int j = threadIdx.x; j < D; j += blockDim.x)
            row[j] = src[j];
    } else {
        for (int j = threadIdx.x; j < D; j += blockDim.x)
            row[j] = 0.0f;
    }
}

__global__ void embedding_backward_kernel(float *dtable, const float *dout, const int32_t *ids, int N, int D, int lo,
                                          int hi)
{
    __shared__ int match[kThreads];          // this chunk's tokens with the id, in token order
    __shared__ int warp_hits[kThreads / 32]; // how many each warp found
    const int t = blockIdx.x, id = ids[t];
    if (id < lo || id >= hi) // the same for the whole block
        return;
    // Only the first token with this id works; the others leave (the whole block agrees through syncthreads_or).
    for (int base = 0; base < t; base += blockDim.x) {
        int j = base + threadIdx.x;
        if (__syncthreads_or(j < t && ids[j] == id))
            return;
    }
    float *row = dtable + (size_t)(id - lo) * D;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int base = t; base < N; base += blockDim.x) {
        int j = base + threadIdx.x;
        bool hit = j < N && ids[j] == id;
        unsigned ballot = __ballot_sync(0xffffffffu, hit);
        if (lane == 0)
            warp_hits[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, hits = 0;
        for (int w = 0; w < warps; w++) {
            before += w < warp ? warp_hits[w] : 0;
            hits += warp_hits[w];
        }
        if (hit)
            match[before + __popc(ballot & ((1u << lane) - 1u))] = j;
        __syncthreads();
        // each thread owns columns c = threadIdx.x + k blockDim.x: no two threads touch one element
        for (int c = threadIdx.x; c < D; c += blockDim.x) {
            float acc = row[c];
            for (int m = 0; m < hits; m++)
                acc += dout[(size_t)match[m] * D + c];
            row[c] = acc;
        }
        __syncthreads(); // match and warp_hits are rewritten by the next chunk
    }
}

} // namespace

extern "C" cudaError_t embedding_forward_cuda(float *out, const int32_t *ids, const float *table, int N, int D, int lo,
                                              int hi, cudaStream_t stream)
{
    if (N <= 0 || D <= 0)
        return cudaSuccess;
    embedding_forward_kernel<<<N, kThreads, 0, stream>>>(out, ids, table, D, lo, hi);
    return cudaGetLastError();
}

extern "C" cudaError_t embedding_backward_cuda(float *dtable, const float *dout, const int32_t *ids, int N, int D,
                                               int lo, int hi, cudaStream_t stream)
{
    if (N <= 0 || D <= 0)
        return cudaSuccess;
    embedding_backward_kernel<<<N, kThreads, 0, stream>>>(dtable, dout, ids, N, D, lo, hi);
    return cudaGetLastError();
}
