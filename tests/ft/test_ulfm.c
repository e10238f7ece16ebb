/* ULFM (Open MPI 5's fault-tolerant MPI) end to end, on 3 ranks: the last rank SIGKILLs itself in the middle of an
 * all-reduce (its part started, never finished); the survivors' all-reduce fails within a bounded time with
 * MPI_ERR_PROC_FAILED (or MPI_ERR_REVOKED, once the other survivor has revoked), they revoke the world, shrink it
 * to 2 ranks, name the lost rank from the failures they acknowledge, agree on a value (MPIX_Comm_agree: the AND of
 * their flags) and complete an all-reduce on the shrunk communicator with the right sum. The foundation the trainers'
 * re-formed groups stand on (docs/operations.md, "Open MPI 5 with fault tolerance (ULFM)").
 *
 *   scripts/mpirun_ft -np 3 --oversubscribe test_ulfm [--bound SECONDS]
 *
 * Each survivor prints its checks, one line each ("ok   ..." / "FAIL ..."), and exits 1 on a failed one; the
 * caller (tests/ft/test_ulfm.sh) checks the lines and mpirun's status. Needs the launch's fault tolerance
 * (mpirun --with-ft ulfm, which scripts/mpirun_ft gives): without it every rank says that the MPIX_FT attribute is
 * off, and the job ends with the lost rank. Built against an MPI without ULFM it only says so (exit 77). */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> /* Open MPI's extensions: ULFM's is ftmpi */
#endif

#ifndef OMPI_HAVE_MPI_EXT_FTMPI
/* Built against an MPI without ULFM (Debian's Open MPI 4.1: the default build): nothing to test with it; the ft test
 * compiles this file with Open MPI 5's mpicc instead. */
int main(void)
{
    puts("test_ulfm: this MPI has no ULFM (no ftmpi in mpi-ext.h): build against Open MPI 5 (meson -Dmpi_prefix)");
    return 77;
}
#else

static int fails;
static int me; /* rank in the world */

static void check(const char *what, int ok)
{
    printf("%s rank %d: %s\n", ok ? "ok  " : "FAIL", me, what);
    fflush(stdout);
    fails += !ok;
}

static const char *error_name(int rc)
{
    int cls = MPI_SUCCESS;
    MPI_Error_class(rc, &cls);
    switch (cls) {
    case MPI_SUCCESS: return "MPI_SUCCESS";
    case MPIX_ERR_PROC_FAILED: return "MPI_ERR_PROC_FAILED";
    case MPIX_ERR_PROC_FAILED_PENDING: return "MPI_ERR_PROC_FAILED_PENDING";
    case MPIX_ERR_REVOKED: return "MPI_ERR_REVOKED";
    default: return "another error";
    }
}

