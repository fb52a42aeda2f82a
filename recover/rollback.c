/*
 * recover/rollback.c - the rollback: after the ring was rebuilt over a decision's members
 * (recovery.c, REBUILD), every member's registered state is brought to the decision's step,
 * from the survivors' memory or from disk, and a snapshot of that step is left held (with
 * its partner copy), so that the next loss can roll back again. Also what a member offers
 * the coordinator (its held and committed steps: recovery.c's report) and the restore of
 * the newest checkpoint that verifies everywhere, which rk_resume shares.
 *
 * The five branches (the decision's source, coord.c I5) and who performs them:
 *   memory, sharded or per-rank state   rebuild_partnered: the pieces moved as rebuild.c's
 *                                       plan says (pure), point to point over the ring
 *   memory, every member holds the step ckpt_snapshot_restore, each from its own memory
 *   memory, some members hold it        spread_held: the root's bytes to every member
 *   disk                                from_disk (rec_restore_newest, below the step + 1)
 *   nothing                             RK_E_NOCKPT
 *
 * INVARIANTS
 *   B1 One series for everyone: every member makes the same collective calls in the same
 *      order whatever fails on it alone. A local failure (memory, a snapshot no longer
 *      held, rec_ckpt_tensors, RK_FAULT=rollback) is carried into the next collective (a
 *      failed share), so every member learns it in that call, never at RK_TIMEOUT_MS.
 *   B2 The registered buffers are written only once the state is whole on every member:
 *      from memory the new held snapshot is sealed first and then restored; from disk
 *      every member read the checkpoint into staging and all agreed (rec_restore_newest;
 *      rk_resume's may read it checked or inplace instead).
 *   B3 A rollback that fails leaves the snapshot held before it (ckpt_hold_cancel): a
 *      member never holds half a snapshot.
 *   B4 Replicated bytes a member lacks come from the one member that has them (or from
 *      all of them alike): its bytes, zeros elsewhere, a byte-wise MAX over the ring
 *      (rec_spread): exact for every dtype, NaN payloads and -0.0 included.
 *   B5 Two agreement rounds end every rollback: the first (roll_class, MAX) tells every
 *      member how the others' ended; if memory failed on any member, all go to disk in the
 *      same call (never newer than the decision's step: coord.c I4), and a second round
 *      ends that. So every member returns the same: 0, the ring's error (RK_E_PEER_LOST /
 *      RK_E_TIMEOUT: recovery.c starts a new round) or a failure.
 *   B6 Sharded and per-rank state moves only as the plan says (rebuild.c, the same on
 *      every member from what they agreed): each old piece from the member that holds it
 *      (its own, or its right neighbour's partner copy), each new range to its member.
 *   B7 The rebuilt snapshot's partner copy is made from what each member holds, not sent
 *      again whole: member m's is its new left neighbour's new piece, whose parts m holds
 *      already (its old piece and its partner copy of the old left's) are copied locally,
 *      the rest sent by that neighbour from its new snapshot (rec_plan_partner, the same on
 *      every member; shifts at distance 1, as many as the member lacking the most parts
 *      needs). It is built beside the new snapshot (ckpt_hold_partner, ckpt/snapshot.h S11)
 *      and becomes the partner copy at the seal, so a second loss right after the rebuild
 *      still rolls back from memory. A member that could not make its own (no memory, a
 *      length that did not match) keeps none, and says nothing: a loss of its left
 *      neighbour then goes to disk. A ring that broke interrupts the rebuild (AGAIN).
 *   B8 A growth that loses no member (recovery.c G5) may rebuild a step whose partner copy
 *      some member has not (the request came before it was sent: coord.c I5). Every member
 *      learns so in the failed share, and the plan then uses no partner copy (struct
 *      rec_plan.no_left): no old piece is missing, and each member receives from its new
 *      left whatever of its new partner copy it does not hold itself.
 *   B9 A member whose own rollback failed (its snapshot the one held before, B3) puts its
 *      split back as it was before resplit: the next round's decision finds that snapshot
 *      matching the registry and offers it (ckpt_snapshot_matches), instead of a split of
 *      a world that never formed (a newcomer lost in the rebuild: the others went to disk,
 *      49 steps back). And a slice waits for rk_rebind only where it differs from the
 *      buffer the program holds (rec_tensor.bound_rows), never against the split of a
 *      round that failed: a program comparing rk_shard_rows with its buffer then rebinds
 *      exactly when the library waits for it (snapshots were refused for good before,
 *      and a rollback from disk left the buffers of the newer step: the job diverged).
 *
 * STATES of one member (the function performing each transition)
 *
 *   ENTER --(spares brought in: their registrations agreed, join; the engine writes as
 *            the new membership, ckpt_set_membership: rank 0's writer cleans what dead
 *            attempts left before its next write)--> SPLIT
 *   SPLIT --(sharded tensors split over the new world: resplit)--> DECIDE
 *   DECIDE --(memory, partnered: rebuild_partnered, with its partner copy, B7)--> MIRRORED
 *   DECIDE --(memory, all hold: ckpt_snapshot_restore)--> RESTORED
 *   DECIDE --(memory, some hold: spread_held)--> RESTORED
 *   DECIDE --(disk: from_disk)--> RESTORED
 *   DECIDE --(nothing)--> FAILED (RK_E_NOCKPT, after the first round)
 *   RESTORED --(rec_ckpt_mirror: the partner copy)--> MIRRORED
 *   MIRRORED --(round 1, all OK)--> DONE
 *   MIRRORED --(round 1, memory failed on some member)--> FALLBACK
 *   MIRRORED --(round 1, the ring broke on some member)--> AGAIN
 *   FALLBACK --(from_disk, rec_ckpt_mirror, round 2)--> DONE | AGAIN | FAILED
 *
 * What holds in each: SPLIT, DECIDE: the buffers untouched, the snapshot held before
 * still held. RESTORED: the buffers hold the step on this member (B2). MIRRORED: and the
 * partner copy was sent (or failed: the failure is this member's, told in round 1).
 * DONE: every member holds the step in its buffers and in memory; ctx->next_step is it.
 * AGAIN, FAILED: every member returns the same error; a failure before RESTORED left the
 * buffers and the held snapshot as they were (B3).
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

static int agree(rk_ctx *ctx, void *v, rk_dtype dtype, rk_op op)
{
    return rec_ckpt_call(ctx, v, 1, dtype, op);
}

/* ---- what a member offers (recovery.c's report) ------------------------------------- */

