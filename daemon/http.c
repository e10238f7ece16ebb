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

struct http {
    struct MHD_Daemon *mhd;
    struct core *core;
    double (*now)(void);
    uv_poll_t poll;
    uv_timer_t timer;
    int open_handles;
};

static void http_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    buf[strcspn(buf, "\n")] = 0;
    log_warn("http", "%s", buf);
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

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    (void)upload_data;
    (void)con_cls;
    struct http *h = cls;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        static char msg[] = "only GET and HEAD are served\n";
        return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain; charset=utf-8", msg, sizeof msg - 1,
                       MHD_RESPMEM_PERSISTENT);
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
        struct arena a = {0};
        char *text = status_to_json(core_status(h->core, now, &a), 0);
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
    return respond(conn, MHD_HTTP_NOT_FOUND, "text/plain; charset=utf-8", nf, sizeof nf - 1, MHD_RESPMEM_PERSISTENT);
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

static void on_timer(uv_timer_t *t) { drive(t->data); }

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
        snprintf(err, errlen, "grpod.http_listen '%s' is not ADDRESS:PORT (e.g. 127.0.0.1:9464)", listen);
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
    snprintf(err, errlen, "grpod.http_listen '%s': '%s' is not a numeric IP address", listen, host);
    return -1;
}

struct http *http_start(uv_loop_t *loop, const char *listen, struct core *core, double (*now)(void), char *url,
                        size_t urllen, char *err, size_t errlen)
{
    struct sockaddr_storage ss;
    if (parse_listen(listen, &ss, err, errlen) != 0)
        return NULL;
    unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    struct http *h = xcalloc(1, sizeof *h);
    h->core = core;
    h->now = now;
    h->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, http_log, NULL,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, 256u,
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, 64u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_END);
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
    uv_close((uv_handle_t *)&h->poll, on_closed);
    uv_close((uv_handle_t *)&h->timer, on_closed);
}
