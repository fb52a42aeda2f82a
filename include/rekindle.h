/*
 * rekindle.h - the one public header of Rekindle.
 *
 * Rekindle lets data-parallel training survive the loss of workers: heartbeats find a
 * lost worker, asynchronous HDF5 checkpoints keep the state, a recovery coordinator
 * shrinks (or rebuilds) the allreduce ring and rolls every survivor back to the latest
 * consistent checkpoint.
 *
 * Conventions (every function below):
 *   - returns int: 0 (RK_OK) on success, 1 (RK_RECOVERED) where stated, a negative
 *     value on error: -errno for an operating-system error, or an RK_E... code (< -1000).
 *   - never aborts or exits the process; rk_strerror() names every code, and
 *     rk_last_error() gives the calling thread's detailed message for its last failure.
 *   - a caller's buffers stay the caller's: the library never frees them and never
 *     writes them except in rk_resume() and when a call returns RK_RECOVERED.
 *
 * RK_E_NOTAVAIL is returned by a feature this build does not have (never a pretend
 * success).
 *
 * Recovery: when the failure detector declares a member dead, the survivors' next
 * rk_allreduce or rk_step_done agrees on the new membership (a majority of the previous
 * one is required), rebuilds the ring, restores the registered tensors to the latest
 * consistent step (from the survivors' memory, else from disk) and returns RK_RECOVERED;
 * continue from rk_next_step(). A worker declared dead gets RK_E_FENCED from every call.
 * See docs/PROTOCOL.md.
 */
#ifndef REKINDLE_H
#define REKINDLE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define REKINDLE_VERSION_MAJOR 0
#define REKINDLE_VERSION_MINOR 1
#define REKINDLE_VERSION_PATCH 0
#define REKINDLE_VERSION_STRING "0.1.0"

/* The ABI rule. The shared library's soname is librekindle.so.<REKINDLE_ABI_VERSION>: a
   program linked against one ABI version never loads a library of another. Any change
   that breaks a program built against the previous header bumps it: a public struct's size
   or layout (rk_options: a field added, moved or resized outside its reserved space), a
   function's signature or meaning, an enum value, or a removal. rk_options ends with
   reserved space: a later field takes its room from there (its size and every earlier
   offset unchanged, zero meaning its default, as rk_options_init leaves it), which needs no
   bump. ABI 0 was the soname of rk_options without cuda_stream and snapshot_every, 16
   bytes shorter: a program built against it overran its stack in the library's
   rk_options_init. tests/test_cli.c checks the built soname against this number, and the
   size of rk_options for it. */
#define REKINDLE_ABI_VERSION 1

typedef struct rk_ctx rk_ctx;
typedef enum { RK_F32, RK_F64, RK_F16, RK_BF16, RK_I32, RK_I64, RK_U8 } rk_dtype;
typedef enum { RK_SUM, RK_AVG, RK_MAX, RK_MIN } rk_op;
#define RK_OK        0
#define RK_RECOVERED 1

/*
 * Every project error code, in one table: it defines the enum below and the messages
 * of rk_strerror(). Codes are stable: new ones are appended, none is renumbered.
 */
