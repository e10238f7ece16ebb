#include "dirlock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int dirlock_take(const char *dir, const char *name, const char *what, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    /* O_NOFOLLOW and O_NONBLOCK: a link or a FIFO planted as the lock file is refused, never followed or waited on */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0640);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open the lock file %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "the lock file %s is not a regular file", path);
        close(fd);
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        char holder[256] = "";
        const ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        if (e == EWOULDBLOCK)
            snprintf(err, errlen, "%s is in use by %s (%s); one at a time", dir, what,
                     holder[0] ? holder : "its pid is not written yet");
        else
            snprintf(err, errlen, "cannot lock %s: %s", path, strerror(e));
        close(fd);
        return -1;
    }
    char host[256] = "?", line[512], since[32];
    gethostname(host, sizeof host - 1);
    const time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &tm);
    const int len = snprintf(line, sizeof line, "pid %d on host %s, since %s\n", (int)getpid(), host, since);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        /* the lock holds without its note; the refusal then says less */
    }
    return fd;
}
