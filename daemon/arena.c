#include "arena.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

void *arena_alloc(struct arena *a, size_t size)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->ptrs = xrealloc(a->ptrs, a->cap * sizeof *a->ptrs);
    }
    void *p = xcalloc(1, size ? size : 1);
    a->ptrs[a->n++] = p;
    return p;
}

char *arena_strdup(struct arena *a, const char *s)
{
    if (!s)
        s = "";
    size_t l = strlen(s);
    char *p = arena_alloc(a, l + 1);
    memcpy(p, s, l + 1);
    return p;
}

void arena_free(struct arena *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->ptrs[i]);
    free(a->ptrs);
    a->ptrs = NULL;
    a->n = a->cap = 0;
}
