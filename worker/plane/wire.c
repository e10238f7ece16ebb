#include "wire.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "dispatch.h"
#include "proto/protocol.h"
#include "proto/transport.h"
#include "common/config_key_names.h"

/* A response mask that says nothing: none, or every byte 1. */
static bool all_ones(const uint8_t *mask, int n)
{
    for (int t = 0; mask && t < n; t++)
        if (mask[t] != 1)
            return false;
    return true;
}

uint8_t *wire_pack_batch(const struct wire_header *h, const struct step_batch *b, const int *groups, int n_groups,
                         struct plane_cred *cred, size_t *len)
{
    int n_seq = 0;
    for (int i = 0; i < b->n_seq; i++)
        for (int g = 0; g < n_groups; g++)
            n_seq += b->seqs[i].group == groups[g];
    Grpo__RolloutBatch rb = GRPO__ROLLOUT_BATCH__INIT;
    rb.step = h->step;
    rb.from_rank = h->from_rank;
    rb.to_dp_rank = h->to_dp;
    rb.seq_no = h->seq_no;
    rb.policy_version = h->policy_version;
    rb.groups_in_step = h->groups_in_step;
    rb.samples_per_prompt = h->n;
    rb.gen_seconds = h->gen_s;
    rb.reward_seconds = h->reward_s;
    rb.idle_seconds = h->idle_s;
    rb.peak_rss_gb = h->peak_rss_gb;
    rb.wait_weights_seconds = h->wait_weights_s;
    rb.unit = h->unit;
    rb.units = h->units;
    Grpo__Sequence *seqs = xcalloc((size_t)(n_seq ? n_seq : 1), sizeof *seqs);
    Grpo__Sequence **ptrs = xcalloc((size_t)(n_seq ? n_seq : 1), sizeof *ptrs);
    int k = 0;
    for (int g = 0; g < n_groups; g++)
        for (int i = 0; i < b->n_seq; i++) {
            const struct rollout_seq *s = &b->seqs[i];
            if (s->group != groups[g])
                continue;
            Grpo__Sequence *q = &seqs[k];
            grpo__sequence__init(q);
            q->uid = b->group_uid[s->group];
            q->n_prompt_ids = (size_t)s->prompt_len;
            q->prompt_ids = (int32_t *)s->prompt;
            q->n_response_ids = (size_t)s->resp_len;
            q->response_ids = s->resp;
            q->n_old_log_probs = (size_t)s->resp_len;
            q->old_log_probs = s->gen_logp;
            q->reward = (float)s->score;
            q->raw_reward = (float)s->raw_score;
            q->acc = (float)s->acc;
            q->data_source = (char *)b->group_prompt[s->group]->data_source;
            q->group_index = s->gidx / h->n;
            q->sample_index = s->gidx % h->n;
            q->stopped = s->stopped;
            if (s->routes) { /* little-endian uint16 (rollout_seq_tokens, routes_w) */
                const size_t n = (size_t)rollout_seq_tokens(s) * s->routes_w;
                uint8_t *r = xmalloc(2 * (n ? n : 1));
                for (size_t i = 0; i < n; i++)
                    r[2 * i] = (uint8_t)(s->routes[i] & 0xff), r[2 * i + 1] = (uint8_t)(s->routes[i] >> 8);
                q->routed_experts = (ProtobufCBinaryData){.len = 2 * n, .data = r};
            }
            if (!all_ones(s->mask, s->resp_len)) /* all ones travels as none */
                q->response_mask = (ProtobufCBinaryData){.len = (size_t)s->resp_len, .data = s->mask};
            q->num_turns = s->num_turns;
            q->tool_calls = s->tool_calls;
            q->tool_errors = s->tool_errors;
            q->tool_seconds = s->tool_seconds;
            q->tokens_mismatch = s->tokens_mismatch;
            q->template_errors = s->template_errors;
            q->resumed_turns = s->resumed_turns;
            q->prefill_tokens = s->prefill_tokens;
            q->evictions = s->evictions;
            if (s->messages_json)
                q->messages = s->messages_json;
            q->reward_baseline = s->reward_baseline;
            if (s->reward_parts) {
                q->n_reward_parts = (size_t)s->n_parts;
                q->reward_parts = s->reward_parts;
            }
            if (s->versions) { /* partial rollout: each token's version */
                q->n_token_versions = (size_t)s->resp_len;
                q->token_versions = s->versions;
            }
            ptrs[k++] = q;
        }
    rb.n_sequences = (size_t)k;
    rb.sequences = ptrs;
    Grpo__Envelope env = GRPO__ENVELOPE__INIT;
    env.body_case = GRPO__ENVELOPE__BODY_ROLLOUT;
    env.rollout = &rb;
    uint8_t *out = CHECK_ALLOC(plane_pack_request(&env, cred, len));
    for (int i = 0; i < k; i++)
        free(seqs[i].routed_experts.data);
    free(seqs);
    free(ptrs);
    return out;
}

