/*
 * recover/recovery.c - the recovery rounds, run by every surviving worker on its training
 * thread, inside rk_allreduce or rk_step_done (docs/PROTOCOL.md).
 *
 * PURPOSE
 *   When the detector's view loses a member, bring every survivor to the same new
 *   membership, the same rebuilt ring and the same step of the registered state, within a
 *   bound, without ever letting two parts of a partitioned job both continue.
 *
 * STATES (per worker; the function performing each transition)
 *
 *   RUNNING --(a member declared dead: rec_membership_changed, api_det.c, which notes the loss
 *             time)--> FENCE
 *   FENCE   --(the ring call returned; no request can write user memory)--> AGREE (rec_recover)
 *   AGREE   --(coordinator: every live member reported: coordinate)--> REBUILD
 *   AGREE   --(member: its coordinator's decision received: follow)--> REBUILD
 *   AGREE   --(a round ended with a report missing, or the coordinator died)--> AGREE, next
 *             round, the report sent again (recover_rounds)
 *   AGREE   --(the last round ended: give_up, or a member's own schedule ran out)--> STOPPED
 *   AGREE   --(RK_E_NO_MAJORITY / RK_E_MIN_WORLD)--> STOPPED (error returned)
 *   REBUILD --(ring_rebuild over the members: apply_decision)--> ROLLBACK
 *   REBUILD --(a member died meanwhile: AGAIN)--> AGREE, fresh reports, same base and schedule
 *   ROLLBACK --(rec_ckpt_rollback: memory or disk)--> RESUME
 *   ROLLBACK --(a member died meanwhile: AGAIN)--> AGREE, the new base, that loss's schedule
 *   RESUME  --(events ring_rebuilt, resumed; RK_RECOVERED)--> RUNNING
 *   any     --(this worker declared dead, or left out of the decision)--> FENCED
 *
 * INVARIANTS (besides rec_decide's I1..I6, see coord.c)
 *   R1 Messages travel point-to-point on ctx->comm between survivors only; a worker only
 *      ever waits for a message while polling the detector and a deadline, and no MPI call
 *      here blocks (MPI_Isend, MPI_Improbe + MPI_Imrecv, MPI_Test).
 *   R2 Every message carries the base epoch (the last agreed view's); a message of
 *      another base is stale and dropped, so rounds of different recoveries never mix.
 *      One exception, within one recovery: a decision whose ring rebuild completed on some
 *      members and was interrupted on others (a member died during it) leaves the former
 *      on the decision's epoch as their base and the latter on the one before; each side
 *      also takes the other's messages (rounds.alt_epoch), so they agree again in the
 *      next round instead of dropping each other's reports until the schedule ends.
 *   R3 A decision is applied only from the coordinator of the receiver's current round,
 *      and becomes the new base only once the ring over its members is built.
 *   R4 The coordinator of a round is the lowest rank of the base view that the
 *      receiver's detector still holds alive.
 *   R5 One schedule for everyone: REC_ROUNDS rounds of RK_TIMEOUT_MS counted from the
 *      time the detector declared the loss (ctx->loss_ns), not from when a worker enters
 *      recovery, so a survivor that enters late (a long step) is in the same round as the
 *      others. The coordinator decides once every live member reported; a member reports
 *      again each round and when the coordinator changes. After the last round every
 *      survivor stops alike with RK_E_TIMEOUT, naming who never reported.
 *   R6 A message's bytes are a copy (MPI_Alloc_mem) listed in ctx->xfers until MPI is
 *      done with it: freed once its send completed, freed at once if MPI_Isend failed,
 *      and kept for the life of the process (rk__retain_forever) if a request to a dead
 *      peer may still read it. Received messages land in such a copy too. (R1's sends and
 *      receives and R6 are rec_msg.c's.)
 *
 * GROWTH IN PLACE (spares asked to join as additional members; docs/LAUNCHER.md)
 *   G1 A request to grow is a membership change like a loss, learned the same way by every
 *      member: a detector declaration (det_admit, detector/det_proto.c I11) that bumps every
 *      member's epoch and emits DET_EV_ADMIT, so the ring call in flight on each member is
 *      abandoned (rec_ring_changed, once the request is REC_GROW_GRACE_NS old: a call the
 *      others are still making finishes first, else one member that gave up its last
 *      chunk lacks a step the others completed, and the growth loses it) and all of them
 *      enter these rounds from the same step,
 *      on the schedule of R5 from the time the request was learned. Nothing else differs:
 *      the same reports, decision rule (I1..I6), epochs, fencing and rollback, but one
 *      thing: learned on entry to rk_step_done, the step just finished is kept (its
 *      snapshot taken first, api.c), where a loss rolls it back (docs/LAUNCHER.md J7).
 *   G2 Only the lowest member asks (rec_grow_poll, at most every REC_GROW_POLL_NS): it reads
 *      the world the launcher wants from RK_RUN_RECORDS/grow-to and asks for as many of the
 *      spares still waiting and alive as make it up, counting those asked already. The file
 *      names a size, not a change, so reading it twice asks nothing twice.
 *   G3 Each report carries how many spares its sender knows were asked and still wait
 *      alive (rec_report.grow); the coordinator brings in that many live spares (the
 *      largest count reported) beyond the lost members' places (add_spares), the asked ones
 *      first. The decision's ring is then N+k, every survivor keeps its process and memory,
 *      and the spares receive the state as a spare replacing a lost member does
 *      (rollback.c: the survivors' snapshot spread from its root; sharded state: G5).
 *   G4 A spare that dies, or goes silent, at any point of its join is a loss like any
 *      other: before the decision it is not brought in (the view no longer holds it);
 *      during the ring rebuild or the transfer the survivors start a new round (REC_AGAIN)
 *      that decides without it; in the first allreduce after, the survivors recover from
 *      it. Each costs the survivors one detection and one round, within R5's bound, and
 *      they go on at N from the same step.
 *   G5 Sharded and per-rank state grow the same way (rollback.c, rebuild_partnered): the
 *      members' newest snapshot with its partner copies is re-split from N to N+k in their
 *      memory as a loss re-splits it from N to N-1 (each new range from the members that
 *      hold it, the spares' whole, the new partner copies made in the same pass), and a
 *      spare at a rank new to the job finds no per-rank state of that rank, in memory as in
 *      a checkpoint of the smaller world: it keeps what it registered, as the worker of that
 *      rank does in a job launched at N+k from that checkpoint (a program that seeds such
 *      state from its rank does so once rk_resume returns: rk-train's zero_seed). No
 *      member is lost, so the newest step of which every member holds its own pieces is
 *      rebuilt even where its partner copies were not all sent yet (coord.c I5, rollback.c
 *      B8): the step in flight is run again on N+k, none lost. tests/test_grow.c: rk-train
 *      --zero grown 3 -> 4 ends with the bits of a replay whose world changes at the step
 *      the grown ring resumed at.
 *   G6 A spare is a member only once the decision that brought it in completed: its ring
 *      built and its state received. Where another worker's death interrupts the rollback
 *      after the ring was built (REC_AGAIN), every worker puts the spares that decision
 *      brought in back among the waiting spares (unjoin): they leave the base view the
 *      members report on, a spare among them waits for the next decision in
 *      rec_spare_wait, and that decision brings the live ones in again (add_spares: still
 *      asked). Before, such a spare waited for a decision while the members counted it in
 *      their base view and waited for its report until the rounds' bound: two newcomers of
 *      one join, the first dead at join@1, stopped the job (tests/test_grow.c
 *      join_rk_first_of_two_newcomers_dies_while_joining; chaos seed 4210, run 51).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../detector/det.h"
#include "../ring/ring.h"
#include "rec.h"
#include "rec_internal.h"

#define REC_TAG_REPORT 0x5e01
#define REC_TAG_DECIDE 0x5e02
#define REC_TAG_RELEASE 0x5e03
#define REC_MAGIC 0x524b5231u /* "RKR1" */
#define REC_ROUNDS 3          /* rounds of RK_TIMEOUT_MS each, counted from the loss (R5) */

