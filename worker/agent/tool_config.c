/* verl's tool-config YAML (data.tool_config_path, `tools: [{class_name, config, tool_schema}]`) read into a
 * tool set. Owns: the map from class names to the built-in tools, the config keys each accepts, and errors that
 * name the file and line (an unknown class, a malformed schema, a bad config value); and the built-ins by name
 * (tool_builtin_new, tool_set_builtins), so that the tool interface (tool.c) depends on no tool.
 *
 * Class names:
 *   verl.tools.sandbox_fusion_tools.SandboxFusionTool  the built-in code interpreter, when config has no
 *                                                      sandbox_fusion_url (or an empty one); with a URL it is
 *                                                      refused (the HTTP sandbox client does not exist yet)
 *   grpo.tools.CodeInterpreter                         the built-in code interpreter
 *   grpo.tools.Calculator                              the built-in calculator */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/check.h"
#include "worker/agent/tool.h"

#define SANDBOX_FUSION "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
#define CODE_INTERPRETER "grpo.tools.CodeInterpreter"
#define CALCULATOR "grpo.tools.Calculator"

struct ycfg {
    const char *path;
    yaml_document_t *doc;
    char *err;
    size_t errlen;
};

static size_t line_of(const yaml_node_t *n) { return n ? n->start_mark.line + 1 : 0; }

static int yfail(struct ycfg *y, const yaml_node_t *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int yfail(struct ycfg *y, const yaml_node_t *at, const char *fmt, ...)
{
    char m[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return error_set(y->err, y->errlen, "%s:%zu: %s", y->path, line_of(at), m);
}

static const char *scalar(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* value node of key in a mapping node (NULL when absent) */
static yaml_node_t *map_get(yaml_document_t *doc, const yaml_node_t *map, const char *key)
{
    if (!map || map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        const char *k = scalar(yaml_document_get_node(doc, p->key));
        if (k && strcmp(k, key) == 0)
            return yaml_document_get_node(doc, p->value);
    }
    return NULL;
}

/* YAML 1.1's plain scalars as JSON: null, booleans, integers, floats; anything quoted is a string */
static json_t *scalar_json(const yaml_node_t *n)
{
    const char *s = (const char *)n->data.scalar.value;
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return json_string(s);
    if (!*s || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0)
        return json_null();
    if (strcmp(s, "true") == 0 || strcmp(s, "True") == 0 || strcmp(s, "TRUE") == 0)
        return json_true();
    if (strcmp(s, "false") == 0 || strcmp(s, "False") == 0 || strcmp(s, "FALSE") == 0)
        return json_false();
    char *end;
    errno = 0;
    const long long i = strtoll(s, &end, 10);
    if (*end == '\0' && errno == 0)
        return json_integer(i);
    const double d = strtod(s, &end);
    if (*end == '\0' && isfinite(d) && strpbrk(s, "0123456789"))
        return json_real(d);
    return json_string(s);
}

static json_t *node_json(yaml_document_t *doc, const yaml_node_t *n, int depth)
{
    if (!n || depth > 64)
        return NULL;
    if (n->type == YAML_SCALAR_NODE)
        return scalar_json(n);
    if (n->type == YAML_SEQUENCE_NODE) {
        json_t *a = json_array();
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
            json_t *v = node_json(doc, yaml_document_get_node(doc, *it), depth + 1);
            if (!v) {
                json_decref(a);
                return NULL;
            }
            json_array_append_new(a, v);
        }
        return a;
    }
    json_t *o = json_object();
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const char *k = scalar(yaml_document_get_node(doc, p->key));
        json_t *v = k ? node_json(doc, yaml_document_get_node(doc, p->value), depth + 1) : NULL;
        if (!v) {
            json_decref(o);
            return NULL;
        }
        json_object_set_new(o, k, v);
    }
    return o;
}

/* the node at a dotted path under n, or the deepest one on the way */
static const yaml_node_t *node_at(yaml_document_t *doc, const yaml_node_t *n, const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k; k = strtok_r(NULL, ".", &save)) {
        const yaml_node_t *next = map_get(doc, n, k);
        if (!next)
            break;
        n = next;
    }
    return n;
}

/* a non-negative number from a config value; -1 with the error written */
static int num_value(struct ycfg *y, const yaml_node_t *v, const char *key, double lo, double hi, double *out)
{
    const char *s = scalar(v);
    char *end = NULL;
    const double d = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || !(d >= lo && d <= hi))
        return yfail(y, v, "config.%s: expected a number from %g to %g", key, lo, hi);
    *out = d;
    return 0;
}

static int str_value(struct ycfg *y, const yaml_node_t *v, const char *key, char *out, size_t len)
{
    const char *s = scalar(v);
    if (!s || strlen(s) >= len)
        return yfail(y, v, "config.%s: expected a string (at most %zu characters)", key, len - 1);
    snprintf(out, len, "%s", s);
    return 0;
}

