#include "generate.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/clock.h"
#include "kernels/kernels.h"
#include "common/config.h"
#include "common/log.h"
#include "worker/gen/group_env.h"
#include "worker/model/model_generate.h"
#include "worker/rewards/reward.h"
#include "worker/rewards/reward_model.h"
#include "worker/tokenizer/tokenizer.h"

void gen_ctx_init(struct gen_ctx *r, const struct grpo_config *cfg, struct model *policy, const struct tokenizer *tok,
                  struct reward_fn *reward)
{
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    r->policy = policy;
    r->tok = tok;
    r->reward = reward;
    r->greedy_baseline = cfg && strcmp(cfg->alg_adv_estimator, "remax") == 0;
    r->reward_parts = cfg && strcmp(cfg->alg_adv_estimator, "gdpo") == 0;
    if (cfg && cfg->rollout_ignore_eos) /* every response runs to data.max_response_length */
        return;
    if (tokenizer_eos_id(tok) >= 0)
        r->stop_ids[r->n_stop++] = tokenizer_eos_id(tok);
    int im_end = tokenizer_token_id(tok, "<|im_end|>");
    if (im_end >= 0 && (r->n_stop == 0 || im_end != r->stop_ids[0]))
        r->stop_ids[r->n_stop++] = im_end;
}

int gen_ctx_load_reward_model(struct gen_ctx *r, char *err, size_t errlen)
{
    const struct grpo_config *c = r->cfg;
    if (!c->rm_enable)
        return 0;
    if (!c->rm_model_path || !c->rm_model_path[0])
        return error_set(err, errlen, KEY_rm_enable " is true but " KEY_rm_model_path " is empty");
    r->rm = reward_model_load(c->rm_model_path, err, errlen);
    if (!r->rm)
        return -1;
    if (!reward_model_tokenizer(r->rm)) {
        reward_model_free(r->rm);
        r->rm = NULL;
        return error_set(err, errlen,
                         KEY_rm_model_path ": %s has no tokenizer.json (responses are re-encoded "
                                           "with the reward model's tokenizer)",
                         c->rm_model_path);
    }
    log_info("reward", "reward model %s scores every response%s", c->rm_model_path,
             c->rm_rule_reward_weight != 0 ? ", added to the rule scores with " KEY_rm_rule_reward_weight : "");
    return 0;
}

bool gen_multi_turn(const struct grpo_config *c)
{
    return c->rollout_multi_turn_enable || strcmp(c->rollout_agent_default_agent_loop, "tool_agent") == 0;
}

/* The program's turn environment factory, or NULL with err. */
static const struct turn_env_factory *factory(char *err, size_t errlen)
{
    const struct turn_env_factory *f = gen_turn_env_factory();
    if (!f)
        error_set(err, errlen,
                  "multi-turn rollouts (" KEY_rollout_multi_turn_enable ") are not available "
                  "in this program");
    return f;
}

int gen_tools_json(const struct grpo_config *c, char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!gen_multi_turn(c))
        return 0;
    const struct turn_env_factory *f = factory(err, errlen);
    if (!f)
        return -1;
    *out = f->tools_json(c, err, errlen);
    return *out ? 0 : -1;
}

int gen_ctx_load_env(struct gen_ctx *r, struct comm *group, bool head, char *err, size_t errlen)
{
    if (!gen_multi_turn(r->cfg) || r->env)
        return 0;
    const struct turn_env_factory *f = factory(err, errlen);
    if (!f)
        return -1;
    if (!group && (r->policy->sh.tp || r->policy->sh.pp))
        check_failf(__FILE__, __LINE__, "multi-turn rollouts on a split model need the group that generates as one");
    struct turn_env *real = NULL;
    if ((!group || head) && !(real = f->create(r->cfg, r->tok, err, errlen)))
        return -1;
    r->env = group ? gen_group_env_create(real, f->destroy, group, head) : real;
    r->env_destroy = group ? gen_group_env_destroy : NULL;
    r->mt = xcalloc(1, sizeof *r->mt);
    return 0;
}

int gen_ctx_env_regroup(struct gen_ctx *r, struct comm *group, bool head, char *err, size_t errlen)
{
    if (!r->env || (!group && r->env_destroy != gen_group_env_destroy))
        return 0;
    const struct turn_env_factory *f = factory(err, errlen);
    if (!f)
        return -1;
    if (r->env_destroy != gen_group_env_destroy) { /* a rank that generated alone joins a group */
        r->env = gen_group_env_create(r->env, f->destroy, group, head);
        r->env_destroy = gen_group_env_destroy;
    }
    if (gen_group_env_regroup(r->env, group, head)) { /* a peer that heads its group now: the tools start here */
        struct turn_env *real = f->create(r->cfg, r->tok, err, errlen);
        if (!real)
            return -1;
        gen_group_env_set_inner(r->env, real, f->destroy);
    }
    return 0;
}

