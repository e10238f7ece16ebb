/* A split run that survives a lost trainer rank (trainer.survive_trainer_loss; worker/survive/ re-forms the
 * trainers' groups and brings the survivors back to the step's start). What the split source adds: the step's data
 * must still be there when the survivors redo the step with one DP rank fewer. So the rollout ranks send each whole
 * work unit to DP rank 0 (the lead, which runs the dispatcher), the lead keeps the units of the last two steps and
 * hands a step's to every trainer in one broadcast, and each trainer keeps its DP share of each unit, cut as the
 * rollout ranks cut it without the key (step_batch_balance over the DP ranks now in the run). A step redone after a
 * loss takes its units from the lead's copy: nothing is generated, sent or trained twice. When the lead itself is
 * lost, the survivors' DP rank 0 takes the lead at the redo (split_source.c, take_lead): the step's units are
 * granted anew and generated again (the same groups: each has its own RNG stream), none trained twice. */
#include "split_internal.h"
#include "worker/survive/survive.h"

bool split_is_lead(const struct trainer_rank *r)
{
    const struct placement *at = &r->env->at;
    return at->dp == 0 && at->tp == 0 && at->pp == 0 && at->cp == 0;
}

bool split_kept_step(const struct trainer_rank *r, int64_t k)
{
    return r->whole && split_is_lead(r) && r->kept[k % 2] && r->kept_step[k % 2] == k;
}

/* The lead: step k's pending units packed into slot k % 2 (padded to 32-bit words for the broadcast), taken out of
 * the pending list. */
static void keep_step(struct trainer_rank *r, int64_t k)
{
    struct astream_step s = {0};
    s.h = xcalloc((size_t)r->n_pend + 1, sizeof *s.h);
    s.b = xcalloc((size_t)r->n_pend + 1, sizeof *s.b);
    int w = 0;
    for (int i = 0; i < r->n_pend; i++) {
        struct pending *p = &r->pend[i];
        if (p->h.step != k) {
            r->pend[w++] = *p;
            continue;
        }
        s.h[s.n] = p->h;
        s.b[s.n++] = p->b; /* astream_step_free frees it */
        free(p->raw);
    }
    r->n_pend = w;
    size_t len = 0;
    uint8_t *msg = astream_step_pack(&s, &len);
    astream_step_free(&s);
    msg = split_pad_words(msg, len);
    const int slot = (int)(k % 2);
    free(r->kept[slot]);
    r->kept[slot] = msg;
    r->kept_len[slot] = len;
    r->kept_step[slot] = k;
}

/* The units in a kept message (its count, astream_step_pack's first 8 bytes). */
static int64_t kept_units(const uint8_t *msg, size_t len)
{
    uint64_t n = 0;
    for (size_t i = 0; i < 8 && i < len; i++) /* little-endian, as put64 writes it */
        n |= (uint64_t)msg[i] << (8 * i);
    return (int64_t)n;
}

int split_whole_step(struct trainer_rank *r, int64_t k)
{
    struct comm *all = r->env->trainers;
    const bool lead = split_is_lead(r);
    const int slot = (int)(k % 2);
    if (lead && split_kept_step(r, k))
        log_info("trainer", "step %lld redone from the %lld work unit(s) this rank kept: none pulled again",
                 (long long)k, (long long)kept_units(r->kept[slot], r->kept_len[slot]));
    else if (lead)
        keep_step(r, k);
    int64_t n = lead ? (int64_t)r->kept_len[slot] : 0;
    uint8_t *msg = lead ? r->kept[slot] : NULL;
    uint8_t *got = NULL;
    if (all && comm_size(all) > 1) { /* the others wait here while the lead pulls the step's units */
        msg = split_share_msg(r, msg, &n);
        if (!msg) {
            log_error("trainer", "step %lld: the lead's units of the step: a length of %lld bytes", (long long)k,
                      (long long)n);
            return -1;
        }
        got = lead ? NULL : msg;
    }
    struct astream_step s;
    char err[1024];
    const int rc = astream_step_unpack(msg, (size_t)n, &r->lim, &s, err, sizeof err);
    free(got);
    if (rc != 0) {
        log_error("trainer", "step %lld: the lead's units of the step: %s", (long long)k, err);
        return -1;
    }
    const bool shared = split_packs_shared_prompts(r);
    for (int i = 0; i < s.n; i++) { /* this DP rank's share of each unit, as a batch that came for it */
        step_batch_keep_dp_share(&s.b[i], r->env->at.dp, r->env->at.dp_size, shared);
        split_keep_pending(r, &(struct pending){.h = s.h[i], .b = s.b[i]});
        s.b[i] = (struct step_batch){0}; /* the pending list owns it */
    }
    astream_step_free(&s);
    return 0;
}

/* survive's hook once the trainers re-formed without a lost one: grpod hears of it, and of the new layout. A rank
 * whose model copy (TP or PP) lost a rank leaves: grpod hears it is idle, and the lead, alive in a copy that left,
 * closes its data socket and dispatcher without a word of the end (the rollout processes, connected to every lead
 * endpoint, go on with the new lead's: an open socket here would take units that nobody reads). */
static void split_reform(void *ud, const struct survive_loss *loss)
{
    struct trainer_rank *r = ud;
    if (loss->left) {
        control_set_left(r->env->ctl, loss->reason);
        r->lead_copy = false;
        if (r->disp || r->pull)
            log_info("trainer",
                     "the lead's model copy left: its dispatcher and data socket close here (the copy that leads "
                     "next takes the rollout processes over)");
        if (r->disp)
            dispatcher_close(r->disp, 0, 0);
        r->disp = NULL;
        if (r->pull)
            dataplane_pull_close(r->pull);
        r->pull = NULL;
        return;
    }
    control_set_survived(r->env->ctl, loss->ranks, loss->n, loss->reason);
    control_set_layout(r->env->ctl, r->env->at.dp, r->env->at.dp_size);
}

struct survive *split_survive_create(struct trainer_rank *r)
{
    if (!r->env->cfg->trainer_survive_trainer_loss) /* launch checked the layout (survive_check) */
        return NULL;
    r->whole = true;
    r->lead_copy = r->env->at.dp == 0;
    r->kept_step[0] = r->kept_step[1] = -1;
    return survive_create(r->env, split_reform, r);
}
