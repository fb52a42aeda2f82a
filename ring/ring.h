/*
 * ring/ring.h - the allreduce ring: the one header of ring/ that other parts include.
 *
 * A chunked, pipelined ring allreduce (reduce-scatter, then allgather) over Open MPI
 * non-blocking point-to-point between the current members, on the one communicator the
 * ring was created with. Every wait polls a cancellation source (ring_cancel), so a call
 * returns a distinct error within a bound when a member dies; the ring is then rebuilt
 * over the survivors (and spares) with ring_rebuild(), which makes no collective MPI
 * call. See ring/ring.c for the design (invariants, state diagram) and docs/RING.md for
 * the protocol.
 *
 * Threading: at least MPI_THREAD_SERIALIZED; a ring is used by one thread at a time, the
 * training thread (a join's thread makes other MPI calls beside it: recover/join.c). The changed() callback of a ring_cancel runs on that thread.
 */
#ifndef RK_RING_H
#define RK_RING_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

/* The cancellation source polled by every wait of the ring.
 *   deadline_ns: absolute CLOCK_MONOTONIC time (rk__mono_ns()); 0: the ring's default
 *                timeout (ring_create's timeout_ms) counted from the call's start;
 *                INT64_MAX: none. Passing it returns RK_E_TIMEOUT.
 *   changed:     NULL, or returns true once the membership changed (the detector's view);
 *                then the call returns RK_E_PEER_LOST. Must be cheap: it is polled in
 *                the wait loops (every few microseconds while a call waits). */
typedef struct ring_cancel {
    int64_t deadline_ns;
    bool (*changed)(void *arg);
    void *arg;
} ring_cancel;

typedef struct ring ring;

/* Creates a ring over `members` (ranks of `comm`, any order; the ring orders them by
   rank; NULL/0: every rank of comm). Collective over ALL of comm (it duplicates comm,
   with MPI_ERRORS_RETURN, once: every later epoch of the ring lives on that duplicate;
   the duplicate is waited for at most timeout_ms, then RK_E_TIMEOUT, common.h
   rk__mpi_wait_coll);
   a process of comm that is not a member gets a ring in the
   spare state (ring_is_member() false) that can join later through ring_rebuild().
   timeout_ms: the default bound of every wait (< 0: none). *r is owned by the caller,
   released with ring_destroy(). */
int ring_create(ring **r, MPI_Comm comm, const int *members, int nmembers, int timeout_ms);
/* ring_create over `comm` itself, which the ring takes (and frees in ring_destroy) instead
   of a duplicate: no collective call at all. For a communicator that holds a process
   which may die (a newcomer's: recover/join.c), duplicated where that can be given up on.
   comm is the ring's on success only. */
int ring_create_on(ring **r, MPI_Comm comm, const int *members, int nmembers, int timeout_ms);
/* Releases the ring and its communicator; *r = NULL. Receive buffers that MPI might
   still write after an aborted call are released only once MPI says it is done with them. */
void ring_destroy(ring **r);

/* In place: buf (count elements of dtype on every member) becomes the reduction over
   the members. dtypes: f32, f64, f16, bf16 (16-bit types accumulate in f32 per hop),
   i32, i64, u8 (wrap-around arithmetic); ops: sum, avg, max, min. For a given
   membership the order of the reduction is fixed (docs/RING.md), so results are bitwise
   reproducible. cancel may be NULL (the default deadline only).
   Errors (the ring stays usable after each):
     -EINVAL: r is NULL, or a NULL buffer with count > 0;
     RK_E_DTYPE, RK_E_OP: an unknown dtype or op here, or avg of an integer type;
     RK_E_FENCED: a rebuild excluded this process; RK_E_STATE: it is a spare, not a
       member (these two tell nobody: the members do not wait on such a process);
     -ENOMEM: no memory for the ring's slots (an earlier abort found none for fresh
       ones; every call tries again);
     RK_E_COLL_MISMATCH: the members passed different count, dtype or op; a member
       failed with one of -EINVAL, RK_E_DTYPE, RK_E_OP, -ENOMEM above; or a member
       skipped a call (a message of a later one arrived);
     RK_E_PEER_LOST: cancel->changed() fired, a member aborted for that reason, a member
       has begun a rebuild to a later epoch, or MPI reported a failed transfer;
     RK_E_TIMEOUT: the deadline passed here, or at a member that aborted for it.
   A failure at one member makes every member fail, except a loss at the very end of a
   call, when some members already had all they needed: those return 0 with the exact
   result (docs/RING.md). On an error buf may hold a mix of inputs and partial results:
   no receive writes into it after the call returns. */
