#include "parallel.h"

#include <stddef.h>

#include "common/placement.h"

/* The Megatron arithmetic is common/placement.c's (grpod assigns with it): one hybrid group of world_size. */
int parallel_coords_of(int rank, int world_size, int tp_size, int pp_size, struct parallel_coords *out)
{
    const struct placement_spec spec = {.trainer_ranks = 0, .rollout_ranks = 0, .tp_size = tp_size, .pp_size = pp_size};
    struct placement p;
    char why[256];
    if (placement_of(&spec, rank, world_size, &p, why, sizeof why) != 0)
        return -1;
    *out = (struct parallel_coords){.dp_rank = p.dp,
                                    .dp_size = p.dp_size,
                                    .tp_rank = p.tp,
                                    .tp_size = p.tp_size,
                                    .pp_rank = p.pp,
                                    .pp_size = p.pp_size};
    return 0;
}

int parallel_rank_of(const struct parallel_coords *at)
{
    return (at->pp_rank * at->dp_size + at->dp_rank) * at->tp_size + at->tp_rank;
}

int parallel_groups_init(struct parallel_groups *g, struct comm *world, int tp_size, int pp_size)
{
    if (parallel_coords_of(comm_rank(world), comm_size(world), tp_size, pp_size, &g->at) != 0)
        return -1;
    const struct parallel_coords *a = &g->at;
    g->world = world;
    /* color: what the group members share; key: the position inside the group */
    g->tp = comm_split(world, a->pp_rank * a->dp_size + a->dp_rank, a->tp_rank);
    g->dp = comm_split(world, a->pp_rank * a->tp_size + a->tp_rank, a->dp_rank);
    g->pp = comm_split(world, a->dp_rank * a->tp_size + a->tp_rank, a->pp_rank);
    return 0;
}

void parallel_groups_free(struct parallel_groups *g)
{
    comm_free(g->tp);
    comm_free(g->dp);
    comm_free(g->pp);
    g->tp = g->dp = g->pp = NULL;
}
