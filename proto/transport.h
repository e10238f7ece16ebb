/* Control-plane transport shared by grpod, grpoctl and the workers' control
 * client: endpoint names, the shared-secret file, and a REQ client that
 * matches replies to requests, times out, and says in plain words why grpod
 * could not be reached ("connection refused", "no such file or directory").
 *
 * Endpoints are nanomsg addresses: ipc://PATH (a Unix socket whose file mode
 * says who may connect) or tcp://HOST:PORT (the client proves it holds the
 * shared secret of grpod.secret_file by challenge-response and seals every
 * request under a session key: proto/ctl_auth.h; the secret never crosses
 * the network). */
#ifndef GRPO_PROTO_TRANSPORT_H
#define GRPO_PROTO_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/protocol.h"

/* Where grpod listens and clients connect when nothing else is configured. */
#define GRPOD_DEFAULT_ENDPOINT "ipc:///run/grpo/ctl.sock"
/* Longest shared secret accepted (bytes). */
#define GRPO_SECRET_MAX 1024
/* 22 characters: the base64 text of 16 random bytes (128 bits) */
#define GRPO_SECRET_MIN 22

enum endpoint_kind { ENDPOINT_IPC, ENDPOINT_TCP };

/* Classify an endpoint; for ipc:// the socket path goes to path[] (may be NULL). 0, or -1 with err. */
int endpoint_parse(const char *endpoint, enum endpoint_kind *kind, char *path, size_t pathlen, char *err,
                   size_t errlen);
/* Probe an endpoint with a plain socket connect: 0 when something listens, else -1 with why[]
 * in lower case ("connection refused", "no such file or directory", "permission denied"). */
int endpoint_probe(const char *endpoint, char *why, size_t whylen);

/* Make an endpoint ready for nn_bind. For ipc://PATH: nothing there is fine; a socket nobody answers on
 * (left by a killed process) is removed; anything else is left alone and refused: a socket something answers
 * on ("in use"), a regular file, a directory, a symbolic link... nanomsg's own bind would remove a regular
 * file and abort on a directory. tcp:// needs nothing. 0, or -1 with err naming the path and what is there. */
int endpoint_prepare_bind(const char *endpoint, char *err, size_t errlen);
/* nn_bind of a nanomsg socket to endpoint, after endpoint_prepare_bind. An ipc socket file is born with `mode` (the
 * umask set around the bind: no moment where others may connect) and its mode is checked after. 0, or -1 with err
 * saying why (without the endpoint: the caller names it). */
int endpoint_bind(int sock, const char *endpoint, unsigned mode, char *err, size_t errlen);
/* A nanomsg REP socket listening on endpoint (endpoint_bind, mode 0600), which drops unread any message over max_bytes.
 * The socket, or -1 with err naming `who`, the endpoint and why. */
int endpoint_listen_rep(const char *endpoint, int max_bytes, const char *who, char *err, size_t errlen);

/* Read a shared secret (first line, surrounding white space trimmed), as every reader of one does (grpod,
 * grpoctl, grpo-worker): refused when the file is not a regular file (a FIFO is not waited on), when its mode is
 * not 0600 or stricter (group or others may read it, or an execute or set-id bit), when another user owns it, and
 * when the secret is shorter than GRPO_SECRET_MIN characters (128 bits as base64), naming its size. 0, or -1 with
 * err naming the file and the fix. */
int secret_read(const char *path, char *out, size_t outlen, char *err, size_t errlen);
/* Compare two byte strings, every byte of both lengths, in time independent of where they differ
 * (it depends on la only: the received side's length); 1 when equal. */
int secret_bytes_equal(const uint8_t *a, size_t la, const uint8_t *b, size_t lb);
/* secret_bytes_equal of two C strings; 1 when equal. */
int secret_equal(const char *a, const char *b);
/* Whether an envelope's secret (bytes: an embedded NUL is a byte like any other) is exactly want. */
int secret_matches(ProtobufCBinaryData got, const char *want);
/* Put secret (NULL or "": none) into an envelope about to be packed; it points into secret. */
void envelope_set_secret(Grpo__Envelope *env, const char *secret);

/* Outcome of rpc_call. */
enum rpc_result {
    RPC_OK = 0,
    RPC_UNREACHABLE = -1, /* nothing answered in time; err says why (probe result) */
    RPC_BAD_REPLY = -2,   /* an answer came but could not be used (incompatible version, garbage) */
};

/* One REQ socket to grpod. Not thread-safe: use it from one thread. */
struct rpc_client;

/* Open a REQ socket connected to endpoint; secret may be NULL (ipc, or a data-plane socket). With a secret every
 * call goes through a session authenticated by challenge-response (made at the first call, and again when grpod
 * has forgotten it), sealed both ways (proto/ctl_auth.h). NULL with err on failure. */
struct rpc_client *rpc_open(const char *endpoint, const char *secret, char *err, size_t errlen);
/* Connect the client's socket to endpoint too: a request goes to whichever connected endpoint listens (nanomsg
 * sends it to a live peer, and again to another when that peer goes), so a service that moves to one of them is
 * found there (the dispatcher of a split run whose lead was lost). A timed-out call says the endpoint is gone only
 * when every one is. 0, or -1 with err. */
int rpc_connect_also(struct rpc_client *c, const char *endpoint, char *err, size_t errlen);
/* Close the socket and free the client. */
void rpc_close(struct rpc_client *c);
/* Send req (request id filled in here; Envelope.secret is never sent) and wait up to timeout_ms for its reply (the
 * session's challenge-response included, when one is due).
 * On RPC_OK *reply is the decoded answer (caller protocol_free()s it). */
enum rpc_result rpc_call(struct rpc_client *c, Grpo__Envelope *req, int timeout_ms, Grpo__Envelope **reply, char *err,
                         size_t errlen);
/* rpc_call retried up to attempts times while unreachable, backing off (100 ms doubling, at most
 * 2 s) between tries; each try first probes the endpoint, so a refused connection fails fast. */
enum rpc_result rpc_call_retry(struct rpc_client *c, Grpo__Envelope *req, int attempts, int timeout_ms,
                               Grpo__Envelope **reply, char *err, size_t errlen);
struct plane_cred;
/* From now on, authenticate each request with cred (kept by the caller; proto/plane_auth.h) and take only answers
 * authenticated for it (the data plane's dispatcher). */
void rpc_set_plane(struct rpc_client *c, struct plane_cred *cred);
/* The endpoint the client talks to. */
const char *rpc_endpoint(const struct rpc_client *c);

#endif
