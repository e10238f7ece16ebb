/* The weight relay: a rollout process's server of the version it holds, the client that fetches from one, the
 * version's digest and the relays' endpoints (relay.h). */
#include "relay.h"

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <inttypes.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/check.h"
#include "common/log.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "worker/plane/dispatch_core.h"

void relay_digest(const float *w, size_t n, uint8_t out[RELAY_DIGEST_BYTES])
{
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, RELAY_DIGEST_BYTES);
    const unsigned char *p = (const unsigned char *)w;
    size_t left = n * sizeof(float);
    while (left > 0) { /* in pieces: the length argument is an unsigned long long, the buffer may be gigabytes */
        const size_t piece = left < ((size_t)1 << 30) ? left : ((size_t)1 << 30);
        crypto_generichash_update(&st, p, piece);
        p += piece;
        left -= piece;
    }
    crypto_generichash_final(&st, out, RELAY_DIGEST_BYTES);
}

void relay_token(const uint8_t *run_key, uint64_t epoch, int64_t v, uint8_t out[RELAY_TOKEN_BYTES])
{
    uint8_t msg[16 + 8 + 8] = "grpo relay token";
    for (int i = 0; i < 8; i++) { /* little-endian, fixed width */
        msg[16 + i] = (uint8_t)(epoch >> (8 * i));
        msg[24 + i] = (uint8_t)((uint64_t)v >> (8 * i));
    }
    crypto_generichash(out, RELAY_TOKEN_BYTES, msg, sizeof msg, run_key, crypto_generichash_KEYBYTES);
}

int relay_endpoints(const char *dispatch_endpoint, int slot, const char *host, char *bind, char *dial, size_t len,
                    char *err, size_t errlen)
{
    if (strncmp(dispatch_endpoint, "tcp://", 6) == 0) {
        const char *colon = strrchr(dispatch_endpoint, ':');
        const long port = colon ? strtol(colon + 1, NULL, 10) : 0;
        if (port <= 0 || port + 1 + slot > 65535)
            return error_set(err, errlen, "the dispatcher's endpoint %s leaves no port for rollout rank %d's relay",
                             dispatch_endpoint, slot);
        snprintf(bind, len, "tcp://*:%ld", port + 1 + slot);
        snprintf(dial, len, "tcp://%s:%ld", host && host[0] ? host : "127.0.0.1", port + 1 + slot);
        return 0;
    }
    char base[512];
    snprintf(base, sizeof base, "%s", dispatch_endpoint);
    const char *suffix = "-dispatch.sock";
    const size_t bl = strlen(base), sl = strlen(suffix);
    if (bl > sl && strcmp(base + bl - sl, suffix) == 0)
        base[bl - sl] = 0;
    if ((size_t)snprintf(bind, len, "%s-relay-%d.sock", base, slot) >= len || strlen(bind) > 6 + 107)
        return error_set(err, errlen, "rollout rank %d's relay socket %s-relay-%d.sock: the path is too long", slot,
                         base, slot);
    snprintf(dial, len, "%s", bind);
    return 0;
}

/* ---- the server ---- */

struct relay_server {
    int sock;
    pthread_t thread;
    pthread_mutex_t mu;
    bool quit;
    int64_t version; /* held (-1: none) */
    const float *w;
    size_t n;
    uint8_t token[RELAY_TOKEN_BYTES];
    int64_t bytes, refused; /* weight bytes served; requests refused for their token */
    bool corrupt, silent;   /* the tests' hostile relays */
    char endpoint[300];
};

/* Whether the test hook `name` names rollout rank slot ("all": every one). */
static bool test_hook(const char *name, int slot)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return false;
    char *end = NULL;
    const long r = strtol(v, &end, 10);
    return strcmp(v, "all") == 0 || (end != v && !*end && r == slot);
}

