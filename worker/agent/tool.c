/* The tool object and what every tool call goes through whatever the tool: the schema check, the validation
 * of the model's arguments against the schema's parameters, the truncation of a long answer, the per-trajectory
 * life cycle's dispatch (create, execute, calc_reward, release), and the registry of a rollout's tools. The YAML
 * tool config is read in tool_config.c. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "worker/agent/tool.h"

static const char *const TYPES[] = {"string", "integer", "number", "boolean", "object", "array", "null"};

static int known_type(const char *s)
{
    for (size_t i = 0; i < sizeof TYPES / sizeof *TYPES; i++)
        if (strcmp(s, TYPES[i]) == 0)
            return 1;
    return 0;
}

static int fail_at(char *err, size_t errlen, char *where, size_t wherelen, const char *path, const char *msg,
                   const char *arg)
{
    if (where)
        snprintf(where, wherelen, "%s", path);
    char m[256];
    snprintf(m, sizeof m, msg, arg ? arg : "");
    return error_set(err, errlen, "tool_schema.%s: %s", path, m);
}

int tool_schema_check(const json_t *schema, char *err, size_t errlen, char *where, size_t wherelen)
{
    if (where && wherelen)
        where[0] = '\0';
    if (!json_is_object(schema))
        return error_set(err, errlen, "tool_schema: not a mapping");
    const char *type = json_string_value(json_object_get(schema, "type"));
    if (!type || strcmp(type, "function") != 0)
        return fail_at(err, errlen, where, wherelen, "type", "must be \"function\"%s", NULL);
    const json_t *fn = json_object_get(schema, "function");
    if (!json_is_object(fn))
        return fail_at(err, errlen, where, wherelen, "function", "missing or not a mapping%s", NULL);
    const char *name = json_string_value(json_object_get(fn, "name"));
    if (!name)
        return fail_at(err, errlen, where, wherelen, "function.name", "missing or not a string%s", NULL);
    const size_t nlen = strlen(name);
    int good = nlen > 0 && nlen <= 64;
    for (size_t i = 0; good && i < nlen; i++)
        good = isalnum((unsigned char)name[i]) || name[i] == '_' || name[i] == '-';
    if (!good)
        return fail_at(err, errlen, where, wherelen, "function.name",
                       "'%s' is not a name (1 to 64 letters, digits, _ and -)", name);
    const json_t *desc = json_object_get(fn, "description");
    if (desc && !json_is_string(desc))
        return fail_at(err, errlen, where, wherelen, "function.description", "not a string%s", NULL);
    const json_t *params = json_object_get(fn, "parameters");
    if (!params)
        return 0; /* a tool without arguments */
    if (!json_is_object(params))
        return fail_at(err, errlen, where, wherelen, "function.parameters", "not a mapping%s", NULL);
    const char *ptype = json_string_value(json_object_get(params, "type"));
    if (!ptype || strcmp(ptype, "object") != 0)
        return fail_at(err, errlen, where, wherelen, "function.parameters.type", "must be \"object\"%s", NULL);
    const json_t *props = json_object_get(params, "properties");
    if (props && !json_is_object(props))
        return fail_at(err, errlen, where, wherelen, "function.parameters.properties", "not a mapping%s", NULL);
    const char *key;
    const json_t *p;
    char path[512];
    json_object_foreach((json_t *)props, key, p)
    {
        snprintf(path, sizeof path, "function.parameters.properties.%s", key);
        if (!json_is_object(p))
            return fail_at(err, errlen, where, wherelen, path, "not a mapping%s", NULL);
        const json_t *t = json_object_get(p, "type");
        if (t) { /* a type, or a list of them (a Python union: ["integer", "number"]) */
            snprintf(path, sizeof path, "function.parameters.properties.%s.type", key);
            if (json_is_array(t) && json_array_size(t) > 0) {
                size_t i;
                const json_t *ti;
                json_array_foreach(t, i, ti)
                {
                    if (!json_is_string(ti))
                        return fail_at(err, errlen, where, wherelen, path, "a list holding a non-string%s", NULL);
                    if (!known_type(json_string_value(ti)))
                        return fail_at(err, errlen, where, wherelen, path,
                                       "unknown type '%s' (string, integer, number, boolean, object, array, null)",
                                       json_string_value(ti));
                }
            } else if (!json_is_string(t)) {
                return fail_at(err, errlen, where, wherelen, path, "not a string or a list of them%s", NULL);
            } else if (!known_type(json_string_value(t))) {
                return fail_at(err, errlen, where, wherelen, path,
                               "unknown type '%s' (string, integer, number, boolean, object, array, null)",
                               json_string_value(t));
            }
        }
        const json_t *e = json_object_get(p, "enum");
        if (e && !json_is_array(e)) {
            snprintf(path, sizeof path, "function.parameters.properties.%s.enum", key);
            return fail_at(err, errlen, where, wherelen, path, "not a list%s", NULL);
        }
    }
    const json_t *req = json_object_get(params, "required");
    if (req) {
        if (!json_is_array(req))
            return fail_at(err, errlen, where, wherelen, "function.parameters.required", "not a list%s", NULL);
        size_t i;
        const json_t *r;
        json_array_foreach(req, i, r)
        {
            if (!json_is_string(r))
                return fail_at(err, errlen, where, wherelen, "function.parameters.required", "holds a non-string%s",
                               NULL);
            if (!json_object_get(props, json_string_value(r)))
                return fail_at(err, errlen, where, wherelen, "function.parameters.required",
                               "'%s' is not one of the properties", json_string_value(r));
        }
    }
    const json_t *ap = json_object_get(params, "additionalProperties");
    if (ap && !json_is_boolean(ap) && !json_is_object(ap))
        return fail_at(err, errlen, where, wherelen, "function.parameters.additionalProperties",
                       "must be true, false or a schema%s", NULL);
    return 0;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

