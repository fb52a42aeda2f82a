/*
 * ckpt/ckpt_internal.h - the engine's state, private to ckpt/: the job slot (ckpt.c, design
 * J1-J5), the job the writer works on (writer.c, W1-W5), and the snapshot side's state,
 * which snapshot.h defines (S1-S7). Each side's functions that the others call are
 * declared here (the job slot's and the writer's) or in snapshot.h.
 */
#ifndef RK_CKPT_INTERNAL_H
#define RK_CKPT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "../formats/fmt.h"
#include "ckpt.h"
#include "copy.h"
#include "snapshot.h"

enum ckpt_state { CKPT_IDLE, CKPT_QUEUED, CKPT_RUNNING };

/* How often a wait for the writer asks member_lost (ckpt.c J2), and the writer's wait for
   the copy looks at its job again (writer.c). */
#define LOST_POLL_MS 20

/* What becomes of the job in flight: exactly one of the writer (to commit) and the
   training thread (to abandon) moves it out of OPEN, by compare-and-swap (ckpt.c J5).
   A job abandoned once its commit began goes on to COMMIT_ONLY instead: committed, but
   its retention is left to the next commit, as a restore may now read what it would
   remove; the writer moves COMMITTING to RETAINING by the same swap (writer.c W4). */
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
    bool retain;         /* its commit claimed the retention (writer.c W4) */
    bool published;      /* rc is out (ckpt_wait's answer); only the retention may be left (J6) */
    int64_t done_ns;
    /* What the writer waits for on other ranks (ckpt__describe_wait): CKPT_WAIT_NONE,
       _DIR, _COMMIT, or r >= 1, rank r's shard; and since when. */
    atomic_int waiting;
    _Atomic int64_t waiting_since_ns;
    /* The copy into staging this job writes from (ckpt/copy.h): the writer waits for both
       batches first (0: none). */
    uint64_t copy_host, copy_dev;
    int64_t copy_deadline; /* the bound of every wait for it (writer.c W3) */
    /* How that copy ended, once the training thread settled it or gave it up
       (ckpt__copy_outcome, writer.c). */
    atomic_int copy_rc;
    atomic_bool copy_settled;
    /* The staging region it reads, pinned until the writer ends the job (writer.c W5). */
    _Atomic(const char *) region;
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

struct ckpt_engine {
    char *dir, *io;
    int rank, world, keep, timeout_ms;
    bool shared_reads;   /* ckpt_config's */
    bool one_copy;       /* ckpt_config's (snapshot.h S13) */
    uint64_t nonce;      /* of the current membership (J4) */
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
    bool clean_pending;  /* ckpt_set_membership on rank 0: the writer cleans before its next job */
    int64_t busy_since_ns; /* when the job in flight was handed to the writer */
    fmt_io_activity act; /* the writer's last file operation (for "stuck in fsync of …") */
    struct ckpt_job job;
    int first_err;       /* first failure since the last ckpt_wait, not yet superseded (J3) */
    int64_t first_err_step; /* its step */
    char dropped[8][64]; /* the attempts it abandoned, newest last (at most 8 kept), */
    int ndropped;        /* removed at the end of the job: nobody commits them */
    char skipped[64];    /* rank 0: the attempt of its last skip note ("": none) */
    int64_t skipped_ns;
    int64_t last_committed;

    uint64_t epoch;      /* the current membership's (ckpt_set_membership) */
    fmt_tensor *mine;    /* job.m.t storage */
    size_t mine_cap;
    int *plan;           /* rank of each tensor (W2) */
    char **at;           /* where each tensor lies in the job's staging */
    size_t *op;          /* which copy brings it there (snapshot.h S10) */
    uint64_t *sizes;
    size_t plan_cap;
    struct ckpt_snapshots s; /* the snapshot side (snapshot.h) */
};

/* ---- the job slot's (ckpt.c) ---- */
/* A checkpoint that failed on its own (J3): the first since the last ckpt_wait is kept for
   it to report. Called with e->mu held. */
void ckpt__note_failure(ckpt_engine *e, int64_t step, int rc);

/* ---- the writer's (writer.c) ---- */
/* The writer thread's body (started by ckpt_create, with e). */
void *ckpt__writer_main(void *e);
/* How the copy the job in flight writes from ended (the snapshot side, once it settled it
   or gave it up at its deadline: rc RK_E_TIMEOUT): the writer fails the job on rc. */
void ckpt__copy_outcome(ckpt_engine *e, int rc);
/* Whether the job was abandoned (the writer stops at its next check). */
bool ckpt__abandoned(struct ckpt_job *j);
/* The writer's claim to commit: false if the job was abandoned first (ckpt.c J5). */
bool ckpt__claim_commit(struct ckpt_job *j);
/* The writer's claim to the retention that follows its commit: false if the job was
   abandoned after its commit began (a restore may read: W4). */
bool ckpt__claim_retention(struct ckpt_job *j);
/* Rank `rank` of the attempt with `nonce` will bring no shard of `step` (it skipped it):
   says so in the attempt's temporary directory so that rank 0 (or, from rank 0, the
   others) stops waiting at once. Written by a short-lived thread, so the training thread
   never waits on the disk; at most one at a time (a skip while one is still being written
   is not noted: the waiters' deadline still bounds them). Rank 0 creates the directory for
   its note; another rank waits for rank 0's (bounded), and notes nothing if it never comes.
   Rank 0 remembers the attempt (e->skipped) for ckpt__drop_skipped. */
void ckpt__note_skip(ckpt_engine *e, int64_t step, int rank, uint64_t nonce, const char *why);
/* Rank 0: the label `step` is committed already, so the attempt with `nonce` is not made
   (ckpt.c J7): says so in its temporary directory (as ckpt__note_skip, remembered for
   ckpt__drop_skipped), and the other ranks count the step as committed. */
void ckpt__note_known(ckpt_engine *e, int64_t step, uint64_t nonce);
/* At the end of the job, rank 0: the attempt it skipped last, if newer than its last job,
   was made only for the skip note and no one commits it: removed once its note was written
   (bounded by deadline) and had a quarter of a second to be read. */
void ckpt__drop_skipped(ckpt_engine *e, int64_t deadline_ns);
/* ---- the directory's (ckpt_dir.c) ---- */
/* Removes the temporary directories of every attempt but j's (ckpt_set_membership on rank 0). */
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
