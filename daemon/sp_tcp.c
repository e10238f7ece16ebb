/* REP over SP/TCP for grpod's tcp:// control endpoints. See sp_tcp.h.
 *
 * Wire format (nanomsg's, what its REQ sockets speak): each side first sends 8 bytes {0, 'S', 'P', 0,
 * protocol as 16-bit big-endian (REQ 48, REP 49), 0, 0}; then messages, each an 8-byte big-endian length and
 * that many bytes: the backtrace (4-byte words, the last with its top bit set: the request id) and the body.
 * An answer starts with the backtrace of its request. */
#include "sp_tcp.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "ratelimit.h"

#define SP_PROTO_REQ 48
#define SP_PROTO_REP 49
#define SP_MAX_HOPS 8 /* backtrace words accepted (a direct REQ sends 1; each nanomsg device adds 1) */
#define SP_LOG_LINES 5

static const uint8_t sp_rep_header[8] = {0, 'S', 'P', 0, 0, SP_PROTO_REP, 0, 0};

struct sp_conn {
    uv_tcp_t tcp;
    struct sp_server *srv;
    struct sp_conn *prev, *next; /* in srv->pending or srv->authed, oldest first */
    double opened;
    bool authed, hdr_ok, writing, reading, closing;
    int failures;       /* failed requests on this connection */
    bool close_written; /* close once the answer being written is out (max_failures reached) */
    uint8_t *held;      /* a failed request's answer, waiting for held_until (NULL: none) */
    size_t held_len, held_btlen;
    uint8_t held_bt[4 * SP_MAX_HOPS];
    double held_until;
    struct sockaddr_storage peer;
    char peer_text[INET6_ADDRSTRLEN + 8];
    uint8_t *in; /* bytes received and not yet handled */
    size_t in_len, in_cap;
};

struct sp_write {
    uv_write_t req;
    struct sp_conn *c;
    uint8_t head[8 + 4 * SP_MAX_HOPS]; /* length and backtrace */
    uint8_t *body;                     /* the handler's answer, freed when written */
    bool is_header;
};

struct sp_list {
    struct sp_conn *head, *tail;
    int n;
};

struct sp_server {
    uv_tcp_t listener;
    uv_timer_t timer;
    int open_handles; /* listener and timer, until their close callbacks */
    char endpoint[512];
    int port;
    struct sp_limits lim;
    sp_handler handler;
    void *ud;
    double (*now)(void);
    struct sp_list pending, authed;
    struct sp_stats st;
    struct ratelimit rl_conn, rl_bad, rl_accept;
    uint8_t scratch[64 * 1024]; /* each read lands here, then goes to its connection's buffer */
};

/* ---- lists ---- */

static void list_push(struct sp_list *l, struct sp_conn *c)
{
    c->prev = l->tail;
    c->next = NULL;
    if (l->tail)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
    l->n++;
}

static void list_remove(struct sp_list *l, struct sp_conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        l->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        l->tail = c->prev;
    c->prev = c->next = NULL;
    l->n--;
}

/* ---- connections ---- */

static void on_conn_closed(uv_handle_t *h)
{
    struct sp_conn *c = h->data;
    free(c->in);
    free(c->held);
    free(c);
}

/* Close a connection; why (may be NULL: a plain disconnect) goes to the log, rate-limited. */
static void conn_close(struct sp_conn *c, const char *why)
{
    if (c->closing)
        return;
    c->closing = true;
    struct sp_server *s = c->srv;
    list_remove(c->authed ? &s->authed : &s->pending, c);
    if (why && ratelimit_allow(&s->rl_conn, s->now(), SP_LOG_LINES, "grpod", "closed connections"))
        log_warn("grpod", "%s: closed the connection from %s: %s", s->endpoint, c->peer_text, why);
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

static void on_written(uv_write_t *req, int status);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void set_reading(struct sp_conn *c, bool on)
{
    if (c->closing || c->reading == on)
        return;
    if (on ? uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) : uv_read_stop((uv_stream_t *)&c->tcp))
        conn_close(c, "cannot read from the socket");
    else
        c->reading = on;
}

