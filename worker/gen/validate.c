/* Validation on the held-out prompts: generated in parts (all of them in one process, an engine's share on
 * colocated ranks), reported once. */
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
#include "worker/step/audit.h"

/* Responses per prompt and the sampling of validation: greedy, or actor_rollout_ref.rollout.val_kwargs. */
static int val_sampling(const struct grpo_config *c, struct sampler_params *sp)
{
    *sp = (struct sampler_params){0.0f, 1.0f, 0};
    if (!c->rollout_val_do_sample)
        return 1;
    *sp = (struct sampler_params){(float)c->rollout_val_temperature, (float)c->rollout_val_top_p,
                                  (int)c->rollout_val_top_k};
    return (int)c->rollout_val_n;
}

int gen_validate_n(const struct grpo_config *c)
{
    struct sampler_params sp;
    return val_sampling(c, &sp);
}

int gen_validate_part(const struct gen_ctx *train_rc, const struct prompt_set *val, uint64_t seed, int part, int parts,
                      struct val_score **out, char ***texts)
{
    struct gen_ctx vrc = *train_rc; /* validation scores the responses alone: no baseline, no components */
    vrc.greedy_baseline = vrc.reward_parts = false;
    const struct gen_ctx *rc = &vrc;
    const struct grpo_config *c = rc->cfg;
    struct sampler_params sp;
    const int n = val_sampling(c, &sp);
    struct step_batch b = {0};
    double tg = 0, tr = 0;
    const struct prompt_item **prompts = xmalloc((size_t)(val->n ? val->n : 1) * sizeof *prompts);
    for (int i = 0; i < val->n; i++)
        prompts[i] = &val->items[i];
    const int chunk = (int)c->data_val_batch_size;
    int *first = xmalloc((size_t)(val->n ? val->n : 1) * sizeof(int)); /* each group's first prompt index */
    int groups = 0;
    for (int start = 0, k = 0; start < val->n; start += chunk, k++) {
        if (k % parts != part) /* chunk k is part k mod parts's: the same chunks, and seeds, as in one process */
            continue;
        const int cnt = val->n - start < chunk ? val->n - start : chunk;
        int *uids = xmalloc((size_t)cnt * sizeof(int));
        for (int i = 0; i < cnt; i++)
            uids[i] = first[groups++] = start + i;
        gen_generate_and_score(rc, prompts + start, uids, cnt, start, &sp, n, seed, &b, &tg, &tr);
        free(uids);
    }
    *out = xmalloc((size_t)(b.n_seq ? b.n_seq : 1) * sizeof **out);
    if (texts)
        *texts = xmalloc((size_t)(b.n_seq ? b.n_seq : 1) * sizeof **texts);
    for (int i = 0; i < b.n_seq; i++) {
        (*out)[i] = (struct val_score){.prompt = first[b.seqs[i].group],
                                       .sample = (double)(b.seqs[i].gidx % n),
                                       .raw_score = b.seqs[i].raw_score,
                                       .acc = b.seqs[i].acc};
        if (texts)
            (*texts)[i] = xstrdup(b.resp_text && b.resp_text[i] ? b.resp_text[i] : "");
    }
    const int n_seq = b.n_seq;
    step_batch_free(&b);
    free(prompts), free(first);
    return n_seq;
}

static int by_prompt(const void *a, const void *b)
{
    const struct val_score *x = a, *y = b;
    if (x->prompt != y->prompt)
        return (x->prompt > y->prompt) - (x->prompt < y->prompt);
    return (x->sample > y->sample) - (x->sample < y->sample);
}

