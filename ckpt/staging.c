/*
 * ckpt/staging.c - the staging regions of the snapshot generations (snapshot.h): mapped
 * (common/mem.c: huge pages, populated), the next one mapped ahead off the training thread
 * (S9), pinned by the writer while it reads one (writer.c W5), retired rather than
 * unmapped while pinned, unmapped once not. While a restore reads into g (ckpt_load), g's
 * new region is mapped unpopulated (its O_DIRECT reads fault it in while the disk works)
 * and the next turn's is mapped ahead only after the copy out (ckpt__prep_defer, _release).
 * The generations themselves, and which region each holds, are snapshot.c's.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "ckpt_internal.h"

bool ckpt__grow(void **p, size_t n, size_t elem)
{
    void *q = realloc(*p, n * elem);
    if (q)
        *p = q;
    return q != NULL;
}

/* Whether the writer reads region p: the job's pin (writer.c W5). It is never written
   while its job may commit, nor unmapped. */
bool ckpt__pinned(ckpt_engine *e, const char *p)
{
    return p && atomic_load(&e->job.region) == p;
}

/* A region of the engine's (staging, retired, prev, partner) goes: unpinned from the CUDA
   engine first (copy.h: that pin is the engine's, not the writer's). */
void ckpt__unmap_region(ckpt_engine *e, void *p, size_t cap)
{
    ckpt_copy_unpin(e->s.dev_copy, p);
    rk__unmap(p, cap);
}

/* The region retired while the writer read it, once it reads it no more. */
void ckpt__unmap_retired(ckpt_engine *e)
{
    if (ckpt__pinned(e, e->s.retired))
        return;
    if (e->s.retired)
        ckpt__unmap_region(e, e->s.retired, e->s.retired_cap);
    e->s.retired = NULL;
    e->s.retired_cap = 0;
}

/* One region being mapped ahead (S9): the thread's and the engine's until one of them
   lets go. state: PREP_RUNNING, then PREP_DONE (the thread ended: the engine joins it and
   takes p) or PREP_LEFT (the engine stopped waiting: the thread unmaps what it mapped and
   frees this). */
enum { PREP_RUNNING, PREP_DONE, PREP_LEFT };
struct ckpt_prep {
    atomic_int state;
    size_t cap;
    void *p;
};

static void *prep_main(void *arg)
{
    struct ckpt_prep *j = arg;
    j->p = rk__map(j->cap);
    int running = PREP_RUNNING;
    if (!atomic_compare_exchange_strong(&j->state, &running, PREP_DONE)) { /* left */
        rk__unmap(j->p, j->cap);
        free(j);
    }
    return NULL;
}

/* The region mapped ahead, once its thread ended by deadline_ns (NULL: none started, it
   could not map one, or it still runs: then the thread is left to unmap it when it ends). */
static void *prep_join(ckpt_engine *e, int64_t deadline_ns, size_t *cap)
{
    struct ckpt_prep *j = e->s.prep.job;
    if (!j)
        return NULL;
    e->s.prep.job = NULL;
    int64_t end = rk__real_ns() + (deadline_ns - rk__mono_ns()); /* timedjoin's clock */
    struct timespec until = {.tv_sec = end / 1000000000, .tv_nsec = end % 1000000000};
    if (pthread_timedjoin_np(e->s.prep.thr, NULL, &until) != 0) {
        int running = PREP_RUNNING;
        if (atomic_compare_exchange_strong(&j->state, &running, PREP_LEFT)) {
            RK_LOG_WARN(RK_SUB_CKPT, "staging of %zu bytes mapped ahead is not ready in time: mapped again", j->cap);
            pthread_detach(e->s.prep.thr);
            return NULL;
        }
        pthread_join(e->s.prep.thr, NULL); /* it ended just now: done, joined at once */
    }
    void *p = j->p;
    *cap = j->cap;
    free(j);
    e->s.prep.p = p;
    return p;
}

/* Starts mapping a region of `cap` bytes for the next turn, unless one is being mapped
   (or, while a restore reads, remembers it for ckpt__prep_release). */
void ckpt__prepare(ckpt_engine *e, size_t cap)
{
    if (e->s.prep.defer) {
        e->s.prep.wanted = cap;
        return;
    }
    e->s.prep.wanted = 0;
    if (e->s.prep.job)
        return;
    struct ckpt_prep *j = calloc(1, sizeof(*j));
    if (!j)
        return; /* the next turn maps its own */
    atomic_init(&j->state, PREP_RUNNING);
    j->cap = cap;
    if (pthread_create(&e->s.prep.thr, NULL, prep_main, j) != 0) {
        free(j);
        return;
    }
    e->s.prep.job = j;
}

/* A region of at least `need` bytes: the one mapped ahead if it fits, else a new one. */
void *ckpt__region(ckpt_engine *e, size_t need, size_t *cap)
{
    size_t pcap = 0;
    void *p = prep_join(e, rk__deadline_ns(e->timeout_ms / 4), &pcap);
    if (p && pcap >= need) {
        *cap = pcap;
        return p;
    }
    rk__unmap(p, pcap);
    *cap = need;
    return e->s.prep.defer ? rk__map_lazy(need) : rk__map(need);
}

void ckpt__prep_defer(ckpt_engine *e, bool on)
{
    e->s.prep.defer = on;
}

void ckpt__prep_release(ckpt_engine *e)
{
    if (e->s.prep.wanted && !e->s.prep.defer)
        ckpt__prepare(e, e->s.prep.wanted);
}

void ckpt__prep_end(ckpt_engine *e, int64_t deadline_ns)
{
    size_t cap = 0;
    e->s.prep.wanted = 0;
    rk__unmap(prep_join(e, deadline_ns, &cap), cap);
}
