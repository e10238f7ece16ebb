#include "proto/transport.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>

#include "common/backoff.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/fs.h"
#include "proto/ctl_auth.h"
#include "proto/plane_auth.h"

struct rpc_client {
    int sock;
    char endpoint[512];
    struct ctl_client *ctl; /* tcp:// to grpod: the session (the secret itself is not kept); NULL: none */
    uint64_t next_id;
    struct plane_cred *plane; /* NULL: no data-plane authentication */
    char **also;              /* endpoints connected besides (rpc_connect_also), n_also of them */
    int n_also;
};

void rpc_set_plane(struct rpc_client *c, struct plane_cred *cred) { c->plane = cred; }

/* strerror() text with a lower-case first letter, as it reads inside a sentence. */
static void errno_text(int e, char *out, size_t len)
{
    snprintf(out, len, "%s", strerror(e));
    if (out[0] && isupper((unsigned char)out[0]) && !(out[1] && isupper((unsigned char)out[1])))
        out[0] = (char)tolower((unsigned char)out[0]);
}

int endpoint_parse(const char *endpoint, enum endpoint_kind *kind, char *path, size_t pathlen, char *err, size_t errlen)
{
    if (!endpoint || !endpoint[0]) {
        snprintf(err, errlen, "empty endpoint (use ipc://PATH or tcp://HOST:PORT)");
        return -1;
    }
    if (strncmp(endpoint, "ipc://", 6) == 0) {
        const char *p = endpoint + 6;
        if (!p[0]) {
            snprintf(err, errlen, "endpoint '%s' has no socket path", endpoint);
            return -1;
        }
        if (strlen(p) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
            snprintf(err, errlen, "socket path of '%s' is longer than the %zu bytes a Unix socket allows", endpoint,
                     sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
            return -1;
        }
        *kind = ENDPOINT_IPC;
        if (path)
            snprintf(path, pathlen, "%s", p);
        return 0;
    }
    if (strncmp(endpoint, "tcp://", 6) == 0) {
        const char *colon = strrchr(endpoint + 6, ':');
        char *end = NULL;
        long port = colon ? strtol(colon + 1, &end, 10) : -1;
        if (!colon || colon == endpoint + 6 || !end || *end || end == colon + 1 || port < 0 || port > 65535) {
            snprintf(err, errlen, "endpoint '%s' needs a host and a port: tcp://HOST:PORT", endpoint);
            return -1;
        }
        *kind = ENDPOINT_TCP;
        if (path && pathlen)
            path[0] = 0;
        return 0;
    }
    snprintf(err, errlen, "unsupported endpoint '%s' (use ipc://PATH or tcp://HOST:PORT)", endpoint);
    return -1;
}

static int probe_ipc(const char *path, char *why, size_t whylen)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        errno_text(errno, why, whylen);
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t l = strlen(path);
    if (l >= sizeof sa.sun_path) { /* endpoint_parse refuses these; be safe anyway */
        close(fd);
        snprintf(why, whylen, "socket path too long");
        return -1;
    }
    memcpy(sa.sun_path, path, l + 1);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    close(fd);
    if (rc != 0) {
        errno_text(e, why, whylen);
        return -1;
    }
    return 0;
}

static int probe_tcp(const char *endpoint, char *why, size_t whylen)
{
    char host[256], port[16];
    const char *hp = endpoint + 6, *colon = strrchr(hp, ':');
    size_t hl = (size_t)(colon - hp);
    if (hl >= sizeof host)
        hl = sizeof host - 1;
    memcpy(host, hp, hl);
    host[hl] = 0;
    snprintf(port, sizeof port, "%s", colon + 1);
    if (host[0] == '[' && hl > 1 && host[hl - 1] == ']') { /* [::1] */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    if (strcmp(host, "*") == 0)
        snprintf(host, sizeof host, "127.0.0.1");
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(host, port, &hints, &res);
    if (g != 0) {
        snprintf(why, whylen, "cannot resolve host '%s': %s", host, gai_strerror(g));
        return -1;
    }
    int rc = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0)
            continue;
        int e = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            e = errno;
            if (e == EINPROGRESS) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                if (poll(&pfd, 1, 1000) == 1) {
                    socklen_t sl = sizeof e;
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl);
                } else {
                    e = ETIMEDOUT;
                }
            }
        }
        close(fd);
        if (e == 0) {
            rc = 0;
            break;
        }
        errno_text(e, why, whylen);
    }
    freeaddrinfo(res);
    return rc;
}

