/* Checkpoints: round trip, keep-last-K, corruption detected, and a crash in
 * the middle of a save (left-over temporary directory, stale "latest") never
 * hides the previous complete checkpoint. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
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

/* Keep-last-K under a run directory whose name would break a shell command ("O'Brien runs", a quote, $(),
 * a leading dash): the older checkpoints go, the newest K stay, and nothing the name spells is run. */
static void test_keep_under_hostile_names(void **state)
{
    (void)state;
    char base[] = "/tmp/grpo_ckpt_XXXXXX", err[1024], root[1200], path[1400], cwd[4096];
    assert_non_null(mkdtemp(base));
    struct model *m = tiny();
    struct adamw *o = opt_for(m);
    const char *names[] = {"O'Brien runs", "e'$(touch INJECTED)'", "-e' victim '", NULL};
    snprintf(path, sizeof path, "%s/victim", base);
    assert_int_equal(mkdir(path, 0755), 0);
    assert_non_null(getcwd(cwd, sizeof cwd));
    for (int i = 0; names[i]; i++) {
        snprintf(root, sizeof root, "%s/%s", base, names[i]);
        assert_int_equal(chdir(base), 0); /* where an injected command would act */
        for (int k = 1; k <= 4; k++) {
            struct run_state st = {.global_step = k, .epoch = 1, .cursor = k, .seed = 1, .total_steps = 4};
            if (checkpoint_save(root, m, o, NULL, &st, 1, err, sizeof err) != 0)
                fail_msg("%s", err);
        }
        assert_int_equal(chdir(cwd), 0);
        for (int k = 1; k <= 4; k++) {
            snprintf(path, sizeof path, "%s/global_step_%d", root, k);
            if ((access(path, F_OK) == 0) != (k == 4))
                fail_msg("%s: %s after keeping 1 of 4", path, k == 4 ? "missing" : "still there");
        }
    }
    snprintf(path, sizeof path, "%s/INJECTED", base);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/victim", base);
    assert_int_equal(access(path, F_OK), 0);
    adamw_free(o);
    model_free(m);
    must_rm_rf(base);
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
    /* a FIFO in place of state.json, and of optim.bin: refused at once, named; never a read that waits */
    const char *fifos[] = {"state.json", "optim.bin"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, fifos[i]);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(mkfifo(path, 0600), 0);
        assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
        if (!strstr(err, "a FIFO, not a regular file"))
            fail_msg("%s as a FIFO: error '%s' does not say so", fifos[i], err);
    }
    assert_int_equal(optim_state_read(path, o2, err, sizeof err), -1);
    assert_non_null(strstr(err, "a FIFO, not a regular file"));
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

/* Replace the first `from` in FILE by `to` (a hand edit of state.json). */
static void edit_file(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *at = strstr(text, from);
    if (!at)
        fail_msg("%s holds no '%s': %s", path, from, text);
    f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(text, 1, (size_t)(at - text), f);
    fputs(to, f);
    fputs(at + strlen(from), f);
    fclose(f);
}

