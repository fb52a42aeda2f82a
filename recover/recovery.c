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
 *   RUNNING --(a member declared dead: rec_membership_changed)--> FENCE
 *   FENCE   --(the ring call returned; no request can write user memory)--> AGREE (rec_recover)
 *   AGREE   --(coordinator: reports gathered, rec_decide: coordinate)--> REBUILD
 *   AGREE   --(member: decision received: follow)--> REBUILD
 *   AGREE   --(coordinator dead, or the view changed again: AGAIN)--> AGREE, next round
 *   AGREE   --(RK_E_NO_MAJORITY / RK_E_MIN_WORLD / RK_E_TIMEOUT)--> STOPPED (error returned)
 *   REBUILD --(ring_rebuild over the members: apply_decision)--> ROLLBACK
 *   REBUILD --(a member died meanwhile: AGAIN)--> AGREE, next round, same base view
 *   ROLLBACK --(rec_ckpt_rollback: memory or disk)--> RESUME
 *   RESUME  --(events ring_rebuilt, resumed; RK_RECOVERED)--> RUNNING
 *   any     --(this worker declared dead, or left out of the decision)--> FENCED
 *
 * INVARIANTS (besides rec_decide's I1..I6, see coord.c)
 *   R1 Messages travel point-to-point on ctx->comm between survivors only; a worker only
 *      ever waits for a message while polling the detector and a deadline.
 *   R2 Every message carries the base epoch (the last agreed view's); a message of
 *      another base is stale and dropped, so rounds of different recoveries never mix.
 *   R3 A decision is applied only from the coordinator of the receiver's current round,
 *      and becomes the new base only once the ring over its members is built.
 *   R4 The coordinator of a round is the lowest rank of the base view that the
 *      receiver's detector still holds alive.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "../detector/det.h"
#include "../ring/ring.h"
#include "rec.h"
#include "rec_internal.h"

#define REC_TAG_REPORT 0x5e01
#define REC_TAG_DECIDE 0x5e02
#define REC_TAG_RELEASE 0x5e03
#define REC_MAGIC 0x524b5231u /* "RKR1" */
#define REC_AGAIN 2 /* internal: start the next round (distinct from RK_OK and RK_RECOVERED) */
#define POLL_NS (200 * 1000)  /* between polls of MPI and the detector */

struct msg_report {
    uint32_t magic;
    uint32_t pad;
    uint64_t base_epoch;
    rec_report r;
};

struct msg_decide {
    uint32_t magic;
    int32_t error; /* 0, or the error every member stops with (no majority, min_world) */
    uint64_t base_epoch;
    rec_decision d; /* only the first nmembers entries of d.members are sent */
};

static size_t decide_bytes(int nmembers)
{
    return offsetof(struct msg_decide, d.members) + (size_t)nmembers * sizeof(int);
}

/* Whether n received bytes are a well-formed decision message: the magic, and for a
   decision (not an error) a member list whose length matches the size. */
static bool decision_well_formed(const struct msg_decide *m, int n)
{
    if ((size_t)n < decide_bytes(0) || m->magic != REC_MAGIC)
        return false;
    return m->error != 0 ||
           (m->d.nmembers > 0 && m->d.nmembers <= REC_MAX_WORLD && (size_t)n == decide_bytes(m->d.nmembers));
}

static bool in_list(const int *a, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (a[i] == x)
            return true;
    return false;
}

/* ---- initial state and the cheap change test ------------------------------------------- */

int rec_recovery_init(rk_ctx *ctx)
{
    ctx->nview = ctx->world;
    ctx->view = calloc((size_t)ctx->nview, sizeof(int));
    if (!ctx->view)
        return -ENOMEM;
    for (int i = 0; i < ctx->nview; i++)
        ctx->view[i] = i;
    if (ctx->nspares > 0) {
        if (!(ctx->spares = calloc((size_t)ctx->nspares, sizeof(int))))
            return -ENOMEM;
        for (int i = 0; i < ctx->nspares; i++)
            ctx->spares[i] = ctx->world + i;
    }
    if (ctx->det) {
        det_view v;
        det_view_get(ctx->det, &v);
        ctx->agreed_epoch = v.epoch;
        ctx->seen_seq = det_seq(ctx->det);
    }
    return 0;
}

void rec_recovery_fini(rk_ctx *ctx)
{
    free(ctx->view);
    ctx->view = NULL;
    ctx->nview = 0;
    free(ctx->spares);
    ctx->spares = NULL;
    ctx->nspares = 0;
    free(ctx->send_buf);
    ctx->send_buf = NULL;
}

/* A member of the agreed view declared dead, or this worker fenced, since the last
   agreement. A clean leave (a peer that finished and called rk_finalize) is not one: a
   member that completed a collective may leave before its peers have received what it
   already sent, and they must be allowed to finish. */
bool rec_membership_changed(rk_ctx *ctx)
{
    if (!ctx->det)
        return false;
    uint64_t s = det_seq(ctx->det);
    if (s == ctx->seen_seq)
        return ctx->change_pending;
    ctx->seen_seq = s;
    det_event ev;
    uint64_t lost = 0;
    while (det_next_event(ctx->det, &ev, &lost) == 1) {
        if (ev.kind == DET_EV_FENCED)
            ctx->change_pending = true;
        else if (ev.kind == DET_EV_DEAD && in_list(ctx->view, ctx->nview, ev.peer))
            ctx->change_pending = true;
    }
    if (lost) { /* events were dropped: judge by the view alone */
        det_view v;
        det_view_get(ctx->det, &v);
        for (int i = 0; i < ctx->nview; i++)
            ctx->change_pending |= !det_view_has(&v, ctx->view[i]);
    }
    ctx->change_pending |= det_fenced(ctx->det);
    return ctx->change_pending;
}

bool rec_ring_changed(void *arg)
{
    return rec_membership_changed(arg);
}

/* ---- messages --------------------------------------------------------------------------- */

/* Sends len bytes to dst without ever blocking on a dead peer: the copy stays in
   ctx->send_buf (one pending send at a time is enough: each round sends one report, or
   one decision per member from a buffer of its own below). */
static int post_send(rk_ctx *ctx, const void *msg, size_t len, int dst, int tag, int64_t deadline)
{
    MPI_Request rq;
    int rc = MPI_Isend(msg, (int)len, MPI_BYTE, dst, tag, ctx->comm, &rq);
    if (rc != MPI_SUCCESS)
        return REC_AGAIN; /* the peer is gone: the detector will say so */
    int done = 0;
    while (!done && !rk__deadline_passed(deadline)) {
        if (MPI_Test(&rq, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return REC_AGAIN;
        if (!done)
            rk__sleep_ns(POLL_NS);
    }
    if (!done) {
        /* The message buffer must outlive the request: it is ctx-owned and leaked on
           purpose (bounded: one per abandoned send), never reused while MPI holds it. */
        MPI_Request_free(&rq);
        return REC_AGAIN;
    }
    return 0;
}

/* Receives one pending message of `tag` from anyone into buf (cap bytes); returns its
   length and *src, or 0 if none is pending. Oversized messages are drained and dropped. */
static int try_recv(rk_ctx *ctx, int tag, void *buf, size_t cap, int *src)
{
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, ctx->comm, &flag, &st) != MPI_SUCCESS || !flag)
        return 0;
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    char *tmp = buf;
    bool drop = count < 0 || (size_t)count > cap;
    if (drop && !(tmp = malloc(count > 0 ? (size_t)count : 1)))
        return 0;
    MPI_Recv(tmp, count, MPI_BYTE, st.MPI_SOURCE, tag, ctx->comm, MPI_STATUS_IGNORE);
    if (drop) {
        free(tmp);
        return 0;
    }
    *src = st.MPI_SOURCE;
    return count;
}

/* Drops every stale message of `tag` (R2): those of another base epoch. */
static void drain_stale(rk_ctx *ctx, int tag)
{
    struct msg_decide m;
    int src;
    while (try_recv(ctx, tag, &m, sizeof(m), &src) > 0)
        RK_LOG_DEBUG(RK_SUB_REC, "dropped a stale message (tag %#x) from rank %d", tag, src);
}

/* ---- one round ------------------------------------------------------------------------- */

static void my_report(rk_ctx *ctx, const det_view *v, rec_report *r)
{
    r->rank0 = ctx->rank0;
    r->epoch = v->epoch;
    r->next_step = ctx->next_step;
    /* RK_ROLLBACK=disk: offer no snapshot, so the decision restores from disk. */
    r->held_step = strcmp(ctx->opt.rollback, "disk") == 0 ? -1 : rec_ckpt_held_step(ctx);
    r->committed_step = rec_ckpt_committed_step(ctx);
}

/* After the decision rule: live spares take the places of lost members (up to the size of
   the previous view). Spares have the highest ranks at start, so the list stays ascending. */
static void add_spares(rk_ctx *ctx, rec_decision *dec)
{
    det_view v;
    det_view_get(ctx->det, &v);
    for (int i = 0; i < ctx->nspares && dec->nmembers < ctx->nview && dec->nmembers < REC_MAX_WORLD; i++) {
        if (!det_view_has(&v, ctx->spares[i]))
            continue; /* a spare that died while waiting */
        dec->members[dec->nmembers++] = ctx->spares[i];
        dec->all_hold = 0; /* a spare holds no snapshot: it receives the root's */
    }
}

/* The coordinator: gathers a report from every member of `alive`, decides, tells them. */
static int coordinate(rk_ctx *ctx, int *alive, int nalive, const rec_report *mine, int64_t deadline,
                      rec_decision *dec, int *dec_error)
{
    rec_report *rep = calloc((size_t)nalive, sizeof(*rep));
    bool *got = calloc((size_t)nalive, sizeof(*got));
    int rc = 0;
    if (!rep || !got) {
        rc = -ENOMEM;
        goto out_free;
    }
    for (int i = 0; i < nalive; i++)
        if (alive[i] == ctx->rank0) {
            rep[i] = *mine;
            got[i] = true;
        }
    uint64_t max_epoch = mine->epoch;
    for (;;) {
        struct msg_report m;
        int src, n;
        while ((n = try_recv(ctx, REC_TAG_REPORT, &m, sizeof(m), &src)) > 0) {
            if ((size_t)n != sizeof(m) || m.magic != REC_MAGIC || m.base_epoch != ctx->agreed_epoch ||
                m.r.rank0 != src)
                continue; /* R2: stale or malformed */
            for (int i = 0; i < nalive; i++)
                if (alive[i] == src) {
                    rep[i] = m.r;
                    got[i] = true;
                }
        }
        drain_stale(ctx, REC_TAG_DECIDE);
        if (det_fenced(ctx->det)) {
            rc = RK_E_FENCED;
            goto out_free;
        }
        /* Members the detector declared dead meanwhile are no longer waited for. */
        det_view v;
        det_view_get(ctx->det, &v);
        int missing = 0;
        for (int i = 0; i < nalive; i++) {
            if (!got[i] && !det_view_has(&v, alive[i])) {
                alive[i] = alive[--nalive];
                got[i] = got[nalive];
                rep[i] = rep[nalive];
                i--;
                continue;
            }
            missing += !got[i];
        }
        if (v.epoch > max_epoch)
            max_epoch = v.epoch;
        if (missing == 0)
            break;
        if (rk__deadline_passed(deadline)) {
            RK_LOG_WARN(RK_SUB_REC, "recovery: %d member(s) alive but silent past the deadline: left out", missing);
            break;
        }
        rk__sleep_ns(POLL_NS);
    }
    int nrep = 0;
    for (int i = 0; i < nalive; i++)
        if (got[i]) {
            rep[nrep++] = rep[i];
            if (rep[i].epoch > max_epoch)
                max_epoch = rep[i].epoch;
        }
    *dec_error = rec_decide(ctx->view, ctx->nview, rep, nrep, ctx->opt.min_world, max_epoch + 1, dec);
    if (*dec_error == -EINVAL) {
        rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_INTERNAL, "recovery: malformed reports");
        goto out_free;
    }
    if (*dec_error == 0)
        add_spares(ctx, dec);

    /* Tell every member of the new ring (spares included), or every reporter the error
       they all stop with. */
    size_t len = decide_bytes(*dec_error ? 0 : dec->nmembers);
    int nto = *dec_error ? nrep : dec->nmembers;
    for (int i = 0; i < nto; i++) {
        int to = *dec_error ? rep[i].rank0 : dec->members[i];
        if (to == ctx->rank0)
            continue;
        struct msg_decide *m = malloc(sizeof(*m));
        if (!m) {
            rc = -ENOMEM;
            goto out_free;
        }
        m->magic = REC_MAGIC;
        m->error = *dec_error;
        m->base_epoch = ctx->agreed_epoch;
        memcpy(&m->d, dec, offsetof(rec_decision, members) + (size_t)dec->nmembers * sizeof(int));
        if (post_send(ctx, m, len, to, REC_TAG_DECIDE, rk__deadline_ns(1000)) == 0)
            free(m);
        /* else: m stays with MPI (see post_send) */
    }
out_free:
    free(rep);
    free(got);
    return rc;
}

/* A member: reports to the coordinator, waits for its decision (R3). */
static int follow(rk_ctx *ctx, int coord, const rec_report *mine, int64_t deadline, rec_decision *dec,
                  int *dec_error)
{
    struct msg_report *m = ctx->send_buf;
    if (!m && !(m = ctx->send_buf = malloc(sizeof(*m))))
        return -ENOMEM;
    m->magic = REC_MAGIC;
    m->pad = 0;
    m->base_epoch = ctx->agreed_epoch;
    m->r = *mine;
    if (post_send(ctx, m, sizeof(*m), coord, REC_TAG_REPORT, rk__deadline_ns(1000)) != 0) {
        ctx->send_buf = NULL; /* held by MPI now */
        return REC_AGAIN;
    }
    struct msg_decide *in = malloc(sizeof(*in));
    if (!in)
        return -ENOMEM;
    int rc;
    for (;;) {
        int src, n;
        while ((n = try_recv(ctx, REC_TAG_DECIDE, in, sizeof(*in), &src)) > 0) {
            if (!decision_well_formed(in, n) || in->base_epoch != ctx->agreed_epoch || src != coord)
                continue; /* malformed, R2, R3 */
            *dec_error = in->error;
            memcpy(dec, &in->d, (size_t)n - offsetof(struct msg_decide, d));
            rc = 0;
            goto out;
        }
        drain_stale(ctx, REC_TAG_REPORT);
        if (det_fenced(ctx->det)) {
            rc = RK_E_FENCED;
            goto out;
        }
        det_view v;
        det_view_get(ctx->det, &v);
        if (!det_view_has(&v, coord)) {
            rc = REC_AGAIN; /* R4: the next lowest takes over */
            goto out;
        }
        if (rk__deadline_passed(deadline)) {
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_TIMEOUT,
                          "recovery: no decision from coordinator rank %d within %d ms", coord, ctx->opt.timeout_ms);
            goto out;
        }
        rk__sleep_ns(POLL_NS);
    }
out:
    free(in);
    return rc;
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
        if (w->dec->members[i] < w->ctx->world0 && !det_view_has(&v, w->dec->members[i]))
            return true;
    return false;
}

