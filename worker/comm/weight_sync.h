/* Weight sync: the trainers' DP rank 0 sends the policy's parameters to every
 * rollout rank over the collective back-end, versioned, in buckets of a
 * configurable size, as one broadcast per bucket on a group that holds the
 * sender (rank 0 of the group) and the rollout ranks. A header goes first:
 * version (steps trained into the weights), whether the run ends here, whether
 * weights follow, their count, and the data cursor of the next step.
 *
 * The receiver is single-threaded and receives between generations, so a
 * rollout rank never generates with a half-updated model. */
#ifndef GRPO_WORKER_COMM_WEIGHT_SYNC_H
#define GRPO_WORKER_COMM_WEIGHT_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm.h"

struct weight_sync_header {
    int64_t version;       /* training steps in the weights */
    int64_t stop;          /* 1: the run ends here, nothing more follows */
    int64_t has_weights;   /* 1: the parameters follow */
    int64_t n_floats;      /* parameter count (checked against the receiver's model) */
    int64_t epoch, cursor; /* data cursor of the next step (the first message) */
    int64_t total_steps;
};

/* What one sync moved. */
struct weight_sync_stats {
    double seconds;
    size_t bytes;
    int buckets;
};

/* Sender (rank 0 of c): the header, then w[0..n) in buckets of bucket_bytes when h->has_weights. poll(ud) (may
 * be NULL) runs while the receivers have not taken the header (the sender answers pause requests). */
void weight_sync_send(struct comm *c, const struct weight_sync_header *h, const float *w, size_t n, size_t bucket_bytes,
                      struct weight_sync_stats *st, void (*poll)(void *ud, bool done), void *ud);
/* Receiver: the header into *h, then the weights into w when they follow; poll(ud) (may be NULL) runs while the
 * header has not come (the receiver answers pause requests). -1 with err when the sender's parameter count
 * differs from n (different models: nothing is received into w, and the run must end). */
int weight_sync_recv(struct comm *c, struct weight_sync_header *h, float *w, size_t n, size_t bucket_bytes,
                     struct weight_sync_stats *st, void (*poll)(void *ud, bool done), void *ud, char *err,
                     size_t errlen);

#endif
