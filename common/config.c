#include "config.h"
#include "rollout_corr_spec.h"

#include <ctype.h>
#include <jansson.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "log.h"

static const struct cfg_key_info g_keys[] = {
#define X(field, name, type, def, lo, hi, choices, help)                                                               \
    {name, CFG_##type, def, lo, hi, choices, help, offsetof(struct grpo_config, field)},
#include "config_keys.def"
#undef X
};

#define NKEYS ((int)(sizeof g_keys / sizeof g_keys[0]))

int config_num_keys(void) { return NKEYS; }

const struct cfg_key_info *config_key(int i) { return (i >= 0 && i < NKEYS) ? &g_keys[i] : NULL; }

const struct cfg_key_info *config_find(const char *name)
{
    for (int i = 0; i < NKEYS; i++)
        if (strcmp(g_keys[i].name, name) == 0)
            return &g_keys[i];
    const char *alias = config_verl_alias(name);
    if (alias)
        for (int i = 0; i < NKEYS; i++)
            if (strcmp(g_keys[i].name, alias) == 0)
                return &g_keys[i];
    return NULL;
}

static int key_index(const struct cfg_key_info *k) { return (int)(k - g_keys); }

/* Levenshtein distance, bounded to short strings (key names are < 128 chars). */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 127 || lb > 127)
        return 1000;
    int prev[128], cur[128];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

static const char *last_component(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? dot + 1 : name;
}

/* The closest known key, from the same section only:
 * - a known key that ends in ".name" (the section left out: rollout.n for actor_rollout_ref.rollout.n);
 * - a key in the same section whose last component is within a quarter of its length (at least 1) of edits
 *   (data.train_bach_size: data.train_batch_size);
 * - a key under the same top-level section within 2 edits of the whole name (a typo in a section's name).
 * Nothing else: a far-fetched suggestion (use_mbridge: entropy_coeff) misleads more than none. */
const char *config_suggest(const char *name)
{
    const size_t nl = strlen(name);
    for (int i = 0; i < NKEYS; i++) {
        const size_t kl = strlen(g_keys[i].name);
        if (kl > nl && g_keys[i].name[kl - nl - 1] == '.' && strcmp(g_keys[i].name + kl - nl, name) == 0)
            return g_keys[i].name;
    }
    const char *leaf = last_component(name);
    const size_t parent = (size_t)(leaf - name);
    const char *dot = strchr(name, '.');
    const size_t top = dot ? (size_t)(dot - name) + 1 : 0;
    int leaf_limit = (int)strlen(leaf) / 4;
    if (leaf_limit < 1)
        leaf_limit = 1;
    const char *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < NKEYS; i++) {
        const char *k = g_keys[i].name;
        int d = 1 << 30;
        if (parent && strncmp(k, name, parent) == 0 && !strchr(k + parent, '.')) {
            const int dl = edit_distance(leaf, k + parent);
            if (dl <= leaf_limit)
                d = dl;
        }
        if (top && strncmp(k, name, top) == 0) {
            const int dn = edit_distance(name, k);
            if (dn <= 2 && dn < d)
                d = dn;
        }
        if (d < best_d) {
            best_d = d;
            best = k;
        }
    }
    return best;
}

static void *field_ptr(struct grpo_config *c, const struct cfg_key_info *k) { return (char *)c + k->offset; }

static const void *field_cptr(const struct grpo_config *c, const struct cfg_key_info *k)
{
    return (const char *)c + k->offset;
}

static void set_origin(struct grpo_config *c, const struct cfg_key_info *k, const char *origin)
{
    int i = key_index(k);
    free(c->origin[i]);
    c->origin[i] = xstrdup(origin);
}

