/*
 * ckpt/snapshot.c - the snapshots held in memory: the generations and their staging
 * regions, the copy into them and its settling, the turn and the select, a snapshot held
 * by other means (ckpt_hold, a rebuild, a restore's reads), the partner copy's inbox and
 * the restore from memory. The design (words, invariants S1-S7, the generations' states)
 * is ckpt/snapshot.h's. The job in flight is ckpt.c's: this side never abandons it; a
 * checkpoint's copy given up on is told to its writer (ckpt__copy_outcome), which fails it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"


/* A generation's regions (its staging and partner copy) go; its bookkeeping stays. */
static void gen_unmap(ckpt_engine *e, struct ckpt_gen *g)
{
    if (g->staging)
        ckpt__unmap_region(e, g->staging, g->staging_cap);
    if (g->partner)
        ckpt__unmap_region(e, g->partner, g->partner_cap);
    g->staging = g->partner = NULL;
    g->staging_cap = g->partner_cap = g->partner_len = 0;
}

static void gen_free(ckpt_engine *e, struct ckpt_gen *g)
{
    gen_unmap(e, g);
    free(g->held_row0);
    free(g->frozen_ok);
    free(g->own_p);
    free(g->left_p);
    free(g->held_have);
    free(g->held_off);
    free(g->held_len);
}

static void was_end(ckpt_engine *e);

int ckpt__snapshots_init(ckpt_engine *e, void *cuda_stream)
{
    struct ckpt_gen *gens[] = {&e->s.g, &e->s.old, &e->s.park};
    for (size_t i = 0; i < RK_ARRAY_LEN(gens); i++)
        *gens[i] = (struct ckpt_gen){.held_step = -1, .left_step = -1, .held_rank = e->rank, .held_world = e->world};
    e->s.cuda_stream = cuda_stream;
    return ckpt_copy_host_create(&e->s.host_copy);
}

int ckpt__snapshots_end(ckpt_engine *e, int64_t deadline_ns)
{
    /* A copy still running at the deadline (S5) keeps its engine and staging mapped; one
       given up on is waited for here too (ckpt__settle would only look). */
    if (e->s.cp.pending && e->s.cp.torn) {
        if (!e->s.cp.host_done)
            ckpt_copy_wait(e->s.host_copy, e->s.cp.host_gen, deadline_ns);
        ckpt_copy_wait(e->s.dev_copy, e->s.cp.dev_gen, deadline_ns);
    }
    int rc = ckpt__settle(e, false, deadline_ns) == RK_E_TIMEOUT && e->s.cp.pending ? RK_E_TIMEOUT : 0;
    if (!rc)
        rc = ckpt_copy_destroy(&e->s.host_copy, deadline_ns);
    if (!rc)
        rc = ckpt_copy_destroy(&e->s.dev_copy, deadline_ns);
    if (rc)
        e->s.g.staging = NULL; /* a copy may still write it: left mapped */
    ckpt__unmap_retired(e);
    gen_free(e, &e->s.g);
    gen_free(e, &e->s.old);
    gen_free(e, &e->s.park);
    if (e->s.prev)
        ckpt__unmap_region(e, e->s.prev, e->s.prev_cap);
    was_end(e);
    ckpt__prep_end(e, deadline_ns);
    free(e->s.ops);
    free(e->s.op_of);
    return rc;
}

/* S11: the older generation holds nothing from here on (its region is about to change
   hands): nothing offered, and no RK_FROZEN tensor's bytes counted as there (S7). */
static void forget_old(ckpt_engine *e)
{
    struct ckpt_gen *o = &e->s.old;
    o->held_step = -1;
    if (o->held_cap)
        memset(o->frozen_ok, 0, o->held_cap * sizeof(*o->frozen_ok));
}

/* S11: the older generation's region for a rebuild (ckpt_hold_open), grown to `need` in
   place (the pages it has are touched already: only the growth is new); NULL where it has
   none or the writer reads it. It is no longer old's: old holds nothing from here on. */
static void *take_old(ckpt_engine *e, size_t need, size_t *cap)
{
    struct ckpt_gen *o = &e->s.old;
    if (!o->staging || ckpt__pinned(e, o->staging))
        return NULL;
    size_t c = need > o->staging_cap ? need : o->staging_cap;
    ckpt_copy_unpin(e->s.dev_copy, o->staging); /* the CUDA engine's pin (copy.h), not the writer's */
    void *p = rk__remap(o->staging, o->staging_cap, c);
    if (!p)
        return NULL; /* as it was, unpinned: dev_engine pins staging again when it copies */
    o->staging = NULL;
    o->staging_cap = 0;
    forget_old(e);
    *cap = c;
    return p;
}

/* Staging large enough for every tensor in g, and the held snapshot's bookkeeping (S1,
   S2). A region the writer reads is retired, not unmapped (writer.c
   W5). keep (ckpt_hold_open):
   always another region (the older generation's where it can be had, S11, else a new
   one), and the old one stays mapped as prev (retired instead while the writer reads it). */