#define RK_ERROR_TABLE(X)                                                                    \
    X(RK_E_NOTAVAIL, -1001, "not available: this part of Rekindle is not built yet")          \
    X(RK_E_OPTION, -1002, "bad option value (the RK_* variable or field is named in rk_last_error())") \
    X(RK_E_STATE, -1003, "call not valid in the current state")                               \
    X(RK_E_MPI, -1004, "an MPI call failed")                                                  \
    X(RK_E_HDF5, -1005, "an HDF5 call failed")                                                \
    X(RK_E_CUDA, -1006, "a CUDA call failed")                                                 \
    X(RK_E_NCCL, -1007, "an NCCL call failed")                                                \
    X(RK_E_CORRUPT, -1008, "checkpoint data is corrupt (checksum mismatch or unreadable)")   \
    X(RK_E_INCOMPLETE, -1009, "checkpoint is incomplete")                                     \
    X(RK_E_NOCKPT, -1010, "no checkpoint found")                                              \
    X(RK_E_MISMATCH, -1011, "checkpoint does not match the registered tensors")              \
    X(RK_E_FORMAT, -1012, "not a Rekindle checkpoint, or an unsupported format version")     \
    X(RK_E_PEER_LOST, -1013, "a peer was lost during the operation")                          \
    X(RK_E_TIMEOUT, -1014, "a deadline passed before the operation finished")                 \
    X(RK_E_FENCED, -1015, "this worker was declared dead by the others and is fenced")        \
    X(RK_E_MIN_WORLD, -1016, "fewer workers survive than min_world")                          \
    X(RK_E_NO_MAJORITY, -1017, "survivors are not a majority of the previous membership (no split brain)") \
    X(RK_E_COLL_MISMATCH, -1018, "ranks called the collective with different arguments")     \
    X(RK_E_BUSY, -1019, "a checkpoint is still being written; this one was skipped")          \
    X(RK_E_DUPLICATE, -1020, "a tensor with this name is already registered")                 \
    X(RK_E_NAME, -1021, "tensor name cannot be stored in the checkpoint")                     \
    X(RK_E_DTYPE, -1022, "unknown dtype")                                                     \
    X(RK_E_OP, -1023, "unknown reduction operation")                                          \
    X(RK_E_ABORTED, -1024, "the operation was aborted")                                       \
    X(RK_E_AUTH, -1025, "message failed authentication")                                      \
    X(RK_E_NOGPU, -1026, "no usable GPU")                                                     \
    X(RK_E_INTERNAL, -1027, "internal error (a bug in Rekindle: please report it)")                \
    X(RK_E_SPARE_UNUSED, -1028, "this spare worker was not needed: the job finished without it")

enum rk_error {
#define RK_ERROR_ENUM_(name, code, msg) name = (code),
    RK_ERROR_TABLE(RK_ERROR_ENUM_)
#undef RK_ERROR_ENUM_
};

typedef struct rk_options {
    const char *ckpt_dir; /* RK_CKPT_DIR     ; NULL: no checkpoints                */
                          /* (and no snapshots held in memory: without it a lost
                             worker ends the job, RK_E_NOCKPT "set RK_CKPT_DIR") */
    int ckpt_every;       /* RK_CKPT_EVERY   ; steps between checkpoints, 0: never */
    int keep;             /* RK_KEEP         ; committed checkpoints kept (>= 1)   */
    int heartbeat_ms;     /* RK_HEARTBEAT_MS ; detector period                     */
    int min_world;        /* RK_MIN_WORLD    ; give up (error) below this size     */
    /* --- fields added by Rekindle after the contract's (defaults in parentheses) --- */
    int timeout_ms;       /* RK_TIMEOUT_MS   ; bound on any wait for peers (30000)      */
    const char *event_log; /* RK_EVENT_LOG   ; JSON-lines event log prefix, NULL: off   */
    const char *det_iface; /* RK_DET_IFACE   ; interface, address or subnet (a.b.c.d/n)
                              the detector binds and advertises; NULL: the host's
                              outward address                                           */
    const char *io;       /* RK_IO           ; checkpoint I/O: "auto", "uring", "buffered" */
    const char *rollback; /* RK_ROLLBACK     ; after a loss: "auto" (from the survivors'
                             memory when they hold the step, else disk) or "disk" (always
                             the newest committed checkpoint that verifies)             */
    /* The first RK_* variable rk_options_init() could not parse, as "NAME='value': why";
       empty when all parsed. rk_init() refuses options with an error here. */
    char env_error[192];
    void *cuda_stream;    /* the cudaStream_t the program's GPU work runs on (NULL: the
                             legacy default stream); a snapshot of RK_DEVICE tensors is
                             copied after the work queued on it. No environment variable */
    int snapshot_every;   /* RK_SNAPSHOT_EVERY ; steps between snapshots held in memory
                             (1: every step), from which a recovery resumes; 0: only the
                             checkpoints' own, and one copy of the registered bytes held
                             instead of two (a loss during a checkpoint's copy rolls back
                             from disk). A checkpoint is a snapshot also written to disk
                             (docs/DESIGN.md, "Snapshots at every step")                  */
    const char *restore;  /* RK_RESTORE      ; rk_resume's way: "staged" (read into
                             memory of the library's, the buffers written once every rank
                             verified) or "inplace" (read straight into the buffers: no
                             second copy; a failure leaves them part-written). Added in
                             ABI 1 from the reserved room; NULL: "staged"               */
    void *reserved_[7];   /* room for later fields without a new ABI (above); zero      */
} rk_options;

