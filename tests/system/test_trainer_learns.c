/* End to end on a tiny model: a short supervised warm-start on single-digit sums, then GRPO, and the
 * validation reward (greedy) must rise by a clear margin during GRPO. The prompts of the validation file
 * are the task's 100 sums themselves: a 0.3 M-parameter model memorises them but cannot learn addition
 * well enough in a few minutes to generalise to unseen sums, and what this test checks is that GRPO
 * improves the policy, not that the tiny model generalises. */
#include <jansson.h>
#include <stdint.h>

#include "tiny_run.h"
#include "worker/trainer/trainer.h"

#define SFT_STEPS 100
#define GRPO_STEPS 40

/* val-core/arithmetic/reward/mean@1 at each step it was measured (-1 where not) */
static int read_val(const char *path, double *val, int max_step)
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

int main(void)
{
    char root[] = "/tmp/grpo_learns_XXXXXX", model[1100], data[1100];
    if (!mkdtemp(root))
        return 1;
    snprintf(model, sizeof model, "%s/tiny", root);
    snprintf(data, sizeof data, "%s/sums.jsonl", root);
    if (tiny_model_write_sized(model, 4, 0.05, 128) != 0)
        return 1;
    FILE *f = fopen(data, "w");
    for (int a = 0; a < 10; a++)
        for (int b = 0; b < 10; b++)
            fprintf(f,
                    "{\"prompt\": \"What is %d + %d? Answer with just the number, written after ####, like this: "
                    "#### <number>\", \"ground_truth\": \"%d\", \"data_source\": \"arithmetic\"}\n",
                    a, b, a + b);
    fclose(f);
    char mp[1200], rd[1200], tf[1200], vf[1200], sft[64], steps[64];
    snprintf(mp, sizeof mp, "actor_rollout_ref.model.path=%s", model);
    snprintf(rd, sizeof rd, "trainer.default_local_dir=%s/runs", root);
    snprintf(tf, sizeof tf, "data.train_files=%s", data);
    snprintf(vf, sizeof vf, "data.val_files=%s", data);
    snprintf(sft, sizeof sft, "trainer.sft_warmup_steps=%d", SFT_STEPS);
    snprintf(steps, sizeof steps, "trainer.total_training_steps=%d", GRPO_STEPS);
    const char *ov[] = {mp,
                        rd,
                        tf,
                        vf,
                        sft,
                        steps,
                        "trainer.test_freq=20",
                        "data.train_batch_size=16",
                        "data.val_batch_size=100",
                        "data.max_response_length=10",
                        "actor_rollout_ref.rollout.n=8",
                        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
                        "actor_rollout_ref.actor.optim.lr=3e-4",
                        "trainer.sft_warmup_lr=1e-3"};
    struct grpo_config cfg;
    tiny_config(&cfg, ov, (int)(sizeof ov / sizeof *ov));
    char err[2048];
    struct trainer *t = trainer_create(&cfg, NULL, err, sizeof err);
    if (!t) {
        fprintf(stderr, "trainer_create: %s\n", err);
        return 1;
    }
    int rc = trainer_run(t);
    char metrics[1300];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", trainer_run_dir(t));
    trainer_free(t);
    config_free(&cfg);
    const int last = SFT_STEPS + GRPO_STEPS;
    double val[SFT_STEPS + GRPO_STEPS + 1];
    for (int i = 0; i <= last; i++)
        val[i] = -1;
    if (rc != 0 || read_val(metrics, val, last) != 0) {
        fprintf(stderr, "FAIL: training failed or %s unreadable\n", metrics);
        return 1;
    }
    printf("validation reward: before %.3f, after the warm-start %.3f, after GRPO %.3f\n", val[0], val[SFT_STEPS],
           val[last]);
    int fails = 0;
    if (!(val[SFT_STEPS] > val[0])) {
        fprintf(stderr, "FAIL: the warm-start did not raise the validation reward\n");
        fails++;
    }
    if (!(val[last] >= val[SFT_STEPS] + 0.10)) {
        fprintf(stderr, "FAIL: GRPO raised the validation reward by %.3f (< 0.10)\n", val[last] - val[SFT_STEPS]);
        fails++;
    }
    snprintf(metrics, sizeof metrics, "rm -rf '%s'", root);
    if (system(metrics) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return fails ? 1 : 0;
}