int endpoint_probe(const char *endpoint, char *why, size_t whylen)
{
    enum endpoint_kind kind;
    char path[512];
    if (endpoint_parse(endpoint, &kind, path, sizeof path, why, whylen) != 0)
        return -1;
    return kind == ENDPOINT_IPC ? probe_ipc(path, why, whylen) : probe_tcp(endpoint, why, whylen);
}

int endpoint_prepare_bind(const char *endpoint, char *err, size_t errlen)
{
    enum endpoint_kind kind;
    char path[512], why[256];
    if (endpoint_parse(endpoint, &kind, path, sizeof path, err, errlen) != 0)
        return -1;
    if (kind != ENDPOINT_IPC)
        return 0;
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0;
        errno_text(errno, why, sizeof why);
        snprintf(err, errlen, "cannot use %s as a socket: %s", path, why);
        return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "%s exists and is %s, not a socket: left alone (move it away or choose another path)",
                 path, fs_kind(st.st_mode));
        return -1;
    }
    if (probe_ipc(path, why, sizeof why) == 0) {
        snprintf(err, errlen, "socket %s is in use: something answers on it", path);
        return -1;
    }
    if (strcmp(why, "connection refused") != 0) {
        snprintf(err, errlen, "socket %s exists and cannot be checked (%s): left alone", path, why);
        return -1;
    }
    if (unlink(path) != 0 && errno != ENOENT) { /* stale: nobody listens any more */
        errno_text(errno, why, sizeof why);
        snprintf(err, errlen, "cannot remove the stale socket %s: %s", path, why);
        return -1;
    }
    return 0;
}

int endpoint_bind(int sock, const char *endpoint, unsigned mode, char *err, size_t errlen)
{
    enum endpoint_kind kind;
    char path[512] = "";
    if (endpoint_parse(endpoint, &kind, path, sizeof path, err, errlen) != 0)
        return -1;
    if (endpoint_prepare_bind(endpoint, err, errlen) != 0)
        return -1;
    const mode_t old = kind == ENDPOINT_IPC ? umask((mode_t)(~mode & 0777)) : 0;
    const int rc = nn_bind(sock, endpoint), e = nn_errno();
    if (kind == ENDPOINT_IPC)
        umask(old);
    if (rc < 0) {
        snprintf(err, errlen, "%s%s", nn_strerror(e), e == EADDRINUSE ? " (another process listens there?)" : "");
        return -1;
    }
    if (kind != ENDPOINT_IPC)
        return 0;
    /* nanomsg may create the file a moment after nn_bind returns */
    for (int tries = 0; chmod(path, (mode_t)mode) != 0 && errno == ENOENT && tries < 100; tries++)
        clock_sleep_s(0.01);
    struct stat st;
    if (lstat(path, &st) != 0 || (st.st_mode & 0777) != (mode_t)mode) {
        snprintf(err, errlen, "cannot set mode %04o on %s: %s", mode, path, strerror(errno));
        unlink(path); /* the socket just made: nobody was to reach it with another mode */
        return -1;
    }
    return 0;
}

