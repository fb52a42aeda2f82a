/*
 * ckpt/ckpt.c - the asynchronous checkpoint engine's life cycle and its job slot: create,
 * start, wait, abandon, destroy, and the membership the jobs are written under.
 *
 * Purpose: take a consistent copy of the registered tensors at a step boundary while
 * blocking training only for a memcpy, and make it a committed, verifiable checkpoint
 * (docs/FORMAT.md) without ever exposing a partial one. The copy and the snapshots held
 * in memory are snapshot.c's (design in snapshot.h, invariants S1-S7); the work of the
 * writer thread and the job's result are writer.c's (W1-W5); the directory's order and
 * retention ckpt_dir.c's (D1-D2). This file owns one job slot and the engine around it.
 *
 * Invariants (tests/test_ckpt.c and tests/test_hang.c name the one each test checks):
 *  J1  At most one checkpoint is in flight: one job slot, reused; its arrays (the plan,
 *      the manifest's tensors) change only while the writer is idle.
 *  J2  A checkpoint due while the previous is still in flight waits for it up to
 *      timeout_ms / 4 (logged, event ckpt_delayed), then is skipped (logged, event
 *      ckpt_skipped, RK_E_BUSY): never a queue, and never long enough for the other
 *      ranks' collectives (bounded by timeout_ms) to give up on this one. Every wait for
 *      the writer asks the member_lost check (ckpt_config): a job whose commit waits for
 *      a member that is gone is abandoned at once, not waited out.
 *  J3  Every failure of a started checkpoint is reported once: by ckpt_wait (rk_wait),
 *      the log and the event ckpt_failed with its reason. Earlier checkpoints stay intact.
 *      A checkpoint abandoned because the membership changed (ckpt_abandon: a member lost,
 *      the recovery's new membership, or another member that abandoned the attempt) did
 *      not fail on its own: it is only the event (ckpt_failed with "abandoned": true), never
 *      an error of ckpt_wait. A failure is no longer reported once a checkpoint of the
 *      same or a later step commits: that state is safe on disk.
 *  J4  A job carries the membership (rank, world, nonce) it was started under and writes
 *      in its own temporary directory '.tmp-step-<S>-<nonce>': a change of membership
 *      abandons the commit in flight, and the nonce of the new membership differs, so
 *      shards of two attempts at one step never mix, and a fenced or stale writer can
 *      never touch a file of the attempt that commits.
 *  J5  Nothing on the training thread waits on the disk without a deadline. The job in
 *      flight is abandoned at once (ckpt_abandon) by a compare-and-swap on its fate; the
 *      writer claims the commit by the same swap right before the commit's first rename,
 *      so an abandoned job is never committed, and one whose commit began is never called
 *      abandoned. A writer stuck in the kernel (a disk that stopped answering) keeps
 *      running on its own: its job slot is not reused, the region it reads stays mapped
 *      (writer.c W5), and ckpt_destroy leaves it the engine (retained, never freed) instead of
 *      joining it. Only this file abandons a job: the snapshot side tells the writer how
 *      a job's copy ended (ckpt__copy_outcome), and the writer fails the job.
 *  J6  ckpt_wait waits for a job's result, not for its retention: once the commit is done
 *      (or failed) the writer publishes the result and releases its pin, then removes
 *      what retention drops with the slot still RUNNING (a new job waits for it as for
 *      any job in flight, J2; ckpt_destroy too). A restore waits for that retention first,
 *      bounded (ckpt_retention_wait), so that it never lists a checkpoint being removed.
 *  J7  Whether a label is committed already is rank 0's to say: a member may not know of a
 *      commit it took part in (its job was abandoned by a change of membership while it
 *      waited for the commit that rank 0 went on to make, J5), so members can differ. Rank 0
 *      asked for a label it committed makes no attempt and says so in the attempt's
 *      directory (note COMMITTED); a member that started the attempt counts the step as
 *      committed when it reads the note. Asked again after waiting for the job in flight,
 *      which may be the one that committed it. (Before: rank 0 skipped silently and the
 *      other member waited out its timeout for a directory that never came.)
 *
 * States of the job slot and the function for each transition:
 *
 *      IDLE --ckpt_start (plan, snapshot copy begun, region pinned)--> QUEUED
 *      QUEUED --the writer picks it (ckpt__writer_main)--> RUNNING
 *      RUNNING --the writer ends it: committed or failed (writer.c), pin released, result
 *               published (J6), then the retention of a commit--> IDLE
 *      QUEUED/RUNNING --ckpt_abandon: the job fails at the writer's next check, or when its
 *                       stuck operation returns; the training thread does not wait
 *      QUEUED/RUNNING --ckpt_start: waits for IDLE up to timeout_ms / 4, else skipped (J2)
 *      any --ckpt_hold, ckpt_hold_open, ckpt_load (ckpt_restore.c), ckpt_set_membership:
 *            abandon the job in flight first; then staging holds the new snapshot (snapshot.h S2, S3)
 *      any --ckpt_destroy: waits for IDLE until its deadline, then abandons and leaves the
 *            writer the engine (RK_E_TIMEOUT naming what it is stuck in)
 * In IDLE the slot's arrays are the training thread's; in QUEUED and RUNNING they and the
 * pinned region are the writer's, and the job's fate decides who ends it (J5).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_internal.h"

static bool wait_state(ckpt_engine *e, int64_t deadline_ns, bool settled);
static bool wait_idle(ckpt_engine *e, int64_t deadline_ns);

/* A checkpoint that failed on its own (J3): the first since the last ckpt_wait is kept for
   it to report. Called with e->mu held. */
