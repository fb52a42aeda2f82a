/*
 * ckpt/ckpt.h - the asynchronous checkpoint engine: snapshot into reused staging memory
 * on the training thread, persist on a background thread, atomic multi-rank commit
 * through the shared checkpoint directory, retention, and verified restore.
 * The one header of ckpt/ that other folders include; names start with ckpt_.
 * The design is in the headers of the files that own it: ckpt/ckpt.c (the job slot),
 * ckpt/snapshot.h (the snapshots held in memory, their generations), ckpt/writer.c (the
 * writer, the commit, retention), ckpt/ckpt_dir.c (the directory's order).
 *
 * Threads: every ckpt_* function is called from the training thread; the engine's own
 * thread never calls MPI (agreement between ranks, where needed, is the caller's, in
 * recover/api_ckpt.c).
 */
#ifndef RK_CKPT_H
#define RK_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/common.h"

typedef struct ckpt_engine ckpt_engine;

typedef struct ckpt_config {
    const char *dir;  /* the checkpoint directory (created if missing) */
    int rank, world;
    int keep;         /* committed checkpoints kept (>= 1) */
    int timeout_ms;   /* bound on waiting for other ranks' shards / the commit */
    const char *io;   /* RK_IO: "auto", "uring", "buffered" */
    uint64_t nonce;   /* the same on every rank of this job, different across jobs */
    rk__evlog *ev;    /* event log (may be NULL) */
    /* Asked every 20 ms by whoever waits for the writer (ckpt_start, ckpt_wait,
       ckpt_destroy): true once a member of the membership is lost or this worker is
       fenced. The job in flight can then never commit (its commit waits for every
       member, ckpt.c J4), so it is abandoned at once instead of waited out. Called on the
       waiting thread, never with the engine's lock held. May be NULL. */
    bool (*member_lost)(void *arg);
    void *member_lost_arg;
    void *cuda_stream; /* the caller's cudaStream_t (rk_options.cuda_stream; NULL: legacy) */
    bool shared_reads; /* other ranks of this host restore the same replicated tensors: a
                          restore reads those through the page cache (fmt_ckpt_read_shared),
                          so that the host reads them from the disk once */
    bool one_copy;     /* hold one generation, not two (snapshot.h S13): a job that keeps
                          checkpoints' snapshots only (RK_SNAPSHOT_EVERY=0) needs the state's
                          bytes once more in memory, not twice */
} ckpt_config;

/* A tensor as the engine sees it (the registry's, pointers stay the caller's). */
typedef struct ckpt_tensor {
    const char *name;
    void *ptr;            /* NULL with defer: restored into the held snapshot only */
    rk_dtype dtype;
    int ndim;
    const int64_t *shape; /* RK_SHARDED: this rank's slice */
    size_t nbytes;
    unsigned flags;       /* 0, RK_SHARDED or RK_PER_RANK (include/rekindle.h) */
    int64_t row0, rows;   /* RK_SHARDED: the slice's first row, the global tensor's rows */
    bool defer;           /* ckpt_restore_held leaves it (rk_rebind copies it later) */
    bool device;          /* ptr is CUDA device memory (RK_DEVICE): copied by the CUDA engine */
    bool frozen;          /* RK_FROZEN: never changes; a generation that holds its bytes from
                             an earlier copy of the same layout is not copied into again */
} ckpt_tensor;

/* Whether t's bytes are in host memory the caller bound (ckpt_load_into can read into it):
   not a device tensor, not one deferred to rk_rebind, not a NULL buffer of some bytes. */
static inline bool ckpt_tensor_in_host(const ckpt_tensor *t)
{
    return !t->device && !t->defer && (t->ptr || !t->nbytes);
}

/* RK_DEVICE's check of a registration (ckpt/copy_cuda.c): 0 if p is device memory;
   RK_E_CUDA naming the tensor for host memory or when the runtime has no device ("no
   CUDA device: ..."); RK_E_NOTAVAIL in a build without CUDA. */
int ckpt_device_check(const void *p, const char *name);

/* Checks that cfg->dir exists (creating it) and is writable, starts the engine's thread.
   *e is owned by the caller, released with ckpt_destroy. Does not clean the directory:
   see ckpt_clean_dir. */
