/* Writes a small run into RUN_DIR through the metrics logger, for
 * test_tensorboard.sh to read back with TensorBoard's own reader:
 *
 *   run A (fresh):            step 0 (validation only), steps 1..5, validation with step 5
 *   run B (resumed after 3):  steps 4..6, validation with step 6
 *
 * Training values: critic/score/mean = base + 0.25 s (base 0 in run A, 10 in run B),
 * actor/kl_loss = 0.001 s (NaN at step 2), actor/entropy = 2 - 0.1 s,
 * response_length/mean = 10 + s, perf/throughput = 100 s.
 * Validation: val-core/gsm8k/reward/mean@1 = 0.125 at step 0, 0.375 at 5 (A), 0.5 at 6 (B). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "worker/metrics/metrics.h"

/* One logger call per step, validation merged in when val_reward is not NaN (as verl does). */
static void train_step(struct metrics_logger *lg, long s, double base, double val_reward)
{
    struct metrics m;
    metrics_init(&m);
    double scores[4];
    for (int i = 0; i < 4; i++)
        scores[i] = base + 0.25 * (double)s + 0.1 * (i - 1.5);
    metrics_set_stats(&m, "critic/score", scores, 4); /* mean = base + 0.25 s */
    metrics_set(&m, "actor/pg_loss", -0.01 * (double)s);
    metrics_set(&m, "actor/kl_loss", s == 2 ? NAN : 0.001 * (double)s);
    metrics_set(&m, "actor/entropy", 2.0 - 0.1 * (double)s);
    metrics_set(&m, "response_length/mean", 10.0 + (double)s);
    metrics_set(&m, "perf/throughput", 100.0 * (double)s);
    metrics_set(&m, "perf/cpu_memory_used_gb", proc_rss_gb());
    metrics_set(&m, "timing_s/step", 0.5);
    if (!isnan(val_reward))
        metrics_set(&m, "val-core/gsm8k/reward/mean@1", val_reward);
    if (metrics_logger_log(lg, s, &m) != 0)
        exit(1);
    metrics_free(&m);
}

/* Validation before training: a step of its own. */
static void val_step(struct metrics_logger *lg, long s, double reward)
{
    struct metrics m;
    metrics_init(&m);
    metrics_set(&m, "val-core/gsm8k/reward/mean@1", reward);
    if (metrics_logger_log(lg, s, &m) != 0)
        exit(1);
    metrics_free(&m);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s RUN_DIR\n", argv[0]);
        return 2;
    }
    struct metrics_logger lg;
    if (metrics_logger_open(&lg, argv[1], METRICS_SINK_ALL, 6, -1, "tensorboard system test") != 0)
        return 1;
    val_step(&lg, 0, 0.125);
    for (long s = 1; s <= 5; s++) {
        for (long k = 1; k <= 4; k++)
            metrics_progress("gen", k, 4, "sequences");
        metrics_progress_done();
        train_step(&lg, s, 0, s == 5 ? 0.375 : NAN);
        if (s == 3 && metrics_logger_sync(&lg) != 0) /* "checkpoint" */
            return 1;
    }
    metrics_logger_close(&lg);

    if (metrics_logger_open(&lg, argv[1], METRICS_SINK_ALL, 6, 3, "tensorboard system test") != 0)
        return 1;
    for (long s = 4; s <= 6; s++)
        train_step(&lg, s, 10, s == 6 ? 0.5 : NAN);
    if (metrics_logger_sync(&lg) != 0)
        return 1;
    metrics_logger_close(&lg);
    return 0;
}
