/* Protocol framing: every message travels in a grpo.Envelope that carries the
 * sender's protocol version. Decoding checks size, structure and version and
 * says exactly what was wrong. */
#ifndef GRPO_PROTO_PROTOCOL_H
#define GRPO_PROTO_PROTOCOL_H

#include <stddef.h>
#include <stdint.h>

#include "grpo.pb-c.h"

/* Major version of the schema in grpo.proto (see its changelog comment); peers must agree. */
#define GRPO_PROTOCOL_VERSION 1u
/* Minor version: compatible additions; logged, never refused. */
#define GRPO_PROTOCOL_MINOR 20u
/* Largest message accepted on any socket (data plane: rollout batches). */
#define GRPO_MAX_MESSAGE_BYTES (64u << 20)
/* The largest request the trainers' dispatcher takes (work and weights requests are a few hundred bytes): a
 * bigger one is refused by its size before it is decoded or its MAC computed, and its socket drops it unread. */
#define GRPO_MAX_DISPATCH_REQUEST_BYTES (64u << 10)
/* Largest message accepted on a control socket (registration, heartbeat, command, status). */
#define GRPO_MAX_CONTROL_BYTES (1u << 20)

/* What protocol_decode found wrong with a message. */
enum protocol_error {
    PROTOCOL_OK = 0,
    PROTOCOL_TOO_BIG,     /* over the size limit */
    PROTOCOL_MALFORMED,   /* not a grpo.Envelope */
    PROTOCOL_BAD_VERSION, /* a well-formed envelope from an incompatible peer */
    PROTOCOL_NO_BODY,     /* a well-formed envelope without a body */
};

/* Pack an envelope (version filled in) into a new buffer; *len gets its size. Caller frees. */
uint8_t *protocol_pack(Grpo__Envelope *env, size_t *len);
/* Unpack and validate; NULL with why[] filled when the bytes are not an acceptable envelope. */
Grpo__Envelope *protocol_unpack(const uint8_t *buf, size_t len, char *why, size_t whylen);
/* Like protocol_unpack but says what failed. *env is the envelope on PROTOCOL_OK, and also on
 * PROTOCOL_BAD_VERSION and PROTOCOL_NO_BODY (so the caller can answer its request id);
 * NULL otherwise. The caller frees a non-NULL *env with protocol_free. */
enum protocol_error protocol_decode(const uint8_t *buf, size_t len, size_t limit, Grpo__Envelope **env, char *why,
                                    size_t whylen);
/* Free an envelope returned by protocol_unpack or protocol_decode. */
void protocol_free(Grpo__Envelope *env);
/* Pack a Reply{ok=false, error} answering request_id. Caller frees. */
uint8_t *protocol_pack_error(uint64_t request_id, const char *error, size_t *len);
/* Name of a body case ("register", "heartbeat", ...), for logs and metrics labels. */
const char *protocol_body_name(Grpo__Envelope__BodyCase body);

#endif
