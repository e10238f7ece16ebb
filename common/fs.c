#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

char *fs_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return xstrdup(".");
    if (slash == path)
        return xstrdup("/");
    char *r = xmalloc((size_t)(slash - path) + 1);
    memcpy(r, path, (size_t)(slash - path));
    r[slash - path] = '\0';
    return r;
}

int fs_fsync_dir_of(const char *path, char *err, size_t errlen)
{
    char *dir = fs_dir_of(path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (fd < 0) {
        rc = error_set(err, errlen, "%s: cannot open its directory %s to fsync it: %s", path, dir, check_errno_text());
    } else {
        /* some file systems cannot fsync a directory (EINVAL); nothing more can be done there */
        if (fsync(fd) != 0 && errno != EINVAL)
            rc = error_set(err, errlen, "%s: fsync of directory %s failed: %s", path, dir, check_errno_text());
        close(fd);
    }
    free(dir);
    return rc;
}

/* Runs write on f; on failure err says why (the writer's own words, else errno's). */
static int write_through(FILE *f, const char *path, const char *tmp, fs_write_fn fill, void *ctx, char *err,
                         size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    errno = 0;
    int rc = fill(f, ctx, err, errlen);
    if (rc == 0 && (fflush(f) != 0 || ferror(f)))
        rc = -1;
    if (rc != 0 && !(err && errlen && err[0]))
        error_set(err, errlen, "%s: writing %s failed: %s", path, tmp,
                  errno ? check_errno_text() : "the writer failed");
    return rc == 0 ? 0 : -1;
}

int fs_write_atomic_with(const char *path, unsigned mode, fs_write_fn fill, void *ctx, char *err, size_t errlen)
{
    size_t n = strlen(path);
    char *tmp = xmalloc(n + 5);
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, (mode_t)mode);
    if (fd < 0) {
        error_set(err, errlen, "%s: cannot create %s: %s", path, tmp, check_errno_text());
        free(tmp);
        return -1;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        error_set(err, errlen, "%s: cannot open %s as a stream: %s", path, tmp, check_errno_text());
        close(fd);
        unlink(tmp);
        free(tmp);
        return -1;
    }
    int rc = write_through(f, path, tmp, fill, ctx, err, errlen);
    if (rc == 0 && fsync(fd) != 0)
        rc = error_set(err, errlen, "%s: fsync of %s failed: %s", path, tmp, check_errno_text());
    if (fclose(f) != 0 && rc == 0)
        rc = error_set(err, errlen, "%s: closing %s failed: %s", path, tmp, check_errno_text());
    if (rc == 0 && rename(tmp, path) != 0)
        rc = error_set(err, errlen, "%s: cannot rename %s to it: %s", path, tmp, check_errno_text());
    if (rc != 0) {
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return fs_fsync_dir_of(path, err, errlen); /* the rename itself must survive a crash */
}

struct bytes {
    const void *data;
    size_t len;
};

static int write_bytes(FILE *f, void *ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    const struct bytes *b = ctx;
    return b->len == 0 || fwrite(b->data, 1, b->len, f) == b->len ? 0 : -1;
}

int fs_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen)
{
    struct bytes b = {data, len};
    return fs_write_atomic_with(path, 0644, write_bytes, &b, err, errlen);
}

enum { FS_TREE_MAX_DEPTH = 256 };

static int tree_fail(char *err, size_t errlen, const char *path, const char *name, const char *why)
{
    snprintf(err, errlen, "%s: cannot remove %s: %s", path, name, why);
    return -1;
}

/* Remove name inside the directory dirfd (path is the tree's root, for messages); dev is the root's device. */
static int remove_at(int dirfd, const char *name, dev_t dev, int depth, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : tree_fail(err, errlen, path, name, strerror(errno));
    if (!S_ISDIR(st.st_mode)) /* files, links (not followed), sockets, FIFOs */
        return unlinkat(dirfd, name, 0) == 0 || errno == ENOENT ? 0
                                                                : tree_fail(err, errlen, path, name, strerror(errno));
    if (st.st_dev != dev)
        return tree_fail(err, errlen, path, name, "a mount point (another file system); not entered");
    if (depth >= FS_TREE_MAX_DEPTH)
        return tree_fail(err, errlen, path, name, "nested more than 256 directories deep; not entered");
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return tree_fail(err, errlen, path, name, strerror(errno));
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return tree_fail(err, errlen, path, name, strerror(e));
    }
    int rc = 0;
    for (struct dirent *e; rc == 0 && (errno = 0, e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        rc = remove_at(fd, e->d_name, dev, depth + 1, path, err, errlen);
    }
    if (rc == 0 && errno != 0)
        rc = tree_fail(err, errlen, path, name, strerror(errno));
    closedir(d);
    if (rc == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        rc = tree_fail(err, errlen, path, name, strerror(errno));
    return rc;
}

int fs_remove_tree(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : tree_fail(err, errlen, path, "it", strerror(errno));
    char *dir = fs_dir_of(path);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int rc;
    if (!base[0] || strcmp(base, ".") == 0 || strcmp(base, "..") == 0) {
        rc = tree_fail(err, errlen, path, "it", "the path must end in a name, not '/', '.' or '..'");
    } else {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        rc = dfd < 0 ? tree_fail(err, errlen, path, "its directory", strerror(errno))
                     : remove_at(dfd, base, st.st_dev, 0, path, err, errlen);
        if (dfd >= 0)
            close(dfd);
    }
    free(dir);
    return rc;
}

const char *fs_kind(unsigned mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return "not a file";
    }
}

int fs_open_read(const char *path, char *why, size_t whylen)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(why, whylen, "%s", strerror(e));
        errno = e;
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        snprintf(why, whylen, "cannot stat: %s", strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, whylen, "%s, not a regular file; refused (a read could block or never end)", fs_kind(st.st_mode));
        close(fd);
        errno = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        snprintf(why, whylen, "cannot make it blocking: %s", strerror(e));
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

FILE *fs_fopen_read(const char *path, char *why, size_t whylen)
{
    int fd = fs_open_read(path, why, whylen);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        snprintf(why, whylen, "%s", strerror(e));
        close(fd);
        errno = e;
    }
    return f;
}

char *fs_read_all(const char *path, size_t max, size_t *len, char *why, size_t whylen)
{
    int fd = fs_open_read(path, why, whylen);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size > (uint64_t)max) {
        snprintf(why, whylen, "%lld bytes, over the %zu-byte limit", (long long)st.st_size, max);
        close(fd);
        errno = EFBIG;
        return NULL;
    }
    size_t cap = (size_t)st.st_size, got = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (got == cap) { /* the file grew since fstat: read on, up to max */
            if (cap >= max)
                break;
            cap = cap * 2 + 4096 < max ? cap * 2 + 4096 : max;
            buf = xrealloc(buf, cap + 1);
        }
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            snprintf(why, whylen, "read failed: %s", strerror(e));
            free(buf);
            close(fd);
            errno = e;
            return NULL;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = 0;
    if (len)
        *len = got;
    return buf;
}

int fs_write_full(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    bool sock = true;
    for (size_t off = 0; off < n;) {
        ssize_t w = sock ? send(fd, p + off, n - off, MSG_NOSIGNAL) : write(fd, p + off, n - off);
        if (w < 0 && sock && errno == ENOTSOCK) {
            sock = false;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return 0;
}
