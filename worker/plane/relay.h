/* The weight relay tree (actor_rollout_ref.rollout.weight_relay_fanout > 0; docs/scaling.md): a rollout process
 * that holds a policy version serves it to others on a REP socket of its own, so that trainer rank 0 sends about
 * fan-out copies of each version whatever the number of rollout processes. The dispatcher (dispatch_core.c) says
 * from where each process takes a version: from trainer rank 0, or from a holder it names. A holder has no run key:
 * its chunks are not authenticated, and the receiver checks the whole version against the BLAKE2b-256 digest the
 * dispatcher's authenticated answer carried. On a wrong digest, a silent relay or one gone, it fetches the version
 * from trainer rank 0 and names the relay, which the dispatcher never names again: a wrong relay costs time, never
 * the weights.
 *
 * A relay serves a version once it holds it whole (store and forward, not chunk by chunk as they arrive): each level
 * of the tree costs a whole version's transfer, so the last process has it after about log_k(N) + 1 transfers.
 * It serves from the caller's own buffer (no copy): relay_server_drop before the buffer changes.
 *
 * For the tests only: GRPO_TEST_RELAY_CORRUPT_RANK=R makes rollout rank R's relay flip a bit of every chunk it
 * serves, GRPO_TEST_RELAY_SILENT_RANK=R makes it read requests and never answer ("all": every rollout rank's;
 * tests/mpi/test_weight_relay.sh). */
#ifndef GRPO_WORKER_PLANE_RELAY_H
#define GRPO_WORKER_PLANE_RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RELAY_DIGEST_BYTES 32
#define RELAY_TOKEN_BYTES 16
/* How long a receiver waits for one chunk from a relay before it calls the relay silent. */
#define RELAY_CHUNK_TIMEOUT_MS 5000
/* How long a receiver waits, asking again, for a holder with room before it fetches from trainer rank 0. */
#define RELAY_WAIT_MAX_S 30.0

/* The BLAKE2b-256 digest (libsodium's crypto_generichash, unkeyed) of a version's n floats as they are in memory
 * (little-endian float32, the wire's order). */
void relay_digest(const float *w, size_t n, uint8_t out[RELAY_DIGEST_BYTES]);
/* Version v's relay token: keyed BLAKE2b-128 under the run key of a label, the key's epoch and v. The dispatcher
 * hands it (authenticated) to the processes it tells about v; a relay serves v only to a request that carries it,
 * so that a stranger who can reach a relay's socket, but holds no key of the run, reads nothing from it. */
void relay_token(const uint8_t *run_key, uint64_t epoch, int64_t v, uint8_t out[RELAY_TOKEN_BYTES]);

/* Where rollout rank `slot`'s relay binds (bind) and is dialled (dial), from the dispatcher's endpoint: ipc: a socket
 * next to the dispatcher's; tcp: the port after the dispatcher's plus slot, on every interface, dialled at host.
 * 0, or -1 with err (a socket path too long). */
int relay_endpoints(const char *dispatch_endpoint, int slot, const char *host, char *bind, char *dial, size_t len,
                    char *err, size_t errlen);

struct relay_server;
/* Bind and start serving (nothing held yet) as rollout rank `slot`'s relay. NULL with err. */
struct relay_server *relay_server_open(const char *bind_endpoint, int slot, char *err, size_t errlen);
/* Serve version v from w[0..n) (the caller keeps it unchanged until relay_server_drop) to requests that carry its
 * token. */
void relay_server_hold(struct relay_server *s, int64_t v, const float *w, size_t n,
                       const uint8_t token[RELAY_TOKEN_BYTES]);
/* Stop serving the version held (a chunk being sent is finished first): its buffer may change. */
void relay_server_drop(struct relay_server *s);
/* The bytes of weights this relay has served so far. */
int64_t relay_server_bytes(struct relay_server *s);
void relay_server_close(struct relay_server *s);

/* Fetch version v whole from the relay at endpoint into w[0..n) in chunks of chunk_bytes, each answered within
 * timeout_ms. 0 with *bytes and *chunks; 1 when the relay no longer holds v (it moved on: no fault of its); -1 with
 * err (no answer, garbage, wrong sizes). The caller checks the digest. */
int relay_fetch(const char *endpoint, int64_t v, const uint8_t token[RELAY_TOKEN_BYTES], float *w, size_t n,
                size_t chunk_bytes, int timeout_ms, size_t *bytes, int *chunks, char *err, size_t errlen);

#endif
