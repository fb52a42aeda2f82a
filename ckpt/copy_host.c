/*
 * ckpt/copy_host.c - the copy engines' common entry points (copy.h) and the host engine:
 * a worker thread that runs each batch's copies while the caller goes on, and whose
 * completion is waited for on a condition variable with a deadline.
 *
 * A copy of STREAM_MIN bytes or more streams past the caches (non-temporal stores, where
 * the CPU has them: SSE2, every x86-64): a snapshot's bytes are not read again soon (the
 * writer reads them from memory, and a snapshot kept for a recovery is usually never
 * read), and a cached store first reads every line it writes, which a streamed one does
 * not. On the 2-core VM (docs/BENCHMARKS.md "The stall back at a memcpy"), 1 GiB: glibc's
 * memcpy 0.093-0.127 s, streamed 0.059-0.073 s; the same in 15 MiB pieces, as 71 tensors
 * are copied, 0.137-0.167 s by memcpy. It also leaves the training's working set in the
 * caches. Smaller copies, and every copy where the CPU has no such stores, are memcpy.
 *
 * The CUDA engine is ckpt/copy_cuda.c, built only where the toolkit is (Makefile); in a
 * build without it, ckpt_copy_cuda_create and ckpt_device_check below say so.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "../formats/fmt.h"
#include "ckpt.h"
#include "copy_internal.h"

int ckpt_copy_destroy(ckpt_copy **c, int64_t deadline_ns)
{
    if (!c || !*c)
        return 0;
    ckpt_copy *x = *c;
    *c = NULL;
    return x->vt->destroy(x, deadline_ns);
}

int ckpt_copy_start(ckpt_copy *c, const ckpt_copy_op *ops, size_t n, uint64_t *gen)
{
    return c->vt->start(c, ops, n, gen);
}

int ckpt_copy_wait(ckpt_copy *c, uint64_t gen, int64_t deadline_ns)
{
    return gen ? c->vt->wait(c, gen, deadline_ns) : 0;
}

int ckpt_copy_wait_op(ckpt_copy *c, uint64_t gen, size_t k, int64_t deadline_ns)
{
    if (!gen)
        return 0;
    return c->vt->wait_op && k != SIZE_MAX ? c->vt->wait_op(c, gen, k, deadline_ns) : c->vt->wait(c, gen, deadline_ns);
}

bool ckpt_copy_done(ckpt_copy *c, uint64_t gen)
{
    return gen == 0 || c->vt->done(c, gen);
}

void ckpt_copy_pin(ckpt_copy *c, void *p, size_t n)
{
    if (c && c->vt->pin)
        c->vt->pin(c, p, n);
}

void ckpt_copy_unpin(ckpt_copy *c, void *p)
{
    if (c && c->vt->unpin && p)
        c->vt->unpin(c, p);
}

/* ---- the host engine ---------------------------------------------------------------- */

#define STREAM_MIN ((size_t)1 << 20) /* streamed from this size on (the file's header) */

/* n bytes from src to dst: streamed past the caches from STREAM_MIN bytes on, where the
   CPU can; every store is visible to other threads (and to a device reading by DMA)
   before it returns. */
static void copy_bytes(void *dst, const void *src, size_t n)
{
#if defined(__SSE2__)
    if (n >= STREAM_MIN) {
        char *d = dst;
        const char *s = src;
        size_t head = (size_t)(-(uintptr_t)d & 15); /* to dst's first 16-byte boundary */
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
        size_t body = n & ~(size_t)63;
        for (size_t i = 0; i < body; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        _mm_sfence(); /* streamed stores are weakly ordered: visible before "done" */
        memcpy(d + body, s + body, n - body);
        return;
    }
#endif
    memcpy(dst, src, n);
}

struct host_copy {
    ckpt_copy base;
    pthread_t thr;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* a batch started, or completed */
    ckpt_copy_op *ops;   /* the batch in flight (or the last one) */
    size_t n, cap;
    uint64_t gen;        /* the last batch started (0: none yet) */
    bool running;        /* batch gen has not completed */
    size_t done;         /* its copies done so far (in order) */
    bool stop;
    int rc;              /* how batch gen ended, once it did */
    char why[256];       /* its failure */
};

static void *host_worker(void *arg)
{
    struct host_copy *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->running && !h->stop)
            pthread_cond_wait(&h->cv, &h->mu);
        if (!h->running)
            break;
        size_t n = h->n;
        pthread_mutex_unlock(&h->mu);
        int rc = 0;
        char why[sizeof(h->why)] = "";
        for (size_t i = 0; i < n && !rc; i++) {
            if ((rc = rk__fault_fail("copy")) != 0) {
                snprintf(why, sizeof(why), "copy %zu of %zu (%zu bytes) failed: %s", i + 1, n, h->ops[i].n,
                         rk_strerror(rc));
                break;
            }
            copy_bytes(h->ops[i].dst, h->ops[i].src, h->ops[i].n);
            pthread_mutex_lock(&h->mu); /* ckpt_copy_wait_op: a reader of copy i may go */
            h->done = i + 1;
            pthread_cond_broadcast(&h->cv);
            pthread_mutex_unlock(&h->mu);
        }
        pthread_mutex_lock(&h->mu);
        h->rc = rc;
        memcpy(h->why, why, sizeof(why));
        h->running = false;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static int host_start(ckpt_copy *c, const ckpt_copy_op *ops, size_t n, uint64_t *gen)
{
    struct host_copy *h = (struct host_copy *)c;
    pthread_mutex_lock(&h->mu);
    if (h->running) {
        pthread_mutex_unlock(&h->mu);
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_BUSY, "host copy: a batch is still running");
    }
    if (n > h->cap) {
        ckpt_copy_op *p = realloc(h->ops, n * sizeof(*p));
        if (!p) {
            pthread_mutex_unlock(&h->mu);
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "host copy: a batch of %zu copies", n);
        }
        h->ops = p;
        h->cap = n;
    }
    if (n)
        memcpy(h->ops, ops, n * sizeof(*ops));
    h->n = n;
    h->done = 0;
    h->gen++;
    h->rc = 0;
    h->why[0] = '\0';
    h->running = true;
    if (gen)
        *gen = h->gen;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

