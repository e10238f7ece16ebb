/* Exact resume: a run stopped at step 2 (checkpointed through the stop request
 * at a safe point) and resumed to step 4 ends with weights bit-identical to an
 * uninterrupted run to step 4. Exercises dynamic batching, several mini-batches
 * per step, the KL loss and AdamW state across the checkpoint. */
#include <stdbool.h>
#include <stdint.h>

#include "tiny_run.h"
#include "worker/hybrid/hybrid_source.h"
#include "worker/trainer/trainer.h"

static int stop_at_2(void *ctx, int64_t step)
{
    (void)ctx;
    return step == 2 ? TRAINER_STOP : TRAINER_CONTINUE;
}

/* With lora, a LoRA adapter (rank 4, q/v/down) is trained and its parameters are returned. */
static float *run(const char *root, const char *model, const char *run_dir, const struct trainer_hooks *hooks,
                  size_t *n, int64_t *step, bool lora)
{
    char mp[2048], rd[2048], ro[2048], proj[64] = "trainer.project_name=resume";
    snprintf(mp, sizeof mp, "actor_rollout_ref.model.path=%s", model);
    snprintf(rd, sizeof rd, "trainer.default_local_dir=%s/%s", root, run_dir);
    snprintf(ro, sizeof ro, "trainer.rollout_data_dir=%s/%s/rollouts", root, run_dir);
    const char *ov[] = {mp,
                        rd,
                        ro,
                        proj,
                        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                        "actor_rollout_ref.rollout.val_kwargs.n=2",
                        "trainer.total_training_steps=4",
                        "trainer.save_freq=2",
                        "trainer.val_before_train=false",
                        "data.train_batch_size=2",
                        "data.max_response_length=6",
                        "actor_rollout_ref.rollout.n=3",
                        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                        "actor_rollout_ref.actor.use_dynamic_bsz=true",
                        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=120",
                        "actor_rollout_ref.actor.optim.lr=1e-3",
                        "actor_rollout_ref.actor.use_kl_loss=true",
                        "actor_rollout_ref.actor.entropy_coeff=0.01",
                        "data.synthetic.num_train=64",
                        "data.synthetic.num_val=4",
                        "actor_rollout_ref.model.lora_rank=4",
                        "actor_rollout_ref.model.target_modules=[q_proj,v_proj,down_proj]"};
    struct grpo_config cfg;
    tiny_config(&cfg, ov, (int)(sizeof ov / sizeof *ov) - (lora ? 0 : 2));
    char err[2048];
    struct trainer *t = local_trainer_create(&cfg, hooks, err, sizeof err);
    if (!t) {
        fprintf(stderr, "trainer_create: %s\n", err);
        exit(1);
    }
    if (trainer_run(t) != 0) {
        fprintf(stderr, "trainer_run failed\n");
        exit(1);
    }
    const float *p = trainer_params(t, n);
    float *copy = malloc(*n * sizeof(float));
    memcpy(copy, p, *n * sizeof(float));
    *step = trainer_step(t);
    trainer_free(t);
    config_free(&cfg);
    return copy;
}

