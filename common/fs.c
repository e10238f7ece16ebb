#include "fs.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

int fs_mkdir_p(const char *dir)
{
    char *p = xstrdup(dir);
    size_t len = strlen(p);
    while (len > 1 && p[len - 1] == '/')
        p[--len] = '\0';
    int rc = 0;
    for (char *s = p + 1; *s && rc == 0; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            rc = -1;
        *s = '/';
    }
    if (rc == 0 && mkdir(p, 0755) != 0 && errno != EEXIST)
        rc = -1;
    struct stat st;
    if (rc == 0 && (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))) {
        if (errno == 0 || S_ISREG(st.st_mode))
            errno = ENOTDIR;
        rc = -1;
    }
    int e = errno;
    free(p);
    errno = e;
    return rc;
}

int fs_fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int fs_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen)
{
    size_t n = strlen(path) + 32;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create: %s", tmp, check_errno_text());
        free(tmp);
        return -1;
    }
    const char *p = data;
    size_t left = len;
    int rc = 0;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = -1;
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    if (rc == 0 && fsync(fd) != 0)
        rc = -1;
    if (close(fd) != 0)
        rc = -1;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -1;
    if (rc != 0) {
        snprintf(err, errlen, "%s: write failed: %s", path, check_errno_text());
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    char *copy = xstrdup(path);
    fs_fsync_path(dirname(copy)); /* the rename itself must survive a crash */
    free(copy);
    return 0;
}