int endpoint_listen_rep(const char *endpoint, int max_bytes, const char *who, char *err, size_t errlen)
{
    const int sock = nn_socket(AF_SP, NN_REP);
    if (sock < 0) {
        snprintf(err, errlen, "%s: nn_socket(REP): %s", who, nn_strerror(nn_errno()));
        return -1;
    }
    nn_setsockopt(sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max_bytes, sizeof max_bytes);
    char why[600];
    if (endpoint_bind(sock, endpoint, 0600, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: cannot bind %s: %s", who, endpoint, why);
        nn_close(sock);
        return -1;
    }
    return sock;
}

int secret_read(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    char why[256];
    int fd = fs_open_read(path, why, sizeof why); /* a FIFO or a device is refused, not waited on */
    if (fd < 0) {
        snprintf(err, errlen, "cannot open secret file %s: %s", path, why);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot stat secret file %s", path);
        close(fd);
        return -1;
    }
    if (st.st_mode & 077) {
        snprintf(err, errlen, "secret file %s may be read by group or others (mode %04o); run: chmod 600 %s", path,
                 (unsigned)(st.st_mode & 07777), path);
        close(fd);
        return -1;
    }
    if (st.st_mode & 07100) { /* 0600 or stricter: no execute, set-id or sticky bit either */
        snprintf(err, errlen,
                 "secret file %s has mode %04o: it must be 0600 or stricter (read and write for its owner only); run: "
                 "chmod 600 %s",
                 path, (unsigned)(st.st_mode & 07777), path);
        close(fd);
        return -1;
    }
    if (st.st_uid != geteuid()) { /* another user (root aside, the file's owner) could change it under us */
        snprintf(err, errlen,
                 "secret file %s belongs to uid %u, not to this process's user (uid %u): only a file of one's own is "
                 "taken; run: chown %u %s",
                 path, (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)geteuid(), path);
        close(fd);
        return -1;
    }
    char buf[GRPO_SECRET_MAX + 2];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) {
        snprintf(err, errlen, "cannot read secret file %s", path);
        return -1;
    }
    buf[n] = 0;
    char *nl = memchr(buf, '\n', (size_t)n);
    if (memchr(buf, 0, nl ? (size_t)(nl - buf) : (size_t)n)) {
        snprintf(err, errlen, "secret in %s contains a NUL byte (use one line of printable text)", path);
        return -1;
    }
    if (nl)
        *nl = 0;
    else if ((size_t)n > GRPO_SECRET_MAX) {
        snprintf(err, errlen, "secret in %s is longer than %d bytes", path, GRPO_SECRET_MAX);
        return -1;
    }
    char *s = buf;
    while (*s && isspace((unsigned char)*s))
        s++;
    size_t l = strlen(s);
    while (l && isspace((unsigned char)s[l - 1]))
        s[--l] = 0;
    if (!l) {
        snprintf(err, errlen, "secret file %s is empty (put one line of random text in it)", path);
        return -1;
    }
    if (l < GRPO_SECRET_MIN) {
        snprintf(err, errlen,
                 "secret in %s is %zu characters (%zu bits at most, as base64); at least %d are needed (128 bits of "
                 "randomness); make one with: head -c 32 /dev/urandom | base64 > %s; chmod 600 %s",
                 path, l, 6 * l, GRPO_SECRET_MIN, path, path);
        return -1;
    }
    if (l + 1 > outlen) {
        snprintf(err, errlen, "secret in %s is longer than %zu bytes", path, outlen - 1);
        return -1;
    }
    memcpy(out, s, l + 1);
    return 0;
}

int secret_bytes_equal(const uint8_t *a, size_t la, const uint8_t *b, size_t lb)
{
    /* every byte of a is looked at whatever it holds, against b cycled; the lengths enter the same sum */
    volatile unsigned diff = (unsigned)((la ^ lb) != 0);
    for (size_t i = 0; i < la; i++)
        diff |= (unsigned)a[i] ^ (unsigned)(lb ? b[i % lb] : 0);
    return diff == 0 && la == lb;
}

int secret_equal(const char *a, const char *b)
{
    return secret_bytes_equal((const uint8_t *)a, strlen(a), (const uint8_t *)b, strlen(b));
}

int secret_matches(ProtobufCBinaryData got, const char *want)
{
    return secret_bytes_equal(got.data, got.len, (const uint8_t *)want, strlen(want));
}

