/* A JSON file read as every reader in the product reads one: a regular file only (a FIFO, a device or a
 * directory is refused at once, never waited on), at most 64 MiB, then parsed by jansson. */
#ifndef GRPO_COMMON_JSON_FILE_H
#define GRPO_COMMON_JSON_FILE_H

#include <jansson.h>

/* json_load_file's contract: the value, or NULL with je filled (je->text the reason, je->line the line of a
 * parse error or -1 when the file could not be read: missing, not a regular file, too large). */
json_t *json_file_load(const char *path, json_error_t *je);

#endif
