/* The trainer's part in surviving a lost trainer rank (trainer.survive_trainer_loss; the policy is
 * worker/survive/survive.c's): its state at the start of a step, kept so that an interrupted step can be redone from
 * there, and its layout moved onto the survivors' smaller DP group. On the CPU, and on GPUs (trainer.device=cuda)
 * for plain DP (the survive module refuses the rest; on GPUs the step's start is copied to host memory and back, and
 * the DP group's NCCL twin is made again over the survivors). In plain data parallelism every rank holds the whole
 * policy and optimizer state, so each survivor's own copy of a step's start is the run's (with ZeRO-1 each block's
 * copy on the next rank). With TP or PP (model copies) each rank holds its shard's whole state, so its own copy is
 * its shard's; a spare that takes a lost rank's place becomes that shard (trainer_join_shard) and takes its values
 * from a replica (trainer_state_share, trainer_ref_share); a rank whose copy lost a rank leaves (trainer_leave). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "trainer_internal.h"
#include "common/check.h"
#include "common/dirlock.h"
#include "common/log.h"
#include "grad_reduce.h"
#include "zero1.h"
#include "worker/comm/comm.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"
#include "worker/watchdog/watchdog.h"

struct trainer_snapshot {
    int64_t step; /* the step whose start this is (-1: none yet) */
    size_t n;     /* trainable floats */
    size_t nb;    /* the optimizer floats this rank holds: n, or its ZeRO-1 block's */
    float *params, *m, *v;
    int64_t opt_t;       /* AdamW steps taken */
    struct run_state st; /* steps done, the data cursor, the seed */
    /* ZeRO-1: the layout the block was taken in (this DP rank of dp_size, its block [lo, hi) of the n floats) and
     * the moments of the previous DP rank's block [mlo, mhi) (its buddy's copy: that rank's loss loses nothing) */
    bool zero;
    int dp_rank, dp_size;
    size_t lo, hi, mlo, mhi, mcap;
    float *mm, *mv;
    /* In host memory without ZeRO-1, params, m and v are filled by the step's first optimizer step, each chunk
     * just before it changes (optim.h): until then the trainer's own state is the step's start (only that step
     * changes it, and a loss is found only in a collective, never inside it), and keep.kept says which holds it. */
    struct adamw_keep keep;
    /* On a GPU: params, m and v are that context's pinned host memory (hostK, NULL: malloc's), filled beside its
     * work (k_to_host_behind: issued once the step has given back its memory, whose frees would make the host wait
     * for the copy, trainer_keep_issue, or by the step's first optimizer step; keep.kept once issued); the host
     * waits for them (snapshot_wait, while behind is set) before it reads or frees them, the step's optimizer step
     * before it changes the state (adamw_keep.behind). The contexts live as long as the process
     * (worker/model/device.c). */
    struct kctx *hostK;
    bool behind;
};

/* s's copies beside a GPU's work done: its host memory may be read or freed */
static void snapshot_wait(struct trainer_snapshot *s)
{
    if (s->behind)
        k_behind_wait(s->hostK, true);
    s->behind = false;
}

static void keep_free(struct trainer_snapshot *s, float *p)
{
    if (p && s->hostK)
        s->hostK->ops->host_free(s->hostK, p);
    else
        free(p);
}

static void snapshot_release(struct trainer_snapshot *s)
{
    snapshot_wait(s);
    keep_free(s, s->params), keep_free(s, s->m), keep_free(s, s->v);
    s->params = s->m = s->v = NULL;
}

struct trainer_snapshot *trainer_snapshot_new(void)
{
    struct trainer_snapshot *s = xcalloc(1, sizeof *s);
    s->step = -1;
    return s;
}

void trainer_snapshot_free(struct trainer_snapshot *s)
{
    if (!s)
        return;
    snapshot_release(s);
    free(s->mm), free(s->mv);
    free(s);
}

int64_t trainer_snapshot_step(const struct trainer_snapshot *s) { return s ? s->step : -1; }

