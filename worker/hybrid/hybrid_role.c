/* The hybrid role: every rank generates and trains (verl's hybrid engine). Alone it is the whole GRPO loop in one
 * process, a trainer fed by the one-process source (local_source.c). On N ranks (colocated: no rollout split) each
 * rank is a trainer fed by the colocated source this file owns, with its metrics (colocated_metrics); a step goes:
 *   update_weights  the policy's weights, as the trainers hold them (DP x TP x PP), resharded in place into the
 *                   generation layout (the rollout TP, whole layers) when that differs; nothing otherwise;
 *   gen, reward     each generation engine (actor_rollout_ref.rollout.tensor_model_parallel_size neighbouring
 *                   ranks) makes work units of the step's prompt groups from the shared ledger (units.h: its own,
 *                   then the unstarted ones of the slowest engine);
 *   exchange        the engines' groups to every rank; each trainer DP rank keeps its token-balanced share;
 * then the trainer's phases (old and reference log-probs, advantages, the update) as DP x TP x PP over every
 * rank. The batch a step trains on does not depend on which engine made which unit. */
#include <stdlib.h>
#include <string.h>

#include "common/check.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "kernels/kernels.h"
#include "hybrid_source.h"
#include "units.h"
#include "worker/comm/comm.h"
#include "worker/control/control.h"
#include "worker/gen/generate.h"
#include "worker/gen/validate.h"
#include "worker/metrics/metrics.h"
#include "worker/model/device.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/plane/dispatch_core.h"
#include "worker/plane/wire.h"
#include "worker/roles.h"
#include "worker/step/batch.h"
#include "worker/survive/survive.h"
#include "worker/trainer/trainer.h"
#include "worker/trainer/trainer_process.h"

/* DAPO's generation rounds per step at most (algorithm.filter_groups.max_num_gen_batches' bound) */
#define MAX_ROUNDS 1000

/* What a colocated step did beside its rollouts (its metrics: colocated_metrics). */
struct colocated_figures {
    double update_weights_s; /* the weights resharded into the generation layout */
    int64_t weight_bytes;    /* what this rank sent for it */
    double gen_wait_peers;   /* the longest any rank waited for the others to finish generating */
    double gen_imbalance;    /* the slowest engine's generation and scoring seconds over the engines' mean */
    int64_t units_stolen;    /* units made by another engine than the one that owned them at the start */
    int units;               /* work units of the step */
};

struct colocated {
    struct role_env *env;
    struct trainer *t;
    struct units_ledger *ledger;
    struct comm *engine;     /* this rank's generation engine (NULL: a rank alone) */
    struct comm *engine_dev; /* on GPUs, its NCCL twin (the generation model's TP collectives) */
    bool head;               /* the engine's first rank: it takes the units and sends the engine's groups */
    struct model *gen;       /* the policy in the generation layout; NULL: the policy itself generates */
    float *whole;            /* the whole policy, host memory (reshard) */
    struct gen_ctx rc;       /* generation and scoring with gen (or the policy) */
    bool own_rm;             /* rc's reward model is this source's (not the trainer's) */
    int units;               /* work units per step */
    struct wire_limits lim;
    int64_t stolen_total;
    int resharded;                /* updates of the generation model so far */
    int64_t gen_at;               /* the trainer's step whose weights the generation model holds (-1: none yet) */
    struct colocated_figures fig; /* the step made last */
    struct hybrid_dapo dapo;
    struct survive *survive; /* trainer.survive_trainer_loss (NULL: off) */
};

/* Whether the update packs a group's prompt once (the trainer's rule: the key, on the CPU). */
static bool shared_prompts(const struct grpo_config *c)
{
    return c->actor_shared_prompt_packing && strcmp(config_device(c), "cpu") == 0;
}

/* Units per generation round (a round draws config_gen_batch_size prompts): placement.colocated_units, or four per
 * engine (a group never splits: at most the round's groups). */
static int units_per_step(const struct grpo_config *c, int engines)
{
    const int B = config_gen_batch_size(c);
    int u = c->placement_colocated_units > 0 ? (int)c->placement_colocated_units : 4 * engines;
    if (u > B)
        u = B;
    return u < engines ? engines : u;
}

/* The generation model: the policy's own when the layouts agree (whole layers on one rank generating alone, or
 * the training TP group generating as one engine), else a model of the rollout TP's shard of whole layers. */
