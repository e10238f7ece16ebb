#include "http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "arena.h"
#include "common/check.h"
#include "common/log.h"
#include "core.h"
#include "proto/status_json.h"
#include "ratelimit.h"
#include "common/config_key_names.h"

/* Connections, beyond what libmicrohttpd limits itself (its idle timeout restarts with every byte, so a client
 * that sends one header line every few seconds held a connection for ever, and 64 of them from one address
 * took every slot of it):
 *  - a request's headers must be whole within HTTP_HEADER_DEADLINE_S of the connection opening or of its
 *    previous answer, and an answer must be done within HTTP_REQUEST_DEADLINE_S; else the connection is shut;
 *  - connections from elsewhere than 127.0.0.1 or ::1 take at most the cap less a reserve for local scrapes,
 *    and HTTP_MAX_PER_REMOTE of them come from one address;
 *  - a local connection over the cap makes room by shutting the oldest connection that is not in a request;
 *  - a refused request (a path not served, a method other than GET and HEAD) is a failed attempt: it is answered
 *    after GRPOD_FAILED_ATTEMPT_DELAY_S (the connection suspended meanwhile), and the GRPOD_MAX_FAILED_ATTEMPTS-th
 *    one on a connection closes it. The page takes no credentials (it is read-only): nothing on it can be guessed,
 *    and a scan costs its connection a second per probe. */
#define HTTP_HEADER_DEADLINE_S 5.0
#define HTTP_REQUEST_DEADLINE_S 30.0
#define HTTP_MAX_PER_REMOTE 16
#define HTTP_MHD_LIMIT 288 /* libmicrohttpd's own cap: above ours, which is at most 256 */
#define HTTP_LOG_KINDS 16

struct http_conn {
    struct http_conn *prev, *next; /* oldest first */
    struct MHD_Connection *conn;
    int fd;
    double since; /* opened, or its previous answer done: the next request's headers are due from here */
    double req_start;
    bool in_request; /* its headers are whole: on_request has it */
    bool local;      /* from 127.0.0.1 or ::1 */
    bool shut;       /* shut down by us; libmicrohttpd closes it at its next turn */
    struct sockaddr_storage addr;
    int failures;   /* refused requests on this connection */
    bool waited;    /* the refused request in hand has waited its delay */
    bool suspended; /* until resume_at */
    double resume_at;
};

struct http {
    struct MHD_Daemon *mhd;
    struct core *core;
    double (*now)(void);
    uv_poll_t poll;
    uv_timer_t timer;
    int open_handles;
    int cap;                       /* connections at once (fd_budget in grpod.c) */
    struct http_conn *head, *tail; /* every connection libmicrohttpd holds */
    int nconn, nremote;            /* not shut */
    uint64_t refused, shut_slow;   /* counters */
    uint64_t failures;             /* refused requests (failed attempts) */
    struct {                       /* rate limit of libmicrohttpd's messages, by format */
        const char *fmt;
        struct ratelimit rl;
    } logs[HTTP_LOG_KINDS];
    struct ratelimit rl_conn;
};

static void http_log(void *cls, const char *fmt, va_list ap)
{
    struct http *h = cls;
    double now = h->now();
    int k = 0;
    while (k < HTTP_LOG_KINDS - 1 && h->logs[k].fmt && h->logs[k].fmt != fmt)
        k++;
    h->logs[k].fmt = h->logs[k].fmt ? h->logs[k].fmt : fmt; /* the last slot is shared by any others */
    if (!ratelimit_allow(&h->logs[k].rl, now, 5, "http", "such libmicrohttpd messages"))
        return;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    buf[strcspn(buf, "\n")] = 0;
    log_warn("http", "%s", buf);
}

static bool addr_local(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) == INADDR_LOOPBACK;
    if (a->sa_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        static const uint8_t mapped_lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
        return IN6_IS_ADDR_LOOPBACK(x) || memcmp(x, mapped_lo, 16) == 0;
    }
    return false;
}

