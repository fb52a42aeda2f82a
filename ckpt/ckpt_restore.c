/*
 * ckpt/ckpt_restore.c - reading a committed checkpoint back, and verifying one. A restore
 * reads into the engine's staging memory (the held snapshot, snapshot.h S2, S3), never
 * into the registered buffers: the caller copies it out (ckpt_restore_held) only once the whole
 * checkpoint verified on every rank, so a checkpoint that fails at its k-th tensor leaves
 * the caller's buffers as they were. ckpt_load_into (RK_RESTORE=inplace, snapshot.h S12)
 * reads straight into the buffers instead: no staging is touched and nothing is copied
 * out, and a failure leaves them holding part of the checkpoint. ckpt_check (S14) reads and
 * checks it all, keeping nothing but what the page cache keeps. The match of the tensor set is checked before
 * anything is read; then every tensor (this rank's rows of a sharded one) is read in one
 * batch (fmt_ckpt_read_many: many reads in flight across tensors, O_DIRECT straight into
 * staging when the file is not in the page cache, pread when it is), every byte checked
 * against its checksum as it arrives.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t len = (size_t)snprintf(buf, cap, "(");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%" PRId64, d ? "," : "", shape[d]);
    if (len < cap)
        snprintf(buf + len, cap - len, ")");
}

static const char *kind_name(int kind)
{
    return kind == FMT_SHARDED ? "sharded" : kind == FMT_PER_RANK ? "per-rank" : "replicated";
}

/* Where registered tensor t lies in checkpoint c for this rank: *k its entry (-1: a
   per-rank tensor of a rank the checkpoint did not have). RK_E_MISMATCH if it is not
   there, or of another kind, dtype or shape (a sharded one: other global rows). */
static int find_match(const fmt_ckpt *c, const ckpt_tensor *t, int rank, const char *where, long *k)
{
    char a[160], b[160], name[FMT_MAX_NAME + 32];
    int kind = ckpt__kind(t->flags);
    *k = fmt_ckpt_find(c, t->name);
    if (kind == FMT_PER_RANK) {
        *k = fmt_per_rank_name(name, sizeof(name), rank, t->name) ? fmt_ckpt_find(c, name) : -1;
        if (*k < 0 && rank >= c->world && fmt_per_rank_name(name, sizeof(name), 0, t->name) &&
            fmt_ckpt_find(c, name) >= 0)
            return 0; /* the tensor is there, for the ranks that existed */
    }
    if (*k < 0)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH, "%s has no %s tensor '%s' (registered)", where,
                        kind_name(kind), t->name);
    const fmt_tensor *f = &c->t[*k];
    if (f->kind != kind)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH, "%s: tensor '%s' is %s there but registered %s",
                        where, t->name, kind_name(f->kind), kind_name(kind));
    bool same = f->dtype == t->dtype && f->ndim == t->ndim;
    for (int d = 0; same && d < f->ndim; d++)
        same = f->shape[d] == (kind == FMT_SHARDED && d == 0 ? t->rows : t->shape[d]);
    if (!same) {
        int64_t shape[FMT_MAX_DIMS];
        memcpy(shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        if (kind == FMT_SHARDED)
            shape[0] = t->rows;
        shape_str(a, sizeof(a), f->ndim, f->shape);
        shape_str(b, sizeof(b), t->ndim, shape);
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH,
                        "%s: tensor '%s' is %s %s there but registered as %s %s%s", where, t->name,
                        rk__dtype_name(f->dtype), a, rk__dtype_name(t->dtype), b,
                        kind == FMT_SHARDED ? " (global shape)" : "");
    }
    return 0;
}

/* Every registered tensor is in c (k[i] its entry), and c holds nothing else but per-rank
   state of ranks >= world, which is counted in *orphans (and its ranks in orphan_ranks).
   O(n log n) in the entries (fmt_ckpt_find is a binary search): a crafted index with
   millions of entries cannot stall a restore. */
