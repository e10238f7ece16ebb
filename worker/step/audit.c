/* The rollout audit files: every step's sequences as JSONL. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "audit.h"
#include "common/check.h"
#include "common/log.h"
#include "worker/metrics/metrics.h"

/* Length of the valid UTF-8 sequence at s (1-4), or 0 if the bytes there are not one. */
static int utf8_len(const unsigned char *s)
{
    int n = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] >> 6) != 2)
            return 0;
    return n;
}

json_t *audit_json_text(const char *text)
{
    json_t *j = json_string(text);
    if (j)
        return j;
    size_t n = strlen(text);
    char *clean = xmalloc(3 * n + 1), *w = clean;
    for (const unsigned char *p = (const unsigned char *)text; *p;) {
        int k = utf8_len(p);
        if (k > 0) {
            memcpy(w, p, (size_t)k);
            w += k;
            p += k;
        } else {
            memcpy(w, "\xEF\xBF\xBD", 3);
            w += 3;
            p++;
        }
    }
    *w = 0;
    j = json_string(clean);
    free(clean);
    return j ? j : json_string("");
}

/* One sequence's line (no newline), malloc'd; NULL when out of memory. */
static char *seq_line(int64_t step, int n, const struct step_batch *b, int i, const struct audit_extras *x)
{
    const struct rollout_seq *s = &b->seqs[i];
    const struct prompt_item *p = b->group_prompt[s->group];
    json_t *o = json_object();
    json_object_set_new(o, "step", json_integer(step));
    json_object_set_new(o, "uid", json_integer(b->group_uid[s->group])); /* the prompt's index in the set */
    json_object_set_new(o, "group", json_integer(s->gidx / n));          /* its group's position in the step */
    json_object_set_new(o, "data_source", json_string(p->data_source));
    json_object_set_new(o, "prompt", audit_json_text(p->text));
    json_object_set_new(o, "response", audit_json_text(b->resp_text[i]));
    json_object_set_new(o, "ground_truth", audit_json_text(p->ground_truth ? p->ground_truth : ""));
    json_object_set_new(o, "score", json_real(s->raw_score));
    json_object_set_new(o, "reward", json_real(s->score));
    int first = 0; /* the first of the model's tokens: a response's advantage is its (the others' is 0) */
    while (first < s->resp_len - 1 && !rollout_seq_model_token(s, first))
        first++;
    json_object_set_new(o, "advantage", json_real(s->resp_len ? s->adv[first] : 0.0));
    json_t *pid = json_array(), *rid = json_array(), *olp = json_array(), *rlp = json_array(), *glp = json_array();
    for (int k = 0; k < s->prompt_len; k++)
        json_array_append_new(pid, json_integer(s->prompt[k]));
    for (int k = 0; k < s->resp_len; k++) {
        json_array_append_new(rid, json_integer(s->resp[k]));
        json_array_append_new(olp, json_real(s->old_logp[k]));
        json_array_append_new(glp, json_real(s->gen_logp[k]));
        json_array_append_new(rlp, s->ref_logp ? json_real(s->ref_logp[k]) : json_null());
    }
    json_object_set_new(o, "prompt_ids", pid);
    json_object_set_new(o, "response_ids", rid);
    json_object_set_new(o, "old_log_probs", olp);
    json_object_set_new(o, "ref_log_probs", rlp);
    json_object_set_new(o, "rollout_log_probs", glp);
    if (s->mask) { /* which response tokens are the model's (1) and which were put in from outside (0) */
        json_t *mk = json_array();
        for (int k = 0; k < s->resp_len; k++)
            json_array_append_new(mk, json_integer(s->mask[k]));
        json_object_set_new(o, "response_mask", mk);
    }
    json_t *adv = json_array(); /* every token's (0 where the loss does not train) */
    for (int k = 0; k < s->resp_len; k++)
        json_array_append_new(adv, json_real(s->adv ? s->adv[k] : 0.0));
    json_object_set_new(o, "advantages", adv);
    if (s->is_w) { /* rollout correction's importance-sampling weights (decoupled mode) */
        json_t *w = json_array();
        for (int k = 0; k < s->resp_len; k++)
            json_array_append_new(w, json_real(s->is_w[k]));
        json_object_set_new(o, "rollout_is_weights", w);
    }
    if (s->loss_mask) { /* the tokens rollout rejection sampling kept in the loss (1), of the model's */
        json_t *mk = json_array();
        for (int k = 0; k < s->resp_len; k++)
            json_array_append_new(mk, json_integer(s->loss_mask[k]));
        json_object_set_new(o, "rollout_rs_mask", mk);
    }
    if (s->sum_pi_sq) { /* the old policy's sum of squared probabilities (calculate_sum_pi_squared) */
        json_t *q = json_array();
        for (int k = 0; k < s->resp_len; k++)
            json_array_append_new(q, json_real(s->sum_pi_sq[k]));
        json_object_set_new(o, "sum_pi_squared", q);
    }
    if (x && x->versions) { /* fully-async training: the version that sampled each token (partial rollout) */
        json_t *v = json_array();
        int64_t newest = s->version_first;
        for (int k = 0; k < s->resp_len; k++) {
            const int64_t vk = s->versions ? s->versions[k] : s->version_first;
            newest = vk > newest ? vk : newest;
            json_array_append_new(v, json_integer(vk));
        }
        json_object_set_new(o, "policy_version", json_integer(newest));
        json_object_set_new(o, "policy_versions", v);
    }
    if (x && x->reward_baseline) /* remax: the greedy response's reward */
        json_object_set_new(o, "reward_baseline", json_real(s->reward_baseline));
    for (int k = 0; x && x->part_names && s->reward_parts && k < s->n_parts; k++) /* gdpo: reward_extra_info */
        if (!json_object_get(o, x->part_names[k]))
            json_object_set_new(o, x->part_names[k], json_real(s->reward_parts[k]));
    if (s->num_turns > 0) { /* a multi-turn trajectory: its turns and its conversation (docs/agents.md) */
        json_object_set_new(o, "num_turns", json_integer(s->num_turns));
        json_object_set_new(o, "tool_calls", json_integer(s->tool_calls));
        json_object_set_new(o, "tool_errors", json_integer(s->tool_errors));
        json_t *m = s->messages_json ? json_loads(s->messages_json, 0, NULL) : NULL;
        if (m)
            json_object_set_new(o, "messages", m);
    }
    char *line = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return line;
}

