/*
 * recover/api_ring_nccl.c - rk_allreduce on device buffers (built only with CUDA + NCCL;
 * recover/api_ring.c dispatches here). Run on a GPU: docs/GPU.md.
 *
 * Which path: cudaPointerGetAttributes says whether buf is device memory. Without a device
 * (no driver, none visible: counted once) every buffer is a host buffer and takes the MPI
 * ring exactly as in a CPU-only build; so does managed and host memory.
 *
 * Device buffers go through the NCCL ring (ring/ring_nccl.c) over the MPI ring's members.
 * Its communicator belongs to one epoch of the MPI ring: at the first device allreduce of
 * an epoch (the first ever, or the first after a recovery rebuilt the MPI ring: survivors
 * and spares alike) the members agree, in one small MIN allreduce on the MPI ring, on what
 * every one of them can do:
 *     2  keep or shrink (ncclCommShrink, NCCL_SHRINK_ABORT): every member holds an intact
 *        communicator over a superset of the new members and NCCL >= 2.27;
 *     1  a fresh communicator (its unique id over the MPI ring: ring_share_blob): a spare
 *        joined, a communicator was aborted by a loss inside a call, or no shrink;
 *     0  no NCCL here (RK_NCCL=0, no device, or NCCL failed at a member before): device
 *        buffers go through pinned host staging and the MPI ring for this epoch.
 * Whether the communicator came up is agreed the same way (a member whose NCCL failed makes
 * everyone stage). A loss inside an NCCL call aborts its communicator (ring_nccl.c) and
 * returns RK_E_PEER_LOST like the MPI ring: rk_allreduce recovers, the epoch changes, and
 * the next device allreduce rebuilds. Every wait is bounded by the call's cancellation
 * source (the detector and the deadline).
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../ring/ring.h"
#include "rec_internal.h"

enum { CAN_STAGE = 0, CAN_FRESH = 1, CAN_SHRINK = 2 };

struct rec_dev {
    int devices;          /* visible CUDA devices, counted at the first allreduce */
    ring_nccl *nccl;      /* NULL until the first NCCL epoch */
    bool agreed;          /* the path below was agreed for ring epoch `epoch` */
    uint64_t epoch;
    bool staging;         /* this epoch's device buffers: host staging + the MPI ring */
    bool told;            /* the staging line was logged (once per process) */
    void *pinned;         /* the staging buffer (cudaHostAlloc), pinned_bytes long */
    size_t pinned_bytes;
};

int rec_ring_is_device(rk_ctx *ctx, const void *buf)
{
    if (!ctx->dev) {
        ctx->dev = calloc(1, sizeof(*ctx->dev));
        if (!ctx->dev)
            return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -ENOMEM, "rk_allreduce: device path state");
        if (cudaGetDeviceCount(&ctx->dev->devices) != cudaSuccess) {
            ctx->dev->devices = 0; /* no driver or no device: every buffer is a host one */
            cudaGetLastError();
        }
    }
    if (ctx->dev->devices == 0 || !buf)
        return 0;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, buf) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}

/* NCCL_HOSTID when several ranks of the job share a device of this host (ring_nccl_hostid):
   set before this process's first communicator, since NCCL reads it then. */
static void name_host(rk_ctx *ctx)
{
    char host[128] = "", id[192];
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    gethostname(host, sizeof(host) - 1);
    if (ring_nccl_hostid(id, sizeof(id), getenv("NCCL_HOSTID"), host, ctx->rank0, ls ? atoi(ls) : 0,
                         ctx->dev->devices) &&
        setenv("NCCL_HOSTID", id, 1) == 0)
        RK_LOG_INFO(RK_SUB_RING, "%s ranks on this host share %d device(s): NCCL_HOSTID=%s", ls, ctx->dev->devices, id);
}

/* What this member can do for the current epoch (the enum above). */
static int capability(rk_ctx *ctx, const char **why)
{
    const char *env = getenv("RK_NCCL");
    int device = -1;
    if (env && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0)) {
        *why = "RK_NCCL=0";
        return CAN_STAGE;
    }
    if (ring_nccl_load(NULL, why) != 0) /* *why: the process's NCCL, and what it lacks */
        return CAN_STAGE;
    if (cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        *why = "the CUDA device is not usable here";
        return CAN_STAGE;
    }
    if (ctx->dev->nccl && ring_nccl_can_shrink(ctx->dev->nccl, ctx->ring))
        return CAN_SHRINK;
    return CAN_FRESH;
}

/* One agreement among the members: *v becomes the smallest of their values. */
static int agree_min(rk_ctx *ctx, int *v, const ring_cancel *c)
{
    int32_t x = *v;
    int rc = ring_allreduce(ctx->ring, &x, 1, RK_I32, RK_MIN, c);
    *v = x;
    return rc;
}

