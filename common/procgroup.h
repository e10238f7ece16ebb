/* Ending a child that leads a process group of its own (a Python helper: the reward scorers, the chat-template
 * renderer), with everything it started: it is waited for without being reaped (while unreaped, its pid and so its
 * group's id cannot be reused), then its group is killed, then it is reaped. */
#ifndef GRPO_COMMON_PROCGROUP_H
#define GRPO_COMMON_PROCGROUP_H

#include <sys/types.h>

/* End child pid and its process group. grace_s: how long it may take to exit by itself first (< 0: as long as it
 * takes, for one whose input was closed; 0: killed at once). Its wait status. */
int procgroup_end(pid_t pid, double grace_s);

#endif
