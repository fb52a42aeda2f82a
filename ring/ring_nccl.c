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
 *    ncclCommGetAsyncError and the cancellation source. On loss or deadline the call
 *    stops what it has in flight before it fails, so nothing writes the caller's device
 *    buffer after it returns: ncclCommRevoke (NCCL >= 2.28; RK_NCCL_REVOKE=0 turns it
 *    off), and the call returns once the ring's stream drained (the kernels ended);
 *    without it (or when the revoke fails or the kernels still run after
 *    REVOKE_BOUND_MS) ncclCommAbort, which returns only after ~0.5 s: it waits for NCCL's
 *    proxy thread, which wakes every 500 ms (measured on an H200: docs/BENCHMARKS.md).
 *  - Rebuild (the caller says which way: every member must take the same one):
 *    members only dropped and the communicator intact, or revoked and quiescent by then
 *    (NCCL's own time, ~0.5 s after the revoke) -> ncclCommShrink
 *    (NCCL >= 2.27: found at run time) excluding the lost NCCL ranks (ring_nccl_plan),
 *    NCCL_SHRINK_ABORT on an intact parent (ends whatever the lost member left pending),
 *    NCCL_SHRINK_DEFAULT on a revoked one. Otherwise (members added: spares; a revoked
 *    communicator not yet quiescent; an aborted one; no shrink in this NCCL) a fresh communicator, its unique id sent by
 *    ring rank 0 to the MPI ring's members (ring_share_blob) with a bounded wait.
 *  - A communicator nothing of ours runs on any more (the parent of a shrink, a revoked or
 *    intact one replaced by a fresh one) is freed by ncclCommAbort on a thread of its own
 *    (retire): recovery does not wait its ~0.5 s; each later retire joins those that
 *    ended (collect_reapers), ring_nccl_destroy the rest, bounded.
 *  - NCCL is found at run time, never linked (ring_nccl_load): a process holds one
 *    libnccl.so.2, and the one already loaded (torch's, older or newer than the nccl.h
 *    this was built with) is the one used (dlopen RTLD_NOLOAD first); otherwise the
 *    loader's search (this library's rpath: the build's NCCL). Each function is taken
 *    with dlsym: a missing required one makes NCCL unusable, said once, and device
 *    buffers take the staging path (recover/api_ring_nccl.c); ncclCommShrink (2.27) and
 *    ncclCommRevoke (2.28) are optional, each used where this process's NCCL has it.
 *    The NCCL_SHRINK_* and NCCL_REVOKE_* flags are NCCL's ABI values, defined here when
 *    the build's nccl.h is older.
 * Run on a GPU (an H200, docs/GPU.md); without one tests/test_ring_nccl.c skips. The
 * loading at run time was built against NCCL 2.28.9 and has not run on a GPU yet.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

#ifndef NCCL_SHRINK_ABORT /* nccl.h < 2.27: NCCL's values */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#endif
#ifndef NCCL_REVOKE_DEFAULT /* nccl.h < 2.28 */
#define NCCL_REVOKE_DEFAULT 0x00
#endif

/* A revoke not quiescent by then falls back to ncclCommAbort. */
enum { REVOKE_BOUND_MS = 2000 };

struct ring_nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    cudaEvent_t after;    /* recorded on the caller's stream: the allreduce waits for it */
    int device;
    int timeout_ms;
    int *members, n;      /* parent ranks of the NCCL ranks, ring order */
    bool failed;          /* revoked, aborted, or an asynchronous error was seen */
    bool revoked;         /* failed, stopped by ncclCommRevoke and quiescent: comm kept for
                             a shrink */
    pthread_t *reapers;   /* the threads aborting retired communicators (retire) */
    int nreapers;
    ncclComm_t child;     /* where NCCL puts the communicator of a shrink once it is done:
                             it must outlive the call that started the shrink */
};

/* ---- NCCL, found at run time ------------------------------------------------------------ */

/* The process's NCCL: one per process (the dynamic loader's), so one table, filled once. */
static struct {
    bool usable;
    int version;
    char why[256];      /* why not usable */
    ncclResult_t (*GetVersion)(int *);
    const char *(*GetErrorString)(ncclResult_t);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*CommFinalize)(ncclComm_t);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    /* optional: NULL where this NCCL lacks them */
    ncclResult_t (*CommShrink)(ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int); /* 2.27 */
    ncclResult_t (*CommRevoke)(ncclComm_t, int);                                          /* 2.28 */
} nccl;
static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

