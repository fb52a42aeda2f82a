/*
 * recover/api_ring.c - the allreduce ring's seam into the API: rec_ring_open/close,
 * rk_allreduce over ring/ (see ring/ring.c for the design), and rk_broadcast, a byte-wise
 * MAX on it (rec_spread, which the rollback shares).
 *
 * The ring is built at rk_init over every rank of ctx->comm (it owns a duplicate of it,
 * with MPI_ERRORS_RETURN). rk_allreduce first asks the detector whether this worker was
 * fenced (RK_E_FENCED), then runs the ring with the default deadline ctx->opt.timeout_ms.
 * The ring's cancellation source is the detector (rec_ring_changed): when the membership
 * changes, or the ring reports a lost peer that the detector then confirms, rk_allreduce
 * runs the recovery rounds (recover/recovery.c) and returns RK_RECOVERED with the state
 * rolled back. Other errors (RK_E_COLL_MISMATCH, a timeout without a lost member, ...)
 * are returned as they are. In a CUDA + NCCL build a device buffer goes to
 * api_ring_nccl.c (NCCL, or pinned staging and the MPI ring) with the same cancellation
 * and the same recovery; every other buffer takes the MPI ring as in a CPU-only build.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../ring/ring.h"
#include "rec_internal.h"

int rec_ring_open(rk_ctx *ctx)
{
    if (ctx->nspares == 0)
        return ring_create(&ctx->ring, ctx->comm, NULL, 0, ctx->opt.timeout_ms);
    /* Spares (the last RK_SPARES ranks) get a ring in the spare state: recovery brings
       them in with ring_rebuild. */
    int *members = malloc((size_t)ctx->world * sizeof(int));
    if (!members)
        return -ENOMEM;
    for (int i = 0; i < ctx->world; i++)
        members[i] = i;
    int rc = ring_create(&ctx->ring, ctx->comm, members, ctx->world, ctx->opt.timeout_ms);
    free(members);
    return rc;
}

void rec_ring_close(rk_ctx *ctx)
{
#if defined(RK_HAVE_NCCL)
    rec_ring_dev_close(ctx);
#endif
    ring_destroy(&ctx->ring);
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
    if (ctx->is_spare)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_STATE, "rk_allreduce: a spare worker must wait in rk_resume");
    if (rec_membership_changed(ctx))
        return rec_recover(ctx);
    rk__fault_point("allreduce"); /* tests: RK_FAULT=allreduce@N=crash, a member lost in its Nth call */
    ring_cancel cancel = {.deadline_ns = 0, .changed = rec_ring_changed, .arg = ctx};
#if defined(RK_HAVE_NCCL)
    /* Device memory: NCCL (api_ring_nccl.c); any other buffer: the MPI ring, as below. */
    if ((rc = rec_ring_is_device(ctx, buf)) < 0)
        return rc;
    rc = rc ? rec_ring_dev_allreduce(ctx, buf, count, dtype, op, &cancel)
            : ring_allreduce(ctx->ring, buf, count, dtype, op, &cancel);
#else
    rc = ring_allreduce(ctx->ring, buf, count, dtype, op, &cancel);
#endif
    if (rc != RK_E_PEER_LOST && rc != RK_E_TIMEOUT)
        return rec_ckpt_copied(ctx, rc); /* the caller updates the state next: the snapshot's copy is done */
    /* The ring saw a peer fail (or waited too long): recover once the detector agrees that
       the membership changed; it declares a lost worker within a few heartbeats. */
    int64_t deadline = rk__deadline_ns(20LL * ctx->opt.heartbeat_ms + 2000);
    while (!rec_membership_changed(ctx) && !rk__deadline_passed(deadline))
        rk__sleep_ns(1000000);
    return rec_membership_changed(ctx) ? rec_recover(ctx) : rc;
}

int rec_spread(rk_ctx *ctx, void *buf, size_t n, bool have,
               int (*reduce)(rk_ctx *ctx, void *buf, size_t count, rk_dtype dtype, rk_op op))
{
    if (n == 0)
        return 0;
    if (!have)
        memset(buf, 0, n);
    return reduce(ctx, buf, n, RK_U8, RK_MAX);
}

int rk_broadcast(rk_ctx *ctx, void *buf, size_t bytes, int root)
{
    if (!ctx || (!buf && bytes))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "rk_broadcast: %s is NULL", ctx ? "buf" : "ctx");
    if (root < 0 || root >= ctx->world)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "rk_broadcast: root %d is not a rank of this world of %d",
                        root, ctx->world);
#if defined(RK_HAVE_NCCL)
    if (bytes && rec_ring_is_device(ctx, buf) == 1)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "rk_broadcast: buf is device memory (host memory only)");
#endif
    return rec_spread(ctx, buf, bytes, ctx->rank == root, rk_allreduce);
}
