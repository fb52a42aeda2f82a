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
#include "../formats/fmt.h"
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

/* ---- the plan (pure: rec_internal.h, struct rec_plan) ------------------------------------ */

int rec_plan_members(struct rec_plan *p)
{
    for (int r = 0; r < p->w; r++)
        p->old[r] = -1;
    for (int q = 0; q < p->w0; q++) {
        if (p->nr[q] < 0 || p->nr[q] > p->w)
            return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: old rank %d claims new rank %d of %d", q,
                            p->nr[q] - 1, p->w);
        if (p->nr[q])
            p->old[p->nr[q] - 1] = q;
        if (!p->nr[q] && !p->nr[(q + 1) % p->w0])
            return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: old ranks %d and %d are both lost", q,
                            (q + 1) % p->w0);
    }
    return 0;
}

void rec_plan_tensor(struct rec_plan *p, const int64_t *len, bool sharded, int64_t rows_global, int64_t row_bytes)
{
    p->len = len;
    p->at[0] = 0;
    for (int q = 0; q < p->w0; q++)
        p->at[q + 1] = p->at[q] + len[q];
    for (int r = 0; r < p->w; r++) {
        if (sharded) {
            int64_t row0, rows = rec_even_split(rows_global, p->w, r, &row0);
            p->lo[r] = row0 * row_bytes;
            p->hi[r] = p->lo[r] + rows * row_bytes;
        } else {
            p->lo[r] = r < p->w0 ? p->at[r] : 0;
            p->hi[r] = r < p->w0 ? p->at[r + 1] : 0;
        }
    }
}

int rec_plan_held(const struct rec_plan *p, int h, int slot)
{
    int q = p->old[h];
    if (q < 0 || slot == 0)
        return q;
    int l = (q + p->w0 - 1) % p->w0;
    return l != q && !p->nr[l] ? l : -1;
}

void rec_plan_take(const struct rec_plan *p, int q, int r, int64_t *a, int64_t *b)
{
    int64_t pa = p->at[q], pb = p->at[q] + p->len[q];
    *a = pa > p->lo[r] ? pa : p->lo[r];
    *b = pb < p->hi[r] ? pb : p->hi[r];
}

bool rec_plan_sends(const struct rec_plan *p, int k, int slot)
{
    for (int h = 0; h < p->w; h++) {
        int q = rec_plan_held(p, h, slot);
        int64_t a, b;
        if (q >= 0 && (rec_plan_take(p, q, (h + k) % p->w, &a, &b), a < b))
            return true;
    }
    return false;
}

void rec_plan_shift(const struct rec_plan *p, int me, int k, int slot, struct rec_move *send, struct rec_move *recv)
{
    int w = p->w;
    send->q = rec_plan_held(p, me, slot);
    recv->q = rec_plan_held(p, (me + w - k) % w, slot);
    send->a = send->b = recv->a = recv->b = 0;
    if (send->q >= 0)
        rec_plan_take(p, send->q, (me + k) % w, &send->a, &send->b);
    if (recv->q >= 0)
        rec_plan_take(p, recv->q, me, &recv->a, &recv->b);
    if (send->a >= send->b)
        send->a = send->b = 0;
    if (recv->a >= recv->b)
        recv->a = recv->b = 0;
}

/* ---- the exchange ---------------------------------------------------------------------- */

/* One tensor's part of the rebuild on this member: what it holds of its own range
   (src[slot]: its held pieces) is copied into dst (its range), then the shifts at distance
   1 .. w-1 send every other member its part. Every member makes every shift of the plan,
   whatever failed before it: a member that left the series early would keep the others
   waiting. Returns the first error; *sent counts the bytes sent. */
static int exchange(rk_ctx *ctx, const struct rec_plan *p, const unsigned char *const src[2], unsigned char *dst,
                    int64_t *sent)
{
    ring_cancel cancel = {.deadline_ns = 0, .changed = rec_ring_changed, .arg = ctx};
    int rc = 0, me = ctx->rank;
    for (int slot = 0; slot < 2; slot++) {
        int q = rec_plan_held(p, me, slot);
        int64_t a, b;
        if (q >= 0 && src[slot] && (rec_plan_take(p, q, me, &a, &b), a < b))
            memcpy(dst + (a - p->lo[me]), src[slot] + (a - p->at[q]), (size_t)(b - a));
    }
    for (int k = 1; k < p->w; k++)
        for (int slot = 0; slot < 2; slot++) {
            if (!rec_plan_sends(p, k, slot))
                continue;
            struct rec_move sm, rm;
            rec_plan_shift(p, me, k, slot, &sm, &rm);
            size_t sn = (size_t)(sm.b - sm.a), rn = (size_t)(rm.b - rm.a);
            const unsigned char *sp = sn ? src[slot] + (sm.a - p->at[sm.q]) : NULL;
            unsigned char *rp = rn ? dst + (rm.a - p->lo[me]) : NULL;
            int r2 = ring_shift_by(ctx->ring, k, sp, sn, rp, rn, &cancel);
            *sent += (int64_t)sn;
            if (r2 && !rc)
                rc = r2;
        }
    return rc;
}