static void nccl_open(void)
{
    const char *how = "already loaded";
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (!h) {
        how = "loaded";
        h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        snprintf(nccl.why, sizeof(nccl.why), "libnccl.so.2 cannot be loaded: %s", dlerror());
        return;
    }
    const struct {
        const char *name;
        void **fn;
        bool optional;
    } want[] = {
        {"ncclGetVersion", (void **)&nccl.GetVersion, false},
        {"ncclGetErrorString", (void **)&nccl.GetErrorString, false},
        {"ncclGetUniqueId", (void **)&nccl.GetUniqueId, false},
        {"ncclCommInitRankConfig", (void **)&nccl.CommInitRankConfig, false},
        {"ncclCommGetAsyncError", (void **)&nccl.CommGetAsyncError, false},
        {"ncclCommFinalize", (void **)&nccl.CommFinalize, false},
        {"ncclCommDestroy", (void **)&nccl.CommDestroy, false},
        {"ncclCommAbort", (void **)&nccl.CommAbort, false},
        {"ncclAllReduce", (void **)&nccl.AllReduce, false},
        {"ncclCommShrink", (void **)&nccl.CommShrink, true},
        {"ncclCommRevoke", (void **)&nccl.CommRevoke, true},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        *want[i].fn = dlsym(h, want[i].name);
        if (!*want[i].fn && !want[i].optional) {
            snprintf(nccl.why, sizeof(nccl.why), "the process's libnccl.so.2 has no %s (NCCL older than 2.14?)",
                     want[i].name);
            return; /* the handle stays open: dlclose of a library torch may use is not ours */
        }
    }
    if (nccl.GetVersion(&nccl.version) != ncclSuccess) {
        snprintf(nccl.why, sizeof(nccl.why), "ncclGetVersion failed");
        return;
    }
    nccl.usable = true;
    RK_LOG_INFO(RK_SUB_RING, "NCCL %d (libnccl.so.2 %s): ncclCommShrink %s, ncclCommRevoke %s", nccl.version, how,
                nccl.CommShrink ? "found" : "absent", nccl.CommRevoke ? "found" : "absent");
}

int ring_nccl_load(int *version, const char **why)
{
    pthread_once(&nccl_once, nccl_open);
    if (!nccl.usable) {
        if (why)
            *why = nccl.why;
        return RK_E_NCCL;
    }
    if (version)
        *version = nccl.version;
    return 0;
}

