/* A bag of allocations freed together: grpod builds reply messages (protobuf-c
 * structs full of pointers) in one and drops it once the reply is packed. */
#ifndef GRPO_DAEMON_ARENA_H
#define GRPO_DAEMON_ARENA_H

#include <stddef.h>

struct arena {
    void **ptrs;
    size_t n, cap;
};

/* Zeroed memory that lives until arena_free. Never NULL. */
void *arena_alloc(struct arena *a, size_t size);
/* Copy of s (NULL gives ""). */
char *arena_strdup(struct arena *a, const char *s);
/* Free every allocation; the arena can be used again. */
void arena_free(struct arena *a);

#endif
