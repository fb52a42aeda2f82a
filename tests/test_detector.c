/*
 * tests/test_detector.c - the failure detector (detector/).
 *
 * "sim": the protocol state machine (det_proto.c) driven by a simulated clock and network
 * with loss, delay, reordering, duplication, partitions, crashes and pauses. Each test
 * names the invariants (I1..I9 of det_proto.c's header) it checks.
 * "wire": the datagram format, MAC, replay window and key parsing (det_wire.c), and the
 * death report of a worker's parent (det_parent.c, P1-P4).
 * Real workers under mpirun and `rekindle run`: tests/test_detector_proc.c.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../detector/det_internal.h"
#include "harness.h"

#define MS 1000000LL
#define P (100 * MS)

/* ---- the simulated network -------------------------------------------------------------- */

enum { SIM_MAX = 16, SIM_QCAP = 200000, SIM_EVCAP = 512 };

struct inflight {
    int64_t at;
    detm m;
};

struct sim {
    int n;
    detp *node[SIM_MAX];
    bool crashed[SIM_MAX], paused[SIM_MAX];
    bool cut[SIM_MAX][SIM_MAX]; /* cut[a][b]: a -> b drops */
    int64_t now;
    double loss, dup;
    int64_t delay_min, delay_max;
    uint64_t rng;
    struct inflight *q;
    size_t nq;
    det_event ev[SIM_MAX][SIM_EVCAP];
    int nev[SIM_MAX];
    long sent[SIM_MAX][DETM_TYPE_MAX];
};

static uint64_t sim_rand(struct sim *s)
{
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return s->rng;
}

static double sim_unit(struct sim *s)
{
    return (double)(sim_rand(s) >> 11) / (double)(1ull << 53);
}

static struct sim *sim_new(int n, uint64_t seed)
{
    struct sim *s = calloc(1, sizeof(*s));
    ck_assert_ptr_nonnull(s);
    s->q = calloc(SIM_QCAP, sizeof(*s->q));
    ck_assert_ptr_nonnull(s->q);
    s->n = n;
    s->rng = seed | 1;
    s->now = 1000 * MS;
    s->delay_min = 1 * MS / 10;
    s->delay_max = 1 * MS;
    for (int i = 0; i < n; i++) {
        detp_cfg c = {.self = i, .world = n, .nslots = n + 2, .period_ns = P, .k = 3, .nhelpers = 2,
                      .seed = seed + (uint64_t)i};
        th_assert_rc(detp_create(&s->node[i], &c, s->now), 0);
    }
    return s;
}

static void sim_free(struct sim *s)
{
    for (int i = 0; i < s->n; i++)
        detp_destroy(&s->node[i]);
    free(s->q);
    free(s);
}

static void sim_enqueue(struct sim *s, const detm *m)
{
    if (s->cut[m->src][m->dst] || sim_unit(s) < s->loss)
        return;
    int copies = sim_unit(s) < s->dup ? 2 : 1;
    for (int c = 0; c < copies && s->nq < SIM_QCAP; c++) {
        int64_t d = s->delay_min + (int64_t)(sim_unit(s) * (double)(s->delay_max - s->delay_min));
        s->q[s->nq].at = s->now + d;
        s->q[s->nq++].m = *m;
    }
}

static void sim_collect(struct sim *s, int i)
{
    detm m;
    det_event e;
    while (detp_pop_send(s->node[i], &m)) {
        ck_assert_int_eq(m.src, i);
        s->sent[i][m.type]++;
        sim_enqueue(s, &m);
    }
    while (detp_pop_event(s->node[i], &e))
        if (s->nev[i] < SIM_EVCAP)
            s->ev[i][s->nev[i]++] = e;
}

/* Advances the simulated clock to `until` in 1 ms steps. */
static void sim_run(struct sim *s, int64_t until)
{
    for (; s->now <= until; s->now += MS) {
        for (size_t j = 0; j < s->nq;) {
            struct inflight *f = &s->q[j];
            int dst = f->m.dst;
            if (f->at > s->now || s->paused[dst]) { /* a paused worker's socket keeps it */
                j++;
                continue;
            }
            if (!s->crashed[dst]) {
                detp_recv(s->node[dst], &f->m, s->now);
                sim_collect(s, dst);
            }
            s->q[j] = s->q[--s->nq]; /* removal reorders the rest: fine, delays vary anyway */
        }
        for (int i = 0; i < s->n; i++) {
            if (s->crashed[i] || s->paused[i])
                continue;
            if (detp_next_deadline(s->node[i]) <= s->now)
                detp_tick(s->node[i], s->now);
            sim_collect(s, i);
        }
    }
}

static int count_ev(const struct sim *s, int i, int kind, int peer)
{
    int c = 0;
    for (int j = 0; j < s->nev[i]; j++)
        c += s->ev[i][j].kind == kind && (peer < 0 || s->ev[i][j].peer == peer);
    return c;
}

static int count_ev_all(const struct sim *s, int kind)
{
    int c = 0;
    for (int i = 0; i < s->n; i++)
        c += count_ev(s, i, kind, -1);
    return c;
}

/* Every live (not crashed, not fenced) node has the same view (I4); returns its epoch. */
static uint64_t assert_same_view(const struct sim *s)
{
    det_view ref, v;
    int first = -1;
    for (int i = 0; i < s->n; i++) {
        if (s->crashed[i] || detp_fenced(s->node[i]))
            continue;
        if (first < 0) {
            detp_view(s->node[i], &ref);
            first = i;
            continue;
        }
        detp_view(s->node[i], &v);
        ck_assert_msg(v.epoch == ref.epoch && v.nmembers == ref.nmembers &&
                          memcmp(v.members, ref.members, sizeof(v.members)) == 0,
                      "node %d view (epoch %llu, %d members) != node %d view (epoch %llu, %d members)", i,
                      (unsigned long long)v.epoch, v.nmembers, first, (unsigned long long)ref.epoch, ref.nmembers);
    }
    return ref.epoch;
}

