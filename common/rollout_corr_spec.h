/* algorithm.rollout_correction's keys as verl v0.9 reads them (rollout_corr_helper.py's parsers): the importance-
 * sampling level and threshold (TIS, or IcePop's "lower_upper"), the rejection-sampling options with their
 * thresholds, bypass mode and its loss type. The computation is worker/trainer/rollout_corr.h's. */
#ifndef GRPO_COMMON_ROLLOUT_CORR_SPEC_H
#define GRPO_COMMON_ROLLOUT_CORR_SPEC_H

#include <stdbool.h>
#include <stddef.h>

enum rc_level { RC_OFF, RC_TOKEN, RC_SEQUENCE };

/* rollout_rs's options, in verl's names: rc_rs_names[stat] */
enum rc_rs_stat {
    RS_TOKEN_K1,
    RS_TOKEN_K2,
    RS_TOKEN_K3,
    RS_SEQ_SUM_K1,
    RS_SEQ_SUM_K2,
    RS_SEQ_SUM_K3,
    RS_SEQ_MEAN_K1,
    RS_SEQ_MEAN_K2,
    RS_SEQ_MEAN_K3,
    RS_SEQ_MAX_K2,
    RS_SEQ_MAX_K3,
    RS_NSTATS
};
extern const char *const rc_rs_names[RS_NSTATS];
/* The options on the ratio (k1: -log r), whose thresholds are ratio bounds "lower_upper". */
bool rc_rs_is_k1(enum rc_rs_stat s);

struct rc_rs {
    enum rc_rs_stat stat;
    double lower, upper; /* k1 options: ratio bounds (lower > 0; the statistic is kept within [log lower, log upper]);
                            k2, k3: upper bound alone (lower 0) */
};

struct rollout_corr {
    enum rc_level is;     /* rollout_is */
    double is_upper;      /* rollout_is_threshold: TIS's upper bound, or IcePop's */
    double is_lower;      /* IcePop's lower bound ("lower_upper"); 0: TIS */
    bool batch_normalize; /* rollout_is_batch_normalize */
    int n_rs;             /* rollout_rs's options, in their order, duplicates dropped */
    struct rc_rs rs[RS_NSTATS];
    bool bypass;    /* bypass_mode */
    bool reinforce; /* loss_type reinforce (bypass mode); false: ppo_clip */
};

/* verl's keys (their text values as config holds them; "null" or "" for none) into rc; -1 with err naming the key
 * and what is wrong, as verl's parsers refuse it. */
int rollout_corr_parse(const char *rollout_is, const char *is_threshold, bool batch_normalize, const char *rollout_rs,
                       const char *rs_threshold, bool bypass, const char *loss_type, struct rollout_corr *rc, char *err,
                       size_t errlen);

/* Whether weights or rejection apply (not metrics alone). */
static inline bool rollout_corr_active(const struct rollout_corr *rc) { return rc->is != RC_OFF || rc->n_rs > 0; }

#endif
