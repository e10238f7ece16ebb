/* File-system helpers that make writes durable: directories created with
 * their parents, and the one atomic replace every writer of a file uses
 * (PATH.tmp written, fsync of that file, rename over PATH, fsync of the
 * directory), so a crash leaves the old file or the new one, never half. */
#ifndef GRPO_COMMON_FS_H
#define GRPO_COMMON_FS_H

#include <stddef.h>
#include <stdio.h>

/* mkdir -p; 0, or -1 with errno (ENOTDIR when a path component is a file). */
int fs_mkdir_p(const char *dir);
/* Writes a file's content into f (the temporary file); 0, or -1 with errno set, or with err filled. */
typedef int (*fs_write_fn)(FILE *f, void *ctx, char *err, size_t errlen);
/* Replace path atomically and durably with what fill puts into PATH.tmp (created with mode, less the
 * umask). 0, or -1 with err naming path, and then no PATH.tmp is left and path is as it was. */
int fs_write_atomic_with(const char *path, unsigned mode, fs_write_fn fill, void *ctx, char *err, size_t errlen);
/* fs_write_atomic_with of len bytes of data, mode 0644. */
int fs_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen);
/* Write all n bytes to fd, again after an interruption; a socket is written without SIGPIPE (MSG_NOSIGNAL).
 * 0, or -1 when the peer is gone or the write fails (errno set). */
int fs_write_full(int fd, const void *buf, size_t n);
/* fsync a file or directory by path; 0 or -1 with errno. */
int fs_fsync_path(const char *path);
/* fsync the directory that holds path (the record of a rename or an unlink there); EINVAL (a file system
 * that cannot) counts as done. 0, or -1 with err naming path and the directory. */
int fs_fsync_dir_of(const char *path, char *err, size_t errlen);
/* rm -r without a shell: remove path and, when it is a directory, everything below it, each entry by unlinkat
 * relative to its opened parent. Symbolic links are removed, never followed; a directory on another file system
 * (a mount point) or nested deeper than 256 levels is refused, not entered. A path that does not exist is done.
 * 0, or -1 with err naming the entry that could not be removed and why (what could be removed is gone). */
int fs_remove_tree(const char *path, char *err, size_t errlen);
/* Open path for reading, only if it is a regular file. It is opened without blocking (a FIFO would wait for a
 * writer forever), checked with fstat, then made blocking. The descriptor, or -1 with errno set (ENOENT when
 * nothing is there; EINVAL for a FIFO, socket or device; EISDIR for a directory) and why filled with the reason
 * ("No such file or directory", "a FIFO, not a regular file", ...), for a message "PATH: cannot open: WHY". */
int fs_open_read(const char *path, char *why, size_t whylen);
/* fs_open_read as a stdio stream ("rb"); NULL with errno and why as there. */
FILE *fs_fopen_read(const char *path, char *why, size_t whylen);
/* The whole of a regular file (fs_open_read) of at most max bytes, NUL-terminated, malloc'd; *len (if not NULL)
 * its length. NULL with errno and why as fs_open_read's, or EFBIG and "N bytes, over the M-byte limit". */
char *fs_read_all(const char *path, size_t max, size_t *len, char *why, size_t whylen);
/* What kind of file st_mode is, in words ("a FIFO", "a directory", "a socket", ...). */
const char *fs_kind(unsigned mode);
/* The directory part of path (".", or "/", when it has none), malloc'd. */
char *fs_dir_of(const char *path);

#endif