void gen_ctx_release(struct gen_ctx *r)
{
    if (r->env)
        (r->env_destroy ? r->env_destroy : gen_turn_env_factory()->destroy)(r->env);
    r->env = NULL;
    free(r->mt);
    r->mt = NULL;
    reward_model_free(r->rm);
    r->rm = NULL;
}

size_t gen_kv_budget(struct model *policy, double utilization)
{
    const size_t total = kctx_device_bytes(policy->K);
    if (!total)
        return 0;
    const double want = utilization * (double)total, used = (double)policy->K->mem.allocated;
    return want > used ? (size_t)(want - used) : 1; /* 1: nothing left, one group at a time */
}

/* Generate gp->n_samples responses for each prompt into out (n_prompts x n_samples): multi-turn through the
 * environment when one of the prompts is a tool agent's (every prompt of the call then, its single-turn ones ending
 * at their first turn; the summaries returned, malloc'd, what was measured added to mt), else NULL. */
static struct turn_summary *gen_responses(const struct gen_ctx *r, const struct prompt_item *const *prompts,
                                          int n_prompts, const struct gen_params *gp, struct gen_output *out,
                                          struct multi_turn_stats *mt)
{
    const int total = n_prompts * gp->n_samples;
    const int32_t **ids = xmalloc((size_t)(n_prompts ? n_prompts : 1) * sizeof *ids);
    int *lens = xmalloc((size_t)(n_prompts ? n_prompts : 1) * sizeof *lens);
    for (int p = 0; p < n_prompts; p++) {
        ids[p] = prompts[p]->ids;
        lens[p] = prompts[p]->len;
    }
    struct turn_summary *sums = NULL;
    bool multi = false;
    for (int p = 0; r->env && p < n_prompts; p++)
        multi |= prompts[p]->tool_agent;
    if (multi) {
        const char **msgs = xmalloc((size_t)n_prompts * sizeof *msgs),
                   **extra = xmalloc((size_t)n_prompts * sizeof *extra);
        const char **agent = xmalloc((size_t)n_prompts * sizeof *agent);
        for (int p = 0; p < n_prompts; p++) {
            msgs[p] = prompts[p]->messages_json;
            extra[p] = prompts[p]->extra_info;
            agent[p] = prompts[p]->tool_agent ? "tool_agent" : "single_turn_agent";
        }
        sums = xcalloc((size_t)(total ? total : 1), sizeof *sums);
        gen_generate_multi_turn(r->policy, r->env, ids, lens, msgs, extra, agent, n_prompts, gp, out, sums, mt);
        free(msgs), free(extra), free(agent);
    } else if (n_prompts > 0) {
        model_generate(r->policy, ids, lens, n_prompts, gp, out);
    }
    free(ids), free(lens);
    return sums;
}

/* A response's reward from its rule score: the rule scorers' weighted by reward_model.rule_reward_weight (with a
 * reward model) plus the reward model's, into *raw; returned with DAPO's overlong penalty added. */
static double final_score(const struct gen_ctx *r, const struct prompt_item *p, const char *text, int resp_len,
                          double rule, double *raw)
{
    const struct grpo_config *c = r->cfg;
    double s = (r->rm ? c->rm_rule_reward_weight : 1.0) * rule;
    if (r->rm)
        s += reward_model_score_text(r->rm, p->text, text, (int)c->rm_max_length);
    *raw = s;
    if (c->rm_overlong_enable)
        s += reward_overlong_penalty(
            resp_len,
            (int)(c->rm_reward_kwargs_max_resp_len ? c->rm_reward_kwargs_max_resp_len : c->data_max_response_length),
            (int)c->rm_overlong_len, c->rm_overlong_penalty_factor);
    return s;
}

/* ReMax's baseline (verl's reward_baselines): one greedy response to each prompt (temperature 0, top_p 1, no top_k:
 * verl's apply_greedy_sampling_params), scored as the sampled ones are; base[p] gets its reward. */