/* Queue an answer: length, the request's backtrace, the body (taken). */
static void send_answer(struct sp_conn *c, const uint8_t *bt, size_t btlen, uint8_t *body, size_t blen)
{
    struct sp_write *w = xcalloc(1, sizeof *w);
    w->c = c;
    w->body = body;
    put_be64(w->head, btlen + blen);
    memcpy(w->head + 8, bt, btlen);
    uv_buf_t b[2] = {uv_buf_init((char *)w->head, (unsigned)(8 + btlen)), uv_buf_init((char *)body, (unsigned)blen)};
    c->writing = true;
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, b, blen ? 2 : 1, on_written) != 0) {
        free(body);
        free(w);
        c->writing = false;
        conn_close(c, "cannot write to the socket");
    }
}

/* Handle every whole message in the connection's buffer, one at a time: stops while an answer is written. */
static void conn_process(struct sp_conn *c)
{
    struct sp_server *s = c->srv;
    size_t off = 0;
    if (!c->hdr_ok) {
        if (c->in_len < 8)
            return;
        if (memcmp(c->in, "\0SP\0", 4) != 0 || c->in[6] || c->in[7] || (c->in[4] << 8 | c->in[5]) != SP_PROTO_REQ) {
            s->st.broken++;
            conn_close(c, "not a nanomsg REQ socket (bad protocol header)");
            return;
        }
        c->hdr_ok = true;
        off = 8;
    }
    while (!c->writing && !c->closing && c->in_len - off >= 8) {
        uint64_t n = get_be64(c->in + off);
        size_t limit = c->authed ? s->lim.max_msg : s->lim.max_pending_msg;
        if (n > limit) {
            s->st.oversized++;
            char why[160];
            snprintf(why, sizeof why, "a message of %llu bytes, over the %zu-byte limit%s", (unsigned long long)n,
                     limit, c->authed ? "" : " before authentication");
            conn_close(c, why);
            return;
        }
        if (c->in_len - off - 8 < n)
            break;
        const uint8_t *m = c->in + off + 8;
        size_t bt = 0;
        bool last = false;
        while (!last && bt + 4 <= n && bt < 4 * SP_MAX_HOPS) {
            last = (m[bt] & 0x80) != 0;
            bt += 4;
        }
        off += 8 + (size_t)n;
        if (!last) { /* nanomsg's REP drops such a message; a stranger is shown the door */
            s->st.broken++;
            if (!c->authed) {
                conn_close(c, "a message without a request id");
                return;
            }
            continue;
        }
        bool auth = false, failed = false;
        size_t rlen = 0;
        uint8_t *reply = s->handler(s->ud, m + bt, (size_t)n - bt, &auth, &failed, &rlen);
        if (auth && !c->authed) {
            list_remove(&s->pending, c);
            c->authed = true;
            list_push(&s->authed, c);
        }
        if (failed && s->lim.max_failures > 0) { /* answered late; the last one allowed closes the connection */
            s->st.failures++;
            c->close_written = ++c->failures >= s->lim.max_failures;
            c->held = reply;
            c->held_len = rlen;
            memcpy(c->held_bt, m, bt);
            c->held_btlen = bt;
            c->held_until = s->now() + s->lim.failure_delay_s;
            c->writing = true; /* nothing more is read meanwhile */
            continue;
        }
        send_answer(c, m, bt, reply, rlen);
    }
    if (off && !c->closing) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    set_reading(c, !c->writing);
}

static void on_written(uv_write_t *req, int status)
{
    struct sp_write *w = (struct sp_write *)req;
    struct sp_conn *c = w->c;
    bool header = w->is_header;
    free(w->body);
    free(w);
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c, NULL);
        return;
    }
    if (!header) {
        c->writing = false;
        if (c->close_written) {
            char why[128];
            snprintf(why, sizeof why, "%d failed requests on one connection", c->failures);
            c->srv->st.closed_failing++;
            conn_close(c, why);
            return;
        }
        conn_process(c);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct sp_conn *c = h->data;
    *buf = uv_buf_init((char *)c->srv->scratch, sizeof c->srv->scratch);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct sp_conn *c = stream->data;
    if (c->closing)
        return;
    if (nread < 0) {
        conn_close(c, NULL); /* the peer went away (or the socket failed): nothing to report */
        return;
    }
    if (nread == 0)
        return;
    if (c->in_len + (size_t)nread > c->in_cap) {
        size_t cap = c->in_cap ? c->in_cap : 4096;
        while (cap < c->in_len + (size_t)nread)
            cap *= 2;
        c->in = xrealloc(c->in, cap);
        c->in_cap = cap;
    }
    memcpy(c->in + c->in_len, buf->base, (size_t)nread);
    c->in_len += (size_t)nread;
    conn_process(c);
}

