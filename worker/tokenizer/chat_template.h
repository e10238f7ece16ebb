/* A model's own chat template, rendered exactly as Hugging Face transformers' apply_chat_template renders it.
 *
 * This file owns prompt rendering: the Jinja template found in tokenizer_config.json, chat_template.jinja or a
 * GGUF's tokenizer.chat_template is run by CPython's jinja2 in a long-lived helper process, in the environment
 * transformers builds (an immutable sandbox with trim_blocks, lstrip_blocks and loop controls; its tojson filter;
 * raise_exception and strftime_now; the {% generation %} tag, which renders its body unchanged), with the
 * variables transformers passes: messages, tools, documents, add_generation_prompt, the tokenizer's named special
 * tokens (bos_token, eos_token, unk_token, pad_token) and the caller's extra keyword arguments (enable_thinking,
 * date_string, ...), which win over the special tokens.
 *
 *   char err[1024];
 *   char *text = tokenizer_render_chat(t, "[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, true,
 *                                      "{\"enable_thinking\":false}", err, sizeof err);
 *
 * The helper (python3 -c DRIVER, found on PATH) starts on the first render and serves every later one; it ends
 * with the tokenizer (tokenizer_free), or with the process. Requests and results are JSON lines on a private socket
 * (the child's fds 3 and 4); the child's stdout goes to our stderr. Renders are serialised by a lock, so a
 * tokenizer stays shareable between threads.
 *
 * A tokenizer without a chat template renders ChatML from each message's role and content (tools and keyword
 * arguments are ignored): <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, <|im_start|>assistant\n last when
 * add_generation_prompt.
 *
 * Errors are texts: a template that does not parse or that calls raise_exception names the template's line
 * ("chat template line 12: ..."); python3 or jinja2 missing says what to install. */
#ifndef GRPO_WORKER_CHAT_TEMPLATE_H
#define GRPO_WORKER_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "worker/tokenizer/tokenizer.h"

/* Render messages_json (a JSON array of message objects: role, content, and whatever else the template reads,
 * such as tool_calls, reasoning_content, tool_call_id) with tools_json (a JSON array of tool schemas, or NULL),
 * add_generation_prompt, and kwargs_json (a JSON object of extra template variables, or NULL; a "documents" entry
 * is passed as transformers' documents). The tokenizer's own keyword arguments (tokenizer_set_chat_kwargs) come
 * first and kwargs_json's override them. A malloc'd text, or NULL with err. */
char *tokenizer_render_chat(const struct tokenizer *t, const char *messages_json, const char *tools_json,
                            bool add_generation_prompt, const char *kwargs_json, char *err, size_t errlen);

/* The renderer's helper process, one per tokenizer (tokenizer.c creates and frees it). */
struct chat_renderer;
struct chat_renderer *chat_renderer_new(void);
/* Ends the helper process and its process group, if one runs. */
void chat_renderer_free(struct chat_renderer *r);

#endif
