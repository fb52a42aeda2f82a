/*
 * ring/ring_nccl.c - the ring for device buffers over NCCL (built only when CUDA + NCCL
 * are found). The same interface and the same promise as the MPI ring: no wait without
 * a bound, a distinct error when a member is lost, a rebuild over the survivors.
 *
 *  - Communicators are created non-blocking (config.blocking = 0): every NCCL call may
 *    return ncclInProgress, and completion is polled with ncclCommGetAsyncError against
 *    the deadline and the cancellation source (wait_comm).
 *  - An allreduce is enqueued on the ring's own stream, after the work the caller's stream
 *    had queued (an event recorded there), and polled with cudaStreamQuery,
 *    ncclCommGetAsyncError and the cancellation source; on loss or deadline the
 *    communicator is aborted (ncclCommAbort) so the kernel ends and nothing writes the
 *    caller's device buffer after the call returns; the call fails.
 *  - Rebuild (the caller says which way: every member must take the same one):
 *    members only dropped, communicator intact (the loss was seen between calls) ->
 *    ncclCommShrink (NCCL >= 2.27, RK_HAVE_NCCL_SHRINK) excluding the lost NCCL ranks
 *    (ring_nccl_plan), with NCCL_SHRINK_ABORT (ends whatever the lost member left
 *    pending); the old communicator is then never destroyed (NCCL forbids it after an
 *    abortive shrink) but kept until ring_nccl_destroy, which leaves it alone. Otherwise
 *    (members added: spares; a failed communicator; no shrink in this NCCL) the old one is
 *    aborted and a fresh communicator is made, its unique id sent by ring rank 0 to the
 *    MPI ring's members (ring_share_blob) with a bounded wait.
 * Run on a GPU (an H200, docs/GPU.md); without one tests/test_ring_nccl.c skips.
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

struct ring_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t after;    /* recorded on the caller's stream: the allreduce waits for it */
    int device;
    int timeout_ms;
    int *members, n;      /* parent ranks of the NCCL ranks, ring order */
    bool failed;          /* aborted, or an asynchronous error was seen */
    ncclComm_t *retired;  /* communicators left after an abortive shrink: never destroyed */
    int nretired;
    ncclComm_t child;     /* where NCCL puts the communicator of a shrink once it is done:
                             it must outlive the call that started the shrink */
};

static int nccl_fail(ncclResult_t res, int code, const char *what)
{
    return rk__fail(RK_SUB_RING, RK_LOG_ERROR, code, "%s: %s", what, ncclGetErrorString(res));
}

static int cuda_fail(cudaError_t e, const char *what)
{
    return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

/* Polls a non-blocking communicator until its pending operation (init, shrink) is done. */
static int wait_comm(ring_nccl *g, ncclComm_t comm, const ring_cancel *c, int64_t deadline)
{
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t res = ncclCommGetAsyncError(comm, &st);
        if (res != ncclSuccess)
            return nccl_fail(res, RK_E_NCCL, "ncclCommGetAsyncError");
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress) {
            g->failed = true;
            return nccl_fail(st, RK_E_PEER_LOST, "NCCL communicator");
        }
        int rc = ring__poll_cancel(c, deadline);
        if (rc != 0)
            return rc;
        rk__sleep_ns(20000);
    }
}

static int nccl_type(rk_dtype t, ncclDataType_t *out)
{
    switch (t) {
    case RK_F32: *out = ncclFloat32; return 0;
    case RK_F64: *out = ncclFloat64; return 0;
    case RK_F16: *out = ncclFloat16; return 0;
    case RK_BF16: *out = ncclBfloat16; return 0;
    case RK_I32: *out = ncclInt32; return 0;
    case RK_I64: *out = ncclInt64; return 0;
    case RK_U8: *out = ncclUint8; return 0;
    }
    return RK_E_DTYPE;
}

static int fresh_comm(ring_nccl *g, ring *r, const ring_cancel *c)
{
    int64_t deadline = ring__deadline(r, c);
    ncclUniqueId id;
    memset(&id, 0, sizeof(id));
    ncclResult_t res = r->rank == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
    if (res != ncclSuccess)
        return nccl_fail(res, RK_E_NCCL, "ncclGetUniqueId");
    int rc = ring_share_blob(r, &id, sizeof(id), c);
    if (rc != 0)
        return rc;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    res = ncclCommInitRankConfig(&comm, r->size, id, r->rank, &cfg);
    if (res != ncclSuccess && res != ncclInProgress)
        return nccl_fail(res, RK_E_NCCL, "ncclCommInitRankConfig");
    if ((rc = wait_comm(g, comm, c, deadline)) != 0) {
        ncclCommAbort(comm);
        return rc;
    }
    g->comm = comm;
    g->failed = false;
    return 0;
}