/* Defaults, then RK_* environment variables. Never fails: a variable it cannot parse is
   recorded in o->env_error and reported by rk_init() as RK_E_OPTION. */
void rk_options_init(rk_options *o);

/* Collective over the job; calls MPI_Init_thread itself, asking for MPI_THREAD_MULTIPLE,
   if MPI is not initialized (a program that initializes MPI itself needs
   MPI_THREAD_SERIALIZED at least, and calls every rk_* function from one thread; when
   rk_init initializes MPI,
   it sets OMPI_MCA_async_mpi_finalize=1 unless already set, so that rk_finalize never
   waits in Open MPI's final barrier for a lost peer, and OMPI_MCA_ess_singleton_isolated=1
   unless already set, so that a process started without mpirun forks no daemon: after
   such a fork every page the program had written is copy-on-write and faults on its
   next write); works as a single process started without mpirun. Validates every option and names the bad one (RK_E_OPTION). Once per
   process: after rk_finalize has finalized MPI, RK_E_STATE (MPI cannot start again).
   If SIGPIPE has its default action, installs an empty handler for it: a write to the
   socket of a peer that died then fails with EPIPE instead of killing this survivor
   (Open MPI's TCP transport cannot ask for MSG_NOSIGNAL). exec resets it in the programs
   the worker starts; a program's own handler or SIG_IGN is left alone; rk_finalize puts
   the default back once MPI has ended. Its collectives with the other workers are
   bounded: it waits for every worker of the job to reach rk_init at most 10 x
   RK_TIMEOUT_MS in all (5 min by default), then RK_E_TIMEOUT; under `rekindle run` a
   worker whose end its wrapper recorded makes it return RK_E_PEER_LOST at once, naming it.
   After either, a collective is still pending inside MPI: do not call MPI_Finalize (exit;
   rk_init skips it where it initialized MPI). On success *ctx is a new context, owned by the
   caller and released with rk_finalize(). */
int rk_init(rk_ctx **ctx, const rk_options *o);

/* Flags of rk_register (docs/SHARDING.md). 0: a host tensor with the same value on every
   rank (data parallel), written once into the checkpoint. */
#define RK_DEVICE   1u /* ptr is CUDA device memory (docs/GPU.md), replicated (not with
                          RK_SHARDED or RK_PER_RANK: RK_E_NOTAVAIL). Checked with
                          cudaPointerGetAttributes: RK_E_CUDA naming the tensor for host
                          memory, or where the CUDA runtime has no device; RK_E_NOTAVAIL in
                          a build without CUDA. A snapshot copies it to pinned host staging
                          on a stream of the library's own, after the work queued on
                          rk_options.cuda_stream, and training goes on meanwhile: the copy
                          is waited for before the next rk_allreduce or rk_step_done
                          returns, so it must not be written before one of those (an
                          update applied after the gradients' rk_allreduce is safe) */
#define RK_SHARDED  2u /* this rank's slice of a global tensor split along dimension 0:
                          shape is the local slice (ndim >= 1); the global tensor is the
                          members' slices concatenated in rank order */
#define RK_PER_RANK 4u /* state of this rank alone (an RNG, a data-loader position); the
                          checkpoint keeps every rank's, at ranks/<r>/<name> */
#define RK_FROZEN   8u /* with any of the above: the tensor never changes after rk_resume (a
                          frozen embedding): each of the two snapshot generations copies it
                          once and keeps it, so snapshots at every step cost nothing for it;
                          it is still written to every checkpoint. Changing it anyway leaves
                          the old bytes in the snapshots (a recovery restores those) */

