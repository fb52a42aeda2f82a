/*
 * tests/prog_join.c - the join of processes started later (recover/join.c), run under
 * mpirun -n 3 by tests/test_grow.c. The members spawn one newcomer (this program, argv
 * "newcomer MODE") and merge with it on the join's thread while their main threads pass
 * 20,000 tokens around the members' ring; then they poll the join until DEADLINE_MS
 * (default 2000) from its start. Prints "ok ..." lines the suite checks; "FAIL ..." and
 * exit 1 on a wrong result. MODE:
 *   alive        every rank a member; the newcomer lives: all four pass 1,000 tokens
 *                around the merged ring (and one around its second duplicate), and every
 *                process says its size and rank there; then the members' ring (built
 *                over their communicator at the start) is rebuilt onto the second
 *                duplicate with the newcomer in it (ring_rebuild_on; the newcomer's ring
 *                made there without a collective call, ring_create_on) and an allreduce
 *                of 4 is exact;
 *   late-dies    the newcomer joins, then SIGKILLs itself before the ring's rebuild: the
 *                members' rebuild onto the merged communicator fails within its 1 s bound,
 *                and a rebuild of the members alone there gives an exact allreduce of 3;
 *   subset       ranks 0 and 1 the members (rank 2, not one, waits); merged size 3;
 *   dies         the newcomer SIGKILLs itself right after MPI_Init: the members give the
 *                join up at the deadline, and pass 20,000 more tokens after it;
 *   noinit       the newcomer exits before MPI_Init: the same;
 *   member-dies  rank 2 SIGKILLs itself right after starting its join: ranks 0 and 1 give
 *                theirs up at the deadline.
 * A process that gave a join up ends without MPI_Finalize (join.c J9): "ok ... no
 * finalize" says so.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../recover/rec_internal.h"
#include "../ring/ring.h"

static int me = -1;
static const int ranks[8] = {0, 1, 2, 3, 4, 5, 6, 7}; /* the first n of them: n ranks of a communicator */

static double ms_since(int64_t t0)
{
    return (double)(rk__mono_ns() - t0) / 1e6;
}