void wire_limits_set_routes(struct wire_limits *lim, const struct model_config *c, bool recorded)
{
    const bool on = recorded && c->n_experts > 0;
    lim->routes_layers = on ? c->n_layers : 0;
    lim->routes_k = on ? c->n_experts_per_tok : 0;
    lim->routes_experts = on ? c->n_experts : 0;
}

/* A sequence's recorded experts (routed_experts) against the run's model; NULL when fine, else why. */
static const char *check_routes(const Grpo__Sequence *q, const struct wire_limits *lim, char *why, size_t whylen)
{
    const size_t len = q->routed_experts.len, L = (size_t)lim->routes_layers, k = (size_t)lim->routes_k;
    if (!L) {
        if (len)
            return snprintf(why, whylen,
                            "routed_experts carried (%zu bytes), but this trainer's model records no routing (a "
                            "dense model, or routing replay off here but on at the rollout rank?)",
                            len),
                   why;
        return NULL;
    }
    const size_t tokens = (size_t)lim->prompts->items[q->uid].len + q->n_response_ids - 1, want = 2 * tokens * L * k;
    if (len != want)
        return snprintf(why, whylen,
                        "routed_experts holds %zu bytes, not %zu (%zu tokens x %zu layers x %zu experts x 2: routing "
                        "replay off at the rollout rank, or another model?)",
                        len, want, tokens, L, k),
               why;
    const uint8_t *d = q->routed_experts.data;
    for (size_t s = 0; s < tokens * L; s++)
        for (size_t j = 0; j < k; j++) {
            const int e = d[2 * (s * k + j)] | d[2 * (s * k + j) + 1] << 8;
            bool dup = false;
            for (size_t i = 0; i < j; i++)
                dup |= e == (d[2 * (s * k + i)] | d[2 * (s * k + i) + 1] << 8);
            if (e >= lim->routes_experts || dup)
                return snprintf(why, whylen, "routed_experts of token %zu, layer %zu: expert %d is %s", s / L, s % L, e,
                                dup ? "chosen twice" : "not one of the model's"),
                       why;
        }
    return NULL;
}

/* A sequence's response_mask: none, or one byte (0 or 1) per response token with at least one 1; NULL when fine,
 * else why. */
static const char *check_mask(const Grpo__Sequence *q, char *why, size_t whylen)
{
    const size_t len = q->response_mask.len;
    if (!len)
        return NULL;
    if (len != q->n_response_ids)
        return snprintf(why, whylen, "response_mask holds %zu bytes for %zu response tokens (one per token)", len,
                        q->n_response_ids),
               why;
    size_t ones = 0;
    for (size_t t = 0; t < len; t++) {
        if (q->response_mask.data[t] > 1)
            return snprintf(why, whylen, "response_mask byte %zu is %u, not 0 (put in from outside) or 1 (the model's)",
                            t, (unsigned)q->response_mask.data[t]),
                   why;
        ones += q->response_mask.data[t];
    }
    if (!ones)
        return snprintf(why, whylen,
                        "response_mask marks none of the %zu response tokens as the model's: nothing to train on", len),
               why;
    return NULL;
}

/* the longest conversation a sequence carries for the audit files */
#define WIRE_MAX_MESSAGES_BYTES (1 << 20)