/* Whether every member's tensor i is the size its range of the plan needs (a rank beyond
   the old world keeps its per-rank buffer: any size), and the pieces cover every range;
   replicated ones the same size everywhere. Every member decides the same, from the
   agreed sizes; RK_E_MISMATCH names the tensor and the first rank that does not fit. */
static int check_sizes(const rk_ctx *ctx, const struct rec_plan *p, const ckpt_tensor *ti, const int64_t *size,
                       int64_t step)
{
    bool sharded = ti->flags & RK_SHARDED;
    for (int r = 0; r < p->w; r++) {
        bool fits = !ti->flags ? size[r] == size[0]
                    : !sharded && r >= p->w0 ? true
                    : p->hi[p->w - 1] <= p->at[p->w0] && p->hi[r] - p->lo[r] == size[r];
        if (fits)
            continue;
        return r == ctx->rank
                   ? rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MISMATCH, "rollback: tensor '%s' of %" PRId64 " bytes "
                              "here does not match the pieces held of step %" PRId64, ti->name, size[r], step)
                   : rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_MISMATCH, "rollback: tensor '%s' of rank %d does not match "
                              "the pieces held of step %" PRId64, ti->name, r, step);
    }
    return 0;
}

/* ---- the rebuild ------------------------------------------------------------------------ */

/* The rollback from memory of a job with sharded or per-rank state (docs/SHARDING.md):
   each survivor holds its own pieces of the decision's step and its left neighbour's
   (ckpt.c I14), and rec_decide made sure that every lost member's right neighbour
   survived; a spare brought in holds nothing. Tensor by tensor (struct rec_plan), each
   member copies what it holds of its new range, then sends every other member the parts
   of its pieces that member takes, point to point: shifts at distance 1 .. w-1
   (ring_shift_by), one per held piece, skipped by every member where the plan has nothing
   to send at that distance. Only what changes hands moves: after one loss of w0, mostly
   the lost piece and the edges of the new split. Replicated tensors stay where they are,
   but a spare receives them (a byte-wise MAX over the ring, as spread_held).

   The series is the same on every member whatever fails: all that can fail on one member
   alone (its snapshot, memory, the new staging, tensors_of's trc, RK_FAULT=rollback@N) is
   found before the first collective, which says it to all (a failed share); the plan and
   every size check are computed alike on every member from what they agreed. So a member
   that cannot rebuild stops every member at once, not at RK_TIMEOUT_MS per shift. The
   result is the new held snapshot, copied into the buffers (a slice whose size changed
   waits for rk_rebind), then mirrored anew; on failure the snapshot held before is kept
   (ckpt_hold_cancel). Returns 0, RK_E_PEER_LOST / RK_E_TIMEOUT when the ring broke, or
   another error when the rebuild cannot be done (the caller goes to disk). */
