/* grpod_bench: load on grpod's control plane, bounded in time, loopback/IPC only.
 *
 * Starts a grpod (the binary given), registers N simulated workers (each with
 * its own REQ socket, spread over a few threads) that heartbeat every
 * interval with a realistic payload, and runs clients that poll the status
 * continuously over the control socket and over HTTP (/api/status). Reports
 * requests per second, heartbeat and status latency percentiles, and grpod's
 * CPU and memory from /proc.
 *
 *   grpod_bench --grpod build/daemon/grpod [--workers 256] [--threads 8] [--pollers 2]
 *               [--http-pollers 1] [--seconds 20] [--interval 1.0] [--tcp]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/hb_payload.h"
#include "common/check.h"
#include "common/clock.h"
#include "proto/protocol.h"
#include "proto/transport.h"

struct samples {
    double *v;
    size_t n, cap;
};

static void sample_add(struct samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(struct samples *s, double p)
{
    if (!s->n)
        return NAN;
    return s->v[(size_t)fmin((double)(s->n - 1), floor(p / 100.0 * (double)s->n))];
}

struct bench {
    const char *endpoint, *secret;
    int workers, threads, pollers, http_pollers, http_port;
    double seconds, interval;
    double start, stop; /* measured window, monotonic */
    atomic_long heartbeats, statuses, https, errors;
};

struct worker_thread {
    struct bench *b;
    int first, count;
    struct samples lat;
    pthread_t t;
};

struct poller {
    struct bench *b;
    struct samples lat;
    pthread_t t;
};

static int do_register(struct rpc_client *rpc, int rank, int world, uint64_t *token)
{
    Grpo__Envelope env = GRPO__ENVELOPE__INIT, *reply;
    Grpo__Register reg = GRPO__REGISTER__INIT;
    char host[32], *caps[] = {"rollout", "trainer"}, *dev[] = {"cuda:0 bench"};
    snprintf(host, sizeof host, "bench%03d", rank / 8);
    reg.rank = rank;
    reg.world_size = world;
    reg.host = host;
    reg.pid = getpid();
    reg.capabilities = caps;
    reg.n_capabilities = 2;
    reg.devices = dev;
    reg.n_devices = 1;
    reg.config_digest = 1;
    env.body_case = GRPO__ENVELOPE__BODY_REGISTER;
    env.register_ = &reg;
    char err[512];
    for (int tries = 0; tries < 50; tries++) {
        if (rpc_call(rpc, &env, 5000, &reply, err, sizeof err) != RPC_OK) {
            fprintf(stderr, "grpod_bench: rank %d: %s\n", rank, err);
            return -1;
        }
        int ok = reply->body_case == GRPO__ENVELOPE__BODY_ASSIGNMENT;
        bool retry = !ok && reply->body_case == GRPO__ENVELOPE__BODY_REPLY && reply->reply->retry;
        if (ok)
            *token = reply->assignment->incarnation;
        else if (!retry)
            fprintf(stderr, "grpod_bench: rank %d refused: %s\n", rank,
                    reply->body_case == GRPO__ENVELOPE__BODY_REPLY ? reply->reply->error : "?");
        protocol_free(reply);
        if (ok)
            return 0;
        if (!retry)
            return -1;
        clock_sleep_s(0.1);
    }
    return -1;
}

