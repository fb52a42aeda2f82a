/*
 * recover/coord.c - the coordinator's decision rule (docs/PROTOCOL.md).
 *
 * Invariants (checked by tests/test_recover.c, named there by number):
 *   I1 no split brain: continue only with a strict majority of the previous view, or
 *      exactly half of it including its lowest rank.
 *   I2 fewer survivors than min_world: stop (RK_E_MIN_WORLD), touch nothing.
 *   I3 every member restores the same step.
 *   I4 that step is never older than the newest committed checkpoint a survivor knows.
 *   I5 memory first: the newest snapshot held by any survivor (either generation: held or
 *      older), if not older than the newest commit; otherwise disk. With sharded or
 *      per-rank state (partnered reports) the newest step that every survivor holds, and
 *      only if every lost member's right neighbour in the previous view (ring order:
 *      ascending, cyclic) survived: it holds the lost pieces (two losses in a row: disk).
 *      Where no member was lost (a growth in place), no piece is needed from a neighbour:
 *      the newest step of which every member holds its own pieces counts too (own_step),
 *      its partner copy sent or not (the request landed before it was).
 *   I6 new ranks are the survivors' ranks at start, ascending.
 *   I7 A member lost that held no piece of a step costs that step nothing: where every
 *      reporter holds its own pieces of one step, taken in a world of exactly the
 *      reporters (own_world = their number, own_rank each rank of it once), the lost are
 *      newcomers that joined after it (their join's rollback never completed), and that
 *      step is offered as I5 offers it where nobody was lost: no partner copy needed.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../common/common.h"
#include "rec.h"

static const rec_report *report_of(const rec_report *rep, int nrep, int rank0)
{
    for (int i = 0; i < nrep; i++)
        if (rep[i].rank0 == rank0)
            return &rep[i];
    return NULL;
}

static bool holds(const rec_report *r, int64_t step)
{
    return step >= 0 && (r->held_step == step || r->older_step == step);
}

/* I7: every reporter holds its own pieces of one step, taken in a world of exactly the
   reporters, each of its ranks once. */
static bool own_complete(const rec_report *rep, int nrep)
{
    if (nrep <= 0 || nrep > REC_MAX_WORLD)
        return false;
    bool seen[REC_MAX_WORLD] = {false};
    for (int i = 0; i < nrep; i++) {
        const rec_report *r = &rep[i];
        if (r->own_step < 0 || r->own_step != rep[0].own_step || r->own_world != nrep || r->own_rank < 0 ||
            r->own_rank >= nrep || seen[r->own_rank])
            return false;
        seen[r->own_rank] = true;
    }
    return true;
}

/* I5 with partner copies: every reporter holds `step`, and each member of prev that did
   not report has its right neighbour (prev sorted, cyclic) among the reporters. */
static bool partners_cover(const int *prev, int nprev, const rec_report *rep, int nrep, int64_t step)
{
    for (int i = 0; i < nrep; i++)
        if (!holds(&rep[i], step))
            return false;
    int *ring = malloc((size_t)nprev * sizeof(int));
    if (!ring)
        return false;
    memcpy(ring, prev, (size_t)nprev * sizeof(int));
    qsort(ring, (size_t)nprev, sizeof(int), rk__cmp_int);
    bool ok = true;
    for (int i = 0; i < nprev && ok; i++)
        ok = report_of(rep, nrep, ring[i]) || report_of(rep, nrep, ring[(i + 1) % nprev]);
    free(ring);
    return ok;
}

int rec_decide(const int *prev, int nprev, const rec_report *rep, int nrep, int min_world,
               uint64_t epoch, rec_decision *out)
{
    if (!prev || !rep || !out || nprev <= 0 || nprev > REC_MAX_WORLD || nrep < 0 || nrep > nprev)
        return -EINVAL;
    memset(out, 0, sizeof(*out));
    out->epoch = epoch;
    out->root = -1;

    int lowest_prev = prev[0];
    for (int i = 1; i < nprev; i++)
        if (prev[i] < lowest_prev)
            lowest_prev = prev[i];

    /* Members: the reporters that belong to the previous view, each once (I6: sorted). */
    int64_t newest_commit = -1, newest_held = -1, max_next = -1;
    bool partnered = false;
    for (int i = 0; i < nrep; i++) {
        bool in_prev = false, dup = false;
        for (int j = 0; j < nprev; j++)
            in_prev |= prev[j] == rep[i].rank0;
        for (int j = 0; j < out->nmembers; j++)
            dup |= out->members[j] == rep[i].rank0;
        if (!in_prev || dup)
            return -EINVAL;
        out->members[out->nmembers++] = rep[i].rank0;
        if (rep[i].committed_step > newest_commit)
            newest_commit = rep[i].committed_step;
        if (rep[i].held_step > newest_held)
            newest_held = rep[i].held_step;
        if (rep[i].older_step > newest_held)
            newest_held = rep[i].older_step;
        if (rep[i].next_step > max_next)
            max_next = rep[i].next_step;
        partnered |= rep[i].partnered != 0;
    }
    qsort(out->members, (size_t)out->nmembers, sizeof(int), rk__cmp_int);

    /* I1 */
    bool has_lowest = out->nmembers > 0 && out->members[0] == lowest_prev;
    if (!(2 * out->nmembers > nprev || (2 * out->nmembers == nprev && has_lowest)))
        return RK_E_NO_MAJORITY;
    /* I2 */
    if (out->nmembers < min_world)
        return RK_E_MIN_WORLD;

    /* I3, I4, I5: with partner copies, the newest step every survivor holds, of either
       generation (a loss while a snapshot was copied or sent leaves the one before). */
    if (partnered) {
        int64_t best = -1;
        for (int i = 0; i < nrep; i++)
            for (int k = 0; k < 2; k++) {
                int64_t s = k ? rep[i].older_step : rep[i].held_step;
                if (s > best && partners_cover(prev, nprev, rep, nrep, s))
                    best = s;
            }
        if (nrep == nprev || own_complete(rep, nrep)) { /* nobody lost (I5), or nobody that held a piece (I7) */
            int64_t own = INT64_MAX;
            for (int i = 0; i < nrep; i++)
                own = rep[i].own_step < own ? rep[i].own_step : own;
            for (int i = 0; i < nrep && own > best; i++)
                if (rep[i].own_step != own && !holds(&rep[i], own))
                    own = -1;
            best = own > best ? own : best;
        }
        newest_held = best;
    }
    if (newest_held >= 0 && newest_held >= newest_commit) {
        out->source = REC_FROM_MEMORY;
        out->step = newest_held;
        out->all_hold = 1;
        for (int i = 0; i < nrep; i++) {
            if (holds(&rep[i], newest_held) && (out->root < 0 || rep[i].rank0 < out->root))
                out->root = rep[i].rank0;
            out->all_hold &= holds(&rep[i], newest_held);
        }
    } else if (newest_commit >= 0) {
        out->source = REC_FROM_DISK;
        out->step = newest_commit;
    } else {
        /* Nothing was ever saved: everyone starts again from step 0 with the state the
           program initialised (the disk path finds no checkpoint). */
        out->source = REC_FROM_NOTHING;
        out->step = 0;
    }
    out->steps_lost = max_next > out->step ? max_next - out->step : 0;
    return 0;
}