static int stage(ckpt_engine *e, const ckpt_tensor *t, size_t n, bool keep)
{
    struct ckpt_gen *g = &e->s.g;
    if (n > g->held_cap) {
        if (!ckpt__grow((void **)&g->held_off, n, sizeof(*g->held_off)) ||
            !ckpt__grow((void **)&g->held_len, n, sizeof(*g->held_len)) ||
            !ckpt__grow((void **)&g->held_have, n, sizeof(*g->held_have)) ||
            !ckpt__grow((void **)&g->held_row0, n, sizeof(*g->held_row0)) ||
            !ckpt__grow((void **)&g->frozen_ok, n, sizeof(*g->frozen_ok)) ||
            !ckpt__grow((void **)&g->own_p, n, sizeof(*g->own_p)) ||
            !ckpt__grow((void **)&g->left_p, n, sizeof(*g->left_p)))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "checkpoint staging for %zu tensors", n);
        memset(g->frozen_ok + g->held_cap, 0, (n - g->held_cap) * sizeof(*g->frozen_ok));
        g->held_cap = n;
    }
    size_t need = ckpt__staging_bytes(t, n);
    if (ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)) == RK_E_TIMEOUT && e->s.cp.pending)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "checkpoint staging: the copy of step %" PRId64 " into it still runs", e->s.cp.step);
    bool read = ckpt__pinned(e, g->staging);
    ckpt__unmap_retired(e);
    if (need <= g->staging_cap && !keep)
        return 0;
    if (read && e->s.retired)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_BUSY,
                        "checkpoint staging must grow while an abandoned writer still reads two older regions");
    int f = rk__fault_fail("stage");
    size_t cap = need;
    void *p = f || !keep ? NULL : take_old(e, need, &cap);
    e->s.was.from_old = p != NULL;
    if (!p && !f)
        p = ckpt__region(e, need, &cap);
    if (!p)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, f ? f : -errno, "checkpoint staging of %zu bytes: %s", need,
                        strerror(f ? -f : errno));
    g->held_step = -1;
    memset(g->frozen_ok, 0, g->held_cap * sizeof(*g->frozen_ok)); /* a new region holds nothing */
    if (read) {
        e->s.retired = g->staging;
        e->s.retired_cap = g->staging_cap;
    } else if (keep) {
        e->s.prev = g->staging;
        e->s.prev_cap = g->staging_cap;
    } else if (g->staging) {
        ckpt__unmap_region(e, g->staging, g->staging_cap);
    }
    g->staging = p;
    g->staging_cap = cap;
    if (!keep && !e->one_copy && e->s.old.staging_cap < need)
        ckpt__prepare(e, need); /* S9: the other generation's, for the next turn (S13: none) */
    return 0;
}

/* The held snapshot's layout for t[0..n) in staging (S4): the header, the sharded and
   per-rank pieces, the replicated tensors; nothing held yet (S2). */
static void lay_out(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    struct ckpt_gen *g = &e->s.g;
    size_t off = ckpt__hdr_bytes(n);
    g->held_step = -1;
    g->held_hdr = off;
    for (int own = 1; own >= 0; own--) {
        for (size_t i = 0; i < n; i++) {
            if ((t[i].flags != 0) != own)
                continue;
            if (i >= g->held_n || g->held_off[i] != off || g->held_len[i] != t[i].nbytes)
                g->frozen_ok[i] = false; /* its bytes, if any, are elsewhere */
            g->held_off[i] = off;
            g->held_len[i] = t[i].nbytes;
            g->held_row0[i] = t[i].flags & RK_SHARDED ? t[i].row0 : 0;
            g->held_have[i] = true;
            off += ALIGN_UP(t[i].nbytes);
        }
        if (own)
            g->held_out = off;
    }
    g->held_n = n;
}

size_t ckpt__staging_bytes(const ckpt_tensor *t, size_t n)
{
    size_t need = ckpt__hdr_bytes(n);
    for (size_t i = 0; i < n; i++)
        need += ALIGN_UP(t[i].nbytes);
    return need;
}

int ckpt__hold_none(ckpt_engine *e)
{
    if (ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)) == RK_E_TIMEOUT && e->s.cp.pending)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "restore into the registered buffers: the copy of step %" PRId64 " out of them still runs",
                        e->s.cp.step);
    struct ckpt_gen *gens[] = {&e->s.g, &e->s.old, &e->s.park};
    for (size_t i = 0; i < sizeof(gens) / sizeof(gens[0]); i++) {
        gens[i]->held_step = -1; /* the buffers are about to change: no snapshot is theirs (S12) */
        if (gens[i]->frozen_ok)
            memset(gens[i]->frozen_ok, 0, gens[i]->held_cap * sizeof(*gens[i]->frozen_ok));
    }
    return 0;
}

