/* CHECK_MPI(call): report an MPI error with its text, file and line, then end
 * the job through MPI_Abort so no rank is left waiting in a collective. */
#ifndef GRPO_COMMON_CHECK_MPI_H
#define GRPO_COMMON_CHECK_MPI_H

#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static inline void check_mpi_impl(int rc, const char *file, int line, const char *expr)
{
    if (rc == MPI_SUCCESS)
        return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    check_fail(file, line, expr, text);
}

#define CHECK_MPI(call) check_mpi_impl((call), __FILE__, __LINE__, #call)

/* True when mpirun keeps the job after a rank dies (--mca orte_enable_recovery 1). */
static inline int check_mpi_recovery_mode(void)
{
    const char *v = getenv("OMPI_MCA_orte_enable_recovery");
    return v && (strcmp(v, "1") == 0 || strcmp(v, "true") == 0);
}

/* End the whole job, not just this rank. When mpirun keeps the job after a rank dies, MPI_Abort ends only the
 * caller and the others would wait for it for ever: the launcher this rank runs under (mpirun or its node's
 * daemon) is told to end first, and it takes the job's ranks down with it. */
static inline void check_mpi_end_job(int code)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    int size = 1;
    if (init && !fin)
        MPI_Comm_size(MPI_COMM_WORLD, &size);
    /* only a rank that mpirun started (a process alone has no job to end, and its parent is a shell) */
    if (size > 1 && getenv("OMPI_COMM_WORLD_SIZE") && check_mpi_recovery_mode() && getppid() > 1)
        kill(getppid(), SIGTERM);
    if (init && !fin)
        MPI_Abort(MPI_COMM_WORLD, code);
}

/* Fatal hook for MPI programs: take every rank down, not just this one. */
static inline void check_mpi_abort_hook(int code) { check_mpi_end_job(code); }

#endif