/* The steps of both generations that the job can roll back to (ckpt/snapshot.h S4, S6:
   sharded and per-rank state only with the left neighbour's pieces of the same step and
   membership beside it, so that a lost member's are in its right neighbour's memory; a
   snapshot taken before a tensor was registered is not offered). */
static ckpt_offer offer(rk_ctx *ctx, bool partnered)
{
    ckpt_tensor *t = NULL;
    int trc = rec_ckpt_tensors(ctx, &t); /* without them (t NULL): nothing offered */
    (void)trc;
    ckpt_offer o = ckpt_snapshot_offer(ctx->ckpt, t, ctx->ntensors, partnered);
    free(t);
    return o;
}

int64_t rec_ckpt_held_step(rk_ctx *ctx)
{
    return ctx->ckpt ? offer(ctx, rec_ckpt_partnered(ctx)).held : -1;
}

void rec_ckpt_offer(rk_ctx *ctx, bool memory, struct rec_report *r)
{
    ckpt_offer o = {.held = -1, .older = -1, .committed = -1};
    r->partnered = rec_ckpt_partnered(ctx);
    if (ctx->ckpt && memory)
        o = offer(ctx, r->partnered);
    else if (ctx->ckpt)
        o.committed = ckpt_last_committed(ctx->ckpt);
    r->held_step = o.held;
    r->older_step = o.older;
    r->own_step = -1;
    r->own_rank = r->own_world = 0;
    if (ctx->ckpt && memory && r->partnered) { /* a growth needs no partner copy (coord.c I5, I7) */
        ckpt_offer own = offer(ctx, false);
        r->own_step = own.held > own.older ? own.held : own.older;
        const ckpt_snapshot *s = ckpt_snapshot_held(ctx->ckpt);
        if (s->step != r->own_step)
            s = ckpt_snapshot_older(ctx->ckpt);
        if (r->own_step >= 0 && s->step == r->own_step) {
            r->own_rank = s->rank;
            r->own_world = s->world;
        }
    }
    /* Before rk_resume: the directory's newest. */
    r->committed_step = o.committed > ctx->disk_newest ? o.committed : ctx->disk_newest;
}

/* ---- the disk: the newest checkpoint that verifies everywhere ------------------------ */

/* How every rank's attempt at one step ended, ordered so that MAX picks the worst. */
enum { TRY_OK = 0, TRY_SKIP = 1, TRY_MISMATCH = 2, TRY_FATAL = 3 };

static int try_class(int rc)
{
    if (rc == 0)
        return TRY_OK;
    if (rc == RK_E_MISMATCH)
        return TRY_MISMATCH;
    if (rc == -ENOMEM)
        return TRY_FATAL;
    return TRY_SKIP;
}