/* One protocol instance outside a simulated network, created at time 0. */
static detp *one_node(int self, int world, int nslots, int k)
{
    detp *p = NULL;
    detp_cfg c = {.self = self, .world = world, .nslots = nslots, .period_ns = P, .k = k, .nhelpers = k - 1, .seed = 1};
    th_assert_rc(detp_create(&p, &c, 0), 0);
    return p;
}

/* ---- sim tests ------------------------------------------------------------------------------ */

/* I1: each member sends k heartbeats per period, whatever the size; I2: no suspicion when
   heartbeats flow. */
START_TEST(sim_steady_state_constant_traffic)
{
    int sizes[] = {4, 8, 16};
    for (size_t z = 0; z < 3; z++) {
        struct sim *s = sim_new(sizes[z], 42);
        sim_run(s, s->now + 10000 * MS);
        for (int i = 0; i < s->n; i++) {
            ck_assert_msg(s->sent[i][DETM_HB] >= 3 * 99 && s->sent[i][DETM_HB] <= 3 * 102,
                          "n=%d node %d sent %ld heartbeats in 100 periods, want 3 per period", s->n, i,
                          s->sent[i][DETM_HB]);
            ck_assert_int_eq(s->sent[i][DETM_PING_REQ], 0);
        }
        ck_assert_int_eq(count_ev_all(s, DET_EV_SUSPECT), 0);
        ck_assert_int_eq(count_ev_all(s, DET_EV_DEAD), 0);
        ck_assert_uint_eq(assert_same_view(s), 0);
        sim_free(s);
    }
}
END_TEST

/* I2, I4, I5: a crash is probed, suspected, declared; every survivor gets the same view. */
START_TEST(sim_crash_detected_same_view)
{
    struct sim *s = sim_new(8, 7);
    sim_run(s, s->now + 2000 * MS);
    s->crashed[3] = true;
    int64_t t_kill = s->now;
    sim_run(s, s->now + 2000 * MS);
    for (int i = 0; i < s->n; i++) {
        if (i == 3)
            continue;
        ck_assert_msg(count_ev(s, i, DET_EV_DEAD, 3) == 1, "node %d: %d peer_dead(3) events", i,
                      count_ev(s, i, DET_EV_DEAD, 3));
        ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, -1), 1);
        ck_assert_int_eq(detp_peer_state(s->node[i], 3), DETP_DEAD);
    }
    /* the observers (4, 5, 6) probed through helpers and suspected before declaring */
    long preq = 0;
    for (int i = 4; i <= 6; i++) {
        preq += s->sent[i][DETM_PING_REQ];
        ck_assert_int_ge(count_ev(s, i, DET_EV_SUSPECT, 3), 1);
        for (int j = 0; j < s->nev[i]; j++)
            if (s->ev[i][j].kind == DET_EV_DEAD)
                ck_assert_msg(s->ev[i][j].after_ms >= 300 && s->ev[i][j].via == DET_VIA_SILENCE,
                              "declared after %.0f ms < 3 periods (via %d)", s->ev[i][j].after_ms,
                              s->ev[i][j].via);
    }
    ck_assert_int_ge(preq, 2);
    ck_assert_uint_eq(assert_same_view(s), 1);
    (void)t_kill;
    /* I1: after the change the ring closes over the gap: 2 observes 4 now */
    ck_assert_int_ge(detp_timeout_ns(s->node[4], 2), 3 * P);
    ck_assert_int_eq(detp_timeout_ns(s->node[4], 3), -1);
    sim_free(s);
}
END_TEST

/* I2, I5: with 10% loss, delays to 40 ms (reordering) and 5% duplicates, no false
   declaration, and two crashes still reach every survivor. */
START_TEST(sim_lossy_network)
{
    struct sim *s = sim_new(10, 1234);
    s->loss = 0.10;
    s->dup = 0.05;
    s->delay_max = 40 * MS;
    sim_run(s, s->now + 20000 * MS);
    ck_assert_int_eq(count_ev_all(s, DET_EV_DEAD), 0);
    s->crashed[5] = true;
    s->crashed[6] = true; /* adjacent: 7 observed both */
    sim_run(s, s->now + 5000 * MS);
    for (int i = 0; i < s->n; i++) {
        if (s->crashed[i])
            continue;
        ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, 5), 1);
        ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, 6), 1);
        ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, -1), 2);
    }
    ck_assert_uint_eq(assert_same_view(s), 2);
    sim_free(s);
}
END_TEST

/* I3: a peer that its observer cannot reach directly is kept alive by indirect probes. */
START_TEST(sim_indirect_probe_saves_reachable_peer)
{
    struct sim *s = sim_new(6, 99);
    s->cut[2][3] = s->cut[3][2] = true; /* 3 observes 2 but cannot hear it */
    sim_run(s, s->now + 10000 * MS);
    ck_assert_int_eq(count_ev_all(s, DET_EV_DEAD), 0);
    ck_assert_int_gt(s->sent[3][DETM_PING_REQ], 0);
    ck_assert_int_gt(s->sent[4][DETM_PING] + s->sent[5][DETM_PING], 0); /* helpers probed */
    sim_free(s);
}
END_TEST

/* I3: a suspect that learns of it refutes with a higher incarnation. */
START_TEST(sim_suspect_refutes_with_incarnation)
{
    detp *p = one_node(1, 4, 4, 3);
    detm m = {.type = DETM_SUSPECT, .src = 2, .dst = 1, .inc = 0, .subject = 1, .origin = -1};
    detp_recv(p, &m, 10 * MS);
    detm out;
    bool alive = false;
    while (detp_pop_send(p, &out))
        if (out.type == DETM_ALIVE) {
            alive = true;
            ck_assert_int_eq(out.dst, 2);
            ck_assert_int_eq(out.subject, 1);
            ck_assert_uint_eq(out.inc, 1);
        }
    ck_assert(alive);
    /* an old suspicion (inc 0 < 1) is not refuted again */
    detp_recv(p, &m, 20 * MS);
    while (detp_pop_send(p, &out))
        ck_assert_int_ne(out.type, DETM_ALIVE);
    detp_destroy(&p);
    ck_assert_ptr_null(p);
}
END_TEST