/* Room for one more connection from addr: close the oldest unauthenticated one of that address when it has
 * its share, else the oldest of all when the unauthenticated are at their cap or all connections are. */
static bool make_room(struct sp_server *s, const struct sockaddr_storage *addr)
{
    int same = 0;
    struct sp_conn *oldest_same = NULL;
    for (struct sp_conn *c = s->pending.head; c; c = c->next)
        if (same_addr(&c->peer, addr)) {
            if (!oldest_same)
                oldest_same = c;
            same++;
        }
    struct sp_conn *victim = NULL;
    if (same >= s->lim.max_pending_per_ip)
        victim = oldest_same;
    else if (s->pending.n >= s->lim.max_pending || s->pending.n + s->authed.n >= s->lim.max_conns)
        victim = s->pending.head;
    if (victim) {
        s->st.evicted++;
        conn_close(victim, "made room for a newer connection (it had not authenticated)");
    }
    return s->pending.n + s->authed.n < s->lim.max_conns;
}

static void on_connection(uv_stream_t *server, int status)
{
    struct sp_server *s = server->data;
    double now = s->now();
    if (status < 0) { /* EMFILE included: libuv closes what waits in the backlog with its spare descriptor */
        if (ratelimit_allow(&s->rl_accept, now, SP_LOG_LINES, "grpod", "accept failures"))
            log_warn("grpod", "%s: cannot accept a connection: %s", s->endpoint, uv_strerror(status));
        return;
    }
    struct sp_conn *c = xcalloc(1, sizeof *c);
    c->srv = s;
    c->opened = now;
    uv_tcp_init(server->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    int alen = sizeof c->peer;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&c->peer, &alen) == 0) {
        const void *a = c->peer.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&c->peer)->sin6_addr
                                                      : (const void *)&((struct sockaddr_in *)&c->peer)->sin_addr;
        if (!inet_ntop(c->peer.ss_family, a, c->peer_text, sizeof c->peer_text))
            snprintf(c->peer_text, sizeof c->peer_text, "?");
    } else {
        snprintf(c->peer_text, sizeof c->peer_text, "?");
    }
    s->st.accepted++;
    if (!make_room(s, &c->peer)) {
        s->st.refused++;
        if (ratelimit_allow(&s->rl_conn, now, SP_LOG_LINES, "grpod", "closed connections"))
            log_warn("grpod", "%s: refused a connection from %s: all %d connections are authenticated", s->endpoint,
                     c->peer_text, s->lim.max_conns);
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    list_push(&s->pending, c);
    uv_tcp_nodelay(&c->tcp, 1);
    struct sp_write *w = xcalloc(1, sizeof *w);
    w->c = c;
    w->is_header = true;
    uv_buf_t b = uv_buf_init((char *)sp_rep_header, sizeof sp_rep_header);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) != 0) {
        free(w);
        conn_close(c, NULL);
        return;
    }
    set_reading(c, true);
}

/* A failed request's answer, held until its time. */
static void send_held(struct sp_conn *c, double now)
{
    if (!c->held || now < c->held_until || c->closing)
        return;
    uint8_t *body = c->held;
    c->held = NULL;
    send_answer(c, c->held_bt, c->held_btlen, body, c->held_len);
}

/* Answers held past their time go out; unauthenticated connections past their deadlines are closed. */
static void on_timer(uv_timer_t *t)
{
    struct sp_server *s = t->data;
    double now = s->now();
    for (struct sp_list *l = &s->pending;; l = &s->authed) {
        for (struct sp_conn *c = l->head, *next; c; c = next) {
            next = c->next;
            send_held(c, now);
        }
        if (l == &s->authed)
            break;
    }
    for (struct sp_conn *c = s->pending.head, *next; c; c = next) {
        next = c->next;
        double age = now - c->opened;
        if (!c->hdr_ok && age > s->lim.handshake_s) {
            s->st.timed_out++;
            conn_close(c, "no SP protocol header in time");
        } else if (age > s->lim.auth_deadline_s) {
            s->st.timed_out++;
            char why[128];
            snprintf(why, sizeof why, "no authenticated request within %.0f s", s->lim.auth_deadline_s);
            conn_close(c, why);
        }
    }
    ratelimit_flush(&s->rl_conn, now, "grpod", "closed connections");
    ratelimit_flush(&s->rl_accept, now, "grpod", "accept failures");
}

