/* verl's tool-config YAML (data.tool_config_path, `tools: [{class_name, config, tool_schema}]`) read into a
 * tool set, and verl's function_tool_path (a file of @function_tool functions) added to one. Owns: the map from
 * class names to tools, the config keys each accepts, and errors that name the file and line (an unknown class,
 * a class Python cannot import, a malformed schema, a bad config value); and the built-ins by name
 * (tool_builtin_new, tool_set_builtins), so that the tool interface (tool.c) depends on no tool.
 *
 * Class names:
 *   verl.tools.sandbox_fusion_tools.SandboxFusionTool  with config.sandbox_fusion_url: the SandboxFusion client
 *                                                      (sandbox_fusion.c); without one (or an empty one): the
 *                                                      built-in code interpreter
 *   grpo.tools.CodeInterpreter                         the built-in code interpreter
 *   grpo.tools.Calculator                              the built-in calculator
 *   any other package.module.Class                     a Python tool (pytool.c): verl's BaseTool interface */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
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

json_t *agent_yaml_json(yaml_document_t *doc, const yaml_node_t *n) { return node_json(doc, n, 0); }

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

enum tool_kind {
    KIND_CALCULATOR,
    KIND_LOCAL_CODE,  /* the built-in code interpreter */
    KIND_REMOTE_CODE, /* SandboxFusionTool with a URL */
    KIND_PYTHON,      /* a Python class */
};

/* what a tool's config says */
struct tool_cfg {
    size_t max_resp;
    int side;
    struct sandbox_limits lim;       /* KIND_LOCAL_CODE */
    struct sandbox_fusion_config sf; /* KIND_REMOTE_CODE */
    struct pytool_options py;        /* KIND_PYTHON */
};

static int is_key(const char *k, const char *a) { return strcmp(k, a) == 0; }

/* a key the local sandbox takes and a SandboxFusion server does not */
static int local_only_key(const char *k)
{
    return is_key(k, "wall_time_limit_s") || is_key(k, "cpu_time_limit_s") || is_key(k, "max_processes") ||
           is_key(k, "max_output_bytes") || is_key(k, "tmpfs_size_mb") || is_key(k, "python") || is_key(k, "bwrap");
}

static int bool_value(struct ycfg *y, const yaml_node_t *v, const char *key, int *out)
{
    json_t *j = v && v->type == YAML_SCALAR_NODE ? scalar_json(v) : NULL;
    const int ok = json_is_boolean(j);
    if (ok)
        *out = json_is_true(j);
    json_decref(j);
    return ok ? 0 : yfail(y, v, "config.%s: expected true or false", key);
}

/* one key of the code tools' configs (lim for the local sandbox, sf for a SandboxFusion server): 1 when taken,
 * 0 when not one of theirs, -1 on a bad value */
