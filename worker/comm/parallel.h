/* Parallel layout: world ranks arranged as (PP, DP, TP) with TP fastest, as
 * Megatron does, so that a TP group sits on neighbouring ranks (one node, the
 * fastest links) and PP stages are the farthest apart. */
#ifndef GRPO_WORKER_PARALLEL_H
#define GRPO_WORKER_PARALLEL_H

#include "comm.h"

struct parallel_coords {
    int dp_rank, dp_size;
    int tp_rank, tp_size;
    int pp_rank, pp_size;
};

struct parallel_groups {
    struct parallel_coords at;
    struct comm *world, *dp, *tp, *pp;
};

/* Coordinates of world rank `rank` for the given sizes; -1 if world_size != dp*tp*pp. */
int parallel_coords_of(int rank, int world_size, int tp_size, int pp_size, struct parallel_coords *out);
/* World rank of the given coordinates. */
int parallel_rank_of(const struct parallel_coords *at);
/* Build the DP, TP and PP sub-groups of world (collective over world). -1 if sizes do not fit. */
int parallel_groups_init(struct parallel_groups *g, struct comm *world, int tp_size, int pp_size);
/* Free the sub-groups (not world). */
void parallel_groups_free(struct parallel_groups *g);

#endif
