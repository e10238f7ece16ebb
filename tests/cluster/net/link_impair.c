// link_impair: a packet-level link impairment in user space, for kernels without the netem qdisc (the cluster
// suite's hosts_lib.sh uses it when `tc qdisc add ... netem` is refused). It sits on the data path between two
// TAP devices: every Ethernet frame read from one is dropped with probability LOSS, or held DELAY and then
// written to the other, both ways. Frames leave in the order they came (one FIFO per direction, a constant
// delay), as netem does by default; a direction holding LIMIT frames drops new ones (netem's `limit`, default
// 1000 there too).
//
// TAP devices without offloads (no TUNSETOFFLOAD) get their frames from the kernel already segmented to the MTU
// and with full checksums, so a frame here is a frame on the wire, and what is written back needs no fixing.
//
// usage: link_impair TAP_A TAP_B [loss P%] [delay Nms|Ns|Nus] [limit FRAMES] [seed N]
//   TAP_A and TAP_B exist already (ip tuntap add dev NAME mode tap); on SIGTERM or SIGINT the counters of each
//   direction are printed and it exits 0; SIGUSR1 prints them and goes on. Exit 2 on bad arguments.
// Test helper only: not installed.
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define FRAME_MAX 65536 // larger than any frame a TAP device hands out (its MTU plus headers)

typedef struct {
    int64_t due_ns; // when the frame leaves (CLOCK_MONOTONIC)
    size_t len;
    uint8_t *data;
} Held;

// one direction: frames read from in_fd, held, written to out_fd
typedef struct {
    const char *from, *to;
    int in_fd, out_fd;
    Held *ring; // limit slots, head..head+count-1 held in arrival order
    size_t head, count;
    uint64_t frames, lost, over_limit, sent, send_errors;
} Direction;

typedef struct {
    double loss;      // probability a frame is dropped, 0..1
    int64_t delay_ns; // how long each frame is held
    size_t limit;     // frames held per direction at most
    uint64_t seed;
} Impairment;

static volatile sig_atomic_t stop_requested, report_requested;

static void on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}
static void on_report(int sig)
{
    (void)sig;
    report_requested = 1;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// splitmix64: small, seedable, good enough for Bernoulli draws
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static double uniform01(uint64_t *state) { return (double)(next_random(state) >> 11) * 0x1.0p-53; }

// usage_error: the message, the usage line, exit 2
static void usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "link_impair: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: link_impair TAP_A TAP_B [loss P%%] [delay Nms|Ns|Nus] [limit FRAMES] [seed N]\n");
    exit(2);
}

// parse_loss "5%" -> 0.05
static double parse_loss(const char *s)
{
    char *end;
    errno = 0;
    double pct = strtod(s, &end);
    if (errno || end == s || strcmp(end, "%") != 0 || !(pct >= 0 && pct <= 100))
        usage_error("loss '%s': want a percentage from 0%% to 100%% with its %% sign, e.g. 5%%", s);
    return pct / 100;
}

// parse_delay "50ms" / "0.05s" / "500us" -> nanoseconds
static int64_t parse_delay(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double scale = 0;
    if (strcmp(end, "ms") == 0)
        scale = 1e6;
    else if (strcmp(end, "s") == 0)
        scale = 1e9;
    else if (strcmp(end, "us") == 0)
        scale = 1e3;
    if (errno || end == s || scale == 0 || !(v >= 0 && v * scale <= 60e9))
        usage_error("delay '%s': want a time from 0 to 60 s with its unit (us, ms or s), e.g. 50ms", s);
    return (int64_t)(v * scale + 0.5);
}

static uint64_t parse_count(const char *what, const char *s, uint64_t lo, uint64_t hi)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi) {
        if (strcmp(what, "limit") == 0)
            usage_error("limit '%s': want a whole number of frames from 1 to 1000000", s);
        usage_error("seed '%s': want a whole number", s);
    }
    return v;
}

// attach_tap NAME: a non-blocking descriptor on the existing TAP device NAME, or exit 1 saying why
static int attach_tap(const char *name)
{
    if (strlen(name) >= IFNAMSIZ)
        usage_error("'%s' is too long for an interface name", name);
    if (if_nametoindex(name) == 0) {
        fprintf(stderr, "link_impair: no interface %s: make it first (ip tuntap add dev %s mode tap)\n", name, name);
        exit(1);
    }
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "link_impair: cannot open /dev/net/tun: %s\n", strerror(errno));
        exit(1);
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI; // no offloads asked for: the kernel segments and checksums for us
    memcpy(ifr.ifr_name, name, strlen(name) + 1);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        fprintf(stderr, "link_impair: cannot attach to %s (is it a TAP device, without a process on it?): %s\n", name,
                strerror(errno));
        exit(1);
    }
    return fd;
}

static void report(const Direction *d)
{
    double pct = d->frames ? 100.0 * (double)d->lost / (double)d->frames : 0;
    fprintf(stderr,
            "link_impair: %s -> %s: %llu frames, %llu lost (%.2f%%), %llu over the limit, %llu delivered, "
            "%llu send errors\n",
            d->from, d->to, (unsigned long long)d->frames, (unsigned long long)d->lost, pct,
            (unsigned long long)d->over_limit, (unsigned long long)d->sent, (unsigned long long)d->send_errors);
}