/* Restores, on every member, the first checkpoint of ckpt_list's order (the current
   timeline newest first, then the abandoned ones) labelled below `below` that verifies on
   every member. Rank 0 proposes each candidate from its listing; every member reads it
   (*how, agreed: the least any member asks, REC_RESTORE_*):
     staged   into staging (ckpt_load), the registered buffers written (copied out) only
              once all of them read it whole; the snapshot stays held;
     checked  checked whole through the page cache first (ckpt_check, nothing kept), then,
              once every member checked it, read into the buffers from there (ckpt_load_into,
              checked again): the buffers stay as they were unless that second read fails
              (the files changed or became unreadable in between), and nothing is held after;
     inplace  straight into the buffers (ckpt_load_into, ckpt/snapshot.h S12): nothing held
              after, a failure leaves them part-written.
   A second read that fails goes on to older steps inplace (the buffers are no longer as
   they were; an older step read whole puts every byte back). Every member returns the
   same: 0 with *step the step restored, or -1 if the directory holds no checkpoint below
   `below` (buffers untouched); RK_E_CORRUPT if it holds some but none verifies
   everywhere, -errno if a member cannot list the directory or had no t (trc:
   rec_ckpt_tensors' failure), RK_E_MISMATCH (buffers untouched in each case, but after a
   failed second read). how NULL: staged. *how says on return which way they read.
   Collective over the ring. */
int rec_restore_newest(rk_ctx *ctx, const ckpt_tensor *t, int trc, int64_t below, int *how, int64_t *step)
{
    ckpt_entry *l = NULL;
    size_t n = 0, next = 0;
    int skipped = 0;
    *step = -1;
    ckpt_retention_wait(ctx->ckpt, rk__deadline_ns(ctx->opt.timeout_ms / 4)); /* ckpt.c J6 */
    int my_list = trc ? trc : ckpt_list(ctx->opt.ckpt_dir, &l, &n), list = my_list;
    int rc = agree(ctx, &list, RK_I32, RK_MIN); /* an unreadable directory is never "nothing there" */
    int way = how ? *how : REC_RESTORE_STAGED; /* every member passes how, or none (from_disk) */
    if (!rc && !list && how)
        rc = agree(ctx, &way, RK_I32, RK_MIN);
    if (!rc && list)
        rc = my_list ? my_list
                     : rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, list, "another member cannot list the checkpoint directory %s "
                                "or its own tensors (%s)",
                                ctx->opt.ckpt_dir, rk_strerror(list));
    while (!rc) {
        int64_t s = INT64_MIN;
        if (ctx->rank == 0) {
            while (next < n && l[next].step >= below)
                next++;
            s = next < n ? l[next++].step : -1;
        }
        if ((rc = agree(ctx, &s, RK_I64, RK_MAX)) != 0)
            break;
        if (s < 0) {
            if (skipped)
                rc = rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_CORRUPT,
                              "none of the %d committed checkpoints in %s verifies on every member", skipped,
                              ctx->opt.ckpt_dir);
            break;
        }
        int my = try_class(way == REC_RESTORE_INPLACE   ? ckpt_load_into(ctx->ckpt, s, t, ctx->ntensors)
                           : way == REC_RESTORE_CHECKED ? ckpt_check(ctx->ckpt, s, t, ctx->ntensors)
                                                        : ckpt_load(ctx->ckpt, s, t, ctx->ntensors)),
            worst = my;
        if ((rc = agree(ctx, &worst, RK_I32, RK_MAX)) != 0)
            break;
        if (worst == TRY_OK && way == REC_RESTORE_CHECKED) { /* every member checked it whole:
                                                                now the buffers change */
            worst = my = try_class(ckpt_load_into(ctx->ckpt, s, t, ctx->ntensors));
            if ((rc = agree(ctx, &worst, RK_I32, RK_MAX)) != 0)
                break;
            if (worst != TRY_OK) { /* the buffers hold part of it now: no way keeps them */
                way = REC_RESTORE_INPLACE;
                RK_LOG_WARN(RK_SUB_CKPT, "step %" PRId64 " changed or became unreadable between its check and its "
                            "read (%s on some rank): the registered buffers hold part of it%s",
                            s, my == TRY_OK ? "unreadable" : rk_last_error(),
                            worst == TRY_SKIP ? "; trying older steps" : "");
            }
        }
        if (worst == TRY_OK) { /* every member holds it whole: only now the buffers change
                                  (inplace, checked: they hold it already) */
            *step = s;
            ckpt_note_committed(ctx->ckpt, s);
            rc = way != REC_RESTORE_STAGED ? 0 : ckpt_snapshot_restore(ctx->ckpt, s, t, ctx->ntensors);
            break;
        }
        if (worst == TRY_MISMATCH) {
            rc = my == TRY_MISMATCH ? RK_E_MISMATCH
                                    : rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_MISMATCH,
                                               "step %" PRId64 " does not match another rank's tensors", s);
            break;
        }
        if (worst == TRY_FATAL) {
            rc = my == TRY_FATAL ? -ENOMEM : rk__fail(RK_SUB_CKPT, RK_LOG_ERROR, RK_E_ABORTED, "another rank failed");
            break;
        }
        RK_LOG_WARN(RK_SUB_CKPT, "step %" PRId64 " skipped (%s on some rank), trying an older one", s,
                    my == TRY_OK ? "unreadable" : rk_last_error());
        skipped++;
    }
    if (how)
        *how = way;
    free(l);
    return rc;
}

