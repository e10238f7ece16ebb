/* Byte-level BPE tokenizer (GPT-2 family: SmolLM2, Llama-3, Qwen2), loaded
 * from a Hugging Face tokenizer.json or from a GGUF file's tokenizer.ggml.*
 * metadata, and written back as a tokenizer.json that the Hugging Face
 * `tokenizers` library loads and that encodes identically.
 *
 *   char err[512];
 *   struct tokenizer *t = tokenizer_from_gguf(g, err, sizeof err);
 *   size_t n;
 *   int32_t *ids = tokenizer_encode(t, text, strlen(text), 0, &n);
 *   char *back = tokenizer_decode(t, ids, n, false);
 *
 * Encoding matches `tokenizers`' Tokenizer.encode(text, add_special_tokens=False):
 * added tokens (specials such as <|im_start|>) are matched first, leftmost-
 * longest, and never split; the rest goes through the pre-tokenizer (regex
 * splits, digit splits, byte-level mapping) and BPE merges by rank.
 * Normalizers are not applied (a Qwen2 tokenizer.json's NFC normalizer is
 * accepted with a warning: encodings agree on NFC text).
 *
 * A loaded tokenizer is read-only, so one may be shared between threads. */
#ifndef GRPO_WORKER_TOKENIZER_H
#define GRPO_WORKER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct tokenizer;

/* The pre-tokenizer families we know by name (tokenizer.ggml.pre). */
enum tokenizer_pre {
    TOKENIZER_PRE_CUSTOM = 0, /* from a tokenizer.json whose steps match no family below */
    TOKENIZER_PRE_GPT2,       /* ByteLevel(use_regex) with GPT-2's regex ("gpt-2", "default") */
    TOKENIZER_PRE_SMOLLM,     /* Digits(individual) then ByteLevel(use_regex) ("smollm", "starcoder") */
    TOKENIZER_PRE_LLAMA3,     /* Split(Llama-3 regex) then ByteLevel ("llama-bpe", "llama3") */
    TOKENIZER_PRE_QWEN2,      /* Split(Qwen2 regex) then ByteLevel ("qwen2") */
};

struct chat_message {
    const char *role; /* "system", "user", "assistant", ... */
    const char *content;
};

/* ---- loading, saving ---- */
/* Read a Hugging Face tokenizer.json (model.type BPE). NULL with err ("PATH: what") on failure. */
struct tokenizer *tokenizer_from_json(const char *path, char *err, size_t errlen);
/* Same, from the JSON text in memory; name is used in error messages. */
struct tokenizer *tokenizer_from_json_string(const char *json, size_t len, const char *name, char *err, size_t errlen);
/* Read tokenizer.ggml.* (model "gpt2") and tokenizer.chat_template from a GGUF file. */
struct tokenizer *tokenizer_from_gguf(const struct gguf_file *g, char *err, size_t errlen);
void tokenizer_free(struct tokenizer *t);

/* Write a tokenizer.json that `tokenizers` loads and that encodes identically. 0, or -1 with err. */
int tokenizer_save_json(const struct tokenizer *t, const char *path, char *err, size_t errlen);
/* Write a tokenizer_config.json (special tokens, chat template, tokenizer_class) for transformers. */
int tokenizer_save_config_json(const struct tokenizer *t, const char *path, char *err, size_t errlen);

/* ---- vocabulary ---- */
/* Number of ids (one past the largest id of the vocabulary and the added tokens). */
int tokenizer_vocab_size(const struct tokenizer *t);
/* Special ids, or -1 when the tokenizer has none. */
int tokenizer_bos_id(const struct tokenizer *t);
int tokenizer_eos_id(const struct tokenizer *t);
int tokenizer_pad_id(const struct tokenizer *t);
/* Whether the model expects a BOS before the text (tokenizer.ggml.add_bos_token, or a
 * tokenizer.json post-processor that prepends one). Encoding never adds it by itself. */
bool tokenizer_adds_bos(const struct tokenizer *t);
enum tokenizer_pre tokenizer_pre_type(const struct tokenizer *t);
/* A token as the vocabulary spells it (byte-level form: " the" is "Ġthe"); NULL if id is unused. */
const char *tokenizer_token_text(const struct tokenizer *t, int id);
/* The raw bytes a token decodes to (not NUL-terminated; length in *len); NULL if id is unused.
 * A token that ends mid-UTF-8 character gives its partial bytes: join before printing. */
const char *tokenizer_token_bytes(const struct tokenizer *t, int id, size_t *len);
/* Id of a vocabulary or added token spelled exactly so, or -1. */
int tokenizer_token_id(const struct tokenizer *t, const char *text);
/* True for added tokens marked special (skipped by decode with skip_special). */
bool tokenizer_is_special(const struct tokenizer *t, int id);
/* The chat template text (Jinja) from the GGUF / tokenizer_config.json, or NULL. */
const char *tokenizer_chat_template(const struct tokenizer *t);
/* Replace the chat template (e.g. from a tokenizer_config.json next to a tokenizer.json). */
void tokenizer_set_chat_template(struct tokenizer *t, const char *jinja);

/* ---- encode, decode ---- */
enum {
    TOKENIZER_ENCODE_NO_ADDED = 1u << 0, /* treat added/special token text as plain text */
};
/* Encode len bytes of UTF-8 text. Returns a malloc'd array of *n ids (never NULL: an empty
 * text gives a 1-element allocation and *n = 0). Invalid UTF-8 is encoded byte by byte. */
int32_t *tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, unsigned flags, size_t *n);
/* Decode ids to a malloc'd NUL-terminated string (raw bytes joined; ids out of range are
 * skipped). With skip_special, added tokens marked special are left out. */
char *tokenizer_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special);
/* tokenizer_decode as valid UTF-8: each byte that does not start a valid sequence becomes U+FFFD (the text a
 * chat message or a JSON string can hold; transformers' decode replaces them too). */
char *tokenizer_decode_utf8(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip_special);

/* ---- chat ---- */
/* The chat template applied to msgs (role and content each), rendered as transformers' apply_chat_template does
 * (chat_template.c; tokenizer_render_chat there takes messages, tools and keyword arguments as JSON), with the
 * keyword arguments set by tokenizer_set_chat_kwargs. A tokenizer without a chat template gives ChatML:
 *   <|im_start|>ROLE\nCONTENT<|im_end|>\n  for each message, then
 *   <|im_start|>assistant\n                 when add_generation_prompt.
 * Returns a malloc'd string (encode it with tokenizer_encode to get the ids), or NULL with err: a template that
 * does not parse or that raises (err names its line), python3 or jinja2 missing, no messages. */
char *tokenizer_apply_chat_template(const struct tokenizer *t, const struct chat_message *msgs, int n,
                                    bool add_generation_prompt, char *err, size_t errlen);
/* Extra variables for every render of the template (verl's data.apply_chat_template_kwargs, such as
 * {"enable_thinking": false}): a JSON object, or NULL for none. 0, or -1 with err when it is not a JSON object. */
int tokenizer_set_chat_kwargs(struct tokenizer *t, const char *kwargs_json, char *err, size_t errlen);
/* The default system prompt found in the chat template, or NULL. */
const char *tokenizer_default_system_prompt(const struct tokenizer *t);

#endif
