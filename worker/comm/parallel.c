#include "parallel.h"

#include <stddef.h>

#include "common/placement.h"

/* The Megatron arithmetic is common/placement.c's (grpod assigns with it): one hybrid group of world_size. */
int parallel_coords_sized(int rank, int world_size, const struct parallel_sizes *sz, struct parallel_coords *out)
{
    const struct placement_spec spec = {.trainer_ranks = 0,
                                        .rollout_ranks = 0,
                                        .tp_size = sz->tp,
                                        .pp_size = sz->pp,
                                        .cp_size = sz->cp,
                                        .ep_size = sz->ep};
    struct placement p;
    char why[256];
    if (placement_of(&spec, rank, world_size, &p, why, sizeof why) != 0)
        return -1;
    *out = (struct parallel_coords){.dp_rank = p.dp,
                                    .dp_size = p.dp_size,
                                    .tp_rank = p.tp,
                                    .tp_size = p.tp_size,
                                    .pp_rank = p.pp,
                                    .pp_size = p.pp_size,
                                    .cp_rank = p.cp,
                                    .cp_size = p.cp_size,
                                    .ep_rank = p.ep,
                                    .ep_size = p.ep_size};
    return 0;
}

int parallel_coords_of(int rank, int world_size, int tp_size, int pp_size, struct parallel_coords *out)
{
    const struct parallel_sizes sz = {.tp = tp_size, .pp = pp_size};
    return parallel_coords_sized(rank, world_size, &sz, out);
}

int parallel_rank_of(const struct parallel_coords *at)
{
    const int cp = at->cp_size > 1 ? at->cp_size : 1;
    return ((at->pp_rank * at->dp_size + at->dp_rank) * cp + at->cp_rank) * at->tp_size + at->tp_rank;
}

int parallel_groups_init_sized(struct parallel_groups *g, struct comm *world, const struct parallel_sizes *sz)
{
    *g = (struct parallel_groups){0};
    if (parallel_coords_sized(comm_rank(world), comm_size(world), sz, &g->at) != 0)
        return -1;
    const struct parallel_coords *a = &g->at;
    const int T = a->tp_size, C = a->cp_size, D = a->dp_size, E = a->ep_size;
    g->world = world;
    /* color: what the group members share; key: the position inside the group. comm_split is collective over
     * world, so every rank makes the same splits in the same order. */
    g->tp = comm_split(world, (a->pp_rank * D + a->dp_rank) * C + a->cp_rank, a->tp_rank);
    g->dp = comm_split(world, (a->pp_rank * C + a->cp_rank) * T + a->tp_rank, a->dp_rank);
    g->pp = comm_split(world, (a->dp_rank * C + a->cp_rank) * T + a->tp_rank, a->pp_rank);
    if (C > 1) {
        g->cp = comm_split(world, (a->pp_rank * D + a->dp_rank) * T + a->tp_rank, a->cp_rank);
        g->dpcp = comm_split(world, a->pp_rank * T + a->tp_rank, a->dp_rank * C + a->cp_rank);
    }
    if (E > 1) {
        const int egroup = a->dp_rank / E;
        g->ep = comm_split(world, ((a->pp_rank * (D / E) + egroup) * C + a->cp_rank) * T + a->tp_rank, a->ep_rank);
        g->edp = comm_split(world, ((a->pp_rank * E + a->ep_rank) * C + a->cp_rank) * T + a->tp_rank, egroup);
        if (T > 1)
            g->etp = comm_split(world, (a->pp_rank * (D / E) + egroup) * C + a->cp_rank, a->ep_rank * T + a->tp_rank);
    }
    /* the flight recorder's names: "all-reduce #1234 of dp (ranks 0-4,6-7)" */
    static const char *names[] = {"tp", "dp", "pp", "cp", "dp-cp", "ep", "edp", "etp"};
    struct comm *all[] = {g->tp, g->dp, g->pp, g->cp, g->dpcp, g->ep, g->edp, g->etp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i])
            comm_set_name(all[i], names[i]);
    return 0;
}

int parallel_groups_init(struct parallel_groups *g, struct comm *world, int tp_size, int pp_size)
{
    const struct parallel_sizes sz = {.tp = tp_size, .pp = pp_size};
    return parallel_groups_init_sized(g, world, &sz);
}

struct comm *parallel_grad_group(const struct parallel_groups *g) { return g->dpcp ? g->dpcp : g->dp; }

void parallel_groups_free(struct parallel_groups *g)
{
    struct comm **all[] = {&g->tp, &g->dp, &g->pp, &g->cp, &g->dpcp, &g->ep, &g->edp, &g->etp};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (*all[i])
            comm_free(*all[i]);
        *all[i] = NULL;
    }
}