void ckpt__note_failure(ckpt_engine *e, int64_t step, int rc)
{
    if (e->first_err)
        return;
    e->first_err = rc;
    e->first_err_step = step;
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
    e->shared_reads = cfg->shared_reads;
    e->one_copy = cfg->one_copy;
    e->nonce = e->base_nonce = cfg->nonce;
    e->ev = rk__evlog_ref(cfg->ev);
    e->member_lost = cfg->member_lost;
    e->member_lost_arg = cfg->member_lost_arg;
    e->last_committed = -1;
    if ((rc = ckpt__snapshots_init(e, cfg->cuda_stream)) != 0)
        goto out_free;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = -pthread_create(&e->thr, NULL, ckpt__writer_main, e)) != 0) {
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
    ckpt_copy_destroy(&e->s.host_copy, 0);
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
    ckpt__settle(e, false, deadline_ns); /* its failure is the writer's to report (J3, S5) */
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
            /* J5: the writer is in the kernel and may never come back. It keeps the engine;
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
           attempt's directory again (writer.c). */
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
    int src = ckpt__snapshots_end(e, deadline_ns); /* a copy still running keeps its region (snapshot.h S5) */
    if (src && !rc)
        rc = src;
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    fmt_io_activity_fini(&e->act);
    rk__evlog_close(&e->ev);
    for (size_t i = 0; i < e->job.m.n; i++)
        free(e->mine[i].blocks);
    free(e->mine);
    free(e->plan);
    free(e->sizes);
    free(e->at);
    free(e->op);
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

/* Whether no live checkpoint is in flight: idle, the job in flight abandoned, or its
   result out with only its retention left (J6). */
static bool settled_locked(ckpt_engine *e)
{
    return e->state == CKPT_IDLE || ckpt__abandoned(&e->job) || e->job.published;
}

void ckpt_retention_wait(ckpt_engine *e, int64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = deadline_ns / 1000000000, .tv_nsec = deadline_ns % 1000000000};
    pthread_mutex_lock(&e->mu);
    while (e->state != CKPT_IDLE && e->job.published)
        if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&e->mu);
}

/* Waits until the deadline for the writer to be idle (or, if `settled`, for no live job:
   an abandoned one may still be stuck); true if it is. With a member_lost check (J2), it
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
            ckpt_abandon(e); /* nothing if no job is open or its commit began (J5) */
    }
}

static bool wait_idle(ckpt_engine *e, int64_t deadline_ns)
{
    return wait_state(e, deadline_ns, false);
}

/* The plan: which rank writes each tensor (writer.c W2). Only while the writer is idle
   (its job points into these arrays, J1). */
