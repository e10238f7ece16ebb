/* Parallel layout: world ranks arranged as (PP, DP, CP, TP) with TP fastest, as
 * Megatron does, so that a TP group sits on neighbouring ranks (one node, the
 * fastest links), the ranks sharing a sequence (CP) next, and PP stages are the
 * farthest apart. Expert-parallel groups are made of DP ranks (common/placement.h). */
#ifndef GRPO_WORKER_PARALLEL_H
#define GRPO_WORKER_PARALLEL_H

#include "comm.h"

struct parallel_coords {
    int dp_rank, dp_size;
    int tp_rank, tp_size;
    int pp_rank, pp_size;
    int cp_rank, cp_size; /* the ranks that share each sequence (1: none) */
    int ep_rank, ep_size; /* expert parallelism over DP ranks (1: none) */
};

/* Sizes of a layout beyond DP (DP is what is left of the world); 0 counts as 1. */
struct parallel_sizes {
    int tp, pp, cp, ep;
};

struct parallel_groups {
    struct parallel_coords at;
    struct comm *world, *dp, *tp, *pp;
    /* NULL when their size is 1 (use parallel_grad_group for the dense gradients' sum):
     * cp:   the ranks that share this rank's sequences (same PP, DP, TP);
     * dpcp: DP x CP, the ranks whose dense gradients add up (same PP, TP);
     * ep:   the expert-parallel group (same PP, CP, TP, dp / ep_size);
     * edp:  the ranks that hold the same experts (same PP, CP, TP, ep_rank), whose expert gradients add up;
     * etp:  EP x TP, the ranks of one model copy under EP with TP (same PP, CP, dp / ep_size), ranked
     *       ep_rank x TP + tp_rank; NULL unless both sizes are above 1 */
    struct comm *cp, *dpcp, *ep, *edp, *etp;
};

/* Coordinates of world rank `rank` for the given sizes; -1 if world_size != dp*tp*pp. */
int parallel_coords_of(int rank, int world_size, int tp_size, int pp_size, struct parallel_coords *out);
/* As parallel_coords_of with CP and EP too; -1 if they do not fit. */
int parallel_coords_sized(int rank, int world_size, const struct parallel_sizes *sz, struct parallel_coords *out);
/* World rank of the given coordinates. */
int parallel_rank_of(const struct parallel_coords *at);
/* Build the DP, TP and PP sub-groups of world (collective over world). -1 if sizes do not fit. */
int parallel_groups_init(struct parallel_groups *g, struct comm *world, int tp_size, int pp_size);
/* As parallel_groups_init with CP and EP, which add the cp, dpcp, ep and edp groups where their size is above 1. */
int parallel_groups_init_sized(struct parallel_groups *g, struct comm *world, const struct parallel_sizes *sz);
/* The group over which dense (non-expert) gradients are summed: DP x CP (dpcp) when CP > 1, else DP. */
struct comm *parallel_grad_group(const struct parallel_groups *g);
/* Free the sub-groups (not world). */
void parallel_groups_free(struct parallel_groups *g);

#endif