int rec_rebuild(rk_ctx *ctx, const rec_decision *dec, const ckpt_tensor *t, int trc)
{
    const ckpt_snapshot *s = ckpt_snapshot_held(ctx->ckpt);
    size_t n = ctx->ntensors;
    int w = ctx->world, cap = ctx->world0, me = s->rank; /* no old world is larger than the job */
    bool fresh = s->step < 0 && dec->joined > 0;         /* a spare: holds nothing yet */
    int rc = trc, fault = fmt_fault_fail("rollback");
    if (!rc && fault)
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, fault, "rollback: injected failure (RK_FAULT=rollback)");
    if (!rc && !fresh && (s->step != dec->step || s->left_step != dec->step || n != s->n || s->world > cap))
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: the snapshot of step %" PRId64
                      " and its partner copy are no longer held (held %" PRId64 ", left %" PRId64 ", %zu of %zu tensors)",
                      dec->step, s->step, s->left_step, s->n, n);
    /* What the members agree on (MAX): each old rank's new rank + 1 (cap), each tensor's
       piece of each old rank (n x cap: from it, and from its right neighbour's partner
       copy, the same size), each new rank's size of each tensor (n x w). */
    size_t nv = (size_t)cap + n * (size_t)cap + n * (size_t)w;
    int64_t *v = calloc(nv, sizeof(*v)), *at = calloc((size_t)cap + 1, sizeof(*at));
    int64_t *lo = calloc((size_t)w, sizeof(*lo)), *hi = calloc((size_t)w, sizeof(*hi));
    int32_t *nr = calloc((size_t)cap, sizeof(*nr)), *old = calloc((size_t)w, sizeof(*old));
    unsigned char **where = calloc(n ? n : 1, sizeof(*where));
    if (!rc && (!v || !at || !lo || !hi || !nr || !old || !where))
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, -ENOMEM, "rollback: the plan of %zu tensors over %d ranks", n, cap);
    /* The new snapshot is built in a new staging region; the old one (s) stays readable. */
    int64_t t0 = rk__mono_ns();
    bool open = !rc && (rc = ckpt_hold_open(ctx->ckpt, t, n, where)) == 0, sealed = false;
    /* The failed share: whether every member can go on, and the old world. */
    int64_t a[2] = {rc ? 1 : 0, fresh ? 0 : s->world};
    int arc = rec_ckpt_call(ctx, a, 2, RK_I64, RK_MAX);
    if (arc || a[0]) {
        if (!rc)
            rc = arc ? arc : rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_ABORTED, "rollback: another member cannot "
                                      "rebuild the snapshot of step %" PRId64 " from memory", dec->step);
        goto out;
    }
    int w0 = (int)a[1];
    int64_t *len = v + cap, *size = len + n * (size_t)cap;
    if (!fresh) {
        int left = (me + w0 - 1) % w0;
        v[me] = ctx->rank + 1;
        for (size_t i = 0; i < n; i++) {
            if (!t[i].flags)
                continue;
            len[i * (size_t)cap + (size_t)me] = (int64_t)s->own[i].nbytes;
            if (left != me)
                len[i * (size_t)cap + (size_t)left] = (int64_t)s->left[i].nbytes;
        }
    }
    for (size_t i = 0; i < n; i++)
        size[i * (size_t)w + (size_t)ctx->rank] = (int64_t)t[i].nbytes;
    if ((rc = rec_ckpt_call(ctx, v, nv, RK_I64, RK_MAX)) != 0)
        goto out;
    /* From here on every member decides alike. */
    for (int q = 0; q < w0; q++)
        nr[q] = (int32_t)v[q];
    struct rec_plan p = {.w0 = w0, .w = w, .nr = nr, .old = old, .at = at, .lo = lo, .hi = hi};
    if (w0 < 1 || w0 > cap)
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: an old world of %d", w0);
    else
        rc = rec_plan_members(&p);
    bool spread = false; /* a member holds nothing: the replicated tensors go to it */
    for (int r = 0; r < w && !rc; r++)
        spread |= old[r] < 0;
    for (size_t i = 0; i < n && !rc; i++) {
        struct rec_tensor *reg = &ctx->tensors[i];
        rec_plan_tensor(&p, len + i * (size_t)cap, t[i].flags & RK_SHARDED, reg->rows_global,
                        (int64_t)rec_row_bytes(reg));
        rc = check_sizes(ctx, &p, &t[i], size + i * (size_t)w, dec->step);
    }
    if (rc)
        goto out;
    int64_t orphaned = 0, sent = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nb = t[i].nbytes;
        if (!t[i].flags) { /* replicated: every survivor holds it */
            if (nb && !fresh)
                memcpy(where[i], s->own[i].data, nb);
            else if (nb)
                memset(where[i], 0, nb);
            int r2 = spread && nb ? rec_ckpt_call(ctx, where[i], nb, RK_U8, RK_MAX) : 0;
            if (r2 && !rc)
                rc = r2;
            continue;
        }
        struct rec_tensor *reg = &ctx->tensors[i];
        bool sharded = t[i].flags & RK_SHARDED;
        rec_plan_tensor(&p, len + i * (size_t)cap, sharded, reg->rows_global, (int64_t)rec_row_bytes(reg));
        if (!sharded && ctx->rank == 0)
            orphaned += w0 > w ? w0 - w : 0;
        /* A new rank with no per-rank state keeps its buffer as it is (in the snapshot). */
        if (!sharded && ctx->rank >= w0 && nb)
            memcpy(where[i], t[i].ptr, nb);
        /* This member's range goes straight into the new snapshot. */
        const unsigned char *src[2] = {fresh ? NULL : s->own[i].data, fresh ? NULL : s->left[i].data};
        int r2 = exchange(ctx, &p, src, where[i], &sent);
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
    sealed = true;
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
    if (open && !sealed)
        ckpt_hold_cancel(ctx->ckpt); /* the snapshot held before stays held */
    free(where);
    free(v);
    free(at);
    free(lo);
    free(hi);
    free(nr);
    free(old);
    return rc;
}