static bool addr_same(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return false;
    if (b->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (b->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr, 16) ==
               0;
    return false;
}

/* Shut a connection's socket: libmicrohttpd sees the end at its next turn and closes it (its descriptor is
 * its own to close). */
static void conn_shut(struct http *h, struct http_conn *hc, const char *why)
{
    if (hc->shut)
        return;
    hc->shut = true;
    h->nconn--;
    h->nremote -= !hc->local;
    shutdown(hc->fd, SHUT_RDWR);
    if (ratelimit_allow(&h->rl_conn, h->now(), 5, "http", "closed connections")) {
        char text[INET6_ADDRSTRLEN] = "?";
        inet_ntop(hc->addr.ss_family,
                  hc->addr.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&hc->addr)->sin6_addr
                                                 : (const void *)&((struct sockaddr_in *)&hc->addr)->sin_addr,
                  text, sizeof text);
        log_warn("http", "closed the connection from %s: %s", text, why);
    }
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addrlen;
    struct http *h = cls;
    bool local = addr_local(addr);
    int reserve = h->cap / 4 > 4 ? h->cap / 4 : 4;
    const char *why = NULL;
    if (!local) {
        int same = 0;
        for (struct http_conn *c = h->head; c; c = c->next)
            same += !c->shut && addr_same(&c->addr, addr);
        if (same >= HTTP_MAX_PER_REMOTE)
            why = "too many connections from its address";
        else if (h->nremote >= h->cap - reserve || h->nconn >= h->cap)
            why = "no room left but the reserve for local scrapes";
    } else if (h->nconn >= h->cap) {
        struct http_conn *victim = NULL; /* the oldest idle one, from elsewhere first */
        for (struct http_conn *c = h->head; c; c = c->next)
            if (!c->shut && !c->in_request && (!victim || (victim->local && !c->local)))
                victim = c;
        if (victim)
            conn_shut(h, victim, "made room for a local connection");
        else
            why = "every connection is in a request";
    }
    if (why) {
        h->refused++;
        if (ratelimit_allow(&h->rl_conn, h->now(), 5, "http", "closed connections"))
            log_warn("http", "refused a connection: %s", why);
        return MHD_NO;
    }
    return MHD_YES;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct http *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct http_conn *hc = xcalloc(1, sizeof *hc);
        hc->conn = conn;
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        hc->fd = fi ? fi->connect_fd : -1;
        if (ai && ai->client_addr)
            memcpy(&hc->addr, ai->client_addr,
                   ai->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
        hc->local = ai && ai->client_addr && addr_local(ai->client_addr);
        hc->since = h->now();
        hc->prev = h->tail;
        if (h->tail)
            h->tail->next = hc;
        else
            h->head = hc;
        h->tail = hc;
        h->nconn++;
        h->nremote += !hc->local;
        *socket_context = hc;
        return;
    }
    struct http_conn *hc = *socket_context;
    if (!hc)
        return;
    if (!hc->shut) {
        h->nconn--;
        h->nremote -= !hc->local;
    }
    if (hc->prev)
        hc->prev->next = hc->next;
    else
        h->head = hc->next;
    if (hc->next)
        hc->next->prev = hc->prev;
    else
        h->tail = hc->prev;
    free(hc);
    *socket_context = NULL;
}

static struct http_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)con_cls;
    (void)toe;
    struct http *h = cls;
    struct http_conn *hc = conn_of(conn);
    if (hc) {
        hc->in_request = false;
        hc->since = h->now();
    }
}

/* Connections past their deadlines (from the timer); refused requests whose delay is over go on. */
static void sweep(struct http *h)
{
    double now = h->now();
    for (struct http_conn *c = h->head; c; c = c->next) {
        if (c->suspended && now >= c->resume_at) {
            c->suspended = false;
            MHD_resume_connection(c->conn);
        }
        if (c->shut || c->suspended)
            continue;
        if (!c->in_request && now - c->since > HTTP_HEADER_DEADLINE_S) {
            h->shut_slow++;
            conn_shut(h, c, "no whole request headers in time");
        } else if (c->in_request && now - c->req_start > HTTP_REQUEST_DEADLINE_S) {
            h->shut_slow++;
            conn_shut(h, c, "the answer was not taken in time");
        }
    }
    ratelimit_flush(&h->rl_conn, now, "http", "closed connections");
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, const char *type, char *body, size_t len,
                               enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (strncmp(type, "text/html", 9) == 0)
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                "connect-src 'self'; img-src 'self' data:");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* A refused request (code, body): a failed attempt. The first time it is seen the connection is suspended for
 * GRPOD_FAILED_ATTEMPT_DELAY_S (sweep resumes it, and libmicrohttpd asks again); then it is answered, and the
 * GRPOD_MAX_FAILED_ATTEMPTS-th refusal on the connection closes it. */
