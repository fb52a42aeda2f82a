/*
 * recover/api_ring.c - the allreduce ring's seam into the API: rec_ring_open/close and
 * rk_allreduce over ring/ (see ring/ring.c for the design).
 *
 * The ring is built at rk_init over every rank of ctx->comm (it owns a duplicate of it,
 * with MPI_ERRORS_RETURN). rk_allreduce first asks the detector whether this worker was
 * fenced (RK_E_FENCED), then runs the ring with the default deadline ctx->opt.timeout_ms.
 * Until the recovery coordinator exists, a ring error (RK_E_PEER_LOST, RK_E_TIMEOUT,
 * RK_E_COLL_MISMATCH, ...) is returned as is; RK_RECOVERED comes with the coordinator,
 * which will rebuild the ring through rec_ring_rebuild() and roll the state back.
 */
#include <errno.h>

#include "../ring/ring.h"
#include "rec_internal.h"

/* Belongs in rec_internal.h (for the recovery coordinator): rebuilds the ring over
   `members` (ranks of ctx->comm: survivors and spares) for `epoch`, renumbers
   ctx->rank/ctx->world densely in the old order and logs the ring_rebuilt event. */
int rec_ring_rebuild(rk_ctx *ctx, const int *members, int nmembers, uint64_t epoch);

int rec_ring_open(rk_ctx *ctx)
{
    return ring_create(&ctx->ring, ctx->comm, NULL, 0, ctx->opt.timeout_ms);
}

void rec_ring_close(rk_ctx *ctx)
{
    ring_destroy(&ctx->ring);
}

int rec_ring_rebuild(rk_ctx *ctx, const int *members, int nmembers, uint64_t epoch)
{
    int64_t t0 = rk__mono_ns();
    int rc = ring_rebuild(ctx->ring, members, nmembers, epoch, NULL);
    if (rc != 0)
        return rc;
    ctx->rank = ring_rank(ctx->ring);
    ctx->world = ring_size(ctx->ring);
    RK_EVENT(ctx->ev, "ring_rebuilt", RK_EV_I("epoch", epoch), RK_EV_I("world", ctx->world),
             RK_EV_D("ms", rk__ms_since(t0)));
    return 0;
}

int rk_allreduce(rk_ctx *ctx, void *buf, size_t count, rk_dtype dtype, rk_op op)
{
    if (!ctx)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "rk_allreduce: ctx is NULL");
    int rc = rec_det_status(ctx);
    if (rc != 0)
        return rc;
    if (!ctx->ring)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_STATE, "rk_allreduce: no ring (rk_init failed?)");
    return ring_allreduce(ctx->ring, buf, count, dtype, op, NULL);
}
