/* The rollout role: generate this rank's share of every step and push it to
 * the trainers; take each new policy version between steps. */
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "common/check.h"
#include "common/config.h"
#include "common/log.h"
#include "dataplane.h"
#include "wire.h"
#include "worker/comm/weight_sync.h"
#include "worker/data/dataset.h"
#include "worker/metrics/metrics.h"
#include "worker/model/model_io.h"
#include "worker/rewards/reward.h"
#include "worker/roles.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/trainer/trainer.h"

/* Greedy token balance: each group (largest first) to the trainer with the fewest tokens so far. */
static void balance_groups(const struct step_batch *b, int n_dp, int *dp_of_group)
{
    long long *tok = xcalloc((size_t)(b->n_groups ? b->n_groups : 1), sizeof *tok);
    for (int i = 0; i < b->n_seq; i++)
        tok[b->seqs[i].group] += b->seqs[i].prompt_len + b->seqs[i].resp_len;
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

struct rollout_rank {
    struct role_env *env;
    struct model *policy;
    struct tokenizer *tok;
    struct reward_fn *reward;
    struct prompt_set train, val;
    struct data_cursor cur;
    bool cur_open;
    struct rollout_ctx rc;
    struct dataplane_push *push;
    uint64_t seq_no;
};

static int setup(struct rollout_rank *r, char *err, size_t errlen)
{
    const struct grpo_config *c = r->env->cfg;
    char bundled[4096];
    const char *path = c->arr_model_path;
    if (!path || !*path) {
        if (trainer_bundled_model_path(bundled, sizeof bundled) != 0)
            return error_set(err, errlen,
                             "actor_rollout_ref.model.path is empty and the bundled model is not in %s (fetch it "
                             "with scripts/fetch_model.sh)",
                             bundled);
        path = bundled;
    }
    if (!(r->policy = model_load(path, err, errlen)) || !(r->tok = prompt_load_tokenizer(path, err, errlen)) ||
        prompt_sets_load(c, r->tok, &r->train, &r->val, err, errlen) != 0 ||
        !(r->reward = reward_create(c, err, errlen)))
        return -1;
    if (data_cursor_init(&r->cur, r->train.n, (int)c->data_train_batch_size, c->data_shuffle, (uint64_t)c->data_seed,
                         err, errlen) != 0)
        return -1;
    r->cur_open = true;
    rollout_ctx_init(&r->rc, c, r->policy, r->tok, r->reward);
    const char *eps[ROLE_MAX_ENDPOINTS];
    for (int i = 0; i < r->env->n_endpoints; i++)
        eps[i] = r->env->endpoints[i];
    r->push = dataplane_push_open(eps, r->env->n_endpoints, err, errlen);
    return r->push ? 0 : -1;
}

static void teardown(struct rollout_rank *r)
{
    dataplane_push_close(r->push);
    if (r->cur_open)
        data_cursor_free(&r->cur);
    prompt_set_free(&r->train);
    prompt_set_free(&r->val);
    if (r->reward)
        reward_free(r->reward);
    if (r->tok)
        tokenizer_free(r->tok);
    model_free(r->policy);
}

/* Generate step k's share and send one batch to every trainer DP rank (an empty one where no group goes, so each
 * trainer knows the step is complete). The batches report the waiting since the previous step: for the weights
 * (wait_weights) and to send (wait_send, which gets this step's). 0, or -1 with err. */
static int rollout_step(struct rollout_rank *r, int64_t k, int64_t version, double wait_weights, double *wait_send,
                        char *err, size_t errlen)
{
    const struct grpo_config *c = r->env->cfg;
    const int B = (int)c->data_train_batch_size, n = (int)c->rollout_n;
    const int R = r->env->at.dp_size, me = r->env->at.dp;
    const int lo = (int)((long long)B * me / R), hi = (int)((long long)B * (me + 1) / R);
    int *idx = xmalloc((size_t)B * sizeof(int));
    data_cursor_next(&r->cur, idx);
    const struct prompt_item **prompts = xmalloc((size_t)B * sizeof *prompts);
    for (int i = 0; i < B; i++)
        prompts[i] = &r->train.items[idx[i]];
    struct sampler_params sp = {(float)c->rollout_temperature, (float)c->rollout_top_p, (int)c->rollout_top_k};
    struct step_batch b = {0};
    double t_gen = 0, t_reward = 0;
    control_set_phase(r->env->ctl, CONTROL_PHASE_GEN);
    rollout_generate_and_score(&r->rc, prompts + lo, idx + lo, hi - lo, lo, &sp, n,
                               rollout_step_seed((uint64_t)c->data_seed, k, 0), &b, &t_gen, &t_reward);
    control_set_phase(r->env->ctl, CONTROL_PHASE_IDLE);
    const int n_dp = r->env->n_endpoints;
    int *dp_of = xmalloc((size_t)(b.n_groups ? b.n_groups : 1) * sizeof(int));
    int *sel = xmalloc((size_t)(b.n_groups ? b.n_groups : 1) * sizeof(int));
    balance_groups(&b, n_dp, dp_of);
    int rc = 0;
    double t0 = rollout_now_s();
    for (int d = 0; d < n_dp && rc == 0; d++) {
        int ns = 0;
        for (int g = 0; g < b.n_groups; g++)
            if (dp_of[g] == d)
                sel[ns++] = g;
        struct wire_header h = {.step = k,
                                .from_rank = comm_rank(r->env->world),
                                .to_dp = d,
                                .seq_no = ++r->seq_no,
                                .policy_version = version,
                                .groups_in_step = B,
                                .n = n,
                                .gen_s = t_gen,
                                .reward_s = t_reward,
                                .idle_s = wait_weights + *wait_send,
                                .wait_weights_s = wait_weights,
                                .peak_rss_gb = proc_peak_rss_gb()};
        size_t len;
        uint8_t *msg = wire_pack_batch(&h, &b, sel, ns, r->env->secret, &len);
        /* a trainer busy with a long step takes its time: wait, but say so, and give up after an hour */
        for (int tries = 0;; tries++) {
            rc = dataplane_send(r->push, d, msg, len, 60000, err, errlen);
            if (rc != -1 || tries >= 60) /* sent, refused, or an hour without an answer */
                break;
            log_warn("rollout", "step %lld: trainer DP rank %d has taken no data for %d min; still waiting",
                     (long long)k, d, tries + 1);
        }
        free(msg);
    }
    *wait_send = rollout_now_s() - t0;
    log_debug("rollout", "step %lld: %d groups (%d..%d) with policy version %lld, gen %.2fs, reward %.2fs",
              (long long)k, b.n_groups, lo, hi - 1, (long long)version, t_gen, t_reward);
    step_batch_free(&b);
    free(dp_of), free(sel), free(idx), free(prompts);
    return rc;
}

/* A checkpoint is the trainers' to write: a rollout rank holds nothing that is not in it. */
static int nothing_to_save(void *ud, int64_t step)
{
    (void)ud, (void)step;
    return 0;
}

/* The trainers' next word (weights, the end, or the first message) into *h and the model; the wait, reported
 * as idle (paused while the run is to pause), is added to *waited. 0, or -1 with err. */
static int receive_word(struct rollout_rank *r, struct weight_sync_header *h, double *waited, char *err, size_t errlen)
{
    const size_t bucket = (size_t)r->env->cfg->rollout_update_weights_bucket_megabytes << 20;
    struct weight_sync_stats ws;
    const double t0 = rollout_now_s();
    control_set_phase(r->env->ctl, CONTROL_PHASE_IDLE);
    if (weight_sync_recv(r->env->sync, h, r->policy->w.mem, r->policy->w.n_floats, bucket, &ws,
                         r->env->ctl ? control_wait_poll : NULL, r->env->ctl, err, errlen) != 0)
        return -1;
    *waited += rollout_now_s() - t0;
    if (h->has_weights && !h->stop)
        log_debug("rollout", "policy version %lld: %zu bytes in %d bucket(s), %.3fs", (long long)h->version, ws.bytes,
                  ws.buckets, ws.seconds);
    return 0;
}

int run_rollout(struct role_env *env)
{
    char err[2048];
    struct rollout_rank r = {.env = env};
    int status = 1;
    if (setup(&r, err, sizeof err) != 0 || !r.policy) {
        log_error("rollout", "%s", err);
        control_finish(env->ctl, CONTROL_END_FAILED, err);
        return 2;
    }
    /* the first message: the weights to start from (a resumed run's), the data cursor and the step count */
    struct weight_sync_header h;
    double wait_weights = 0, wait_send = 0;
    if (receive_word(&r, &h, &wait_weights, err, sizeof err) != 0) {
        log_error("rollout", "%s", err);
        goto out;
    }
    const int64_t start = h.version, K = h.total_steps, s = env->staleness;
    int64_t version = h.version;
    data_cursor_seek(&r.cur, (long)h.epoch, (int)h.cursor);
    log_info("rollout",
             "rank %d of %d rollout ranks: steps %lld..%lld from policy version %lld (%s), %d trainer "
             "endpoint(s)",
             env->at.dp, env->at.dp_size, (long long)start + 1, (long long)K, (long long)version,
             s ? "one-step-off" : "on-policy", env->n_endpoints);
    bool stopped = h.stop != 0;
    for (int64_t k = start + 1; k <= K && !stopped; k++) {
        if (k - 1 - s >= start) { /* the trainers' word after step k-1-s: new weights, or the end */
            if (receive_word(&r, &h, &wait_weights, err, sizeof err) != 0) {
                log_error("rollout", "%s", err);
                goto out;
            }
            if (h.stop) {
                stopped = true;
                break;
            }
            if (h.has_weights)
                version = h.version;
        }
        /* pause holds here; stop is the trainers' to decide (it arrives with the weights) */
        control_safe_point(env->ctl, k - 1, nothing_to_save, NULL);
        if (rollout_step(&r, k, version, wait_weights, &wait_send, err, sizeof err) != 0) {
            log_error("rollout", "%s", err);
            goto out;
        }
        wait_weights = 0;
        control_set_step(env->ctl, k, K);
    }
    if (!stopped) { /* every batch answered, then the trainers' last word: they have trained on every batch */
        if (dataplane_flush(r.push, 60000, err, sizeof err) != 0)
            log_warn("rollout", "%s", err);
        if (receive_word(&r, &h, &wait_weights, err, sizeof err) != 0) {
            log_error("rollout", "%s", err);
            goto out;
        }
        if (!h.stop)
            log_warn("rollout", "expected the trainers' end-of-run message, got policy version %lld",
                     (long long)h.version);
    }
    log_info("rollout", "%s after step %lld", stopped ? "stopped by the trainers" : "finished",
             (long long)(stopped ? version : K));
    control_finish(env->ctl, stopped ? CONTROL_END_STOPPED : CONTROL_END_FINISHED, NULL);
    status = 0;
out:
    if (status != 0)
        control_finish(env->ctl, CONTROL_END_FAILED, err);
    teardown(&r);
    return status;
}
