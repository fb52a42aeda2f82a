/*
 * ckpt/copy_internal.h - what each copy engine implements behind ckpt/copy.h (the host
 * engine in copy_host.c, the CUDA engine in copy_cuda.c). Private to those two files.
 */
#ifndef RK_CKPT_COPY_INTERNAL_H
#define RK_CKPT_COPY_INTERNAL_H

#include "copy.h"

struct ckpt_copy_vt {
    int (*start)(ckpt_copy *c, const ckpt_copy_op *ops, size_t n, uint64_t *gen);
    int (*wait)(ckpt_copy *c, uint64_t gen, int64_t deadline_ns); /* copy.h's, gen != 0 */
    /* copy.h's ckpt_copy_wait_op, gen != 0; NULL: the engine knows only whole batches */
    int (*wait_op)(ckpt_copy *c, uint64_t gen, size_t k, int64_t deadline_ns);
    bool (*done)(ckpt_copy *c, uint64_t gen);                     /* never waits */
    int (*destroy)(ckpt_copy *c, int64_t deadline_ns);
    void (*pin)(ckpt_copy *c, void *p, size_t n);                 /* NULL: nothing to pin */
    void (*unpin)(ckpt_copy *c, void *p);
};

/* Every engine begins with this. */
struct ckpt_copy {
    const struct ckpt_copy_vt *vt;
};

#endif