static void *worker_main(void *arg)
{
    struct worker_thread *wt = arg;
    struct bench *b = wt->b;
    int n = wt->count;
    struct rpc_client **rpc = xcalloc((size_t)n, sizeof(struct rpc_client *));
    uint64_t *token = xcalloc((size_t)n, sizeof *token);
    double *due = xcalloc((size_t)n, sizeof *due);
    char err[512];
    for (int i = 0; i < n; i++) {
        rpc[i] = rpc_open(b->endpoint, b->secret, err, sizeof err);
        if (!rpc[i] || do_register(rpc[i], wt->first + i, b->workers, &token[i]) != 0) {
            atomic_fetch_add(&b->errors, 1);
            token[i] = 0;
        }
    }
    /* heartbeats spread evenly over the interval */
    while (clock_now_s() < b->start)
        clock_sleep_s(0.01);
    for (int i = 0; i < n; i++)
        due[i] = b->start + b->interval * ((double)(wt->first + i) / b->workers);
    /* a realistic payload: ten verl metrics and four phase timings (bench/hb_payload.h) */
    struct hb_payload payload;
    while (clock_now_s() < b->stop) {
        int next = 0;
        for (int i = 1; i < n; i++)
            if (due[i] < due[next])
                next = i;
        double wait = due[next] - clock_now_s();
        if (wait > 0)
            clock_sleep_s(wait);
        if (clock_now_s() >= b->stop)
            break;
        due[next] += b->interval;
        if (!token[next])
            continue;
        Grpo__Envelope env = GRPO__ENVELOPE__INIT, *reply;
        Grpo__Heartbeat hb = GRPO__HEARTBEAT__INIT;
        double t0 = clock_now_s();
        hb.rank = wt->first + next;
        hb.incarnation = token[next];
        hb.state = GRPO__WORKER_STATE__WORKER_RUNNING;
        hb.step = (int64_t)((t0 - b->start) / 5.0); /* a step every 5 s */
        hb.total_steps = 1000;
        hb.phase = GRPO__PHASE__PHASE_GEN;
        hb.busy_seconds = t0 - b->start;
        hb_payload_set(&payload, &hb);
        hb.checkpoint_step = -1;
        env.body_case = GRPO__ENVELOPE__BODY_HEARTBEAT;
        env.heartbeat = &hb;
        if (rpc_call(rpc[next], &env, 5000, &reply, err, sizeof err) == RPC_OK &&
            reply->body_case == GRPO__ENVELOPE__BODY_HEARTBEAT_ACK) {
            sample_add(&wt->lat, clock_now_s() - t0);
            atomic_fetch_add(&b->heartbeats, 1);
        } else {
            atomic_fetch_add(&b->errors, 1);
        }
        protocol_free(reply);
    }
    for (int i = 0; i < n; i++)
        rpc_close(rpc[i]);
    free(rpc);
    free(token);
    free(due);
    return NULL;
}

static void *status_main(void *arg)
{
    struct poller *p = arg;
    struct bench *b = p->b;
    char err[512];
    struct rpc_client *rpc = rpc_open(b->endpoint, b->secret, err, sizeof err);
    if (!rpc)
        return NULL;
    while (clock_now_s() < b->start)
        clock_sleep_s(0.01);
    while (clock_now_s() < b->stop) {
        Grpo__Envelope env = GRPO__ENVELOPE__INIT, *reply;
        env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
        env.status_request = 1;
        double t0 = clock_now_s();
        if (rpc_call(rpc, &env, 5000, &reply, err, sizeof err) == RPC_OK &&
            reply->body_case == GRPO__ENVELOPE__BODY_STATUS) {
            sample_add(&p->lat, clock_now_s() - t0);
            atomic_fetch_add(&b->statuses, 1);
        } else {
            atomic_fetch_add(&b->errors, 1);
        }
        protocol_free(reply);
    }
    rpc_close(rpc);
    return NULL;
}

/* GET /api/status over HTTP/1.0; 0 when a 200 answer was read to the end. */
static int http_get(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    static const char req[] = "GET /api/status HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
        close(fd);
        return -1;
    }
    char buf[65536];
    ssize_t n, total = 0;
    int ok = 0;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        if (total == 0 && n > 12)
            ok = strncmp(buf + 9, "200", 3) == 0;
        total += n;
    }
    close(fd);
    return ok ? 0 : -1;
}

static void *http_main(void *arg)
{
    struct poller *p = arg;
    struct bench *b = p->b;
    while (clock_now_s() < b->start)
        clock_sleep_s(0.01);
    while (clock_now_s() < b->stop) {
        double t0 = clock_now_s();
        if (http_get(b->http_port) == 0) {
            sample_add(&p->lat, clock_now_s() - t0);
            atomic_fetch_add(&b->https, 1);
        } else {
            atomic_fetch_add(&b->errors, 1);
        }
    }
    return NULL;
}

/* CPU seconds (user + system) and resident memory of a process, from /proc. */
static int proc_usage(pid_t pid, double *cpu_s, double *rss_mib, double *hwm_mib)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p)
        return -1;
    /* after ") ": state, ppid, pgrp, session, tty, tpgid, flags, minflt, cminflt, majflt, cmajflt, utime, stime */
    char *q = (char *)p + 1, *end;
    unsigned long field[13] = {0};
    for (int i = 0; i < 13; i++) {
        while (*q == ' ')
            q++;
        if (i == 0) { /* the state letter */
            q++;
            continue;
        }
        field[i] = strtoul(q, &end, 10);
        if (end == q)
            return -1;
        q = end;
    }
    unsigned long utime = field[11], stime = field[12];
    *cpu_s = (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0)
            *rss_mib = (double)strtol(line + 6, NULL, 10) / 1024.0;
        if (strncmp(line, "VmHWM:", 6) == 0)
            *hwm_mib = (double)strtol(line + 6, NULL, 10) / 1024.0;
    }
    fclose(f);
    return 0;
}

