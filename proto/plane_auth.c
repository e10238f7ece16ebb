#include "proto/plane_auth.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

int plane_init(void) { return sodium_init() < 0 ? -1 : 0; }

void plane_run_key_new(uint8_t key[PLANE_KEY_BYTES])
{
    if (plane_init() != 0)
        abort(); /* no randomness: nothing here may go on */
    randombytes_buf(key, PLANE_KEY_BYTES);
}

uint64_t plane_random64(void)
{
    if (plane_init() != 0)
        abort();
    uint64_t x = 0;
    while (!x)
        randombytes_buf(&x, sizeof x);
    return x;
}

uint64_t plane_incarnation_of(unsigned gen, uint64_t r)
{
    const uint64_t low = r & ((1ull << PLANE_GENERATION_SHIFT) - 1);
    return (uint64_t)(uint16_t)gen << PLANE_GENERATION_SHIFT | (low ? low : 1);
}

uint64_t plane_incarnation_new(unsigned gen) { return plane_incarnation_of(gen, plane_random64()); }

static void put_le(uint8_t *p, uint64_t x, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(x >> (8 * i));
}

uint64_t plane_epoch_new(void) { return plane_random64(); }

void plane_key_derive(const uint8_t run_key[PLANE_KEY_BYTES], const struct plane_id *id, uint8_t out[PLANE_KEY_BYTES])
{
    /* keyed BLAKE2b of a fixed label and the identity, in fixed-width little-endian fields (label 2: the epoch is
     * part of the identity since protocol 1.12) */
    uint8_t msg[16 + 4 + 4 + 8 + 8] = "grpo plane key 2";
    put_le(msg + 16, (uint32_t)id->rank, 4);
    put_le(msg + 20, id->pid, 4);
    put_le(msg + 24, id->incarnation, 8);
    put_le(msg + 32, id->epoch, 8);
    crypto_generichash(out, PLANE_KEY_BYTES, msg, sizeof msg, run_key, PLANE_KEY_BYTES);
}

void plane_cred_issue(struct plane_cred *c, const uint8_t run_key[PLANE_KEY_BYTES], const struct plane_id *id)
{
    memset(c, 0, sizeof *c);
    c->id = *id;
    plane_key_derive(run_key, id, c->key);
    c->set = true;
}

/* The MAC of env (its auth set, the MAC field empty while packed) under key. */
static void envelope_mac(Grpo__Envelope *env, const uint8_t key[PLANE_KEY_BYTES], uint8_t out[PLANE_MAC_BYTES])
{
    ProtobufCBinaryData keep = env->auth->mac;
    env->auth->mac.data = NULL;
    env->auth->mac.len = 0;
    size_t n = grpo__envelope__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        abort();
    grpo__envelope__pack(env, buf);
    /* keyed BLAKE2b-256: a MAC (libsodium documents keyed generichash as one), faster than HMAC-SHA-512 over a
     * batch or a weights chunk of many MiB (383 against 146 MB/s measured here) */
    crypto_generichash(out, PLANE_MAC_BYTES, buf, n, key, PLANE_KEY_BYTES);
    free(buf);
    env->auth->mac = keep;
}

static uint8_t *pack_sealed(Grpo__Envelope *env, Grpo__PlaneAuth *a, const uint8_t key[PLANE_KEY_BYTES], size_t *len)
{
    uint8_t mac[PLANE_MAC_BYTES];
    env->version = GRPO_PROTOCOL_VERSION;
    env->minor_version = GRPO_PROTOCOL_MINOR;
    env->auth = a;
    envelope_mac(env, key, mac);
    a->mac.data = mac;
    a->mac.len = sizeof mac;
    uint8_t *out = protocol_pack(env, len);
    env->auth = NULL;
    return out;
}

uint8_t *plane_pack_request(Grpo__Envelope *env, struct plane_cred *c, size_t *len)
{
    return plane_pack_request_n(env, c, NULL, len);
}

uint8_t *plane_pack_request_n(Grpo__Envelope *env, struct plane_cred *c, uint64_t *counter, size_t *len)
{
    if (counter)
        *counter = 0;
    if (!c || !c->set)
        return protocol_pack(env, len);
    Grpo__PlaneAuth a = GRPO__PLANE_AUTH__INIT;
    a.rank = c->id.rank;
    a.pid = c->id.pid;
    a.incarnation = c->id.incarnation;
    a.epoch = c->id.epoch;
    a.counter = __atomic_add_fetch(&c->counter, 1, __ATOMIC_SEQ_CST);
    if (counter)
        *counter = a.counter;
    return pack_sealed(env, &a, c->key, len);
}

