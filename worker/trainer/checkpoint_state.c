#include "checkpoint_state.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

char *checkpoint_state_text(const struct run_state *st, int64_t optim_steps)
{
    char digest[32], seed[32];
    snprintf(digest, sizeof digest, "%016llx", (unsigned long long)st->config_digest);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)st->seed); /* as text: JSON numbers lose 64-bit */
    json_t *o =
        json_pack("{s:i, s:I, s:I, s:I, s:s, s:s, s:I, s:I}", "version", 1, "global_step", (json_int_t)st->global_step,
                  "epoch", (json_int_t)st->epoch, "cursor", (json_int_t)st->cursor, "seed", seed, "config_digest",
                  digest, "total_steps", (json_int_t)st->total_steps, "optim_steps", (json_int_t)optim_steps);
    if (st->n_files > 0) {
        json_t *files = json_object();
        for (int i = 0; i < st->n_files && i < CKPT_MAX_FILES; i++) {
            char crc[16];
            snprintf(crc, sizeof crc, "%08x", (unsigned)st->files[i].crc32c);
            json_object_set_new(files, st->files[i].name,
                                json_pack("{s:I, s:s}", "bytes", (json_int_t)st->files[i].bytes, "crc32c", crc));
        }
        json_object_set_new(o, "files", files);
    }
    char *text = CHECK_ALLOC(json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS));
    json_decref(o);
    return text;
}

/* A file entry's name: a plain path inside the checkpoint directory (no "..", not absolute, no empty part). */
static bool plain_relative(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= CKPT_FILE_NAME || name[0] == '/' || name[n - 1] == '/')
        return false;
    for (const char *p = name; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == '\\')
            return false;
    for (const char *part = name; part;) {
        const char *slash = strchr(part, '/');
        size_t l = slash ? (size_t)(slash - part) : strlen(part);
        if (l == 0 || (l == 1 && part[0] == '.') || (l == 2 && part[0] == '.' && part[1] == '.'))
            return false;
        part = slash ? slash + 1 : NULL;
    }
    return true;
}

static int parse_files(const json_t *files, const char *path, struct run_state *st, char *err, size_t errlen)
{
    if (!json_is_object(files))
        return error_set(err, errlen, "%s: \"files\" is not an object", path);
    if (json_object_size(files) > CKPT_MAX_FILES)
        return error_set(err, errlen, "%s: \"files\" lists %zu files, more than a checkpoint holds (%d)", path,
                         json_object_size(files), CKPT_MAX_FILES);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)files, name, v)
    {
        if (!plain_relative(name))
            return error_set(err, errlen, "%s: \"files\" names \"%.64s\", not a plain path inside the checkpoint", path,
                             name);
        json_int_t bytes = -1;
        const char *crc = NULL;
        json_error_t je;
        if (json_unpack_ex(v, &je, JSON_STRICT, "{s:I, s:s}", "bytes", &bytes, "crc32c", &crc) != 0)
            return error_set(err, errlen, "%s: files[\"%s\"]: %s", path, name, je.text);
        char *end = NULL;
        unsigned long c = strtoul(crc, &end, 16);
        // cppcheck-suppress knownConditionTrueFalse
        if (bytes < 0 || strlen(crc) != 8 || !end || *end || c > 0xffffffffUL)
            return error_set(err, errlen, "%s: files[\"%s\"]: %lld bytes, crc32c \"%.16s\": not a size and a checksum",
                             path, name, (long long)bytes, crc);
        struct ckpt_file *f = &st->files[st->n_files++];
        snprintf(f->name, sizeof f->name, "%s", name);
        f->bytes = bytes;
        f->crc32c = (uint32_t)c;
    }
    return 0;
}

int checkpoint_state_parse(const char *text, size_t len, const char *path, struct run_state *st, char *err,
                           size_t errlen)
{
    json_error_t je;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return error_set(err, errlen, "%s:%d: %s", path, je.line, je.text);
    json_int_t step = 0, epoch = 0, cursor = 0, total = 0, optim_steps = -1; /* -1: an older checkpoint's */
    const char *seed = "", *digest = "";
    json_t *files = NULL;
    int rc =
        json_unpack_ex(o, &je, JSON_STRICT, "{s:i, s:I, s:I, s:I, s:s, s:s, s:I, s?:I, s?:o}", "version", &(int){0},
                       "global_step", &step, "epoch", &epoch, "cursor", &cursor, "seed", &seed, "config_digest",
                       &digest, "total_steps", &total, "optim_steps", &optim_steps, "files", &files);
    if (rc != 0) {
        json_decref(o);
        return error_set(err, errlen, "%s: %s", path, je.text);
    }
    /* json_unpack_ex filled them (cppcheck sees only their zeros) */
    // cppcheck-suppress knownConditionTrueFalse
    if (step < 0 || epoch < 0 || cursor < 0 || total < 0 || optim_steps < -1) {
        json_decref(o);
        return error_set(err, errlen,
                         "%s: global_step %lld, epoch %lld, cursor %lld, total_steps %lld, optim_steps %lld: a count "
                         "is negative (a corrupt or edited file)",
                         path, (long long)step, (long long)epoch, (long long)cursor, (long long)total,
                         (long long)optim_steps);
    }
    struct run_state s = {.global_step = step, .epoch = epoch, .cursor = cursor, .total_steps = total};
    s.optim_steps = optim_steps;
    s.seed = strtoull(seed, NULL, 10);
    s.config_digest = strtoull(digest, NULL, 16);
    if (files && parse_files(files, path, &s, err, errlen) != 0) {
        json_decref(o);
        return -1;
    }
    json_decref(o);
    *st = s;
    return 0;
}
