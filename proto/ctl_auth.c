#include "proto/ctl_auth.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#define DIR_REQUEST 1
#define DIR_ANSWER 2

/* Labels of the derivations, each 16 bytes: no derivation's input is another's. */
static const uint8_t label_k[16] = "grpo control k 1";
static const uint8_t label_proof[16] = "grpo srv proof 1";
static const uint8_t label_session[16] = "grpo session k 1";

static void need_sodium(void)
{
    if (sodium_init() < 0)
        abort(); /* no randomness: nothing here may go on */
}

static void derive_k(const char *secret, uint8_t k[CTL_KEY_BYTES])
{
    need_sodium();
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, CTL_KEY_BYTES);
    crypto_generichash_update(&st, label_k, sizeof label_k);
    crypto_generichash_update(&st, (const uint8_t *)secret, strlen(secret));
    crypto_generichash_final(&st, k, CTL_KEY_BYTES);
    sodium_memzero(&st, sizeof st);
}

/* Keyed BLAKE2b-256 under K of a label and the session's three values. */
static void derive(const uint8_t k[CTL_KEY_BYTES], const uint8_t label[16], const uint8_t *nc, const uint8_t *ns,
                   const uint8_t *session, uint8_t out[CTL_KEY_BYTES])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, k, CTL_KEY_BYTES, CTL_KEY_BYTES);
    crypto_generichash_update(&st, label, 16);
    crypto_generichash_update(&st, nc, CTL_NONCE_BYTES);
    crypto_generichash_update(&st, ns, CTL_NONCE_BYTES);
    crypto_generichash_update(&st, session, CTL_SESSION_BYTES);
    crypto_generichash_final(&st, out, CTL_KEY_BYTES);
    sodium_memzero(&st, sizeof st);
}

/* A box's nonce: the direction and the counter (a session key is never used twice with one of them). */
static void box_nonce(int dir, uint64_t counter, uint8_t n[crypto_secretbox_NONCEBYTES])
{
    memset(n, 0, crypto_secretbox_NONCEBYTES);
    n[0] = (uint8_t)dir;
    for (int i = 0; i < 8; i++)
        n[1 + i] = (uint8_t)(counter >> (8 * i));
}

/* Seal plain into an outer envelope {request_id, sealed{session, counter, box}}, packed. */
static uint8_t *pack_sealed(const uint8_t session[CTL_SESSION_BYTES], const uint8_t skey[CTL_KEY_BYTES], int dir,
                            uint64_t counter, uint64_t request_id, const uint8_t *plain, size_t plen, size_t *len)
{
    uint8_t nonce[crypto_secretbox_NONCEBYTES];
    box_nonce(dir, counter, nonce);
    uint8_t *box = malloc(plen + crypto_secretbox_MACBYTES);
    if (!box)
        return NULL;
    crypto_secretbox_easy(box, plain, plen, nonce, skey);
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__Sealed s = GRPO__SEALED__INIT;
    s.session.data = (uint8_t *)session;
    s.session.len = CTL_SESSION_BYTES;
    s.counter = counter;
    s.box.data = box;
    s.box.len = plen + crypto_secretbox_MACBYTES;
    env.request_id = request_id;
    env.body_case = GRPO__ENVELOPE__BODY_SEALED;
    env.sealed = &s;
    uint8_t *out = protocol_pack(&env, len);
    free(box);
    return out;
}

/* Open a box of direction dir and counter under skey: the plain bytes (malloc'd), or NULL. */
static uint8_t *open_box(const ProtobufCBinaryData *box, int dir, uint64_t counter, const uint8_t skey[CTL_KEY_BYTES],
                         size_t *plen)
{
    if (box->len < crypto_secretbox_MACBYTES)
        return NULL;
    uint8_t nonce[crypto_secretbox_NONCEBYTES];
    box_nonce(dir, counter, nonce);
    *plen = box->len - crypto_secretbox_MACBYTES;
    uint8_t *plain = malloc(*plen ? *plen : 1);
    if (!plain)
        return NULL;
    if (crypto_secretbox_open_easy(plain, box->data, box->len, nonce, skey) != 0) {
        free(plain);
        return NULL;
    }
    return plain;
}

