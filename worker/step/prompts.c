#include "prompts.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/log.h"
#include "common/config.h"
#include "worker/data/dataset.h"
#include "worker/tokenizer/chat_template.h"
#include "worker/formats/gguf.h"
#include "worker/tokenizer/tokenizer.h"

static bool is_gguf(const char *path)
{
    size_t n = strlen(path);
    return n > 5 && strcmp(path + n - 5, ".gguf") == 0;
}

struct tokenizer *prompt_load_tokenizer(const char *model_path, const char *chat_kwargs, const char *custom_template,
                                        char *err, size_t errlen)
{
    struct tokenizer *t = NULL;
    if (is_gguf(model_path)) {
        struct gguf_file *g = gguf_open(model_path, err, errlen);
        if (!g)
            return NULL;
        t = tokenizer_from_gguf(g, err, errlen);
        gguf_close(g);
    } else { /* with tokenizer_config.json and chat_template.jinja beside it: the chat template */
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", model_path);
        t = tokenizer_from_json(path, err, errlen);
    }
    if (t && chat_kwargs && chat_kwargs[0] && strcmp(chat_kwargs, "{}") != 0) {
        char why[512];
        if (tokenizer_set_chat_kwargs(t, chat_kwargs, why, sizeof why) != 0) {
            error_set(err, errlen, KEY_data_apply_chat_template_kwargs ": %s", why);
            tokenizer_free(t);
            return NULL;
        }
    }
    if (t && custom_template && custom_template[0]) {
        /* tried at once on a one-message conversation: a template that cannot render fails here, by name, not at
         * the first prompt of a step */
        tokenizer_set_chat_template(t, custom_template);
        const struct chat_message probe = {"user", "hello"};
        char why[1024];
        char *text = tokenizer_apply_chat_template(t, &probe, 1, true, why, sizeof why);
        if (!text) {
            error_set(err, errlen, KEY_arr_model_custom_chat_template ": %s", why);
            tokenizer_free(t);
            return NULL;
        }
        free(text);
    }
    return t;
}

/* Cut ids (n > max) to max tokens as data.truncation says: keep the end (left), the start (right) or both ends
 * (middle: the first max / 2 and the last max - max / 2). */
static void truncate_ids(int32_t *ids, int *n, int max, const char *how)
{
    if (strcmp(how, "left") == 0) {
        memmove(ids, ids + (*n - max), (size_t)max * sizeof *ids);
    } else if (strcmp(how, "middle") == 0) {
        const int head = max / 2, tail = max - head;
        memmove(ids + head, ids + (*n - tail), (size_t)tail * sizeof *ids);
    }
    *n = max; /* right: the start is already in place */
}

/* The sample's messages as a JSON array text. */
static char *messages_json(const struct prompt_sample *ps)
{
    json_t *a = json_array();
    for (int k = 0; k < ps->n_messages; k++)
        json_array_append_new(a, json_pack("{s:s, s:s}", "role", ps->messages[k].role, "content",
                                           ps->messages[k].content ? ps->messages[k].content : ""));
    char *text = CHECK_ALLOC(json_dumps(a, JSON_COMPACT | JSON_ENSURE_ASCII));
    json_decref(a);
    return text;
}