static void greedy_baselines(const struct gen_ctx *r, const struct prompt_item *const *prompts, int n_prompts,
                             const struct gen_params *sampled, double *base, double *t_gen, double *t_reward)
{
    double t0 = clock_now_s();
    struct gen_params gp = *sampled;
    gp.sampling = (struct sampler_params){0.0f, 1.0f, -1};
    gp.n_samples = 1;
    gp.first_stream = 0; /* greedy: no draw */
    gp.record_routes = false;
    struct gen_output *out = xcalloc((size_t)(n_prompts ? n_prompts : 1), sizeof *out);
    struct multi_turn_stats scratch = {0}; /* the baseline's turns count in no rollout metric */
    struct turn_summary *sums = gen_responses(r, prompts, n_prompts, &gp, out, &scratch);
    *t_gen += clock_now_s() - t0;
    if (r->unscored) { /* generated with the group; nothing scored here */
        for (int p = 0; p < n_prompts; p++) {
            model_gen_output_free(&out[p]);
            if (sums)
                gen_turn_summary_free(&sums[p]);
        }
        free(out), free(sums);
        return;
    }
    t0 = clock_now_s();
    struct reward_item *items = xcalloc((size_t)(n_prompts ? n_prompts : 1), sizeof *items);
    double *rule = xcalloc((size_t)(n_prompts ? n_prompts : 1), sizeof *rule);
    char **text = xcalloc((size_t)(n_prompts ? n_prompts : 1), sizeof *text);
    for (int p = 0; p < n_prompts; p++) {
        text[p] = tokenizer_decode(r->tok, out[p].tokens, (size_t)out[p].len, true);
        items[p] = (struct reward_item){prompts[p]->data_source, text[p], prompts[p]->ground_truth,
                                        sums && sums[p].reward_json ? sums[p].reward_json : prompts[p]->extra_info};
    }
    if (n_prompts > 0 && (!r->rm || r->cfg->rm_rule_reward_weight != 0))
        reward_score_batch(r->reward, items, n_prompts, rule, NULL);
    for (int p = 0; p < n_prompts; p++) {
        double raw;
        base[p] = final_score(r, prompts[p], text[p], out[p].len, rule[p], &raw);
        free(text[p]);
        model_gen_output_free(&out[p]);
        if (sums)
            gen_turn_summary_free(&sums[p]);
    }
    *t_reward += clock_now_s() - t0;
    free(items), free(rule), free(text), free(out), free(sums);
}

/* The generation parameters of a call: the configuration's, the call's sampling, seed and first RNG stream. */
static struct gen_params gen_params_of(const struct gen_ctx *r, int first_group, const struct sampler_params *sp, int n,
                                       uint64_t seed)
{
    const struct grpo_config *c = r->cfg;
    struct gen_params gp = {
        .sampling = *sp,
        .max_new_tokens = (int)c->data_max_response_length,
        .n_samples = n,
        .max_batch = (int)c->rollout_max_num_seqs,
        .stop_ids = r->stop_ids,
        .n_stop = r->n_stop,
        .seed = seed,
        .first_stream = (uint64_t)first_group * (uint64_t)n,
        .kv_budget = gen_kv_budget(r->policy, c->rollout_gpu_memory_utilization),
        .record_routes = config_records_routes(c),
    };
    return gp;
}

/* Score the generated responses out (n_prompts x n; their arrays go to the batch) into b as groups first_group on;
 * ReMax's greedy baselines generated first. */
