/*
 * ring/ring_nccl.c - the ring for device buffers over NCCL (built only when CUDA + NCCL
 * are found). The same interface and the same promise as the MPI ring: no wait without
 * a bound, a distinct error when a member is lost, a rebuild over the survivors.
 *
 *  - Communicators are created non-blocking (config.blocking = 0): every NCCL call may
 *    return ncclInProgress, and completion is polled with ncclCommGetAsyncError against
 *    the deadline and the cancellation source (wait_comm).
 *  - An allreduce is enqueued on the ring's own stream and polled with cudaStreamQuery,
 *    ncclCommGetAsyncError and the cancellation source; on loss or deadline the
 *    communicator is aborted (ncclCommAbort) so the kernel ends and nothing writes the
 *    caller's device buffer after the call returns; the call fails.
 *  - Rebuild: members only dropped, communicator not aborted (the loss was seen between
 *    calls) -> ncclCommShrink (NCCL >= 2.27) excluding the lost NCCL ranks, with
 *    NCCL_SHRINK_ABORT (ends whatever the lost member left pending); the old communicator
 *    is then never destroyed (NCCL forbids it after an abortive shrink) but kept until
 *    ring_nccl_destroy, which leaves it alone. Members added (spares) -> the old one is
 *    aborted and a fresh communicator is made, its unique id sent point-to-point by ring
 *    rank 0 to the MPI ring's new members with a bounded wait.
 * Untested on a GPU here (no GPU on the build machines): tests/test_ring_nccl.c skips.
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
    int device;
    int timeout_ms;
    int *members, n;      /* parent ranks of the NCCL ranks, ring order */
    bool failed;          /* aborted, or an asynchronous error was seen */
    ncclComm_t *retired;  /* communicators left after an abortive shrink: never destroyed */
    int nretired;
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

/* Ring rank 0 makes a unique id and sends it to every member, point-to-point on r's
   parent communicator. */
static int share_id(ring *r, ncclUniqueId *id, const ring_cancel *c, int64_t deadline)
{
    int tag = ring__ctrl_tag(r->epoch, RING_CTRL_NCCL_ID), rc = 0, n = r->rank == 0 ? r->size - 1 : 1;
    MPI_Request *q = calloc((size_t)(n > 0 ? n : 1), sizeof(*q));
    if (!q)
        return -ENOMEM;
    if (r->rank == 0) {
        ncclResult_t res = ncclGetUniqueId(id);
        if (res != ncclSuccess) {
            free(q);
            return nccl_fail(res, RK_E_NCCL, "ncclGetUniqueId");
        }
        for (int i = 1; i < r->size; i++)
            MPI_Isend(id, (int)sizeof(*id), MPI_BYTE, r->members[i], tag, r->parent, &q[i - 1]);
    } else {
        MPI_Irecv(id, (int)sizeof(*id), MPI_BYTE, r->members[0], tag, r->parent, &q[0]);
    }
    for (int done = 0; !done && rc == 0;) {
        if (MPI_Testall(n, q, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            rc = rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_PEER_LOST, "NCCL unique id exchange failed");
        else if (!done)
            rc = ring__poll_cancel(c, deadline);
    }
    for (int i = 0; rc != 0 && i < n; i++)
        if (q[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&q[i]);
            MPI_Request_free(&q[i]); /* the caller then leaks id: MPI may still write it */
        }
    free(q);
    return rc;
}

static int fresh_comm(ring_nccl *g, ring *r, const ring_cancel *c)
{
    int64_t deadline = ring__deadline(r, c);
    ncclUniqueId *id = malloc(sizeof(*id)); /* leaked if an abandoned receive may write it */
    if (!id)
        return -ENOMEM;
    int rc = share_id(r, id, c, deadline);
    if (rc != 0)
        return rc;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommInitRankConfig(&comm, r->size, *id, r->rank, &cfg);
    free(id);
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

int ring_nccl_create(ring_nccl **out, ring *r, int device, int timeout_ms)
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
    if ((rc = copy_members(g, r)) != 0)
        goto out_stream;
    ring_cancel c = {.deadline_ns = rk__deadline_ns(timeout_ms)};
    if ((rc = fresh_comm(g, r, &c)) != 0)
        goto out_members;
    *out = g;
    return 0;

out_members:
    free(g->members);
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
    cudaStreamDestroy(g->stream);
    free(g->members);
    free(g);
    *pg = NULL;
}

static void fail_comm(ring_nccl *g)
{
    if (!g->failed) {
        g->failed = true;
        ncclCommAbort(g->comm); /* ends the kernels so the stream drains */
        g->comm = NULL;
    }
}

int ring_nccl_allreduce(ring_nccl *g, void *buf, size_t count, rk_dtype dtype, rk_op op,
                        const ring_cancel *c)
{
    ncclDataType_t t;
    if (!g || (!buf && count > 0))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_nccl_allreduce: NULL handle or buffer");
    if (nccl_type(dtype, &t) != 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_DTYPE, "ring_nccl_allreduce: dtype %d", (int)dtype);
    ncclRedOp_t o = op == RK_SUM ? ncclSum : op == RK_AVG ? ncclAvg : op == RK_MAX ? ncclMax : ncclMin;
    if ((unsigned)op > RK_MIN)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_OP, "ring_nccl_allreduce: op %d", (int)op);
    if (g->failed || !g->comm)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_STATE, "ring_nccl_allreduce: communicator failed: rebuild first");
    int64_t deadline = c && c->deadline_ns ? c->deadline_ns : rk__deadline_ns(g->timeout_ms);
    ncclResult_t res = ncclAllReduce(buf, buf, count, t, o, g->comm, g->stream);
    if (res != ncclSuccess && res != ncclInProgress) {
        fail_comm(g);
        return nccl_fail(res, RK_E_PEER_LOST, "ncclAllReduce");
    }
    for (;;) {
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
    }
}