static int copy_members(ring_nccl *g, const ring *r)
{
    int *m = malloc((size_t)r->size * sizeof(*m));
    if (!m)
        return -ENOMEM;
    memcpy(m, r->members, (size_t)r->size * sizeof(*m));
    free(g->members);
    g->members = m;
    g->n = r->size;
    return 0;
}

bool ring_nccl_ok(const ring_nccl *g)
{
    return g && g->comm && !g->failed;
}

int ring_nccl_create(ring_nccl **out, ring *r, int device, int timeout_ms, const ring_cancel *cancel)
{
    if (!out || !ring_is_member(r))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_nccl_create: no ring, or not a member");
    *out = NULL;
    ring_nccl *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->device = device;
    g->timeout_ms = timeout_ms;
    cudaError_t e = cudaSetDevice(device);
    int rc;
    if (e != cudaSuccess) {
        rc = cuda_fail(e, "cudaSetDevice");
        goto out_free;
    }
    if ((e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        rc = cuda_fail(e, "cudaStreamCreate");
        goto out_free;
    }
    if ((e = cudaEventCreateWithFlags(&g->after, cudaEventDisableTiming)) != cudaSuccess) {
        rc = cuda_fail(e, "cudaEventCreate");
        goto out_stream;
    }
    if ((rc = copy_members(g, r)) != 0)
        goto out_event;
    ring_cancel c = {.deadline_ns = rk__deadline_ns(timeout_ms)};
    if ((rc = fresh_comm(g, r, cancel ? cancel : &c)) != 0)
        goto out_members;
    *out = g;
    return 0;

out_members:
    free(g->members);
out_event:
    cudaEventDestroy(g->after);
out_stream:
    cudaStreamDestroy(g->stream);
out_free:
    free(g);
    return rc;
}

void ring_nccl_destroy(ring_nccl **pg)
{
    if (!pg || !*pg)
        return;
    ring_nccl *g = *pg;
    if (g->comm) {
        if (g->failed) {
            ncclCommAbort(g->comm);
        } else {
            ncclCommFinalize(g->comm);
            ring_cancel c = {.deadline_ns = rk__deadline_ns(g->timeout_ms)};
            if (wait_comm(g, g->comm, &c, c.deadline_ns) == 0)
                ncclCommDestroy(g->comm);
            else
                ncclCommAbort(g->comm);
        }
    }
    /* g->retired: left after an abortive shrink; NCCL forbids destroying them. */
    free(g->retired);
    if (g->child) /* a shrink given up on that NCCL finished afterwards */
        ncclCommAbort(g->child);
    cudaEventDestroy(g->after);
    cudaStreamDestroy(g->stream);
    free(g->members);
    free(g);
    *pg = NULL;
}

/* Aborts the communicator (never destroyed after a failed operation: newer NCCL can hang
   in ncclCommDestroy then); ncclCommAbort ends the kernels so the stream drains. */
static void fail_comm(ring_nccl *g)
{
    g->failed = true;
    if (g->comm) {
        ncclCommAbort(g->comm);
        g->comm = NULL;
    }
}

int ring_nccl_allreduce(ring_nccl *g, void *buf, size_t count, rk_dtype dtype, rk_op op, void *after,
                        const ring_cancel *c)
{
    ncclDataType_t t;
    if (!g || (!buf && count > 0))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_nccl_allreduce: NULL handle or buffer");
    if (nccl_type(dtype, &t) != 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_DTYPE, "ring_nccl_allreduce: dtype %d", (int)dtype);
    ncclRedOp_t o = op == RK_SUM ? ncclSum : op == RK_AVG ? ncclAvg : op == RK_MAX ? ncclMax : ncclMin;
    if ((unsigned)op > RK_MIN || (op == RK_AVG && (dtype == RK_I32 || dtype == RK_I64 || dtype == RK_U8)))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_OP, "ring_nccl_allreduce: op %d on dtype %d (avg of "
                        "integers is refused, as on the MPI ring)", (int)op, (int)dtype);
    if (g->failed || !g->comm)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_STATE, "ring_nccl_allreduce: communicator failed: rebuild first");
    int64_t deadline = c && c->deadline_ns ? c->deadline_ns : rk__deadline_ns(g->timeout_ms);
    /* The gradients are the caller's stream's work: the ring's stream waits for it (a
       device-side wait; the host never blocks). */
    cudaError_t ce = cudaEventRecord(g->after, after ? (cudaStream_t)after : cudaStreamLegacy);
    if (ce == cudaSuccess)
        ce = cudaStreamWaitEvent(g->stream, g->after, 0);
    if (ce != cudaSuccess)
        return cuda_fail(ce, "ring_nccl_allreduce: ordering after the caller's stream");
    ncclResult_t res = ncclAllReduce(buf, buf, count, t, o, g->comm, g->stream);
    if (res != ncclSuccess && res != ncclInProgress) {
        fail_comm(g);
        return nccl_fail(res, RK_E_PEER_LOST, "ncclAllReduce");
    }
    for (unsigned polls = 0;; polls++) {
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(g->comm, &st);
        if (st != ncclSuccess && st != ncclInProgress) {
            fail_comm(g);
            return nccl_fail(st, RK_E_PEER_LOST, "ncclAllReduce (asynchronous error)");
        }
        if (st == ncclSuccess) {
            cudaError_t e = cudaStreamQuery(g->stream);
            if (e == cudaSuccess)
                return 0;
            if (e != cudaErrorNotReady) {
                fail_comm(g);
                return cuda_fail(e, "cudaStreamQuery");
            }
        }
        int rc = ring__poll_cancel(c, deadline);
        if (rc != 0) {
            fail_comm(g);
            return rk__fail(RK_SUB_RING, RK_LOG_WARN, rc, "ring_nccl_allreduce: aborted: %s", rk_strerror(rc));
        }
        /* A small call is done within the first polls; a long one leaves the core to
           NCCL's proxy threads and the other ranks sharing the host (a device shared by
           several ranks has its traffic through the proxies). */
        if (polls >= 64)
            rk__sleep_ns(10000);
    }
}