struct msg_report {
    uint32_t magic;
    uint32_t pad;
    uint64_t base_epoch;
    rec_report r;
};

struct msg_decide {
    uint32_t magic;
    int32_t error; /* 0, or the error every member stops with (no majority, min_world, timeout) */
    uint64_t base_epoch;
    rec_decision d; /* only the first nmembers entries of d.members are sent; with
                       RK_E_TIMEOUT they name the members whose report never came */
};

static size_t decide_bytes(int nmembers)
{
    return offsetof(struct msg_decide, d.members) + (size_t)nmembers * sizeof(int);
}

/* Whether n received bytes are a well-formed decision message: the magic, and a member
   list whose length matches the size. */
static bool decision_well_formed(const struct msg_decide *m, int n)
{
    if ((size_t)n < decide_bytes(0) || m->magic != REC_MAGIC)
        return false;
    return m->d.nmembers >= (m->error ? 0 : 1) && m->d.nmembers <= REC_MAX_WORLD &&
           (size_t)n == decide_bytes(m->d.nmembers);
}

static bool in_list(const int *a, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (a[i] == x)
            return true;
    return false;
}

/* "3, 5, 9" into buf (cap bytes), cut with "..." when long. */
static const char *rank_list(char *buf, size_t cap, const int *r, int n)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len + 16 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", r[i]);
    if (n > 0 && len + 16 >= cap)
        snprintf(buf + len, cap - len, ", ...");
    return buf;
}

/* The schedule (R5): round k of a loss runs from loss + k*T to loss + (k+1)*T; a member
   listens a grace of 2 heartbeats past the last round, for a coordinator that learned of
   the loss a little later than itself, and the same grace bounds how long a message
   between live workers may take. */
static int64_t round_ns(const rk_ctx *ctx)
{
    return (int64_t)ctx->opt.timeout_ms * 1000000LL;
}

static int64_t grace_ns(const rk_ctx *ctx)
{
    return 2LL * ctx->opt.heartbeat_ms * 1000000LL;
}

/* ---- initial state and the cheap change test ------------------------------------------- */

int rec_recovery_init(rk_ctx *ctx)
{
    ctx->nview = ctx->world;
    ctx->view = calloc((size_t)ctx->nview, sizeof(int));
    if (!ctx->view)
        goto out_fail;
    for (int i = 0; i < ctx->nview; i++)
        ctx->view[i] = i;
    if (ctx->nspares > 0) {
        if (!(ctx->spares = calloc((size_t)ctx->nspares, sizeof(int))))
            goto out_fail;
        for (int i = 0; i < ctx->nspares; i++)
            ctx->spares[i] = ctx->world + i;
    }
    const char *dir = getenv("RK_RUN_RECORDS"); /* G2, J16: under `rekindle run` */
    if (dir && *dir && !ctx->is_spare) {
        size_t n = strlen(dir) + sizeof("/" REC_GROW_FILE);
        if (!(ctx->grow_file = malloc(n)))
            goto out_fail;
        snprintf(ctx->grow_file, n, "%s/%s", dir, REC_GROW_FILE);
    }
    if (!(ctx->admit = calloc((size_t)(ctx->nslots > 0 ? ctx->nslots : 1), sizeof(bool))))
        goto out_fail;
    if (ctx->det) {
        det_view v;
        det_view_get(ctx->det, &v);
        ctx->agreed_epoch = v.epoch;
        ctx->seen_seq = det_seq(ctx->det);
    }
    return 0;
out_fail:
    rec_recovery_fini(ctx);
    return -ENOMEM;
}