static int type_matches(const char *want, const json_t *v)
{
    if (strcmp(want, "number") == 0)
        return json_is_number(v);
    if (strcmp(want, "integer") == 0) /* 3.0 is an integer in JSON Schema */
        return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
    return strcmp(want, json_type_name(v)) == 0;
}

int tool_validate_args(const json_t *schema, const json_t *args, char *err, size_t errlen)
{
    if (!json_is_object(args))
        return error_set(err, errlen, "the arguments must be a JSON object, not %s",
                         args ? json_type_name(args) : "nothing");
    const json_t *params = json_object_get(json_object_get(schema, "function"), "parameters");
    const json_t *props = json_object_get(params, "properties");
    const json_t *req = json_object_get(params, "required");
    size_t i;
    const json_t *r;
    json_array_foreach(req, i, r)
    {
        if (json_is_string(r) && !json_object_get(args, json_string_value(r)))
            return error_set(err, errlen, "missing required argument '%s'", json_string_value(r));
    }
    const json_t *ap = json_object_get(params, "additionalProperties");
    const int closed = json_is_false(ap);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)args, key, v)
    {
        const json_t *p = json_object_get(props, key);
        if (!p) {
            if (!closed)
                continue;
            char names[256] = "";
            size_t n = 0;
            const char *k2;
            const json_t *p2;
            json_object_foreach((json_t *)props, k2, p2)
            {
                (void)p2;
                n += (size_t)snprintf(names + n, n < sizeof names ? sizeof names - n : 0, "%s%s", n ? ", " : "", k2);
                if (n >= sizeof names)
                    break;
            }
            return error_set(err, errlen, "unknown argument '%s' (this tool takes: %s)", key,
                             names[0] ? names : "no arguments");
        }
        const json_t *want = json_object_get(p, "type");
        if (json_is_string(want) && !type_matches(json_string_value(want), v))
            return error_set(err, errlen, "argument '%s' must be of type %s, not %s", key, json_string_value(want),
                             json_type_name(v));
        if (json_is_array(want)) { /* any of the types */
            int any = 0;
            char names[256] = "";
            size_t n = 0, j;
            const json_t *w;
            json_array_foreach(want, j, w)
            {
                const char *name = json_string_value(w);
                any |= name && type_matches(name, v);
                if (n < sizeof names)
                    n += (size_t)snprintf(names + n, sizeof names - n, "%s%s", j ? " or " : "", name ? name : "?");
            }
            if (!any)
                return error_set(err, errlen, "argument '%s' must be of type %s, not %s", key, names,
                                 json_type_name(v));
        }
        const json_t *en = json_object_get(p, "enum");
        if (json_is_array(en)) {
            int found = 0;
            size_t j;
            const json_t *e;
            json_array_foreach(en, j, e)
            {
                if (json_equal((json_t *)e, (json_t *)v))
                    found = 1;
            }
            if (!found) {
                char *s = json_dumps(en, JSON_COMPACT | JSON_ENCODE_ANY);
                error_set(err, errlen, "argument '%s' must be one of %.200s", key, s ? s : "the enum");
                free(s);
                return -1;
            }
        }
    }
    return 0;
}