void ctl_wipe_free(uint8_t *p, size_t n)
{
    if (!p)
        return;
    sodium_memzero(p, n);
    free(p);
}

/* ---- the client ---- */

void ctl_client_init(struct ctl_client *c, const char *secret)
{
    memset(c, 0, sizeof *c);
    derive_k(secret, c->k);
}

void ctl_client_reset(struct ctl_client *c)
{
    sodium_memzero(c->skey, sizeof c->skey);
    c->open = c->hello_sent = false;
    c->counter = 0;
}

void ctl_client_wipe(struct ctl_client *c) { sodium_memzero(c, sizeof *c); }

uint8_t *ctl_client_hello(struct ctl_client *c, uint64_t request_id, size_t *len)
{
    need_sodium();
    ctl_client_reset(c);
    randombytes_buf(c->nc, sizeof c->nc);
    c->hello_sent = true;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__AuthHello h = GRPO__AUTH_HELLO__INIT;
    h.client_nonce.data = c->nc;
    h.client_nonce.len = sizeof c->nc;
    env.request_id = request_id;
    env.body_case = GRPO__ENVELOPE__BODY_AUTH_HELLO;
    env.auth_hello = &h;
    return protocol_pack(&env, len);
}

int ctl_client_accept(struct ctl_client *c, const Grpo__Envelope *answer, char *why, size_t whylen)
{
    if (!c->hello_sent) {
        snprintf(why, whylen, "a challenge to no hello");
        return -1;
    }
    if (answer->body_case != GRPO__ENVELOPE__BODY_AUTH_CHALLENGE) {
        snprintf(why, whylen, "grpod answered the authentication's hello with a %s, not a challenge",
                 protocol_body_name(answer->body_case));
        return -1;
    }
    const Grpo__AuthChallenge *ch = answer->auth_challenge;
    if (ch->server_nonce.len != CTL_NONCE_BYTES || ch->session.len != CTL_SESSION_BYTES ||
        ch->proof.len != CTL_KEY_BYTES) {
        snprintf(why, whylen, "a malformed challenge (nonce %zu, session %zu, proof %zu bytes)", ch->server_nonce.len,
                 ch->session.len, ch->proof.len);
        return -1;
    }
    uint8_t proof[CTL_KEY_BYTES];
    derive(c->k, label_proof, c->nc, ch->server_nonce.data, ch->session.data, proof);
    const bool good = sodium_memcmp(proof, ch->proof.data, sizeof proof) == 0;
    sodium_memzero(proof, sizeof proof);
    if (!good) {
        snprintf(why, whylen,
                 "authentication failed: grpod's proof does not match this shared secret (grpod holds another "
                 "secret, or something else answers at this endpoint)");
        return -1;
    }
    derive(c->k, label_session, c->nc, ch->server_nonce.data, ch->session.data, c->skey);
    memcpy(c->session, ch->session.data, sizeof c->session);
    c->counter = 0;
    c->open = true;
    c->hello_sent = false;
    return 0;
}

uint8_t *ctl_client_seal(struct ctl_client *c, Grpo__Envelope *req, uint64_t *counter, size_t *len)
{
    size_t plen;
    uint8_t *plain = protocol_pack(req, &plen);
    if (!plain)
        return NULL;
    *counter = ++c->counter;
    uint8_t *out = pack_sealed(c->session, c->skey, DIR_REQUEST, *counter, req->request_id, plain, plen, len);
    ctl_wipe_free(plain, plen);
    return out;
}