/* The newest committed step up to the decision's, restored on every member. */
static int from_disk(rk_ctx *ctx, const rec_decision *dec, const ckpt_tensor *t, int trc)
{
    int64_t step = -1;
    int rc = rec_restore_newest(ctx, t, trc, dec->step + 1, NULL, &step); /* staged: B2 */
    if (!rc && step < 0)
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_NOCKPT, "rollback: no checkpoint up to step %" PRId64
                      " in %s verifies", dec->step, ctx->opt.ckpt_dir);
    ctx->next_step = step;
    return rc;
}

/* ---- memory ------------------------------------------------------------------------ */

/* Every sharded tensor split evenly over the current members (after a membership
   change). A slice whose size differs from its buffer's waits for rk_rebind (its
   restored rows stay in the held snapshot); one of the same size is restored into its
   buffer. Against the buffer, not the slice before: a recovery interrupted after its
   split (a member lost in its rollback) and decided again at the old size leaves the
   program's buffer right, and the program, comparing rk_shard_rows with the buffer it
   holds, rebinds nothing (snapshots refused for good before). */
static void resplit(rk_ctx *ctx)
{
    for (size_t i = 0; i < ctx->ntensors; i++) {
        struct rec_tensor *r = &ctx->tensors[i];
        if (!(r->flags & RK_SHARDED))
            continue;
        int64_t row0, rows = rec_even_split(r->rows_global, ctx->world, ctx->rank, &row0);
        r->shape[0] = rows; /* waits for rk_rebind where it differs from bound_rows */
        r->row0 = row0;
        r->nbytes = rec_row_bytes(r) * (size_t)rows;
    }
}

/* Each sharded tensor's split before a rollback's resplit, put back where that rollback
   failed here (B9). */
struct split_was {
    int64_t rows, row0;
    size_t nbytes;
};

static struct split_was *split_save(const rk_ctx *ctx)
{
    struct split_was *w = calloc(ctx->ntensors ? ctx->ntensors : 1, sizeof(*w));
    for (size_t i = 0; w && i < ctx->ntensors; i++) {
        const struct rec_tensor *r = &ctx->tensors[i];
        w[i] = (struct split_was){r->ndim > 0 ? r->shape[0] : 0, r->row0, r->nbytes};
    }
    return w;
}

static void split_restore(rk_ctx *ctx, const struct split_was *w)
{
    for (size_t i = 0; w && i < ctx->ntensors; i++) {
        struct rec_tensor *r = &ctx->tensors[i];
        if (!(r->flags & RK_SHARDED))
            continue;
        r->shape[0] = w[i].rows;
        r->row0 = w[i].row0;
        r->nbytes = w[i].nbytes;
    }
}

/* A decision that brought spares in (rec_decision.joined): every member, the spares too,
   registered the same tensors (a hash of the registry, MIN = MAX; RK_E_COLL_MISMATCH on
   every member otherwise), and the spares learn each sharded tensor's global rows (they
   registered theirs before they had a slice). Collective over the new ring. */
static int join(rk_ctx *ctx)
{
    size_t n = ctx->ntensors;
    int64_t *rows = calloc(n + 1, sizeof(*rows));
    uint64_t h = n;
    for (size_t i = 0; i < n; i++) {
        const struct rec_tensor *r = &ctx->tensors[i];
        h = (h * 0x100000001b3ull) ^ (uint64_t)rec_registration_hash(r) ^
            (r->flags ? 0 : (uint64_t)r->nbytes * 0x9e3779b97f4a7c15ull);
    }
    int64_t v[3] = {(int64_t)(h >> 1), -(int64_t)(h >> 1), rows ? 0 : 1};
    int rc = rec_ckpt_call(ctx, v, 3, RK_I64, RK_MAX);
    if (rc)
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, rc, "rollback: the spares' registrations could not be agreed");
    else if (v[2])
        rc = rows ? rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_ABORTED, "rollback: another member cannot take part")
                  : rk__fail(RK_SUB_REC, RK_LOG_ERROR, -ENOMEM, "rollback: the rows of %zu tensors", n);
    else if (v[0] != -v[1])
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_COLL_MISMATCH, "rollback: a spare brought in registered "
                      "other tensors than the members (names, flags, dtypes, shapes or order differ)");
    for (size_t i = 0; i < n && !rc; i++)
        rows[i] = ctx->tensors[i].flags & RK_SHARDED ? ctx->tensors[i].rows_global : 0;
    if (!rc && n && (rc = rec_ckpt_call(ctx, rows, n, RK_I64, RK_MAX)) != 0)
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, rc, "rollback: the global rows could not be agreed");
    for (size_t i = 0; i < n && !rc; i++)
        if (ctx->tensors[i].flags & RK_SHARDED)
            ctx->tensors[i].rows_global = rows[i];
    free(rows);
    return rc;
}

