#include "bundled.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The bundled SmolLM2-135M-Instruct: its converted HF directory in the cache if present, else the GGUF.
 * On failure out holds the cache directory. */
int model_bundled_path(char *out, size_t len)
{
    if (!out || len == 0)
        return -1;
    const char *cache = getenv("GRPO_CACHE");
    char dir[2048];
    if (cache && *cache)
        snprintf(dir, sizeof dir, "%s", cache);
    else
        snprintf(dir, sizeof dir, "%s/.cache/grpo", getenv("HOME") ? getenv("HOME") : ".");
    snprintf(out, len, "%s/SmolLM2-135M-Instruct/config.json", dir);
    if (access(out, R_OK) == 0) {
        snprintf(out, len, "%s/SmolLM2-135M-Instruct", dir);
        return 0;
    }
    snprintf(out, len, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir);
    if (access(out, R_OK) == 0)
        return 0;
    snprintf(out, len, "%s", dir);
    return -1;
}
