/*
 * common/mpi.c - the one translation of MPI error codes (STYLE.md convention 2): every
 * part that calls MPI (ring/, recover/) reports a failed MPI call through rk__mpi_fail;
 * and the record of the MPI call in progress, which the wedge watchdog reads.
 */
#include <mpi.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common.h"

int rk__mpi_fail(int sub, int level, int code, int mpi_rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpi_rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof(msg), "MPI error %d", mpi_rc);
    return rk__fail(sub, level, code, "%s: %s", what, msg);
}

static _Atomic int64_t mpi_since; /* start of the call in progress; 0: none */
static atomic_uint_fast64_t mpi_calls;

void rk__mpi_enter(void)
{
    atomic_fetch_add(&mpi_calls, 1);
    atomic_store(&mpi_since, rk__mono_ns());
}

void rk__mpi_leave(void)
{
    atomic_store(&mpi_since, 0);
}

int64_t rk__mpi_inside(uint64_t *call)
{
    *call = atomic_load(&mpi_calls);
    return atomic_load(&mpi_since);
}

int rk__mpi_left(int mpi_rc)
{
    rk__mpi_leave();
    return mpi_rc;
}