/* I3: a suspect's heartbeat refutes the suspicion (REFUTED event), no declaration. */
START_TEST(sim_late_heartbeat_refutes)
{
    struct sim *s = sim_new(4, 5);
    sim_run(s, s->now + 1000 * MS);
    s->paused[0] = true; /* 1, 2, 3 observe 0 */
    sim_run(s, s->now + 260 * MS); /* past T - p/2: suspect, before T */
    ck_assert_int_ge(count_ev(s, 1, DET_EV_SUSPECT, 0), 1);
    s->paused[0] = false;
    sim_run(s, s->now + 2000 * MS);
    ck_assert_int_eq(count_ev_all(s, DET_EV_DEAD), 0);
    ck_assert_int_ge(count_ev(s, 1, DET_EV_REFUTED, 0), 1);
    sim_free(s);
}
END_TEST

/* I2: the timeout adapts to jitter, with the floor of 3 periods and a cap of 10. */
START_TEST(sim_timeout_adapts_to_jitter)
{
    detp *p = one_node(1, 3, 3, 2);
    ck_assert_int_ge(detp_timeout_ns(p, 0), 1000 * MS); /* never heard: the start-up grace */
    int64_t t = 0;
    for (int i = 0; i < 50; i++) {
        t += P;
        detm hb = {.type = DETM_HB, .src = 0, .dst = 1, .subject = -1, .origin = -1};
        detp_recv(p, &hb, t);
    }
    ck_assert_int_eq(detp_timeout_ns(p, 0), 3 * P); /* regular: the floor */
    for (int i = 0; i < 50; i++) {
        t += i % 2 ? 40 * MS : 160 * MS;
        detm hb = {.type = DETM_HB, .src = 0, .dst = 1, .subject = -1, .origin = -1};
        detp_recv(p, &hb, t);
    }
    int64_t jt = detp_timeout_ns(p, 0);
    ck_assert_msg(jt > 3 * P && jt <= 10 * P, "timeout under jitter %lld ms", (long long)(jt / MS));
    ck_assert_int_eq(detp_timeout_ns(p, 1), -1); /* not observed: self */
    detp_destroy(&p);
}
END_TEST

/* I6, I8: a paused worker is declared dead; when it resumes, it reads the declaration,
   fences itself, sends nothing more and declares nobody. */
START_TEST(sim_paused_worker_fences_itself)
{
    struct sim *s = sim_new(5, 77);
    sim_run(s, s->now + 1000 * MS);
    s->paused[2] = true;
    sim_run(s, s->now + 3000 * MS);
    for (int i = 0; i < s->n; i++)
        if (i != 2)
            ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, 2), 1);
    s->paused[2] = false;
    sim_run(s, s->now + 2000 * MS);
    ck_assert(detp_fenced(s->node[2]));
    ck_assert_int_eq(count_ev(s, 2, DET_EV_FENCED, 2), 1);
    ck_assert_int_eq(count_ev(s, 2, DET_EV_DEAD, -1), 0);
    long before = 0, after = 0;
    for (int t = 0; t < DETM_TYPE_MAX; t++)
        before += s->sent[2][t];
    sim_run(s, s->now + 1000 * MS);
    for (int t = 0; t < DETM_TYPE_MAX; t++)
        after += s->sent[2][t];
    ck_assert_int_eq(after, before);
    ck_assert_uint_eq(assert_same_view(s), 1);
    for (int i = 0; i < s->n; i++)
        if (i != 2)
            ck_assert_int_eq(detp_peer_state(s->node[i], 2), DETP_DEAD); /* I4: no rejoin */
    sim_free(s);
}
END_TEST

/* I10: a fenced member's deadline is ahead of each tick (its thread sleeps a period),
   at every turn after the fencing, and it still sends nothing. */
START_TEST(sim_fenced_member_sleeps)
{
    struct sim *s = sim_new(5, 78);
    sim_run(s, s->now + 1000 * MS);
    s->paused[2] = true;
    sim_run(s, s->now + 3000 * MS);
    s->paused[2] = false;
    sim_run(s, s->now + 500 * MS);
    ck_assert(detp_fenced(s->node[2]));
    detp *p = s->node[2];
    detm m;
    for (int turn = 0; turn < 20; turn++) {
        int64_t now = s->now + turn * 37 * MS;
        detp_tick(p, now);
        int64_t next = detp_next_deadline(p);
        ck_assert_msg(next > now, "turn %d: the fenced member's next deadline is %lld ms from now: its thread "
                      "would poll with no timeout", turn, (long long)((next - now) / MS));
        ck_assert_int_le(next - now, P);
        ck_assert_int_eq(detp_pop_send(p, &m), 0);
    }
    sim_free(s);
}
END_TEST

/* I4, I7: a partition: each side declares the other; messages from the other side are
   never acted on after the heal, and nobody rejoins. */
START_TEST(sim_partition_no_rejoin)
{
    struct sim *s = sim_new(6, 3);
    sim_run(s, s->now + 1000 * MS);
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            s->cut[a][b] = (a < 4) != (b < 4);
    sim_run(s, s->now + 3000 * MS);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, 4), 1);
        ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, 5), 1);
    }
    memset(s->cut, 0, sizeof(s->cut));
    sim_run(s, s->now + 3000 * MS);
    for (int i = 0; i < 4; i++)
        if (!detp_fenced(s->node[i]))
            ck_assert_int_eq(detp_peer_state(s->node[i], 4), DETP_DEAD);
    sim_free(s);
}
END_TEST

/* I4, I5: a clean leave is a membership change without a peer_dead. */
START_TEST(sim_leave_is_not_death)
{
    struct sim *s = sim_new(5, 11);
    sim_run(s, s->now + 1000 * MS);
    detp_leave(s->node[1], s->now);
    sim_collect(s, 1);
    s->crashed[1] = true;
    sim_run(s, s->now + 3000 * MS);
    ck_assert_int_eq(count_ev_all(s, DET_EV_DEAD), 0);
    for (int i = 0; i < s->n; i++)
        if (i != 1)
            ck_assert_int_eq(count_ev(s, i, DET_EV_LEFT, 1), 1);
    ck_assert_uint_eq(assert_same_view(s), 1);
    sim_free(s);
}
END_TEST

