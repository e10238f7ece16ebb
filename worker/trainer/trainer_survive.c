/* The trainer's part in surviving a lost trainer rank (trainer.survive_trainer_loss; the policy is
 * worker/survive/survive.c's): its state at the start of a step, kept so that an interrupted step can be redone from
 * there, and its layout moved onto the survivors' smaller DP group. Plain data parallelism on the CPU only (the
 * survive module refuses the rest): every rank holds the whole policy and optimizer state, so each survivor's own
 * copy of a step's start is the run's. */
#include <stdlib.h>
#include <string.h>

#include "trainer_internal.h"
#include "common/check.h"
#include "grad_reduce.h"
#include "worker/comm/comm.h"
#include "worker/model/lora.h"
#include "worker/model/model.h"

struct trainer_snapshot {
    int64_t step; /* the step whose start this is (-1: none yet) */
    size_t n;     /* trainable floats */
    float *params, *m, *v;
    int64_t opt_t;       /* AdamW steps taken */
    struct run_state st; /* steps done, the data cursor, the seed */
};

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
    free(s->params), free(s->m), free(s->v);
    free(s);
}

int64_t trainer_snapshot_step(const struct trainer_snapshot *s) { return s ? s->step : -1; }

size_t trainer_snapshot_bytes(const struct trainer_snapshot *s) { return 3 * s->n * sizeof(float); }

void trainer_snapshot_take(struct trainer *t, struct trainer_snapshot *s)
{
    const struct trainable tr = model_trainable(t->policy);
    if (s->n != tr.n) {
        free(s->params), free(s->m), free(s->v);
        s->n = tr.n;
        s->params = xmalloc(tr.n * sizeof(float));
        s->m = xmalloc(tr.n * sizeof(float));
        s->v = xmalloc(tr.n * sizeof(float));
    }
    /* host memory on the CPU (GPUs are refused: their state would be copied through the host) */
    memcpy(s->params, tr.params, tr.n * sizeof(float));
    memcpy(s->m, t->opt->m, tr.n * sizeof(float));
    memcpy(s->v, t->opt->v, tr.n * sizeof(float));
    s->opt_t = t->opt->t;
    s->st = t->st;
    s->step = t->st.global_step + 1;
}

void trainer_snapshot_restore(struct trainer *t, const struct trainer_snapshot *s)
{
    const struct trainable tr = model_trainable(t->policy);
    memcpy(tr.params, s->params, tr.n * sizeof(float));
    memcpy(t->opt->m, s->m, tr.n * sizeof(float));
    memcpy(t->opt->v, s->v, tr.n * sizeof(float));
    t->opt->t = s->opt_t;
    t->st = s->st;
    /* the prompts drawn since (the interrupted step's) are drawn again */
    data_cursor_seek(&t->cursor, (long)t->st.epoch, (int)t->st.cursor);
}

int trainer_reform(struct trainer *t, struct comm *all, struct comm *dp, int dp_rank, int dp_size, char *err,
                   size_t errlen)
{
    t->lay.all = all;
    t->lay.dp = dp;
    t->lay.dp_rank = dp_rank;
    t->lay.dp_size = dp_size;
    t->lay.devices = dp_size;
    t->in_decide = false;
    /* the buckets' requests in flight on the lost group are left behind (MPI cannot cancel them); the backward's
     * hook to them goes first, then new buckets over the new group */
    model_set_layer_grads_hook(t->policy, NULL, NULL);
    grad_reducer_free(t->overlap);
    t->overlap = NULL;
    trainer_overlap_setup(t);
    /* whatever the interrupted step held (gradients, activations, KV caches) starts again empty */
    model_free_grads(t->policy);
    model_release_buffers(t->policy, MODEL_BUF_TRAIN | MODEL_BUF_GEN);
    if (t->ref)
        model_release_buffers(t->ref, MODEL_BUF_TRAIN | MODEL_BUF_GEN);
    /* verl's global micro-batch keys are divided by the DP size: by the new one from here */
    return trainer_resolve_micro_batches(t, err, errlen);
}

void trainer_set_recovery(struct trainer *t, const struct trainer_recovery *r) { t->rec = *r; }
