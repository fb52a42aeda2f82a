/*
 * detector/det_proto.c - the failure detector's protocol, as a pure state machine.
 *
 * PURPOSE
 *   Decide, from authenticated messages and the passage of time, which workers are alive,
 *   and keep every live member's view of the membership (epoch, member set) identical.
 *   No sockets, no clocks, no threads here: the caller passes "now" (ns, monotonic) and
 *   each message received, and takes out the messages to send (detp_pop_send) and the
 *   events (detp_pop_event). det.c wraps it in an I/O thread; the tests drive it with a
 *   simulated clock and network.
 *
 * TOPOLOGY
 *   Members are ordered by rank at start on a ring. Each member sends a heartbeat (HB)
 *   every period p to its k ring successors (k = min(3, members - 1)), so it is observed
 *   by k members and sends k heartbeats per period whatever the job size.
 *
 * INVARIANTS
 *   I1  A member observes exactly its k ring predecessors in its current view and sends
 *       heartbeats to exactly its k successors (det_ring_recompute after every change).
 *   I2  An observed peer is declared dead for its silence only after a silence of at least
 *       its timeout T = clamp(mean + 8 dev of its heartbeat inter-arrivals, 3p, 10p) (a peer never
 *       heard yet: max(10p, 1 s)), and only after probes were asked of other members
 *       (PING direct + PING_REQ to helpers at T - p) and it was suspect (at T - p/2).
 *   I3  Any authentic sign of life from a peer (heartbeat, ACK, ALIVE with a newer
 *       incarnation, an ACK relayed by a helper) before T ends its probe or suspicion; a
 *       suspect that learns it is suspected refutes with a higher incarnation.
 *   I4  Membership only shrinks through declarations (dead or left), which are final: a
 *       rank out of the view never comes back under the same rank (spares enter only by
 *       detp_install_view). Each change bumps the epoch by one, so two members that
 *       applied the same set of declarations have the same view, in any order.
 *   I5  A declaration reaches every live member: the declarer sends it to every member,
 *       and every member piggybacks each declaration it knows on its messages to each
 *       peer until that peer acknowledges it (DECL_ACK).
 *   I6  A member that learns it was declared dead is fenced: it emits FENCED once, then
 *       sends nothing and acts on nothing. A member hearing from a rank it holds dead
 *       tells it so (at most once per period), so a resumed worker fences itself.
 *   I7  Messages from ranks outside the view are never acted on.
 *   I8  A member that was not run for longer than 2p (its own stall) restarts its
 *       silence clocks instead of blaming its peers for its own pause.
 *   I9  A member's death reported by its parent (DEATH: the wrapper saw the process exit
 *       or be killed; authenticated like any datagram, det_wire.c) is a fact, not a
 *       suspicion: every member that gets it declares the member dead at once, without
 *       probes (the one exception to I2), and the declaration says how it was learned
 *       (DETM_DECL_PARENT), so every member's event says "via parent". A stopped process
 *       is never reported (the parent reports only an end), so hangs, lost hosts and
 *       partitions go through I2 exactly as before; whichever way comes first declares,
 *       the other then finds the rank out (I4) and does nothing.
 *   I11 A request that a spare join the members as an additional one (growth in place,
 *       detp_admit) travels as a declaration (DETM_DECL_ADMIT, disseminated and
 *       acknowledged as I5's) that changes no member set: every member that applies it
 *       bumps the epoch once and emits ADMIT, so the training threads of all members learn
 *       it as they learn a death, and recovery (recover/recovery.c) agrees on the ring
 *       with the spare in it. A spare is asked at most once per life of the detector; the
 *       declaration of a rank out of the view, or of one asked already, does nothing.
 *   I12 A worker started while the job runs (recover/join.c) joins at a slot no process
 *       ever held (NONMEMBER): the members learn its address first (det_set_addr), then the
 *       same ADMIT declaration as I11 also makes it a member of every view that applies it
 *       (one epoch bump, the member set grown by one) and starts its observation; the
 *       declarations it does not know are piggybacked to it: those that brought this
 *       member past the epoch of the view it was given (detp_cfg.view0, made by the
 *       members; detp_joiner_knows), so that joiners given one view learn each other's
 *       ADMIT and any death since; where that epoch is not known, the ADMIT and later. A
 *       slot out by a declaration (DEAD) never comes back (I4); a view installed by a
 *       recovery leaves the slots no process held as they are (NONMEMBER), so a worker
 *       can join after a loss as before it. The joiner observes no one until its own
 *       ADMIT reaches it (the members send it nothing before: they have not admitted it),
 *       and from then on each member's silence counts from that moment: a joiner that
 *       counted from its start declared every member dead once their admission took more
 *       than its silence bound (members that train in steps of 0.8 s: the declarations
 *       then reached them with the ADMIT and fenced a healthy member).
 *   I10 A fenced member's next deadline is always ahead of the last tick: detp_tick moves
 *       it a period on and detp_next_deadline no longer counts the peers' silence (their
 *       clocks stopped at the fencing), so det.c's thread sleeps a period a turn, draining
 *       its socket, for as long as the detector lives (a deadline left in the past would
 *       make it poll with no timeout: a core, at real-time priority, taken from the
 *       node's other workers).
 *
 * STATES of a peer, as seen by an observer (function performing each transition)
 *
 *      install / ring change           silence >= T-p              silence >= T-p/2
 *   ------------------------> ALIVE ---------------------> PROBING ------------------> SUSPECT
 *                               ^   detp_tick:probe_start    |      detp_tick:suspect     |
 *                               |                            |                            |
 *                               +---- sign of life ----------+----------------------------+
 *                               |     detp_recv:heard (REFUTED event from SUSPECT)         |
 *                               |                                         silence >= T     |
 *                               |                                  detp_tick:declare       v
 *    NONMEMBER <-- install_view |                DEAD <------------------------------------+
 *    (spare)   --> install_view-+                 ^  decl received: apply_decl (any state)
 *                                                 |  DEATH from its parent: detp_recv:declare
 *                                       LEAVE / left decl: apply_decl (LEFT, also out)
 *
 *   Self: MEMBER --(a declaration of self received: apply_decl)--> FENCED (final;
 *   detp_tick then only moves the deadline a period on, I10).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "det_internal.h"

#define LEFT_MARK 0xffffffffu /* detm_decl.silence_ms of a clean leave */