static void score_into(const struct gen_ctx *r, const struct prompt_item *const *prompts, const int *uids,
                       int n_prompts, int first_group, int n, const struct gen_params *gpp, struct gen_output *out,
                       struct turn_summary *sums, struct step_batch *b, double *t_gen, double *t_reward)
{
    const struct grpo_config *c = r->cfg;
    const struct gen_params gp = *gpp;
    const int total = n_prompts * n;
    double t0;
    double *base = NULL;
    if (r->greedy_baseline) {
        base = xcalloc((size_t)(n_prompts ? n_prompts : 1), sizeof *base);
        greedy_baselines(r, prompts, n_prompts, &gp, base, t_gen, t_reward);
    }
    t0 = clock_now_s();
    step_batch_reserve(b, total);
    struct reward_item *items = xcalloc((size_t)(total ? total : 1), sizeof *items);
    double *scores = xcalloc((size_t)(total ? total : 1), sizeof *scores);
    const int np = r->reward_parts && !r->unscored ? reward_num_parts(r->reward) : 0; /* gdpo's reward components */
    double *parts = np ? xcalloc((size_t)(total ? total : 1) * (size_t)np, sizeof *parts) : NULL;
    const int first_seq = b->n_seq;
    for (int p = 0; p < n_prompts; p++) {
        int g = b->n_groups++;
        b->group_prompt[g] = prompts[p]; // NOLINT(clang-analyzer-core.NullDereference): reserved above
        b->group_uid[g] = uids[p];
        for (int s = 0; s < n; s++) {
            struct gen_output *o = &out[p * n + s];
            int i = b->n_seq++;
            struct rollout_seq *rs = &b->seqs[i];
            memset(rs, 0, sizeof *rs);
            rs->group = g;
            rs->gidx = (first_group + p) * n + s;
            rs->prompt = prompts[p]->ids;
            rs->prompt_len = prompts[p]->len;
            rs->resp = o->tokens;
            rs->resp_len = o->len;
            rs->gen_logp = o->logps;
            rs->stopped = o->stopped;
            rs->routes = o->routes; /* the batch owns it now */
            rs->routes_w = o->routes ? r->policy->cfg.n_layers * r->policy->cfg.n_experts_per_tok : 0;
            rs->reward_baseline = base ? base[p] : 0.0;
            b->resp_text[i] = tokenizer_decode(r->tok, o->tokens, (size_t)o->len, true);
            items[p * n + s] = (struct reward_item){prompts[p]->data_source, b->resp_text[i], prompts[p]->ground_truth,
                                                    prompts[p]->extra_info};
            if (sums) {
                const struct turn_summary *ts = &sums[p * n + s];
                bool model_only = true;
                for (int k = 0; k < o->len; k++)
                    model_only &= o->mask[k] != 0;
                rs->mask = model_only ? NULL : o->mask; /* the batch owns it now */
                if (model_only)
                    free(o->mask);
                o->mask = NULL;
                rs->num_turns = ts->turns;
                rs->tool_calls = ts->tool_calls;
                rs->tool_errors = ts->tool_errors;
                rs->tool_seconds = (float)ts->tool_seconds;
                rs->tokens_mismatch = ts->mismatch;
                rs->template_errors = ts->template_errors;
                rs->resumed_turns = ts->resumed_turns;
                rs->prefill_tokens = ts->prefill_tokens;
                rs->evictions = ts->evictions;
                rs->messages_json = ts->messages_json;
                if (ts->reward_json) /* the scorer sees num_turns and the tools' rewards (verl's extra_info) */
                    items[p * n + s].extra_info_json = ts->reward_json;
            }
        }
    }
    /* the rule scorers; with a reward model, their scores weighted by rule_reward_weight (0: not run, unless gdpo needs
     * the scorer's components) */
    if (total > 0 && !r->unscored && (!r->rm || c->rm_rule_reward_weight != 0 || parts))
        reward_score_batch_parts(r->reward, items, total, scores, NULL, parts);
    for (int k = 0; k < total && !r->unscored; k++) {
        struct rollout_seq *rs = &b->seqs[first_seq + k];
        rs->score =
            final_score(r, prompts[k / n], b->resp_text[first_seq + k], rs->resp_len, scores[k], &rs->raw_score);
        rs->acc = reward_accuracy(r->reward, &items[k]);
        if (parts) {
            rs->n_parts = np;
            rs->reward_parts = xmalloc((size_t)np * sizeof(double));
            memcpy(rs->reward_parts, parts + (size_t)k * np, (size_t)np * sizeof(double));
        }
    }
    *t_reward += clock_now_s() - t0;
    for (int k = 0; sums && k < total; k++)
        free(sums[k].reward_json); /* messages_json went to the sequence */
    free(sums);
    free(items), free(scores), free(out), free(base), free(parts);
}

void gen_generate_and_score(const struct gen_ctx *r, const struct prompt_item *const *prompts, const int *uids,
                            int n_prompts, int first_group, const struct sampler_params *sp, int n, uint64_t seed,
                            struct step_batch *b, double *t_gen, double *t_reward)
{
    double t0 = clock_now_s();
    const struct gen_params gp = gen_params_of(r, first_group, sp, n, seed);
    const int total = n_prompts * n;
    struct gen_output *out = xcalloc((size_t)(total ? total : 1), sizeof *out);
    struct turn_summary *sums = gen_responses(r, prompts, n_prompts, &gp, out, r->mt);
    *t_gen += clock_now_s() - t0;
    score_into(r, prompts, uids, n_prompts, first_group, n, &gp, out, sums, b, t_gen, t_reward);
}

