/* The tool interface of the agent room: a tool is a name, an OpenAI-style JSON schema (verl's tool_schema:
 * {"type":"function","function":{"name","description","parameters":{...}}}) and an execute function that turns
 * the call's arguments into the text the model sees next. Owns: the tool object, argument validation against
 * the schema's "parameters", the truncation of long answers (verl's max_tool_response_length and
 * tool_response_truncate_side), verl's per-trajectory life cycle (create, execute, calc_reward, release), the
 * registry of a rollout's tools, and the tools' constructors (built-ins, Python tools, the SandboxFusion client).
 *
 * tool_call() never fails: a call whose arguments do not parse or do not match the schema, or whose tool
 * reports an error, answers with an error message ("Error: ...") for the model, never a crash of the caller.
 * Every call is safe from several threads at once, also on the same tool. Generation (worker/gen) knows nothing
 * of this room. */
#ifndef GRPO_AGENT_TOOL_H
#define GRPO_AGENT_TOOL_H

#include <jansson.h>
#include <yaml.h>
#include <stdbool.h>
#include <stddef.h>

#include "worker/agent/sandbox.h"

enum tool_truncate_side {
    TOOL_TRUNCATE_LEFT,   /* keep the first N characters (the cut is at the end), verl's "left" */
    TOOL_TRUNCATE_RIGHT,  /* keep the last N characters (the cut is at the start), verl's "right" */
    TOOL_TRUNCATE_MIDDLE, /* keep the first N/2 and the last N - N/2 characters, verl's "middle" (default) */
};

/* verl's defaults: multi_turn.max_tool_response_length 256, tool_response_truncate_side middle */
#define TOOL_DEFAULT_MAX_RESPONSE 256

struct tool;
struct tool_ops {
    /* args: a JSON object already validated against the schema. Returns a malloc'd text for the model (an
     * error message is text too); NULL is answered as "Error: the tool failed". A tool with only this op: its
     * answer is an error (is_error) when it begins with "Error:". */
    char *(*execute)(struct tool *t, const json_t *args);
    void (*destroy)(struct tool *t);
    /* The per-trajectory ops (verl's BaseTool), each optional. instance_id NULL: a call outside any trajectory
     * (the tool makes a fresh instance for it alone). */
    int (*create)(struct tool *t, const char *instance_id, const json_t *create_kwargs, char *err, size_t errlen);
    /* as execute, with the step reward and whether the answer is an error; used instead of execute when set */
    char *(*execute_in)(struct tool *t, const char *instance_id, const json_t *args, double *step_reward,
                        int *is_error);
    double (*calc_reward)(struct tool *t, const char *instance_id);
    void (*release)(struct tool *t, const char *instance_id);
};

struct tool {
    char *name;                 /* tool_schema.function.name */
    json_t *schema;             /* the whole tool_schema (owned) */
    size_t max_response_length; /* characters (UTF-8 code points); 0: no limit */
    enum tool_truncate_side truncate_side;
    const struct tool_ops *ops;
    void *impl;
};

/* A tool with this schema (a reference is taken); NULL with err when the schema is malformed. */
struct tool *tool_new(json_t *schema, const struct tool_ops *ops, void *impl, char *err, size_t errlen);
void tool_free(struct tool *t);

/* Check a tool_schema: type "function", function.name (letters, digits, _ and -, at most 64), an optional
 * description string, parameters an object schema whose properties have known types and whose required names
 * are properties. 0, or -1 with err and *where, the dotted path of the offending node ("function.parameters
 * .properties.code.type") so a config reader can name its line. */
int tool_schema_check(const json_t *schema, char *err, size_t errlen, char *where, size_t wherelen);

/* Validate args (a JSON value) against the schema's parameters: an object, required keys present, the types
 * of string/integer/number/boolean/object/array/null properties match, enum values allowed, no unknown keys
 * when additionalProperties is false. 0, or -1 with a message naming the argument. */
int tool_validate_args(const json_t *schema, const json_t *args, char *err, size_t errlen);

/* text cut to max characters at side, with a marker "...(truncated K characters)..." saying how much was cut;
 * a malloc'd copy (text unchanged when it fits or max is 0). Cuts fall between UTF-8 characters. */
char *tool_truncate(const char *text, size_t max, enum tool_truncate_side side);
/* "left" / "right" / "middle" -> side; -1 when unknown */
int tool_truncate_side_from_name(const char *name);

