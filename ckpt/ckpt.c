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
 *  I2  Staging memory is one region, allocated at the first checkpoint and reused; its
 *      size is the registered bytes (each tensor rounded up to 4 KiB, see I8); it grows
 *      only if the registry grows. At most one checkpoint is in flight.
 *  I3  A checkpoint due while the previous is still in flight waits for it up to
 *      timeout_ms / 4 (logged, event ckpt_delayed), then is skipped (logged, event
 *      ckpt_skipped, RK_E_BUSY): never a queue, and never long enough for the other
 *      ranks' collectives (bounded by timeout_ms) to give up on this one.
 *  I4  Every replicated tensor is written by exactly one rank (fmt_assign), so the
 *      shards of one checkpoint are disjoint and together hold every tensor.
 *  I5  The background thread never calls MPI; every wait it does has a deadline
 *      (timeout_ms for other ranks' shards on rank 0, twice that for learning of the
 *      commit elsewhere).
 *  I6  Retention never removes the checkpoint just committed (the newest of ckpt_list's
 *      order: its commit time is the latest) nor the newest one whose data verify; a
 *      removed directory is first renamed to a '.'-name, so a half-removed checkpoint is
 *      never seen as committed. Re-committing a label exchanges the directories in one
 *      step: a step-<S> exists at every instant (ckpt_dir.c, fmt_commit_dir).
 *  I7  Every failure of a started checkpoint is reported once: by ckpt_wait (rk_wait),
 *      the log and the event ckpt_failed with its reason. Earlier checkpoints stay intact.
 *  I8  Staging holds a complete snapshot of every registered tensor (the held snapshot,
 *      one copy of the registered bytes), of which this rank writes only its share: after
 *      a failure any survivor can give the whole state of that step back (recovery from
 *      memory). The held step is -1 while a copy is under way.
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
 *      only when its layout matches the registry (ckpt_held_matches).
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"

#define ALIGN_UP(x) (((x) + 4095u) & ~(size_t)4095u)

static bool wait_state(ckpt_engine *e, int64_t deadline_ns, bool settled);
static bool wait_idle(ckpt_engine *e, int64_t deadline_ns);

static void emit_result(ckpt_engine *e, const struct ckpt_job *j, int rc)
{
    if (rc == 0) {
        RK_EVENT(e->ev, "ckpt_committed", RK_EV_I("step", j->step), RK_EV_I("bytes", j->bytes_all),
                 RK_EV_D("stall_ms", j->stall_ms), RK_EV_D("persist_ms", rk__ms_since(j->dispatch_ns)),
                 RK_EV_S("io_path", j->m.io_path));
        return;
    }
    RK_LOG_ERR(RK_SUB_CKPT, "checkpoint of step %" PRId64 " failed: %s (%s)", j->step, rk_last_error(),
               rk_strerror(rc));
    RK_EVENT(e->ev, "ckpt_failed", RK_EV_I("step", j->step), RK_EV_S("reason", rk_last_error()),
             RK_EV_S("error", rk_strerror(rc)));
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
        int rc = ckpt__persist(e, &e->job);
        emit_result(e, &e->job, rc); /* e->ev is the engine's own reference (I10) */
        pthread_mutex_lock(&e->mu);
        if (rc == 0 && e->job.step > e->last_committed)
            e->last_committed = e->job.step;
        if (rc != 0 && e->first_err == 0 && !ckpt__abandoned(&e->job))
            e->first_err = rc; /* an abandoned job's failure was recorded by ckpt_abandon */
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
    return atomic_compare_exchange_strong(&j->fate, &open, JOB_COMMITTING) || open == JOB_COMMITTING;
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
    snprintf(path, sizeof(path), "%s/.probe-%d-%d", dir, (int)getpid(), rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
    e->held_step = -1;
    e->ev = rk__evlog_ref(cfg->ev);
    e->last_committed = -1;
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
    rk__evlog_close(&e->ev);
    free(e->dir);
    free(e->io);
    free(e);
    return rc;
}

/* What the writer is doing, for an error that says where it is stuck. */
static void describe_busy(ckpt_engine *e, char *buf, size_t cap)
{
    char op[640];
    pthread_mutex_lock(&e->mu);
    int64_t step = e->job.step, since = e->busy_since_ns;
    pthread_mutex_unlock(&e->mu);
    if (!fmt_io_activity_describe(&e->act, op, sizeof(op)))
        snprintf(op, sizeof(op), "no file operation yet");
    snprintf(buf, cap, "the checkpoint of step %" PRId64 " has been in flight for %.0f ms (writer's last operation: %s)",
             step, rk__ms_since(since), op);
}

static int busy_error(ckpt_engine *e, const char *what)
{
    char why[900];
    describe_busy(e, why, sizeof(why));
    return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT, "%s: %s", what, why);
}

