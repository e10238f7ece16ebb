/* A reward model as a reward source (verl's reward_model.enable, reward_model.model.path): a Hugging Face
 * LlamaForSequenceClassification / Qwen2ForSequenceClassification / Qwen3ForSequenceClassification checkpoint
 * with one label. Its score is the score head applied to the final hidden state of the sequence's last token
 * (the last non-padding token, as transformers pools; sequences are never padded here). */
#ifndef GRPO_WORKER_REWARD_MODEL_H
#define GRPO_WORKER_REWARD_MODEL_H

#include <stddef.h>
#include <stdint.h>

struct reward_model;
struct tokenizer;

/* Load the checkpoint directory (config.json with a *ForSequenceClassification architecture and one label,
 * safetensors with score.weight, and its tokenizer when it has one). NULL with err naming the file and what is
 * wrong. */
struct reward_model *reward_model_load(const char *dir, char *err, size_t errlen);
void reward_model_free(struct reward_model *rm);
/* The score of one token sequence (n >= 1). */
double reward_model_score_ids(struct reward_model *rm, const int32_t *ids, int n);
/* The score of a prompt (as rendered for the policy, ending with the assistant's turn) and a response: the text
 * is re-encoded with the reward model's tokenizer and the assistant's turn closed as its chat template does,
 * then cut to max_tokens from the end when longer (max_tokens <= 0: no limit). */
double reward_model_score_text(struct reward_model *rm, const char *prompt_text, const char *response, int max_tokens);
/* Its tokenizer, NULL when the directory has none (reward_model_score_text needs one). */
const struct tokenizer *reward_model_tokenizer(const struct reward_model *rm);

#endif
