/* Protocol framing: every message travels in a grpo.Envelope that carries the
 * sender's protocol version. Decoding checks size, structure and version and
 * says exactly what was wrong. */
#ifndef GRPO_PROTO_PROTOCOL_H
#define GRPO_PROTO_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include "grpo.pb-c.h"

/* Version of the schema in grpo.proto; see its changelog comment. */
#define GRPO_PROTOCOL_VERSION 1u
/* Largest message accepted on any socket. */
#define GRPO_MAX_MESSAGE_BYTES (64u << 20)

/* Pack an envelope (version filled in) into a new buffer; *len gets its size. Caller frees. */
uint8_t *protocol_pack(Grpo__Envelope *env, size_t *len);
/* Unpack and validate; NULL with why[] filled when the bytes are not an acceptable envelope. */
Grpo__Envelope *protocol_unpack(const uint8_t *buf, size_t len, char *why, size_t whylen);
/* Free an envelope returned by protocol_unpack. */
void protocol_free(Grpo__Envelope *env);

#endif
