/* Shared by the trainer's system tests: a tiny randomly initialised Llama with
 * a byte-level tokenizer, and a configuration built from overrides. */
#ifndef GRPO_TESTS_TINY_RUN_H
#define GRPO_TESTS_TINY_RUN_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../test_util.h"
#include "common/config.h"
#include "worker/model/model_io.h"
#include "worker/tokenizer/tokenizer.h"

/* Write a tiny randomly initialised Llama (2 layers, GQA 4/2; hidden 64 and intermediate 128 unless
 * hidden > 0) with the byte-level ChatML tokenizer of tests/fixtures/tokenizers/bytes-chatml (259 tokens)
 * into dir. 0 or -1. */
static inline int tiny_model_write_sized(const char *dir, unsigned long long seed, double std, int hidden)
{
    char err[1024], path[2048];
    struct model_config c;
    if (model_config_from_hf_json(TEST_TOKENIZER_FIXTURE "/config.json", &c, err, sizeof err) != 0) {
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
    struct tokenizer *t =
        rc == 0 ? tokenizer_from_json(TEST_TOKENIZER_FIXTURE "/tokenizer.json", err, sizeof err) : NULL;
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

/* The 100 single-digit sums a + b as JSONL prompts (arithmetic scorer) into path. 0 or -1. */
static inline int write_sums(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    for (int a = 0; a < 10; a++)
        for (int b = 0; b < 10; b++)
            fprintf(f,
                    "{\"prompt\": \"What is %d + %d? Answer with just the number, written after ####, like this: "
                    "#### <number>\", \"ground_truth\": \"%d\", \"data_source\": \"arithmetic\"}\n",
                    a, b, a + b);
    return fclose(f);
}

/* The batch shape of the sums task's runs: 16 prompts x 8 responses of up to 10 tokens, one optimizer step a
 * step (overrides, for an array of them). */
#define SUMS_TASK_SHAPE                                                                                                \
    "data.train_batch_size=16", "data.max_response_length=10", "actor_rollout_ref.rollout.n=8",                        \
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"

/* The sums task of the learning tests: a temporary root with the tiny model (hidden 128, seed 4, std 0.05) and
 * the 100 sums, and the overrides naming them (model path, run directory under root/runs, train and val files). */
struct sums_task {
    char root[64], model[1100], data[1100];
    char mp[1300], rd[1200], tf[1200], vf[1200];
};

static inline int sums_task_make(struct sums_task *s, const char *prefix)
{
    snprintf(s->root, sizeof s->root, "/tmp/%s_XXXXXX", prefix);
    if (!mkdtemp(s->root))
        return -1;
    snprintf(s->model, sizeof s->model, "%s/tiny", s->root);
    snprintf(s->data, sizeof s->data, "%s/sums.jsonl", s->root);
    snprintf(s->mp, sizeof s->mp, "actor_rollout_ref.model.path=%s", s->model);
    snprintf(s->rd, sizeof s->rd, "trainer.default_local_dir=%s/runs", s->root);
    snprintf(s->tf, sizeof s->tf, "data.train_files=%s", s->data);
    snprintf(s->vf, sizeof s->vf, "data.val_files=%s", s->data);
    return tiny_model_write_sized(s->model, 4, 0.05, 128) == 0 && write_sums(s->data) == 0 ? 0 : -1;
}

/* val-core/arithmetic/reward/mean@1 at each step it was measured (-1 where not) */
static inline int read_val(const char *path, double *val, int max_step)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[1 << 16];
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *v = json_object_get(o, "val-core/arithmetic/reward/mean@1");
        int step = (int)json_integer_value(json_object_get(o, "step"));
        if (json_is_number(v) && step >= 0 && step <= max_step)
            val[step] = json_number_value(v);
        json_decref(o);
    }
    fclose(f);
    return 0;
}

#endif
