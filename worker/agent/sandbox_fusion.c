/* The SandboxFusion client: verl's SandboxFusionTool with config.sandbox_fusion_url set. The code is run by a
 * SandboxFusion server: one POST of {"code", "language", "compile_timeout", "run_timeout", "memory_limit_MB",
 * "stdin": null, "files": {}, "fetch_files": []} to the run_code URL, whose answer {"status": "Success" | "Failed"
 * | "SandboxError", "message", "compile_result", "run_result": {"status": "Finished" | "TimeLimitExceeded" |
 * "Error", "return_code", "stdout", "stderr", ...}} becomes the text the model sees: stdout then stderr, with a
 * note when the program exited non-zero, was stopped by the time limit, or did not compile.
 *
 * Owns: the HTTP exchange (libcurl; HTTPS and proxies as the environment says), its timeouts (connect, and the
 * whole exchange: compile + run timeouts + api_timeout, as verl's client computes it), the retries with backoff
 * (common/backoff.h) on a connection error and an HTTP 5xx, the limits on requests in flight (num_workers per
 * tool, rate_limit across the process when enable_global_rate_limit), and the answers for a server that is
 * down, slow, failing or answering garbage: each an "Error: ..." text for the model (is_error), the details
 * (with the URL, which may hold a key) in the log only. */
#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/backoff.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/agent/tool.h"

#define SF_MAX_BODY (16u << 20) /* bytes of an answer read; more is refused */

/* verl's list of the languages SandboxFusion runs */
static const char *const LANGUAGES[] = {
    "python", "cpp",   "nodejs",        "go",   "go_test", "java",       "php",  "csharp", "bash",  "typescript",
    "sql",    "rust",  "cuda",          "lua",  "R",       "perl",       "D_ut", "ruby",   "scala", "julia",
    "pytest", "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift",  "racket"};

int sandbox_fusion_language_known(const char *lang)
{
    for (size_t i = 0; i < sizeof LANGUAGES / sizeof *LANGUAGES; i++)
        if (strcmp(lang, LANGUAGES[i]) == 0)
            return 1;
    return 0;
}

/* A counting limit on requests in flight. */
struct slots {
    pthread_mutex_t m;
    pthread_cond_t cv;
    int limit, used;
};

static void slots_take(struct slots *s)
{
    pthread_mutex_lock(&s->m);
    while (s->limit > 0 && s->used >= s->limit)
        pthread_cond_wait(&s->cv, &s->m);
    s->used++;
    pthread_mutex_unlock(&s->m);
}

static void slots_give(struct slots *s)
{
    pthread_mutex_lock(&s->m);
    s->used--;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->m);
}

/* verl's global rate limiter is one named actor, made by the first tool that asks (its rate_limit wins) */
static struct slots g_rate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static int g_curl_ok;

static void curl_init_once(void) { g_curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }

struct sf_tool {
    struct sandbox_fusion_config c;
    struct slots own;
};

void sandbox_fusion_config_default(struct sandbox_fusion_config *c)
{
    memset(c, 0, sizeof *c);
    c->timeout_s = 30;
    snprintf(c->language, sizeof c->language, "python");
    c->memory_limit_mb = 1024;
    c->num_workers = 10;
    c->rate_limit = 10;
    c->global_rate_limit = 1;
    c->api_timeout_s = 10;
    c->connect_timeout_s = 5;
    c->max_attempts = 3;
}