void rec_recovery_fini(rk_ctx *ctx)
{
    free(ctx->view);
    ctx->view = NULL;
    ctx->nview = 0;
    free(ctx->spares);
    ctx->spares = NULL;
    ctx->nspares = 0;
    free(ctx->admit);
    ctx->admit = NULL;
    free(ctx->slot_rank);
    ctx->slot_rank = NULL;
    free(ctx->grow_file);
    ctx->grow_file = NULL;
    rec_msgs_settle(ctx, 0);
    free(ctx->xfers);
    ctx->xfers = NULL;
    ctx->cap_xfers = 0;
}

/* ---- one recovery: what a worker holds during the rounds of one base view --------------- */

struct rounds {
    int64_t start_ns;        /* the schedule's origin (R5) */
    uint64_t base_epoch;     /* the agreed epoch this state belongs to (R2) */
    bool has_alt;            /* R2's exception: messages of alt_epoch are taken too */
    uint64_t alt_epoch;
    rec_report *rep;         /* by position in ctx->view: the latest report of each member */
    bool *got;
    struct msg_decide *in;   /* the latest decision received: in_len bytes from in_src */
    int in_len, in_src;
    uint64_t min_epoch;      /* a new decision's epoch exceeds every earlier one's */
};

static void rounds_free(struct rounds *st)
{
    free(st->rep);
    free(st->got);
    free(st->in);
    memset(st, 0, sizeof(*st));
}

/* A fresh state for the current base view, on the schedule of the loss being recovered. */
static int rounds_reset(rk_ctx *ctx, struct rounds *st)
{
    uint64_t min_epoch = st->min_epoch;
    rounds_free(st);
    st->min_epoch = min_epoch;
    st->start_ns = ctx->loss_ns ? ctx->loss_ns : rk__mono_ns();
    st->base_epoch = ctx->agreed_epoch;
    st->rep = calloc((size_t)ctx->nview, sizeof(*st->rep));
    st->got = calloc((size_t)ctx->nview, sizeof(*st->got));
    st->in = malloc(sizeof(*st->in));
    return st->rep && st->got && st->in ? 0 : -ENOMEM;
}

static int view_pos(const rk_ctx *ctx, int rank0)
{
    for (int i = 0; i < ctx->nview; i++)
        if (ctx->view[i] == rank0)
            return i;
    return -1;
}

/* Whether a message of base epoch `e` belongs to these rounds (R2 and its exception). */
static bool of_base(const struct rounds *st, uint64_t e)
{
    return e == st->base_epoch || (st->has_alt && e == st->alt_epoch);
}

/* Files every message waiting: reports of this base from members (the latest of each),
   the latest decision of this base; everything else is stale or malformed (R2). */
static void pump(rk_ctx *ctx, struct rounds *st)
{
    struct msg_report m;
    int src, n, i;
    while ((n = rec_msg_recv(ctx, REC_TAG_REPORT, &m, sizeof(m), &src, rk__mono_ns() + grace_ns(ctx))) != 0) {
        if (n == REC_DROPPED)
            RK_LOG_DEBUG(RK_SUB_REC, "dropped a report that could not be received whole");
        else if ((size_t)n == sizeof(m) && m.magic == REC_MAGIC && of_base(st, m.base_epoch) && m.r.rank0 == src &&
            (i = view_pos(ctx, src)) >= 0) {
            st->rep[i] = m.r;
            st->got[i] = true;
        } else {
            RK_LOG_DEBUG(RK_SUB_REC, "dropped a stale report from rank %d", src);
        }
    }
    struct msg_decide *d = malloc(sizeof(*d));
    if (!d)
        return;
    while ((n = rec_msg_recv(ctx, REC_TAG_DECIDE, d, sizeof(*d), &src, rk__mono_ns() + grace_ns(ctx))) != 0) {
        if (n == REC_DROPPED)
            RK_LOG_DEBUG(RK_SUB_REC, "dropped a decision that could not be received whole");
        else if (decision_well_formed(d, n) && of_base(st, d->base_epoch) && d->d.epoch >= st->min_epoch) {
            memcpy(st->in, d, (size_t)n);
            st->in_len = n;
            st->in_src = src;
        } else {
            RK_LOG_DEBUG(RK_SUB_REC, "dropped a stale decision from rank %d", src);
        }
    }
    free(d);
}

/* ---- one round ------------------------------------------------------------------------- */

/* Spares asked to join (G1) that still wait, alive in v. */
static int asked_waiting(const rk_ctx *ctx, const det_view *v)
{
    int n = 0;
    for (int i = 0; i < ctx->nspares; i++)
        n += ctx->admit[ctx->spares[i]] && det_view_has(v, ctx->spares[i]);
    return n;
}

static void my_report(rk_ctx *ctx, const det_view *v, rec_report *r)
{
    r->rank0 = ctx->rank0;
    r->epoch = v->epoch;
    r->next_step = ctx->next_step;
    r->grow = asked_waiting(ctx, v); /* G3 */
    /* RK_ROLLBACK=disk: offer no snapshot, so the decision restores from disk. */
    rec_ckpt_offer(ctx, strcmp(ctx->opt.rollback, "disk") != 0, r);
}

