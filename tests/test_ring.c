/*
 * tests/test_ring.c - the allreduce ring (ring/): reduction kernels and 16-bit
 * conversions as unit tests; then real mpirun jobs of tests/prog_ring (exact results on
 * 1..5 ranks, bad arguments, a member killed in each phase, a spare joining, a member
 * killed inside a rebuild, shifts whose lengths differ, a stale message eight recoveries
 * old, an abort without memory for fresh slots, the NCCL unique id's exchange with a fake
 * id). The NCCL ring's membership logic (shrink plan, NCCL_HOSTID) as unit tests, and the
 * values its GPU checks compare bit for bit (tests/ring_exact.h: exact in every order).
 * Each test names the invariant of ring/ring.c it checks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ring/ring.h"
#include "harness.h"
#include "ring_exact.h"

/* ---- conversions --------------------------------------------------------------------- */

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The exhaustive loops below call Check only on a mismatch: every ck_assert records its
   place, which under the sanitizers made these two tests take most of their minute. */
START_TEST(f16_matches_compiler)
{
    /* Every half to float, and back (the compiler's _Float16 is IEEE binary16, RNE). */
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 c;
        uint16_t hh = (uint16_t)h;
        memcpy(&c, &hh, 2);
        float mine = ring_f16_to_f32(hh), theirs = (float)c;
        if (isnan(theirs)) {
            if (!isnan(mine))
                ck_abort_msg("half %#x: %a, want a NaN", h, mine);
            continue;
        }
        if (memcmp(&mine, &theirs, 4) != 0)
            ck_abort_msg("half %#x: %a vs %a", h, mine, theirs);
        if (ring_f32_to_f16(mine) != hh)
            ck_abort_msg("half %#x: back to %#x", h, ring_f32_to_f16(mine));
    }
    /* Floats across every exponent, with mantissas at and around the rounding points. */
    uint32_t seed = 12345;
    for (uint32_t e = 0; e < 256; e++)
        for (int k = 0; k < 2000; k++) {
            seed = seed * 1664525u + 1013904223u;
            uint32_t mant = k < 8 ? (0xfffu + (uint32_t)k - 4u) | 0x1000u : seed & 0x7fffffu;
            uint32_t u = (seed & 0x80000000u) | e << 23 | (mant & 0x7fffffu);
            float f = bits_f(u);
            if (isnan(f))
                continue;
            _Float16 c = (_Float16)f;
            uint16_t want;
            memcpy(&want, &c, 2);
            if (ring_f32_to_f16(f) != want)
                ck_abort_msg("float %a: %#x vs %#x", f, ring_f32_to_f16(f), want);
        }
    ck_assert(isnan(ring_f16_to_f32(ring_f32_to_f16(NAN))));
}
END_TEST

/* bf16 round to nearest even, computed independently: pick the nearer neighbour in double. */
static uint16_t bf16_ref(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    double dlo = (double)bits_f((uint32_t)lo << 16), dhi = (double)bits_f((uint32_t)hi << 16);
    if ((hi & 0x7f80) == 0x7f80 && (lo & 0x7f80) != 0x7f80) /* rounding up overflows */
        dhi = copysign(ldexp(1.0, 128), f);
    double a = fabs((double)f - dlo), b = fabs((double)f - dhi);
    return a < b ? lo : b < a ? hi : (lo & 1) ? hi : lo;
}

START_TEST(bf16_round_nearest_even)
{
    uint32_t seed = 777;
    for (int i = 0; i < 2000000; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint32_t u = i < 65536 ? ((uint32_t)i << 16) | 0x8000u : seed;
        float f = bits_f(u);
        if (isnan(f) || isinf(f))
            continue;
        if (ring_f32_to_bf16(f) != bf16_ref(f))
            ck_abort_msg("float %a (%#x): %#x vs %#x", f, u, ring_f32_to_bf16(f), bf16_ref(f));
        uint16_t b = (uint16_t)(u >> 16);
        if (!isnan(ring_bf16_to_f32(b)) && ring_f32_to_bf16(ring_bf16_to_f32(b)) != b)
            ck_abort_msg("bf16 %#x: back to %#x", b, ring_f32_to_bf16(ring_bf16_to_f32(b)));
    }
    ck_assert(isnan(ring_bf16_to_f32(ring_f32_to_bf16(NAN))));
}
END_TEST

