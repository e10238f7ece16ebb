/* The configuration system: defaults, YAML loading, overrides, and errors that
 * name the key, file and line. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/config.h"

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/grpo_cfg_XXXXXX.yaml");
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

/* Load text as a YAML file; returns rc and leaves the error in err. */
static int load_text(struct grpo_config *c, const char *text, struct cfg_error *err, char **path_out)
{
    char *path = write_tmp(text);
    int rc = config_load_yaml(c, path, err);
    if (path_out)
        *path_out = path;
    else {
        unlink(path);
        free(path);
    }
    return rc;
}

static void test_defaults(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    assert_int_equal(c.data_train_batch_size, 4);
    assert_int_equal(c.rollout_n, 8);
    assert_string_equal(c.alg_adv_estimator, "grpo");
    assert_true(c.alg_norm_adv_by_std_in_grpo);
    assert_int_equal(c.actor_optim_betas.n, 2);
    assert_true(c.actor_optim_betas.v[1] == 0.999);
    assert_true(c.actor_optim_lr == 5e-6);
    assert_string_equal(c.origin[0], "default");
    struct cfg_error err;
    assert_int_equal(config_validate(&c, &err), 0);
    config_free(&c);
}

static void test_every_default_parses_and_has_help(void **state)
{
    (void)state;
    for (int i = 0; i < config_num_keys(); i++) {
        const struct cfg_key_info *k = config_key(i);
        assert_non_null(k->help);
        assert_true(strlen(k->help) > 10);
        assert_ptr_equal(config_find(k->name), k);
    }
}

static void test_yaml_nested_and_origin(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err;
    char *path;
    const char *text = "# a verl-style file\n"
                       "data:\n"
                       "  train_batch_size: 16\n"
                       "  max_response_length: 100\n"
                       "actor_rollout_ref:\n"
                       "  actor:\n"
                       "    optim:\n"
                       "      lr: 3.0e-6\n"
                       "      betas: [0.9, 0.95]\n"
                       "    ppo_mini_batch_size: 4\n"
                       "    use_kl_loss: False\n"
                       "    ppo_micro_batch_size_per_gpu: null\n"
                       "  rollout:\n"
                       "    n: 5\n"
                       "algorithm:\n"
                       "  adv_estimator: rloo\n"
                       "trainer:\n"
                       "  experiment_name: 'my run: 1'\n";
    assert_int_equal(load_text(&c, text, &err, &path), 0);
    assert_int_equal(c.data_train_batch_size, 16);
    assert_int_equal(c.data_max_response_length, 100);
    assert_true(c.actor_optim_lr == 3.0e-6);
    assert_true(c.actor_optim_betas.v[1] == 0.95);
    assert_int_equal(c.actor_ppo_mini_batch_size, 4);
    assert_false(c.actor_use_kl_loss);
    assert_int_equal(c.actor_ppo_micro_batch_size_per_gpu, 4); /* null keeps the default */
    assert_int_equal(c.rollout_n, 5);
    assert_string_equal(c.alg_adv_estimator, "rloo");
    assert_string_equal(c.trainer_experiment_name, "my run: 1");
    /* origin: file and line */
    const struct cfg_key_info *k = config_find("actor_rollout_ref.rollout.n");
    char want[600];
    snprintf(want, sizeof want, "%s:14", path);
    assert_string_equal(c.origin[k - config_key(0)], want);
    assert_int_equal(config_validate(&c, &err), 0);

    /* --print-config output is YAML that loads back to the same configuration */
    char *out = strdup("/tmp/grpo_cfg_out_XXXXXX.yaml");
    int fd = mkstemps(out, 5);
    FILE *f = fdopen(fd, "w");
    config_print(&c, f);
    fclose(f);
    struct grpo_config d;
    config_init(&d);
    assert_int_equal(config_load_yaml(&d, out, &err), 0);
    assert_true(config_digest(&c) == config_digest(&d));
    d.rollout_n = 6;
    assert_true(config_digest(&c) != config_digest(&d));
    config_free(&d);
    unlink(out);
    free(out);
    unlink(path);
    free(path);
    config_free(&c);
}

static void expect_error(const char *text, const char *needle1, const char *needle2)
{
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err = {{0}};
    char *path;
    assert_int_equal(load_text(&c, text, &err, &path), -1);
    if (!strstr(err.msg, needle1) || (needle2 && !strstr(err.msg, needle2)))
        fail_msg("error '%s' lacks '%s' / '%s'", err.msg, needle1, needle2 ? needle2 : "");
    /* every file error names the file */
    if (!strstr(err.msg, path))
        fail_msg("error '%s' does not name the file %s", err.msg, path);
    unlink(path);
    free(path);
    config_free(&c);
}

static void test_yaml_errors(void **state)
{
    (void)state;
    expect_error("data:\n  train_batch_size: 4\n  train_bach_size: 4\n", ":3: unknown key 'data.train_bach_size'",
                 "did you mean 'data.train_batch_size'");
    expect_error("actor_rollout_ref:\n  rollout:\n    temprature: 0.5\n", ":3: unknown key",
                 "'actor_rollout_ref.rollout.temperature'");
    expect_error("data:\n  train_batch_size: lots\n", ":2: data.train_batch_size expects an integer", "'lots'");
    expect_error("data:\n  train_batch_size: -1\n", ":2: data.train_batch_size = -1 is out of range", NULL);
    expect_error("algorithm:\n  adv_estimator: gaussian\n", ":2: algorithm.adv_estimator must be one of", "'gaussian'");
    /* a value of verl's that does not run here says why, and the values that do */
    expect_error("algorithm:\n  adv_estimator: gae\n", ":2: algorithm.adv_estimator=gae: GAE needs a critic",
                 "grpo|grpo_vectorized|rloo");
    expect_error("data: 5\n", ":1: 'data' is a section", NULL);
    expect_error("data:\n  train_batch_size:\n    x: 1\n", ":2: 'data.train_batch_size' takes a value", NULL);
    expect_error("data:\n  seed: 1\n  seed: 2\n", ":3: key 'data.seed' is given twice", NULL);
    expect_error("data:\n  seed: [1\n", "YAML syntax error", NULL);
    expect_error("- a\n- b\n", "top level must be a mapping", NULL);
    expect_error("bogus_section:\n  x: 1\n", ":1: unknown key 'bogus_section'", NULL);
    expect_error("actor_rollout_ref:\n  actor:\n    optim:\n      betas: [0.9, x]\n", "expects a list", NULL);
    expect_error("actor_rollout_ref:\n  actor:\n    optim:\n      betas: [0.9, 2]\n", "out of range", NULL);
    expect_error("data:\n  shuffle: maybe\n", "expects true or false", NULL);
}