struct body {
    char *data;
    size_t len;
    int too_big;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    struct body *b = userdata;
    const size_t n = size * nmemb;
    if (b->len + n > SF_MAX_BODY) {
        b->too_big = 1;
        return 0; /* libcurl stops: CURLE_WRITE_ERROR */
    }
    b->data = xrealloc(b->data, b->len + n + 1);
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

struct exchange {
    CURLcode code;
    long http;
    int connected; /* the connection was made (a timeout after it is the server's slowness) */
    struct body body;
    char errbuf[CURL_ERROR_SIZE];
};

static void post(const struct sandbox_fusion_config *c, const char *payload, double total_s, struct exchange *x)
{
    memset(x, 0, sizeof *x);
    CURL *h = curl_easy_init();
    if (!h) {
        x->code = CURLE_FAILED_INIT;
        return;
    }
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    hdr = curl_slist_append(hdr, "Accept: application/json");
    curl_easy_setopt(h, CURLOPT_URL, c->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(payload));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &x->body);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* timeouts without SIGALRM: we run in several threads */
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)ceil(c->connect_timeout_s * 1000.0));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)ceil(total_s * 1000.0));
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_USERAGENT, "grpo-sandbox-fusion-client");
    x->code = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &x->http);
    long connects = 0;
    curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &connects);
    x->connected = connects > 0 || x->http > 0;
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
}

/* Worth another try: the server could not be reached (yet), or failed on its side (HTTP 5xx). */
static int retryable(const struct exchange *x)
{
    if (x->code == CURLE_OK)
        return x->http >= 500;
    switch (x->code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_RECV_ERROR: return 1;
    case CURLE_OPERATION_TIMEDOUT: return !x->connected; /* a connect timeout; a slow answer is not retried */
    default: return 0;
    }
}

