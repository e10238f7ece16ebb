/* GRPO with LoRA learns the tiny task. A full-parameter supervised warm-start (as test_trainer_learns) makes the
 * base model; a second run trains a LoRA adapter on it with GRPO (base frozen, reference = the base), and the
 * validation reward (greedy, the 100 sums) must rise by a clear margin. The run's checkpoint must hold the adapter
 * alone in PEFT's layout, and the base must be untouched. */
#include <stdint.h>
#include <sys/stat.h>

#include "tiny_run.h"
#include "worker/model/lora.h"
#include "worker/hybrid/hybrid_source.h"
#include "worker/trainer/trainer.h"

#define SFT_STEPS 100
#define GRPO_STEPS 30

/* Run a trainer on the overrides; metrics.jsonl's path into metrics. 0 or -1. */
static int run(const char *const *ov, int n, char *metrics, size_t len)
{
    struct grpo_config cfg;
    tiny_config(&cfg, ov, n);
    char err[2048];
    struct trainer *t = local_trainer_create(&cfg, NULL, err, sizeof err);
    if (!t) {
        fprintf(stderr, "trainer_create: %s\n", err);
        config_free(&cfg);
        return -1;
    }
    int rc = trainer_run(t);
    snprintf(metrics, len, "%s/metrics.jsonl", trainer_run_dir(t));
    trainer_free(t);
    config_free(&cfg);
    return rc;
}

static int exists(const char *dir, const char *file)
{
    char p[2400];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    struct stat st;
    return stat(p, &st) == 0;
}

int main(void)
{
    struct sums_task task = {.root = ""};
    if (sums_task_make(&task, "grpo_lora_learns") != 0)
        return 1;
    const char *root = task.root, *model = task.model, *rd = task.rd, *tf = task.tf, *vf = task.vf;
    char *mp = task.mp, base[1200], sft[64], cmd[4000], metrics[1300];
    snprintf(sft, sizeof sft, "trainer.sft_warmup_steps=%d", SFT_STEPS);
    /* 1. the base: the supervised warm-start (and one GRPO step), full parameters; RUN/reference is the model
     * after the warm-start, which becomes the base of the LoRA run */
    const char *warm[] = {mp,
                          rd,
                          tf,
                          vf,
                          sft,
                          "trainer.total_training_steps=1",
                          "trainer.experiment_name=base",
                          "trainer.test_freq=-1",
                          "trainer.val_before_train=false",
                          SUMS_TASK_SHAPE,
                          "trainer.sft_warmup_lr=1e-3"};
    if (run(warm, (int)(sizeof warm / sizeof *warm), metrics, sizeof metrics) != 0)
        return 1;
    snprintf(base, sizeof base, "%s/runs/grpo/base/reference", root);
    snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/'", model, model, base);
    if (system(cmd) != 0)
        return 1;
    /* 2. GRPO with LoRA on that base */
    snprintf(mp, sizeof task.mp, "actor_rollout_ref.model.path=%s", base);
    const char *lora[] = {mp,
                          rd,
                          tf,
                          vf,
                          "trainer.total_training_steps=30",
                          "trainer.experiment_name=lora",
                          "trainer.test_freq=30",
                          SUMS_TASK_SHAPE,
                          "data.val_batch_size=100",
                          "actor_rollout_ref.actor.use_kl_loss=true",
                          "actor_rollout_ref.actor.kl_loss_coef=0.001",
                          "actor_rollout_ref.model.lora_rank=8",
                          "actor_rollout_ref.model.lora_alpha=16",
                          "actor_rollout_ref.model.target_modules=all-linear",
                          "actor_rollout_ref.actor.optim.lr=3e-3"};
    if (run(lora, (int)(sizeof lora / sizeof *lora), metrics, sizeof metrics) != 0)
        return 1;
    double val[GRPO_STEPS + 1];
    for (int i = 0; i <= GRPO_STEPS; i++)
        val[i] = -1;
    if (read_val(metrics, val, GRPO_STEPS) != 0) {
        fprintf(stderr, "FAIL: %s unreadable\n", metrics);
        return 1;
    }
    printf("validation reward with LoRA: before %.3f, after GRPO %.3f\n", val[0], val[GRPO_STEPS]);
    int fails = 0;
    if (!(val[0] >= 0 && val[GRPO_STEPS] >= val[0] + 0.10)) {
        fprintf(stderr, "FAIL: GRPO with LoRA raised the validation reward by %.3f (< 0.10)\n",
                val[GRPO_STEPS] - val[0]);
        fails++;
    }
    char ck[1400];
    snprintf(ck, sizeof ck, "%s/runs/grpo/lora/checkpoints/global_step_%d/actor", root, GRPO_STEPS);
    if (!exists(ck, "adapter_config.json") || !exists(ck, "adapter_model.safetensors") ||
        exists(ck, "model.safetensors")) {
        fprintf(stderr, "FAIL: %s should hold the adapter alone (PEFT's layout)\n", ck);
        fails++;
    }
    /* the adapter loads onto the base, which the run left as it was */
    char err[1024];
    struct model *m = model_load(base, err, sizeof err);
    if (!m || lora_load(m, ck, err, sizeof err) != 0) {
        fprintf(stderr, "FAIL: %s\n", err);
        fails++;
    }
    model_free(m);
    if (test_rm_rf(root) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return fails ? 1 : 0;
}