uint8_t *plane_pack_answer(Grpo__Envelope *env, const struct plane_verifier *v, const struct plane_id *to,
                           uint64_t counter, size_t *len)
{
    if (!to || !v || !v->set)
        return protocol_pack(env, len);
    uint8_t key[PLANE_KEY_BYTES];
    plane_key_derive(v->run_key, to, key);
    Grpo__PlaneAuth a = GRPO__PLANE_AUTH__INIT;
    a.rank = to->rank;
    a.pid = to->pid;
    a.incarnation = to->incarnation;
    a.epoch = to->epoch;
    a.counter = counter;
    a.reply = 1;
    uint8_t *out = pack_sealed(env, &a, key, len);
    sodium_memzero(key, sizeof key);
    return out;
}

uint64_t plane_cred_last(const struct plane_cred *c) { return __atomic_load_n(&c->counter, __ATOMIC_SEQ_CST); }

/* Whether env's MAC is the one key gives. */
static bool mac_good(const Grpo__Envelope *env, const uint8_t key[PLANE_KEY_BYTES])
{
    if (env->auth->mac.len != PLANE_MAC_BYTES)
        return false;
    uint8_t mac[PLANE_MAC_BYTES];
    envelope_mac((Grpo__Envelope *)env, key, mac); /* packs it with the MAC empty, then puts it back */
    return sodium_memcmp(mac, env->auth->mac.data, PLANE_MAC_BYTES) == 0;
}

static bool same_id(const struct plane_id *a, const struct plane_id *b)
{
    return a->rank == b->rank && a->pid == b->pid && a->incarnation == b->incarnation && a->epoch == b->epoch;
}

static struct plane_seen *seen_of(struct plane_verifier *v, const struct plane_id *id)
{
    const int cap = v->cap > 0 ? v->cap : PLANE_SEEN_MAX;
    if (!v->seen)
        v->seen = calloc((size_t)cap, sizeof *v->seen);
    if (!v->seen)
        abort();
    for (int i = 0; i < v->nseen; i++)
        if (same_id(&v->seen[i].id, id))
            return &v->seen[i];
    int i = v->nseen;
    if (i == cap) { /* forget the identity heard from least recently */
        i = 0;
        for (int j = 1; j < v->nseen; j++)
            if (v->seen[j].used < v->seen[i].used)
                i = j;
    } else {
        v->nseen++;
    }
    memset(&v->seen[i], 0, sizeof v->seen[i]);
    v->seen[i].id = *id;
    return &v->seen[i];
}

enum plane_verdict plane_verify_request(struct plane_verifier *v, const Grpo__Envelope *env, struct plane_id *who,
                                        uint64_t *counter, char *why, size_t whylen)
{
    *counter = 0;
    memset(who, 0, sizeof *who);
    if (!v || !v->set) {
        snprintf(why, whylen, "this receiver has no data-plane key");
        return PLANE_NO_KEY;
    }
    if (!env->auth) {
        if (env->minor_version < 8)
            snprintf(why, whylen,
                     "the message carries no authentication (protocol 1.8 authenticates every data-plane and "
                     "dispatcher message with the sending process's key; the sender speaks 1.%u: upgrade the older "
                     "side)",
                     env->minor_version);
        else
            snprintf(why, whylen,
                     "the message carries no authentication (every data-plane and dispatcher message must carry a "
                     "MAC under the sending process's key)");
        return PLANE_NONE;
    }
    const Grpo__PlaneAuth *a = env->auth;
    who->rank = a->rank;
    who->pid = a->pid;
    who->incarnation = a->incarnation;
    who->epoch = a->epoch;
    *counter = a->counter;
    if (a->epoch != v->epoch) { /* another launch's key: refused on its face, no MAC computed over it */
        if (!a->epoch)
            snprintf(why, whylen,
                     "a message of no key epoch (a sender of protocol 1.%u: since 1.12 every key belongs to its "
                     "launch's epoch; upgrade the older side)",
                     env->minor_version);
        else
            snprintf(why, whylen,
                     "a message of key epoch %" PRIu64 ", not this launch's (%" PRIu64
                     "): another launch's keys are dead (a replay across a relaunch?)",
                     a->epoch, v->epoch);
        return PLANE_EPOCH;
    }
    if (a->reply || a->counter == 0) {
        snprintf(why, whylen, "authentication failed: %s", a->reply ? "an answer sent as a request" : "counter 0");
        return PLANE_BAD_MAC;
    }
    uint8_t key[PLANE_KEY_BYTES];
    plane_key_derive(v->run_key, who, key);
    v->macs++;
    v->mac_bytes += grpo__envelope__get_packed_size(env);
    bool good = mac_good(env, key);
    sodium_memzero(key, sizeof key);
    if (!good) {
        snprintf(why, whylen,
                 "authentication failed: the MAC is not that of rank %d (pid %u, incarnation %016" PRIx64 ")'s key",
                 who->rank, who->pid, who->incarnation);
        return PLANE_BAD_MAC;
    }
    struct plane_seen *s = seen_of(v, who);
    s->used = ++v->clock;
    const uint64_t c = a->counter;
    if (c > s->top) {
        const uint64_t d = c - s->top;
        if (s->top == 0 || d > 64) /* nothing seen yet, or every counter seen falls out of the window */
            s->window = 0;
        else
            s->window = (d == 64 ? 0 : s->window << d) | (1ull << (d - 1));
        s->top = c;
        memcpy(s->last, a->mac.data, PLANE_MAC_BYTES);
        return PLANE_OK;
    }
    if (c == s->top && sodium_memcmp(s->last, a->mac.data, PLANE_MAC_BYTES) == 0) {
        snprintf(why, whylen, "the last message of rank %d again (counter %" PRIu64 ")", who->rank, c);
        return PLANE_REPEAT;
    }
    const uint64_t i = s->top - 1 - c;
    if (c == s->top || i >= 64 || (s->window >> i) & 1) {
        snprintf(why, whylen,
                 "a replayed message: rank %d (pid %u) used counter %" PRIu64 " already (its newest is %" PRIu64 ")",
                 who->rank, who->pid, c, s->top);
        return PLANE_REPLAY;
    }
    s->window |= 1ull << i; /* an older counter not seen yet: messages of two threads may cross */
    return PLANE_OK;
}

