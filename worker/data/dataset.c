/* JSONL prompt files (our layout and verl's parquet-exported one), verl's
 * parquet files through a cached JSONL conversion, the configuration entry
 * point, and prompt rendering through the chat template. */
#include "dataset.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/check.h"
#include "common/config.h"
#include "common/fs.h"
#include "common/log.h"
#include "worker/tokenizer/tokenizer.h"

static void free_sample(struct prompt_sample *s)
{
    free(s->data_source);
    free(s->ground_truth);
    for (int m = 0; m < s->n_messages; m++) {
        free(s->messages[m].role);
        free(s->messages[m].content);
    }
    free(s->messages);
    free(s->extra_info_json);
    free(s->agent_name);
    memset(s, 0, sizeof *s);
}

void dataset_free(struct dataset *d)
{
    if (!d)
        return;
    for (int i = 0; i < d->n; i++)
        free_sample(&d->samples[i]);
    free(d->samples);
    d->samples = NULL;
    d->n = 0;
}

/* Room for one more sample (capacity doubles; *cap tracks it). */
static struct prompt_sample *push_sample(struct dataset *d, int *cap)
{
    if (d->n >= *cap) {
        *cap = *cap ? 2 * *cap : 64;
        d->samples = xrealloc(d->samples, (size_t)*cap * sizeof *d->samples);
    }
    struct prompt_sample *s = &d->samples[d->n++];
    memset(s, 0, sizeof *s);
    return s;
}

struct loc {
    const char *path;
    long line;
    char *err;
    size_t errlen;
};

