/* Authentication of the data plane and the dispatcher (protocol 1.8; docs/protocol.md, Authentication).
 *
 * A launch of a run has one random key (the run key: made by grpod for each launch of the run, or by world rank 0
 * at launch without grpod) and a key epoch that names it (under grpod 1, 2, ... for each launch; without grpod a
 * random number). Each process has an identity (its world rank, its pid, a random incarnation and the epoch) and
 * its own key, KDF(run key, identity) (keyed BLAKE2b, libsodium crypto_generichash). A message of another epoch
 * than the receiver's (another launch's: a replay across a relaunch) is refused before its MAC is computed. Only the
 * issuer (grpod, or rank 0) and the trainers hold the run key; a rollout process is handed its own key alone, so
 * holding it lets it speak as itself and nobody else. Every request carries a PlaneAuth: its identity, a counter (from
 * 1, a new one per message) and a keyed BLAKE2b-256 MAC (crypto_generichash) of the whole envelope packed with the MAC
 * empty. The receiver derives the claimed identity's key from the run key and checks the MAC, and refuses a counter it
 * has seen from that identity (a replay). An answer carries the asker's identity and counter, marked as a reply, under
 * the asker's key: the asker knows it comes from a holder of the run key and answers its own request.
 *
 * No primitive is written here: libsodium does the MAC, the KDF, the comparison and the random bytes. */
#ifndef GRPO_PROTO_PLANE_AUTH_H
#define GRPO_PROTO_PLANE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/protocol.h"

#define PLANE_KEY_BYTES 32
#define PLANE_MAC_BYTES 32

struct plane_id {
    int32_t rank;
    uint32_t pid;
    uint64_t incarnation;
    uint64_t epoch; /* the key epoch of the launch (PlaneAuth.epoch); 0 only from a sender older than 1.12 */
};

/* A process's credentials: who it is, its own key, and the counter of its last message (atomic: a process's
 * threads share it). */
struct plane_cred {
    struct plane_id id;
    uint8_t key[PLANE_KEY_BYTES];
    uint64_t counter;
    bool set;
};

/* What a receiver holds: the run key, and the counters each identity has used (a bounded table, the oldest
 * identity forgotten first: a forgotten identity's old messages would be taken again, so a receiver sizes the table
 * for every process that may speak to it, plane_verifier_capacity). PLANE_SEEN_MAX unless sized. */
#define PLANE_SEEN_MAX 1024
struct plane_seen {
    struct plane_id id;
    uint64_t top;                  /* the highest counter accepted */
    uint64_t window;               /* bit i: counter top - 1 - i was accepted too */
    uint8_t last[PLANE_MAC_BYTES]; /* the MAC of the message with counter top */
    uint64_t used;                 /* for eviction */
};
struct plane_verifier {
    uint8_t run_key[PLANE_KEY_BYTES];
    uint64_t epoch; /* the run key's: a message of another is refused */
    bool set;
    struct plane_seen *seen; /* [cap], allocated on first use */
    int nseen, cap;          /* cap 0: PLANE_SEEN_MAX */
    uint64_t clock;
    uint64_t macs, mac_bytes; /* MACs computed over requests so far, and the bytes they covered */
};

/* libsodium's initialisation (once per process; safe to call again). 0, or -1 when it failed. */
int plane_init(void);
/* A fresh random run key. */
void plane_run_key_new(uint8_t key[PLANE_KEY_BYTES]);
/* A fresh random 64-bit number (never 0). */
uint64_t plane_random64(void);

/* A process's generation at its rank within a launch: the top 16 bits of its incarnation (so that the key, which
 * the incarnation enters, vouches for it). The processes a launch starts are generation 0 (without grpod) or their
 * rank's next one (grpod counts each registration of a rank); a replacement (grpo-worker --replace-rank) is the
 * generation after the process it replaces. The dispatcher takes a later generation of a rank as the newer
 * process: it supersedes the older one (worker/plane/dispatch_core.c). Generations compare modulo 2^16. */