static void errf(struct cfg_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void errf(struct cfg_error *err, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

static int parse_int(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "on", "1"};
    static const char *const no[] = {"false", "False", "FALSE", "no", "off", "0"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        if (strcmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

static bool enum_has(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return true;
        if (!bar)
            break;
        p = bar + 1;
    }
    return false;
}

/* "[0.9, 0.95]" or "0.9,0.95" */
static int parse_flist(const char *s, struct cfg_flist *out)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", s);
    char *p = buf;
    while (isspace((unsigned char)*p))
        p++;
    size_t len = strlen(p);
    while (len && isspace((unsigned char)p[len - 1]))
        p[--len] = 0;
    if (*p == '[') {
        if (!len || p[len - 1] != ']')
            return -1;
        p[len - 1] = 0;
        p++;
    }
    struct cfg_flist l = {0};
    char *save = NULL;
    for (char *tok = strtok_r(p, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        size_t tl = strlen(tok);
        while (tl && isspace((unsigned char)tok[tl - 1]))
            tok[--tl] = 0;
        if (l.n == CFG_FLIST_MAX || parse_float(tok, &l.v[l.n]) != 0)
            return -1;
        l.n++;
    }
    if (l.n == 0)
        return -1;
    *out = l;
    return 0;
}

static int check_range(const struct cfg_key_info *k, double v, const char *origin, struct cfg_error *err)
{
    if (v < k->min || v > k->max) {
        errf(err, "%s: %s = %g is out of range [%g, %g]", origin, k->name, v, k->min, k->max);
        return -1;
    }
    return 0;
}

/* The index of noted verl key `name` in c->noted ("name=value (why)"), or -1. */
static int find_noted(const struct grpo_config *c, const char *name)
{
    const size_t n = strlen(name);
    for (int i = 0; i < c->n_noted; i++)
        if (strncmp(c->noted[i], name, n) == 0 && c->noted[i][n] == '=')
            return i;
    return -1;
}

/* A verl key accepted with no effect: remembered (the last value of a key given twice) for the start-up line. */
static void note_verl(struct grpo_config *c, const char *name, const char *value, const char *why)
{
    char text[512];
    snprintf(text, sizeof text, "%s=%s (%s)", name, value ? value : "null", why);
    int i = find_noted(c, name);
    if (i < 0) {
        c->noted = xrealloc(c->noted, (size_t)(c->n_noted + 1) * sizeof *c->noted);
        i = c->n_noted++;
    } else {
        free(c->noted[i]);
    }
    c->noted[i] = xstrdup(text);
}

/* Forget a noted verl key (~key). */
static void unnote_verl(struct grpo_config *c, const char *name)
{
    const int i = find_noted(c, name);
    if (i >= 0) {
        free(c->noted[i]);
        c->noted[i] = c->noted[--c->n_noted];
    }
}

/* Hydra's --config-name and --config-path, as verl's launch scripts give them (value: NAME or NAME.yaml). verl's own
 * trainer configs carry the defaults every key here has; the fully-async trainer's (verl/experimental/
 * fully_async_policy/config) turns fully-async training on, as its entry point does, with the async_training
 * defaults it holds (ours); the DAPO recipe's (dapo_trainer, dapo_megatron_trainer) set its own defaults: the dapo
 * reward manager, rounds without bound for dynamic sampling (max_num_gen_batches 0) and the project verl-dapo. Any
 * other config's defaults are not known here: refused, naming it. 0, or -1 (err). */
int config_hydra_option(struct grpo_config *c, const char *option, const char *value, struct cfg_error *err)
{
    if (strcmp(option, "--config-path") == 0) {
        note_verl(c, option, value, "Hydra's config search path: the defaults here are verl's own trainer's");
        return 0;
    }
    char name[256], origin[300];
    snprintf(name, sizeof name, "%s", value);
    snprintf(origin, sizeof origin, "%s=%s", option, value);
    const size_t n = strlen(name);
    if (n > 5 && strcmp(name + n - 5, ".yaml") == 0)
        name[n - 5] = 0;
    if (strcmp(name, "ppo_trainer") == 0 || strcmp(name, "ppo_megatron_trainer") == 0) {
        note_verl(c, option, value, "verl's trainer config, whose defaults are this one's; one engine here");
        return 0;
    }
    if (strcmp(name, "fully_async_ppo_trainer") == 0 || strcmp(name, "fully_async_ppo_megatron_trainer") == 0) {
        c->async_enable = true;
        set_origin(c, config_find(KEY_async_enable), origin);
        return 0;
    }
    if (strcmp(name, "dapo_trainer") == 0 || strcmp(name, "dapo_megatron_trainer") == 0) {
        free(c->trainer_project_name);
        c->trainer_project_name = xstrdup("verl-dapo");
        set_origin(c, config_find(KEY_trainer_project_name), origin);
        c->alg_filter_groups_max_num_gen_batches = 0; /* verl's "no bound" */
        set_origin(c, config_find(KEY_alg_filter_groups_max_num_gen_batches), origin);
        note_verl(c, option, value,
                  "the DAPO recipe's config: the project verl-dapo, dynamic sampling's rounds without bound; its "
                  "dapo reward manager scores per sample as the others here");
        return 0;
    }
    errf(err,
         "command line: %s=%s: a Hydra config other than verl's ppo_trainer, ppo_megatron_trainer, "
         "fully_async_ppo_trainer, fully_async_ppo_megatron_trainer and the DAPO recipe's dapo_trainer and "
         "dapo_megatron_trainer (its defaults are not available here: give its keys as overrides)",
         option, value);
    return -1;
}

/* data.apply_chat_template_kwargs: a JSON object of the chat template's extra variables, set whole (a JSON
 * object) or one variable at a time (data.apply_chat_template_kwargs.NAME=VALUE, as YAML's nested map gives it):
 * true/false, null and numbers are read as such, anything else as text. 0, or -1 with err naming the key. */
static const char CHAT_KWARGS[] = "data.apply_chat_template_kwargs";

static int set_chat_kwargs(struct grpo_config *c, const char *name, const char *value, const char *origin,
                           struct cfg_error *err)
{
    const char *sub = name[sizeof CHAT_KWARGS - 1] == '.' ? name + sizeof CHAT_KWARGS : NULL;
    json_error_t je;
    json_t *obj = json_loads(sub ? c->data_apply_chat_template_kwargs : (value ? value : "{}"), 0, &je);
    if (!json_is_object(obj)) {
        json_decref(obj);
        errf(err,
             "%s: %s=%s: expects a JSON object such as {\"enable_thinking\": false}, or one variable at a time "
             "(%s.enable_thinking=false)",
             origin, name, value ? value : "null", CHAT_KWARGS);
        return -1;
    }
    if (sub) {
        if (!sub[0] || strchr(sub, '.')) {
            json_decref(obj);
            errf(err,
                 "%s: %s: a chat template variable is one name (%s.NAME=VALUE); nested values are set as a "
                 "JSON object: %s={\"NAME\": {...}}",
                 origin, name, CHAT_KWARGS, CHAT_KWARGS);
            return -1;
        }
        json_t *v;
        long long i;
        double d;
        bool b;
        if (!value || strcmp(value, "null") == 0 || strcmp(value, "~") == 0)
            v = json_null();
        else if (parse_bool(value, &b) == 0)
            v = json_boolean(b);
        else if (parse_int(value, &i) == 0)
            v = json_integer(i);
        else if (parse_float(value, &d) == 0)
            v = json_real(d);
        else
            v = json_string(value);
        if (!v) {
            json_decref(obj);
            errf(err, "%s: %s: the value is not UTF-8 text", origin, name);
            return -1;
        }
        json_object_set_new(obj, sub, v);
    }
    char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(obj);
    free(c->data_apply_chat_template_kwargs);
    c->data_apply_chat_template_kwargs = text;
    set_origin(c, config_find(CHAT_KWARGS), origin);
    return 0;
}

bool config_is_map_key(const char *name)
{
    return strncmp(name, CHAT_KWARGS, sizeof CHAT_KWARGS - 1) == 0 &&
           (name[sizeof CHAT_KWARGS - 1] == '.' || name[sizeof CHAT_KWARGS - 1] == 0);
}

int config_set(struct grpo_config *c, const char *name, const char *value, const char *origin, struct cfg_error *err)
{
    if (config_is_map_key(name))
        return set_chat_kwargs(c, name, value, origin, err);
    const struct cfg_key_info *k = config_find(name);
    const char *why = NULL;
    const enum verl_class vc = k ? VERL_UNKNOWN : config_verl_class(name, value, &why);
    if (vc == VERL_NOTED) {
        note_verl(c, name, value, why);
        return 0;
    }
    if (vc == VERL_REFUSED) {
        errf(err, "%s: %s=%s: %s", origin, name, value ? value : "null", why);
        return -1;
    }
    if (k && k->type != CFG_ENUM && config_verl_value_refused(name, value)) {
        errf(err, "%s: %s=%s: %s", origin, name, value, config_verl_value_refused(name, value));
        return -1;
    }
    if (!k) {
        const char *s = config_suggest(name);
        if (s)
            errf(err, "%s: unknown key '%s' (did you mean '%s'?)", origin, name, s);
        else
            errf(err, "%s: unknown key '%s' (see --print-config for every key)", origin, name);
        return -1;
    }
    void *f = field_ptr(c, k);
    switch (k->type) {
    case CFG_INT: {
        long long v;
        if (parse_int(value, &v) != 0) {
            errf(err, "%s: %s expects an integer, got '%s'", origin, name, value);
            return -1;
        }
        if (check_range(k, (double)v, origin, err))
            return -1;
        *(long long *)f = v;
        break;
    }
    case CFG_FLOAT: {
        double v;
        if (parse_float(value, &v) != 0) {
            errf(err, "%s: %s expects a number, got '%s'", origin, name, value);
            return -1;
        }
        if (check_range(k, v, origin, err))
            return -1;
        *(double *)f = v;
        break;
    }
    case CFG_BOOL: {
        bool v;
        if (parse_bool(value, &v) != 0) {
            errf(err, "%s: %s expects true or false, got '%s'", origin, name, value);
            return -1;
        }
        *(bool *)f = v;
        break;
    }
    case CFG_ENUM:
        if (enum_has(k->choices, "bfloat16")) { /* a precision: verl's short spellings, and float16 named */
            if (strcmp(value, "bf16") == 0)
                value = "bfloat16";
            else if (strcmp(value, "fp32") == 0)
                value = "float32";
            else if (strcmp(value, "float16") == 0 || strcmp(value, "fp16") == 0 || strcmp(value, "half") == 0) {
                errf(err, "%s: %s=%s: float16 precision (not available yet: bfloat16 or float32)", origin, name, value);
                return -1;
            }
        }
        if (!enum_has(k->choices, value) && config_verl_value_refused(name, value)) {
            errf(err, "%s: %s=%s: %s (the values here: %s)", origin, name, value,
                 config_verl_value_refused(name, value), k->choices);
            return -1;
        }
        if (!enum_has(k->choices, value)) {
            errf(err, "%s: %s must be one of %s, got '%s'", origin, name, k->choices, value);
            return -1;
        }
        /* fall through */
    case CFG_STR:
        free(*(char **)f);
        *(char **)f = xstrdup(value);
        break;
    case CFG_FLIST: {
        struct cfg_flist l;
        if (parse_flist(value, &l) != 0) {
            errf(err, "%s: %s expects a list of up to %d numbers like [0.9, 0.999], got '%s'", origin, name,
                 CFG_FLIST_MAX, value);
            return -1;
        }
        for (int i = 0; i < l.n; i++)
            if (check_range(k, l.v[i], origin, err))
                return -1;
        *(struct cfg_flist *)f = l;
        break;
    }
    }
    set_origin(c, k, origin);
    return 0;
}

void config_init(struct grpo_config *c)
{
    memset(c, 0, sizeof *c);
    c->origin = xcalloc((size_t)NKEYS, sizeof(char *));
    for (int i = 0; i < NKEYS; i++) {
        struct cfg_error err;
        if (config_set(c, g_keys[i].name, g_keys[i].def, "default", &err) != 0)
            check_failf(__FILE__, __LINE__, "bad built-in default: %s", err.msg);
    }
}

void config_free(struct grpo_config *c)
{
    for (int i = 0; i < NKEYS; i++) {
        if (g_keys[i].type == CFG_STR || g_keys[i].type == CFG_ENUM) {
            char **f = field_ptr(c, &g_keys[i]);
            free(*f);
            *f = NULL;
        }
        if (c->origin)
            free(c->origin[i]);
    }
    free(c->origin);
    c->origin = NULL;
    for (int i = 0; i < c->n_noted; i++)
        free(c->noted[i]);
    free(c->noted);
    c->noted = NULL;
    c->n_noted = 0;
}

int config_apply_override(struct grpo_config *c, const char *arg, struct cfg_error *err)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg) {
        errf(err, "command line: '%s' is not a key=value override", arg);
        return -1;
    }
    char name[256];
    size_t n = (size_t)(eq - arg);
    if (n >= sizeof name) {
        errf(err, "command line: key in '%.60s...' is too long", arg);
        return -1;
    }
    memcpy(name, arg, n);
    name[n] = 0;
    /* Hydra's '+key=value' (add) and '++key=value' (add or override) mean the same thing for a known key */
    const char *key = name;
    while (*key == '+')
        key++;
    if (name[0] == '~')
        return config_reset(c, name + 1, err);
    /* one level of quotes, as a shell leaves them in "key='value'" */
    char value[4096];
    const char *v = eq + 1;
    size_t vn = strlen(v);
    if (vn >= 2 && ((v[0] == '\'' && v[vn - 1] == '\'') || (v[0] == '"' && v[vn - 1] == '"'))) {
        v++;
        vn -= 2;
    }
    if (vn >= sizeof value) {
        errf(err, "command line: the value of %s is too long", key);
        return -1;
    }
    memcpy(value, v, vn);
    value[vn] = 0;
    if (strcmp(value, "null") == 0 && config_find(key)) /* Hydra's null: the default */
        return config_reset(c, key, err);
    return config_set(c, key, value, "command line", err);
}

int config_reset(struct grpo_config *c, const char *name, struct cfg_error *err)
{
    const struct cfg_key_info *k = config_find(name);
    if (!k) {
        const char *why = NULL;
        if (config_verl_class(name, NULL, &why) != VERL_UNKNOWN) {
            unnote_verl(c, name);
            return 0;
        }
        const char *s = config_suggest(name);
        errf(err, "command line: ~%s: unknown key%s%s%s", name, s ? " (did you mean '" : "", s ? s : "",
             s ? "'?)" : "");
        return -1;
    }
    return config_set(c, name, k->def, "default", err);
}

/* Where a key's value came from ("default", "FILE:LINE", "command line"). */
static const char *origin_of(const struct grpo_config *c, const char *name)
{
    const struct cfg_key_info *k = config_find(name);
    return k && c->origin && c->origin[key_index(k)] ? c->origin[key_index(k)] : "?";
}

const char *config_device(const struct grpo_config *c)
{
    return strcmp(c->trainer_device, "cuda") == 0 ? "cuda" : "cpu";
}

bool config_is_set(const struct grpo_config *c, const char *name)
{
    const char *o = origin_of(c, name);
    return strcmp(o, "default") != 0 && strcmp(o, "?") != 0;
}

double config_clip_low(const struct grpo_config *c)
{
    return config_is_set(c, "actor_rollout_ref.actor.clip_ratio_low") ? c->actor_clip_ratio_low : c->actor_clip_ratio;
}

double config_clip_high(const struct grpo_config *c)
{
    return config_is_set(c, "actor_rollout_ref.actor.clip_ratio_high") ? c->actor_clip_ratio_high : c->actor_clip_ratio;
}

long long config_total_steps(const struct grpo_config *c, long long n_train)
{
    const bool steps_given = config_is_set(c, "trainer.total_training_steps");
    const bool epochs_given = config_is_set(c, "trainer.total_epochs");
    if (c->trainer_total_training_steps > 0 && (steps_given || !epochs_given) &&
        !(c->async_enable && c->split_rollout_total_rollout_steps > 0 && !steps_given))
        return c->trainer_total_training_steps;
    if (c->async_enable && c->split_rollout_total_rollout_steps > 0) { /* verl's fully-async count: prompts */
        const long long steps = c->split_rollout_total_rollout_steps / c->data_train_batch_size;
        return steps > 0 ? steps : 1;
    }
    return n_train / config_gen_batch_size(c) * c->trainer_total_epochs;
}

int config_gen_batch_size(const struct grpo_config *c)
{
    return (int)(c->data_gen_batch_size > 0 ? c->data_gen_batch_size : c->data_train_batch_size);
}

bool config_records_routes(const struct grpo_config *c)
{
    return c->rollout_enable_routing_replay || strcmp(c->actor_router_replay_mode, "R3") == 0;
}

int config_filter_rounds(const struct grpo_config *c)
{
    if (!c->alg_filter_groups_enable)
        return 1;
    return c->alg_filter_groups_max_num_gen_batches > 0 ? (int)c->alg_filter_groups_max_num_gen_batches : 1000;
}

/* A run directory component (trainer.project_name, trainer.experiment_name) must stay one directory below
 * trainer.default_local_dir: no path separator, not empty, not "." or "..". */
static int check_dir_component(const struct grpo_config *c, const char *name, const char *v, struct cfg_error *err)
{
    const char *why = NULL;
    if (!v[0])
        why = "is empty";
    else if (strchr(v, '/') || strchr(v, '\\'))
        why = "contains a path separator";
    else if (strcmp(v, ".") == 0 || strcmp(v, "..") == 0)
        why = "names a directory outside the run's own";
    else {
        for (const char *p = v; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) {
                why = "contains a control character";
                break;
            }
    }
    if (!why)
        return 0;
    errf(err,
         "%s: %s = '%s' %s; it names one directory under trainer.default_local_dir, so it may not contain '/' or "
         "'\\' nor be empty, '.' or '..'",
         origin_of(c, name), name, v, why);
    return -1;
}

/* verl's sinks that need a service this project does not talk to */
static const char *const g_remote_sinks[] = {"wandb", "mlflow", "swanlab", "vemlp_wandb", "clearml", "trackio"};

int config_logger_sinks(const struct grpo_config *c, unsigned *sinks, char *skipped, size_t skipped_len,
                        struct cfg_error *err)
{
    *sinks = 0;
    if (skipped && skipped_len)
        skipped[0] = 0;
    char list[512];
    snprintf(list, sizeof list, "%s", c->trainer_logger ? c->trainer_logger : "");
    char *p = list;
    while (*p == ' ' || *p == '[')
        p++;
    char *end = p + strlen(p);
    while (end > p && (end[-1] == ' ' || end[-1] == ']'))
        *--end = 0;
    char *save = NULL;
    for (char *t = strtok_r(p, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        while (*t == ' ' || *t == '\'' || *t == '"')
            t++;
        size_t n = strlen(t);
        while (n > 0 && (t[n - 1] == ' ' || t[n - 1] == '\'' || t[n - 1] == '"'))
            t[--n] = 0;
        if (!n)
            continue;
        if (strcmp(t, "console") == 0) {
            *sinks |= CFG_LOG_CONSOLE;
        } else if (strcmp(t, "tensorboard") == 0) {
            *sinks |= CFG_LOG_TENSORBOARD;
        } else if (strcmp(t, "file") == 0) {
            *sinks |= CFG_LOG_FILE;
        } else {
            bool remote = false;
            for (size_t i = 0; i < sizeof g_remote_sinks / sizeof *g_remote_sinks; i++)
                remote |= strcmp(t, g_remote_sinks[i]) == 0;
            if (!remote) {
                errf(err,
                     "%s: trainer.logger: unknown sink '%s' (console, tensorboard and file are written here; wandb, "
                     "mlflow, swanlab, vemlp_wandb, clearml and trackio are skipped with a notice)",
                     origin_of(c, "trainer.logger"), t);
                return -1;
            }
            if (skipped && skipped_len) {
                size_t k = strlen(skipped);
                snprintf(skipped + k, skipped_len - k, "%s%s", k ? ", " : "", t);
            }
        }
    }
    return 0;
}

int config_lora_targets(const char *list, unsigned *mask, char *why, size_t len)
{
    static const char *const names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    const size_t kinds = sizeof names / sizeof *names;
    *mask = 0;
    const char *p = list ? list : "";
    while (*p) {
        /* one entry: skip separators, brackets and quotes around it */
        p += strspn(p, " \t[],'\"");
        const size_t n = strcspn(p, " \t[],'\"");
        if (!n)
            break;
        unsigned bit = 0;
        if (n == 10 && strncmp(p, "all-linear", n) == 0)
            bit = (1u << kinds) - 1;
        for (size_t k = 0; k < kinds && !bit; k++)
            if (strlen(names[k]) == n && strncmp(p, names[k], n) == 0)
                bit = 1u << k;
        if (!bit) {
            snprintf(why, len,
                     KEY_arr_model_target_modules ": '%.*s' is not all-linear or one of q_proj, k_proj, "
                                                  "v_proj, o_proj, gate_proj, up_proj, down_proj",
                     (int)n, p);
            return -1;
        }
        *mask |= bit;
        p += n;
    }
    if (!*mask) {
        snprintf(why, len, KEY_arr_model_target_modules " is empty: give all-linear or a list of projections");
        return -1;
    }
    return 0;
}

/* exclude_modules as bits (config_lora_targets'); 0 when empty. 0, or -1 with why. */
static int exclude_mask(const struct grpo_config *c, unsigned *drop, char *why, size_t len)
{
    const char *ex = c->arr_model_exclude_modules;
    *drop = 0;
    if (!ex || !ex[0] || strspn(ex, " \t[]'\"") == strlen(ex)) /* empty, or an empty list */
        return 0;
    char inner[256];
    if (config_lora_targets(ex, drop, inner, sizeof inner) != 0 || strstr(ex, "all-linear")) {
        /* PEFT's other form, a string as a regex, is not taken: name the projections */
        snprintf(why, len,
                 KEY_arr_model_exclude_modules " '%s': a regular expression or a module other than a projection "
                                               "(PEFT's string form) is not available: give a list of projection "
                                               "names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                               "down_proj), as in target_modules",
                 ex);
        return -1;
    }
    return 0;
}

int config_lora_mask(const struct grpo_config *c, unsigned *mask, char *why, size_t len)
{
    unsigned drop;
    if (config_lora_targets(c->arr_model_target_modules, mask, why, len) != 0 || exclude_mask(c, &drop, why, len) != 0)
        return -1;
    if (!(*mask & ~drop)) {
        snprintf(why, len,
                 KEY_arr_model_exclude_modules " '%s' leaves nothing of " KEY_arr_model_target_modules " '%s' to adapt",
                 c->arr_model_exclude_modules, c->arr_model_target_modules);
        return -1;
    }
    *mask &= ~drop;
    return 0;
}

int config_list_items(const char *list, char **items, int max)
{
    char *copy = xstrdup(list ? list : ""), *body = copy;
    body += strspn(body, " \t");
    size_t bl = strlen(body);
    while (bl > 0 && isspace((unsigned char)body[bl - 1]))
        body[--bl] = '\0';
    if (bl >= 2 && body[0] == '[' && body[bl - 1] == ']') {
        body[bl - 1] = '\0';
        body++;
    }
    int n = 0;
    char *save = NULL;
    for (char *p = strtok_r(body, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        p += strspn(p, " \t");
        size_t l = strlen(p);
        while (l > 0 && isspace((unsigned char)p[l - 1]))
            p[--l] = '\0';
        if (l >= 2 && (p[0] == '\'' || p[0] == '"') && p[l - 1] == p[0]) {
            p[--l] = '\0';
            p++;
            l--;
        }
        if (!l)
            continue;
        if (n == max) {
            for (int k = 0; k < n; k++)
                free(items[k]);
            free(copy);
            return -1;
        }
        items[n++] = xstrdup(p);
    }
    free(copy);
    return n;
}

int config_gdpo_keys(const struct grpo_config *c, char **keys, double *weights, char *why, size_t whylen)
{
    const int n = config_list_items(c->alg_gdpo_reward_keys, keys, CFG_GDPO_MAX_KEYS);
    if (n < 0) {
        snprintf(why, whylen, KEY_alg_gdpo_reward_keys ": more than %d keys", CFG_GDPO_MAX_KEYS);
        return -1;
    }
    for (int k = 0; k < n; k++)
        weights[k] = 1.0;
    char *w[CFG_GDPO_MAX_KEYS + 1];
    const int nw = config_list_items(c->alg_gdpo_reward_weights, w, CFG_GDPO_MAX_KEYS + 1);
    int rc = n;
    if (nw > 0 && nw != n) {
        snprintf(why, whylen, KEY_alg_gdpo_reward_weights " has %d weights for %d " KEY_alg_gdpo_reward_keys, nw, n);
        rc = -1;
    }
    for (int k = 0; k < nw; k++) {
        char *end;
        const double v = strtod(w[k], &end);
        if (rc >= 0 && (end == w[k] || *end || !isfinite(v))) {
            snprintf(why, whylen, KEY_alg_gdpo_reward_weights ": '%s' is not a number", w[k]);
            rc = -1;
        }
        if (rc >= 0)
            weights[k] = v;
        free(w[k]);
    }
    if (rc < 0)
        for (int k = 0; k < n; k++)
            free(keys[k]);
    return rc;
}

int config_gdpo_parts(const struct grpo_config *c)
{
    if (strcmp(c->alg_adv_estimator, "gdpo") != 0)
        return 0;
    char *keys[CFG_GDPO_MAX_KEYS];
    double w[CFG_GDPO_MAX_KEYS];
    char why[256];
    const int n = config_gdpo_keys(c, keys, w, why, sizeof why);
    for (int k = 0; k < n; k++)
        free(keys[k]);
    return n > 0 ? n : 0;
}

/* The advantage estimator's inputs, as verl's compute_advantage asserts them. */
static int validate_estimator(const struct grpo_config *c, struct cfg_error *err)
{
    const char *est = c->alg_adv_estimator;
    const bool otb = strcmp(est, "optimal_token_baseline") == 0 || strcmp(est, "tir_optimal_token_baseline") == 0;
    if (otb && !c->actor_calculate_sum_pi_squared) {
        errf(err,
             "%s: algorithm.adv_estimator=%s: step-dependent optimal baseline requires sum_pi_squared from actor: set "
             "actor_rollout_ref.actor.calculate_sum_pi_squared=true (verl's requirement)",
             origin_of(c, "algorithm.adv_estimator"), est);
        return -1;
    }
    if (otb && c->alg_rc_bypass_mode) {
        errf(err,
             "%s: algorithm.adv_estimator=%s with algorithm.rollout_correction.bypass_mode=true: bypass mode takes "
             "no old-log-prob pass, where sum_pi_squared is computed (verl fails there too)",
             origin_of(c, "algorithm.adv_estimator"), est);
        return -1;
    }
    char *keys[CFG_GDPO_MAX_KEYS];
    double w[CFG_GDPO_MAX_KEYS];
    char why[256];
    const int n = config_gdpo_keys(c, keys, w, why, sizeof why);
    if (n < 0) {
        errf(err, "%s: %s", origin_of(c, "algorithm.gdpo_reward_keys"), why);
        return -1;
    }
    for (int k = 0; k < n; k++)
        free(keys[k]);
    if (strcmp(est, "gdpo") == 0 && n == 0) {
        errf(err,
             "%s: algorithm.adv_estimator=gdpo requires algorithm.gdpo_reward_keys listing the individual reward "
             "component keys returned by compute_score (e.g. ['format_reward', 'accuracy_reward'])",
             origin_of(c, "algorithm.adv_estimator"));
        return -1;
    }
    return 0;
}

/* LoRA's keys: the targets name projections; under training TP or PP the adapter is sharded like the projections
 * it wraps, but not yet together with expert parallelism (the worker refuses the experts' and the router's adapters
 * under TP or PP, which need the model to know). */
static int validate_lora(const struct grpo_config *c, struct cfg_error *err)
{
    unsigned mask;
    char why[512];
    if (exclude_mask(c, &mask, why, sizeof why) != 0) { /* its form, with or without LoRA */
        errf(err, "%s: %s", origin_of(c, "actor_rollout_ref.model.exclude_modules"), why);
        return -1;
    }
    if (c->arr_model_lora_rank == 0 && !c->arr_model_lora_adapter_path[0])
        return 0;
    if (config_lora_mask(c, &mask, why, sizeof why) != 0) {
        errf(err, "%s: %s", origin_of(c, "actor_rollout_ref.model.target_modules"), why);
        return -1;
    }
    if ((c->actor_megatron_tensor_model_parallel_size > 1 || c->actor_megatron_pipeline_model_parallel_size > 1) &&
        c->actor_megatron_expert_model_parallel_size > 1) {
        errf(err,
             "LoRA (actor_rollout_ref.model.lora_rank=%lld%s%s) with actor_rollout_ref.actor.megatron."
             "expert_model_parallel_size=%lld and actor_rollout_ref.actor.megatron.tensor_model_parallel_size=%lld, "
             "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=%lld: LoRA with expert parallelism and "
             "training tensor or pipeline parallelism together (not available yet: LoRA runs with EP alone, or with "
             "TP and PP alone); set expert_model_parallel_size to 1, or tensor and pipeline_model_parallel_size to 1",
             c->arr_model_lora_rank, c->arr_model_lora_adapter_path[0] ? ", lora_adapter_path=" : "",
             c->arr_model_lora_adapter_path, c->actor_megatron_expert_model_parallel_size,
             c->actor_megatron_tensor_model_parallel_size, c->actor_megatron_pipeline_model_parallel_size);
        return -1;
    }
    if (c->trainer_sft_warmup_steps > 0) {
        errf(err,
             "LoRA (actor_rollout_ref.model.lora_rank) with trainer.sft_warmup_steps=%lld: the supervised warm-start "
             "would replace the reference policy, which with LoRA is the frozen base; warm-start without LoRA, or "
             "set trainer.sft_warmup_steps=0",
             c->trainer_sft_warmup_steps);
        return -1;
    }
    return 0;
}

/* Ulysses sequence parallelism and context parallelism share one dimension of the layout: one or the other. (The
 * device checks of trainer.device=cuda with them, ZeRO-1 among them, are the worker's: see ep_refusals.) */
static int validate_sp(const struct grpo_config *c, struct cfg_error *err)
{
    static const char UKEY[] = "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                      CKEY[] = "actor_rollout_ref.actor.megatron.context_parallel_size";
    const long long cp = c->actor_megatron_context_parallel_size;
    if (cp > 1 && c->actor_ulysses_sequence_parallel_size > 1) {
        errf(err,
             "%s=%lld and %s=%lld: Ulysses sequence parallelism and context parallelism share one dimension; "
             "set one of them back to 1",
             UKEY, c->actor_ulysses_sequence_parallel_size, CKEY, cp);
        return -1;
    }
    return 0; /* either runs in every layout: with DP, TP, PP, ZeRO-1, LoRA, colocated or split, on EP */
}

struct micro_keys {
    const char *global, *per_gpu;
};
static const struct micro_keys MICRO_KEYS[] = {
    [CFG_MICRO_ACTOR] = {"actor_rollout_ref.actor.ppo_micro_batch_size",
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"},
    [CFG_MICRO_OLD_LOGP] = {"actor_rollout_ref.rollout.log_prob_micro_batch_size",
                            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"},
    [CFG_MICRO_REF] = {"actor_rollout_ref.ref.log_prob_micro_batch_size",
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"},
};

static void micro_values(const struct grpo_config *c, enum cfg_micro which, long long *global, long long *per_gpu)
{
    switch (which) {
    case CFG_MICRO_ACTOR:
        *global = c->actor_ppo_micro_batch_size, *per_gpu = c->actor_ppo_micro_batch_size_per_gpu;
        break;
    case CFG_MICRO_OLD_LOGP:
        *global = c->rollout_log_prob_micro_batch_size, *per_gpu = c->rollout_log_prob_micro_batch_size_per_gpu;
        break;
    default: *global = c->ref_log_prob_micro_batch_size, *per_gpu = c->ref_log_prob_micro_batch_size_per_gpu; break;
    }
}

int config_micro_batch(const struct grpo_config *c, enum cfg_micro which, int dp_size, const char **global_key,
                       char *why, size_t whylen)
{
    long long global, per_gpu;
    micro_values(c, which, &global, &per_gpu);
    *global_key = NULL;
    if (global <= 0)
        return (int)per_gpu;
    *global_key = MICRO_KEYS[which].global;
    const long long per = global / (dp_size > 0 ? dp_size : 1);
    if (per < 1) {
        snprintf(why, whylen,
                 "%s=%lld is a micro-batch over all %d data-parallel ranks, fewer sequences than ranks: give at "
                 "least %d, or %s",
                 MICRO_KEYS[which].global, global, dp_size, dp_size, MICRO_KEYS[which].per_gpu);
        return -1;
    }
    return (int)per;
}

/* verl's rule: a micro-batch is given by one of its two keys, not both. */
static int validate_micro(const struct grpo_config *c, struct cfg_error *err)
{
    for (int w = 0; w < 3; w++) {
        long long global, per_gpu;
        micro_values(c, (enum cfg_micro)w, &global, &per_gpu);
        const char *o = origin_of(c, MICRO_KEYS[w].per_gpu);
        if (global > 0 && strcmp(o, "default") != 0) {
            errf(err, "%s and %s (%s) are both set: give one (the first is verl's deprecated global form)",
                 MICRO_KEYS[w].global, MICRO_KEYS[w].per_gpu, o);
            return -1;
        }
    }
    return 0;
}

/* The policy loss's parameters and algorithm.rollout_correction, as verl's loss functions and parsers check them. */
static int validate_losses(const struct grpo_config *c, struct cfg_error *err)
{
    const char *mode = c->actor_policy_loss_mode;
    if (strcmp(mode, "dro") == 0 && !(c->actor_policy_loss_dro_beta > 0)) {
        errf(err,
             "%s: actor_rollout_ref.actor.policy_loss.dro_beta must be a positive value when using DRO (loss_mode "
             "dro), got %g",
             origin_of(c, "actor_rollout_ref.actor.policy_loss.dro_beta"), c->actor_policy_loss_dro_beta);
        return -1;
    }
    if (strcmp(mode, "clip_cov") == 0 && !(c->actor_policy_loss_clip_cov_ratio > 0)) {
        errf(err, "%s: actor_rollout_ref.actor.policy_loss.clip_cov_ratio should be larger than 0 (loss_mode clip_cov)",
             origin_of(c, "actor_rollout_ref.actor.policy_loss.clip_cov_ratio"));
        return -1;
    }
    if (strcmp(mode, "kl_cov") == 0 && !(c->actor_policy_loss_kl_cov_ratio > 0)) {
        errf(err, "%s: actor_rollout_ref.actor.policy_loss.kl_cov_ratio should be larger than 0 (loss_mode kl_cov)",
             origin_of(c, "actor_rollout_ref.actor.policy_loss.kl_cov_ratio"));
        return -1;
    }
    struct rollout_corr rc;
    char why[512];
    if (rollout_corr_parse(c->alg_rc_rollout_is, c->alg_rc_rollout_is_threshold, c->alg_rc_rollout_is_batch_normalize,
                           c->alg_rc_rollout_rs, c->alg_rc_rollout_rs_threshold, c->alg_rc_bypass_mode,
                           c->alg_rc_loss_type, &rc, why, sizeof why) != 0) {
        errf(err, "%s", why);
        return -1;
    }
    if (rc.bypass && strcmp(mode, "vanilla") != 0) {
        errf(
            err,
            "%s: algorithm.rollout_correction.bypass_mode=true with actor_rollout_ref.actor.policy_loss.loss_mode=%s: "
            "bypass mode's loss is algorithm.rollout_correction.loss_type's (verl's trainer replaces loss_mode by it); "
            "leave loss_mode at vanilla",
            origin_of(c, "actor_rollout_ref.actor.policy_loss.loss_mode"), mode);
        return -1;
    }
    if (rc.bypass && rc.batch_normalize && rc.is != RC_OFF) {
        errf(err,
             "%s: algorithm.rollout_correction.rollout_is_batch_normalize=true with bypass_mode=true: verl normalises "
             "bypass mode's IS weights over each micro-batch inside the loss, with a collective over every rank, so "
             "the update depends on the micro-batching; not available here (normalising needs decoupled mode)",
             origin_of(c, "algorithm.rollout_correction.rollout_is_batch_normalize"));
        return -1;
    }
    return 0;
}

/* The async_training.* keys of this table: fully-async training is on when any of them is given. */
static const char *const g_async_keys[] = {
    "async_training.staleness_threshold", "async_training.trigger_parameter_sync_step",
    "async_training.require_batches", "async_training.partial_rollout", "async_training.replay_schedule"};

int config_resolve(struct grpo_config *c, struct cfg_error *err)
{
    const struct cfg_key_info *en = config_find("async_training.enable");
    bool any = false;
    for (size_t i = 0; i < sizeof g_async_keys / sizeof *g_async_keys; i++)
        any |= config_is_set(c, g_async_keys[i]);
    for (int i = 0; i < c->n_noted; i++) /* verl's other async_training.* keys (noted) ask for it too */
        any |= strncmp(c->noted[i], "async_training.", 15) == 0;
    if (any && !c->async_enable && !config_is_set(c, "async_training.enable")) {
        c->async_enable = true;
        set_origin(c, en, "async_training.* given");
    }
    /* verl's trainers without dynamic sampling train each round whole: the PPO trainer's data loader draws
     * gen_batch_size prompts a step, and DAPO's with filter_groups off trains the round it drew (train_batch_size
     * counts only the groups dynamic sampling keeps). Fully-async training streams its prompts (below) */
    if (!c->async_enable && !c->alg_filter_groups_enable && c->data_gen_batch_size > 0 &&
        c->data_gen_batch_size != c->data_train_batch_size) {
        c->data_train_batch_size = c->data_gen_batch_size;
        set_origin(c, config_find(KEY_data_train_batch_size),
                   "data.gen_batch_size without algorithm.filter_groups.enable: verl trains each round whole");
    }
    if (!c->async_enable)
        return 0;
    const long long R = c->async_require_batches * c->actor_ppo_mini_batch_size;
    if (c->data_train_batch_size == 0) {
        c->data_train_batch_size = R;
        set_origin(c, config_find("data.train_batch_size"),
                   "async_training.require_batches x actor_rollout_ref.actor.ppo_mini_batch_size");
    } else if (c->data_train_batch_size != R) {
        errf(err,
             "%s: data.train_batch_size=%lld with fully-async training: a step takes async_training.require_batches "
             "(%lld) x actor_rollout_ref.actor.ppo_mini_batch_size (%lld) = %lld prompts from the stream; give 0 "
             "(verl's fully-async value) or %lld",
             origin_of(c, "data.train_batch_size"), c->data_train_batch_size, c->async_require_batches,
             c->actor_ppo_mini_batch_size, R, R);
        return -1;
    }
    if (c->data_gen_batch_size == 1) { /* verl's fully-async value: samples go one prompt at a time, as here */
        c->data_gen_batch_size = 0;
        set_origin(c, config_find("data.gen_batch_size"), "fully-async training streams its prompts");
    }
    return 0;
}

/* What fully-async training does not run with (yet), refused by name. 0, or -1 with err. */
static int validate_async(const struct grpo_config *c, struct cfg_error *err)
{
    if (!c->async_enable) {
        if (c->data_train_batch_size == 0) {
            errf(err,
                 "%s: data.train_batch_size=0 is verl's fully-async scripts' value: give async_training.* keys for "
                 "fully-async training (a step then takes async_training.require_batches mini-batches), or a batch "
                 "size",
                 origin_of(c, "data.train_batch_size"));
            return -1;
        }
        if (c->split_rollout_total_rollout_steps > 0) {
            errf(err,
                 "%s: rollout.total_rollout_steps counts the prompts of fully-async training: give async_training.* "
                 "keys with it, or trainer.total_training_steps",
                 origin_of(c, "rollout.total_rollout_steps"));
            return -1;
        }
        return 0;
    }
    const char *what = NULL, *key = NULL;
    if (c->alg_filter_groups_enable)
        key = "algorithm.filter_groups.enable", what = "DAPO's dynamic sampling";
    else if (c->data_gen_batch_size > 0)
        key = "data.gen_batch_size", what = "DAPO's generation rounds";
    else if (strcmp(c->rollout_weight_sync, "broadcast") == 0)
        key = "actor_rollout_ref.rollout.weight_sync=broadcast",
        what = "the weight broadcast (each rollout rank fetches the version it needs when it needs it)";
    else if (c->trainer_sft_warmup_steps > 0)
        key = "trainer.sft_warmup_steps", what = "the supervised warm-start";
    else if (c->async_partial_rollout && config_records_routes(c))
        key = "actor_rollout_ref.rollout.enable_rollout_routing_replay (or router_replay.mode=R3)",
        what = "routing replay with async_training.partial_rollout=true (a continued trajectory's routes)";
    else if (c->async_partial_rollout && strcmp(c->alg_adv_estimator, "remax") == 0)
        key = "algorithm.adv_estimator=remax",
        what = "ReMax's greedy baseline with async_training.partial_rollout=true";
    if (what) {
        errf(err, "%s with fully-async training (async_training.*): %s with it (not available yet)", key, what);
        return -1;
    }
    return 0;
}

/* The learning-rate schedule's keys, as Megatron's scheduler checks them (lr_decay_steps against the warm-up: the
 * trainer, which knows the run's steps). */
static int validate_schedule(const struct grpo_config *c, struct cfg_error *err)
{
    if (c->actor_optim_min_lr > 0 && c->actor_optim_min_lr_ratio > 0) {
        errf(err,
             "%s and %s both set the schedule's floor (" KEY_actor_optim_min_lr " %g, " KEY_actor_optim_min_lr_ratio
             " %g): give one (the first is Megatron's, the second FSDP's)",
             origin_of(c, KEY_actor_optim_min_lr), origin_of(c, KEY_actor_optim_min_lr_ratio), c->actor_optim_min_lr,
             c->actor_optim_min_lr_ratio);
        return -1;
    }
    if (c->actor_optim_min_lr > c->actor_optim_lr || c->actor_optim_lr_warmup_init > c->actor_optim_lr) {
        const bool floor = c->actor_optim_min_lr > c->actor_optim_lr;
        const char *key = floor ? KEY_actor_optim_min_lr : KEY_actor_optim_lr_warmup_init;
        errf(err, "%s: %s = %g exceeds the peak " KEY_actor_optim_lr " (%g)", origin_of(c, key), key,
             floor ? c->actor_optim_min_lr : c->actor_optim_lr_warmup_init, c->actor_optim_lr);
        return -1;
    }
    if (strcmp(c->actor_optim_warmup_style, "WSD") == 0 && c->actor_optim_lr_wsd_decay_steps <= 0) {
        errf(err, "%s: the WSD schedule needs " KEY_actor_optim_lr_wsd_decay_steps " (the anneal's length, >= 1)",
             origin_of(c, KEY_actor_optim_warmup_style));
        return -1;
    }
    return 0;
}

/* The rollout's expert parallelism: verl's rule (EP = TP x DP), one engine's TP group (DP 1), no batch-invariant
 * groups. */
static int validate_rollout_ep(const struct grpo_config *c, struct cfg_error *err)
{
    const long long ep = c->rollout_expert_parallel_size, tp = c->rollout_tensor_model_parallel_size,
                    dp = c->rollout_data_parallel_size;
    if (ep <= 1)
        return 0;
    const bool dp_given = config_given(c, KEY_rollout_data_parallel_size);
    if ((dp_given && ep != tp * dp) || ep % tp != 0) {
        errf(err,
             "%s: " KEY_rollout_expert_parallel_size " %lld must equal " KEY_rollout_tensor_model_parallel_size
             " x " KEY_rollout_data_parallel_size " (%lld x %lld), as verl requires",
             origin_of(c, KEY_rollout_expert_parallel_size), ep, tp, dp);
        return -1;
    }
    if (ep > tp) { /* over EP / TP engines, each a TP group */
        errf(err,
             "%s: " KEY_rollout_expert_parallel_size
             " %lld over %lld engines of " KEY_rollout_tensor_model_parallel_size
             " %lld: experts shared between engines (not available yet: the experts are held whole over one engine's "
             "TP group, " KEY_rollout_expert_parallel_size " = " KEY_rollout_tensor_model_parallel_size ")",
             origin_of(c, KEY_rollout_expert_parallel_size), ep, ep / tp, tp);
        return -1;
    }
    if (c->arr_model_batch_invariant) {
        errf(err,
             "%s: " KEY_rollout_expert_parallel_size " with " KEY_arr_model_batch_invariant
             "=true (not available yet: the batch-invariant groups split each expert's rows)",
             origin_of(c, KEY_rollout_expert_parallel_size));
        return -1;
    }
    return 0;
}

bool config_rollout_experts_over_tp(const struct grpo_config *c) { return c->rollout_expert_parallel_size > 1; }

int config_validate(const struct grpo_config *c, struct cfg_error *err)
{
    if (validate_rollout_ep(c, err) != 0)
        return -1;
    if (validate_schedule(c, err) != 0)
        return -1;
    if (validate_async(c, err) != 0)
        return -1;
    if (c->trainer_val_only && !c->trainer_val_before_train) {
        errf(err,
             "%s: " KEY_trainer_val_only "=true with " KEY_trainer_val_before_train "=false would train (verl "
             "validates only before training, and val_only ends the run there): set " KEY_trainer_val_before_train
             "=true",
             origin_of(c, "trainer.val_only"));
        return -1;
    }
    if (validate_lora(c, err) != 0 || validate_sp(c, err) != 0 || validate_micro(c, err) != 0)
        return -1;
    unsigned sinks;
    if (config_logger_sinks(c, &sinks, NULL, 0, err) != 0)
        return -1;
    if (c->rollout_prompt_length && c->rollout_prompt_length != c->data_max_prompt_length) {
        errf(err,
             "%s: actor_rollout_ref.rollout.prompt_length (%lld) differs from data.max_prompt_length (%lld): verl "
             "means the same length by both; give them one value (or leave the rollout's out)",
             origin_of(c, "actor_rollout_ref.rollout.prompt_length"), c->rollout_prompt_length,
             c->data_max_prompt_length);
        return -1;
    }
    if (c->rollout_response_length && c->rollout_response_length != c->data_max_response_length) {
        errf(err,
             "%s: actor_rollout_ref.rollout.response_length (%lld) differs from data.max_response_length (%lld): "
             "verl means the same length by both; give them one value (or leave the rollout's out)",
             origin_of(c, "actor_rollout_ref.rollout.response_length"), c->rollout_response_length,
             c->data_max_response_length);
        return -1;
    }
    if (check_dir_component(c, "trainer.project_name", c->trainer_project_name, err) != 0 ||
        check_dir_component(c, "trainer.experiment_name", c->trainer_experiment_name, err) != 0)
        return -1;
    if (c->trainer_total_training_steps == 0) {
        errf(err,
             "%s: trainer.total_training_steps = 0 would train nothing: give the number of steps (>= 1), or -1 for "
             "trainer.total_epochs passes over the data",
             origin_of(c, "trainer.total_training_steps"));
        return -1;
    }
    if (strcmp(c->test_block_at, "dp_barrier") == 0 && c->arr_nccl_timeout != 0) {
        /* with a deadline the collectives are MPI's non-blocking ones, whose kinds match each other on one group: the
         * barrier would meet the others' all-reduce and end the run on an MPI error instead of a hang */
        errf(err,
             "%s: " KEY_test_block_at "=dp_barrier needs " KEY_arr_nccl_timeout
             "=0 (blocking collectives, where a barrier never meets another collective); it is %lld",
             origin_of(c, KEY_test_block_at), c->arr_nccl_timeout);
        return -1;
    }
    if (!(c->actor_clip_ratio_c > 1.0)) {
        errf(err, "%s: actor_rollout_ref.actor.clip_ratio_c = %g must be greater than 1 (the dual-clip bound)",
             origin_of(c, "actor_rollout_ref.actor.clip_ratio_c"), c->actor_clip_ratio_c);
        return -1;
    }
    if (validate_losses(c, err) != 0 || validate_estimator(c, err) != 0)
        return -1;
    if (c->actor_optim_betas.n != 2) {
        errf(err, "actor_rollout_ref.actor.optim.betas needs exactly two values, got %d (from %s)",
             c->actor_optim_betas.n, c->origin[key_index(config_find("actor_rollout_ref.actor.optim.betas"))]);
        return -1;
    }
    if (c->actor_ppo_mini_batch_size > c->data_train_batch_size) {
        errf(err, "actor_rollout_ref.actor.ppo_mini_batch_size (%lld) exceeds data.train_batch_size (%lld)",
             c->actor_ppo_mini_batch_size, c->data_train_batch_size);
        return -1;
    }
    if (c->data_train_batch_size % c->actor_ppo_mini_batch_size != 0) {
        errf(err,
             "data.train_batch_size (%lld) must be a multiple of actor_rollout_ref.actor.ppo_mini_batch_size (%lld)",
             c->data_train_batch_size, c->actor_ppo_mini_batch_size);
        return -1;
    }
    if (config_clip_low(c) >= 1.0) {
        errf(err, "actor_rollout_ref.actor.clip_ratio_low (%g, or clip_ratio when it is not given) must be below 1",
             config_clip_low(c));
        return -1;
    }
    if (c->data_gen_batch_size && c->data_gen_batch_size != c->data_train_batch_size &&
        c->trainer_sft_warmup_steps > 0) { /* (without dynamic sampling config_resolve made them one) */
        errf(err,
             "%s: data.gen_batch_size=%lld with data.train_batch_size=%lld and trainer.sft_warmup_steps: generation "
             "rounds of another size than the step's batch with a supervised warm-start (not available yet)",
             origin_of(c, "data.gen_batch_size"), c->data_gen_batch_size, c->data_train_batch_size);
        return -1;
    }
    if (c->data_synthetic_min_digits > c->data_synthetic_max_digits) {
        errf(err, "data.synthetic.min_digits (%lld) exceeds data.synthetic.max_digits (%lld)",
             c->data_synthetic_min_digits, c->data_synthetic_max_digits);
        return -1;
    }
    if (!c->data_synthetic_ops[0] || strspn(c->data_synthetic_ops, "+-*") != strlen(c->data_synthetic_ops) ||
        strlen(c->data_synthetic_ops) > 3) {
        errf(err, "data.synthetic.ops must be one to three of + - * (got '%s')", c->data_synthetic_ops);
        return -1;
    }
    if (strcmp(c->trainer_resume_mode, "resume_path") == 0 && !c->trainer_resume_from_path[0]) {
        errf(err, "trainer.resume_mode=resume_path needs trainer.resume_from_path");
        return -1;
    }
    return 0;
}

/* "[a, 'b',\"c\"]" as the YAML flow list ["a", "b", "c"]. */
static void list_text(const char *s, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    const char *p = s + 1, *end = s + strlen(s) - 1;
    int count = 0;
    while (p < end && n < len) {
        p += strspn(p, " ,");
        if (p >= end)
            break;
        const char *q = p;
        while (q < end && *q != ',')
            q++;
        const char *e = q;
        while (e > p && e[-1] == ' ')
            e--;
        if (e - p >= 2 && (*p == '\'' || *p == '"') && e[-1] == *p) {
            p++;
            e--;
        }
        n += (size_t)snprintf(buf + n, len - n, "%s\"%.*s\"", count++ ? ", " : "", (int)(e - p), p);
        p = q;
    }
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

void config_value_text(const struct grpo_config *c, const struct cfg_key_info *k, char *buf, size_t len)
{
    const void *f = field_cptr(c, k);
    switch (k->type) {
    case CFG_INT: snprintf(buf, len, "%lld", *(const long long *)f); break;
    case CFG_FLOAT: snprintf(buf, len, "%.17g", *(const double *)f); break;
    case CFG_BOOL: snprintf(buf, len, "%s", *(const bool *)f ? "true" : "false"); break;
    case CFG_STR:
    case CFG_ENUM: {
        const char *s = *(char *const *)f;
        const size_t sl = strlen(s);
        if (sl >= 2 && s[0] == '[' && s[sl - 1] == ']') { /* a list value: YAML's flow form, each item quoted */
            list_text(s, buf, len);
            break;
        }
        /* quote strings that YAML would read as something else */
        bool plain = s[0] && !strpbrk(s, ":#{}[],&*!|>'\"%@`") && !isspace((unsigned char)s[0]);
        if (plain) {
            snprintf(buf, len, "%s", s);
        } else if (!strpbrk(s, "\"\\")) {
            snprintf(buf, len, "\"%s\"", s);
        } else { /* YAML's single-quoted form: nothing is an escape but '' for a quote */
            size_t n = 0;
            if (len)
                buf[n++] = '\'';
            for (const char *p = s; *p && n + 3 < len; p++) {
                if (*p == '\'')
                    buf[n++] = '\'';
                buf[n++] = *p;
            }
            if (n + 1 < len)
                buf[n++] = '\'';
            buf[n < len ? n : len - 1] = 0;
        }
        break;
    }
    case CFG_FLIST: {
        const struct cfg_flist *l = f;
        size_t n = (size_t)snprintf(buf, len, "[");
        for (int i = 0; i < l->n && n < len; i++)
            n += (size_t)snprintf(buf + n, len - n, "%s%.17g", i ? ", " : "", l->v[i]);
        if (n < len)
            snprintf(buf + n, len - n, "]");
        break;
    }
    }
}

/* Length of the common dotted prefix (whole components) of a and b. */
static size_t common_sections(const char *a, const char *b)
{
    size_t keep = 0;
    for (size_t i = 0; a[i] && a[i] == b[i]; i++)
        if (a[i] == '.')
            keep = i + 1;
    return keep;
}

/* Index of the first key (in config_keys.def's order) that lies under section `name[0..len)`. */
static int section_first(const char *name, size_t len)
{
    for (int i = 0; i < NKEYS; i++)
        if (strncmp(g_keys[i].name, name, len) == 0 && g_keys[i].name[len] == '.')
            return i;
    return NKEYS;
}

/* config_print's order: every section's keys together (a section printed once), sections and keys in the order
 * config_keys.def first names them. Compares the sections' first appearances level by level. */
static int print_order(const void *pa, const void *pb)
{
    const int a = *(const int *)pa, b = *(const int *)pb;
    const char *na = g_keys[a].name, *nb = g_keys[b].name;
    const char *da = na, *db = nb;
    for (;;) {
        const char *ea = strchr(da, '.'), *eb = strchr(db, '.');
        const int fa = ea ? section_first(na, (size_t)(ea - na)) : a;
        const int fb = eb ? section_first(nb, (size_t)(eb - nb)) : b;
        if (fa != fb)
            return fa < fb ? -1 : 1;
        if (!ea || !eb)
            return (a > b) - (a < b);
        da = ea + 1;
        db = eb + 1;
    }
}

void config_print(const struct grpo_config *c, FILE *out)
{
    int order[NKEYS];
    for (int i = 0; i < NKEYS; i++)
        order[i] = i;
    qsort(order, NKEYS, sizeof *order, print_order);
    const char *prev = "";
    for (int o = 0; o < NKEYS; o++) {
        const int i = order[o];
        const char *name = g_keys[i].name;
        size_t shared = common_sections(prev, name);
        /* open every section below the shared prefix */
        int depth = 0;
        for (size_t j = 0; j < shared; j++)
            depth += name[j] == '.';
        const char *p = name + shared;
        const char *dot;
        while ((dot = strchr(p, '.'))) {
            fprintf(out, "%*s%.*s:\n", depth * 2, "", (int)(dot - p), p);
            depth++;
            p = dot + 1;
        }
        char val[512];
        config_value_text(c, &g_keys[i], val, sizeof val);
        fprintf(out, "%*s%s: %s", depth * 2, "", p, val);
        if (strcmp(c->origin[i], "default") != 0)
            fprintf(out, "  # %s", c->origin[i]);
        fputc('\n', out);
        prev = name;
    }
    if (c->n_noted > 0)
        fprintf(out, "# verl keys accepted with no effect here (docs/verl.md):\n");
    for (int i = 0; i < c->n_noted; i++)
        fprintf(out, "#   %s\n", c->noted[i]);
}

static const char *type_name(enum cfg_type t)
{
    switch (t) {
    case CFG_INT: return "int";
    case CFG_FLOAT: return "float";
    case CFG_BOOL: return "bool";
    case CFG_STR: return "string";
    case CFG_ENUM: return "enum";
    case CFG_FLIST: return "float list";
    }
    return "?";
}

void config_print_reference(FILE *out)
{
    fputs("# Configuration reference\n\n"
          "Generated by `grpo-worker --config-reference`; a unit test checks that this file matches the\n"
          "program. Every binary reads the same keys: from a YAML file of nested mappings given with\n"
          "`--config FILE`, then from `a.b.c=value` overrides on the command line (later wins).\n"
          "`--print-config` shows the effective configuration and where each value came from.\n"
          "Names follow verl's where the concept is the same. An unknown key, a wrong type or an\n"
          "out-of-range value is an error that names the key and the file and line.\n\n"
          "`null` or `~` in a YAML file keeps a key's default, as in verl's configs.\n",
          out);
    char section[128] = "";
    for (int i = 0; i < NKEYS; i++) {
        const struct cfg_key_info *k = &g_keys[i];
        const char *dot = strchr(k->name, '.');
        size_t sl = dot ? (size_t)(dot - k->name) : strlen(k->name);
        if (strlen(section) != sl || strncmp(section, k->name, sl) != 0) {
            snprintf(section, sizeof section, "%.*s", (int)sl, k->name);
            fprintf(out, "\n## `%s`\n\n| key | type | default | description |\n|---|---|---|---|\n", section);
        }
        char range[160] = "";
        if (k->type == CFG_ENUM)
            snprintf(range, sizeof range, " (one of `%s`)", k->choices);
        else if (k->type == CFG_INT || k->type == CFG_FLOAT || k->type == CFG_FLIST)
            snprintf(range, sizeof range, " [%g, %g]", k->min, k->max);
        char choices_escaped[200];
        size_t n = 0;
        for (const char *p = range; *p && n + 2 < sizeof choices_escaped; p++) {
            if (*p == '|')
                choices_escaped[n++] = '\\';
            choices_escaped[n++] = *p;
        }
        choices_escaped[n] = 0;
        fprintf(out, "| `%s` | %s%s | `%s` | %s |\n", k->name, type_name(k->type), choices_escaped,
                k->def[0] ? k->def : "\"\"", k->help);
    }
}

uint64_t config_digest(const struct grpo_config *c)
{
    uint64_t h = 1469598103934665603ULL;
    char val[512];
    for (int i = 0; i < NKEYS; i++) {
        if (!config_key_shapes_run(g_keys[i].name))
            continue;
        config_value_text(c, &g_keys[i], val, sizeof val);
        for (const char *p = g_keys[i].name; *p; p++)
            h = (h ^ (uint8_t)*p) * 1099511628211ULL;
        h = (h ^ '=') * 1099511628211ULL;
        for (const char *p = val; *p; p++)
            h = (h ^ (uint8_t)*p) * 1099511628211ULL;
        h = (h ^ '\n') * 1099511628211ULL;
    }
    return h;
}
