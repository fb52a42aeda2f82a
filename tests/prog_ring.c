/*
 * tests/prog_ring.c - a worker for the ring's integration tests, run under mpirun by
 * tests/test_ring.c. Prints "ok ..." lines that the suite checks, "FAIL ..." and exits 1
 * on a wrong result. Modes:
 *   exact           every dtype x op x count {0,1,7,4099,2^20+3} through rk_allreduce,
 *                   against a serial reference in the ring's fixed order (ring.c inv. 3),
 *                   run twice (same bits), and once more with tiny chunks (pipelining).
 *   bad             bad arguments on one rank, counts that differ, a cancelled call, a
 *                   fenced rank: every rank fails, then the next call is exact.
 *   kill V PHASE STEP [deadline] [spare]
 *                   rank V raise(SIGKILL)s at (PHASE 0|1, STEP, chunk 1) of an allreduce;
 *                   survivors get RK_E_PEER_LOST (membership oracle below) or, with
 *                   "deadline", RK_E_TIMEOUT; they rebuild the ring (and with "spare",
 *                   the last rank of the job, started outside the ring, joins) and the
 *                   next allreduce is exact.
 *   rebuild-kill V  every rank rebuilds the ring over all ranks; rank V dies inside the
 *                   rebuild, after its handshake (RK_FAULT=rebuild@0=crash). Survivors
 *                   must not freeze: the rebuild returns, the next allreduce reports the
 *                   loss, and a rebuild over the survivors is exact (ring.c inv. 7).
 *   rebuild-early V rank V begins a rebuild to epoch 1 while every other rank is in an
 *                   allreduce of epoch 0 (deadline only, no oracle): the call of V's right
 *                   neighbour sees V's handshake, fails with RK_E_PEER_LOST at once and
 *                   leaves the handshake queued; the others fail through its abort token;
 *                   then all rebuild to epoch 1 and are exact (ring.c inv. 5).
 *   shift-mismatch  ring_shift_by where one pair's lengths differ (fewer or more chunks
 *                   expected than sent, nothing expected, at distance 2, a NULL receive
 *                   buffer): both ends of that pair fail with RK_E_COLL_MISMATCH (-EINVAL
 *                   where the buffer is NULL) well before the deadline, every other member
 *                   gets exactly what was sent to it, and the ring is exact afterwards
 *                   (ring.c inv. 4).
 *   epoch-wrap      rank 0 alone makes an allreduce that times out, leaving its chunks and
 *                   token queued at rank 1; all rebuild to epoch 16 (where a 4-bit epoch
 *                   in the tags wraps) and the same allreduce there is exact (inv. 5).
 *   no-memory       rank 0 alone times out with a send pending, under an address-space
 *                   limit that leaves no room for the fresh slots of its abort: the next
 *                   call fails with -ENOMEM (not a crash); with the limit lifted, all
 *                   rebuild and are exact. Not under ASan (its allocator reserves the
 *                   address space the limit counts).
 *   blob            ring_share_blob with a fake NCCL unique id on a ring of all ranks but
 *                   the last (a spare, refused): every member gets rank 0's bytes; an
 *                   exchange only rank 0 made is dropped by the next one's receivers; a
 *                   receiver alone ends at its 300 ms deadline.
 * The test-only membership oracle: all ranks run on this host, so a peer is dead once
 * /proc/<pid> is gone or a zombie. It stands in for the detector's view.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common.h"
#include "prog_common.h"
#include "../ring/ring.h"
#include "rekindle.h"

static int g_rank, g_world;

#define FAIL(...) PROG_FAIL(g_rank, __VA_ARGS__)

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* Contribution of job rank p at element i: values whose sums round differently in
   different orders, so the bitwise check tests the order. */