static const char *source_name(int s)
{
    return s == REC_FROM_MEMORY ? "memory" : s == REC_FROM_DISK ? "disk" : "none";
}

/* REBUILD, ROLLBACK, RESUME. */
static int apply_decision(rk_ctx *ctx, const rec_decision *dec, int64_t t0, int64_t deadline)
{
    if (!in_list(dec->members, dec->nmembers, ctx->rank0))
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_FENCED,
                        "recovery: the survivors continued without this worker: fenced");
    struct rebuild_watch w = {ctx, dec};
    ring_cancel cancel = {.deadline_ns = deadline, .changed = rebuild_changed, .arg = &w};
    int rc = ring_rebuild(ctx->ring, dec->members, dec->nmembers, dec->epoch, &cancel);
    if (rc == RK_E_PEER_LOST || rc == RK_E_TIMEOUT) {
        RK_LOG_WARN(RK_SUB_REC, "recovery: ring rebuild at epoch %llu interrupted (%s): next round",
                    (unsigned long long)dec->epoch, rk_strerror(rc));
        return REC_AGAIN;
    }
    if (rc != 0)
        return rc;
    /* R3: the decision is the new base. */
    int *view = malloc((size_t)dec->nmembers * sizeof(int));
    if (!view)
        return -ENOMEM;
    memcpy(view, dec->members, (size_t)dec->nmembers * sizeof(int));
    free(ctx->view);
    ctx->view = view;
    ctx->nview = dec->nmembers;
    ctx->agreed_epoch = dec->epoch;
    ctx->is_spare = false;
    int kept = 0; /* spares brought in leave the list of spares */
    for (int i = 0; i < ctx->nspares; i++)
        if (!in_list(dec->members, dec->nmembers, ctx->spares[i]))
            ctx->spares[kept++] = ctx->spares[i];
    ctx->nspares = kept;
    det_view nv;
    det_view_get(ctx->det, &nv);
    nv.epoch = dec->epoch;
    memset(nv.members, 0, sizeof(nv.members));
    nv.nmembers = 0;
    /* The detector keeps watching the spares still waiting: a removal would be final. */
    for (int i = 0; i < dec->nmembers + ctx->nspares; i++) {
        int r = i < dec->nmembers ? dec->members[i] : ctx->spares[i - dec->nmembers];
        nv.members[r / 64] |= 1ull << (r % 64);
        nv.nmembers++;
    }
    int irc = det_install_view(ctx->det, &nv);
    if (irc == RK_E_FENCED)
        return irc;
    if (irc != 0) /* the view moved on meanwhile: the next call recovers again */
        RK_LOG_INFO(RK_SUB_REC, "recovery: detector view moved past epoch %llu", (unsigned long long)dec->epoch);
    /* Deaths the detector declared meanwhile are still queued: the next check sees them. */
    ctx->seen_seq = 0;
    ctx->change_pending = false;
    ctx->rank = ring_rank(ctx->ring);
    ctx->world = ring_size(ctx->ring);
    RK_EVENT(ctx->ev, "ring_rebuilt", RK_EV_I("epoch", dec->epoch), RK_EV_I("world", ctx->world),
             RK_EV_D("ms", rk__ms_since(t0)));

    rc = rec_ckpt_rollback(ctx, dec); /* sets ctx->next_step */
    if (rc == RK_E_PEER_LOST || rc == RK_E_TIMEOUT)
        return REC_AGAIN; /* another member died during the rollback: a new round */
    if (rc != 0)
        return rc;
    RK_EVENT(ctx->ev, "resumed", RK_EV_I("step", ctx->next_step), RK_EV_S("from", source_name(dec->source)),
             RK_EV_I("epoch", dec->epoch), RK_EV_I("steps_lost", dec->steps_lost), RK_EV_D("ms", rk__ms_since(t0)));
    RK_LOG_INFO(RK_SUB_REC, "recovered in %.1f ms: epoch %llu, world %d, resuming step %lld from %s (%lld steps lost)",
                rk__ms_since(t0), (unsigned long long)dec->epoch, ctx->world, (long long)ctx->next_step,
                source_name(dec->source), (long long)dec->steps_lost);
    return RK_RECOVERED;
}