/* issue 27: state.json must agree with the directory it sits in and with the optimizer file beside it */
static void test_state_disagrees(void **state)
{
    (void)state;
    char root[] = "/tmp/grpo_ckpt_XXXXXX", err[1024], dir[1200], path[1300], moved[1300];
    assert_non_null(mkdtemp(root));
    struct model *m = tiny();
    struct adamw *o = opt_for(m), *o2 = adamw_create(m->w.n_floats, 0, 0, 0, 0);
    struct run_state st = {.global_step = 2, .total_steps = 10}, st2;
    assert_int_equal(checkpoint_save(root, m, o, NULL, &st, 0, err, sizeof err), 0);
    snprintf(dir, sizeof dir, "%s/global_step_2", root);
    snprintf(path, sizeof path, "%s/state.json", dir);
    if (checkpoint_load(dir, m, o2, &st2, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(st2.global_step, 2);
    /* a global_step of 1e12 in global_step_2/: refused, naming the file and the directory */
    edit_file(path, "\"global_step\": 2", "\"global_step\": 1000000000000");
    assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
    if (!strstr(err, "state.json says global_step 1000000000000") || !strstr(err, "global_step_2"))
        fail_msg("error '%s' does not name both", err);
    edit_file(path, "\"global_step\": 1000000000000", "\"global_step\": 2");
    /* the whole checkpoint moved under another step's name */
    snprintf(moved, sizeof moved, "%s/global_step_7", root);
    assert_int_equal(rename(dir, moved), 0);
    assert_int_equal(checkpoint_load(moved, m, o2, &st2, err, sizeof err), -1);
    if (!strstr(err, "says global_step 2") || !strstr(err, "global_step_7"))
        fail_msg("error '%s' does not name both", err);
    assert_int_equal(rename(moved, dir), 0);
    /* a directory not named after a step */
    snprintf(moved, sizeof moved, "%s/best", root);
    assert_int_equal(rename(dir, moved), 0);
    assert_int_equal(checkpoint_load(moved, m, o2, &st2, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a checkpoint directory"));
    assert_int_equal(rename(moved, dir), 0);
    /* the optimizer's step count disagrees with optim.bin (o->t is 7) */
    edit_file(path, "\"optim_steps\": 7", "\"optim_steps\": 8");
    assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
    if (!strstr(err, "optimizer took 8 steps") || !strstr(err, "optim.bin holds 7"))
        fail_msg("error '%s' does not name both", err);
    /* a negative cursor */
    edit_file(path, "\"optim_steps\": 8", "\"optim_steps\": 7");
    edit_file(path, "\"cursor\": 0", "\"cursor\": -5");
    assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
    assert_non_null(strstr(err, "cursor -5"));
    /* an older checkpoint's state.json, without optim_steps, still loads */
    edit_file(path, "\"cursor\": -5", "\"cursor\": 0");
    edit_file(path, ",\n  \"optim_steps\": 7", "");
    if (checkpoint_load(dir, m, o2, &st2, err, sizeof err) != 0)
        fail_msg("%s", err);
    adamw_free(o2);
    adamw_free(o);
    model_free(m);
    must_rm_rf(root);
}

/* issue 27: state.json must agree with the model files beside it (their sizes and checksums as written) */
static void test_state_disagrees_with_files(void **state)
{
    (void)state;
    char root[] = "/tmp/grpo_ckpt_XXXXXX", err[1024], dir[1200], path[1300], model[1300];
    assert_non_null(mkdtemp(root));
    struct model *m = tiny();
    struct adamw *o = opt_for(m), *o2 = adamw_create(m->w.n_floats, 0, 0, 0, 0);
    struct run_state st = {.global_step = 3, .total_steps = 10}, st2;
    assert_int_equal(checkpoint_save(root, m, o, NULL, &st, 0, err, sizeof err), 0);
    snprintf(dir, sizeof dir, "%s/global_step_3", root);
    snprintf(path, sizeof path, "%s/state.json", dir);
    snprintf(model, sizeof model, "%s/actor/model.safetensors", dir);
    if (checkpoint_load(dir, m, o2, &st2, err, sizeof err) != 0)
        fail_msg("%s", err);
    bool listed = false;
    for (int i = 0; i < st2.n_files; i++)
        listed |= strcmp(st2.files[i].name, "actor/model.safetensors") == 0;
    assert_true(listed);
    /* a file state.json lists is not there */
    edit_file(path, "\"files\": {", "\"files\": {\"actor/extra.bin\": {\"bytes\": 1, \"crc32c\": \"00000000\"},");
    assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
    if (!strstr(err, "global_step_3/state.json lists actor/extra.bin") || !strstr(err, "cannot be read"))
        fail_msg("error '%s'", err);
    /* a listed name that leaves the checkpoint directory is refused before anything is read */
    edit_file(path, "\"actor/extra.bin\"", "\"../../etc/passwd\"");
    assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
    if (!strstr(err, "not a plain path inside the checkpoint"))
        fail_msg("error '%s'", err);
    edit_file(path, "\"../../etc/passwd\": {\"bytes\": 1, \"crc32c\": \"00000000\"},", "");
    if (checkpoint_load(dir, m, o2, &st2, err, sizeof err) != 0)
        fail_msg("%s", err);
    /* one byte of the weights changed (same size): refused, naming state.json and the model file */
    struct stat sb;
    assert_int_equal(stat(model, &sb), 0);
    FILE *f = fopen(model, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)sb.st_size - 3, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, (long)sb.st_size - 3, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    fclose(f);
    assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
    if (!strstr(err, "global_step_3/state.json records actor/model.safetensors") || !strstr(err, model) ||
        !strstr(err, "CRC32C"))
        fail_msg("error '%s' does not name both files", err);
    /* bytes appended to the weights file (its tensors still read): the sizes differ */
    f = fopen(model, "ab");
    assert_non_null(f);
    fputs("junk", f);
    fclose(f);
    assert_int_equal(checkpoint_load(dir, m, o2, &st2, err, sizeof err), -1);
    char want[64];
    snprintf(want, sizeof want, "has %lld bytes with", (long long)sb.st_size + 4);
    if (!strstr(err, want))
        fail_msg("error '%s' does not give the file's size", err);
    adamw_free(o2);
    adamw_free(o);
    model_free(m);
    must_rm_rf(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_keep),
        cmocka_unit_test(test_keep_under_hostile_names),
        cmocka_unit_test(test_crash_leftovers_and_corruption),
        cmocka_unit_test(test_non_finite_refused),
        cmocka_unit_test(test_state_disagrees),
        cmocka_unit_test(test_state_disagrees_with_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