struct peer {
    int state;               /* DETP_* */
    bool left;               /* out by LEAVE rather than declared dead */
    bool observed;           /* one of my k predecessors */
    int64_t last_heard;      /* any sign of life, or when observation started */
    int64_t last_hb;         /* last heartbeat (inter-arrival samples) */
    int64_t mean_ns, dev_ns; /* EWMA of inter-arrival and of its deviation */
    int nsamples;
    uint32_t inc;            /* highest incarnation known */
    uint64_t probe_nonce;
    int64_t last_notice;     /* last "you are dead" sent to it */
    int ack_idx;             /* log entries [0, ack_idx) known delivered to it */
    bool admit;              /* asked to join the ring as an additional member (I11) */
    bool knows;              /* a joiner whose view's epoch is known (I12): knows_epoch */
    uint64_t knows_epoch;
};

struct vec {
    void *a;
    size_t n, head, cap, elem;
};

struct detp {
    detp_cfg cfg;
    int64_t p;               /* period, ns */
    struct peer *peers;      /* nslots */
    uint64_t epoch;
    int nmembers;
    uint32_t inc;            /* own incarnation */
    bool fenced, leaving;
    bool unadmitted;         /* I12: a joiner before its own ADMIT, observing no one */
    int64_t next_hb, last_tick;
    int succ[3], nsucc;      /* heartbeat targets */
    detm_decl *log;          /* declarations applied, in local order: each rank goes out
                                once and is asked to join once (I4, I11): 2 nslots at most */
    int nlog;
    uint64_t *log_epoch;     /* nlog: the epoch each declaration brought this member to */
    uint64_t rng;
    struct vec out, ev;
};

/* ---- small helpers -------------------------------------------------------------------- */

static bool vec_push(struct vec *v, const void *x)
{
    if (v->head > 0 && v->head == v->n) {
        v->head = v->n = 0;
    }
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        void *na = realloc(v->a, nc * v->elem);
        if (!na)
            return false;
        v->a = na;
        v->cap = nc;
    }
    memcpy((char *)v->a + v->n++ * v->elem, x, v->elem);
    return true;
}

static int vec_pop(struct vec *v, void *x)
{
    if (v->head == v->n) {
        v->head = v->n = 0;
        return 0;
    }
    memcpy(x, (char *)v->a + v->head++ * v->elem, v->elem);
    return 1;
}

