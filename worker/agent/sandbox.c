/* The code interpreter's sandbox: bubblewrap (namespaces, mounts), setrlimit in the child before bwrap starts,
 * a seccomp program built with libseccomp and handed to bwrap as BPF, and the parent's wait on a pidfd and the
 * output pipe with a deadline. Owns every process it starts: when a call ends, whatever its end, the sandbox's
 * PID namespace is gone (its first process killed, which takes every other one with it, and waited for). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/check.h"
#include "common/clock.h"
#include "worker/agent/sandbox.h"

/* code longer than this goes in as a read-only file rather than an argument (MAX_ARG_STRLEN is 128 KiB) */
#define CODE_ARG_MAX (64 * 1024)
/* the dedicated host uids a root caller runs the sandbox under: one per call, so that RLIMIT_NPROC (which
 * root ignores, and which counts per uid) bounds this call's processes only */
#define SANDBOX_UID_BASE 0x70000000u
/* how long to wait for a killed sandbox's processes to be gone (they die of SIGKILL; this only bounds a bug) */
#define REAP_WAIT_S 10.0

void sandbox_limits_default(struct sandbox_limits *l)
{
    memset(l, 0, sizeof *l);
    l->wall_s = 10;
    l->cpu_s = 5;
    l->memory_bytes = 512ull << 20;
    l->max_procs = 64;
    l->max_output = 64 << 10;
    l->tmpfs_bytes = 64ull << 20;
    snprintf(l->python, sizeof l->python, "/usr/bin/python3");
    snprintf(l->bwrap, sizeof l->bwrap, "/usr/bin/bwrap");
}

void sandbox_result_free(struct sandbox_result *r)
{
    free(r->output);
    memset(r, 0, sizeof *r);
}

/* ---- the seccomp program, built once ---- */

/* answered EPERM: debugging other processes, the kernel's mount/namespace/keyring/module/BPF/perf/time
 * interfaces, and io_uring (a second path around this filter) */
static const char *const DENIED_SYSCALLS[] = {
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "process_madvise",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "quotactl",
    "quotactl_fd",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "vhangup",
    "uselib",
    "fanotify_init",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
};

static pthread_once_t bpf_once = PTHREAD_ONCE_INIT;
static unsigned char *bpf_prog;
static size_t bpf_len;
static char bpf_err[256];

static void build_bpf(void)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx) {
        snprintf(bpf_err, sizeof bpf_err, "seccomp_init failed");
        return;
    }
    int rc = 0;
    for (size_t i = 0; i < sizeof DENIED_SYSCALLS / sizeof *DENIED_SYSCALLS && rc == 0; i++) {
        const int nr = seccomp_syscall_resolve_name(DENIED_SYSCALLS[i]);
        if (nr != __NR_SCMP_ERROR) /* a name this architecture lacks has nothing to deny */
            rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    }
    /* new namespaces through clone: refused; clone3 (whose flags a filter cannot read) says ENOSYS, so the C
     * library falls back to clone, which is checked */
    static const unsigned long NS_FLAGS[] = {CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,   CLONE_NEWNET,
                                             CLONE_NEWIPC,  CLONE_NEWUTS, CLONE_NEWCGROUP};
    for (size_t i = 0; i < sizeof NS_FLAGS / sizeof *NS_FLAGS && rc == 0; i++)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                              SCMP_A0(SCMP_CMP_MASKED_EQ, NS_FLAGS[i], NS_FLAGS[i]));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    /* sockets: AF_UNIX only (the network namespace has no route out anyway) */
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socket), 1, SCMP_A0(SCMP_CMP_NE, AF_UNIX));
    if (rc == 0)
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(socketpair), 1, SCMP_A0(SCMP_CMP_NE, AF_UNIX));
    if (rc != 0) {
        snprintf(bpf_err, sizeof bpf_err, "seccomp rule: %s", strerror(-rc));
        seccomp_release(ctx);
        return;
    }
    const int fd = memfd_create("grpo-seccomp", MFD_CLOEXEC);
    if (fd < 0 || (rc = seccomp_export_bpf(ctx, fd)) != 0) {
        snprintf(bpf_err, sizeof bpf_err, "seccomp_export_bpf: %s", fd < 0 ? strerror(errno) : strerror(-rc));
    } else {
        struct stat st;
        if (fstat(fd, &st) == 0 && st.st_size > 0) {
            bpf_prog = xmalloc((size_t)st.st_size);
            if (pread(fd, bpf_prog, (size_t)st.st_size, 0) == st.st_size) {
                bpf_len = (size_t)st.st_size;
            } else {
                free(bpf_prog);
                bpf_prog = NULL;
            }
        }
        if (!bpf_prog)
            snprintf(bpf_err, sizeof bpf_err, "cannot read the exported seccomp program");
    }
    if (fd >= 0)
        close(fd);
    seccomp_release(ctx);
}