static double gen(int p, size_t i, unsigned salt)
{
    uint64_t h = mix(((uint64_t)p << 40) ^ (uint64_t)i ^ ((uint64_t)salt << 56));
    double m = (double)(h >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    return ldexp(m, (int)(h % 9) - 4);
}

static void fill(void *buf, rk_dtype t, size_t n, int p, unsigned salt)
{
    for (size_t i = 0; i < n; i++) {
        double v = gen(p, i, salt);
        uint64_t h = mix((uint64_t)p * 7919 + i + ((uint64_t)salt << 48));
        switch (t) {
        case RK_F32: ((float *)buf)[i] = (float)v; break;
        case RK_F64: ((double *)buf)[i] = v; break;
        case RK_F16: ((uint16_t *)buf)[i] = ring_f32_to_f16((float)v); break;
        case RK_BF16: ((uint16_t *)buf)[i] = ring_f32_to_bf16((float)v); break;
        case RK_I32: ((int32_t *)buf)[i] = (int32_t)h; break;
        case RK_I64: ((int64_t *)buf)[i] = (int64_t)h; break;
        case RK_U8: ((uint8_t *)buf)[i] = (uint8_t)h; break;
        }
    }
}

/* acc op x for one element, as double/int64 carriers; the last hop divides for avg. */
#define PICK(a, x, op) ((op) == RK_MAX ? ((x) > (a) ? (x) : (a)) : ((x) < (a) ? (x) : (a)))

/* The serial reference: element by element in the ring order (inv. 3), with an
   arithmetic independent of ring_reduce (the compiler's _Float16 for f16). */
static void reference(void *out, rk_dtype t, rk_op op, size_t count, const int *who, int m,
                      unsigned salt)
{
    size_t es = rk__dtype_size(t);
    unsigned char *xs = malloc((size_t)m * (count ? count : 1) * es);
    for (int q = 0; q < m; q++)
        fill(xs + (size_t)q * count * es, t, count, who[q], salt);
    for (int s = 0; s < m; s++) {
        size_t off, len;
        ring_segment(count, m, s, &off, &len);
        for (size_t i = off; i < off + len; i++) {
            for (int h = 0; h < m; h++) {
                int q = (s + h) % m;
                bool first = h == 0, last = h == m - 1 && op == RK_AVG && m > 1;
                const unsigned char *x = xs + ((size_t)q * count + i) * es;
                unsigned char *o = (unsigned char *)out + i * es;
                switch (t) {
                case RK_F32: {
                    float a = *(float *)o, v = *(const float *)x;
                    float r = first ? v : (op == RK_SUM || op == RK_AVG) ? a + v : PICK(a, v, op);
                    *(float *)o = last ? (a + v) / (float)m : r;
                    break;
                }
                case RK_F64: {
                    double a = *(double *)o, v = *(const double *)x;
                    double r = first ? v : (op == RK_SUM || op == RK_AVG) ? a + v : PICK(a, v, op);
                    *(double *)o = last ? (a + v) / (double)m : r;
                    break;
                }
                case RK_F16: {
                    _Float16 a16, v16, r16;
                    memcpy(&a16, o, 2);
                    memcpy(&v16, x, 2);
                    float a = (float)a16, v = (float)v16;
                    float r = first ? v : (op == RK_SUM || op == RK_AVG) ? a + v : PICK(a, v, op);
                    r16 = (_Float16)(last ? (a + v) / (float)m : r);
                    memcpy(o, &r16, 2);
                    break;
                }
                case RK_BF16: {
                    float a = ring_bf16_to_f32(*(uint16_t *)o), v = ring_bf16_to_f32(*(const uint16_t *)x);
                    float r = first ? v : (op == RK_SUM || op == RK_AVG) ? a + v : PICK(a, v, op);
                    *(uint16_t *)o = ring_f32_to_bf16(last ? (a + v) / (float)m : r);
                    break;
                }
                case RK_I32: {
                    int32_t a = *(int32_t *)o, v = *(const int32_t *)x;
                    *(int32_t *)o = first ? v : op == RK_SUM ? (int32_t)((uint32_t)a + (uint32_t)v) : PICK(a, v, op);
                    break;
                }
                case RK_I64: {
                    int64_t a = *(int64_t *)o, v = *(const int64_t *)x;
                    *(int64_t *)o = first ? v : op == RK_SUM ? (int64_t)((uint64_t)a + (uint64_t)v) : PICK(a, v, op);
                    break;
                }
                case RK_U8: {
                    uint8_t a = *(uint8_t *)o, v = *(const uint8_t *)x;
                    *(uint8_t *)o = first ? v : op == RK_SUM ? (uint8_t)(a + v) : PICK(a, v, op);
                    break;
                }
                }
            }
        }
    }
    free(xs);
}

static const rk_dtype DTYPES[] = {RK_F32, RK_F64, RK_F16, RK_BF16, RK_I32, RK_I64, RK_U8};
static const rk_op OPS[] = {RK_SUM, RK_AVG, RK_MAX, RK_MIN};
static const size_t COUNTS[] = {0, 1, 7, 4099, (1u << 20) + 3};

static bool is_int(rk_dtype t)
{
    return t == RK_I32 || t == RK_I64 || t == RK_U8;
}

/* One allreduce of fill(salt) compared with the reference; returns the number of checks. */
static void check_one(int (*reduce)(void *, void *, size_t, rk_dtype, rk_op), void *arg, rk_dtype t,
                      rk_op op, size_t count, const int *who, int m, int me, unsigned salt)
{
    size_t es = rk__dtype_size(t), nb = (count ? count : 1) * es;
    unsigned char *buf = malloc(nb), *ref = malloc(nb);
    fill(buf, t, count, who[me], salt);
    int rc = reduce(arg, buf, count, t, op);
    if (rc != 0)
        FAIL("allreduce %s op %d count %zu: %s", rk__dtype_name(t), (int)op, count, rk_strerror(rc));
    reference(ref, t, op, count, who, m, salt);
    if (count && memcmp(buf, ref, count * es) != 0) {
        size_t i = 0;
        while (memcmp(buf + i * es, ref + i * es, es) == 0)
            i++;
        FAIL("allreduce %s op %d count %zu world %d: element %zu differs from the reference",
             rk__dtype_name(t), (int)op, count, m, i);
    }
    free(buf);
    free(ref);
}

static int via_api(void *arg, void *buf, size_t n, rk_dtype t, rk_op op)
{
    return rk_allreduce(arg, buf, n, t, op);
}

static int via_ring(void *arg, void *buf, size_t n, rk_dtype t, rk_op op)
{
    return ring_allreduce(arg, buf, n, t, op, NULL);
}

static int *iota(int n)
{
    int *v = malloc((size_t)n * sizeof(*v));
    for (int i = 0; i < n; i++)
        v[i] = i;
    return v;
}

/* What member `from` sends at distance d in shift_exact: its length and byte i. */
static size_t shift_len(int from, int d)
{
    static const size_t LEN[] = {0, 1, 4097, 300001};
    return LEN[(size_t)(from + 3 * (d + 8)) % RK_ARRAY_LEN(LEN)];
}
static uint8_t shift_byte(int from, int d, size_t i)
{
    return (uint8_t)mix((uint64_t)from << 40 ^ (uint64_t)(d + 8) << 32 ^ i);
}

/* ring_shift_by at distances -1 .. size+1: every member gets exactly what member
   rank - d sent it, of its length (0, 1, several chunks). */
static void shift_exact(ring *r)
{
    int n = ring_size(r), me = ring_rank(r);
    for (int d = -1; d <= n + 1; d++) {
        int from = ((me - d) % n + n) % n;
        size_t sn = shift_len(me, d), rn = shift_len(from, d);
        uint8_t *snd = malloc(sn + 1), *rcv = malloc(rn + 1);
        for (size_t i = 0; i < sn; i++)
            snd[i] = shift_byte(me, d, i);
        memset(rcv, 0, rn + 1);
        int rc = ring_shift_by(r, d, snd, sn, rcv, rn, NULL);
        if (rc != 0)
            FAIL("ring_shift_by %d: %s", d, rk_last_error());
        for (size_t i = 0; i < rn; i++)
            if (rcv[i] != shift_byte(from, d, i))
                FAIL("ring_shift_by %d: byte %zu of %zu from %d is %u", d, i, rn, from, rcv[i]);
        if (rcv[rn] != 0)
            FAIL("ring_shift_by %d: wrote past %zu bytes", d, rn);
        free(snd);
        free(rcv);
    }
}

static int mode_exact(rk_ctx *ctx)
{
    int *who = iota(g_world), checks = 0;
    for (size_t d = 0; d < RK_ARRAY_LEN(DTYPES); d++)
        for (size_t o = 0; o < RK_ARRAY_LEN(OPS); o++)
            for (size_t c = 0; c < RK_ARRAY_LEN(COUNTS); c++) {
                if (is_int(DTYPES[d]) && OPS[o] == RK_AVG)
                    continue;
                check_one(via_api, ctx, DTYPES[d], OPS[o], COUNTS[c], who, g_world, g_rank, 1);
                checks++;
            }
    printf("ok exact rank %d world %d checks %d\n", g_rank, g_world, checks);
    /* Determinism: the same call twice gives the same bits (inv. 3). */
    size_t n = 300001;
    float *a = malloc(n * 4), *b = malloc(n * 4);
    fill(a, RK_F32, n, g_rank, 7);
    fill(b, RK_F32, n, g_rank, 7);
    if (rk_allreduce(ctx, a, n, RK_F32, RK_SUM) != 0 || rk_allreduce(ctx, b, n, RK_F32, RK_SUM) != 0)
        FAIL("determinism allreduce failed");
    if (memcmp(a, b, n * 4) != 0)
        FAIL("two identical allreduces differ");
    printf("ok deterministic rank %d\n", g_rank);
    free(a);
    free(b);
    /* Tiny chunks and a window of 3: a long pipeline, the same reference (inv. 3, 6). */
    ring *r = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 60000) != 0 || ring_set_chunking(r, 256, 3) != 0)
        FAIL("ring_create: %s", rk_last_error());
    for (size_t d = 0; d < 4; d++)
        check_one(via_ring, r, DTYPES[d], RK_AVG, 4099, who, g_world, g_rank, 3);
    check_one(via_ring, r, RK_F64, RK_SUM, (1u << 20) + 3, who, g_world, g_rank, 4);
    printf("ok pipelined rank %d\n", g_rank);
    shift_exact(r);
    printf("ok shift rank %d\n", g_rank);
    ring_destroy(&r);
    free(who);
    return 0;
}