void envelope_set_secret(Grpo__Envelope *env, const char *secret)
{
    env->secret.data = (uint8_t *)(secret ? secret : "");
    env->secret.len = secret ? strlen(secret) : 0;
}

struct rpc_client *rpc_open(const char *endpoint, const char *secret, char *err, size_t errlen)
{
    enum endpoint_kind kind;
    if (endpoint_parse(endpoint, &kind, NULL, 0, err, errlen) != 0)
        return NULL;
    int s = nn_socket(AF_SP, NN_REQ);
    if (s < 0) {
        snprintf(err, errlen, "nn_socket: %s", nn_strerror(nn_errno()));
        return NULL;
    }
    int max = (int)GRPO_MAX_MESSAGE_BYTES, ivl = 100, ivl_max = 2000, linger = 0;
    /* replies are matched by request id and resent by us, never by nanomsg behind our back */
    int resend = 24 * 3600 * 1000;
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVMAXSIZE, &max, sizeof max);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RECONNECT_IVL, &ivl, sizeof ivl);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
    nn_setsockopt(s, NN_SOL_SOCKET, NN_LINGER, &linger, sizeof linger);
    nn_setsockopt(s, NN_REQ, NN_REQ_RESEND_IVL, &resend, sizeof resend);
    if (nn_connect(s, endpoint) < 0) {
        snprintf(err, errlen, "cannot connect to %s: %s", endpoint, nn_strerror(nn_errno()));
        nn_close(s);
        return NULL;
    }
    struct rpc_client *c = xcalloc(1, sizeof *c);
    c->sock = s;
    snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
    if (secret && secret[0]) {
        c->ctl = xcalloc(1, sizeof *c->ctl);
        ctl_client_init(c->ctl, secret);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    c->next_id = ((uint64_t)ts.tv_nsec << 20) ^ ((uint64_t)getpid() << 40) ^ (uint64_t)ts.tv_sec;
    return c;
}

int rpc_connect_also(struct rpc_client *c, const char *endpoint, char *err, size_t errlen)
{
    enum endpoint_kind kind;
    if (endpoint_parse(endpoint, &kind, NULL, 0, err, errlen) != 0)
        return -1;
    if (nn_connect(c->sock, endpoint) < 0) {
        snprintf(err, errlen, "cannot connect to %s: %s", endpoint, nn_strerror(nn_errno()));
        return -1;
    }
    c->also = xrealloc(c->also, (size_t)(c->n_also + 1) * sizeof *c->also);
    c->also[c->n_also++] = xstrdup(endpoint);
    return 0;
}

void rpc_close(struct rpc_client *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_also; i++)
        free(c->also[i]);
    free(c->also);
    nn_close(c->sock);
    if (c->ctl)
        ctl_client_wipe(c->ctl);
    free(c->ctl);
    free(c);
}

const char *rpc_endpoint(const struct rpc_client *c) { return c->endpoint; }

/* Why nothing answered: the probe's reason, or a plain timeout when something listens. */
static void unreachable_reason(const struct rpc_client *c, int timeout_ms, char *err, size_t errlen)
{
    char why[256], other[256];
    bool listens = endpoint_probe(c->endpoint, why, sizeof why) == 0;
    for (int i = 0; i < c->n_also && !listens; i++) /* gone only when every endpoint is */
        listens = endpoint_probe(c->also[i], other, sizeof other) == 0;
    if (!listens)
        snprintf(err, errlen, "%s", why);
    else
        snprintf(err, errlen, "no answer within %.1f s", timeout_ms / 1000.0);
}

/* An answer from a peer of another protocol version: say so, with grpod's own words if it sent any. */
static void version_reason(const Grpo__Envelope *env, char *err, size_t errlen)
{
    if (env->body_case == GRPO__ENVELOPE__BODY_REPLY && env->reply->error && env->reply->error[0])
        snprintf(err, errlen, "grpod speaks protocol version %u, this program version %u: %s", env->version,
                 GRPO_PROTOCOL_VERSION, env->reply->error);
    else
        snprintf(err, errlen, "grpod speaks protocol version %u, this program version %u; upgrade the older side",
                 env->version, GRPO_PROTOCOL_VERSION);
}