static pid_t spawn_grpod(const char *grpod, const char *dir, const char *endpoint, const char *secret_file)
{
    char a_ep[600], a_state[600], a_secret[600];
    snprintf(a_ep, sizeof a_ep, "grpod.endpoint=%s", endpoint);
    snprintf(a_state, sizeof a_state, "grpod.state_dir=%s/state", dir);
    snprintf(a_secret, sizeof a_secret, "grpod.secret_file=%s", secret_file ? secret_file : "");
    pid_t pid = fork();
    if (pid == 0) {
        setenv("GRPO_LOG_LEVEL", "warn", 1);
        execl(grpod, grpod, a_ep, a_state, a_secret, "grpod.http_listen=127.0.0.1:0", "grpod.heartbeat_timeout_s=10",
              (char *)NULL);
        perror(grpod);
        _exit(127);
    }
    return pid;
}

static int find_http_port(struct bench *b)
{
    char err[512];
    struct rpc_client *rpc = rpc_open(b->endpoint, b->secret, err, sizeof err);
    if (!rpc)
        return -1;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT, *reply;
    env.body_case = GRPO__ENVELOPE__BODY_STATUS_REQUEST;
    env.status_request = 1;
    int port = -1;
    if (rpc_call_retry(rpc, &env, 50, 1000, &reply, err, sizeof err) == RPC_OK) {
        const char *colon =
            reply->body_case == GRPO__ENVELOPE__BODY_STATUS ? strrchr(reply->status->http_url, ':') : NULL;
        port = colon ? (int)strtol(colon + 1, NULL, 10) : -1;
        protocol_free(reply);
    } else {
        fprintf(stderr, "grpod_bench: grpod does not answer: %s\n", err);
    }
    rpc_close(rpc);
    return port;
}

/* A number option, or exit 2 naming it. */
static double number_arg(const char *opt, const char *text)
{
    char *end;
    double v = text ? strtod(text, &end) : 0;
    if (!text || end == text || *end) {
        fprintf(stderr, "grpod_bench: %s expects a number, got '%s'\n", opt, text ? text : "");
        exit(2);
    }
    return v;
}

static void merge(struct samples *into, struct samples *from)
{
    for (size_t i = 0; i < from->n; i++)
        sample_add(into, from->v[i]);
    free(from->v);
}

