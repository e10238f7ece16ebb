/* Shared helpers of worker/formats (see fmt_util.h). */
#include "worker/formats/fmt_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/check.h"

int fmt_map_file(const char *path, size_t min_size, const char *kind, const uint8_t **map, size_t *size, char *err,
                 size_t errlen)
{
    char why[256];
    int fd = fs_open_read(path, why, sizeof why); /* a FIFO is refused, not waited on */
    if (fd < 0) {
        error_set(err, errlen, "%s: cannot open: %s", path, why);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        error_set(err, errlen, "%s: cannot stat: %s", path, check_errno_text());
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        error_set(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if (st.st_size < (off_t)min_size || st.st_size == 0) {
        error_set(err, errlen, "%s: truncated: %lld bytes is shorter than the %zu-byte %s header", path,
                  (long long)st.st_size, min_size, kind);
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        error_set(err, errlen, "%s: cannot mmap %lld bytes: %s", path, (long long)st.st_size, check_errno_text());
        close(fd);
        return -1;
    }
    close(fd);
    *map = p;
    *size = (size_t)st.st_size;
    return 0;
}