static int gen_model_setup(struct colocated *c, char *err, size_t errlen)
{
    const struct role_env *env = c->env;
    const int rtp = env->spec.rollout_tp > 1 ? env->spec.rollout_tp : 1;
    const struct model *p = trainer_policy(c->t);
    /* expert parallelism: each rank holds some experts, but generates its own sequences with all of them; the
     * rollout's (experts held whole over its TP group) is a layout of its own */
    const bool over_tp = config_rollout_experts_over_tp(env->cfg);
    const bool same = env->at.pp_size == 1 && env->at.tp_size == rtp && env->at.ep_size <= 1 && !over_tp;
    if (same)
        return 0;
    if (rtp > 1 &&
        model_shard_check(&p->cfg, rtp, "actor_rollout_ref.rollout.tensor_model_parallel_size", err, errlen) != 0)
        return -1;
    if (over_tp && model_ep_check(&p->cfg, rtp, 1, 1, KEY_rollout_expert_parallel_size, err, errlen) != 0)
        return -1;
    const struct model_layout lay = {.tp_rank = env->at.engine_tp,
                                     .tp_size = rtp,
                                     .pp_rank = 0,
                                     .pp_size = 1,
                                     .tp = c->engine,
                                     .mp = c->engine,
                                     .experts_over_tp = over_tp};
    struct model *g = rtp > 1 ? model_create_shard(&p->cfg, &lay) : model_create(&p->cfg);
    model_move(&g, p->K);
    if (c->engine && p->K->device != KDEV_CPU) { /* the engine's TP collectives over NCCL, in device memory */
        if (env->trainer_gpus_shared) {
            model_free(g);
            return error_set(err, errlen,
                             KEY_rollout_tensor_model_parallel_size
                             " %d with " KEY_trainer_device "=cuda: an "
                             "engine's TP collectives run over NCCL, which needs a GPU per rank, and some node runs "
                             "more ranks than it has GPUs; give each rank a GPU of its own or set it to 1",
                             rtp);
        }
        if (!(c->engine_dev = comm_device_group(c->engine, p->K->device_index))) {
            model_free(g);
            return error_set(err, errlen, "rollout TP with " KEY_trainer_device "=cuda: this build has no NCCL");
        }
        model_set_groups(g, c->engine_dev, NULL, c->engine_dev);
    }
    c->gen = g;
    if (over_tp)
        log_info("hybrid", "engine TP rank %d of %d generates with experts %d..%d of %d whole (expert parallelism)",
                 env->at.engine_tp, rtp, g->sh.expert_lo, g->sh.expert_lo + g->sh.n_experts - 1, p->cfg.n_experts);
    c->whole = xmalloc(model_whole_floats(&p->cfg) * sizeof(float));
    return 0;
}

/* Phase update_weights: the policy's new weights into the generation model. Each model copy (its TP x PP ranks)
 * gathers the whole on its first rank and sends it to the others in buckets of
 * actor_rollout_ref.rollout.update_weights_bucket_megabytes; each rank slices its generation shard. Its
 * seconds; *bytes gets what this rank sent. */
static double update_weights(struct colocated *c, int64_t *bytes)
{
    *bytes = 0;
    if (!c->gen || c->gen_at == trainer_step(c->t)) /* the policy generates itself, or these weights are in */
        return 0;
    c->gen_at = trainer_step(c->t);
    const double t0 = clock_now_s();
    control_set_phase(c->env->ctl, GRPO__PHASE__PHASE_WEIGHT_SYNC);
    struct model *p = trainer_policy(c->t);
    size_t n;
    const float *local = trainer_params(c->t, &n); /* host memory (a copy on a GPU) */
    const size_t nw = model_whole_floats(&p->cfg);
    struct comm *mp = c->env->emp                                   ? c->env->emp /* EP with PP (and TP) */
                      : c->env->at.ep_size > 1                      ? (c->env->etp ? c->env->etp : c->env->ep)
                      : c->env->at.tp_size * c->env->at.pp_size > 1 ? c->env->mp
                                                                    : NULL;
    float *merged = NULL;
    if (p->lora && mp) { /* LoRA under EP, TP or PP: each rank's part merged (its experts', rows', columns' or
                          * layers' adapters into its weights' parts), then gathered below */
        merged = xmalloc(p->w.n_floats * sizeof(float));
        lora_merged_weights(p, merged);
        local = merged;
    }
    if (p->lora && !mp) { /* a whole model: the base with the adapter merged, then sharded */
        lora_merged_weights(p, c->whole);
    } else if (!mp) {
        memcpy(c->whole, local, nw * sizeof(float));
    } else {
        struct comm_traffic before, after;
        comm_traffic(mp, &before);
        model_shard_gather(p, local, c->whole, 0);
        const size_t per = ((size_t)c->env->cfg->rollout_update_weights_bucket_megabytes << 20) / sizeof(float);
        for (size_t off = 0; off < nw; off += per ? per : nw)
            comm_broadcast(mp, c->whole + off, nw - off < per || !per ? nw - off : per, COMM_F32, 0);
        comm_traffic(mp, &after);
        *bytes = (int64_t)(after.sent_f32[COMM_OP_SEND] - before.sent_f32[COMM_OP_SEND] +
                           after.sent_f32[COMM_OP_BROADCAST] - before.sent_f32[COMM_OP_BROADCAST]);
    }
    free(merged);
    float *dst = c->gen->K->device == KDEV_CPU ? c->gen->w.mem : xmalloc(c->gen->w.n_floats * sizeof(float));
    model_shard_slice(c->gen, c->whole, dst);
    if (dst != c->gen->w.mem) {
        model_weights_from_host(c->gen, dst);
        free(dst);
    }
    control_set_phase(c->env->ctl, GRPO__PHASE__PHASE_IDLE);
    const double took = clock_now_s() - t0;
    if (c->env->rank == 0 || log_get_level() >= LOG_DEBUG) /* once at info (rank 0), then at debug */
        log_write(c->resharded++ ? LOG_DEBUG : LOG_INFO, "hybrid",
                  "weights resharded into the generation layout (TP %d, whole layers): %lld bytes sent over the model "
                  "copy in buckets of %lld MB, %.3f s",
                  c->gen->sh.tp_size, (long long)*bytes,
                  (long long)c->env->cfg->rollout_update_weights_bucket_megabytes, took);
    return took;
}

