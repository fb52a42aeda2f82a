/*
 * ckpt/ckpt_internal.h - the engine's state, shared by ckpt.c (the state machine, on the
 * training thread) and ckpt_persist.c (the work of the background thread). Private.
 */
#ifndef RK_CKPT_INTERNAL_H
#define RK_CKPT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "../formats/fmt.h"
#include "ckpt.h"
#include "copy.h"

enum ckpt_state { CKPT_IDLE, CKPT_QUEUED, CKPT_RUNNING };

/* What becomes of the job in flight: exactly one of the writer (to commit) and the
   training thread (to abandon) moves it out of OPEN, by compare-and-swap (ckpt.c I10).
   A job abandoned once its commit began goes on to COMMIT_ONLY instead: committed, but
   its retention is left to the next commit, as a restore may now read what it would
   remove; the writer moves COMMITTING to RETAINING by the same swap (ckpt.c I6). */
enum ckpt_fate { JOB_OPEN, JOB_COMMITTING, JOB_ABANDONED, JOB_COMMIT_ONLY, JOB_RETAINING };

/* One checkpoint in flight: what this rank writes, in staging memory. */
struct ckpt_job {
    int64_t step;
    atomic_int fate;     /* enum ckpt_fate */
    char tmpname[64];    /* this attempt's temporary directory (fmt_tmp_name) */
    fmt_manifest m;      /* m.t[i].data points into staging; names are the registry's */
    size_t n_all;        /* tensors in the whole checkpoint (every rank's) */
    uint64_t bytes_all;  /* their bytes */
    int64_t dispatch_ns; /* when the snapshot was handed to the thread */
    double stall_ms;     /* how long the training thread was blocked */
    int rc;              /* how the writer ended it (0: committed), and when (0: not yet) */
    int64_t done_ns;
    /* What the writer waits for on other ranks (ckpt__describe_wait): CKPT_WAIT_NONE,
       _DIR, _COMMIT, or r >= 1, rank r's shard; and since when. */
    atomic_int waiting;
    _Atomic int64_t waiting_since_ns;
    /* The copy into staging this job writes from (ckpt/copy.h): the writer waits for both
       batches first (0: none). */
    uint64_t copy_host, copy_dev;
    /* How that copy ended, once the training thread settled it (ckpt.c, job_copied). */
    atomic_int copy_rc;
    atomic_bool copy_settled;
};
enum { CKPT_WAIT_NONE = 0, CKPT_WAIT_DIR = -1, CKPT_WAIT_COMMIT = -2 };
/* Sets what the writer of j waits for now (one of the above, or a rank). */
void ckpt__waiting(struct ckpt_job *j, int what);
/* "waits for the commit by rank 0 since N ms" and the like; false while it waits for
   nothing. */
bool ckpt__describe_wait(struct ckpt_job *j, char *buf, size_t cap);

/* The format's kind of a tensor registered with these flags (RK_SHARDED, RK_PER_RANK). */
static inline int ckpt__kind(unsigned flags)
{
    return flags & RK_SHARDED ? FMT_SHARDED : flags & RK_PER_RANK ? FMT_PER_RANK : FMT_REPLICATED;
}

/* One generation of the held snapshot: a staging region, the layout and step of the
   snapshot in it, and the partner copy received beside it (ckpt.c I8, I14, I16). */
struct ckpt_gen {
    char *staging;       /* mmap'd once, reused; grows only if the registry grows */
    size_t staging_cap;
    /* The snapshot held in staging: every registered tensor (not only this rank's share),
       so that any survivor can hand the whole state back after a failure (I8). */
    int64_t held_step;   /* -1: none complete (also while a copy is under way) */
    size_t held_n;
    size_t *held_off;    /* offset of each tensor in staging, registry order */
    uint64_t *held_len;
    bool *held_have;     /* the held snapshot has tensor i (not: per-rank state of a rank
                            the checkpoint it was read from did not have) */
    size_t held_cap;
    size_t held_hdr;     /* bytes of the header at the start of staging (I14) */
    size_t held_out;     /* the header and this rank's sharded and per-rank pieces */
    int64_t *held_row0;  /* each tensor's first global row (sharded) */
    bool *frozen_ok;     /* an RK_FROZEN tensor's bytes are in staging from an earlier copy at
                            the same place: the next snapshot copies it no more (ckpt.c I16) */
    uint64_t held_epoch; /* the membership the held snapshot was taken in */
    int held_rank, held_world;
    /* The partner copy (I14): the left neighbour's out region, mmap'd, grows. */
    char *partner;
    size_t partner_cap, partner_len;
    int64_t left_step;
    uint64_t left_epoch;
    ckpt_piece *own_p, *left_p; /* held_cap each: the snapshot's pieces */
};

