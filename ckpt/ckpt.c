/*
 * ckpt/ckpt.c - the asynchronous checkpoint engine: snapshot, hand-off to the background
 * thread, waiting, and the engine's life cycle.
 *
 * Purpose: take a consistent copy of the registered tensors at a step boundary while
 * blocking training only for a memcpy, and make it a committed, verifiable checkpoint
 * (docs/FORMAT.md) without ever exposing a partial one.
 *
 * Invariants
 *  I1  Nothing named step-<12 digits> exists before every shard of it is fsync'd, its
 *      checksums are recorded in fsync'd manifests, index.h5 is fsync'd, and the rename
 *      from the '.tmp-step-…' directory is followed by an fsync of the parent.
 *  I2  Staging memory is one region a generation (I16: two, g and old, and a third, park,
 *      made the first time a disk write lasts longer than a step), each mapped at its first
 *      snapshot and reused; its size is the registered bytes plus the header (each tensor
 *      rounded up to 4 KiB, see I8, I14); it grows only if the registry grows. Beside each
 *      generation, the partner copy's region (I14). A region replaced while an abandoned
 *      writer may read it is retired until the writer is idle (I10), and ckpt_hold_open's
 *      old one stays mapped until the rebuild is sealed or cancelled. At most one
 *      checkpoint is in flight, and one copy into staging (I15).
 *  I3  A checkpoint due while the previous is still in flight waits for it up to
 *      timeout_ms / 4 (logged, event ckpt_delayed), then is skipped (logged, event
 *      ckpt_skipped, RK_E_BUSY): never a queue, and never long enough for the other
 *      ranks' collectives (bounded by timeout_ms) to give up on this one. Every wait for
 *      the writer asks the member_lost check (ckpt_config): a job whose commit waits for
 *      a member that is gone is abandoned at once, not waited out.
 *  I4  Every replicated tensor is written by exactly one rank (fmt_assign), every
 *      sharded tensor's slice and every per-rank tensor by the rank that holds it, so the
 *      shards of one checkpoint are disjoint and together hold every tensor.
 *  I5  The background thread never calls MPI; every wait it does has a deadline
 *      (timeout_ms for other ranks' shards on rank 0, twice that for learning of the
 *      commit elsewhere).
 *  I6  Retention never removes the checkpoint just committed (the newest of ckpt_list's
 *      order: its commit time is the latest) nor the newest one that verifies (the one just
 *      committed if it reopens intact: its data were checksummed as they were written, and
 *      are not read again; an older one by its data re-read against its checksums), nor
 *      anything while a restore may read: a commit that began before ckpt_abandon (a
 *      recovery's ckpt_set_membership, a ckpt_load) completes without its retention, left
 *      to the next commit (with RK_KEEP=1 it removed the checkpoint being restored); a
 *      removed directory is first renamed to a '.'-name, so a half-removed checkpoint is
 *      never seen as committed. Re-committing a label exchanges the directories in one
 *      step: a step-<S> exists at every instant (ckpt_dir.c, fmt_commit_dir).
 *  I7  Every failure of a started checkpoint is reported once: by ckpt_wait (rk_wait),
 *      the log and the event ckpt_failed with its reason. Earlier checkpoints stay intact.
 *      A checkpoint abandoned because the membership changed (ckpt_abandon: a member lost,
 *      the recovery's new membership, or another member that abandoned the attempt) did
 *      not fail on its own: it is only the event (ckpt_failed with "abandoned": true), never
 *      an error of ckpt_wait. A failure is no longer reported once a checkpoint of the
 *      same or a later step commits: that state is safe on disk.
 *  I8  Staging holds a complete snapshot of every registered tensor (the held snapshot,
 *      one copy of the registered bytes), of which this rank writes only its share: after
 *      a failure any survivor can give the whole replicated state of that step back
 *      (recovery from memory). Sharded and per-rank tensors are this rank's only; I14
 *      keeps a second copy of them on the right neighbour. The held step is -1 while a
 *      copy is under way.
 *  I9  A job carries the membership (rank, world, nonce) it was started under and writes
 *      in its own temporary directory '.tmp-step-<S>-<nonce>': a change of membership
 *      abandons the commit in flight, and the nonce of the new membership differs, so
 *      shards of two attempts at one step never mix, and a fenced or stale writer can
 *      never touch a file of the attempt that commits.
 *  I10 Nothing on the training thread waits on the disk without a deadline. The job in
 *      flight is abandoned at once (ckpt_abandon) by a compare-and-swap on its fate; the
 *      writer claims the commit by the same swap right before the commit's first rename,
 *      so an abandoned job is never committed, and one whose commit began is never called
 *      abandoned. A writer stuck in the kernel (a disk that stopped answering) keeps
 *      running on its own: the staging it reads is never unmapped under it (a replaced
 *      region is retired until the writer is idle), its job slot is not reused, and
 *      ckpt_destroy leaves it the engine (retained, never freed) instead of joining it.
 *  I11 A restore reads into staging (ckpt_load), never into the registered buffers;
 *      they are written (ckpt_restore_held) only once the whole checkpoint verified on
 *      every rank, so a failed restore leaves them as they were.
 *  I12 A checkpoint directory that cannot be listed is an error wherever it is read
 *      (restore, retention, the CLI), never "no checkpoint".
 *  I13 Every reader of the directory takes one order (ckpt_list): the current timeline
 *      by commit time, then abandoned ones; the held snapshot is offered to a rollback
 *      only when its layout matches the registry (ckpt_snapshot_matches).
 *  I14 Staging begins with a header (step, and every tensor's bytes and first row) followed
 *      by this rank's sharded and per-rank pieces, contiguous, then the replicated tensors:
 *      the header and pieces are the snapshot's out region, which the caller sends its
 *      right ring neighbour (ring_shift, recover/api_ckpt.c) and which that neighbour keeps
 *      as its partner copy (ckpt_snapshot_inbox / _accept), in its own region, never
 *      written. A snapshot is "partnered" only while the left's copy is of the same step
 *      and both were taken in the engine's current membership: then a lost rank's pieces
 *      are in its right neighbour's memory.
 *  I15 The copy into staging runs on the copy engines (ckpt/copy.h: host tensors on the
 *      host engine's thread, device tensors on the CUDA engine's stream, after the caller's
 *      queued work), not on the training thread: the held step stays -1 until the copy is
 *      settled whole (both batches done, none failed, none given up on at a deadline); the
 *      writer waits for both batches before it reads staging; nothing else reads, remaps
 *      or unmaps staging while a batch may still write it (each such call settles first,
 *      bounded by timeout_ms / 4, and is refused, or leaves the region mapped, if the copy
 *      still runs). A copy that fails, or is given up on, fails its checkpoint (event
 *      ckpt_failed) and holds no snapshot. When the caller may change its buffers again is
 *      the caller's: ckpt_copied (recover/: host tensors before rk_step_done returns,
 *      device tensors before the next rk_allreduce or rk_step_done returns).
 *  I16 Two generations (struct ckpt_gen): g, the newest snapshot (with its partner copy),
 *      and old, the one before it. A new snapshot (ckpt_snapshot_take at every step,
 *      RK_SNAPSHOT_EVERY, or ckpt_start's) is copied into old's region, and the two swap
 *      (ckpt__next_gen, ckpt_held.c): while it is copied (held_step -1) and sent to the partner, the one
 *      before stays whole with its own partner copy, so a loss in that window rolls back
 *      one step further, never to a torn one (ckpt_snapshot_select makes the older one
 *      the held one again, but never while a copy into g still runs: until it settles, g
 *      is the region it writes). From the turn on, g holds nothing (-1): a snapshot that
 *      fails before its copy leaves old the newest whole one, never g an older one. A region the writer reads is never written while its job is
 *      live: if the writer still reads old's region (a disk write longer than a step), old
 *      is put aside (park) and a third region takes its place before the swap, so the
 *      newest whole snapshot stays held as ever (ckpt_held.c). The writer waits
 *      for the copy of its own step only; a later batch replacing it on the copy engine
 *      means the training thread settled it first (job_copied).
 *
 * States (one engine, one job slot)
 *      IDLE --ckpt_start (copy into staging)--> QUEUED --persist_thread picks it--> RUNNING
 *      RUNNING --ckpt__persist returns (committed or failed)--> IDLE
 *      QUEUED/RUNNING --ckpt_abandon: the job fails at the writer's next check, or when its
 *                       stuck operation returns; the training thread does not wait
 *      QUEUED/RUNNING --ckpt_start: waits for IDLE up to timeout_ms / 4, else skipped (I3)
 *      any --ckpt_hold / ckpt_load (ckpt_restore.c): abandons the job in flight, then
 *            staging holds the new snapshot (I8, I11)
 *      any --ckpt_destroy: waits for IDLE until its deadline, then abandons and leaves the
 *            writer the engine (RK_E_TIMEOUT naming what it is stuck in)
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"


#define LOST_POLL_MS 20 /* how often a wait for the writer, or the writer's for a copy, looks again */

