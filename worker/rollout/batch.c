#include "batch.h"
#include "common/log.h"
#include "worker/rewards/reward_model.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "worker/model/generate.h"
#include "worker/rewards/reward.h"
#include "worker/tokenizer/tokenizer.h"

uint64_t rollout_step_seed(uint64_t seed, int64_t step, uint64_t salt)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)step + 1) * 0xbf58476d1ce4e5b9ull ^ salt;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 29);
}

void rollout_ctx_init(struct rollout_ctx *r, const struct grpo_config *cfg, struct model *policy,
                      const struct tokenizer *tok, struct reward_fn *reward)
{
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    r->policy = policy;
    r->tok = tok;
    r->reward = reward;
    if (tokenizer_eos_id(tok) >= 0)
        r->stop_ids[r->n_stop++] = tokenizer_eos_id(tok);
    int im_end = tokenizer_token_id(tok, "<|im_end|>");
    if (im_end >= 0 && (r->n_stop == 0 || im_end != r->stop_ids[0]))
        r->stop_ids[r->n_stop++] = im_end;
}

int rollout_ctx_load_reward_model(struct rollout_ctx *r, char *err, size_t errlen)
{
    const struct grpo_config *c = r->cfg;
    if (!c->rm_enable)
        return 0;
    if (!c->rm_model_path || !c->rm_model_path[0])
        return error_set(err, errlen, "reward_model.enable is true but reward_model.model.path is empty");
    r->rm = reward_model_load(c->rm_model_path, err, errlen);
    if (!r->rm)
        return -1;
    if (!reward_model_tokenizer(r->rm)) {
        reward_model_free(r->rm);
        r->rm = NULL;
        return error_set(err, errlen,
                         "reward_model.model.path: %s has no tokenizer.json (responses are re-encoded "
                         "with the reward model's tokenizer)",
                         c->rm_model_path);
    }
    log_info("reward", "reward model %s scores every response%s", c->rm_model_path,
             c->rm_rule_reward_weight != 0 ? ", added to the rule scores with reward_model.rule_reward_weight" : "");
    return 0;
}

void rollout_ctx_release(struct rollout_ctx *r)
{
    reward_model_free(r->rm);
    r->rm = NULL;
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

void rollout_generate_and_score(const struct rollout_ctx *r, const struct prompt_item *const *prompts, const int *uids,
                                int n_prompts, int first_group, const struct sampler_params *sp, int n, uint64_t seed,
                                struct step_batch *b, double *t_gen, double *t_reward)
{
    const struct grpo_config *c = r->cfg;
    double t0 = clock_now_s();
    const int32_t **ids = xmalloc((size_t)(n_prompts ? n_prompts : 1) * sizeof *ids);
    int *lens = xmalloc((size_t)(n_prompts ? n_prompts : 1) * sizeof *lens);
    for (int p = 0; p < n_prompts; p++) {
        ids[p] = prompts[p]->ids;
        lens[p] = prompts[p]->len;
    }
    struct gen_params gp = {
        .sampling = *sp,
        .max_new_tokens = (int)c->data_max_response_length,
        .n_samples = n,
        .max_batch = (int)c->rollout_max_num_seqs,
        .stop_ids = r->stop_ids,
        .n_stop = r->n_stop,
        .seed = seed,
        .first_stream = (uint64_t)first_group * (uint64_t)n,
    };
    const int total = n_prompts * n;
    struct gen_output *out = xcalloc((size_t)(total ? total : 1), sizeof *out);
    if (n_prompts > 0)
        generate(r->policy, ids, lens, n_prompts, &gp, out);
    *t_gen += clock_now_s() - t0;
    t0 = clock_now_s();
    step_batch_reserve(b, total);
    struct reward_item *items = xcalloc((size_t)(total ? total : 1), sizeof *items);
    double *scores = xcalloc((size_t)(total ? total : 1), sizeof *scores);
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
            b->resp_text[i] = tokenizer_decode(r->tok, o->tokens, (size_t)o->len, true);
            items[p * n + s] = (struct reward_item){prompts[p]->data_source, b->resp_text[i], prompts[p]->ground_truth,
                                                    prompts[p]->extra_info};
        }
    }
    /* the rule scorers; with a reward model, their scores weighted by rule_reward_weight (0: not run) */
    const double rule_w = r->rm ? c->rm_rule_reward_weight : 1.0;
    if (total > 0 && rule_w != 0)
        reward_score_batch(r->reward, items, total, scores, NULL);
    for (int k = 0; k < total; k++) {
        struct rollout_seq *rs = &b->seqs[first_seq + k];
        double s = rule_w * scores[k];
        if (r->rm)
            s += reward_model_score_text(r->rm, prompts[k / n]->text, b->resp_text[first_seq + k],
                                         (int)c->rm_max_length);
        rs->raw_score = rs->score = s;
        rs->acc = reward_accuracy(r->reward, &items[k]);
        if (c->rm_overlong_enable)
            rs->score += reward_overlong_penalty(rs->resp_len, (int)c->data_max_response_length,
                                                 (int)c->rm_overlong_len, c->rm_overlong_penalty_factor);
    }
    *t_reward += clock_now_s() - t0;
    free(items), free(scores), free(out), free(ids), free(lens);
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