/* After the decision rule: live spares take the places of lost members (up to the size of
   the previous view) and, asked to grow, `grow` more beyond them (G3), the asked ones first.
   Spares have the highest ranks at start, so the list stays ascending once sorted. */
static void add_spares(rk_ctx *ctx, const det_view *v, rec_decision *dec, int grow)
{
    int cap = ctx->nview + grow < REC_MAX_WORLD ? ctx->nview + grow : REC_MAX_WORLD;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < ctx->nspares && dec->nmembers < cap; i++) {
            int s = ctx->spares[i];
            if (!det_view_has(v, s) || (pass == 0) != ctx->admit[s] || in_list(dec->members, dec->nmembers, s))
                continue; /* a spare that died while waiting; the asked ones first */
            dec->members[dec->nmembers++] = s;
            dec->all_hold = 0; /* a spare holds no snapshot: it receives the survivors' */
            dec->joined++;
        }
    }
    qsort(dec->members, (size_t)dec->nmembers, sizeof(int), rk__cmp_int);
}

/* Sends a decision (or an error: then d names who is missing) to each of `to`, all at
   once; the sends complete while the ring is rebuilt (R6). */
static int send_decision(rk_ctx *ctx, const struct rounds *st, int error, const rec_decision *d, const int *to,
                         int nto)
{
    struct msg_decide *m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    m->magic = REC_MAGIC;
    m->error = error;
    m->base_epoch = st->base_epoch;
    memcpy(&m->d, d, decide_bytes(d->nmembers) - offsetof(struct msg_decide, d));
    int rc = 0;
    for (int i = 0; i < nto && rc >= 0; i++)
        if (to[i] != ctx->rank0)
            rc = rec_msg_send(ctx, m, decide_bytes(d->nmembers), to[i], REC_TAG_DECIDE);
    free(m);
    return rc < 0 ? rc : 0;
}

/* The coordinator, once every member alive in v reported: decides (rec_decide, spares)
   and tells the members of the new ring, or every reporter the error they all stop with. */
static int coordinate(rk_ctx *ctx, struct rounds *st, const det_view *v, rec_decision *dec, int *dec_error)
{
    rec_report *rep = calloc((size_t)ctx->nview, sizeof(*rep));
    int *to = calloc((size_t)ctx->nview, sizeof(*to));
    int rc = 0, nrep = 0;
    if (!rep || !to) {
        rc = -ENOMEM;
        goto out_free;
    }
    uint64_t max_epoch = v->epoch;
    int grow = 0;
    for (int i = 0; i < ctx->nview; i++) {
        if (!st->got[i] || !(det_view_has(v, ctx->view[i]) || ctx->view[i] == ctx->rank0))
            continue; /* a member that died after it reported is not waited for again */
        to[nrep] = ctx->view[i];
        rep[nrep++] = st->rep[i];
        if (st->rep[i].epoch > max_epoch)
            max_epoch = st->rep[i].epoch;
        if (st->rep[i].grow > grow)
            grow = st->rep[i].grow;
    }
    uint64_t epoch = max_epoch + 1 > st->min_epoch ? max_epoch + 1 : st->min_epoch;
    *dec_error = rec_decide(ctx->view, ctx->nview, rep, nrep, ctx->opt.min_world, epoch, dec);
    if (*dec_error == -EINVAL) {
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "recovery: malformed reports");
        goto out_free;
    }
    if (*dec_error == 0) {
        add_spares(ctx, v, dec, grow);
        rc = send_decision(ctx, st, 0, dec, dec->members, dec->nmembers);
    } else {
        dec->nmembers = 0;
        rc = send_decision(ctx, st, *dec_error, dec, to, nrep);
    }
out_free:
    free(rep);
    free(to);
    return rc;
}

/* RK_E_TIMEOUT after the last round; d->members: who never reported. */
static int timed_out(rk_ctx *ctx, const rec_decision *d)
{
    char who[256];
    if (d->nmembers == 0)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_TIMEOUT,
                        "recovery stopped: its %d rounds of %d ms ended before this worker could decide "
                        "(checkpoints are intact)", REC_ROUNDS, ctx->opt.timeout_ms);
    return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_TIMEOUT,
                    "recovery stopped: no report from rank(s) %s in %d rounds of %d ms (checkpoints are intact)",
                    rank_list(who, sizeof(who), d->members, d->nmembers), REC_ROUNDS, ctx->opt.timeout_ms);
}

/* The coordinator after the last round (members still silent, or it came late itself):
   every reporter stops with RK_E_TIMEOUT naming the silent, like the coordinator (and like
   the silent ones, whose own schedule ends too). */
static int give_up(rk_ctx *ctx, struct rounds *st, const det_view *v)
{
    rec_decision *d = calloc(1, sizeof(*d));
    int *to = calloc((size_t)ctx->nview, sizeof(*to));
    int rc = -ENOMEM, nto = 0;
    if (d && to) {
        for (int i = 0; i < ctx->nview; i++) {
            if (st->got[i])
                to[nto++] = ctx->view[i];
            else if (det_view_has(v, ctx->view[i]) && ctx->view[i] != ctx->rank0)
                d->members[d->nmembers++] = ctx->view[i];
        }
        rc = send_decision(ctx, st, RK_E_TIMEOUT, d, to, nto);
        rec_msgs_settle(ctx, rk__mono_ns() + grace_ns(ctx));
        if (rc == 0)
            rc = timed_out(ctx, d);
    }
    free(d);
    free(to);
    return rc;
}