static bool wait_state(ckpt_engine *e, int64_t deadline_ns, bool settled);
static bool wait_idle(ckpt_engine *e, int64_t deadline_ns);

static void emit_result(ckpt_engine *e, struct ckpt_job *j, int rc)
{
    if (rc == 0) {
        RK_EVENT(e->ev, "ckpt_committed", RK_EV_I("step", j->step), RK_EV_I("bytes", j->bytes_all),
                 RK_EV_D("stall_ms", j->stall_ms), RK_EV_D("persist_ms", rk__ms_since(j->dispatch_ns)),
                 RK_EV_S("io_path", j->m.io_path));
        return;
    }
    bool abandoned = ckpt__abandoned(j);
    if (abandoned) /* by a change of membership: the recovery's event, not a failure (I7) */
        RK_LOG_INFO(RK_SUB_CKPT, "checkpoint of step %" PRId64 " not committed: %s", j->step, rk_last_error());
    else
        RK_LOG_ERR(RK_SUB_CKPT, "checkpoint of step %" PRId64 " failed: %s (%s)", j->step, rk_last_error(),
                   rk_strerror(rc));
    RK_EVENT(e->ev, "ckpt_failed", RK_EV_I("step", j->step), RK_EV_S("reason", rk_last_error()),
             RK_EV_S("error", rk_strerror(rc)), RK_EV_B("abandoned", abandoned));
}

/* A checkpoint that failed on its own (I7): the first since the last ckpt_wait is kept for
   it to report. Called with e->mu held. */
static void note_failure(ckpt_engine *e, int64_t step, int rc)
{
    if (e->first_err)
        return;
    e->first_err = rc;
    e->first_err_step = step;
}

/* Until the copy the job writes from is done (I15). A batch replaced by a later one (the
   next snapshot's, I16) was settled whole by the training thread before that one started:
   its outcome is the job's. */
static int job_copied(ckpt_engine *e, struct ckpt_job *j, int64_t deadline)
{
    int rc;
    for (;;) { /* in slices: a job abandoned meanwhile (its copy given up on) waits no more */
        int64_t slice = rk__deadline_ns(LOST_POLL_MS), until = slice < deadline ? slice : deadline;
        rc = j->copy_host ? ckpt_copy_wait(e->host_copy, j->copy_host, until) : 0;
        if (!rc && j->copy_dev)
            rc = ckpt_copy_wait(e->dev_copy, j->copy_dev, until);
        if (rc != RK_E_TIMEOUT || until == deadline)
            break;
        if (ckpt__abandoned(j))
            return rk__fail(RK_SUB_CKPT, RK_LOG_INFO, RK_E_ABORTED, "abandoned while its copy still ran");
    }
    if (rc == RK_E_ABORTED && atomic_load(&j->copy_settled)) {
        rc = atomic_load(&j->copy_rc);
        if (rc)
            rk__set_last_error("it failed or did not finish in time (%s)", rk_strerror(rc));
    }
    return rc;
}