int ring_allreduce(ring *r, void *buf, size_t count, rk_dtype dtype, rk_op op,
                   const ring_cancel *cancel);

/* One step of the ring: send_bytes of send go to the right neighbour while recv_bytes
   from the left neighbour arrive in recv (a member alone gets its own bytes). The same
   bounds, cancellation, chunking and abort tokens as ring_allreduce; every member must
   call it at the same point, and recv_bytes must be what the left sends (a member asks
   first with a shift of the size). Lengths are checked before any data moves: each
   member first tells its left what it expects, and the left sends only if that is its
   send_bytes, so a call returns once its bytes arrived and its right took (or refused)
   its own. Errors:
     -EINVAL: r is NULL, or a NULL buffer with bytes > 0 (its left and right then fail
       with RK_E_COLL_MISMATCH at once); RK_E_FENCED, RK_E_STATE, -ENOMEM: as
       ring_allreduce (-ENOMEM here: the left and right fail with RK_E_COLL_MISMATCH);
     RK_E_COLL_MISMATCH: recv_bytes here is not what the left sends, or send_bytes not
       what the right expects: both ends of that pair fail at once, each after finishing
       its other half (its recv holds the left's bytes when only its send was refused),
       and no other member is disturbed; also where a neighbour refused the call (above),
       and for a member alone whose two lengths differ;
     RK_E_PEER_LOST, RK_E_TIMEOUT: as ring_allreduce; these abort the call, and the
       token goes on to the right, to each member of the cycle still in the call.
   send is never read after the call returns, recv never written. */
int ring_shift(ring *r, const void *send, size_t send_bytes, void *recv, size_t recv_bytes,
               const ring_cancel *cancel);
/* ring_shift at distance dist: send goes to ring rank (rank + dist) mod size, recv comes
   from (rank - dist) mod size (dist 1 is ring_shift; a multiple of the size copies send to
   recv). The same contract; every member passes the same dist. An abort token follows
   the sends, so it reaches every member of this member's cycle (rank + j*dist); a length
   mismatch stays with its pair. A series
   of shifts at dist = 1 .. size-1 is an all-to-all of point-to-point messages. A member
   whose shift fails should still make the rest of the series: every call takes the next
   sequence number, and a member that leaves a series early makes the ones that receive
   from it wait for the deadline. */
int ring_shift_by(ring *r, int dist, const void *send, size_t send_bytes, void *recv, size_t recv_bytes,
                  const ring_cancel *cancel);

/* Rebuilds the ring over `members` (ranks of the communicator given to ring_create; the
   survivors of the current ring and/or spares) for membership epoch `epoch`. Collective
   over the listed members only, which must all pass the same list and epoch; the new
   ring never talks to an excluded rank. Members are renumbered densely in the order of
   their ranks in the original communicator. A handshake among the members (point-to-
   point) is bounded by cancel (RK_E_TIMEOUT / RK_E_PEER_LOST, nothing changed); after it
   the neighbours are re-mapped locally: no collective MPI call, so a member that dies
   during the rebuild never blocks the others (the next allreduce reports it). Returns
   RK_E_FENCED if this process is not in the list. */
int ring_rebuild(ring *r, const int *members, int nmembers, uint64_t epoch,
                 const ring_cancel *cancel);
/* ring_rebuild onto another communicator, `comm` (a merged one with newcomers in it,
   recover/join.c), which the ring takes: members are ranks of comm, and from the
   handshake on every message travels there; the communicator before is freed (MPI lets
   what is pending on it complete; the slots of aborted calls stay graves until MPI is
   done with them). On an error the ring lives on comm as a spare (ring_is_member false)
   until a rebuild there succeeds: over the members that remain is the way on (a newcomer
   that died after the merge is a lost member like any other). */
int ring_rebuild_on(ring *r, MPI_Comm comm, const int *members, int nmembers, uint64_t epoch,
                    const ring_cancel *cancel);