/* I4: recovery installs views: a spare joins, a dead rank never comes back, epochs grow. */
START_TEST(sim_install_view_spares)
{
    struct sim *s = sim_new(4, 21); /* slots 4, 5 are spares */
    sim_run(s, s->now + 500 * MS);
    det_view v;
    detp_view(s->node[0], &v);
    ck_assert_int_eq(v.nmembers, 4);
    ck_assert(!det_view_has(&v, 4));
    ck_assert_int_eq(detp_peer_state(s->node[0], 4), DETP_NONMEMBER);
    s->crashed[2] = true;
    sim_run(s, s->now + 2000 * MS);
    detp_view(s->node[0], &v);
    ck_assert_uint_eq(v.epoch, 1);
    det_view nv = v;
    nv.epoch = 1;
    th_assert_rc(detp_install_view(s->node[0], &nv, s->now), -EINVAL); /* epoch must grow */
    nv.epoch = 2;
    nv.members[0] |= 1u << 2;
    th_assert_rc(detp_install_view(s->node[0], &nv, s->now), -EINVAL); /* dead stays out */
    nv.members[0] &= ~(1ull << 2);
    nv.members[0] |= 1u << 4;
    nv.nmembers = 4;
    for (int i = 0; i < 4; i++)
        if (i != 2)
            th_assert_rc(detp_install_view(s->node[i], &nv, s->now), 0);
    ck_assert_int_eq(detp_peer_state(s->node[0], 4), DETP_ALIVE);
    detp_view(s->node[1], &v);
    ck_assert_uint_eq(v.epoch, 2);
    ck_assert(det_view_has(&v, 4));
    sim_collect(s, 0);
    ck_assert_int_eq(count_ev(s, 0, DET_EV_VIEW, -1), 1);
    sim_free(s);
}
END_TEST

/* I12: a worker started while the job runs joins at a slot no process held: given the
   members' view (detp_cfg.view0), it is made a member of every view by one ADMIT, all
   views stay alike, it is watched like any member (its crash is declared), and a slot out
   by a declaration cannot be admitted again. */
START_TEST(sim_joiner_admitted_into_every_view)
{
    struct sim *s = sim_new(5, 41); /* slots 5, 6 held by no process */
    s->crashed[2] = true;
    sim_run(s, s->now + 2000 * MS);
    ck_assert_uint_eq(assert_same_view(s), 1);
    det_view v;
    detp_view(s->node[0], &v);
    /* The recovery installs the agreed view on every survivor: a slot no process held stays
       out of the view and NONMEMBER, never DEAD (it was, and no join could follow a loss). */
    v.epoch++;
    for (int i = 0; i < 5; i++)
        if (i != 2)
            th_assert_rc(detp_install_view(s->node[i], &v, s->now), 0);
    ck_assert_int_eq(detp_peer_state(s->node[0], 5), DETP_NONMEMBER);
    ck_assert_int_eq(detp_peer_state(s->node[0], 2), DETP_DEAD);
    v.members[0] |= 1u << 5; /* what the members hand the joiner: their view, itself in it */
    v.nmembers++;
    detp_cfg c = {.self = 5, .world = 7, .nslots = 7, .period_ns = P, .k = 3, .nhelpers = 2, .seed = 9,
                  .view0 = &v};
    th_assert_rc(detp_create(&s->node[5], &c, s->now), 0);
    s->n = 6;
    ck_assert_int_eq(detp_peer_state(s->node[0], 5), DETP_NONMEMBER);
    th_assert_rc(detp_admit(s->node[0], 2, s->now), -EINVAL); /* out is final (I4) */
    th_assert_rc(detp_admit(s->node[0], 5, s->now), 0);
    sim_run(s, s->now + 2000 * MS);
    ck_assert_uint_eq(assert_same_view(s), 3);
    detp_view(s->node[3], &v);
    ck_assert(det_view_has(&v, 5));
    ck_assert_int_eq(v.nmembers, 5);
    for (int i = 0; i < 6; i++)
        if (i != 2) {
            ck_assert_int_eq(count_ev(s, i, DET_EV_ADMIT, 5), 1);
            ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, 5), 0);
        }
    th_assert_rc(detp_admit(s->node[1], 5, s->now), 0); /* asked already: nothing */
    sim_run(s, s->now + 500 * MS);
    ck_assert_uint_eq(assert_same_view(s), 3);
    s->crashed[5] = true;
    sim_run(s, s->now + 2000 * MS);
    ck_assert_uint_eq(assert_same_view(s), 4);
    ck_assert_int_eq(count_ev(s, 0, DET_EV_DEAD, 5), 1);
    sim_free(s);
}
END_TEST

/* I12: a joiner observes no one before its own ADMIT. The members, which have not admitted
   it, send it nothing; a joiner that counted their silence from its start declared them
   all dead once the admission took longer than its bound, and those declarations reached
   the members with the ADMIT and fenced healthy ones (seen with members training in steps
   of 0.8 s). Here the admission comes 3 s after the joiner started: no one is declared,
   every view stays alike, and once in, the joiner watches the members (a crash declared). */
