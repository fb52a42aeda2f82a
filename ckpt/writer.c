/*
 * ckpt/writer.c - the engine's writer: the background thread that turns the job in flight
 * (ckpt.c) into a committed checkpoint, and the job's result. For one job: this rank's
 * shard, each tensor written (and checksummed) as soon as the copy that brings it into
 * staging is done (snapshot.h S10), then the whole copy's outcome (S5), then the shard's
 * manifest, in the attempt's '.tmp-step-<S>-<nonce>/', then
 *   rank 0:  wait (bounded) for every rank's manifest, write index.h5 (with the commit
 *            time, ckpt_dir.c), claim the commit, commit by rename (or exchange with an
 *            abandoned timeline's directory of the same label), hand over to retention
 *            (ckpt_dir.c);
 *   others:  wait (bounded) to learn of the commit: step-…/shard-<rank>.ok carrying this
 *            job's nonce, or rank 0's FAILED note in the temporary directory; a rank
 *            whose own shard fails leaves FAILED-<rank>, so rank 0 stops waiting for it.
 * Rank 0 creates the temporary directory; the others wait for it (bounded), never create
 * it. Then the result: the events, the failure kept for ckpt_wait (ckpt.c J3), the pin
 * released and the slot IDLE again.
 *
 * Invariants (tests/test_ckpt.c, tests/test_crash.c and tests/test_hang.c name them):
 *  W1  Nothing named step-<12 digits> exists before every shard of it is fsync'd, its
 *      checksums are recorded in fsync'd manifests, index.h5 is fsync'd, and the rename
 *      from the '.tmp-step-…' directory is followed by an fsync of the parent.
 *  W2  Every replicated tensor is written by exactly one rank (fmt_assign: ckpt.c's plan),
 *      every sharded tensor's slice and every per-rank tensor by the rank that holds it, so
 *      the shards of one checkpoint are disjoint and together hold every tensor.
 *  W3  The writer never calls MPI (the shared directory is the rendezvous); every wait it
 *      does has a deadline (timeout_ms for the copy and for other ranks' shards on rank 0,
 *      twice that plus a second for learning of the commit elsewhere).
 *  W4  Retention never removes the checkpoint just committed (the newest of ckpt_list's
 *      order: its commit time is the latest) nor the newest one that verifies (the one just
 *      committed if it reopens intact: its data were checksummed as they were written, and
 *      are not read again; an older one by its data re-read against its checksums), nor
 *      anything while a restore may read: a commit that began before ckpt_abandon (a
 *      recovery's ckpt_set_membership, a ckpt_load) completes without its retention, left
 *      to the next commit (with RK_KEEP=1 it removed the checkpoint being restored); a
 *      removed directory is first renamed to a '.'-name, so a half-removed checkpoint is
 *      never seen as committed. Re-committing a label exchanges the directories in one
 *      step: a step-<S> exists at every instant (ckpt_dir.c, fmt_commit_dir).
 *  W5  The writer pins the region it reads: the job carries its pin (job.region, set by
 *      ckpt_start before the job is handed over, cleared here when the job ends): a pinned region is never
 *      unmapped (a replaced one is retired until unpinned, ckpt_destroy leaves a stuck
 *      writer's to it) and never written while its job may commit (the turn puts it aside,
 *      snapshot.h S6; ckpt_load and ckpt_hold abandon the job before they write it, and an
 *      abandoned job is never committed, ckpt.c J5). The writer reads a tensor in staging
 *      only once the copy that brings it there is done (snapshot.h S10).
 *  W6  No manifest is written for a shard whose copy into staging did not end whole: the
 *      whole copy is waited for (bounded by timeout_ms from the job's start) and its
 *      outcome taken after the shard's tensors are written and before its manifest, so a
 *      copy that failed or was given up on halfway commits nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_internal.h"


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

static void emit_result(ckpt_engine *e, struct ckpt_job *j, int rc)
{
    if (rc == 0) {
        RK_EVENT(e->ev, "ckpt_committed", RK_EV_I("step", j->step), RK_EV_I("bytes", j->bytes_all),
                 RK_EV_D("stall_ms", j->stall_ms), RK_EV_D("persist_ms", rk__ms_since(j->dispatch_ns)),
                 RK_EV_S("io_path", j->m.io_path));
        return;
    }
    bool abandoned = ckpt__abandoned(j);
    if (abandoned) /* by a change of membership: the recovery's event, not a failure (ckpt.c J3) */
        RK_LOG_INFO(RK_SUB_CKPT, "checkpoint of step %" PRId64 " not committed: %s", j->step, rk_last_error());
    else
        RK_LOG_ERR(RK_SUB_CKPT, "checkpoint of step %" PRId64 " failed: %s (%s)", j->step, rk_last_error(),
                   rk_strerror(rc));
    RK_EVENT(e->ev, "ckpt_failed", RK_EV_I("step", j->step), RK_EV_S("reason", rk_last_error()),
             RK_EV_S("error", rk_strerror(rc)), RK_EV_B("abandoned", abandoned));
}