int ctl_client_open(const struct ctl_client *c, uint64_t counter, const Grpo__Envelope *outer, Grpo__Envelope **inner,
                    char *why, size_t whylen)
{
    *inner = NULL;
    if (outer->body_case != GRPO__ENVELOPE__BODY_SEALED) {
        snprintf(why, whylen, "an answer that is not sealed (a %s)", protocol_body_name(outer->body_case));
        return -1;
    }
    const Grpo__Sealed *s = outer->sealed;
    if (s->session.len != CTL_SESSION_BYTES || memcmp(s->session.data, c->session, CTL_SESSION_BYTES) != 0 ||
        s->counter != counter) {
        snprintf(why, whylen, "a sealed answer of another session or request (counter %" PRIu64 ", sent %" PRIu64 ")",
                 s->counter, counter);
        return -1;
    }
    size_t plen = 0;
    uint8_t *plain = open_box(&s->box, DIR_ANSWER, counter, c->skey, &plen);
    if (!plain) {
        snprintf(why, whylen, "a sealed answer that does not open under the session's key (forged or damaged)");
        return -1;
    }
    char w[256];
    enum protocol_error pe = protocol_decode(plain, plen, GRPO_MAX_MESSAGE_BYTES, inner, w, sizeof w);
    ctl_wipe_free(plain, plen);
    if (pe != PROTOCOL_OK) {
        snprintf(why, whylen, "the sealed answer: %s", w);
        protocol_free(*inner);
        *inner = NULL;
        return -1;
    }
    return 0;
}

/* ---- grpod ---- */

struct ctl_sess {
    uint8_t id[CTL_SESSION_BYTES];
    uint8_t skey[CTL_KEY_BYTES];
    uint64_t top; /* the highest counter taken (0: none yet: challenged, not used) */
    double since; /* challenged (pending) or last used */
    bool live;
};

struct ctl_server {
    uint8_t k[CTL_KEY_BYTES];
    struct ctl_sess s[CTL_SESSIONS_MAX];
};

struct ctl_server *ctl_server_new(const char *secret)
{
    struct ctl_server *s = sodium_malloc(sizeof *s);
    if (!s)
        abort();
    memset(s, 0, sizeof *s);
    derive_k(secret, s->k);
    return s;
}

void ctl_server_free(struct ctl_server *s)
{
    if (s)
        sodium_free(s); /* wiped on the way */
}

bool ctl_server_keyed(const struct ctl_server *s, const char *secret)
{
    uint8_t k[CTL_KEY_BYTES];
    derive_k(secret, k);
    const bool same = sodium_memcmp(k, s->k, sizeof k) == 0;
    sodium_memzero(k, sizeof k);
    return same;
}

static void forget(struct ctl_sess *x) { sodium_memzero(x, sizeof *x); }

/* A slot for a new challenged session: a free one, else the oldest challenged one when those are at their cap, else
 * the least recently used. Challenges past CTL_PENDING_S are forgotten first. */
static struct ctl_sess *slot_for(struct ctl_server *s, double now)
{
    struct ctl_sess *free_slot = NULL, *oldest_pending = NULL, *lru = NULL;
    int pending = 0;
    for (int i = 0; i < CTL_SESSIONS_MAX; i++) {
        struct ctl_sess *x = &s->s[i];
        if (x->live && !x->top && now - x->since > CTL_PENDING_S)
            forget(x);
        if (!x->live) {
            if (!free_slot)
                free_slot = x;
            continue;
        }
        if (!x->top) {
            pending++;
            if (!oldest_pending || x->since < oldest_pending->since)
                oldest_pending = x;
        }
        if (!lru || x->since < lru->since)
            lru = x;
    }
    if (pending >= CTL_PENDING_MAX)
        return oldest_pending;
    return free_slot ? free_slot : lru;
}