START_TEST(sim_joiner_waits_for_its_admit)
{
    struct sim *s = sim_new(4, 43); /* slot 4 held by no process */
    sim_run(s, s->now + 1000 * MS);
    det_view v;
    detp_view(s->node[0], &v);
    v.members[0] |= 1u << 4;
    v.nmembers++;
    detp_cfg c = {.self = 4, .world = (int)v.nslots, .nslots = (int)v.nslots, .period_ns = P, .k = 3, .nhelpers = 2, .seed = 7,
                  .view0 = &v};
    th_assert_rc(detp_create(&s->node[4], &c, s->now), 0);
    s->n = 5;
    sim_run(s, s->now + 3000 * MS);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(count_ev(s, 4, DET_EV_DEAD, r), 0);
        ck_assert_int_eq(count_ev(s, 4, DET_EV_SUSPECT, r), 0);
        ck_assert(!detp_fenced(s->node[r]));
    }
    ck_assert(detp_unadmitted(s->node[4]));
    th_assert_rc(detp_admit(s->node[1], 4, s->now), 0);
    sim_run(s, s->now + 2000 * MS);
    ck_assert(!detp_unadmitted(s->node[4]));
    ck_assert_uint_eq(assert_same_view(s), 1); /* the ADMIT */
    detp_view(s->node[4], &v);
    ck_assert_int_eq(v.nmembers, 5);
    for (int r = 0; r < 5; r++) {
        ck_assert(!detp_fenced(s->node[r]));
        for (int i = 0; i < 5; i++)
            ck_assert_int_eq(count_ev(s, i, DET_EV_DEAD, r), 0);
    }
    s->crashed[2] = true;
    sim_run(s, s->now + 2000 * MS);
    ck_assert_uint_eq(assert_same_view(s), 2); /* the death */
    ck_assert_int_eq(count_ev(s, 4, DET_EV_DEAD, 2), 1);
    sim_free(s);
}
END_TEST

/* I12: two joiners given the same view (one join, two workers started) are asked in one
   after the other. Each must learn the other's ADMIT, which for the second came before its
   own: the members send a joiner the declarations since the epoch of the view it was
   given (detp_joiner_knows), not its ADMIT alone. Without that the second's view lacked
   the first, and the ring over the five could not be built (seen with two workers started
   together under mpirun). */
START_TEST(sim_two_joiners_learn_each_other)
{
    struct sim *s = sim_new(3, 47); /* slots 3, 4 held by no process */
    sim_run(s, s->now + 1000 * MS);
    det_view v, w;
    detp_view(s->node[0], &v);
    for (int j = 3; j < 5; j++) {
        w = v;
        w.members[0] |= 1u << j;
        w.nmembers++;
        detp_cfg c = {.self = j, .world = (int)v.nslots, .nslots = (int)v.nslots, .period_ns = P, .k = 3,
                      .nhelpers = 2, .seed = 11 + (uint64_t)j, .view0 = &w};
        th_assert_rc(detp_create(&s->node[j], &c, s->now), 0);
        for (int i = 0; i < 3; i++)
            detp_joiner_knows(s->node[i], j, v.epoch);
    }
    s->n = 5;
    th_assert_rc(detp_admit(s->node[0], 3, s->now), 0);
    sim_run(s, s->now + 300 * MS);
    th_assert_rc(detp_admit(s->node[0], 4, s->now), 0);
    sim_run(s, s->now + 2000 * MS);
    ck_assert_uint_eq(assert_same_view(s), v.epoch + 2);
    for (int i = 0; i < 5; i++) {
        detp_view(s->node[i], &w);
        ck_assert_msg(w.nmembers == 5 && det_view_has(&w, 3) && det_view_has(&w, 4), "node %d: %d members", i,
                      w.nmembers);
        ck_assert(!detp_fenced(s->node[i]));
    }
    sim_free(s);
}
END_TEST

/* I7: messages from a non-member slot or to someone else are ignored. */
START_TEST(sim_nonmember_ignored)
{
    detp *p = one_node(0, 3, 5, 2);
    detm m = {.type = DETM_DECL, .src = 4, .dst = 0, .subject = -1, .origin = -1, .ndecl = 1};
    m.decl[0].rank = 1;
    m.decl[0].silence_ms = 500;
    detp_recv(p, &m, MS);
    ck_assert_int_eq(detp_peer_state(p, 1), DETP_ALIVE);
    m.src = 2;
    m.dst = 1;
    detp_recv(p, &m, MS);
    ck_assert_int_eq(detp_peer_state(p, 1), DETP_ALIVE);
    m.dst = 0;
    detp_recv(p, &m, MS);
    ck_assert_int_eq(detp_peer_state(p, 1), DETP_DEAD);
    detp_destroy(&p);
}
END_TEST

/* I9, I4, I5: a death reported by the worker's parent is declared at once, without probes,
   and reaches every member "via parent" even when the report reached only one of them;
   the silence that follows changes nothing (whichever way comes first declares). A report
   of a rank already out, or of a spare slot not in the view, changes nothing either. */
START_TEST(sim_parent_report_declares_at_once)
{
    struct sim *s = sim_new(6, 31); /* slots 6, 7 are spares */
    sim_run(s, s->now + 1000 * MS);
    s->crashed[2] = true;
    int64_t t_kill = s->now;
    detm d = {.type = DETM_DEATH, .src = 2, .dst = 0, .inc = 9, .subject = 2, .origin = -1};
    sim_enqueue(s, &d); /* the copies to the others were lost */
    sim_run(s, s->now + 20 * MS);
    for (int i = 0; i < s->n; i++) {
        if (i == 2)
            continue;
        ck_assert_msg(detp_peer_state(s->node[i], 2) == DETP_DEAD, "node %d does not hold 2 dead 20 ms after its "
                      "parent's report", i);
        ck_assert_int_eq(count_ev(s, i, DET_EV_SUSPECT, 2), 0); /* no probes, no suspicion */
    }
    sim_run(s, t_kill + 3000 * MS);
    for (int i = 0; i < s->n; i++) {
        if (i == 2)
            continue;
        ck_assert_msg(count_ev(s, i, DET_EV_DEAD, -1) == 1, "node %d: %d deaths", i, count_ev(s, i, DET_EV_DEAD, -1));
        for (int j = 0; j < s->nev[i]; j++)
            if (s->ev[i][j].kind == DET_EV_DEAD)
                ck_assert_msg(s->ev[i][j].peer == 2 && s->ev[i][j].via == DET_VIA_PARENT && s->ev[i][j].after_ms < 300,
                              "node %d: peer %d via %d after %.0f ms", i, s->ev[i][j].peer, s->ev[i][j].via,
                              s->ev[i][j].after_ms);
    }
    ck_assert_uint_eq(assert_same_view(s), 1);
    /* already out, or never in: nothing changes, nothing is sent to the dead */
    detp *p = s->node[0];
    long decl = s->sent[0][DETM_DECL];
    d.dst = 0;
    detp_recv(p, &d, s->now);
    d.src = d.subject = 6;
    detp_recv(p, &d, s->now);
    sim_collect(s, 0);
    ck_assert_int_eq(detp_peer_state(p, 6), DETP_NONMEMBER);
    ck_assert_int_eq(count_ev(s, 0, DET_EV_DEAD, -1), 1);
    ck_assert_int_eq(s->sent[0][DETM_DECL], decl);
    sim_free(s);
}
END_TEST

