/* One process at a time in a directory: an advisory lock (flock on DIR/NAME) held for the process's life and
 * released by the kernel when it ends, however it ends, so a killed run leaves no stale lock. The lock file
 * holds "pid PID host HOST since TIME" of the holder, for the refusal's message. grpod's state directory and a
 * training run's directory (two jobs submitted with the same run.yaml) are locked this way. */
#ifndef GRPO_COMMON_DIRLOCK_H
#define GRPO_COMMON_DIRLOCK_H

#include <stddef.h>

/* Lock DIR/NAME (created 0640). The lock's descriptor (keep it open; close it to release), or -1 with err:
 * "DIR is in use by WHAT (pid P on host H, since T)" when another process holds it, or why it cannot be made. */
int dirlock_take(const char *dir, const char *name, const char *what, char *err, size_t errlen);

#endif