/* Until the copy the job writes from is done (snapshot.h S5): all of it (op CKPT_OP_ALL,
   W6), or the copy `op` of its host batch, or its device batch (CKPT_OP_DEVICE): what
   brings one tensor into staging (S10; CKPT_OP_NONE: nothing to wait for). The training
   thread tells how the copy ended once it settled it (ckpt__copy_outcome): when a later
   batch replaced it on the copy engine (the next snapshot's), or when it gave the copy up
   at its deadline (the job then fails here, and nothing more of staging is read). Looked
   at in slices, as is an abandon meanwhile; j->copy_deadline bounds it all. */
static int job_copied(ckpt_engine *e, struct ckpt_job *j, size_t op)
{
    int rc;
    int64_t deadline = j->copy_deadline;
    if (op == CKPT_OP_NONE)
        return 0;
    for (;;) {
        int64_t slice = rk__deadline_ns(LOST_POLL_MS), until = slice < deadline ? slice : deadline;
        rc = 0;
        if (j->copy_host && op != CKPT_OP_DEVICE)
            rc = ckpt_copy_wait_op(e->s.host_copy, j->copy_host, op, until);
        if (!rc && j->copy_dev && (op == CKPT_OP_ALL || op == CKPT_OP_DEVICE))
            rc = ckpt_copy_wait(e->s.dev_copy, j->copy_dev, until);
        if (rc != RK_E_TIMEOUT || until == deadline || atomic_load(&j->copy_settled))
            break;
        if (ckpt__abandoned(j))
            return rk__fail(RK_SUB_CKPT, RK_LOG_INFO, RK_E_ABORTED, "abandoned while its copy still ran");
    }
    if ((rc == RK_E_ABORTED || rc == RK_E_TIMEOUT) && atomic_load(&j->copy_settled)) {
        rc = atomic_load(&j->copy_rc);
        if (rc)
            rk__set_last_error("it failed or did not finish in time (%s)", rk_strerror(rc));
    }
    return rc;
}

/* The shard writer's hook (fmt_manifest.ready): tensor i of the manifest is in staging. */
static int tensor_copied(void *arg, size_t i)
{
    ckpt_engine *e = arg;
    struct ckpt_job *j = &e->job;
    int rc = job_copied(e, j, e->op[j->m.t[i].order]);
    if (rc) {
        char why[512];
        snprintf(why, sizeof(why), "%s", rk_last_error());
        rk__set_last_error("the copy into staging failed: %s", why);
    }
    return rc;
}

void ckpt__copy_outcome(ckpt_engine *e, int rc)
{
    atomic_store(&e->job.copy_rc, rc);
    atomic_store(&e->job.copy_settled, true);
}


#define PATH_CAP 4096
#define SUB_CAP (PATH_CAP + 128) /* a path below a PATH_CAP directory */

static void backoff(int64_t *ns)
{
    rk__sleep_ns(*ns);
    if (*ns < 50 * 1000000LL)
        *ns *= 2;
}

/* A note in the temporary directory: `name` is FAILED (rank 0: this attempt will not be
   committed), FAILED-<rank> (that rank's shard will not come) or COMMITTED (rank 0: the
   step is committed already, this attempt is not made: ckpt.c J7). The first word is the
   attempt's nonce, so a note left by another attempt at the same step is ignored. */