static char *appendf(char *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *appendf(char *s, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    const size_t a = strlen(s), b = strlen(line);
    s = xrealloc(s, a + b + 1);
    memcpy(s + a, line, b + 1);
    return s;
}

/* s + text (a JSON string or null) */
static char *append_text(char *s, const json_t *text)
{
    const char *t = json_string_value(text);
    if (!t)
        return s;
    const size_t a = strlen(s), b = strlen(t);
    s = xrealloc(s, a + b + 1);
    memcpy(s + a, t, b + 1);
    return s;
}

static const char *sep(const char *s) { return *s && s[strlen(s) - 1] != '\n' ? "\n" : ""; }

/* The model's text for a run_code answer. */
static char *interpret(const json_t *o, double timeout_s, int *is_error)
{
    const char *status = json_string_value(json_object_get(o, "status"));
    const json_t *run = json_object_get(o, "run_result"), *comp = json_object_get(o, "compile_result");
    *is_error = 1;
    char *out = xstrdup("");
    if (!status)
        return appendf(out, "Error: the code sandbox's answer has no status");
    if (strcmp(status, "SandboxError") == 0) {
        const char *m = json_string_value(json_object_get(o, "message"));
        return appendf(out, "Error: the code sandbox failed: %.300s", m && *m ? m : "SandboxError");
    }
    if (json_is_object(comp)) {
        const char *cs = json_string_value(json_object_get(comp, "status"));
        const json_t *crc = json_object_get(comp, "return_code");
        if (!cs || strcmp(cs, "Finished") != 0 || (json_is_integer(crc) && json_integer_value(crc) != 0)) {
            out = append_text(out, json_object_get(comp, "stdout"));
            out = append_text(out, json_object_get(comp, "stderr"));
            if (cs && strcmp(cs, "TimeLimitExceeded") == 0)
                return appendf(out, "%s[compile stopped: the time limit of %g s was reached]", sep(out), timeout_s);
            if (json_is_integer(crc))
                return appendf(out, "%s[compile failed: exit status %lld]", sep(out), json_integer_value(crc));
            return appendf(out, "%s[compile failed: %s]", sep(out), cs ? cs : "no status");
        }
    }
    if (!json_is_object(run))
        return appendf(out, "Error: the code sandbox answered '%.40s' without a run result", status);
    out = append_text(out, json_object_get(run, "stdout"));
    out = append_text(out, json_object_get(run, "stderr"));
    const char *rs = json_string_value(json_object_get(run, "status"));
    const json_t *rc = json_object_get(run, "return_code");
    if (rs && strcmp(rs, "Finished") == 0) {
        if (json_is_integer(rc) && json_integer_value(rc) != 0)
            return appendf(out, "%s[exit status %lld]", sep(out), json_integer_value(rc));
        *is_error = 0;
        return out;
    }
    if (rs && strcmp(rs, "TimeLimitExceeded") == 0)
        return appendf(out, "%s[stopped: the time limit of %g s was reached]", sep(out), timeout_s);
    return appendf(out, "%s[the code sandbox could not run the code: %.40s]", sep(out), rs ? rs : "no status");
}

static char *sf_execute_in(struct tool *t, const char *instance_id, const json_t *args, double *step_reward,
                           int *is_error)
{
    (void)instance_id; /* no state between calls */
    struct sf_tool *sf = t->impl;
    const struct sandbox_fusion_config *c = &sf->c;
    *step_reward = 0;
    *is_error = 1;
    char msg[512];
    if (!g_curl_ok)
        return xstrdup("Error: the code sandbox client cannot start (libcurl failed to initialise)");
    const json_t *code = json_object_get(args, "code");
    /* verl's tool: an optional "timeout" and "language" argument override the config's */
    const json_t *ta = json_object_get(args, "timeout"), *la = json_object_get(args, "language");
    const double timeout = json_is_number(ta) && json_number_value(ta) > 0 ? json_number_value(ta) : c->timeout_s;
    const char *lang = json_is_string(la) ? json_string_value(la) : c->language;
    if (!sandbox_fusion_language_known(lang)) {
        snprintf(msg, sizeof msg, "Error: unsupported language '%.40s'", lang);
        return xstrdup(msg);
    }
    char *code_text = json_is_string(code) ? xstrdup(json_string_value(code))
                                           : json_dumps(code ? code : json_null(), JSON_ENCODE_ANY | JSON_COMPACT);
    json_t *req = json_pack("{s:s, s:s, s:f, s:f, s:i, s:n, s:{}, s:[]}", "code", code_text ? code_text : "",
                            "language", lang, "compile_timeout", timeout, "run_timeout", timeout, "memory_limit_MB",
                            c->memory_limit_mb, "stdin", "files", "fetch_files");
    free(code_text);
    char *payload = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!payload)
        return xstrdup("Error: the code cannot be sent (not valid UTF-8)");
    const double total = 2 * timeout + c->api_timeout_s; /* compile + run + slack, as verl's client */
    slots_take(&sf->own);
    if (c->global_rate_limit)
        slots_take(&g_rate);
    struct exchange x;
    struct backoff b;
    backoff_init(&b, 1.0, 8.0);
    int attempt = 0;
    for (;;) {
        attempt++;
        post(c, payload, total, &x);
        if (!retryable(&x) || attempt >= c->max_attempts)
            break;
        log_warn_every("agent", "%s: %s: attempt %d of %d failed (%s), retrying", t->name, c->url, attempt,
                       c->max_attempts,
                       x.code != CURLE_OK ? (x.errbuf[0] ? x.errbuf : curl_easy_strerror(x.code)) : "HTTP 5xx");
        free(x.body.data);
        clock_sleep_s(backoff_next(&b));
    }
    if (c->global_rate_limit)
        slots_give(&g_rate);
    slots_give(&sf->own);
    free(payload);
    char *answer = NULL;
    if (x.code == CURLE_OPERATION_TIMEDOUT && x.connected) {
        snprintf(msg, sizeof msg, "Error: the code sandbox did not answer within %g s", total);
    } else if (x.code == CURLE_WRITE_ERROR && x.body.too_big) {
        snprintf(msg, sizeof msg, "Error: the code sandbox's answer is larger than %u bytes", SF_MAX_BODY);
    } else if (x.code != CURLE_OK) {
        snprintf(msg, sizeof msg, "Error: the code sandbox cannot be reached (%s; %d attempt%s)",
                 curl_easy_strerror(x.code), attempt, attempt == 1 ? "" : "s");
    } else if (x.http >= 500) {
        snprintf(msg, sizeof msg, "Error: the code sandbox failed: HTTP %ld (%d attempt%s)", x.http, attempt,
                 attempt == 1 ? "" : "s");
    } else if (x.http != 200) {
        snprintf(msg, sizeof msg, "Error: the code sandbox refused the request: HTTP %ld: %.200s", x.http,
                 x.body.data ? x.body.data : "");
    } else {
        json_error_t je;
        json_t *o = json_loadb(x.body.data ? x.body.data : "", x.body.len, 0, &je);
        if (!json_is_object(o))
            snprintf(msg, sizeof msg, "Error: the code sandbox's answer is not a JSON object (%zu bytes: %s)",
                     x.body.len, o ? "not an object" : je.text);
        else
            answer = interpret(o, timeout, is_error);
        json_decref(o);
    }
    if (!answer) {
        log_warn_every("agent", "%s: %s: %s%s%s", t->name, c->url, msg, x.errbuf[0] ? ": " : "", x.errbuf);
        answer = xstrdup(msg);
    }
    free(x.body.data);
    return answer;
}