static uint64_t next_rand(detp *p)
{
    uint64_t x = p->rng += 0x9e3779b97f4a7c15ull; /* splitmix64 */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static bool is_member(const detp *p, int r)
{
    return r >= 0 && r < p->cfg.nslots && p->peers[r].state < DETP_DEAD;
}

static void emit(detp *p, int kind, int peer, double after_ms, int via)
{
    det_event e = {.kind = kind, .peer = peer, .epoch = p->epoch, .after_ms = after_ms, .via = via};
    vec_push(&p->ev, &e);
}

static void msg_init(const detp *p, detm *m, int type, int dst)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->src = p->cfg.self;
    m->dst = dst;
    m->inc = p->inc;
    m->epoch = p->epoch;
    m->subject = m->origin = -1;
}

/* Queues m to m->dst with the declarations dst has not acknowledged yet (I5). */
static void send_msg(detp *p, detm *m)
{
    if (p->fenced)
        return;
    struct peer *d = &p->peers[m->dst];
    for (int i = d->ack_idx; i < p->nlog && m->ndecl < DETM_MAX_DECL; i++)
        m->decl[m->ndecl++] = p->log[i];
    vec_push(&p->out, m);
}

static void send_simple(detp *p, int type, int dst, int subject, int origin, uint64_t nonce)
{
    detm m;
    msg_init(p, &m, type, dst);
    m.subject = subject;
    m.origin = origin;
    m.nonce = nonce;
    send_msg(p, &m);
}

/* ---- ring (I1) ------------------------------------------------------------------------ */

static int ring_step(const detp *p, int from, int dir)
{
    int n = p->cfg.nslots;
    for (int i = 1; i < n; i++) {
        int r = ((from + dir * i) % n + n) % n;
        if (is_member(p, r))
            return r;
    }
    return -1;
}

static void ring_recompute(detp *p, int64_t now)
{
    int self = p->cfg.self, k = p->cfg.k;
    if (k > p->nmembers - 1)
        k = p->nmembers - 1;
    if (k > 3)
        k = 3;
    if (k < 0)
        k = 0;
    bool was[DET_MAX_SLOTS];
    for (int r = 0; r < p->cfg.nslots; r++) {
        was[r] = p->peers[r].observed;
        p->peers[r].observed = false;
    }
    p->nsucc = 0;
    for (int i = 0, r = self; i < k; i++) {
        r = ring_step(p, r, +1);
        p->succ[p->nsucc++] = r;
    }
    for (int i = 0, r = self; i < k; i++) {
        r = ring_step(p, r, -1);
        struct peer *q = &p->peers[r];
        q->observed = true;
        if (!was[r]) { /* a new observation starts from scratch */
            q->last_heard = now;
            q->nsamples = 0;
            if (q->state != DETP_ALIVE)
                q->state = DETP_ALIVE;
        }
    }
    for (int r = 0; r < p->cfg.nslots; r++)
        if (!p->peers[r].observed && (p->peers[r].state == DETP_PROBING || p->peers[r].state == DETP_SUSPECT))
            p->peers[r].state = DETP_ALIVE;
}

/* ---- timeouts (I2) -------------------------------------------------------------------- */

int64_t detp_timeout_ns(const detp *p, int r)
{
    if (r < 0 || r >= p->cfg.nslots || !p->peers[r].observed)
        return -1;
    const struct peer *q = &p->peers[r];
    int64_t per = p->p;
    if (q->nsamples == 0)
        return 10 * per > 1000000000LL ? 10 * per : 1000000000LL;
    int64_t t = q->mean_ns + 8 * q->dev_ns;
    if (t < 3 * per)
        t = 3 * per;
    if (t > 10 * per)
        t = 10 * per;
    return t;
}

static void sample_hb(detp *p, struct peer *q, int64_t now)
{
    if (q->nsamples > 0) {
        int64_t x = now - q->last_hb;
        if (q->nsamples == 1) {
            q->mean_ns = x;
            q->dev_ns = x > p->p ? x - p->p : p->p - x;
        } else {
            int64_t err = x - q->mean_ns;
            q->mean_ns += err / 8;
            q->dev_ns += ((err < 0 ? -err : err) - q->dev_ns) / 4;
        }
    }
    q->nsamples++;
    q->last_hb = now;
}


/* ---- membership (I4, I5, I6) ---------------------------------------------------------- */