static int code_key(struct ycfg *y, enum tool_kind kind, const char *k, const yaml_node_t *kn, const yaml_node_t *v,
                    struct tool_cfg *c)
{
    struct sandbox_limits *lim = &c->lim;
    double d = 0;
    if (kind == KIND_REMOTE_CODE && local_only_key(k))
        return yfail(y, kn, "config.%s: applies to the built-in local sandbox, not to a SandboxFusion server", k);
    if (is_key(k, "sandbox_fusion_url")) {
        if (kind == KIND_REMOTE_CODE && str_value(y, v, k, c->sf.url, sizeof c->sf.url) != 0)
            return -1;
        if (kind == KIND_REMOTE_CODE && strncmp(c->sf.url, "http://", 7) != 0 && strncmp(c->sf.url, "https://", 8) != 0)
            return yfail(y, v, "config.sandbox_fusion_url: an http:// or https:// URL of SandboxFusion's run_code");
    } else if (is_key(k, "default_timeout") || is_key(k, "wall_time_limit_s")) {
        if (num_value(y, v, k, 0.1, 3600, &d) != 0)
            return -1;
        lim->wall_s = c->sf.timeout_s = d;
    } else if (is_key(k, "memory_limit_mb")) {
        if (num_value(y, v, k, 16, 1 << 20, &d) != 0)
            return -1;
        lim->memory_bytes = (size_t)d << 20;
        c->sf.memory_limit_mb = (int)d;
    } else if (is_key(k, "default_language")) {
        const char *lang = scalar(v);
        if (kind == KIND_LOCAL_CODE && (!lang || strcmp(lang, "python") != 0))
            return yfail(y, v, "config.default_language: only python runs in the built-in sandbox");
        if (!lang || !sandbox_fusion_language_known(lang) || strlen(lang) >= sizeof c->sf.language)
            return yfail(y, v, "config.default_language: '%s' is not a language SandboxFusion runs", lang ?: "?");
        snprintf(c->sf.language, sizeof c->sf.language, "%s", lang);
    } else if (is_key(k, "num_workers") || is_key(k, "rate_limit")) {
        if (num_value(y, v, k, 1, 100000, &d) != 0)
            return -1;
        if (is_key(k, "num_workers"))
            c->sf.num_workers = (int)d;
        else
            c->sf.rate_limit = (int)d;
    } else if (is_key(k, "enable_global_rate_limit")) {
        if (bool_value(y, v, k, &c->sf.global_rate_limit) != 0)
            return -1;
    } else if (kind == KIND_REMOTE_CODE && is_key(k, "api_timeout")) {
        if (num_value(y, v, k, 0, 3600, &c->sf.api_timeout_s) != 0)
            return -1;
    } else if (kind == KIND_REMOTE_CODE && is_key(k, "connect_timeout")) {
        if (num_value(y, v, k, 0.1, 600, &c->sf.connect_timeout_s) != 0)
            return -1;
    } else if (kind == KIND_REMOTE_CODE && is_key(k, "max_attempts")) {
        if (num_value(y, v, k, 1, 100, &d) != 0)
            return -1;
        c->sf.max_attempts = (int)d;
    } else if (is_key(k, "cpu_time_limit_s")) {
        if (num_value(y, v, k, 1, 3600, &lim->cpu_s) != 0)
            return -1;
    } else if (is_key(k, "max_processes")) {
        if (num_value(y, v, k, 4, 100000, &d) != 0)
            return -1;
        lim->max_procs = (int)d;
    } else if (is_key(k, "max_output_bytes")) {
        if (num_value(y, v, k, 1, 1 << 30, &d) != 0)
            return -1;
        lim->max_output = (size_t)d;
    } else if (is_key(k, "tmpfs_size_mb")) {
        if (num_value(y, v, k, 1, 1 << 20, &d) != 0)
            return -1;
        lim->tmpfs_bytes = (size_t)d << 20;
    } else if (is_key(k, "python")) {
        if (str_value(y, v, k, lim->python, sizeof lim->python) != 0)
            return -1;
    } else if (is_key(k, "bwrap")) {
        if (str_value(y, v, k, lim->bwrap, sizeof lim->bwrap) != 0)
            return -1;
    } else {
        return 0;
    }
    return 1;
}

/* one Python tool's key: 1 when it is ours (it reaches the class too), 0 when the class's alone, -1 bad */
static int python_key(struct ycfg *y, const char *k, const yaml_node_t *v, struct tool_cfg *c)
{
    double d = 0;
    if (is_key(k, "timeout")) {
        if (num_value(y, v, k, 0.01, 86400, &c->py.timeout_s) != 0)
            return -1;
    } else if (is_key(k, "num_processes")) {
        if (num_value(y, v, k, 1, PYTOOL_MAX_PROCS, &d) != 0)
            return -1;
        c->py.num_procs = (int)d;
    } else if (is_key(k, "python")) {
        if (str_value(y, v, k, c->py.python, sizeof c->py.python) != 0)
            return -1;
    } else {
        return 0;
    }
    return 1;
}

/* one tool's config mapping */
static int read_config(struct ycfg *y, const char *cls, const yaml_node_t *cfg, enum tool_kind kind, struct tool_cfg *c)
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
            c->max_resp = (size_t)d;
        } else if (strcmp(k, "tool_response_truncate_side") == 0) {
            if (!scalar(v) || (c->side = tool_truncate_side_from_name(scalar(v))) < 0)
                return yfail(y, v, "config.%s: left, right or middle", k);
        } else if (kind == KIND_PYTHON) {
            if (python_key(y, k, v, c) < 0)
                return -1; /* any other key is the class's own: verl hands it the whole config */
        } else if (kind == KIND_CALCULATOR) {
            return yfail(y, kn,
                         "config: unknown key '%s' for %s (type, max_response_length, "
                         "tool_response_truncate_side)",
                         k, cls);
        } else {
            const int rc = code_key(y, kind, k, kn, v, c);
            if (rc < 0)
                return -1;
            if (rc == 0)
                return yfail(y, kn, "config: unknown key '%s' for %s (see docs/tools.md)", k, cls);
        }
    }
    return 0;
}

/* "pkg.module.Class": identifiers joined by dots, at least two */
static int class_path(const char *s)
{
    int parts = 0, start = 1;
    for (; *s; s++) {
        if (*s == '.') {
            if (start)
                return 0;
            start = 1;
        } else if (isalpha((unsigned char)*s) || *s == '_' || (!start && isdigit((unsigned char)*s))) {
            parts += start;
            start = 0;
        } else {
            return 0;
        }
    }
    return !start && parts >= 2;
}

