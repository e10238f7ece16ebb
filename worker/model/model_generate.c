#include "model_generate.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "kernels/kernels.h"

struct slot {
    int seq; /* index into out[], -1 when free */
    struct kv_cache *kc;
    struct rng rng;
    int32_t next; /* token to feed at the next step */
};

static bool is_stop(const struct gen_params *gp, int32_t tok)
{
    for (int i = 0; i < gp->n_stop; i++)
        if (gp->stop_ids[i] == tok)
            return true;
    return false;
}

/* Record a sampled token; returns true when the sequence is finished. */
static bool push_token(const struct gen_params *gp, struct gen_output *o, int32_t tok, float logp)
{
    o->tokens[o->len] = tok;
    o->logps[o->len] = logp;
    o->len++;
    if (is_stop(gp, tok)) {
        o->stopped = true;
        return true;
    }
    return o->len >= gp->max_new_tokens;
}

bool model_gen_output_finished(const struct gen_output *o, int max_new_tokens)
{
    return o->stopped || o->len >= max_new_tokens;
}

/* What the admission takes next: a whole group (its prompt prefilled once, sample < 0), or one sequence continued
 * from its tokens (prefilled with its prompt and them). */
struct item {
    int prompt, sample;
};

/* Whether sequence i may take another token in this call. */
static bool may_go(const struct gen_params *gp, const struct gen_output *o, int i)
{
    return !gp->pause_at || gp->pause_at[i] < 0 || o->len < gp->pause_at[i];
}

