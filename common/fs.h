/* File-system helpers that make writes durable: directories created with
 * their parents, files replaced atomically (temporary file, fsync, rename,
 * fsync of the directory), so a crash leaves the old file or the new one. */
#ifndef GRPO_COMMON_FS_H
#define GRPO_COMMON_FS_H

#include <stddef.h>

/* mkdir -p; 0, or -1 with errno (ENOTDIR when a path component is a file). */
int fs_mkdir_p(const char *dir);
/* Replace path with len bytes of data atomically and durably. 0, or -1 with err naming the file. */
int fs_write_atomic(const char *path, const void *data, size_t len, char *err, size_t errlen);
/* fsync a file or directory by path; 0 or -1 with errno. */
int fs_fsync_path(const char *path);

#endif