static int bad(const struct loc *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(const struct loc *l, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(l->err, l->errlen, "%s:%ld: %s", l->path, l->line, what);
    return -1;
}

static const char *json_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Shortest "%g" text that reads back as the same double. */
static char *real_text(double v)
{
    char buf[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return xstrdup(buf);
}

static char *ground_truth_text(const json_t *v, const struct loc *l, const char *key)
{
    if (json_is_string(v))
        return xstrdup(json_string_value(v));
    if (json_is_integer(v)) {
        char buf[32];
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return xstrdup(buf);
    }
    if (json_is_real(v))
        return real_text(json_real_value(v));
    if (json_is_object(v) || json_is_array(v)) {
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        return CHECK_ALLOC(s);
    }
    bad(l, "%s: expected a string, number, object or list, got %s", key, json_type_name(v));
    return NULL;
}

static int parse_messages(const json_t *list, const char *key, struct prompt_sample *s, const struct loc *l)
{
    size_t n = json_array_size(list);
    if (n == 0)
        return bad(l, "%s: empty list of messages", key);
    s->messages = xcalloc(n, sizeof *s->messages);
    for (size_t m = 0; m < n; m++) {
        json_t *msg = json_array_get(list, m);
        if (!json_is_object(msg))
            return bad(l, "%s[%zu]: expected an object with role and content, got %s", key, m, json_type_name(msg));
        json_t *role = json_object_get(msg, "role"), *content = json_object_get(msg, "content");
        if (!role)
            return bad(l, "%s[%zu]: missing 'role'", key, m);
        if (!json_is_string(role))
            return bad(l, "%s[%zu].role: expected a string, got %s", key, m, json_type_name(role));
        if (!content)
            return bad(l, "%s[%zu]: missing 'content'", key, m);
        if (!json_is_string(content))
            return bad(l, "%s[%zu].content: expected a string, got %s", key, m, json_type_name(content));
        s->messages[m].role = xstrdup(json_string_value(role));
        s->messages[m].content = xstrdup(json_string_value(content));
        s->n_messages = (int)m + 1;
    }
    return 0;
}

static int parse_sample(const json_t *obj, const char *default_data_source, const struct dataset *d,
                        struct prompt_sample *s, const struct loc *l)
{
    if (!json_is_object(obj))
        return bad(l, "expected a JSON object, got %s", json_type_name(obj));

    /* the prompt: data.prompt_key's column (verl's), else "prompt", else "messages" */
    const char *want = d->prompt_key && *d->prompt_key ? d->prompt_key : "prompt";
    json_t *prompt = json_object_get(obj, want);
    const char *pkey = want;
    if ((!prompt || json_is_null(prompt)) && strcmp(want, "prompt") == 0) {
        prompt = json_object_get(obj, "messages");
        pkey = "messages";
    }
    if (!prompt || json_is_null(prompt)) {
        if (strcmp(want, "prompt") != 0)
            return bad(l, "missing '%s' (data.prompt_key: a string or a list of messages)", want);
        return bad(l, "missing 'prompt' (a string or a list of messages) or 'messages'");
    }
    if (json_is_string(prompt) && strcmp(pkey, "messages") != 0) {
        if (json_string_length(prompt) == 0)
            return bad(l, "prompt: empty string");
        s->messages = xcalloc(1, sizeof *s->messages);
        s->messages[0].role = xstrdup("user");
        s->messages[0].content = xstrdup(json_string_value(prompt));
        s->n_messages = 1;
    } else if (json_is_array(prompt)) {
        if (parse_messages(prompt, pkey, s, l) < 0)
            return -1;
    } else {
        return bad(l, "%s: expected %s, got %s", pkey,
                   strcmp(pkey, "prompt") == 0 ? "a string or a list of messages" : "a list of messages",
                   json_type_name(prompt));
    }

    /* the ground truth: top level, else reward_model.ground_truth (verl) */
    json_t *gt = json_object_get(obj, "ground_truth");
    const char *gkey = "ground_truth";
    if (!gt || json_is_null(gt)) {
        json_t *rm = json_object_get(obj, "reward_model");
        if (rm && !json_is_null(rm) && !json_is_object(rm))
            return bad(l, "reward_model: expected an object, got %s", json_type_name(rm));
        gt = json_object_get(rm, "ground_truth");
        gkey = "reward_model.ground_truth";
    }
    if (!gt || json_is_null(gt))
        return bad(l, "missing 'ground_truth' (or reward_model.ground_truth)");
    s->ground_truth = ground_truth_text(gt, l, gkey);
    if (!s->ground_truth)
        return -1;

    /* the data source: data.reward_fn_key's column (verl's), "data_source" by default */
    const char *skey = d->source_key && *d->source_key ? d->source_key : "data_source";
    json_t *ds = json_object_get(obj, skey);
    if (ds && !json_is_null(ds)) {
        if (!json_is_string(ds))
            return bad(l, "%s: expected a string, got %s", skey, json_type_name(ds));
        if (json_string_length(ds) == 0)
            return bad(l, "%s: empty string", skey);
        s->data_source = xstrdup(json_string_value(ds));
    } else if (default_data_source) {
        s->data_source = xstrdup(default_data_source);
    } else {
        return bad(l, "missing '%s' (it selects the reward scorer%s)", skey,
                   strcmp(skey, "data_source") == 0 ? "" : "; data.reward_fn_key names the column");
    }

    /* extra info, kept as text */
    json_t *extra = json_object_get(obj, "extra_info");
    if (extra && !json_is_null(extra)) {
        if (!json_is_object(extra))
            return bad(l, "extra_info: expected an object, got %s", json_type_name(extra));
        s->extra_info_json = CHECK_ALLOC(json_dumps(extra, JSON_COMPACT));
    }
    /* verl's agent loop of the sample */
    json_t *agent = json_object_get(obj, "agent_name");
    if (agent && !json_is_null(agent)) {
        if (!json_is_string(agent))
            return bad(l, "agent_name: expected a string, got %s", json_type_name(agent));
        const char *an = json_string_value(agent);
        if (strcmp(an, "single_turn_agent") != 0 && strcmp(an, "tool_agent") != 0)
            return bad(l, "agent_name: unknown agent loop '%s' (single_turn_agent, tool_agent)", an);
        s->agent_name = xstrdup(an);
    }
    s->line = (int)l->line;
    return 0;
}

/* Read the JSONL file at path; messages name `shown` (the parquet file a cached conversion came from, whose
 * rows are the JSONL's lines, so "FILE.parquet:ROW:" points at the row counted from 1). */
static int load_jsonl(const char *path, const char *shown, const char *default_data_source, struct dataset *d,
                      char *err, size_t errlen)
{
    char why[256];
    FILE *f = fs_fopen_read(path, why, sizeof why);
    if (!f) {
        if (strcmp(path, shown) != 0)
            snprintf(err, errlen, "%s: cannot open its converted copy %s: %s", shown, path, why);
        else
            snprintf(err, errlen, "%s: cannot open: %s", path, why);
        return -1;
    }
    int cap = d->n; /* the array holds exactly n: grow from there */
    int before = d->n;
    struct loc l = {.path = shown, .err = err, .errlen = errlen};
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &linecap, f)) >= 0) {
        l.line++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        size_t k = 0;
        while (k < (size_t)len && (line[k] == ' ' || line[k] == '\t'))
            k++;
        if (k == (size_t)len)
            continue; /* blank line */
        if (memchr(line, '\0', (size_t)len)) {
            rc = bad(&l, "not valid JSON: NUL byte in the line");
            break;
        }
        json_error_t je;
        json_t *obj = json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
        if (!obj) {
            rc = bad(&l, "not valid JSON: %s (column %d)", je.text, je.column);
            break;
        }
        struct prompt_sample *s = push_sample(d, &cap);
        rc = parse_sample(obj, default_data_source, d, s, &l);
        json_decref(obj);
        if (rc < 0) {
            free_sample(s);
            d->n--;
            break;
        }
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "%s: read error: %s", shown, strerror(errno));
        rc = -1;
    }
    free(line);
    fclose(f);
    if (rc == 0 && d->n == before) {
        snprintf(err, errlen, "%s: no samples (the file is empty or has only blank lines)", shown);
        rc = -1;
    }
    if (rc == 0)
        log_info("data", "%s: %d samples", shown, d->n - before);
    return rc;
}