void gen_unit_begin(const struct gen_ctx *r, struct gen_unit *u, const struct prompt_item *const *prompts,
                    const int *uids, int n_prompts, int first_group, const struct sampler_params *sp, int n,
                    uint64_t seed)
{
    *u =
        (struct gen_unit){.prompts = prompts, .uids = uids, .n_prompts = n_prompts, .first_group = first_group, .n = n};
    u->gp = gen_params_of(r, first_group, sp, n, seed);
    const int total = n_prompts * n;
    u->out = xcalloc((size_t)(total ? total : 1), sizeof *u->out);
    u->versions = xcalloc((size_t)(total ? total : 1), sizeof *u->versions);
    u->ids = xmalloc((size_t)(n_prompts ? n_prompts : 1) * sizeof *u->ids);
    u->lens = xmalloc((size_t)(n_prompts ? n_prompts : 1) * sizeof *u->lens);
    for (int p = 0; p < n_prompts; p++) {
        u->ids[p] = prompts[p]->ids;
        u->lens[p] = prompts[p]->len;
    }
    bool multi = false; /* as gen_responses decides */
    for (int p = 0; r->env && p < n_prompts; p++)
        multi |= prompts[p]->tool_agent;
    if (!multi)
        return;
    const size_t np = (size_t)(n_prompts ? n_prompts : 1);
    u->msgs = xmalloc(np * sizeof *u->msgs), u->extra = xmalloc(np * sizeof *u->extra);
    u->agent = xmalloc(np * sizeof *u->agent);
    for (int p = 0; p < n_prompts; p++) {
        u->msgs[p] = prompts[p]->messages_json;
        u->extra[p] = prompts[p]->extra_info;
        u->agent[p] = prompts[p]->tool_agent ? "tool_agent" : "single_turn_agent";
    }
    u->sums = xcalloc((size_t)(total ? total : 1), sizeof *u->sums);
    u->mtr = gen_multi_turn_begin(r->policy, r->env, u->ids, u->lens, u->msgs, u->extra, u->agent, n_prompts, &u->gp,
                                  u->out, u->sums, r->mt);
}

int gen_unit_phase(const struct gen_ctx *r, struct gen_unit *u, int64_t version, const int *pause_at,
                   bool (*should_pause)(void *ud), void *ud)
{
    const double t0 = clock_now_s();
    const int total = u->n_prompts * u->n;
    struct gen_params gp = u->gp;
    gp.resume = u->phases > 0;
    gp.pause_at = pause_at;
    gp.should_pause = should_pause;
    gp.pause_ud = ud;
    int *before = xmalloc((size_t)(total ? total : 1) * sizeof(int));
    for (int i = 0; i < total; i++)
        before[i] = u->phases > 0 ? u->out[i].len : 0;
    const int open = u->mtr             ? gen_multi_turn_phase(u->mtr, pause_at, should_pause, ud)
                     : u->n_prompts > 0 ? model_generate_phase(r->policy, u->ids, u->lens, u->n_prompts, &gp, u->out)
                                        : 0;
    if (u->phases == 0)
        u->version_first = version;
    for (int i = 0; i < total; i++) {
        if (u->out[i].len > before[i] && !u->versions[i])
            u->versions[i] = xmalloc((size_t)(u->gp.max_new_tokens + 1) * sizeof(int64_t));
        for (int t = before[i]; t < u->out[i].len; t++)
            u->versions[i][t] = version;
    }
    free(before);
    u->phases++;
    u->t_gen += clock_now_s() - t0;
    return open;
}

void gen_unit_finish(const struct gen_ctx *r, struct gen_unit *u, struct step_batch *b, double *t_gen, double *t_reward)
{
    const int total = u->n_prompts * u->n, first_seq = b->n_seq;
    *t_gen += u->t_gen;
    gen_multi_turn_end(u->mtr); /* (the summaries go to score_into, which frees them) */
    u->mtr = NULL;
    score_into(r, u->prompts, u->uids, u->n_prompts, u->first_group, u->n, &u->gp, u->out, u->sums, b, t_gen, t_reward);
    u->sums = NULL;
    free(u->msgs), free(u->extra), free(u->agent);
    u->msgs = u->extra = u->agent = NULL;
    /* each sequence's versions: kept only where they are not all the first */
    for (int k = 0; k < total; k++) {
        struct rollout_seq *rs = &b->seqs[first_seq + k];
        rs->version_first = u->version_first;
        bool mixed = false;
        for (int t = 0; u->versions[k] && t < rs->resp_len; t++)
            mixed |= u->versions[k][t] != u->version_first;
        if (mixed) {
            rs->versions = u->versions[k];
            u->versions[k] = NULL;
        }
    }
    for (int k = 0; k < total; k++)
        free(u->versions[k]);
    free(u->versions), free(u->ids), free(u->lens);
    u->versions = NULL;
    u->out = NULL; /* score_into freed it */
}