int main(int argc, char **argv)
{
    struct bench b = {.workers = 256, .threads = 8, .pollers = 2, .http_pollers = 1, .seconds = 20, .interval = 1.0};
    const char *grpod = NULL;
    int tcp = 0;
    static const struct option opts[] = {{"grpod", required_argument, 0, 'g'},
                                         {"workers", required_argument, 0, 'w'},
                                         {"threads", required_argument, 0, 't'},
                                         {"pollers", required_argument, 0, 'p'},
                                         {"http-pollers", required_argument, 0, 'H'},
                                         {"seconds", required_argument, 0, 's'},
                                         {"interval", required_argument, 0, 'i'},
                                         {"tcp", no_argument, 0, 'T'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'g': grpod = optarg; break;
        case 'w': b.workers = (int)number_arg("--workers", optarg); break;
        case 't': b.threads = (int)number_arg("--threads", optarg); break;
        case 'p': b.pollers = (int)number_arg("--pollers", optarg); break;
        case 'H': b.http_pollers = (int)number_arg("--http-pollers", optarg); break;
        case 's': b.seconds = number_arg("--seconds", optarg); break;
        case 'i': b.interval = number_arg("--interval", optarg); break;
        case 'T': tcp = 1; break;
        default:
            fprintf(o == 'h' ? stdout : stderr,
                    "usage: grpod_bench --grpod PATH [--workers 256] [--threads 8] [--pollers 2] [--http-pollers 1]\n"
                    "                   [--seconds 20] [--interval 1.0] [--tcp]\n");
            return o == 'h' ? 0 : 2;
        }
    }
    if (!grpod || b.workers < 1 || b.threads < 1 || b.seconds <= 0 || b.seconds > 600 || b.interval <= 0) {
        fprintf(stderr, "grpod_bench: --grpod PATH is required; --seconds at most 600\n");
        return 2;
    }
    if (b.threads > b.workers)
        b.threads = b.workers;
    signal(SIGPIPE, SIG_IGN);
    char dir[] = "/tmp/grpod-bench-XXXXXX", endpoint[256], secret_file[300];
    CHECK_ALLOC(mkdtemp(dir));
    static const char secret[] = "bench-secret-0123456789";
    if (tcp) {
        int port = 30000 + getpid() % 20000;
        snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
        snprintf(secret_file, sizeof secret_file, "%s/secret", dir);
        FILE *f = CHECK_FOPEN(secret_file, "w");
        fprintf(f, "%s\n", secret);
        CHECK_FCLOSE(f, secret_file);
        chmod(secret_file, 0600);
        b.secret = secret;
    } else {
        snprintf(endpoint, sizeof endpoint, "ipc://%s/ctl.sock", dir);
    }
    b.endpoint = endpoint;
    pid_t pid = spawn_grpod(grpod, dir, endpoint, tcp ? secret_file : NULL);
    b.http_port = find_http_port(&b);
    int rc = 1;
    if (b.http_port <= 0)
        goto out;

    /* registration takes the first seconds; the measured window starts after it */
    double t_reg = clock_now_s();
    b.start = t_reg + 3.0 + b.workers * 0.004;
    b.stop = b.start + b.seconds;
    struct worker_thread *wt = xcalloc((size_t)b.threads, sizeof *wt);
    struct poller *sp = xcalloc((size_t)(b.pollers + b.http_pollers + 1), sizeof *sp);
    for (int i = 0, first = 0; i < b.threads; i++) {
        wt[i].b = &b;
        wt[i].first = first;
        wt[i].count = b.workers / b.threads + (i < b.workers % b.threads);
        first += wt[i].count;
        pthread_create(&wt[i].t, NULL, worker_main, &wt[i]);
    }
    for (int i = 0; i < b.pollers + b.http_pollers; i++) {
        sp[i].b = &b;
        pthread_create(&sp[i].t, NULL, i < b.pollers ? status_main : http_main, &sp[i]);
    }
    while (clock_now_s() < b.start)
        clock_sleep_s(0.05);
    double cpu0 = 0, cpu1 = 0, rss = 0, hwm = 0;
    proc_usage(pid, &cpu0, &rss, &hwm);
    double t0 = clock_now_s();
    while (clock_now_s() < b.stop)
        clock_sleep_s(0.1);
    proc_usage(pid, &cpu1, &rss, &hwm);
    double wall = clock_now_s() - t0;
    struct samples hb = {0}, st = {0}, ht = {0};
    for (int i = 0; i < b.threads; i++) {
        pthread_join(wt[i].t, NULL);
        merge(&hb, &wt[i].lat);
    }
    for (int i = 0; i < b.pollers + b.http_pollers; i++) {
        pthread_join(sp[i].t, NULL);
        merge(i < b.pollers ? &st : &ht, &sp[i].lat);
    }
    if (hb.n)
        qsort(hb.v, hb.n, sizeof *hb.v, cmp_double);
    if (st.n)
        qsort(st.v, st.n, sizeof *st.v, cmp_double);
    if (ht.n)
        qsort(ht.v, ht.n, sizeof *ht.v, cmp_double);
    long nh = atomic_load(&b.heartbeats), ns = atomic_load(&b.statuses), nw = atomic_load(&b.https);
    printf("grpod_bench: %d workers (%d threads, heartbeat every %.2g s), %d status pollers, %d HTTP pollers, "
           "%s, %.0f s\n",
           b.workers, b.threads, b.interval, b.pollers, b.http_pollers, tcp ? "tcp loopback" : "ipc", wall);
    printf("  requests/s      %.0f total: %.0f heartbeats, %.0f status, %.0f HTTP /api/status\n",
           (double)(nh + ns + nw) / wall, (double)nh / wall, (double)ns / wall, (double)nw / wall);
    printf("  heartbeat ms    p50 %.3f  p99 %.3f  max %.3f\n", 1e3 * pct(&hb, 50), 1e3 * pct(&hb, 99),
           hb.n ? 1e3 * hb.v[hb.n - 1] : NAN);
    printf("  status ms       p50 %.3f  p99 %.3f\n", 1e3 * pct(&st, 50), 1e3 * pct(&st, 99));
    printf("  HTTP status ms  p50 %.3f  p99 %.3f\n", 1e3 * pct(&ht, 50), 1e3 * pct(&ht, 99));
    printf("  grpod           CPU %.1f%% of one core, RSS %.1f MiB (peak %.1f MiB)\n", 100.0 * (cpu1 - cpu0) / wall,
           rss, hwm);
    printf("  errors          %ld\n", atomic_load(&b.errors));
    rc = atomic_load(&b.errors) ? 1 : 0;
    free(hb.v);
    free(st.v);
    free(ht.v);
    free(wt);
    free(sp);
out:
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "grpod_bench: could not remove %s\n", dir);
    return rc;
}