/* ---- kernels (invariant 3: out = acc op in, fixed operand order) -------------------- */

START_TEST(kernels_float_ops)
{
    float acc[5] = {1.0f, -0.0f, NAN, 2.0f, 3.0f}, in[5] = {2.0f, 0.0f, 1.0f, NAN, 3.0f}, out[5];
    th_assert_rc(ring_reduce(out, acc, in, 5, RK_F32, RK_MAX, 0), 0);
    ck_assert(out[0] == 2.0f && signbit(out[1]) && isnan(out[2]) && isnan(out[3]) && out[4] == 3.0f);
    th_assert_rc(ring_reduce(out, acc, in, 5, RK_F32, RK_MIN, 0), 0);
    ck_assert(out[0] == 1.0f && signbit(out[1]) && isnan(out[2]) && isnan(out[3]));
    th_assert_rc(ring_reduce(out, acc, in, 1, RK_F32, RK_AVG, 0), 0);
    ck_assert(out[0] == 3.0f); /* avg adds until the last hop */
    th_assert_rc(ring_reduce(out, acc, in, 1, RK_F32, RK_AVG, 4), 0);
    ck_assert(out[0] == 0.75f);
    double da[2] = {1e308, 0.1}, di[2] = {1e308, 0.2}, dout[2];
    th_assert_rc(ring_reduce(dout, da, di, 2, RK_F64, RK_SUM, 0), 0);
    ck_assert(isinf(dout[0]) && dout[1] == 0.1 + 0.2);
}
END_TEST

START_TEST(kernels_16bit_round_once_per_hop)
{
    /* 2049 is not a half (ulp 2 there): the sum of 2048 and 1 rounds to even (2048). For
       the last hop of avg it is divided in f32 before rounding: 2049 / 3 = 683 exactly. */
    uint16_t a[1] = {ring_f32_to_f16(2048.0f)}, b[1] = {ring_f32_to_f16(1.0f)}, o[1];
    th_assert_rc(ring_reduce(o, a, b, 1, RK_F16, RK_SUM, 0), 0);
    ck_assert(ring_f16_to_f32(o[0]) == 2048.0f);
    th_assert_rc(ring_reduce(o, a, b, 1, RK_F16, RK_AVG, 3), 0);
    ck_assert(ring_f16_to_f32(o[0]) == 683.0f);
    uint16_t x[1] = {ring_f32_to_bf16(256.0f)}, y[1] = {ring_f32_to_bf16(1.0f)};
    th_assert_rc(ring_reduce(o, x, y, 1, RK_BF16, RK_SUM, 0), 0);
    ck_assert(ring_bf16_to_f32(o[0]) == 256.0f); /* 257 is not a bf16: ties to even */
    th_assert_rc(ring_reduce(o, x, y, 1, RK_BF16, RK_MAX, 0), 0);
    ck_assert(ring_bf16_to_f32(o[0]) == 256.0f);
}
END_TEST

START_TEST(kernels_integers_wrap)
{
    int32_t a[2] = {INT32_MAX, -5}, b[2] = {1, 7}, o[2];
    th_assert_rc(ring_reduce(o, a, b, 2, RK_I32, RK_SUM, 0), 0);
    ck_assert(o[0] == INT32_MIN && o[1] == 2);
    th_assert_rc(ring_reduce(o, a, b, 2, RK_I32, RK_MIN, 0), 0);
    ck_assert(o[0] == 1 && o[1] == -5);
    uint8_t u[1] = {250}, v[1] = {10}, w[1];
    th_assert_rc(ring_reduce(w, u, v, 1, RK_U8, RK_SUM, 0), 0);
    ck_assert_uint_eq(w[0], 4);
    int64_t p[1] = {INT64_MIN}, q[1] = {-1}, r[1];
    th_assert_rc(ring_reduce(r, p, q, 1, RK_I64, RK_SUM, 0), 0);
    ck_assert(r[0] == INT64_MAX);
    th_assert_rc(ring_reduce(o, a, b, 2, RK_I32, RK_AVG, 2), RK_E_OP);
    th_assert_rc(ring_reduce(o, a, b, 2, (rk_dtype)77, RK_SUM, 0), RK_E_DTYPE);
    th_assert_rc(ring_reduce(o, a, b, 2, RK_F32, (rk_op)9, 0), RK_E_OP);
}
END_TEST