/* The units one engine made, each packed as a data-plane batch (wire.h) to go to every rank. */
struct made {
    uint8_t **msg;
    size_t *len;
    int n;
    double gen_s, reward_s;
    int stolen;
};

/* Phases gen and reward: this engine's units of step k (its own, then others' unstarted ones), each generated
 * and scored, and packed on the engine's head. */
static void generate_share(struct colocated *c, int64_t k, int round, const int *uids, struct made *out)
{
    const struct grpo_config *cfg = c->env->cfg;
    const int B = config_gen_batch_size(cfg), n = (int)cfg->rollout_n; /* the round's prompts */
    const struct prompt_set *ps = trainer_prompts(c->t);
    const struct prompt_item **prompts = xmalloc((size_t)B * sizeof *prompts);
    for (int i = 0; i < B; i++)
        prompts[i] = &ps->items[uids[i]];
    const struct sampler_params sp = {(float)cfg->rollout_temperature, (float)cfg->rollout_top_p,
                                      (int)cfg->rollout_top_k};
    control_set_phase(c->env->ctl, GRPO__PHASE__PHASE_GEN);
    for (;;) {
        int64_t word[2] = {-1, 0}; /* the unit, and whether it was stolen */
        if (c->head) {
            bool stolen;
            /* the ledger's key: every round of every step its own, in increasing order */
            word[0] = units_ledger_take(c->ledger, k * (MAX_ROUNDS + 1) + round, c->env->at.engine, &stolen);
            word[1] = stolen;
        }
        if (c->engine)
            comm_broadcast(c->engine, word, 2, COMM_I64, 0);
        if (word[0] < 0)
            break;
        int lo, hi;
        dispatch_unit_range(B, c->units, (int)word[0], &lo, &hi);
        struct step_batch b = {0};
        gen_generate_and_score(&c->rc, prompts + lo, uids + lo, hi - lo, lo, &sp, n,
                               rollout_step_seed((uint64_t)cfg->data_seed, k, (uint64_t)round), &b, &out->gen_s,
                               &out->reward_s);
        out->stolen += (int)word[1];
        if (c->head) {
            int *sel = xmalloc((size_t)(b.n_groups ? b.n_groups : 1) * sizeof(int));
            for (int g = 0; g < b.n_groups; g++)
                sel[g] = g;
            const struct wire_header h = {.step = k,
                                          .from_rank = c->env->rank,
                                          .to_dp = 0,
                                          .seq_no = (uint64_t)out->n + 1,
                                          .policy_version = k - 1,
                                          .groups_in_step = B,
                                          .n = n,
                                          .unit = (int)word[0],
                                          .units = c->units};
            out->msg = xrealloc(out->msg, (size_t)(out->n + 1) * sizeof *out->msg);
            out->len = xrealloc(out->len, (size_t)(out->n + 1) * sizeof *out->len);
            out->msg[out->n] = wire_pack_batch(&h, &b, sel, b.n_groups, NULL, &out->len[out->n]); /* over MPI only */
            free(sel);
        }
        out->n++;
        step_batch_free(&b);
    }
    control_set_phase(c->env->ctl, GRPO__PHASE__PHASE_IDLE);
    if (c->gen && cfg->rollout_free_cache_engine) /* the update gets the decode buffers back */
        model_release_buffers(c->gen, MODEL_BUF_GEN);
    free(prompts);
}

