/*
 * ckpt/copy.h - the copy engines of the snapshot pipeline: one interface, two engines.
 * Private to ckpt/ (ckpt.c starts and waits for the copies; tests use it directly).
 *
 * A snapshot copies every registered tensor into staging, and a restore copies staging
 * back, through an engine: the host engine for host tensors (a worker thread doing the
 * copies, those of 1 MiB or more streamed past the caches: copy_host.c), the CUDA engine
 * for device tensors (cudaMemcpyAsync on a stream of the library's own, ordered after the
 * caller's work by an event recorded on the caller's stream: rk_options.cuda_stream).
 * Both are asynchronous in the same way: a batch is started, runs without the caller, and
 * completes once; its completion is queried or waited for with a deadline, never without
 * one (the CUDA engine polls cudaEventQuery, never a blocking synchronize). So the one
 * pipeline in ckpt.c is the same for both, and CI runs it through the host engine on
 * machines without a GPU.
 *
 * One batch at a time per engine (one snapshot's copy in flight: snapshot.h S5). A batch stops at
 * its first failure: what it copied before stays copied, the rest is not (a copy failing
 * halfway); the fault point "copy" (RK_FAULT=copy@N=eio|hang, common/common.h) fails or
 * holds the host engine's Nth copy, so tests reach that case without a device.
 */
#ifndef RK_CKPT_COPY_H
#define RK_CKPT_COPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckpt_copy ckpt_copy;

/* One copy of a batch: n bytes from src to dst (host or device memory: the engine's). */
typedef struct ckpt_copy_op {
    void *dst;
    const void *src;
    size_t n;
} ckpt_copy_op;

/* The host engine: starts its worker thread. */
int ckpt_copy_host_create(ckpt_copy **out);
/* The CUDA engine: its own non-blocking stream, ordered after `caller_stream` (a
   cudaStream_t; NULL: the legacy stream). RK_E_CUDA ("no CUDA device: ...") where the
   runtime has no device, RK_E_NOTAVAIL in a build without CUDA. */
int ckpt_copy_cuda_create(ckpt_copy **out, void *caller_stream);
/* Waits for the batch in flight until deadline_ns, then releases the engine; *c = NULL.
   RK_E_TIMEOUT if the batch was still running: the engine is then left to it, never
   freed (the memory it copies must stay mapped too: the caller's concern). */
int ckpt_copy_destroy(ckpt_copy **c, int64_t deadline_ns);

/* Starts a batch of ops[0..n) (copied: the array may go at once; the memory it names may
   not, until the batch completed). *gen (may be NULL): the batch's number, for
   ckpt_copy_wait. RK_E_BUSY while the previous batch runs. */
int ckpt_copy_start(ckpt_copy *c, const ckpt_copy_op *ops, size_t n, uint64_t *gen);
/* Until batch `gen` completed or deadline_ns (CLOCK_MONOTONIC): 0 once every copy of it
   is done, the failure that stopped it (rk_last_error() of the calling thread says
   which copy and why), RK_E_TIMEOUT if it still runs at the deadline (it goes on),
   RK_E_ABORTED if a later batch replaced it. Any thread may wait, several at once. */
int ckpt_copy_wait(ckpt_copy *c, uint64_t gen, int64_t deadline_ns);
/* Until copy k (0-based) of batch `gen` is done, or deadline_ns: 0 once it is (whatever
   the copies after it do), else as ckpt_copy_wait (a batch stopped by a failure at or
   before copy k returns that failure). An engine that knows only whole batches (CUDA)
   waits for the whole batch. k SIZE_MAX: the whole batch, as ckpt_copy_wait. */
int ckpt_copy_wait_op(ckpt_copy *c, uint64_t gen, size_t k, int64_t deadline_ns);
/* Whether batch `gen` completed (never waits). */
bool ckpt_copy_done(ckpt_copy *c, uint64_t gen);
/* Staging [p, p + n) will be copied to and from often: the CUDA engine pins it
   (cudaHostRegister), keeping at most three regions pinned (the generations of the held
   snapshot, snapshot.h S6: g, old, and park, the one a disk write longer than a step keeps
   aside; a fourth unpins the one pinned first); the host engine does nothing. A failure
   is logged (the copies still work, unpinned and slower). */
void ckpt_copy_pin(ckpt_copy *c, void *p, size_t n);
/* The region at p is about to be unmapped or moved: unpinned if it is the pinned one. */
void ckpt_copy_unpin(ckpt_copy *c, void *p);

#endif
