#include "protocol.h"

#include <stdio.h>
#include <stdlib.h>

uint8_t *protocol_pack(Grpo__Envelope *env, size_t *len)
{
    env->version = GRPO_PROTOCOL_VERSION;
    size_t n = grpo__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    *len = grpo__envelope__pack(env, buf);
    return buf;
}

Grpo__Envelope *protocol_unpack(const uint8_t *buf, size_t len, char *why, size_t whylen)
{
    if (len > GRPO_MAX_MESSAGE_BYTES) {
        snprintf(why, whylen, "message of %zu bytes exceeds the %u-byte limit", len, GRPO_MAX_MESSAGE_BYTES);
        return NULL;
    }
    Grpo__Envelope *env = grpo__envelope__unpack(NULL, len, buf);
    if (!env) {
        snprintf(why, whylen, "malformed message (%zu bytes that are not a grpo.Envelope)", len);
        return NULL;
    }
    if (env->version != GRPO_PROTOCOL_VERSION) {
        snprintf(why, whylen,
                 "incompatible protocol version %u (this program speaks version %u; upgrade the older side)",
                 env->version, GRPO_PROTOCOL_VERSION);
        grpo__envelope__free_unpacked(env, NULL);
        return NULL;
    }
    if (env->body_case == GRPO__ENVELOPE__BODY__NOT_SET) {
        snprintf(why, whylen, "message has no body");
        grpo__envelope__free_unpacked(env, NULL);
        return NULL;
    }
    return env;
}

void protocol_free(Grpo__Envelope *env)
{
    if (env)
        grpo__envelope__free_unpacked(env, NULL);
}
