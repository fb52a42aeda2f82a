/*
 * recover/rebuild.c - the rollback from memory of a job with sharded or per-rank state
 * (docs/SHARDING.md, "After a lost member"): the plan of which member holds which old
 * piece and takes which range of the new split, and the exchange that carries it out over
 * the rebuilt ring. rec_ckpt_rollback (api_ckpt.c) calls rec_rebuild.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt.h"
#include "../ring/ring.h"
#include "rec.h"
#include "rec_internal.h"

/* The even split of `rows` over `world` members: member r gets rows / world of them, one
   more if r < rows % world, in rank order. Returns its count, its first row in *row0. */
int64_t rec_even_split(int64_t rows, int world, int r, int64_t *row0)
{
    int64_t q = rows / world, m = rows % world;
    *row0 = r * q + (r < m ? r : m);
    return q + (r < m);
}

/* The plan of one tensor's rebuild. The old ranks' pieces laid end to end (old rank
   order: a sharded tensor's global rows, per-rank state rank after rank) form a vector;
   old rank q's piece [at[q], at[q] + len[q]) is held now by a new member: q itself if it
   survived, else its right neighbour (the partner copy; held_piece). Each new member r
   takes the range [lo[r], hi[r]) of that vector: for a sharded tensor the even split
   resplit made, for per-rank state the piece of old rank r (none for a rank beyond the
   old world). Every member computes the same plan from the agreed sizes. */
struct plan {
    int w0, w;              /* old and new world */
    const int32_t *nr;      /* old rank -> new rank + 1 (0: lost) */
    const int32_t *old;     /* new rank -> old rank (-1: none) */
    const int64_t *len;     /* each old rank's piece, bytes */
    int64_t *at;            /* where each starts (w0 + 1) */
    int64_t *lo, *hi;       /* each new rank's range */
};

/* Old rank whose piece new member h holds in slot 0 (its own) or 1 (its lost left
   neighbour's partner copy); -1 if none. */
static int held_piece(const struct plan *p, int h, int slot)
{
    int q = p->old[h];
    if (q < 0 || slot == 0)
        return q;
    int l = (q + p->w0 - 1) % p->w0;
    return l != q && !p->nr[l] ? l : -1;
}

/* The part of old piece q that new member r takes: [*a, *b) of the vector (empty: a >= b). */
static void take(const struct plan *p, int q, int r, int64_t *a, int64_t *b)
{
    int64_t pa = p->at[q], pb = p->at[q] + p->len[q];
    *a = pa > p->lo[r] ? pa : p->lo[r];
    *b = pb < p->hi[r] ? pb : p->hi[r];
}

/* Whether any member sends something at distance k from its held piece `slot`. */
static bool plan_sends(const struct plan *p, int k, int slot)
{
    for (int h = 0; h < p->w; h++) {
        int q = held_piece(p, h, slot);
        int64_t a, b;
        if (q >= 0 && (take(p, q, (h + k) % p->w, &a, &b), a < b))
            return true;
    }
    return false;
}

/* One tensor's part of the rebuild on this member: what it holds of its own
   range (src[slot]: its held pieces) is copied into dst (its range; NULL: received
   nowhere), then the shifts at distance 1 .. w-1 send every other member its part. Every
   member makes every shift of the plan, whatever failed before it: a member that left
   the series early would keep the others waiting. Returns the first error; *sent counts
   the bytes sent. */
static int exchange(rk_ctx *ctx, const struct plan *p, const unsigned char *const src[2], unsigned char *dst,
                    int64_t *sent)
{
    ring_cancel cancel = {.deadline_ns = 0, .changed = rec_ring_changed, .arg = ctx};
    int rc = 0, w = p->w, me = ctx->rank;
    for (int slot = 0; slot < 2 && dst; slot++) {
        int q = held_piece(p, me, slot);
        int64_t a, b;
        if (q >= 0 && src[slot] && (take(p, q, me, &a, &b), a < b))
            memcpy(dst + (a - p->lo[me]), src[slot] + (a - p->at[q]), (size_t)(b - a));
    }
    for (int k = 1; k < w; k++)
        for (int slot = 0; slot < 2; slot++) {
            if (!plan_sends(p, k, slot))
                continue;
            int to = (me + k) % w, qs = held_piece(p, me, slot), qr = held_piece(p, (me + w - k) % w, slot);
            int64_t sa = 0, sb = 0, ra = 0, rb = 0;
            if (qs >= 0)
                take(p, qs, to, &sa, &sb);
            if (qr >= 0)
                take(p, qr, me, &ra, &rb);
            size_t sn = sa < sb ? (size_t)(sb - sa) : 0, rn = ra < rb ? (size_t)(rb - ra) : 0;
            const unsigned char *sp = sn && src[slot] ? src[slot] + (sa - p->at[qs]) : NULL;
            unsigned char *rp = rn && dst ? dst + (ra - p->lo[me]) : NULL;
            int r2 = ring_shift_by(ctx->ring, k, sp, sp ? sn : 0, rp, rp ? rn : 0, &cancel);
            *sent += sp ? (int64_t)sn : 0;
            if (r2 && !rc)
                rc = r2;
        }
    return rc;
}