static void write_note(const char *tmpdir, const char *name, uint64_t nonce, const char *why)
{
    char path[SUB_CAP];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644); /* never through a link */
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f && fd >= 0)
        close(fd);
    if (f) {
        fprintf(f, "%016" PRIx64 " %s\n", nonce, why);
        fclose(f);
    }
}

/* Whether tmpdir holds the note `name` of this attempt; its reason goes to why. */
static bool noted(const char *tmpdir, const char *name, uint64_t nonce, char *why, size_t cap)
{
    char path[SUB_CAP], line[512] = "";
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    bool ours = fgets(line, sizeof(line), f) && strtoull(line, NULL, 16) == nonce && strlen(line) > 17;
    fclose(f);
    if (ours) {
        line[strcspn(line, "\n")] = '\0';
        snprintf(why, cap, "%s", line + 17);
    }
    return ours;
}

/* The attempt's directory is gone without a commit: a member that abandoned it removed
   it at the end of the job (ckpt_destroy), or rank 0 after it failed. */
static bool attempt_gone(const char *tmpdir)
{
    struct stat st;
    return stat(tmpdir, &st) != 0 && errno == ENOENT;
}

static int removed(struct ckpt_job *j, const char *tmpdir)
{
    int open = JOB_OPEN; /* abandoned by another member: so it is here too (ckpt.c J3) */
    atomic_compare_exchange_strong(&j->fate, &open, JOB_ABANDONED);
    return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_ABORTED,
                    "step %" PRId64 ": %s was removed before a commit (another member abandoned the attempt)",
                    j->step, tmpdir);
}

static int abandoned(const struct ckpt_job *j)
{
    return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_ABORTED,
                    "step %" PRId64 ": abandoned (a member was lost, this worker was fenced, or the job is ending): "
                    "it is not committed", j->step);
}

struct skip_note {
    char tmpdir[PATH_CAP], name[32], why[512];
    uint64_t nonce;
    int64_t deadline; /* another rank than 0: how long it waits for rank 0's directory */
};

/* Waits (bounded) for rank 0's temporary directory; false at the deadline, or at once if
   the job j (NULL: none) was abandoned. */
static bool dir_appears(const char *tmpdir, int64_t deadline, struct ckpt_job *j)
{
    int64_t pause = 1000000;
    for (;;) {
        struct stat st;
        if (stat(tmpdir, &st) == 0 && S_ISDIR(st.st_mode))
            return true;
        if ((j && ckpt__abandoned(j)) || rk__deadline_passed(deadline))
            return false;
        backoff(&pause);
    }
}

/* A skip note is being written (by a thread that owns nothing of an engine's). */
static atomic_bool note_busy;

static void *skip_note_thread(void *arg)
{
    struct skip_note *n = arg;
    bool there = n->deadline ? dir_appears(n->tmpdir, n->deadline, NULL) : mkdir(n->tmpdir, 0755) == 0 || errno == EEXIST;
    if (there)
        write_note(n->tmpdir, n->name, n->nonce, n->why);
    atomic_store(&note_busy, false);
    free(n);
    return NULL;
}

/* The note `name` of the attempt (step, nonce), written by a short-lived thread (rank 0
   creates the directory for it; another rank waits for rank 0's). */
static void note(ckpt_engine *e, int64_t step, int rank, uint64_t nonce, const char *name, const char *why)
{
    bool idle = false;
    if (!atomic_compare_exchange_strong(&note_busy, &idle, true))
        return; /* one is still being written (a stuck disk): the waiters' deadline bounds them */
    struct skip_note *n = calloc(1, sizeof(*n));
    char tmpname[64];
    pthread_t t;
    pthread_attr_t a;
    if (!n) {
        atomic_store(&note_busy, false);
        return;
    }
    fmt_tmp_name(tmpname, sizeof(tmpname), step, nonce);
    snprintf(n->tmpdir, sizeof(n->tmpdir), "%s/%s", e->dir, tmpname);
    snprintf(n->name, sizeof(n->name), "%s", name);
    snprintf(n->why, sizeof(n->why), "%s", why);
    n->nonce = nonce;
    n->deadline = rank == 0 ? 0 : rk__deadline_ns(e->timeout_ms);
    if (rank == 0) {
        pthread_mutex_lock(&e->mu);
        snprintf(e->skipped, sizeof(e->skipped), "%s", tmpname);
        e->skipped_ns = rk__mono_ns();
        pthread_mutex_unlock(&e->mu);
    }
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &a, skip_note_thread, n) != 0) {
        free(n);
        atomic_store(&note_busy, false);
    }
    pthread_attr_destroy(&a);
}

