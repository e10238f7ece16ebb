#include "multi_turn.h"

#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/clock.h"
#include "kernels/kernels.h"
#include "worker/model/sampler.h"

enum traj_state {
    T_NEW,  /* not admitted yet */
    T_RUN,  /* has tokens for the model: its pending token, an answer to prefill, or (evicted) everything */
    T_WAIT, /* its turn is with the environment */
    T_DONE,
};

struct traj {
    enum traj_state state;
    int slot; /* its KV cache's slot, -1 when it has none */
    int turn_start;
    bool single;
    struct rng rng;
};

struct slot {
    int traj; /* -1 when free */
    struct kv_cache *kc;
};

struct mt {
    struct model *m;
    struct turn_env *env;
    const struct gen_params *gp;
    const int32_t *const *prompts;
    const int *prompt_lens;
    struct gen_output *out;
    struct turn_summary *sums;
    struct multi_turn_stats *st;
    struct traj *tr;
    struct slot *slots;
    int n_slots, n, total, done, waiting;
};

static bool is_stop(const struct gen_params *gp, int32_t tok)
{
    for (int i = 0; i < gp->n_stop; i++)
        if (gp->stop_ids[i] == tok)
            return true;
    return false;
}

static void free_slot(struct mt *g, struct traj *t)
{
    if (t->slot >= 0)
        g->slots[t->slot].traj = -1;
    t->slot = -1;
}

static void finish(struct mt *g, int i)
{
    struct traj *t = &g->tr[i];
    t->state = T_DONE;
    free_slot(g, t);
    const struct turn_summary mine = g->sums[i]; /* the generation's fields survive the environment's */
    g->env->ops->finish(g->env, i, &g->sums[i]);
    g->sums[i].resumed_turns = mine.resumed_turns;
    g->sums[i].prefill_tokens = mine.prefill_tokens;
    g->sums[i].evictions = mine.evictions;
    g->done++;
}

/* The model's turn of trajectory i ended (its last token sampled). */
static void turn_over(struct mt *g, int i)
{
    struct traj *t = &g->tr[i];
    struct gen_output *o = &g->out[i];
    if (t->single) {
        finish(g, i);
        return;
    }
    t->state = T_WAIT;
    g->waiting++;
    g->env->ops->turn_end(g->env, i, o->tokens + t->turn_start, o->len - t->turn_start, o->stopped,
                          g->gp->max_new_tokens - o->len);
}

/* Record a sampled token of trajectory i; ends its turn on a stop token or at the response budget. */
static void push(struct mt *g, int i, int32_t tok, float lp)
{
    struct gen_output *o = &g->out[i];
    o->tokens[o->len] = tok;
    o->logps[o->len] = lp;
    o->mask[o->len] = 1;
    o->len++;
    o->stopped = is_stop(g->gp, tok);
    if (o->stopped || o->len >= g->gp->max_new_tokens)
        turn_over(g, i);
    else
        g->tr[i].state = T_RUN;
}

static void answer(struct mt *g, const struct turn_reply *r)
{
    struct traj *t = &g->tr[r->traj];
    struct gen_output *o = &g->out[r->traj];
    if (!(t->state == T_WAIT))
        check_failf(__FILE__, __LINE__, "multi-turn: an answer for trajectory %d, which is not waiting", r->traj);
    g->waiting--;
    if (r->done || r->n <= 0 || o->len + r->n >= g->gp->max_new_tokens) { /* verl: no turn ends on an answer */
        free(r->ids);
        finish(g, r->traj);
        return;
    }
    memcpy(o->tokens + o->len, r->ids, (size_t)r->n * sizeof(int32_t));
    memset(o->logps + o->len, 0, (size_t)r->n * sizeof(float));
    memset(o->mask + o->len, 0, (size_t)r->n);
    o->len += r->n;
    t->turn_start = o->len;
    t->state = T_RUN;
    free(r->ids);
    g->sums[r->traj].resumed_turns++;
    if (t->slot >= 0) {
        const int fed = g->prompt_lens[r->traj / g->n] + o->len - g->slots[t->slot].kc->len;
        g->st->resumed_turns++;
        g->st->resume_tokens += fed;
        g->sums[r->traj].prefill_tokens += fed;
    }
}

static void drain(struct mt *g, bool wait)
{
    struct turn_reply r[64];
    const double t0 = clock_now_s();
    int k = g->env->ops->poll(g->env, r, 64, wait);
    if (wait)
        g->st->env_wait_s += clock_now_s() - t0;
    for (int j = 0; j < k; j++)
        answer(g, &r[j]);
}