static bool always(void *arg)
{
    return *(int *)arg != 0;
}

static void expect(int got, int want, const char *what)
{
    if (got != want)
        FAIL("%s: got %d (%s), want %d (%s)", what, got, rk_strerror(got), want, rk_strerror(want));
}

static int mode_bad(void)
{
    ring *r = NULL;
    int *who = iota(g_world), last = g_world - 1;
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 60000) != 0)
        FAIL("ring_create");
    float buf[64] = {0};
    int rc;
    /* NULL buffer on rank 1 (inv. 4): -EINVAL there, a mismatch everywhere else. */
    rc = ring_allreduce(r, g_rank == 1 ? NULL : buf, 64, RK_F32, RK_SUM, NULL);
    expect(rc, g_rank == 1 ? -22 : RK_E_COLL_MISMATCH, "NULL buffer on rank 1");
    rc = ring_allreduce(r, buf, 64, g_rank == 0 ? (rk_dtype)99 : RK_F32, RK_SUM, NULL);
    expect(rc, g_rank == 0 ? RK_E_DTYPE : RK_E_COLL_MISMATCH, "unknown dtype on rank 0");
    rc = ring_allreduce(r, buf, 64, RK_F32, g_rank == last ? (rk_op)42 : RK_MAX, NULL);
    expect(rc, g_rank == last ? RK_E_OP : RK_E_COLL_MISMATCH, "unknown op on the last rank");
    rc = ring_allreduce(r, buf, 64, RK_I32, RK_AVG, NULL);
    expect(rc, RK_E_OP, "avg of integers");
    rc = ring_allreduce(r, buf, g_rank == last ? 63 : 64, RK_F32, RK_SUM, NULL);
    expect(rc, RK_E_COLL_MISMATCH, "counts 64 vs 63");
    rc = ring_allreduce(r, buf, g_rank == 0 ? 0 : 5, RK_F32, RK_SUM, NULL);
    expect(rc, RK_E_COLL_MISMATCH, "counts 0 vs 5");
    rc = ring_allreduce(r, buf, 64, g_rank == 1 ? RK_F32 : RK_I32, RK_SUM, NULL);
    expect(rc, RK_E_COLL_MISMATCH, "dtypes differ");
    printf("ok bad-arguments rank %d\n", g_rank);
    /* A cancelled call on rank 0 (the membership source fired): every rank fails with
       RK_E_PEER_LOST, none waits for its deadline. */
    int yes = g_rank == 0;
    ring_cancel c = {.deadline_ns = 0, .changed = always, .arg = &yes};
    rc = ring_allreduce(r, buf, 64, RK_F32, RK_SUM, &c);
    expect(rc, RK_E_PEER_LOST, "cancelled on rank 0");
    printf("ok cancelled rank %d\n", g_rank);
    /* The ring is usable after all of that: stale messages are dropped (inv. 5). */
    check_one(via_ring, r, RK_F32, RK_SUM, 100003, who, g_world, g_rank, 9);
    printf("ok usable-after-errors rank %d\n", g_rank);
    /* Fenced: a rebuild that excludes rank 0 (alive) fences it; the others go on. */
    int *rest = who + 1;
    rc = ring_rebuild(r, rest, g_world - 1, 1, NULL);
    expect(rc, g_rank == 0 ? RK_E_FENCED : 0, "rebuild without rank 0");
    if (g_rank == 0) {
        expect(ring_allreduce(r, buf, 64, RK_F32, RK_SUM, NULL), RK_E_FENCED, "allreduce when fenced");
    } else {
        if (ring_rank(r) != g_rank - 1 || ring_size(r) != g_world - 1)
            FAIL("renumbering: rank %d size %d", ring_rank(r), ring_size(r));
        check_one(via_ring, r, RK_F64, RK_SUM, 5003, rest, g_world - 1, g_rank - 1, 10);
    }
    printf("ok fenced rank %d\n", g_rank);
    ring_destroy(&r);
    free(who);
    return 0;
}