/* flags: 0, RK_DEVICE, RK_SHARDED or RK_PER_RANK (not two of them), each with RK_FROZEN or not.
   name is the tensor's path in the checkpoint ('/' makes HDF5 groups): non-empty, at most
   255 bytes, no leading or trailing '/', no empty, '.' or '..' component, no control
   characters, not a group of another tensor ("a" and "a/b" cannot both exist), and not
   under "ranks" (the group of per-rank state).
   ndim 0..8 (0: a scalar); ptr may be NULL only for a tensor of zero bytes.
   RK_SHARDED and RK_PER_RANK registrations are collective over the current members: every
   member registers the same names in the same order; a sharded tensor's members agree on
   its dtype and trailing dimensions (RK_E_COLL_MISMATCH otherwise), and each learns its
   first row (rk_shard_rows). A spare not yet brought in registers them alone (any
   shape[0]): the members check its registry and it learns its slice when a recovery
   brings it in (then rk_shard_rows / rk_rebind after rk_resume). Bound: the ring's
   (RK_TIMEOUT_MS).
   Errors: RK_E_NAME, RK_E_DUPLICATE, RK_E_DTYPE, RK_E_NOTAVAIL / RK_E_CUDA (RK_DEVICE),
   RK_E_COLL_MISMATCH, -EINVAL (flags, ndim, shape, NULL). */
int rk_register(rk_ctx *ctx, const char *name, void *ptr, rk_dtype dtype, int ndim,
                const int64_t *shape, unsigned flags);

/* The slice of sharded tensor `name` this rank holds now: its first row in the global
   tensor and its number of rows; *global_rows (may be NULL) the global tensor's rows.
   After a membership change (RK_RECOVERED with a new world) the library splits every
   sharded tensor evenly over the new members (rank r gets G/W rows, one more if
   r < G % W, in rank order) and restores each rank's new rows: from the survivors'
   memory (their own slices and the partner copies of the lost ones, docs/SHARDING.md)
   when they hold the step, else from disk. A slice whose size changed is not written
   into the old buffer: the program allocates one of the new size and hands it over with
   rk_rebind, which copies the restored rows into it.
   -ENOENT if no sharded tensor has that name. */
int rk_shard_rows(const rk_ctx *ctx, const char *name, int64_t *offset, int64_t *rows,
                  int64_t *global_rows);
/* Replaces the buffer of registered tensor `name` (the old one stays the caller's). For a
   sharded tensor whose slice changed size in a recovery, ptr must hold the new slice
   (rk_shard_rows) and receives the restored rows; until then no checkpoint is taken
   (RK_E_STATE). For any other tensor, ptr must hold as many bytes as before and is used
   from now on (nothing is copied). -ENOENT unknown name, -EINVAL NULL ptr. */
int rk_rebind(rk_ctx *ctx, const char *name, void *ptr);

