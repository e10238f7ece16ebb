#include "seq.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"

void rollout_seqs_free(struct rollout_seq *s, int n)
{
    for (int i = 0; i < n; i++) {
        free(s[i].resp);
        free(s[i].gen_logp);
        free(s[i].old_logp);
        free(s[i].ref_logp);
        free(s[i].adv);
        free(s[i].routes);
        free(s[i].mask);
        free(s[i].loss_mask);
        free(s[i].is_w);
        free(s[i].messages_json);
        free(s[i].versions);
        free(s[i].reward_parts);
        free(s[i].sum_pi_sq);
    }
}

int rollout_seq_model_tokens(const struct rollout_seq *s)
{
    if (!s->mask)
        return s->resp_len;
    int n = 0;
    for (int t = 0; t < s->resp_len; t++)
        n += s->mask[t] != 0;
    return n;
}

int rollout_seq_loss_tokens(const struct rollout_seq *s)
{
    const uint8_t *m = rollout_seq_loss_mask(s);
    if (!m)
        return s->resp_len;
    int n = 0;
    for (int t = 0; t < s->resp_len; t++)
        n += m[t] != 0;
    return n;
}

int rollout_seq_tokens(const struct rollout_seq *s) { return s->prompt_len + s->resp_len - 1; }

/* Same group and the same prompt: a shared prefix is worth packing once (at least 2 prompt tokens). */
static bool same_prompt(const struct rollout_seq *a, const struct rollout_seq *b)
{
    return a->group == b->group && a->prompt_len == b->prompt_len && a->prompt_len >= 2 &&
           (a->prompt == b->prompt || memcmp(a->prompt, b->prompt, (size_t)a->prompt_len * sizeof(int32_t)) == 0);
}

/* lead[i]: the first of the list's sequences idx[0..n) with sequence i's prompt (i itself when none before it, or
 * without share). */
static void prompt_leads(const struct rollout_seq *seqs, const int *idx, int n, bool share, int *lead)
{
    for (int i = 0; i < n; i++) {
        lead[i] = i;
        for (int j = 0; share && j < i; j++)
            if (lead[j] == j && same_prompt(&seqs[idx[j]], &seqs[idx[i]])) {
                lead[i] = j;
                break;
            }
    }
}

/* Rows [t0, t1) of s's prompt ++ response as inputs at packed rows from off, with their next tokens as targets. */
static void put_rows(struct micro_batch *mb, const struct rollout_seq *s, int off, int t0, int t1)
{
    for (int t = t0; t < t1; t++, off++) {
        mb->ids[off] = t < s->prompt_len ? s->prompt[t] : s->resp[t - s->prompt_len];
        const int nt = t + 1;
        mb->targets[off] = nt < s->prompt_len ? s->prompt[nt] : s->resp[nt - s->prompt_len];
        mb->pos[off] = t;
    }
    if (mb->routes && t1 > t0)
        memcpy(mb->routes + (size_t)(off - (t1 - t0)) * s->routes_w, s->routes + (size_t)t0 * s->routes_w,
               (size_t)(t1 - t0) * s->routes_w * sizeof *mb->routes);
}

/* Every sequence of the list carries its rollout's experts, of one width: their width, else 0. */
static int routes_width(const struct rollout_seq *seqs, const int *idx, int n)
{
    const int w = n > 0 && seqs[idx[0]].routes ? seqs[idx[0]].routes_w : 0;
    for (int i = 1; i < n && w; i++)
        if (!seqs[idx[i]].routes || seqs[idx[i]].routes_w != w)
            return 0;
    return w;
}