int plane_verify_answer(const struct plane_cred *c, uint64_t counter, const Grpo__Envelope *env, char *why,
                        size_t whylen)
{
    const Grpo__PlaneAuth *a = env->auth;
    if (!a) {
        snprintf(why, whylen, "the answer carries no authentication");
        return -1;
    }
    if (!a->reply || a->rank != c->id.rank || a->pid != c->id.pid || a->incarnation != c->id.incarnation ||
        a->epoch != c->id.epoch || a->counter != counter) {
        snprintf(why, whylen, "the answer is not to this request (it names rank %d, counter %" PRIu64 ")", a->rank,
                 a->counter);
        return -1;
    }
    if (!mac_good(env, c->key)) {
        snprintf(why, whylen, "the answer's authentication failed (not from a holder of the run's key)");
        return -1;
    }
    return 0;
}

void plane_verifier_init(struct plane_verifier *v, const uint8_t run_key[PLANE_KEY_BYTES], uint64_t epoch)
{
    memset(v, 0, sizeof *v);
    if (run_key) {
        memcpy(v->run_key, run_key, PLANE_KEY_BYTES);
        v->epoch = epoch;
        v->set = true;
    }
}

void plane_verifier_capacity(struct plane_verifier *v, int n)
{
    if (v->seen || n <= PLANE_SEEN_MAX) /* sized before the first message only; never below the default */
        return;
    v->cap = n;
}

void plane_verifier_free(struct plane_verifier *v)
{
    free(v->seen);
    sodium_memzero(v, sizeof *v);
}

int plane_cred_format(const struct plane_cred *c, char *out, size_t len)
{
    char hex[2 * PLANE_KEY_BYTES + 1];
    sodium_bin2hex(hex, sizeof hex, c->key, PLANE_KEY_BYTES);
    int n = snprintf(out, len, "%d %u %016" PRIx64 " %016" PRIx64 " %s\n", c->id.rank, c->id.pid, c->id.incarnation,
                     c->id.epoch, hex);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

int plane_cred_parse(const char *text, struct plane_cred *c)
{
    memset(c, 0, sizeof *c);
    char *end;
    const long rank = strtol(text, &end, 10);
    const unsigned long pid = strtoul(end, &end, 10);
    const unsigned long long inc = strtoull(end, &end, 16);
    const unsigned long long epoch = strtoull(end, &end, 16);
    while (*end == ' ')
        end++;
    char hex[2 * PLANE_KEY_BYTES + 2];
    size_t n = strcspn(end, " \n");
    if (rank < 0 || rank > INT32_MAX || pid > UINT32_MAX || n != 2 * PLANE_KEY_BYTES)
        return -1;
    memcpy(hex, end, n);
    hex[n] = 0;
    size_t got = 0;
    if (sodium_hex2bin(c->key, PLANE_KEY_BYTES, hex, strlen(hex), NULL, &got, NULL) != 0 || got != PLANE_KEY_BYTES)
        return -1;
    c->id = (struct plane_id){.rank = (int32_t)rank, .pid = (uint32_t)pid, .incarnation = inc, .epoch = epoch};
    c->set = true;
    return 0;
}