void agent_dir_of(const char *path, char *out, size_t len)
{
    char *abs = realpath(path, NULL);
    snprintf(out, len, "%s", abs ? abs : path);
    free(abs);
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(out, len, ".");
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
    const yaml_node_t *cfgn = map_get(y->doc, item, "config");
    enum tool_kind kind;
    if (strcmp(cls, SANDBOX_FUSION) == 0) {
        const char *url = scalar(map_get(y->doc, cfgn, "sandbox_fusion_url"));
        kind = url && *url ? KIND_REMOTE_CODE : KIND_LOCAL_CODE;
    } else if (strcmp(cls, CODE_INTERPRETER) == 0) {
        kind = KIND_LOCAL_CODE;
    } else if (strcmp(cls, CALCULATOR) == 0) {
        kind = KIND_CALCULATOR;
    } else if (class_path(cls)) {
        kind = KIND_PYTHON;
    } else {
        return yfail(y, cn,
                     "unknown tool class '%s' (built-in: %s, %s, %s; any other is a Python class "
                     "path, package.module.Class)",
                     cls, SANDBOX_FUSION, CODE_INTERPRETER, CALCULATOR);
    }
    const yaml_node_t *sn = map_get(y->doc, item, "tool_schema");
    if (!sn)
        return yfail(y, item, "tool_schema: missing");
    json_t *schema = node_json(y->doc, sn, 0);
    char e[2048], where[256];
    if (!schema)
        return yfail(y, sn, "tool_schema: cannot be read (too deep, or a key that is not a name)");
    if (tool_schema_check(schema, e, sizeof e, where, sizeof where) != 0) {
        json_decref(schema);
        return yfail(y, where[0] ? node_at(y->doc, sn, where) : sn, "%s", e);
    }
    struct tool_cfg c = {.max_resp = TOOL_DEFAULT_MAX_RESPONSE, .side = TOOL_TRUNCATE_MIDDLE};
    sandbox_limits_default(&c.lim);
    sandbox_fusion_config_default(&c.sf);
    pytool_options_default(&c.py);
    agent_dir_of(y->path, c.py.dir, sizeof c.py.dir);
    if (read_config(y, cls, cfgn, kind, &c) != 0) {
        json_decref(schema);
        return -1;
    }
    struct tool *t = NULL;
    const yaml_node_t *at = sn;
    if (kind == KIND_PYTHON) {
        json_t *config = cfgn && cfgn->type == YAML_MAPPING_NODE ? node_json(y->doc, cfgn, 0) : json_object();
        t = config ? pytool_class_new(cls, config, schema, &c.py, e, sizeof e) : NULL;
        if (!config)
            snprintf(e, sizeof e, "config: cannot be read (too deep, or a key that is not a name)");
        json_decref(config);
        at = cn;
    } else if (kind == KIND_REMOTE_CODE) {
        t = sandbox_fusion_new(schema, &c.sf, e, sizeof e);
    } else if (kind == KIND_LOCAL_CODE) {
        t = code_interpreter_new(schema, &c.lim, e, sizeof e);
    } else {
        t = calculator_new(schema, e, sizeof e);
    }
    json_decref(schema);
    if (!t)
        return yfail(y, at, "%s", e);
    if (tool_set_find(s, t->name)) {
        const int rc = yfail(y, sn, "a second tool named '%s'", t->name);
        tool_free(t);
        return rc;
    }
    t->max_response_length = c.max_resp;
    t->truncate_side = (enum tool_truncate_side)c.side;
    tool_set_add(s, t);
    return 0;
}

int agent_yaml_load(const char *path, yaml_document_t *doc, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set(err, errlen, "%s: %s", path, strerror(errno));
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, f);
    int rc = 0;
    if (!yaml_parser_load(&parser, doc))
        rc = error_set(err, errlen, "%s:%zu: %s", path, parser.problem_mark.line + 1,
                       parser.problem ? parser.problem : "not YAML");
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
}

int tool_set_load_yaml(struct tool_set *s, const char *path, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    yaml_document_t doc;
    if (agent_yaml_load(path, &doc, err, errlen) != 0)
        return -1;
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
    if (rc)
        tool_set_free(s);
    return rc;
}

int tool_set_load_function_tools(struct tool_set *s, const char *py_path, char *err, size_t errlen)
{
    struct pytool_options o;
    pytool_options_default(&o);
    struct tool **tools;
    size_t n;
    if (pytool_load_function_file(py_path, &o, &tools, &n, err, errlen) != 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (tool_set_find(s, tools[i]->name))
            rc = error_set(err, errlen, "%s: @function_tool '%s': a tool of that name exists already", py_path,
                           tools[i]->name);
        for (size_t j = 0; j < i && rc == 0; j++)
            if (strcmp(tools[j]->name, tools[i]->name) == 0)
                rc = error_set(err, errlen, "%s: two @function_tool functions named '%s'", py_path, tools[i]->name);
    }
    for (size_t i = 0; i < n; i++) {
        if (rc == 0)
            tool_set_add(s, tools[i]);
        else
            tool_free(tools[i]);
    }
    free(tools);
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