/* ---- kill: the membership oracle and the hook ---------------------------------------- */

struct oracle {
    int *pids, n;        /* job rank -> pid */
    const int *members;  /* job ranks of the ring's members */
    int nmembers;
    int64_t next_ns;
};

static bool oracle_changed(void *arg)
{
    struct oracle *o = arg;
    int64_t now = rk__mono_ns();
    if (now < o->next_ns)
        return false;
    o->next_ns = now + 2000000; /* every 2 ms */
    for (int i = 0; i < o->nmembers; i++)
        if (prog_pid_dead(o->pids[o->members[i]]))
            return true;
    return false;
}

struct kill_at {
    int phase, step;
};

static void kill_hook(void *arg, int phase, int step, int chunk)
{
    struct kill_at *k = arg;
    if (phase == k->phase && step == k->step && chunk == 1)
        raise(SIGKILL);
}

/* Rebuilds *r over surv (job ranks, ascending) at `epoch`, checks the renumbering and two
   exact allreduces on the new ring, prints "ok rebuilt ...", destroys the ring. */
static void rebuild_exact(ring **r, const int *surv, int ns, uint64_t epoch)
{
    int64_t t0 = rk__mono_ns();
    expect(ring_rebuild(*r, surv, ns, epoch, NULL), 0, "rebuild");
    int want_rank = -1;
    for (int i = 0; i < ns; i++)
        if (surv[i] == g_rank)
            want_rank = i;
    if (ring_rank(*r) != want_rank || ring_size(*r) != ns)
        FAIL("after rebuild: rank %d size %d, want %d %d", ring_rank(*r), ring_size(*r), want_rank, ns);
    double rebuild_ms = rk__ms_since(t0);
    check_one(via_ring, *r, RK_F32, RK_SUM, 100003, surv, ns, want_rank, 6);
    check_one(via_ring, *r, RK_BF16, RK_AVG, 4099, surv, ns, want_rank, 8);
    printf("ok rebuilt rank %d -> %d world %d rebuild %.1f ms\n", g_rank, want_rank, ns, rebuild_ms);
    fflush(stdout);
    ring_destroy(r);
}