bool ring_is_member(const ring *r);
int ring_rank(const ring *r);   /* rank in the ring (dense), -1 for a spare */
int ring_size(const ring *r);   /* members in the ring */
uint64_t ring_epoch(const ring *r);

/* Test hook: called on the calling thread at each step of every allreduce, before the
   receive of (phase, step, chunk) is processed; phase 0 = reduce-scatter, 1 = allgather,
   step 0..size-2, chunk 0.. . Tests make a chosen member raise(SIGKILL) here. */
typedef void (*ring_hook_fn)(void *arg, int phase, int step, int chunk);
void ring_set_test_hook(ring *r, ring_hook_fn fn, void *arg);

/* Tuning (benchmarks): bytes per chunk (a multiple of 8, >= 128) and chunks in flight per
   direction (1..64). Defaults: 256 KiB, 4. Must be equal on every member. */
int ring_set_chunking(ring *r, size_t chunk_bytes, int window);

/* ---- reduction kernels (ring_reduce.c), exposed for tests ----------------------------- */

/* out[i] = acc[i] op in[i] for n elements (out may alias acc or in): acc is the partial
   result of the members before, in this member's contribution. For the last hop of
   RK_AVG pass divisor = members (> 0): the sum is divided before rounding; divisor 0
   makes RK_AVG add. 16-bit floats are converted to f32, combined and rounded to nearest
   even once. Integers wrap around; RK_AVG of integers is refused.
   Returns 0, RK_E_DTYPE or RK_E_OP. */
int ring_reduce(void *out, const void *acc, const void *in, size_t n, rk_dtype dtype, rk_op op,
                int divisor);
float ring_f16_to_f32(uint16_t h);
uint16_t ring_f32_to_f16(float f);   /* round to nearest even; NaN stays NaN */
float ring_bf16_to_f32(uint16_t h);
uint16_t ring_f32_to_bf16(float f);  /* round to nearest even; NaN stays NaN */

/* The fixed split of count elements into `size` segments: segment s starts at
   *off and has *len elements (docs/RING.md). */
void ring_segment(size_t count, int size, int s, size_t *off, size_t *len);

/* ---- what the NCCL ring needs that is not device code (built in every build, so the
   CPU-only tests cover it) ------------------------------------------------------------- */

/* Ring rank 0 sends `bytes` of blob (an NCCL unique id) to every other member, point-to-
   point on the ring's communicator as a control message of its epoch; the others receive
   it into blob. Every member of the ring calls it at the same point, right after a call
   that all completed (a ring call of the same epoch drops such a message as stale). Bounded
   by c: RK_E_TIMEOUT, RK_E_PEER_LOST (changed() or a failed transfer); blob then holds
   nothing useful, and a transfer still pending keeps a copy of its own (never blob).
   -EINVAL: no ring, NULL blob, bytes 0 or over INT_MAX; RK_E_FENCED, RK_E_STATE as
   ring_allreduce. */
int ring_share_blob(ring *r, void *blob, size_t bytes, const ring_cancel *c);

/* How an NCCL communicator over `old` (parent ranks in NCCL rank order, ascending as a
   ring orders them) becomes one over `now` (a ring's members after ring_rebuild):
     RING_NCCL_KEEP:   the same members;
     RING_NCCL_SHRINK: members were only dropped: excl (room for nold) gets the NCCL ranks
                       of old not in now, ascending, *nexcl their number: the arguments of
                       ncclCommShrink, whose ranks then are the ring ranks of now;
     RING_NCCL_FRESH:  a member of now is not in old (a spare): a new communicator.
   Pure: tests/test_ring.c checks it. */
enum ring_nccl_plan { RING_NCCL_KEEP, RING_NCCL_SHRINK, RING_NCCL_FRESH };
enum ring_nccl_plan ring_nccl_plan(const int *old, int nold, const int *now, int nnow, int *excl, int *nexcl);

/* NCCL refuses two ranks of one communicator on the same device of the same host, and it
   takes a host by NCCL_HOSTID. When more processes of the job run on this host than it has
   devices (local_size > ndevices: tests that put several ranks on one GPU), each process
   must name a host of its own: out gets "<host>-rk<rank>" and the result is true. False
   (out untouched) when NCCL_HOSTID is already set (existing non-empty: the user's choice
   stands), local_size is unknown (< 1) or the devices suffice (then NCCL's own host id
   keeps the fast paths within the host). Pure: tests/test_ring.c checks it. */