/* A member: takes the decision of its coordinator (R3), the error named if it is one. */
static int follow(rk_ctx *ctx, struct rounds *st, rec_decision *dec)
{
    struct msg_decide *in = st->in;
    st->in_len = 0;
    if (in->error == 0) {
        memcpy(dec, &in->d, decide_bytes(in->d.nmembers) - offsetof(struct msg_decide, d));
        return 0;
    }
    if (in->error == RK_E_TIMEOUT)
        return timed_out(ctx, &in->d);
    return rk__fail(RK_SUB_REC, RK_LOG_ERROR, in->error, "recovery stopped: %s (checkpoints are intact)",
                    rk_strerror(in->error));
}

/* The ring's cancellation while rebuilding: a member of the decision died meanwhile. */
struct rebuild_watch {
    rk_ctx *ctx;
    const rec_decision *dec;
};

static bool rebuild_changed(void *arg)
{
    struct rebuild_watch *w = arg;
    if (det_fenced(w->ctx->det))
        return true;
    det_view v;
    det_view_get(w->ctx->det, &v);
    for (int i = 0; i < w->dec->nmembers; i++)
        if (w->dec->members[i] < w->ctx->nslots && !det_view_has(&v, w->dec->members[i]))
            return true;
    return false;
}

static const char *source_name(int s)
{
    return s == REC_FROM_MEMORY ? "memory" : s == REC_FROM_DISK ? "disk" : "none";
}

/* G6: the decision's rollback was interrupted: the spares it brought in (its members that
   were not members before it: not in `were`) wait again, and leave the view. */
static int unjoin(rk_ctx *ctx, const rec_decision *dec, bool was_spare, const int *were, int nwere)
{
    if (!dec->joined)
        return 0;
    int *sp = realloc(ctx->spares, (size_t)(ctx->nspares + ctx->nview + 1) * sizeof(int));
    if (!sp)
        return -ENOMEM;
    ctx->spares = sp;
    int kept = 0;
    for (int i = 0; i < ctx->nview; i++) {
        int r = ctx->view[i];
        if (in_list(were, nwere, r) && !(was_spare && r == ctx->rank0)) {
            ctx->view[kept++] = r;
        } else if (!in_list(ctx->spares, ctx->nspares, r)) {
            ctx->spares[ctx->nspares++] = r;
        }
    }
    qsort(ctx->spares, (size_t)ctx->nspares, sizeof(int), rk__cmp_int);
    RK_LOG_INFO(RK_SUB_REC, "recovery: the decision of epoch %llu was interrupted before its %d spare(s) had "
                "the state: they wait again, %d member(s) recover", (unsigned long long)dec->epoch,
                ctx->nview - kept, kept);
    ctx->nview = kept;
    if (was_spare) {
        ctx->is_spare = true;
        ctx->rank = -1;
    }
    return 0;
}

/* REBUILD, ROLLBACK, RESUME. */
static int apply_decision(rk_ctx *ctx, const rec_decision *dec, int64_t t0, int64_t deadline)
{
    bool joining = ctx->is_spare;
    if (!in_list(dec->members, dec->nmembers, ctx->rank0))
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_FENCED,
                        "recovery: the survivors continued without this worker: fenced");
    struct rebuild_watch w = {ctx, dec};
    ring_cancel cancel = {.deadline_ns = deadline, .changed = rebuild_changed, .arg = &w};
    /* Slots to ranks; a decision that names a newcomer moves this member onto the merged
       communicator (join_proto.c J15). */
    int ranks[REC_MAX_WORLD];
    MPI_Comm merged = MPI_COMM_NULL;
    int rc = rec_join_switch(ctx, dec->members, dec->nmembers, ranks, &merged);
    if (rc)
        return rc;
    rc = merged != MPI_COMM_NULL ? ring_rebuild_on(ctx->ring, merged, ranks, dec->nmembers, dec->epoch, &cancel)
                                 : ring_rebuild(ctx->ring, ranks, dec->nmembers, dec->epoch, &cancel);
    if (rc == RK_E_PEER_LOST || rc == RK_E_TIMEOUT) {
        RK_LOG_WARN(RK_SUB_REC, "recovery: ring rebuild at epoch %llu interrupted (%s): next round",
                    (unsigned long long)dec->epoch, rk_strerror(rc));
        return REC_AGAIN;
    }
    if (rc != 0)
        return rc;
    /* R3: the decision is the new base. The view before it (a spare's: the members that
       welcomed it) is kept until the rollback is done, for G6. */
    int *view = malloc((size_t)dec->nmembers * sizeof(int));
    if (!view)
        return -ENOMEM;
    memcpy(view, dec->members, (size_t)dec->nmembers * sizeof(int));
    int *were = ctx->view, nwere = ctx->nview;
    ctx->view = view;
    ctx->nview = dec->nmembers;
    int grown = dec->nmembers - nwere;
    ctx->agreed_epoch = dec->epoch;
    ctx->is_spare = false;
    int kept = 0; /* spares brought in leave the list of spares */
    for (int i = 0; i < ctx->nspares; i++)
        if (!in_list(dec->members, dec->nmembers, ctx->spares[i]))
            ctx->spares[kept++] = ctx->spares[i];
    ctx->nspares = kept;
    det_view nv, now;
    det_view_get(ctx->det, &nv);
    now = nv;
    nv.epoch = dec->epoch;
    memset(nv.members, 0, sizeof(nv.members));
    nv.nmembers = 0;
    /* The detector keeps watching the spares still waiting: a removal would be final. */
    for (int i = 0; i < dec->nmembers + ctx->nspares; i++) {
        int r = i < dec->nmembers ? dec->members[i] : ctx->spares[i - dec->nmembers];
        if (i >= dec->nmembers && !det_view_has(&now, r))
            continue; /* a spare declared dead stays out (det_proto.c I4) */
        nv.members[r / 64] |= 1ull << (r % 64);
        nv.nmembers++;
    }
    int irc = det_install_view(ctx->det, &nv);
    if (irc == RK_E_FENCED) {
        free(were);
        return irc;
    }
    if (irc != 0) /* the view moved on meanwhile: the next call recovers again */
        RK_LOG_INFO(RK_SUB_REC, "recovery: detector view moved past epoch %llu", (unsigned long long)dec->epoch);
    /* Deaths the detector declared meanwhile are still queued: the next check sees them. */
    ctx->seen_seq = 0;
    ctx->change_pending = false;
    ctx->change_lost = false;
    ctx->loss_ns = 0;
    ctx->rank = ring_rank(ctx->ring);
    ctx->world = ring_size(ctx->ring);
    RK_EVENT(ctx->ev, "ring_rebuilt", RK_EV_I("epoch", dec->epoch), RK_EV_I("world", ctx->world),
             RK_EV_D("ms", rk__ms_since(t0)));
    if (grown > 0) /* G3 */
        RK_LOG_INFO(RK_SUB_REC, "grown in place by %d: epoch %llu, world %d", grown, (unsigned long long)dec->epoch,
                    ctx->world);

    if (joining)
        rk__fault_point("join"); /* #1: the ring is built, the state not sent yet (G4) */
    int from = dec->source;
    rc = rec_ckpt_rollback(ctx, dec, &from); /* sets ctx->next_step */
    if (rc == RK_E_PEER_LOST || rc == RK_E_TIMEOUT) { /* another member died during the rollback: a new round */
        int urc = unjoin(ctx, dec, joining, were, nwere); /* G6 */
        rc = urc ? urc : REC_AGAIN;
    }
    free(were);
    if (rc != 0)
        return rc;
    RK_EVENT(ctx->ev, "resumed", RK_EV_I("step", ctx->next_step), RK_EV_S("from", source_name(from)),
             RK_EV_I("epoch", dec->epoch), RK_EV_I("world", ctx->world), RK_EV_I("steps_lost", dec->steps_lost),
             RK_EV_D("ms", rk__ms_since(t0)));
    RK_LOG_INFO(RK_SUB_REC, "recovered in %.1f ms: epoch %llu, world %d, resuming step %lld from %s (%lld steps lost)",
                rk__ms_since(t0), (unsigned long long)dec->epoch, ctx->world, (long long)ctx->next_step,
                source_name(from), (long long)dec->steps_lost);
    return RK_RECOVERED;
}

