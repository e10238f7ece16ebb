/* grpod's state directory: an exclusive lock (one grpod per directory), the
 * run's state file replaced atomically (write a temporary, fsync, rename,
 * fsync the directory: a crash at any point leaves the old or the new file,
 * never half of one) and an append-only log of events for people to read. */
#ifndef GRPO_DAEMON_JOURNAL_H
#define GRPO_DAEMON_JOURNAL_H

#include <limits.h>
#include <stddef.h>

struct journal {
    char dir[PATH_MAX];
    char state_path[PATH_MAX + 16];
    char tmp_path[PATH_MAX + 16];
    char events_path[PATH_MAX + 16];
    char log_path[PATH_MAX + 16]; /* run.log: records since the state file (journal_append) */
    int dir_fd, lock_fd, events_fd, log_fd;
};

/* Create the directory if needed (mode 0750), take its lock, drop a stale temporary. 0, or -1 with err. */
int journal_open(struct journal *j, const char *dir, char *err, size_t errlen);
/* Read the state file: 0 with *text (caller frees) or NULL when there is none; 1 with err when what is there
 * is no journal to read (not a regular file: a FIFO is never waited on; over 64 MiB), to be set aside; -1 with
 * err when it cannot be read (permissions, I/O). */
int journal_load(struct journal *j, char **text, char *err, size_t errlen);
/* Replace the state file with text, durably, then empty the record log (the state file holds its records). 0, or
 * -1 with err. */
int journal_save(struct journal *j, const char *text, char *err, size_t errlen);
/* Append one record (a line without its newline) to the record log, durably (fdatasync): a change that must be
 * durable before its answer costs one small write, not the whole state file. 0, or -1 with err. */
int journal_append(struct journal *j, const char *line, char *err, size_t errlen);
/* Read the record log: 0 with *text (caller frees) or NULL when there is none; -1 with err. */
int journal_load_log(struct journal *j, char **text, char *err, size_t errlen);
/* Append one line to the event log (best effort; a failure is logged): the bytes appended. */
size_t journal_event(struct journal *j, double time, const char *text);
/* Release the lock and close the files. */
void journal_close(struct journal *j);

#endif