/* Collective: restores the latest consistent checkpoint into the registered buffers
   and sets *next_step to the step to run next; 0 and nothing restored if none exists.
   A spare worker (rekindle run --spares: RK_SPARES) waits here until recovery brings it
   into the ring in place of a lost worker (then it returns 0 with the state and step of
   the others; a sharded tensor's slice waits for rk_rebind if its size differs from the
   one registered), or until the job ends without needing it (RK_E_SPARE_UNUSED: finalize and
   exit normally). Until then rk_rank() is -1.
   Every rank agrees on the latest committed checkpoint whose checksums verify on every
   rank, and every rank restores every tensor, whatever the world size that wrote it.
   Latest: the current timeline first, newest commit first, then checkpoints of a timeline
   an earlier run left behind (it resumed from an older step); one that fails is logged and
   the next is tried (docs/FORMAT.md, "Order and retention"). The registered buffers are
   written only once that checkpoint was read whole and verified on every rank: on any
   error they are as before. (Where ranks of one host restore together and every tensor is
   host memory, each rank first reads and checks the checkpoint through the page cache they
   share, then, once every rank verified it, reads it from there into the buffers, checked
   again: only should its files change or fail between those two reads do the buffers hold
   part of it, and older checkpoints are tried as below.) With RK_RESTORE=inplace (rk_options.restore; every rank
   agrees, and only where every registered tensor is host memory) the checkpoint is read
   straight into the buffers, every byte checked as before: no second copy of the state
   is made, and on an error the buffers may hold part of a checkpoint (one that fails on
   some rank is still never the one restored). Every rank returns the same. 0 with nothing restored only if
   the directory holds no committed checkpoint; RK_E_CORRUPT if it holds some and none
   verifies; -errno if a rank cannot list it (EACCES, an unmounted share); RK_E_MISMATCH
   if the checkpoint holds other tensors (names, dtypes, shapes) than the registered ones. */
int rk_resume(rk_ctx *ctx, int64_t *next_step);

/* In place over the current ring (collective: every member passes the same count, dtype,
   op). dtypes f32, f64, f16, bf16 (16-bit types accumulate in f32 per hop), i32, i64, u8
   (wrap-around; avg of integers is refused); ops sum, avg, max, min; any count (0 too).
   For a given membership the reduction order is fixed: results are bitwise reproducible.
   Bound: the ring waits at most RK_TIMEOUT_MS; after a ring error it waits up to
   20 * RK_HEARTBEAT_MS + 2 s for the detector to declare the lost peer, then runs the
   recovery (docs/PROTOCOL.md, "Bounds"). Errors, returned on every member: -EINVAL (NULL
   buffer with count > 0), RK_E_DTYPE, RK_E_OP (here), RK_E_COLL_MISMATCH (members passed
   different arguments), RK_E_PEER_LOST (a member was lost and could not be recovered),
   RK_E_TIMEOUT, RK_E_FENCED, RK_E_NO_MAJORITY / RK_E_MIN_WORLD (recovery stopped).
   On an error buf holds partial results; nothing writes it after the call returns.
   RK_RECOVERED: a member was lost, the ring was rebuilt and registered state rolled
   back: continue from rk_next_step(). */
int rk_allreduce(rk_ctx *ctx, void *buf, size_t count, rk_dtype dtype, rk_op op);

/* Every member's buf[0..bytes) becomes rank `root`'s bytes (of the current ring): the root
   contributes its bytes and the others zeros to a byte-wise MAX over the ring, exact for
   any dtype. Host memory only (-EINVAL for device memory). Collective like rk_allreduce,
   with its errors and bounds; RK_RECOVERED likewise (buf then holds partial results).
   Added in ABI 1 (no new ABI: a function added). */
int rk_broadcast(rk_ctx *ctx, void *buf, size_t bytes, int root);

/* Step `step` (counted from 0) is finished: the registered state is now that at the
   start of step+1. When (step+1) is a multiple of ckpt_every, takes a checkpoint
   labelled step+1 (training blocks only for the snapshot; the buffers may be changed
   as soon as it returns). Bound: if the previous checkpoint is still being written it
   waits for it at most RK_TIMEOUT_MS / 4 (event ckpt_delayed), then skips this one
   (event ckpt_skipped; a warning, reported by rk_wait only if it failed); a member found
   lost meanwhile abandons the previous one at once instead (its commit needs every
   member), and this one goes ahead. Plus the copy into staging; a failure elsewhere
   first runs the recovery, bounded as docs/PROTOCOL.md says. Never waits on the disk.
   At the other steps that are a multiple of snapshot_every (RK_SNAPSHOT_EVERY, default
   every step) it takes a snapshot held in memory only, which a recovery resumes from: its
   copy is started and NOT waited for here, so that it runs while the next step computes;
   it is waited for before the next rk_allreduce, rk_before_update or rk_step_done
   returns. So registered state may change after the next rk_allreduce (the gradients'
   allreduce, then the optimizer's update: the usual loop) but not before it: a program
   that changes registered state elsewhere (a data-loader position, an RNG advanced at
   the start of a step) calls rk_before_update() first. May return RK_RECOVERED. */
