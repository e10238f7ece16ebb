/* Inside the MPI back-end: what comm_mpi.c and comm_ft.c (its fault-tolerant part) share. Not for other modules. */
#ifndef GRPO_WORKER_COMM_MPI_IMPL_H
#define GRPO_WORKER_COMM_MPI_IMPL_H

#include <mpi.h>
#include <stdbool.h>

struct comm;

struct mpi_impl {
    MPI_Comm comm; /* first member: mc() reads it through the impl pointer */
    bool owned;
    bool alone;   /* comm_fail_alone: an error ends this rank only */
    bool watched; /* comm_ft_watch: errors come back to comm_check, which hands a lost peer to the handler */
    bool revoked; /* comm_revoke: dead; freeing it releases the wrapper only (MPI_Comm_free would wait on peers) */
};

/* A new comm around m (this back-end's; freed by comm_free, which frees m). */
struct comm *comm_mpi_adopt(MPI_Comm m);

/* comm_check's part for fault tolerance: when rc says that a peer of c is lost (or that a survivor revoked c) and
 * a handler is set (comm_set_peer_lost_handler), call it; it does not return then. Otherwise return. */
void comm_ft_check(struct comm *c, int rc, const char *expr);

#endif
