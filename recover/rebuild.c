/*
 * recover/rebuild.c - the plan of the rollback from memory of a job with sharded or
 * per-rank state (docs/SHARDING.md, "After a lost member"): which member holds which old
 * piece and takes which range of the new split. Pure: no MPI, no engine, the same on
 * every member from what they agreed (rollback.c B6); rollback.c carries it out over the
 * rebuilt ring (rebuild_partnered). Unit-tested without MPI (test_recover).
 */
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