/* One call as a rollout makes it: parse args_json, validate, execute, truncate. Always a malloc'd text. */
char *tool_call(struct tool *t, const char *args_json);
/* the same with parsed arguments (no reference taken) */
char *tool_call_json(struct tool *t, const json_t *args);

/* verl's BaseTool life cycle, per trajectory (instance_id unique per trajectory and tool). Built-ins ignore it.
 * create_kwargs: a JSON object or NULL. 0, or -1 with err (the trajectory cannot use the tool). */
int tool_create(struct tool *t, const char *instance_id, const json_t *create_kwargs, char *err, size_t errlen);
/* One call in a trajectory: like tool_call (parse, validate, execute, truncate; always a malloc'd text), plus
 * *step_reward (the reward verl's execute returns; 0 when the tool gives none) and *is_error (1 when the answer
 * is an error: malformed args, schema mismatch, exception, timeout, a program that exited non-zero or was
 * stopped). Either pointer may be NULL. Thread-safe: the agent loop calls tools from several threads at once,
 * also the same tool concurrently. instance_id NULL: a call outside any trajectory. */
char *tool_call_in(struct tool *t, const char *instance_id, const char *args_json, double *step_reward, int *is_error);
/* the same with parsed arguments (no reference taken) */
char *tool_call_json_in(struct tool *t, const char *instance_id, const json_t *args, double *step_reward,
                        int *is_error);
/* verl's calc_reward: the instance's reward (0 for built-ins, and when the tool's answer is not a number) */
double tool_calc_reward(struct tool *t, const char *instance_id);
/* the instance ends; its state is freed */
void tool_release(struct tool *t, const char *instance_id);

/* ---- verl's YAML files (tool_config.c; interaction.c reads its file with it too) ---- */
/* Parse the YAML file at path into doc (delete it with yaml_document_delete). 0, or -1 with err naming
 * FILE:LINE of a syntax error, or the file's open error. */
int agent_yaml_load(const char *path, yaml_document_t *doc, char *err, size_t errlen);
/* A YAML node of doc as JSON (YAML 1.1's plain scalars typed: null, booleans, numbers), or NULL (too deep). */
json_t *agent_yaml_json(yaml_document_t *doc, const yaml_node_t *n);
/* The directory of the YAML file at path into out (the modules of its classes may sit beside it; "." for a bare
 * name). */
void agent_dir_of(const char *path, char *out, size_t len);

/* ---- built-in tools ---- */

/* code_interpreter: runs the argument "code" (Python source) in the sandbox (worker/agent/sandbox.h) and
 * answers stdout+stderr, with the exit status when non-zero. schema NULL: the default schema. When no sandbox
 * can be made on this machine, every call answers an error and runs nothing. */
struct tool *code_interpreter_new(json_t *schema, const struct sandbox_limits *limits, char *err, size_t errlen);
/* calculator: exact arithmetic on integers of any length and on decimal floats (argument "expression").
 * schema NULL: the default schema. */
struct tool *calculator_new(json_t *schema, char *err, size_t errlen);
/* The calculator itself: the value of expr as Python prints it, or NULL with err. */
char *calculator_eval(const char *expr, char *err, size_t errlen);

/* ---- Python tools (worker/agent/pytool.c) ---- */

struct pytool_options {
    char python[256]; /* the interpreter of the helper processes ("python3", the one the project runs) */
    double timeout_s; /* per call: past it the answer is a timeout and the helper is replaced (default 30) */
    int num_procs;    /* helper processes, calls running at once (default 2, at most 64) */
    char dir[4096];   /* added to the helpers' sys.path after the working directory ("" for none) */
};
#define PYTOOL_DEFAULT_TIMEOUT_S 30.0
#define PYTOOL_DEFAULT_PROCS 2
#define PYTOOL_MAX_PROCS 64
void pytool_options_default(struct pytool_options *o);

/* verl's BaseTool-shaped class class_path ("pkg.module.Class") built as cls(config, tool_schema) in each helper
 * (config: a JSON object or NULL, schema: the tool_schema). NULL with err (Python's reason: the import
 * error, an exception in __init__). */
struct tool *pytool_class_new(const char *class_path, json_t *config, json_t *schema, const struct pytool_options *o,
                              char *err, size_t errlen);
/* The @function_tool functions of the Python file py_path, one tool each, sharing one pool of helpers: *tools
 * (malloc'd array) and *n. 0, or -1 with err (the file cannot be loaded, a schema cannot be derived). */