static int plan(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    if (n > e->plan_cap) {
        if (!ckpt__grow((void **)&e->plan, n, sizeof(*e->plan)) ||
            !ckpt__grow((void **)&e->sizes, n, sizeof(*e->sizes)) ||
            !ckpt__grow((void **)&e->at, n, sizeof(*e->at)) ||
            !ckpt__grow((void **)&e->op, n, sizeof(*e->op)) ||
            !ckpt__grow((void **)&e->mine, n, sizeof(*e->mine)))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "checkpoint plan for %zu tensors", n);
        e->plan_cap = e->mine_cap = n;
    }
    for (size_t i = 0; i < n; i++) /* only replicated tensors are assigned (writer.c W2) */
        e->sizes[i] = t[i].flags ? 0 : t[i].nbytes;
    int rc = fmt_assign(e->sizes, n, e->world, e->plan);
    if (rc)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "checkpoint plan for %zu tensors", n);
    return 0;
}

/* Waits until no checkpoint is in flight, at most a quarter of timeout_ms; RK_E_BUSY
   (skipped) if the previous one is still being written then (J2). The bound is well below
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
        ckpt__note_failure(e, step, rc);
    pthread_mutex_unlock(&e->mu);
    if (rc != RK_E_BUSY)
        RK_EVENT(e->ev, "ckpt_failed", RK_EV_I("step", step), RK_EV_S("reason", rk_last_error()),
                 RK_EV_S("error", rk_strerror(rc)));
    if (world > 1)
        ckpt__note_skip(e, step, rank, nonce, rk_last_error());
    return rc;
}

/* A label committed already: no attempt; rank 0 tells the others (J7). */
static int known(ckpt_engine *e, int64_t step)
{
    pthread_mutex_lock(&e->mu);
    bool lead = e->rank == 0 && e->world > 1;
    uint64_t nonce = e->nonce;
    pthread_mutex_unlock(&e->mu);
    if (lead)
        ckpt__note_known(e, step, nonce);
    return 0;
}

int ckpt_start(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int64_t t0 = rk__mono_ns();
    if (step == ckpt_last_committed(e))
        return known(e, step); /* already committed under this label */
    struct ckpt_job_copy jc = {.at = NULL};
    int rc = wait_turn(e, step, t0);
    if (!rc && step == ckpt_last_committed(e))
        return known(e, step); /* by the job it waited for */
    if (!rc)
        rc = plan(e, t, n);
    jc.at = e->at;
    jc.op = e->op;
    if (!rc)
        rc = ckpt__snapshot_begin(e, step, t, n, &jc);
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
    j->step = step;
    j->m.step = step;
    j->m.rank = e->rank;
    j->m.world = e->world;
    j->m.nonce = e->nonce;
    j->m.t = e->mine;
    j->copy_host = jc.host_gen;
    j->copy_dev = jc.dev_gen;
    atomic_init(&j->region, jc.region); /* writer.c W5: pinned before the writer has it */
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
        f->data = e->at[i];
        f->kind = ckpt__kind(t[i].flags);
        f->rows = t[i].rows;
        f->row0 = t[i].row0;
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

bool ckpt_abandon(ckpt_engine *e)
{
    pthread_mutex_lock(&e->mu);
    int fate = JOB_OPEN;
    bool done = e->state != CKPT_IDLE && atomic_compare_exchange_strong(&e->job.fate, &fate, JOB_ABANDONED);
    /* one whose commit began commits, but removes nothing a restore may now read (writer.c W4) */
    if (!done && fate == JOB_COMMITTING)
        atomic_compare_exchange_strong(&e->job.fate, &fate, JOB_COMMIT_ONLY);
    int64_t step = e->job.step;
    if (done) { /* an event, not a failure for ckpt_wait (J3); a commit that began goes on (J5) */
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

void ckpt_set_membership(ckpt_engine *e, int rank, int world, uint64_t epoch)
{
    ckpt_abandon(e); /* the commit in flight belongs to the old membership */
    pthread_mutex_lock(&e->mu);
    e->rank = rank;
    e->world = world;
    e->epoch = epoch;
    /* Manifests of an attempt under another membership never match this one's. */
    e->nonce = e->base_nonce ^ (epoch * 0x9e3779b97f4a7c15ull);
    e->clean_pending |= rank == 0; /* ckpt.h: rank 0's writer cleans before its next job */
    pthread_mutex_unlock(&e->mu);
}

int ckpt_hold(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    ckpt_abandon(e); /* the new snapshot's region may be the one the job reads (writer.c W5) */
    return ckpt__hold(e, step, t, n);
}

int ckpt_hold_open(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n, unsigned char **where,
                   const ckpt_snapshot **before)
{
    ckpt_abandon(e);
    return ckpt__hold_open(e, step, t, n, where, before);
}