static int recover_rounds(rk_ctx *ctx);

int rec_recover(rk_ctx *ctx)
{
    int rc = recover_rounds(ctx);
    if (rc < 0)
        rec_ckpt_abandon(ctx); /* stopped: never wait for the lost member's shard */
    return rc;
}

static int recover_rounds(rk_ctx *ctx)
{
    if (!ctx->det || !ctx->ring)
        return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_PEER_LOST,
                        "a member was lost and recovery needs the detector and the ring");
    int64_t t0 = rk__mono_ns();
    int64_t deadline = rk__deadline_ns(2LL * ctx->opt.timeout_ms);
    RK_LOG_INFO(RK_SUB_REC, "membership changed: recovering from base epoch %llu",
                (unsigned long long)ctx->agreed_epoch);
    for (int round = 0;; round++) {
        if (det_fenced(ctx->det))
            return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_FENCED, "this worker was declared dead by the others");
        if (rk__deadline_passed(deadline))
            return rk__fail(RK_SUB_REC, RK_LOG_ERROR, RK_E_TIMEOUT, "recovery did not finish within %d ms",
                            2 * ctx->opt.timeout_ms);
        det_view v;
        det_view_get(ctx->det, &v);
        int *alive = malloc((size_t)ctx->nview * sizeof(int));
        if (!alive)
            return -ENOMEM;
        int nalive = 0;
        for (int i = 0; i < ctx->nview; i++)
            if (det_view_has(&v, ctx->view[i]) || ctx->view[i] == ctx->rank0)
                alive[nalive++] = ctx->view[i];
        int coord = alive[0]; /* R4: the base view is ascending */
        rec_report mine;
        my_report(ctx, &v, &mine);
        rec_decision *dec = malloc(sizeof(*dec));
        int dec_error = 0, rc;
        if (!dec) {
            free(alive);
            return -ENOMEM;
        }
        int64_t round_deadline = rk__deadline_ns(ctx->opt.timeout_ms);
        if (round_deadline > deadline)
            round_deadline = deadline;
        RK_LOG_DEBUG(RK_SUB_REC, "recovery round %d: coordinator rank %d, %d alive of %d", round, coord, nalive,
                     ctx->nview);
        if (coord == ctx->rank0)
            rc = coordinate(ctx, alive, nalive, &mine, round_deadline, dec, &dec_error);
        else
            rc = follow(ctx, coord, &mine, round_deadline, dec, &dec_error);
        free(alive);
        if (rc == 0 && dec_error != 0)
            rc = rk__fail(RK_SUB_REC, RK_LOG_ERROR, dec_error, "recovery stopped: %s (checkpoints are intact)",
                          rk_strerror(dec_error));
        if (rc == 0)
            rc = apply_decision(ctx, dec, t0, deadline);
        free(dec);
        if (rc != REC_AGAIN)
            return rc;
    }
}

