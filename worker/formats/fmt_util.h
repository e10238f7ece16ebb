/* Helpers shared by the checkpoint readers and writers in worker/formats
 * (private to that folder): half-precision conversions that match numpy /
 * ggml bit for bit, and unaligned little-endian loads. */
#ifndef GRPO_WORKER_FMT_UTIL_H
#define GRPO_WORKER_FMT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "worker/formats assumes a little-endian host (GGUF and safetensors are little-endian)"
#endif

/* IEEE binary16 -> binary32, exact for every input (subnormals, inf, NaN payloads). */
static inline float fmt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in binary32 */
        float v = (float)mant * 0x1p-24f;
        memcpy(&bits, &v, sizeof bits);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* bfloat16 -> binary32: the upper half of the binary32 pattern. */
static inline float fmt_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* binary32 -> bfloat16, round to nearest even, NaN kept quiet (as ggml and torch do). */
static inline uint16_t fmt_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

static inline uint16_t fmt_ld_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t fmt_ld_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint64_t fmt_ld_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* mmap a regular file read-only; -1 with err ("PATH: why") if it cannot, or if it is shorter than min_size
 * (kind names the format in that message). */
int fmt_map_file(const char *path, size_t min_size, const char *kind, const uint8_t **map, size_t *size, char *err,
                 size_t errlen);

#endif
