/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of
 * TensorBoard's TFRecord frames and of the checkpoints' binary state files:
 * crc32c("123456789") = 0xE3069283. */
#ifndef GRPO_COMMON_CRC32C_H
#define GRPO_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* crc32c_update(0, ...) starts a checksum; chunks chain through the returned value. */
uint32_t crc32c_update(uint32_t crc, const void *data, size_t n);
/* The CRC-32C of n bytes in one pass. */
static inline uint32_t crc32c(const void *data, size_t n) { return crc32c_update(0, data, n); }

#endif