/* ---- spares ------------------------------------------------------------------------------ */

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
        if (try_recv(ctx, REC_TAG_RELEASE, token, sizeof(token), &src) > 0) {
            rk__set_last_error("the job finished without needing this spare worker");
            rc = RK_E_SPARE_UNUSED;
            break;
        }
        /* A decision naming this spare, from whichever member coordinates (R2 does not
           apply: a spare takes no part in rounds, so it has no base epoch to match). */
        bool got = false;
        while (!got && (n = try_recv(ctx, REC_TAG_DECIDE, in, sizeof(*in), &src)) > 0)
            got = decision_well_formed(in, n) && in->error == 0 && in_list(in->d.members, in->d.nmembers, ctx->rank0);
        if (got) {
            rec_decision *dec = malloc(sizeof(*dec));
            if (!dec) {
                rc = -ENOMEM;
                break;
            }
            memcpy(dec, &in->d, (size_t)n - offsetof(struct msg_decide, d));
            int64_t t0 = rk__mono_ns();
            rc = apply_decision(ctx, dec, t0, rk__deadline_ns(2LL * ctx->opt.timeout_ms));
            free(dec);
            if (rc == RK_RECOVERED) {
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
        if (post_send(ctx, token, sizeof(token), ctx->spares[i], REC_TAG_RELEASE, rk__deadline_ns(1000)) != 0)
            RK_LOG_INFO(RK_SUB_REC, "could not tell spare %d it is not needed (gone?)", ctx->spares[i]);
}
