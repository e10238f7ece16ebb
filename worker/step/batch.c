#include "batch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"

uint64_t rollout_step_seed(uint64_t seed, int64_t step, uint64_t salt)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)step + 1) * 0xbf58476d1ce4e5b9ull ^ salt;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 29);
}

void step_batch_reserve(struct step_batch *b, int more)
{
    int need = b->n_seq + more;
    if (need <= b->cap)
        return;
    b->cap = need;
    b->seqs = xrealloc(b->seqs, (size_t)b->cap * sizeof *b->seqs);
    b->resp_text = xrealloc(b->resp_text, (size_t)b->cap * sizeof *b->resp_text);
    /* a group has at least one sequence, so cap bounds the groups too */
    b->group_prompt = xrealloc(b->group_prompt, (size_t)b->cap * sizeof *b->group_prompt);
    b->group_uid = xrealloc(b->group_uid, (size_t)b->cap * sizeof *b->group_uid);
}

void step_batch_keep_groups(struct step_batch *b, const bool *keep)
{
    int w = 0;
    int *renum = xmalloc((size_t)(b->n_groups ? b->n_groups : 1) * sizeof(int));
    int gw = 0;
    for (int g = 0; g < b->n_groups; g++) {
        renum[g] = keep[g] ? gw : -1;
        if (keep[g]) {
            b->group_prompt[gw] = b->group_prompt[g];
            b->group_uid[gw++] = b->group_uid[g];
        }
    }
    for (int i = 0; i < b->n_seq; i++) {
        if (keep[b->seqs[i].group]) { /* w <= i: an entry is moved down at most */
            b->seqs[w] = b->seqs[i];
            b->seqs[w].group = renum[b->seqs[i].group];
            b->resp_text[w++] = b->resp_text[i];
        } else {
            rollout_seqs_free(&b->seqs[i], 1);
            free(b->resp_text[i]); // NOLINT(clang-analyzer-unix.Malloc)
        }
    }
    free(renum);
    b->n_seq = w;
    b->n_groups = gw;
}

enum step_filter_metric step_filter_metric_from_name(const char *name)
{
    if (name && strcmp(name, "acc") == 0)
        return STEP_FILTER_ACC;
    if (name && strcmp(name, "score") == 0)
        return STEP_FILTER_RAW_SCORE;
    return STEP_FILTER_SCORE;
}

static double filter_value(const struct rollout_seq *s, enum step_filter_metric metric)
{
    if (metric == STEP_FILTER_ACC && isfinite(s->acc))
        return s->acc;
    return metric == STEP_FILTER_RAW_SCORE ? s->raw_score : s->score;
}

void step_batch_filter_groups(struct step_batch *b, enum step_filter_metric metric)
{
    bool *varied = xcalloc((size_t)(b->n_groups ? b->n_groups : 1), sizeof *varied);
    int *first = xmalloc((size_t)(b->n_groups ? b->n_groups : 1) * sizeof(int));
    for (int g = 0; g < b->n_groups; g++)
        first[g] = -1;
    for (int i = 0; i < b->n_seq; i++) {
        const int g = b->seqs[i].group;
        if (first[g] < 0)
            first[g] = i;
        varied[g] |= filter_value(&b->seqs[i], metric) != filter_value(&b->seqs[first[g]], metric);
    }
    step_batch_keep_groups(b, varied);
    free(varied), free(first);
}

void step_batch_balance(const struct step_batch *b, int n_dp, bool shared_prompts, int *dp_of_group)
{
    long long *tok = xcalloc((size_t)(b->n_groups ? b->n_groups : 1), sizeof *tok);
    bool *seen = xcalloc((size_t)(b->n_groups ? b->n_groups : 1), sizeof *seen);
    for (int i = 0; i < b->n_seq; i++) { /* the rows the update forwards: a shared prompt once per group */
        const int g = b->seqs[i].group;
        tok[g] += b->seqs[i].resp_len + (shared_prompts && seen[g] ? 0 : b->seqs[i].prompt_len);
        seen[g] = true;
    }
    free(seen);
    long long *load = xcalloc((size_t)n_dp, sizeof *load);
    bool *done = xcalloc((size_t)(b->n_groups ? b->n_groups : 1), sizeof *done);
    for (int k = 0; k < b->n_groups; k++) {
        int g = -1;
        for (int h = 0; h < b->n_groups; h++)
            if (!done[h] && (g < 0 || tok[h] > tok[g]))
                g = h;
        int d = 0;
        for (int e = 1; e < n_dp; e++)
            if (load[e] < load[d])
                d = e;
        dp_of_group[g] = d;
        load[d] += tok[g];
        done[g] = true;
    }
    free(tok), free(load), free(done);
}

void step_batch_truncate_groups(struct step_batch *b, int groups)
{
    int w = 0;
    for (int i = 0; i < b->n_seq; i++) {
        if (b->seqs[i].group < groups) {
            b->seqs[w] = b->seqs[i];
            b->resp_text[w++] = b->resp_text[i];
        } else {
            rollout_seqs_free(&b->seqs[i], 1);
            free(b->resp_text[i]);
        }
    }
    b->n_seq = w;
    if (b->n_groups > groups)
        b->n_groups = groups;
}

void step_batch_append(struct step_batch *dst, struct step_batch *src)
{
    step_batch_reserve(dst, src->n_seq);
    const int g0 = dst->n_groups;
    for (int g = 0; g < src->n_groups; g++) {
        dst->group_prompt[g0 + g] = src->group_prompt[g];
        dst->group_uid[g0 + g] = src->group_uid[g];
    }
    dst->n_groups += src->n_groups;
    for (int i = 0; i < src->n_seq; i++) {
        dst->seqs[dst->n_seq] = src->seqs[i];
        dst->seqs[dst->n_seq].group += g0;
        dst->resp_text[dst->n_seq++] = src->resp_text[i];
    }
    src->n_seq = src->n_groups = 0;
    step_batch_free(src);
}

void step_batch_free(struct step_batch *b)
{
    rollout_seqs_free(b->seqs, b->n_seq);
    for (int i = 0; i < b->n_seq; i++)
        free(b->resp_text[i]);
    free(b->seqs);
    free(b->resp_text);
    free(b->group_prompt);
    free(b->group_uid);
    memset(b, 0, sizeof *b);
}

void step_batch_keep_dp_share(struct step_batch *b, int dp, int dp_size, bool shared_prompts)
{
    if (dp_size <= 1)
        return;
    int *dp_of = xmalloc((size_t)(b->n_groups ? b->n_groups : 1) * sizeof *dp_of);
    bool *keep = xmalloc((size_t)(b->n_groups ? b->n_groups : 1) * sizeof *keep);
    step_batch_balance(b, dp_size, shared_prompts, dp_of);
    for (int g = 0; g < b->n_groups; g++)
        keep[g] = dp_of[g] == dp;
    step_batch_keep_groups(b, keep);
    free(dp_of), free(keep);
}