/* ---- one run ---- */

static int pidfd_open_(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

static int memfd_with(const char *name, const void *data, size_t len)
{
    const int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    for (size_t off = 0; off < len;) {
        const ssize_t k = write(fd, (const char *)data + off, len - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)k;
    }
    if (lseek(fd, 0, SEEK_SET) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

struct argv_buf {
    char *v[96];
    int n;
    char store[8][64]; /* numbers formatted for the argument vector */
    int ns;
};

static void arg(struct argv_buf *a, const char *s)
{
    if (a->n < (int)(sizeof a->v / sizeof *a->v) - 1)
        a->v[a->n++] = (char *)s;
}

static const char *num(struct argv_buf *a, unsigned long long x)
{
    if (a->ns >= 8)
        return "0";
    snprintf(a->store[a->ns], sizeof a->store[a->ns], "%llu", x);
    return a->store[a->ns++];
}

/* /bin, /lib ... as the host has them: merged-/usr links become the same links, real directories read-only
 * binds; link targets are kept in links[] */
static void root_dirs(struct argv_buf *a, char links[][128])
{
    static const char *const DIRS[] = {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"};
    for (size_t i = 0; i < sizeof DIRS / sizeof *DIRS; i++) {
        struct stat st;
        if (lstat(DIRS[i], &st) != 0)
            continue;
        if (S_ISLNK(st.st_mode)) {
            const ssize_t k = readlink(DIRS[i], links[i], 127);
            if (k <= 0)
                continue;
            links[i][k] = '\0';
            arg(a, "--symlink"), arg(a, links[i]), arg(a, DIRS[i]);
        } else if (S_ISDIR(st.st_mode)) {
            arg(a, "--ro-bind"), arg(a, DIRS[i]), arg(a, DIRS[i]);
        }
    }
}

static void set_limit(int res, rlim_t soft, rlim_t hard)
{
    const struct rlimit r = {soft, hard};
    (void)setrlimit(res, &r);
}

static void child_fail(const char *what)
{
    /* only async-signal-safe calls between fork and exec */
    static const char pre[] = "sandbox: cannot start: ";
    (void)!write(2, pre, sizeof pre - 1);
    (void)!write(2, what, strlen(what));
    (void)!write(2, "\n", 1);
    _exit(127);
}

/* the parsed "child-pid" of bwrap's --info-fd JSON, 0 until it has come */
static pid_t info_child_pid(const char *s)
{
    const char *p = strstr(s, "\"child-pid\"");
    if (!p || !(p = strchr(p, ':')))
        return 0;
    p++;
    while (*p == ' ' || *p == '\t' || *p == '\n')
        p++;
    long v = 0;
    const char *d = p;
    while (*d >= '0' && *d <= '9')
        v = v * 10 + (*d++ - '0');
    if (d == p || !*d) /* the number may not be complete yet */
        return 0;
    return (pid_t)v;
}

/* wait until fd polls readable or the deadline passes; 1 when readable */
static int wait_fd(int fd, double deadline)
{
    for (;;) {
        const double left = deadline - clock_now_s();
        if (left <= 0)
            return 0;
        struct pollfd p = {fd, POLLIN, 0};
        const int k = poll(&p, 1, (int)(left * 1000) + 1);
        if (k > 0)
            return 1;
        if (k < 0 && errno != EINTR)
            return 0;
    }
}

int sandbox_run_python(const struct sandbox_limits *l, const char *code, struct sandbox_result *r, char *err,
                       size_t errlen)
{
    memset(r, 0, sizeof *r);
    pthread_once(&bpf_once, build_bpf);
    if (!bpf_prog)
        return error_set(err, errlen, "no seccomp filter: %s", bpf_err);
    if (l->python[0] != '/' || strncmp(l->python, "/usr/", 5) != 0)
        return error_set(err, errlen, "python '%s' is not an absolute path under /usr (the sandbox sees /usr only)",
                         l->python);
    if (access(l->bwrap, X_OK) != 0)
        return error_set(err, errlen, "bubblewrap: %s: %s", l->bwrap, strerror(errno));

    const size_t code_len = strlen(code);
    const int code_as_file = code_len > CODE_ARG_MAX;
    int outp[2] = {-1, -1}, infop[2] = {-1, -1}, sfd = -1, cfd = -1, nullfd = -1;
    int ok = pipe2(outp, O_CLOEXEC) == 0 && pipe2(infop, O_CLOEXEC) == 0 &&
             (sfd = memfd_with("grpo-seccomp", bpf_prog, bpf_len)) >= 0 &&
             (!code_as_file || (cfd = memfd_with("grpo-code", code, code_len)) >= 0) &&
             (nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;
    if (!ok) {
        error_set(err, errlen, "sandbox set-up: %s", strerror(errno));
        goto fail_fds;
    }

    /* the argument vector and environment, built before fork (the child only makes system calls) */
    static atomic_uint call_counter;
    const uid_t host_uid =
        SANDBOX_UID_BASE + (((unsigned)getpid() & 0xffffu) << 8) + (atomic_fetch_add(&call_counter, 1) & 0xffu);
    struct argv_buf a = {0};
    char links[6][128];
    arg(&a, l->bwrap);
    arg(&a, "--unshare-user"), arg(&a, "--unshare-ipc"), arg(&a, "--unshare-pid"), arg(&a, "--unshare-net");
    arg(&a, "--unshare-uts"), arg(&a, "--unshare-cgroup-try"), arg(&a, "--disable-userns");
    arg(&a, "--die-with-parent"), arg(&a, "--new-session");
    arg(&a, "--uid"), arg(&a, "65534"), arg(&a, "--gid"), arg(&a, "65534"), arg(&a, "--hostname"), arg(&a, "sandbox");
    arg(&a, "--ro-bind"), arg(&a, "/usr"), arg(&a, "/usr");
    root_dirs(&a, links);
    arg(&a, "--ro-bind-try"), arg(&a, "/etc/ld.so.cache"), arg(&a, "/etc/ld.so.cache");
    arg(&a, "--proc"), arg(&a, "/proc"), arg(&a, "--dev"), arg(&a, "/dev");
    const char *size = num(&a, l->tmpfs_bytes);
    arg(&a, "--size"), arg(&a, size), arg(&a, "--tmpfs"), arg(&a, "/dev/shm"); /* POSIX semaphores, shm_open */
    arg(&a, "--remount-ro"), arg(&a, "/dev");
    arg(&a, "--size"), arg(&a, size), arg(&a, "--tmpfs"), arg(&a, "/tmp");
    if (code_as_file)
        arg(&a, "--ro-bind-data"), arg(&a, "5"), arg(&a, "/code.py");
    arg(&a, "--remount-ro"), arg(&a, "/");
    arg(&a, "--chdir"), arg(&a, "/tmp");
    arg(&a, "--seccomp"), arg(&a, "3"), arg(&a, "--info-fd"), arg(&a, "4");
    arg(&a, "--"), arg(&a, l->python), arg(&a, "-I"), arg(&a, "-u");
    if (code_as_file)
        arg(&a, "/code.py");
    else
        arg(&a, "-c"), arg(&a, code);
    a.v[a.n] = NULL;
    char *envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp", "LANG=C.UTF-8", NULL};
    const int drop_uid = geteuid() == 0;
    const rlim_t cpu = l->cpu_s > 0 ? (rlim_t)(l->cpu_s + 0.999) : 1;

    const pid_t pid = fork();
    if (pid < 0) {
        error_set(err, errlen, "fork: %s", strerror(errno));
        goto fail_fds;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        struct sigaction dfl = {0};
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &dfl, NULL);
        sigaction(SIGCHLD, &dfl, NULL);
        /* the sources out of the way of their targets 0..5, then into place */
        const int hn = fcntl(nullfd, F_DUPFD, 32), ho = fcntl(outp[1], F_DUPFD, 32), hs = fcntl(sfd, F_DUPFD, 32),
                  hi = fcntl(infop[1], F_DUPFD, 32), hc = cfd >= 0 ? fcntl(cfd, F_DUPFD, 32) : -2;
        if (hn < 0 || ho < 0 || hs < 0 || hi < 0 || hc == -1)
            child_fail("fcntl");
        if (dup2(hn, 0) < 0 || dup2(ho, 1) < 0 || dup2(ho, 2) < 0 || dup2(hs, 3) < 0 || dup2(hi, 4) < 0 ||
            (hc >= 0 && dup2(hc, 5) < 0))
            child_fail("dup2");
        if (close_range(hc >= 0 ? 6 : 5, ~0u, 0) != 0)
            child_fail("close_range");
        if (chdir("/") != 0)
            child_fail("chdir /");
        set_limit(RLIMIT_CPU, cpu, cpu + 1);
        set_limit(RLIMIT_AS, l->memory_bytes, l->memory_bytes);
        set_limit(RLIMIT_NPROC, (rlim_t)l->max_procs, (rlim_t)l->max_procs);
        set_limit(RLIMIT_CORE, 0, 0);
        set_limit(RLIMIT_FSIZE, l->tmpfs_bytes, l->tmpfs_bytes);
        set_limit(RLIMIT_NOFILE, 256, 256);
        set_limit(RLIMIT_MEMLOCK, 0, 0);
        set_limit(RLIMIT_MSGQUEUE, 0, 0);
        if (drop_uid && (setgroups(0, NULL) != 0 || setresgid(host_uid, host_uid, host_uid) != 0 ||
                         setresuid(host_uid, host_uid, host_uid) != 0))
            child_fail("cannot drop to the sandbox's uid");
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
            child_fail("no_new_privs");
        execve(l->bwrap, a.v, envp);
        child_fail("exec bwrap");
    }
    close(outp[1]), close(infop[1]), close(sfd), close(nullfd);
    if (cfd >= 0)
        close(cfd);

    const int pfd = pidfd_open_(pid);
    if (pfd < 0) { /* no pidfd (a kernel before 5.3): nothing to wait on safely; stop it */
        error_set(err, errlen, "pidfd_open: %s", strerror(errno));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(outp[0]), close(infop[0]);
        return -1;
    }
    const double deadline = clock_now_s() + (l->wall_s > 0 ? l->wall_s : 1);
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap);
    char info[256];
    size_t ilen = 0;
    pid_t inner = 0;
    int inner_fd = -1, out_open = 1, info_open = 1, exited = 0, status = 0, kill_now = 0;
    while ((out_open || !exited) && !kill_now) {
        struct pollfd p[3];
        int n = 0, io = -1, ii = -1, ip = -1;
        if (out_open)
            io = n, p[n++] = (struct pollfd){outp[0], POLLIN, 0};
        if (info_open)
            ii = n, p[n++] = (struct pollfd){infop[0], POLLIN, 0};
        if (!exited)
            ip = n, p[n++] = (struct pollfd){pfd, POLLIN, 0};
        const double left = deadline - clock_now_s();
        if (left <= 0) {
            r->wall_killed = kill_now = 1;
            break;
        }
        const int k = poll(p, (nfds_t)n, (int)(left * 1000) + 1);
        if (k < 0 && errno != EINTR) {
            kill_now = 1;
            break;
        }
        if (k <= 0)
            continue;
        if (io >= 0 && p[io].revents) {
            if (cap - len < 65536 + 1) {
                cap = cap * 2 > len + 65536 + 1 ? cap * 2 : len + 65536 + 1;
                buf = xrealloc(buf, cap);
            }
            const ssize_t got = read(outp[0], buf + len, 65536);
            if (got > 0) {
                len += (size_t)got;
                if (len > l->max_output) {
                    len = l->max_output;
                    r->output_cut = kill_now = 1;
                }
            } else if (got == 0 || errno != EINTR) {
                out_open = 0;
            }
        }
        if (ii >= 0 && p[ii].revents) {
            const ssize_t got = read(infop[0], info + ilen, sizeof info - 1 - ilen);
            if (got > 0) {
                ilen += (size_t)got;
                info[ilen] = '\0';
                if (!inner && (inner = info_child_pid(info)) > 0)
                    inner_fd = pidfd_open_(inner);
            }
            if (got == 0 || (got < 0 && errno != EINTR) || ilen == sizeof info - 1)
                info_open = 0;
        }
        if (ip >= 0 && p[ip].revents) {
            if (waitpid(pid, &status, 0) == pid)
                exited = 1;
        }
    }
    if (kill_now) {
        /* the namespace's first process: killing it kills every process of the namespace */
        if (inner_fd >= 0)
            syscall(SYS_pidfd_send_signal, inner_fd, SIGKILL, NULL, 0);
        kill(pid, SIGKILL); /* and bwrap outside; --die-with-parent kills the inside too */
    }
    if (!exited) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
    }
    /* the sandbox is gone when its first process is: the kernel kills and reaps the rest of the namespace
     * before that process's exit is seen */
    if (!inner && info_open) { /* killed before bwrap told its pid: the info pipe closes with bwrap */
        const double until = clock_now_s() + REAP_WAIT_S;
        while (!inner && wait_fd(infop[0], until)) {
            const ssize_t got = read(infop[0], info + ilen, sizeof info - 1 - ilen);
            if (got <= 0)
                break;
            ilen += (size_t)got;
            info[ilen] = '\0';
            if ((inner = info_child_pid(info)) > 0)
                inner_fd = pidfd_open_(inner);
        }
    }
    if (inner_fd >= 0) {
        if (!wait_fd(inner_fd, clock_now_s() + REAP_WAIT_S)) {
            syscall(SYS_pidfd_send_signal, inner_fd, SIGKILL, NULL, 0);
            wait_fd(inner_fd, clock_now_s() + REAP_WAIT_S);
        }
        close(inner_fd);
    }
    close(pfd), close(outp[0]), close(infop[0]);
    buf[len] = '\0';
    r->output = buf;
    r->len = len;
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 0;
    return 0;

fail_fds:
    for (int i = 0; i < 2; i++) {
        if (outp[i] >= 0)
            close(outp[i]);
        if (infop[i] >= 0)
            close(infop[i]);
    }
    if (sfd >= 0)
        close(sfd);
    if (cfd >= 0)
        close(cfd);
    if (nullfd >= 0)
        close(nullfd);
    return -1;
}

/* ---- the probe ---- */

struct probe {
    char key[520];
    int ok;
    char why[256];
};
static struct probe probes[4];
static int nprobes;
static pthread_mutex_t probe_mu = PTHREAD_MUTEX_INITIALIZER;

int sandbox_available(const struct sandbox_limits *l, char *why, size_t whylen)
{
    char key[520];
    snprintf(key, sizeof key, "%s\n%s", l->bwrap, l->python);
    pthread_mutex_lock(&probe_mu);
    for (int i = 0; i < nprobes; i++)
        if (strcmp(probes[i].key, key) == 0) {
            const int ok = probes[i].ok;
            snprintf(why, whylen, "%s", probes[i].why);
            pthread_mutex_unlock(&probe_mu);
            return ok;
        }
    struct sandbox_limits pl = *l;
    if (pl.wall_s < 10)
        pl.wall_s = 10;
    pl.max_output = 4096;
    struct sandbox_result res;
    char err[256] = "";
    int ok = 0;
    char w[256] = "";
    if (sandbox_run_python(&pl, "print('sandbox-ok')", &res, err, sizeof err) != 0) {
        snprintf(w, sizeof w, "%s", err);
    } else {
        ok = res.exit_code == 0 && strcmp(res.output, "sandbox-ok\n") == 0;
        if (!ok) {
            char *nl;
            while ((nl = strchr(res.output, '\n')) != NULL && nl[1]) /* one line of bwrap's complaint */
                *nl = ' ';
            if ((nl = strchr(res.output, '\n')) != NULL)
                *nl = '\0';
            snprintf(w, sizeof w, "the test program gave exit status %d: %.200s", res.exit_code,
                     res.len ? res.output : "(no output)");
        }
        sandbox_result_free(&res);
    }
    if (nprobes < 4) {
        snprintf(probes[nprobes].key, sizeof probes[nprobes].key, "%s", key);
        probes[nprobes].ok = ok;
        snprintf(probes[nprobes].why, sizeof probes[nprobes].why, "%s", w);
        nprobes++;
    }
    pthread_mutex_unlock(&probe_mu);
    snprintf(why, whylen, "%s", w);
    return ok;
}
