/* The rollout role: take work units from the trainers' dispatcher, generate
 * and score each unit's groups and push them to the trainers; fetch the policy
 * version each unit asks for. Nothing here is MPI: a rollout process can die,
 * or join later in a lost one's place, and the run goes on. */
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "common/check.h"
#include "common/config.h"
#include "common/log.h"
#include "proto/transport.h"
#include "dataplane.h"
#include "dispatch.h"
#include "wire.h"
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
    int64_t cur_step; /* the step whose prompts the cursor drew last */
    int64_t version;  /* policy version in the model (-1: none yet) */
    struct rollout_ctx rc;
    struct dataplane_push *push;
    struct work_client *work;
    uint64_t seq_no;
};

static int setup(struct rollout_rank *r, char *err, size_t errlen)
{
    const struct grpo_config *c = r->env->cfg;
    /* connect (and start pinging) first, so the dispatcher knows this rank is coming while the model loads */
    r->work =
        work_client_open(r->env->dispatch_endpoint, r->env->secret, r->env->at.dp, r->env->heartbeat_s, err, errlen);
    if (!r->work)
        return -1;
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
    r->cur_step = -1;
    r->version = -1;
    rollout_ctx_init(&r->rc, c, r->policy, r->tok, r->reward);
    const char *eps[ROLE_MAX_ENDPOINTS];
    for (int i = 0; i < r->env->n_endpoints; i++)
        eps[i] = r->env->endpoints[i];
    r->push = dataplane_push_open(eps, r->env->n_endpoints, err, errlen);
    return r->push ? 0 : -1;
}

