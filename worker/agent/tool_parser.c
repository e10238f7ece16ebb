#include "tool_parser.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"

int tool_format_from_name(const char *name)
{
    if (!name)
        return -1;
    if (strcmp(name, "hermes") == 0)
        return TOOL_FORMAT_HERMES;
    if (strcmp(name, "llama3_json") == 0)
        return TOOL_FORMAT_LLAMA3_JSON;
    return -1;
}

static struct parsed_call *add_call(struct parsed_turn *t)
{
    t->calls = xrealloc(t->calls, (size_t)(t->n_calls + 1) * sizeof *t->calls);
    struct parsed_call *c = &t->calls[t->n_calls++];
    memset(c, 0, sizeof *c);
    return c;
}

static void malformed(struct parsed_call *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void malformed(struct parsed_call *c, const char *fmt, ...)
{
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    free(c->arguments);
    c->arguments = NULL;
    c->error = xstrdup(m);
}

/* One call object: {"name": "...", args_key: {...}} with args_key "arguments" or "parameters" (either accepted);
 * arguments given as a JSON text of an object are read as that object. */
static void read_call(struct parsed_call *c, json_t *o)
{
    if (!json_is_object(o)) {
        malformed(c, "Error: a tool call must be a JSON object with \"name\" and \"arguments\"");
        return;
    }
    json_t *name = json_object_get(o, "name");
    if (!json_is_string(name) || json_string_length(name) == 0) {
        malformed(c, "Error: a tool call needs \"name\", the tool's name as a string");
        return;
    }
    c->name = xstrdup(json_string_value(name));
    json_t *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    json_t *owned = NULL;
    if (!args || json_is_null(args)) {
        args = owned = json_object();
    } else if (json_is_string(args)) {
        json_error_t e;
        owned = json_loads(json_string_value(args), JSON_REJECT_DUPLICATES, &e);
        args = owned;
        if (!args) {
            malformed(c, "Error: the arguments of the call to '%s' are not valid JSON: %s", c->name, e.text);
            return;
        }
    }
    if (!json_is_object(args))
        malformed(c, "Error: the arguments of the call to '%s' must be a JSON object", c->name);
    else
        c->arguments = CHECK_ALLOC(json_dumps(args, JSON_COMPACT | JSON_ENSURE_ASCII));
    json_decref(owned);
}

static void parse_json_call(struct parsed_call *c, const char *s, size_t len)
{
    json_error_t e;
    json_t *o = json_loadb(s, len, JSON_REJECT_DUPLICATES, &e);
    if (!o) {
        malformed(c, "Error: the tool call is not valid JSON: %s (column %d)", e.text, e.column);
        return;
    }
    read_call(c, o);
    json_decref(o);
}

static void hermes(const char *text, struct parsed_turn *t)
{
    size_t cap = strlen(text) + 1, clen = 0;
    char *content = xmalloc(cap);
    const char *p = text;
    for (;;) {
        const char *open = strstr(p, HERMES_OPEN);
        if (!open) {
            memcpy(content + clen, p, strlen(p));
            clen += strlen(p);
            break;
        }
        memcpy(content + clen, p, (size_t)(open - p));
        clen += (size_t)(open - p);
        const char *body = open + strlen(HERMES_OPEN);
        const char *close = strstr(body, HERMES_CLOSE);
        struct parsed_call *c = add_call(t);
        if (!close) {
            malformed(c, "Error: a tool call opened with " HERMES_OPEN " was not closed with " HERMES_CLOSE);
            break;
        }
        parse_json_call(c, body, (size_t)(close - body));
        p = close + strlen(HERMES_CLOSE);
    }
    content[clen] = '\0';
    t->content = content;
}

static const char *skip_ws(const char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    return s;
}

static void llama3_json(const char *text, struct parsed_turn *t)
{
    const char *s = skip_ws(text);
    if (strncmp(s, PYTHON_TAG, strlen(PYTHON_TAG)) == 0)
        s = skip_ws(s + strlen(PYTHON_TAG));
    if (*s != '{') { /* an answer, not a call */
        t->content = xstrdup(text);
        return;
    }
    t->content = xstrdup("");
    while (*s) {
        json_error_t e;
        json_t *o = json_loads(s, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &e);
        struct parsed_call *c = add_call(t);
        if (!o) {
            malformed(c, "Error: the tool call is not valid JSON: %s (column %d)", e.text, e.column);
            return;
        }
        read_call(c, o);
        json_decref(o);
        s = skip_ws(s + e.position);
        if (*s == ';')
            s = skip_ws(s + 1);
        else if (*s) {
            c = add_call(t);
            malformed(c, "Error: text after a JSON tool call (calls are separated by ';')");
            return;
        }
    }
}

void tool_parse_turn(enum tool_format fmt, const char *text, struct parsed_turn *out)
{
    memset(out, 0, sizeof *out);
    if (!text)
        text = "";
    if (fmt == TOOL_FORMAT_LLAMA3_JSON)
        llama3_json(text, out);
    else
        hermes(text, out);
}

void parsed_turn_free(struct parsed_turn *t)
{
    for (int i = 0; i < t->n_calls; i++) {
        free(t->calls[i].name);
        free(t->calls[i].arguments);
        free(t->calls[i].error);
    }
    free(t->calls);
    free(t->content);
    memset(t, 0, sizeof *t);
}