/* One token to the right neighbour of c and one from the left, nonblocking, within 1 s. */
static bool pass(MPI_Comm c)
{
    int size, r, out = 7, in = 0, done = 0;
    MPI_Comm_size(c, &size);
    MPI_Comm_rank(c, &r);
    MPI_Request q[2];
    if (MPI_Isend(&out, 1, MPI_INT, (r + 1) % size, 5, c, &q[0]) != MPI_SUCCESS ||
        MPI_Irecv(&in, 1, MPI_INT, (r + size - 1) % size, 5, c, &q[1]) != MPI_SUCCESS)
        return false;
    int64_t t0 = rk__mono_ns();
    while (!done && rk__mono_ns() - t0 < 1000000000LL)
        if (MPI_Testall(2, q, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            return false;
    if (!done) {
        for (int k = 0; k < 2; k++)
            if (q[k] != MPI_REQUEST_NULL) {
                MPI_Cancel(&q[k]);
                MPI_Request_free(&q[k]);
            }
        return false;
    }
    return in == 7;
}

static int rounds(MPI_Comm c, int n)
{
    int k = 0;
    while (k < n && pass(c))
        k++;
    return k;
}

static int end(int status)
{
    fflush(stdout);
    if (rec_join_thread_left()) {
        printf("ok %s %d: no finalize (a join's thread is inside MPI)\n", me < 0 ? "newcomer" : "rank", me);
        fflush(stdout);
        exit(status);
    }
    MPI_Finalize();
    return status;
}

/* After the join: its communicators' size and rank, and tokens around them (not where
   the newcomer died: each token to it would hold a member up to its 1 s bound, and the
   members would come to the ring's rebuild seconds apart). out[1] is left for the ring. */
static void joined(MPI_Comm out[REC_JOIN_COMMS], const char *who, double t, bool tokens)
{
    int size, r;
    MPI_Comm_size(out[0], &size);
    MPI_Comm_rank(out[0], &r);
    int k = tokens ? rounds(out[0], 1000) : 0, k1 = tokens ? rounds(out[1], 1) : 0;
    printf("ok %s joined in %.0f ms: merged size %d, rank %d; %d token rounds around it, %d around the second\n",
           who, t, size, r, k, k1);
    MPI_Comm_free(&out[0]);
}

/* An allreduce (sum, f64) of 1000 values over the ring: member k of the ring gives
   (k + 1) * (i + 1); every element must be (i + 1) * n (n + 1) / 2. */
static bool exact(ring *rg, const char *who)
{
    double v[1000];
    int k = ring_rank(rg), n = ring_size(rg);
    for (int i = 0; i < 1000; i++)
        v[i] = (double)(k + 1) * (i + 1);
    int rc = ring_allreduce(rg, v, 1000, RK_F64, RK_SUM, NULL);
    bool ok = rc == 0;
    for (int i = 0; ok && i < 1000; i++)
        ok = v[i] == (double)(i + 1) * n * (n + 1) / 2;
    if (ok)
        printf("ok %s: allreduce of %d exact, epoch %llu\n", who, n, (unsigned long long)ring_epoch(rg));
    else
        printf("FAIL %s: allreduce of %d: rc %d %s\n", who, n, rc, rk_last_error());
    return ok;
}

static int newcomer(const char *mode)
{
    if (strcmp(mode, "noinit") == 0)
        _exit(1);
    int prov;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov);
    if (strcmp(mode, "dies") == 0)
        raise(SIGKILL);
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    struct rec_join *j = NULL;
    MPI_Comm out[REC_JOIN_COMMS];
    int64_t t0 = rk__mono_ns();
    int rc = rec_join_newcomer(parent, &j);
    if (rc == 0)
        while ((rc = rec_join_poll(j, out)) == REC_AGAIN && ms_since(t0) < 5000)
            usleep(1000);
    if (rc) {
        printf("FAIL newcomer: join rc %d at %.0f ms: %s\n", rc, ms_since(t0), rk_last_error());
        rec_join_end(&j);
        return end(1);
    }
    rec_join_end(&j);
    if (strcmp(mode, "late-dies") == 0)
        raise(SIGKILL);
    joined(out, "newcomer", ms_since(t0), true);
    if (strcmp(mode, "alive") != 0) { /* subset: no ring */
        MPI_Comm_free(&out[1]);
        return end(0);
    }
    /* the ring: a spare of the members' ring (ranks 0 .. size-2), then a member of 4 */
    int size;
    MPI_Comm_size(out[1], &size);
    ring *rg = NULL;
    if ((rc = ring_create_on(&rg, out[1], ranks, size - 1, 1000)) == 0)
        rc = ring_rebuild(rg, ranks, size, 1, NULL);
    if (rc)
        printf("FAIL newcomer: ring over the merged communicator: %s\n", rk_last_error());
    else
        exact(rg, "newcomer");
    ring_destroy(&rg);
    return end(rc ? 1 : 0);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN); /* as rk_init makes it (api.c): a peer gone is an error, not a signal */
    if (argc > 2 && strcmp(argv[1], "newcomer") == 0)
        return newcomer(argv[2]);
    const char *mode = argc > 1 ? argv[1] : "alive";
    double deadline = argc > 2 ? atof(argv[2]) : 2000;
    int prov, size;
    MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &prov);
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c, &me);
    MPI_Comm_size(c, &size);
    bool subset = strcmp(mode, "subset") == 0;
    int n = subset ? 2 : size; /* the members: ranks 0 .. n-1 */
    MPI_Comm mc = c; /* the members' ring beside the join */
    if (subset)
        MPI_Comm_split(c, me < n ? 0 : MPI_UNDEFINED, me, &mc);
    if (me >= n) { /* subset: not a member */
        printf("ok rank %d: not a member\n", me);
        return end(0);
    }
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len <= 0) {
        printf("FAIL rank %d: /proc/self/exe\n", me);
        return end(1);
    }
    self[len] = '\0';
    char *args[] = {"newcomer", (char *)(strcmp(mode, "member-dies") == 0 ? "subset" : mode), NULL};
    ring *rg = NULL; /* the members' ring, over their communicator */
    if (strcmp(mode, "alive") == 0 || strcmp(mode, "late-dies") == 0) {
        if (ring_create(&rg, c, ranks, n, 1000) != 0 || !exact(rg, "members")) {
            printf("FAIL rank %d: the members' ring: %s\n", me, rk_last_error());
            return end(1);
        }
    }
    rec_join_spec spec = {.command = self, .argv = args, .n = 1};
    struct rec_join *j = NULL;
    int64_t t0 = rk__mono_ns();
    int rc = rec_join_spawn(c, ranks, n, &spec, &j);
    if (rc) {
        printf("FAIL rank %d: rec_join_spawn: %s\n", me, rk_last_error());
        return end(1);
    }
    if (strcmp(mode, "member-dies") == 0 && me == 2)
        raise(SIGKILL);
    int before = strcmp(mode, "member-dies") == 0 ? 0 : rounds(mc, 20000);
    double t_before = ms_since(t0);
    MPI_Comm out[REC_JOIN_COMMS];
    while ((rc = rec_join_poll(j, out)) == REC_AGAIN && ms_since(t0) < deadline)
        usleep(1000);
    double t = ms_since(t0);
    printf("ok rank %d: %d token rounds among the members in %.0f ms beside the join\n", me, before, t_before);
    if (rc == 0) {
        rec_join_end(&j);
        char who[16];
        snprintf(who, sizeof(who), "rank %d", me);
        joined(out, who, t, strcmp(mode, "late-dies") != 0);
        if (!rg) {
            MPI_Comm_free(&out[1]);
            return end(0);
        }
        int msize;
        MPI_Comm_size(out[1], &msize);
        int64_t t1 = rk__mono_ns();
        rc = ring_rebuild_on(rg, out[1], ranks, msize, 1, NULL);
        if (strcmp(mode, "late-dies") == 0) {
            printf("ok %s: rebuild with the dead newcomer: rc %d in %.0f ms, member %d\n", who, rc, ms_since(t1),
                   (int)ring_is_member(rg));
            if (rc == 0 || (rc = ring_rebuild(rg, ranks, n, 2, NULL)) != 0)
                printf("FAIL %s: rebuild of the members on the merged communicator: rc %d %s\n", who, rc, rk_last_error());
        } else if (rc) {
            printf("FAIL %s: ring_rebuild_on: %s\n", who, rk_last_error());
        }
        bool ok = rc == 0 && exact(rg, who);
        ring_destroy(&rg);
        return end(ok ? 0 : 1);
    }
    if (rc != REC_AGAIN) {
        printf("FAIL rank %d: join rc %d: %s\n", me, rc, rk_last_error());
        rec_join_end(&j);
        return end(1);
    }
    rec_join_end(&j);
    printf("ok rank %d: join given up at %.0f ms (thread left: %d)\n", me, t, (int)rec_join_thread_left());
    if (strcmp(mode, "member-dies") != 0) {
        int64_t t1 = rk__mono_ns();
        int after = rounds(mc, 20000);
        printf("ok rank %d: %d token rounds among the members in %.0f ms after it\n", me, after, ms_since(t1));
    }
    return end(0);
}