static int free_slots(const struct mt *g)
{
    int f = 0;
    for (int s = 0; s < g->n_slots; s++)
        f += g->slots[s].traj < 0;
    return f;
}

static int take_slot(struct mt *g, int i)
{
    int s = 0;
    while (g->slots[s].traj >= 0)
        s++;
    g->slots[s].traj = i;
    g->slots[s].kc->len = 0;
    g->tr[i].slot = s;
    return s;
}

/* Give up the caches of up to k waiting trajectories. */
static void evict(struct mt *g, int k)
{
    for (int s = 0; s < g->n_slots && k > 0; s++) {
        const int i = g->slots[s].traj;
        if (i >= 0 && g->tr[i].state == T_WAIT) {
            free_slot(g, &g->tr[i]);
            g->st->evictions++;
            g->sums[i].evictions++;
            k--;
        }
    }
}

void gen_generate_multi_turn(struct model *m, struct turn_env *env, const int32_t *const *prompts,
                             const int *prompt_lens, const char *const *messages, const char *const *extra,
                             const char *const *agent, int n_prompts, const struct gen_params *gp,
                             struct gen_output *out, struct turn_summary *sums, struct multi_turn_stats *st)
{
    if (!(!gp->record_routes))
        check_failf(__FILE__, __LINE__, "multi-turn generation does not record routes");
    if (!(!m->sh.tp && !m->sh.pp))
        check_failf(__FILE__, __LINE__, "multi-turn generation runs on an unsplit model");
    const int V = m->cfg.vocab_size, n = gp->n_samples, total = n_prompts * n;
    const long long want = gp->max_batch > n ? gp->max_batch : n;
    int n_slots = (int)(want < total ? want : total > n ? total : n);
    int max_prompt = 1;
    for (int p = 0; p < n_prompts; p++)
        max_prompt = prompt_lens[p] > max_prompt ? prompt_lens[p] : max_prompt;
    const int cap = max_prompt + gp->max_new_tokens;
    if (gp->kv_budget > 0) {
        const size_t fit = gp->kv_budget / kv_slot_bytes(m, cap);
        n_slots = fit < (size_t)n_slots ? (fit > (size_t)n ? (int)fit : n) : n_slots;
    }
    const size_t room = (size_t)gp->max_new_tokens + 1;
    for (int i = 0; i < total; i++) {
        out[i] = (struct gen_output){0};
        out[i].tokens = xmalloc(room * sizeof(int32_t));
        out[i].logps = xmalloc(room * sizeof(float));
        out[i].mask = xmalloc(room);
        sums[i] = (struct turn_summary){0};
    }
    if (total == 0 || gp->max_new_tokens <= 0)
        return;
    struct mt g = {.m = m,
                   .env = env,
                   .gp = gp,
                   .prompts = prompts,
                   .prompt_lens = prompt_lens,
                   .out = out,
                   .sums = sums,
                   .st = st,
                   .n = n,
                   .total = total,
                   .n_slots = n_slots};
    g.tr = xcalloc((size_t)total, sizeof *g.tr);
    for (int i = 0; i < total; i++) {
        g.tr[i].slot = -1;
        rng_seed(&g.tr[i].rng, gp->seed, gp->first_stream + (uint64_t)i);
    }
    g.slots = xcalloc((size_t)n_slots, sizeof *g.slots);
    struct kv_slab *slab = kv_slab_create(m, n_slots, cap);
    for (int s = 0; s < n_slots; s++) {
        g.slots[s].traj = -1;
        g.slots[s].kc = kv_slab_slot(slab, s);
    }
    struct kv_cache **batch = xmalloc((size_t)n_slots * sizeof *batch);
    int *ntok = xmalloc((size_t)n_slots * sizeof(int)), *who = xmalloc((size_t)n_slots * sizeof(int));
    bool *is_prompt = xmalloc((size_t)n_slots * sizeof(bool));
    int32_t *toks = xmalloc((size_t)n_slots * sizeof(int32_t));
    float *lps = xmalloc((size_t)n_slots * sizeof(float));
    double *us = xmalloc((size_t)n_slots * sizeof(double));
    size_t cat_cap = (size_t)n_slots * (size_t)cap;
    int32_t *cat = xmalloc(cat_cap * sizeof(int32_t));
    const struct sampler_params *sp = &gp->sampling;
    int next_prompt = 0;
    while (g.done < total) {
        drain(&g, false);
        /* trajectories with an answer but no cache (evicted) first, then whole new groups */
        for (int i = 0; i < total; i++)
            if (g.tr[i].state == T_RUN && g.tr[i].slot < 0 && free_slots(&g) > 0) {
                take_slot(&g, i);
                g.st->recompute_tokens += prompt_lens[i / n] + out[i].len;
                sums[i].prefill_tokens += prompt_lens[i / n] + out[i].len;
            }
        int B = 0;
        size_t cat_len = 0;
        while (next_prompt < n_prompts && free_slots(&g) >= n) {
            const int p = next_prompt++;
            for (int s = 0; s < n; s++) {
                const int i = p * n + s;
                g.tr[i].single = env->ops->begin(env, i, messages ? messages[p] : NULL, extra ? extra[p] : NULL,
                                                 agent ? agent[p] : NULL) != 0;
                g.tr[i].state = T_RUN;
            }
            const int s0 = take_slot(&g, p * n); /* the group's prompt is prefilled once, in its first sample's cache */
            batch[B] = g.slots[s0].kc;
            ntok[B] = prompt_lens[p];
            who[B] = p * n;
            is_prompt[B++] = true;
            memcpy(cat + cat_len, prompts[p], (size_t)prompt_lens[p] * sizeof(int32_t));
            cat_len += (size_t)prompt_lens[p];
        }
        for (int s = 0; s < n_slots; s++) {
            const int i = g.slots[s].traj;
            if (i < 0 || g.tr[i].state != T_RUN)
                continue;
            bool admitted = false; /* a group admitted in this step: its prompt is already in the batch */
            for (int b = 0; b < B; b++)
                admitted |= is_prompt[b] && who[b] == i;
            if (admitted)
                continue;
            const int pl = prompt_lens[i / n], have = g.slots[s].kc->len, upto = pl + out[i].len;
            batch[B] = g.slots[s].kc;
            ntok[B] = upto - have;
            who[B] = i;
            is_prompt[B++] = false;
            for (int k = have; k < upto; k++) /* the sequence is the prompt, then the response */
                cat[cat_len++] = k < pl ? prompts[i / n][k] : out[i].tokens[k - pl];
        }
        if (B == 0) {
            if (g.done >= total)
                break;
            if (!(g.waiting > 0))
                check_failf(__FILE__, __LINE__,
                            "multi-turn generation: nothing to run and nothing awaited (%d of %d done)", g.done, total);
            int need = 0; /* slots wanted by answered trajectories without a cache, or by the next group */
            for (int i = 0; i < total; i++)
                need += g.tr[i].state == T_RUN && g.tr[i].slot < 0;
            if (need == 0 && next_prompt < n_prompts)
                need = n - free_slots(&g);
            if (need > 0)
                evict(&g, need);
            else
                drain(&g, true);
            continue;
        }
        const float *logits = model_step_logits(m, batch, B, ntok, cat);
        for (int b = 0; b < B; b++)
            us[b] = sp->temperature > 0 ? rng_uniform(&g.tr[who[b]].rng) : 0.0;
        k_sample(m->K, toks, lps, logits, B, V, sp->temperature, sp->top_p, sp->top_k, us);
        for (int b = 0; b < B; b++) {
            if (!is_prompt[b]) {
                push(&g, who[b], toks[b], lps[b]);
                continue;
            }
            /* a new group: its other samples copy the prompt's cache and sample from the same logits */
            const int i0 = who[b];
            const struct kv_cache *pc = g.slots[g.tr[i0].slot].kc;
            for (int s = 1; s < n; s++) {
                const int i = i0 + s;
                struct kv_cache *kc = g.slots[take_slot(&g, i)].kc;
                kv_cache_copy(m, kc, pc);
                const double u = sp->temperature > 0 ? rng_uniform(&g.tr[i].rng) : 0.0;
                int32_t tok;
                float lp;
                k_sample(m->K, &tok, &lp, logits + (size_t)b * V, 1, V, sp->temperature, sp->top_p, sp->top_k, &u);
                push(&g, i, tok, lp);
            }
            push(&g, i0, toks[b], lps[b]); /* last: its slot's cache was the others' source */
        }
    }
    kv_slab_free(slab);
    free(g.tr), free(g.slots), free(batch), free(ntok), free(who), free(is_prompt), free(toks), free(lps), free(us),
        free(cat);
}

void gen_turn_summary_free(struct turn_summary *s)
{
    free(s->messages_json);
    free(s->reward_json);
    s->messages_json = s->reward_json = NULL;
}

static const struct turn_env_factory *registered;

void gen_turn_env_register(const struct turn_env_factory *f) { registered = f; }

const struct turn_env_factory *gen_turn_env_factory(void) { return registered; }