static void *persist_thread(void *arg)
{
    ckpt_engine *e = arg;
    fmt_io_watch(&e->act);
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (e->state != CKPT_QUEUED && !e->stop)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->state != CKPT_QUEUED)
            break;
        e->state = CKPT_RUNNING;
        bool clean = e->clean_pending;
        e->clean_pending = false;
        pthread_mutex_unlock(&e->mu);
        if (clean)
            ckpt__clean_for(e, &e->job);
        /* I15: nothing of staging is read before the copy into it is done. */
        int rc = job_copied(e, &e->job, rk__deadline_ns(e->timeout_ms));
        if (rc) {
            char why[512];
            snprintf(why, sizeof(why), "%s", rk_last_error());
            rk__set_last_error("the copy into staging failed: %s", why);
        } else
            rc = ckpt__persist(e, &e->job);
        emit_result(e, &e->job, rc); /* e->ev is the engine's own reference (I10) */
        pthread_mutex_lock(&e->mu);
        e->job.rc = rc;
        e->job.done_ns = rk__mono_ns();
        if (rc == 0 && e->job.step > e->last_committed)
            e->last_committed = e->job.step;
        if (rc == 0 && e->first_err && e->job.step >= e->first_err_step)
            e->first_err = 0; /* superseded: a later state is committed (I7) */
        if (rc != 0 && !ckpt__abandoned(&e->job))
            note_failure(e, e->job.step, rc);
        e->state = CKPT_IDLE;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    fmt_io_watch(NULL);
    return NULL;
}

bool ckpt__abandoned(struct ckpt_job *j)
{
    return atomic_load(&j->fate) == JOB_ABANDONED;
}

bool ckpt__claim_commit(struct ckpt_job *j)
{
    int open = JOB_OPEN;
    return atomic_compare_exchange_strong(&j->fate, &open, JOB_COMMITTING) || open == JOB_COMMITTING ||
           open == JOB_COMMIT_ONLY;
}

bool ckpt__claim_retention(struct ckpt_job *j)
{
    int committing = JOB_COMMITTING;
    return atomic_compare_exchange_strong(&j->fate, &committing, JOB_RETAINING);
}

void ckpt__waiting(struct ckpt_job *j, int what)
{
    atomic_store(&j->waiting_since_ns, rk__mono_ns());
    atomic_store(&j->waiting, what);
}

bool ckpt__describe_wait(struct ckpt_job *j, char *buf, size_t cap)
{
    int what = atomic_load(&j->waiting);
    double ms = rk__ms_since(atomic_load(&j->waiting_since_ns));
    if (what == CKPT_WAIT_NONE)
        return false;
    if (what == CKPT_WAIT_DIR)
        snprintf(buf, cap, "waits for rank 0 to create the attempt's directory, since %.0f ms", ms);
    else if (what == CKPT_WAIT_COMMIT)
        snprintf(buf, cap, "has written its shard and waits for the commit by rank 0, since %.0f ms", ms);
    else
        snprintf(buf, cap, "waits for rank %d's shard, since %.0f ms", what, ms);
    return true;
}

/* mkdir -p, then prove that files can be created there. */
static int prepare_dir(const char *dir, int rank)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s", dir);
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -errno, "checkpoint directory %s: mkdir %s: %s", dir, path,
                            strerror(errno));
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -errno, "checkpoint directory %s: mkdir: %s", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOTDIR, "checkpoint directory %s: not a directory", dir);
    /* The directory may be shared: a new file of an unguessable name, never one that is
       there already and never through a symbolic link planted at the name. */
    int fd = -1;
    for (int tries = 0; tries < 8 && fd < 0; tries++) {
        uint64_t r = 0;
        if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
            r = (uint64_t)rk__real_ns() ^ (uint64_t)tries;
        snprintf(path, sizeof(path), "%s/.probe-%d-%d-%016" PRIx64, dir, (int)getpid(), rank, r);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -errno, "checkpoint directory %s is not writable: %s", dir,
                        strerror(errno));
    close(fd);
    unlink(path);
    return 0;
}

int ckpt_create(ckpt_engine **out, const ckpt_config *cfg)
{
    int rc;
    pthread_condattr_t ca;
    *out = NULL;
    if (!cfg || !cfg->dir || !*cfg->dir || cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world || cfg->keep < 1)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "ckpt_create: bad configuration");
    if ((rc = prepare_dir(cfg->dir, cfg->rank)) != 0)
        return rc;
    ckpt_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->dir = strdup(cfg->dir);
    e->io = strdup(cfg->io ? cfg->io : "auto");
    if (!e->dir || !e->io) {
        rc = -ENOMEM;
        goto out_free;
    }
    e->rank = cfg->rank;
    e->world = cfg->world;
    e->keep = cfg->keep;
    e->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 30000;
    e->nonce = e->base_nonce = cfg->nonce;
    struct ckpt_gen *gens[] = {&e->g, &e->old, &e->park};
    for (size_t i = 0; i < sizeof(gens) / sizeof(gens[0]); i++)
        *gens[i] = (struct ckpt_gen){.held_step = -1, .left_step = -1, .held_rank = cfg->rank, .held_world = cfg->world};
    e->ev = rk__evlog_ref(cfg->ev);
    e->member_lost = cfg->member_lost;
    e->member_lost_arg = cfg->member_lost_arg;
    e->cuda_stream = cfg->cuda_stream;
    e->last_committed = -1;
    if ((rc = ckpt_copy_host_create(&e->host_copy)) != 0)
        goto out_free;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = -pthread_create(&e->thr, NULL, persist_thread, e)) != 0) {
        rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "ckpt_create: cannot start the writer thread");
        goto out_sync;
    }
    e->thr_started = true;
    *out = e;
    return 0;
out_sync:
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
out_free:
    ckpt_copy_destroy(&e->host_copy, 0);
    rk__evlog_close(&e->ev);
    free(e->dir);
    free(e->io);
    free(e);
    return rc;
}