START_TEST(segments_cover_exactly)
{
    size_t counts[] = {0, 1, 2, 7, 4099, 1000003};
    for (size_t c = 0; c < RK_ARRAY_LEN(counts); c++)
        for (int n = 1; n <= 9; n++) {
            size_t next = 0;
            for (int s = 0; s < n; s++) {
                size_t off, len;
                ring_segment(counts[c], n, s, &off, &len);
                ck_assert_uint_eq(off, next);
                ck_assert(len == counts[c] / (size_t)n || len == counts[c] / (size_t)n + 1);
                next = off + len;
            }
            ck_assert_uint_eq(next, counts[c]);
        }
}
END_TEST

/* ---- jobs ---------------------------------------------------------------------------- */

static char *prog(void)
{
    char *p = th_prog("prog_ring");
    ck_assert(p);
    return p;
}

static int count_lines(const char *out, const char *prefix)
{
    int n = 0;
    for (const char *p = out; p && (p = strstr(p, prefix)); p++)
        if (p == out || p[-1] == '\n')
            n++;
    return n;
}

/* Runs prog_ring under mpirun; asserts no FAIL line and `want` lines starting `ok` + tag. */
static void job(int n, bool recovery, char *const args[], const char *tag, int want)
{
    char *p = prog();
    char *out = NULL;
    int rc = th_mpirun_prog(n, recovery, p, args, NULL, 150, &out);
    ck_assert_msg(out && !strstr(out, "FAIL"), "prog_ring %s on %d ranks failed (rc %d):\n%s", args[0], n, rc,
                  out ? out : "");
    int got = count_lines(out, tag);
    ck_assert_msg(got == want, "%d lines '%s', want %d (rc %d):\n%s", got, tag, want, rc, out);
    if (!recovery)
        ck_assert_msg(rc == 0, "prog_ring exit %d:\n%s", rc, out);
    free(out);
    free(p);
}

/* Invariant 3 (exact, fixed order, reproducible), 6 (tiny chunks) on 1..5 ranks, and
   ring_shift_by at every distance. */
static void exact(int n)
{
    char *args[] = {"exact", NULL};
    job(n, false, args, "ok shift ", n);
}
START_TEST(exact_1) { exact(1); }
END_TEST
START_TEST(exact_2) { exact(2); }
END_TEST
START_TEST(exact_3) { exact(3); }
END_TEST
START_TEST(exact_4) { exact(4); }
END_TEST
START_TEST(exact_5) { exact(5); }
END_TEST

/* Invariant 4 (every member fails on bad or different arguments) and 5 (usable after). */
START_TEST(bad_arguments_3)
{
    char *args[] = {"bad", NULL};
    job(3, false, args, "ok fenced ", 3);
}
END_TEST
START_TEST(bad_arguments_4)
{
    char *args[] = {"bad", NULL};
    job(4, false, args, "ok usable-after-errors ", 4);
}
END_TEST

/* Invariants 1 and 2: a member SIGKILLed mid-call; survivors return RK_E_PEER_LOST (or
   RK_E_TIMEOUT with only a deadline), their buffers stay untouched, they rebuild the
   ring and the next allreduce is exact. */
START_TEST(kill_in_reduce_scatter)
{
    char *args[] = {"kill", "1", "0", "1", NULL};
    job(4, true, args, "ok rebuilt ", 3);
}
END_TEST
START_TEST(kill_in_allgather)
{
    char *args[] = {"kill", "2", "1", "0", NULL};
    job(4, true, args, "ok rebuilt ", 3);
}
END_TEST
START_TEST(kill_deadline_only)
{
    char *args[] = {"kill", "0", "1", "0", "deadline", NULL};
    job(3, true, args, "ok rebuilt ", 2);
}
END_TEST
START_TEST(kill_spare_joins)
{
    char *args[] = {"kill", "1", "0", "0", "spare", NULL};
    job(4, true, args, "ok rebuilt ", 3); /* 2 survivors + the spare */
}
END_TEST

/* Invariant 7: a member killed inside a rebuild, between its handshake and its end,
   never freezes the survivors (no collective MPI call follows the handshake); they see
   the loss in their next call and rebuild again. */