void ckpt__note_skip(ckpt_engine *e, int64_t step, int rank, uint64_t nonce, const char *why)
{
    char name[32];
    snprintf(name, sizeof(name), rank == 0 ? "FAILED" : "FAILED-%d", rank);
    note(e, step, rank, nonce, name, why);
}

void ckpt__note_known(ckpt_engine *e, int64_t step, uint64_t nonce)
{
    note(e, step, 0, nonce, "COMMITTED", "this step is committed already");
}

/* Rank 0 said, in the attempt's directory, that the step is committed already (ckpt.c
   J7): this attempt is not made, and the step counts as committed here too. */
static bool known_committed(struct ckpt_job *j, const char *tmpdir)
{
    char why[512];
    if (!noted(tmpdir, "COMMITTED", j->m.nonce, why, sizeof(why)))
        return false;
    RK_LOG_INFO(RK_SUB_CKPT, "step %" PRId64 ": rank 0 says it is committed already (%s): not written again", j->step,
                why);
    return true;
}

void ckpt__drop_skipped(ckpt_engine *e, int64_t deadline_ns)
{
    pthread_mutex_lock(&e->mu);
    char name[sizeof(e->skipped)];
    snprintf(name, sizeof(name), "%s", e->skipped);
    bool newer = name[0] && (!e->job.tmpname[0] || e->skipped_ns > e->job.dispatch_ns); /* the same step too (J7) */
    int64_t left = e->skipped_ns + 250 * 1000000LL - rk__mono_ns();
    pthread_mutex_unlock(&e->mu);
    if (!newer)
        return;
    while (atomic_load(&note_busy) && !rk__deadline_passed(deadline_ns))
        rk__sleep_ns(1000000);
    if (atomic_load(&note_busy))
        return; /* its note is stuck on the disk: the next start removes the attempt */
    if (left > 0)
        rk__sleep_ns(left);
    const char *names[1] = {name};
    ckpt__drop_attempts(e, names, 1);
}

/* Rank 0: every rank's manifest of this attempt, within the deadline. */
static int gather(ckpt_engine *e, struct ckpt_job *j, const char *tmpdir, fmt_manifest **shards)
{
    char path[SUB_CAP], note[32], why[512];
    int64_t deadline = rk__deadline_ns(e->timeout_ms), pause = 1000000;
    for (int r = 1; r < j->m.world; r++) {
        snprintf(path, sizeof(path), "%s/shard-%d.ok", tmpdir, r);
        snprintf(note, sizeof(note), "FAILED-%d", r);
        ckpt__waiting(j, r);
        for (;;) {
            fmt_manifest *m = NULL;
            if (fmt_manifest_read(path, &m) == 0) {
                if (m->nonce == j->m.nonce && m->step == j->step && m->world == j->m.world && m->rank == r) {
                    shards[r] = m;
                    break;
                }
                fmt_manifest_free(&m);
            }
            if (ckpt__abandoned(j))
                return abandoned(j);
            if (attempt_gone(tmpdir))
                return removed(j, tmpdir);
            if (noted(tmpdir, note, j->m.nonce, why, sizeof(why)))
                return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_ABORTED, "step %" PRId64 ": rank %d could not write its shard: %s",
                                j->step, r, why);
            if (rk__deadline_passed(deadline))
                return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT,
                                "step %" PRId64 ": rank %d's shard did not arrive in %s within %d ms", j->step, r,
                                tmpdir, e->timeout_ms);
            backoff(&pause);
        }
    }
    ckpt__waiting(j, CKPT_WAIT_NONE);
    size_t total = 0;
    for (int r = 0; r < j->m.world; r++)
        total += shards[r]->n;
    if (total != j->n_all)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_COLL_MISMATCH,
                        "step %" PRId64 ": the shards hold %zu tensors, this rank registered %zu (ranks registered different tensors?)",
                        j->step, total, j->n_all);
    return 0;
}