static void hold_while_waiting(void *ud, bool done)
{
    struct colocated *c = ud;
    control_hold_while_waiting(c->env->ctl, done);
}

/* Every engine's units to every rank: the heads' packed batches, framed (a length, then the bytes padded to 8),
 * all-gathered over the world, unpacked with the data plane's checks into all. Per rank, its generation seconds
 * and units stolen come along (for the step's imbalance figures). 0, or -1 (logged). */
static int exchange(struct colocated *c, int64_t k, const struct made *mine, struct step_batch *all,
                    struct step_timing *tm)
{
    struct comm *w = c->env->trainers; /* every rank, with the run's deadline */
    const int N = comm_size(w);
    size_t bytes = 0;
    for (int i = 0; c->head && i < mine->n; i++)
        bytes += 8 + (mine->len[i] + 7) / 8 * 8;
    double info[4] = {(double)bytes, mine->gen_s + mine->reward_s, (double)mine->stolen, (double)mine->n};
    double *infos = xmalloc((size_t)N * 4 * sizeof(double));
    comm_allgather(w, info, infos, 4, COMM_F64);
    size_t most = 8;
    double gen_max = 0, gen_sum = 0;
    int engines = 0;
    int64_t stolen = 0;
    for (int r = 0; r < N; r++) {
        most = (size_t)infos[4 * r] > most ? (size_t)infos[4 * r] : most;
        if (infos[4 * r] > 0 || infos[4 * r + 3] > 0) { /* an engine's head (units made, or at least asked) */
            gen_max = infos[4 * r + 1] > gen_max ? infos[4 * r + 1] : gen_max;
            gen_sum += infos[4 * r + 1];
            engines++;
            stolen += (int64_t)infos[4 * r + 2];
        }
    }
    uint8_t *out = xcalloc(most, 1), *in = xmalloc(most * (size_t)N);
    for (int i = 0, at = 0; c->head && i < mine->n; i++) {
        const uint64_t len = mine->len[i];
        memcpy(out + at, &len, 8);
        memcpy(out + at + 8, mine->msg[i], len);
        at += 8 + (int)((len + 7) / 8 * 8);
    }
    comm_allgather_bytes(w, out, in, most);
    /* each unit unpacked on its own, then appended in the step's order: the batch (its groups' order, which the DP
     * split's ties follow) is the same whoever made which unit */
    struct step_batch *unit = xcalloc((size_t)c->units, sizeof *unit);
    bool *have = xcalloc((size_t)c->units, sizeof *have);
    int rc = 0;
    for (int r = 0; r < N && rc == 0; r++) {
        const uint8_t *p = in + (size_t)r * most, *end = p + (size_t)infos[4 * r];
        while (p + 8 <= end && rc == 0) {
            uint64_t len;
            memcpy(&len, p, 8);
            struct wire_header h;
            struct step_batch one = {0};
            char err[1024];
            if (len > (uint64_t)(end - p - 8)) {
                snprintf(err, sizeof err, "its frame runs past the rank's bytes");
                rc = -1;
            } else if (wire_unpack_batch(p + 8, (size_t)len, &c->lim, &h, &one, err, sizeof err) != 0) {
                rc = -1;
            } else if (have[h.unit]) {
                snprintf(err, sizeof err, "unit %d came twice", h.unit);
                step_batch_free(&one);
                rc = -1;
            } else {
                unit[h.unit] = one;
                have[h.unit] = true;
            }
            if (rc != 0)
                log_error("hybrid", "step %lld: a unit from rank %d does not unpack: %s", (long long)k, r, err);
            p += 8 + (len + 7) / 8 * 8;
        }
    }
    for (int u = 0; u < c->units; u++) {
        if (rc == 0 && !have[u]) {
            log_error("hybrid", "step %lld: no rank made work unit %d of %d", (long long)k, u, c->units);
            rc = -1;
        }
        step_batch_append(all, &unit[u]); /* frees it (an empty one too) */
    }
    free(unit), free(have);
    free(out), free(in), free(infos);
    tm->gen += gen_max; /* the engines generate side by side: each round waits for the slowest */
    const double imbalance = engines && gen_sum > 0 ? gen_max / (gen_sum / engines) : 1;
    c->fig.gen_imbalance = imbalance > c->fig.gen_imbalance ? imbalance : c->fig.gen_imbalance;
    c->fig.units_stolen += stolen;
    c->fig.units += c->units;
    c->stolen_total += stolen;
    return rc;
}