int rk_step_done(rk_ctx *ctx, int64_t step);

/* Waits (at most RK_TIMEOUT_MS / 4) until the copy of the last snapshot is done, so that
   the registered state may change: for a program that changes it other than after
   rk_allreduce (rk_step_done). Local, not collective; cheap when no copy is under way.
   Returns 0 (a copy that fails or runs past the bound costs that snapshot, logged with the
   event snapshot_failed, not the call), -EINVAL for a NULL ctx. */
int rk_before_update(rk_ctx *ctx);

int64_t rk_next_step(const rk_ctx *ctx);

/* Start a checkpoint of the current state now (async), labelled rk_next_step(): blocks
   for the copy into staging only. If the previous checkpoint is still being written, waits
   for it at most RK_TIMEOUT_MS / 4, then skips this one (RK_E_BUSY; rk_last_error() says
   what the writer is doing). RK_E_STATE without a checkpoint directory. */
int rk_checkpoint(rk_ctx *ctx);

/* Until every started checkpoint is committed or failed, at most RK_TIMEOUT_MS; returns
   the first failure since the last rk_wait (rk_last_error() and the event ckpt_failed say
   why), 0 if none. Only a checkpoint that failed on its own counts (I/O, a full disk,
   another rank that could not write its shard), and only while no checkpoint of the same
   or a later step has committed since: that state is safe on disk. RK_E_TIMEOUT if one is
   still being written at the bound: rk_last_error() names its step, how long it has been
   in flight, what the writer waits for (another rank's shard, rank 0's directory or
   commit) if anything, and its last file operation with its path (a disk that stopped
   answering); it stays in flight, and a later rk_wait waits again. A member lost
   meanwhile abandons it at once: nothing of an abandoned checkpoint is ever committed, and
   its abandonment (by a recovery, or by rk_wait seeing the member go) is the event
   ckpt_failed with "abandoned": true, not an error. The removal of older checkpoints that
   follows a commit (RK_KEEP) is not waited for: it runs on in the background, and the next
   checkpoint (or rk_finalize) waits for it as for any checkpoint in flight. */
int rk_wait(rk_ctx *ctx);

/* This worker's rank in the current ring (dense, renumbered in the old order after a
   recovery; -1 for a spare not yet brought in) and the ring's size. */
int rk_rank(const rk_ctx *ctx);
int rk_world(const rk_ctx *ctx);

/* Waits for checkpoints (at most RK_TIMEOUT_MS, as rk_wait), stops the detector, releases
   everything; *ctx = NULL. Finalizes MPI only if rk_init() initialized it. A checkpoint
   writer still stuck at the bound (a disk that stopped answering) is abandoned and left
   behind, and rk_finalize returns RK_E_TIMEOUT naming the stuck file: the rest is released
   all the same. That thread may hold HDF5's library lock, which HDF5's own exit handler
   waits for: a program that gets RK_E_TIMEOUT here should leave with _exit() after
   flushing its output (rk-train does), or its exit may wait for the disk. */
int rk_finalize(rk_ctx **ctx);

/* A static, human-readable string for every code (RK_E_..., -errno, RK_OK, RK_RECOVERED). */
const char *rk_strerror(int code);

/* --- additions to the contract ------------------------------------------------------ */

/* The calling thread's message for its last failed Rekindle call: what failed and where
   (for example "RK_HEARTBEAT_MS='abc': not an integer"). Static storage per thread,
   valid until the thread's next failing call; "" if none failed yet. */
const char *rk_last_error(void);

