/* The MPI back-end's fault tolerance: ULFM (User-Level Failure Mitigation, Open MPI 5 launched with mpirun --with-ft
 * ulfm, as scripts/mpirun_ft does). A peer's loss is an error the survivors handle instead of the end of the job:
 * they revoke the groups it was in (every survivor's operation on them fails at once, wherever it waits), shrink
 * them to the survivors and agree on how to go on. What the run does with that is worker/survive/'s; this file is
 * the MPI side only. Built without ULFM every function says so and does nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef GRPO_HAVE_ULFM
#include <mpi.h>
#include <mpi-ext.h> /* after mpi.h, which it needs */
#endif

#include "comm.h"
#include "comm_mpi_impl.h"
#include "common/check.h"
#include "common/log.h"

static void (*lost_fn)(void *ud, struct comm *c, const char *what);
static void *lost_ud;
static bool peer_lost; /* comm_ft_peer_was_lost */

bool comm_ft_peer_was_lost(void)
{
#ifdef GRPO_HAVE_ULFM
    /* a rank lost outside every collective this rank took part in (a spare that died while it waited) is still
     * a loss of the job: MPI's failure detector tells every survivor of it, and MPI_Finalize may then wait for it */
    int init = 0, fin = 0, failed = 0;
    MPI_Group g = MPI_GROUP_NULL;
    if (!peer_lost && MPI_Initialized(&init) == MPI_SUCCESS && init && MPI_Finalized(&fin) == MPI_SUCCESS && !fin &&
        MPIX_Comm_get_failed(MPI_COMM_WORLD, &g) == MPI_SUCCESS && g != MPI_GROUP_NULL) {
        MPI_Group_size(g, &failed);
        MPI_Group_free(&g);
        peer_lost = failed > 0;
    }
#endif
    return peer_lost;
}

void comm_set_peer_lost_handler(void (*lost)(void *ud, struct comm *c, const char *what), void *ud)
{
    lost_fn = lost;
    lost_ud = ud;
}

static struct mpi_impl *impl_of(struct comm *c) { return (struct mpi_impl *)c->impl; }

static bool is_mpi(const struct comm *c) { return c && strcmp(comm_backend_name(c), "mpi") == 0; }

void comm_ft_lost(struct comm *c, const char *what)
{
    if (!lost_fn)
        return;
    peer_lost = true;
    lost_fn(lost_ud, c, what); /* does not return where the run survives; else the caller ends the job */
}

/* a device group (not MPI): its back-end watches or revokes it (NCCL: its MPI twin, and an abort) */
static bool device_group(struct comm *c, void (*op)(struct comm *))
{
    if (!c || is_mpi(c))
        return false;
    if (op)
        op(c);
    return true;
}

#ifdef GRPO_HAVE_ULFM
bool comm_ft_available(char *why, size_t whylen)
{
    /* MPI_COMM_WORLD's MPIX_FT attribute: the launch turned ULFM on (without it a lost rank ends the job whatever
     * the program does) */
    int *ft = NULL, has = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPIX_FT, &ft, &has);
    if (has && ft && *ft)
        return true;
    snprintf(why, whylen,
             "this launch did not turn MPI's fault tolerance on: launch with scripts/mpirun_ft (mpirun --with-ft "
             "ulfm)");
    return false;
}

void comm_ft_watch(struct comm *c)
{
    if (device_group(c, c ? c->be->ft_watch : NULL) || !c || impl_of(c)->watched)
        return;
    impl_of(c)->watched = true;
    if (MPI_Comm_set_errhandler(impl_of(c)->comm, MPI_ERRORS_RETURN) != MPI_SUCCESS)
        check_failf(__FILE__, __LINE__, "MPI_Comm_set_errhandler(MPI_ERRORS_RETURN) failed");
}

