/* CHECK_MPI(call): report an MPI error with its text, file and line, then end
 * the job through MPI_Abort so no rank is left waiting in a collective. */
#ifndef GRPO_COMMON_CHECK_MPI_H
#define GRPO_COMMON_CHECK_MPI_H

#include <mpi.h>

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

/* Fatal hook for MPI programs: take every rank down, not just this one. */
static inline void check_mpi_abort_hook(int code)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin)
        MPI_Abort(MPI_COMM_WORLD, code);
}

#endif
