/*
 * ckpt/snapshot.h - the snapshots the engine holds in memory: their generations, the copy
 * into them, the partner copy beside them. Private to ckpt/ (snapshot.c implements it;
 * ckpt.c, writer.c and ckpt_restore.c call it; ckpt.h has the public side).
 *
 * Purpose: at every step (RK_SNAPSHOT_EVERY) and at every checkpoint, a complete copy of
 * the registered tensors is taken into memory of the engine's own while training goes
 * on, so that after a loss any survivor can give the state of that step back (recovery
 * from memory), and the writer has a copy to write from.
 *
 * Words (one name for one idea in ckpt/):
 *   snapshot    the bytes of every registered tensor at one step, in memory;
 *   staging     a region of memory (mmap'd) that a snapshot is copied into;
 *   generation  one staging region with the layout and step of the snapshot in it and
 *               the partner copy received beside it (struct ckpt_gen): g, old, park;
 *   held        a snapshot is held once its copy settled whole (held_step >= 0); ckpt_hold
 *               and its family (public names) make a snapshot held by other means;
 *   copy        a batch on the copy engines (ckpt/copy.h) from the tensors into staging
 *               (a snapshot) or back (a restore);
 *   settle      wait for the copy under way, bounded, and hold its snapshot if it is whole;
 *   turn        the generations before a new snapshot: it goes into old's region (S6);
 *   pin         the one region the writer reads (its job's: job.region), never unmapped
 *               while pinned nor written while that job may commit (writer.c W5).
 *
 * Invariants (tests/test_ckpt_snap.c, tests/test_ckpt.c and tests/test_shard.c name the one
 * each test checks):
 *  S1  Staging is a region a generation (two, g and old, and a third, park, made the first
 *      time a disk write lasts longer than a step), each mapped at its first snapshot and
 *      reused; its size is the registered bytes plus the header (each tensor rounded up to
 *      4 KiB, S4); it grows only if the registry grows. Beside each generation, the
 *      partner copy's region (S4). A region replaced while it is pinned is retired until
 *      it is not (writer.c W5); ckpt_hold_open's old one stays mapped until the rebuild is
 *      sealed or cancelled (a rebuild's region is the older generation's, S11). One copy into
 *      staging is under way at a time (S5).
 *  S2  A held snapshot is complete: every registered tensor (one copy of the registered
 *      bytes), of which this rank writes only its share: after a failure any survivor can
 *      give the whole replicated state of that step back. Sharded and per-rank tensors are
 *      this rank's only; S4 keeps a second copy of them on the right neighbour. The held
 *      step is -1 while a copy into the generation is under way.
 *  S3  A restore reads into staging (ckpt_load), never into the registered buffers; they
 *      are written (ckpt_restore_held) only once the whole checkpoint verified on every
 *      rank, so a failed restore leaves them as they were. The exceptions are S12 and S14.
 *  S4  Staging begins with a header (step, and every tensor's bytes and first row) followed
 *      by this rank's sharded and per-rank pieces, contiguous, then the replicated tensors:
 *      the header and pieces are the snapshot's out region, which the caller sends its
 *      right ring neighbour (ring_shift, recover/) and which that neighbour keeps as its
 *      partner copy (ckpt_snapshot_inbox / _accept), in its own region, never written. A
 *      snapshot is "partnered" only while the left's copy is of the same step and both
 *      were taken in the engine's current membership: then a lost rank's pieces are in its
 *      right neighbour's memory.
 *  S5  The copy into staging runs on the copy engines (host tensors on the host engine's
 *      thread, device tensors on the CUDA engine's stream, after the caller's queued work),
 *      not on the training thread: the held step stays -1 until the copy is settled whole
 *      (both batches done, none failed, none given up on); the writer waits for both batches
 *      before it reads staging; nothing else reads, remaps or unmaps staging while a batch
 *      may still write it (each such call settles first, bounded by timeout_ms / 4, and is
 *      refused, or leaves the region mapped, if the copy still runs). A copy still running
 *      at that bound is given up on, once: whatever it copies is never held nor written
 *      (event copy_timeout; a checkpoint's fails at the writer, a snapshot's is event
 *      snapshot_failed), and every later settle only looks, without waiting, until it ends;
 *      no new copy starts before then. When the caller may change its buffers again is the
 *      caller's: ckpt_copied (recover/: host tensors before rk_step_done returns, device
 *      tensors before the next rk_allreduce or rk_step_done returns).
 *  S6  Two generations: g, the newest snapshot (with its partner copy), and old, the one
 *      before it. A new snapshot (ckpt_snapshot_take at every step, or ckpt_start's) is
 *      copied into old's region after the two swap (the turn): while it is copied and sent
 *      to the partner, the one before stays whole with its own partner copy, so a loss in
 *      that window rolls back one step further, never to a torn one (ckpt_snapshot_select
 *      makes the older one the held one again, never while a copy into g still runs: until
 *      it settles, g is the region it writes). From the turn on, g holds nothing (-1): a
 *      snapshot that fails before its copy leaves old the newest whole one, never g an
 *      older one. A pinned region is never written: if the writer reads old (a disk write
 *      longer than a step), old is put aside (park) and a third region takes its place
 *      before the swap, so the newest whole snapshot stays held as ever.
 *  S7  An RK_FROZEN tensor is copied once into each generation and kept there (frozen_ok)
 *      while its place in the layout stays; a copy of that generation that fails or is
 *      given up on clears the marks, so the next snapshot there copies it again.
 *  S8  A checkpoint of the step whose snapshot is still being copied into g (rk_checkpoint
 *      right after rk_step_done took it: the registered buffers may not change before the
 *      copy is waited for, rekindle.h) writes from that copy: its job takes the copy as its
 *      own (the writer waits for it, is told how it ended: S5), and nothing is copied a
 *      second time (ckpt__snapshot_begin). A snapshot already settled is never reused: the
 *      buffers may have changed since.
 *  S9  A new region is mapped and populated ahead, off the training thread (mem.c: a
 *      first touch of 1 GiB costs 0.04-2.5 s here): when g gets a region of a size the other
 *      generation lacks, a thread maps one for the next turn (prepare), which stage() takes
 *      (waiting for the thread at most timeout_ms / 4, else mapping its own). Nothing but
 *      the thread touches the region until it is joined. At a restore (ckpt_load) nothing
 *      is mapped ahead while the checkpoint is read and copied out: the region is asked
 *      for once ckpt_restore_held copied it out; g's own new region is mapped unpopulated,
 *      faulted in by the reads themselves while the disk works (staging.c).
 *  S10 A checkpoint's writer reads a tensor's bytes from staging as soon as the copy that
 *      brings them is done (copy.h ckpt_copy_wait_op: the host engine copies in registry
 *      order), not after the whole copy: the disk write of the first tensors overlaps the
 *      copy of the last. The whole copy is still waited for, and its outcome known,
 *      before the shard's manifest is written (writer.c W6): a copy that fails or is given
 *      up on halfway commits nothing.
 *  S11 A rebuild (ckpt_hold_open .. ckpt_hold_seal, recover/rollback.c) is built in the
 *      older generation's regions, not new ones: once a recovery changed the membership,
 *      old offers nothing a partnered job can roll back to (S4), so its staging (unless
 *      the writer reads it: then a new region, as before) takes the new snapshot and its
 *      partner region the partner copy made from what the members hold
 *      (ckpt_hold_partner), each grown in place (only the growth is first touched, S9's
 *      cost). old holds nothing (-1) from the open on, whether the rebuild is sealed or
 *      cancelled; the snapshot held before and its partner copy stay readable until the
 *      seal, which swaps the new partner copy in and hands the old snapshot's region to
 *      old where it fits the next turn (else it goes, or becomes the next inbox).
 *  S12 rk_resume with RK_RESTORE=inplace reads straight into the registered buffers
 *      (ckpt_load_into), every byte checked as in S3 but no copy kept: before the first
 *      read, no generation holds a snapshot any more (ckpt__hold_none: the buffers are
 *      about to change), and after it none is held until the first snapshot is taken
 *      (a loss before it rolls back from disk, to the same step). Its region is mapped
 *      ahead once the reads are done (S9). A failed inplace restore leaves the buffers
 *      holding part of what it read; the caller chose that (rekindle.h, rk_resume).
 *  S13 One copy (ckpt_config.one_copy: recover/ sets it where RK_SNAPSHOT_EVERY=0): a
 *      job that holds only its checkpoints' snapshots keeps the state's bytes once more in
 *      memory, not twice. At the turn, old's regions are unmapped (unless the writer reads
 *      its staging) and the new snapshot is copied into g's own region, nothing held while
 *      it is copied; no region is mapped ahead for another generation (S9), and the one a
 *      rebuild leaves (S11: the snapshot held before it) is unmapped at the seal. While a
 *      checkpoint's copy runs (its stall), a loss rolls back from disk: to the checkpoint
 *      old would have offered, which is the one committed before (its writer is done, or
 *      the turn took a new region as in S6: a region the writer reads is never written).
 *      What is given up: that checkpoint from memory (a faster rollback) inside the copy's
 *      window, and, where its write had failed, the rollback to it at all.
 *  S14 A check (ckpt_check) reads a checkpoint as ckpt_load does, every byte checked, and
 *      keeps it nowhere: no staging, no buffer written, nothing held changes; every tensor
 *      goes through the page cache (formats' shared reads, the extents asked ahead). It is
 *      rk_resume's first pass where ranks of one host restore together (recover/rollback.c,
 *      checked): once every rank checked the step whole, ckpt_load_into reads it from the
 *      page cache into the buffers (S12 from there: nothing held after), so the buffers
 *      change only after the whole checkpoint verified everywhere, as in S3, unless the
 *      files change or fail between the two passes. Why: staging in a process that just
 *      started is memory never touched, whose first touch costs about what the disk does
 *      here, once for each rank of the host; the page cache is filled once for all of them.
 *
 * States of the generations (held step of g / old) and the function for each transition:
 *
 *     g: s,  old: s-1 --ckpt__snapshot_begin (the turn, ckpt__turn)--> g: -1 (copying s+1),
 *                                                                      old: s
 *     g: -1 (copying), old: s --ckpt__settle: whole--> g: s+1, old: s
 *                              --ckpt__settle: failed--> g: -1, old: s (frozen marks cleared)
 *                              --ckpt__settle at its bound: give_up--> given up (g: -1, old:
 *                                s; later settles only look; the turn waits for its end)
 *     g: -1, old: s --ckpt__snapshot_begin (nothing whole in g: no turn)--> g: -1 (copying)
 *     one copy (S13): g: s, old: none --ckpt__snapshot_begin (turn: old's regions dropped, no
 *         swap while g is not pinned)--> g: -1 (copying s+1 into its own region), old: none
 *     g: -1 or t, old: s --ckpt_snapshot_select(s) (ckpt_snapshot_restore, ckpt__hold_open of s)-->
 *                                g: s, old: the other (not offered)
 *     old pinned --the turn--> park: old's region (nothing offered), old: park's region
 *     any --ckpt__hold_space (ckpt_load) / ckpt__hold_open--> g: -1 (filled by other means;
 *         a rebuild's in old's region, old: -1, S11) --ckpt_hold_partner--> the partner copy
 *         laid out in old's partner region --ckpt__seal / ckpt_hold_seal--> g: the step read
 *         or rebuilt (with that partner copy), old: -1; ckpt_hold_cancel: g as before the
 *         open, old: -1
 *     any --ckpt__snapshots_end (ckpt_destroy)--> regions unmapped (those a copy may still
 *         write, or the writer read, left mapped)
 * What holds in each: a generation with held_step >= 0 is whole and its header names that
 * step (S2, S4); one with -1 offers nothing; g and old never share a region; a pinned
 * region is g, old or park and is never the target of a copy.
 */