static void test_missing_and_empty_file(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err;
    assert_int_equal(config_load_yaml(&c, "/nonexistent/run.yaml", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/run.yaml"));
    assert_non_null(strstr(err.msg, "No such file"));
    assert_int_equal(load_text(&c, "", &err, NULL), 0);
    assert_int_equal(load_text(&c, "# only a comment\n", &err, NULL), 0);
    config_free(&c);
}

static void test_overrides(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err;
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.rollout.n=16", &err), 0);
    assert_int_equal(c.rollout_n, 16);
    assert_int_equal(config_apply_override(&c, "+algorithm.norm_adv_by_std_in_grpo=false", &err), 0);
    assert_false(c.alg_norm_adv_by_std_in_grpo);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.optim.betas=[0.8,0.9]", &err), 0);
    assert_true(c.actor_optim_betas.v[0] == 0.8);
    assert_int_equal(config_apply_override(&c, "data.train_batch_size=x", &err), -1);
    assert_non_null(strstr(err.msg, "command line: data.train_batch_size expects an integer"));
    assert_int_equal(config_apply_override(&c, "rollout.n=3", &err), -1); /* verl's fully-async config declares it */
    assert_non_null(strstr(err.msg, "responses per prompt are actor_rollout_ref.rollout.n"));
    assert_int_equal(config_apply_override(&c, "=3", &err), -1);
    const struct cfg_key_info *k = config_find("actor_rollout_ref.rollout.n");
    assert_string_equal(c.origin[k - config_key(0)], "command line");
    config_free(&c);
}

/* Fully-async training (async_training.*): on when any of its keys is given; data.train_batch_size 0 (verl's
 * fully-async scripts' value) is then require_batches x ppo_mini_batch_size; what it does not run with is refused
 * by name. */
static int async_config(struct grpo_config *c, const char *const *args, int n, struct cfg_error *err)
{
    config_init(c);
    for (int i = 0; i < n; i++)
        if (config_apply_override(c, args[i], err) != 0)
            return -1;
    return config_resolve(c, err) != 0 || config_validate(c, err) != 0 ? -1 : 0;
}

static void test_fully_async_keys(void **state)
{
    (void)state;
    struct grpo_config c;
    struct cfg_error err = {{0}};
    /* 0 alone: verl's fully-async value without its keys */
    const char *zero[] = {"data.train_batch_size=0"};
    assert_int_equal(async_config(&c, zero, 1, &err), -1);
    assert_non_null(strstr(err.msg, "verl's fully-async scripts' value"));
    config_free(&c);
    /* a key turns it on; 0 is derived */
    const char *on[] = {"data.train_batch_size=0", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                        "async_training.require_batches=3", "async_training.staleness_threshold=0.5",
                        "rollout.total_rollout_steps=61"};
    assert_int_equal(async_config(&c, on, 5, &err), 0);
    assert_true(c.async_enable);
    assert_int_equal(c.data_train_batch_size, 6);
    assert_int_equal(config_total_steps(&c, 1000), 10); /* 61 prompts / 6 a step */
    config_free(&c);
    /* verl's noted key alone turns it on too */
    const char *noted[] = {"async_training.use_dynamic_resource_scheduling=false", "data.train_batch_size=0"};
    assert_int_equal(async_config(&c, noted, 2, &err), 0);
    assert_true(c.async_enable);
    config_free(&c);
    const char *dyn[] = {"async_training.use_dynamic_resource_scheduling=true"};
    assert_int_equal(async_config(&c, dyn, 1, &err), -1);
    assert_non_null(strstr(err.msg, "dynamic resource scheduling"));
    config_free(&c);
    /* a batch size that is not require_batches x ppo_mini_batch_size */
    const char *bad[] = {"data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                         "async_training.require_batches=1"};
    assert_int_equal(async_config(&c, bad, 3, &err), -1);
    assert_non_null(strstr(err.msg, "give 0 (verl's fully-async value) or 2"));
    config_free(&c);
    /* refused by name */
    static const char *const refused[][2] = {
        {"algorithm.filter_groups.enable=true", "DAPO's dynamic sampling"},
        {"actor_rollout_ref.rollout.weight_sync=broadcast", "the weight broadcast"},
        {"algorithm.adv_estimator=remax", "ReMax"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const char *args[] = {"async_training.require_batches=2", "data.train_batch_size=0", refused[i][0]};
        if (async_config(&c, args, 3, &err) != -1 || !strstr(err.msg, refused[i][1]) ||
            !strstr(err.msg, "not available yet"))
            fail_msg("%s with fully-async training: '%s'", refused[i][0], err.msg);
        config_free(&c);
    }
    /* the trainers' layouts run with it: trainer rank 0's stream sends each step's units to the others */
    static const char *const layouts[] = {"actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                          "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                          "actor_rollout_ref.actor.megatron.context_parallel_size=2",
                                          "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                                          "actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"};
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
        const char *args[] = {"async_training.require_batches=2", "data.train_batch_size=0", layouts[i]};
        if (async_config(&c, args, 3, &err) != 0)
            fail_msg("%s with fully-async training: '%s'", layouts[i], err.msg);
        config_free(&c);
    }
    /* total_rollout_steps is fully-async's */
    const char *tr[] = {"rollout.total_rollout_steps=100"};
    assert_int_equal(async_config(&c, tr, 1, &err), -1);
    assert_non_null(strstr(err.msg, "counts the prompts of fully-async training"));
    config_free(&c);
}

static void test_validate_relations(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err;
    assert_int_equal(config_apply_override(&c, "data.train_batch_size=6", &err), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.ppo_mini_batch_size=4", &err), 0);
    assert_int_equal(config_validate(&c, &err), -1);
    assert_non_null(strstr(err.msg, "multiple of actor_rollout_ref.actor.ppo_mini_batch_size"));
    config_free(&c);
}

/* config_validate on the defaults plus one override: rc, and the error must contain each needle. */
static void expect_validate(const char *override, int want_rc, const char *needle1, const char *needle2)
{
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err = {{0}};
    if (config_apply_override(&c, override, &err) != 0)
        fail_msg("%s: %s", override, err.msg);
    int rc = config_validate(&c, &err);
    if (rc != want_rc)
        fail_msg("%s: config_validate gave %d, expected %d (%s)", override, rc, want_rc, rc ? err.msg : "");
    if (rc && needle1 && !strstr(err.msg, needle1))
        fail_msg("%s: error '%s' lacks '%s'", override, err.msg, needle1);
    if (rc && needle2 && !strstr(err.msg, needle2))
        fail_msg("%s: error '%s' lacks '%s'", override, err.msg, needle2);
    config_free(&c);
}

/* the learning-rate schedule's keys: Megatron's checks, and one floor */
static void test_validate_schedule(void **state)
{
    (void)state;
    expect_validate("actor_rollout_ref.actor.optim.min_lr=1e-7", 0, NULL, NULL);
    expect_validate("actor_rollout_ref.actor.optim.min_lr=1", -1, "actor_rollout_ref.actor.optim.min_lr = 1 exceeds",
                    "actor_rollout_ref.actor.optim.lr (");
    expect_validate("actor_rollout_ref.actor.optim.lr_warmup_init=0.5", -1,
                    "actor_rollout_ref.actor.optim.lr_warmup_init = 0.5 exceeds", NULL);
    expect_validate("actor_rollout_ref.actor.optim.lr_decay_style=WSD", -1,
                    "the WSD schedule needs actor_rollout_ref.actor.optim.lr_wsd_decay_steps", NULL);
    expect_validate("actor_rollout_ref.actor.optim.lr_decay_style=inverse-square-root", 0, NULL, NULL);
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err = {{0}};
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.optim.min_lr=1e-7", &err), 0);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.optim.min_lr_ratio=0.1", &err), 0);
    assert_int_equal(config_validate(&c, &err), -1);
    assert_non_null(strstr(err.msg, "both set the schedule's floor"));
    assert_non_null(strstr(err.msg, "give one"));
    config_free(&c);
}

/* Hydra's --config-name as verl's scripts give it: verl's trainer configs, the fully-async one, any other refused */
static void test_hydra_config_name(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err = {{0}};
    assert_int_equal(config_hydra_option(&c, "--config-name", "ppo_megatron_trainer.yaml", &err), 0);
    assert_false(c.async_enable);
    assert_int_equal(config_hydra_option(&c, "--config-path", "config", &err), 0);
    assert_int_equal(config_hydra_option(&c, "--config-name", "fully_async_ppo_megatron_trainer.yaml", &err), 0);
    assert_true(c.async_enable);
    config_free(&c);
    /* the DAPO recipe's: its defaults, which the overrides after it change */
    config_init(&c);
    assert_int_equal(config_hydra_option(&c, "--config-name", "dapo_megatron_trainer", &err), 0);
    assert_string_equal(c.trainer_project_name, "verl-dapo");
    assert_int_equal(c.alg_filter_groups_max_num_gen_batches, 0);
    assert_int_equal(config_apply_override(&c, "trainer.project_name=mine", &err), 0);
    assert_string_equal(c.trainer_project_name, "mine");
    assert_int_equal(config_hydra_option(&c, "--config-name", "fully_async_dapo_trainer.yaml", &err), -1);
    assert_non_null(strstr(err.msg, "--config-name=fully_async_dapo_trainer.yaml: a Hydra config other than"));
    assert_non_null(strstr(err.msg, "not available"));
    config_free(&c);
}

/* issue 12: a run name is one directory under trainer.default_local_dir, never a way out of it */
static void test_validate_run_names(void **state)
{
    (void)state;
    expect_validate("trainer.experiment_name=../../x", -1, "trainer.experiment_name", "'../../x'");
    expect_validate("trainer.project_name=../../x", -1, "trainer.project_name", "path separator");
    expect_validate("trainer.experiment_name=..", -1, "trainer.experiment_name", "'..'");
    expect_validate("trainer.project_name=.", -1, "trainer.project_name", NULL);
    expect_validate("trainer.experiment_name=", -1, "trainer.experiment_name", "empty");
    expect_validate("trainer.experiment_name=a/b", -1, "command line", "trainer.experiment_name");
    expect_validate("trainer.experiment_name=/abs", -1, "trainer.experiment_name", NULL);
    expect_validate("trainer.experiment_name=a\\b", -1, "trainer.experiment_name", NULL);
    expect_validate("trainer.experiment_name=run 1: v1..2", 0, NULL, NULL);
    expect_validate("trainer.project_name=my-project_2", 0, NULL, NULL);
}

/* issue 12: values the documentation does not give a meaning are errors naming the key */
static void test_validate_meaningless_values(void **state)
{
    (void)state;
    expect_validate("trainer.total_training_steps=0", -1, "trainer.total_training_steps", "-1");
    expect_validate("trainer.total_training_steps=-1", 0, NULL, NULL);
    /* test.block_at=dp_barrier's mismatch is a hang only with blocking collectives */
    expect_validate("test.block_at=dp_barrier", -1, "test.block_at=dp_barrier needs actor_rollout_ref.nccl_timeout=0",
                    "it is 600");
    expect_validate("test.block_at=trainers_barrier", 0, NULL, NULL);
    expect_validate("trainer.total_training_steps=1", 0, NULL, NULL);
    expect_validate("actor_rollout_ref.actor.clip_ratio_c=1", -1, "actor_rollout_ref.actor.clip_ratio_c",
                    "greater than 1");
    expect_validate("actor_rollout_ref.actor.clip_ratio_c=1.0001", 0, NULL, NULL);
    /* the new key: documented default, and like the other operational keys left out of the digest */
    struct grpo_config c, d;
    config_init(&c);
    config_init(&d);
    assert_int_equal(c.trainer_max_consecutive_skipped_steps, 5);
    struct cfg_error err;
    assert_int_equal(config_apply_override(&d, "trainer.max_consecutive_skipped_steps=0", &err), 0);
    assert_true(config_digest(&c) == config_digest(&d));
    assert_int_equal(config_apply_override(&d, "trainer.max_consecutive_skipped_steps=-1", &err), -1);
    config_free(&c);
    config_free(&d);
}

/* config_from_args on a copy of args (NULL-terminated); stdout (what --print-config prints) is discarded. */
static int from_args(const char *const *args, int *argc_out)
{
    char *argv[16];
    int argc = 0;
    for (; args[argc]; argc++)
        argv[argc] = (char *)args[argc];
    argv[argc] = NULL;
    fflush(stdout);
    int saved = dup(1), null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    struct grpo_config c;
    config_init(&c);
    int rc = config_from_args(&c, &argc, argv);
    config_free(&c);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(null);
    if (argc_out)
        *argc_out = argc;
    return rc;
}

/* issue 12: --print-config (and --config-reference) end the program, so a stray word must not pass unnoticed */
static void test_print_config_stray_argument(void **state)
{
    (void)state;
    assert_int_equal(from_args((const char *[]){"w", "--print-config", "foo", NULL}, NULL), -1);
    assert_int_equal(from_args((const char *[]){"w", "actor_rollout_ref.rollout.n", "--print-config", NULL}, NULL), -1);
    assert_int_equal(from_args((const char *[]){"w", "--config-reference", "stray", NULL}, NULL), -1);
    /* overrides and options (with their values) are fine */
    assert_int_equal(from_args((const char *[]){"w", "data.seed=3", "--print-config", NULL}, NULL), 1);
    assert_int_equal(from_args((const char *[]){"w", "--tp", "2", "--print-config", NULL}, NULL), 1);
    /* without --print-config a positional argument is left to the program */
    int argc;
    assert_int_equal(from_args((const char *[]){"w", "status", "data.seed=3", NULL}, &argc), 0);
    assert_int_equal(argc, 2);
}

static void test_suggest(void **state)
{
    (void)state;
    assert_string_equal(config_suggest("data.train_batchsize"), "data.train_batch_size");
    assert_string_equal(config_suggest("actor_rollout_ref.actor.kl_loss_coeff"),
                        "actor_rollout_ref.actor.kl_loss_coef");
    assert_null(config_suggest("completely.unrelated.thing.zzzzzzzzzz"));
}

/* docs/verl.md's table, row by row: each verl key is accepted as ours (same, mapped), accepted and noted, or
 * refused with the feature named, as the row says; and every entry of the code's verl table has a row. */
static void test_verl_table(void **state)
{
    (void)state;
    FILE *f = fopen("docs/verl.md", "r");
    if (!f)
        fail_msg("docs/verl.md missing (run from the source root)");
    char line[1024];
    bool in_table = false;
    int rows = 0, same = 0, noted = 0, refused = 0;
    bool *covered = calloc((size_t)config_verl_count(), sizeof *covered);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "## Every key", 12) == 0)
            in_table = true;
        if (!in_table || strncmp(line, "| `", 3) != 0)
            continue;
        /* | `key` | class | `value` | ... */
        char key[256], cls[32], value[256];
        char *p = line + 3, *q = strchr(p, '`');
        assert_non_null(q);
        snprintf(key, sizeof key, "%.*s", (int)(q - p), p);
        p = strchr(q, '|') + 1;
        while (*p == ' ')
            p++;
        q = strchr(p, '|');
        snprintf(cls, sizeof cls, "%.*s", (int)(q - p), p);
        for (size_t n = strlen(cls); n > 0 && cls[n - 1] == ' ';)
            cls[--n] = 0;
        p = strchr(q, '`') + 1;
        q = strchr(p, '`');
        snprintf(value, sizeof value, "%.*s", (int)(q - p), p);
        char arg[600];
        snprintf(arg, sizeof arg, "%s=%s", key, value);
        struct grpo_config c;
        config_init(&c);
        struct cfg_error err = {{0}};
        const int rc = config_apply_override(&c, arg, &err);
        if (strcmp(cls, "same") == 0 || strcmp(cls, "mapped") == 0) {
            if (rc != 0 || !(config_find(key) || config_is_map_key(key)) || c.n_noted != 0)
                fail_msg("docs/verl.md says %s is %s, but %s: %s", key, cls, arg, rc ? err.msg : "noted");
            same++;
        } else if (strcmp(cls, "noted") == 0) {
            if (rc != 0 || c.n_noted != 1 || strncmp(c.noted[0], key, strlen(key)) != 0)
                fail_msg("docs/verl.md says %s is noted, but %s: %s", key, arg, rc ? err.msg : "not noted");
            noted++;
        } else if (strcmp(cls, "not yet") == 0) {
            if (rc == 0 || !strstr(err.msg, key))
                fail_msg("docs/verl.md says %s=%s is refused, but it was accepted", key, value);
            refused++;
        } else {
            fail_msg("docs/verl.md: row of %s has class '%s' (same, mapped, noted or not yet)", key, cls);
        }
        for (int i = 0; i < config_verl_count(); i++) {
            const char *pat, *ok, *why, *feature;
            config_verl_entry(i, &pat, &ok, &why, &feature);
            const size_t n = strlen(pat);
            if (n >= 1 && pat[n - 1] == '*' ? strncmp(key, pat, n - 1) == 0 : strcmp(key, pat) == 0)
                covered[i] = true;
        }
        config_free(&c);
        rows++;
    }
    fclose(f);
    for (int i = 0; i < config_verl_count(); i++) {
        const char *pat, *ok, *why, *feature;
        config_verl_entry(i, &pat, &ok, &why, &feature);
        if (!covered[i])
            fail_msg("verl key %s is in the code's table but has no row in docs/verl.md", pat);
    }
    free(covered);
    assert_true(rows >= 150 && same > 50 && noted > 50 && refused > 15);
}

