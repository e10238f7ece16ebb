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

struct mt_run {
    struct model *m;
    struct turn_env *env;
    struct gen_params gp_copy;
    const struct gen_params *gp;
    const int32_t *const *prompts;
    const int *prompt_lens;
    const char **messages, **extra, **agent; /* (n_prompts) each, or NULL: what the environment's begin gets */
    struct gen_output *out;
    struct turn_summary *sums;
    struct multi_turn_stats *st;
    struct traj *tr;
    struct slot *slots;
    int n_slots, n, n_prompts, total, done, waiting;
    /* the phase under way: pause_at (or NULL) and the answers held for trajectories that reached it (a replayed
     * schedule: an answer the recorded run appended only after its version switch) */
    const int *pause_at;
    struct turn_reply *held;
    bool *has_held;
    int phases, next_prompt, cap;
    struct kv_slab *slab;
    struct kv_cache **batch;
    int *ntok, *who;
    bool *is_prompt;
    int32_t *toks, *cat;
    float *lps;
    double *us;
};

static bool is_stop(const struct gen_params *gp, int32_t tok)
{
    for (int i = 0; i < gp->n_stop; i++)
        if (gp->stop_ids[i] == tok)
            return true;
    return false;
}

static void free_slot(struct mt_run *g, struct traj *t)
{
    if (t->slot >= 0)
        g->slots[t->slot].traj = -1;
    t->slot = -1;
}

static void finish(struct mt_run *g, int i)
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
static void turn_over(struct mt_run *g, int i)
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
static void push(struct mt_run *g, int i, int32_t tok, float lp)
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

/* Trajectory i holds the tokens the phase's pause_at gives it: it goes no further in this phase. */
static bool parked(const struct mt_run *g, int i)
{
    return g->pause_at && g->pause_at[i] >= 0 && g->out[i].len >= g->pause_at[i];
}