int main(void)
{
    char root[] = "/tmp/grpo_resume_XXXXXX", model[1100];
    if (!mkdtemp(root))
        return 1;
    snprintf(model, sizeof model, "%s/tiny", root);
    if (tiny_model_write(model, 7, 0.1) != 0)
        return 1;
    size_t na, nb, n0;
    int64_t sa, sb;
    float *a = run(root, model, "a", NULL, &na, &sa, false);
    struct trainer_hooks stop = {.safe_point = stop_at_2};
    float *b2 = run(root, model, "b", &stop, &nb, &sb, false);
    int fails = 0;
    if (sb != 2) {
        fprintf(stderr, "FAIL: the stopped run ended at step %lld, not 2\n", (long long)sb);
        fails++;
    }
    float *b = run(root, model, "b", NULL, &nb, &sb, false); /* resume_mode auto: from global_step_2 */
    if (sa != 4 || sb != 4 || na != nb) {
        fprintf(stderr, "FAIL: steps %lld / %lld, sizes %zu / %zu\n", (long long)sa, (long long)sb, na, nb);
        fails++;
    }
    size_t diff = 0;
    for (size_t i = 0; i < na && i < nb; i++)
        diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    if (diff) {
        fprintf(stderr, "FAIL: %zu of %zu parameters differ between the uninterrupted and the resumed run\n", diff, na);
        fails++;
    }
    /* training moved the weights (the comparison is not vacuous) */
    char err[1024];
    struct model *init = model_load(model, err, sizeof err);
    n0 = 0;
    for (size_t i = 0; init && i < na; i++)
        n0 += init->w.mem[i] != a[i];
    if (!init || n0 < na / 2) {
        fprintf(stderr, "FAIL: only %zu of %zu parameters changed in training\n", n0, na);
        fails++;
    }
    model_free(init);
    /* the resumed run's metrics.jsonl holds each step once */
    char path[1200], line[65536];
    snprintf(path, sizeof path, "%s/b/resume/demo/metrics.jsonl", root);
    FILE *f = fopen(path, "r");
    int steps[8] = {0}, lines = 0;
    while (f && fgets(line, sizeof line, f)) {
        int s;
        if (sscanf(line, "{\"step\": %d", &s) == 1 || sscanf(line, "{\"step\":%d", &s) == 1)
            if (s >= 0 && s < 8)
                steps[s]++;
        lines++;
    }
    if (f)
        fclose(f);
    for (int s = 1; s <= 4; s++)
        if (steps[s] != 1) {
            fprintf(stderr, "FAIL: metrics.jsonl of the resumed run has step %d %d times (%d lines)\n", s, steps[s],
                    lines);
            fails++;
        }
    /* sampled validation reports mean@2 and best@2; the rollout audit files carry every field */
    f = fopen(path, "r");
    bool best = false;
    while (f && fgets(line, sizeof line, f))
        best |= strstr(line, "\"val-core/arithmetic/reward/best@2\"") != NULL &&
                strstr(line, "\"val-core/arithmetic/reward/mean@2\"") != NULL;
    if (f)
        fclose(f);
    if (!best) {
        fprintf(stderr, "FAIL: metrics.jsonl lacks val-core/arithmetic/reward/mean@2 and best@2\n");
        fails++;
    }
    snprintf(path, sizeof path, "%s/b/rollouts/4.jsonl", root);
    f = fopen(path, "r");
    int rows = 0;
    static const char *const fields[] = {
        "\"prompt_ids\"", "\"response_ids\"",  "\"prompt\"",        "\"response\"",          "\"reward\"",
        "\"advantage\"",  "\"old_log_probs\"", "\"ref_log_probs\"", "\"rollout_log_probs\"", "\"ground_truth\""};
    while (f && fgets(line, sizeof line, f)) {
        rows++;
        for (size_t k = 0; k < sizeof fields / sizeof *fields; k++)
            if (!strstr(line, fields[k])) {
                fprintf(stderr, "FAIL: %s row %d lacks %s\n", path, rows, fields[k]);
                fails++;
            }
    }
    if (f)
        fclose(f);
    if (rows != 6) { /* 2 prompts x 3 responses */
        fprintf(stderr, "FAIL: %s has %d rows, expected 6\n", path, rows);
        fails++;
    }
    free(a), free(b), free(b2);
    /* the same with LoRA: the checkpoint holds the adapter and its optimizer state, and the resumed adapter is
     * bit-identical to the uninterrupted run's */
    size_t la_n, lb_n;
    int64_t la_s, lb_s;
    float *la = run(root, model, "la", NULL, &la_n, &la_s, true);
    float *lb2 = run(root, model, "lb", &stop, &lb_n, &lb_s, true);
    size_t moved = 0;
    for (size_t i = 0; i < la_n && i < lb_n; i++)
        moved += memcmp(&la[i], &lb2[i], sizeof(float)) != 0;
    float *lb = run(root, model, "lb", NULL, &lb_n, &lb_s, true);
    size_t ldiff = 0;
    for (size_t i = 0; i < la_n && i < lb_n; i++)
        ldiff += memcmp(&la[i], &lb[i], sizeof(float)) != 0;
    if (la_s != 4 || lb_s != 4 || la_n != lb_n || ldiff || moved < la_n / 4) {
        fprintf(stderr,
                "FAIL: LoRA: steps %lld / %lld, adapter sizes %zu / %zu, %zu values differ after the resume, %zu "
                "moved in steps 3-4\n",
                (long long)la_s, (long long)lb_s, la_n, lb_n, ldiff, moved);
        fails++;
    }
    free(la), free(lb), free(lb2);
    if (test_rm_rf(root) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    printf("%s: resumed run %s the uninterrupted one (%zu parameters)\n", fails ? "FAIL" : "ok",
           diff ? "differs from" : "is bit-identical to", na);
    return fails ? 1 : 0;
}