/* The answer to one request (packed, malloc'd). */
static uint8_t *serve_one(struct relay_server *s, const uint8_t *msg, size_t n, size_t *len)
{
    char why[256];
    Grpo__Envelope *req = NULL;
    if (protocol_decode(msg, n, GRPO_MAX_DISPATCH_REQUEST_BYTES, &req, why, sizeof why) != PROTOCOL_OK ||
        req->body_case != GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST) {
        const uint64_t id = req ? req->request_id : 0;
        protocol_free(req);
        return protocol_pack_error(id, "a weight relay takes weights requests only", len);
    }
    const Grpo__WeightsRequest *q = req->weights_request;
    Grpo__Envelope out = GRPO__ENVELOPE__INIT;
    Grpo__WeightsChunk ch = GRPO__WEIGHTS_CHUNK__INIT;
    out.request_id = req->request_id;
    out.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK;
    out.weights_chunk = &ch;
    ch.version = q->version;
    ch.offset = q->offset;
    char error[200] = "";
    uint8_t *packed = NULL;
    pthread_mutex_lock(&s->mu); /* held while the chunk is copied into the answer: relay_server_drop waits for it */
    ch.n_floats = s->n;
    if (s->version < 0 || q->version != s->version) {
        snprintf(error, sizeof error, "not held: this relay holds version %lld", (long long)s->version);
    } else if (q->relay_token.len != RELAY_TOKEN_BYTES ||
               sodium_memcmp(q->relay_token.data, s->token, RELAY_TOKEN_BYTES) != 0) {
        snprintf(error, sizeof error, "refused: the request carries no relay token of version %lld",
                 (long long)q->version);
        s->refused++;
    } else if (q->offset > s->n || q->count > DISPATCH_CHUNK_MAX_FLOATS || q->count > s->n - q->offset) {
        snprintf(error, sizeof error, "floats %" PRIu64 "+%" PRIu64 " out of range (%zu parameters)", q->offset,
                 q->count, s->n);
    }
    ch.error = error;
    float *bad = NULL;
    if (!error[0]) {
        ch.data.len = (size_t)q->count * sizeof(float);
        ch.data.data = (uint8_t *)(s->w + q->offset);
        if (s->corrupt && q->count > 0) { /* the tests' hostile relay: one bit of each chunk flipped */
            bad = xmalloc(ch.data.len);
            memcpy(bad, s->w + q->offset, ch.data.len);
            ((uint8_t *)bad)[0] ^= 1;
            ch.data.data = (uint8_t *)bad;
        }
        s->bytes += (int64_t)ch.data.len;
    }
    packed = protocol_pack(&out, len);
    pthread_mutex_unlock(&s->mu);
    free(bad);
    protocol_free(req);
    return packed;
}

static void *serve(void *arg)
{
    struct relay_server *s = arg;
    int to = 100;
    nn_setsockopt(s->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to);
    int sndto = 1000;
    nn_setsockopt(s->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &sndto, sizeof sndto);
    for (;;) {
        pthread_mutex_lock(&s->mu);
        const bool quit = s->quit;
        pthread_mutex_unlock(&s->mu);
        if (quit)
            return NULL;
        void *msg = NULL;
        const int n = nn_recv(s->sock, &msg, NN_MSG, 0);
        if (n < 0)
            continue; /* timed out: look at quit again */
        if (s->silent) {
            nn_freemsg(msg);
            continue;
        }
        size_t len = 0;
        uint8_t *out = serve_one(s, msg, (size_t)n, &len);
        nn_freemsg(msg);
        if (out)
            nn_send(s->sock, out, len, 0);
        free(out);
    }
}

struct relay_server *relay_server_open(const char *bind_endpoint, int slot, char *err, size_t errlen)
{
    /* requests are small: a flood of big frames is dropped unread */
    const int sock =
        endpoint_listen_rep(bind_endpoint, (int)GRPO_MAX_DISPATCH_REQUEST_BYTES, "weight relay", err, errlen);
    if (sock < 0)
        return NULL;
    struct relay_server *s = xcalloc(1, sizeof *s);
    s->sock = sock;
    s->version = -1;
    snprintf(s->endpoint, sizeof s->endpoint, "%s", bind_endpoint);
    s->corrupt = slot >= 0 && test_hook("GRPO_TEST_RELAY_CORRUPT_RANK", slot);
    s->silent = slot >= 0 && test_hook("GRPO_TEST_RELAY_SILENT_RANK", slot);
    if (s->corrupt || s->silent)
        log_warn("relay", "%s: rollout rank %d's relay %s (a test's setting)",
                 s->corrupt ? "GRPO_TEST_RELAY_CORRUPT_RANK" : "GRPO_TEST_RELAY_SILENT_RANK", slot,
                 s->corrupt ? "flips a bit of every chunk it serves" : "never answers");
    pthread_mutex_init(&s->mu, NULL);
    if (pthread_create(&s->thread, NULL, serve, s) != 0) {
        error_set(err, errlen, "weight relay: cannot start its thread");
        pthread_mutex_destroy(&s->mu);
        nn_close(sock);
        free(s);
        return NULL;
    }
    return s;
}