int ckpt_wait(ckpt_engine *e, int64_t deadline_ns)
{
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

static void unmap_retired(ckpt_engine *e)
{
    if (e->retired)
        munmap(e->retired, e->retired_cap);
    e->retired = NULL;
    e->retired_cap = 0;
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
    }
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    fmt_io_activity_fini(&e->act);
    rk__evlog_close(&e->ev);
    unmap_retired(e);
    if (e->staging)
        munmap(e->staging, e->staging_cap);
    free(e->mine);
    free(e->held_off);
    free(e->held_len);
    free(e->plan);
    free(e->sizes);
    free(e->dir);
    free(e->io);
    free(e);
    return rc;
}

bool ckpt_idle_by(ckpt_engine *e, int64_t deadline_ns)
{
    return wait_state(e, deadline_ns, true);
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
   an abandoned one may still be stuck); true if it is. */
static bool wait_state(ckpt_engine *e, int64_t deadline_ns, bool settled)
{
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    pthread_mutex_lock(&e->mu);
    while (!(settled ? settled_locked(e) : e->state == CKPT_IDLE))
        if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT)
            break;
    bool ok = settled ? settled_locked(e) : e->state == CKPT_IDLE;
    pthread_mutex_unlock(&e->mu);
    return ok;
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
   while a writer is busy: a region it may still read is retired, not unmapped (I10). */
static int stage(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    if (n > e->held_cap) {
        if (!grow((void **)&e->held_off, n, sizeof(*e->held_off)) ||
            !grow((void **)&e->held_len, n, sizeof(*e->held_len)))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "checkpoint staging for %zu tensors", n);
        e->held_cap = n;
    }
    size_t need = 0;
    for (size_t i = 0; i < n; i++)
        need += ALIGN_UP(t[i].nbytes);
    bool busy = ckpt_busy(e);
    if (!busy)
        unmap_retired(e);
    if (need <= e->staging_cap)
        return 0;
    if (busy && e->retired)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_BUSY,
                        "checkpoint staging must grow while an abandoned writer still reads two older regions");
    void *p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -errno, "checkpoint staging of %zu bytes: %s", need, strerror(errno));
    e->held_step = -1;
    if (busy) {
        e->retired = e->staging;
        e->retired_cap = e->staging_cap;
    } else if (e->staging) {
        munmap(e->staging, e->staging_cap);
    }
    e->staging = p;
    e->staging_cap = need;
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
    for (size_t i = 0; i < n; i++)
        e->sizes[i] = t[i].nbytes;
    int rc = fmt_assign(e->sizes, n, e->world, e->plan);
    if (rc)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "checkpoint plan for %zu tensors", n);
    return 0;
}

/* The held snapshot's layout for t[0..n) in staging; nothing held yet (I8). */
static void hold_layout(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    size_t off = 0;
    e->held_step = -1;
    for (size_t i = 0; i < n; i++) {
        e->held_off[i] = off;
        e->held_len[i] = t[i].nbytes;
        off += ALIGN_UP(t[i].nbytes);
    }
    e->held_n = n;
}