/* Every key of verl's configuration tree at a tag (tests/fixtures/verl/keys-TAG.txt, made by
 * scripts/verl_schema_keys.py) is known: ours, an alias of ours, noted, or refused with the feature named; never
 * "unknown key". A NAME.* line (a map verl's scripts fill with +NAME.key=...) is probed with a key below it. Every
 * unknown key is listed before the test fails. */
static void check_verl_schema(const char *tag, int min_keys)
{
    char path[128];
    snprintf(path, sizeof path, "tests/fixtures/verl/keys-%s.txt", tag);
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("%s missing (run from the source root)", path);
    char line[4096]; /* the header names every file read */
    int keys = 0, ours = 0, noted = 0, refused = 0, unknown = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!line[0] || line[0] == '#')
            continue;
        char name[4200];
        const size_t n = strlen(line);
        if (n > 2 && strcmp(line + n - 2, ".*") == 0)
            snprintf(name, sizeof name, "+%.*s.some_option=1", (int)(n - 2), line);
        else
            snprintf(name, sizeof name, "%s=null", line);
        struct grpo_config c;
        config_init(&c);
        struct cfg_error err = {{0}};
        const int rc = config_apply_override(&c, name, &err);
        if (rc != 0 && strstr(err.msg, "unknown key")) {
            print_message("verl %s key %s: %s\n", tag, line, err.msg);
            unknown++;
        } else if (rc != 0)
            refused++;
        else if (c.n_noted)
            noted++;
        else
            ours++;
        config_free(&c);
        keys++;
    }
    fclose(f);
    print_message("verl %s: %d keys: %d ours or aliases, %d noted, %d refused at null\n", tag, keys, ours, noted,
                  refused);
    if (unknown)
        fail_msg("verl %s: %d unknown keys (listed above)", tag, unknown);
    assert_true(keys > min_keys);
}

