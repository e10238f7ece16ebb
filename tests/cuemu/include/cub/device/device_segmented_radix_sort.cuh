// cuemu: CUB's segmented radix sort of keys, descending, on the CPU (tests/cuemu/README.md). The first call
// (temp == nullptr) asks for scratch, as CUB's does; the second sorts every segment [begin[s], end[s]) of the keys
// by bits [begin_bit, end_bit), largest first, stably (ties keep their order, as a radix sort's do).
#ifndef CUEMU_CUB_DEVICE_SEGMENTED_RADIX_SORT_CUH
#define CUEMU_CUB_DEVICE_SEGMENTED_RADIX_SORT_CUH

#include <stdio.h>

#include <algorithm>
#include <type_traits>

#include "cuda_runtime.h"

namespace cub
{
struct DeviceSegmentedRadixSort {
    template <class K, class BeginIt, class EndIt>
    static cudaError_t SortKeysDescending(void *temp, size_t &temp_bytes, const K *in, K *out, int num_items,
                                          int num_segments, BeginIt begin, EndIt end, int begin_bit = 0,
                                          int end_bit = (int)sizeof(K) * 8, cudaStream_t stream = 0)
    {
        static_assert(std::is_unsigned<K>::value, "cuemu sorts unsigned keys only");
        (void)stream;
        const size_t need = 256 + (size_t)num_items * sizeof(K); // CUB's double buffer, roughly
        if (!temp) {
            temp_bytes = need;
            return cudaSuccess;
        }
        if (temp_bytes < need || cuemu_pointer_kind(temp) != 1 ||
            (num_items && (cuemu_pointer_kind(in) != 1 || cuemu_pointer_kind(out) != 1))) {
            fprintf(stderr,
                    "cuemu: cub::DeviceSegmentedRadixSort::SortKeysDescending: the scratch (%zu of %zu bytes) "
                    "or the keys are not device memory of the size asked for",
                    temp_bytes, need);
            return cudaErrorInvalidValue;
        }
        if (begin_bit < 0 || end_bit > (int)sizeof(K) * 8 || begin_bit >= end_bit)
            return cudaErrorInvalidValue;
        const K mask = (K)((end_bit - begin_bit == (int)sizeof(K) * 8 ? ~(K)0 : (((K)1 << (end_bit - begin_bit)) - 1))
                           << begin_bit);
        cuemu::device_scope device; // the keys and offsets are device memory
        if (in != out)
            std::copy(in, in + num_items, out);
        for (int s = 0; s < num_segments; s++) {
            int b = begin[s], e = end[s];
            if (b < 0 || e > num_items || b > e) {
                cuemu_say("cub::DeviceSegmentedRadixSort: segment %d is [%d, %d) of %d keys", s, b, e, num_items);
                return cudaErrorInvalidValue;
            }
            std::stable_sort(out + b, out + e, [mask](K x, K y) { return (x & mask) > (y & mask); });
        }
        return cudaSuccess;
    }
};
} // namespace cub

#endif