int dataset_load_jsonl(const char *path, const char *default_data_source, struct dataset *d, char *err, size_t errlen)
{
    return load_jsonl(path, path, default_data_source, d, err, errlen);
}

/* ---- parquet, through a cached JSONL conversion ----
 *
 * There is no Arrow C library in Debian, so scripts/parquet_to_jsonl.py (pyarrow) writes the JSONL once, into
 * ${GRPO_CACHE:-~/.cache/grpo}/datasets/STEM-HASH.jsonl. HASH covers the absolute path, size and modification
 * time of the parquet file and the converter's format version, so an edited file is converted again and an
 * unchanged one never is. The converter writes its output atomically (temporary file, rename), so a cache file
 * is whole, and ranks converting the same file at once each rename a complete copy. */

/* Bump when the converter's output changes, so that old cache files are not reused. */
#define PARQUET_CONVERTER_VERSION "1"

static bool is_parquet(const char *path)
{
    size_t n = strlen(path), k = strlen(".parquet");
    return n > k && strcasecmp(path + n - k, ".parquet") == 0;
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* The cache file of the parquet file at path (which exists). 0, or -1 with err. */
static int parquet_cache_path(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    char abs[PATH_MAX];
    struct stat st;
    if (!realpath(path, abs) || stat(abs, &st) != 0)
        return error_set(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return error_set(err, errlen, "%s: not a regular file", path);
    /* two 64-bit FNV-1a streams with different seeds, 128 bits: no need for a cryptographic hash to tell apart
     * the few files of one user's cache, whose stems also differ most of the time */
    int64_t key[3] = {(int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, (int64_t)st.st_mtim.tv_nsec};
    uint64_t h[2] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL};
    for (int i = 0; i < 2; i++) {
        h[i] = fnv1a(h[i], PARQUET_CONVERTER_VERSION, sizeof PARQUET_CONVERTER_VERSION);
        h[i] = fnv1a(h[i], abs, strlen(abs) + 1);
        h[i] = fnv1a(h[i], key, sizeof key);
    }
    /* the file's stem in the name, for a person listing the cache; only characters that need no quoting */
    const char *base = strrchr(abs, '/') ? strrchr(abs, '/') + 1 : abs;
    char stem[65];
    size_t n = 0;
    for (const char *c = base; *c && n < sizeof stem - 1 && strcasecmp(c, ".parquet") != 0; c++)
        stem[n++] = (isalnum((unsigned char)*c) || *c == '-' || *c == '_' || *c == '.') ? *c : '_';
    stem[n] = '\0';
    const char *cache = getenv("GRPO_CACHE"), *home = getenv("HOME");
    char dir[PATH_MAX];
    if (cache && *cache)
        snprintf(dir, sizeof dir, "%s/datasets", cache);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.cache/grpo/datasets", home);
    else
        return error_set(err, errlen, "%s: no cache directory for its converted copy: set GRPO_CACHE", path);
    if (fs_mkdir_p(dir) != 0)
        return error_set(err, errlen, "%s: cannot create the cache directory %s: %s", path, dir, strerror(errno));
    if ((size_t)snprintf(out, outlen, "%s/%s-%016llx%016llx.jsonl", dir, stem, (unsigned long long)h[0],
                         (unsigned long long)h[1]) >= outlen)
        return error_set(err, errlen, "%s: the cache path under %s is too long", path, dir);
    return 0;
}

/* The converter script: $GRPO_PARQUET_TOOL, else scripts/parquet_to_jsonl.py under the current directory (a
 * run from the source tree), else ../../scripts/ from the executable (build/worker/grpo-worker in the source
 * tree). NULL with why when none is there. */
static const char *find_converter(char *buf, size_t len, char *why, size_t whylen)
{
    const char *env = getenv("GRPO_PARQUET_TOOL");
    if (env && *env) {
        if (access(env, R_OK) != 0) {
            snprintf(why, whylen, "GRPO_PARQUET_TOOL=%s: %s", env, strerror(errno));
            return NULL;
        }
        return env;
    }
    static const char rel[] = "scripts/parquet_to_jsonl.py";
    if (access(rel, R_OK) == 0)
        return rel;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = '\0';
        if ((size_t)snprintf(buf, len, "%s/../../scripts/parquet_to_jsonl.py", exe) < len && access(buf, R_OK) == 0)
            return buf;
    }
    snprintf(why, whylen, "%s not found in the current directory nor beside the executable; set GRPO_PARQUET_TOOL",
             rel);
    return NULL;
}

/* The python to run it with: $GRPO_PARQUET_PYTHON, else the venv scripts/parquet_env.sh makes, else python3. */
static const char *find_python(char *buf, size_t len)
{
    const char *env = getenv("GRPO_PARQUET_PYTHON");
    if (env && *env)
        return env;
    const char *venv = getenv("GRPO_PARQUET_VENV"), *home = getenv("HOME");
    if (venv && *venv)
        snprintf(buf, len, "%s/bin/python", venv);
    else if (home && *home)
        snprintf(buf, len, "%s/.cache/grpo/parquet-venv/bin/python", home);
    else
        return "python3";
    return access(buf, X_OK) == 0 ? buf : "python3";
}

/* Run PYTHON TOOL IN OUT, without a shell, its stdout and stderr captured. 0 with *rows from its "N rows" line;
 * -1 with why (the converter's last line, the path it starts with removed) and *env_problem set when the fault
 * is the environment (no python, no pyarrow) rather than the file. */
static int run_converter(const char *python, const char *tool, const char *in, const char *out, long *rows,
                         bool *env_problem, char *why, size_t whylen)
{
    *env_problem = false;
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(why, whylen, "pipe: %s", strerror(errno));
        return -1;
    }
    /* the read end stays here; the write end becomes the child's stdout and stderr (dup2 clears close-on-exec) */
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawnattr_init(&attr);
    /* the worker's signal mask and ignored signals (SIGPIPE) are not the converter's business */
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {(char *)python, (char *)tool, (char *)in, (char *)out, NULL};
    extern char **environ;
    pid_t pid;
    int e = posix_spawnp(&pid, python, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    if (e != 0) {
        close(fds[0]);
        snprintf(why, whylen, "cannot run %.500s: %s", python, strerror(e));
        *env_problem = true;
        return -1;
    }
    /* keep the first 16 KiB (the converter writes a line or two; a traceback's start is enough), drain the rest */
    char text[16384];
    size_t got = 0;
    for (;;) {
        char chunk[4096];
        ssize_t r = read(fds[0], chunk, sizeof chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        size_t keep = (size_t)r < sizeof text - 1 - got ? (size_t)r : sizeof text - 1 - got;
        memcpy(text + got, chunk, keep);
        got += keep;
    }
    text[got] = '\0';
    close(fds[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            snprintf(why, whylen, "waitpid: %s", strerror(errno));
            return -1;
        }
    }
    /* the last non-empty line: "N rows", the converter's one-line reason, or the end of a traceback */
    while (got > 0 && (text[got - 1] == '\n' || text[got - 1] == '\r' || text[got - 1] == ' '))
        text[--got] = '\0';
    char *last = strrchr(text, '\n') ? strrchr(text, '\n') + 1 : text;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        char *end;
        errno = 0;
        *rows = strtol(last, &end, 10);
        if (end == last || errno != 0 || *rows < 0 || strcmp(end, " rows") != 0) {
            snprintf(why, whylen, "the converter %.500s did not report its rows (it printed '%.200s')", tool, last);
            return -1;
        }
        return 0;
    }
    size_t inlen = strlen(in);
    if (strncmp(last, in, inlen) == 0 && strncmp(last + inlen, ": ", 2) == 0)
        last += inlen + 2;
    if (WIFSIGNALED(st))
        snprintf(why, whylen, "the converter was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else if (*last)
        snprintf(why, whylen, "%.1000s", last);
    else
        snprintf(why, whylen, "the converter exited with status %d", WEXITSTATUS(st));
    /* 3: the converter cannot import pyarrow; 126/127: the python named cannot be run */
    *env_problem = WIFEXITED(st) && (WEXITSTATUS(st) == 3 || WEXITSTATUS(st) == 126 || WEXITSTATUS(st) == 127);
    return -1;
}

/* The JSONL copy of a parquet file in the cache, converted now if it is not there yet. key names the setting
 * (data.train_files) in errors. 0 with the copy's path in out, or -1 with err. */
static int parquet_to_cache(const char *key, const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
    if (parquet_cache_path(path, out, outlen, err, errlen) != 0)
        return -1;
    if (access(out, R_OK) == 0) {
        log_debug("data", "%s: using its converted copy %s", path, out);
        return 0;
    }
    char toolbuf[PATH_MAX], pybuf[PATH_MAX], why[1200];
    const char *tool = find_converter(toolbuf, sizeof toolbuf, why, sizeof why);
    if (!tool)
        return error_set(err, errlen, "%s: %s: cannot convert (%s)", key, path, why);
    const char *python = find_python(pybuf, sizeof pybuf);
    long rows = 0;
    bool env_problem = false;
    /* stdio buffers are not shared with the child (it execs), but a log line written before it should
     * come before the converter's */
    fflush(NULL);
    if (run_converter(python, tool, path, out, &rows, &env_problem, why, sizeof why) != 0)
        return error_set(err, errlen, "%s: %s: cannot convert (%s)%s", key, path, why,
                         env_problem ? "; install pyarrow with scripts/parquet_env.sh" : "");
    log_info("data", "converted %s (%ld rows) to %s", path, rows, out);
    return 0;
}

/* Load one file of data.train_files / data.val_files: JSONL, or parquet through its cached conversion. */
static int load_file(const char *key, const char *path, struct dataset *d, char *err, size_t errlen)
{
    if (!is_parquet(path))
        return dataset_load_jsonl(path, NULL, d, err, errlen);
    char cached[PATH_MAX];
    if (parquet_to_cache(key, path, cached, sizeof cached, err, errlen) != 0)
        return -1;
    return load_jsonl(cached, path, NULL, d, err, errlen);
}

/* Load a list of JSONL or parquet files (the setting key) into d, in order: comma-separated, or verl's list form
 * ['a.parquet', "b.parquet"] / [a.parquet, b.parquet] (brackets and each entry's quotes are dropped). */
static int load_files(const char *key, const char *list, struct dataset *d, char *err, size_t errlen)
{
    char *copy = xstrdup(list);
    char *body = copy;
    while (*body == ' ')
        body++;
    size_t bl = strlen(body);
    while (bl > 0 && body[bl - 1] == ' ')
        body[--bl] = '\0';
    if (bl >= 2 && body[0] == '[' && body[bl - 1] == ']') {
        body[bl - 1] = '\0';
        body++;
    }
    int rc = 0;
    char *save = NULL;
    for (char *p = strtok_r(body, ",", &save); p && rc == 0; p = strtok_r(NULL, ",", &save)) {
        while (*p == ' ')
            p++;
        size_t n = strlen(p);
        while (n > 0 && p[n - 1] == ' ')
            p[--n] = '\0';
        if (n >= 2 && ((p[0] == '\'' && p[n - 1] == '\'') || (p[0] == '"' && p[n - 1] == '"'))) {
            p[--n] = '\0';
            p++;
            n--;
        }
        if (n)
            rc = load_file(key, p, d, err, errlen);
    }
    free(copy);
    return rc;
}

/* verl's data.{train,val}_max_samples: keep max of d's samples, the first ones, or with shuffle a subset drawn
 * from seed (a partial Fisher-Yates shuffle; in file order after). */
static void cap_samples(const char *key, struct dataset *d, long long max, bool shuffle, uint64_t seed)
{
    if (max < 0 || max >= d->n)
        return;
    bool *keep = xcalloc((size_t)(d->n ? d->n : 1), sizeof *keep);
    if (shuffle) {
        int *idx = xmalloc((size_t)d->n * sizeof *idx);
        for (int i = 0; i < d->n; i++)
            idx[i] = i;
        uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x6a09e667f3bcc909ull;
        for (long long i = 0; i < max; i++) {
            x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
            const long long j = i + (long long)(x % (uint64_t)(d->n - i));
            const int t = idx[i];
            idx[i] = idx[j];
            idx[j] = t;
            keep[idx[i]] = true;
        }
        free(idx);
    } else {
        for (long long i = 0; i < max; i++)
            keep[i] = true;
    }
    int w = 0;
    for (int i = 0; i < d->n; i++) {
        if (keep[i])
            d->samples[w++] = d->samples[i];
        else
            free_sample(&d->samples[i]);
    }
    log_info("data", "%s=%lld: %d of %d prompts kept (%s)", key, max, w, d->n,
             shuffle ? "a subset drawn from " KEY_data_seed : "the first ones");
    d->n = w;
    free(keep);
}

int dataset_from_config(const struct grpo_config *cfg, struct dataset *train, struct dataset *val, char *err,
                        size_t errlen)
{
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    train->prompt_key = val->prompt_key = cfg->data_prompt_key;
    train->source_key = val->source_key = cfg->data_reward_fn_key;
    bool train_file = cfg->data_train_files && *cfg->data_train_files;
    bool val_file = cfg->data_val_files && *cfg->data_val_files;
    if (train_file && load_files("data.train_files", cfg->data_train_files, train, err, errlen) < 0)
        goto fail;
    if (val_file && load_files("data.val_files", cfg->data_val_files, val, err, errlen) < 0)
        goto fail;
    if (train_file)
        cap_samples("data.train_max_samples", train, cfg->data_train_max_samples, cfg->data_shuffle,
                    (uint64_t)cfg->data_seed);
    if (val_file)
        cap_samples("data.val_max_samples", val, cfg->data_val_max_samples, cfg->data_shuffle,
                    (uint64_t)cfg->data_seed + 1);
    if (!train_file || !val_file) {
        int task = synth_task_from_name(cfg->data_synthetic_task);
        if (task < 0) {
            snprintf(err, errlen, KEY_data_synthetic_task ": unknown task '%s'", cfg->data_synthetic_task);
            goto fail;
        }
        if (train_file && !val_file)
            return 0; /* a file's task has no synthetic held-out set */
        struct synth_opts o;
        synth_default_opts((enum synth_task)task, &o);
        o.min_digits = (int)cfg->data_synthetic_min_digits;
        o.max_digits = (int)cfg->data_synthetic_max_digits;
        snprintf(o.ops, sizeof o.ops, "%s", cfg->data_synthetic_ops);
        o.shots = (int)cfg->data_synthetic_shots;
        if (synth_generate(&o, (uint64_t)cfg->data_seed, train_file ? 0 : (int)cfg->data_synthetic_num_train,
                           val_file ? 0 : (int)cfg->data_synthetic_num_val, train_file ? NULL : train,
                           val_file ? NULL : val, err, errlen) < 0)
            goto fail;
        log_info("data", "synthetic task %s (seed %lld): %d training, %d validation prompts", cfg->data_synthetic_task,
                 (long long)cfg->data_seed, train->n, val->n);
    }
    return 0;
fail:
    dataset_free(train);
    dataset_free(val);
    return -1;
}

char *dataset_render_prompt(const struct tokenizer *t, const struct prompt_sample *s, char *err, size_t errlen)
{
    struct chat_message stack[8] = {{0}}, *msgs = stack;
    if (s->n_messages > 8)
        msgs = xmalloc((size_t)s->n_messages * sizeof *msgs);
    for (int m = 0; m < s->n_messages; m++) {
        msgs[m].role = s->messages[m].role;
        msgs[m].content = s->messages[m].content;
    }
    char *text = tokenizer_apply_chat_template(t, msgs, s->n_messages, true, err, errlen);
    if (msgs != stack)
        free(msgs);
    return text;
}