static void test_verl_schema_known(void **state)
{
    (void)state;
    check_verl_schema("v0.7.0", 650);
}

static void test_verl_v09_schema_known(void **state)
{
    (void)state;
    check_verl_schema("v0.9.0", 1250);
}

/* verl's current names mean our keys; its "off" values are accepted; a suggestion stays in the key's section. */
static void test_verl_aliases_and_suggestions(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err = {{0}};
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.lora.rank=32", &err), 0);
    assert_int_equal(c.arr_model_lora_rank, 32);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.model.lora.alpha=64", &err), 0);
    assert_true(c.arr_model_lora_alpha == 64);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.optim.clip_grad=0.5", &err), 0);
    assert_true(c.actor_grad_clip == 0.5);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine", &err), 0);
    assert_string_equal(c.actor_optim_warmup_style, "cosine");
    assert_int_equal(config_apply_override(&c, "reward_model.reward_kwargs.overlong_buffer_cfg.len=512", &err), 0);
    assert_int_equal(c.rm_overlong_len, 512);
    assert_int_equal(config_apply_override(&c, "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True", &err), 0);
    assert_true(c.rm_overlong_enable);
    assert_int_equal(config_apply_override(&c, "reward_model.reward_kwargs.max_resp_len=4096", &err), 0);
    assert_int_equal(c.rm_reward_kwargs_max_resp_len, 4096);
    assert_int_equal(c.n_noted, 0);
    /* validation's top-k is a key of its own (its "off", -1, included), and Hydra's _target_ markers are noted */
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.rollout.val_kwargs.top_k=-1", &err), 0);
    assert_int_equal(config_apply_override(&c, "algorithm.filter_groups._target_=x", &err), 0);
    assert_int_equal(c.n_noted, 1);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.rollout.val_kwargs.top_k=20", &err), 0);
    assert_int_equal(c.rollout_val_top_k, 20);
    assert_int_not_equal(
        config_apply_override(&c, "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=8", &err), 0);
    assert_non_null(strstr(err.msg, "tensor parallelism inside each expert"));
    config_free(&c);
    /* suggestions: the same section, or none */
    assert_string_equal(config_suggest("data.gen_batch_sise"), "data.gen_batch_size");
    assert_string_equal(config_suggest("actor_rollout_ref.rolout.n"), "actor_rollout_ref.rollout.n");
    assert_null(config_suggest("actor_rollout_ref.actor.megatron.use_mbridgee"));
    assert_null(config_suggest("actor_rollout_ref.actor.optim.clip_gradd"));
    assert_null(config_suggest("data.gen_size"));
}