void gen_validate_report(const struct grpo_config *c, const struct prompt_set *val, struct val_score *s, int n_s,
                         double seconds, struct metrics *m)
{
    const int n = gen_validate_n(c);
    qsort(s, (size_t)n_s, sizeof *s, by_prompt); /* the order one process generates them in */
    /* per data_source: the mean over prompts of each prompt's mean, and of each prompt's best of n */
    for (int i = 0; i < n_s; i++) {
        const char *ds = val->items[(int)s[i].prompt].data_source;
        bool seen = false;
        for (int h = 0; h < i && !seen; h++)
            seen = strcmp(val->items[(int)s[h].prompt].data_source, ds) == 0;
        if (seen)
            continue;
        /* as verl's process_validation_metrics: each prompt's mean over its samples, then the mean over prompts
         * (so n copies of one answer score exactly as that answer alone) */
        double sum = 0, best_sum = 0, acc_sum = 0, best = -INFINITY, p_sum = 0, p_acc = 0;
        int groups = 0, acc_groups = 0, p_cnt = 0, p_acc_cnt = 0;
        for (int j = 0; j < n_s; j++) {
            if (strcmp(val->items[(int)s[j].prompt].data_source, ds) != 0)
                continue;
            p_sum += s[j].raw_score;
            p_cnt++;
            best = fmax(best, s[j].raw_score);
            if (isfinite(s[j].acc)) {
                p_acc += s[j].acc;
                p_acc_cnt++;
            }
            if (j + 1 == n_s || s[j + 1].prompt != s[j].prompt) { /* the prompt's last sample */
                sum += p_sum / p_cnt;
                best_sum += best;
                groups++;
                if (p_acc_cnt > 0) {
                    acc_sum += p_acc / p_acc_cnt;
                    acc_groups++;
                }
                best = -INFINITY, p_sum = p_acc = 0, p_cnt = p_acc_cnt = 0;
            }
        }
        char name[256];
        snprintf(name, sizeof name, "val-core/%s/reward/mean@%d", ds, n);
        metrics_set(m, name, sum / groups);
        if (n > 1) {
            snprintf(name, sizeof name, "val-core/%s/reward/best@%d", ds, n);
            metrics_set(m, name, best_sum / groups);
        }
        /* exact-answer accuracy apart from format credit (verl's acc), where the scorer knows it */
        if (acc_groups > 0) {
            snprintf(name, sizeof name, "val-core/%s/acc/mean@%d", ds, n);
            metrics_set(m, name, acc_sum / acc_groups);
        }
    }
    metrics_set(m, "timing_s/testing", seconds);
}

/* A response's place in the dump: its score (first: by_prompt orders these) and its index in the parts' order. */
struct dump_at {
    struct val_score v;
    int i;
};

void gen_validate_dump(const char *dir, int64_t step, const struct prompt_set *val, const struct val_score *s,
                       char *const *texts, int n)
{
    if (!dir || !*dir || n <= 0)
        return;
    struct dump_at *order = xmalloc((size_t)n * sizeof *order);
    for (int i = 0; i < n; i++)
        order[i] = (struct dump_at){s[i], i};
    qsort(order, (size_t)n, sizeof *order, by_prompt); /* by prompt, then sample: the order one process makes */
    char **lines = xmalloc((size_t)n * sizeof *lines);
    size_t *lens = xmalloc((size_t)n * sizeof *lens);
    for (int k = 0; k < n; k++) {
        const int i = order[k].i;
        const struct prompt_item *p = &val->items[(int)s[i].prompt];
        json_t *o = json_object();
        json_object_set_new(o, "input", audit_json_text(p->text ? p->text : ""));
        json_object_set_new(o, "output", audit_json_text(texts[i] ? texts[i] : ""));
        json_object_set_new(o, "gts", audit_json_text(p->ground_truth ? p->ground_truth : ""));
        json_object_set_new(o, "score", json_real(s[i].raw_score));
        json_object_set_new(o, "step", json_integer(step));
        if (isfinite(s[i].acc))
            json_object_set_new(o, "acc", json_real(s[i].acc));
        json_object_set_new(o, "data_source", json_string(p->data_source ? p->data_source : ""));
        char *line = json_dumps(o, JSON_COMPACT);
        json_decref(o);
        CHECK_ALLOC(line);
        const size_t l = strlen(line);
        lines[k] = xrealloc(line, l + 2);
        lines[k][l] = '\n', lines[k][l + 1] = 0;
        lens[k] = l + 1;
    }
    rollout_audit_save(dir, step, lines, lens, n);
    for (int k = 0; k < n; k++)
        free(lines[k]);
    free(lines), free(lens), free(order);
}

void gen_validate(const struct gen_ctx *rc, const struct prompt_set *val, uint64_t seed, int64_t step,
                  const char *dump_dir, struct metrics *m)
{
    if (val->n == 0)
        return;
    const double t0 = clock_now_s();
    struct val_score *s;
    char **texts = NULL;
    const bool dump = dump_dir && *dump_dir;
    const int n_s = gen_validate_part(rc, val, seed, 0, 1, &s, dump ? &texts : NULL);
    if (dump)
        gen_validate_dump(dump_dir, step, val, s, texts, n_s);
    gen_validate_report(rc->cfg, val, s, n_s, clock_now_s() - t0, m);
    for (int i = 0; dump && i < n_s; i++)
        free(texts[i]);
    free(texts);
    free(s);
}