static int recover_rounds(rk_ctx *ctx);

int rec_recover(rk_ctx *ctx)
{
    int rc = recover_rounds(ctx);
    if (rc < 0)
        rec_ckpt_abandon(ctx); /* stopped: never wait for the lost member's shard */
    /* Sends to live members are done (they received, or stopped); the rest went to the
       dead: kept, never freed (R6). */
    rec_msgs_settle(ctx, 0);
    return rc;
}

/* The rounds (R5): every worker runs this loop, as coordinator while it is the lowest live
   member of the base view (R4), else as a member, on the schedule of the loss. */
static int recover_rounds(rk_ctx *ctx)
{
    if (!ctx->det || !ctx->ring)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_PEER_LOST,
                        "a member was lost and recovery needs the detector and the ring");
    int64_t t0 = rk__mono_ns();
    struct rounds st = {0};
    rec_decision *dec = malloc(sizeof(*dec));
    int rc = dec ? rounds_reset(ctx, &st) : -ENOMEM;
    int sent_to = -1, sent_round = -1, last_coord = -1;
    RK_LOG_INFO(RK_SUB_REC, "membership changed: recovering from base epoch %llu, %.0f ms after the loss",
                (unsigned long long)ctx->agreed_epoch, rk__ms_since(st.start_ns));
    while (rc == 0) {
        pump(ctx, &st);
        rec_msgs_progress(ctx);
        if (det_fenced(ctx->det)) {
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_FENCED, "this worker was declared dead by the others");
            break;
        }
        det_view v;
        det_view_get(ctx->det, &v);
        int coord = -1, missing = 0, me = view_pos(ctx, ctx->rank0);
        for (int i = 0; i < ctx->nview; i++) {
            bool alive = det_view_has(&v, ctx->view[i]) || i == me;
            if (alive && coord < 0)
                coord = ctx->view[i]; /* R4: the base view is ascending */
            missing += alive && !st.got[i] && i != me;
        }
        int64_t since = rk__mono_ns() - st.start_ns;
        int round = (int)(since / round_ns(ctx));
        if (coord != last_coord) {
            RK_LOG_DEBUG(RK_SUB_REC, "recovery round %d: coordinator rank %d", round, coord);
            last_coord = coord;
        }
        int dec_error = 0;
        if (coord == ctx->rank0) {
            if (round >= REC_ROUNDS) { /* the members stop waiting too */
                rc = give_up(ctx, &st, &v);
                break;
            }
            if (missing > 0) {
                rk__sleep_ns(REC_POLL_NS);
                continue;
            }
            if (me >= 0) {
                my_report(ctx, &v, &st.rep[me]);
                st.got[me] = true;
            }
            rc = coordinate(ctx, &st, &v, dec, &dec_error);
            if (rc == 0 && dec_error)
                rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, dec_error, "recovery stopped: %s (checkpoints are intact)",
                              rk_strerror(dec_error));
        } else {
            /* Report to the coordinator: when it changes, and again every round (R5). */
            if ((coord != sent_to || round != sent_round) && round < REC_ROUNDS) {
                struct msg_report m = {.magic = REC_MAGIC, .base_epoch = st.base_epoch};
                my_report(ctx, &v, &m.r);
                sent_to = coord;
                sent_round = round;
                if ((rc = rec_msg_send(ctx, &m, sizeof(m), coord, REC_TAG_REPORT)) == REC_AGAIN)
                    rc = 0; /* again next round */
                if (rc)
                    break;
            }
            if (!st.in_len || st.in_src != coord) {
                if (since > REC_ROUNDS * round_ns(ctx) + grace_ns(ctx)) {
                    rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_TIMEOUT,
                                  "recovery stopped: no decision from coordinator rank %d in %d rounds of %d ms",
                                  coord, REC_ROUNDS, ctx->opt.timeout_ms);
                    break;
                }
                rk__sleep_ns(REC_POLL_NS);
                continue;
            }
            rc = follow(ctx, &st, dec);
        }
        if (rc != 0)
            break;
        st.min_epoch = dec->epoch + 1;
        rc = apply_decision(ctx, dec, t0, rk__deadline_ns(ctx->opt.timeout_ms));
        if (rc != REC_AGAIN)
            break;
        /* A member died while the ring was rebuilt (same base: fresh reports, same
           schedule) or during the rollback (a new base: a new loss, a new schedule). */
        if (ctx->agreed_epoch != st.base_epoch) {
            /* This worker built the decision's ring; a member whose rebuild was interrupted
               by the same death still reports on the base before (R2's exception). */
            uint64_t before = st.base_epoch;
            rc = rounds_reset(ctx, &st);
            st.has_alt = true;
            st.alt_epoch = before;
        } else {
            /* This worker's rebuild was interrupted; members that completed it report on the
               decision's epoch as their base (R2's exception). */
            memset(st.got, 0, (size_t)ctx->nview * sizeof(*st.got));
            st.in_len = 0;
            st.has_alt = true;
            st.alt_epoch = dec->epoch;
            rc = 0;
        }
        sent_to = -1;
    }
    rounds_free(&st);
    free(dec);
    return rc;
}