/* Applies one declaration; true if it changed the view. */
static bool apply_decl(detp *p, const detm_decl *d, int64_t now)
{
    int r = (int)d->rank;
    if (d->silence_ms == DETM_DECL_ADMIT) { /* I11: news, not a change of the member set */
        if (r < 0 || r >= p->cfg.nslots || p->peers[r].state == DETP_DEAD || p->peers[r].admit)
            return false;
        bool joiner = p->peers[r].state == DETP_NONMEMBER; /* I12 */
        p->peers[r].admit = true;
        if (r == p->cfg.self && p->unadmitted) { /* I12: observation starts now */
            p->unadmitted = false;
            for (int i = 0; i < p->cfg.nslots; i++)
                p->peers[i].last_heard = now;
        }
        p->epoch++;
        p->log_epoch[p->nlog] = p->epoch;
        p->log[p->nlog++] = *d;
        if (joiner) {
            struct peer *q = &p->peers[r];
            q->state = DETP_ALIVE;
            p->nmembers++;
            /* I12: what it does not know is news: the declarations since the view it was
               given (the ADMITs of the others started with it among them), else this one */
            q->ack_idx = p->nlog - 1;
            while (q->knows && q->ack_idx > 0 && p->log_epoch[q->ack_idx - 1] > q->knows_epoch)
                q->ack_idx--;
            ring_recompute(p, now);
        }
        emit(p, DET_EV_ADMIT, r, 0, 0);
        return true;
    }
    bool left = d->silence_ms == LEFT_MARK, parent = !left && (d->silence_ms & DETM_DECL_PARENT);
    if (r == p->cfg.self) {
        if (!left && !p->fenced) { /* I6 */
            p->fenced = true;
            emit(p, DET_EV_FENCED, r, 0, 0);
        }
        return false;
    }
    if (!is_member(p, r))
        return false; /* already out (or a spare never installed): final either way */
    struct peer *q = &p->peers[r];
    q->state = DETP_DEAD;
    q->left = left;
    q->observed = false;
    p->nmembers--;
    p->epoch++;
    p->log_epoch[p->nlog] = p->epoch;
    p->log[p->nlog++] = *d; /* each rank goes out once: nlog < 2 nslots (I11) */
    ring_recompute(p, now);
    emit(p, left ? DET_EV_LEFT : DET_EV_DEAD, r, left ? 0 : (double)(d->silence_ms & ~DETM_DECL_PARENT),
         parent ? DET_VIA_PARENT : DET_VIA_SILENCE);
    return true;
}

/* The declarations just applied, to every member at once (I5). */
static void tell_all(detp *p)
{
    for (int j = 0; j < p->cfg.nslots; j++) {
        if (j != p->cfg.self && is_member(p, j)) {
            detm m;
            msg_init(p, &m, DETM_DECL, j);
            send_msg(p, &m);
        }
    }
}

/* This member declares r dead, for its silence or on its parent's report (I9), and tells
   every member directly (I5). */
static void declare(detp *p, int r, int64_t now, bool parent)
{
    /* the silence of a peer this member does not observe means nothing: 0 */
    int64_t silence = p->peers[r].observed ? now - p->peers[r].last_heard : 0;
    int64_t ms64 = silence / 1000000;
    uint32_t ms = ms64 < DETM_DECL_MAX_MS ? (uint32_t)ms64 : DETM_DECL_MAX_MS; /* never a mark */
    detm_decl d = {.rank = (uint32_t)r, .silence_ms = ms | (parent ? DETM_DECL_PARENT : 0)};
    if (apply_decl(p, &d, now))
        tell_all(p);
}

int detp_admit(detp *p, int r, int64_t now)
{
    if (p->fenced)
        return RK_E_FENCED;
    if (r < 0 || r >= p->cfg.nslots || r == p->cfg.self || p->peers[r].state == DETP_DEAD)
        return -EINVAL;
    detm_decl d = {.rank = (uint32_t)r, .silence_ms = DETM_DECL_ADMIT};
    if (apply_decl(p, &d, now))
        tell_all(p);
    return 0;
}

/* Tells a rank we hold dead that it is (I6), at most once per period. */
static void notify_dead(detp *p, int r, int64_t now)
{
    struct peer *q = &p->peers[r];
    if (q->left || (q->last_notice && now - q->last_notice < p->p))
        return;
    q->last_notice = now;
    for (int i = 0; i < p->nlog; i++) {
        if ((int)p->log[i].rank == r && p->log[i].silence_ms != DETM_DECL_ADMIT) {
            detm m;
            msg_init(p, &m, DETM_DECL, r);
            m.decl[m.ndecl++] = p->log[i];
            vec_push(&p->out, &m);
            return;
        }
    }
}