static int commit(ckpt_engine *e, struct ckpt_job *j, const char *tmpdir, const char *tmpname)
{
    char final[64];
    fmt_manifest **shards = calloc((size_t)j->m.world, sizeof(*shards));
    if (!shards)
        return -ENOMEM;
    shards[0] = &j->m;
    int rc = gather(e, j, tmpdir, shards);
    if (rc)
        goto out;
    const char *io_path = j->m.io_path;
    for (int r = 1; r < j->m.world; r++)
        if (strcmp(shards[r]->io_path, io_path) != 0)
            io_path = "mixed";
    if ((rc = fmt_index_write(tmpdir, j->step, j->m.world, shards, io_path, ckpt__commit_ns(e->dir))) != 0)
        goto out;
    if (!ckpt__claim_commit(j)) { /* from here on it is committed or failed, never abandoned */
        rc = abandoned(j);
        goto out;
    }
    /* The same label from an abandoned timeline is exchanged for this one in one step. */
    fmt_step_name(final, sizeof(final), j->step);
    if ((rc = fmt_commit_dir(e->dir, tmpname, final)) != 0)
        goto out;
    if (ckpt__claim_retention(j))
        j->retain = true; /* after the result is out (ckpt.c J6) */
    else
        RK_LOG_INFO(RK_SUB_CKPT, "step %" PRId64 " committed; its retention is left to the next commit (a restore may "
                    "read the checkpoints it would remove)", j->step);
out:
    for (int r = 1; r < j->m.world; r++)
        fmt_manifest_free(&shards[r]);
    free(shards);
    return rc;
}

/* Ranks other than 0: learn whether rank 0 committed this attempt. */
static int await_commit(ckpt_engine *e, struct ckpt_job *j, const char *tmpdir)
{
    char final[64], mine[SUB_CAP], why[512];
    fmt_step_name(final, sizeof(final), j->step);
    snprintf(mine, sizeof(mine), "%s/%s/shard-%d.ok", e->dir, final, j->m.rank);
    int64_t deadline = rk__deadline_ns(2 * (int64_t)e->timeout_ms + 1000), pause = 1000000;
    ckpt__waiting(j, CKPT_WAIT_COMMIT); /* until the job ends: nothing follows this wait */
    for (;;) {
        /* The attempt's directory looked at first: a commit renames it, so the committed
           manifest read after it is found gone was there if it was committed. */
        bool gone = attempt_gone(tmpdir);
        fmt_manifest *m = NULL;
        if (fmt_manifest_read(mine, &m) == 0) {
            bool ours = m->nonce == j->m.nonce && m->step == j->step;
            fmt_manifest_free(&m);
            if (ours)
                return 0;
        }
        if (ckpt__abandoned(j))
            return abandoned(j);
        if (gone)
            return removed(j, tmpdir);
        if (noted(tmpdir, "FAILED", j->m.nonce, why, sizeof(why)))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_ABORTED,
                            "step %" PRId64 ": rank 0 could not commit the checkpoint: %s", j->step, why);
        if (known_committed(j, tmpdir))
            return 0;
        if (rk__deadline_passed(deadline))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT,
                            "step %" PRId64 ": no commit by rank 0 within %d ms", j->step, 2 * e->timeout_ms + 1000);
        backoff(&pause);
    }
}

/* Ranks other than 0 never create the attempt's directory: they wait (bounded) for rank
   0's. A worker that was stopped (SIGSTOP, a frozen VM) and wakes after the others
   removed its attempt's directory then finds it gone and writes nothing, instead of
   creating it anew after the job has moved on, or ended, without it. */
static int await_dir(ckpt_engine *e, struct ckpt_job *j, const char *tmpdir)
{
    ckpt__waiting(j, CKPT_WAIT_DIR);
    bool there = dir_appears(tmpdir, rk__deadline_ns(e->timeout_ms), j);
    ckpt__waiting(j, CKPT_WAIT_NONE);
    if (there)
        return 0;
    if (ckpt__abandoned(j))
        return abandoned(j);
    return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT, "step %" PRId64 ": rank 0 did not create %s within %d ms",
                    j->step, tmpdir, e->timeout_ms);
}

/* The work for one job (the file's header): 0 once committed (or, on a rank other than
   0, known committed), or the failure, its reason in this thread's rk_last_error(). */