/* ---- wire ----------------------------------------------------------------------------------- */

static const uint8_t key1[DET_KEY_BYTES] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
static const uint8_t key2[DET_KEY_BYTES] = {9, 8, 7};
static const uint8_t salt[DET_KEY_BYTES] = {4, 4, 4};

START_TEST(wire_roundtrip_and_rejects)
{
    detw tx, rx, other;
    th_assert_rc(detw_init(&tx, key1, salt, 8, 2), 0);
    th_assert_rc(detw_init(&rx, key1, salt, 8, 3), 0);
    th_assert_rc(detw_init(&other, key2, salt, 8, 2), 0);
    detm m = {.type = DETM_PING_REQ, .src = 2, .dst = 3, .inc = 7, .epoch = 9, .subject = 5, .origin = 2,
              .nonce = 0xabcdef, .ndecl = 2};
    m.decl[0] = (detm_decl){4, 321};
    m.decl[1] = (detm_decl){6, 0xffffffffu};
    uint8_t buf[DETW_MAX + 16], copy[DETW_MAX + 16];
    size_t n = detw_encode(&tx, &m, buf);
    ck_assert_uint_eq(n, DETW_HDR + 16 + DETW_MAC);
    memcpy(copy, buf, n);
    detm got;
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_OK);
    ck_assert_int_eq(got.type, m.type);
    ck_assert_int_eq(got.subject, 5);
    ck_assert_uint_eq(got.nonce, 0xabcdef);
    ck_assert_uint_eq(got.decl[1].silence_ms, 0xffffffffu);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_REPLAY); /* the same datagram again */
    th_assert_rc(detw_decode(&rx, buf, 10, &got), DETW_SHORT);
    th_assert_rc(detw_decode(&rx, buf, DETW_MAX + 1, &got), DETW_OVERSIZE);
    copy[70] ^= 1; /* a flipped bit in a declaration */
    th_assert_rc(detw_decode(&rx, copy, n, &got), DETW_BADMAC);
    n = detw_encode(&other, &m, buf); /* another job's key */
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADJOB);
    n = detw_encode(&tx, &m, buf);
    buf[4] = DETW_VERSION + 1;
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADVERSION);
    buf[0] = 'X';
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADMAGIC);
    m.dst = 4; /* authentic but for another worker */
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    m.dst = 3;
    m.subject = 8; /* out of the job's slots */
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    m.subject = 5;
    m.src = 9;
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_NONMEMBER);
    /* random garbage never passes, never crashes */
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < 20000; i++) {
        size_t len = (size_t)(r % (DETW_MAX + 8));
        for (size_t j = 0; j < len; j++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            buf[j] = (uint8_t)r;
        }
        if (i % 3 == 0 && len >= 16) { /* right magic, version and job: must fail the MAC */
            memcpy(buf, copy, 16);
        }
        ck_assert_int_ne(detw_decode(&rx, buf, len, &got), DETW_OK);
    }
    det_stats st = {0};
    detw_count(&st, DETW_BADMAC, 100);
    detw_count(&st, DETW_OK, 92);
    ck_assert_uint_eq(st.drop_mac, 1);
    ck_assert_uint_eq(st.rx_ok, 1);
    ck_assert_uint_eq(st.rx_bytes, 192);
    detw_fini(&tx);
    detw_fini(&rx);
    detw_fini(&other);
}
END_TEST

START_TEST(wire_replay_window_reorder)
{
    detw tx, rx;
    th_assert_rc(detw_init(&tx, key1, salt, 4, 0), 0);
    th_assert_rc(detw_init(&rx, key1, salt, 4, 1), 0);
    detm m = {.type = DETM_HB, .src = 0, .dst = 1, .subject = -1, .origin = -1};
    uint8_t b[100][DETW_MAX];
    size_t n[100];
    for (int i = 0; i < 100; i++)
        n[i] = detw_encode(&tx, &m, b[i]);
    detm got;
    th_assert_rc(detw_decode(&rx, b[50], n[50], &got), DETW_OK);
    th_assert_rc(detw_decode(&rx, b[40], n[40], &got), DETW_OK);    /* late, in the window */
    th_assert_rc(detw_decode(&rx, b[40], n[40], &got), DETW_REPLAY);
    th_assert_rc(detw_decode(&rx, b[60], n[60], &got), DETW_OK);
    th_assert_rc(detw_decode(&rx, b[50], n[50], &got), DETW_REPLAY);
    th_assert_rc(detw_decode(&rx, b[55], n[55], &got), DETW_OK);
    th_assert_rc(detw_decode(&rx, b[99], n[99], &got), DETW_OK);
    th_assert_rc(detw_decode(&rx, b[20], n[20], &got), DETW_REPLAY); /* too old */
    detw_fini(&tx);
    detw_fini(&rx);
}
END_TEST

/* A datagram of an earlier launch attempt of the same job (same secret, another salt)
   never authenticates: it is another attempt's MAC, not a replay the window would see. */