void ckpt__seal(ckpt_engine *e, int64_t step)
{
    struct ckpt_gen *g = &e->s.g;
    uint64_t *h = (uint64_t *)g->staging;
    h[0] = HDR_MAGIC;
    h[1] = (uint64_t)step;
    h[2] = g->held_n;
    for (size_t i = 0; i < g->held_n; i++) {
        bool piece = g->held_off[i] < g->held_out;
        h[3 + 2 * i] = piece ? g->held_len[i] : 0;
        h[4 + 2 * i] = (uint64_t)g->held_row0[i];
    }
    pthread_mutex_lock(&e->mu);
    g->held_epoch = e->epoch;
    g->held_rank = e->rank;
    g->held_world = e->world;
    pthread_mutex_unlock(&e->mu);
    g->held_step = step;
}

/* The CUDA engine, made at the first device tensor; its pinned region is staging. */
static int dev_engine(ckpt_engine *e)
{
    struct ckpt_gen *g = &e->s.g;
    int rc = e->s.dev_copy ? 0 : ckpt_copy_cuda_create(&e->s.dev_copy, e->s.cuda_stream);
    if (!rc)
        ckpt_copy_pin(e->s.dev_copy, g->staging, g->staging_cap);
    return rc;
}

/* Starts the copies between t[0..n) and staging at the held layout, on both engines (S5):
   to_staging for a snapshot, else a restore (tensors with defer left). *host_gen and
   *dev_gen: the batches (0: none). On failure nothing more is started, but a host batch
   already started may run: its gen is set. */
static int copy_start(ckpt_engine *e, const ckpt_tensor *t, size_t n, bool to_staging, uint64_t *host_gen,
                      uint64_t *dev_gen)
{
    struct ckpt_gen *g = &e->s.g;
    *host_gen = *dev_gen = 0;
    if (n > e->s.ops_cap) {
        if (!ckpt__grow((void **)&e->s.ops, n, sizeof(*e->s.ops)) ||
            !ckpt__grow((void **)&e->s.op_of, n, sizeof(*e->s.op_of)))
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "checkpoint copy of %zu tensors", n);
        e->s.ops_cap = n;
    }
    size_t nh = 0, nd = 0; /* host copies from the front, device ones from the back */
    for (size_t i = 0; i < n; i++) {
        if (to_staging)
            e->s.op_of[i] = CKPT_OP_NONE; /* S10 */
        if (!t[i].nbytes || (!to_staging && (t[i].defer || !g->held_have[i])))
            continue;
        if (to_staging && t[i].frozen && g->frozen_ok[i])
            continue; /* RK_FROZEN: already there */
        char *at = g->staging + g->held_off[i];
        ckpt_copy_op op = to_staging ? (ckpt_copy_op){.dst = at, .src = t[i].ptr, .n = t[i].nbytes}
                                     : (ckpt_copy_op){.dst = t[i].ptr, .src = at, .n = t[i].nbytes};
        if (to_staging)
            e->s.op_of[i] = t[i].device ? CKPT_OP_DEVICE : nh;
        if (t[i].device)
            e->s.ops[n - ++nd] = op;
        else
            e->s.ops[nh++] = op;
    }
    int rc = nd ? dev_engine(e) : 0;
    if (!rc && nh)
        rc = ckpt_copy_start(e->s.host_copy, e->s.ops, nh, host_gen);
    if (!rc && nd)
        rc = ckpt_copy_start(e->s.dev_copy, e->s.ops + n - nd, nd, dev_gen);
    return rc;
}

/* Starts copying every tensor into staging: the held snapshot of `step` once settled
   (S2, S5). */
static int copy_in(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    struct ckpt_gen *g = &e->s.g;
    lay_out(e, t, n);
    uint64_t hg, dg;
    int rc = copy_start(e, t, n, true, &hg, &dg);
    for (size_t i = 0; i < n; i++) /* until a failure of this copy says otherwise (settle) */
        g->frozen_ok[i] = !rc && t[i].frozen;
    memset(&e->s.cp, 0, sizeof(e->s.cp));
    e->s.cp.pending = hg || dg;
    e->s.cp.step = step;
    e->s.cp.host_gen = hg;
    e->s.cp.dev_gen = dg;
    e->s.cp.rc = rc;
    if (!rc && !e->s.cp.pending)
        ckpt__seal(e, step); /* nothing to copy */
    return rc;
}

/* A snapshot held in memory only (not a checkpoint's) that will not be held: logged and
   the event snapshot_failed; the generation before stays (S6). Returns rc. */
static int snapshot_failed(ckpt_engine *e, int64_t step, int rc, const char *what, const char *why)
{
    RK_LOG_WARN(RK_SUB_CKPT, "snapshot of step %" PRId64 " %s (%s)", step, what, why);
    RK_EVENT(e->ev, "snapshot_failed", RK_EV_I("step", step), RK_EV_S("reason", why), RK_EV_S("error", rk_strerror(rc)));
    return rc;
}

