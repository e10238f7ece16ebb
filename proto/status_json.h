/* The Status message as JSON: what /api/status serves and `grpoctl status
 * --json` prints, the same document for both. Non-finite numbers are null. */
#ifndef GRPO_DAEMON_STATUS_JSON_H
#define GRPO_DAEMON_STATUS_JSON_H

#include "proto/protocol.h"

/* JSON text of a Status (caller frees). pretty: indented for people. "workers_registered" is how many workers
 * are registered: the workers listed, or registered when it is not negative (a status of some workers). */
char *status_to_json(const Grpo__Status *s, int pretty);
char *status_to_json_of(const Grpo__Status *s, int pretty, int registered);
/* One wait of a worker's flight recorder as a JSON object: the keys of the worker's own dump lines
 * (RUN_DIR/flight/rank-R.jsonl), "id", "kind", "op", "group", "members", "group_size", "seq", "bytes", "peer",
 * "phase", "layer", "pass", "began", "seconds", "open", "failed". */
struct json_t;
struct json_t *status_flight_json(const Grpo__FlightEntry *e);

#endif