void relay_server_hold(struct relay_server *s, int64_t v, const float *w, size_t n,
                       const uint8_t token[RELAY_TOKEN_BYTES])
{
    pthread_mutex_lock(&s->mu);
    memcpy(s->token, token, RELAY_TOKEN_BYTES);
    s->version = v;
    s->w = w;
    s->n = n;
    pthread_mutex_unlock(&s->mu);
}

void relay_server_drop(struct relay_server *s)
{
    pthread_mutex_lock(&s->mu);
    s->version = -1;
    s->w = NULL;
    pthread_mutex_unlock(&s->mu);
}

int64_t relay_server_bytes(struct relay_server *s)
{
    pthread_mutex_lock(&s->mu);
    const int64_t b = s->bytes;
    pthread_mutex_unlock(&s->mu);
    return b;
}

void relay_server_close(struct relay_server *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->quit = true;
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    nn_close(s->sock);
    if (strncmp(s->endpoint, "ipc://", 6) == 0)
        unlink(s->endpoint + 6);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- the client ---- */

int relay_fetch(const char *endpoint, int64_t v, const uint8_t token[RELAY_TOKEN_BYTES], float *w, size_t n,
                size_t chunk_bytes, int timeout_ms, size_t *bytes, int *chunks, char *err, size_t errlen)
{
    *bytes = 0;
    *chunks = 0;
    struct rpc_client *rpc = rpc_open(endpoint, NULL, err, errlen); /* no key: the digest checks what comes */
    if (!rpc)
        return -1;
    size_t per = chunk_bytes / sizeof(float);
    per = per < 1 ? 1 : per > DISPATCH_CHUNK_MAX_FLOATS ? DISPATCH_CHUNK_MAX_FLOATS : per;
    int rc = 0;
    for (size_t off = 0; off < n && rc == 0;) {
        const size_t cnt = n - off < per ? n - off : per;
        Grpo__Envelope req = GRPO__ENVELOPE__INIT;
        Grpo__WeightsRequest q = GRPO__WEIGHTS_REQUEST__INIT;
        q.version = v;
        q.offset = off;
        q.count = cnt;
        q.relay_token.data = (uint8_t *)token;
        q.relay_token.len = RELAY_TOKEN_BYTES;
        req.body_case = GRPO__ENVELOPE__BODY_WEIGHTS_REQUEST;
        req.weights_request = &q;
        Grpo__Envelope *r = NULL;
        char why[512];
        if (rpc_call(rpc, &req, timeout_ms, &r, why, sizeof why) != RPC_OK) {
            rc = error_set(err, errlen, "the relay at %s: %s", endpoint, why);
        } else if (r->body_case != GRPO__ENVELOPE__BODY_WEIGHTS_CHUNK) {
            rc = error_set(err, errlen, "the relay at %s answered a weights request with something else", endpoint);
        } else if (r->weights_chunk->error && r->weights_chunk->error[0]) {
            rc = strncmp(r->weights_chunk->error, "not held", 8) == 0 ? 1 : -1;
            error_set(err, errlen, "the relay at %s: %s", endpoint, r->weights_chunk->error);
        } else if (r->weights_chunk->n_floats != n || r->weights_chunk->version != v ||
                   r->weights_chunk->offset != off || r->weights_chunk->data.len != cnt * sizeof(float)) {
            rc = error_set(err, errlen, "the relay at %s sent a chunk of the wrong version, offset or size", endpoint);
        } else {
            memcpy(w + off, r->weights_chunk->data.data, cnt * sizeof(float));
            off += cnt;
            *bytes += cnt * sizeof(float);
            ++*chunks;
        }
        protocol_free(r);
    }
    rpc_close(rpc);
    return rc;
}