START_TEST(kill_in_rebuild)
{
    char *args[] = {"rebuild-kill", "2", NULL};
    job(4, true, args, "ok rebuilt ", 3);
}
END_TEST

/* Invariant 5: a member that begins a rebuild while the others are still in a call of
   the old epoch: its handshake ends their call at once (RK_E_PEER_LOST, not the
   deadline) and stays queued for their own rebuild, which completes. */
START_TEST(rebuild_begun_elsewhere)
{
    char *args[] = {"rebuild-early", "1", NULL};
    job(4, false, args, "ok rebuilt ", 4);
}
END_TEST

/* Invariant 4: a shift whose two ends pass different lengths fails at both ends with
   RK_E_COLL_MISMATCH, well before the deadline; the other pairs get their bytes. On 2
   ranks a member's left is also its right, on 4 the pairs are apart. */
START_TEST(shift_length_mismatch_2)
{
    char *args[] = {"shift-mismatch", NULL};
    job(2, false, args, "ok shift-after-mismatch ", 2);
}
END_TEST
START_TEST(shift_length_mismatch_4)
{
    char *args[] = {"shift-mismatch", NULL};
    job(4, false, args, "ok shift-after-mismatch ", 4);
}
END_TEST

/* Invariant 5: a message left queued in epoch 0 is still stale in epoch 16 (the data
   tags carry the epoch in every bit MPI_TAG_UB allows, not 4). */
/* ---- the NCCL ring's membership logic (ring_dev.c), checked without a device ---------- */

START_TEST(nccl_shrink_plan)
{
    int excl[8], nex = -1;
    int old[] = {0, 1, 2, 3};
    int drop1[] = {0, 2, 3}, same[] = {0, 1, 2, 3}, spare[] = {0, 2, 4}, last[] = {3};
    ck_assert_int_eq(ring_nccl_plan(old, 4, drop1, 3, excl, &nex), RING_NCCL_SHRINK);
    ck_assert_int_eq(nex, 1);
    ck_assert_int_eq(excl[0], 1);
    ck_assert_int_eq(ring_nccl_plan(old, 4, same, 4, excl, &nex), RING_NCCL_KEEP);
    ck_assert_int_eq(nex, 0);
    ck_assert_int_eq(ring_nccl_plan(old, 4, spare, 3, excl, &nex), RING_NCCL_FRESH);
    ck_assert_int_eq(nex, 0);
    ck_assert_int_eq(ring_nccl_plan(old, 4, last, 1, excl, &nex), RING_NCCL_SHRINK);
    ck_assert_int_eq(nex, 3);
    ck_assert(excl[0] == 0 && excl[1] == 1 && excl[2] == 2);
    /* Growth in place (recover/recovery.c G3): the members all stay and a spare is added
       beyond them: NCCL 2.28 cannot grow a communicator, so every member takes a fresh one
       (recover/api_ring_nccl.c: CAN_FRESH), the spare included. */
    int grown[] = {0, 1, 2, 3, 4};
    ck_assert_int_eq(ring_nccl_plan(old, 4, grown, 5, excl, &nex), RING_NCCL_FRESH);
    ck_assert_int_eq(nex, 0);
    /* NCCL ranks, not job ranks: after an earlier shrink the old list is sparse. */
    int old2[] = {2, 5, 7, 9}, now2[] = {5, 9};
    ck_assert_int_eq(ring_nccl_plan(old2, 4, now2, 2, excl, &nex), RING_NCCL_SHRINK);
    ck_assert_int_eq(nex, 2);
    ck_assert(excl[0] == 0 && excl[1] == 2);
}
END_TEST

START_TEST(nccl_hostid_only_where_a_device_is_shared)
{
    char id[32] = "untouched";
    ck_assert(ring_nccl_hostid(id, sizeof(id), NULL, "node7", 3, 4, 1));
    ck_assert_str_eq(id, "node7-rk3");
    ck_assert(ring_nccl_hostid(id, sizeof(id), "", NULL, 0, 2, 0)); /* no device counted, no name */
    ck_assert_str_eq(id, "host-rk0");
    strcpy(id, "untouched");
    ck_assert(!ring_nccl_hostid(id, sizeof(id), "mine", "node7", 3, 4, 1)); /* the user's stands */
    ck_assert(!ring_nccl_hostid(id, sizeof(id), NULL, "node7", 3, 4, 4));   /* a device each */
    ck_assert(!ring_nccl_hostid(id, sizeof(id), NULL, "node7", 3, 0, 1));   /* local size unknown */
    ck_assert(!ring_nccl_hostid(id, 6, NULL, "node7", 3, 4, 1));            /* would not fit */
    ck_assert_str_eq(id, "untouched");
}
END_TEST