/* ---- spares ------------------------------------------------------------------------------ */

/* Under `rekindle run`, a spare brought in leaves RK_RUN_RECORDS/joined-<rank at start>: the
   launcher then counts its exit 0 as the job's completion, and an unused spare's not
   (docs/LAUNCHER.md). Best effort: without it the launcher only waits on the members. */
bool rec_records_path(char *path, size_t cap, const char *name, int slot)
{
    const char *dir = getenv("RK_RUN_RECORDS");
    return dir && *dir && snprintf(path, cap, "%s/%s-%d", dir, name, slot) < (int)cap;
}

bool rec_record_ended(int slot)
{
    char path[4096];
    struct stat st;
    return rec_records_path(path, sizeof(path), "rank", slot) && lstat(path, &st) == 0 && S_ISREG(st.st_mode) &&
           st.st_uid == geteuid();
}

int rec_record_note(const char *name, int slot, const char *text)
{
    char path[4096], tmp[4096], aside[64];
    snprintf(aside, sizeof(aside), ".%s", name);
    if (!rec_records_path(path, sizeof(path), name, slot) || !rec_records_path(tmp, sizeof(tmp), aside, slot))
        return 0;
    /* Written aside, then renamed: the launcher never reads half a note. Never through a
       planted link (O_NOFOLLOW; an old one of the same name is replaced, not followed). */
    if (unlink(tmp) != 0 && errno != ENOENT)
        return -errno;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600), rc = 0;
    if (fd < 0)
        return -errno;
    size_t len = text ? strlen(text) : 0;
    if (len && write(fd, text, len) != (ssize_t)len)
        rc = -EIO;
    if (close(fd) != 0 && !rc)
        rc = -errno;
    if (!rc && rename(tmp, path) != 0)
        rc = -errno;
    if (rc)
        unlink(tmp);
    return rc;
}

static void note_joined(const rk_ctx *ctx)
{
    int rc = rec_record_note("joined", ctx->rank0, NULL);
    if (rc)
        RK_LOG_WARN(RK_SUB_REC, "cannot note in %s that this spare joined: %s", getenv("RK_RUN_RECORDS"),
                    strerror(-rc));
}