/* clip_ratio is verl's fallback for clip_ratio_low/high; total_epochs decides the steps when total_training_steps
 * is not given (verl's null); given both, total_training_steps wins, as in verl. */
static void test_verl_fallbacks(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err = {{0}};
    assert_true(config_clip_low(&c) == 0.2 && config_clip_high(&c) == 0.2);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.clip_ratio=0.3", &err), 0);
    assert_true(config_clip_low(&c) == 0.3 && config_clip_high(&c) == 0.3);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.clip_ratio_high=0.28", &err), 0);
    assert_true(config_clip_low(&c) == 0.3 && config_clip_high(&c) == 0.28);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.clip_ratio_high=null", &err), 0);
    assert_true(config_clip_high(&c) == 0.3);
    /* steps: the demo's 40 by default; total_epochs given: epochs x prompts / batch */
    assert_int_equal(config_total_steps(&c, 100), 40);
    assert_int_equal(config_apply_override(&c, "trainer.total_epochs=3", &err), 0);
    assert_int_equal(config_apply_override(&c, "data.train_batch_size=8", &err), 0);
    assert_int_equal(config_total_steps(&c, 100), 3 * (100 / 8));
    assert_int_equal(config_apply_override(&c, "trainer.total_training_steps=null", &err), 0);
    assert_int_equal(config_total_steps(&c, 100), 36);
    assert_int_equal(config_apply_override(&c, "trainer.total_training_steps=5", &err), 0);
    assert_int_equal(config_total_steps(&c, 100), 5);
    assert_int_equal(config_apply_override(&c, "trainer.total_training_steps=-1", &err), 0);
    assert_int_equal(config_total_steps(&c, 100), 36);
    /* DAPO: gen_batch_size equal to the batch (or unset) runs; another size without dynamic sampling is the step's
     * batch, as verl's trainers train each round whole (train_batch_size takes it, saying why) */
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.actor.ppo_mini_batch_size=8", &err), 0);
    assert_int_equal(config_apply_override(&c, "data.gen_batch_size=8", &err), 0);
    assert_int_equal(config_validate(&c, &err), 0);
    assert_int_equal(config_apply_override(&c, "data.gen_batch_size=24", &err), 0);
    assert_int_equal(config_resolve(&c, &err), 0);
    assert_int_equal(config_validate(&c, &err), 0);
    assert_int_equal(c.data_train_batch_size, 24);
    assert_non_null(
        strstr(c.origin[config_find("data.train_batch_size") - config_key(0)], "verl trains each round whole"));
    /* with dynamic sampling the rounds fill the batch; not with a supervised warm-start */
    assert_int_equal(config_apply_override(&c, "data.train_batch_size=8", &err), 0);
    assert_int_equal(config_apply_override(&c, "algorithm.filter_groups.enable=true", &err), 0);
    assert_int_equal(config_resolve(&c, &err), 0);
    assert_int_equal(c.data_train_batch_size, 8);
    assert_int_equal(config_validate(&c, &err), 0);
    assert_int_equal(config_apply_override(&c, "trainer.sft_warmup_steps=1", &err), 0);
    assert_int_not_equal(config_validate(&c, &err), 0);
    assert_non_null(strstr(err.msg, "data.gen_batch_size=24"));
    assert_non_null(strstr(err.msg, "supervised warm-start"));
    config_free(&c);
}