/* Round `round` of step k's generation: the next config_gen_batch_size prompts (data.gen_batch_size, else
 * data.train_batch_size) drawn (every rank draws the same), every engine's units made, all-gathered into `round_b`
 * in the round's order and checked against the draw. 0, or -1 (logged). */
static int gen_round(struct colocated *c, int64_t k, int round, struct step_batch *round_b, struct step_timing *tm)
{
    const int B = config_gen_batch_size(c->env->cfg), n = (int)c->env->cfg->rollout_n;
    int *uids = xmalloc((size_t)B * sizeof(int));
    trainer_advance_cursor(c->t, uids);
    struct made mine = {0};
    generate_share(c, k, round, uids, &mine);
    survive_test_hold("gen"); /* tests: this rank dies with its units made, its peers waiting for it */
    tm->reward += mine.reward_s;
    /* the long tail: this rank waits for the slowest engine (no deadline: generation takes what it takes) */
    const double t0 = clock_now_s();
    comm_barrier_polled(c->env->trainers, hold_while_waiting, c);
    double wmax = clock_now_s() - t0;
    comm_allreduce_max(c->env->trainers, &wmax, 1, COMM_F64);
    c->fig.gen_wait_peers += wmax;
    int rc = exchange(c, k, &mine, round_b, tm);
    for (int i = 0; i < mine.n && c->head; i++)
        free(mine.msg[i]);
    free(mine.msg), free(mine.len);
    int bad = 0; /* each sequence's prompt is the one this round draws at its group's position */
    for (int i = 0; rc == 0 && i < round_b->n_seq; i++)
        bad += uids[round_b->seqs[i].gidx / n] != round_b->group_uid[round_b->seqs[i].group];
    free(uids);
    if (rc == 0 && (bad || round_b->n_seq != B * n)) {
        log_error("hybrid",
                  "step %lld: the engines made %d of the step's %d sequences, %d with another prompt "
                  "than this rank draws (same data.* settings on every rank?)",
                  (long long)k, round_b->n_seq, B * n, bad);
        rc = -1;
    }
    return rc;
}

/* trainer_source.next_batch: step k made by every engine (with DAPO's dynamic sampling, rounds until enough groups
 * carry a learning signal, as one process does), this rank's DP share of it in b. */
static int next_batch(void *ctx, int64_t k, struct step_batch *b, struct step_timing *tm)
{
    struct colocated *c = ctx;
    const struct grpo_config *cfg = c->env->cfg;
    const int B = (int)cfg->data_train_batch_size, G = config_gen_batch_size(cfg); /* groups kept, drawn a round */
    const bool filter = cfg->alg_filter_groups_enable;
    const int rounds = config_filter_rounds(cfg);
    int64_t wbytes;
    c->fig = (struct colocated_figures){0};
    c->dapo = (struct hybrid_dapo){0};
    c->fig.update_weights_s = update_weights(c, &wbytes);
    c->fig.weight_bytes = wbytes;
    struct step_batch all = {0};
    int rc = 0, drawn = 0;
    for (int r = 0; r < rounds && rc == 0; r++) {
        struct step_batch round_b = {0};
        rc = gen_round(c, k, r, &round_b, tm);
        drawn += G;
        if (filter)
            step_batch_filter_groups(&round_b, step_filter_metric_from_name(cfg->alg_filter_groups_metric));
        step_batch_append(&all, &round_b);
        if (!filter || all.n_groups >= B)
            break;
    }
    if (rc == 0 && filter) {
        step_batch_truncate_groups(&all, B);
        c->dapo.filtered = true;
        c->dapo.gen_batches = (double)drawn / G;
        c->dapo.kept_groups = all.n_groups;
    }
    for (int i = 0; i < all.n_seq; i++) /* after filtering, positions in the batch are the step's order */
        all.seqs[i].gidx = i;
    if (rc == 0) {
        /* this DP rank's token-balanced share of whole groups (the same split on every rank) */
        int *dp_of = xmalloc((size_t)(all.n_groups ? all.n_groups : 1) * sizeof(int));
        bool *keep = xmalloc((size_t)(all.n_groups ? all.n_groups : 1) * sizeof(bool));
        step_batch_balance(&all, c->env->at.dp_size, shared_prompts(cfg), dp_of);
        for (int g = 0; g < all.n_groups; g++)
            keep[g] = dp_of[g] == c->env->at.dp;
        step_batch_keep_groups(&all, keep);
        free(dp_of), free(keep);
        step_batch_append(b, &all);
    }
    step_batch_free(&all);
    return rc;
}