/* What the writer is doing, for an error that says where it is stuck. */
static void describe_busy(ckpt_engine *e, char *buf, size_t cap)
{
    char op[640], wait[128], writer[sizeof(op) + sizeof(wait) + 64];
    pthread_mutex_lock(&e->mu);
    int64_t step = e->job.step, since = e->busy_since_ns;
    pthread_mutex_unlock(&e->mu);
    if (!fmt_io_activity_describe(&e->act, op, sizeof(op)))
        snprintf(op, sizeof(op), "no file operation yet");
    if (ckpt__describe_wait(&e->job, wait, sizeof(wait)))
        snprintf(writer, sizeof(writer), "the writer %s; its last file operation: %s", wait, op);
    else
        snprintf(writer, sizeof(writer), "writer's last operation: %s", op);
    snprintf(buf, cap, "the checkpoint of step %" PRId64 " has been in flight for %.0f ms (%s)", step,
             rk__ms_since(since), writer);
}

static int busy_error(ckpt_engine *e, const char *what)
{
    char why[900];
    describe_busy(e, why, sizeof(why));
    return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT, "%s: %s", what, why);
}

int ckpt_wait(ckpt_engine *e, int64_t deadline_ns)
{
    ckpt__settle(e, false, deadline_ns); /* its failure is the writer's to report (I7, I15) */
    if (!wait_state(e, deadline_ns, true))
        return busy_error(e, "gave up waiting for the checkpoint writer");
    pthread_mutex_lock(&e->mu);
    int rc = e->first_err;
    e->first_err = 0;
    pthread_mutex_unlock(&e->mu);
    if (rc)
        rk__set_last_error("a checkpoint failed: %s (see the log and the ckpt_failed event)", rk_strerror(rc));
    return rc;
}

/* A region of the engine's (staging, retired, prev, partner) goes: unpinned first. */
void ckpt__unmap_region(ckpt_engine *e, void *p, size_t cap)
{
    ckpt_copy_unpin(e->dev_copy, p);
    rk__unmap(p, cap);
}

static void unmap_retired(ckpt_engine *e)
{
    if (e->retired)
        ckpt__unmap_region(e, e->retired, e->retired_cap);
    e->retired = NULL;
    e->retired_cap = 0;
}

static void gen_free(ckpt_engine *e, struct ckpt_gen *g)
{
    if (g->staging)
        ckpt__unmap_region(e, g->staging, g->staging_cap);
    if (g->partner)
        ckpt__unmap_region(e, g->partner, g->partner_cap);
    free(g->held_row0);
    free(g->frozen_ok);
    free(g->own_p);
    free(g->left_p);
    free(g->held_have);
    free(g->held_off);
    free(g->held_len);
}

int ckpt_destroy(ckpt_engine **pe, int64_t deadline_ns)
{
    if (!pe || !*pe)
        return 0;
    ckpt_engine *e = *pe;
    *pe = NULL;
    int rc = 0;
    if (e->thr_started) {
        rc = ckpt_wait(e, deadline_ns);
        wait_idle(e, deadline_ns); /* an abandoned job's writer gets until the deadline too */
        pthread_mutex_lock(&e->mu);
        e->stop = true;
        bool stuck = e->state != CKPT_IDLE;
        e->orphaned = stuck;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        if (stuck) {
            /* I10: the writer is in the kernel and may never come back. It keeps the engine;
               what it wrote is never committed. */
            ckpt_abandon(e);
            pthread_detach(e->thr);
            rk__retain_forever(e); /* the stuck thread still uses it */
            /* RK_E_TIMEOUT whatever else failed before: it tells the caller that a thread
               is left (rekindle.h, rk_finalize: leave with _exit). */
            return busy_error(e, "gave up waiting for the checkpoint writer; it is left behind");
        }
        pthread_join(e->thr, NULL);
        /* No one commits an attempt this engine abandoned (a member lost, at the end of the
           job or before it), nor a failed last attempt; no later job of this engine cleans
           them, and rank 0, which makes and removes attempts, may be the member lost at the
           end. So every rank removes the attempts it abandoned, and rank 0 a failed last
           one (a quarter of a second after its FAILED note, which is how the followers
           learn of it: they look every 50 ms at most); every rank also removes the
           '.trash-' left by a removal that a killed worker did not finish. A removal is one
           rename first (ckpt_dir.c): survivors removing an attempt together, or a rank 0
           committing it meanwhile, leave it whole and committed or gone. Only this
           engine's own attempts: a minority never touches those of the membership that
           went on, nor of a later launch (other nonces). Followers never create an
           attempt's directory again (ckpt_persist.c). */
        struct ckpt_job *j = &e->job;
        bool abandoned = atomic_load(&j->fate) == JOB_ABANDONED, failed = j->done_ns && j->rc != 0;
        const char *names[9];
        size_t n = 0;
        for (int i = 0; i < e->ndropped; i++)
            names[n++] = e->dropped[i];
        if (failed && !abandoned && e->rank == 0) {
            int64_t left = j->done_ns + 250 * 1000000LL - rk__mono_ns();
            if (left > 0)
                rk__sleep_ns(left);
            names[n++] = j->tmpname;
        }
        ckpt__drop_attempts(e, names, n);
        if (e->rank == 0)
            ckpt__drop_skipped(e, deadline_ns);
    }
    /* A copy still running at the deadline (I15) keeps its engine and staging mapped; one
       given up on is waited for here too (ckpt__settle would only look). */
    if (e->cp.pending && e->cp.torn) {
        if (!e->cp.host_done)
            ckpt_copy_wait(e->host_copy, e->cp.host_gen, deadline_ns);
        ckpt_copy_wait(e->dev_copy, e->cp.dev_gen, deadline_ns);
    }
    int crc = ckpt__settle(e, false, deadline_ns) == RK_E_TIMEOUT && e->cp.pending ? RK_E_TIMEOUT : 0;
    if (!crc)
        crc = ckpt_copy_destroy(&e->host_copy, deadline_ns);
    int drc = crc ? crc : ckpt_copy_destroy(&e->dev_copy, deadline_ns);
    if (drc) {
        e->g.staging = NULL;
        if (!rc)
            rc = drc;
    }
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    fmt_io_activity_fini(&e->act);
    rk__evlog_close(&e->ev);
    unmap_retired(e);
    gen_free(e, &e->g);
    gen_free(e, &e->old);
    gen_free(e, &e->park);
    if (e->prev)
        ckpt__unmap_region(e, e->prev, e->prev_cap);
    free(e->was.save);
    for (size_t i = 0; i < e->job.m.n; i++)
        free(e->mine[i].blocks);
    free(e->mine);
    free(e->plan);
    free(e->sizes);
    free(e->ops);
    free(e->dir);
    free(e->io);
    free(e);
    return rc;
}

