/* Prompts as the trainer uses them: the dataset's samples rendered with the
 * tokenizer's chat template and encoded once, plus the reference answer of
 * synthetic tasks for the supervised warm-start. */
#ifndef GRPO_WORKER_STEP_PROMPTS_H
#define GRPO_WORKER_STEP_PROMPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct grpo_config;
struct tokenizer;

struct prompt_item {
    const char *data_source, *ground_truth, *extra_info; /* owned by the set's dataset */
    char *text;                                          /* rendered prompt */
    int32_t *ids;
    int len;
    const char *agent_name; /* the sample's agent loop (owned by the dataset), or NULL: the default */
    char *messages_json;    /* the prompt's chat messages as a JSON array (multi-turn rollouts start from them) */
    bool tool_agent;        /* rendered with the tools: its rollouts are multi-turn */
    int32_t *answer_ids;    /* reference response (synthetic arithmetic), or NULL */
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
struct tokenizer *prompt_load_tokenizer(const char *model_path, const char *chat_kwargs, const char *custom_template,
                                        char *err, size_t errlen);
/* Load the training and validation prompts the configuration names and encode them. A prompt longer than
 * data.max_prompt_length is an error naming it. With tools_json (multi-turn rollouts: a JSON array of tool
 * schemas), the prompts of tool agents (agent_name tool_agent, or no agent_name when multi_turn.enable or
 * agent.default_agent_loop=tool_agent) are rendered with the tools. 0, or -1 with err. */
int prompt_sets_load(const struct grpo_config *cfg, const struct tokenizer *tok, const char *tools_json,
                     struct prompt_set *train, struct prompt_set *val, char *err, size_t errlen);
void prompt_set_free(struct prompt_set *s);

#endif