#ifndef RK_CKPT_SNAPSHOT_H
#define RK_CKPT_SNAPSHOT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "copy.h"

/* One generation: a staging region, the layout and step of the snapshot in it, and the
   partner copy received beside it (S2, S4, S6). */
struct ckpt_gen {
    char *staging;       /* mmap'd once, reused; grows only if the registry grows */
    size_t staging_cap;
    int64_t held_step;   /* -1: none complete (also while a copy is under way) */
    size_t held_n;
    size_t *held_off;    /* offset of each tensor in staging, registry order */
    uint64_t *held_len;
    bool *held_have;     /* the held snapshot has tensor i (not: per-rank state of a rank
                            the checkpoint it was read from did not have) */
    size_t held_cap;
    size_t held_hdr;     /* bytes of the header at the start of staging (S4) */
    size_t held_out;     /* the header and this rank's sharded and per-rank pieces */
    int64_t *held_row0;  /* each tensor's first global row (sharded) */
    bool *frozen_ok;     /* S7: an RK_FROZEN tensor's bytes are there from an earlier copy */
    uint64_t held_epoch; /* the membership the held snapshot was taken in */
    int held_rank, held_world;
    /* The partner copy (S4): the left neighbour's out region, mmap'd, grows. */
    char *partner;
    size_t partner_cap, partner_len;
    int64_t left_step;
    uint64_t left_epoch;
    ckpt_piece *own_p, *left_p; /* held_cap each: the snapshot's pieces */
};

