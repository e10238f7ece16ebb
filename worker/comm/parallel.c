#include "parallel.h"

#include <stddef.h>

int parallel_coords_of(int rank, int world_size, int tp_size, int pp_size, struct parallel_coords *out)
{
    if (tp_size < 1 || pp_size < 1 || world_size % (tp_size * pp_size) != 0 || rank < 0 || rank >= world_size)
        return -1;
    out->tp_size = tp_size;
    out->pp_size = pp_size;
    out->dp_size = world_size / (tp_size * pp_size);
    out->tp_rank = rank % tp_size;
    out->dp_rank = (rank / tp_size) % out->dp_size;
    out->pp_rank = rank / (tp_size * out->dp_size);
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
