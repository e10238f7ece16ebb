#include "batch.h"

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

void step_batch_filter_groups(struct step_batch *b)
{
    int w = 0, gw = 0;
    for (int g = 0; g < b->n_groups; g++) {
        int first = -1, last = -1;
        bool varied = false;
        for (int i = 0; i < b->n_seq; i++)
            if (b->seqs[i].group == g) {
                if (first < 0)
                    first = i;
                last = i;
                varied |= b->seqs[i].score != b->seqs[first].score;
            }
        for (int i = first; first >= 0 && i <= last; i++) {
            if (varied) {
                b->seqs[w] = b->seqs[i];
                b->seqs[w].group = gw;
                b->resp_text[w++] = b->resp_text[i];
            } else { /* a dropped group's entries are past the kept ones (w <= i) and never read again */
                rollout_seqs_free(&b->seqs[i], 1);
                free(b->resp_text[i]); // NOLINT(clang-analyzer-unix.Malloc)
            }
        }
        if (varied) {
            b->group_prompt[gw] = b->group_prompt[g];
            b->group_uid[gw++] = b->group_uid[g];
        }
    }
    b->n_seq = w;
    b->n_groups = gw;
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