void micro_batch_build(struct micro_batch *mb, const struct rollout_seq *seqs, const int *idx, int n, bool share)
{
    memset(mb, 0, sizeof *mb);
    /* each sequence's lead (prompt_leads), and the members of each lead */
    int *lead = xmalloc((size_t)(n ? n : 1) * sizeof(int)), *members = xcalloc((size_t)(n ? n : 1), sizeof(int));
    int N = 0;
    prompt_leads(seqs, idx, n, share, lead);
    for (int i = 0; i < n; i++)
        members[lead[i]]++;
    for (int i = 0; i < n; i++) {
        const struct rollout_seq *s = &seqs[idx[i]];
        if (members[lead[i]] < 2)
            N += rollout_seq_tokens(s);
        else /* its response rows, and the prompt (less its last token) once for its lead */
            N += s->resp_len + (lead[i] == i ? s->prompt_len - 1 : 0);
        mb->n_shared += members[lead[i]] >= 2 && lead[i] == i;
    }
    const int nseg = n + mb->n_shared;
    mb->n_seq = n;
    mb->seq = idx;
    mb->ids = xmalloc((size_t)(N ? N : 1) * sizeof(int32_t));
    mb->targets = xmalloc((size_t)(N ? N : 1) * sizeof(int32_t));
    mb->pos = xmalloc((size_t)(N ? N : 1) * sizeof(int32_t));
    mb->cu = xmalloc((size_t)(nseg + 1) * sizeof(int32_t));
    mb->from = xmalloc((size_t)(nseg ? nseg : 1) * sizeof(int32_t));
    mb->prefix = xmalloc((size_t)(nseg ? nseg : 1) * sizeof(int32_t)); /* pb.prefix_of only when shared */
    mb->resp_at = xmalloc((size_t)(n ? n : 1) * sizeof(int32_t));
    const int rw = routes_width(seqs, idx, n);
    mb->routes = rw ? xmalloc((size_t)(N ? N : 1) * rw * sizeof *mb->routes) : NULL;
    int *prompt_seg = xmalloc((size_t)(n ? n : 1) * sizeof(int)); /* a shared prompt's segment, by its lead */
    int off = 0, g = 0;
    for (int i = 0; i < n; i++) {
        const struct rollout_seq *s = &seqs[idx[i]];
        const bool shared = members[lead[i]] >= 2;
        if (shared && lead[i] == i) { /* the prompt's segment: no log-probs read there */
            mb->cu[g] = off, mb->prefix[g] = -1;
            put_rows(mb, s, off, 0, s->prompt_len - 1);
            off += s->prompt_len - 1;
            mb->from[g] = off;
            prompt_seg[i] = g++;
        }
        const int t0 = shared ? s->prompt_len - 1 : 0, t1 = rollout_seq_tokens(s);
        mb->cu[g] = off;
        mb->prefix[g] = shared ? prompt_seg[lead[i]] : -1;
        put_rows(mb, s, off, t0, t1 > t0 ? t1 : t0);
        mb->resp_at[i] = off + s->prompt_len - 1 - t0;
        mb->from[g] = mb->resp_at[i];
        off += t1 > t0 ? t1 - t0 : 0;
        g++;
    }
    mb->cu[nseg] = off;
    free(lead), free(members), free(prompt_seg);
    /* only the responses' log-probs are read: the LM head skips the prompts' rows */
    mb->pb = (struct packed_batch){
        off, nseg, mb->ids, mb->targets, mb->pos, mb->cu, mb->from, mb->n_shared ? mb->prefix : NULL, mb->routes};
}

void micro_batch_free(struct micro_batch *mb)
{
    free(mb->ids);
    free(mb->targets);
    free(mb->pos);
    free(mb->cu);
    free(mb->from);
    free(mb->prefix);
    free(mb->resp_at);
    free(mb->routes);
    memset(mb, 0, sizeof *mb);
}

struct len_idx {
    int len, idx, order;
};

static int by_len_desc(const void *a, const void *b)
{
    const struct len_idx *x = a, *y = b;
    if (x->len != y->len)
        return y->len - x->len;
    return x->order - y->order;
}

