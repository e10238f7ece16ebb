/* Prompts as the trainer uses them: the dataset's samples rendered with the
 * tokenizer's chat template and encoded once, plus the reference answer of
 * synthetic tasks for the supervised warm-start. */
#ifndef GRPO_WORKER_STEP_PROMPTS_H
#define GRPO_WORKER_STEP_PROMPTS_H

#include <stddef.h>
#include <stdint.h>

struct grpo_config;
struct tokenizer;

struct prompt_item {
    const char *data_source, *ground_truth, *extra_info; /* owned by the set's dataset */
    char *text;                                          /* rendered prompt */
    int32_t *ids;
    int len;
    int32_t *answer_ids; /* reference response (synthetic arithmetic), or NULL */
    int answer_len;
};

struct prompt_set {
    const char *name; /* file or task name, for messages */
    int n;
    struct prompt_item *items;
    void *dataset; /* struct dataset * */
};

/* The tokenizer of a model path: DIR/tokenizer.json (+ tokenizer_config.json's or chat_template.jinja's chat
 * template) or a .gguf's metadata, with chat_kwargs (a JSON object: data.apply_chat_template_kwargs; NULL or
 * "{}": none) as its template's extra variables. NULL with err. */
struct tokenizer *prompt_load_tokenizer(const char *model_path, const char *chat_kwargs, char *err, size_t errlen);
/* Load the training and validation prompts the configuration names and encode them. A prompt longer than
 * data.max_prompt_length is an error naming it. 0, or -1 with err. */
int prompt_sets_load(const struct grpo_config *cfg, const struct tokenizer *tok, struct prompt_set *train,
                     struct prompt_set *val, char *err, size_t errlen);
void prompt_set_free(struct prompt_set *s);

#endif