const float *trainer_snapshot_params(struct trainer_snapshot *s, size_t *n)
{
    snapshot_wait(s);
    *n = s->n;
    return s->params;
}

size_t trainer_snapshot_bytes(const struct trainer_snapshot *s)
{
    return (s->n + 2 * s->nb + 2 * (s->mhi - s->mlo)) * sizeof(float);
}

/* ZeRO-1: this rank's block of AdamW's moments to the next DP rank, the previous one's block from it, from and into
 * host memory (the snapshot's copy of the block: on GPUs the moments are the device's) over DP's MPI group (on GPUs
 * ZeRO-1's own group is its NCCL twin, which takes device memory) */
static void mirror_block(struct trainer *t, struct trainer_snapshot *s)
{
    const struct zero1 *z = t->zero;
    struct comm *dp = t->lay.dp;
    const int D = comm_size(dp), r = comm_rank(dp), prev = (r + D - 1) % D, next = (r + 1) % D;
    s->dp_rank = r;
    s->dp_size = D;
    s->lo = z->lo;
    s->hi = z->hi;
    s->mlo = (size_t)prev * z->per < z->n ? (size_t)prev * z->per : z->n;
    s->mhi = s->mlo + z->per < z->n ? s->mlo + z->per : z->n;
    if (s->mcap < z->per + 1) {
        free(s->mm), free(s->mv);
        s->mcap = z->per + 1;
        s->mm = xmalloc(s->mcap * sizeof(float));
        s->mv = xmalloc(s->mcap * sizeof(float));
    }
    comm_sendrecv(dp, s->m, s->nb, next, s->mm, s->mhi - s->mlo, prev, COMM_F32);
    comm_sendrecv(dp, s->v, s->nb, next, s->mv, s->mhi - s->mlo, prev, COMM_F32);
}

/* bytes of K's memory at src to host memory at dst, and back (a GPU's through its copies; the CPU's in place) */
static void state_to_host(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    if (K->device == KDEV_CPU)
        memcpy(dst, src, bytes);
    else
        k_to_host(K, dst, src, bytes);
}
static void state_to_device(struct kctx *K, void *dst, const void *src, size_t bytes)
{
    if (K->device == KDEV_CPU)
        memcpy(dst, src, bytes);
    else
        k_to_device(K, dst, src, bytes);
}

/* n floats for a copy of the state: on a GPU its context's pinned host memory (s->hostK), which its copies fill at
 * the link's full speed beside the compute (pageable memory would make each copy the host's, staged); elsewhere
 * in huge pages where the kernel gives them (transparent huge pages on madvise), fewer pages to map and look up for
 * gigabytes copied every step. (They do not make the first touch cheap on the test machine's virtual machine: 1.1 s
 * a GB either way, which is why trainer_snapshot_reserve touches it before the first step.) */
static float *keep_alloc(struct trainer_snapshot *s, size_t n)
{
    if (s->hostK) /* NULL: refused */
        return s->hostK->ops->host_alloc(s->hostK, n * sizeof(float));
    const size_t huge = (size_t)2 << 20, bytes = (n * sizeof(float) + huge - 1) / huge * huge;
    void *p = NULL;
    if (bytes < 4 * huge || posix_memalign(&p, huge, bytes) != 0)
        return xmalloc(n * sizeof(float));
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: without it the pages are the usual ones */
#endif
    return p;
}