void hybrid_dapo_metrics(struct metrics *m, const struct hybrid_dapo *d)
{
    if (d->filtered) {
        metrics_set(m, "train/num_gen_batches", d->gen_batches);
        metrics_set(m, "train/num_kept_groups", d->kept_groups);
    }
}

/* trainer_source.metrics: DAPO's first; late, the weights resharded into the generation layout and the long tail of
 * generation. */
static void colocated_metrics(void *ctx, enum source_metrics_at at, const struct step_timing *tm, double step_s,
                              struct metrics *m)
{
    const struct colocated *c = ctx;
    (void)tm, (void)step_s;
    if (at == SOURCE_METRICS_FIRST) {
        hybrid_dapo_metrics(m, &c->dapo);
        return;
    }
    metrics_set(m, "timing_s/update_weights", c->fig.update_weights_s);
    metrics_set(m, "perf/update_weights_bytes", (double)c->fig.weight_bytes);
    metrics_set(m, "colocated/gen_wait_peers_s", c->fig.gen_wait_peers);
    metrics_set(m, "colocated/gen_imbalance", c->fig.gen_imbalance);
    metrics_set(m, "colocated/units_stolen", (double)c->fig.units_stolen);
    metrics_set(m, "colocated/units", (double)c->fig.units);
}

/* The responses' texts of every head, in rank order, at rank 0 (the i-th of all: all[i]): each head's texts as one
 * run of NUL-ended strings, all-gathered (comm_allgather_bytes, padded to the longest run); rank r has cnts[r] of
 * them. Collective; NULL elsewhere. */
static char **gather_texts(struct comm *w, bool root, char *const *mine, int n, const int64_t *cnts, int64_t total)
{
    const int N = comm_size(w);
    int64_t bytes = 0, most = 1;
    for (int i = 0; i < n; i++)
        bytes += (int64_t)strlen(mine[i]) + 1;
    int64_t *sizes = xmalloc((size_t)N * sizeof *sizes);
    comm_allgather(w, &bytes, sizes, 1, COMM_I64);
    for (int r = 0; r < N; r++)
        most = sizes[r] > most ? sizes[r] : most;
    char *out = xcalloc((size_t)most, 1), *in = xmalloc((size_t)most * (size_t)N);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const size_t l = strlen(mine[i]) + 1;
        memcpy(out + at, mine[i], l);
        at += l;
    }
    comm_allgather_bytes(w, out, in, (size_t)most);
    char **all = NULL;
    if (root) {
        all = xcalloc((size_t)(total ? total : 1), sizeof *all);
        int64_t k = 0;
        for (int r = 0; r < N; r++) {
            const char *p = in + (size_t)r * (size_t)most, *end = p + sizes[r];
            for (int64_t j = 0; j < cnts[r] && k < total; j++, k++) {
                const size_t l = p < end ? strnlen(p, (size_t)(end - p)) : 0;
                all[k] = xstrndup(p, l);
                p += l + 1;
            }
        }
    }
    free(out), free(in), free(sizes);
    return all;
}

/* trainer_source.validate: every engine generates its share of the validation prompts (whole chunks of
 * data.val_batch_size, the seeds one process uses), the heads' scores are all-gathered, and the first rank
 * reports them (with trainer.validation_data_dir, the responses' texts too, and it writes them). */
