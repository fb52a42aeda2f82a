/*
 * ckpt/ckpt_held.c - the held snapshot's two generations and what recovery does with them:
 * the newest and the older view (ckpt_snapshot_held, _older), turning and selecting the
 * generations (I16), the partner copy's inbox (I14), a snapshot built in place by a
 * rebuild (ckpt_hold_open / _cancel / _seal) or held from the registered buffers
 * (ckpt_hold), and the restore from it. The invariants are ckpt/ckpt.c's (I8, I11, I14,
 * I15, I16); the copy into staging and its settling live there.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"

int ckpt__hold_space(ckpt_engine *e, const ckpt_tensor *t, size_t n)
{
    /* Overwriting staging under a live job would tear what it writes: the job goes first.
       An abandoned writer may still read staging; it never commits what it read (I10). */
    ckpt_abandon(e);
    int rc = ckpt__stage(e, t, n, false);
    if (rc)
        return rc;
    memset(e->g.frozen_ok, 0, e->g.held_cap * sizeof(*e->g.frozen_ok)); /* filled by other means */
    ckpt__hold_layout(e, t, n);
    return 0;
}

/* The held snapshot's layout, saved (save) or put back (!save): off, len, row0, have. */
static void was_copy(ckpt_engine *e, bool save)
{
    size_t n = e->was.n;
    if (n == 0)
        return; /* a spare's engine has held nothing yet: no arrays */
    size_t *off = e->was.save;
    uint64_t *len = (uint64_t *)(off + n);
    int64_t *row0 = (int64_t *)(len + n);
    bool *have = (bool *)(row0 + n);
    if (save) {
        memcpy(off, e->g.held_off, n * sizeof(*off));
        memcpy(len, e->g.held_len, n * sizeof(*len));
        memcpy(row0, e->g.held_row0, n * sizeof(*row0));
        memcpy(have, e->g.held_have, n * sizeof(*have));
    } else {
        memcpy(e->g.held_off, off, n * sizeof(*off));
        memcpy(e->g.held_len, len, n * sizeof(*len));
        memcpy(e->g.held_row0, row0, n * sizeof(*row0));
        memcpy(e->g.held_have, have, n * sizeof(*have));
    }
}

int ckpt_hold_open(ckpt_engine *e, const ckpt_tensor *t, size_t n, unsigned char **where)
{
    ckpt_abandon(e);
    ckpt_hold_cancel(e); /* an earlier open neither sealed nor cancelled */
    size_t m = e->g.held_n;
    e->was.save = malloc(m ? m * (sizeof(size_t) + sizeof(uint64_t) + sizeof(int64_t) + sizeof(bool)) : 1);
    if (!e->was.save)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -ENOMEM, "the layout of the held snapshot (%zu tensors)", m);
    e->was.n = m;
    e->was.step = e->g.held_step;
    e->was.hdr = e->g.held_hdr;
    e->was.out = e->g.held_out;
    was_copy(e, true);
    int rc = ckpt__stage(e, t, n, true); /* on failure nothing changed: the snapshot stays held */
    if (rc) {
        free(e->was.save);
        e->was.save = NULL;
        return rc;
    }
    e->was.open = true;
    e->was.retired = !e->prev && e->retired; /* stage retired it: an abandoned writer reads it */
    ckpt__hold_layout(e, t, n);
    for (size_t i = 0; i < n; i++)
        where[i] = (unsigned char *)e->g.staging + e->g.held_off[i];
    return 0;
}

void ckpt_hold_cancel(ckpt_engine *e)
{
    if (!e->was.open)
        return;
    /* Nobody reads the new region (the writer was abandoned before it existed). */
    ckpt__unmap_region(e, e->g.staging, e->g.staging_cap);
    char **old = e->was.retired ? &e->retired : &e->prev;
    size_t *old_cap = e->was.retired ? &e->retired_cap : &e->prev_cap;
    e->g.staging = *old;
    e->g.staging_cap = *old_cap;
    *old = NULL;
    *old_cap = 0;
    was_copy(e, false);
    e->g.held_n = e->was.n;
    e->g.held_hdr = e->was.hdr;
    e->g.held_out = e->was.out;
    e->g.held_step = e->was.step;
    free(e->was.save);
    e->was.save = NULL;
    e->was.open = false;
}

void ckpt_hold_seal(ckpt_engine *e, int64_t step)
{
    ckpt__seal(e, step);
    free(e->was.save);
    e->was.save = NULL;
    e->was.open = false;
    if (!e->prev)
        return; /* retired: the abandoned writer's until it is idle */
    /* The old snapshot's region is the next partner copy's inbox: that one is usually
       as large, so a partner copy after a rebuild grows it in place, not anew. */
    ckpt__unmap_region(e, e->g.partner, e->g.partner_cap);
    e->g.partner = e->prev;
    e->g.partner_cap = e->prev_cap;
    e->g.partner_len = 0;
    e->g.left_step = -1;
    e->prev = NULL;
    e->prev_cap = 0;
}

int ckpt_hold(ckpt_engine *e, int64_t step, const ckpt_tensor *t, size_t n)
{
    int rc = ckpt__hold_space(e, t, n);
    if (!rc)
        rc = ckpt__hold_copy(e, step, t, n);
    int src = ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4));
    return rc ? rc : src;
}

/* What generation g holds, as recovery sees it, in s. */
static const ckpt_snapshot *view(ckpt_engine *e, struct ckpt_gen *g, ckpt_snapshot *s)
{
    ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)); /* I15: held once copied whole */
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
    return view(e, &e->g, &e->snap);
}