bool ring_nccl_can_shrink(const ring_nccl *g, const ring *r)
{
#if defined(RK_HAVE_NCCL_SHRINK)
    if (!g || !g->comm || g->failed || !ring_is_member(r))
        return false;
    int *excl = malloc((size_t)g->n * sizeof(*excl)), nex = 0;
    if (!excl)
        return false;
    enum ring_nccl_plan p = ring_nccl_plan(g->members, g->n, r->members, r->size, excl, &nex);
    free(excl);
    return p != RING_NCCL_FRESH;
#else
    (void)g;
    (void)r;
    return false; /* NCCL < 2.27: no ncclCommShrink */
#endif
}

int ring_nccl_rebuild(ring_nccl *g, ring *r, bool shrink, const ring_cancel *c)
{
    if (!g || !ring_is_member(r))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_nccl_rebuild: no handle, or not a member");
    int rc;
#if defined(RK_HAVE_NCCL_SHRINK)
    int *excl = malloc((size_t)g->n * sizeof(*excl)), nex = 0;
    if (!excl)
        return -ENOMEM;
    enum ring_nccl_plan plan = ring_nccl_plan(g->members, g->n, r->members, r->size, excl, &nex);
    if (shrink && plan == RING_NCCL_KEEP && g->comm && !g->failed) {
        free(excl);
        return 0;
    }
    if (shrink && plan == RING_NCCL_SHRINK && g->comm && !g->failed) {
        int64_t deadline = ring__deadline(r, c);
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclComm_t parent = g->comm;
        g->child = NULL;
        /* A lost member may have left operations pending: terminate them first. */
        ncclResult_t res = ncclCommShrink(parent, excl, nex, &g->child, &cfg, NCCL_SHRINK_ABORT);
        free(excl);
        /* A non-blocking shrink is polled on the parent: the new communicator is NULL
           until it is done (NCCL's user guide, the non-blocking split). */
        if (res != ncclSuccess && res != ncclInProgress)
            rc = nccl_fail(res, RK_E_NCCL, "ncclCommShrink");
        else
            rc = wait_comm(g, parent, c, deadline);
        if (rc == 0 && !g->child)
            rc = rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_NCCL, "ncclCommShrink: done without a communicator");
        if (rc == 0)
            rc = wait_comm(g, g->child, c, deadline); /* ready at once, unless NCCL says otherwise */
        g->comm = NULL;
        g->failed = true;
        if (rc != 0) {
            /* A shrink is stopped by aborting the parent, then the child if NCCL made one. */
            ncclCommAbort(parent);
            if (g->child)
                ncclCommAbort(g->child);
            g->child = NULL;
            return rc; /* the caller agrees on a fresh communicator next */
        }
        ncclComm_t *v = realloc(g->retired, (size_t)(g->nretired + 1) * sizeof(*v));
        if (v) { /* never destroyed after an abortive shrink; kept for the record */
            g->retired = v;
            g->retired[g->nretired++] = parent;
        }
        g->comm = g->child;
        g->child = NULL;
        g->failed = false;
        return copy_members(g, r);
    }
    free(excl);
#else
    (void)shrink;
#endif
    fail_comm(g);
    if ((rc = fresh_comm(g, r, c)) != 0)
        return rc;
    return copy_members(g, r);
}