/* s's buffers for t's state as it is now; true when they were made anew */
static bool snapshot_fit(struct trainer *t, struct trainer_snapshot *s)
{
    const size_t n = model_trainable(t->policy).n, nb = t->opt->n; /* nb: the whole model's, or the ZeRO-1 block's */
    if (s->n == n && s->nb == nb && s->params)
        return false;
    snapshot_release(s);
    s->n = n;
    s->nb = nb;
    /* pinned where a GPU's copies fill it beside its work (trainer_snapshot_take) */
    struct kctx *K = t->policy->K;
    s->hostK = K->device != KDEV_CPU && K == t->opt->K && K->ops->host_alloc ? K : NULL;
    s->params = keep_alloc(s, n);
    s->m = keep_alloc(s, nb + 1);
    s->v = keep_alloc(s, nb + 1);
    if (s->hostK && (!s->params || !s->m || !s->v)) {
        log_warn("survive",
                 "%.1f MB of pinned host memory for a copy of the step's start refused by the device's driver: the "
                 "copies go through pageable memory, and the host waits for them at each step's start",
                 (double)(n + 2 * (nb + 1)) * sizeof(float) / 1e6);
        snapshot_release(s);
        s->hostK = NULL;
        s->params = keep_alloc(s, n);
        s->m = keep_alloc(s, nb + 1);
        s->v = keep_alloc(s, nb + 1);
    }
    return true;
}

size_t trainer_snapshot_reserve(struct trainer *t, struct trainer_snapshot *s)
{
    if (!snapshot_fit(t, s))
        return 0;
    /* touched now: a first touch costs the memory's mapping (seconds for gigabytes on a virtual machine), once */
    memset(s->params, 0, s->n * sizeof(float));
    memset(s->m, 0, (s->nb + 1) * sizeof(float));
    memset(s->v, 0, (s->nb + 1) * sizeof(float));
    return trainer_snapshot_bytes(s);
}

void trainer_snapshot_take(struct trainer *t, struct trainer_snapshot *s)
{
    const struct trainable tr = model_trainable(t->policy);
    const size_t nb = t->opt->n;
    snapshot_fit(t, s);
    s->step = -1; /* whole only once taken */
    s->opt_t = t->opt->t;
    s->st = t->st;
    s->zero = t->zero != NULL;
    s->mlo = s->mhi = 0;
    snapshot_wait(s); /* a slot's copies of two steps ago (done long since) */
    s->keep = (struct adamw_keep){.p = s->params, .m = s->m, .v = s->v};
    if (!s->zero && t->policy->K->device == KDEV_CPU && t->opt->K->device == KDEV_CPU && nb == tr.n) {
        s->keep.armed = true; /* the first optimizer step copies it (trainer_snapshot_settle after a step without) */
        t->opt->keep = &s->keep;
    } else if (!s->zero && s->hostK && nb == tr.n) {
        /* a GPU's, beside its work: issued once the step has freed what it gives back (trainer_keep_issue), then
         * the step's generation, forward and backward run while the link copies; its first optimizer step waits
         * for the copies (adamw_keep.behind), the host before it reads them (snapshot_wait). Until issued the
         * trainer's own state is the step's start (keep.kept false), as on the CPU. */
        s->keep.beside = true;
        s->behind = true;
        t->opt->keep = &s->keep;
    } else { /* now: a GPU's state copied out; with ZeRO-1 the block's copy is what goes to the next rank */
        state_to_host(t->policy->K, s->params, tr.params, tr.n * sizeof(float));
        state_to_host(t->opt->K, s->m, t->opt->m, nb * sizeof(float));
        state_to_host(t->opt->K, s->v, t->opt->v, nb * sizeof(float));
        s->keep.kept = true;
        if (s->zero)
            mirror_block(t, s);
    }
    s->step = t->st.global_step + 1;
}

bool trainer_snapshot_deferred(const struct trainer_snapshot *s) { return s->keep.armed; }

bool trainer_snapshot_beside(const struct trainer_snapshot *s) { return s->keep.beside || s->keep.behind; }

void trainer_keep_issue(struct trainer *t)
{
    if (t->opt->keep)
        adamw_keep_issue(t->opt, model_trainable(t->policy).params);
}

void trainer_snapshot_settle(struct trainer *t, struct trainer_snapshot *s)
{
    if (t->opt->keep == &s->keep) {
        /* a GPU's copy not issued: the step took no optimizer step, its state is still its start */
        adamw_keep_issue(t->opt, model_trainable(t->policy).params);
        t->opt->keep = NULL;
    }
    s->keep.behind = NULL; /* no optimizer step waited for the copies: the host does, when it reads them */
    if (!s->keep.armed)
        return;
    /* the step took no optimizer step (every mini-batch skipped): its state is still its start */
    const struct trainable tr = model_trainable(t->policy);
    adamw_copy_out(s->params, tr.params, tr.n);
    adamw_copy_out(s->m, t->opt->m, tr.n);
    adamw_copy_out(s->v, t->opt->v, tr.n);
    s->keep.armed = false;
    s->keep.kept = true;
}