/* Every member gets the root's held snapshot (rec_spread, B4), in
   a new held snapshot (ckpt_hold_open), which then goes to the buffers through the copy
   engines (device tensors too: ckpt_hold_seal); a failure leaves the snapshot held before. */
static int spread_held(rk_ctx *ctx, const rec_decision *dec, const ckpt_tensor *t, int trc)
{
    size_t n = ctx->ntensors;
    bool root = ctx->rank0 == dec->root;
    const ckpt_snapshot *s = NULL;
    unsigned char **where = trc ? NULL : calloc(n, sizeof(*where));
    int orc = trc ? trc : !where ? -ENOMEM : ckpt_hold_open(ctx->ckpt, dec->step, t, n, where, &s);
    bool have = !orc && root && s->step == dec->step && ckpt_snapshot_matches(s, t, n);
    int bad = orc ? 1 : 0, arc = agree(ctx, &bad, RK_I32, RK_MAX); /* room is needed everywhere */
    if (arc || bad) {
        if (!orc)
            ckpt_hold_cancel(ctx->ckpt);
        free(where);
        return arc ? arc
               : orc ? orc
                     : rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_ABORTED, "rollback: another member cannot take part");
    }
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (!t[i].nbytes)
            continue;
        if (have) /* the old region stays readable until the seal */
            memcpy(where[i], s->own[i].data, t[i].nbytes);
        rc = rec_spread(ctx, where[i], t[i].nbytes, have, rec_ckpt_call); /* B4 */
    }
    free(where);
    if (!rc && root && !have) /* the ring calls above still ran: the others are not left waiting */
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL,
                      "rollback: the snapshot of step %" PRId64 " is no longer held for these tensors", dec->step);
    if (rc) {
        ckpt_hold_cancel(ctx->ckpt);
        return rc;
    }
    return ckpt_hold_seal(ctx->ckpt, dec->step, t, n);
}

/* One tensor's part of the rebuild on this member: what it holds of its own range
   (src[slot]: its held pieces) is copied into dst (its range), then the shifts at distance
   1 .. w-1 send every other member its part. Every member makes every shift of the plan,
   whatever failed before it: a member that left the series early would keep the others
   waiting. Returns the first error; *m counts the bytes sent and the time of the local
   copies and of the shifts. */
struct rebuild_meter {
    int64_t sent, copy_ns, shift_ns;
    int64_t psent, pcopy_ns, pshift_ns; /* the partner copy's (partner_part) */
};

static int exchange(rk_ctx *ctx, const struct rec_plan *p, const unsigned char *const src[2], unsigned char *dst,
                    struct rebuild_meter *m)
{
    ring_cancel cancel = {.deadline_ns = 0, .changed = rec_ring_changed, .arg = ctx};
    int rc = 0, me = ctx->rank;
    int64_t t0 = rk__mono_ns();
    for (int slot = 0; slot < 2; slot++) {
        int q = rec_plan_held(p, me, slot);
        int64_t a, b;
        if (q >= 0 && src[slot] && (rec_plan_take(p, q, me, &a, &b), a < b))
            memcpy(dst + (a - p->lo[me]), src[slot] + (a - p->at[q]), (size_t)(b - a));
    }
    int64_t t1 = rk__mono_ns();
    m->copy_ns += t1 - t0;
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
            m->sent += (int64_t)sn;
            if (r2 && !rc)
                rc = r2;
        }
    m->shift_ns += rk__mono_ns() - t1;
    return rc;
}

/* One tensor's part of the new partner copy (B7): this member's left neighbour's new
   piece (mine: this member's, in its new snapshot; into: where the left's goes, NULL if
   this member has no room for it), made from what this member holds of it (its old piece
   and its partner copy, src[0] and src[1]), the rest received from the left, which sends
   it from its new snapshot: shifts at distance 1, as many on every member as the member
   that lacks the most parts needs (rec_plan_partner, the same on every member). size:
   every member's bytes of the tensor. Returns the first error of the shifts. */
