/* The sandbox the code interpreter runs model-written code in. Owns: building the sandbox (bubblewrap's
 * namespaces and mounts, resource limits, a seccomp filter made with libseccomp), running one program in it,
 * the waits (on a pidfd and the output pipe, never a sleep), and killing the whole process tree when a limit is
 * hit or the call ends. docs/tools.md says what it blocks and what it does not.
 *
 * The sandbox: bwrap with new user, mount, PID, network, IPC, UTS and cgroup namespaces; /usr and the /lib and
 * /bin links read-only, /etc hidden but for ld.so.cache, a fresh tmpfs (size-limited) as cwd and /tmp, the rest
 * of the root read-only; no network but an unconfigured loopback; no capabilities, no new privileges, no further
 * user namespaces; a seccomp filter answering EPERM to ptrace, mount, unshare, setns, kexec, bpf, perf_event_open,
 * keyctl, module loading and more, and to sockets other than AF_UNIX. Run by root, the program runs under a
 * dedicated unprivileged host uid (so the process-count limit holds). Limits: CPU time, wall time, address
 * space, processes, output bytes, tmpfs size. */
#ifndef GRPO_AGENT_SANDBOX_H
#define GRPO_AGENT_SANDBOX_H

#include <stddef.h>

struct sandbox_limits {
    double wall_s;       /* wall time of the whole call; past it the process tree is killed (default 10) */
    double cpu_s;        /* CPU seconds per process, RLIMIT_CPU (SIGXCPU, then SIGKILL a second later) (5) */
    size_t memory_bytes; /* address space per process, RLIMIT_AS (512 MiB) */
    int max_procs;       /* processes and threads of the sandbox's uid, RLIMIT_NPROC (64) */
    size_t max_output;   /* stdout+stderr bytes read; past it the process tree is killed (64 KiB) */
    size_t tmpfs_bytes;  /* size of the writable tmpfs (cwd and /tmp) (64 MiB) */
    char python[256];    /* the interpreter inside the sandbox, an absolute path under /usr (/usr/bin/python3) */
    char bwrap[256];     /* bubblewrap's path (/usr/bin/bwrap) */
};
void sandbox_limits_default(struct sandbox_limits *l);

struct sandbox_result {
    char *output; /* stdout and stderr, interleaved as written, NUL-terminated (malloc'd) */
    size_t len;
    int exit_code;   /* the program's exit status; 128+N when it was killed by signal N */
    int wall_killed; /* the wall-time limit was hit and the tree killed */
    int output_cut;  /* more than max_output bytes came and the tree was killed */
};
void sandbox_result_free(struct sandbox_result *r);

/* Whether a sandbox can be made here with these limits (bwrap and python present, namespaces allowed, the filter
 * loads): runs a trivial program once per (bwrap, python) pair and remembers the answer. 1, or 0 with why. */
int sandbox_available(const struct sandbox_limits *l, char *why, size_t whylen);

/* Run `python -I -u -c CODE` (a longer CODE as a read-only file) in the sandbox with stdin empty. 0 with r filled
 * (whatever the program did), or -1 with err when the sandbox could not be started. Waits for every process of
 * the sandbox to be gone before it returns. Safe to call from several threads. */
int sandbox_run_python(const struct sandbox_limits *l, const char *code, struct sandbox_result *r, char *err,
                       size_t errlen);

#endif