struct ckpt_engine {
    char *dir, *io;
    int rank, world, keep, timeout_ms;
    uint64_t nonce;      /* of the current membership (I9) */
    uint64_t base_nonce; /* the job's */
    rk__evlog *ev;
    bool (*member_lost)(void *arg); /* ckpt_config */
    void *member_lost_arg;

    pthread_t thr;
    bool thr_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* state changes, both ways */
    enum ckpt_state state;
    bool stop;
    bool orphaned;       /* ckpt_destroy gave up on a stuck writer, which now owns the engine */
    bool clean_pending;  /* ckpt_request_clean: the writer cleans before its next job */
    int64_t busy_since_ns; /* when the job in flight was handed to the writer */
    fmt_io_activity act; /* the writer's last file operation (for "stuck in fsync of …") */
    char *retired;       /* staging replaced while a writer still read it: unmapped once idle */
    size_t retired_cap;
    char *prev;          /* the old snapshot's staging while ckpt_hold_open's new one fills */
    size_t prev_cap;
    struct {             /* what ckpt_hold_open replaced, for ckpt_hold_cancel */
        bool open;       /* opened, neither sealed nor cancelled */
        bool retired;    /* the old region went to retired (a writer still read it), not prev */
        int64_t step;
        size_t n, hdr, out;
        void *save;      /* one block: off, len, row0 (n each), then have (n) */
    } was;
    struct ckpt_job job;
    int first_err;       /* first failure since the last ckpt_wait, not yet superseded (I7) */
    int64_t first_err_step; /* its step */
    char dropped[8][64]; /* the attempts it abandoned, newest last (at most 8 kept), */
    int ndropped;        /* removed at the end of the job: nobody commits them */
    char skipped[64];    /* rank 0: the attempt of its last skip note ("": none) */
    int64_t skipped_step, skipped_ns;
    int64_t last_committed;

    /* The snapshots held in memory (I8, I14, I16): g, the newest (held_step -1 while a copy
       into it is under way), and old, the one before it, kept whole while g's copy runs;
       park, a generation a disk write still reads, put aside so that g and old can go on
       (a third region, made the first time a write lasts longer than a step, then kept). */
    struct ckpt_gen g, old, park;
    uint64_t epoch;      /* the current membership's (ckpt_set_membership) */
    const char *job_region; /* the staging region the job in flight reads (I16) */
    ckpt_snapshot snap, snap_old; /* views of g and old (ckpt_snapshot_held, _older) */
    fmt_tensor *mine;    /* job.m.t storage */
    size_t mine_cap;
    /* The copy engines (ckpt/copy.h): host tensors' and device tensors' (the CUDA engine,
       made at the first device tensor, ordered after cuda_stream). */
    ckpt_copy *host_copy, *dev_copy;
    void *cuda_stream;
    ckpt_copy_op *ops;   /* a batch being built */
    size_t ops_cap;
    struct {             /* the copy into staging under way (training thread only) */
        bool pending;    /* started, not yet settled (ckpt.c, settle) */
        bool host_done;  /* its host batch settled */
        bool torn;       /* given up on at a deadline: never held (the buffers moved on) */
        bool job;        /* the copy the job in flight writes from (not a snapshot only) */
        int64_t step;    /* the step it becomes once settled whole */
        uint64_t host_gen, dev_gen;
        int rc;          /* the first failure of its batches */
    } cp;
    int *plan;           /* rank of each tensor */
    uint64_t *sizes;
    size_t plan_cap;
};

#define ALIGN_UP(x) (((x) + 4095u) & ~(size_t)4095u)
#define HDR_MAGIC 0x524b534e41503031ull /* "RKSNAP01" */

/* The snapshot header at the start of staging (I14): magic, step, n, then each tensor's
   bytes (0: not a piece of the out region) and first row, as uint64. */