static int persist(ckpt_engine *e, struct ckpt_job *j)
{
    char tmpdir[PATH_CAP], path[SUB_CAP];
    const char *tmpname = j->tmpname; /* this attempt's own (ckpt.c J4) */
    snprintf(tmpdir, sizeof(tmpdir), "%s/%s", e->dir, tmpname);
    int rc = j->m.rank == 0 ? fmt_io_mkdir(tmpdir) : await_dir(e, j, tmpdir);
    if (j->m.rank != 0 && rc)
        return rc;
    if (j->m.rank != 0 && known_committed(j, tmpdir))
        return 0; /* its note may also come while this shard is written: await_commit */
    if (rc && rc != -EEXIST)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "step %" PRId64 ": mkdir %s: %s", j->step, tmpdir, strerror(-rc));
    snprintf(path, sizeof(path), "%s/shard-%d.h5", tmpdir, j->m.rank);
    unlink(path); /* this attempt's own, from an earlier try at the same step */
    fmt_write_stats st;
    j->m.ready = tensor_copied; /* S10: each tensor as soon as it is in staging */
    j->m.ready_arg = e;
    rc = fmt_shard_write(path, &j->m, e->io, &st);
    if (!rc && st.io_auto[0] && st.auto_first) /* RK_IO=auto's choice, once a device and process */
        RK_EVENT(e->ev, "io_chosen", RK_EV_S("io", st.io_auto), RK_EV_D("direct_gbs", st.auto_direct_gbs),
                 RK_EV_D("buffered_gbs", st.auto_buffered_gbs), RK_EV_B("measured", st.auto_measured),
                 RK_EV_S("io_path", st.io_path));
    if (!rc && (rc = job_copied(e, j, CKPT_OP_ALL)) != 0) { /* W6 */
        char why[512];
        snprintf(why, sizeof(why), "%s", rk_last_error());
        rk__set_last_error("the copy into staging failed: %s", why);
    }
    if (!rc && ckpt__abandoned(j))
        rc = abandoned(j);
    if (!rc) {
        snprintf(j->m.io_path, sizeof(j->m.io_path), "%s", st.io_path);
        snprintf(path, sizeof(path), "%s/shard-%d.ok", tmpdir, j->m.rank);
        rc = fmt_manifest_write(path, &j->m);
    }
    if (j->m.rank != 0) {
        if (!rc)
            return await_commit(e, j, tmpdir);
        char note[32];
        snprintf(note, sizeof(note), "FAILED-%d", j->m.rank);
        write_note(tmpdir, note, j->m.nonce, rk_last_error()); /* rank 0 need not wait for us */
        return rc;
    }
    if (!rc)
        rc = commit(e, j, tmpdir, tmpname);
    if (rc)
        write_note(tmpdir, "FAILED", j->m.nonce, rk_last_error());
    return rc;
}

void *ckpt__writer_main(void *arg)
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
        /* snapshot.h S5, S10: the copy is waited for, tensor by tensor, by persist. */
        e->job.copy_deadline = rk__deadline_ns(e->timeout_ms);
        int rc = persist(e, &e->job);
        emit_result(e, &e->job, rc); /* e->ev is the engine's own reference (ckpt.c J5) */
        pthread_mutex_lock(&e->mu);
        e->job.rc = rc;
        e->job.done_ns = rk__mono_ns();
        if (rc == 0 && e->job.step > e->last_committed)
            e->last_committed = e->job.step;
        if (rc == 0 && e->first_err && e->job.step >= e->first_err_step)
            e->first_err = 0; /* superseded: a later state is committed (ckpt.c J3) */
        if (rc != 0 && !ckpt__abandoned(&e->job))
            ckpt__note_failure(e, e->job.step, rc);
        atomic_store(&e->job.region, NULL); /* W5: staging is not read any more */
        e->job.published = true;              /* ckpt_wait has its answer (ckpt.c J6) */
        pthread_cond_broadcast(&e->cv);
        if (rc == 0 && e->job.retain) {
            pthread_mutex_unlock(&e->mu);
            ckpt__retain(e->dir, e->keep, e->job.step); /* W4, the slot still RUNNING */
            pthread_mutex_lock(&e->mu);
        }
        e->state = CKPT_IDLE;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    fmt_io_watch(NULL);
    return NULL;
}