int tool_truncate_side_from_name(const char *name)
{
    if (strcmp(name, "left") == 0)
        return TOOL_TRUNCATE_LEFT;
    if (strcmp(name, "right") == 0)
        return TOOL_TRUNCATE_RIGHT;
    if (strcmp(name, "middle") == 0)
        return TOOL_TRUNCATE_MIDDLE;
    return -1;
}

/* byte offset of the k-th UTF-8 character of s (len bytes); len when there are fewer */
static size_t utf8_offset(const char *s, size_t len, size_t k)
{
    size_t i = 0;
    for (; i < len && k > 0; k--) {
        i++;
        while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
    }
    return i;
}

static size_t utf8_count(const char *s, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

char *tool_truncate(const char *text, size_t max, enum tool_truncate_side side)
{
    const size_t len = strlen(text);
    const size_t chars = utf8_count(text, len);
    if (max == 0 || chars <= max)
        return xstrdup(text);
    const size_t cut = chars - max;
    char marker[96];
    size_t head, tail; /* bytes kept at the start and at the end */
    if (side == TOOL_TRUNCATE_LEFT) {
        head = utf8_offset(text, len, max), tail = 0;
        snprintf(marker, sizeof marker, "...(truncated %zu characters)", cut);
    } else if (side == TOOL_TRUNCATE_RIGHT) {
        head = 0, tail = len - utf8_offset(text, len, cut);
        snprintf(marker, sizeof marker, "(truncated %zu characters)...", cut);
    } else {
        head = utf8_offset(text, len, max / 2);
        tail = len - utf8_offset(text, len, chars - (max - max / 2));
        snprintf(marker, sizeof marker, "...(truncated %zu characters)...", cut);
    }
    const size_t mlen = strlen(marker);
    char *out = xmalloc(head + mlen + tail + 1);
    memcpy(out, text, head);
    memcpy(out + head, marker, mlen);
    memcpy(out + head + mlen, text + len - tail, tail);
    out[head + mlen + tail] = '\0';
    return out;
}

struct tool *tool_new(json_t *schema, const struct tool_ops *ops, void *impl, char *err, size_t errlen)
{
    char where[256];
    if (tool_schema_check(schema, err, errlen, where, sizeof where) != 0)
        return NULL;
    struct tool *t = xcalloc(1, sizeof *t);
    t->schema = json_incref(schema);
    t->name = xstrdup(json_string_value(json_object_get(json_object_get(schema, "function"), "name")));
    t->max_response_length = TOOL_DEFAULT_MAX_RESPONSE;
    t->truncate_side = TOOL_TRUNCATE_MIDDLE;
    t->ops = ops;
    t->impl = impl;
    return t;
}

void tool_free(struct tool *t)
{
    if (!t)
        return;
    if (t->ops && t->ops->destroy)
        t->ops->destroy(t);
    json_decref(t->schema);
    free(t->name);
    free(t);
}

static char *error_text(const char *fmt, const char *a)
{
    char m[1024];
    snprintf(m, sizeof m, fmt, a);
    return xstrdup(m);
}

char *tool_call_json_in(struct tool *t, const char *instance_id, const json_t *args, double *step_reward, int *is_error)
{
    char err[512];
    double reward = 0;
    int error = 0;
    char *out;
    if (step_reward)
        *step_reward = 0;
    if (is_error)
        *is_error = 1;
    if (tool_validate_args(t->schema, args, err, sizeof err) != 0) /* the interface's own message, not cut */
        return error_text("Error: %s", err);
    if (t->ops->execute_in) {
        out = t->ops->execute_in(t, instance_id, args, &reward, &error);
    } else {
        out = t->ops->execute(t, args);
        error = out && strncmp(out, "Error:", 6) == 0;
    }
    if (!out) {
        out = xstrdup("Error: the tool failed");
        error = 1;
    }
    char *cut = tool_truncate(out, t->max_response_length, t->truncate_side);
    free(out);
    if (step_reward)
        *step_reward = isfinite(reward) ? reward : 0;
    if (is_error)
        *is_error = error != 0;
    return cut;
}

char *tool_call_in(struct tool *t, const char *instance_id, const char *args_json, double *step_reward, int *is_error)
{
    json_error_t je;
    json_t *args = json_loads(args_json ? args_json : "", JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!args) { /* the interface's own message, not cut */
        if (step_reward)
            *step_reward = 0;
        if (is_error)
            *is_error = 1;
        return error_text("Error: the arguments are not valid JSON: %s", je.text);
    }
    char *out = tool_call_json_in(t, instance_id, args, step_reward, is_error);
    json_decref(args);
    return out;
}

char *tool_call_json(struct tool *t, const json_t *args) { return tool_call_json_in(t, NULL, args, NULL, NULL); }

char *tool_call(struct tool *t, const char *args_json) { return tool_call_in(t, NULL, args_json, NULL, NULL); }

int tool_create(struct tool *t, const char *instance_id, const json_t *create_kwargs, char *err, size_t errlen)
{
    if (create_kwargs && !json_is_object(create_kwargs))
        return error_set(err, errlen, "%s: create_kwargs must be a JSON object", t->name);
    return t->ops->create ? t->ops->create(t, instance_id, create_kwargs, err, errlen) : 0;
}

double tool_calc_reward(struct tool *t, const char *instance_id)
{
    const double r = t->ops->calc_reward ? t->ops->calc_reward(t, instance_id) : 0;
    return isfinite(r) ? r : 0;
}

void tool_release(struct tool *t, const char *instance_id)
{
    if (t->ops->release)
        t->ops->release(t, instance_id);
}

/* ---- the registry ---- */

void tool_set_add(struct tool_set *s, struct tool *t)
{
    s->tools = xrealloc(s->tools, (s->n + 1) * sizeof *s->tools);
    s->tools[s->n++] = t;
}

struct tool *tool_set_find(const struct tool_set *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->tools[i]->name, name) == 0)
            return s->tools[i];
    return NULL;
}

char *tool_set_names(const struct tool_set *s)
{
    size_t n = 1;
    for (size_t i = 0; i < s->n; i++)
        n += strlen(s->tools[i]->name) + 2;
    char *out = xmalloc(n);
    out[0] = '\0';
    for (size_t i = 0; i < s->n; i++) {
        if (i)
            strcat(out, ", ");
        strcat(out, s->tools[i]->name);
    }
    return out;
}

void tool_set_free(struct tool_set *s)
{
    for (size_t i = 0; i < s->n; i++)
        tool_free(s->tools[i]);
    free(s->tools);
    memset(s, 0, sizeof *s);
}