static int mode_kill(int victim, int phase, int step, bool deadline, bool spare)
{
    int m = spare ? g_world - 1 : g_world; /* ring members: job ranks 0 .. m-1 */
    int *pids = malloc((size_t)g_world * sizeof(int)), me = getpid();
    MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
    int *members = iota(m);
    ring *r = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, members, m, 60000) != 0 || ring_set_chunking(r, 4096, 4) != 0)
        FAIL("ring_create: %s", rk_last_error());
    struct oracle o = {.pids = pids, .n = g_world, .members = members, .nmembers = m};
    int64_t t0;
    if (ring_is_member(r)) {
        struct kill_at k = {phase, step};
        if (g_rank == victim)
            ring_set_test_hook(r, kill_hook, &k);
        size_t n = 65536 + 5;
        float *buf = malloc(n * 4), *snap = malloc(n * 4);
        fill(buf, RK_F32, n, g_rank, 5);
        ring_cancel c = {.deadline_ns = deadline ? rk__deadline_ns(3000) : INT64_MAX,
                         .changed = deadline ? NULL : oracle_changed, .arg = &o};
        t0 = rk__mono_ns();
        int rc = ring_allreduce(r, buf, n, RK_F32, RK_SUM, &c);
        if (g_rank == victim)
            FAIL("the victim survived its hook");
        if (rc == 0) {
            /* The loss came too late for this member: everything it needed had arrived,
               and its sends to the dead member were accepted (TCP takes them into the
               kernel's buffers). Not all or nothing (docs/RING.md), but exact. */
            float *ref = malloc(n * 4);
            reference(ref, RK_F32, RK_SUM, n, members, m, 5);
            if (memcmp(buf, ref, n * 4) != 0)
                FAIL("rank %d finished the call its member died in, with a result that is not exact", g_rank);
            free(ref);
            printf("ok finished exactly rank %d after %.0f ms\n", g_rank, rk__ms_since(t0));
        } else {
            expect(rc, deadline ? RK_E_TIMEOUT : RK_E_PEER_LOST, "allreduce with a dead member");
            printf("ok aborted rank %d after %.0f ms\n", g_rank, rk__ms_since(t0));
        }
        /* Invariant 2: nothing writes into the buffer after the call returned. */
        memcpy(snap, buf, n * 4);
        rk__sleep_ns(200000000);
        int flag; /* drive MPI's progress engine a little */
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        if (memcmp(snap, buf, n * 4) != 0)
            FAIL("the buffer changed after the aborted call returned");
        free(buf);
        free(snap);
    } else {
        /* The spare waits (bounded) until the oracle reports the loss. */
        int64_t until = rk__deadline_ns(60000);
        while (!oracle_changed(&o) && !rk__deadline_passed(until))
            rk__sleep_ns(1000000);
    }
    /* Survivors agree on the list: the members still alive, plus the spare. */
    int *surv = malloc((size_t)g_world * sizeof(int)), ns = 0;
    for (int i = 0; i < m; i++)
        if (members[i] != victim)
            surv[ns++] = members[i];
    if (spare)
        surv[ns++] = g_world - 1;
    rebuild_exact(&r, surv, ns, 1);
    free(surv);
    free(members);
    free(pids);
    return 0;
}

static int mode_rebuild_kill(int victim)
{
    int *pids = malloc((size_t)g_world * sizeof(int)), me = getpid();
    MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
    int *members = iota(g_world);
    ring *r = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 60000) != 0 || ring_set_chunking(r, 4096, 4) != 0)
        FAIL("ring_create: %s", rk_last_error());
    check_one(via_ring, r, RK_F32, RK_SUM, 10007, members, g_world, g_rank, 5);
    struct oracle o = {.pids = pids, .n = g_world, .members = members, .nmembers = g_world};
    if (g_rank == victim) {
        setenv("RK_FAULT", "rebuild@0=crash", 1);
        if (rk__fault_reset() != 0)
            FAIL("RK_FAULT=rebuild@0=crash refused: %s", rk_last_error());
    }
    ring_cancel c = {.deadline_ns = rk__deadline_ns(20000), .changed = oracle_changed, .arg = &o};
    int64_t t0 = rk__mono_ns();
    int rc = ring_rebuild(r, members, g_world, 1, &c);
    if (g_rank == victim)
        FAIL("the victim survived its rebuild");
    if (rc != 0 && rc != RK_E_PEER_LOST) /* PEER_LOST: it saw the death inside its handshake */
        FAIL("rebuild with a member dying in it: %s", rk_strerror(rc));
    if (rc == 0) { /* the death is reported by the next call, within its bound */
        size_t n = 65536 + 5;
        float *buf = malloc(n * 4);
        fill(buf, RK_F32, n, g_rank, 5);
        ring_cancel c2 = {.deadline_ns = rk__deadline_ns(20000), .changed = oracle_changed, .arg = &o};
        expect(ring_allreduce(r, buf, n, RK_F32, RK_SUM, &c2), RK_E_PEER_LOST, "allreduce after the rebuild");
        free(buf);
    }
    printf("ok rebuild-returned rank %d (%s) after %.0f ms\n", g_rank, rk_strerror(rc), rk__ms_since(t0));
    int *surv = malloc((size_t)g_world * sizeof(int)), ns = 0;
    for (int i = 0; i < g_world; i++)
        if (i != victim)
            surv[ns++] = i;
    rebuild_exact(&r, surv, ns, 2);
    free(surv);
    free(members);
    free(pids);
    return 0;
}

