/* grpod's tcp:// control endpoints: a REP server for nanomsg's scalability protocol (SP) over TCP, run in
 * grpod's libuv loop, so that grpod and not nanomsg decides who may hold a connection and for how long.
 *
 * nanomsg accepts every connection offered and checks nothing until a message comes, while grpod's secret is
 * in each message: a flood of idle connections took every descriptor (nanomsg then spun in its accept loop,
 * IPC stopped answering, libmicrohttpd logged at full speed). Here:
 *  - at most max_conns connections at once, of which at most max_pending have not authenticated yet and
 *    max_pending_per_ip of those come from one address. A new connection makes room by closing the oldest
 *    unauthenticated one (of its own address first), or is closed at once when all are authenticated;
 *  - a connection must send the SP header within handshake_s and an authenticated request within
 *    auth_deadline_s of connecting, or it is closed;
 *  - a message may hold max_pending_msg bytes before the connection authenticated, max_msg after (more:
 *    the connection is closed, as nanomsg's NN_RCVMAXSIZE does);
 *  - one request at a time per connection, as REP: reading stops while its answer is written;
 *  - a request the handler says failed (authentication, or garbage) is answered only after failure_delay_s, and
 *    the connection is closed once that answer is out after max_failures of them: guessing costs a peer a
 *    connection per max_failures guesses and a delay for each, and a connection can never be authenticated by
 *    trying on.
 * Clients are unchanged: nanomsg REQ sockets (workers, grpoctl, nanocat) speak this protocol. */
#ifndef GRPO_DAEMON_SP_TCP_H
#define GRPO_DAEMON_SP_TCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

struct sp_limits {
    int max_conns;          /* connections open at once */
    int max_pending;        /* of which not authenticated yet */
    int max_pending_per_ip; /* ... from one address */
    double handshake_s;     /* to send the 8-byte SP header */
    double auth_deadline_s; /* to send a first authenticated request */
    size_t max_msg;         /* bytes in one message, once authenticated */
    size_t max_pending_msg; /* before */
    int max_failures;       /* failed requests on one connection before it is closed (0: no limit) */
    double failure_delay_s; /* a failed request's answer waits this long (the server's timer: up to 0.25 s more) */
};

struct sp_stats {
    int open, pending;                     /* now */
    uint64_t accepted, refused, evicted;   /* refused: closed at once (every connection authenticated) */
    uint64_t timed_out, oversized, broken; /* broken: not SP, bad backtrace */
    uint64_t failures, closed_failing;     /* failed requests (answered late); connections closed for them */
};

/* Handle one request's body; return its answer (malloc'd, never NULL) with *reply_len, and say whether the
 * request carried the endpoint's credentials (*authenticated), or was refused as a failed attempt (*failed: a
 * request that failed authentication, or could not be read). */
typedef uint8_t *(*sp_handler)(void *ud, const uint8_t *msg, size_t len, bool *authenticated, bool *failed,
                               size_t *reply_len);

struct sp_server;

/* Listen on endpoint (tcp://HOST:PORT; HOST "*" is every IPv4 address, [ADDR6] an IPv6 one, else an address,
 * a name or an interface name) in loop. now() is the monotonic clock. NULL with err on failure. */
struct sp_server *sp_server_start(uv_loop_t *loop, const char *endpoint, const struct sp_limits *lim,
                                  sp_handler handler, void *ud, double (*now)(void), char *err, size_t errlen);
/* Change the limits (connections over a new cap are not closed, new ones wait for room). */
void sp_server_set_limits(struct sp_server *s, const struct sp_limits *lim);
/* Counters and the connections open now. */
void sp_server_stats(const struct sp_server *s, struct sp_stats *st);
/* The port bound (useful with port 0). */
int sp_server_port(const struct sp_server *s);
/* Close every connection and the listener; the memory goes when the loop has run their close callbacks. */
void sp_server_stop(struct sp_server *s);

#endif