/* Whether x is exactly a value of dtype t. */
static bool representable(rk_dtype t, double x)
{
    float f = (float)x;
    if ((double)f != x)
        return false;
    return t == RK_F32 || (t == RK_F16 ? ring_f16_to_f32(ring_f32_to_f16(f)) : ring_bf16_to_f32(ring_f32_to_bf16(f))) == f;
}

/* Whether every partial sum of `ranks` ranks' values at span, and of their quarters (NCCL's
   avg pre-multiplies by 1/n), is a value of t at each of n elements: then no order or
   grouping of the additions rounds. */
static bool exact_in_every_order(rk_dtype t, int span, int ranks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (unsigned m = 1; m < 1u << ranks; m++) {
            double s = 0;
            for (int p = 0; p < ranks; p++)
                if (m & 1u << p)
                    s += ring_exact_int(p, i, span);
            if (!representable(t, s) || !representable(t, s / ranks))
                return false;
        }
    return true;
}

/* tests/ring_exact.h, the values the NCCL ring's device results are compared with bit for
   bit (prog_ring_nccl dtypes): on 4 ranks every partial sum is exact in f32, f16 and bf16
   at their spans, and the host reference gives the same bits in all 24 orders of the
   ranks for sum, avg, max and min; spans too large for the type are caught. */
START_TEST(nccl_exact_values)
{
    rk_dtype types[] = {RK_F32, RK_F16, RK_BF16};
    rk_op ops[] = {RK_SUM, RK_AVG, RK_MAX, RK_MIN};
    enum { N = 4096 };
    static float ref[N], got[N], tmp[N]; /* room for N f32 (or 16-bit) elements */
    for (int k = 0; k < 3; k++) {
        rk_dtype t = types[k];
        int span = ring_exact_span(t);
        ck_assert_msg(exact_in_every_order(t, span, 4, N), "dtype %d: span %d is not exact", (int)t, span);
        ck_assert_msg(!exact_in_every_order(t, t == RK_F32 ? 1 << 24 : span * 16, 4, N),
                      "dtype %d: the check misses a span 16 times too large", (int)t);
        /* values of both signs, and the ranks' values differ */
        ck_assert(ring_exact_int(0, 0, span) != ring_exact_int(1, 0, span));
        for (int o = 0; o < 4; o++) {
            int order[4] = {0, 1, 2, 3};
            ck_assert_int_eq(ring_exact_reference(ref, tmp, N, t, ops[o], order, 4, span), 0);
            for (int perm = 0; perm < 24; perm++) {
                int left[4] = {0, 1, 2, 3}, nl = 4, x = perm;
                for (int j = 0; j < 4; j++) { /* the perm-th permutation (factorial base) */
                    int f = x % (4 - j);
                    x /= 4 - j;
                    order[j] = left[f];
                    memmove(left + f, left + f + 1, (size_t)(--nl - f) * sizeof(int));
                }
                ck_assert_int_eq(ring_exact_reference(got, tmp, N, t, ops[o], order, 4, span), 0);
                ck_assert_msg(memcmp(ref, got, N * (t == RK_F32 ? 4 : 2)) == 0, "dtype %d op %d order %d%d%d%d differs",
                              (int)t, (int)ops[o], order[0], order[1], order[2], order[3]);
            }
        }
        /* the sum is the sum of the integers, and the avg its quarter */
        int all[4] = {0, 1, 2, 3};
        ck_assert_int_eq(ring_exact_reference(ref, tmp, N, t, RK_SUM, all, 4, span), 0);
        ck_assert_int_eq(ring_exact_reference(got, tmp, N, t, RK_AVG, all, 4, span), 0);
        for (size_t i = 0; i < N; i++) {
            int s = 0;
            for (int p = 0; p < 4; p++)
                s += ring_exact_int(p, i, span);
            if (ring_exact_get(ref, i, t) != (float)s || ring_exact_get(got, i, t) != (float)s / 4)
                ck_abort_msg("dtype %d element %zu: sum %g avg %g, want %d and %g", (int)t, i,
                             (double)ring_exact_get(ref, i, t), (double)ring_exact_get(got, i, t), s, s / 4.0);
        }
    }
}
END_TEST