/* The path of this epoch: agreed, then the communicator made, kept, shrunk or left. */
static int setup(rk_ctx *ctx, const ring_cancel *c)
{
    struct rec_dev *d = ctx->dev;
    const char *why = "";
    int mine = capability(ctx, &why), can = mine, rc;
    if ((rc = agree_min(ctx, &can, c)) != 0)
        return rc;
    if (can == CAN_STAGE && mine != CAN_STAGE)
        why = "another member cannot use NCCL";
    int ok = 0;
    if (can != CAN_STAGE) {
        if (!d->nccl) {
            int device = 0;
            cudaGetDevice(&device);
            name_host(ctx);
            rc = ring_nccl_create(&d->nccl, ctx->ring, device, ctx->opt.timeout_ms, c);
        } else {
            rc = ring_nccl_rebuild(d->nccl, ctx->ring, can == CAN_SHRINK, c);
        }
        if (rc == RK_E_PEER_LOST)
            return rc; /* a member was lost meanwhile: rk_allreduce recovers; agreed again after */
        ok = rc == 0; /* (a member that failed or timed out here makes every member stage) */
        if ((rc = agree_min(ctx, &ok, c)) != 0)
            return rc;
        why = "NCCL failed at a member";
    }
    d->agreed = true;
    d->epoch = ring_epoch(ctx->ring);
    d->staging = !ok;
    if (d->staging && !d->told) {
        d->told = true;
        RK_LOG_WARN(RK_SUB_RING, "rk_allreduce: device buffers go through pinned host staging and the MPI ring (%s)",
                    why);
    }
    return 0;
}

/* The caller's stream (rk_options.cuda_stream; NULL: the legacy default stream): the device
   work a call orders after. */
static cudaStream_t caller_stream(rk_ctx *ctx)
{
    return (cudaStream_t)ctx->opt.cuda_stream;
}

/* Polls a stream until its work is done: a local copy, bounded by the call's deadline. */
static cudaError_t stream_done(cudaStream_t s, int64_t deadline)
{
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e != cudaErrorNotReady)
            return e;
        if (rk__mono_ns() >= deadline)
            return cudaErrorNotReady;
        rk__sleep_ns(20000);
    }
}

/* Device -> pinned host, the MPI ring, host -> device, each copy on the caller's stream
   (after its work) and polled. A member that cannot stage refuses the ring call (a NULL
   buffer), so the others fail at once rather than at their deadline. */
static int staged(rk_ctx *ctx, void *buf, size_t count, rk_dtype dtype, rk_op op, const ring_cancel *c)
{
    struct rec_dev *d = ctx->dev;
    size_t bytes = count * rk__dtype_size(dtype);
    int64_t deadline = c && c->deadline_ns ? c->deadline_ns : rk__deadline_ns(ctx->opt.timeout_ms);
    cudaStream_t s = caller_stream(ctx);
    cudaError_t e = cudaSuccess;
    if (bytes > d->pinned_bytes) {
        cudaFreeHost(d->pinned);
        d->pinned = NULL;
        d->pinned_bytes = 0;
        if ((e = cudaHostAlloc(&d->pinned, bytes, cudaHostAllocDefault)) == cudaSuccess)
            d->pinned_bytes = bytes;
        else
            d->pinned = NULL;
    }
    if (e == cudaSuccess && bytes && (e = cudaMemcpyAsync(d->pinned, buf, bytes, cudaMemcpyDeviceToHost, s)) == cudaSuccess)
        e = stream_done(s, deadline);
    if (e != cudaSuccess) {
        cudaGetLastError();
        ring_allreduce(ctx->ring, NULL, count ? count : 1, dtype, op, c); /* refuses: the others fail too */
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, e == cudaErrorNotReady ? RK_E_TIMEOUT : RK_E_CUDA,
                        "rk_allreduce: staging %zu bytes of a device buffer: %s", bytes,
                        e == cudaErrorNotReady ? "the copy outlived the deadline" : cudaGetErrorString(e));
    }
    int rc = ring_allreduce(ctx->ring, bytes ? d->pinned : buf, count, dtype, op, c);
    if (rc == 0 && bytes && (e = cudaMemcpyAsync(buf, d->pinned, bytes, cudaMemcpyHostToDevice, s)) == cudaSuccess)
        e = stream_done(s, rk__deadline_ns(ctx->opt.timeout_ms));
    if (rc == 0 && e != cudaSuccess)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_CUDA, "rk_allreduce: the result back to the device: %s",
                        e == cudaErrorNotReady ? "the copy outlived the deadline" : cudaGetErrorString(e));
    return rc;
}

int rec_ring_dev_allreduce(rk_ctx *ctx, void *buf, size_t count, rk_dtype dtype, rk_op op, const ring_cancel *c)
{
    struct rec_dev *d = ctx->dev;
    int rc;
    if (!d->agreed || d->epoch != ring_epoch(ctx->ring) || (!d->staging && !ring_nccl_ok(d->nccl)))
        if ((rc = setup(ctx, c)) != 0)
            return rc;
    if (d->staging)
        return staged(ctx, buf, count, dtype, op, c);
    return ring_nccl_allreduce(d->nccl, buf, count, dtype, op, caller_stream(ctx), c);
}

void rec_ring_dev_close(rk_ctx *ctx)
{
    if (!ctx->dev)
        return;
    ring_nccl_destroy(&ctx->dev->nccl);
    cudaFreeHost(ctx->dev->pinned);
    free(ctx->dev);
    ctx->dev = NULL;
}
