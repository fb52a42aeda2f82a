/*
 * ckpt/ckpt_dir.c - the checkpoint directory as a whole: which committed checkpoints it
 * holds and in which order a job resumes from them (timelines), retention, and the
 * removal of dead attempts. The engine (after a commit), rk_resume / recovery and the
 * CLI (ls, verify, gc) all take the order and the retention from here.
 *
 * Timelines. Each commit records its time (index.h5 commit_time_ns, never earlier than any
 * commit already in the directory: ckpt__commit_ns). A job that resumed from label 100
 * after 200 and 300 had been committed continues a new timeline: its commits (120, 140,
 * ...) are newer than 200 and 300, which were left behind. A checkpoint is abandoned when a
 * later commit carries a lower label. The order, newest first:
 *   1. the current timeline (not abandoned), by commit time;
 *   2. the abandoned ones, by commit time.
 * Within the current timeline commit time and label agree. Without commit times (an index
 * written before the attribute, or one that cannot be read) a checkpoint counts as the
 * oldest, and such checkpoints are ordered by label.
 *
 * Invariants (tests/test_ckpt.c names them; retention's own are writer.c W4):
 *  D1  A checkpoint directory that cannot be listed is an error wherever it is read
 *      (restore, retention, the CLI), never "no checkpoint".
 *  D2  Every reader of the directory takes one order (ckpt_list): the current timeline
 *      by commit time, then abandoned ones; the held snapshot is offered to a rollback
 *      only when its layout matches the registry (ckpt_snapshot_matches).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

#define PATH_CAP 4096

/* Chronological: commit time, then label. */
static int cmp_chrono(const void *a, const void *b)
{
    const ckpt_entry *x = a, *y = b;
    if (x->commit_ns != y->commit_ns)
        return x->commit_ns < y->commit_ns ? -1 : 1;
    return (x->step > y->step) - (x->step < y->step);
}

/* Resume order: the current timeline first, each part newest first. */
static int cmp_resume(const void *a, const void *b)
{
    const ckpt_entry *x = a, *y = b;
    if (x->abandoned != y->abandoned)
        return x->abandoned ? 1 : -1;
    return -cmp_chrono(a, b);
}

int ckpt_list(const char *dir, ckpt_entry **out, size_t *n_out)
{
    int64_t *steps = NULL;
    size_t n = 0;
    char name[64], path[PATH_CAP + 64];
    *out = NULL;
    *n_out = 0;
    int rc = fmt_list_steps(dir, &steps, &n);
    if (rc)
        return rc;
    ckpt_entry *l = calloc(n ? n : 1, sizeof(*l));
    if (!l) {
        free(steps);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t label = -1;
        fmt_step_name(name, sizeof(name), steps[i]);
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        l[i].step = steps[i];
        l[i].readable = fmt_index_info(path, &label, &l[i].commit_ns) == 0 && label == steps[i];
        if (!l[i].readable)
            l[i].commit_ns = 0;
    }
    free(steps);
    qsort(l, n, sizeof(*l), cmp_chrono);
    int64_t lowest_later = INT64_MAX;
    for (size_t i = n; i-- > 0;) {
        l[i].abandoned = l[i].step > lowest_later;
        if (l[i].step < lowest_later)
            lowest_later = l[i].step;
    }
    qsort(l, n, sizeof(*l), cmp_resume);
    *out = l;
    *n_out = n;
    return 0;
}

int ckpt_newest_below(const char *dir, int64_t below, int64_t *step)
{
    ckpt_entry *l = NULL;
    size_t n = 0;
    *step = -1;
    int rc = ckpt_list(dir, &l, &n);
    for (size_t i = 0; !rc && i < n && *step < 0; i++)
        if (l[i].step < below)
            *step = l[i].step;
    free(l);
    return rc;
}

int64_t ckpt__commit_ns(const char *dir)
{
    int64_t now = rk__real_ns();
    ckpt_entry *l = NULL;
    size_t n = 0;
    if (ckpt_list(dir, &l, &n) == 0)
        for (size_t i = 0; i < n; i++)
            if (l[i].commit_ns >= now)
                now = l[i].commit_ns + 1; /* a clock set back, or another host's: still the newest */
    free(l);
    return now;
}

/* Removes committed checkpoint `name` of dir: renamed to a '.trash-' name first, so a
   half-removed checkpoint is never seen as committed (writer.c W4). */
static int remove_step(const char *dir, const char *name)
{
    char path[PATH_CAP + 64], trash[PATH_CAP + 64];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(trash, sizeof(trash), "%s/.trash-%s", dir, name);
    fmt_remove_tree(trash); /* left by an earlier removal that stopped half-way */
    int rc = fmt_io_rename(path, trash);
    if (rc)
        return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, rc, "retention: cannot remove %s: %s", path, strerror(-rc));
    rc = fmt_remove_tree(trash);
    if (!rc)
        RK_LOG_INFO(RK_SUB_CKPT, "retention: removed %s", path);
    return rc;
}

/* Whether checkpoint `path` reopens intact: its commit record, and every file's checksum
   against it outside the tensors' data (fmt_ckpt_open); no tensor is read. */