/* A sequence's multi-turn figures and conversation; NULL when fine, else why. */
static const char *check_turns(const Grpo__Sequence *q, char *why, size_t whylen)
{
    if (q->num_turns < 0 || (size_t)q->num_turns > q->n_response_ids + 1)
        return snprintf(why, whylen, "num_turns %d for %zu response tokens (every turn holds a token)", q->num_turns,
                        q->n_response_ids),
               why;
    if (q->tool_calls < 0 || q->tool_errors < 0 || q->tool_errors > q->tool_calls)
        return snprintf(why, whylen, "tool_calls %d with tool_errors %d", q->tool_calls, q->tool_errors), why;
    if (q->template_errors < 0 || q->resumed_turns < 0 || q->evictions < 0 || q->prefill_tokens < 0 ||
        (size_t)q->resumed_turns > q->n_response_ids)
        return snprintf(why, whylen, "template_errors %d, resumed_turns %d, prefill_tokens %d, evictions %d",
                        q->template_errors, q->resumed_turns, q->prefill_tokens, q->evictions),
               why;
    if (!isfinite(q->tool_seconds) || q->tool_seconds < 0)
        return snprintf(why, whylen, "tool_seconds %g is not a duration", (double)q->tool_seconds), why;
    const size_t len = q->messages ? strlen(q->messages) : 0;
    if (len > WIRE_MAX_MESSAGES_BYTES)
        return snprintf(why, whylen, "messages of %zu bytes (at most %d)", len, WIRE_MAX_MESSAGES_BYTES), why;
    if (len) {
        json_error_t e;
        json_t *m = json_loadb(q->messages, len, 0, &e);
        const bool array = json_is_array(m);
        json_decref(m);
        if (!array)
            return snprintf(why, whylen, "messages is not a JSON array of messages%s%s", m ? "" : ": ",
                            m ? "" : e.text),
                   why;
    }
    return NULL;
}

/* Check one sequence against the run; NULL when fine, else why. */
static const char *check_sequence(const Grpo__Sequence *q, const struct wire_limits *lim, char *why, size_t whylen)
{
    if (q->uid < 0 || q->uid >= lim->prompts->n)
        return snprintf(why, whylen, "uid %lld is not a training prompt (0..%d)", (long long)q->uid,
                        lim->prompts->n - 1),
               why;
    const struct prompt_item *p = &lim->prompts->items[q->uid];
    if ((int)q->n_prompt_ids != p->len || memcmp(q->prompt_ids, p->ids, (size_t)p->len * sizeof(int32_t)) != 0)
        return snprintf(why, whylen,
                        "prompt ids of uid %lld differ from this trainer's (different dataset, tokenizer or "
                        "data.* settings on the rollout rank?)",
                        (long long)q->uid),
               why;
    if (q->group_index < 0 || q->group_index >= lim->groups_in_step)
        return snprintf(why, whylen, "group_index %d is outside the step's %d groups", q->group_index,
                        lim->groups_in_step),
               why;
    if (q->sample_index < 0 || q->sample_index >= lim->n)
        return snprintf(why, whylen, "sample_index %d is outside rollout.n %d", q->sample_index, lim->n), why;
    if (q->n_response_ids == 0) /* generation always holds one (docs/operations.md, "What the data plane refuses") */
        return snprintf(why, whylen,
                        "an empty response (0 tokens): every response holds at least one token (one that stops at "
                        "once, its end-of-sequence token)"),
               why;
    if (q->n_response_ids > (size_t)lim->max_response_length)
        return snprintf(why, whylen, "response of %zu tokens is over " KEY_data_max_response_length " %d",
                        q->n_response_ids, lim->max_response_length),
               why;
    if (q->n_old_log_probs != q->n_response_ids)
        return snprintf(why, whylen, "%zu log-probs for %zu response tokens", q->n_old_log_probs, q->n_response_ids),
               why;
    for (size_t t = 0; t < q->n_response_ids; t++) {
        if (q->response_ids[t] < 0 || q->response_ids[t] >= lim->vocab_size)
            return snprintf(why, whylen, "response token %d is outside the vocabulary (%d)", q->response_ids[t],
                            lim->vocab_size),
                   why;
        if (!isfinite(q->old_log_probs[t]) || q->old_log_probs[t] > 1e-3f)
            return snprintf(why, whylen, "log-prob %g of response token %zu is not a log-probability",
                            (double)q->old_log_probs[t], t),
                   why;
    }
    if (!isfinite(q->reward) || !isfinite(q->raw_reward))
        return snprintf(why, whylen, "reward is not finite"), why;
    if (!isnan(q->acc) && !(q->acc >= 0 && q->acc <= 1))
        return snprintf(why, whylen, "accuracy %g is outside [0, 1]", (double)q->acc), why;
    if (!isfinite(q->reward_baseline))
        return snprintf(why, whylen, "reward_baseline is not finite"), why;
    if (q->n_reward_parts != (size_t)lim->reward_parts)
        return snprintf(why, whylen,
                        "%zu reward components (reward_parts), but this trainer takes %d (" KEY_alg_gdpo_reward_keys " "
                        "with adv_estimator gdpo; a sender older than protocol 1.12 sends none)",
                        q->n_reward_parts, lim->reward_parts),
               why;
    for (size_t k = 0; k < q->n_reward_parts; k++)
        if (!isfinite(q->reward_parts[k]))
            return snprintf(why, whylen, "reward component %zu is not finite", k), why;
    if (check_turns(q, why, whylen))
        return why;
    if (check_mask(q, why, whylen))
        return why;
    return check_routes(q, lim, why, whylen);
}