int trainer_zero1_restorable(const int *lost, int n_lost, int dp_size, char *err, size_t errlen)
{
    for (int i = 0; i < n_lost; i++)
        for (int j = 0; j < n_lost; j++)
            if (lost[j] == (lost[i] + 1) % dp_size)
                return error_set(err, errlen,
                                 "ZeRO-1: DP rank %d's block of the optimizer state was kept by DP rank %d, lost "
                                 "too (two neighbours lost at once)",
                                 lost[i], lost[j]);
    return 0;
}

/* ZeRO-1: whole (host memory), the moments summed over the current DP group (every float from one rank), re-sharded
 * over it: the blocks into the optimizer's memory (a GPU's), over DP's NCCL twin on GPUs (made again over the
 * survivors by trainer_reform), as setup_zero1 makes them */
static void reshard(struct trainer *t, struct adamw *whole, int64_t opt_t)
{
    comm_allreduce_sum(t->lay.dp, whole->m, whole->n, COMM_F32);
    comm_allreduce_sum(t->lay.dp, whole->v, whole->n, COMM_F32);
    whole->t = opt_t;
    if (comm_size(t->lay.dp) < 2) { /* one DP rank left: it keeps the whole state, as a launch of DP 1 does (no
                                     * ZeRO-1, whose blocks on GPUs go over an NCCL twin DP 1 does not have) */
        struct adamw *o =
            adamw_create_on(t->opt->K, whole->n, whole->beta1, whole->beta2, whole->eps, whole->weight_decay);
        state_to_device(t->opt->K, o->m, whole->m, whole->n * sizeof(float));
        state_to_device(t->opt->K, o->v, whole->v, whole->n * sizeof(float));
        o->t = opt_t;
        adamw_free(whole);
        zero1_free(t->zero);
        t->zero = NULL;
        adamw_free(t->opt);
        t->opt = o;
        return;
    }
    struct zero1 *z = zero1_create(t->opt->K, t->dp_dev ? t->dp_dev : t->lay.dp, whole->n);
    struct adamw *block = zero1_shard(z, whole);
    adamw_free(whole);
    zero1_free(t->zero);
    adamw_free(t->opt);
    t->zero = z;
    t->opt = block;
    t->opt->t = opt_t;
}

