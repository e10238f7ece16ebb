#include "json_file.h"

#include <stdio.h>
#include <stdlib.h>

#include "fs.h"

enum { JSON_FILE_MAX = 64 << 20 };

json_t *json_file_load(const char *path, json_error_t *je)
{
    char why[sizeof((json_error_t *)0)->text - 16];
    size_t len = 0;
    char *text = fs_read_all(path, JSON_FILE_MAX, &len, why, sizeof why);
    if (!text) {
        snprintf(je->text, sizeof je->text, "cannot read: %s", why);
        snprintf(je->source, sizeof je->source, "%s", path);
        je->line = je->column = -1;
        je->position = 0;
        return NULL;
    }
    json_t *root = json_loadb(text, len, 0, je);
    free(text);
    return root;
}
