/* Shared by the trainer's system tests: a tiny randomly initialised Llama with
 * a byte-level tokenizer, and a configuration built from overrides. */
#ifndef GRPO_TESTS_TINY_RUN_H
#define GRPO_TESTS_TINY_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "worker/model/model_io.h"
#include "worker/tokenizer/tokenizer.h"

#define TINY_FIXTURE "tests/fixtures/tokenizers/bytes-chatml"

/* Write a tiny randomly initialised Llama (2 layers, GQA 4/2; hidden 64 and intermediate 128 unless
 * hidden > 0) with the byte-level ChatML tokenizer of tests/fixtures/tokenizers/bytes-chatml (259 tokens)
 * into dir. 0 or -1. */
static inline int tiny_model_write_sized(const char *dir, unsigned long long seed, double std, int hidden)
{
    char err[1024], path[2048];
    struct model_config c;
    if (model_config_from_hf_json(TINY_FIXTURE "/config.json", &c, err, sizeof err) != 0) {
        fprintf(stderr, "tiny model: %s\n", err);
        return -1;
    }
    if (hidden > 0) {
        c.hidden_size = hidden;
        c.intermediate_size = 2 * hidden;
        c.head_dim = hidden / c.n_heads;
    }
    struct model *m = model_create(&c);
    model_init_random(m, seed, std);
    int rc = model_save_hf(m, dir, 0, err, sizeof err);
    model_free(m);
    struct tokenizer *t = rc == 0 ? tokenizer_from_json(TINY_FIXTURE "/tokenizer.json", err, sizeof err) : NULL;
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

static inline int tiny_model_write(const char *dir, unsigned long long seed, double std)
{
    return tiny_model_write_sized(dir, seed, std, 0);
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
