/*
 * ckpt/copy_cuda.c - the CUDA copy engine (copy.h) and the check of a device pointer
 * (ckpt_device_check). Built only where the CUDA toolkit is (Makefile: *_cuda.c).
 *
 * A batch: an event recorded on the caller's stream (rk_options.cuda_stream; NULL: the
 * legacy stream), which the engine's own non-blocking stream waits for, so the copies
 * see every write the caller queued before the snapshot; then one cudaMemcpyAsync per
 * copy (cudaMemcpyDefault: device -> pinned staging for a snapshot, staging -> device for
 * a restore); then the completion event. Waiting polls cudaEventQuery until the deadline,
 * never a blocking synchronize: a device that stopped answering costs the waiter its
 * deadline, not the process. A copy the runtime refuses to queue ends the batch there
 * (the copies queued before it still complete): a copy failing halfway.
 *
 * Staging is pinned with cudaHostRegister (ckpt_copy_pin) so the copies are DMA and
 * truly asynchronous; the pinned region is unpinned before ckpt.c unmaps or moves it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "ckpt.h"
#include "copy_internal.h"

enum { NPIN = 3 }; /* regions kept pinned: the generations of snapshot.h S6 (g, old, park) */

struct cuda_copy {
    ckpt_copy base;
    cudaStream_t own, caller;
    cudaEvent_t after;   /* recorded on the caller's stream: the copies wait for it */
    cudaEvent_t done;    /* recorded on the engine's stream after the batch */
    pthread_mutex_t mu;  /* the fields below: several threads may wait at once */
    uint64_t gen;        /* the last batch started (0: none yet) */
    bool running;        /* batch gen has not completed */
    int rc;              /* how it ended, once it did */
    char why[256];
    void *pinned[NPIN];  /* the regions cudaHostRegister'd, the one pinned first first (NULL:
                            none): the generations of the held snapshot (snapshot.h S6) */
    bool pin_warned;
};

static int cuda_fail(cudaError_t e, const char *what)
{
    return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

static int cuda_start(ckpt_copy *c, const ckpt_copy_op *ops, size_t n, uint64_t *gen)
{
    struct cuda_copy *k = (struct cuda_copy *)c;
    pthread_mutex_lock(&k->mu);
    if (k->running) {
        pthread_mutex_unlock(&k->mu);
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_BUSY, "CUDA copy: a batch is still running");
    }
    cudaError_t e = cudaEventRecord(k->after, k->caller);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(k->own, k->after, 0);
    if (e != cudaSuccess) { /* nothing queued: the batch never starts */
        pthread_mutex_unlock(&k->mu);
        return cuda_fail(e, "CUDA copy: ordering after the caller's stream");
    }
    k->rc = 0;
    k->why[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!ops[i].n)
            continue;
        e = cudaMemcpyAsync(ops[i].dst, ops[i].src, ops[i].n, cudaMemcpyDefault, k->own);
        if (e != cudaSuccess) { /* the copies queued before still run: the batch ends after them */
            k->rc = RK_E_CUDA;
            snprintf(k->why, sizeof(k->why), "copy %zu of %zu (%zu bytes) could not be queued: %s", i + 1, n,
                     ops[i].n, cudaGetErrorString(e));
            break;
        }
    }
    if ((e = cudaEventRecord(k->done, k->own)) != cudaSuccess) {
        /* No completion to poll. The runtime refuses an event only once its context is
           broken (a sticky error): nothing queued on it runs either. */
        pthread_mutex_unlock(&k->mu);
        return cuda_fail(e, "CUDA copy: its completion event");
    }
    k->gen++;
    k->running = true;
    if (gen)
        *gen = k->gen;
    pthread_mutex_unlock(&k->mu);
    return 0;
}

/* Queries batch gen once (k->mu held): true once it completed, with k->rc set. */
static bool poll_locked(struct cuda_copy *k)
{
    if (!k->running)
        return true;
    cudaError_t e = cudaEventQuery(k->done);
    if (e == cudaErrorNotReady)
        return false;
    if (e != cudaSuccess && !k->rc) {
        k->rc = RK_E_CUDA;
        snprintf(k->why, sizeof(k->why), "the batch failed on the device: %s", cudaGetErrorString(e));
    }
    k->running = false;
    return true;
}

static bool cuda_done(ckpt_copy *c, uint64_t gen)
{
    struct cuda_copy *k = (struct cuda_copy *)c;
    pthread_mutex_lock(&k->mu);
    bool done = k->gen != gen || poll_locked(k);
    pthread_mutex_unlock(&k->mu);
    return done;
}

static int cuda_wait(ckpt_copy *c, uint64_t gen, int64_t deadline_ns)
{
    struct cuda_copy *k = (struct cuda_copy *)c;
    int64_t nap = 20 * 1000; /* 20 us, doubling to 1 ms: a copy of a few MiB takes about that */
    for (;;) {
        pthread_mutex_lock(&k->mu);
        int rc = k->gen != gen ? RK_E_ABORTED : poll_locked(k) ? k->rc : RK_E_TIMEOUT;
        char why[sizeof(k->why)];
        memcpy(why, k->why, sizeof(why));
        pthread_mutex_unlock(&k->mu);
        if (rc == RK_E_TIMEOUT && !rk__deadline_passed(deadline_ns)) {
            rk__sleep_ns(nap);
            nap = nap < 1000000 ? 2 * nap : nap;
            continue;
        }
        if (rc == RK_E_ABORTED)
            rk__set_last_error("CUDA copy: batch %llu was replaced by a later one", (unsigned long long)gen);
        else if (rc == RK_E_TIMEOUT)
            rk__set_last_error("CUDA copy: batch %llu still runs at the deadline", (unsigned long long)gen);
        else if (rc)
            rk__set_last_error("CUDA copy: %s", why);
        return rc;
    }
}

