/* YAML front-end of the configuration: walks libyaml's event stream, turning
 * nested mappings into dotted key names, and hands each scalar (or flow list
 * of numbers) to config_set() with "FILE:LINE" as its origin. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "check.h"
#include "fs.h"
#include "config.h"

#define MAX_DEPTH 16

struct yaml_walk {
    struct grpo_config *cfg;
    const char *path;
    struct cfg_error *err;
    yaml_parser_t parser;
    char prefix[512]; /* dotted path of the open mappings, with a trailing '.' */
    size_t plen[MAX_DEPTH];
    int depth;
    bool *seen; /* keys set by this file, to catch duplicates */
};

static void walk_err(struct yaml_walk *w, size_t line, const char *fmt, const char *a, const char *b)
{
    char what[768];
    snprintf(what, sizeof what, fmt, a, b ? b : "");
    snprintf(w->err->msg, sizeof w->err->msg, "%s:%zu: %s", w->path, line + 1, what);
}

static bool is_section(const char *name)
{
    size_t n = strlen(name);
    for (int i = 0; i < config_num_keys(); i++) {
        const char *k = config_key(i)->name;
        if (strncmp(k, name, n) == 0 && k[n] == '.')
            return true;
    }
    /* verl's sections whose keys we note or refuse (fsdp_config, engine_kwargs.vllm, multi_turn, ...) */
    for (int i = 0; i < config_verl_count(); i++) {
        const char *pat, *ok, *why, *feature;
        config_verl_entry(i, &pat, &ok, &why, &feature);
        const size_t m = strlen(pat);
        const bool wild = m >= 2 && strcmp(pat + m - 2, ".*") == 0;
        if ((strncmp(pat, name, n) == 0 && pat[n] == '.') || (wild && strncmp(name, pat, m - 1) == 0))
            return true;
    }
    return false;
}

static int unknown_key(struct yaml_walk *w, size_t line, const char *name)
{
    const char *s = config_suggest(name);
    if (s)
        walk_err(w, line, "unknown key '%s' (did you mean '%s'?)", name, s);
    else
        walk_err(w, line, "unknown key '%s'%s", name, " (see --print-config for every key)");
    return -1;
}

static bool next_event(struct yaml_walk *w, yaml_event_t *ev)
{
    if (yaml_parser_parse(&w->parser, ev))
        return true;
    char msg[600];
    snprintf(msg, sizeof msg, "%s:%zu: YAML syntax error: %s%s%s", w->path, w->parser.problem_mark.line + 1,
             w->parser.problem ? w->parser.problem : "unreadable input", w->parser.context ? " " : "",
             w->parser.context ? w->parser.context : "");
    snprintf(w->err->msg, sizeof w->err->msg, "%s", msg);
    return false;
}

static bool is_null_scalar(const yaml_event_t *ev)
{
    const char *v = (const char *)ev->data.scalar.value;
    return ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*v || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 || strcmp(v, "Null") == 0 || strcmp(v, "NULL") == 0);
}

/* Read a sequence of scalars (after SEQUENCE_START) into "[a, b, ...]". */
static int read_sequence(struct yaml_walk *w, const char *name, char *out, size_t len)
{
    size_t n = (size_t)snprintf(out, len, "[");
    for (int count = 0;; count++) {
        yaml_event_t ev;
        if (!next_event(w, &ev))
            return -1;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        if (ev.type != YAML_SCALAR_EVENT) {
            walk_err(w, ev.start_mark.line, "%s: list items must be plain values%s", name, NULL);
            yaml_event_delete(&ev);
            return -1;
        }
        if (n < len)
            n += (size_t)snprintf(out + n, len - n, "%s%s", count ? ", " : "", (char *)ev.data.scalar.value);
        yaml_event_delete(&ev);
    }
    if (n + 2 >= len) {
        snprintf(w->err->msg, sizeof w->err->msg, "%s: list value of %s is too long", w->path, name);
        return -1;
    }
    snprintf(out + n, len - n, "]");
    return 0;
}

