/* The built-in code_interpreter tool: the argument "code" (Python source) run by worker/agent/sandbox.c, the
 * program's stdout+stderr answered as text with a note for a non-zero exit status or a limit that stopped it.
 * Owns: the default schema, the probe at construction (a machine where no sandbox can be made gets a tool that
 * refuses every call, and one log line saying so), and the wording of what the model sees. An answer is an error
 * (is_error) when no sandbox could run the code, the program exited non-zero (an uncaught exception included), or
 * a limit stopped it. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "worker/agent/tool.h"

struct code_interp {
    struct sandbox_limits limits;
    int available;
    char why[256];
};

static const char DEFAULT_SCHEMA[] =
    "{\"type\": \"function\", \"function\": {\"name\": \"code_interpreter\", \"description\": \"Run Python 3 code "
    "in a sandbox (no network, an empty private directory, time and memory limits) and return what it prints "
    "(stdout and stderr).\", \"parameters\": {\"type\": \"object\", \"properties\": {\"code\": {\"type\": "
    "\"string\", \"description\": \"The Python source to run.\"}}, \"required\": [\"code\"]}}}";

static char *appendf(char *s, size_t *len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static char *appendf(char *s, size_t *len, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    const size_t add = k < 0 ? 0 : (size_t)k < sizeof line ? (size_t)k : sizeof line - 1;
    s = xrealloc(s, *len + add + 1);
    memcpy(s + *len, line, add);
    *len += add;
    s[*len] = '\0';
    return s;
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGXCPU: return "SIGXCPU, the CPU-time limit";
    case SIGKILL: return "SIGKILL";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGXFSZ: return "SIGXFSZ, the file-size limit";
    case SIGBUS: return "SIGBUS";
    default: return NULL;
    }
}

/* The answer; *is_error when the code could not run, or exited non-zero, or a limit stopped it. */
static char *ci_run(struct tool *t, const json_t *args, int *is_error)
{
    struct code_interp *ci = t->impl;
    char msg[512];
    *is_error = 1;
    if (!ci->available) {
        snprintf(msg, sizeof msg, "Error: code execution is unavailable: no sandbox can be made on this machine (%s)",
                 ci->why);
        return xstrdup(msg);
    }
    const char *code = json_string_value(json_object_get(args, "code"));
    if (!code)
        return xstrdup("Error: missing required argument 'code'");
    if (strlen(code) != json_string_length(json_object_get(args, "code")))
        return xstrdup("Error: argument 'code' contains a NUL character");
    struct sandbox_result r;
    char err[256];
    if (sandbox_run_python(&ci->limits, code, &r, err, sizeof err) != 0) {
        snprintf(msg, sizeof msg, "Error: the sandbox could not be started: %s", err);
        return xstrdup(msg);
    }
    size_t len = r.len;
    char *out = r.output;
    r.output = NULL;
    *is_error = r.output_cut || r.wall_killed || r.exit_code != 0;
    const char *sep = len && out[len - 1] != '\n' ? "\n" : "";
    if (r.output_cut)
        out = appendf(out, &len, "%s[output cut at %zu bytes: the program was stopped]", sep, ci->limits.max_output),
        sep = "\n";
    if (r.wall_killed)
        out = appendf(out, &len, "%s[stopped: the wall-time limit of %g s was reached]", sep, ci->limits.wall_s);
    else if (!r.output_cut && r.exit_code != 0) {
        const int sig = r.exit_code > 128 && r.exit_code < 128 + 65 ? r.exit_code - 128 : 0;
        const char *name = sig ? signal_name(sig) : NULL;
        if (sig == SIGXCPU)
            out = appendf(out, &len, "%s[exit status %d: killed by %s of %g s]", sep, r.exit_code, name,
                          ci->limits.cpu_s);
        else if (name)
            out = appendf(out, &len, "%s[exit status %d: killed by %s]", sep, r.exit_code, name);
        else
            out = appendf(out, &len, "%s[exit status %d]", sep, r.exit_code);
    }
    sandbox_result_free(&r);
    return out;
}

static char *ci_execute(struct tool *t, const json_t *args)
{
    int is_error;
    return ci_run(t, args, &is_error);
}

static char *ci_execute_in(struct tool *t, const char *instance_id, const json_t *args, double *step_reward,
                           int *is_error)
{
    (void)instance_id; /* no state between calls: each runs in a fresh sandbox */
    *step_reward = 0;
    return ci_run(t, args, is_error);
}

static void ci_destroy(struct tool *t) { free(t->impl); }

static const struct tool_ops CI_OPS = {.execute = ci_execute, .destroy = ci_destroy, .execute_in = ci_execute_in};

struct tool *code_interpreter_new(json_t *schema, const struct sandbox_limits *limits, char *err, size_t errlen)
{
    json_t *own = NULL;
    if (!schema) {
        own = schema = json_loads(DEFAULT_SCHEMA, 0, NULL);
        if (!own) {
            error_set(err, errlen, "code_interpreter: bad default schema");
            return NULL;
        }
    }
    const json_t *props =
        json_object_get(json_object_get(json_object_get(schema, "function"), "parameters"), "properties");
    const json_t *code = json_object_get(props, "code");
    if (!code || strcmp(json_string_value(json_object_get(code, "type")) ?: "", "string") != 0) {
        json_decref(own);
        error_set(err, errlen,
                  "the code interpreter takes its source in a string argument 'code' "
                  "(function.parameters.properties.code)");
        return NULL;
    }
    struct code_interp *ci = xcalloc(1, sizeof *ci);
    if (limits)
        ci->limits = *limits;
    else
        sandbox_limits_default(&ci->limits);
    struct tool *t = tool_new(schema, &CI_OPS, ci, err, errlen);
    json_decref(own);
    if (!t) {
        free(ci);
        return NULL;
    }
    ci->available = sandbox_available(&ci->limits, ci->why, sizeof ci->why);
    if (ci->available)
        log_debug("agent",
                  "%s: sandbox ready (%s, %s; wall %g s, CPU %g s, memory %zu MiB, %d processes, "
                  "output %zu bytes)",
                  t->name, ci->limits.bwrap, ci->limits.python, ci->limits.wall_s, ci->limits.cpu_s,
                  ci->limits.memory_bytes >> 20, ci->limits.max_procs, ci->limits.max_output);
    else
        log_error("agent", "%s: no sandbox can be made on this machine (%s): the tool will refuse to run code", t->name,
                  ci->why);
    return t;
}
