/* The Status message as JSON: what /api/status serves and `grpoctl status
 * --json` prints, the same document for both. Non-finite numbers are null. */
#ifndef GRPO_DAEMON_STATUS_JSON_H
#define GRPO_DAEMON_STATUS_JSON_H

#include "proto/protocol.h"

/* JSON text of a Status (caller frees). pretty: indented for people. */
char *status_to_json(const Grpo__Status *s, int pretty);

#endif