const ckpt_snapshot *ckpt_snapshot_older(ckpt_engine *e)
{
    return view(e, &e->old, &e->snap_old);
}

static void swap_gens(ckpt_engine *e)
{
    struct ckpt_gen t = e->g;
    e->g = e->old;
    e->old = t;
}

int ckpt_snapshot_select(ckpt_engine *e, int64_t step)
{
    if (ckpt__settle(e, false, rk__deadline_ns(e->timeout_ms / 4)) == RK_E_TIMEOUT && e->cp.pending)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_TIMEOUT, "no snapshot can be selected while the copy of step "
                        "%" PRId64 " into the newest generation still runs", e->cp.step); /* g stays its (I16) */
    if (step >= 0 && e->g.held_step == step)
        return 0;
    if (step < 0 || e->old.held_step != step || e->was.open)
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_NOCKPT, "no snapshot of step %" PRId64 " is held in memory "
                        "(held: %" PRId64 " and %" PRId64 ")", step, e->g.held_step, e->old.held_step);
    swap_gens(e);
    RK_LOG_INFO(RK_SUB_CKPT, "the snapshot of step %" PRId64 " is the held one again (the newer one, of step %" PRId64
                ", is not offered)", step, e->old.held_step);
    return 0;
}

/* I16: a snapshot about to be copied goes into the region of the older generation, which
   then becomes g, so that the newest whole snapshot and its partner copy stay held, as
   old, while the copy runs. A region a writer reads is never written (its checkpoint would
   be torn): when the writer reads old (a disk write longer than a step), old is put aside
   as park, whose region takes its place first — a third region, which the writer does not
   read (it reads one at a time) — so the newest whole snapshot still stays held. (Before,
   the copy overwrote g then: a loss during it and its partner copy rolled back to the
   step being written, several steps back: seen in the seed-3300 campaign, run 140.) With
   nothing whole in g and g not read, the copy goes into g. Called with no copy pending. */
void ckpt__next_gen(ckpt_engine *e)
{
    bool busy = ckpt_busy(e);
    bool g_read = busy && e->g.staging && e->g.staging == e->job_region;
    bool old_read = busy && e->old.staging && e->old.staging == e->job_region;
    if (e->g.held_step < 0 && !g_read)
        return;
    if (old_read) {
        RK_LOG_DEBUG(RK_SUB_CKPT, "the writer still reads the region of the older snapshot: it is put aside, a third "
                     "region takes its place");
        struct ckpt_gen t = e->park;
        e->park = e->old;
        e->old = t;
        e->old.held_step = -1; /* whatever it held is older than g: never offered */
        e->old.left_step = -1;
    }
    swap_gens(e);
    e->g.held_step = -1; /* to be written: nothing held there, even if what follows fails */
    e->g.left_step = -1;
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
    e->g.left_step = -1;
    e->g.partner_len = 0;
    if (bytes > e->g.partner_cap) {
        size_t cap = ALIGN_UP(bytes);
        ckpt_copy_unpin(e->dev_copy, e->g.partner); /* it may have been staging (ckpt_hold_seal) */
        void *p = rk__remap(e->g.partner, e->g.partner_cap, cap);
        if (!p) {
            rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, -errno, "partner copy of %zu bytes: %s", bytes, strerror(errno));
            return NULL;
        }
        e->g.partner = p;
        e->g.partner_cap = cap;
    }
    e->g.partner_len = bytes;
    return e->g.partner ? e->g.partner : (void *)e; /* 0 bytes: any non-NULL address */
}

int ckpt_snapshot_accept(ckpt_engine *e)
{
    const uint64_t *h = (const uint64_t *)e->g.partner;
    size_t len = e->g.partner_len;
    e->g.left_step = -1;
    if (len < ckpt__hdr_bytes(0) || h[0] != HDR_MAGIC || h[2] > e->g.held_cap || ckpt__hdr_bytes(h[2]) > len)
        return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_CORRUPT, "partner copy: malformed header (%zu bytes)", len);
    size_t n = h[2], off = ckpt__hdr_bytes(n);
    for (size_t i = 0; i < n; i++) {
        size_t nb = h[3 + 2 * i];
        if (nb > len || off > len - nb)
            return rk__fail(RK_SUB_CKPT, RK_LOG_WARN, RK_E_CORRUPT, "partner copy: piece %zu past its end", i);
        e->g.left_p[i] = (ckpt_piece){.data = e->g.partner + off, .nbytes = nb, .row0 = (int64_t)h[4 + 2 * i]};
        off += ALIGN_UP(nb);
    }
    pthread_mutex_lock(&e->mu);
    e->g.left_epoch = e->epoch;
    pthread_mutex_unlock(&e->mu);
    e->g.left_step = (int64_t)h[1];
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
    int rc = ckpt__copy_start(e, t, n, false, &hg, &dg);
    int hrc = ckpt_copy_wait(e->host_copy, hg, deadline);
    int drc = dg ? ckpt_copy_wait(e->dev_copy, dg, deadline) : 0;
    rc = rc ? rc : hrc ? hrc : drc;
    if (rc) {
        char why[512];
        snprintf(why, sizeof(why), "%s", rk_last_error());
        return rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, rc, "restore of the snapshot of step %" PRId64 ": %s", e->g.held_step,
                        why);
    }
    return 0;
}