static int set_value(struct yaml_walk *w, const char *name, size_t line, const char *value)
{
    if (config_is_map_key(name) && strchr(name + strlen("data.apply_chat_template_kwargs"), '.')) {
        char origin[600]; /* a variable of a map key (its own name is free): set one at a time */
        snprintf(origin, sizeof origin, "%s:%zu", w->path, line + 1);
        return config_set(w->cfg, name, value ? value : "null", origin, w->err);
    }
    const struct cfg_key_info *k = config_find(name);
    if (!k) {
        const char *why;
        if (config_verl_class(name, value, &why) != VERL_UNKNOWN) { /* noted, or refused with the feature named */
            char origin[600];
            snprintf(origin, sizeof origin, "%s:%zu", w->path, line + 1);
            return config_set(w->cfg, name, value ? value : "null", origin, w->err);
        }
        if (is_section(name)) {
            walk_err(w, line, "'%s' is a section; give its keys beneath it (for example %s.<key>)", name, name);
            return -1;
        }
        return unknown_key(w, line, name);
    }
    int idx = (int)(k - config_key(0));
    if (w->seen[idx]) {
        walk_err(w, line, "key '%s' is given twice%s", name, "");
        return -1;
    }
    w->seen[idx] = true;
    if (!value)
        return 0; /* null keeps the default */
    char origin[600];
    snprintf(origin, sizeof origin, "%s:%zu", w->path, line + 1);
    return config_set(w->cfg, name, value, origin, w->err);
}

/* Walk one mapping's key/value pairs until its MAPPING_END. */
static int walk_mapping(struct yaml_walk *w)
{
    for (;;) {
        yaml_event_t key;
        if (!next_event(w, &key))
            return -1;
        if (key.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&key);
            return 0;
        }
        if (key.type != YAML_SCALAR_EVENT) {
            walk_err(w, key.start_mark.line, "keys must be plain names%s%s", "", NULL);
            yaml_event_delete(&key);
            return -1;
        }
        char name[512];
        snprintf(name, sizeof name, "%s%s", w->prefix, (char *)key.data.scalar.value);
        size_t line = key.start_mark.line;
        yaml_event_delete(&key);

        yaml_event_t val;
        if (!next_event(w, &val))
            return -1;
        int rc = 0;
        if (val.type == YAML_SCALAR_EVENT) {
            rc = set_value(w, name, line, is_null_scalar(&val) ? NULL : (char *)val.data.scalar.value);
        } else if (val.type == YAML_SEQUENCE_START_EVENT) {
            char list[512];
            rc = read_sequence(w, name, list, sizeof list);
            if (rc == 0)
                rc = set_value(w, name, line, list);
        } else if (val.type == YAML_MAPPING_START_EVENT) {
            if (!is_section(name) && !config_is_map_key(name)) {
                rc = config_find(name) ? (walk_err(w, line, "'%s' takes a value, not a mapping%s", name, ""), -1)
                                       : unknown_key(w, line, name);
            } else if (w->depth + 1 >= MAX_DEPTH || strlen(name) + 2 >= sizeof w->prefix) {
                walk_err(w, line, "'%s' is nested too deeply%s", name, "");
                rc = -1;
            } else {
                w->plen[++w->depth] = strlen(w->prefix);
                snprintf(w->prefix, sizeof w->prefix, "%s.", name);
                rc = walk_mapping(w);
                w->prefix[w->plen[w->depth--]] = 0;
            }
        } else {
            walk_err(w, line, "'%s': anchors and aliases are not supported%s", name, "");
            rc = -1;
        }
        yaml_event_delete(&val);
        if (rc)
            return rc;
    }
}

int config_load_yaml(struct grpo_config *c, const char *path, struct cfg_error *err)
{
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    if (!f) {
        snprintf(err->msg, sizeof err->msg, "cannot open config file '%s': %s", path, why);
        return -1;
    }
    struct yaml_walk w = {.cfg = c, .path = path, .err = err};
    w.seen = xcalloc((size_t)config_num_keys(), sizeof(bool));
    yaml_parser_initialize(&w.parser);
    yaml_parser_set_input_file(&w.parser, f);
    int rc = 0;
    bool done = false;
    while (!done && rc == 0) {
        yaml_event_t ev;
        if (!next_event(&w, &ev)) {
            rc = -1;
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = true; break;
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_START_EVENT:
        case YAML_DOCUMENT_END_EVENT: break;
        case YAML_MAPPING_START_EVENT: rc = walk_mapping(&w); break;
        case YAML_SCALAR_EVENT:
            if (is_null_scalar(&ev))
                break; /* an empty document */
            /* fall through */
        default:
            snprintf(err->msg, sizeof err->msg, "%s:%zu: the top level must be a mapping of keys (like data: ...)",
                     path, ev.start_mark.line + 1);
            rc = -1;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&w.parser);
    free(w.seen);
    fclose(f);
    return rc;
}