void ckpt_note_committed(ckpt_engine *e, int64_t step)
{
    pthread_mutex_lock(&e->mu);
    e->last_committed = step;
    pthread_mutex_unlock(&e->mu);
}

int64_t ckpt_last_committed(ckpt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    int64_t s = e->last_committed;
    pthread_mutex_unlock(&e->mu);
    return s;
}

bool ckpt_busy(ckpt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    bool busy = e->state != CKPT_IDLE;
    pthread_mutex_unlock(&e->mu);
    return busy;
}

/* Whether no live checkpoint is in flight: idle, or the job in flight abandoned. */
static bool settled_locked(ckpt_engine *e)
{
    return e->state == CKPT_IDLE || ckpt__abandoned(&e->job);
}

/* Waits until the deadline for the writer to be idle (or, if `settled`, for no live job:
   an abandoned one may still be stuck); true if it is. With a member_lost check (I3), it
   is asked every LOST_POLL_MS, and the job in flight is abandoned as soon as it says a
   member is gone: a commit that waits for a dead member is never waited out. */
static bool wait_state(ckpt_engine *e, int64_t deadline_ns, bool settled)
{
    for (;;) {
        int64_t until = deadline_ns;
        if (e->member_lost) {
            int64_t poll = rk__deadline_ns(LOST_POLL_MS);
            until = poll < deadline_ns ? poll : deadline_ns;
        }
        struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};
        pthread_mutex_lock(&e->mu);
        while (!(settled ? settled_locked(e) : e->state == CKPT_IDLE))
            if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT)
                break;
        bool ok = settled ? settled_locked(e) : e->state == CKPT_IDLE;
        pthread_mutex_unlock(&e->mu);
        if (ok || until == deadline_ns)
            return ok;
        if (e->member_lost(e->member_lost_arg))
            ckpt_abandon(e); /* nothing if no job is open or its commit began (I10) */
    }
}

static bool wait_idle(ckpt_engine *e, int64_t deadline_ns)
{
    return wait_state(e, deadline_ns, false);
}

static bool grow(void **p, size_t n, size_t elem)
{
    void *q = realloc(*p, n * elem);
    if (q)
        *p = q;
    return q != NULL;
}

/* Staging large enough for every tensor, and the held snapshot's bookkeeping (I8). Safe
   while a writer is busy: a region it may still read is retired, not unmapped (I10).
   keep (ckpt_hold_open): always a new region, and the old one stays mapped as e->prev
   (retired instead while a writer still reads it). */
int ckpt__stage(ckpt_engine *e, const ckpt_tensor *t, size_t n, bool keep)
{
    if (n > e->g.held_cap) {
        if (!grow((void **)&e->g.held_off, n, sizeof(*e->g.held_off)) ||
            !grow((void **)&e->g.held_len, n, sizeof(*e->g.held_len)) ||
            !grow((void **)&e->g.held_have, n, sizeof(*e->g.held_have)) ||
            !grow((void **)&e->g.held_row0, n, sizeof(*e->g.held_row0)) ||
            !grow((void **)&e->g.frozen_ok, n, sizeof(*e->g.frozen_ok)) ||
            !grow((void **)&e->g.own_p, n, sizeof(*e->g.own_p)) || !grow((void **)&e->g.left_p, n, sizeof(*e->g.left_p)))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "checkpoint staging for %zu tensors", n);
        memset(e->g.frozen_ok + e->g.held_cap, 0, (n - e->g.held_cap) * sizeof(*e->g.frozen_ok));
        e->g.held_cap = n;
    }
    size_t need = ckpt__hdr_bytes(n);
    for (size_t i = 0; i < n; i++)
        need += ALIGN_UP(t[i].nbytes);
    if (ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)) == RK_E_TIMEOUT && e->cp.pending)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "checkpoint staging: the copy of step %" PRId64 " into it still runs", e->cp.step);
    bool busy = ckpt_busy(e);
    if (!busy)
        unmap_retired(e);
    if (need <= e->g.staging_cap && !keep)
        return 0;
    if (busy && e->retired)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_BUSY,
                        "checkpoint staging must grow while an abandoned writer still reads two older regions");
    int f = rk__fault_fail("stage");
    void *p = f ? NULL : rk__map(need);
    if (!p)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, f ? f : -errno, "checkpoint staging of %zu bytes: %s", need,
                        strerror(f ? -f : errno));
    e->g.held_step = -1;
    memset(e->g.frozen_ok, 0, e->g.held_cap * sizeof(*e->g.frozen_ok)); /* a new region holds nothing */
    if (busy) {
        e->retired = e->g.staging;
        e->retired_cap = e->g.staging_cap;
    } else if (keep) {
        e->prev = e->g.staging;
        e->prev_cap = e->g.staging_cap;
    } else if (e->g.staging) {
        ckpt__unmap_region(e, e->g.staging, e->g.staging_cap);
    }
    e->g.staging = p;
    e->g.staging_cap = need;
    return 0;
}

/* The plan: which rank writes each tensor (I4). Only while the writer is idle (its job
   points into these arrays). */