int ckpt_create(ckpt_engine **e, const ckpt_config *cfg);
/* Waits for the checkpoint in flight until deadline_ns (CLOCK_MONOTONIC), stops the
   thread, frees the staging memory; *e = NULL. Returns the first failure not yet reported.
   A writer still busy at the deadline (a disk that stopped answering) is abandoned and
   left the engine's memory, which is never freed (ckpt.c J5): RK_E_TIMEOUT naming the
   operation and path it is stuck in, before any other failure. Never waits past the
   deadline. */
int ckpt_destroy(ckpt_engine **e, int64_t deadline_ns);

/* Removes the temporary directories of dead attempts ('.tmp-step-…', '.trash-…') in dir,
   each renamed to a '.trash-' name first (ckpt_dir.c). Called by one rank while no
   checkpoint of this job is being written (rk_init); recovery has the writer do it (ckpt_set_membership).
   -errno if dir cannot be listed. */
int ckpt_clean_dir(const char *dir);

/* Snapshot of t[0..n) labelled `step` into staging, then persisted in the background.
   The copy into staging runs on the copy engines (ckpt/copy.h: host tensors on the host
   engine, device tensors on the CUDA engine, after the work queued on the caller's stream)
   and is not waited for here: t's buffers must not change until ckpt_copied says the copy
   is done (the writer waits for it too before it writes). A copy that fails fails this
   checkpoint (event ckpt_failed, reported by ckpt_wait) and leaves no snapshot held. If the previous checkpoint is still being
   written, waits for it up to timeout_ms / 4 (event ckpt_delayed), then skips this one
   (RK_E_BUSY, logged, event ckpt_skipped naming what the writer is stuck in). A rank that
   skips or cannot start a checkpoint says so in the attempt's directory, so the others
   stop waiting for its shard at once. A label already committed is skipped (returns 0):
   rank 0 decides, and says so to the others in the attempt's directory (ckpt.c J7). */