/* The copy under way gave up on at a deadline (S5): whatever it copies is never held nor
   written, since the caller's buffers now move on under it. Reached once a copy: a wait
   that finds it given up already only looks (ckpt__settle). */
static int give_up(ckpt_engine *e)
{
    char why[512];
    snprintf(why, sizeof(why), "%s", rk_last_error());
    RK_EVENT(e->ev, "copy_timeout", RK_EV_I("step", e->s.cp.step), RK_EV_B("ckpt", e->s.cp.job));
    if (e->s.cp.job) /* its writer fails it, and reports it (ckpt.c J3) */
        ckpt__copy_outcome(e, RK_E_TIMEOUT);
    else
        snapshot_failed(e, e->s.cp.step, RK_E_TIMEOUT, "not held: its copy did not finish in time", why);
    e->s.cp.torn = true;
    return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_TIMEOUT, "checkpoint of step %" PRId64 ": the copy into staging "
                    "still runs (%s)", e->s.cp.step, why);
}

/* A copy given up on that still runs: RK_E_TIMEOUT, without a wait, a log line or an
   event (give_up said it once). */
static int still_torn(ckpt_engine *e)
{
    rk__set_last_error("the copy of step %" PRId64 " into staging, given up on at its deadline, still runs",
                       e->s.cp.step);
    return RK_E_TIMEOUT;
}

/* Waits for the copy under way (S5) until deadline_ns, or only looks once it was given up
   on: its bound was spent once, and every later wait goes on at once until it ends (only
   then can a fresh copy start). Once both batches are done, holds the snapshot if neither
   failed nor was given up on. */
int ckpt__settle(ckpt_engine *e, bool host_only, int64_t deadline_ns)
{
    if (!e->s.cp.pending)
        return 0;
    if (e->s.cp.torn)
        deadline_ns = 0;
    if (!e->s.cp.host_done) {
        int rc = ckpt_copy_wait(e->s.host_copy, e->s.cp.host_gen, deadline_ns);
        if (rc == RK_E_TIMEOUT)
            return e->s.cp.torn ? still_torn(e) : give_up(e);
        e->s.cp.host_done = true;
        if (rc && !e->s.cp.rc)
            e->s.cp.rc = rc;
    }
    if (host_only && (e->s.cp.rc || e->s.cp.dev_gen))
        return e->s.cp.rc; /* the device part is the caller's to wait for later */
    if (e->s.cp.dev_gen) {
        int rc = ckpt_copy_wait(e->s.dev_copy, e->s.cp.dev_gen, deadline_ns);
        if (rc == RK_E_TIMEOUT)
            return e->s.cp.torn ? still_torn(e) : give_up(e);
        if (rc && !e->s.cp.rc)
            e->s.cp.rc = rc;
    }
    e->s.cp.pending = false;
    int rc = e->s.cp.torn ? RK_E_TIMEOUT : e->s.cp.rc;
    if (!rc)
        ckpt__seal(e, e->s.cp.step);
    else
        memset(e->s.g.frozen_ok, 0, e->s.g.held_cap * sizeof(*e->s.g.frozen_ok));
    if (e->s.cp.job) { /* for the writer, once a later batch replaced this one */
        ckpt__copy_outcome(e, rc);
    } else if (rc && !e->s.cp.torn) {
        char why[512];
        snprintf(why, sizeof(why), "%s", rk_last_error());
        snapshot_failed(e, e->s.cp.step, rc, "not held: its copy failed", why);
    }
    return rc;
}

int ckpt_copied(ckpt_engine *e, bool host_only, int64_t deadline_ns)
{
    return ckpt__settle(e, host_only, deadline_ns);
}

static void swap_gens(ckpt_engine *e)
{
    struct ckpt_gen t = e->s.g;
    e->s.g = e->s.old;
    e->s.old = t;
}

/* S13: the older generation's regions go (one copy of the state is held, not two); what
   it held was older than g's and is offered no more. */
static void drop_old(ckpt_engine *e)
{
    gen_unmap(e, &e->s.old);
    e->s.old.left_step = -1;
    forget_old(e);
}

/* S6: a snapshot about to be copied goes into the region of the older generation, which
   then becomes g, so that the newest whole snapshot and its partner copy stay held, as
   old, while the copy runs. A region a writer reads is never written (its checkpoint would
   be torn): when the writer reads old (a disk write longer than a step), old is put aside
   as park, whose region takes its place first — a third region, which the writer does not
   read (it reads one at a time) — so the newest whole snapshot still stays held. (Before,
   the copy overwrote g then: a loss during it and its partner copy rolled back to the
   step being written, several steps back: seen in the seed-3300 campaign, run 140.) With
   nothing whole in g and g not read, the copy goes into g. Called with no copy pending. */
