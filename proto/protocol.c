#include "protocol.h"

#include <stdio.h>
#include <stdlib.h>

uint8_t *protocol_pack(Grpo__Envelope *env, size_t *len)
{
    env->version = GRPO_PROTOCOL_VERSION;
    env->minor_version = GRPO_PROTOCOL_MINOR;
    size_t n = grpo__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    *len = grpo__envelope__pack(env, buf);
    return buf;
}

enum protocol_error protocol_decode(const uint8_t *buf, size_t len, size_t limit, Grpo__Envelope **out, char *why,
                                    size_t whylen)
{
    *out = NULL;
    if (len > limit) {
        snprintf(why, whylen, "message of %zu bytes exceeds the %zu-byte limit", len, limit);
        return PROTOCOL_TOO_BIG;
    }
    Grpo__Envelope *env = grpo__envelope__unpack(NULL, len, buf);
    if (!env) {
        snprintf(why, whylen, "malformed message (%zu bytes that are not a grpo.Envelope)", len);
        return PROTOCOL_MALFORMED;
    }
    *out = env;
    if (env->version != GRPO_PROTOCOL_VERSION) {
        snprintf(why, whylen,
                 "incompatible protocol version %u (this program speaks version %u; upgrade the older side)",
                 env->version, GRPO_PROTOCOL_VERSION);
        return PROTOCOL_BAD_VERSION;
    }
    if (env->body_case == GRPO__ENVELOPE__BODY__NOT_SET) {
        snprintf(why, whylen, "message has no body");
        return PROTOCOL_NO_BODY;
    }
    return PROTOCOL_OK;
}

Grpo__Envelope *protocol_unpack(const uint8_t *buf, size_t len, char *why, size_t whylen)
{
    Grpo__Envelope *env;
    if (protocol_decode(buf, len, GRPO_MAX_MESSAGE_BYTES, &env, why, whylen) != PROTOCOL_OK) {
        protocol_free(env);
        return NULL;
    }
    return env;
}

void protocol_free(Grpo__Envelope *env)
{
    if (env)
        grpo__envelope__free_unpacked(env, NULL);
}

uint8_t *protocol_pack_error(uint64_t request_id, const char *error, size_t *len)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Reply reply = GRPO__REPLY__INIT;
    reply.ok = 0;
    reply.error = (char *)error;
    env.request_id = request_id;
    env.body_case = GRPO__ENVELOPE__BODY_REPLY;
    env.reply = &reply;
    return protocol_pack(&env, len);
}

const char *protocol_body_name(Grpo__Envelope__BodyCase body)
{
    switch (body) {
    case GRPO__ENVELOPE__BODY_REGISTER: return "register";
    case GRPO__ENVELOPE__BODY_ASSIGNMENT: return "assignment";
    case GRPO__ENVELOPE__BODY_HEARTBEAT: return "heartbeat";
    case GRPO__ENVELOPE__BODY_COMMAND: return "command";
    case GRPO__ENVELOPE__BODY_STATUS: return "status";
    case GRPO__ENVELOPE__BODY_ROLLOUT: return "rollout";
    case GRPO__ENVELOPE__BODY_REPLY: return "reply";
    case GRPO__ENVELOPE__BODY_STATUS_REQUEST: return "status_request";
    case GRPO__ENVELOPE__BODY_HEARTBEAT_ACK: return "heartbeat_ack";
    case GRPO__ENVELOPE__BODY_METRICS_REQUEST: return "metrics_request";
    case GRPO__ENVELOPE__BODY_METRICS_TEXT: return "metrics_text";
    case GRPO__ENVELOPE__BODY_WORK_REQUEST: return "work_request";
    case GRPO__ENVELOPE__BODY_WORK_GRANT: return "work_grant";
    case GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST: return "weights_request";
    case GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK: return "weights_chunk";
    case GRPO__ENVELOPE__BODY_RUN_CONFIG_REQUEST: return "run_config_request";
    case GRPO__ENVELOPE__BODY_RUN_CONFIG: return "run_config";
    case GRPO__ENVELOPE__BODY_AUTH_HELLO: return "auth_hello";
    case GRPO__ENVELOPE__BODY_AUTH_CHALLENGE: return "auth_challenge";
    case GRPO__ENVELOPE__BODY_SEALED: return "sealed";
    case GRPO__ENVELOPE__BODY_FLIGHT_REQUEST: return "flight_request";
    case GRPO__ENVELOPE__BODY_FLIGHT_REPLY: return "flight_reply";
    default: return "none";
    }
}
