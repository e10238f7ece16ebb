/* The one-process source (the hybrid role alone): step k's rollouts drawn, generated and scored in the trainer's own
 * process with its policy, and with DAPO's dynamic sampling (algorithm.filter_groups) drawn again until enough
 * groups carry a learning signal. */
#include <stdlib.h>

#include "common/check.h"
#include "common/config.h"
#include "hybrid_source.h"
#include "worker/gen/generate.h"
#include "worker/metrics/metrics.h"
#include "worker/step/batch.h"
#include "worker/step/prompts.h"

/* trainer_source.next_batch: step k's rollouts in this process. */
static int local_next_batch(void *ctx, int64_t k, struct step_batch *b, struct step_timing *tm)
{
    struct local_source *ls = ctx;
    struct trainer *t = ls->t;
    const struct grpo_config *c = ls->cfg;
    const int B = (int)c->data_train_batch_size, n = (int)c->rollout_n;
    const int G = config_gen_batch_size(c); /* prompts per generation round (DAPO's data.gen_batch_size) */
    const struct prompt_item **prompts = xmalloc((size_t)G * sizeof *prompts);
    int *uids = xmalloc((size_t)G * sizeof(int));
    struct sampler_params sp = {(float)c->rollout_temperature, (float)c->rollout_top_p, (int)c->rollout_top_k};
    const int rounds = config_filter_rounds(c);
    int drawn = 0, r = 0;
    ls->dapo = (struct hybrid_dapo){0};
    for (; r < rounds; r++) {
        trainer_enter_phase(t, GRPO__PHASE__PHASE_GEN);
        trainer_draw_prompts(t, prompts, uids, G);
        drawn += G;
        gen_generate_and_score(trainer_rollout_ctx(t), prompts, uids, G, 0, &sp, n,
                               rollout_step_seed(trainer_seed(t), k, (uint64_t)r), b, &tm->gen, &tm->reward);
        if (!c->alg_filter_groups_enable)
            break;
        step_batch_filter_groups(b, step_filter_metric_from_name(c->alg_filter_groups_metric));
        if (b->n_groups >= B)
            break;
    }
    free(prompts);
    free(uids);
    if (c->alg_filter_groups_enable) {
        step_batch_truncate_groups(b, B);
        ls->dapo.filtered = true;
        ls->dapo.gen_batches = (double)drawn / G;
        ls->dapo.kept_groups = b->n_groups;
    }
    for (int i = 0; i < b->n_seq; i++) /* after filtering, positions in this batch are the step's order */
        b->seqs[i].gidx = i;
    return 0;
}

/* trainer_source.metrics: DAPO's, first. */
static void local_metrics(void *ctx, enum source_metrics_at at, const struct step_timing *tm, double step_s,
                          struct metrics *m)
{
    (void)tm, (void)step_s;
    if (at == SOURCE_METRICS_FIRST)
        hybrid_dapo_metrics(m, &((struct local_source *)ctx)->dapo);
}

struct trainer_source local_source(struct local_source *ls, const struct grpo_config *cfg)
{
    *ls = (struct local_source){.cfg = cfg};
    return (struct trainer_source){
        .ctx = ls, .next_batch = local_next_batch, .generates = true, .metrics = local_metrics};
}

void local_source_ready(void *ud, struct trainer *t) { ((struct local_source *)ud)->t = t; }

struct trainer *local_trainer_create(const struct grpo_config *cfg, const struct trainer_hooks *hooks, char *err,
                                     size_t errlen)
{
    struct local_source *ls = xmalloc(sizeof *ls);
    struct trainer_source src = local_source(ls, cfg);
    src.release = free;
    struct trainer *t = trainer_create_dist(cfg, hooks, NULL, &src, err, errlen);
    if (t)
        local_source_ready(ls, t);
    return t;
}