bool ring_nccl_hostid(char *out, size_t cap, const char *existing, const char *host, int rank, int local_size,
                      int ndevices);

/* ---- NCCL ring for device buffers (ring_nccl.c; built only with CUDA + NCCL) ----------
 * The same contract for device memory, on an NCCL communicator created non-blocking
 * (config.blocking = 0) over the members of an MPI ring: every wait polls
 * ncclCommGetAsyncError and the cancellation source against the deadline; on a failure
 * what the communicator has in flight is stopped (ncclCommRevoke where ring_nccl_revokes,
 * else ncclCommAbort) and the call returns RK_E_PEER_LOST or RK_E_TIMEOUT. The reduction order is NCCL's (deterministic for a fixed topology and
 * NCCL version, not the MPI ring's order). */
#if defined(RK_HAVE_NCCL)
typedef struct ring_nccl ring_nccl;
/* The process's libnccl.so.2, found at run time (once: the one already loaded, else the
   loader's), and every function the ring needs in it: 0 and *version (NCCL_VERSION_CODE's
   form; may be NULL), or RK_E_NCCL and *why (static text: not loadable, or the function it
   lacks). ncclCommShrink and ncclCommRevoke are optional (ring_nccl_can_shrink,
   ring_nccl_revokes). Thread-safe. */
int ring_nccl_load(int *version, const char **why);
/* Collective over the members of r (the unique id travels point-to-point between them
   on r's communicator: ring_share_blob), bounded by cancel (NULL: timeout_ms). device: the
   CUDA device of this process; timeout_ms: the default bound of the handle's later waits. */
int ring_nccl_create(ring_nccl **g, ring *r, int device, int timeout_ms, const ring_cancel *cancel);
/* Whether the communicator can take a call (made, not aborted, no asynchronous error). */
bool ring_nccl_ok(const ring_nccl *g);
/* Finalizes (after a failure: aborts) the NCCL communicator, joins the threads freeing
   retired ones (bounded by timeout_ms); *g = NULL. */
void ring_nccl_destroy(ring_nccl **g);
/* The threads freeing retired communicators that are not joined yet (each is named
   "rk-nccl-reap" while it runs); every rebuild first joins those that ended. */
int ring_nccl_reapers(const ring_nccl *g);
/* In place on device memory, after the work queued on `after` (a cudaStream_t; NULL: the
   legacy default stream); returns when the result is in buf (the ring's stream polled to
   completion, never a blocking synchronize). RK_E_PEER_LOST / RK_E_TIMEOUT revoke or abort
   the communicator: the next call needs ring_nccl_rebuild (RK_E_STATE until then). */
int ring_nccl_allreduce(ring_nccl *g, void *dev_buf, size_t count, rk_dtype dtype, rk_op op, void *after,
                        const ring_cancel *cancel);
/* Whether a failed call revokes the communicator (NCCL >= 2.28 and RK_NCCL_REVOKE not
   0/off) and returns once its kernels ended, rather than aborting it (~0.5 s). */
bool ring_nccl_revokes(void);
/* Whether this member can take its communicator over to r's members (after ring_rebuild)
   without a new one: members were only dropped (ring_nccl_plan) from an intact communicator
   or a revoked one NCCL now calls quiescent, or none from an intact one, and this process's
   NCCL has ncclCommShrink (>= 2.27, found at run time). Local. */
bool ring_nccl_can_shrink(const ring_nccl *g, const ring *r);
/* After ring_rebuild(r, ...): a communicator over r's members. shrink (every member must
   pass the same: the callers agree on it, each from ring_nccl_can_shrink): the same members
   keep theirs, dropped ones are excluded by ncclCommShrink (NCCL_SHRINK_ABORT; on a revoked
   one NCCL_SHRINK_DEFAULT); a failed shrink leaves the handle failed (a fresh one next).
   !shrink: the old communicator is freed and a fresh one made, its unique id sent by ring rank 0 (ring_share_blob): the
   way spares join. Bounded by cancel. */
int ring_nccl_rebuild(ring_nccl *g, ring *r, bool shrink, const ring_cancel *cancel);
#endif

#endif