/* Copies every tensor into staging: the held snapshot of `step` (I8). */
static void hold_copy(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    hold_layout(e, t, n);
    for (size_t i = 0; i < n; i++)
        if (t[i].nbytes)
            memcpy(e->staging + e->held_off[i], t[i].ptr, t[i].nbytes);
    e->held_step = step;
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
    if (rc != RK_E_BUSY && e->first_err == 0)
        e->first_err = rc;
    pthread_mutex_unlock(&e->mu);
    if (rc != RK_E_BUSY)
        RK_EVENT(e->ev, "ckpt_failed", RK_EV_I("step", step), RK_EV_S("reason", rk_last_error()),
                 RK_EV_S("error", rk_strerror(rc)));
    if (world > 1)
        ckpt__note_skip(e, step, rank, nonce, rk_last_error());
    return rc;
}

int ckpt_start(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int64_t t0 = rk__mono_ns();
    if (step == ckpt_last_committed(e))
        return 0; /* already committed under this label */
    int rc = wait_turn(e, step, t0);
    if (!rc)
        rc = stage(e, t, n);
    if (!rc)
        rc = plan(e, t, n);
    if (rc)
        return not_started(e, step, rc);
    hold_copy(e, step, t, n);
    struct ckpt_job *j = &e->job;
    memset(j, 0, sizeof(*j));
    atomic_init(&j->fate, JOB_OPEN);
    j->step = step;
    j->m.step = step;
    j->m.rank = e->rank;
    j->m.world = e->world;
    j->m.nonce = e->nonce;
    j->m.t = e->mine;
    fmt_tmp_name(j->tmpname, sizeof(j->tmpname), step, j->m.nonce);
    for (size_t i = 0; i < n; i++) {
        j->n_all++;
        j->bytes_all += t[i].nbytes;
        if (e->plan[i] != e->rank)
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
        f->data = e->staging + e->held_off[i];
    }
    j->stall_ms = rk__ms_since(t0);
    j->dispatch_ns = rk__mono_ns();
    pthread_mutex_lock(&e->mu);
    e->busy_since_ns = j->dispatch_ns;
    e->state = CKPT_QUEUED;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ---- the held snapshot and membership changes (recovery) --------------------------------- */

int ckpt__hold_space(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    /* Overwriting staging under a live job would tear what it writes: the job goes first.
       An abandoned writer may still read staging; it never commits what it read (I10). */
    ckpt_abandon(e);
    int rc = stage(e, t, n);
    if (rc)
        return rc;
    hold_layout(e, t, n);
    return 0;
}

int ckpt_hold(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int rc = ckpt__hold_space(e, t, n);
    if (rc)
        return rc;
    hold_copy(e, step, t, n);
    return 0;
}

int64_t ckpt_held_step(const ckpt_engine *e)
{
    return e->held_step;
}

bool ckpt_held_matches(const ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    if (e->held_step < 0 || e->held_n != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (e->held_len[i] != t[i].nbytes)
            return false;
    return true;
}

const void *ckpt_held_tensor(const ckpt_engine *e, size_t i)
{
    return e->held_step >= 0 && i < e->held_n ? e->staging + e->held_off[i] : NULL;
}

int ckpt_restore_held(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    if (!ckpt_held_matches(e, t, n))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_STATE, "no snapshot of these tensors is held in memory");
    for (size_t i = 0; i < n; i++)
        if (t[i].nbytes)
            memcpy(t[i].ptr, e->staging + e->held_off[i], t[i].nbytes);
    return 0;
}

bool ckpt_abandon(ckpt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    int fate = JOB_OPEN;
    bool done = e->state != CKPT_IDLE && atomic_compare_exchange_strong(&e->job.fate, &fate, JOB_ABANDONED);
    int64_t step = e->job.step;
    if (done) { /* its failure, reported once by ckpt_wait; a commit that began goes on (I10) */
        if (e->first_err == 0)
            e->first_err = RK_E_ABORTED;
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
    /* Manifests of an attempt under another membership never match this one's. */
    e->nonce = e->base_nonce ^ (epoch * 0x9e3779b97f4a7c15ull);
    pthread_mutex_unlock(&e->mu);
}