/* one tool's config mapping; code: the code interpreter's keys are allowed (and fill lim) */
static int read_config(struct ycfg *y, const char *cls, const yaml_node_t *cfg, int code, struct sandbox_limits *lim,
                       size_t *max_resp, int *side)
{
    if (!cfg)
        return 0;
    if (cfg->type == YAML_SCALAR_NODE) { /* config: (nothing), ~ or null */
        const char *v = scalar(cfg);
        if (!*v || strcmp(v, "~") == 0 || strcmp(v, "null") == 0)
            return 0;
    }
    if (cfg->type != YAML_MAPPING_NODE)
        return yfail(y, cfg, "config: expected a mapping");
    for (yaml_node_pair_t *p = cfg->data.mapping.pairs.start; p < cfg->data.mapping.pairs.top; p++) {
        const yaml_node_t *kn = yaml_document_get_node(y->doc, p->key);
        const yaml_node_t *v = yaml_document_get_node(y->doc, p->value);
        const char *k = scalar(kn);
        double d = 0;
        if (!k)
            return yfail(y, kn, "config: a key must be a name");
        if (strcmp(k, "type") == 0) { /* verl's tool type: only native tools here */
            if (!scalar(v) || strcmp(scalar(v), "native") != 0)
                return yfail(y, v, "config.type: only 'native' tools exist here (not '%s')", scalar(v) ?: "?");
        } else if (strcmp(k, "max_response_length") == 0 || strcmp(k, "max_tool_response_length") == 0) {
            if (num_value(y, v, k, 0, 1e9, &d) != 0)
                return -1;
            *max_resp = (size_t)d;
        } else if (strcmp(k, "tool_response_truncate_side") == 0) {
            if (!scalar(v) || (*side = tool_truncate_side_from_name(scalar(v))) < 0)
                return yfail(y, v, "config.%s: left, right or middle", k);
        } else if (!code) {
            return yfail(y, kn,
                         "config: unknown key '%s' for %s (type, max_response_length, "
                         "tool_response_truncate_side)",
                         k, cls);
        } else if (strcmp(k, "sandbox_fusion_url") == 0) {
            if (scalar(v) && *scalar(v))
                return yfail(y, v,
                             "config.sandbox_fusion_url: a remote sandbox is not supported yet (the HTTP "
                             "sandbox client does not exist); remove the URL to run code in the built-in "
                             "local sandbox");
        } else if (strcmp(k, "default_timeout") == 0 || strcmp(k, "wall_time_limit_s") == 0) {
            if (num_value(y, v, k, 0.1, 3600, &lim->wall_s) != 0)
                return -1;
        } else if (strcmp(k, "cpu_time_limit_s") == 0) {
            if (num_value(y, v, k, 1, 3600, &lim->cpu_s) != 0)
                return -1;
        } else if (strcmp(k, "memory_limit_mb") == 0) {
            if (num_value(y, v, k, 16, 1 << 20, &d) != 0)
                return -1;
            lim->memory_bytes = (size_t)d << 20;
        } else if (strcmp(k, "max_processes") == 0) {
            if (num_value(y, v, k, 4, 100000, &d) != 0)
                return -1;
            lim->max_procs = (int)d;
        } else if (strcmp(k, "max_output_bytes") == 0) {
            if (num_value(y, v, k, 1, 1 << 30, &d) != 0)
                return -1;
            lim->max_output = (size_t)d;
        } else if (strcmp(k, "tmpfs_size_mb") == 0) {
            if (num_value(y, v, k, 1, 1 << 20, &d) != 0)
                return -1;
            lim->tmpfs_bytes = (size_t)d << 20;
        } else if (strcmp(k, "python") == 0) {
            if (str_value(y, v, k, lim->python, sizeof lim->python) != 0)
                return -1;
        } else if (strcmp(k, "bwrap") == 0) {
            if (str_value(y, v, k, lim->bwrap, sizeof lim->bwrap) != 0)
                return -1;
        } else if (strcmp(k, "default_language") == 0) {
            if (!scalar(v) || strcmp(scalar(v), "python") != 0)
                return yfail(y, v, "config.default_language: only python runs here");
        } else if (strcmp(k, "num_workers") == 0 || strcmp(k, "rate_limit") == 0 ||
                   strcmp(k, "enable_global_rate_limit") == 0) {
            /* verl's Ray pool sizing: read, not used (one call runs at a time per caller) */
        } else {
            return yfail(y, kn, "config: unknown key '%s' for %s (see docs/tools.md)", k, cls);
        }
    }
    return 0;
}

