/* The reward model against transformers: LlamaForSequenceClassification's score of three sequences
 * (tests/fixtures/models/tiny-llama-rm, made by make_model_fixtures.py); and what is not a one-label
 * classification checkpoint is refused by name. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../test_util.h"

#include "worker/rewards/reward_model.h"

#define FIX TEST_MODELS_FIXTURE

static void test_scores_match_transformers(void **state)
{
    (void)state;
    char err[1024];
    struct reward_model *rm = reward_model_load(FIX "tiny-llama-rm", err, sizeof err);
    if (!rm)
        fail_msg("%s", err);
    json_error_t je;
    json_t *f = json_load_file(FIX "tiny-llama-rm/rm_scores.json", 0, &je);
    assert_non_null(f);
    json_t *seqs = json_object_get(f, "seqs"), *scores = json_object_get(f, "scores");
    assert_int_equal(json_array_size(seqs), 3);
    for (size_t k = 0; k < json_array_size(seqs); k++) {
        json_t *s = json_array_get(seqs, k);
        int32_t ids[64];
        const int n = (int)json_array_size(s);
        for (int i = 0; i < n; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(s, (size_t)i));
        const double got = reward_model_score_ids(rm, ids, n), want = json_real_value(json_array_get(scores, k));
        if (!(fabs(got - want) <= 1e-5 * fmax(1.0, fabs(want))))
            fail_msg("sequence %zu: score %.9g, transformers %.9g", k, got, want);
    }
    json_decref(f);
    assert_null(reward_model_tokenizer(rm)); /* the fixture has no tokenizer: ids only */
    reward_model_free(rm);
}

static void test_refuses_what_is_not_a_reward_model(void **state)
{
    (void)state;
    char err[1024];
    assert_null(reward_model_load(FIX "tiny-llama-tied", err, sizeof err));
    assert_non_null(strstr(err, "architectures is 'LlamaForCausalLM', not a *ForSequenceClassification reward model"));
    char dir[] = "/tmp/grpo-rm-XXXXXX", cmd[512];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp " FIX "tiny-llama-rm/* %s/", dir);
    assert_int_equal(system(cmd), 0);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(path, 0, &je);
    json_object_set_new(c, "id2label", json_pack("{s:s, s:s}", "0", "bad", "1", "good"));
    json_dump_file(c, path, 0);
    assert_null(reward_model_load(dir, err, sizeof err));
    assert_non_null(strstr(err, "2 labels; a reward model scores with one"));
    json_object_set_new(c, "id2label", json_pack("{s:s}", "0", "score"));
    json_dump_file(c, path, 0);
    json_decref(c);
    struct reward_model *rm = reward_model_load(dir, err, sizeof err); /* back to one label: loads */
    if (!rm)
        fail_msg("%s", err);
    reward_model_free(rm);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scores_match_transformers),
        cmocka_unit_test(test_refuses_what_is_not_a_reward_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