int trainer_snapshot_restore(struct trainer *t, struct trainer_snapshot *s, const int *lost, int n_lost, char *err,
                             size_t errlen)
{
    const struct trainable tr = model_trainable(t->policy);
    if (!s) { /* a spare that joins: with ZeRO-1 its part of the re-sharding, no block of its own (zeros) */
        if (t->cfg->actor_megatron_use_distributed_optimizer)
            reshard(t, adamw_create(tr.n, t->opt->beta1, t->opt->beta2, t->opt->eps, t->opt->weight_decay), 0);
        return 0;
    }
    /* a copy the interrupted step's first optimizer step was to make is no longer wanted */
    if (t->opt->keep) {
        t->opt->keep->armed = false;
        t->opt->keep->beside = false;
        t->opt->keep->behind = NULL;
        t->opt->keep = NULL;
    }
    snapshot_wait(s); /* a GPU's copies, made beside its work, done */
    /* not kept: the loss came before the step's first optimizer step, and the state is still the step's start */
    if (s->keep.kept)
        state_to_device(t->policy->K, tr.params, s->params, tr.n * sizeof(float));
    t->st = s->st;
    /* the prompts drawn since (the interrupted step's) are drawn again */
    data_cursor_seek(&t->cursor, (long)t->st.epoch, (int)t->st.cursor);
    if (!s->zero) {
        if (s->keep.kept) {
            state_to_device(t->opt->K, t->opt->m, s->m, tr.n * sizeof(float));
            state_to_device(t->opt->K, t->opt->v, s->v, tr.n * sizeof(float));
        }
        t->opt->t = s->opt_t;
        return 0;
    }
    /* ZeRO-1: the whole moments from the survivors' blocks and, for each lost rank, its next rank's copy of its
     * block (every float from one rank, zeros from the others: the sum is exact), re-sharded over the survivors */
    if (trainer_zero1_restorable(lost, n_lost, s->dp_size, err, errlen) != 0)
        return -1;
    const size_t n = s->n;
    struct adamw *whole = adamw_create(n, t->opt->beta1, t->opt->beta2, t->opt->eps, t->opt->weight_decay);
    memcpy(whole->m + s->lo, s->m, (s->hi - s->lo) * sizeof(float));
    memcpy(whole->v + s->lo, s->v, (s->hi - s->lo) * sizeof(float));
    for (int i = 0; i < n_lost; i++)
        if ((lost[i] + 1) % s->dp_size == s->dp_rank) { /* this rank kept the lost one's block */
            memcpy(whole->m + s->mlo, s->mm, (s->mhi - s->mlo) * sizeof(float));
            memcpy(whole->v + s->mlo, s->mv, (s->mhi - s->mlo) * sizeof(float));
        }
    reshard(t, whole, s->opt_t);
    return 0;
}

/* n floats of K's memory at mem from root to every rank of g: in place on the CPU; on a GPU through a host buffer
 * (the group is MPI's, which takes host memory: root's copied out, the others' copied in). Its bytes. */
static size_t share_floats(struct comm *g, struct kctx *K, float *mem, size_t n, int root)
{
    if (K->device == KDEV_CPU) {
        comm_broadcast(g, mem, n, COMM_F32, root);
        return n * sizeof(float);
    }
    float *host = xmalloc(n * sizeof(float) + 1);
    const bool from_me = comm_rank(g) == root;
    if (from_me)
        k_to_host(K, host, mem, n * sizeof(float));
    comm_broadcast(g, host, n, COMM_F32, root);
    if (!from_me)
        k_to_device(K, mem, host, n * sizeof(float));
    free(host);
    return n * sizeof(float);
}

size_t trainer_state_share(struct trainer *t, int root)
{
    struct comm *g = t->lay.dp;
    const struct trainable tr = model_trainable(t->policy);
    /* plain DP: every rank holds the whole optimizer state, the joiner takes root's; ZeRO-1: the moments were
     * re-sharded over the group, the joiner's block with them (trainer_snapshot_restore) */
    share_floats(g, t->policy->K, tr.params, tr.n, root);
    size_t moments = 0;
    if (!t->zero) {
        share_floats(g, t->opt->K, t->opt->m, t->opt->n, root);
        share_floats(g, t->opt->K, t->opt->v, t->opt->n, root);
        moments = 2 * t->opt->n;
    }
    enum { WORDS = (sizeof(struct run_state) + 7) / 8 + 1 };
    int64_t w[WORDS] = {0};
    memcpy(w, &t->st, sizeof t->st);
    w[WORDS - 1] = t->opt->t;
    comm_broadcast(g, w, WORDS, COMM_I64, root);
    memcpy(&t->st, w, sizeof t->st);
    t->opt->t = w[WORDS - 1];
    /* the step's prompts from where the root's cursor stood at the step's start */
    data_cursor_seek(&t->cursor, (long)t->st.epoch, (int)t->st.cursor);
    return (tr.n + moments) * sizeof(float) + sizeof w;
}