/* src acknowledged the declarations in m: advance its piggyback window (I5). */
static void got_ack(detp *p, const detm *m)
{
    struct peer *q = &p->peers[m->src];
    while (q->ack_idx < p->nlog) {
        bool acked = false;
        for (int i = 0; i < m->ndecl && !acked; i++)
            acked = m->decl[i].rank == p->log[q->ack_idx].rank &&
                    m->decl[i].silence_ms == p->log[q->ack_idx].silence_ms; /* a rank twice: I11 */
        if (!acked)
            break;
        q->ack_idx++;
    }
}

/* ---- receiving ------------------------------------------------------------------------ */

/* Any authentic packet from an observed peer is a sign of life (I3). */
static void heard(detp *p, int r, int64_t now)
{
    struct peer *q = &p->peers[r];
    q->last_heard = now;
    if (q->state == DETP_SUSPECT)
        emit(p, DET_EV_REFUTED, r, 0, 0);
    if (q->state == DETP_PROBING || q->state == DETP_SUSPECT)
        q->state = DETP_ALIVE;
}

void detp_recv(detp *p, const detm *m, int64_t now)
{
    int self = p->cfg.self, src = m->src;
    if (p->fenced || src == self || src < 0 || src >= p->cfg.nslots || m->dst != self)
        return;
    struct peer *q = &p->peers[src];
    if (m->type == DETM_DEATH) { /* I9: from src's parent, not from src */
        if (is_member(p, src))
            declare(p, src, now, true);
        return;
    }
    if (q->state == DETP_DEAD) { /* I6, I7 */
        notify_dead(p, src, now);
        return;
    }
    if (q->state == DETP_NONMEMBER)
        return; /* I7 */
    if (m->type != DETM_SUSPECT && m->inc > q->inc)
        q->inc = m->inc; /* SUSPECT carries the subject's incarnation, the others the sender's */
    if (q->observed && m->type != DETM_HB)
        heard(p, src, now); /* any authentic packet is a sign of life (I3) */

    /* Membership news first, acknowledged to the sender (I5). */
    if (m->ndecl > 0 && m->type != DETM_DECL_ACK) {
        for (int i = 0; i < m->ndecl && !p->fenced; i++)
            apply_decl(p, &m->decl[i], now);
        if (p->fenced)
            return;
        if (!is_member(p, src))
            return; /* the sender itself went out */
        detm a;
        msg_init(p, &a, DETM_DECL_ACK, src);
        a.ndecl = m->ndecl;
        memcpy(a.decl, m->decl, sizeof(a.decl[0]) * (size_t)m->ndecl);
        vec_push(&p->out, &a);
    }

    switch (m->type) {
    case DETM_HB:
        if (q->observed) {
            sample_hb(p, q, now);
            heard(p, src, now);
        }
        break;
    case DETM_PING:
        if (m->subject == self)
            send_simple(p, DETM_ACK, src, self, m->origin, m->nonce);
        break;
    case DETM_PING_REQ:
        if (is_member(p, m->subject) && m->subject != self && m->origin == src)
            send_simple(p, DETM_PING, m->subject, m->subject, src, m->nonce);
        break;
    case DETM_ACK:
        if (m->origin == self) {
            if (is_member(p, m->subject) && p->peers[m->subject].observed &&
                m->nonce == p->peers[m->subject].probe_nonce)
                heard(p, m->subject, now);
        } else if (m->subject == src && is_member(p, m->origin)) {
            send_simple(p, DETM_ACK, m->origin, src, m->origin, m->nonce); /* relay */
        }
        break;
    case DETM_SUSPECT:
        if (m->subject == self && m->inc >= p->inc) { /* refute (I3) */
            p->inc = m->inc + 1;
            detm a;
            msg_init(p, &a, DETM_ALIVE, src);
            a.subject = self;
            send_msg(p, &a);
        }
        break;
    case DETM_ALIVE: /* the refutation itself: heard() above (incarnation recorded) */
        break;
    case DETM_DECL_ACK:
        got_ack(p, m);
        break;
    case DETM_LEAVE: {
        detm_decl d = {.rank = (uint32_t)src, .silence_ms = LEFT_MARK};
        apply_decl(p, &d, now);
        break;
    }
    default:
        break;
    }
}

