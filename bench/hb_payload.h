/* The heartbeat payload of the control-plane benches (grpod_bench, sim_ranks): ten verl metrics and four phase
 * timings, as a worker's heartbeat carries them. */
#pragma once

#include "proto/protocol.h"

struct hb_payload {
    Grpo__Metric m[10], *mp[10];
    Grpo__PhaseTime pt[4], *ptp[4];
};

/* Fill p and point hb's metrics and timings at it (p must outlive hb's sends). */
static inline void hb_payload_set(struct hb_payload *p, Grpo__Heartbeat *hb)
{
    static const char *names[] = {"actor/pg_loss",         "actor/kl_loss",       "actor/entropy",   "actor/grad_norm",
                                  "actor/pg_clipfrac",     "critic/score/mean",   "perf/throughput", "timing_s/gen",
                                  "timing_s/update_actor", "response_length/mean"};
    for (int k = 0; k < 10; k++) {
        grpo__metric__init(&p->m[k]);
        p->m[k].name = (char *)names[k];
        p->m[k].value = 0.1 * k;
        p->mp[k] = &p->m[k];
    }
    for (int k = 0; k < 4; k++) {
        grpo__phase_time__init(&p->pt[k]);
        p->pt[k].phase = (Grpo__Phase)(k + 1);
        p->pt[k].seconds = 1.5 * (k + 1);
        p->ptp[k] = &p->pt[k];
    }
    hb->metrics = p->mp;
    hb->n_metrics = 10;
    hb->timings = p->ptp;
    hb->n_timings = 4;
}
