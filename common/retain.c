/*
 * common/retain.c - memory that another party may still use after its owner is done with
 * it can never be freed: receive buffers MPI may still write after their ring is gone
 * (ring/), recovery's message copies (MPI_Alloc_mem) a request to a dead peer may still
 * read (recover/), a checkpoint engine whose writer thread is stuck in the kernel (ckpt/). Such
 * memory is kept for the life of the process in this one list, so it stays reachable:
 * retained on purpose, bounded by the number of such events, never reported as leaked.
 */
#include <pthread.h>
#include <stdlib.h>

#include "common.h"

static struct {
    pthread_mutex_t mu;
    void **mem;
    size_t n, cap;
} retained = {.mu = PTHREAD_MUTEX_INITIALIZER};

void rk__retain_forever(void *mem)
{
    pthread_mutex_lock(&retained.mu);
    if (retained.n == retained.cap) {
        size_t cap = retained.cap ? 2 * retained.cap : 8;
        void **m = realloc(retained.mem, cap * sizeof(*m));
        if (m) {
            retained.mem = m;
            retained.cap = cap;
        }
    }
    if (retained.n < retained.cap)
        retained.mem[retained.n++] = mem;
    pthread_mutex_unlock(&retained.mu);
}
