/* grpod's HTTP side: the status page (/), the run as JSON (/api/status) and
 * Prometheus metrics (/metrics), served by libmicrohttpd driven from grpod's
 * libuv loop (its epoll descriptor under uv_poll), so grpod stays one thread. */
#ifndef GRPO_DAEMON_HTTP_H
#define GRPO_DAEMON_HTTP_H

#include <stddef.h>

#include <uv.h>

struct core;
struct http;

/* Listen on ADDRESS:PORT ("127.0.0.1:9464", "[::1]:0", port 0 picks one) and serve the core's
 * run. url[] gets the base URL actually bound. NULL with err on failure. */
struct http *http_start(uv_loop_t *loop, const char *listen, struct core *core, double (*now)(void), char *url,
                        size_t urllen, char *err, size_t errlen);
/* Connections at once (4..256): a quarter is kept for scrapes from 127.0.0.1 / ::1. */
void http_set_connection_limit(struct http *h, int cap);
/* Stop serving; close_cb-free: the handles are closed on the loop, call before the final uv_run. */
void http_stop(struct http *h);
/* The status page (page.c). */
extern const char grpod_page_html[];

#endif