int wire_unpack_batch(const uint8_t *buf, size_t len, const struct wire_limits *lim, struct wire_header *h,
                      struct step_batch *b, char *why, size_t whylen)
{
    Grpo__Envelope *env = NULL;
    char what[512];
    enum protocol_error pe = protocol_decode(buf, len, GRPO_MAX_MESSAGE_BYTES, &env, what, sizeof what);
    if (pe != PROTOCOL_OK) {
        snprintf(why, whylen, "%s", what);
        if (env)
            protocol_free(env);
        return -1;
    }
    int rc = -1;
    if (lim->auth) { /* before anything else: nobody unauthenticated learns what the trainer checks */
        lim->auth->verified = false;
        enum plane_verdict pv =
            plane_verify_request(lim->auth->v, env, &lim->auth->who, &lim->auth->counter, what, sizeof what);
        lim->auth->old_epoch = pv == PLANE_EPOCH;
        if (pv < 0) {
            snprintf(why, whylen, "%s", what);
            goto out;
        }
        lim->auth->verified = true; /* a repeat of the last batch is taken again: the step's checks drop it */
    }
    if (env->body_case != GRPO__ENVELOPE__BODY_ROLLOUT) {
        snprintf(why, whylen, "a %s message on the data socket (only rollout batches belong here)",
                 protocol_body_name(env->body_case));
        goto out;
    }
    const Grpo__RolloutBatch *rb = env->rollout;
    if (rb->from_rank < 0 || rb->from_rank >= lim->world_size) {
        snprintf(why, whylen, "from_rank %d is not a rank of this run (world %d)", rb->from_rank, lim->world_size);
        goto out;
    }
    if (lim->auth && rb->from_rank != lim->auth->who.rank) {
        snprintf(why, whylen,
                 "from_rank %d, but the batch is authenticated as rank %d's: no process speaks for another",
                 rb->from_rank, lim->auth->who.rank);
        goto out;
    }
    if (rb->to_dp_rank != lim->dp_rank) {
        snprintf(why, whylen, "batch for trainer DP rank %d arrived at DP rank %d", rb->to_dp_rank, lim->dp_rank);
        goto out;
    }
    if (rb->step < 1 || rb->seq_no < 1) {
        snprintf(why, whylen, "step %lld / seq_no %llu: both start at 1", (long long)rb->step,
                 (unsigned long long)rb->seq_no);
        goto out;
    }
    if (lim->async && (rb->policy_version < 0 || rb->policy_version > lim->max_version)) {
        snprintf(why, whylen, "policy_version %lld: the trainers have published versions up to %lld",
                 (long long)rb->policy_version, (long long)lim->max_version);
        goto out;
    }
    if (!lim->async && (rb->policy_version < 0 || rb->policy_version >= rb->step)) {
        snprintf(why, whylen, "policy_version %lld for step %lld: step k is generated with a version 0..k-1",
                 (long long)rb->policy_version, (long long)rb->step);
        goto out;
    }
    const double secs[] = {rb->gen_seconds, rb->reward_seconds, rb->idle_seconds, rb->wait_weights_seconds,
                           rb->peak_rss_gb};
    static const char *const sec_names[] = {"gen_seconds", "reward_seconds", "idle_seconds", "wait_weights_seconds",
                                            "peak_rss_gb"};
    for (int i = 0; i < 5; i++)
        if (!(secs[i] >= 0 && secs[i] <= WIRE_MAX_FIGURE)) { /* NaN fails too */
            snprintf(why, whylen, "%s %g is not a duration or size (0..%g)", sec_names[i], secs[i], WIRE_MAX_FIGURE);
            goto out;
        }
    if (rb->groups_in_step != lim->groups_in_step || rb->samples_per_prompt != lim->n) {
        snprintf(why, whylen,
                 "batch of a %d x %d step, but this run has " KEY_data_train_batch_size " %d x " KEY_rollout_n " %d",
                 rb->groups_in_step, rb->samples_per_prompt, lim->groups_in_step, lim->n);
        goto out;
    }
    if (rb->units != lim->units || rb->unit < 0 || rb->unit >= rb->units) {
        snprintf(why, whylen, "work unit %d of %d, but this run's steps have %d units (one per rollout rank)", rb->unit,
                 rb->units, lim->units);
        goto out;
    }
    int unit_lo, unit_hi;
    dispatch_unit_range(lim->groups_in_step, lim->units, rb->unit, &unit_lo, &unit_hi);
    for (size_t i = 0; i < rb->n_sequences; i++)
        if (rb->sequences[i]->group_index < unit_lo || rb->sequences[i]->group_index >= unit_hi) {
            snprintf(why, whylen, "sequence %zu: group_index %d is outside work unit %d (groups %d..%d)", i,
                     rb->sequences[i]->group_index, rb->unit, unit_lo, unit_hi - 1);
            goto out;
        }
    if (rb->n_sequences > (size_t)lim->groups_in_step * (size_t)lim->n) {
        snprintf(why, whylen, "%zu sequences is more than a whole step holds", rb->n_sequences);
        goto out;
    }
    for (size_t i = 0; i < rb->n_sequences; i++)
        if (check_sequence(rb->sequences[i], lim, what, sizeof what)) {
            snprintf(why, whylen, "sequence %zu: %s", i, what);
            goto out;
        }
    for (size_t i = 0; i < rb->n_sequences; i++) { /* partial rollout's versions: one a token, non-decreasing */
        const Grpo__Sequence *q = rb->sequences[i];
        if (!q->n_token_versions)
            continue;
        if (!lim->async || q->n_token_versions != q->n_response_ids) {
            snprintf(why, whylen, "sequence %zu: %zu token versions for %zu tokens%s", i, q->n_token_versions,
                     q->n_response_ids, lim->async ? "" : " (only fully-async training sends them)");
            goto out;
        }
        for (size_t t = 0; t < q->n_token_versions; t++)
            if (q->token_versions[t] < (t ? q->token_versions[t - 1] : rb->policy_version) ||
                q->token_versions[t] > lim->max_version) {
                snprintf(why, whylen,
                         "sequence %zu: token %zu's version %lld is below the one before it (or the batch's %lld) or "
                         "above the newest published, %lld",
                         i, t, (long long)q->token_versions[t], (long long)rb->policy_version,
                         (long long)lim->max_version);
                goto out;
            }
    }
    /* whole groups: every sample of a group, each once, and one uid per group */
    struct step_batch nb = {0};
    step_batch_reserve(&nb, (int)rb->n_sequences);
    int *group_of = xmalloc((size_t)lim->groups_in_step * sizeof(int));
    for (int g = 0; g < lim->groups_in_step; g++)
        group_of[g] = -1;
    bool *seen = xcalloc((size_t)lim->groups_in_step * (size_t)lim->n, sizeof(bool));
    for (size_t i = 0; i < rb->n_sequences; i++) {
        const Grpo__Sequence *q = rb->sequences[i];
        int gi = q->group_index;
        if (seen[(size_t)gi * lim->n + q->sample_index]) {
            snprintf(why, whylen, "sequence %zu repeats sample %d of group %d", i, q->sample_index, gi);
            goto bad;
        }
        seen[(size_t)gi * lim->n + q->sample_index] = true;
        if (group_of[gi] < 0) {
            group_of[gi] = nb.n_groups;
            nb.group_uid[nb.n_groups] = (int)q->uid;
            nb.group_prompt[nb.n_groups++] = &lim->prompts->items[q->uid];
        } else if (nb.group_uid[group_of[gi]] != (int)q->uid) {
            snprintf(why, whylen, "group %d holds two prompts (uid %d and %lld)", gi, nb.group_uid[group_of[gi]],
                     (long long)q->uid);
            goto bad;
        }
        struct rollout_seq *s = &nb.seqs[nb.n_seq];
        memset(s, 0, sizeof *s);
        s->group = group_of[gi];
        s->gidx = gi * lim->n + q->sample_index;
        s->prompt = lim->prompts->items[q->uid].ids;
        s->prompt_len = lim->prompts->items[q->uid].len;
        s->resp_len = (int)q->n_response_ids;
        s->resp = xmalloc((size_t)s->resp_len * sizeof(int32_t)); /* at least one token (check_sequence) */
        memcpy(s->resp, q->response_ids, (size_t)s->resp_len * sizeof(int32_t));
        s->gen_logp = xmalloc((size_t)s->resp_len * sizeof(float));
        memcpy(s->gen_logp, q->old_log_probs, (size_t)s->resp_len * sizeof(float));
        s->stopped = q->stopped;
        s->score = q->reward;
        s->raw_score = q->raw_reward;
        s->acc = q->acc;
        s->reward_baseline = q->reward_baseline;
        if (q->n_reward_parts) { /* checked: as many as the run's keys */
            s->n_parts = (int)q->n_reward_parts;
            s->reward_parts = xmalloc(q->n_reward_parts * sizeof(double));
            memcpy(s->reward_parts, q->reward_parts, q->n_reward_parts * sizeof(double));
        }
        if (!all_ones(q->response_mask.data, (int)q->response_mask.len)) { /* checked; all ones is no mask */
            s->mask = xmalloc(q->response_mask.len);
            memcpy(s->mask, q->response_mask.data, q->response_mask.len);
        }
        s->num_turns = q->num_turns;
        s->tool_calls = q->tool_calls;
        s->tool_errors = q->tool_errors;
        s->tool_seconds = q->tool_seconds;
        s->tokens_mismatch = q->tokens_mismatch;
        s->template_errors = q->template_errors;
        s->resumed_turns = q->resumed_turns;
        s->prefill_tokens = q->prefill_tokens;
        s->evictions = q->evictions;
        if (q->messages && q->messages[0])
            s->messages_json = xstrdup(q->messages);
        if (q->n_token_versions) { /* checked: one a token */
            s->versions = xmalloc(q->n_token_versions * sizeof(int64_t));
            memcpy(s->versions, q->token_versions, q->n_token_versions * sizeof(int64_t));
        }
        if (q->routed_experts.len) { /* checked: (rollout_seq_tokens, layers x k) */
            const size_t n = q->routed_experts.len / 2;
            s->routes = xmalloc(n * sizeof *s->routes);
            for (size_t i = 0; i < n; i++)
                s->routes[i] = (uint16_t)(q->routed_experts.data[2 * i] | q->routed_experts.data[2 * i + 1] << 8);
            s->routes_w = lim->routes_layers * lim->routes_k;
        }
        nb.resp_text[nb.n_seq++] = NULL;
    }
    for (int g = 0; g < lim->groups_in_step; g++)
        if (group_of[g] >= 0)
            for (int s = 0; s < lim->n; s++)
                if (!seen[(size_t)g * lim->n + s]) {
                    snprintf(why, whylen, "group %d is not whole: sample %d of %d is missing", g, s, lim->n);
                    goto bad;
                }
    *h = (struct wire_header){.step = rb->step,
                              .from_rank = rb->from_rank,
                              .to_dp = rb->to_dp_rank,
                              .seq_no = rb->seq_no,
                              .policy_version = rb->policy_version,
                              .groups_in_step = rb->groups_in_step,
                              .n = rb->samples_per_prompt,
                              .gen_s = rb->gen_seconds,
                              .reward_s = rb->reward_seconds,
                              .idle_s = rb->idle_seconds,
                              .peak_rss_gb = rb->peak_rss_gb,
                              .wait_weights_s = rb->wait_weights_seconds,
                              .unit = rb->unit,
                              .units = rb->units};
    step_batch_append(b, &nb);
    rc = 0;
bad:
    if (rc != 0)
        step_batch_free(&nb);
    free(group_of);
    free(seen);
out:
    protocol_free(env);
    return rc;
}