uint8_t *ctl_server_challenge(struct ctl_server *s, const Grpo__Envelope *hello, double now, size_t *len, char *why,
                              size_t whylen)
{
    const Grpo__AuthHello *h = hello->auth_hello;
    if (hello->body_case != GRPO__ENVELOPE__BODY_AUTH_HELLO || h->client_nonce.len != CTL_NONCE_BYTES) {
        snprintf(why, whylen, "a hello needs a client nonce of %d bytes (got %zu)", CTL_NONCE_BYTES,
                 hello->body_case == GRPO__ENVELOPE__BODY_AUTH_HELLO ? h->client_nonce.len : (size_t)0);
        return NULL;
    }
    need_sodium();
    struct ctl_sess *x = slot_for(s, now);
    forget(x);
    uint8_t ns[CTL_NONCE_BYTES], proof[CTL_KEY_BYTES];
    randombytes_buf(ns, sizeof ns);
    randombytes_buf(x->id, sizeof x->id);
    derive(s->k, label_session, h->client_nonce.data, ns, x->id, x->skey);
    derive(s->k, label_proof, h->client_nonce.data, ns, x->id, proof);
    x->live = true;
    x->since = now;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    Grpo__AuthChallenge ch = GRPO__AUTH_CHALLENGE__INIT;
    ch.server_nonce.data = ns;
    ch.server_nonce.len = sizeof ns;
    ch.session.data = x->id;
    ch.session.len = sizeof x->id;
    ch.proof.data = proof;
    ch.proof.len = sizeof proof;
    env.request_id = hello->request_id;
    env.body_case = GRPO__ENVELOPE__BODY_AUTH_CHALLENGE;
    env.auth_challenge = &ch;
    return protocol_pack(&env, len);
}

enum ctl_verdict ctl_server_open(struct ctl_server *s, const Grpo__Sealed *sealed, double now, uint8_t **plain,
                                 size_t *plen, struct ctl_ticket *t, char *why, size_t whylen)
{
    *plain = NULL;
    *plen = 0;
    memset(t, 0, sizeof *t);
    if (sealed->session.len != CTL_SESSION_BYTES || sealed->counter == 0) {
        snprintf(why, whylen, "a malformed sealed request (session of %zu bytes, counter %" PRIu64 ")",
                 sealed->session.len, sealed->counter);
        return CTL_BAD;
    }
    struct ctl_sess *x = NULL;
    for (int i = 0; i < CTL_SESSIONS_MAX && !x; i++)
        if (s->s[i].live && memcmp(s->s[i].id, sealed->session.data, CTL_SESSION_BYTES) == 0)
            x = &s->s[i];
    if (!x) {
        snprintf(why, whylen,
                 "a sealed request of a session grpod does not know (it restarted, or forgot the session)");
        return CTL_UNKNOWN;
    }
    uint8_t *p = open_box(&sealed->box, DIR_REQUEST, sealed->counter, x->skey, plen);
    if (!p) {
        snprintf(why, whylen, "authentication failed: a sealed request that does not open under its session's key");
        return CTL_BAD;
    }
    if (sealed->counter <= x->top) {
        ctl_wipe_free(p, *plen);
        *plen = 0;
        snprintf(why, whylen,
                 "a replayed request: its session used counter %" PRIu64 " already (the newest is %" PRIu64 ")",
                 sealed->counter, x->top);
        return CTL_REPLAY;
    }
    x->top = sealed->counter;
    x->since = now;
    memcpy(t->session, x->id, sizeof t->session);
    memcpy(t->skey, x->skey, sizeof t->skey);
    t->counter = sealed->counter;
    *plain = p;
    return CTL_OK;
}

uint8_t *ctl_server_seal(struct ctl_ticket *t, uint64_t request_id, const uint8_t *plain, size_t plen, size_t *len)
{
    uint8_t *out = pack_sealed(t->session, t->skey, DIR_ANSWER, t->counter, request_id, plain, plen, len);
    sodium_memzero(t, sizeof *t);
    return out;
}

void ctl_server_counts(const struct ctl_server *s, int *sessions, int *pending)
{
    *sessions = *pending = 0;
    for (int i = 0; i < CTL_SESSIONS_MAX; i++)
        if (s->s[i].live) {
            ++*sessions;
            *pending += !s->s[i].top;
        }
}