static void turn(ckpt_engine *e)
{
    bool g_read = ckpt__pinned(e, e->s.g.staging), old_read = ckpt__pinned(e, e->s.old.staging);
    if (e->one_copy && !old_read)
        drop_old(e);
    if (e->s.g.held_step < 0 && !g_read)
        return;
    if (e->one_copy && !g_read) { /* S13: into g's own region, nothing held while it is copied */
        e->s.g.held_step = -1;
        e->s.g.left_step = -1;
        return;
    }
    if (old_read) {
        RK_LOG_DEBUG(RK_SUB_CKPT, "the writer still reads the region of the older snapshot: it is put aside, a third "
                     "region takes its place");
        struct ckpt_gen t = e->s.park;
        e->s.park = e->s.old;
        e->s.old = t;
        e->s.old.held_step = -1; /* whatever it held is older than g: never offered */
        e->s.old.left_step = -1;
    }
    swap_gens(e);
    e->s.g.held_step = -1; /* to be written: nothing held there, even if what follows fails */
    e->s.g.left_step = -1;
}

/* S8: whether the copy under way is a snapshot of `step` with t[0..n)'s layout that a
   checkpoint can write from (not given up on, not already a job's). */
static bool copying(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    const struct ckpt_gen *g = &e->s.g;
    if (!e->s.cp.pending || e->s.cp.torn || e->s.cp.job || e->s.cp.step != step || g->held_n != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (g->held_len[i] != t[i].nbytes)
            return false;
    return true;
}

/* The job's side of the copy into g (its pin, what it waits for). */
static void job_copy(ckpt_engine *e, size_t n, struct ckpt_job_copy *job)
{
    e->s.cp.job = true;
    for (size_t i = 0; i < n; i++) {
        job->at[i] = ckpt__tensor_at(e, i);
        job->op[i] = e->s.op_of[i];
    }
    job->region = e->s.g.staging;
    job->host_gen = e->s.cp.host_gen;
    job->dev_gen = e->s.cp.dev_gen;
}

int ckpt__snapshot_begin(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n, struct ckpt_job_copy *job)
{
    if (job && copying(e, step, t, n)) { /* S8: one copy, not two */
        job_copy(e, n, job);
        return 0;
    }
    if (ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)) == RK_E_TIMEOUT && e->s.cp.pending)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "snapshot: the copy of step %" PRId64 " into staging still runs", e->s.cp.step);
    turn(e);
    int rc = stage(e, t, n, false);
    if (!rc)
        rc = copy_in(e, step, t, n);
    if (rc)
        return rc;
    if (job)
        job_copy(e, n, job);
    return 0;
}

int ckpt_snapshot_take(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int rc = ckpt__snapshot_begin(e, step, t, n, NULL);
    if (rc) {
        char why[512];
        snprintf(why, sizeof(why), "%s", rk_last_error());
        snapshot_failed(e, step, rc, "not taken", why);
        rk__set_last_error("snapshot of step %" PRId64 " not taken: %s", step, why);
    }
    return rc;
}

char *ckpt__tensor_at(ckpt_engine *e, size_t i)
{
    return e->s.g.staging + e->s.g.held_off[i];
}

void ckpt__tensor_missing(ckpt_engine *e, size_t i)
{
    e->s.g.held_have[i] = false;
}

int ckpt__hold_space(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    struct ckpt_gen *g = &e->s.g;
    /* The caller abandoned the job in flight first (ckpt_load, ckpt_hold): a writer that
       still reads g never commits what it read (ckpt.c J5, writer.c W5). */
    int rc = stage(e, t, n, false);
    if (rc)
        return rc;
    memset(g->frozen_ok, 0, g->held_cap * sizeof(*g->frozen_ok)); /* filled by other means */
    lay_out(e, t, n);
    return 0;
}

/* The held snapshot's layout, saved (save) or put back (!save): off, len, row0, have. */
static void was_copy(ckpt_engine *e, bool save)
{
    struct ckpt_gen *g = &e->s.g;
    size_t n = e->s.was.n;
    if (n == 0)
        return; /* a spare's engine has held nothing yet: no arrays */
    size_t *off = e->s.was.save;
    uint64_t *len = (uint64_t *)(off + n);
    int64_t *row0 = (int64_t *)(len + n);
    bool *have = (bool *)(row0 + n);
    if (save) {
        memcpy(off, g->held_off, n * sizeof(*off));
        memcpy(len, g->held_len, n * sizeof(*len));
        memcpy(row0, g->held_row0, n * sizeof(*row0));
        memcpy(have, g->held_have, n * sizeof(*have));
    } else {
        memcpy(g->held_off, off, n * sizeof(*off));
        memcpy(g->held_len, len, n * sizeof(*len));
        memcpy(g->held_row0, row0, n * sizeof(*row0));
        memcpy(g->held_have, have, n * sizeof(*have));
    }
}