static int load_tool(struct ycfg *y, struct tool_set *s, const yaml_node_t *item)
{
    if (item->type != YAML_MAPPING_NODE)
        return yfail(y, item, "a tool must be a mapping with class_name, config and tool_schema");
    for (yaml_node_pair_t *p = item->data.mapping.pairs.start; p < item->data.mapping.pairs.top; p++) {
        const yaml_node_t *kn = yaml_document_get_node(y->doc, p->key);
        const char *k = scalar(kn);
        if (!k || (strcmp(k, "class_name") != 0 && strcmp(k, "config") != 0 && strcmp(k, "tool_schema") != 0))
            return yfail(y, kn, "unknown key '%s' in a tool (class_name, config, tool_schema)", k ? k : "?");
    }
    const yaml_node_t *cn = map_get(y->doc, item, "class_name");
    const char *cls = scalar(cn);
    if (!cls)
        return yfail(y, cn ? cn : item, "class_name: missing or not a string");
    const int code = strcmp(cls, SANDBOX_FUSION) == 0 || strcmp(cls, CODE_INTERPRETER) == 0;
    if (!code && strcmp(cls, CALCULATOR) != 0)
        return yfail(y, cn, "unknown tool class '%s' (known: %s, %s, %s)", cls, SANDBOX_FUSION, CODE_INTERPRETER,
                     CALCULATOR);
    const yaml_node_t *sn = map_get(y->doc, item, "tool_schema");
    if (!sn)
        return yfail(y, item, "tool_schema: missing");
    json_t *schema = node_json(y->doc, sn, 0);
    char e[512], where[256];
    if (!schema)
        return yfail(y, sn, "tool_schema: cannot be read (too deep, or a key that is not a name)");
    if (tool_schema_check(schema, e, sizeof e, where, sizeof where) != 0) {
        json_decref(schema);
        return yfail(y, where[0] ? node_at(y->doc, sn, where) : sn, "%s", e);
    }
    struct sandbox_limits lim;
    sandbox_limits_default(&lim);
    size_t max_resp = TOOL_DEFAULT_MAX_RESPONSE;
    int side = TOOL_TRUNCATE_MIDDLE;
    if (read_config(y, cls, map_get(y->doc, item, "config"), code, &lim, &max_resp, &side) != 0) {
        json_decref(schema);
        return -1;
    }
    struct tool *t = code ? code_interpreter_new(schema, &lim, e, sizeof e) : calculator_new(schema, e, sizeof e);
    json_decref(schema);
    if (!t)
        return yfail(y, sn, "%s", e);
    if (tool_set_find(s, t->name)) {
        const int rc = yfail(y, sn, "a second tool named '%s'", t->name);
        tool_free(t);
        return rc;
    }
    t->max_response_length = max_resp;
    t->truncate_side = (enum tool_truncate_side)side;
    tool_set_add(s, t);
    return 0;
}

int tool_set_load_yaml(struct tool_set *s, const char *path, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set(err, errlen, "%s: %s", path, strerror(errno));
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    if (!yaml_parser_load(&parser, &doc)) {
        error_set(err, errlen, "%s:%zu: %s", path, parser.problem_mark.line + 1,
                  parser.problem ? parser.problem : "not YAML");
        yaml_parser_delete(&parser);
        fclose(f);
        return -1;
    }
    struct ycfg y = {path, &doc, err, errlen};
    int rc = 0;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    const yaml_node_t *tools = map_get(&doc, root, "tools");
    if (!root || root->type != YAML_MAPPING_NODE) {
        rc = error_set(err, errlen, "%s:%zu: expected a mapping with 'tools'", path, root ? line_of(root) : 1);
    } else if (!tools || tools->type != YAML_SEQUENCE_NODE) {
        rc = yfail(&y, tools ? tools : root, "tools: missing or not a list");
    } else {
        for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top && !rc; p++) {
            const yaml_node_t *kn = yaml_document_get_node(&doc, p->key);
            if (!scalar(kn) || strcmp(scalar(kn), "tools") != 0)
                rc = yfail(&y, kn, "unknown key '%s' (a tool config holds 'tools' only)", scalar(kn) ?: "?");
        }
        for (yaml_node_item_t *it = tools->data.sequence.items.start; it < tools->data.sequence.items.top && !rc; it++)
            rc = load_tool(&y, s, yaml_document_get_node(&doc, *it));
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    if (rc)
        tool_set_free(s);
    return rc;
}

/* ---- the built-ins by name (here, not in tool.c: the interface knows no tool) ---- */

const char *tool_builtin_names(void) { return "code_interpreter, calculator"; }

struct tool *tool_builtin_new(const char *name, char *err, size_t errlen)
{
    if (strcmp(name, "code_interpreter") == 0)
        return code_interpreter_new(NULL, NULL, err, errlen);
    if (strcmp(name, "calculator") == 0)
        return calculator_new(NULL, err, errlen);
    error_set(err, errlen, "unknown tool '%s' (known: %s)", name, tool_builtin_names());
    return NULL;
}

int tool_set_builtins(struct tool_set *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    struct tool *ci = code_interpreter_new(NULL, NULL, err, errlen);
    if (!ci)
        return -1;
    tool_set_add(s, ci);
    struct tool *calc = calculator_new(NULL, err, errlen);
    if (!calc) {
        tool_set_free(s);
        return -1;
    }
    tool_set_add(s, calc);
    return 0;
}