static int reopens(const char *path, char *bad, size_t cap)
{
    fmt_ckpt *c = NULL;
    int rc = fmt_ckpt_open(path, &c);
    if (rc)
        snprintf(bad, cap, "%s", rk_last_error());
    fmt_ckpt_close(&c);
    return rc;
}

/* ckpt_retain; `written` (-1: none) is a checkpoint the caller has just committed itself:
   every byte of its data was checksummed from the memory it was written from (each rank's
   shard, fmt_shard_write) and is durable, so it counts as verifying if it reopens intact,
   without a second pass over the data (on one disk, that pass cost as much as the write,
   and on rank 0 it read every rank's shard). */
static int retain(const char *dir, int keep, int64_t written, ckpt_retain_note *note, void *arg)
{
    ckpt_entry *l = NULL;
    size_t n = 0;
    char name[64], path[PATH_CAP + 64], bad[1024];
    if (keep < 1)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "retention: keep %d (must be >= 1)", keep);
    int rc = ckpt_list(dir, &l, &n);
    if (rc || n <= (size_t)keep) {
        free(l);
        return rc;
    }
    /* The newest that verifies (its data re-read against its checksums, or `written`
       reopened) stays, wherever it is in the order: the newest ones may all be damaged. */
    size_t good = n;
    for (size_t i = 0; i < n && good == n; i++) {
        fmt_step_name(name, sizeof(name), l[i].step);
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        int v = l[i].step == written ? reopens(path, bad, sizeof(bad)) : ckpt_verify_dir(path, bad, sizeof(bad));
        if (v == 0) {
            good = i;
        } else {
            RK_LOG_WARN(RK_SUB_CKPT, "retention: %s does not verify: %s", path, bad);
            if (note)
                note(arg, CKPT_RETAIN_UNVERIFIED, path, bad);
        }
    }
    for (size_t i = (size_t)keep; i < n; i++) {
        if (i == good)
            continue;
        fmt_step_name(name, sizeof(name), l[i].step);
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        int r = remove_step(dir, name);
        if (note)
            note(arg, r ? CKPT_RETAIN_REMOVE_FAILED : CKPT_RETAIN_REMOVED, path, r ? rk_last_error() : "");
        if (r && !rc)
            rc = r;
    }
    free(l);
    return rc;
}

int ckpt_retain(const char *dir, int keep, ckpt_retain_note *note, void *arg)
{
    return retain(dir, keep, -1, note, arg);
}

struct clean_arg {
    const char *dir;
    int64_t below;
    uint64_t keep;
};

static int clean_one(void *arg, const char *name)
{
    const struct clean_arg *c = arg;
    char path[PATH_CAP + 16], trash[PATH_CAP + 16];
    int64_t s = -1;
    uint64_t nonce = 0;
    bool tmp = fmt_is_tmp_name(name), trashed = strncmp(name, ".trash-", 7) == 0;
    if (tmp && !fmt_parse_tmp_name(name, &s, &nonce))
        s = -1;
    if (!(tmp && s < c->below && (nonce != c->keep || c->keep == 0)) && !trashed)
        return 0;
    snprintf(path, sizeof(path), "%s/%s", c->dir, name);
    RK_LOG_INFO(RK_SUB_CKPT, "removing %s (a dead attempt)", path);
    if (tmp) {
        snprintf(trash, sizeof(trash), "%s/.trash-%s", c->dir, name + 1);
        if (fmt_io_rename(path, trash) != 0)
            return 0; /* gone already, or committed meanwhile */
        snprintf(path, sizeof(path), "%s", trash);
    }
    fmt_remove_tree(path);
    return 0;
}

/* Removes '.trash-…' directories and the temporary directories of attempts labelled below
   `below`, except the attempt with nonce `keep`. Each goes to a '.trash-' name first by
   one rename: a stale writer that has not committed yet then finds its directory gone
   and can never commit it (ckpt.c J4), and a half-removed directory is never seen. */
static int clean(const char *dir, int64_t below, uint64_t keep)
{
    struct clean_arg c = {.dir = dir, .below = below, .keep = keep};
    return fmt_list_dir(dir, clean_one, &c);
}

int ckpt_clean_dir(const char *dir)
{
    return clean(dir, INT64_MAX, 0);
}

void ckpt__clean_for(ckpt_engine *e, const struct ckpt_job *j)
{
    clean(e->dir, INT64_MAX, j->m.nonce);
}

void ckpt__drop_attempts(ckpt_engine *e, const char *const *names, size_t n)
{
    struct clean_arg c = {.dir = e->dir, .below = INT64_MAX, .keep = 0};
    for (size_t i = 0; i < n; i++)
        if (names[i][0])
            clean_one(&c, names[i]);
    clean(e->dir, INT64_MIN, 0); /* '.trash-' names only: removals a killed worker left */
}

void ckpt__retain(const char *dir, int keep, int64_t newest)
{
    retain(dir, keep, newest, NULL, NULL);
    clean(dir, newest, 0);
}