static int nccl_fail(ncclResult_t res, int code, const char *what)
{
    return rk__fail(RK_SUB_RING, RK_LOG_ERROR, code, "%s: %s", what, nccl.GetErrorString(res));
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
        ncclResult_t res = nccl.CommGetAsyncError(comm, &st);
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

/* ---- retired communicators: freed off the recovery path -------------------------------- */

struct reap {
    ncclComm_t comm;
    int device;
};

static void *reap_main(void *arg)
{
    struct reap *x = arg;
    cudaSetDevice(x->device);
    nccl.CommAbort(x->comm);
    free(x);
    return NULL;
}

/* Joins the retiring threads that ended (pthread_tryjoin_np: never waits) and keeps the
   others, so that the threads of earlier rebuilds do not pile up until the ring's end: at
   each rebuild, before it retires its own (the previous rebuild's abort, ~0.5 s, has
   ended unless rebuilds come faster). ring_nccl_destroy joins the rest, bounded. */
static void collect_reapers(ring_nccl *g)
{
    int kept = 0;
    for (int i = 0; i < g->nreapers; i++)
        if (pthread_tryjoin_np(g->reapers[i], NULL) != 0)
            g->reapers[kept++] = g->reapers[i];
    g->nreapers = kept;
}

int ring_nccl_reapers(const ring_nccl *g)
{
    return g ? g->nreapers : 0;
}

/* Frees a communicator nothing runs on any more (no call of ours in flight on it: the
   parent of a shrink, a revoked or intact one replaced by a fresh one). NCCL's user guide
   leaves the parent of an abortive shrink to the caller's ncclCommAbort; its ~0.5 s runs
   on a thread of its own (synchronously if no thread can be made). */
static void retire(ring_nccl *g, ncclComm_t comm)
{
    collect_reapers(g);
    struct reap *x = malloc(sizeof(*x));
    pthread_t *v = realloc(g->reapers, (size_t)(g->nreapers + 1) * sizeof(*v));
    if (v)
        g->reapers = v;
    if (x && v) {
        *x = (struct reap){comm, g->device};
        if (pthread_create(&v[g->nreapers], NULL, reap_main, x) == 0) {
            /* Named before the rebuild returns (what gdb and /proc show; a failure once the
               thread ended is of no matter). */
            pthread_setname_np(v[g->nreapers], "rk-nccl-reap");
            g->nreapers++;
            return;
        }
    }
    free(x);
    nccl.CommAbort(comm);
}

/* Joins the retiring threads within timeout_ms in all; one still inside ncclCommAbort then
   is left detached (logged). */
static void join_reapers(ring_nccl *g)
{
    int64_t end = rk__real_ns() + (int64_t)g->timeout_ms * 1000000; /* timedjoin's clock */
    struct timespec until = {.tv_sec = end / 1000000000, .tv_nsec = end % 1000000000};
    for (int i = 0; i < g->nreapers; i++)
        if (pthread_timedjoin_np(g->reapers[i], NULL, &until) != 0) {
            RK_LOG_WARN(RK_SUB_RING, "NCCL: a retired communicator's abort still runs after %d ms: left to finish alone",
                        g->timeout_ms);
            pthread_detach(g->reapers[i]);
        }
    free(g->reapers);
    g->reapers = NULL;
    g->nreapers = 0;
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
    ncclResult_t res = r->rank == 0 ? nccl.GetUniqueId(&id) : ncclSuccess;
    if (res != ncclSuccess)
        return nccl_fail(res, RK_E_NCCL, "ncclGetUniqueId");
    int rc = ring_share_blob(r, &id, sizeof(id), c);
    if (rc != 0)
        return rc;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t comm = NULL;
    res = nccl.CommInitRankConfig(&comm, r->size, id, r->rank, &cfg);
    if (res != ncclSuccess && res != ncclInProgress)
        return nccl_fail(res, RK_E_NCCL, "ncclCommInitRankConfig");
    if ((rc = wait_comm(g, comm, c, deadline)) != 0) {
        nccl.CommAbort(comm);
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
    const char *why = NULL;
    if (ring_nccl_load(NULL, &why) != 0)
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, RK_E_NCCL, "ring_nccl_create: %s", why);
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
            nccl.CommAbort(g->comm);
        } else {
            nccl.CommFinalize(g->comm);
            ring_cancel c = {.deadline_ns = rk__deadline_ns(g->timeout_ms)};
            if (wait_comm(g, g->comm, &c, c.deadline_ns) == 0)
                nccl.CommDestroy(g->comm);
            else
                nccl.CommAbort(g->comm);
        }
    }
    if (g->child) /* a shrink given up on that NCCL finished afterwards */
        nccl.CommAbort(g->child);
    join_reapers(g);
    cudaEventDestroy(g->after);
    cudaStreamDestroy(g->stream);
    free(g->members);
    free(g);
    *pg = NULL;
}

bool ring_nccl_revokes(void)
{
    if (ring_nccl_load(NULL, NULL) != 0 || !nccl.CommRevoke)
        return false; /* NCCL < 2.28 in this process */
    const char *e = getenv("RK_NCCL_REVOKE");
    return !e || (strcmp(e, "0") != 0 && strcmp(e, "off") != 0);
}

/* ncclCommRevoke, then the ring's stream polled until it drained (the kernels ended: from
   then on nothing writes the caller's buffer) within REVOKE_BOUND_MS. The communicator
   becomes quiescent later, by itself (~0.5 s: NCCL's proxy thread); a shrink waits for
   that (revoked_quiescent), a fresh communicator does not. False: not so (the caller
   aborts). */
static bool revoke(ring_nccl *g)
{
    int64_t t0 = rk__mono_ns(), deadline = rk__deadline_ns(REVOKE_BOUND_MS);
    ncclResult_t res = nccl.CommRevoke(g->comm, NCCL_REVOKE_DEFAULT);
    if (res != ncclSuccess && res != ncclInProgress) {
        RK_LOG_WARN(RK_SUB_RING, "ncclCommRevoke: %s: aborting the communicator", nccl.GetErrorString(res));
        return false;
    }
    for (;;) {
        cudaError_t e = cudaStreamQuery(g->stream);
        if (e == cudaSuccess) {
            RK_LOG_DEBUG(RK_SUB_RING, "ncclCommRevoke: the kernels ended after %.1f ms", rk__ms_since(t0));
            return true;
        }
        if (e != cudaErrorNotReady) {
            RK_LOG_WARN(RK_SUB_RING, "after ncclCommRevoke: cudaStreamQuery: %s: aborting the communicator",
                        cudaGetErrorString(e));
            return false;
        }
        if (rk__deadline_passed(deadline)) {
            RK_LOG_WARN(RK_SUB_RING, "ncclCommRevoke: the kernels still run after %d ms: aborting the communicator",
                        (int)REVOKE_BOUND_MS);
            return false;
        }
        rk__sleep_ns(20000);
    }
}