static int mode_rebuild_early(int first)
{
    int *members = iota(g_world);
    ring *r = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 60000) != 0 || ring_set_chunking(r, 4096, 4) != 0)
        FAIL("ring_create: %s", rk_last_error());
    check_one(via_ring, r, RK_F32, RK_SUM, 10007, members, g_world, g_rank, 5);
    if (g_rank != first) {
        size_t n = 65536 + 5;
        float *buf = malloc(n * 4);
        fill(buf, RK_F32, n, g_rank, 5);
        ring_cancel c = {.deadline_ns = rk__deadline_ns(20000)};
        int64_t t0 = rk__mono_ns();
        expect(ring_allreduce(r, buf, n, RK_F32, RK_SUM, &c), RK_E_PEER_LOST,
               "allreduce while a member rebuilds");
        printf("ok left-epoch rank %d after %.0f ms\n", g_rank, rk__ms_since(t0));
        free(buf);
    }
    rebuild_exact(&r, members, g_world, 1);
    free(members);
    return 0;
}

/* ---- shift-mismatch ------------------------------------------------------------------ */

struct shift_case {
    const char *what;
    int dist, sender;      /* the pair: ring rank `sender` sends to sender + dist, */
    size_t sends, expects; /* `sends` bytes, where its receiver expects `expects` */
    bool null_recv;        /* or: the receiver passes a NULL recv with `expects` bytes */
};

/* One shift_by in which every member sends `base` bytes but the pair of c. */
static void shift_case(ring *r, const struct shift_case *c, size_t base)
{
    int n = ring_size(r), me = ring_rank(r), d = ((c->dist % n) + n) % n;
    if (d == 0)
        return; /* to itself: no pair */
    int S = c->sender % n, R = (S + d) % n, from = (me + n - d) % n;
    size_t sn = me == S ? c->sends : base, rn = me == R ? c->expects : base;
    bool null = c->null_recv && me == R;
    uint8_t *snd = malloc(sn + 1), *rcv = calloc(rn + 1, 1);
    for (size_t i = 0; i < sn; i++)
        snd[i] = shift_byte(me, d, i);
    ring_cancel cc = {.deadline_ns = rk__deadline_ns(20000)};
    int64_t t0 = rk__mono_ns();
    int rc = ring_shift_by(r, c->dist, snd, sn, null ? NULL : rcv, rn, &cc);
    double ms = rk__ms_since(t0);
    /* The pair fails; with a NULL buffer the receiver refuses (-EINVAL), which fails the
       member sending to it and the member it sends to. */
    bool hurt_recv = c->null_recv ? me == R || me == (R + d) % n : me == R;
    int want = null ? -EINVAL : (me == S || hurt_recv) ? RK_E_COLL_MISMATCH : 0;
    if (rc != want)
        FAIL("shift %s: got %d (%s), want %d: %s", c->what, rc, rk_strerror(rc), want, rc ? rk_last_error() : "");
    if (ms > 10000)
        FAIL("shift %s: returned after %.0f ms: it waited for the deadline", c->what, ms);
    if (!hurt_recv) /* this member's receive was not the pair's: exact, whatever its send met */
        for (size_t i = 0; i < rn; i++)
            if (rcv[i] != shift_byte(from, d, i))
                FAIL("shift %s: byte %zu of %zu from %d is %u", c->what, i, rn, from, rcv[i]);
    printf("ok shift-mismatch %s rank %d: %s after %.0f ms\n", c->what, g_rank, rk_strerror(rc), ms);
    free(snd);
    free(rcv);
}