static int encode_set(const struct grpo_config *cfg, const struct tokenizer *tok, const char *tools_json,
                      struct dataset *d, const char *name, struct prompt_set *s, char *err, size_t errlen)
{
    s->name = name;
    s->n = 0;
    s->items = xcalloc((size_t)(d->n ? d->n : 1), sizeof *s->items);
    int dropped = 0, cut = 0;
    const int max = (int)cfg->data_max_prompt_length;
    for (int i = 0; i < d->n; i++) {
        const struct prompt_sample *ps = &d->samples[i];
        struct prompt_item *it = &s->items[s->n];
        it->data_source = ps->data_source;
        it->ground_truth = ps->ground_truth;
        it->extra_info = ps->extra_info_json;
        it->agent_name = ps->agent_name;
        it->messages_json = messages_json(ps);
        it->tool_agent =
            tools_json && (ps->agent_name ? strcmp(ps->agent_name, "tool_agent") == 0
                                          : cfg->rollout_multi_turn_enable ||
                                                strcmp(cfg->rollout_agent_default_agent_loop, "tool_agent") == 0);
        char why[1024];
        if (it->tool_agent) { /* the tools' schemas go in the prompt, as the template places them */
            it->text = tokenizer_render_chat(tok, it->messages_json, tools_json, true, NULL, why, sizeof why);
        } else {
            struct chat_message *msgs = xcalloc((size_t)(ps->n_messages ? ps->n_messages : 1), sizeof *msgs);
            for (int k = 0; k < ps->n_messages; k++)
                msgs[k] = (struct chat_message){ps->messages[k].role, ps->messages[k].content};
            it->text = tokenizer_apply_chat_template(tok, msgs, ps->n_messages, true, why, sizeof why);
            free(msgs);
        }
        if (!it->text) {
            if (ps->line)
                snprintf(err, errlen, "%s:%d: %s", name, ps->line, why);
            else
                snprintf(err, errlen, "%s: prompt %d: %s", name, i, why);
            return -1;
        }
        size_t n;
        it->ids = tokenizer_encode(tok, it->text, strlen(it->text), 0, &n);
        it->len = (int)n;
        if (it->len > max && cfg->data_filter_overlong_prompts) { /* verl's filter_overlong_prompts */
            free(it->text), free(it->ids), free(it->messages_json);
            memset(it, 0, sizeof *it);
            dropped++;
            continue;
        }
        if (it->len > max && strcmp(cfg->data_truncation, "error") != 0) {
            truncate_ids(it->ids, &it->len, max, cfg->data_truncation);
            cut++;
        }
        if (it->len > max || it->len == 0) {
            if (ps->line)
                snprintf(err, errlen,
                         "%s:%d: prompt has %d tokens; " KEY_data_max_prompt_length " is %lld (" KEY_data_truncation
                         "=left|right|middle "
                         "cuts such prompts, " KEY_data_filter_overlong_prompts "=true drops them)",
                         name, ps->line, it->len, cfg->data_max_prompt_length);
            else
                snprintf(err, errlen, "%s: prompt %d has %d tokens; " KEY_data_max_prompt_length " is %lld", name, i,
                         it->len, cfg->data_max_prompt_length);
            s->n++; /* its buffers are freed with the set */
            return -1;
        }
        s->n++;
        /* the synthetic arithmetic task's reference answer, in the form its prompt asks for */
        if (strcmp(ps->data_source, "arithmetic") == 0 && ps->ground_truth) {
            char ans[128];
            snprintf(ans, sizeof ans, "#### %s", ps->ground_truth);
            int32_t *a = tokenizer_encode(tok, ans, strlen(ans), 0, &n);
            int eos = tokenizer_token_id(tok, "<|im_end|>");
            if (eos < 0)
                eos = tokenizer_eos_id(tok);
            it->answer_ids = xrealloc(a, (n + 1) * sizeof(int32_t));
            it->answer_len = (int)n;
            if (eos >= 0)
                it->answer_ids[it->answer_len++] = eos;
        }
    }
    if (dropped)
        log_info("data",
                 "%s: %d of %d prompts are longer than " KEY_data_max_prompt_length " (%d tokens): dropped "
                 "(" KEY_data_filter_overlong_prompts ")",
                 name, dropped, d->n, max);
    if (cut)
        log_info("data", "%s: %d prompts cut to " KEY_data_max_prompt_length " (%d tokens), " KEY_data_truncation "=%s",
                 name, cut, max, cfg->data_truncation);
    if (s->n == 0 && d->n > 0) {
        snprintf(err, errlen, "%s: every prompt is longer than " KEY_data_max_prompt_length " (%d tokens)", name, max);
        return -1;
    }
    return 0;
}

int prompt_sets_load(const struct grpo_config *cfg, const struct tokenizer *tok, const char *tools_json,
                     struct prompt_set *train, struct prompt_set *val, char *err, size_t errlen)
{
    memset(train, 0, sizeof *train);
    memset(val, 0, sizeof *val);
    struct dataset *dt = xcalloc(1, sizeof *dt), *dv = xcalloc(1, sizeof *dv);
    if (dataset_from_config(cfg, dt, dv, err, errlen) != 0) {
        dataset_free(dt), dataset_free(dv);
        free(dt), free(dv);
        return -1;
    }
    /* the sets own their datasets from here on, also when encoding fails (prompt_set_free releases them) */
    train->dataset = dt;
    val->dataset = dv;
    const char *tn = cfg->data_train_files[0] ? cfg->data_train_files : cfg->data_synthetic_task;
    const char *vn = cfg->data_val_files[0] ? cfg->data_val_files : cfg->data_synthetic_task;
    if (encode_set(cfg, tok, tools_json, dt, tn, train, err, errlen) != 0 ||
        encode_set(cfg, tok, tools_json, dv, vn, val, err, errlen) != 0)
        return -1;
    return 0;
}

void prompt_set_free(struct prompt_set *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->items[i].text);
        free(s->items[i].ids);
        free(s->items[i].answer_ids);
        free(s->items[i].messages_json);
    }
    free(s->items);
    if (s->dataset) {
        dataset_free(s->dataset);
        free(s->dataset);
    }
    memset(s, 0, sizeof *s);
}