/* ring_share_blob (an NCCL unique id's way, with a fake id): every member gets rank 0's
   bytes; an exchange only rank 0 made is dropped by the next one's receivers (the call
   number in its header), not taken for it; a receiver alone ends at its deadline; a spare
   and bad arguments are refused. */
START_TEST(blob_exchange)
{
    char *args[] = {"blob", NULL};
    job(4, false, args, "ok blob ", 4);
}
END_TEST

START_TEST(stale_across_sixteen_epochs)
{
    char *args[] = {"epoch-wrap", NULL};
    job(3, false, args, "ok epoch-wrap ", 3);
}
END_TEST

/* Invariants 2 and 6: an abort that finds no memory for fresh slots leaves the ring
   without any; the next call fails with -ENOMEM instead of writing through NULL, and
   the ring is exact once memory is back. */
START_TEST(abort_without_memory)
{
    char *args[] = {"no-memory", NULL};
    job(2, false, args, "ok no-memory ", 2);
}
END_TEST

/* A ring over a communicator other than MPI_COMM_WORLD (a process's own, as a program
   with a ring of one makes): MPI_TAG_UB is asked of MPI_COMM_WORLD, the one communicator
   Open MPI attaches it to. (Before: ring_create failed "MPI_TAG_UB -1 < 8388607" for
   MPI_COMM_SELF: test_ring_nccl's ring of one on a GPU.) */
START_TEST(ring_over_comm_self)
{
    int provided;
    ck_assert_int_eq(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided), MPI_SUCCESS);
    ring *r = NULL;
    th_assert_rc(ring_create(&r, MPI_COMM_SELF, NULL, 0, 30000), 0);
    float v[3] = {1.5f, -2.0f, 3.25f};
    th_assert_rc(ring_allreduce(r, v, 3, RK_F32, RK_SUM, NULL), 0);
    ck_assert(v[0] == 1.5f && v[1] == -2.0f && v[2] == 3.25f);
    ring_destroy(&r);
    MPI_Finalize();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ring");
    TCase *tu = tcase_create("kernels");
    tcase_set_timeout(tu, 60);
    tcase_add_test(tu, f16_matches_compiler);
    tcase_add_test(tu, bf16_round_nearest_even);
    tcase_add_test(tu, kernels_float_ops);
    tcase_add_test(tu, kernels_16bit_round_once_per_hop);
    tcase_add_test(tu, kernels_integers_wrap);
    tcase_add_test(tu, segments_cover_exactly);
    tcase_add_test(tu, nccl_shrink_plan);
    tcase_add_test(tu, nccl_hostid_only_where_a_device_is_shared);
    tcase_add_test(tu, nccl_exact_values);
    tcase_add_test(tu, ring_over_comm_self);
    suite_add_tcase(s, tu);
    TCase *tj = tcase_create("jobs");
    tcase_set_timeout(tj, 170);
    tcase_add_test(tj, exact_1);
    tcase_add_test(tj, exact_2);
    tcase_add_test(tj, exact_3);
    tcase_add_test(tj, exact_4);
    tcase_add_test(tj, exact_5);
    tcase_add_test(tj, bad_arguments_3);
    tcase_add_test(tj, bad_arguments_4);
    tcase_add_test(tj, kill_in_reduce_scatter);
    tcase_add_test(tj, kill_in_allgather);
    tcase_add_test(tj, kill_deadline_only);
    tcase_add_test(tj, kill_spare_joins);
    tcase_add_test(tj, kill_in_rebuild);
    tcase_add_test(tj, rebuild_begun_elsewhere);
    tcase_add_test(tj, shift_length_mismatch_2);
    tcase_add_test(tj, shift_length_mismatch_4);
    tcase_add_test(tj, stale_across_sixteen_epochs);
    tcase_add_test(tj, abort_without_memory);
    tcase_add_test(tj, blob_exchange);
    suite_add_tcase(s, tj);
    return th_main(s);
}