/* The rollback from memory of a job with sharded or per-rank state (docs/SHARDING.md):
   each member holds its own pieces of the decision's step and its left neighbour's
   (ckpt.c I14), and rec_decide made sure that every lost member's right neighbour
   survived. Tensor by tensor (struct plan), each member copies what it holds of its new
   range, then sends every other member the parts of its pieces that member takes, point
   to point: shifts at distance 1 .. w-1 (ring_shift_by), one per held piece, skipped by
   every member where the plan has nothing to send at that distance. Only what changes
   hands moves: after one loss of w0, mostly the lost piece and the edges of the new
   split. The result is the new held snapshot, copied into the buffers (a slice whose
   size changed waits for rk_rebind), then mirrored anew. */
int rec_rebuild(rk_ctx *ctx, const rec_decision *dec, const ckpt_tensor *t)
{
    const ckpt_snapshot *s = ckpt_snapshot_held(ctx->ckpt);
    size_t n = ctx->ntensors;
    int w0 = s->world, me = s->rank, left = (s->rank + w0 - 1) % w0, w = ctx->world;
    /* (partnered no longer: the rollback moved the engine to the new membership) */
    if (s->step != dec->step || s->left_step != dec->step || n != s->n)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: the snapshot of step %" PRId64
                        " and its partner copy are no longer held (held %" PRId64 ", left %" PRId64 ", %zu of %zu tensors)",
                        dec->step, s->step, s->left_step, s->n, n);
    int rc = 0;
    int32_t *nr = calloc((size_t)w0, sizeof(*nr)), *old = malloc((size_t)w * sizeof(*old));
    int64_t *len = calloc(n * (size_t)w0, sizeof(*len)), *at = calloc((size_t)w0 + 1, sizeof(*at));
    int64_t *lo = calloc((size_t)w, sizeof(*lo)), *hi = calloc((size_t)w, sizeof(*hi));
    unsigned char **where = calloc(n, sizeof(*where));
    if (!nr || !old || !len || !at || !lo || !hi || !where) {
        rc = -ENOMEM;
        goto out;
    }
    /* Which old ranks survived and their new ranks, and every old rank's piece sizes
       (from it or its partner). */
    nr[me] = ctx->rank + 1;
    if ((rc = rec_ckpt_call(ctx, nr, (size_t)w0, RK_I32, RK_MAX)) != 0)
        goto out;
    for (int r = 0; r < w; r++)
        old[r] = -1;
    for (int q = 0; q < w0; q++) {
        if (nr[q] > w) {
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: old rank %d claims new rank %d of %d", q,
                          nr[q] - 1, w);
            goto out;
        }
        if (nr[q])
            old[nr[q] - 1] = q;
        if (!nr[q] && !nr[(q + 1) % w0]) {
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: old ranks %d and %d are both lost", q,
                          (q + 1) % w0);
            goto out;
        }
    }
    bool left_lost = !nr[left];
    for (size_t i = 0; i < n; i++) {
        if (!t[i].flags)
            continue;
        len[i * (size_t)w0 + (size_t)me] = (int64_t)s->own[i].nbytes;
        if (left_lost)
            len[i * (size_t)w0 + (size_t)left] = (int64_t)s->left[i].nbytes;
    }
    if ((rc = rec_ckpt_call(ctx, len, n * (size_t)w0, RK_I64, RK_SUM)) != 0)
        goto out;
    /* The new snapshot is built in a new staging region; the old one (s) stays readable. */
    int64_t t0 = rk__mono_ns();
    if ((rc = ckpt_hold_open(ctx->ckpt, t, n, where)) != 0)
        goto out;
    struct plan p = {.w0 = w0, .w = w, .nr = nr, .old = old, .at = at, .lo = lo, .hi = hi};
    int64_t orphaned = 0, sent = 0;
    for (size_t i = 0; i < n; i++) {
        if (!t[i].flags) { /* replicated: every member holds it */
            if (t[i].nbytes)
                memcpy(where[i], s->own[i].data, t[i].nbytes);
            continue;
        }
        struct rec_tensor *reg = &ctx->tensors[i];
        p.len = len + i * (size_t)w0;
        for (int q = 0; q < w0; q++)
            at[q + 1] = at[q] + p.len[q];
        bool sharded = t[i].flags & RK_SHARDED;
        for (int r = 0; r < w; r++) {
            if (sharded) {
                int64_t rb = (int64_t)rec_row_bytes(reg), row0, rows = rec_even_split(reg->rows_global, w, r, &row0);
                lo[r] = row0 * rb;
                hi[r] = lo[r] + rows * rb;
            } else {
                lo[r] = r < w0 ? at[r] : 0;
                hi[r] = r < w0 ? at[r + 1] : 0;
            }
        }
        int64_t size = (int64_t)t[i].nbytes;
        /* A new rank with no per-rank state keeps its buffer as it is (in the snapshot). */
        bool keep = !sharded && ctx->rank >= w0;
        bool bad = !keep && (hi[w - 1] > at[w0] || hi[ctx->rank] - lo[ctx->rank] != size);
        if (bad && !rc)
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MISMATCH, "rollback: tensor '%s' of %" PRId64 " bytes here "
                          "does not match the pieces held of step %" PRId64, t[i].name, size, dec->step);
        if (!sharded && ctx->rank == 0)
            orphaned += w0 > w ? w0 - w : 0;
        if (keep && size)
            memcpy(where[i], t[i].ptr, (size_t)size);
        /* This member's range goes straight into the new snapshot. */
        const unsigned char *src[2] = {s->own[i].data, left_lost ? s->left[i].data : NULL};
        int r2 = exchange(ctx, &p, src, bad || keep ? NULL : where[i], &sent);
        if (r2 && !rc)
            rc = r2;
    }
    if (rc)
        goto out;
    if (orphaned > 0) {
        char ranks[256] = "";
        for (int q = w, k = 0; q < w0; q++)
            k += snprintf(ranks + k, sizeof(ranks) - (size_t)k > 0 ? sizeof(ranks) - (size_t)k : 0, "%s%d",
                          q > w ? "," : "", q);
        RK_LOG_WARN(RK_SUB_CKPT, "step %" PRId64 ": per-rank state of old rank(s) %s belongs to no rank of this world "
                    "of %d: dropped from memory (a committed checkpoint of that step keeps it)", dec->step, ranks, w);
        RK_EVENT(ctx->ev, "per_rank_orphaned", RK_EV_I("step", dec->step), RK_EV_S("ranks", ranks),
                 RK_EV_I("tensors", orphaned / (w0 - w)), RK_EV_I("world", w), RK_EV_S("from", "memory"));
    }
    /* The new snapshot replaces the old, and goes to the buffers (a slice whose size
       changed waits for rk_rebind). */
    int64_t t1 = rk__mono_ns(), t2ns = t1, t3 = t1;
    ckpt_hold_seal(ctx->ckpt, dec->step);
    if ((rc = ckpt_restore_held(ctx->ckpt, t, n)) == 0) {
        t2ns = rk__mono_ns();
        int m = rec_ckpt_mirror(ctx);
        if (m == RK_E_PEER_LOST || m == RK_E_TIMEOUT)
            rc = m;
        t3 = rk__mono_ns();
    }
    if (!rc)
        RK_LOG_INFO(RK_SUB_REC, "rollback of step %" PRId64 " from memory: new snapshot built in %.3f s (%" PRId64
                    " bytes sent from here), buffers %.3f s, partner copy %.3f s", dec->step,
                    (double)(t1 - t0) / 1e9, sent, (double)(t2ns - t1) / 1e9, (double)(t3 - t2ns) / 1e9);
out:
    free(where);
    free(nr);
    free(old);
    free(len);
    free(at);
    free(lo);
    free(hi);
    return rc;
}