static char *sf_execute(struct tool *t, const json_t *args)
{
    double reward;
    int is_error;
    return sf_execute_in(t, NULL, args, &reward, &is_error);
}

static void sf_destroy(struct tool *t)
{
    struct sf_tool *sf = t->impl;
    pthread_mutex_destroy(&sf->own.m);
    pthread_cond_destroy(&sf->own.cv);
    free(sf);
}

static const struct tool_ops SF_OPS = {.execute = sf_execute, .destroy = sf_destroy, .execute_in = sf_execute_in};

struct tool *sandbox_fusion_new(json_t *schema, const struct sandbox_fusion_config *c, char *err, size_t errlen)
{
    if (strncmp(c->url, "http://", 7) != 0 && strncmp(c->url, "https://", 8) != 0) {
        error_set(err, errlen, "sandbox_fusion_url must be an http:// or https:// URL");
        return NULL;
    }
    if (!sandbox_fusion_language_known(c->language)) {
        error_set(err, errlen, "default_language '%s' is not one SandboxFusion runs", c->language);
        return NULL;
    }
    const json_t *props =
        json_object_get(json_object_get(json_object_get(schema, "function"), "parameters"), "properties");
    const json_t *code = json_object_get(props, "code");
    if (!code || strcmp(json_string_value(json_object_get(code, "type")) ?: "", "string") != 0) {
        error_set(err, errlen,
                  "the code interpreter takes its source in a string argument 'code' "
                  "(function.parameters.properties.code)");
        return NULL;
    }
    pthread_once(&g_curl_once, curl_init_once);
    struct sf_tool *sf = xcalloc(1, sizeof *sf);
    sf->c = *c;
    if (sf->c.max_attempts < 1)
        sf->c.max_attempts = 1;
    pthread_mutex_init(&sf->own.m, NULL);
    pthread_cond_init(&sf->own.cv, NULL);
    sf->own.limit = c->num_workers;
    if (c->global_rate_limit) {
        pthread_mutex_lock(&g_rate.m);
        if (g_rate.limit == 0)
            g_rate.limit = c->rate_limit > 0 ? c->rate_limit : 10;
        pthread_mutex_unlock(&g_rate.m);
    }
    struct tool *t = tool_new(schema, &SF_OPS, sf, err, errlen);
    if (!t) {
        sf_destroy(&(struct tool){.impl = sf});
        return NULL;
    }
    log_debug("agent", "%s: SandboxFusion at %s (%s, %g s, %d MB; %d in flight, %d across the process)", t->name,
              c->url, c->language, c->timeout_s, c->memory_limit_mb, c->num_workers,
              c->global_rate_limit ? g_rate.limit : 0);
    return t;
}