static int partner_part(rk_ctx *ctx, const struct rec_plan *p, bool sharded, const int64_t *size,
                        const unsigned char *const src[2], const unsigned char *mine, unsigned char *into,
                        struct rebuild_meter *m)
{
    ring_cancel cancel = {.deadline_ns = 0, .changed = rec_ring_changed, .arg = ctx};
    int rc = 0, me = ctx->rank, w = p->w, left = (me + w - 1) % w, right = (me + 1) % w;
    struct rec_move in[2], get[3], put[3];
    int nin, kmax = 0;
    int64_t t0 = rk__mono_ns();
    for (int h = 0; h < w; h++) {
        int k = rec_plan_partner(p, h, sharded, size[(h + w - 1) % w], in, &nin, get);
        kmax = k > kmax ? k : kmax;
    }
    int nput = rec_plan_partner(p, right, sharded, size[me], in, &nin, put);
    int nget = rec_plan_partner(p, me, sharded, size[left], in, &nin, get);
    int64_t base = nget && get[0].q == -2 ? 0 : p->lo[left], mbase = nput && put[0].q == -2 ? 0 : p->lo[me];
    for (int k = 0; k < nin && into; k++) {
        int slot = in[k].q == p->old[me] ? 0 : 1;
        if (src[slot])
            memcpy(into + (in[k].a - base), src[slot] + (in[k].a - p->at[in[k].q]), (size_t)(in[k].b - in[k].a));
    }
    int64_t t1 = rk__mono_ns();
    m->pcopy_ns += t1 - t0;
    for (int k = 0; k < kmax; k++) {
        size_t sn = k < nput ? (size_t)(put[k].b - put[k].a) : 0;
        size_t rn = k < nget && into ? (size_t)(get[k].b - get[k].a) : 0;
        const unsigned char *sp = sn ? mine + (put[k].a - mbase) : NULL;
        unsigned char *rp = rn ? into + (get[k].a - base) : NULL;
        int r2 = ring_shift_by(ctx->ring, 1, sp, sn, rp, rn, &cancel);
        m->psent += (int64_t)sn;
        if (r2 && !rc)
            rc = r2;
    }
    m->pshift_ns += rk__mono_ns() - t1;
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

/* The rollback from memory of a job with sharded or per-rank state (docs/SHARDING.md):
   each survivor holds its own pieces of the decision's step and its left neighbour's
   (ckpt/snapshot.h S4), and rec_decide made sure that every lost member's right neighbour
   survived; a spare brought in holds nothing. Tensor by tensor (struct rec_plan), each
   member copies what it holds of its new range, then sends every other member the parts
   of its pieces that member takes, point to point: shifts at distance 1 .. w-1
   (ring_shift_by), one per held piece, skipped by every member where the plan has nothing
   to send at that distance. Only what changes hands moves: after one loss of w0, mostly
   the lost piece and the edges of the new split. Replicated tensors stay where they are,
   but a spare receives them (rec_spread, as spread_held).

   The series is the same on every member whatever fails: all that can fail on one member
   alone (its snapshot, memory, the new staging, rec_ckpt_tensors' trc, RK_FAULT=rollback@N) is
   found before the first collective, which says it to all (a failed share); the plan and
   every size check are computed alike on every member from what they agreed. So a member
   that cannot rebuild stops every member at once, not at RK_TIMEOUT_MS per shift. The
   result is the new held snapshot with its partner copy (B7: made tensor by tensor after
   its exchange, from what each member holds and what its left neighbour rebuilt), copied
   into the buffers (a slice whose size changed waits for rk_rebind); on failure the
   snapshot held before is kept (ckpt_hold_cancel). Returns 0, RK_E_PEER_LOST /
   RK_E_TIMEOUT when the ring broke, or another error when the rebuild cannot be done (the
   caller goes to disk). */
static int rebuild_partnered(rk_ctx *ctx, const rec_decision *dec, const ckpt_tensor *t, int trc)
{
    size_t n = ctx->ntensors;
    int w = ctx->world, cap = ctx->nslots; /* no old world is larger than the slots */
    int rc = trc, fault = rk__fault_fail("rollback");
    if (!rc && fault)
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, fault, "rollback: injected failure (RK_FAULT=rollback)");
    /* What the members agree on (MAX): each old rank's new rank + 1 (cap), each tensor's
       piece of each old rank (n x cap: from it, and from its right neighbour's partner
       copy, the same size), each new rank's size of each tensor (n x w). */
    size_t nv = (size_t)cap + n * (size_t)cap + n * (size_t)w;
    int64_t *v = calloc(nv, sizeof(*v)), *at = calloc((size_t)cap + 1, sizeof(*at));
    int64_t *lo = calloc((size_t)w, sizeof(*lo)), *hi = calloc((size_t)w, sizeof(*hi));
    int32_t *nr = calloc((size_t)cap, sizeof(*nr)), *old = calloc((size_t)w, sizeof(*old));
    unsigned char **where = calloc(n ? n : 1, sizeof(*where)), **pwhere = calloc(n ? n : 1, sizeof(*pwhere));
    uint64_t *pbytes = calloc(n ? n : 1, sizeof(*pbytes));
    int64_t *prow0 = calloc(n ? n : 1, sizeof(*prow0));
    if (!rc && (!v || !at || !lo || !hi || !nr || !old || !where || !pwhere || !pbytes || !prow0))
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, -ENOMEM, "rollback: the plan of %zu tensors over %d ranks", n, cap);
    /* The new snapshot is built in another staging region (the older generation's,
       ckpt/snapshot.h S11); the old one (s: the snapshot of the decision's step, its
       partner copy beside it) stays readable. */
    int64_t t0 = rk__mono_ns();
    const ckpt_snapshot *s = NULL;
    bool open = !rc && (rc = ckpt_hold_open(ctx->ckpt, dec->step, t, n, where, &s)) == 0, sealed = false;
    int64_t t_open = rk__mono_ns();
    bool fresh = s && s->step < 0 && dec->joined > 0; /* a spare: holds nothing yet */
    int me = s ? s->rank : 0;
    /* A partner copy not of the step (a growth asked before it was sent: coord.c I5) is not
       used: the plan then takes no piece from it (no member was lost, B8). */
    bool unpartnered = !rc && !fresh && s->left_step != dec->step;
    if (!rc && !fresh && (s->step != dec->step || n != s->n || s->world > cap))
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: the snapshot of step %" PRId64
                      " and its partner copy are no longer held (held %" PRId64 ", left %" PRId64 ", %zu of %zu tensors)",
                      dec->step, s->step, s->left_step, s->n, n);
    /* The failed share: whether every member can go on, the old world, and whether any
       member's partner copy is not of the step. */
    int64_t a[3] = {rc ? 1 : 0, rc || fresh ? 0 : s->world, unpartnered};
    int arc = rec_ckpt_call(ctx, a, 3, RK_I64, RK_MAX);
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
            if (left != me && !unpartnered)
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
    struct rec_plan p = {.w0 = w0, .w = w, .nr = nr, .old = old, .at = at, .lo = lo, .hi = hi, .no_left = a[2] != 0};
    if (w0 < 1 || w0 > cap)
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: an old world of %d", w0);
    else
        rc = rec_plan_members(&p);
    for (int q = 0; q < w0 && !rc && p.no_left; q++)
        if (!nr[q])
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: old rank %d is lost and the partner "
                          "copies of step %" PRId64 " were not all sent", q, dec->step);
    if (!rc && p.no_left)
        RK_LOG_INFO(RK_SUB_REC, "rollback of step %" PRId64 ": its partner copies were not all sent (no member lost): "
                    "each member's own pieces only", dec->step);
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
    /* The new partner copy (B7): room for the left neighbour's new pieces, beside the
       snapshot being built; without it (no memory) this member keeps none, and still
       makes every shift. A world of one has no neighbour to hold it for. */
    int left = (ctx->rank + w - 1) % w, prc = w < 2 ? 0 : RK_E_NOTAVAIL;
    for (size_t i = 0; i < n && w >= 2; i++) {
        if (!t[i].flags)
            continue;
        pbytes[i] = (uint64_t)size[i * (size_t)w + (size_t)left];
        if (t[i].flags & RK_SHARDED)
            rec_even_split(ctx->tensors[i].rows_global, w, left, &prow0[i]);
    }
    if (w >= 2 && (prc = ckpt_hold_partner(ctx->ckpt, dec->step, pbytes, prow0, n, pwhere)) != 0)
        memset(pwhere, 0, n * sizeof(*pwhere));
    int64_t orphaned = 0, t_plan = rk__mono_ns();
    struct rebuild_meter meter = {0};
    for (size_t i = 0; i < n; i++) {
        size_t nb = t[i].nbytes;
        if (!t[i].flags) { /* replicated: every survivor holds it, a spare receives it (B4) */
            if (nb && !fresh)
                memcpy(where[i], s->own[i].data, nb);
            int r2 = spread ? rec_spread(ctx, where[i], nb, !fresh, rec_ckpt_call) : 0;
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
        const unsigned char *src[2] = {fresh ? NULL : s->own[i].data, fresh || p.no_left ? NULL : s->left[i].data};
        int r2 = exchange(ctx, &p, src, where[i], &meter);
        if (r2 && !rc)
            rc = r2;
        r2 = w < 2 ? 0 : partner_part(ctx, &p, sharded, size + i * (size_t)w, src, where[i], pwhere[i], &meter);
        if (r2 == RK_E_PEER_LOST || r2 == RK_E_TIMEOUT) {
            if (!rc)
                rc = r2;
        } else if (r2 && !prc) {
            prc = r2;
        }
    }
    if (rc)
        goto out;
    if (prc && w >= 2) {
        RK_LOG_WARN(RK_SUB_CKPT, "no partner copy of the rebuilt snapshot of step %" PRId64 " (%s): a loss now rolls "
                    "back from disk", dec->step, rk_strerror(prc));
        ckpt_hold_partner(ctx->ckpt, dec->step, NULL, NULL, 0, NULL);
    }
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
    int64_t t1 = rk__mono_ns();
    sealed = true;
    rc = ckpt_hold_seal(ctx->ckpt, dec->step, t, n);
    int64_t t2 = rk__mono_ns();
    if (!rc)
        RK_LOG_INFO(RK_SUB_REC, "rollback of step %" PRId64 " from memory in %.3f s: new region %.3f s, agreement "
                    "%.3f s; the new slices: local copies %.3f s, transfer %.3f s (%" PRId64 " bytes sent from here); "
                    "the partner copy: local copies %.3f s, transfer %.3f s (%" PRId64 " bytes sent); buffers %.3f s",
                    dec->step, (double)(t2 - t0) / 1e9, (double)(t_open - t0) / 1e9, (double)(t_plan - t_open) / 1e9,
                    (double)meter.copy_ns / 1e9, (double)meter.shift_ns / 1e9, meter.sent,
                    (double)meter.pcopy_ns / 1e9, (double)meter.pshift_ns / 1e9, meter.psent,
                    (double)(t2 - t1) / 1e9);
out:
    if (open && !sealed)
        ckpt_hold_cancel(ctx->ckpt); /* the snapshot held before stays held */
    free(where);
    free(pwhere);
    free(pbytes);
    free(prow0);
    free(v);
    free(at);
    free(lo);
    free(hi);
    free(nr);
    free(old);
    return rc;
}
/* ---- the rollback ------------------------------------------------------------------ */