static void teardown(struct rollout_rank *r)
{
    work_client_close(r->work);
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

/* The prompt indices of step k into idx (the same the trainers draw): the cursor moves on from the step it drew
 * last, or starts again from the trainers' first step when k is earlier (a unit granted again). */
static void draw_step(struct rollout_rank *r, const struct work_grant *g, int *idx)
{
    if (r->cur_step < g->start || g->step <= r->cur_step) {
        data_cursor_seek(&r->cur, (long)g->start_epoch, (int)g->start_cursor);
        r->cur_step = g->start;
    }
    while (r->cur_step < g->step) {
        data_cursor_next(&r->cur, idx);
        r->cur_step++;
    }
}

/* Generate unit g and send one batch to every trainer DP rank (an empty one where no group goes, so each trainer
 * knows the unit is in). The batches report the waiting since the previous unit: for work and weights (waited)
 * and to send (wait_send, which gets this unit's). 0, or -1 with err. */
static int rollout_unit(struct rollout_rank *r, const struct work_grant *g, double waited, double *wait_send, char *err,
                        size_t errlen)
{
    const struct grpo_config *c = r->env->cfg;
    const int B = (int)c->data_train_batch_size, n = (int)c->rollout_n;
    int lo, hi;
    dispatch_unit_range(B, g->units, g->unit, &lo, &hi);
    int *idx = xmalloc((size_t)B * sizeof(int));
    draw_step(r, g, idx);
    const struct prompt_item **prompts = xmalloc((size_t)B * sizeof *prompts);
    for (int i = 0; i < B; i++)
        prompts[i] = &r->train.items[idx[i]];
    struct sampler_params sp = {(float)c->rollout_temperature, (float)c->rollout_top_p, (int)c->rollout_top_k};
    struct step_batch b = {0};
    double t_gen = 0, t_reward = 0;
    control_set_phase(r->env->ctl, CONTROL_PHASE_GEN);
    rollout_generate_and_score(&r->rc, prompts + lo, idx + lo, hi - lo, lo, &sp, n,
                               rollout_step_seed((uint64_t)c->data_seed, g->step, 0), &b, &t_gen, &t_reward);
    control_set_phase(r->env->ctl, CONTROL_PHASE_IDLE);
    const int n_dp = r->env->n_endpoints;
    int *dp_of = xmalloc((size_t)(b.n_groups ? b.n_groups : 1) * sizeof(int));
    int *sel = xmalloc((size_t)(b.n_groups ? b.n_groups : 1) * sizeof(int));
    balance_groups(&b, n_dp, dp_of);
    int rc = 0;
    double t0 = rollout_now_s();
    for (int d = 0; d < n_dp && rc == 0; d++) {
        int ns = 0;
        for (int k = 0; k < b.n_groups; k++)
            if (dp_of[k] == d)
                sel[ns++] = k;
        struct wire_header h = {.step = g->step,
                                .from_rank = r->env->rank,
                                .to_dp = d,
                                .seq_no = ++r->seq_no,
                                .policy_version = g->version,
                                .groups_in_step = B,
                                .n = n,
                                .gen_s = t_gen,
                                .reward_s = t_reward,
                                .idle_s = waited + *wait_send,
                                .wait_weights_s = waited,
                                .peak_rss_gb = proc_peak_rss_gb(),
                                .unit = g->unit,
                                .units = g->units};
        size_t len;
        uint8_t *msg = wire_pack_batch(&h, &b, sel, ns, r->env->secret, &len);
        /* a trainer busy with a long step takes its time: wait, but say so, and give up after an hour; the run
         * ending meanwhile ends the wait */
        for (int tries = 0;; tries++) {
            rc = dataplane_send(r->push, d, msg, len, 60000, err, errlen);
            if (rc != -1 || tries >= 60 || work_client_ended(r->work))
                break;
            log_warn("rollout", "step %lld: trainer DP rank %d has taken no data for %d min; still waiting",
                     (long long)g->step, d, tries + 1);
        }
        free(msg);
    }
    *wait_send = rollout_now_s() - t0;
    log_debug("rollout", "step %lld unit %d: %d groups (%d..%d) with policy version %lld, gen %.2fs, reward %.2fs",
              (long long)g->step, g->unit, b.n_groups, lo, hi - 1, (long long)g->version, t_gen, t_reward);
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

/* The dispatcher's next word: a unit (with its policy version in the model), or the end. Waiting (for the
 * trainers' next version, or while the run is paused) is added to *waited. 0, or -1 with err. */
static int next_work(struct rollout_rank *r, struct work_grant *g, double *waited, char *err, size_t errlen)
{
    const size_t chunk = (size_t)r->env->cfg->rollout_update_weights_bucket_megabytes << 20;
    const double t0 = rollout_now_s();
    double unanswered_since = 0;
    control_set_phase(r->env->ctl, CONTROL_PHASE_IDLE);
    for (;;) {
        /* pause holds here; stop is the trainers' to decide (the dispatcher says it) */
        control_safe_point(r->env->ctl, r->cur_step, nothing_to_save, NULL);
        char why[1024];
        if (work_client_next(r->work, g, 5000, why, sizeof why) != 0) {
            /* the dispatcher has a thread of its own and answers while the trainers work: silence for a minute
             * means the trainers are gone (the run ended or failed) */
            if (unanswered_since == 0)
                unanswered_since = rollout_now_s();
            if (rollout_now_s() - unanswered_since > 60)
                return error_set(err, errlen, "%s for 60 s: the trainers are gone", why);
            log_warn("rollout", "%s; asking again", why);
            continue;
        }
        unanswered_since = 0;
        if (g->kind != WORK_WAIT)
            break;
        control_wait_poll(r->env->ctl, false);
        transport_sleep(0.05);
    }
    control_wait_poll(r->env->ctl, true);
    if (g->kind == WORK_UNIT && g->version != r->version) {
        size_t bytes;
        int chunks;
        const double t1 = rollout_now_s();
        control_set_phase(r->env->ctl, CONTROL_PHASE_WEIGHT_SYNC);
        if (work_client_weights(r->work, g->version, r->policy->w.mem, r->policy->w.n_floats, chunk, &bytes, &chunks,
                                err, errlen) != 0)
            return -1;
        control_set_phase(r->env->ctl, CONTROL_PHASE_IDLE);
        r->version = g->version;
        log_debug("rollout", "policy version %lld: %zu bytes in %d chunk(s), %.3fs", (long long)g->version, bytes,
                  chunks, rollout_now_s() - t1);
    }
    *waited += rollout_now_s() - t0;
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
        teardown(&r);
        return 2;
    }
    log_info("rollout", "rollout rank %d of %d (%s), %d trainer endpoint(s), dispatcher %s", env->at.dp,
             env->at.dp_size, env->staleness ? "one-step-off" : "on-policy", env->n_endpoints, env->dispatch_endpoint);
    double waited = 0, wait_send = 0;
    int units = 0;
    struct work_grant g;
    for (;;) {
        if (next_work(&r, &g, &waited, err, sizeof err) != 0) {
            log_error("rollout", "%s", err);
            goto out;
        }
        if (g.kind == WORK_END)
            break;
        if (rollout_unit(&r, &g, waited, &wait_send, err, sizeof err) != 0) {
            if (work_client_ended(r.work)) /* the run ended while this unit was on its way: nothing is lost */
                continue;
            log_error("rollout", "%s", err);
            goto out;
        }
        waited = 0;
        units++;
        control_set_step(env->ctl, g.step, g.total_steps);
    }
    const bool finished = g.step >= g.total_steps;
    log_info("rollout", "%s: %s (%d unit(s) generated here)", finished ? "finished" : "stopped", g.reason, units);
    control_finish(env->ctl, finished ? CONTROL_END_FINISHED : CONTROL_END_STOPPED, NULL);
    status = 0;
out:
    if (status != 0)
        control_finish(env->ctl, CONTROL_END_FAILED, err);
    teardown(&r);
    return status;
}