int pytool_load_function_file(const char *py_path, const struct pytool_options *o, struct tool ***tools, size_t *n,
                              char *err, size_t errlen);

/* ---- Python interactions (worker/agent/pytool.c; verl's BaseInteraction, for worker/agent/interaction.c) ---- */

/* The class class_path built in each helper as cls(config) (config: a JSON object or NULL; its "name" is the
 * interaction's where it names none, as verl's registry does). NULL with err (Python's reason). */
struct pyinteraction *pyinteraction_new(const char *name, const char *class_path, json_t *config,
                                        const struct pytool_options *o, char *err, size_t errlen);
/* The response to a trajectory's conversation (messages, verl's list of {role, content}) after a model turn:
 * generate_response(instance_id, messages, **kwargs), the instance started first on its first turn
 * (start_interaction(instance_id, **kwargs); again, with a warning, when its process was replaced). The text
 * (malloc'd); *terminate when the interaction ends the trajectory, *reward the turn's score where it gave one
 * (*scored). NULL with err (the Python exception, a timeout, a process that died). */
char *pyinteraction_respond(struct pyinteraction *pi, const char *instance_id, const json_t *kwargs,
                            const json_t *messages, int *terminate, double *reward, bool *scored, char *err,
                            size_t errlen);
/* The trajectory is over: finalize_interaction (with the instance's id where the method takes one). */
void pyinteraction_finalize(struct pyinteraction *pi, const char *instance_id);
void pyinteraction_free(struct pyinteraction *pi);

/* ---- the SandboxFusion client (worker/agent/sandbox_fusion.c) ---- */

struct sandbox_fusion_config {
    char url[2048];           /* sandbox_fusion_url: the run_code endpoint */
    double timeout_s;         /* default_timeout: compile and run timeout of the code (default 30) */
    char language[32];        /* default_language (default "python") */
    int memory_limit_mb;      /* memory_limit_mb (default 1024) */
    int num_workers;          /* requests of this tool in flight at once (default 10) */
    int rate_limit;           /* requests in flight at once across the process (default 10) ... */
    int global_rate_limit;    /* ... when enable_global_rate_limit (default true) */
    double api_timeout_s;     /* added to the code's timeouts for the whole HTTP exchange (default 10) */
    double connect_timeout_s; /* connecting (default 5) */
    int max_attempts;         /* tries on a connection error or an HTTP 5xx, with backoff (default 3) */
};
void sandbox_fusion_config_default(struct sandbox_fusion_config *c);
/* Whether SandboxFusion runs this language (verl's list: python, cpp, nodejs, go, java, bash, ...). */
int sandbox_fusion_language_known(const char *lang);
/* The code interpreter run by a SandboxFusion server (POST {code, language, run_timeout, memory_limit_MB, ...}
 * to url). schema: needs a string property "code". NULL with err. */
struct tool *sandbox_fusion_new(json_t *schema, const struct sandbox_fusion_config *c, char *err, size_t errlen);

/* ---- a rollout's tools ---- */

struct tool_set {
    struct tool **tools;
    size_t n;
};
/* One built-in by its name, with its default schema and limits; NULL (err) for an unknown name. */
struct tool *tool_builtin_new(const char *name, char *err, size_t errlen);
/* "code_interpreter, calculator" */
const char *tool_builtin_names(void);
/* The built-ins with their default schemas and limits. */
int tool_set_builtins(struct tool_set *s, char *err, size_t errlen);
/* Read verl's tool-config YAML (tools: [{class_name, config, tool_schema}]); errors name FILE:LINE. */
int tool_set_load_yaml(struct tool_set *s, const char *path, char *err, size_t errlen);
/* Add the @function_tool functions of the Python file py_path (verl's multi_turn.function_tool_path) to s (which
 * may hold tools already, e.g. from tool_set_load_yaml); a name already in s is refused. 0, or -1 with err and s
 * unchanged. */
int tool_set_load_function_tools(struct tool_set *s, const char *py_path, char *err, size_t errlen);
/* t joins the set (which owns it from now on) */
void tool_set_add(struct tool_set *s, struct tool *t);
struct tool *tool_set_find(const struct tool_set *s, const char *name);
/* "a, b, c": the tools' names, for a usage message (malloc'd) */
char *tool_set_names(const struct tool_set *s);
void tool_set_free(struct tool_set *s);

#endif