int ckpt_start(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
/* A snapshot of t[0..n) held in memory as `step`, not written to disk (RK_SNAPSHOT_EVERY):
   the copy into staging as for ckpt_start (not waited for here; ckpt_copied), into the
   older generation's region, so that the newest whole snapshot stays held until this one
   is (snapshot.h S6). Never waits for the writer. A failure (logged, event snapshot_failed)
   leaves the snapshot held before. */
int ckpt_snapshot_take(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
/* Until the copy of the last ckpt_start into staging is done (host_only: its host tensors'
   part), or deadline_ns: then the buffers may change. 0 (also when none is under way), the
   copy's failure (the checkpoint failed: reported by ckpt_wait, nothing held), or
   RK_E_TIMEOUT (still copying at the deadline: that snapshot will never be held nor
   written, as the buffers may now change under it). Every call below that reads or
   changes staging waits for the whole copy first, bounded by timeout_ms / 4. A copy given
   up on is waited for no more, here or there (each only looks, and goes on at once: event
   copy_timeout once a copy); no new copy starts before it ended. */
int ckpt_copied(ckpt_engine *e, bool host_only, int64_t deadline_ns);
/* Until the result of every checkpoint started is known (committed or failed: the
   retention after a commit may still run, ckpt.c J6), or deadline_ns (CLOCK_MONOTONIC); returns the first
   failure since the last call (and forgets it), 0 if every checkpoint since was committed,
   RK_E_TIMEOUT if one is still in flight at the deadline (rk_last_error() names the
   step, how long, what the writer waits for on other ranks if anything, and its last
   file operation and path; it stays in flight). */
int ckpt_wait(ckpt_engine *e, int64_t deadline_ns);
/* Until the retention that follows the last commit has ended (ckpt.c J6), or deadline_ns:
   a restore calls it first so as not to list a checkpoint being removed. Waits for
   nothing else: not for a job still writing or committing. */
void ckpt_retention_wait(ckpt_engine *e, int64_t deadline_ns);
/* Whether a checkpoint is in flight now (never waits). */
bool ckpt_busy(ckpt_engine *e);
/* Tells the engine that `step` is committed (after a restore), so it is not written again. */
void ckpt_note_committed(ckpt_engine *e, int64_t step);
/* Newest step this engine committed or learned of, -1 if none. */
int64_t ckpt_last_committed(ckpt_engine *e);

/* ---- the held snapshot and membership changes (recovery) ------------------------------
 * Staging holds a complete copy of every tensor of the last snapshot (snapshot.h S2), and the
 * engine keeps beside it the partner copy: the left ring neighbour's sharded and per-rank
 * pieces of its snapshot (snapshot.h S4). Both are one object, ckpt_snapshot. */

/* One tensor's bytes in a snapshot. */
typedef struct ckpt_piece {
    const void *data;  /* NULL: not held */
    size_t nbytes;
    int64_t row0;      /* RK_SHARDED: the piece's first global row */
} ckpt_piece;

/* The held snapshot, as recovery sees it (read-only; valid until the next ckpt_* call
   that changes staging: ckpt_start, ckpt_hold, ckpt_load, ckpt_snapshot_inbox). */
typedef struct ckpt_snapshot {
    int64_t step;          /* -1: no complete snapshot (also while a copy is under way) */
    int rank, world;       /* this rank's place in the membership it was taken in */
    size_t n;              /* tensors, registry order */
    const ckpt_piece *own; /* n: every tensor as this rank holds it */
    /* The partner copy: what the left neighbour (ring rank rank-1 mod world) sent of its
       snapshot, its sharded and per-rank pieces (replicated ones: nbytes 0). */
    int64_t left_step;     /* -1: none */
    const ckpt_piece *left;
    /* Whether the partner copy completes the snapshot: the left's copy is of the same step,
       and both were taken in the engine's current membership (ckpt_set_membership). */
    bool partnered;
    /* What this rank sends its right neighbour: a header naming the step and every piece,
       then its sharded and per-rank pieces, contiguous in staging. */
    const void *out;
    size_t out_bytes;
} ckpt_snapshot;

/* Copies t[0..n) into staging as the held snapshot of `step`, without writing it
   (after a restore: the state every survivor can roll back to). A checkpoint in flight is
   abandoned first (never waited for). The partner copy is left as it is. */
int ckpt_hold(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
/* A new held snapshot built in place (a rollback from memory: the survivors' pieces moved
   into it, recover/rollback.c): the snapshot of `step` becomes the held one first where the
   older generation holds it (ckpt_snapshot_select; where neither does, the held one stays),
   *before = what ckpt_snapshot_held says of it (set even when the open fails), then room
   for t[0..n) (their ptr unused) in another staging region (the older generation's, grown
   in place, where the writer does not read it: snapshot.h S11; else a new one), where[i]
   = where tensor i goes.
   The snapshot held until now, and *before, stay readable until ckpt_hold_seal or
   ckpt_hold_cancel; nothing is held in between. RK_E_BUSY while an abandoned writer still
   reads two older regions, -ENOMEM; a failure changes nothing (the snapshot stays held). */
int ckpt_hold_open(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n, unsigned char **where,
                   const ckpt_snapshot **before);
/* The partner copy of the snapshot being built since ckpt_hold_open, made by the caller
   from what the members hold (recover/rollback.c B7), not sent again: room for the left
   neighbour's out region of `step`, its piece of tensor i bytes[i] bytes (0: replicated,
   not in it) from row row0[i], laid out and headed as that neighbour's snapshot lays it
   out (snapshot.h S4); where[i] = where piece i goes, the caller's to fill. It goes into
   the older generation's partner region (S11: of the membership before, never offered
   again; grown in place), so the snapshot held before and its partner copy stay readable;
   ckpt_hold_seal makes it the partner copy (ckpt_snapshot_accept's checks). RK_E_STATE if
   nothing is open, -ENOMEM; on failure no partner copy is laid out. bytes NULL: the one
   laid out is dropped (the caller could not fill it): the seal leaves none. */
int ckpt_hold_partner(ckpt_engine *e, int64_t step, const uint64_t *bytes, const int64_t *row0, size_t n,
                      unsigned char **where);
/* Undoes ckpt_hold_open (the rebuild failed): the new region goes, the snapshot held
   before is held again, as it was (its partner copy too). Nothing if none is open. */
void ckpt_hold_cancel(ckpt_engine *e);
/* The region filled since ckpt_hold_open becomes the held snapshot of `step` (of this
   membership), with the partner copy laid out by ckpt_hold_partner if one was (else the
   old snapshot's region becomes the next partner copy's inbox), then goes to the buffers
   of t[0..n) as ckpt_restore_held does; returns what that returns (the snapshot stays
   held whatever it returns). */
int ckpt_hold_seal(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
/* The held snapshot (never NULL; step -1 when none). */
const ckpt_snapshot *ckpt_snapshot_held(ckpt_engine *e);
/* The generation before it (snapshot.h S6): the snapshot held until the newest was taken,
   kept whole while the newest is copied (step -1 when none). Valid as ckpt_snapshot_held's. */
const ckpt_snapshot *ckpt_snapshot_older(ckpt_engine *e);
/* The snapshot of `step` becomes the held one: the newest, or the older generation (then
   the newer one is no longer offered). RK_E_NOCKPT if neither holds it, RK_E_TIMEOUT
   while a copy into the newest generation still runs (nothing selected). */
int ckpt_snapshot_select(ckpt_engine *e, int64_t step);
/* What a member offers a recovery (recover/rollback.c's report), in one look: the step of
   the held snapshot and of the older generation (S6) where each can restore t[0..n)
   (ckpt_snapshot_matches) and, with `partnered` (the job has sharded or per-rank state),
   holds its partner copy of the current membership (S4); -1 where not, older -1 too where
   it is the held step. t NULL with n > 0 (the caller could not list its tensors): nothing
   offered. committed: ckpt_last_committed. */
typedef struct ckpt_offer {
    int64_t held, older, committed;
} ckpt_offer;
ckpt_offer ckpt_snapshot_offer(ckpt_engine *e, const ckpt_tensor *t, size_t n, bool partnered);
/* The rollback of a member that holds the snapshot of `step` itself: that snapshot
   becomes the held one (ckpt_snapshot_select) and is copied back into t[0..n)
   (ckpt_restore_held). RK_E_NOCKPT if neither generation holds it, RK_E_TIMEOUT as
   ckpt_snapshot_select, else what ckpt_restore_held returns. */
int ckpt_snapshot_restore(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
/* Whether s has the layout of t[0..n): as many tensors, of the same sizes (tensors are
   registered in order, never removed). False when none is held. A snapshot taken before
   a tensor was registered is not one the job can roll back to. */
bool ckpt_snapshot_matches(const ckpt_snapshot *s, const ckpt_tensor *t, size_t n);
/* Room for `bytes` of the left neighbour's ckpt_snapshot.out (the partner copy is
   forgotten: left_step -1); NULL if it cannot be had. ckpt_snapshot_accept reads it. */
void *ckpt_snapshot_inbox(ckpt_engine *e, size_t bytes);
/* The inbox holds the left neighbour's out region, received whole: it becomes the partner
   copy of the engine's current membership. RK_E_CORRUPT if its header is malformed (no
   partner copy then). */
int ckpt_snapshot_accept(ckpt_engine *e);
/* Copies the held snapshot back into t[0..n) (the same tensors, in the same order, as when
   it was taken; RK_E_STATE otherwise, nothing copied). Tensors with defer are left. */
int ckpt_restore_held(ckpt_engine *e, const ckpt_tensor *t, size_t n);
/* Abandons the checkpoint in flight, at once and without waiting for the writer: nothing
   of it is ever committed (it fails with RK_E_ABORTED when the writer next looks, or when
   the operation it is stuck in returns). Returns whether one was abandoned; false also
   when its commit had already begun (then it completes, a consistent checkpoint, but its
   retention is left to the next commit: a restore may be about to read). Used
   when a member is lost (its shard will never come), on fencing, and at a membership
   change. The writer stays busy until it notices: a new checkpoint waits for it (ckpt.c J2). */
bool ckpt_abandon(ckpt_engine *e);
/* The job's membership changed (a recovery agreed on it): abandons the commit in flight
   (never waits), then writes as `rank` of `world` under a nonce derived from `epoch`. On
   rank 0 the writer then removes what dead attempts left in the directory (ckpt_clean_dir,
   sparing its own attempt) before it writes its next checkpoint, so that the training
   thread never waits on the disk for it, and before that checkpoint can be committed: a
   stale writer of an earlier membership then finds its directory gone and commits nothing. */
void ckpt_set_membership(ckpt_engine *e, int rank, int world, uint64_t epoch);

/* ---- the checkpoint directory (ckpt_dir.c): order, retention, dead attempts -------------- */

/* A committed checkpoint of a directory. */
typedef struct ckpt_entry {
    int64_t step;
    int64_t commit_ns; /* index.h5's commit_time_ns; 0: not recorded, or the index unreadable */
    bool abandoned;    /* a later commit carries a lower label: a timeline the job left */
    bool readable;     /* index.h5 could be read (and names this label) */
} ckpt_entry;

/* Every committed checkpoint of dir, in the order a job resumes from them: the current
   timeline newest first by commit time, then the abandoned ones newest first (ckpt_dir.c
   says how timelines are told apart). *out is malloc'd (the caller frees it; *n may be
   0). -errno, never an empty list, if dir cannot be listed. */
int ckpt_list(const char *dir, ckpt_entry **out, size_t *n);
/* *step: the first checkpoint of ckpt_list's order labelled below `below` (INT64_MAX:
   any), -1 if none. Returns 0, or -errno if dir cannot be listed (*step -1 then too). */
int ckpt_newest_below(const char *dir, int64_t below, int64_t *step);

/* What retention did, told to the caller's note function (may be NULL). */
enum ckpt_retain_what {
    CKPT_RETAIN_UNVERIFIED,    /* path does not verify: why */
    CKPT_RETAIN_REMOVED,       /* path was removed */
    CKPT_RETAIN_REMOVE_FAILED, /* path could not be removed: why */
};
typedef void ckpt_retain_note(void *arg, enum ckpt_retain_what what, const char *path, const char *why);
/* Retention, the one used by the engine after each commit and by `rekindle gc`: keeps the
   first `keep` checkpoints of ckpt_list's order and the first one whose data verify
   (ckpt_verify_dir: every tensor re-read against its checksum; checked only when there is
   anything to remove), and removes the rest, each renamed to a '.trash-' name first. Returns
   0, -errno if dir cannot be listed (nothing removed), or the first removal that failed.
   The engine's, after its own commit, takes the checkpoint it just committed as verified
   if it reopens intact (its data were checksummed as they were written), without reading
   its data again (ckpt_dir.c). */
int ckpt_retain(const char *dir, int keep, ckpt_retain_note *note, void *arg);

/* ---- restore (ckpt_restore.c) ---------------------------------------------------------- */

/* Reads committed checkpoint `step` of the engine's directory into staging, as the held
   snapshot of t[0..n)'s layout; no buffer of t is written (ckpt_restore_held copies it out
   once every rank has read it whole). First checks that the checkpoint holds exactly these
   tensors (names, dtypes, shapes; RK_E_MISMATCH naming the first difference), then reads
   every tensor and verifies its checksum (RK_E_CORRUPT, RK_E_INCOMPLETE, RK_E_FORMAT). On
   success the held step is `step`; on failure no snapshot is held (-1). A checkpoint in
   flight is abandoned first (never waited for).
   Whatever world size wrote it: a sharded tensor must have the same global rows (its
   shape[0] there; RK_E_MISMATCH otherwise) and this rank reads only the blocks holding
   its rows [row0, row0 + shape[0]); a per-rank tensor is this rank's ranks/<rank>/<name>.
   Per-rank state of ranks >= the engine's world is reported (warning, event
   per_rank_orphaned on rank 0) and stays in the checkpoint; a rank with none there (it
   did not exist) is reported (event per_rank_missing) and that buffer is left as it is. */
int ckpt_load(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
/* ckpt_load straight into the buffers of t[0..n) (snapshot.h S12), all host memory
   (-EINVAL naming a device or deferred tensor, nothing read): the same checks and reads,
   the same errors, no staging touched and nothing copied out. Before the first read no
   snapshot is held any more (RK_E_TIMEOUT if a copy out of the buffers still runs); after
   it none is until the next one is taken. On failure the buffers hold part of the
   checkpoint. */
int ckpt_load_into(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
/* ckpt_load's checks and reads, every byte checked, kept nowhere (snapshot.h S14): no
   buffer of t, no staging written, nothing held changes. Every tensor is read through the
   page cache (formats' shared reads), which holds it after, memory allowing, so that a
   ckpt_load_into of the same step that follows reads memory, not the disk. The same
   errors as ckpt_load; a checkpoint in flight is abandoned first. */
int ckpt_check(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
/* Verifies every tensor of committed checkpoint `stepdir` by re-reading it. On failure
   `bad` (if not NULL) gets what was bad. */
int ckpt_verify_dir(const char *stepdir, char *bad, size_t cap);

#endif