/* The end of an open (sealed, cancelled, or failed): what it saved goes. */
static void was_end(ckpt_engine *e)
{
    free(e->s.was.save);
    e->s.was.save = NULL;
    free(e->s.was.pieces);
    e->s.was.pieces = NULL;
    e->s.was.open = false;
    e->s.was.from_old = false;
    e->s.was.partner = false;
}

int ckpt__hold_open(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n, unsigned char **where,
                    const ckpt_snapshot **before)
{
    struct ckpt_gen *g = &e->s.g;
    ckpt_hold_cancel(e); /* an earlier open neither sealed nor cancelled */
    if (step >= 0 && g->held_step != step && e->s.old.held_step == step)
        ckpt_snapshot_select(e, step); /* S6; where it fails, *before says what is held */
    const ckpt_snapshot *s = ckpt_snapshot_held(e);
    e->s.was.view = *s;
    *before = &e->s.was.view;
    e->s.was.pieces = malloc((2 * s->n + 1) * sizeof(ckpt_piece));
    if (!e->s.was.pieces) {
        e->s.was.view = (ckpt_snapshot){.step = -1, .left_step = -1};
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "the pieces of the held snapshot (%zu tensors)", s->n);
    }
    if (s->n)
        memcpy(e->s.was.pieces, s->own, s->n * sizeof(ckpt_piece));
    if (s->n && s->left)
        memcpy(e->s.was.pieces + s->n, s->left, s->n * sizeof(ckpt_piece));
    e->s.was.view.own = e->s.was.pieces;
    e->s.was.view.left = s->left ? e->s.was.pieces + s->n : NULL;
    size_t m = g->held_n;
    e->s.was.save = malloc(m ? m * (sizeof(size_t) + sizeof(uint64_t) + sizeof(int64_t) + sizeof(bool)) : 1);
    if (!e->s.was.save) {
        was_end(e);
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "the layout of the held snapshot (%zu tensors)", m);
    }
    e->s.was.n = m;
    e->s.was.step = g->held_step;
    e->s.was.hdr = g->held_hdr;
    e->s.was.out = g->held_out;
    was_copy(e, true);
    int rc = stage(e, t, n, true); /* on failure nothing changed: the snapshot stays held */
    if (rc) {
        was_end(e);
        return rc;
    }
    e->s.was.open = true;
    e->s.was.retired = !e->s.prev && e->s.retired; /* stage retired it: an abandoned writer reads it */
    lay_out(e, t, n);
    for (size_t i = 0; i < n; i++)
        where[i] = (unsigned char *)g->staging + g->held_off[i];
    return 0;
}

void ckpt_hold_cancel(ckpt_engine *e)
{
    struct ckpt_gen *g = &e->s.g;
    if (!e->s.was.open)
        return;
    /* Nobody reads the new region (the writer was abandoned before it existed): the older
       generation's again where it was its (S11, holding nothing), else it goes. */
    if (e->s.was.from_old && !e->s.old.staging) {
        e->s.old.staging = g->staging;
        e->s.old.staging_cap = g->staging_cap;
    } else {
        ckpt__unmap_region(e, g->staging, g->staging_cap);
    }
    char **old = e->s.was.retired ? &e->s.retired : &e->s.prev;
    size_t *old_cap = e->s.was.retired ? &e->s.retired_cap : &e->s.prev_cap;
    g->staging = *old;
    g->staging_cap = *old_cap;
    *old = NULL;
    *old_cap = 0;
    was_copy(e, false);
    g->held_n = e->s.was.n;
    g->held_hdr = e->s.was.hdr;
    g->held_out = e->s.was.out;
    g->held_step = e->s.was.step;
    was_end(e);
}

int ckpt_hold_partner(ckpt_engine *e, int64_t step, const uint64_t *bytes, const int64_t *row0, size_t n,
                      unsigned char **where)
{
    struct ckpt_gen *o = &e->s.old;
    if (!bytes) { /* dropped: the caller could not fill it */
        e->s.was.partner = false;
        return 0;
    }
    if (!e->s.was.open || n > e->s.g.held_cap)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_STATE, "partner copy of a rebuild: %s",
                        e->s.was.open ? "more tensors than the rebuilt snapshot" : "no rebuild is open");
    size_t len = ckpt__hdr_bytes(n);
    for (size_t i = 0; i < n; i++)
        len += ALIGN_UP(bytes[i]);
    /* S11: the older generation holds nothing the job can roll back to any more (its
       region may be written from here on), whatever follows. */
    o->held_step = -1;
    o->left_step = -1;
    o->partner_len = 0;
    if (len > o->partner_cap) {
        ckpt_copy_unpin(e->s.dev_copy, o->partner); /* it may have been staging (ckpt_hold_seal) */
        void *p = rk__remap(o->partner, o->partner_cap, ALIGN_UP(len));
        if (!p)
            return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -errno, "partner copy of %zu bytes: %s", len,
                            strerror(errno));
        o->partner = p;
        o->partner_cap = ALIGN_UP(len);
    }
    uint64_t *h = (uint64_t *)o->partner;
    h[0] = HDR_MAGIC;
    h[1] = (uint64_t)step;
    h[2] = n;
    size_t off = ckpt__hdr_bytes(n);
    for (size_t i = 0; i < n; i++) {
        h[3 + 2 * i] = bytes[i];
        h[4 + 2 * i] = (uint64_t)row0[i];
        where[i] = (unsigned char *)o->partner + off;
        off += ALIGN_UP(bytes[i]);
    }
    o->partner_len = len;
    e->s.was.partner = true;
    return 0;
}