/* ---- the listener ---- */

/* The address of HOST:PORT to bind: "*", a numeric address, a name, or an interface's first address. */
static int bind_address(const char *endpoint, struct sockaddr_storage *ss, char *err, size_t errlen)
{
    const char *hp = endpoint + 6, *colon = strrchr(hp, ':');
    char host[256];
    if (!colon || (size_t)(colon - hp) >= sizeof host) {
        snprintf(err, errlen, "endpoint '%s' needs a host and a port: tcp://HOST:PORT", endpoint);
        return -1;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - hp), hp);
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || port < 0 || port > 65535) {
        snprintf(err, errlen, "endpoint '%s' needs a port from 0 to 65535", endpoint);
        return -1;
    }
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
    size_t hl = strlen(host);
    if (strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0) {
        s4->sin_family = AF_INET;
        s4->sin_addr.s_addr = htonl(INADDR_ANY);
        s4->sin_port = htons((uint16_t)port);
        return 0;
    }
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        host[hl - 1] = 0;
        memmove(host, host + 1, hl - 1);
    }
    if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        return 0;
    }
    struct ifaddrs *ifs = NULL; /* nanomsg accepts an interface name: eth0 */
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
            if (i->ifa_addr && strcmp(i->ifa_name, host) == 0 &&
                (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6)) {
                memcpy(ss, i->ifa_addr,
                       i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
                if (ss->ss_family == AF_INET)
                    s4->sin_port = htons((uint16_t)port);
                else
                    s6->sin6_port = htons((uint16_t)port);
                freeifaddrs(ifs);
                return 0;
            }
        freeifaddrs(ifs);
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *res = NULL;
    int g = getaddrinfo(host, NULL, &hints, &res);
    if (g != 0 || !res) {
        snprintf(err, errlen, "endpoint '%s': cannot resolve '%s': %s", endpoint, host,
                 g ? gai_strerror(g) : "no address");
        return -1;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    if (ss->ss_family == AF_INET)
        s4->sin_port = htons((uint16_t)port);
    else
        s6->sin6_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

static void on_server_closed(uv_handle_t *h)
{
    struct sp_server *s = h->data;
    if (--s->open_handles == 0)
        free(s);
}

struct sp_server *sp_server_start(uv_loop_t *loop, const char *endpoint, const struct sp_limits *lim,
                                  sp_handler handler, void *ud, double (*now)(void), char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    if (strncmp(endpoint, "tcp://", 6) != 0) {
        snprintf(err, errlen, "'%s' is not a tcp:// endpoint", endpoint);
        return NULL;
    }
    if (bind_address(endpoint, &ss, err, errlen) != 0)
        return NULL;
    struct sp_server *s = xcalloc(1, sizeof *s);
    snprintf(s->endpoint, sizeof s->endpoint, "%s", endpoint);
    s->lim = *lim;
    s->handler = handler;
    s->ud = ud;
    s->now = now;
    uv_tcp_init(loop, &s->listener);
    uv_timer_init(loop, &s->timer);
    s->listener.data = s->timer.data = s;
    s->open_handles = 2;
    int rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&ss, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection);
    if (rc != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s%s", endpoint, uv_strerror(rc),
                 rc == UV_EADDRINUSE ? " (another grpod runs there?)" : "");
        uv_close((uv_handle_t *)&s->listener, on_server_closed);
        uv_close((uv_handle_t *)&s->timer, on_server_closed);
        return NULL;
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen) == 0)
        s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    uv_timer_start(&s->timer, on_timer, 250, 250);
    return s;
}

void sp_server_set_limits(struct sp_server *s, const struct sp_limits *lim) { s->lim = *lim; }

void sp_server_stats(const struct sp_server *s, struct sp_stats *st)
{
    *st = s->st;
    st->open = s->pending.n + s->authed.n;
    st->pending = s->pending.n;
}

int sp_server_port(const struct sp_server *s) { return s->port; }

void sp_server_stop(struct sp_server *s)
{
    if (!s)
        return;
    while (s->pending.head)
        conn_close(s->pending.head, NULL);
    while (s->authed.head)
        conn_close(s->authed.head, NULL);
    uv_close((uv_handle_t *)&s->listener, on_server_closed);
    uv_close((uv_handle_t *)&s->timer, on_server_closed);
}
