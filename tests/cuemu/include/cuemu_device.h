/* cuemu: the device side of CUDA C++ on the CPU, for the kernels/cuda .cu files after tests/cuemu/translate.py has
 * turned their launches (k<<<grid, block, smem, stream>>>(args)) into cuemu::make_launch(k, "k", grid, block, smem,
 * stream)(args) and their extern __shared__ arrays into the launch's dynamic shared memory.
 *
 * A kernel runs block by block; each thread of a block is a fiber with its own threadIdx. __syncthreads() and the
 * warp operations (__shfl*_sync, __ballot_sync, __syncwarp) are barriers: a fiber runs until it reaches one, and
 * the barrier opens when every thread it names has arrived. A barrier that can never open (divergent
 * __syncthreads, a lane that left before a warp operation that names it) is reported as a fault, which a GPU would
 * turn into a hang or undefined results. __shared__ variables are statics: blocks run one at a time. */
#ifndef CUEMU_DEVICE_H
#define CUEMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

namespace cuemu
{
extern uint3 *tid;                     // threadIdx of the running thread (its fiber)
extern uint3 block;                    // blockIdx
extern dim3 bdim, gdim;                // blockDim, gridDim
void *dyn_smem();                      // the launch's dynamic shared memory
void sync_block();                     // __syncthreads
int sync_block_pred(int pred, int op); // __syncthreads_or (0), _and (1), _count (2)
// a warp barrier over mask's lanes; then lane src's value (src < 0: this lane's own), or the ballot of the preds
uint64_t warp_shfl(unsigned mask, uint64_t value, int src, const char *op);
unsigned warp_ballot(unsigned mask, int pred);
extern unsigned cur_lane; // the running thread's lane in its warp
inline unsigned lane() { return cur_lane; }
[[noreturn]] void fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// a kernel launch: checked, then run, or recorded while stream captures (body is copied: it owns the arguments)
cudaError_t launch(const void *fn, const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   const std::function<void()> &body, const void *const *ptrs, int nptrs);
// other device work on stream (a copy, a set, a cuBLAS call), its arguments checked: run now, or recorded while
// stream captures; an error when it can be neither (a capture that forbids it is then invalidated)
cudaError_t submit(cudaStream_t stream, const char *what, std::function<void()> work);
cudaError_t func_set_attribute(const void *fn, enum cudaFuncAttribute attr, int value);

template <class... P> struct launcher {
    void (*fn)(P...);
    const char *name;
    dim3 grid, blk;
    size_t smem;
    cudaStream_t stream;

    template <class... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "a kernel launch with the wrong number of arguments");
        std::tuple<typename std::decay<P>::type...> args(std::forward<A>(a)...); // converted as CUDA does
        const void *ptrs[sizeof...(P) + 1];
        int np = 0;
        std::apply(
            [&](const auto &...x) {
                auto note = [&](const auto &v) {
                    if constexpr (std::is_pointer<typename std::decay<decltype(v)>::type>::value)
                        ptrs[np++] = (const void *)v;
                };
                (note(x), ...);
            },
            args);
        auto f = fn;
        launch(
            reinterpret_cast<const void *>(fn), name, grid, blk, smem, stream, [f, args]() { std::apply(f, args); },
            ptrs, np);
    }
};

template <class... P>
launcher<P...> make_launch(void (*fn)(P...), const char *name, dim3 grid, dim3 blk, size_t smem = 0,
                           cudaStream_t stream = nullptr)
{
    return launcher<P...>{fn, name, grid, blk, smem, stream};
}

// device memory accessible for the scope's life (cuemu_device_enter / _leave)
struct device_scope {
    device_scope() { cuemu_device_enter(); }
    ~device_scope() { cuemu_device_leave(); }
    device_scope(const device_scope &) = delete;
    device_scope &operator=(const device_scope &) = delete;
};

