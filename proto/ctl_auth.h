/* The control plane's authentication on tcp:// (protocol 1.12; docs/protocol.md, Control-plane authentication):
 * challenge-response, then a sealed session. The shared secret never crosses the network.
 *
 *   client -> grpod   AuthHello{client nonce Nc}                       (32 fresh random bytes)
 *   grpod  -> client  AuthChallenge{server nonce Ns, session S, proof} (32 and 16 fresh random bytes)
 *   client -> grpod   Sealed{S, counter n, box}   box = secretbox(request, nonce(client, n), session key)
 *   grpod  -> client  Sealed{S, counter n, box}   box = secretbox(answer, nonce(grpod, n), session key)
 *
 * K = BLAKE2b-256("grpo control k 1" || secret); proof = BLAKE2b-256_K("grpo srv proof 1" || Nc || Ns || S);
 * session key = BLAKE2b-256_K("grpo session k 1" || Nc || Ns || S) (keyed BLAKE2b: libsodium crypto_generichash).
 * grpod proves it holds the secret with `proof` (the client takes no session otherwise); the client proves it with
 * its first box, which opens only under a session key derived from the secret and grpod's fresh nonce. A session's
 * counters rise: a box is taken once, so a captured request replayed is refused (the same session: its counter is
 * used; another session: its key differs), and an answer is taken only for the request it answers. Everything in
 * a box is hidden from a reader of the network, the data-plane keys of an Assignment included.
 *
 * No primitive is written here: libsodium does the hashing, the boxes, the comparisons and the random bytes. */
#ifndef GRPO_PROTO_CTL_AUTH_H
#define GRPO_PROTO_CTL_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/protocol.h"

#define CTL_NONCE_BYTES 32
#define CTL_SESSION_BYTES 16
#define CTL_KEY_BYTES 32
/* sessions grpod holds at once (the least recently used is forgotten first; its client authenticates again) */
#define CTL_SESSIONS_MAX 256
/* of which challenged and not used yet (a flood of hellos forgets the oldest of these only) */
#define CTL_PENDING_MAX 64
/* a challenge not answered this long is forgotten */
#define CTL_PENDING_S 30.0

/* ---- the client's side (proto/transport.c) ---- */

struct ctl_client {
    uint8_t k[CTL_KEY_BYTES]; /* K, from the secret (the secret itself is not kept) */
    uint8_t nc[CTL_NONCE_BYTES];
    uint8_t session[CTL_SESSION_BYTES];
    uint8_t skey[CTL_KEY_BYTES];
    uint64_t counter; /* of the last request sealed */
    bool hello_sent, open;
};

/* K of the secret. */
void ctl_client_init(struct ctl_client *c, const char *secret);
/* Forget the session (the next request authenticates again). */
void ctl_client_reset(struct ctl_client *c);
/* Wipe everything (the client is closed). */
void ctl_client_wipe(struct ctl_client *c);
/* A fresh AuthHello answering-id request_id, packed (caller frees). */
uint8_t *ctl_client_hello(struct ctl_client *c, uint64_t request_id, size_t *len);
/* Take grpod's answer to the hello: an AuthChallenge whose proof is right opens the session. 0, or -1 with why. */
int ctl_client_accept(struct ctl_client *c, const Grpo__Envelope *answer, char *why, size_t whylen);
/* Seal req (packed whole, version filled in) into an outer envelope of the same request id, with the session's next
 * counter (*counter). Caller frees. */
uint8_t *ctl_client_seal(struct ctl_client *c, Grpo__Envelope *req, uint64_t *counter, size_t *len);
/* Open grpod's sealed answer to the request of `counter`: *inner is the answer (protocol_free it). 0, or -1 with why
 * (not sealed, another session or counter, a box that does not open, an inner envelope that does not decode). */
int ctl_client_open(const struct ctl_client *c, uint64_t counter, const Grpo__Envelope *outer, Grpo__Envelope **inner,
                    char *why, size_t whylen);

/* ---- grpod's side (daemon/core.c) ---- */

struct ctl_server;

/* An empty table of sessions under secret's K. */
struct ctl_server *ctl_server_new(const char *secret);
void ctl_server_free(struct ctl_server *s);
/* Whether the table is keyed with secret's K (else make a new table: every session is forgotten). */
bool ctl_server_keyed(const struct ctl_server *s, const char *secret);

/* Answer an AuthHello: a fresh challenged session. The packed AuthChallenge (caller frees), or NULL with why (a
 * nonce of the wrong size). */
uint8_t *ctl_server_challenge(struct ctl_server *s, const Grpo__Envelope *hello, double now, size_t *len, char *why,
                              size_t whylen);

enum ctl_verdict {
    CTL_OK = 0,
    CTL_UNKNOWN = -1, /* no such session (grpod restarted, or forgot it): the client authenticates again */
    CTL_REPLAY = -2,  /* a counter the session has used */
    CTL_BAD = -3,     /* a box that does not open (not under this session's key), or a malformed Sealed */
};
/* What a sealed request's answer is sealed with. */
struct ctl_ticket {
    uint8_t session[CTL_SESSION_BYTES];
    uint8_t skey[CTL_KEY_BYTES];
    uint64_t counter;
};
/* Open a sealed request at time now: *plain (malloc'd, *plen bytes) is the packed inner envelope, *t what its
 * answer is sealed with. A good box marks the session used and its counter taken. why says what failed. */
enum ctl_verdict ctl_server_open(struct ctl_server *s, const Grpo__Sealed *sealed, double now, uint8_t **plain,
                                 size_t *plen, struct ctl_ticket *t, char *why, size_t whylen);
/* Seal an answer (plain: a packed envelope) for the request of ticket t, into an outer envelope answering
 * request_id; the ticket is wiped. Caller frees. */
uint8_t *ctl_server_seal(struct ctl_ticket *t, uint64_t request_id, const uint8_t *plain, size_t plen, size_t *len);
/* Wipe n bytes at p, then free them (p may be NULL). */
void ctl_wipe_free(uint8_t *p, size_t n);
/* Sessions held now, and of those challenged and not used yet. */
void ctl_server_counts(const struct ctl_server *s, int *sessions, int *pending);

#endif
