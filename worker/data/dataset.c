/* JSONL prompt files (our layout and verl's parquet-exported one), the
 * configuration entry point, and prompt rendering through the chat template. */
#include "dataset.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/config.h"
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

static int parse_sample(const json_t *obj, const char *default_data_source, struct prompt_sample *s,
                        const struct loc *l)
{
    if (!json_is_object(obj))
        return bad(l, "expected a JSON object, got %s", json_type_name(obj));

    /* the prompt */
    json_t *prompt = json_object_get(obj, "prompt");
    const char *pkey = "prompt";
    if (!prompt || json_is_null(prompt)) {
        prompt = json_object_get(obj, "messages");
        pkey = "messages";
    }
    if (!prompt || json_is_null(prompt))
        return bad(l, "missing 'prompt' (a string or a list of messages) or 'messages'");
    if (json_is_string(prompt) && strcmp(pkey, "prompt") == 0) {
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

    /* the data source */
    json_t *ds = json_object_get(obj, "data_source");
    if (ds && !json_is_null(ds)) {
        if (!json_is_string(ds))
            return bad(l, "data_source: expected a string, got %s", json_type_name(ds));
        if (json_string_length(ds) == 0)
            return bad(l, "data_source: empty string");
        s->data_source = xstrdup(json_string_value(ds));
    } else if (default_data_source) {
        s->data_source = xstrdup(default_data_source);
    } else {
        return bad(l, "missing 'data_source' (it selects the reward scorer)");
    }

    /* extra info, kept as text */
    json_t *extra = json_object_get(obj, "extra_info");
    if (extra && !json_is_null(extra)) {
        if (!json_is_object(extra))
            return bad(l, "extra_info: expected an object, got %s", json_type_name(extra));
        s->extra_info_json = CHECK_ALLOC(json_dumps(extra, JSON_COMPACT));
    }
    s->line = (int)l->line;
    return 0;
}

int dataset_load_jsonl(const char *path, const char *default_data_source, struct dataset *d, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    int cap = d->n; /* the array holds exactly n: grow from there */
    int before = d->n;
    struct loc l = {.path = path, .err = err, .errlen = errlen};
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
        rc = parse_sample(obj, default_data_source, s, &l);
        json_decref(obj);
        if (rc < 0) {
            free_sample(s);
            d->n--;
            break;
        }
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "%s: read error: %s", path, strerror(errno));
        rc = -1;
    }
    free(line);
    fclose(f);
    if (rc == 0 && d->n == before) {
        snprintf(err, errlen, "%s: no samples (the file is empty or has only blank lines)", path);
        rc = -1;
    }
    if (rc == 0)
        log_info("data", "%s: %d samples", path, d->n - before);
    return rc;
}

/* Load a comma-separated list of JSONL files into d. */
static int load_files(const char *list, struct dataset *d, char *err, size_t errlen)
{
    char *copy = xstrdup(list);
    int rc = 0;
    char *save = NULL;
    for (char *p = strtok_r(copy, ",", &save); p && rc == 0; p = strtok_r(NULL, ",", &save)) {
        while (*p == ' ')
            p++;
        size_t n = strlen(p);
        while (n > 0 && p[n - 1] == ' ')
            p[--n] = '\0';
        if (n)
            rc = dataset_load_jsonl(p, NULL, d, err, errlen);
    }
    free(copy);
    return rc;
}

int dataset_from_config(const struct grpo_config *cfg, struct dataset *train, struct dataset *val, char *err,
                        size_t errlen)
{
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    bool train_file = cfg->data_train_files && *cfg->data_train_files;
    bool val_file = cfg->data_val_files && *cfg->data_val_files;
    if (train_file && load_files(cfg->data_train_files, train, err, errlen) < 0)
        goto fail;
    if (val_file && load_files(cfg->data_val_files, val, err, errlen) < 0)
        goto fail;
    if (!train_file || !val_file) {
        int task = synth_task_from_name(cfg->data_synthetic_task);
        if (task < 0) {
            snprintf(err, errlen, "data.synthetic.task: unknown task '%s'", cfg->data_synthetic_task);
            goto fail;
        }
        if (train_file && !val_file)
            return 0; /* a file's task has no synthetic held-out set */
        struct synth_opts o;
        synth_default_opts((enum synth_task)task, &o);
        o.min_digits = (int)cfg->data_synthetic_min_digits;
        o.max_digits = (int)cfg->data_synthetic_max_digits;
        snprintf(o.ops, sizeof o.ops, "%s", cfg->data_synthetic_ops);
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

char *dataset_render_prompt(const struct tokenizer *t, const struct prompt_sample *s)
{
    struct chat_message stack[8] = {{0}}, *msgs = stack;
    if (s->n_messages > 8)
        msgs = xmalloc((size_t)s->n_messages * sizeof *msgs);
    for (int m = 0; m < s->n_messages; m++) {
        msgs[m].role = s->messages[m].role;
        msgs[m].content = s->messages[m].content;
    }
    char *text = tokenizer_apply_chat_template(t, msgs, s->n_messages, true);
    if (msgs != stack)
        free(msgs);
    return text;
}