void comm_ft_check(struct comm *c, int rc, const char *expr)
{
    int cls = MPI_SUCCESS;
    if (!lost_fn || MPI_Error_class(rc, &cls) != MPI_SUCCESS)
        return;
    const char *how = cls == MPIX_ERR_REVOKED ? "revoked by a survivor" : "a peer is lost";
    if (cls != MPIX_ERR_PROC_FAILED && cls != MPIX_ERR_PROC_FAILED_PENDING && cls != MPIX_ERR_REVOKED) {
        /* an error that follows a loss without naming it is the same loss on a watched group: a non-blocking
         * collective whose schedule a survivor's revoke cut short reports MPI_ERR_OTHER from MPI_Test */
        if (!is_mpi(c) || !impl_of(c)->watched)
            return;
        int revoked = 0, failed = 0;
        MPI_Group g = MPI_GROUP_NULL;
        if (MPIX_Comm_is_revoked(impl_of(c)->comm, &revoked) != MPI_SUCCESS)
            revoked = 0;
        if (!revoked && MPIX_Comm_get_failed(impl_of(c)->comm, &g) == MPI_SUCCESS && g != MPI_GROUP_NULL) {
            MPI_Group_size(g, &failed);
            MPI_Group_free(&g);
        }
        if (!revoked && failed == 0)
            return;
        how =
            revoked ? "revoked by a survivor, reported as another error" : "a peer is lost, reported as another error";
    }
    char what[256];
    snprintf(what, sizeof what, "%s (%s over %d ranks)", expr, how, c->size);
    peer_lost = true;
    lost_fn(lost_ud, c, what); /* does not return where the run survives; else the caller ends the job */
}

void comm_revoke(struct comm *c)
{
    if (device_group(c, c ? c->be->revoke : NULL) || !c || impl_of(c)->revoked)
        return;
    impl_of(c)->revoked = true;
    /* an error here (already revoked by another survivor) changes nothing: the group is dead either way */
    (void)MPIX_Comm_revoke(impl_of(c)->comm);
}

struct comm *comm_shrink(struct comm *c, char *err, size_t errlen)
{
    MPI_Comm m = MPI_COMM_NULL;
    int rc = MPIX_Comm_shrink(impl_of(c)->comm, &m);
    if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
            snprintf(text, sizeof text, "MPI error %d", rc);
        error_set(err, errlen, "MPIX_Comm_shrink of a group of %d ranks failed: %s", c->size, text);
        return NULL;
    }
    struct comm *s = comm_mpi_adopt(m);
    comm_set_name(s, comm_name(c)); /* the same group less its lost ranks: the flight recorder's records say so */
    comm_ft_watch(s);
    comm_set_deadline(s, c->deadline_s);
    return s;
}

int comm_lost_ranks(struct comm *old, struct comm *survivors, int *ranks, int max)
{
    MPI_Group go, gs;
    MPI_Comm_group(impl_of(old)->comm, &go);
    MPI_Comm_group(impl_of(survivors)->comm, &gs);
    int *in = xmalloc((size_t)old->size * sizeof *in), *at = xmalloc((size_t)old->size * sizeof *at);
    for (int r = 0; r < old->size; r++)
        in[r] = r;
    MPI_Group_translate_ranks(go, old->size, in, gs, at);
    int n = 0;
    for (int r = 0; r < old->size; r++)
        if (at[r] == MPI_UNDEFINED) {
            if (n < max)
                ranks[n] = r;
            n++;
        }
    free(in), free(at);
    MPI_Group_free(&go);
    MPI_Group_free(&gs);
    return n;
}

int comm_agree(struct comm *c, int *flag) { return MPIX_Comm_agree(impl_of(c)->comm, flag) == MPI_SUCCESS ? 0 : -1; }

/* the probe's tag: no message carries it (a probe moves MPI's progress, and reports a loss) */
#define POLL_TAG 4243

