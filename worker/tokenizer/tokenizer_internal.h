/* Internals shared by the tokenizer's source files; not part of the API. */
#ifndef GRPO_WORKER_TOKENIZER_INTERNAL_H
#define GRPO_WORKER_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/tokenizer/tokenizer.h"

/* per-token flags */
enum {
    TOKF_USED = 1u << 0,     /* the id has a token */
    TOKF_IN_VOCAB = 1u << 1, /* in model.vocab (not only an added token) */
    TOKF_ADDED = 1u << 2,    /* in added_tokens */
    TOKF_SPECIAL = 1u << 3,  /* added and special */
};

/* Split behaviours of tokenizers' Split pre-tokenizer */
enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};

enum tok_step_kind {
    TOK_STEP_SPLIT,     /* Split{pattern, behavior, invert} */
    TOK_STEP_DIGITS,    /* Digits{individual_digits} */
    TOK_STEP_BYTELEVEL, /* ByteLevel{use_regex}: GPT-2's regex when use_regex, then byte mapping */
};

struct tok_step {
    enum tok_step_kind kind;
    char *pattern; /* SPLIT: the regex or literal string */
    bool literal;  /* SPLIT: pattern is {"String": ...} */
    enum tok_split_behavior behavior;
    bool invert;
    bool individual_digits; /* DIGITS */
    bool use_regex;         /* BYTELEVEL */
    bool trim_offsets;      /* BYTELEVEL: kept for saving only */
    pcre2_code *re;         /* compiled: SPLIT's pattern, DIGITS' \p{N}, BYTELEVEL's GPT-2 regex */
};

struct tok_added {
    int32_t id;
    char *content;
    size_t len;
    bool special, lstrip, rstrip, normalized, single_word;
};

/* open-addressing map from token text to id; keys live in the tokenizer's text[] */
struct tok_strmap {
    int32_t *slots; /* -1 empty */
    size_t cap;     /* power of two */
};

/* open-addressing map from a pair of ids to (rank, merged id) */
struct tok_merge_slot {
    uint64_t key; /* (left << 32) | right; UINT64_MAX empty */
    int32_t rank;
    int32_t merged;
};
struct tok_mergemap {
    struct tok_merge_slot *slots;
    size_t cap;
};

struct tokenizer {
    int32_t n_ids; /* size of the id space */
    char **text;   /* [n_ids] token as spelled (NUL-terminated), NULL if unused */
    uint32_t *text_len;
    char **bytes; /* [n_ids] decoded bytes (NUL-terminated for convenience) */
    uint32_t *bytes_len;
    uint8_t *flags;          /* TOKF_* */
    struct tok_strmap vocab; /* text -> id over model.vocab (not added-only tokens) */

    int32_t n_merges, merges_cap;
    int32_t (*merges)[3]; /* in rank order: left id, right id, merged id */
    struct tok_mergemap merge_map;
    int32_t byte_id[256]; /* id of the one-byte token of each byte, -1 if absent */

    int32_t unk_id;
    bool ignore_merges;
    bool fuse_unk;

    int n_steps;
    struct tok_step *steps;
    enum tokenizer_pre pre;

    int n_added;
    struct tok_added *added;
    /* added tokens by first byte, longest first: idx into added[] */
    int32_t *added_by_byte[256];
    int n_added_by_byte[256];

    int32_t bos_id, eos_id, pad_id;
    int32_t cfg_unk_id; /* unk_token for tokenizer_config.json (GGUF's unknown_token_id) */
    bool add_bos;
    char *chat_template;
    char *default_system;
    struct json_t *chat_kwargs; /* extra template variables (tokenizer_set_chat_kwargs), or NULL */
    struct chat_renderer *chat; /* the template's renderer (chat_template.c) */
};

/* ---- byte-level alphabet ---- */
/* UTF-8 spelling of byte b in GPT-2's byte-to-unicode table (1 or 2 bytes + NUL). */
const char *tok_byte_char(uint8_t b);
/* Code point -> byte, or -1 if cp is not in the alphabet. */
int tok_char_byte(uint32_t cp);
/* Decode one UTF-8 character at s[0..n); returns its length (>=1) and sets *cp; invalid
 * bytes give length 1 and cp = 0xFFFFFFFF. */
size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp);
/* Whether every character of s[0..n) is in the byte-level alphabet. */
bool tok_in_alphabet(const char *s, size_t n);
/* Byte-level spelling of raw bytes (malloc'd, NUL-terminated). */
char *tok_bytes_to_text(const char *s, size_t n, size_t *out_len);

/* ---- building (tokenizer_build.c / tokenizer.c) ---- */
struct tokenizer *tok_new(int32_t n_ids);
/* Set token id's text; in_vocab marks model.vocab membership. -1 if id already has a different text. */
int tok_set_token(struct tokenizer *t, int32_t id, const char *text, size_t len, bool in_vocab);
void tok_grow(struct tokenizer *t, int32_t n_ids);
/* (Re)build the text -> id map of the model vocabulary; call before tok_add_merge. */
void tok_index(struct tokenizer *t);
/* Id of a model-vocabulary token, or -1. */
int tok_vocab_get(const struct tokenizer *t, const char *s, size_t n);
/* Add a merge "left right" by text; -1 with err (no filename) when a piece is unknown. */
int tok_add_merge(struct tokenizer *t, const char *l, size_t ll, const char *r, size_t rl, char *err, size_t errlen);
int tok_add_added(struct tokenizer *t, const struct tok_added *a, char *err, size_t errlen);
/* Standard pre-tokenizer step lists */
void tok_set_pre(struct tokenizer *t, enum tokenizer_pre pre);
/* Append a step (pattern is copied); compiles its regex. -1 with err on a bad regex. */
int tok_add_step(struct tokenizer *t, const struct tok_step *s, char *err, size_t errlen);
/* After vocab, merges, added tokens and steps are set: byte ids, decode bytes, indices,
 * default system prompt, pre family detection. -1 with err. */
int tok_finish(struct tokenizer *t, char *err, size_t errlen);

extern const char TOK_RE_GPT2[];
extern const char TOK_RE_LLAMA3[];
extern const char TOK_RE_QWEN2[];

#endif