#define PLANE_GENERATION_SHIFT 48
static inline unsigned plane_generation(uint64_t incarnation)
{
    return (unsigned)(incarnation >> PLANE_GENERATION_SHIFT);
}
/* Whether generation a is later than b (modulo 2^16: half the circle ahead). */
static inline bool plane_generation_later(unsigned a, unsigned b) { return (int16_t)(uint16_t)(a - b) > 0; }
/* An incarnation of generation gen: 48 fresh random bits (never all 0) under it. */
uint64_t plane_incarnation_new(unsigned gen);
/* The incarnation of generation gen with the random bits of r (r's low 48 bits; 1 where they are all 0). */
uint64_t plane_incarnation_of(unsigned gen, uint64_t r);
/* The key of the process with identity id: KDF(run key, id). */
void plane_key_derive(const uint8_t run_key[PLANE_KEY_BYTES], const struct plane_id *id, uint8_t out[PLANE_KEY_BYTES]);
/* Credentials of identity id under the run key. */
void plane_cred_issue(struct plane_cred *c, const uint8_t run_key[PLANE_KEY_BYTES], const struct plane_id *id);

/* Pack a request from the process c (its next counter, given in *counter when not NULL; the version filled in as
 * protocol_pack does). NULL c: packed without authentication. Caller frees. */
uint8_t *plane_pack_request(Grpo__Envelope *env, struct plane_cred *c, size_t *len);
uint8_t *plane_pack_request_n(Grpo__Envelope *env, struct plane_cred *c, uint64_t *counter, size_t *len);
/* Pack the answer to a request from `to` with counter `counter`, under that process's key (derived from the
 * verifier's run key). NULL to: packed without authentication (the request had none). Caller frees. */
uint8_t *plane_pack_answer(Grpo__Envelope *env, const struct plane_verifier *v, const struct plane_id *to,
                           uint64_t counter, size_t *len);

enum plane_verdict {
    PLANE_OK = 0,
    PLANE_REPEAT = 1,   /* the very message last accepted from this identity, again (a socket's resend) */
    PLANE_NONE = -1,    /* no authentication at all */
    PLANE_BAD_MAC = -2, /* the MAC is not the claimed identity's */
    PLANE_REPLAY = -3,  /* a counter this identity has used */
    PLANE_NO_KEY = -4,  /* the receiver has no run key */
    PLANE_EPOCH = -5,   /* a message of another key epoch than the receiver's (another launch's) */
};
/* Check a decoded request against the run key: *who gets the identity it claims (also on failure, when it has
 * one), *counter its counter. A good request's counter is recorded. why says what failed. */
enum plane_verdict plane_verify_request(struct plane_verifier *v, const Grpo__Envelope *env, struct plane_id *who,
                                        uint64_t *counter, char *why, size_t whylen);
/* Check a decoded answer: it must carry c's identity, the request's counter and a MAC under c's key. 0, or -1
 * with why. */
int plane_verify_answer(const struct plane_cred *c, uint64_t counter, const Grpo__Envelope *env, char *why,
                        size_t whylen);
/* The counter of the last message c sent. */
uint64_t plane_cred_last(const struct plane_cred *c);

/* A verifier of the run key of epoch `epoch` (run_key NULL: none, every message refused). */
void plane_verifier_init(struct plane_verifier *v, const uint8_t run_key[PLANE_KEY_BYTES], uint64_t epoch);
void plane_verifier_free(struct plane_verifier *v);
/* Remember the counters of at least n identities (before the first message: every rollout process of the run and
 * the processes that may replace them; a table of 1024 forgot the first of 1,025 live processes, whose captured
 * messages were then taken again, and grew no faster than one scan of it per message). */
void plane_verifier_capacity(struct plane_verifier *v, int n);

/* A fresh random key epoch (never 0): a launch without grpod. */
uint64_t plane_epoch_new(void);
/* Credentials as text, one line: "RANK PID INCARNATION EPOCH KEYHEX" (a test's spare credentials); 0, or -1. */
int plane_cred_format(const struct plane_cred *c, char *out, size_t len);
int plane_cred_parse(const char *text, struct plane_cred *c);

#endif