static inline size_t ckpt__hdr_bytes(size_t n)
{
    return ALIGN_UP((3 + 2 * n) * sizeof(uint64_t));
}

/* Shared by ckpt.c (the copy into staging, the job) and ckpt_held.c (the generations and
   recovery's uses of them); each is described where it is defined, in ckpt.c. */
int ckpt__stage(ckpt_engine *e, const ckpt_tensor *t, size_t n, bool keep);
void ckpt__hold_layout(ckpt_engine *e, const ckpt_tensor *t, size_t n);
int ckpt__hold_copy(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n);
int ckpt__settle(ckpt_engine *e, bool host_only, int64_t deadline_ns);
int ckpt__copy_start(ckpt_engine *e, const ckpt_tensor *t, size_t n, bool to_staging, uint64_t *host_gen,
                     uint64_t *dev_gen);
void ckpt__unmap_region(ckpt_engine *e, void *p, size_t cap);
/* ckpt_held.c: the generations turn before a new snapshot is copied (I16). */
void ckpt__next_gen(ckpt_engine *e);

/* The background work for one job: shard, manifest, and on rank 0 the rendezvous, index,
   commit and retention; on other ranks, waiting to learn of the commit. Returns 0 or the
   failure (its reason in rk_last_error() of the calling thread). */
int ckpt__persist(ckpt_engine *e, struct ckpt_job *j);
/* Staging for t[0..n) with the held snapshot's layout, nothing held (-1), the job in
   flight abandoned first: where ckpt_load reads a checkpoint (ckpt.c). */
int ckpt__hold_space(ckpt_engine *e, const ckpt_tensor *t, size_t n);
/* The held snapshot laid out by ckpt__hold_space is complete: its header says `step`, it
   is of the current membership, held_step = step (I8, I14). */
void ckpt__seal(ckpt_engine *e, int64_t step);
/* Whether the job was abandoned (the writer stops at its next check). */
bool ckpt__abandoned(struct ckpt_job *j);
/* The writer's claim to commit: false if the job was abandoned first (ckpt.c I10). */
bool ckpt__claim_commit(struct ckpt_job *j);
/* The writer's claim to the retention that follows its commit: false if the job was
   abandoned after its commit began (a restore may read: ckpt.c I6). */
bool ckpt__claim_retention(struct ckpt_job *j);
/* Rank `rank` of the attempt with `nonce` will bring no shard of `step` (it skipped it):
   says so in the attempt's temporary directory so that rank 0 (or, from rank 0, the
   others) stops waiting at once. Written by a short-lived thread, so the training thread
   never waits on the disk; at most one at a time (a skip while one is still being written
   is not noted: the waiters' deadline still bounds them). Rank 0 creates the directory for
   its note; another rank waits for rank 0's (bounded), and notes nothing if it never comes.
   Rank 0 remembers the attempt (e->skipped) for ckpt__drop_skipped. */
void ckpt__note_skip(ckpt_engine *e, int64_t step, int rank, uint64_t nonce, const char *why);
/* At the end of the job, rank 0: the attempt it skipped last, if newer than its last job,
   was made only for the skip note and no one commits it: removed once its note was written
   (bounded by deadline) and had a quarter of a second to be read. */
void ckpt__drop_skipped(ckpt_engine *e, int64_t deadline_ns);
/* Removes the temporary directories of every attempt but j's (ckpt_request_clean). */
void ckpt__clean_for(ckpt_engine *e, const struct ckpt_job *j);
/* At the end of the job: removes the temporary directories names[0..n) (attempts nobody
   will commit), and every '.trash-' directory (a removal that a killed worker left half
   done). */
void ckpt__drop_attempts(ckpt_engine *e, const char *const *names, size_t n);
/* After the commit of `newest`: ckpt_retain's retention, except that `newest` (just
   written, its data checksummed as they were written) counts as verifying if it reopens
   intact, without re-reading its data; then the temporary directories of attempts
   labelled below it (ckpt_dir.c). */
void ckpt__retain(const char *dir, int keep, int64_t newest);
/* The commit time for a checkpoint committed now: CLOCK_REALTIME, but later than every
   commit time already in dir, so the new one is the newest in ckpt_list's order. */
int64_t ckpt__commit_ns(const char *dir);

#endif