int rec_spare_wait(rk_ctx *ctx)
{
    if (!ctx->det || !ctx->ring)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_STATE, "a spare needs the detector and the ring");
    RK_LOG_INFO(RK_SUB_REC, "spare worker: waiting until a member is lost");
    struct msg_decide *in = malloc(sizeof(*in));
    if (!in)
        return -ENOMEM;
    int rc;
    int64_t gone_since = 0;
    for (;;) {
        int src, n;
        char token[16];
        if (rec_msg_recv(ctx, REC_TAG_RELEASE, token, sizeof(token), &src, rk__mono_ns() + grace_ns(ctx)) > 0) {
            rk__set_last_error("the job finished without needing this spare worker");
            rc = RK_E_SPARE_UNUSED;
            break;
        }
        /* A decision naming this spare, from whichever member coordinates (R2 does not
           apply: a spare takes no part in rounds, so it has no base epoch to match). */
        bool got = false;
        while (!got && (n = rec_msg_recv(ctx, REC_TAG_DECIDE, in, sizeof(*in), &src, rk__mono_ns() + grace_ns(ctx))) != 0)
            got = n > 0 && decision_well_formed(in, n) && in->error == 0 && in_list(in->d.members, in->d.nmembers, ctx->rank0);
        if (got) {
            rk__fault_point("join"); /* #0: brought in, the ring not built with it yet (G4) */
            rec_decision *dec = malloc(sizeof(*dec));
            if (!dec) {
                rc = -ENOMEM;
                break;
            }
            memcpy(dec, &in->d, (size_t)n - offsetof(struct msg_decide, d));
            int64_t t0 = rk__mono_ns();
            rc = apply_decision(ctx, dec, t0, rk__deadline_ns(ctx->opt.timeout_ms));
            free(dec);
            if (rc == RK_RECOVERED) {
                note_joined(ctx);
                RK_EVENT(ctx->ev, "spare_joined", RK_EV_I("epoch", ctx->agreed_epoch), RK_EV_I("rank", ctx->rank),
                         RK_EV_I("world", ctx->world), RK_EV_I("step", ctx->next_step));
                rc = 0;
                break;
            }
            if (rc != REC_AGAIN)
                break;
            continue; /* the ring could not be built: wait for the next decision */
        }
        if (det_fenced(ctx->det)) {
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_FENCED, "this spare was declared dead by the others");
            break;
        }
        rec_join_peers_poll(ctx);
        if (ctx->unasked_until_ns && det_unadmitted(ctx->det) && rk__deadline_passed(ctx->unasked_until_ns)) {
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_TIMEOUT, "this worker started to join the job was not asked "
                          "in within %d ms of its arrival: the members gave the join up (the job goes on without it)",
                          (REC_JOIN_WAIT + 1) * ctx->opt.timeout_ms);
            break;
        }
        det_view v;
        det_view_get(ctx->det, &v);
        bool any = false;
        for (int i = 0; i < ctx->nview && !any; i++)
            any = det_view_has(&v, ctx->view[i]);
        if (!any) {
            /* Rank 0 releases the spares before it leaves, but its leave (a datagram) can
               arrive before its release (an MPI message) is visible: listen a little more. */
            if (!gone_since)
                gone_since = rk__mono_ns();
            if (rk__ms_since(gone_since) < 2000.0) {
                rk__sleep_ns(1000000);
                continue;
            }
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_PEER_LOST,
                          "spare worker: every member of the job is gone");
            break;
        }
        rk__sleep_ns(1000000);
    }
    free(in);
    return rc;
}

void rec_release_spares(rk_ctx *ctx)
{
    static const char token[] = "release";
    for (int i = 0; i < ctx->nspares; i++)
        if (rec_msg_send(ctx, token, sizeof(token), ctx->spares[i], REC_TAG_RELEASE) != 0)
            RK_LOG_INFO(RK_SUB_REC, "could not tell spare %d it is not needed (gone?)", ctx->spares[i]);
    rec_msgs_settle(ctx, rk__deadline_ns(1000)); /* all at once, one bound */
}

/* ---- growth in place (G1, G2) ------------------------------------------------------------ */

bool rec_grow_admit(rk_ctx *ctx, int slot)
{
    if (!ctx->admit || slot < 0 || slot >= ctx->nslots || !in_list(ctx->spares, ctx->nspares, slot))
        return false; /* brought in already (a late event), or no spare at all */
    ctx->admit[slot] = true;
    return true;
}

/* The launcher's grow file, read whole into buf (NUL-terminated): its length, 0 when there
   is none. The file is the launcher's, in a directory of the job's user: one that is not
   this user's own regular file, or that others may write, is refused (said once), never a
   link followed. */
int rec_grow_read(rk_ctx *ctx, char *buf, size_t cap)
{
    bool *warned = &ctx->grow_file_refused;
    struct stat st;
    int fd = ctx->grow_file ? open(ctx->grow_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) : -1;
    if (fd < 0) {
        if (ctx->grow_file && errno == ELOOP && !*warned)
            RK_LOG_WARN(RK_SUB_REC, "%s is a symbolic link: not followed, no growth asked", ctx->grow_file);
        *warned |= errno == ELOOP;
        return 0;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
        if (!*warned)
            RK_LOG_WARN(RK_SUB_REC, "%s refused: not a regular file of this user (uid %ld) that only it may write: no "
                        "growth asked", ctx->grow_file, (long)geteuid());
        *warned = true;
        close(fd);
        return 0;
    }
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return n > 0 ? (int)n : 0;
}

int rec_grow_world(const char *text)
{
    char *end = NULL;
    long w = strtol(text, &end, 10);
    return end != text && (*end == '\0' || *end == '\n') && w > 0 && w <= REC_MAX_WORLD ? (int)w : 0;
}

void rec_grow_poll(rk_ctx *ctx)
{
    if (!ctx->grow_file || ctx->nspares == 0 || ctx->is_spare || ctx->rank != 0 || !ctx->det)
        return;
    int64_t now = rk__mono_ns();
    if (now < ctx->grow_poll_ns)
        return;
    ctx->grow_poll_ns = now + REC_GROW_POLL_NS;
    char buf[32];
    int want = rec_grow_read(ctx, buf, sizeof(buf)) > 0 ? rec_grow_world(buf) : 0;
    det_view v;
    det_view_get(ctx->det, &v);
    int more = want - ctx->world - asked_waiting(ctx, &v);
    for (int i = 0; i < ctx->nspares && more > 0; i++) {
        int s = ctx->spares[i];
        if (ctx->admit[s] || !det_view_has(&v, s))
            continue;
        int rc = det_admit(ctx->det, s);
        if (rc != 0) {
            RK_LOG_WARN(RK_SUB_REC, "growth to %d: asking spare %d to join failed: %s", want, s, rk_strerror(rc));
            return;
        }
        RK_LOG_INFO(RK_SUB_REC, "growth to %d asked (%s): spare %d to join the ring", want, ctx->grow_file, s);
        ctx->admit[s] = true; /* this detector's own ADMIT event follows */
        more--;
    }
}
