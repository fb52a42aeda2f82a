/*
 * recover/api_ring.c - the allreduce ring's seam into the API.
 * The ring (ring/) is not built yet: rk_allreduce checks its arguments, is exact for a
 * world of one (the reduction of one contribution), and returns RK_E_NOTAVAIL otherwise.
 */
#include <errno.h>

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
    if (!ctx)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "rk_allreduce: ctx is NULL");
    if (rk__dtype_size(dtype) == 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_DTYPE, "rk_allreduce: dtype %d", (int)dtype);
    if ((unsigned)op > RK_MIN)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_OP, "rk_allreduce: op %d", (int)op);
    if (!buf && count > 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "rk_allreduce: NULL buffer with count %zu", count);
    /* One member: the reduction of one contribution is the contribution itself. */
    if (ctx->world == 1)
        return 0;
    return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_NOTAVAIL,
                    "rk_allreduce: the allreduce ring is not built yet (world %d)", ctx->world);
}
