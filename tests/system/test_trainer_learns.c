/* End to end on a tiny model: a short supervised warm-start on single-digit sums, then GRPO, and the
 * validation reward (greedy) must rise by a clear margin during GRPO. The prompts of the validation file
 * are the task's 100 sums themselves: a 0.3 M-parameter model memorises them but cannot learn addition
 * well enough in a few minutes to generalise to unseen sums, and what this test checks is that GRPO
 * improves the policy, not that the tiny model generalises. */
#include <stdint.h>

#include "tiny_run.h"
#include "worker/hybrid/hybrid_source.h"
#include "worker/trainer/trainer.h"

#define SFT_STEPS 100
#define GRPO_STEPS 40

int main(void)
{
    struct sums_task task = {.root = ""};
    if (sums_task_make(&task, "grpo_learns") != 0)
        return 1;
    const char *root = task.root, *mp = task.mp, *rd = task.rd, *tf = task.tf, *vf = task.vf;
    char sft[64], steps[64];
    snprintf(sft, sizeof sft, "trainer.sft_warmup_steps=%d", SFT_STEPS);
    snprintf(steps, sizeof steps, "trainer.total_training_steps=%d", GRPO_STEPS);
    const char *ov[] = {mp,
                        rd,
                        tf,
                        vf,
                        sft,
                        steps,
                        "trainer.test_freq=20",
                        SUMS_TASK_SHAPE,
                        "data.val_batch_size=100",
                        "actor_rollout_ref.actor.optim.lr=3e-4",
                        "trainer.sft_warmup_lr=1e-3"};
    struct grpo_config cfg;
    tiny_config(&cfg, ov, (int)(sizeof ov / sizeof *ov));
    char err[2048];
    struct trainer *t = local_trainer_create(&cfg, NULL, err, sizeof err);
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
    if (test_rm_rf(root) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return fails ? 1 : 0;
}
