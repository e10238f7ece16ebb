#include "procgroup.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* Wait up to grace_s (< 0: without bound) for pid to exit, leaving it unreaped. */
static void wait_unreaped(pid_t pid, double grace_s)
{
    siginfo_t si;
    if (grace_s < 0) {
        while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR)
            ;
        return;
    }
    const int fd = (int)syscall(SYS_pidfd_open, pid, 0u); /* readable once it has exited */
    if (fd < 0)
        return; /* no pidfd (a kernel before 5.3): no grace, it is killed */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, (int)ceil(grace_s * 1000.0)) < 0 && errno == EINTR)
        ;
    close(fd);
}

int procgroup_end(pid_t pid, double grace_s)
{
    if (grace_s != 0)
        wait_unreaped(pid, grace_s);
    kill(-pid, SIGKILL); /* what it left behind in its group */
    kill(pid, SIGKILL);  /* and itself, were it not yet its group's leader */
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}
