/* cuemu: the BF16 type and the conversions this project uses (tests/cuemu/README.md). */
#ifndef CUEMU_CUDA_BF16_H
#define CUEMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

typedef struct __nv_bfloat16 {
    uint16_t __x;
} __nv_bfloat16;

/* round to nearest even; a NaN stays a (quiet) NaN */
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        h.__x = (uint16_t)((u >> 16) | 0x40u);
    else
        h.__x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

static inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

#endif
