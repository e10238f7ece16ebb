/* The reward model: a decoder backbone (worker/model) plus a one-row score head. */
#include "reward_model.h"

#include <jansson.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_file.h"
#include "common/fs.h"
#include "common/check.h"
#include "worker/formats/safetensors.h"
#include "worker/model/model.h"
#include "worker/model/model_io.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/step/prompts.h"
#include "common/config_key_names.h"

struct reward_model {
    struct model *m;
    float *score; /* (D) the score head's one row */
    struct tokenizer *tok;
    char close[64]; /* what closes the assistant's turn: "<|im_end|>" (ChatML), or the EOS text */
};

/* The number of labels of a classification config.json: num_labels, else the size of id2label (transformers
 * writes the latter). */
static int labels_of(json_t *root)
{
    json_t *n = json_object_get(root, "num_labels");
    if (json_is_integer(n))
        return (int)json_integer_value(n);
    json_t *ids = json_object_get(root, "id2label");
    return json_is_object(ids) ? (int)json_object_size(ids) : 2; /* transformers' default */
}

struct reward_model *reward_model_load(const char *dir, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_file_load(path, &je);
    if (!root) {
        error_set(err, errlen, KEY_rm_model_path ": %s:%d: cannot read config.json: %s", path, je.line, je.text);
        return NULL;
    }
    const char *a = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
    char arch[128];
    snprintf(arch, sizeof arch, "%s", a ? a : "missing");
    const int labels = labels_of(root);
    json_decref(root);
    if (!strstr(arch, "ForSequenceClassification")) {
        error_set(err, errlen,
                  KEY_rm_model_path
                  ": %s: architectures is '%s', not a *ForSequenceClassification reward model "
                  "(LlamaForSequenceClassification, Qwen2ForSequenceClassification, Qwen3ForSequenceClassification)",
                  path, arch);
        return NULL;
    }
    if (labels != 1) {
        error_set(err, errlen, KEY_rm_model_path ": %s: %d labels; a reward model scores with one", path, labels);
        return NULL;
    }
    struct reward_model *rm = xcalloc(1, sizeof *rm);
    rm->m = model_load_hf_backbone(dir, err, errlen);
    if (!rm->m)
        goto fail;
    const int D = rm->m->cfg.hidden_size;
    struct st_model *st = st_model_open(dir, err, errlen);
    if (!st)
        goto fail;
    const struct st_file *f;
    const struct st_tensor_info *t = st_model_find(st, "score.weight", &f);
    if (!t || t->n_dims != 2 || t->shape[0] != 1 || t->shape[1] != D) {
        if (t)
            error_set(err, errlen, "%s: score.weight has shape [%lld, %lld], want [1, %d]", st_path(f),
                      (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0), D);
        else
            error_set(err, errlen, KEY_rm_model_path ": %s: tensor 'score.weight' is missing", dir);
        st_model_close(st);
        goto fail;
    }
    rm->score = xmalloc((size_t)D * sizeof(float));
    int rc = st_tensor_to_f32(f, t, rm->score, err, errlen);
    st_model_close(st);
    if (rc != 0)
        goto fail;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char why[256];
    FILE *tf = fs_fopen_read(path, why, sizeof why); /* optional: only scoring text needs it */
    if (!tf && errno != ENOENT) {
        error_set(err, errlen, KEY_rm_model_path ": %s: cannot open: %s", path, why);
        goto fail;
    }
    if (!tf)
        return rm;
    fclose(tf);
    rm->tok = prompt_load_tokenizer(dir, NULL, NULL, err, errlen);
    if (!rm->tok)
        goto fail;
    if (tokenizer_token_id(rm->tok, "<|im_end|>") >= 0)
        snprintf(rm->close, sizeof rm->close, "<|im_end|>");
    else if (tokenizer_eos_id(rm->tok) >= 0) {
        const int32_t eos = tokenizer_eos_id(rm->tok);
        char *text = tokenizer_decode(rm->tok, &eos, 1, false);
        snprintf(rm->close, sizeof rm->close, "%s", text);
        free(text);
    }
    return rm;
fail:
    reward_model_free(rm);
    return NULL;
}

void reward_model_free(struct reward_model *rm)
{
    if (!rm)
        return;
    model_free(rm->m);
    free(rm->score);
    if (rm->tok)
        tokenizer_free(rm->tok);
    free(rm);
}

const struct tokenizer *reward_model_tokenizer(const struct reward_model *rm) { return rm->tok; }

double reward_model_score_ids(struct reward_model *rm, const int32_t *ids, int n)
{
    if (n < 1)
        check_failf(__FILE__, __LINE__, "reward_model_score_ids: an empty sequence");
    const int D = rm->m->cfg.hidden_size;
    struct kv_cache *kc = kv_cache_create(rm->m, n);
    float *h = xmalloc((size_t)D * sizeof(float));
    model_step_hidden(rm->m, &kc, 1, &n, ids, NULL, false, h);
    double s = 0;
    for (int j = 0; j < D; j++)
        s += (double)rm->score[j] * h[j];
    free(h);
    kv_cache_free(kc);
    return s;
}

double reward_model_score_text(struct reward_model *rm, const char *prompt_text, const char *response, int max_tokens)
{
    if (!rm->tok)
        check_failf(__FILE__, __LINE__, "reward_model_score_text: the reward model has no tokenizer");
    const size_t len = strlen(prompt_text) + strlen(response) + strlen(rm->close) + 1;
    char *text = xmalloc(len);
    snprintf(text, len, "%s%s%s", prompt_text, response, rm->close);
    size_t n;
    int32_t *ids = tokenizer_encode(rm->tok, text, strlen(text), 0, &n);
    free(text);
    const int32_t *from = ids;
    if (max_tokens > 0 && n > (size_t)max_tokens) { /* keep the end: the response is what is judged */
        from = ids + (n - (size_t)max_tokens);
        n = (size_t)max_tokens;
    }
    double s = n ? reward_model_score_ids(rm, from, (int)n) : 0.0;
    free(ids);
    return s;
}
