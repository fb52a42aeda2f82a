/*
 * common/mpi.c - the one translation of MPI error codes (STYLE.md convention 2): every
 * part that calls MPI (ring/, recover/) reports a failed MPI call through rk__mpi_fail.
 */
#include <mpi.h>
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