static void answer(struct mt_run *g, const struct turn_reply *r)
{
    struct traj *t = &g->tr[r->traj];
    struct gen_output *o = &g->out[r->traj];
    if (!(t->state == T_WAIT))
        check_failf(__FILE__, __LINE__, "multi-turn: an answer for trajectory %d, which is not waiting", r->traj);
    if ((!r->done || r->n > 0) && parked(g, r->traj)) { /* appended in the next phase, with its version */
        if (g->has_held[r->traj])
            check_failf(__FILE__, __LINE__, "multi-turn: a second answer for trajectory %d while one is held", r->traj);
        g->held[r->traj] = *r;
        g->has_held[r->traj] = true;
        return;
    }
    g->waiting--;
    const bool fits = r->n > 0 && o->len + r->n < g->gp->max_new_tokens; /* verl: no turn ends on an answer */
    if (fits) {
        memcpy(o->tokens + o->len, r->ids, (size_t)r->n * sizeof(int32_t));
        memset(o->logps + o->len, 0, (size_t)r->n * sizeof(float));
        memset(o->mask + o->len, 0, (size_t)r->n);
        o->len += r->n;
    }
    if (r->done || !fits) { /* a closing answer appended, or none */
        free(r->ids);
        finish(g, r->traj);
        return;
    }
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

static void drain(struct mt_run *g, bool wait)
{
    struct turn_reply r[64];
    const double t0 = clock_now_s();
    int k = g->env->ops->poll(g->env, r, 64, wait);
    if (wait)
        g->st->env_wait_s += clock_now_s() - t0;
    for (int j = 0; j < k; j++)
        answer(g, &r[j]);
}

static int free_slots(const struct mt_run *g)
{
    int f = 0;
    for (int s = 0; s < g->n_slots; s++)
        f += g->slots[s].traj < 0;
    return f;
}

static int take_slot(struct mt_run *g, int i)
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
static void evict(struct mt_run *g, int k)
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

struct mt_run *gen_multi_turn_begin(struct model *m, struct turn_env *env, const int32_t *const *prompts,
                                    const int *prompt_lens, const char *const *messages, const char *const *extra,
                                    const char *const *agent, int n_prompts, const struct gen_params *gp,
                                    struct gen_output *out, struct turn_summary *sums, struct multi_turn_stats *st)
{
    if (!(!gp->record_routes))
        check_failf(__FILE__, __LINE__, "multi-turn generation does not record routes");
    const int n = gp->n_samples, total = n_prompts * n;
    const long long want = gp->max_batch > n ? gp->max_batch : n;
    int n_slots = (int)(want < total ? want : total > n ? total : n);
    int max_prompt = 1;
    for (int p = 0; p < n_prompts; p++)
        max_prompt = prompt_lens[p] > max_prompt ? prompt_lens[p] : max_prompt;
    const int cap = max_prompt + gp->max_new_tokens;
    if (gp->kv_budget > 0) {
        const size_t fit = kv_slots_fit(m, gp->kv_budget, cap);
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
    struct mt_run *g = xcalloc(1, sizeof *g);
    *g = (struct mt_run){.m = m,
                         .env = env,
                         .gp_copy = *gp,
                         .prompts = prompts,
                         .prompt_lens = prompt_lens,
                         .out = out,
                         .sums = sums,
                         .st = st,
                         .n = n,
                         .n_prompts = n_prompts,
                         .total = total,
                         .n_slots = n_slots,
                         .cap = cap};
    g->gp = &g->gp_copy;
    const size_t np = (size_t)(n_prompts ? n_prompts : 1);
    g->messages = messages ? xmalloc(np * sizeof(char *)) : NULL;
    g->extra = extra ? xmalloc(np * sizeof(char *)) : NULL;
    g->agent = agent ? xmalloc(np * sizeof(char *)) : NULL;
    for (int p = 0; p < n_prompts; p++) { /* the strings are the caller's, kept to the end */
        if (messages)
            g->messages[p] = messages[p];
        if (extra)
            g->extra[p] = extra[p];
        if (agent)
            g->agent[p] = agent[p];
    }
    const size_t nt = (size_t)(total ? total : 1);
    g->tr = xcalloc(nt, sizeof *g->tr);
    g->held = xcalloc(nt, sizeof *g->held);
    g->has_held = xcalloc(nt, sizeof *g->has_held);
    for (int i = 0; i < total; i++) {
        g->tr[i].slot = -1;
        rng_seed(&g->tr[i].rng, gp->seed, gp->first_stream + (uint64_t)i);
    }
    if (total == 0 || gp->max_new_tokens <= 0)
        return g;
    g->slots = xcalloc((size_t)n_slots, sizeof *g->slots);
    g->slab = kv_slab_create(m, n_slots, cap);
    for (int s = 0; s < n_slots; s++) {
        g->slots[s].traj = -1;
        g->slots[s].kc = kv_slab_slot(g->slab, s);
    }
    g->batch = xmalloc((size_t)n_slots * sizeof *g->batch);
    g->ntok = xmalloc((size_t)n_slots * sizeof(int));
    g->who = xmalloc((size_t)n_slots * sizeof(int));
    g->is_prompt = xmalloc((size_t)n_slots * sizeof(bool));
    g->toks = xmalloc((size_t)n_slots * sizeof(int32_t));
    g->lps = xmalloc((size_t)n_slots * sizeof(float));
    g->us = xmalloc((size_t)n_slots * sizeof(double));
    g->cat = xmalloc((size_t)n_slots * (size_t)cap * sizeof(int32_t));
    return g;
}

/* Whether a group is left to start in this phase (a replayed phase starts none its schedule has not started yet). */
static bool group_to_start(const struct mt_run *g)
{
    return g->next_prompt < g->n_prompts && !(g->pause_at && g->pause_at[g->next_prompt * g->n] == 0);
}

/* Whether every trajectory left is parked at the phase's pause_at (a group not admitted yet: all its samples at 0). */
static bool all_parked(const struct mt_run *g)
{
    if (!g->pause_at)
        return false;
    for (int i = 0; i < g->total; i++)
        if (g->tr[i].state != T_DONE && !parked(g, i))
            return false;
    return true;
}

int gen_multi_turn_phase(struct mt_run *g, const int *pause_at, bool (*should_pause)(void *ud), void *ud)
{
    if (g->done >= g->total || g->gp->max_new_tokens <= 0) {
        g->phases++;
        return 0;
    }
    struct model *m = g->m;
    struct turn_env *env = g->env;
    struct gen_output *out = g->out;
    struct turn_summary *sums = g->sums;
    const int *prompt_lens = g->prompt_lens, n = g->n, total = g->total, V = m->cfg.vocab_size;
    const struct sampler_params *sp = &g->gp->sampling;
    g->pause_at = pause_at;
    if (g->phases > 0) {
        /* new weights: every cache is recomputed from its tokens, and the answers held for this phase go in */
        for (int s = 0; s < g->n_slots; s++)
            if (g->slots[s].traj >= 0) {
                const int i = g->slots[s].traj;
                g->slots[s].kc->len = 0;
                g->st->recompute_tokens += prompt_lens[i / n] + out[i].len;
                sums[i].prefill_tokens += prompt_lens[i / n] + out[i].len;
            }
        for (int i = 0; i < total; i++)
            if (g->has_held[i] && !parked(g, i)) {
                g->has_held[i] = false;
                answer(g, &g->held[i]);
            }
    }
    struct kv_cache **batch = g->batch;
    int *ntok = g->ntok, *who = g->who;
    bool *is_prompt = g->is_prompt;
    int32_t *toks = g->toks, *cat = g->cat;
    float *lps = g->lps;
    double *us = g->us;
    while (g->done < total) {
        drain(g, false);
        if (all_parked(g))
            break;
        /* trajectories with an answer but no cache (evicted) first, then whole new groups */
        for (int i = 0; i < total; i++)
            if (g->tr[i].state == T_RUN && g->tr[i].slot < 0 && !parked(g, i) && free_slots(g) > 0) {
                take_slot(g, i);
                g->st->recompute_tokens += prompt_lens[i / n] + out[i].len;
                sums[i].prefill_tokens += prompt_lens[i / n] + out[i].len;
            }
        int B = 0;
        size_t cat_len = 0;
        /* (a replayed phase admits no group that its schedule has not started yet) */
        while (group_to_start(g) && free_slots(g) >= n) {
            const int p = g->next_prompt++;
            for (int s = 0; s < n; s++) {
                const int i = p * n + s;
                g->tr[i].single = env->ops->begin(env, i, g->messages ? g->messages[p] : NULL,
                                                  g->extra ? g->extra[p] : NULL, g->agent ? g->agent[p] : NULL) != 0;
                g->tr[i].state = T_RUN;
            }
            const int s0 = take_slot(g, p * n); /* the group's prompt is prefilled once, in its first sample's cache */
            batch[B] = g->slots[s0].kc;
            ntok[B] = prompt_lens[p];
            who[B] = p * n;
            is_prompt[B++] = true;
            memcpy(cat + cat_len, g->prompts[p], (size_t)prompt_lens[p] * sizeof(int32_t));
            cat_len += (size_t)prompt_lens[p];
        }
        for (int s = 0; s < g->n_slots; s++) {
            const int i = g->slots[s].traj;
            if (i < 0 || g->tr[i].state != T_RUN || parked(g, i))
                continue;
            bool admitted = false; /* a group admitted in this step: its prompt is already in the batch */
            for (int b = 0; b < B; b++)
                admitted |= is_prompt[b] && who[b] == i;
            if (admitted)
                continue;
            const int pl = prompt_lens[i / n], have = g->slots[s].kc->len, upto = pl + out[i].len;
            batch[B] = g->slots[s].kc;
            ntok[B] = upto - have;
            who[B] = i;
            is_prompt[B++] = false;
            for (int k = have; k < upto; k++) /* the sequence is the prompt, then the response */
                cat[cat_len++] = k < pl ? g->prompts[i / n][k] : out[i].tokens[k - pl];
        }
        if (B == 0) {
            if (g->done >= total)
                break;
            if (!(g->waiting > 0))
                check_failf(__FILE__, __LINE__,
                            "multi-turn generation: nothing to run and nothing awaited (%d of %d done)", g->done,
                            total);
            int need = 0; /* slots wanted by answered trajectories without a cache, or by the next group */
            for (int i = 0; i < total; i++)
                need += g->tr[i].state == T_RUN && g->tr[i].slot < 0 && !parked(g, i);
            if (need == 0 && group_to_start(g))
                need = n - free_slots(g);
            if (need > 0)
                evict(g, need);
            else
                drain(g, true);
            continue;
        }
        const float *logits = model_step_logits(m, batch, B, ntok, cat);
        for (int b = 0; b < B; b++)
            us[b] = sp->temperature > 0 ? rng_uniform(&g->tr[who[b]].rng) : 0.0;
        k_sample(m->K, toks, lps, logits, B, V, sp->temperature, sp->top_p, sp->top_k, us);
        for (int b = 0; b < B; b++) {
            if (!is_prompt[b]) {
                push(g, who[b], toks[b], lps[b]);
                continue;
            }
            /* a new group: its other samples copy the prompt's cache and sample from the same logits */
            const int i0 = who[b];
            const struct kv_cache *pc = g->slots[g->tr[i0].slot].kc;
            for (int s = 1; s < n; s++) {
                const int i = i0 + s;
                struct kv_cache *kc = g->slots[take_slot(g, i)].kc;
                kv_cache_copy(m, kc, pc);
                const double u = sp->temperature > 0 ? rng_uniform(&g->tr[i].rng) : 0.0;
                int32_t tok;
                float lp;
                k_sample(m->K, &tok, &lp, logits + (size_t)b * V, 1, V, sp->temperature, sp->top_p, sp->top_k, &u);
                push(g, i, tok, lp);
            }
            push(g, i0, toks[b], lps[b]); /* last: its slot's cache was the others' source */
        }
        if (should_pause && g->done < total && should_pause(ud))
            break; /* a newer version: every trajectory stops where it is, its turn with the environment goes on */
    }
    const int open = total - g->done;
    g->pause_at = NULL;
    g->phases++;
    return open;
}

void gen_multi_turn_end(struct mt_run *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->total; i++)
        if (g->has_held[i])
            free(g->held[i].ids);
    if (g->slab)
        kv_slab_free(g->slab);
    free(g->tr), free(g->slots), free(g->batch), free(g->ntok), free(g->who), free(g->is_prompt), free(g->toks),
        free(g->lps), free(g->us), free(g->cat), free(g->held), free(g->has_held), free(g->messages), free(g->extra),
        free(g->agent);
    free(g);
}

void gen_generate_multi_turn(struct model *m, struct turn_env *env, const int32_t *const *prompts,
                             const int *prompt_lens, const char *const *messages, const char *const *extra,
                             const char *const *agent, int n_prompts, const struct gen_params *gp,
                             struct gen_output *out, struct turn_summary *sums, struct multi_turn_stats *st)
{
    struct mt_run *g =
        gen_multi_turn_begin(m, env, prompts, prompt_lens, messages, extra, agent, n_prompts, gp, out, sums, st);
    gen_multi_turn_phase(g, NULL, NULL, NULL);
    gen_multi_turn_end(g);
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