int ring_nccl_rebuild(ring_nccl *g, ring *r, const ring_cancel *c)
{
    if (!g || !ring_is_member(r))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_nccl_rebuild: no handle, or not a member");
    int *excl = malloc((size_t)g->n * sizeof(*excl)), nex = 0, rc;
    if (!excl)
        return -ENOMEM;
    bool only_dropped = true;
    for (int i = 0; i < r->size; i++) {
        bool found = false;
        for (int j = 0; j < g->n; j++)
            found |= g->members[j] == r->members[i];
        only_dropped &= found;
    }
    for (int j = 0; j < g->n; j++) {
        bool kept = false;
        for (int i = 0; i < r->size; i++)
            kept |= g->members[j] == r->members[i];
        if (!kept)
            excl[nex++] = j;
    }
    int64_t deadline = ring__deadline(r, c);
    if (only_dropped && g->comm) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclComm_t nc = NULL;
        /* A lost member may have left operations pending: terminate them first. */
        ncclResult_t res = ncclCommShrink(g->comm, excl, nex, &nc, &cfg, NCCL_SHRINK_ABORT);
        if ((res == ncclSuccess || res == ncclInProgress) && (rc = wait_comm(g, nc, c, deadline)) == 0) {
            ncclComm_t *v = realloc(g->retired, (size_t)(g->nretired + 1) * sizeof(*v));
            if (v) { /* never destroyed after an abortive shrink; kept for the record */
                g->retired = v;
                g->retired[g->nretired++] = g->comm;
            }
            g->comm = nc;
            g->failed = false;
            free(excl);
            return copy_members(g, r);
        }
        RK_LOG_WARN(RK_SUB_RING, "ncclCommShrink did not complete (%s): making a fresh communicator",
                    ncclGetErrorString(res));
    }
    free(excl);
    fail_comm(g);
    if ((rc = fresh_comm(g, r, c)) != 0)
        return rc;
    return copy_members(g, r);
}