static int plan(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    if (n > e->plan_cap) {
        if (!grow((void **)&e->plan, n, sizeof(*e->plan)) || !grow((void **)&e->sizes, n, sizeof(*e->sizes)) ||
            !grow((void **)&e->mine, n, sizeof(*e->mine)))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "checkpoint plan for %zu tensors", n);
        e->plan_cap = e->mine_cap = n;
    }
    for (size_t i = 0; i < n; i++) /* only replicated tensors are assigned (I4) */
        e->sizes[i] = t[i].flags ? 0 : t[i].nbytes;
    int rc = fmt_assign(e->sizes, n, e->world, e->plan);
    if (rc)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "checkpoint plan for %zu tensors", n);
    return 0;
}

/* The held snapshot's layout for t[0..n) in staging (I14): the header, the sharded and
   per-rank pieces, the replicated tensors; nothing held yet (I8). */
void ckpt__hold_layout(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    size_t off = ckpt__hdr_bytes(n);
    e->g.held_step = -1;
    e->g.held_hdr = off;
    for (int own = 1; own >= 0; own--) {
        for (size_t i = 0; i < n; i++) {
            if ((t[i].flags != 0) != own)
                continue;
            if (i >= e->g.held_n || e->g.held_off[i] != off || e->g.held_len[i] != t[i].nbytes)
                e->g.frozen_ok[i] = false; /* its bytes, if any, are elsewhere */
            e->g.held_off[i] = off;
            e->g.held_len[i] = t[i].nbytes;
            e->g.held_row0[i] = t[i].flags & RK_SHARDED ? t[i].row0 : 0;
            e->g.held_have[i] = true;
            off += ALIGN_UP(t[i].nbytes);
        }
        if (own)
            e->g.held_out = off;
    }
    e->g.held_n = n;
}

void ckpt__seal(ckpt_engine *e, int64_t step)
{
    uint64_t *h = (uint64_t *)e->g.staging;
    h[0] = HDR_MAGIC;
    h[1] = (uint64_t)step;
    h[2] = e->g.held_n;
    for (size_t i = 0; i < e->g.held_n; i++) {
        bool piece = e->g.held_off[i] < e->g.held_out;
        h[3 + 2 * i] = piece ? e->g.held_len[i] : 0;
        h[4 + 2 * i] = (uint64_t)e->g.held_row0[i];
    }
    pthread_mutex_lock(&e->mu);
    e->g.held_epoch = e->epoch;
    e->g.held_rank = e->rank;
    e->g.held_world = e->world;
    pthread_mutex_unlock(&e->mu);
    e->g.held_step = step;
}

/* The CUDA engine, made at the first device tensor; its pinned region is staging. */
static int dev_engine(ckpt_engine *e)
{
    int rc = e->dev_copy ? 0 : ckpt_copy_cuda_create(&e->dev_copy, e->cuda_stream);
    if (!rc)
        ckpt_copy_pin(e->dev_copy, e->g.staging, e->g.staging_cap);
    return rc;
}

/* Starts the copies between t[0..n) and staging at the held layout, on both engines (I15):
   to_staging for a snapshot, else a restore (tensors with defer left). *host_gen and
   *dev_gen: the batches (0: none). On failure nothing more is started, but a host batch
   already started may run: its gen is set. */
int ckpt__copy_start(ckpt_engine *e, const ckpt_tensor *t, size_t n, bool to_staging, uint64_t *host_gen,
                      uint64_t *dev_gen)
{
    *host_gen = *dev_gen = 0;
    if (n > e->ops_cap) {
        if (!grow((void **)&e->ops, n, sizeof(*e->ops)))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "checkpoint copy of %zu tensors", n);
        e->ops_cap = n;
    }
    size_t nh = 0, nd = 0; /* host copies from the front, device ones from the back */
    for (size_t i = 0; i < n; i++) {
        if (!t[i].nbytes || (!to_staging && (t[i].defer || !e->g.held_have[i])))
            continue;
        if (to_staging && t[i].frozen && e->g.frozen_ok[i])
            continue; /* RK_FROZEN: already there */
        char *at = e->g.staging + e->g.held_off[i];
        ckpt_copy_op op = to_staging ? (ckpt_copy_op){.dst = at, .src = t[i].ptr, .n = t[i].nbytes}
                                     : (ckpt_copy_op){.dst = t[i].ptr, .src = at, .n = t[i].nbytes};
        if (t[i].device)
            e->ops[n - ++nd] = op;
        else
            e->ops[nh++] = op;
    }
    int rc = nd ? dev_engine(e) : 0;
    if (!rc && nh)
        rc = ckpt_copy_start(e->host_copy, e->ops, nh, host_gen);
    if (!rc && nd)
        rc = ckpt_copy_start(e->dev_copy, e->ops + n - nd, nd, dev_gen);
    return rc;
}

/* Starts copying every tensor into staging: the held snapshot of `step` once settled
   (I8, I15). */
int ckpt__hold_copy(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    ckpt__hold_layout(e, t, n);
    uint64_t hg, dg;
    int rc = ckpt__copy_start(e, t, n, true, &hg, &dg);
    for (size_t i = 0; i < n; i++) /* until a failure of this copy says otherwise (settle) */
        e->g.frozen_ok[i] = !rc && t[i].frozen;
    memset(&e->cp, 0, sizeof(e->cp));
    e->cp.pending = hg || dg;
    e->cp.step = step;
    e->cp.host_gen = hg;
    e->cp.dev_gen = dg;
    e->cp.rc = rc;
    if (!rc && !e->cp.pending)
        ckpt__seal(e, step); /* nothing to copy */
    return rc;
}

/* A snapshot held in memory only (not a checkpoint's) that will not be held: logged and
   the event snapshot_failed; the generation before stays (I16). Returns rc. */
static int snapshot_failed(ckpt_engine *e, int64_t step, int rc, const char *what, const char *why)
{
    RK_LOG_WARN(RK_SUB_CKPT, "snapshot of step %" PRId64 " %s (%s)", step, what, why);
    RK_EVENT(e->ev, "snapshot_failed", RK_EV_I("step", step), RK_EV_S("reason", why), RK_EV_S("error", rk_strerror(rc)));
    return rc;
}