int model_generate_phase(struct model *m, const int32_t *const *prompts, const int *prompt_lens, int n_prompts,
                         const struct gen_params *gp, struct gen_output *out)
{
    const int V = m->cfg.vocab_size, n = gp->n_samples;
    /* a whole group must fit; more slots than sequences would only hold idle KV caches (max_num_seqs is a bound,
     * not an allocation: admission is the same either way) */
    const long long want = gp->max_batch > n ? gp->max_batch : n, all = (long long)n_prompts * n;
    int max_batch = (int)(want < all ? want : all > n ? all : n);
    int max_prompt = 1;
    for (int p = 0; p < n_prompts; p++)
        max_prompt = prompt_lens[p] > max_prompt ? prompt_lens[p] : max_prompt;
    const int cap = max_prompt + gp->max_new_tokens;
    /* recorded experts per token (0: none) */
    const size_t rw = gp->record_routes ? (size_t)m->cfg.n_layers * m->cfg.n_experts_per_tok : 0;
    if (gp->resume && rw) /* a continued sequence's routes are not recorded */
        check_failf(__FILE__, __LINE__, "generate_phase: resume with record_routes");
    if (gp->kv_budget > 0) { /* the budget's sequences, whole groups at least */
        const size_t fit = kv_slots_fit(m, gp->kv_budget, cap);
        max_batch = fit < (size_t)max_batch ? (fit > (size_t)n ? (int)fit : n) : max_batch;
    }
    if (!gp->resume)
        for (int i = 0; i < n_prompts * n; i++) {
            out[i].tokens = xmalloc((size_t)(gp->max_new_tokens + 1) * sizeof(int32_t));
            out[i].logps = xmalloc((size_t)(gp->max_new_tokens + 1) * sizeof(float));
            out[i].len = 0;
            out[i].stopped = false;
            out[i].mask = NULL;
            out[i].routes =
                rw ? xmalloc((size_t)(prompt_lens[i / n] + gp->max_new_tokens) * rw * sizeof(uint16_t)) : NULL;
        }
    int unfinished = 0;
    for (int i = 0; i < n_prompts * n; i++)
        unfinished += !model_gen_output_finished(&out[i], gp->max_new_tokens);
    if (gp->max_new_tokens <= 0 || unfinished == 0)
        return 0;
    /* the admissions in order: a group none of whose samples has a token starts whole; the unfinished samples of
     * a group that has started are continued one by one */
    struct item *items = xmalloc((size_t)(n_prompts * n + 1) * sizeof *items);
    int n_items = 0;
    for (int p = 0; p < n_prompts; p++) {
        bool fresh = true;
        for (int s = 0; s < n; s++)
            fresh &= out[p * n + s].len == 0 && !out[p * n + s].stopped;
        if (fresh) {
            items[n_items++] = (struct item){p, -1};
            continue;
        }
        for (int s = 0; s < n; s++)
            if (!model_gen_output_finished(&out[p * n + s], gp->max_new_tokens))
                items[n_items++] = (struct item){p, s};
    }
    struct slot *slots = xcalloc((size_t)max_batch, sizeof *slots);
    struct kv_slab *slab = kv_slab_create(m, max_batch, cap); /* one allocation; finished slots are refilled */
    for (int i = 0; i < max_batch; i++) {
        slots[i].seq = -1;
        slots[i].kc = kv_slab_slot(slab, i);
    }
    const float *logits = NULL; /* the step's logits, in the model's context: sampled there */
    int32_t *toks = xmalloc((size_t)max_batch * sizeof(int32_t));
    float *lps = xmalloc((size_t)max_batch * sizeof(float));
    double *us = xmalloc((size_t)max_batch * sizeof(double));
    const struct sampler_params *sp = &gp->sampling;
    struct kv_cache **batch = xmalloc((size_t)max_batch * sizeof *batch);
    int *ntok = xmalloc((size_t)max_batch * sizeof(int));
    int32_t *ids = xmalloc((size_t)max_batch * sizeof(int32_t));
    int *who = xmalloc((size_t)max_batch * sizeof(int));
    int *new_i = xmalloc((size_t)max_batch * sizeof(int)), *first_slot = xmalloc((size_t)max_batch * sizeof(int));
    /* the prompts (and a continued sequence's tokens) admitted at once, end to end */
    int32_t *cat = xmalloc((size_t)max_batch * (size_t)cap * sizeof(int32_t));
    uint16_t **rdst = xmalloc((size_t)max_batch * sizeof *rdst); /* where each step's new tokens' experts go */
    if (rw)
        model_step_record_routes(m, rdst);
    int next_item = 0, active = 0;
    bool stop_all = false;
    for (;;) {
        /* admit items in order while they fit: a group takes n slots (all its prompts are prefilled in one step,
         * each once, and the prompt's cache is copied to its other samples), a continued sequence one; an item
         * paused at its start (pause_at) is passed over, unstarted */
        int n_new = 0, cat_len = 0, used = 0;
        while (!stop_all && next_item < n_items) {
            const struct item *it = &items[next_item];
            const int need = it->sample < 0 ? n : 1;
            const int seq = it->prompt * n + (it->sample < 0 ? 0 : it->sample);
            if (!may_go(gp, &out[seq], seq)) {
                next_item++;
                continue;
            }
            if (max_batch - active - used < need)
                break;
            next_item++;
            int i = 0;
            while (slots[i].seq >= 0)
                i++;
            slots[i].seq = seq; /* a group: reserved for its first sample */
            slots[i].kc->len = 0;
            new_i[n_new] = next_item - 1;
            first_slot[n_new] = i;
            batch[n_new] = slots[i].kc;
            const int pl = prompt_lens[it->prompt], tl = it->sample < 0 ? 0 : out[seq].len;
            memcpy(cat + cat_len, prompts[it->prompt], (size_t)pl * sizeof(int32_t));
            memcpy(cat + cat_len + pl, out[seq].tokens, (size_t)tl * sizeof(int32_t));
            ntok[n_new++] = pl + tl;
            cat_len += pl + tl;
            used += need;
        }
        if (n_new > 0) {
            for (int g = 0; g < n_new; g++) /* the prompt's experts, kept by the group's first sample */
                rdst[g] = rw ? out[items[new_i[g]].prompt * n].routes : NULL;
            logits = model_step_logits(m, batch, n_new, ntok, cat);
            for (int g = 0; rw && g < n_new; g++) {
                const int p = items[new_i[g]].prompt;
                for (int s = 1; s < n; s++)
                    memcpy(out[p * n + s].routes, out[p * n].routes, (size_t)prompt_lens[p] * rw * sizeof(uint16_t));
            }
        }
        for (int g = 0; g < n_new; g++) {
            const struct item *it = &items[new_i[g]];
            const int p = it->prompt;
            const struct kv_cache *prompt_cache = slots[first_slot[g]].kc;
            const int samples = it->sample < 0 ? n : 1;
            for (int s = 0, i = 0; s < samples; s++) {
                struct slot *sl;
                if (s == 0) {
                    sl = &slots[first_slot[g]];
                } else {
                    while (slots[i].seq >= 0)
                        i++;
                    sl = &slots[i];
                    sl->seq = p * n + s;
                    if (sl->kc != prompt_cache) /* the first sample may have ended at once, freeing its slot */
                        kv_cache_copy(m, sl->kc, prompt_cache);
                }
                struct gen_output *o = &out[sl->seq];
                rng_seed(&sl->rng, gp->seed, gp->first_stream + (uint64_t)sl->seq);
                /* one uniform per sampled token from the sequence's own stream (none when greedy): a continued
                 * sequence's stream is past the draws of its tokens */
                for (int t = 0; sp->temperature > 0 && t < o->len; t++)
                    rng_uniform(&sl->rng);
                const double u = sp->temperature > 0 ? rng_uniform(&sl->rng) : 0.0;
                float lp;
                int32_t tok;
                k_sample(m->K, &tok, &lp, logits + (size_t)g * V, 1, V, sp->temperature, sp->top_p, sp->top_k, &u);
                active++;
                if (push_token(gp, o, tok, lp)) {
                    sl->seq = -1;
                    active--;
                    unfinished--;
                } else if (!may_go(gp, o, sl->seq)) { /* paused here, unfinished */
                    sl->seq = -1;
                    active--;
                } else {
                    sl->next = tok;
                }
            }
        }
        if (active == 0 && (stop_all || next_item >= n_items))
            break;
        if (active == 0)
            continue; /* the next items, paused where they start, are passed over */
        /* one decode step for every active sequence */
        int B = 0;
        for (int i = 0; i < max_batch; i++)
            if (slots[i].seq >= 0) {
                batch[B] = slots[i].kc;
                ntok[B] = 1;
                ids[B] = slots[i].next;
                const struct gen_output *o = &out[slots[i].seq]; /* the fed token sits after the prompt, len - 1 on */
                rdst[B] = rw ? o->routes + (size_t)(prompt_lens[slots[i].seq / n] + o->len - 1) * rw : NULL;
                who[B++] = i;
            }
        logits = model_step_logits(m, batch, B, ntok, ids);
        for (int b = 0; b < B; b++)
            us[b] = sp->temperature > 0 ? rng_uniform(&slots[who[b]].rng) : 0.0;
        k_sample(m->K, toks, lps, logits, B, V, sp->temperature, sp->top_p, sp->top_k, us);
        for (int b = 0; b < B; b++) {
            struct slot *sl = &slots[who[b]];
            const int32_t tok = toks[b];
            const float lp = lps[b];
            if (push_token(gp, &out[sl->seq], tok, lp)) {
                sl->seq = -1;
                active--;
                unfinished--;
            } else if (!may_go(gp, &out[sl->seq], sl->seq)) {
                sl->seq = -1;
                active--;
            } else {
                sl->next = tok;
            }
        }
        /* a newer version is out (partial rollout): every sequence stops where it is, the unstarted groups too */
        if (gp->should_pause && active > 0 && gp->should_pause(gp->pause_ud)) {
            for (int i = 0; i < max_batch; i++)
                slots[i].seq = -1;
            active = 0;
            stop_all = true;
        }
    }
    if (rw)
        model_step_record_routes(m, NULL);
    free(rdst);
    kv_slab_free(slab);
    free(items);
    free(cat), free(slots), free(toks), free(lps), free(us), free(batch), free(ntok), free(ids), free(who), free(new_i),
        free(first_slot);
    return unfinished;
}

void model_generate(struct model *m, const int32_t *const *prompts, const int *prompt_lens, int n_prompts,
                    const struct gen_params *gp, struct gen_output *out)
{
    struct gen_params whole = *gp; /* to the end, in one call */
    whole.resume = false;
    whole.pause_at = NULL;
    whole.should_pause = NULL;
    model_generate_phase(m, prompts, prompt_lens, n_prompts, &whole, out);
}

void model_gen_output_free(struct gen_output *o)
{
    free(o->tokens);
    free(o->logps);
    free(o->routes);
    free(o->mask);
    o->mask = NULL;
    o->tokens = NULL;
    o->logps = NULL;
    o->routes = NULL;
}