/* ---- timers ---------------------------------------------------------------------------- */

static void probe_start(detp *p, int r)
{
    struct peer *q = &p->peers[r];
    q->state = DETP_PROBING;
    q->probe_nonce = next_rand(p);
    send_simple(p, DETM_PING, r, r, p->cfg.self, q->probe_nonce);
    /* helpers: the members after r on the ring, i.e. r's other observers */
    int h = r;
    for (int n = 0; n < p->cfg.nhelpers;) {
        h = ring_step(p, h, +1);
        if (h < 0 || h == r)
            break;
        if (h == p->cfg.self)
            continue;
        send_simple(p, DETM_PING_REQ, h, r, p->cfg.self, q->probe_nonce);
        n++;
    }
}

static void suspect(detp *p, int r, int64_t now)
{
    struct peer *q = &p->peers[r];
    q->state = DETP_SUSPECT;
    emit(p, DET_EV_SUSPECT, r, (double)(now - q->last_heard) / 1e6, 0);
    detm m;
    msg_init(p, &m, DETM_SUSPECT, r);
    m.subject = r;
    m.inc = q->inc;
    send_msg(p, &m);
    send_simple(p, DETM_PING, r, r, p->cfg.self, q->probe_nonce);
}

void detp_tick(detp *p, int64_t now)
{
    if (p->fenced) { /* I10: nothing to time, but the deadline moves: the thread sleeps */
        p->next_hb = now + p->p;
        return;
    }
    int self = p->cfg.self;
    if (now - p->last_tick > 2 * p->p) { /* I8: we were not run; not the peers' fault */
        for (int r = 0; r < p->cfg.nslots; r++)
            if (p->peers[r].observed && now - p->peers[r].last_heard > p->p)
                p->peers[r].last_heard = now - p->p;
    }
    p->last_tick = now;
    if (now >= p->next_hb) {
        for (int i = 0; i < p->nsucc; i++) {
            detm m;
            msg_init(p, &m, DETM_HB, p->succ[i]);
            send_msg(p, &m);
        }
        p->next_hb = now + p->p;
    }
    for (int r = 0; r < p->cfg.nslots && !p->unadmitted; r++) {
        struct peer *q = &p->peers[r];
        if (!q->observed || r == self || !is_member(p, r))
            continue;
        int64_t t = detp_timeout_ns(p, r), silence = now - q->last_heard;
        if (silence >= t) {
            if (q->state == DETP_ALIVE) /* a long jump of time: still probe first (I2) */
                probe_start(p, r);
            if (q->state == DETP_PROBING)
                suspect(p, r, now);
            declare(p, r, now, false);
        } else if (silence >= t - p->p / 2) {
            if (q->state == DETP_ALIVE)
                probe_start(p, r);
            if (q->state == DETP_PROBING)
                suspect(p, r, now);
        } else if (silence >= t - p->p && q->state == DETP_ALIVE) {
            probe_start(p, r);
        }
    }
}

int64_t detp_next_deadline(const detp *p)
{
    int64_t d = p->next_hb;
    if (p->fenced || p->unadmitted)
        return d; /* I10: its peers' silence clocks are no longer run; I12: not yet run */
    for (int r = 0; r < p->cfg.nslots; r++) {
        const struct peer *q = &p->peers[r];
        if (!q->observed || !is_member(p, r))
            continue;
        int64_t t = detp_timeout_ns(p, r);
        int64_t at = q->last_heard + (q->state == DETP_ALIVE ? t - p->p
                                      : q->state == DETP_PROBING ? t - p->p / 2 : t);
        if (at < d)
            d = at;
    }
    return d;
}

/* ---- life cycle and outputs ------------------------------------------------------------ */

