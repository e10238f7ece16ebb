#include "interaction.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "common/check.h"
#include "worker/agent/tool.h"

#define RETRY "grpo.interactions.Retry"
#define RETRY_MESSAGE "Your answer is not right yet. Check your work and give your final answer again."
#define INTERACTION_PROCS 2 /* helper processes of a Python interaction: answers computed at once */

struct icfg {
    const char *path;
    yaml_document_t *doc;
    char *err;
    size_t errlen;
};

static int ifail(struct icfg *y, const yaml_node_t *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int ifail(struct icfg *y, const yaml_node_t *at, const char *fmt, ...)
{
    char m[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return error_set(y->err, y->errlen, "%s:%zu: %s", y->path, at ? at->start_mark.line + 1 : 1, m);
}

static const char *text_of(const yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* Each key of mapping n against the allowed ones; the value of each allowed key into vals (NULL if absent). */
static int keys_of(struct icfg *y, const yaml_node_t *n, const char *what, const char *const *allowed,
                   const yaml_node_t **vals)
{
    for (int i = 0; allowed[i]; i++)
        vals[i] = NULL;
    if (!n || n->type != YAML_MAPPING_NODE)
        return ifail(y, n, "%s must be a mapping", what);
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const yaml_node_t *kn = yaml_document_get_node(y->doc, p->key);
        const char *k = text_of(kn);
        int i = 0;
        while (allowed[i] && (!k || strcmp(k, allowed[i]) != 0))
            i++;
        if (!allowed[i])
            return ifail(y, kn, "unknown key '%s' in %s", k ? k : "?", what);
        vals[i] = yaml_document_get_node(y->doc, p->value);
    }
    return 0;
}

static int load_one(struct icfg *y, struct interaction_set *s, const yaml_node_t *item)
{
    static const char *const keys[] = {"name", "class_name", "config", NULL};
    const yaml_node_t *v[3] = {NULL, NULL, NULL};
    if (keys_of(y, item, "an interaction (name, class_name, config)", keys, v) != 0)
        return -1;
    const char *cls = text_of(v[1]), *name = text_of(v[0]);
    if (!cls || !*cls)
        return ifail(y, v[1] ? v[1] : item, "class_name: missing or not a string");
    if (!name || !*name)
        return ifail(y, v[0] ? v[0] : item, "name: missing or not a string");
    if (interaction_find(s, name))
        return ifail(y, v[0], "a second interaction named '%s'", name);
    const bool empty = !v[2] || (v[2]->type == YAML_SCALAR_NODE && !*text_of(v[2])); /* config: (empty) is none */
    struct interaction it = {0};
    if (strcmp(cls, RETRY) != 0) { /* a Python class written for verl */
        json_t *config = empty ? json_object() : agent_yaml_json(y->doc, v[2]);
        if (!config || !json_is_object(config)) {
            json_decref(config);
            return ifail(y, v[2], "config: expected a mapping (the class's config)");
        }
        struct pytool_options o;
        pytool_options_default(&o);
        o.num_procs = INTERACTION_PROCS;
        agent_dir_of(y->path, o.dir, sizeof o.dir);
        char e[2048];
        it.py = pyinteraction_new(name, cls, config, &o, e, sizeof e);
        json_decref(config);
        if (!it.py)
            return ifail(y, v[1], "interaction '%s': %s", name, e);
    } else {
        const char *message = RETRY_MESSAGE;
        if (!empty) {
            static const char *const ckeys[] = {"message", NULL};
            const yaml_node_t *cv[1] = {NULL};
            if (keys_of(y, v[2], "config (message)", ckeys, cv) != 0)
                return -1;
            if (cv[0] && !text_of(cv[0]))
                return ifail(y, cv[0], "config.message: expected a text");
            if (cv[0])
                message = text_of(cv[0]);
        }
        it.message = xstrdup(message);
    }
    it.name = xstrdup(name);
    s->items = xrealloc(s->items, (size_t)(s->n + 1) * sizeof *s->items);
    s->items[s->n++] = it;
    return 0;
}

int interaction_set_load_yaml(struct interaction_set *s, const char *path, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    yaml_document_t doc;
    if (agent_yaml_load(path, &doc, err, errlen) != 0)
        return -1;
    struct icfg y = {path, &doc, err, errlen};
    static const char *const keys[] = {"interaction", NULL};
    const yaml_node_t *list[1] = {NULL};
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    int rc = keys_of(&y, root, "an interaction config (interaction)", keys, list);
    if (rc == 0 && (!list[0] || list[0]->type != YAML_SEQUENCE_NODE))
        rc = ifail(&y, list[0] ? list[0] : root, "interaction: missing or not a list");
    const yaml_node_t *l = rc ? NULL : list[0];
    for (yaml_node_item_t *it = l ? l->data.sequence.items.start : NULL; l && it < l->data.sequence.items.top && !rc;
         it++)
        rc = load_one(&y, s, yaml_document_get_node(&doc, *it));
    if (rc == 0 && s->n == 0)
        rc = ifail(&y, list[0], "interaction: the list is empty");
    yaml_document_delete(&doc);
    if (rc)
        interaction_set_free(s);
    return rc;
}

const struct interaction *interaction_find(const struct interaction_set *s, const char *name)
{
    if (!name)
        return s->n > 0 ? &s->items[0] : NULL;
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->items[i].name, name) == 0)
            return &s->items[i];
    return NULL;
}

int interaction_respond(const struct interaction *it, const char *instance, const json_t *kwargs,
                        const json_t *messages, struct interaction_reply *out, char *err, size_t errlen)
{
    *out = (struct interaction_reply){0};
    if (!it->py) {
        out->text = xstrdup(it->message);
        return 0;
    }
    int terminate = 0;
    out->text =
        pyinteraction_respond(it->py, instance, kwargs, messages, &terminate, &out->score, &out->scored, err, errlen);
    if (!out->text)
        return -1;
    out->terminate = terminate != 0; /* verl appends this last answer too, then ends the trajectory */
    return 0;
}

void interaction_finish(const struct interaction *it, const char *instance)
{
    if (it && it->py)
        pyinteraction_finalize(it->py, instance);
}

void interaction_set_free(struct interaction_set *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->items[i].name);
        free(s->items[i].message);
        pyinteraction_free(s->items[i].py);
    }
    free(s->items);
    memset(s, 0, sizeof *s);
}
