/* Checkpoints: round trip, keep-last-K, corruption detected, and a crash in
 * the middle of a save (left-over temporary directory, stale "latest") never
 * hides the previous complete checkpoint. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "../test_util.h"

#include "worker/model/model_io.h"
#include "worker/trainer/checkpoint.h"

static struct model *tiny(void)
{
    char err[512];
    struct model *m = model_load("tests/fixtures/models/tiny-llama-tied", err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    return m;
}

static struct adamw *opt_for(const struct model *m)
{
    struct adamw *o = adamw_create(m->w.n_floats, 0.9, 0.95, 1e-8, 0.1);
    for (size_t i = 0; i < o->n; i++) {
        o->m[i] = (float)i * 1e-3f;
        o->v[i] = (float)(i % 17) * 1e-4f;
    }
    o->t = 7;
    return o;
}

static void test_round_trip_and_keep(void **state)
{
    (void)state;
    char root[] = "/tmp/grpo_ckpt_XXXXXX", err[1024], dir[1024];
    assert_non_null(mkdtemp(root));
    struct model *m = tiny();
    struct adamw *o = opt_for(m);
    for (int k = 1; k <= 4; k++) {
        struct run_state st = {.global_step = k,
                               .epoch = 1,
                               .cursor = 8 * k,
                               .seed = 0xfeedfacecafebeefull,
                               .config_digest = 0x1234,
                               .total_steps = 10};
        m->w.mem[0] = (float)k; /* each checkpoint distinguishable */
        if (checkpoint_save(root, m, o, NULL, &st, 2, err, sizeof err) != 0)
            fail_msg("%s", err);
    }
    /* only the newest two remain */
    char path[1100];
    snprintf(path, sizeof path, "%s/global_step_2", root);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/global_step_3/state.json", root);
    assert_int_equal(access(path, F_OK), 0);
    assert_int_equal(checkpoint_find_latest(root, dir, sizeof dir), 0);
    assert_non_null(strstr(dir, "global_step_4"));
    /* load into fresh objects: identical */
    struct model *m2 = tiny();
    struct adamw *o2 = adamw_create(m2->w.n_floats, 0, 0, 0, 0);
    struct run_state st2;
    if (checkpoint_load(dir, m2, o2, &st2, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_memory_equal(m2->w.mem, m->w.mem, m->w.n_floats * sizeof(float));
    assert_memory_equal(o2->m, o->m, o->n * sizeof(float));
    assert_memory_equal(o2->v, o->v, o->n * sizeof(float));
    assert_int_equal(o2->t, 7);
    assert_true(o2->beta2 == 0.95);
    assert_int_equal(st2.global_step, 4);
    assert_int_equal(st2.cursor, 32);
    assert_true(st2.seed == 0xfeedfacecafebeefull);
    assert_true(st2.config_digest == 0x1234);
    /* the policy is a Hugging Face model directory */
    snprintf(path, sizeof path, "%s/actor/config.json", dir);
    assert_int_equal(access(path, F_OK), 0);
    model_free(m2);
    adamw_free(o2);
    adamw_free(o);
    model_free(m);
    must_rm_rf(root);
}

static void test_crash_leftovers_and_corruption(void **state)
{
    (void)state;
    char root[] = "/tmp/grpo_ckpt_XXXXXX", err[1024], dir[1024], path[1200];
    assert_non_null(mkdtemp(root));
    struct model *m = tiny();
    struct adamw *o = opt_for(m);
    struct run_state st = {.global_step = 3, .total_steps = 10};
    assert_int_equal(checkpoint_save(root, m, o, NULL, &st, 0, err, sizeof err), 0);
    /* a crash while writing step 5: a half-written temporary directory, and "latest" already naming 5 */
    snprintf(path, sizeof path, "%s/.global_step_5.tmp", root);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/global_step_5", root);
    assert_int_equal(mkdir(path, 0755), 0); /* no state.json: incomplete */
    snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", root);
    FILE *f = fopen(path, "w");
    fputs("5\n", f);
    fclose(f);
    assert_int_equal(checkpoint_find_latest(root, dir, sizeof dir), 0);
    assert_non_null(strstr(dir, "global_step_3"));
    /* a corrupted optimizer file is refused with its name */
    snprintf(path, sizeof path, "%s/optim.bin", dir);
    f = fopen(path, "r+b");
    fseek(f, 100, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    struct adamw *o2 = adamw_create(m->w.n_floats, 0, 0, 0, 0);
    struct run_state st2;
    assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
    assert_non_null(strstr(err, "optim.bin: checksum mismatch"));
    /* and a truncated one */
    assert_int_equal(truncate(path, 50), 0);
    assert_int_equal(optim_state_read(path, o2, err, sizeof err), -1);
    assert_non_null(strstr(err, "truncated or corrupt"));
    /* no checkpoint at all */
    char empty[] = "/tmp/grpo_ckpt_empty_XXXXXX";
    assert_non_null(mkdtemp(empty));
    assert_int_equal(checkpoint_find_latest(empty, dir, sizeof dir), -1);
    must_rm_rf(empty);
    adamw_free(o2);
    adamw_free(o);
    model_free(m);
    must_rm_rf(root);
}

/* issue 12: a checkpoint with NaN weights was accepted, and every step then skipped its optimizer step */
static void test_non_finite_refused(void **state)
{
    (void)state;
    char root[] = "/tmp/grpo_ckpt_XXXXXX", err[1024], dir[1024];
    assert_non_null(mkdtemp(root));
    struct model *m = tiny();
    struct adamw *o = opt_for(m);
    struct run_state st = {.global_step = 2, .total_steps = 10};
    const size_t at = m->w.layers[1].w_down - m->w.mem + 3; /* in model.layers.1.mlp.down_proj.weight */
    m->w.mem[at] = NAN;
    assert_int_equal(checkpoint_save(root, m, o, NULL, &st, 0, err, sizeof err), 0);
    assert_int_equal(checkpoint_find_latest(root, dir, sizeof dir), 0);
    struct model *m2 = tiny();
    float *before = malloc(m2->w.n_floats * sizeof(float));
    memcpy(before, m2->w.mem, m2->w.n_floats * sizeof(float));
    struct adamw *o2 = adamw_create(m2->w.n_floats, 0, 0, 0, 0);
    struct run_state st2;
    assert_int_equal(checkpoint_load(dir, m2, o2, &st2, err, sizeof err), -1);
    if (!strstr(err, "tensor 'model.layers.1.mlp.down_proj.weight'") || !strstr(err, "non-finite"))
        fail_msg("error '%s' does not name the tensor", err);
    assert_memory_equal(m2->w.mem, before, m2->w.n_floats * sizeof(float)); /* nothing half-loaded */
    /* infinite weights too */
    m->w.mem[at] = -INFINITY;
    st.global_step = 3;
    assert_int_equal(checkpoint_save(root, m, o, NULL, &st, 0, err, sizeof err), 0);
    assert_int_equal(checkpoint_find_latest(root, dir, sizeof dir), 0);
    assert_int_equal(checkpoint_load(dir, m2, o2, &st2, err, sizeof err), -1);
    assert_non_null(strstr(err, "-inf"));
    /* finite weights, non-finite AdamW moments */
    m->w.mem[at] = 0.5f;
    o->v[11] = NAN;
    st.global_step = 4;
    assert_int_equal(checkpoint_save(root, m, o, NULL, &st, 0, err, sizeof err), 0);
    assert_int_equal(checkpoint_find_latest(root, dir, sizeof dir), 0);
    assert_int_equal(checkpoint_load(dir, m2, o2, &st2, err, sizeof err), -1);
    if (!strstr(err, "optim.bin: AdamW moment v[11] is nan"))
        fail_msg("error '%s' does not name the moment", err);
    o->v[11] = 0.0f;
    st.global_step = 5;
    assert_int_equal(checkpoint_save(root, m, o, NULL, &st, 0, err, sizeof err), 0);
    assert_int_equal(checkpoint_find_latest(root, dir, sizeof dir), 0);
    if (checkpoint_load(dir, m2, o2, &st2, err, sizeof err) != 0)
        fail_msg("%s", err);
    free(before);
    adamw_free(o2);
    adamw_free(o);
    model_free(m2);
    model_free(m);
    must_rm_rf(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_keep),
        cmocka_unit_test(test_crash_leftovers_and_corruption),
        cmocka_unit_test(test_non_finite_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