char *rollout_audit_text(int64_t step, int n, const struct step_batch *b, const struct audit_extras *x, size_t *len)
{
    size_t cap = 4096, used = 0;
    char *text = xmalloc(cap);
    for (int i = 0; i < b->n_seq; i++) {
        char *line = seq_line(step, n, b, i, x);
        CHECK_ALLOC(line);
        const size_t l = strlen(line);
        while (used + l + 2 > cap)
            text = xrealloc(text, cap *= 2);
        memcpy(text + used, line, l);
        used += l;
        text[used++] = '\n';
        free(line);
    }
    text[used] = 0;
    *len = used;
    return text;
}

void rollout_audit_save(const char *dir, int64_t step, char *const *parts, const size_t *lens, int nparts)
{
    if (!dir || !*dir)
        return;
    mkdir(dir, 0755);
    char path[4096];
    snprintf(path, sizeof path, "%s/%lld.jsonl", dir, (long long)step);
    /* a failed write (a full disk) is reported to metrics_output_failed: the trainer stops the run with it */
    FILE *f = fopen(path, "w");
    if (!f) {
        metrics_output_failed("audit", path, "cannot write rollouts to %s: %s", path, check_errno_text());
        return;
    }
    bool failed = false;
    for (int p = 0; p < nparts && !failed; p++)
        if (lens[p] && fwrite(parts[p], 1, lens[p], f) != lens[p]) {
            metrics_output_failed("audit", path, "writing %s: %s", path, check_errno_text());
            failed = true;
        }
    if (fclose(f) != 0 && !failed)
        metrics_output_failed("audit", path, "writing %s: %s", path, check_errno_text());
}