/* Hydra's override forms and the start-up list of noted keys. */
static void test_hydra_forms(void **state)
{
    (void)state;
    struct grpo_config c;
    config_init(&c);
    struct cfg_error err = {{0}};
    assert_int_equal(config_apply_override(&c, "+data.seed=5", &err), 0);
    assert_int_equal(c.data_seed, 5);
    assert_int_equal(config_apply_override(&c, "++data.seed=6", &err), 0);
    assert_int_equal(c.data_seed, 6);
    assert_int_equal(config_apply_override(&c, "data.truncation='left'", &err), 0);
    assert_string_equal(c.data_truncation, "left");
    assert_int_equal(config_apply_override(&c, "data.truncation=\"right\"", &err), 0);
    assert_string_equal(c.data_truncation, "right");
    assert_int_equal(config_apply_override(&c, "~data.seed=", &err), 0); /* back to the default */
    assert_int_equal(c.data_seed, 1);
    assert_int_equal(config_apply_override(&c, "data.truncation=null", &err), 0);
    assert_string_equal(c.data_truncation, "error");
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.rollout.name=vllm", &err), 0);
    assert_int_equal(c.n_noted, 1);
    assert_int_equal(config_apply_override(&c, "~actor_rollout_ref.rollout.name=", &err), 0);
    assert_int_equal(c.n_noted, 0);
    assert_int_not_equal(config_apply_override(&c, "~data.sed=", &err), 0);
    assert_non_null(strstr(err.msg, "did you mean 'data.seed'"));
    /* a misspelt verl key is still an error with a suggestion */
    assert_int_not_equal(config_apply_override(&c, "data.trian_files=x", &err), 0);
    assert_non_null(strstr(err.msg, "did you mean 'data.train_files'"));
    /* trainer.logger: verl's list forms; remote sinks skipped, unknown ones refused */
    unsigned sinks;
    char skipped[128];
    assert_int_equal(config_apply_override(&c, "trainer.logger=['console','wandb']", &err), 0);
    assert_int_equal(config_logger_sinks(&c, &sinks, skipped, sizeof skipped, &err), 0);
    assert_int_equal(sinks, CFG_LOG_CONSOLE);
    assert_string_equal(skipped, "wandb");
    assert_int_equal(config_apply_override(&c, "trainer.logger=[console,tensorboard,mlflow]", &err), 0);
    assert_int_equal(config_logger_sinks(&c, &sinks, skipped, sizeof skipped, &err), 0);
    assert_int_equal(sinks, CFG_LOG_CONSOLE | CFG_LOG_TENSORBOARD);
    assert_string_equal(skipped, "mlflow");
    assert_int_equal(config_apply_override(&c, "trainer.logger=console", &err), 0);
    assert_int_equal(config_logger_sinks(&c, &sinks, NULL, 0, &err), 0);
    assert_int_equal(sinks, CFG_LOG_CONSOLE);
    assert_int_equal(config_apply_override(&c, "trainer.logger=[console,neptune]", &err), 0);
    assert_int_not_equal(config_validate(&c, &err), 0);
    assert_non_null(strstr(err.msg, "trainer.logger: unknown sink 'neptune'"));
    config_free(&c);
    /* the rollout's copies of the lengths must agree with data's */
    config_init(&c);
    assert_int_equal(config_apply_override(&c, "actor_rollout_ref.rollout.response_length=99", &err), 0);
    assert_int_not_equal(config_validate(&c, &err), 0);
    assert_non_null(strstr(err.msg, "differs from data.max_response_length"));
    config_free(&c);
    /* a verl YAML: noted keys nested under their sections, a refused one named */
    char path[] = "/tmp/grpo-verl-yaml-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *y = fdopen(fd, "w");
    fputs("actor_rollout_ref:\n  actor:\n    fsdp_config:\n      param_offload: false\n      wrap_policy:\n"
          "        min_num_params: 0\n  rollout:\n    name: vllm\n    engine_kwargs:\n      vllm:\n"
          "        swap_space: null\ndata:\n  truncation: left\n",
          y);
    fclose(y);
    config_init(&c);
    assert_int_equal(config_load_yaml(&c, path, &err), 0);
    assert_int_equal(c.n_noted, 4);
    assert_string_equal(c.data_truncation, "left");
    config_free(&c);
    y = fopen(path, "w");
    fputs("actor_rollout_ref:\n  rollout:\n    agent:\n      agent_loop_config_path: /tmp/loops.yaml\n", y);
    fclose(y);
    config_init(&c);
    assert_int_not_equal(config_load_yaml(&c, path, &err), 0);
    assert_non_null(
        strstr(err.msg, ":4: actor_rollout_ref.rollout.agent.agent_loop_config_path=/tmp/loops.yaml: agent loops"));
    config_free(&c);
    unlink(path);
}