/* The copy under way gave up on at a deadline (I15): whatever it copies is never held nor
   written, since the caller's buffers now move on under it. Reached once a copy: a wait
   that finds it given up already only looks (ckpt__settle). */
static int give_up(ckpt_engine *e)
{
    char why[512];
    snprintf(why, sizeof(why), "%s", rk_last_error());
    RK_EVENT(e->ev, "copy_timeout", RK_EV_I("step", e->cp.step), RK_EV_B("ckpt", e->cp.job));
    if (!e->cp.torn && !e->cp.job) {
        e->cp.torn = true;
        snapshot_failed(e, e->cp.step, RK_E_TIMEOUT, "not held: its copy did not finish in time", why);
    } else if (!e->cp.torn) {
        e->cp.torn = true;
        ckpt_abandon(e); /* its writer never commits it (I10) */
        pthread_mutex_lock(&e->mu);
        note_failure(e, e->cp.step, RK_E_TIMEOUT);
        pthread_mutex_unlock(&e->mu);
        RK_LOG_ERR(RK_SUB_CKPT, "checkpoint of step %" PRId64 " failed: its copy into staging did not finish in time (%s)",
                   e->cp.step, why);
        RK_EVENT(e->ev, "ckpt_failed", RK_EV_I("step", e->cp.step), RK_EV_S("reason", why),
                 RK_EV_S("error", rk_strerror(RK_E_TIMEOUT)));
    }
    return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_TIMEOUT, "checkpoint of step %" PRId64 ": the copy into staging "
                    "still runs (%s)", e->cp.step, why);
}

/* A copy given up on that still runs: RK_E_TIMEOUT, without a wait, a log line or an
   event (give_up said it once). */
static int still_torn(ckpt_engine *e)
{
    rk__set_last_error("the copy of step %" PRId64 " into staging, given up on at its deadline, still runs",
                       e->cp.step);
    return RK_E_TIMEOUT;
}

/* Waits for the copy under way (I15) until deadline_ns, or only looks once it was given up
   on: its bound was spent once, and every later wait goes on at once until it ends (only
   then can a fresh copy start). Once both batches are done, holds the snapshot if neither
   failed nor was given up on. */
int ckpt__settle(ckpt_engine *e, bool host_only, int64_t deadline_ns)
{
    if (!e->cp.pending)
        return 0;
    if (e->cp.torn)
        deadline_ns = 0;
    if (!e->cp.host_done) {
        int rc = ckpt_copy_wait(e->host_copy, e->cp.host_gen, deadline_ns);
        if (rc == RK_E_TIMEOUT)
            return e->cp.torn ? still_torn(e) : give_up(e);
        e->cp.host_done = true;
        if (rc && !e->cp.rc)
            e->cp.rc = rc;
    }
    if (host_only && (e->cp.rc || e->cp.dev_gen))
        return e->cp.rc; /* the device part is the caller's to wait for later */
    if (e->cp.dev_gen) {
        int rc = ckpt_copy_wait(e->dev_copy, e->cp.dev_gen, deadline_ns);
        if (rc == RK_E_TIMEOUT)
            return e->cp.torn ? still_torn(e) : give_up(e);
        if (rc && !e->cp.rc)
            e->cp.rc = rc;
    }
    e->cp.pending = false;
    int rc = e->cp.torn ? RK_E_TIMEOUT : e->cp.rc;
    if (!rc)
        ckpt__seal(e, e->cp.step);
    else
        memset(e->g.frozen_ok, 0, e->g.held_cap * sizeof(*e->g.frozen_ok));
    if (e->cp.job) { /* for the writer, once a later batch replaced this one (job_copied) */
        atomic_store(&e->job.copy_rc, rc);
        atomic_store(&e->job.copy_settled, true);
    } else if (rc && !e->cp.torn) {
        char why[512];
        snprintf(why, sizeof(why), "%s", rk_last_error());
        snapshot_failed(e, e->cp.step, rc, "not held: its copy failed", why);
    }
    return rc;
}

int ckpt_copied(ckpt_engine *e, bool host_only, int64_t deadline_ns)
{
    return ckpt__settle(e, host_only, deadline_ns);
}

/* Waits until no checkpoint is in flight, at most a quarter of timeout_ms; RK_E_BUSY
   (skipped) if the previous one is still being written then (I3). The bound is well below
   timeout_ms, the deadline of every collective: a slow disk on one rank must not make the
   others' allreduce give up while this rank's training thread waits here. */
static int wait_turn(ckpt_engine *e, int64_t step, int64_t t0)
{
    if (!ckpt_busy(e))
        return 0;
    RK_LOG_INFO(RK_SUB_CKPT, "checkpoint of step %" PRId64 " waits for the previous one", step);
    bool idle = wait_idle(e, rk__deadline_ns(e->timeout_ms / 4));
    RK_EVENT(e->ev, "ckpt_delayed", RK_EV_I("step", step), RK_EV_D("waited_ms", rk__ms_since(t0)));
    if (idle)
        return 0;
    char why[900];
    describe_busy(e, why, sizeof(why));
    RK_EVENT(e->ev, "ckpt_skipped", RK_EV_I("step", step), RK_EV_S("reason", why));
    return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_BUSY, "checkpoint of step %" PRId64 " skipped after waiting %d ms: %s",
                    step, e->timeout_ms / 4, why);
}

/* A checkpoint that could not start on this rank: reported by ckpt_wait, and the other
   ranks of the attempt are told at once that this rank's part will not come. */
static int not_started(ckpt_engine *e, int64_t step, int rc)
{
    pthread_mutex_lock(&e->mu);
    int rank = e->rank, world = e->world;
    uint64_t nonce = e->nonce;
    if (rc != RK_E_BUSY)
        note_failure(e, step, rc);
    pthread_mutex_unlock(&e->mu);
    if (rc != RK_E_BUSY)
        RK_EVENT(e->ev, "ckpt_failed", RK_EV_I("step", step), RK_EV_S("reason", rk_last_error()),
                 RK_EV_S("error", rk_strerror(rc)));
    if (world > 1)
        ckpt__note_skip(e, step, rank, nonce, rk_last_error());
    return rc;
}