static int mode_shift_mismatch(void)
{
    int *who = iota(g_world);
    ring *r = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 60000) != 0 || ring_set_chunking(r, 4096, 4) != 0)
        FAIL("ring_create: %s", rk_last_error());
    const struct shift_case cases[] = {
        {"fewer-chunks-expected", 1, 1, 3 * 4096, 4096, false},
        {"more-expected", 1, 0, 100, 50000, false},
        {"long-send", 1, 1, 200000, 200, false},
        {"nothing-expected", 1, 0, 5000, 0, false},
        {"distance-2", 2, 1, 4096, 4097, false},
        {"null-receive", 1, 0, 5000, 5000, true},
    };
    for (size_t i = 0; i < RK_ARRAY_LEN(cases); i++)
        shift_case(r, &cases[i], 5000);
    /* The ring is exact after them: whatever they left queued is dropped (inv. 5). */
    shift_exact(r);
    check_one(via_ring, r, RK_F32, RK_SUM, 100003, who, g_world, g_rank, 9);
    printf("ok shift-after-mismatch rank %d\n", g_rank);
    ring_destroy(&r);
    free(who);
    return 0;
}

/* ---- epoch-wrap, no-memory ----------------------------------------------------------- */

/* Rank 0 alone: an allreduce of 100003 floats that times out after 300 ms with its first
   chunks and its token sent to rank 1, which is not in the call. */
static void alone_times_out(ring *r, size_t n, unsigned salt)
{
    float *buf = malloc(n * 4);
    fill(buf, RK_F32, n, g_rank, salt);
    ring_cancel c = {.deadline_ns = rk__deadline_ns(300)};
    expect(ring_allreduce(r, buf, n, RK_F32, RK_SUM, &c), RK_E_TIMEOUT, "allreduce alone");
    free(buf);
}

static int mode_epoch_wrap(void)
{
    int *who = iota(g_world), flag = 0;
    void *ub = NULL;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (!flag || *(int *)ub < (1 << 24) - 1) { /* 4 bits of epoch in the tags: 16 wraps */
        printf("ok epoch-wrap rank %d: not run, MPI_TAG_UB %d\n", g_rank, flag ? *(int *)ub : -1);
        free(who);
        return 0;
    }
    ring *r = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 60000) != 0 || ring_set_chunking(r, 4096, 4) != 0)
        FAIL("ring_create: %s", rk_last_error());
    if (g_rank == 0)
        alone_times_out(r, 100003, 12); /* call 1 of epoch 0 */
    MPI_Barrier(MPI_COMM_WORLD);
    /* Eight recoveries' worth of epochs (each advances it by 2 or more): call 1 of epoch 16
       has the same sequence number and signature as the stale one. */
    expect(ring_rebuild(r, who, g_world, 16, NULL), 0, "rebuild to epoch 16");
    check_one(via_ring, r, RK_F32, RK_SUM, 100003, who, g_world, g_rank, 11);
    printf("ok epoch-wrap rank %d\n", g_rank);
    ring_destroy(&r);
    free(who);
    return 0;
}

#if defined(__SANITIZE_ADDRESS__)
#define PROG_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PROG_ASAN 1
#endif
#endif