// take_in: read the frames waiting on d's input (at most 256, so that a flood does not hold back the frames due
// out); each is lost, refused over the limit, or held
static void take_in(Direction *d, const Impairment *im, uint64_t *rng, uint8_t *buf)
{
    for (int taken = 0; taken < 256; taken++) {
        ssize_t n = read(d->in_fd, buf, FRAME_MAX);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                fprintf(stderr, "link_impair: read from %s: %s\n", d->from, strerror(errno));
            return;
        }
        if (n == 0)
            return;
        d->frames++;
        if (im->loss > 0 && uniform01(rng) < im->loss) {
            d->lost++;
            continue;
        }
        if (d->count == im->limit) {
            d->over_limit++;
            continue;
        }
        uint8_t *copy = malloc((size_t)n);
        if (!copy) {
            d->over_limit++;
            continue;
        }
        memcpy(copy, buf, (size_t)n);
        Held *h = &d->ring[(d->head + d->count) % im->limit];
        *h = (Held){.due_ns = now_ns() + im->delay_ns, .len = (size_t)n, .data = copy};
        d->count++;
    }
}

// send_due: write every held frame whose time has come, in order
static void send_due(Direction *d, const Impairment *im, int64_t now)
{
    while (d->count > 0 && d->ring[d->head].due_ns <= now) {
        Held *h = &d->ring[d->head];
        ssize_t n = write(d->out_fd, h->data, h->len);
        if (n == (ssize_t)h->len)
            d->sent++;
        else
            d->send_errors++;
        free(h->data);
        h->data = NULL;
        d->head = (d->head + 1) % im->limit;
        d->count--;
    }
}

int main(int argc, char **argv)
{
    if (argc < 3 || (argc - 3) % 2 != 0)
        usage_error("%s", argc < 3 ? "two TAP devices wanted" : "each option wants a value");
    Impairment im = {.loss = 0, .delay_ns = 0, .limit = 1000, .seed = (uint64_t)now_ns() ^ (uint64_t)getpid()};
    for (int i = 3; i < argc; i += 2) {
        const char *key = argv[i], *val = argv[i + 1];
        if (strcmp(key, "loss") == 0)
            im.loss = parse_loss(val);
        else if (strcmp(key, "delay") == 0)
            im.delay_ns = parse_delay(val);
        else if (strcmp(key, "limit") == 0)
            im.limit = parse_count("limit", val, 1, 1000000);
        else if (strcmp(key, "seed") == 0)
            im.seed = parse_count("seed", val, 0, UINT64_MAX);
        else
            usage_error("unknown option '%s' (known: loss, delay, limit, seed)", key);
    }
    int fd_a = attach_tap(argv[1]), fd_b = attach_tap(argv[2]);
    Direction dirs[2] = {
        {.from = argv[1], .to = argv[2], .in_fd = fd_a, .out_fd = fd_b},
        {.from = argv[2], .to = argv[1], .in_fd = fd_b, .out_fd = fd_a},
    };
    uint8_t *buf = malloc(FRAME_MAX);
    dirs[0].ring = calloc(im.limit, sizeof(Held));
    dirs[1].ring = calloc(im.limit, sizeof(Held));
    if (!buf || !dirs[0].ring || !dirs[1].ring) {
        fprintf(stderr, "link_impair: out of memory for %zu held frames\n", im.limit);
        return 1;
    }

    // the signals are taken only inside ppoll, so none is lost between a check and the wait
    sigset_t blocked, during_wait;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGUSR1);
    sigprocmask(SIG_BLOCK, &blocked, &during_wait);
    sigdelset(&during_wait, SIGTERM);
    sigdelset(&during_wait, SIGINT);
    sigdelset(&during_wait, SIGUSR1);
    struct sigaction sa = {.sa_handler = on_stop};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_report;
    sigaction(SIGUSR1, &sa, NULL);

    fprintf(stderr, "link_impair: forwarding %s <-> %s: loss %g%%, delay %.3f ms each way, limit %zu frames\n", argv[1],
            argv[2], im.loss * 100, (double)im.delay_ns / 1e6, im.limit);
    uint64_t rng = im.seed;
    while (!stop_requested) {
        if (report_requested) {
            report_requested = 0;
            report(&dirs[0]);
            report(&dirs[1]);
        }
        int64_t now = now_ns(), wait_ns = -1;
        for (int k = 0; k < 2; k++) {
            if (dirs[k].count == 0)
                continue;
            int64_t left = dirs[k].ring[dirs[k].head].due_ns - now;
            if (left < 0)
                left = 0;
            if (wait_ns < 0 || left < wait_ns)
                wait_ns = left;
        }
        struct timespec ts = {.tv_sec = wait_ns / 1000000000, .tv_nsec = wait_ns % 1000000000};
        struct pollfd pfd[2] = {{.fd = fd_a, .events = POLLIN}, {.fd = fd_b, .events = POLLIN}};
        int r = ppoll(pfd, 2, wait_ns < 0 ? NULL : &ts, &during_wait);
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "link_impair: poll: %s\n", strerror(errno));
            return 1;
        }
        for (int k = 0; k < 2 && r > 0; k++) {
            if (pfd[k].revents & POLLIN)
                take_in(&dirs[k], &im, &rng, buf);
            else if (pfd[k].revents & (POLLERR | POLLHUP | POLLNVAL)) {
                fprintf(stderr, "link_impair: %s is gone (poll: 0x%x)\n", dirs[k].from, (unsigned)pfd[k].revents);
                return 1;
            }
        }
        now = now_ns();
        send_due(&dirs[0], &im, now);
        send_due(&dirs[1], &im, now);
    }
    report(&dirs[0]);
    report(&dirs[1]);
    return 0;
}