static void validate(void *ctx, uint64_t seed, struct metrics *m)
{
    struct colocated *c = ctx;
    const double t0 = clock_now_s();
    int64_t bytes;
    update_weights(c, &bytes); /* the policy as it is now (the step's update is in) */
    struct val_score *mine = NULL;
    char **texts = NULL;
    const char *dump_dir = c->env->cfg->trainer_validation_data_dir;
    const bool dump = dump_dir && *dump_dir;
    int n = gen_validate_part(&c->rc, trainer_val_prompts(c->t), seed, c->env->at.engine, c->env->at.engines, &mine,
                              dump ? &texts : NULL);
    const int made = n;
    if (!c->head) /* the engine's other ranks made the same responses */
        n = 0;
    struct comm *w = c->env->trainers;
    const int N = comm_size(w);
    comm_barrier_polled(w, hold_while_waiting, c);
    int64_t cnt = n, *cnts = xmalloc((size_t)N * sizeof *cnts), most = 1, total = 0;
    comm_allgather(w, &cnt, cnts, 1, COMM_I64);
    for (int r = 0; r < N; r++) {
        most = cnts[r] > most ? cnts[r] : most;
        total += cnts[r];
    }
    const size_t words = sizeof(struct val_score) / sizeof(double);
    double *out = xcalloc((size_t)most * words, sizeof(double)),
           *in = xmalloc((size_t)(most * N) * words * sizeof(double));
    if (n)
        memcpy(out, mine, (size_t)n * sizeof *mine);
    comm_allgather(w, out, in, (size_t)most * words, COMM_F64);
    char **all_texts = dump ? gather_texts(w, c->env->rank == 0, texts, n, cnts, total) : NULL;
    if (c->env->rank == 0) {
        struct val_score *all = xmalloc((size_t)(total ? total : 1) * sizeof *all);
        int64_t at = 0;
        for (int r = 0; r < N; r++) {
            memcpy(all + at, in + (size_t)r * (size_t)most * words, (size_t)cnts[r] * sizeof *all);
            at += cnts[r];
        }
        if (dump)
            gen_validate_dump(dump_dir, trainer_step(c->t), trainer_val_prompts(c->t), all, all_texts, (int)total);
        gen_validate_report(c->env->cfg, trainer_val_prompts(c->t), all, (int)total, clock_now_s() - t0, m);
        free(all);
    }
    for (int i = 0; texts && i < made; i++)
        free(texts[i]);
    for (int64_t i = 0; all_texts && i < total; i++)
        free(all_texts[i]);
    free(texts), free(all_texts);
    free(out), free(in), free(cnts), free(mine);
}

/* The work-unit ledger over the trainers (collective). Where a rank may be lost (c->survive) it is each host's own,
 * lock-free (units.h): the shared one lives in MPI one-sided memory under a lock, and Open MPI 5 says its one-sided
 * components are untested after a failure (it warns so at start under --with-ft ulfm): a survivor was seen inside
 * that lock for good while the others re-formed (ft-survive-net, docs/operations.md), and a rank lost inside it
 * would hold it for ever. */
static struct units_ledger *make_ledger(const struct colocated *c)
{
    const struct role_env *env = c->env;
    return units_ledger_create(env->trainers, env->at.engines, c->units, env->cfg->placement_colocated_steal,
                               c->survive != NULL, env->at.engine, c->head);
}

/* Once the trainer exists (model loaded, any checkpoint resumed): the ledger, the generation model and context. */
static int colocated_setup(struct colocated *c, char *err, size_t errlen)
{
    const struct role_env *env = c->env;
    const struct grpo_config *cfg = env->cfg;
    c->units = units_per_step(cfg, env->at.engines);
    c->ledger = make_ledger(c);
    if (!c->ledger)
        return error_set(err, errlen, "the work-unit ledger needs %s",
                         c->survive ? "MPI shared memory on each host" : "MPI one-sided memory on the world");
    if (gen_model_setup(c, err, errlen) != 0)
        return -1;
    c->rc = *trainer_rollout_ctx(c->t);
    c->rc.policy = c->gen ? c->gen : trainer_policy(c->t);
    /* multi-turn rollouts: an engine of several ranks (its model split over them) generates as one, its head running
     * the tools and telling the others each answer; a rank alone runs its own (the trainer made none: this source
     * validates) */
    const bool split = c->rc.policy->sh.tp || c->rc.policy->sh.pp;
    if (gen_ctx_load_env(&c->rc, split ? c->engine : NULL, c->head, err, errlen) != 0)
        return -1;
    if (!c->rc.rm && cfg->rm_enable) { /* the trainer loads it on DP rank 0 only; every engine scores */
        if (gen_ctx_load_reward_model(&c->rc, err, errlen) != 0)
            return -1;
        c->own_rm = true;
    }
    c->lim = (struct wire_limits){.prompts = trainer_prompts(c->t),
                                  .vocab_size = trainer_policy(c->t)->cfg.vocab_size,
                                  .max_response_length = (int)cfg->data_max_response_length,
                                  .groups_in_step = config_gen_batch_size(cfg), /* a round's */
                                  .n = (int)cfg->rollout_n,
                                  .units = c->units,
                                  .world_size = env->world_size,
                                  .dp_rank = 0,
                                  .auth = NULL}; /* the colocated ranks' batches travel over MPI only */
    wire_limits_set_routes(&c->lim, &trainer_policy(c->t)->cfg, config_records_routes(cfg));
    c->lim.reward_parts = config_gdpo_parts(cfg);
    char sp[32] = ""; /* sequence parallelism: the ranks of a DP rank that share its sequences */
    if (env->at.cp_size > 1)
        snprintf(sp, sizeof sp, " x %s %d", cfg->actor_megatron_context_parallel_size > 1 ? "CP" : "SP",
                 env->at.cp_size);
    if (env->rank == 0)
        log_info("hybrid",
                 "%d colocated ranks: training DP %d%s x TP %d x PP %d; generating in %d engine(s) of %d rank(s), "
                 "%d work unit(s) per generation round%s; %s",
                 env->world_size, env->at.dp_size, sp, env->at.tp_size, env->at.pp_size, env->at.engines,
                 env->world_size / env->at.engines, c->units,
                 !cfg->placement_colocated_steal ? ""
                 : c->survive ? ", an idle engine takes the unstarted units of its host's slowest one (a lock-free "
                                "ledger in each host's shared memory: a rank may be lost)"
                              : ", an idle engine takes the slowest one's unstarted units",
                 c->gen ? "the weights are resharded into the generation layout each step"
                        : "generation uses the training weights in place");
    return 0;
}