static enum MHD_Result refuse_late(struct http *h, struct MHD_Connection *conn, unsigned code, char *body, size_t len)
{
    struct http_conn *hc = conn_of(conn);
    if (hc && !hc->waited) {
        hc->waited = true;
        hc->failures++;
        h->failures++;
        hc->suspended = true;
        hc->resume_at = h->now() + GRPOD_FAILED_ATTEMPT_DELAY_S;
        MHD_suspend_connection(conn);
        return MHD_YES;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (hc) {
        hc->waited = false;
        if (hc->failures >= GRPOD_MAX_FAILED_ATTEMPTS) { /* libmicrohttpd closes it once this answer is out */
            MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
            h->core->counters.closed_failing_http++;
            if (ratelimit_allow(&h->rl_conn, h->now(), 5, "http", "closed connections"))
                log_warn("http", "closing a connection after %d refused requests", hc->failures);
        }
    }
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    (void)upload_data;
    struct http *h = cls;
    if (!*con_cls) { /* the request's headers are whole */
        static int started;
        *con_cls = &started;
        struct http_conn *hc = conn_of(conn);
        if (hc) {
            hc->in_request = true;
            hc->req_start = h->now();
        }
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static char msg[] = "only GET and HEAD are served\n";
        return refuse_late(h, conn, MHD_HTTP_METHOD_NOT_ALLOWED, msg, sizeof msg - 1);
    }
    if (*upload_data_size) { /* a GET with a body: ignore the body */
        *upload_data_size = 0;
        return MHD_YES;
    }
    double now = h->now();
    if (strcmp(url, "/metrics") == 0) {
        char *text = core_metrics_text(h->core, now);
        return respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text),
                       MHD_RESPMEM_MUST_FREE);
    }
    if (strcmp(url, "/api/status") == 0) {
        /* ?workers=N: at most N workers listed (the page asks for a few: 10,000 make megabytes, docs/scaling.md) */
        const char *arg = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "workers");
        long max = -1;
        if (arg) {
            char *end;
            max = strtol(arg, &end, 10);
            if (!arg[0] || *end || max < 0 || max > CORE_MAX_WORKERS) {
                static char bad[] = "bad workers= in /api/status: a whole number from 0 to 16384, the most workers "
                                    "to list\n";
                return refuse_late(h, conn, MHD_HTTP_BAD_REQUEST, bad, sizeof bad - 1);
            }
        }
        struct arena a = {0};
        int registered = 0;
        const Grpo__Status *st = core_status_some(h->core, now, &a, (int)max, &registered);
        char *text = status_to_json_of(st, 0, registered);
        arena_free(&a);
        return respond(conn, MHD_HTTP_OK, "application/json", text, strlen(text), MHD_RESPMEM_MUST_FREE);
    }
    if (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0)
        return respond(conn, MHD_HTTP_OK, "text/html; charset=utf-8", (char *)grpod_page_html, strlen(grpod_page_html),
                       MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/healthz") == 0) {
        static char ok[] = "ok\n";
        return respond(conn, MHD_HTTP_OK, "text/plain; charset=utf-8", ok, sizeof ok - 1, MHD_RESPMEM_PERSISTENT);
    }
    static char nf[] = "not found: try /, /api/status or /metrics\n";
    return refuse_late(h, conn, MHD_HTTP_NOT_FOUND, nf, sizeof nf - 1);
}

/* Run MHD until it has nothing left to do at once, then arm the timer for its next deadline.
 * In epoll mode a reply queued during one run is written in a later one, and the socket's
 * writability was signalled long ago: MHD says so with a zero timeout. */
static void on_timer(uv_timer_t *t);