int trainer_reform(struct trainer *t, struct comm *all, struct comm *dp, int dp_rank, int dp_size, char *err,
                   size_t errlen)
{
    t->lay.all = all;
    t->lay.dp = dp;
    t->lay.dp_rank = dp_rank;
    t->lay.dp_size = dp_size;
    t->lay.devices = dp_size;
    t->lay.spare = false; /* a spare that joins */
    t->in_decide = false;
    /* the buckets' requests in flight on the lost group are left behind (MPI cannot cancel them); the backward's
     * hook to them goes first, then new buckets over the new group */
    model_set_layer_grads_hook(t->policy, NULL, NULL);
    grad_reducer_free(t->overlap);
    t->overlap = NULL;
    /* on GPUs the lost group's NCCL twin (aborted when the loss was found: its queued sums dropped) goes, and the
     * survivors make a new one over dp: its rank 0 a new unique id, handed to the others over dp's MPI twin */
    if (t->dp_dev)
        comm_free(t->dp_dev);
    t->dp_dev = NULL;
    trainer_device_dp_setup(t);
    trainer_overlap_setup(t);
    /* whatever the interrupted step held (gradients, activations, KV caches) starts again empty */
    model_free_grads(t->policy);
    model_release_buffers(t->policy, MODEL_BUF_TRAIN | MODEL_BUF_GEN);
    if (t->ref)
        model_release_buffers(t->ref, MODEL_BUF_TRAIN | MODEL_BUF_GEN);
    /* verl's global micro-batch keys are divided by the DP size: by the new one from here */
    return trainer_resolve_micro_batches(t, err, errlen);
}

/* Multi-turn validation: the turn environment follows the model copy's new group (a spare that joined a copy is a
 * peer or its head now). */
static void env_follow(struct trainer *t)
{
    char err[1024];
    bool head;
    struct comm *group = trainer_env_group(t, &head);
    if (!t->src.validate && gen_ctx_env_regroup(&t->rc, group, head, err, sizeof err) != 0)
        check_failf(__FILE__, __LINE__, "multi-turn rollouts after the groups were formed again: %s", err);
}

void trainer_reform_groups(struct trainer *t, struct comm *tp, struct comm *pp, struct comm *mp)
{
    t->lay.tp = t->lay.tp ? tp : NULL;
    t->lay.pp = t->lay.pp ? pp : NULL;
    t->lay.mp = t->lay.mp ? mp : NULL;
    /* the model's copy group is its TP group where PP is 1 (model_create_shard) */
    struct comm *model_mp = t->lay.pp_size > 1 ? mp : tp;
    /* a spare that joined had no groups, nor their twins, before: it makes them with the others */
    if (trainer_on_device(t) && !t->lay.gpus_shared && (t->lay.tp || t->lay.pp)) {
        /* on GPUs the collectives go over the groups' NCCL twins: the lost ones (aborted by the loss's revoke)
         * freed, new ones made over the survivors' groups, each collectively in the same order on every rank of
         * the copy (tp, pp, then the copy's whole group where PP splits it) */
        trainer_free_model_devices(t);
        const int dev = t->policy->K->device_index;
        t->tp_dev = t->lay.tp ? comm_device_group(t->lay.tp, dev) : NULL;
        t->pp_dev = t->lay.pp ? comm_device_group(t->lay.pp, dev) : NULL;
        t->mp_dev = t->lay.pp_size > 1 ? comm_device_group(model_mp, dev) : t->tp_dev;
        if ((t->lay.tp && !t->tp_dev) || (t->lay.pp && !t->pp_dev) || !t->mp_dev)
            check_failf(__FILE__, __LINE__, "the survivors' TP and PP groups on GPUs: no NCCL communicator");
        tp = t->tp_dev, pp = t->pp_dev, model_mp = t->mp_dev;
        if (trainer_is_lead(t))
            log_info("trainer",
                     "TP %d x PP %d on GPUs: the model copies' aborted NCCL communicators made again over the "
                     "survivors' groups",
                     t->lay.tp_size, t->lay.pp_size);
    }
    model_set_groups(t->policy, tp, pp, model_mp);
    if (t->ref)
        model_set_groups(t->ref, tp, pp, model_mp);
    t->lay.devices = t->lay.dp_size * t->lay.tp_size * t->lay.pp_size; /* trainer_reform counted DP ranks */
    env_follow(t);
}