static int by_order(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* The units of the token-budget packing, in u (len: rows; order: first sequence): one sequence each, or with
 * share the sequences of the list with one prompt together, as many as fit max_tokens with the prompt counted
 * once (a new unit when the next one would not fit). unit_of[i]: sequence i's unit. Returns the count. */
static int budget_units(const struct rollout_seq *seqs, const int *idx, int n, int max_tokens, bool share,
                        struct len_idx *u, int *unit_of)
{
    /* latest[l]: the unit the last sequence with lead l's prompt went to */
    int *lead = xmalloc((size_t)(n ? n : 1) * sizeof(int)), *latest = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    prompt_leads(seqs, idx, n, share, lead);
    int nu = 0;
    for (int i = 0; i < n; i++) {
        const struct rollout_seq *s = &seqs[idx[i]];
        const int j = lead[i] != i ? latest[lead[i]] : -1;
        if (j >= 0 && u[j].len + s->resp_len <= max_tokens) {
            u[j].len += s->resp_len; /* its response's rows only: the prompt is there already */
            unit_of[i] = j;
        } else {
            u[nu] = (struct len_idx){rollout_seq_tokens(s), nu, i};
            unit_of[i] = nu++;
        }
        latest[lead[i]] = unit_of[i];
    }
    free(lead), free(latest);
    return nu;
}

int split_micro_batches(const struct rollout_seq *seqs, const int *idx, int n, int max_seqs, int max_tokens, bool share,
                        int ***groups_out, int **counts_out)
{
    int k;
    int *bin_of = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    if (max_tokens <= 0) {
        int per = max_seqs > 0 ? max_seqs : n;
        k = n ? (n + per - 1) / per : 0;
        for (int i = 0; i < n; i++)
            bin_of[i] = i / per;
    } else {
        /* units (sequences, or a prompt's sequences) longest first into the lightest bin; add a bin until every
         * bin fits the budget */
        struct len_idx *li = xmalloc((size_t)(n ? n : 1) * sizeof *li);
        int *unit_of = xmalloc((size_t)(n ? n : 1) * sizeof(int)),
            *bin_of_unit = xmalloc((size_t)(n ? n : 1) * sizeof(int));
        const int nu = budget_units(seqs, idx, n, max_tokens, share, li, unit_of);
        long long total = 0;
        for (int i = 0; i < nu; i++)
            total += li[i].len;
        qsort(li, (size_t)nu, sizeof *li, by_len_desc);
        k = nu ? (int)((total + max_tokens - 1) / max_tokens) : 0;
        if (k < 1 && nu)
            k = 1;
        long long *load = NULL;
        for (;; k++) {
            free(load);
            load = xcalloc((size_t)k + 1, sizeof *load);
            bool fits = true;
            for (int j = 0; j < nu; j++) {
                int best = 0;
                for (int b = 1; b < k; b++)
                    if (load[b] < load[best])
                        best = b;
                /* a bin holding one over-long sequence is allowed */
                if (load[best] > 0 && load[best] + li[j].len > max_tokens)
                    fits = false;
                load[best] += li[j].len;
                bin_of_unit[li[j].idx] = best;
            }
            if (fits || k >= nu)
                break;
        }
        for (int i = 0; i < n; i++)
            bin_of[i] = bin_of_unit[unit_of[i]];
        free(load);
        free(li);
        free(unit_of);
        free(bin_of_unit);
    }
    int **groups = xcalloc((size_t)(k ? k : 1), sizeof *groups);
    int *counts = xcalloc((size_t)(k ? k : 1), sizeof *counts);
    for (int i = 0; i < n; i++)
        counts[bin_of[i]]++;
    for (int b = 0; b < k; b++) {
        groups[b] = xmalloc((size_t)(counts[b] ? counts[b] : 1) * sizeof(int));
        counts[b] = 0;
    }
    for (int i = 0; i < n; i++)
        groups[bin_of[i]][counts[bin_of[i]]++] = idx[i];
    for (int b = 0; b < k; b++) /* keep sequence order inside a micro-batch: reproducible packing */
        qsort(groups[b], (size_t)counts[b], sizeof(int), by_order);
    free(bin_of);
    *groups_out = groups;
    *counts_out = counts;
    return k;
}
