#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/check.h"
#include "common/dirlock.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/config_key_names.h"

/* mkdir -p with the given mode for the directories it creates */
static int make_dirs(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, mode) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

static int write_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

int journal_open(struct journal *j, const char *dir, char *err, size_t errlen)
{
    memset(j, 0, sizeof *j);
    j->dir_fd = j->lock_fd = j->events_fd = j->log_fd = -1;
    if (!dir || !dir[0]) {
        snprintf(err, errlen, KEY_grpod_state_dir " is empty");
        return -1;
    }
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    snprintf(j->state_path, sizeof j->state_path, "%s/run.json", dir);
    snprintf(j->tmp_path, sizeof j->tmp_path, "%s/run.json.tmp", dir);
    snprintf(j->events_path, sizeof j->events_path, "%s/events.log", dir);
    snprintf(j->log_path, sizeof j->log_path, "%s/run.log", dir);
    if (make_dirs(dir, 0750) != 0) {
        snprintf(err, errlen, "cannot create state directory %s: %s", dir, strerror(errno));
        return -1;
    }
    j->dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (j->dir_fd < 0) {
        snprintf(err, errlen, "cannot open state directory %s: %s", dir, strerror(errno));
        return -1;
    }
    j->lock_fd = dirlock_take(dir, "grpod.lock", "another grpod", err, errlen);
    if (j->lock_fd < 0)
        goto fail;
    if (unlink(j->tmp_path) == 0)
        log_info("journal", "removed %s, left by an interrupted write", j->tmp_path);
    j->events_fd = open(j->events_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (j->events_fd < 0)
        log_warn("journal", "cannot open %s: %s; events are not logged there", j->events_path, strerror(errno));
    return 0;
fail:
    journal_close(j);
    return -1;
}

enum { JOURNAL_MAX = 64 << 20 }; /* run.json of 10,000 workers is a few MiB */

int journal_load(struct journal *j, char **text, char *err, size_t errlen)
{
    *text = NULL;
    char why[256];
    *text = fs_read_all(j->state_path, JOURNAL_MAX, NULL, why, sizeof why);
    if (*text)
        return 0;
    if (errno == ENOENT)
        return 0;
    snprintf(err, errlen, "%s: cannot read: %s", j->state_path, why);
    /* not a regular file (a FIFO would hang the read), or too large: not a journal of ours, set aside */
    return errno == EINVAL || errno == EISDIR || errno == EFBIG ? 1 : -1;
}

/* The journal's text (fs_write_fn's ctx). */
struct text_body {
    const char *text;
};

static int write_text(FILE *f, void *ctx, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    const struct text_body *b = ctx;
    return fputs(b->text, f) < 0 ? -1 : 0;
}

int journal_save(struct journal *j, const char *text, char *err, size_t errlen)
{
    /* through state_path.tmp (tmp_path), which journal_open removes when a crash left it */
    struct text_body b = {text};
    /* 0600: it holds the run's data-plane key */
    if (fs_write_atomic_with(j->state_path, 0600, write_text, &b, err, errlen) != 0)
        return -1;
    /* the state file holds every record now (its "seq"); records left by a failed truncation are skipped on load */
    if (j->log_fd >= 0 && (ftruncate(j->log_fd, 0) != 0 || fdatasync(j->log_fd) != 0))
        log_warn("journal", "cannot empty %s: %s (its records are older than the state file: skipped)", j->log_path,
                 strerror(errno));
    return 0;
}

int journal_append(struct journal *j, const char *line, char *err, size_t errlen)
{
    if (j->log_fd < 0) {
        /* 0600: a record holds what the state file does */
        j->log_fd = open(j->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (j->log_fd < 0) {
            snprintf(err, errlen, "cannot open %s: %s", j->log_path, strerror(errno));
            return -1;
        }
        if (j->dir_fd >= 0 && fsync(j->dir_fd) != 0) { /* the new file's name is durable too */
            snprintf(err, errlen, "cannot sync %s: %s", j->dir, strerror(errno));
            return -1;
        }
    }
    if (write_all(j->log_fd, line, strlen(line)) != 0 || write_all(j->log_fd, "\n", 1) != 0 ||
        fdatasync(j->log_fd) != 0) {
        snprintf(err, errlen, "cannot append to %s: %s", j->log_path, strerror(errno));
        return -1;
    }
    return 0;
}

int journal_load_log(struct journal *j, char **text, char *err, size_t errlen)
{
    char why[256];
    *text = fs_read_all(j->log_path, JOURNAL_MAX, NULL, why, sizeof why);
    if (*text || errno == ENOENT)
        return 0;
    snprintf(err, errlen, "%s: cannot read: %s", j->log_path, why);
    return -1;
}

size_t journal_event(struct journal *j, double time, const char *text)
{
    if (j->events_fd < 0)
        return 0;
    time_t t = (time_t)time;
    struct tm tm;
    gmtime_r(&t, &tm);
    char line[1024];
    int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof line - (size_t)n, ".%03dZ %s\n", (int)((time - (double)t) * 1000), text);
    if (n >= (int)sizeof line)
        n = (int)sizeof line - 1;
    if (write_all(j->events_fd, line, (size_t)n) != 0) {
        log_warn("journal", "cannot append to %s: %s", j->events_path, strerror(errno));
        return 0;
    }
    return (size_t)n;
}

void journal_close(struct journal *j)
{
    if (j->events_fd >= 0)
        close(j->events_fd);
    if (j->log_fd >= 0)
        close(j->log_fd);
    if (j->lock_fd >= 0)
        close(j->lock_fd); /* releases the flock */
    if (j->dir_fd >= 0)
        close(j->dir_fd);
    j->dir_fd = j->lock_fd = j->events_fd = j->log_fd = -1;
}