/* How a member's rollback ended, ordered so that MAX picks the worst. */
enum { ROLL_OK = 0, ROLL_FAILED = 1, ROLL_RING = 2 };

static int roll_class(int rc)
{
    return rc == 0 ? ROLL_OK : rc == RK_E_PEER_LOST || rc == RK_E_TIMEOUT ? ROLL_RING : ROLL_FAILED;
}

/* ENTER to DONE, AGAIN or FAILED (the header's states); every member returns the same (B5). */
int rec_ckpt_rollback(rk_ctx *ctx, const rec_decision *dec, int *from)
{
    *from = dec->source;
    ctx->mirror_pending = false; /* the rollback sends its own partner copy */
    int rc = dec->joined ? join(ctx) : 0;
    if (rc)
        return rc;
    if (ctx->ntensors == 0)
        return 0; /* no registered state: nothing to roll back, each member goes on */
    if (!ctx->ckpt)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_NOCKPT,
                        "a member was lost and there is no snapshot to roll back to (set RK_CKPT_DIR)");
    /* The commit in flight belonged to the old membership: cancel it, write as the new one
       (rank 0's writer removes what dead attempts left before it writes again: never the
       training thread, recovery does not wait on the disk). */
    ckpt_set_membership(ctx->ckpt, ctx->rank, ctx->world, dec->epoch);
    struct split_was *was = split_save(ctx);
    resplit(ctx);
    /* rec_ckpt_tensors' failure goes into the first collective of each path (a failed share). */
    ckpt_tensor *t = NULL;
    int trc = rec_ckpt_tensors(ctx, &t);
    bool own = rec_ckpt_partnered(ctx), memory = dec->source == REC_FROM_MEMORY;
    /* The generation of that step becomes the held one where it is the older
       (ckpt/snapshot.h S6): ckpt_hold_open and ckpt_snapshot_restore select it. */
    if (memory && own) {
        rc = rebuild_partnered(ctx, dec, t, trc); /* makes its own partner copy (B7) */
        ctx->next_step = dec->step;
    } else if (memory && dec->all_hold) {
        rc = trc ? trc : ckpt_snapshot_restore(ctx->ckpt, dec->step, t, ctx->ntensors);
        if (rc == RK_E_NOCKPT)
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "rollback: the snapshot of step %" PRId64
                          " is no longer held", dec->step);
        ctx->next_step = dec->step;
    } else if (memory) {
        rc = spread_held(ctx, dec, t, trc);
        ctx->next_step = dec->step;
    } else if (dec->source == REC_FROM_DISK) {
        rc = from_disk(ctx, dec, t, trc);
    } else {
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_NOCKPT, "rollback: no snapshot in memory or on disk");
    }
    if (!rc && !(memory && own)) {
        int m = rec_ckpt_mirror(ctx);
        if (m == RK_E_PEER_LOST || m == RK_E_TIMEOUT)
            rc = m;
    }
    int worst = roll_class(rc);
    int arc = agree(ctx, &worst, RK_I32, RK_MAX); /* round 1 (B5) */
    if (!arc && worst == ROLL_FAILED && memory) { /* FALLBACK */
        /* The rollback from memory failed on some member (each said so in the series):
           every member goes to disk now, in this round. */
        RK_LOG_WARN(RK_SUB_REC, "rollback of step %" PRId64 " from memory failed (%s): from disk", dec->step,
                    rc ? rk_last_error() : "on another member");
        *from = REC_FROM_DISK;
        if ((rc = from_disk(ctx, dec, t, trc)) == 0 && own) {
            int m = rec_ckpt_mirror(ctx);
            if (m == RK_E_PEER_LOST || m == RK_E_TIMEOUT)
                rc = m;
        }
        worst = roll_class(rc);
        arc = agree(ctx, &worst, RK_I32, RK_MAX); /* round 2 */
    }
    free(t);
    if (rc) /* B9 */
        split_restore(ctx, was);
    free(was);
    if (rc)
        return rc;
    if (arc)
        return arc;
    if (worst == ROLL_RING)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_PEER_LOST, "rollback interrupted on another member");
    return worst ? rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_ABORTED, "rollback failed on another member") : 0;
}