static void drive(struct http *h)
{
    MHD_UNSIGNED_LONG_LONG ms = 250;
    for (int i = 0; i < 16; i++) {
        MHD_run(h->mhd);
        if (MHD_get_timeout(h->mhd, &ms) != MHD_YES)
            ms = 250;
        if (ms > 0)
            break;
    }
    uv_timer_start(&h->timer, on_timer, ms > 250 ? 250 : ms ? ms : 1, 0);
}

static void on_timer(uv_timer_t *t)
{
    sweep(t->data);
    drive(t->data);
}

static void on_poll(uv_poll_t *p, int status, int events)
{
    (void)status;
    (void)events;
    drive(p->data);
}

/* Parse "ADDR:PORT" / "[ADDR6]:PORT" / ":PORT" into a socket address. */
static int parse_listen(const char *listen, struct sockaddr_storage *ss, char *err, size_t errlen)
{
    char host[128];
    const char *colon = strrchr(listen, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || end == colon + 1 || *end || port < 0 || port > 65535) {
        snprintf(err, errlen, KEY_grpod_http_listen " '%s' is not ADDRESS:PORT (e.g. 127.0.0.1:9464)", listen);
        return -1;
    }
    size_t hl = (size_t)(colon - listen);
    if (hl >= sizeof host)
        hl = sizeof host - 1;
    memcpy(host, listen, hl);
    host[hl] = 0;
    memset(ss, 0, sizeof *ss);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        host[hl - 1] = 0;
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host + 1, &s6->sin6_addr) == 1)
            return 0;
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)port);
        if (!host[0] || inet_pton(AF_INET, host, &s4->sin_addr) == 1)
            return 0;
    }
    snprintf(err, errlen, KEY_grpod_http_listen " '%s': '%s' is not a numeric IP address", listen, host);
    return -1;
}

struct http *http_start(uv_loop_t *loop, const char *listen, struct core *core, double (*now)(void), char *url,
                        size_t urllen, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    if (parse_listen(listen, &ss, err, errlen) != 0)
        return NULL;
    unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct http *h = xcalloc(1, sizeof *h);
    h->core = core;
    h->now = now;
    h->cap = 256;
    /* per-address limits are ours (on_accept): libmicrohttpd's would count local scrapes with the rest */
    h->mhd = MHD_start_daemon(flags, 0, on_accept, h, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, http_log, h,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT,
                              (unsigned)HTTP_MHD_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
                              h, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_END);
    if (!h->mhd) {
        snprintf(err, errlen, "cannot serve HTTP on %s (address in use, or not an address of this host?)", listen);
        free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *fdi = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    if (!fdi || uv_poll_init(loop, &h->poll, fdi->epoll_fd) != 0) {
        snprintf(err, errlen, "cannot join libmicrohttpd's epoll descriptor to the event loop");
        MHD_stop_daemon(h->mhd);
        free(h);
        return NULL;
    }
    uv_timer_init(loop, &h->timer);
    h->poll.data = h->timer.data = h;
    h->open_handles = 2;
    uv_poll_start(&h->poll, UV_READABLE, on_poll);
    uv_timer_start(&h->timer, on_timer, 250, 0);
    char host[128];
    const char *colon = strrchr(listen, ':');
    snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
    snprintf(url, urllen, "http://%s:%u", host[0] ? host : "0.0.0.0", pi ? (unsigned)pi->port : 0u);
    return h;
}

void http_set_connection_limit(struct http *h, int cap) { h->cap = cap < 4 ? 4 : cap > 256 ? 256 : cap; }

static void on_closed(uv_handle_t *hd)
{
    struct http *h = hd->data;
    if (--h->open_handles == 0) {
        MHD_stop_daemon(h->mhd); /* closes the epoll descriptor, now that no handle watches it */
        free(h);
    }
}

void http_stop(struct http *h)
{
    if (!h)
        return;
    for (struct http_conn *c = h->head; c; c = c->next) /* libmicrohttpd stops with none suspended */
        if (c->suspended) {
            c->suspended = false;
            MHD_resume_connection(c->conn);
        }
    uv_close((uv_handle_t *)&h->poll, on_closed);
    uv_close((uv_handle_t *)&h->timer, on_closed);
}