int detp_create(detp **out, const detp_cfg *cfg, int64_t now)
{
    *out = NULL;
    if (!cfg || cfg->world < 1 || cfg->nslots < cfg->world || cfg->nslots > DET_MAX_SLOTS ||
        cfg->self < 0 || cfg->self >= cfg->world || cfg->period_ns <= 0 || cfg->k < 0)
        return -EINVAL;
    detp *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->peers = calloc((size_t)cfg->nslots, sizeof(*p->peers));
    p->log = calloc(2 * (size_t)cfg->nslots, sizeof(*p->log));
    p->log_epoch = calloc(2 * (size_t)cfg->nslots, sizeof(*p->log_epoch));
    if (!p->peers || !p->log || !p->log_epoch) {
        detp_destroy(&p);
        return -ENOMEM;
    }
    p->cfg = *cfg;
    p->p = cfg->period_ns;
    p->rng = cfg->seed ^ ((uint64_t)cfg->self << 32);
    p->out.elem = sizeof(detm);
    p->ev.elem = sizeof(det_event);
    p->nmembers = 0;
    for (int r = 0; r < cfg->nslots; r++) {
        bool in = cfg->view0 ? det_view_has(cfg->view0, r) : r < cfg->world;
        p->peers[r].state = in ? DETP_ALIVE : DETP_NONMEMBER;
        p->nmembers += in;
    }
    p->cfg.view0 = NULL; /* the caller's; read here only */
    if (cfg->view0) { /* I12: a joiner starts from the view it was given */
        p->epoch = cfg->view0->epoch;
        p->unadmitted = true;
        if (cfg->view0->nslots != cfg->nslots || !det_view_has(cfg->view0, cfg->self)) {
            detp_destroy(&p);
            return -EINVAL;
        }
    }
    p->next_hb = now;
    p->last_tick = now;
    ring_recompute(p, now);
    *out = p;
    return 0;
}

void detp_destroy(detp **pp)
{
    if (!pp || !*pp)
        return;
    detp *p = *pp;
    free(p->peers);
    free(p->log);
    free(p->log_epoch);
    free(p->out.a);
    free(p->ev.a);
    free(p);
    *pp = NULL;
}

void detp_leave(detp *p, int64_t now)
{
    (void)now;
    if (p->fenced || p->leaving)
        return;
    p->leaving = true;
    for (int j = 0; j < p->cfg.nslots; j++) {
        if (j != p->cfg.self && is_member(p, j)) {
            detm m;
            msg_init(p, &m, DETM_LEAVE, j);
            vec_push(&p->out, &m);
        }
    }
}

int detp_install_view(detp *p, const det_view *v, int64_t now)
{
    if (p->fenced)
        return RK_E_FENCED;
    if (!v || v->nslots != p->cfg.nslots || v->epoch <= p->epoch || !det_view_has(v, p->cfg.self))
        return -EINVAL;
    for (int r = 0; r < p->cfg.nslots; r++)
        if (det_view_has(v, r) && p->peers[r].state == DETP_DEAD)
            return -EINVAL; /* I4: out is final */
    int n = 0;
    for (int r = 0; r < p->cfg.nslots; r++) {
        struct peer *q = &p->peers[r];
        if (det_view_has(v, r)) {
            n++;
            if (q->state == DETP_NONMEMBER)
                q->state = DETP_ALIVE;
        } else if (q->state != DETP_DEAD && q->state != DETP_NONMEMBER) {
            /* removed by recovery: final too; a slot no process held stays one (I12) */
            q->state = DETP_DEAD;
            q->left = true;
            q->observed = false;
        }
    }
    p->nmembers = n;
    p->epoch = v->epoch;
    ring_recompute(p, now);
    emit(p, DET_EV_VIEW, -1, 0, 0);
    return 0;
}

int detp_pop_send(detp *p, detm *m)
{
    return vec_pop(&p->out, m);
}

int detp_pop_event(detp *p, det_event *ev)
{
    return vec_pop(&p->ev, ev);
}

void detp_view(const detp *p, det_view *out)
{
    memset(out, 0, sizeof(*out));
    out->epoch = p->epoch;
    out->nslots = p->cfg.nslots;
    out->nmembers = p->nmembers;
    for (int r = 0; r < p->cfg.nslots; r++)
        if (is_member(p, r))
            out->members[r / 64] |= 1ull << (r % 64);
}

bool detp_fenced(const detp *p)
{
    return p->fenced;
}

bool detp_unadmitted(const detp *p)
{
    return p->unadmitted;
}

void detp_joiner_knows(detp *p, int r, uint64_t epoch)
{
    if (r >= 0 && r < p->cfg.nslots && p->peers[r].state == DETP_NONMEMBER) {
        p->peers[r].knows = true;
        p->peers[r].knows_epoch = epoch;
    }
}

int detp_peer_state(const detp *p, int r)
{
    if (r < 0 || r >= p->cfg.nslots)
        return DETP_NONMEMBER;
    return p->peers[r].state;
}
