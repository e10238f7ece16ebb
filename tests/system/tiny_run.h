/* Shared by the trainer's system tests: a tiny randomly initialised Llama with
 * the bundled model's tokenizer, and a configuration built from overrides. */
#ifndef GRPO_TESTS_TINY_RUN_H
#define GRPO_TESTS_TINY_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "worker/formats/gguf.h"
#include "worker/model/model_io.h"
#include "worker/tokenizer/tokenizer.h"

/* The bundled GGUF (for its tokenizer), or NULL: callers exit 77 (skipped). */
static inline const char *tiny_bundled_gguf(void)
{
    static char path[1024];
    const char *env = getenv("GRPO_MODEL_GGUF");
    if (env && *env)
        snprintf(path, sizeof path, "%s", env);
    else
        snprintf(path, sizeof path, "%s/.cache/grpo/SmolLM2-135M-Instruct.Q4_1.gguf", getenv("HOME"));
    return access(path, R_OK) == 0 ? path : NULL;
}

/* Write a tiny model (hidden 64, 2 layers, GQA 4/2, SmolLM2's 49152-token vocabulary) into dir. 0 or -1. */
static inline int tiny_model_write(const char *dir, const char *gguf, unsigned long long seed, double std)
{
    struct model_config c = {.arch = ARCH_LLAMA, .vocab_size = 49152, .hidden_size = 64, .intermediate_size = 128,
                             .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16, .rope_theta = 10000.0f,
                             .rms_norm_eps = 1e-5f, .tie_word_embeddings = true, .max_position_embeddings = 512,
                             .bos_token_id = 1, .eos_token_id = 2};
    char err[1024], path[2048];
    struct model *m = model_create(&c);
    model_init_random(m, seed, std);
    int rc = model_save_hf(m, dir, 0, err, sizeof err);
    model_free(m);
    struct gguf_file *g = rc == 0 ? gguf_open(gguf, err, sizeof err) : NULL;
    struct tokenizer *t = g ? tokenizer_from_gguf(g, err, sizeof err) : NULL;
    if (g)
        gguf_close(g);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!t || tokenizer_save_json(t, path, err, sizeof err) != 0)
        rc = -1;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (t && tokenizer_save_config_json(t, path, err, sizeof err) != 0)
        rc = -1;
    if (t)
        tokenizer_free(t);
    if (rc != 0)
        fprintf(stderr, "tiny model: %s\n", err);
    return rc;
}

/* config_init + each "key=value" override; exits 1 on a bad override. */
static inline void tiny_config(struct grpo_config *c, const char *const *overrides, int n)
{
    struct cfg_error err;
    config_init(c);
    for (int i = 0; i < n; i++)
        if (config_apply_override(c, overrides[i], &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
    if (config_validate(c, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

#endif