int main(int argc, char **argv)
{
    double bound = 30; /* seconds a survivor may take to see the failure */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bound") == 0 && i + 1 < argc)
            bound = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--bound SECONDS]\n", argv[0]);
            return 2;
        }
    }
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 3) {
        if (me == 0)
            fprintf(stderr, "test_ulfm: wants 3 ranks (mpirun -np 3), has %d\n", size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* errors come back as return codes: a lost peer is an error to handle, not the end of the job */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    /* ULFM is on in this job (mpirun --with-ft ulfm) when MPI_COMM_WORLD's MPIX_FT attribute is true */
    int *ft = NULL, has_ft = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPIX_FT, &ft, &has_ft);
    check("the launch enabled fault tolerance (MPIX_FT attribute of MPI_COMM_WORLD)", has_ft && ft && *ft);

    /* every rank is in: a first all-reduce that succeeds (0 + 1 + 2) */
    int v = me, sum = -1;
    int rc = MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    check("all 3 ranks complete the first all-reduce (sum 3)", rc == MPI_SUCCESS && sum == 3);

    const int victim = size - 1;
    if (me == victim) {
        /* mid-collective: this rank's part of the all-reduce is started, then the process dies without a word */
        printf("rank %d: SIGKILL to itself in the middle of the all-reduce\n", me);
        fflush(stdout);
        MPI_Request req;
        int flag = 0;
        MPI_Iallreduce(&v, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
        raise(SIGKILL); // NOLINT(clang-analyzer-optin.mpi.MPI-Checker): it dies mid-collective, by design
        abort();        /* not reached */
    }
    const double t0 = MPI_Wtime();
    rc = MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const double took = MPI_Wtime() - t0;
    int cls = MPI_SUCCESS;
    MPI_Error_class(rc, &cls);
    char what[256];
    snprintf(what, sizeof what, "the all-reduce with the lost rank fails: %s after %.2f s (bound %.0f s)",
             error_name(rc), took, bound);
    check(what, (cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_REVOKED) && took < bound);

    /* revoke: a survivor still waiting in an operation on the world (the other survivor, had it not seen the
     * failure) returns MPI_ERR_REVOKED now; then every survivor shrinks it */
    rc = MPIX_Comm_revoke(MPI_COMM_WORLD);
    check("MPIX_Comm_revoke", rc == MPI_SUCCESS);
    MPI_Comm shrunk = MPI_COMM_NULL;
    rc = MPIX_Comm_shrink(MPI_COMM_WORLD, &shrunk);
    int nsize = 0, nrank = -1;
    if (rc == MPI_SUCCESS) {
        MPI_Comm_size(shrunk, &nsize);
        MPI_Comm_rank(shrunk, &nrank);
        MPI_Comm_set_errhandler(shrunk, MPI_ERRORS_RETURN);
    }
    snprintf(what, sizeof what, "MPIX_Comm_shrink: %d ranks, this one rank %d of them", nsize, nrank);
    check(what, rc == MPI_SUCCESS && nsize == 2 && nrank == me);
    if (rc != MPI_SUCCESS || nsize != 2 || nrank != me) {
        printf("rank %d: FAILED\n", me);
        return 1; /* nothing more to check without the shrunk communicator (no MPI_Finalize: a peer may be lost) */
    }

    /* which rank was lost: the failures this rank acknowledges on the world, as world ranks */
    MPI_Group failed = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
    int nfailed = -1, lost = -1, zero = 0;
    MPIX_Comm_failure_ack(MPI_COMM_WORLD);
    MPIX_Comm_failure_get_acked(MPI_COMM_WORLD, &failed);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    MPI_Group_size(failed, &nfailed);
    if (nfailed == 1)
        MPI_Group_translate_ranks(failed, 1, &zero, world_group, &lost);
    snprintf(what, sizeof what, "the acknowledged failures name the lost rank: %d failed, world rank %d", nfailed,
             lost);
    check(what, nfailed == 1 && lost == victim);
    MPI_Group_free(&failed);
    MPI_Group_free(&world_group);

    /* agreement: every survivor's flag has all bits but its own rank's; the agreed value is their AND */
    int flag = 0xff & ~(1 << nrank);
    rc = MPIX_Comm_agree(shrunk, &flag);
    snprintf(what, sizeof what, "MPIX_Comm_agree on the shrunk communicator: 0x%02x (want 0xfc)", flag);
    check(what, rc == MPI_SUCCESS && flag == 0xfc);

    /* the shrunk communicator works: the survivors' world ranks sum to 0 + 1 */
    v = me;
    sum = -1;
    rc = MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, shrunk);
    snprintf(what, sizeof what, "MPI_Allreduce on the shrunk communicator: sum %d (want 1)", sum);
    check(what, rc == MPI_SUCCESS && sum == 1);

    MPI_Comm_free(&shrunk);
    printf("rank %d: %s\n", me, fails ? "FAILED" : "survived the lost rank");
    fflush(stdout);
    MPI_Finalize();
    return fails ? 1 : 0;
}
#endif