static int check_match(const fmt_ckpt *c, const ckpt_tensor *t, size_t n, int rank, int world, const char *where,
                       long *k, size_t *orphans, char *orphan_ranks, size_t cap)
{
    int rc;
    for (size_t i = 0; i < n; i++)
        if ((rc = find_match(c, &t[i], rank, where, &k[i])) != 0)
            return rc;
    bool *seen = calloc(c->n ? c->n : 1, sizeof(*seen));
    if (!seen)
        return -ENOMEM;
    char name[FMT_MAX_NAME + 32];
    for (size_t i = 0; i < n; i++) {
        if (ckpt__kind(t[i].flags) != FMT_PER_RANK) {
            seen[k[i]] = true;
            continue;
        }
        for (int r = 0; r < c->world; r++) { /* every rank's entry of a registered per-rank tensor */
            long j = fmt_per_rank_name(name, sizeof(name), r, t[i].name) ? fmt_ckpt_find(c, name) : -1;
            if (j >= 0 && c->t[j].kind == FMT_PER_RANK)
                seen[j] = true;
        }
    }
    size_t len = 0;
    int last = -1;
    *orphans = 0;
    orphan_ranks[0] = '\0';
    rc = 0;
    for (size_t j = 0; j < c->n && !rc; j++) {
        const fmt_tensor *f = &c->t[j];
        if (!seen[j]) {
            rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH, "%s holds %s tensor '%s', which is not registered",
                          where, kind_name(f->kind), f->name);
        } else if (f->kind == FMT_PER_RANK && f->rank >= world) {
            (*orphans)++;
            if (f->rank > last && len < cap) /* entries of one tensor come by rank */
                len += (size_t)snprintf(orphan_ranks + len, cap - len, "%s%d", len ? "," : "", f->rank);
            last = f->rank > last ? f->rank : last;
        }
    }
    free(seen);
    return rc;
}

/* Per-rank state the new membership does not restore, said in the log and the event log:
   that of ranks >= the world now (rank 0 says it once; it stays in the checkpoint, at
   ranks/<r>/), and this rank's when the checkpoint has none for it (its buffer is left). */
static void report_per_rank(ckpt_engine *e, const fmt_ckpt *c, const ckpt_tensor *t, size_t n, const long *k,
                            size_t orphans, const char *orphan_ranks)
{
    if (orphans && e->rank == 0) {
        RK_LOG_WARN(RK_SUB_CKPT, "step %" PRId64 ": per-rank state of rank(s) %s (%zu tensors) belongs to no rank of "
                    "this world of %d: it stays readable in %s at ranks/<r>/", c->step, orphan_ranks, orphans,
                    e->world, c->dir);
        RK_EVENT(e->ev, "per_rank_orphaned", RK_EV_I("step", c->step), RK_EV_S("ranks", orphan_ranks),
                 RK_EV_I("tensors", orphans), RK_EV_I("world", e->world));
    }
    size_t missing = 0;
    for (size_t i = 0; i < n; i++)
        missing += k[i] < 0;
    if (missing) {
        RK_LOG_WARN(RK_SUB_CKPT, "step %" PRId64 ": the checkpoint (world %d) has no per-rank state of rank %d: %zu "
                    "per-rank tensors keep their values", c->step, c->world, e->rank, missing);
        RK_EVENT(e->ev, "per_rank_missing", RK_EV_I("step", c->step), RK_EV_I("tensors", missing),
                 RK_EV_I("ckpt_world", c->world));
    }
}

/* ckpt_load (into staging), ckpt_load_into (into t[i].ptr, S12) and ckpt_check (read and
   checked, nothing kept, S14). */
enum load_to { TO_STAGING, TO_BUFFERS, TO_NOWHERE };