/* Until copy k of batch gen is done (k SIZE_MAX: the whole batch). */
static int host_wait_op(ckpt_copy *c, uint64_t gen, size_t k, int64_t deadline_ns)
{
    struct host_copy *h = (struct host_copy *)c;
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    pthread_mutex_lock(&h->mu);
    while (h->gen == gen && h->running && !(k < h->done))
        if (pthread_cond_timedwait(&h->cv, &h->mu, &ts) == ETIMEDOUT)
            break;
    int rc = h->gen != gen ? RK_E_ABORTED : k < h->done ? 0 : h->running ? RK_E_TIMEOUT : h->rc;
    char why[sizeof(h->why)];
    memcpy(why, h->why, sizeof(why));
    pthread_mutex_unlock(&h->mu);
    if (rc == RK_E_ABORTED)
        rk__set_last_error("host copy: batch %llu was replaced by a later one", (unsigned long long)gen);
    else if (rc == RK_E_TIMEOUT)
        rk__set_last_error("host copy: batch %llu still runs at the deadline", (unsigned long long)gen);
    else if (rc)
        rk__set_last_error("host copy: %s", why);
    return rc;
}

static int host_wait(ckpt_copy *c, uint64_t gen, int64_t deadline_ns)
{
    return host_wait_op(c, gen, SIZE_MAX, deadline_ns);
}

static bool host_done(ckpt_copy *c, uint64_t gen)
{
    struct host_copy *h = (struct host_copy *)c;
    pthread_mutex_lock(&h->mu);
    bool done = h->gen != gen || !h->running;
    pthread_mutex_unlock(&h->mu);
    return done;
}

static int host_destroy(ckpt_copy *c, int64_t deadline_ns)
{
    struct host_copy *h = (struct host_copy *)c;
    pthread_mutex_lock(&h->mu);
    uint64_t gen = h->gen;
    pthread_mutex_unlock(&h->mu);
    if (host_wait(c, gen, deadline_ns) == RK_E_TIMEOUT) {
        /* A copy held by a fault (RK_FAULT=copy@N=hang): the worker keeps the engine. */
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_mutex_unlock(&h->mu);
        pthread_detach(h->thr);
        rk__retain_forever(h);
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT, "host copy: a batch still runs; its thread is left");
    }
    pthread_mutex_lock(&h->mu);
    h->stop = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thr, NULL);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h->ops);
    free(h);
    return 0;
}

static const struct ckpt_copy_vt host_vt = {
    .start = host_start, .wait = host_wait,   .wait_op = host_wait_op, .done = host_done,
    .destroy = host_destroy, .pin = NULL,   .unpin = NULL};

int ckpt_copy_host_create(ckpt_copy **out)
{
    *out = NULL;
    struct host_copy *h = calloc(1, sizeof(*h));
    if (!h)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "host copy engine");
    h->base.vt = &host_vt;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&h->thr, NULL, host_worker, h);
    if (rc) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -rc, "host copy engine: cannot start its thread");
    }
    *out = &h->base;
    return 0;
}

#ifndef RK_HAVE_CUDA
int ckpt_copy_cuda_create(ckpt_copy **out, void *caller_stream)
{
    (void)caller_stream;
    *out = NULL;
    return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NOTAVAIL, "device tensors: this build has no CUDA");
}

int ckpt_device_check(const void *p, const char *name)
{
    (void)p;
    return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NOTAVAIL,
                    "rk_register '%s': RK_DEVICE: this build has no CUDA (GPU tensors need a build with the CUDA toolkit)",
                    name);
}
#endif