/* Send buf, the request of id `id`, and wait until deadline for its answer: *env (decoded, protocol_free it) on
 * RPC_OK; late answers to earlier tries are dropped. */
static enum rpc_result exchange(struct rpc_client *c, const uint8_t *buf, size_t len, uint64_t id, double deadline,
                                int timeout_ms, Grpo__Envelope **out, char *err, size_t errlen)
{
    *out = NULL;
    int to = (int)((deadline - clock_now_s()) * 1000.0);
    if (to < 1)
        to = 1;
    nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_SNDTIMEO, &to, sizeof to);
    if (nn_send(c->sock, buf, len, 0) < 0) {
        int e = nn_errno();
        if (e == ETIMEDOUT || e == EAGAIN)
            unreachable_reason(c, timeout_ms, err, errlen);
        else
            snprintf(err, errlen, "send failed: %s", nn_strerror(e));
        return RPC_UNREACHABLE;
    }
    for (;;) {
        int left = (int)((deadline - clock_now_s()) * 1000.0);
        if (left <= 0) {
            unreachable_reason(c, timeout_ms, err, errlen);
            return RPC_UNREACHABLE;
        }
        nn_setsockopt(c->sock, NN_SOL_SOCKET, NN_RCVTIMEO, &left, sizeof left);
        void *msg = NULL;
        int n = nn_recv(c->sock, &msg, NN_MSG, 0);
        if (n < 0) {
            int e = nn_errno();
            if (e == EINTR)
                continue;
            if (e == ETIMEDOUT || e == EAGAIN)
                unreachable_reason(c, timeout_ms, err, errlen);
            else
                snprintf(err, errlen, "receive failed: %s", nn_strerror(e));
            return RPC_UNREACHABLE;
        }
        Grpo__Envelope *env;
        char why[256];
        enum protocol_error pe = protocol_decode(msg, (size_t)n, GRPO_MAX_MESSAGE_BYTES, &env, why, sizeof why);
        nn_freemsg(msg);
        if (pe == PROTOCOL_BAD_VERSION) {
            version_reason(env, err, errlen);
            protocol_free(env);
            return RPC_BAD_REPLY;
        }
        if (pe != PROTOCOL_OK) {
            snprintf(err, errlen, "unusable answer: %s", why);
            protocol_free(env);
            return RPC_BAD_REPLY;
        }
        if (env->request_id != id) { /* a late answer to an earlier try */
            protocol_free(env);
            continue;
        }
        *out = env;
        return RPC_OK;
    }
}

/* grpod's unsealed refusal of an authentication step (env: a Reply, or something else), in err. */
static void auth_refusal(const Grpo__Envelope *env, const char *why, char *err, size_t errlen)
{
    if (env->minor_version < 12)
        snprintf(err, errlen,
                 "grpod speaks protocol 1.%u, which takes the shared secret in clear on tcp://; this program (1.%u) "
                 "authenticates by challenge-response and never sends the secret: upgrade grpod",
                 env->minor_version, GRPO_PROTOCOL_MINOR);
    else if (env->body_case == GRPO__ENVELOPE__BODY_REPLY && env->reply->error && env->reply->error[0])
        snprintf(err, errlen, "refused: %s", env->reply->error);
    else
        snprintf(err, errlen, "%s", why);
}

/* rpc_call on tcp:// to grpod: a session first (challenge-response), then the request sealed, its answer opened.
 * A session grpod does not know (it restarted) is made again once. */
