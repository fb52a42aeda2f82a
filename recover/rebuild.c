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


/* ---- the new partner copy (rollback.c B7) -------------------------------------------- */

int rec_plan_partner(const struct rec_plan *p, int m, bool sharded, int64_t bytes, struct rec_move in[2], int *nin,
                     struct rec_move out[3])
{
    int l = (m + p->w - 1) % p->w;
    *nin = 0;
    if (!sharded && l >= p->w0) { /* not in the vector: the left's own buffer, sent whole */
        out[0] = (struct rec_move){.q = -2, .a = 0, .b = bytes};
        return bytes > 0;
    }
    int64_t a = p->lo[l], b = p->hi[l];
    /* What m holds, in the vector's order: its old piece q and its left's, l0 (the partner
       copy of the snapshot, whether l0 survived or not, unless it is not of the step:
       no_left); after the wrap, l0's comes last. */
    int q = p->old[m], held[2], nh = 0;
    if (q >= 0 && p->no_left) {
        held[nh++] = q;
    } else if (q >= 0) {
        int l0 = (q + p->w0 - 1) % p->w0;
        if (l0 != q && l0 < q)
            held[nh++] = l0;
        held[nh++] = q;
        if (l0 != q && l0 > q)
            held[nh++] = l0;
    }
    int nout = 0;
    int64_t cur = a;
    for (int k = 0; k < nh && cur < b; k++) {
        int64_t ha = p->at[held[k]], hb = p->at[held[k] + 1];
        int64_t x = ha > cur ? ha : cur, y = hb < b ? hb : b;
        if (x >= y)
            continue;
        if (x > cur)
            out[nout++] = (struct rec_move){.q = -1, .a = cur, .b = x};
        in[(*nin)++] = (struct rec_move){.q = held[k], .a = x, .b = y};
        cur = y;
    }
    if (cur < b)
        out[nout++] = (struct rec_move){.q = -1, .a = cur, .b = b};
    return nout;
}