#if !defined(PROG_ASAN)
static size_t vm_bytes(void)
{
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%lu", &pages) != 1)
        FAIL("/proc/self/statm");
    fclose(f);
    return (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
}
#endif

static int mode_no_memory(void)
{
#if defined(PROG_ASAN)
    printf("ok no-memory rank %d: not run under ASan\n", g_rank);
    return 0;
#else
    int *who = iota(g_world);
    ring *r = NULL;
    /* 2 x 2 slots of 32 MiB: fresh ones need 128 MiB, more than the limit leaves. */
    if (ring_create(&r, MPI_COMM_WORLD, NULL, 0, 60000) != 0 || ring_set_chunking(r, 32u << 20, 2) != 0)
        FAIL("ring_create: %s", rk_last_error());
    if (g_rank == 0) {
        size_t n = (size_t)g_world << 21; /* 8 MiB a segment: a send that waits for rank 1 */
        float *buf = malloc(n * 4);
        fill(buf, RK_F32, n, g_rank, 3);
        struct rlimit old, lim;
        if (getrlimit(RLIMIT_AS, &old) != 0)
            FAIL("getrlimit");
        lim = old;
        lim.rlim_cur = vm_bytes() + (64u << 20);
        if (setrlimit(RLIMIT_AS, &lim) != 0)
            FAIL("setrlimit: %s", strerror(errno));
        ring_cancel c = {.deadline_ns = rk__deadline_ns(300)};
        int rc1 = ring_allreduce(r, buf, n, RK_F32, RK_SUM, &c);
        c.deadline_ns = rk__deadline_ns(300);
        int rc2 = ring_allreduce(r, buf, n, RK_F32, RK_SUM, &c);
        if (setrlimit(RLIMIT_AS, &old) != 0)
            FAIL("setrlimit back: %s", strerror(errno));
        expect(rc1, RK_E_TIMEOUT, "allreduce alone, its abort without memory for fresh slots");
        expect(rc2, -ENOMEM, "the next allreduce, without slots");
        free(buf);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    expect(ring_rebuild(r, who, g_world, 2, NULL), 0, "rebuild");
    check_one(via_ring, r, RK_F32, RK_SUM, 100003, who, g_world, g_rank, 13);
    printf("ok no-memory rank %d\n", g_rank);
    ring_destroy(&r);
    free(who);
    return 0;
#endif
}

/* ---- blob: ring_share_blob with a fake NCCL unique id -------------------------------- */

static void fake_id(unsigned char *id, size_t n, unsigned salt)
{
    for (size_t i = 0; i < n; i++)
        id[i] = (unsigned char)(mix(salt * 1000003u + i) & 0xff);
}

static void blob_round(ring *r, unsigned salt, const char *what)
{
    unsigned char id[128], want[128];
    fake_id(want, sizeof(want), salt);
    if (ring_rank(r) == 0)
        memcpy(id, want, sizeof(id));
    else
        memset(id, 0, sizeof(id));
    expect(ring_share_blob(r, id, sizeof(id), NULL), 0, what);
    if (memcmp(id, want, sizeof(id)) != 0)
        FAIL("%s: the blob differs from rank 0's", what);
}

static int mode_blob(void)
{
    int m = g_world - 1; /* the last rank is a spare */
    int *members = iota(m);
    ring *r = NULL;
    if (ring_create(&r, MPI_COMM_WORLD, members, m, 20000) != 0)
        FAIL("ring_create: %s", rk_last_error());
    unsigned char id[128];
    if (!ring_is_member(r)) {
        expect(ring_share_blob(r, id, sizeof(id), NULL), RK_E_STATE, "a spare's exchange");
    } else {
        expect(ring_share_blob(r, NULL, sizeof(id), NULL), -EINVAL, "a NULL blob");
        blob_round(r, 1, "first exchange");
        /* Rank 0 alone sends another (nobody receives it now: it stays queued), then every
           member makes an allreduce (the call number moves on) and the next exchange. */
        if (ring_rank(r) == 0) {
            fake_id(id, sizeof(id), 99);
            expect(ring_share_blob(r, id, sizeof(id), NULL), 0, "rank 0's lone exchange");
        }
        float x = 1.0f;
        expect(ring_allreduce(r, &x, 1, RK_F32, RK_SUM, NULL), 0, "allreduce between exchanges");
        blob_round(r, 2, "exchange after a lone one");
        /* A receiver alone: its deadline ends the wait, nothing is taken. */
        expect(ring_allreduce(r, &x, 1, RK_F32, RK_SUM, NULL), 0, "allreduce before the lone receiver");
        if (ring_rank(r) == 1) {
            int64_t t0 = rk__mono_ns();
            ring_cancel c = {.deadline_ns = rk__deadline_ns(300)};
            expect(ring_share_blob(r, id, sizeof(id), &c), RK_E_TIMEOUT, "a lone receiver");
            if (rk__ms_since(t0) > 5000)
                FAIL("the lone receiver waited %.0f ms for a 300 ms deadline", rk__ms_since(t0));
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("ok blob rank %d\n", g_rank);
    ring_destroy(&r);
    free(members);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: prog_ring exact|bad|kill V PHASE STEP [deadline] [spare]|rebuild-kill V"
                        "|rebuild-early V|shift-mismatch|epoch-wrap|no-memory|blob\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    rk_ctx *ctx = prog_rk_init();
    if (!ctx)
        return 3;
    int rc;
    g_rank = rk_rank(ctx);
    g_world = rk_world(ctx);
    if (strcmp(argv[1], "exact") == 0) {
        rc = mode_exact(ctx);
    } else if (strcmp(argv[1], "bad") == 0) {
        rc = mode_bad();
    } else if (strcmp(argv[1], "kill") == 0 && argc >= 5) {
        bool dl = false, sp = false;
        for (int i = 5; i < argc; i++) {
            dl |= strcmp(argv[i], "deadline") == 0;
            sp |= strcmp(argv[i], "spare") == 0;
        }
        rc = mode_kill(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), dl, sp);
        /* A member is dead: MPI_Finalize would wait for it. Leave without it. */
        fflush(stdout);
        _exit(rc);
    } else if (strcmp(argv[1], "rebuild-kill") == 0 && argc >= 3) {
        rc = mode_rebuild_kill(atoi(argv[2]));
        fflush(stdout);
        _exit(rc);
    } else if (strcmp(argv[1], "rebuild-early") == 0 && argc >= 3) {
        rc = mode_rebuild_early(atoi(argv[2]));
    } else if (strcmp(argv[1], "shift-mismatch") == 0) {
        rc = mode_shift_mismatch();
    } else if (strcmp(argv[1], "epoch-wrap") == 0) {
        rc = mode_epoch_wrap();
    } else if (strcmp(argv[1], "no-memory") == 0) {
        rc = mode_no_memory();
    } else if (strcmp(argv[1], "blob") == 0) {
        rc = mode_blob();
    } else {
        fprintf(stderr, "prog_ring: unknown mode %s\n", argv[1]);
        rc = 2;
    }
    int frc = rk_finalize(&ctx);
    return rc != 0 ? rc : frc != 0 ? 4 : 0;
}