/* The symbolic name of a Rekindle code ("RK_E_TIMEOUT", "RK_OK", "RK_RECOVERED"), NULL
   for any other value (a -errno has none: see rk_strerror). Lets bindings build their
   constants from the one table above. */
const char *rk_error_name(int code);

/* The exit status of a worker that Rekindle ended because its training thread stayed
   inside one MPI call for RK_TIMEOUT_MS / 2: a call that will never return (Open MPI's
   shared-memory transport spins forever when a peer died in the middle of a send;
   docs/RING.md, "Transport"). Its peers declare it dead and recover without it, as for
   any lost worker; a hang would have stopped them all. */
#define RK_EXIT_WEDGED 75

/* Library version, "MAJOR.MINOR.PATCH". */
const char *rk_version(void);

/* --- reading a checkpoint directory by hand (no rk_init, no MPI) ---------------------
 * What `rekindle.load()` in Python is built on: open one committed checkpoint, list its
 * tensors, read each one into a buffer of the caller's with its checksum verified. */
typedef struct rk_reader rk_reader;
typedef struct rk_tensor_info {
    const char *name;   /* valid until rk_reader_close */
    rk_dtype dtype;
    int ndim;           /* 0..8 */
    int64_t shape[8];
    uint64_t nbytes;
} rk_tensor_info;

/* Opens committed checkpoint `step` of ckpt_dir, or the newest one if step < 0 (the one
   rk_resume would try first: the current timeline's newest, docs/FORMAT.md).
   RK_E_NOCKPT if there is none (or not that step), -errno if ckpt_dir cannot be listed,
   RK_E_FORMAT / RK_E_INCOMPLETE / RK_E_CORRUPT if it cannot be opened (rk_last_error()
   names the file). *r is released with rk_reader_close. */
int rk_reader_open(rk_reader **r, const char *ckpt_dir, int64_t step);
/* The step of the opened checkpoint and its world size at the time it was written. */
int64_t rk_reader_step(const rk_reader *r);
int rk_reader_world(const rk_reader *r);
/* Number of tensors, and tensor i (0..count-1, in registration order). */
size_t rk_reader_count(const rk_reader *r);
int rk_reader_info(const rk_reader *r, size_t i, rk_tensor_info *out);
/* Index of the tensor named `name`, or -ENOENT if it has none. */
long rk_reader_find(const rk_reader *r, const char *name);
/* Reads tensor i into buf (exactly its nbytes: -EINVAL otherwise) and verifies its
   checksum: RK_E_CORRUPT naming the tensor and file if it fails (buf then holds garbage). */
int rk_reader_read(rk_reader *r, size_t i, void *buf, uint64_t nbytes);
/* Reads a batch of n tensors, each whole into its buffer (req[k].nbytes exactly the
   tensor's: -EINVAL naming the request otherwise, and nothing is read), with up to 16
   reads of 4 MiB in flight across them (O_DIRECT where the pages are not in the page
   cache, pread where they are), every tensor checked against its checksum as its bytes
   arrive: RK_E_CORRUPT naming the first that fails and its file, -errno for a read that
   fails (RK_FAULT included); then the buffers hold what was read so far. flags:
   RK_READ_SHARED when other processes of this machine read the same tensors (every rank
   loading a replicated model): the batch is read through the page cache, its next 256 MiB
   handed to the kernel's readahead while the current ones are read, so the disk is read
   once for the machine instead of once for each process (Linux >= 6.5; before, the flag
   changes nothing). 0 otherwise. rk_reader_read is a batch of one. */
typedef struct rk_read_req {
    size_t i;        /* the tensor, 0..count-1 */
    void *buf;       /* its bytes go here (may be NULL for a tensor of 0 bytes) */
    uint64_t nbytes; /* the tensor's nbytes */
} rk_read_req;
#define RK_READ_SHARED 1u
int rk_reader_read_many(rk_reader *r, const rk_read_req *req, size_t n, unsigned flags);
void rk_reader_close(rk_reader **r);

#ifdef __cplusplus
}
#endif
#endif /* REKINDLE_H */