int trainer_model_device_groups(const struct trainer *t, struct comm **out)
{
    int n = 0;
    if (t->tp_dev)
        out[n++] = t->tp_dev;
    if (t->pp_dev)
        out[n++] = t->pp_dev;
    if (t->mp_dev && t->mp_dev != t->tp_dev)
        out[n++] = t->mp_dev;
    return n;
}

/* A spare's shard of whole (layout ml) in whole's context: on a GPU the whole weights go through host memory, where
 * the slice is cut, and the slice back into the device. */
static struct model *join_slice(const struct model *whole, const struct model_layout *ml)
{
    struct model *p = model_create_on(&whole->cfg, ml, whole->K);
    if (whole->K->device == KDEV_CPU) {
        model_shard_slice(p, whole->w.mem, p->w.mem);
        return p;
    }
    float *host = xmalloc(whole->w.n_floats * sizeof(float) + 1), *local = xmalloc(p->w.n_floats * sizeof(float) + 1);
    model_weights_to_host(whole, host);
    model_shard_slice(p, host, local);
    model_weights_from_host(p, local);
    free(host);
    free(local);
    return p;
}

void trainer_join_shard(struct trainer *t, int tp_rank, int tp_size, int pp_rank, int pp_size, struct comm *tp,
                        struct comm *pp, struct comm *mp)
{
    t->lay.tp_rank = tp_rank;
    t->lay.tp_size = tp_size;
    t->lay.tp = tp_size > 1 ? tp : NULL;
    t->lay.pp_rank = pp_rank;
    t->lay.pp_size = pp_size;
    t->lay.pp = pp_size > 1 ? pp : NULL;
    t->lay.mp = mp;
    /* nothing may point into the whole policy once it goes */
    model_set_layer_grads_hook(t->policy, NULL, NULL);
    grad_reducer_free(t->overlap);
    t->overlap = NULL;
    model_free_grads(t->policy);
    const struct model_layout ml = {tp_rank, tp_size, pp_rank, pp_size, t->lay.tp, t->lay.pp, mp, 0, 1, NULL, false};
    struct kctx *K = t->policy->K; /* on GPUs its device: the shard made there, sliced from the whole in host memory */
    struct model *p = join_slice(t->policy, &ml); /* the replica's values come over them */
    model_free(t->policy);
    t->policy = p;
    if (t->ref) {
        struct model *r = join_slice(t->ref, &ml);
        model_free(t->ref);
        t->ref = r;
    }
    struct adamw *o =
        adamw_create_on(K, model_trainable(p).n, t->opt->beta1, t->opt->beta2, t->opt->eps, t->opt->weight_decay);
    adamw_free(t->opt);
    t->opt = o;
    t->rc.policy = p;
    env_follow(t);
}

size_t trainer_ref_share(struct trainer *t, int root)
{
    if (!t->ref)
        return 0;
    return share_floats(t->lay.dp, t->ref->K, t->ref->w.mem, t->ref->w.n_floats, root);
}

void trainer_leave(struct trainer *t)
{
    watchdog_stop();      /* it completes no step from here */
    if (t->logger_open) { /* the lead: the new one appends to the run's metrics files */
        metrics_logger_close(&t->logger);
        t->logger_open = false;
    }
    if (t->run_lock_fd >= 0) { /* the new lead takes run.lock */
        close(t->run_lock_fd);
        t->run_lock_fd = -1;
    }
    model_set_layer_grads_hook(t->policy, NULL, NULL);
    grad_reducer_free(t->overlap); /* its requests on the lost copy's groups are left behind */
    t->overlap = NULL;
    model_free_grads(t->policy);
    model_release_buffers(t->policy, MODEL_BUF_TRAIN | MODEL_BUF_GEN);
    if (t->ref)
        model_release_buffers(t->ref, MODEL_BUF_TRAIN | MODEL_BUF_GEN);
    t->lay.all = NULL; /* alone: no barrier, broadcast or checkpoint with the others at the run's end */
    t->lay.dp = NULL;
    t->lay.dp_rank = 0;
    t->lay.dp_size = 1;
    t->lay.spare = true; /* it leads, validates and trains nothing */
    t->in_decide = false;
}