/* The snapshot side's state in the engine (training thread only). */
struct ckpt_snapshots {
    struct ckpt_gen g, old, park; /* S6: g the newest, old the one before, park put aside */
    char *retired;       /* a region replaced while pinned: unmapped once it is not */
    size_t retired_cap;
    char *prev;          /* the old snapshot's staging while ckpt_hold_open's new one fills */
    size_t prev_cap;
    struct {             /* what ckpt_hold_open replaced, for ckpt_hold_cancel */
        bool open;       /* opened, neither sealed nor cancelled */
        bool retired;    /* the old region went to retired (pinned), not prev */
        int64_t step;
        size_t n, hdr, out;
        void *save;      /* one block: off, len, row0 (n each), then have (n) */
        ckpt_piece *pieces; /* the held snapshot's own then left pieces (n each), for view */
        ckpt_snapshot view;  /* what ckpt_hold_open's *before says: the arrays above, not
                                own_p / left_p, which the new layout may move */
        bool from_old;       /* the new region is the older generation's (S11) */
        bool partner;        /* ckpt_hold_partner laid out the new partner copy in the
                                older generation's partner region (S11) */
    } was;
    ckpt_snapshot snap, snap_old; /* views of g and old (ckpt_snapshot_held, _older) */
    /* The copy engines (ckpt/copy.h): host tensors' and device tensors' (the CUDA engine,
       made at the first device tensor, ordered after cuda_stream). */
    ckpt_copy *host_copy, *dev_copy;
    void *cuda_stream;
    struct {             /* S9: the next generation's region, mapped ahead off this thread */
        pthread_t thr;
        struct ckpt_prep *job; /* the thread's (staging.c); NULL: none started */
        void *p;         /* the last region it mapped and handed over (tests) */
        bool defer;      /* a restore reads into g (ckpt_load): g's new region is mapped
                            unpopulated, and none is mapped ahead while it reads */
        size_t wanted;   /* the region asked for meanwhile: mapped ahead once the restore
                            was copied out (ckpt__prep_release) */
    } prep;
    ckpt_copy_op *ops;   /* a batch being built */
    size_t *op_of;       /* S10: tensor i's copy in the last batch into staging (ckpt__op) */
    size_t ops_cap;
    struct {             /* the copy into staging under way (S5) */
        bool pending;    /* started, not yet settled */
        bool host_done;  /* its host batch settled */
        bool torn;       /* given up on at a deadline: never held (the buffers moved on) */
        bool job;        /* the copy the job in flight writes from (not a snapshot only) */
        int64_t step;    /* the step it becomes once settled whole */
        uint64_t host_gen, dev_gen;
        int rc;          /* the first failure of its batches */
    } cp;
};