START_TEST(wire_earlier_attempt_rejected)
{
    static const uint8_t salt2[DET_KEY_BYTES] = {5, 5, 5};
    detw old, tx, rx;
    th_assert_rc(detw_init(&old, key1, salt, 4, 0), 0);
    th_assert_rc(detw_init(&tx, key1, salt2, 4, 0), 0);
    th_assert_rc(detw_init(&rx, key1, salt2, 4, 1), 0);
    detm m = {.type = DETM_DECL, .src = 0, .dst = 1, .subject = -1, .origin = -1, .ndecl = 1};
    m.decl[0] = (detm_decl){1, 5000}; /* "rank 1 is dead", as the earlier attempt said */
    uint8_t b[DETW_MAX];
    detm got;
    for (int i = 0; i < 100; i++) /* its sequence numbers run ahead of the new attempt's */
        detw_encode(&old, &m, b);
    size_t n = detw_encode(&old, &m, b);
    th_assert_rc(detw_decode(&rx, b, n, &got), DETW_BADMAC);
    n = detw_encode(&tx, &m, b);
    th_assert_rc(detw_decode(&rx, b, n, &got), DETW_OK);
    detw_fini(&old);
    detw_fini(&tx);
    detw_fini(&rx);
}
END_TEST

/* The parent's death report (det_parent.c) and what a receiver makes of it: authentic
   once; its replay, a forgery, a report of an earlier attempt, one numbered like the
   worker's own datagrams, or one about another rank, are dropped (P3). Nothing is
   reported after the worker's CLOSE; the pipe's end of file (the worker dying) is no CLOSE. */
static size_t recv_one(int fd, uint8_t *buf, size_t cap)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    ck_assert_int_eq(poll(&pf, 1, 5000), 1);
    ssize_t n = recv(fd, buf, cap, 0);
    ck_assert_int_gt(n, 0);
    return (size_t)n;
}

START_TEST(wire_death_report_forged_or_replayed_rejected)
{
    static const uint8_t salt2[DET_KEY_BYTES] = {5, 5, 5};
    int us = socket(AF_INET, SOCK_DGRAM, 0), pfd[2];
    ck_assert_int_ge(us, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(a);
    ck_assert_int_eq(bind(us, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(us, (struct sockaddr *)&a, &sl), 0);
    struct sockaddr_in addrs[4] = {{0}};
    addrs[1] = a; /* only slot 1 listens here: one datagram per report */
    ck_assert_int_eq(pipe(pfd), 0);
    det_parent *pp = NULL;
    th_assert_rc(det_parent_open(&pp, pfd[0], key1), 0);
    th_assert_rc(det_parent_report(pp, 9), 0); /* nothing told yet: nothing to report */
    detpar_tell_start(pfd[1], 2, 4, salt, addrs); /* what worker 2's det_start tells */
    th_assert_rc(det_parent_read(pp), 0);
    th_assert_rc(det_parent_report(pp, 9), 1);
    uint8_t good[DETW_MAX], buf[DETW_MAX];
    size_t n = recv_one(us, good, sizeof(good));
    detw rx;
    detm got;
    th_assert_rc(detw_init(&rx, key1, salt, 4, 1), 0);
    th_assert_rc(detw_decode(&rx, good, n, &got), DETW_OK);
    ck_assert_int_eq(got.type, DETM_DEATH);
    ck_assert_int_eq(got.src, 2);
    ck_assert_int_eq(got.subject, 2);
    ck_assert_uint_eq(got.inc, 9);
    detp *p = one_node(1, 4, 4, 3);
    detp_recv(p, &got, MS);
    ck_assert_int_eq(detp_peer_state(p, 2), DETP_DEAD);
    det_event e;
    ck_assert_int_eq(detp_pop_event(p, &e), 1);
    ck_assert_int_eq(e.kind, DET_EV_DEAD);
    ck_assert_int_eq(e.via, DET_VIA_PARENT);
    detp_destroy(&p);
    th_assert_rc(detw_decode(&rx, good, n, &got), DETW_REPLAY); /* the same report again */
    /* forged: a MAC under another key, with the job's id copied in */
    detw forger;
    th_assert_rc(detw_init(&forger, key2, salt, 4, 2), 0);
    forger.tx_seq = DETW_PARENT_SEQ;
    detm m = {.type = DETM_DEATH, .src = 3, .dst = 1, .subject = 3, .origin = -1};
    n = detw_encode(&forger, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADJOB);
    memcpy(buf + 8, good + 8, 8);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADMAC);
    detw_fini(&forger);
    /* with the job's key but numbered as the worker's own datagrams, or about another rank */
    detw tx;
    th_assert_rc(detw_init(&tx, key1, salt, 4, 3), 0);
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    tx.tx_seq = DETW_PARENT_SEQ;
    m.subject = 0;
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    m = (detm){.type = DETM_HB, .src = 3, .dst = 1, .subject = -1, .origin = -1}; /* not a DEATH */
    n = detw_encode(&tx, &m, buf);
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_MALFORMED);
    detw_fini(&tx);
    /* the worker left cleanly: nothing to report */
    detpar_tell_close(pfd[1]);
    th_assert_rc(det_parent_report(pp, 0), 0);
    /* a later attempt (another salt): its report does not authenticate in this one */
    detpar_tell_start(pfd[1], 2, 4, salt2, addrs);
    th_assert_rc(det_parent_report(pp, 9), 1);
    n = recv_one(us, buf, sizeof(buf));
    th_assert_rc(detw_decode(&rx, buf, n, &got), DETW_BADMAC);
    detw rx2;
    th_assert_rc(detw_init(&rx2, key1, salt2, 4, 1), 0);
    th_assert_rc(detw_decode(&rx2, buf, n, &got), DETW_OK);
    /* the pipe closes as the worker dies, before waitpid tells: the report still goes */
    close(pfd[1]);
    th_assert_rc(det_parent_read(pp), 1);
    th_assert_rc(det_parent_report(pp, 9), 1);
    n = recv_one(us, buf, sizeof(buf));
    th_assert_rc(detw_decode(&rx2, buf, n, &got), DETW_OK);
    detw_fini(&rx2);
    det_parent_close(&pp);
    ck_assert_ptr_null(pp);
    detw_fini(&rx);
    close(pfd[0]);
    close(us);
}
END_TEST