/* A revoked communicator is good for a shrink once NCCL says it is quiescent. */
static bool revoked_quiescent(const ring_nccl *g)
{
    ncclResult_t st = ncclInProgress;
    return g->revoked && g->comm && nccl.CommGetAsyncError(g->comm, &st) == ncclSuccess && st == ncclSuccess;
}

/* Stops what the communicator has in flight after a failed call, so the kernels end and
   nothing writes the caller's buffer after the call returns: revoked (kept for a shrink)
   where this NCCL can, otherwise aborted (never destroyed after a failed operation: newer
   NCCL can hang in ncclCommDestroy then). */
static void fail_comm(ring_nccl *g)
{
    g->failed = true;
    if (!g->comm || g->revoked)
        return;
    if (ring_nccl_revokes() && revoke(g)) {
        g->revoked = true;
        return;
    }
    nccl.CommAbort(g->comm);
    g->comm = NULL;
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
    ncclResult_t res = nccl.AllReduce(buf, buf, count, t, o, g->comm, g->stream);
    if (res != ncclSuccess && res != ncclInProgress) {
        fail_comm(g);
        return nccl_fail(res, RK_E_PEER_LOST, "ncclAllReduce");
    }
    for (unsigned polls = 0;; polls++) {
        ncclResult_t st = ncclSuccess;
        nccl.CommGetAsyncError(g->comm, &st);
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
    if (!nccl.CommShrink)
        return false; /* NCCL < 2.27 in this process: no ncclCommShrink */
    if (!g || !g->comm || (g->failed && !revoked_quiescent(g)) || !ring_is_member(r))
        return false;
    int *excl = malloc((size_t)g->n * sizeof(*excl)), nex = 0;
    if (!excl)
        return false;
    enum ring_nccl_plan p = ring_nccl_plan(g->members, g->n, r->members, r->size, excl, &nex);
    free(excl);
    /* A revoked communicator is shrunk, never kept: the same members take a fresh one. */
    return p == RING_NCCL_SHRINK || (p == RING_NCCL_KEEP && !g->failed);
}

int ring_nccl_rebuild(ring_nccl *g, ring *r, bool shrink, const ring_cancel *c)
{
    if (!g || !ring_is_member(r))
        return rk__fail(RK_SUB_RING, RK_LOG_ERROR, -EINVAL, "ring_nccl_rebuild: no handle, or not a member");
    int rc;
    if (shrink && nccl.CommShrink) { /* (NCCL >= 2.27 in this process) */
        int *excl = malloc((size_t)g->n * sizeof(*excl)), nex = 0;
        if (!excl)
            return -ENOMEM;
        enum ring_nccl_plan plan = ring_nccl_plan(g->members, g->n, r->members, r->size, excl, &nex);
        if (plan == RING_NCCL_KEEP && g->comm && !g->failed) {
            free(excl);
            return 0;
        }
        if (plan == RING_NCCL_SHRINK && g->comm && (!g->failed || revoked_quiescent(g))) {
            int64_t deadline = ring__deadline(r, c);
            ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
            cfg.blocking = 0;
            ncclComm_t parent = g->comm;
            g->child = NULL;
            /* An intact parent may have operations a lost member left pending: terminate them
               first; a revoked one has none (NCCL's fault-tolerance guide). */
            ncclResult_t res = nccl.CommShrink(parent, excl, nex, &g->child, &cfg,
                                               g->revoked ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT);
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
            g->revoked = false;
            if (rc != 0) {
                /* A shrink is stopped by aborting the parent, then the child if NCCL made one. */
                nccl.CommAbort(parent);
                if (g->child)
                    nccl.CommAbort(g->child);
                g->child = NULL;
                return rc; /* the caller agrees on a fresh communicator next */
            }
            retire(g, parent);
            g->comm = g->child;
            g->child = NULL;
            g->failed = false;
            return copy_members(g, r);
        }
        free(excl);
    }
    if (g->comm && (!g->failed || g->revoked)) /* nothing of ours runs on it: freed off this path */
        retire(g, g->comm);
    else if (g->comm)
        nccl.CommAbort(g->comm);
    g->comm = NULL;
    g->failed = true;
    g->revoked = false;
    if ((rc = fresh_comm(g, r, c)) != 0)
        return rc;
    return copy_members(g, r);
}