#define ALIGN_UP(x) (((x) + 4095u) & ~(size_t)4095u)
#define HDR_MAGIC 0x524b534e41503031ull /* "RKSNAP01" */

/* The snapshot header at the start of staging (S4): magic, step, n, then each tensor's
   bytes (0: not a piece of the out region) and first row, as uint64. */
static inline size_t ckpt__hdr_bytes(size_t n)
{
    return ALIGN_UP((3 + 2 * n) * sizeof(uint64_t));
}

/* ---- the regions (staging.c) ---- */
/* realloc of *p to n elements of elem bytes; false (and *p as it was) without memory. */
bool ckpt__grow(void **p, size_t n, size_t elem);
/* Whether the writer reads region p: the job's pin (writer.c W5). */
bool ckpt__pinned(ckpt_engine *e, const char *p);
/* Region p of cap bytes goes (unpinned from the CUDA engine first). */
void ckpt__unmap_region(ckpt_engine *e, void *p, size_t cap);
/* The region retired while the writer read it goes, once it reads it no more. */
void ckpt__unmap_retired(ckpt_engine *e);
/* S9: starts mapping a region of cap bytes for the next turn (nothing if one is under way
   or a thread cannot be had); ckpt__region takes it, ckpt__prep_end lets it go. */
void ckpt__prepare(ckpt_engine *e, size_t cap);
/* A region of at least `need` bytes (*cap: its size): the one mapped ahead if it fits
   (its thread waited for at most timeout_ms / 4), else one mapped now (unpopulated while
   a restore defers: ckpt__prep_defer); NULL, errno set. */