START_TEST(wire_secret_parsing)
{
    uint8_t k[DET_KEY_BYTES];
    const char *good = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    th_assert_rc(det_key_from_secret(good, k), 0);
    ck_assert_uint_eq(k[0], 0x00);
    ck_assert_uint_eq(k[1], 0x11);
    ck_assert_uint_eq(k[31], 0xff);
    th_assert_rc(det_key_from_secret("00112233", k), RK_E_OPTION);
    th_assert_rc(det_key_from_secret(NULL, k), RK_E_OPTION);
    char bad[65];
    memcpy(bad, good, 65);
    bad[10] = 'g';
    th_assert_rc(det_key_from_secret(bad, k), RK_E_OPTION);
    uint8_t r1[DET_KEY_BYTES], r2[DET_KEY_BYTES];
    th_assert_rc(det_key_random(r1), 0);
    th_assert_rc(det_key_random(r2), 0);
    ck_assert(memcmp(r1, r2, sizeof(r1)) != 0);
}
END_TEST

/* det_proc_ending (det_parent.c P5), on real processes: what the wrapper of `rekindle run`
   reports before waitpid. A live child is not ending, nor a stopped one, nor one whose main
   thread alone ended (pthread_exit) while another runs; a killed one is, at the latest
   when it can be reaped (how much sooner is bench/exit_probe's to measure, not a test's). */
static void *sleeper(void *arg)
{
    (void)arg;
    sleep(30);
    return NULL;
}

static pid_t child_of(int kind)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    if (kind == 1) { /* the main thread ends alone: the process lives on */
        pthread_t t;
        if (pthread_create(&t, NULL, sleeper, NULL) != 0)
            _exit(3);
        pthread_exit(NULL);
    }
    if (kind == 2) { /* 256 MiB touched: a teardown that takes a while */
        size_t n = 256u << 20;
        char *m = malloc(n);
        if (m)
            memset(m, 1, n);
    }
    sleep(30);
    _exit(0);
}

START_TEST(proc_ending_only_for_a_process_that_is)
{
    ck_assert_int_eq(det_proc_ending(0, -1), -EINVAL);
    pid_t live = child_of(0), lone = child_of(1), big = child_of(2);
    usleep(300 * 1000); /* the threads made, the memory touched */
    ck_assert_int_eq(det_proc_ending(live, -1), 0);
    ck_assert_int_eq(det_proc_ending(lone, -1), 0); /* its main thread is a zombie, its other thread runs */
    char path[64], buf[512] = "";
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)lone);
    FILE *f = fopen(path, "r");
    ck_assert(f && fgets(buf, sizeof(buf), f));
    fclose(f);
    ck_assert_msg(strstr(buf, ") Z "), "the main thread of the lone child is not a zombie: %s", buf);
    kill(live, SIGSTOP);
    int st;
    ck_assert_int_eq(waitpid(live, &st, WUNTRACED), live);
    ck_assert(WIFSTOPPED(st));
    ck_assert_int_eq(det_proc_ending(live, -1), 0);
    /* Killed: seen ending no later than reaped (the third through its stat file kept open,
       as the wrapper reads it). */
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)big);
    int bigfd = open(path, O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(bigfd, 0);
    ck_assert_int_eq(det_proc_ending(big, bigfd), 0);
    pid_t all[3] = {live, lone, big};
    for (int i = 0; i < 3; i++) {
        kill(all[i], SIGKILL);
        for (int64_t deadline = rk__deadline_ns(10000);;) {
            ck_assert_int_ge(det_proc_ending(all[i], i == 2 ? bigfd : -1), 0);
            siginfo_t si = {0};
            if (waitid(P_PID, (id_t)all[i], &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == all[i]) {
                ck_assert_int_eq(det_proc_ending(all[i], i == 2 ? bigfd : -1), 1); /* a zombie */
                break;
            }
            ck_assert_msg(!rk__deadline_passed(deadline), "child %d not reaped in 10 s", i);
        }
        ck_assert_int_eq(waitpid(all[i], &st, 0), all[i]);
        ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    }
    close(bigfd);
}
END_TEST

static Suite *detector_suite(void)
{
    Suite *s = suite_create("detector");
    TCase *tc = tcase_create("sim");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, sim_steady_state_constant_traffic);
    tcase_add_test(tc, sim_crash_detected_same_view);
    tcase_add_test(tc, sim_lossy_network);
    tcase_add_test(tc, sim_indirect_probe_saves_reachable_peer);
    tcase_add_test(tc, sim_suspect_refutes_with_incarnation);
    tcase_add_test(tc, sim_late_heartbeat_refutes);
    tcase_add_test(tc, sim_timeout_adapts_to_jitter);
    tcase_add_test(tc, sim_paused_worker_fences_itself);
    tcase_add_test(tc, sim_fenced_member_sleeps);
    tcase_add_test(tc, sim_partition_no_rejoin);
    tcase_add_test(tc, sim_leave_is_not_death);
    tcase_add_test(tc, sim_install_view_spares);
    tcase_add_test(tc, sim_joiner_admitted_into_every_view);
    tcase_add_test(tc, sim_joiner_waits_for_its_admit);
    tcase_add_test(tc, sim_two_joiners_learn_each_other);
    tcase_add_test(tc, sim_nonmember_ignored);
    tcase_add_test(tc, sim_parent_report_declares_at_once);
    suite_add_tcase(s, tc);

    tc = tcase_create("proc");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, proc_ending_only_for_a_process_that_is);
    suite_add_tcase(s, tc);

    tc = tcase_create("wire");
    tcase_add_test(tc, wire_roundtrip_and_rejects);
    tcase_add_test(tc, wire_replay_window_reorder);
    tcase_add_test(tc, wire_secret_parsing);
    tcase_add_test(tc, wire_earlier_attempt_rejected);
    tcase_add_test(tc, wire_death_report_forged_or_replayed_rejected);
    suite_add_tcase(s, tc);

    return s;
}

int main(void)
{
    return th_main(detector_suite());
}