int ckpt_hold_seal(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    struct ckpt_gen *g = &e->s.g, *o = &e->s.old;
    ckpt__seal(e, step);
    bool partner = e->s.was.partner;
    was_end(e);
    if (partner) { /* S11: the partner copy built beside it; the one it was built from goes */
        ckpt__unmap_region(e, g->partner, g->partner_cap);
        g->partner = o->partner;
        g->partner_cap = o->partner_cap;
        g->partner_len = o->partner_len;
        o->partner = NULL;
        o->partner_cap = o->partner_len = 0;
        ckpt_snapshot_accept(e); /* its failure (logged) leaves no partner copy */
    } else {
        g->left_step = -1; /* of the membership before: not this snapshot's */
    }
    size_t need = ckpt__staging_bytes(t, n);
    if (e->s.prev && !e->one_copy && !o->staging && e->s.prev_cap >= need) {
        /* S11: the old snapshot's region is the older generation's, the next turn's (the
           sizes did not grow: a job of replicated state, or a spare brought in) */
        o->staging = e->s.prev;
        o->staging_cap = e->s.prev_cap;
        forget_old(e);
    } else if (e->s.prev && (partner || e->one_copy)) { /* too small for the next turn, or none (S13): it goes */
        ckpt__unmap_region(e, e->s.prev, e->s.prev_cap);
    } else if (e->s.prev) { /* else retired: the abandoned writer's until it is idle */
        /* The old snapshot's region is the next partner copy's inbox: that one is usually
           as large, so a partner copy after a rebuild grows it in place, not anew. */
        ckpt__unmap_region(e, g->partner, g->partner_cap);
        g->partner = e->s.prev;
        g->partner_cap = e->s.prev_cap;
        g->partner_len = 0;
        g->left_step = -1;
    }
    if (e->s.prev) {
        e->s.prev = NULL;
        e->s.prev_cap = 0;
    }
    return ckpt_restore_held(e, t, n);
}

int ckpt__hold(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int rc = ckpt__hold_space(e, t, n);
    if (!rc)
        rc = copy_in(e, step, t, n);
    int src = ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4));
    return rc ? rc : src;
}

/* What generation g holds, as recovery sees it, in s. */
static const ckpt_snapshot *view(ckpt_engine *e, struct ckpt_gen *g, ckpt_snapshot *s)
{
    ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)); /* S5: held once copied whole */
    pthread_mutex_lock(&e->mu);
    uint64_t epoch = e->epoch;
    pthread_mutex_unlock(&e->mu);
    *s = (ckpt_snapshot){.step = g->held_step, .rank = g->held_rank, .world = g->held_world, .left_step = -1};
    if (g->held_step < 0)
        return s;
    s->n = g->held_n;
    for (size_t i = 0; i < g->held_n; i++)
        g->own_p[i] = (ckpt_piece){.data = g->held_have[i] ? g->staging + g->held_off[i] : NULL,
                                   .nbytes = g->held_len[i], .row0 = g->held_row0[i]};
    s->own = g->own_p;
    s->out = g->staging;
    s->out_bytes = g->held_out;
    if (g->left_step >= 0) {
        s->left_step = g->left_step;
        s->left = g->left_p;
    }
    s->partnered = g->left_step == g->held_step && g->left_epoch == g->held_epoch && g->held_epoch == epoch;
    return s;
}

const ckpt_snapshot *ckpt_snapshot_held(ckpt_engine *e)
{
    return view(e, &e->s.g, &e->s.snap);
}

const ckpt_snapshot *ckpt_snapshot_older(ckpt_engine *e)
{
    return view(e, &e->s.old, &e->s.snap_old);
}