void *ckpt__region(ckpt_engine *e, size_t need, size_t *cap);
/* A restore's reads into g (ckpt_load), on: a new region for them is mapped unpopulated
   (the reads fault it in while the disk works), and a region asked of ckpt__prepare is
   not mapped ahead but remembered; off: as before. S9 at a restore: mapping ahead 1 GiB
   beside the reads and the copy out competed with both for the 2 cores. */
void ckpt__prep_defer(ckpt_engine *e, bool on);
/* After a restore's copy out (ckpt_restore_held): the region remembered while it read is
   mapped ahead now, off the caller's thread, for the first turn after it (S9). */
void ckpt__prep_release(ckpt_engine *e);
/* At the engine's end: the region mapped ahead unmapped (its thread waited for until
   deadline_ns, else left to unmap it itself). */
void ckpt__prep_end(ckpt_engine *e, int64_t deadline_ns);

/* The snapshot side of a new engine (the host copy engine started); 0 or its failure. */
int ckpt__snapshots_init(ckpt_engine *e, void *cuda_stream);
/* The end of it, at ckpt_destroy: a copy still running at deadline_ns keeps its engine and
   staging mapped (RK_E_TIMEOUT), else everything is released. */
int ckpt__snapshots_end(ckpt_engine *e, int64_t deadline_ns);
/* Which copy of the batch into staging brings tensor i's bytes (S10): its index in the host
   batch, or one of these. */
#define CKPT_OP_NONE (SIZE_MAX - 2)   /* none: no bytes, or an RK_FROZEN tensor already there (S7) */
#define CKPT_OP_DEVICE (SIZE_MAX - 1) /* the device batch (the CUDA engine knows only whole batches) */
#define CKPT_OP_ALL SIZE_MAX          /* the whole copy, both batches */
/* What a checkpoint's job needs of its snapshot (ckpt__snapshot_begin). */
struct ckpt_job_copy {
    char **at;          /* the caller's array of n: where each tensor lies in staging */
    size_t *op;         /* the caller's array of n: which copy brings it there (S10) */
    const char *region; /* the staging region, for the job's pin (writer.c W5) */
    uint64_t host_gen, dev_gen; /* the copy's batches, which the writer waits for */
};
/* A new snapshot of t[0..n) labelled `step`: the copy before settled (bounded, S5), the
   turn (S6), staging for the layout, the copy started (not waited for). job (NULL: a
   snapshot only): the checkpoint's own copy, told to the writer as it ends (S5), its
   layout and batches in *job. 0 or the failure (nothing started; the held snapshot as
   before the call, S6). */
int ckpt__snapshot_begin(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n, struct ckpt_job_copy *job);
/* Where tensor i of the snapshot in g lies in staging (a restore's reads: ckpt_load). */
char *ckpt__tensor_at(ckpt_engine *e, size_t i);
/* Tensor i lacks in the snapshot being read into staging (ckpt_load: per-rank state of a
   rank the checkpoint did not have). */
void ckpt__tensor_missing(ckpt_engine *e, size_t i);
/* Waits for the copy under way until deadline_ns, or only looks once it was given up on
   (S5); holds its snapshot if it is whole. 0, its failure, or RK_E_TIMEOUT. */
int ckpt__settle(ckpt_engine *e, bool host_only, int64_t deadline_ns);
/* The staging bytes a snapshot of t[0..n) takes: the header, each tensor to a 4 KiB end (S4). */
size_t ckpt__staging_bytes(const ckpt_tensor *t, size_t n);
/* Staging for t[0..n) with the held snapshot's layout, nothing held (-1): where ckpt_load
   reads a checkpoint. */
int ckpt__hold_space(ckpt_engine *e, const ckpt_tensor *t, size_t n);
/* The held snapshot laid out by ckpt__hold_space is complete: its header says `step`, it
   is of the current membership, held_step = step (S2, S4). */
void ckpt__seal(ckpt_engine *e, int64_t step);
/* A restore that reads straight into the registered buffers (ckpt_load_into, S12): the
   copy under way settled (bounded by timeout_ms / 4: RK_E_TIMEOUT if it still runs, nothing
   changed), then no generation holds a snapshot any more (every frozen mark cleared). */
int ckpt__hold_none(ckpt_engine *e);
/* ckpt_hold and ckpt_hold_open without the abandon of the job in flight (ckpt.c's). */
int ckpt__hold(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
int ckpt__hold_open(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n, unsigned char **where,
                    const ckpt_snapshot **before);

#endif