/* docs/configuration.md is generated from the key table; it must not drift. */
static void test_reference_doc_is_current(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    config_print_reference(mem);
    fclose(mem);
    FILE *f = fopen("docs/configuration.md", "rb");
    if (!f)
        fail_msg("docs/configuration.md missing (run from the source root)");
    char *doc = calloc(1, len + 2);
    size_t got = fread(doc, 1, len + 1, f);
    fclose(f);
    if (got != len || memcmp(doc, buf, len) != 0)
        fail_msg("docs/configuration.md is out of date: regenerate with "
                 "`build/worker/grpo-worker --config-reference > docs/configuration.md`");
    free(doc);
    free(buf);
}

/* The run's configuration as text (what ranks send grpod): it reads back to the same digest, strings with line
 * breaks and backslashes included; a key set from it keeps its own origin; garbled text is refused by line;
 * the comparison names the keys and both values, a few, then "and N more". */
static void test_run_text(void **state)
{
    (void)state;
    struct grpo_config a, b;
    struct cfg_error err;
    config_init(&a);
    config_init(&b);
    assert_int_equal(config_set(&a, "data.train_batch_size", "16", "command line", &err), 0);
    assert_int_equal(config_set(&a, "trainer.experiment_name", "two\nlines \\ and = sign", "command line", &err), 0);
    assert_int_equal(config_set(&a, "grpod.endpoint", "ipc:///tmp/x.sock", "command line", &err), 0);
    char *text = config_run_text(&a, 0), why[512];
    assert_null(strstr(text, "grpod.endpoint")); /* how to reach grpod is no part of the run */
    assert_non_null(strstr(text, "trainer.experiment_name=two\\nlines \\\\ and = sign\n"));
    assert_int_equal(config_apply_run_text(&b, text, 1 << 20, "test", why, sizeof why), 0);
    assert_true(config_digest(&a) == config_digest(&b));
    assert_string_equal(b.trainer_experiment_name, "two\nlines \\ and = sign");
    assert_string_not_equal(b.grpod_endpoint, "ipc:///tmp/x.sock"); /* grpod.* stays this process's */
    char *given = config_run_text(&a, CONFIG_TEXT_GIVEN);
    assert_non_null(strstr(given, "data.train_batch_size=16\n"));
    assert_null(strstr(given, "data.max_prompt_length"));
    /* the comparison */
    char diff[1024];
    assert_int_equal(config_text_diff(text, "run", text, "rank 1", false, 3, diff, sizeof diff), 0);
    assert_int_equal(config_set(&b, "data.train_batch_size", "32", "command line", &err), 0);
    char *other = config_run_text(&b, 0);
    assert_int_equal(config_text_diff(text, "run", other, "rank 1", false, 3, diff, sizeof diff), 1);
    assert_string_equal(diff, "data.train_batch_size (run: 16, rank 1: 32)");
    const char *keys[] = {"data.max_prompt_length", "data.max_response_length", "trainer.total_epochs",
                          "actor_rollout_ref.rollout.n"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(config_set(&b, keys[i], "3", "command line", &err), 0);
    free(other);
    other = config_run_text(&b, 0);
    assert_int_equal(config_text_diff(text, "run", other, "rank 1", false, 3, diff, sizeof diff), 5);
    assert_non_null(strstr(diff, " and 2 more"));
    /* only a's keys: the keys grpod was given */
    assert_int_equal(
        config_text_diff("data.train_batch_size=16\n", "grpod", other, "rank 1", true, 3, diff, sizeof diff), 1);
    assert_int_equal(
        config_text_diff("data.train_batch_size=32\n", "grpod", other, "rank 1", true, 3, diff, sizeof diff), 0);
    /* garbled text, refused by line */
    assert_int_equal(
        config_apply_run_text(&b, "data.train_batch_size=8\nhello\n", 1 << 20, "rank 2's", why, sizeof why), -1);
    assert_non_null(strstr(why, "rank 2's, line 2: not name=value"));
    assert_int_equal(config_apply_run_text(&b, "grpod.endpoint=x\n", 1 << 20, "t", why, sizeof why), -1);
    assert_non_null(strstr(why, "'grpod.endpoint' is not a key that shapes the run"));
    assert_int_equal(config_apply_run_text(&b, "data.train_batch_size=many\n", 1 << 20, "t", why, sizeof why), -1);
    assert_non_null(strstr(why, "expects an integer"));
    assert_int_equal(config_apply_run_text(&b, "trainer.experiment_name=a\\q\n", 1 << 20, "t", why, sizeof why), -1);
    assert_non_null(strstr(why, "bad escape"));
    assert_int_equal(config_apply_run_text(&b, text, 100, "t", why, sizeof why), -1);
    assert_non_null(strstr(why, "longer than 100 bytes"));
    free(text);
    free(given);
    free(other);
    config_free(&a);
    config_free(&b);
}

/* data.apply_chat_template_kwargs: verl's nested map in YAML, one variable at a time on the command line, or a
 * JSON object whole; values typed as YAML reads them; --print-config's text reads back to the same value; a
 * value that is not an object, or a nested name, is refused naming the key. */
static void test_chat_template_kwargs(void **state)
{
    (void)state;
    struct grpo_config c;
    struct cfg_error err;
    config_init(&c);
    assert_string_equal(c.data_apply_chat_template_kwargs, "{}");
    assert_int_equal(load_text(&c,
                               "data:\n  apply_chat_template_kwargs:\n    enable_thinking: false\n"
                               "    date_string: 26 Jul 2024\n    n: 3\n    f: 0.5\n    z: null\n",
                               &err, NULL),
                     0);
    assert_string_equal(c.data_apply_chat_template_kwargs,
                        "{\"enable_thinking\":false,\"date_string\":\"26 Jul 2024\",\"n\":3,\"f\":0.5,\"z\":null}");
    /* the command line adds to it, and overrides one */
    assert_int_equal(config_set(&c, "data.apply_chat_template_kwargs.enable_thinking", "true", "cli", &err), 0);
    assert_int_equal(config_set(&c, "data.apply_chat_template_kwargs.q", "it's \"x\"", "cli", &err), 0);
    assert_non_null(strstr(c.data_apply_chat_template_kwargs, "\"enable_thinking\":true"));
    /* printed and read back: the same object */
    char *want = strdup(c.data_apply_chat_template_kwargs);
    char path[] = "/tmp/grpo_cfg_print_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    config_print(&c, f);
    fclose(f);
    struct grpo_config d;
    config_init(&d);
    if (config_load_yaml(&d, path, &err) != 0)
        fail_msg("%s", err.msg);
    assert_string_equal(d.data_apply_chat_template_kwargs, want);
    unlink(path);
    free(want);
    config_free(&d);
    /* whole, as JSON; an empty map in YAML is the default */
    assert_int_equal(config_set(&c, "data.apply_chat_template_kwargs", "{\"a\": [1, 2]}", "cli", &err), 0);
    assert_string_equal(c.data_apply_chat_template_kwargs, "{\"a\":[1,2]}");
    config_free(&c);
    config_init(&c);
    assert_int_equal(load_text(&c, "data:\n  apply_chat_template_kwargs: {}\n", &err, NULL), 0);
    assert_string_equal(c.data_apply_chat_template_kwargs, "{}");
    /* refusals */
    assert_int_equal(config_set(&c, "data.apply_chat_template_kwargs", "[1]", "cli", &err), -1);
    assert_non_null(strstr(err.msg, "data.apply_chat_template_kwargs=[1]: expects a JSON object"));
    assert_int_equal(config_set(&c, "data.apply_chat_template_kwargs.a.b", "1", "cli", &err), -1);
    assert_non_null(strstr(err.msg, "a chat template variable is one name"));
    assert_int_equal(load_text(&c, "data:\n  apply_chat_template_kwargs:\n    a: {b: 1}\n", &err, NULL), -1);
    assert_non_null(strstr(err.msg, "data.apply_chat_template_kwargs.a.b"));
    config_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_every_default_parses_and_has_help),
        cmocka_unit_test(test_yaml_nested_and_origin),
        cmocka_unit_test(test_yaml_errors),
        cmocka_unit_test(test_missing_and_empty_file),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_validate_relations),
        cmocka_unit_test(test_validate_schedule),
        cmocka_unit_test(test_hydra_config_name),
        cmocka_unit_test(test_fully_async_keys),
        cmocka_unit_test(test_validate_run_names),
        cmocka_unit_test(test_validate_meaningless_values),
        cmocka_unit_test(test_print_config_stray_argument),
        cmocka_unit_test(test_suggest),
        cmocka_unit_test(test_reference_doc_is_current),
        cmocka_unit_test(test_verl_table),
        cmocka_unit_test(test_verl_schema_known),
        cmocka_unit_test(test_verl_v09_schema_known),
        cmocka_unit_test(test_verl_aliases_and_suggestions),
        cmocka_unit_test(test_verl_fallbacks),
        cmocka_unit_test(test_hydra_forms),
        cmocka_unit_test(test_run_text),
        cmocka_unit_test(test_chat_template_kwargs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
