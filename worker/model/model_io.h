/* Loading and saving models: Hugging Face layout (config.json + safetensors,
 * single or sharded) and GGUF import. Errors name the file and the field or
 * tensor; nothing here crashes on a bad file. */
#ifndef GRPO_WORKER_MODEL_IO_H
#define GRPO_WORKER_MODEL_IO_H

#include <stddef.h>

#include "model.h"

/* Parse a transformers config.json (LlamaForCausalLM / Qwen2ForCausalLM); refuses what we do not implement. */
int model_config_from_hf_json(const char *path, struct model_config *c, char *err, size_t errlen);
/* Write config.json for c (loadable by transformers). */
int model_config_write_hf_json(const struct model_config *c, const char *path, char *err, size_t errlen);
/* Load a Hugging Face model directory. NULL with err on failure. */
struct model *model_load_hf(const char *dir, char *err, size_t errlen);
/* The decoder of a Hugging Face *ForSequenceClassification directory (a reward model): every tensor but the
 * LM head, which such a checkpoint has not (its score head is read by the caller). NULL with err. */
struct model *model_load_hf_backbone(const char *dir, char *err, size_t errlen);
/* Import a GGUF file (llama or qwen2 architecture), dequantising every tensor to fp32 and undoing
 * llama.cpp's q/k row permutation. NULL with err on failure. */
struct model *model_load_gguf(const char *path, char *err, size_t errlen);
/* A directory (HF layout) or a .gguf file. */
struct model *model_load(const char *path, char *err, size_t errlen);
/* Write config.json, generation_config.json and model.safetensors (F32 or, with bf16, BF16) into dir
 * (created if needed); each file atomically. 0 or -1 with err. */
int model_save_hf(const struct model *m, const char *dir, int bf16, char *err, size_t errlen);

#endif