/* The copy before is settled (bounded), then the generations turn (I16). */
static int settled_for_next(ckpt_engine *e)
{
    if (ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)) == RK_E_TIMEOUT && e->cp.pending)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "snapshot: the copy of step %" PRId64 " into staging still runs", e->cp.step);
    ckpt__next_gen(e);
    return 0;
}

int ckpt_snapshot_take(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int rc = settled_for_next(e);
    if (!rc)
        rc = ckpt__stage(e, t, n, false);
    if (!rc)
        rc = ckpt__hold_copy(e, step, t, n);
    if (rc) {
        char why[512];
        snprintf(why, sizeof(why), "%s", rk_last_error());
        snapshot_failed(e, step, rc, "not taken", why);
        rk__set_last_error("snapshot of step %" PRId64 " not taken: %s", step, why);
    }
    return rc;
}

int ckpt_start(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int64_t t0 = rk__mono_ns();
    if (step == ckpt_last_committed(e))
        return 0; /* already committed under this label */
    int rc = wait_turn(e, step, t0);
    if (!rc)
        rc = settled_for_next(e);
    if (!rc)
        rc = ckpt__stage(e, t, n, false);
    if (!rc)
        rc = plan(e, t, n);
    if (!rc)
        rc = ckpt__hold_copy(e, step, t, n);
    if (rc)
        return not_started(e, step, rc);
    struct ckpt_job *j = &e->job;
    for (size_t i = 0; i < j->m.n; i++) /* the previous job's block checksums */
        free(e->mine[i].blocks);
    memset(j, 0, sizeof(*j));
    atomic_init(&j->fate, JOB_OPEN);
    atomic_init(&j->waiting, CKPT_WAIT_NONE);
    atomic_init(&j->waiting_since_ns, 0);
    atomic_init(&j->copy_rc, 0);
    atomic_init(&j->copy_settled, false);
    e->cp.job = true;
    j->step = step;
    j->m.step = step;
    j->m.rank = e->rank;
    j->m.world = e->world;
    j->m.nonce = e->nonce;
    j->m.t = e->mine;
    j->copy_host = e->cp.host_gen;
    j->copy_dev = e->cp.dev_gen;
    fmt_tmp_name(j->tmpname, sizeof(j->tmpname), step, j->m.nonce);
    for (size_t i = 0; i < n; i++) {
        j->n_all += t[i].flags ? (size_t)e->world : 1; /* entries in all the manifests */
        /* bytes of the whole checkpoint: a sharded tensor's global rows; per-rank state
           counted as this rank's times the world (other ranks' sizes are not known here) */
        j->bytes_all += (t[i].flags & RK_SHARDED) && t[i].shape[0] > 0
                            ? t[i].nbytes / (uint64_t)t[i].shape[0] * (uint64_t)t[i].rows
                            : (t[i].flags & RK_PER_RANK) ? t[i].nbytes * (uint64_t)e->world : t[i].nbytes;
        if (!t[i].flags && e->plan[i] != e->rank)
            continue;
        fmt_tensor *f = &e->mine[j->m.n++];
        memset(f, 0, sizeof(*f));
        f->name = (char *)t[i].name;
        f->dtype = t[i].dtype;
        f->ndim = t[i].ndim;
        for (int d = 0; d < t[i].ndim; d++)
            f->shape[d] = t[i].shape[d];
        f->nbytes = t[i].nbytes;
        f->order = (uint32_t)i;
        f->rank = e->rank;
        f->data = e->g.staging + e->g.held_off[i];
        f->kind = ckpt__kind(t[i].flags);
        f->rows = t[i].rows;
        f->row0 = t[i].row0;
    }
    j->stall_ms = rk__ms_since(t0);
    j->dispatch_ns = rk__mono_ns();
    pthread_mutex_lock(&e->mu);
    e->job_region = e->g.staging;
    e->busy_since_ns = j->dispatch_ns;
    e->state = CKPT_QUEUED;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

bool ckpt_abandon(ckpt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    int fate = JOB_OPEN;
    bool done = e->state != CKPT_IDLE && atomic_compare_exchange_strong(&e->job.fate, &fate, JOB_ABANDONED);
    if (!done && fate == JOB_COMMITTING) /* it commits, but removes nothing a restore may read now (I6) */
        atomic_compare_exchange_strong(&e->job.fate, &fate, JOB_COMMIT_ONLY);
    int64_t step = e->job.step;
    if (done) { /* an event, not a failure for ckpt_wait (I7); a commit that began goes on (I10) */
        int cap = (int)(sizeof(e->dropped) / sizeof(e->dropped[0]));
        if (e->ndropped == cap) /* the oldest goes: rank 0 removed it at a later start */
            memmove(e->dropped[0], e->dropped[1], sizeof(e->dropped[0]) * (size_t)(cap - 1));
        else
            e->ndropped++;
        snprintf(e->dropped[e->ndropped - 1], sizeof(e->dropped[0]), "%s", e->job.tmpname);
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    if (done)
        RK_LOG_INFO(RK_SUB_CKPT, "checkpoint of step %" PRId64 " abandoned: it will not be committed", step);
    return done;
}

void ckpt_request_clean(ckpt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    e->clean_pending = true;
    pthread_mutex_unlock(&e->mu);
}

void ckpt_set_membership(ckpt_engine *e, int rank, int world, uint64_t epoch)
{
    ckpt_abandon(e); /* the commit in flight belongs to the old membership */
    pthread_mutex_lock(&e->mu);
    e->rank = rank;
    e->world = world;
    e->epoch = epoch;
    /* Manifests of an attempt under another membership never match this one's. */
    e->nonce = e->base_nonce ^ (epoch * 0x9e3779b97f4a7c15ull);
    pthread_mutex_unlock(&e->mu);
}