/* After a lost rank (survive.c re-formed the groups and env): the ledger of work units over the survivors, as many
 * units as their engines take. The lost group's ledger is left behind (freeing its window would wait on the lost
 * rank). */
static void colocated_reform(void *ud, const struct survive_loss *loss)
{
    struct colocated *c = ud;
    const struct role_env *env = c->env;
    if (loss->left) { /* its model copy lost a rank: it generates nothing more; the ledger stays behind with the
                       * lost group (freeing its window would wait on the lost rank) */
        c->ledger = NULL;
        control_set_left(env->ctl, loss->reason); /* grpod: idle until the run ends */
        return;
    }
    control_set_survived(env->ctl, loss->ranks, loss->n, loss->reason); /* grpod: lost, the run goes on */
    control_set_layout(env->ctl, env->at.dp, env->at.dp_size);
    c->units = units_per_step(env->cfg, env->at.engines);
    c->head = env->at.engine_tp == 0;
    c->ledger = make_ledger(c);
    if (!c->ledger)
        check_failf(__FILE__, __LINE__, "the survivors' work-unit ledger: no shared memory on this host");
    char err[1024];
    if (!c->gen && gen_model_setup(c, err, sizeof err) != 0) /* a spare that took a shard's place */
        check_failf(__FILE__, __LINE__, "the generation model after a loss: %s", err);
    c->rc.policy = c->gen ? c->gen : trainer_policy(c->t);
    c->lim.units = c->units;
    c->lim.world_size = env->world_size;
    c->gen_at = -1;
}

static void colocated_ready(void *ud, struct trainer *t)
{
    struct colocated *c = ud;
    c->t = t;
    if (c->survive)
        survive_attach(c->survive, t);
    char err[1024];
    if (colocated_setup(c, err, sizeof err) != 0) {
        log_error("hybrid", "%s", err);
        control_finish(c->env->ctl, CONTROL_END_FAILED, err);
        check_failf(__FILE__, __LINE__, "%s", err); /* the other ranks wait for this one: end the job */
    }
}

static int run_colocated(struct role_env *env)
{
    struct colocated c = {.env = env, .head = env->at.engine_tp == 0, .engine = env->rollout_tp, .gen_at = -1};
    struct trainer_layout lay;
    trainer_layout_of(env, &lay);
    struct trainer_source src = {
        .ctx = &c, .next_batch = next_batch, .generates = true, .validate = validate, .metrics = colocated_metrics};
    if (env->cfg->trainer_survive_trainer_loss) /* launch checked the layout (survive_check) */
        c.survive = survive_create(env, colocated_reform, &c);
    int status = run_trainer_process(env, &lay, &src, colocated_ready, &c);
    if (env->rank == 0 && c.stolen_total)
        log_info("hybrid", "%lld work unit(s) were made by another engine than their own", (long long)c.stolen_total);
    if (!c.own_rm)
        c.rc.rm = NULL;     /* the trainer's */
    gen_ctx_release(&c.rc); /* the engine's turn environment, and the reward model it loaded */
    model_free(c.gen);
    if (c.engine_dev)
        comm_free(c.engine_dev);
    free(c.whole);
    units_ledger_free(c.ledger);
    survive_free(c.survive); /* after the ledger: it holds the survivors' group */
    return status;
}

int run_hybrid(struct role_env *env)
{
    if (env->world_size > 1)
        return run_colocated(env);
    struct local_source ls;
    struct trainer_source src = local_source(&ls, env->cfg);
    return run_trainer_process(env, NULL, &src, local_source_ready, &ls);
}
