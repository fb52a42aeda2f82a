/*
 * recover/rec.h - the recovery coordinator's decision, the one header of recover/ that
 * other folders (tests, chaos) may include. docs/PROTOCOL.md describes the protocol.
 */
#ifndef RK_REC_H
#define RK_REC_H

#include <stdbool.h>
#include <stdint.h>

#define REC_MAX_WORLD 4096

/* What one survivor tells the coordinator in a round of agreement. */
typedef struct rec_report {
    int rank0;              /* rank at start */
    uint64_t epoch;         /* epoch of the survivor's view */
    int64_t next_step;      /* rk_next_step() on that survivor */
    int64_t held_step;      /* step of the complete snapshot in its memory, -1: none */
    int64_t committed_step; /* newest committed checkpoint it knows of, -1: none */
    int partnered;          /* 1: the job has sharded or per-rank state; held_step is then
                               offered only with the left neighbour's pieces of that step
                               beside it (ckpt/snapshot.h S4), and a lost member's pieces are in
                               its right neighbour's memory only */
    int64_t older_step;     /* step of the older generation it holds whole (ckpt/snapshot.h S6),
                               offered like held_step; -1: none */
    int grow;               /* spares this survivor knows were asked to join as additional
                               members (growth in place: recovery.c G1), still waiting and alive */
    int64_t own_step;       /* partnered: the newest step of which it holds its own pieces,
                               whether their partner copy was sent or not; offered only where
                               no member was lost (a growth: coord.c I5), or where the
                               reporters alone held that step's pieces (own_rank, own_world:
                               I7), -1: none */
    int own_rank, own_world; /* own_step's snapshot: this member's rank in the world of
                               own_world members it was taken in (0 0: none) */
} rec_report;

enum rec_source { REC_FROM_MEMORY = 1, REC_FROM_DISK = 2, REC_FROM_NOTHING = 3 };

/* What the coordinator decides; sent to every member. */
typedef struct rec_decision {
    uint64_t epoch;
    int64_t step;               /* the step every member restores (I3) */
    int source;                 /* enum rec_source */
    int root;                   /* REC_FROM_MEMORY: the lowest member holding the snapshot */
    int all_hold;               /* REC_FROM_MEMORY: 1 if every member holds it (no transfer) */
    int joined;                 /* spares brought in (add_spares): members that hold no state yet,
                                   in lost members' places or, asked to grow, beyond them */
    int64_t steps_lost;         /* max next_step of the survivors minus step */
    int nmembers;
    int members[REC_MAX_WORLD]; /* ranks at start, ascending: new rank i is members[i];
                                   last, so a message carries only the first nmembers */
} rec_decision;

/* The decision rule (docs/PROTOCOL.md, I1..I6), a pure function: `prev` is the previous
   view (ranks at start, any order, no duplicates), `rep` the survivors' reports (members
   of prev, any order). Returns 0 and fills *out, or RK_E_NO_MAJORITY (I1),
   RK_E_MIN_WORLD (I2), -EINVAL for malformed input. */
int rec_decide(const int *prev, int nprev, const rec_report *rep, int nrep, int min_world,
               uint64_t epoch, rec_decision *out);

#endif
