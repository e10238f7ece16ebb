/* Validation on the held-out prompts. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "validate.h"
#include "worker/metrics/metrics.h"

void rollout_validate(const struct rollout_ctx *rc, const struct prompt_set *val, uint64_t seed, struct metrics *m)
{
    const struct grpo_config *c = rc->cfg;
    if (val->n == 0)
        return;
    double t0 = clock_now_s();
    struct sampler_params sp = {0.0f, 1.0f, 0};
    int n = 1;
    if (c->rollout_val_do_sample) {
        sp = (struct sampler_params){(float)c->rollout_val_temperature, (float)c->rollout_val_top_p,
                                     (int)c->rollout_top_k};
        n = (int)c->rollout_val_n;
    }
    struct step_batch b = {0};
    double tg = 0, tr = 0;
    const struct prompt_item **prompts = xmalloc((size_t)val->n * sizeof *prompts);
    for (int i = 0; i < val->n; i++)
        prompts[i] = &val->items[i];
    const int chunk = (int)c->data_val_batch_size;
    for (int start = 0; start < val->n; start += chunk) {
        int cnt = val->n - start < chunk ? val->n - start : chunk;
        int *uids = xmalloc((size_t)cnt * sizeof(int));
        for (int i = 0; i < cnt; i++)
            uids[i] = start + i;
        rollout_generate_and_score(rc, prompts + start, uids, cnt, start, &sp, n, seed, &b, &tg, &tr);
        free(uids);
    }
    /* per data_source: mean over all samples, and best of n per prompt */
    for (int g = 0; g < b.n_groups; g++) {
        const char *ds = b.group_prompt[g]->data_source;
        bool seen = false;
        for (int h = 0; h < g; h++)
            seen |= strcmp(b.group_prompt[h]->data_source, ds) == 0;
        if (seen)
            continue;
        double sum = 0, best_sum = 0, acc_sum = 0;
        int cnt = 0, groups = 0, acc_cnt = 0;
        for (int h = 0; h < b.n_groups; h++) {
            if (strcmp(b.group_prompt[h]->data_source, ds) != 0)
                continue;
            double best = -INFINITY;
            for (int i = 0; i < b.n_seq; i++)
                if (b.seqs[i].group == h) {
                    sum += b.seqs[i].raw_score;
                    cnt++;
                    best = fmax(best, b.seqs[i].raw_score);
                    if (isfinite(b.seqs[i].acc)) {
                        acc_sum += b.seqs[i].acc;
                        acc_cnt++;
                    }
                }
            best_sum += best;
            groups++;
        }
        char name[256];
        snprintf(name, sizeof name, "val-core/%s/reward/mean@%d", ds, n);
        metrics_set(m, name, sum / cnt);
        if (n > 1) {
            snprintf(name, sizeof name, "val-core/%s/reward/best@%d", ds, n);
            metrics_set(m, name, best_sum / groups);
        }
        /* exact-answer accuracy apart from format credit (verl's acc), where the scorer knows it */
        if (acc_cnt > 0) {
            snprintf(name, sizeof name, "val-core/%s/acc/mean@%d", ds, n);
            metrics_set(m, name, acc_sum / acc_cnt);
        }
    }
    metrics_set(m, "timing_s/testing", clock_now_s() - t0);
    step_batch_free(&b);
    free(prompts);
}
