/*
 * tests/prog_recover.c - a worker for the recovery rounds' integration tests, run under
 * mpirun by tests/test_recover.c.
 *
 *   prog_recover VICTIM LATE LATE_MS [die|wedge]
 *
 * Every worker runs steps 0..11: rk_allreduce of 1.0 (checked: the sum is the world
 * size), then rk_step_done. At step 5 rank VICTIM raise(SIGKILL)s before its allreduce,
 * and rank LATE (-1: none) first sleeps LATE_MS, a long compute step, so it enters
 * recovery late; with "die" it then raise(SIGKILL)s too, dying while the others recover;
 * with "wedge" its allreduce of step 5 never returns from its first test of a transfer
 * (RK_FAULT=progress@0=hang: as Open MPI's shared-memory transport after a peer died in
 * the middle of a send), and the wedge watchdog ends it (RK_EXIT_WEDGED).
 * Prints "rank R recovered world W step S" on RK_RECOVERED, "rank R done world W" at the
 * end, "rank R error: ..." (exit 2) on any other error, and after rk_finalize
 * "rank R alloc_mem outstanding N isend_refused K".
 *
 * PROG_REC_REFUSE_ISEND=RANK:TAG: on that rank, the first MPI_Isend with that tag fails
 * (MPI_ERR_OTHER) without sending: a profiling-interface wrapper below, which also counts
 * MPI_Alloc_mem against MPI_Free_mem, so a test sees memory a failed send leaves behind.
 */
#include <mpi.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "prog_common.h"

static long alloc_outstanding;
static int isend_refused;

int MPI_Alloc_mem(MPI_Aint size, MPI_Info info, void *baseptr)
{
    int rc = PMPI_Alloc_mem(size, info, baseptr);
    if (rc == MPI_SUCCESS)
        alloc_outstanding++;
    return rc;
}

int MPI_Free_mem(void *base)
{
    int rc = PMPI_Free_mem(base);
    if (rc == MPI_SUCCESS)
        alloc_outstanding--;
    return rc;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm, MPI_Request *rq)
{
    const char *spec = getenv("PROG_REC_REFUSE_ISEND");
    int rank = -1, want_rank = -1, want_tag = -1;
    if (spec && !isend_refused && sscanf(spec, "%d:%i", &want_rank, &want_tag) == 2 && tag == want_tag) {
        PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (rank == want_rank) {
            isend_refused++;
            return MPI_ERR_OTHER;
        }
    }
    return PMPI_Isend(buf, count, type, dest, tag, comm, rq);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: prog_recover VICTIM LATE LATE_MS [die|wedge]\n");
        return 2;
    }
    int victim = atoi(argv[1]), late = atoi(argv[2]);
    long late_ms = atol(argv[3]);
    bool die = argc > 4 && strcmp(argv[4], "die") == 0, wedge = argc > 4 && strcmp(argv[4], "wedge") == 0;
    rk_ctx *ctx = prog_rk_init();
    if (!ctx)
        return 3;
    int me = rk_rank(ctx); /* rank at start: the arguments name these */
    bool slept = false; /* once: recovery rolls back to a step before 5 or 5 itself */
    for (int64_t step = 0; step < 12;) {
        if (step == 5 && me == victim)
            raise(SIGKILL);
        if (step == 5 && me == late && !slept) {
            slept = true;
            usleep((useconds_t)late_ms * 1000);
            if (die)
                raise(SIGKILL);
            if (wedge) {
                setenv("RK_FAULT", "progress@0=hang", 1);
                if (rk__fault_reset() != 0) {
                    printf("rank %d error: RK_FAULT=progress@0=hang refused\n", me);
                    return 2;
                }
            }
        }
        float x = 1.0f;
        int rc = rk_allreduce(ctx, &x, 1, RK_F32, RK_SUM);
        if (rc == 0 && x != (float)rk_world(ctx)) {
            printf("rank %d error: sum %g, want %d\n", me, x, rk_world(ctx));
            return 2;
        }
        if (rc == 0)
            rc = rk_step_done(ctx, step);
        if (rc == RK_RECOVERED) {
            printf("rank %d recovered world %d step %lld\n", me, rk_world(ctx), (long long)rk_next_step(ctx));
            fflush(stdout);
            step = rk_next_step(ctx);
            continue;
        }
        if (rc != 0) {
            printf("rank %d error: %s: %s\n", me, rk_strerror(rc), rk_last_error());
            fflush(stdout);
            rk_finalize(&ctx);
            return 2;
        }
        step++;
    }
    printf("rank %d done world %d\n", me, rk_world(ctx));
    fflush(stdout);
    int rc = rk_finalize(&ctx);
    printf("rank %d alloc_mem outstanding %ld isend_refused %d\n", me, alloc_outstanding, isend_refused);
    fflush(stdout);
    return rc == 0 ? 0 : 4;
}