bool comm_ft_poll(struct comm *c, char *why, size_t whylen)
{
    if (!is_mpi(c))
        return false;
    MPI_Comm m = impl_of(c)->comm;
    int flag = 0, revoked = 0, failed = 0, cls = MPI_SUCCESS;
    const int rc = MPI_Iprobe(MPI_ANY_SOURCE, POLL_TAG, m, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS && MPI_Error_class(rc, &cls) == MPI_SUCCESS &&
        (cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_PROC_FAILED_PENDING || cls == MPIX_ERR_REVOKED)) {
        snprintf(why, whylen, "MPI: %s", cls == MPIX_ERR_REVOKED ? "revoked by a survivor" : "a peer is lost");
        return true;
    }
    if (MPIX_Comm_is_revoked(m, &revoked) == MPI_SUCCESS && revoked) {
        snprintf(why, whylen, "MPI: revoked by a survivor");
        return true;
    }
    MPI_Group g = MPI_GROUP_NULL;
    if (MPIX_Comm_get_failed(m, &g) == MPI_SUCCESS && g != MPI_GROUP_NULL) {
        MPI_Group_size(g, &failed);
        MPI_Group_free(&g);
    }
    if (failed > 0) {
        snprintf(why, whylen, "MPI: %d peer(s) of the group lost", failed);
        return true;
    }
    return false;
}

/* the spares' tag: apart from the back-end's (0) */
#define SPARE_TAG 4242

int comm_ft_wait_word(struct comm *c, int from, int32_t *word)
{
    /* tested every millisecond, asleep between: a blocking receive would spin a core for the whole run */
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Irecv(word, 1, MPI_INT32_T, from, SPARE_TAG, impl_of(c)->comm, &r), done = 0;
    while (rc == MPI_SUCCESS && !done) {
        rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (rc == MPI_SUCCESS && !done) {
            const struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
    }
    if (rc == MPI_SUCCESS) // NOLINT(clang-analyzer-optin.mpi.MPI-Checker): MPI_Test completed it
        return 0;
    comm_ft_check(c, rc, "MPI_Recv(a spare's wait)");
    /* the request is left behind on the lost group, as a step's are (MPI cannot cancel it there) */
    return -1; // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
}

int comm_ft_send_word(struct comm *c, int peer, int32_t word)
{
    if (MPI_Send(&word, 1, MPI_INT32_T, peer, SPARE_TAG, impl_of(c)->comm) == MPI_SUCCESS)
        return 0;
    peer_lost = true; /* nothing of the run is lost, but the job lost a rank: its end must not wait for it */
    return -1;
}
#else
bool comm_ft_available(char *why, size_t whylen)
{
    snprintf(why, whylen,
             "this build's MPI has no ULFM (fault tolerance): build against Open MPI 5 (scripts/build.sh build-ft "
             "-Dmpi_prefix=\"$(scripts/ompi5_env.sh)\" -Dulfm=enabled) and launch with scripts/mpirun_ft");
    return false;
}

void comm_ft_watch(struct comm *c) { (void)device_group(c, c ? c->be->ft_watch : NULL); }

void comm_ft_check(struct comm *c, int rc, const char *expr) { (void)c, (void)rc, (void)expr; }

void comm_revoke(struct comm *c)
{
    if (!device_group(c, c ? c->be->revoke : NULL) && c)
        impl_of(c)->revoked = true;
}

bool comm_ft_poll(struct comm *c, char *why, size_t whylen)
{
    (void)c, (void)why, (void)whylen;
    return false;
}

struct comm *comm_shrink(struct comm *c, char *err, size_t errlen)
{
    (void)c;
    error_set(err, errlen, "this build's MPI has no ULFM: a group cannot be shrunk");
    return NULL;
}

int comm_lost_ranks(struct comm *old, struct comm *survivors, int *ranks, int max)
{
    (void)old, (void)survivors, (void)ranks, (void)max;
    return 0;
}

int comm_agree(struct comm *c, int *flag)
{
    (void)c, (void)flag;
    return -1;
}

int comm_ft_wait_word(struct comm *c, int from, int32_t *word)
{
    (void)c, (void)from, (void)word;
    return -1;
}

int comm_ft_send_word(struct comm *c, int peer, int32_t word)
{
    (void)c, (void)peer, (void)word;
    return -1;
}
#endif