template <class T> inline uint64_t to_bits(T v)
{
    static_assert(sizeof(T) <= 8, "a warp operation on a value wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}

template <class T> inline T from_bits(uint64_t b)
{
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}

} // namespace cuemu

#define threadIdx (*cuemu::tid)
#define blockIdx (cuemu::block)
#define blockDim (cuemu::bdim)
#define gridDim (cuemu::gdim)
#define warpSize 32

template <class T> inline cudaError_t cudaFuncSetAttribute(T *fn, enum cudaFuncAttribute attr, int value)
{
    return cuemu::func_set_attribute(reinterpret_cast<const void *>(fn), attr, value);
}

inline void __syncthreads() { cuemu::sync_block(); }
inline int __syncthreads_or(int p) { return cuemu::sync_block_pred(p, 0); }
inline int __syncthreads_and(int p) { return cuemu::sync_block_pred(p, 1); }
inline int __syncthreads_count(int p) { return cuemu::sync_block_pred(p, 2); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)cuemu::warp_ballot(mask, 0); }

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    unsigned l = cuemu::lane(), base = l & ~(unsigned)(width - 1);
    int from = (int)(base + ((unsigned)src & (unsigned)(width - 1)));
    return cuemu::from_bits<T>(cuemu::warp_shfl(mask, cuemu::to_bits(v), from, "__shfl_sync"));
}

template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    unsigned l = cuemu::lane(), src = l ^ (unsigned)lane_mask;
    int from = (src & ~(unsigned)(width - 1)) > (l & ~(unsigned)(width - 1)) ? -1 : (int)src; // a later group: own
    return cuemu::from_bits<T>(cuemu::warp_shfl(mask, cuemu::to_bits(v), from, "__shfl_xor_sync"));
}

template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    unsigned l = cuemu::lane(), src = l + delta;
    int from = (src & ~(unsigned)(width - 1)) != (l & ~(unsigned)(width - 1)) ? -1 : (int)src;
    return cuemu::from_bits<T>(cuemu::warp_shfl(mask, cuemu::to_bits(v), from, "__shfl_down_sync"));
}

template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    unsigned l = cuemu::lane();
    int from = (l & (unsigned)(width - 1)) < delta ? -1 : (int)(l - delta);
    return cuemu::from_bits<T>(cuemu::warp_shfl(mask, cuemu::to_bits(v), from, "__shfl_up_sync"));
}

inline unsigned __ballot_sync(unsigned mask, int pred) { return cuemu::warp_ballot(mask, pred); }
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }

/* arithmetic: the _rn forms are the plain IEEE operations (the emulated build does not contract a * b + c) */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __double2float_rn(double a) { return (float)a; }
inline float __expf(float a) { return expf(a); }
inline float __logf(float a) { return logf(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : (a > 1.0f ? 1.0f : a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline double rsqrt(double a) { return 1.0 / sqrt(a); }
inline unsigned __float_as_uint(float a) { return cuemu::from_bits<unsigned>(cuemu::to_bits(a)); }
inline float __uint_as_float(unsigned a) { return cuemu::from_bits<float>(cuemu::to_bits(a)); }
inline int __float_as_int(float a) { return cuemu::from_bits<int>(cuemu::to_bits(a)); }
inline float __int_as_float(int a) { return cuemu::from_bits<float>(cuemu::to_bits(a)); }
inline int __popc(unsigned a) { return __builtin_popcount(a); }
inline int __popcll(unsigned long long a) { return __builtin_popcountll(a); }
inline int __clz(unsigned a) { return a ? __builtin_clz(a) : 32; }
inline int __ffs(unsigned a) { return __builtin_ffs((int)a); }
template <class T> inline T __ldg(const T *p) { return *p; }

/* CUDA's min and max: fminf / fmaxf on floating point, the usual conversions on integers */
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
template <class A, class B,
          class = typename std::enable_if<std::is_integral<A>::value && std::is_integral<B>::value>::type>
inline typename std::common_type<A, B>::type min(A a, B b)
{
    typedef typename std::common_type<A, B>::type C;
    return (C)b < (C)a ? (C)b : (C)a;
}
template <class A, class B,
          class = typename std::enable_if<std::is_integral<A>::value && std::is_integral<B>::value>::type>
inline typename std::common_type<A, B>::type max(A a, B b)
{
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)b : (C)a;
}

#endif
