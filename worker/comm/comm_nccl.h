/* The NCCL back-end of the collective plane (comm_nccl.c, built with CUDA): registered as comm_backend_nccl, which
 * comm_device_group calls; the GPU tests call it by name. */
#ifndef GRPO_WORKER_COMM_NCCL_H
#define GRPO_WORKER_COMM_NCCL_H

#include "comm.h"

/* An NCCL communicator over the same ranks as an MPI comm; the unique id is shared with MPI_Bcast. Device memory
 * goes through NCCL; a host buffer (statistics, counts) through the group's MPI twin. */
struct comm *comm_nccl_from(struct comm *mpi_comm, int device);

#endif