static void cuda_unpin(ckpt_copy *c, void *p)
{
    struct cuda_copy *k = (struct cuda_copy *)c;
    int i = 0;
    while (i < NPIN && (!p || k->pinned[i] != p))
        i++;
    if (i == NPIN)
        return;
    cudaError_t e = cudaHostUnregister(p);
    if (e != cudaSuccess)
        RK_LOG_WARN(RK_SUB_CKPT, "CUDA copy: unpinning staging: %s", cudaGetErrorString(e));
    for (; i + 1 < NPIN; i++)
        k->pinned[i] = k->pinned[i + 1];
    k->pinned[NPIN - 1] = NULL;
}

/* At most NPIN regions stay pinned, the generations of the held snapshot (g, old and the
   one a long disk write keeps aside): pinning one more unpins the one pinned first (a
   region replaced when the registry grew). */
static void cuda_pin(ckpt_copy *c, void *p, size_t n)
{
    struct cuda_copy *k = (struct cuda_copy *)c;
    if (!p || !n)
        return;
    for (int i = 0; i < NPIN; i++)
        if (k->pinned[i] == p)
            return;
    if (k->pinned[NPIN - 1])
        cuda_unpin(c, k->pinned[0]);
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterDefault);
    if (e == cudaSuccess) {
        int i = 0;
        while (k->pinned[i])
            i++;
        k->pinned[i] = p;
        RK_LOG_DEBUG(RK_SUB_CKPT, "CUDA copy: pinned %zu bytes of staging (%d regions pinned)", n, i + 1);
    } else if (!k->pin_warned) {
        k->pin_warned = true;
        RK_LOG_WARN(RK_SUB_CKPT, "CUDA copy: cannot pin %zu bytes of staging (%s): copies go unpinned, slower", n,
                    cudaGetErrorString(e));
    }
}

static int cuda_destroy(ckpt_copy *c, int64_t deadline_ns)
{
    struct cuda_copy *k = (struct cuda_copy *)c;
    pthread_mutex_lock(&k->mu);
    uint64_t gen = k->gen;
    pthread_mutex_unlock(&k->mu);
    if (gen && cuda_wait(c, gen, deadline_ns) == RK_E_TIMEOUT) {
        rk__retain_forever(k); /* the device may still write what it names */
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT, "CUDA copy: a batch still runs; the engine is left");
    }
    for (int i = NPIN - 1; i >= 0; i--)
        cuda_unpin(c, k->pinned[i]);
    cudaEventDestroy(k->done);
    cudaEventDestroy(k->after);
    cudaStreamDestroy(k->own);
    pthread_mutex_destroy(&k->mu);
    free(k);
    return 0;
}

static const struct ckpt_copy_vt cuda_vt = {.start = cuda_start, .wait = cuda_wait, .done = cuda_done,
                                            .destroy = cuda_destroy, .pin = cuda_pin, .unpin = cuda_unpin};

/* RK_E_CUDA naming the call unless the runtime has a device. */
static int have_device(const char *what)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_CUDA, "%s: no CUDA device: %s (%s)", what,
                        cudaGetErrorString(e), cudaGetErrorName(e));
    if (n == 0)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_CUDA, "%s: no CUDA device: the runtime sees none", what);
    return 0;
}

int ckpt_copy_cuda_create(ckpt_copy **out, void *caller_stream)
{
    *out = NULL;
    int rc = have_device("CUDA copy engine");
    if (rc)
        return rc;
    struct cuda_copy *k = calloc(1, sizeof(*k));
    if (!k)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "CUDA copy engine");
    k->base.vt = &cuda_vt;
    k->caller = (cudaStream_t)caller_stream;
    cudaError_t e = cudaStreamCreateWithFlags(&k->own, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(k);
        return cuda_fail(e, "CUDA copy engine: its stream");
    }
    if ((e = cudaEventCreateWithFlags(&k->after, cudaEventDisableTiming)) != cudaSuccess) {
        cudaStreamDestroy(k->own);
        free(k);
        return cuda_fail(e, "CUDA copy engine: its ordering event");
    }
    if ((e = cudaEventCreateWithFlags(&k->done, cudaEventDisableTiming)) != cudaSuccess) {
        cudaEventDestroy(k->after);
        cudaStreamDestroy(k->own);
        free(k);
        return cuda_fail(e, "CUDA copy engine: its completion event");
    }
    pthread_mutex_init(&k->mu, NULL);
    *out = &k->base;
    return 0;
}

int ckpt_device_check(const void *p, const char *name)
{
    char what[300];
    snprintf(what, sizeof(what), "rk_register '%s': RK_DEVICE", name);
    int rc = have_device(what);
    if (rc)
        return rc;
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* the error is ours to report, not the caller's next call's */
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_CUDA, "%s: cudaPointerGetAttributes of %p: %s", what, p,
                        cudaGetErrorString(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_CUDA,
                        "%s: %p is %s memory, not device memory (register it without RK_DEVICE)", what, p,
                        a.type == cudaMemoryTypeHost ? "pinned host" : "host");
    return 0;
}