static int load(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n, enum load_to to)
{
    bool into = to == TO_BUFFERS, check = to == TO_NOWHERE;
    char name[64], path[4096];
    fmt_step_name(name, sizeof(name), step);
    snprintf(path, sizeof(path), "%s/%s", e->dir, name);
    fmt_ckpt *c = NULL;
    long *k = NULL;
    fmt_read_req *req = NULL;
    ckpt_abandon(e); /* before the first read: a commit under way now removes nothing (writer.c W4) */
    int rc = fmt_ckpt_open(path, &c);
    if (rc)
        return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, rc, "%s skipped: %s", path, rk_last_error());
    if (c->step != step) {
        rc = rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_CORRUPT, "%s skipped: its index says step %" PRId64, path, c->step);
        goto out;
    }
    k = calloc(n ? n : 1, sizeof(*k));
    req = malloc((n ? n : 1) * sizeof(*req));
    char orphan_ranks[256];
    size_t orphans = 0;
    if (!k || !req) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = check_match(c, t, n, e->rank, e->world, path, k, &orphans, orphan_ranks, sizeof(orphan_ranks))) != 0)
        goto out;
    for (size_t i = 0; into && i < n; i++)
        if (!ckpt_tensor_in_host(&t[i])) {
            rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -EINVAL, "%s: tensor '%s' has no host buffer to read into",
                          path, t[i].name);
            goto out;
        }
    if (into) {
        rc = ckpt__hold_none(e); /* S12: the buffers change from the first read on */
    } else if (!check) {          /* S14: a check changes nothing held */
        ckpt__prep_defer(e, true); /* staging faulted in by the reads; nothing mapped ahead (S9) */
        rc = ckpt__hold_space(e, t, n);
        ckpt__prep_defer(e, false);
    }
    if (rc)
        goto out;
    /* One batch: the reads stay in flight across tensors, every byte checked as it
       arrives; into staging straight (each tensor 4 KiB-aligned there, with the room to a
       4 KiB end: S4), or into the caller's buffers through the reader's own (it may not
       drop their pages, R5). With shared reads, the replicated tensors, which the other
       ranks of this host read too, come last in a batch of their own through the page
       cache (fmt_ckpt_read_shared): the host reads them from the disk once. A check (S14)
       reads every tensor that way, into no buffer: the page cache keeps them for the read
       that places them. */
    size_t m = 0, rep = 0; /* req[0..rep): this rank's own reads; req[rep..m): shared */
    for (int shared = 0; shared < 2; shared++) {
        rep = shared ? m : 0;
        for (size_t i = 0; i < n; i++) {
            if (k[i] < 0 || (check || (e->shared_reads && t[i].flags == 0)) != shared)
                continue;
            req[m++] = (fmt_read_req){.i = (size_t)k[i], .first = t[i].row0, .nrows = t[i].shape[0],
                                      .dst = check ? NULL : into ? t[i].ptr : ckpt__tensor_at(e, i),
                                      .cap = into || check ? t[i].nbytes : ALIGN_UP(t[i].nbytes)};
        }
    }
    for (size_t i = 0; i < n && to == TO_STAGING; i++)
        if (k[i] < 0)
            ckpt__tensor_missing(e, i);
    rc = fmt_ckpt_read_many(c, req, rep, to == TO_STAGING);
    if (!rc && rep < m)
        rc = fmt_ckpt_read_shared(c, req + rep, m - rep);
    if (rc) {
        rc = rk__fail(RK_SUB_CKPT, RK_LOG_WARN, rc, "%s skipped: %s", path, rk_last_error());
        goto out; /* staging (or the buffers) hold part of it: no snapshot is held (-1);
                     a check changed nothing */
    }
    if (to == TO_STAGING)
        ckpt__seal(e, step);
    if (!check)
        report_per_rank(e, c, t, n, k, orphans, orphan_ranks);
out:
    free(req);
    free(k);
    fmt_ckpt_close(&c);
    /* S9: the first snapshot's region mapped ahead, once the reader's memory went (its
       munmap would wait for the mapping thread's) */
    size_t need = !rc && into ? ckpt__staging_bytes(t, n) : 0;
    if (need > e->s.g.staging_cap)
        ckpt__prepare(e, need);
    return rc;
}

int ckpt_load(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    return load(e, step, t, n, TO_STAGING);
}

int ckpt_load_into(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    return load(e, step, t, n, TO_BUFFERS);
}

int ckpt_check(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    return load(e, step, t, n, TO_NOWHERE);
}

int ckpt_verify_dir(const char *stepdir, char *bad, size_t cap)
{
    fmt_ckpt *c = NULL;
    char dummy[8];
    if (!bad) {
        bad = dummy;
        cap = sizeof(dummy);
    }
    bad[0] = '\0';
    int rc = fmt_ckpt_open(stepdir, &c);
    if (rc) {
        snprintf(bad, cap, "%s", rk_last_error());
        return rc;
    }
    uint64_t max = 0;
    for (size_t i = 0; i < c->n; i++)
        if (c->t[i].nbytes > max)
            max = c->t[i].nbytes;
    void *buf = NULL; /* page-aligned with the room to a 4 KiB end: read straight into */
    if (posix_memalign(&buf, 4096, ALIGN_UP(max ? max : 1)) != 0) {
        fmt_ckpt_close(&c);
        return -ENOMEM;
    }
    int first = 0;
    size_t len = 0;
    for (size_t i = 0; i < c->n; i++) {
        fmt_read_req req = {.i = i, .first = 0, .nrows = c->t[i].rows, .dst = buf, .cap = ALIGN_UP(max ? max : 1)};
        int r = fmt_ckpt_read_many(c, &req, 1, true);
        if (r == 0)
            continue;
        if (!first)
            first = r;
        if (len < cap)
            len += (size_t)snprintf(bad + len, cap - len, "%s%s", len ? "; " : "", rk_last_error());
    }
    free(buf);
    fmt_ckpt_close(&c);
    return first;
}
