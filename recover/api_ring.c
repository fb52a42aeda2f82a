/*
 * recover/api_ring.c - the allreduce ring's seam into the API.
 * The ring (ring/) is not built yet: rk_allreduce returns RK_E_NOTAVAIL.
 */
#include "rec_internal.h"

int rec_ring_open(rk_ctx *ctx)
{
    (void)ctx;
    return 0;
}

void rec_ring_close(rk_ctx *ctx)
{
    (void)ctx;
}

int rk_allreduce(rk_ctx *ctx, void *buf, size_t count, rk_dtype dtype, rk_op op)
{
    (void)ctx, (void)buf, (void)count, (void)dtype, (void)op;
    return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_NOTAVAIL,
                    "rk_allreduce: the allreduce ring is not built yet");
}