int trainer_latest_checkpoint(const struct trainer *t, char *out, size_t outlen)
{
    if (checkpoint_find_latest(t->ckpt_root, out, outlen) == 0)
        return 0;
    if (outlen)
        out[0] = '\0';
    return -1;
}

/* The newest step the lead's metrics hold (-1: none). */
static long logged_last(const struct trainer *t)
{
    const struct metrics_history *h = &t->logger.history;
    return h->n ? h->steps[h->n - 1].step : -1;
}

/* The checkpoint of step s is the one a relaunch takes: latest_checkpointed_iteration.txt names it, and it is whole. */
static bool checkpoint_in_place(const struct trainer *t, int64_t s)
{
    char latest[4096], want[4200];
    snprintf(want, sizeof want, "%s/global_step_%lld", t->ckpt_root, (long long)s);
    return checkpoint_find_latest(t->ckpt_root, latest, sizeof latest) == 0 && strcmp(latest, want) == 0;
}

int trainer_reform_records(struct trainer *t, bool lead_lost, char *err, size_t errlen)
{
    const int64_t s = t->st.global_step; /* restored: the redone step is s + 1 */
    t->peer_failed_rank = -1;            /* a trainer rank of the old numbering */
    int rewrite = 0;
    if (trainer_is_lead(t)) {
        const bool new_lead = !t->logger_open;
        if (new_lead)
            watchdog_set_lead();              /* it judges a stall's dumps and ends the job */
        if (new_lead && t->run_lock_fd < 0) { /* the lost lead's lock went with its process */
            char why[600];
            t->run_lock_fd = dirlock_take(t->run_dir, "run.lock", "another job", why, sizeof why);
            if (t->run_lock_fd < 0)
                log_warn("survive", "the new lead could not take the run directory's lock: %s", why);
        }
        /* the run's files again, from here: metrics.jsonl (appended: each line flushed as written, so every step
         * the lost lead logged is there), the TensorBoard events, the chart; a step past s (logged before the
         * loss came back to its start) goes, the redone step logs it once */
        if (new_lead || logged_last(t) > s) {
            if (t->logger_open)
                metrics_logger_close(&t->logger);
            t->logger_open = false;
            if (metrics_logger_open(&t->logger, t->run_dir, t->logger_sinks, (long)t->st.total_steps, (long)s,
                                    t->cfg->trainer_experiment_name) != 0)
                return error_set(err, errlen, "%s: the new lead cannot open the metrics files", t->run_dir);
            t->logger_open = true;
        }
        if (logged_last(t) < s) /* the lost lead died between a step's last collective and its line */
            log_warn("survive",
                     "%s/metrics.jsonl holds steps up to %ld only: the lost lead had not logged step %lld when it "
                     "was lost",
                     t->run_dir, logged_last(t), (long long)s);
        /* the lost lead was writing step s's checkpoint (its .tmp directory, never taken by a relaunch): written
         * again from the step's end, the same state every survivor restored */
        rewrite = lead_lost && s > 0 && trainer_save_due(t, s) && !checkpoint_in_place(t, s);
    }
    if (trainer_all_group(t))
        comm_broadcast(trainer_all_group(t), &rewrite, 1, COMM_I32, 0);
    if (!rewrite)
        return 0;
    if (trainer_is_lead(t))
        log_warn("survive", "the checkpoint of step %lld was not in place when the lead was lost: writing it again",
                 (long long)s);
    if (trainer_save_checkpoint(t) != 0) /* collective with ZeRO-1 */
        return error_set(err, errlen, "writing step %lld's checkpoint again failed (see the log)", (long long)s);
    return 0;
}

void trainer_set_recovery(struct trainer *t, const struct trainer_recovery *r) { t->rec = *r; }

bool trainer_zero1(const struct trainer *t) { return t->zero != NULL; }

struct comm *trainer_dp_device_group(const struct trainer *t) { return t->dp_dev; }