int ckpt_snapshot_select(ckpt_engine *e, int64_t step)
{
    if (ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)) == RK_E_TIMEOUT && e->s.cp.pending)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT, "no snapshot can be selected while the copy of step "
                        "%" PRId64 " into the newest generation still runs", e->s.cp.step); /* S6: g stays the copy's */
    if (step >= 0 && e->s.g.held_step == step)
        return 0;
    if (step < 0 || e->s.old.held_step != step || e->s.was.open)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NOCKPT, "no snapshot of step %" PRId64 " is held in memory "
                        "(held: %" PRId64 " and %" PRId64 ")", step, e->s.g.held_step, e->s.old.held_step);
    swap_gens(e);
    RK_LOG_INFO(RK_SUB_CKPT, "the snapshot of step %" PRId64 " is the held one again (the newer one, of step %" PRId64
                ", is not offered)", step, e->s.old.held_step);
    return 0;
}

/* The step s offers a recovery of t[0..n) (ckpt_snapshot_offer), -1 if none. */
static int64_t offered(const ckpt_snapshot *s, const ckpt_tensor *t, size_t n, bool partnered)
{
    if (s->step < 0 || (partnered && !s->partnered) || (!t && n))
        return -1;
    return ckpt_snapshot_matches(s, t, n) ? s->step : -1;
}

ckpt_offer ckpt_snapshot_offer(ckpt_engine *e, const ckpt_tensor *t, size_t n, bool partnered)
{
    ckpt_offer o = {.held = offered(ckpt_snapshot_held(e), t, n, partnered),
                    .older = offered(ckpt_snapshot_older(e), t, n, partnered)};
    if (o.older == o.held)
        o.older = -1;
    o.committed = ckpt_last_committed(e);
    return o;
}

int ckpt_snapshot_restore(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int rc = ckpt_snapshot_select(e, step);
    return rc ? rc : ckpt_restore_held(e, t, n);
}

bool ckpt_snapshot_matches(const ckpt_snapshot *s, const ckpt_tensor *t, size_t n)
{
    if (s->step < 0 || s->n != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s->own[i].nbytes != t[i].nbytes)
            return false;
    return true;
}

void *ckpt_snapshot_inbox(ckpt_engine *e, size_t bytes)
{
    struct ckpt_gen *g = &e->s.g;
    g->left_step = -1;
    g->partner_len = 0;
    if (bytes > g->partner_cap) {
        size_t cap = ALIGN_UP(bytes);
        ckpt_copy_unpin(e->s.dev_copy, g->partner); /* it may have been staging (ckpt_hold_seal) */
        void *p = rk__remap(g->partner, g->partner_cap, cap);
        if (!p) {
            rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -errno, "partner copy of %zu bytes: %s", bytes, strerror(errno));
            return NULL;
        }
        g->partner = p;
        g->partner_cap = cap;
    }
    g->partner_len = bytes;
    return g->partner ? g->partner : (void *)e; /* 0 bytes: any non-NULL address */
}

int ckpt_snapshot_accept(ckpt_engine *e)
{
    struct ckpt_gen *g = &e->s.g;
    const uint64_t *h = (const uint64_t *)g->partner;
    size_t len = g->partner_len;
    g->left_step = -1;
    if (len < ckpt__hdr_bytes(0) || h[0] != HDR_MAGIC || h[2] > g->held_cap || ckpt__hdr_bytes(h[2]) > len)
        return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_CORRUPT, "partner copy: malformed header (%zu bytes)", len);
    size_t n = h[2], off = ckpt__hdr_bytes(n);
    for (size_t i = 0; i < n; i++) {
        size_t nb = h[3 + 2 * i];
        if (nb > len || off > len - nb)
            return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_CORRUPT, "partner copy: piece %zu past its end", i);
        g->left_p[i] = (ckpt_piece){.data = g->partner + off, .nbytes = nb, .row0 = (int64_t)h[4 + 2 * i]};
        off += ALIGN_UP(nb);
    }
    pthread_mutex_lock(&e->mu);
    g->left_epoch = e->epoch;
    pthread_mutex_unlock(&e->mu);
    g->left_step = (int64_t)h[1];
    return 0;
}

int ckpt_restore_held(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    if (!ckpt_snapshot_matches(ckpt_snapshot_held(e), t, n))
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_STATE, "no snapshot of these tensors is held in memory");
    /* Through the same engines as the snapshot, waited for here: the caller goes on with
       the restored buffers (a device tensor's copy is done before its stream's next work
       can read it, as the host waited for it). */
    uint64_t hg, dg;
    int64_t deadline = rk__deadline_ns(e->timeout_ms);
    int rc = copy_start(e, t, n, false, &hg, &dg);
    int hrc = ckpt_copy_wait(e->s.host_copy, hg, deadline);
    int drc = dg ? ckpt_copy_wait(e->s.dev_copy, dg, deadline) : 0;
    rc = rc ? rc : hrc ? hrc : drc;
    ckpt__prep_release(e); /* a restore's next region, mapped ahead only now (S9) */
    if (rc) {
        char why[512];
        snprintf(why, sizeof(why), "%s", rk_last_error());
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "restore of the snapshot of step %" PRId64 ": %s",
                        e->s.g.held_step, why);
    }
    return 0;
}
