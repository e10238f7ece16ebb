/* Field-level checks of a decoded request: every string valid UTF-8 without
 * control characters and within its length, every count and number in range,
 * every enum one the schema defines. protocol_decode checked the framing. */
#ifndef GRPO_DAEMON_VALIDATE_H
#define GRPO_DAEMON_VALIDATE_H

#include <stddef.h>

#include "proto/protocol.h"

/* 0 when the request's fields are acceptable, else -1 with why[] naming the field. */
int validate_request(const Grpo__Envelope *env, char *why, size_t whylen);
/* 1 when s is at most max bytes of valid UTF-8 without control characters. */
int validate_text(const char *s, size_t max);

#endif