static enum rpc_result call_sealed(struct rpc_client *c, Grpo__Envelope *req, double deadline, int timeout_ms,
                                   Grpo__Envelope **reply, char *err, size_t errlen)
{
    char why[300];
    for (int round = 0; round < 2; round++) {
        Grpo__Envelope *env = NULL;
        size_t len;
        uint8_t *buf;
        enum rpc_result r;
        if (!c->ctl->open) {
            const uint64_t hid = ++c->next_id;
            buf = CHECK_ALLOC(ctl_client_hello(c->ctl, hid, &len));
            r = exchange(c, buf, len, hid, deadline, timeout_ms, &env, err, errlen);
            free(buf);
            if (r != RPC_OK)
                return r;
            if (ctl_client_accept(c->ctl, env, why, sizeof why) != 0) {
                auth_refusal(env, why, err, errlen);
                protocol_free(env);
                return RPC_BAD_REPLY;
            }
            protocol_free(env);
        }
        req->request_id = ++c->next_id;
        envelope_set_secret(req, NULL); /* never on the wire, sealed or not */
        uint64_t counter;
        buf = CHECK_ALLOC(ctl_client_seal(c->ctl, req, &counter, &len));
        r = exchange(c, buf, len, req->request_id, deadline, timeout_ms, &env, err, errlen);
        free(buf);
        if (r != RPC_OK)
            return r;
        if (env->body_case == GRPO__ENVELOPE__BODY_REPLY) { /* grpod refused the session, not the request */
            const bool again = env->reply->reauth && round == 0;
            if (!again)
                auth_refusal(env, "refused", err, errlen);
            protocol_free(env);
            ctl_client_reset(c->ctl);
            if (again)
                continue;
            return RPC_BAD_REPLY;
        }
        Grpo__Envelope *inner;
        int bad = ctl_client_open(c->ctl, counter, env, &inner, why, sizeof why);
        protocol_free(env);
        if (bad) {
            snprintf(err, errlen, "unusable answer: %s", why);
            return RPC_BAD_REPLY;
        }
        *reply = inner;
        return RPC_OK;
    }
    snprintf(err, errlen, "grpod forgot the session twice in a row");
    return RPC_BAD_REPLY;
}

enum rpc_result rpc_call(struct rpc_client *c, Grpo__Envelope *req, int timeout_ms, Grpo__Envelope **reply, char *err,
                         size_t errlen)
{
    *reply = NULL;
    const double deadline = clock_now_s() + timeout_ms / 1000.0;
    if (c->ctl)
        return call_sealed(c, req, deadline, timeout_ms, reply, err, errlen);
    uint64_t id = ++c->next_id;
    req->request_id = id;
    envelope_set_secret(req, NULL);
    size_t len;
    uint64_t counter = 0;
    uint8_t *buf = CHECK_ALLOC(plane_pack_request_n(req, c->plane, &counter, &len));
    Grpo__Envelope *env;
    enum rpc_result r = exchange(c, buf, len, id, deadline, timeout_ms, &env, err, errlen);
    free(buf);
    if (r != RPC_OK)
        return r;
    char why_auth[300];
    if (c->plane && plane_verify_answer(c->plane, counter, env, why_auth, sizeof why_auth) != 0) {
        if (env->body_case == GRPO__ENVELOPE__BODY_REPLY && !env->reply->ok && env->reply->error)
            snprintf(err, errlen, "refused: %s (%s)", env->reply->error, why_auth);
        else
            snprintf(err, errlen, "unusable answer: %s", why_auth);
        protocol_free(env);
        return RPC_BAD_REPLY;
    }
    *reply = env;
    return RPC_OK;
}

enum rpc_result rpc_call_retry(struct rpc_client *c, Grpo__Envelope *req, int attempts, int timeout_ms,
                               Grpo__Envelope **reply, char *err, size_t errlen)
{
    struct backoff b;
    backoff_init(&b, 0.1, 2.0);
    enum rpc_result r = RPC_UNREACHABLE;
    for (int i = 0; i < (attempts < 1 ? 1 : attempts); i++) {
        if (i > 0)
            clock_sleep_s(backoff_next(&b));
        /* a plain connect fails at once where nothing listens: no need to wait out the timeout */
        if (endpoint_probe(c->endpoint, err, errlen) != 0)
            continue;
        r = rpc_call(c, req, timeout_ms, reply, err, errlen);
        if (r != RPC_UNREACHABLE)
            return r;
    }
    return r;
}
