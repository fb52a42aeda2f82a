/*
 * tests/test_detector.c - the failure detector (detector/).
 *
 * "sim": the protocol state machine (det_proto.c) driven by a simulated clock and network
 * with loss, delay, reordering, duplication, partitions, crashes and pauses. Each test
 * names the invariants (I1..I9 of det_proto.c's header) it checks.
 * The datagram format and the death report of a worker's parent: tests/test_detector_wire.c.
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

    return s;
}

int main(void)
{
    return th_main(detector_suite());
}
